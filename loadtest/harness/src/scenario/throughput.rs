//! Throughput against a raw-NATS reference measured side by side on the same server (the machines here are
//! noisy: absolute rates move by 2× between runs, ratios much less).
//!
//! - **Publishing**: the same N kubelet-style event envelopes published with bare async-nats (a window of
//!   JetStream publishes in flight, each ack awaited) and with the agent's publisher
//!   (`multipilot_bus::publish::Publisher`, Msg-Id per message, the same window).
//! - **Correlator**: a bare async-nats pull consumer (batch 500, explicit ack of each message) drains the
//!   events from FLEET_EVENTS; then `multipilot correlator` (fresh store) drains the same stream through its
//!   durable, state persisted before every ack, as in production. Its rate is counted from the first
//!   message delivered to it and, as an operator sees it, from its start.
//! - **Correlator, live**: the same events again, drained from a backlog by a fresh correlator and then
//!   published to another fresh one at a fleet's pace (2,500 a second, the 50-cluster steady run's), each
//!   timed as it is sent: its CPU per event live against its drain's (`--only live`).
//! - **TSDB**: the same for scrapes (MetricBatch) on FLEET_METRICS and `multipilot tsdb`.
//! - **Console**: a bare ordered consumer (no acks, last message per subject, as the console reads) on
//!   FLEET_STATE, then `multipilot console` reading the same object states into its picture of the fleet
//!   (counted by its `multipilot_console_applied_total{feed="state"}`).
//! - **Alert router**: the same for incident changes (open, acknowledged, resolved revisions of incidents
//!   over the clusters, as the correlator publishes them) on FLEET_INCIDENTS and `multipilot alerts` (its
//!   default routing: grouped notifications published on FLEET_ALERTS). It acks an input once applied in
//!   memory and writes its alerts at its checkpoint (10 s), after the drain.
//!
//! Each role runs alone on the server with only its stream loaded; its CPU time per message and resident
//! memory come from `/proc`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use multipilot_bus::metrics::BusMetrics;
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use multipilot_bus::topology::Topology;
use multipilot_schemas::payload::{MetricBatch, Sample};
use multipilot_schemas::{Envelope, subject};
use multipilot_testkit::{NatsServer, free_port};

use super::Opts;
use crate::proc::{Proc, usage};
use crate::record::Recorder;
use crate::report::Report;

/// Messages in flight while publishing (the agent's default window).
const WINDOW: usize = 256;
/// Messages per pull of the raw reference consumer.
const RAW_BATCH: usize = 500;

