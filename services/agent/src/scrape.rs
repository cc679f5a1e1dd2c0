//! Scrapes Prometheus endpoints through the API server (its own `/metrics`, and pods/services annotated
//! `prometheus.io/scrape: "true"` through the API server proxy, as Prometheus' Kubernetes discovery finds
//! them), adds the `cluster` label and publishes MetricBatch messages on `fleet.metrics.<cluster>`.
//!
//! As Prometheus does, every scrape of a target also yields `up` (1 when the scrape succeeded, 0 when it
//! failed), `scrape_duration_seconds`, `scrape_samples_scraped`, `scrape_samples_post_metric_relabeling` and
//! `scrape_series_added` under the target's labels, and a staleness marker (the NaN Prometheus writes, bits
//! `0x7ff0000000000002`) for every series that was in the target's previous scrape and is not in this one:
//! all of them when the scrape failed, and every series of a target that is no longer discovered (its `up`
//! included). Queries then stop returning a vanished series at once instead of for the 5-minute lookback.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use multipilot_schemas::payload::{MetricBatch, Sample};
use multipilot_schemas::{stable_id, subject};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::cluster::ClusterCtx;
use crate::exposition;
use crate::outbox::Class;
use crate::sink::Meta;

/// Scrape settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Seconds between scrapes (0 switches scraping off).
    pub interval_s: u32,
    /// Scrape the API server's own `/metrics`.
    pub apiserver: bool,
    /// Scrape pods and services annotated `prometheus.io/scrape: "true"`.
    pub annotated: bool,
    /// Samples per published batch (large scrapes are split to stay well under the message size limit).
    pub max_samples_per_batch: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            interval_s: 30,
            apiserver: true,
            annotated: true,
            max_samples_per_batch: 4000,
        }
    }
}

/// Prometheus' staleness marker: a NaN with this exact bit pattern (`value.StaleNaN`).
pub const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// A series of a scrape: its name and labels.
type SeriesKey = (String, BTreeMap<String, String>);

/// The series each target gave in its last scrape (name and labels), so the next one can mark what is gone.
#[derive(Debug, Default)]
pub struct Targets {
    last: HashMap<(String, String), Vec<SeriesKey>>,
}

/// What one scrape of a target brought back.
#[derive(Debug)]
pub enum Scraped {
    /// The body parsed into a batch.
    Ok(MetricBatch),
    /// The target could not be scraped.
    Failed,
}

impl Targets {
    /// Completes the batch of one scrape of (`job`, `instance`) at `at_ms` that took `took`: adds the
    /// scrape's own series, and stale markers for the series of the previous scrape that are gone.
    pub fn complete(
        &mut self,
        job: &str,
        instance: &str,
        target_labels: &BTreeMap<String, String>,
        scraped: Scraped,
        took: Duration,
        at_ms: i64,
    ) -> MetricBatch {
        let (mut batch, up) = match scraped {
            Scraped::Ok(b) => (b, 1.0),
            Scraped::Failed => (
                MetricBatch {
                    job: job.to_string(),
                    instance: instance.to_string(),
                    families: Vec::new(),
                    samples: Vec::new(),
                    rejected_lines: 0,
                },
                0.0,
            ),
        };
        let key = (job.to_string(), instance.to_string());
        let previous = self.last.remove(&key).unwrap_or_default();
        let now: HashSet<(&str, &BTreeMap<String, String>)> = batch
            .samples
            .iter()
            .map(|s| (s.name.as_str(), &s.labels))
            .collect();
        let known: HashSet<(&str, &BTreeMap<String, String>)> =
            previous.iter().map(|(n, l)| (n.as_str(), l)).collect();
        let added = now.iter().filter(|k| !known.contains(*k)).count();
        let scraped_n = batch.samples.len();
        let gone: Vec<Sample> = previous
            .iter()
            .filter(|(n, l)| !now.contains(&(n.as_str(), l)))
            .map(|(name, labels)| stale(name, labels, at_ms))
            .collect();
        let current: Vec<(String, BTreeMap<String, String>)> = batch
            .samples
            .iter()
            .map(|s| (s.name.clone(), s.labels.clone()))
            .collect();
        batch.samples.extend(gone);
        let own = [
            ("up", up),
            ("scrape_duration_seconds", took.as_secs_f64()),
            ("scrape_samples_scraped", scraped_n as f64),
            ("scrape_samples_post_metric_relabeling", scraped_n as f64),
            ("scrape_series_added", added as f64),
        ];
        batch.samples.extend(own.iter().map(|(name, v)| Sample {
            name: (*name).to_string(),
            labels: target_labels.clone(),
            value: *v,
            timestamp_ms: at_ms,
        }));
        self.last.insert(key, current);
        batch
    }

