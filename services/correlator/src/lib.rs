//! The correlator role: turns raw fleet messages into the few things a person must look at.
//!
//! Reads (durable consumers): `fleet.event.>` (correlator-events), `fleet.hb.>` + `fleet.probe.>`
//! (correlator-health), `fleet.state.>` + `fleet.resync.>` (correlator-state), `fleet.facts.>`
//! (correlator-facts). Writes: `fleet.incident.<cluster>.<kind>` (every incident change) and
//! `fleet.compliance.<cluster>` (baseline reports), and `fleet.audit.console.incident-<action>` for the
//! incident commands it carries out. Answers `fleet.query.incidents` and `fleet.query.compliance`
//! (request/reply, JSON) and the incident commands on `fleet.ctl.incident` (acknowledge, resolve).

pub mod baseline;
pub mod dedup;
pub mod engine;
pub mod mask;
pub mod noise;
pub mod rules;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use chrono::Utc;
use futures::StreamExt;
use multipilot_bus::consume::{self, Handler, Outcome, Received, Runner};
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use multipilot_runtime::Context;
use multipilot_schemas::payload::{
    ClusterFacts, ComplianceReport, Heartbeat, KubeEvent, ProbeResult, ResourceDeleted,
    ResourceState, ResyncMarker,
};
use multipilot_schemas::{Envelope, Payload, envelope::decode_member};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::engine::Engine;

/// Subject answering the current incidents (request body: `{"all": bool}`).
pub const QUERY_INCIDENTS: &str = "fleet.query.incidents";
/// Subject answering the current compliance reports.
pub const QUERY_COMPLIANCE: &str = "fleet.query.compliance";
/// Header on query replies: how many partitions (instances) answer, so the asker knows when it has all.
pub const HEADER_PARTITIONS: &str = "Multipilot-Partitions";
/// Subject of incident commands (request/reply, JSON [`IncidentCommand`] → [`CommandReply`]).
pub const COMMAND_INCIDENT: &str = "fleet.ctl.incident";

/// What a person does to an incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IncidentAction {
    /// Acknowledge: someone is on it.
    Ack,
    /// Resolve by hand: it is over (a condition still failing opens a new incident).
    Resolve,
}

impl IncidentAction {
    /// The action's name (`ack`, `resolve`).
    pub fn name(self) -> &'static str {
        match self {
            IncidentAction::Ack => "ack",
            IncidentAction::Resolve => "resolve",
        }
    }
}

/// A request on [`COMMAND_INCIDENT`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentCommand {
    /// Incident id.
    pub id: String,
    /// What to do.
    pub action: IncidentAction,
    /// Who does it (the console's token subject).
    pub actor: String,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CommandOutcome {
    /// Changed: a new revision and an audit record are published.
    Done,
    /// Already so (acknowledging an acknowledged incident): nothing published.
    Unchanged,
    /// This instance has no incident with that id.
    NotFound,
    /// Not possible in the incident's state (acknowledging a resolved incident).
    Conflict,
    /// The change could not be made durable or published; try again.
    Failed,
}

/// The reply on [`COMMAND_INCIDENT`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandReply {
    /// Outcome.
    pub outcome: CommandOutcome,
    /// The incident after the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incident: Option<multipilot_schemas::payload::Incident>,
    /// What went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Sends an incident command to every correlator instance and returns the answer of the one that owns the
/// incident (or `NotFound` once every partition said so).
pub async fn command(
    client: &async_nats::Client,
    cmd: &IncidentCommand,
    timeout: Duration,
) -> Result<CommandReply> {
    let inbox = client.new_inbox();
    let mut sub = client.subscribe(inbox.clone()).await?;
    client
        .publish_with_reply(COMMAND_INCIDENT, inbox, serde_json::to_vec(cmd)?.into())
        .await?;
    client.flush().await?;
    let deadline = tokio::time::Instant::now() + timeout;
    let (mut answers, mut expected, mut last) = (0usize, None::<usize>, None);
    while expected.is_none_or(|n| answers < n) {
        let Ok(Some(m)) = tokio::time::timeout_at(deadline, sub.next()).await else {
            break;
        };
        answers += 1;
        if expected.is_none() {
            expected = m
                .headers
                .as_ref()
                .and_then(|h| h.get(HEADER_PARTITIONS))
                .and_then(|v| v.as_str().parse().ok());
        }
        let reply: CommandReply = serde_json::from_slice(&m.payload)
            .context("a correlator answered something that is not a command reply")?;
        if reply.outcome != CommandOutcome::NotFound {
            return Ok(reply);
        }
        last = Some(reply);
    }
    last.with_context(|| {
        format!("no correlator answered on {COMMAND_INCIDENT} (is `multipilot correlator` or `all` running?)")
    })
}

