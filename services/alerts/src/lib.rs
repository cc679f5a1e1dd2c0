//! The alert router (`alerts` role): incidents in, grouped notifications out.
//!
//! Reads `fleet.incident.>`, `fleet.digest.>` and `fleet.fleet-incident.>` (durable `alerts` on
//! FLEET_INCIDENTS, which acks the stream's compliance reports unread). Each incident change
//! becomes an alert (labels: `alertname`/`kind`, `cluster`, `severity` and the cluster's registry labels), as
//! does each deduplicated event digest at or above `event_min_severity` (`alertname` = the event reason,
//! `kind=event`; it resolves `event_ttl` after its last refresh). Alerts are routed through an
//! Alertmanager-shaped route tree into groups; groups are notified after `group_wait`, then every
//! `group_interval` when something changed, and again after `repeat_interval`. Silences and inhibition
//! mute alerts. Receivers: webhooks (Alertmanager webhook payload v4), an existing Alertmanager
//! (`/api/v2/alerts`), Slack-compatible incoming webhooks, and `fleet.alert.<receiver>` on NATS.
//!
//! Durability: alerts, silences, the notification log and pending notifications live in sled, and a
//! notification is on disk (with its log entry) before it is sent. An incident is acked as soon as it is
//! taken in memory: every `checkpoint` the tick loop writes the alerts changed since the last checkpoint off
//! the consumer's path, then marks in the store the durable's ack floor it read before taking them (every
//! input up to it is on disk). At start the router takes in again, in stream order, what the durable delivered after that
//! mark, so an input acked but not yet written is not lost (a second take of an input is a stale
//! revision). See `README.md` for the guarantees and their one window.
//!
//! Alerts can also be posted to `POST /api/v2/alerts` (Alertmanager's API, as Prometheus and vmalert
//! send them): their id is Alertmanager's fingerprint of their labels, and one without `endsAt` resolves
//! `resolve_timeout` after it was last posted.
//!
//! Replication: silences, the notification log and posted alerts are written through to the JetStream KV
//! buckets `MULTIPILOT_SILENCES`, `MULTIPILOT_NFLOG` and `MULTIPILOT_ALERTS`, and a notification is sent only once its log entry is in
//! the bucket too. A router whose data directory is new or wiped restores both, then replays
//! FLEET_INCIDENTS from the start (its durable `alerts` is recreated) to rebuild the alerts; groups are not
//! flushed until the replay has caught up, so what the restored log says was notified is not sent again.

pub mod api;
pub mod compat;
pub mod config;
pub mod deliver;
pub mod engine;
pub mod matcher;
pub mod route;
pub mod router;
pub mod store;
pub mod template;
pub mod timeinterval;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use chrono::Utc;
use multipilot_bus::consume::{self, Handler, Outcome, Received, Runner};
use multipilot_runtime::Context;
// what the router reads: incident changes and event digests
use multipilot_schemas::streams::AlertInput as Input;
use tokio::sync::Mutex;

pub use config::{Config, Routing};

use crate::deliver::{Deliverer, Metrics};
use crate::router::Router;
use crate::store::{Replica, Store};

/// Why the alert router could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting, the routing file or a template.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// Auth is misconfigured (off on an exposed address, or an unreadable tokens file).
    #[error(transparent)]
    Auth(#[from] multipilot_runtime::auth::Error),
    /// Its local store (sled) failed.
    #[error(transparent)]
    Store(multipilot_runtime::error::Cause),
    /// NATS (the KV buckets, the stream, the durable) failed or refused.
    #[error(transparent)]
    Bus(multipilot_runtime::error::Cause),
    /// The API could not listen.
    #[error("alerts API on {listen}: {source}")]
    Listen {
        /// The address.
        listen: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether starting again later may succeed (NATS or the disk were away, the address was taken)
    /// rather than needing a changed setting or file.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Error::Config(_) | Error::Auth(_))
    }
}

type Result<T, E = Error> = std::result::Result<T, E>;

fn store_err<E: std::error::Error + Send + Sync + 'static>(
    what: impl Into<String>,
) -> impl FnOnce(E) -> Error {
    let wrap = multipilot_runtime::error::cause(what);
    move |e| Error::Store(wrap(e))
}

fn bus_err<E: std::error::Error + Send + Sync + 'static>(
    what: impl Into<String>,
) -> impl FnOnce(E) -> Error {
    let wrap = multipilot_runtime::error::cause(what);
    move |e| Error::Bus(wrap(e))
}

