//! The shell of a release's apply and rollback: it runs the [`crate::machine`] and carries out its
//! decisions — the release and the history in sled (written through to the KV bucket), snapshots, applies,
//! rollout reads and restores as signed commands to the clusters' agents, incidents read from
//! FLEET_INCIDENTS, and the timers — feeding what came of them back as the machine's inputs.
//!
//! Per batch: snapshot every object of the release on each of its clusters (stored durably before anything
//! changes), mark the clusters changed (durably), server-side apply with the release's field manager (force
//! only when the spec says so), delete what the spec deletes; then the health gate and the soak
//! (`fleet.incident.<cluster>.>` and `fleet.fleet-incident.>` on FLEET_INCIDENTS, since the batch started).
//! A rollback re-applies the snapshots (force, same field manager) and deletes objects the release created.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use multipilot_bus::jetstream::{Start, decode, header, read_history};
use multipilot_schemas::codec::DEFAULT_MAX_BYTES;
use multipilot_schemas::payload::{
    ApplyOutcome, FleetIncident, Incident, ObjectRef, ReleaseAction,
};
use multipilot_schemas::streams::name;
use multipilot_schemas::{HEADER_SCHEMA, Payload, subject};
use serde_json::{Value, json};

use crate::Service;
use crate::exec::{self, Command};
use crate::machine::{Decision, HealthRead, Hold, HoldCheck, Input, Machine, Policy, StepOutcome};
use crate::model::{ClusterPlan, Release, State, obj_name};
use crate::spec::parse_selector;
use crate::store;

/// How often held releases are tried again.
const HELD_RETRY: Duration = Duration::from_secs(5);

/// Why a step of a run could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The release is no longer stored.
    #[error("release {0} vanished")]
    Vanished(String),
    /// The store failed (retryable: the disk or the bucket may come back).
    #[error(transparent)]
    Store(#[from] store::Error),
    /// A cluster's agent did not answer, or not understandably (retryable).
    #[error(transparent)]
    Agent(#[from] exec::Error),
    /// The cluster is not in the release's plan.
    #[error("cluster not in the plan")]
    NotInPlan,
    /// The agent could not read the objects before the change.
    #[error("{cluster}: snapshot failed: {reason}")]
    Snapshot {
        /// Cluster.
        cluster: String,
        /// The agent's error.
        reason: String,
    },
    /// A rollback found no snapshot of the cluster.
    #[error("{cluster}: no snapshot stored")]
    NoSnapshot {
        /// Cluster.
        cluster: String,
    },
    /// FLEET_INCIDENTS could not be read (retryable).
    #[error("{0}")]
    Incidents(String),
}

impl Error {
    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Store(_) | Error::Agent(_) | Error::Incidents(_)
        )
    }
}

/// The object as it can be applied again: status and server-set metadata removed.
pub fn restorable(live: &Value) -> Value {
    let mut v = live.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
    }
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.retain(|k, _| matches!(k.as_str(), "name" | "namespace" | "labels" | "annotations"));
    }
    v
}

