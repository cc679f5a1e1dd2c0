//! Request/reply subjects between hub roles (JSON bodies): the incident queries and commands the console and
//! the CLI send to the correlator. With partitions, every correlator instance answers for its part and
//! sets [`HEADER_PARTITIONS`], so the asker knows how many answers to gather (see
//! `multipilot_bus::request::gather`).
//!
//! The release role's operator requests (`fleet.releasectl.<verb>`: [`PlanRequest`], [`ApplyRequest`],
//! [`ApproveRequest`], [`NameRequest`]) and the closed sets its replies use ([`BatchState`],
//! [`PlannedAction`]) are here too. The reply's release record itself embeds the role's parsed spec and plan,
//! so it stays with the role (`multipilot_release::model::Reply`) and is read by others as JSON.

use serde::{Deserialize, Serialize};

use crate::closed::closed_set;
use crate::payload::{ApplyOutcome, Incident};

/// Subject answering the current incidents (request [`IncidentsQuery`], reply a JSON array of
/// [`Incident`]).
pub const QUERY_INCIDENTS: &str = "fleet.query.incidents";
/// Subject answering the fleet incidents (request [`IncidentsQuery`], reply a JSON array of
/// [`crate::payload::FleetIncident`]).
pub const QUERY_FLEET_INCIDENTS: &str = "fleet.query.fleet-incidents";
/// Subject answering what a cluster's loss would take down (request [`BlastRadiusQuery`], reply a JSON
/// array of [`crate::payload::BlastRadius`]: one item from the instance that knows the cluster).
pub const QUERY_BLAST_RADIUS: &str = "fleet.query.blast-radius";
/// Subject answering the fleet-consistency report (request `{}`, reply a JSON array of
/// [`crate::payload::SettingDivergence`]: where the same component's settings differ within an env).
pub const QUERY_CONSISTENCY: &str = "fleet.query.consistency";
/// Subject answering the current compliance reports (request `{}`, reply a JSON array of
/// [`crate::payload::ComplianceReport`]).
pub const QUERY_COMPLIANCE: &str = "fleet.query.compliance";
/// Subject of incident commands (request [`IncidentCommand`], reply [`CommandReply`]).
pub const COMMAND_INCIDENT: &str = "fleet.ctl.incident";
/// Prefix of the release role's operator subjects, `fleet.releasectl.<verb>` (JSON request/reply; see
/// [`release_ctl`]).
pub const RELEASE_CTL_PREFIX: &str = "fleet.releasectl";

/// The release role's operator subject of a verb: `plan`, `apply`, `approve`, `rollback`, `status`,
/// `history`, `gitops`, `sync`.
pub fn release_ctl(verb: &str) -> String {
    format!("{RELEASE_CTL_PREFIX}.{verb}")
}

/// Header on replies from partitioned roles: how many instances answer.
pub const HEADER_PARTITIONS: &str = "Multipilot-Partitions";

/// The request on [`QUERY_INCIDENTS`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IncidentsQuery {
    /// Resolved incidents of the last week too, not only open and acknowledged ones.
    pub all: bool,
}

/// The request on [`QUERY_BLAST_RADIUS`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlastRadiusQuery {
    /// The cluster.
    pub cluster: String,
}

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
    pub incident: Option<Incident>,
    /// What went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl CommandReply {
    /// A reply without an error.
    pub fn new(outcome: CommandOutcome, incident: Option<Incident>) -> Self {
        CommandReply {
            outcome,
            incident,
            error: None,
        }
    }

    /// A failed command.
    pub fn failed(error: impl Into<String>, incident: Option<Incident>) -> Self {
        CommandReply {
            outcome: CommandOutcome::Failed,
            incident,
            error: Some(error.into()),
        }
    }
}

/// One baseline rule across the fleet: the compliance view (`multipilot compliance`, the console's
/// Compliance tab), built from every cluster's latest [`crate::payload::ComplianceReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleCompliance {
    /// Rule id (`kubernetes-version`, `component:coredns`, `pss-labels`, …).
    pub rule: String,
    /// Clusters failing it, with what was found on each (by cluster name).
    pub failing: Vec<RuleFailure>,
    /// Clusters passing it.
    pub passing: usize,
    /// Clusters it could not be judged on yet.
    pub unknown: usize,
}

/// A cluster failing a rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleFailure {
    /// Cluster.
    pub cluster: String,
    /// What was found there.
    pub message: String,
    /// The objects violating it (a few).
    pub objects: Vec<crate::payload::ObjectRef>,
}

/// The compliance view: one entry per rule, the rules failed by the most clusters first.
pub fn compliance_by_rule(reports: &[crate::payload::ComplianceReport]) -> Vec<RuleCompliance> {
    use crate::payload::CheckStatus;
    let mut by: std::collections::BTreeMap<&str, RuleCompliance> = Default::default();
    let mut reports: Vec<&crate::payload::ComplianceReport> = reports.iter().collect();
    reports.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    for r in reports {
        for c in &r.checks {
            let e = by.entry(c.rule.as_str()).or_insert_with(|| RuleCompliance {
                rule: c.rule.clone(),
                failing: Vec::new(),
                passing: 0,
                unknown: 0,
            });
            match c.status {
                CheckStatus::Pass => e.passing += 1,
                CheckStatus::Fail => e.failing.push(RuleFailure {
                    cluster: r.cluster.clone(),
                    message: c.message.clone(),
                    objects: c.objects.iter().take(5).cloned().collect(),
                }),
                CheckStatus::Unknown => e.unknown += 1,
            }
        }
    }
    let mut out: Vec<RuleCompliance> = by.into_values().collect();
    out.sort_by(|a, b| {
        b.failing
            .len()
            .cmp(&a.failing.len())
            .then(a.rule.cmp(&b.rule))
    });
    out
}