/// Asks every correlator instance (one per partition) and gathers their answers: JSON arrays, concatenated.
pub async fn query(
    client: &async_nats::Client,
    subject: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<Vec<serde_json::Value>> {
    let inbox = client.new_inbox();
    let mut sub = client.subscribe(inbox.clone()).await?;
    client
        .publish_with_reply(subject.to_string(), inbox, body.to_vec().into())
        .await?;
    client.flush().await?;
    let deadline = tokio::time::Instant::now() + timeout;
    let (mut answers, mut expected, mut out) = (0usize, None::<usize>, Vec::new());
    while expected.is_none_or(|n| answers < n) {
        let Ok(Some(m)) = tokio::time::timeout_at(deadline, sub.next()).await else {
            break;
        };
        answers += 1;
        if expected.is_none() {
            expected = m
                .headers
                .as_ref()
                .and_then(|h| h.get(HEADER_PARTITIONS))
                .and_then(|v| v.as_str().parse().ok());
        }
        let items: Vec<serde_json::Value> = serde_json::from_slice(&m.payload)
            .context("a correlator answered something that is not a JSON array")?;
        out.extend(items);
    }
    anyhow::ensure!(
        answers > 0,
        "no correlator answered on {subject} (is `multipilot correlator` or `all` running?)"
    );
    if let Some(n) = expected
        && answers < n
    {
        tracing::warn!(
            answers,
            expected = n,
            "not every correlator partition answered; the list is partial"
        );
    }
    Ok(out)
}

/// The correlator's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where its state lives (sled).
    pub data_dir: String,
    /// Rules file (default: the embedded `rules.yaml`).
    pub rules: Option<String>,
    /// Baseline file (default: the embedded `baseline.yaml`).
    pub baseline: Option<String>,
    /// Messages per pull.
    pub batch: usize,
    /// Milliseconds between clock ticks (heartbeat silence checks).
    pub tick_ms: u64,
    /// Partitions the fleet is split into (1: one instance owns every cluster). With N > 1, the NATS server
    /// maps agent subjects to carry `partition(N, cluster)` as a last token (`deploy/nats/partitions.conf`),
    /// and each instance reads only its partition through durable consumers of its own.
    pub partitions: u32,
    /// This instance's partition, 0..partitions.
    pub partition: u32,
    /// How far back a new or wiped store replays heartbeats, probes and events (see [`rebuild`]).
    #[serde(with = "humantime_serde")]
    pub replay_window: Duration,
    /// Input limits of each of its consumers (events, health, state, facts): a global rate and a per-cluster
    /// rate, so a reconnect storm or one flooding cluster can't swamp it. 0 = off (the default).
    pub rate: multipilot_bus::limit::Config,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: "./data/hub/correlator".into(),
            rules: None,
            baseline: None,
            batch: 500,
            tick_ms: 1000,
            partitions: 1,
            partition: 0,
            replay_window: Duration::from_secs(15 * 60),
            rate: multipilot_bus::limit::Config::default(),
        }
    }
}

/// What the health stream carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum HealthMsg {
    /// `fleet.hb.<cluster>`.
    Heartbeat(Heartbeat),
    /// `fleet.probe.<cluster>.<probe>`.
    Probe(ProbeResult),
}

