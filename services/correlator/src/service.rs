//! The correlator's NATS wiring: the four durable consumers feeding the [`Machine`], the commit that makes
//! state and outputs durable before acks, the publisher that publishes the outputs once durable, the clock,
//! the query and command responders, and the rebuild of a new or wiped store from the streams. Each is a
//! named task of [`run`].

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use multipilot_bus::consume::{self, CommitError, Handler, Outcome, Received, Runner};
use multipilot_bus::jetstream::{self as js_kit, Durable, Start};
use multipilot_bus::metrics::BusMetrics;
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use multipilot_runtime::Context;
use multipilot_schemas::control::{
    BlastRadiusQuery, COMMAND_INCIDENT, CommandOutcome, CommandReply, HEADER_PARTITIONS,
    IncidentCommand, IncidentsQuery, QUERY_BLAST_RADIUS, QUERY_COMPLIANCE, QUERY_CONSISTENCY,
    QUERY_FLEET_INCIDENTS, QUERY_INCIDENTS,
};
use multipilot_schemas::payload::{
    ClusterFacts, ComplianceReport, FleetIncident, Incident, KubeEvent, ReleaseEvent,
};
use multipilot_schemas::streams::{HealthMsg, StateMsg, name};
use multipilot_schemas::{Payload, codec::DEFAULT_MAX_BYTES, subject};
use tokio::sync::Mutex;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{Config, Error};

type Result<T, E = Error> = std::result::Result<T, E>;
use crate::machine::{Input, Machine};
use crate::store::{Outbox, Store};

/// The machine, the outbox and the store, behind one lock. The lock is never held across an await on the
/// network or a flush.
#[derive(Debug)]
pub struct Core {
    /// The state machine.
    pub machine: Machine,
    outbox: Outbox,
    store: Store,
    /// One publisher at a time (see [`publish`]).
    publishing: Arc<Mutex<()>>,
    /// Wakes [`publisher`].
    kick: Arc<tokio::sync::Notify>,
}

type Shared = Arc<Mutex<Core>>;

impl Core {
    fn apply(&mut self, consumer: &str, stream_seq: u64, input: Input<'_>) {
        let outs = self.machine.apply_delivered(consumer, stream_seq, input);
        self.outbox.push(outs);
    }
}

fn store_failed(e: crate::store::Error) -> CommitError {
    if e.is_retryable() {
        CommitError::retryable(e)
    } else {
        CommitError::permanent(e)
    }
}

/// Makes the machine's changes and its outputs durable together (an outbox: a crash before they are
/// published re-publishes them with the same Msg-Ids, which JetStream drops).
async fn persist(core: &Shared) -> Result<(), CommitError> {
    let (flush, up_to) = {
        let mut c = core.lock().await;
        let Core {
            machine,
            outbox,
            store,
            ..
        } = &mut *c;
        outbox.push(machine.settle());
        store
            .write(machine.take_changes(), outbox)
            .map_err(store_failed)?;
        // the flush covers what every consumer wrote so far; sled serialises concurrent flushes itself
        (store.flusher(), outbox.written_up_to())
    };
    flush.await.map_err(store_failed)?;
    core.lock().await.outbox.made_durable(up_to);
    Ok(())
}

/// Publishes the durable outputs JetStream has not confirmed yet, in order; one publisher at a time, so
/// none goes out twice (core subscribers would see both) and none overtakes an earlier one.
async fn publish(
    core: &Shared,
    js: &async_nats::jetstream::Context,
    metrics: &BusMetrics,
) -> Result<(), CommitError> {
    let gate = core.lock().await.publishing.clone();
    let _one_at_a_time = gate.lock().await;
    let pending = core.lock().await.outbox.publishable();
    if pending.is_empty() {
        return Ok(());
    }
    let mut publisher: Publisher<String> = Publisher::new(js.clone(), 256, metrics.clone());
    let mut completions = Vec::new();
    for o in pending {
        let id = o.msg_id.clone();
        completions.extend(
            publisher
                .send(
                    id,
                    Outgoing::raw(o.subject, o.msg_id, &o.schema, o.body.into()),
                )
                .await,
        );
    }
    completions.extend(publisher.flush().await);
    let mut done = Vec::new();
    let mut failed = None;
    for c in completions {
        match c {
            Completion::Stored { key, .. } => done.push(key),
            Completion::Failed { error, .. } => failed = Some(error.to_string()),
        }
    }
    core.lock().await.outbox.confirm(&done);
    match failed {
        Some(e) => Err(CommitError::retryable(format!("publishing incidents: {e}"))),
        None => Ok(()),
    }
}

