//! The HTTP JSON API (`/api/v1/…`) and the web UI it serves at `/`, one module per section of the API.
//!
//! Every API route needs a bearer token (`Authorization: Bearer <token>`, or `?access_token=` for the live
//! stream, which `EventSource` can't give headers to) unless auth is off; changing routes need the operator
//! role. Errors are JSON: `{"error": "...", "status": 401}`.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use futures::Stream;
use multipilot_schemas::control::{CommandOutcome, IncidentAction, IncidentCommand};
use multipilot_schemas::payload::{IncidentStatus, ProbeStatus, Severity};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::auth::{self, Principal, Role, Tokens};
use crate::diff;
use crate::ingest::Shared;
use crate::selector::Selector;
use crate::store::{ClusterRec, ObjKey, Store};

mod capacity;
mod compliance;
mod fleet;
mod gpu;
mod incidents;
mod page;
mod releases;
mod resources;
mod vitals;

#[allow(unused_imports)] // the sections use each other
use self::{
    capacity::*, compliance::*, fleet::*, gpu::*, incidents::*, page::*, releases::*, resources::*,
    vitals::*,
};

pub use self::fleet::{ClusterOverview, Health, overview};
pub use self::gpu::{GpuModel, GpuPool, gpu_pools};
pub use self::resources::{ResourcePage, ResourceRow};

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct App {
    /// Feeds, store and metrics.
    pub shared: Shared,
    /// Tokens.
    pub tokens: Arc<Tokens>,
    /// NATS (incident commands to the correlator).
    pub nats: async_nats::Client,
    /// JetStream (full object states are read back from FLEET_STATE by sequence).
    pub js: async_nats::jetstream::Context,
    /// HTTP client for the TSDB.
    pub http: reqwest::Client,
    /// TSDB base URL.
    pub tsdb_url: String,
    /// Fires when the console shuts down: a stream that would last ends then (the browser's EventSource
    /// reconnects to the next one).
    pub cancel: tokio_util::sync::CancellationToken,
}

/// An API error.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl ApiError {
    fn new(status: StatusCode, msg: impl Into<String>) -> Self {
        ApiError(status, msg.into())
    }
    fn bad(msg: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, msg)
    }
    fn not_found(msg: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, msg)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": self.1, "status": self.0.as_u16()});
        (self.0, axum::Json(body)).into_response()
    }
}

type ApiResult<T> = Result<axum::Json<T>, ApiError>;

fn require(p: &Principal, role: Role) -> Result<(), ApiError> {
    auth::require(p, role).map_err(|refused| match refused {
        auth::Refusal::Forbidden(msg) => ApiError::new(StatusCode::FORBIDDEN, msg),
        auth::Refusal::Unauthenticated(msg) => ApiError::new(StatusCode::UNAUTHORIZED, msg),
    })
}

async fn authenticate(State(app): State<App>, mut req: Request, next: Next) -> Response {
    match auth::authenticate(&app.tokens, &req) {
        Ok(p) => {
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        Err(refused) => refused.into_response(),
    }
}

/// Refuses the routes that span the whole fleet (GPU pools, capacity, compliance rules, releases, GitOps)
/// to a token that sees only some clusters: their answers aggregate every cluster.
async fn whole_fleet_only(req: Request, next: Next) -> Response {
    if let Some(p) = req.extensions().get::<Principal>()
        && p.scoped()
    {
        let route = req.uri().path().to_string();
        return ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "{} sees only some clusters; {route} answers for the whole fleet",
                p.subject
            ),
        )
        .into_response();
    }
    next.run(req).await
}

/// 403 when the principal may not see `cluster` (a team's token naming another team's cluster).
fn may_see(p: &Principal, cluster: &str) -> Result<(), ApiError> {
    if p.sees(cluster) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("{} may not see the cluster {cluster:?}", p.subject),
        ))
    }
}

async fn observe(State(app): State<App>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "other".into());
    let started = Instant::now();
    let resp = next.run(req).await;
    app.shared.metrics.request(
        &route,
        resp.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    resp
}

/// The console's routes.
pub fn router(app: App) -> Router {
    let api = Router::new()
        .route("/api/v1/whoami", get(whoami))
        .route("/api/v1/status", get(status))
        .route("/api/v1/clusters", get(clusters))
        .route("/api/v1/clusters/{name}", get(cluster_detail))
        .route("/api/v1/incidents", get(incidents))
        .route("/api/v1/incidents/stream", get(incident_stream))
        .route("/api/v1/fleet-incidents", get(fleet_incidents))
        .route("/api/v1/incidents/{id}/ack", post(ack))
        .route("/api/v1/incidents/{id}/resolve", post(resolve))
        .route("/api/v1/resources", get(resources))
        .route("/api/v1/resource", get(resource))
        .route("/api/v1/diff", get(diff_handler))
        .route("/api/v1/compare", get(compare))
        .route("/api/v1/vitals", get(vitals))
        .merge(
            Router::new()
                .route("/api/v1/gpu", get(gpu))
                .route("/api/v1/releases", get(releases))
                .route("/api/v1/gitops", get(gitops))
                .route("/api/v1/capacity", get(capacity))
                .route("/api/v1/compliance", get(compliance_view))
                .route_layer(middleware::from_fn(whole_fleet_only)),
        )
        .fallback(|| async { ApiError::not_found("no such API route") })
        .route_layer(middleware::from_fn_with_state(app.clone(), authenticate));
    Router::new()
        .route("/", get(index))
        .route("/app.js", get(app_js))
        .route("/style.css", get(style_css))
        .merge(api)
        .layer(middleware::from_fn_with_state(app.clone(), observe))
        .with_state(app)
}
