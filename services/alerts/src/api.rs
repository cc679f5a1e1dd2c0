//! The router's HTTP API, in Alertmanager's v2 shapes where one exists (so amtool-minded scripts and
//! people feel at home): `GET/POST /api/v2/silences`, `GET/DELETE /api/v2/silence/{id}`,
//! `GET /api/v2/alerts`, plus `GET /api/v1/receivers` (delivery state) and `GET /api/v1/dead`.
//! Changes need a bearer token when tokens are configured, and every change is audited on
//! `fleet.audit.alerts.<action>`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use multipilot_runtime::auth::{self, Principal, Tokens};
use multipilot_schemas::payload::AuditRecord;
use multipilot_schemas::{Envelope, stable_id, subject};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Mutex;

use crate::deliver::Metrics;
use crate::engine::Engine;
use crate::matcher::{ApiMatcher, Matcher};
use crate::store::{self, Pending, Silence};

/// What the handlers share.
#[derive(Clone)]
pub struct Api {
    /// The dispatcher.
    pub engine: Arc<Mutex<Engine>>,
    /// Required tokens: viewers read, operators change silences (`None`: open, on loopback only).
    pub tokens: Option<Arc<Tokens>>,
    /// For audit records.
    pub js: async_nats::jetstream::Context,
    /// This instance.
    pub instance: String,
    /// Delivery metrics.
    pub metrics: Metrics,
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
            outcome: "ok".into(),
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
        .route("/api/v2/alerts", get(list_alerts))
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

async fn list_silences(State(api): State<Api>) -> Response {
    let now = Utc::now();
    let e = api.engine.lock().await;
    let mut v: Vec<&Silence> = e.silences().collect();
    v.sort_by_key(|s| std::cmp::Reverse(s.starts_at));
    Json(
        v.into_iter()
            .map(|s| silence_json(s, now))
            .collect::<Vec<_>>(),
    )
    .into_response()
}

async fn get_silence(State(api): State<Api>, Path(id): Path<String>) -> Response {
    let e = api.engine.lock().await;
    match e.silences().find(|s| s.id == id) {
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
    principal: Option<Extension<Principal>>,
    body: axum::body::Bytes,
) -> Response {
    let actor = actor(principal);
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
    let mut e = api.engine.lock().await;
    let id = match p.id {
        Some(id) if e.silences().any(|s| s.id == id) => id,
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
    if let Err(err) = e.put_silence(s.clone()).await {
        return error(StatusCode::INTERNAL_SERVER_ERROR, err.to_string());
    }
    drop(e);
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
    principal: Option<Extension<Principal>>,
    Path(id): Path<String>,
) -> Response {
    let actor = actor(principal);
    let now = Utc::now();
    let r = api.engine.lock().await.expire_silence(&id, now).await;
    match r {
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

async fn list_alerts(State(api): State<Api>) -> Response {
    let now = Utc::now();
    let e = api.engine.lock().await;
    let v: Vec<serde_json::Value> = e
        .alerts(now)
        .into_iter()
        .map(|a| {
            let suppressed = !a.muted.silenced_by.is_empty() || !a.muted.inhibited_by.is_empty();
            json!({
                "fingerprint": a.alert.id,
                "labels": a.alert.labels,
                "annotations": a.alert.annotations,
                "startsAt": a.alert.starts_at,
                "endsAt": a.alert.ends_at,
                "updatedAt": a.alert.updated_at,
                "receivers": a.receivers.iter().map(|r| json!({"name": r})).collect::<Vec<_>>(),
                "status": {
                    "state": if a.alert.ends_at.is_some() { "resolved" } else if suppressed { "suppressed" } else { "active" },
                    "silencedBy": a.muted.silenced_by,
                    "inhibitedBy": a.muted.inhibited_by,
                },
            })
        })
        .collect();
    Json(v).into_response()
}

async fn receivers(State(api): State<Api>) -> Response {
    let e = api.engine.lock().await;
    let pending = store::all::<Pending>(&e.store.pending);
    let dead = store::all::<Pending>(&e.store.dead);
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

async fn dead(State(api): State<Api>) -> Response {
    let e = api.engine.lock().await;
    let v: Vec<serde_json::Value> = store::all::<Pending>(&e.store.dead)
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
