//! Delivery: pending notifications go out per receiver under its rate limit (governor) and concurrency
//! cap; failures are retried with exponential backoff and jitter, and dead-lettered after `max_attempts`
//! (or at once when the receiver says the request itself is wrong, a 4xx other than 408/429).
//!
//! Only notifications made durable are sent (the dispatcher raises the watermark after its flush), so a
//! crash can't send something a restart would then create again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use chrono::{DateTime, Utc};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use multipilot_schemas::payload::{AlertState, DeadLetter, Notification};
use multipilot_schemas::{Envelope, subject};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use rand::Rng;
use serde_json::json;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::{Delivery, Receiver, Routing};
use crate::store::{self, Pending, Store};

/// Header carrying the notification id on every HTTP delivery, so a receiver can drop the rare re-send
/// after a crash between its 2xx and our bookkeeping.
pub const HEADER_NOTIFICATION_ID: &str = "X-Multipilot-Notification-Id";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    receiver: String,
    integration: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByReceiver {
    receiver: String,
}

/// Per-receiver metrics (`multipilot_alerts_*`).
#[derive(Clone, Debug)]
pub struct Metrics {
    attempts: Family<Outcome, Counter>,
    pending: Family<ByReceiver, Gauge>,
    latency: Family<ByReceiver, Histogram>,
    checkpoint: Gauge,
}

impl Metrics {
    /// Creates and registers them.
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            attempts: Family::default(),
            pending: Family::default(),
            latency: Family::new_with_constructor(|| {
                Histogram::new([0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0])
            }),
            checkpoint: Gauge::default(),
        };
        registry.register(
            "multipilot_alerts_deliveries",
            "Delivery attempts by receiver, integration and outcome (sent, failed, dead)",
            m.attempts.clone(),
        );
        registry.register(
            "multipilot_alerts_pending",
            "Notifications waiting for delivery, by receiver",
            m.pending.clone(),
        );
        registry.register(
            "multipilot_alerts_delivery_seconds",
            "Time of one delivery attempt, by receiver",
            m.latency.clone(),
        );
        registry.register(
            "multipilot_alerts_checkpoint_sequence",
            "The FLEET_INCIDENTS sequence through which the alerts are on disk (the last checkpoint's mark); \
             a restart takes in again what came after it",
            m.checkpoint.clone(),
        );
        m
    }

    /// Records a checkpoint's mark.
    pub fn checkpointed(&self, through: u64) {
        self.checkpoint
            .set(i64::try_from(through).unwrap_or(i64::MAX));
    }

    /// Attempts with this outcome so far.
    pub fn count(&self, receiver: &str, integration: &str, outcome: &str) -> u64 {
        self.attempts
            .get_or_create(&Outcome {
                receiver: receiver.into(),
                integration: integration.into(),
                outcome: outcome.into(),
            })
            .get()
    }
}

struct Lane {
    limiter: Option<DefaultDirectRateLimiter>,
    slots: Arc<Semaphore>,
    delivery: Delivery,
}

/// A failed attempt.
#[derive(Debug)]
enum Failure {
    /// Worth another try.
    Retry(String),
    /// Will never work.
    Fatal(String),
    /// Our own bus can't take it now (disconnected, or JetStream not answering): not the receiver's
    /// failure, so it does not use up an attempt; the notification waits (durably) until the bus is back.
    BusDown(String),
}

/// The delivery loop.
pub struct Deliverer {
    store: Store,
    routing: Arc<Routing>,
    http: reqwest::Client,
    js: async_nats::jetstream::Context,
    lanes: HashMap<String, Arc<Lane>>,
    inflight: Arc<Mutex<HashSet<String>>>,
    /// Raised by the dispatcher after it made notifications durable (created_at, ns).
    pub watermark: Arc<AtomicI64>,
    /// Wakes the loop.
    pub wake: Arc<Notify>,
    metrics: Metrics,
    instance: String,
}

impl std::fmt::Debug for Deliverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer").finish_non_exhaustive()
    }
}