    /// Stale markers for every series of the targets not in `live` (no longer discovered), their own
    /// `up` and `scrape_*` series included; the targets are forgotten.
    pub fn vanished(
        &mut self,
        live: &HashSet<(String, String)>,
        target_labels: impl Fn(&str, &str) -> BTreeMap<String, String>,
        at_ms: i64,
    ) -> Vec<MetricBatch> {
        let gone: Vec<(String, String)> = self
            .last
            .keys()
            .filter(|k| !live.contains(*k))
            .cloned()
            .collect();
        gone.into_iter()
            .map(|(job, instance)| {
                let series = self
                    .last
                    .remove(&(job.clone(), instance.clone()))
                    .unwrap_or_default();
                let labels = target_labels(&job, &instance);
                let mut samples: Vec<Sample> =
                    series.iter().map(|(n, l)| stale(n, l, at_ms)).collect();
                samples.extend(OWN_SERIES.iter().map(|n| stale(n, &labels, at_ms)));
                MetricBatch {
                    job,
                    instance,
                    families: Vec::new(),
                    samples,
                    rejected_lines: 0,
                }
            })
            .collect()
    }
}

/// The series a scrape adds about itself.
const OWN_SERIES: [&str; 5] = [
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
];

fn stale(name: &str, labels: &BTreeMap<String, String>, at_ms: i64) -> Sample {
    Sample {
        name: name.to_string(),
        labels: labels.clone(),
        value: f64::from_bits(STALE_NAN_BITS),
        timestamp_ms: at_ms,
    }
}

fn target_labels(cluster: &str, job: &str, instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("cluster".to_string(), cluster.to_string()),
        ("job".to_string(), job.to_string()),
        ("instance".to_string(), instance.to_string()),
    ])
}

/// Runs until cancelled.
pub async fn run(ctx: Arc<ClusterCtx>, cfg: Config, cancel: CancellationToken) {
    if cfg.interval_s == 0 {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs(cfg.interval_s.into()));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::select! {
        _ = cancel.cancelled() => return,
        _ = tokio::time::sleep(Duration::from_secs(3)) => {}
    }
    let mut state = Targets::default();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mut targets: Vec<(String, String, String)> = Vec::new();
        if cfg.apiserver {
            targets.push((
                "apiserver".into(),
                "/metrics".into(),
                ctx.kube_config.cluster_url.to_string(),
            ));
        }
        if cfg.annotated {
            let view = ctx.view.read();
            for t in view.scrape.values() {
                targets.push((
                    t.job.clone(),
                    t.proxy_path(),
                    format!("{}/{}:{}", t.namespace, t.name, t.port),
                ));
            }
        }
        let live: HashSet<(String, String)> = targets
            .iter()
            .map(|(job, _, instance)| (job.clone(), instance.clone()))
            .collect();
        for (job, path, instance) in targets {
            if cancel.is_cancelled() {
                return;
            }
            scrape_one(&ctx, &cfg, &mut state, &job, &path, &instance).await;
        }
        let now = Utc::now();
        for batch in state.vanished(
            &live,
            |job, instance| target_labels(ctx.name(), job, instance),
            now.timestamp_millis(),
        ) {
            let (job, instance) = (batch.job.clone(), batch.instance.clone());
            publish(&ctx, &cfg, batch, &job, &instance, now);
        }
    }
}

async fn scrape_one(
    ctx: &ClusterCtx,
    cfg: &Config,
    state: &mut Targets,
    job: &str,
    path: &str,
    instance: &str,
) {
    let req = match http::Request::get(path).body(Vec::new()) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(cluster = ctx.name(), %path, error = %e, "bad scrape path");
            return;
        }
    };
    let started = std::time::Instant::now();
    let now = Utc::now();
    let labels = target_labels(ctx.name(), job, instance);
    let scraped = match ctx.client.request_text(req).await {
        Ok(body) => {
            let parsed = exposition::parse(&body, now.timestamp_millis(), &labels);
            if !parsed.rejected.is_empty() {
                tracing::warn!(cluster = ctx.name(), %job, rejected = parsed.rejected.len(), first = %parsed.rejected[0].reason, "scrape had lines that did not parse");
            }
            Scraped::Ok(exposition::into_batch(parsed, job, instance))
        }
        Err(e) => {
            tracing::debug!(cluster = ctx.name(), %job, %instance, error = %e, "scrape failed");
            Scraped::Failed
        }
    };
    let batch = state.complete(
        job,
        instance,
        &labels,
        scraped,
        started.elapsed(),
        now.timestamp_millis(),
    );
    publish(ctx, cfg, batch, job, instance, now);
}

/// Publishes a scrape's batch (split to `max_samples_per_batch`) through the outbox.
fn publish(
    ctx: &ClusterCtx,
    cfg: &Config,
    batch: MetricBatch,
    job: &str,
    instance: &str,
    now: chrono::DateTime<Utc>,
) {
    for (i, part) in split(batch, cfg.max_samples_per_batch)
        .into_iter()
        .enumerate()
    {
        let id = stable_id(&[
            ctx.name(),
            "metrics",
            job,
            instance,
            &now.timestamp_millis().to_string(),
            &i.to_string(),
        ]);
        if let Err(e) = ctx.sink.emit(
            Meta {
                class: Class::Metrics,
                subject: subject::metrics(ctx.name()),
                msg_id: id,
                collapse: None,
                cluster_time: now,
            },
            part,
        ) {
            tracing::error!(cluster = ctx.name(), error = %e, "metric batch lost: the outbox refused it");
        }
    }
}

