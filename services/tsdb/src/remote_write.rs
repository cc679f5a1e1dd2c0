//! Optional scale-out output: forwards ingested samples to a Prometheus remote-write 1.0 endpoint
//! (protobuf `WriteRequest`, snappy block compression, `X-Prometheus-Remote-Write-Version: 0.1.0`).
//!
//! Ingestion never waits for the remote end: samples go into a bounded queue and are dropped (counted) when
//! it is full. Sends are retried with exponential backoff on network errors, 5xx and 429; other 4xx
//! answers drop the request (the receiver will never take it). Delivery is at-least-once: a batch
//! redelivered from JetStream after a crash is forwarded again, which remote-write receivers accept.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::Metrics;
use crate::store::Labels;

/// Remote-write settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Endpoint, e.g. `http://mimir:8080/api/v1/push`.
    pub url: String,
    /// Most samples in one request.
    pub max_samples_per_send: usize,
    /// Samples the queue holds before new ones are dropped.
    pub queue_samples: usize,
    /// Request timeout.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Longest wait between retries.
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            url: String::new(),
            max_samples_per_send: 2000,
            queue_samples: 200_000,
            timeout: Duration::from_secs(30),
            retry_max: Duration::from_secs(30),
        }
    }
}

/// Remote-write protobuf messages (`prometheus/prompb/types.proto`, `remote.proto`).
pub mod proto {
    /// `prometheus.WriteRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WriteRequest {
        /// Series with their samples.
        #[prost(message, repeated, tag = "1")]
        pub timeseries: Vec<TimeSeries>,
    }

    /// `prometheus.TimeSeries`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TimeSeries {
        /// Labels, sorted by name, `__name__` included.
        #[prost(message, repeated, tag = "1")]
        pub labels: Vec<Label>,
        /// Samples, oldest first.
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<Sample>,
    }

    /// `prometheus.Label`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        /// Name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// Value.
        #[prost(string, tag = "2")]
        pub value: String,
    }

    /// `prometheus.Sample`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Value.
        #[prost(double, tag = "1")]
        pub value: f64,
        /// Milliseconds since the epoch.
        #[prost(int64, tag = "2")]
        pub timestamp: i64,
    }
}

/// The ingest side of the output: offers samples to the queue without waiting.
#[derive(Debug, Clone)]
pub struct Sender {
    tx: mpsc::Sender<Vec<proto::TimeSeries>>,
    metrics: Metrics,
}

impl Sender {
    /// Queues one sample per labels set; drops (and counts) what the queue has no room for.
    pub fn offer(&self, samples: Vec<(Labels, i64, f64)>) {
        if samples.is_empty() {
            return;
        }
        let n = samples.len() as u64;
        let series = samples
            .into_iter()
            .map(|(labels, t, v)| proto::TimeSeries {
                labels: labels
                    .into_iter()
                    .map(|(name, value)| proto::Label { name, value })
                    .collect(),
                samples: vec![proto::Sample {
                    value: v,
                    timestamp: t,
                }],
            })
            .collect();
        if self.tx.try_send(series).is_err() {
            self.metrics.remote_write("dropped", n);
        }
    }
}

/// Starts the sender task; it runs until `cancel` fires.
pub fn spawn(config: Config, metrics: Metrics, cancel: CancellationToken) -> Sender {
    // The queue counts messages of about one scrape; size it in samples assuming ~500 per scrape.
    let (tx, rx) = mpsc::channel((config.queue_samples / 500).max(1));
    tokio::spawn(send_loop(config, metrics.clone(), rx, cancel));
    Sender { tx, metrics }
}

/// Encodes and compresses a request body.
pub fn encode(series: Vec<proto::TimeSeries>) -> Result<Vec<u8>, snap::Error> {
    let body = prost::Message::encode_to_vec(&proto::WriteRequest { timeseries: series });
    snap::raw::Encoder::new().compress_vec(&body)
}

async fn send_loop(
    config: Config,
    metrics: Metrics,
    mut rx: mpsc::Receiver<Vec<proto::TimeSeries>>,
    cancel: CancellationToken,
) {
    let client = match reqwest::Client::builder().timeout(config.timeout).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "remote write disabled: no HTTP client");
            return;
        }
    };
    let mut pending: Vec<proto::TimeSeries> = Vec::new();
    loop {
        if pending.is_empty() {
            tokio::select! {
                _ = cancel.cancelled() => return,
                got = rx.recv() => match got {
                    Some(s) => pending.extend(s),
                    None => return,
                },
            }
        }
        while pending.len() < config.max_samples_per_send {
            match rx.try_recv() {
                Ok(s) => pending.extend(s),
                Err(_) => break,
            }
        }
        let take = pending.len().min(config.max_samples_per_send.max(1));
        let batch: Vec<proto::TimeSeries> = pending.drain(..take).collect();
        let n = batch.len() as u64;
        let body = match encode(merge_series(batch)) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "remote write: compression failed; samples dropped");
                metrics.remote_write("failed", n);
                continue;
            }
        };
        let mut wait = Duration::from_millis(100);
        loop {
            let sent = client
                .post(&config.url)
                .header("Content-Encoding", "snappy")
                .header("Content-Type", "application/x-protobuf")
                .header("X-Prometheus-Remote-Write-Version", "0.1.0")
                .header("User-Agent", "multipilot-tsdb")
                .body(body.clone())
                .send()
                .await;
            let retry = match sent {
                Ok(r) if r.status().is_success() => {
                    metrics.remote_write("sent", n);
                    break;
                }
                Ok(r) if r.status().is_server_error() || r.status().as_u16() == 429 => {
                    format!("status {}", r.status())
                }
                Ok(r) => {
                    tracing::error!(status = %r.status(), samples = n, "remote write refused; samples dropped");
                    metrics.remote_write("failed", n);
                    break;
                }
                Err(e) => e.to_string(),
            };
            tracing::warn!(reason = %retry, ?wait, "remote write failed; retrying");
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(config.retry_max);
        }
    }
}

/// Puts the samples of the same series into one `TimeSeries`, oldest first.
fn merge_series(batch: Vec<proto::TimeSeries>) -> Vec<proto::TimeSeries> {
    let mut by_labels: BTreeMap<Vec<(String, String)>, Vec<proto::Sample>> = BTreeMap::new();
    for ts in batch {
        let key = ts
            .labels
            .into_iter()
            .map(|l| (l.name, l.value))
            .collect::<Vec<_>>();
        by_labels.entry(key).or_default().extend(ts.samples);
    }
    by_labels
        .into_iter()
        .map(|(labels, mut samples)| {
            samples.sort_by_key(|s| s.timestamp);
            proto::TimeSeries {
                labels: labels
                    .into_iter()
                    .map(|(name, value)| proto::Label { name, value })
                    .collect(),
                samples,
            }
        })
        .collect()
}
