//! A fleet of virtual clusters in one process: each on its own loopback HTTPS port, one kubeconfig with a
//! context per cluster, and the control API that lists clusters and switches faults.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use axum::Json;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::cluster::{Cluster, Faults, Settings};
use crate::profile::Profile;
use crate::{api, world};

/// How to build a fleet.
#[derive(Debug, Clone)]
pub struct Config {
    /// Number of clusters.
    pub clusters: usize,
    /// Kubernetes versions, assigned round-robin.
    pub versions: Vec<String>,
    /// Seed of all randomness.
    pub seed: u64,
    /// Objects per cluster (approximate).
    pub objects: usize,
    /// Object changes per second per cluster.
    pub churn: f64,
    /// Interval between watch bookmarks.
    pub bookmark_interval: Duration,
    /// Watch history (changes) kept per cluster.
    pub history: usize,
    /// First apiserver port (0: random ports).
    pub base_port: u16,
    /// Scrape bodies served by `fixture-<name>` pods.
    pub metric_fixtures: BTreeMap<String, Arc<String>>,
    /// Explicit cluster names (otherwise generated from the labels).
    pub names: Vec<String>,
    /// Control-plane lease duration, seconds.
    pub lease_duration_s: u32,
    /// Extra events per second per cluster.
    pub events_per_second: f64,
    /// The address every apiserver listens on (loopback unless pods in their own network namespaces must
    /// reach it, as in the deployment drill).
    pub listen_host: std::net::IpAddr,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            clusters: 6,
            versions: ["1.24", "1.25", "1.26", "1.28", "1.31", "1.33"]
                .map(String::from)
                .to_vec(),
            seed: 42,
            objects: 300,
            churn: 5.0,
            bookmark_interval: Duration::from_secs(60),
            history: 1_000,
            base_port: 0,
            metric_fixtures: BTreeMap::new(),
            names: Vec::new(),
            lease_duration_s: 15,
            events_per_second: 0.0,
            listen_host: std::net::Ipv4Addr::LOCALHOST.into(),
        }
    }
}

const ENVS: &[&str] = &["prod", "staging", "dev"];
const REGIONS: &[(&str, &str, &str)] = &[
    ("eu-west-1", "aws", "euw"),
    ("us-east-1", "aws", "use"),
    ("europe-west4", "gcp", "euw4"),
    ("westus2", "azure", "wus2"),
    ("fra-dc1", "onprem", "fra"),
    ("ap-south-1", "aws", "aps"),
];
const OWNERS: &[&str] = &["platform", "data", "payments", "ml"];

/// Registry labels and a name for cluster `i`.
pub fn identity(i: usize, seed: u64) -> (String, BTreeMap<String, String>) {
    let env = ENVS[(i + seed as usize) % ENVS.len()];
    let (region, provider, short) = REGIONS[(i * 7 + seed as usize) % REGIONS.len()];
    let owner = OWNERS[i % OWNERS.len()];
    let name = format!("{env}-{short}-{}", i + 1);
    let labels = BTreeMap::from([
        ("env".to_string(), env.to_string()),
        ("region".to_string(), region.to_string()),
        ("provider".to_string(), provider.to_string()),
        ("owner".to_string(), owner.to_string()),
    ]);
    (name, labels)
}

/// A running fleet.
#[derive(Debug)]
pub struct Fleet {
    /// The clusters, in order.
    pub clusters: Vec<Arc<Cluster>>,
    cancel: CancellationToken,
}

/// The rates of events and of changes a cluster can be asked for (per second), besides 0: one a week to
/// 100,000 a second.
const RATES: std::ops::RangeInclusive<f64> = 1.0 / (7.0 * 86_400.0)..=100_000.0;

