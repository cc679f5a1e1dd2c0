//! One cluster served by the agent: discovery, a watcher per kind (kube-rs `watcher` with backoff),
//! events, facts, heartbeats, probes and scrapes, all written to the cluster's outbox.
//!
//! Publishes (through the outbox): `fleet.state.<cluster>.<kind>.<ns>.<name>` (ResourceState,
//! ResourceDeleted), `fleet.resync.<cluster>.<kind>` (ResyncMarker), `fleet.event.<cluster>.<kind>`
//! (KubeEvent), `fleet.facts.<cluster>` (ClusterFacts), `fleet.hb.<cluster>` (Heartbeat),
//! `fleet.probe.<cluster>.<probe>` (ProbeResult), `fleet.metrics.<cluster>` (MetricBatch).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::discovery::Discovery;
use kube::runtime::{WatchStreamExt, watcher};
use multipilot_schemas::payload::{
    ClusterFacts, Component, GpuNode, Heartbeat, KubeEvent, KubeVersion, NodeCounts, NodeSoftware,
    ObjectKey, ResourceDeleted, ResyncMarker, Severity,
};
use multipilot_schemas::{stable_id, subject};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::kinds::{self, Chosen};
use crate::normalize;
use crate::outbox::Class;
use crate::sink::{Meta, Sink};
use crate::view::View;

/// One cluster's settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Cluster name (the subject token and the registry key).
    pub name: String,
    /// Kubeconfig context (defaults to the name). Ignored in-cluster.
    pub context: Option<String>,
    /// Use the in-cluster service account instead of a kubeconfig.
    pub in_cluster: bool,
    /// Registry labels: env, region, owner, team…
    pub labels: BTreeMap<String, String>,
}

/// Timings shared by every cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Timings {
    /// Seconds between heartbeats.
    pub heartbeat_interval_s: u32,
    /// Seconds between discovery + facts rounds.
    pub discovery_interval_s: u32,
    /// Objects per list page.
    pub page_size: u32,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            heartbeat_interval_s: 5,
            discovery_interval_s: 300,
            page_size: 500,
        }
    }
}

/// Everything a cluster's tasks share.
pub struct ClusterCtx {
    /// Settings.
    pub config: ClusterConfig,
    /// Kubernetes client.
    pub client: kube::Client,
    /// Its configuration (URL, CA) — the certificate probe dials the same server.
    pub kube_config: kube::Config,
    /// Output.
    pub sink: Sink,
    /// Compact view the probes read.
    pub view: View,
    /// What was last published per object / event occurrence (durable: a restart doesn't republish).
    pub seen: sled::Tree,
    /// Whether the last API call worked.
    pub reachable: AtomicBool,
    /// Kinds chosen by the last discovery (kind → group/version).
    pub chosen: std::sync::Mutex<BTreeMap<String, String>>,
    /// The apiserver certificate's expiry, from the certificate probe.
    pub cert_expiry: std::sync::Mutex<Option<DateTime<Utc>>>,
    /// The cluster clock minus the agent's, in ms (from the API server's Date header; second resolution).
    pub clock_offset_ms: std::sync::atomic::AtomicI64,
    /// When the agent started.
    pub started_at: DateTime<Utc>,
    /// Timings.
    pub timings: Timings,
}

impl std::fmt::Debug for ClusterCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCtx")
            .field("cluster", &self.config.name)
            .finish()
    }
}

fn map_event<A, B>(ev: watcher::Event<A>, f: impl Fn(A) -> B) -> watcher::Event<B> {
    match ev {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(a) => watcher::Event::InitApply(f(a)),
        watcher::Event::Apply(a) => watcher::Event::Apply(f(a)),
        watcher::Event::Delete(a) => watcher::Event::Delete(f(a)),
    }
}

impl ClusterCtx {
    /// The cluster name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    fn emit<T: multipilot_schemas::Payload + Serialize>(&self, meta: Meta, payload: T) {
        if let Err(e) = self.sink.emit(meta, payload) {
            tracing::error!(cluster = self.name(), error = %e, "message lost: the outbox refused it");
        }
    }
}

