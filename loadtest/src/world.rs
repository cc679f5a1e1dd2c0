//! What lives in a virtual cluster: the seeded objects (system components, GPU nodes, team workloads),
//! the controllers that move them (rollouts, leases), the churn, and the faults that break them.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, Overload};
use crate::event::{EventRecord, ObjectRef};
use crate::store::{EventMut, Pointer, ResKey, str_at};

/// The NVIDIA driver major version the GPU nodes run.
pub const GPU_DRIVER_MAJOR: &str = "535";
/// The device plugin version compatible with it.
pub const DEVICE_PLUGIN_OK: &str = "v0.14.5";
/// The device plugin version the mismatch fault rolls out (needs driver ≥ 550).
pub const DEVICE_PLUGIN_NEW: &str = "v0.17.0";

fn rk(group: &str, plural: &str) -> ResKey {
    ResKey::new(group, plural)
}

/// Writes an object with server fields stamped (uid, creationTimestamp, generation).
pub fn put(c: &Cluster, group: &str, plural: &str, mut obj: Value) -> Option<Arc<Value>> {
    obj["metadata"]["uid"] = json!(c.uid());
    obj["metadata"]["creationTimestamp"] = json!(c.now_str());
    if obj.get("spec").is_some() {
        obj["metadata"]["generation"] = json!(1);
    }
    c.store.create(&rk(group, plural), obj).ok()
}

/// Changes an object in place (no-op when absent).
pub fn change(
    c: &Cluster,
    group: &str,
    plural: &str,
    ns: &str,
    name: &str,
    f: impl FnOnce(&mut Value),
) {
    let _ = c.store.mutate(&rk(group, plural), ns, name, |cur| {
        let Some(cur) = cur else {
            return Ok(None);
        };
        let mut next = cur.clone();
        f(&mut next);
        if next != *cur {
            // as the API server does for every write: the writer's managedFields entry carries the time
            stamp_manager(&mut next, CONTROLLER_MANAGER, &c.now_str());
        }
        if next.get("spec") != cur.get("spec") && next.get("spec").is_some() {
            let g = cur
                .at("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            next["metadata"]["generation"] = json!(g + 1);
        }
        let deleting = next.at("/metadata/deletionTimestamp").is_some();
        let finalizers = next
            .at("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        Ok(if deleting && !finalizers {
            None
        } else {
            Some(next)
        })
    });
}

/// The field manager the simulator's controllers write as.
const CONTROLLER_MANAGER: &str = "kube-controller-manager";

/// Sets `manager`'s `Update` entry in `metadata.managedFields` to `time` (adding it when missing; it owns no
/// fields, so server-side apply conflicts are not affected). What the agent reads an object's change time from.
fn stamp_manager(obj: &mut Value, manager: &str, time: &str) {
    let api = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("v1")
        .to_string();
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let list = meta
        .entry("managedFields")
        .or_insert_with(|| Value::Array(Vec::new()));
    let Some(list) = list.as_array_mut() else {
        return;
    };
    match list.iter_mut().find(|e| {
        e.get("manager").and_then(Value::as_str) == Some(manager)
            && e.get("operation").and_then(Value::as_str) == Some("Update")
    }) {
        Some(e) => e["time"] = json!(time),
        None => list.push(json!({
            "manager": manager, "operation": "Update", "apiVersion": api, "time": time,
            "fieldsType": "FieldsV1", "fieldsV1": {},
        })),
    }
}

/// Removes an object (ignoring finalizers: the simulator's controllers own these objects).
pub fn remove(c: &Cluster, group: &str, plural: &str, ns: &str, name: &str) {
    let _ = c.store.mutate(&rk(group, plural), ns, name, |_| Ok(None));
}

fn suffix(c: &Cluster, n: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = c.rng();
    (0..n)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn meta(ns: &str, name: &str, labels: Value) -> Value {
    let mut m = json!({"name": name, "labels": labels});
    if !ns.is_empty() {
        m["namespace"] = json!(ns);
    }
    m
}

/// Seeds the cluster's objects.
pub fn seed(c: &Cluster) {
    let minor = c.profile().minor;
    let kubelet = c.profile().git_version.clone();
    // namespaces
    for (ns, pss) in [
        ("default", None),
        ("kube-system", Some("privileged")),
        ("kube-public", None),
        ("kube-node-lease", None),
        ("monitoring", Some("baseline")),
        ("ingress-nginx", Some("baseline")),
        ("gpu-operator", Some("privileged")),
    ] {
        namespace(c, ns, pss);
    }
    // nodes
    let workers = 3 + (c.settings.seed % 3) as usize;
    let mut nodes = vec![format!("{}-cp-0", c.name())];
    for i in 0..workers {
        nodes.push(format!("{}-worker-{i}", c.name()));
    }
    let gpu_nodes: Vec<String> = (0..2).map(|i| format!("{}-gpu-{i}", c.name())).collect();
    for n in &nodes {
        node(c, n, &kubelet, n.contains("-cp-"), false);
    }
    for n in &gpu_nodes {
        node(c, n, &kubelet, false, true);
    }
    let all_nodes: Vec<String> = nodes.iter().chain(gpu_nodes.iter()).cloned().collect();
    // control plane leases
    for holder in ["kube-scheduler", "kube-controller-manager"] {
        put(
            c,
            "coordination.k8s.io",
            "leases",
            json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": meta("kube-system", holder, json!({})),
                "spec": {"holderIdentity": format!("{}-cp-0_{}", c.name(), c.uid()), "leaseDurationSeconds": c.settings.lease_duration_s, "acquireTime": c.now_micro(), "renewTime": c.now_micro(), "leaseTransitions": 1}
            }),
        );
    }
    // system workloads
    let cni = if c.settings.seed.is_multiple_of(2) {
        ("calico-node", "docker.io/calico/node:v3.27.3")
    } else {
        ("cilium", "quay.io/cilium/cilium:v1.15.6")
    };
    daemonset(
        c,
        "kube-system",
        cni.0,
        cni.1,
        &all_nodes,
        json!({"k8s-app": cni.0}),
    );
    daemonset(
        c,
        "kube-system",
        "kube-proxy",
        &format!("registry.k8s.io/kube-proxy:{kubelet}"),
        &all_nodes,
        json!({"k8s-app": "kube-proxy"}),
    );
    deployment(
        c,
        "kube-system",
        "coredns",
        2,
        "registry.k8s.io/coredns/coredns:v1.11.1",
        json!({"k8s-app": "kube-dns"}),
        &nodes,
    );
    service(
        c,
        "kube-system",
        "kube-dns",
        "ClusterIP",
        json!({"k8s-app": "kube-dns"}),
        &[("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")],
        Some("10.96.0.10"),
    );
    endpoints(c, "kube-system", "kube-dns", true);
    daemonset(
        c,
        "gpu-operator",
        "nvidia-device-plugin-daemonset",
        &format!("nvcr.io/nvidia/k8s-device-plugin:{DEVICE_PLUGIN_OK}"),
        &gpu_nodes,
        json!({"app.kubernetes.io/name": "nvidia-device-plugin", "app.kubernetes.io/version": DEVICE_PLUGIN_OK}),
    );
    change(
        c,
        "apps",
        "daemonsets",
        "gpu-operator",
        "nvidia-device-plugin-daemonset",
        |d| {
            d["spec"]["template"]["spec"]["nodeSelector"] =
                json!({"nvidia.com/gpu.present": "true"});
        },
    );
    // monitoring
    deployment(
        c,
        "monitoring",
        "kube-state-metrics",
        1,
        "registry.k8s.io/kube-state-metrics/kube-state-metrics:v2.12.0",
        json!({"app.kubernetes.io/name": "kube-state-metrics"}),
        &nodes,
    );
    service(
        c,
        "monitoring",
        "kube-state-metrics",
        "ClusterIP",
        json!({"app.kubernetes.io/name": "kube-state-metrics"}),
        &[("http-metrics", 8080, "TCP")],
        None,
    );
    change(c, "", "services", "monitoring", "kube-state-metrics", |s| {
        s["metadata"]["annotations"] = json!({"prometheus.io/scrape": "true", "prometheus.io/port": "8080", "prometheus.io/path": "/metrics"});
    });
    daemonset(
        c,
        "monitoring",
        "node-exporter",
        "quay.io/prometheus/node-exporter:v1.8.1",
        &all_nodes,
        json!({"app.kubernetes.io/name": "node-exporter"}),
    );
    for p in c.store.all(&rk("", "pods"), Some("monitoring")) {
        if str_at(&p, &["metadata", "labels", "app.kubernetes.io/name"]) == "node-exporter" {
            let name = str_at(&p, &["metadata", "name"]).to_string();
            change(c, "", "pods", "monitoring", &name, |p| {
                p["metadata"]["annotations"] = json!({"prometheus.io/scrape": "true", "prometheus.io/port": "9100", "prometheus.io/path": "/metrics"});
            });
        }
    }
    for fixture in c.settings.metric_fixtures.keys() {
        let mut pod = pod_obj(
            c,
            "monitoring",
            &format!("fixture-{fixture}"),
            "registry.k8s.io/pause:3.9",
            json!({"app.kubernetes.io/name": "metrics-fixture"}),
            &nodes[0],
            "Running",
        );
        pod["metadata"]["annotations"] = json!({"prometheus.io/scrape": "true", "prometheus.io/port": "9090", "prometheus.io/path": "/metrics", "sim.multipilot.dev/fixture": fixture});
        put(c, "", "pods", pod);
    }
    statefulset(
        c,
        "monitoring",
        "prometheus",
        2,
        "quay.io/prometheus/prometheus:v2.53.0",
    );
    // ingress
    deployment(
        c,
        "ingress-nginx",
        "ingress-nginx-controller",
        2,
        "registry.k8s.io/ingress-nginx/controller:v1.10.1",
        json!({"app.kubernetes.io/name": "ingress-nginx"}),
        &nodes,
    );
    service(
        c,
        "ingress-nginx",
        "ingress-nginx-controller",
        "LoadBalancer",
        json!({"app.kubernetes.io/name": "ingress-nginx"}),
        &[("http", 80, "TCP"), ("https", 443, "TCP")],
        None,
    );
    change(
        c,
        "",
        "services",
        "ingress-nginx",
        "ingress-nginx-controller",
        |s| {
            s["spec"]["externalTrafficPolicy"] = json!("Local");
            s["status"] = json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}});
        },
    );
    // the components' effective settings, the same on every cluster until someone changes one (what the
    // correlator's fleet-consistency report compares)
    put(
        c,
        "",
        "configmaps",
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": meta("ingress-nginx", "ingress-nginx-controller", json!({"app.kubernetes.io/name": "ingress-nginx"})),
            "data": INGRESS_SETTINGS.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>()}),
    );
    put(
        c,
        "",
        "configmaps",
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": meta("kube-system", "coredns", json!({"k8s-app": "kube-dns"})),
            "data": {"Corefile": ".:53 {\n    errors\n    health\n    kubernetes cluster.local in-addr.arpa ip6.arpa {\n       pods insecure\n       fallthrough in-addr.arpa ip6.arpa\n    }\n    forward . /etc/resolv.conf\n    cache 30\n    loop\n    reload\n}\n"}}),
    );
    put(
        c,
        "",
        "configmaps",
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": meta("kube-system", "kube-proxy", json!({"app": "kube-proxy"})),
            "data": {"config.conf": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n"}}),
    );
    put(
        c,
        "networking.k8s.io",
        "ingressclasses",
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": meta("", "nginx", json!({"app.kubernetes.io/name": "ingress-nginx"})),
            "spec": {"controller": "k8s.io/ingress-nginx"}
        }),
    );
    // cluster-wide config
    for (name, provisioner, default) in [
        ("standard", "ebs.csi.aws.com", true),
        ("fast", "ebs.csi.aws.com", false),
    ] {
        let mut sc = json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": meta("", name, json!({})),
            "provisioner": provisioner, "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer",
            "parameters": {"type": if default {"gp3"} else {"io2"}}
        });
        if default {
            sc["metadata"]["annotations"] =
                json!({"storageclass.kubernetes.io/is-default-class": "true"});
        }
        put(c, "storage.k8s.io", "storageclasses", sc);
    }
    for (name, group, kind, versions) in [
        (
            "certificates.cert-manager.io",
            "cert-manager.io",
            "Certificate",
            vec!["v1"],
        ),
        (
            "servicemonitors.monitoring.coreos.com",
            "monitoring.coreos.com",
            "ServiceMonitor",
            vec!["v1"],
        ),
        (
            "clusterpolicies.nvidia.com",
            "nvidia.com",
            "ClusterPolicy",
            vec!["v1", "v1alpha1"],
        ),
    ] {
        let plural = name.split('.').next().unwrap_or(name);
        put(
            c,
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            json!({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": meta("", name, json!({})),
                "spec": {"group": group, "scope": "Namespaced", "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                    "versions": versions.iter().enumerate().map(|(i, v)| json!({"name": v, "served": true, "storage": i == 0, "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}})).collect::<Vec<_>>()},
                "status": {"acceptedNames": {"kind": kind, "plural": plural}, "storedVersions": [versions[0]]}
            }),
        );
    }
    for (name, rules) in [
        (
            "multipilot-agent",
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]),
        ),
        (
            "view-all",
            json!([{"apiGroups": [""], "resources": ["pods", "services"], "verbs": ["get", "list"]}]),
        ),
        (
            "cluster-admin-ish",
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        ),
    ] {
        put(
            c,
            "rbac.authorization.k8s.io",
            "clusterroles",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta("", name, json!({})), "rules": rules}),
        );
        put(
            c,
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta("", name, json!({})),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "kube-system"}]
            }),
        );
    }
    // an object applied long ago with an API version this cluster may no longer serve
    if minor <= 24 {
        let mut pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta("kube-system", "coredns", json!({"k8s-app": "kube-dns"})), "spec": {"minAvailable": 1, "selector": {"matchLabels": {"k8s-app": "kube-dns"}}}});
        pdb["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/last-applied-configuration": "{\"apiVersion\":\"policy/v1beta1\",\"kind\":\"PodDisruptionBudget\",\"metadata\":{\"name\":\"coredns\",\"namespace\":\"kube-system\"},\"spec\":{\"minAvailable\":1,\"selector\":{\"matchLabels\":{\"k8s-app\":\"kube-dns\"}}}}\n"});
        put(c, "policy", "poddisruptionbudgets", pdb);
    }
    // team workloads until the object target is met
    let teams = [
        "payments",
        "search",
        "checkout",
        "ml-training",
        "identity",
        "catalog",
        "ledger",
        "notifications",
    ];
    let mut t = 0;
    while c.store.len() < c.settings.objects {
        let team = teams[t % teams.len()];
        let ns = if t < teams.len() {
            team.to_string()
        } else {
            format!("{team}-{}", t / teams.len())
        };
        team_namespace(c, &ns, team, &nodes, &gpu_nodes, t);
        t += 1;
        if t > 10_000 {
            break;
        }
    }
    // a few events to start with
    for p in c.store.all(&rk("", "pods"), None).iter().take(10) {
        event(
            c,
            p,
            "Normal",
            "Scheduled",
            &format!(
                "Successfully assigned {}/{} to {}",
                str_at(p, &["metadata", "namespace"]),
                str_at(p, &["metadata", "name"]),
                str_at(p, &["spec", "nodeName"])
            ),
            "default-scheduler",
        );
    }
}

