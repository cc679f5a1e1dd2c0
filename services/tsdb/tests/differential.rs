//! The TSDB against a real Prometheus (Debian's `prometheus`), fed the same samples: metric batches go
//! through the TSDB role (FLEET_METRICS on a real nats-server) and on to Prometheus through the TSDB's
//! remote write (`--web.enable-remote-write-receiver`); then everyday dashboard and alert-rule queries are
//! asked of both, instant and range, and must agree: the same series, the same values (to 1e-9 relative),
//! the same errors.
//!
//! Sample timestamps sit 1.234 s off the query grid, and subquery ranges are not multiples of their step,
//! so no sample or subquery step lies exactly on a range or lookback boundary: there Prometheus 2 (closed
//! ranges, Debian's version) and Prometheus 3 (left-open ranges, what the engine follows) differ by
//! design, and the boundary cases are covered by Prometheus' own test files (`promqltest.rs`).
//!
//! The prometheus binary is required (`PROMETHEUS_BIN`, else the one on PATH): without it this test fails
//! and says how to install it (`./scripts/test` does).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use async_nats::jetstream;
use chrono::{TimeZone, Utc};
use multipilot_bus::metrics::BusMetrics;
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use multipilot_bus::topology::Topology;
use multipilot_runtime::Context;
use multipilot_schemas::payload::{MetricBatch, Sample};
use multipilot_schemas::{Envelope, subject};
use multipilot_testkit::{NatsServer, free_port};
use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;

/// Scrape interval and count: 30 minutes of 15 s scrapes.
const STEP_MS: i64 = 15_000;
const SCRAPES: i64 = 120;
/// How far every sample sits off the 15 s query grid.
const OFF_GRID_MS: i64 = 1_234;
/// Prometheus' staleness marker.
const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

fn prometheus_bin() -> Result<String> {
    let path = std::env::var("PROMETHEUS_BIN").unwrap_or_else(|_| "prometheus".into());
    match Command::new(&path).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(path),
        _ => bail!(
            "prometheus not found: install Debian's `prometheus` package (`apt-get install -y prometheus`, \
             which ./scripts/test does) or point PROMETHEUS_BIN at a prometheus binary"
        ),
    }
}

/// A real Prometheus that only receives remote write.
struct Prometheus {
    child: Child,
    url: String,
}