/// Runs it.
pub async fn run(o: &Opts, dir: &Path) -> Result<(Report, Recorder)> {
    let events = o.pick(20_000usize, 100_000);
    let scrapes = o.pick(2_000usize, 10_000);
    let clusters = o.clusters.unwrap_or(24);
    let samples = o.samples.unwrap_or(SAMPLES_PER_SCRAPE).max(1);
    let mut r = Report::new(
        "throughput",
        o.short,
        serde_json::json!({"events": events, "clusters": clusters, "scrapes": scrapes,
            "samples_per_scrape": samples, "window": WINDOW, "raw_batch": RAW_BATCH}),
    );
    let rec = Recorder::new();
    let bins = o.bins()?;
    let server = NatsServer::start().await?;
    let client = server.client().await?;
    let js = jetstream::new(client.clone());
    Topology::embedded().provision(&js).await?;

    if o.runs("publish") {
        // --- publishing: raw windowed publish vs the agent's publisher, the same envelopes
        let msgs = event_messages(events, clusters)?;
        let raw_pub = raw_publish(&js, &msgs, "raw").await?;
        js.get_stream("FLEET_EVENTS")
            .await?
            .purge()
            .await
            .context("purging")?;
        let ours_pub = publisher_publish(&js, &msgs, "pub").await?;
        r.figure(
            "publish: raw async-nats (window 256, each ack awaited)",
            format!("{raw_pub:.0} msgs/s"),
        );
        r.figure(
            "publish: the agent's publisher (same window, Msg-Id)",
            format!("{ours_pub:.0} msgs/s"),
        );
        let ratio = ours_pub / raw_pub;
        r.goal(
            "the agent's publisher reaches ≥ 80 % of a raw windowed JetStream publish",
            ratio >= 0.8,
            format!("{:.0} %", ratio * 100.0),
        );
    }

    if o.runs("correlator") {
        if !o.runs("publish") {
            publish_events(&js, &event_messages(events, clusters)?, "ev").await?;
        }
        // --- the correlator against a raw pull on FLEET_EVENTS
        Durable {
            role: "correlator",
            label: "correlator",
            what: "events",
            stream: "FLEET_EVENTS",
            durable: "correlator-events",
            target: 0.40,
            how: PERSISTED,
        }
        .compare(&mut r, &js, &bins.multipilot, &server.url(), dir, events)
        .await?;
    }

    if o.runs("storm") {
        // --- the same with a warning storm: every event a warning (recorded, counted in the storm window,
        // announced or updated), the correlator's most expensive input
        js.get_stream("FLEET_EVENTS")
            .await?
            .purge()
            .await
            .context("purging")?;
        publish_events(&js, &warning_messages(events, clusters)?, "storm").await?;
        Durable {
            role: "correlator",
            label: "correlator (warnings only)",
            what: "events",
            stream: "FLEET_EVENTS",
            durable: "correlator-events",
            target: 0.40,
            how: PERSISTED,
        }
        .compare(
            &mut r,
            &js,
            &bins.multipilot,
            &server.url(),
            &dir.join("storm"),
            events,
        )
        .await?;
    }

    if o.runs("live") {
        // --- the correlator's live path: the same events arriving at a fleet's pace, against its drain of
        // them (CPU per event, each from a fresh store)
        let purge = async || -> Result<()> {
            js.get_stream("FLEET_EVENTS")
                .await?
                .purge()
                .await
                .context("purging")?;
            Ok(())
        };
        purge().await?;
        publish_events(&js, &event_messages(events, clusters)?, "backlog").await?;
        let drained = drain_role(
            &bins.multipilot,
            "correlator",
            &server.url(),
            &dir.join("live-drain"),
            "FLEET_EVENTS",
            "correlator-events",
        )
        .await?;
        purge().await?;
        let live = live_correlator(
            &js,
            &bins.multipilot,
            &server.url(),
            &dir.join("live"),
            events,
            clusters,
        )
        .await?;
        // from its first delivery, as the live run is counted from its first publish (its start left out)
        let drain_us = drained.cpu_reading * 1e6 / events as f64;
        let live_us = live.cpu * 1e6 / events as f64;
        r.figure(
            format!("correlator: {events} events drained from a backlog"),
            format!(
                "{drain_us:.1} µs CPU per event from its first delivery; {:.0} events/s",
                events as f64 / drained.from_first
            ),
        );
        r.figure(
            format!("correlator: the same {events} events live, {LIVE_RATE} a second"),
            format!(
                "{live_us:.1} µs CPU per event ({:.1} % of a core); the last acked {:.2} s after it was \
                 published; RSS {} MiB",
                live.cpu / live.secs * 100.0,
                live.last_lag,
                live.rss / (1024 * 1024)
            ),
        );
        let ratio = live_us / drain_us;
        r.goal(
            "the correlator's live path costs ≤ 2× its drain per event (the same events)",
            ratio <= 2.0,
            format!("{ratio:.2}× ({live_us:.1} vs {drain_us:.1} µs CPU per event)"),
        );
    }

    if o.runs("tsdb") {
        // --- the TSDB against a raw pull on FLEET_METRICS
        publish_all(&js, scrape_messages(scrapes, clusters, samples)?).await?;
        Durable {
            role: "tsdb",
            label: "tsdb",
            what: "scrapes",
            stream: "FLEET_METRICS",
            durable: "tsdb",
            target: 0.50,
            how: PERSISTED,
        }
        .compare(&mut r, &js, &bins.multipilot, &server.url(), dir, scrapes)
        .await?;
    }

    if o.runs("alerts") {
        // --- the alert router against a raw pull on FLEET_INCIDENTS (its durable reads the whole stream)
        let changes = o.pick(5_000usize, 30_000);
        publish_all(&js, incident_messages(changes, clusters)?).await?;
        Durable {
            role: "alerts",
            label: "alert router",
            what: "incident changes",
            stream: "FLEET_INCIDENTS",
            durable: "alerts",
            target: 0.50,
            how: "alerts in memory, acked once applied, written at its 10 s checkpoint",
        }
        .compare(&mut r, &js, &bins.multipilot, &server.url(), dir, changes)
        .await?;
    }

    if o.runs("console") {
        // --- the console's ingest against a raw ordered consumer on FLEET_STATE (it reads with ordered,
        // ack-less consumers, the last state of every object first)
        let states = o.pick(5_000usize, 30_000);
        // only its stream loaded: the console also follows FLEET_INCIDENTS (the alert router's input)
        js.get_stream("FLEET_INCIDENTS")
            .await?
            .purge()
            .await
            .context("purging")?;
        publish_all(&js, state_messages(states, clusters)?).await?;
        let raw = raw_ordered(&js, "FLEET_STATE", "fleet.state.>", states).await?;
        let role = drain_console(&bins.multipilot, &server.url(), dir, states).await?;
        report_consumer(
            &mut r,
            "console (state feed)",
            "object states",
            states,
            raw,
            &role,
            0.50,
            Reads::Ordered,
        );
    }

    r.note(format!(
        "Events: the correlator's realistic fleet stream (`services/correlator/src/stream.rs`, real kubelet, \
         controller-manager, scheduler … message shapes), spread over {clusters} clusters. Scrapes: \
         {samples} samples each (node-exporter-like series). Object states: Deployments with \
         spec, status conditions, labels and managed fields, one subject each. The console has no durable: its \
         reference is a bare ordered consumer (no acks) on the same subjects. One nats-server (JetStream on file \
         storage) on this machine; each role alone on it."
    ));
    Ok((r, rec))
}

