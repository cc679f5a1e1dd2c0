//! The state machine on its own: envelopes in, state changes and messages out, no server and no disk (but
//! for the last case, which commits its changes to the store and reads them back).
//! Payloads start from the contract's own samples (`multipilot_schemas::catalog`) and change what a case
//! needs.

use chrono::{DateTime, Duration, TimeZone, Utc};
use multipilot_schemas::control::{CommandOutcome, IncidentAction, IncidentCommand};
use multipilot_schemas::payload::{
    AuditRecord, ClusterFacts, ComplianceReport, EventDigest, EvidenceKind, FleetIncident,
    Heartbeat, Incident, IncidentStatus, KubeEvent, ObjectRef, ProbeResult, ProbeStatus,
    ReleaseRef, ResourceDeleted, ResourceState, Severity, SuspectVerdict,
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

/// A machine started again from what its store held, with the default rules.
fn restored(snapshot: Snapshot) -> Machine {
    Machine::restore_snapshot(
        Rules::defaults(),
        Baseline::defaults(),
        "correlator-test",
        snapshot,
    )
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

/// Feeds one round of `name` per letter of `pattern` (`H` healthy, `D` degraded, `U` unhealthy, `?`
/// unknown), 5 s apart from `from` (the API server probe's pace); returns each round's incident changes.
fn pattern(
    m: &mut Machine,
    cluster: &str,
    name: &str,
    pattern: &str,
    first_round: u64,
    from: DateTime<Utc>,
) -> Vec<Vec<Incident>> {
    pattern_every(m, cluster, name, pattern, first_round, from, 5)
}

/// [`pattern`], its rounds `every_s` apart (a failing probe is confirmed every 3 s).
fn pattern_every(
    m: &mut Machine,
    cluster: &str,
    name: &str,
    pattern: &str,
    first_round: u64,
    from: DateTime<Utc>,
    every_s: i64,
) -> Vec<Vec<Incident>> {
    pattern
        .chars()
        .zip(first_round..)
        .enumerate()
        .map(|(i, (c, round))| {
            let status = match c {
                'H' => ProbeStatus::Healthy,
                'D' => ProbeStatus::Degraded,
                'U' => ProbeStatus::Unhealthy,
                _ => ProbeStatus::Unknown,
            };
            let at = from + Duration::seconds(every_s * i as i64);
            let e = env(cluster, at, round, probe(name, status, round));
            incidents(&m.apply(Input::Probe(&e, at)))
        })
        .collect()
}

#[test]
fn an_api_server_failing_a_share_of_its_requests_opens_an_overload_that_stays_open() {
    let mut m = machine();
    // a third of its requests fail: most rounds are degraded, some pass. In a row (3) it would open
    // late or never; apiserver-overload counts 3 failing rounds among the last 10, held 10 s
    let changes = pattern(&mut m, "c1", "apiserver", "DHDHD", 1, t0());
    let opened: Vec<usize> = (0..changes.len())
        .filter(|&i| !changes[i].is_empty())
        .collect();
    assert_eq!(opened, vec![4], "{changes:#?}");
    let inc = &changes[4][0];
    assert_eq!(
        (inc.kind.as_str(), inc.status),
        ("apiserver-overload", IncidentStatus::Open)
    );
    // the first failing round of the window is when it began
    assert!(inc.summary.contains("(since 12:00:00)"), "{}", inc.summary);
    // three healthy rounds in a row now and then do not resolve it while the window still fails
    let from = t0() + Duration::seconds(25);
    let flapping = "HHHDD".repeat(8);
    let changes = pattern(&mut m, "c1", "apiserver", &flapping, 6, from);
    assert!(
        changes
            .iter()
            .flatten()
            .all(|i| i.status != IncidentStatus::Resolved),
        "{changes:#?}"
    );
    assert!(m.is_open("c1", "apiserver-overload", "apiserver"));
    // healed: resolved once fewer than 3 of the last 10 rounds fail, not at the third healthy round;
    // an unknown round (the probe could not tell) is not counted either way
    let from = from + Duration::seconds(5 * 40);
    let changes = pattern(&mut m, "c1", "apiserver", "HHH?HHHHHHH", 46, from);
    let resolved: Vec<usize> = (0..changes.len())
        .filter(|&i| {
            changes[i]
                .iter()
                .any(|x| x.status == IncidentStatus::Resolved)
        })
        .collect();
    // the window ended H H H D D H H H D D: at the fifth healthy round (index 5, after the unknown
    // one) the last 10 counted rounds are H H H D D H H H H H, two failing
    assert_eq!(resolved, vec![5], "{changes:#?}");
}

#[test]
fn a_windowed_rule_holds_from_the_oldest_failing_round_still_in_its_window() {
    // a burst after a clean window, confirmed every 3 s: its `for` (10 s) counts from the burst's
    // first round — the third round (6 s in) is not enough, the fifth (12 s) is
    let mut m = machine();
    let clean = "D".to_string() + &"H".repeat(10);
    let changes = pattern(&mut m, "c1", "apiserver", &clean, 1, t0());
    assert!(changes.iter().all(Vec::is_empty), "{changes:#?}");
    let burst_at = t0() + Duration::seconds(5 * 11);
    let changes = pattern_every(&mut m, "c1", "apiserver", "DDDDD", 12, burst_at, 3);
    let opened: Vec<usize> = (0..changes.len())
        .filter(|&i| !changes[i].is_empty())
        .collect();
    assert_eq!(opened, vec![4], "{changes:#?}");
    let since = burst_at.format("%H:%M:%S").to_string();
    assert!(
        changes[4][0].summary.contains(&format!("(since {since})")),
        "{}",
        changes[4][0].summary
    );

    // a degraded round every 8 (at most 2 of any 10: nothing opens), then a burst: the episode began
    // with the oldest failing round still in the window (at 2:00), not with the first of them all
    let mut m = machine();
    let sparse = ("D".to_string() + &"H".repeat(7)).repeat(4);
    let changes = pattern(&mut m, "c1", "apiserver", &sparse, 1, t0());
    assert!(changes.iter().all(Vec::is_empty), "{changes:#?}");
    let burst_at = t0() + Duration::seconds(5 * 32);
    let changes = pattern_every(&mut m, "c1", "apiserver", "DD", 33, burst_at, 3);
    assert!(changes[0].is_empty(), "{changes:#?}");
    let opened = &changes[1];
    assert_eq!(opened.len(), 1, "{changes:#?}");
    assert!(
        opened[0].summary.contains("(since 12:02:00)"),
        "{}",
        opened[0].summary
    );
}

#[test]
fn a_windowed_incident_resolved_by_hand_needs_a_new_streak_to_open_again() {
    let mut m = machine();
    let changes = pattern(&mut m, "c1", "apiserver", "DDDD", 1, t0());
    let opened = changes.concat().pop().expect("opened");
    let cmd = IncidentCommand {
        id: opened.id.clone(),
        action: IncidentAction::Resolve,
        actor: "otto".into(),
    };
    m.command(&cmd, t0() + Duration::seconds(16));
    // the window still holds the four failures from before: one more failing round is not a new
    // streak of three, the third one after the resolve is
    let from = t0() + Duration::seconds(20);
    let changes = pattern(&mut m, "c1", "apiserver", "HHHHDHD", 5, from);
    assert!(changes.iter().all(Vec::is_empty), "{changes:#?}");
    let changes = pattern(
        &mut m,
        "c1",
        "apiserver",
        "D",
        12,
        from + Duration::seconds(35),
    );
    let again = changes.concat().pop().expect("a new incident");
    assert_eq!(again.status, IncidentStatus::Open);
    let since = (from + Duration::seconds(20))
        .format("%H:%M:%S")
        .to_string();
    assert!(
        again.summary.contains(&format!("(since {since})")),
        "{}",
        again.summary
    );
}

#[test]
fn a_rule_in_a_row_still_needs_its_rounds_in_a_row() {
    let mut m = machine();
    // unhealthy every other round: apiserver-down counts in a row and never opens; the windowed
    // overload rule (degraded or unhealthy) does
    let changes = pattern(&mut m, "c1", "apiserver", "UHUHUHUHUH", 1, t0());
    let kinds: Vec<&str> = changes.iter().flatten().map(|i| i.kind.as_str()).collect();
    assert_eq!(kinds, vec!["apiserver-overload"]);
}

#[test]
fn a_failing_probe_opens_after_its_rounds_and_resolves_after_healthy_ones() {
    let mut m = machine();
    // etcd: 3 unhealthy rounds open it, 3 healthy ones resolve it (rules.yaml)
    let outs = rounds(&mut m, "c1", "etcd", ProbeStatus::Unhealthy, 1, 2, t0());
    assert!(incidents(&outs).is_empty(), "2 rounds are not enough");
    let outs = rounds(
        &mut m,
        "c1",
        "etcd",
        ProbeStatus::Unhealthy,
        3,
        1,
        t0() + Duration::seconds(30),
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
        4,
        2,
        t0() + Duration::seconds(45),
    );
    assert!(incidents(&outs).is_empty());
    // two healthy rounds are not enough (hysteresis), the third resolves it
    let healthy_from = t0() + Duration::seconds(120);
    let outs = rounds(
        &mut m,
        "c1",
        "etcd",
        ProbeStatus::Healthy,
        6,
        2,
        healthy_from,
    );
    assert!(incidents(&outs).is_empty());
    let outs = rounds(
        &mut m,
        "c1",
        "etcd",
        ProbeStatus::Healthy,
        8,
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
fn a_detail_of_several_lines_makes_a_summary_of_one() {
    let mut m = machine();
    let mut outs = Vec::new();
    for round in 1..=3 {
        let at = t0() + Duration::seconds(15 * round as i64);
        let mut p = probe("etcd", ProbeStatus::Unhealthy, round);
        // what an API server answers on /readyz/etcd, as an older agent passed it on
        p.detail =
            "/readyz/etcd: HTTP 500: [-]etcd failed: reason withheld\nreadyz check failed".into();
        outs.extend(m.apply(Input::Probe(&env("c1", at, round, p), at)));
    }
    let opened = incidents(&outs);
    assert_eq!(opened.len(), 1);
    assert!(
        opened[0]
            .summary
            .contains("[-]etcd failed: reason withheld; readyz check failed (since")
            && !opened[0].summary.contains('\n'),
        "{}",
        opened[0].summary
    );
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
    m.apply(Input::Tick(t0()));
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

    // silent again: a new incident, and the first one stays listed (resolved) beside it
    let again = incidents(&m.apply(Input::Tick(back + Duration::seconds(30))));
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].id, opened[0].id, "a recurrence is a new incident");
    let listed = |m: &Machine| {
        let mut v: Vec<(String, String)> = m
            .current(true)
            .into_iter()
            .map(|i| (i.id, format!("{:?}", i.status)))
            .collect();
        v.sort();
        v
    };
    let mut want = vec![
        (opened[0].id.clone(), "Resolved".to_string()),
        (again[0].id.clone(), "Open".to_string()),
    ];
    want.sort();
    assert_eq!(listed(&m), want);
    assert_eq!(m.current(false).len(), 1);
    // both are persisted (the old one under its history key)
    assert_eq!(m.take_changes().incidents.len(), 2);

    // a wiped store restored from FLEET_INCIDENTS (latest revision of each id, any order) lists both,
    // and the open one is the one a heartbeat resolves
    let mut r = machine();
    r.restore(vec![again[0].clone(), resolved[0].clone()], Vec::new());
    assert_eq!(listed(&r), want);
    let hb4 = env("c1", back + Duration::seconds(40), 4, heartbeat());
    r.apply(Input::Heartbeat(&hb4, back + Duration::seconds(40)));
    let hb5 = env("c1", back + Duration::seconds(45), 5, heartbeat());
    let closed = incidents(&r.apply(Input::Heartbeat(&hb5, back + Duration::seconds(45))));
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].id, again[0].id);
    assert_eq!(r.current(false).len(), 0);
    assert_eq!(r.current(true).len(), 2);
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
fn the_finding_ranks_first_then_the_change_to_the_object_it_names() {
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
        let coredns = ("Deployment", "kube-system", "coredns");
        let found = "0/2 coredns replicas ready";
        outs.extend(finding_round(
            &mut m,
            "c1",
            ("coredns", r + 1),
            coredns,
            found,
            when,
        ));
    }
    let inc = incidents(&outs).pop().expect("dns-failure opened");
    assert_eq!(inc.kind, "dns-failure");
    // what happened to the failing object first, then its change (the unrelated one below both)
    let first = inc.evidence.first().expect("evidence");
    assert_eq!((first.rank, first.kind), (1, EvidenceKind::Fact));
    assert_eq!(first.summary, "0/2 coredns replicas ready");
    let second = &inc.evidence[1];
    assert_eq!(second.kind, EvidenceKind::Change);
    assert!(
        second
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

#[test]
fn a_change_to_another_object_the_finding_names_ranks_first_as_the_cause() {
    let mut m = machine();
    let at = t0();
    let ds = |hash: &str| ResourceState {
        kind: "DaemonSet".into(),
        namespace: Some("gpu-operator".into()),
        name: "nvidia-device-plugin-daemonset".into(),
        uid: "uid-dp".into(),
        spec_hash: hash.into(),
        ..deployment("x", hash)
    };
    m.apply(Input::State(&env("c1", at, 1, StateMsg::State(ds("old")))));
    // the plugin is upgraded; a second later the GPU probe finds the node's driver too old
    m.apply(Input::State(&env(
        "c1",
        at + Duration::seconds(60),
        2,
        StateMsg::State(ds("new")),
    )));
    let node = ObjectRef {
        api_version: "v1".into(),
        kind: "Node".into(),
        namespace: None,
        name: "gpu-1".into(),
        uid: None,
    };
    let mut outs = Vec::new();
    for r in 0..3u64 {
        let when = at + Duration::seconds(61 + 3 * r as i64);
        let mut p = probe("gpu-device-plugin", ProbeStatus::Unhealthy, r + 1);
        p.findings = vec![
            multipilot_schemas::payload::Finding {
                severity: Severity::Critical,
                object: Some(node.clone()),
                message: "device plugin v0.17.0 needs driver >= 550, node gpu-1 runs 535.183"
                    .into(),
            },
            multipilot_schemas::payload::Finding {
                severity: Severity::Critical,
                object: Some(ObjectRef {
                    api_version: "apps/v1".into(),
                    kind: "DaemonSet".into(),
                    namespace: Some("gpu-operator".into()),
                    name: "nvidia-device-plugin-daemonset".into(),
                    uid: None,
                }),
                message: "device plugin v0.17.0 needs driver >= 550 on 1 GPU nodes".into(),
            },
        ];
        outs.extend(m.apply(Input::Probe(&env("c1", when, r, p), when)));
    }
    let inc = incidents(&outs).pop().expect("gpu-driver-mismatch opened");
    assert_eq!(inc.kind, "gpu-driver-mismatch");
    let first = &inc.evidence[0];
    assert_eq!(first.kind, EvidenceKind::Change, "{:#?}", inc.evidence);
    assert!(
        first
            .summary
            .starts_with("DaemonSet gpu-operator/nvidia-device-plugin-daemonset changed"),
        "{:#?}",
        inc.evidence
    );
    assert!(
        first.why.contains("the finding names this object"),
        "{}",
        first.why
    );
    assert_eq!(inc.evidence[1].kind, EvidenceKind::Fact);
    assert_eq!(inc.evidence[1].object.as_ref(), Some(&node));
}

fn facts(minor: u32) -> ClusterFacts {
    let mut f: ClusterFacts = sample();
    f.version.minor = minor;
    f.version.git_version = format!("v1.{minor}.3");
    f
}

fn compliance_reports(outs: &[Out], cluster: &str) -> Vec<ComplianceReport> {
    outs.iter()
        .filter(|o| o.subject == format!("fleet.compliance.{cluster}"))
        .map(decode::<ComplianceReport>)
        .collect()
}

#[test]
fn standing_non_compliance_is_reported_and_only_drift_or_a_critical_rule_is_an_incident() {
    let mut m = machine();
    m.hold_judgement();
    let f = env("c1", t0(), 1, facts(24));
    assert!(
        m.apply(Input::Facts(&f)).is_empty(),
        "held: no verdict on half an inventory"
    );
    // first sight: v1.24 is outside the baseline — a standing fact, in the report and not an incident
    let outs = m.release_judgement(t0() + Duration::seconds(5));
    let reports = compliance_reports(&outs, "c1");
    assert_eq!(reports.len(), 1);
    assert!(
        reports[0]
            .checks
            .iter()
            .any(|c| c.rule == "kubernetes-version" && c.status == CheckStatus::Fail),
        "{reports:#?}"
    );
    assert!(incidents(&outs).is_empty(), "{:#?}", incidents(&outs));
    // the same facts again: same verdict, nothing published
    let f = env("c1", t0() + Duration::seconds(10), 2, facts(24));
    assert!(m.apply(Input::Facts(&f)).is_empty());
    // upgraded into the allowed range: it passes (no incident to resolve)
    let f = env("c1", t0() + Duration::seconds(20), 3, facts(31));
    let outs = m.apply(Input::Facts(&f));
    assert_eq!(compliance_reports(&outs, "c1").len(), 1);
    assert!(incidents(&outs).is_empty());
    // and then back outside it: that is drift
    let f = env("c1", t0() + Duration::seconds(30), 4, facts(24));
    let drift = incidents(&m.apply(Input::Facts(&f)));
    assert_eq!(drift.len(), 1, "{drift:#?}");
    assert_eq!(
        (drift[0].kind.as_str(), drift[0].severity),
        ("baseline-drift", Severity::Warning)
    );
    assert!(
        drift[0].summary.contains("drifted") && drift[0].summary.contains("v1.24.3"),
        "{}",
        drift[0].summary
    );
    // compliant again: it resolves
    let f = env("c1", t0() + Duration::seconds(40), 5, facts(31));
    let resolved = incidents(&m.apply(Input::Facts(&f)));
    assert!(
        resolved
            .iter()
            .any(|i| i.id == drift[0].id && i.status == IncidentStatus::Resolved),
        "{resolved:#?}"
    );

    // a rule the baseline marks critical is an incident from the first verdict on
    let mut baseline = Baseline::defaults();
    baseline.critical = vec!["kubernetes-version".into()];
    let mut m = Machine::new(Rules::defaults(), baseline, "correlator-test");
    let f = env("c2", t0(), 1, facts(24));
    let opened = incidents(&m.apply(Input::Facts(&f)));
    assert_eq!(opened.len(), 1, "{opened:#?}");
    assert_eq!(opened[0].severity, Severity::Critical);
    assert!(
        opened[0].summary.contains("critical"),
        "{}",
        opened[0].summary
    );
}

#[test]
fn a_rule_with_for_waits_that_long_even_when_rounds_come_fast() {
    let mut m = machine();
    // cni-degraded: 3 rounds and for 20 s (rules.yaml); the agent re-runs a failing probe every 3 s
    let mut opened_at = None;
    for i in 0..10u64 {
        let at = t0() + Duration::seconds(3 * i as i64);
        let e = env("c1", at, i + 1, probe("cni", ProbeStatus::Unhealthy, i + 1));
        if !incidents(&m.apply(Input::Probe(&e, at))).is_empty() {
            opened_at = Some(at - t0());
            break;
        }
    }
    assert_eq!(
        opened_at,
        Some(Duration::seconds(21)),
        "the first round at least 20 s after the first failure"
    );
}

#[test]
fn a_correlator_started_again_gives_silent_clusters_their_grace_before_calling_them_unreachable() {
    // the last heartbeats were stored two hours ago, before the hub (and perhaps the agents) went down
    let before = t0() - Duration::hours(2);
    let mut m = machine();
    m.apply(Input::Tick(before));
    for (c, seq) in [("c1", 1), ("c2", 1)] {
        m.apply(Input::Heartbeat(&env(c, before, seq, heartbeat()), before));
    }
    let mut again = restored(snapshot_of(&m, BTreeMap::new()));
    // started again: no cluster is called unreachable for a silence it spent unwatched
    assert!(incidents(&again.apply(Input::Tick(t0()))).is_empty());
    // c1's agent is back within the grace; c2's is not
    let hb = env("c1", t0() + Duration::seconds(5), 2, heartbeat());
    again.apply(Input::Heartbeat(&hb, t0() + Duration::seconds(5)));
    assert!(incidents(&again.apply(Input::Tick(t0() + Duration::seconds(15)))).is_empty());
    let opened = incidents(&again.apply(Input::Tick(t0() + Duration::seconds(16))));
    assert_eq!(opened.len(), 1, "{opened:?}");
    assert_eq!(opened[0].cluster, "c2");
    // the summary says how long the cluster has really been silent
    assert!(
        opened[0].summary.contains("no agent heartbeat for 2h"),
        "{}",
        opened[0].summary
    );
}

#[test]
fn a_hub_clock_stepped_back_neither_ends_the_grace_nor_hides_a_silence() {
    let mut m = machine();
    let before = t0() - Duration::hours(2);
    m.apply(Input::Heartbeat(&env("c1", before, 1, heartbeat()), before));
    // the first tick, then the clock stepped back an hour: watching goes on from there
    assert!(incidents(&m.apply(Input::Tick(t0()))).is_empty());
    let back = t0() - Duration::hours(1);
    assert!(incidents(&m.apply(Input::Tick(back))).is_empty());
    assert!(incidents(&m.apply(Input::Tick(back + Duration::seconds(15)))).is_empty());
    let opened = incidents(&m.apply(Input::Tick(back + Duration::seconds(16))));
    assert_eq!(opened.len(), 1, "{opened:?}");
    assert_eq!(opened[0].kind, "cluster-unreachable");
}

#[test]
fn an_unreachable_cluster_holds_back_what_it_explains_until_it_is_back() {
    let mut m = machine();
    m.apply(Input::Tick(t0()));
    let hb = env("c1", t0(), 1, heartbeat());
    m.apply(Input::Heartbeat(&hb, t0()));
    let down = incidents(&m.apply(Input::Tick(t0() + Duration::seconds(20))));
    assert_eq!(down[0].kind, "cluster-unreachable");
    // results delayed in the agent's outbox arrive: a failing probe would open an incident, but is held back
    let outs = rounds(&mut m, "c1", "etcd", ProbeStatus::Unhealthy, 1, 3, t0());
    assert!(incidents(&outs).is_empty(), "{:#?}", incidents(&outs));
    assert_eq!(m.stats().held_back, 1);
    // back: once the root resolves, a condition still failing opens by itself
    let back = t0() + Duration::seconds(60);
    m.apply(Input::Heartbeat(&env("c1", back, 2, heartbeat()), back));
    let resolved = incidents(&m.apply(Input::Heartbeat(
        &env("c1", back + Duration::seconds(5), 3, heartbeat()),
        back + Duration::seconds(5),
    )));
    assert_eq!(resolved[0].status, IncidentStatus::Resolved);
    let outs = rounds(
        &mut m,
        "c1",
        "etcd",
        ProbeStatus::Unhealthy,
        4,
        1,
        back + Duration::seconds(10),
    );
    let opened = incidents(&outs);
    assert_eq!(opened.len(), 1, "{opened:#?}");
    assert_eq!(opened[0].kind, "etcd-unhealthy");
}

#[test]
fn a_dead_api_server_holds_back_the_overload_it_also_looks_like() {
    let mut m = machine();
    let outs = rounds(
        &mut m,
        "c1",
        "apiserver",
        ProbeStatus::Unhealthy,
        1,
        3,
        t0(),
    );
    let kinds: Vec<String> = incidents(&outs).into_iter().map(|i| i.kind).collect();
    assert_eq!(kinds, vec!["apiserver-down".to_string()]);
}

#[test]
fn two_faults_on_one_cluster_are_two_incidents_each_with_its_own_evidence() {
    let mut m = machine();
    let finding = |kind: &str, ns: Option<&str>, name: &str, msg: &str| {
        multipilot_schemas::payload::Finding {
            severity: Severity::Critical,
            object: Some(ObjectRef {
                api_version: "v1".into(),
                kind: kind.into(),
                namespace: ns.map(Into::into),
                name: name.into(),
                uid: None,
            }),
            message: msg.into(),
        }
    };
    let mut outs = Vec::new();
    // dns-failure waits 10 s (`for`), node-not-ready only its 3 rounds
    for r in 0..5u64 {
        let at = t0() + Duration::seconds(3 * r as i64);
        let mut nodes = probe("nodes", ProbeStatus::Unhealthy, r + 1);
        nodes.findings = vec![finding(
            "Node",
            None,
            "worker-2",
            "node worker-2 is not Ready",
        )];
        outs.extend(m.apply(Input::Probe(&env("c1", at, 2 * r, nodes), at)));
        let mut dns = probe("coredns", ProbeStatus::Unhealthy, r + 1);
        dns.findings = vec![finding(
            "Deployment",
            Some("kube-system"),
            "coredns",
            "cluster DNS is down: no ready CoreDNS endpoints",
        )];
        let at = at + Duration::seconds(20);
        outs.extend(m.apply(Input::Probe(&env("c1", at, 2 * r + 1, dns), at)));
    }
    let opened = incidents(&outs);
    let kinds: std::collections::BTreeSet<&str> = opened.iter().map(|i| i.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["dns-failure", "node-not-ready"].into_iter().collect(),
        "{opened:#?}"
    );
    for (kind, own, other) in [
        ("node-not-ready", "worker-2", "coredns"),
        ("dns-failure", "coredns", "worker-2"),
    ] {
        let inc = opened.iter().find(|i| i.kind == kind).expect("opened");
        let first = inc.evidence.first().expect("evidence");
        assert_eq!(
            first.object.as_ref().map(|o| o.name.as_str()),
            Some(own),
            "{kind}: {:#?}",
            inc.evidence
        );
        assert!(
            inc.evidence
                .iter()
                .all(|e| e.object.as_ref().is_none_or(|o| o.name != other)),
            "{kind} carries the other fault's object: {:#?}",
            inc.evidence
        );
    }
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
fn each_clusters_count_of_changeable_objects_follows_its_objects_and_a_restore() {
    let mut m = machine();
    let at = t0();
    let mut seq = 0;
    let mut state = |m: &mut Machine, cluster: &str, kind: &str, name: &str, hash: &str| {
        seq += 1;
        let s = ResourceState {
            kind: kind.into(),
            ..deployment(name, hash)
        };
        m.apply(Input::State(&env(cluster, at, seq, StateMsg::State(s))));
    };
    state(&mut m, "c1", "Deployment", "a", "01");
    state(&mut m, "c1", "Deployment", "a", "02"); // a change, not another object
    state(&mut m, "c1", "ConfigMap", "b", "01");
    state(&mut m, "c1", "Pod", "p", "01"); // not a change kind
    state(&mut m, "c2", "Deployment", "a", "01");
    let gone = |kind: &str, name: &str| {
        let d = ResourceDeleted {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            namespace: Some("kube-system".into()),
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: String::new(),
            ..sample()
        };
        env("c1", at, 99, StateMsg::Deleted(d))
    };
    m.apply(Input::State(&gone("Pod", "p")));
    m.apply(Input::State(&gone("ConfigMap", "b")));
    m.apply(Input::State(&gone("ConfigMap", "b"))); // twice: counted once
    m.apply(Input::State(&gone("Secret", "never-seen")));
    let expected = BTreeMap::from([("c1".to_string(), 1), ("c2".to_string(), 1)]);
    assert_eq!(m.changeable, expected);
    // counted again from the objects, as a restart does
    let again = restored(Snapshot {
        specs: m.specs.clone(),
        ..Snapshot::default()
    });
    assert_eq!(again.changeable, expected);
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
    let mut again = restored(snapshot_of(&m, m.fleet.incidents.clone()));
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
        outs.extend(coredns_fails(&mut m, "c1", r + 1, when));
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

/// A failing round of `name` on `cluster` at `when` whose finding names `(kind, namespace, name)`.
fn finding_round(
    m: &mut Machine,
    cluster: &str,
    (name, round): (&str, u64),
    (kind, ns, object): (&str, &str, &str),
    message: &str,
    when: DateTime<Utc>,
) -> Vec<Out> {
    let mut p = probe(name, ProbeStatus::Unhealthy, round);
    p.findings = vec![multipilot_schemas::payload::Finding {
        severity: Severity::Critical,
        object: Some(ObjectRef {
            api_version: if kind == "Pod" { "v1" } else { "apps/v1" }.into(),
            kind: kind.into(),
            namespace: Some(ns.into()),
            name: object.into(),
            uid: None,
        }),
        message: message.into(),
    }];
    m.apply(Input::Probe(&env(cluster, when, round, p), when))
}

/// A `coredns` round that finds its pod not ready, at `when`.
fn coredns_fails(m: &mut Machine, cluster: &str, round: u64, when: DateTime<Utc>) -> Vec<Out> {
    let pod = ("Pod", "kube-system", "coredns-5d78c9869d-7xk2p");
    let message = "0/2 coredns replicas ready";
    finding_round(m, cluster, ("coredns", round), pod, message, when)
}

/// A warning on a pod, with the digest it makes when it is new.
fn warn_on(
    m: &mut Machine,
    cluster: &str,
    (ns, pod, reason): (&str, &str, &str),
    seq: u64,
    at: DateTime<Utc>,
) -> Option<EventDigest> {
    let mut e = event(pod, reason, &format!("{reason} on {pod}"), at);
    e.involved.namespace = Some(ns.into());
    e.uid = format!("event-{ns}-{pod}-{reason}");
    m.apply(Input::Event(&env(cluster, at, seq, e)))
        .iter()
        .filter(|o| o.subject.starts_with("fleet.digest."))
        .map(decode::<EventDigest>)
        .next()
}

#[test]
fn a_failing_probe_accounts_for_the_warnings_on_what_it_found_however_noisy_the_cluster() {
    let mut m = machine();
    let at = t0();
    let dns = warn_on(
        &mut m,
        "c1",
        ("kube-system", "coredns-5d78c9869d-7xk2p", "Unhealthy"),
        1,
        at,
    )
    .expect("a new problem");
    // a busy cluster: more recent warnings elsewhere, one beside the DNS pods in their namespace
    let mut others = Vec::new();
    for (i, (ns, pod)) in [
        ("kube-system", "kube-proxy-x8k2p"),
        // an app's own cache, named like the probe
        ("shop", "coredns-cache-7b8c9d6f5-m3n4b"),
        ("shop", "web-7d4b9c8f5-x2x9k"),
        ("shop", "cart-6c9f7d8b4-q7w2e"),
        ("billing", "ledger-5f6d7c8b9-z9x8c"),
        ("search", "index-7b8c9d6f5-m3n4b"),
    ]
    .into_iter()
    .enumerate()
    {
        let at = at + Duration::seconds(2 + i as i64);
        others.push(warn_on(&mut m, "c1", (ns, pod, "BackOff"), 2 + i as u64, at).expect("new"));
    }
    let mut outs = Vec::new();
    for r in 0..5u64 {
        outs.extend(coredns_fails(
            &mut m,
            "c1",
            r + 1,
            at + Duration::seconds(10 + 15 * r as i64),
        ));
    }
    let inc = incidents(&outs).pop().expect("dns-failure opened");
    assert_eq!(inc.kind, "dns-failure");
    // the warning on the DNS pods is its evidence, not crowded out by the cluster's five later ones
    assert!(
        inc.evidence
            .iter()
            .any(|e| e.kind == EvidenceKind::Event && e.summary.starts_with("Unhealthy")),
        "{:#?}",
        inc.evidence
    );
    // and it accounts for that one alone: not for kube-proxy beside it, the app's cache, nor the others
    assert_eq!(inc.explains, vec![dns.id.clone()], "{:#?}", others);
    // another warning on the DNS pods while it is open: accounted for at the next round, at once
    let later = at + Duration::seconds(90);
    let backoff = warn_on(
        &mut m,
        "c1",
        ("kube-system", "coredns-5d78c9869d-7xk2p", "BackOff"),
        20,
        later,
    )
    .expect("a new problem");
    let outs = coredns_fails(&mut m, "c1", 6, later + Duration::seconds(1));
    let again = incidents(&outs).pop().expect("a new revision");
    assert_eq!(again.id, inc.id);
    assert_eq!(again.revision, inc.revision + 1);
    let mut both = vec![dns.id.clone(), backoff.id.clone()];
    both.sort();
    assert_eq!(again.explains, both);
    // nothing new: no new revision
    let outs = coredns_fails(&mut m, "c1", 7, later + Duration::seconds(16));
    assert!(incidents(&outs).is_empty(), "{:#?}", incidents(&outs));
}

#[test]
fn a_failing_daemonset_accounts_for_its_pods_warnings_not_its_neighbours() {
    let mut m = machine();
    let at = t0();
    let node = warn_on(
        &mut m,
        "c1",
        ("kube-system", "calico-node-x7k2p", "Unhealthy"),
        1,
        at,
    )
    .expect("new");
    let other = warn_on(
        &mut m,
        "c1",
        (
            "kube-system",
            "calico-kube-controllers-5d78c9869d-7xk2p",
            "BackOff",
        ),
        2,
        at,
    )
    .expect("new");
    let mut outs = Vec::new();
    for r in 0..5u64 {
        let when = at + Duration::seconds(10 + 15 * r as i64);
        let ds = ("DaemonSet", "kube-system", "calico-node");
        let found = "calico-node is not ready on 3 of 8 nodes";
        outs.extend(finding_round(&mut m, "c1", ("cni", r + 1), ds, found, when));
    }
    let inc = incidents(&outs).pop().expect("an incident opened");
    assert_eq!(inc.explains, vec![node.id.clone()], "not {}", other.id);
    let why: Vec<&str> = inc.evidence.iter().map(|e| e.why.as_str()).collect();
    assert!(
        why.contains(&"a pod of a workload the finding names: a warning on it"),
        "{why:#?}"
    );
}

#[test]
fn the_coredns_pods_failing_where_dns_fails_are_part_of_those_incidents_not_a_problem_of_their_own()
{
    let mut m = quiet_fleet(&["c1", "c2", "c3"]);
    let at = t0() + Duration::minutes(1);
    let mut outs = Vec::new();
    for (i, c) in ["c1", "c2"].iter().enumerate() {
        let pod = ("kube-system", "coredns-5d78c9869d-7xk2p", "Unhealthy");
        let e = env(c, at, 10, {
            let mut e = event(
                pod.1,
                pod.2,
                "Readiness probe failed: HTTP probe failed with statuscode: 503",
                at,
            );
            e.involved.namespace = Some(pod.0.into());
            e
        });
        outs.extend(m.apply(Input::Event(&e)));
        for r in 0..5u64 {
            let when = at + Duration::seconds(2 + i as i64 + 15 * r as i64);
            outs.extend(coredns_fails(&mut m, c, 20 + r, when));
        }
    }
    let fleet = fleet_incidents(&outs);
    let problem = fleet
        .iter()
        .rev()
        .find(|f| f.kind == "event")
        .expect("the pods' warning on two clusters is an event fleet incident")
        .clone();
    let mut held: BTreeMap<String, Incident> = BTreeMap::new();
    for i in incidents(&outs) {
        held.insert(i.id.clone(), i);
    }
    let open: Vec<Incident> = held.values().cloned().collect();
    let by: Vec<(&str, &str)> = problem
        .accounted_for(&open)
        .iter()
        .map(|i| (i.kind.as_str(), i.cluster.as_str()))
        .collect();
    assert_eq!(by, [("dns-failure", "c1"), ("dns-failure", "c2")]);
    // c2's DNS comes back while its pods' warning stays a member: that one is a problem of its own now
    let mut c2 = held
        .values()
        .find(|i| i.cluster == "c2")
        .expect("c2's incident")
        .clone();
    c2.status = IncidentStatus::Resolved;
    let open: Vec<Incident> = held
        .values()
        .filter(|i| i.cluster != "c2")
        .cloned()
        .chain([c2])
        .collect();
    assert!(problem.accounted_for(&open).is_empty());
    // another kind is never part of one
    let dns = fleet.iter().find(|f| f.kind == "dns-failure").expect("one");
    assert!(dns.accounted_for(&open).is_empty());
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

/// The `i`th FailedMount warning of a burst on c1, on the PVC `object`.
fn failed_mount(i: i64, object: &str, at: DateTime<Utc>) -> Envelope<KubeEvent> {
    env(
        "c1",
        at,
        i as u64,
        KubeEvent {
            uid: format!("burst-{i}"),
            ..event(object, "FailedMount", "MountVolume.SetUp failed", at)
        },
    )
}

#[test]
fn an_event_storm_opens_on_the_rate_and_ends_when_it_falls_or_stops_whatever_the_order() {
    let mut m = machine();
    let warn = |i: i64, at: DateTime<Utc>| failed_mount(i, &format!("data-{}", i % 7), at);
    // 400 warnings within 20 s of cluster time, delivered out of order (a burst from several sources)
    let mut outs = Vec::new();
    for i in 0..400i64 {
        let jitter = if i % 2 == 0 { 0 } else { -15_000 };
        let at = t0() + Duration::milliseconds(i * 50 + jitter);
        outs.extend(m.apply(Input::Event(&warn(i, at))));
    }
    let storm = incidents(&outs);
    assert_eq!(storm.len(), 1, "{storm:#?}");
    assert_eq!(storm[0].kind, "event-storm");
    assert!(
        storm[0].summary.contains("FailedMount"),
        "{}",
        storm[0].summary
    );
    // a trickle a minute later: the window holds only it, under 50 a minute: over
    let later = t0() + Duration::seconds(90);
    let outs = m.apply(Input::Event(&warn(1000, later)));
    let over = incidents(&outs);
    assert_eq!(
        over.iter().map(|i| i.status).collect::<Vec<_>>(),
        [IncidentStatus::Resolved],
        "out-of-order entries left in the window would keep it open"
    );

    // another storm, after which warnings stop altogether: the hub's clock ends it a minute later
    let mut m = machine();
    for i in 0..400i64 {
        m.apply(Input::Event(&warn(
            i,
            t0() + Duration::milliseconds(i * 50),
        )));
    }
    assert_eq!(m.current(false).len(), 1);
    let hub = t0() + Duration::seconds(30);
    assert!(incidents(&m.apply(Input::Tick(hub))).is_empty());
    assert!(incidents(&m.apply(Input::Tick(hub + Duration::seconds(30)))).is_empty());
    let ended = incidents(&m.apply(Input::Tick(hub + Duration::seconds(61))));
    assert_eq!(
        ended
            .iter()
            .map(|i| (i.kind.as_str(), i.status))
            .collect::<Vec<_>>(),
        [("event-storm", IncidentStatus::Resolved)]
    );
}

#[test]
fn the_storm_window_is_stored_apart_every_few_seconds_and_comes_back_from_the_store() {
    let mut m = machine();
    let warn = |i: i64, at: DateTime<Utc>| failed_mount(i, "data", at);
    // 40 warnings over 20 s (no storm), a commit after each: the window goes to the store every 5 s of
    // the cluster's time, and the cluster's state (which did not change) not at all after the first
    let mut windows = Vec::new();
    let mut cluster_writes = 0;
    for i in 0..40i64 {
        let at = t0() + Duration::milliseconds(i * 500);
        m.apply(Input::Event(&warn(i, at)));
        let c = m.take_changes();
        cluster_writes += c.clusters.len();
        windows.extend(c.windows.into_iter().filter_map(|(_, w)| w));
    }
    assert_eq!(
        cluster_writes, 1,
        "the cluster's state is written once, when it appears"
    );
    assert_eq!(
        windows.iter().map(|w| w.seen).collect::<Vec<_>>(),
        [1, 11, 21, 31],
        "written at 0 s, 5 s, 10 s and 15 s of cluster time"
    );
    // at a stop everything goes, the last window included; read back, the machine has the whole window
    let last = m.take_all_changes();
    let w = last.windows[0].1.clone().expect("a window");
    assert_eq!(w.seen, 40);
    assert_eq!(w.warnings.len(), 40);
    let snapshot = Snapshot {
        clusters: m.clusters.clone(),
        windows: BTreeMap::from([("c1".to_string(), w)]),
        ..Default::default()
    };
    let again = restored(snapshot);
    assert_eq!(again.clusters["c1"].warnings, m.clusters["c1"].warnings);
    assert_eq!(again.clusters["c1"].warnings_seen, 40);
}

#[test]
fn a_probe_without_findings_shows_what_it_saw_below_its_trend() {
    let mut m = machine();
    let mut outs = Vec::new();
    for r in 0..3u64 {
        let at = t0() + Duration::seconds(10 * r as i64);
        let mut p = probe("etcd", ProbeStatus::Unhealthy, r + 1);
        p.detail = "/readyz/etcd: HTTP 500: [-]etcd failed: reason withheld".into();
        p.observations = Default::default();
        outs.extend(m.apply(Input::Probe(&env("c1", at, r, p), at)));
    }
    let inc = incidents(&outs).pop().expect("etcd-unhealthy");
    assert_eq!(
        inc.evidence[0].kind,
        EvidenceKind::Fact,
        "{:#?}",
        inc.evidence
    );
    assert!(
        inc.evidence[0]
            .summary
            .starts_with("/readyz/etcd: HTTP 500")
    );
    assert!(
        inc.evidence[0].why.contains("etcd probe"),
        "{}",
        inc.evidence[0].why
    );
}

#[test]
fn a_rule_a_probe_covers_stays_in_the_report_and_raises_no_second_incident() {
    let mut m = machine();
    m.apply(Input::Facts(&env("c1", t0(), 1, facts(31))));
    // a Service with an external IP appears: the external-ips rule goes from pass to fail
    let svc = ResourceState {
        api_version: "v1".into(),
        kind: "Service".into(),
        namespace: Some("default".into()),
        name: "exposed-debug".into(),
        uid: "svc-1".into(),
        ..sample()
    };
    let mut svc = svc;
    svc.status
        .detail
        .insert("externalIPs".into(), "198.51.100.7".into());
    let outs = m.apply(Input::State(&env(
        "c1",
        t0() + Duration::seconds(5),
        2,
        StateMsg::State(svc),
    )));
    let reports = compliance_reports(&outs, "c1");
    assert!(
        reports.iter().any(|r| r
            .checks
            .iter()
            .any(|c| c.rule == "external-ips" && c.status == CheckStatus::Fail)),
        "{reports:#?}"
    );
    assert!(
        incidents(&outs).is_empty(),
        "the external-ips probe raises external-ip-exposure; no baseline-drift as well"
    );
}

// ---------------------------------------------------------------------------------------------------------
/// What the store would hold of `m` (its dedup records left out), with `fleet` as its fleet incidents.
fn snapshot_of(m: &Machine, fleet: BTreeMap<String, FleetIncident>) -> Snapshot {
    Snapshot {
        clusters: m.clusters.clone(),
        windows: BTreeMap::new(),
        specs: m.specs.clone(),
        workloads: m.workloads.clone(),
        incidents: m.incidents.clone(),
        dedup: Vec::new(),
        hwm: m.hwm.clone(),
        fleet,
    }
}

// Fleet incidents

fn fleet_incidents(outs: &[Out]) -> Vec<FleetIncident> {
    outs.iter()
        .filter(|o| o.subject.starts_with("fleet.fleet-incident."))
        .map(decode::<FleetIncident>)
        .collect()
}

/// Six clusters: c1, c2, c4 run calico v3.27.3, the others cilium; c1–c3 are prod, c4–c6 staging; every
/// node runs Ubuntu, on kernel 6.1.82 in c1–c4 and 5.15 in c5 and c6. Each sends facts and a heartbeat at
/// `at`, and has a `web` Deployment (it will change everywhere).
fn six_clusters(m: &mut Machine, at: DateTime<Utc>) {
    use multipilot_schemas::payload::{Component, NodeSoftware};
    for (i, c) in ["c1", "c2", "c3", "c4", "c5", "c6"].iter().enumerate() {
        let mut f = facts(30);
        f.node_software = vec![NodeSoftware {
            os_image: "Ubuntu 22.04.4 LTS".into(),
            kernel_version: if i < 4 { "6.1.82" } else { "5.15.0-1057-aws" }.into(),
            container_runtime: "containerd://1.7.13".into(),
            nodes: 3,
        }];
        f.cni = Some(if ["c1", "c2", "c4"].contains(c) {
            Component {
                name: "calico".into(),
                version: "v3.27.3".into(),
                ready: None,
            }
        } else {
            Component {
                name: "cilium".into(),
                version: "v1.16.1".into(),
                ready: None,
            }
        });
        f.labels = BTreeMap::from([
            (
                "env".to_string(),
                if i < 3 { "prod" } else { "staging" }.to_string(),
            ),
            // each its own, as a fleet's regions often are
            ("region".to_string(), format!("region-{i}")),
        ]);
        m.apply(Input::Facts(&env(c, at, 1, f)));
        m.apply(Input::Heartbeat(&env(c, at, 2, heartbeat()), at));
        let s = env(c, at, 3, StateMsg::State(deployment("web", "aaaa0001")));
        m.apply(Input::State(&s));
        let s = env(c, at, 4, StateMsg::State(deployment("coredns", "cccc0001")));
        m.apply(Input::State(&s));
        // and the objects that don't change, as every cluster has many
        quiet_objects(m, c, at, 40);
    }
}

fn quiet_objects(m: &mut Machine, cluster: &str, at: DateTime<Utc>, n: usize) {
    for i in 0..n {
        let s = env(
            cluster,
            at,
            5,
            StateMsg::State(deployment(&format!("app-{i}"), "0000000a")),
        );
        m.apply(Input::State(&s));
    }
}

/// A machine that knows these clusters, each holding 60 objects that don't change.
fn quiet_fleet(names: &[&str]) -> Machine {
    let mut m = machine();
    for c in names {
        m.apply(Input::Facts(&env(c, t0(), 1, facts(30))));
        m.apply(Input::Heartbeat(&env(c, t0(), 2, heartbeat()), t0()));
        quiet_objects(&mut m, c, t0(), 60);
    }
    m
}

/// DNS fails on c1 at `at` and on c2 five seconds later: the fleet incident of both.
fn dns_fails_on_c1_then_c2(m: &mut Machine, at: DateTime<Utc>) -> FleetIncident {
    dns_fails_on(m, ["c1", "c2"], at)
}

/// DNS fails on the first cluster at `at` and on the second five seconds later: the fleet incident.
fn dns_fails_on(m: &mut Machine, [first, second]: [&str; 2], at: DateTime<Utc>) -> FleetIncident {
    rounds(m, first, "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    let outs = rounds(
        m,
        second,
        "coredns",
        ProbeStatus::Unhealthy,
        1,
        3,
        at + Duration::seconds(5),
    );
    fleet_incidents(&outs).remove(0)
}

#[test]
fn an_object_that_changed_on_two_failing_clusters_amid_heavy_churn_is_not_named_a_suspect() {
    // four clusters of 60 objects, each changing 30 of them (a different half on each) in the lookback:
    // some object changes on both failing clusters and neither healthy one by chance
    let names = ["c1", "c2", "c3", "c4"];
    let mut m = quiet_fleet(&names);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut changed: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    for c in names {
        while changed.entry(c).or_default().len() < 30 {
            let i = (next() % 60) as usize;
            if changed.entry(c).or_default().insert(i) {
                change(
                    &mut m,
                    c,
                    &format!("app-{i}"),
                    "0000000b",
                    t0() + Duration::seconds(30 + i as i64),
                );
            }
        }
    }
    // the test is worth something only if chance made such a coincidence
    let coincident = changed["c1"]
        .iter()
        .filter(|i| {
            changed["c2"].contains(i) && !changed["c3"].contains(i) && !changed["c4"].contains(i)
        })
        .count();
    assert!(coincident > 0, "{changed:?}");
    let at = t0() + Duration::seconds(120);
    let f = &dns_fails_on_c1_then_c2(&mut m, at);
    assert!(
        !f.suspects
            .iter()
            .any(|s| s.verdict == SuspectVerdict::Suspect),
        "{coincident} objects changed on both failing clusters by chance: {:#?}",
        f.suspects
    );
    assert!(!f.summary.contains("first suspect"), "{}", f.summary);
    // the same change on a quiet fleet is a suspect: app-0 on the two failing clusters only
    let mut m = quiet_fleet(&names);
    for c in ["c1", "c2"] {
        change(&mut m, c, "app-0", "0000000b", t0() + Duration::seconds(30));
    }
    let f = &dns_fails_on_c1_then_c2(&mut m, at);
    assert_eq!(
        f.suspects[0].verdict,
        SuspectVerdict::Suspect,
        "{:#?}",
        f.suspects
    );
    assert_eq!(f.suspects[0].object.name, "app-0");
}

#[test]
fn an_object_the_failing_clusters_change_every_few_minutes_is_ordinary_churn_even_with_none_healthy()
 {
    // every cluster fails: no healthy one to show what churns. On each, `app-config` (as an application's
    // config or what a controller writes) changes every 2 minutes, `app-0` once 5 minutes before the
    // failure, `app-1` twice (20 and 5 minutes before: applied, then applied again), `app-2` three times in
    // the lookback
    let names = ["c1", "c2", "c3"];
    let mut m = quiet_fleet(&names);
    let at = t0() + Duration::minutes(40);
    for c in names {
        let mut t = t0() + Duration::minutes(5);
        let mut n = 0;
        while t < at {
            change(&mut m, c, "app-config", &format!("{n:08x}"), t);
            t += Duration::minutes(2);
            n += 1;
        }
        change(&mut m, c, "app-0", "0000000b", at - Duration::minutes(5));
        change(&mut m, c, "app-1", "0000000b", at - Duration::minutes(20));
        change(&mut m, c, "app-1", "0000000c", at - Duration::minutes(5));
        // a bad change applied again and again in the lookback is no habit
        for (i, ago) in [10, 7, 4].into_iter().enumerate() {
            change(
                &mut m,
                c,
                "app-2",
                &format!("{i:08x}"),
                at - Duration::minutes(ago),
            );
        }
    }
    rounds(&mut m, "c1", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    rounds(&mut m, "c2", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    let outs = rounds(&mut m, "c3", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    let f = fleet_incidents(&outs).pop().expect("a fleet incident");
    assert_eq!(f.clusters(), names);
    let verdict = |name: &str| {
        f.suspects
            .iter()
            .find(|s| s.object.name == name)
            .unwrap_or_else(|| panic!("{name} not weighed: {:#?}", f.suspects))
    };
    let hot = verdict("app-config");
    assert_eq!(hot.verdict, SuspectVerdict::Common, "{:#?}", f.suspects);
    // its pace as measured over the history held before the lookback: about its 2 minutes
    let every = hot
        .summary
        .strip_prefix(
            "Deployment kube-system/app-config changed on 3 of 3 failing clusters, none healthy to compare, \
             in the 15m before, as it does there every ",
        )
        .and_then(|s| s.strip_suffix("s on average: ordinary churn, not a suspect"))
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or_else(|| panic!("{}", hot.summary));
    assert!((100..=130).contains(&every), "{}", hot.summary);
    for once in ["app-0", "app-1", "app-2"] {
        assert_eq!(verdict(once).verdict, SuspectVerdict::Suspect, "{once}");
    }
    assert!(
        f.summary
            .contains("first suspect: Deployment kube-system/app-"),
        "{}",
        f.summary
    );
}

fn change(m: &mut Machine, cluster: &str, name: &str, hash: &str, at: DateTime<Utc>) {
    let s = env(cluster, at, 10, StateMsg::State(deployment(name, hash)));
    m.apply(Input::State(&s));
}

#[test]
fn a_clusters_changes_are_handed_over_one_by_one_and_a_heartbeat_hands_over_none() {
    let mut m = machine();
    let at = t0();
    let keys = |c: &Changes| -> Vec<(String, bool)> {
        c.changes
            .iter()
            .map(|(k, v)| (k.clone(), v.is_some()))
            .collect()
    };
    change(&mut m, "c1", "web", "01", at);
    change(&mut m, "c1", "web", "02", at);
    change(&mut m, "c1", "web", "03", at);
    let first = m.take_changes();
    assert_eq!(
        keys(&first),
        vec![
            ("c1/0000000000000000".to_string(), true),
            ("c1/0000000000000001".to_string(), true)
        ]
    );
    let record = &first.clusters[0].1.as_ref().unwrap();
    assert!(record.changes.is_empty(), "the record holds no change");
    assert_eq!(record.changes_next, 2);
    assert_eq!(first.changes[1].1.as_ref().unwrap().to, "03");

    // a heartbeat writes the cluster's heartbeat fields: not its record, not its changes
    let hb = env("c1", at, 1, heartbeat());
    m.apply(Input::Heartbeat(&hb, at));
    let beat = m.take_changes();
    assert!(beat.clusters.is_empty());
    assert_eq!(beat.beats.len(), 1);
    assert_eq!(beat.beats[0].1.as_ref().map(|b| b.last_seq), Some(1));
    assert!(beat.changes.is_empty() && beat.probes.is_empty());

    // a probe result writes that probe, nothing else of the cluster
    let p = env("c1", at, 2, probe("coredns", ProbeStatus::Healthy, 1));
    m.apply(Input::Probe(&p, at));
    let probe = m.take_changes();
    assert!(probe.clusters.is_empty() && probe.beats.is_empty());
    assert_eq!(
        probe
            .probes
            .iter()
            .map(|(k, v)| (k.as_str(), v.is_some()))
            .collect::<Vec<_>>(),
        vec![("c1/coredns", true)]
    );

    // past the cap, the oldest go as the newest come, one key each
    for i in 0..ClusterState::MAX_CHANGES {
        change(&mut m, "c1", "web", &format!("{:02x}", i + 4), at);
    }
    let more = m.take_changes();
    let dropped: Vec<&String> = more
        .changes
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        dropped,
        vec!["c1/0000000000000000", "c1/0000000000000001"],
        "two dropped"
    );
    let added = more.changes.iter().filter(|(_, v)| v.is_some()).count();
    assert_eq!(added, ClusterState::MAX_CHANGES);
    assert!(
        more.clusters.is_empty(),
        "spec changes are records of their own: the cluster's record is not written again"
    );
    assert_eq!(
        m.clusters["c1"].change_seqs(),
        2..2 + ClusterState::MAX_CHANGES as u64
    );

    // restored as the store reads it back, nothing is handed over again
    let mut again = restored(Snapshot {
        clusters: m.clusters.clone(),
        specs: m.specs.clone(),
        ..Snapshot::default()
    });
    again.apply(Input::Heartbeat(&hb, at));
    assert!(again.take_changes().changes.is_empty());
    change(&mut again, "c1", "web", "ff", at);
    assert_eq!(
        keys(&again.take_changes()),
        vec![
            ("c1/0000000000000002".to_string(), false),
            (format!("c1/{:016x}", 2 + ClusterState::MAX_CHANGES), true)
        ]
    );
}

#[test]
fn an_open_incident_keeps_the_changes_before_it_began_failing_and_is_not_updated_by_what_follows() {
    let mut m = quiet_fleet(&["c1"]);
    let at = t0() + Duration::minutes(10);
    // the coredns Deployment changed a minute before DNS failed
    change(&mut m, "c1", "coredns", "cccc0001", t0());
    change(
        &mut m,
        "c1",
        "coredns",
        "cccc0002",
        at - Duration::seconds(60),
    );
    let outs = rounds(&mut m, "c1", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    let opened = incidents(&outs).pop().expect("the incident opens");
    assert!(
        opened
            .summary
            .ends_with("; 1 deployment changed there in the 60s before"),
        "{}",
        opened.summary
    );
    // then 45 minutes of rollouts elsewhere on the cluster while it keeps failing, a round every 15 s (the
    // history held moves past the change before it), with one healthy round between failing ones
    let mut outs = Vec::new();
    for i in 0..180u64 {
        let t = at + Duration::seconds(45 + 15 * i as i64);
        change(
            &mut m,
            "c1",
            &format!("app-{}", i % 60),
            &format!("{i:08x}"),
            t - Duration::seconds(5),
        );
        let status = if i == 20 {
            ProbeStatus::Healthy
        } else {
            ProbeStatus::Unhealthy
        };
        outs.extend(rounds(&mut m, "c1", "coredns", status, 4 + i, 1, t));
    }
    // nothing a person reads changed: no new revision, and the changes after it began are no evidence
    let updates = incidents(&outs);
    assert!(
        updates.is_empty(),
        "{:#?}",
        updates.iter().map(|i| &i.summary).collect::<Vec<_>>()
    );
    let now = m.current(false);
    let inc = now
        .iter()
        .find(|i| i.kind == "dns-failure")
        .expect("still open");
    assert_eq!((inc.revision, &inc.summary), (1, &opened.summary));
    assert!(
        inc.evidence
            .iter()
            .any(|e| e.object.as_ref().is_some_and(|o| o.name == "coredns")
                && e.summary.contains("changed")),
        "{:#?}",
        inc.evidence
    );
    assert!(
        inc.evidence.iter().all(|e| e.cluster_time <= at),
        "{:#?}",
        inc.evidence
    );

    // a material update late on (what the probe finds changes): the summary's detail is new, what changed
    // before the streak began is as it was said, though the history held has moved past it
    let late = at + Duration::seconds(45 + 15 * 180);
    let mut worse = probe("coredns", ProbeStatus::Unhealthy, 184);
    worse.detail = "0/2 CoreDNS pods ready, 0 ready endpoints".into();
    let outs = m.apply(Input::Probe(&env("c1", late, 184, worse), late));
    let updated = incidents(&outs).pop().expect("the new detail updates it");
    assert_eq!(
        updated.summary,
        "Cluster DNS failing on c1: 0/2 CoreDNS pods ready, 0 ready endpoints; 1 deployment changed there in \
         the 60s before"
    );
    assert!(
        updated
            .evidence
            .iter()
            .any(|e| e.kind == EvidenceKind::Change
                && e.object.as_ref().is_some_and(|o| o.name == "coredns")),
        "{:#?}",
        updated.evidence
    );
    // resolved by hand while still failing, then failing on: a new incident, its streak begun anew (the
    // rollouts of the last minutes came before it)
    let cmd = IncidentCommand {
        id: updated.id.clone(),
        action: IncidentAction::Resolve,
        actor: "otto".into(),
    };
    m.command(&cmd, late + Duration::seconds(1));
    let outs = rounds(
        &mut m,
        "c1",
        "coredns",
        ProbeStatus::Unhealthy,
        185,
        3,
        late + Duration::seconds(15),
    );
    let again = incidents(&outs).pop().expect("a new incident");
    assert_ne!(again.id, updated.id);
    assert!(
        again.summary.contains("deployment")
            && !again
                .summary
                .contains("1 deployment changed there in the 60s before"),
        "{}",
        again.summary
    );
}

#[test]
fn the_same_failure_on_three_clusters_is_one_fleet_incident_with_what_they_share_and_its_suspect() {
    let mut m = machine();
    six_clusters(&mut m, t0());
    // ordinary churn everywhere; the coredns Deployment changes on the three calico clusters only
    for c in ["c1", "c2", "c3", "c4", "c5", "c6"] {
        change(&mut m, c, "web", "aaaa0002", t0() + Duration::seconds(60));
    }
    for c in ["c1", "c2", "c4"] {
        change(
            &mut m,
            c,
            "coredns",
            "cccc0002",
            t0() + Duration::seconds(90),
        );
    }
    let at = t0() + Duration::seconds(120);
    // DNS fails on c1: one cluster, no fleet incident
    let outs = rounds(&mut m, "c1", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    assert_eq!(incidents(&outs).len(), 1);
    assert!(fleet_incidents(&outs).is_empty());
    // its own summary points at the coredns change, and names the web change as the churn it is
    let summary = &incidents(&outs)[0].summary;
    assert!(
        summary.contains("; 1 deployment changed there in the")
            && summary.contains("(1 more changed as often on the other clusters: ordinary churn)"),
        "{summary}"
    );
    // c2 a few seconds later: one fleet incident of both
    let outs = rounds(
        &mut m,
        "c2",
        "coredns",
        ProbeStatus::Unhealthy,
        1,
        3,
        at + Duration::seconds(5),
    );
    let opened = fleet_incidents(&outs);
    assert_eq!(opened.len(), 1, "{opened:#?}");
    let f = &opened[0];
    assert_eq!(
        (f.kind.as_str(), f.status, f.revision),
        ("dns-failure", IncidentStatus::Open, 1)
    );
    assert_eq!(
        f.members
            .iter()
            .map(|m| m.cluster.as_str())
            .collect::<Vec<_>>(),
        vec!["c1", "c2"]
    );
    assert_eq!(
        outs.iter()
            .filter(|o| o.subject == "fleet.fleet-incident.dns-failure")
            .count(),
        1
    );
    // what two failing clusters share is what both have: not either one's own region
    assert!(
        f.shared.iter().all(|s| s.failing == 2) && !f.shared.is_empty(),
        "{:#?}",
        f.shared
    );
    // c4: it joins the same fleet incident
    let outs = rounds(
        &mut m,
        "c4",
        "coredns",
        ProbeStatus::Unhealthy,
        1,
        3,
        at + Duration::seconds(20),
    );
    let joined = fleet_incidents(&outs);
    assert_eq!(joined.len(), 1);
    let f = &joined[0];
    assert_eq!(
        (f.id.as_str(), f.revision, f.members.len(), f.fleet_size),
        (opened[0].id.as_str(), 2, 3, 6)
    );
    // what they share: calico v3.27.3 on 3 of 3 failing, 0 of 3 healthy; env is split, so not first
    let top = &f.shared[0];
    assert_eq!(
        (
            top.attribute.as_str(),
            top.value.as_str(),
            top.failing,
            top.failing_total,
            top.healthy,
            top.healthy_total
        ),
        ("cni", "calico v3.27.3", 3, 3, 0, 3),
        "{:#?}",
        f.shared
    );
    assert_eq!(
        top.support,
        "3 of 3 failing run cni calico v3.27.3; 0 of 3 healthy do"
    );
    assert!(
        !f.shared.iter().any(|s| s.value == "calico"),
        "calico alone says nothing more"
    );
    // the nodes' kernel separates them less well (one healthy cluster runs it too); their OS not at all
    let kernel = f
        .shared
        .iter()
        .find(|s| s.attribute == "kernel")
        .expect("the kernel among the shared attributes");
    assert_eq!(
        kernel.support,
        "3 of 3 failing run kernel 6.1.82; 1 of 3 healthy do"
    );
    assert!(
        !f.shared.iter().any(|s| s.attribute == "node-os"),
        "every cluster runs Ubuntu: {:#?}",
        f.shared
    );
    // the coredns change is the suspect; the web change, everywhere, is named as churn
    let suspect = f
        .suspects
        .iter()
        .find(|s| s.verdict == SuspectVerdict::Suspect)
        .expect("a suspect");
    assert_eq!(
        (
            suspect.object.name.as_str(),
            suspect.failing,
            suspect.healthy
        ),
        ("coredns", 3, 0)
    );
    assert_eq!(
        f.suspects[0].object.name, "coredns",
        "the suspect ranks first"
    );
    let common = f
        .suspects
        .iter()
        .find(|s| s.object.name == "web")
        .expect("web is listed");
    assert_eq!(
        (common.verdict, common.failing, common.healthy),
        (SuspectVerdict::Common, 3, 3)
    );
    assert!(
        f.summary.starts_with(
            "dns-failure on 3 of 6 clusters (c1, c2, c4): 3 of 3 failing run cni calico v3.27.3"
        ),
        "{}",
        f.summary
    );
    assert!(
        f.summary
            .contains("first suspect: Deployment kube-system/coredns"),
        "{}",
        f.summary
    );
    assert_eq!(f.labels.get("scope").map(String::as_str), Some("fleet"));
    assert_eq!(m.current_fleet(false).len(), 1);

    // members resolve one by one; the fleet incident resolves with the last
    let heal = at + Duration::seconds(300);
    for (i, c) in ["c1", "c2"].iter().enumerate() {
        let outs = rounds(
            &mut m,
            c,
            "coredns",
            ProbeStatus::Healthy,
            10,
            3,
            heal + Duration::seconds(i as i64),
        );
        let f = fleet_incidents(&outs);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, IncidentStatus::Open);
        // the clusters back are said while it lasts
        let back = ["c1 back", "c1, c2 back"][i];
        assert!(
            f[0].summary.starts_with(&format!(
                "dns-failure on 3 of 6 clusters (c1, c2, c4; {back})"
            )),
            "{}",
            f[0].summary
        );
    }
    let outs = rounds(
        &mut m,
        "c4",
        "coredns",
        ProbeStatus::Healthy,
        10,
        3,
        heal + Duration::seconds(2),
    );
    let done = fleet_incidents(&outs);
    assert_eq!(
        (done[0].status, done[0].revision, done[0].id.as_str()),
        (IncidentStatus::Resolved, 5, opened[0].id.as_str())
    );
    assert!(
        done[0]
            .members
            .iter()
            .all(|m| m.status == IncidentStatus::Resolved && m.left_at.is_some())
    );
    assert!(
        done[0]
            .summary
            .starts_with("dns-failure on 3 of 6 clusters (c1, c2, c4)")
    );
    assert!(m.current_fleet(false).is_empty());
    assert_eq!(m.current_fleet(true).len(), 1);
}

#[test]
fn failures_far_apart_or_of_other_kinds_make_no_fleet_incident() {
    let mut m = machine();
    six_clusters(&mut m, t0());
    let at = t0() + Duration::seconds(60);
    let mut outs = rounds(&mut m, "c1", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    // another kind on c2 at the same time
    outs.extend(rounds(
        &mut m,
        "c2",
        "etcd",
        ProbeStatus::Unhealthy,
        1,
        3,
        at,
    ));
    // the same kind on c3, but ten minutes later (the window is five)
    outs.extend(rounds(
        &mut m,
        "c3",
        "coredns",
        ProbeStatus::Unhealthy,
        1,
        3,
        at + Duration::minutes(10),
    ));
    assert_eq!(incidents(&outs).len(), 3);
    assert!(
        fleet_incidents(&outs).is_empty(),
        "{:#?}",
        fleet_incidents(&outs)
    );
}

#[test]
fn a_member_whose_cluster_went_silent_for_good_leaves_and_the_fleet_incident_does_not_stay_open_forever()
 {
    let mut m = machine();
    six_clusters(&mut m, t0());
    let at = t0() + Duration::seconds(60);
    rounds(&mut m, "c1", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    let outs = rounds(&mut m, "c2", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    let id = fleet_incidents(&outs)[0].id.clone();
    // c2 heals; c1 is never heard of again: a day later it leaves, and the fleet incident resolves
    rounds(
        &mut m,
        "c2",
        "coredns",
        ProbeStatus::Healthy,
        10,
        3,
        at + Duration::minutes(5),
    );
    let mut outs = Vec::new();
    for h in [1, 12, 25] {
        outs.extend(m.apply(Input::Tick(at + Duration::hours(h))));
    }
    let f = fleet_incidents(&outs);
    let last = f.last().expect("the fleet incident changed");
    assert_eq!(
        (last.id.as_str(), last.status),
        (id.as_str(), IncidentStatus::Resolved)
    );
    let c1 = last.members.iter().find(|m| m.cluster == "c1").expect("c1");
    assert!(c1.left_because.contains("sent nothing"), "{c1:?}");
    // and its resolution is announced once
    let more = fleet_incidents(&m.apply(Input::Tick(at + Duration::hours(26))));
    assert!(more.is_empty());
}

#[test]
fn a_member_that_left_silent_is_not_said_to_be_back() {
    let mut m = machine();
    six_clusters(&mut m, t0());
    let at = t0() + Duration::seconds(60);
    rounds(&mut m, "c1", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    rounds(&mut m, "c2", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    // c1 is never heard of again; c2 keeps failing and sending heartbeats
    let mut outs = Vec::new();
    for (i, h) in [1, 12, 25].into_iter().enumerate() {
        let t = at + Duration::hours(h);
        m.apply(Input::Heartbeat(
            &env("c2", t, 100 + i as u64, heartbeat()),
            t,
        ));
        outs.extend(m.apply(Input::Tick(t)));
    }
    let last = fleet_incidents(&outs).pop().expect("c1 left");
    assert_eq!(last.status, IncidentStatus::Open);
    assert!(
        last.members
            .iter()
            .any(|m| m.cluster == "c1" && m.left_because.contains("sent nothing"))
    );
    assert!(
        last.summary
            .starts_with("dns-failure on 2 of 6 clusters (c1, c2):"),
        "{}",
        last.summary
    );
}

#[test]
fn a_hub_down_for_a_day_does_not_take_the_members_of_its_fleet_incidents_for_gone() {
    let mut m = machine();
    m.apply(Input::Tick(t0()));
    six_clusters(&mut m, t0());
    let at = t0() + Duration::seconds(60);
    rounds(&mut m, "c1", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    let outs = rounds(&mut m, "c2", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    let id = fleet_incidents(&outs)[0].id.clone();
    let mut again = restored(snapshot_of(&m, m.fleet.incidents.clone()));
    // started again 30 h later: no member leaves for the hub's own downtime
    let back = at + Duration::hours(30);
    let changed = fleet_incidents(&again.apply(Input::Tick(back)));
    assert!(changed.iter().all(|f| f.id != id), "{changed:#?}");
    let open = again.current_fleet(false);
    let f = open.iter().find(|f| f.id == id).expect("still open");
    assert!(f.members.iter().all(|m| m.left_at.is_none()), "{f:#?}");
    // a day of watching without a word from them: they leave, and it resolves
    let outs = fleet_incidents(&again.apply(Input::Tick(back + Duration::hours(24))));
    let f = outs.iter().find(|f| f.id == id).expect("it changed");
    assert_eq!(f.status, IncidentStatus::Resolved);
    assert!(
        f.members
            .iter()
            .all(|m| m.left_because.contains("sent nothing")),
        "{f:#?}"
    );
}

#[test]
fn fleet_incidents_survive_a_restart_and_a_wiped_store() {
    let mut m = machine();
    six_clusters(&mut m, t0());
    let at = t0() + Duration::seconds(60);
    rounds(&mut m, "c1", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    let outs = rounds(&mut m, "c2", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    let opened = fleet_incidents(&outs)[0].clone();
    let changes = m.take_changes();
    assert_eq!(
        changes.fleet,
        vec![("dns-failure".to_string(), Some(opened.clone()))]
    );
    // the store's snapshot read back: the same fleet incident, and its revisions continue
    let snapshot = Snapshot {
        clusters: m.clusters.clone(),
        incidents: m.incidents.clone(),
        fleet: m.fleet.incidents.clone(),
        ..Default::default()
    };
    let mut again = restored(snapshot);
    assert_eq!(again.current_fleet(false), vec![opened.clone()]);
    let outs = rounds(
        &mut again,
        "c3",
        "coredns",
        ProbeStatus::Unhealthy,
        1,
        3,
        at + Duration::seconds(10),
    );
    let joined = fleet_incidents(&outs);
    assert_eq!(
        (
            joined[0].id.as_str(),
            joined[0].revision,
            joined[0].members.len()
        ),
        (opened.id.as_str(), 2, 3)
    );
    // a wiped store: what FLEET_INCIDENTS holds (the latest revision) is restored, and a newer one of
    // the same kind would be current
    let mut wiped = machine();
    wiped.restore_fleet(vec![opened.clone(), joined[0].clone()]);
    assert_eq!(wiped.current_fleet(false), vec![joined[0].clone()]);
    assert!(!wiped.take_changes().fleet.is_empty());
}

#[test]
fn an_unreachable_cluster_says_what_it_takes_down_and_what_runs_nowhere_else() {
    let mut m = machine();
    six_clusters(&mut m, t0());
    // c1 also runs a Deployment no other cluster has
    let s = env(
        "c1",
        t0(),
        20,
        StateMsg::State(ResourceState {
            namespace: Some("shop".into()),
            ..deployment("checkout", "dddd0001")
        }),
    );
    m.apply(Input::State(&s));
    // before anything breaks
    let br = m.blast_radius("c1").expect("c1 is known");
    assert_eq!(br.only_here, vec!["Deployment shop/checkout"]);
    assert!(m.blast_radius("nope").is_none());
    // every cluster but c1 keeps sending heartbeats; c1 goes silent
    let mut outs = Vec::new();
    for i in 1..=6 {
        let at = t0() + Duration::seconds(5 * i);
        for c in ["c2", "c3", "c4", "c5", "c6"] {
            m.apply(Input::Heartbeat(
                &env(c, at, 10 + i as u64, heartbeat()),
                at,
            ));
        }
        outs.extend(m.apply(Input::Tick(at)));
    }
    let unreachable = incidents(&outs)
        .into_iter()
        .find(|i| i.cluster == "c1" && i.kind == "cluster-unreachable")
        .expect("c1 unreachable");
    let br = unreachable.blast_radius.expect("a blast radius");
    assert_eq!((br.workloads, br.elsewhere, br.only_here_total), (1, 0, 1));
    assert_eq!(br.namespaces, vec!["shop"]);
    assert_eq!(br.as_of, Some(t0()));
    let fact = unreachable
        .evidence
        .iter()
        .find(|e| e.summary.starts_with("c1 takes down"))
        .expect("the blast radius is evidence");
    assert!(fact.rank <= 2, "{:#?}", unreachable.evidence);
    assert!(
        fact.summary
            .contains("1 runs nowhere else (Deployment shop/checkout)"),
        "{}",
        fact.summary
    );
}

#[test]
fn clusters_lost_together_say_what_ran_only_on_them_though_each_runs_it_on_the_other() {
    let mut m = machine();
    six_clusters(&mut m, t0());
    // c1 and c2 run a Deployment no other cluster has; c1 another one of its own, and one c3 runs too
    for (c, name, seq) in [
        ("c1", "checkout", 20),
        ("c2", "checkout", 20),
        ("c1", "ledger", 21),
        ("c1", "cart", 22),
        ("c3", "cart", 20),
    ] {
        let s = env(
            c,
            t0(),
            seq,
            StateMsg::State(ResourceState {
                namespace: Some("shop".into()),
                ..deployment(name, "dddd0001")
            }),
        );
        m.apply(Input::State(&s));
    }
    // each alone: checkout runs on the other
    assert_eq!(
        m.blast_radius("c1").expect("c1").only_here,
        vec!["Deployment shop/ledger"]
    );
    // c1 and c2 go silent together; the others keep sending heartbeats
    let mut outs = Vec::new();
    for i in 1..=8 {
        let at = t0() + Duration::seconds(5 * i);
        for c in ["c3", "c4", "c5", "c6"] {
            m.apply(Input::Heartbeat(
                &env(c, at, 10 + i as u64, heartbeat()),
                at,
            ));
        }
        outs.extend(m.apply(Input::Tick(at)));
        outs.extend(m.settle());
    }
    let f = fleet_incidents(&outs)
        .into_iter()
        .rfind(|f| f.kind == "cluster-unreachable")
        .expect("a fleet incident of the two");
    let br = f.blast_radius.as_ref().expect("what they take down");
    assert_eq!(
        (br.cluster.as_str(), br.workloads, br.elsewhere),
        ("c1, c2", 3, 1),
        "{br:#?}"
    );
    assert_eq!(
        br.only_here,
        vec!["Deployment shop/checkout", "Deployment shop/ledger"]
    );
    assert!(
        f.summary.contains(
            "on 2 of 6 clusters (c1, c2), taking down 2 workloads that run on no cluster still up (Deployment shop/checkout, Deployment shop/ledger)"
        ),
        "{}",
        f.summary
    );
    // the one of the two judged second knows the first is down
    let second = incidents(&outs)
        .into_iter()
        .rfind(|i| i.kind == "cluster-unreachable")
        .expect("two incidents");
    let own = second.blast_radius.expect("a blast radius");
    assert!(
        own.only_here
            .contains(&"Deployment shop/checkout".to_string()),
        "{own:#?}"
    );
    // the query answers the same while the other is down
    assert!(
        m.blast_radius("c1")
            .expect("c1")
            .summary
            .contains("2 run on no cluster still up")
    );
    // rounds of c3's API server probe, 15 s apart, while c3–c6 send heartbeats
    let c3_rounds =
        |m: &mut Machine, status: ProbeStatus, first: u64, n: u64, from: DateTime<Utc>| {
            let mut outs = Vec::new();
            for i in 0..n {
                let t = from + Duration::seconds(15 * i as i64);
                for c in ["c3", "c4", "c5", "c6"] {
                    m.apply(Input::Heartbeat(&env(c, t, 30 + first + i, heartbeat()), t));
                }
                outs.extend(rounds(m, "c3", "apiserver", status, first + i, 1, t));
                outs.extend(m.apply(Input::Tick(t)));
                outs.extend(m.settle());
            }
            outs
        };
    // c3, the last cluster up that runs cart, loses its API server: the fleet incident is judged again
    // though none of its members changed
    let at = t0() + Duration::seconds(45);
    let outs = c3_rounds(&mut m, ProbeStatus::Unhealthy, 1, 3, at);
    assert!(
        incidents(&outs)
            .iter()
            .any(|i| i.cluster == "c3" && i.kind == "apiserver-down")
    );
    let again = fleet_incidents(&outs)
        .into_iter()
        .rfind(|x| x.id == f.id)
        .expect("judged again");
    assert_eq!(
        again.blast_radius.as_ref().map(|b| b.only_here.clone()),
        Some(vec![
            "Deployment shop/cart".to_string(),
            "Deployment shop/checkout".to_string(),
            "Deployment shop/ledger".to_string()
        ])
    );
    // c3 heals: cart runs somewhere again
    let at = at + Duration::seconds(45);
    let outs = c3_rounds(&mut m, ProbeStatus::Healthy, 4, 4, at);
    let back = fleet_incidents(&outs)
        .into_iter()
        .rfind(|x| x.id == f.id)
        .expect("judged again");
    assert_eq!(
        back.blast_radius.as_ref().map(|b| b.only_here_total),
        Some(2)
    );
    // c1 and c2 come back: resolved, its summary no longer says what is down
    let at = at + Duration::seconds(60);
    let mut outs = Vec::new();
    for i in 0..3 {
        let t = at + Duration::seconds(5 * i);
        for c in ["c1", "c2", "c3", "c4", "c5", "c6"] {
            outs.extend(m.apply(Input::Heartbeat(&env(c, t, 60 + i as u64, heartbeat()), t)));
        }
        outs.extend(m.apply(Input::Tick(t)));
        outs.extend(m.settle());
    }
    let over = fleet_incidents(&outs)
        .into_iter()
        .rfind(|x| x.id == f.id)
        .expect("resolved");
    assert_eq!(over.status, IncidentStatus::Resolved, "{}", over.summary);
    assert!(!over.summary.contains("taking down"), "{}", over.summary);
    assert!(
        over.blast_radius.is_some(),
        "what they took down stays said"
    );
    // a fleet incident of another kind says nothing of the sort
    let dns = dns_fails_on(&mut m, ["c4", "c5"], at + Duration::seconds(60));
    assert_eq!(dns.kind, "dns-failure");
    assert!(dns.blast_radius.is_none());
}

#[test]
fn dead_api_servers_that_stay_dead_give_their_fleet_incident_no_new_revision() {
    let mut m = machine();
    six_clusters(&mut m, t0());
    let at = t0() + Duration::seconds(60);
    // c1 and c2 lose their API servers; their agents keep sending heartbeats and probe rounds for three
    // minutes. Halfway, c3 falls silent: another cluster lost, that runs nothing c1 and c2 run
    let mut opened = Vec::new();
    let mut later = Vec::new();
    let mut lost = Vec::new();
    for round in 1..=13u64 {
        let t = at + Duration::seconds(15 * round as i64);
        let mut outs = Vec::new();
        let up: &[&str] = if round < 6 {
            &["c1", "c2", "c3", "c4", "c5", "c6"]
        } else {
            &["c1", "c2", "c4", "c5", "c6"]
        };
        for c in up {
            outs.extend(m.apply(Input::Heartbeat(&env(c, t, 100 + round, heartbeat()), t)));
        }
        for c in ["c1", "c2"] {
            outs.extend(rounds(
                &mut m,
                c,
                "apiserver",
                ProbeStatus::Unhealthy,
                round,
                1,
                t,
            ));
        }
        outs.extend(m.apply(Input::Tick(t)));
        outs.extend(m.settle());
        lost.extend(
            incidents(&outs)
                .into_iter()
                .filter(|i| i.cluster == "c3")
                .map(|i| i.kind),
        );
        if round <= 4 {
            opened.extend(fleet_incidents(&outs));
        } else {
            later.extend(fleet_incidents(&outs));
        }
    }
    let f = opened.pop().expect("a fleet incident of the two");
    assert_eq!(f.kind, "apiserver-down");
    assert!(f.blast_radius.is_some());
    assert_eq!(lost, ["cluster-unreachable"]);
    // what c1 and c2 take down is the same, though their states are newer by then
    assert!(
        later.is_empty(),
        "revisions {:?}",
        later.iter().map(|f| f.revision).collect::<Vec<_>>()
    );
}

#[test]
fn a_batch_of_digests_is_judged_once_at_settle_and_says_what_judging_each_would_have_said() {
    let probe_failed = "Readiness probe failed: HTTP probe failed with statuscode: 503";
    let at = t0() + Duration::seconds(60);
    let events: Vec<_> = ["c1", "c2", "c3", "c4"]
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let t = at + Duration::seconds(i as i64);
            env(
                c,
                t,
                1,
                event("coredns-5d78c9869d-7xk2p", "Unhealthy", probe_failed, t),
            )
        })
        .collect();
    // judged after every input
    let mut each = machine();
    six_clusters(&mut each, t0());
    let mut outs = Vec::new();
    for e in &events {
        outs.extend(each.apply(Input::Event(e)));
    }
    let every = fleet_incidents(&outs);
    assert_eq!(
        every.len(),
        3,
        "opened with c2, joined by c3 and c4: {every:#?}"
    );
    // deferred: nothing until the batch settles, then one revision saying what the last one said
    let mut batched = machine();
    six_clusters(&mut batched, t0());
    batched.defer_fleet_judgement();
    let mut outs = Vec::new();
    for e in &events {
        outs.extend(batched.apply(Input::Event(e)));
    }
    assert!(
        fleet_incidents(&outs).is_empty(),
        "not judged before settling"
    );
    let settled = fleet_incidents(&batched.settle());
    assert_eq!(settled.len(), 1, "{settled:#?}");
    let (a, b) = (every.last().expect("judged"), &settled[0]);
    assert_eq!(b.revision, 1);
    assert_eq!(
        (
            &a.id,
            &a.members,
            &a.shared,
            &a.suspects,
            &a.summary,
            &a.labels
        ),
        (
            &b.id,
            &b.members,
            &b.shared,
            &b.suspects,
            &b.summary,
            &b.labels
        )
    );
    assert!(
        fleet_incidents(&batched.settle()).is_empty(),
        "nothing changed since"
    );
    // and it is stored, like any judged one
    assert!(!batched.take_changes().fleet.is_empty());
}

#[test]
fn an_image_that_never_pulls_is_one_fleet_incident_not_one_per_thing_its_kubelets_say() {
    let mut m = machine();
    six_clusters(&mut m, t0());
    let at = t0() + Duration::seconds(60);
    let image = "registry.example.com/shop/web:2.1.0";
    // what a kubelet says of one pod that can't pull its image: three warnings of one reason, each its
    // own Event object (client-go keys them by message)
    let said = [
        format!(
            "Failed to pull image \"{image}\": rpc error: code = NotFound desc = failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": {image}: not found"
        ),
        "Error: ErrImagePull".to_string(),
        "Error: ImagePullBackOff".to_string(),
    ];
    let mut opened = Vec::new();
    let mut n = 0;
    for (i, (c, pod)) in [
        ("c1", "web-7d4b9c8f5-q8w7r"),
        ("c2", "web-6c5b4a3f2-x2x9k"),
        ("c5", "web-5f8d7c6b4-h5sjg"),
    ]
    .into_iter()
    .enumerate()
    {
        for (j, msg) in said.iter().enumerate() {
            let t = at + Duration::seconds((i * 3 + j) as i64);
            n += 1;
            let mut ev = event(pod, "Failed", msg, t);
            ev.uid = format!("event-{pod}-{j}");
            opened.extend(fleet_incidents(&m.apply(Input::Event(&env(c, t, n, ev)))));
        }
    }
    let ids: BTreeSet<&str> = opened.iter().map(|f| f.id.as_str()).collect();
    assert_eq!(ids.len(), 1, "{opened:#?}");
    let f = opened.last().expect("one fleet incident");
    // every digest of each failing cluster is a member: c1's three were said before c2 paired them
    assert_eq!(f.members.len(), 9, "{:#?}", f.members);
    assert_eq!(f.clusters(), ["c1", "c2", "c5"]);
    assert!(
        f.summary
            .starts_with("Failed on Pod shop/web-* on 3 of 6 clusters (c1, c2, c5)"),
        "{}",
        f.summary
    );
    assert_eq!(m.current_fleet(false).len(), 1);
}

#[test]
fn the_same_event_problem_on_several_clusters_is_one_fleet_problem_that_ends_when_it_stops() {
    let mut m = machine();
    six_clusters(&mut m, t0());
    let at = t0() + Duration::seconds(60);
    let probe_failed = "Readiness probe failed: HTTP probe failed with statuscode: 503";
    let warn = |m: &mut Machine, c: &str, pod: &str, msg: &str, at: DateTime<Utc>| {
        let e = env(c, at, 1, event(pod, "Unhealthy", msg, at));
        m.apply(Input::Event(&e))
    };
    let outs = warn(&mut m, "c1", "coredns-5d78c9869d-7xk2p", probe_failed, at);
    assert!(
        fleet_incidents(&outs).is_empty(),
        "one cluster is not a fleet problem"
    );
    // the same problem on c2 (another pod name, the same workload): one fleet problem
    let outs = warn(
        &mut m,
        "c2",
        "coredns-7f9c5b6d4-q8w7r",
        probe_failed,
        at + Duration::seconds(3),
    );
    let opened = fleet_incidents(&outs);
    assert_eq!(opened.len(), 1, "{opened:#?}");
    let f = &opened[0];
    assert_eq!(f.kind, "event");
    assert_eq!(f.labels["alertname"], "Unhealthy");
    assert_eq!(f.labels["object"], "coredns-*");
    assert_eq!(f.members.len(), 2);
    assert!(
        f.summary
            .starts_with("Unhealthy on Pod shop/coredns-* on 2 of 6 clusters (c1, c2)"),
        "{}",
        f.summary
    );
    // another problem (another message) on c3 doesn't join; the same one on c3 does
    let outs = warn(
        &mut m,
        "c3",
        "coredns-6f6b679f8f-q2b7n",
        "Liveness probe failed: connection refused",
        at + Duration::seconds(5),
    );
    assert!(fleet_incidents(&outs).is_empty());
    let outs = warn(
        &mut m,
        "c3",
        "coredns-6f6b679f8f-zx4w9",
        probe_failed,
        at + Duration::seconds(6),
    );
    let joined = fleet_incidents(&outs);
    assert_eq!(
        (joined[0].id.as_str(), joined[0].members.len()),
        (f.id.as_str(), 3)
    );
    // what they share is judged over all three (c1–c3 are prod)
    let env_prod = joined[0]
        .shared
        .iter()
        .find(|s| s.attribute == "label:env")
        .expect("env");
    assert_eq!(
        (
            env_prod.failing,
            env_prod.failing_total,
            env_prod.healthy_total
        ),
        (3, 3, 3),
        "{:#?}",
        joined[0].shared
    );
    // the events stop: a quarter of an hour later the members leave and the problem is over
    let mut outs = Vec::new();
    for s in [60, 600, 1000, 1200] {
        let now = at + Duration::seconds(s);
        for c in ["c1", "c2", "c3", "c4", "c5", "c6"] {
            m.apply(Input::Heartbeat(
                &env(c, now, 100 + s as u64, heartbeat()),
                now,
            ));
        }
        outs.extend(m.apply(Input::Tick(now)));
    }
    let ended = fleet_incidents(&outs);
    let last = ended.last().expect("it ended");
    assert_eq!(
        (last.id.as_str(), last.status),
        (f.id.as_str(), IncidentStatus::Resolved)
    );
    // and a store read back after a wipe puts it under its problem again
    let mut wiped = machine();
    wiped.restore_fleet(vec![last.clone()]);
    assert_eq!(wiped.current_fleet(true), vec![last.clone()]);
    assert!(
        wiped
            .fleet
            .incidents
            .contains_key(&crate::fleet::key_of(last))
    );
}

/// The Deployment `name` in namespace `shop` on each of `copies` (cluster, image, timeout), as
/// [`shop_web`] makes it, without an image where `image` is empty (held before images were).
fn run_in_shop(m: &mut Machine, name: &str, copies: &[(&str, &str, &str)]) {
    for (c, image, timeout) in copies {
        let mut s = shop_web(c, image, timeout);
        s.name = name.into();
        if image.is_empty()
            && let Some(container) = s
                .spec
                .as_mut()
                .and_then(|v| v.pointer_mut("/spec/template/spec/containers/0"))
                .and_then(|v| v.as_object_mut())
        {
            container.remove("image");
        }
        m.apply(Input::State(&env(c, t0(), 6, StateMsg::State(s))));
    }
}

/// A `web` Deployment in namespace `shop` running `image`, with an env var of each cluster's own
/// (`CLUSTER`) and one set to `timeout`.
fn shop_web(cluster: &str, image: &str, timeout: &str) -> ResourceState {
    let spec = serde_json::json!({"spec": {"template": {"spec": {"containers": [{
        "name": "web",
        "image": image,
        "env": [{"name": "CLUSTER", "value": cluster}, {"name": "TIMEOUT", "value": timeout}],
        "resources": {"limits": {"memory": "256Mi"}}
    }]}}}});
    ResourceState {
        namespace: Some("shop".into()),
        spec: Some(spec),
        ..deployment("web", &format!("{image}/{timeout}"))
    }
}

#[test]
fn a_workload_failing_on_some_clusters_says_what_its_failing_copies_run_that_its_healthy_ones_dont()
{
    let mut m = machine();
    six_clusters(&mut m, t0());
    // shop/web runs 2.1 with a 5 s timeout on c2, c5 and c6, 2.0 with 30 s on c1 and c3; c4 doesn't run it
    for (c, image, timeout) in [
        ("c1", "registry.example.com/web:2.0", "30"),
        ("c2", "registry.example.com/web:2.1", "5"),
        ("c3", "registry.example.com/web:2.0", "30"),
        ("c5", "registry.example.com/web:2.1", "5"),
        ("c6", "registry.example.com/web:2.1", "5"),
    ] {
        let s = env(c, t0(), 6, StateMsg::State(shop_web(c, image, timeout)));
        m.apply(Input::State(&s));
    }
    // its pods crashloop on the three that run 2.1 (rolled out long before: no change to suspect)
    let at = t0() + Duration::hours(2);
    let mut opened = Vec::new();
    for (i, c) in ["c2", "c5", "c6"].iter().enumerate() {
        let pod = format!("web-{}-x2x9k", ["7d4b9c8f5", "5f6d7c8b9", "6c7d8e9f4"][i]);
        let e = env(
            c,
            at + Duration::seconds(i as i64),
            7,
            event(&pod, "BackOff", "Back-off restarting failed container", at),
        );
        opened.extend(fleet_incidents(&m.apply(Input::Event(&e))));
    }
    let f = opened.last().expect("a fleet incident");
    assert_eq!(f.members.len(), 3, "{f:#?}");
    // judged among the clusters that run it (c4 doesn't); each cluster's own env value separates nothing
    assert_eq!(
        workload_rows(f),
        vec![
            (
                "workload:Deployment shop/web",
                "image:web=registry.example.com/web:2.1",
                3,
                3,
                0,
                2
            ),
            (
                "workload:Deployment shop/web",
                "web.env.TIMEOUT=5",
                3,
                3,
                0,
                2
            ),
        ],
        "{:#?}",
        f.shared
    );
    // first, before the cluster facts that separate them less (c5 and c6's kernel)
    assert!(
        f.summary.contains(
            "on 3 of 6 clusters (c2, c5, c6): 3 of 3 failing run Deployment shop/web with image \
             registry.example.com/web:2.1; 0 of 2 healthy do"
        ),
        "{}",
        f.summary
    );
    assert!(
        f.shared.iter().any(|s| s.attribute == "kernel"),
        "{:#?}",
        f.shared
    );
    // the healthy copies move to 2.1 as well: the image no longer separates them, the timeout still does
    for c in ["c1", "c3"] {
        let s = env(
            c,
            at + Duration::seconds(10),
            8,
            StateMsg::State(shop_web(c, "registry.example.com/web:2.1", "30")),
        );
        m.apply(Input::State(&s));
    }
    let e = env(
        "c1",
        at + Duration::seconds(20),
        9,
        event(
            "web-8e9f0a1b2-q8w7r",
            "BackOff",
            "Back-off restarting failed container",
            at,
        ),
    );
    let f = fleet_incidents(&m.apply(Input::Event(&e)))
        .pop()
        .expect("c1 joins");
    let top = &f.shared[0];
    assert_eq!(
        (
            top.value.as_str(),
            top.failing,
            top.failing_total,
            top.healthy,
            top.healthy_total
        ),
        ("web.env.TIMEOUT=5", 3, 4, 0, 1),
        "{:#?}",
        f.shared
    );
}

/// The event problem `reason` on a pod of each of `clusters`, the fleet incident it makes.
fn pods_fail(
    m: &mut Machine,
    clusters: &[&str],
    pod: &str,
    reason: &str,
    at: DateTime<Utc>,
) -> FleetIncident {
    let mut opened = Vec::new();
    for (i, c) in clusters.iter().enumerate() {
        let at = at + Duration::seconds(i as i64);
        let e = env(
            c,
            at,
            7,
            event(pod, reason, "Back-off restarting failed container", at),
        );
        opened.extend(fleet_incidents(&m.apply(Input::Event(&e))));
    }
    opened.pop().expect("a fleet incident")
}

fn workload_rows(f: &FleetIncident) -> Vec<(&str, &str, u32, u32, u32, u32)> {
    f.shared
        .iter()
        .filter(|s| s.attribute.starts_with("workload:"))
        .map(|s| {
            (
                s.attribute.as_str(),
                s.value.as_str(),
                s.failing,
                s.failing_total,
                s.healthy,
                s.healthy_total,
            )
        })
        .collect()
}

#[test]
fn a_value_one_failing_copy_alone_has_an_image_not_known_yet_or_pods_two_workloads_could_own_say_nothing()
 {
    let mut m = machine();
    six_clusters(&mut m, t0());
    // shop/queue-1 runs 2.1 on c1 and c2, 2.0 on c4; c3's copy was held before images were (none known)
    run_in_shop(
        &mut m,
        "queue-1",
        &[
            ("c1", "registry.example.com/queue:2.1", "5"),
            ("c2", "registry.example.com/queue:2.1", "5"),
            ("c3", "", "30"),
            ("c4", "registry.example.com/queue:2.0", "30"),
        ],
    );
    let at = t0() + Duration::hours(2);
    let f = pods_fail(
        &mut m,
        &["c1", "c2"],
        "queue-1-7d4b9c8f5-x2x9k",
        "BackOff",
        at,
    );
    // the pods of a numbered name are its own; each failing copy's CLUSTER value is its own (1 of 2);
    // c3's image is unknown, not unset
    assert_eq!(
        workload_rows(&f),
        vec![
            (
                "workload:Deployment shop/queue-1",
                "image:web=registry.example.com/queue:2.1",
                2,
                2,
                0,
                2
            ),
            (
                "workload:Deployment shop/queue-1",
                "web.env.TIMEOUT=5",
                2,
                2,
                0,
                2
            ),
        ],
        "{:#?}",
        f.shared
    );
    // a Deployment shop/queue appears on both: whose pods `queue-*` are can't be told, nothing is said;
    // shop/cache fails on c1 and c5, but only c1 runs it: one failing copy's values separate nothing
    let queue = ["c1", "c2", "c3", "c4"].map(|c| (c, "registry.example.com/queue:1", "5"));
    run_in_shop(&mut m, "queue", &queue);
    run_in_shop(
        &mut m,
        "cache",
        &[
            ("c1", "cache:2", "5"),
            ("c3", "cache:1", "5"),
            ("c4", "cache:1", "5"),
        ],
    );
    for (i, (pod, reason, failing)) in [
        ("queue-1-7d4b9c8f5-x2x9k", "Unhealthy", ["c1", "c2"]),
        ("cache-7d4b9c8f5-x2x9k", "BackOff", ["c1", "c5"]),
    ]
    .into_iter()
    .enumerate()
    {
        let later = at + Duration::seconds(30 * (i as i64 + 1));
        let f = pods_fail(&mut m, &failing, pod, reason, later);
        assert_eq!(f.members.len(), 2);
        assert_eq!(workload_rows(&f), vec![], "{:#?}", f.shared);
    }
}

#[test]
fn a_change_made_as_the_pods_began_failing_or_read_after_the_judgement_is_still_its_suspect() {
    let mut m = machine();
    six_clusters(&mut m, t0());
    let suspects = |f: &FleetIncident| -> Vec<(String, SuspectVerdict)> {
        f.suspects
            .iter()
            .map(|s| (s.object.name.clone(), s.verdict))
            .collect()
    };
    // web's image is set on c1 and c2 at 10:00:00.4; its pods' pulls fail in that second, and events
    // are timed to the second: 10:00:00
    let at = t0() + Duration::hours(1);
    for c in ["c1", "c2"] {
        change(
            &mut m,
            c,
            "web",
            "bbbb0002",
            at + Duration::milliseconds(400),
        );
    }
    let f = pods_fail(&mut m, &["c1", "c2"], "web-7d4b9c8f5-x2x9k", "Failed", at);
    assert_eq!(
        suspects(&f),
        vec![("web".to_string(), SuspectVerdict::Suspect)],
        "{f:#?}"
    );
    // api's pods fail on c3 and c4 at 11:00; the change to api made ten seconds before is read after
    // (a backlog of states): the fleet incident is judged again and names it
    let at = at + Duration::hours(1);
    let f = pods_fail(&mut m, &["c3", "c4"], "api-6c7d8e9f4-q8w7r", "Failed", at);
    assert_eq!(suspects(&f), vec![], "{f:#?}");
    let mut again = Vec::new();
    for c in ["c3", "c4"] {
        let s = env(
            c,
            at - Duration::seconds(10),
            11,
            StateMsg::State(deployment("api", "dddd0001")),
        );
        m.apply(Input::State(&s));
        let s = env(
            c,
            at - Duration::seconds(10),
            12,
            StateMsg::State(deployment("api", "dddd0002")),
        );
        again.extend(fleet_incidents(&m.apply(Input::State(&s))));
    }
    let f = again.last().expect("judged again");
    assert_eq!(
        suspects(f),
        vec![("api".to_string(), SuspectVerdict::Suspect)],
        "{f:#?}"
    );
    // a change made after they began failing changes nothing: no new revision
    let s = env(
        "c3",
        at + Duration::seconds(7),
        13,
        StateMsg::State(deployment("api", "dddd0003")),
    );
    assert!(fleet_incidents(&m.apply(Input::State(&s))).is_empty());
    // the same change to api made on two healthy clusters before, read late (their backlog): judged
    // again, no longer a suspect
    let mut again = Vec::new();
    for c in ["c5", "c6"] {
        for (seq, hash) in [(14, "dddd0001"), (15, "dddd0002")] {
            let s = env(
                c,
                at - Duration::seconds(20),
                seq,
                StateMsg::State(deployment("api", hash)),
            );
            again.extend(fleet_incidents(&m.apply(Input::State(&s))));
        }
    }
    let f = again.last().expect("judged again");
    assert_eq!(suspects(f), vec![], "{f:#?}");
}

/// Six clusters that restart every workload every few minutes; shop/web's image is set to 2 on c1, c2
/// and c3 (and on c4 when `c4_too`, which stays healthy), its pods fail there. The healthy clusters ran
/// `healthy_image` from the start.
fn a_rollout_amid_restarts(healthy_image: &str, c4_too: bool) -> FleetIncident {
    let mut m = machine();
    six_clusters(&mut m, t0());
    let all = ["c1", "c2", "c3", "c4", "c5", "c6"];
    let web = |c: &str, image: &str, hash: &str| {
        let mut s = shop_web("any", image, "30");
        s.spec_hash = hash.into();
        env(c, t0(), 20, StateMsg::State(s))
    };
    for c in all {
        let image = if ["c1", "c2", "c3"].contains(&c) {
            "registry.example.com/web:1"
        } else {
            healthy_image
        };
        m.apply(Input::State(&web(c, image, "w1")));
    }
    let at = t0() + Duration::hours(1);
    // every object of every cluster changes in the quarter hour before, shop/web too: a restart, its
    // settings as they were
    for c in all {
        for i in 0..40 {
            change(
                &mut m,
                c,
                &format!("app-{i}"),
                "0000000b",
                at - Duration::minutes(10),
            );
        }
        let mut s = web(c, "registry.example.com/web:1", "w1-restarted");
        if !["c1", "c2", "c3"].contains(&c) {
            s = web(c, healthy_image, "w1-restarted");
        }
        s.cluster_time = at - Duration::minutes(8);
        m.apply(Input::State(&s));
    }
    let rolled: &[&str] = if c4_too {
        &["c1", "c2", "c3", "c4"]
    } else {
        &["c1", "c2", "c3"]
    };
    for c in rolled {
        let mut s = web(c, "registry.example.com/web:2", "w2");
        s.cluster_time = at - Duration::minutes(1);
        m.apply(Input::State(&s));
    }
    pods_fail(
        &mut m,
        &["c1", "c2", "c3"],
        "web-7d4b9c8f5-x2x9k",
        "Failed",
        at,
    )
}

fn web_suspect(f: &FleetIncident) -> Option<(SuspectVerdict, &str)> {
    f.suspects
        .iter()
        .find(|s| s.object.name == "web")
        .map(|s| (s.verdict, s.summary.as_str()))
}

#[test]
fn one_rollout_to_the_failing_clusters_is_a_suspect_amid_restarts_of_everything_everywhere() {
    let f = a_rollout_amid_restarts("registry.example.com/web:1", false);
    assert_eq!(
        web_suspect(&f),
        Some((
            SuspectVerdict::Suspect,
            "Deployment shop/web changed on 3 of 3 failing clusters, 0 of 3 healthy, in the 15m before, the same change on each"
        )),
        "{:#?}",
        f.suspects
    );
    // the restarts of everything are churn, not suspects
    assert_eq!(
        f.suspects
            .iter()
            .filter(|s| s.verdict == SuspectVerdict::Suspect)
            .count(),
        1,
        "{:#?}",
        f.suspects
    );
    // the same change made on a healthy cluster too: not singled out
    let f = a_rollout_amid_restarts("registry.example.com/web:1", true);
    assert_eq!(web_suspect(&f), None, "{:#?}", f.suspects);
    // the healthy ones have run 2 for long (a rollout that reached them before): ordinary
    let f = a_rollout_amid_restarts("registry.example.com/web:2", false);
    assert_eq!(
        web_suspect(&f).map(|(v, _)| v),
        Some(SuspectVerdict::Common),
        "{:#?}",
        f.suspects
    );
}

#[test]
fn event_problems_an_older_correlator_kept_apart_carry_on_as_one_under_their_id_now() {
    let mut m = machine();
    six_clusters(&mut m, t0());
    let at = t0() + Duration::seconds(60);
    let warn = |m: &mut Machine, c: &str, pod: &str, msg: &str, at: DateTime<Utc>| {
        let e = env(c, at, 1, event(pod, "BackOff", msg, at));
        m.apply(Input::Event(&e))
    };
    // a workload crashlooping on 1.24 clusters (c1, c2: the bare message) and on 1.26+ ones (c3, c4: the
    // container and pod named)
    let bare = "Back-off restarting failed container";
    let named = |pod: &str| {
        format!(
            "Back-off restarting failed container web in pod {pod}_shop(27cd5a7f-596e-464f-a5f6-ade4d24034cd)"
        )
    };
    let (p1, p2, p3, p4) = (
        "web-7d4b9c8f5-x2x9k",
        "web-7d4b9c8f5-q8w7r",
        "web-7d4b9c8f5-z5r2t",
        "web-7d4b9c8f5-m4n7b",
    );
    warn(&mut m, "c1", p1, bare, at);
    let f = fleet_incidents(&warn(&mut m, "c2", p2, bare, at)).remove(0);
    assert_eq!(f.members.len(), 2);
    // the fleet as an older correlator kept it (messages compared word for word): this one under its
    // own problem id, and the 1.26+ clusters' as another fleet incident under another
    let digest_of = |c: &str, pod: &str, msg: &str| {
        crate::mask::fingerprint(c, "Pod", "shop", pod, "BackOff", msg)
    };
    let mut old = f.clone();
    old.labels.insert("problem".into(), "older-bare".into());
    let mut other = f.clone();
    other.id = "fleet-older-named".into();
    other.labels.insert("problem".into(), "older-named".into());
    for (m, (c, pod)) in other.members.iter_mut().zip([("c3", p3), ("c4", p4)]) {
        m.cluster = c.into();
        m.incident_id = digest_of(c, pod, &named(pod));
    }
    let key = |f: &FleetIncident| crate::fleet::key_of(f);
    // and an earlier episode of the problem, resolved, under the key it has now
    let mut earlier = f.clone();
    earlier.id = "fleet-earlier".into();
    earlier.status = IncidentStatus::Resolved;
    earlier.opened_at = at - Duration::hours(2);
    earlier.resolved_at = Some(at - Duration::hours(1));
    let kept = BTreeMap::from([
        (key(&earlier), earlier.clone()),
        (key(&old), old.clone()),
        (key(&other), other.clone()),
    ]);
    let mut again = restored(snapshot_of(&m, kept.clone()));
    // what the store holds after each batch
    let mut store = kept;
    let write = |store: &mut BTreeMap<String, FleetIncident>, m: &mut Machine| {
        let changes = m.take_changes().fleet;
        for (k, v) in &changes {
            match v {
                Some(v) => store.insert(k.clone(), v.clone()),
                None => store.remove(k),
            };
        }
        changes
    };
    let later = at + Duration::seconds(30);
    // c1's digest again: its incident carries on (same id) under the problem's id now, the old key dropped
    let outs = {
        let e = env("c1", later, 2, event(p1, "BackOff", bare, later));
        let mut outs = again.apply(Input::Event(&e));
        outs.extend(again.settle());
        outs
    };
    let moved = fleet_incidents(&outs);
    assert_eq!(moved.len(), 1, "{moved:#?}");
    assert_eq!(moved[0].id, f.id);
    assert_eq!(moved[0].labels["problem"], f.labels["problem"]);
    let stored = write(&mut store, &mut again);
    assert!(
        stored.iter().any(|(k, v)| *k == key(&old) && v.is_none()),
        "the old key is dropped: {:?}",
        stored
            .iter()
            .map(|(k, v)| (k, v.is_some()))
            .collect::<Vec<_>>()
    );
    // the earlier episode it displaced is kept aside
    assert_eq!(
        store.get(&format!("{}#{}", key(&f), earlier.id)),
        Some(&earlier)
    );
    // c3's digest: the other one's members join it, and the other resolves, its members gone to it
    let outs = {
        let e = env("c3", later, 2, event(p3, "BackOff", &named(p3), later));
        let mut outs = again.apply(Input::Event(&e));
        outs.extend(again.settle());
        outs
    };
    let changed = fleet_incidents(&outs);
    let one = changed.iter().find(|x| x.id == f.id).expect("it changed");
    let clusters: BTreeSet<&str> = one.members.iter().map(|m| m.cluster.as_str()).collect();
    assert_eq!(clusters, BTreeSet::from(["c1", "c2", "c3", "c4"]));
    assert!(
        one.summary.contains("on 4 of 6 clusters"),
        "{}",
        one.summary
    );
    let ended = changed
        .iter()
        .find(|x| x.id == other.id)
        .expect("the other changed");
    assert_eq!(ended.status, IncidentStatus::Resolved);
    assert!(
        ended
            .members
            .iter()
            .all(|m| m.left_because == format!("the same problem as fleet incident {}", f.id))
    );
    let open: Vec<String> = again
        .current_fleet(false)
        .into_iter()
        .map(|x| x.id)
        .collect();
    assert_eq!(open, vec![f.id.clone()]);
    // read back after a restart: the same three, the one open under the problem's key
    write(&mut store, &mut again);
    let restarted = restored(snapshot_of(&again, store));
    let all: BTreeMap<String, IncidentStatus> = restarted
        .current_fleet(true)
        .into_iter()
        .map(|x| (x.id, x.status))
        .collect();
    assert_eq!(
        all,
        BTreeMap::from([
            (f.id.clone(), IncidentStatus::Open),
            (other.id.clone(), IncidentStatus::Resolved),
            (earlier.id.clone(), IncidentStatus::Resolved),
        ])
    );
    assert_eq!(
        restarted
            .fleet
            .incidents
            .get(&key(&f))
            .map(|x| x.id.as_str()),
        Some(f.id.as_str())
    );
}

#[test]
fn a_fault_that_follows_a_release_to_two_clusters_names_the_release_first_staggered_or_not() {
    let mut m = machine();
    six_clusters(&mut m, t0());
    // a release changes the coredns Deployment on c3 and c5 only; web churns everywhere
    for c in ["c1", "c2", "c3", "c4", "c5", "c6"] {
        change(&mut m, c, "web", "aaaa0002", t0() + Duration::seconds(30));
    }
    for c in ["c3", "c5"] {
        change(
            &mut m,
            c,
            "coredns",
            "cccc0009",
            t0() + Duration::seconds(40),
        );
    }
    // DNS fails on c3, and on c5 two minutes later
    let at = t0() + Duration::seconds(60);
    rounds(&mut m, "c3", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
    let outs = rounds(
        &mut m,
        "c5",
        "coredns",
        ProbeStatus::Unhealthy,
        1,
        3,
        at + Duration::minutes(2),
    );
    let f = fleet_incidents(&outs);
    assert_eq!(f.len(), 1, "two minutes apart is within the window");
    let f = &f[0];
    let first = &f.suspects[0];
    assert_eq!(
        (
            first.verdict,
            first.object.name.as_str(),
            first.failing,
            first.healthy
        ),
        (SuspectVerdict::Suspect, "coredns", 2, 0)
    );
    assert!(
        f.suspects
            .iter()
            .any(|s| s.object.name == "web" && s.verdict == SuspectVerdict::Common)
    );
    assert!(f.summary.contains("first suspect: Deployment kube-system/coredns changed on 2 of 2 failing clusters, 0 of 4 healthy"), "{}", f.summary);
    // c3 and c5 share nothing the others lack but being the release's target: no attribute separates them
    assert!(
        f.shared.iter().all(|s| s.failing < 2 || s.healthy > 0),
        "{:#?}",
        f.shared
    );
}

fn batch(
    name: &str,
    revision: u64,
    index: u32,
    clusters: &[&str],
    at: DateTime<Utc>,
) -> Envelope<multipilot_schemas::payload::ReleaseEvent> {
    Envelope::new(
        "fleet",
        "release/test",
        at,
        index as u64,
        multipilot_schemas::payload::ReleaseEvent {
            release: name.into(),
            revision,
            what: multipilot_schemas::payload::ReleaseEntry::Batch,
            state: multipilot_schemas::payload::ReleaseState::Applying,
            actor: "alice".into(),
            batch: Some(index),
            clusters: clusters.iter().map(|c| c.to_string()).collect(),
            ok: true,
            summary: format!("batch {index} starts"),
            detail: serde_json::json!({}),
            commit: Some("3f2a9c1d0e7b44aa".into()),
            at,
        },
    )
}

#[test]
fn a_release_that_reached_only_the_failing_clusters_is_the_first_suspect_even_when_read_late() {
    // c5 and c6 got release `web` revision 3 in batch 1; `agents` revision 7 reached every cluster
    let at = t0() + Duration::seconds(120);
    for late in [false, true] {
        let mut m = machine();
        six_clusters(&mut m, t0());
        let web = batch("web", 3, 1, &["c5", "c6"], t0() + Duration::seconds(60));
        let everywhere = batch(
            "agents",
            7,
            1,
            &["c1", "c2", "c3", "c4", "c5", "c6"],
            t0() + Duration::seconds(70),
        );
        m.apply(Input::Release(&everywhere));
        if !late {
            m.apply(Input::Release(&web));
        }
        rounds(&mut m, "c5", "coredns", ProbeStatus::Unhealthy, 1, 3, at);
        let mut outs = rounds(
            &mut m,
            "c6",
            "coredns",
            ProbeStatus::Unhealthy,
            1,
            3,
            at + Duration::seconds(5),
        );
        if late {
            // the release's record read after the fleet incident opened: it is judged again
            assert!(
                fleet_incidents(&outs)[0]
                    .suspects
                    .iter()
                    .all(|s| s.object.name != "web")
            );
            outs = m.apply(Input::Release(&web));
        }
        let f = fleet_incidents(&outs)
            .pop()
            .expect("a fleet incident revision");
        let first = &f.suspects[0];
        assert_eq!(first.verdict, SuspectVerdict::Suspect, "{:#?}", f.suspects);
        assert_eq!(
            first.release,
            Some(ReleaseRef {
                name: "web".into(),
                revision: 3,
                batch: Some(1),
                commit: Some("3f2a9c1d0e7b44aa".into()),
            })
        );
        assert_eq!((first.failing, first.healthy), (2, 0));
        assert!(
            f.summary
                .contains("first suspect: release web revision 3 (batch 1, commit 3f2a9c1d0e7b) reached 2 of 2 failing clusters, 0 of 4 healthy"),
            "{}",
            f.summary
        );
        // the release that reached every cluster is named as what it is
        let agents = f
            .suspects
            .iter()
            .find(|s| s.object.name == "agents")
            .expect("the fleet-wide release listed");
        assert_eq!(agents.verdict, SuspectVerdict::Common);
    }
}

#[test]
fn what_was_rolled_out_where_long_ago_is_a_shared_attribute_until_rolled_back() {
    // a week ago: policy bundle `netpol` revision 2 from fleet repository `fleet` reached c5 and c6
    // only; release `agents` revision 7 reached every cluster. Both are far outside any lookback.
    let long_ago = t0() - Duration::days(7);
    let rolled_out = |m: &mut Machine| {
        let mut netpol = batch("netpol", 2, 1, &["c5", "c6"], long_ago);
        netpol.payload.detail = serde_json::json!({"policy": true, "repo": "fleet"});
        m.apply(Input::Release(&netpol));
        m.apply(Input::Release(&batch(
            "agents",
            7,
            1,
            &["c1", "c2", "c3", "c4", "c5", "c6"],
            long_ago + Duration::minutes(1),
        )));
    };
    let mut m = machine();
    six_clusters(&mut m, t0());
    rolled_out(&mut m);
    let f = dns_fails_on(&mut m, ["c5", "c6"], t0() + Duration::seconds(60));
    let netpol = f
        .shared
        .iter()
        .find(|s| s.attribute == "policy:netpol")
        .unwrap_or_else(|| panic!("{:#?}", f.shared));
    assert_eq!(
        (
            netpol.value.as_str(),
            netpol.failing,
            netpol.healthy,
            netpol.support.as_str()
        ),
        (
            "revision 2",
            2,
            0,
            "2 of 2 failing run policy bundle netpol revision 2; 0 of 4 healthy do"
        )
    );
    let commit = f
        .shared
        .iter()
        .find(|s| s.attribute == "gitops:fleet")
        .unwrap_or_else(|| panic!("{:#?}", f.shared));
    assert_eq!(commit.value, "commit 3f2a9c1d0e7b44aa");
    // what every cluster runs separates nothing; nor is a week-old rollout a suspect
    assert!(!f.shared.iter().any(|s| s.attribute == "release:agents"));
    assert!(
        f.suspects.iter().all(|s| s.release.is_none()),
        "{:#?}",
        f.suspects
    );

    // once the bundle is rolled back there, the clusters no longer run it
    let mut m = machine();
    six_clusters(&mut m, t0());
    rolled_out(&mut m);
    let mut back = batch("netpol", 2, 1, &["c5", "c6"], long_ago + Duration::hours(1));
    back.payload.what = multipilot_schemas::payload::ReleaseEntry::RolledBack;
    m.apply(Input::Release(&back));
    let f = dns_fails_on(&mut m, ["c5", "c6"], t0() + Duration::seconds(60));
    assert!(
        !f.shared.iter().any(|s| s.attribute.starts_with("policy:")),
        "{:#?}",
        f.shared
    );
}

#[test]
fn a_batch_stopped_before_it_changed_a_cluster_did_not_reach_it() {
    // `web` revision 3's batch 1 (c5, c6) started; the release was rolled back having changed only c5
    // (c6's apply never began), or none of them
    for changed in [vec!["c5"], vec![]] {
        let mut m = machine();
        six_clusters(&mut m, t0());
        m.apply(Input::Release(&batch(
            "web",
            3,
            1,
            &["c5", "c6"],
            t0() + Duration::seconds(60),
        )));
        let mut back = batch("web", 3, 1, &[], t0() + Duration::seconds(80));
        back.payload.what = multipilot_schemas::payload::ReleaseEntry::RolledBack;
        back.payload.batch = None;
        back.payload.clusters = changed.iter().map(|c| c.to_string()).collect();
        m.apply(Input::Release(&back));
        // no cluster runs the rolled-back revision
        for c in ["c5", "c6"] {
            assert!(!m.clusters[c].running.contains_key("web"), "{c}");
        }
        let f = dns_fails_on(&mut m, ["c5", "c6"], t0() + Duration::seconds(120));
        assert!(
            !f.shared.iter().any(|s| s.attribute.starts_with("release:")),
            "{:#?}",
            f.shared
        );
        // it reached at most one of the two failing clusters: not a suspect (it would be with both)
        assert!(
            f.suspects.iter().all(|s| s.object.name != "web"),
            "{:#?}",
            f.suspects
        );
        // it did change c5 for 20 s: that change reached c5 and is remembered there, not on c6
        let reached = |c: &str| m.clusters[c].releases.iter().any(|(_, r)| r.name == "web");
        assert_eq!(reached("c5"), !changed.is_empty());
        assert!(!reached("c6"));
    }

    // the fleet incident judged before the rollback was read: judged again without that suspect
    let mut m = machine();
    six_clusters(&mut m, t0());
    m.apply(Input::Release(&batch(
        "web",
        3,
        1,
        &["c5", "c6"],
        t0() + Duration::seconds(60),
    )));
    let f = dns_fails_on(&mut m, ["c5", "c6"], t0() + Duration::seconds(120));
    assert!(f.suspects.iter().any(|s| s.object.name == "web"), "{f:#?}");
    let mut back = batch("web", 3, 1, &[], t0() + Duration::seconds(150));
    back.payload.what = multipilot_schemas::payload::ReleaseEntry::RolledBack;
    back.payload.batch = None;
    let again = fleet_incidents(&m.apply(Input::Release(&back)))
        .pop()
        .expect("judged again");
    assert!(
        again.suspects.iter().all(|s| s.object.name != "web"),
        "{:#?}",
        again.suspects
    );
}

/// The one case that touches a disk: whatever the machine changes, committed step by step as the service
/// commits it (each part of a cluster marked as it changes) and read back, is the machine it was.
#[tokio::test]
async fn a_machine_committed_step_by_step_reads_back_from_the_store_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::store::Store::open(dir.path(), 1 << 20).unwrap();
    let mut outbox = crate::store::Outbox::default();
    let mut m = machine();
    let at = t0();
    // the correlator watches from the start (a silence counts from its first tick)
    m.apply(Input::Tick(at));
    let mut commit = |m: &mut Machine| {
        outbox.push(m.settle());
        store.write(m.take_changes(), &mut outbox).unwrap();
    };
    // two of the compared ConfigMaps: their settings are part of the cluster's record
    let config_map = |name: &str, data: &str| ResourceState {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: Some("kube-system".into()),
        name: name.into(),
        uid: format!("uid-{name}-cm"),
        spec_hash: format!("h-{data}"),
        spec: Some(serde_json::json!({"data": {"config": data}})),
        ..sample()
    };
    let mut seq = 0;
    let mut next = || {
        seq += 1;
        seq
    };
    for step in 0..6i64 {
        let t = at + Duration::seconds(step * 10);
        m.apply(Input::Heartbeat(&env("c1", t, next(), heartbeat()), t));
        commit(&mut m);
        let status = if step < 3 {
            ProbeStatus::Unhealthy
        } else {
            ProbeStatus::Healthy
        };
        let p = env("c1", t, next(), probe("coredns", status, step as u64));
        m.apply(Input::Probe(&p, t));
        commit(&mut m);
        if step == 0 {
            let f = env("c1", t, next(), facts(31));
            m.apply(Input::Facts(&f));
            let proxy = env(
                "c1",
                t,
                next(),
                StateMsg::State(config_map("kube-proxy", "iptables")),
            );
            m.apply(Input::State(&proxy));
            commit(&mut m);
        }
        let d = env(
            "c1",
            t,
            next(),
            StateMsg::State(deployment("coredns", &format!("hash-{step}"))),
        );
        m.apply(Input::State(&d));
        let cm = env(
            "c1",
            t,
            next(),
            StateMsg::State(config_map("coredns", &format!("cache {step}"))),
        );
        m.apply(Input::State(&cm));
        commit(&mut m);
        m.apply(Input::Event(&failed_mount(step, "web-0", t)));
        commit(&mut m);
    }
    // a compared ConfigMap deleted (its settings leave the record), and a silence long enough to make the
    // cluster unreachable
    let gone = env(
        "c1",
        at + Duration::seconds(61),
        next(),
        StateMsg::Deleted(ResourceDeleted {
            kind: "ConfigMap".into(),
            namespace: Some("kube-system".into()),
            name: "kube-proxy".into(),
            ..sample()
        }),
    );
    m.apply(Input::State(&gone));
    commit(&mut m);
    // each part's last change comes after anything else that writes that part
    let last = at + Duration::seconds(62);
    let cm = env(
        "c1",
        last,
        next(),
        StateMsg::State(config_map("coredns", "last")),
    );
    m.apply(Input::State(&cm));
    commit(&mut m);
    m.apply(Input::Tick(at + Duration::minutes(10)));
    commit(&mut m);
    let back = at + Duration::minutes(10);
    m.apply(Input::Heartbeat(
        &env("c1", back, next(), heartbeat()),
        back,
    ));
    outbox.push(m.settle());
    store.write(m.take_all_changes(), &mut outbox).unwrap();
    store.close().await.unwrap();

    let store = crate::store::Store::open(dir.path(), 1 << 20).unwrap();
    let (snapshot, _) = store.load().unwrap();
    let again = restored(snapshot);
    let (was, now) = (&m.clusters["c1"], &again.clusters["c1"]);
    assert_eq!(was.hb_streak, 1, "back after the silence");
    assert!(!was.probes.is_empty() && !was.changes.is_empty() && !was.warnings.is_empty());
    assert_eq!(was.settings.len(), 1, "{:?}", was.settings);
    assert_eq!(now, was);
    assert_eq!(again.current(true), m.current(true));
    store.close().await.unwrap();
}