/// Makes the machine's changes and its outputs durable together, then publishes the outputs and waits for
/// JetStream to confirm them.
async fn commit(
    core: &Shared,
    js: &async_nats::jetstream::Context,
    metrics: &BusMetrics,
) -> Result<(), CommitError> {
    persist(core).await?;
    publish(core, js, metrics).await
}

/// Outputs waiting to be published past which a consumer's commit publishes them itself and waits (so a
/// publisher that can't keep up, or a JetStream that refuses them, holds the consumers back instead of
/// growing the outbox without bound).
const OUTBOX_HOLD: usize = 5_000;

/// How long a stopping correlator tries to publish the outputs its last commits left.
const STOP_PUBLISH_WITHIN: Duration = Duration::from_secs(5);

/// Publishes the outbox whenever a consumer's commit made outputs durable (see [`Feed::commit`]).
/// Stops with the consumers; [`run`] publishes what they left.
async fn publisher(core: Shared, ctx: Context) {
    let kick = core.lock().await.kick.clone();
    loop {
        tokio::select! {
            _ = ctx.cancel.cancelled() => return,
            _ = kick.notified() => {}
        }
        if let Err(err) = publish(&core, &ctx.js, &ctx.bus_metrics).await {
            // the clock's commit tries again every tick, and a growing outbox holds the consumers back
            tracing::warn!(error = %err, "publishing incidents failed; will retry");
        }
    }
}

/// Feeds one durable's messages to the machine.
struct Feed {
    core: Shared,
    consumer: &'static str,
    js: async_nats::jetstream::Context,
    metrics: BusMetrics,
}

impl Feed {
    fn new(ctx: &Context, core: &Shared, consumer: &'static str) -> Self {
        Feed {
            core: core.clone(),
            consumer,
            js: ctx.js.clone(),
            metrics: ctx.bus_metrics.clone(),
        }
    }
}

/// A payload a [`Feed`] hands to the machine.
trait Fed: Payload {
    /// Applies one delivered message.
    fn apply(core: &mut Core, consumer: &str, msg: Received<Self>);
}

impl Fed for KubeEvent {
    fn apply(core: &mut Core, consumer: &str, msg: Received<Self>) {
        core.apply(consumer, msg.stream_seq, Input::Event(&msg.envelope));
    }
}

impl Fed for HealthMsg {
    fn apply(core: &mut Core, consumer: &str, msg: Received<Self>) {
        let (seq, ingest) = (msg.stream_seq, msg.ingest_time);
        let env = msg.envelope;
        match env.payload.clone() {
            HealthMsg::Heartbeat(hb) => {
                core.apply(consumer, seq, Input::Heartbeat(&env.map(|_| hb), ingest));
            }
            HealthMsg::Probe(p) => {
                core.apply(consumer, seq, Input::Probe(&env.map(|_| p), ingest));
            }
        }
    }
}

impl Fed for StateMsg {
    fn apply(core: &mut Core, consumer: &str, msg: Received<Self>) {
        core.apply(consumer, msg.stream_seq, Input::State(&msg.envelope));
    }
}

impl Fed for ClusterFacts {
    fn apply(core: &mut Core, consumer: &str, msg: Received<Self>) {
        core.apply(consumer, msg.stream_seq, Input::Facts(&msg.envelope));
    }
}

impl<T: Fed> Handler<T> for Feed {
    async fn handle(&mut self, msg: Received<T>) -> Outcome {
        T::apply(&mut *self.core.lock().await, self.consumer, msg);
        Outcome::Done
    }
    /// The batch's outputs are made durable with the state, so its messages can be acked before they are
    /// published: [`publisher`] publishes them meanwhile. Waiting for JetStream's confirmations here held
    /// every consumer to one round trip per batch, which a busy server made long (at 50 clusters, the
    /// events consumer took a first start's burst at 1,500–1,900 events/s at a quarter of a core).
    async fn commit(&mut self) -> Result<(), CommitError> {
        persist(&self.core).await?;
        let (waiting, kick) = {
            let c = self.core.lock().await;
            (c.outbox.len(), c.kick.clone())
        };
        if waiting >= OUTBOX_HOLD {
            return publish(&self.core, &self.js, &self.metrics).await;
        }
        kick.notify_one();
        Ok(())
    }
}

