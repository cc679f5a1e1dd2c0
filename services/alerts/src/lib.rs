//! The alert router (`alerts` role): incidents in, grouped notifications out.
//!
//! Reads `fleet.incident.>` and `fleet.digest.>` (durable `alerts` on FLEET_INCIDENTS). Each incident change
//! becomes an alert (labels: `alertname`/`kind`, `cluster`, `severity` and the cluster's registry labels), as
//! does each deduplicated event digest at or above `event_min_severity` (`alertname` = the event reason,
//! `kind=event`; it resolves `event_ttl` after its last refresh). Alerts are routed through an
//! Alertmanager-shaped route tree into groups; groups are notified after `group_wait`, then every
//! `group_interval` when something changed, and again after `repeat_interval`. Silences and inhibition
//! mute alerts. Receivers: webhooks (Alertmanager webhook payload v4), an existing Alertmanager
//! (`/api/v2/alerts`), Slack-compatible incoming webhooks, and `fleet.alert.<receiver>` on NATS.
//!
//! Durability: alerts, silences, the notification log and pending notifications live in sled; an incident
//! is acked only after its alert is on disk, and a notification is on disk (with its log entry) before it
//! is sent. See `README.md` for the guarantees and their one window.

pub mod api;
pub mod config;
pub mod deliver;
pub mod engine;
pub mod matcher;
pub mod route;
pub mod store;
pub mod template;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context as _, Result, ensure};
use chrono::Utc;
use multipilot_bus::consume::{self, Handler, Outcome, Received, Runner};
use multipilot_runtime::Context;
use multipilot_schemas::envelope::decode_member;
use multipilot_schemas::payload::{EventDigest, Incident};
use multipilot_schemas::{Envelope, Payload};
use tokio::sync::Mutex;

pub use config::{Config, Routing};

use crate::deliver::{Deliverer, Metrics};
use crate::engine::Engine;
use crate::store::Store;

/// What the router reads: incident changes and event digests.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Input {
    /// `fleet.incident.<cluster>.<kind>`.
    Incident(Incident),
    /// `fleet.digest.<cluster>.<kind>`.
    Digest(EventDigest),
}

impl Payload for Input {
    const SCHEMA: &'static str = "Incident|EventDigest";
    const VERSION: u32 = 1;
    fn accepts(schema: &str) -> Option<u32> {
        Incident::accepts(schema).or_else(|| EventDigest::accepts(schema))
    }
    fn decode_envelope(
        schema: &str,
        body: &[u8],
    ) -> Result<Envelope<Self>, rmp_serde::decode::Error> {
        if schema == Incident::SCHEMA {
            decode_member(body, Input::Incident)
        } else {
            decode_member(body, Input::Digest)
        }
    }
}

struct H {
    engine: Arc<Mutex<Engine>>,
    events: config::EventThreshold,
    event_ttl: std::time::Duration,
}

impl Handler<Input> for H {
    async fn handle(&mut self, msg: Received<Input>) -> Outcome {
        let mut e = self.engine.lock().await;
        let r = match &msg.envelope.payload {
            Input::Incident(inc) => e.on_incident(inc, Utc::now()),
            Input::Digest(d) if self.events.passes(d.severity) => {
                e.on_digest(d, Utc::now(), self.event_ttl)
            }
            Input::Digest(_) => Ok(()),
        };
        match r {
            Ok(()) => Outcome::Done,
            Err(err) => Outcome::Retry(err.to_string()),
        }
    }

    async fn commit(&mut self) -> Result<(), String> {
        let store = self.engine.lock().await.store.clone();
        store.flush().await.map_err(|e| e.to_string())
    }
}

fn is_loopback(listen: &str) -> bool {
    listen
        .parse::<SocketAddr>()
        .map(|a| a.ip().is_loopback())
        .unwrap_or_else(|_| listen.starts_with("localhost:"))
}

