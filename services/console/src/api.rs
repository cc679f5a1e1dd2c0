//! The HTTP JSON API (`/api/v1/…`) and the web UI it serves at `/`.
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
        .route("/api/v1/incidents/{id}/ack", post(ack))
        .route("/api/v1/incidents/{id}/resolve", post(resolve))
        .route("/api/v1/resources", get(resources))
        .route("/api/v1/resource", get(resource))
        .route("/api/v1/diff", get(diff_handler))
        .route("/api/v1/compare", get(compare))
        .route("/api/v1/gpu", get(gpu))
        .route("/api/v1/releases", get(releases))
        .route("/api/v1/capacity", get(capacity))
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

// ---------------------------------------------------------------------------------------------------------
// The page

const INDEX: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/style.css");

fn asset(body: &'static str, ctype: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, ctype),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn index() -> Response {
    asset(INDEX, "text/html; charset=utf-8")
}
async fn app_js() -> Response {
    asset(APP_JS, "text/javascript; charset=utf-8")
}
async fn style_css() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

// ---------------------------------------------------------------------------------------------------------
// Who and what

#[derive(Debug, Serialize)]
struct WhoAmI {
    subject: String,
    role: Role,
    auth_enabled: bool,
}

async fn whoami(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
) -> ApiResult<WhoAmI> {
    Ok(axum::Json(WhoAmI {
        subject: p.subject,
        role: p.role,
        auth_enabled: app.tokens.enabled(),
    }))
}

async fn status(State(app): State<App>) -> ApiResult<Value> {
    let synced: Vec<&str> = app
        .shared
        .synced
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .copied()
        .collect();
    let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
    Ok(axum::Json(json!({
        "clusters": st.clusters.len(),
        "objects": st.object_count(),
        "incidents": st.incidents.len(),
        "releases": st.releases.len(),
        "synced": synced,
        "applied": st.counts.applied,
        "skipped": st.counts.skipped,
    })))
}

// ---------------------------------------------------------------------------------------------------------
// Fleet overview

/// One cluster in the overview.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterOverview {
    /// Name.
    pub name: String,
    /// `healthy`, `degraded`, `unhealthy`, `unreachable` or `unknown` (no heartbeat yet).
    pub health: &'static str,
    /// Probes not healthy.
    pub failing_probes: Vec<String>,
    /// Seconds since the last heartbeat was stored.
    pub heartbeat_age_s: Option<i64>,
    /// Agent version.
    pub agent_version: Option<String>,
    /// Kubernetes version (`v1.31.4`).
    pub version: Option<String>,
    /// Registry labels.
    pub labels: BTreeMap<String, String>,
    /// Node counts.
    pub nodes: Option<Value>,
    /// CNI `name version`.
    pub cni: Option<String>,
    /// CoreDNS version.
    pub coredns: Option<String>,
    /// Ingress controller `name version`.
    pub ingress: Option<String>,
    /// API server certificate expiry.
    pub apiserver_cert_expiry: Option<DateTime<Utc>>,
    /// Days until then.
    pub cert_days_left: Option<i64>,
    /// Baseline compliance: `true`, `false`, or absent when not judged yet.
    pub compliant: Option<bool>,
    /// Failing baseline rules.
    pub failing_rules: Vec<String>,
    /// Open or acknowledged incidents.
    pub open_incidents: usize,
    /// The worst severity among them.
    pub worst_severity: Option<Severity>,
    /// Objects the console holds for it.
    pub objects: usize,
}

fn health_of(c: &ClusterRec, now: DateTime<Utc>) -> (&'static str, Vec<String>, Option<i64>) {
    let failing: Vec<String> = c
        .probes
        .iter()
        .filter(|(_, p)| matches!(p.status, ProbeStatus::Unhealthy | ProbeStatus::Degraded))
        .map(|(n, _)| n.clone())
        .collect();
    let Some(hb) = &c.heartbeat else {
        return ("unknown", failing, None);
    };
    let age = (now - hb.ingest_time).num_seconds().max(0);
    // the correlator calls a cluster unreachable after 3 missed heartbeats; so does the overview
    let stale = age > i64::from(hb.heartbeat.interval_s.max(1)) * 3;
    let health = if stale || !hb.heartbeat.apiserver_reachable {
        "unreachable"
    } else if c
        .probes
        .values()
        .any(|p| p.status == ProbeStatus::Unhealthy)
    {
        "unhealthy"
    } else if !failing.is_empty() {
        "degraded"
    } else {
        "healthy"
    };
    (health, failing, Some(age))
}

fn health_rank(h: &str) -> u8 {
    match h {
        "unreachable" => 0,
        "unhealthy" => 1,
        "degraded" => 2,
        "unknown" => 3,
        _ => 4,
    }
}

