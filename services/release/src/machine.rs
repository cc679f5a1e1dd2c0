//! The release role's core: how an apply or a rollback progresses, batch by batch, as a state machine.
//!
//! Per batch: snapshot its clusters, mark them changed, apply, health gate (every workload's rollout must
//! complete within the health timeout, and every object of a kind a health rule knows must be healthy; a
//! rule saying "failed" fails the gate at once), soak (no new incident on its clusters, and no fleet
//! incident naming the release first suspect, since the batch started; the spec's analysis measured over
//! it, which fails the batch or holds it for the `analysis-<batch>` approval); a batch that holds a cluster
//! of the gate selector waits for the `gate` approval first. The first failing batch stops the release and
//! every changed cluster is rolled back to its snapshot.
//!
//! It does no I/O and reads no clock: [`Machine::on`] takes an [`Input`] with its time and the release as
//! stored, changes the release and returns [`Decision`]s — store it, record a history [`Entry`], snapshot
//! or apply these clusters, read the rollouts or the incidents, wait until a time, roll back these
//! clusters. The shell ([`crate::orchestrate`]) carries them out and feeds what came of them back. What
//! the machine keeps between inputs (the step it waits for) is only for the run in progress: a role that
//! restarts marks a busy release [`interrupted`] and never guesses.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use multipilot_schemas::payload::ReleaseEntry;
use multipilot_schemas::payload::{
    FleetIncident, Incident, IncidentStatus, ObjectOutcome, SuspectVerdict,
};
use serde_json::{Value, json};

use crate::analysis::{self, Conclusion, Tally, Target};
use crate::model::{BatchProgress, BatchState, Deployed, Release, State, obj_name};
use crate::spec::GATE_APPROVAL;

/// Why a release can't be started or rolled back now.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Only a planned (or blocked) release starts; it ran or runs.
    #[error("release {name} is {state} (revision {revision}): plan it again to apply it")]
    NotPlanned {
        /// Release.
        name: String,
        /// Its state.
        state: State,
        /// Its revision.
        revision: u64,
    },
    /// The plan has blocked objects or errors.
    #[error(
        "apply refused: the plan has {blocked} blocked objects and {errors} errors:\n  {}",
        .problems.join("\n  ")
    )]
    NotClean {
        /// Blocked objects.
        blocked: usize,
        /// Errors.
        errors: usize,
        /// Every problem, one line each.
        problems: Vec<String>,
    },
    /// Risks nobody approved.
    #[error(
        "apply refused: needs approval: {} (give --approve {})",
        .missing.join(", "),
        .missing.join(" --approve ")
    )]
    MissingApprovals {
        /// The approvals missing.
        missing: Vec<String>,
    },
    /// Applying or rolling back already.
    #[error("release {name} is {state}: wait for it")]
    Busy {
        /// Release.
        name: String,
        /// Its state.
        state: State,
    },
    /// No cluster to restore.
    #[error("release {name} (revision {revision}) changed no cluster: nothing to roll back")]
    NothingToRollBack {
        /// Release.
        name: String,
        /// Its revision.
        revision: u64,
    },
}

/// A history entry to record (stored with the release, published as a `ReleaseEvent` and an audit record).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// `batch`, `step`, `health`, `failed`, `rollback`, … (the last token of its subject).
    pub what: ReleaseEntry,
    /// Whether it went well.
    pub ok: bool,
    /// Who (empty: `system`).
    pub actor: String,
    /// The release's state when it happened.
    pub state: State,
    /// Batch, from 1.
    pub batch: Option<u32>,
    /// Clusters concerned.
    pub clusters: Vec<String>,
    /// One line.
    pub summary: String,
    /// Details.
    pub detail: Value,
}

/// What the shell is to do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Store the release as it is now (the drift judge reads it from there).
    Persist,
    /// Record a history entry (which stores the release too).
    Record(Entry),
    /// Snapshot the release's objects on these clusters, durably, before anything changes there; answer
    /// with an [`Input::Snapshot`] per cluster.
    Snapshot {
        /// Batch.
        batch: u32,
        /// Clusters.
        clusters: Vec<String>,
    },
    /// Apply the release's objects on these clusters (server-side apply, then deletes); answer with an
    /// [`Input::Step`] per cluster.
    Apply {
        /// Batch.
        batch: u32,
        /// Clusters.
        clusters: Vec<String>,
    },
    /// Read these workloads on their clusters; answer with one [`Input::Health`].
    ReadHealth {
        /// Per cluster, the workloads (as rendered) whose rollout is not known complete.
        workloads: BTreeMap<String, Vec<Value>>,
    },
    /// Read the incidents opened on these clusters since `since`, and the fleet incidents changed since;
    /// answer with [`Input::Incidents`] or [`Input::IncidentsUnknown`].
    ReadIncidents {
        /// Clusters.
        clusters: Vec<String>,
        /// The batch's start.
        since: DateTime<Utc>,
    },
    /// Measure the analysis' metrics on these clusters and on the baseline (the target clusters the
    /// release has not changed); answer with [`Input::Measured`].
    Measure {
        /// Batch.
        batch: u32,
        /// The batch's clusters and the release's workloads there.
        targets: Vec<Target>,
        /// The baseline's clusters.
        baseline: Vec<Target>,
        /// The round's `{{rate_interval}}`: of every cluster of the batch and the baseline, those done
        /// measuring included, so that it stays the same from round to round.
        rate_interval: std::time::Duration,
    },
    /// Send [`Input::Tick`] at this time (or [`Input::Stopping`] when the role stops before).
    WaitUntil(DateTime<Utc>),
    /// Restore these clusters to their snapshots (in this order; in parallel is fine); answer with an
    /// [`Input::Restored`] per cluster.
    RollBack {
        /// Clusters, the last changed first.
        clusters: Vec<String>,
    },
    /// The run is over: succeeded, waiting for an approval, rolled back or not.
    Stop,
}

/// What an apply or rollback step did on one cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// Commands went out: the objects' outcomes, and why the step failed when it did.
    Sent {
        /// Per object.
        outcomes: Vec<ObjectOutcome>,
        /// What failed (an object, or the agent's answer).
        failure: Option<String>,
    },
    /// Nothing could be sent (the cluster is not in the plan, no snapshot is stored).
    NotSent(String),
}