fn namespace(c: &Cluster, ns: &str, pss: Option<&str>) {
    let mut labels = json!({"kubernetes.io/metadata.name": ns});
    if let Some(level) = pss {
        labels["pod-security.kubernetes.io/enforce"] = json!(level);
        labels["pod-security.kubernetes.io/enforce-version"] = json!("latest");
    }
    put(
        c,
        "",
        "namespaces",
        json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": meta("", ns, labels),
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}
        }),
    );
}

/// The node OS images, kernels and container runtimes the simulated clusters run (by seed).
const NODE_SOFTWARE: [(&str, &str, &str); 3] = [
    (
        "Ubuntu 22.04.4 LTS",
        "5.15.0-1057-aws",
        "containerd://1.7.13",
    ),
    (
        "Bottlerocket OS 1.19.2 (aws-k8s-1.29)",
        "6.1.82",
        "containerd://1.6.31+bottlerocket",
    ),
    (
        "Container-Optimized OS from Google",
        "6.1.58+",
        "containerd://1.7.10",
    ),
];

fn node(c: &Cluster, name: &str, kubelet: &str, control_plane: bool, gpu: bool) {
    let mut labels = json!({
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": if gpu {"p4d.24xlarge"} else {"m6i.2xlarge"},
        "topology.kubernetes.io/zone": format!("zone-{}", (crate::hash64(name) % 3) as u8 + b'a' - b'a'),
    });
    if control_plane {
        labels["node-role.kubernetes.io/control-plane"] = json!("");
    }
    let mut capacity = json!({"cpu": if gpu {"96"} else {"8"}, "memory": if gpu {"1176334340Ki"} else {"32587164Ki"}, "pods": "110", "ephemeral-storage": "101430960Ki"});
    if gpu {
        labels["nvidia.com/gpu.present"] = json!("true");
        labels["nvidia.com/gpu.product"] = json!("NVIDIA-A100-SXM4-40GB");
        labels["nvidia.com/gpu.count"] = json!("8");
        labels["nvidia.com/cuda.driver.major"] = json!(GPU_DRIVER_MAJOR);
        labels["nvidia.com/cuda.driver.minor"] = json!("183");
        capacity["nvidia.com/gpu"] = json!("8");
    }
    let ip = format!(
        "10.0.{}.{}",
        crate::hash64(name) % 200,
        crate::hash64(&format!("{name}/ip")) % 250 + 2
    );
    let now = c.now_str();
    // the nodes' software differs from cluster to cluster, as in a real fleet of several clouds
    let (os_image, kernel, runtime) =
        NODE_SOFTWARE[(c.settings.seed % NODE_SOFTWARE.len() as u64) as usize];
    put(
        c,
        "",
        "nodes",
        json!({
            "apiVersion": "v1", "kind": "Node", "metadata": meta("", name, labels),
            "spec": {"podCIDR": "10.244.0.0/24", "providerID": format!("aws:///zone/{name}"), "taints": if control_plane {json!([{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}])} else {json!([])}},
            "status": {
                "capacity": capacity.clone(), "allocatable": capacity,
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "lastHeartbeatTime": now, "lastTransitionTime": now},
                    {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure", "lastHeartbeatTime": now, "lastTransitionTime": now},
                    {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID", "lastHeartbeatTime": now, "lastTransitionTime": now},
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}
                ],
                "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                "nodeInfo": {"kubeletVersion": kubelet, "kubeProxyVersion": kubelet, "containerRuntimeVersion": runtime, "osImage": os_image, "kernelVersion": kernel, "operatingSystem": "linux", "architecture": "amd64"}
            }
        }),
    );
}

fn pod_template(image: &str, labels: &Value) -> Value {
    let name = image
        .rsplit('/')
        .next()
        .unwrap_or(image)
        .split(':')
        .next()
        .unwrap_or("app");
    json!({
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": name, "image": image, "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}}]}
    })
}