/// The overview of every cluster (unfiltered, by name).
pub fn overview(st: &Store, now: DateTime<Utc>) -> Vec<ClusterOverview> {
    let mut open: BTreeMap<&str, (usize, Option<Severity>)> = BTreeMap::new();
    for v in st.incidents.values() {
        if v.incident.status != IncidentStatus::Resolved {
            let e = open.entry(v.incident.cluster.as_str()).or_default();
            e.0 += 1;
            e.1 = e.1.max(Some(v.incident.severity));
        }
    }
    st.clusters
        .iter()
        .map(|(name, c)| {
            let (health, failing_probes, heartbeat_age_s) = health_of(c, now);
            let facts = c.facts.as_ref().map(|(f, _)| f);
            let comp = |x: &Option<multipilot_schemas::payload::Component>| {
                x.as_ref().map(|c| format!("{} {}", c.name, c.version))
            };
            let (n_open, worst) = open.get(name.as_str()).copied().unwrap_or_default();
            ClusterOverview {
                name: name.clone(),
                health,
                failing_probes,
                heartbeat_age_s,
                agent_version: c
                    .heartbeat
                    .as_ref()
                    .map(|h| h.heartbeat.agent_version.clone()),
                version: facts.map(|f| f.version.git_version.clone()),
                labels: facts.map(|f| f.labels.clone()).unwrap_or_default(),
                nodes: facts.map(|f| serde_json::to_value(&f.nodes).unwrap_or_default()),
                cni: facts.and_then(|f| comp(&f.cni)),
                coredns: facts.and_then(|f| f.coredns.as_ref().map(|c| c.version.clone())),
                ingress: facts.and_then(|f| comp(&f.ingress_controller)),
                apiserver_cert_expiry: facts.and_then(|f| f.apiserver_cert_expiry),
                cert_days_left: facts
                    .and_then(|f| f.apiserver_cert_expiry)
                    .map(|t| (t - now).num_days()),
                compliant: c.compliance.as_ref().map(|r| r.compliant),
                failing_rules: c
                    .compliance
                    .as_ref()
                    .map(|r| {
                        r.checks
                            .iter()
                            .filter(|k| k.status == multipilot_schemas::payload::CheckStatus::Fail)
                            .map(|k| k.rule.clone())
                            .collect()
                    })
                    .unwrap_or_default(),
                open_incidents: n_open,
                worst_severity: worst,
                objects: c.objects.len(),
            }
        })
        .collect()
}

fn matches_query(c: &ClusterOverview, q: &str) -> bool {
    q.split_whitespace().all(|term| {
        let term = term.to_lowercase();
        if let Some((k, v)) = term.split_once('=') {
            return match k {
                "name" => c.name.to_lowercase() == v,
                "health" => c.health == v,
                "version" => c.version.as_deref().is_some_and(|x| {
                    x.trim_start_matches('v')
                        .starts_with(v.trim_start_matches('v'))
                }),
                _ => c
                    .labels
                    .iter()
                    .any(|(lk, lv)| lk.to_lowercase() == k && lv.to_lowercase() == v),
            };
        }
        let hay = [
            Some(c.name.as_str()),
            c.version.as_deref(),
            c.cni.as_deref(),
            c.ingress.as_deref(),
            Some(c.health),
        ];
        hay.iter()
            .flatten()
            .any(|h| h.to_lowercase().contains(&term))
            || c.labels.values().any(|v| v.to_lowercase().contains(&term))
    })
}

#[derive(Debug, Deserialize)]
struct ClustersQuery {
    q: Option<String>,
    sort: Option<String>,
}

async fn clusters(
    State(app): State<App>,
    Query(q): Query<ClustersQuery>,
) -> ApiResult<Vec<ClusterOverview>> {
    let mut list = {
        let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
        overview(&st, Utc::now())
    };
    if let Some(q) = q.q.as_deref().filter(|q| !q.trim().is_empty()) {
        list.retain(|c| matches_query(c, q));
    }
    match q.sort.as_deref().unwrap_or("name") {
        "name" => {}
        "cert_expiry" | "cert" => list.sort_by_key(|c| {
            (
                c.apiserver_cert_expiry.is_none(),
                c.apiserver_cert_expiry,
                c.name.clone(),
            )
        }),
        "health" => list.sort_by_key(|c| (health_rank(c.health), c.name.clone())),
        "incidents" => list.sort_by_key(|c| (std::cmp::Reverse(c.open_incidents), c.name.clone())),
        other => {
            return Err(ApiError::bad(format!(
                "unknown sort {other:?}: name, cert_expiry, health or incidents"
            )));
        }
    }
    Ok(axum::Json(list))
}

