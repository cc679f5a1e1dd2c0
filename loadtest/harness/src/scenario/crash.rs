//! Crash drill: kill -9 each consumer role in turn while the fleet streams and DNS faults come and go, and
//! start it again. Then: every incident's revisions complete and unique, every fault found, every incident
//! change notified once in FLEET_ALERTS, every sample in the stream queryable.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Result;
use multipilot_schemas::payload::{AlertState, IncidentStatus};

use super::{
    FAST_ROUTING, Opts, compare_samples, queried_sample_times, report_flow, report_processes,
    roll_dns_faults, stored_incidents, stored_notifications, stored_sample_times,
};
use crate::observe::Observer;
use crate::record::Recorder;
use crate::report::Report;
use crate::system::{RoleKind, Spec, System};

/// Runs it.
pub async fn run(o: &Opts, dir: &std::path::Path) -> Result<(Report, Recorder)> {
    let spec = Spec {
        clusters: o.clusters.unwrap_or(o.pick(3, 10)),
        objects: o.objects.unwrap_or(o.pick(150, 500)),
        churn: o.churn.unwrap_or(2.0),
        events_per_second: o.events_per_second.unwrap_or(o.pick(3.0, 10.0)),
        scrape_interval_s: 5,
        probe_interval_s: Some(o.pick(2, 5)),
        agents: o.agents.unwrap_or(1),
        correlators: 1,
        tsdbs: 1,
        accounting: false,
        rate: None,
        nats_nodes: 1,
        alerts_routing: Some(FAST_ROUTING.into()),
        outbox_max_bytes: None,
        release: None,
    };
    let rounds = o.rounds.unwrap_or(o.pick(1, 3));
    let (between, down) = o.pick((6u64, 4u64), (20, 10));
    let (hold, gap) = o.pick((16u64, 4u64), (35, 5));
    let mut r = Report::new(
        "crash",
        o.short,
        serde_json::json!({"spec": spec, "rounds": rounds, "seconds_between_kills": between,
                           "seconds_down": down, "dns_fault_hold_s": hold, "dns_fault_gap_s": gap}),
    );
    let rec = Recorder::new();
    let mut sys = System::start(spec.clone(), dir, o.bins()?).await?;
    let obs = Observer::start(&sys, &rec, Duration::from_secs(1), false).await?;
    rec.mark("system up");
    tokio::time::sleep(Duration::from_secs(o.pick(10, 30))).await;
    let from = rec.now();

    // DNS faults come and go, one cluster at a time, all through the drill
    let (roll, injections) = roll_dns_faults(sys.faults(), sys.clusters.clone(), hold, gap);
    let order = [RoleKind::Correlator, RoleKind::Tsdb, RoleKind::Alerts];
    let mut kills = 0;
    for _ in 0..rounds {
        for kind in order {
            tokio::time::sleep(Duration::from_secs(between)).await;
            let Some(i) = sys.role(kind, 0) else { continue };
            sys.kill_role(i);
            kills += 1;
            rec.mark(format!("kill -9 {}", kind.command()));
            tokio::time::sleep(Duration::from_secs(down)).await;
            sys.restart_role(i).await?;
            rec.mark(format!("{} back", kind.command()));
        }
    }
    tokio::time::sleep(Duration::from_secs(between)).await;
    roll.abort();
    let _ = roll.await;
    for c in &sys.clusters {
        sys.fault(c, "coredns-down", false, &[]).await?;
    }
    rec.mark("faults off");
    // every DNS incident resolves (probes healthy again), then the stream stops
    let quiet = std::time::Instant::now();
    while quiet.elapsed() < Duration::from_secs(90) {
        let open = obs.with(|s| {
            let mut last: BTreeMap<&str, IncidentStatus> = BTreeMap::new();
            for i in &s.incidents {
                if i.incident.kind == "dns-failure" {
                    last.insert(&i.incident.id, i.incident.status);
                }
            }
            last.values().any(|st| *st != IncidentStatus::Resolved)
        });
        if !open {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    sys.stop_agents();
    rec.mark("agents stopped");
    let caught = sys.wait_caught_up(&[], 180).await;
    // the alert router's last group interval
    tokio::time::sleep(Duration::from_secs(6)).await;
    let to = rec.now();
    r.figure(
        "roles killed",
        format!("{kills} kill -9 (correlator, tsdb, alerts × {rounds})"),
    );
    r.invariant(
        "every consumer catches up after the drill",
        caught.is_ok(),
        match &caught {
            Ok(d) => format!("{:.1} s after the agents stopped", d.as_secs_f64()),
            Err(e) => e.to_string(),
        },
    );

    // incidents: per id, revisions 1..n, each once
    let incidents = stored_incidents(&sys).await?;
    let mut revs: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for i in &incidents {
        revs.entry(i.id.clone()).or_default().push(i.revision);
    }
    let mut gaps = Vec::new();
    let mut dups = Vec::new();
    for (id, v) in &revs {
        let set: BTreeSet<u64> = v.iter().copied().collect();
        if set.len() != v.len() {
            dups.push(format!("{id}: revisions {v:?}"));
        }
        let max = set.iter().max().copied().unwrap_or(0);
        if set.len() as u64 != max || !set.contains(&1) {
            gaps.push(format!("{id}: revisions {v:?}"));
        }
    }
    r.figure(
        "incident changes stored",
        format!("{} changes of {} incidents", incidents.len(), revs.len()),
    );
    r.invariant(
        "no lost incident change (revisions 1..n complete)",
        gaps.is_empty(),
        if gaps.is_empty() {
            format!("{} incidents", revs.len())
        } else {
            gaps.join("; ")
        },
    );
    r.invariant(
        "no duplicated incident change",
        dups.is_empty(),
        if dups.is_empty() {
            format!("{} changes", incidents.len())
        } else {
            dups.join("; ")
        },
    );
    // every DNS fault was found, and resolved
    let dns: Vec<_> = incidents
        .iter()
        .filter(|i| i.kind == "dns-failure")
        .collect();
    // the last injection may have been cut short by the end of the drill: only those held for the whole
    // `hold` must have become incidents
    let injections: Vec<_> = injections
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|x| x.held)
        .cloned()
        .collect();
    let mut unfound = Vec::new();
    for inj in &injections {
        let off = inj.wall + chrono::Duration::seconds(hold as i64);
        let hit = dns.iter().any(|i| {
            i.cluster == inj.cluster
                && i.opened_at >= inj.wall - chrono::Duration::seconds(6)
                && i.opened_at <= off + chrono::Duration::seconds(30)
        });
        if !hit {
            unfound.push(format!("{} at {}", inj.cluster, inj.wall));
        }
    }
    r.invariant(
        "every DNS fault injected became an incident",
        unfound.is_empty() && !injections.is_empty(),
        format!(
            "{} injections held {hold} s; not found: {unfound:?}",
            injections.len()
        ),
    );
    let dns_ids: BTreeSet<&str> = dns.iter().map(|i| i.id.as_str()).collect();
    let resolved: BTreeSet<&str> = dns
        .iter()
        .filter(|i| i.status == IncidentStatus::Resolved)
        .map(|i| i.id.as_str())
        .collect();
    r.invariant(
        "every DNS incident resolved",
        dns_ids == resolved,
        format!("{} of {} resolved", resolved.len(), dns_ids.len()),
    );

    // notifications: each id once in FLEET_ALERTS; each DNS incident notified firing and resolved
    let notes = stored_notifications(&sys).await?;
    let mut ids = BTreeSet::new();
    let mut dup_ids = Vec::new();
    let mut firing: BTreeSet<String> = BTreeSet::new();
    let mut resolved_n: BTreeSet<String> = BTreeSet::new();
    for n in &notes {
        if !ids.insert(n.id.clone()) {
            dup_ids.push(n.id.clone());
        }
        for a in &n.alerts {
            match a.state {
                AlertState::Firing => firing.insert(a.incident_id.clone()),
                AlertState::Resolved => resolved_n.insert(a.incident_id.clone()),
            };
        }
    }
    let resent = obs.with(|s| {
        let mut c: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, id) in &s.notifications {
            *c.entry(id).or_default() += 1;
        }
        c.values().filter(|n| **n > 1).count()
    });
    r.figure(
        "notifications",
        format!(
            "{} in FLEET_ALERTS; {resent} re-sent after a kill with the same id (JetStream's Msg-Id dedup keeps one)",
            notes.len()
        ),
    );
    r.invariant(
        "no duplicated notification in FLEET_ALERTS",
        dup_ids.is_empty(),
        if dup_ids.is_empty() {
            format!("{} notifications, each id once", notes.len())
        } else {
            format!("ids twice: {dup_ids:?}")
        },
    );
    let not_firing: Vec<&&str> = dns_ids.iter().filter(|id| !firing.contains(**id)).collect();
    let not_resolved: Vec<&&str> = dns_ids
        .iter()
        .filter(|id| !resolved_n.contains(**id))
        .collect();
    r.invariant(
        "no lost notification: every DNS incident notified firing and resolved",
        not_firing.is_empty() && not_resolved.is_empty(),
        format!(
            "{} incidents; never notified firing: {not_firing:?}; never notified resolved: {not_resolved:?}",
            dns_ids.len()
        ),
    );

    // samples: what the stream holds is what the TSDB answers
    let name = "apiserver_storage_objects";
    let stored = stored_sample_times(&sys, name, ("resource", "pods")).await?;
    let tsdb = sys.tsdb_api().unwrap_or_default();
    let window = rec.now().ceil() as u64 + 120;
    let queried =
        queried_sample_times(&sys, &tsdb, &format!("{name}{{resource=\"pods\"}}"), window).await?;
    let (total, missing, detail) = compare_samples(&stored, &queried);
    r.invariant(
        "no lost sample (every apiserver_storage_objects{resource=\"pods\"} sample in FLEET_METRICS is queryable)",
        missing == 0 && total > 0,
        if missing == 0 {
            format!("{total} samples over {} clusters", stored.len())
        } else {
            detail.join("; ")
        },
    );
    obs.stop().await;
    report_flow(&mut r, &rec, from, to);
    report_processes(&mut r, &rec);
    r.note("The release role and the console are not stream consumers (they answer requests), so the drill kills the three roles that consume streams: correlator, TSDB and alert router.");
    r.note("A notification re-sent after a kill -9 carries the id of the first attempt; integrations reading FLEET_ALERTS see it once (Msg-Id dedup), webhooks get the same notificationId.");
    sys.stop();
    Ok((r, rec))
}