impl Prometheus {
    async fn start(dir: &Path) -> Result<Prometheus> {
        let bin = prometheus_bin()?;
        let port = free_port()?;
        std::fs::create_dir_all(dir)?;
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, "global:\n  scrape_interval: 1h\n")?;
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--web.enable-remote-write-receiver")
            .arg("--query.lookback-delta=5m")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log"))?)
            .spawn()
            .context("starting prometheus")?;
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let ready = format!("{}/-/ready", p.url);
        multipilot_testkit::wait::eventually("prometheus ready", 60, async || {
            reqwest::get(&ready)
                .await
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ())
        })
        .await?;
        Ok(p)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tiny deterministic generator (the data must be the same from run to run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One cluster's scrapes: node, apiserver and kube-state-metrics style series, counters with a reset, a
/// series that ends with a staleness marker and one that just stops.
fn scrapes(cluster: &str, base_ms: i64) -> Vec<MetricBatch> {
    let seed = cluster.bytes().fold(7u64, |a, b| a * 31 + u64::from(b));
    let mut rng = Lcg(seed);
    let mut cpu: BTreeMap<(usize, &str), f64> = BTreeMap::new();
    let mut reqs: BTreeMap<(&str, &str), f64> = BTreeMap::new();
    let mut buckets: BTreeMap<(&str, usize), f64> = BTreeMap::new();
    let (mut dur_sum, mut dur_count) = (BTreeMap::new(), BTreeMap::new());
    let mut restarts = [0.0f64; 3];
    let mut memory = 8.0e9;
    let mut named = [0.0f64; 3];
    let les = ["0.05", "0.1", "0.25", "0.5", "1", "+Inf"];
    let instance = format!("{cluster}-node-1:9100");
    let mut out = Vec::new();
    for k in 0..SCRAPES {
        let t = base_ms + k * STEP_MS + OFF_GRID_MS;
        let mut s = Vec::new();
        let mut push = |name: &str, l: BTreeMap<String, String>, value: f64| {
            let mut l = l;
            l.insert("cluster".into(), cluster.into());
            s.push(Sample {
                name: name.into(),
                labels: l,
                value,
                timestamp_ms: t,
            });
        };
        for c in 0..2 {
            for mode in ["idle", "user", "system"] {
                let v = cpu.entry((c, mode)).or_insert(1000.0 * (c + 1) as f64);
                *v += match mode {
                    "idle" => 10.0 + rng.next() * 3.0,
                    "user" => 3.0 + rng.next() * 2.0,
                    _ => 1.0 + rng.next(),
                };
                // c2's node restarts half way: its counters start again from zero
                if cluster == "c2" && k == SCRAPES / 2 {
                    *v = rng.next() * 5.0;
                }
                push(
                    "node_cpu_seconds_total",
                    labels(&[
                        ("job", "node"),
                        ("instance", &instance),
                        ("cpu", &c.to_string()),
                        ("mode", mode),
                    ]),
                    *v,
                );
            }
        }
        push(
            "node_load1",
            labels(&[("job", "node"), ("instance", &instance)]),
            0.5 + rng.next() * 2.0 + (k as f64 / 20.0).sin(),
        );
        memory += (rng.next() - 0.6) * 4.0e7;
        push(
            "node_memory_MemAvailable_bytes",
            labels(&[("job", "node"), ("instance", &instance)]),
            memory.round(),
        );
        // a second node that goes away 20 minutes in, marked stale as a scrape that loses it does
        if k < 80 {
            push(
                "node_load1",
                labels(&[("job", "node"), ("instance", "gone:9100")]),
                1.0 + rng.next(),
            );
        } else if k == 80 {
            push(
                "node_load1",
                labels(&[("job", "node"), ("instance", "gone:9100")]),
                f64::from_bits(STALE_NAN_BITS),
            );
        }
        for verb in ["GET", "LIST"] {
            for code in ["200", "500"] {
                let v = reqs.entry((verb, code)).or_insert(0.0);
                *v += if code == "200" {
                    (50.0 + rng.next() * 20.0).round()
                } else {
                    (rng.next() * 3.0).round()
                };
                push(
                    "apiserver_request_total",
                    labels(&[("job", "apiserver"), ("verb", verb), ("code", code)]),
                    *v,
                );
            }
            let n = 60.0 + (rng.next() * 10.0).round();
            let mut cumulative = 0.0;
            for (i, le) in les.iter().enumerate() {
                let share = [0.5, 0.2, 0.15, 0.08, 0.05, 0.02][i];
                cumulative += (n * share).round();
                let total = if *le == "+Inf" { n } else { cumulative.min(n) };
                let b = buckets.entry((verb, i)).or_insert(0.0);
                *b += total;
                push(
                    "apiserver_request_duration_seconds_bucket",
                    labels(&[("job", "apiserver"), ("verb", verb), ("le", le)]),
                    *b,
                );
            }
            let sum: &mut f64 = dur_sum.entry(verb).or_insert(0.0);
            *sum += n * (0.08 + rng.next() * 0.05);
            let sum = *sum;
            let count: &mut f64 = dur_count.entry(verb).or_insert(0.0);
            *count += n;
            let count = *count;
            push(
                "apiserver_request_duration_seconds_sum",
                labels(&[("job", "apiserver"), ("verb", verb)]),
                sum,
            );
            push(
                "apiserver_request_duration_seconds_count",
                labels(&[("job", "apiserver"), ("verb", verb)]),
                count,
            );
        }
        for (i, r) in restarts.iter_mut().enumerate() {
            if rng.next() < 0.04 * (i + 1) as f64 {
                *r += 1.0;
            }
            push(
                "kube_pod_container_status_restarts_total",
                labels(&[
                    ("job", "kube-state-metrics"),
                    ("namespace", "shop"),
                    ("pod", &format!("web-{i}")),
                ]),
                *r,
            );
        }
        let ready = !(cluster == "c3" && (40..70).contains(&k));
        for status in ["true", "false"] {
            push(
                "kube_node_status_condition",
                labels(&[
                    ("job", "kube-state-metrics"),
                    ("node", &format!("{cluster}-node-1")),
                    ("condition", "Ready"),
                    ("status", status),
                ]),
                if (status == "true") == ready {
                    1.0
                } else {
                    0.0
                },
            );
        }
        // a pod that is deleted 10 minutes before the end, without a marker: the lookback still sees it
        if k < SCRAPES - 40 {
            push(
                "kube_pod_info",
                labels(&[
                    ("job", "kube-state-metrics"),
                    ("namespace", "shop"),
                    ("pod", "old"),
                ]),
                1.0,
            );
        }
        for job in ["node", "apiserver", "kube-state-metrics"] {
            let down = cluster == "c1" && job == "node" && (90..95).contains(&k);
            push(
                "up",
                labels(&[("job", job), ("instance", &format!("{cluster}-{job}"))]),
                if down { 0.0 } else { 1.0 },
            );
        }
        // series whose names only differ: the metric-name dropping cases of Prometheus' own tests
        for (i, (name, env)) in [
            ("metric_total", "1"),
            ("another_metric_total", "1"),
            ("metric_total", "2"),
        ]
        .iter()
        .enumerate()
        {
            named[i] += (i + 1) as f64 * 3.0;
            push(name, labels(&[("env", env)]), named[i]);
        }
        out.push(MetricBatch {
            job: "mixed".into(),
            instance: cluster.into(),
            families: Vec::new(),
            samples: s,
            rejected_lines: 0,
        });
    }
    out
}

async fn publish(js: &jetstream::Context, cluster: &str, batches: Vec<MetricBatch>) -> Result<()> {
    let mut publisher = Publisher::new(js.clone(), 64, BusMetrics::default());
    let mut done = Vec::new();
    for (index, b) in batches.into_iter().enumerate() {
        let at = b.samples.first().map_or(0, |s| s.timestamp_ms);
        let env = Envelope::new(
            cluster,
            format!("agent-{cluster}"),
            Utc.timestamp_millis_opt(at).single().context("time")?,
            index as u64,
            b,
        );
        let msg = Outgoing::envelope(
            subject::metrics(cluster),
            format!("d-{cluster}-{index}"),
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

async fn get(url: &str, params: &[(&str, String)]) -> Result<(u16, Json)> {
    let r = reqwest::Client::new().get(url).query(params).send().await?;
    let status = r.status().as_u16();
    Ok((status, r.json().await?))
}

fn value(s: &Json) -> f64 {
    match s.as_str().unwrap_or_default() {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().unwrap_or(f64::NAN),
    }
}

fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// The result as (labels, points), sorted by labels unless the order is part of the answer.
fn points(data: &Json, keep_order: bool) -> Vec<(String, Vec<(f64, f64)>)> {
    let result = &data["result"];
    let mut out: Vec<(String, Vec<(f64, f64)>)> = match data["resultType"].as_str() {
        Some("scalar") => vec![(
            String::new(),
            vec![(result[0].as_f64().unwrap_or(0.0), value(&result[1]))],
        )],
        Some("vector") => result
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                (
                    s["metric"].to_string(),
                    vec![(s["value"][0].as_f64().unwrap_or(0.0), value(&s["value"][1]))],
                )
            })
            .collect(),
        _ => result
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                let pts = s["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| (p[0].as_f64().unwrap_or(0.0), value(&p[1])))
                    .collect();
                (s["metric"].to_string(), pts)
            })
            .collect(),
    };
    if !keep_order {
        out.sort_by(|a, b| a.0.cmp(&b.0));
    }
    out
}

/// Where the two answers differ, if they do.
fn differ(query: &str, ours: &(u16, Json), theirs: &(u16, Json)) -> Option<String> {
    let (os, o) = ours;
    let (ts, t) = theirs;
    if o["status"] != t["status"] {
        return Some(format!(
            "status {} ({os}) vs Prometheus {} ({ts}): ours {o}, Prometheus {t}",
            o["status"], t["status"]
        ));
    }
    if o["status"] == "error" {
        return (o["errorType"] != t["errorType"] || os != ts).then(|| {
            format!(
                "error {} ({os}) vs Prometheus {} ({ts})",
                o["errorType"], t["errorType"]
            )
        });
    }
    let (od, td) = (&o["data"], &t["data"]);
    if od["resultType"] != td["resultType"] {
        return Some(format!(
            "result type {} vs Prometheus {}",
            od["resultType"], td["resultType"]
        ));
    }
    let keep_order = query.starts_with("sort");
    let (op, tp) = (points(od, keep_order), points(td, keep_order));
    let names = |p: &[(String, Vec<(f64, f64)>)]| p.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    if names(&op) != names(&tp) {
        return Some(format!(
            "series {:?} vs Prometheus {:?}",
            names(&op),
            names(&tp)
        ));
    }
    for ((name, a), (_, b)) in op.iter().zip(&tp) {
        if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.0 != y.0 || !same(x.1, y.1)) {
            return Some(format!("{name}: {a:?} vs Prometheus {b:?}"));
        }
    }
    None
}

