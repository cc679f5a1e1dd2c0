//! Fault drill: overload one cluster's API server, at the agent's and correlator's default intervals, and
//! time how long until an apiserver-overload incident with the right evidence is visible. Goal ≤ 30 s.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::{Opts, report_processes};
use crate::observe::Observer;
use crate::record::{Recorder, Summary};
use crate::report::Report;
use crate::system::{Spec, System};

/// Runs it.
pub async fn run(o: &Opts, dir: &std::path::Path) -> Result<(Report, Recorder)> {
    let spec = Spec {
        clusters: o.clusters.unwrap_or(o.pick(3, 6)),
        objects: o.objects.unwrap_or(300),
        churn: o.churn.unwrap_or(1.0),
        events_per_second: o.events_per_second.unwrap_or(2.0),
        scrape_interval_s: 30,
        probe_interval_s: None,
        agents: o.agents.unwrap_or(1),
        correlators: 1,
        tsdbs: 1,
        accounting: false,
        rate: None,
        nats_nodes: 1,
        alerts_routing: None,
        outbox_max_bytes: None,
    };
    let rounds = o.rounds.unwrap_or(o.pick(1, 5));
    let params = [("latency_ms", "1500"), ("error_rate", "0.05")];
    let mut r = Report::new(
        "fault",
        o.short,
        serde_json::json!({"spec": spec, "rounds": rounds, "fault": "overload",
                           "params": {"latency_ms": 1500, "error_rate": 0.05}, "intervals": "defaults"}),
    );
    let rec = Recorder::new();
    let mut sys = System::start(spec.clone(), dir, o.bins()?).await?;
    let obs = Observer::start(&sys, &rec, Duration::from_secs(1), false).await?;
    rec.mark("system up");
    // the first probe rounds and the baseline settle first
    tokio::time::sleep(Duration::from_secs(o.pick(20, 40))).await;

    let mut times = Vec::new();
    let mut bad_evidence = Vec::new();
    let mut missed = Vec::new();
    for round in 0..rounds {
        let cluster = sys.clusters[round % sys.clusters.len()].clone();
        // a random phase against the probe interval, as a real overload would have
        tokio::time::sleep(Duration::from_millis(
            (round as u64 * 3_700) % 15_000 + 2_000,
        ))
        .await;
        let t0 = Instant::now();
        sys.fault(&cluster, "overload", true, &params).await?;
        rec.mark(format!("overload {cluster}"));
        let deadline = t0 + Duration::from_secs(180);
        let found = loop {
            let hit = obs.with(|s| {
                s.incidents
                    .iter()
                    .find(|i| {
                        i.at >= t0
                            && i.incident.cluster == cluster
                            && i.incident.kind == "apiserver-overload"
                            && i.incident.status
                                != multipilot_schemas::payload::IncidentStatus::Resolved
                    })
                    .cloned()
            });
            if hit.is_some() || Instant::now() > deadline {
                break hit;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        match found {
            Some(i) => {
                let secs = i.at.duration_since(t0).as_secs_f64();
                rec.point("drill/time-to-incident", "s", secs);
                times.push(secs);
                // the right evidence: the API server probe's latency (or error ratio) trend
                let ev = i.incident.evidence.iter().any(|e| {
                    e.kind == multipilot_schemas::payload::EvidenceKind::Trend
                        && e.summary.starts_with("apiserver ")
                        && (e.summary.contains("max_latency_ms")
                            || e.summary.contains("error_ratio"))
                });
                let says_slow = i.incident.summary.contains("overloaded");
                if !(ev && says_slow) {
                    bad_evidence.push(format!(
                        "{cluster}: summary {:?}, evidence {:?}",
                        i.incident.summary,
                        i.incident
                            .evidence
                            .iter()
                            .map(|e| format!("{}: {}", e.kind, e.summary))
                            .collect::<Vec<_>>()
                    ));
                }
                r.figure(
                    format!("round {}: {cluster}", round + 1),
                    format!(
                        "{secs:.1} s; \"{}\"; evidence: {}",
                        i.incident.summary,
                        i.incident
                            .evidence
                            .iter()
                            .take(3)
                            .map(|e| format!("[{}] {}", e.kind, e.summary))
                            .collect::<Vec<_>>()
                            .join(" · ")
                    ),
                );
            }
            None => missed.push(cluster.clone()),
        }
        sys.fault(&cluster, "overload", false, &[]).await?;
        rec.mark(format!("overload off {cluster}"));
        // wait for the resolution before the next round
        let t1 = Instant::now();
        while t1.elapsed() < Duration::from_secs(120) {
            let resolved = obs.with(|s| {
                s.incidents.iter().any(|i| {
                    i.at >= t1
                        && i.incident.cluster == cluster
                        && i.incident.kind == "apiserver-overload"
                        && i.incident.status
                            == multipilot_schemas::payload::IncidentStatus::Resolved
                })
            });
            if resolved {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let s = Summary::of(&times);
    r.figure(
        "injection → apiserver-overload incident visible",
        s.line("s"),
    );
    r.invariant(
        "every overload became an apiserver-overload incident",
        missed.is_empty(),
        if missed.is_empty() {
            format!("{rounds} of {rounds}")
        } else {
            format!("none within 180 s on {missed:?}")
        },
    );
    r.invariant(
        "the incident carries the right evidence (the API server's latency or error trend, 'overloaded')",
        bad_evidence.is_empty() && !times.is_empty(),
        if bad_evidence.is_empty() {
            "every incident".into()
        } else {
            bad_evidence.join("; ")
        },
    );
    r.goal(
        "time to incident ≤ 30 s (the reference system took about 10 minutes)",
        !times.is_empty() && s.max <= 30.0,
        format!("slowest {:.1} s, median {:.1} s", s.max, s.p50),
    );
    r.plot(
        "time-to-incident",
        "Injection → incident visible, per round",
        "seconds",
        vec![("apiserver-overload".into(), "drill/time-to-incident".into())],
    );
    obs.stop().await;
    report_processes(&mut r, &rec);
    r.note("Default intervals: probes every 15 s, metrics every 30 s, the correlator's default tick and rules. The overload adds 1.5 s to every API request and fails 5 % of them; the agent calls the API server degraded above 1 s.");
    sys.stop();
    Ok((r, rec))
}
