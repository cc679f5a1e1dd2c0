//! The correlator's durable state, in sled: what the machine changed ([`Changes`]) and the outbox of
//! messages not yet confirmed by JetStream, written together in one atomic batch, so state and outputs are
//! never out of step after a crash.
//!
//! One tree, `state`, with a prefix per record type (MessagePack values): `c` cluster state, `b` its
//! heartbeat fields, `p` a probe (`<cluster>/<probe>`), `h` a spec change (`<cluster>/<seq, 16 hex
//! digits>`), `e` a storm window's counters and `g` its warnings in parts of 5 s of cluster time
//! (`<cluster>/<start>`), `s` spec hash (`<cluster>/<kind>/<ns>/<name>`), `a` a workload's compared
//! settings, `i` incident (by key), `f` fleet incident (by key), `d` dedup record (by id), `o` outbox entry
//! (by sequence), `m` meta (high-water marks, the initialized marker).
//!
//! Only what changed is written: a heartbeat rewrites its `b` record, a probe result its `p` record, a spec
//! change adds one `h` record (and drops the oldest), a storm window the parts that changed — not the
//! cluster's record, which changes with its facts, inventory, compared settings, compliance and releases.
//! Records of an older version that held these inside the cluster's record (or a storm window whole, `w`)
//! are read as they were and moved to their own keys when the store opens (a whole window, when next
//! written). A store written by an older version still (JSON in the trees `clusters`, `incidents`,
//! `dedup`, `meta`) is moved into this layout when opened.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::machine::{Changes, Out, Snapshot};
use crate::state::{Beat, ChangeRec, ClusterState, ProbeTrack, change_key, probe_key};

const TREE: &str = "state";
const P_CLUSTER: u8 = b'c';
const P_CHANGE: u8 = b'h';
const P_SPEC: u8 = b's';
const P_INCIDENT: u8 = b'i';
const P_DEDUP: u8 = b'd';
const P_OUTBOX: u8 = b'o';
const P_META: u8 = b'm';
const P_WINDOW: u8 = b'w';
const P_FLEET: u8 = b'f';
const P_WORKLOAD: u8 = b'a';
const P_BEAT: u8 = b'b';
const P_PROBE: u8 = b'p';
const P_STORM_HEAD: u8 = b'e';
const P_STORM_PART: u8 = b'g';

/// The span of cluster time one stored part of a storm window holds (the window is written at most every
/// [`crate::state::StormWindow::SAVE_EVERY`]: a write rewrites the parts that changed, mostly the newest).
const STORM_PART_SECS: i64 = 5;

/// A storm window's fields but its warnings (which are stored in parts by time).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
struct StormHead {
    seen: u64,
    checked: Option<(u64, chrono::DateTime<chrono::Utc>)>,
}

type Warning = (chrono::DateTime<chrono::Utc>, String);

/// A storm window's parts as written: start → [`storm_signature`].
type StormParts = BTreeMap<i64, (usize, i128)>;

/// The start of the part of a storm window that holds a warning at `t`.
fn storm_part(t: chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp().div_euclid(STORM_PART_SECS) * STORM_PART_SECS
}

/// The key of `cluster`'s storm window part starting at `start` (sorting in time order).
fn storm_part_key(cluster: &str, start: i64) -> String {
    format!("{cluster}/{:016x}", (start as u64) ^ (1 << 63))
}

/// What tells a written part from a changed one: warnings are only added (in time order) or dropped from
/// the front, so a part whose count and sum of times are the same holds the same warnings.
fn storm_signature(part: &[Warning]) -> (usize, i128) {
    let sum = part
        .iter()
        .map(|(t, _)| i128::from(t.timestamp_micros()))
        .sum();
    (part.len(), sum)
}

/// A storm window's warnings (in time order) cut into parts: (start, warnings), in time order.
fn storm_parts(warnings: &[Warning]) -> impl Iterator<Item = (i64, &[Warning])> {
    warnings
        .chunk_by(|a, b| storm_part(a.0) == storm_part(b.0))
        .map(|part| (storm_part(part[0].0), part))
}

/// Adds to `b` the removal of every record of `prefix` under `cluster/`.
fn remove_under(
    tree: &sled::Tree,
    b: &mut sled::Batch,
    prefix: u8,
    cluster: &str,
) -> Result<(), Error> {
    for old in tree.scan_prefix(key(prefix, &format!("{cluster}/"))) {
        b.remove(old?.0);
    }
    Ok(())
}
const K_HWM: &str = "hwm";
/// Written once the store was set up (its absence on an empty store: new or wiped).
const K_INITIALIZED: &str = "initialized";

/// Storage failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// sled failed.
    #[error("correlator store: {0}")]
    Sled(#[from] sled::Error),
    /// The directory could not be set up or released.
    #[error("correlator store in {dir}: {reason}")]
    Dir {
        /// Directory.
        dir: String,
        /// Why.
        reason: String,
    },
    /// A value could not be encoded.
    #[error("correlator store: encoding a {what}: {reason}")]
    Encode {
        /// What.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

impl Error {
    /// Whether trying again may succeed (a full disk may clear; an encoding error will not).
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Error::Encode { .. })
    }
}

fn key(prefix: u8, name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 1);
    k.push(prefix);
    k.extend_from_slice(name.as_bytes());
    k
}

fn enc<T: Serialize>(what: &'static str, v: &T) -> Result<Vec<u8>, Error> {
    rmp_serde::to_vec_named(v).map_err(|e| Error::Encode {
        what,
        reason: e.to_string(),
    })
}

fn dec<T: DeserializeOwned>(what: &str, k: &[u8], v: &[u8]) -> Option<T> {
    match rmp_serde::from_slice(v) {
        Ok(t) => Some(t),
        Err(e) => {
            // an unreadable record is dropped (and logged): the streams rebuild what it held
            tracing::warn!(what, key = %String::from_utf8_lossy(k), error = %e, "unreadable record in the correlator store; skipped");
            None
        }
    }
}