/// A role's durable consumer, compared with a raw pull on its stream.
struct Durable<'a> {
    role: &'a str,
    label: &'a str,
    what: &'a str,
    stream: &'a str,
    durable: &'a str,
    target: f64,
    /// When it acks.
    how: &'static str,
}

/// How the correlator and the TSDB ack.
const PERSISTED: &str = "state persisted before acks";

impl Durable<'_> {
    /// A raw pull reads the `n` messages of the stream, then the role drains them; reported in `r`.
    async fn compare(
        &self,
        r: &mut Report,
        js: &jetstream::Context,
        bin: &Path,
        url: &str,
        dir: &Path,
        n: usize,
    ) -> Result<()> {
        let raw_durable = format!("bench-raw-{}", self.durable);
        let raw = raw_pull(js, self.stream, &raw_durable, n).await?;
        let role = drain_role(bin, self.role, url, dir, self.stream, self.durable).await?;
        report_consumer(
            r,
            self.label,
            self.what,
            n,
            raw,
            &role,
            self.target,
            Reads::Durable(self.how),
        );
        Ok(())
    }
}

/// What a role's drain measured.
struct Drained {
    /// Seconds from the process start to the last ack.
    from_start: f64,
    /// Seconds from the first message delivered to it to its last ack.
    from_first: f64,
    /// CPU seconds the process used.
    cpu: f64,
    /// CPU seconds it used from its first delivery on (read within 20 ms of it), its start left out.
    cpu_reading: f64,
    /// Resident memory at the end, bytes.
    rss: u64,
}

