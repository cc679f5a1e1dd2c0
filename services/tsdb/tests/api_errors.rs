//! Queries the engine refuses are answered as Prometheus does: HTTP 400 with `status: error` and
//! `errorType: bad_data` (what Grafana and promtool show the user), for instant and range queries alike.

use std::sync::Arc;

use anyhow::Result;
use multipilot_tsdb::http;
use multipilot_tsdb::store::{Options, Store};
use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn malformed_queries_and_unknown_functions_are_bad_data() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::open(dir.path(), Options::default())?);
    let cancel = CancellationToken::new();
    let router = http::router(store, http::Options::default())?;
    let (addr, server) =
        multipilot_runtime::http::serve("127.0.0.1:0", router, cancel.clone()).await?;
    let client = reqwest::Client::new();
    let bad = [
        "sum(",                     // malformed
        "up{job=}",                 // malformed matcher
        "no_such_function(up)",     // unknown function
        "rate(up)",                 // wrong argument type
        "label_replace(up, \"a\")", // wrong number of arguments
        "topk(NaN, up)",            // rejected at evaluation
    ];
    for q in bad {
        for (path, extra) in [
            ("/api/v1/query", &[("time", "100")][..]),
            (
                "/api/v1/query_range",
                &[("start", "0"), ("end", "100"), ("step", "10")][..],
            ),
        ] {
            let mut form = vec![("query", q)];
            form.extend_from_slice(extra);
            let r = client
                .get(format!("http://{addr}{path}"))
                .query(&form)
                .send()
                .await?;
            assert_eq!(r.status().as_u16(), 400, "{path} {q}");
            let v: Json = r.json().await?;
            assert_eq!(v["status"], "error", "{path} {q}: {v}");
            assert_eq!(v["errorType"], "bad_data", "{path} {q}: {v}");
            assert!(
                v["error"].as_str().is_some_and(|e| !e.is_empty()),
                "{path} {q}: {v}"
            );
        }
    }
    // and a good query still succeeds
    let r = client
        .get(format!("http://{addr}/api/v1/query"))
        .query(&[("query", "vector(1)"), ("time", "100")])
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    cancel.cancel();
    server.await?;
    Ok(())
}
