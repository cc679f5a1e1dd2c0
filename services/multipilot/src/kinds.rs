//! Kinds as `kubectl` names them: singular, plural, short names and `resource.group` (or
//! `resource.version.group`), in any case, resolved to the kind the console stores (`deploy` → `Deployment`).
//!
//! The table holds the built-in kinds the agent watches (`services/agent/src/kinds.rs`), and a few more that
//! kubectl users type often but the agent does not collect as objects (PersistentVolumeClaim, Event…): those
//! resolve, and [`Kind::collected`] says the fleet has none of them, so the CLI can say so instead of "unknown".
//! Short names are kubectl's own (`kubectl api-resources`).

use std::fmt;

/// A built-in kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// The kind as stored and shown (`Deployment`).
    pub kind: &'static str,
    /// The resource name, plural, lowercase (`deployments`).
    pub plural: &'static str,
    /// API group, `""` for core.
    pub group: &'static str,
    /// kubectl's short names.
    pub short: &'static [&'static str],
    /// Namespaced (`false`: cluster-scoped, where `-n` means nothing).
    pub namespaced: bool,
    /// The agent collects it, so the console can have objects of it.
    pub collected: bool,
}

impl Kind {
    /// The singular resource name (`deployment`).
    pub fn singular(&self) -> String {
        self.kind.to_ascii_lowercase()
    }

    /// `deployment.apps`, or `pod` for the core group: the prefix of `kubectl get -o name`.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.singular()
        } else {
            format!("{}.{}", self.singular(), self.group)
        }
    }

    /// Every bare name it answers to: singular, plural, short names.
    fn names(&self) -> impl Iterator<Item = String> + '_ {
        [self.singular(), self.plural.to_string()]
            .into_iter()
            .chain(self.short.iter().map(|s| s.to_string()))
    }
}

const fn kind(
    kind: &'static str,
    plural: &'static str,
    group: &'static str,
    short: &'static [&'static str],
    namespaced: bool,
) -> Kind {
    Kind {
        kind,
        plural,
        group,
        short,
        namespaced,
        collected: true,
    }
}

const fn not_collected(
    name: &'static str,
    plural: &'static str,
    group: &'static str,
    short: &'static [&'static str],
    namespaced: bool,
) -> Kind {
    Kind {
        collected: false,
        ..kind(name, plural, group, short, namespaced)
    }
}

/// Every kind the CLI knows, in `kubectl api-resources` order (core first, then by group).
pub const KINDS: &[Kind] = &[
    kind("ConfigMap", "configmaps", "", &["cm"], true),
    not_collected("Endpoints", "endpoints", "", &["ep"], true),
    not_collected("Event", "events", "", &["ev"], true),
    not_collected("LimitRange", "limitranges", "", &["limits"], true),
    kind("Namespace", "namespaces", "", &["ns"], false),
    kind("Node", "nodes", "", &["no"], false),
    not_collected(
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        "",
        &["pvc"],
        true,
    ),
    not_collected("PersistentVolume", "persistentvolumes", "", &["pv"], false),
    kind("Pod", "pods", "", &["po"], true),
    not_collected(
        "ReplicationController",
        "replicationcontrollers",
        "",
        &["rc"],
        true,
    ),
    not_collected("ResourceQuota", "resourcequotas", "", &["quota"], true),
    kind("Secret", "secrets", "", &[], true),
    not_collected("ServiceAccount", "serviceaccounts", "", &["sa"], true),
    kind("Service", "services", "", &["svc"], true),
    kind(
        "CustomResourceDefinition",
        "customresourcedefinitions",
        "apiextensions.k8s.io",
        &["crd", "crds"],
        false,
    ),
    not_collected(
        "ControllerRevision",
        "controllerrevisions",
        "apps",
        &[],
        true,
    ),
    kind("DaemonSet", "daemonsets", "apps", &["ds"], true),
    kind("Deployment", "deployments", "apps", &["deploy"], true),
    kind("ReplicaSet", "replicasets", "apps", &["rs"], true),
    kind("StatefulSet", "statefulsets", "apps", &["sts"], true),
    kind(
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        "autoscaling",
        &["hpa"],
        true,
    ),
    kind("CronJob", "cronjobs", "batch", &["cj"], true),
    kind("Job", "jobs", "batch", &[], true),
    not_collected("Lease", "leases", "coordination.k8s.io", &[], true),
    kind(
        "EndpointSlice",
        "endpointslices",
        "discovery.k8s.io",
        &[],
        true,
    ),
    kind(
        "IngressClass",
        "ingressclasses",
        "networking.k8s.io",
        &[],
        false,
    ),
    kind("Ingress", "ingresses", "networking.k8s.io", &["ing"], true),
    kind(
        "NetworkPolicy",
        "networkpolicies",
        "networking.k8s.io",
        &["netpol"],
        true,
    ),
    kind(
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        "policy",
        &["pdb"],
        true,
    ),
    kind(
        "ClusterRoleBinding",
        "clusterrolebindings",
        "rbac.authorization.k8s.io",
        &[],
        false,
    ),
    kind(
        "ClusterRole",
        "clusterroles",
        "rbac.authorization.k8s.io",
        &[],
        false,
    ),
    kind(
        "RoleBinding",
        "rolebindings",
        "rbac.authorization.k8s.io",
        &[],
        true,
    ),
    kind("Role", "roles", "rbac.authorization.k8s.io", &[], true),
    not_collected(
        "PriorityClass",
        "priorityclasses",
        "scheduling.k8s.io",
        &["pc"],
        false,
    ),
    kind(
        "StorageClass",
        "storageclasses",
        "storage.k8s.io",
        &["sc"],
        false,
    ),
];

