//! The durable outbox: every message the agent produces is written here (sled) before it is published, and
//! removed only once JetStream has confirmed it. While NATS is away the agent keeps collecting.
//!
//! Policy (stated in the README):
//! - Classes drain in priority order: heartbeat, probes and facts, resource states, events, metrics.
//! - A message with a collapse key (a resource state, a heartbeat, facts) replaces the waiting message
//!   with the same key: only the latest state of an object is worth sending. Each replacement is counted
//!   (`superseded`).
//! - The disk budget (`max_bytes`) is kept by dropping the oldest metric batches first (counted in
//!   `dropped_metric_batches`). Probes, events and resource states are never dropped; if they alone
//!   exceed the budget, the agent says so in its log and keeps them.
//! - `seq` numbers are assigned when a message is accepted (one counter per cluster, persisted), so a
//!   consumer can account for every message: each seq is either delivered, superseded or dropped.
//! - "Accepted" means flushed to disk: only flushed messages are published, so a kill -9 can lose a
//!   message that was never accepted, never one that was.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use multipilot_runtime::store::GroupFlush;
use serde::{Deserialize, Serialize};
use sled::Transactional;
use sled::transaction::TransactionError;

/// Errors of the outbox (all of them are disk problems: not retryable by waiting).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// sled failed.
    #[error("outbox storage: {0}")]
    Sled(#[from] sled::Error),
    /// A stored entry could not be decoded (corruption or a newer format).
    #[error("outbox entry {key:?} is unreadable: {reason}")]
    Corrupt {
        /// The entry's key.
        key: Vec<u8>,
        /// Why.
        reason: String,
    },
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Outbox settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Directory of the sled database.
    pub path: String,
    /// Disk budget for waiting messages, in bytes.
    pub max_bytes: u64,
    /// sled page cache, in bytes.
    pub cache_bytes: u64,
    /// Messages per second the drain publishes, all clusters of this process together.
    pub drain_per_second: u32,
    /// Burst above the drain rate.
    pub drain_burst: u32,
    /// Milliseconds between flushes to disk.
    pub flush_interval_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            path: "./data/agent-outbox".into(),
            max_bytes: 256 * 1024 * 1024,
            cache_bytes: 16 * 1024 * 1024,
            drain_per_second: 2000,
            drain_burst: 500,
            flush_interval_ms: 100,
        }
    }
}

/// Message classes, in drain priority order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Heartbeats.
    Heartbeat = 0,
    /// Probe results and cluster facts.
    Probe = 1,
    /// Resource states, deletions and resync markers.
    State = 2,
    /// Kubernetes events.
    Event = 3,
    /// Metric batches.
    Metrics = 4,
}

impl Class {
    /// All classes, highest priority first.
    pub const ALL: [Class; 5] = [
        Class::Heartbeat,
        Class::Probe,
        Class::State,
        Class::Event,
        Class::Metrics,
    ];

    fn name(self) -> &'static str {
        match self {
            Class::Heartbeat => "hb",
            Class::Probe => "probe",
            Class::State => "state",
            Class::Event => "event",
            Class::Metrics => "metrics",
        }
    }
}

/// One waiting message: already encoded, ready to publish.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// Subject.
    pub subject: String,
    /// `Nats-Msg-Id`.
    pub msg_id: String,
    /// `Multipilot-Schema` header value.
    pub schema: String,
    /// Encoded envelope.
    #[serde(with = "serde_bytes_compat")]
    pub body: Vec<u8>,
    /// Collapse key, if any.
    #[serde(default)]
    pub collapse: Option<String>,
}

mod serde_bytes_compat {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(b)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let v: serde_bytes_like::Bytes = Deserialize::deserialize(d)?;
        Ok(v.0)
    }

    mod serde_bytes_like {
        use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};

        pub struct Bytes(pub Vec<u8>);

        impl<'de> Deserialize<'de> for Bytes {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = Bytes;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("bytes")
                    }
                    fn visit_bytes<E>(self, v: &[u8]) -> Result<Bytes, E> {
                        Ok(Bytes(v.to_vec()))
                    }
                    fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Bytes, E> {
                        Ok(Bytes(v))
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Bytes, A::Error> {
                        let mut out = Vec::new();
                        while let Some(b) = a.next_element::<u8>()? {
                            out.push(b);
                        }
                        Ok(Bytes(out))
                    }
                }
                d.deserialize_bytes(V)
            }
        }
    }
}

