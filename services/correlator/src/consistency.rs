//! Fleet consistency: the effective settings of the same component across the clusters of one env (the
//! ingress controller's ConfigMap, CoreDNS' Corefile, kube-proxy's configuration, by default), and where
//! they differ. Each setting is "reasonable" on its own cluster; one cluster whose ingress timeout is a
//! third of its peers' is the kind of difference no single cluster alerts on. Pure: the machine keeps each
//! tracked object's settings per cluster ([`settings_of`]) and asks for the [`report`].

use std::collections::{BTreeMap, BTreeSet};

use multipilot_schemas::payload::{ResourceState, SettingDivergence, SettingValue};
use serde::{Deserialize, Serialize};

use crate::state::ClusterState;

/// An object whose settings are compared across clusters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tracked {
    /// Kind, e.g. `ConfigMap`.
    pub kind: String,
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl Tracked {
    /// How the object is named in settings and reports: `ConfigMap ingress-nginx/ingress-nginx-controller`.
    pub fn key(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// The objects compared by default.
pub fn default_tracked() -> Vec<Tracked> {
    [
        ("ConfigMap", "ingress-nginx", "ingress-nginx-controller"),
        ("ConfigMap", "kube-system", "coredns"),
        ("ConfigMap", "kube-system", "kube-proxy"),
    ]
    .into_iter()
    .map(|(k, ns, n)| Tracked {
        kind: k.into(),
        namespace: ns.into(),
        name: n.into(),
    })
    .collect()
}

/// Longest value kept per setting (a longer one is cut and marked).
const MAX_VALUE: usize = 300;
/// Settings kept per object.
const MAX_SETTINGS: usize = 200;

fn cut(v: String) -> String {
    if v.len() <= MAX_VALUE {
        return v;
    }
    let mut end = MAX_VALUE;
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &v[..end])
}

/// Flattens a JSON value into `path → scalar` (`a.b.0.c`).
fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    use serde_json::Value;
    if out.len() >= MAX_SETTINGS {
        return;
    }
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                flatten(&join(k), v, out);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                flatten(&join(&i.to_string()), v, out);
            }
        }
        Value::String(s) => {
            out.insert(prefix.to_string(), cut(s.clone()));
        }
        other => {
            out.insert(prefix.to_string(), cut(other.to_string()));
        }
    }
}

/// The settings of a tracked object's state: a ConfigMap's `data` keys (a value that is a YAML mapping,
/// like kube-proxy's `config.conf`, by its own keys: `config.conf/mode`); any other kind's spec, flattened.
pub fn settings_of(s: &ResourceState) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(spec) = &s.spec else {
        return out;
    };
    if s.kind == "ConfigMap" {
        if let Some(data) = spec.get("data").and_then(|d| d.as_object()) {
            for (k, v) in data {
                let text = v.as_str().unwrap_or_default();
                match serde_yaml::from_str::<serde_json::Value>(text) {
                    Ok(parsed @ serde_json::Value::Object(_)) if text.contains('\n') => {
                        flatten(k, &parsed, &mut out)
                    }
                    _ => {
                        out.insert(k.clone(), cut(text.to_string()));
                    }
                }
            }
        }
    } else {
        flatten("", spec, &mut out);
    }
    out.into_iter().take(MAX_SETTINGS).collect()
}

