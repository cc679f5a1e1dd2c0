//! Field-level comparison of the same object's spec in several clusters.
//!
//! Each spec is flattened to its leaves, keyed by a path such as `spec.template.spec.containers[web].image`:
//! object keys join with `.`, array elements are addressed by index (`ports[0]`), except arrays whose
//! elements are all objects with a unique string `name` (containers, volumes, env), addressed by that name,
//! so inserting a container doesn't make every later one "differ". A path differs when the clusters don't
//! all have the same value there (absent counts as a value).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

/// One differing path and each cluster's value there (`null` where it is absent).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldDiff {
    /// The path.
    pub path: String,
    /// Value per cluster, in the order the clusters were given.
    pub values: Vec<Option<Value>>,
}

fn key_segment(k: &str) -> String {
    if !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        k.to_string()
    } else {
        // keys with dots or slashes (annotations, `nvidia.com/gpu`) are quoted
        format!("[{}]", serde_json::to_string(k).unwrap_or_default())
    }
}

fn named(items: &[Value]) -> Option<Vec<&str>> {
    let names: Option<Vec<&str>> = items
        .iter()
        .map(|v| v.get("name").and_then(Value::as_str))
        .collect();
    let names = names?;
    let unique: BTreeSet<&&str> = names.iter().collect();
    (unique.len() == names.len() && !names.is_empty()).then_some(names)
}

/// Flattens a value into `path → leaf`. Empty objects and arrays are leaves, so `{}` vs absent shows.
pub fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                let seg = key_segment(k);
                let path = if prefix.is_empty() {
                    seg
                } else if seg.starts_with('[') {
                    format!("{prefix}{seg}")
                } else {
                    format!("{prefix}.{seg}")
                };
                flatten(&path, child, out);
            }
        }
        Value::Array(items) if !items.is_empty() => match named(items) {
            Some(names) => {
                for (name, child) in names.iter().zip(items) {
                    flatten(&format!("{prefix}[{name}]"), child, out);
                }
            }
            None => {
                for (i, child) in items.iter().enumerate() {
                    flatten(&format!("{prefix}[{i}]"), child, out);
                }
            }
        },
        leaf => {
            out.insert(prefix.to_string(), leaf.clone());
        }
    }
}

/// The paths where the given values (one per cluster, `None` for a cluster without the object) differ.
pub fn fields(values: &[Option<&Value>]) -> Vec<FieldDiff> {
    let flat: Vec<Option<BTreeMap<String, Value>>> = values
        .iter()
        .map(|v| {
            v.map(|v| {
                let mut m = BTreeMap::new();
                flatten("", v, &mut m);
                m
            })
        })
        .collect();
    let paths: BTreeSet<&String> = flat.iter().flatten().flat_map(|m| m.keys()).collect();
    let mut out = Vec::new();
    for path in paths {
        let vals: Vec<Option<Value>> = flat
            .iter()
            .map(|m| m.as_ref().and_then(|m| m.get(path).cloned()))
            .collect();
        if vals.windows(2).any(|w| w[0] != w[1]) {
            out.push(FieldDiff {
                path: path.clone(),
                values: vals,
            });
        }
    }
    out
}

/// The keys of string maps (labels, annotations) whose values differ between clusters.
pub fn maps(values: &[Option<&BTreeMap<String, String>>]) -> Vec<FieldDiff> {
    let keys: BTreeSet<&String> = values.iter().flatten().flat_map(|m| m.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let vals: Vec<Option<Value>> = values
                .iter()
                .map(|m| m.and_then(|m| m.get(k)).map(|s| Value::String(s.clone())))
                .collect();
            vals.windows(2).any(|w| w[0] != w[1]).then(|| FieldDiff {
                path: k.clone(),
                values: vals,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn differing_leaves_are_found_by_path_and_containers_by_name() {
        let a = json!({"spec": {"replicas": 3, "template": {"spec": {"containers": [
            {"name": "web", "image": "web:1.0", "ports": [{"containerPort": 80}]},
            {"name": "sidecar", "image": "envoy:1"}
        ]}}}});
        let b = json!({"spec": {"replicas": 5, "template": {"spec": {"containers": [
            {"name": "sidecar", "image": "envoy:1"},
            {"name": "web", "image": "web:1.1", "ports": [{"containerPort": 80}]}
        ]}}}});
        let d = fields(&[Some(&a), Some(&b)]);
        let paths: Vec<&str> = d.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            ["spec.replicas", "spec.template.spec.containers[web].image"]
        );
        assert_eq!(
            d[1].values,
            [Some(json!("web:1.0")), Some(json!("web:1.1"))]
        );
    }

    #[test]
    fn absent_objects_and_dotted_keys() {
        let a = json!({"spec": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}});
        let d = fields(&[Some(&a), None]);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].path, "spec.resources.limits[\"nvidia.com/gpu\"]");
        assert_eq!(d[0].values[1], None);
        assert!(fields(&[Some(&a), Some(&a)]).is_empty());
    }

    #[test]
    fn label_maps_differ_by_key() {
        let a = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let b = BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            ("tier".to_string(), "front".to_string()),
        ]);
        let d = maps(&[Some(&a), Some(&b)]);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].path, "tier");
    }
}
