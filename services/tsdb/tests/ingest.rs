//! The role against a real nats-server: batches published on `fleet.metrics.<cluster>` are stored and
//! answered on the Prometheus HTTP API; and a role killed with SIGKILL loses no acked sample.
//!
//! The crash test runs the role in a child process: this same test binary, re-executed to run only the
//! ignored `child_runs_the_role_until_killed` test with the settings in `TSDB_CRASH_CHILD`. The parent kills
//! it with SIGKILL once the consumer's ack floor has moved, then checks, from the data directory alone,
//! that every sample of every acked message is there.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result};
use async_nats::jetstream;
use chrono::{TimeZone, Utc};
use multipilot_bus::metrics::BusMetrics;
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use multipilot_bus::topology::Topology;
use multipilot_runtime::Context;
use multipilot_schemas::payload::{MetricBatch, Sample};
use multipilot_schemas::{Envelope, subject};
use multipilot_testkit::{NatsServer, free_port};
use multipilot_tsdb::store::{Options, Store};
use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;

/// The first scrape's time: 3 hours ago, on a whole minute (within retention, as real data is).
fn t0() -> i64 {
    static T0: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *T0.get_or_init(|| (Utc::now().timestamp_millis() - 3 * 3_600_000) / 60_000 * 60_000)
}

async fn setup() -> Result<(NatsServer, jetstream::Context)> {
    let server = NatsServer::start().await?;
    let js = jetstream::new(server.client().await?);
    Topology::embedded().provision(&js).await?;
    Ok((server, js))
}

async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    deadline: Duration,
    mut f: impl FnMut() -> F,
) -> Result<()> {
    let every = Duration::from_millis(50);
    multipilot_testkit::wait::eventually_every(what, deadline.as_secs(), every, async || {
        f().await.then_some(())
    })
    .await
}

/// One scrape of `series` series of `name` in `cluster` at `t0() + index × 30 s`, value = index × (i + 1).
fn batch(cluster: &str, name: &str, series: usize, index: i64) -> MetricBatch {
    let samples = (0..series)
        .map(|i| Sample {
            name: name.into(),
            labels: BTreeMap::from([
                ("cluster".to_string(), cluster.to_string()),
                ("job".to_string(), "node".to_string()),
                ("i".to_string(), i.to_string()),
            ]),
            value: (index * (i as i64 + 1)) as f64,
            timestamp_ms: t0() + index * 30_000,
        })
        .collect();
    MetricBatch {
        job: "node".into(),
        instance: "n1".into(),
        families: Vec::new(),
        samples,
        rejected_lines: 0,
    }
}

async fn publish(
    js: &jetstream::Context,
    cluster: &str,
    batches: Vec<(i64, MetricBatch)>,
) -> Result<()> {
    let mut publisher = Publisher::new(js.clone(), 64, BusMetrics::default());
    let mut done = Vec::new();
    for (index, b) in batches {
        let env = Envelope::new(
            cluster,
            format!("agent-{cluster}"),
            Utc.timestamp_millis_opt(t0() + index * 30_000)
                .single()
                .context("time")?,
            index as u64,
            b,
        );
        let msg = Outgoing::envelope(
            subject::metrics(cluster),
            format!("m-{cluster}-{index}"),
            &env,
        )?;
        done.extend(publisher.send((), msg).await);
    }
    done.extend(publisher.flush().await);
    for c in done {
        anyhow::ensure!(matches!(c, Completion::Stored { .. }), "not stored: {c:?}");
    }
    Ok(())
}

fn config(dir: &Path, port: u16) -> multipilot_tsdb::Config {
    let mut c = multipilot_tsdb::Config {
        data_dir: dir.to_path_buf(),
        listen: format!("127.0.0.1:{port}"),
        ..Default::default()
    };
    c.consumer.fetch_wait = Duration::from_millis(200);
    c
}

async fn api(port: u16, path: &str) -> Result<Json> {
    let r = reqwest::get(format!("http://127.0.0.1:{port}{path}")).await?;
    Ok(r.json().await?)
}