/// The silences bucket.
pub const SILENCES_BUCKET: &str = "MULTIPILOT_SILENCES";
/// The notification log bucket.
pub const NFLOG_BUCKET: &str = "MULTIPILOT_NFLOG";
/// The posted alerts bucket.
pub const ALERTS_BUCKET: &str = "MULTIPILOT_ALERTS";
/// The stream and durable consumer the router reads.
const INCIDENTS: (&str, &str) = (multipilot_schemas::streams::name::INCIDENTS, "alerts");

struct H {
    router: Arc<Mutex<Router>>,
    events: config::EventThreshold,
    event_ttl: std::time::Duration,
}

/// Takes one input into the engine, in memory.
fn apply(
    e: &mut engine::Engine,
    input: &Input,
    stored_at: chrono::DateTime<Utc>,
    (events, event_ttl): (config::EventThreshold, std::time::Duration),
) {
    match input {
        Input::Incident(inc) => {
            e.on_incident(inc, Utc::now());
        }
        Input::Digest(d) if events.passes(d.severity) => {
            e.on_digest(d, stored_at, Utc::now(), event_ttl);
        }
        Input::Digest(_) => {}
        Input::Fleet(f) => {
            e.on_fleet_incident(f, Utc::now());
        }
    }
}

impl Handler<Input> for H {
    // Taken in memory and acked at once (no commit): the tick loop writes the alerts off this path and
    // then marks the durable's ack floor in the store; a restart applies again what came after the mark
    // (`catch_up`), so an input acked but not yet written is not lost.
    async fn handle(&mut self, msg: Received<Input>) -> Outcome {
        let e = &mut self.router.lock().await.engine;
        apply(
            e,
            &msg.envelope.payload,
            msg.ingest_time,
            (self.events, self.event_ttl),
        );
        Outcome::Done
    }
}

/// Opens (creating or updating) the three buckets.
async fn open_replica(js: &async_nats::jetstream::Context, config: &Config) -> Result<Replica> {
    let bucket = |name: &str, description: &str, max_age| multipilot_bus::kv::Bucket {
        name: name.into(),
        description: description.into(),
        replicas: config.kv_replicas,
        max_age,
    };
    let silences = bucket(
        SILENCES_BUCKET,
        "Alert router silences (written through from its sled store)",
        std::time::Duration::ZERO,
    );
    let nflog = bucket(
        NFLOG_BUCKET,
        "Alert router notification log (written through from its sled store)",
        config.nflog_retention,
    );
    let open =
        async |b: &multipilot_bus::kv::Bucket| {
            multipilot_bus::kv::open(js, b).await.map_err(bus_err(format!(
            "opening the KV bucket {} (the alerts user needs the $JS.API.STREAM.*.KV_{} APIs)",
            b.name, b.name
        )))
        };
    let alerts = bucket(
        ALERTS_BUCKET,
        "Alerts posted to the alert router's API (written through from its sled store)",
        std::time::Duration::ZERO,
    );
    Ok(Replica::new(
        open(&silences).await?,
        open(&nflog).await?,
        open(&alerts).await?,
    ))
}

/// Brings the store in line with the buckets at start: a blank (new or wiped) store is restored from them
/// and the incidents are replayed from the start; a store that predates the buckets is copied into them;
/// whatever a previous run left queued is replicated. Returns whether it restored (and a replay began).
async fn prepare(store: &Store, js: &async_nats::jetstream::Context) -> Result<bool> {
    let local = store_err::<store::Error>;
    let blank = store
        .is_blank()
        .map_err(local("reading the alerts store"))?;
    if blank {
        store
            .begin_restore()
            .map_err(local("starting the restore"))?;
        store
            .flush()
            .await
            .map_err(local("flushing the alerts store"))?;
        let restored = store.restore().await.map_err(bus_err(
            "restoring silences, the notification log and posted alerts from the KV buckets",
        ))?;
        let replay_until = reset_consumer(js).await?;
        store
            .finish_restore(replay_until)
            .map_err(local("finishing the restore"))?;
        store
            .flush()
            .await
            .map_err(local("flushing the alerts store"))?;
        tracing::info!(
            silences = restored.silences,
            nflog = restored.nflog,
            alerts = restored.alerts,
            skipped = restored.skipped,
            replay_until,
            "blank store restored from the KV buckets; replaying the incidents"
        );
    } else if !store
        .is_replicated()
        .map_err(local("reading the alerts store"))?
    {
        let n = store.seed_outbox().map_err(local("seeding the outbox"))?;
        store
            .mark_replicated()
            .map_err(local("marking the store replicated"))?;
        store
            .flush()
            .await
            .map_err(local("flushing the alerts store"))?;
        tracing::info!(
            records = n,
            "copying silences and the notification log into the KV buckets"
        );
    }
    store.replicate().await.map_err(bus_err(
        "replicating silences and the notification log to the KV buckets",
    ))?;
    Ok(blank)
}

