//! Applying a planned release batch by batch, and rolling back.
//!
//! Per batch: snapshot every object of the release on each of its clusters (stored durably before anything
//! changes), mark the clusters changed (durably), server-side apply with the release's field manager (force
//! only when the spec says so), delete what the spec deletes; then the health gate: every Deployment,
//! StatefulSet and DaemonSet applied must complete its rollout (observedGeneration ≥ generation, updated ==
//! available == desired replicas) within the health timeout, then a soak window with no new incident
//! (`fleet.incident.<cluster>.>` on FLEET_INCIDENTS, opened since the batch started) on those clusters.
//! The first failing batch stops the release and every changed cluster is rolled back: the snapshots are
//! re-applied (force, same field manager) and objects the release created are deleted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use multipilot_schemas::payload::{
    ApplyOutcome, FleetIncident, Incident, IncidentStatus, ObjectOutcome, ReleaseAction,
    SuspectVerdict,
};
use multipilot_schemas::{Envelope, subject};
use serde_json::{Value, json};

use crate::Service;
use crate::exec::Command;
use crate::model::{BatchProgress, BatchState, ClusterPlan, Deployed, Release, State, obj_name};
use crate::spec::{GATE_APPROVAL, Selector};

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

/// Whether a workload's rollout is complete; `Err` says what is missing.
pub fn rollout_complete(obj: &Value) -> Result<(), String> {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let i = |p: &str| obj.pointer(p).and_then(Value::as_i64);
    let generation = i("/metadata/generation").unwrap_or(0);
    let observed = i("/status/observedGeneration").unwrap_or(0);
    if observed < generation {
        return Err(format!(
            "observedGeneration {observed} < generation {generation}"
        ));
    }
    let (desired, updated, available) = match kind {
        "Deployment" => (
            i("/spec/replicas").unwrap_or(1),
            i("/status/updatedReplicas").unwrap_or(0),
            i("/status/availableReplicas").unwrap_or(0),
        ),
        "StatefulSet" => (
            i("/spec/replicas").unwrap_or(1),
            i("/status/updatedReplicas").unwrap_or(0),
            i("/status/availableReplicas")
                .or(i("/status/readyReplicas"))
                .unwrap_or(0),
        ),
        "DaemonSet" => (
            i("/status/desiredNumberScheduled").unwrap_or(0),
            i("/status/updatedNumberScheduled").unwrap_or(0),
            i("/status/numberAvailable").unwrap_or(0),
        ),
        _ => return Ok(()),
    };
    let total = i("/status/replicas").unwrap_or(desired);
    if updated == desired && available == desired && (kind == "DaemonSet" || total == desired) {
        Ok(())
    } else {
        Err(format!(
            "updated {updated}/{desired}, available {available}/{desired}"
        ))
    }
}

fn is_workload(kind: &str) -> bool {
    matches!(kind, "Deployment" | "StatefulSet" | "DaemonSet")
}

fn counts(objs: &[ObjectOutcome]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for o in objs {
        *m.entry(o.outcome.as_str().to_string()).or_default() += 1;
    }
    m
}

