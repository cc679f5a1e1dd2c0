//! The analysis' I/O: its queries against the TSDB role's Prometheus API (`/api/v1/query`), each answer
//! reduced to one number or the reason there is none (see [`crate::analysis`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::Error;
use crate::analysis::{self, Answer, Compiled, NoNumber, Target};
use crate::machine::Answered;

/// The client for TSDB queries, sending `token` as a bearer token.
pub fn client(token: Option<&multipilot_bus::connect::Secret>) -> Result<reqwest::Client, Error> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(t) = token {
        let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", t.0))
            .map_err(|_| Error::Config("release.tsdb_token is not a valid header value".into()))?;
        v.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .timeout(std::time::Duration::from_secs(20))
        .build()
        .map_err(|e| Error::Config(format!("release: the TSDB client: {e}")))
}

/// One instant query: its one number, or why there is none (an error, no sample, several samples).
pub async fn query(http: &reqwest::Client, tsdb_url: &str, promql: &str) -> Answer {
    let url = format!("{}/api/v1/query", tsdb_url.trim_end_matches('/'));
    let resp = http
        .post(&url)
        .form(&[("query", promql)])
        .send()
        .await
        .map_err(|e| NoNumber::unanswered(format!("the TSDB at {tsdb_url} did not answer: {e}")))?;
    let status = resp.status();
    let body: Value = resp.json().await.map_err(|e| {
        let why = format!("the TSDB answered {status} without JSON: {e}");
        // a proxy's 502/503, a body cut short may pass; a wrong URL or token (a page that is not JSON) does not
        if passing(status) || !e.is_decode() {
            NoNumber::unanswered(why)
        } else {
            NoNumber::new(why)
        }
    })?;
    answer(status, &body)
}

/// Whether an HTTP status says the server could not answer now (5xx, 429).
fn passing(status: reqwest::StatusCode) -> bool {
    status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS
}

/// The number in a Prometheus API answer, sent with `status`.
pub fn answer(status: reqwest::StatusCode, body: &Value) -> Answer {
    if body["status"] != "success" {
        let kind = body["errorType"].as_str().unwrap_or("error");
        let reason = format!(
            "the query failed ({kind}): {}",
            body["error"].as_str().unwrap_or("no reason given")
        );
        // bad PromQL or an execution error (many-to-many matching, duplicate series) fails the same way next
        // time; a timeout, an unavailable or internal error (the store's I/O), or a 5xx/429 of a proxy may pass
        let same_again = matches!(kind, "bad_data" | "execution");
        let may_pass =
            matches!(kind, "timeout" | "unavailable" | "canceled" | "internal") || passing(status);
        return Err(if may_pass && !same_again {
            NoNumber::unanswered(reason)
        } else {
            NoNumber::new(reason)
        });
    }
    let data = &body["data"];
    let number = |v: &Value| -> Answer {
        v.get(1)
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<f64>().ok())
            .ok_or_else(|| NoNumber::new(format!("the query answered an unreadable sample: {v}")))
    };
    match data["resultType"].as_str() {
        Some("scalar") => number(&data["result"]),
        Some("vector") => match data["result"].as_array().map(Vec::as_slice) {
            Some([one]) => number(&one["value"]),
            Some([]) | None => Err(NoNumber::no_sample()),
            Some(many) => Err(NoNumber::new(format!(
                "the query answered {} samples, not one (aggregate it, e.g. with sum)",
                many.len()
            ))),
        },
        other => Err(NoNumber::new(format!(
            "the query answered a {}, not a number",
            other.unwrap_or("nothing")
        ))),
    }
}

