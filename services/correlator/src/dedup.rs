//! Event deduplication: one record per problem (see [`crate::mask::fingerprint`]) with first/last seen
//! (cluster_time), count, last message and severity, persisted in sled. A record is passed on only when it
//! is new, changes severity, or crosses a count milestone (10, 100, 1000, …): not on every repeat.

use chrono::{DateTime, Utc};
use multipilot_schemas::payload::{KubeEvent, ObjectRef, Severity};
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
}

/// Why a record was passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// First time seen.
    New,
    /// Severity changed.
    Severity,
    /// Count crossed a milestone.
    Milestone(u64),
}

/// The store.
#[derive(Debug, Clone)]
pub struct Dedup {
    tree: sled::Tree,
}

/// Storage errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// sled failed.
    #[error("dedup store: {0}")]
    Sled(#[from] sled::Error),
}

fn milestone(before: u64, after: u64) -> Option<u64> {
    let mut m = 10u64;
    while m <= after {
        if before < m {
            return Some(m);
        }
        m = m.saturating_mul(10);
    }
    None
}

impl Dedup {
    /// Opens the store in `tree`.
    pub fn new(tree: sled::Tree) -> Self {
        Dedup { tree }
    }

    /// Records an event; returns the record and whether (and why) it is passed on.
    pub fn observe(&self, cluster: &str, e: &KubeEvent) -> Result<(Record, Option<Pass>), Error> {
        let ns = e.involved.namespace.clone().unwrap_or_default();
        let id = fingerprint(
            cluster,
            &e.involved.kind,
            &ns,
            &e.involved.name,
            &e.reason,
            &e.message,
        );
        let prev: Option<Record> = self
            .tree
            .get(id.as_bytes())?
            .and_then(|v| serde_json::from_slice(&v).ok());
        let (rec, pass) = match prev {
            None => (
                Record {
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
                },
                Some(Pass::New),
            ),
            Some(mut r) => {
                let before = r.count;
                r.count += 1;
                let pass = if r.severity != e.severity {
                    Some(Pass::Severity)
                } else {
                    milestone(before, r.count).map(Pass::Milestone)
                };
                r.severity = e.severity;
                // a late message doesn't move last_seen back
                if e.last_time >= r.last_seen {
                    r.last_seen = e.last_time;
                    r.last_message = e.message.clone();
                }
                r.first_seen = r.first_seen.min(e.first_time.unwrap_or(e.last_time));
                (r, pass)
            }
        };
        self.tree
            .insert(id.as_bytes(), serde_json::to_vec(&rec).unwrap_or_default())?;
        Ok((rec, pass))
    }

    /// Records of a cluster seen since `since` (for evidence), most recent first.
    pub fn recent(&self, cluster: &str, since: DateTime<Utc>, limit: usize) -> Vec<Record> {
        let mut out: Vec<Record> = self
            .tree
            .iter()
            .values()
            .filter_map(|v| v.ok())
            .filter_map(|v| serde_json::from_slice::<Record>(&v).ok())
            .filter(|r| r.cluster == cluster && r.last_seen >= since)
            .collect();
        out.sort_by(|a, b| {
            b.severity
                .cmp(&a.severity)
                .then(b.last_seen.cmp(&a.last_seen))
        });
        out.truncate(limit);
        out
    }

    /// Forgets records not seen since `before` (kept bounded).
    pub fn expire(&self, before: DateTime<Utc>) -> Result<usize, Error> {
        let mut n = 0;
        for item in self.tree.iter() {
            let (k, v) = item?;
            if serde_json::from_slice::<Record>(&v).is_ok_and(|r| r.last_seen < before) {
                self.tree.remove(k)?;
                n += 1;
            }
        }
        Ok(n)
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
    fn repeats_pass_only_at_milestones_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let d = Dedup::new(db.open_tree("d").unwrap());
        let mut passed = Vec::new();
        for i in 0..120 {
            let pod = format!("web-7d4b9c8f5-{}", ["x2x9k", "q8w7r", "m4n5p"][i % 3]);
            let (_, p) = d
                .observe(
                    "c1",
                    &ev(
                        &pod,
                        "BackOff",
                        &format!("Back-off restarting failed container web in pod {pod}"),
                        Severity::Warning,
                        i as i64,
                    ),
                )
                .unwrap();
            if let Some(p) = p {
                passed.push(p);
            }
        }
        assert_eq!(
            passed,
            vec![Pass::New, Pass::Milestone(10), Pass::Milestone(100)]
        );
        drop(d);
        let d = Dedup::new(db.open_tree("d").unwrap());
        let (r, p) = d
            .observe(
                "c1",
                &ev(
                    "web-7d4b9c8f5-zzzzz",
                    "BackOff",
                    "Back-off restarting failed container web in pod web-7d4b9c8f5-zzzzz",
                    Severity::Warning,
                    500,
                ),
            )
            .unwrap();
        assert_eq!((r.count, p), (121, None));
        let (_, p) = d
            .observe(
                "c1",
                &ev(
                    "web-7d4b9c8f5-zzzzz",
                    "BackOff",
                    "Back-off restarting failed container web in pod web-7d4b9c8f5-zzzzz",
                    Severity::Info,
                    501,
                ),
            )
            .unwrap();
        assert_eq!(p, Some(Pass::Severity));
    }

    #[test]
    fn a_late_event_does_not_move_last_seen_back() {
        let dir = tempfile::tempdir().unwrap();
        let d = Dedup::new(sled::open(dir.path()).unwrap().open_tree("d").unwrap());
        d.observe(
            "c1",
            &ev("web", "Unhealthy", "probe failed", Severity::Warning, 100),
        )
        .unwrap();
        let (r, _) = d
            .observe(
                "c1",
                &ev("web", "Unhealthy", "probe failed", Severity::Warning, 50),
            )
            .unwrap();
        assert_eq!(r.last_seen.timestamp(), 1_800_000_100);
        assert_eq!(r.first_seen.timestamp(), 1_800_000_050);
    }
}