/// Recreates the durable `alerts` on FLEET_INCIDENTS with the topology's settings, so it delivers from the
/// start; returns the stream's last sequence (the replay's target), or `None` when the stream is empty.
async fn reset_consumer(js: &async_nats::jetstream::Context) -> Result<Option<u64>> {
    let (stream_name, durable) = INCIDENTS;
    let stream = multipilot_bus::jetstream::get_stream(js, stream_name)
        .await
        .map_err(bus_err("reading FLEET_INCIDENTS"))?;
    let last = stream.cached_info().state.last_sequence;
    multipilot_bus::jetstream::Durable::shared(stream_name, durable)
        .ensure(js, true)
        .await
        .map_err(bus_err("recreating the alerts durable to replay"))?;
    Ok((last > 0).then_some(last))
}

/// Whether the replay reached `target`: everything up to it acked, or nothing left to deliver.
async fn replay_done(js: &async_nats::jetstream::Context, target: u64) -> Result<bool> {
    let (stream_name, durable) = INCIDENTS;
    let info = multipilot_bus::jetstream::Durable::shared(stream_name, durable)
        .info(js)
        .await
        .map_err(bus_err("reading the alerts durable"))?
        .ok_or_else(|| {
            Error::Bus(multipilot_runtime::error::Cause::msg(
                "reading the alerts durable",
                "it does not exist",
            ))
        })?;
    Ok(info.ack_floor.stream_sequence >= target
        || (info.num_pending == 0 && info.num_ack_pending == 0))
}

/// The durable `alerts`' state: its ack floor (every input up to it was taken into the engine) and the
/// last sequence it delivered (nothing after it was acked).
async fn durable_position(js: &async_nats::jetstream::Context) -> Result<Option<(u64, u64)>> {
    let (stream_name, durable) = INCIDENTS;
    let info = multipilot_bus::jetstream::Durable::shared(stream_name, durable)
        .info(js)
        .await
        .map_err(bus_err("reading the alerts durable"))?;
    Ok(info.map(|i| (i.ack_floor.stream_sequence, i.delivered.stream_sequence)))
}

/// Takes in again, in stream order, what the durable delivered after `through` (the store's mark): inputs
/// that may have been acked before their alerts were written. What it had not delivered, it delivers next
/// (an input taken twice is a stale revision the second time). Returns how many were read.
async fn catch_up(
    js: &async_nats::jetstream::Context,
    engine: &mut engine::Engine,
    through: u64,
    settings: (config::EventThreshold, std::time::Duration),
) -> Result<u64> {
    let (stream_name, durable) = INCIDENTS;
    let Some((_, delivered)) = durable_position(js).await? else {
        return Ok(0);
    };
    if delivered <= through {
        return Ok(0);
    }
    let filters = multipilot_bus::topology::Topology::embedded()
        .consumer(stream_name, durable)
        .map(|c| c.filter_subjects.clone())
        .unwrap_or_default();
    let max_bytes = consume::Config::default().max_message_bytes;
    multipilot_bus::jetstream::read_range(
        js,
        stream_name,
        filters,
        multipilot_bus::jetstream::Start::After(through),
        Some(delivered),
        |m| {
            // what the consumer refuses (and dead-letters) is skipped here too
            let Ok(env) = multipilot_bus::jetstream::decode::<Input>(m.message, max_bytes) else {
                return;
            };
            if multipilot_schemas::subject::cluster_of(&m.message.subject)
                .is_some_and(|owner| owner != env.cluster)
            {
                return;
            }
            apply(engine, &env.payload, m.published, settings);
        },
    )
    .await
    .map_err(bus_err(
        "reading back FLEET_INCIDENTS after the store's mark",
    ))
}

/// Records that every input up to `floor` (an ack floor read before the engine's changes were last taken)
/// is in the store: what those changes wrote is flushed first, the mark after.
async fn mark(store: &Store, floor: u64) -> Result<(), store::Error> {
    store.flush().await?;
    if store.incidents_through()?.is_some_and(|m| m >= floor) {
        return Ok(());
    }
    store.set_incidents_through(floor)?;
    store.flush().await
}

