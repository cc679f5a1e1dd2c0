//! The router's HTTP API, Alertmanager's v2 API for what its clients use (amtool, Prometheus, vmalert,
//! Grafana): `GET/POST /api/v2/alerts`, `GET /api/v2/alerts/groups`, `GET/POST /api/v2/silences`,
//! `GET/DELETE /api/v2/silence/{id}`, `GET /api/v2/receivers`, `GET /api/v2/status`; plus
//! `GET /api/v1/receivers` (delivery state) and `GET /api/v1/dead`. Changes need a bearer token when
//! tokens are configured (an operator's: posting alerts too), and every silence change is audited on
//! `fleet.audit.alerts.<action>` (posted alerts are not: Prometheus re-posts every alert each minute).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Extension, Json};
use chrono::Datelike;
use chrono::{DateTime, Utc};
use multipilot_runtime::auth::{self, Principal, Tokens};
use multipilot_schemas::payload::{AuditOutcome, AuditRecord};
use multipilot_schemas::{Envelope, stable_id, subject};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Mutex;

use crate::deliver::Metrics;
use crate::engine::AlertView;
use crate::matcher::{ApiMatcher, Matcher};
use crate::router::Router;
use crate::store::{self, Alert, Pending, Silence};

/// What the handlers share.
#[derive(Clone)]
pub struct Api {
    /// The dispatcher.
    pub router: Arc<Mutex<Router>>,
    /// Required tokens: viewers read, operators change silences (`None`: open, on loopback only).
    pub tokens: Option<Arc<Tokens>>,
    /// For audit records.
    pub js: async_nats::jetstream::Context,
    /// This instance.
    pub instance: String,
    /// Delivery metrics.
    pub metrics: Metrics,
    /// A posted alert without `endsAt` resolves this long after it was last posted.
    pub resolve_timeout: std::time::Duration,
    /// When the router started (`/api/v2/status`'s `uptime`).
    pub started_at: DateTime<Utc>,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api").finish_non_exhaustive()
    }
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(json!({ "error": msg.into() }))).into_response()
}

impl Api {
    async fn audit(&self, actor: &str, action: &str, target: &str, detail: serde_json::Value) {
        let id = stable_id(&[action, target, &Utc::now().to_rfc3339()]);
        let rec = AuditRecord {
            id: id.clone(),
            actor: actor.to_string(),
            role: "alerts".into(),
            action: format!("silence.{action}"),
            target: target.to_string(),
            outcome: AuditOutcome::Ok,
            detail,
            commit: None,
        };
        let env = Envelope::new("fleet", &self.instance, Utc::now(), 0, rec);
        if let Err(e) = multipilot_bus::publish::publish_one(
            &self.js,
            subject::audit("alerts", &format!("silence-{action}")),
            id,
            &env,
        )
        .await
        {
            tracing::warn!(error = %e, "could not publish the audit record");
        }
    }
}

/// Who asks (the auth middleware puts it in; absent with auth off).
type Asker = Option<Extension<Principal>>;

/// The principal when it sees only some clusters (a team's token).
fn scoped(asker: &Asker) -> Option<&Principal> {
    asker.as_ref().map(|Extension(p)| p).filter(|p| p.scoped())
}

/// Whether the asker may see an alert with these labels: a team sees the alerts whose `cluster` is one of
/// its clusters (not fleet-wide alerts, nor posted ones without a `cluster`).
fn sees_alert(asker: &Asker, labels: &BTreeMap<String, String>) -> bool {
    scoped(asker).is_none_or(|p| labels.get("cluster").is_some_and(|c| p.sees(c)))
}

/// The clusters a matcher pins `cluster` to: `cluster="a"`, or `cluster=~"a|b"` of plain names.
fn pinned_clusters(m: &Matcher) -> Option<Vec<&str>> {
    if m.name != "cluster" {
        return None;
    }
    match m.op {
        crate::matcher::Op::Eq => Some(vec![m.value.as_str()]),
        crate::matcher::Op::Re => {
            let names: Vec<&str> = m.value.split('|').collect();
            names.iter().all(|n| auth::is_dns_label(n)).then_some(names)
        }
        _ => None,
    }
}

