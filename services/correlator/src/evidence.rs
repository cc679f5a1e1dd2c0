//! Evidence: what an incident shows as the reasons behind it, ranked, each with why it was chosen.
//!
//! - A probe's finding, ranked:
//!   1. a change to another object the finding names (the device plugin's DaemonSet when a node's driver
//!      no longer fits): the likelier cause;
//!   2. the finding itself: what happened to the failing object (a node's Ready condition turning False,
//!      an object stuck on its finalizers), since when;
//!   3. a change to the failing object itself, then warnings on objects the finding names or on objects
//!      named like the probe, then the probe's own trend (only when it moved) and the cluster's other
//!      recent rollouts (Deployments, DaemonSets, StatefulSets, CronJobs), by recency. Only the latest
//!      change of each object counts; other kinds' changes count only when the finding names them.
//!
//!   Warnings that bear on nothing the finding names are evidence only when nothing else is; normal
//!   lifecycle events (`Scheduled`, `Pulled`, `Created`, `Started`, `Killing`, `SuccessfulCreate`, …)
//!   never are.
//! - A baseline check: the check's own finding and the objects violating it — never unrelated events.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use multipilot_schemas::payload::{ComplianceCheck, Evidence, EvidenceKind, ObjectRef, Severity};

use crate::dedup::{Dedup, Record};
use crate::rules::EvidenceRule;
use crate::state::{ChangeRec, ClusterState};

/// Event reasons of normal lifecycle: what happens to every healthy object, never evidence of a problem
/// (kubelet, scheduler, controller-manager, cluster-autoscaler and ingress-nginx reasons).
pub const LIFECYCLE_REASONS: &[&str] = &[
    // kubelet
    "Scheduled",
    "Pulling",
    "Pulled",
    "Created",
    "Started",
    "Killing",
    "SandboxChanged",
    "NodeReady",
    "NodeAllocatableEnforced",
    "Starting",
    "RegisteredNode",
    // controller-manager
    "SuccessfulCreate",
    "SuccessfulDelete",
    "ScalingReplicaSet",
    "SuccessfulRescale",
    "Completed",
    "SawCompletedJob",
    "SuccessfulAttachVolume",
    "ProvisioningSucceeded",
    "ExternalProvisioning",
    "LeaderElection",
    // cluster-autoscaler
    "ScaledUpGroup",
    "ScaleDown",
    "TriggeredScaleUp",
    // ingress-nginx
    "Sync",
    "RELOAD",
];

/// Whether an event reason is normal lifecycle (never evidence).
pub fn is_lifecycle(reason: &str) -> bool {
    LIFECYCLE_REASONS.contains(&reason)
}

/// A short duration for a person: `42s`, `17m`, `3h5m`.
pub fn secs(d: Duration) -> String {
    let s = d.num_seconds().max(0);
    if s < 120 {
        format!("{s}s")
    } else if s < 7200 {
        format!("{}m", s / 60)
    } else {
        format!("{}h{}m", s / 3600, (s % 3600) / 60)
    }
}

/// `4m before` `at`, or `as it began` for a change reported a moment after it ([`REPORTED_LATE`]).
fn before(at: DateTime<Utc>, t: DateTime<Utc>) -> String {
    if t > at {
        "as it began".to_string()
    } else {
        format!("{} before", secs(at - t))
    }
}

/// `Kind ns/name` (or `Kind name` for a cluster-scoped object).
pub fn obj_label(o: &ObjectRef) -> String {
    match &o.namespace {
        Some(ns) => format!("{} {ns}/{}", o.kind, o.name),
        None => format!("{} {}", o.kind, o.name),
    }
}

/// Kinds whose change is evidence even when the finding names nothing about them: rollouts.
const WORKLOAD_KINDS: &[&str] = &["Deployment", "DaemonSet", "StatefulSet", "CronJob"];

fn window(rule: &EvidenceRule) -> Duration {
    Duration::from_std(rule.change_window).unwrap_or(Duration::minutes(30))
}

/// How long after `at` a change still counts as before it: the agent's watch and its probe round race, and
/// a change that caused the failure a round found may be reported a moment after that round.
pub(crate) const REPORTED_LATE: Duration = Duration::seconds(5);

