//! The fleet baseline: allowed Kubernetes versions, required components, Pod Security Standards labels,
//! externalIPs allowlist and certificate validity, judged per cluster into a [`ComplianceReport`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use chrono::{DateTime, Utc};
use multipilot_schemas::payload::{
    CheckStatus, ClusterFacts, ComplianceCheck, ComplianceReport, ObjectRef,
};
use serde::{Deserialize, Serialize};

/// Version range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionRange {
    /// Oldest allowed `1.x`.
    pub min: String,
    /// Newest allowed `1.x`.
    pub max: String,
}

/// A required component.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentRule {
    /// `coredns`, `cni`, `ingress-nginx`, `nvidia-device-plugin`.
    pub name: String,
    /// Oldest acceptable version.
    #[serde(default)]
    pub min: Option<String>,
    /// Acceptable implementations (for `cni`).
    #[serde(default)]
    pub allowed: Vec<String>,
    /// Only required where GPU nodes exist.
    #[serde(default)]
    pub when_gpus: bool,
}

/// Pod Security settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodSecurity {
    /// Namespaces that need no level.
    pub exempt: Vec<String>,
}

/// externalIPs allowlist.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalIps {
    /// Addresses or IPv4 CIDRs.
    pub allow: Vec<String>,
}

/// Certificate rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Certificates {
    /// Days of validity required.
    pub min_days: i64,
}

/// The baseline file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    /// Name (in reports).
    pub name: String,
    /// Kubernetes versions.
    pub kubernetes: VersionRange,
    /// Components.
    pub components: Vec<ComponentRule>,
    /// Pod Security Standards labels.
    pub pod_security: PodSecurity,
    /// externalIPs.
    pub external_ips: ExternalIps,
    /// Certificates.
    pub certificates: Certificates,
    /// Rules whose failure is an incident even when a cluster fails them from the start (by rule name:
    /// `kubernetes-version`, `component:<name>`, `pss-labels`, `external-ips`, `cert-validity`). Every
    /// other rule a cluster fails when first judged is standing non-compliance: it is in the compliance
    /// report, and only a cluster that passed a rule and then fails it (drift) raises `baseline-drift`.
    #[serde(default)]
    pub critical: Vec<String>,
    /// Rules a probe raises its own incident for (`external-ips` → `external-ip-exposure`, `cert-validity` →
    /// `cert-expiring`): they stay in the compliance report and never raise `baseline-drift` too (one
    /// problem, one incident).
    #[serde(default)]
    pub probe_covered: Vec<String>,
}

/// The default baseline.
pub const DEFAULT_BASELINE: &str = include_str!("baseline.yaml");

impl Baseline {
    /// The defaults.
    pub fn defaults() -> Self {
        serde_yaml::from_str(DEFAULT_BASELINE)
            .expect("the embedded baseline parses (a unit test checks)")
    }

    /// Loads a baseline file, or the default.
    pub fn load(path: Option<&str>) -> Result<Self, crate::rules::Error> {
        path.map_or_else(
            || Ok(Self::defaults()),
            |p| crate::rules::load_yaml("baseline", p),
        )
    }
}

/// The probe the release role publishes its verdict on a cluster's policy bundles with.
pub const POLICY_PROBE: &str = "policy-drift";

/// The release role's latest verdict on the policy bundles a cluster runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyVerdict {
    /// Every object of every bundle present and as applied.
    pub ok: bool,
    /// What is missing or changed, with the object.
    pub findings: Vec<(String, Option<ObjectRef>)>,
}

/// What the correlator knows of a cluster for the baseline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    /// Latest facts.
    pub facts: Option<ClusterFacts>,
    /// Namespaces and their PSS enforce level (None: no label).
    pub namespaces: BTreeMap<String, Option<String>>,
    /// Services with externalIPs: `ns/name` → addresses.
    pub external_ips: BTreeMap<String, Vec<String>>,
    /// The policy bundles' verdict (`policy-drift`), once the release role delivers bundles here.
    #[serde(default)]
    pub policy: Option<PolicyVerdict>,
}

fn ver(v: &str) -> Vec<u64> {
    v.trim_start_matches('v')
        .split(['.', '-', '+'])
        .map_while(|p| p.parse::<u64>().ok())
        .collect()
}

fn allowed_ip(ip: &str, allow: &[String]) -> bool {
    let Ok(addr) = ip.parse::<Ipv4Addr>() else {
        return allow.iter().any(|a| a == ip);
    };
    allow.iter().any(|a| match a.split_once('/') {
        None => a == ip,
        Some((net, bits)) => match (net.parse::<Ipv4Addr>(), bits.parse::<u32>()) {
            (Ok(net), Ok(bits)) if bits <= 32 => {
                let mask = if bits == 0 {
                    0
                } else {
                    u32::MAX << (32 - bits)
                };
                (u32::from(addr) & mask) == (u32::from(net) & mask)
            }
            _ => false,
        },
    })
}

