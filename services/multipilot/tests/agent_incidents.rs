//! From a fault in a simulated cluster to the incident a person reads: the fleet simulator (1.24 and 1.31),
//! the real agent binary, a real nats-server and the correlator role, end to end.

#[path = "../../agent/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use common::*;
use futures::StreamExt;
use multipilot_schemas::Envelope;
use multipilot_schemas::payload::{Incident, IncidentStatus};
use multipilot_sim::world;
use tokio_util::sync::CancellationToken;

type Seen = Arc<Mutex<Vec<Incident>>>;

/// (fault, its parameters, cluster, incident kind, what the summary says)
type Case<'a> = (&'a str, BTreeMap<String, String>, &'a str, &'a str, &'a str);

async fn wait_incident(
    seen: &Seen,
    h: &Harness,
    cluster: &str,
    kind: &str,
    status: IncidentStatus,
) -> Result<Incident> {
    // resolution keeps a slower hysteresis than opening (healthy rounds at the probe's interval; a
    // windowed rule such as apiserver-overload waits for its failing rounds to leave the window: up to
    // 8 API server rounds, 40 s)
    let secs = if status == IncidentStatus::Resolved {
        120
    } else {
        60
    };
    let found = until(&format!("{cluster}/{kind} {status:?}"), secs, || {
        let got = seen
            .lock()
            .expect("lock")
            .iter()
            .rev()
            .find(|i| i.cluster == cluster && i.kind == kind && i.status == status)
            .cloned();
        async move { Ok(got) }
    })
    .await;
    match found {
        Ok(i) => Ok(i),
        Err(e) => {
            let kinds: Vec<String> = seen
                .lock()
                .expect("lock")
                .iter()
                .map(|i| format!("{}/{} {:?}", i.cluster, i.kind, i.status))
                .collect();
            anyhow::bail!("{e}; incidents seen: {kinds:?}\n{}", h.agent_log())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_simulator_fault_becomes_its_incident_and_resolves() -> Result<()> {
    let mut h = harness(1.0, 5).await?;
    let client = h.nats.client().await?;
    let seen: Seen = Arc::default();
    let mut sub = client.subscribe("fleet.incident.>").await?;
    multipilot_testkit::wait::round_trip(&client).await?;
    {
        let seen = seen.clone();
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                if let Ok(env) = rmp_serde::from_slice::<Envelope<Incident>>(&m.payload) {
                    seen.lock().expect("lock").push(env.payload);
                }
            }
        });
    }
    let cancel = CancellationToken::new();
    let ctx = multipilot_runtime::Context::new(client.clone(), "correlator-test", cancel.clone());
    let dir = tempfile::tempdir()?;
    let cfg = multipilot_correlator::Config {
        data_dir: dir.path().join("correlator").to_string_lossy().into_owned(),
        tick_ms: 200,
        ..Default::default()
    };
    let correlator = tokio::spawn(multipilot_correlator::run(cfg, ctx));
    h.start_agent()?;

    // a change shortly before a failure is its first evidence
    tokio::time::sleep(Duration::from_secs(6)).await;
    world::change(
        &h.cluster("new-131"),
        "apps",
        "deployments",
        "kube-system",
        "coredns",
        |d| {
            d["spec"]["template"]["spec"]["containers"][0]["image"] =
                "registry.k8s.io/coredns/coredns:v1.11.3".into();
        },
    );
    tokio::time::sleep(Duration::from_secs(3)).await;

    let none = BTreeMap::new();
    let p = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    let cases: Vec<Case> = vec![
        (
            "coredns-down",
            none.clone(),
            "new-131",
            "dns-failure",
            "Cluster DNS failing on new-131",
        ),
        (
            "etcd-unhealthy",
            none.clone(),
            "new-131",
            "etcd-unhealthy",
            "etcd of new-131 failing its readiness check",
        ),
        (
            "scheduler-down",
            none.clone(),
            "new-131",
            "scheduler-down",
            "No active kube-scheduler on new-131",
        ),
        (
            "controller-manager-down",
            none.clone(),
            "old-124",
            "controller-manager-down",
            "No active kube-controller-manager on old-124",
        ),
        (
            "node-not-ready",
            none.clone(),
            "new-131",
            "node-not-ready",
            "node new-131-worker-0 is not Ready",
        ),
        (
            "cni-down",
            none.clone(),
            "old-124",
            "cni-degraded",
            "CNI degraded on old-124",
        ),
        (
            "gpu-mismatch",
            none.clone(),
            "old-124",
            "gpu-driver-mismatch",
            "GPU device plugin broken on old-124: device plugin v0.17.0 needs driver >= 550",
        ),
        (
            "cert-expiry",
            none.clone(),
            "new-131",
            "cert-expiring",
            "API server certificate of new-131 expiring",
        ),
        (
            "stuck-finalizer",
            none.clone(),
            "old-124",
            "finalizer-stuck",
            "ConfigMap legacy-config stuck terminating",
        ),
        (
            "external-ips",
            none.clone(),
            "new-131",
            "external-ip-exposure",
            "Service default/exposed-debug sets externalIPs 198.51.100.7",
        ),
        (
            "deprecated-api",
            none.clone(),
            "new-131",
            "deprecated-api-in-use",
            "last applied as policy/v1beta1",
        ),
        (
            "overload",
            p(&[("latency_ms", "1500"), ("error_rate", "0")]),
            "new-131",
            "apiserver-overload",
            "API server of new-131 overloaded",
        ),
        (
            "unreachable",
            none.clone(),
            "old-124",
            "apiserver-down",
            "API server of old-124 not answering",
        ),
        (
            "clock-skew",
            p(&[("seconds", "300")]),
            "new-131",
            "clock-skew",
            "Clock of new-131 off by +",
        ),
    ];
    for (fault, params, cluster, kind, summary) in &cases {
        world::set_fault(&h.cluster(cluster), fault, true, params)?;
        let inc = wait_incident(&seen, &h, cluster, kind, IncidentStatus::Open).await?;
        assert!(
            inc.summary.contains(summary),
            "{fault}: summary {:?} lacks {summary:?}",
            inc.summary
        );
        if *fault == "clock-skew" {
            // 300 s of skew, estimated through the Date header's whole seconds and delivery delay
            let secs: f64 = inc
                .summary
                .split("off by +")
                .nth(1)
                .and_then(|r| r.split('s').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0.0);
            assert!((290.0..=310.0).contains(&secs), "{}", inc.summary);
        }
        if *fault == "coredns-down" {
            // what the probe found first, then the change to the Deployment it names
            let kinds: Vec<_> = inc.evidence.iter().map(|e| e.kind).collect();
            use multipilot_schemas::payload::EvidenceKind;
            assert_eq!(
                kinds.get(..2),
                Some(&[EvidenceKind::Fact, EvidenceKind::Change][..]),
                "{:#?}",
                inc.evidence
            );
            assert!(
                inc.evidence[0].summary.contains("cluster DNS is down")
                    && inc.evidence[1]
                        .summary
                        .contains("Deployment kube-system/coredns changed"),
                "{:#?}",
                inc.evidence
            );
            assert!(
                inc.summary.contains("changed there in the"),
                "{}",
                inc.summary
            );
        }
        world::set_fault(&h.cluster(cluster), fault, false, &none)?;
        wait_incident(&seen, &h, cluster, kind, IncidentStatus::Resolved).await?;
    }
    // a burst of warnings is one event storm, not hundreds of messages
    world::set_fault(
        &h.cluster("old-124"),
        "warning-burst",
        true,
        &p(&[("count", "600")]),
    )?;
    let storm = wait_incident(&seen, &h, "old-124", "event-storm", IncidentStatus::Open).await?;
    assert!(storm.summary.contains("FailedMount"), "{}", storm.summary);

    h.stop_agent()?;
    cancel.cancel();
    let _ = correlator.await;
    Ok(())
}