/// Splits a batch into parts of at most `max` samples (families and the rejected count go with the first).
pub fn split(batch: MetricBatch, max: usize) -> Vec<MetricBatch> {
    let max = max.max(1);
    if batch.samples.len() <= max {
        return vec![batch];
    }
    let MetricBatch {
        job,
        instance,
        families,
        samples,
        rejected_lines,
    } = batch;
    samples
        .chunks(max)
        .enumerate()
        .map(|(i, chunk)| MetricBatch {
            job: job.clone(),
            instance: instance.clone(),
            families: if i == 0 { families.clone() } else { Vec::new() },
            samples: chunk.to_vec(),
            rejected_lines: if i == 0 { rejected_lines } else { 0 },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(body: &str, at: i64) -> Scraped {
        let t = target_labels("c1", "node", "n1:9100");
        Scraped::Ok(exposition::into_batch(
            exposition::parse(body, at, &t),
            "node",
            "n1:9100",
        ))
    }

    fn values(b: &MetricBatch, name: &str) -> Vec<(BTreeMap<String, String>, u64)> {
        b.samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| (s.labels.clone(), s.value.to_bits()))
            .collect()
    }

    #[test]
    fn a_scrape_adds_up_and_its_own_series_and_marks_what_went_stale() {
        let t = target_labels("c1", "node", "n1:9100");
        let mut st = Targets::default();
        let body = "# TYPE load gauge\nload{cpu=\"0\"} 1\nload{cpu=\"1\"} 2\n";
        let first = st.complete(
            "node",
            "n1:9100",
            &t,
            scrape(body, 1000),
            Duration::from_millis(250),
            1000,
        );
        assert_eq!(values(&first, "up"), vec![(t.clone(), 1f64.to_bits())]);
        assert_eq!(
            values(&first, "scrape_duration_seconds"),
            vec![(t.clone(), 0.25f64.to_bits())]
        );
        assert_eq!(
            values(&first, "scrape_samples_scraped"),
            vec![(t.clone(), 2f64.to_bits())]
        );
        assert_eq!(
            values(&first, "scrape_series_added"),
            vec![(t.clone(), 2f64.to_bits())]
        );
        assert!(first.samples.iter().all(|s| !s.value.is_nan()));

        // cpu 1 is gone from the next scrape: a stale marker for it, nothing for cpu 0
        let second = st.complete(
            "node",
            "n1:9100",
            &t,
            scrape("load{cpu=\"0\"} 3\n", 2000),
            Duration::from_millis(10),
            2000,
        );
        let mut cpu1 = t.clone();
        cpu1.insert("cpu".into(), "1".into());
        let mut cpu0 = t.clone();
        cpu0.insert("cpu".into(), "0".into());
        assert_eq!(
            values(&second, "load"),
            vec![(cpu0.clone(), 3f64.to_bits()), (cpu1, STALE_NAN_BITS)]
        );
        assert_eq!(
            values(&second, "scrape_series_added"),
            vec![(t.clone(), 0f64.to_bits())]
        );

        // a failed scrape: up 0, and every series of the last scrape is stale
        let failed = st.complete(
            "node",
            "n1:9100",
            &t,
            Scraped::Failed,
            Duration::from_millis(5),
            3000,
        );
        assert_eq!(values(&failed, "up"), vec![(t.clone(), 0f64.to_bits())]);
        assert_eq!(values(&failed, "load"), vec![(cpu0, STALE_NAN_BITS)]);
        assert_eq!(
            values(&failed, "scrape_samples_scraped"),
            vec![(t.clone(), 0f64.to_bits())]
        );
    }

    #[test]
    fn a_target_no_longer_discovered_has_all_its_series_marked_stale() {
        let t = target_labels("c1", "node", "n1:9100");
        let mut st = Targets::default();
        st.complete(
            "node",
            "n1:9100",
            &t,
            scrape("load 1\n", 1000),
            Duration::from_millis(1),
            1000,
        );
        let live = HashSet::from([("node".to_string(), "n1:9100".to_string())]);
        assert!(
            st.vanished(&live, |j, i| target_labels("c1", j, i), 2000)
                .is_empty()
        );
        let gone = st.vanished(&HashSet::new(), |j, i| target_labels("c1", j, i), 2000);
        assert_eq!(gone.len(), 1);
        let names: BTreeMap<&str, u64> = gone[0]
            .samples
            .iter()
            .map(|s| (s.name.as_str(), s.value.to_bits()))
            .collect();
        assert_eq!(
            names.keys().copied().collect::<Vec<_>>(),
            vec![
                "load",
                "scrape_duration_seconds",
                "scrape_samples_post_metric_relabeling",
                "scrape_samples_scraped",
                "scrape_series_added",
                "up"
            ]
        );
        assert!(names.values().all(|b| *b == STALE_NAN_BITS));
        assert!(gone[0].samples.iter().all(|s| s.timestamp_ms == 2000));
        // forgotten: nothing more to mark
        assert!(
            st.vanished(&HashSet::new(), |j, i| target_labels("c1", j, i), 3000)
                .is_empty()
        );
    }
}
