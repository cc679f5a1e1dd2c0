//! Replicated key-value buckets (JetStream KV) for the state a role can't rebuild from the streams
//! (silences, the notification log, release history): a role keeps its working copy in sled and writes
//! through to a bucket, and restores from the bucket when its local store is gone.
//!
//! Keys are `<kind>.<hash>` (a [`stable_id`](multipilot_schemas::stable_id) of the record's identity), so
//! any id — slashes, NULs, long group keys — makes a valid KV key; values carry their own identity, so a
//! restore doesn't need to invert the hash. Buckets use file storage and keep one revision per key.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::StreamExt;

/// A bucket's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    /// Name (`MULTIPILOT_SILENCES`): letters, digits, `-` and `_`.
    pub name: String,
    /// What it holds.
    pub description: String,
    /// Replicas (3 on a three-node JetStream cluster).
    pub replicas: usize,
    /// Entries not written again within this long are dropped (zero: kept forever).
    pub max_age: Duration,
}

/// Bucket failures. All but [`Error::Key`] are retryable: the server may be away or electing a leader.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bucket could not be created, updated or found.
    #[error("KV bucket {bucket}: {reason}")]
    Open {
        /// Bucket.
        bucket: String,
        /// Why.
        reason: String,
    },
    /// A value could not be written or deleted.
    #[error("KV bucket {bucket}, key {key}: {reason}")]
    Write {
        /// Bucket.
        bucket: String,
        /// Key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The bucket could not be read.
    #[error("reading KV bucket {bucket}: {reason}")]
    Read {
        /// Bucket.
        bucket: String,
        /// Why.
        reason: String,
    },
    /// A key kind that would make an invalid key (a bug; not retryable).
    #[error("{0:?} is not a valid KV key kind (letters, digits, '-' and '_')")]
    Key(String),
}

/// Result with this module's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Creates the bucket, or brings an existing one to these settings (replicas, max age).
pub async fn open(js: &jetstream::Context, b: &Bucket) -> Result<kv::Store> {
    js.create_or_update_key_value(kv::Config {
        bucket: b.name.clone(),
        description: b.description.clone(),
        history: 1,
        max_age: b.max_age,
        storage: jetstream::stream::StorageType::File,
        num_replicas: b.replicas.max(1),
        ..Default::default()
    })
    .await
    .map_err(|e| Error::Open {
        bucket: b.name.clone(),
        reason: e.to_string(),
    })
}

/// The key of a record: `<kind>.<hash of its identity>`.
pub fn key(kind: &str, identity: &[&str]) -> Result<String> {
    if kind.is_empty()
        || !kind
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(Error::Key(kind.to_string()));
    }
    Ok(format!(
        "{kind}.{}",
        multipilot_schemas::stable_id(identity)
    ))
}

/// Writes a value; returns once the bucket stored it.
pub async fn put(store: &kv::Store, key: &str, value: Vec<u8>) -> Result<u64> {
    store
        .put(key, Bytes::from(value))
        .await
        .map_err(|e| Error::Write {
            bucket: store.name.clone(),
            key: key.to_string(),
            reason: e.to_string(),
        })
}

/// Deletes a key (a delete marker; absent keys are fine).
pub async fn delete(store: &kv::Store, key: &str) -> Result<()> {
    store.delete(key).await.map_err(|e| Error::Write {
        bucket: store.name.clone(),
        key: key.to_string(),
        reason: e.to_string(),
    })
}

/// Every live key with its value (deleted and expired keys are left out).
pub async fn load_all(store: &kv::Store) -> Result<Vec<(String, Bytes)>> {
    let read = |e: &dyn std::fmt::Display| Error::Read {
        bucket: store.name.clone(),
        reason: e.to_string(),
    };
    let mut keys = store.keys().await.map_err(|e| read(&e))?;
    let mut names = Vec::new();
    while let Some(k) = keys.next().await {
        names.push(k.map_err(|e| read(&e))?);
    }
    let mut out = Vec::with_capacity(names.len());
    for k in names {
        // a key deleted (or aged out) between the listing and the read is simply gone
        if let Some(v) = store.get(k.as_str()).await.map_err(|e| read(&e))? {
            out.push((k, v));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_valid_whatever_the_identity() {
        let k = key("nflog", &["fleet\u{0}{cluster=\"a/b c\"}"]).unwrap();
        assert!(k.starts_with("nflog."));
        assert!(
            k.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
        );
        assert_ne!(k, key("nflog", &["fleet", "{cluster=\"a/b c\"}"]).unwrap());
        assert!(matches!(key("a.b", &["x"]), Err(Error::Key(_))));
        assert!(matches!(key("", &["x"]), Err(Error::Key(_))));
    }
}