/// The cluster's changes in the evidence window before `at` (and [`REPORTED_LATE`] after it).
fn recent_changes<'a>(
    c: &'a ClusterState,
    rule: &EvidenceRule,
    at: DateTime<Utc>,
) -> impl Iterator<Item = &'a ChangeRec> {
    let since = at - window(rule);
    c.changes
        .iter()
        .filter(move |ch| ch.at <= at + REPORTED_LATE && ch.at >= since)
}

/// [`recent_changes`], each object's latest only (its earlier ones are history, not evidence), oldest first.
fn latest_changes<'a>(
    c: &'a ClusterState,
    rule: &EvidenceRule,
    at: DateTime<Utc>,
) -> Vec<&'a ChangeRec> {
    let mut latest: BTreeMap<(&str, Option<&str>, &str), &ChangeRec> = BTreeMap::new();
    for ch in recent_changes(c, rule, at) {
        let o = &ch.object;
        latest.insert((&o.kind, o.namespace.as_deref(), &o.name), ch);
    }
    let mut latest: Vec<&ChangeRec> = latest.into_values().collect();
    latest.sort_by_key(|ch| ch.at);
    latest
}

fn same_object(a: &ObjectRef, b: &ObjectRef) -> bool {
    a.kind == b.kind && a.namespace == b.namespace && a.name == b.name
}

/// Kinds whose pods are named after them (`<name>-<generated>`).
const POD_OWNERS: &[&str] = &["Deployment", "DaemonSet", "StatefulSet", "Job"];

/// The least [`relevance`] of an object the finding is about: it names it, or it is named like the probe.
const NAMED: f64 = 4.0;

/// How an object bears on a finding that names `related` objects and comes from `probe`: a score bonus
/// and the words saying why.
fn relevance(
    object: &ObjectRef,
    related: &[ObjectRef],
    probe: Option<&str>,
) -> (f64, &'static str) {
    // a dedup record's name is masked (`coredns-*`): it is the object the finding names when that name
    // masks the same way
    let named = |o: &ObjectRef| {
        same_object(o, object)
            || (o.kind == object.kind
                && o.namespace == object.namespace
                && crate::mask::mask_name(&o.name) == object.name)
    };
    // a workload's pods are what it runs: a DaemonSet's `calico-node-*`, a Deployment's `coredns-*`
    let runs = |o: &ObjectRef| {
        object.kind == "Pod"
            && o.namespace == object.namespace
            && POD_OWNERS.contains(&o.kind.as_str())
            && crate::mask::mask_name(&object.name)
                == format!("{}-*", crate::mask::mask_name(&o.name))
    };
    if related.iter().any(named) {
        (5.0, "the finding names this object")
    } else if related.iter().any(runs) {
        (5.0, "a pod of a workload the finding names")
    } else if probe.is_some_and(|p| object.name.contains(p)) {
        (NAMED, "named like the failing probe")
    } else if related
        .iter()
        .any(|o| o.namespace.is_some() && o.namespace == object.namespace)
    {
        (2.0, "in the namespace of an object the finding names")
    } else {
        (0.0, "")
    }
}