/// Every metric on every target (those it is not `done` with), over the round's `rate_interval`, and the
/// baseline's median per metric.
pub async fn measure(
    http: &reqwest::Client,
    tsdb_url: &str,
    a: &Compiled,
    targets: &[Target],
    baseline: &[Target],
    rate_interval: Duration,
) -> Vec<Answered> {
    let ask = |t: &Target| {
        let queries = a.queries(t, rate_interval);
        let t = t.clone();
        async move {
            let mut out = Vec::new();
            for (metric, q) in queries.into_iter().filter(|(m, _)| !t.done.contains(m)) {
                let answer = a.explain(&metric, &t, query(http, tsdb_url, &q).await);
                out.push((metric, t.cluster.clone(), answer));
            }
            out
        }
    };
    let measured = futures::future::join_all(targets.iter().map(ask)).await;
    let base = futures::future::join_all(baseline.iter().map(ask)).await;
    a.metrics()
        .map(|metric| {
            let clusters: BTreeMap<String, Answer> = measured
                .iter()
                .flatten()
                .filter(|(m, _, _)| m == metric)
                .map(|(_, c, ans)| (c.clone(), ans.clone()))
                .collect();
            let values: Vec<f64> = base
                .iter()
                .flatten()
                .filter(|(m, _, _)| m == metric)
                .filter_map(|(_, _, ans)| ans.as_ref().ok().copied())
                .collect();
            Answered {
                metric: metric.to_string(),
                clusters,
                baseline: analysis::median(&values),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::StatusCode;
    use serde_json::json;

    #[test]
    fn answers_are_one_number_or_a_reason() {
        let vector =
            |r: Value| json!({"status": "success", "data": {"resultType": "vector", "result": r}});
        assert_eq!(
            answer(
                StatusCode::OK,
                &vector(json!([{"metric": {}, "value": [1.0, "0.25"]}]))
            ),
            Ok(0.25)
        );
        assert_eq!(
            answer(StatusCode::OK, &vector(json!([]))),
            Err(NoNumber::no_sample()),
            "no data yet: asked again"
        );
        let two = answer(
            StatusCode::OK,
            &vector(json!([{"value": [1, "1"]}, {"value": [1, "2"]}])),
        )
        .expect_err("two");
        assert!(two.reason.contains("2 samples") && !two.retry(), "{two:?}");
        assert_eq!(
            answer(
                StatusCode::OK,
                &json!({"status": "success", "data": {"resultType": "scalar", "result": [1, "3"]}})
            ),
            Ok(3.0)
        );
        assert_eq!(
            answer(StatusCode::OK, &json!({"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "NaN"]}]}}))
                .map(f64::is_nan),
            Ok(true)
        );
        let bad = answer(
            StatusCode::OK,
            &json!({"status": "error", "errorType": "bad_data", "error": "parse error at char 5"}),
        );
        assert_eq!(
            bad,
            Err(NoNumber::new(
                "the query failed (bad_data): parse error at char 5"
            )),
            "bad PromQL stays bad"
        );
        let slow = answer(
            StatusCode::OK,
            &json!({"status": "error", "errorType": "timeout", "error": "query timed out"}),
        )
        .expect_err("timeout");
        assert!(slow.retry(), "a timeout may pass next time: {slow:?}");
        let many = answer(
            StatusCode::OK,
            &json!({"status": "error", "errorType": "execution",
            "error": "many-to-many matching not allowed"}),
        )
        .expect_err("execution");
        assert!(!many.retry(), "the same query fails the same way: {many:?}");
        // the store's I/O error (the TSDB's `internal`, HTTP 500) and a proxy's 503 with some JSON may pass
        let io = answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({"status": "error",
            "errorType": "internal", "error": "storage: sled I/O"}),
        )
        .expect_err("internal");
        assert!(io.retry(), "{io:?}");
        let proxy = answer(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"message": "no upstream"}),
        )
        .expect_err("proxy");
        assert!(proxy.retry(), "{proxy:?}");
        let bad = answer(
            StatusCode::BAD_REQUEST,
            &json!({"status": "error",
            "errorType": "bad_data", "error": "parse error"}),
        )
        .expect_err("bad");
        assert!(!bad.retry(), "{bad:?}");
        let matrix = answer(
            StatusCode::OK,
            &json!({"status": "success", "data": {"resultType": "matrix", "result": []}}),
        );
        assert!(
            matrix
                .expect_err("matrix")
                .reason
                .contains("a matrix, not a number")
        );
    }
}
