//! Event deduplication: one record per problem with first/last seen (cluster_time), count, last message and
//! severity. Identity comes before text: an Event object seen before (its uid, re-recorded with a growing
//! count or series) belongs to the record it started, whatever its message says now — as long as it names
//! the record's object and reason, which an Event keeps for life (a uid met on another object belongs to a
//! cluster rebuilt under its old name, and is matched as new); a new Event object is
//! matched by [`crate::mask::fingerprint`] (involved object, reason and the masked message, which only tells
//! apart different problems on one object).
//!
//! What is passed on (the digest policy): a problem is **announced once** ([`Pass::New`]), announced again
//! only when its severity changes ([`Pass::Severity`]), and otherwise **updated in place**
//! ([`Pass::Update`]: same id, the count and last-seen so far) at most once per refresh interval while it
//! keeps occurring — never on every repeat. A reader keeps the latest digest per id; the alert router
//! refreshes the one alert (no new notification), and the refresh keeps that alert from expiring while the
//! problem lasts.
//!
//! Pure state: the records live in memory, and the records changed since the last
//! [`Dedup::take_changes`] are what the store writes ([`crate::store`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use multipilot_schemas::payload::{DigestPass, KubeEvent, ObjectRef, Severity};
use serde::{Deserialize, Serialize};

use crate::mask::{fingerprint, mask_name};

/// One deduplicated problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Stable id.
    pub id: String,
    /// Cluster.
    pub cluster: String,
    /// The object (name masked: the workload rather than one pod).
    pub object: ObjectRef,
    /// Reason.
    pub reason: String,
    /// Severity of the latest occurrence.
    pub severity: Severity,
    /// First occurrence (cluster clock).
    pub first_seen: DateTime<Utc>,
    /// Latest occurrence (cluster clock).
    pub last_seen: DateTime<Utc>,
    /// Occurrences received.
    pub count: u64,
    /// The latest message, as it came.
    pub last_message: String,
    /// The Event objects (uids) counted in this record, the latest last (at most [`MAX_EVENT_UIDS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_uids: Vec<String>,
    /// When (cluster clock) it was last passed on (announced or updated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed_at: Option<DateTime<Utc>>,
}

/// How often a problem that keeps occurring is updated in place, by default.
pub const DEFAULT_REFRESH: std::time::Duration = std::time::Duration::from_secs(300);

/// How many Event uids a record remembers (an Event object lives an hour; a problem that outlives many
/// of them is still matched by its fingerprint).
pub const MAX_EVENT_UIDS: usize = 16;

impl Record {
    /// Whether `e` is about this record's object and reason, which an Event object keeps for life (only
    /// its message, count and times change).
    fn is_about(&self, e: &KubeEvent) -> bool {
        self.reason == e.reason
            && self.object.kind == e.involved.kind
            && self.object.namespace.as_deref().unwrap_or_default()
                == e.involved.namespace.as_deref().unwrap_or_default()
            // masked again: a record stored by an older masker still matches its Events
            && mask_name(&self.object.name) == mask_name(&e.involved.name)
    }
}

/// Forgets that `uid` belongs to record `id`, unless it has since been found to belong to another one.
fn forget_uid(uids: &mut std::collections::HashMap<String, String>, uid: &str, id: &str) {
    if uids.get(uid).is_some_and(|owner| owner == id) {
        uids.remove(uid);
    }
}

/// Why a record was passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// First time seen: the announcement.
    New,
    /// Severity changed: announced again.
    Severity,
    /// Still occurring: the count and last-seen, updated in place.
    Update,
}

impl Pass {
    /// The reason as the digest's contract names it.
    pub fn reason(self) -> DigestPass {
        match self {
            Pass::New => DigestPass::New,
            Pass::Severity => DigestPass::Severity,
            Pass::Update => DigestPass::Update,
        }
    }

    /// Whether a person is told (an announcement), rather than a record updated in place.
    pub fn is_announcement(self) -> bool {
        matches!(self, Pass::New | Pass::Severity)
    }
}