/// The evidence for a finding on `cluster` at `at` (from `probe`, when a probe raised it), ranked from 1.
pub fn gather(
    rule: &EvidenceRule,
    cluster: &str,
    state: Option<&ClusterState>,
    dedup: &Dedup,
    probe: Option<&str>,
    at: DateTime<Utc>,
    onset: DateTime<Utc>,
) -> Vec<Evidence> {
    let window = window(rule);
    let mut scored: Vec<(f64, Evidence)> = Vec::new();
    let track = state.zip(probe).and_then(|(c, p)| c.probes.get(p));
    let related: &[ObjectRef] = track.map(|t| t.related.as_slice()).unwrap_or_default();
    if let Some(c) = state {
        // changes are weighed up to when it began failing: what changed after is no cause, and an open
        // incident updated later keeps the changes that came before it
        let at = onset.min(at);
        for ch in latest_changes(c, rule, at) {
            let age = (at - ch.at).num_seconds().max(0) as f64;
            // relevance first, then recency; an unrelated change ranks below the probe's own trend and
            // the related events. A change to the failing object itself (the finding's first) ranks
            // just below the finding, which says what happened to it; a change to another object the
            // finding names (the device plugin's DaemonSet for a node's driver) is the likelier cause
            // and ranks above it.
            let (mut bonus, why) = relevance(&ch.object, related, probe);
            if why.is_empty() && !WORKLOAD_KINDS.contains(&ch.object.kind.as_str()) {
                // a ConfigMap or Service changing somewhere else on the cluster explains nothing a probe
                // found; a rollout might (an overload after a deploy)
                continue;
            }
            if related.first().is_some_and(|p| same_object(p, &ch.object)) {
                bonus = bonus.min(4.4);
            }
            let score = bonus + 1.0 - age / window.num_seconds().max(1) as f64;
            let when = before(at, ch.at);
            let why = if why.is_empty() {
                format!("changed on this cluster {when}")
            } else {
                format!("{why}; it changed {when}")
            };
            scored.push((
                score,
                Evidence {
                    rank: 0,
                    kind: EvidenceKind::Change,
                    summary: format!(
                        "{} changed (spec {} → {}) {when}",
                        obj_label(&ch.object),
                        &ch.from[..ch.from.len().min(8)],
                        &ch.to[..ch.to.len().min(8)],
                    ),
                    cluster_time: ch.at,
                    object: Some(ch.object.clone()),
                    why,
                },
            ));
        }
        // what the probe found (a node's Ready condition turning False, an object stuck on its finalizer):
        // first, unless a change to the object it names came before it (the likelier cause)
        // (without a finding, the probe's own detail — `/readyz/etcd: HTTP 500 …` — below its trend: an
        // overload's latency curve says more than its last reading)
        if let Some(t) = track.filter(|t| !t.finding.is_empty() || t.failing_since.is_some()) {
            // when the streak began (`at` here: the onset), a healthy round between failing ones
            // notwithstanding
            let since = at;
            scored.push((
                if t.finding.is_empty() { 2.4 } else { 5.5 },
                Evidence {
                    rank: 0,
                    kind: EvidenceKind::Fact,
                    summary: if t.finding.is_empty() {
                        t.detail.clone()
                    } else {
                        t.finding.clone()
                    },
                    cluster_time: since,
                    object: t.related.first().cloned(),
                    why: format!(
                        "what the {} probe found, failing since {}",
                        probe.unwrap_or("cluster"),
                        since.format("%H:%M:%S")
                    ),
                },
            ));
        }
        if let Some(trend) = track.and_then(|t| trend(probe.unwrap_or(""), t)) {
            scored.push((2.5, trend));
        }
    }
    // warnings that bear on nothing the finding names are evidence only when there is nothing else (the
    // three most severe and recent); those that do are all weighed, however many others the cluster has
    let mut unrelated = Vec::new();
    for r in warnings(dedup, cluster, at - window) {
        let sev = match r.severity {
            Severity::Critical => 0.6,
            _ => 0.4,
        };
        // a related event ranks above the trend but below the change to the object the finding names: the
        // change is the likelier cause, the events its symptoms
        let (bonus, why) = relevance(&r.object, related, probe);
        let target = if why.is_empty() {
            if unrelated.len() == UNRELATED_WARNINGS {
                continue;
            }
            &mut unrelated
        } else {
            &mut scored
        };
        let why = if why.is_empty() {
            "a warning on this cluster in the same window".to_string()
        } else {
            format!("{why}: a warning on it")
        };
        target.push((
            bonus * 0.5 + 1.5 + sev,
            Evidence {
                rank: 0,
                kind: EvidenceKind::Event,
                summary: format!(
                    "{} ×{} on {}: {}",
                    r.reason,
                    r.count,
                    obj_label(&r.object),
                    r.last_message.chars().take(120).collect::<String>()
                ),
                cluster_time: r.last_seen,
                object: Some(r.object.clone()),
                why,
            },
        ));
    }
    if scored.is_empty() {
        scored = unrelated;
    }
    rank(scored, rule.max_items)
}

