//! TSDB benchmark (run by `loadtest/bench/tsdb`, release build):
//!
//! 1. `ingest`: end-to-end ingest from JetStream: 30 clusters × 1,000 series, N scrapes each, published to a
//!    local nats-server first, then the `tsdb` role consumes them; samples/s until the last message is acked.
//! 2. `query`: `sum by (cluster) (rate(x[5m]))` over 30 clusters × 1,000 series × H hours at a 30 s step,
//!    `TSDB_BENCH_RUNS` times (default 5: each time, then median, min and max); `TSDB_BENCH_DIR` keeps the
//!    loaded store for the next run.
//! 3. `memory`: resident memory with 1M active series (3 scrapes each).
//! 4. `decode`: CPU per sample of decoding one 1,000-sample scrape message N times, into the owned
//!    `MetricBatch` (and dropping it) and into the ingester's [`ScrapeBatch`], side by side.
//! 5. `fleet-memory`: resident memory and bytes per series with N clusters' worth of real exporter series:
//!    the fixtures' kube-state-metrics and node-exporter scrapes (`../shared/fixtures/metrics/`), parsed as
//!    the agent parses them, each cluster's pod names, uids, IPs, nodes and instances made its own (names,
//!    namespaces and containers stay shared, as across real clusters); 3 scrapes each, through
//!    [`Store::append_scrape`] as the role appends. jemalloc, as the `multipilot` binary.
//!
//! Usage: `tsdb-bench [ingest SCRAPES] [query HOURS] [memory SERIES] [decode N] [fleet-memory CLUSTERS]`
//! (default: the first three: 40, 24, 1000000).

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

/// jemalloc, as the `multipilot` binary: memory figures are the role's.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use async_nats::jetstream;
use chrono::Utc;
use multipilot_bus::metrics::BusMetrics;
use multipilot_bus::publish::{Outgoing, Publisher};
use multipilot_bus::topology::Topology;
use multipilot_runtime::Context;
use multipilot_schemas::payload::{MetricBatch, Sample};
use multipilot_schemas::{Envelope, subject};
use multipilot_testkit::{NatsServer, free_port};
use multipilot_tsdb::batch::ScrapeBatch;
use multipilot_tsdb::promql::{Engine, Value};
use multipilot_tsdb::store::{Options, Store};
use tokio_util::sync::CancellationToken;

const CLUSTERS: usize = 30;
const SERIES: usize = 1000;

