//! What the router keeps in sled: alerts, silences, the notification log, pending and dead notifications.
//! Values are JSON (small, and readable with any sled dump). A notification is made durable (pending +
//! notification-log entry, in one batch) before anything is sent, so a restart neither forgets what was
//! pending nor re-notifies what was already notified.

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
}

impl Alert {
    /// Whether it is still firing.
    pub fn firing(&self) -> bool {
        self.ends_at.is_none()
    }
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

/// The sled trees.
#[derive(Debug, Clone)]
pub struct Store {
    db: sled::Db,
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
    /// Opens (or creates) the store.
    pub fn open(path: &str) -> Result<Store, Error> {
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(16 * 1024 * 1024)
            .open()?;
        Ok(Store {
            alerts: db.open_tree("alerts")?,
            silences: db.open_tree("silences")?,
            nflog: db.open_tree("nflog")?,
            pending: db.open_tree("pending")?,
            dead: db.open_tree("dead")?,
            db,
        })
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
        (&self.pending, &self.nflog)
            .transaction(|(pt, nt)| {
                for (k, v) in &p {
                    pt.insert(k.as_bytes(), v.as_slice())?;
                }
                for (k, v) in &n {
                    nt.insert(k.as_bytes(), v.as_slice())?;
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
            .map_err(|e| match e {
                sled::transaction::TransactionError::Storage(s) => Error::Sled(s),
                sled::transaction::TransactionError::Abort(()) => {
                    Error::Sled(sled::Error::Unsupported("transaction aborted".into()))
                }
            })
    }
}
