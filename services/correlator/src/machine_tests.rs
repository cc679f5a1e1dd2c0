//! The state machine on its own: envelopes in, state changes and messages out, no server and no disk.
//! Payloads start from the contract's own samples (`multipilot_schemas::catalog`) and change what a case
//! needs.

use chrono::{DateTime, Duration, TimeZone, Utc};
use multipilot_schemas::control::{CommandOutcome, IncidentAction, IncidentCommand};
use multipilot_schemas::payload::{
    AuditRecord, ClusterFacts, ComplianceReport, EventDigest, EvidenceKind, Heartbeat, Incident,
    IncidentStatus, KubeEvent, ObjectRef, ProbeResult, ProbeStatus, ResourceState, Severity,
};
use multipilot_schemas::streams::StateMsg;
use multipilot_schemas::{Envelope, Payload, catalog};

use super::*;
use crate::baseline::Baseline;
use crate::rules::Rules;

fn sample<T: Payload>() -> T {
    let entry = catalog::entries()
        .into_iter()
        .find(|e| e.name == T::SCHEMA)
        .expect("the catalog has a sample of every payload");
    rmp_serde::from_slice::<Envelope<T>>(&entry.sample)
        .expect("the sample decodes")
        .payload
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0)
        .single()
        .expect("valid time")
}

fn env<T: Payload>(cluster: &str, at: DateTime<Utc>, seq: u64, payload: T) -> Envelope<T> {
    Envelope::new(cluster, format!("agent/{cluster}"), at, seq, payload)
}

fn machine() -> Machine {
    Machine::new(Rules::defaults(), Baseline::defaults(), "correlator-test")
}

fn probe(name: &str, status: ProbeStatus, round: u64) -> ProbeResult {
    ProbeResult {
        probe: name.into(),
        status,
        round,
        detail: format!("{name} is {status:?}"),
        findings: Vec::new(),
        ..sample()
    }
}

fn heartbeat() -> Heartbeat {
    Heartbeat {
        interval_s: 5,
        ..sample()
    }
}

fn decode<T: Payload>(out: &Out) -> T {
    rmp_serde::from_slice::<Envelope<T>>(&out.body)
        .expect("an output decodes as its schema")
        .payload
}

fn incidents(outs: &[Out]) -> Vec<Incident> {
    outs.iter()
        .filter(|o| o.subject.starts_with("fleet.incident."))
        .map(decode::<Incident>)
        .collect()
}

/// Feeds `n` rounds of one probe status, 15 s apart from `from`; returns every output.
fn rounds(
    m: &mut Machine,
    cluster: &str,
    name: &str,
    status: ProbeStatus,
    first_round: u64,
    n: u64,
    from: DateTime<Utc>,
) -> Vec<Out> {
    let mut outs = Vec::new();
    for i in 0..n {
        let at = from + Duration::seconds(15 * i as i64);
        let e = env(
            cluster,
            at,
            first_round + i,
            probe(name, status, first_round + i),
        );
        outs.extend(m.apply(Input::Probe(&e, at)));
    }
    outs
}