/// A pod object (not stored).
pub fn pod_obj(
    c: &Cluster,
    ns: &str,
    name: &str,
    image: &str,
    labels: Value,
    node: &str,
    state: &str,
) -> Value {
    let tpl = pod_template(image, &labels);
    let container = tpl["spec"]["containers"][0]["name"].clone();
    let now = c.now_str();
    let (phase, cstate, ready, restarts) = match state {
        "CrashLoopBackOff" => (
            "Running",
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off 5m0s restarting failed container={} pod={name}", container.as_str().unwrap_or(""))}}),
            false,
            7,
        ),
        "ContainerCreating" => (
            "Pending",
            json!({"waiting": {"reason": "ContainerCreating"}}),
            false,
            0,
        ),
        "Pending" => ("Pending", Value::Null, false, 0),
        "ImagePullBackOff" => (
            "Pending",
            json!({"waiting": {"reason": "ImagePullBackOff", "message": format!("Back-off pulling image \"{image}\"")}}),
            false,
            0,
        ),
        _ => ("Running", json!({"running": {"startedAt": now}}), true, 0),
    };
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": meta(ns, name, labels),
        "spec": {"containers": tpl["spec"]["containers"], "nodeName": if state == "Pending" {Value::Null} else {json!(node)}, "restartPolicy": "Always", "serviceAccountName": "default"},
        "status": {"phase": phase, "hostIP": "10.0.0.1", "podIP": format!("10.244.{}.{}", crate::hash64(name) % 250, crate::hash64(&format!("{name}/p")) % 250 + 2), "startTime": now, "qosClass": "Burstable",
            "conditions": [
                {"type": "PodScheduled", "status": if state == "Pending" {"False"} else {"True"}, "reason": if state == "Pending" {"Unschedulable"} else {""}, "lastTransitionTime": now},
                {"type": "Ready", "status": if ready {"True"} else {"False"}, "lastTransitionTime": now}
            ]}
    });
    if state == "Pending" {
        if let Some(spec) = pod["spec"].as_object_mut() {
            spec.remove("nodeName");
        }
    } else {
        pod["status"]["containerStatuses"] = json!([{"name": container, "image": image, "imageID": "", "ready": ready, "started": ready, "restartCount": restarts, "state": cstate}]);
    }
    pod
}

/// A Deployment's pod-template-hash (at most 10 hex digits) for its pods running `image`.
fn template_hash(ns: &str, name: &str, image: &str) -> String {
    let mut hash = format!(
        "{:x}",
        crate::hash64(&format!("{ns}/{name}/{image}")) % 0xff_ffff_ffff
    );
    hash.truncate(10);
    hash
}

fn owner(kind: &str, api: &str, obj: &Value) -> Value {
    json!([{"apiVersion": api, "kind": kind, "name": str_at(obj, &["metadata", "name"]), "uid": str_at(obj, &["metadata", "uid"]), "controller": true, "blockOwnerDeletion": true}])
}

/// A Deployment with its ReplicaSet and pods.
pub fn deployment(
    c: &Cluster,
    ns: &str,
    name: &str,
    replicas: i64,
    image: &str,
    labels: Value,
    nodes: &[String],
) {
    deployment_with_states(c, ns, name, replicas, image, labels, nodes, &[]);
}

#[allow(clippy::too_many_arguments)]
fn deployment_with_states(
    c: &Cluster,
    ns: &str,
    name: &str,
    replicas: i64,
    image: &str,
    labels: Value,
    nodes: &[String],
    states: &[&str],
) {
    let tpl = pod_template(image, &labels);
    let Some(d) = put(
        c,
        "apps",
        "deployments",
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(ns, name, labels.clone()),
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": tpl, "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}, "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600},
            "status": {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
                "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}, {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}
        }),
    ) else {
        return;
    };
    let hash = template_hash(ns, name, image);
    let rs_name = format!("{name}-{hash}");
    let mut rs_labels = labels.clone();
    rs_labels["pod-template-hash"] = json!(hash);
    let mut rs_tpl = tpl.clone();
    rs_tpl["metadata"]["labels"] = rs_labels.clone();
    let mut rs = json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta(ns, &rs_name, rs_labels.clone()),
        "spec": {"replicas": replicas, "selector": {"matchLabels": rs_labels}, "template": rs_tpl},
        "status": {"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas, "fullyLabeledReplicas": replicas, "observedGeneration": 1}
    });
    rs["metadata"]["ownerReferences"] = owner("Deployment", "apps/v1", &d);
    rs["metadata"]["annotations"] = json!({"deployment.kubernetes.io/revision": "1"});
    let Some(rs) = put(c, "apps", "replicasets", rs) else {
        return;
    };
    let mut unready = 0;
    for i in 0..replicas as usize {
        let state = states.get(i).copied().unwrap_or("Running");
        if state != "Running" {
            unready += 1;
        }
        let node = nodes
            .get((crate::hash64(&format!("{rs_name}/{i}")) as usize) % nodes.len().max(1))
            .cloned()
            .unwrap_or_default();
        let mut pod = pod_obj(
            c,
            ns,
            &format!("{rs_name}-{}", suffix(c, 5)),
            image,
            rs["spec"]["selector"]["matchLabels"].clone(),
            &node,
            state,
        );
        pod["metadata"]["ownerReferences"] = owner("ReplicaSet", "apps/v1", &rs);
        put(c, "", "pods", pod);
    }
    if unready > 0 {
        change(c, "apps", "deployments", ns, name, |d| {
            d["status"]["readyReplicas"] = json!(replicas - unready);
            d["status"]["availableReplicas"] = json!(replicas - unready);
        });
    }
}

fn daemonset(c: &Cluster, ns: &str, name: &str, image: &str, nodes: &[String], labels: Value) {
    let n = nodes.len() as i64;
    let Some(ds) = put(
        c,
        "apps",
        "daemonsets",
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta(ns, name, labels.clone()),
            "spec": {"selector": {"matchLabels": labels}, "template": pod_template(image, &labels), "updateStrategy": {"type": "RollingUpdate"}},
            "status": {"desiredNumberScheduled": n, "currentNumberScheduled": n, "numberReady": n, "numberAvailable": n, "updatedNumberScheduled": n, "numberMisscheduled": 0, "observedGeneration": 1}
        }),
    ) else {
        return;
    };
    for node in nodes {
        let mut pod = pod_obj(
            c,
            ns,
            &format!("{name}-{}", suffix(c, 5)),
            image,
            labels.clone(),
            node,
            "Running",
        );
        pod["metadata"]["ownerReferences"] = owner("DaemonSet", "apps/v1", &ds);
        put(c, "", "pods", pod);
    }
}

fn statefulset(c: &Cluster, ns: &str, name: &str, replicas: i64, image: &str) {
    let labels = json!({"app.kubernetes.io/name": name});
    let Some(sts) = put(
        c,
        "apps",
        "statefulsets",
        json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(ns, name, labels.clone()),
            "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": labels}, "template": pod_template(image, &labels),
                "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "50Gi"}}}}]},
            "status": {"replicas": replicas, "readyReplicas": replicas, "currentReplicas": replicas, "updatedReplicas": replicas, "availableReplicas": replicas, "observedGeneration": 1}
        }),
    ) else {
        return;
    };
    for i in 0..replicas {
        let mut pod = pod_obj(
            c,
            ns,
            &format!("{name}-{i}"),
            image,
            labels.clone(),
            "",
            "Running",
        );
        pod["spec"]["nodeName"] = json!(format!("{}-worker-{}", c.name(), i));
        pod["metadata"]["ownerReferences"] = owner("StatefulSet", "apps/v1", &sts);
        put(c, "", "pods", pod);
    }
}

fn service(
    c: &Cluster,
    ns: &str,
    name: &str,
    ty: &str,
    selector: Value,
    ports: &[(&str, i64, &str)],
    cluster_ip: Option<&str>,
) {
    let ip = cluster_ip.map(str::to_string).unwrap_or_else(|| {
        format!(
            "10.96.{}.{}",
            crate::hash64(&format!("{ns}/{name}")) % 250,
            crate::hash64(name) % 250 + 2
        )
    });
    put(
        c,
        "",
        "services",
        json!({
            "apiVersion": "v1", "kind": "Service", "metadata": meta(ns, name, json!({"app.kubernetes.io/name": name})),
            "spec": {"type": ty, "selector": selector, "clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"], "sessionAffinity": "None",
                "ports": ports.iter().map(|(n, p, proto)| json!({"name": n, "port": p, "targetPort": p, "protocol": proto})).collect::<Vec<_>>()},
            "status": {"loadBalancer": {}}
        }),
    );
    endpoint_slice(c, ns, name, ports);
}

fn endpoint_slice(c: &Cluster, ns: &str, service: &str, ports: &[(&str, i64, &str)]) {
    let name = format!(
        "{service}-{:05x}",
        crate::hash64(&format!("{ns}/{service}")) & 0xfffff
    );
    put(
        c,
        "discovery.k8s.io",
        "endpointslices",
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": meta(ns, &name, json!({"kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"})),
            "addressType": "IPv4",
            "endpoints": [],
            "ports": ports.iter().map(|(n, p, proto)| json!({"name": n, "port": p, "protocol": proto})).collect::<Vec<_>>()
        }),
    );
}