/// How a consumer reads: a durable acking after its state is persisted, or an ordered reader (no acks).
#[derive(Clone, Copy)]
enum Reads {
    Durable(&'static str),
    Ordered,
}

#[allow(clippy::too_many_arguments)]
fn report_consumer(
    r: &mut Report,
    role: &str,
    what: &str,
    n: usize,
    raw_s: f64,
    d: &Drained,
    target: f64,
    reads: Reads,
) {
    let raw_rate = n as f64 / raw_s;
    let rate = n as f64 / d.from_first;
    let (reference, how) = match reads {
        Reads::Durable(how) => (
            format!("raw pull reference (batch {RAW_BATCH}, ack each)"),
            how,
        ),
        Reads::Ordered => (
            "raw ordered consumer reference (no acks)".to_string(),
            "applied to its picture of the fleet",
        ),
    };
    r.figure(
        format!("{role}: {reference}"),
        format!("{raw_rate:.0} {what}/s"),
    );
    r.figure(
        format!("{role}: reading {n} {what} ({how})"),
        format!(
            "{rate:.0} {what}/s from the first delivery, {:.0} {what}/s from its start; {:.1} µs CPU per message; RSS {} MiB",
            n as f64 / d.from_start,
            d.cpu * 1e6 / n as f64,
            d.rss / (1024 * 1024)
        ),
    );
    let ratio = rate / raw_rate;
    r.goal(
        format!(
            "{role} drains ≥ {:.0} % of the raw pull rate on the same stream",
            target * 100.0
        ),
        ratio >= target,
        format!("{:.0} % (from its start: {:.0} %)", ratio * 100.0, {
            (n as f64 / d.from_start) / raw_rate * 100.0
        }),
    );
}

/// `n` event envelopes of the realistic stream, as (subject, body).
fn event_messages(n: usize, clusters: usize) -> Result<Vec<(String, Vec<u8>)>> {
    stream_messages(n, clusters, false, backlog_times(n))
}

/// Times of a backlog of `n` events: the last one now, one a millisecond before it.
fn backlog_times(n: usize) -> impl Fn(usize) -> chrono::DateTime<chrono::Utc> {
    let now = chrono::Utc::now();
    move |i| now - chrono::Duration::milliseconds((n - i) as i64)
}

/// `n` warning envelopes of the realistic stream (its lifecycle events left out).
fn warning_messages(n: usize, clusters: usize) -> Result<Vec<(String, Vec<u8>)>> {
    stream_messages(n, clusters, true, backlog_times(n))
}

/// `n` envelopes of the realistic stream (only its warnings if `warnings`), the `i`th timed `at(i)`.
fn stream_messages(
    n: usize,
    clusters: usize,
    warnings: bool,
    at: impl Fn(usize) -> chrono::DateTime<chrono::Utc>,
) -> Result<Vec<(String, Vec<u8>)>> {
    let mut stream = multipilot_eventshapes::stream::ShapeStream::new(7);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut se = stream.next_event();
        while warnings && se.event.severity < multipilot_schemas::payload::Severity::Warning {
            se = stream.next_event();
        }
        // the stream knows 5 clusters: spread them over `clusters` by object, keeping each object on one
        let spread = (se.event.involved.name.len() + i / 997) % clusters.div_ceil(5).max(1);
        let cluster = format!("{}-{spread}", se.cluster);
        let mut ev = se.event;
        // recent, as a live fleet's (the correlator judges times against its clock)
        let at = at(i);
        ev.last_time = at;
        ev.first_time = ev.first_time.map(|f| f.min(at));
        let env = Envelope::new(
            cluster.as_str(),
            format!("agent/{cluster}"),
            at,
            i as u64,
            ev,
        );
        let subject = subject::event(&cluster, &env.payload.involved.kind);
        out.push((subject, multipilot_schemas::encode(&env)?));
    }
    Ok(out)
}

fn event_outgoing(subject: &str, msg_id: String, body: &[u8]) -> Outgoing {
    use multipilot_schemas::Payload as _;
    Outgoing::raw(
        subject.to_string(),
        msg_id,
        &multipilot_schemas::payload::KubeEvent::schema_header(),
        bytes::Bytes::copy_from_slice(body),
    )
}

/// `n` incident changes: incidents of a few kinds over the clusters, each opened, acknowledged and
/// resolved (three revisions), interleaved as a busy fleet's are.
fn incident_messages(n: usize, clusters: usize) -> Result<Vec<Outgoing>> {
    use multipilot_schemas::payload::{Incident, IncidentStatus, Severity};
    const KINDS: [(&str, Severity); 5] = [
        ("node-not-ready", Severity::Warning),
        ("dns-failure", Severity::Critical),
        ("cert-expiring", Severity::Warning),
        ("event-storm", Severity::Warning),
        ("apiserver-overload", Severity::Critical),
    ];
    let now = chrono::Utc::now();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (incident, revision) = (i / 3, (i % 3) as u64 + 1);
        let cluster = format!("bench-{}", incident % clusters);
        let (kind, severity) = KINDS[(incident / clusters) % KINDS.len()];
        let id = format!("{cluster}-{kind}-{incident}");
        let at = now - chrono::Duration::milliseconds((n - i) as i64);
        let status = match revision {
            1 => IncidentStatus::Open,
            2 => IncidentStatus::Acknowledged,
            _ => IncidentStatus::Resolved,
        };
        let inc = Incident {
            id: id.clone(),
            cluster: cluster.clone(),
            kind: kind.into(),
            severity,
            status,
            summary: format!("{kind} on {cluster}: round {incident}"),
            opened_at: at - chrono::Duration::seconds(30),
            updated_at: at,
            resolved_at: (status == IncidentStatus::Resolved).then_some(at),
            ingest_time: Some(at),
            evidence: Vec::new(),
            labels: [
                ("cluster".to_string(), cluster.clone()),
                (
                    "env".to_string(),
                    ["prod", "staging", "dev"][incident % 3].to_string(),
                ),
            ]
            .into_iter()
            .collect(),
            revision,
            acknowledged_by: (revision >= 2).then(|| "bench".to_string()),
            blast_radius: None,
            explains: Vec::new(),
        };
        let env = Envelope::new(cluster.as_str(), "correlator/bench", at, revision, inc);
        out.push(Outgoing::envelope(
            subject::incident(&cluster, kind),
            format!("{id}-{revision}"),
            &env,
        )?);
    }
    Ok(out)
}