/// Everyday dashboard and alert-rule queries, the functions new users miss first among them.
const QUERIES: &[&str] = &[
    "up",
    "count(up)",
    "sum by (cluster) (up)",
    "up == 0",
    "count(count by (cluster) (up))",
    "group by (cluster) (up)",
    "rate(node_cpu_seconds_total[5m])",
    "sum by (cluster, mode) (rate(node_cpu_seconds_total[5m]))",
    "sum without (cpu) (rate(node_cpu_seconds_total[5m]))",
    "1 - avg by (instance) (rate(node_cpu_seconds_total{mode=\"idle\"}[5m]))",
    "irate(node_cpu_seconds_total[2m])",
    "resets(node_cpu_seconds_total[30m])",
    "increase(apiserver_request_total[10m])",
    "sum(rate(apiserver_request_total{code=~\"5..\"}[5m])) / sum(rate(apiserver_request_total[5m]))",
    "sum by (verb) (rate(apiserver_request_total[5m])) > 3",
    "histogram_quantile(0.99, sum by (le, verb) (rate(apiserver_request_duration_seconds_bucket[5m])))",
    "histogram_quantile(0.5, rate(apiserver_request_duration_seconds_bucket[5m]))",
    "rate(apiserver_request_duration_seconds_sum[5m]) / rate(apiserver_request_duration_seconds_count[5m])",
    "topk(3, node_load1)",
    "bottomk(2, sum by (instance) (node_load1))",
    "quantile(0.9, node_load1)",
    "stddev by (cluster) (node_load1)",
    "avg_over_time(node_load1[10m])",
    "max_over_time(node_load1[5m])",
    "min_over_time(node_memory_MemAvailable_bytes[5m])",
    "sum_over_time(up[10m])",
    "count_over_time(node_load1[10m])",
    "last_over_time(kube_pod_info[15m])",
    "quantile_over_time(0.9, node_load1[10m])",
    "stddev_over_time(node_load1[10m])",
    "stdvar_over_time(node_load1[10m])",
    "present_over_time(node_load1[5m])",
    "absent_over_time(nonexistent_metric[5m])",
    "absent_over_time(node_load1[5m])",
    "absent(nonexistent_metric{job=\"x\"})",
    "absent(up)",
    "changes(kube_pod_container_status_restarts_total[15m])",
    "increase(kube_pod_container_status_restarts_total[15m]) > 0",
    "deriv(node_memory_MemAvailable_bytes[10m])",
    "predict_linear(node_memory_MemAvailable_bytes[10m], 3600) < 7e9",
    "idelta(node_load1[2m])",
    "delta(node_load1[10m])",
    "sort_desc(sum by (instance) (node_load1))",
    "sort(node_load1)",
    "timestamp(node_load1)",
    "round(node_load1, 0.1)",
    "round(node_memory_MemAvailable_bytes / 1024 / 1024)",
    "count_values(\"value\", kube_node_status_condition)",
    "kube_node_status_condition{condition=\"Ready\",status=\"true\"} == 0",
    "sum by (cluster) (kube_node_status_condition{condition=\"Ready\",status=\"true\"} == bool 0)",
    "node_load1 > 1.5",
    "node_load1 offset 5m",
    "rate(node_cpu_seconds_total[5m] offset 10m)",
    "max_over_time(rate(node_cpu_seconds_total[2m])[9m50s:1m])",
    "avg_over_time(sum by (cluster) (node_load1)[9m50s:])",
    "sum by (cluster) (rate(node_cpu_seconds_total{mode!=\"idle\"}[5m])) * on (cluster) group_left () count by (cluster) (up)",
    "node_load1 * on (cluster) group_left () sum by (cluster) (up)",
    "up unless on (cluster) node_load1{instance=\"gone:9100\"}",
    "node_load1 or on () vector(0)",
    "label_replace(up, \"host\", \"$1\", \"instance\", \"(.*)-.*\")",
    "label_join(up, \"id\", \"/\", \"cluster\", \"job\")",
    "clamp_max(node_load1, 1)",
    "clamp_min(node_load1, 1)",
    "abs(deriv(node_load1[5m]))",
    "sgn(deriv(node_load1[5m]))",
    "scalar(sum(up)) * 2",
    "sum(up) + on () vector(1)",
    "count by (cluster) (node_load1{instance=\"gone:9100\"})",
    "kube_pod_info",
    "-metric_total",
    "metric_total + another_metric_total",
    "label_replace(rate({env=\"1\"}[10m]), \"my_name\", \"rate_$1\", \"__name__\", \"(.+)\")",
    "label_join(rate({env=\"1\"}[10m]), \"__name__\", \"_\", \"__name__\", \"env\")",
    "sum by (__name__) (rate({env=\"1\"}[10m]))",
    "sum by (__name__) (metric_total{env=\"1\"} or rate(metric_total{env=\"2\"}[5m]))",
    "-metric_total or -another_metric_total",
    "sum(rate({env=\"1\"}[10m])) by (env)",
    "label_replace(rate({env=\"1\"}[10m]), \"__name__\", \"rate_$1\", \"__name__\", \"(.+)\")",
    "label_join(rate({env=\"1\"}[10m]), \"my_name\", \"_\", \"__name__\")",
    "label_replace(sum by (__name__) (rate(metric_total{env=\"2\"}[5m])), \"__name__\", \"$1\", \"__name__\", \"(.+)\")",
    "sum by (__name__) (rate(metric_total{env=\"2\"}[5m]) or metric_total{env=\"1\"})",
    "sum(rate(nonexistent_total[5m]))",
    "rate(node_load1)",
    "sum by (cluster) (",
    "sum(count_over_time({__name__=~\"node_.+\"}[10m]))",
    "max by (cluster) (timestamp({job!=\"\"}))",
    "max(time() - max by (cluster, job, instance) (timestamp({job!=\"\"})))",
    "sum by (cluster) (abs({__name__=~\"node_load1|node_memory_MemAvailable_bytes\"}))",
    "count_over_time({__name__=~\"node_.+\"}[10m])",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_as_a_real_prometheus_fed_the_same_samples_does() -> Result<()> {
    let server = NatsServer::start().await?;
    let js = jetstream::new(server.client().await?);
    Topology::embedded().provision(&js).await?;
    let dir = tempfile::tempdir()?;
    let prometheus = Prometheus::start(&dir.path().join("prometheus")).await?;

    let port = free_port()?;
    let mut config = multipilot_tsdb::Config {
        data_dir: dir.path().join("tsdb"),
        listen: format!("127.0.0.1:{port}"),
        remote_write: Some(multipilot_tsdb::remote_write::Config {
            url: format!("{}/api/v1/write", prometheus.url),
            ..Default::default()
        }),
        // chunks of 50 samples: each series seals two of its 120 (read while in memory, or once the writer
        // has written them: the same answers either way)
        chunk_samples: 50,
        ..Default::default()
    };
    config.consumer.fetch_wait = Duration::from_millis(200);
    let cancel = CancellationToken::new();
    let ctx = Context::new(server.client().await?, "tsdb-differential", cancel.clone());
    let registry = ctx.registry.clone();
    let role = tokio::spawn(multipilot_tsdb::run(config, ctx));

    // 30 minutes ending on a whole minute, a little in the past (Prometheus takes remote-written samples
    // within an hour of its newest)
    let end_ms = (Utc::now().timestamp_millis() / 60_000 - 1) * 60_000;
    let base_ms = end_ms - SCRAPES * STEP_MS;
    let clusters = ["c1", "c2", "c3"];
    for c in clusters {
        publish(&js, c, scrapes(c, base_ms)).await?;
    }
    let ours = format!("http://127.0.0.1:{port}");
    let end_s = end_ms / 1000;
    // both hold every sample: the same count over the whole window, on each side
    let expected: f64 = clusters
        .iter()
        .flat_map(|c| scrapes(c, base_ms))
        .flat_map(|b| b.samples)
        .filter(|s| !s.value.is_nan())
        .count() as f64;
    // (one name at a time: over several names, dropping the name would give one labelset twice, which
    // Prometheus refuses, and the TSDB too)
    let names: std::collections::BTreeSet<String> = scrapes("c1", base_ms)[0]
        .samples
        .iter()
        .map(|s| s.name.clone())
        .collect();
    let count = async |url: &str| -> Option<f64> {
        let mut n = 0.0;
        for name in &names {
            let params = [
                ("query", format!("sum(count_over_time({name}[1h]))")),
                ("time", end_s.to_string()),
            ];
            let (_, v) = get(url, &params).await.ok()?;
            n += points(&v["data"], false).first()?.1.first()?.1;
        }
        Some(n)
    };
    for (who, url) in [("the TSDB", &ours), ("Prometheus", &prometheus.url)] {
        let q = format!("{url}/api/v1/query");
        let log = dir.path().join("prometheus/prometheus.log");
        let last = std::sync::Mutex::new(String::new());
        let sent = || {
            let mut text = String::new();
            let _ = prometheus_client::encoding::text::encode(
                &mut text,
                &registry.read().unwrap_or_else(|e| e.into_inner()),
            );
            text.lines()
                .filter(|l| l.contains("remote_write"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        multipilot_testkit::wait::eventually(
            &format!("{who} holds all {expected} samples"),
            120,
            async || {
                let n = count(&q).await;
                *last.lock().unwrap_or_else(|e| e.into_inner()) = format!("{n:?}");
                (n == Some(expected)).then_some(())
            },
        )
        .await
        .with_context(|| {
            format!(
                "{who} counted {}",
                last.lock().unwrap_or_else(|e| e.into_inner())
            )
        })
        .with_context(|| {
            format!(
                "the TSDB's remote write: {}\nPrometheus' log: {}",
                sent(),
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        })?;
    }

    let mut checked = 0;
    let mut failures = Vec::new();
    for query in QUERIES {
        let mut asks: Vec<(&str, Vec<(&str, String)>)> = [end_s, end_s - 7 * 60, end_s - 15 * 60]
            .iter()
            .map(|t| {
                (
                    "query",
                    vec![("query", query.to_string()), ("time", t.to_string())],
                )
            })
            .collect();
        if !query.starts_with("sort") {
            for step in ["15", "60"] {
                asks.push((
                    "query_range",
                    vec![
                        ("query", query.to_string()),
                        ("start", (end_s - 20 * 60).to_string()),
                        ("end", end_s.to_string()),
                        ("step", step.to_string()),
                    ],
                ));
            }
        }
        for (endpoint, params) in asks {
            let a = get(&format!("{ours}/api/v1/{endpoint}"), &params).await?;
            let b = get(&format!("{}/api/v1/{endpoint}", prometheus.url), &params).await?;
            checked += 1;
            if let Some(d) = differ(query, &a, &b) {
                failures.push(format!("{endpoint} {params:?}: {d}"));
            }
        }
    }
    eprintln!(
        "{} queries, {checked} answers compared with Prometheus, {} differ",
        QUERIES.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {checked} answers differ from Prometheus':\n{}",
        failures.len(),
        failures.join("\n")
    );
    cancel.cancel();
    role.await??;
    Ok(())
}
