//! Local sled stores: closing one so that the next open in the same process (a restarted role, a test that
//! reopens) finds it free.
//!
//! Dropping a `sled::Db` does not release its file lock at once: sled's background threads still hold the
//! store's configuration, and so the locked `<dir>/db` file, for a moment after the last handle is gone.
//! [`wait_released`] waits until the lock can be taken, so a store is closed when `close` returns.

use std::path::Path;
use std::sync::RwLock;
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