/// Whether the asker may see and change a silence with these matchers: for a team, one that can only
/// silence its clusters' alerts (a `cluster` matcher naming only its clusters).
fn sees_silence(asker: &Asker, matchers: &[Matcher]) -> bool {
    scoped(asker).is_none_or(|p| {
        matchers
            .iter()
            .any(|m| pinned_clusters(m).is_some_and(|names| names.iter().all(|n| p.sees(n))))
    })
}

/// 403 for what a team's token may not use.
fn refuse_scoped(asker: &Asker, what: &str) -> Option<Response> {
    scoped(asker).map(|p| {
        error(
            StatusCode::FORBIDDEN,
            format!(
                "{} sees only some clusters: {what} is not for it",
                p.subject
            ),
        )
    })
}

/// Who made a change: the token's subject (empty with auth off).
fn actor(principal: Option<Extension<Principal>>) -> String {
    principal.map(|Extension(p)| p.subject).unwrap_or_default()
}

/// The routes: with tokens, viewers read and operators change silences.
pub fn router(api: Api) -> axum::Router {
    let tokens = api.tokens.clone();
    let router = axum::Router::new()
        .route("/api/v2/silences", get(list_silences).post(post_silence))
        .route(
            "/api/v2/silence/{id}",
            delete(expire_silence).get(get_silence),
        )
        .route("/api/v2/alerts", get(list_alerts).post(post_alerts))
        .route("/api/v2/alerts/groups", get(list_groups))
        .route("/api/v2/receivers", get(list_receivers))
        .route("/api/v2/status", get(status))
        .route("/api/v1/receivers", get(receivers))
        .route("/api/v1/dead", get(dead))
        .with_state(api);
    match tokens {
        Some(tokens) => router.route_layer(axum::middleware::from_fn_with_state(
            tokens,
            auth::viewer_reads_operator_writes,
        )),
        None => router,
    }
}

fn silence_json(s: &Silence, now: DateTime<Utc>) -> serde_json::Value {
    json!({
        "id": s.id,
        "matchers": s.matchers.iter().map(ApiMatcher::from).collect::<Vec<_>>(),
        "startsAt": s.starts_at,
        "endsAt": s.ends_at,
        "updatedAt": s.updated_at,
        "createdBy": s.created_by,
        "comment": s.comment,
        "status": { "state": s.state(now) },
    })
}

/// A silence's matchers as the labels `filter` is matched against (Alertmanager's
/// `CheckSilenceMatchesFilterLabels`: each matcher's name with its value).
fn silence_labels(s: &Silence) -> BTreeMap<String, String> {
    s.matchers
        .iter()
        .map(|m| {
            let m = ApiMatcher::from(m);
            (m.name, m.value)
        })
        .collect()
}

async fn list_silences(
    State(api): State<Api>,
    asker: Asker,
    Query(q): Query<Vec<(String, String)>>,
) -> Response {
    let filter = match filter_of(&q) {
        Ok(f) => f,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let now = Utc::now();
    let r = api.router.lock().await;
    let e = &r.engine;
    let mut v: Vec<&Silence> = e
        .silences()
        .filter(|s| {
            sees_silence(&asker, &s.matchers)
                && crate::matcher::all_match(&filter, &silence_labels(s))
        })
        .collect();
    v.sort_by_key(|s| std::cmp::Reverse(s.starts_at));
    Json(
        v.into_iter()
            .map(|s| silence_json(s, now))
            .collect::<Vec<_>>(),
    )
    .into_response()
}

async fn get_silence(State(api): State<Api>, asker: Asker, Path(id): Path<String>) -> Response {
    let r = api.router.lock().await;
    let e = &r.engine;
    match e
        .silences()
        .find(|s| s.id == id && sees_silence(&asker, &s.matchers))
    {
        Some(s) => Json(silence_json(s, Utc::now())).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no silence {id}")),
    }
}

/// Alertmanager's PostableSilence.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PostableSilence {
    #[serde(default)]
    id: Option<String>,
    matchers: Vec<ApiMatcher>,
    #[serde(default)]
    starts_at: Option<DateTime<Utc>>,
    ends_at: DateTime<Utc>,
    #[serde(default)]
    created_by: String,
    #[serde(default)]
    comment: String,
}

