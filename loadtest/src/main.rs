//! `multipilot-sim`: serves a fleet of virtual Kubernetes clusters, and switches faults in a running one.

#![allow(clippy::print_stdout)]

/// jemalloc, as TiKV, Vector and GreptimeDB use: it returns freed memory to the system (background
/// purging) and does not fragment under the many small, short-lived allocations of message decoding.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};
use multipilot_sim::fleet::{self, ClusterSummary, Fleet};
use tokio_util::sync::CancellationToken;

/// The MultiPilot fleet simulator (test infrastructure: never deploy it into a cluster).
#[derive(Debug, Parser)]
#[command(
    name = "multipilot-sim",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Number of virtual clusters.
    #[arg(long, default_value_t = 6)]
    clusters: usize,
    /// Kubernetes versions, assigned to the clusters round-robin.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1.24,1.25,1.26,1.28,1.31,1.33"
    )]
    versions: Vec<String>,
    /// Where to write the kubeconfig (one context per cluster).
    #[arg(long, default_value = "sim-kubeconfig.yaml")]
    kubeconfig: PathBuf,
    /// Seed of all randomness (same seed, same fleet; uids are new at every start, as a rebuilt cluster's).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Objects per cluster (approximate).
    #[arg(long, default_value_t = 300)]
    objects: usize,
    /// Object changes per second per cluster.
    #[arg(long, default_value_t = 5.0)]
    churn: f64,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 60.0)]
    bookmark_interval: f64,
    /// Changes kept per cluster for watch resumption (older resourceVersions get 410 Gone).
    #[arg(long, default_value_t = 1_000)]
    history: usize,
    /// First apiserver port (cluster i listens on base+i); 0 picks free ports.
    #[arg(long, default_value_t = 0)]
    base_port: u16,
    /// Control API address.
    #[arg(
        long,
        env = "MULTIPILOT_SIM_CONTROL_LISTEN",
        default_value = "127.0.0.1:9470"
    )]
    control: String,
    /// Serve a Prometheus scrape file from a `fixture-<name>` pod in `monitoring` (repeatable: NAME=PATH).
    #[arg(long = "metrics-fixture")]
    metrics_fixtures: Vec<String>,
    /// Extra Kubernetes events per second per cluster (the churn makes some too), in up to ten bursts a
    /// second.
    #[arg(long, default_value_t = 0.0)]
    events_per_second: f64,
    /// Explicit cluster names, in order (comma-separated).
    #[arg(long, value_delimiter = ',')]
    names: Vec<String>,
    /// The address every simulated apiserver listens on (and its certificate names).
    #[arg(long, default_value = "127.0.0.1")]
    listen_host: std::net::IpAddr,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Switch a fault on (or off with --off) in a running simulator.
    Fault {
        /// The cluster.
        #[arg(long)]
        cluster: String,
        /// The fault (`multipilot-sim faults` lists them).
        fault: String,
        /// Switch it off.
        #[arg(long)]
        off: bool,
        /// Fault parameters, KEY=VALUE (e.g. latency_ms=500, seconds=600, days=3, count=500).
        #[arg(long = "param", short = 'p')]
        params: Vec<String>,
        /// The simulator's control API.
        #[arg(
            long,
            env = "MULTIPILOT_SIM_CONTROL",
            default_value = "http://127.0.0.1:9470"
        )]
        control: String,
    },
    /// List the faults the simulator knows.
    Faults {
        /// The simulator's control API.
        #[arg(
            long,
            env = "MULTIPILOT_SIM_CONTROL",
            default_value = "http://127.0.0.1:9470"
        )]
        control: String,
    },
    /// List the running simulator's clusters.
    Clusters {
        /// The simulator's control API.
        #[arg(
            long,
            env = "MULTIPILOT_SIM_CONTROL",
            default_value = "http://127.0.0.1:9470"
        )]
        control: String,
        /// Output format.
        #[arg(long, short = 'o', default_value = "table")]
        output: String,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match cli.command {
            None => serve(cli.serve).await,
            Some(Command::Fault {
                cluster,
                fault,
                off,
                params,
                control,
            }) => {
                let mut map = BTreeMap::new();
                for p in params {
                    let (k, v) = p
                        .split_once('=')
                        .with_context(|| format!("--param {p:?}: expected KEY=VALUE"))?;
                    map.insert(k.to_string(), v.to_string());
                }
                let url = format!(
                    "{}/clusters/{cluster}/faults/{fault}",
                    control.trim_end_matches('/')
                );
                let resp = reqwest::Client::new()
                    .post(&url)
                    .json(&serde_json::json!({"on": !off, "params": map}))
                    .send()
                    .await
                    .with_context(|| {
                        format!("reaching the simulator at {control} (is it running?)")
                    })?;
                let status = resp.status();
                let body: serde_json::Value = resp.json().await.unwrap_or_default();
                if !status.is_success() {
                    bail!("{}", body["error"].as_str().unwrap_or("request failed"));
                }
                println!("{cluster}: {fault} {}", if off { "off" } else { "on" });
                println!("faults now: {}", body["faults"]);
                Ok(())
            }
            Some(Command::Faults { control }) => {
                let url = format!("{}/faults", control.trim_end_matches('/'));
                let list: Vec<serde_json::Value> = reqwest::get(&url)
                    .await
                    .with_context(|| format!("reaching {control}"))?
                    .json()
                    .await?;
                for f in list {
                    println!(
                        "{:<26} {}",
                        f["name"].as_str().unwrap_or(""),
                        f["description"].as_str().unwrap_or("")
                    );
                }
                Ok(())
            }
            Some(Command::Clusters { control, output }) => {
                let url = format!("{}/clusters", control.trim_end_matches('/'));
                let list: Vec<ClusterSummary> = reqwest::get(&url)
                    .await
                    .with_context(|| format!("reaching {control}"))?
                    .json()
                    .await?;
                if output == "json" {
                    println!("{}", serde_json::to_string_pretty(&list)?);
                    return Ok(());
                }
                println!(
                    "{:<16} {:<9} {:<24} {:>7} {:>8}  {:<30} FAULTS",
                    "NAME", "VERSION", "SERVER", "OBJECTS", "WATCHES", "LABELS"
                );
                for c in list {
                    let labels = c
                        .labels
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(",");
                    let faults = serde_json::to_value(&c.faults)?;
                    let faults = faults
                        .as_object()
                        .map(|m| m.keys().cloned().collect::<Vec<_>>().join(","))
                        .unwrap_or_default();
                    println!(
                        "{:<16} {:<9} {:<24} {:>7} {:>8}  {:<30} {}",
                        c.name,
                        c.version,
                        c.server,
                        c.objects,
                        c.watches,
                        labels,
                        if faults.is_empty() {
                            "-".into()
                        } else {
                            faults
                        }
                    );
                }
                Ok(())
            }
        }
    })
}

