//! The role's durable state (sled): releases, snapshots and history.
//!
//! Trees: `releases` (name → `Release` JSON), `snapshots` (`name\0revision\0cluster` → the live objects
//! before the release touched them, JSON), `history` (`name\0<seq, 20 digits>` → `ReleaseEvent` JSON).
//! Every write that a later step relies on is flushed before the step.
//!
//! None of it can be rebuilt from the streams, so every record is also written through to the JetStream KV
//! bucket `MULTIPILOT_RELEASES` (keys `release.<hash>`, `snapshot.<hash>`, `history.<hash>`; values say
//! what they are, see [`Record`]): a write puts the record in the `outbox` tree in the same sled
//! transaction, and [`Store::flush`] drains the outbox into the bucket. A snapshot is in the bucket before
//! `put_snapshot` returns (a rollback after losing this disk needs it); other records follow with the next
//! flush when the bucket is briefly unreachable. A store found empty at start is restored from the bucket
//! (`Store::restore`).

use std::path::Path;

use multipilot_schemas::payload::{ObjectOutcome, ReleaseEvent};
use serde::{Deserialize, Serialize};

use crate::model::Release;

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// sled.
    #[error("release store: {0}")]
    Sled(#[from] sled::Error),
    /// A record that doesn't decode.
    #[error("release store: corrupt record: {0}")]
    Json(#[from] serde_json::Error),
    /// The store was not released in time after it was closed.
    #[error("release store: {0}")]
    Close(#[from] multipilot_runtime::store::Error),
    /// The replicated bucket could not be written or read (retryable).
    #[error("release replica: {0}")]
    Replica(#[from] multipilot_bus::kv::Error),
}

/// The bucket.
pub const BUCKET: &str = "MULTIPILOT_RELEASES";

/// Set in `meta` once the store was restored from (or seeded into) the bucket.
const MARK_REPLICATED: &[u8] = b"replicated";
/// Set in `meta` while a restore is under way (a crash in the middle restores again).
const RESTORING: &[u8] = b"restoring";

/// One record as the bucket holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Record {
    /// A release.
    Release {
        /// It.
        release: Box<Release>,
    },
    /// A cluster's snapshot.
    Snapshot {
        /// Release name.
        release: String,
        /// Revision.
        revision: u64,
        /// Cluster.
        cluster: String,
        /// The live objects before the release touched them.
        objects: Vec<ObjectOutcome>,
    },
    /// A history entry.
    History {
        /// Its sequence in the release's history.
        seq: u64,
        /// It.
        event: Box<ReleaseEvent>,
    },
}

impl Record {
    /// Its key in the bucket.
    pub fn key(&self) -> Result<String> {
        Ok(match self {
            Record::Release { release } => multipilot_bus::kv::key("release", &[&release.name])?,
            Record::Snapshot {
                release,
                revision,
                cluster,
                ..
            } => multipilot_bus::kv::key("snapshot", &[release, &revision.to_string(), cluster])?,
            Record::History { seq, event } => {
                multipilot_bus::kv::key("history", &[&event.release, &seq.to_string()])?
            }
        })
    }
}

/// What a restore found in the bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restored {
    /// Releases.
    pub releases: usize,
    /// Snapshots.
    pub snapshots: usize,
    /// History entries.
    pub history: usize,
    /// Records that didn't decode (skipped).
    pub skipped: usize,
}

/// Result with this module's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The store.
#[derive(Debug, Clone)]
pub struct Store {
    db: sled::Db,
    releases: sled::Tree,
    snapshots: sled::Tree,
    history: sled::Tree,
    /// Records not yet in the bucket, by KV key.
    outbox: sled::Tree,
    meta: sled::Tree,
    replica: Option<async_nats::jetstream::kv::Store>,
    // one flush at a time, off the async threads: concurrent `flush_async` calls hung sled 0.34.7 here
    // (three releases applied at once; seen with gdb: every flush parked in sled's threadpool)
    flushing: std::sync::Arc<tokio::sync::Mutex<()>>,
}

fn snap_key(name: &str, revision: u64, cluster: &str) -> Vec<u8> {
    format!("{name}\0{revision}\0{cluster}").into_bytes()
}

fn history_key(name: &str, seq: u64) -> Vec<u8> {
    format!("{name}\0{seq:020}").into_bytes()
}

impl Store {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Store> {
        let db = sled::Config::new()
            .path(dir.join("db"))
            .cache_capacity(32 << 20)
            .open()?;
        Ok(Store {
            releases: db.open_tree("releases")?,
            snapshots: db.open_tree("snapshots")?,
            history: db.open_tree("history")?,
            outbox: db.open_tree("outbox")?,
            meta: db.open_tree("meta")?,
            replica: None,
            flushing: Default::default(),
            db,
        })
    }

    /// Flushes and closes the store (this handle and its clones must be the last): when this returns, sled's
    /// lock on `dir` is released and the directory may be opened again, in this process or another.
    pub async fn close(self, dir: &Path) -> Result<()> {
        self.db.flush_async().await?;
        drop(self);
        Ok(multipilot_runtime::store::wait_released(
            &dir.join("db"),
            std::time::Duration::from_secs(30),
        )
        .await?)
    }

    /// Writes every record through to this bucket from now on.
    pub fn with_replica(mut self, bucket: async_nats::jetstream::kv::Store) -> Store {
        self.replica = Some(bucket);
        self
    }

    /// Flushes to disk, then puts what waits in the outbox in the bucket. A bucket that can't be reached is
    /// logged, and tried again on the next flush.
    pub async fn flush(&self) -> Result<()> {
        if let Err(e) = self.flush_replicated().await {
            match e {
                Error::Replica(e) => {
                    tracing::warn!(error = %e, "release records stored locally; replicating them will be retried")
                }
                e => return Err(e),
            }
        }
        Ok(())
    }

    /// Flushes to disk and puts what waits in the outbox in the bucket; fails if the bucket can't be reached.
    pub async fn flush_replicated(&self) -> Result<()> {
        let _one = self.flushing.lock().await;
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.flush())
            .await
            .map_err(|e| Error::Sled(sled::Error::ReportableBug(e.to_string())))??;
        let Some(bucket) = &self.replica else {
            return Ok(());
        };
        for kv in self.outbox.iter() {
            let (k, v) = kv?;
            let key = String::from_utf8_lossy(&k).into_owned();
            multipilot_bus::kv::put(bucket, &key, v.to_vec()).await?;
            // only if nobody wrote a newer value meanwhile: that one goes out on the next flush
            let _ = self
                .outbox
                .compare_and_swap(&k, Some(&v), None as Option<&[u8]>)?;
        }
        Ok(())
    }

    /// Records waiting for the bucket.
    pub fn outbox_len(&self) -> usize {
        self.outbox.len()
    }

    /// Whether this store has never held anything (a new or wiped data directory), or a restore into it
    /// didn't finish.
    pub fn is_blank(&self) -> Result<bool> {
        if self.meta.get(RESTORING)?.is_some() {
            return Ok(true);
        }
        Ok(self.meta.get(MARK_REPLICATED)?.is_none()
            && self.releases.is_empty()
            && self.snapshots.is_empty()
            && self.history.is_empty())
    }

    /// Brings the store in line with the bucket at start: a blank store is filled from it, a store that
    /// predates it is copied into it. Returns what was restored (zero when nothing was).
    pub async fn sync_with_replica(&self) -> Result<Restored> {
        if self.replica.is_none() {
            return Ok(Restored::default());
        }
        let mut restored = Restored::default();
        if self.is_blank()? {
            self.meta.insert(RESTORING, b"1".as_slice())?;
            self.flush_replicated().await?;
            restored = self.restore().await?;
            self.meta.insert(MARK_REPLICATED, b"1".as_slice())?;
            self.meta.remove(RESTORING)?;
        } else if self.meta.get(MARK_REPLICATED)?.is_none() {
            for r in self.all()? {
                self.queue(&Record::Release {
                    release: Box::new(r),
                })?;
            }
            for kv in self.snapshots.iter() {
                let (k, v) = kv?;
                let key = String::from_utf8_lossy(&k).into_owned();
                let mut parts = key.splitn(3, '\0');
                let (Some(release), Some(revision), Some(cluster)) =
                    (parts.next(), parts.next(), parts.next())
                else {
                    continue;
                };
                self.queue(&Record::Snapshot {
                    release: release.into(),
                    revision: revision.parse().unwrap_or_default(),
                    cluster: cluster.into(),
                    objects: serde_json::from_slice(&v)?,
                })?;
            }
            for kv in self.history.iter() {
                let (k, v) = kv?;
                let key = String::from_utf8_lossy(&k).into_owned();
                let seq = key
                    .rsplit('\0')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_default();
                self.queue(&Record::History {
                    seq,
                    event: serde_json::from_slice(&v)?,
                })?;
            }
            self.meta.insert(MARK_REPLICATED, b"1".as_slice())?;
        }
        self.flush_replicated().await?;
        Ok(restored)
    }

    fn queue(&self, r: &Record) -> Result<()> {
        self.outbox.insert(r.key()?, serde_json::to_vec(r)?)?;
        Ok(())
    }

    /// Fills the trees from the bucket.
    async fn restore(&self) -> Result<Restored> {
        let Some(bucket) = &self.replica else {
            return Ok(Restored::default());
        };
        let mut out = Restored::default();
        for (key, v) in multipilot_bus::kv::load_all(bucket).await? {
            match serde_json::from_slice::<Record>(&v) {
                Ok(Record::Release { release }) => {
                    self.releases
                        .insert(release.name.as_bytes(), serde_json::to_vec(&release)?)?;
                    out.releases += 1;
                }
                Ok(Record::Snapshot {
                    release,
                    revision,
                    cluster,
                    objects,
                }) => {
                    self.snapshots.insert(
                        snap_key(&release, revision, &cluster),
                        serde_json::to_vec(&objects)?,
                    )?;
                    out.snapshots += 1;
                }
                Ok(Record::History { seq, event }) => {
                    self.history.insert(
                        history_key(&event.release, seq),
                        serde_json::to_vec(&event)?,
                    )?;
                    out.history += 1;
                }
                Err(e) => {
                    tracing::warn!(%key, error = %e, "skipping an unreadable record in the bucket");
                    out.skipped += 1;
                }
            }
        }
        Ok(out)
    }

    /// Writes a tree entry and, when replicated, its record in the outbox, atomically; with `keep`, an
    /// existing entry stays and nothing is written.
    fn write(
        &self,
        tree: &sled::Tree,
        key: &[u8],
        value: &[u8],
        record: &Record,
        keep: bool,
    ) -> Result<()> {
        use sled::Transactional;
        let queued = match &self.replica {
            Some(_) => Some((record.key()?, serde_json::to_vec(record)?)),
            None => None,
        };
        (tree, &self.outbox)
            .transaction(|(t, o)| {
                if keep && t.get(key)?.is_some() {
                    return Ok(());
                }
                t.insert(key, value)?;
                if let Some((k, v)) = &queued {
                    o.insert(k.as_bytes(), v.as_slice())?;
                }
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(|e| match e {
                sled::transaction::TransactionError::Storage(s) => Error::Sled(s),
                sled::transaction::TransactionError::Abort(()) => {
                    Error::Sled(sled::Error::Unsupported("transaction aborted".into()))
                }
            })
    }

    /// One release.
    pub fn get(&self, name: &str) -> Result<Option<Release>> {
        Ok(match self.releases.get(name.as_bytes())? {
            Some(v) => Some(serde_json::from_slice(&v)?),
            None => None,
        })
    }

    /// Every release.
    pub fn all(&self) -> Result<Vec<Release>> {
        let mut out = Vec::new();
        for kv in self.releases.iter() {
            let (_, v) = kv?;
            out.push(serde_json::from_slice(&v)?);
        }
        Ok(out)
    }

    /// Stores a release (durably).
    pub async fn put(&self, r: &Release) -> Result<()> {
        self.write(
            &self.releases,
            r.name.as_bytes(),
            &serde_json::to_vec(r)?,
            &Record::Release {
                release: Box::new(r.clone()),
            },
            false,
        )?;
        self.flush().await
    }

    /// Stores a cluster's snapshot (durably, and in the bucket when replicated), unless one exists: the
    /// first snapshot of a revision is the state before the release, whatever a retried step later reads.
    pub async fn put_snapshot(
        &self,
        name: &str,
        revision: u64,
        cluster: &str,
        objects: &[ObjectOutcome],
    ) -> Result<()> {
        self.write(
            &self.snapshots,
            &snap_key(name, revision, cluster),
            &serde_json::to_vec(objects)?,
            &Record::Snapshot {
                release: name.into(),
                revision,
                cluster: cluster.into(),
                objects: objects.to_vec(),
            },
            true,
        )?;
        self.flush_replicated().await
    }

    /// A cluster's snapshot.
    pub fn snapshot(
        &self,
        name: &str,
        revision: u64,
        cluster: &str,
    ) -> Result<Option<Vec<ObjectOutcome>>> {
        Ok(
            match self.snapshots.get(snap_key(name, revision, cluster))? {
                Some(v) => Some(serde_json::from_slice(&v)?),
                None => None,
            },
        )
    }

    /// Appends a history entry.
    /// (Durable and replicated with the next flush.)
    pub fn add_event(&self, seq: u64, ev: &ReleaseEvent) -> Result<()> {
        self.write(
            &self.history,
            &history_key(&ev.release, seq),
            &serde_json::to_vec(ev)?,
            &Record::History {
                seq,
                event: Box::new(ev.clone()),
            },
            false,
        )
    }

    /// A release's history, oldest first.
    pub fn history(&self, name: &str) -> Result<Vec<ReleaseEvent>> {
        let mut out = Vec::new();
        for kv in self.history.scan_prefix(format!("{name}\0").as_bytes()) {
            let (_, v) = kv?;
            out.push(serde_json::from_slice(&v)?);
        }
        Ok(out)
    }
}
