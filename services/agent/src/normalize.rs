//! Turns a Kubernetes object (as JSON, whatever version it was read with) into the contract's
//! [`ResourceState`]: a canonical spec and its hash, a metadata hash, and a status snapshot that has the
//! same shape for every kind and every Kubernetes version.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use multipilot_schemas::payload::{
    Condition, FieldManager, ObjectRef, OwnerRef, Replicas, ResourceState, StatusSnapshot,
};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The annotation `kubectl apply` keeps its last applied configuration in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Writes `v` as JSON with every object's keys sorted (whatever map type serde_json was built with).
pub fn canonical_json(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String((*k).clone()).to_string());
                    out.push(':');
                    write(&m[*k], out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

/// Hex SHA-256 (first 32 hex digits) of a string.
pub fn hash(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    hex::encode(&d[..16])
}

/// The desired state of an object: everything but identity, metadata and status (so `spec` for most
/// kinds, `data` for a ConfigMap, `rules` for a Role, `provisioner`… for a StorageClass).
pub fn canonical_spec(obj: &Value) -> Value {
    let mut out = Map::new();
    if let Some(m) = obj.as_object() {
        for (k, v) in m {
            if matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
                continue;
            }
            out.insert(k.clone(), v.clone());
        }
    }
    Value::Object(out)
}

fn str_map(v: Option<&Value>, skip: &[&str]) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter(|(k, _)| !skip.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// The strings of a JSON array (finalizers, externalIPs…); empty when absent.
pub fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn time(v: Option<&Value>) -> Option<DateTime<Utc>> {
    v.and_then(Value::as_str)
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

fn i(v: &Value, ptr: &str) -> i64 {
    v.pointer(ptr).and_then(Value::as_i64).unwrap_or(0)
}

/// The object's reference.
pub fn object_ref(api_version: &str, kind: &str, obj: &Value) -> ObjectRef {
    let ns = s(obj, "/metadata/namespace");
    ObjectRef {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        namespace: (!ns.is_empty()).then(|| ns.to_string()),
        name: s(obj, "/metadata/name").to_string(),
        uid: Some(s(obj, "/metadata/uid").to_string()).filter(|u| !u.is_empty()),
    }
}

/// Normalises an object read with `api_version` into a ResourceState. `with_spec` is false for Secrets
/// (their data is never read; for them the agent only ever has metadata).
pub fn resource_state(
    api_version: &str,
    kind: &str,
    obj: &Value,
    with_spec: bool,
) -> ResourceState {
    let meta = obj.get("metadata").cloned().unwrap_or(Value::Null);
    let spec = if with_spec {
        canonical_spec(obj)
    } else {
        Value::Object(Map::new())
    };
    let labels = str_map(meta.get("labels"), &[]);
    let annotations = str_map(meta.get("annotations"), &[LAST_APPLIED]);
    let metadata_hash = hash(&canonical_json(&serde_json::json!({
        "labels": labels, "annotations": annotations
    })));
    let owner_refs = meta
        .get("ownerReferences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|o| OwnerRef {
                    api_version: s(o, "/apiVersion").into(),
                    kind: s(o, "/kind").into(),
                    name: s(o, "/name").into(),
                    uid: s(o, "/uid").into(),
                    controller: o
                        .get("controller")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                })
                .collect()
        })
        .unwrap_or_default();
    let finalizers = strings(meta.get("finalizers"));
    let ns = s(obj, "/metadata/namespace");
    ResourceState {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        namespace: (!ns.is_empty()).then(|| ns.to_string()),
        name: s(obj, "/metadata/name").to_string(),
        uid: s(obj, "/metadata/uid").to_string(),
        resource_version: s(obj, "/metadata/resourceVersion").to_string(),
        generation: meta.get("generation").and_then(Value::as_i64),
        spec_hash: hash(&canonical_json(&spec)),
        metadata_hash,
        spec: with_spec.then_some(spec),
        status: status_snapshot(kind, obj),
        labels,
        annotations,
        owner_refs,
        finalizers,
        deletion_timestamp: time(meta.get("deletionTimestamp")),
        creation_timestamp: time(meta.get("creationTimestamp")),
        field_managers: if with_spec {
            field_managers(&meta)
        } else {
            Vec::new()
        },
    }
}

