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
/// ended, its clusters, each cluster's apply step, its analysis rounds (`analysis`: when, ok, round of count,
/// conclusion so far, the measurements per metric and cluster) and the gate that passed, stopped or holds it
/// (`outcome`: pending, running, waiting, passed, failed; a batch that waits says for which approval
/// — `gate`, `analysis-<batch>` — or why it is held — a closed sync window, a release it depends on —
/// in `approval` / `held`); the release-wide moments (plan, approval, override, incident, rollback, done);
/// and, while the release waits or is held, why (`reason`). From the `ReleaseEvent` records kept.
pub fn rollout<'a>(events: impl Iterator<Item = &'a Value> + Clone) -> Value {
    let Some(revision) = events.clone().filter_map(|e| e["revision"].as_u64()).max() else {
        return Value::Null;
    };
    let mut batches: BTreeMap<u64, Value> = BTreeMap::new();
    let mut moments = Vec::new();
    let mut state = Value::Null;
    let mut reason = Value::Null;
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
                   "outcome": "pending", "gate": null, "approval": null, "held": null, "steps": [],
                   "analysis": []})
        });
        match (what, ok) {
            ("batch", Some(true)) => {
                b["started_at"] = at.clone();
                b["clusters"] = e["clusters"].clone();
                b["outcome"] = json!("running");
                // what held it or waited for approval is behind it now
                for k in ["gate", "approval", "held"] {
                    b[k] = Value::Null;
                }
            }
            ("waiting", _) => {
                let d = &e["detail"];
                let gate = waiting_gate(e);
                b["outcome"] = json!("waiting");
                b["gate"] = json!(gate);
                b["approval"] = d["approval"].clone();
                b["held"] = d["held"].clone();
                reason = json!(gate);
                moments.push(json!({"what": what, "at": at, "ok": ok, "batch": index,
                                    "summary": e["summary"]}));
            }
            ("analysis", _) => {
                let d = &e["detail"];
                let measurements = d["measurements"].as_array().cloned().unwrap_or_default();
                let round = json!({"at": at, "ok": ok, "round": d["round"], "count": d["count"],
                                   "conclusion": d["conclusion"], "measurements": measurements,
                                   "summary": e["summary"]});
                if let Some(rounds) = b["analysis"].as_array_mut() {
                    rounds.push(round);
                }
            }
            ("batch", _) => {
                b["ended_at"] = at.clone();
                b["outcome"] = json!("failed");
                b["gate"] = e["summary"].clone();
                // a batch held for an approval and then stopped waits for nothing
                b["approval"] = Value::Null;
                b["held"] = Value::Null;
            }
            ("health", _) => {
                b["ended_at"] = at.clone();
                b["outcome"] = json!(if ok == Some(false) {
                    "failed"
                } else {
                    "passed"
                });
                b["gate"] = e["summary"].clone();
                b["approval"] = Value::Null;
                b["held"] = Value::Null;
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
    // the reason holds only while the release waits
    if !matches!(state.as_str(), Some("held" | "waiting-approval")) {
        reason = Value::Null;
    }
    json!({"revision": revision, "state": state, "reason": reason,
           "batches": batches.into_values().collect::<Vec<_>>(), "moments": moments})
}

/// What a `waiting` entry waits for, in a few words: `held: <reason>` for a closed sync window or a
/// dependency, the approval to give (with the analysis' reason when an inconclusive analysis holds the
/// batch), else the entry's summary.
fn waiting_gate(e: &Value) -> String {
    let d = &e["detail"];
    if let Some(held) = d["held"].as_str() {
        return format!("held: {held}");
    }
    match (d["approval"].as_str(), d["reason"].as_str()) {
        (Some(approval), Some(why)) if d["analysis"].is_string() => format!(
            "analysis {}: {why}; waits for approval {approval}",
            d["analysis"].as_str().unwrap_or_default()
        ),
        (Some(approval), _) => format!("waits for approval {approval}"),
        _ => e["summary"].as_str().unwrap_or("waiting").to_string(),
    }
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

    /// A `ReleaseEvent` as the release role records it (`services/release/src/machine.rs`).
    #[allow(clippy::too_many_arguments)]
    fn entry(
        what: &str,
        state: &str,
        batch: Option<u32>,
        clusters: &[&str],
        ok: bool,
        summary: &str,
        detail: Value,
        at: &str,
    ) -> Value {
        json!({"release": "web", "revision": 4, "what": what, "state": state, "actor": "system",
               "batch": batch, "clusters": clusters, "ok": ok, "summary": summary, "detail": detail,
               "commit": "3f2a9c1", "at": at})
    }

    fn measurement(metric: &str, cluster: &str, value: f64, baseline: f64, verdict: &str) -> Value {
        let reason = match verdict {
            "failed" => "failure condition holds: result > 0.05".to_string(),
            "inconclusive" => "the query answered no sample".to_string(),
            _ => "within the conditions".to_string(),
        };
        json!({"metric": metric, "cluster": cluster, "value": value, "baseline": baseline,
               "verdict": verdict, "reason": reason})
    }

    #[test]
    fn analysis_rounds_belong_to_their_batch_and_a_failed_analysis_fails_it() {
        let evs = [
            entry(
                "plan",
                "planned",
                None,
                &["old-124", "old-125", "old-126"],
                true,
                "planned: 3 clusters in 2 batches",
                json!({}),
                "2026-12-03T09:00:00Z",
            ),
            entry(
                "batch",
                "applying",
                Some(1),
                &["old-124"],
                true,
                "batch 1 starts: old-124",
                json!({}),
                "2026-12-03T09:00:01Z",
            ),
            entry(
                "step",
                "applying",
                Some(1),
                &["old-124"],
                true,
                "old-124: 3 configured",
                json!({}),
                "2026-12-03T09:00:02Z",
            ),
            entry(
                "analysis",
                "applying",
                Some(1),
                &["old-124"],
                true,
                "batch 1 analysis 1/3: errors 0.0011 on old-124",
                json!({"round": 1, "count": 3, "conclusion": "running",
                         "measurements": [measurement("errors", "old-124", 0.0011, 0.001, "successful")]}),
                "2026-12-03T09:00:32Z",
            ),
            entry(
                "analysis",
                "applying",
                Some(1),
                &["old-124"],
                false,
                "batch 1 analysis 2/3: errors 0.3012 on old-124 (failed)",
                json!({"round": 2, "count": 3, "conclusion": "failed",
                         "measurements": [measurement("errors", "old-124", 0.3012, 0.001, "failed")]}),
                "2026-12-03T09:01:02Z",
            ),
            entry(
                "batch",
                "rolling-back",
                Some(1),
                &["old-124"],
                false,
                "batch 1 failed: analysis failed: errors on old-124: 1 failed measurements (limit 0): failure condition holds: result > 0.05",
                json!({"error": "analysis failed: errors on old-124: 1 failed measurements (limit 0): failure condition holds: result > 0.05"}),
                "2026-12-03T09:01:02Z",
            ),
            entry(
                "failed",
                "rolling-back",
                None,
                &["old-124"],
                false,
                "release failed: batch 1: analysis failed: …",
                json!({}),
                "2026-12-03T09:01:02Z",
            ),
            entry(
                "rolled-back",
                "rolled-back",
                None,
                &["old-124"],
                true,
                "rolled back",
                json!({}),
                "2026-12-03T09:01:05Z",
            ),
        ];
        let r = rollout(evs.iter());
        let b = &r["batches"][0];
        assert_eq!(r["batches"].as_array().unwrap().len(), 1);
        assert_eq!(b["outcome"], "failed");
        assert!(
            b["gate"]
                .as_str()
                .unwrap()
                .contains("analysis failed: errors on old-124")
        );
        let rounds = b["analysis"].as_array().unwrap();
        assert_eq!(rounds.len(), 2);
        assert_eq!(rounds[0]["round"], 1);
        assert_eq!(rounds[0]["ok"], true);
        assert_eq!(rounds[0]["conclusion"], "running");
        assert_eq!(rounds[1]["at"], "2026-12-03T09:01:02Z");
        assert_eq!(rounds[1]["ok"], false);
        assert_eq!(rounds[1]["count"], 3);
        assert_eq!(rounds[1]["conclusion"], "failed");
        let m = &rounds[1]["measurements"][0];
        assert_eq!(
            (m["metric"].as_str(), m["cluster"].as_str()),
            (Some("errors"), Some("old-124"))
        );
        assert_eq!(
            (m["value"].as_f64(), m["baseline"].as_f64()),
            (Some(0.3012), Some(0.001))
        );
        assert_eq!(m["verdict"], "failed");
        // the rounds are the batch's, not loose moments
        let whats: Vec<&str> = r["moments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["what"].as_str().unwrap())
            .collect();
        assert_eq!(whats, ["plan", "failed", "rolled-back"]);
        assert_eq!(r["state"], "rolled-back");
        assert_eq!(r["reason"], Value::Null);
    }

    #[test]
    fn an_inconclusive_analysis_holds_its_batch_for_the_analysis_approval() {
        let why = "errors on old-125: 2 inconclusive measurements (limit 1): the query answered no sample";
        let evs = [
            entry(
                "batch",
                "applying",
                Some(2),
                &["old-125", "old-126"],
                true,
                "batch 2 starts: old-125, old-126",
                json!({}),
                "2026-12-03T09:05:00Z",
            ),
            entry(
                "analysis",
                "applying",
                Some(2),
                &["old-125", "old-126"],
                false,
                "batch 2 analysis 2/3: errors ? on old-125 (inconclusive), errors 0.0009 on old-126",
                json!({"round": 2, "count": 3, "conclusion": "inconclusive", "measurements": [
                      {"metric": "errors", "cluster": "old-125", "baseline": 0.001,
                       "verdict": "inconclusive", "reason": "the query answered no sample"},
                      measurement("errors", "old-126", 0.0009, 0.001, "successful")]}),
                "2026-12-03T09:06:00Z",
            ),
            entry(
                "waiting",
                "waiting-approval",
                Some(2),
                &["old-125", "old-126"],
                false,
                &format!(
                    "batch 2 holds: analysis inconclusive: {why} — approve to go on (multipilot release approve web analysis-2) or roll back"
                ),
                json!({"approval": "analysis-2", "analysis": "inconclusive", "reason": why}),
                "2026-12-03T09:06:00Z",
            ),
        ];
        let r = rollout(evs.iter());
        let b = &r["batches"][0];
        assert_eq!(b["outcome"], "waiting");
        assert_eq!(b["approval"], "analysis-2");
        assert_eq!(b["held"], Value::Null);
        assert_eq!(
            b["gate"],
            format!("analysis inconclusive: {why}; waits for approval analysis-2")
        );
        assert_eq!(b["started_at"], "2026-12-03T09:05:00Z");
        assert_eq!(b["ended_at"], Value::Null);
        let m = &b["analysis"][0]["measurements"];
        assert_eq!(m[0]["value"], Value::Null);
        assert_eq!(m[0]["verdict"], "inconclusive");
        assert_eq!(m[1]["verdict"], "successful");
        assert_eq!(r["state"], "waiting-approval");
        assert_eq!(r["reason"], b["gate"]);

        // approved: the batch is done, its gate passed, nothing waits
        let mut more = evs.to_vec();
        more.push(entry(
            "approve",
            "applying",
            None,
            &[],
            true,
            "approved analysis-2 by ana",
            json!({"approvals": ["analysis-2"]}),
            "2026-12-03T09:10:00Z",
        ));
        more.push(entry(
            "health",
            "applying",
            Some(2),
            &["old-125", "old-126"],
            true,
            "batch 2 healthy",
            json!({}),
            "2026-12-03T09:10:00Z",
        ));
        let r = rollout(more.iter());
        let b = &r["batches"][0];
        assert_eq!(
            (b["outcome"].as_str(), b["approval"].as_str()),
            (Some("passed"), None)
        );
        assert_eq!(r["reason"], Value::Null);
    }

    #[test]
    fn a_batch_held_by_a_window_or_a_dependency_says_why_until_it_starts() {
        let window = "old-124: held by deny window 0 (\"0 22 * * FRI\" Europe/Berlin, 56h: weekend freeze) until 2026-12-07 05:00 UTC; a manual sync may pass (manual_sync)";
        let evs = [
            entry(
                "plan",
                "planned",
                None,
                &["old-124"],
                true,
                "planned",
                json!({}),
                "2026-12-04T21:00:00Z",
            ),
            entry(
                "waiting",
                "held",
                Some(1),
                &["old-124"],
                true,
                &format!("batch 1 held: {window}"),
                json!({"held": window}),
                "2026-12-04T21:00:01Z",
            ),
        ];
        let r = rollout(evs.iter());
        let b = &r["batches"][0];
        assert_eq!(b["outcome"], "waiting");
        assert_eq!(b["held"], window);
        assert_eq!(b["gate"], format!("held: {window}"));
        assert_eq!(r["state"], "held");
        assert_eq!(r["reason"], b["gate"]);

        // another reason later: a dependency; then an operator's override and the batch starts
        let dep = "depends on: release db is not healthy on old-124 (applying, revision 7)";
        let mut more = evs.to_vec();
        more.push(entry(
            "waiting",
            "held",
            Some(1),
            &["old-124"],
            true,
            &format!("batch 1 held: {dep}"),
            json!({"held": dep}),
            "2026-12-04T21:03:00Z",
        ));
        let r = rollout(more.iter());
        assert_eq!(r["batches"][0]["held"], dep);
        assert_eq!(r["reason"], format!("held: {dep}"));
        more.push(entry(
            "override",
            "applying",
            Some(1),
            &["old-124"],
            true,
            &format!("batch 1 passes closed sync windows by the operator's override: {window}"),
            json!({"windows": [window]}),
            "2026-12-04T21:04:00Z",
        ));
        more.push(entry(
            "batch",
            "applying",
            Some(1),
            &["old-124"],
            true,
            "batch 1 starts: old-124",
            json!({}),
            "2026-12-04T21:04:00Z",
        ));
        let r = rollout(more.iter());
        let b = &r["batches"][0];
        assert_eq!(b["outcome"], "running");
        assert_eq!((b["gate"].as_str(), b["held"].as_str()), (None, None));
        assert_eq!(r["reason"], Value::Null);
        let whats: Vec<&str> = r["moments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["what"].as_str().unwrap())
            .collect();
        assert_eq!(whats, ["plan", "waiting", "waiting", "override"]);

        // the gate approval, as before
        let gate = entry(
            "waiting",
            "waiting-approval",
            Some(1),
            &["old-124"],
            true,
            "batch 1 (old-124) waits for approval: multipilot release approve web gate",
            json!({"approval": "gate", "selector": "env=prod"}),
            "2026-12-04T21:00:01Z",
        );
        let r = rollout([gate].iter());
        assert_eq!(r["batches"][0]["gate"], "waits for approval gate");
        assert_eq!(r["reason"], "waits for approval gate");
    }
}
