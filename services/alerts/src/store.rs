//! What the router keeps in sled: alerts, silences, the notification log, pending and dead notifications.
//! Values are JSON (small, and readable with any sled dump). A notification is made durable (pending +
//! notification-log entry, in one batch) before anything is sent, so a restart neither forgets what was
//! pending nor re-notifies what was already notified.
//!
//! Silences and the notification log can't be rebuilt from the streams, so they are also written through
//! to the JetStream KV buckets `MULTIPILOT_SILENCES` and `MULTIPILOT_NFLOG` (see [`Replica`]): each write
//! puts the record in the `outbox` tree in the same sled transaction, and [`Store::replicate`] drains the
//! outbox into the buckets. A store found empty at start is restored from them ([`Store::restore`]).
//! Alerts posted to the API are in the same position (no stream holds them): they are written through to
//! `MULTIPILOT_ALERTS` the same way, and deleted from it when the router forgets them.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use multipilot_schemas::payload::Notification;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::matcher::Matcher;

/// Storage errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// sled failed.
    #[error("alerts store: {0}")]
    Sled(#[from] sled::Error),
    /// A value could not be encoded or decoded.
    #[error("alerts store value: {0}")]
    Json(#[from] serde_json::Error),
    /// The replicated buckets could not be written or read (retryable).
    #[error("alerts replica: {0}")]
    Replica(#[from] multipilot_bus::kv::Error),
}

/// An alert: one incident (or deduplicated event) as the router sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    /// The incident id (Alertmanager's fingerprint).
    pub id: String,
    /// Labels (`alertname`, `cluster`, `severity`, `kind`, the cluster's registry labels).
    pub labels: BTreeMap<String, String>,
    /// Annotations (`summary`, `evidence`).
    pub annotations: BTreeMap<String, String>,
    /// When it started.
    pub starts_at: DateTime<Utc>,
    /// When it resolved.
    pub ends_at: Option<DateTime<Utc>>,
    /// The incident revision this is.
    pub revision: u64,
    /// When the router last changed it.
    pub updated_at: DateTime<Utc>,
    /// Resolves by itself at this time unless refreshed (event alerts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// Posted to `POST /api/v2/alerts` (by Prometheus, vmalert, amtool…) rather than made from an
    /// incident or digest: nothing on the streams can rebuild it, so it is also written through to the
    /// `MULTIPILOT_ALERTS` bucket. Its id is Alertmanager's fingerprint of its labels.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub posted: bool,
    /// Where a posted alert came from (Prometheus' link to the rule's expression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator_url: Option<String>,
    /// A fleet incident's alert: the ids of its members' alerts (the cluster incidents it links), muted
    /// while it fires so one failure across clusters pages once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    /// An event alert: when JetStream stored the digest that last refreshed it (the hub's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refreshed_at: Option<DateTime<Utc>>,
    /// An incident's alert: the alerts of the event digests it accounts for (`event:<digest id>`, from
    /// `Incident.explains`), muted while it fires and resolved with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explains: Vec<String>,
}

impl Alert {
    /// Whether it is still firing.
    pub fn firing(&self) -> bool {
        self.ends_at.is_none()
    }
}

/// Alertmanager's fingerprint of a label set (`model.LabelSet.Fingerprint`: 64-bit FNV-1a over the
/// label names in order and their values, each followed by the byte 255), as 16 hex digits.
pub fn fingerprint(labels: &BTreeMap<String, String>) -> String {
    const OFFSET: u64 = 14_695_981_039_346_656_037;
    const PRIME: u64 = 1_099_511_628_211;
    let mut h = OFFSET;
    let mut add = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    };
    for (k, v) in labels {
        add(k.as_bytes());
        add(&[255]);
        add(v.as_bytes());
        add(&[255]);
    }
    format!("{h:016x}")
}