/// `metadata.managedFields` as owners and the field paths they own (see [`FieldManager`]).
pub fn field_managers(meta: &Value) -> Vec<FieldManager> {
    let Some(list) = meta.get("managedFields").and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            let manager = e.get("manager").and_then(Value::as_str)?;
            let mut fields = Vec::new();
            if let Some(f) = e.get("fieldsV1") {
                fields_v1(f, &mut String::new(), &mut fields);
            }
            Some(FieldManager {
                manager: manager.to_string(),
                operation: s(e, "/operation").to_string(),
                subresource: e
                    .get("subresource")
                    .and_then(Value::as_str)
                    .filter(|v| !v.is_empty())
                    .map(str::to_string),
                fields,
            })
        })
        .collect()
}

/// The leaves of a `fieldsV1` tree: `f:<field>` is `.field`; `k:{"name":"web"}` is `[web]` (other keys
/// `[port=80,protocol=TCP]`); `v:<value>` is `[value]`; `i:<n>` is `[n]`; `.` (the node itself) and empty
/// maps end a path.
fn fields_v1(node: &Value, path: &mut String, out: &mut Vec<String>) {
    let Some(map) = node.as_object().filter(|m| m.keys().any(|k| k != ".")) else {
        if !path.is_empty() {
            out.push(path.clone());
        }
        return;
    };
    for (k, child) in map {
        let len = path.len();
        if let Some(f) = k.strip_prefix("f:") {
            path.push('.');
            path.push_str(f);
        } else if let Some(key) = k.strip_prefix("k:") {
            let item = match serde_json::from_str::<Map<String, Value>>(key) {
                Ok(m) if m.len() == 1 && m.contains_key("name") => {
                    m["name"].as_str().unwrap_or_default().to_string()
                }
                Ok(m) => m
                    .iter()
                    .map(|(k, v)| match v {
                        Value::String(s) => format!("{k}={s}"),
                        other => format!("{k}={other}"),
                    })
                    .collect::<Vec<_>>()
                    .join(","),
                Err(_) => key.to_string(),
            };
            path.push_str(&format!("[{item}]"));
        } else if let Some(v) = k.strip_prefix("v:") {
            let v = serde_json::from_str::<Value>(v)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| v.to_string());
            path.push_str(&format!("[{v}]"));
        } else if let Some(i) = k.strip_prefix("i:") {
            path.push_str(&format!("[{i}]"));
        } else {
            continue;
        }
        fields_v1(child, path, out);
        path.truncate(len);
    }
}

/// What decides "changed": everything but resourceVersion (which moves on writes nobody cares about,
/// such as managedFields timestamps).
pub fn digest(state: &ResourceState) -> String {
    let status = serde_json::to_value(&state.status).unwrap_or(Value::Null);
    let owners: Vec<String> = state.owner_refs.iter().map(|o| o.uid.clone()).collect();
    hash(&canonical_json(&serde_json::json!({
        "spec": state.spec_hash,
        "meta": state.metadata_hash,
        "status": status,
        "finalizers": state.finalizers,
        "deleting": state.deletion_timestamp.map(|t| t.to_rfc3339()),
        "owners": owners,
        "uid": state.uid,
        "api": state.api_version,
    })))
}

