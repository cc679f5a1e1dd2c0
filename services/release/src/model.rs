//! What the role keeps about a release: its spec and source, the plan, approvals, batch progress, the
//! clusters it changed; and the JSON request/reply bodies of `fleet.releasectl.*`.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use multipilot_schemas::payload::{ApplyOutcome, ObjectRef, ReleaseEvent};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::diff::Change;
use crate::judge::{Risk, Verdict};
use crate::spec::Spec;

/// Where a release stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Planned; nothing applied.
    Planned,
    /// Planned, but blocked objects or errors keep it from being applied.
    Blocked,
    /// Batches are being applied.
    Applying,
    /// Every batch applied, healthy and soaked.
    Succeeded,
    /// A batch failed; the changed clusters are being (or were not yet) rolled back.
    Failed,
    /// Rolling back.
    RollingBack,
    /// Every changed cluster is back at its snapshot.
    RolledBack,
    /// A rollback step failed: look at the history.
    RollbackFailed,
    /// The role restarted while applying or rolling back: the clusters listed as changed may be half-way.
    Interrupted,
    /// The next batch holds a cluster of `sync.approval_selector`: it starts once the `gate` approval is
    /// given; the batches before it are applied.
    WaitingApproval,
}

impl State {
    /// The kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            State::Planned => "planned",
            State::Blocked => "blocked",
            State::Applying => "applying",
            State::Succeeded => "succeeded",
            State::Failed => "failed",
            State::RollingBack => "rolling-back",
            State::RolledBack => "rolled-back",
            State::RollbackFailed => "rollback-failed",
            State::Interrupted => "interrupted",
            State::WaitingApproval => "waiting-approval",
        }
    }

    /// Whether work is going on.
    pub fn busy(self) -> bool {
        matches!(self, State::Applying | State::RollingBack)
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// Where a batch stands (`pending`, `applying`, `waiting-health`, `soaking`, `done`, `failed` in sled, the
/// KV bucket and the replies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BatchState {
    /// Not started.
    Pending,
    /// Snapshots taken and objects applied.
    Applying,
    /// Applied; its workloads' rollouts must complete.
    WaitingHealth,
    /// Healthy; no new incident may open on its clusters for the soak.
    Soaking,
    /// Healthy and soaked: its clusters run the revision.
    Done,
    /// Stopped the release (see `error`).
    Failed,
}

impl BatchState {
    /// The kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            BatchState::Pending => "pending",
            BatchState::Applying => "applying",
            BatchState::WaitingHealth => "waiting-health",
            BatchState::Soaking => "soaking",
            BatchState::Done => "done",
            BatchState::Failed => "failed",
        }
    }
}

impl std::fmt::Display for BatchState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// Compared with its name, as clients that read the JSON do.
impl PartialEq<&str> for BatchState {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

/// What the plan says will happen to an object on a cluster (its name in sled and the replies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Not judged by the cluster: its render failed or its agent didn't answer (or no dry-run yet).
    NotTried,
    /// The cluster does not serve its apiVersion (or the kind was removed): never applied.
    Blocked,
    /// The dry-run failed (see the object's `error`).
    Error,
    /// Dry-run: would be created.
    WouldCreate,
    /// Dry-run: would change.
    WouldConfigure,
    /// Dry-run: nothing would change.
    Unchanged,
    /// A deletion of an object that exists.
    WouldDelete,
    /// A deletion of an object that does not exist.
    Absent,
    /// Another outcome of the agent's dry-run (`created`, `configured`, `deleted`, `present`, `other`):
    /// what a newer agent may answer.
    Created,
    /// See [`Action::Created`].
    Configured,
    /// See [`Action::Created`].
    Deleted,
    /// See [`Action::Created`].
    Present,
    /// See [`Action::Created`].
    Other,
}

impl Action {
    /// The kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::NotTried => "not-tried",
            Action::Blocked => "blocked",
            Action::Error => "error",
            Action::WouldCreate => "would-create",
            Action::WouldConfigure => "would-configure",
            Action::Unchanged => "unchanged",
            Action::WouldDelete => "would-delete",
            Action::Absent => "absent",
            Action::Created => "created",
            Action::Configured => "configured",
            Action::Deleted => "deleted",
            Action::Present => "present",
            Action::Other => "other",
        }
    }
}