async fn cluster_detail(State(app): State<App>, Path(name): Path<String>) -> ApiResult<Value> {
    let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
    let c = st
        .clusters
        .get(&name)
        .ok_or_else(|| ApiError::not_found(format!("no cluster {name:?}")))?;
    let ov = overview(&st, Utc::now())
        .into_iter()
        .find(|o| o.name == name);
    Ok(axum::Json(json!({
        "overview": ov,
        "probes": c.probes,
        "compliance": c.compliance,
        "facts": c.facts.as_ref().map(|(f, _)| f),
    })))
}

// ---------------------------------------------------------------------------------------------------------
// Incidents

#[derive(Debug, Deserialize)]
struct IncidentsQuery {
    status: Option<String>,
    cluster: Option<String>,
    severity: Option<String>,
    limit: Option<usize>,
}

async fn incidents(
    State(app): State<App>,
    Query(q): Query<IncidentsQuery>,
) -> ApiResult<Vec<crate::store::IncidentView>> {
    let want = q.status.as_deref().unwrap_or("active");
    let status_ok = |s: IncidentStatus| match want {
        "all" => Ok(true),
        "active" => Ok(s != IncidentStatus::Resolved),
        "open" => Ok(s == IncidentStatus::Open),
        "acknowledged" => Ok(s == IncidentStatus::Acknowledged),
        "resolved" => Ok(s == IncidentStatus::Resolved),
        other => Err(ApiError::bad(format!(
            "unknown status {other:?}: active, open, acknowledged, resolved or all"
        ))),
    };
    status_ok(IncidentStatus::Open)?;
    let severity: Option<Severity> = match q.severity.as_deref() {
        None | Some("") => None,
        Some(s) => Some(
            serde_json::from_value(Value::String(s.to_string()))
                .map_err(|_| ApiError::bad(format!("unknown severity {s:?}")))?,
        ),
    };
    let clusters: Option<BTreeSet<&str>> = q
        .cluster
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(|c| c.split(',').collect());
    let mut list: Vec<crate::store::IncidentView> = {
        let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
        st.incidents
            .values()
            .filter(|v| status_ok(v.incident.status).unwrap_or(false))
            .filter(|v| severity.is_none_or(|s| v.incident.severity == s))
            .filter(|v| {
                clusters
                    .as_ref()
                    .is_none_or(|c| c.contains(v.incident.cluster.as_str()))
            })
            .cloned()
            .collect()
    };
    // the timeline: newest change first, by the cluster's clock
    list.sort_by(|a, b| {
        b.incident
            .updated_at
            .cmp(&a.incident.updated_at)
            .then(b.incident.opened_at.cmp(&a.incident.opened_at))
            .then(a.incident.id.cmp(&b.incident.id))
    });
    list.truncate(q.limit.unwrap_or(1000).clamp(1, 10_000));
    Ok(axum::Json(list))
}

struct SseGuard(prometheus_client::metrics::gauge::Gauge);
impl Drop for SseGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

async fn incident_stream(
    State(app): State<App>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = app.shared.incidents.subscribe();
    app.shared.metrics.sse_clients.inc();
    let guard = SseGuard(app.shared.metrics.sse_clients.clone());
    let hello = Event::default().event("hello").data("{}");
    let first = futures::stream::once(async move { Ok::<_, Infallible>(hello) });
    let live = futures::stream::unfold((rx, guard), |(mut rx, guard)| async move {
        let ev = match rx.recv().await {
            Ok(v) => {
                let data = serde_json::to_string(&*v).unwrap_or_default();
                Event::default().event("incident").data(data)
            }
            // the client fell behind: tell it to reload the list
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => Event::default()
                .event("resync")
                .data(json!({"missed": n}).to_string()),
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok(ev), (rx, guard)))
    });
    Sse::new(futures::StreamExt::chain(first, live)).keep_alive(KeepAlive::default())
}

async fn command(app: &App, p: &Principal, id: String, action: IncidentAction) -> ApiResult<Value> {
    require(p, Role::Operator)?;
    let cmd = IncidentCommand {
        id: id.clone(),
        action,
        actor: p.subject.clone(),
    };
    let reply = multipilot_bus::request::incident_command(&app.nats, &cmd, Duration::from_secs(5))
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}")))?;
    let incident = reply.incident.clone();
    let body = json!({"outcome": reply.outcome, "incident": incident, "error": reply.error});
    match reply.outcome {
        CommandOutcome::Done | CommandOutcome::Unchanged => Ok(axum::Json(body)),
        CommandOutcome::NotFound => Err(ApiError::not_found(format!("no incident {id:?}"))),
        CommandOutcome::Conflict => Err(ApiError::new(
            StatusCode::CONFLICT,
            reply
                .error
                .unwrap_or_else(|| "not possible in the incident's state".into()),
        )),
        CommandOutcome::Failed => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            reply
                .error
                .unwrap_or_else(|| "the correlator failed".into()),
        )),
    }
}