/// A kind the table does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown {
    /// What was asked for.
    pub given: String,
    /// The nearest known resource name (plural), when one is near enough.
    pub suggestion: Option<&'static str>,
}

impl fmt::Display for Unknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown kind {:?}", self.given)?;
        match self.suggestion {
            Some(s) => write!(f, "; did you mean {s}?"),
            None => write!(f, " (`multipilot api-resources` lists the kinds)"),
        }
    }
}

impl std::error::Error for Unknown {}

/// Resolves what a user typed (`po`, `Deployments`, `deployments.apps`, `cronjobs.v1.batch`) to its kind.
pub fn resolve(given: &str) -> Result<&'static Kind, Unknown> {
    let want = given.trim().to_ascii_lowercase();
    let bare = |name: &str| KINDS.iter().find(|k| k.names().any(|n| n == name));
    if let Some(k) = bare(&want) {
        return Ok(k);
    }
    // resource.group or resource.version.group: the group must be the kind's own
    if let Some((name, rest)) = want.split_once('.') {
        let group = match rest.split_once('.') {
            Some((version, group)) if is_version(version) => group,
            _ => rest,
        };
        if let Some(k) = KINDS
            .iter()
            .find(|k| !k.group.is_empty() && k.group == group && k.names().any(|n| n == name))
        {
            return Ok(k);
        }
    }
    Err(Unknown {
        given: given.to_string(),
        suggestion: suggest(&want),
    })
}