fn conditions(obj: &Value) -> Vec<Condition> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|c| Condition {
                    type_: s(c, "/type").into(),
                    status: s(c, "/status").into(),
                    reason: Some(s(c, "/reason").to_string()).filter(|r| !r.is_empty()),
                    message: Some(s(c, "/message").to_string()).filter(|r| !r.is_empty()),
                    last_transition_time: time(c.get("lastTransitionTime")),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn condition_true(conds: &[Condition], ty: &str) -> Option<bool> {
    conds
        .iter()
        .find(|c| c.type_ == ty)
        .map(|c| c.status == "True")
}

/// The status snapshot of a kind.
pub fn status_snapshot(kind: &str, obj: &Value) -> StatusSnapshot {
    let conds = conditions(obj);
    let mut snap = StatusSnapshot::default();
    let mut detail = BTreeMap::new();
    match kind {
        "Pod" => {
            let statuses = obj
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let waiting = statuses
                .iter()
                .find_map(|c| c.pointer("/state/waiting/reason").and_then(Value::as_str));
            let phase = s(obj, "/status/phase");
            snap.phase = Some(match waiting {
                Some(
                    r @ ("CrashLoopBackOff"
                    | "ContainerCreating"
                    | "ImagePullBackOff"
                    | "ErrImagePull"
                    | "CreateContainerConfigError"),
                ) => r.to_string(),
                _ => phase.to_string(),
            })
            .filter(|p| !p.is_empty());
            snap.ready = condition_true(&conds, "Ready");
            let restarts: i64 = statuses.iter().map(|c| i(c, "/restartCount")).sum();
            detail.insert("restarts".into(), restarts.to_string());
            let node = s(obj, "/spec/nodeName");
            if !node.is_empty() {
                detail.insert("node".into(), node.into());
            }
        }
        "Deployment" | "StatefulSet" | "ReplicaSet" => {
            let desired = obj
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            let r = Replicas {
                desired,
                updated: i(obj, "/status/updatedReplicas"),
                ready: i(obj, "/status/readyReplicas"),
                available: i(obj, "/status/availableReplicas"),
                observed_generation: obj
                    .pointer("/status/observedGeneration")
                    .and_then(Value::as_i64),
            };
            snap.ready =
                Some(r.available >= desired && (kind == "ReplicaSet" || r.updated >= desired));
            snap.replicas = Some(r);
        }
        "DaemonSet" => {
            let desired = i(obj, "/status/desiredNumberScheduled");
            let r = Replicas {
                desired,
                updated: i(obj, "/status/updatedNumberScheduled"),
                ready: i(obj, "/status/numberReady"),
                available: i(obj, "/status/numberAvailable"),
                observed_generation: obj
                    .pointer("/status/observedGeneration")
                    .and_then(Value::as_i64),
            };
            snap.ready = Some(r.ready >= desired);
            snap.replicas = Some(r);
        }
        "Node" => {
            snap.ready = condition_true(&conds, "Ready");
            if let Some(v) = obj
                .pointer("/status/nodeInfo/kubeletVersion")
                .and_then(Value::as_str)
            {
                detail.insert("kubeletVersion".into(), v.into());
            }
            if obj.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
                detail.insert("unschedulable".into(), "true".into());
            }
        }
        "Namespace" | "PersistentVolumeClaim" | "PersistentVolume" => {
            snap.phase = Some(s(obj, "/status/phase").to_string()).filter(|p| !p.is_empty());
        }
        "Service" => {
            detail.insert("type".into(), s(obj, "/spec/type").into());
            if let Some(ips) = obj.pointer("/spec/externalIPs").and_then(Value::as_array)
                && !ips.is_empty()
            {
                let ips: Vec<&str> = ips.iter().filter_map(Value::as_str).collect();
                detail.insert("externalIPs".into(), ips.join(","));
            }
            if let Some(lb) = obj.pointer("/status/loadBalancer/ingress/0") {
                let ip = s(lb, "/ip");
                let host = s(lb, "/hostname");
                detail.insert(
                    "loadBalancer".into(),
                    if ip.is_empty() {
                        host.into()
                    } else {
                        ip.into()
                    },
                );
            }
        }
        "Job" => {
            let (ok, failed, active) = (
                i(obj, "/status/succeeded"),
                i(obj, "/status/failed"),
                i(obj, "/status/active"),
            );
            detail.insert("succeeded".into(), ok.to_string());
            detail.insert("failed".into(), failed.to_string());
            detail.insert("active".into(), active.to_string());
            snap.phase = Some(
                if condition_true(&conds, "Failed") == Some(true) {
                    "Failed"
                } else if condition_true(&conds, "Complete") == Some(true) || ok > 0 && active == 0
                {
                    "Complete"
                } else {
                    "Running"
                }
                .to_string(),
            );
        }
        "HorizontalPodAutoscaler" => {
            detail.insert(
                "currentReplicas".into(),
                i(obj, "/status/currentReplicas").to_string(),
            );
            detail.insert(
                "desiredReplicas".into(),
                i(obj, "/status/desiredReplicas").to_string(),
            );
        }
        "PodDisruptionBudget" => {
            detail.insert(
                "disruptionsAllowed".into(),
                i(obj, "/status/disruptionsAllowed").to_string(),
            );
            snap.ready = Some(i(obj, "/status/currentHealthy") >= i(obj, "/status/desiredHealthy"));
        }
        "CustomResourceDefinition" => {
            let served: Vec<&str> = obj
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(false))
                        .filter_map(|v| v.get("name").and_then(Value::as_str))
                        .collect()
                })
                .unwrap_or_default();
            detail.insert("servedVersions".into(), served.join(","));
            snap.ready = condition_true(&conds, "Established");
        }
        "Ingress" => {
            if let Some(lb) = obj.pointer("/status/loadBalancer/ingress/0") {
                detail.insert("loadBalancer".into(), s(lb, "/ip").into());
            }
        }
        _ => {}
    }
    // conditions, minus heartbeat times that move without anything changing
    snap.conditions = conds
        .into_iter()
        .map(|mut c| {
            if kind == "Node" {
                c.message = None;
            }
            c
        })
        .collect();
    snap.detail = detail;
    snap
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<Value> {
        let path = format!(
            "{}/../../../shared/fixtures/k8s-objects/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).expect(&path);
        let doc: Value = serde_yaml::from_str(&text).expect("yaml");
        doc["items"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| vec![doc])
    }

    #[test]
    fn canonical_json_is_independent_of_key_order() {
        let a: Value =
            serde_json::from_str(r#"{"b":1,"a":{"y":[1,{"q":1,"p":2}],"x":null}}"#).unwrap();
        let b: Value =
            serde_json::from_str(r#"{"a":{"x":null,"y":[1,{"p":2,"q":1}]},"b":1}"#).unwrap();
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"x":null,"y":[1,{"p":2,"q":1}]},"b":1}"#
        );
    }

    #[test]
    fn server_managed_fields_do_not_change_the_spec_hash() {
        for pod in fixture("v1.35-pods.yaml") {
            let a = resource_state("v1", "Pod", &pod, true);
            let mut touched = pod.clone();
            touched["metadata"]["resourceVersion"] = "999999".into();
            touched["metadata"]["managedFields"] = serde_json::json!([{"manager": "x"}]);
            touched["metadata"]["annotations"] = serde_json::json!({LAST_APPLIED: "{}"});
            touched["status"]["phase"] = "Failed".into();
            touched["metadata"]["generation"] = 42.into();
            let b = resource_state("v1", "Pod", &touched, true);
            assert_eq!(a.spec_hash, b.spec_hash);
            if a.annotations.is_empty() {
                assert_eq!(
                    a.metadata_hash, b.metadata_hash,
                    "the last-applied annotation is excluded"
                );
            }
        }
    }

    #[test]
    fn spec_and_metadata_drift_are_told_apart() {
        let pod = fixture("v1.35-pods.yaml").remove(0);
        let base = resource_state("v1", "Pod", &pod, true);
        let mut labelled = pod.clone();
        labelled["metadata"]["labels"]["drift"] = "yes".into();
        let l = resource_state("v1", "Pod", &labelled, true);
        assert_eq!(l.spec_hash, base.spec_hash);
        assert_ne!(l.metadata_hash, base.metadata_hash);
        let mut respec = pod.clone();
        respec["spec"]["containers"][0]["image"] = "other:1".into();
        let r = resource_state("v1", "Pod", &respec, true);
        assert_ne!(r.spec_hash, base.spec_hash);
        assert_eq!(r.metadata_hash, base.metadata_hash);
    }

    #[test]
    fn real_objects_normalise() {
        for node in fixture("v1.35-nodes.yaml") {
            let st = resource_state("v1", "Node", &node, true);
            assert!(st.status.ready.is_some(), "{}", st.name);
            assert!(st.status.detail.contains_key("kubeletVersion"));
        }
        for svc in fixture("v1.35-services.yaml") {
            let st = resource_state("v1", "Service", &svc, true);
            assert!(st.status.detail.contains_key("type"));
            assert_eq!(
                st.spec.as_ref().map(|s| s.get("spec").is_some()),
                Some(true)
            );
        }
        for ns in fixture("v1.35-namespaces.yaml") {
            let st = resource_state("v1", "Namespace", &ns, true);
            assert_eq!(st.status.phase.as_deref(), Some("Active"));
        }
        let pods = fixture("v1.35-pods.yaml");
        assert!(!pods.is_empty());
        for pod in pods {
            let st = resource_state("v1", "Pod", &pod, true);
            assert!(st.status.phase.is_some(), "{}", st.name);
            assert!(!st.uid.is_empty());
        }
    }

    #[test]
    fn managed_fields_name_each_owner_and_its_leaves() {
        // as a 1.31 API server writes them after `kubectl apply --server-side`, an HPA scaling through
        // /scale and a `kubectl edit` of the image
        let obj = serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "managedFields": [
                {"manager": "multipilot", "operation": "Apply", "apiVersion": "apps/v1",
                 "time": "2026-11-30T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {
                    "f:metadata": {"f:labels": {"f:app": {}}},
                    "f:spec": {"f:selector": {}, "f:template": {"f:metadata": {"f:labels": {"f:app": {}}},
                        "f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:name": {},
                            "f:ports": {"k:{\"containerPort\":8080,\"protocol\":\"TCP\"}": {".": {},
                                "f:containerPort": {}}}}}}}}}},
                {"manager": "kube-controller-manager", "operation": "Update", "subresource": "scale",
                 "apiVersion": "apps/v1", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:replicas": {}}}},
                {"manager": "kubectl-edit", "operation": "Update", "apiVersion": "apps/v1",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:template": {"f:spec": {
                    "f:containers": {"k:{\"name\":\"web\"}": {"f:image": {}}}}}}}}
            ]},
            "spec": {"replicas": 5}
        });
        let st = resource_state("apps/v1", "Deployment", &obj, true);
        let got: Vec<(&str, &str, Option<&str>, Vec<&str>)> = st
            .field_managers
            .iter()
            .map(|m| {
                (
                    m.manager.as_str(),
                    m.operation.as_str(),
                    m.subresource.as_deref(),
                    m.fields.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "multipilot",
                    "Apply",
                    None,
                    vec![
                        ".metadata.labels.app",
                        ".spec.selector",
                        ".spec.template.metadata.labels.app",
                        ".spec.template.spec.containers[web].name",
                        ".spec.template.spec.containers[web].ports[containerPort=8080,protocol=TCP].containerPort",
                    ]
                ),
                (
                    "kube-controller-manager",
                    "Update",
                    Some("scale"),
                    vec![".spec.replicas"]
                ),
                (
                    "kubectl-edit",
                    "Update",
                    None,
                    vec![".spec.template.spec.containers[web].image"]
                ),
            ]
        );
        // ownership is not content: it neither enters the spec nor changes its hash
        assert!(
            st.spec
                .as_ref()
                .is_some_and(|s| s.get("metadata").is_none())
        );
    }

    #[test]
    fn secrets_carry_no_spec() {
        let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "a", "uid": "u"}, "data": {"password": "c2VjcmV0"}});
        let st = resource_state("v1", "Secret", &secret, false);
        assert!(st.spec.is_none());
        let text = serde_json::to_string(&st).unwrap();
        assert!(!text.contains("c2VjcmV0"));
    }
}
