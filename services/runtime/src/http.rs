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

/// Binds `listen` and serves `router` until `cancel` fires. Returns the bound address (useful with port 0).
pub async fn serve(
    listen: &str,
    router: Router,
    cancel: tokio_util::sync::CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let result = axum::serve(listener, router)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "http server failed");
        }
    });
    Ok((addr, task))
}