/// The time an object last changed in the cluster's clock: the newest managedFields time, else its
/// creation or deletion time; None when it carries none.
fn object_time(obj: &Value) -> Option<DateTime<Utc>> {
    let parse = |s: &str| {
        DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    };
    let mut best: Option<DateTime<Utc>> = None;
    let mut consider = |t: Option<DateTime<Utc>>| {
        if let Some(t) = t {
            best = Some(best.map_or(t, |b| b.max(t)));
        }
    };
    for m in obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        consider(m.get("time").and_then(Value::as_str).and_then(parse));
    }
    consider(
        obj.pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .and_then(parse),
    );
    consider(
        obj.pointer("/metadata/deletionTimestamp")
            .and_then(Value::as_str)
            .and_then(parse),
    );
    best
}

fn seen_key(kind: &str, ns: Option<&str>, name: &str) -> String {
    format!("{kind}\u{0}{}\u{0}{name}", ns.unwrap_or(""))
}

/// Runs every task of one cluster until cancelled.
pub async fn run(
    ctx: Arc<ClusterCtx>,
    probes: crate::probes::Config,
    scrape: crate::scrape::Config,
    cancel: CancellationToken,
) {
    let mut tasks = tokio::task::JoinSet::new();
    collect(&ctx, probes, scrape, &cancel, &mut tasks).await;
    while tasks.join_next().await.is_some() {}
    if let Err(e) = ctx.sink.outbox().flush().await {
        tracing::error!(cluster = ctx.name(), error = %e, "outbox flush failed");
    }
}

async fn collect(
    ctx: &Arc<ClusterCtx>,
    probes: crate::probes::Config,
    scrape: crate::scrape::Config,
    cancel: &CancellationToken,
    tasks: &mut tokio::task::JoinSet<()>,
) {
    tasks.spawn(heartbeats(ctx.clone(), cancel.clone()));
    tasks.spawn(flusher(ctx.clone(), cancel.clone()));
    // discovery decides what to watch; it is retried until the API server answers
    let discovery = loop {
        match Discovery::new(ctx.client.clone()).run().await {
            Ok(d) => {
                ctx.reachable.store(true, Ordering::Relaxed);
                break d;
            }
            Err(e) => {
                ctx.reachable.store(false, Ordering::Relaxed);
                tracing::warn!(cluster = ctx.name(), error = %e, "discovery failed; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
            }
        }
    };
    let chosen = kinds::choose(&discovery);
    {
        let mut m = ctx.chosen.lock().unwrap_or_else(|e| e.into_inner());
        for c in &chosen {
            m.insert(c.spec.kind.to_string(), c.api_version().to_string());
        }
    }
    tracing::info!(
        cluster = ctx.name(),
        kinds = chosen.len(),
        "discovery done; watching"
    );
    for kind in chosen {
        tasks.spawn(watch_kind(ctx.clone(), kind, cancel.clone()));
    }
    match kinds::choose_events(&discovery) {
        Some(ev) => {
            tracing::info!(
                cluster = ctx.name(),
                api = ev.api_version(),
                "watching events"
            );
            tasks.spawn(watch_events(ctx.clone(), ev, cancel.clone()));
        }
        None => tracing::warn!(
            cluster = ctx.name(),
            "this cluster serves no Event API the agent knows"
        ),
    }
    let scrape_interval_s = (scrape.interval_s > 0).then_some(scrape.interval_s);
    tasks.spawn(facts_loop(
        ctx.clone(),
        Some(discovery),
        scrape_interval_s,
        cancel.clone(),
    ));
    tasks.spawn(crate::probes::run(ctx.clone(), probes, cancel.clone()));
    tasks.spawn(crate::scrape::run(ctx.clone(), scrape, cancel.clone()));
}

/// Makes accepted messages durable every few milliseconds (the drain only sends durable ones).
async fn flusher(ctx: Arc<ClusterCtx>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        let stop = tokio::select! {
            _ = cancel.cancelled() => true,
            _ = tick.tick() => false,
        };
        if let Err(e) = ctx.sink.outbox().flush().await {
            tracing::error!(cluster = ctx.name(), error = %e, "outbox flush failed");
        }
        if stop {
            return;
        }
    }
}

