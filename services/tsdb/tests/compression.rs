//! Bytes per sample on disk for the real node-exporter and kube-state-metrics scrapes in
//! `../shared/fixtures/metrics/`, replayed 360 times 30 s apart with realistic changes. This is a size
//! property of the encoding (deterministic for a seed), not a timing.
//!
//! The replay model: scrape timestamps 30 s apart with ±3 ms jitter (a ticker's wake-up jitter). Counters
//! (counter families, histogram/summary `_bucket`/`_sum`/`_count`): zero counters stay mostly idle (2% of
//! scrapes add 1); non-zero ones increase on half the scrapes, integer counters by integers scaled to their
//! size, fractional ones (seconds) by multiples of 0.01. Gauges: a quarter drift (integers by small
//! steps, byte-like values by 4 KiB pages, fractions rounded to 3 decimals); the rest (info, state,
//! capacity, spec metrics) are constant, as they are in a real cluster.

use std::collections::{BTreeMap, HashMap};

use multipilot_schemas::payload::Sample;
use multipilot_tsdb::store::{Options, Store};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SCRAPES: i64 = 360;

/// One exposition line: name, labels, value.
type Line = (String, BTreeMap<String, String>, f64);

/// Lines and `# TYPE`s — a minimal text-format reader for the fixtures.
fn parse(text: &str) -> (Vec<Line>, HashMap<String, String>) {
    let mut types = HashMap::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            if let (Some(n), Some(t)) = (it.next(), it.next()) {
                types.insert(n.to_string(), t.to_string());
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).expect("name");
        let name = line[..name_end].to_string();
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if rest.starts_with('{') {
            let mut chars = rest[1..].char_indices();
            let mut key = String::new();
            let mut val = String::new();
            let mut in_val = false;
            let mut end = 0;
            while let Some((i, c)) = chars.next() {
                match (in_val, c) {
                    (false, '}') => {
                        end = i + 2;
                        break;
                    }
                    (false, '=') => {}
                    (false, '"') => in_val = true,
                    (false, ',') => {}
                    (false, c) => key.push(c),
                    (true, '\\') => {
                        if let Some((_, n)) = chars.next() {
                            val.push(if n == 'n' { '\n' } else { n });
                        }
                    }
                    (true, '"') => {
                        labels.insert(std::mem::take(&mut key), std::mem::take(&mut val));
                        in_val = false;
                    }
                    (true, c) => val.push(c),
                }
            }
            rest = &rest[end..];
        }
        let value: f64 = match rest.split_whitespace().next().expect("value") {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().expect("number"),
        };
        out.push((name, labels, value));
    }
    (out, types)
}

fn is_counter(name: &str, types: &HashMap<String, String>) -> bool {
    if types.get(name).is_some_and(|t| t == "counter") {
        return true;
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && types
                .get(base)
                .is_some_and(|t| t == "histogram" || t == "summary")
        {
            return true;
        }
    }
    false
}

#[derive(Clone, Copy)]
enum Kind {
    IdleCounter,
    IntCounter,
    FracCounter,
    Constant,
    IntGauge,
    ByteGauge,
    FracGauge,
}

#[test]
fn fixture_scrapes_replayed_cost_at_most_two_bytes_per_sample() {
    let root = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/fixtures/metrics/"
    );
    let mut rng = StdRng::seed_from_u64(6);
    let mut series = Vec::new();
    for file in ["node-exporter.prom", "kube-state-metrics-v1.35.prom"] {
        let text = std::fs::read_to_string(format!("{root}{file}")).expect("fixture");
        let (samples, types) = parse(&text);
        for (name, labels, v) in samples {
            let kind = if is_counter(&name, &types) {
                if v == 0.0 {
                    Kind::IdleCounter
                } else if v.fract() == 0.0 {
                    Kind::IntCounter
                } else {
                    Kind::FracCounter
                }
            } else if rng.random_bool(0.75) || !v.is_finite() {
                Kind::Constant
            } else if v.fract() != 0.0 {
                Kind::FracGauge
            } else if v >= 1e6 {
                Kind::ByteGauge
            } else {
                Kind::IntGauge
            };
            series.push((name, labels, v, kind));
        }
    }
    assert!(
        series.len() > 4000,
        "fixtures hold {} samples",
        series.len()
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), Options::default()).expect("open");
    let base = 1_750_000_000_000i64;
    let mut total = 0u64;
    for scrape in 0..SCRAPES {
        let t = base + scrape * 30_000 + rng.random_range(-3..=3);
        let mut batch = Vec::with_capacity(series.len());
        for (name, labels, v, kind) in &mut series {
            if scrape > 0 {
                *v = match *kind {
                    Kind::IdleCounter if rng.random_bool(0.02) => *v + 1.0,
                    Kind::IntCounter if rng.random_bool(0.5) => {
                        *v + rng.random_range(1.0..(*v * 1e-4).max(2.0)).floor()
                    }
                    Kind::FracCounter if rng.random_bool(0.5) => {
                        ((*v + rng.random_range(0.0..1.5)) * 100.0).round() / 100.0
                    }
                    Kind::IntGauge if rng.random_bool(0.3) => {
                        (*v + rng.random_range(-2.0f64..=2.0).round()).max(0.0)
                    }
                    Kind::ByteGauge if rng.random_bool(0.5) => {
                        *v + 4096.0 * rng.random_range(-64.0f64..64.0).round()
                    }
                    Kind::FracGauge if rng.random_bool(0.5) => {
                        ((*v * (1.0 + rng.random_range(-0.01..0.01))) * 1000.0).round() / 1000.0
                    }
                    _ => *v,
                };
            }
            batch.push(Sample {
                name: name.clone(),
                labels: labels.clone(),
                value: *v,
                timestamp_ms: t,
            });
        }
        total += batch.len() as u64;
        let stats = store.append("fixture", &batch).expect("append");
        assert_eq!(
            stats.appended,
            batch.len() as u64,
            "scrape {scrape}: {stats:?}"
        );
    }
    let (bytes, samples) = store.chunk_stats().expect("stats");
    // 360 scrapes at 120 samples per chunk: two sealed chunks per series, the third still open in the head.
    assert_eq!(samples, total / 3 * 2);
    let per_sample = bytes as f64 / samples as f64;
    eprintln!(
        "{} series, {samples} sealed samples, {bytes} bytes of chunks and keys: {per_sample:.3} bytes/sample",
        series.len()
    );
    assert!(
        per_sample <= 2.0,
        "{per_sample:.3} bytes/sample on disk exceeds the 2-byte target"
    );
}