/// The records, per cluster.
#[derive(Debug, Clone)]
pub struct Dedup {
    /// How often a problem that keeps occurring is updated.
    refresh: Duration,
    /// Each record shared with the changes taken last (written by the store; copied only if one changes
    /// while they are still held).
    by_cluster: BTreeMap<String, BTreeMap<String, Arc<Record>>>,
    /// cluster → Event uid → record id (nested, so a lookup needs no owned key).
    by_event: std::collections::HashMap<String, std::collections::HashMap<String, String>>,
    /// `(cluster, id)` of records changed or removed since the last [`Dedup::take_changes`].
    dirty: BTreeSet<(String, String)>,
}

impl Default for Dedup {
    fn default() -> Self {
        Dedup::with_refresh(DEFAULT_REFRESH)
    }
}

impl Dedup {
    /// An empty set of records, updated every [`DEFAULT_REFRESH`].
    pub fn new() -> Self {
        Dedup::default()
    }

    /// An empty set of records, updated every `refresh` while a problem keeps occurring.
    pub fn with_refresh(refresh: std::time::Duration) -> Self {
        Dedup {
            refresh: Duration::from_std(refresh).unwrap_or(Duration::minutes(5)),
            by_cluster: BTreeMap::new(),
            by_event: std::collections::HashMap::new(),
            dirty: BTreeSet::new(),
        }
    }

    /// Puts back a record read from the store (not marked changed).
    pub fn restore(&mut self, r: Record) {
        let uids = self.by_event.entry(r.cluster.clone()).or_default();
        for uid in &r.event_uids {
            uids.insert(uid.clone(), r.id.clone());
        }
        self.by_cluster
            .entry(r.cluster.clone())
            .or_default()
            .insert(r.id.clone(), Arc::new(r));
    }

    /// How many records are held.
    pub fn len(&self) -> usize {
        self.by_cluster.values().map(BTreeMap::len).sum()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.by_cluster.is_empty()
    }

    /// Records an event; returns the record and whether (and why) it is passed on.
    pub fn observe(&mut self, cluster: &str, e: &KubeEvent) -> (&Record, Option<Pass>) {
        if !self.by_cluster.contains_key(cluster) {
            self.by_cluster.insert(cluster.to_string(), BTreeMap::new());
        }
        if !self.by_event.contains_key(cluster) {
            self.by_event
                .insert(cluster.to_string(), Default::default());
        }
        let records = self
            .by_cluster
            .get_mut(cluster)
            .expect("the cluster's records were just made");
        let uids = self
            .by_event
            .get_mut(cluster)
            .expect("the cluster's uids were just made");
        // an Event object keeps its involved object and reason for life: a uid known for another object's
        // record is not that Event (a cluster rebuilt under its old name, a simulator restarted) and is
        // matched by its text
        let known = (!e.uid.is_empty())
            .then(|| uids.get(e.uid.as_str()))
            .flatten()
            .filter(|id| records.get(*id).is_some_and(|r| r.is_about(e)))
            .cloned();
        let id = known.unwrap_or_else(|| {
            let ns = e.involved.namespace.as_deref().unwrap_or_default();
            fingerprint(
                cluster,
                &e.involved.kind,
                ns,
                &e.involved.name,
                &e.reason,
                &e.message,
            )
        });
        let pass = match records.get_mut(&id) {
            None => {
                let r = Record {
                    id: id.clone(),
                    cluster: cluster.to_string(),
                    object: ObjectRef {
                        name: mask_name(&e.involved.name),
                        uid: None,
                        ..e.involved.clone()
                    },
                    reason: e.reason.clone(),
                    severity: e.severity,
                    first_seen: e.first_time.unwrap_or(e.last_time).min(e.last_time),
                    last_seen: e.last_time,
                    count: 1,
                    last_message: e.message.clone(),
                    event_uids: if e.uid.is_empty() {
                        Vec::new()
                    } else {
                        vec![e.uid.clone()]
                    },
                    passed_at: Some(e.last_time),
                };
                records.insert(id.clone(), Arc::new(r));
                Some(Pass::New)
            }
            Some(r) => {
                let r = Arc::make_mut(r);
                r.count += 1;
                // a late message doesn't move last_seen back
                if e.last_time >= r.last_seen {
                    r.last_seen = e.last_time;
                    r.last_message.clone_from(&e.message);
                }
                let due = r
                    .passed_at
                    .is_none_or(|at| r.last_seen - at >= self.refresh);
                let pass = if r.severity != e.severity {
                    Some(Pass::Severity)
                } else {
                    due.then_some(Pass::Update)
                };
                if pass.is_some() {
                    r.passed_at = Some(r.last_seen);
                }
                r.severity = e.severity;
                r.first_seen = r.first_seen.min(e.first_time.unwrap_or(e.last_time));
                if !e.uid.is_empty() && !r.event_uids.contains(&e.uid) {
                    r.event_uids.push(e.uid.clone());
                    if r.event_uids.len() > MAX_EVENT_UIDS {
                        let gone = r.event_uids.remove(0);
                        forget_uid(uids, &gone, &id);
                    }
                }
                pass
            }
        };
        if !e.uid.is_empty()
            && uids.get(e.uid.as_str()) != Some(&id)
            && let Some(before) = uids.insert(e.uid.clone(), id.clone())
        {
            // the uid was another record's (one about another object): it is no longer, nor after a restore
            if let Some(r) = records.get_mut(&before)
                && r.event_uids.contains(&e.uid)
            {
                Arc::make_mut(r).event_uids.retain(|u| *u != e.uid);
                self.dirty.insert((cluster.to_string(), before));
            }
        }
        self.dirty.insert((cluster.to_string(), id.clone()));
        (&records[&id], pass)
    }

