//! Vital signs per cluster for the fleet page's small charts: PromQL range queries to the TSDB, one per
//! sign for the whole fleet (`by (cluster)`), answered per cluster.

use super::*;

#[derive(Debug, Deserialize)]
pub(super) struct VitalsQuery {
    range: Option<String>,
    step: Option<String>,
}

/// One vital sign: its name in the answer, a title, its unit and its PromQL (one series per cluster).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Vital {
    /// Key in each cluster's `series`.
    pub name: &'static str,
    /// For a person.
    pub title: &'static str,
    /// `seconds`, `ratio` (0–1) or `count`.
    pub unit: &'static str,
    /// PromQL, one series per `cluster`.
    pub query: &'static str,
}

/// The vital signs, from what the agent collects of every cluster (the apiserver's own metrics,
/// kube-state-metrics and node-exporter, as a real cluster exposes them).
pub const VITALS: &[Vital] = &[
    Vital {
        name: "api_latency_p99",
        title: "API server p99 latency",
        unit: "seconds",
        query: "histogram_quantile(0.99, sum by (cluster, le) (rate(apiserver_request_duration_seconds_bucket{verb!~\"WATCH|CONNECT\"}[5m])))",
    },
    Vital {
        name: "api_error_ratio",
        title: "API server 5xx ratio",
        unit: "ratio",
        // a cluster without any 5xx series answers 0, not "no data"
        query: "(sum by (cluster) (rate(apiserver_request_total{code=~\"5..\"}[5m])) or sum by (cluster) (rate(apiserver_request_total[5m])) * 0) / sum by (cluster) (rate(apiserver_request_total[5m]))",
    },
    Vital {
        name: "nodes_ready",
        title: "Nodes ready",
        unit: "ratio",
        query: "sum by (cluster) (kube_node_status_condition{condition=\"Ready\",status=\"true\"}) / count by (cluster) (kube_node_status_condition{condition=\"Ready\",status=\"true\"})",
    },
    Vital {
        name: "restarts",
        title: "Container restarts (5 min)",
        unit: "count",
        query: "sum by (cluster) (increase(kube_pod_container_status_restarts_total[5m]))",
    },
    Vital {
        name: "cpu_used",
        title: "CPU used / allocatable",
        unit: "ratio",
        query: "sum by (cluster) (rate(node_cpu_seconds_total{mode!=\"idle\"}[5m])) / sum by (cluster) (kube_node_status_allocatable{resource=\"cpu\"})",
    },
    Vital {
        name: "memory_used",
        title: "Memory used / allocatable",
        unit: "ratio",
        query: "(sum by (cluster) (node_memory_MemTotal_bytes) - sum by (cluster) (node_memory_MemAvailable_bytes)) / sum by (cluster) (kube_node_status_allocatable{resource=\"memory\"})",
    },
];

/// `GET /api/v1/vitals?range=1h`: every vital sign of every cluster the caller sees, as `[t, v]` points;
/// a sign the TSDB could not answer is listed under `errors` (the others still come).
pub(super) async fn vitals(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
    Query(q): Query<VitalsQuery>,
) -> ApiResult<Value> {
    let (start, end, step) = window(q.range.as_deref(), q.step.as_deref(), 60)?;
    let names: Vec<String> = {
        let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
        st.clusters.keys().filter(|n| p.sees(n)).cloned().collect()
    };
    let answers = futures::future::join_all(VITALS.iter().map(|v| {
        let app = &app;
        async move { (v, query_range(app, v.query, start, end, step).await) }
    }))
    .await;
    let mut per: BTreeMap<&str, serde_json::Map<String, Value>> = names
        .iter()
        .map(|n| (n.as_str(), Default::default()))
        .collect();
    let mut errors = Vec::new();
    for (v, got) in answers {
        match got {
            Ok(series) => {
                for s in series {
                    if let Some(c) = s.labels.get("cluster")
                        && let Some(m) = per.get_mut(c.as_str())
                    {
                        m.insert(v.name.into(), json!(s.points));
                    }
                }
            }
            Err(e) => errors.push(json!({"vital": v.name, "error": e.to_string()})),
        }
    }
    if errors.len() == VITALS.len() {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "the TSDB at {} did not answer: {}",
                app.tsdb_url, errors[0]["error"]
            ),
        ));
    }
    let clusters: Vec<Value> = per
        .into_iter()
        .map(|(c, series)| json!({"cluster": c, "series": series}))
        .collect();
    Ok(axum::Json(json!({
        "start": start, "end": end, "step": step.as_secs(),
        "vitals": VITALS, "clusters": clusters, "errors": errors,
    })))
}