/// The dry-run's outcome of an object applied (not deleted).
impl From<ApplyOutcome> for Action {
    fn from(o: ApplyOutcome) -> Action {
        match o {
            ApplyOutcome::Created => Action::Created,
            ApplyOutcome::Configured => Action::Configured,
            ApplyOutcome::Unchanged => Action::Unchanged,
            ApplyOutcome::Deleted => Action::Deleted,
            ApplyOutcome::WouldCreate => Action::WouldCreate,
            ApplyOutcome::WouldConfigure => Action::WouldConfigure,
            ApplyOutcome::Present => Action::Present,
            ApplyOutcome::Absent => Action::Absent,
            ApplyOutcome::Error => Action::Error,
            ApplyOutcome::Other => Action::Other,
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// Compared with its name, as clients that read the JSON do.
impl PartialEq<&str> for Action {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Where the spec came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Source {
    /// The spec file, as the operator named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Git commit of the work tree holding the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Whether that work tree had uncommitted changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty: Option<bool>,
    /// The fleet repository (`release.gitops.repos[].name`) the spec was read from, when the role follows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// A policy bundle (from the repository's `policies/`): its drift is the `policy-drift` probe, which
    /// the compliance report's `policy-bundles` check reads.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub policy: bool,
}

impl Source {
    /// `abc1234` or `abc1234-dirty`.
    pub fn commit_label(&self) -> Option<String> {
        self.commit.as_ref().map(|c| {
            if self.dirty == Some(true) {
                format!("{c}-dirty")
            } else {
                c.clone()
            }
        })
    }
}

/// One object in one cluster's plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedObject {
    /// The object (namespace as the agent resolved it, once dry-run).
    pub object: ObjectRef,
    /// What will happen to it.
    pub action: Action,
    /// The apiVersion judgement.
    #[serde(default)]
    pub verdict: Verdict,
    /// Field-level changes against the live object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diff: Vec<Change>,
    /// The error, for `error` and `blocked`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Risks of the object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub risks: Vec<Risk>,
    /// The rendered object (what is sent).
    pub rendered: Value,
    /// Whether this is a deletion.
    #[serde(default)]
    pub delete: bool,
}

impl PlannedObject {
    /// Whether an apply sends it: not a deletion, not blocked.
    pub fn applied(&self) -> bool {
        !self.delete && self.action != Action::Blocked
    }
}

/// One cluster's plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterPlan {
    /// Cluster.
    pub cluster: String,
    /// `1.31`.
    pub version: String,
    /// Batch, from 1.
    pub batch: u32,
    /// Objects, in apply order.
    pub objects: Vec<PlannedObject>,
    /// A failure for the whole cluster (render error, no agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A plan: every target's objects, verdicts, diffs and dry-run outcomes, and what it needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// When it was made.
    pub planned_at: DateTime<Utc>,
    /// Batches of cluster names, in order.
    pub batches: Vec<Vec<String>>,
    /// Per cluster.
    pub clusters: Vec<ClusterPlan>,
    /// Approvals the risks need.
    pub required_approvals: BTreeSet<String>,
    /// Blocked objects (all clusters).
    pub blocked: usize,
    /// Errors (render, dry-run, agents), all clusters.
    pub errors: usize,
    /// How long the dry-run took, ms.
    pub dry_run_ms: u64,
}

impl Plan {
    /// Nothing blocked, no error.
    pub fn clean(&self) -> bool {
        self.blocked == 0 && self.errors == 0
    }

    /// Every error and block, one line each, `cluster: message`.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for c in &self.clusters {
            if let Some(e) = &c.error {
                out.push(format!("{}: {e}", c.cluster));
            }
            for o in &c.objects {
                if let Some(e) = &o.error {
                    out.push(format!(
                        "{}: {} {}: {e}",
                        c.cluster,
                        o.object.kind,
                        obj_name(&o.object)
                    ));
                }
            }
        }
        out
    }
}

/// `ns/name` or `name`.
pub fn obj_name(o: &ObjectRef) -> String {
    match &o.namespace {
        Some(ns) => format!("{ns}/{}", o.name),
        None => o.name.clone(),
    }
}

/// An approval given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    /// Who.
    pub actor: String,
    /// When.
    pub at: DateTime<Utc>,
}

/// A batch's progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchProgress {
    /// From 1.
    pub index: u32,
    /// Clusters.
    pub clusters: Vec<String>,
    /// Where it stands.
    pub state: BatchState,
    /// Started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// Finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Everything the role keeps about one release (its latest revision).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Release {
    /// Name.
    pub name: String,
    /// Revision (a new plan of a finished release is a new revision).
    pub revision: u64,
    /// State.
    pub state: State,
    /// The parsed spec.
    pub spec: Spec,
    /// Where it came from.
    pub source: Source,
    /// Who planned it.
    pub actor: String,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// The latest plan.
    pub plan: Plan,
    /// Approvals given, by name.
    #[serde(default)]
    pub approvals: BTreeMap<String, Approval>,
    /// Batch progress (set when applying starts).
    #[serde(default)]
    pub batches: Vec<BatchProgress>,
    /// Clusters changed (or about to be), in order: what a rollback restores.
    #[serde(default)]
    pub changed: Vec<String>,
    /// Rollbacks started so far (command ids differ per rollback).
    #[serde(default)]
    pub rollbacks: u32,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// History entries so far.
    #[serde(default)]
    pub events: u64,
    /// What each cluster runs of this release (carried across revisions): set when a batch is done,
    /// put back when a rollback restores the cluster.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub deployed: BTreeMap<String, Deployed>,
    /// `deployed` as it was when the current revision started applying (what a rollback puts back).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub deployed_before: BTreeMap<String, Deployed>,
}

