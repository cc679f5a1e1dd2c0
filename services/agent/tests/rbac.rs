//! The agent's RBAC in `deploy/k8s/agent/`: read-only cluster-wide by default and enough for every
//! kind it watches; Secrets listed and watched for metadata, never fetched; write verbs only in
//! `components/release-executor/rbac.yaml`, only for workload kinds, never Secrets, RBAC,
//! impersonation or wildcards.

use std::collections::BTreeSet;
use std::path::Path;

use multipilot_agent::kinds::KINDS;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Rule {
    #[serde(default, rename = "apiGroups")]
    api_groups: Vec<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
    verbs: Vec<String>,
}

fn cluster_role(file: &str, name: &str) -> Vec<Rule> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/k8s")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = serde_yaml::Value::deserialize(doc).unwrap();
        if v["kind"] == "ClusterRole" && v["metadata"]["name"] == name {
            return serde_yaml::from_value(v["rules"].clone()).unwrap();
        }
    }
    panic!("no ClusterRole {name} in {file}");
}

fn plural(kind: &str) -> String {
    let k = kind.to_lowercase();
    if let Some(stem) = k.strip_suffix('y') {
        format!("{stem}ies")
    } else if k.ends_with('s') {
        format!("{k}es")
    } else {
        format!("{k}s")
    }
}

fn verbs_for<'a>(rules: &'a [Rule], group: &str, resource: &str) -> BTreeSet<&'a str> {
    rules
        .iter()
        .filter(|r| {
            r.api_groups.iter().any(|g| g == group) && r.resources.iter().any(|x| x == resource)
        })
        .flat_map(|r| r.verbs.iter().map(String::as_str))
        .collect()
}

#[test]
fn the_default_role_is_read_only_and_covers_every_watched_kind() {
    let rules = cluster_role("agent/rbac.yaml", "multipilot-agent-read");
    for r in &rules {
        for v in &r.verbs {
            assert!(
                ["get", "list", "watch"].contains(&v.as_str()),
                "write verb {v} in {r:?}"
            );
        }
        assert!(
            !r.resources.iter().any(|x| x == "*") && !r.api_groups.iter().any(|g| g == "*"),
            "{r:?}"
        );
        assert!(r.non_resource_urls.iter().all(|u| u != "*"), "{r:?}");
    }
    for k in KINDS {
        let verbs = verbs_for(&rules, k.group, &plural(k.kind));
        // the watcher lists and watches; Secrets are read the same way, as metadata only
        let need = BTreeSet::from(["list", "watch"]);
        assert!(
            need.is_subset(&verbs),
            "{} ({}) needs {need:?}, has {verbs:?}",
            k.kind,
            k.group
        );
    }
    // Secrets: list/watch for the metadata-only lists, never get (which would return the data)
    assert_eq!(
        verbs_for(&rules, "", "secrets"),
        BTreeSet::from(["list", "watch"])
    );
}

#[test]
fn release_write_access_is_limited_to_workload_kinds() {
    let rules = cluster_role(
        "agent/components/release-executor/rbac.yaml",
        "multipilot-agent-release",
    );
    for r in &rules {
        for g in &r.api_groups {
            assert!(
                ![
                    "rbac.authorization.k8s.io",
                    "certificates.k8s.io",
                    "admissionregistration.k8s.io",
                    "*"
                ]
                .contains(&g.as_str()),
                "release role may not touch {g}"
            );
        }
        for x in &r.resources {
            assert!(
                !["secrets", "*", "pods/exec", "nodes"].contains(&x.as_str()),
                "release role may not touch {x}"
            );
        }
        for v in &r.verbs {
            assert!(
                !["escalate", "bind", "impersonate", "*"].contains(&v.as_str()),
                "verb {v}"
            );
        }
    }
    assert!(!verbs_for(&rules, "apps", "deployments").is_empty());
}

#[test]
fn policy_write_access_is_a_separate_component_without_secrets_or_wildcards() {
    let rules = cluster_role(
        "agent/components/policy-executor/rbac.yaml",
        "multipilot-agent-policy",
    );
    for r in &rules {
        for x in &r.resources {
            assert!(
                !["secrets", "*", "pods/exec", "nodes"].contains(&x.as_str()),
                "policy role may not touch {x}"
            );
        }
        assert!(
            !r.api_groups.iter().any(|g| g == "*")
                && !r.verbs.iter().any(|v| v == "*" || v == "impersonate"),
            "{:?}",
            r.verbs
        );
    }
    // what the demo fleet repository's policy bundles apply
    for (group, resource) in [
        ("", "resourcequotas"),
        ("", "limitranges"),
        ("rbac.authorization.k8s.io", "clusterroles"),
        ("rbac.authorization.k8s.io", "clusterrolebindings"),
    ] {
        assert!(
            verbs_for(&rules, group, resource).contains("patch"),
            "{resource}"
        );
    }
}
