//! Evidence scoring: what an incident shows as the reasons behind it, ranked. Candidates are the cluster's
//! recent spec changes, the probe's own trend and the cluster's recent deduplicated warning events; each gets
//! a score from its relevance to the finding and its recency, and the best `max_items` are kept.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use multipilot_schemas::payload::{Evidence, EvidenceKind, ObjectRef, Severity};

use crate::dedup::Dedup;
use crate::rules::EvidenceRule;
use crate::state::{ChangeRec, ClusterState};

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

/// `Kind ns/name` (or `Kind name` for a cluster-scoped object).
pub fn obj_label(o: &ObjectRef) -> String {
    match &o.namespace {
        Some(ns) => format!("{} {ns}/{}", o.kind, o.name),
        None => format!("{} {}", o.kind, o.name),
    }
}

fn window(rule: &EvidenceRule) -> Duration {
    Duration::from_std(rule.change_window).unwrap_or(Duration::minutes(30))
}

fn recent_changes<'a>(
    c: &'a ClusterState,
    rule: &EvidenceRule,
    at: DateTime<Utc>,
) -> impl Iterator<Item = &'a ChangeRec> {
    let since = at - window(rule);
    c.changes
        .iter()
        .filter(move |ch| ch.at <= at && ch.at >= since)
}

fn same_object(a: &ObjectRef, b: &ObjectRef) -> bool {
    a.kind == b.kind && a.namespace == b.namespace && a.name == b.name
}

/// The evidence for a finding on `cluster` at `at` (from `probe`, when a probe raised it), ranked from 1.
pub fn gather(
    rule: &EvidenceRule,
    cluster: &str,
    state: Option<&ClusterState>,
    dedup: &Dedup,
    probe: Option<&str>,
    at: DateTime<Utc>,
) -> Vec<Evidence> {
    let window = window(rule);
    let mut scored: Vec<(f64, Evidence)> = Vec::new();
    if let Some(c) = state {
        let track = probe.and_then(|p| c.probes.get(p));
        let related: &[ObjectRef] = track.map(|t| t.related.as_slice()).unwrap_or_default();
        for ch in recent_changes(c, rule, at) {
            let age = (at - ch.at).num_seconds().max(0) as f64;
            // recency, then relevance: the object a finding names, one named like the probe, its namespace;
            // an unrelated change ranks below the probe's own trend and related events
            let mut score = 1.0 - age / window.num_seconds().max(1) as f64;
            if related.iter().any(|o| same_object(o, &ch.object)) {
                score += 5.0;
            } else if probe.is_some_and(|p| ch.object.name.contains(p)) {
                score += 4.0;
            } else if related
                .iter()
                .any(|o| o.namespace.is_some() && o.namespace == ch.object.namespace)
            {
                score += 2.0;
            }
            scored.push((
                score,
                Evidence {
                    rank: 0,
                    kind: EvidenceKind::Change,
                    summary: format!(
                        "{} changed (spec {} → {}) {} before",
                        obj_label(&ch.object),
                        &ch.from[..ch.from.len().min(8)],
                        &ch.to[..ch.to.len().min(8)],
                        secs(at - ch.at)
                    ),
                    cluster_time: ch.at,
                    object: Some(ch.object.clone()),
                },
            ));
        }
        if let Some(trend) = track.and_then(|t| trend(probe.unwrap_or(""), t)) {
            scored.push((2.5, trend));
        }
    }
    for r in dedup.recent(cluster, at - window, 3) {
        let sev = match r.severity {
            Severity::Critical => 0.6,
            Severity::Warning => 0.4,
            Severity::Info => 0.0,
        };
        scored.push((
            1.5 + sev,
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
            },
        ));
    }
    scored.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(b.1.cluster_time.cmp(&a.1.cluster_time))
    });
    scored
        .into_iter()
        .take(rule.max_items)
        .enumerate()
        .map(|(i, (_, mut e))| {
            e.rank = i as u32 + 1;
            e
        })
        .collect()
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
    })
}

/// `; 2 deployments, 1 daemonset changed there in the 4m before` for a summary template's `{changes}`, or
/// nothing when no workload changed within the evidence window.
pub fn changes_phrase(
    rule: &EvidenceRule,
    state: Option<&ClusterState>,
    at: DateTime<Utc>,
) -> String {
    let Some(c) = state else {
        return String::new();
    };
    let recent: Vec<&ChangeRec> = recent_changes(c, rule, at)
        .filter(|ch| {
            matches!(
                ch.object.kind.as_str(),
                "Deployment" | "DaemonSet" | "StatefulSet" | "CronJob"
            )
        })
        .collect();
    if recent.is_empty() {
        return String::new();
    }
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for ch in &recent {
        *kinds.entry(ch.object.kind.as_str()).or_default() += 1;
    }
    let what = kinds
        .iter()
        .map(|(k, n)| format!("{n} {}{}", k.to_lowercase(), if *n == 1 { "" } else { "s" }))
        .collect::<Vec<_>>()
        .join(", ");
    let earliest = recent.iter().map(|c| c.at).min().unwrap_or(at);
    format!(
        "; {what} changed there in the {} before",
        secs(at - earliest)
    )
}
