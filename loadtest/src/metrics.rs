//! Scrape bodies the simulated cluster serves: the apiserver's `/metrics`, kube-state-metrics and
//! node-exporter, generated from the store with the series names and labels of the real exporters
//! (compare `../shared/fixtures/metrics/`).

use std::fmt::Write as _;

use serde_json::Value;

use crate::cluster::Cluster;
use crate::store::{Pointer, ResKey, str_at};

fn family(out: &mut String, name: &str, ty: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {ty}");
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The apiserver's own `/metrics`.
pub fn apiserver(c: &Cluster) -> String {
    let mut out = String::new();
    family(
        &mut out,
        "apiserver_request_total",
        "counter",
        "[STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.",
    );
    let requests = c
        .stats
        .requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for ((verb, resource, code), n) in &requests {
        let _ = writeln!(
            out,
            "apiserver_request_total{{code=\"{code}\",component=\"apiserver\",resource=\"{}\",verb=\"{verb}\"}} {n}",
            esc(resource)
        );
    }
    family(
        &mut out,
        "apiserver_storage_objects",
        "gauge",
        "[STABLE] Number of stored objects at the time of last check split by kind.",
    );
    for (res, n) in c.store.counts() {
        let r = if res.group.is_empty() {
            res.plural.clone()
        } else {
            format!("{}.{}", res.plural, res.group)
        };
        let _ = writeln!(out, "apiserver_storage_objects{{resource=\"{r}\"}} {n}");
    }
    family(
        &mut out,
        "apiserver_requested_deprecated_apis",
        "gauge",
        "[STABLE] Gauge of deprecated APIs that have been requested, broken out by API group, version, resource, subresource, and removed_release.",
    );
    let dep = c
        .stats
        .deprecated
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for (group, version, resource, removed) in dep.keys() {
        let _ = writeln!(
            out,
            "apiserver_requested_deprecated_apis{{group=\"{group}\",removed_release=\"{removed}\",resource=\"{resource}\",subresource=\"\",version=\"{version}\"}} 1"
        );
    }
    family(
        &mut out,
        "apiserver_longrunning_requests",
        "gauge",
        "[STABLE] Gauge of all active long-running apiserver requests broken out by verb, group, version, resource, scope and component.",
    );
    let _ = writeln!(
        out,
        "apiserver_longrunning_requests{{component=\"apiserver\",verb=\"WATCH\"}} {}",
        c.stats.watches.load(std::sync::atomic::Ordering::Relaxed)
    );
    family(
        &mut out,
        "apiserver_request_duration_seconds",
        "histogram",
        "[STABLE] Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.",
    );
    let latency = c
        .stats
        .latency
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for (verb, h) in &latency {
        for (n, le) in h.buckets.iter().zip(crate::cluster::LATENCY_BUCKETS) {
            let _ = writeln!(
                out,
                "apiserver_request_duration_seconds_bucket{{component=\"apiserver\",verb=\"{verb}\",le=\"{le}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "apiserver_request_duration_seconds_bucket{{component=\"apiserver\",verb=\"{verb}\",le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(
            out,
            "apiserver_request_duration_seconds_sum{{component=\"apiserver\",verb=\"{verb}\"}} {}",
            h.sum
        );
        let _ = writeln!(
            out,
            "apiserver_request_duration_seconds_count{{component=\"apiserver\",verb=\"{verb}\"}} {}",
            h.count
        );
    }
    family(
        &mut out,
        "etcd_request_duration_seconds",
        "histogram",
        "[ALPHA] Etcd request latency in seconds for each operation and object type.",
    );
    let total: u64 = requests.values().sum();
    for le in ["0.005", "0.025", "0.1", "0.5", "+Inf"] {
        let _ = writeln!(
            out,
            "etcd_request_duration_seconds_bucket{{operation=\"get\",type=\"*\",le=\"{le}\"}} {total}"
        );
    }
    let _ = writeln!(
        out,
        "etcd_request_duration_seconds_sum{{operation=\"get\",type=\"*\"}} {:.3}",
        total as f64 * 0.002
    );
    let _ = writeln!(
        out,
        "etcd_request_duration_seconds_count{{operation=\"get\",type=\"*\"}} {total}"
    );
    out
}

fn all(c: &Cluster, group: &str, plural: &str) -> Vec<std::sync::Arc<Value>> {
    c.store.all(&ResKey::new(group, plural), None)
}

fn num(v: &Value, ptr: &str) -> i64 {
    v.at(ptr).and_then(Value::as_i64).unwrap_or(0)
}

/// kube-state-metrics' scrape (the series the correlator and the TSDB use).
pub fn kube_state_metrics(c: &Cluster) -> String {
    let mut out = String::new();
    let pods = all(c, "", "pods");
    family(
        &mut out,
        "kube_pod_info",
        "gauge",
        "[STABLE] Information about pod.",
    );
    for p in &pods {
        let _ = writeln!(
            out,
            "kube_pod_info{{namespace=\"{}\",pod=\"{}\",uid=\"{}\",node=\"{}\",host_ip=\"{}\",pod_ip=\"{}\",created_by_kind=\"ReplicaSet\",priority_class=\"\",host_network=\"false\"}} 1",
            str_at(p, &["metadata", "namespace"]),
            str_at(p, &["metadata", "name"]),
            str_at(p, &["metadata", "uid"]),
            str_at(p, &["spec", "nodeName"]),
            str_at(p, &["status", "hostIP"]),
            str_at(p, &["status", "podIP"]),
        );
    }
    family(
        &mut out,
        "kube_pod_status_phase",
        "gauge",
        "[STABLE] The pods current phase.",
    );
    for p in &pods {
        let phase = str_at(p, &["status", "phase"]);
        for candidate in ["Pending", "Succeeded", "Failed", "Unknown", "Running"] {
            let _ = writeln!(
                out,
                "kube_pod_status_phase{{namespace=\"{}\",pod=\"{}\",uid=\"{}\",phase=\"{candidate}\"}} {}",
                str_at(p, &["metadata", "namespace"]),
                str_at(p, &["metadata", "name"]),
                str_at(p, &["metadata", "uid"]),
                u8::from(phase == candidate)
            );
        }
    }
    family(
        &mut out,
        "kube_pod_container_status_restarts_total",
        "counter",
        "[STABLE] The number of container restarts per container.",
    );
    family(
        &mut out,
        "kube_pod_container_status_waiting_reason",
        "gauge",
        "[BETA] Describes the reason the container is currently in waiting state.",
    );
    let mut waiting = String::new();
    for p in &pods {
        for s in p
            .at("/status/containerStatuses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let labels = format!(
                "namespace=\"{}\",pod=\"{}\",uid=\"{}\",container=\"{}\"",
                str_at(p, &["metadata", "namespace"]),
                str_at(p, &["metadata", "name"]),
                str_at(p, &["metadata", "uid"]),
                str_at(s, &["name"]),
            );
            let _ = writeln!(
                out,
                "kube_pod_container_status_restarts_total{{{labels}}} {}",
                num(s, "/restartCount")
            );
            if let Some(reason) = s.at("/state/waiting/reason").and_then(Value::as_str) {
                let _ = writeln!(
                    waiting,
                    "kube_pod_container_status_waiting_reason{{{labels},reason=\"{reason}\"}} 1"
                );
            }
        }
    }
    out.push_str(&waiting);
    // Requests as the API server defaults them: a resource with a limit and no request requests its limit
    // (how a pod asking only `limits: {nvidia.com/gpu: 1}` holds a GPU).
    for (name, help, requests) in [
        (
            "kube_pod_container_resource_requests",
            "[STABLE] The number of requested request resource by a container. It is recommended to use the kube_pod_resource_requests metric exposed by kube-scheduler instead, as it is more precise.",
            true,
        ),
        (
            "kube_pod_container_resource_limits",
            "[STABLE] The number of requested limit resource by a container. It is recommended to use the kube_pod_resource_limits metric exposed by kube-scheduler instead, as it is more precise.",
            false,
        ),
    ] {
        family(&mut out, name, "gauge", help);
        for p in &pods {
            for ctr in p
                .at("/spec/containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let res = |kind: &str| {
                    ctr.at(&format!("/resources/{kind}"))
                        .and_then(Value::as_object)
                };
                let mut amounts = res("limits").cloned().unwrap_or_default();
                if requests && let Some(r) = res("requests") {
                    amounts.extend(r.clone());
                }
                for (res, q) in &amounts {
                    let (resource, unit, value) = quantity(res, q.as_str().unwrap_or("0"));
                    let _ = writeln!(
                        out,
                        "{name}{{namespace=\"{}\",pod=\"{}\",uid=\"{}\",container=\"{}\",node=\"{}\",resource=\"{resource}\",unit=\"{unit}\"}} {value}",
                        str_at(p, &["metadata", "namespace"]),
                        str_at(p, &["metadata", "name"]),
                        str_at(p, &["metadata", "uid"]),
                        str_at(ctr, &["name"]),
                        str_at(p, &["spec", "nodeName"]),
                    );
                }
            }
        }
    }
    let deps = all(c, "apps", "deployments");
    for (name, ptr, help) in [
        (
            "kube_deployment_spec_replicas",
            "/spec/replicas",
            "[STABLE] Number of desired pods for a deployment.",
        ),
        (
            "kube_deployment_status_replicas_available",
            "/status/availableReplicas",
            "[STABLE] The number of available replicas per deployment.",
        ),
        (
            "kube_deployment_status_replicas_updated",
            "/status/updatedReplicas",
            "[STABLE] The number of updated replicas per deployment.",
        ),
        (
            "kube_deployment_status_observed_generation",
            "/status/observedGeneration",
            "[STABLE] The generation observed by the deployment controller.",
        ),
        (
            "kube_deployment_metadata_generation",
            "/metadata/generation",
            "[STABLE] Sequence number representing a specific generation of the desired state.",
        ),
    ] {
        family(&mut out, name, "gauge", help);
        for d in &deps {
            let _ = writeln!(
                out,
                "{name}{{namespace=\"{}\",deployment=\"{}\"}} {}",
                str_at(d, &["metadata", "namespace"]),
                str_at(d, &["metadata", "name"]),
                num(d, ptr)
            );
        }
    }
    let ds = all(c, "apps", "daemonsets");
    for (name, ptr, help) in [
        (
            "kube_daemonset_status_desired_number_scheduled",
            "/status/desiredNumberScheduled",
            "[STABLE] The number of nodes that should be running the daemon pod.",
        ),
        (
            "kube_daemonset_status_number_ready",
            "/status/numberReady",
            "[STABLE] The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready.",
        ),
    ] {
        family(&mut out, name, "gauge", help);
        for d in &ds {
            let _ = writeln!(
                out,
                "{name}{{namespace=\"{}\",daemonset=\"{}\"}} {}",
                str_at(d, &["metadata", "namespace"]),
                str_at(d, &["metadata", "name"]),
                num(d, ptr)
            );
        }
    }
    let nodes = all(c, "", "nodes");
    family(
        &mut out,
        "kube_node_status_condition",
        "gauge",
        "[STABLE] The condition of a cluster node.",
    );
    for n in &nodes {
        for cond in n
            .at("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let status = str_at(cond, &["status"]);
            for candidate in ["true", "false", "unknown"] {
                let _ = writeln!(
                    out,
                    "kube_node_status_condition{{node=\"{}\",condition=\"{}\",status=\"{candidate}\"}} {}",
                    str_at(n, &["metadata", "name"]),
                    str_at(cond, &["type"]),
                    u8::from(status.eq_ignore_ascii_case(candidate))
                );
            }
        }
    }
    family(
        &mut out,
        "kube_node_status_allocatable",
        "gauge",
        "[STABLE] The allocatable for different resources of a node that are available for scheduling.",
    );
    for n in &nodes {
        if let Some(alloc) = n.at("/status/allocatable").and_then(Value::as_object) {
            for (res, v) in alloc {
                let (resource, unit, value) = quantity(res, v.as_str().unwrap_or("0"));
                let _ = writeln!(
                    out,
                    "kube_node_status_allocatable{{node=\"{}\",resource=\"{resource}\",unit=\"{unit}\"}} {value}",
                    str_at(n, &["metadata", "name"])
                );
            }
        }
    }
    out
}

/// (resource label, unit, value) as kube-state-metrics writes a node quantity.
fn quantity(res: &str, q: &str) -> (String, &'static str, f64) {
    let resource = res.replace(['.', '/', '-'], "_");
    let parse = |s: &str| s.parse::<f64>().unwrap_or(0.0);
    let (value, unit) = if let Some(m) = q.strip_suffix('m') {
        (parse(m) / 1000.0, "core")
    } else if let Some(k) = q.strip_suffix("Ki") {
        (parse(k) * 1024.0, "byte")
    } else if let Some(m) = q.strip_suffix("Mi") {
        (parse(m) * 1024.0 * 1024.0, "byte")
    } else if let Some(g) = q.strip_suffix("Gi") {
        (parse(g) * 1024.0 * 1024.0 * 1024.0, "byte")
    } else {
        (parse(q), if res == "cpu" { "core" } else { "integer" })
    };
    (resource, unit, value)
}

/// node-exporter's scrape for one node.
pub fn node_exporter(c: &Cluster, node: &str) -> String {
    let mut out = String::new();
    let h = crate::hash64(node);
    let uptime = (c.now().timestamp() - 1_700_000_000) as f64;
    family(
        &mut out,
        "node_cpu_seconds_total",
        "counter",
        "Seconds the CPUs spent in each mode.",
    );
    for cpu in 0..4 {
        for (mode, share) in [
            ("idle", 0.7),
            ("system", 0.08),
            ("user", 0.2),
            ("iowait", 0.02),
        ] {
            let _ = writeln!(
                out,
                "node_cpu_seconds_total{{cpu=\"{cpu}\",mode=\"{mode}\"}} {:.2}",
                uptime * share
            );
        }
    }
    family(
        &mut out,
        "node_memory_MemTotal_bytes",
        "gauge",
        "Memory information field MemTotal_bytes.",
    );
    let _ = writeln!(out, "node_memory_MemTotal_bytes 3.3554432e+10");
    family(
        &mut out,
        "node_memory_MemAvailable_bytes",
        "gauge",
        "Memory information field MemAvailable_bytes.",
    );
    let _ = writeln!(
        out,
        "node_memory_MemAvailable_bytes {}",
        8_000_000_000u64 + (h % 8_000_000_000)
    );
    family(
        &mut out,
        "node_filesystem_avail_bytes",
        "gauge",
        "Filesystem space available to non-root users in bytes.",
    );
    let _ = writeln!(
        out,
        "node_filesystem_avail_bytes{{device=\"/dev/nvme0n1p1\",fstype=\"ext4\",mountpoint=\"/\"}} {}",
        20_000_000_000u64 + (h % 30_000_000_000)
    );
    family(&mut out, "node_load1", "gauge", "1m load average.");
    let _ = writeln!(out, "node_load1 {:.2}", (h % 400) as f64 / 100.0);
    family(
        &mut out,
        "node_network_receive_bytes_total",
        "counter",
        "Network device statistic receive_bytes.",
    );
    let _ = writeln!(
        out,
        "node_network_receive_bytes_total{{device=\"eth0\"}} {:.0}",
        uptime * 1000.0
    );
    family(
        &mut out,
        "node_boot_time_seconds",
        "gauge",
        "Node boot time, in unixtime.",
    );
    let _ = writeln!(out, "node_boot_time_seconds 1.7e+09");
    out
}

/// One Deployment's request counters, as its workload's scrape shows them.
#[derive(Debug, Clone, Copy)]
pub struct WorkloadRequests<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Deployment name.
    pub deployment: &'a str,
    /// Requests answered 200 so far.
    pub ok: f64,
    /// Requests answered 500 so far.
    pub errors: f64,
}

/// The scrape of the workloads behind a Service (see [`crate::traffic`]): per Deployment,
/// `http_requests_total{namespace,deployment,code="200"|"500"}` and the
/// `http_request_duration_seconds{namespace,deployment}` histogram. Counts are whole requests (rounded
/// down, so they never go back).
pub fn workloads(items: &[WorkloadRequests<'_>]) -> String {
    use crate::traffic::{DURATION_BUCKETS, MEAN_DURATION_S};
    let mut out = String::new();
    family(
        &mut out,
        "http_requests_total",
        "counter",
        "Requests served, by HTTP status code.",
    );
    for w in items {
        let (ns, d) = (esc(w.namespace), esc(w.deployment));
        for (code, n) in [("200", w.ok), ("500", w.errors)] {
            let _ = writeln!(
                out,
                "http_requests_total{{namespace=\"{ns}\",deployment=\"{d}\",code=\"{code}\"}} {}",
                n.floor()
            );
        }
    }
    family(
        &mut out,
        "http_request_duration_seconds",
        "histogram",
        "Time taken to answer requests.",
    );
    for w in items {
        let (ns, d) = (esc(w.namespace), esc(w.deployment));
        let total = w.ok + w.errors;
        for (le, share) in DURATION_BUCKETS {
            let _ = writeln!(
                out,
                "http_request_duration_seconds_bucket{{namespace=\"{ns}\",deployment=\"{d}\",le=\"{le}\"}} {}",
                (total * share).floor()
            );
        }
        let _ = writeln!(
            out,
            "http_request_duration_seconds_bucket{{namespace=\"{ns}\",deployment=\"{d}\",le=\"+Inf\"}} {}",
            total.floor()
        );
        let _ = writeln!(
            out,
            "http_request_duration_seconds_sum{{namespace=\"{ns}\",deployment=\"{d}\"}} {:.3}",
            total.floor() * MEAN_DURATION_S
        );
        let _ = writeln!(
            out,
            "http_request_duration_seconds_count{{namespace=\"{ns}\",deployment=\"{d}\"}} {}",
            total.floor()
        );
    }
    out
}