async fn ack(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Value> {
    command(&app, &p, id, IncidentAction::Ack).await
}

async fn resolve(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Value> {
    command(&app, &p, id, IncidentAction::Resolve).await
}

// ---------------------------------------------------------------------------------------------------------
// Resources

/// One object in a search result.
#[derive(Debug, Clone, Serialize)]
pub struct ResourceRow {
    /// Cluster.
    pub cluster: String,
    /// Kind.
    pub kind: String,
    /// Namespace (absent when cluster-scoped).
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// `group/version`.
    pub api_version: String,
    /// Spec hash.
    pub spec_hash: String,
    /// Labels+annotations hash.
    pub metadata_hash: String,
    /// Ready.
    pub ready: Option<bool>,
    /// Phase.
    pub phase: Option<String>,
    /// `ready/desired` replicas.
    pub replicas: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

fn ns_param(ns: Option<&str>) -> Option<&str> {
    // `_` is the subject token of "no namespace"
    ns.map(|n| if n == "_" { "" } else { n })
}

/// The kind as stored, matched without regard to case (`deployment` → `Deployment`).
fn resolve_kind(st: &Store, kind: &str) -> Option<String> {
    st.clusters
        .values()
        .flat_map(|c| c.objects.keys())
        .map(|k| &k.kind)
        .find(|k| k.eq_ignore_ascii_case(kind))
        .map(|k| k.to_string())
}

#[derive(Debug, Deserialize)]
struct ResourcesQuery {
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    selector: Option<String>,
    cluster: Option<String>,
    limit: Option<usize>,
}

async fn resources(State(app): State<App>, Query(q): Query<ResourcesQuery>) -> ApiResult<Value> {
    let selector = Selector::parse(q.selector.as_deref().unwrap_or(""))
        .map_err(|e| ApiError::bad(e.to_string()))?;
    let limit = q.limit.unwrap_or(500).clamp(1, 10_000);
    let clusters: Option<BTreeSet<&str>> = q
        .cluster
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(|c| c.split(',').collect());
    let kind = q.kind.as_deref().filter(|k| !k.is_empty());
    let ns = ns_param(q.namespace.as_deref().filter(|n| !n.is_empty()));
    let name = q.name.as_deref().filter(|n| !n.is_empty());
    let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
    let (mut items, mut total) = (Vec::new(), 0usize);
    for (cname, c) in &st.clusters {
        if clusters
            .as_ref()
            .is_some_and(|s| !s.contains(cname.as_str()))
        {
            continue;
        }
        for (k, o) in &c.objects {
            if kind.is_some_and(|want| !k.kind.eq_ignore_ascii_case(want))
                || ns.is_some_and(|want| &*k.namespace != want)
                || name.is_some_and(|want| !k.name.contains(want))
                || !selector.matches(|key| o.label(key))
            {
                continue;
            }
            total += 1;
            if items.len() < limit {
                items.push(ResourceRow {
                    cluster: cname.clone(),
                    kind: k.kind.to_string(),
                    namespace: (!k.namespace.is_empty()).then(|| k.namespace.to_string()),
                    name: k.name.to_string(),
                    api_version: o.api_version.to_string(),
                    spec_hash: o.spec_hash.to_string(),
                    metadata_hash: o.metadata_hash.to_string(),
                    ready: o.ready,
                    phase: o.phase.as_deref().map(str::to_string),
                    replicas: o.replicas.map(|(d, r)| format!("{r}/{d}")),
                    labels: o
                        .labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                });
            }
        }
    }
    Ok(axum::Json(json!({"total": total, "items": items})))
}

#[derive(Debug, Deserialize)]
struct ObjectQuery {
    cluster: String,
    kind: String,
    namespace: Option<String>,
    name: String,
}

fn key_for(st: &Store, kind: &str, namespace: Option<&str>, name: &str) -> Option<ObjKey> {
    let kind = resolve_kind(st, kind)?;
    Some(ObjKey {
        kind: Arc::from(kind.as_str()),
        namespace: Arc::from(ns_param(namespace).unwrap_or("")),
        name: name.into(),
    })
}

/// Reads an object's full state back from FLEET_STATE by the sequence the index holds. If that message
/// was superseded meanwhile (the stream keeps one per subject), the index has the newer sequence by the
/// next try.
async fn fetch_state(
    app: &App,
    cluster: &str,
    key: &ObjKey,
) -> Result<Option<multipilot_schemas::payload::ResourceState>, ApiError> {
    let stream = app
        .js
        .get_stream_no_info("FLEET_STATE")
        .await
        .map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, format!("FLEET_STATE: {e}")))?;
    for attempt in 0..5 {
        let seq = {
            let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
            match st.clusters.get(cluster).and_then(|c| c.objects.get(key)) {
                Some(o) => o.seq,
                None => return Ok(None),
            }
        };
        match stream.get_raw_message(seq).await {
            Ok(m) => {
                let header = |n: &str| m.headers.get(n).map(|v| v.as_str().to_string());
                let env = multipilot_schemas::decode::<multipilot_schemas::streams::StateMsg>(
                    header(multipilot_schemas::HEADER_CONTENT_TYPE).as_deref(),
                    header(multipilot_schemas::HEADER_SCHEMA).as_deref(),
                    &m.payload,
                    multipilot_schemas::codec::DEFAULT_MAX_BYTES,
                )
                .map_err(|e| {
                    ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("stored state: {e}"),
                    )
                })?;
                return Ok(match env.payload {
                    multipilot_schemas::streams::StateMsg::State(s) => Some(s),
                    _ => None,
                });
            }
            Err(e) if attempt < 4 => {
                tracing::debug!(seq, error = %e, "state superseded; reading the newer one");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                return Err(ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    format!("reading FLEET_STATE seq {seq}: {e}"),
                ));
            }
        }
    }
    Ok(None)
}