async fn serve(args: ServeArgs) -> Result<()> {
    let mut fixtures = BTreeMap::new();
    for f in &args.metrics_fixtures {
        let (name, path) = f
            .split_once('=')
            .with_context(|| format!("--metrics-fixture {f:?}: expected NAME=PATH"))?;
        let body = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        fixtures.insert(name.to_string(), Arc::new(body));
    }
    let cfg = fleet::Config {
        clusters: args.clusters,
        versions: args.versions,
        seed: args.seed,
        objects: args.objects,
        churn: args.churn,
        bookmark_interval: Duration::from_secs_f64(args.bookmark_interval.max(0.05)),
        history: args.history,
        base_port: args.base_port,
        metric_fixtures: fixtures,
        names: args.names,
        events_per_second: args.events_per_second,
        listen_host: args.listen_host,
        ..Default::default()
    };
    let cancel = CancellationToken::new();
    let fleet = Arc::new(Fleet::start(&cfg, cancel.clone()).await?);
    fleet.write_kubeconfig(&args.kubeconfig)?;
    let control = fleet::serve_control(fleet.clone(), &args.control, cancel.clone()).await?;
    std::fs::write(
        fleet::state_path(&args.kubeconfig),
        serde_json::to_vec_pretty(
            &serde_json::json!({"control": format!("http://{control}"), "kubeconfig": args.kubeconfig, "clusters": fleet.summaries()}),
        )?,
    )?;
    for c in fleet.summaries() {
        tracing::info!(cluster = %c.name, version = %c.version, server = %c.server, objects = c.objects, "cluster up");
    }
    tracing::info!(kubeconfig = %args.kubeconfig.display(), control = %control, "fleet simulator ready");
    tokio::select! {
        _ = shutdown_signal() => {}
    }
    cancel.cancel();
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
