//! Judging rendered objects before anything is sent: is the object's apiVersion served by the cluster (its
//! discovered api-versions from `ClusterFacts`), what the deprecation table says about it, and which risks it
//! carries (Service `externalIPs`, `externalTrafficPolicy: Local`, hostNetwork, privileged containers).
//!
//! The deprecation table is `multipilot_schemas::deprecations` (Fairwinds pluto's `versions.yaml`): the
//! planner and the agent's `deprecated-apis` probe judge by the same rows.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use multipilot_schemas::deprecations::{self, minor_of};

/// The deprecation table (the agent's `deprecated-apis` probe reads the same).
pub const DEPRECATIONS_YAML: &str = deprecations::DEPRECATIONS_YAML;

/// Kinds removed without a replacement API, and what replaced them.
fn successor(kind: &str) -> Option<&'static str> {
    match kind {
        "PodSecurityPolicy" => Some(
            "Pod Security admission (namespace labels pod-security.kubernetes.io/enforce|audit|warn)",
        ),
        _ => None,
    }
}

/// What the planner concludes about one object's apiVersion/kind on one cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// The cluster serves the object's `group/version`.
    pub served: bool,
    /// Why the object can't go to this cluster (set: it is blocked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<String>,
    /// A deprecation warning for an object that can still go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// What to use instead (an apiVersion, or a successor mechanism).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
}

/// Judges `kind` as `api_version` on a cluster serving `api_versions` at Kubernetes 1.`minor`.
///
/// Blocked when the cluster doesn't serve the `group/version`, or when the table says the version was
/// removed for this kind at or before `minor` (a group/version can outlive one of its kinds, as
/// `storage.k8s.io/v1beta1` did CSIDriver). A table row that says "removed" while discovery still shows the
/// version is reported too, as the table's row is then the only evidence.
pub fn judge(api_version: &str, kind: &str, api_versions: &[String], minor: u32) -> Verdict {
    let served = api_versions.iter().any(|v| v == api_version);
    let row = deprecations::find(api_version, kind);
    let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
    let same_group: Vec<&str> = api_versions
        .iter()
        .filter(|v| v.rsplit_once('/').map(|(g, _)| g).unwrap_or("") == group && *v != api_version)
        .map(String::as_str)
        .collect();
    let replacement = row
        .filter(|r| !r.replacement.is_empty())
        .map(|r| r.replacement.clone())
        .or_else(|| successor(kind).map(str::to_string));
    let use_instead = || match (row, &replacement) {
        (Some(r), Some(rep)) if !r.replacement.is_empty() => {
            let since = if r.replacement_since.is_empty() {
                String::new()
            } else {
                format!(", available since {}", r.replacement_since)
            };
            let here = if api_versions.iter().any(|v| v == rep) {
                "served here"
            } else {
                "NOT served here either"
            };
            format!("use {rep} ({here}{since})")
        }
        (_, Some(rep)) => format!("no replacement API: use {rep}"),
        _ if !same_group.is_empty() => {
            format!("this cluster serves {group} as {}", same_group.join(", "))
        }
        _ if group.contains('.') && !group.ends_with(".k8s.io") => {
            format!("is the CRD for {group} installed?")
        }
        _ => "no replacement known".to_string(),
    };
    let removed_here = row.and_then(|r| minor_of(&r.removed_in).filter(|m| minor >= *m));
    let deprecated_here = row.and_then(|r| minor_of(&r.deprecated_in).filter(|m| minor >= *m));
    let removed_text = row
        .filter(|r| !r.removed_in.is_empty())
        .map(|r| format!("removed in {}", r.removed_in));
    let mut v = Verdict {
        served,
        replacement: replacement.clone(),
        ..Default::default()
    };
    if !served {
        v.blocked = Some(format!(
            "{kind} {api_version} is not served by this cluster (Kubernetes 1.{minor}){}: {}",
            removed_text.map(|t| format!(", {t}")).unwrap_or_default(),
            use_instead()
        ));
    } else if removed_here.is_some() {
        v.blocked = Some(format!(
            "{kind} {api_version} was {} (this cluster is 1.{minor}; discovery still lists {api_version} for other kinds): {}",
            removed_text.unwrap_or_default(),
            use_instead()
        ));
    } else if let (Some(_), Some(r)) = (deprecated_here, row) {
        v.warning = Some(format!(
            "{kind} {api_version} is deprecated since {}{}: {}",
            r.deprecated_in,
            if r.removed_in.is_empty() {
                String::new()
            } else {
                format!(" and goes in {}", r.removed_in)
            },
            use_instead()
        ));
    }
    v
}

/// How bad a risk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Worth knowing.
    Warning,
    /// Dangerous: usually needs an explicit approval.
    High,
}

