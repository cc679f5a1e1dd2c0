//! The hub's configuration: shared sections, then one section per role (added by each role).

use std::path::PathBuf;

use anyhow::{Result, ensure};
use multipilot_bus::{connect, topology::Topology};
use multipilot_runtime::{http, telemetry};
use serde::{Deserialize, Serialize};

/// Where the hub keeps its local state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Storage {
    /// Directory for sled stores (one subdirectory per role).
    pub data_dir: PathBuf,
}

impl Default for Storage {
    fn default() -> Self {
        Storage {
            data_dir: PathBuf::from("./data/hub"),
        }
    }
}

/// Stream provisioning at start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Provision {
    /// Create or update the streams and consumers of `deploy/streams.yaml` at start.
    pub enabled: bool,
    /// Replicas per stream (3 on a JetStream cluster).
    pub replicas: usize,
}

impl Default for Provision {
    fn default() -> Self {
        Provision {
            enabled: true,
            replicas: 1,
        }
    }
}

/// The hub's whole configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// NATS connection.
    pub nats: connect::Config,
    /// `/healthz`, `/readyz`, `/metrics` (and the role APIs) listen here.
    pub http: http::Config,
    /// Logging.
    pub log: telemetry::Config,
    /// Local state.
    pub storage: Storage,
    /// Stream provisioning.
    pub provision: Provision,
    /// The correlator role (`data_dir` empty: `<storage.data_dir>/correlator`).
    pub correlator: multipilot_correlator::Config,
    /// The TSDB role (its default `data_dir` becomes `<storage.data_dir>/tsdb`).
    pub tsdb: multipilot_tsdb::Config,
}

impl Config {
    /// Checks what serde can't.
    pub fn validate(&self) -> Result<()> {
        self.nats.validate()?;
        ensure!(
            (1..=5).contains(&self.provision.replicas),
            "provision.replicas must be 1..=5"
        );
        Ok(())
    }

    /// The correlator's settings with its data directory resolved.
    pub fn correlator(&self) -> multipilot_correlator::Config {
        let mut c = self.correlator.clone();
        if c.data_dir.is_empty() || c.data_dir == multipilot_correlator::Config::default().data_dir
        {
            c.data_dir = self
                .storage
                .data_dir
                .join("correlator")
                .to_string_lossy()
                .into_owned();
        }
        c
    }

    /// The TSDB's settings with its data directory resolved.
    pub fn tsdb(&self) -> multipilot_tsdb::Config {
        let mut c = self.tsdb.clone();
        if c.data_dir == multipilot_tsdb::Config::default().data_dir {
            c.data_dir = self.storage.data_dir.join("tsdb");
        }
        c
    }

    /// The stream topology at the configured replica count.
    pub fn topology(&self) -> Topology {
        Topology::embedded().with_replicas(self.provision.replicas)
    }
}
