//! Compatibility with a real Prometheus client: `promtool query instant` and `promtool query range` (from
//! Debian's `prometheus` package) against the TSDB's HTTP API, with their JSON output checked.
//!
//! promtool is required: without it this test fails and says how to install it (`./scripts/test` does).

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use multipilot_schemas::payload::Sample;
use multipilot_tsdb::http;
use multipilot_tsdb::store::{Options, Store};
use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;

mod common;
use common::promtool;

const BASE_S: i64 = 1_750_000_000;

/// Runs promtool off the test's thread (the server under test runs on it).
async fn output(args: Vec<String>) -> Result<std::process::Output> {
    let bin = promtool()?;
    Ok(tokio::task::spawn_blocking(move || Command::new(bin).args(&args).output()).await??)
}

async fn run(args: Vec<String>) -> Result<Json> {
    let out = output(args).await?;
    anyhow::ensure!(
        out.status.success(),
        "promtool failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("promtool output: {}", String::from_utf8_lossy(&out.stdout)))
}

/// `node_load{cluster="cN", instance="iM"}` = 10·N + M + k/10 at BASE + 30 s · k, k = 0..=40.
fn data() -> Vec<Sample> {
    let mut out = Vec::new();
    for k in 0..=40 {
        for n in 1..=3 {
            for m in 1..=2 {
                out.push(Sample {
                    name: "node_load".into(),
                    labels: BTreeMap::from([
                        ("cluster".to_string(), format!("c{n}")),
                        ("instance".to_string(), format!("i{m}")),
                    ]),
                    value: (10 * n + m) as f64 + k as f64 / 10.0,
                    timestamp_ms: (BASE_S + 30 * k) * 1000,
                });
            }
        }
    }
    out
}

#[tokio::test]
async fn promtool_queries_get_the_expected_values() -> Result<()> {
    promtool()?;
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::open(dir.path(), Options::default())?);
    store.append("", &data())?;
    store.commit().await?;
    let cancel = CancellationToken::new();
    let router = http::router(
        store,
        http::Options {
            lookback: Duration::from_secs(300),
            ..Default::default()
        },
    )?;
    let (addr, server) =
        multipilot_runtime::http::serve("127.0.0.1:0", router, cancel.clone()).await?;
    let url = format!("http://{addr}");

    // Instant: at k = 20 per cluster N: (10N + 1 + 2) + (10N + 2 + 2) = 20N + 7.
    let t = BASE_S + 600;
    let v = run(vec![
        "query".into(),
        "instant".into(),
        "-o".into(),
        "json".into(),
        format!("--time={t}"),
        url.clone(),
        "sum by (cluster) (node_load)".into(),
    ])
    .await?;
    let result = v.as_array().context("vector")?;
    assert_eq!(result.len(), 3, "{v}");
    for (i, r) in result.iter().enumerate() {
        let n = i as i64 + 1;
        assert_eq!(r["metric"], serde_json::json!({"cluster": format!("c{n}")}));
        assert_eq!(r["value"][0].as_f64(), Some(t as f64));
        let got: f64 = r["value"][1].as_str().context("value")?.parse()?;
        assert!((got - (20 * n + 7) as f64).abs() < 1e-9, "{r}");
    }

    // Whole fleet with a function and arithmetic: 6 series, each rising 0.1 per 30 s.
    let v = run(vec![
        "query".into(),
        "instant".into(),
        "-o".into(),
        "json".into(),
        format!("--time={t}"),
        url.clone(),
        "sum(rate(node_load[5m])) * 300".into(),
    ])
    .await?;
    let got: f64 = v[0]["value"][1].as_str().context("value")?.parse()?;
    // rate per series = 0.1/30 per s (no counter resets, no extrapolation past the edges): × 6 × 300 = 6.
    assert!((got - 6.0).abs() < 1e-9, "{v}");

    // Many-to-one matching: each node's share of its cluster, (10N + M + 2) / (20N + 7), labelled by the
    // node (a "node" label made by label_replace from the instance).
    let v = run(vec![
        "query".into(),
        "instant".into(),
        "-o".into(),
        "json".into(),
        format!("--time={t}"),
        url.clone(),
        r#"label_replace(node_load, "node", "n$1", "instance", "i(.)") / on(cluster) group_left sum by (cluster) (node_load)"#.into(),
    ])
    .await?;
    let result = v.as_array().context("vector")?;
    assert_eq!(result.len(), 6, "{v}");
    for n in 1..=3i64 {
        for m in 1..=2i64 {
            let r = result
                .iter()
                .find(|r| {
                    r["metric"]["cluster"] == format!("c{n}")
                        && r["metric"]["node"] == format!("n{m}")
                })
                .with_context(|| format!("c{n} n{m} in {v}"))?;
            assert_eq!(r["metric"]["instance"], format!("i{m}"), "{r}");
            assert!(r["metric"].get("__name__").is_none(), "{r}");
            let got: f64 = r["value"][1].as_str().context("value")?.parse()?;
            let want = (10 * n + m + 2) as f64 / (20 * n + 7) as f64;
            assert!((got - want).abs() < 1e-9, "{r}");
        }
    }

    // Range: sum of the fleet every minute over 4 minutes from k = 10: 6 series, Σ(10N+M) = 129,
    // plus 6 · k/10.
    let (start, end) = (BASE_S + 300, BASE_S + 540);
    let v = run(vec![
        "query".into(),
        "range".into(),
        "-o".into(),
        "json".into(),
        format!("--start={start}"),
        format!("--end={end}"),
        "--step=1m".into(),
        url.clone(),
        "sum(node_load)".into(),
    ])
    .await?;
    let series = v.as_array().context("matrix")?;
    assert_eq!(series.len(), 1, "{v}");
    let values = series[0]["values"].as_array().context("values")?;
    assert_eq!(values.len(), 5, "{v}");
    for (j, p) in values.iter().enumerate() {
        let k = 10 + 2 * j as i64;
        assert_eq!(p[0].as_f64(), Some((BASE_S + 30 * k) as f64));
        let got: f64 = p[1].as_str().context("value")?.parse()?;
        assert!((got - (129.0 + 0.6 * k as f64)).abs() < 1e-9, "{p}");
    }

    // A bad query is reported by promtool as the server's error.
    let out = output(vec![
        "query".into(),
        "instant".into(),
        url.clone(),
        "sum(".into(),
    ])
    .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("bad_data"), "{stderr}");

    cancel.cancel();
    server.await?;
    Ok(())
}