/// Samples per synthetic scrape, unless `--samples` says otherwise.
const SAMPLES_PER_SCRAPE: usize = 500;

fn scrape_messages(n: usize, clusters: usize, per_scrape: usize) -> Result<Vec<Outgoing>> {
    let now = chrono::Utc::now().timestamp_millis();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let cluster = format!("bench-{}", i % clusters);
        let at = now - ((n - i) as i64) * 1000;
        let samples = (0..per_scrape)
            .map(|k| Sample {
                name: format!("node_metric_{}", k % 50),
                labels: [
                    ("cluster".to_string(), cluster.clone()),
                    ("job".to_string(), "node".to_string()),
                    ("instance".to_string(), format!("node-{}", k / 50)),
                ]
                .into_iter()
                .collect(),
                value: (i * k) as f64 * 0.5,
                timestamp_ms: at,
            })
            .collect();
        let batch = MetricBatch {
            job: "node".into(),
            instance: "bench".into(),
            families: Vec::new(),
            samples,
            rejected_lines: 0,
        };
        let env = Envelope::new(
            cluster.as_str(),
            format!("agent/{cluster}"),
            chrono::DateTime::from_timestamp_millis(at).unwrap_or_default(),
            i as u64,
            batch,
        );
        out.push(Outgoing::envelope(
            subject::metrics(&cluster),
            format!("m-{i}"),
            &env,
        )?);
    }
    Ok(out)
}

/// Bare async-nats: `WINDOW` publishes in flight, each ack awaited. Returns msgs/s.
async fn raw_publish(
    js: &jetstream::Context,
    msgs: &[(String, Vec<u8>)],
    tag: &str,
) -> Result<f64> {
    let started = Instant::now();
    windowed_publish(js, msgs, tag, None).await?;
    Ok(msgs.len() as f64 / started.elapsed().as_secs_f64())
}

/// Bare async-nats publishes of `msgs` (Msg-Ids `<tag>-<i>`), `WINDOW` in flight, each ack awaited; the
/// `i`th sent `i × spacing` after the first if a spacing is given.
async fn windowed_publish(
    js: &jetstream::Context,
    msgs: &[(String, Vec<u8>)],
    tag: &str,
    spacing: Option<Duration>,
) -> Result<()> {
    let t0 = tokio::time::Instant::now();
    let mut inflight = futures::stream::FuturesOrdered::new();
    for (i, (subject, body)) in msgs.iter().enumerate() {
        if let Some(spacing) = spacing {
            tokio::time::sleep_until(t0 + spacing * i as u32).await;
        }
        // the same headers the publisher sends (content type, schema, Msg-Id)
        let o = event_outgoing(subject, format!("{tag}-{i}"), body);
        let ack = js
            .publish_with_headers(o.subject, o.headers, o.payload)
            .await?;
        inflight.push_back(ack.into_future());
        if inflight.len() >= WINDOW
            && let Some(a) = inflight.next().await
        {
            a?;
        }
    }
    while let Some(a) = inflight.next().await {
        a?;
    }
    Ok(())
}

/// The agent's publisher, the same window. Returns msgs/s.
async fn publisher_publish(
    js: &jetstream::Context,
    msgs: &[(String, Vec<u8>)],
    tag: &str,
) -> Result<f64> {
    let started = Instant::now();
    let mut p = Publisher::new(js.clone(), WINDOW, BusMetrics::default());
    let mut done = Vec::with_capacity(msgs.len());
    for (i, (subject, body)) in msgs.iter().enumerate() {
        let msg = event_outgoing(subject, format!("{tag}-{i}"), body);
        done.extend(p.send(i, msg).await);
    }
    done.extend(p.flush().await);
    let rate = msgs.len() as f64 / started.elapsed().as_secs_f64();
    let stored = done
        .iter()
        .filter(|c| matches!(c, Completion::Stored { .. }))
        .count();
    if stored != msgs.len() {
        bail!("the publisher stored {stored} of {}", msgs.len());
    }
    Ok(rate)
}

