//! Steady load: the fleet churns, emits events and is scraped; a rolling DNS fault gives the correlator
//! something to find. Measures throughput per stage, end-to-end lags and each process's CPU and memory.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Result;

use super::{FAST_ROUTING, Opts, report_flow, report_processes, roll_dns_faults};
use crate::observe::Observer;
use crate::record::{Recorder, Summary};
use crate::report::Report;
use crate::system::{Spec, System};

/// Runs it.
pub async fn run(o: &Opts, dir: &std::path::Path) -> Result<(Report, Recorder)> {
    let spec = Spec {
        clusters: o.clusters.unwrap_or(o.pick(4, 30)),
        objects: o.objects.unwrap_or(o.pick(200, 1000)),
        churn: o.churn.unwrap_or(2.0),
        events_per_second: o.events_per_second.unwrap_or(o.pick(5.0, 50.0)),
        scrape_interval_s: o.pick(5, 15),
        probe_interval_s: o.short.then_some(2),
        agents: o.agents.unwrap_or(o.pick(1, 3)),
        correlators: 1,
        tsdbs: 1,
        accounting: false,
        rate: None,
        nats_nodes: 1,
        alerts_routing: Some(FAST_ROUTING.into()),
        outbox_max_bytes: None,
        release: None,
    };
    let duration = o.duration.unwrap_or(o.pick(45, 600));
    let warmup = o.pick(10.0, 60.0);
    let (hold, gap) = o.pick((16u64, 3u64), (100, 20));
    let mut r = Report::new(
        "steady",
        o.short,
        serde_json::json!({"spec": spec, "duration_s": duration, "warmup_s": warmup,
                           "dns_fault_hold_s": hold, "dns_fault_gap_s": gap}),
    );
    let rec = Recorder::new();
    let mut sys = System::start(spec.clone(), dir, o.bins()?).await?;
    let obs = Observer::start(&sys, &rec, Duration::from_secs(1), true).await?;
    rec.mark("system up");
    tokio::time::sleep(Duration::from_secs_f64(warmup)).await;
    // The first start (every cluster's first listings and its event history, all at once) is not the
    // fleet running: the window opens once it has drained, and how long that took is a figure of its own.
    let first_start = first_start_drained(&sys, &obs, Duration::from_secs(o.pick(30, 240))).await;
    r.figure(
        format!(
            "first start drained (every consumer's backlog under {FIRST_START_CONSUMER} messages, agents' outboxes under {FIRST_START_OUTBOX} a cluster)"
        ),
        if first_start {
            format!("{:.0} s after the system was up", rec.now())
        } else {
            format!(
                "not within {:.0} s after the system was up: the window opened anyway",
                rec.now()
            )
        },
    );
    let load_from = rec.now();
    rec.mark("measuring");

    // a rolling DNS fault, one cluster at a time
    let clusters = sys.clusters.clone();
    let (roll, injected) = roll_dns_faults(sys.faults(), clusters.clone(), hold, gap);
    // with --storm, NATS goes away in the middle of the window while the fleet keeps going; the span from
    // the outage to every backlog being back at its level from before is left out of the lags and slopes
    // below, and judged on its own
    let storm = match o.storm {
        None => {
            tokio::time::sleep(Duration::from_secs(duration)).await;
            None
        }
        Some(outage) => {
            let started = std::time::Instant::now();
            tokio::time::sleep(Duration::from_secs(duration / 2)).await;
            let storm = reconnect_storm(&mut sys, &rec, outage, o.pick(120, 600)).await?;
            let left = Duration::from_secs(duration).saturating_sub(started.elapsed());
            tokio::time::sleep(left.max(Duration::from_secs(duration / 4))).await;
            Some(storm)
        }
    };
    let outside_storm = |t: f64| storm.as_ref().is_none_or(|s| t < s.down || t > s.settled);
    roll.abort();
    let _ = roll.await;
    for c in &clusters {
        let _ = sys.fault(c, "coredns-down", false, &[]).await;
    }
    let load_to = rec.now();
    rec.mark("load window over");

    // lags
    let incident_lags: Vec<(f64, f64)> = obs.with(|s| {
        let mut first: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for i in &s.incidents {
            if i.incident.kind != "dns-failure" || i.incident.revision != 1 {
                continue;
            }
            let lag = (i.wall - i.incident.opened_at).num_milliseconds() as f64 / 1000.0;
            let t = i.at.duration_since(rec.start()).as_secs_f64();
            first.entry(i.incident.id.clone()).or_insert((t, lag));
        }
        first.into_values().collect()
    });
    for (t, lag) in &incident_lags {
        rec.point_at("lag/incident-visible", "s", *t, *lag);
    }
    let inc = Summary::of(&incident_lags.iter().map(|p| p.1).collect::<Vec<_>>());
    let samples = obs.with(|s| Summary::of(&s.sample_lags));
    r.figure(
        "lag cluster_time → incident visible (dns-failure opened)",
        inc.line("s"),
    );
    r.figure("lag cluster_time → sample queryable", samples.line("s"));
    let (precise, coarse): (Vec<(std::time::Instant, f64, bool)>, Vec<_>) = obs.with(|s| {
        s.digest_lags
            .iter()
            .copied()
            .filter(|(at, ..)| {
                let t = at.duration_since(rec.start()).as_secs_f64();
                t >= load_from && t <= load_to && outside_storm(t)
            })
            .partition(|(.., precise)| *precise)
    });
    let precise = Summary::of(&precise.iter().map(|d| d.1).collect::<Vec<_>>());
    let coarse = Summary::of(&coarse.iter().map(|d| d.1).collect::<Vec<_>>());
    r.figure(
        "lag event → digest (events timed to the microsecond: repeats' series.lastObservedTime)",
        precise.line("s"),
    );
    r.figure(
        "lag event → digest (events timed to the second: up to 1 s high)",
        coarse.line("s"),
    );
    // where the time went: before the hub (simulator, agent, NATS) against the whole way to the digest
    let in_window = |lags: &[(std::time::Instant, f64)]| {
        Summary::of(
            &lags
                .iter()
                .filter(|(at, _)| {
                    let t = at.duration_since(rec.start()).as_secs_f64();
                    t >= load_from && t <= load_to && outside_storm(t)
                })
                .map(|(_, lag)| *lag)
                .collect::<Vec<_>>(),
        )
    };
    let (stored, read) = obs.with(|s| (in_window(&s.ingest_lags), in_window(&s.agent_lags)));
    r.figure(
        "lag event → stored in FLEET_EVENTS (before the hub: the newest event, once a second; timed to the second, up to 1 s high)",
        stored.line("s"),
    );
    r.figure(
        "… of which event → read by its agent (the same events' agent_time: the simulator serving the watch, the agent reading it)",
        read.line("s"),
    );
    // judged on the microsecond-timed events; with none of them, on the events timed to the second, whose
    // lags read up to 1 s high: an upper bound, so a p99 under the goal there is under it in truth (one over
    // it proves nothing and is reported as not met). With no digest at all there is nothing to judge, and
    // the report says so instead of a p99 of 0.00 s. The goal: 1 s up to 30 clusters, 2 s beyond (issue 29).
    let digest_goal = if clusters.len() > 30 { 2.0 } else { 1.0 };
    let (met, evidence) = if precise.count > 0 {
        (
            precise.p99 < digest_goal,
            format!("p99 {:.2} s over {} digests", precise.p99, precise.count),
        )
    } else if coarse.count > 0 {
        (
            coarse.p99 < digest_goal,
            format!(
                "p99 ≤ {:.2} s over {} digests of events timed to the second (their lags read up to 1 s high: an upper bound; no microsecond-timed event was digested)",
                coarse.p99, coarse.count
            ),
        )
    } else {
        (
            false,
            "no data: no event was digested in the load window".to_string(),
        )
    };
    r.goal(
        format!(
            "event → digest p99 < {digest_goal:.0} s{}",
            if storm.is_some() {
                " (outside the storm and its drain)"
            } else {
                ""
            }
        ),
        met,
        evidence,
    );
    r.plot(
        "lags",
        "End-to-end lags",
        "seconds",
        vec![
            ("sample queryable".into(), "lag/sample-queryable".into()),
            ("incident visible".into(), "lag/incident-visible".into()),
            ("event stored".into(), "lag/event-stored".into()),
            ("event digested".into(), "lag/event-digest".into()),
        ],
    );
    report_flow(&mut r, &rec, load_from, load_to);
    // flat: no backlog grows over the load window (least-squares slope, msgs/s)
    let mut growing = Vec::new();
    let mut slopes = Vec::new();
    for (name, series) in rec.series_with_prefix("backlog/") {
        let inside: Vec<(f64, f64)> = series
            .points
            .iter()
            .copied()
            .filter(|(t, _)| *t >= load_from && *t <= load_to && outside_storm(*t))
            .collect();
        let slope = slope(&inside);
        let name = name.trim_start_matches("backlog/").to_string();
        slopes.push(format!("{name} {slope:+.1}/s"));
        if slope > 1.0 {
            growing.push(name);
        }
    }
    r.figure(
        if storm.is_some() {
            "backlog growth over the load window (outside the storm and its drain)"
        } else {
            "backlog growth over the load window"
        },
        slopes.join(", "),
    );
    if let Some(s) = &storm {
        r.figure(
            "reconnect storm",
            format!(
                "NATS down {:.0} s at {:.0} s; every backlog back to its level from before {:.1} s after NATS came back",
                s.up - s.down,
                s.down,
                s.settled - s.up
            ),
        );
        r.invariant(
            "after the reconnect storm every backlog drains back to its level from before",
            s.drained,
            format!(
                "{:.1} s after NATS came back; still high: {:?}",
                s.settled - s.up,
                s.high
            ),
        );
    }
    r.goal(
        "every backlog stays flat over the load window (grows < 1 msg/s)",
        growing.is_empty(),
        if growing.is_empty() {
            "none grows".to_string()
        } else {
            format!("growing: {}", growing.join(", "))
        },
    );

    // invariants
    let tsdb = sys.tsdb_api().unwrap_or_default();
    let seen_clusters: BTreeSet<String> = sys
        .query(&tsdb, "count by (cluster) (apiserver_storage_objects)")
        .await?
        .iter()
        .filter_map(|s| s["metric"]["cluster"].as_str().map(String::from))
        .collect();
    r.invariant(
        "every cluster's metrics are queryable",
        seen_clusters.len() == clusters.len(),
        format!("{} of {} clusters", seen_clusters.len(), clusters.len()),
    );

    // the agents stop; every consumer must then finish what is stored
    sys.stop_agents();
    rec.mark("agents stopped");
    let caught_up = sys.wait_caught_up(&[], o.pick(120, 900)).await;
    r.invariant(
        "every consumer catches up once the load stops",
        caught_up.is_ok(),
        match &caught_up {
            Ok(d) => format!("in {:.1} s", d.as_secs_f64()),
            Err(e) => e.to_string(),
        },
    );
    // every injection held for the whole `hold` must have become an incident (the last one may have been
    // cut short by the end of the window), judged once the hub has caught up: a fault probed while NATS
    // was away reaches the correlator after the outage, and how late is the figure, not the invariant
    let injected = injected.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut detect = Vec::new();
    let mut missed = Vec::new();
    for inj in injected.iter().filter(|x| x.held) {
        let (cluster, on) = (&inj.cluster, &inj.at);
        let first = obs.with(|s| {
            s.incidents
                .iter()
                .find(|i| {
                    i.at >= *on
                        && &i.incident.cluster == cluster
                        && i.incident.kind == "dns-failure"
                })
                .map(|i| i.at.duration_since(*on).as_secs_f64())
        });
        match first {
            Some(d) => detect.push(d),
            None => missed.push(cluster.clone()),
        }
    }
    let full = injected.iter().filter(|x| x.held).count();
    r.figure(
        "fault injected → dns-failure incident visible (probe rounds and the rule's confirmation included)",
        Summary::of(&detect).line("s"),
    );
    r.invariant(
        "every injected DNS failure became an incident",
        missed.is_empty() && full > 0,
        format!("{full} injections held {hold} s; missed {missed:?}"),
    );
    let jsz = sys.jsz().await?;
    let dlq = jsz.stream("FLEET_DLQ").map_or(0, |s| s.messages);
    r.invariant(
        "nothing dead-lettered (all input was valid)",
        dlq == 0,
        format!("{dlq} dead letters"),
    );
    let series_count = sys
        .query(&tsdb, "count({__name__=~\".+\"})")
        .await
        .ok()
        .and_then(|v| v.first()?["value"][1].as_str()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    obs.stop().await;
    report_processes(&mut r, &rec);
    let max_of = |series: String| {
        rec.series(&series)
            .map(|s| s.points.iter().map(|p| p.1).fold(0.0, f64::max))
            .unwrap_or(0.0)
    };
    let rss_max = |proc: &str| max_of(format!("rss/{proc}"));
    let pss_max = |proc: &str| max_of(format!("pss/{proc}"));
    let cpu_mean = |proc: &str| {
        rec.series(&format!("cpu/{proc}"))
            .map(|s| Summary::of(&s.points.iter().map(|p| p.1).collect::<Vec<_>>()).mean)
            .unwrap_or(0.0)
    };
    // Together = the pages they occupy: the three processes map one binary, and summed RSS counts its
    // shared pages three times (~20 MiB each), so the goal reads the sum of proportional set sizes; summed
    // RSS is printed beside it.
    let roles = ["correlator", "tsdb", "alerts"];
    let hub: f64 = roles.iter().map(|p| pss_max(p)).sum();
    let hub_rss: f64 = roles.iter().map(|p| rss_max(p)).sum();
    // issue 29's budget: 300 MiB at 30 clusters, 450 at 50 (7.5 MiB per cluster beyond 30)
    let budget = 300.0 + 7.5 * clusters.len().saturating_sub(30) as f64;
    r.goal(
        format!("hub roles (correlator, TSDB, alert router) together ≤ {budget:.0} MiB (PSS)"),
        hub > 0.0 && hub <= budget,
        format!(
            "{hub:.0} MiB PSS (sum of each one's max: correlator {:.0}, TSDB {:.0}, alert router {:.0}); \
             RSS {hub_rss:.0} MiB (correlator {:.0}, TSDB {:.0}, alert router {:.0})",
            pss_max("correlator"),
            pss_max("tsdb"),
            pss_max("alerts"),
            rss_max("correlator"),
            rss_max("tsdb"),
            rss_max("alerts")
        ),
    );
    if series_count > 0.0 {
        let tsdb_rss = rec
            .series("rss/tsdb")
            .and_then(|s| s.points.last().map(|p| p.1))
            .unwrap_or(0.0);
        r.figure(
            "TSDB memory per active series (RSS at the end, sled cache included)",
            format!(
                "{:.2} KiB ({series_count:.0} series, {tsdb_rss:.0} MiB); Prometheus 2.x: ~2 KiB per series for \
                 the head's index alone (Robust Perception: 1M series ≈ 2 GiB), samples on top",
                tsdb_rss * 1024.0 / series_count
            ),
        );
    }
    // each agent process serves its share of the clusters: its footprint per cluster served, against the
    // one-cluster agent's budget (loadtest/bench/agent-footprint: < 0.1 core, < 40 MiB)
    let served = clusters.len() as f64 / spec.agents.max(1) as f64;
    let per_cluster: Vec<(String, f64, f64)> = (0..spec.agents)
        .map(|a| {
            let name = format!("agent-{a}");
            (
                name.clone(),
                cpu_mean(&name) / served,
                rss_max(&name) / served,
            )
        })
        .collect();
    r.goal(
        "every agent process within the one-cluster footprint per cluster served (< 0.1 core, < 40 MiB)",
        per_cluster.iter().all(|(_, cpu, rss)| *cpu < 10.0 && *rss > 0.0 && *rss < 40.0),
        per_cluster
            .iter()
            .map(|(n, cpu, rss)| format!("{n}: {:.3} core, {rss:.1} MiB per cluster", cpu / 100.0))
            .collect::<Vec<_>>()
            .join("; ")
            + &format!(" ({served:.1} clusters each)"),
    );
    let (sim_rss, sim_cpu) = (rss_max("sim"), cpu_mean("sim"));
    r.goal(
        "the simulator stays ≤ 1 GiB RSS and ≤ 0.2 core",
        sim_rss > 0.0 && sim_rss <= 1024.0 && sim_cpu <= 20.0,
        format!("RSS max {sim_rss:.0} MiB, CPU mean {sim_cpu:.0} %"),
    );
    r.note("Lags: an incident's lag runs from its opened_at (the cluster_time of the probe result that opened it: the one that completed the rule's streak of failing rounds) to the moment a subscriber on fleet.incident.> received it. The time from the fault to the incident, streak included, is the separate 'fault injected →' figure. A sample's lag runs from its timestamp (scrape time, cluster clock) to the first TSDB query that returned it; the TSDB is polled every 250 ms, so figures are up to 0.25 s high.");
    r.note("Throughput: stored = JetStream's last sequence per stream (from /jsz); processed = each role's multipilot_bus_consumed_total{outcome=\"done\"}; both sampled every second.");
    sys.stop();
    Ok((r, rec))
}

/// A reconnect storm in the middle of a run, in seconds since the run's start.
struct Storm {
    down: f64,
    up: f64,
    /// When every backlog was back at its level from before (or the wait gave up).
    settled: f64,
    drained: bool,
    /// The backlogs still above their level when the wait gave up.
    high: Vec<String>,
}

/// Kills NATS for `outage` seconds, restarts it and waits (up to `wait` seconds) until the agents' outboxes
/// and every consumer's backlog are back at the highest level they had before the outage (plus 5 %, and at
/// least 100 messages: a steady backlog moves).
async fn reconnect_storm(
    sys: &mut System,
    rec: &Recorder,
    outage: u64,
    wait: u64,
) -> Result<Storm> {
    let level = |name: &str| {
        rec.series(name)
            .map_or(0.0, |s| s.points.iter().map(|p| p.1).fold(0.0, f64::max))
    };
    let before: BTreeMap<String, f64> = rec
        .series_with_prefix("backlog/")
        .into_iter()
        .map(|(n, _)| {
            let l = level(&n);
            (n, l)
        })
        .collect();
    let down = rec.now();
    sys.kill_nats()?;
    rec.mark("NATS down (reconnect storm)");
    tokio::time::sleep(Duration::from_secs(outage)).await;
    sys.restart_nats().await?;
    let up = rec.now();
    rec.mark("NATS back");
    let deadline = std::time::Instant::now() + Duration::from_secs(wait);
    loop {
        // a backlog counts once the sampler has read it after the restart (during the outage it reads
        // nothing, and its last figure is from before); one not read again 5 s after the restart belonged
        // to a consumer that is gone (ordered consumers come back under new names)
        let now = rec.now();
        let high: Vec<String> = before
            .iter()
            .filter(|(name, lvl)| {
                let fresh = rec
                    .series(name)
                    .and_then(|s| s.points.last().copied())
                    .filter(|p| p.0 > up + 2.0);
                match fresh {
                    Some(p) => p.1 > (**lvl * 1.05).max(**lvl + 100.0),
                    None => now < up + 5.0,
                }
            })
            .map(|(n, _)| n.trim_start_matches("backlog/").to_string())
            .collect();
        if high.is_empty() || std::time::Instant::now() > deadline {
            let settled = rec.now();
            rec.mark("storm drained");
            return Ok(Storm {
                down,
                up,
                settled,
                drained: high.is_empty(),
                high,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Least-squares slope of (t, v) points (0 for fewer than two).
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let (mt, mv) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let cov: f64 = points.iter().map(|p| (p.0 - mt) * (p.1 - mv)).sum();
    let var: f64 = points.iter().map(|p| (p.0 - mt).powi(2)).sum();
    if var == 0.0 { 0.0 } else { cov / var }
}

/// A consumer's backlog under which the first start counts as drained.
const FIRST_START_CONSUMER: u64 = 1_000;
/// Messages waiting in the agents' outboxes, per cluster, under which the first start counts as drained.
const FIRST_START_OUTBOX: u64 = 50;

/// Waits (up to `within`) until every consumer's backlog and the agents' outboxes are down to the fleet's
/// running level; false if they were not by then.
async fn first_start_drained(sys: &System, obs: &Observer, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    let clusters = sys.clusters.len() as u64;
    while std::time::Instant::now() < deadline {
        let outboxes: u64 = obs.with(|s| s.last_heartbeat.values().map(|h| h.outbox_depth).sum());
        if outboxes <= FIRST_START_OUTBOX * clusters
            && let Ok(j) = sys.jsz().await
            && j.consumers
                .iter()
                .all(|c| c.num_pending + c.num_ack_pending <= FIRST_START_CONSUMER)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}
