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
    /// The alert router (its default `data_dir` becomes `<storage.data_dir>/alerts`).
    pub alerts: multipilot_alerts::Config,
    /// The console (HTTP API and web UI; `tsdb_url` defaults to the TSDB role's `tsdb.listen`).
    pub console: multipilot_console::Config,
    /// Release orchestration (its default `data_dir` becomes `<storage.data_dir>/release`).
    pub release: multipilot_release::Config,
}

impl Config {
    /// Checks what serde can't.
    pub fn validate(&self) -> Result<()> {
        self.nats.validate()?;
        ensure!(
            (1..=5).contains(&self.provision.replicas),
            "provision.replicas must be 1..=5"
        );
        self.console.validate()?;
        self.release.validate()?;
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

    /// The alert router's settings with its data directory resolved.
    pub fn alerts(&self) -> multipilot_alerts::Config {
        let mut c = self.alerts.clone();
        if c.data_dir.is_empty() || c.data_dir == multipilot_alerts::Config::default().data_dir {
            c.data_dir = self
                .storage
                .data_dir
                .join("alerts")
                .to_string_lossy()
                .into_owned();
        }
        // the buckets follow the streams' replica count unless set on their own
        if c.kv_replicas == multipilot_alerts::Config::default().kv_replicas {
            c.kv_replicas = self.provision.replicas;
        }
        c
    }

    /// The release role's settings with its data directory and TSDB address resolved.
    pub fn release(&self) -> multipilot_release::Config {
        let mut c = self.release.clone();
        if c.data_dir.is_empty() || c.data_dir == multipilot_release::Config::default().data_dir {
            c.data_dir = self
                .storage
                .data_dir
                .join("release")
                .to_string_lossy()
                .into_owned();
        }
        if c.kv_replicas == multipilot_release::Config::default().kv_replicas {
            c.kv_replicas = self.provision.replicas;
        }
        // analyses query the TSDB role where the hub runs it, unless told otherwise
        if c.tsdb_url == multipilot_release::Config::default().tsdb_url {
            c.tsdb_url = format!(
                "http://{}",
                self.tsdb.listen.replace("0.0.0.0", "127.0.0.1")
            );
        }
        c
    }

    /// The console's settings with the TSDB address resolved: when left at its default, it follows the
    /// TSDB role's `tsdb.listen` (the same process or host runs both in the demo).
    pub fn console(&self) -> multipilot_console::Config {
        let mut c = self.console.clone();
        if c.tsdb_url == multipilot_console::Config::default().tsdb_url {
            let listen = self.tsdb.listen.replace("0.0.0.0", "127.0.0.1");
            c.tsdb_url = format!("http://{listen}");
        }
        c
    }

    /// The stream topology at the configured replica count.
    pub fn topology(&self) -> Topology {
        Topology::embedded().with_replicas(self.provision.replicas)
    }
}