/// An open incident's evidence updated: `new`, with the changes `old` named in their places instead of its
/// own (what changed before the streak began is known when the incident opens; the change history held moves
/// on while it stays open, and must not take them away).
pub fn keep_changes(old: &[Evidence], new: Vec<Evidence>, max: usize) -> Vec<Evidence> {
    let kept: Vec<&Evidence> = old
        .iter()
        .filter(|e| e.kind == EvidenceKind::Change)
        .collect();
    if kept.is_empty() {
        return new;
    }
    let mut out: Vec<Evidence> = new
        .into_iter()
        .filter(|e| e.kind != EvidenceKind::Change)
        .collect();
    for e in kept {
        let at = (e.rank as usize).saturating_sub(1).min(out.len());
        out.insert(at, e.clone());
    }
    out.truncate(max);
    for (i, e) in out.iter_mut().enumerate() {
        e.rank = i as u32 + 1;
    }
    out
}

/// Warnings that bear on nothing a finding names, at most, as its evidence when nothing else is.
const UNRELATED_WARNINGS: usize = 3;

/// The cluster's recent warning events that can be evidence (no lifecycle reasons), most severe first.
fn warnings<'a>(
    dedup: &'a Dedup,
    cluster: &str,
    since: DateTime<Utc>,
) -> impl Iterator<Item = &'a Record> {
    dedup
        .recent(cluster, since, usize::MAX)
        .into_iter()
        .filter(|r| r.severity >= Severity::Warning && !is_lifecycle(&r.reason))
}

/// How many event digests an incident accounts for at most (see [`explained`]).
pub const MAX_EXPLAINED: usize = 32;

/// The event digests (their ids) a probe's finding on `cluster` accounts for: the recent warnings (in the
/// evidence window before `at`) on the objects the finding names and their pods, or on objects named like
/// the probe in the namespace of one it names (in `kube-system` when it names none) — a DNS failure's
/// `Unhealthy` on `kube-system/coredns-*` —; not an app's `milvus-etcd-0` for an etcd failure, nor what
/// only shares a namespace with them, nor any other warning of the cluster: an alert muted for them would
/// hide another problem.
pub fn explained(
    rule: &EvidenceRule,
    cluster: &str,
    state: Option<&ClusterState>,
    dedup: &Dedup,
    probe: &str,
    at: DateTime<Utc>,
) -> Vec<String> {
    let related: &[ObjectRef] = state
        .and_then(|c| c.probes.get(probe))
        .map(|t| t.related.as_slice())
        .unwrap_or_default();
    let near = |o: &ObjectRef| {
        if related.is_empty() {
            o.namespace.as_deref() == Some("kube-system")
        } else {
            related.iter().any(|r| r.namespace == o.namespace)
        }
    };
    let mut out: Vec<String> = warnings(dedup, cluster, at - window(rule))
        .filter(|r| {
            let (score, _) = relevance(&r.object, related, Some(probe));
            score > NAMED || (score == NAMED && near(&r.object))
        })
        .map(|r| r.id.clone())
        .take(MAX_EXPLAINED)
        .collect();
    out.sort();
    out
}

fn rank(mut scored: Vec<(f64, Evidence)>, max: usize) -> Vec<Evidence> {
    scored.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(b.1.cluster_time.cmp(&a.1.cluster_time))
    });
    scored
        .into_iter()
        .take(max)
        .enumerate()
        .map(|(i, (_, mut e))| {
            e.rank = i as u32 + 1;
            e
        })
        .collect()
}

/// The evidence of a failing baseline check: the finding itself, then the objects violating it.
pub fn of_check(rule: &EvidenceRule, check: &ComplianceCheck, at: DateTime<Utc>) -> Vec<Evidence> {
    let mut out = vec![Evidence {
        rank: 1,
        kind: EvidenceKind::Fact,
        summary: check.message.clone(),
        cluster_time: at,
        object: None,
        why: format!("what the baseline rule {} found", check.rule),
    }];
    let more = check
        .objects
        .len()
        .saturating_sub(rule.max_items.max(2) - 1);
    for (i, o) in check
        .objects
        .iter()
        .take(rule.max_items.max(2) - 1)
        .enumerate()
    {
        out.push(Evidence {
            rank: i as u32 + 2,
            kind: EvidenceKind::Fact,
            summary: if i + 1 == rule.max_items.max(2) - 1 && more > 0 {
                format!("{} (and {more} more)", obj_label(o))
            } else {
                obj_label(o)
            },
            cluster_time: at,
            object: Some(o.clone()),
            why: format!("violates {}", check.rule),
        });
    }
    out
}