async fn post_silence(
    State(api): State<Api>,
    principal: Asker,
    body: axum::body::Bytes,
) -> Response {
    let actor = actor(principal.clone());
    let visible = |m: &[Matcher]| sees_silence(&principal, m);
    let p: PostableSilence = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("not a silence: {e}")),
    };
    let now = Utc::now();
    let matchers: Result<Vec<Matcher>, _> = p.matchers.iter().map(Matcher::try_from).collect();
    let matchers = match matchers {
        Ok(m) if !m.is_empty() => m,
        Ok(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "a silence needs at least one matcher",
            );
        }
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    if !visible(&matchers) {
        return error(
            StatusCode::FORBIDDEN,
            "this token sees only some clusters: a silence needs a matcher cluster=\"<one of them>\" (or \
             cluster=~\"<them>|…\")",
        );
    }
    if matchers.iter().all(|m| m.matches(&Default::default())) {
        return error(
            StatusCode::BAD_REQUEST,
            "these matchers match every alert (even one without labels); name something specific",
        );
    }
    let starts_at = p
        .starts_at
        .unwrap_or(now)
        .max(now - chrono::Duration::minutes(1));
    if p.ends_at <= starts_at {
        return error(StatusCode::BAD_REQUEST, "endsAt must be after startsAt");
    }
    let created_by = if p.created_by.is_empty() {
        actor.clone()
    } else {
        p.created_by
    };
    let mut r = api.router.lock().await;
    let id = match p.id {
        Some(id)
            if r.engine
                .silences()
                .any(|s| s.id == id && visible(&s.matchers)) =>
        {
            id
        }
        Some(id) => return error(StatusCode::NOT_FOUND, format!("no silence {id} to update")),
        None => stable_id(&[&created_by, &now.to_rfc3339(), &p.comment])[..16].to_string(),
    };
    let s = Silence {
        id: id.clone(),
        matchers,
        starts_at,
        ends_at: p.ends_at,
        created_by,
        comment: p.comment,
        updated_at: now,
    };
    if let Err(err) = r.put_silence(s.clone()).await {
        return error(StatusCode::INTERNAL_SERVER_ERROR, err.to_string());
    }
    drop(r);
    api.audit(
        if actor.is_empty() {
            &s.created_by
        } else {
            &actor
        },
        "add",
        &id,
        silence_json(&s, now),
    )
    .await;
    Json(json!({ "silenceID": id })).into_response()
}

