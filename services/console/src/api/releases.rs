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
            json!({"release": name, "last_change": last, "clusters": clusters, "records": newest,
                   "rollout": rollout(recs.iter().map(|r| &r.payload))})
        })
        .collect();
    list.sort_by(|a, b| b["last_change"].as_str().cmp(&a["last_change"].as_str()));
    Ok(axum::Json(json!({"releases": list})))
}

/// A release's newest revision as a picture's data: its batches in order, each with when it started and
/// ended, its clusters, each cluster's apply step and the gate that passed, stopped or holds it
/// (`outcome`: pending, running, waiting, passed, failed); and the
/// release-wide moments (plan, approval, incident, rollback, done). From the `ReleaseEvent` records kept.
pub fn rollout<'a>(events: impl Iterator<Item = &'a Value> + Clone) -> Value {
    let Some(revision) = events.clone().filter_map(|e| e["revision"].as_u64()).max() else {
        return Value::Null;
    };
    let mut batches: BTreeMap<u64, Value> = BTreeMap::new();
    let mut moments = Vec::new();
    let mut state = Value::Null;
    for e in events.filter(|e| e["revision"].as_u64() == Some(revision)) {
        state = e["state"].clone();
        let (what, at, ok) = (
            e["what"].as_str().unwrap_or(""),
            &e["at"],
            e["ok"].as_bool(),
        );
        let Some(index) = e["batch"].as_u64() else {
            moments.push(json!({"what": what, "at": at, "ok": ok, "summary": e["summary"]}));
            continue;
        };
        let b = batches.entry(index).or_insert_with(|| {
            json!({"batch": index, "clusters": e["clusters"], "started_at": null, "ended_at": null,
                   "outcome": "pending", "gate": null, "steps": []})
        });
        match (what, ok) {
            ("batch", Some(true)) => {
                b["started_at"] = at.clone();
                b["clusters"] = e["clusters"].clone();
                b["outcome"] = json!("running");
            }
            ("waiting", _) => {
                b["outcome"] = json!("waiting");
                b["gate"] = e["summary"].clone();
                moments.push(json!({"what": what, "at": at, "ok": ok, "batch": index,
                                    "summary": e["summary"]}));
            }
            ("batch", _) => {
                b["ended_at"] = at.clone();
                b["outcome"] = json!("failed");
                b["gate"] = e["summary"].clone();
            }
            ("health", _) => {
                b["ended_at"] = at.clone();
                b["outcome"] = json!(if ok == Some(false) {
                    "failed"
                } else {
                    "passed"
                });
                b["gate"] = e["summary"].clone();
            }
            ("step", _) => {
                if let Some(steps) = b["steps"].as_array_mut() {
                    steps.push(json!({"clusters": e["clusters"], "at": at, "ok": ok,
                                      "summary": e["summary"]}));
                }
            }
            _ => moments.push(json!({"what": what, "at": at, "ok": ok, "batch": index,
                                     "summary": e["summary"]})),
        }
    }
    json!({"revision": revision, "state": state, "batches": batches.into_values().collect::<Vec<_>>(),
           "moments": moments})
}

/// The release role's `gitops` answer (followed repositories, every release's sync status per cluster),
/// passed on as it is: asked over `fleet.releasectl.gitops`, a read-only verb.
pub(super) async fn gitops(State(app): State<App>) -> ApiResult<Value> {
    let req = async_nats::Request::new()
        .payload("{}".into())
        .timeout(Some(Duration::from_secs(10)));
    let msg = app
        .nats
        .send_request(multipilot_schemas::control::release_ctl("gitops"), req)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(
        rev: u64,
        what: &str,
        batch: Option<u32>,
        ok: bool,
        at: &str,
        clusters: &[&str],
    ) -> Value {
        json!({"release": "web", "revision": rev, "what": what, "state": "applying", "actor": "system",
               "batch": batch, "clusters": clusters, "ok": ok, "summary": format!("{what} {batch:?}"),
               "at": at})
    }

    #[test]
    fn a_rollout_is_its_newest_revisions_batches_with_steps_and_gates() {
        let evs = [
            ev(1, "plan", None, true, "2026-12-01T10:00:00Z", &[]),
            ev(1, "batch", Some(1), true, "2026-12-01T10:00:01Z", &["a"]),
            ev(2, "plan", None, true, "2026-12-02T10:00:00Z", &[]),
            ev(2, "batch", Some(1), true, "2026-12-02T10:00:05Z", &["a"]),
            ev(2, "step", Some(1), true, "2026-12-02T10:00:06Z", &["a"]),
            ev(2, "health", Some(1), true, "2026-12-02T10:01:00Z", &["a"]),
            ev(
                2,
                "batch",
                Some(2),
                true,
                "2026-12-02T10:01:01Z",
                &["b", "c"],
            ),
            ev(2, "step", Some(2), false, "2026-12-02T10:01:02Z", &["b"]),
            ev(
                2,
                "batch",
                Some(2),
                false,
                "2026-12-02T10:01:30Z",
                &["b", "c"],
            ),
            ev(
                2,
                "rollback",
                None,
                true,
                "2026-12-02T10:01:31Z",
                &["a", "b"],
            ),
            ev(2, "waiting", Some(3), true, "2026-12-02T10:01:32Z", &["d"]),
        ];
        let r = rollout(evs.iter());
        assert_eq!(r["revision"], 2);
        let b = r["batches"].as_array().unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(b[2]["outcome"], "waiting");
        assert_eq!(b[2]["started_at"], Value::Null);
        assert_eq!(b[0]["outcome"], "passed");
        assert_eq!(b[0]["started_at"], "2026-12-02T10:00:05Z");
        assert_eq!(b[0]["ended_at"], "2026-12-02T10:01:00Z");
        assert_eq!(b[0]["steps"].as_array().unwrap().len(), 1);
        assert_eq!(b[1]["outcome"], "failed");
        assert_eq!(b[1]["clusters"], json!(["b", "c"]));
        assert_eq!(b[1]["steps"][0]["ok"], false);
        let whats: Vec<&str> = r["moments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["what"].as_str().unwrap())
            .collect();
        assert_eq!(whats, ["plan", "rollback", "waiting"]);
        assert_eq!(rollout([].iter()), Value::Null);
    }
}
