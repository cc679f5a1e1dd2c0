//! The release role: render, check, dry-run everywhere, apply in batches behind health gates, roll back from
//! snapshots.
//!
//! Reads: `fleet.facts.>` (FLEET_FACTS, ephemeral ordered consumer: the fleet registry — served
//! api-versions, version and labels per cluster), `fleet.incident.<cluster>.>` and `fleet.fleet-incident.>`
//! (FLEET_INCIDENTS, during a batch's soak), `fleet.fleet-incident.>` again from the start (an ordered
//! consumer: the fleet incidents that name a release first suspect go into its history, `attribution`).
//! Answers (request/reply, JSON): `fleet.releasectl.plan|apply|approve|rollback|status|history`.
//! Sends (request/reply, signed `ReleaseCommand` → `ReleaseResult`): `fleet.cmd.<cluster>.release`.
//! Writes: `fleet.release.<release>.<what>` (FLEET_RELEASE, `ReleaseEvent`: the release's history) and
//! `fleet.audit.release.release-<what>` (FLEET_AUDIT, `AuditRecord`) for every plan, approval, batch,
//! step, health gate, end and rollback.
//!
//! State (sled in `data_dir`): releases with their plan, approvals, batch progress and the clusters they
//! changed; each cluster's snapshot (the live objects before the release); the history. All of it is
//! written through to the JetStream KV bucket `MULTIPILOT_RELEASES` and restored from it when `data_dir`
//! is new or wiped. A role that
//! restarts while applying or rolling back marks the release `interrupted` with the clusters it had
//! changed, so an operator can roll it back (`multipilot release rollback`) — it never guesses.

pub mod analysis;
pub mod attribution;
pub mod config;
pub mod ctl;
pub mod diff;
pub mod drift;
pub mod exec;
pub mod gitops;
pub mod health;
pub mod judge;
pub mod machine;
pub mod measure;
pub mod model;
pub mod orchestrate;
pub mod order;
pub mod plan;
pub mod registry;
pub mod render;
pub mod signer;
pub mod spec;
pub mod store;
pub mod windows;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use multipilot_runtime::Context;
use multipilot_schemas::payload::{AuditOutcome, AuditRecord, ReleaseEntry, ReleaseEvent};
use multipilot_schemas::{Envelope, Payload, stable_id, subject};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use config::Config;

use crate::machine::Entry;
use crate::model::{
    ApplyRequest, Approval, ApproveRequest, NameRequest, PlanRequest, Release, Reply, Source, State,
};
use crate::registry::Registry;
use crate::spec::Spec;
use crate::store::Store;