async fn heartbeats(ctx: Arc<ClusterCtx>, cancel: CancellationToken) {
    let interval = ctx.timings.heartbeat_interval_s.max(1);
    let mut tick = tokio::time::interval(Duration::from_secs(interval.into()));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        heartbeat(&ctx);
    }
}

/// Publishes a heartbeat with the outbox's counters now.
pub fn heartbeat(ctx: &ClusterCtx) {
    let c = ctx.sink.outbox().counters();
    let hb = Heartbeat {
        interval_s: ctx.timings.heartbeat_interval_s,
        agent_version: env!("CARGO_PKG_VERSION").into(),
        started_at: ctx.started_at,
        outbox_depth: c.depth,
        dropped_metric_batches: c.dropped_metric_batches,
        apiserver_reachable: ctx.reachable.load(Ordering::Relaxed),
        superseded: c.superseded,
        duplicates: c.duplicates,
    };
    // the heartbeat is stamped with the cluster's clock, so the hub can tell a skewed cluster
    let now =
        Utc::now() + chrono::Duration::milliseconds(ctx.clock_offset_ms.load(Ordering::Relaxed));
    let subject = subject::heartbeat(ctx.name());
    ctx.emit(
        Meta {
            class: Class::Heartbeat,
            msg_id: stable_id(&[
                ctx.name(),
                "hb",
                &ctx.started_at.to_rfc3339(),
                &now.to_rfc3339(),
            ]),
            collapse: Some(subject.clone()),
            subject,
            cluster_time: now,
        },
        hb,
    );
}

/// Publishes an object's state if it changed since last published.
fn on_object(ctx: &ClusterCtx, kind: &Chosen, mut obj: Value) -> ObjectKey {
    // managedFields are never kept: their newest time is the object's change time, and the state carries
    // who owns which field (what tells an edit from a controller's write)
    let cluster_time = object_time(&obj).unwrap_or_else(Utc::now);
    let api = kind.api_version();
    let k = kind.spec.kind;
    let state = normalize::resource_state(api, k, &obj, !kind.spec.metadata_only);
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    ctx.view.apply(api, k, &obj);
    let key = ObjectKey {
        namespace: state.namespace.clone(),
        name: state.name.clone(),
    };
    let digest = normalize::digest(&state);
    let sk = seen_key(k, state.namespace.as_deref(), &state.name);
    if ctx
        .seen
        .get(sk.as_bytes())
        .ok()
        .flatten()
        .is_some_and(|v| v.as_ref() == digest.as_bytes())
    {
        return key;
    }
    let subject = subject::state(ctx.name(), k, state.namespace.as_deref(), &state.name);
    ctx.emit(
        Meta {
            class: Class::State,
            // the resource version too: an object changed back (A → B → A) within the stream's
            // duplicate window is a new message, not a duplicate of A's first one (which JetStream would
            // drop, leaving B as the object's last state); an unchanged object relisted keeps its version
            msg_id: stable_id(&[ctx.name(), k, &state.uid, &digest, &state.resource_version]),
            collapse: Some(subject.clone()),
            subject,
            cluster_time,
        },
        state,
    );
    if let Err(e) = ctx.seen.insert(sk.as_bytes(), digest.as_bytes()) {
        tracing::warn!(cluster = ctx.name(), error = %e, "seen-state cache write failed");
    }
    key
}

fn on_delete(ctx: &ClusterCtx, kind: &Chosen, ns: Option<&str>, name: &str, uid: &str, rv: &str) {
    let k = kind.spec.kind;
    ctx.view.remove(k, ns, name);
    let sk = seen_key(k, ns, name);
    let _ = ctx.seen.remove(sk.as_bytes());
    let subject = subject::state(ctx.name(), k, ns, name);
    ctx.emit(
        Meta {
            class: Class::State,
            msg_id: stable_id(&[ctx.name(), k, uid, "deleted", rv]),
            collapse: Some(subject.clone()),
            subject,
            cluster_time: Utc::now(),
        },
        ResourceDeleted {
            api_version: kind.api_version().to_string(),
            kind: k.to_string(),
            namespace: ns.map(str::to_string),
            name: name.to_string(),
            uid: uid.to_string(),
            resource_version: rv.to_string(),
            last_spec_hash: String::new(),
        },
    );
}