fn backoff(d: &Delivery, attempts: u32) -> Duration {
    let exp = attempts.saturating_sub(1).min(20);
    let base = d
        .backoff_initial
        .saturating_mul(2u32.saturating_pow(exp))
        .min(d.backoff_max);
    base.mul_f64(rand::rng().random_range(0.8..1.2))
}

impl Deliverer {
    /// A deliverer for the routing's receivers.
    pub fn new(
        store: Store,
        routing: Arc<Routing>,
        js: async_nats::jetstream::Context,
        metrics: Metrics,
        instance: String,
    ) -> Result<Deliverer, reqwest::Error> {
        let lanes = routing
            .receivers
            .iter()
            .map(|r| {
                let d = r.delivery.clone();
                let limiter = NonZeroU32::new(d.rate_per_second).map(|rate| {
                    let burst = NonZeroU32::new(d.burst).unwrap_or(rate);
                    RateLimiter::direct(Quota::per_second(rate).allow_burst(burst))
                });
                (
                    r.name.clone(),
                    Arc::new(Lane {
                        limiter,
                        slots: Arc::new(Semaphore::new(d.concurrency)),
                        delivery: d,
                    }),
                )
            })
            .collect();
        Ok(Deliverer {
            store,
            routing,
            http: reqwest::Client::builder()
                .user_agent(concat!("multipilot-alerts/", env!("CARGO_PKG_VERSION")))
                .build()?,
            js,
            lanes,
            inflight: Arc::default(),
            watermark: Arc::new(AtomicI64::new(
                Utc::now().timestamp_nanos_opt().unwrap_or(0),
            )),
            wake: Arc::new(Notify::new()),
            metrics,
            instance,
        })
    }

