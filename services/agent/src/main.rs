//! `multipilot-agent`: runs in each cluster and publishes it to the bus in the MultiPilot contract.
//!
//! This build publishes the agent's heartbeat (`fleet.hb.<cluster>`) for each configured cluster; the
//! resource watchers, events, probes, facts, metrics and the durable outbox arrive with the agent issue.

#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use chrono::Utc;
use clap::Parser;
use multipilot_bus::connect;
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use multipilot_runtime::{Context, http, telemetry};
use multipilot_schemas::{Envelope, payload::Heartbeat, stable_id, subject};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// One cluster this agent serves.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ClusterConfig {
    /// Cluster name (the subject token and the registry key).
    name: String,
    /// Registry labels: env, region, owner, team…
    labels: BTreeMap<String, String>,
}

/// The agent's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    /// Clusters served by this process (one in-cluster; several from kubeconfig contexts).
    clusters: Vec<ClusterConfig>,
    /// Seconds between heartbeats.
    heartbeat_interval_s: u32,
    /// NATS connection (connects in the background: the agent keeps running while NATS is away).
    nats: connect::Config,
    /// Health and metrics endpoint.
    http: http::Config,
    /// Logging.
    log: telemetry::Config,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            clusters: Vec::new(),
            heartbeat_interval_s: 5,
            nats: connect::Config {
                background: true,
                ..Default::default()
            },
            http: http::Config {
                listen: "127.0.0.1:9465".into(),
            },
            log: telemetry::Config::default(),
        }
    }
}

/// The MultiPilot per-cluster agent.
#[derive(Debug, Parser)]
#[command(name = "multipilot-agent", version, about)]
struct Cli {
    /// Config file (TOML or YAML). Environment variables `MULTIPILOT_AGENT__<SECTION>__<KEY>` override it.
    #[arg(long, short = 'c', env = "MULTIPILOT_AGENT_CONFIG")]
    config: Option<PathBuf>,
    /// Serve this cluster (repeatable; adds to the config file's list).
    #[arg(long = "cluster")]
    clusters: Vec<String>,
    /// Print the effective configuration and exit.
    #[arg(long)]
    print_config: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("multipilot-agent: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let cli = Cli::parse();
    let mut config: Config =
        multipilot_runtime::config::load(cli.config.as_deref(), "MULTIPILOT_AGENT__", &[])?;
    for name in cli.clusters {
        config.clusters.push(ClusterConfig {
            name,
            labels: BTreeMap::new(),
        });
    }
    config.nats.validate()?;
    anyhow::ensure!(
        !config.clusters.is_empty(),
        "no cluster configured: pass --cluster NAME or set clusters in the config"
    );
    anyhow::ensure!(
        config.heartbeat_interval_s > 0,
        "heartbeat_interval_s must be positive"
    );
    if cli.print_config {
        print!("{}", multipilot_runtime::config::render(&config));
        return Ok(());
    }
    telemetry::init(&config.log);
    let client = connect::connect(&config.nats)
        .await
        .context("connecting to NATS")?;
    let cancel = CancellationToken::new();
    let ctx = Context::new(
        client,
        format!("agent-{}", std::process::id()),
        cancel.clone(),
    );
    let router = http::router(ctx.health.clone(), ctx.registry.clone());
    let (addr, server) = http::serve(&config.http.listen, router, cancel.clone()).await?;
    tracing::info!(%addr, clusters = config.clusters.len(), "agent serving /healthz /readyz /metrics");

    let mut tasks = Vec::new();
    for cluster in &config.clusters {
        let (ctx, name, interval) = (
            ctx.clone(),
            cluster.name.clone(),
            config.heartbeat_interval_s,
        );
        tasks.push(tokio::spawn(async move {
            heartbeats(ctx, name, interval).await
        }));
    }
    multipilot_runtime::shutdown_signal().await;
    cancel.cancel();
    for t in tasks {
        let _ = t.await;
    }
    let _ = server.await;
    Ok(())
}

/// Publishes a heartbeat every `interval_s` seconds until cancelled.
async fn heartbeats(ctx: Context, cluster: String, interval_s: u32) {
    let source = format!("agent-{cluster}");
    let started_at = Utc::now();
    let mut publisher: Publisher<u64> = Publisher::new(ctx.js.clone(), 16, ctx.bus_metrics.clone());
    let mut tick = tokio::time::interval(Duration::from_secs(interval_s.into()));
    let mut seq = 0u64;
    loop {
        tokio::select! {
            _ = ctx.cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        seq += 1;
        let hb = Heartbeat {
            interval_s,
            agent_version: env!("CARGO_PKG_VERSION").into(),
            started_at,
            outbox_depth: publisher.in_flight() as u64,
            dropped_metric_batches: 0,
            apiserver_reachable: true,
        };
        let now = Utc::now();
        let env = Envelope::new(cluster.as_str(), source.as_str(), now, seq, hb);
        let id = stable_id(&[&cluster, "hb", &started_at.to_rfc3339(), &seq.to_string()]);
        let msg = match Outgoing::envelope(subject::heartbeat(&cluster), id, &env) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode heartbeat");
                continue;
            }
        };
        for c in publisher
            .send(seq, msg)
            .await
            .into_iter()
            .chain(publisher.flush().await)
        {
            if let Completion::Failed { key, error } = c {
                // A heartbeat is only worth sending now: a late one says nothing, so it is not queued.
                tracing::warn!(%cluster, seq = key, %error, "heartbeat not stored");
            }
        }
    }
}