/// Stores event envelopes (subject, body) with Msg-Ids `<tag>-<i>`.
async fn publish_events(
    js: &jetstream::Context,
    msgs: &[(String, Vec<u8>)],
    tag: &str,
) -> Result<()> {
    let out = msgs
        .iter()
        .enumerate()
        .map(|(i, (subject, body))| event_outgoing(subject, format!("{tag}-{i}"), body))
        .collect();
    publish_all(js, out).await
}

async fn publish_all(js: &jetstream::Context, msgs: Vec<Outgoing>) -> Result<()> {
    let mut p = Publisher::new(js.clone(), WINDOW, BusMetrics::default());
    let n = msgs.len();
    let mut done = Vec::with_capacity(n);
    for (i, msg) in msgs.into_iter().enumerate() {
        done.extend(p.send(i, msg).await);
    }
    done.extend(p.flush().await);
    let stored = done
        .iter()
        .filter(|c| matches!(c, Completion::Stored { .. }))
        .count();
    if stored != n {
        bail!("stored {stored} of {n}");
    }
    Ok(())
}

/// `n` Deployment states over the clusters, one subject (object) each.
fn state_messages(n: usize, clusters: usize) -> Result<Vec<Outgoing>> {
    use multipilot_schemas::payload::{FieldManager, ResourceState};
    let mut out = Vec::with_capacity(n);
    let now = chrono::Utc::now();
    for i in 0..n {
        let cluster = format!("bench-{}", i % clusters);
        let ns = format!("team-{}", (i / clusters) % 40);
        let name = format!("app-{i}");
        let spec = serde_json::json!({
            "replicas": 3,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{
                "name": "app", "image": format!("registry.example.com/team/app:1.{}.0", i % 7),
                "ports": [{"containerPort": 8080}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}
            }]}}
        });
        let status = serde_json::json!({
            "ready": true,
            "replicas": {"desired": 3, "updated": 3, "ready": 3, "available": 3, "observed_generation": 4},
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}
            ]
        });
        let state = ResourceState {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: Some(ns.clone()),
            name: name.clone(),
            uid: format!("00000000-0000-4000-8000-{i:012}"),
            resource_version: format!("{}", 1000 + i),
            generation: Some(4),
            spec_hash: format!("{:016x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            metadata_hash: format!("{:016x}", i),
            spec: Some(spec),
            status: serde_json::from_value(status)?,
            labels: [
                ("app".to_string(), name.clone()),
                ("team".to_string(), ns.clone()),
            ]
            .into_iter()
            .collect(),
            annotations: [(
                "deployment.kubernetes.io/revision".to_string(),
                "4".to_string(),
            )]
            .into_iter()
            .collect(),
            owner_refs: vec![],
            finalizers: vec![],
            deletion_timestamp: None,
            creation_timestamp: Some(now),
            field_managers: vec![FieldManager {
                manager: "kubectl-client-side-apply".into(),
                operation: "Update".into(),
                subresource: None,
                fields: vec![
                    ".spec.replicas".into(),
                    ".spec.template.spec.containers[app].image".into(),
                ],
            }],
        };
        let env = Envelope::new(
            cluster.as_str(),
            format!("agent/{cluster}"),
            now,
            i as u64,
            state,
        );
        out.push(Outgoing::envelope(
            subject::state(&cluster, "Deployment", Some(&ns), &name),
            format!("s-{i}"),
            &env,
        )?);
    }
    Ok(out)
}

