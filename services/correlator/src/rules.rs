//! The correlation rules, as data: which probe status for how many rounds opens which incident kind, with
//! what severity and summary; heartbeat, clock-skew and event-storm thresholds; the evidence window. The
//! defaults are `rules.yaml` next to this file; a rules file in the config replaces them.

use std::collections::BTreeMap;
use std::time::Duration;

use multipilot_schemas::payload::{ProbeStatus, Severity};
use serde::{Deserialize, Serialize};

/// A probe-driven rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeRule {
    /// Probe name.
    pub probe: String,
    /// Statuses that count as failing for this rule.
    pub on: Vec<ProbeStatus>,
    /// Incident kind.
    pub kind: String,
    /// Severity.
    pub severity: Severity,
    /// Failing rounds in a row before the incident opens (with `within`: failing rounds among the last
    /// `within`).
    pub after: u32,
    /// For a signal that flaps (an API server answering a share of its requests with errors): the
    /// incident opens when `after` of the last `within` rounds failed, not only `after` in a row, and
    /// resolves only once fewer than `after` of them fail (and `resolve_after` healthy rounds came in a
    /// row) — a healthy round now and then neither keeps it from opening nor resolves it. Its `for`
    /// and `{since}` count from the oldest failing round still in the window; after its incident
    /// resolved (by hand too), only later rounds count. Rounds that could not tell (`unknown`) are left
    /// out. 0 (the default): in a row. At most [`ProbeRule::MAX_WITHIN`], at least `after`.
    #[serde(default)]
    pub within: u32,
    /// …and for at least this long since the probe first failed (Prometheus' `for`): what keeps a brief
    /// dip (a DaemonSet rolling, an API server restarting) from becoming an incident now that failing
    /// probes are re-run every few seconds. 0 (the default): rounds alone decide.
    #[serde(default, rename = "for", with = "humantime_serde")]
    pub hold: Duration,
    /// Healthy rounds in a row before it resolves.
    pub resolve_after: u32,
    /// Summary template.
    pub summary: String,
    /// The incident accounts for the recent warnings on what its probe found (the objects its findings
    /// name, their pods, objects named like the probe in their namespaces): they are part of it, listed in
    /// its `explains`, and the alert router mutes them while it fires. For a component failing (DNS, CNI,
    /// a node, the GPU plugin); not for a long-lived finding (a drifted release, a deprecated API) whose
    /// objects' own problems must still page. Off by default.
    #[serde(default)]
    pub explains_warnings: bool,
}

impl ProbeRule {
    /// The most rounds `within` can look back (what the correlator keeps of a probe's rounds).
    pub const MAX_WITHIN: u32 = crate::state::ProbeTrack::MAX_ROUNDS as u32;

    /// What is wrong with the rule, if anything.
    fn problem(&self) -> Option<String> {
        if self.after == 0 || self.resolve_after == 0 {
            return Some("`after` and `resolve_after` must be at least 1".into());
        }
        if self.within != 0 && self.on.contains(&ProbeStatus::Unknown) {
            return Some("`within` does not count rounds that could not tell (`unknown`)".into());
        }
        if self.within != 0 && !(self.after..=Self::MAX_WITHIN).contains(&self.within) {
            return Some(format!(
                "`within` ({}) must be between `after` ({}) and {}",
                self.within,
                self.after,
                Self::MAX_WITHIN
            ));
        }
        None
    }
}

/// Heartbeat rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRule {
    /// Incident kind.
    pub kind: String,
    /// Severity.
    pub severity: Severity,
    /// Missed intervals before the incident opens.
    pub missed: u32,
    /// Heartbeats in a row before it resolves.
    pub resolve_after: u32,
    /// Summary template.
    pub summary: String,
}

/// Clock-skew rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkewRule {
    /// Incident kind.
    pub kind: String,
    /// Severity.
    pub severity: Severity,
    /// Seconds of offset that open the incident (it resolves under half of it).
    pub threshold_s: f64,
    /// Heartbeats the estimate looks at.
    pub window: usize,
    /// Summary template.
    pub summary: String,
}