fn scrape(cluster: usize, t: i64, k: i64) -> Vec<Sample> {
    (0..SERIES)
        .map(|i| Sample {
            name: "x".into(),
            labels: BTreeMap::from([
                ("cluster".to_string(), format!("c{cluster:02}")),
                ("job".to_string(), "node".to_string()),
                ("instance".to_string(), format!("n{}", i / 100)),
                ("series".to_string(), i.to_string()),
            ]),
            // A counter: most rise by a few per scrape, some stay flat.
            value: if i % 4 == 0 {
                7.0
            } else {
                (k * (i as i64 % 13 + 1)) as f64
            },
            timestamp_ms: t,
        })
        .collect()
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

async fn ingest(scrapes: i64) -> Result<()> {
    let server = NatsServer::start().await?;
    let js = jetstream::new(server.client().await?);
    Topology::embedded().provision(&js).await?;
    let t0 = Utc::now().timestamp_millis() - scrapes * 30_000;
    let mut publisher = Publisher::new(js.clone(), 256, BusMetrics::default());
    let mut messages = 0u64;
    for k in 0..scrapes {
        for c in 0..CLUSTERS {
            let cluster = format!("c{c:02}");
            let batch = MetricBatch {
                job: "node".into(),
                instance: "n".into(),
                families: Vec::new(),
                samples: scrape(c, t0 + k * 30_000, k),
                rejected_lines: 0,
            };
            let env = Envelope::new(&cluster, "bench", Utc::now(), k as u64, batch);
            let msg = Outgoing::envelope(subject::metrics(&cluster), format!("b-{c}-{k}"), &env)?;
            publisher.send((), msg).await;
            messages += 1;
        }
    }
    publisher.flush().await;
    let samples = messages * SERIES as u64;
    println!("ingest: {messages} messages, {samples} samples published");

    let dir = tempfile::tempdir()?;
    let mut config = multipilot_tsdb::Config {
        data_dir: dir.path().to_path_buf(),
        listen: format!("127.0.0.1:{}", free_port()?),
        ..Default::default()
    };
    config.consumer.fetch_wait = Duration::from_millis(100);
    let cancel = CancellationToken::new();
    let ctx = Context::new(server.client().await?, "bench", cancel.clone());
    let stream = js.get_stream("FLEET_METRICS").await?;
    let consumer: jetstream::consumer::Consumer<jetstream::consumer::pull::Config> = stream
        .get_consumer("tsdb")
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let started = Instant::now();
    let role = tokio::spawn(multipilot_tsdb::run(config, ctx));
    loop {
        let info = consumer.get_info().await?;
        if info.ack_floor.stream_sequence >= messages {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "ingest: {samples} samples end to end in {secs:.2} s = {:.0} samples/s (acked, durable)",
        samples as f64 / secs
    );
    cancel.cancel();
    role.await??;
    Ok(())
}

fn query(hours: i64, rt: tokio::runtime::Handle) -> Result<()> {
    // `TSDB_BENCH_DIR` keeps the loaded store between runs (loading 24 h takes minutes); a marker file
    // says it is complete.
    let tmp = tempfile::tempdir()?;
    let dir = std::env::var_os("TSDB_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let marker = dir.join(format!("loaded-{hours}h"));
    let store = Arc::new(Store::open(&dir, Options::default())?);
    let scrapes = hours * 120;
    let t0 = 1_750_000_000_000i64;
    if marker.exists() {
        println!("query: reusing the store loaded in {}", dir.display());
    } else {
        let started = Instant::now();
        for k in 0..scrapes {
            for c in 0..CLUSTERS {
                store.append("", &scrape(c, t0 + k * 30_000, k))?;
            }
            // As the consumer does after each batch (keeps the pending WAL record small).
            rt.block_on(store.commit())?;
        }
        rt.block_on(store.checkpoint())?;
        let total = scrapes * (CLUSTERS * SERIES) as i64;
        println!(
            "query: loaded {total} samples in {:.1} s (store only, {:.0}/s)",
            started.elapsed().as_secs_f64(),
            total as f64 / started.elapsed().as_secs_f64()
        );
        std::fs::write(&marker, b"")?;
    }
    let engine = Engine::new(store, Duration::from_secs(300));
    let end = t0 + (scrapes - 1) * 30_000;
    let q = "sum by (cluster) (rate(x[5m]))";
    let runs: usize = std::env::var("TSDB_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let mut times = Vec::new();
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        let v = engine.range(q, t0, end, 30_000)?;
        let secs = started.elapsed().as_secs_f64();
        times.push(secs);
        let Value::Vector(series) = v else {
            anyhow::bail!("not a vector")
        };
        let points: usize = series
            .iter()
            .map(|s| s.values.iter().flatten().count())
            .sum();
        println!(
            "query: {q} over {CLUSTERS}×{SERIES} series × {hours} h, 30 s step: {} series, {points} points in {secs:.3} s",
            series.len()
        );
    }
    times.sort_by(f64::total_cmp);
    println!(
        "query: {} runs: median {:.3} s, min {:.3} s, max {:.3} s",
        times.len(),
        times[times.len() / 2],
        times[0],
        times[times.len() - 1]
    );
    Ok(())
}

fn memory(series: usize) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    let before = status_kib("VmRSS:");
    let t0 = 1_750_000_000_000i64;
    for k in 0..3i64 {
        let mut batch = Vec::with_capacity(10_000);
        for i in 0..series {
            batch.push(Sample {
                name: "node_metric".into(),
                labels: BTreeMap::from([
                    ("cluster".to_string(), format!("c{:02}", i % 30)),
                    ("instance".to_string(), format!("node-{}", i / 500)),
                    ("id".to_string(), i.to_string()),
                ]),
                value: (k * i as i64) as f64,
                timestamp_ms: t0 + k * 30_000,
            });
            if batch.len() == 10_000 {
                store.append("", &batch)?;
                batch.clear();
            }
        }
        store.append("", &batch)?;
    }
    println!(
        "memory: {} active series: RSS {} MiB (was {} MiB), peak {} MiB",
        store.series_count(),
        status_kib("VmRSS:") / 1024,
        before / 1024,
        status_kib("VmHWM:") / 1024
    );
    Ok(())
}

/// Labels whose values differ from cluster to cluster (the rest, names included, are shared).
const PER_CLUSTER: &[&str] = &[
    "pod",
    "uid",
    "pod_ip",
    "host_ip",
    "node",
    "instance",
    "internal_ip",
    "provider_id",
    "system_uuid",
    "kernel_version",
    "boot_id",
    "machine_id",
    "device",
    "address",
];

async fn fleet_memory(clusters: usize) -> Result<()> {
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/metrics");
    let mut scrapes = Vec::new();
    for (job, file) in [
        ("kube-state-metrics", "kube-state-metrics-v1.35.prom"),
        ("node-exporter", "node-exporter.prom"),
    ] {
        let body = std::fs::read_to_string(fixtures.join(file))
            .with_context(|| format!("reading {}", fixtures.join(file).display()))?;
        let parsed = multipilot_agent::exposition::parse(&body, 0, &BTreeMap::new());
        scrapes.push((job, parsed.samples));
    }
    let header = <MetricBatch as multipilot_schemas::Payload>::schema_header();
    let dir = tempfile::tempdir()?;
    // the role's page cache (`tsdb.cache_bytes`' default)
    let cache_bytes = multipilot_tsdb::Config::default().cache_bytes;
    let store = Store::open(
        dir.path(),
        Options {
            cache_bytes,
            ..Options::default()
        },
    )?;
    let before = status_kib("VmRSS:");
    let t0 = 1_750_000_000_000i64;
    let mut samples = 0usize;
    let started = Instant::now();
    for k in 0..3i64 {
        for c in 0..clusters {
            let cluster = format!("prod-{c:03}");
            for (job, fixture) in &scrapes {
                let batch = MetricBatch {
                    job: (*job).into(),
                    instance: format!("{job}.{cluster}:8080"),
                    families: Vec::new(),
                    samples: fixture
                        .iter()
                        .map(|s| Sample {
                            name: s.name.clone(),
                            labels: s
                                .labels
                                .iter()
                                .map(|(k, v)| {
                                    let v = if PER_CLUSTER.contains(&k.as_str()) {
                                        format!("{v}-{c:03}")
                                    } else {
                                        v.clone()
                                    };
                                    (k.clone(), v)
                                })
                                .collect(),
                            value: s.value + k as f64,
                            timestamp_ms: t0 + k * 30_000,
                        })
                        .collect(),
                    rejected_lines: 0,
                };
                samples += batch.samples.len();
                let env = Envelope::new(&cluster, "bench", Utc::now(), 1, batch);
                let body = multipilot_schemas::encode(&env)?;
                let scrape: Envelope<ScrapeBatch> =
                    multipilot_schemas::decode(None, Some(&header), &body, usize::MAX)?;
                store.append_scrape(&cluster, &scrape.payload)?;
            }
        }
        store.commit().await?;
    }
    let elapsed = started.elapsed();
    let series = store.series_count();
    // jemalloc returns freed pages after its decay time (10 s): what stays is what the store holds
    tokio::time::sleep(Duration::from_secs(12)).await;
    let rss = status_kib("VmRSS:");
    println!(
        "fleet-memory: {clusters} clusters, {series} series ({samples} samples in {:.1} s): RSS {} MiB 12 s later \
         (was {} MiB, peak {} MiB), {:.0} bytes per series",
        elapsed.as_secs_f64(),
        rss / 1024,
        before / 1024,
        status_kib("VmHWM:") / 1024,
        (rss.saturating_sub(before) * 1024) as f64 / series.max(1) as f64
    );
    Ok(())
}

/// Decoding one scrape message `n` times each way; prints ns per sample.
fn decode(n: usize) -> Result<()> {
    let t = Utc::now().timestamp_millis();
    let env = Envelope::new(
        "c00",
        "agent-c00",
        Utc::now(),
        1,
        MetricBatch {
            job: "node".into(),
            instance: "n0:9100".into(),
            families: Vec::new(),
            samples: scrape(0, t, 1),
            rejected_lines: 0,
        },
    );
    let body = multipilot_schemas::encode(&env)?;
    let header = <MetricBatch as multipilot_schemas::Payload>::schema_header();
    let per_sample = |f: &dyn Fn() -> Result<usize>| -> Result<f64> {
        let started = Instant::now();
        let mut samples = 0;
        for _ in 0..n {
            samples += f()?;
        }
        Ok(started.elapsed().as_nanos() as f64 / samples.max(1) as f64)
    };
    let decode_owned = || -> Result<usize> {
        let e: Envelope<MetricBatch> =
            multipilot_schemas::decode(None, Some(&header), &body, usize::MAX)?;
        Ok(e.payload.samples.len())
    };
    let decode_compact = || -> Result<usize> {
        let e: Envelope<ScrapeBatch> =
            multipilot_schemas::decode(None, Some(&header), &body, usize::MAX)?;
        Ok(e.payload.len())
    };
    // warm both once, then alternate twice so neither side gets only the cold or the hot caches
    decode_owned()?;
    decode_compact()?;
    let (mut owned, mut compact) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        owned.push(per_sample(&decode_owned)?);
        compact.push(per_sample(&decode_compact)?);
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "decode: {} bytes, {} samples per message, {n} messages each way: owned MetricBatch {:.1} ns/sample, \
         ScrapeBatch {:.1} ns/sample ({:.2}x)",
        body.len(),
        SERIES,
        best(&owned),
        best(&compact),
        best(&owned) / best(&compact)
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str, default: i64| -> Result<Option<i64>> {
        if args.is_empty() {
            return Ok(Some(default));
        }
        match args.iter().position(|a| a == name) {
            Some(i) => Ok(Some(
                args.get(i + 1)
                    .map(|v| v.parse())
                    .transpose()?
                    .unwrap_or(default),
            )),
            None => Ok(None),
        }
    };
    if let Some(n) = arg("ingest", 40)? {
        ingest(n).await.context("ingest")?;
    }
    if let Some(h) = arg("query", 24)? {
        let rt = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || query(h, rt))
            .await?
            .context("query")?;
    }
    if !args.is_empty()
        && let Some(n) = arg("decode", 20_000)?
    {
        decode(n as usize).context("decode")?;
    }
    if !args.is_empty()
        && let Some(n) = arg("fleet-memory", 30)?
    {
        fleet_memory(n as usize).await.context("fleet-memory")?;
    }
    if let Some(n) = arg("memory", 1_000_000)? {
        tokio::task::spawn_blocking(move || memory(n as usize))
            .await?
            .context("memory")?;
    }
    Ok(())
}