/// Counters an outbox keeps (persisted; reported in the heartbeat).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Last seq accepted.
    pub last_seq: u64,
    /// Messages replaced by a newer one with the same collapse key before they were sent.
    pub superseded: u64,
    /// Metric batches dropped to keep the disk budget.
    pub dropped_metric_batches: u64,
    /// Messages JetStream already had (a re-send after a crash).
    pub duplicates: u64,
    /// Messages waiting.
    pub depth: u64,
    /// Bytes waiting.
    pub bytes: u64,
}

/// The shared database: one per agent process, one [`Outbox`] per cluster inside it.
#[derive(Debug, Clone)]
pub struct Store {
    db: sled::Db,
    config: Config,
    flusher: Arc<GroupFlush>,
}

impl Store {
    /// Opens (or creates) the database.
    pub fn open(config: &Config) -> Result<Self> {
        let db = sled::Config::new()
            .path(&config.path)
            .cache_capacity(config.cache_bytes)
            .mode(sled::Mode::LowSpace)
            .open()?;
        Ok(Store {
            // each cluster's outbox asks every 100 ms: one fsync serves them all (see GroupFlush)
            flusher: Arc::new(GroupFlush::new(db.clone(), FLUSH_GAP)),
            db,
            config: config.clone(),
        })
    }

    /// The outbox of one cluster.
    pub fn outbox(&self, cluster: &str) -> Result<Outbox> {
        Outbox::open(
            self.db.clone(),
            self.flusher.clone(),
            cluster,
            self.config.max_bytes,
        )
    }

    /// A tree for other durable agent state (e.g. what was last published per object).
    pub fn tree(&self, name: &str) -> Result<sled::Tree> {
        Ok(self.db.open_tree(name)?)
    }

    /// Flushes everything written so far to disk.
    pub async fn flush(&self) -> Result<()> {
        Ok(self.flusher.flush().await?)
    }
}

/// Shortest time between two flushes of the outboxes' store.
const FLUSH_GAP: std::time::Duration = std::time::Duration::from_millis(50);

/// One cluster's outbox.
#[derive(Debug, Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Shared by every outbox of `db`.
    flusher: Arc<GroupFlush>,
    queues: Vec<sled::Tree>,
    /// collapse key → (class byte, seq)
    index: sled::Tree,
    meta: sled::Tree,
    cluster: String,
    max_bytes: u64,
    seq: AtomicU64,
    flushed: AtomicU64,
    bytes: AtomicU64,
    depth: AtomicU64,
    superseded: AtomicU64,
    dropped: AtomicU64,
    duplicates: AtomicU64,
    /// Messages handed to the drain (they may be stored already, so they are never superseded or
    /// dropped); everything at or below `attempted_floor` was waiting at open and counts as handed.
    attempted: std::sync::Mutex<std::collections::HashSet<u64>>,
    attempted_floor: u64,
    write_lock: std::sync::Mutex<()>,
    notify: tokio::sync::Notify,
}

const META_SEQ: &[u8] = b"seq";

fn tx_error(e: TransactionError<()>) -> Error {
    match e {
        TransactionError::Storage(e) => Error::Sled(e),
        TransactionError::Abort(()) => Error::Corrupt {
            key: Vec::new(),
            reason: "outbox transaction aborted".into(),
        },
    }
}
const META_SUPERSEDED: &[u8] = b"superseded";
const META_DROPPED: &[u8] = b"dropped_metric_batches";
const META_DUPLICATES: &[u8] = b"duplicates";

fn get_u64(tree: &sled::Tree, key: &[u8]) -> Result<u64> {
    Ok(tree
        .get(key)?
        .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0))
}