impl Payload for HealthMsg {
    const SCHEMA: &'static str = "Heartbeat|ProbeResult";
    const VERSION: u32 = 1;
    fn accepts(schema: &str) -> Option<u32> {
        Heartbeat::accepts(schema).or_else(|| ProbeResult::accepts(schema))
    }
    fn decode_envelope(
        schema: &str,
        body: &[u8],
    ) -> Result<Envelope<Self>, rmp_serde::decode::Error> {
        if schema == Heartbeat::SCHEMA {
            decode_member(body, HealthMsg::Heartbeat)
        } else {
            decode_member(body, HealthMsg::Probe)
        }
    }
}

/// What the state stream carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
#[allow(clippy::large_enum_variant)] // one message at a time: boxing would only add an allocation
pub enum StateMsg {
    /// An object's state.
    State(ResourceState),
    /// Its tombstone.
    Deleted(ResourceDeleted),
    /// A resync marker.
    Resync(ResyncMarker),
}

impl Payload for StateMsg {
    const SCHEMA: &'static str = "ResourceState|ResourceDeleted|ResyncMarker";
    const VERSION: u32 = 1;
    fn accepts(schema: &str) -> Option<u32> {
        ResourceState::accepts(schema)
            .or_else(|| ResourceDeleted::accepts(schema))
            .or_else(|| ResyncMarker::accepts(schema))
    }
    fn decode_envelope(
        schema: &str,
        body: &[u8],
    ) -> Result<Envelope<Self>, rmp_serde::decode::Error> {
        match schema {
            s if s == ResourceState::SCHEMA => decode_member(body, StateMsg::State),
            s if s == ResourceDeleted::SCHEMA => decode_member(body, StateMsg::Deleted),
            _ => decode_member(body, StateMsg::Resync),
        }
    }
}

type Shared = Arc<Mutex<Engine>>;

/// Makes the engine's work durable, then publishes its outputs (outbox: a crash between the two
/// re-publishes them with the same Msg-Ids).
async fn commit(
    engine: &Shared,
    js: &async_nats::jetstream::Context,
    metrics: &multipilot_bus::metrics::BusMetrics,
) -> Result<(), String> {
    let pending = {
        let e = engine.lock().await;
        e.persist().await.map_err(|e| e.to_string())?;
        e.out.clone()
    };
    if pending.is_empty() {
        return Ok(());
    }
    let mut publisher: Publisher<String> = Publisher::new(js.clone(), 256, metrics.clone());
    let mut done = Vec::new();
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
    let mut failed = None;
    for c in completions {
        match c {
            Completion::Stored { key, .. } => done.push(key),
            Completion::Failed { error, .. } => failed = Some(error.to_string()),
        }
    }
    engine.lock().await.confirmed(&done);
    match failed {
        Some(e) => Err(format!("publishing incidents: {e}")),
        None => Ok(()),
    }
}

struct H {
    engine: Shared,
    consumer: &'static str,
    js: async_nats::jetstream::Context,
    metrics: multipilot_bus::metrics::BusMetrics,
}

impl Handler<KubeEvent> for H {
    async fn handle(&mut self, msg: Received<KubeEvent>) -> Outcome {
        let mut e = self.engine.lock().await;
        if e.replayed(self.consumer, msg.stream_seq) {
            return Outcome::Done;
        }
        match e.on_event(&msg.envelope) {
            Ok(()) => Outcome::Done,
            Err(err) => Outcome::Retry(err.to_string()),
        }
    }
    async fn commit(&mut self) -> Result<(), String> {
        commit(&self.engine, &self.js, &self.metrics).await
    }
}

impl Handler<HealthMsg> for H {
    async fn handle(&mut self, msg: Received<HealthMsg>) -> Outcome {
        let mut e = self.engine.lock().await;
        if e.replayed(self.consumer, msg.stream_seq) {
            return Outcome::Done;
        }
        let env = msg.envelope;
        match env.payload.clone() {
            HealthMsg::Heartbeat(hb) => e.on_heartbeat(&env.map(|_| hb), msg.ingest_time),
            HealthMsg::Probe(p) => e.on_probe(&env.map(|_| p), msg.ingest_time),
        }
        Outcome::Done
    }
    async fn commit(&mut self) -> Result<(), String> {
        commit(&self.engine, &self.js, &self.metrics).await
    }
}