async fn expire_silence(
    State(api): State<Api>,
    principal: Asker,
    Path(id): Path<String>,
) -> Response {
    let now = Utc::now();
    let mut r = api.router.lock().await;
    if !r
        .engine
        .silences()
        .any(|s| s.id == id && sees_silence(&principal, &s.matchers))
    {
        return error(StatusCode::NOT_FOUND, format!("no silence {id}"));
    }
    let actor = actor(principal);
    let ended = r.expire_silence(&id, now).await;
    drop(r);
    match ended {
        Ok(Some(s)) => {
            let who = if actor.is_empty() {
                "api".to_string()
            } else {
                actor
            };
            api.audit(&who, "expire", &id, silence_json(&s, now)).await;
            Json(silence_json(&s, now)).into_response()
        }
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no silence {id}")),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Alertmanager's `"0001-01-01T00:00:00.000Z"`: Go's zero time, what an unset time is sent and shown as.
const ZERO_TIME: &str = "0001-01-01T00:00:00.000Z";

fn time_json(t: Option<DateTime<Utc>>) -> serde_json::Value {
    match t {
        Some(t) => json!(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        None => json!(ZERO_TIME),
    }
}

/// Alertmanager's gettableAlert. A firing alert's `endsAt` is when it resolves unless refreshed (posted
/// and event alerts), or Go's zero time when only its incident's resolution ends it; `state` is
/// `active` or `suppressed`, or `resolved` for what only `?resolved=true` shows.
fn alert_json(v: &AlertView<'_>) -> serde_json::Value {
    let a = v.alert;
    let state = if !a.firing() {
        "resolved"
    } else if v.muted.silenced_by.is_empty() && v.muted.inhibited_by.is_empty() {
        "active"
    } else {
        "suppressed"
    };
    let mut receivers: Vec<&str> = v.receivers.iter().map(String::as_str).collect();
    receivers.dedup();
    let mut out = json!({
        "fingerprint": a.id,
        "labels": a.labels,
        "annotations": a.annotations,
        "startsAt": time_json(Some(a.starts_at)),
        "endsAt": time_json(a.ends_at.or(a.expires_at)),
        "updatedAt": time_json(Some(a.updated_at)),
        "receivers": receivers.iter().map(|r| json!({"name": r})).collect::<Vec<_>>(),
        "status": {
            "state": state,
            "silencedBy": v.muted.silenced_by,
            "inhibitedBy": v.muted.inhibited_by,
        },
    });
    if let Some(url) = &a.generator_url {
        out["generatorURL"] = json!(url);
    }
    out
}

/// Why a list query is answered 400 (the answer's `error`).
#[derive(Debug, thiserror::Error)]
enum BadQuery {
    /// A `filter` that is not a matcher.
    #[error("bad matcher: {0}")]
    Matcher(#[source] crate::matcher::Error),
    /// A `receiver` that is not a regex.
    #[error("bad receiver regex: {0}")]
    Receiver(#[source] regex::Error),
    /// A flag (`active`, `silenced`, …) that is neither `true` nor `false`.
    #[error("{name} must be true or false, not {value:?}")]
    Flag {
        /// The flag.
        name: &'static str,
        /// What it was given.
        value: String,
    },
}

/// The `filter` matchers of a query (`filter=alertname="x"`, repeated), in Alertmanager's syntax.
fn filter_of(q: &[(String, String)]) -> Result<Vec<Matcher>, BadQuery> {
    q.iter()
        .filter(|(k, _)| k == "filter")
        .map(|(_, v)| {
            let v = v.trim();
            let v = v
                .strip_prefix('{')
                .and_then(|v| v.strip_suffix('}'))
                .unwrap_or(v);
            Matcher::parse(v).map_err(BadQuery::Matcher)
        })
        .collect()
}

/// Which alerts a query asks for: Alertmanager's `filter`, `receiver`, `active`, `silenced`,
/// `inhibited` (and `unprocessed`, which never applies here: every alert is processed on arrival), plus
/// MultiPilot's `resolved` (default false: as in Alertmanager, resolved alerts are not listed).
struct AlertQuery {
    filter: Vec<Matcher>,
    receiver: Option<regex::Regex>,
    active: bool,
    silenced: bool,
    inhibited: bool,
    resolved: bool,
}

impl AlertQuery {
    fn parse(q: &[(String, String)]) -> Result<AlertQuery, BadQuery> {
        let flag = |name: &'static str, default: bool| -> Result<bool, BadQuery> {
            match q.iter().rev().find(|(k, _)| k == name) {
                None => Ok(default),
                Some((_, v)) => v.parse().map_err(|_| BadQuery::Flag {
                    name,
                    value: v.clone(),
                }),
            }
        };
        let receiver = match q.iter().rev().find(|(k, _)| k == "receiver") {
            Some((_, r)) if !r.is_empty() => {
                Some(regex::Regex::new(&format!("^(?:{r})$")).map_err(BadQuery::Receiver)?)
            }
            _ => None,
        };
        Ok(AlertQuery {
            filter: filter_of(q)?,
            receiver,
            active: flag("active", true)?,
            silenced: flag("silenced", true)?,
            inhibited: flag("inhibited", true)?,
            resolved: flag("resolved", false)?,
        })
    }

    fn wants(&self, v: &AlertView<'_>) -> bool {
        let a = v.alert;
        if !a.firing() && !self.resolved {
            return false;
        }
        let muted = !v.muted.silenced_by.is_empty() || !v.muted.inhibited_by.is_empty();
        (self.active || !a.firing() || muted)
            && (self.silenced || v.muted.silenced_by.is_empty())
            && (self.inhibited || v.muted.inhibited_by.is_empty())
            && self
                .receiver
                .as_ref()
                .is_none_or(|re| v.receivers.iter().any(|r| re.is_match(r)))
            && crate::matcher::all_match(&self.filter, &a.labels)
    }
}

async fn list_alerts(
    State(api): State<Api>,
    asker: Asker,
    Query(q): Query<Vec<(String, String)>>,
) -> Response {
    let q = match AlertQuery::parse(&q) {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let r = api.router.lock().await;
    let e = &r.engine;
    let v: Vec<serde_json::Value> = e
        .alerts(Utc::now())
        .iter()
        .filter(|v| q.wants(v) && sees_alert(&asker, &v.alert.labels))
        .map(alert_json)
        .collect();
    Json(v).into_response()
}

async fn list_groups(
    State(api): State<Api>,
    asker: Asker,
    Query(q): Query<Vec<(String, String)>>,
) -> Response {
    let q = match AlertQuery::parse(&q) {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let r = api.router.lock().await;
    let e = &r.engine;
    let v: Vec<serde_json::Value> = e
        .group_views(Utc::now())
        .into_iter()
        .filter(|(_, receiver, _)| q.receiver.as_ref().is_none_or(|re| re.is_match(receiver)))
        .filter_map(|(labels, receiver, alerts)| {
            let alerts: Vec<serde_json::Value> = alerts
                .iter()
                .filter(|v| q.wants(v) && sees_alert(&asker, &v.alert.labels))
                .map(alert_json)
                .collect();
            (!alerts.is_empty()).then(
                || json!({ "labels": labels, "receiver": { "name": receiver }, "alerts": alerts }),
            )
        })
        .collect();
    Json(v).into_response()
}

/// Alertmanager's postableAlert. `labels` is required; an absent or zero (`0001-01-01…`) time is unset.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PostableAlert {
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    starts_at: Option<DateTime<Utc>>,
    #[serde(default)]
    ends_at: Option<DateTime<Utc>>,
    #[serde(default, rename = "generatorURL")]
    generator_url: Option<String>,
}

fn is_label_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

/// Why a posted alert is refused, in Alertmanager's words (its 400 answer joins them).
#[derive(Debug, thiserror::Error)]
enum Invalid {
    /// `endsAt` before `startsAt`.
    #[error("start time must be before end time")]
    EndsBeforeStart,
    /// A label name that is not one.
    #[error("invalid label set: invalid name {0:?}")]
    LabelName(String),
    /// No labels (or only empty values).
    #[error("at least one label pair required")]
    NoLabels,
    /// An annotation name that is not a label name.
    #[error("invalid annotations: invalid name {0:?}")]
    AnnotationName(String),
}

/// The alert a posted one becomes, or why it is invalid, in Alertmanager's words (its `postAlertsHandler`
/// and `types.Alert.Validate`): empty label values are dropped; without `startsAt` it starts now (or at
/// `endsAt`); without `endsAt` it resolves `resolve_timeout` from now unless posted again; an `endsAt`
/// not after now resolves it.
fn posted_alert(
    p: PostableAlert,
    labels: BTreeMap<String, String>,
    now: DateTime<Utc>,
    resolve_timeout: chrono::Duration,
) -> Result<Alert, Invalid> {
    let set = |t: Option<DateTime<Utc>>| t.filter(|t| t.year() > 1);
    let (starts_at, ends_at) = (set(p.starts_at), set(p.ends_at));
    let starts_at = starts_at.or(ends_at).unwrap_or(now);
    let ends_at = ends_at.unwrap_or(now + resolve_timeout);
    let labels: BTreeMap<String, String> =
        labels.into_iter().filter(|(_, v)| !v.is_empty()).collect();
    let annotations = p.annotations.unwrap_or_default();
    if ends_at < starts_at {
        return Err(Invalid::EndsBeforeStart);
    }
    if let Some(n) = labels.keys().find(|n| !is_label_name(n)) {
        return Err(Invalid::LabelName(n.clone()));
    }
    if labels.is_empty() {
        return Err(Invalid::NoLabels);
    }
    if let Some(n) = annotations.keys().find(|n| !is_label_name(n)) {
        return Err(Invalid::AnnotationName(n.clone()));
    }
    let resolved = ends_at <= now;
    Ok(Alert {
        id: store::fingerprint(&labels),
        labels,
        annotations,
        starts_at,
        ends_at: resolved.then_some(ends_at),
        revision: 0,
        updated_at: now,
        expires_at: (!resolved).then_some(ends_at),
        posted: true,
        generator_url: p.generator_url.filter(|u| !u.is_empty()),
        members: Vec::new(),
        refreshed_at: None,
        explains: Vec::new(),
    })
}

/// Alertmanager's `POST /api/v2/alerts`: the valid alerts are taken in (on disk, and in
/// `MULTIPILOT_ALERTS` unless NATS is away: then it is retried), the invalid ones answered with 400 and
/// their reasons (`; `-separated); a body that isn't a list of alerts with labels, as Alertmanager's
/// OpenAPI layer answers it (400, or 422 for a missing `labels`).
async fn post_alerts(State(api): State<Api>, asker: Asker, body: axum::body::Bytes) -> Response {
    let posted: Vec<PostableAlert> = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"code": 400, "message": format!("parsing alerts body failed, because {e}")})),
            )
                .into_response();
        }
    };
    if let Some(i) = posted.iter().position(|p| p.labels.is_none()) {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"code": 602, "message": format!("{i}.labels in body is required")})),
        )
            .into_response();
    }
    if let Some(p) = scoped(&asker)
        && let Some(i) = posted
            .iter()
            .position(|a| !sees_alert(&asker, a.labels.as_ref().unwrap_or(&BTreeMap::new())))
    {
        return error(
            StatusCode::FORBIDDEN,
            format!(
                "{} sees only some clusters: alert {i} needs a cluster label naming one of them",
                p.subject
            ),
        );
    }
    let now = Utc::now();
    let timeout =
        chrono::Duration::from_std(api.resolve_timeout).unwrap_or(chrono::Duration::minutes(5));
    let mut invalid = Vec::new();
    let mut valid = Vec::new();
    for mut p in posted {
        let labels = p.labels.take().unwrap_or_default();
        match posted_alert(p, labels, now, timeout) {
            Ok(a) => valid.push(a),
            Err(reason) => invalid.push(reason.to_string()),
        }
    }
    let mut r = api.router.lock().await;
    if let Err(err) = r.post(valid, now) {
        return error(StatusCode::INTERNAL_SERVER_ERROR, err.to_string());
    }
    if let Err(err) = r.store.flush().await {
        return error(StatusCode::INTERNAL_SERVER_ERROR, err.to_string());
    }
    let store = r.store.clone();
    drop(r);
    if let Err(err) = store.replicate().await {
        tracing::warn!(error = %err, "posted alerts stored locally; replicating them will be retried");
    }
    if invalid.is_empty() {
        StatusCode::OK.into_response()
    } else {
        (StatusCode::BAD_REQUEST, Json(json!(invalid.join("; ")))).into_response()
    }
}