impl Outbox {
    fn open(db: sled::Db, flusher: Arc<GroupFlush>, cluster: &str, max_bytes: u64) -> Result<Self> {
        let queues = Class::ALL
            .iter()
            .map(|c| db.open_tree(format!("outbox/{cluster}/{}", c.name())))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let index = db.open_tree(format!("outbox/{cluster}/index"))?;
        let meta = db.open_tree(format!("outbox/{cluster}/meta"))?;
        let mut seq = get_u64(&meta, META_SEQ)?;
        let (mut bytes, mut depth) = (0u64, 0u64);
        for q in &queues {
            for entry in q.iter() {
                let (k, v) = entry?;
                if let Ok(k) = <[u8; 8]>::try_from(k.as_ref()) {
                    seq = seq.max(u64::from_be_bytes(k));
                }
                bytes += v.len() as u64;
                depth += 1;
            }
        }
        let inner = Inner {
            superseded: AtomicU64::new(get_u64(&meta, META_SUPERSEDED)?),
            dropped: AtomicU64::new(get_u64(&meta, META_DROPPED)?),
            duplicates: AtomicU64::new(get_u64(&meta, META_DUPLICATES)?),
            attempted: Default::default(),
            attempted_floor: seq,
            flusher,
            queues,
            index,
            meta,
            cluster: cluster.to_string(),
            max_bytes,
            seq: AtomicU64::new(seq),
            // what is on disk at open was flushed by definition
            flushed: AtomicU64::new(seq),
            bytes: AtomicU64::new(bytes),
            depth: AtomicU64::new(depth),
            write_lock: std::sync::Mutex::new(()),
            notify: tokio::sync::Notify::new(),
        };
        Ok(Outbox {
            inner: Arc::new(inner),
        })
    }

    /// The cluster this outbox serves.
    pub fn cluster(&self) -> &str {
        &self.inner.cluster
    }

    /// Accepts a message: `build` receives the seq assigned to it and returns the encoded item. Returns
    /// the seq. The message is durable after the next [`Outbox::flush`].
    pub fn push<E>(
        &self,
        class: Class,
        build: impl FnOnce(u64) -> std::result::Result<Item, E>,
    ) -> std::result::Result<u64, PushError<E>> {
        let i = &self.inner;
        let _guard = i.write_lock.lock().unwrap_or_else(|e| e.into_inner());
        let seq = i.seq.load(Ordering::SeqCst) + 1;
        let item = build(seq).map_err(PushError::Build)?;
        let value = rmp_serde::to_vec_named(&item).map_err(|e| {
            PushError::Outbox(Error::Corrupt {
                key: Vec::new(),
                reason: e.to_string(),
            })
        })?;
        let key = seq.to_be_bytes();
        let queue = &i.queues[class as usize];
        // One sled transaction: a crash keeps all of it or none of it, so a superseded message is never
        // gone without being counted, nor counted without being gone.
        let superseded_before = i.superseded.load(Ordering::SeqCst);
        let collapse = item.collapse.clone();
        let removed: Option<usize> = (queue, &i.index, &i.meta)
            .transaction(|(q, idx, m)| {
                let mut removed = None;
                if let Some(ck) = &collapse {
                    let mut new_idx = vec![class as u8];
                    new_idx.extend_from_slice(&key);
                    if let Some(old) = idx.insert(ck.as_bytes(), new_idx)?
                        && old.len() == 9
                        && old[0] == class as u8
                        && !self
                            .attempted(u64::from_be_bytes(old[1..9].try_into().unwrap_or([0; 8])))
                        && let Some(v) = q.remove(&old[1..])?
                    {
                        removed = Some(v.len());
                        m.insert(META_SUPERSEDED, &(superseded_before + 1).to_be_bytes())?;
                    }
                }
                q.insert(&key, value.as_slice())?;
                m.insert(META_SEQ, &seq.to_be_bytes())?;
                Ok(removed)
            })
            .map_err(tx_error)?;
        if let Some(len) = removed {
            i.bytes.fetch_sub(len as u64, Ordering::SeqCst);
            i.depth.fetch_sub(1, Ordering::SeqCst);
            i.superseded.fetch_add(1, Ordering::SeqCst);
        }
        i.seq.store(seq, Ordering::SeqCst);
        i.bytes.fetch_add(value.len() as u64, Ordering::SeqCst);
        i.depth.fetch_add(1, Ordering::SeqCst);
        self.enforce_budget()?;
        Ok(seq)
    }

