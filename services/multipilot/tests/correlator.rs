//! The correlator role (the real `multipilot correlator` process) fed sequences through a real nats-server:
//! incidents with summary and evidence, unreachable clusters, clock skew, late messages, baseline drift,
//! and a kill -9 mid-stream.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result};
use chrono::{DateTime, Utc};
use common::{Correlator, Proc};
use multipilot_schemas::payload::*;
use multipilot_schemas::{Envelope, subject};
use multipilot_testkit::NatsServer;
use multipilot_testkit::wait::eventually;

// What these tests send and wait for, beyond what `common` gives every test.
impl Correlator {
    async fn probe(
        &mut self,
        cluster: &str,
        probe: &str,
        status: ProbeStatus,
        round: u64,
        t: DateTime<Utc>,
    ) -> Result<()> {
        let detail = format!("{probe} round {round}: {status:?}");
        let findings = if status == ProbeStatus::Healthy {
            vec![]
        } else {
            vec![Finding {
                severity: Severity::Critical,
                object: None,
                message: "cluster DNS is down: no ready CoreDNS endpoints".into(),
            }]
        };
        let p = ProbeResult {
            probe: probe.into(),
            status,
            latency_ms: 3.0,
            detail,
            round,
            observations: BTreeMap::from([(
                "ready".into(),
                if status == ProbeStatus::Healthy {
                    2.0
                } else {
                    0.0
                },
            )]),
            findings,
        };
        self.send(subject::probe(cluster, probe), cluster, t, p)
            .await
    }

    async fn heartbeat(&mut self, cluster: &str, cluster_time: DateTime<Utc>) -> Result<()> {
        let hb = Heartbeat {
            interval_s: 1,
            agent_version: "test".into(),
            started_at: Utc::now(),
            outbox_depth: 0,
            dropped_metric_batches: 0,
            apiserver_reachable: true,
            superseded: 0,
            duplicates: 0,
        };
        self.send(subject::heartbeat(cluster), cluster, cluster_time, hb)
            .await
    }

