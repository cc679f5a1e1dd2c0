//! A compact view of the cluster kept by the watchers (a few fields per object, never whole objects and
//! never managedFields): what the probes, the facts and the scraper read, so they agree with the stream
//! and cost the API server nothing.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use multipilot_schemas::payload::ObjectRef;
use serde_json::Value;

use crate::normalize::{LAST_APPLIED, object_ref, strings};

/// A node, as the probes need it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeView {
    /// Ready condition (None: not reported).
    pub ready: Option<bool>,
    /// Ready condition's reason/message.
    pub reason: String,
    /// Control-plane role label.
    pub control_plane: bool,
    /// GPU model label.
    pub gpu_model: Option<String>,
    /// `nvidia.com/cuda.driver.major` (and minor) labels, as `535.183`.
    pub gpu_driver: Option<String>,
    /// `nvidia.com/gpu` capacity.
    pub gpu_capacity: u32,
    /// `nvidia.com/gpu` allocatable.
    pub gpu_allocatable: u32,
    /// `status.nodeInfo`: OS image, kernel version, container runtime.
    pub software: (String, String, String),
}

/// A Deployment or DaemonSet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkloadView {
    /// Reference.
    pub object: ObjectRef,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Container images.
    pub images: Vec<String>,
    /// Desired replicas / scheduled pods.
    pub desired: i64,
    /// Ready.
    pub ready: i64,
}

/// A pod that asks for GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuPod {
    /// Reference.
    pub object: ObjectRef,
    /// Derived phase (ContainerCreating, CrashLoopBackOff, Running…).
    pub phase: String,
    /// Node.
    pub node: String,
    /// GPUs requested.
    pub gpus: u32,
}

/// An object being deleted.
#[derive(Debug, Clone, PartialEq)]
pub struct Terminating {
    /// Reference.
    pub object: ObjectRef,
    /// deletionTimestamp (cluster clock).
    pub since: DateTime<Utc>,
    /// Finalizers left.
    pub finalizers: Vec<String>,
}

/// Where to scrape metrics (found through `prometheus.io/*` annotations, as Prometheus' Kubernetes
/// discovery does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeTarget {
    /// `pods` or `services`.
    pub resource: &'static str,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Port.
    pub port: String,
    /// Path.
    pub path: String,
    /// Job label (the app name label, else the object name).
    pub job: String,
}

impl ScrapeTarget {
    /// The API server proxy path of the target.
    pub fn proxy_path(&self) -> String {
        format!(
            "/api/v1/namespaces/{}/{}/{}:{}/proxy{}",
            self.namespace, self.resource, self.name, self.port, self.path
        )
    }
}

/// The view itself.
#[derive(Debug)]
pub struct View {
    inner: Mutex<Inner>,
    /// Per probe, a counter bumped whenever something that probe reads changed (a node's Ready
    /// condition, a CNI or device-plugin DaemonSet, a GPU pod's state…): probes run at once on a change
    /// instead of waiting for their next round.
    changed: tokio::sync::watch::Sender<BTreeMap<&'static str, u64>>,
}

impl Default for View {
    fn default() -> Self {
        View {
            inner: Mutex::default(),
            changed: tokio::sync::watch::channel(BTreeMap::new()).0,
        }
    }
}

/// Whether a workload is one the probes read, and which.
fn probes_reading(w: &WorkloadView) -> &'static [&'static str] {
    let kind = w.object.kind.as_str();
    let name = w.object.name.as_str();
    if kind == "DaemonSet"
        && crate::cluster::CNI_DAEMONSETS
            .iter()
            .any(|(n, _)| *n == name)
    {
        &["cni"]
    } else if kind == "DaemonSet"
        && (name.contains("nvidia-device-plugin")
            || w.images.iter().any(|i| i.contains("k8s-device-plugin")))
    {
        &["gpu-device-plugin"]
    } else if kind == "Deployment"
        && (name == "coredns" || w.labels.get("k8s-app").is_some_and(|v| v == "kube-dns"))
    {
        &["coredns"]
    } else {
        &[]
    }
}

/// What the view holds.
#[derive(Debug, Default, Clone)]
pub struct Inner {
    /// Nodes by name.
    pub nodes: BTreeMap<String, NodeView>,
    /// Deployments and DaemonSets by `kind/ns/name`.
    pub workloads: BTreeMap<String, WorkloadView>,
    /// GPU pods by `ns/name`.
    pub gpu_pods: BTreeMap<String, GpuPod>,
    /// Objects being deleted by `kind/ns/name`.
    pub terminating: BTreeMap<String, Terminating>,
    /// Services with `spec.externalIPs` by `ns/name`.
    pub external_ips: BTreeMap<String, (ObjectRef, Vec<String>)>,
    /// The API version each object was last applied with (`kubectl apply` annotation), by `kind/ns/name`.
    pub last_applied: BTreeMap<String, (ObjectRef, String)>,
    /// Scrape targets by `resource/ns/name`.
    pub scrape: BTreeMap<String, ScrapeTarget>,
    /// IngressClass names.
    pub ingress_classes: BTreeMap<String, ()>,
    /// StorageClass names → is default.
    pub storage_classes: BTreeMap<String, bool>,
    /// GPUs requested per node.
    pub gpu_requests: BTreeMap<String, u32>,
}