/// One cluster's workloads as read for the health gate.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthRead {
    /// Cluster.
    pub cluster: String,
    /// The workloads (`live` absent: the object is gone).
    pub objects: Vec<ObjectOutcome>,
    /// Why they could not be read.
    pub error: Option<String>,
}

/// One metric's answers for a [`Decision::Measure`].
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    /// Metric.
    pub metric: String,
    /// Per target cluster.
    pub clusters: BTreeMap<String, analysis::Answer>,
    /// The median of the baseline clusters' answers (`None`: no baseline, or none answered).
    pub baseline: Option<f64>,
}

/// What happened, at the time [`Machine::on`] is given.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Apply from the first batch not done (a fresh apply, or one resumed after the gate approval).
    Start,
    /// Roll back every changed cluster (on request).
    RollBack,
    /// A cluster's snapshot is stored, or why not.
    Snapshot {
        /// Cluster.
        cluster: String,
        /// Why it failed.
        failure: Option<String>,
    },
    /// A cluster's apply step ended.
    Step {
        /// Cluster.
        cluster: String,
        /// What it did.
        outcome: StepOutcome,
    },
    /// The batch's workloads as read now.
    Health(Vec<HealthRead>),
    /// The soak is over: incidents (their latest revisions) on the batch's clusters and fleet incidents,
    /// opened or changed since the batch started.
    Incidents {
        /// Incidents.
        incidents: Vec<Incident>,
        /// Fleet incidents.
        fleet: Vec<FleetIncident>,
    },
    /// The incidents could not be read.
    IncidentsUnknown(String),
    /// The analysis' answers: per metric, each target cluster's answer, and the baseline's median.
    Measured(Vec<Answered>),
    /// The time asked for with [`Decision::WaitUntil`] came.
    Tick,
    /// The role is stopping.
    Stopping,
    /// The shell failed to carry out a decision (the store); the release fails.
    Failed(String),
    /// A cluster's rollback step ended.
    Restored {
        /// Cluster.
        cluster: String,
        /// What it did.
        outcome: StepOutcome,
    },
}

/// Whether a batch (its clusters) needs the `gate` approval.
pub type Gate = Box<dyn Fn(&[String]) -> bool + Send + Sync>;

/// Whether a batch (its clusters) must wait at this time, and why: a closed sync window, a release it
/// depends on not healthy there yet. Given the release as stored and the time.
pub type HoldCheck = Box<dyn Fn(&Release, &[String], DateTime<Utc>) -> Option<Hold> + Send + Sync>;

/// Why a batch waits, and what passed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hold {
    /// What holds it (empty: nothing holds, see `overridden`).
    pub reason: String,
    /// Closed windows an operator's override passes (recorded as an `override` entry).
    pub overridden: Vec<String>,
}

/// How a release progresses: its timings and gate.
pub struct Policy {
    /// How long a healthy batch soaks.
    pub soak: Duration,
    /// How long a batch's rollouts may take.
    pub health_timeout: Duration,
    /// How often the rollouts are read while not complete.
    pub health_interval: Duration,
    /// The field manager the release applies with (what each cluster's `deployed` says).
    pub field_manager: String,
    /// Whether a batch needs the `gate` approval (it holds a cluster of `sync.approval_selector`).
    pub gated: Option<Gate>,
    /// The spec's analysis, measured over each batch's soak.
    pub analysis: Option<analysis::Compiled>,
    /// Health rules for the kinds without a rollout of their own (CRDs, Jobs, claims).
    pub health: std::sync::Arc<crate::health::Rules>,
    /// Sync windows and dependencies: whether a batch must wait.
    pub hold: Option<HoldCheck>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("soak", &self.soak)
            .field("health_timeout", &self.health_timeout)
            .field("gated", &self.gated.is_some())
            .field("analysis", &self.analysis)
            .finish()
    }
}

/// The step a run waits for.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Nothing asked for.
    Idle,
    /// Snapshots of the batch.
    Snapshots {
        index: u32,
        waiting: BTreeSet<String>,
        failures: Vec<String>,
    },
    /// Apply steps of the batch.
    Steps {
        index: u32,
        waiting: BTreeSet<String>,
        failures: Vec<String>,
    },
    /// The health gate.
    Health {
        index: u32,
        deadline: DateTime<Utc>,
        pending: BTreeMap<String, Vec<Value>>,
        last: BTreeMap<String, String>,
    },
    /// The soak, until the time given, with the analysis' next measurement and its measurements so far.
    Soak {
        index: u32,
        until: DateTime<Utc>,
        measure_at: Option<DateTime<Utc>>,
        tally: Tally,
        measuring: bool,
    },
    /// Rollback steps.
    RollingBack {
        actor: String,
        waiting: BTreeSet<String>,
        failures: Vec<String>,
    },
    /// Over.
    Over,
}

/// One run of a release: an apply (and the rollback a failure starts) or a rollback.
#[derive(Debug)]
pub struct Machine {
    policy: Policy,
    actor: String,
    phase: Phase,
}

