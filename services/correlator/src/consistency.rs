//! Fleet consistency: the effective settings of the same component across the clusters of one env (the
//! ingress controller's ConfigMap, CoreDNS' Corefile, kube-proxy's configuration, by default; and every
//! workload of one namespace and name: its containers' resources and env, its pods' annotations), and where
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
        object_key(&self.kind, &self.namespace, &self.name)
    }
}

/// How an object is named in settings and reports: `Deployment shop/web`.
pub fn object_key(kind: &str, namespace: &str, name: &str) -> String {
    format!("{kind} {namespace}/{name}")
}

/// The workload kinds compared by default.
pub const WORKLOAD_KINDS: [&str; 3] = ["Deployment", "StatefulSet", "DaemonSet"];

/// Pod annotations that say when or by whom, not how it runs: never compared.
const VOLATILE_ANNOTATIONS: [&str; 2] = [
    "kubectl.kubernetes.io/restartedAt",
    "kubectl.kubernetes.io/default-container",
];

/// The settings of [`workload_settings`] that are a container's image (`image:<container>`): held for the
/// fleet judgement (what a workload's failing copies run), never compared by the [`report`] (a rollout
/// moves an image cluster by cluster).
pub const IMAGE: &str = "image:";

/// What a workload's clusters should agree on: each container's resources (`<container>.resources.limits.memory`)
/// and environment (`<container>.env.TIMEOUT`: the value, or where it comes from), init containers'
/// under `init:<name>`, and the pod template's annotations (`annotations.<key>`). Not the replicas (an
/// autoscaler's). Each container's image too, as `image:<container>` ([`IMAGE`]), which only the fleet
/// judgement reads.
pub fn workload_settings(s: &ResourceState) -> BTreeMap<String, String> {
    use serde_json::Value;
    let mut out = BTreeMap::new();
    let Some(template) = s.spec.as_ref().and_then(|v| v.pointer("/spec/template")) else {
        return out;
    };
    if let Some(a) = template
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        for (k, v) in a {
            if !VOLATILE_ANNOTATIONS.contains(&k.as_str()) {
                out.insert(
                    format!("annotations.{k}"),
                    cut(v.as_str().unwrap_or_default().to_string()),
                );
            }
        }
    }
    for (list, prefix) in [("containers", ""), ("initContainers", "init:")] {
        let containers = template
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array);
        for c in containers.into_iter().flatten() {
            let name = format!(
                "{prefix}{}",
                c.get("name").and_then(Value::as_str).unwrap_or("?")
            );
            if let Some(image) = c.get("image").and_then(Value::as_str) {
                out.insert(format!("{IMAGE}{name}"), cut(image.to_string()));
            }
            if let Some(r) = c.get("resources") {
                flatten(&format!("{name}.resources"), r, &mut out);
            }
            for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
                let Some(var) = e.get("name").and_then(Value::as_str) else {
                    continue;
                };
                let value = match (e.get("value"), e.get("valueFrom")) {
                    (Some(v), _) => v.as_str().unwrap_or_default().to_string(),
                    (None, Some(from)) => {
                        format!("from {}", serde_json::to_string(from).unwrap_or_default())
                    }
                    (None, None) => String::new(),
                };
                out.insert(format!("{name}.env.{var}"), cut(value));
            }
        }
    }
    out.into_iter().take(MAX_SETTINGS).collect()
}

