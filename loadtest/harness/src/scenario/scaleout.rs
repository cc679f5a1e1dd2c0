//! Scale-out: two correlator and two TSDB instances (partitions) on a 3-node JetStream cluster with
//! replicated streams.
//!
//! 1. The instances share the load with no double processing: each message processed by exactly one.
//! 2. The JetStream cluster loses a node (the leader of the busiest stream) without losing an acked message.
//! 3. A correlator, a TSDB and the alert router lose their local stores (kill -9, data wiped) and rebuild
//!    from the streams; silences and the notification log come back from replicated KV buckets.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use async_nats::jetstream::stream;

use super::{
    FAST_ROUTING, Opts, account, compare_samples, queried_sample_times, report_accounting,
    report_flow, report_processes, stored_notifications,
};
use crate::observe::{Observer, consumed_done};
use crate::record::Recorder;
use crate::report::Report;
use crate::system::{Nats, RoleKind, Spec, System};

/// Runs it.
pub async fn run(o: &Opts, dir: &std::path::Path) -> Result<(Report, Recorder)> {
    let spec = Spec {
        clusters: o.clusters.unwrap_or(o.pick(4, 12)),
        objects: o.objects.unwrap_or(o.pick(150, 500)),
        churn: o.churn.unwrap_or(2.0),
        events_per_second: o.events_per_second.unwrap_or(o.pick(3.0, 10.0)),
        scrape_interval_s: 5,
        probe_interval_s: Some(5),
        agents: o.agents.unwrap_or(o.pick(1, 2)),
        correlators: 2,
        tsdbs: 2,
        accounting: true,
        rate: None,
        nats_nodes: 3,
        alerts_routing: Some(FAST_ROUTING.into()),
        outbox_max_bytes: None,
        release: None,
    };
    let run_s = o.duration.unwrap_or(o.pick(15, 120));
    let mut r = Report::new(
        "scaleout",
        o.short,
        serde_json::json!({"spec": spec, "seconds_per_phase": run_s}),
    );
    let rec = Recorder::new();
    let mut sys = System::start(spec.clone(), dir, o.bins()?).await?;
    let obs = Observer::start(&sys, &rec, Duration::from_secs(1), false).await?;
    rec.mark("system up");
    // an incident that must survive the wipe
    let dns_cluster = sys.clusters[0].clone();
    sys.fault(&dns_cluster, "coredns-down", true, &[]).await?;
    tokio::time::sleep(Duration::from_secs(run_s)).await;

    // 1. shared load, each message processed once
    sys.stop_agents();
    rec.mark("checkpoint: agents stopped");
    sys.wait_caught_up(&[], 300).await?;
    let jsz = sys.jsz().await?;
    let mut done: BTreeMap<(String, String), f64> = BTreeMap::new();
    for role in &sys.roles {
        if role.kind == RoleKind::Alerts {
            continue;
        }
        let text = sys.get(&format!("{}/metrics", role.http)).await?;
        for (consumer, v) in consumed_done(&text) {
            done.insert((role.proc.name.clone(), consumer), v);
        }
    }
    for (stream, prefix) in [
        ("FLEET_EVENTS", "correlator-events"),
        ("FLEET_HEALTH", "correlator-health"),
        ("FLEET_STATE", "correlator-state"),
        ("FLEET_FACTS", "correlator-facts"),
        ("FLEET_METRICS", "tsdb"),
    ] {
        let held = jsz.stream(stream).map_or(0, |s| s.messages) as f64;
        let per: Vec<(String, f64)> = done
            .iter()
            .filter(|((_, c), _)| c.starts_with(prefix) && c.contains("-p"))
            .map(|((p, c), v)| (format!("{p} ({c})"), *v))
            .collect();
        let sum: f64 = per.iter().map(|p| p.1).sum();
        let shares = per
            .iter()
            .map(|(n, v)| format!("{n}: {v:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        r.invariant(
            format!("{stream}: every message processed by exactly one instance"),
            per.len() == 2 && per.iter().all(|p| p.1 > 0.0) && (sum - held).abs() < 0.5,
            format!("{held:.0} stored; processed {sum:.0} = {shares}"),
        );
    }
    for (i, (p, _)) in sys.agents.iter_mut().enumerate() {
        p.start().with_context(|| format!("restarting agent {i}"))?;
    }
    sys.refresh_watch();
    rec.mark("agents back");
    tokio::time::sleep(Duration::from_secs(5)).await;

    // 2. a node dies under acked publishing
    let js = sys.js.clone();
    js.create_stream(stream::Config {
        name: "LOADTEST_ACKED".into(),
        subjects: vec!["loadtest.acked".into()],
        num_replicas: 3,
        ..Default::default()
    })
    .await?;
    let acked: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let (js, acked, stop) = (js.clone(), acked.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n: u64 = 0;
            let mut failed: u64 = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                n += 1;
                let ack = match js.publish("loadtest.acked", n.to_string().into()).await {
                    Ok(f) => tokio::time::timeout(Duration::from_secs(5), f).await,
                    Err(_) => {
                        failed += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                match ack {
                    Ok(Ok(_)) => {
                        acked.lock().unwrap_or_else(|e| e.into_inner()).insert(n);
                    }
                    _ => failed += 1,
                }
            }
            (n, failed)
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let leader = js
        .get_stream("FLEET_EVENTS")
        .await?
        .info()
        .await?
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .unwrap_or_default();
    let victim: usize = leader
        .trim_start_matches('n')
        .parse()
        .context("the stream leader's name")?;
    if let Nats::Cluster(c) = &mut sys.nats {
        c.nodes[victim].kill();
    }
    sys.refresh_watch();
    rec.mark(format!("node {leader} (FLEET_EVENTS leader) killed"));
    tokio::time::sleep(Duration::from_secs(run_s)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (sent, failed) = publisher.await?;
    let acked = acked.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut held = BTreeSet::new();
    sys.for_each_message("LOADTEST_ACKED", "", |_, body| {
        if let Ok(n) = std::str::from_utf8(body).unwrap_or("").parse::<u64>() {
            held.insert(n);
        }
    })
    .await?;
    let lost: Vec<&u64> = acked.difference(&held).collect();
    r.figure(
        "acked publishing across the node loss",
        format!(
            "{sent} published, {} acked, {failed} not acked (retried by a real producer), {} stored",
            acked.len(),
            held.len()
        ),
    );
    r.invariant(
        "a node lost without losing an acked message",
        lost.is_empty() && !acked.is_empty(),
        if lost.is_empty() {
            format!(
                "all {} acked messages stored on the surviving nodes",
                acked.len()
            )
        } else {
            format!("{} acked but gone, first {:?}", lost.len(), lost.first())
        },
    );

    // 3. wiped local stores
    let alerts_api = sys
        .roles
        .iter()
        .find(|x| x.kind == RoleKind::Alerts)
        .and_then(|x| x.api.clone())
        .unwrap_or_default();
    let http = reqwest::Client::new();
    let silence: serde_json::Value = http
        .post(format!("{alerts_api}/api/v2/silences"))
        .json(&serde_json::json!({
            "matchers": [{"name": "cluster", "value": sys.clusters[1], "isRegex": false, "isEqual": true}],
            "startsAt": chrono::Utc::now(),
            "endsAt": chrono::Utc::now() + chrono::Duration::hours(2),
            "createdBy": "loadtest", "comment": "must survive a wiped store"}))
        .send()
        .await?
        .json()
        .await?;
    let silence_id = silence["silenceID"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let open_before = open_incidents(&sys).await?;
    let tsdb0 = sys.role(RoleKind::Tsdb, 0).context("tsdb-0")?;
    let tsdb1 = sys.role(RoleKind::Tsdb, 1).context("tsdb-1")?;
    let api0 = sys.roles[tsdb0].api.clone().unwrap_or_default();
    let api1 = sys.roles[tsdb1].api.clone().unwrap_or_default();
    let sel = "apiserver_storage_objects{resource=\"pods\"}";
    let window = rec.now().ceil() as u64 + 120;
    let notes_before = stored_notifications(&sys).await?;
    // stop the agents for a moment so the comparison sees one fixed set of samples
    sys.stop_agents();
    sys.wait_caught_up(&[], 300).await?;
    let samples_before = queried_sample_times(&sys, &api1, sel, window).await?;
    let wiped: Vec<usize> = [
        sys.role(RoleKind::Correlator, 0),
        Some(tsdb0),
        sys.roles.iter().position(|x| x.kind == RoleKind::Alerts),
    ]
    .into_iter()
    .flatten()
    .collect();
    for &i in &wiped {
        sys.kill_role(i);
        let d = sys.roles[i].data_dir.clone();
        std::fs::remove_dir_all(&d).with_context(|| format!("wiping {}", d.display()))?;
        rec.mark(format!("{} killed, store wiped", sys.roles[i].proc.name));
    }
    for &i in &wiped {
        sys.restart_role(i).await?;
    }
    rec.mark("wiped roles back");
    let rebuilt = sys.wait_caught_up(&[], 300).await;
    r.invariant(
        "wiped roles catch up with the streams",
        rebuilt.is_ok(),
        match &rebuilt {
            Ok(d) => format!("{:.1} s", d.as_secs_f64()),
            Err(e) => e.to_string(),
        },
    );
    // the TSDB: what it held comes back (everything is still in FLEET_METRICS)
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut total, mut missing, mut detail) = (0, 0, Vec::new());
    while Instant::now() < deadline {
        let after0 = queried_sample_times(&sys, &api0, sel, window).await?;
        (total, missing, detail) = compare_samples(&samples_before, &after0);
        if missing == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    r.invariant(
        "the TSDB rebuilds its samples from FLEET_METRICS (queried through either instance)",
        missing == 0 && total > 0,
        if missing == 0 {
            format!("{total} samples over {} clusters", samples_before.len())
        } else {
            detail.join("; ")
        },
    );
    // the correlator: its open incidents are still open, same ids, revisions continuing
    // (an incident may also have resolved meanwhile, legitimately: the agents are stopped, so event storms
    // end; it must still be the same incident, at a later revision)
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut open_after = BTreeMap::new();
    while Instant::now() < deadline {
        open_after = known_incidents(&sys).await.unwrap_or_default();
        if open_before.keys().all(|k| open_after.contains_key(k)) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let lost_inc: Vec<&String> = open_before
        .keys()
        .filter(|k| !open_after.contains_key(*k))
        .collect();
    let went_back: Vec<String> = open_before
        .iter()
        .filter_map(|(k, rev)| {
            open_after
                .get(k)
                .filter(|a| **a < *rev)
                .map(|a| format!("{k}: {rev} → {a}"))
        })
        .collect();
    r.invariant(
        "the correlator rebuilds its open incidents (same ids, revisions never go back)",
        lost_inc.is_empty() && went_back.is_empty() && !open_before.is_empty(),
        format!(
            "{} open before, {} known after (open or resolved since); lost {lost_inc:?}; revisions back {went_back:?}",
            open_before.len(),
            open_after.len()
        ),
    );
    // the alert router: the silence is back, nothing notified twice
    let silences: serde_json::Value = http
        .get(format!("{alerts_api}/api/v2/silences"))
        .send()
        .await?
        .json()
        .await?;
    let kept =
        silences.as_array().into_iter().flatten().any(|s| {
            s["id"].as_str() == Some(silence_id.as_str()) && s["status"]["state"] == "active"
        });
    r.invariant(
        "a silence survives the alert router's wiped store (replicated KV)",
        kept && !silence_id.is_empty(),
        format!(
            "silence {silence_id:?} {}",
            if kept { "active" } else { "gone" }
        ),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let notes_after = stored_notifications(&sys).await?;
    let key = |n: &multipilot_schemas::payload::Notification| {
        let mut alerts: Vec<String> = n
            .alerts
            .iter()
            .map(|a| format!("{}:{:?}", a.incident_id, a.state))
            .collect();
        alerts.sort();
        format!("{}|{:?}|{}", n.group_key, n.state, alerts.join(","))
    };
    let before_keys: BTreeSet<String> = notes_before.iter().map(key).collect();
    let resent: Vec<String> = notes_after[notes_before.len().min(notes_after.len())..]
        .iter()
        .map(key)
        .filter(|k| before_keys.contains(k))
        .collect();
    r.invariant(
        "the alert router's notification log survives: nothing already notified is notified again",
        resent.is_empty(),
        format!(
            "{} notifications before the wipe, {} after; re-sent: {resent:?}",
            notes_before.len(),
            notes_after.len()
        ),
    );

    // 4. nothing lost overall: every agent seq across the node loss and restarts
    for (i, (p, _)) in sys.agents.iter_mut().enumerate() {
        p.start().with_context(|| format!("restarting agent {i}"))?;
    }
    sys.refresh_watch();
    tokio::time::sleep(Duration::from_secs(5)).await;
    sys.stop_agents();
    sys.wait_caught_up(&[], 300).await?;
    let to = rec.now();
    obs.stop().await;
    let acc = account(&sys).await?;
    report_accounting(&mut r, &sys.clusters.clone(), &acc);
    report_flow(&mut r, &rec, 0.0, to);
    report_processes(&mut r, &rec);
    r.note("Partitions: the NATS server's subject mapping (deploy/nats/partitions.conf) adds partition(2, cluster) to every agent subject; each correlator and TSDB instance reads its partition through its own durable consumers, so JetStream decides who reads what and a cluster always lands on the same instance. Each TSDB instance answers queries for the whole fleet by asking its peer for the raw series it lacks.");
    r.note("Every stream has 3 replicas here; the node killed is the FLEET_EVENTS stream leader and stays down for the rest of the run.");
    sys.stop();
    Ok((r, rec))
}

/// Open incidents (id → revision), asked as an operator would: `multipilot incidents -o json`.
async fn open_incidents(sys: &System) -> Result<BTreeMap<String, u64>> {
    incidents(sys, false).await
}

/// Every incident the correlators know, resolved ones included (`multipilot incidents --all -o json`).
async fn known_incidents(sys: &System) -> Result<BTreeMap<String, u64>> {
    incidents(sys, true).await
}

async fn incidents(sys: &System, all: bool) -> Result<BTreeMap<String, u64>> {
    let mut args = vec!["incidents", "-o", "json"];
    if all {
        args.push("--all");
    }
    let out = sys.cli(&args).await?;
    let v: serde_json::Value = serde_json::from_str(&out).context("incidents -o json")?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .filter(|i| all || i["status"] != "resolved")
        .filter_map(|i| Some((i["id"].as_str()?.to_string(), i["revision"].as_u64()?)))
        .collect())
}