    /// Drops the oldest metric batches while over budget.
    fn enforce_budget(&self) -> Result<()> {
        let i = &self.inner;
        let metrics = &i.queues[Class::Metrics as usize];
        while i.bytes.load(Ordering::SeqCst) > i.max_bytes {
            let oldest = metrics.iter().filter_map(|e| e.ok()).find(|(k, _)| {
                <[u8; 8]>::try_from(k.as_ref())
                    .is_ok_and(|k| !self.attempted(u64::from_be_bytes(k)))
            });
            let dropped_before = i.dropped.load(Ordering::SeqCst);
            let Some((_, v)) = oldest.and_then(|(k, _)| {
                (metrics, &i.meta)
                    .transaction(|(q, m)| {
                        let v = q.remove(&k)?;
                        if v.is_some() {
                            m.insert(META_DROPPED, &(dropped_before + 1).to_be_bytes())?;
                        }
                        Ok::<_, sled::transaction::ConflictableTransactionError<()>>(v)
                    })
                    .ok()
                    .flatten()
                    .map(|v| (k, v))
            }) else {
                tracing::error!(cluster = %i.cluster, bytes = i.bytes.load(Ordering::SeqCst), budget = i.max_bytes,
                    "outbox over its disk budget with no metric batches left to drop; keeping states, probes and events");
                break;
            };
            i.bytes.fetch_sub(v.len() as u64, Ordering::SeqCst);
            i.depth.fetch_sub(1, Ordering::SeqCst);
            i.dropped.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Makes everything accepted so far durable, then lets the drain see it.
    pub async fn flush(&self) -> Result<()> {
        let upto = self.inner.seq.load(Ordering::SeqCst);
        if upto == self.inner.flushed.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.inner.flusher.flush().await?;
        self.inner.flushed.fetch_max(upto, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
        Ok(())
    }

    /// Waits until something new is flushed (or a timeout elapses).
    pub async fn wait(&self, timeout: std::time::Duration) {
        let _ = tokio::time::timeout(timeout, self.inner.notify.notified()).await;
    }

    /// Whether `seq` was waiting in the outbox when it was opened: a process before this one may have sent
    /// it, and JetStream stored it, without its removal being recorded.
    pub fn carried_over(&self, seq: u64) -> bool {
        seq <= self.inner.attempted_floor
    }

    fn attempted(&self, seq: u64) -> bool {
        seq <= self.inner.attempted_floor
            || self
                .inner
                .attempted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&seq)
    }

    /// Up to `max` flushed messages, highest priority class first, oldest first within a class. They count
    /// as handed to the drain from now on (never superseded or dropped: they may be stored already).
    pub fn peek(&self, max: usize) -> Result<Vec<(Class, u64, Item)>> {
        let _guard = self
            .inner
            .write_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let out = self.peek_unmarked(max)?;
        let mut attempted = self
            .inner
            .attempted
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        attempted.extend(out.iter().map(|(_, seq, _)| *seq));
        Ok(out)
    }

    fn peek_unmarked(&self, max: usize) -> Result<Vec<(Class, u64, Item)>> {
        let flushed = self.inner.flushed.load(Ordering::SeqCst);
        let mut out = Vec::new();
        for class in Class::ALL {
            for entry in self.inner.queues[class as usize].iter() {
                if out.len() >= max {
                    return Ok(out);
                }
                let (k, v) = entry?;
                let Ok(key) = <[u8; 8]>::try_from(k.as_ref()) else {
                    continue;
                };
                let seq = u64::from_be_bytes(key);
                if seq > flushed {
                    break;
                }
                let item: Item = rmp_serde::from_slice(&v).map_err(|e| Error::Corrupt {
                    key: k.to_vec(),
                    reason: e.to_string(),
                })?;
                out.push((class, seq, item));
            }
        }
        Ok(out)
    }

    /// Removes a message JetStream answered as a duplicate of one it stored under another seq, and counts
    /// it (that seq will never be seen).
    pub fn remove_duplicate(&self, class: Class, seq: u64) -> Result<()> {
        self.remove_counted(class, seq, true)
    }

    /// Removes a message JetStream has confirmed. A message that was superseded or dropped while it was
    /// being sent has been delivered after all: it is taken off that count again.
    pub fn remove(&self, class: Class, seq: u64) -> Result<()> {
        self.remove_counted(class, seq, false)
    }

    fn remove_counted(&self, class: Class, seq: u64, duplicate: bool) -> Result<()> {
        let i = &self.inner;
        let _guard = i.write_lock.lock().unwrap_or_else(|e| e.into_inner());
        let key = seq.to_be_bytes();
        let (uncount, uncount_key) = if class == Class::Metrics {
            (&i.dropped, META_DROPPED)
        } else {
            (&i.superseded, META_SUPERSEDED)
        };
        let (dup_before, uncount_before) = (
            i.duplicates.load(Ordering::SeqCst),
            uncount.load(Ordering::SeqCst),
        );
        // removal and counters in one transaction: a crash can't count a message and keep it
        let removed = (&i.queues[class as usize], &i.meta)
            .transaction(|(q, m)| {
                let v = q.remove(&key)?;
                if duplicate {
                    m.insert(META_DUPLICATES, &(dup_before + 1).to_be_bytes())?;
                }
                if v.is_none() {
                    m.insert(uncount_key, &uncount_before.saturating_sub(1).to_be_bytes())?;
                }
                Ok(v)
            })
            .map_err(|e: TransactionError<()>| tx_error(e))?;
        if duplicate {
            i.duplicates.fetch_add(1, Ordering::SeqCst);
        }
        i.attempted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&seq);
        match removed {
            None => {
                let _ = uncount.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    Some(n.saturating_sub(1))
                });
            }
            Some(v) => {
                i.bytes.fetch_sub(v.len() as u64, Ordering::SeqCst);
                i.depth.fetch_sub(1, Ordering::SeqCst);
                if let Ok(item) = rmp_serde::from_slice::<Item>(&v)
                    && let Some(ck) = item.collapse
                {
                    // only if the index still points at this very message
                    let mut idx = vec![class as u8];
                    idx.extend_from_slice(&key);
                    let _ = i
                        .index
                        .compare_and_swap(ck.as_bytes(), Some(idx), None::<&[u8]>)?;
                }
            }
        }
        Ok(())
    }

    /// Counters now.
    pub fn counters(&self) -> Counters {
        let i = &self.inner;
        Counters {
            last_seq: i.seq.load(Ordering::SeqCst),
            superseded: i.superseded.load(Ordering::SeqCst),
            dropped_metric_batches: i.dropped.load(Ordering::SeqCst),
            duplicates: i.duplicates.load(Ordering::SeqCst),
            depth: i.depth.load(Ordering::SeqCst),
            bytes: i.bytes.load(Ordering::SeqCst),
        }
    }
}

