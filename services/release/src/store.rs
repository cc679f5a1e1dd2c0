//! The role's durable state (sled): releases, snapshots and history.
//!
//! Trees: `releases` (name → `Release` JSON), `snapshots` (`name\0revision\0cluster` → the live objects
//! before the release touched them, JSON), `history` (`name\0<seq, 20 digits>` → `ReleaseEvent` JSON).
//! Every write that a later step relies on is flushed before the step.

use std::path::Path;

use multipilot_schemas::payload::{ObjectOutcome, ReleaseEvent};

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
    // one flush at a time, off the async threads: concurrent `flush_async` calls hung sled 0.34.7 here
    // (three releases applied at once; seen with gdb: every flush parked in sled's threadpool)
    flushing: std::sync::Arc<tokio::sync::Mutex<()>>,
}

fn snap_key(name: &str, revision: u64, cluster: &str) -> Vec<u8> {
    format!("{name}\0{revision}\0{cluster}").into_bytes()
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
            flushing: Default::default(),
            db,
        })
    }

    /// Flushes to disk.
    pub async fn flush(&self) -> Result<()> {
        let _one = self.flushing.lock().await;
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.flush())
            .await
            .map_err(|e| Error::Sled(sled::Error::ReportableBug(e.to_string())))??;
        Ok(())
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
        self.releases
            .insert(r.name.as_bytes(), serde_json::to_vec(r)?)?;
        self.flush().await
    }

    /// Stores a cluster's snapshot (durably), unless one exists: the first snapshot of a revision is the
    /// state before the release, whatever a retried step later reads.
    pub async fn put_snapshot(
        &self,
        name: &str,
        revision: u64,
        cluster: &str,
        objects: &[ObjectOutcome],
    ) -> Result<()> {
        let key = snap_key(name, revision, cluster);
        let _ = self.snapshots.compare_and_swap(
            key,
            None as Option<&[u8]>,
            Some(serde_json::to_vec(objects)?),
        )?;
        self.flush().await
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
    pub fn add_event(&self, seq: u64, ev: &ReleaseEvent) -> Result<()> {
        self.history.insert(
            format!("{}\0{seq:020}", ev.release).into_bytes(),
            serde_json::to_vec(ev)?,
        )?;
        Ok(())
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