/// After a complete (re)list: a resync marker, and a deletion for every object published before that is
/// no longer there (it vanished while nobody watched).
fn on_relisted(ctx: &ClusterCtx, kind: &Chosen, present: &[ObjectKey], epoch: u64) {
    let k = kind.spec.kind;
    let now: HashSet<String> = present
        .iter()
        .map(|o| seen_key(k, o.namespace.as_deref(), &o.name))
        .collect();
    let prefix = format!("{k}\u{0}");
    let gone: Vec<String> = ctx
        .seen
        .scan_prefix(prefix.as_bytes())
        .keys()
        .filter_map(|r| r.ok())
        .map(|k| String::from_utf8_lossy(&k).into_owned())
        .filter(|k| !now.contains(k))
        .collect();
    for g in gone {
        let mut parts = g.split('\u{0}');
        let (_, ns, name) = (
            parts.next(),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        let ns = (!ns.is_empty()).then_some(ns);
        on_delete(ctx, kind, ns, name, "", "");
    }
    const PART: usize = 1000;
    let parts = present.len().div_ceil(PART).max(1);
    for (i, chunk) in present
        .chunks(PART)
        .chain(std::iter::once(&[][..]).take(usize::from(present.is_empty())))
        .enumerate()
    {
        let subject = subject::resync(ctx.name(), k);
        ctx.emit(
            Meta {
                class: Class::State,
                msg_id: stable_id(&[ctx.name(), k, "resync", &epoch.to_string(), &i.to_string()]),
                collapse: None,
                subject,
                cluster_time: Utc::now(),
            },
            ResyncMarker {
                api_version: kind.api_version().to_string(),
                kind: k.to_string(),
                epoch,
                object_count: present.len() as u64,
                present: chunk.to_vec(),
                part: i as u32,
                parts: parts as u32,
            },
        );
    }
}

fn watcher_config(ctx: &ClusterCtx) -> watcher::Config {
    watcher::Config::default().page_size(ctx.timings.page_size)
}

async fn watch_kind(ctx: Arc<ClusterCtx>, kind: Chosen, cancel: CancellationToken) {
    let mut present: Vec<ObjectKey> = Vec::new();
    let handle = |ev: watcher::Event<Value>, present: &mut Vec<ObjectKey>| match ev {
        watcher::Event::Init => present.clear(),
        watcher::Event::InitApply(obj) => {
            let key = on_object(&ctx, &kind, obj);
            present.push(key);
        }
        watcher::Event::InitDone => {
            let epoch = Utc::now().timestamp_millis().max(0) as u64;
            on_relisted(&ctx, &kind, present, epoch);
            present.clear();
        }
        watcher::Event::Apply(obj) => {
            on_object(&ctx, &kind, obj);
        }
        watcher::Event::Delete(obj) => {
            let s = |p: &str| {
                obj.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            let ns = s("/metadata/namespace");
            on_delete(
                &ctx,
                &kind,
                (!ns.is_empty()).then_some(ns.as_str()),
                &s("/metadata/name"),
                &s("/metadata/uid"),
                &s("/metadata/resourceVersion"),
            );
        }
    };
    // Secrets are read metadata-only; everything else whole. Both become JSON for one event loop.
    let (api_version, kind_name) = (kind.api_version().to_string(), kind.spec.kind);
    let mut stream: BoxStream<'static, Result<watcher::Event<Value>, watcher::Error>> = if kind
        .spec
        .metadata_only
    {
        let api: Api<PartialObjectMeta<DynamicObject>> =
            Api::all_with(ctx.client.clone(), &kind.resource);
        watcher(api, watcher_config(&ctx))
                .default_backoff()
                .map_ok(move |ev| {
                    map_event(ev, |m| {
                        serde_json::json!({"apiVersion": api_version, "kind": kind_name, "metadata": serde_json::to_value(&m.metadata).unwrap_or(Value::Null)})
                    })
                })
                .boxed()
    } else {
        let api: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &kind.resource);
        watcher(api, watcher_config(&ctx))
            .default_backoff()
            .map_ok(|ev| map_event(ev, |o| serde_json::to_value(o).unwrap_or(Value::Null)))
            .boxed()
    };
    loop {
        let next = tokio::select! {
            _ = cancel.cancelled() => return,
            n = stream.next() => n,
        };
        match next {
            None => return,
            Some(Ok(ev)) => {
                ctx.reachable.store(true, Ordering::Relaxed);
                handle(ev, &mut present);
            }
            Some(Err(e)) => {
                ctx.reachable.store(false, Ordering::Relaxed);
                tracing::debug!(cluster = ctx.name(), kind = kind.spec.kind, error = %e, "watch error; backing off");
            }
        }
    }
}

fn parse_time(v: Option<&Value>) -> Option<DateTime<Utc>> {
    v.and_then(Value::as_str)
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
}

/// Normalises a `v1` or `events.k8s.io/v1` Event.
pub fn kube_event(source_api: &str, e: &Value) -> Option<KubeEvent> {
    let s = |p: &str| {
        e.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let events_api = source_api.starts_with("events.k8s.io");
    let involved = if events_api {
        e.get("regarding")
    } else {
        e.get("involvedObject")
    }?;
    let series_count = e.pointer("/series/count").and_then(Value::as_u64);
    let count = series_count
        .or_else(|| {
            e.get(if events_api {
                "deprecatedCount"
            } else {
                "count"
            })
            .and_then(Value::as_u64)
        })
        .unwrap_or(1)
        .max(1);
    let last_time = parse_time(e.pointer("/series/lastObservedTime"))
        .or_else(|| parse_time(e.get("eventTime")))
        .or_else(|| {
            parse_time(e.get(if events_api {
                "deprecatedLastTimestamp"
            } else {
                "lastTimestamp"
            }))
        })
        .or_else(|| parse_time(e.pointer("/metadata/creationTimestamp")))?;
    let first_time = parse_time(e.get(if events_api {
        "deprecatedFirstTimestamp"
    } else {
        "firstTimestamp"
    }));
    let uid = s("/metadata/uid");
    let event_type = s("/type");
    let reporter = if events_api {
        s("/reportingController")
    } else {
        let r = s("/reportingComponent");
        if r.is_empty() {
            s("/source/component")
        } else {
            r
        }
    };
    let occurrence_id = stable_id(&[&uid, &count.to_string(), &last_time.to_rfc3339()]);
    let ns = involved
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    Some(KubeEvent {
        occurrence_id,
        uid,
        involved: multipilot_schemas::payload::ObjectRef {
            api_version: involved
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
            kind: involved
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
            namespace: (!ns.is_empty()).then(|| ns.to_string()),
            name: involved
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
            uid: involved
                .get("uid")
                .and_then(Value::as_str)
                .map(str::to_string)
                .filter(|u| !u.is_empty()),
        },
        reason: s("/reason"),
        message: if events_api {
            s("/note")
        } else {
            s("/message")
        },
        severity: if event_type == "Warning" {
            Severity::Warning
        } else {
            Severity::Info
        },
        event_type,
        count,
        first_time,
        last_time,
        reporter,
        action: Some(s("/action")).filter(|a| !a.is_empty()),
        source_api: source_api.to_string(),
    })
}

async fn watch_events(ctx: Arc<ClusterCtx>, kind: Chosen, cancel: CancellationToken) {
    let api: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &kind.resource);
    let mut stream = watcher(api, watcher_config(&ctx)).default_backoff().boxed();
    let source_api = kind.api_version().to_string();
    let mut present: HashSet<String> = HashSet::new();
    let prefix = "event\u{0}";
    loop {
        let next = tokio::select! {
            _ = cancel.cancelled() => return,
            n = stream.next() => n,
        };
        let ev = match next {
            None => return,
            Some(Ok(ev)) => ev,
            Some(Err(e)) => {
                tracing::debug!(cluster = ctx.name(), error = %e, "event watch error; backing off");
                continue;
            }
        };
        let handle = |obj: DynamicObject, present: &mut HashSet<String>| {
            let v = serde_json::to_value(&obj).unwrap_or(Value::Null);
            let Some(e) = kube_event(&source_api, &v) else {
                tracing::debug!(
                    cluster = ctx.name(),
                    "event without a time or an object; skipped"
                );
                return;
            };
            let sk = format!("{prefix}{}", e.uid);
            present.insert(sk.clone());
            if ctx
                .seen
                .get(sk.as_bytes())
                .ok()
                .flatten()
                .is_some_and(|v| v.as_ref() == e.occurrence_id.as_bytes())
            {
                return;
            }
            let _ = ctx.seen.insert(sk.as_bytes(), e.occurrence_id.as_bytes());
            ctx.emit(
                Meta {
                    class: Class::Event,
                    subject: subject::event(ctx.name(), &e.involved.kind),
                    msg_id: stable_id(&[ctx.name(), "event", &e.occurrence_id]),
                    collapse: None,
                    cluster_time: e.last_time,
                },
                e,
            );
        };
        match ev {
            watcher::Event::Init => present.clear(),
            watcher::Event::InitApply(o) => handle(o, &mut present),
            watcher::Event::Apply(o) => handle(o, &mut HashSet::new()),
            watcher::Event::InitDone => {
                // forget occurrences of events that no longer exist (expired), keep the rest
                let stale: Vec<sled::IVec> = ctx
                    .seen
                    .scan_prefix(prefix.as_bytes())
                    .keys()
                    .filter_map(|k| k.ok())
                    .filter(|k| !present.contains(String::from_utf8_lossy(k).as_ref()))
                    .collect();
                for k in stale {
                    let _ = ctx.seen.remove(k);
                }
            }
            watcher::Event::Delete(o) => {
                if let Some(uid) = o.metadata.uid {
                    let _ = ctx.seen.remove(format!("{prefix}{uid}").as_bytes());
                }
            }
        }
    }
}

fn component(name: &str, images: &[String], ready: i64, desired: i64) -> Component {
    let version = images
        .first()
        .and_then(|i| i.rsplit_once(':').map(|(_, t)| t.to_string()))
        .unwrap_or_default();
    Component {
        name: name.to_string(),
        version,
        ready: Some(format!("{ready}/{desired}")),
    }
}

/// Known CNI daemonsets.
pub const CNI_DAEMONSETS: &[(&str, &str)] = &[
    ("calico-node", "calico"),
    ("cilium", "cilium"),
    ("kube-flannel-ds", "flannel"),
    ("weave-net", "weave"),
    ("aws-node", "aws-vpc-cni"),
    ("antrea-agent", "antrea"),
    ("kube-router", "kube-router"),
    ("canal", "canal"),
];

/// Builds the cluster's facts from discovery, `/version` and the view.
pub async fn facts(ctx: &ClusterCtx, discovery: &Discovery) -> Result<ClusterFacts, kube::Error> {
    let info = ctx.client.apiserver_version().await?;
    let minor: u32 = info.minor.trim_end_matches('+').parse().unwrap_or(0);
    let mut api_versions: Vec<String> = Vec::new();
    for g in discovery.groups() {
        for v in g.versions() {
            api_versions.push(if g.name().is_empty() {
                v.to_string()
            } else {
                format!("{}/{v}", g.name())
            });
        }
    }
    api_versions.sort();
    api_versions.dedup();
    let view = ctx.view.snapshot();
    let nodes = NodeCounts {
        total: view.nodes.len() as u32,
        ready: view
            .nodes
            .values()
            .filter(|n| n.ready == Some(true))
            .count() as u32,
        control_plane: view.nodes.values().filter(|n| n.control_plane).count() as u32,
    };
    let find = |pred: &dyn Fn(&crate::view::WorkloadView) -> bool| {
        view.workloads.values().find(|w| pred(w)).cloned()
    };
    let cni = CNI_DAEMONSETS.iter().find_map(|(ds, label)| {
        find(&|w| w.object.kind == "DaemonSet" && w.object.name == *ds)
            .map(|w| component(label, &w.images, w.ready, w.desired))
    });
    let coredns = find(&|w| {
        w.object.kind == "Deployment"
            && (w.object.name == "coredns"
                || w.labels.get("k8s-app").is_some_and(|v| v == "kube-dns"))
    })
    .map(|w| component("coredns", &w.images, w.ready, w.desired));
    let ingress = find(&|w| {
        w.object.kind == "Deployment"
            && w.images
                .iter()
                .any(|i| i.contains("ingress-nginx/controller"))
    })
    .map(|w| component("ingress-nginx", &w.images, w.ready, w.desired));
    let gpu_plugin = find(&|w| {
        w.object.kind == "DaemonSet"
            && (w.object.name.contains("nvidia-device-plugin")
                || w.images.iter().any(|i| i.contains("k8s-device-plugin")))
    })
    .map(|w| component("nvidia-device-plugin", &w.images, w.ready, w.desired));
    let gpus = view
        .nodes
        .iter()
        .filter(|(_, n)| n.gpu_capacity > 0)
        .map(|(name, n)| GpuNode {
            node: name.clone(),
            model: n.gpu_model.clone().unwrap_or_default(),
            driver_version: n.gpu_driver.clone().unwrap_or_default(),
            capacity: n.gpu_capacity,
            allocatable: n.gpu_allocatable,
            allocated: view.gpu_requests.get(name).copied().unwrap_or(0),
        })
        .collect();
    // one entry per distinct (OS image, kernel, runtime), most nodes first
    let mut software: BTreeMap<&(String, String, String), u32> = BTreeMap::new();
    for n in view.nodes.values() {
        if n.software != Default::default() {
            *software.entry(&n.software).or_default() += 1;
        }
    }
    let mut node_software: Vec<NodeSoftware> = software
        .into_iter()
        .map(|((os, kernel, runtime), nodes)| NodeSoftware {
            os_image: os.clone(),
            kernel_version: kernel.clone(),
            container_runtime: runtime.clone(),
            nodes,
        })
        .collect();
    node_software.sort_by(|a, b| b.nodes.cmp(&a.nodes).then(a.cmp(b)));
    Ok(ClusterFacts {
        node_software,
        version: KubeVersion {
            major: info.major.parse().unwrap_or(1),
            minor,
            git_version: info.git_version.clone(),
            platform: info.platform.clone(),
        },
        api_versions,
        preferred_versions: ctx.chosen.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        nodes,
        cni,
        coredns,
        ingress_controller: ingress,
        gpu_device_plugin: gpu_plugin,
        ingress_classes: view.ingress_classes.keys().cloned().collect(),
        storage_classes: view.storage_classes.keys().cloned().collect(),
        default_storage_class: view
            .storage_classes
            .iter()
            .find(|(_, d)| **d)
            .map(|(n, _)| n.clone()),
        apiserver_cert_expiry: *ctx.cert_expiry.lock().unwrap_or_else(|e| e.into_inner()),
        gpus,
        labels: ctx.config.labels.clone(),
        scrape_interval_s: None,
    })
}

/// Publishes the cluster's facts when they change; `scrape_interval_s` is the agent's own (see
/// [`ClusterFacts::scrape_interval_s`]).
async fn facts_loop(
    ctx: Arc<ClusterCtx>,
    first: Option<Discovery>,
    scrape_interval_s: Option<u32>,
    cancel: CancellationToken,
) {
    let mut discovery = first;
    let mut last_digest = String::new();
    // the first facts wait for the watchers' initial lists to fill the view
    let mut wait = Duration::from_secs(3);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = Duration::from_secs(ctx.timings.discovery_interval_s.max(5).into());
        if discovery.is_none() {
            discovery = Discovery::new(ctx.client.clone()).run().await.ok();
        }
        let Some(d) = discovery.take() else { continue };
        match facts(&ctx, &d).await {
            Ok(mut f) => {
                f.scrape_interval_s = scrape_interval_s;
                let digest = normalize::hash(&normalize::canonical_json(
                    &serde_json::to_value(&f).unwrap_or(Value::Null),
                ));
                if digest != last_digest {
                    let subject = subject::facts(ctx.name());
                    ctx.emit(
                        Meta {
                            class: Class::Probe,
                            // with when it changed: facts changed back (A → B → A) within the
                            // duplicate window are new, not a duplicate of A's first message
                            msg_id: stable_id(&[
                                ctx.name(),
                                "facts",
                                &digest,
                                &chrono::Utc::now().timestamp_millis().to_string(),
                            ]),
                            collapse: Some(subject.clone()),
                            subject,
                            cluster_time: Utc::now(),
                        },
                        f,
                    );
                    last_digest = digest;
                }
            }
            Err(e) => tracing::warn!(cluster = ctx.name(), error = %e, "facts round failed"),
        }
        // later rounds rediscover (served versions change on upgrades)
    }
}
