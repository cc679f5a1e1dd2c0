//! The `/healthz`, `/readyz` and `/metrics` endpoints every long-running process serves.
//!
//! `/healthz` answers 200 while the process runs. `/readyz` answers 200 once every registered part has said
//! it is ready, else 503 listing the parts that are not. `/metrics` is the Prometheus text format.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

/// HTTP settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Listen address, e.g. `127.0.0.1:9464` (port 0 picks a free one).
    pub listen: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9464".into(),
        }
    }
}

/// Readiness of a process' parts.
#[derive(Debug, Clone, Default)]
pub struct Health {
    parts: Arc<Mutex<BTreeMap<String, bool>>>,
}

impl Health {
    /// Registers a part as not ready yet.
    pub fn register(&self, part: &str) {
        self.parts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(part.to_string(), false);
    }

    /// Sets a part's readiness.
    pub fn set(&self, part: &str, ready: bool) {
        self.parts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(part.to_string(), ready);
    }

    /// The parts that are not ready.
    pub fn not_ready(&self) -> Vec<String> {
        let parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        parts
            .iter()
            .filter(|(_, r)| !**r)
            .map(|(p, _)| p.clone())
            .collect()
    }
}

#[derive(Clone)]
struct AppState {
    health: Health,
    registry: Arc<RwLock<Registry>>,
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    let waiting = s.health.not_ready();
    if waiting.is_empty() {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", waiting.join(", ")),
        )
    }
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    let mut out = String::new();
    let registry = s.registry.read().unwrap_or_else(|e| e.into_inner());
    match prometheus_client::encoding::text::encode(&mut out, &registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            out,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            e.to_string(),
        ),
    }
}

/// The health and metrics routes, to be merged with a role's own routes.
pub fn router(health: Health, registry: Arc<RwLock<Registry>>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AppState { health, registry })
}

/// Per-client request limits every HTTP surface applies (a governor limiter keyed by the client's IP): a
/// client over its rate gets `429 Too Many Requests` with `Retry-After`, and can't starve the others or
/// the process. The defaults are far above what people and scripts send, and stop floods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Requests per second per client IP (0: no limit).
    pub per_second: u32,
    /// Burst above the rate.
    pub burst: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_second: 1000,
            burst: 2000,
        }
    }
}

type IpLimiter = governor::DefaultKeyedRateLimiter<std::net::IpAddr>;

async fn limit(
    State(limiter): State<Arc<IpLimiter>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use governor::clock::{Clock, DefaultClock};
    match limiter.check_key(&peer.ip()) {
        Ok(()) => next.run(req).await,
        Err(not_until) => {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            tracing::debug!(client = %peer.ip(), "rate limited");
            (
                StatusCode::TOO_MANY_REQUESTS,
                [
                    (header::RETRY_AFTER, wait.as_secs().max(1).to_string()),
                    (header::CONTENT_TYPE, "application/json".to_string()),
                ],
                r#"{"error":"too many requests from this client; slow down"}"#,
            )
                .into_response()
        }
    }
}

/// A request body refused as too large is left unread, and the server closes the connection after the
/// answer. Saying so (`Connection: close`) keeps a pooling client from sending its next request on that
/// connection and losing it ("connection closed before message completed").
async fn close_after_unread_body(mut resp: axum::response::Response) -> axum::response::Response {
    if resp.status() == StatusCode::PAYLOAD_TOO_LARGE {
        resp.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    resp
}

/// Binds `listen` and serves `router` until `cancel` fires, with the default [`Limits`]. Returns the bound
/// address (useful with port 0) and the server's task: it ends once every connection has closed, or
/// [`SHUTDOWN_GRACE`] after `cancel` fired; a request still running then runs on until the process exits.
pub async fn serve(
    listen: &str,
    router: Router,
    cancel: tokio_util::sync::CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_limited(listen, router, cancel, Limits::default()).await
}

/// [`serve`] with explicit per-client limits.
pub async fn serve_limited(
    listen: &str,
    router: Router,
    cancel: tokio_util::sync::CancellationToken,
    limits: Limits,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let router = match std::num::NonZeroU32::new(limits.per_second) {
        Some(rate) => {
            let quota = governor::Quota::per_second(rate)
                .allow_burst(std::num::NonZeroU32::new(limits.burst).unwrap_or(rate));
            let limiter: Arc<IpLimiter> = Arc::new(governor::RateLimiter::keyed(quota));
            let gc = (limiter.clone(), cancel.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = gc.1.cancelled() => return,
                        _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => {}
                    }
                    gc.0.retain_recent();
                    gc.0.shrink_to_fit();
                }
            });
            router.layer(axum::middleware::from_fn_with_state(limiter, limit))
        }
        None => router,
    };
    let router = router.layer(axum::middleware::map_response(close_after_unread_body));
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let stop = cancel.clone();
        let serve = axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move { stop.cancelled().await });
        // requests in flight get SHUTDOWN_GRACE to finish; a connection still open then (a stream a client
        // keeps open, a client that stopped reading) must not hold the process up
        let deadline = async {
            cancel.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        };
        tokio::select! {
            result = serve => {
                if let Err(e) = result {
                    tracing::error!(error = %e, "http server failed");
                }
            }
            _ = deadline => tracing::warn!(
                grace = ?SHUTDOWN_GRACE,
                "http connections still open after the shutdown grace: not waiting for them"
            ),
        }
    });
    Ok((addr, task))
}

/// How long a server shutting down waits for its open connections (Kubernetes' default grace before it
/// kills a pod is 30 s).
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