/// A bare ordered consumer (no acks) reading the last message of every subject matching `filter`, `n` of
/// them; returns seconds.
async fn raw_ordered(js: &jetstream::Context, stream: &str, filter: &str, n: usize) -> Result<f64> {
    let s = js.get_stream(stream).await?;
    let started = Instant::now();
    let mut msgs = s
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: filter.into(),
            deliver_policy: consumer::DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await?
        .messages()
        .await?;
    let mut got = 0;
    while got < n {
        match tokio::time::timeout(Duration::from_secs(30), msgs.next()).await {
            Ok(Some(m)) => {
                m.map_err(|e| anyhow::anyhow!("{e}"))?;
                got += 1;
            }
            Ok(None) | Err(_) => bail!("the ordered consumer read {got} of {n}"),
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Starts `multipilot console` and waits until it applied `n` object states (its
/// `multipilot_console_applied_total{feed="state"}`); stops it.
async fn drain_console(bin: &Path, url: &str, dir: &Path, n: usize) -> Result<Drained> {
    std::fs::create_dir_all(dir)?;
    let http = free_port()?;
    let p = Proc::new(
        "console",
        bin,
        vec!["console".to_string()],
        vec![
            ("MULTIPILOT_NATS__URL".into(), url.into()),
            (
                "MULTIPILOT_HTTP__LISTEN".into(),
                format!("127.0.0.1:{http}"),
            ),
            (
                "MULTIPILOT_CONSOLE__LISTEN".into(),
                format!("127.0.0.1:{}", free_port()?),
            ),
            (
                "MULTIPILOT_STORAGE__DATA_DIR".into(),
                dir.join("console-data").display().to_string(),
            ),
            ("MULTIPILOT_PROVISION__ENABLED".into(), "false".into()),
            ("MULTIPILOT_LOG__FORMAT".into(), "text".into()),
        ],
        dir.join("console.log"),
    );
    let metrics = format!("http://127.0.0.1:{http}/metrics");
    let http_client = reqwest::Client::new();
    drain(p, "console", Duration::from_secs(600), async || {
        let text = http_client
            .get(&metrics)
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let applied = text
            .lines()
            .find(|l| l.starts_with("multipilot_console_applied_total{feed=\"state\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0) as usize;
        Some((applied > 0, applied >= n))
    })
    .await
}

/// A bare pull consumer (explicit ack, batch `RAW_BATCH`) reading `n` messages of `stream`; returns seconds.
async fn raw_pull(js: &jetstream::Context, stream: &str, durable: &str, n: usize) -> Result<f64> {
    let s = js.get_stream(stream).await?;
    let c = s
        .create_consumer(consumer::pull::Config {
            durable_name: Some(durable.into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let started = Instant::now();
    let mut got = 0;
    while got < n {
        let mut batch = c
            .batch()
            .max_messages(RAW_BATCH)
            .expires(Duration::from_secs(1))
            .messages()
            .await?;
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| anyhow::anyhow!("{e}"))?;
            m.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            got += 1;
            // the pull would wait out its expiry for messages that will not come
            if got >= n {
                break;
            }
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("the raw pull read {got} of {n} in 10 minutes");
        }
    }
    let secs = started.elapsed().as_secs_f64();
    s.delete_consumer(durable).await?;
    Ok(secs)
}

/// Starts `multipilot <role>` on a fresh store and waits until its durable acked everything; stops it.
async fn drain_role(
    bin: &Path,
    role: &str,
    url: &str,
    dir: &Path,
    stream: &str,
    durable: &str,
) -> Result<Drained> {
    let js = jetstream::new(async_nats::connect(url).await?);
    let last = js
        .get_stream(stream)
        .await?
        .info()
        .await?
        .state
        .last_sequence;
    let p = role_proc(bin, role, url, dir)?;
    let s = js.get_stream(stream).await?;
    drain(p, role, Duration::from_secs(900), async || {
        let info = s.consumer_info(durable).await.ok()?;
        Some((
            info.delivered.stream_sequence > 0,
            info.ack_floor.stream_sequence >= last && info.num_ack_pending == 0,
        ))
    })
    .await
}

/// Events a second of the live part: the 50-cluster steady run's (50 clusters, 50 events a second each).
const LIVE_RATE: u32 = 2_500;

/// What a role's live run cost.
struct Live {
    /// Seconds from the first publish to the last ack.
    secs: f64,
    /// CPU seconds the process used over them.
    cpu: f64,
    /// Seconds from the last publish to its ack.
    last_lag: f64,
    /// Resident memory at the end, bytes.
    rss: u64,
}

/// Starts `multipilot correlator` on a fresh store with FLEET_EVENTS empty, then publishes `n` events of the
/// realistic stream at [`LIVE_RATE`] a second, each timed as it is sent, and waits until its durable acked
/// them all: the CPU it used from the first publish to the last ack.
async fn live_correlator(
    js: &jetstream::Context,
    bin: &Path,
    url: &str,
    dir: &Path,
    n: usize,
    clusters: usize,
) -> Result<Live> {
    const DURABLE: &str = "correlator-events";
    let s = js.get_stream("FLEET_EVENTS").await?;
    let mut p = role_proc(bin, "correlator", url, dir)?;
    let started = Instant::now();
    p.start()?;
    let pid = p.pid().context("pid")?;
    // reading once its first pull waits on the durable
    loop {
        if !p.running() {
            bail!("correlator exited: {}", p.log_tail(20));
        }
        if s.consumer_info(DURABLE)
            .await
            .is_ok_and(|i| i.num_waiting > 0)
        {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("the correlator did not start reading in 120 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spacing = Duration::from_secs(1) / LIVE_RATE;
    let first_at = chrono::Utc::now();
    let msgs = stream_messages(n, clusters, false, |i| {
        first_at + chrono::Duration::from_std(spacing * i as u32).unwrap_or_default()
    })?;
    let (cpu0, _) = usage(pid).context("reading the correlator's CPU")?;
    let t0 = tokio::time::Instant::now();
    windowed_publish(js, &msgs, "live", Some(spacing)).await?;
    let published = tokio::time::Instant::now();
    let last = js
        .get_stream("FLEET_EVENTS")
        .await?
        .info()
        .await?
        .state
        .last_sequence;
    loop {
        if !p.running() {
            bail!("correlator exited: {}", p.log_tail(20));
        }
        if s.consumer_info(DURABLE)
            .await
            .is_ok_and(|i| i.ack_floor.stream_sequence >= last && i.num_ack_pending == 0)
        {
            break;
        }
        if published.elapsed() > Duration::from_secs(300) {
            bail!("the correlator did not ack the last event in 300 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let end = tokio::time::Instant::now();
    let (cpu1, rss) = usage(pid).context("reading the correlator's CPU")?;
    p.terminate(Duration::from_secs(10));
    Ok(Live {
        secs: (end - t0).as_secs_f64(),
        cpu: cpu1 - cpu0,
        last_lag: (end - published).as_secs_f64(),
        rss,
    })
}

/// `multipilot <role>` on a fresh store in `dir`, reading from `url` (not started).
fn role_proc(bin: &Path, role: &str, url: &str, dir: &Path) -> Result<Proc> {
    std::fs::create_dir_all(dir)?;
    let data = dir.join(format!("{role}-data"));
    Ok(Proc::new(
        role,
        bin,
        vec![role.to_string()],
        vec![
            ("MULTIPILOT_NATS__URL".into(), url.into()),
            (
                "MULTIPILOT_HTTP__LISTEN".into(),
                format!("127.0.0.1:{}", free_port()?),
            ),
            (
                "MULTIPILOT_STORAGE__DATA_DIR".into(),
                data.display().to_string(),
            ),
            ("MULTIPILOT_PROVISION__ENABLED".into(), "false".into()),
            (
                "MULTIPILOT_TSDB__LISTEN".into(),
                format!("127.0.0.1:{}", free_port()?),
            ),
            (
                "MULTIPILOT_ALERTS__LISTEN".into(),
                format!("127.0.0.1:{}", free_port()?),
            ),
            ("MULTIPILOT_LOG__FORMAT".into(), "text".into()),
        ],
        dir.join(format!("{role}.log")),
    ))
}

/// Starts `p` and polls `progress` (whether it started reading, whether it is done) every 20 ms until done;
/// stops it and returns what it took.
async fn drain(
    mut p: Proc,
    role: &str,
    limit: Duration,
    mut progress: impl AsyncFnMut() -> Option<(bool, bool)>,
) -> Result<Drained> {
    let started = Instant::now();
    p.start()?;
    let pid = p.pid().context("pid")?;
    let mut first: Option<Instant> = None;
    let mut cpu_at_first = 0.0;
    loop {
        if !p.running() {
            bail!("{role} exited: {}", p.log_tail(20));
        }
        if let Some((reading, done)) = progress().await {
            if reading && first.is_none() {
                first = Some(Instant::now());
                cpu_at_first = usage(pid).map_or(0.0, |u| u.0);
            }
            if done {
                break;
            }
        }
        if started.elapsed() > limit {
            bail!("{role} did not finish in {} s", limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let end = Instant::now();
    let (cpu, rss) = usage(pid).unwrap_or_default();
    p.terminate(Duration::from_secs(10));
    let first = first.unwrap_or(started);
    Ok(Drained {
        from_start: (end - started).as_secs_f64(),
        from_first: (end - first).as_secs_f64().max(1e-3),
        cpu,
        cpu_reading: cpu - cpu_at_first,
        rss,
    })
}