    async fn wait_for<F: Fn(&[Incident]) -> bool>(
        &self,
        what: &str,
        f: F,
    ) -> Result<Vec<Incident>> {
        // a deadline, not a timing assertion: generous for a busy machine
        for _ in 0..300 {
            let all = self.incidents().await?;
            if f(&all) {
                return Ok(all);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        anyhow::bail!(
            "timed out waiting for {what}; incidents: {:#?}\n{}",
            self.incidents().await?,
            self.log()
        )
    }
}

fn t0() -> DateTime<Utc> {
    Utc::now() - chrono::Duration::hours(1)
}

fn secs(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

fn deployment(spec_hash: &str) -> ResourceState {
    ResourceState {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        namespace: Some("kube-system".into()),
        name: "coredns".into(),
        uid: "u-coredns".into(),
        resource_version: "1".into(),
        generation: Some(1),
        spec_hash: spec_hash.into(),
        metadata_hash: "m".into(),
        spec: None,
        status: Default::default(),
        labels: Default::default(),
        annotations: Default::default(),
        owner_refs: vec![],
        finalizers: vec![],
        deletion_timestamp: None,
        creation_timestamp: None,
        field_managers: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_probe_opens_an_incident_with_evidence_and_resolves_without_reopening_late()
-> Result<()> {
    let mut hub = Correlator::start().await?;
    let t = t0();
    let c = "prod-1";
    hub.send(
        subject::state(c, "Deployment", Some("kube-system"), "coredns"),
        c,
        t,
        deployment("aaaa1111"),
    )
    .await?;
    // FLEET_STATE keeps one message per subject: the second state would replace the first before a busy
    // correlator read it, and a change whose before nobody saw is no change
    hub.drained("FLEET_STATE", "correlator-state").await?;
    hub.send(
        subject::state(c, "Deployment", Some("kube-system"), "coredns"),
        c,
        t + secs(60),
        deployment("bbbb2222"),
    )
    .await?;
    // streams are consumed independently: the change is in before the failures (as it is in life)
    hub.drained("FLEET_STATE", "correlator-state").await?;
    for round in 1..=6 {
        hub.probe(
            c,
            "coredns",
            ProbeStatus::Unhealthy,
            round,
            t + secs(120 + round as i64 * 15),
        )
        .await?;
    }
    let all = hub
        .wait_for("a dns-failure incident", |i| {
            i.iter().any(|x| x.kind == "dns-failure")
        })
        .await?;
    let inc = all
        .iter()
        .find(|x| x.kind == "dns-failure")
        .context("incident")?;
    assert_eq!(inc.cluster, c);
    assert_eq!(inc.status, IncidentStatus::Open);
    assert_eq!(inc.severity, Severity::Critical);
    assert!(
        inc.summary.starts_with("Cluster DNS failing on prod-1"),
        "{}",
        inc.summary
    );
    assert!(
        inc.summary.contains("1 deployment changed there"),
        "{}",
        inc.summary
    );
    assert_eq!(
        inc.opened_at,
        t + secs(120 + 3 * 15),
        "opened at the third failing round (rules.yaml: after 3, for 10 s), in the cluster's clock"
    );
    // what the probe found, then the change to the object named like it
    let first = inc.evidence.first().context("evidence")?;
    assert_eq!((first.rank, first.kind.as_str()), (1, "fact"));
    assert_eq!(
        first.summary,
        "cluster DNS is down: no ready CoreDNS endpoints"
    );
    let second = inc.evidence.get(1).context("a second item")?;
    assert_eq!(second.kind, EvidenceKind::Change);
    assert!(
        second
            .summary
            .contains("Deployment kube-system/coredns changed (spec aaaa1111 → bbbb2222)"),
        "{}",
        second.summary
    );
    // the probe's measurement stayed at 0 over its failing rounds: a trend that did not move is no evidence
    assert!(
        inc.evidence.iter().all(|e| e.kind != EvidenceKind::Trend),
        "{:?}",
        inc.evidence
    );

    for round in 7..=9 {
        hub.probe(
            c,
            "coredns",
            ProbeStatus::Healthy,
            round,
            t + secs(120 + round as i64 * 15),
        )
        .await?;
    }
    hub.wait_for("the incident resolved", |i| {
        i.iter()
            .any(|x| x.kind == "dns-failure" && x.status == IncidentStatus::Resolved)
    })
    .await?;
    // late messages (older than what was applied) neither reopen it nor open another
    for round in 2..=8 {
        hub.probe(
            c,
            "coredns",
            ProbeStatus::Unhealthy,
            round,
            t + secs(100 + round as i64),
        )
        .await?;
    }
    hub.heartbeat(c, Utc::now()).await?; // a marker: once it is processed, the late probes were too
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = hub.incidents().await?;
    let dns: Vec<_> = after.iter().filter(|x| x.kind == "dns-failure").collect();
    assert_eq!(
        dns.len(),
        2,
        "one open and one resolve change, nothing reopened: {dns:#?}"
    );

    // the CLI shows what the correlator knows
    let out = Command::new(env!("CARGO_BIN_EXE_multipilot"))
        .args(["incidents", "--all"])
        .env("MULTIPILOT_NATS__URL", hub.nats.url())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("dns-failure") && text.contains("resolved"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_cluster_is_unreachable_and_skewed_clock_is_detected() -> Result<()> {
    let mut hub = Correlator::start().await?;
    for _ in 0..3 {
        hub.heartbeat("quiet-1", Utc::now()).await?;
        hub.heartbeat("skewed-1", Utc::now() + secs(120)).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let all = hub
        .wait_for("clock skew on skewed-1", |i| {
            i.iter().any(|x| x.kind == "clock-skew")
        })
        .await?;
    let skew = all
        .iter()
        .find(|x| x.kind == "clock-skew")
        .context("skew")?;
    assert_eq!(skew.cluster, "skewed-1");
    assert!(skew.summary.contains("off by +12"), "{}", skew.summary);
    // quiet-1 stops; skewed-1 keeps going
    let all = hub
        .wait_for("quiet-1 unreachable", |i| {
            i.iter()
                .any(|x| x.kind == "cluster-unreachable" && x.cluster == "quiet-1")
        })
        .await?;
    assert!(
        all.iter()
            .find(|x| x.kind == "cluster-unreachable")
            .is_some_and(|x| x.summary.contains("no agent heartbeat for"))
    );
    for _ in 0..2 {
        hub.heartbeat("quiet-1", Utc::now()).await?;
    }
    hub.wait_for("quiet-1 reachable again", |i| {
        i.iter()
            .any(|x| x.kind == "cluster-unreachable" && x.status == IncidentStatus::Resolved)
    })
    .await?;
    // skew corrected: resolved
    for _ in 0..12 {
        hub.heartbeat("skewed-1", Utc::now()).await?;
    }
    hub.wait_for("skew resolved", |i| {
        i.iter()
            .any(|x| x.kind == "clock-skew" && x.status == IncidentStatus::Resolved)
    })
    .await?;
    Ok(())
}

/// [`common::facts`] with a CNI, CoreDNS and an ingress controller.
fn facts(minor: u32) -> ClusterFacts {
    let comp = |n: &str, v: &str| {
        Some(Component {
            name: n.into(),
            version: v.into(),
            ready: None,
        })
    };
    ClusterFacts {
        node_software: Vec::new(),
        cni: comp("cilium", "v1.15.6"),
        coredns: comp("coredns", "v1.11.1"),
        ingress_controller: comp("ingress-nginx", "v1.10.1"),
        ..common::facts(minor)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standing_non_compliance_is_reported_and_a_cluster_that_drifts_raises_an_incident()
-> Result<()> {
    let mut hub = Correlator::start().await?;
    let now = Utc::now();
    hub.send(subject::facts("old-1"), "old-1", now, facts(24))
        .await?;
    hub.send(subject::facts("new-1"), "new-1", now, facts(31))
        .await?;
    // first sight: old-1's version is outside the baseline — in the compliance report, not an incident
    let reports = eventually("both clusters judged", 30, async || {
        hub.compliance()
            .await
            .ok()
            .filter(|r: &Vec<ComplianceReport>| r.len() == 2)
    })
    .await?;
    let by: BTreeMap<_, _> = reports.iter().map(|r| (r.cluster.as_str(), r)).collect();
    assert!(!by["old-1"].compliant);
    assert!(
        by["old-1"]
            .checks
            .iter()
            .any(|c| c.rule == "kubernetes-version" && c.message.contains("v1.24.2")),
        "{:#?}",
        by["old-1"]
    );
    assert!(by["new-1"].compliant, "{:#?}", by["new-1"]);
    assert!(
        hub.incidents()
            .await?
            .iter()
            .all(|x| x.kind != "baseline-drift"),
        "standing non-compliance is not an incident"
    );
    // a namespace without a Pod Security level makes new-1 drift too, and labelling it heals it
    let mut ns = deployment("x");
    ns.kind = "Namespace".into();
    ns.api_version = "v1".into();
    ns.namespace = None;
    ns.name = "legacy".into();
    hub.send(
        subject::state("new-1", "Namespace", None, "legacy"),
        "new-1",
        now + secs(1),
        ns.clone(),
    )
    .await?;
    hub.wait_for("pss drift on new-1", |i| {
        i.iter().any(|x| {
            x.cluster == "new-1" && x.kind == "baseline-drift" && x.summary.contains("pss-labels")
        })
    })
    .await?;
    ns.labels.insert(
        "pod-security.kubernetes.io/enforce".into(),
        "baseline".into(),
    );
    hub.send(
        subject::state("new-1", "Namespace", None, "legacy"),
        "new-1",
        now + secs(2),
        ns,
    )
    .await?;
    hub.wait_for("pss drift resolved", |i| {
        i.iter()
            .any(|x| x.cluster == "new-1" && x.status == IncidentStatus::Resolved)
    })
    .await?;
    // old-1 upgraded into the range, then rolled back out of it: that is drift
    hub.send(subject::facts("old-1"), "old-1", now + secs(3), facts(31))
        .await?;
    // one message per subject in FLEET_FACTS: the upgrade is read before the rollback replaces it
    hub.drained("FLEET_FACTS", "correlator-facts").await?;
    hub.send(subject::facts("old-1"), "old-1", now + secs(4), facts(24))
        .await?;
    let all = hub
        .wait_for("version drift on old-1", |i| {
            i.iter()
                .any(|x| x.cluster == "old-1" && x.kind == "baseline-drift")
        })
        .await?;
    assert!(
        all.iter().any(|x| x.cluster == "old-1"
            && x.summary.contains("kubernetes-version")
            && x.summary.contains("v1.24.2")),
        "{all:#?}"
    );
    // the reports are on the stream too
    let s = hub.js.get_stream("FLEET_INCIDENTS").await?;
    assert!(
        s.get_last_raw_message_by_subject(&subject::compliance("old-1"))
            .await
            .is_ok()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_neither_loses_nor_duplicates_an_incident() -> Result<()> {
    let mut hub = Correlator::start().await?;
    let t = t0();
    let clusters: Vec<String> = (0..12).map(|i| format!("c{i:02}")).collect();
    // 3 cycles of 5 failing + 3 healthy rounds per cluster: 3 opens and 3 resolutions each
    let mut round = 0u64;
    for cycle in 0..3 {
        for step in 0..8u64 {
            round += 1;
            for c in &clusters {
                let st = if step < 5 {
                    ProbeStatus::Unhealthy
                } else {
                    ProbeStatus::Healthy
                };
                hub.probe(c, "etcd", st, round, t + secs(round as i64 * 10))
                    .await?;
            }
            if cycle == 1 && step == 3 {
                // mid-stream: the correlator dies without a chance to clean up, and comes back
                tokio::time::sleep(Duration::from_millis(300)).await;
                hub.kill();
                hub.spawn()?;
            }
        }
    }
    let all = hub
        .wait_for("36 incident changes", |i| {
            i.iter().filter(|x| x.kind == "etcd-unhealthy").count() >= clusters.len() * 6
        })
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let all: Vec<Incident> = if hub.incidents().await?.len() > all.len() {
        hub.incidents().await?
    } else {
        all
    };
    let etcd: Vec<&Incident> = all.iter().filter(|x| x.kind == "etcd-unhealthy").collect();
    let keys: BTreeSet<(String, u64)> = etcd.iter().map(|x| (x.id.clone(), x.revision)).collect();
    assert_eq!(keys.len(), etcd.len(), "an incident change stored twice");
    for c in &clusters {
        let mine: Vec<_> = etcd.iter().filter(|x| &x.cluster == c).collect();
        let opened = mine
            .iter()
            .filter(|x| x.status == IncidentStatus::Open)
            .count();
        let resolved = mine
            .iter()
            .filter(|x| x.status == IncidentStatus::Resolved)
            .count();
        assert_eq!((opened, resolved), (3, 3), "{c}: {mine:#?}\n{}", hub.log());
    }
    Ok(())
}

/// Two correlator instances, each owning one partition of the fleet (the server's subject mapping adds
/// `partition(2, cluster)`), handle every cluster exactly once between them, and `multipilot incidents`
/// gathers both halves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_partitions_share_the_fleet_one_owner_per_cluster() -> Result<()> {
    let mapping = include_str!("../../../deploy/nats/partitions.conf");
    let nats = NatsServer::start_with(|_| mapping.to_string()).await?;
    let mut hub = Correlator::on(nats).await?;
    for k in 0..2u32 {
        let mut cmd = common::role(
            "correlator",
            &hub.nats.url(),
            &hub.dir.path().join(format!("data-{k}")),
            &hub.dir.path().join(format!("p{k}.log")),
        )?;
        cmd.env("MULTIPILOT_CORRELATOR__PARTITIONS", "2")
            .env("MULTIPILOT_CORRELATOR__PARTITION", k.to_string())
            .env("MULTIPILOT_CORRELATOR__TICK_MS", "200");
        hub.others.push(Proc::spawn(&mut cmd)?);
    }
    // both instances answer before anything is sent
    for _ in 0..100 {
        let got = multipilot_bus::request::gather_arrays::<serde_json::Value>(
            &hub.client,
            multipilot_schemas::control::QUERY_INCIDENTS,
            "{}".into(),
            Duration::from_millis(500),
        )
        .await;
        if got.is_ok() {
            break;
        }
    }
    let t = t0();
    let clusters: Vec<String> = (0..10).map(|i| format!("part-{i}")).collect();
    for round in 1..=6u64 {
        for c in &clusters {
            hub.probe(
                c,
                "etcd",
                ProbeStatus::Unhealthy,
                round,
                t + secs(round as i64 * 10),
            )
            .await?;
        }
    }
    let all = hub
        .wait_for("an incident per cluster", |i| {
            i.iter().filter(|x| x.kind == "etcd-unhealthy").count() >= clusters.len()
        })
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let all = if hub.incidents().await?.len() > all.len() {
        hub.incidents().await?
    } else {
        all
    };
    let owners: BTreeSet<&str> = all.iter().map(|i| i.cluster.as_str()).collect();
    assert_eq!(owners.len(), clusters.len());
    assert_eq!(
        all.iter().filter(|x| x.kind == "etcd-unhealthy").count(),
        clusters.len(),
        "one incident per cluster, not one per instance: {all:#?}"
    );
    // the stored subjects carry the partition, and both partitions have clusters
    let s = hub.js.get_stream("FLEET_HEALTH").await?;
    let mut parts = BTreeSet::new();
    for c in &clusters {
        for k in 0..2 {
            if s.get_last_raw_message_by_subject(&format!("{}.{k}", subject::probe(c, "etcd")))
                .await
                .is_ok()
            {
                parts.insert(k);
            }
        }
    }
    assert_eq!(parts.len(), 2, "both partitions own clusters");
    // the CLI gathers both instances' answers
    let listed = multipilot_bus::request::gather_arrays::<serde_json::Value>(
        &hub.client,
        multipilot_schemas::control::QUERY_INCIDENTS,
        "{}".into(),
        Duration::from_secs(3),
    )
    .await?;
    assert_eq!(listed.len(), clusters.len(), "{listed:#?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_acknowledges_and_resolves_an_incident_and_the_audit_stream_records_it()
-> Result<()> {
    use multipilot_bus::request::incident_command as command;
    use multipilot_schemas::control::{CommandOutcome, IncidentAction, IncidentCommand};
    let mut hub = Correlator::start().await?;
    let t = t0();
    let c = "prod-1";
    for round in 1..=5 {
        hub.probe(
            c,
            "etcd",
            ProbeStatus::Unhealthy,
            round,
            t + secs(round as i64 * 15),
        )
        .await?;
    }
    let all = hub
        .wait_for("etcd-unhealthy", |i| {
            i.iter().any(|x| x.kind == "etcd-unhealthy")
        })
        .await?;
    let id = all
        .iter()
        .find(|x| x.kind == "etcd-unhealthy")
        .context("incident")?
        .id
        .clone();
    let cmd = |action| IncidentCommand {
        id: id.clone(),
        action,
        actor: "otto".into(),
    };
    let wait = Duration::from_secs(5);
    let r = command(&hub.client, &cmd(IncidentAction::Ack), wait).await?;
    assert_eq!(r.outcome, CommandOutcome::Done, "{r:?}");
    let acked = r.incident.context("incident in the reply")?;
    assert_eq!(
        (
            acked.status,
            acked.revision,
            acked.acknowledged_by.as_deref()
        ),
        (IncidentStatus::Acknowledged, 2, Some("otto"))
    );
    // the revision is on the stream before the reply, and so is the audit record
    let stream = hub.incidents().await?;
    assert!(
        stream
            .iter()
            .any(|x| x.id == id && x.revision == 2 && x.status == IncidentStatus::Acknowledged),
        "{stream:#?}"
    );
    let audit = hub
        .js
        .get_stream("FLEET_AUDIT")
        .await?
        .get_last_raw_message_by_subject("fleet.audit.console.incident-ack")
        .await?;
    let rec: Envelope<AuditRecord> = rmp_serde::from_slice(&audit.payload)?;
    assert_eq!(rec.payload.actor, "otto");
    assert_eq!(rec.payload.action, "incident.acknowledge");
    assert_eq!(rec.payload.target, id);
    assert_eq!(rec.payload.detail["revision"], 2);
    // once is enough: a second acknowledgement changes nothing
    let again = command(&hub.client, &cmd(IncidentAction::Ack), wait).await?;
    assert_eq!(again.outcome, CommandOutcome::Unchanged);
    // later failing rounds keep it acknowledged (no reopening, no new incident)
    hub.probe(c, "etcd", ProbeStatus::Unhealthy, 6, t + secs(6 * 15))
        .await?;
    hub.drained("FLEET_HEALTH", "correlator-health").await?;
    let r = command(&hub.client, &cmd(IncidentAction::Resolve), wait).await?;
    assert_eq!(r.outcome, CommandOutcome::Done);
    let resolved = r.incident.context("incident")?;
    assert_eq!(resolved.status, IncidentStatus::Resolved);
    assert!(resolved.resolved_at.is_some());
    assert!(
        hub.js
            .get_stream("FLEET_AUDIT")
            .await?
            .get_last_raw_message_by_subject("fleet.audit.console.incident-resolve")
            .await
            .is_ok()
    );
    assert_eq!(
        command(&hub.client, &cmd(IncidentAction::Ack), wait)
            .await?
            .outcome,
        CommandOutcome::Conflict
    );
    let missing = IncidentCommand {
        id: "no-such-incident".into(),
        action: IncidentAction::Resolve,
        actor: "otto".into(),
    };
    assert_eq!(
        command(&hub.client, &missing, wait).await?.outcome,
        CommandOutcome::NotFound
    );
    // the condition still failing after the hand resolution opens a new incident
    for round in 7..=11 {
        hub.probe(
            c,
            "etcd",
            ProbeStatus::Unhealthy,
            round,
            Utc::now() + secs(round as i64),
        )
        .await?;
    }
    hub.wait_for("a new etcd incident", |i| {
        i.iter()
            .any(|x| x.kind == "etcd-unhealthy" && x.id != id && x.status == IncidentStatus::Open)
    })
    .await?;
    Ok(())
}