async fn list_receivers(State(api): State<Api>) -> Response {
    let r = api.router.lock().await;
    let e = &r.engine;
    let v: Vec<serde_json::Value> = e
        .routing()
        .receivers
        .iter()
        .map(|r| json!({ "name": r.name }))
        .collect();
    Json(v).into_response()
}

/// Replaces the receivers' URLs (which often carry a token) with `<secret>`, as Alertmanager shows its
/// secret settings.
fn redact(v: &mut serde_yaml::Value) {
    match v {
        serde_yaml::Value::Mapping(m) => {
            for (k, v) in m.iter_mut() {
                if matches!(k.as_str(), Some("url" | "api_url")) && v.is_string() {
                    *v = serde_yaml::Value::String("<secret>".into());
                } else {
                    redact(v);
                }
            }
        }
        serde_yaml::Value::Sequence(s) => s.iter_mut().for_each(redact),
        _ => {}
    }
}

/// Alertmanager's `GET /api/v2/status` (amtool asks it before every command): the routing in force as
/// `config.original` (receiver URLs redacted), `cluster.status` `disabled` (routers share state through
/// the KV buckets, not Alertmanager's gossip), the start time as `uptime`, and the version.
async fn status(State(api): State<Api>, asker: Asker) -> Response {
    let original = if scoped(&asker).is_some() {
        // the routing names every team's receivers and clusters: not a team's to read
        String::new()
    } else {
        let r = api.router.lock().await;
        let e = &r.engine;
        let mut v = serde_yaml::to_value(e.routing()).unwrap_or_default();
        redact(&mut v);
        serde_yaml::to_string(&v).unwrap_or_default()
    };
    Json(json!({
        // as an Alertmanager without gossip says it: no name
        "cluster": { "status": "disabled", "peers": [] },
        "config": { "original": original },
        "uptime": time_json(Some(api.started_at)),
        "versionInfo": {
            "version": env!("CARGO_PKG_VERSION"),
            "revision": concat!("multipilot-alerts-", env!("CARGO_PKG_VERSION")),
            "branch": "",
            "buildUser": "",
            "buildDate": "",
            "goVersion": "",
        },
    }))
    .into_response()
}

