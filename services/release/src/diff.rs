//! Field-level diff of an object before and after a (dry-run) apply: what a person reviews in a plan.
//! Status and server-set metadata (`uid`, `resourceVersion`, `generation`, `creationTimestamp`,
//! `managedFields`) are left out; lists of objects with a `name` are compared item by item
//! (`.spec.template.spec.containers[web].image`), other lists whole.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One changed field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// The field, e.g. `.spec.replicas`.
    pub path: String,
    /// Its value before (absent: the field is added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<Value>,
    /// Its value after (absent: the field is removed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Value>,
}

pub use multipilot_schemas::object::content;

/// The changes from `before` (None: the object is created) to `after`.
pub fn diff(before: Option<&Value>, after: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    let empty = Value::Object(Default::default());
    let b = before.map(content).unwrap_or(empty);
    walk(
        &mut String::new(),
        Some(&b),
        Some(&content(after)),
        &mut out,
    );
    out
}

fn is_named(list: &[Value]) -> bool {
    !list.is_empty()
        && list
            .iter()
            .all(|i| i.get("name").and_then(Value::as_str).is_some())
}

fn walk(path: &mut String, b: Option<&Value>, a: Option<&Value>, out: &mut Vec<Change>) {
    if b == a {
        return;
    }
    match (b, a) {
        (Some(Value::Object(bm)), Some(Value::Object(am))) => {
            let keys: std::collections::BTreeSet<&String> = bm.keys().chain(am.keys()).collect();
            for k in keys {
                let len = path.len();
                path.push('.');
                path.push_str(k);
                walk(path, bm.get(k), am.get(k), out);
                path.truncate(len);
            }
        }
        (Some(Value::Array(bl)), Some(Value::Array(al))) if is_named(bl) && is_named(al) => {
            let name = |v: &Value| {
                v.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            let mut names: Vec<String> = bl.iter().map(name).collect();
            for n in al.iter().map(name) {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
            for n in names {
                let len = path.len();
                path.push_str(&format!("[{n}]"));
                walk(
                    path,
                    bl.iter().find(|i| name(i) == n),
                    al.iter().find(|i| name(i) == n),
                    out,
                );
                path.truncate(len);
            }
        }
        _ => out.push(Change {
            path: if path.is_empty() {
                ".".into()
            } else {
                path.clone()
            },
            before: b.cloned(),
            after: a.cloned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_the_changed_fields() {
        let before = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "resourceVersion": "1", "labels": {"a": "1"}},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "web", "image": "web:1"}, {"name": "side", "image": "s:1"}]}}},
            "status": {"replicas": 2}});
        let after = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "resourceVersion": "2", "labels": {"a": "1", "b": "2"}},
            "spec": {"replicas": 3, "template": {"spec": {"containers": [
                {"name": "web", "image": "web:2"}, {"name": "side", "image": "s:1"}]}}},
            "status": {"replicas": 3}});
        let d = diff(Some(&before), &after);
        let paths: Vec<&str> = d.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                ".metadata.labels.b",
                ".spec.replicas",
                ".spec.template.spec.containers[web].image"
            ]
        );
        assert!(diff(Some(&before), &before).is_empty());
        assert!(!diff(None, &after).is_empty());
    }
}
