//! The fleet registry: each cluster's latest `ClusterFacts` (served api-versions, version, labels), read
//! from FLEET_FACTS with an ephemeral ordered consumer — the last message per subject, then live.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use multipilot_schemas::Envelope;
use multipilot_schemas::payload::ClusterFacts;
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

    /// Follows FLEET_FACTS until cancelled, re-creating the consumer after errors.
    pub async fn follow(self, js: jetstream::Context, cancel: CancellationToken) {
        loop {
            if let Err(e) = self.follow_once(&js, &cancel).await {
                tracing::warn!(error = %e, "reading FLEET_FACTS failed; retrying");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
        }
    }

    async fn follow_once(
        &self,
        js: &jetstream::Context,
        cancel: &CancellationToken,
    ) -> Result<(), String> {
        let fail = |e: &dyn std::fmt::Display| format!("following FLEET_FACTS: {e}");
        let stream = js.get_stream("FLEET_FACTS").await.map_err(|e| fail(&e))?;
        let mut c = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: "fleet.facts.>".into(),
                deliver_policy: consumer::DeliverPolicy::LastPerSubject,
                ..Default::default()
            })
            .await
            .map_err(|e| fail(&e))?;
        if c.info().await.map_err(|e| fail(&e))?.num_pending == 0 {
            self.loaded.send_replace(true);
        }
        let mut msgs = c.messages().await.map_err(|e| fail(&e))?;
        loop {
            let m = tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                m = msgs.next() => m,
            };
            let Some(m) = m else { return Ok(()) };
            let m = m.map_err(|e| fail(&e))?;
            match rmp_serde::from_slice::<Envelope<ClusterFacts>>(&m.payload) {
                Ok(env) if !env.cluster.is_empty() => self.insert(&env.cluster, env.payload),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(subject = %m.subject, error = %e, "undecodable facts skipped")
                }
            }
            if m.info().map(|i| i.pending == 0).unwrap_or(false) {
                self.loaded.send_replace(true);
            }
        }
    }
}