/// The revision of a release a cluster runs, and the objects it applied there (what drift is judged
/// against).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployed {
    /// Revision.
    pub revision: u64,
    /// Its commit (`abc1234`, `-dirty` when the work tree was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// When its batch finished.
    pub at: DateTime<Utc>,
    /// The field manager it applied with.
    #[serde(default)]
    pub field_manager: String,
    /// The objects applied (as rendered).
    #[serde(default)]
    pub objects: Vec<Value>,
}

impl Release {
    /// Approvals the plan needs that nobody gave.
    pub fn missing_approvals(&self) -> Vec<String> {
        self.plan
            .required_approvals
            .iter()
            .filter(|a| !self.approvals.contains_key(*a) && !self.spec.approvals.contains(a))
            .cloned()
            .collect()
    }

    /// A one-line summary.
    pub fn summary(&self) -> Summary {
        Summary {
            name: self.name.clone(),
            revision: self.revision,
            state: self.state,
            clusters: self.plan.clusters.len(),
            batches: self.plan.batches.len(),
            done_batches: self
                .batches
                .iter()
                .filter(|b| b.state == BatchState::Done)
                .count(),
            commit: self.source.commit_label(),
            updated_at: self.updated_at,
            error: self.error.clone(),
        }
    }
}

/// A release in a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Name.
    pub name: String,
    /// Revision.
    pub revision: u64,
    /// State.
    pub state: State,
    /// Target clusters.
    pub clusters: usize,
    /// Batches.
    pub batches: usize,
    /// Batches done.
    pub done_batches: usize,
    /// Commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// Error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `fleet.releasectl.plan`: plan a spec (a new revision unless the release is busy).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanRequest {
    /// The spec, YAML.
    pub spec: String,
    /// Where it came from.
    #[serde(default)]
    pub source: Source,
    /// Who asks.
    #[serde(default)]
    pub actor: String,
}

/// `fleet.releasectl.apply`: plan `spec` (when given) or re-plan the stored release, then apply it in the
/// background when the plan is clean and approved.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApplyRequest {
    /// The release (when no spec is given).
    #[serde(default)]
    pub release: Option<String>,
    /// A spec to plan and apply.
    #[serde(default)]
    pub spec: Option<String>,
    /// Where the spec came from.
    #[serde(default)]
    pub source: Source,
    /// Approvals given with the command.
    #[serde(default)]
    pub approve: Vec<String>,
    /// Who asks.
    #[serde(default)]
    pub actor: String,
}

/// `fleet.releasectl.approve`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApproveRequest {
    /// Release.
    pub release: String,
    /// Approvals, e.g. `external-ips`.
    pub approvals: Vec<String>,
    /// Who approves.
    #[serde(default)]
    pub actor: String,
}

/// `fleet.releasectl.rollback`, `fleet.releasectl.status`, `fleet.releasectl.history`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NameRequest {
    /// Release (status: absent lists every release).
    #[serde(default)]
    pub release: Option<String>,
    /// Who asks.
    #[serde(default)]
    pub actor: String,
}

/// Every reply of `fleet.releasectl.*`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// Whether the request was carried out (a plan with problems is still `ok`: read `release.state`).
    pub ok: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The release concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<Box<Release>>,
    /// Every release (status without a name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub releases: Vec<Summary>,
    /// History (history).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<ReleaseEvent>,
    /// Fleet repositories and sync status (gitops, sync).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitops: Option<Box<crate::gitops::Report>>,
}

impl Reply {
    /// A failed reply.
    pub fn error(e: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            error: Some(e.into()),
            ..Default::default()
        }
    }

    /// A reply with a release.
    pub fn with(r: Release) -> Reply {
        Reply {
            ok: true,
            release: Some(Box::new(r)),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_actions_keep_their_stored_names() {
        for (s, name) in [
            (BatchState::Pending, "pending"),
            (BatchState::Applying, "applying"),
            (BatchState::WaitingHealth, "waiting-health"),
            (BatchState::Soaking, "soaking"),
            (BatchState::Done, "done"),
            (BatchState::Failed, "failed"),
        ] {
            assert_eq!(serde_json::to_value(s).expect("json"), name);
            assert_eq!(s.name(), name);
            let back: BatchState = serde_json::from_value(name.into()).expect("loads");
            assert_eq!(back, s);
        }
        for name in [
            "not-tried",
            "blocked",
            "error",
            "would-create",
            "would-configure",
            "unchanged",
            "would-delete",
            "absent",
            "created",
            "configured",
            "deleted",
            "present",
            "other",
        ] {
            let a: Action = serde_json::from_value(name.into()).expect("loads");
            assert_eq!(a.as_str(), name);
            assert_eq!(serde_json::to_value(a).expect("json"), name);
        }
        for o in [
            ApplyOutcome::WouldCreate,
            ApplyOutcome::Unchanged,
            ApplyOutcome::Other,
        ] {
            assert_eq!(Action::from(o).as_str(), o.as_str());
        }
        assert_eq!(format!("{:<9}|", BatchState::Done), "done     |");
    }
}