    /// Runs until cancelled.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            self.round();
        }
        // let attempts in flight finish their bookkeeping
        for _ in 0..50 {
            if self.inflight.lock().map(|s| s.is_empty()).unwrap_or(true) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn round(self: &Arc<Self>) {
        /// What a round judges a queued notification by.
        #[derive(serde::Deserialize)]
        struct QueuedHead {
            notification: QueuedReceiver,
            next_attempt: DateTime<Utc>,
            created_at: DateTime<Utc>,
        }
        #[derive(serde::Deserialize)]
        struct QueuedReceiver {
            receiver: String,
        }

        let now = Utc::now();
        let durable = self.watermark.load(Ordering::Acquire);
        let mut per_receiver: BTreeMap<String, i64> = BTreeMap::new();
        let mut blocked: HashSet<String> = HashSet::new();
        for (key, value) in self.store.pending.iter().filter_map(Result::ok) {
            // Every round looks at the whole queue: only what it judges by is parsed (the alerts of a
            // queued notification are skipped, never built), and the rest only for what is sent now. Parsing
            // every queued notification whole made a round quadratic in a backlog: 87 % of the router's
            // CPU while a fleet's first warnings were notified.
            let key = String::from_utf8_lossy(&key).into_owned();
            let head: QueuedHead = match serde_json::from_slice(&value) {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(%key, error = %e, "skipping an unreadable queued notification");
                    continue;
                }
            };
            let receiver = head.notification.receiver;
            *per_receiver.entry(receiver.clone()).or_default() += 1;
            if blocked.contains(&receiver)
                || head.next_attempt > now
                || head.created_at.timestamp_nanos_opt().unwrap_or(0) > durable
                || self
                    .inflight
                    .lock()
                    .map(|s| s.contains(&key))
                    .unwrap_or(true)
            {
                continue;
            }
            let p: Pending = match serde_json::from_slice(&value) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(%key, error = %e, "skipping an unreadable queued notification");
                    continue;
                }
            };
            let Some(lane) = self.lanes.get(&receiver).cloned() else {
                // the receiver was removed from the routing: nothing can deliver this any more
                let mut p = p;
                p.last_error = Some(format!("receiver {receiver} is no longer configured"));
                let _ = self.store.bury(&key, &p);
                continue;
            };
            let Ok(slot) = lane.slots.clone().try_acquire_owned() else {
                blocked.insert(receiver);
                continue;
            };
            if lane.limiter.as_ref().is_some_and(|l| l.check().is_err()) {
                blocked.insert(receiver);
                continue;
            }
            if let Ok(mut s) = self.inflight.lock() {
                s.insert(key.clone());
            }
            // an attempt that ended since this round read the record may have removed it: not sent twice
            if !self
                .store
                .pending
                .contains_key(key.as_bytes())
                .unwrap_or(false)
            {
                if let Ok(mut s) = self.inflight.lock() {
                    s.remove(&key);
                }
                continue;
            }
            let me = self.clone();
            tokio::spawn(async move {
                me.attempt(key.clone(), p, &lane).await;
                drop(slot);
                if let Ok(mut s) = me.inflight.lock() {
                    s.remove(&key);
                }
                me.wake.notify_one();
            });
        }
        for r in &self.routing.receivers {
            self.metrics
                .pending
                .get_or_create(&ByReceiver {
                    receiver: r.name.clone(),
                })
                .set(per_receiver.get(&r.name).copied().unwrap_or(0));
        }
    }

    async fn attempt(&self, key: String, mut p: Pending, lane: &Lane) {
        let receiver = p.notification.receiver.clone();
        let started = std::time::Instant::now();
        let result = match self.routing.receiver(&receiver) {
            Some(r) => self.send(r, &p, lane.delivery.timeout).await,
            None => Err(Failure::Fatal(format!(
                "receiver {receiver} is not configured"
            ))),
        };
        self.metrics
            .latency
            .get_or_create(&ByReceiver {
                receiver: receiver.clone(),
            })
            .observe(started.elapsed().as_secs_f64());
        if let Err(Failure::BusDown(error)) = &result {
            // not an attempt: try again shortly, without counting
            tracing::debug!(%receiver, id = %p.notification.id, %error, "the bus is away; the notification waits");
            p.last_error = Some(error.clone());
            p.next_attempt = Utc::now() + chrono::Duration::seconds(2);
            let stored = match store::enc(&p) {
                Ok(v) => self.store.pending.insert(key.as_bytes(), v).map(|_| ()),
                Err(e) => Err(sled::Error::Unsupported(e.to_string())),
            };
            if let Err(e) = stored {
                tracing::error!(error = %e, "recording a deferred delivery failed");
            }
            return;
        }
        p.attempts += 1;
        let count = |outcome: &str| {
            self.metrics
                .attempts
                .get_or_create(&Outcome {
                    receiver: receiver.clone(),
                    integration: p.integration.clone(),
                    outcome: outcome.into(),
                })
                .inc();
        };
        let stored = match result {
            Ok(()) => {
                count("sent");
                tracing::debug!(%receiver, id = %p.notification.id, integration = %p.integration, "notification sent");
                self.store.pending.remove(key.as_bytes()).map(|_| ())
            }
            Err(f) => {
                count("failed");
                let (error, fatal) = match f {
                    Failure::Retry(e) | Failure::BusDown(e) => (e, false),
                    Failure::Fatal(e) => (e, true),
                };
                p.last_error = Some(error.clone());
                if fatal || p.attempts >= lane.delivery.max_attempts {
                    count("dead");
                    tracing::error!(%receiver, id = %p.notification.id, attempts = p.attempts, %error, "notification dead-lettered");
                    // buried (and flushed) before the dead letter is published: whoever reads
                    // fleet.dlq.alerts and then asks the API finds it there
                    let buried = self.store.bury(&key, &p).map_err(|e| match e {
                        store::Error::Sled(s) => s,
                        other => sled::Error::Unsupported(other.to_string()),
                    });
                    if buried.is_ok() {
                        if let Err(e) = self.store.flush().await {
                            tracing::error!(error = %e, "flushing the alerts store failed");
                        }
                        self.dead_letter(&p).await;
                    }
                    buried
                } else {
                    let wait = backoff(&lane.delivery, p.attempts);
                    p.next_attempt = Utc::now()
                        + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::seconds(1));
                    tracing::warn!(%receiver, id = %p.notification.id, attempts = p.attempts, retry_in = ?wait, %error, "delivery failed; will retry");
                    match store::enc(&p) {
                        Ok(v) => self.store.pending.insert(key.as_bytes(), v).map(|_| ()),
                        Err(e) => Err(sled::Error::Unsupported(e.to_string())),
                    }
                }
            }
        };
        if let Err(e) = stored {
            tracing::error!(error = %e, "recording a delivery failed");
        }
        if let Err(e) = self.store.flush().await {
            tracing::error!(error = %e, "flushing the alerts store failed");
        }
    }

    async fn dead_letter(&self, p: &Pending) {
        let body = serde_json::to_vec(&p.notification).unwrap_or_default();
        let dl = DeadLetter {
            stream: multipilot_schemas::streams::name::ALERTS.into(),
            consumer: "alerts".into(),
            subject: format!("{}:{}-{}", p.notification.receiver, p.integration, p.index),
            stream_seq: 0,
            delivered: u64::from(p.attempts),
            reason: "delivery".into(),
            error: p.last_error.clone().unwrap_or_default(),
            headers: BTreeMap::new(),
            payload_base64: base64::engine::general_purpose::STANDARD.encode(body),
        };
        let env = Envelope::new("fleet", &self.instance, Utc::now(), 0, dl);
        let id = format!("{}-{}-{}-dead", p.notification.id, p.integration, p.index);
        if let Err(e) =
            multipilot_bus::publish::publish_one(&self.js, subject::dlq("alerts"), id, &env).await
        {
            tracing::warn!(error = %e, "could not publish the dead letter (it is kept in the store)");
        }
    }

    async fn send(&self, r: &Receiver, p: &Pending, timeout: Duration) -> Result<(), Failure> {
        let n = &p.notification;
        match p.integration.as_str() {
            "webhook" => {
                let w = r
                    .webhook_configs
                    .get(p.index)
                    .ok_or_else(|| Failure::Fatal("webhook config gone".into()))?;
                self.post(&w.url, &webhook_payload(p, w.max_alerts), &n.id, timeout)
                    .await
            }
            "alertmanager" => {
                let a = r
                    .alertmanager_configs
                    .get(p.index)
                    .ok_or_else(|| Failure::Fatal("alertmanager config gone".into()))?;
                let url = format!("{}/api/v2/alerts", a.url.trim_end_matches('/'));
                self.post(&url, &alertmanager_payload(p, Utc::now()), &n.id, timeout)
                    .await
            }
            "slack" => {
                let s = r
                    .slack_configs
                    .get(p.index)
                    .ok_or_else(|| Failure::Fatal("slack config gone".into()))?;
                self.post(
                    &s.api_url,
                    &slack_payload(p, s.channel.as_deref()),
                    &n.id,
                    timeout,
                )
                .await
            }
            "nats" => {
                let cluster = p
                    .group_labels
                    .get("cluster")
                    .cloned()
                    .unwrap_or_else(|| "fleet".into());
                let seq = p.created_at.timestamp_micros().max(0) as u64;
                let env = Envelope::new(cluster, &self.instance, p.created_at, seq, n.clone());
                let id = format!("{}-nats-{}", n.id, p.index);
                let publish = multipilot_bus::publish::publish_one(
                    &self.js,
                    subject::alert(&n.receiver),
                    id,
                    &env,
                );
                let connected =
                    self.js.client().connection_state() == async_nats::connection::State::Connected;
                match tokio::time::timeout(timeout, publish).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => {
                        let e = e.to_string();
                        if !connected || e.contains("timed out") || e.contains("no responders") {
                            Err(Failure::BusDown(e))
                        } else {
                            Err(Failure::Retry(e))
                        }
                    }
                    Err(_) => Err(Failure::BusDown("publish timed out".into())),
                }
            }
            other => Err(Failure::Fatal(format!("unknown integration {other}"))),
        }
    }

    async fn post(
        &self,
        url: &str,
        body: &serde_json::Value,
        id: &str,
        timeout: Duration,
    ) -> Result<(), Failure> {
        let resp = self
            .http
            .post(url)
            .timeout(timeout)
            .header(HEADER_NOTIFICATION_ID, id)
            .json(body)
            .send()
            .await
            .map_err(|e| Failure::Retry(format!("POST {url}: {e}")))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let text: String = resp
            .text()
            .await
            .unwrap_or_default()
            .chars()
            .take(300)
            .collect();
        let msg = format!("POST {url}: {status} {text}");
        if status.is_client_error() && status.as_u16() != 408 && status.as_u16() != 429 {
            Err(Failure::Fatal(msg))
        } else {
            Err(Failure::Retry(msg))
        }
    }
}