async fn resource(State(app): State<App>, Query(q): Query<ObjectQuery>) -> ApiResult<Value> {
    let key = {
        let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
        key_for(&st, &q.kind, q.namespace.as_deref(), &q.name)
            .ok_or_else(|| ApiError::not_found(format!("no {} anywhere", q.kind)))?
    };
    let state = fetch_state(&app, &q.cluster, &key)
        .await?
        .ok_or_else(|| ApiError::not_found("no such object in that cluster"))?;
    Ok(axum::Json(serde_json::to_value(state).unwrap_or_default()))
}

// ---------------------------------------------------------------------------------------------------------
// Diff and compare

#[derive(Debug, Deserialize)]
struct DiffQuery {
    namespace: Option<String>,
    kind: String,
    name: String,
    clusters: Option<String>,
}

async fn diff_handler(State(app): State<App>, Query(q): Query<DiffQuery>) -> ApiResult<Value> {
    let (key, names) = {
        let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
        let key = key_for(&st, &q.kind, q.namespace.as_deref(), &q.name)
            .ok_or_else(|| ApiError::not_found(format!("no {} anywhere", q.kind)))?;
        let names: Vec<String> = match q.clusters.as_deref().filter(|c| !c.is_empty()) {
            Some(list) => list.split(',').map(str::to_string).collect(),
            None => st
                .clusters
                .iter()
                .filter(|(_, c)| c.objects.contains_key(&key))
                .map(|(n, _)| n.clone())
                .collect(),
        };
        for n in &names {
            if !st.clusters.contains_key(n) {
                return Err(ApiError::not_found(format!("no cluster {n:?}")));
            }
        }
        (key, names)
    };
    let mut states: Vec<Option<multipilot_schemas::payload::ResourceState>> = Vec::new();
    for n in &names {
        states.push(fetch_state(&app, n, &key).await?);
    }
    if states.iter().all(Option::is_none) {
        return Err(ApiError::not_found(format!(
            "{}/{}/{} is in none of those clusters",
            q.namespace.as_deref().unwrap_or(""),
            key.kind,
            key.name
        )));
    }
    let specs: Vec<Option<&Value>> = states
        .iter()
        .map(|s| s.as_ref().and_then(|s| s.spec.as_ref()))
        .collect();
    let hashes: Vec<Option<&str>> = states
        .iter()
        .map(|s| s.as_ref().map(|s| s.spec_hash.as_str()))
        .collect();
    let identical = hashes.windows(2).all(|w| w[0] == w[1]) && hashes.iter().all(Option::is_some);
    let fields = if identical {
        Vec::new()
    } else {
        diff::fields(&specs)
    };
    let labels = diff::maps(
        &states
            .iter()
            .map(|s| s.as_ref().map(|s| &s.labels))
            .collect::<Vec<_>>(),
    );
    let annotations = diff::maps(
        &states
            .iter()
            .map(|s| s.as_ref().map(|s| &s.annotations))
            .collect::<Vec<_>>(),
    );
    let per: Vec<Value> = names
        .iter()
        .zip(&states)
        .map(|(n, s)| match s {
            Some(s) => json!({
                "cluster": n, "present": true, "api_version": s.api_version,
                "spec_hash": s.spec_hash, "metadata_hash": s.metadata_hash,
                "resource_version": s.resource_version, "generation": s.generation,
                "ready": s.status.ready,
            }),
            None => json!({"cluster": n, "present": false}),
        })
        .collect();
    Ok(axum::Json(json!({
        "kind": &*key.kind,
        "namespace": (!key.namespace.is_empty()).then(|| key.namespace.to_string()),
        "name": &*key.name,
        "clusters": per,
        "identical": identical,
        "fields": fields,
        "labels": labels,
        "annotations": annotations,
    })))
}