/// Where the tracked objects' settings differ among the clusters that share the `group_by` label value
/// (clusters without it form a group of their own), every setting once per group, the objects in the
/// order tracked. A cluster whose facts (and so labels) have not arrived yet is left out: its group is
/// not known.
pub fn report(
    clusters: &BTreeMap<String, ClusterState>,
    tracked: &[Tracked],
    group_by: &str,
) -> Vec<SettingDivergence> {
    let mut groups: BTreeMap<String, Vec<(&String, &ClusterState)>> = BTreeMap::new();
    for (name, c) in clusters.iter().filter(|(_, c)| c.inventory.facts.is_some()) {
        let g = c.labels.get(group_by).cloned().unwrap_or_default();
        groups.entry(g).or_default().push((name, c));
    }
    let mut out = Vec::new();
    for t in tracked {
        let object = t.key();
        for (group, members) in &groups {
            let having: Vec<(&String, &BTreeMap<String, String>)> = members
                .iter()
                .filter_map(|(n, c)| c.settings.get(&object).map(|s| (*n, s)))
                .collect();
            if having.len() < 2 {
                continue;
            }
            let keys: BTreeSet<&String> = having.iter().flat_map(|(_, s)| s.keys()).collect();
            for key in keys {
                let mut by_value: BTreeMap<String, Vec<String>> = BTreeMap::new();
                for (n, s) in &having {
                    let v = s.get(key).cloned().unwrap_or_else(|| "(unset)".into());
                    by_value.entry(v).or_default().push((*n).clone());
                }
                if by_value.len() < 2 {
                    continue;
                }
                let total = having.len();
                let mut values: Vec<SettingValue> = by_value
                    .into_iter()
                    .map(|(value, clusters)| SettingValue { value, clusters })
                    .collect();
                values.sort_by_key(|v| std::cmp::Reverse(v.clusters.len()));
                // the odd ones out: everyone not on the value a strict majority holds
                let odd: Vec<String> = if values[0].clusters.len() * 2 > total {
                    values[1..]
                        .iter()
                        .flat_map(|v| v.clusters.iter().cloned())
                        .collect()
                } else {
                    Vec::new()
                };
                let summary = match odd.as_slice() {
                    [] => format!(
                        "{object} {key} differs across the {total} {group_by}={group} clusters: {}",
                        values
                            .iter()
                            .map(|v| format!("{:?} on {}", v.value, v.clusters.join(", ")))
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                    _ => format!(
                        "{object} {key} is {} on {} and {:?} on the other {} {group_by}={group} clusters",
                        values[1..]
                            .iter()
                            .map(|v| format!("{:?}", v.value))
                            .collect::<Vec<_>>()
                            .join(" or "),
                        odd.join(", "),
                        values[0].value,
                        values[0].clusters.len()
                    ),
                };
                out.push(SettingDivergence {
                    object: object.clone(),
                    setting: key.clone(),
                    group: format!("{group_by}={group}"),
                    values,
                    odd_ones_out: odd,
                    summary,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(data: serde_json::Value) -> ResourceState {
        let entry = multipilot_schemas::catalog::entries()
            .into_iter()
            .find(|e| e.name == "ResourceState")
            .expect("a sample");
        let sample =
            rmp_serde::from_slice::<multipilot_schemas::Envelope<ResourceState>>(&entry.sample)
                .expect("decodes")
                .payload;
        ResourceState {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("ingress-nginx".into()),
            name: "ingress-nginx-controller".into(),
            spec: Some(serde_json::json!({ "data": data })),
            ..sample
        }
    }

    fn cluster(env: &str, data: serde_json::Value) -> ClusterState {
        let mut c = ClusterState::default();
        c.inventory.facts = Some(
            rmp_serde::from_slice::<multipilot_schemas::Envelope<_>>(
                &multipilot_schemas::catalog::entries()
                    .into_iter()
                    .find(|e| e.name == "ClusterFacts")
                    .expect("a sample")
                    .sample,
            )
            .expect("decodes")
            .payload,
        );
        c.labels.insert("env".into(), env.into());
        c.settings.insert(
            "ConfigMap ingress-nginx/ingress-nginx-controller".into(),
            settings_of(&cm(data)),
        );
        c
    }

    #[test]
    fn the_odd_one_out_of_an_env_is_named_and_other_envs_are_not_compared() {
        use serde_json::json;
        let clusters = BTreeMap::from([
            (
                "p1".to_string(),
                cluster(
                    "prod",
                    json!({"proxy-read-timeout": "60", "keep-alive": "75"}),
                ),
            ),
            (
                "p2".to_string(),
                cluster(
                    "prod",
                    json!({"proxy-read-timeout": "60", "keep-alive": "75"}),
                ),
            ),
            (
                "p3".to_string(),
                cluster(
                    "prod",
                    json!({"proxy-read-timeout": "20", "keep-alive": "75"}),
                ),
            ),
            // staging may differ from prod: another group
            (
                "s1".to_string(),
                cluster(
                    "staging",
                    json!({"proxy-read-timeout": "5", "keep-alive": "75"}),
                ),
            ),
        ]);
        let r = report(&clusters, &default_tracked(), "env");
        assert_eq!(r.len(), 1, "{r:#?}");
        let d = &r[0];
        assert_eq!(
            (d.setting.as_str(), d.group.as_str()),
            ("proxy-read-timeout", "env=prod")
        );
        assert_eq!(d.odd_ones_out, vec!["p3"]);
        assert_eq!(
            d.summary,
            "ConfigMap ingress-nginx/ingress-nginx-controller proxy-read-timeout is \"20\" on p3 and \"60\" on the other 2 env=prod clusters"
        );
    }

    #[test]
    fn a_yaml_document_in_a_configmap_is_compared_by_its_keys() {
        let s = settings_of(&cm(serde_json::json!({
            "config.conf": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n",
            "plain": "x"
        })));
        assert_eq!(s.get("config.conf.mode").map(String::as_str), Some("ipvs"));
        assert_eq!(s.get("plain").map(String::as_str), Some("x"));
    }
}