#[test]
fn a_failing_probe_opens_after_its_rounds_and_resolves_after_healthy_ones() {
    let mut m = machine();
    // etcd: 5 unhealthy rounds open it, 3 healthy ones resolve it (rules.yaml)
    let outs = rounds(&mut m, "c1", "etcd", ProbeStatus::Unhealthy, 1, 4, t0());
    assert!(incidents(&outs).is_empty(), "4 rounds are not enough");
    let outs = rounds(
        &mut m,
        "c1",
        "etcd",
        ProbeStatus::Unhealthy,
        5,
        1,
        t0() + Duration::seconds(60),
    );
    let opened = incidents(&outs);
    assert_eq!(opened.len(), 1, "{opened:#?}");
    let inc = &opened[0];
    assert_eq!(
        (inc.kind.as_str(), inc.status, inc.severity, inc.revision),
        (
            "etcd-unhealthy",
            IncidentStatus::Open,
            Severity::Critical,
            1
        )
    );
    assert_eq!(outs[0].subject, "fleet.incident.c1.etcd-unhealthy");
    assert!(inc.summary.contains("etcd of c1"), "{}", inc.summary);
    // more failing rounds within a minute change nothing a person reads: no new revision
    let outs = rounds(
        &mut m,
        "c1",
        "etcd",
        ProbeStatus::Unhealthy,
        6,
        2,
        t0() + Duration::seconds(75),
    );
    assert!(incidents(&outs).is_empty());
    // two healthy rounds are not enough (hysteresis), the third resolves it
    let healthy_from = t0() + Duration::seconds(120);
    let outs = rounds(
        &mut m,
        "c1",
        "etcd",
        ProbeStatus::Healthy,
        8,
        2,
        healthy_from,
    );
    assert!(incidents(&outs).is_empty());
    let outs = rounds(
        &mut m,
        "c1",
        "etcd",
        ProbeStatus::Healthy,
        10,
        1,
        healthy_from + Duration::seconds(30),
    );
    let resolved = incidents(&outs);
    assert_eq!(resolved.len(), 1);
    assert_eq!(
        (resolved[0].status, resolved[0].revision),
        (IncidentStatus::Resolved, 2)
    );
    assert_eq!(resolved[0].id, inc.id, "the same incident resolves");
    assert!(m.current(false).is_empty());
    assert_eq!(m.current(true).len(), 1);
}

#[test]
fn a_late_or_redelivered_message_changes_nothing() {
    let mut m = machine();
    let e = env("c1", t0(), 1, probe("etcd", ProbeStatus::Unhealthy, 1));
    m.apply_delivered("correlator-health", 10, Input::Probe(&e, t0()));
    let before = m.take_changes();
    assert!(!before.is_empty());
    // the same stream sequence again (a redelivery after a crash): skipped, nothing changes
    let outs = m.apply_delivered("correlator-health", 10, Input::Probe(&e, t0()));
    assert!(outs.is_empty());
    assert!(m.take_changes().is_empty());
    assert_eq!(m.stats().replays_skipped, 1);
    // a newer sequence carrying an older probe round (cluster time) is late: ignored
    let old = env(
        "c1",
        t0() - Duration::seconds(30),
        0,
        probe("etcd", ProbeStatus::Healthy, 0),
    );
    m.apply_delivered("correlator-health", 11, Input::Probe(&old, t0()));
    assert_eq!(m.stats().late_ignored, 1);
}

#[test]
fn a_silent_cluster_becomes_unreachable_and_heartbeats_bring_it_back() {
    let mut m = machine();
    let hb = env("c1", t0(), 1, heartbeat());
    m.apply(Input::Heartbeat(&hb, t0()));
    // 3 missed 5 s intervals (rules.yaml): 15 s is not yet silent, 16 s is
    assert!(incidents(&m.apply(Input::Tick(t0() + Duration::seconds(15)))).is_empty());
    let opened = incidents(&m.apply(Input::Tick(t0() + Duration::seconds(16))));
    assert_eq!(opened.len(), 1);
    assert_eq!(opened[0].kind, "cluster-unreachable");
    assert!(
        opened[0].summary.contains("no agent heartbeat for 16s"),
        "{}",
        opened[0].summary
    );
    // ticking on while it stays silent does not announce it again
    assert!(incidents(&m.apply(Input::Tick(t0() + Duration::seconds(30)))).is_empty());
    // two heartbeats in a row resolve it
    let back = t0() + Duration::seconds(40);
    let hb2 = env("c1", back, 2, heartbeat());
    assert!(incidents(&m.apply(Input::Heartbeat(&hb2, back))).is_empty());
    let hb3 = env("c1", back + Duration::seconds(5), 3, heartbeat());
    let resolved = incidents(&m.apply(Input::Heartbeat(&hb3, back + Duration::seconds(5))));
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0].status, IncidentStatus::Resolved);
}

