//! A token scoped to some clusters (a team's, `multipilot team add`) reads only their series through every
//! read of the Prometheus API, whatever the query names: the TSDB adds `cluster=~"<its clusters>"` to each
//! selector, as prom-label-proxy enforces a label. Served over real HTTP from a real store.

use std::sync::Arc;

use anyhow::{Result, ensure};
use multipilot_runtime::auth::{self, Role, TokenEntry, Tokens};
use multipilot_tsdb::http;
use multipilot_tsdb::store::{Options, Store};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

mod common;
use common::sample;

const TEAM: &str = "team-token-0123456789";
const ALL: &str = "fleet-token-0123456789";

#[tokio::test]
async fn a_scoped_token_reads_only_its_clusters_series_whatever_the_query_says() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::open(dir.path(), Options::default())?);
    let now = chrono::Utc::now().timestamp_millis();
    // samples 70 s old: a subquery's steps fall on whole minutes, so one always comes after them (a
    // sample seconds old may be newer than every step, and a subquery over it empty)
    for cluster in ["alpha-1", "beta-2", "gamma-3"] {
        store.append(
            cluster,
            &[
                sample("up", &[("job", "node")], 1.0, now - 70_000),
                sample("secret_total", &[("job", "app")], 7.0, now - 70_000),
            ],
        )?;
    }
    // a series of no cluster (the hub's own): not a team's either
    store.append("", &[sample("hub_up", &[], 1.0, now - 70_000)])?;
    store.commit().await?;
    let mut team = TokenEntry::plain(TEAM, "team-payments", Role::Viewer);
    team.team = Some("payments".into());
    team.clusters = Some(vec!["alpha-1".into(), "gamma-3".into()]);
    let tokens: Arc<Tokens> = Arc::new(Tokens::load(&auth::Config {
        enabled: true,
        tokens_file: None,
        tokens: vec![team, TokenEntry::plain(ALL, "grafana", Role::Viewer)],
    })?);
    let cancel = CancellationToken::new();
    let router = http::router(
        store,
        http::Options {
            tokens: Some(tokens.clone()),
            ..Default::default()
        },
    )?;
    let (addr, server) =
        multipilot_runtime::http::serve("127.0.0.1:0", router, cancel.clone()).await?;
    let client = reqwest::Client::new();
    let get = |path: String, token: &'static str| {
        let client = client.clone();
        async move {
            let resp = client
                .get(format!("http://{addr}{path}"))
                .bearer_auth(token)
                .send()
                .await?;
            let status = resp.status().as_u16();
            let body: Value = resp.json().await?;
            anyhow::Ok((status, body))
        }
    };
    // the clusters of every series a query answers with
    let clusters_of = |body: &Value| -> Vec<String> {
        let mut out: Vec<String> = body["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| s["metric"]["cluster"].as_str().unwrap_or("-").to_string())
            .collect();
        out.sort();
        out
    };
    let q = |expr: &str| format!("/api/v1/query?query={}", urlencode(expr));

    // what the whole fleet's token sees, for contrast
    let (_, all) = get(q("up"), ALL).await?;
    ensure!(
        clusters_of(&all) == ["alpha-1", "beta-2", "gamma-3"],
        "{all}"
    );

    for (expr, want) in [
        ("up", vec!["alpha-1", "gamma-3"]),
        // naming another cluster explicitly, or by regex, or every series
        (r#"up{cluster="beta-2"}"#, vec![]),
        (r#"up{cluster=~"beta.*|alpha-1"}"#, vec!["alpha-1"]),
        (r#"up{cluster!="alpha-1"}"#, vec!["gamma-3"]),
        (
            r#"{__name__=~".+"}"#,
            vec!["alpha-1", "alpha-1", "gamma-3", "gamma-3"],
        ),
        (r#"{__name__=~"hub_.*"}"#, vec![]),
        // inside functions, aggregations, binary operations, subqueries and `or` alternatives
        (r#"max_over_time(up{cluster="beta-2"}[5m])"#, vec![]),
        (
            r#"sum by (cluster) (secret_total) or vector(0)"#,
            vec!["-", "alpha-1", "gamma-3"],
        ),
        (
            r#"label_replace(up{cluster="beta-2"}, "x", "$1", "job", "(.*)")"#,
            vec![],
        ),
        (r#"max_over_time(up[5m:1m])"#, vec!["alpha-1", "gamma-3"]),
        (
            r#"up{cluster="beta-2" or cluster="alpha-1"}"#,
            vec!["alpha-1"],
        ),
    ] {
        let (status, body) = get(q(expr), TEAM).await?;
        ensure!(status == 200, "{expr}: {status} {body}");
        ensure!(clusters_of(&body) == want, "{expr}: got {body}");
    }
    // the sum over every cluster counts only the team's
    let (_, body) = get(q(r#"sum(secret_total{cluster=~".+"})"#), TEAM).await?;
    ensure!(body["data"]["result"][0]["value"][1] == "14", "{body}");
    // a range query
    let (_, body) = get(
        format!(
            "/api/v1/query_range?query={}&start={}&end={}&step=15",
            urlencode(r#"count({__name__=~".+"})"#),
            (now - 60_000) / 1000,
            now / 1000
        ),
        TEAM,
    )
    .await?;
    let last = body["data"]["result"][0]["values"]
        .as_array()
        .and_then(|v| v.last().cloned());
    ensure!(
        last.as_ref().map(|p| &p[1]) == Some(&Value::from("4")),
        "{body}"
    );

    // series, label names and values: only what the team's series hold
    let (_, body) = get(
        format!(
            "/api/v1/series?match[]={}",
            urlencode(r#"{__name__=~".+"}"#)
        ),
        TEAM,
    )
    .await?;
    let seen: std::collections::BTreeSet<&str> = body["data"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s["cluster"].as_str().unwrap_or("-"))
        .collect();
    ensure!(seen == ["alpha-1", "gamma-3"].into(), "{body}");
    let (_, body) = get("/api/v1/label/cluster/values".into(), TEAM).await?;
    ensure!(
        body["data"] == serde_json::json!(["alpha-1", "gamma-3"]),
        "{body}"
    );
    let (_, body) = get("/api/v1/label/__name__/values".into(), TEAM).await?;
    ensure!(
        body["data"] == serde_json::json!(["secret_total", "up"]),
        "{body}"
    );
    let (_, body) = get(
        format!(
            "/api/v1/label/cluster/values?match[]={}",
            urlencode(r#"up{cluster="beta-2"}"#)
        ),
        TEAM,
    )
    .await?;
    ensure!(body["data"] == serde_json::json!([]), "{body}");

    // the peers' internal endpoints are not for a team
    let status = client
        .post(format!("http://{addr}/internal/v1/labels"))
        .bearer_auth(TEAM)
        .body(Vec::new())
        .send()
        .await?
        .status()
        .as_u16();
    ensure!(status == 403, "internal labels: {status}");
    cancel.cancel();
    server.await?;

    // the rules and their alerts span the fleet: refused to the team, answered to the fleet's token
    let manager = Arc::new(multipilot_tsdb::rules::Manager::new(
        Vec::new(),
        std::time::Duration::from_secs(60),
        multipilot_tsdb::promql::Engine::new(
            Arc::new(Store::open(&dir.path().join("rules"), Options::default())?),
            std::time::Duration::from_secs(300),
        ),
        None,
        "http://tsdb".into(),
    )?);
    let rules = multipilot_tsdb::rules::router(manager)
        .route_layer(axum::middleware::from_fn(http::whole_fleet_only))
        .route_layer(axum::middleware::from_fn_with_state(
            tokens.clone(),
            auth::viewer_reads_operator_writes,
        ));
    let cancel = CancellationToken::new();
    let (addr, server) =
        multipilot_runtime::http::serve("127.0.0.1:0", rules, cancel.clone()).await?;
    for (path, token, want) in [
        ("/api/v1/rules", TEAM, 403),
        ("/api/v1/alerts", TEAM, 403),
        ("/api/v1/rules", ALL, 200),
    ] {
        let status = client
            .get(format!("http://{addr}{path}"))
            .bearer_auth(token)
            .send()
            .await?
            .status()
            .as_u16();
        ensure!(status == want, "{path} with {token}: {status}");
    }
    cancel.cancel();
    server.await?;
    Ok(())
}

fn urlencode(s: &str) -> String {
    serde_urlencoded::to_string([("x", s)]).expect("encode")[2..].to_string()
}
