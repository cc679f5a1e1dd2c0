//! The agent process: its configuration, and `run`, which serves every configured cluster (one in-cluster,
//! or several from kubeconfig contexts) with one durable outbox and a drain per cluster.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use chrono::Utc;
use governor::{Quota, RateLimiter};
use kube::config::{KubeConfigOptions, Kubeconfig};
use multipilot_bus::connect;
use multipilot_runtime::{Context, http, telemetry};
use serde::{Deserialize, Serialize};

use crate::cluster::{self, ClusterConfig, ClusterCtx, Timings};
use crate::sink::Sink;
use crate::view::View;
use crate::{drain, outbox, probes, release, scrape};

/// The agent's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Clusters served by this process (one in-cluster; several from kubeconfig contexts).
    pub clusters: Vec<ClusterConfig>,
    /// Kubeconfig file (default: `$KUBECONFIG`, then `~/.kube/config`).
    pub kubeconfig: Option<String>,
    /// Heartbeat, discovery and list timings.
    pub timings: Timings,
    /// Probes.
    pub probes: probes::Config,
    /// Metric scraping.
    pub scrape: scrape::Config,
    /// The durable outbox and its drain.
    pub outbox: outbox::Config,
    /// NATS connection (connects in the background: the agent keeps collecting while NATS is away).
    pub nats: connect::Config,
    /// Health and metrics endpoint.
    pub http: http::Config,
    /// Logging.
    pub log: telemetry::Config,
    /// The release command executor (off unless enabled, with the release role's public key trusted).
    pub release: release::Config,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            clusters: Vec::new(),
            kubeconfig: None,
            timings: Timings::default(),
            probes: probes::Config::default(),
            scrape: scrape::Config::default(),
            outbox: outbox::Config::default(),
            nats: connect::Config {
                background: true,
                ..Default::default()
            },
            http: http::Config {
                listen: "127.0.0.1:9465".into(),
            },
            log: telemetry::Config::default(),
            release: release::Config::default(),
        }
    }
}

/// Why the agent could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is not usable.
    #[error("agent settings: {0}")]
    Config(String),
    /// A `release` setting is not usable. Not a `#[source]`: the message says it already, and the binary
    /// prints errors with their sources (`{:#}`), which would say it twice.
    #[error("agent settings: {0}")]
    Release(release::Error),
    /// The NATS settings.
    #[error(transparent)]
    Nats(#[from] connect::Error),
    /// A cluster's API could not be configured (kubeconfig, context, in-cluster service account).
    #[error(transparent)]
    Kube(multipilot_runtime::error::Cause),
    /// The durable outbox.
    #[error("the outbox at {path}: {source}")]
    Outbox {
        /// Its path.
        path: String,
        /// Why.
        #[source]
        source: outbox::Error,
    },
}

impl Error {
    /// Whether starting again later may succeed (the disk or the API server were away) rather than
    /// needing a changed setting.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Outbox { .. })
    }
}

type Result<T, E = Error> = std::result::Result<T, E>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(Error::Config(format!($($fmt)+)));
        }
    };
}

fn kube_err<E: std::error::Error + Send + Sync + 'static>(
    what: impl Into<String>,
) -> impl FnOnce(E) -> Error {
    let wrap = multipilot_runtime::error::cause(what);
    move |e| Error::Kube(wrap(e))
}

impl Config {
    /// Checks what serde can't.
    pub fn validate(&self) -> Result<()> {
        self.nats.validate()?;
        self.release.validate().map_err(Error::Release)?;
        ensure!(
            !self.clusters.is_empty(),
            "no cluster configured: pass --cluster NAME or set clusters in the config"
        );
        for c in &self.clusters {
            ensure!(!c.name.is_empty(), "a cluster without a name");
        }
        ensure!(
            self.timings.heartbeat_interval_s > 0,
            "timings.heartbeat_interval_s must be positive"
        );
        ensure!(
            self.outbox.drain_per_second > 0,
            "outbox.drain_per_second must be positive"
        );
        ensure!(
            self.outbox.max_bytes >= 1024 * 1024,
            "outbox.max_bytes must be at least 1 MiB"
        );
        Ok(())
    }
}

