//! Reconnect storm: NATS goes away while the clusters keep churning, then comes back. Every agent
//! reconnects with a backlog at once. Checks nothing is lost (seq accounting), no consumer takes in more
//! than its limit, heartbeats and probes of every cluster show up soon after the reconnect despite the
//! backlog; measures how long the backlog takes to drain.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::{
    FAST_ROUTING, Opts, account, report_accounting, report_flow, report_processes,
    report_rate_limits,
};
use crate::observe::Observer;
use crate::record::{Recorder, Summary};
use crate::report::Report;
use crate::system::{Rate, Spec, System};

/// Runs it.
pub async fn run(o: &Opts, dir: &std::path::Path) -> Result<(Report, Recorder)> {
    let rate = o.pick(
        Rate {
            per_second: 400,
            burst: 100,
        },
        Rate {
            per_second: 1500,
            burst: 300,
        },
    );
    let spec = Spec {
        clusters: o.clusters.unwrap_or(o.pick(4, 30)),
        objects: o.objects.unwrap_or(o.pick(200, 1000)),
        churn: o.churn.unwrap_or(o.pick(5.0, 2.0)),
        events_per_second: o.events_per_second.unwrap_or(o.pick(5.0, 10.0)),
        scrape_interval_s: o.pick(5, 15),
        probe_interval_s: o.short.then_some(5),
        agents: o.agents.unwrap_or(o.pick(2, 3)),
        correlators: 1,
        tsdbs: 1,
        accounting: true,
        rate: Some(rate),
        nats_nodes: 1,
        alerts_routing: Some(FAST_ROUTING.into()),
        outbox_max_bytes: Some(o.pick(256 << 20, 2 << 30)),
        release: None,
    };
    let outage = o.duration.unwrap_or(o.pick(20, 600));
    let warmup = o.pick(15.0, 60.0);
    let mut r = Report::new(
        "storm",
        o.short,
        serde_json::json!({"spec": spec, "outage_s": outage, "warmup_s": warmup}),
    );
    let rec = Recorder::new();
    let mut sys = System::start(spec.clone(), dir, o.bins()?).await?;
    let obs = Observer::start(&sys, &rec, Duration::from_secs(1), false).await?;
    rec.mark("system up");
    tokio::time::sleep(Duration::from_secs_f64(warmup)).await;

    // the steady-state backlog before the outage: "drained" means back to it
    let level = |name: &str| {
        rec.series(name)
            .map_or(0.0, |s| s.points.iter().map(|p| p.1).fold(0.0, f64::max))
    };
    let outbox_level = level("backlog/agent-outboxes");
    let consumer_level: BTreeMap<String, f64> = rec
        .series_with_prefix("backlog/")
        .into_iter()
        .map(|(n, s)| {
            (
                n.trim_start_matches("backlog/").to_string(),
                s.points.iter().map(|p| p.1).fold(0.0, f64::max),
            )
        })
        .collect();
    sys.kill_nats()?;
    rec.mark("NATS down");
    tokio::time::sleep(Duration::from_secs(outage)).await;
    sys.restart_nats().await?;
    let up = Instant::now();
    let up_t = rec.now();
    rec.mark("NATS back");

    // heartbeats and probes of every cluster after the reconnect
    let clusters = sys.clusters.clone();
    let deadline = up + Duration::from_secs(120);
    let (first_hb, first_probe) = loop {
        let (hb, pr) = obs.with(|s| {
            let mut hb: BTreeMap<String, f64> = BTreeMap::new();
            let mut pr: BTreeMap<String, f64> = BTreeMap::new();
            for b in s.beats.iter().filter(|b| b.at >= up) {
                let d = b.at.duration_since(up).as_secs_f64();
                let m = if b.heartbeat { &mut hb } else { &mut pr };
                m.entry(b.cluster.clone()).or_insert(d);
            }
            (hb, pr)
        });
        if (hb.len() >= clusters.len() && pr.len() >= clusters.len()) || Instant::now() > deadline {
            break (hb, pr);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let hb_all = Summary::of(&first_hb.values().copied().collect::<Vec<_>>());
    let pr_all = Summary::of(&first_probe.values().copied().collect::<Vec<_>>());
    r.figure(
        "first heartbeat per cluster after the reconnect",
        format!(
            "{} of {} clusters; slowest {:.1} s, median {:.1} s",
            first_hb.len(),
            clusters.len(),
            hb_all.max,
            hb_all.p50
        ),
    );
    r.figure(
        "first probe result per cluster after the reconnect",
        format!(
            "{} of {} clusters; slowest {:.1} s, median {:.1} s",
            first_probe.len(),
            clusters.len(),
            pr_all.max,
            pr_all.p50
        ),
    );
    r.invariant(
        "heartbeats and probes of every cluster arrive after the reconnect",
        first_hb.len() == clusters.len() && first_probe.len() == clusters.len(),
        format!(
            "heartbeats from {}, probes from {} of {} clusters",
            first_hb.len(),
            first_probe.len(),
            clusters.len()
        ),
    );
    r.goal(
        "… within 10 s of the reconnect, despite the backlog",
        first_hb.len() == clusters.len()
            && first_probe.len() == clusters.len()
            && hb_all.max <= 10.0
            && pr_all.max <= 10.0,
        format!(
            "slowest heartbeat {:.1} s, slowest probe {:.1} s",
            hb_all.max, pr_all.max
        ),
    );

    // the backlog drains: the agents' outboxes (as their heartbeats say) and every consumer's pending
    // messages back to their level before the outage (10 messages of slack: the fleet keeps churning)
    let drain_deadline = up + Duration::from_secs(o.pick(300, 7200));
    let mut drained = None;
    while Instant::now() < drain_deadline {
        let outboxes = obs.with(|s| {
            let fresh = clusters.iter().all(|c| {
                s.beats
                    .iter()
                    .rev()
                    .any(|b| b.heartbeat && &b.cluster == c && b.at >= up)
            });
            let depth: u64 = s.last_heartbeat.values().map(|h| h.outbox_depth).sum();
            fresh && depth as f64 <= outbox_level + 10.0
        });
        if outboxes
            && let Ok(j) = sys.jsz().await
            && j.consumers.iter().all(|c| {
                (c.num_pending + c.num_ack_pending) as f64
                    <= consumer_level.get(&c.name).copied().unwrap_or(0.0) + 10.0
            })
        {
            drained = Some(up.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    rec.mark("backlog drained");
    r.figure(
        "backlog drain time (reconnect → outboxes and consumers back to their level before the outage)",
        drained.map_or("did not drain".into(), |d| {
            format!("{:.1} s", d.as_secs_f64())
        }),
    );
    r.invariant(
        "the backlog drains",
        drained.is_some(),
        drained.map_or("still draining at the deadline".into(), |d| {
            format!("{:.1} s", d.as_secs_f64())
        }),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let load_to = rec.now();

    // a clean stop closes each cluster's accounting with a last heartbeat
    sys.stop_agents();
    rec.mark("agents stopped");
    let caught = sys.wait_caught_up(&[], o.pick(120, 1800)).await;
    r.invariant(
        "every consumer catches up",
        caught.is_ok(),
        match &caught {
            Ok(d) => format!("{:.1} s after the agents stopped", d.as_secs_f64()),
            Err(e) => e.to_string(),
        },
    );
    obs.stop().await;
    let acc = account(&sys).await?;
    report_accounting(&mut r, &clusters, &acc);
    report_rate_limits(&mut r, &rec, rate.per_second, rate.burst);
    let dlq = sys
        .jsz()
        .await?
        .stream("FLEET_DLQ")
        .map_or(0, |s| s.messages);
    r.invariant(
        "nothing dead-lettered",
        dlq == 0,
        format!("{dlq} dead letters"),
    );
    report_flow(&mut r, &rec, up_t, load_to);
    report_processes(&mut r, &rec);
    r.note("The streams keep every message in this drill (max_msgs_per_subject unlimited on FLEET_STATE and FLEET_FACTS) so each seq can be found; in production those streams keep the last value per subject.");
    r.note(format!("Each hub role's consumers are limited to {}/s with a burst of {} (bus rate settings `<role>.rate`); the agents' outbox drains at their default 2,000/s per process.", rate.per_second, rate.burst));
    r.note("\"Arrive\" means a subscriber on fleet.hb.> / fleet.probe.> received it; probes queued during the outage count (they drain before states, events and metrics).");
    sys.stop();
    Ok((r, rec))
}
