//! `multipilot-agent`: runs in each cluster (or serves several from kubeconfig contexts) and publishes
//! them to the bus in the MultiPilot contract, through a durable outbox.

#![allow(clippy::print_stdout)]

/// jemalloc, as TiKV, Vector and GreptimeDB use: it returns freed memory to the system (background
/// purging) and does not fragment under the many small, short-lived allocations of message decoding.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Parser;
use multipilot_agent::agent::{self, Config};
use multipilot_agent::cluster::ClusterConfig;
use multipilot_bus::connect;
use multipilot_runtime::{Context, http, telemetry};
use tokio_util::sync::CancellationToken;

/// The MultiPilot per-cluster agent.
#[derive(Debug, Parser)]
#[command(name = "multipilot-agent", version, about)]
struct Cli {
    /// Config file (TOML or YAML). Environment variables `MULTIPILOT_AGENT__<SECTION>__<KEY>` override it.
    #[arg(long, short = 'c', env = "MULTIPILOT_AGENT_CONFIG")]
    config: Option<PathBuf>,
    /// Serve this cluster: its kubeconfig context has the same name (repeatable; adds to the config's list).
    #[arg(long = "cluster")]
    clusters: Vec<String>,
    /// Kubeconfig file (overrides the config file).
    #[arg(long)]
    kubeconfig: Option<String>,
    /// Serve every context of the kubeconfig, each as a cluster named after its context.
    #[arg(long)]
    all_contexts: bool,
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
    if cli.kubeconfig.is_some() {
        config.kubeconfig = cli.kubeconfig.clone();
    }
    for name in cli.clusters {
        config.clusters.push(ClusterConfig {
            name,
            ..Default::default()
        });
    }
    if cli.all_contexts {
        let kc = match &config.kubeconfig {
            Some(p) => kube::config::Kubeconfig::read_from(p)?,
            None => kube::config::Kubeconfig::read()?,
        };
        for ctx in kc.contexts {
            if !config.clusters.iter().any(|c| c.name == ctx.name) {
                config.clusters.push(ClusterConfig {
                    name: ctx.name,
                    ..Default::default()
                });
            }
        }
    }
    config.validate()?;
    if cli.print_config {
        print!("{}", multipilot_runtime::config::render(&config));
        return Ok(());
    }
    telemetry::init(&config.log);
    let _ = rustls::crypto::ring::default_provider().install_default();
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
    tracing::info!(%addr, clusters = config.clusters.len(), outbox = %config.outbox.path, "agent serving /healthz /readyz /metrics");
    let mut work = tokio::spawn(agent::run(config, ctx));
    // If the agent's work fails (an unreadable kubeconfig, an outbox that can't open), the process stops at
    // once and says why, so that its supervisor restarts it: never a live process that does nothing.
    let result = tokio::select! {
        _ = multipilot_runtime::shutdown_signal() => {
            tracing::info!("stopping: draining the outbox for up to 5s");
            cancel.cancel();
            work.await.context("agent task")?.map_err(anyhow::Error::from)
        }
        done = &mut work => {
            let r = done.context("agent task")?;
            if let Err(e) = &r {
                tracing::error!(error = %format!("{e:#}"), "agent failed; stopping");
            }
            cancel.cancel();
            r.map_err(anyhow::Error::from)
                .and(Err(anyhow::anyhow!("the agent stopped by itself")))
        }
    };
    let _ = server.await;
    result
}