/// A risk an object carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Risk {
    /// How bad.
    pub level: Level,
    /// A short code: `external-ips`, `external-traffic-policy-local`, `host-network`, `privileged`,
    /// `deletion`.
    pub code: String,
    /// For a person.
    pub message: String,
    /// The approval needed before apply, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<String>,
}

fn pod_spec<'a>(kind: &str, obj: &'a Value) -> Option<&'a Value> {
    match kind {
        "Pod" => obj.get("spec"),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "Job"
        | "ReplicationController" => obj.pointer("/spec/template/spec"),
        "CronJob" => obj.pointer("/spec/jobTemplate/spec/template/spec"),
        _ => None,
    }
}

/// The risks of one rendered object.
pub fn risks(obj: &Value) -> Vec<Risk> {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut out = Vec::new();
    if kind == "Service" {
        let ips: Vec<&str> = obj
            .pointer("/spec/externalIPs")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if !ips.is_empty() {
            out.push(Risk {
                level: Level::High,
                code: "external-ips".into(),
                message: format!(
                    "Service {name} sets externalIPs {}: whoever can create Services can intercept traffic to \
                     those IPs (CVE-2020-8554); needs explicit approval",
                    ips.join(", ")
                ),
                approval: Some("external-ips".into()),
            });
        }
        if obj
            .pointer("/spec/externalTrafficPolicy")
            .and_then(Value::as_str)
            == Some("Local")
        {
            out.push(Risk {
                level: Level::Warning,
                code: "external-traffic-policy-local".into(),
                message: format!(
                    "Service {name} has externalTrafficPolicy: Local: traffic reaching a node without a ready \
                     pod of the Service is dropped (the price of keeping client source IPs); the load balancer \
                     must health-check the nodes"
                ),
                approval: None,
            });
        }
    }
    if let Some(spec) = pod_spec(kind, obj) {
        if spec.get("hostNetwork").and_then(Value::as_bool) == Some(true) {
            out.push(Risk {
                level: Level::Warning,
                code: "host-network".into(),
                message: format!(
                    "{kind} {name} uses hostNetwork: its pods share the node's network namespace and ports"
                ),
                approval: None,
            });
        }
        for list in ["initContainers", "containers", "ephemeralContainers"] {
            for c in spec
                .get(list)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if c.pointer("/securityContext/privileged")
                    .and_then(Value::as_bool)
                    == Some(true)
                {
                    let cname = c.get("name").and_then(Value::as_str).unwrap_or("?");
                    out.push(Risk {
                        level: Level::High,
                        code: "privileged".into(),
                        message: format!(
                            "{kind} {name} runs container {cname} privileged: full access to the node"
                        ),
                        approval: None,
                    });
                }
            }
        }
    }
    out
}

/// The risk of deleting an object.
pub fn deletion(kind: &str, name: &str) -> Risk {
    Risk {
        level: Level::Warning,
        code: "deletion".into(),
        message: format!("{kind} {name} is deleted (a rollback re-creates it from its snapshot)"),
        approval: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn cronjob_v1beta1_blocked_on_131_allowed_with_a_warning_on_124() {
        let old = served(&["v1", "apps/v1", "batch/v1", "batch/v1beta1"]);
        let new = served(&["v1", "apps/v1", "batch/v1"]);
        let v = judge("batch/v1beta1", "CronJob", &old, 24);
        assert!(v.blocked.is_none(), "{v:?}");
        assert!(
            v.warning.as_deref().unwrap_or("").contains("batch/v1"),
            "{v:?}"
        );
        let v = judge("batch/v1beta1", "CronJob", &new, 31);
        let why = v.blocked.expect("blocked on 1.31");
        assert!(why.contains("use batch/v1"), "{why}");
        assert!(why.contains("v1.25"), "{why}");
        assert!(why.contains("v1.21"), "{why}");
    }

    #[test]
    fn psp_names_pod_security_admission() {
        let v = judge(
            "policy/v1beta1",
            "PodSecurityPolicy",
            &served(&["v1", "policy/v1"]),
            25,
        );
        let why = v.blocked.expect("blocked");
        assert!(why.contains("Pod Security admission"), "{why}");
    }

    #[test]
    fn risks_are_flagged() {
        let svc = serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"externalIPs": ["203.0.113.7"], "externalTrafficPolicy": "Local"}});
        let r = risks(&svc);
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[0].approval.as_deref(), Some("external-ips"));
        assert!(r[0].message.contains("CVE-2020-8554"));
        assert!(r[1].message.contains("dropped"));
        let d = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"template": {"spec": {"hostNetwork": true,
                "containers": [{"name": "c", "securityContext": {"privileged": true}}]}}}});
        let codes: Vec<String> = risks(&d).into_iter().map(|r| r.code).collect();
        assert_eq!(codes, vec!["host-network", "privileged"]);
    }
}