/// Runs the alert router until `ctx.cancel` fires.
pub async fn run(config: Config, ctx: Context) -> Result<()> {
    ensure!(
        !config.api_tokens.is_empty() || is_loopback(&config.listen),
        "alerts.listen {} is not a loopback address: set alerts.api_tokens so silences can't be changed by anyone",
        config.listen
    );
    let routing = Arc::new(Routing::load(config.routing.as_deref())?);
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating {}", config.data_dir))?;
    let store = Store::open(&config.data_dir)
        .with_context(|| format!("opening the alerts store in {}", config.data_dir))?;
    let engine = Arc::new(Mutex::new(Engine::open(
        store.clone(),
        (*routing).clone(),
        config.retain_resolved,
        Utc::now(),
    )?));
    let metrics = {
        let mut reg = ctx
            .registry
            .write()
            .map_err(|_| anyhow::anyhow!("metrics registry poisoned"))?;
        Metrics::register(&mut reg)
    };
    let deliverer = Arc::new(Deliverer::new(
        store.clone(),
        routing.clone(),
        ctx.js.clone(),
        metrics.clone(),
        ctx.instance.clone(),
    )?);
    ctx.health.register("alerts");

    let api = api::Api {
        engine: engine.clone(),
        tokens: Arc::new(config.api_tokens.clone()),
        js: ctx.js.clone(),
        instance: ctx.instance.clone(),
        metrics,
    };
    let (addr, server) =
        multipilot_runtime::http::serve(&config.listen, api::router(api), ctx.cancel.clone())
            .await
            .with_context(|| format!("alerts API on {}", config.listen))?;

    let mut tasks = tokio::task::JoinSet::new();
    {
        let runner = Runner::new(
            ctx.js.clone(),
            consume::Config {
                stream: "FLEET_INCIDENTS".into(),
                durable: "alerts".into(),
                batch: config.batch,
                ..Default::default()
            },
            ctx.bus_metrics.clone(),
        );
        let mut h = H {
            engine: engine.clone(),
            events: config.event_min_severity,
            event_ttl: config.event_ttl,
        };
        let cancel = ctx.cancel.clone();
        tasks.spawn(async move {
            if let Err(e) = runner.run::<Input, _>(&mut h, cancel).await {
                tracing::error!(error = %e, "the incidents consumer stopped");
            }
        });
    }
    {
        let (engine, deliverer, cancel, instance) = (
            engine.clone(),
            deliverer.clone(),
            ctx.cancel.clone(),
            ctx.instance.clone(),
        );
        let every = config.tick.max(std::time::Duration::from_millis(50));
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let now = Utc::now();
                let (n, store) = {
                    let mut e = engine.lock().await;
                    match e.tick(now, &instance) {
                        Ok(n) => (n, e.store.clone()),
                        Err(err) => {
                            tracing::error!(error = %err, "flushing alert groups failed; will retry");
                            continue;
                        }
                    }
                };
                if n > 0 {
                    match store.flush().await {
                        Ok(()) => {
                            deliverer
                                .watermark
                                .fetch_max(now.timestamp_nanos_opt().unwrap_or(0), Ordering::AcqRel);
                            deliverer.wake.notify_one();
                        }
                        Err(err) => tracing::error!(error = %err, "flushing the alerts store failed"),
                    }
                }
            }
        });
    }
    {
        let (d, cancel) = (deliverer.clone(), ctx.cancel.clone());
        tasks.spawn(async move { d.run(cancel).await });
    }
    ctx.health.set("alerts", true);
    tracing::info!(%addr, data_dir = %config.data_dir, receivers = routing.receivers.len(), "alert router running; API on http://{addr}");
    while tasks.join_next().await.is_some() {}
    let _ = server.await;
    let e = engine.lock().await;
    e.store.flush().await?;
    tracing::info!(stats = ?e.stats, "alert router stopped");
    Ok(())
}