/// Why the release role could not start or stopped, or a request to it failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is not usable.
    #[error("release settings: {0}")]
    Config(String),
    /// The signing key.
    #[error(transparent)]
    Signer(#[from] signer::Error),
    /// Its local store (sled) failed.
    #[error(transparent)]
    Store(multipilot_runtime::error::Cause),
    /// NATS (the KV bucket, the operator subjects) failed or refused.
    #[error(transparent)]
    Bus(multipilot_runtime::error::Cause),
    /// No release role answers the operator subjects.
    #[error("no release role answers on {subject} (is `multipilot release` or `all` running?)")]
    NoResponders {
        /// The subject asked.
        subject: String,
    },
    /// The release role answered something that is not a reply.
    #[error("the release role's reply: {0}")]
    Reply(#[from] serde_json::Error),
}

impl Error {
    /// Whether trying again later may succeed (NATS, the role or the disk were away) rather than needing a
    /// changed setting or key.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Error::Config(_) | Error::Signer(_) | Error::Reply(_))
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

pub use multipilot_schemas::control::{
    RELEASE_CTL_PREFIX as CTL_PREFIX, release_ctl as ctl_subject,
};

/// Asks the release role (request/reply) and decodes its reply.
pub async fn call<B: serde::Serialize>(
    client: &async_nats::Client,
    verb: &str,
    body: &B,
    timeout: Duration,
) -> Result<Reply> {
    let req = async_nats::Request::new()
        .payload(serde_json::to_vec(body)?.into())
        .timeout(Some(timeout));
    let msg = client
        .send_request(ctl_subject(verb), req)
        .await
        .map_err(|e| match e.kind() {
            async_nats::RequestErrorKind::NoResponders => Error::NoResponders {
                subject: ctl_subject(verb),
            },
            _ => bus_err(format!("asking the release role ({verb})"))(e),
        })?;
    Ok(serde_json::from_slice(&msg.payload)?)
}

/// The running role.
pub struct Service {
    config: Config,
    store: Store,
    registry: Registry,
    sender: exec::Sender,
    js: async_nats::jetstream::Context,
    instance: String,
    lock: tokio::sync::Mutex<()>,
    cancel: CancellationToken,
    drift: tokio::sync::Mutex<drift::Drift>,
    drift_wake: tokio::sync::Notify,
    gitops: gitops::Follower,
    /// TSDB queries of release analyses.
    tsdb: reqwest::Client,
    /// Health rules (shipped and configured), for the health gate.
    health: Arc<health::Rules>,
    /// Sync windows (`release.windows`).
    windows: Arc<windows::Windows>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("instance", &self.instance)
            .finish()
    }
}

fn actor_or_system(a: &str) -> String {
    if a.trim().is_empty() {
        "system".into()
    } else {
        a.trim().to_string()
    }
}

impl Service {
    /// Records a history entry in the release's current state (see [`Service::record_entry`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn record(
        &self,
        r: &mut Release,
        what: ReleaseEntry,
        ok: bool,
        actor: &str,
        batch: Option<u32>,
        clusters: Vec<String>,
        summary: String,
        detail: Value,
    ) {
        let e = machine::entry(r, what, ok, actor, batch, clusters, summary, detail);
        self.record_entry(r, e).await
    }

    /// Records a history entry: stored with the release (durably), then published on FLEET_RELEASE and as an
    /// audit record on FLEET_AUDIT. A failed publish is logged; the stored history stays the reference.
    pub(crate) async fn record_entry(&self, r: &mut Release, e: Entry) {
        r.events += 1;
        r.updated_at = Utc::now();
        let what = e.what.as_str();
        let ev = ReleaseEvent {
            release: r.name.clone(),
            revision: r.revision,
            what: e.what,
            state: e.state,
            actor: actor_or_system(&e.actor),
            batch: e.batch,
            clusters: e.clusters,
            ok: e.ok,
            summary: e.summary,
            detail: e.detail,
            commit: r.source.commit_label(),
            at: r.updated_at,
        };
        if let Err(e) = self.store.add_event(r.events, &ev) {
            tracing::error!(release = %r.name, error = %e, "history entry not stored");
        }
        if let Err(e) = self.store.put(r).await {
            tracing::error!(release = %r.name, error = %e, "release not stored");
        }
        // the drift judge works from the releases as stored (state, what each cluster runs)
        self.releases_changed().await;
        let seq = r.events.to_string();
        let rev = r.revision.to_string();
        let cluster = if ev.clusters.len() == 1 {
            ev.clusters[0].clone()
        } else {
            String::new()
        };
        let env = |schema: &str, version: u32| Envelope {
            schema: schema.into(),
            version,
            cluster: cluster.clone(),
            source: self.instance.clone(),
            cluster_time: ev.at,
            agent_time: Utc::now(),
            seq: r.events,
            payload: (),
        };
        let e1 = env(ReleaseEvent::SCHEMA, ReleaseEvent::VERSION).map(|_| ev.clone());
        if let Err(e) = multipilot_bus::publish::publish_one(
            &self.js,
            subject::release(&r.name, what),
            stable_id(&["release-event", &r.name, &rev, &seq]),
            &e1,
        )
        .await
        {
            tracing::warn!(release = %r.name, error = %e, "release event not published");
        }
        let audit = AuditRecord {
            id: stable_id(&["release-audit", &r.name, &rev, &seq]),
            actor: ev.actor.clone(),
            role: "release".into(),
            action: format!("release.{what}"),
            target: format!("{}@{}", r.name, r.revision),
            outcome: if ev.ok {
                AuditOutcome::Ok
            } else {
                AuditOutcome::Failed
            },
            detail: json!({"summary": ev.summary, "batch": ev.batch, "clusters": ev.clusters,
                "state": ev.state, "detail": ev.detail}),
            commit: ev.commit.clone(),
        };
        let e2 = env(AuditRecord::SCHEMA, AuditRecord::VERSION).map(|_| audit.clone());
        if let Err(e) = multipilot_bus::publish::publish_one(
            &self.js,
            subject::audit("release", &format!("release-{what}")),
            audit.id.clone(),
            &e2,
        )
        .await
        {
            tracing::warn!(release = %r.name, error = %e, "audit record not published");
        }
    }

    async fn plan_new(
        &self,
        spec_text: &str,
        source: Source,
        actor: &str,
    ) -> Result<Release, ctl::Error> {
        let spec = Spec::parse(spec_text)?;
        let prev = {
            let _g = self.lock.lock().await;
            if !spec.depends_on.is_empty() {
                let deps = self
                    .store
                    .all()?
                    .into_iter()
                    .map(|r| (r.name, r.spec.depends_on))
                    .collect();
                if let Some(c) = order::cycle(&spec.name, &spec.depends_on, &deps) {
                    return Err(ctl::Error::Cycle(c));
                }
            }
            let prev = self.store.get(&spec.name)?;
            if let Some(p) = &prev
                && p.state.busy()
            {
                return Err(ctl::Error::Busy {
                    name: p.name.clone(),
                    state: p.state,
                    revision: p.revision,
                });
            }
            prev
        };
        let revision = match &prev {
            // a plan that was never applied is re-planned in place
            Some(p) if matches!(p.state, State::Planned | State::Blocked) => p.revision,
            Some(p) => p.revision + 1,
            None => 1,
        };
        let plan = self.make_plan(&spec, revision).await?;
        let now = Utc::now();
        let _g = self.lock.lock().await;
        if let Some(p) = self.store.get(&spec.name)?
            && p.state.busy()
        {
            return Err(ctl::Error::StartedMeanwhile(p.name));
        }
        // approvals given to a plan re-made in place for the same spec still hold
        let kept_approvals = prev
            .as_ref()
            .filter(|p| p.revision == revision && p.spec == spec)
            .map(|p| p.approvals.clone())
            .unwrap_or_default();
        let mut r = Release {
            name: spec.name.clone(),
            revision,
            state: if plan.clean() {
                State::Planned
            } else {
                State::Blocked
            },
            spec,
            source,
            actor: actor_or_system(actor),
            created_at: now,
            updated_at: now,
            plan,
            approvals: kept_approvals,
            batches: Vec::new(),
            changed: Vec::new(),
            rollbacks: 0,
            error: None,
            waiting_for: None,
            override_windows: false,
            events: prev.as_ref().map(|p| p.events).unwrap_or(0),
            deployed: prev.map(|p| p.deployed).unwrap_or_default(),
            deployed_before: Default::default(),
        };
        r.batches = machine::fresh_batches(&r);
        let p = &r.plan;
        let n_objs: usize = p.clusters.iter().map(|c| c.objects.len()).sum();
        let risks: Vec<Value> = p
            .clusters
            .iter()
            .flat_map(|c| {
                c.objects.iter().flat_map(move |o| {
                    o.risks.iter().map(move |k| {
                        json!({"cluster": c.cluster, "object": o.object, "level": k.level, "code": k.code,
                            "approval": k.approval})
                    })
                })
            })
            .collect();
        let summary = format!(
            "planned {} objects on {} clusters in {} batches: {} blocked, {} errors, {} risks{}",
            n_objs,
            p.clusters.len(),
            p.batches.len(),
            p.blocked,
            p.errors,
            risks.len(),
            if p.required_approvals.is_empty() {
                String::new()
            } else {
                format!(
                    ", needs approval: {}",
                    p.required_approvals
                        .iter()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
        let detail = json!({"batches": p.batches, "blocked": p.blocked, "errors": p.errors,
            "problems": p.problems(), "risks": risks, "dry_run_ms": p.dry_run_ms,
            "required_approvals": p.required_approvals, "spec_path": r.source.path});
        let clusters: Vec<String> = p.clusters.iter().map(|c| c.cluster.clone()).collect();
        let ok = p.clean();
        // `record` also hands the new plan to the drift judge
        self.record(
            &mut r,
            ReleaseEntry::Plan,
            ok,
            actor,
            None,
            clusters,
            summary,
            detail,
        )
        .await;
        Ok(r)
    }

    async fn approve(
        &self,
        name: &str,
        approvals: &[String],
        actor: &str,
    ) -> Result<Release, ctl::Error> {
        let _g = self.lock.lock().await;
        let mut r = self.stored(name)?;
        let fresh: Vec<String> = approvals
            .iter()
            .filter(|a| !a.trim().is_empty() && !r.approvals.contains_key(*a))
            .cloned()
            .collect();
        if fresh.is_empty() {
            return Ok(r);
        }
        for a in &fresh {
            r.approvals.insert(
                a.clone(),
                Approval {
                    actor: actor_or_system(actor),
                    at: Utc::now(),
                },
            );
        }
        let s = format!("approved: {}", fresh.join(", "));
        self.record(
            &mut r,
            ReleaseEntry::Approve,
            true,
            actor,
            None,
            vec![],
            s,
            json!({"approvals": fresh}),
        )
        .await;
        Ok(r)
    }

    /// Approves, and resumes a release waiting for an approval (the `gate`, an analysis hold) once given.
    async fn approve_and_resume(
        self: &Arc<Self>,
        name: &str,
        approvals: &[String],
        actor: &str,
    ) -> Result<Release, ctl::Error> {
        let mut r = self.approve(name, approvals, actor).await?;
        if machine::can_resume(&r) {
            let _g = self.lock.lock().await;
            r = self.stored(name)?;
            if let Some(e) = machine::resume(&mut r, actor) {
                self.record_entry(&mut r, e).await;
                tokio::spawn(
                    self.clone()
                        .run_apply(name.to_string(), actor_or_system(actor)),
                );
            }
        }
        Ok(r)
    }

    /// The release stored as `name`.
    fn stored(&self, name: &str) -> Result<Release, ctl::Error> {
        self.store
            .get(name)?
            .ok_or_else(|| ctl::Error::NoRelease(name.to_string()))
    }

    async fn apply(self: &Arc<Self>, req: ApplyRequest) -> Result<Release, ctl::Error> {
        let name = match (&req.spec, &req.release) {
            (Some(text), _) => {
                self.plan_new(text, req.source.clone(), &req.actor)
                    .await?
                    .name
            }
            (None, Some(name)) => {
                // re-plan the stored spec: the dry-run must pass again just before anything changes
                let r = self.stored(name)?;
                if !matches!(r.state, State::Planned | State::Blocked) {
                    return Err(ctl::Error::NotPlanned {
                        name: name.clone(),
                        state: r.state,
                        revision: r.revision,
                    });
                }
                let text = serde_yaml::to_string(&r.spec)?;
                let approvals: Vec<String> = r.approvals.keys().cloned().collect();
                let planned = self.plan_new(&text, r.source.clone(), &req.actor).await?;
                if !approvals.is_empty() {
                    self.approve(&planned.name, &approvals, &req.actor).await?;
                }
                planned.name
            }
            (None, None) => return Err(ctl::Error::NothingToApply),
        };
        if !req.approve.is_empty() {
            self.approve(&name, &req.approve, &req.actor).await?;
        }
        self.start(&name, &req.actor, req.override_windows).await
    }

    /// Starts applying a planned release: refused (and recorded) when its plan is not clean or an approval
    /// is missing.
    async fn start(
        self: &Arc<Self>,
        name: &str,
        actor: &str,
        override_windows: bool,
    ) -> Result<Release, ctl::Error> {
        let _g = self.lock.lock().await;
        let mut r = self.stored(name)?;
        r.override_windows = override_windows;
        match machine::start(&mut r, actor) {
            Ok(e) => {
                self.record_entry(&mut r, e).await;
                tokio::spawn(
                    self.clone()
                        .run_apply(name.to_string(), actor_or_system(actor)),
                );
                Ok(r)
            }
            Err(refused) => {
                if let Some(e) = refused.entry {
                    self.record_entry(&mut r, *e).await;
                }
                Err(refused.error.into())
            }
        }
    }

    async fn rollback(self: &Arc<Self>, name: &str, actor: &str) -> Result<Release, ctl::Error> {
        let r = {
            let _g = self.lock.lock().await;
            let mut r = self.stored(name)?;
            machine::request_rollback(&mut r)?;
            self.store.put(&r).await?;
            r
        };
        let this = self.clone();
        tokio::spawn(this.run_rollback(name.to_string(), actor_or_system(actor)));
        Ok(r)
    }

    async fn handle(self: &Arc<Self>, verb: &str, body: &[u8]) -> Reply {
        fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Reply> {
            serde_json::from_slice(body).map_err(|e| Reply::error(format!("bad request: {e}")))
        }
        macro_rules! req {
            ($t:ty) => {
                match parse::<$t>(body) {
                    Ok(v) => v,
                    Err(r) => return r,
                }
            };
        }
        let done = |r: Result<Release, ctl::Error>| match r {
            Ok(r) => Reply::with(r),
            Err(e) => Reply::error(e.to_string()),
        };
        match verb {
            "plan" => {
                let q = req!(PlanRequest);
                done(self.plan_new(&q.spec, q.source, &q.actor).await)
            }
            "apply" => done(self.apply(req!(ApplyRequest)).await),
            "approve" => {
                let q = req!(ApproveRequest);
                done(
                    self.approve_and_resume(&q.release, &q.approvals, &q.actor)
                        .await,
                )
            }
            "rollback" => {
                let q = req!(NameRequest);
                let Some(name) = q.release else {
                    return Reply::error("rollback needs a release name");
                };
                done(self.rollback(&name, &q.actor).await)
            }
            "status" => {
                let q = req!(NameRequest);
                match q.release {
                    Some(name) => match self.store.get(&name) {
                        Ok(Some(r)) => Reply::with(r),
                        Ok(None) => Reply::error(format!("no release named {name}")),
                        Err(e) => Reply::error(e.to_string()),
                    },
                    None => match self.store.all() {
                        Ok(all) => Reply {
                            ok: true,
                            releases: all.iter().map(Release::summary).collect(),
                            ..Default::default()
                        },
                        Err(e) => Reply::error(e.to_string()),
                    },
                }
            }
            "history" => {
                let q = req!(NameRequest);
                let Some(name) = q.release else {
                    return Reply::error("history needs a release name");
                };
                match (self.store.get(&name), self.store.history(&name)) {
                    (Ok(None), _) => Reply::error(format!("no release named {name}")),
                    (Ok(Some(r)), Ok(h)) => Reply {
                        ok: true,
                        release: Some(Box::new(r)),
                        history: h,
                        ..Default::default()
                    },
                    (Err(e), _) | (_, Err(e)) => Reply::error(e.to_string()),
                }
            }
            "gitops" | "sync" => {
                if verb == "sync" {
                    // the followers fetch now; the reply is the status before they are done
                    self.wake_followers();
                }
                match self.report().await {
                    Ok(report) => Reply {
                        ok: true,
                        gitops: Some(Box::new(report)),
                        ..Default::default()
                    },
                    Err(e) => Reply::error(e.to_string()),
                }
            }
            other => Reply::error(format!(
                "unknown verb {other:?}: plan, apply, approve, rollback, status, history, gitops, sync"
            )),
        }
    }

    /// Marks releases the previous process left half-way as `interrupted`.
    async fn recover(&self) -> Result<()> {
        for mut r in self
            .store
            .all()
            .map_err(store_err::<store::Error>("reading the releases"))?
        {
            let was = r.state.as_str();
            if let Some(e) = machine::interrupted(&mut r) {
                self.record_entry(&mut r, e).await;
                tracing::warn!(release = %r.name, was, "release interrupted by a restart");
            }
        }
        Ok(())
    }
}

/// Runs the release role until `ctx.cancel` fires.
pub async fn run(config: Config, ctx: Context) -> Result<()> {
    config.validate()?;
    std::fs::create_dir_all(&config.data_dir)
        .map_err(store_err(format!("creating {}", config.data_dir)))?;
    let store =
        Store::open(std::path::Path::new(&config.data_dir)).map_err(store_err::<store::Error>(
            format!("opening the release store in {}", config.data_dir),
        ))?;
    let bucket = multipilot_bus::kv::open(
        &ctx.js,
        &multipilot_bus::kv::Bucket {
            name: store::BUCKET.into(),
            description: "Releases, snapshots and history (written through from the release role's sled store)"
                .into(),
            replicas: config.kv_replicas,
            max_age: Duration::ZERO,
        },
    )
    .await
    .map_err(bus_err(format!(
        "opening the KV bucket {b} (the release user needs the $JS.API.STREAM.*.KV_{b} APIs)",
        b = store::BUCKET
    )))?;
    let store = store.with_replica(bucket);
    let restored = store.sync_with_replica().await.map_err(bus_err(format!(
        "syncing the release store with the KV bucket {}",
        store::BUCKET
    )))?;
    if restored != store::Restored::default() {
        tracing::info!(
            releases = restored.releases,
            snapshots = restored.snapshots,
            history = restored.history,
            skipped = restored.skipped,
            "blank release store restored from the KV bucket"
        );
    }
    let signer = signer::Signer::load_or_create(&config.signing_key_path())?;
    tracing::info!(key_id = signer.key_id(), public = %signer.public_path().display(), "release signing key");
    let registry = Registry::default();
    let tsdb = measure::client(config.tsdb_token.as_ref())?;
    let health = Arc::new(
        health::Rules::load(&config.health_rules)
            .map_err(|e| Error::Config(format!("release.health_rules: {e}")))?,
    );
    let windows = Arc::new(
        windows::Windows::compile(config.windows.clone())
            .map_err(|e| Error::Config(format!("release.windows: {e}")))?,
    );
    let svc = Arc::new(Service {
        tsdb,
        health,
        windows,
        sender: exec::Sender {
            nats: ctx.nats.clone(),
            signer: Arc::new(signer),
            timeout: config.command_timeout,
            attempts: config.command_attempts,
            validity: config.command_validity,
            source: ctx.instance.clone(),
        },
        config,
        store,
        registry: registry.clone(),
        js: ctx.js.clone(),
        instance: ctx.instance.clone(),
        lock: tokio::sync::Mutex::new(()),
        cancel: ctx.cancel.clone(),
        drift: Default::default(),
        drift_wake: Default::default(),
        gitops: gitops::Follower::default(),
    });
    svc.recover().await?;
    ctx.health.register("release");
    let follow = tokio::spawn(registry.follow(ctx.js.clone(), ctx.cancel.clone()));
    let drift = tokio::spawn(svc.clone().follow_drift());
    let attributions = tokio::spawn(svc.clone().follow_attributions());
    let held = tokio::spawn(svc.clone().retry_held());
    let repos: Vec<_> = svc
        .config
        .gitops
        .repos
        .iter()
        .map(|r| tokio::spawn(svc.clone().follow_repo(r.clone())))
        .collect();
    let mut sub = ctx
        .nats
        .subscribe(format!("{CTL_PREFIX}.*"))
        .await
        .map_err(bus_err("subscribing to fleet.releasectl.*"))?;
    ctx.health.set("release", true);
    tracing::info!("release role ready");
    loop {
        let msg = tokio::select! {
            _ = ctx.cancel.cancelled() => break,
            m = sub.next() => match m { Some(m) => m, None => break },
        };
        let Some(reply) = msg.reply.clone() else {
            continue;
        };
        let verb = msg
            .subject
            .as_str()
            .rsplit('.')
            .next()
            .unwrap_or("")
            .to_string();
        let (svc, nats) = (svc.clone(), ctx.nats.clone());
        tokio::spawn(async move {
            let r = svc.handle(&verb, &msg.payload).await;
            let body = serde_json::to_vec(&r).unwrap_or_else(|e| {
                format!("{{\"ok\":false,\"error\":\"encoding the reply: {e}\"}}").into_bytes()
            });
            if let Err(e) = nats.publish(reply, body.into()).await {
                tracing::warn!(error = %e, "release reply not sent");
            }
        });
    }
    follow.abort();
    drift.abort();
    attributions.abort();
    held.abort();
    for r in repos {
        r.abort();
    }
    svc.store
        .flush()
        .await
        .map_err(store_err::<store::Error>("flushing the release store"))?;
    Ok(())
}