const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

fn state_str(s: AlertState) -> &'static str {
    match s {
        AlertState::Firing => "firing",
        AlertState::Resolved => "resolved",
    }
}

/// Alertmanager's webhook payload, version 4.
pub fn webhook_payload(p: &Pending, max_alerts: usize) -> serde_json::Value {
    let n: &Notification = &p.notification;
    let shown = if max_alerts == 0 {
        n.alerts.len()
    } else {
        max_alerts.min(n.alerts.len())
    };
    // as Alertmanager: the status and the common labels are those of the alerts sent, not of the group
    let sent = &n.alerts[..shown];
    let status = if sent.iter().any(|a| a.state == AlertState::Firing) {
        AlertState::Firing
    } else {
        AlertState::Resolved
    };
    json!({
        "version": "4",
        "groupKey": n.group_key,
        "truncatedAlerts": n.alerts.len() - shown,
        "status": state_str(status),
        "receiver": n.receiver,
        "groupLabels": p.group_labels,
        "commonLabels": crate::engine::common(sent.iter().map(|a| &a.labels)),
        "commonAnnotations": crate::engine::common(sent.iter().map(|a| &a.annotations)),
        "externalURL": "",
        "alerts": sent.iter().map(|a| json!({
            "status": state_str(a.state),
            "labels": a.labels,
            "annotations": a.annotations,
            "startsAt": a.starts_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "endsAt": a.ends_at.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)).unwrap_or_else(|| ZERO_TIME.into()),
            "generatorURL": "",
            "fingerprint": a.incident_id,
        })).collect::<Vec<_>>(),
        // not in Alertmanager's payload; receivers that don't know them ignore them
        "title": n.title,
        "text": n.text,
        "notificationId": n.id,
    })
}

