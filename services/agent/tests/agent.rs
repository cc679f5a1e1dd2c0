//! The agent against the fleet simulator (1.24 and 1.31 at once) and a real nats-server: what lands in
//! the streams.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};
use async_nats::jetstream;
use common::*;
use futures::StreamExt;
use multipilot_schemas::Envelope;
use multipilot_sim::world;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_lands_with_the_version_chosen_per_cluster() -> Result<()> {
    let mut h = harness(2.0, 15).await?;
    h.start_agent()?;
    let js = h.js().await?;
    let kinds: Vec<&str> = multipilot_agent::kinds::KINDS
        .iter()
        .map(|k| k.kind)
        .collect();
    let r = until(
        "a ResourceState of every kind from both clusters",
        90,
        || {
            let js = js.clone();
            let kinds = kinds.clone();
            async move {
                let states = read_stream(&js, "FLEET_STATE").await?;
                let seen: BTreeSet<(String, String)> = states
                    .iter()
                    .filter(|(_, e)| e.schema == "ResourceState")
                    .map(|(_, e)| {
                        (
                            e.cluster.clone(),
                            e.payload["kind"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect();
                let missing: Vec<String> = ["old-124", "new-131"]
                    .iter()
                    .flat_map(|c| {
                        kinds
                            .iter()
                            .filter(|k| !seen.contains(&(c.to_string(), k.to_string())))
                            .map(move |k| format!("{c}/{k}"))
                    })
                    .collect();
                if !missing.is_empty() {
                    eprintln!("still missing: {}", missing.join(", "));
                }
                Ok(missing.is_empty().then_some(states))
            }
        },
    )
    .await;
    let states = match r {
        Ok(s) => s,
        Err(e) => anyhow::bail!("{e}\n{}", h.agent_log()),
    };
    // the version each kind was read with, per cluster
    let version_of = |cluster: &str, kind: &str| {
        states
            .iter()
            .find(|(_, e)| e.cluster == cluster && e.payload["kind"] == kind)
            .and_then(|(_, e)| e.payload["api_version"].as_str().map(str::to_string))
    };
    for cluster in ["old-124", "new-131"] {
        assert_eq!(version_of(cluster, "CronJob").as_deref(), Some("batch/v1"));
        assert_eq!(
            version_of(cluster, "HorizontalPodAutoscaler").as_deref(),
            Some("autoscaling/v2")
        );
        assert_eq!(
            version_of(cluster, "PodDisruptionBudget").as_deref(),
            Some("policy/v1")
        );
    }
    // secrets carry metadata only
    for (_, e) in states.iter().filter(|(_, e)| e.payload["kind"] == "Secret") {
        assert!(
            e.payload.get("spec").is_none_or(Value::is_null),
            "a Secret's state carries no spec"
        );
        assert!(
            !e.payload.to_string().contains("c2VjcmV0LXZhbHVl"),
            "secret data never leaves the cluster"
        );
    }
    // a resync marker after the initial list
    assert!(
        states
            .iter()
            .any(|(s, e)| s.starts_with("fleet.resync.old-124.") && e.schema == "ResyncMarker")
    );

    // facts: served versions differ, the chosen ones don't
    let facts = until("facts from both clusters", 60, || {
        let js = js.clone();
        async move {
            let facts = read_stream(&js, "FLEET_FACTS").await?;
            let both = facts
                .iter()
                .map(|(_, e)| e.cluster.clone())
                .collect::<BTreeSet<_>>()
                .len()
                == 2;
            Ok(both.then_some(facts))
        }
    })
    .await?;
    let fact = |c: &str| {
        facts
            .iter()
            .rev()
            .find(|(_, e)| e.cluster == c)
            .map(|(_, e)| e.payload.clone())
            .expect("facts")
    };
    let (old, new) = (fact("old-124"), fact("new-131"));
    let served = |f: &Value, gv: &str| {
        f["api_versions"]
            .as_array()
            .is_some_and(|a| a.iter().any(|v| v == gv))
    };
    assert!(served(&old, "batch/v1beta1") && !served(&new, "batch/v1beta1"));
    assert_eq!(old["version"]["minor"], 24);
    assert_eq!(new["version"]["minor"], 31);
    assert_eq!(old["preferred_versions"]["CronJob"], "batch/v1");
    // the agent's scrape interval (MULTIPILOT_AGENT__SCRAPE__INTERVAL_S): what the release role's analysis
    // builds its rate range from
    assert_eq!(old["scrape_interval_s"], 2, "{old}");
    assert!(
        old["gpus"].as_array().is_some_and(|g| !g.is_empty()),
        "GPU inventory: {old}"
    );
    assert!(
        old["coredns"]["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("v1."))
    );

    // metric batches, the fixture scrapes among them, parsed completely
    let batches = until("metric batches from the fixture scrapes", 60, || {
        let js = js.clone();
        async move {
            let batches = read_stream(&js, "FLEET_METRICS").await?;
            let all = [
                "node-exporter",
                "kube-state-metrics-v1.35",
                "prometheus-alltypes",
            ]
            .iter()
            .all(|f| {
                batches.iter().any(|(_, e)| {
                    e.payload["instance"]
                        .as_str()
                        .is_some_and(|i| i.contains(&format!("fixture-{f}:")))
                })
            });
            Ok(all.then_some(batches))
        }
    })
    .await?;
    for (_, e) in batches.iter().filter(|(_, e)| {
        e.payload["instance"]
            .as_str()
            .is_some_and(|i| i.contains("fixture-"))
    }) {
        assert_eq!(
            e.payload["rejected_lines"], 0,
            "fixture scrape parsed completely"
        );
        let samples = e.payload["samples"].as_array().context("samples")?;
        assert!(
            samples
                .iter()
                .all(|s| s["labels"]["cluster"] == e.cluster.as_str())
        );
    }
    // as Prometheus does, each scrape says how it went: `up` 1 and the samples it scraped, per target
    for f in ["node-exporter", "kube-state-metrics-v1.35"] {
        let own = |name: &str| -> Vec<f64> {
            batches
                .iter()
                .filter(|(_, e)| {
                    e.payload["instance"]
                        .as_str()
                        .is_some_and(|i| i.contains(&format!("fixture-{f}:")))
                })
                .flat_map(|(_, e)| e.payload["samples"].as_array().cloned().unwrap_or_default())
                .filter(|s| s["name"] == name && s["labels"]["job"].is_string())
                .filter_map(|s| s["value"].as_f64())
                .collect()
        };
        assert!(
            !own("up").is_empty() && own("up").iter().all(|v| *v == 1.0),
            "{f}: up {:?}",
            own("up")
        );
        assert!(
            own("scrape_samples_scraped").iter().all(|v| *v > 10.0),
            "{f}: scrape_samples_scraped {:?}",
            own("scrape_samples_scraped")
        );
        assert!(!own("scrape_duration_seconds").is_empty());
    }
    let apiserver = batches.iter().any(|(_, e)| e.payload["job"] == "apiserver");
    assert!(apiserver, "the API server's own metrics are scraped");
    h.stop_agent()?;
    Ok(())
}

/// Waits until both clusters' pods were relisted (a resync marker with a later epoch) since `since_ms`.
async fn relisted_since(js: &jetstream::Context, since_ms: i64) -> Result<()> {
    eventually("a relist of both clusters", 60, || {
        let js = js.clone();
        async move {
            let states = read_stream(&js, "FLEET_STATE").await?;
            Ok(["old-124", "new-131"].iter().all(|c| {
                states.iter().any(|(s, e)| {
                    s == &format!("fleet.resync.{c}.Pod")
                        && e.payload["epoch"].as_i64().is_some_and(|ep| ep > since_ms)
                })
            }))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_not_republished_after_a_relist_or_a_restart() -> Result<()> {
    let mut h = harness_with(5.0, 15, true).await?;
    h.start_agent()?;
    let js = h.js().await?;
    let count_events = |js: jetstream::Context| async move {
        let events = read_stream(&js, "FLEET_EVENTS").await?;
        let ids: BTreeSet<String> = events
            .iter()
            .map(|(_, e)| {
                e.payload["occurrence_id"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        Ok::<_, anyhow::Error>((events.len(), ids.len()))
    };
    eventually("events", 60, || {
        let js = js.clone();
        async move { Ok(count_events(js).await?.0 > 20) }
    })
    .await?;
    // force a relist: the watch history is compacted, resumes get 410 Gone
    let expired_at = chrono::Utc::now().timestamp_millis();
    for c in ["old-124", "new-131"] {
        world::set_fault(&h.cluster(c), "watch-expire", true, &BTreeMap::new())?;
    }
    relisted_since(&js, expired_at).await?;
    // and a restart
    h.stop_agent()?;
    let restarted_at = chrono::Utc::now().timestamp_millis();
    h.start_agent()?;
    relisted_since(&js, restarted_at).await?;
    h.stop_agent()?; // drains: what it sent is all in the stream
    let (messages, occurrences) = count_events(js.clone()).await?;
    assert_eq!(
        messages,
        occurrences,
        "each occurrence published once\n{}",
        h.agent_log()
    );
    let log = h.agent_log();
    h.stop_agent()?;
    assert!(log.contains("watching events"), "{log}");
    Ok(())
}

type Latest = Arc<Mutex<HashMap<(String, String), String>>>;

async fn watch_probes(h: &Harness) -> Result<Latest> {
    let client = h.nats.client().await?;
    let mut sub = client.subscribe("fleet.probe.>").await?;
    multipilot_testkit::wait::round_trip(&client).await?;
    let latest: Latest = Arc::default();
    let l = latest.clone();
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            if let Ok(env) = rmp_serde::from_slice::<Envelope<Value>>(&m.payload) {
                let probe = env.payload["probe"].as_str().unwrap_or("").to_string();
                let status = env.payload["status"].as_str().unwrap_or("").to_string();
                l.lock()
                    .expect("lock")
                    .insert((env.cluster.clone(), probe), status);
            }
        }
    });
    Ok(latest)
}

async fn wait_status(
    latest: &Latest,
    cluster: &str,
    probe: &str,
    want: &[&str],
    h: &Harness,
) -> Result<()> {
    let key = (cluster.to_string(), probe.to_string());
    let r = eventually(&format!("{cluster}/{probe} to be {want:?}"), 45, || {
        let got = latest.lock().expect("lock").get(&key).cloned();
        async move { Ok(got.is_some_and(|g| want.contains(&g.as_str()))) }
    })
    .await;
    if r.is_err() {
        let got = latest.lock().expect("lock").get(&key).cloned();
        anyhow::bail!(
            "{cluster}/{probe}: wanted {want:?}, last seen {got:?}\n{}",
            h.agent_log()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_probe_turns_unhealthy_on_its_fault_and_recovers() -> Result<()> {
    let mut h = harness(1.0, 5).await?;
    let latest = watch_probes(&h).await?;
    h.start_agent()?;
    let none = BTreeMap::new();
    let cases: &[(&str, &str, &str)] = &[
        ("etcd-unhealthy", "etcd", "new-131"),
        ("scheduler-down", "scheduler", "new-131"),
        ("controller-manager-down", "controller-manager", "old-124"),
        ("node-not-ready", "nodes", "new-131"),
        ("cni-down", "cni", "old-124"),
        ("coredns-down", "coredns", "new-131"),
        ("gpu-mismatch", "gpu-device-plugin", "old-124"),
        ("cert-expiry", "certificates", "new-131"),
        ("stuck-finalizer", "finalizers", "old-124"),
        ("external-ips", "external-ips", "new-131"),
        ("deprecated-api", "deprecated-apis", "new-131"),
        ("unreachable", "apiserver", "old-124"),
    ];
    for (fault, probe, cluster) in cases {
        wait_status(&latest, cluster, probe, &["healthy"], &h).await?;
        world::set_fault(&h.cluster(cluster), fault, true, &none)?;
        wait_status(&latest, cluster, probe, &["unhealthy"], &h).await?;
        world::set_fault(&h.cluster(cluster), fault, false, &none)?;
        wait_status(&latest, cluster, probe, &["healthy"], &h).await?;
    }
    // overload shows as a degraded (slow, erroring) API server, not a dead one
    let overload = BTreeMap::from([
        ("latency_ms".to_string(), "1500".to_string()),
        ("error_rate".to_string(), "0".to_string()),
    ]);
    world::set_fault(&h.cluster("new-131"), "overload", true, &overload)?;
    wait_status(&latest, "new-131", "apiserver", &["degraded"], &h).await?;
    world::set_fault(&h.cluster("new-131"), "overload", false, &none)?;
    wait_status(&latest, "new-131", "apiserver", &["healthy"], &h).await?;
    h.stop_agent()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_across_a_nats_restart_and_an_agent_kill() -> Result<()> {
    let mut h = harness(20.0, 15).await?;
    h.start_agent()?;
    let js = h.js().await?;
    eventually("first states", 60, || {
        let js = js.clone();
        async move {
            Ok(js
                .get_stream("FLEET_STATE")
                .await?
                .info()
                .await?
                .state
                .messages
                > 100)
        }
    })
    .await?;
    // NATS goes away for a while; the agent keeps collecting
    h.nats.kill();
    tokio::time::sleep(Duration::from_secs(6)).await;
    h.nats.restart().await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    // the agent dies without a chance to clean up, and comes back
    h.kill_agent();
    tokio::time::sleep(Duration::from_secs(2)).await;
    h.start_agent()?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    // a clean stop: the last heartbeat closes the accounting
    h.stop_agent()?;
    let js = h.js().await?;
    let mut all = Vec::new();
    for s in [
        "FLEET_STATE",
        "FLEET_FACTS",
        "FLEET_HEALTH",
        "FLEET_EVENTS",
        "FLEET_METRICS",
    ] {
        all.extend(read_stream(&js, s).await?);
    }
    for cluster in ["old-124", "new-131"] {
        let mine: Vec<&Envelope<Value>> = all
            .iter()
            .map(|(_, e)| e)
            .filter(|e| e.cluster == cluster)
            .collect();
        let last_hb = mine
            .iter()
            .filter(|e| e.schema == "Heartbeat")
            .max_by_key(|e| e.seq)
            .context("a heartbeat")?;
        let seqs: BTreeSet<u64> = mine
            .iter()
            .map(|e| e.seq)
            .filter(|s| *s <= last_hb.seq)
            .collect();
        let missing = last_hb.seq - seqs.len() as u64;
        let superseded = last_hb.payload["superseded"].as_u64().unwrap_or(0);
        let dropped = last_hb.payload["dropped_metric_batches"]
            .as_u64()
            .unwrap_or(0);
        let duplicates = last_hb.payload["duplicates"].as_u64().unwrap_or(0);
        assert_eq!(
            missing,
            superseded + dropped + duplicates,
            "{cluster}: of {} seqs, {missing} never arrived; the agent accounts for {superseded} superseded, {dropped} dropped, {duplicates} duplicates\n{}",
            last_hb.seq,
            h.agent_log()
        );
        // every seq is unique: no message stored twice under two seqs
        assert_eq!(
            seqs.len(),
            mine.iter().filter(|e| e.seq <= last_hb.seq).count(),
            "{cluster}: a seq stored twice"
        );
    }
    Ok(())
}
