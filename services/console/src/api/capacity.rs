//! Capacity: PromQL range queries to the TSDB for the capacity charts.

use super::*;

// Capacity (PromQL range queries to the TSDB)

#[derive(Debug, Deserialize)]
pub(super) struct CapacityQuery {
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

/// The time window of a range query ending now: `range` (default 1 h, 1 min to 7 days) and `step`
/// (default: the range in `points` steps; at least 15 s, the scrape interval) → (start, end, step).
pub fn window(
    range: Option<&str>,
    step: Option<&str>,
    points: u32,
) -> Result<(i64, i64, Duration), ApiError> {
    let range = humantime::parse_duration(range.unwrap_or("1h"))
        .map_err(|e| ApiError::bad(format!("range: {e}")))?
        .min(Duration::from_secs(7 * 86_400))
        .max(Duration::from_secs(60));
    let step = match step {
        Some(s) => humantime::parse_duration(s).map_err(|e| ApiError::bad(format!("step: {e}")))?,
        None => range / points,
    }
    .max(Duration::from_secs(15));
    let end = Utc::now().timestamp();
    Ok((end - range.as_secs() as i64, end, step))
}

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

pub(super) async fn capacity(
    State(app): State<App>,
    Query(q): Query<CapacityQuery>,
) -> ApiResult<Value> {
    let (start, end, step) = window(q.range.as_deref(), q.step.as_deref(), 60)?;
    let cluster = q.cluster.as_deref().filter(|c| !c.is_empty());
    let calls = CAPACITY.iter().map(|(name, unit, tpl)| {
        let query = capacity_query(tpl, cluster);
        let app = app.clone();
        async move {
            let got = query_range(&app, &query, start, end, step).await;
            (name, unit, query, got)
        }
    });
    let results = futures::future::join_all(calls).await;
    let (mut series, mut errors) = (Vec::new(), Vec::new());
    for (name, unit, query, got) in results {
        match got {
            Ok(result) => {
                let points = result
                    .into_iter()
                    .next()
                    .map(|s| s.points)
                    .unwrap_or_default();
                series
                    .push(json!({"metric": name, "unit": unit, "query": query, "points": points}));
            }
            Err(e) => errors.push(json!({"metric": name, "query": query, "error": e.to_string()})),
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

/// One series of a range query's answer: its labels and its `[unix seconds, value]` points (non-finite
/// values left out).
#[derive(Debug, Clone, Serialize)]
pub struct RangeSeries {
    /// The series' labels.
    pub labels: BTreeMap<String, String>,
    /// `[t, v]`.
    pub points: Vec<[f64; 2]>,
}

/// Why a range query got no answer.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The TSDB could not be reached, or its answer was not JSON.
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    /// The TSDB refused the query (its own error message).
    #[error("{0}")]
    Refused(String),
}

/// A PromQL range query to the TSDB (`/api/v1/query_range`).
pub async fn query_range(
    app: &App,
    query: &str,
    start: i64,
    end: i64,
    step: Duration,
) -> Result<Vec<RangeSeries>, QueryError> {
    let url = format!("{}/api/v1/query_range", app.tsdb_url.trim_end_matches('/'));
    let body: Value = app
        .http
        .get(&url)
        .query(&[
            ("query", query),
            ("start", &start.to_string()),
            ("end", &end.to_string()),
            ("step", &step.as_secs().to_string()),
        ])
        .timeout(Duration::from_secs(10))
        .send()
        .await?
        .json()
        .await?;
    if body["status"] != "success" {
        return Err(QueryError::Refused(
            body["error"]
                .as_str()
                .unwrap_or("the TSDB failed")
                .to_string(),
        ));
    }
    let result = body["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    Ok(result
        .iter()
        .map(|s| RangeSeries {
            labels: serde_json::from_value(s["metric"].clone()).unwrap_or_default(),
            points: s["values"]
                .as_array()
                .map(|vals| {
                    vals.iter()
                        .filter_map(|p| {
                            let t = p[0].as_f64()?;
                            let v: f64 = p[1].as_str()?.parse().ok()?;
                            v.is_finite().then_some([t, v])
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect())
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
