//! The context a role runs with.

use std::sync::{Arc, RwLock};

use async_nats::jetstream;
use multipilot_bus::metrics::BusMetrics;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::http::Health;

/// What a role gets from `main`: the NATS client, the metrics registry, health flags and the cancellation
/// token that tells it to stop.
#[derive(Debug, Clone)]
pub struct Context {
    /// NATS client.
    pub nats: async_nats::Client,
    /// JetStream context.
    pub js: jetstream::Context,
    /// The process' metrics registry (served on `/metrics`).
    pub registry: Arc<RwLock<Registry>>,
    /// Bus metrics, registered once per process.
    pub bus_metrics: BusMetrics,
    /// Readiness of the process' parts.
    pub health: Health,
    /// Fires when the process should stop.
    pub cancel: CancellationToken,
    /// This instance's name (e.g. `correlator-0`), used as the `source` of what it publishes.
    pub instance: String,
}

impl Context {
    /// A context around a connected client, with a fresh registry.
    pub fn new(
        nats: async_nats::Client,
        instance: impl Into<String>,
        cancel: CancellationToken,
    ) -> Self {
        let mut registry = Registry::default();
        let bus_metrics = BusMetrics::register(&mut registry);
        Context {
            js: jetstream::new(nats.clone()),
            nats,
            registry: Arc::new(RwLock::new(registry)),
            bus_metrics,
            health: Health::default(),
            cancel,
            instance: instance.into(),
        }
    }
}