/// What [`apart`] moved.
#[derive(Debug, Default)]
struct Apart {
    /// Spec changes.
    changes: usize,
    /// Clusters whose heartbeat and probes were moved.
    clusters: usize,
}

impl Apart {
    fn add(&mut self, o: Apart) {
        self.changes += o.changes;
        self.clusters += o.clusters;
    }
}

/// Adds what an older version's record of `cluster` holds that is now stored apart to `b` under their own
/// keys: its changes, numbered from 0 in the order held (and numbers `c`'s next change after them), its
/// heartbeat fields and its probes. `c`, encoded, no longer holds them.
fn apart(b: &mut sled::Batch, cluster: &str, c: &mut ClusterState) -> Result<Apart, Error> {
    for (seq, ch) in c.changes.iter().enumerate() {
        b.insert(
            key(P_CHANGE, &change_key(cluster, seq as u64)),
            enc("spec change", ch)?,
        );
    }
    c.changes_next = c.changes_next.max(c.changes.len() as u64);
    let held = c.holds_beat_or_probes();
    if held {
        b.insert(key(P_BEAT, cluster), enc("heartbeat", &c.beat())?);
        for (probe, p) in &c.probes {
            b.insert(key(P_PROBE, &probe_key(cluster, probe)), enc("probe", p)?);
        }
    }
    Ok(Apart {
        changes: c.changes.len(),
        clusters: usize::from(held),
    })
}

/// The outbox: messages the machine produced, in order, until JetStream confirms them.
#[derive(Debug, Default)]
pub struct Outbox {
    pending: BTreeMap<u64, Out>,
    next: u64,
    /// Entries below this sequence are durable (written and flushed): only they may be published.
    durable: u64,
    unsaved: Vec<u64>,
    confirmed: Vec<u64>,
}

impl Outbox {
    /// Adds messages to publish.
    pub fn push(&mut self, outs: Vec<Out>) {
        for o in outs {
            self.pending.insert(self.next, o);
            self.unsaved.push(self.next);
            self.next += 1;
        }
    }

    /// What waits for confirmation, in order.
    pub fn pending(&self) -> Vec<Out> {
        self.pending.values().cloned().collect()
    }

    /// How many wait for confirmation.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// What waits for confirmation and is durable ([`Outbox::made_durable`]), in order: what may be
    /// published.
    pub fn publishable(&self) -> Vec<Out> {
        self.pending
            .range(..self.durable)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// The sequence up to which the entries are written once [`Store::write`] returned.
    pub fn written_up_to(&self) -> u64 {
        self.next
    }

    /// The entries below `up_to` (from [`Outbox::written_up_to`]) are flushed.
    pub fn made_durable(&mut self, up_to: u64) {
        self.durable = self.durable.max(up_to);
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Forgets the messages JetStream stored.
    pub fn confirm(&mut self, msg_ids: &[String]) {
        let ids: std::collections::HashSet<&str> = msg_ids.iter().map(String::as_str).collect();
        let done: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, o)| ids.contains(o.msg_id.as_str()))
            .map(|(k, _)| *k)
            .collect();
        for k in done {
            self.pending.remove(&k);
            self.unsaved.retain(|u| *u != k);
            self.confirmed.push(k);
        }
    }
}

/// The store.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    db: sled::Db,
    tree: sled::Tree,
    /// Per cluster, the parts of its storm window as written: start → signature.
    storm_written: std::sync::Mutex<BTreeMap<String, StormParts>>,
}

