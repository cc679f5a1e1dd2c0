//! Scrapes Prometheus endpoints through the API server (its own `/metrics`, and pods/services annotated
//! `prometheus.io/scrape: "true"` through the API server proxy, as Prometheus' Kubernetes discovery finds
//! them), adds the `cluster` label and publishes MetricBatch messages on `fleet.metrics.<cluster>`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use multipilot_schemas::payload::MetricBatch;
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
        for (job, path, instance) in targets {
            if cancel.is_cancelled() {
                return;
            }
            scrape_one(&ctx, &cfg, &job, &path, &instance).await;
        }
    }
}

async fn scrape_one(ctx: &ClusterCtx, cfg: &Config, job: &str, path: &str, instance: &str) {
    let req = match http::Request::get(path).body(Vec::new()) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(cluster = ctx.name(), %path, error = %e, "bad scrape path");
            return;
        }
    };
    let body = match ctx.client.request_text(req).await {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(cluster = ctx.name(), %job, %instance, error = %e, "scrape failed");
            return;
        }
    };
    let now = Utc::now();
    let labels = BTreeMap::from([
        ("cluster".to_string(), ctx.name().to_string()),
        ("job".to_string(), job.to_string()),
        ("instance".to_string(), instance.to_string()),
    ]);
    let parsed = exposition::parse(&body, now.timestamp_millis(), &labels);
    if !parsed.rejected.is_empty() {
        tracing::warn!(cluster = ctx.name(), %job, rejected = parsed.rejected.len(), first = %parsed.rejected[0].reason, "scrape had lines that did not parse");
    }
    let batch = exposition::into_batch(parsed, job, instance);
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