async fn kube_config(cfg: &Config, cluster: &ClusterConfig) -> Result<kube::Config> {
    if cluster.in_cluster {
        return kube::Config::incluster().map_err(kube_err("in-cluster configuration"));
    }
    let kc = match &cfg.kubeconfig {
        Some(path) => {
            Kubeconfig::read_from(path).map_err(kube_err(format!("reading kubeconfig {path}")))?
        }
        None => Kubeconfig::read().map_err(kube_err(
            "reading the kubeconfig ($KUBECONFIG or ~/.kube/config)",
        ))?,
    };
    let opts = KubeConfigOptions {
        context: Some(
            cluster
                .context
                .clone()
                .unwrap_or_else(|| cluster.name.clone()),
        ),
        ..Default::default()
    };
    kube::Config::from_custom_kubeconfig(kc, &opts)
        .await
        .map_err(kube_err(format!(
            "kubeconfig context for cluster {}",
            cluster.name
        )))
}

/// Serves every configured cluster until `ctx.cancel` fires, then drains what it can for a few seconds.
pub async fn run(config: Config, ctx: Context) -> Result<()> {
    let outbox_err = |source| Error::Outbox {
        path: config.outbox.path.clone(),
        source,
    };
    let store = outbox::Store::open(&config.outbox).map_err(outbox_err)?;
    let rate = NonZeroU32::new(config.outbox.drain_per_second).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(config.outbox.drain_burst).unwrap_or(rate);
    let limiter = Arc::new(RateLimiter::direct(
        Quota::per_second(rate).allow_burst(burst),
    ));
    let collect_cancel = ctx.cancel.child_token();
    let drain_cancel = tokio_util::sync::CancellationToken::new();
    let mut collectors = tokio::task::JoinSet::new();
    let mut drains = tokio::task::JoinSet::new();
    let started_at = Utc::now();
    let mut contexts = Vec::new();
    let keys = Arc::new(release::Keys::load(&config.release));
    let mut executors = tokio::task::JoinSet::new();
    for c in &config.clusters {
        let kc = kube_config(&config, c).await?;
        let client = kube::Client::try_from(kc.clone())
            .map_err(kube_err(format!("Kubernetes client for {}", c.name)))?;
        let ob = store.outbox(&c.name).map_err(outbox_err)?;
        let cctx = Arc::new(ClusterCtx {
            config: c.clone(),
            client: client.clone(),
            kube_config: kc,
            sink: Sink::new(&c.name, ob.clone()),
            view: View::default(),
            seen: store
                .tree(&format!("seen/{}", c.name))
                .map_err(outbox_err)?,
            reachable: AtomicBool::new(false),
            chosen: Default::default(),
            cert_expiry: Default::default(),
            clock_offset_ms: Default::default(),
            started_at,
            timings: config.timings.clone(),
        });
        ctx.health.register(&format!("cluster/{}", c.name));
        ctx.health.set(&format!("cluster/{}", c.name), true);
        contexts.push(cctx.clone());
        collectors.spawn(cluster::run(
            cctx,
            config.probes.clone(),
            config.scrape.clone(),
            collect_cancel.clone(),
        ));
        drains.spawn(drain::run(
            ob,
            ctx.nats.clone(),
            limiter.clone(),
            ctx.bus_metrics.clone(),
            drain::Settings::default(),
            drain_cancel.clone(),
        ));
        if config.release.enabled {
            let exec = Arc::new(release::Executor::new(
                &c.name,
                client.clone(),
                keys.clone(),
                config.release.clone(),
                store
                    .tree(&format!("release/nonces/{}", c.name))
                    .map_err(outbox_err)?,
                store
                    .tree(&format!("release/results/{}", c.name))
                    .map_err(outbox_err)?,
                ctx.instance.clone(),
            ));
            let (nats, cancel) = (ctx.nats.clone(), collect_cancel.clone());
            executors.spawn(async move {
                if let Err(e) = release::serve(exec, nats, cancel).await {
                    tracing::error!(error = %e, "release executor stopped");
                }
            });
        }
        tracing::info!(cluster = %c.name, "serving cluster");
    }
    ctx.cancel.cancelled().await;
    // Collectors stop first; the drains send what waits (up to 5 s); then a last heartbeat carries the final
    // counters — taken after everything else was confirmed, so the seq accounting closes exactly.
    while collectors.join_next().await.is_some() {}
    while executors.join_next().await.is_some() {}
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    for cctx in &contexts {
        let ob = cctx.sink.outbox();
        let _ = ob.flush().await;
        while ob.counters().depth > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        cluster::heartbeat(cctx);
        let _ = ob.flush().await;
    }
    drain_cancel.cancel();
    while drains.join_next().await.is_some() {}
    store.flush().await.map_err(outbox_err)?;
    Ok(())
}