impl Handler<StateMsg> for H {
    async fn handle(&mut self, msg: Received<StateMsg>) -> Outcome {
        let mut e = self.engine.lock().await;
        if !e.replayed(self.consumer, msg.stream_seq) {
            e.on_state(&msg.envelope);
        }
        Outcome::Done
    }
    async fn commit(&mut self) -> Result<(), String> {
        commit(&self.engine, &self.js, &self.metrics).await
    }
}

impl Handler<ClusterFacts> for H {
    async fn handle(&mut self, msg: Received<ClusterFacts>) -> Outcome {
        let mut e = self.engine.lock().await;
        if !e.replayed(self.consumer, msg.stream_seq) {
            e.on_facts(&msg.envelope);
        }
        Outcome::Done
    }
    async fn commit(&mut self) -> Result<(), String> {
        commit(&self.engine, &self.js, &self.metrics).await
    }
}

fn runner(ctx: &Context, cfg: &Config, stream: &str, durable: &str) -> Runner {
    Runner::new(
        ctx.js.clone(),
        consume::Config {
            stream: stream.into(),
            durable: durable.into(),
            batch: cfg.batch,
            rate: cfg.rate.clone(),
            ..Default::default()
        },
        ctx.bus_metrics.clone(),
    )
}

/// The subjects of one partition of a stream the correlator reads (the partition is the last token the
/// server's subject mapping adds).
pub fn partition_filters(stream: &str, partition: u32) -> Vec<String> {
    let k = partition;
    match stream {
        "FLEET_EVENTS" => vec![format!("fleet.event.*.*.{k}")],
        "FLEET_HEALTH" => vec![format!("fleet.hb.*.{k}"), format!("fleet.probe.*.*.{k}")],
        "FLEET_STATE" => vec![
            format!("fleet.state.*.*.*.*.{k}"),
            format!("fleet.resync.*.*.{k}"),
        ],
        "FLEET_FACTS" => vec![format!("fleet.facts.*.{k}")],
        _ => Vec::new(),
    }
}

/// The durable consumer this instance reads `stream` with: the shared one, or with partitions its
/// partition's own (created here, filtered to that partition's subjects).
///
/// With `replay` the durable is deleted first and created again with the same settings, so delivery
/// starts at the beginning of what the stream holds instead of its last acked position.
async fn durable_for(
    ctx: &Context,
    cfg: &Config,
    stream: &str,
    base: &'static str,
    replay: bool,
) -> Result<&'static str> {
    if cfg.partitions <= 1 && !replay {
        return Ok(base);
    }
    let name: &'static str = if cfg.partitions <= 1 {
        base
    } else {
        Box::leak(durable_name(cfg, base).into_boxed_str())
    };
    let def = multipilot_bus::topology::Topology::embedded()
        .consumer(stream, base)
        .cloned()
        .with_context(|| format!("no consumer {base} on {stream} in the topology"))?;
    let mut config = def.to_config();
    config.durable_name = Some(name.to_string());
    if cfg.partitions > 1 {
        config.filter_subjects = partition_filters(stream, cfg.partition);
    }
    let s = ctx
        .js
        .get_stream(stream)
        .await
        .with_context(|| format!("stream {stream}"))?;
    if replay {
        match s.delete_consumer(name).await {
            Ok(_) => tracing::info!(
                durable = name,
                "fresh store: replaying the stream from its start"
            ),
            Err(e) if e.to_string().contains("not found") => {}
            Err(e) => anyhow::bail!("deleting consumer {stream}/{name} for the replay: {e}"),
        }
    }
    s.create_consumer(config)
        .await
        .map_err(|e| anyhow::anyhow!("consumer {stream}/{name}: {e}"))?;
    Ok(name)
}

/// The partition of a cluster as the server's `partition(n, …)` mapping computes it: FNV-1a (32 bit) of
/// the cluster's subject token, modulo `n`.
pub fn partition_of(cluster_token: &str, partitions: u32) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in cluster_token.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % partitions.max(1)
}

