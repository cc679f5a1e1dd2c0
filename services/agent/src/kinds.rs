//! The kinds the agent watches, and for each the API versions it accepts, best first. Which one a cluster
//! gets is decided by discovery at the edge (CronJob `batch/v1` on 1.21+, `batch/v1beta1` before; HPA
//! `autoscaling/v2`, `v2beta2`, `v2beta1`; …), so consumers never see version differences.

use kube::discovery::{ApiCapabilities, ApiResource, Discovery, Scope};

/// A kind to watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindSpec {
    /// Kind.
    pub kind: &'static str,
    /// API group ("" for core).
    pub group: &'static str,
    /// Acceptable versions, best first.
    pub versions: &'static [&'static str],
    /// Watch metadata only (Secrets: their data is never read).
    pub metadata_only: bool,
}

const fn k(kind: &'static str, group: &'static str, versions: &'static [&'static str]) -> KindSpec {
    KindSpec {
        kind,
        group,
        versions,
        metadata_only: false,
    }
}

/// Every kind the agent normalises into ResourceState.
pub const KINDS: &[KindSpec] = &[
    k("Namespace", "", &["v1"]),
    k("Node", "", &["v1"]),
    k("Pod", "", &["v1"]),
    k("Service", "", &["v1"]),
    k("ConfigMap", "", &["v1"]),
    KindSpec {
        kind: "Secret",
        group: "",
        versions: &["v1"],
        metadata_only: true,
    },
    k("Deployment", "apps", &["v1"]),
    k("ReplicaSet", "apps", &["v1"]),
    k("DaemonSet", "apps", &["v1"]),
    k("StatefulSet", "apps", &["v1"]),
    k("Job", "batch", &["v1"]),
    k("CronJob", "batch", &["v1", "v1beta1"]),
    k(
        "HorizontalPodAutoscaler",
        "autoscaling",
        &["v2", "v2beta2", "v2beta1", "v1"],
    ),
    k("PodDisruptionBudget", "policy", &["v1", "v1beta1"]),
    k("Ingress", "networking.k8s.io", &["v1", "v1beta1"]),
    k("IngressClass", "networking.k8s.io", &["v1", "v1beta1"]),
    k("NetworkPolicy", "networking.k8s.io", &["v1"]),
    k("ClusterRole", "rbac.authorization.k8s.io", &["v1"]),
    k("ClusterRoleBinding", "rbac.authorization.k8s.io", &["v1"]),
    k("Role", "rbac.authorization.k8s.io", &["v1"]),
    k("RoleBinding", "rbac.authorization.k8s.io", &["v1"]),
    k("StorageClass", "storage.k8s.io", &["v1", "v1beta1"]),
    k(
        "CustomResourceDefinition",
        "apiextensions.k8s.io",
        &["v1", "v1beta1"],
    ),
    k("EndpointSlice", "discovery.k8s.io", &["v1", "v1beta1"]),
];

/// Event sources, best first: `events.k8s.io/v1` carries series; `v1` is served everywhere.
pub const EVENT_VERSIONS: &[(&str, &str)] = &[("events.k8s.io", "v1"), ("", "v1")];

/// A kind resolved against one cluster.
#[derive(Debug, Clone)]
pub struct Chosen {
    /// What was asked for.
    pub spec: KindSpec,
    /// The resource as this cluster serves it.
    pub resource: ApiResource,
    /// Namespaced or cluster-wide.
    pub namespaced: bool,
}

impl Chosen {
    /// `group/version` (or `v1`).
    pub fn api_version(&self) -> &str {
        &self.resource.api_version
    }
}

fn find(
    discovery: &Discovery,
    group: &str,
    version: &str,
    kind: &str,
) -> Option<(ApiResource, ApiCapabilities)> {
    let g = discovery.get(group)?;
    if !g.versions().any(|v| v == version) {
        return None;
    }
    g.versioned_resources(version)
        .into_iter()
        .find(|(ar, _)| ar.kind == kind)
}

/// For each kind, the best version this cluster serves (kinds it serves in no acceptable version are left
/// out).
pub fn choose(discovery: &Discovery) -> Vec<Chosen> {
    KINDS
        .iter()
        .filter_map(|spec| {
            spec.versions.iter().find_map(|v| {
                find(discovery, spec.group, v, spec.kind).map(|(resource, caps)| Chosen {
                    spec: *spec,
                    resource,
                    namespaced: caps.scope == Scope::Namespaced,
                })
            })
        })
        .collect()
}

/// The event source this cluster serves best.
pub fn choose_events(discovery: &Discovery) -> Option<Chosen> {
    EVENT_VERSIONS.iter().find_map(|(group, version)| {
        find(discovery, group, version, "Event").map(|(resource, _)| Chosen {
            spec: k("Event", group, &[]),
            resource,
            namespaced: true,
        })
    })
}