/// How a workload's settings ([`workload_settings`]) went from `old` to `new`: a fingerprint of each
/// setting that changed with its new value and each removed one, and their names; None when nothing did
/// (a restart). Images are compared only when `old` holds them (held before images were, it doesn't: not
/// a change of image).
pub fn delta(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> Option<(u64, Vec<String>)> {
    let images_known = old.keys().any(|k| k.starts_with(IMAGE));
    let mut parts: Vec<&str> = Vec::new();
    let mut changed = Vec::new();
    for (k, v) in new {
        if !images_known && k.starts_with(IMAGE) {
            continue;
        }
        if old.get(k) != Some(v) {
            parts.extend([k.as_str(), "=", v.as_str()]);
            changed.push(k.clone());
        }
    }
    for k in old.keys().filter(|k| !new.contains_key(*k)) {
        parts.extend([k.as_str(), " unset"]);
        changed.push(k.clone());
    }
    if parts.is_empty() {
        return None;
    }
    let id = multipilot_schemas::stable_id(&parts);
    Some((u64::from_str_radix(&id[..16], 16).ok()?, changed))
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

/// Where the tracked objects' settings, then the workloads', differ among the clusters that share the
/// `group_by` label value (clusters without it form a group of their own), every setting once per group,
/// the tracked objects in the order tracked, the workloads by name. A workload is compared among the
/// clusters of a group that run it. A cluster whose facts (and so labels) have not arrived yet is left out:
/// its group is not known.
pub fn report(
    clusters: &BTreeMap<String, ClusterState>,
    workloads: &BTreeMap<String, BTreeMap<String, BTreeMap<String, String>>>,
    tracked: &[Tracked],
    group_by: &str,
) -> Vec<SettingDivergence> {
    let mut groups: BTreeMap<String, Vec<(&String, &ClusterState)>> = BTreeMap::new();
    for (name, c) in clusters.iter().filter(|(_, c)| c.inventory.facts.is_some()) {
        let g = c.labels.get(group_by).cloned().unwrap_or_default();
        groups.entry(g).or_default().push((name, c));
    }
    let mut out = Vec::new();
    let workload_keys: BTreeSet<&String> = workloads.values().flat_map(BTreeMap::keys).collect();
    let objects = tracked
        .iter()
        .map(|t| (t.key(), true))
        .chain(workload_keys.into_iter().map(|k| (k.clone(), false)));
    for (object, is_tracked) in objects {
        for (group, members) in &groups {
            let having: Vec<(&String, &BTreeMap<String, String>)> = members
                .iter()
                .filter_map(|(n, c)| {
                    let s = if is_tracked {
                        c.settings.get(&object)
                    } else {
                        workloads.get(*n).and_then(|w| w.get(&object))
                    };
                    s.map(|s| (*n, s))
                })
                .collect();
            if having.len() < 2 {
                continue;
            }
            let keys: BTreeSet<&String> = having
                .iter()
                .flat_map(|(_, s)| s.keys())
                .filter(|k| is_tracked || !k.starts_with(IMAGE))
                .collect();
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
        let r = report(&clusters, &BTreeMap::new(), &default_tracked(), "env");
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

    /// The ingress-nginx controller Deployment of the project's own manifests, as the agent states it.
    fn ingress_controller() -> ResourceState {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/fixtures/manifests/ingress-nginx-HEAD-cloud-deploy.yaml");
        let text = std::fs::read_to_string(&path).expect("the fixture");
        let object = serde_yaml::Deserializer::from_str(&text)
            .filter_map(|d| serde_json::Value::deserialize(d).ok())
            .find(|d| d["kind"] == "Deployment")
            .expect("a Deployment in the fixture");
        let mut spec = object.clone();
        for k in ["apiVersion", "kind", "metadata", "status"] {
            spec.as_object_mut().expect("an object").remove(k);
        }
        ResourceState {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: Some("ingress-nginx".into()),
            name: "ingress-nginx-controller".into(),
            spec: Some(spec),
            ..cm(serde_json::json!({}))
        }
    }

    #[test]
    fn the_same_rollout_has_the_same_delta_on_clusters_that_differ_otherwise() {
        let m = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let a1 = m(&[("image:web", "web:1"), ("web.env.CLUSTER", "a")]);
        let a2 = m(&[("image:web", "web:2"), ("web.env.CLUSTER", "a")]);
        let b1 = m(&[("image:web", "web:1"), ("web.env.CLUSTER", "b")]);
        let b2 = m(&[("image:web", "web:2"), ("web.env.CLUSTER", "b")]);
        assert_eq!(delta(&a1, &a2), delta(&b1, &b2));
        assert_eq!(
            delta(&a1, &a2).map(|(_, keys)| keys),
            Some(vec!["image:web".to_string()])
        );
        // a restart changes no setting; another image is another change; a removed setting counts
        assert_eq!(delta(&a1, &a1), None);
        let a3 = m(&[("image:web", "web:3"), ("web.env.CLUSTER", "a")]);
        assert_ne!(delta(&a1, &a2), delta(&a1, &a3));
        assert!(delta(&a1, &m(&[("image:web", "web:1")])).is_some());
        // held before images were: their appearance is no change
        assert_eq!(delta(&m(&[("web.env.CLUSTER", "a")]), &a1), None);
    }

    #[test]
    fn a_workload_whose_resources_or_env_differ_on_one_cluster_of_an_env_is_the_odd_one_out() {
        let base = ingress_controller();
        let settings = workload_settings(&base);
        assert_eq!(
            settings
                .get("controller.resources.requests.memory")
                .map(String::as_str),
            Some("90Mi"),
            "{settings:#?}"
        );
        assert!(
            settings["controller.env.POD_NAME"].starts_with("from {\"fieldRef\""),
            "{settings:#?}"
        );
        // the image is held for the fleet judgement, under its own prefix
        assert!(
            settings["image:controller"].starts_with("registry.k8s.io/ingress-nginx/controller:"),
            "{settings:#?}"
        );
        // p3 runs it with less memory and another env value; p4 runs a newer image (a rollout): not a
        // difference to report
        let mut less = base.clone();
        let c = less
            .spec
            .as_mut()
            .and_then(|s| s.pointer_mut("/spec/template/spec/containers/0"))
            .expect("a container");
        c["resources"]["requests"]["memory"] = "64Mi".into();
        c["env"][1]["value"] = "x".into();
        let mut newer = base.clone();
        newer
            .spec
            .as_mut()
            .and_then(|s| s.pointer_mut("/spec/template/spec/containers/0"))
            .expect("a container")["image"] = "registry.k8s.io/ingress-nginx/controller:v9".into();
        let key = object_key("Deployment", "ingress-nginx", "ingress-nginx-controller");
        let mut clusters = BTreeMap::new();
        let mut workloads: BTreeMap<String, BTreeMap<String, BTreeMap<String, String>>> =
            BTreeMap::new();
        for (name, s) in [("p1", &base), ("p2", &base), ("p3", &less), ("p4", &newer)] {
            clusters.insert(
                name.to_string(),
                cluster("prod", serde_json::json!({"proxy-read-timeout": "60"})),
            );
            workloads
                .entry(name.to_string())
                .or_default()
                .insert(key.clone(), workload_settings(s));
        }
        let r = report(&clusters, &workloads, &default_tracked(), "env");
        let settings: Vec<(&str, &[String])> = r
            .iter()
            .map(|d| (d.setting.as_str(), d.odd_ones_out.as_slice()))
            .collect();
        assert_eq!(
            settings,
            vec![
                ("controller.env.POD_NAMESPACE", &["p3".to_string()][..]),
                (
                    "controller.resources.requests.memory",
                    &["p3".to_string()][..]
                ),
            ],
            "{r:#?}"
        );
        assert_eq!(
            r[1].summary,
            "Deployment ingress-nginx/ingress-nginx-controller controller.resources.requests.memory is \"64Mi\" on p3 and \"90Mi\" on the other 3 env=prod clusters"
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