fn endpoints(c: &Cluster, ns: &str, name: &str, ready: bool) {
    let pods: Vec<Arc<Value>> = c
        .store
        .all(&rk("", "pods"), Some(ns))
        .into_iter()
        .filter(|p| str_at(p, &["metadata", "labels", "k8s-app"]) == "kube-dns")
        .collect();
    let addrs: Vec<Value> = pods
        .iter()
        .map(|p| json!({"ip": str_at(p, &["status", "podIP"]), "nodeName": str_at(p, &["spec", "nodeName"]), "targetRef": {"kind": "Pod", "name": str_at(p, &["metadata", "name"]), "namespace": ns}}))
        .collect();
    let subsets = if ready && !addrs.is_empty() {
        json!([{"addresses": addrs, "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}])
    } else if !addrs.is_empty() {
        json!([{"notReadyAddresses": addrs, "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}])
    } else {
        json!([])
    };
    let obj = json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": meta(ns, name, json!({"k8s-app": "kube-dns"})), "subsets": subsets});
    if c.store.contains(&rk("", "endpoints"), ns, name) {
        change(c, "", "endpoints", ns, name, |e| {
            e["subsets"] = obj["subsets"].clone()
        });
    } else {
        put(c, "", "endpoints", obj);
    }
}

/// The first team namespaces (one per team) whose `web` Service is annotated for scraping: the demo's
/// request metrics, without a fleet of large clusters adding hundreds of scrape targets each.
pub const SCRAPED_TEAM_NAMESPACES: usize = 8;

fn team_namespace(
    c: &Cluster,
    ns: &str,
    team: &str,
    nodes: &[String],
    gpu_nodes: &[String],
    idx: usize,
) {
    namespace(
        c,
        ns,
        if idx.is_multiple_of(3) {
            Some("restricted")
        } else {
            None
        },
    );
    let workers: Vec<String> = nodes
        .iter()
        .filter(|n| !n.contains("-cp-"))
        .cloned()
        .collect();
    let labels = |app: &str| json!({"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": team, "team": team});
    // web with one crashlooping pod in some namespaces
    let web_states: &[&str] = if idx % 4 == 1 {
        &["Running", "CrashLoopBackOff", "Running"]
    } else {
        &[]
    };
    deployment_with_states(
        c,
        ns,
        "web",
        3,
        &format!("registry.example.com/{team}/web:1.{}.0", idx % 7),
        labels("web"),
        &workers,
        web_states,
    );
    let api_states: &[&str] = if idx % 5 == 2 {
        &["Running", "Pending"]
    } else {
        &[]
    };
    deployment_with_states(
        c,
        ns,
        "api",
        2,
        &format!("registry.example.com/{team}/api:2.{}.1", idx % 5),
        labels("api"),
        &workers,
        api_states,
    );
    deployment(
        c,
        ns,
        "worker",
        1,
        &format!("registry.example.com/{team}/worker:0.9.{}", idx % 3),
        labels("worker"),
        &workers,
    );
    if team == "ml-training" && !gpu_nodes.is_empty() {
        deployment(
            c,
            ns,
            "trainer",
            2,
            "nvcr.io/nvidia/pytorch:24.05-py3",
            labels("trainer"),
            gpu_nodes,
        );
        change(c, "apps", "deployments", ns, "trainer", |d| {
            d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] =
                json!("1");
        });
        for p in c.store.all(&rk("", "pods"), Some(ns)) {
            if str_at(&p, &["metadata", "labels", "app.kubernetes.io/name"]) == "trainer" {
                let name = str_at(&p, &["metadata", "name"]).to_string();
                change(c, "", "pods", ns, &name, |p| {
                    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] =
                        json!("1");
                });
            }
        }
    }
    service(
        c,
        ns,
        "web",
        "ClusterIP",
        json!({"app.kubernetes.io/name": "web"}),
        &[("http", 80, "TCP")],
        None,
    );
    if idx < SCRAPED_TEAM_NAMESPACES {
        // scraped through the API server proxy as Prometheus' annotation convention says: its requests
        // (`http_requests_total`, see crate::traffic) are what a release's metrics analysis reads
        change(c, "", "services", ns, "web", |s| {
            s["metadata"]["annotations"] = json!({"prometheus.io/scrape": "true", "prometheus.io/port": "80", "prometheus.io/path": "/metrics"});
        });
    }
    service(
        c,
        ns,
        "api",
        if idx.is_multiple_of(6) {
            "LoadBalancer"
        } else {
            "ClusterIP"
        },
        json!({"app.kubernetes.io/name": "api"}),
        &[("http", 8080, "TCP")],
        None,
    );
    put(
        c,
        "networking.k8s.io",
        "ingresses",
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta(ns, "web", labels("web")),
            "spec": {"ingressClassName": "nginx", "rules": [{"host": format!("{ns}.example.com"), "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}],
                "tls": [{"hosts": [format!("{ns}.example.com")], "secretName": "web-tls"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}
        }),
    );
    put(
        c,
        "",
        "configmaps",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(ns, "app-config", labels("web")), "data": {"LOG_LEVEL": "info", "FEATURE_X": "false"}}),
    );
    put(
        c,
        "",
        "secrets",
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta(ns, "web-tls", labels("web")), "type": "kubernetes.io/tls", "data": {"tls.crt": "LS0tLS1CRUdJTi1GQUtF", "tls.key": "LS0tLS1CRUdJTi1GQUtF"}}),
    );
    put(
        c,
        "",
        "secrets",
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta(ns, "db-credentials", labels("api")), "type": "Opaque", "data": {"password": "c2VjcmV0LXZhbHVl"}}),
    );
    put(
        c,
        "batch",
        "cronjobs",
        json!({
            "apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta(ns, "nightly-report", labels("report")),
            "spec": {"schedule": "0 2 * * *", "concurrencyPolicy": "Forbid", "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "OnFailure", "containers": [{"name": "report", "image": format!("registry.example.com/{team}/report:1.0")}]}}}}},
            "status": {"lastScheduleTime": c.now_str()}
        }),
    );
    put(
        c,
        "batch",
        "jobs",
        json!({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": meta(ns, "nightly-report-28790640", labels("report")),
            "spec": {"completions": 1, "backoffLimit": 6, "template": {"spec": {"restartPolicy": "OnFailure", "containers": [{"name": "report", "image": format!("registry.example.com/{team}/report:1.0")}]}}},
            "status": {"succeeded": 1, "startTime": c.now_str(), "completionTime": c.now_str()}
        }),
    );
    put(
        c,
        "autoscaling",
        "horizontalpodautoscalers",
        json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta(ns, "web", labels("web")),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}, "minReplicas": 2, "maxReplicas": 10,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]},
            "status": {"currentReplicas": 3, "desiredReplicas": 3}
        }),
    );
    put(
        c,
        "policy",
        "poddisruptionbudgets",
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta(ns, "web", labels("web")),
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app.kubernetes.io/name": "web"}}},
            "status": {"currentHealthy": 3, "desiredHealthy": 2, "disruptionsAllowed": 1, "expectedPods": 3}
        }),
    );
    put(
        c,
        "networking.k8s.io",
        "networkpolicies",
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta(ns, "default-deny", json!({})),
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}
        }),
    );
    put(
        c,
        "rbac.authorization.k8s.io",
        "roles",
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(ns, "deployer", json!({})),
            "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "patch"]}]
        }),
    );
    put(
        c,
        "rbac.authorization.k8s.io",
        "rolebindings",
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(ns, "deployer", json!({})),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployer"},
            "subjects": [{"kind": "Group", "name": format!("team:{team}"), "apiGroup": "rbac.authorization.k8s.io"}]
        }),
    );
}

/// Distinct messages of similar events (same object, type, reason, source) after which client-go's
/// `EventAggregator` combines them.
const AGGREGATE_MAX_EVENTS: usize = 10;
/// How long the aggregator remembers similar events (client-go's `maxIntervalInSeconds`).
const AGGREGATE_INTERVAL: chrono::Duration = chrono::Duration::minutes(10);

/// Per similar-event key: the distinct messages seen and when the last one came (client-go's
/// `aggregateRecord`).
#[derive(Debug, Default)]
pub struct EventAggregates(
    std::collections::HashMap<String, (std::collections::HashSet<String>, DateTime<Utc>)>,
);

impl EventAggregates {
    /// Forgets keys quiet for longer than the aggregation interval (client-go keeps an LRU of them).
    fn prune(&mut self, now: DateTime<Utc>) {
        self.0
            .retain(|_, (_, last)| now - *last <= AGGREGATE_INTERVAL);
    }
}