fn count_text(c: &BTreeMap<String, usize>) -> String {
    c.iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Service {
    fn cluster_plan<'a>(r: &'a Release, cluster: &str) -> Option<&'a ClusterPlan> {
        r.plan.clusters.iter().find(|c| c.cluster == cluster)
    }

    /// Applies a release (already in state `applying`) from its first batch not done, then rolls back on
    /// failure. Stops (state `waiting-approval`) before a batch the `gate` approval holds.
    pub async fn run_apply(self: Arc<Self>, name: String, actor: String) {
        if let Err(e) = self.clone().apply_batches(&name, &actor).await {
            tracing::warn!(release = %name, error = %e, "release failed; rolling back");
            let _guard = self.lock.lock().await;
            if let Ok(Some(mut r)) = self.store.get(&name) {
                // failed, and rolling back at once: nobody waiting for the release sees it ended in between
                r.state = State::RollingBack;
                r.error = Some(e.clone());
                let changed = r.changed.clone();
                self.record(
                    &mut r,
                    "failed",
                    false,
                    &actor,
                    None,
                    changed,
                    format!("release failed: {e}"),
                    json!({"error": e}),
                )
                .await;
            }
            drop(_guard);
            self.run_rollback(name, "system".into()).await;
        }
    }

    async fn apply_batches(self: Arc<Self>, name: &str, actor: &str) -> Result<(), String> {
        let r = Arc::new(
            self.store
                .get(name)
                .map_err(|e| e.to_string())?
                .ok_or("release vanished")?,
        );
        let soak = r.spec.soak.unwrap_or(self.config.default_soak);
        let health_timeout = r.spec.health_timeout.unwrap_or(self.config.health_timeout);
        let fm = self.field_manager(&r.spec);
        let gate = match &r.spec.sync.approval_selector {
            Some(text) => Some(Selector::parse(text).map_err(|e| e.to_string())?),
            None => None,
        };
        for (bi, batch) in r.plan.batches.iter().enumerate() {
            let index = bi as u32 + 1;
            if r.batches
                .iter()
                .any(|b| b.index == index && b.state == BatchState::Done)
            {
                continue;
            }
            if let Some(sel) = &gate
                && self.gated(sel, batch)
            {
                let _g = self.lock.lock().await;
                let mut cur = self.load(name)?;
                if !cur.approvals.contains_key(GATE_APPROVAL) {
                    cur.state = State::WaitingApproval;
                    let s = format!(
                        "batch {index} ({}) waits for approval: multipilot release approve {name} {GATE_APPROVAL}",
                        batch.join(", ")
                    );
                    self.record(
                        &mut cur,
                        "waiting",
                        true,
                        actor,
                        Some(index),
                        batch.clone(),
                        s,
                        json!({"approval": GATE_APPROVAL, "selector": r.spec.sync.approval_selector}),
                    )
                    .await;
                    return Ok(());
                }
            }
            let started = Utc::now();
            self.batch_state(
                name,
                index,
                BatchState::Applying,
                None,
                Some(started),
                actor,
                None,
            )
            .await?;
            // 1. snapshots, durable before anything changes
            let futs: Vec<_> = batch
                .iter()
                .cloned()
                .map(|c| {
                    let (this, r) = (self.clone(), r.clone());
                    async move { this.snapshot_cluster(&r, &c).await }
                })
                .collect();
            let snaps: Vec<Result<(), String>> = futures::stream::iter(futs)
                .buffer_unordered(self.config.parallelism)
                .collect()
                .await;
            if let Some(e) = snaps.into_iter().find_map(Result::err) {
                self.batch_state(
                    name,
                    index,
                    BatchState::Failed,
                    Some(e.clone()),
                    None,
                    actor,
                    None,
                )
                .await?;
                return Err(format!("batch {index}: {e}"));
            }
            // 2. the clusters count as changed from here on
            {
                let _g = self.lock.lock().await;
                let mut cur = self.load(name)?;
                for c in batch {
                    if !cur.changed.contains(c) {
                        cur.changed.push(c.clone());
                    }
                }
                self.store.put(&cur).await.map_err(|e| e.to_string())?;
                // the drift judge must know these clusters are changing before their new states arrive
                self.releases_changed().await;
            }
            // 3. apply
            let futs: Vec<_> = batch
                .iter()
                .cloned()
                .map(|c| {
                    let (this, r, fm, actor) =
                        (self.clone(), r.clone(), fm.clone(), actor.to_string());
                    async move { this.apply_cluster(&r, index, &c, &fm, &actor).await }
                })
                .collect();
            let applied: Vec<Result<(), String>> = futures::stream::iter(futs)
                .buffer_unordered(self.config.parallelism)
                .collect()
                .await;
            let errs: Vec<String> = applied.into_iter().filter_map(Result::err).collect();
            if !errs.is_empty() {
                let e = errs.join("; ");
                self.batch_state(
                    name,
                    index,
                    BatchState::Failed,
                    Some(e.clone()),
                    None,
                    actor,
                    None,
                )
                .await?;
                return Err(format!("batch {index}: {e}"));
            }
            // 4. health gate
            self.batch_state(
                name,
                index,
                BatchState::WaitingHealth,
                None,
                None,
                actor,
                None,
            )
            .await?;
            if let Err(e) = self
                .clone()
                .wait_healthy(r.clone(), batch, health_timeout)
                .await
            {
                self.batch_state(
                    name,
                    index,
                    BatchState::Failed,
                    Some(e.clone()),
                    None,
                    actor,
                    None,
                )
                .await?;
                return Err(format!("batch {index}: health gate: {e}"));
            }
            // 5. soak
            self.batch_state(name, index, BatchState::Soaking, None, None, actor, None)
                .await?;
            tokio::select! {
                _ = self.cancel.cancelled() => return Err("the release role is stopping".into()),
                _ = tokio::time::sleep(soak) => {}
            }
            match self.new_incidents(name, batch, started).await {
                Ok(found) if found.is_empty() => {}
                Ok(found) => {
                    let e = format!("new incidents during the soak: {}", found.join("; "));
                    self.batch_state(
                        name,
                        index,
                        BatchState::Failed,
                        Some(e.clone()),
                        None,
                        actor,
                        None,
                    )
                    .await?;
                    return Err(format!("batch {index}: {e}"));
                }
                Err(e) => {
                    let e = format!("cannot tell whether incidents opened: {e}");
                    self.batch_state(
                        name,
                        index,
                        BatchState::Failed,
                        Some(e.clone()),
                        None,
                        actor,
                        None,
                    )
                    .await?;
                    return Err(format!("batch {index}: {e}"));
                }
            }
            self.batch_state(
                name,
                index,
                BatchState::Done,
                None,
                None,
                actor,
                Some(format!(
                    "batch {index} healthy and soaked {}s with no new incident",
                    soak.as_secs()
                )),
            )
            .await?;
            self.mark_deployed(name, batch, &fm).await?;
        }
        let _g = self.lock.lock().await;
        let mut cur = self.load(name)?;
        cur.state = State::Succeeded;
        let clusters = cur.changed.clone();
        let n = cur.plan.batches.len();
        self.record(
            &mut cur,
            "done",
            true,
            actor,
            None,
            clusters,
            format!("release applied: {n} batches healthy"),
            json!({}),
        )
        .await;
        Ok(())
    }

    /// Whether a batch holds a cluster the gate selector matches.
    fn gated(&self, sel: &Selector, batch: &[String]) -> bool {
        let reg = self.registry.snapshot();
        // a cluster the registry no longer knows is held too: the gate never opens by forgetting
        batch.iter().any(|c| {
            reg.get(c)
                .is_none_or(|f| sel.matches(&crate::plan::selector_labels(c, f)))
        })
    }

    /// Records that `batch`'s clusters run the release's current revision, with the objects applied there.
    async fn mark_deployed(&self, name: &str, batch: &[String], fm: &str) -> Result<(), String> {
        let _g = self.lock.lock().await;
        let mut cur = self.load(name)?;
        for c in batch {
            let Some(plan) = Self::cluster_plan(&cur, c) else {
                continue;
            };
            // as applied, with the namespace the agent resolved (what FLEET_STATE names it by)
            let objects = plan
                .objects
                .iter()
                .filter(|o| o.applied())
                .map(|o| {
                    let mut v = o.rendered.clone();
                    if let (Some(ns), Some(meta)) = (
                        &o.object.namespace,
                        v.get_mut("metadata").and_then(Value::as_object_mut),
                    ) {
                        meta.entry("namespace").or_insert_with(|| json!(ns));
                    }
                    v
                })
                .collect();
            let d = Deployed {
                revision: cur.revision,
                commit: cur.source.commit_label(),
                at: Utc::now(),
                field_manager: fm.to_string(),
                objects,
            };
            cur.deployed.insert(c.clone(), d);
        }
        self.store.put(&cur).await.map_err(|e| e.to_string())?;
        self.releases_changed().await;
        Ok(())
    }

    fn load(&self, name: &str) -> Result<Release, String> {
        self.store
            .get(name)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("release {name} vanished"))
    }

    #[allow(clippy::too_many_arguments)]
    async fn batch_state(
        &self,
        name: &str,
        index: u32,
        state: BatchState,
        error: Option<String>,
        started: Option<DateTime<Utc>>,
        actor: &str,
        done_summary: Option<String>,
    ) -> Result<(), String> {
        let _g = self.lock.lock().await;
        let mut r = self.load(name)?;
        let Some(b) = r.batches.iter_mut().find(|b| b.index == index) else {
            return Err(format!("batch {index} missing"));
        };
        b.state = state;
        if let Some(s) = started {
            b.started_at = Some(s);
        }
        if matches!(state, BatchState::Done | BatchState::Failed) {
            b.finished_at = Some(Utc::now());
        }
        b.error = error.clone();
        let clusters = b.clusters.clone();
        match state {
            BatchState::Applying => {
                let s = format!("batch {index} starts: {}", clusters.join(", "));
                // what the correlator tells the fleet's clusters apart by: a policy bundle, a repository
                let detail = json!({"policy": r.source.policy, "repo": r.source.repo});
                self.record(
                    &mut r,
                    "batch",
                    true,
                    actor,
                    Some(index),
                    clusters,
                    s,
                    detail,
                )
                .await;
            }
            BatchState::Done => {
                let s = done_summary.unwrap_or_default();
                self.record(
                    &mut r,
                    "health",
                    true,
                    actor,
                    Some(index),
                    clusters,
                    s,
                    json!({}),
                )
                .await;
            }
            BatchState::Failed => {
                let e = error.unwrap_or_default();
                self.record(
                    &mut r,
                    "batch",
                    false,
                    actor,
                    Some(index),
                    clusters,
                    format!("batch {index} failed: {e}"),
                    json!({"error": e}),
                )
                .await;
            }
            _ => {
                r.updated_at = Utc::now();
                self.store.put(&r).await.map_err(|e| e.to_string())?;
                self.releases_changed().await;
            }
        }
        Ok(())
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

    async fn snapshot_cluster(&self, r: &Release, cluster: &str) -> Result<(), String> {
        if self
            .store
            .snapshot(&r.name, r.revision, cluster)
            .map_err(|e| e.to_string())?
            .is_some()
        {
            return Ok(());
        }
        let plan = Self::cluster_plan(r, cluster).ok_or("cluster not in the plan")?;
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
            .await
            .map_err(|e| e.to_string())?;
        if !res.ok {
            return Err(format!(
                "{cluster}: snapshot failed: {}",
                res.error.unwrap_or_default()
            ));
        }
        self.store
            .put_snapshot(&r.name, r.revision, cluster, &res.objects)
            .await
            .map_err(|e| e.to_string())
    }

    async fn apply_cluster(
        &self,
        r: &Release,
        batch: u32,
        cluster: &str,
        fm: &str,
        actor: &str,
    ) -> Result<(), String> {
        let plan = Self::cluster_plan(r, cluster).ok_or("cluster not in the plan")?;
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
                        let errs: Vec<String> = res
                            .objects
                            .iter()
                            .filter_map(|o| {
                                o.error.as_ref().map(|e| {
                                    format!("{} {}: {e}", o.object.kind, obj_name(&o.object))
                                })
                            })
                            .collect();
                        failure = Some(format!(
                            "{cluster}: {what} failed: {}",
                            if errs.is_empty() {
                                res.error.clone().unwrap_or_default()
                            } else {
                                errs.join("; ")
                            }
                        ));
                    }
                    outcomes.extend(res.objects);
                }
                Err(e) => failure = Some(format!("{cluster}: {e}")),
            }
            if failure.is_some() {
                break;
            }
        }
        let c = counts(&outcomes);
        let _g = self.lock.lock().await;
        let mut cur = self.load(&r.name)?;
        let ok = failure.is_none();
        let summary = match &failure {
            None => format!("applied on {cluster}: {}", count_text(&c)),
            Some(e) => e.clone(),
        };
        let detail = json!({"outcomes": c, "objects": outcomes.iter().map(|o| json!({
            "object": o.object, "outcome": o.outcome, "error": o.error})).collect::<Vec<_>>()});
        self.record(
            &mut cur,
            "step",
            ok,
            actor,
            Some(batch),
            vec![cluster.into()],
            summary,
            detail,
        )
        .await;
        failure.map_or(Ok(()), Err)
    }

    async fn wait_healthy(
        self: Arc<Self>,
        r: Arc<Release>,
        batch: &[String],
        timeout: Duration,
    ) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pending: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for c in batch {
            if let Some(p) = Self::cluster_plan(&r, c) {
                let w: Vec<Value> = p
                    .objects
                    .iter()
                    .filter(|o| o.applied() && is_workload(&o.object.kind))
                    .map(|o| o.rendered.clone())
                    .collect();
                if !w.is_empty() {
                    pending.insert(c.clone(), w);
                }
            }
        }
        let mut last: BTreeMap<String, String> = BTreeMap::new();
        loop {
            let futs: Vec<_> = pending
                .clone()
                .into_iter()
                .map(|(c, objs)| {
                    let (this, r) = (self.clone(), r.clone());
                    async move {
                        let tag: u32 = rand::random();
                        let res = this
                            .sender
                            .send(&Command {
                                id: format!("{}-r{}-{c}-health{tag:08x}", r.name, r.revision),
                                release: r.name.clone(),
                                cluster: c.clone(),
                                action: ReleaseAction::Snapshot,
                                field_manager: this.field_manager(&r.spec),
                                force: false,
                                objects: objs,
                            })
                            .await;
                        let verdict = match res {
                            Err(e) => Err(e.to_string()),
                            Ok(res) => {
                                let waiting: Vec<String> = res
                                    .objects
                                    .iter()
                                    .filter_map(|o| match &o.live {
                                        None => Some(format!(
                                            "{} {}: absent",
                                            o.object.kind,
                                            obj_name(&o.object)
                                        )),
                                        Some(live) => rollout_complete(live).err().map(|e| {
                                            format!(
                                                "{} {}: {e}",
                                                o.object.kind,
                                                obj_name(&o.object)
                                            )
                                        }),
                                    })
                                    .collect();
                                if waiting.is_empty() {
                                    Ok(())
                                } else {
                                    Err(waiting.join(", "))
                                }
                            }
                        };
                        (c, verdict)
                    }
                })
                .collect();
            let checks: Vec<(String, Result<(), String>)> = futures::stream::iter(futs)
                .buffer_unordered(self.config.parallelism)
                .collect()
                .await;
            for (c, v) in checks {
                match v {
                    Ok(()) => {
                        pending.remove(&c);
                        last.remove(&c);
                    }
                    Err(e) => {
                        last.insert(c, e);
                    }
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "rollout not complete after {}s: {}",
                    timeout.as_secs(),
                    last.iter()
                        .map(|(c, e)| format!("{c}: {e}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                ));
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return Err("the release role is stopping".into()),
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Incidents opened on `clusters` since `since` and not resolved, and open fleet incidents changed
    /// since then whose first suspect is the release `release` (it reached their failing clusters and
    /// few healthy ones: the correlator names it, wherever its batches went), read from FLEET_INCIDENTS.
    pub async fn new_incidents(
        &self,
        release: &str,
        clusters: &[String],
        since: DateTime<Utc>,
    ) -> Result<Vec<String>, String> {
        let stream = self
            .js
            .get_stream("FLEET_INCIDENTS")
            .await
            .map_err(|e| e.to_string())?;
        let mut filters: Vec<String> = clusters
            .iter()
            .map(|c| format!("fleet.incident.{}.>", subject::escape(c)))
            .collect();
        filters.push("fleet.fleet-incident.>".into());
        let mut c = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subjects: filters,
                deliver_policy: consumer::DeliverPolicy::ByStartTime { start_time: since },
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        let total = c.info().await.map_err(|e| e.to_string())?.num_pending;
        let mut latest: BTreeMap<String, Incident> = BTreeMap::new();
        let mut fleet: BTreeMap<String, FleetIncident> = BTreeMap::new();
        if total > 0 {
            let mut msgs = c.messages().await.map_err(|e| e.to_string())?;
            let mut seen = 0;
            while seen < total {
                let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(5), msgs.next()).await
                else {
                    break;
                };
                let m = m.map_err(|e| e.to_string())?;
                seen += 1;
                if m.subject.starts_with("fleet.fleet-incident.") {
                    if let Ok(env) = rmp_serde::from_slice::<Envelope<FleetIncident>>(&m.payload) {
                        let f = env.payload;
                        if fleet
                            .get(&f.id)
                            .is_none_or(|old| old.revision <= f.revision)
                        {
                            fleet.insert(f.id.clone(), f);
                        }
                    }
                    continue;
                }
                if let Ok(env) = rmp_serde::from_slice::<Envelope<Incident>>(&m.payload) {
                    let inc = env.payload;
                    if latest
                        .get(&inc.id)
                        .is_none_or(|old| old.revision <= inc.revision)
                    {
                        latest.insert(inc.id.clone(), inc);
                    }
                }
            }
        }
        let mut found: Vec<String> = latest
            .values()
            .filter(|i| i.opened_at >= since && i.status != IncidentStatus::Resolved)
            .map(|i| {
                format!(
                    "{} on {} ({:?}): {}",
                    i.kind, i.cluster, i.severity, i.summary
                )
            })
            .collect();
        found.extend(
            fleet
                .values()
                .filter(|f| f.status != IncidentStatus::Resolved && names_first(f, release))
                .map(|f| {
                    format!(
                        "fleet incident {} names this release first: {}",
                        f.id, f.summary
                    )
                }),
        );
        Ok(found)
    }

    /// Rolls back every changed cluster of a release to its snapshot.
    pub async fn run_rollback(self: Arc<Self>, name: String, actor: String) {
        let r = {
            let _g = self.lock.lock().await;
            let Ok(mut r) = self.load(&name) else { return };
            r.rollbacks += 1;
            r.state = State::RollingBack;
            let clusters = r.changed.clone();
            let s = format!("rollback {} starts: {}", r.rollbacks, clusters.join(", "));
            self.record(
                &mut r,
                "rollback",
                true,
                &actor,
                None,
                clusters,
                s,
                json!({}),
            )
            .await;
            r
        };
        let fm = self.field_manager(&r.spec);
        let r = Arc::new(r);
        let futs: Vec<_> = r
            .changed
            .iter()
            .rev()
            .cloned()
            .map(|c| {
                let (this, r, fm, actor) = (self.clone(), r.clone(), fm.clone(), actor.clone());
                async move { this.rollback_cluster(&r, &c, &fm, &actor).await }
            })
            .collect();
        let results: Vec<Result<(), String>> = futures::stream::iter(futs)
            .buffer_unordered(self.config.parallelism)
            .collect()
            .await;
        let errs: Vec<String> = results.into_iter().filter_map(Result::err).collect();
        let _g = self.lock.lock().await;
        let Ok(mut cur) = self.load(&name) else {
            return;
        };
        let clusters = cur.changed.clone();
        if errs.is_empty() {
            cur.state = State::RolledBack;
            let s = format!(
                "rolled back: {} clusters restored to their snapshots",
                clusters.len()
            );
            self.record(
                &mut cur,
                "rolled-back",
                true,
                &actor,
                None,
                clusters,
                s,
                json!({}),
            )
            .await;
        } else {
            cur.state = State::RollbackFailed;
            let e = errs.join("; ");
            cur.error = Some(format!("rollback failed: {e}"));
            self.record(
                &mut cur,
                "rolled-back",
                false,
                &actor,
                None,
                clusters,
                format!("rollback failed: {e}"),
                json!({"errors": errs}),
            )
            .await;
        }
    }

    async fn rollback_cluster(
        &self,
        r: &Release,
        cluster: &str,
        fm: &str,
        actor: &str,
    ) -> Result<(), String> {
        let snap = self
            .store
            .snapshot(&r.name, r.revision, cluster)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{cluster}: no snapshot stored"))?;
        let mut restore = Vec::new();
        let mut remove = Vec::new();
        for o in &snap {
            match &o.live {
                Some(live) => restore.push(restorable(live)),
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
                // the snapshot wins over whatever the release set
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
        let c = counts(&outcomes);
        let _g = self.lock.lock().await;
        let mut cur = self.load(&r.name)?;
        if failure.is_none() {
            // the cluster runs again what it ran before this revision
            match cur.deployed_before.get(cluster).cloned() {
                Some(d) => cur.deployed.insert(cluster.to_string(), d),
                None => cur.deployed.remove(cluster),
            };
        }
        let summary = match &failure {
            None => format!("{cluster} restored: {}", count_text(&c)),
            Some(e) => format!("rollback of {cluster} failed: {e}"),
        };
        self.record(
            &mut cur,
            "rollback-step",
            failure.is_none(),
            actor,
            None,
            vec![cluster.into()],
            summary,
            json!({"outcomes": c}),
        )
        .await;
        failure.map_or(Ok(()), Err)
    }

    /// Batch progress for a fresh apply.
    pub fn fresh_batches(r: &Release) -> Vec<BatchProgress> {
        r.plan
            .batches
            .iter()
            .enumerate()
            .map(|(i, b)| BatchProgress {
                index: i as u32 + 1,
                clusters: b.clone(),
                state: BatchState::Pending,
                started_at: None,
                finished_at: None,
                error: None,
            })
            .collect()
    }
}

/// Whether the fleet incident's first suspect is the release `release`.
fn names_first(f: &FleetIncident, release: &str) -> bool {
    f.suspects
        .iter()
        .find(|s| s.verdict == SuspectVerdict::Suspect)
        .and_then(|s| s.release.as_ref())
        .is_some_and(|r| r.name == release)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollout_rules() {
        let d = |generation, obs, upd, avail, reps| {
            json!({"kind": "Deployment", "metadata": {"generation": generation}, "spec": {"replicas": 2},
                "status": {"observedGeneration": obs, "updatedReplicas": upd, "availableReplicas": avail, "replicas": reps}})
        };
        assert!(rollout_complete(&d(2, 2, 2, 2, 2)).is_ok());
        assert!(rollout_complete(&d(3, 2, 2, 2, 2)).is_err());
        assert!(rollout_complete(&d(2, 2, 1, 2, 2)).is_err());
        assert!(rollout_complete(&d(2, 2, 2, 1, 2)).is_err());
        assert!(rollout_complete(&d(2, 2, 2, 2, 3)).is_err());
        assert!(rollout_complete(&json!({"kind": "ConfigMap"})).is_ok());
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
    #[test]
    fn a_fleet_incident_stops_the_soak_of_the_release_it_names_first() {
        let suspect = |name: &str, verdict| multipilot_schemas::payload::Suspect {
            verdict,
            object: multipilot_schemas::payload::ObjectRef {
                api_version: String::new(),
                kind: "Release".into(),
                namespace: None,
                name: name.into(),
                uid: None,
            },
            failing: 2,
            failing_total: 2,
            healthy: 0,
            healthy_total: 4,
            last_changed: Utc::now(),
            summary: String::new(),
            release: Some(multipilot_schemas::payload::ReleaseRef {
                name: name.into(),
                revision: 3,
                batch: Some(1),
                commit: None,
            }),
        };
        let entry = multipilot_schemas::catalog::entries()
            .into_iter()
            .find(|e| e.name == "FleetIncident")
            .expect("the catalog has a fleet incident");
        let mut f = rmp_serde::from_slice::<Envelope<FleetIncident>>(&entry.sample)
            .expect("the sample decodes")
            .payload;
        f.suspects = vec![
            suspect("agents", SuspectVerdict::Common),
            suspect("web", SuspectVerdict::Suspect),
        ];
        assert!(names_first(&f, "web"));
        // a release seen as often on healthy clusters is not named
        assert!(!names_first(&f, "agents"));
        f.suspects.retain(|s| s.verdict == SuspectVerdict::Common);
        assert!(!names_first(&f, "web"));
    }
}