/// The topology consumers the correlator reads, by stream.
const EVENTS: (&str, &str) = (name::EVENTS, "correlator-events");
const HEALTH: (&str, &str) = (name::HEALTH, "correlator-health");
const STATE: (&str, &str) = (name::STATE, "correlator-state");
const FACTS: (&str, &str) = (name::FACTS, "correlator-facts");

/// This instance's durable on a topology consumer: the shared one, or its partition's own.
fn durable(cfg: &Config, (stream, base): (&str, &str)) -> Durable {
    if cfg.partitions <= 1 {
        Durable::shared(stream, base)
    } else {
        Durable::partitioned(
            stream,
            base,
            cfg.partition,
            cfg.partitions,
            crate::partition_filters(stream, cfg.partition),
        )
    }
}

/// What a wiped store reads back from FLEET_INCIDENTS.
struct History {
    /// The latest revision of every incident of this instance's partition.
    incidents: Vec<Incident>,
    /// The latest compliance report of every cluster of the partition.
    reports: Vec<ComplianceReport>,
    /// The latest revision of every fleet incident (unpartitioned: each partition judges its own
    /// clusters, and publishes under the same subjects).
    fleet: Vec<FleetIncident>,
}

/// Reads FLEET_INCIDENTS back for this instance's partition.
async fn read_incidents(js: &async_nats::jetstream::Context, cfg: &Config) -> Result<History> {
    use std::collections::BTreeMap;
    let mut incidents: BTreeMap<String, Incident> = BTreeMap::new();
    let mut reports: BTreeMap<String, ComplianceReport> = BTreeMap::new();
    let mut fleet: BTreeMap<String, FleetIncident> = BTreeMap::new();
    let mine = |subject: &str| {
        cfg.partitions <= 1
            || subject
                .split('.')
                .nth(2)
                .is_some_and(|t| crate::partition_of(t, cfg.partitions) == cfg.partition)
    };
    let mut filters = vec![subject::INCIDENT.all(), subject::COMPLIANCE.all()];
    if cfg.partitions <= 1 {
        filters.push(subject::FLEET_INCIDENT.all());
    }
    js_kit::read_history(js, name::INCIDENTS, filters, Start::Oldest, |s| {
        let m = s.message;
        if subject::FLEET_INCIDENT.contains(&m.subject) {
            if let Ok(env) = js_kit::decode::<FleetIncident>(m, usize::MAX) {
                let f = env.payload;
                if fleet
                    .get(&f.id)
                    .is_none_or(|cur| cur.revision <= f.revision)
                {
                    fleet.insert(f.id.clone(), f);
                }
            }
            return;
        }
        if !mine(&m.subject) {
            return;
        }
        if subject::INCIDENT.contains(&m.subject) {
            if let Ok(env) = js_kit::decode::<Incident>(m, usize::MAX) {
                let inc = env.payload;
                if incidents
                    .get(&inc.id)
                    .is_none_or(|cur| cur.revision <= inc.revision)
                {
                    incidents.insert(inc.id.clone(), inc);
                }
            }
        } else if let Ok(env) = js_kit::decode::<ComplianceReport>(m, usize::MAX) {
            reports.insert(env.payload.cluster.clone(), env.payload);
        }
    })
    .await?;
    Ok(History {
        incidents: incidents.into_values().collect(),
        reports: reports.into_values().collect(),
        fleet: fleet.into_values().collect(),
    })
}