#[tokio::test]
async fn ingested_batches_are_queryable_over_the_prometheus_api() -> Result<()> {
    let (server, js) = setup().await?;
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let cancel = CancellationToken::new();
    let ctx = Context::new(server.client().await?, "tsdb-test", cancel.clone());
    let health = ctx.health.clone();
    let role = tokio::spawn(multipilot_tsdb::run(config(dir.path(), port), ctx));

    // Two clusters, 3 series each, 11 scrapes.
    for cluster in ["c1", "c2"] {
        publish(
            &js,
            cluster,
            (0..=10)
                .map(|i| (i, batch(cluster, "up_total", 3, i)))
                .collect(),
        )
        .await?;
    }
    let at = (t0() + 300_000) as f64 / 1000.0;
    let q = format!("/api/v1/query?query=count(up_total)&time={at}");
    wait_until("all series stored", Duration::from_secs(30), || async {
        api(port, &q).await.ok().and_then(|v| {
            v["data"]["result"][0]["value"][1]
                .as_str()
                .map(str::to_string)
        }) == Some("6".into())
    })
    .await?;
    wait_until("last scrape stored", Duration::from_secs(30), || async {
        let q = format!("/api/v1/query?query=sum(up_total)&time={at}");
        api(port, &q).await.ok().and_then(|v| {
            v["data"]["result"][0]["value"][1]
                .as_str()
                .map(str::to_string)
        }) == Some("120".into())
    })
    .await?;
    assert!(health.not_ready().is_empty(), "tsdb reports ready");

    // sum by (cluster) of rate over 5 m at t0() + 300 s: rates 1/30, 2/30, 3/30 per cluster → 0.2.
    let v = api(
        port,
        &format!("/api/v1/query?query=sum%20by%20(cluster)%20(rate(up_total%5B5m%5D))&time={at}"),
    )
    .await?;
    assert_eq!(v["status"], "success", "{v}");
    assert_eq!(v["data"]["resultType"], "vector");
    let result = v["data"]["result"].as_array().context("result")?;
    assert_eq!(result.len(), 2);
    for r in result {
        let value: f64 = r["value"][1].as_str().context("value")?.parse()?;
        assert!((value - 0.2).abs() < 1e-9, "{r}");
        assert_eq!(r["value"][0].as_f64(), Some(at));
    }
    assert_eq!(result[0]["metric"], serde_json::json!({"cluster": "c1"}));

    // Range query, POST form like promtool and Grafana.
    let client = reqwest::Client::new();
    let form = [
        ("query", "sum(up_total{cluster=\"c2\"})".to_string()),
        ("start", format!("{}", t0() / 1000)),
        ("end", format!("{}", t0() / 1000 + 60)),
        ("step", "30s".to_string()),
    ];
    let v: Json = client
        .post(format!("http://127.0.0.1:{port}/api/v1/query_range"))
        .form(&form)
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(v["data"]["resultType"], "matrix", "{v}");
    let values = &v["data"]["result"][0]["values"];
    let expected = serde_json::json!([
        [t0() / 1000, "0"],
        [t0() / 1000 + 30, "6"],
        [t0() / 1000 + 60, "12"]
    ]);
    assert_eq!(values, &expected);

    // Metadata endpoints.
    let v = api(
        port,
        "/api/v1/series?match[]=up_total%7Bcluster%3D%22c1%22%7D",
    )
    .await?;
    assert_eq!(v["data"].as_array().map(Vec::len), Some(3), "{v}");
    assert_eq!(v["data"][0]["__name__"], "up_total");
    let v = api(port, "/api/v1/labels").await?;
    assert_eq!(
        v["data"],
        serde_json::json!(["__name__", "cluster", "i", "job"])
    );
    let v = api(port, "/api/v1/label/cluster/values").await?;
    assert_eq!(v["data"], serde_json::json!(["c1", "c2"]));
    let v = api(port, "/api/v1/status/buildinfo").await?;
    assert_eq!(v["status"], "success");

    // Errors use Prometheus' envelope and status.
    let r = reqwest::get(format!("http://127.0.0.1:{port}/api/v1/query?query=sum(")).await?;
    assert_eq!(r.status().as_u16(), 400);
    let v: Json = r.json().await?;
    assert_eq!(v["status"], "error");
    assert_eq!(v["errorType"], "bad_data");

    cancel.cancel();
    role.await??;
    Ok(())
}