/// The probe's observation that moved the most over its recent rounds (relative to its size): an
/// overload's latency, not the clock skew that happens to sort first.
fn trend(probe: &str, track: &crate::state::ProbeTrack) -> Option<Evidence> {
    let (t0, first) = track.history.front()?;
    let (t1, last) = track.history.back()?;
    let moved = |k: &String, v: f64| {
        let v0 = first[k];
        (v - v0).abs() / v0.abs().max(v.abs()).max(1e-9)
    };
    let (k, v1) = last
        .iter()
        .filter(|(k, v)| first.contains_key(*k) && v.is_finite())
        .max_by(|(ka, va), (kb, vb)| moved(ka, **va).total_cmp(&moved(kb, **vb)))?;
    // a measurement that did not move explains nothing
    if moved(k, *v1) < 0.05 {
        return None;
    }
    let v0 = first[k];
    Some(Evidence {
        rank: 0,
        kind: EvidenceKind::Trend,
        summary: format!(
            "{probe} {k}: {v0:.1} → {v1:.1} over {} rounds ({})",
            track.history.len(),
            secs(*t1 - *t0)
        ),
        cluster_time: *t1,
        object: None,
        why: "the probe's own measurement that moved the most".into(),
    })
}

/// `; 2 deployments, 1 daemonset changed there in the 4m before` for a summary template's `{changes}`, or
/// nothing when no workload changed within the evidence window. A change that `others` (the fleet's other
/// clusters) saw as often in the same window is ordinary churn, not a lead: it is counted apart
/// (`(8 more changed as often on the other clusters: ordinary churn)`), and when every change is churn the
/// phrase says so instead of pointing at them.
pub fn changes_phrase(
    rule: &EvidenceRule,
    state: Option<&ClusterState>,
    others: &[&ClusterState],
    at: DateTime<Utc>,
) -> String {
    let Some(c) = state else {
        return String::new();
    };
    let workload = |ch: &&ChangeRec| {
        matches!(
            ch.object.kind.as_str(),
            "Deployment" | "DaemonSet" | "StatefulSet" | "CronJob"
        )
    };
    let (recent, churn): (Vec<&ChangeRec>, Vec<&ChangeRec>) = latest_changes(c, rule, at)
        .into_iter()
        .filter(workload)
        .partition(|ch| !is_churn(rule, ch, others, at));
    let describe = |v: &[&ChangeRec]| {
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for ch in v {
            *kinds.entry(ch.object.kind.as_str()).or_default() += 1;
        }
        kinds
            .iter()
            .map(|(k, n)| format!("{n} {}{}", k.to_lowercase(), if *n == 1 { "" } else { "s" }))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (recent.is_empty(), churn.is_empty()) {
        (true, true) => String::new(),
        (true, false) => format!(
            "; {} changed there, as often as on the other clusters: ordinary churn",
            describe(&churn)
        ),
        (false, _) => {
            let earliest = recent.iter().map(|c| c.at).min().unwrap_or(at);
            let when = if earliest > at {
                before(at, earliest)
            } else {
                format!("in the {} before", secs(at - earliest))
            };
            let mut p = format!("; {} changed there {when}", describe(&recent));
            if !churn.is_empty() {
                p.push_str(&format!(
                    " ({} more changed as often on the other clusters: ordinary churn)",
                    churn.len()
                ));
            }
            p
        }
    }
}

/// Whether the object of `ch` changed on at least half of `others` (two or more) in the evidence window.
fn is_churn(
    rule: &EvidenceRule,
    ch: &ChangeRec,
    others: &[&ClusterState],
    at: DateTime<Utc>,
) -> bool {
    if others.len() < 2 {
        return false;
    }
    let seen = others
        .iter()
        .filter(|o| recent_changes(o, rule, at).any(|x| same_object(&x.object, &ch.object)))
        .count();
    seen * 2 >= others.len()
}