/// The fields of `live` (a snapshot's object) at the places the `shapes` (what the release applied: this
/// revision's rendered object, and the previous revision's) set — what a rollback re-applies under the
/// release's field manager. Re-applying the whole snapshot would make that manager own every field of the
/// object, and the next revision, which sets fewer, would delete the rest (resources, strategy…) as
/// server-side apply does with fields a manager stops setting. Projected, the manager owns what it owned,
/// with the values from before; a field the release added and the snapshot lacks is left out, so the apply
/// removes it again. Lists of objects are matched by their merge key (`name`, `containerPort`,
/// `mountPath`, `port`, …), other lists are atomic and taken whole.
pub fn projected(live: &Value, shapes: &[&Value]) -> Value {
    fn key_of(items: &[&Value]) -> Option<&'static str> {
        [
            "name",
            "containerPort",
            "mountPath",
            "port",
            "devicePath",
            "ip",
            "type",
        ]
        .into_iter()
        .find(|k| !items.is_empty() && items.iter().all(|i| i.get(*k).is_some()))
    }
    fn walk(live: &Value, shapes: &[&Value]) -> Value {
        match live {
            Value::Object(m) => {
                let mut out = serde_json::Map::new();
                for (k, v) in m {
                    let sub: Vec<&Value> = shapes.iter().filter_map(|s| s.get(k)).collect();
                    if !sub.is_empty() {
                        out.insert(k.clone(), walk(v, &sub));
                    }
                }
                Value::Object(out)
            }
            Value::Array(items) => {
                let shape_items: Vec<&Value> = shapes
                    .iter()
                    .filter_map(|s| s.as_array())
                    .flatten()
                    .collect();
                let maps =
                    items.iter().all(Value::is_object) && shape_items.iter().all(|i| i.is_object());
                let key = if maps { key_of(&shape_items) } else { None };
                match key {
                    Some(k) => Value::Array(
                        items
                            .iter()
                            .filter_map(|i| {
                                let want = i.get(k)?;
                                let sub: Vec<&Value> = shape_items
                                    .iter()
                                    .copied()
                                    .filter(|s| s.get(k) == Some(want))
                                    .collect();
                                (!sub.is_empty()).then(|| walk(i, &sub))
                            })
                            .collect(),
                    ),
                    None => live.clone(),
                }
            }
            other => other.clone(),
        }
    }
    let mut out = walk(&restorable(live), shapes);
    // what names the object, whatever the shapes say
    if let (Some(o), Some(l)) = (out.as_object_mut(), live.as_object()) {
        for k in ["apiVersion", "kind"] {
            if let Some(v) = l.get(k) {
                o.insert(k.into(), v.clone());
            }
        }
        o.entry("metadata").or_insert_with(|| json!({}));
    }
    if let Some(m) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in ["name", "namespace"] {
            if let Some(v) = live.pointer(&format!("/metadata/{k}")) {
                m.insert(k.into(), v.clone());
            }
        }
    }
    out
}

/// The same object (the namespace of a rendered one may be left to the default).
fn same_object(a: &ObjectRef, b: &ObjectRef) -> bool {
    a.kind == b.kind
        && a.name == b.name
        && a.api_version.split('/').next() == b.api_version.split('/').next()
        && (a.namespace == b.namespace || a.namespace.is_none() || b.namespace.is_none())
}

/// What an agent's failed answer says: each object's error, or the command's.
fn failure_text(res: &multipilot_schemas::payload::ReleaseResult) -> String {
    let errs: Vec<String> = res
        .objects
        .iter()
        .filter_map(|o| {
            o.error
                .as_ref()
                .map(|e| format!("{} {}: {e}", o.object.kind, obj_name(&o.object)))
        })
        .collect();
    if errs.is_empty() {
        res.error.clone().unwrap_or_default()
    } else {
        errs.join("; ")
    }
}