async fn receivers(State(api): State<Api>, asker: Asker) -> Response {
    if let Some(refused) = refuse_scoped(&asker, "the delivery state of every receiver") {
        return refused;
    }
    let r = api.router.lock().await;
    let e = &r.engine;
    let pending = store::all::<Pending>(&r.store.pending);
    let dead = store::all::<Pending>(&r.store.dead);
    let out: Vec<serde_json::Value> = e
        .routing()
        .receivers
        .iter()
        .map(|r| {
            let integrations: Vec<&str> = [
                ("webhook", r.webhook_configs.len()),
                ("alertmanager", r.alertmanager_configs.len()),
                ("slack", r.slack_configs.len()),
                ("nats", r.nats_configs.len()),
            ]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(k, _)| k)
            .collect();
            let sent: u64 = integrations
                .iter()
                .map(|i| api.metrics.count(&r.name, i, "sent"))
                .sum();
            let failed: u64 = integrations
                .iter()
                .map(|i| api.metrics.count(&r.name, i, "failed"))
                .sum();
            json!({
                "name": r.name,
                "integrations": integrations,
                "pending": pending.iter().filter(|(_, p)| p.notification.receiver == r.name).count(),
                "dead": dead.iter().filter(|(_, p)| p.notification.receiver == r.name).count(),
                "sent": sent,
                "failed_attempts": failed,
                "rate_per_second": r.delivery.rate_per_second,
                "concurrency": r.delivery.concurrency,
            })
        })
        .collect();
    Json(out).into_response()
}

async fn dead(State(api): State<Api>, asker: Asker) -> Response {
    if let Some(refused) = refuse_scoped(&asker, "the dead notifications of every receiver") {
        return refused;
    }
    let r = api.router.lock().await;
    let v: Vec<serde_json::Value> = store::all::<Pending>(&r.store.dead)
        .into_iter()
        .map(|(_, p)| {
            json!({
                "id": p.notification.id,
                "receiver": p.notification.receiver,
                "integration": format!("{}-{}", p.integration, p.index),
                "attempts": p.attempts,
                "error": p.last_error,
                "title": p.notification.title,
                "created_at": p.created_at,
            })
        })
        .collect();
    Json(v).into_response()
}