closed_set! {
    /// Where a release's batch stands (in the role's store, the KV bucket and the replies).
    pub enum BatchState {
        /// Not started.
        Pending = "pending",
        /// Snapshots taken and objects applied.
        Applying = "applying",
        /// Applied; its workloads' rollouts must complete.
        WaitingHealth = "waiting-health",
        /// Healthy; its analysis runs and no new incident may open on its clusters for the soak.
        Soaking = "soaking",
        /// Healthy and soaked: its clusters run the revision.
        Done = "done",
        /// Stopped the release (see `error`).
        Failed = "failed",
    }
}

closed_set! {
    /// What a release plan says will happen to an object on a cluster.
    pub enum PlannedAction {
        /// Not judged by the cluster: its render failed or its agent didn't answer (or no dry-run yet).
        NotTried = "not-tried",
        /// The cluster does not serve its apiVersion (or the kind was removed): never applied.
        Blocked = "blocked",
        /// The dry-run failed (see the object's `error`).
        Error = "error",
        /// Dry-run: would be created.
        WouldCreate = "would-create",
        /// Dry-run: would change.
        WouldConfigure = "would-configure",
        /// Dry-run: nothing would change.
        Unchanged = "unchanged",
        /// A deletion of an object that exists.
        WouldDelete = "would-delete",
        /// A deletion of an object that does not exist.
        Absent = "absent",
        /// Another outcome of the agent's dry-run (`created`, `configured`, `deleted`, `present`, `other`):
        /// what a newer agent may answer.
        Created = "created",
        /// See [`PlannedAction::Created`].
        Configured = "configured",
        /// See [`PlannedAction::Created`].
        Deleted = "deleted",
        /// See [`PlannedAction::Created`].
        Present = "present",
        /// See [`PlannedAction::Created`].
        Other = "other",
    }
}

/// The dry-run's outcome of an object applied (not deleted).
impl From<ApplyOutcome> for PlannedAction {
    fn from(o: ApplyOutcome) -> PlannedAction {
        match o {
            ApplyOutcome::Created => PlannedAction::Created,
            ApplyOutcome::Configured => PlannedAction::Configured,
            ApplyOutcome::Unchanged => PlannedAction::Unchanged,
            ApplyOutcome::Deleted => PlannedAction::Deleted,
            ApplyOutcome::WouldCreate => PlannedAction::WouldCreate,
            ApplyOutcome::WouldConfigure => PlannedAction::WouldConfigure,
            ApplyOutcome::Present => PlannedAction::Present,
            ApplyOutcome::Absent => PlannedAction::Absent,
            ApplyOutcome::Error => PlannedAction::Error,
            ApplyOutcome::Other => PlannedAction::Other,
        }
    }
}

/// Where a release spec came from.
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
    /// Pass sync windows that are closed but allow a manual sync (`manual_sync: true`); recorded as an
    /// `override` entry and audited.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub override_windows: bool,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::{CheckStatus, ComplianceCheck, ComplianceReport};

    fn report(cluster: &str, checks: &[(&str, CheckStatus)]) -> ComplianceReport {
        ComplianceReport {
            cluster: cluster.into(),
            baseline: "fleet-baseline".into(),
            compliant: checks.iter().all(|(_, s)| *s == CheckStatus::Pass),
            checks: checks
                .iter()
                .map(|(rule, status)| ComplianceCheck {
                    rule: (*rule).into(),
                    status: *status,
                    message: format!("{rule} on {cluster}"),
                    objects: Vec::new(),
                })
                .collect(),
            evaluated_at: chrono::DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn the_compliance_view_shows_each_rule_once_with_the_clusters_it_affects() {
        use CheckStatus::*;
        let view = compliance_by_rule(&[
            report("b", &[("pss-labels", Fail), ("kubernetes-version", Pass)]),
            report("a", &[("pss-labels", Fail), ("kubernetes-version", Fail)]),
            report(
                "c",
                &[("pss-labels", Unknown), ("kubernetes-version", Pass)],
            ),
        ]);
        let rules: Vec<&str> = view.iter().map(|r| r.rule.as_str()).collect();
        assert_eq!(
            rules,
            ["pss-labels", "kubernetes-version"],
            "most failed first"
        );
        let pss = &view[0];
        let clusters: Vec<&str> = pss.failing.iter().map(|f| f.cluster.as_str()).collect();
        assert_eq!(clusters, ["a", "b"]);
        assert_eq!((pss.passing, pss.unknown), (0, 1));
        assert_eq!(view[1].failing[0].message, "kubernetes-version on a");
        assert_eq!(view[1].passing, 2);
    }

    #[test]
    fn release_batch_states_and_planned_actions_keep_their_stored_names() {
        for (s, name) in [
            (BatchState::Pending, "pending"),
            (BatchState::Applying, "applying"),
            (BatchState::WaitingHealth, "waiting-health"),
            (BatchState::Soaking, "soaking"),
            (BatchState::Done, "done"),
            (BatchState::Failed, "failed"),
        ] {
            assert_eq!(serde_json::to_value(s).expect("json"), name);
            assert_eq!(s.as_str(), name);
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
            let a: PlannedAction = serde_json::from_value(name.into()).expect("loads");
            assert_eq!(a.as_str(), name);
            assert_eq!(serde_json::to_value(a).expect("json"), name);
        }
        for o in [
            ApplyOutcome::WouldCreate,
            ApplyOutcome::Unchanged,
            ApplyOutcome::Other,
        ] {
            assert_eq!(PlannedAction::from(o).as_str(), o.as_str());
        }
        assert_eq!(format!("{:<9}|", BatchState::Done), "done     |");
    }
}