fn after(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::TimeDelta::from_std(d)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// What a workload's rollout still lacks; `None` when it is complete.
pub fn rollout_missing(obj: &Value) -> Option<String> {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let i = |p: &str| obj.pointer(p).and_then(Value::as_i64);
    let generation = i("/metadata/generation").unwrap_or(0);
    let observed = i("/status/observedGeneration").unwrap_or(0);
    if observed < generation {
        return Some(format!(
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
        _ => return None,
    };
    let total = i("/status/replicas").unwrap_or(desired);
    if updated == desired && available == desired && (kind == "DaemonSet" || total == desired) {
        None
    } else {
        Some(format!(
            "updated {updated}/{desired}, available {available}/{desired}"
        ))
    }
}

fn is_workload(kind: &str) -> bool {
    matches!(kind, "Deployment" | "StatefulSet" | "DaemonSet")
}

/// The approval a batch held by an inconclusive analysis waits for.
pub fn analysis_approval(batch: u32) -> String {
    format!("analysis-{batch}")
}

fn conclusion_name(c: &Conclusion) -> &'static str {
    match c {
        Conclusion::Running => "running",
        Conclusion::Passed => "passed",
        Conclusion::Failed(_) => "failed",
        Conclusion::Inconclusive(_) => "inconclusive",
    }
}

/// A cluster and the release's workloads there, as the analysis' queries name them.
fn target(r: &Release, cluster: &str) -> Target {
    let mut t = Target {
        cluster: cluster.to_string(),
        ..Target::default()
    };
    if let Some(p) = r.plan.clusters.iter().find(|p| p.cluster == cluster) {
        t.scrape_interval = p
            .scrape_interval_s
            .map(|s| std::time::Duration::from_secs(s.into()));
        for o in p
            .objects
            .iter()
            .filter(|o| o.applied() && is_workload(&o.object.kind))
        {
            t.workloads.push(o.object.name.clone());
            if let Some(ns) = &o.object.namespace
                && !t.namespaces.contains(ns)
            {
                t.namespaces.push(ns.clone());
            }
        }
    }
    t
}

/// How many objects had each outcome.
pub fn counts(objs: &[ObjectOutcome]) -> BTreeMap<String, usize> {
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

/// Whether the fleet incident's first suspect is the release `release`.
pub fn names_first(f: &FleetIncident, release: &str) -> bool {
    f.suspects
        .iter()
        .find(|s| s.verdict == SuspectVerdict::Suspect)
        .and_then(|s| s.release.as_ref())
        .is_some_and(|r| r.name == release)
}

/// What stops a soak, one line each: incidents opened since `since` and not resolved, and open fleet
/// incidents whose first suspect is the release `release` (it reached their failing clusters and few
/// healthy ones: the correlator names it, wherever its batches went).
pub fn new_incidents(
    release: &str,
    since: DateTime<Utc>,
    incidents: &[Incident],
    fleet: &[FleetIncident],
) -> Vec<String> {
    let mut found: Vec<String> = incidents
        .iter()
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
            .iter()
            .filter(|f| f.status != IncidentStatus::Resolved && names_first(f, release))
            .map(|f| {
                format!(
                    "fleet incident {} names this release first: {}",
                    f.id, f.summary
                )
            }),
    );
    found
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

/// Why a start was refused, and the history entry that says so (when it is worth one).
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// Why.
    pub error: Error,
    /// The `apply` entry recording the refusal.
    pub entry: Option<Box<Entry>>,
}

/// An entry in the release's current state.
#[allow(clippy::too_many_arguments)]
pub(crate) fn entry(
    r: &Release,
    what: ReleaseEntry,
    ok: bool,
    actor: &str,
    batch: Option<u32>,
    clusters: Vec<String>,
    summary: String,
    detail: Value,
) -> Entry {
    Entry {
        what,
        ok,
        actor: actor.into(),
        state: r.state,
        batch,
        clusters,
        summary,
        detail,
    }
}

/// Starts applying a planned release from its first batch: refused when it is not planned, its plan is
/// not clean or an approval is missing. Returns the `apply` entry; the run then starts with
/// [`Input::Start`].
pub fn start(r: &mut Release, actor: &str) -> std::result::Result<Entry, Refused> {
    if !matches!(r.state, State::Planned | State::Blocked) {
        return Err(Refused {
            error: Error::NotPlanned {
                name: r.name.clone(),
                state: r.state,
                revision: r.revision,
            },
            entry: None,
        });
    }
    if !r.plan.clean() {
        let problems = r.plan.problems();
        let s = format!(
            "apply refused: the plan has {} blocked objects and {} errors",
            r.plan.blocked, r.plan.errors
        );
        let e = entry(
            r,
            ReleaseEntry::Apply,
            false,
            actor,
            None,
            vec![],
            s,
            json!({"problems": problems}),
        );
        return Err(Refused {
            error: Error::NotClean {
                blocked: r.plan.blocked,
                errors: r.plan.errors,
                problems,
            },
            entry: Some(Box::new(e)),
        });
    }
    let missing = r.missing_approvals();
    if !missing.is_empty() {
        let detail = json!({"missing": missing});
        let error = Error::MissingApprovals { missing };
        let e = entry(
            r,
            ReleaseEntry::Apply,
            false,
            actor,
            None,
            vec![],
            error.to_string(),
            detail,
        );
        return Err(Refused {
            error,
            entry: Some(Box::new(e)),
        });
    }
    r.state = State::Applying;
    r.batches = fresh_batches(r);
    r.changed.clear();
    r.error = None;
    r.deployed_before = r.deployed.clone();
    let clusters: Vec<String> = r.plan.clusters.iter().map(|c| c.cluster.clone()).collect();
    let s = format!(
        "apply starts: {} clusters in {} batches",
        clusters.len(),
        r.plan.batches.len()
    );
    let detail = json!({"approvals": r.approvals});
    Ok(entry(
        r,
        ReleaseEntry::Apply,
        true,
        actor,
        None,
        clusters,
        s,
        detail,
    ))
}

/// Resumes a release waiting for the `gate` approval once it is given: the `apply` entry, after which the
/// run starts again with [`Input::Start`]. `None`: nothing to resume.
pub fn resume(r: &mut Release, actor: &str) -> Option<Entry> {
    if !can_resume(r) {
        return None;
    }
    r.waiting_for = None;
    r.state = State::Applying;
    let waiting: Vec<String> = r
        .batches
        .iter()
        .filter(|b| b.state != BatchState::Done)
        .flat_map(|b| b.clusters.clone())
        .collect();
    let s = format!("apply resumes: {}", waiting.join(", "));
    Some(entry(
        r,
        ReleaseEntry::Apply,
        true,
        actor,
        None,
        waiting,
        s,
        json!({}),
    ))
}

/// Whether the release waits for an approval (the `gate`, or an analysis hold's) that is now given.
pub fn can_resume(r: &Release) -> bool {
    let want = r.waiting_for.as_deref().unwrap_or(GATE_APPROVAL);
    r.state == State::WaitingApproval && r.approvals.contains_key(want)
}

/// Takes a rollback request: refused while busy or when nothing changed; otherwise the release is busy
/// from here (an approval arriving now can't resume an apply next to the rollback) and the run starts
/// with [`Input::RollBack`].
pub fn request_rollback(r: &mut Release) -> std::result::Result<(), Error> {
    if r.state.busy() {
        return Err(Error::Busy {
            name: r.name.clone(),
            state: r.state,
        });
    }
    if r.changed.is_empty() {
        return Err(Error::NothingToRollBack {
            name: r.name.clone(),
            revision: r.revision,
        });
    }
    r.state = State::RollingBack;
    Ok(())
}

/// A release the role found busy when it started: `interrupted`, with the clusters it had changed, and
/// the entry that says so. `None`: it was not busy.
pub fn interrupted(r: &mut Release) -> Option<Entry> {
    if !r.state.busy() {
        return None;
    }
    let was = r.state.as_str();
    r.state = State::Interrupted;
    let s = format!(
        "the release role restarted while {was}; changed clusters: {} — roll back with `multipilot release rollback {}` or plan again",
        if r.changed.is_empty() {
            "none".to_string()
        } else {
            r.changed.join(", ")
        },
        r.name
    );
    r.error = Some(s.clone());
    let clusters = r.changed.clone();
    Some(entry(
        r,
        ReleaseEntry::Interrupted,
        false,
        "system",
        None,
        clusters,
        s,
        json!({"was": was}),
    ))
}

impl Machine {
    /// A run by `actor` under `policy`.
    pub fn new(policy: Policy, actor: impl Into<String>) -> Machine {
        Machine {
            policy,
            actor: actor.into(),
            phase: Phase::Idle,
        }
    }

    /// The analysis the run measures.
    pub fn analysis(&self) -> Option<analysis::Compiled> {
        self.policy.analysis.clone()
    }

    /// Whether the run is over.
    pub fn is_over(&self) -> bool {
        self.phase == Phase::Over
    }

    /// Takes an input that happened at `now` for the release `r` as stored: changes `r` and says what to
    /// do. An input the run does not wait for changes nothing.
    pub fn on(&mut self, r: &mut Release, input: Input, now: DateTime<Utc>) -> Vec<Decision> {
        let mut out = Vec::new();
        let phase = std::mem::replace(&mut self.phase, Phase::Idle);
        self.phase = match (phase, input) {
            (Phase::Idle, Input::Start) => self.next_batch(r, now, &mut out),
            (Phase::Idle, Input::RollBack) => {
                let actor = self.actor.clone();
                let why = format!("rolled back by {actor}");
                self.roll_back(r, actor, &why, now, &mut out)
            }
            (
                Phase::Snapshots {
                    index,
                    mut waiting,
                    mut failures,
                },
                Input::Snapshot { cluster, failure },
            ) if waiting.contains(&cluster) => {
                waiting.remove(&cluster);
                failures.extend(failure);
                if !waiting.is_empty() {
                    Phase::Snapshots {
                        index,
                        waiting,
                        failures,
                    }
                } else if let Some(e) = failures.into_iter().next() {
                    self.fail_batch_at(r, index, e, now, &mut out)
                } else {
                    // the clusters count as changed from here on; the drift judge must know before their
                    // new states arrive
                    let clusters = self.plan_batch(r, index);
                    for c in &clusters {
                        if !r.changed.contains(c) {
                            r.changed.push(c.clone());
                        }
                    }
                    out.push(Decision::Persist);
                    out.push(Decision::Apply {
                        batch: index,
                        clusters: clusters.clone(),
                    });
                    Phase::Steps {
                        index,
                        waiting: clusters.into_iter().collect(),
                        failures: Vec::new(),
                    }
                }
            }
            (
                Phase::Steps {
                    index,
                    mut waiting,
                    mut failures,
                },
                Input::Step { cluster, outcome },
            ) if waiting.contains(&cluster) => {
                waiting.remove(&cluster);
                match outcome {
                    StepOutcome::NotSent(e) => failures.push(e),
                    StepOutcome::Sent { outcomes, failure } => {
                        let c = counts(&outcomes);
                        let summary = match &failure {
                            None => format!("applied on {cluster}: {}", count_text(&c)),
                            Some(e) => e.clone(),
                        };
                        let detail = json!({"outcomes": c, "objects": outcomes.iter().map(|o| json!({
                            "object": o.object, "outcome": o.outcome, "error": o.error})).collect::<Vec<_>>()});
                        out.push(Decision::Record(entry(
                            r,
                            ReleaseEntry::Step,
                            failure.is_none(),
                            &self.actor,
                            Some(index),
                            vec![cluster],
                            summary,
                            detail,
                        )));
                        failures.extend(failure);
                    }
                }
                if !waiting.is_empty() {
                    Phase::Steps {
                        index,
                        waiting,
                        failures,
                    }
                } else if !failures.is_empty() {
                    let e = failures.join("; ");
                    self.fail_batch_at(r, index, e, now, &mut out)
                } else {
                    self.health_gate(r, index, now, &mut out)
                }
            }
            (
                Phase::Health {
                    index,
                    deadline,
                    mut pending,
                    mut last,
                },
                Input::Health(reads),
            ) => {
                let mut broken = Vec::new();
                for read in reads {
                    match judge_read(&read, &self.policy.health) {
                        Judged::Healthy => {
                            pending.remove(&read.cluster);
                            last.remove(&read.cluster);
                        }
                        Judged::Waiting(e) => {
                            last.insert(read.cluster, e);
                        }
                        Judged::Failed(e) => broken.push(format!("{}: {e}", read.cluster)),
                    }
                }
                if !broken.is_empty() {
                    let e = format!("failed: {}", broken.join("; "));
                    let release_error = format!("batch {index}: health gate: {e}");
                    self.fail_batch(r, index, e, &release_error, now, &mut out)
                } else if pending.is_empty() {
                    self.soak(r, index, now, &mut out)
                } else if now >= deadline {
                    let e = format!(
                        "rollout not complete after {}s: {}",
                        self.policy.health_timeout.as_secs(),
                        last.iter()
                            .map(|(c, e)| format!("{c}: {e}"))
                            .collect::<Vec<_>>()
                            .join("; ")
                    );
                    let release_error = format!("batch {index}: health gate: {e}");
                    self.fail_batch(r, index, e, &release_error, now, &mut out)
                } else {
                    out.push(Decision::WaitUntil(after(now, self.policy.health_interval)));
                    Phase::Health {
                        index,
                        deadline,
                        pending,
                        last,
                    }
                }
            }
            (phase @ Phase::Health { .. }, Input::Tick) => {
                if let Phase::Health { pending, .. } = &phase {
                    out.push(Decision::ReadHealth {
                        workloads: pending.clone(),
                    });
                }
                phase
            }
            (Phase::Health { index, .. }, Input::Stopping) => {
                let e = "the release role is stopping".to_string();
                let release_error = format!("batch {index}: health gate: {e}");
                self.fail_batch(r, index, e, &release_error, now, &mut out)
            }
            (
                Phase::Soak {
                    index,
                    until,
                    measure_at,
                    tally,
                    measuring,
                },
                Input::Tick,
            ) => self.soak_step(r, index, until, measure_at, tally, measuring, now, &mut out),
            (
                Phase::Soak {
                    index,
                    until,
                    measure_at,
                    mut tally,
                    measuring: true,
                },
                Input::Measured(answers),
            ) => {
                let Some(a) = self.policy.analysis.clone() else {
                    return out;
                };
                let clusters = self.plan_batch(r, index);
                let mut round = Vec::new();
                for ans in answers {
                    for (cluster, answer) in ans.clusters {
                        // measured its count while another caught up after errors: not again
                        if tally.counted(&ans.metric, &cluster) >= a.count {
                            continue;
                        }
                        let m = a.judge(&ans.metric, &cluster, answer, ans.baseline);
                        round.push(tally.add(&a, m));
                    }
                }
                let conclusion = tally.conclusion(&a, &clusters);
                let n = tally.rounds(&a, &clusters);
                // an error is taken again: not a bad round yet
                let bad = round
                    .iter()
                    .filter(|m| {
                        matches!(
                            m.verdict,
                            analysis::Verdict::Failed | analysis::Verdict::Inconclusive
                        )
                    })
                    .count();
                let shown: Vec<String> = round
                    .iter()
                    .map(|m| {
                        format!(
                            "{} {} on {}{}",
                            m.metric,
                            m.value
                                .map(|v| format!("{v:.4}"))
                                .unwrap_or_else(|| "?".into()),
                            m.cluster,
                            match m.verdict {
                                analysis::Verdict::Successful => "",
                                analysis::Verdict::Failed => " (failed)",
                                analysis::Verdict::Inconclusive => " (inconclusive)",
                                analysis::Verdict::Error => " (no number yet, asked again)",
                            }
                        )
                    })
                    .collect();
                let summary = format!(
                    "batch {index} analysis {n}/{}: {}",
                    a.count,
                    shown.join(", ")
                );
                out.push(Decision::Record(entry(
                    r,
                    ReleaseEntry::Analysis,
                    bad == 0,
                    &self.actor,
                    Some(index),
                    clusters.clone(),
                    summary,
                    json!({"round": n, "count": a.count, "measurements": round,
                        "conclusion": conclusion_name(&conclusion)}),
                )));
                match conclusion {
                    Conclusion::Failed(why) => {
                        let e = format!("analysis failed: {why}");
                        self.fail_batch_at(r, index, e, now, &mut out)
                    }
                    Conclusion::Inconclusive(why) => self.hold(r, index, why, &mut out),
                    Conclusion::Running | Conclusion::Passed => {
                        self.soak_step(r, index, until, measure_at, tally, false, now, &mut out)
                    }
                }
            }
            (Phase::Soak { .. }, Input::Stopping) => {
                self.fail_release(r, "the release role is stopping".into(), now, &mut out)
            }
            (Phase::Soak { index, .. }, Input::Incidents { incidents, fleet }) => {
                let since = r
                    .batches
                    .iter()
                    .find(|b| b.index == index)
                    .and_then(|b| b.started_at)
                    .unwrap_or(now);
                let found = new_incidents(&r.name, since, &incidents, &fleet);
                if found.is_empty() {
                    self.batch_done(r, index, now, &mut out);
                    self.next_batch(r, now, &mut out)
                } else {
                    let e = format!("new incidents during the soak: {}", found.join("; "));
                    self.fail_batch_at(r, index, e, now, &mut out)
                }
            }
            (Phase::Soak { index, .. }, Input::IncidentsUnknown(why)) => {
                let e = format!("cannot tell whether incidents opened: {why}");
                self.fail_batch_at(r, index, e, now, &mut out)
            }
            (
                Phase::RollingBack {
                    actor,
                    mut waiting,
                    mut failures,
                },
                Input::Restored { cluster, outcome },
            ) if waiting.contains(&cluster) => {
                waiting.remove(&cluster);
                match outcome {
                    StepOutcome::NotSent(e) => failures.push(e),
                    StepOutcome::Sent { outcomes, failure } => {
                        if failure.is_none() {
                            // the cluster runs again what it ran before this revision
                            match r.deployed_before.get(&cluster).cloned() {
                                Some(d) => r.deployed.insert(cluster.clone(), d),
                                None => r.deployed.remove(&cluster),
                            };
                        }
                        let c = counts(&outcomes);
                        let summary = match &failure {
                            None => format!("{cluster} restored: {}", count_text(&c)),
                            Some(e) => format!("rollback of {cluster} failed: {e}"),
                        };
                        out.push(Decision::Record(entry(
                            r,
                            ReleaseEntry::RollbackStep,
                            failure.is_none(),
                            &actor,
                            None,
                            vec![cluster],
                            summary,
                            json!({"outcomes": c}),
                        )));
                        failures.extend(failure);
                    }
                }
                if waiting.is_empty() {
                    self.rolled_back(r, &actor, failures, &mut out)
                } else {
                    Phase::RollingBack {
                        actor,
                        waiting,
                        failures,
                    }
                }
            }
            (Phase::Over, _) => Phase::Over,
            // a rollback goes on: what it failed to store is in the log
            (phase, Input::Failed(e)) if !matches!(phase, Phase::RollingBack { .. }) => {
                self.fail_release(r, e, now, &mut out)
            }
            // not waited for: a repeat, or a late answer
            (phase, _) => phase,
        };
        out
    }

    fn plan_batch(&self, r: &Release, index: u32) -> Vec<String> {
        r.plan
            .batches
            .get(index as usize - 1)
            .cloned()
            .unwrap_or_default()
    }

    /// Starts the first batch not done, or ends the apply when all are.
    fn next_batch(
        &mut self,
        r: &mut Release,
        now: DateTime<Utc>,
        out: &mut Vec<Decision>,
    ) -> Phase {
        let next = r
            .plan
            .batches
            .iter()
            .enumerate()
            .map(|(bi, b)| (bi as u32 + 1, b.clone()))
            .find(|(index, _)| {
                !r.batches
                    .iter()
                    .any(|b| b.index == *index && b.state == BatchState::Done)
            });
        if let Some((index, _)) = &next
            && let Some(b) = r.batches.iter().find(|b| b.index == *index)
            && b.state == BatchState::Soaking
        {
            // held by an inconclusive analysis: applied and healthy, and a person approved it since
            let index = *index;
            if !r.approvals.contains_key(&analysis_approval(index)) {
                return self.fail_release(
                    r,
                    format!("batch {index} holds for its analysis and nobody approved it"),
                    now,
                    out,
                );
            }
            self.batch_done(r, index, now, out);
            return self.next_batch(r, now, out);
        }
        let Some((index, batch)) = next else {
            r.state = State::Succeeded;
            let n = r.plan.batches.len();
            out.push(Decision::Record(entry(
                r,
                ReleaseEntry::Done,
                true,
                &self.actor,
                None,
                r.changed.clone(),
                format!("release applied: {n} batches healthy"),
                json!({}),
            )));
            out.push(Decision::Stop);
            return Phase::Over;
        };
        if self.policy.gated.as_ref().is_some_and(|g| g(&batch))
            && !r.approvals.contains_key(GATE_APPROVAL)
        {
            r.state = State::WaitingApproval;
            r.waiting_for = Some(GATE_APPROVAL.to_string());
            let s = format!(
                "batch {index} ({}) waits for approval: multipilot release approve {} {GATE_APPROVAL}",
                batch.join(", "),
                r.name
            );
            let detail =
                json!({"approval": GATE_APPROVAL, "selector": r.spec.sync.approval_selector});
            out.push(Decision::Record(entry(
                r,
                ReleaseEntry::Waiting,
                true,
                &self.actor,
                Some(index),
                batch,
                s,
                detail,
            )));
            out.push(Decision::Stop);
            return Phase::Over;
        }
        if let Some(h) = self.policy.hold.as_ref().and_then(|h| h(r, &batch, now)) {
            if !h.reason.is_empty() {
                return self.held(r, index, batch, h.reason, out);
            }
            let s = format!(
                "batch {index} passes closed sync windows by the operator's override: {}",
                h.overridden.join("; ")
            );
            out.push(Decision::Record(entry(
                r,
                ReleaseEntry::Override,
                true,
                &self.actor,
                Some(index),
                batch.clone(),
                s,
                json!({"windows": h.overridden}),
            )));
        }
        if r.waiting_for.take().is_some() {
            out.push(Decision::Persist);
        }
        let Some(b) = r.batches.iter_mut().find(|b| b.index == index) else {
            return self.fail_release(r, format!("batch {index} missing"), now, out);
        };
        b.state = BatchState::Applying;
        b.started_at = Some(now);
        b.error = None;
        let clusters = b.clusters.clone();
        let s = format!("batch {index} starts: {}", clusters.join(", "));
        // what the correlator tells the fleet's clusters apart by: a policy bundle, a repository
        let detail = json!({"policy": r.source.policy, "repo": r.source.repo});
        out.push(Decision::Record(entry(
            r,
            ReleaseEntry::Batch,
            true,
            &self.actor,
            Some(index),
            clusters,
            s,
            detail,
        )));
        // snapshots, durable before anything changes
        out.push(Decision::Snapshot {
            batch: index,
            clusters: batch.clone(),
        });
        Phase::Snapshots {
            index,
            waiting: batch.into_iter().collect(),
            failures: Vec::new(),
        }
    }

    /// Sets a batch's state (stored, no entry); `false` when the batch is missing.
    fn set_batch(r: &mut Release, index: u32, state: BatchState, now: DateTime<Utc>) -> bool {
        let Some(b) = r.batches.iter_mut().find(|b| b.index == index) else {
            return false;
        };
        b.state = state;
        b.error = None;
        r.updated_at = now;
        true
    }

    /// The batch is applied: its workloads' rollouts must complete.
    fn health_gate(
        &mut self,
        r: &mut Release,
        index: u32,
        now: DateTime<Utc>,
        out: &mut Vec<Decision>,
    ) -> Phase {
        if !Self::set_batch(r, index, BatchState::WaitingHealth, now) {
            return self.fail_release(r, format!("batch {index} missing"), now, out);
        }
        out.push(Decision::Persist);
        let mut pending: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for c in self.plan_batch(r, index) {
            if let Some(p) = r.plan.clusters.iter().find(|p| p.cluster == c) {
                let w: Vec<Value> = p
                    .objects
                    .iter()
                    .filter(|o| {
                        o.applied()
                            && (is_workload(&o.object.kind)
                                || self
                                    .policy
                                    .health
                                    .knows(&o.object.api_version, &o.object.kind))
                    })
                    .map(|o| o.rendered.clone())
                    .collect();
                if !w.is_empty() {
                    pending.insert(c, w);
                }
            }
        }
        if pending.is_empty() {
            return self.soak(r, index, now, out);
        }
        out.push(Decision::ReadHealth {
            workloads: pending.clone(),
        });
        Phase::Health {
            index,
            deadline: after(now, self.policy.health_timeout),
            pending,
            last: BTreeMap::new(),
        }
    }

    /// What an analysis round of batch `index` measures: its clusters, and the baseline (the target clusters
    /// the release has not changed).
    fn round_targets(&self, r: &Release, index: u32) -> (Vec<Target>, Vec<Target>) {
        let targets = self
            .plan_batch(r, index)
            .iter()
            .map(|c| target(r, c))
            .collect();
        // (a cluster the plan could not render for runs none of the workloads: no baseline)
        let baseline = r
            .plan
            .clusters
            .iter()
            .filter(|p| !r.changed.contains(&p.cluster) && p.error.is_none())
            .map(|p| target(r, &p.cluster))
            .collect();
        (targets, baseline)
    }

    /// The batch is healthy: no new incident may open on its clusters for the soak, and the analysis (when
    /// the spec has one) is measured over it, every `interval`, `count` times (the soak lasts at least that).
    fn soak(
        &mut self,
        r: &mut Release,
        index: u32,
        now: DateTime<Utc>,
        out: &mut Vec<Decision>,
    ) -> Phase {
        if !Self::set_batch(r, index, BatchState::Soaking, now) {
            return self.fail_release(r, format!("batch {index} missing"), now, out);
        }
        out.push(Decision::Persist);
        let mut soak = self.policy.soak;
        let mut measure_at = None;
        if let Some(a) = &self.policy.analysis {
            let (targets, baseline) = self.round_targets(r, index);
            let first = a.initial_delay(&targets, &baseline) + a.interval;
            soak = soak.max(first + a.interval * (a.count - 1));
            measure_at = Some(after(now, first));
        }
        let until = after(now, soak);
        out.push(Decision::WaitUntil(measure_at.unwrap_or(until).min(until)));
        Phase::Soak {
            index,
            until,
            measure_at,
            tally: Tally::default(),
            measuring: false,
        }
    }

    /// The soak goes on: measure when a measurement is due, read the incidents when the soak is over (and
    /// the analysis passed), else wait for whichever comes first.
    #[allow(clippy::too_many_arguments)]
    fn soak_step(
        &mut self,
        r: &mut Release,
        index: u32,
        until: DateTime<Utc>,
        mut measure_at: Option<DateTime<Utc>>,
        tally: Tally,
        measuring: bool,
        now: DateTime<Utc>,
        out: &mut Vec<Decision>,
    ) -> Phase {
        let clusters = self.plan_batch(r, index);
        let passed = match &self.policy.analysis {
            None => true,
            Some(a) => tally.conclusion(a, &clusters) == Conclusion::Passed,
        };
        if measuring {
            // a tick while the answers are out: they come first
        } else if let (Some(at), Some(a), false) = (measure_at, &self.policy.analysis, passed)
            && now >= at
        {
            measure_at = Some(after(now, a.interval));
            let (mut targets, baseline) = self.round_targets(r, index);
            let rate_interval = a.rate_interval(&targets, &baseline);
            // a metric measured its count on a cluster is not asked again while another catches up
            for t in &mut targets {
                t.done = a
                    .metrics()
                    .filter(|m| tally.counted(m, &t.cluster) >= a.count)
                    .map(str::to_string)
                    .collect();
            }
            targets.retain(|t| t.done.len() < a.metrics().count());
            out.push(Decision::Measure {
                batch: index,
                targets,
                baseline,
                rate_interval,
            });
            return Phase::Soak {
                index,
                until,
                measure_at,
                tally,
                measuring: true,
            };
        } else if now >= until && passed {
            let since = r
                .batches
                .iter()
                .find(|b| b.index == index)
                .and_then(|b| b.started_at)
                .unwrap_or(now);
            out.push(Decision::ReadIncidents { clusters, since });
            return Phase::Soak {
                index,
                until,
                measure_at: None,
                tally,
                measuring: false,
            };
        }
        // the soak lasts until the analysis concluded too
        let next = match measure_at {
            Some(at) if !passed => at,
            _ => until,
        };
        if !measuring {
            out.push(Decision::WaitUntil(next.max(now)));
        }
        Phase::Soak {
            index,
            until,
            measure_at,
            tally,
            measuring,
        }
    }

    /// The next batch must wait (a window, a dependency): the release is `held`, the role tries again by
    /// itself. The entry is recorded when the reason is new, not at every try.
    fn held(
        &mut self,
        r: &mut Release,
        index: u32,
        batch: Vec<String>,
        reason: String,
        out: &mut Vec<Decision>,
    ) -> Phase {
        r.state = State::Held;
        if r.waiting_for.as_deref() != Some(reason.as_str()) {
            r.waiting_for = Some(reason.clone());
            out.push(Decision::Record(entry(
                r,
                ReleaseEntry::Waiting,
                true,
                &self.actor,
                Some(index),
                batch,
                format!("batch {index} held: {reason}"),
                json!({"held": reason}),
            )));
        } else {
            out.push(Decision::Persist);
        }
        out.push(Decision::Stop);
        Phase::Over
    }

    /// The analysis was inconclusive more often than its limit: the batch holds, soaked but not done, until
    /// a person approves `analysis-<batch>` (it is then done, and the next starts) or rolls back.
    fn hold(&mut self, r: &mut Release, index: u32, why: String, out: &mut Vec<Decision>) -> Phase {
        let approval = analysis_approval(index);
        r.state = State::WaitingApproval;
        r.waiting_for = Some(approval.clone());
        let clusters = self.plan_batch(r, index);
        let s = format!(
            "batch {index} holds: analysis inconclusive: {why} — approve to go on (multipilot release approve {} {approval}) or roll back",
            r.name
        );
        out.push(Decision::Record(entry(
            r,
            ReleaseEntry::Waiting,
            false,
            &self.actor,
            Some(index),
            clusters,
            s,
            json!({"approval": approval, "analysis": "inconclusive", "reason": why}),
        )));
        out.push(Decision::Stop);
        Phase::Over
    }

    /// The batch is healthy and soaked: its clusters run the release's revision, with its objects.
    fn batch_done(&self, r: &mut Release, index: u32, now: DateTime<Utc>, out: &mut Vec<Decision>) {
        let Some(b) = r.batches.iter_mut().find(|b| b.index == index) else {
            return;
        };
        b.state = BatchState::Done;
        b.finished_at = Some(now);
        b.error = None;
        let clusters = b.clusters.clone();
        let s = format!(
            "batch {index} healthy and soaked {}s with no new incident",
            self.policy.soak.as_secs()
        );
        out.push(Decision::Record(entry(
            r,
            ReleaseEntry::Health,
            true,
            &self.actor,
            Some(index),
            clusters,
            s,
            json!({}),
        )));
        for c in self.plan_batch(r, index) {
            let Some(plan) = r.plan.clusters.iter().find(|p| p.cluster == c) else {
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
                revision: r.revision,
                commit: r.source.commit_label(),
                at: now,
                field_manager: self.policy.field_manager.clone(),
                objects,
            };
            r.deployed.insert(c, d);
        }
        out.push(Decision::Persist);
    }

    /// The batch failed: it stops the release.
    /// The batch failed with `e`; the release's error is `batch <index>: <e>`.
    fn fail_batch_at(
        &mut self,
        r: &mut Release,
        index: u32,
        e: String,
        now: DateTime<Utc>,
        out: &mut Vec<Decision>,
    ) -> Phase {
        let release_error = format!("batch {index}: {e}");
        self.fail_batch(r, index, e, &release_error, now, out)
    }

    fn fail_batch(
        &mut self,
        r: &mut Release,
        index: u32,
        e: String,
        release_error: &str,
        now: DateTime<Utc>,
        out: &mut Vec<Decision>,
    ) -> Phase {
        let Some(b) = r.batches.iter_mut().find(|b| b.index == index) else {
            return self.fail_release(r, format!("batch {index} missing"), now, out);
        };
        b.state = BatchState::Failed;
        b.finished_at = Some(now);
        b.error = Some(e.clone());
        let clusters = b.clusters.clone();
        out.push(Decision::Record(entry(
            r,
            ReleaseEntry::Batch,
            false,
            &self.actor,
            Some(index),
            clusters,
            format!("batch {index} failed: {e}"),
            json!({"error": e}),
        )));
        self.fail_release(r, release_error.to_string(), now, out)
    }

    /// The release failed: every changed cluster is rolled back at once (nobody waiting for the release
    /// sees it ended in between).
    fn fail_release(
        &mut self,
        r: &mut Release,
        e: String,
        now: DateTime<Utc>,
        out: &mut Vec<Decision>,
    ) -> Phase {
        r.state = State::RollingBack;
        r.error = Some(e.clone());
        out.push(Decision::Record(entry(
            r,
            ReleaseEntry::Failed,
            false,
            &self.actor,
            None,
            r.changed.clone(),
            format!("release failed: {e}"),
            json!({"error": e}),
        )));
        let why = format!("the release failed: {e}");
        self.roll_back(r, "system".into(), &why, now, out)
    }

    /// Rolls back every changed cluster, the last changed first; a batch the release was in the middle of
    /// (held for an approval, a window or a release it depends on; interrupted; stopping) is stopped
    /// `why`, not left applying or soaking on a rolled-back release.
    fn roll_back(
        &mut self,
        r: &mut Release,
        actor: String,
        why: &str,
        now: DateTime<Utc>,
        out: &mut Vec<Decision>,
    ) -> Phase {
        let mut stopped = Vec::new();
        for b in r.batches.iter_mut().filter(|b| {
            matches!(
                b.state,
                BatchState::Applying | BatchState::WaitingHealth | BatchState::Soaking
            )
        }) {
            b.state = BatchState::Failed;
            b.finished_at = Some(now);
            b.error = Some(format!("stopped: {why}"));
            stopped.push((b.index, b.clusters.clone()));
        }
        for (index, clusters) in stopped {
            out.push(Decision::Record(entry(
                r,
                ReleaseEntry::Batch,
                false,
                &actor,
                Some(index),
                clusters,
                format!("batch {index} stopped: {why}"),
                json!({"error": format!("stopped: {why}")}),
            )));
        }
        r.rollbacks += 1;
        r.state = State::RollingBack;
        r.updated_at = now;
        let clusters = r.changed.clone();
        let s = format!("rollback {} starts: {}", r.rollbacks, clusters.join(", "));
        out.push(Decision::Record(entry(
            r,
            ReleaseEntry::Rollback,
            true,
            &actor,
            None,
            clusters.clone(),
            s,
            json!({}),
        )));
        if clusters.is_empty() {
            return self.rolled_back(r, &actor, Vec::new(), out);
        }
        out.push(Decision::RollBack {
            clusters: clusters.iter().rev().cloned().collect(),
        });
        Phase::RollingBack {
            actor,
            waiting: clusters.into_iter().collect(),
            failures: Vec::new(),
        }
    }

    fn rolled_back(
        &mut self,
        r: &mut Release,
        actor: &str,
        failures: Vec<String>,
        out: &mut Vec<Decision>,
    ) -> Phase {
        let clusters = r.changed.clone();
        if failures.is_empty() {
            r.state = State::RolledBack;
            let s = format!(
                "rolled back: {} clusters restored to their snapshots",
                clusters.len()
            );
            out.push(Decision::Record(entry(
                r,
                ReleaseEntry::RolledBack,
                true,
                actor,
                None,
                clusters,
                s,
                json!({}),
            )));
        } else {
            r.state = State::RollbackFailed;
            let e = failures.join("; ");
            r.error = Some(format!("rollback failed: {e}"));
            out.push(Decision::Record(entry(
                r,
                ReleaseEntry::RolledBack,
                false,
                actor,
                None,
                clusters,
                format!("rollback failed: {e}"),
                json!({"errors": failures}),
            )));
        }
        out.push(Decision::Stop);
        Phase::Over
    }
}

/// What the health gate makes of one cluster's read.
enum Judged {
    /// Every rollout complete, every object a rule judges healthy.
    Healthy,
    /// Still waiting, for this.
    Waiting(String),
    /// An object a rule judges failed: waiting longer won't help.
    Failed(String),
}

/// Judges a cluster's read: workloads by their rollouts, other kinds by the health rules (a kind without
/// a rule is not read at all: it has no health).
fn judge_read(read: &HealthRead, rules: &crate::health::Rules) -> Judged {
    use crate::health::Health;
    if let Some(e) = &read.error {
        return Judged::Waiting(e.clone());
    }
    let mut waiting = Vec::new();
    let mut failed = Vec::new();
    for o in &read.objects {
        let name = format!("{} {}", o.object.kind, obj_name(&o.object));
        let Some(live) = &o.live else {
            waiting.push(format!("{name}: absent"));
            continue;
        };
        if is_workload(&o.object.kind) {
            if let Some(e) = rollout_missing(live) {
                waiting.push(format!("{name}: {e}"));
            }
            continue;
        }
        match rules.judge(live) {
            Health::Healthy | Health::Unknown => {}
            Health::Progressing(why) => waiting.push(format!("{name}: {why}")),
            Health::Failed(why) => failed.push(format!("{name}: {why}")),
        }
    }
    if !failed.is_empty() {
        Judged::Failed(failed.join(", "))
    } else if !waiting.is_empty() {
        Judged::Waiting(waiting.join(", "))
    } else {
        Judged::Healthy
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