/// Records an event about `obj` as a kubelet's event correlator does:
/// - a repeat of the same reason and message on the same object bumps the count and the series;
/// - the 10th distinct message of similar events (same object, type, reason and source) within 10 minutes
///   and every one after it goes into one event, "(combined from similar events): &lt;message&gt;", whose count
///   grows (client-go's `EventAggregator`), so a chatty object can't fill the API server with events.
pub fn event(c: &Cluster, obj: &Value, ty: &str, reason: &str, message: &str, component: &str) {
    let ns = match str_at(obj, &["metadata", "namespace"]) {
        "" => "default",
        ns => ns,
    };
    let obj_name = str_at(obj, &["metadata", "name"]);
    let similar = format!(
        "{component}/{}/{ns}/{obj_name}/{}/{ty}/{reason}",
        str_at(obj, &["kind"]),
        str_at(obj, &["metadata", "uid"])
    );
    let combined = {
        let now = c.now();
        let mut aggregates = c.event_aggregates();
        let (messages, last) = aggregates
            .0
            .entry(similar.clone())
            .or_insert_with(|| (Default::default(), now));
        if now - *last > AGGREGATE_INTERVAL {
            messages.clear();
        }
        *last = now;
        messages.insert(message.to_string());
        if messages.len() < AGGREGATE_MAX_EVENTS {
            None
        } else {
            // the set stays at its bound: client-go pops an arbitrary member
            if let Some(any) = messages.iter().next().cloned() {
                messages.remove(&any);
            }
            Some(format!("(combined from similar events): {message}"))
        }
    };
    let (key, message) = match &combined {
        Some(m) => (
            format!(
                "{obj_name}.{:x}",
                crate::hash64(&similar) & 0xffff_ffff_ffff
            ),
            m.as_str(),
        ),
        None => (
            format!(
                "{obj_name}.{:x}",
                crate::hash64(&format!("{reason}/{message}")) & 0xffff_ffff_ffff
            ),
            message,
        ),
    };
    let at = c.now();
    let secs = at.trunc_subsecs(0);
    let res = rk("", "events");
    let repeated = c.store.update_event(&res, ns, &key, |e| match e {
        EventMut::Record(e) => {
            e.count += 1;
            e.message = message.into();
            e.last = secs;
            if e.series.is_some() || e.count > 2 {
                e.series = Some((e.count, at));
            }
            // as the API server does for every write
            e.updated = Some(secs);
        }
        // an event of this name written through the API: changed as the kubelet changes its own
        EventMut::Tree(e) => {
            let now = secs.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let count = e["count"].as_i64().unwrap_or(1) + 1;
            e["count"] = json!(count);
            e["message"] = json!(message);
            e["lastTimestamp"] = json!(now);
            if e.get("series").is_some_and(|s| !s.is_null()) || count > 2 {
                e["series"] = json!({
                    "count": count,
                    "lastObservedTime": at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                });
            }
            stamp_manager(e, CONTROLLER_MANAGER, &now);
        }
    });
    if repeated {
        return;
    }
    c.store.create_event(
        &res,
        EventRecord {
            name: key.into(),
            namespace: ns.into(),
            uid: c.uid().into(),
            resource_version: 0,
            created: secs,
            updated: None,
            involved: ObjectRef::to(obj),
            reason: reason.into(),
            message: message.into(),
            type_: ty.into(),
            count: 1,
            first: secs,
            last: secs,
            series: None,
            component: component.into(),
        },
    );
}

// ---------------------------------------------------------------------------------------------------------
// Controllers and churn

/// The shortest time between two ticks of a cluster's events, in seconds.
const EVENT_TICK_MIN: f64 = 0.1;

/// Runs the cluster's controllers (leases, rollouts) and its churn until cancelled.
pub async fn run(c: Arc<Cluster>, cancel: CancellationToken) {
    let mut leases = tokio::time::interval(Duration::from_secs(2));
    let mut rollouts = tokio::time::interval(Duration::from_millis(700));
    let churn_every = if c.settings.churn > 0.0 {
        Duration::from_secs_f64(1.0 / c.settings.churn)
    } else {
        Duration::from_secs(3600)
    };
    // Events come in ticks of at most ten a second, each with its share of the rate (a node's kubelet
    // reports in bursts too): a tick per event was a timer wakeup and a watch write per event.
    let rate = c.settings.events_per_second;
    let events_every = if rate > 0.0 {
        Duration::from_secs_f64((1.0 / rate).max(EVENT_TICK_MIN))
    } else {
        Duration::from_secs(3600)
    };
    // below ten a second, one event a tick (an exact 1, not the rounded duration's 0.999…)
    let per_tick = (rate * EVENT_TICK_MIN).max(1.0);
    let mut owed = 0.0;
    let mut events = tokio::time::interval(events_every);
    events.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // The TTL sweep reads every event: once a minute is plenty for a one-hour TTL, and each cluster's
    // sweep starts at its own offset so a fleet's sweeps don't come at once.
    let sweep_every = Duration::from_secs(60);
    let offset = Duration::from_millis(c.rng().random_range(0..sweep_every.as_millis() as u64));
    let mut expire = tokio::time::interval_at(tokio::time::Instant::now() + offset, sweep_every);
    let mut churn = tokio::time::interval(churn_every);
    churn.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = leases.tick() => renew_leases(&c),
            _ = rollouts.tick() => reconcile(&c),
            _ = churn.tick(), if c.settings.churn > 0.0 => churn_once(&c),
            _ = events.tick(), if rate > 0.0 => {
                owed += per_tick;
                while owed >= 1.0 {
                    event_once(&c);
                    owed -= 1.0;
                }
            }
            _ = expire.tick() => {
                expire_events(&c, chrono::Duration::hours(1));
                let now = c.now();
                c.event_aggregates().prune(now);
            }
        }
    }
}

fn renew_leases(c: &Cluster) {
    let f = c.faults();
    let now = c.now_micro();
    for (holder, down) in [
        ("kube-scheduler", f.scheduler_down),
        ("kube-controller-manager", f.controller_manager_down),
    ] {
        if !down {
            change(
                c,
                "coordination.k8s.io",
                "leases",
                "kube-system",
                holder,
                |l| l["spec"]["renewTime"] = json!(now),
            );
        }
    }
}

/// Registry host of images that never pull: a Deployment whose pod template uses one (e.g.
/// `unpullable.invalid/web:2`) starts one new pod that never becomes available (ImagePullBackOff), so its
/// rollout never completes — what a release's health gate must catch.
pub const UNPULLABLE_REGISTRY: &str = "unpullable.invalid/";

/// What an image tag says about the requests its pods serve: a tag containing `-errors<N>` (N a whole
/// percentage, 0–100) fails N % of them with a 500, e.g. `registry.example.com/web:2.0.0-errors30` → 30 %
/// (the rest of the tag is free: `2.0-errors5-rc1` → 5 %). What a release's metrics analysis must catch while
/// its rollout stays healthy. Any other image fails [`BASE_ERROR_SHARE`] of its requests.
pub const ERRORS_TAG: &str = "-errors";

/// The share of requests an image whose tag asks for no errors fails: 0.1 %, so an error ratio is a small
/// number rather than always exactly 0.
pub const BASE_ERROR_SHARE: f64 = 0.001;

/// The share (0–1) of requests the pods of `image` fail, by the [`ERRORS_TAG`] convention.
pub fn image_error_share(image: &str) -> f64 {
    // the tag: after the last ':' of the last path segment (a registry port is not a tag), before a digest
    let last = image.rsplit('/').next().unwrap_or(image);
    let last = last.split('@').next().unwrap_or(last);
    let Some((_, tag)) = last.split_once(':') else {
        return BASE_ERROR_SHARE;
    };
    let mut rest = tag;
    while let Some(at) = rest.find(ERRORS_TAG) {
        rest = &rest[at + ERRORS_TAG.len()..];
        let digits: &str = &rest[..rest
            .find(|ch: char| !ch.is_ascii_digit())
            .unwrap_or(rest.len())];
        if let Ok(percent) = digits.parse::<u32>() {
            return f64::from(percent.min(100)) / 100.0;
        }
    }
    BASE_ERROR_SHARE
}

/// The share of requests a pod of this template fails: its worst container's ([`image_error_share`]).
pub fn template_error_share(template: &Value) -> f64 {
    template
        .at("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("image").and_then(Value::as_str))
        .map(image_error_share)
        .fold(None, |worst: Option<f64>, s| {
            Some(worst.map_or(s, |w| w.max(s)))
        })
        .unwrap_or(BASE_ERROR_SHARE)
}

/// Whether a Deployment's pod template uses an image that never pulls ([`UNPULLABLE_REGISTRY`]).
pub fn unpullable(d: &Value) -> bool {
    d.at("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            c.get("image")
                .and_then(Value::as_str)
                .is_some_and(|i| i.starts_with(UNPULLABLE_REGISTRY))
        })
}