#[test]
fn a_skewed_clock_is_told_from_delivery_delay() {
    let mut m = machine();
    let mut outs = Vec::new();
    // the cluster's clock runs 2 min ahead: its heartbeats' cluster_time is ahead of JetStream's ingest time
    for i in 0..3 {
        let ingest = t0() + Duration::seconds(5 * i);
        let hb = env(
            "c1",
            ingest + Duration::seconds(120),
            i as u64 + 1,
            heartbeat(),
        );
        outs.extend(m.apply(Input::Heartbeat(&hb, ingest)));
    }
    let opened = incidents(&outs);
    assert_eq!(opened.len(), 1, "{opened:#?}");
    assert_eq!(opened[0].kind, "clock-skew");
    assert!(opened[0].summary.contains("+120s"), "{}", opened[0].summary);
}

fn event(name: &str, reason: &str, message: &str, at: DateTime<Utc>) -> KubeEvent {
    KubeEvent {
        occurrence_id: format!("{name}-{}", at.timestamp()),
        // one Event object per object and reason, as the kubelet records them
        uid: format!("event-{name}-{reason}"),
        involved: ObjectRef {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: Some("shop".into()),
            name: name.into(),
            uid: None,
        },
        reason: reason.into(),
        message: message.into(),
        event_type: "Warning".into(),
        severity: Severity::Warning,
        first_time: None,
        last_time: at,
        ..sample()
    }
}

#[test]
fn repeated_events_become_one_digest_announced_once_then_updated_but_not_while_replaying() {
    let mut m = machine();
    let mut digests = Vec::new();
    // twelve repeats within 12 s, then one 6 min later
    for i in (0..12).chain([360]) {
        let at = t0() + Duration::seconds(i);
        let pod = format!("web-7d4b9c8f5-{}", ["x2x9k", "q8w7r"][i as usize % 2]);
        let e = env(
            "c1",
            at,
            i as u64,
            event(
                &pod,
                "BackOff",
                &format!("Back-off restarting failed container web in pod {pod}"),
                at,
            ),
        );
        for o in m.apply(Input::Event(&e)) {
            assert!(o.subject.starts_with("fleet.digest.c1."), "{}", o.subject);
            digests.push(decode::<EventDigest>(&o));
        }
    }
    let passes: Vec<_> = digests.iter().map(|d| (d.pass.as_str(), d.count)).collect();
    assert_eq!(passes, vec![("new", 1), ("update", 13)]);
    assert_eq!(digests[0].id, digests[1].id, "one problem, one record");
    // a rebuild replaying history applies events without announcing them again
    m.set_replaying(true);
    let at = t0() + Duration::seconds(30);
    let e = env(
        "c1",
        at,
        99,
        event("api-0", "FailedMount", "MountVolume.SetUp failed", at),
    );
    assert!(m.apply(Input::Event(&e)).is_empty());
    assert_eq!(m.stats().events_in, 14);
}

fn deployment(name: &str, spec_hash: &str) -> ResourceState {
    ResourceState {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        namespace: Some("kube-system".into()),
        name: name.into(),
        uid: format!("uid-{name}"),
        spec_hash: spec_hash.into(),
        ..sample()
    }
}