/// Applies `which`'s stream from `start` up to `until` (this instance's subjects) through the consumer's
/// handler, in stream order, as if the durable had delivered it; the machine's high-water mark then makes
/// the durable skip what was applied here. Messages that can't be decoded (the runner dead-letters them
/// when they come) are skipped.
async fn apply_range<T: Fed>(
    ctx: &Context,
    core: &Shared,
    which: (&'static str, &'static str),
    filters: Vec<String>,
    start: Start,
    until: u64,
) -> Result<u64> {
    let mut got = Vec::new();
    js_kit::read_range(&ctx.js, which.0, filters, start, Some(until), |s| {
        if let Ok(envelope) = js_kit::decode::<T>(s.message, DEFAULT_MAX_BYTES)
            && multipilot_schemas::subject::cluster_of(&s.message.subject)
                .is_none_or(|c| c == envelope.cluster)
        {
            got.push(Received {
                envelope,
                subject: s.message.subject.to_string(),
                ingest_time: s.published,
                stream_seq: s.stream_seq,
                delivered: 1,
                msg_id: js_kit::header(s.message, multipilot_schemas::HEADER_MSG_ID)
                    .map(str::to_string),
            });
        }
    })
    .await?;
    let n = got.len() as u64;
    let mut feed = Feed::new(ctx, core, which.1);
    for r in got {
        let _ = feed.handle(r).await;
    }
    Ok(n)
}

/// The subjects this instance's durable on `which` reads (its partition's, or the durable's own filter).
fn filters_of(
    cfg: &Config,
    which: (&str, &str),
    info: &async_nats::jetstream::consumer::Info,
) -> Vec<String> {
    let d = durable(cfg, which);
    if !d.filters.is_empty() {
        return d.filters;
    }
    let c = &info.config;
    if !c.filter_subjects.is_empty() {
        c.filter_subjects.clone()
    } else if !c.filter_subject.is_empty() {
        vec![c.filter_subject.clone()]
    } else {
        Vec::new()
    }
}

/// A wiped store: replays `which` from `since` up to what its durable acked (what was lost with the store;
/// what it has not acked it delivers again anyway). On a first start there is no such durable, or nothing
/// acked: nothing to replay.
async fn catch_up<T: Fed>(
    ctx: &Context,
    cfg: &Config,
    core: &Shared,
    which: (&'static str, &'static str),
    since: chrono::DateTime<Utc>,
) -> Result<u64> {
    let Some(info) = durable(cfg, which).info(&ctx.js).await? else {
        return Ok(0);
    };
    let floor = info.ack_floor.stream_sequence;
    if floor == 0 {
        return Ok(0);
    }
    let filters = filters_of(cfg, which, &info);
    apply_range::<T>(ctx, core, which, filters, Start::Since(since), floor).await
}

/// After a restart: what the durable delivered to the previous process beyond what that process made
/// durable (above the machine's high-water mark, up to the durable's last delivered sequence) is applied
/// now, in stream order, before the durable starts. JetStream would redeliver it only after the ack wait,
/// behind newer messages, and the machine would then take a probe round or an event as late; with this, a
/// crash changes neither the order nor the outcome, and the redeliveries are skipped by the high-water mark.
async fn recover_in_flight<T: Fed>(
    ctx: &Context,
    cfg: &Config,
    core: &Shared,
    which: (&'static str, &'static str),
) -> Result<u64> {
    let Some(info) = durable(cfg, which).info(&ctx.js).await? else {
        return Ok(0);
    };
    let delivered = info.delivered.stream_sequence;
    let applied = core.lock().await.machine.high_water(which.1);
    if delivered <= applied {
        return Ok(0);
    }
    let filters = filters_of(cfg, which, &info);
    let n = apply_range::<T>(ctx, core, which, filters, Start::After(applied), delivered).await?;
    if n > 0 {
        tracing::info!(
            consumer = which.1,
            messages = n,
            "applied what the previous process had received but not made durable, in stream order"
        );
    }
    Ok(n)
}