/// A silence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Silence {
    /// Id.
    pub id: String,
    /// Every matcher must match for an alert to be silenced.
    pub matchers: Vec<Matcher>,
    /// Start.
    pub starts_at: DateTime<Utc>,
    /// End (expiring sets it to now).
    pub ends_at: DateTime<Utc>,
    /// Who made it.
    pub created_by: String,
    /// Why.
    pub comment: String,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl Silence {
    /// `pending`, `active` or `expired` at `now`.
    pub fn state(&self, now: DateTime<Utc>) -> &'static str {
        if now < self.starts_at {
            "pending"
        } else if now < self.ends_at {
            "active"
        } else {
            "expired"
        }
    }

    /// Whether it silences these labels at `now`.
    pub fn silences(&self, labels: &BTreeMap<String, String>, now: DateTime<Utc>) -> bool {
        self.state(now) == "active" && crate::matcher::all_match(&self.matchers, labels)
    }
}

/// The notification log: what a receiver was last told about a group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NflogEntry {
    /// Alert ids notified as firing.
    pub firing: BTreeSet<String>,
    /// Alert ids notified as resolved.
    pub resolved: BTreeSet<String>,
    /// When.
    pub at: Option<DateTime<Utc>>,
    /// The clusters each fleet alert notified as firing spanned then (its `clusters` annotation): one
    /// that reaches a cluster more is notified again at the group's next flush. Absent in entries
    /// written before it was kept (such an alert is notified again only once it changes otherwise).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub spans: BTreeMap<String, BTreeSet<String>>,
}

/// A notification waiting to be delivered to one integration of a receiver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    /// The notification.
    pub notification: Notification,
    /// The group's labels (Alertmanager's `groupLabels`).
    pub group_labels: BTreeMap<String, String>,
    /// Which integration: `webhook`, `alertmanager`, `slack` or `nats`, and its index in the receiver.
    pub integration: String,
    /// Index of the integration among the receiver's configs of that type.
    pub index: usize,
    /// Attempts so far.
    pub attempts: u32,
    /// Not before.
    pub next_attempt: DateTime<Utc>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// The last failure.
    pub last_error: Option<String>,
    /// How long a firing alert handed to an Alertmanager stays active without being sent again (the route's
    /// repeat_interval plus group_interval), seconds.
    #[serde(default)]
    pub hold_secs: u64,
}

impl Pending {
    /// Its key: creation order first, so the oldest go first.
    pub fn key(&self) -> String {
        format!(
            "{:020}/{}/{}-{}",
            self.created_at.timestamp_nanos_opt().unwrap_or_default(),
            self.notification.id,
            self.integration,
            self.index
        )
    }
}

/// The notification log entry as the `MULTIPILOT_NFLOG` bucket holds it (with its sled key, which the KV
/// key only hashes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NflogRecord {
    /// `receiver\0group key`.
    pub key: String,
    /// The entry.
    pub entry: NflogEntry,
}

/// Key kinds in the buckets.
const KIND_SILENCE: &str = "silence";
const KIND_NFLOG: &str = "nflog";
const KIND_ALERT: &str = "alert";
/// Set in `meta` once the store was restored from (or seeded into) the buckets.
const MARK_REPLICATED: &[u8] = b"replicated";
/// Set in `meta` while a restore is under way (a crash in the middle restores again).
const RESTORING: &[u8] = b"restoring";
/// Set in `meta` while the incidents are replayed after a restore: the stream sequence to reach.
const REPLAY_UNTIL: &[u8] = b"replay_until";
/// Set in `meta`: every incident input up to this FLEET_INCIDENTS sequence is in the `alerts` tree (written
/// after the alerts it covers were flushed).
const INCIDENTS_THROUGH: &[u8] = b"incidents_through";

