//! What of a Kubernetes object an apply owns, the one definition the agent (is a dry run a change?) and
//! the release role (the plan's diff, drift) compare by.

use serde_json::Value;

/// Metadata the API server sets: never part of what an apply changes.
pub const SERVER_SET_METADATA: [&str; 6] = [
    "resourceVersion",
    "generation",
    "managedFields",
    "creationTimestamp",
    "uid",
    "selfLink",
];

/// Annotations controllers write on the objects they manage (a Deployment's revision).
pub const CONTROLLER_ANNOTATIONS: [&str; 1] = ["deployment.kubernetes.io/revision"];

/// What an apply can change: the object without `status`, server-set metadata and controllers'
/// annotations.
pub fn content(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
    }
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in SERVER_SET_METADATA {
            m.remove(k);
        }
        if let Some(a) = m.get_mut("annotations").and_then(Value::as_object_mut) {
            for k in CONTROLLER_ANNOTATIONS {
                a.remove(k);
            }
            if a.is_empty() {
                m.remove("annotations");
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_content_is_what_an_apply_owns() {
        let live = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u", "resourceVersion": "7",
                "generation": 3, "creationTimestamp": "2026-01-01T00:00:00Z", "selfLink": "/x",
                "managedFields": [{}], "labels": {"app": "web"},
                "annotations": {"deployment.kubernetes.io/revision": "3"}},
            "spec": {"replicas": 2},
            "status": {"readyReplicas": 2}
        });
        let applied = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {"replicas": 2}
        });
        assert_eq!(content(&live), applied);
        assert_eq!(content(&applied), applied);
        // an annotation of the applier's own stays
        let mut own = live.clone();
        own["metadata"]["annotations"]["team"] = json!("shop");
        assert_eq!(
            content(&own)["metadata"]["annotations"],
            json!({"team": "shop"})
        );
    }
}