fn key(kind: &str, obj: &Value) -> String {
    format!(
        "{kind}/{}/{}",
        obj.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or(""),
        obj.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
    )
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

fn label(obj: &Value, name: &str) -> Option<String> {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(name))
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn annotation(obj: &Value, name: &str) -> Option<String> {
    obj.pointer("/metadata/annotations")
        .and_then(|l| l.get(name))
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn quantity_u32(v: Option<&Value>) -> u32 {
    v.and_then(Value::as_str)
        .and_then(|q| q.parse().ok())
        .or_else(|| v.and_then(Value::as_u64).map(|n| n as u32))
        .unwrap_or(0)
}

fn pod_gpus(obj: &Value) -> u32 {
    obj.pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .map(|c| quantity_u32(c.pointer("/resources/limits/nvidia.com~1gpu")))
                .sum()
        })
        .unwrap_or(0)
}

impl View {
    /// Change counters per probe, each bumped when something that probe reads changed: the probes run at
    /// once on a change instead of waiting for their next round.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<BTreeMap<&'static str, u64>> {
        self.changed.subscribe()
    }

    fn bump(&self, probes: &[&'static str]) {
        if probes.is_empty() {
            return;
        }
        self.changed.send_modify(|m| {
            for p in probes {
                *m.entry(p).or_default() += 1;
            }
        });
    }

    /// A lock on the view's data, to read it.
    pub fn read(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an object (after an add or a change).
    pub fn apply(&self, api_version: &str, kind: &str, obj: &Value) {
        let touched = self.apply_inner(api_version, kind, obj);
        self.bump(&touched);
    }

    /// Records an object; returns the probes whose input changed.
    fn apply_inner(&self, api_version: &str, kind: &str, obj: &Value) -> Vec<&'static str> {
        let mut touched = Vec::new();
        let mut v = self.read();
        let k = key(kind, obj);
        let oref = object_ref(api_version, kind, obj);
        // objects being deleted
        match obj
            .pointer("/metadata/deletionTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        {
            Some(since) => {
                let finalizers = strings(obj.pointer("/metadata/finalizers"));
                let t = Terminating {
                    object: oref.clone(),
                    since: since.with_timezone(&Utc),
                    finalizers,
                };
                if v.terminating.insert(k.clone(), t.clone()).as_ref() != Some(&t) {
                    touched.push("finalizers");
                }
            }
            None => {
                if v.terminating.remove(&k).is_some() {
                    touched.push("finalizers");
                }
            }
        }
        // last applied API version
        match annotation(obj, LAST_APPLIED)
            .and_then(|a| serde_json::from_str::<Value>(&a).ok())
            .and_then(|a| {
                a.get("apiVersion")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            }) {
            Some(api) => {
                let new = (oref.clone(), api);
                if v.last_applied.insert(k.clone(), new.clone()).as_ref() != Some(&new) {
                    touched.push("deprecated-apis");
                }
            }
            None => {
                if v.last_applied.remove(&k).is_some() {
                    touched.push("deprecated-apis");
                }
            }
        }
        // scrape targets
        let scrape_key = format!(
            "{}/{}",
            if kind == "Pod" { "pods" } else { "services" },
            &k[kind.len() + 1..]
        );
        if matches!(kind, "Pod" | "Service") {
            if annotation(obj, "prometheus.io/scrape").as_deref() == Some("true")
                && (kind == "Service" || s(obj, "/status/phase") == "Running")
            {
                let name = s(obj, "/metadata/name").to_string();
                v.scrape.insert(
                    scrape_key,
                    ScrapeTarget {
                        resource: if kind == "Pod" { "pods" } else { "services" },
                        namespace: s(obj, "/metadata/namespace").to_string(),
                        port: annotation(obj, "prometheus.io/port")
                            .unwrap_or_else(|| "metrics".into()),
                        path: annotation(obj, "prometheus.io/path")
                            .unwrap_or_else(|| "/metrics".into()),
                        job: label(obj, "app.kubernetes.io/name")
                            .or_else(|| label(obj, "k8s-app"))
                            .unwrap_or_else(|| name.clone()),
                        name,
                    },
                );
            } else {
                v.scrape.remove(&scrape_key);
            }
        }
        match kind {
            "Node" => {
                let ready_cond = obj
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"));
                let driver = label(obj, "nvidia.com/cuda.driver.major").map(|maj| {
                    match label(obj, "nvidia.com/cuda.driver.minor") {
                        Some(min) => format!("{maj}.{min}"),
                        None => maj,
                    }
                });
                let labels = obj.pointer("/metadata/labels");
                let node = NodeView {
                    ready: ready_cond.map(|c| c["status"] == "True"),
                    reason: ready_cond
                        .map(|c| {
                            format!("{} {}", s(c, "/reason"), s(c, "/message"))
                                .trim()
                                .to_string()
                        })
                        .unwrap_or_default(),
                    control_plane: labels.is_some_and(|l| {
                        l.get("node-role.kubernetes.io/control-plane").is_some()
                            || l.get("node-role.kubernetes.io/master").is_some()
                    }),
                    gpu_model: label(obj, "nvidia.com/gpu.product"),
                    gpu_driver: driver,
                    gpu_capacity: quantity_u32(obj.pointer("/status/capacity/nvidia.com~1gpu")),
                    gpu_allocatable: quantity_u32(
                        obj.pointer("/status/allocatable/nvidia.com~1gpu"),
                    ),
                    software: (
                        s(obj, "/status/nodeInfo/osImage").to_string(),
                        s(obj, "/status/nodeInfo/kernelVersion").to_string(),
                        s(obj, "/status/nodeInfo/containerRuntimeVersion").to_string(),
                    ),
                };
                let gpu = node.gpu_capacity > 0 || node.gpu_model.is_some();
                let old = v
                    .nodes
                    .insert(s(obj, "/metadata/name").to_string(), node.clone());
                if old.as_ref() != Some(&node) {
                    touched.push("nodes");
                    if gpu {
                        touched.push("gpu-device-plugin");
                    }
                }
            }
            "Deployment" | "DaemonSet" => {
                let images = obj
                    .pointer("/spec/template/spec/containers")
                    .and_then(Value::as_array)
                    .map(|cs| cs.iter().map(|c| s(c, "/image").to_string()).collect())
                    .unwrap_or_default();
                let (desired, ready) = if kind == "DaemonSet" {
                    (
                        obj.pointer("/status/desiredNumberScheduled")
                            .and_then(Value::as_i64)
                            .unwrap_or(0),
                        obj.pointer("/status/numberReady")
                            .and_then(Value::as_i64)
                            .unwrap_or(0),
                    )
                } else {
                    (
                        obj.pointer("/spec/replicas")
                            .and_then(Value::as_i64)
                            .unwrap_or(1),
                        obj.pointer("/status/readyReplicas")
                            .and_then(Value::as_i64)
                            .unwrap_or(0),
                    )
                };
                let labels = obj
                    .pointer("/metadata/labels")
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                            .collect()
                    })
                    .unwrap_or_default();
                let w = WorkloadView {
                    object: oref,
                    labels,
                    images,
                    desired,
                    ready,
                };
                let readers = probes_reading(&w);
                if !readers.is_empty() && v.workloads.get(&k) != Some(&w) {
                    touched.extend_from_slice(readers);
                }
                v.workloads.insert(k, w);
            }
            "Pod" => {
                let gpus = pod_gpus(obj);
                let pk = k[4..].to_string();
                if gpus > 0 {
                    let waiting = obj
                        .pointer("/status/containerStatuses")
                        .and_then(Value::as_array)
                        .and_then(|cs| {
                            cs.iter().find_map(|c| {
                                c.pointer("/state/waiting/reason").and_then(Value::as_str)
                            })
                        });
                    let p = GpuPod {
                        object: oref,
                        phase: waiting.unwrap_or(s(obj, "/status/phase")).to_string(),
                        node: s(obj, "/spec/nodeName").to_string(),
                        gpus,
                    };
                    if v.gpu_pods.insert(pk, p.clone()).as_ref() != Some(&p) {
                        touched.push("gpu-device-plugin");
                    }
                } else if v.gpu_pods.remove(&pk).is_some() {
                    touched.push("gpu-device-plugin");
                }
                let mut per_node = BTreeMap::new();
                for p in v.gpu_pods.values() {
                    *per_node.entry(p.node.clone()).or_insert(0) += p.gpus;
                }
                v.gpu_requests = per_node;
            }
            "Service" => {
                let ips = strings(obj.pointer("/spec/externalIPs"));
                let sk = k[8..].to_string();
                if ips.is_empty() {
                    if v.external_ips.remove(&sk).is_some() {
                        touched.push("external-ips");
                    }
                } else {
                    let new = (oref, ips);
                    if v.external_ips.insert(sk, new.clone()).as_ref() != Some(&new) {
                        touched.push("external-ips");
                    }
                }
            }
            "IngressClass" => {
                v.ingress_classes
                    .insert(s(obj, "/metadata/name").to_string(), ());
            }
            "StorageClass" => {
                let default = annotation(obj, "storageclass.kubernetes.io/is-default-class")
                    .as_deref()
                    == Some("true");
                v.storage_classes
                    .insert(s(obj, "/metadata/name").to_string(), default);
            }
            _ => {}
        }
        touched
    }

    /// Forgets an object (deleted).
    pub fn remove(&self, kind: &str, namespace: Option<&str>, name: &str) {
        let mut touched: Vec<&'static str> = Vec::new();
        {
            let mut v = self.read();
            Self::remove_inner(&mut v, kind, namespace, name, &mut touched);
        }
        self.bump(&touched);
    }

    fn remove_inner(
        v: &mut Inner,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        touched: &mut Vec<&'static str>,
    ) {
        let ns = namespace.unwrap_or("");
        let k = format!("{kind}/{ns}/{name}");
        if v.terminating.remove(&k).is_some() {
            touched.push("finalizers");
        }
        if v.last_applied.remove(&k).is_some() {
            touched.push("deprecated-apis");
        }
        match kind {
            "Node" => {
                let gone = v.nodes.remove(name);
                if gone.is_some() {
                    touched.extend(["nodes", "gpu-device-plugin"]);
                }
            }
            "Deployment" | "DaemonSet" => {
                if let Some(w) = v.workloads.remove(&k) {
                    touched.extend_from_slice(probes_reading(&w));
                }
            }
            "Pod" => {
                if v.gpu_pods.remove(&format!("{ns}/{name}")).is_some() {
                    touched.push("gpu-device-plugin");
                }
                v.scrape.remove(&format!("pods/{ns}/{name}"));
            }
            "Service" => {
                if v.external_ips.remove(&format!("{ns}/{name}")).is_some() {
                    touched.push("external-ips");
                }
                v.scrape.remove(&format!("services/{ns}/{name}"));
            }
            "IngressClass" => {
                v.ingress_classes.remove(name);
            }
            "StorageClass" => {
                v.storage_classes.remove(name);
            }
            _ => {}
        }
    }

    /// A copy of the data.
    pub fn snapshot(&self) -> Inner {
        self.read().clone()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(ready: &str, gpu: bool) -> Value {
        let mut labels = json!({});
        if gpu {
            labels["nvidia.com/gpu.product"] = json!("A100");
        }
        json!({"metadata": {"name": "worker-2", "labels": labels},
               "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "KubeletNotReady"}]}})
    }

    #[test]
    fn a_change_a_probe_reads_wakes_that_probe_and_nothing_else_does() {
        let view = View::default();
        let rx = view.subscribe();
        let count = |p: &str| rx.borrow().get(p).copied().unwrap_or(0);
        view.apply("v1", "Node", &node("True", false));
        assert_eq!((count("nodes"), count("gpu-device-plugin")), (1, 0));
        // the same node again (a status heartbeat): nothing a probe reads changed
        view.apply("v1", "Node", &node("True", false));
        assert_eq!(count("nodes"), 1);
        // Ready turns False
        view.apply("v1", "Node", &node("False", false));
        assert_eq!(count("nodes"), 2);
        // a GPU node also wakes the device-plugin probe
        view.apply("v1", "Node", &node("False", true));
        assert_eq!((count("nodes"), count("gpu-device-plugin")), (3, 1));
        // an ordinary Deployment rolling wakes nobody; CoreDNS losing a ready replica wakes the DNS probe
        let dep = |name: &str, ready: i64| {
            json!({"metadata": {"name": name, "namespace": "kube-system"},
                   "spec": {"replicas": 2, "template": {"spec": {"containers": [{"image": "x:1"}]}}},
                   "status": {"readyReplicas": ready}})
        };
        view.apply("apps/v1", "Deployment", &dep("web", 1));
        view.apply("apps/v1", "Deployment", &dep("web", 2));
        view.apply("apps/v1", "Deployment", &dep("coredns", 2));
        view.apply("apps/v1", "Deployment", &dep("coredns", 0));
        assert_eq!(count("coredns"), 2);
        assert_eq!(count("cni"), 0);
        // a Service getting externalIPs, and losing them by deletion
        let svc = json!({"metadata": {"name": "dbg", "namespace": "default"},
                         "spec": {"externalIPs": ["203.0.113.9"]}});
        view.apply("v1", "Service", &svc);
        view.remove("Service", Some("default"), "dbg");
        assert_eq!(count("external-ips"), 2);
        view.remove("Node", None, "worker-2");
        assert_eq!(count("nodes"), 4);
    }
}
