//! The fleet registry: each cluster's latest `ClusterFacts` (served api-versions, version, labels), read
//! from FLEET_FACTS with `multipilot_bus::follow` — the last message per subject, then live.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream;
use multipilot_bus::follow::{Follower, Next, Replay};
use multipilot_schemas::payload::ClusterFacts;
use multipilot_schemas::{streams::name, subject};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The clusters known to the fleet, by name.
#[derive(Debug, Clone)]
pub struct Registry {
    clusters: Arc<RwLock<BTreeMap<String, ClusterFacts>>>,
    loaded: watch::Sender<bool>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            clusters: Arc::default(),
            loaded: watch::channel(false).0,
        }
    }
}

impl Registry {
    /// Every cluster's facts.
    pub fn snapshot(&self) -> BTreeMap<String, ClusterFacts> {
        self.clusters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// One cluster's facts.
    pub fn get(&self, name: &str) -> Option<ClusterFacts> {
        self.clusters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Records a cluster's facts.
    pub fn insert(&self, name: &str, facts: ClusterFacts) {
        self.clusters
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), facts);
    }

    /// Waits until what FLEET_FACTS held at start has been read (or `max` passed).
    pub async fn wait_loaded(&self, max: Duration) {
        let mut rx = self.loaded.subscribe();
        let _ = tokio::time::timeout(max, rx.wait_for(|l| *l)).await;
    }

    /// Follows FLEET_FACTS (the last facts of every cluster, then live) until cancelled.
    pub async fn follow(self, js: jetstream::Context, cancel: CancellationToken) {
        let mut f = Follower::new(
            js,
            name::FACTS,
            [subject::FACTS.all()],
            Replay::LastPerSubject,
        );
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => return,
                n = f.next() => n,
            };
            match next {
                Next::CaughtUp => {
                    self.loaded.send_replace(true);
                }
                Next::Message(m) => match m.decode::<ClusterFacts>() {
                    Ok(env) if !env.cluster.is_empty() => self.insert(&env.cluster, env.payload),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(subject = %m.message.subject, error = %e, "undecodable facts skipped")
                    }
                },
            }
        }
    }
}