/// Event-storm rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StormRule {
    /// Incident kind.
    pub kind: String,
    /// Severity.
    pub severity: Severity,
    /// Warning events per minute that open it.
    pub warnings_per_minute: u64,
    /// Per minute under which it resolves.
    pub resolve_below_per_minute: u64,
    /// Summary template.
    pub summary: String,
}

/// Evidence settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidenceRule {
    /// How far back changes count as evidence.
    #[serde(with = "humantime_serde")]
    pub change_window: Duration,
    /// Evidence items per incident.
    pub max_items: usize,
}

/// Event digests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DigestRule {
    /// How often a problem that keeps occurring is updated in place (it is announced once, and again only
    /// when its severity changes). Keep it well under the alert router's `event_ttl`, which it refreshes.
    #[serde(with = "humantime_serde")]
    pub refresh: Duration,
}

impl Default for DigestRule {
    fn default() -> Self {
        DigestRule {
            refresh: crate::dedup::DEFAULT_REFRESH,
        }
    }
}

/// Holding back incidents a bigger one explains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InhibitRule {
    /// While one of these kinds is open on a cluster, no other incident opens on it (the conditions are
    /// counted on the open one's evidence, and open by themselves once it resolves, if still failing):
    /// an unreachable cluster or a dead API server makes everything else on it look broken.
    pub root_kinds: Vec<String>,
}

impl Default for InhibitRule {
    fn default() -> Self {
        InhibitRule {
            root_kinds: vec!["cluster-unreachable".into(), "apiserver-down".into()],
        }
    }
}

/// Fleet incidents: one failure across clusters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetRule {
    /// Cluster incidents of one kind that open within this span of each other (hub time: each cluster's
    /// clock corrected by its measured skew) are one fleet incident. Once it is open, every further
    /// incident of that kind joins it while it lasts.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Clusters failing the same way before a fleet incident opens.
    pub min_clusters: usize,
    /// How far before a cluster's incident its changes are weighed as suspects.
    #[serde(with = "humantime_serde")]
    pub lookback: Duration,
    /// A member whose cluster sent nothing for this long leaves (a cluster removed from the fleet, or one
    /// dead for good, must not keep a fleet incident open forever).
    #[serde(with = "humantime_serde")]
    pub silent_member_after: Duration,
    /// Kinds never grouped (each cluster's own business).
    pub exclude_kinds: Vec<String>,
    /// Objects whose settings the fleet-consistency report compares across the clusters of one group.
    pub consistency: Vec<crate::consistency::Tracked>,
    /// The cluster label that groups clusters for it (`env`: prod is compared with prod).
    pub consistency_group_by: String,
    /// Workload kinds whose pod templates (containers' resources and env, the pod's annotations) it
    /// compares too, for every workload of one namespace and name on two or more clusters of a group. Their
    /// settings and images are what a fleet incident of one workload's pods compares and what its changes
    /// are told apart by (`[]`: neither).
    pub consistency_workloads: Vec<String>,
}

impl Default for FleetRule {
    fn default() -> Self {
        FleetRule {
            window: Duration::from_secs(300),
            min_clusters: 2,
            lookback: Duration::from_secs(900),
            silent_member_after: Duration::from_secs(24 * 3600),
            exclude_kinds: Vec::new(),
            consistency: crate::consistency::default_tracked(),
            consistency_group_by: "env".into(),
            consistency_workloads: crate::consistency::WORKLOAD_KINDS
                .iter()
                .map(|k| k.to_string())
                .collect(),
        }
    }
}

/// The whole rules file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    /// Probe rules.
    pub probes: Vec<ProbeRule>,
    /// Heartbeat rule.
    pub heartbeat: HeartbeatRule,
    /// Clock-skew rule.
    pub clock_skew: SkewRule,
    /// Event-storm rule.
    pub event_storm: StormRule,
    /// Evidence.
    pub evidence: EvidenceRule,
    /// Event digests (optional in a rules file).
    #[serde(default)]
    pub digests: DigestRule,
    /// Inhibition (optional in a rules file).
    #[serde(default)]
    pub inhibit: InhibitRule,
    /// Fleet incidents (optional in a rules file).
    #[serde(default)]
    pub fleet: FleetRule,
}

