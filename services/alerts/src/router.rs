//! The dispatcher's shell: the [`Engine`] on its [`Store`]. It starts the engine from what sled holds,
//! writes what the engine decided (a flush's notifications with their log entries in one sled transaction,
//! which also queues the log entries for the KV bucket) at every tick, and what it changed (alerts, posted
//! ones queued for their bucket) when asked: at a checkpoint, after a post, at the stop. It keeps what the
//! store could not write to write it next time. Flushing sled, draining the outbox into
//! the buckets and waking the deliverer are the caller's (the tick loop in `lib.rs`, the API).

use chrono::{DateTime, Utc};

use crate::config::Routing;
use crate::engine::{Changes, Ending, Engine, Notify, Snapshot};
use crate::store::{self, Alert, Error, NflogEntry, Pending, Silence, Store};

/// The engine and its store.
#[derive(Debug)]
pub struct Router {
    /// The state machine.
    pub engine: Engine,
    /// The durable store.
    pub store: Store,
    /// Decisions the store failed to write: written before the next ones.
    unwritten: Vec<Notify>,
    /// Something was written since the last [`Router::take_written`] (the caller flushes it).
    written: bool,
}

impl Router {
    /// Opens the dispatcher on its store: alerts, silences and the notification log come back.
    pub fn open(
        store: Store,
        routing: Routing,
        retain_resolved: std::time::Duration,
        nflog_retention: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Router {
        let held = Snapshot {
            alerts: store::all::<Alert>(&store.alerts)
                .into_iter()
                .map(|(_, a)| a)
                .collect(),
            silences: store::all::<Silence>(&store.silences)
                .into_iter()
                .map(|(_, s)| s)
                .collect(),
            nflog: store::all::<NflogEntry>(&store.nflog),
        };
        Router {
            engine: Engine::new(routing, retain_resolved, held, now)
                .with_nflog_retention(nflog_retention),
            store,
            unwritten: Vec::new(),
            written: false,
        }
    }

    /// Writes what the engine changed (not flushed: the caller flushes the store before it marks the
    /// incidents written or answers a post). What could not be written is written next time.
    pub fn save(&mut self) -> Result<(), Error> {
        let changes = self.engine.take_changes();
        if changes.is_empty() {
            return Ok(());
        }
        self.written = true;
        if let Err(e) = write(&self.store, &changes) {
            self.engine.unsaved(changes);
            return Err(e);
        }
        Ok(())
    }

    /// Whether anything was written since the last call (for the caller to flush).
    pub fn take_written(&mut self) -> bool {
        std::mem::take(&mut self.written)
    }

    /// Takes in alerts posted to the API and writes them (and queues them for their bucket).
    pub fn post(&mut self, alerts: Vec<Alert>, now: DateTime<Utc>) -> Result<(), Error> {
        for a in alerts {
            self.engine.on_posted(a, now);
        }
        self.save()
    }

    /// Flushes the groups due at `now` and writes the notifications they decided with their log entries,
    /// atomically. Returns how many notifications were enqueued. The alerts that changed are not written
    /// here: they are the checkpoint's ([`Router::save`]), which a restart completes from the stream.
    pub fn tick(&mut self, now: DateTime<Utc>) -> Result<usize, Error> {
        let mut decided = std::mem::take(&mut self.unwritten);
        decided.extend(self.engine.tick(now));
        let pending: Vec<Pending> = decided
            .iter()
            .flat_map(|n| n.pending.iter().cloned())
            .collect();
        if !decided.is_empty() {
            let nflog: Vec<(String, NflogEntry)> = decided
                .iter()
                .map(|n| (n.nflog_key.clone(), n.entry.clone()))
                .collect();
            self.written = true;
            if let Err(e) = self.store.enqueue(&pending, &nflog) {
                self.unwritten = decided;
                return Err(e);
            }
        }
        Ok(pending.len())
    }

    /// Adds or replaces a silence (on disk when this returns, and in the replicated bucket unless that is
    /// unreachable: then the tick loop retries, and holds deliveries until it succeeded).
    pub async fn put_silence(&mut self, s: Silence) -> Result<(), Error> {
        self.store.put_silence(&s)?;
        self.store.flush().await?;
        self.engine.set_silence(s);
        if let Err(e) = self.store.replicate().await {
            tracing::warn!(error = %e, "silence stored locally; replicating it will be retried");
        }
        Ok(())
    }

    /// Ends a silence now. Returns it, or `None` if there is no such silence.
    pub async fn expire_silence(
        &mut self,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Silence>, Error> {
        match self.engine.ending(id, now) {
            None => Ok(None),
            Some(Ending::Over(s)) => Ok(Some(s)),
            Some(Ending::Ends(s)) => {
                self.put_silence(s.clone()).await?;
                Ok(Some(s))
            }
        }
    }
}

/// Writes alerts changed and forgotten, and forgets log entries.
fn write(store: &Store, c: &Changes) -> Result<(), Error> {
    for a in &c.alerts {
        store.put_alert(a)?;
    }
    for a in &c.forgotten {
        store.remove_alert(a)?;
    }
    store.remove_nflog(&c.nflog_forgotten)
}