impl Service {
    fn cluster_plan<'a>(r: &'a Release, cluster: &str) -> Option<&'a ClusterPlan> {
        r.plan.clusters.iter().find(|c| c.cluster == cluster)
    }

    fn load(&self, name: &str) -> Result<Release, Error> {
        self.store
            .get(name)?
            .ok_or_else(|| Error::Vanished(name.to_string()))
    }

    /// The release's timings, field manager and approval gate (a batch holding a cluster the gate selector
    /// matches, or one the registry no longer knows: the gate never opens by forgetting).
    fn policy(&self, r: &Release) -> (Policy, Option<crate::spec::Error>) {
        let mut policy = Policy {
            soak: r.spec.soak.unwrap_or(self.config.default_soak),
            health_timeout: r.spec.health_timeout.unwrap_or(self.config.health_timeout),
            health_interval: Duration::from_secs(1),
            field_manager: self.field_manager(&r.spec),
            gated: None,
            analysis: None,
            health: self.health.clone(),
            hold: Some(self.hold_check()),
        };
        if let Some(a) = &r.spec.analysis {
            match a.compile(policy.soak) {
                Ok(c) => policy.analysis = Some(c),
                Err(e) => return (policy, Some(e.into())),
            }
        }
        let Some(text) = &r.spec.sync.approval_selector else {
            return (policy, None);
        };
        match parse_selector(text) {
            Ok(sel) => {
                let registry = self.registry.clone();
                policy.gated = Some(Box::new(move |batch: &[String]| {
                    let reg = registry.snapshot();
                    batch.iter().any(|c| {
                        reg.get(c)
                            .is_none_or(|f| sel.matches_map(&crate::plan::selector_labels(c, f)))
                    })
                }));
                (policy, None)
            }
            Err(e) => (policy, Some(e)),
        }
    }

    /// Whether a batch must wait: a sync window closed on one of its clusters (an operator's override
    /// passes the windows that allow manual syncs), or a release it depends on not healthy there yet.
    fn hold_check(&self) -> HoldCheck {
        let (windows, registry, store) = (
            self.windows.clone(),
            self.registry.clone(),
            self.store.clone(),
        );
        Box::new(move |r: &Release, batch: &[String], now| {
            let mut reasons = Vec::new();
            let mut overridden = Vec::new();
            if !windows.is_empty() {
                let reg = registry.snapshot();
                for c in batch {
                    let labels = reg
                        .get(c)
                        .map(|f| crate::plan::selector_labels(c, f))
                        .unwrap_or_default();
                    let v = windows.verdict(&r.name, &labels, c, now);
                    if v.allowed {
                        continue;
                    }
                    if r.override_windows && v.manual_sync_allowed {
                        overridden.push(format!("{c}: {}", v.reason));
                    } else {
                        reasons.push(format!("{c}: {}", v.reason));
                    }
                }
            }
            if !r.spec.depends_on.is_empty() {
                let stored: BTreeMap<String, Release> = r
                    .spec
                    .depends_on
                    .iter()
                    .filter_map(|d| store.get(d).ok().flatten().map(|x| (d.clone(), x)))
                    .collect();
                reasons.extend(crate::order::waiting_for(r, batch, &stored));
            }
            if reasons.is_empty() && overridden.is_empty() {
                return None;
            }
            Some(Hold {
                reason: reasons.join("; "),
                overridden,
            })
        })
    }

    /// Tries the held releases again every few seconds: a window opened, a dependency became healthy.
    pub async fn retry_held(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(HELD_RETRY) => {}
            }
            let held: Vec<String> = match self.store.all() {
                Ok(all) => all
                    .into_iter()
                    .filter(|r| r.state == State::Held)
                    .map(|r| r.name)
                    .collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "held releases not read");
                    continue;
                }
            };
            for name in held {
                let actor = {
                    let _g = self.lock.lock().await;
                    let Ok(Some(mut r)) = self.store.get(&name) else {
                        continue;
                    };
                    if r.state != State::Held {
                        continue;
                    }
                    r.state = State::Applying;
                    if let Err(e) = self.store.put(&r).await {
                        tracing::warn!(release = %name, error = %e, "held release not resumed");
                        continue;
                    }
                    r.actor.clone()
                };
                tokio::spawn(self.clone().run_apply(name, actor));
            }
        }
    }

    /// Applies a release (already in state `applying`) from its first batch not done, then rolls back on
    /// failure. Stops (state `waiting-approval`) before a batch the `gate` approval holds.
    pub async fn run_apply(self: Arc<Self>, name: String, actor: String) {
        let r = match self.load(&name) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(release = %name, error = %e, "release not applied");
                return;
            }
        };
        let (policy, bad) = self.policy(&r);
        let first = match bad {
            None => Input::Start,
            Some(e) => Input::Failed(e.to_string()),
        };
        self.run(name, Machine::new(policy, actor), first).await
    }

    /// Rolls back every changed cluster of a release (already in state `rolling-back`) to its snapshot.
    pub async fn run_rollback(self: Arc<Self>, name: String, actor: String) {
        let r = match self.load(&name) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(release = %name, error = %e, "release not rolled back");
                return;
            }
        };
        let (policy, _) = self.policy(&r);
        self.run(name, Machine::new(policy, actor), Input::RollBack)
            .await
    }

    /// Feeds the machine and carries out its decisions until the run is over.
    async fn run(self: Arc<Self>, name: String, mut m: Machine, first: Input) {
        let mut todo: VecDeque<Decision> = self.feed(&name, &mut m, first).await.into();
        while let Some(d) = todo.pop_front() {
            match d {
                // carried out as they came
                Decision::Persist | Decision::Record(_) => {}
                Decision::Stop => return,
                Decision::Snapshot { clusters, .. } => {
                    let Some(r) = self.loaded(&name) else { return };
                    let step = |this: Arc<Self>, c: String| {
                        let r = r.clone();
                        async move {
                            let failure = this.snapshot_cluster(&r, &c).await.err();
                            Input::Snapshot {
                                cluster: c,
                                failure: failure.map(|e| e.to_string()),
                            }
                        }
                    };
                    todo.extend(self.feed_each(&name, &mut m, clusters, step).await);
                }
                Decision::Apply { batch, clusters } => {
                    let Some(r) = self.loaded(&name) else { return };
                    let step = |this: Arc<Self>, c: String| {
                        let r = r.clone();
                        async move {
                            let fm = this.field_manager(&r.spec);
                            let outcome = this.apply_cluster(&r, batch, &c, &fm).await;
                            Input::Step {
                                cluster: c,
                                outcome,
                            }
                        }
                    };
                    todo.extend(self.feed_each(&name, &mut m, clusters, step).await);
                }
                Decision::ReadHealth { workloads } => {
                    let Some(r) = self.loaded(&name) else { return };
                    let reads: Vec<HealthRead> =
                        futures::stream::iter(workloads.into_iter().map(|(c, objs)| {
                            let (this, r) = (self.clone(), r.clone());
                            async move { this.read_health(&r, c, objs).await }
                        }))
                        .buffer_unordered(self.config.parallelism)
                        .collect()
                        .await;
                    todo.extend(self.feed(&name, &mut m, Input::Health(reads)).await);
                }
                Decision::ReadIncidents { clusters, since } => {
                    let input = match self.read_incidents(&clusters, since).await {
                        Ok((incidents, fleet)) => Input::Incidents { incidents, fleet },
                        Err(e) => Input::IncidentsUnknown(e.to_string()),
                    };
                    todo.extend(self.feed(&name, &mut m, input).await);
                }
                Decision::Measure {
                    targets,
                    baseline,
                    rate_interval,
                    ..
                } => {
                    let Some(a) = m.analysis() else { return };
                    let answers = crate::measure::measure(
                        &self.tsdb,
                        &self.config.tsdb_url,
                        &a,
                        &targets,
                        &baseline,
                        rate_interval,
                    )
                    .await;
                    todo.extend(self.feed(&name, &mut m, Input::Measured(answers)).await);
                }
                Decision::WaitUntil(at) => {
                    let wait = (at - Utc::now()).to_std().unwrap_or_default();
                    let input = tokio::select! {
                        _ = self.cancel.cancelled() => Input::Stopping,
                        _ = tokio::time::sleep(wait) => Input::Tick,
                    };
                    todo.extend(self.feed(&name, &mut m, input).await);
                }
                Decision::RollBack { clusters } => {
                    let Some(r) = self.loaded(&name) else { return };
                    let step = |this: Arc<Self>, c: String| {
                        let r = r.clone();
                        async move {
                            let fm = this.field_manager(&r.spec);
                            let outcome = this.rollback_cluster(&r, &c, &fm).await;
                            Input::Restored {
                                cluster: c,
                                outcome,
                            }
                        }
                    };
                    todo.extend(self.feed_each(&name, &mut m, clusters, step).await);
                }
            }
        }
    }

    /// Runs `step` on each cluster (`parallelism` at a time) and feeds each answer to the machine as it
    /// comes; returns the decisions left to carry out.
    ///
    /// The steps are tasks of their own: they go on while an answer is fed. (Polled from a
    /// `buffer_unordered` instead, a step holding the store's lock stood still while the feed waited for
    /// that lock, and the release hung.)
    async fn feed_each<F, Fut>(
        self: &Arc<Self>,
        name: &str,
        m: &mut Machine,
        clusters: Vec<String>,
        step: F,
    ) -> Vec<Decision>
    where
        F: Fn(Arc<Self>, String) -> Fut,
        Fut: std::future::Future<Output = Input> + Send + 'static,
    {
        let slots = Arc::new(tokio::sync::Semaphore::new(self.config.parallelism.max(1)));
        let mut steps = tokio::task::JoinSet::new();
        for c in clusters {
            let (run, slots) = (step(self.clone(), c), slots.clone());
            steps.spawn(async move {
                let _slot = slots.acquire_owned().await;
                run.await
            });
        }
        let mut out = Vec::new();
        while let Some(joined) = steps.join_next().await {
            let input =
                joined.unwrap_or_else(|e| Input::Failed(format!("a step ended abnormally: {e}")));
            out.extend(self.feed(name, m, input).await);
        }
        out
    }

    /// The release as stored, for a step's commands; `None` (logged) stops the run.
    fn loaded(&self, name: &str) -> Option<Arc<Release>> {
        match self.load(name) {
            Ok(r) => Some(Arc::new(r)),
            Err(e) => {
                tracing::error!(release = %name, error = %e, "release run stopped");
                None
            }
        }
    }

    /// Gives the machine an input for the release as stored now, stores and records what it changed, and
    /// returns the decisions left to carry out. A release that can't be stored fails (the machine is told).
    async fn feed(&self, name: &str, m: &mut Machine, input: Input) -> Vec<Decision> {
        let _g = self.lock.lock().await;
        let mut r = match self.load(name) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(release = %name, error = %e, "release run stopped");
                return vec![Decision::Stop];
            }
        };
        let mut rest = Vec::new();
        let mut next = Some(input);
        while let Some(input) = next.take() {
            for d in m.on(&mut r, input, Utc::now()) {
                match d {
                    Decision::Persist => {
                        if let Err(e) = self.store.put(&r).await {
                            // what was decided after it is not carried out
                            rest.clear();
                            next = Some(Input::Failed(e.to_string()));
                            break;
                        }
                        self.releases_changed().await;
                    }
                    Decision::Record(e) => {
                        if e.what == "failed" {
                            tracing::warn!(release = %name, error = ?r.error, "release failed; rolling back");
                        }
                        self.record_entry(&mut r, e).await;
                    }
                    other => rest.push(other),
                }
            }
        }
        rest
    }

    fn objects_of(plan: &ClusterPlan) -> (Vec<Value>, Vec<Value>) {
        let applies = plan
            .objects
            .iter()
            .filter(|o| o.applied())
            .map(|o| o.rendered.clone())
            .collect();
        let deletes = plan
            .objects
            .iter()
            .filter(|o| o.delete)
            .map(|o| o.rendered.clone())
            .collect();
        (applies, deletes)
    }

    async fn snapshot_cluster(&self, r: &Release, cluster: &str) -> Result<(), Error> {
        if self.store.snapshot(&r.name, r.revision, cluster)?.is_some() {
            return Ok(());
        }
        let plan = Self::cluster_plan(r, cluster).ok_or(Error::NotInPlan)?;
        let (mut objects, deletes) = Self::objects_of(plan);
        objects.extend(deletes);
        let res = self
            .sender
            .send(&Command {
                id: format!("{}-r{}-{cluster}-snapshot", r.name, r.revision),
                release: r.name.clone(),
                cluster: cluster.into(),
                action: ReleaseAction::Snapshot,
                field_manager: self.field_manager(&r.spec),
                force: false,
                objects,
            })
            .await?;
        if !res.ok {
            return Err(Error::Snapshot {
                cluster: cluster.into(),
                reason: res.error.unwrap_or_default(),
            });
        }
        self.store
            .put_snapshot(&r.name, r.revision, cluster, &res.objects)
            .await?;
        Ok(())
    }

    async fn apply_cluster(&self, r: &Release, batch: u32, cluster: &str, fm: &str) -> StepOutcome {
        let Some(plan) = Self::cluster_plan(r, cluster) else {
            return StepOutcome::NotSent(Error::NotInPlan.to_string());
        };
        let (applies, deletes) = Self::objects_of(plan);
        let mut outcomes = Vec::new();
        let mut failure = None;
        for (objs, action, what) in [
            (applies, ReleaseAction::Apply, "apply"),
            (deletes, ReleaseAction::Delete, "delete"),
        ] {
            if objs.is_empty() {
                continue;
            }
            let cmd = Command {
                id: format!("{}-r{}-b{batch}-{cluster}-{what}", r.name, r.revision),
                release: r.name.clone(),
                cluster: cluster.into(),
                action,
                field_manager: fm.into(),
                force: r.spec.force,
                objects: objs,
            };
            match self.sender.send(&cmd).await {
                Ok(res) => {
                    if !res.ok {
                        failure = Some(format!("{cluster}: {what} failed: {}", failure_text(&res)));
                    }
                    outcomes.extend(res.objects);
                }
                Err(e) => failure = Some(format!("{cluster}: {e}")),
            }
            if failure.is_some() {
                break;
            }
        }
        StepOutcome::Sent { outcomes, failure }
    }

    /// Reads a cluster's workloads (a snapshot command: each one's live state).
    async fn read_health(&self, r: &Release, cluster: String, objects: Vec<Value>) -> HealthRead {
        let tag: u32 = rand::random();
        let res = self
            .sender
            .send(&Command {
                id: format!("{}-r{}-{cluster}-health{tag:08x}", r.name, r.revision),
                release: r.name.clone(),
                cluster: cluster.clone(),
                action: ReleaseAction::Snapshot,
                field_manager: self.field_manager(&r.spec),
                force: false,
                objects,
            })
            .await;
        match res {
            Ok(res) => HealthRead {
                cluster,
                objects: res.objects,
                error: None,
            },
            Err(e) => HealthRead {
                cluster,
                objects: Vec::new(),
                error: Some(e.to_string()),
            },
        }
    }

    /// Incidents on `clusters` and fleet incidents, as their latest revisions since `since`, read from
    /// FLEET_INCIDENTS.
    async fn read_incidents(
        &self,
        clusters: &[String],
        since: DateTime<Utc>,
    ) -> Result<(Vec<Incident>, Vec<FleetIncident>), Error> {
        let mut filters: Vec<String> = clusters
            .iter()
            .map(|c| subject::INCIDENT.of_cluster(c))
            .collect();
        filters.push(subject::FLEET_INCIDENT.all());
        let mut latest: BTreeMap<String, Incident> = BTreeMap::new();
        let mut fleet: BTreeMap<String, FleetIncident> = BTreeMap::new();
        read_history(
            &self.js,
            name::INCIDENTS,
            filters,
            Start::Since(since),
            |s| match header(s.message, HEADER_SCHEMA) {
                Some(h) if h.starts_with(FleetIncident::SCHEMA) => {
                    if let Ok(env) = decode::<FleetIncident>(s.message, DEFAULT_MAX_BYTES) {
                        let f = env.payload;
                        if fleet
                            .get(&f.id)
                            .is_none_or(|old| old.revision <= f.revision)
                        {
                            fleet.insert(f.id.clone(), f);
                        }
                    }
                }
                _ => {
                    if let Ok(env) = decode::<Incident>(s.message, DEFAULT_MAX_BYTES) {
                        let inc = env.payload;
                        if latest
                            .get(&inc.id)
                            .is_none_or(|old| old.revision <= inc.revision)
                        {
                            latest.insert(inc.id.clone(), inc);
                        }
                    }
                }
            },
        )
        .await
        .map_err(|e| Error::Incidents(e.to_string()))?;
        Ok((
            latest.into_values().collect(),
            fleet.into_values().collect(),
        ))
    }

    /// Restores a cluster to its snapshot: objects that existed are re-applied (force: the snapshot wins
    /// over whatever the release set), objects that did not are deleted.
    async fn rollback_cluster(&self, r: &Release, cluster: &str, fm: &str) -> StepOutcome {
        let snap = match self.store.snapshot(&r.name, r.revision, cluster) {
            Ok(Some(s)) => s,
            Ok(None) => {
                return StepOutcome::NotSent(
                    Error::NoSnapshot {
                        cluster: cluster.into(),
                    }
                    .to_string(),
                );
            }
            Err(e) => return StepOutcome::NotSent(e.to_string()),
        };
        let mut restore = Vec::new();
        let mut remove = Vec::new();
        // what the release applied there, this revision and the one before (the fields its manager owns)
        let applied: Vec<(ObjectRef, &Value)> = Self::cluster_plan(r, cluster)
            .into_iter()
            .flat_map(|p| p.objects.iter())
            .filter(|o| o.applied())
            .map(|o| (o.object.clone(), &o.rendered))
            .chain(
                r.deployed_before
                    .get(cluster)
                    .into_iter()
                    .flat_map(|d| d.objects.iter())
                    .map(|v| (crate::plan::oref(v), v)),
            )
            .collect();
        for o in &snap {
            match &o.live {
                Some(live) => {
                    let shapes: Vec<&Value> = applied
                        .iter()
                        .filter(|(k, _)| same_object(k, &o.object))
                        .map(|(_, v)| *v)
                        .collect();
                    restore.push(if shapes.is_empty() {
                        // deleted by the release, or not of it: back whole
                        restorable(live)
                    } else {
                        projected(live, &shapes)
                    });
                }
                None if o.outcome == ApplyOutcome::Absent => {
                    let mut meta = serde_json::Map::new();
                    meta.insert("name".into(), json!(o.object.name));
                    if let Some(ns) = &o.object.namespace {
                        meta.insert("namespace".into(), json!(ns));
                    }
                    remove.push(json!({"apiVersion": o.object.api_version, "kind": o.object.kind, "metadata": meta}));
                }
                None => {}
            }
        }
        let mut outcomes = Vec::new();
        let mut failure = None;
        for (objs, action, what) in [
            (restore, ReleaseAction::Apply, "restore"),
            (remove, ReleaseAction::Delete, "delete"),
        ] {
            if objs.is_empty() {
                continue;
            }
            let cmd = Command {
                id: format!(
                    "{}-r{}-rb{}-{cluster}-{what}",
                    r.name, r.revision, r.rollbacks
                ),
                release: r.name.clone(),
                cluster: cluster.into(),
                action,
                field_manager: fm.into(),
                force: true,
                objects: objs,
            };
            match self.sender.send(&cmd).await {
                Ok(res) => {
                    if !res.ok {
                        failure = Some(format!(
                            "{cluster}: {what}: {}",
                            res.objects
                                .iter()
                                .filter_map(|o| o.error.clone())
                                .chain(res.error.clone())
                                .collect::<Vec<_>>()
                                .join("; ")
                        ));
                    }
                    outcomes.extend(res.objects);
                }
                Err(e) => failure = Some(format!("{cluster}: {e}")),
            }
        }
        // the objects' last states are the failed revision's until the restored ones arrive
        self.drift
            .lock()
            .await
            .forget(cluster, snap.iter().map(|o| o.object.clone()));
        StepOutcome::Sent { outcomes, failure }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollback_restores_only_the_fields_the_release_applied() {
        let live = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "catalog", "uid": "u", "labels": {"team": "catalog"},
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {"replicas": 3, "revisionHistoryLimit": 10,
                "strategy": {"type": "RollingUpdate"},
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [
                        {"name": "web", "image": "web:1.5.0", "resources": {"limits": {"memory": "256Mi"}},
                         "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}]},
                        {"name": "sidecar", "image": "proxy:1"}]}}},
            "status": {"replicas": 3}});
        let rendered = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "catalog"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "web:1.6.0",
                        "ports": [{"containerPort": 8080}], "args": ["--new"]}]}}}});
        assert_eq!(
            projected(&live, &[&rendered]),
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "catalog"},
                "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "web", "image": "web:1.5.0",
                            "ports": [{"containerPort": 8080}]}]}}}}),
            "the image back, the release's new args left out (the apply removes them), what others own untouched"
        );
        // the previous revision's fields count too
        let before = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"revisionHistoryLimit": 5}});
        let p = projected(&live, &[&rendered, &before]);
        assert_eq!(p["spec"]["revisionHistoryLimit"], 10);
        assert!(p["spec"].get("strategy").is_none());
    }

    #[test]
    fn restorable_keeps_what_an_apply_may_carry() {
        let live = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "n",
            "uid": "u", "resourceVersion": "7", "labels": {"x": "1"}}, "data": {"k": "v"}, "status": {}});
        assert_eq!(
            restorable(&live),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "n",
                "labels": {"x": "1"}}, "data": {"k": "v"}})
        );
    }
}