impl Store {
    /// Opens (or creates) the store in `dir`, with a page cache of `cache_bytes`.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Dir {
            dir: dir.display().to_string(),
            reason: e.to_string(),
        })?;
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .open()
            .map_err(|e| Error::Dir {
                dir: dir.display().to_string(),
                reason: format!("opening: {e}"),
            })?;
        let tree = db.open_tree(TREE)?;
        let store = Store {
            dir: dir.to_path_buf(),
            db,
            tree,
            storm_written: Default::default(),
        };
        store.migrate()?;
        store.move_apart()?;
        Ok(store)
    }

    /// Whether the store is new, wiped, or was being rebuilt when the process stopped: never marked
    /// initialized (see [`Store::mark_initialized`]).
    pub fn is_fresh(&self) -> Result<bool, Error> {
        Ok(!self.tree.contains_key(key(P_META, K_INITIALIZED))?)
    }

    /// Marks the store initialized (see [`Store::is_fresh`]) and flushes.
    pub async fn mark_initialized(&self) -> Result<(), Error> {
        self.tree.insert(key(P_META, K_INITIALIZED), &[1u8])?;
        self.flush().await
    }

    /// Reads everything back: the machine's state and the outbox.
    pub fn load(&self) -> Result<(Snapshot, Outbox), Error> {
        let mut s = Snapshot::default();
        let mut outbox = Outbox::default();
        // in key order: by cluster, each cluster's by seq
        let mut changes: BTreeMap<String, Vec<ChangeRec>> = BTreeMap::new();
        let mut beats: BTreeMap<String, Beat> = BTreeMap::new();
        let mut probes: BTreeMap<String, BTreeMap<String, ProbeTrack>> = BTreeMap::new();
        let mut storm_parts_read: BTreeMap<String, Vec<Vec<Warning>>> = BTreeMap::new();
        let mut storm_whole: BTreeMap<String, crate::state::StormWindow> = BTreeMap::new();
        for item in self.tree.iter() {
            let (k, v) = item?;
            let Some((&prefix, name)) = k.split_first() else {
                continue;
            };
            let name = String::from_utf8_lossy(name).into_owned();
            match prefix {
                P_CLUSTER => {
                    if let Some(c) = dec("cluster", &k, &v) {
                        s.clusters.insert(name, c);
                    }
                }
                P_CHANGE => {
                    let parsed = name.rsplit_once('/').and_then(|(cluster, seq)| {
                        Some((cluster.to_string(), u64::from_str_radix(seq, 16).ok()?))
                    });
                    if let (Some((cluster, seq)), Some(mut ch)) =
                        (parsed, dec::<ChangeRec>("spec change", &k, &v))
                    {
                        ch.seq = seq;
                        changes.entry(cluster).or_default().push(ch);
                    }
                }
                P_BEAT => {
                    if let Some(h) = dec::<Beat>("heartbeat", &k, &v) {
                        beats.insert(name, h);
                    }
                }
                P_PROBE => {
                    if let (Some((cluster, probe)), Some(p)) =
                        (name.split_once('/'), dec::<ProbeTrack>("probe", &k, &v))
                    {
                        probes
                            .entry(cluster.to_string())
                            .or_default()
                            .insert(probe.to_string(), p);
                    }
                }
                P_WINDOW => {
                    // the older layout: the whole window in one record (replaced when next written);
                    // an older version wrote it after any parts there are
                    if let Some(w) = dec::<crate::state::StormWindow>("storm window", &k, &v) {
                        storm_whole.insert(name, w);
                    }
                }
                P_STORM_HEAD => {
                    if let Some(h) = dec::<StormHead>("storm window", &k, &v) {
                        let w = s.windows.entry(name).or_default();
                        w.seen = h.seen;
                        w.checked = h.checked;
                    }
                }
                P_STORM_PART => {
                    if let (Some((cluster, _)), Some(part)) = (
                        name.rsplit_once('/'),
                        dec::<Vec<Warning>>("storm window part", &k, &v),
                    ) {
                        storm_parts_read
                            .entry(cluster.to_string())
                            .or_default()
                            .push(part);
                    }
                }
                P_SPEC => {
                    if let (Some((cluster, object)), Some(hash)) =
                        (name.split_once('/'), dec::<String>("spec hash", &k, &v))
                    {
                        s.specs
                            .entry(cluster.to_string())
                            .or_default()
                            .insert(object.to_string(), hash);
                    }
                }
                P_WORKLOAD => {
                    if let (Some((cluster, object)), Some(settings)) = (
                        name.split_once('/'),
                        dec::<BTreeMap<String, String>>("workload settings", &k, &v),
                    ) {
                        s.workloads
                            .entry(cluster.to_string())
                            .or_default()
                            .insert(object.to_string(), settings);
                    }
                }
                P_INCIDENT => {
                    if let Some(i) = dec("incident", &k, &v) {
                        s.incidents.insert(name, i);
                    }
                }
                P_FLEET => {
                    if let Some(f) = dec("fleet incident", &k, &v) {
                        s.fleet.insert(name, f);
                    }
                }
                P_DEDUP => {
                    if let Some(r) = dec("dedup record", &k, &v) {
                        s.dedup.push(r);
                    }
                }
                P_OUTBOX => {
                    let seq = <[u8; 8]>::try_from(&k[1..]).map(u64::from_be_bytes);
                    if let (Ok(seq), Some(o)) = (seq, dec::<Out>("outbox entry", &k, &v)) {
                        outbox.pending.insert(seq, o);
                        outbox.next = outbox.next.max(seq + 1);
                        outbox.durable = outbox.next;
                    }
                }
                P_META if name == K_HWM => {
                    if let Some(h) = dec("high-water marks", &k, &v) {
                        s.hwm = h;
                    }
                }
                _ => {}
            }
        }
        // a window's parts, in key order: in time order
        let mut written = self.storm_written.lock().unwrap_or_else(|e| e.into_inner());
        written.clear();
        for (cluster, parts) in storm_parts_read {
            // each record is one part, as written
            let sigs = parts
                .iter()
                .filter_map(|p| Some((storm_part(p.first()?.0), storm_signature(p))))
                .collect();
            written.insert(cluster.clone(), sigs);
            s.windows.entry(cluster).or_default().warnings = parts.into_iter().flatten().collect();
        }
        for (cluster, w) in storm_whole {
            written.remove(&cluster);
            s.windows.insert(cluster, w);
        }
        drop(written);
        // what is stored apart whose cluster's record is gone (unreadable) goes with it
        for (cluster, h) in beats {
            if let Some(c) = s.clusters.get_mut(&cluster) {
                c.set_beat(h);
            }
        }
        for (cluster, p) in probes {
            if let Some(c) = s.clusters.get_mut(&cluster) {
                c.probes = p;
            }
        }
        for (cluster, list) in changes {
            if let Some(c) = s.clusters.get_mut(&cluster) {
                c.changes_next = c
                    .changes_next
                    .max(list.last().map_or(0, |ch| ch.seq.saturating_add(1)));
                c.changes = list.into();
            }
        }
        Ok((s, outbox))
    }

    /// Writes what changed and the outbox's new and confirmed entries, in one atomic batch (not yet
    /// flushed: see [`Store::flush`]).
    pub fn write(&self, changes: Changes, outbox: &mut Outbox) -> Result<(), Error> {
        let mut b = sled::Batch::default();
        fn put(b: &mut sled::Batch, prefix: u8, name: &str, v: Option<Vec<u8>>) {
            match v {
                Some(v) => b.insert(key(prefix, name), v),
                None => b.remove(key(prefix, name)),
            }
        }
        fn encoded<T: Serialize>(
            what: &'static str,
            v: Option<T>,
        ) -> Result<Option<Vec<u8>>, Error> {
            v.map(|v| enc(what, &v)).transpose()
        }
        for (k, c) in changes.clusters {
            if c.is_none() {
                // what is stored apart goes with it
                b.remove(key(P_BEAT, &k));
                remove_under(&self.tree, &mut b, P_PROBE, &k)?;
            }
            put(&mut b, P_CLUSTER, &k, encoded("cluster", c)?);
        }
        for (k, h) in changes.beats {
            put(&mut b, P_BEAT, &k, encoded("heartbeat", h)?);
        }
        for (k, p) in changes.probes {
            put(&mut b, P_PROBE, &k, encoded("probe", p)?);
        }
        for (k, ch) in changes.changes {
            put(&mut b, P_CHANGE, &k, encoded("spec change", ch)?);
        }
        let storm_written = self.storm(changes.windows, &mut b)?;
        for (k, h) in changes.specs {
            put(&mut b, P_SPEC, &k, encoded("spec hash", h)?);
        }
        for (k, w) in changes.workloads {
            put(&mut b, P_WORKLOAD, &k, encoded("workload settings", w)?);
        }
        for (k, i) in changes.incidents {
            put(&mut b, P_INCIDENT, &k, encoded("incident", i)?);
        }
        for (k, f) in changes.fleet {
            put(&mut b, P_FLEET, &k, encoded("fleet incident", f)?);
        }
        for (k, r) in changes.dedup {
            put(&mut b, P_DEDUP, &k, encoded("dedup record", r.as_deref())?);
        }
        if let Some(h) = changes.hwm {
            put(&mut b, P_META, K_HWM, Some(enc("high-water marks", &h)?));
        }
        let outbox_key = |seq: u64| {
            let mut k = vec![P_OUTBOX];
            k.extend_from_slice(&seq.to_be_bytes());
            k
        };
        for seq in std::mem::take(&mut outbox.unsaved) {
            if let Some(o) = outbox.pending.get(&seq) {
                b.insert(outbox_key(seq), enc("outbox entry", o)?);
            }
        }
        for seq in std::mem::take(&mut outbox.confirmed) {
            b.remove(outbox_key(seq));
        }
        self.tree.apply_batch(b)?;
        let mut written = self.storm_written.lock().unwrap_or_else(|e| e.into_inner());
        for (cluster, parts) in storm_written {
            match parts {
                Some(p) => written.insert(cluster, p),
                None => written.remove(&cluster),
            };
        }
        Ok(())
    }

    /// Adds storm windows to `b`: each one's head, and the parts of its warnings that changed since they
    /// were written (and the removal of those that fell out of it). Returns what is written once `b` is.
    fn storm(
        &self,
        windows: Vec<(String, Option<crate::state::StormWindow>)>,
        b: &mut sled::Batch,
    ) -> Result<Vec<(String, Option<StormParts>)>, Error> {
        let written = self.storm_written.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(windows.len());
        for (cluster, w) in windows {
            // a window of the older layout (whole, in one record) is replaced
            b.remove(key(P_WINDOW, &cluster));
            let Some(mut w) = w else {
                b.remove(key(P_STORM_HEAD, &cluster));
                remove_under(&self.tree, b, P_STORM_PART, &cluster)?;
                out.push((cluster, None));
                continue;
            };
            let head = StormHead {
                seen: w.seen,
                checked: w.checked,
            };
            b.insert(key(P_STORM_HEAD, &cluster), enc("storm window", &head)?);
            let before = written.get(&cluster);
            if before.is_none() {
                // not written by this process nor read back whole: whatever parts are stored go
                remove_under(&self.tree, b, P_STORM_PART, &cluster)?;
            }
            let mut now = BTreeMap::new();
            for (start, part) in storm_parts(w.warnings.make_contiguous()) {
                let sig = storm_signature(part);
                if before.and_then(|p| p.get(&start)) != Some(&sig) {
                    b.insert(
                        key(P_STORM_PART, &storm_part_key(&cluster, start)),
                        enc("storm window part", &part)?,
                    );
                }
                now.insert(start, sig);
            }
            for start in before.into_iter().flat_map(BTreeMap::keys) {
                if !now.contains_key(start) {
                    b.remove(key(P_STORM_PART, &storm_part_key(&cluster, *start)));
                }
            }
            out.push((cluster, Some(now)));
        }
        Ok(out)
    }

    /// Makes everything written so far durable.
    pub async fn flush(&self) -> Result<(), Error> {
        self.flusher().await
    }

    /// A flush that doesn't borrow the store (so a lock around it can be let go before awaiting it).
    pub fn flusher(&self) -> impl std::future::Future<Output = Result<(), Error>> + Send + 'static {
        let tree = self.tree.clone();
        async move {
            tree.flush_async().await?;
            Ok(())
        }
    }

    /// Flushes and closes the store: when this returns, the directory can be opened again (sled's threads
    /// have let go of its lock).
    pub async fn close(self) -> Result<(), Error> {
        self.flush().await?;
        let Store { dir, db, tree, .. } = self;
        drop(tree);
        drop(db);
        multipilot_runtime::store::wait_released(&dir, Duration::from_secs(10))
            .await
            .map_err(|e| Error::Dir {
                dir: dir.display().to_string(),
                reason: e.to_string(),
            })
    }

    /// Moves what a cluster record of an older version holds that is now stored apart (its changes,
    /// numbered from 0 in the order they were held; its heartbeat fields; its probes) to their own records,
    /// in one batch with the record rewritten without them.
    fn move_apart(&self) -> Result<(), Error> {
        let mut b = sled::Batch::default();
        let mut moved = Apart::default();
        for item in self.tree.scan_prefix([P_CLUSTER]) {
            let (k, v) = item?;
            let Some(mut c) = dec::<ClusterState>("cluster", &k, &v) else {
                continue;
            };
            if c.changes.is_empty() && !c.holds_beat_or_probes() {
                continue;
            }
            let cluster = String::from_utf8_lossy(&k[1..]).into_owned();
            // records a later version wrote for it before this one ran again are replaced
            if !c.changes.is_empty() {
                remove_under(&self.tree, &mut b, P_CHANGE, &cluster)?;
            }
            if c.holds_beat_or_probes() {
                remove_under(&self.tree, &mut b, P_PROBE, &cluster)?;
            }
            moved.add(apart(&mut b, &cluster, &mut c)?);
            b.insert(k, enc("cluster", &c.record())?);
        }
        if moved.changes + moved.clusters > 0 {
            self.tree.apply_batch(b)?;
            self.tree.flush()?;
            tracing::info!(
                changes = moved.changes,
                clusters = moved.clusters,
                "correlator store: spec changes, heartbeats and probes moved to their own records"
            );
        }
        Ok(())
    }

    /// Moves a store written by an older version (JSON values in per-type trees) into the one tree.
    fn migrate(&self) -> Result<(), Error> {
        let names = self.db.tree_names();
        let has = |n: &str| names.iter().any(|t| t.as_ref() == n.as_bytes());
        if !["clusters", "incidents", "dedup", "meta"]
            .iter()
            .any(|n| has(n))
        {
            return Ok(());
        }
        let mut b = sled::Batch::default();
        let mut moved = 0usize;
        let json = |what: &'static str, v: &[u8]| -> Option<serde_json::Value> {
            serde_json::from_slice(v)
                .inspect_err(|e| tracing::warn!(what, error = %e, "unreadable old record; skipped"))
                .ok()
        };
        for (tree, prefix, what) in [
            ("clusters", P_CLUSTER, "cluster"),
            ("incidents", P_INCIDENT, "incident"),
            ("dedup", P_DEDUP, "dedup record"),
        ] {
            if !has(tree) {
                continue;
            }
            for item in self.db.open_tree(tree)?.iter() {
                let (k, v) = item?;
                let Some(value) = json(what, &v) else {
                    continue;
                };
                let typed = match prefix {
                    P_CLUSTER => {
                        match serde_json::from_value::<crate::state::ClusterState>(value) {
                            Ok(mut c) => {
                                // spec hashes are kept per object now, and changes one by one
                                let cluster = String::from_utf8_lossy(&k).into_owned();
                                apart(&mut b, &cluster, &mut c)?;
                                for (object, hash) in std::mem::take(&mut c.spec_hashes) {
                                    b.insert(
                                        key(P_SPEC, &format!("{cluster}/{object}")),
                                        enc("spec hash", &hash)?,
                                    );
                                }
                                Some(enc(what, &c.record()))
                            }
                            Err(_) => None,
                        }
                    }
                    P_INCIDENT => {
                        serde_json::from_value::<multipilot_schemas::payload::Incident>(value)
                            .ok()
                            .map(|i| enc(what, &i))
                    }
                    _ => serde_json::from_value::<crate::dedup::Record>(value)
                        .ok()
                        .map(|r| enc(what, &r)),
                };
                if let Some(bytes) = typed.transpose()? {
                    b.insert(key(prefix, &String::from_utf8_lossy(&k)), bytes);
                    moved += 1;
                }
            }
        }
        if has("meta") {
            let meta = self.db.open_tree("meta")?;
            if let Some(v) = meta.get("hwm")?
                && let Ok(h) = serde_json::from_slice::<BTreeMap<String, u64>>(&v)
            {
                b.insert(key(P_META, K_HWM), enc("high-water marks", &h)?);
            }
            if let Some(v) = meta.get("out")?
                && let Ok(outs) = serde_json::from_slice::<Vec<Out>>(&v)
            {
                for (seq, o) in outs.iter().enumerate() {
                    let mut k = vec![P_OUTBOX];
                    k.extend_from_slice(&(seq as u64).to_be_bytes());
                    b.insert(k, enc("outbox entry", o)?);
                }
            }
            if meta.contains_key(K_INITIALIZED)? {
                b.insert(key(P_META, K_INITIALIZED), vec![1u8]);
            }
        }
        self.tree.apply_batch(b)?;
        self.tree.flush()?;
        for tree in ["clusters", "incidents", "dedup", "meta"] {
            if has(tree) {
                self.db.drop_tree(tree)?;
            }
        }
        self.db.flush()?;
        tracing::info!(
            records = moved,
            "correlator store moved to the one-tree layout"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dedup::Record;
    use crate::state::ClusterState;
    use multipilot_schemas::payload::{ObjectRef, Severity};

    fn record(id: &str) -> Record {
        Record {
            id: id.into(),
            cluster: "c1".into(),
            object: ObjectRef {
                kind: "Pod".into(),
                name: "web-*".into(),
                ..Default::default()
            },
            reason: "BackOff".into(),
            severity: Severity::Warning,
            first_seen: chrono::DateTime::UNIX_EPOCH,
            last_seen: chrono::DateTime::UNIX_EPOCH,
            count: 3,
            last_message: "Back-off".into(),
            event_uids: vec!["ev-1".into()],
            passed_at: Some(chrono::DateTime::UNIX_EPOCH),
        }
    }

    fn out(id: &str) -> Out {
        Out {
            subject: "fleet.incident.c1.x".into(),
            msg_id: id.into(),
            schema: "Incident/1".into(),
            body: vec![1, 2, 3],
        }
    }

    fn fleet_incident() -> multipilot_schemas::payload::FleetIncident {
        let entry = multipilot_schemas::catalog::entries()
            .into_iter()
            .find(|e| e.name == "FleetIncident")
            .unwrap();
        rmp_serde::from_slice::<multipilot_schemas::Envelope<_>>(&entry.sample)
            .unwrap()
            .payload
    }

    #[tokio::test]
    async fn what_is_written_reads_back_and_confirmed_outputs_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        assert!(store.is_fresh().unwrap());
        let mut outbox = Outbox::default();
        outbox.push(vec![out("a"), out("b")]);
        let changes = Changes {
            clusters: vec![("c1".into(), Some(ClusterState::default()))],
            changes: vec![],
            windows: vec![(
                "c1".into(),
                Some(crate::state::StormWindow {
                    seen: 7,
                    ..Default::default()
                }),
            )],
            specs: vec![("c1/Deployment/ns/web".into(), Some("h1".into()))],
            workloads: vec![(
                "c1/Deployment ns/web".into(),
                Some(BTreeMap::from([(
                    "web.resources.limits.memory".to_string(),
                    "256Mi".to_string(),
                )])),
            )],
            incidents: vec![],
            dedup: vec![
                ("r1".into(), Some(record("r1").into())),
                ("r2".into(), Some(record("r2").into())),
            ],
            hwm: Some(BTreeMap::from([("correlator-events".to_string(), 42)])),
            fleet: vec![("dns-failure".into(), Some(fleet_incident()))],
            beats: vec![("c1".into(), Some(beat()))],
            probes: vec![("c1/coredns".into(), Some(probe("NXDOMAIN")))],
        };
        store.write(changes, &mut outbox).unwrap();
        outbox.confirm(&["a".to_string()]);
        let gone = Changes {
            dedup: vec![("r2".into(), None)],
            ..Default::default()
        };
        store.write(gone, &mut outbox).unwrap();
        store.mark_initialized().await.unwrap();
        store.close().await.unwrap();

        let store = Store::open(dir.path(), 1 << 20).unwrap();
        assert!(!store.is_fresh().unwrap());
        let (s, outbox) = store.load().unwrap();
        assert_eq!(s.clusters.keys().collect::<Vec<_>>(), vec!["c1"]);
        assert_eq!(s.clusters["c1"].beat(), beat());
        assert_eq!(s.clusters["c1"].probes["coredns"], probe("NXDOMAIN"));
        assert_eq!(s.windows["c1"].seen, 7);
        assert_eq!(s.specs["c1"]["Deployment/ns/web"], "h1");
        assert_eq!(
            s.workloads["c1"]["Deployment ns/web"]["web.resources.limits.memory"],
            "256Mi"
        );
        assert_eq!(s.dedup, vec![record("r1")]);
        assert_eq!(s.hwm["correlator-events"], 42);
        assert_eq!(s.fleet["dns-failure"], fleet_incident());
        let pending: Vec<String> = outbox.pending().into_iter().map(|o| o.msg_id).collect();
        assert_eq!(pending, vec!["b"]);
        store.close().await.unwrap();
    }

    fn beat() -> crate::state::Beat {
        crate::state::Beat {
            last_ingest: chrono::DateTime::from_timestamp(1_800_000_000, 0),
            interval_s: 5,
            streak: 3,
            last_seq: 41,
            skew_samples: [0.25, -0.5].into(),
        }
    }

    fn probe(detail: &str) -> ProbeTrack {
        ProbeTrack {
            last_time: chrono::DateTime::from_timestamp(1_800_000_005, 0),
            bad: BTreeMap::from([("dns-failure".to_string(), 2)]),
            detail: detail.into(),
            history: [(
                chrono::DateTime::from_timestamp(1_800_000_005, 0).unwrap(),
                BTreeMap::from([("latency_ms".to_string(), 12.5)]),
            )]
            .into(),
            ..Default::default()
        }
    }

    /// c1's record holds nothing of what is stored apart (its heartbeat and probes are there, empty, for
    /// the version before, which requires them), and that version reads it. Returns the record.
    fn assert_record_holds_nothing_stored_apart(store: &Store) -> serde_json::Value {
        let bytes = store.tree.get(key(P_CLUSTER, "c1")).unwrap().unwrap();
        let c: ClusterState = rmp_serde::from_slice(&bytes).unwrap();
        assert!(!c.holds_beat_or_probes(), "{c:?}");
        // the fields the version before this layout requires (no serde default)
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        struct Before {
            hb_last_ingest: Option<chrono::DateTime<chrono::Utc>>,
            hb_interval_s: u32,
            hb_streak: u32,
            hb_last_seq: u64,
            skew_samples: Vec<f64>,
            probes: BTreeMap<String, ProbeTrack>,
            labels: BTreeMap<String, String>,
        }
        rmp_serde::from_slice::<Before>(&bytes).expect("the version before reads the record");
        rmp_serde::from_slice(&bytes).unwrap()
    }

    /// A heartbeat or a probe result writes only its own record; a cluster's record written again keeps
    /// them, and a cluster forgotten takes them along.
    #[tokio::test]
    async fn heartbeats_and_probes_are_written_apart_and_go_with_their_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        let mut outbox = Outbox::default();
        let labels = ClusterState {
            labels: BTreeMap::from([("tier".to_string(), "prod".to_string())]),
            ..Default::default()
        };
        let first = Changes {
            clusters: vec![("c1".into(), Some(labels.record()))],
            beats: vec![("c1".into(), Some(beat()))],
            probes: vec![
                ("c1/coredns".into(), Some(probe("old"))),
                ("c1/etcd".into(), Some(probe("fine"))),
            ],
            ..Default::default()
        };
        store.write(first, &mut outbox).unwrap();
        let one_probe = Changes {
            probes: vec![("c1/coredns".into(), Some(probe("NXDOMAIN")))],
            ..Default::default()
        };
        store.write(one_probe, &mut outbox).unwrap();
        let mut full = labels.clone();
        full.set_beat(beat());
        full.probes.insert("coredns".into(), probe("ignored"));
        let record_again = Changes {
            clusters: vec![("c1".into(), Some(full.record()))],
            ..Default::default()
        };
        store.write(record_again, &mut outbox).unwrap();
        assert_record_holds_nothing_stored_apart(&store);
        store.close().await.unwrap();

        let (store, c) = reopened_c1(dir.path());
        assert_eq!(c.labels, labels.labels);
        assert_eq!(c.beat(), beat());
        assert_eq!(c.probes.len(), 2);
        assert_eq!(c.probes["coredns"], probe("NXDOMAIN"));
        assert_eq!(c.probes["etcd"], probe("fine"));
        let forgotten = Changes {
            clusters: vec![("c1".into(), None)],
            ..Default::default()
        };
        store.write(forgotten, &mut outbox).unwrap();
        assert_eq!(store.tree.scan_prefix([P_BEAT]).count(), 0);
        assert_eq!(store.tree.scan_prefix([P_PROBE]).count(), 0);
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn a_cluster_record_holding_its_heartbeat_probes_and_changes_has_them_moved_to_their_own_keys()
     {
        // the record as an older version wrote it: heartbeat fields, probes and changes inside
        #[derive(Serialize)]
        struct Old<'a> {
            #[serde(flatten)]
            state: &'a ClusterState,
            changes: Vec<ChangeRec>,
        }
        let dir = tempfile::tempdir().unwrap();
        let b = beat();
        {
            let store = Store::open(dir.path(), 1 << 20).unwrap();
            let mut state = ClusterState {
                labels: BTreeMap::from([("tier".to_string(), "prod".to_string())]),
                probes: BTreeMap::from([("coredns".to_string(), probe("NXDOMAIN"))]),
                ..Default::default()
            };
            state.set_beat(b.clone());
            let old = Old {
                state: &state,
                changes: vec![change(1, "a"), change(2, "b")],
            };
            store
                .tree
                .insert(key(P_CLUSTER, "c1"), enc("cluster", &old).unwrap())
                .unwrap();
            // what a later version had written for c1 before this older record came back: replaced
            store
                .tree
                .insert(
                    key(P_PROBE, "c1/etcd"),
                    enc("probe", &probe("stale")).unwrap(),
                )
                .unwrap();
            store
                .tree
                .insert(
                    key(P_CHANGE, "c1/0000000000000007"),
                    enc("spec change", &change(7, "stale")).unwrap(),
                )
                .unwrap();
            store.close().await.unwrap();
        }
        let (store, c) = reopened_c1(dir.path());
        assert_eq!(c.labels["tier"], "prod");
        assert_eq!(c.beat(), b);
        assert_eq!(
            c.probes,
            BTreeMap::from([("coredns".to_string(), probe("NXDOMAIN"))])
        );
        assert_eq!(seqs_and_hashes(&c), vec![(0, "a".into()), (1, "b".into())]);
        assert_eq!(c.changes_next, 2);
        assert_eq!(store.tree.scan_prefix([P_CHANGE]).count(), 2);
        let raw = assert_record_holds_nothing_stored_apart(&store);
        assert!(raw.get("changes").is_none(), "{raw}");
        assert_eq!(raw["labels"]["tier"], "prod");
        store.close().await.unwrap();
        // and once more: nothing left to move, the same state
        let (store, again) = reopened_c1(dir.path());
        assert_eq!(again.beat(), b);
        assert_eq!(again.probes.len(), 1);
        store.close().await.unwrap();
    }

    fn window(seen: u64, times: &[i64]) -> crate::state::StormWindow {
        crate::state::StormWindow {
            warnings: times
                .iter()
                .map(|t| {
                    (
                        chrono::DateTime::from_timestamp(*t, 0).unwrap(),
                        format!("BackOff Pod shop/web-{t}"),
                    )
                })
                .collect(),
            seen,
            checked: None,
        }
    }

    fn write_window(store: &Store, w: crate::state::StormWindow) {
        let changes = Changes {
            windows: vec![("c1".into(), Some(w))],
            ..Default::default()
        };
        store.write(changes, &mut Outbox::default()).unwrap();
    }

    /// A storm window is written in parts of 5 s of cluster time: a write rewrites the parts that changed
    /// and drops those that fell out of the window, and the parts read back as the window.
    #[tokio::test]
    async fn a_storm_window_is_written_in_parts_and_only_changed_parts_are_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        let t0 = 1_800_000_000; // a multiple of 5
        write_window(&store, window(3, &[t0, t0 + 6, t0 + 11]));
        assert_eq!(store.tree.scan_prefix([P_STORM_PART]).count(), 3);
        // mark the middle part as stored: a write that does not rewrite it leaves the mark
        let middle = key(P_STORM_PART, &storm_part_key("c1", t0 + 5));
        let marked: Vec<Warning> = vec![(
            chrono::DateTime::from_timestamp(t0 + 6, 0).unwrap(),
            "marked".into(),
        )];
        store
            .tree
            .insert(&middle, enc("part", &marked).unwrap())
            .unwrap();
        // the oldest part falls out, the newest gets one more warning
        write_window(&store, window(4, &[t0 + 6, t0 + 11, t0 + 12]));
        assert_eq!(store.tree.scan_prefix([P_STORM_PART]).count(), 2);
        store.close().await.unwrap();

        let store = Store::open(dir.path(), 1 << 20).unwrap();
        let (s, _) = store.load().unwrap();
        let w = &s.windows["c1"];
        assert_eq!(w.seen, 4);
        let read: Vec<(i64, &str)> = w
            .warnings
            .iter()
            .map(|(t, k)| (t.timestamp() - t0, k.as_str()))
            .collect();
        let (k11, k12) = (
            format!("BackOff Pod shop/web-{}", t0 + 11),
            format!("BackOff Pod shop/web-{}", t0 + 12),
        );
        assert_eq!(
            read,
            vec![(6, "marked"), (11, k11.as_str()), (12, k12.as_str())],
            "the unchanged part was not rewritten"
        );
        // read back, the same window is not written again; a cleared one drops every part
        write_window(&store, window(4, &[t0 + 6, t0 + 11, t0 + 12]));
        assert!(store.tree.get(&middle).unwrap().is_some());
        write_window(&store, window(4, &[]));
        assert_eq!(store.tree.scan_prefix([P_STORM_PART]).count(), 0);
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn a_storm_window_of_the_older_layout_reads_back_and_is_written_in_parts() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = 1_800_000_000;
        {
            let store = Store::open(dir.path(), 1 << 20).unwrap();
            store
                .tree
                .insert(
                    key(P_WINDOW, "c1"),
                    enc("storm window", &window(2, &[t0, t0 + 7])).unwrap(),
                )
                .unwrap();
            store.close().await.unwrap();
        }
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        let (s, _) = store.load().unwrap();
        assert_eq!(s.windows["c1"], window(2, &[t0, t0 + 7]));
        write_window(&store, window(3, &[t0, t0 + 7, t0 + 8]));
        assert!(store.tree.get(key(P_WINDOW, "c1")).unwrap().is_none());
        store.close().await.unwrap();
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        let (s, _) = store.load().unwrap();
        assert_eq!(s.windows["c1"], window(3, &[t0, t0 + 7, t0 + 8]));
        store.close().await.unwrap();
    }

    fn change(at_s: i64, to: &str) -> ChangeRec {
        ChangeRec {
            at: chrono::DateTime::from_timestamp(at_s, 0).unwrap(),
            object: ObjectRef {
                kind: "Deployment".into(),
                name: "web".into(),
                ..Default::default()
            },
            from: "h0".into(),
            to: to.into(),
            delta: None,
            seq: 0,
        }
    }

    /// The store in `dir` opened again, and cluster c1 as it reads back.
    fn reopened_c1(dir: &Path) -> (Store, ClusterState) {
        let store = Store::open(dir, 1 << 20).unwrap();
        let (mut s, _) = store.load().unwrap();
        let c = s.clusters.remove("c1").expect("c1 reads back");
        (store, c)
    }

    fn seqs_and_hashes(c: &ClusterState) -> Vec<(u64, String)> {
        c.changes.iter().map(|ch| (ch.seq, ch.to.clone())).collect()
    }

    #[test]
    fn only_outputs_made_durable_may_be_published() {
        let mut outbox = Outbox::default();
        outbox.push(vec![out("a"), out("b")]);
        assert!(outbox.publishable().is_empty(), "not written yet");
        let written = outbox.written_up_to();
        outbox.push(vec![out("c")]); // applied after the write: not in it
        outbox.made_durable(written);
        let ids =
            |o: &Outbox| -> Vec<String> { o.publishable().into_iter().map(|o| o.msg_id).collect() };
        assert_eq!(ids(&outbox), vec!["a", "b"]);
        outbox.confirm(&["a".to_string()]);
        assert_eq!(ids(&outbox), vec!["b"]);
        assert_eq!(outbox.len(), 2);
        outbox.made_durable(outbox.written_up_to());
        assert_eq!(ids(&outbox), vec!["b", "c"]);
    }

    #[tokio::test]
    async fn changes_stored_one_by_one_read_back_in_order_with_their_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        let mut outbox = Outbox::default();
        let cluster = ClusterState {
            changes_next: 12,
            ..Default::default()
        };
        let put = |seq: u64, to: &str| (format!("c1/{seq:016x}"), Some(change(seq as i64, to)));
        let changes = Changes {
            clusters: vec![("c1".into(), Some(cluster))],
            changes: vec![put(9, "a"), put(10, "b"), put(11, "c")],
            ..Default::default()
        };
        store.write(changes, &mut outbox).unwrap();
        let dropped = Changes {
            changes: vec![("c1/0000000000000009".into(), None)],
            ..Default::default()
        };
        store.write(dropped, &mut outbox).unwrap();
        store.close().await.unwrap();

        let (store, c) = reopened_c1(dir.path());
        assert_eq!(
            seqs_and_hashes(&c),
            vec![(10, "b".into()), (11, "c".into())]
        );
        assert_eq!(c.change_seqs(), 10..12);
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn a_store_of_the_older_layout_is_moved_into_the_one_tree() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::open(dir.path()).unwrap();
            let mut cluster = serde_json::to_value(ClusterState::default()).unwrap();
            cluster["spec_hashes"] = serde_json::json!({"Deployment/ns/web": "h0"});
            db.open_tree("clusters")
                .unwrap()
                .insert("c1", serde_json::to_vec(&cluster).unwrap())
                .unwrap();
            db.open_tree("dedup")
                .unwrap()
                .insert("r1", serde_json::to_vec(&record("r1")).unwrap())
                .unwrap();
            let meta = db.open_tree("meta").unwrap();
            meta.insert("hwm", br#"{"correlator-state":7}"#.to_vec())
                .unwrap();
            meta.insert("out", serde_json::to_vec(&vec![out("x")]).unwrap())
                .unwrap();
            meta.insert(K_INITIALIZED, &[1u8]).unwrap();
            db.flush().unwrap();
            drop((meta, db));
            multipilot_runtime::store::wait_released(dir.path(), Duration::from_secs(10))
                .await
                .unwrap();
        }
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        assert!(!store.is_fresh().unwrap(), "the marker moved too");
        let (s, outbox) = store.load().unwrap();
        assert_eq!(s.dedup, vec![record("r1")]);
        assert_eq!(s.hwm["correlator-state"], 7);
        assert_eq!(outbox.pending(), vec![out("x")]);
        // the cluster's spec hashes come along, kept per object
        assert_eq!(s.specs["c1"]["Deployment/ns/web"], "h0");
        assert!(s.clusters["c1"].spec_hashes.is_empty());
        store.close().await.unwrap();
    }
}
