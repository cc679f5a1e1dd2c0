//! The correlator role: turns raw fleet messages into the few things a person must look at.
//!
//! Reads (durable consumers): `fleet.event.>` (correlator-events), `fleet.hb.>` + `fleet.probe.>`
//! (correlator-health), `fleet.state.>` + `fleet.resync.>` (correlator-state), `fleet.facts.>`
//! (correlator-facts). Writes: `fleet.incident.<cluster>.<kind>` (every incident change),
//! `fleet.fleet-incident.<kind>` (one failure across clusters: the cluster incidents it links),
//! `fleet.digest.<cluster>.<kind>` (deduplicated event problems) and `fleet.compliance.<cluster>` (baseline
//! reports), and `fleet.audit.console.incident-<action>` for the incident commands it carries out. Answers
//! `fleet.query.incidents`, `fleet.query.fleet-incidents`, `fleet.query.compliance`,
//! `fleet.query.blast-radius` and `fleet.query.consistency` (request/reply, JSON) and the incident commands on
//! `fleet.ctl.incident` (acknowledge, resolve); their types are in `multipilot_schemas::control`.
//!
//! Layers:
//! - [`machine`]: the pure state machine (inputs → state changes and messages to publish), with
//!   [`evidence`] scoring, [`dedup`] of events, [`baseline`] judgement, [`fleet`] judgement across
//!   clusters, [`rules`] as data;
//! - [`store`]: its durable state and outbox in sled, written atomically;
//! - [`service`]: the NATS wiring, as named tasks;

pub mod baseline;
pub mod blast;
pub mod consistency;
pub mod dedup;
pub mod evidence;
pub mod fleet;
pub mod machine;
pub mod mask;
pub mod rules;
pub mod service;
pub mod state;
pub mod store;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use service::run;

/// Why the correlator stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The settings are not usable.
    #[error("correlator settings: {0}")]
    Config(String),
    /// The rules or the baseline file.
    #[error(transparent)]
    File(#[from] rules::Error),
    /// Its store.
    #[error(transparent)]
    Store(#[from] store::Error),
    /// Reading or setting up a stream or durable.
    #[error(transparent)]
    Stream(#[from] multipilot_bus::jetstream::Error),
    /// Making the rebuilt state durable or publishing it.
    #[error("committing: {0}")]
    Commit(#[from] multipilot_bus::consume::CommitError),
    /// A bug: the role's own invariant broke.
    #[error("correlator: {0}")]
    Internal(String),
    /// A request subject could not be subscribed to.
    #[error("subscribing to {subject}: {reason}")]
    Subscribe {
        /// Subject.
        subject: &'static str,
        /// Why.
        reason: String,
    },
}

impl Error {
    /// Whether starting again later may succeed (the server was away, a disk full) rather than needing a
    /// changed setting or file.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Config(_) | Error::File(_) | Error::Internal(_) => false,
            Error::Store(e) => e.is_retryable(),
            Error::Stream(e) => e.is_retryable(),
            Error::Commit(e) => e.retryable,
            Error::Subscribe { .. } => true,
        }
    }
}

/// The correlator's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where its state lives (sled).
    pub data_dir: String,
    /// The store's page cache in bytes (sled's `cache_capacity`). Its state is held in memory and written
    /// through, so the cache only speeds up those writes and the start.
    pub cache_bytes: u64,
    /// Rules file (default: the embedded `rules.yaml`).
    pub rules: Option<String>,
    /// Baseline file (default: the embedded `baseline.yaml`).
    pub baseline: Option<String>,
    /// Messages per pull.
    pub batch: usize,
    /// Milliseconds between clock ticks (heartbeat silence checks).
    pub tick_ms: u64,
    /// Partitions the fleet is split into (1: one instance owns every cluster). With N > 1, the NATS server
    /// maps agent subjects to carry `partition(N, cluster)` as a last token (`deploy/nats/partitions.conf`),
    /// and each instance reads only its partition through durable consumers of its own.
    pub partitions: u32,
    /// This instance's partition, 0..partitions.
    pub partition: u32,
    /// How far back a new or wiped store replays heartbeats, probes and events (see `service::rebuild`).
    #[serde(with = "humantime_serde")]
    pub replay_window: Duration,
    /// Input limits of each of its consumers (events, health, state, facts): a global rate and a per-cluster
    /// rate, so a reconnect storm or one flooding cluster can't swamp it. 0 = off (the default).
    pub rate: multipilot_bus::limit::Config,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: "./data/hub/correlator".into(),
            cache_bytes: 32 << 20,
            rules: None,
            baseline: None,
            batch: 500,
            tick_ms: 1000,
            partitions: 1,
            partition: 0,
            replay_window: Duration::from_secs(15 * 60),
            rate: multipilot_bus::limit::Config::default(),
        }
    }
}

/// The subjects of one partition of a stream the correlator reads (the partition is the last token the
/// server's subject mapping adds).
pub fn partition_filters(stream: &str, partition: u32) -> Vec<String> {
    use multipilot_schemas::{streams::name, subject};
    let families: &[subject::Family] = match stream {
        name::EVENTS => &[subject::EVENT],
        name::HEALTH => &[subject::HEARTBEAT, subject::PROBE],
        name::STATE => &[subject::STATE, subject::RESYNC],
        name::FACTS => &[subject::FACTS],
        _ => &[],
    };
    families.iter().map(|f| f.partition(partition)).collect()
}

/// The partition of a cluster as the server's `partition(n, …)` mapping computes it: FNV-1a (32 bit) of
/// the cluster's subject token, modulo `n`.
pub fn partition_of(cluster_token: &str, partitions: u32) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in cluster_token.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % partitions.max(1)
}