/// `v1`, `v2beta2`, `v1alpha1`.
fn is_version(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('v') else {
        return false;
    };
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    if digits == 0 {
        return false;
    }
    let tail = &rest[digits..];
    tail.is_empty()
        || ["alpha", "beta"].iter().any(|p| {
            tail.strip_prefix(p)
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
}

/// The plural of the nearest name by edit distance, if it is near: at most a third of the longer word's
/// letters (and at least one) changed.
fn suggest(want: &str) -> Option<&'static str> {
    let name = want.split('.').next().unwrap_or(want);
    KINDS
        .iter()
        .flat_map(|k| k.names().map(move |n| (distance(name, &n), n.len(), k)))
        .filter(|(d, len, _)| *d > 0 && *d <= (name.len().max(*len) / 3).max(1))
        .min_by_key(|(d, _, _)| *d)
        .map(|(_, _, k)| k.plural)
}

/// Edit distance counting an insertion, a deletion, a substitution or a swap of neighbours as one
/// (optimal string alignment).
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    d[0] = (0..=b.len()).collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_of(s: &str) -> &'static str {
        resolve(s).unwrap_or_else(|e| panic!("{s}: {e}")).kind
    }

    #[test]
    fn singular_plural_short_and_kind_resolve_in_any_case() {
        for s in [
            "deployment",
            "deployments",
            "deploy",
            "Deployment",
            "DEPLOY",
            " deployments ",
        ] {
            assert_eq!(kind_of(s), "Deployment", "{s}");
        }
        for (short, kind) in [
            ("po", "Pod"),
            ("svc", "Service"),
            ("ds", "DaemonSet"),
            ("sts", "StatefulSet"),
            ("rs", "ReplicaSet"),
            ("ns", "Namespace"),
            ("no", "Node"),
            ("cm", "ConfigMap"),
            ("ing", "Ingress"),
            ("cj", "CronJob"),
            ("hpa", "HorizontalPodAutoscaler"),
            ("pdb", "PodDisruptionBudget"),
            ("netpol", "NetworkPolicy"),
            ("sc", "StorageClass"),
            ("crd", "CustomResourceDefinition"),
            ("crds", "CustomResourceDefinition"),
            ("pvc", "PersistentVolumeClaim"),
            ("pv", "PersistentVolume"),
            ("sa", "ServiceAccount"),
            ("ep", "Endpoints"),
            ("ev", "Event"),
        ] {
            assert_eq!(kind_of(short), kind, "{short}");
        }
        assert_eq!(kind_of("networkpolicies"), "NetworkPolicy");
        assert_eq!(kind_of("ingresses"), "Ingress");
        assert_eq!(kind_of("endpoints"), "Endpoints");
    }

    #[test]
    fn resource_dot_group_resolves_only_with_the_kinds_own_group() {
        assert_eq!(kind_of("deployments.apps"), "Deployment");
        assert_eq!(kind_of("deployment.apps"), "Deployment");
        assert_eq!(kind_of("Deployments.Apps"), "Deployment");
        assert_eq!(kind_of("deploy.apps"), "Deployment");
        assert_eq!(kind_of("cronjobs.v1.batch"), "CronJob");
        assert_eq!(
            kind_of("hpa.v2beta2.autoscaling"),
            "HorizontalPodAutoscaler"
        );
        assert_eq!(kind_of("ingresses.networking.k8s.io"), "Ingress");
        assert_eq!(
            kind_of("clusterroles.rbac.authorization.k8s.io"),
            "ClusterRole"
        );
        assert!(resolve("deployments.batch").is_err());
        assert!(resolve("pods.apps").is_err());
        assert!(resolve("deployments.v1").is_err());
    }

    #[test]
    fn unknown_kind_suggests_the_nearest_plural() {
        let e = resolve("deploymnets").unwrap_err();
        assert_eq!(e.suggestion, Some("deployments"));
        assert!(e.to_string().contains("did you mean deployments?"), "{e}");
        assert_eq!(resolve("pdos").unwrap_err().suggestion, Some("pods"));
        assert_eq!(resolve("servics").unwrap_err().suggestion, Some("services"));
        assert_eq!(
            resolve("statefulset.app").unwrap_err().suggestion,
            Some("statefulsets")
        );
        // nothing near: no guess
        let e = resolve("flurbles").unwrap_err();
        assert_eq!(e.suggestion, None, "{e}");
        assert!(resolve("").is_err());
    }

    #[test]
    fn names_are_unique_across_the_table() {
        let mut seen = std::collections::BTreeMap::new();
        for k in KINDS {
            for n in k.names() {
                if let Some(other) = seen.insert(n.clone(), k.kind) {
                    // a kind's singular and plural may coincide (endpoints)
                    assert_eq!(other, k.kind, "{n} names both {other} and {}", k.kind);
                }
            }
        }
    }

    #[test]
    fn every_kind_the_agent_watches_is_collected_here() {
        let agent = multipilot_agent::kinds::KINDS;
        for a in agent {
            let k = resolve(a.kind).unwrap();
            assert!(k.collected, "{} is watched by the agent", a.kind);
            assert_eq!(k.group, a.group, "{}", a.kind);
        }
        for k in KINDS.iter().filter(|k| k.collected) {
            assert!(
                agent.iter().any(|a| a.kind == k.kind),
                "{} is not watched",
                k.kind
            );
        }
    }

    #[test]
    fn qualified_names_follow_kubectl_output_name() {
        assert_eq!(resolve("deploy").unwrap().qualified(), "deployment.apps");
        assert_eq!(resolve("po").unwrap().qualified(), "pod");
        assert_eq!(
            resolve("netpol").unwrap().qualified(),
            "networkpolicy.networking.k8s.io"
        );
    }
}