/// Rebuilds a new or wiped store from the streams, before the consumers start.
///
/// - Incidents and compliance reports come back from FLEET_INCIDENTS (the latest revision of each), so
///   open incidents stay open and their revisions continue: a new revision never re-uses a stored number
///   with different content, and its Msg-Id never clashes.
/// - FLEET_STATE and FLEET_FACTS keep the last value of every subject: their durables are deleted and
///   created again, so the inventory and the baseline verdicts are rebuilt from the start.
/// - FLEET_HEALTH and FLEET_EVENTS are history (24 h, 7 d). Replaying all of it would only re-run what
///   the restored incidents already say, so only the last `replay_window` is applied (probe streaks,
///   heartbeat silence, event-storm windows), read with an ordered consumer before the durables start;
///   the machine's high-water marks then make the durables skip it. Digests of replayed events are not
///   published again. The machine already ignores a message older than an incident's last change, so
///   the replay neither reopens resolved incidents nor rewrites open ones.
async fn rebuild(ctx: &Context, cfg: &Config, core: &Shared) -> Result<()> {
    let History {
        incidents,
        reports,
        fleet,
    } = read_incidents(&ctx.js, cfg).await?;
    let (n_inc, n_rep) = (incidents.len(), reports.len());
    let restored = {
        let mut c = core.lock().await;
        c.machine.restore_fleet(fleet);
        c.machine.restore(incidents, reports)
    };
    let since = Utc::now()
        - chrono::Duration::from_std(cfg.replay_window).unwrap_or(chrono::Duration::minutes(15));
    core.lock().await.machine.set_replaying(true);
    let events = catch_up::<KubeEvent>(ctx, cfg, core, EVENTS, since).await;
    core.lock().await.machine.set_replaying(false);
    let events = events?;
    let health = catch_up::<HealthMsg>(ctx, cfg, core, HEALTH, since).await?;
    tracing::info!(
        incidents = n_inc,
        restored,
        reports = n_rep,
        events,
        health,
        "fresh store: rebuilt from the streams"
    );
    Ok(())
}

/// Starts one durable consumer's runner as a task.
async fn spawn_consumer<T: Fed>(
    tasks: &mut JoinSet<()>,
    ctx: &Context,
    cfg: &Config,
    core: &Shared,
    which: (&'static str, &'static str),
    replay: bool,
) -> Result<()> {
    let name = durable(cfg, which).ensure(&ctx.js, replay).await?;
    let runner = Runner::new(
        ctx.js.clone(),
        consume::Config {
            stream: which.0.into(),
            durable: name.clone(),
            batch: cfg.batch,
            rate: cfg.rate.clone(),
            ..Default::default()
        },
        ctx.bus_metrics.clone(),
    );
    let mut feed = Feed::new(ctx, core, which.1);
    let cancel = ctx.cancel.clone();
    tasks.spawn(async move {
        if let Err(e) = runner.run::<T, _>(&mut feed, cancel).await {
            tracing::error!(error = %e, consumer = %name, "consumer stopped");
        }
    });
    Ok(())
}