/// Why a pod's first container waits (`CrashLoopBackOff`, `ImagePullBackOff`), or "".
fn waiting(p: &Value) -> &str {
    p.at("/status/containerStatuses/0/state/waiting/reason")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The Deployment a pod `<deployment>-<template hash>-<suffix>` belongs to by its name.
fn deployment_of(pod: &str) -> Option<&str> {
    let (rest, _suffix) = pod.rsplit_once('-')?;
    rest.rsplit_once('-').map(|(deployment, _hash)| deployment)
}

/// A Deployment's pods waiting for an image that never pulls (`namespace`, `name`).
fn pulling(c: &Cluster, ns: &str, deployment: &str) -> Vec<(String, String)> {
    c.store
        .all(&rk("", "pods"), Some(ns))
        .iter()
        .filter(|p| {
            deployment_of(str_at(p, &["metadata", "name"])) == Some(deployment)
                && waiting(p) == "ImagePullBackOff"
        })
        .map(|p| (ns.to_string(), str_at(p, &["metadata", "name"]).to_string()))
        .collect()
}

/// The new pod a rollout to an image that never pulls starts (one in place of any an earlier such
/// rollout left), waiting in ImagePullBackOff, and what its kubelet says: the pull fails
/// (`ErrImagePull`), then it backs off. [`churn_once`] repeats the back-off, as a kubelet does.
fn stuck_pods(c: &Cluster, d: &Value) {
    let ns = str_at(d, &["metadata", "namespace"]).to_string();
    let name = str_at(d, &["metadata", "name"]).to_string();
    for (pns, pname) in pulling(c, &ns, &name) {
        remove(c, "", "pods", &pns, &pname);
    }
    let Some(image) = d
        .at("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("image").and_then(Value::as_str))
        .find(|i| i.starts_with(UNPULLABLE_REGISTRY))
        .map(str::to_string)
    else {
        return;
    };
    let hash = template_hash(&ns, &name, &image);
    let mut labels = d
        .at("/spec/template/metadata/labels")
        .cloned()
        .unwrap_or_else(|| json!({}));
    labels["pod-template-hash"] = json!(hash);
    let node = c
        .store
        .all(&rk("", "nodes"), None)
        .iter()
        .map(|n| str_at(n, &["metadata", "name"]).to_string())
        .find(|n| !n.contains("-cp-"))
        .unwrap_or_default();
    let pod = pod_obj(
        c,
        &ns,
        &format!("{name}-{hash}-{}", suffix(c, 5)),
        &image,
        labels,
        &node,
        "ImagePullBackOff",
    );
    let Some(pod) = put(c, "", "pods", pod) else {
        return;
    };
    // the kubelet's words (the forms services/eventshapes catalogues): the pull fails, then it backs off
    event(
        c,
        &pod,
        "Warning",
        "Failed",
        &format!(
            "Failed to pull image \"{image}\": rpc error: code = NotFound desc = failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": {image}: not found"
        ),
        "kubelet",
    );
    event(
        c,
        &pod,
        "Warning",
        "Failed",
        "Error: ErrImagePull",
        "kubelet",
    );
    pull_back_off(c, &pod, &image);
}

/// A kubelet backing off pulling `image` for `pod`: a *Normal* `BackOff` and a `Failed` warning.
fn pull_back_off(c: &Cluster, pod: &Value, image: &str) {
    let message = format!("Back-off pulling image \"{image}\"");
    event(c, pod, "Normal", "BackOff", &message, "kubelet");
    event(
        c,
        pod,
        "Warning",
        "Failed",
        "Error: ImagePullBackOff",
        "kubelet",
    );
}

/// Moves Deployment rollouts forward: one whose generation is ahead of its observedGeneration with a new
/// pod template updates one replica per step; one whose image never pulls ([`UNPULLABLE_REGISTRY`]) stalls
/// with one new pod not available; one with the template it had and another replica count (a scale) is at
/// the new count in one step. Then counts every Deployment's requests ([`crate::traffic`]). (DaemonSets,
/// StatefulSets and ReplicaSets keep the status they were seeded with.)
fn reconcile(c: &Cluster) {
    let now = std::time::Instant::now();
    let mut traffic = c.traffic();
    for d in c.store.all(&rk("apps", "deployments"), None) {
        if traffic.look_again(&d, now) {
            continue;
        }
        let (d, settled) = step_rollout(c, &traffic, d);
        traffic.observe(&d, now);
        if settled {
            traffic.settled(&d);
        }
    }
    traffic.sweep();
}

/// One step of a Deployment's rollout: the Deployment as it is after it, and whether the step had nothing
/// to do and never will at this version (its rollout is done or stuck: what decides it is the Deployment
/// alone).
fn step_rollout(
    c: &Cluster,
    traffic: &crate::traffic::Workloads,
    d: Arc<Value>,
) -> (Arc<Value>, bool) {
    let generation = d
        .at("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let observed = d
        .at("/status/observedGeneration")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let want = d.at("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    let updated = d
        .at("/status/updatedReplicas")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let replicas = d
        .at("/status/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if generation == observed && updated == want && replicas == want {
        return (d, true);
    }
    let ns = str_at(&d, &["metadata", "namespace"]).to_string();
    let name = str_at(&d, &["metadata", "name"]).to_string();
    let after = |c: &Cluster| {
        c.store
            .get(&rk("apps", "deployments"), &ns, &name)
            .unwrap_or_else(|| d.clone())
    };
    if unpullable(&d) {
        let stuck_updated = want.min(1);
        let stuck_available = (want - 1).max(0);
        if generation == observed && updated == stuck_updated && replicas == want + stuck_updated {
            return (d, true);
        }
        if generation != observed && stuck_updated > 0 {
            stuck_pods(c, &d);
        }
        change(c, "apps", "deployments", &ns, &name, |d| {
            d["status"]["observedGeneration"] = json!(generation);
            d["status"]["updatedReplicas"] = json!(stuck_updated);
            d["status"]["replicas"] = json!(want + stuck_updated);
            d["status"]["readyReplicas"] = json!(stuck_available);
            d["status"]["availableReplicas"] = json!(stuck_available);
            d["status"]["unavailableReplicas"] = json!(stuck_updated);
            d["status"]["conditions"] = json!([
                {"type": "Available", "status": if stuck_available > 0 {"True"} else {"False"}, "reason": "MinimumReplicasAvailable"},
                {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
                 "message": "new pods are in ImagePullBackOff"}
            ]);
        });
        return (after(c), false);
    }
    if generation != observed {
        // a rollout away from an image that never pulled: its stuck pod goes
        for (pns, pname) in pulling(c, &ns, &name) {
            remove(c, "", "pods", &pns, &pname);
        }
    }
    let coredns_down = c.faults().coredns_down && name == "coredns";
    let updated = if generation == observed {
        (updated + 1).min(want)
    } else {
        match traffic.rollout(&d) {
            crate::traffic::Rollout::Template => 0,
            // the current pods are scaled: all of them are updated unless a rollout was under way
            crate::traffic::Rollout::Scale if updated >= replicas => want,
            crate::traffic::Rollout::Scale => updated.min(want),
        }
    };
    change(c, "apps", "deployments", &ns, &name, |d| {
        let available = if coredns_down {
            0
        } else if updated == want {
            want
        } else {
            (want - 1).max(0).max(updated)
        };
        d["status"]["observedGeneration"] = json!(generation);
        d["status"]["updatedReplicas"] = json!(updated);
        d["status"]["replicas"] = json!(want);
        d["status"]["readyReplicas"] = json!(available);
        d["status"]["availableReplicas"] = json!(available);
        if available < want {
            d["status"]["unavailableReplicas"] = json!(want - available);
        } else if let Some(s) = d["status"].as_object_mut() {
            s.remove("unavailableReplicas");
        }
        let progressing = if updated == want {
            "NewReplicaSetAvailable"
        } else {
            "ReplicaSetUpdated"
        };
        d["status"]["conditions"] = json!([
            {"type": "Available", "status": if available >= want.saturating_sub(1).max(1) {"True"} else {"False"}, "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "True", "reason": progressing}
        ]);
    });
    (after(c), false)
}

/// Deletes events not seen for `ttl` (the apiserver's `--event-ttl`, 1 h by default).
fn expire_events(c: &Cluster, ttl: chrono::Duration) {
    for (ns, name) in c
        .store
        .events_last_seen_before(&rk("", "events"), c.now() - ttl)
    {
        remove(c, "", "events", &ns, &name);
    }
}

/// One event of the generator's mix (`--events-per-second`): a kubelet's BackOff, Pulled, Unhealthy or
/// Killing about a pod picked at random; a pod's second occurrence of one is a repeat (count and series
/// grow), as a kubelet's is.
pub fn event_once(c: &Cluster) {
    let i = c.rng().random::<u32>() as usize;
    let Some(pod) = c.store.nth(&rk("", "pods"), i) else {
        return;
    };
    let n: u32 = c.rng().random_range(0..1000);
    let (ty, reason) = match n % 4 {
        0 => ("Warning", "BackOff"),
        1 => ("Normal", "Pulled"),
        2 => ("Warning", "Unhealthy"),
        _ => ("Normal", "Killing"),
    };
    let message = kubelet_message(c.settings.profile.minor, &pod, reason, n);
    event(c, &pod, ty, reason, &message, "kubelet");
}

/// What a kubelet of release 1.`minor` writes for `reason` about `pod`'s first container, as its source
/// spells it (the forms the event shape catalogue cites, `services/eventshapes/src/shapes.rs`). A kubelet
/// repeats one message for one container, so its repeats are counted on one event. (A random part in the
/// `Pulled` and `Killing` messages, a duration or an attempt, made a pod's first ten occurrences of each ten
/// events before the aggregator combined the rest: at 50 clusters the simulator grew ~0.9 MiB/s.) A failing
/// readiness probe's message varies by `n`: four status codes it may see.
pub fn kubelet_message(minor: u32, pod: &Value, reason: &str, n: u32) -> String {
    // every simulated pod has a container with a name and an image
    let first = |k: &str| {
        pod.at(&format!("/spec/containers/0/{k}"))
            .and_then(Value::as_str)
            .unwrap_or("app")
            .to_string()
    };
    let container = first("name");
    match reason {
        // the bare form as in the k3s v1.24 fixture, here through 1.25; later kubelets name the container
        // and the pod (the change was made in late 2022, the 1.26 cycle)
        "BackOff" if minor <= 25 => "Back-off restarting failed container".to_string(),
        "BackOff" => format!(
            "Back-off restarting failed container {container} in pod {}_{}({})",
            str_at(pod, &["metadata", "name"]),
            str_at(pod, &["metadata", "namespace"]),
            str_at(pod, &["metadata", "uid"])
        ),
        "Pulled" if minor >= 33 => format!(
            "Container image \"{}\" already present on machine and can be accessed by the pod",
            first("image")
        ),
        "Pulled" => format!(
            "Container image \"{}\" already present on machine",
            first("image")
        ),
        "Created" if minor >= 32 => format!("Created container: {container}"),
        "Created" => format!("Created container {container}"),
        "Started" => format!("Started container {container}"),
        "Killing" => format!("Stopping container {container}"),
        "Unhealthy" => format!(
            "Readiness probe failed: HTTP probe failed with statuscode: {}",
            500 + n % 4
        ),
        other => format!("{other} container {container}"),
    }
}

fn churn_once(c: &Cluster) {
    let roll: u32 = c.rng().random_range(0..100);
    let pods = c.store.all(&rk("", "pods"), None);
    if pods.is_empty() {
        return;
    }
    let pick = |rng: &mut rand::rngs::StdRng| pods.choose(rng).cloned();
    let Some(pod) = pick(&mut c.rng()) else {
        return;
    };
    let ns = str_at(&pod, &["metadata", "namespace"]).to_string();
    let name = str_at(&pod, &["metadata", "name"]).to_string();
    match roll {
        // a crashlooping container restarts again, or a pod waiting for an image that never pulls backs
        // off again
        0..30 => {
            let stuck: Vec<_> = pods
                .iter()
                .filter(|p| ["CrashLoopBackOff", "ImagePullBackOff"].contains(&waiting(p)))
                .cloned()
                .collect();
            let Some(p) = stuck.choose(&mut *c.rng()).cloned() else {
                return;
            };
            if waiting(&p) == "ImagePullBackOff" {
                let (pns, pname) = (
                    str_at(&p, &["metadata", "namespace"]),
                    str_at(&p, &["metadata", "name"]),
                );
                let owner = deployment_of(pname).unwrap_or_default();
                if c.store
                    .get(&rk("apps", "deployments"), pns, owner)
                    .is_none()
                {
                    // its Deployment was deleted: the garbage collector takes the pod
                    remove(c, "", "pods", pns, pname);
                    return;
                }
                let image = p
                    .at("/status/containerStatuses/0/image")
                    .and_then(Value::as_str);
                pull_back_off(c, &p, image.unwrap_or_default());
                return;
            }
            let (pns, pname) = (
                str_at(&p, &["metadata", "namespace"]).to_string(),
                str_at(&p, &["metadata", "name"]).to_string(),
            );
            change(c, "", "pods", &pns, &pname, |p| {
                let n = p
                    .at("/status/containerStatuses/0/restartCount")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                p["status"]["containerStatuses"][0]["restartCount"] = json!(n + 1);
            });
            let message = kubelet_message(c.settings.profile.minor, &p, "BackOff", 0);
            event(c, &p, "Warning", "BackOff", &message, "kubelet");
        }
        // ordinary pod life: an event
        30..60 => {
            let reason = ["Pulled", "Created", "Started"][(roll % 3) as usize];
            let message = kubelet_message(c.settings.profile.minor, &pod, reason, 0);
            event(c, &pod, "Normal", reason, &message, "kubelet");
        }
        // a pod is replaced (deleted and recreated under the same owner)
        60..75 => {
            if !str_at(&pod, &["status", "phase"]).eq("Running") || ns == "kube-system" {
                return;
            }
            remove(c, "", "pods", &ns, &name);
            let mut fresh = (*pod).clone();
            let base = name
                .rsplit_once('-')
                .map(|(b, _)| b.to_string())
                .unwrap_or(name.clone());
            fresh["metadata"]["name"] = json!(format!("{base}-{}", suffix(c, 5)));
            if let Some(m) = fresh["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
            if let Some(p) = put(c, "", "pods", fresh) {
                event(
                    c,
                    &p,
                    "Normal",
                    "Scheduled",
                    &format!(
                        "Successfully assigned {ns}/{} to {}",
                        str_at(&p, &["metadata", "name"]),
                        str_at(&p, &["spec", "nodeName"])
                    ),
                    "default-scheduler",
                );
            }
        }
        // a config change, to an application's config (the platform components' settings change only
        // when someone changes them: they are what the fleet-consistency report compares)
        75..90 => {
            let cms: Vec<_> = c
                .store
                .all(&rk("", "configmaps"), None)
                .into_iter()
                .filter(|cm| {
                    let ns = str_at(cm, &["metadata", "namespace"]);
                    !ns.starts_with("kube-") && ns != "ingress-nginx"
                })
                .collect();
            let Some(cm) = cms.choose(&mut *c.rng()).cloned() else {
                return;
            };
            let v = c.rng().random_range(0..1000u32);
            change(
                c,
                "",
                "configmaps",
                str_at(&cm, &["metadata", "namespace"]),
                str_at(&cm, &["metadata", "name"]),
                |cm| {
                    cm["data"]["REVISION"] = json!(v.to_string());
                },
            );
        }
        // a rollout: a new template
        _ => {
            let deps = c.store.all(&rk("apps", "deployments"), None);
            let Some(d) = deps
                .iter()
                .filter(|d| str_at(d, &["metadata", "namespace"]) != "kube-system")
                .collect::<Vec<_>>()
                .choose(&mut *c.rng())
                .map(|d| (*d).clone())
            else {
                return;
            };
            let stamp = c.now_str();
            change(
                c,
                "apps",
                "deployments",
                str_at(&d, &["metadata", "namespace"]),
                str_at(&d, &["metadata", "name"]),
                |d| {
                    d["spec"]["template"]["metadata"]["annotations"] =
                        json!({"kubectl.kubernetes.io/restartedAt": stamp});
                },
            );
            event(
                c,
                &d,
                "Normal",
                "ScalingReplicaSet",
                &format!(
                    "Scaled up replica set {}-new to 1",
                    str_at(&d, &["metadata", "name"])
                ),
                "deployment-controller",
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Faults

/// The ingress controller ConfigMap's data on every cluster, until someone changes it.
const INGRESS_SETTINGS: [(&str, &str); 5] = [
    ("proxy-read-timeout", "60"),
    ("proxy-send-timeout", "60"),
    ("proxy-body-size", "8m"),
    ("use-forwarded-headers", "true"),
    ("keep-alive", "75"),
];

/// Faults the simulator can inject.
pub const FAULTS: &[(&str, &str)] = &[
    (
        "overload",
        "apiserver latency (latency_ms, default 800) and a share of 429/500 answers (error_rate, default 0.3)",
    ),
    (
        "watch-disconnect",
        "one-shot: closes every open watch (clients resume from their resourceVersion)",
    ),
    (
        "watch-expire",
        "one-shot: compacts the watch history and closes every watch, so resumes get 410 Gone and clients relist",
    ),
    ("unreachable", "drops every connection as it is accepted"),
    (
        "clock-skew",
        "the cluster's timestamps run ahead by `seconds` (default 300; negative: behind)",
    ),
    (
        "cert-expiry",
        "the apiserver serves a certificate expiring in `days` days (default 5)",
    ),
    (
        "node-not-ready",
        "a worker node's Ready condition turns False",
    ),
    (
        "coredns-down",
        "CoreDNS pods not ready, kube-dns endpoints empty",
    ),
    (
        "cni-down",
        "the CNI DaemonSet (calico-node or cilium) has half its pods not ready",
    ),
    (
        "gpu-mismatch",
        "the GPU device plugin is upgraded past the nodes' driver; GPU pods stuck in ContainerCreating",
    ),
    (
        "stuck-finalizer",
        "a ConfigMap is deleted but its finalizer is never removed",
    ),
    ("external-ips", "a Service with spec.externalIPs appears"),
    (
        "warning-burst",
        "one-shot: `count` (default 200) Warning events in a burst",
    ),
    ("etcd-unhealthy", "/readyz/etcd fails"),
    (
        "scheduler-down",
        "the kube-scheduler lease stops being renewed",
    ),
    (
        "controller-manager-down",
        "the kube-controller-manager lease stops being renewed",
    ),
    (
        "ingress-setting",
        "the ingress controller's ConfigMap gets `key` (default proxy-read-timeout) = `value` (default 20); off: the shipped value back. No incident of its own: a setting no single cluster alerts on (the fleet-consistency report names it)",
    ),
    (
        "deprecated-api",
        "an object last applied with a removed API version appears",
    ),
];

/// Errors switching faults.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// No such fault.
    #[error("unknown fault {0:?}; known: {1}")]
    Unknown(String, String),
    /// A parameter did not parse.
    #[error("bad parameter {0}: {1:?}")]
    BadParam(&'static str, String),
    /// Certificate generation failed.
    #[error(transparent)]
    Tls(#[from] crate::tls::Error),
}

fn param<T: std::str::FromStr>(
    params: &std::collections::BTreeMap<String, String>,
    key: &'static str,
    default: T,
) -> Result<T, FaultError> {
    match params.get(key) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| FaultError::BadParam(key, v.clone())),
    }
}

/// Switches a fault on (`on = true`) or off.
pub fn set_fault(
    c: &Cluster,
    fault: &str,
    on: bool,
    params: &std::collections::BTreeMap<String, String>,
) -> Result<(), FaultError> {
    let first_worker = format!("{}-worker-0", c.name());
    match fault {
        "overload" => {
            c.faults_mut().overload = on
                .then(|| -> Result<Overload, FaultError> {
                    Ok(Overload {
                        latency_ms: param(params, "latency_ms", 800)?,
                        error_rate: param(params, "error_rate", 0.3)?,
                    })
                })
                .transpose()?;
        }
        "watch-disconnect" => {
            if on {
                c.disconnect_watches();
            }
        }
        "watch-expire" => {
            if on {
                c.store.compact();
                c.disconnect_watches();
            }
        }
        "unreachable" => {
            c.faults_mut().unreachable = on;
            if on {
                c.disconnect_watches();
            }
        }
        "clock-skew" => c.set_skew(if on {
            param(params, "seconds", 300)?
        } else {
            0
        }),
        "cert-expiry" => {
            let days = if on { param(params, "days", 5)? } else { 365 };
            c.pki
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .set_serving_days(days)?;
            c.faults_mut().cert_expiry_days = on.then_some(days);
        }
        "node-not-ready" => {
            let node = params.get("node").cloned().unwrap_or(first_worker);
            let now = c.now_str();
            change(c, "", "nodes", "", &node, |n| {
                if let Some(conds) = n
                    .pointer_mut("/status/conditions")
                    .and_then(Value::as_array_mut)
                {
                    for cond in conds.iter_mut().filter(|c| c["type"] == "Ready") {
                        cond["status"] = json!(if on { "Unknown" } else { "True" });
                        cond["reason"] = json!(if on {
                            "NodeStatusUnknown"
                        } else {
                            "KubeletReady"
                        });
                        cond["message"] = json!(if on {
                            "Kubelet stopped posting node status."
                        } else {
                            "kubelet is posting ready status"
                        });
                        cond["lastTransitionTime"] = json!(now);
                    }
                }
                let taints = if on {
                    json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule", "timeAdded": now}])
                } else {
                    json!([])
                };
                n["spec"]["taints"] = taints;
            });
            if let Some(n) = c.store.get(&rk("", "nodes"), "", &node) {
                event(
                    c,
                    &n,
                    "Normal",
                    if on { "NodeNotReady" } else { "NodeReady" },
                    &format!(
                        "Node {node} status is now: {}",
                        if on { "NodeNotReady" } else { "NodeReady" }
                    ),
                    "node-controller",
                );
            }
            c.faults_mut().node_not_ready = on.then_some(node);
        }
        "coredns-down" => {
            c.faults_mut().coredns_down = on;
            for p in c.store.all(&rk("", "pods"), Some("kube-system")) {
                if str_at(&p, &["metadata", "labels", "k8s-app"]) != "kube-dns" {
                    continue;
                }
                let name = str_at(&p, &["metadata", "name"]).to_string();
                change(c, "", "pods", "kube-system", &name, |p| {
                    p["status"]["containerStatuses"][0]["ready"] = json!(!on);
                    p["status"]["conditions"][1]["status"] =
                        json!(if on { "False" } else { "True" });
                });
                if on {
                    event(
                        c,
                        &p,
                        "Warning",
                        "Unhealthy",
                        "Readiness probe failed: HTTP probe failed with statuscode: 503",
                        "kubelet",
                    );
                }
            }
            change(c, "apps", "deployments", "kube-system", "coredns", |d| {
                let want = d.at("/spec/replicas").and_then(Value::as_i64).unwrap_or(2);
                d["status"]["readyReplicas"] = json!(if on { 0 } else { want });
                d["status"]["availableReplicas"] = json!(if on { 0 } else { want });
            });
            endpoints(c, "kube-system", "kube-dns", !on);
        }
        "cni-down" => {
            for ds in c.store.all(&rk("apps", "daemonsets"), Some("kube-system")) {
                let name = str_at(&ds, &["metadata", "name"]).to_string();
                if name != "calico-node" && name != "cilium" {
                    continue;
                }
                change(c, "apps", "daemonsets", "kube-system", &name, |d| {
                    let n = d
                        .at("/status/desiredNumberScheduled")
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    let ready = if on { n / 2 } else { n };
                    d["status"]["numberReady"] = json!(ready);
                    d["status"]["numberAvailable"] = json!(ready);
                    d["status"]["numberUnavailable"] = json!(n - ready);
                });
            }
            c.faults_mut().cni_down = on;
        }
        "gpu-mismatch" => {
            c.faults_mut().gpu_mismatch = on;
            let version = if on {
                DEVICE_PLUGIN_NEW
            } else {
                DEVICE_PLUGIN_OK
            };
            change(
                c,
                "apps",
                "daemonsets",
                "gpu-operator",
                "nvidia-device-plugin-daemonset",
                |d| {
                    d["spec"]["template"]["spec"]["containers"][0]["image"] =
                        json!(format!("nvcr.io/nvidia/k8s-device-plugin:{version}"));
                    d["metadata"]["labels"]["app.kubernetes.io/version"] = json!(version);
                    let n = d
                        .at("/status/desiredNumberScheduled")
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    d["status"]["numberReady"] = json!(if on { 0 } else { n });
                    d["status"]["numberAvailable"] = json!(if on { 0 } else { n });
                    d["status"]["numberUnavailable"] = json!(if on { n } else { 0 });
                },
            );
            for p in c.store.all(&rk("", "pods"), None) {
                let gpu = p
                    .at("/spec/containers/0/resources/limits/nvidia.com~1gpu")
                    .is_some();
                let plugin = str_at(&p, &["metadata", "labels", "app.kubernetes.io/name"])
                    == "nvidia-device-plugin";
                if !gpu && !plugin {
                    continue;
                }
                let (ns, name) = (
                    str_at(&p, &["metadata", "namespace"]).to_string(),
                    str_at(&p, &["metadata", "name"]).to_string(),
                );
                change(c, "", "pods", &ns, &name, |p| {
                    if plugin {
                        p["spec"]["containers"][0]["image"] =
                            json!(format!("nvcr.io/nvidia/k8s-device-plugin:{version}"));
                        p["status"]["containerStatuses"][0]["image"] =
                            p["spec"]["containers"][0]["image"].clone();
                    }
                    if on {
                        p["status"]["phase"] = json!(if plugin { "Running" } else { "Pending" });
                        p["status"]["containerStatuses"][0]["ready"] = json!(false);
                        p["status"]["containerStatuses"][0]["state"] = if plugin {
                            json!({"waiting": {"reason": "CrashLoopBackOff", "message": "failed to initialize NVML: driver/library version mismatch"}})
                        } else {
                            json!({"waiting": {"reason": "ContainerCreating"}})
                        };
                    } else {
                        p["status"]["phase"] = json!("Running");
                        p["status"]["containerStatuses"][0]["ready"] = json!(true);
                        p["status"]["containerStatuses"][0]["state"] =
                            json!({"running": {"startedAt": c.now_str()}});
                    }
                });
                if on && !plugin {
                    event(
                        c,
                        &p,
                        "Warning",
                        "FailedCreatePodSandBox",
                        "Failed to create pod sandbox: nvidia-container-cli: initialization error: driver/library version mismatch",
                        "kubelet",
                    );
                }
            }
        }
        "stuck-finalizer" => {
            let (ns, name) = ("default", "legacy-config");
            if on {
                let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(ns, name, json!({})), "data": {"k": "v"}});
                cm["metadata"]["finalizers"] = json!(["example.com/legacy-cleanup"]);
                if !c.store.contains(&rk("", "configmaps"), ns, name) {
                    put(c, "", "configmaps", cm);
                }
                let started = (c.now()
                    - chrono::Duration::minutes(param(params, "age_minutes", 30i64)?))
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                change(c, "", "configmaps", ns, name, |cm| {
                    cm["metadata"]["deletionTimestamp"] = json!(started);
                    cm["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                });
            } else {
                change(c, "", "configmaps", ns, name, |cm| {
                    cm["metadata"]["finalizers"] = json!([])
                });
            }
            c.faults_mut().stuck_finalizer = on.then(|| format!("{ns}/{name}"));
        }
        "external-ips" => {
            let (ns, name) = ("default", "exposed-debug");
            if on {
                put(
                    c,
                    "",
                    "services",
                    json!({
                        "apiVersion": "v1", "kind": "Service", "metadata": meta(ns, name, json!({})),
                        "spec": {"type": "ClusterIP", "clusterIP": "10.96.200.200", "selector": {"app": "debug"}, "externalIPs": ["198.51.100.7"], "ports": [{"port": 22, "targetPort": 22, "protocol": "TCP"}]}
                    }),
                );
            } else {
                remove(c, "", "services", ns, name);
            }
            c.faults_mut().external_ips = on.then(|| format!("{ns}/{name}"));
        }
        "warning-burst" => {
            if on {
                let count: usize = param(params, "count", 200)?;
                let pods = c.store.all(&rk("", "pods"), None);
                for i in 0..count {
                    if let Some(p) = pods.get(i % pods.len().max(1)) {
                        event(
                            c,
                            p,
                            "Warning",
                            "FailedMount",
                            &format!(
                                "MountVolume.SetUp failed for volume \"data-{}\" : timed out waiting for the condition",
                                i % 17
                            ),
                            "kubelet",
                        );
                    }
                }
            }
        }
        "etcd-unhealthy" => c.faults_mut().etcd_unhealthy = on,
        "scheduler-down" => c.faults_mut().scheduler_down = on,
        "controller-manager-down" => c.faults_mut().controller_manager_down = on,
        "deprecated-api" => {
            let (ns, name) = ("default", "legacy-budget");
            if on {
                let mut pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta(ns, name, json!({})), "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "legacy"}}}});
                pdb["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/last-applied-configuration": format!("{{\"apiVersion\":\"policy/v1beta1\",\"kind\":\"PodDisruptionBudget\",\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"{ns}\"}},\"spec\":{{\"maxUnavailable\":1}}}}\n")});
                put(c, "policy", "poddisruptionbudgets", pdb);
            } else {
                remove(c, "policy", "poddisruptionbudgets", ns, name);
            }
            c.faults_mut().deprecated_api = on.then(|| format!("PodDisruptionBudget/{ns}/{name}"));
        }
        "ingress-setting" => {
            let key = params
                .get("key")
                .cloned()
                .unwrap_or_else(|| "proxy-read-timeout".into());
            let value = if on {
                params.get("value").cloned().unwrap_or_else(|| "20".into())
            } else {
                INGRESS_SETTINGS
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| v.to_string())
                    .unwrap_or_default()
            };
            change(
                c,
                "",
                "configmaps",
                "ingress-nginx",
                "ingress-nginx-controller",
                |cm| {
                    if value.is_empty() {
                        if let Some(data) = cm["data"].as_object_mut() {
                            data.remove(&key);
                        }
                    } else {
                        cm["data"][&key] = json!(value);
                    }
                },
            );
            c.faults_mut().ingress_setting = on.then(|| format!("{key}={value}"));
        }
        other => {
            return Err(FaultError::Unknown(
                other.to_string(),
                FAULTS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
    }
    Ok(())
}