#[test]
fn the_change_a_finding_names_ranks_first_in_its_evidence() {
    let mut m = machine();
    let at = t0();
    for (i, (name, hash)) in [("coredns", "aaaa1111"), ("metrics-server", "bbbb1111")]
        .into_iter()
        .enumerate()
    {
        let s = env("c1", at, i as u64, StateMsg::State(deployment(name, hash)));
        m.apply(Input::State(&s));
    }
    // both change; the coredns one first (older), the unrelated one later (more recent)
    let s = env(
        "c1",
        at + Duration::seconds(10),
        3,
        StateMsg::State(deployment("coredns", "aaaa2222")),
    );
    m.apply(Input::State(&s));
    let s = env(
        "c1",
        at + Duration::seconds(20),
        4,
        StateMsg::State(deployment("metrics-server", "bbbb2222")),
    );
    m.apply(Input::State(&s));
    // the coredns probe fails and its finding names the Deployment
    let mut outs = Vec::new();
    for r in 0..5u64 {
        let when = at + Duration::seconds(30 + 15 * r as i64);
        let mut p = probe("coredns", ProbeStatus::Unhealthy, r + 1);
        p.findings = vec![multipilot_schemas::payload::Finding {
            severity: Severity::Critical,
            object: Some(ObjectRef {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: Some("kube-system".into()),
                name: "coredns".into(),
                uid: None,
            }),
            message: "0/2 coredns replicas ready".into(),
        }];
        outs.extend(m.apply(Input::Probe(&env("c1", when, r, p), when)));
    }
    let inc = incidents(&outs).pop().expect("dns-failure opened");
    assert_eq!(inc.kind, "dns-failure");
    let first = inc.evidence.first().expect("evidence");
    assert_eq!((first.rank, first.kind), (1, EvidenceKind::Change));
    assert!(
        first
            .summary
            .contains("Deployment kube-system/coredns changed"),
        "{:#?}",
        inc.evidence
    );
    assert!(
        inc.summary.contains("2 deployments changed there"),
        "{}",
        inc.summary
    );
}

fn facts(minor: u32) -> ClusterFacts {
    let mut f: ClusterFacts = sample();
    f.version.minor = minor;
    f.version.git_version = format!("v1.{minor}.3");
    f
}

#[test]
fn the_baseline_is_judged_on_facts_and_held_while_a_replay_runs() {
    let mut m = machine();
    m.hold_judgement();
    let f = env("c1", t0(), 1, facts(24));
    assert!(
        m.apply(Input::Facts(&f)).is_empty(),
        "held: no verdict on half an inventory"
    );
    let outs = m.release_judgement(t0() + Duration::seconds(5));
    let reports: Vec<ComplianceReport> = outs
        .iter()
        .filter(|o| o.subject == "fleet.compliance.c1")
        .map(decode::<ComplianceReport>)
        .collect();
    assert_eq!(reports.len(), 1);
    let drift = incidents(&outs);
    let version = drift
        .iter()
        .find(|i| i.summary.contains("v1.24.3"))
        .expect("the version is outside the baseline");
    assert_eq!(version.kind, "baseline-drift");
    // the same facts again: same verdict, nothing published
    let f = env("c1", t0() + Duration::seconds(10), 2, facts(24));
    assert!(m.apply(Input::Facts(&f)).is_empty());
    // upgraded into the allowed range: that check passes and its incident resolves
    let f = env("c1", t0() + Duration::seconds(20), 3, facts(31));
    let outs = m.apply(Input::Facts(&f));
    let resolved = incidents(&outs);
    assert!(
        resolved
            .iter()
            .any(|i| i.id == version.id && i.status == IncidentStatus::Resolved),
        "{resolved:#?}"
    );
}

