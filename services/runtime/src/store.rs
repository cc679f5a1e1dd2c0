//! Local sled stores: closing one so that the next open in the same process (a restarted role, a test that
//! reopens) finds it free.
//!
//! Dropping a `sled::Db` does not release its file lock at once: sled's background threads still hold the
//! store's configuration, and so the locked `<dir>/db` file, for a moment after the last handle is gone.
//! [`wait_released`] waits until the lock can be taken, so a store is closed when `close` returns.
//!
//! [`GroupFlush`]: one fsync at a time for a store many tasks flush.

use std::path::Path;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The file sled locks in a store's directory.
const LOCK_FILE: &str = "db";

/// Closing a store failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// sled's background threads still hold the store's lock after the deadline.
    #[error("the store in {dir} is still locked {waited:?} after it was closed")]
    StillLocked {
        /// The store's directory.
        dir: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The lock file could not be opened.
    #[error("cannot open the lock file of the store in {dir}")]
    Io {
        /// The store's directory.
        dir: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Waits (up to `timeout`) until no handle in this process or another holds the sled store in `dir`.
/// Call it after dropping every handle of the store. A directory without a store is free.
pub async fn wait_released(dir: &Path, timeout: Duration) -> Result<(), Error> {
    let path = dir.join(LOCK_FILE);
    let started = Instant::now();
    loop {
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(Error::Io {
                    dir: dir.display().to_string(),
                    source,
                });
            }
        };
        // flock-style locks belong to an open file description, so this conflicts with sled's own lock
        // even within one process; the lock is released again when `file` is dropped.
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(Error::Io {
                    dir: dir.display().to_string(),
                    source,
                });
            }
        }
        if started.elapsed() >= timeout {
            return Err(Error::StillLocked {
                dir: dir.display().to_string(),
                waited: started.elapsed(),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reports the page cache a role gave its sled store (`<role>.cache_bytes`) as
/// `multipilot_<role>_cache_capacity_bytes`, so a dashboard sets the process' memory beside what was asked of it.
pub fn report_cache(registry: &RwLock<Registry>, role: &str, bytes: u64) {
    let gauge = Gauge::<i64>::default();
    gauge.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    let mut registry = registry
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    registry.register(
        format!("multipilot_{role}_cache_capacity_bytes"),
        format!("The page cache of the {role}'s local store (`{role}.cache_bytes`)"),
        gauge,
    );
}

/// The flushes of one sled store that several tasks flush (an agent's outboxes, one per cluster), done
/// together.
///
/// sled 0.34 holds its process-wide concurrency control for the whole fsync of a flush, and every
/// transaction and batch (`Tree::transaction`, `Tree::apply_batch`) must wait for it. Tasks flushing on
/// their own keep an fsync running most of the time: an agent serving 17 clusters, each flushing its
/// outbox every 100 ms, stored what its watchers read so slowly that events reached the bus 15–35 s late
/// (50 clusters on 2 cores). A caller here is answered by the first flush that starts
/// after it asked; flushes run one at a time, at least `min_gap` apart, so one fsync serves every task
/// that asked meanwhile.
#[derive(Debug)]
pub struct GroupFlush {
    db: sled::Db,
    min_gap: Duration,
    /// Flushes started.
    started: AtomicU64,
    /// The number of the last flush that finished, and when the last one started.
    done: tokio::sync::Mutex<(u64, Option<tokio::time::Instant>)>,
}

impl GroupFlush {
    /// Flushes of `db`, started at most every `min_gap`.
    pub fn new(db: sled::Db, min_gap: Duration) -> Self {
        GroupFlush {
            db,
            min_gap,
            started: AtomicU64::new(0),
            done: tokio::sync::Mutex::new((0, None)),
        }
    }

    /// Returns once everything written to the store before the call is on disk. The fsync runs on the
    /// blocking pool: sled's `flush_async`, awaited by many tasks at once while others wait in
    /// transactions, could leave every runtime worker blocked.
    pub async fn flush(&self) -> sled::Result<()> {
        let asked = self.started.load(Ordering::SeqCst);
        let mut done = self.done.lock().await;
        // a flush that started after this call has finished: it covered what was written before it
        if done.0 > asked {
            return Ok(());
        }
        if let Some(last) = done.1 {
            tokio::time::sleep_until(last + self.min_gap).await;
        }
        let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        done.1 = Some(tokio::time::Instant::now());
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.flush())
            .await
            .map_err(|e| sled::Error::Unsupported(format!("flush task: {e}")))??;
        done.0 = n;
        Ok(())
    }

    /// Flushes started so far.
    pub fn flushes(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roles_cache_is_reported_under_its_name() -> anyhow::Result<()> {
        let registry = RwLock::new(Registry::default());
        report_cache(&registry, "correlator", 32 << 20);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry.read().unwrap())?;
        assert!(
            out.lines()
                .any(|l| l == "multipilot_correlator_cache_capacity_bytes 33554432"),
            "{out}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_held_store_is_reported_and_a_dropped_one_released() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join(LOCK_FILE), b"")?;
        let held = std::fs::File::open(dir.path().join(LOCK_FILE))?;
        held.lock()?;
        let err = wait_released(dir.path(), Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::StillLocked { .. }), "{err}");
        drop(held);
        wait_released(dir.path(), Duration::from_secs(1)).await?;
        // no store at all: nothing to wait for
        wait_released(&dir.path().join("absent"), Duration::from_millis(1)).await?;
        Ok(())
    }
}