    /// Records of a cluster seen since `since` (for evidence), the most severe and then the most recent
    /// first.
    pub fn recent(&self, cluster: &str, since: DateTime<Utc>, limit: usize) -> Vec<&Record> {
        let mut out: Vec<&Record> = self
            .by_cluster
            .get(cluster)
            .into_iter()
            .flat_map(BTreeMap::values)
            .map(|r| &**r)
            .filter(|r| r.last_seen >= since)
            .collect();
        out.sort_by(|a, b| {
            b.severity
                .cmp(&a.severity)
                .then(b.last_seen.cmp(&a.last_seen))
        });
        out.truncate(limit);
        out
    }

    /// Forgets records not seen since `before` (kept bounded); returns how many.
    pub fn expire(&mut self, before: DateTime<Utc>) -> usize {
        let mut n = 0;
        for (cluster, records) in &mut self.by_cluster {
            records.retain(|id, r| {
                let keep = r.last_seen >= before;
                if !keep {
                    self.dirty.insert((cluster.clone(), id.clone()));
                    if let Some(uids) = self.by_event.get_mut(cluster) {
                        for uid in &r.event_uids {
                            forget_uid(uids, uid, id);
                        }
                    }
                    n += 1;
                }
                keep
            });
        }
        self.by_cluster.retain(|_, r| !r.is_empty());
        let by_cluster = &self.by_cluster;
        self.by_event.retain(|c, _| by_cluster.contains_key(c));
        n
    }