/// Reads FLEET_INCIDENTS back for this instance's partition: the latest revision of every incident and
/// the latest compliance report of every cluster.
async fn read_incidents(
    js: &async_nats::jetstream::Context,
    cfg: &Config,
) -> Result<(
    Vec<multipilot_schemas::payload::Incident>,
    Vec<ComplianceReport>,
)> {
    use multipilot_schemas::payload::Incident;
    let mut incidents: std::collections::BTreeMap<String, Incident> = Default::default();
    let mut reports: std::collections::BTreeMap<String, ComplianceReport> = Default::default();
    let filters = vec![
        "fleet.incident.>".to_string(),
        "fleet.compliance.>".to_string(),
    ];
    let mine = |subject: &str| {
        cfg.partitions <= 1
            || subject
                .split('.')
                .nth(2)
                .is_some_and(|t| partition_of(t, cfg.partitions) == cfg.partition)
    };
    for_each_message(js, "FLEET_INCIDENTS", filters, None, |m, _| {
        if !mine(&m.subject) {
            return;
        }
        let ct = m
            .headers
            .as_ref()
            .and_then(|h| h.get(multipilot_schemas::HEADER_CONTENT_TYPE))
            .map(|v| v.as_str());
        let schema = m
            .headers
            .as_ref()
            .and_then(|h| h.get(multipilot_schemas::HEADER_SCHEMA))
            .map(|v| v.as_str());
        if m.subject.starts_with("fleet.incident.") {
            if let Ok(env) =
                multipilot_schemas::decode::<Incident>(ct, schema, &m.payload, usize::MAX)
            {
                let inc = env.payload;
                if incidents
                    .get(&inc.id)
                    .is_none_or(|cur| cur.revision <= inc.revision)
                {
                    incidents.insert(inc.id.clone(), inc);
                }
            }
        } else if let Ok(env) =
            multipilot_schemas::decode::<ComplianceReport>(ct, schema, &m.payload, usize::MAX)
        {
            reports.insert(env.payload.cluster.clone(), env.payload);
        }
    })
    .await?;
    Ok((
        incidents.into_values().collect(),
        reports.into_values().collect(),
    ))
}

/// Reads `stream` (only `filters` when given) from `since` (or its start) up to the last message it held
/// when called, with an ordered consumer; `f` gets each message and its stream sequence.
async fn for_each_message(
    js: &async_nats::jetstream::Context,
    stream: &str,
    filters: Vec<String>,
    since: Option<chrono::DateTime<Utc>>,
    mut f: impl FnMut(&async_nats::jetstream::Message, async_nats::jetstream::message::Info<'_>),
) -> Result<()> {
    use async_nats::jetstream::consumer;
    let mut s = js
        .get_stream(stream)
        .await
        .with_context(|| format!("stream {stream}"))?;
    let last = s
        .info()
        .await
        .with_context(|| format!("stream {stream} info"))?
        .state
        .last_sequence;
    let c = s
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subjects: filters,
            deliver_policy: match since {
                Some(start_time) => consumer::DeliverPolicy::ByStartTime { start_time },
                None => consumer::DeliverPolicy::All,
            },
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("reading {stream}: {e}"))?;
    let mut c = c;
    if c.info()
        .await
        .map_err(|e| anyhow::anyhow!("reading {stream}: {e}"))?
        .num_pending
        == 0
    {
        return Ok(());
    }
    let mut msgs = c
        .messages()
        .await
        .map_err(|e| anyhow::anyhow!("reading {stream}: {e}"))?;
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), msgs.next()).await;
        let m = match next {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => anyhow::bail!("reading {stream}: {e}"),
            Ok(None) => break,
            Err(_) => anyhow::bail!("reading {stream}: no message for 10s before its end"),
        };
        let Ok(info) = m.info() else { continue };
        let (seq, pending) = (info.stream_sequence, info.pending);
        f(&m, info);
        if pending == 0 || seq >= last {
            break;
        }
    }
    Ok(())
}