/// The replicated buckets.
#[derive(Debug, Clone)]
pub struct Replica {
    /// `MULTIPILOT_SILENCES`.
    pub silences: async_nats::jetstream::kv::Store,
    /// `MULTIPILOT_NFLOG`.
    pub nflog: async_nats::jetstream::kv::Store,
    /// `MULTIPILOT_ALERTS` (posted alerts).
    pub alerts: async_nats::jetstream::kv::Store,
    // one drain at a time, so an older value can't overtake a newer one for the same key
    draining: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl Replica {
    /// Wraps the three buckets.
    pub fn new(
        silences: async_nats::jetstream::kv::Store,
        nflog: async_nats::jetstream::kv::Store,
        alerts: async_nats::jetstream::kv::Store,
    ) -> Replica {
        Replica {
            silences,
            nflog,
            alerts,
            draining: Default::default(),
        }
    }
}

/// What a restore found in the buckets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restored {
    /// Silences.
    pub silences: usize,
    /// Notification log entries.
    pub nflog: usize,
    /// Posted alerts.
    pub alerts: usize,
    /// Records that didn't decode (skipped).
    pub skipped: usize,
}

/// The sled trees.
#[derive(Debug, Clone)]
pub struct Store {
    db: sled::Db,
    /// Records not yet in the buckets, by KV key (value: what to put).
    outbox: sled::Tree,
    /// Markers.
    meta: sled::Tree,
    replica: Option<Replica>,
    /// Alerts by id.
    pub alerts: sled::Tree,
    /// Silences by id.
    pub silences: sled::Tree,
    /// Notification log by `receiver\0group key`.
    pub nflog: sled::Tree,
    /// Pending deliveries by [`Pending::key`].
    pub pending: sled::Tree,
    /// Dead-lettered deliveries, same keys.
    pub dead: sled::Tree,
}

/// Encodes a value.
pub fn enc<T: Serialize>(v: &T) -> Result<Vec<u8>, Error> {
    Ok(serde_json::to_vec(v)?)
}

/// Decodes every value of a tree, skipping (and logging) what can't be read.
pub fn all<T: DeserializeOwned>(tree: &sled::Tree) -> Vec<(String, T)> {
    tree.iter()
        .filter_map(|kv| kv.ok())
        .filter_map(|(k, v)| {
            let key = String::from_utf8_lossy(&k).into_owned();
            match serde_json::from_slice(&v) {
                Ok(t) => Some((key, t)),
                Err(e) => {
                    tracing::warn!(%key, error = %e, "skipping an unreadable record");
                    None
                }
            }
        })
        .collect()
}

/// The notification log key.
pub fn nflog_key(receiver: &str, group_key: &str) -> String {
    format!("{receiver}\u{0}{group_key}")
}