/// After a rebuild: judges the baseline once the inventory's replay has caught up.
async fn judge_after_replay(core: Shared, ctx: Context, cfg: Config) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1800);
    loop {
        if durable(&cfg, STATE).caught_up(&ctx.js).await
            && durable(&cfg, FACTS).caught_up(&ctx.js).await
        {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            tracing::warn!(
                "the inventory replay did not catch up in 30 min; judging the baseline anyway"
            );
            break;
        }
        tokio::select! {
            _ = ctx.cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
    {
        let mut c = core.lock().await;
        let outs = c.machine.release_judgement(Utc::now());
        c.outbox.push(outs);
    }
    if let Err(e) = commit(&core, &ctx.js, &ctx.bus_metrics).await {
        tracing::warn!(error = %e, "publishing the baseline verdicts failed; will retry");
    }
    tracing::info!("inventory replayed; baseline judged");
}

/// How often FLEET_RELEASE is read for new batches.
const RELEASES_EVERY: Duration = Duration::from_secs(5);

/// Follows the release batches and rollbacks on FLEET_RELEASE (`fleet.release.*.batch` and
/// `.rolled-back`: from the oldest, then what is new every [`RELEASES_EVERY`]), so a fleet incident can
/// name the release that reached its failing clusters as a suspect, and what runs where is a cluster
/// attribute. A hub without the release role has no such stream yet: it is looked for again each round,
/// quietly.
async fn follow_releases(core: Shared, ctx: Context) {
    let mut after: Option<u64> = None;
    let mut missing_said = false;
    loop {
        // nothing is read (no consumer made) while the stream holds nothing new
        let last = match js_kit::get_stream(&ctx.js, name::RELEASE).await {
            Ok(mut stream) => stream.info().await.map(|i| i.state.last_sequence).ok(),
            Err(js_kit::Error::NoStream { .. }) => {
                if !missing_said {
                    tracing::info!(
                        "no FLEET_RELEASE stream (yet): releases can't be named as suspects"
                    );
                    missing_said = true;
                }
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "looking up FLEET_RELEASE");
                None
            }
        };
        if let Some(last) = last.filter(|l| after != Some(*l)) {
            missing_said = false;
            let start = match after {
                Some(seq) => Start::After(seq),
                // the whole history on the first round: what runs where (a shared attribute) may
                // have been rolled out long ago; the store keeps it, so a restart reads it again for
                // nothing but a few records per release
                None => Start::Oldest,
            };
            let mut batches: Vec<multipilot_schemas::Envelope<ReleaseEvent>> = Vec::new();
            let read = js_kit::read_range(
                &ctx.js,
                name::RELEASE,
                vec![
                    subject::RELEASE.ending_in("batch"),
                    subject::RELEASE.ending_in("rolled-back"),
                ],
                start,
                Some(last),
                |s| {
                    if let Ok(env) = js_kit::decode::<ReleaseEvent>(s.message, DEFAULT_MAX_BYTES) {
                        batches.push(env);
                    }
                },
            )
            .await;
            match read {
                Ok(_) => {
                    after = Some(last);
                    if !batches.is_empty() {
                        let mut c = core.lock().await;
                        for env in &batches {
                            let outs = c.machine.apply(Input::Release(env));
                            c.outbox.push(outs);
                        }
                        drop(c);
                        if let Err(err) = commit(&core, &ctx.js, &ctx.bus_metrics).await {
                            tracing::warn!(error = %err, "publishing incidents failed; will retry");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reading release batches from FLEET_RELEASE"),
            }
        }
        tokio::select! {
            _ = ctx.cancel.cancelled() => return,
            _ = tokio::time::sleep(RELEASES_EVERY) => {}
        }
    }
}

/// The hub's clock: silent clusters, and hourly housekeeping.
async fn clock(core: Shared, ctx: Context, every: Duration) {
    let mut tick = tokio::time::interval(every);
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = ctx.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        n += 1;
        {
            let mut c = core.lock().await;
            let now = Utc::now();
            let mut outs = c.machine.apply(Input::Tick(now));
            if n.is_multiple_of(3600) {
                outs.extend(c.machine.apply(Input::Housekeeping(now)));
            }
            c.outbox.push(outs);
        }
        if let Err(err) = commit(&core, &ctx.js, &ctx.bus_metrics).await {
            tracing::warn!(error = %err, "publishing incidents failed; will retry");
        }
    }
}

/// Answers a request with `body`, saying how many partitions answer (the asker gathers them all).
async fn answer(
    client: &async_nats::Client,
    reply: async_nats::Subject,
    partitions: &str,
    body: Vec<u8>,
) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(HEADER_PARTITIONS, partitions);
    if let Err(e) = client
        .publish_with_headers(reply, headers, body.into())
        .await
    {
        tracing::debug!(error = %e, "answering a query failed");
    }
}

/// The queries the correlator answers.
enum Query {
    Incidents,
    FleetIncidents,
    Compliance,
    BlastRadius,
    Consistency,
}

/// The subscriptions the queries come on.
struct Queries {
    incidents: async_nats::Subscriber,
    fleet: async_nats::Subscriber,
    compliance: async_nats::Subscriber,
    blast_radius: async_nats::Subscriber,
    consistency: async_nats::Subscriber,
}

/// Answers `fleet.query.incidents`, `fleet.query.fleet-incidents`, `fleet.query.compliance`,
/// `fleet.query.consistency` and `fleet.query.blast-radius`.
async fn answer_queries(
    core: Shared,
    client: async_nats::Client,
    mut q: Queries,
    partitions: String,
    cancel: CancellationToken,
) {
    loop {
        let (msg, query) = tokio::select! {
            _ = cancel.cancelled() => return,
            Some(m) = q.incidents.next() => (m, Query::Incidents),
            Some(m) = q.fleet.next() => (m, Query::FleetIncidents),
            Some(m) = q.compliance.next() => (m, Query::Compliance),
            Some(m) = q.blast_radius.next() => (m, Query::BlastRadius),
            Some(m) = q.consistency.next() => (m, Query::Consistency),
        };
        let Some(reply) = msg.reply.clone() else {
            continue;
        };
        // an empty or unreadable body asks for the default (open and acknowledged incidents)
        let all = serde_json::from_slice::<IncidentsQuery>(&msg.payload)
            .unwrap_or_default()
            .all;
        let body = {
            let mut c = core.lock().await;
            // what the batch in progress changed, judged (published with its next commit)
            let outs = c.machine.settle();
            c.outbox.push(outs);
            match query {
                Query::Incidents => serde_json::to_vec(&c.machine.current(all)),
                Query::FleetIncidents => serde_json::to_vec(&c.machine.current_fleet(all)),
                Query::Compliance => serde_json::to_vec(&c.machine.compliance()),
                Query::Consistency => serde_json::to_vec(&c.machine.consistency()),
                // an unreadable request names no cluster: nothing is known of it
                Query::BlastRadius => {
                    let cluster = serde_json::from_slice::<BlastRadiusQuery>(&msg.payload)
                        .unwrap_or_default()
                        .cluster;
                    let found: Vec<_> = c.machine.blast_radius(&cluster).into_iter().collect();
                    serde_json::to_vec(&found)
                }
            }
        };
        match body {
            Ok(body) => answer(&client, reply, &partitions, body).await,
            Err(e) => tracing::error!(error = %e, "cannot encode a query answer"),
        }
    }
}

/// Carries out incident commands (acknowledge, resolve) from the console.
async fn answer_commands(
    core: Shared,
    ctx: Context,
    mut commands: async_nats::Subscriber,
    partitions: String,
) {
    loop {
        let msg = tokio::select! {
            _ = ctx.cancel.cancelled() => return,
            Some(m) = commands.next() => m,
        };
        let Some(reply_to) = msg.reply.clone() else {
            continue;
        };
        let reply = match serde_json::from_slice::<IncidentCommand>(&msg.payload) {
            Err(e) => CommandReply::failed(format!("not an incident command: {e}"), None),
            Ok(cmd) => {
                let (outcome, incident) = {
                    let mut c = core.lock().await;
                    let (outcome, incident, outs) = c.machine.command(&cmd, Utc::now());
                    c.outbox.push(outs);
                    (outcome, incident)
                };
                match outcome {
                    // the new revision and the audit record are durable and published before the asker
                    // hears it is done
                    CommandOutcome::Done => match commit(&core, &ctx.js, &ctx.bus_metrics).await {
                        Ok(()) => CommandReply::new(outcome, incident),
                        Err(e) => CommandReply::failed(e.to_string(), incident),
                    },
                    CommandOutcome::Conflict => CommandReply {
                        outcome,
                        error: incident
                            .as_ref()
                            .map(|i| format!("incident is {:?}", i.status).to_lowercase()),
                        incident,
                    },
                    _ => CommandReply::new(outcome, incident),
                }
            }
        };
        match serde_json::to_vec(&reply) {
            Ok(body) => answer(&ctx.nats, reply_to, &partitions, body).await,
            Err(e) => tracing::error!(error = %e, "cannot encode a command reply"),
        }
    }
}

async fn subscribe(
    client: &async_nats::Client,
    subject: &'static str,
) -> Result<async_nats::Subscriber> {
    client
        .subscribe(subject)
        .await
        .map_err(|e| Error::Subscribe {
            subject,
            reason: e.to_string(),
        })
}

/// Runs the correlator until `ctx.cancel` fires.
pub async fn run(config: Config, ctx: Context) -> Result<()> {
    if config.partitions < 1 || config.partition >= config.partitions {
        return Err(Error::Config(format!(
            "correlator.partition ({}) must be in 0..partitions ({})",
            config.partition, config.partitions
        )));
    }
    let rules = crate::rules::Rules::load(config.rules.as_deref())?;
    let baseline = crate::baseline::Baseline::load(config.baseline.as_deref())?;
    let dir = std::path::PathBuf::from(&config.data_dir);
    let store = Store::open(&dir, config.cache_bytes)?;
    multipilot_runtime::store::report_cache(&ctx.registry, "correlator", config.cache_bytes);
    // a new or wiped store rebuilds from the streams; the marker is written once that is done (and the
    // durables are recreated), so a crash in between rebuilds again
    let fresh = store.is_fresh()?;
    let (snapshot, outbox) = store.load()?;
    let mut machine = Machine::restore_snapshot(rules, baseline, &ctx.instance, snapshot);
    machine.defer_fleet_judgement();
    let core: Shared = Arc::new(Mutex::new(Core {
        machine,
        outbox,
        store,
        publishing: Arc::default(),
        kick: Arc::default(),
    }));
    if fresh {
        rebuild(&ctx, &config, &core).await?;
        core.lock().await.machine.hold_judgement();
    }
    if !fresh {
        recover_in_flight::<KubeEvent>(&ctx, &config, &core, EVENTS).await?;
        recover_in_flight::<HealthMsg>(&ctx, &config, &core, HEALTH).await?;
        recover_in_flight::<StateMsg>(&ctx, &config, &core, STATE).await?;
        recover_in_flight::<ClusterFacts>(&ctx, &config, &core, FACTS).await?;
    }
    // outputs left from before a crash (or raised by the rebuild or the recovery) go out first
    commit(&core, &ctx.js, &ctx.bus_metrics).await?;
    ctx.health.register("correlator");

    let mut tasks = JoinSet::new();
    // with a fresh store, the last-value streams replay from their start
    spawn_consumer::<KubeEvent>(&mut tasks, &ctx, &config, &core, EVENTS, false).await?;
    spawn_consumer::<HealthMsg>(&mut tasks, &ctx, &config, &core, HEALTH, false).await?;
    spawn_consumer::<StateMsg>(&mut tasks, &ctx, &config, &core, STATE, fresh).await?;
    spawn_consumer::<ClusterFacts>(&mut tasks, &ctx, &config, &core, FACTS, fresh).await?;
    if fresh {
        core.lock().await.store.mark_initialized().await?;
        tasks.spawn(judge_after_replay(
            core.clone(),
            ctx.clone(),
            config.clone(),
        ));
    }
    tasks.spawn(publisher(core.clone(), ctx.clone()));
    tasks.spawn(clock(
        core.clone(),
        ctx.clone(),
        Duration::from_millis(config.tick_ms.max(100)),
    ));
    tasks.spawn(follow_releases(core.clone(), ctx.clone()));
    let partitions = config.partitions.to_string();
    tasks.spawn(answer_queries(
        core.clone(),
        ctx.nats.clone(),
        Queries {
            incidents: subscribe(&ctx.nats, QUERY_INCIDENTS).await?,
            fleet: subscribe(&ctx.nats, QUERY_FLEET_INCIDENTS).await?,
            compliance: subscribe(&ctx.nats, QUERY_COMPLIANCE).await?,
            blast_radius: subscribe(&ctx.nats, QUERY_BLAST_RADIUS).await?,
            consistency: subscribe(&ctx.nats, QUERY_CONSISTENCY).await?,
        },
        partitions.clone(),
        ctx.cancel.clone(),
    ));
    tasks.spawn(answer_commands(
        core.clone(),
        ctx.clone(),
        subscribe(&ctx.nats, COMMAND_INCIDENT).await?,
        partitions,
    ));
    ctx.health.set("correlator", true);
    tracing::info!(data_dir = %config.data_dir, "correlator running");
    while tasks.join_next().await.is_some() {}
    // the consumers' last commits were acked once durable and the publisher stopped with them: what they
    // left goes out now, or with the next start from this store if JetStream can't take it in time
    match tokio::time::timeout(
        STOP_PUBLISH_WITHIN,
        commit(&core, &ctx.js, &ctx.bus_metrics),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "publishing the last outputs at the stop failed; the next start publishes them")
        }
        Err(_) => tracing::warn!(
            "publishing the last outputs at the stop took too long; the next start publishes them"
        ),
    }

    let core = Arc::try_unwrap(core)
        .map_err(|_| Error::Internal("its tasks still hold the state after stopping".into()))?
        .into_inner();
    let Core {
        mut machine,
        mut outbox,
        store,
        ..
    } = core;
    // fleet incidents changed since the last commit are judged and kept (published at the next start)
    outbox.push(machine.settle());
    store.write(machine.take_all_changes(), &mut outbox)?;
    let s = machine.stats();
    store.close().await?;
    tracing::info!(
        events_in = s.events_in,
        events_passed = s.events_passed,
        replays_skipped = s.replays_skipped,
        late_ignored = s.late_ignored,
        "correlator stopped"
    );
    Ok(())
}