/// Why a push failed.
#[derive(Debug, thiserror::Error)]
pub enum PushError<E> {
    /// The message could not be built (encoding).
    #[error("building the message: {0}")]
    Build(E),
    /// The outbox could not store it.
    #[error(transparent)]
    Outbox(#[from] Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(subject: &str, collapse: Option<&str>, size: usize) -> Item {
        Item {
            subject: subject.into(),
            msg_id: format!("id-{subject}"),
            schema: "X/1".into(),
            body: vec![7; size],
            collapse: collapse.map(str::to_string),
        }
    }

    fn open(dir: &std::path::Path, max_bytes: u64) -> (Store, Outbox) {
        let cfg = Config {
            path: dir.to_string_lossy().into(),
            max_bytes,
            ..Default::default()
        };
        let store = Store::open(&cfg).unwrap();
        let ob = store.outbox("c1").unwrap();
        (store, ob)
    }

    #[tokio::test]
    async fn clusters_flushing_together_share_fsyncs_and_each_sees_what_it_wrote_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = open(dir.path(), 1 << 30);
        let outboxes: Vec<Outbox> = (0..20)
            .map(|i| store.outbox(&format!("c{i}")).unwrap())
            .collect();
        for round in 0..3 {
            for (i, ob) in outboxes.iter().enumerate() {
                ob.push::<()>(Class::Event, |_| {
                    Ok(item(&format!("e{i}-{round}"), None, 10))
                })
                .unwrap();
            }
            let before = store.flusher.flushes();
            for r in futures::future::join_all(outboxes.iter().map(Outbox::flush)).await {
                r.unwrap();
            }
            // the first one asking starts a flush; those asking meanwhile are served by at most one more
            let fsyncs = store.flusher.flushes() - before;
            assert!(
                (1..=2).contains(&fsyncs),
                "{fsyncs} flushes for 20 outboxes"
            );
            for ob in &outboxes {
                assert_eq!(ob.peek(10).unwrap().len(), round + 1, "flushed and visible");
            }
        }
    }

    #[tokio::test]
    async fn drains_by_priority_and_only_what_is_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let (_s, ob) = open(dir.path(), 1 << 30);
        ob.push::<()>(Class::Metrics, |_| Ok(item("m", None, 10)))
            .unwrap();
        ob.push::<()>(Class::Event, |_| Ok(item("e", None, 10)))
            .unwrap();
        ob.push::<()>(Class::Heartbeat, |_| Ok(item("h", None, 10)))
            .unwrap();
        assert!(ob.peek(10).unwrap().is_empty(), "nothing before the flush");
        ob.flush().await.unwrap();
        let order: Vec<String> = ob
            .peek(10)
            .unwrap()
            .into_iter()
            .map(|(_, _, i)| i.subject)
            .collect();
        assert_eq!(order, ["h", "e", "m"]);
    }

    #[tokio::test]
    async fn newer_state_supersedes_the_waiting_one() {
        let dir = tempfile::tempdir().unwrap();
        let (_s, ob) = open(dir.path(), 1 << 30);
        ob.push::<()>(Class::State, |_| Ok(item("s1", Some("k"), 10)))
            .unwrap();
        let second = ob
            .push::<()>(Class::State, |_| Ok(item("s2", Some("k"), 10)))
            .unwrap();
        ob.flush().await.unwrap();
        let waiting = ob.peek(10).unwrap();
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].1, second);
        assert_eq!(ob.counters().superseded, 1);
        // a message handed to the drain is never superseded (it may be stored already)
        let handed = ob.peek(10).unwrap();
        assert_eq!(handed.len(), 1);
        ob.push::<()>(Class::State, |_| Ok(item("s2b", Some("k"), 10)))
            .unwrap();
        assert_eq!(ob.counters().superseded, 1);
        assert_eq!(ob.counters().depth, 2);
        ob.flush().await.unwrap();
        let newer = ob
            .peek(10)
            .unwrap()
            .into_iter()
            .map(|(_, s, _)| s)
            .max()
            .unwrap();
        ob.remove(Class::State, newer).unwrap();
        // once sent, a new state with the same key is kept again
        ob.remove(Class::State, second).unwrap();
        ob.push::<()>(Class::State, |_| Ok(item("s3", Some("k"), 10)))
            .unwrap();
        assert_eq!(ob.counters().superseded, 1);
        assert_eq!(ob.counters().depth, 1);
    }

    #[tokio::test]
    async fn budget_drops_oldest_metrics_first_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let (_s, ob) = open(dir.path(), 2_000);
        for i in 0..10 {
            ob.push::<()>(Class::Metrics, |_| Ok(item(&format!("m{i}"), None, 300)))
                .unwrap();
        }
        for i in 0..3 {
            ob.push::<()>(Class::Event, |_| Ok(item(&format!("e{i}"), None, 300)))
                .unwrap();
        }
        ob.flush().await.unwrap();
        let c = ob.counters();
        assert!(c.bytes <= 2_000, "{c:?}");
        assert!(c.dropped_metric_batches >= 7, "{c:?}");
        let left: Vec<String> = ob
            .peek(100)
            .unwrap()
            .into_iter()
            .map(|(_, _, i)| i.subject)
            .collect();
        assert!(left.contains(&"e0".to_string()) && left.contains(&"e2".to_string()));
        assert!(
            left.contains(&"m9".to_string()),
            "the newest metrics stay: {left:?}"
        );
        assert!(!left.contains(&"m0".to_string()));
    }

    #[tokio::test]
    async fn reopened_outbox_keeps_messages_and_counters() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (_s, ob) = open(dir.path(), 1 << 30);
            ob.push::<()>(Class::Event, |_| Ok(item("e", None, 10)))
                .unwrap();
            ob.push::<()>(Class::State, |_| Ok(item("s", Some("k"), 10)))
                .unwrap();
            ob.push::<()>(Class::State, |_| Ok(item("s", Some("k"), 10)))
                .unwrap();
            ob.flush().await.unwrap();
        }
        let (_s, ob) = open(dir.path(), 1 << 30);
        let c = ob.counters();
        assert_eq!((c.last_seq, c.superseded, c.depth), (3, 1, 2));
        assert_eq!(ob.peek(10).unwrap().len(), 2);
        let next = ob
            .push::<()>(Class::Event, |_| Ok(item("e2", None, 10)))
            .unwrap();
        assert_eq!(next, 4, "seq continues after a restart");
    }
}