/// Alertmanager's `POST /api/v2/alerts` body. A firing alert is given an end `hold_secs` ahead, so the
/// Alertmanager keeps it active until our next repeat; a resolved one carries its real end.
pub fn alertmanager_payload(p: &Pending, now: DateTime<Utc>) -> serde_json::Value {
    let hold = chrono::Duration::seconds(p.hold_secs.max(300) as i64);
    let alerts: Vec<serde_json::Value> = p
        .notification
        .alerts
        .iter()
        .map(|a| {
            let ends = a.ends_at.unwrap_or(now + hold);
            json!({
                "labels": a.labels,
                "annotations": a.annotations,
                "startsAt": a.starts_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                "endsAt": ends.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                "generatorURL": "",
            })
        })
        .collect();
    serde_json::Value::Array(alerts)
}

/// A Slack incoming-webhook message.
pub fn slack_payload(p: &Pending, channel: Option<&str>) -> serde_json::Value {
    let n = &p.notification;
    let mut v = json!({
        "text": n.title,
        "attachments": [{
            "color": if n.state == AlertState::Firing { "danger" } else { "good" },
            "title": n.title,
            "text": n.text,
            "fallback": n.title,
        }],
    });
    if let Some(c) = channel {
        v["channel"] = json!(c);
    }
    v
}