    /// The records changed since the last call (`None`: removed), by id.
    pub fn take_changes(&mut self) -> Vec<(String, Option<Arc<Record>>)> {
        std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|(cluster, id)| {
                let r = self
                    .by_cluster
                    .get(&cluster)
                    .and_then(|m| m.get(&id))
                    .cloned();
                (id, r)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(name: &str, reason: &str, msg: &str, sev: Severity, t: i64) -> KubeEvent {
        KubeEvent {
            occurrence_id: format!("{name}{t}"),
            uid: format!("u{t}"),
            involved: ObjectRef {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: Some("shop".into()),
                name: name.into(),
                uid: None,
            },
            reason: reason.into(),
            message: msg.into(),
            event_type: if sev == Severity::Warning {
                "Warning".into()
            } else {
                "Normal".into()
            },
            severity: sev,
            count: 1,
            first_time: None,
            last_time: DateTime::from_timestamp(1_800_000_000 + t, 0).unwrap_or_default(),
            reporter: "kubelet".into(),
            action: None,
            source_api: "v1".into(),
        }
    }

    #[test]
    fn a_problem_is_announced_once_then_updated_at_most_every_refresh_across_a_reopen() {
        let backoff = |d: &mut Dedup, pod: &str, sev: Severity, t: i64| {
            let (r, p) = d.observe(
                "c1",
                &ev(
                    pod,
                    "BackOff",
                    &format!("Back-off restarting failed container web in pod {pod}"),
                    sev,
                    t,
                ),
            );
            (r.clone(), p)
        };
        let mut d = Dedup::new();
        let mut passed = Vec::new();
        for i in 0..120 {
            let pod = format!("web-7d4b9c8f5-{}", ["x2x9k", "q8w7r", "m4n5p"][i % 3]);
            if let (_, Some(p)) = backoff(&mut d, &pod, Severity::Warning, i as i64) {
                passed.push(p);
            }
        }
        // 120 repeats within two minutes: one announcement, nothing else
        assert_eq!(passed, vec![Pass::New]);
        // what the store writes and reads back is the same record set
        let mut reopened = Dedup::new();
        for (_, r) in d.take_changes() {
            reopened.restore(Arc::unwrap_or_clone(r.expect("changed, not removed")));
        }
        let mut d = reopened;
        let pod = "web-7d4b9c8f5-zzzzz";
        let (r, p) = backoff(&mut d, pod, Severity::Warning, 200);
        assert_eq!((r.count, p), (121, None), "before the refresh interval");
        let (r, p) = backoff(&mut d, pod, Severity::Warning, 300);
        assert_eq!(
            (r.count, p),
            (122, Some(Pass::Update)),
            "5 min after the announcement"
        );
        assert!(!Pass::Update.is_announcement());
        let (_, p) = backoff(&mut d, pod, Severity::Warning, 301);
        assert_eq!(p, None, "the next update waits another interval");
        let (_, p) = backoff(&mut d, pod, Severity::Info, 302);
        assert_eq!(p, Some(Pass::Severity));
        assert!(Pass::Severity.is_announcement());
    }

    #[test]
    fn a_late_event_does_not_move_last_seen_back() {
        let mut d = Dedup::new();
        d.observe(
            "c1",
            &ev("web", "Unhealthy", "probe failed", Severity::Warning, 100),
        );
        let (r, _) = d.observe(
            "c1",
            &ev("web", "Unhealthy", "probe failed", Severity::Warning, 50),
        );
        assert_eq!(r.last_seen.timestamp(), 1_800_000_100);
        assert_eq!(r.first_seen.timestamp(), 1_800_000_050);
    }

    #[test]
    fn one_event_object_re_recorded_with_another_message_stays_one_record() {
        let mut d = Dedup::new();
        // the same Event object (uid) counted again, its message naming a new image each time
        let mut ids = std::collections::BTreeSet::new();
        let mut passes = Vec::new();
        for (i, msg) in [
            "Failed to pull image \"shop/api:build-7f3a\": manifest unknown",
            "Failed to pull image \"shop/api:build-9c1e\": manifest unknown",
            "Failed to pull image \"shop/api:hotfix\": manifest unknown",
        ]
        .into_iter()
        .enumerate()
        {
            let mut e = ev(
                "api-6c5b4a3f2-x2x9k",
                "Failed",
                msg,
                Severity::Warning,
                i as i64,
            );
            e.uid = "event-api-failed".into();
            let (r, p) = d.observe("c1", &e);
            ids.insert(r.id.clone());
            passes.push(p);
            assert_eq!(r.count, i as u64 + 1);
        }
        assert_eq!(ids.len(), 1, "one record");
        assert_eq!(passes, vec![Some(Pass::New), None, None]);
        // a different Event object with a different problem on the same pod is its own record
        let mut other = ev(
            "api-6c5b4a3f2-x2x9k",
            "Failed",
            "Error: ImagePullBackOff",
            Severity::Warning,
            9,
        );
        other.uid = "event-api-backoff".into();
        let (r, p) = d.observe("c1", &other);
        assert!(!ids.contains(&r.id));
        assert_eq!(p, Some(Pass::New));
        // the identity survives the store: read back, the uid still finds its record
        let mut reopened = Dedup::new();
        for (_, r) in d.take_changes() {
            reopened.restore(Arc::unwrap_or_clone(r.expect("kept")));
        }
        let mut again = ev(
            "api-6c5b4a3f2-x2x9k",
            "Failed",
            "Failed to pull image \"shop/api:latest\"",
            Severity::Warning,
            10,
        );
        again.uid = "event-api-failed".into();
        let (r, _) = reopened.observe("c1", &again);
        assert!(ids.contains(&r.id));
        assert_eq!(r.count, 4);
    }

    #[test]
    fn a_uid_seen_on_another_object_is_matched_by_its_text() {
        // a simulator restarted (or a cluster rebuilt under its old name) hands an old Event uid to an
        // event about another workload: it is not the Event the uid was first seen on
        let mut d = Dedup::new();
        let backoff = |ns: &str, pod: &str, t: i64| {
            let mut e = ev(
                pod,
                "BackOff",
                &format!(
                    "Back-off restarting failed container web in pod {pod}_{ns}(0b5c1e6a-4d2f-4c1e-9a43-2b7f0c6d1e11)"
                ),
                Severity::Warning,
                t,
            );
            e.involved.namespace = Some(ns.into());
            e.uid = "reused".into();
            e
        };
        let (search, _) = d.observe("c1", &backoff("search", "web-b0e834583b-7v4kw", 0));
        let search = search.id.clone();
        let (catalog, pass) = d.observe("c1", &backoff("catalog", "web-c549d3a4cd-sr2zq", 1));
        assert_ne!(catalog.id, search, "a record of its own");
        assert_eq!(catalog.object.namespace.as_deref(), Some("catalog"));
        assert!(
            catalog.last_message.contains("_catalog("),
            "{}",
            catalog.last_message
        );
        assert_eq!(pass, Some(Pass::New));
        let catalog = catalog.id.clone();
        // the uid now finds the catalog record; the search record keeps its own text and count
        let (r, _) = d.observe("c1", &backoff("catalog", "web-c549d3a4cd-sr2zq", 2));
        assert_eq!((r.id.as_str(), r.count), (catalog.as_str(), 2));
        let r = d.by_cluster["c1"][&search].clone();
        assert_eq!(r.count, 1);
        assert!(r.last_message.contains("_search("));
        // the search record ageing out doesn't take the uid from the catalog record
        d.observe("c1", &{
            let mut e = backoff("catalog", "web-c549d3a4cd-sr2zq", 10_000);
            e.uid = "another".into();
            e
        });
        assert_eq!(
            d.expire(DateTime::from_timestamp(1_800_000_005, 0).unwrap_or_default()),
            1
        );
        assert_eq!(d.by_event["c1"].get("reused"), Some(&catalog));
    }

    #[test]
    fn a_uid_moved_to_another_record_stays_there_after_a_restore() {
        let mut d = Dedup::new();
        let backoff = |pod: &str, container: &str, t: i64| {
            let msg = format!("Back-off restarting failed container {container}");
            let mut e = ev(pod, "BackOff", &msg, Severity::Warning, t);
            e.uid = "reused".into();
            e
        };
        let search = d
            .observe("c1", &backoff("web-b0e834583b-7v4kw", "web", 0))
            .0
            .id
            .clone();
        // what the store holds: each record as it was last written
        let mut records: Vec<Record> = Vec::new();
        let mut store = |d: &mut Dedup| {
            for (_, r) in d.take_changes() {
                let r = Arc::unwrap_or_clone(r.expect("kept"));
                records.retain(|x| x.id != r.id);
                records.push(r);
            }
        };
        store(&mut d);
        let mut other = backoff("api-c549d3a4cd-sr2zq", "api", 1);
        let api = d.observe("c1", &other).0.id.clone();
        assert_ne!(api, search);
        // the first record is written again, without the uid: read back in either order, the uid is the
        // second record's only
        store(&mut d);
        assert!(
            records
                .iter()
                .any(|r| r.id == search && r.event_uids.is_empty())
        );
        for order in [records.clone(), records.into_iter().rev().collect()] {
            let mut again = Dedup::new();
            for r in order {
                again.restore(r);
            }
            other.message = "Back-off restarting failed container api (worded anew)".into();
            let (r, pass) = again.observe("c1", &other);
            assert_eq!((r.id.as_str(), r.count, pass), (api.as_str(), 2, None));
        }
    }

    #[test]
    fn a_record_an_older_masker_named_still_holds_its_events() {
        // stored when the pod-template hash `dbd4b` (no digit) was not yet masked
        let mut e = ev(
            "api-dbd4b-2wpsl",
            "Failed",
            "Error: ImagePullBackOff",
            Severity::Warning,
            0,
        );
        e.uid = "event-api".into();
        let mut d = Dedup::new();
        let (r, _) = d.observe("c1", &e);
        let mut old = r.clone();
        old.object.name = "api-dbd4b-*".into();
        let mut again = Dedup::new();
        again.restore(old.clone());
        e.message = "Failed to pull image \"api:2\": not found".into();
        let (r, pass) = again.observe("c1", &e);
        assert_eq!((r.id.as_str(), r.count, pass), (old.id.as_str(), 2, None));
    }
}
