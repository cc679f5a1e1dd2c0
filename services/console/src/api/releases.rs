//! Releases as the release role published them, and the sync status it reports for fleet repositories.

use super::*;

// Releases

pub(super) async fn releases(State(app): State<App>) -> ApiResult<Value> {
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

/// The release role's `gitops` answer (followed repositories, every release's sync status per cluster),
/// passed on as it is: asked over `fleet.releasectl.gitops`, a read-only verb.
pub(super) async fn gitops(State(app): State<App>) -> ApiResult<Value> {
    let req = async_nats::Request::new()
        .payload("{}".into())
        .timeout(Some(Duration::from_secs(10)));
    let msg = app
        .nats
        .send_request("fleet.releasectl.gitops", req)
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the release role did not answer: {e}"),
            )
        })?;
    let reply: Value = serde_json::from_slice(&msg.payload).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("the release role's answer: {e}"),
        )
    })?;
    if reply["ok"] != Value::Bool(true) {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            reply["error"]
                .as_str()
                .unwrap_or("the release role failed")
                .to_string(),
        ));
    }
    Ok(axum::Json(reply["gitops"].clone()))
}