/// Kinds a whole-cluster comparison leaves out unless asked for by name: their names are generated or
/// belong to one cluster by nature, so they would differ everywhere.
pub const COMPARE_SKIPS: &[&str] = &[
    "Pod",
    "ReplicaSet",
    "EndpointSlice",
    "Endpoints",
    "Lease",
    "Node",
    "Event",
    "Job",
];

#[derive(Debug, Deserialize)]
struct CompareQuery {
    a: String,
    b: String,
    kind: Option<String>,
    namespace: Option<String>,
    limit: Option<usize>,
}

fn key_json(k: &ObjKey) -> Value {
    json!({
        "kind": &*k.kind,
        "namespace": (!k.namespace.is_empty()).then(|| k.namespace.to_string()),
        "name": &*k.name,
    })
}

async fn compare(State(app): State<App>, Query(q): Query<CompareQuery>) -> ApiResult<Value> {
    let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
    let get = |n: &str| {
        st.clusters
            .get(n)
            .ok_or_else(|| ApiError::not_found(format!("no cluster {n:?}")))
    };
    let (ca, cb) = (get(&q.a)?, get(&q.b)?);
    let kind = q.kind.as_deref().filter(|k| !k.is_empty());
    let ns = ns_param(q.namespace.as_deref().filter(|n| !n.is_empty()));
    let keep = |k: &ObjKey| -> bool {
        let kind_ok = match kind {
            Some(want) => k.kind.eq_ignore_ascii_case(want),
            None => !COMPARE_SKIPS.contains(&&*k.kind),
        };
        kind_ok && ns.is_none_or(|want| &*k.namespace == want)
    };
    let limit = q.limit.unwrap_or(2000).clamp(1, 20_000);
    let (mut only_a, mut only_b, mut differ, mut same) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let (mut n_only_a, mut n_only_b, mut n_differ) = (0usize, 0usize, 0usize);
    for (k, oa) in ca.objects.iter().filter(|(k, _)| keep(k)) {
        match cb.objects.get(k) {
            None => {
                n_only_a += 1;
                if only_a.len() < limit {
                    only_a.push(key_json(k));
                }
            }
            Some(ob) if ob.spec_hash != oa.spec_hash => {
                n_differ += 1;
                if differ.len() < limit {
                    let mut v = key_json(k);
                    v["spec_hash_a"] = json!(&*oa.spec_hash);
                    v["spec_hash_b"] = json!(&*ob.spec_hash);
                    v["metadata_differs"] = json!(oa.metadata_hash != ob.metadata_hash);
                    differ.push(v);
                }
            }
            Some(_) => same += 1,
        }
    }
    for k in cb.objects.keys().filter(|k| keep(k)) {
        if !ca.objects.contains_key(k) {
            n_only_b += 1;
            if only_b.len() < limit {
                only_b.push(key_json(k));
            }
        }
    }
    Ok(axum::Json(json!({
        "a": q.a, "b": q.b,
        "kind": kind, "namespace": q.namespace,
        "skipped_kinds": if kind.is_none() { COMPARE_SKIPS.to_vec() } else { Vec::new() },
        "counts": {"only_in_a": n_only_a, "only_in_b": n_only_b, "differ": n_differ, "same": same},
        "only_in_a": only_a,
        "only_in_b": only_b,
        "differ": differ,
    })))
}

// ---------------------------------------------------------------------------------------------------------
// GPU pool

/// One cluster's GPUs.
#[derive(Debug, Clone, Serialize)]
pub struct GpuPool {
    /// Cluster.
    pub cluster: String,
    /// Cluster health (as in the overview).
    pub health: &'static str,
    /// `nvidia.com/gpu` allocatable.
    pub allocatable: u32,
    /// GPUs requested by scheduled pods.
    pub allocated: u32,
    /// allocatable − allocated.
    pub free: u32,
    /// Per GPU model.
    pub models: Vec<GpuModel>,
    /// Device plugin `name version` and readiness.
    pub device_plugin: Option<Value>,
    /// The gpu-device-plugin probe's latest status and detail.
    pub plugin_health: Option<ProbeStatus>,
    /// The probe's detail line.
    pub plugin_detail: Option<String>,
}