#[test]
fn people_acknowledge_and_resolve_incidents_with_an_audit_record() {
    let mut m = machine();
    let outs = rounds(&mut m, "c1", "etcd", ProbeStatus::Unhealthy, 1, 5, t0());
    let id = incidents(&outs)[0].id.clone();
    let cmd = |action| IncidentCommand {
        id: id.clone(),
        action,
        actor: "otto".into(),
    };
    let now = t0() + Duration::minutes(5);
    let (outcome, inc, outs) = m.command(&cmd(IncidentAction::Ack), now);
    assert_eq!(outcome, CommandOutcome::Done);
    let inc = inc.expect("the incident");
    assert_eq!(
        (inc.status, inc.acknowledged_by.as_deref(), inc.revision),
        (IncidentStatus::Acknowledged, Some("otto"), 2)
    );
    let audit: Vec<AuditRecord> = outs
        .iter()
        .filter(|o| o.subject == "fleet.audit.console.incident-ack")
        .map(decode::<AuditRecord>)
        .collect();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (audit[0].actor.as_str(), audit[0].action.as_str()),
        ("otto", "incident.acknowledge")
    );
    let (outcome, _, outs) = m.command(&cmd(IncidentAction::Ack), now);
    assert_eq!((outcome, outs.len()), (CommandOutcome::Unchanged, 0));
    let (outcome, inc, _) = m.command(&cmd(IncidentAction::Resolve), now);
    assert_eq!(outcome, CommandOutcome::Done);
    assert_eq!(inc.map(|i| i.status), Some(IncidentStatus::Resolved));
    let (outcome, _, _) = m.command(&cmd(IncidentAction::Ack), now);
    assert_eq!(outcome, CommandOutcome::Conflict);
    let unknown = IncidentCommand {
        id: "nope".into(),
        action: IncidentAction::Ack,
        actor: "otto".into(),
    };
    assert_eq!(m.command(&unknown, now).0, CommandOutcome::NotFound);
}

#[test]
fn changes_name_only_what_changed_and_a_snapshot_restores_the_machine() {
    let mut m = machine();
    rounds(&mut m, "c1", "etcd", ProbeStatus::Unhealthy, 1, 5, t0());
    let s = env(
        "c1",
        t0(),
        9,
        StateMsg::State(deployment("coredns", "aaaa1111")),
    );
    m.apply_delivered("correlator-state", 3, Input::State(&s));
    let changes = m.take_changes();
    assert_eq!(changes.clusters.len(), 1);
    assert_eq!(
        changes.specs,
        vec![(
            "c1/Deployment/kube-system/coredns".to_string(),
            Some("aaaa1111".to_string())
        )]
    );
    assert_eq!(changes.incidents.len(), 1);
    assert!(changes.hwm.is_some());
    // another cluster's heartbeat touches that cluster only
    let hb = env("c2", t0(), 1, heartbeat());
    m.apply(Input::Heartbeat(&hb, t0()));
    let changes = m.take_changes();
    let touched: Vec<&str> = changes.clusters.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(touched, vec!["c2"]);
    assert!(changes.specs.is_empty() && changes.incidents.is_empty() && changes.hwm.is_none());

    // what the store would hold, read back: the same incidents, and the high-water mark still skips
    let snapshot = Snapshot {
        clusters: m.clusters.clone(),
        specs: m.specs.clone(),
        incidents: m.incidents.clone(),
        dedup: Vec::new(),
        hwm: m.hwm.clone(),
    };
    let mut again = Machine::restore_snapshot(
        Rules::defaults(),
        Baseline::defaults(),
        "correlator-test",
        snapshot,
    );
    assert_eq!(again.current(true), m.current(true));
    assert!(
        again
            .apply_delivered("correlator-state", 3, Input::State(&s))
            .is_empty()
    );
    assert_eq!(again.stats().replays_skipped, 1);
}

