//! `GET /api/v1/rules`, `GET /api/v1/alerts` in Prometheus' shapes and `POST /-/reload`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use chrono::SecondsFormat;
use serde_json::json;

use super::eval::{Alert, AlertState, Kind, ms_to_time};
use super::manager::Manager;
use super::template::format_e;

fn rfc3339(ms: Option<i64>) -> String {
    ms.map(|m| ms_to_time(m).to_rfc3339_opts(SecondsFormat::Nanos, true))
        .unwrap_or_else(|| "0001-01-01T00:00:00Z".into())
}

fn alert_json(a: &Alert) -> serde_json::Value {
    json!({
        "labels": a.labels,
        "annotations": a.annotations,
        "state": a.state,
        "activeAt": rfc3339(Some(a.active_at)),
        "value": format_e(a.value),
    })
}

fn rules_json(m: &Manager) -> serde_json::Value {
    let groups = m.lock();
    let groups: Vec<_> = groups
        .iter()
        .map(|g| {
            let rules: Vec<_> = g
                .rules
                .iter()
                .map(|r| {
                    let health = match (&r.last_error, r.last_evaluation) {
                        (Some(_), _) => "err",
                        (None, Some(_)) => "ok",
                        (None, None) => "unknown",
                    };
                    let mut j = json!({
                        "name": r.name(),
                        "query": r.expr,
                        "labels": r.labels,
                        "health": health,
                        "lastError": r.last_error.clone().unwrap_or_default(),
                        "evaluationTime": r.evaluation_time.as_secs_f64(),
                        "lastEvaluation": rfc3339(r.last_evaluation),
                    });
                    match &r.kind {
                        Kind::Recording { .. } => j["type"] = json!("recording"),
                        Kind::Alerting {
                            hold,
                            keep_firing_for,
                            annotations,
                            active,
                            ..
                        } => {
                            let live: Vec<&Alert> = active
                                .values()
                                .filter(|a| a.state != AlertState::Inactive)
                                .collect();
                            let state = if live.iter().any(|a| a.state == AlertState::Firing) {
                                "firing"
                            } else if live.is_empty() {
                                "inactive"
                            } else {
                                "pending"
                            };
                            j["type"] = json!("alerting");
                            j["state"] = json!(state);
                            j["duration"] = json!(hold.as_secs_f64());
                            j["keepFiringFor"] = json!(keep_firing_for.as_secs_f64());
                            j["annotations"] = json!(annotations);
                            j["alerts"] = live.into_iter().map(alert_json).collect();
                        }
                    }
                    j
                })
                .collect();
            json!({
                "name": g.name,
                "file": g.file.display().to_string(),
                "interval": g.interval.as_secs_f64(),
                "limit": 0,
                "rules": rules,
                "evaluationTime": g.evaluation_time.as_secs_f64(),
                "lastEvaluation": rfc3339(g.last_evaluation),
            })
        })
        .collect();
    json!({ "status": "success", "data": { "groups": groups } })
}

fn alerts_json(m: &Manager) -> serde_json::Value {
    let groups = m.lock();
    let alerts: Vec<_> = groups
        .iter()
        .flat_map(|g| g.rules.iter())
        .filter_map(|r| match &r.kind {
            Kind::Alerting { active, .. } => Some(active.values()),
            Kind::Recording { .. } => None,
        })
        .flatten()
        .filter(|a| a.state != AlertState::Inactive)
        .map(alert_json)
        .collect();
    json!({ "status": "success", "data": { "alerts": alerts } })
}

/// `GET /api/v1/rules`, `GET /api/v1/alerts` (Prometheus' shapes) and `POST /-/reload` (a bad file answers
/// 500 with the reason; the loaded rules keep running).
pub fn router(manager: Arc<Manager>) -> axum::Router {
    axum::Router::new()
        .route(
            "/api/v1/rules",
            get(|State(m): State<Arc<Manager>>| async move {
                axum::Json(rules_json(&m)).into_response()
            }),
        )
        .route(
            "/api/v1/alerts",
            get(|State(m): State<Arc<Manager>>| async move {
                axum::Json(alerts_json(&m)).into_response()
            }),
        )
        .route(
            "/-/reload",
            post(|State(m): State<Arc<Manager>>| async move {
                let r = tokio::task::spawn_blocking(move || m.reload()).await;
                match r {
                    Ok(Ok(())) => (StatusCode::OK, "rules reloaded\n".to_string()).into_response(),
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "rule reload failed; the loaded rules keep running");
                        (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
                    }
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
                }
            }),
        )
        .with_state(manager)
}