fn check(rule: &str, ok: bool, message: String, objects: Vec<ObjectRef>) -> ComplianceCheck {
    ComplianceCheck {
        rule: rule.into(),
        status: if ok {
            CheckStatus::Pass
        } else {
            CheckStatus::Fail
        },
        message,
        objects,
    }
}

fn unknown(rule: &str) -> ComplianceCheck {
    ComplianceCheck {
        rule: rule.into(),
        status: CheckStatus::Unknown,
        message: "no facts from this cluster yet".into(),
        objects: vec![],
    }
}

/// Judges one cluster.
pub fn evaluate(
    b: &Baseline,
    cluster: &str,
    inv: &Inventory,
    now: DateTime<Utc>,
) -> ComplianceReport {
    let mut checks = Vec::new();
    match &inv.facts {
        None => {
            checks.push(unknown("kubernetes-version"));
            for c in &b.components {
                checks.push(unknown(&format!("component:{}", c.name)));
            }
            checks.push(unknown("cert-validity"));
        }
        Some(f) => {
            let v = vec![u64::from(f.version.major), u64::from(f.version.minor)];
            let (lo, hi) = (ver(&b.kubernetes.min), ver(&b.kubernetes.max));
            checks.push(check(
                "kubernetes-version",
                v >= lo && v <= hi,
                format!(
                    "{} {} {}–{}",
                    f.version.git_version,
                    if v >= lo && v <= hi {
                        "is within"
                    } else {
                        "is outside"
                    },
                    b.kubernetes.min,
                    b.kubernetes.max
                ),
                vec![],
            ));
            for c in &b.components {
                let rule = format!("component:{}", c.name);
                if c.when_gpus && f.gpus.is_empty() {
                    checks.push(check(
                        &rule,
                        true,
                        "no GPU nodes: not required".into(),
                        vec![],
                    ));
                    continue;
                }
                let found = match c.name.as_str() {
                    "coredns" => f.coredns.clone(),
                    "cni" => f.cni.clone(),
                    "ingress-nginx" => f.ingress_controller.clone(),
                    "nvidia-device-plugin" => f.gpu_device_plugin.clone(),
                    _ => None,
                };
                let (ok, msg) = match found {
                    None => (false, format!("{} not found", c.name)),
                    Some(comp) => {
                        if !c.allowed.is_empty() && !c.allowed.contains(&comp.name) {
                            (
                                false,
                                format!(
                                    "{} {} is not one of {}",
                                    comp.name,
                                    comp.version,
                                    c.allowed.join(", ")
                                ),
                            )
                        } else if let Some(min) = &c.min
                            && ver(&comp.version) < ver(min)
                        {
                            (
                                false,
                                format!("{} {} is older than {min}", comp.name, comp.version),
                            )
                        } else {
                            (true, format!("{} {}", comp.name, comp.version))
                        }
                    }
                };
                checks.push(check(&rule, ok, msg, vec![]));
            }
            match f.apiserver_cert_expiry {
                Some(t) => {
                    let days = (t - now).num_days();
                    checks.push(check(
                        "cert-validity",
                        days >= b.certificates.min_days,
                        format!(
                            "API server certificate valid for {days} more days (baseline: {})",
                            b.certificates.min_days
                        ),
                        vec![],
                    ));
                }
                None => checks.push(ComplianceCheck {
                    rule: "cert-validity".into(),
                    status: CheckStatus::Unknown,
                    message: "certificate expiry not reported yet".into(),
                    objects: vec![],
                }),
            }
        }
    }
    let exempt: BTreeSet<&str> = b.pod_security.exempt.iter().map(String::as_str).collect();
    let unlabelled: Vec<ObjectRef> = inv
        .namespaces
        .iter()
        .filter(|(ns, level)| level.is_none() && !exempt.contains(ns.as_str()))
        .map(|(ns, _)| ObjectRef {
            api_version: "v1".into(),
            kind: "Namespace".into(),
            namespace: None,
            name: ns.clone(),
            uid: None,
        })
        .collect();
    checks.push(check(
        "pss-labels",
        unlabelled.is_empty(),
        if unlabelled.is_empty() {
            format!(
                "every namespace of {} carries a Pod Security Standards level",
                inv.namespaces.len()
            )
        } else {
            format!(
                "{} namespace{} without a Pod Security Standards level",
                unlabelled.len(),
                if unlabelled.len() == 1 { "" } else { "s" }
            )
        },
        unlabelled.into_iter().take(50).collect(),
    ));
    let bad_ips: Vec<ObjectRef> = inv
        .external_ips
        .iter()
        .filter(|(_, ips)| ips.iter().any(|ip| !allowed_ip(ip, &b.external_ips.allow)))
        .map(|(k, _)| {
            let (ns, name) = k.split_once('/').unwrap_or(("", k));
            ObjectRef {
                api_version: "v1".into(),
                kind: "Service".into(),
                namespace: Some(ns.into()),
                name: name.into(),
                uid: None,
            }
        })
        .collect();
    checks.push(check(
        "external-ips",
        bad_ips.is_empty(),
        if bad_ips.is_empty() {
            "no externalIPs outside the allowlist".into()
        } else {
            format!(
                "{} Service{} use{} externalIPs outside the allowlist",
                bad_ips.len(),
                if bad_ips.len() == 1 { "" } else { "s" },
                if bad_ips.len() == 1 { "s" } else { "" }
            )
        },
        bad_ips,
    ));
    // present where the release role delivers policy bundles (a fleet repository's `policies/`)
    if let Some(p) = &inv.policy {
        checks.push(check(
            "policy-bundles",
            p.ok,
            if p.ok {
                "every policy bundle object the agent watches is present and as applied".into()
            } else {
                let first = p.findings.first().map(|(m, _)| m.as_str()).unwrap_or("");
                format!(
                    "{} policy object{} missing or changed: {first}",
                    p.findings.len(),
                    if p.findings.len() == 1 { "" } else { "s" }
                )
            },
            p.findings
                .iter()
                .filter_map(|(_, o)| o.clone())
                .take(50)
                .collect(),
        ));
    }
    ComplianceReport {
        cluster: cluster.into(),
        baseline: b.name.clone(),
        compliant: checks.iter().all(|c| c.status != CheckStatus::Fail),
        checks,
        evaluated_at: now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use multipilot_schemas::payload::{Component, KubeVersion};

    fn facts(minor: u32) -> ClusterFacts {
        ClusterFacts {
            node_software: Vec::new(),
            version: KubeVersion {
                major: 1,
                minor,
                git_version: format!("v1.{minor}.3"),
                platform: String::new(),
            },
            api_versions: vec![],
            preferred_versions: Default::default(),
            nodes: Default::default(),
            cni: Some(Component {
                name: "calico".into(),
                version: "v3.27.3".into(),
                ready: None,
            }),
            coredns: Some(Component {
                name: "coredns".into(),
                version: "v1.11.1".into(),
                ready: None,
            }),
            ingress_controller: Some(Component {
                name: "ingress-nginx".into(),
                version: "v1.10.1".into(),
                ready: None,
            }),
            gpu_device_plugin: None,
            ingress_classes: vec![],
            storage_classes: vec![],
            default_storage_class: None,
            apiserver_cert_expiry: Some(Utc::now() + chrono::Duration::days(200)),
            gpus: vec![],
            labels: Default::default(),
            scrape_interval_s: None,
        }
    }

    #[test]
    fn default_baseline_parses() {
        let b = Baseline::defaults();
        assert!(b.components.iter().any(|c| c.name == "coredns"));
    }

    #[test]
    fn a_compliant_cluster_passes_and_drift_fails_the_right_rule() {
        let b = Baseline::defaults();
        let mut inv = Inventory {
            facts: Some(facts(31)),
            ..Default::default()
        };
        inv.namespaces
            .insert("shop".into(), Some("restricted".into()));
        inv.namespaces.insert("kube-system".into(), None);
        let r = evaluate(&b, "c1", &inv, Utc::now());
        assert!(r.compliant, "{r:#?}");
        inv.facts = Some(facts(24));
        inv.namespaces.insert("legacy".into(), None);
        inv.external_ips
            .insert("default/debug".into(), vec!["198.51.100.7".into()]);
        let r = evaluate(&b, "c1", &inv, Utc::now());
        let failed: Vec<&str> = r
            .checks
            .iter()
            .filter(|c| c.status == CheckStatus::Fail)
            .map(|c| c.rule.as_str())
            .collect();
        assert_eq!(
            failed,
            vec!["kubernetes-version", "pss-labels", "external-ips"]
        );
        assert_eq!(
            r.checks
                .iter()
                .find(|c| c.rule == "pss-labels")
                .map(|c| c.objects[0].name.as_str()),
            Some("legacy")
        );
    }

    #[test]
    fn allowlisted_external_ips_pass() {
        assert!(allowed_ip("198.51.100.7", &["198.51.100.0/24".into()]));
        assert!(!allowed_ip("198.51.101.7", &["198.51.100.0/24".into()]));
        assert!(allowed_ip("10.0.0.1", &["10.0.0.1".into()]));
    }
}
