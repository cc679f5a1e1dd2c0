//! Releases as the release role published them.

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