/// GPUs of one model in a cluster.
#[derive(Debug, Clone, Serialize)]
pub struct GpuModel {
    /// Model (`nvidia.com/gpu.product`).
    pub model: String,
    /// Nodes with it.
    pub nodes: usize,
    /// Allocatable.
    pub allocatable: u32,
    /// Allocated.
    pub allocated: u32,
    /// Free.
    pub free: u32,
    /// Driver versions on those nodes.
    pub driver_versions: Vec<String>,
}

/// Every cluster with GPUs, the most free GPUs first.
pub fn gpu_pools(st: &Store, now: DateTime<Utc>) -> Vec<GpuPool> {
    let mut out = Vec::new();
    for (name, c) in &st.clusters {
        let Some((facts, _)) = &c.facts else { continue };
        if facts.gpus.is_empty() {
            continue;
        }
        let mut models: BTreeMap<&str, GpuModel> = BTreeMap::new();
        for g in &facts.gpus {
            let m = models.entry(g.model.as_str()).or_insert_with(|| GpuModel {
                model: g.model.clone(),
                nodes: 0,
                allocatable: 0,
                allocated: 0,
                free: 0,
                driver_versions: Vec::new(),
            });
            m.nodes += 1;
            m.allocatable += g.allocatable;
            m.allocated += g.allocated;
            m.free = m.allocatable.saturating_sub(m.allocated);
            if !g.driver_version.is_empty() && !m.driver_versions.contains(&g.driver_version) {
                m.driver_versions.push(g.driver_version.clone());
            }
        }
        let models: Vec<GpuModel> = models.into_values().collect();
        let allocatable = models.iter().map(|m| m.allocatable).sum();
        let allocated = models.iter().map(|m| m.allocated).sum();
        let probe = c.probes.get("gpu-device-plugin");
        out.push(GpuPool {
            cluster: name.clone(),
            health: health_of(c, now).0,
            allocatable,
            allocated,
            free: u32::saturating_sub(allocatable, allocated),
            models,
            device_plugin: facts
                .gpu_device_plugin
                .as_ref()
                .map(|p| json!({"name": p.name, "version": p.version, "ready": p.ready})),
            plugin_health: probe.map(|p| p.status),
            plugin_detail: probe.map(|p| p.detail.clone()),
        });
    }
    out.sort_by(|a, b| b.free.cmp(&a.free).then(a.cluster.cmp(&b.cluster)));
    out
}

async fn gpu(State(app): State<App>) -> ApiResult<Vec<GpuPool>> {
    let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
    Ok(axum::Json(gpu_pools(&st, Utc::now())))
}

// ---------------------------------------------------------------------------------------------------------
// Releases

async fn releases(State(app): State<App>) -> ApiResult<Value> {
    let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
    let mut list: Vec<Value> = st
        .releases
        .iter()
        .map(|(name, recs)| {
            let last = recs.iter().map(|r| r.ingest_time).max();
            let clusters: BTreeSet<&str> = recs
                .iter()
                .map(|r| r.cluster.as_str())
                .filter(|c| !c.is_empty())
                .collect();
            let newest: Vec<&crate::store::ReleaseRecord> = recs.iter().rev().take(50).collect();
            json!({"release": name, "last_change": last, "clusters": clusters, "records": newest})
        })
        .collect();
    list.sort_by(|a, b| b["last_change"].as_str().cmp(&a["last_change"].as_str()));
    Ok(axum::Json(json!({"releases": list})))
}

// ---------------------------------------------------------------------------------------------------------
// Capacity (PromQL range queries to the TSDB)

#[derive(Debug, Deserialize)]
struct CapacityQuery {
    cluster: Option<String>,
    range: Option<String>,
    step: Option<String>,
}

/// The capacity series: (name, unit, PromQL with `{M}` standing for the extra matchers).
pub const CAPACITY: &[(&str, &str, &str)] = &[
    (
        "cpu_used",
        "cores",
        "sum(rate(node_cpu_seconds_total{mode!=\"idle\"M}[5m]))",
    ),
    (
        "cpu_allocatable",
        "cores",
        "sum(kube_node_status_allocatable{resource=\"cpu\"M})",
    ),
    (
        "memory_used",
        "bytes",
        "sum(node_memory_MemTotal_bytes{M0}) - sum(node_memory_MemAvailable_bytes{M0})",
    ),
    (
        "memory_allocatable",
        "bytes",
        "sum(kube_node_status_allocatable{resource=\"memory\"M})",
    ),
    ("pods", "pods", "count(kube_pod_info{M0})"),
    (
        "pods_allocatable",
        "pods",
        "sum(kube_node_status_allocatable{resource=\"pods\"M})",
    ),
    (
        "gpus_allocatable",
        "gpus",
        "sum(kube_node_status_allocatable{resource=\"nvidia_com_gpu\"M})",
    ),
];