/// The default rules.
pub const DEFAULT_RULES: &str = include_str!("rules.yaml");

/// A rules or baseline file that can't be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Unreadable file.
    #[error("reading the {what} file {path}: {source}")]
    Read {
        /// Which file (`rules`, `baseline`).
        what: &'static str,
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A rule that can't work.
    #[error("the rules file {path}: probe rule {kind}: {problem}")]
    Invalid {
        /// Path.
        path: String,
        /// The rule's incident kind.
        kind: String,
        /// What is wrong.
        problem: String,
    },
    /// Not such a file.
    #[error("the {what} file {path}: {source}")]
    Parse {
        /// Which file (`rules`, `baseline`).
        what: &'static str,
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: serde_yaml::Error,
    },
}

/// Reads a YAML data file of the correlator (`what` names it in errors).
pub(crate) fn load_yaml<T: serde::de::DeserializeOwned>(
    what: &'static str,
    path: &str,
) -> Result<T, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        what,
        path: path.into(),
        source,
    })?;
    serde_yaml::from_str(&text).map_err(|source| Error::Parse {
        what,
        path: path.into(),
        source,
    })
}

impl Rules {
    /// The defaults.
    pub fn defaults() -> Self {
        serde_yaml::from_str(DEFAULT_RULES).expect("the embedded rules parse (a unit test checks)")
    }

    /// Loads a rules file (or the defaults when `path` is None).
    pub fn load(path: Option<&str>) -> Result<Self, Error> {
        let Some(path) = path else {
            return Ok(Self::defaults());
        };
        let rules: Rules = load_yaml("rules", path)?;
        if let Some((kind, problem)) = rules
            .probes
            .iter()
            .find_map(|r| r.problem().map(|p| (r.kind.clone(), p)))
        {
            return Err(Error::Invalid {
                path: path.into(),
                kind,
                problem,
            });
        }
        Ok(rules)
    }
}

/// Fills `{placeholders}` from `vars` (unknown ones stay as written).
pub fn render(template: &str, vars: &BTreeMap<&str, String>) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find('}') {
            Some(end) if vars.contains_key(&after[..end]) => {
                out.push_str(&vars[&after[..end]]);
                rest = &after[end + 1..];
            }
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_rules_parse_and_cover_every_probe() {
        let r = Rules::defaults();
        for &p in multipilot_schemas::probes::PROBES {
            assert!(r.probes.iter().any(|x| x.probe == p), "no rule for {p}");
        }
        for p in &r.probes {
            assert_eq!(p.problem(), None, "{}", p.kind);
        }
    }

    #[test]
    fn a_rules_file_with_a_window_shorter_than_its_rounds_is_refused() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("rules.yaml");
        let path = path.to_str().expect("a UTF-8 path");
        let with_within = |within: u32| {
            DEFAULT_RULES.replacen("    within: 10\n", &format!("    within: {within}\n"), 1)
        };
        assert_ne!(with_within(2), DEFAULT_RULES, "the defaults use a window");
        for (within, problem) in [
            (2, "`within` (2) must be between `after` (3) and 60"),
            (61, "`within` (61) must be between `after` (3) and 60"),
        ] {
            std::fs::write(path, with_within(within)).expect("written");
            let err = Rules::load(Some(path)).expect_err("refused");
            assert_eq!(
                err.to_string(),
                format!("the rules file {path}: probe rule apiserver-overload: {problem}")
            );
        }
        std::fs::write(path, with_within(3)).expect("written");
        // 3 of the last 3 (much as in a row, but for unknown rounds, which a window leaves out)
        let rules = Rules::load(Some(path)).expect("allowed");
        assert_eq!(rules.probes[1].within, 3);
    }

    #[test]
    fn templates_fill_known_placeholders_only() {
        let vars = BTreeMap::from([
            ("cluster", "prod-1".to_string()),
            ("detail", "p95 2.4 s".to_string()),
        ]);
        assert_eq!(
            render(
                "API server of {cluster} overloaded: {detail} {unknown}",
                &vars
            ),
            "API server of prod-1 overloaded: p95 2.4 s {unknown}"
        );
    }
}