impl Fleet {
    /// Builds, seeds and serves every cluster.
    pub async fn start(cfg: &Config, cancel: CancellationToken) -> Result<Fleet> {
        anyhow::ensure!(cfg.clusters > 0, "--clusters must be at least 1");
        anyhow::ensure!(
            !cfg.versions.is_empty(),
            "--versions must name at least one version"
        );
        for (flag, rate) in [
            ("--events-per-second", cfg.events_per_second),
            ("--churn", cfg.churn),
        ] {
            anyhow::ensure!(
                rate == 0.0 || RATES.contains(&rate),
                "{flag} must be 0 or between {} and {} a second, not {rate}",
                RATES.start(),
                RATES.end()
            );
        }
        let mut clusters = Vec::new();
        for i in 0..cfg.clusters {
            let version = &cfg.versions[i % cfg.versions.len()];
            let profile = Profile::parse(version)?;
            let (generated, labels) = identity(i, cfg.seed);
            let name = cfg.names.get(i).cloned().unwrap_or(generated);
            let settings = Settings {
                name: name.clone(),
                labels,
                profile,
                seed: cfg.seed.wrapping_mul(1_000_003).wrapping_add(i as u64),
                objects: cfg.objects,
                churn: cfg.churn,
                bookmark_interval: cfg.bookmark_interval,
                history: cfg.history,
                metric_fixtures: cfg.metric_fixtures.clone(),
                lease_duration_s: cfg.lease_duration_s.max(1),
                events_per_second: cfg.events_per_second,
                listen_host: cfg.listen_host,
            };
            let cluster = Cluster::new(settings).with_context(|| format!("cluster {name}"))?;
            world::seed(&cluster);
            let port = if cfg.base_port == 0 {
                0
            } else {
                cfg.base_port + i as u16
            };
            let listener = TcpListener::bind((cfg.listen_host, port))
                .await
                .with_context(|| {
                    format!("binding {}:{port} for cluster {name}", cfg.listen_host)
                })?;
            let addr = listener.local_addr()?;
            let _ = cluster.addr.set(addr);
            tokio::spawn(serve(cluster.clone(), listener, cancel.clone()));
            tokio::spawn(world::run(cluster.clone(), cancel.clone()));
            clusters.push(cluster);
        }
        Ok(Fleet { clusters, cancel })
    }

    /// Finds a cluster.
    pub fn get(&self, name: &str) -> Option<&Arc<Cluster>> {
        self.clusters.iter().find(|c| c.name() == name)
    }

    /// The kubeconfig (one context per cluster, named after it; the first is current).
    pub fn kubeconfig(&self) -> String {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let clusters: Vec<_> = self
            .clusters
            .iter()
            .map(|c| {
                let ca = c.pki.lock().unwrap_or_else(|e| e.into_inner()).ca_pem().to_string();
                json!({"name": c.name(), "cluster": {"server": c.server_url(), "certificate-authority-data": b64(&ca)}})
            })
            .collect();
        let users: Vec<_> = self
            .clusters
            .iter()
            .map(|c| json!({"name": format!("{}-admin", c.name()), "user": {"token": c.token}}))
            .collect();
        let contexts: Vec<_> = self
            .clusters
            .iter()
            .map(|c| json!({"name": c.name(), "context": {"cluster": c.name(), "user": format!("{}-admin", c.name())}}))
            .collect();
        let doc = json!({
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "current-context": self.clusters.first().map(|c| c.name().to_string()).unwrap_or_default(),
            "clusters": clusters, "users": users, "contexts": contexts,
        });
        serde_yaml::to_string(&doc).unwrap_or_default()
    }

    /// Writes the kubeconfig (mode 0600: it holds tokens).
    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, self.kubeconfig())?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        }
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }

    /// Stops serving.
    pub fn stop(&self) {
        self.cancel.cancel();
    }

    /// The summary the control API and the CLI show.
    pub fn summaries(&self) -> Vec<ClusterSummary> {
        self.clusters.iter().map(|c| summary(c)).collect()
    }
}

/// One cluster as the control API lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterSummary {
    /// Name (and kubeconfig context).
    pub name: String,
    /// Kubernetes version (gitVersion).
    pub version: String,
    /// API server URL.
    pub server: String,
    /// Registry labels.
    pub labels: BTreeMap<String, String>,
    /// Objects stored.
    pub objects: usize,
    /// Current resourceVersion.
    pub resource_version: u64,
    /// Watches open.
    pub watches: u64,
    /// Faults switched on.
    pub faults: Faults,
}