/// The PromQL of a capacity series, limited to one cluster when given.
pub fn capacity_query(template: &str, cluster: Option<&str>) -> String {
    let m = cluster
        .map(|c| {
            format!(
                "cluster=\"{}\"",
                c.replace('\\', "\\\\").replace('"', "\\\"")
            )
        })
        .unwrap_or_default();
    let with_comma = if m.is_empty() {
        String::new()
    } else {
        format!(",{m}")
    };
    template
        .replace(
            "{M0}",
            &if m.is_empty() {
                String::new()
            } else {
                format!("{{{m}}}")
            },
        )
        .replace("M}", &format!("{with_comma}}}"))
}

async fn capacity(State(app): State<App>, Query(q): Query<CapacityQuery>) -> ApiResult<Value> {
    let range = humantime::parse_duration(q.range.as_deref().unwrap_or("1h"))
        .map_err(|e| ApiError::bad(format!("range: {e}")))?
        .min(Duration::from_secs(7 * 86_400))
        .max(Duration::from_secs(60));
    let step = match q.step.as_deref() {
        Some(s) => humantime::parse_duration(s).map_err(|e| ApiError::bad(format!("step: {e}")))?,
        None => range / 60,
    }
    .max(Duration::from_secs(15));
    let end = Utc::now().timestamp();
    let start = end - range.as_secs() as i64;
    let cluster = q.cluster.as_deref().filter(|c| !c.is_empty());
    let url = format!("{}/api/v1/query_range", app.tsdb_url.trim_end_matches('/'));
    let calls = CAPACITY.iter().map(|(name, unit, tpl)| {
        let query = capacity_query(tpl, cluster);
        let (http, url) = (app.http.clone(), url.clone());
        async move {
            let resp = http
                .get(&url)
                .query(&[
                    ("query", query.as_str()),
                    ("start", &start.to_string()),
                    ("end", &end.to_string()),
                    ("step", &step.as_secs().to_string()),
                ])
                .timeout(Duration::from_secs(10))
                .send()
                .await;
            let body: Result<Value, String> = match resp {
                Ok(r) => r.json().await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            (name, unit, query, body)
        }
    });
    let results = futures::future::join_all(calls).await;
    let (mut series, mut errors) = (Vec::new(), Vec::new());
    for (name, unit, query, body) in results {
        match body {
            Ok(b) if b["status"] == "success" => {
                let points: Vec<Value> = b["data"]["result"]
                    .as_array()
                    .and_then(|r| r.first())
                    .and_then(|s| s["values"].as_array())
                    .map(|vals| {
                        vals.iter()
                            .filter_map(|p| {
                                let t = p[0].as_f64()?;
                                let v: f64 = p[1].as_str()?.parse().ok()?;
                                v.is_finite().then(|| json!([t, v]))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                series
                    .push(json!({"metric": name, "unit": unit, "query": query, "points": points}));
            }
            Ok(b) => errors.push(json!({"metric": name, "query": query, "error": b["error"]})),
            Err(e) => errors.push(json!({"metric": name, "query": query, "error": e})),
        }
    }
    if series.is_empty() && !errors.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "the TSDB at {} did not answer: {}",
                app.tsdb_url, errors[0]["error"]
            ),
        ));
    }
    Ok(axum::Json(json!({
        "cluster": cluster, "start": start, "end": end, "step": step.as_secs(),
        "series": series, "errors": errors,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_queries_scope_to_a_cluster() {
        let q = capacity_query(CAPACITY[0].2, Some("prod-1"));
        assert_eq!(
            q,
            "sum(rate(node_cpu_seconds_total{mode!=\"idle\",cluster=\"prod-1\"}[5m]))"
        );
        let q = capacity_query(CAPACITY[2].2, Some("a\"b"));
        assert_eq!(
            q,
            "sum(node_memory_MemTotal_bytes{cluster=\"a\\\"b\"}) - sum(node_memory_MemAvailable_bytes{cluster=\"a\\\"b\"})"
        );
        assert_eq!(capacity_query(CAPACITY[4].2, None), "count(kube_pod_info)");
        assert_eq!(
            capacity_query(CAPACITY[1].2, None),
            "sum(kube_node_status_allocatable{resource=\"cpu\"})"
        );
    }
}