/// Replays `stream` from `since` (this partition's subjects) through the handler, as if the durable had
/// delivered it; the engine's high-water mark then makes the durable skip what was applied here.
async fn catch_up<T: Payload>(
    ctx: &Context,
    cfg: &Config,
    engine: &Shared,
    stream: &str,
    base: &'static str,
    since: chrono::DateTime<Utc>,
) -> Result<u64>
where
    H: Handler<T>,
{
    let filters = if cfg.partitions > 1 {
        partition_filters(stream, cfg.partition)
    } else {
        Vec::new()
    };
    // Only what the durable had already acknowledged (before the store was lost) is replayed here, quietly;
    // what it has not delivered yet it still delivers, and that is handled as new (digests published). On a
    // first start there is no such durable, or nothing acknowledged: nothing to replay.
    let durable = durable_name(cfg, base);
    let floor = match ctx.js.get_stream(stream).await {
        Ok(s) => s
            .consumer_info(&durable)
            .await
            .map(|i| i.ack_floor.stream_sequence)
            .unwrap_or(0),
        Err(e) => anyhow::bail!("stream {stream}: {e}"),
    };
    if floor == 0 {
        return Ok(0);
    }
    let mut got = Vec::new();
    for_each_message(&ctx.js, stream, filters, Some(since), |m, info| {
        if info.stream_sequence > floor {
            return;
        }
        let header = |n: &str| {
            m.headers
                .as_ref()
                .and_then(|h| h.get(n))
                .map(|v| v.as_str().to_string())
        };
        let decoded = multipilot_schemas::decode::<T>(
            header(multipilot_schemas::HEADER_CONTENT_TYPE).as_deref(),
            header(multipilot_schemas::HEADER_SCHEMA).as_deref(),
            &m.payload,
            usize::MAX,
        );
        // what the runner dead-lettered then is skipped now
        if let Ok(envelope) = decoded
            && multipilot_schemas::subject::cluster_of(&m.subject)
                .is_none_or(|c| c == envelope.cluster)
        {
            got.push(Received {
                envelope,
                subject: m.subject.to_string(),
                ingest_time: info.published,
                stream_seq: info.stream_sequence,
                delivered: 1,
                msg_id: header(multipilot_schemas::HEADER_MSG_ID),
            });
        }
    })
    .await?;
    let n = got.len() as u64;
    let mut h = H {
        engine: engine.clone(),
        consumer: base,
        js: ctx.js.clone(),
        metrics: ctx.bus_metrics.clone(),
    };
    for r in got {
        let _ = h.handle(r).await;
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
///   the engine's high-water marks then make the durables skip it. Digests of replayed events are not
///   published again. The engine already ignores a message older than an incident's last change, so
///   the replay neither reopens resolved incidents nor rewrites open ones.
pub async fn rebuild(ctx: &Context, cfg: &Config, engine: &Shared) -> Result<()> {
    let (incidents, reports) = read_incidents(&ctx.js, cfg).await?;
    let (n_inc, n_rep) = (incidents.len(), reports.len());
    let restored = engine.lock().await.restore(incidents, reports);
    let since = Utc::now()
        - chrono::Duration::from_std(cfg.replay_window).unwrap_or(chrono::Duration::minutes(15));
    engine.lock().await.quiet_digests = true;
    let events =
        catch_up::<KubeEvent>(ctx, cfg, engine, "FLEET_EVENTS", "correlator-events", since).await;
    engine.lock().await.quiet_digests = false;
    let events = events?;
    let health =
        catch_up::<HealthMsg>(ctx, cfg, engine, "FLEET_HEALTH", "correlator-health", since).await?;
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

/// This instance's durable for the topology's consumer `base`: the shared one, or its partition's own.
fn durable_name(cfg: &Config, base: &str) -> String {
    if cfg.partitions <= 1 {
        base.to_string()
    } else {
        format!("{base}-p{}-of-{}", cfg.partition, cfg.partitions)
    }
}

/// Whether this instance's durable on `stream` has nothing pending or unacked.
async fn caught_up(
    js: &async_nats::jetstream::Context,
    cfg: &Config,
    stream: &str,
    base: &str,
) -> bool {
    let name = durable_name(cfg, base);
    match js.get_stream(stream).await {
        Ok(s) => s
            .consumer_info(&name)
            .await
            .is_ok_and(|i| i.num_pending == 0 && i.num_ack_pending == 0),
        Err(_) => false,
    }
}

/// Runs the correlator until `ctx.cancel` fires.
pub async fn run(config: Config, ctx: Context) -> Result<()> {
    anyhow::ensure!(
        config.partitions >= 1 && config.partition < config.partitions,
        "correlator.partition must be in 0..partitions"
    );
    let rules = rules::Rules::load(config.rules.as_deref())?;
    let baseline = baseline::Baseline::load(config.baseline.as_deref())?;
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating {}", config.data_dir))?;
    let db = sled::Config::new()
        .path(&config.data_dir)
        .cache_capacity(32 * 1024 * 1024)
        .open()
        .with_context(|| format!("opening the correlator store in {}", config.data_dir))?;
    let engine: Shared = Arc::new(Mutex::new(Engine::open(
        db,
        rules,
        baseline,
        &ctx.instance,
    )?));
    // a new or wiped store rebuilds from the streams; the marker is written once that is done (and the
    // durables are recreated), so a crash in between rebuilds again
    let fresh = engine.lock().await.is_fresh()?;
    if fresh {
        rebuild(&ctx, &config, &engine).await?;
        engine.lock().await.hold_judgement = true;
    }
    // outputs left from before a crash (or raised by the rebuild) go out first
    commit(&engine, &ctx.js, &ctx.bus_metrics)
        .await
        .map_err(anyhow::Error::msg)?;
    ctx.health.register("correlator");

    let mut tasks = tokio::task::JoinSet::new();
    macro_rules! consumer {
        ($ty:ty, $stream:expr, $durable:expr) => {{
            // with a fresh store, the last-value streams replay from their start
            let replay = fresh && matches!($stream, "FLEET_STATE" | "FLEET_FACTS");
            let durable = durable_for(&ctx, &config, $stream, $durable, replay).await?;
            let r = runner(&ctx, &config, $stream, durable);
            let mut h = H { engine: engine.clone(), consumer: $durable, js: ctx.js.clone(), metrics: ctx.bus_metrics.clone() };
            let cancel = ctx.cancel.clone();
            tasks.spawn(async move {
                if let Err(e) = r.run::<$ty, _>(&mut h, cancel).await {
                    tracing::error!(error = %e, consumer = durable, "consumer stopped");
                }
            });
        }};
    }
    consumer!(KubeEvent, "FLEET_EVENTS", "correlator-events");
    consumer!(HealthMsg, "FLEET_HEALTH", "correlator-health");
    consumer!(StateMsg, "FLEET_STATE", "correlator-state");
    consumer!(ClusterFacts, "FLEET_FACTS", "correlator-facts");
    if fresh {
        engine.lock().await.mark_initialized().await?;
        // the baseline is judged once the inventory's replay has caught up
        let (engine, js, cfg, cancel) = (
            engine.clone(),
            ctx.js.clone(),
            config.clone(),
            ctx.cancel.clone(),
        );
        tasks.spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(1800);
            loop {
                if caught_up(&js, &cfg, "FLEET_STATE", "correlator-state").await
                    && caught_up(&js, &cfg, "FLEET_FACTS", "correlator-facts").await
                {
                    break;
                }
                if tokio::time::Instant::now() > deadline {
                    tracing::warn!("the inventory replay did not catch up in 30 min; judging the baseline anyway");
                    break;
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
            let mut e = engine.lock().await;
            e.release_judgement(Utc::now());
            tracing::info!("inventory replayed; baseline judged");
        });
    }

    // the clock: silent clusters, housekeeping
    {
        let (engine, js, metrics, cancel) = (
            engine.clone(),
            ctx.js.clone(),
            ctx.bus_metrics.clone(),
            ctx.cancel.clone(),
        );
        let every = Duration::from_millis(config.tick_ms.max(100));
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(every);
            let mut n = 0u64;
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                n += 1;
                {
                    let mut e = engine.lock().await;
                    e.tick(Utc::now());
                    if n.is_multiple_of(3600) {
                        e.housekeeping(Utc::now());
                    }
                }
                if let Err(err) = commit(&engine, &js, &metrics).await {
                    tracing::warn!(error = %err, "publishing incidents failed; will retry");
                }
            }
        });
    }
    // queries
    {
        let (engine, client, cancel) = (engine.clone(), ctx.nats.clone(), ctx.cancel.clone());
        let partitions = config.partitions.to_string();
        let mut incidents = client.subscribe(QUERY_INCIDENTS).await?;
        let mut compliance = client.subscribe(QUERY_COMPLIANCE).await?;
        tasks.spawn(async move {
            loop {
                let (msg, what) = tokio::select! {
                    _ = cancel.cancelled() => return,
                    Some(m) = incidents.next() => (m, "incidents"),
                    Some(m) = compliance.next() => (m, "compliance"),
                };
                let Some(reply) = msg.reply.clone() else {
                    continue;
                };
                let body = {
                    let e = engine.lock().await;
                    if what == "incidents" {
                        let all = serde_json::from_slice::<serde_json::Value>(&msg.payload)
                            .ok()
                            .and_then(|v| v.get("all").and_then(serde_json::Value::as_bool))
                            .unwrap_or(false);
                        serde_json::to_vec(&e.current(all))
                    } else {
                        serde_json::to_vec(&e.compliance())
                    }
                };
                if let Ok(body) = body {
                    // with partitions, every instance answers for its part: the asker gathers them all
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert(HEADER_PARTITIONS, partitions.as_str());
                    let _ = client
                        .publish_with_headers(reply, headers, body.into())
                        .await;
                }
            }
        });
    }
    // incident commands (acknowledge, resolve) from the console
    {
        let (engine, client, js, metrics, cancel) = (
            engine.clone(),
            ctx.nats.clone(),
            ctx.js.clone(),
            ctx.bus_metrics.clone(),
            ctx.cancel.clone(),
        );
        let partitions = config.partitions.to_string();
        let mut commands = client.subscribe(COMMAND_INCIDENT).await?;
        tasks.spawn(async move {
            loop {
                let msg = tokio::select! {
                    _ = cancel.cancelled() => return,
                    Some(m) = commands.next() => m,
                };
                let Some(reply_to) = msg.reply.clone() else {
                    continue;
                };
                let reply = match serde_json::from_slice::<IncidentCommand>(&msg.payload) {
                    Err(e) => CommandReply {
                        outcome: CommandOutcome::Failed,
                        incident: None,
                        error: Some(format!("not an incident command: {e}")),
                    },
                    Ok(cmd) => {
                        let (outcome, incident) = engine.lock().await.command(&cmd, Utc::now());
                        match outcome {
                            // the new revision and the audit record are durable and published before
                            // the asker hears it is done
                            CommandOutcome::Done => match commit(&engine, &js, &metrics).await {
                                Ok(()) => CommandReply {
                                    outcome,
                                    incident,
                                    error: None,
                                },
                                Err(e) => CommandReply {
                                    outcome: CommandOutcome::Failed,
                                    incident,
                                    error: Some(e),
                                },
                            },
                            CommandOutcome::Conflict => CommandReply {
                                outcome,
                                error: incident
                                    .as_ref()
                                    .map(|i| format!("incident is {:?}", i.status).to_lowercase()),
                                incident,
                            },
                            _ => CommandReply {
                                outcome,
                                incident,
                                error: None,
                            },
                        }
                    }
                };
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(HEADER_PARTITIONS, partitions.as_str());
                if let Ok(body) = serde_json::to_vec(&reply) {
                    let _ = client
                        .publish_with_headers(reply_to, headers, body.into())
                        .await;
                }
            }
        });
    }
    ctx.health.set("correlator", true);
    tracing::info!(data_dir = %config.data_dir, "correlator running");
    while tasks.join_next().await.is_some() {}
    let e = engine.lock().await;
    e.persist().await?;
    let s = e.stats;
    tracing::info!(
        events_in = s.events_in,
        events_passed = s.events_passed,
        replays_skipped = s.replays_skipped,
        late_ignored = s.late_ignored,
        "correlator stopped"
    );
    Ok(())
}