impl Store {
    /// Opens (or creates) the store, with a page cache of `cache_bytes`.
    pub fn open(path: &str, cache_bytes: u64) -> Result<Store, Error> {
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes)
            .open()?;
        Ok(Store {
            alerts: db.open_tree("alerts")?,
            silences: db.open_tree("silences")?,
            nflog: db.open_tree("nflog")?,
            pending: db.open_tree("pending")?,
            dead: db.open_tree("dead")?,
            outbox: db.open_tree("outbox")?,
            meta: db.open_tree("meta")?,
            replica: None,
            db,
        })
    }

    /// Writes silences and the notification log through to these buckets from now on.
    pub fn with_replica(mut self, replica: Replica) -> Store {
        self.replica = Some(replica);
        self
    }

    /// Whether this store has never held anything: no marker, no alert, silence or log entry (a new or
    /// wiped data directory).
    /// A restore that didn't finish counts as blank.
    pub fn is_blank(&self) -> Result<bool, Error> {
        if self.meta.get(RESTORING)?.is_some() {
            return Ok(true);
        }
        Ok(self.meta.get(MARK_REPLICATED)?.is_none()
            && self.alerts.is_empty()
            && self.silences.is_empty()
            && self.nflog.is_empty()
            && self.pending.is_empty())
    }

    /// Whether the store was restored from (or seeded into) the buckets already.
    pub fn is_replicated(&self) -> Result<bool, Error> {
        Ok(self.meta.get(MARK_REPLICATED)?.is_some())
    }

    /// Notes that a restore begins.
    pub fn begin_restore(&self) -> Result<(), Error> {
        self.meta.insert(RESTORING, b"1".as_slice())?;
        self.meta.remove(INCIDENTS_THROUGH)?;
        Ok(())
    }

    /// Notes that a restore is done, and the incidents stream sequence its replay must reach.
    pub fn finish_restore(&self, replay_until: Option<u64>) -> Result<(), Error> {
        self.set_replay_until(replay_until)?;
        self.mark_replicated()?;
        self.meta.remove(RESTORING)?;
        Ok(())
    }

    /// Marks the store as restored from (or seeded into) the buckets.
    pub fn mark_replicated(&self) -> Result<(), Error> {
        self.meta.insert(MARK_REPLICATED, b"1".as_slice())?;
        Ok(())
    }

    /// The incidents stream sequence a replay must reach before groups are flushed, if one is under way.
    pub fn replay_until(&self) -> Result<Option<u64>, Error> {
        Ok(self
            .meta
            .get(REPLAY_UNTIL)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_be_bytes))
    }

    /// Records (or, with `None`, ends) a replay of the incidents.
    pub fn set_replay_until(&self, seq: Option<u64>) -> Result<(), Error> {
        match seq {
            Some(s) => self.meta.insert(REPLAY_UNTIL, s.to_be_bytes().as_slice())?,
            None => self.meta.remove(REPLAY_UNTIL)?,
        };
        Ok(())
    }

    /// The FLEET_INCIDENTS sequence up to which every input is in the `alerts` tree (`None`: a store from
    /// before incidents were acked ahead of their alert's write, which wrote each alert before its ack).
    pub fn incidents_through(&self) -> Result<Option<u64>, Error> {
        Ok(self
            .meta
            .get(INCIDENTS_THROUGH)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_be_bytes))
    }

    /// Records that every input up to `seq` is in the `alerts` tree; call only once the alerts it covers
    /// are flushed (the mark itself is durable with the next flush).
    pub fn set_incidents_through(&self, seq: u64) -> Result<(), Error> {
        self.meta
            .insert(INCIDENTS_THROUGH, seq.to_be_bytes().as_slice())?;
        Ok(())
    }

    /// Queues every silence and log entry for the buckets (a store that predates them).
    pub fn seed_outbox(&self) -> Result<usize, Error> {
        if self.replica.is_none() {
            return Ok(0);
        }
        let mut n = 0;
        for (_, s) in all::<Silence>(&self.silences) {
            self.outbox
                .insert(multipilot_bus::kv::key(KIND_SILENCE, &[&s.id])?, enc(&s)?)?;
            n += 1;
        }
        for (key, entry) in all::<NflogEntry>(&self.nflog) {
            let k = multipilot_bus::kv::key(KIND_NFLOG, &[&key])?;
            self.outbox.insert(k, enc(&NflogRecord { key, entry })?)?;
            n += 1;
        }
        for (_, a) in all::<Alert>(&self.alerts) {
            if a.posted {
                self.outbox
                    .insert(multipilot_bus::kv::key(KIND_ALERT, &[&a.id])?, enc(&a)?)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Whether records wait for the buckets.
    pub fn outbox_len(&self) -> usize {
        if self.replica.is_none() {
            0
        } else {
            self.outbox.len()
        }
    }

    /// Puts what the outbox holds in the buckets; returns how many. Stops at the first failure (the rest
    /// stays queued for the next call).
    pub async fn replicate(&self) -> Result<usize, Error> {
        let Some(r) = &self.replica else {
            return Ok(0);
        };
        let _one = r.draining.lock().await;
        let mut n = 0;
        for kv in self.outbox.iter() {
            let (k, v) = kv?;
            let key = String::from_utf8_lossy(&k).into_owned();
            let bucket = match key.split_once('.').map(|(kind, _)| kind) {
                Some(KIND_SILENCE) => &r.silences,
                Some(KIND_ALERT) => &r.alerts,
                _ => &r.nflog,
            };
            // an empty value is a deletion (no record encodes to nothing)
            if v.is_empty() {
                multipilot_bus::kv::delete(bucket, &key).await?;
            } else {
                multipilot_bus::kv::put(bucket, &key, v.to_vec()).await?;
            }
            // only if nobody wrote a newer value meanwhile: that one goes out on the next call
            let _ = self
                .outbox
                .compare_and_swap(&k, Some(&v), None as Option<&[u8]>)?;
            n += 1;
        }
        Ok(n)
    }

    /// Fills a blank store from the buckets: silences, the notification log and posted alerts.
    pub async fn restore(&self) -> Result<Restored, Error> {
        let Some(r) = &self.replica else {
            return Ok(Restored::default());
        };
        let mut out = Restored::default();
        for (key, v) in multipilot_bus::kv::load_all(&r.silences).await? {
            match serde_json::from_slice::<Silence>(&v) {
                Ok(s) => {
                    self.silences.insert(s.id.as_bytes(), enc(&s)?)?;
                    out.silences += 1;
                }
                Err(e) => {
                    tracing::warn!(%key, error = %e, "skipping an unreadable silence in the bucket");
                    out.skipped += 1;
                }
            }
        }
        for (key, v) in multipilot_bus::kv::load_all(&r.nflog).await? {
            match serde_json::from_slice::<NflogRecord>(&v) {
                Ok(rec) => {
                    self.nflog.insert(rec.key.as_bytes(), enc(&rec.entry)?)?;
                    out.nflog += 1;
                }
                Err(e) => {
                    tracing::warn!(%key, error = %e, "skipping an unreadable log entry in the bucket");
                    out.skipped += 1;
                }
            }
        }
        for (key, v) in multipilot_bus::kv::load_all(&r.alerts).await? {
            match serde_json::from_slice::<Alert>(&v) {
                Ok(a) => {
                    self.alerts.insert(a.id.as_bytes(), enc(&a)?)?;
                    out.alerts += 1;
                }
                Err(e) => {
                    tracing::warn!(%key, error = %e, "skipping an unreadable alert in the bucket");
                    out.skipped += 1;
                }
            }
        }
        Ok(out)
    }

    /// Stores an alert; a posted one is queued for its bucket in the same transaction.
    pub fn put_alert(&self, a: &Alert) -> Result<(), Error> {
        use sled::Transactional;
        let v = enc(a)?;
        let queue = (a.posted && self.replica.is_some())
            .then(|| multipilot_bus::kv::key(KIND_ALERT, &[&a.id]))
            .transpose()?;
        let Some(queue) = queue else {
            // nothing to queue with it (an incident's alert): one insert is atomic by itself, and a sled
            // transaction would seal and write its log buffer for every alert (72 % of the router's time
            // draining incidents went to those writes)
            self.alerts.insert(a.id.as_bytes(), v)?;
            return Ok(());
        };
        (&self.alerts, &self.outbox)
            .transaction(|(at, ot)| {
                at.insert(a.id.as_bytes(), v.as_slice())?;
                ot.insert(queue.as_bytes(), v.as_slice())?;
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(tx_error)
    }

    /// Forgets an alert; a posted one is queued for deletion from its bucket in the same transaction.
    pub fn remove_alert(&self, a: &Alert) -> Result<(), Error> {
        use sled::Transactional;
        let queue = (a.posted && self.replica.is_some())
            .then(|| multipilot_bus::kv::key(KIND_ALERT, &[&a.id]))
            .transpose()?;
        let Some(queue) = queue else {
            self.alerts.remove(a.id.as_bytes())?;
            return Ok(());
        };
        (&self.alerts, &self.outbox)
            .transaction(|(at, ot)| {
                at.remove(a.id.as_bytes())?;
                ot.insert(queue.as_bytes(), b"".as_slice())?;
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(tx_error)
    }

    /// Stores a silence (and queues it for the bucket), atomically.
    pub fn put_silence(&self, s: &Silence) -> Result<(), Error> {
        use sled::Transactional;
        let v = enc(s)?;
        let queue = self
            .replica
            .is_some()
            .then(|| multipilot_bus::kv::key(KIND_SILENCE, &[&s.id]))
            .transpose()?;
        (&self.silences, &self.outbox)
            .transaction(|(st, ot)| {
                st.insert(s.id.as_bytes(), v.as_slice())?;
                if let Some(k) = &queue {
                    ot.insert(k.as_bytes(), v.as_slice())?;
                }
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(tx_error)
    }

    /// Forgets notification log entries (kept in the bucket until its max age drops them).
    pub fn remove_nflog(&self, keys: &[String]) -> Result<(), Error> {
        for k in keys {
            self.nflog.remove(k.as_bytes())?;
        }
        Ok(())
    }

    /// Makes everything written so far durable.
    pub async fn flush(&self) -> Result<(), Error> {
        self.db.flush_async().await?;
        Ok(())
    }

    /// Records notifications to send and the log entries they imply, atomically.
    pub fn enqueue(
        &self,
        pending: &[Pending],
        nflog: &[(String, NflogEntry)],
    ) -> Result<(), Error> {
        use sled::Transactional;
        let p: Vec<(String, Vec<u8>)> = pending
            .iter()
            .map(|p| Ok((p.key(), enc(p)?)))
            .collect::<Result<_, Error>>()?;
        let n: Vec<(String, Vec<u8>)> = nflog
            .iter()
            .map(|(k, e)| Ok((k.clone(), enc(e)?)))
            .collect::<Result<_, Error>>()?;
        let queue: Vec<(String, Vec<u8>)> = if self.replica.is_some() {
            nflog
                .iter()
                .map(|(k, e)| {
                    Ok((
                        multipilot_bus::kv::key(KIND_NFLOG, &[k])?,
                        enc(&NflogRecord {
                            key: k.clone(),
                            entry: e.clone(),
                        })?,
                    ))
                })
                .collect::<Result<_, Error>>()?
        } else {
            Vec::new()
        };
        (&self.pending, &self.nflog, &self.outbox)
            .transaction(|(pt, nt, ot)| {
                for (k, v) in &p {
                    pt.insert(k.as_bytes(), v.as_slice())?;
                }
                for (k, v) in &n {
                    nt.insert(k.as_bytes(), v.as_slice())?;
                }
                for (k, v) in &queue {
                    ot.insert(k.as_bytes(), v.as_slice())?;
                }
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(tx_error)
    }

    /// Moves a pending delivery to the dead letters.
    pub fn bury(&self, key: &str, p: &Pending) -> Result<(), Error> {
        use sled::Transactional;
        let v = enc(p)?;
        (&self.pending, &self.dead)
            .transaction(|(pt, dt)| {
                pt.remove(key.as_bytes())?;
                dt.insert(key.as_bytes(), v.as_slice())?;
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(tx_error)
    }
}

fn tx_error(e: sled::transaction::TransactionError<()>) -> Error {
    match e {
        sled::transaction::TransactionError::Storage(s) => Error::Sled(s),
        sled::transaction::TransactionError::Abort(()) => {
            Error::Sled(sled::Error::Unsupported("transaction aborted".into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_incidents_mark_is_kept_and_a_restore_drops_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store").display().to_string();
        {
            let s = Store::open(&path, 1 << 20).unwrap();
            assert_eq!(s.incidents_through().unwrap(), None);
            s.set_incidents_through(42).unwrap();
            s.db.flush().unwrap();
        }
        let s = Store::open(&path, 1 << 20).unwrap();
        assert_eq!(s.incidents_through().unwrap(), Some(42));
        // a restore replays the incidents from the start: no mark until that replay is over
        s.begin_restore().unwrap();
        assert_eq!(s.incidents_through().unwrap(), None);
    }

    #[test]
    fn fingerprints_are_alertmanagers() {
        // the fingerprints Alertmanager 0.25 showed for these label sets (GET /api/v2/alerts)
        assert_eq!(fingerprint(&labels(&[("a", "x")])), "d2c7718192a8a294");
        assert_eq!(
            fingerprint(&labels(&[("alertname", "Foo"), ("job", "bar")])),
            "6e300f002f9bd150"
        );
        assert_eq!(
            fingerprint(&labels(&[("alertname", "Bar"), ("sev", "x")])),
            "b32968ef241f8f73"
        );
    }
}