fn summary(c: &Cluster) -> ClusterSummary {
    ClusterSummary {
        name: c.name().to_string(),
        version: c.profile().git_version.clone(),
        server: c.server_url(),
        labels: c.settings.labels.clone(),
        objects: c.store.len(),
        resource_version: c.store.resource_version(),
        watches: c.stats.watches.load(std::sync::atomic::Ordering::Relaxed),
        faults: c.faults(),
    }
}

async fn serve(cluster: Arc<Cluster>, listener: TcpListener, cancel: CancellationToken) {
    let router = api::router(cluster.clone());
    loop {
        let (stream, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(cluster = cluster.name(), error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if cluster.faults().unreachable {
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let acceptor = tokio_rustls::TlsAcceptor::from(
            cluster
                .pki
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .server_config(),
        );
        let router = router.clone();
        let cancel = cancel.clone();
        let cluster = cluster.clone();
        tokio::spawn(async move {
            let Ok(Ok(tls)) =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await
            else {
                return;
            };
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let router = router.clone();
                    async move { router.oneshot(req.map(axum::body::Body::new)).await }
                });
            let builder = auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            let mut epoch = cluster.watch_epoch.subscribe();
            tokio::pin!(conn);
            loop {
                tokio::select! {
                    _ = &mut conn => return,
                    _ = cancel.cancelled() => return,
                    changed = epoch.changed() => {
                        // an unreachable cluster drops its open connections too
                        if changed.is_err() || cluster.faults().unreachable {
                            return;
                        }
                    }
                }
            }
        });
    }
}

// ---------------------------------------------------------------------------------------------------------
// Control API

/// The control API's router.
pub fn control_router(fleet: Arc<Fleet>) -> axum::Router {
    axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/clusters", get(list_clusters))
        .route(
            "/kubeconfig",
            get(|State(f): State<Arc<Fleet>>| async move { f.kubeconfig() }),
        )
        .route(
            "/faults",
            get(|| async {
                Json(
                    world::FAULTS
                        .iter()
                        .map(|(n, d)| json!({"name": n, "description": d}))
                        .collect::<Vec<_>>(),
                )
            }),
        )
        .route("/clusters/{name}/faults/{fault}", post(set_fault))
        .with_state(fleet)
}

async fn list_clusters(State(f): State<Arc<Fleet>>) -> Json<Vec<ClusterSummary>> {
    Json(f.summaries())
}

#[derive(Debug, Deserialize)]
struct FaultBody {
    #[serde(default = "yes")]
    on: bool,
    #[serde(default)]
    params: BTreeMap<String, String>,
}

fn yes() -> bool {
    true
}

async fn set_fault(
    State(f): State<Arc<Fleet>>,
    UrlPath((name, fault)): UrlPath<(String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
    body: Option<Json<FaultBody>>,
) -> Response {
    let Some(c) = f.get(&name) else {
        let known: Vec<_> = f.clusters.iter().map(|c| c.name().to_string()).collect();
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": format!("no cluster {name:?}; known: {}", known.join(", "))})),
        )
            .into_response();
    };
    let (on, mut params) = match body {
        Some(Json(b)) => (b.on, b.params),
        None => (true, BTreeMap::new()),
    };
    let on = query.get("off").is_none_or(|v| v == "false") && on;
    params.extend(query.into_iter().filter(|(k, _)| k != "off"));
    match world::set_fault(c, &fault, on, &params) {
        Ok(()) => {
            tracing::info!(cluster = %name, fault = %fault, on, "fault switched");
            Json(summary(c)).into_response()
        }
        Err(e @ world::FaultError::Unknown(..)) => {
            (StatusCode::NOT_FOUND, Json(json!({"error": e.to_string()}))).into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

/// Serves the control API until cancelled; returns the bound address.
pub async fn serve_control(
    fleet: Arc<Fleet>,
    listen: &str,
    cancel: CancellationToken,
) -> Result<SocketAddr> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding the control API on {listen}"))?;
    let addr = listener.local_addr()?;
    let app = control_router(fleet);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await;
    });
    Ok(addr)
}

/// Where the simulator records its control address beside the kubeconfig.
pub fn state_path(kubeconfig: &Path) -> PathBuf {
    kubeconfig.with_extension("sim.json")
}
