//! What the role keeps about a release: its spec and source, the plan, approvals, batch progress, the
//! clusters it changed; and the reply body of `fleet.releasectl.*` (the requests and closed sets are the
//! contract's, `multipilot_schemas::control`, re-exported here).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
pub use multipilot_schemas::control::{
    ApplyRequest, ApproveRequest, BatchState, NameRequest, PlanRequest, PlannedAction as Action,
    Source,
};
pub use multipilot_schemas::payload::ReleaseState as State;
use multipilot_schemas::payload::{ObjectRef, ReleaseEvent};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::diff::Change;
use crate::judge::{Risk, Verdict};
use crate::spec::Spec;

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
    /// Seconds between its agent's metric scrapes, from its facts (what the analysis' `{{rate_interval}}`
    /// is made of); absent when the agent did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_interval_s: Option<u32>,
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
    /// The approval a `waiting-approval` release waits for: `gate`, or `analysis-<batch>` for a batch its
    /// analysis held (absent in releases stored before: `gate`); for a `held` one, what holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// The revision's apply passes closed sync windows that allow manual syncs (an operator asked).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub override_windows: bool,
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