#[test]
fn lifecycle_events_are_never_evidence_and_warnings_on_the_named_object_rank_high() {
    let mut m = machine();
    let at = t0();
    // normal pod lifecycle and an unrelated warning elsewhere, then a warning on the DNS pods
    for (i, (name, reason, msg)) in [
        (
            "coredns-5d78c9869d-7xk2p",
            "Scheduled",
            "Successfully assigned kube-system/coredns-5d78c9869d-7xk2p",
        ),
        (
            "coredns-5d78c9869d-7xk2p",
            "Pulled",
            "Container image already present on machine",
        ),
        (
            "web-7d4b9c8f5-x2x9k",
            "BackOff",
            "Back-off restarting failed container web",
        ),
        (
            "coredns-5d78c9869d-7xk2p",
            "Unhealthy",
            "Readiness probe failed: HTTP probe failed with statuscode: 503",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let mut e = event(name, reason, msg, at + Duration::seconds(i as i64));
        e.involved.namespace = Some(
            if name.starts_with("coredns") {
                "kube-system"
            } else {
                "shop"
            }
            .into(),
        );
        if reason == "Scheduled" || reason == "Pulled" {
            e.severity = Severity::Info;
            e.event_type = "Normal".into();
        }
        m.apply(Input::Event(&env("c1", e.last_time, i as u64, e)));
    }
    let mut outs = Vec::new();
    for r in 0..5u64 {
        let when = at + Duration::seconds(10 + 15 * r as i64);
        let mut p = probe("coredns", ProbeStatus::Unhealthy, r + 1);
        p.findings = vec![multipilot_schemas::payload::Finding {
            severity: Severity::Critical,
            object: Some(ObjectRef {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: Some("kube-system".into()),
                name: "coredns-5d78c9869d-7xk2p".into(),
                uid: None,
            }),
            message: "0/2 coredns replicas ready".into(),
        }];
        outs.extend(m.apply(Input::Probe(&env("c1", when, r, p), when)));
    }
    let inc = incidents(&outs).pop().expect("dns-failure opened");
    let reasons: Vec<&str> = inc.evidence.iter().map(|e| e.summary.as_str()).collect();
    assert!(
        reasons
            .iter()
            .all(|r| !r.starts_with("Scheduled") && !r.starts_with("Pulled")),
        "{reasons:#?}"
    );
    let first_event = inc
        .evidence
        .iter()
        .find(|e| e.kind == EvidenceKind::Event)
        .expect("an event");
    assert!(
        first_event.summary.starts_with("Unhealthy"),
        "{:#?}",
        inc.evidence
    );
    assert!(
        first_event.why.contains("the finding names this object"),
        "{}",
        first_event.why
    );
}

#[test]
fn a_baseline_drift_shows_what_the_check_found_and_the_offending_objects_not_events() {
    let mut m = machine();
    // warnings on the cluster that have nothing to do with Pod Security labels
    let e = event(
        "web-7d4b9c8f5-x2x9k",
        "BackOff",
        "Back-off restarting failed container",
        t0(),
    );
    m.apply(Input::Event(&env("c1", t0(), 1, e)));
    let f = env("c1", t0(), 2, facts(31));
    m.apply(Input::Facts(&f));
    // two namespaces without a Pod Security level
    let mut outs = Vec::new();
    for (i, ns) in ["shop", "search"].iter().enumerate() {
        let s = ResourceState {
            api_version: "v1".into(),
            kind: "Namespace".into(),
            namespace: None,
            name: (*ns).into(),
            uid: format!("ns-{ns}"),
            labels: Default::default(),
            ..sample()
        };
        let s = env(
            "c1",
            t0() + Duration::seconds(5 + i as i64),
            3 + i as u64,
            StateMsg::State(s),
        );
        outs.extend(m.apply(Input::State(&s)));
    }
    let drift = incidents(&outs)
        .into_iter()
        .find(|i| i.summary.contains("pss-labels"))
        .expect("a pss-labels drift");
    assert!(
        drift.evidence.iter().all(|e| e.kind == EvidenceKind::Fact),
        "{:#?}",
        drift.evidence
    );
    assert!(
        drift.evidence[0]
            .summary
            .contains("without a Pod Security Standards level"),
        "{:#?}",
        drift.evidence
    );
    let named: Vec<&str> = drift
        .evidence
        .iter()
        .filter_map(|e| e.object.as_ref())
        .map(|o| o.name.as_str())
        .collect();
    assert!(
        named.contains(&"shop") || named.contains(&"search"),
        "{:#?}",
        drift.evidence
    );
    assert!(
        drift
            .evidence
            .iter()
            .skip(1)
            .all(|e| e.why == "violates pss-labels"),
        "{:#?}",
        drift.evidence
    );
}