/// Runs the alert router until `ctx.cancel` fires.
pub async fn run(config: Config, ctx: Context) -> Result<()> {
    config.auth.check_listen("alerts", &config.listen)?;
    let tokens = if config.auth.enabled {
        Some(Arc::new(multipilot_runtime::auth::Tokens::load(
            &config.auth,
        )?))
    } else {
        None
    };
    config.validate()?;
    let routing = Arc::new(Routing::load(config.routing.as_deref())?);
    std::fs::create_dir_all(&config.data_dir)
        .map_err(store_err(format!("creating {}", config.data_dir)))?;
    let store =
        Store::open(&config.data_dir, config.cache_bytes).map_err(store_err::<store::Error>(
            format!("opening the alerts store in {}", config.data_dir),
        ))?;
    multipilot_runtime::store::report_cache(&ctx.registry, "alerts", config.cache_bytes);
    let store = store.with_replica(open_replica(&ctx.js, &config).await?);
    let restored = prepare(&store, &ctx.js).await?;
    let local = store_err::<store::Error>;
    let mut replay_until = store
        .replay_until()
        .map_err(local("reading the alerts store"))?;
    let through = store
        .incidents_through()
        .map_err(local("reading the alerts store"))?;
    if replay_until.is_some() && !restored {
        // a replay cut short: what it had acked was only in memory, so it starts again
        replay_until = reset_consumer(&ctx.js).await?;
        store
            .set_replay_until(replay_until)
            .map_err(local("recording the replay"))?;
        store
            .flush()
            .await
            .map_err(local("flushing the alerts store"))?;
        tracing::info!(
            ?replay_until,
            "an unfinished replay of the incidents starts again"
        );
    }
    let settings = (config.event_min_severity, config.event_ttl);
    let mut router = Router::open(
        store.clone(),
        (*routing).clone(),
        config.retain_resolved,
        config.nflog_retention,
        Utc::now(),
    );
    let mut through = through;
    match (replay_until, through) {
        // a replay rebuilds everything; the mark is written when it is over
        (Some(_), _) => {}
        (None, Some(t)) => {
            let n = catch_up(&ctx.js, &mut router.engine, t, settings).await?;
            tracing::info!(
                through = t,
                inputs = n,
                "incidents after the store's mark taken in again"
            );
        }
        (None, None) => {
            // a store from before incidents were acked ahead of their alerts' write: it wrote each
            // before its ack, so it holds everything up to the ack floor
            let floor = durable_position(&ctx.js).await?.map_or(0, |(f, _)| f);
            mark(&store, floor)
                .await
                .map_err(local("marking the incidents written"))?;
            through = Some(floor);
        }
    }
    router.engine.set_replaying(replay_until.is_some());
    let router = Arc::new(Mutex::new(router));
    let metrics = {
        let mut reg = ctx.registry.write().unwrap_or_else(|e| e.into_inner());
        Metrics::register(&mut reg)
    };
    let deliverer = Arc::new(
        Deliverer::new(
            store.clone(),
            routing.clone(),
            ctx.js.clone(),
            metrics.clone(),
            ctx.instance.clone(),
        )
        .map_err(|e| config::ConfigError(format!("the receivers' HTTP client: {e}")))?,
    );
    metrics.checkpointed(through.unwrap_or(0));
    ctx.health.register("alerts");

    let api = api::Api {
        router: router.clone(),
        tokens,
        js: ctx.js.clone(),
        instance: ctx.instance.clone(),
        metrics: metrics.clone(),
        resolve_timeout: config.resolve_timeout,
        started_at: Utc::now(),
    };
    let (addr, server) =
        multipilot_runtime::http::serve(&config.listen, api::router(api), ctx.cancel.clone())
            .await
            .map_err(|source| Error::Listen {
                listen: config.listen.clone(),
                source,
            })?;

    let mut tasks = tokio::task::JoinSet::new();
    {
        let runner = Runner::new(
            ctx.js.clone(),
            consume::Config {
                stream: INCIDENTS.0.into(),
                durable: INCIDENTS.1.into(),
                batch: config.batch,
                rate: config.rate.clone(),
                // compliance reports share the stream: the durable has no filter (see `consume::Config::skip`)
                skip: vec![multipilot_schemas::subject::COMPLIANCE.all()],
                ..Default::default()
            },
            ctx.bus_metrics.clone(),
        );
        let mut h = H {
            router: router.clone(),
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
        let (router, deliverer, cancel, js) = (
            router.clone(),
            deliverer.clone(),
            ctx.cancel.clone(),
            ctx.js.clone(),
        );
        let every = config.tick.max(std::time::Duration::from_millis(50));
        let every_checkpoint = config.checkpoint;
        let metrics = metrics.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut replay_until = replay_until;
            // the store's mark, and whether it holds writes not flushed yet
            let (mut marked, mut dirty) = (through.unwrap_or(0), false);
            // a replay ended whose end the store does not record yet
            let mut replay_over = false;
            let mut last_checkpoint = std::time::Instant::now();
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                if let Some(target) = replay_until {
                    match replay_done(&js, target).await {
                        Ok(true) => {
                            // the store says the replay is over once its first mark is written (a
                            // restart before that replays again: what it took in was only in memory)
                            router.lock().await.engine.set_replaying(false);
                            replay_until = None;
                            replay_over = true;
                            tracing::info!(target, "incidents replayed; notifying again");
                        }
                        Ok(false) => continue,
                        Err(err) => {
                            tracing::warn!(error = %err, "checking the replay's progress failed; will retry");
                            continue;
                        }
                    }
                }
                // a checkpoint writes the alerts changed since the last one, then marks the ack floor read
                // before their changes were taken (every input up to it is among them)
                let checkpoint = replay_over || last_checkpoint.elapsed() >= every_checkpoint;
                let floor = if checkpoint {
                    match durable_position(&js).await {
                        Ok(p) => p.map(|(floor, _)| floor),
                        Err(err) => {
                            tracing::debug!(error = %err, "reading the alerts durable failed; marking later");
                            None
                        }
                    }
                } else {
                    None
                };
                let now = Utc::now();
                let (n, saved, store) = {
                    let mut r = router.lock().await;
                    let ticked = r.tick(now);
                    let saved = checkpoint && match r.save() {
                        Ok(()) => true,
                        Err(err) => {
                            tracing::error!(error = %err, "writing the alerts failed; will retry");
                            false
                        }
                    };
                    dirty |= r.take_written();
                    match ticked {
                        Ok(n) => (n, saved, r.store.clone()),
                        Err(err) => {
                            tracing::error!(error = %err, "flushing alert groups failed; will retry");
                            continue;
                        }
                    }
                };
                if dirty || n > 0 || store.outbox_len() > 0 {
                    if let Err(err) = store.flush().await {
                        tracing::error!(error = %err, "flushing the alerts store failed");
                        continue;
                    }
                    dirty = false;
                }
                if saved && floor.is_some() {
                    last_checkpoint = std::time::Instant::now();
                }
                if let Some(floor) = floor.filter(|f| saved && (*f > marked || replay_over)) {
                    match mark(&store, floor).await {
                        Ok(()) => {
                            marked = floor;
                            metrics.checkpointed(floor);
                        }
                        Err(err) => tracing::warn!(error = %err, "marking the incidents written failed; will retry"),
                    }
                    if replay_over && marked == floor {
                        match store.set_replay_until(None) {
                            Ok(_) => match store.flush().await {
                                Ok(()) => replay_over = false,
                                Err(err) => tracing::warn!(error = %err, "recording the end of the replay failed; will retry"),
                            },
                            Err(err) => tracing::warn!(error = %err, "recording the end of the replay failed; will retry"),
                        }
                    }
                }
                if n > 0 || store.outbox_len() > 0 {
                    // a notification goes out only once its log entry is in the bucket as well: a router
                    // restored from the bucket must not send it again
                    if let Err(err) = store.replicate().await {
                        tracing::warn!(error = %err, "replicating the notification log failed; deliveries wait, will retry");
                        continue;
                    }
                    deliverer
                        .watermark
                        .fetch_max(now.timestamp_nanos_opt().unwrap_or(0), Ordering::AcqRel);
                    deliverer.wake.notify_one();
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
    let floor = durable_position(&ctx.js).await.ok().flatten();
    let mut r = router.lock().await;
    r.save().map_err(local("writing the alerts"))?;
    r.store
        .flush()
        .await
        .map_err(local("flushing the alerts store"))?;
    if let Some((floor, _)) = floor.filter(|_| !r.engine.replaying()) {
        mark(&r.store, floor)
            .await
            .map_err(local("marking the incidents written"))?;
    }
    tracing::info!(stats = ?r.engine.stats, "alert router stopped");
    Ok(())
}