/// Every series `0..series` holds exactly the scrapes `0..=last` (and nothing else when `exact`).
fn check_scrapes(store: &Store, series: usize, last: i64, exact: bool) -> Result<()> {
    let sel = vec![vec![promql_parser::label::Matcher::new(
        promql_parser::label::MatchOp::Equal,
        "__name__",
        "crash_total",
    )]];
    let found = store.select(&sel);
    anyhow::ensure!(
        found.len() == series || last < 0,
        "{} series of {series}",
        found.len()
    );
    for (id, labels) in found {
        let samples = store.samples(id, i64::MIN, i64::MAX)?;
        let i: i64 = multipilot_tsdb::store::label(&labels, "i").parse()?;
        for index in 0..=last {
            let want = (t0() + index * 30_000, (index * (i + 1)) as f64);
            anyhow::ensure!(
                samples.contains(&want),
                "series i={i} lost acked scrape {index}"
            );
        }
        if exact {
            anyhow::ensure!(
                samples.len() as i64 == last + 1,
                "series i={i}: {} samples",
                samples.len()
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn acked_samples_survive_kill_9() -> Result<()> {
    const BATCHES: i64 = 300;
    const SERIES: usize = 500;
    let (server, js) = setup().await?;
    publish(
        &js,
        "c1",
        (0..BATCHES)
            .map(|i| (i, batch("c1", "crash_total", SERIES, i)))
            .collect(),
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let mut cfg = config(dir.path(), port);
    cfg.consumer.batch = 5;
    // The test replays 2.5 hours of scrapes in seconds: a message redelivered after the restart (ack_wait
    // later) is hours of data time behind the newest sample, so the window must cover the whole replay.
    cfg.out_of_order_window = Duration::from_secs(24 * 3600);
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "child_runs_the_role_until_killed",
            "--ignored",
            "--nocapture",
        ])
        .env("TSDB_CRASH_CHILD", serde_json::to_string(&cfg)?)
        .env("TSDB_CRASH_NATS", server.url())
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let stream = js.get_stream("FLEET_METRICS").await?;
    let consumer: jetstream::consumer::Consumer<jetstream::consumer::pull::Config> = stream
        .get_consumer("tsdb")
        .await
        .map_err(|e| anyhow::anyhow!("consumer: {e}"))?;
    wait_until(
        "the child to ack something",
        Duration::from_secs(60),
        || async {
            consumer
                .get_info()
                .await
                .is_ok_and(|i| i.ack_floor.stream_sequence >= 10)
        },
    )
    .await?;
    child.kill()?; // SIGKILL
    child.wait()?;
    let floor = consumer.get_info().await?.ack_floor.stream_sequence as i64;
    eprintln!("killed with {floor} of {BATCHES} messages acked");

    // Stream sequence n carries scrape n - 1: every scrape up to floor - 1 must be stored.
    let store = Store::open(dir.path(), Options::default())?;
    check_scrapes(&store, SERIES, floor - 1, false)?;
    store.close().await?;

    // Restart: the unacked rest is redelivered; every sample ends up stored exactly once.
    let cancel = CancellationToken::new();
    let ctx = Context::new(server.client().await?, "tsdb-restart", cancel.clone());
    let role = tokio::spawn(multipilot_tsdb::run(cfg, ctx));
    wait_until(
        "everything acked after restart",
        Duration::from_secs(120),
        || async {
            consumer
                .get_info()
                .await
                .is_ok_and(|i| i.ack_floor.stream_sequence >= BATCHES as u64)
        },
    )
    .await?;
    cancel.cancel();
    role.await??;
    // `run` closes its store before it returns
    let store = Store::open(dir.path(), Options::default())?;
    check_scrapes(&store, SERIES, BATCHES - 1, true)?;
    Ok(())
}

/// Not a test on its own: the child process of `acked_samples_survive_kill_9`.
#[tokio::test]
#[ignore = "run by acked_samples_survive_kill_9 as a child process"]
async fn child_runs_the_role_until_killed() -> Result<()> {
    let (Ok(cfg), Ok(url)) = (
        std::env::var("TSDB_CRASH_CHILD"),
        std::env::var("TSDB_CRASH_NATS"),
    ) else {
        return Ok(());
    };
    let cfg: multipilot_tsdb::Config = serde_json::from_str(&cfg)?;
    let client = async_nats::connect(url).await?;
    let ctx = Context::new(client, "tsdb-child", CancellationToken::new());
    Ok(multipilot_tsdb::run(cfg, ctx).await?)
}
