//! A catalog of real Kubernetes event shapes, as data: who reports them, about which kind of object, the
//! reason, the type, the message template exactly as the reporting component formats it (with typed
//! placeholders for the parts that change), and whether it is a problem or normal lifecycle.
//!
//! It feeds [`crate::stream`] (a realistic fleet event stream) and the correlator's fingerprint tests
//! (`services/correlator/tests/shapes.rs`): every problem shape must collapse to one fingerprint per object
//! whatever its placeholders say.
//!
//! Covered, with the source each format was checked against (Kubernetes files are in
//! `github.com/kubernetes/kubernetes` unless another repository is named):
//!
//! - **kubelet, images** — `Pulling`, `Pulled` (three forms: `in {duration}` as in the 2020 kind fixture,
//!   `... Image size: N bytes.` since v1.30, `already present on machine` as in the k3s v1.24 fixture and
//!   its v1.33 `... and can be accessed by the pod` form), `Failed to pull image %q: %v` (containerd
//!   `NotFound` and `401 Unauthorized` errors), `Error: ErrImagePull`, `Error: ImagePullBackOff`,
//!   `Back-off pulling image %q` (a *Normal* event), `ErrImageNeverPull`:
//!   `pkg/kubelet/images/image_manager.go`, `pkg/kubelet/kuberuntime/kuberuntime_container.go`
//!   (`"Error: %v"`).
//! - **kubelet, containers** — `Created container %s` (k3s v1.24 fixture) and `Created container: %s`
//!   (v1.32+), `Started container %s`, `Stopping container %s`, `Container %s failed liveness probe, will
//!   be restarted`, `Back-off restarting failed container %s in pod %s` (the pod as `name_ns(uid)`) and the
//!   older bare `Back-off restarting failed container` (k3s v1.24 fixture), `Error: ...` from the runtime
//!   (`CreateContainerError`, `CreateContainerConfigError`, `runAsNonRoot`):
//!   `pkg/kubelet/kuberuntime/kuberuntime_container.go`, `kuberuntime_manager.go`,
//!   `pkg/kubelet/kubelet_pods.go`.
//! - **kubelet, probes** — `%s probe failed: %s` with the HTTP prober's outputs (`HTTP probe failed with
//!   statuscode: %d`, Go's `Get "...": dial tcp ...: connect: connection refused`, `context deadline
//!   exceeded (Client.Timeout exceeded while awaiting headers)`): `pkg/kubelet/prober/prober.go`,
//!   `pkg/probe/http/http.go`.
//! - **kubelet, volumes and sandboxes** — `MountVolume.SetUp failed for volume %q : %v`, `Unable to attach
//!   or mount volumes: unmounted volumes=[...], unattached volumes=[...]: timed out waiting for the
//!   condition` (and the v1.26+ `failed to process volumes=[]: context deadline exceeded` form),
//!   `Failed to create pod sandbox: %v` (a Calico CNI error), `Pod sandbox changed, it will be killed and
//!   re-created.`: `pkg/kubelet/volumemanager/volume_manager.go`,
//!   `pkg/volume/util/operationexecutor/operation_generator.go`, `kuberuntime_manager.go`.
//! - **kubelet, node** — `Node %s status is now: %s` (`NodeReady`, `NodeNotReady`, `NodeHasDiskPressure`;
//!   *Normal* events, also sent by the node lifecycle controller), `Starting kubelet.`, `Attempting to
//!   reclaim %s`, eviction `The node was low on resource: %v. Threshold quantity: %v, available: %v.
//!   Container %s was using %s, request is %s, has larger consumption of %v. `:
//!   `pkg/kubelet/kubelet_node_status.go`, `pkg/controller/nodelifecycle`, `pkg/kubelet/eviction/helpers.go`.
//! - **node-problem-detector** — `OOMKilling` and `TaskHung`, the kernel log line its rules match
//!   (`Killed process \d+ (.+) total-vm:\d+kB, anon-rss:\d+kB, file-rss:\d+kB.*`, `task [\S ]+:\w+ blocked
//!   for more than \w+ seconds\.`): `github.com/kubernetes/node-problem-detector` `config/kernel-monitor.json`.
//! - **default-scheduler** — `FailedScheduling` `0/%v nodes are available: %v.` with its sorted fit errors
//!   and the `preemption: ...` tail (v1.24+), `Successfully assigned %v/%v to %v`:
//!   `pkg/scheduler/framework/types.go` (`FitError.Error`), `pkg/scheduler/schedule_one.go`.
//! - **kube-controller-manager** — ReplicaSet `Created pod: %v`, `Deleted pod: %v`, `Error creating: %v`
//!   (quota and missing service account; `pkg/controller/controller_utils.go`); Deployment `Scaled up/down
//!   replica set %s to %d` and the v1.31+ `from %d to %d` form (`pkg/controller/deployment/sync.go`);
//!   HPA `FailedGetResourceMetric`, `FailedComputeMetricsReplicas`, `New size: %d; reason: %s`
//!   (`pkg/controller/podautoscaler/horizontal.go`); Job `Created pod`, `Job completed`, `Job has reached
//!   the specified backoff limit`, `Job was active longer than specified deadline`
//!   (`pkg/controller/job/job_controller.go`); CronJob `Created job %v`, `Saw completed job: %s, status: %v`
//!   (`pkg/controller/cronjob/cronjob_controllerv2.go`); PVC `ProvisioningFailed`, `FailedBinding`,
//!   `ExternalProvisioning`, `WaitForFirstConsumer` (`pkg/controller/volume/persistentvolume/pv_controller.go`,
//!   `ProvisioningSucceeded` from `kubernetes-csi/external-provisioner`); `FailedToUpdateEndpoint`
//!   `Failed to update endpoint %v/%v: %v` (`pkg/controller/endpoint/endpoints_controller.go`);
//!   attach/detach `Multi-Attach error for volume %q ...`, `AttachVolume.Attach succeeded for volume %q`
//!   (`pkg/volume/util/operationexecutor`); node controller `Registered Node %v in Controller`.
//! - **cluster-autoscaler** — `pod triggered scale-up: %v` (`[{group 3->5 (max: 10)}]`),
//!   `pod didn't trigger scale-up: %s` (aggregated `N reason` list, or `max total nodes in cluster
//!   reached`), `ScaleDown` `deleting pod for node scale down` and `marked the node as
//!   toBeDeleted/unschedulable`: `github.com/kubernetes/autoscaler` `cluster-autoscaler/processors/status/
//!   eventing_scale_up_processor.go`, `cluster-autoscaler/core/scaledown/actuation`.
//! - **ingress-nginx** — `Sync` `Scheduled for sync` (`internal/ingress/controller/store/store.go`),
//!   `RELOAD` `NGINX reload triggered due to a change in configuration` and the Warning `Error reloading
//!   NGINX: %v` with `nginx -t`'s output (`internal/ingress/controller/nginx.go`), in
//!   `github.com/kubernetes/ingress-nginx`. The admission webhook's `denied the request` is an API error
//!   returned to the client, not an Event, so it is not here; NGINX Inc.'s controller does record
//!   `Rejected` (`%v was rejected: %v`) and `AddedOrUpdated` events
//!   (`github.com/nginxinc/kubernetes-ingress` `internal/k8s/controller.go`), which are.
//!
//! Any client-go recorder may also rewrite a message as `(combined from similar events): %s` when more
//! than ten events differ only in their message (`k8s.io/client-go/tools/record/events_cache.go`); the
//! stream produces those too.
//!
//! Not covered: node names made of an instance id (EKS `ip-10-0-1-2.<region>.compute.internal`, GKE
//! managed instance groups' `-x7kq`) are one object per node; the stream names nodes as Karpenter and
//! `generateName` do (`<pool>-<5 random>`), one object per pool once masked.

/// The type of a Kubernetes event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// `Normal`.
    Normal,
    /// `Warning`.
    Warning,
}

impl EventType {
    /// As the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// The kind of object an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A Pod (named after its workload, with generated parts).
    Pod,
    /// A Node (named after its pool, with a generated suffix).
    Node,
    /// A Deployment.
    Deployment,
    /// A ReplicaSet (`<deployment>-<pod-template-hash>`).
    ReplicaSet,
    /// A Job (`<cronjob>-<scheduled minute>`).
    Job,
    /// A CronJob.
    CronJob,
    /// A HorizontalPodAutoscaler.
    HorizontalPodAutoscaler,
    /// A PersistentVolumeClaim (`data-<statefulset>-<ordinal>`).
    PersistentVolumeClaim,
    /// An Endpoints object.
    Endpoints,
    /// An Ingress.
    Ingress,
}

impl Kind {
    /// The kind as `involvedObject.kind` says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Node => "Node",
            Kind::Deployment => "Deployment",
            Kind::ReplicaSet => "ReplicaSet",
            Kind::Job => "Job",
            Kind::CronJob => "CronJob",
            Kind::HorizontalPodAutoscaler => "HorizontalPodAutoscaler",
            Kind::PersistentVolumeClaim => "PersistentVolumeClaim",
            Kind::Endpoints => "Endpoints",
            Kind::Ingress => "Ingress",
        }
    }

    /// The `apiVersion` of the kind.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Pod | Kind::Node | Kind::PersistentVolumeClaim | Kind::Endpoints => "v1",
            Kind::Deployment | Kind::ReplicaSet => "apps/v1",
            Kind::Job | Kind::CronJob => "batch/v1",
            Kind::HorizontalPodAutoscaler => "autoscaling/v2",
            Kind::Ingress => "networking.k8s.io/v1",
        }
    }
}

/// What a placeholder in a template stands for. Identity placeholders name the problem's subject and stay
/// the same for one object; the others change between occurrences. A template may number a placeholder
/// (`{quantity2}`) to have two different values of one type in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholder {
    /// Namespace (identity).
    Ns,
    /// Workload name (identity).
    Workload,
    /// Container name (identity).
    Container,
    /// Process name as the kernel logs it (identity).
    Process,
    /// Node pool / node group (identity).
    Pool,
    /// A named volume, secret, configmap, service account or storage class of the workload (identity).
    Volume,
    /// A pod name with its generated parts.
    Pod,
    /// A ReplicaSet name (`<deployment>-<hash>`).
    Rs,
    /// A Job name (`<cronjob>-<minute>`).
    Job,
    /// A node name (`<pool>-<suffix>`).
    Node,
    /// A pod IP.
    Ip,
    /// A port.
    Port,
    /// A Go duration (`1m30s`, `5.870196872s`, `312ms`).
    Duration,
    /// A resource quantity (`500m`, `2Gi`, `92104Ki`).
    Quantity,
    /// An image reference (`registry/repo:tag`, sometimes `@sha256:...`).
    Image,
    /// An image tag.
    Tag,
    /// A hex digest or container/sandbox id (64 hex).
    Digest,
    /// A small count.
    Count,
    /// A UUID.
    Uuid,
    /// A release version (`v1.7.12`).
    Version,
    /// A byte size.
    Bytes,
    /// A process id.
    Pid,
    /// An HTTP status code of a failing probe.
    Status,
    /// A random 5-character `generateName` suffix.
    Suffix,
    /// A PersistentVolume name (`pvc-<uuid>`).
    Pv,
    /// A random decimal, as in Go's temp-file names (`nginx-cfg3712301224`).
    Random,
}

impl Placeholder {
    /// The placeholder a template name stands for (`quantity2` → [`Placeholder::Quantity`]).
    pub fn from_name(name: &str) -> Option<Placeholder> {
        use Placeholder::*;
        Some(match name.trim_end_matches(|c: char| c.is_ascii_digit()) {
            "ns" => Ns,
            "workload" => Workload,
            "container" => Container,
            "process" => Process,
            "pool" => Pool,
            "volume" => Volume,
            "pod" => Pod,
            "rs" => Rs,
            "job" => Job,
            "node" => Node,
            "ip" => Ip,
            "port" => Port,
            "duration" => Duration,
            "quantity" => Quantity,
            "image" => Image,
            "tag" => Tag,
            "digest" => Digest,
            "count" => Count,
            "uuid" => Uuid,
            "version" => Version,
            "bytes" => Bytes,
            "pid" => Pid,
            "status" => Status,
            "suffix" => Suffix,
            "pv" => Pv,
            "random" => Random,
            _ => return None,
        })
    }

    /// Whether it names the subject (the same for every occurrence of one problem).
    pub fn is_identity(self) -> bool {
        use Placeholder::*;
        matches!(self, Ns | Workload | Container | Process | Pool | Volume)
    }
}

/// One kind of event a real component emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The reporting component (`source.component` / `reportingController`).
    pub reporter: &'static str,
    /// The kind of the involved object.
    pub kind: Kind,
    /// The reason.
    pub reason: &'static str,
    /// Normal or Warning.
    pub event_type: EventType,
    /// The message, with `{placeholder}`s; `{{` and `}}` are literal braces.
    pub template: &'static str,
    /// A problem (something is wrong) rather than normal lifecycle.
    pub problem: bool,
}

impl Shape {
    /// The placeholder names the template uses, in order (with repeats).
    pub fn placeholder_names(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let mut rest = self.template;
        while let Some(i) = rest.find(['{', '}']) {
            let r = &rest[i..];
            if r.starts_with("{{") || r.starts_with("}}") {
                rest = &r[2..];
            } else if r.starts_with('{') {
                let end = r.find('}').unwrap_or(r.len() - 1);
                out.push(&r[1..end]);
                rest = &r[end + 1..];
            } else {
                rest = &r[1..];
            }
        }
        out
    }

    /// The message, each placeholder filled by `fill(name, kind)`; the same name gets the same value
    /// within one message.
    pub fn render(&self, mut fill: impl FnMut(&str, Placeholder) -> String) -> String {
        let mut out = String::with_capacity(self.template.len() + 64);
        let mut seen: Vec<(&str, String)> = Vec::new();
        let mut rest = self.template;
        while let Some(i) = rest.find(['{', '}']) {
            out.push_str(&rest[..i]);
            let r = &rest[i..];
            if let Some(after) = r.strip_prefix("{{") {
                out.push('{');
                rest = after;
            } else if let Some(after) = r.strip_prefix("}}") {
                out.push('}');
                rest = after;
            } else if let Some(inner) = r.strip_prefix('{') {
                let end = inner.find('}').unwrap_or(inner.len());
                let name = &inner[..end];
                let value = match seen.iter().find(|(n, _)| *n == name) {
                    Some((_, v)) => v.clone(),
                    None => {
                        let kind = Placeholder::from_name(name).unwrap_or(Placeholder::Count);
                        let v = fill(name, kind);
                        seen.push((name, v.clone()));
                        v
                    }
                };
                out.push_str(&value);
                rest = inner.get(end + 1..).unwrap_or("");
            } else {
                out.push('}');
                rest = &r[1..];
            }
        }
        out.push_str(rest);
        out
    }
}

const fn s(
    reporter: &'static str,
    kind: Kind,
    reason: &'static str,
    event_type: EventType,
    template: &'static str,
    problem: bool,
) -> Shape {
    Shape {
        reporter,
        kind,
        reason,
        event_type,
        template,
        problem,
    }
}

use EventType::{Normal, Warning};
use Kind::*;

const KUBELET: &str = "kubelet";
const SCHEDULER: &str = "default-scheduler";
const NPD: &str = "kernel-monitor";
const CA: &str = "cluster-autoscaler";
const NGINX: &str = "nginx-ingress-controller";

/// The catalog.
pub const SHAPES: &[Shape] = &[
    // kubelet: images
    s(
        KUBELET,
        Pod,
        "Pulling",
        Normal,
        "Pulling image \"{image}\"",
        false,
    ),
    s(
        KUBELET,
        Pod,
        "Pulled",
        Normal,
        "Successfully pulled image \"{image}\" in {duration}",
        false,
    ),
    s(
        KUBELET,
        Pod,
        "Pulled",
        Normal,
        "Successfully pulled image \"{image}\" in {duration} ({duration2} including waiting). Image size: {bytes} bytes.",
        false,
    ),
    s(
        KUBELET,
        Pod,
        "Pulled",
        Normal,
        "Container image \"{image}\" already present on machine",
        false,
    ),
    s(
        KUBELET,
        Pod,
        "Pulled",
        Normal,
        "Container image \"{image}\" already present on machine and can be accessed by the pod",
        false,
    ),
    s(
        KUBELET,
        Pod,
        "Failed",
        Warning,
        "Failed to pull image \"{image}\": rpc error: code = NotFound desc = failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": {image}: not found",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "Failed",
        Warning,
        "Failed to pull image \"{image}\": failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": unexpected status from HEAD request to https://{image}: 401 Unauthorized",
        true,
    ),
    s(KUBELET, Pod, "Failed", Warning, "Error: ErrImagePull", true),
    s(
        KUBELET,
        Pod,
        "Failed",
        Warning,
        "Error: ImagePullBackOff",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "BackOff",
        Normal,
        "Back-off pulling image \"{image}\"",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "ErrImageNeverPull",
        Warning,
        "Container image \"{image}\" is not present with pull policy of Never",
        true,
    ),
    // kubelet: containers
    s(
        KUBELET,
        Pod,
        "Created",
        Normal,
        "Created container {container}",
        false,
    ),
    s(
        KUBELET,
        Pod,
        "Created",
        Normal,
        "Created container: {container}",
        false,
    ),
    s(
        KUBELET,
        Pod,
        "Started",
        Normal,
        "Started container {container}",
        false,
    ),
    s(
        KUBELET,
        Pod,
        "Killing",
        Normal,
        "Stopping container {container}",
        false,
    ),
    s(
        KUBELET,
        Pod,
        "Killing",
        Normal,
        "Container {container} failed liveness probe, will be restarted",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "BackOff",
        Warning,
        "Back-off restarting failed container {container} in pod {pod}_{ns}({uuid})",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "BackOff",
        Warning,
        "Back-off restarting failed container",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "Failed",
        Warning,
        "Error: failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: \"/docker-entrypoint.sh\": permission denied: unknown",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "Failed",
        Warning,
        "Error: secret \"{volume}\" not found",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "Failed",
        Warning,
        "Error: container has runAsNonRoot and image will run as root (pod: \"{pod}_{ns}({uuid})\", container: {container})",
        true,
    ),
    // kubelet: probes
    s(
        KUBELET,
        Pod,
        "Unhealthy",
        Warning,
        "Liveness probe failed: HTTP probe failed with statuscode: {status}",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "Unhealthy",
        Warning,
        "Readiness probe failed: Get \"http://{ip}:{port}/ready\": dial tcp {ip}:{port}: connect: connection refused",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "Unhealthy",
        Warning,
        "Readiness probe failed: Get \"http://{ip}:{port}/healthz\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "Unhealthy",
        Warning,
        "Startup probe failed: Get \"http://{ip}:{port}/startup\": dial tcp {ip}:{port}: connect: connection refused",
        true,
    ),
    // kubelet: volumes and sandboxes
    s(
        KUBELET,
        Pod,
        "FailedMount",
        Warning,
        "MountVolume.SetUp failed for volume \"{volume}\" : secret \"{volume}\" not found",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "FailedMount",
        Warning,
        "MountVolume.SetUp failed for volume \"{pv}\" : rpc error: code = DeadlineExceeded desc = context deadline exceeded",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "FailedMount",
        Warning,
        "Unable to attach or mount volumes: unmounted volumes=[{volume}], unattached volumes=[{volume} kube-api-access-{suffix}]: timed out waiting for the condition",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "FailedMount",
        Warning,
        "Unable to attach or mount volumes: unmounted volumes=[{volume}], unattached volumes=[], failed to process volumes=[]: context deadline exceeded",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "FailedCreatePodSandBox",
        Warning,
        "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox \"{digest}\": plugin type=\"calico\" failed (add): error getting ClusterInformation: connection is unauthorized: Unauthorized",
        true,
    ),
    s(
        KUBELET,
        Pod,
        "SandboxChanged",
        Normal,
        "Pod sandbox changed, it will be killed and re-created.",
        false,
    ),
    s(
        KUBELET,
        Pod,
        "Evicted",
        Warning,
        "The node was low on resource: memory. Threshold quantity: {quantity}, available: {quantity2}. Container {container} was using {quantity3}, request is {quantity4}, has larger consumption of memory. ",
        true,
    ),
    // kubelet and node controller: nodes
    s(
        KUBELET,
        Node,
        "NodeNotReady",
        Normal,
        "Node {node} status is now: NodeNotReady",
        true,
    ),
    s(
        KUBELET,
        Node,
        "NodeReady",
        Normal,
        "Node {node} status is now: NodeReady",
        false,
    ),
    s(
        KUBELET,
        Node,
        "NodeHasDiskPressure",
        Normal,
        "Node {node} status is now: NodeHasDiskPressure",
        true,
    ),
    s(
        KUBELET,
        Node,
        "Starting",
        Normal,
        "Starting kubelet.",
        false,
    ),
    s(
        KUBELET,
        Node,
        "EvictionThresholdMet",
        Warning,
        "Attempting to reclaim memory",
        true,
    ),
    s(
        "node-controller",
        Node,
        "RegisteredNode",
        Normal,
        "Node {node} event: Registered Node {node} in Controller",
        false,
    ),
    // node-problem-detector
    s(
        NPD,
        Node,
        "OOMKilling",
        Warning,
        "Memory cgroup out of memory: Killed process {pid} ({process}) total-vm:{count}kB, anon-rss:{count2}kB, file-rss:{count3}kB, shmem-rss:0kB, UID:{count4} pgtables:{count5}kB oom_score_adj:{count6}",
        true,
    ),
    s(
        NPD,
        Node,
        "TaskHung",
        Warning,
        "task {process}:{pid} blocked for more than {count} seconds.",
        true,
    ),
    // default-scheduler
    s(
        SCHEDULER,
        Pod,
        "FailedScheduling",
        Warning,
        "0/{count} nodes are available: {count2} Insufficient cpu, {count3} node(s) had untolerated taint {{node-role.kubernetes.io/control-plane: }}. preemption: 0/{count} nodes are available: {count3} Preemption is not helpful for scheduling, {count2} No preemption victims found for incoming pod.",
        true,
    ),
    s(
        SCHEDULER,
        Pod,
        "FailedScheduling",
        Warning,
        "0/{count} nodes are available: {count} Insufficient memory. preemption: 0/{count} nodes are available: {count} No preemption victims found for incoming pod.",
        true,
    ),
    s(
        SCHEDULER,
        Pod,
        "FailedScheduling",
        Warning,
        "0/{count} nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/{count} nodes are available: {count} Preemption is not helpful for scheduling.",
        true,
    ),
    s(
        SCHEDULER,
        Pod,
        "FailedScheduling",
        Warning,
        "0/{count} nodes are available: {count2} node(s) didn't match Pod's node affinity/selector, {count3} node(s) had volume node affinity conflict. preemption: 0/{count} nodes are available: {count} Preemption is not helpful for scheduling.",
        true,
    ),
    s(
        SCHEDULER,
        Pod,
        "Scheduled",
        Normal,
        "Successfully assigned {ns}/{pod} to {node}",
        false,
    ),
    // kube-controller-manager
    s(
        "replicaset-controller",
        ReplicaSet,
        "SuccessfulCreate",
        Normal,
        "Created pod: {pod}",
        false,
    ),
    s(
        "replicaset-controller",
        ReplicaSet,
        "SuccessfulDelete",
        Normal,
        "Deleted pod: {pod}",
        false,
    ),
    s(
        "replicaset-controller",
        ReplicaSet,
        "FailedCreate",
        Warning,
        "Error creating: pods \"{pod}\" is forbidden: exceeded quota: compute, requested: cpu={quantity}, used: cpu={quantity2}, limited: cpu={quantity3}",
        true,
    ),
    s(
        "replicaset-controller",
        ReplicaSet,
        "FailedCreate",
        Warning,
        "Error creating: pods \"{pod}\" is forbidden: error looking up service account {ns}/{volume}: serviceaccount \"{volume}\" not found",
        true,
    ),
    s(
        "deployment-controller",
        Deployment,
        "ScalingReplicaSet",
        Normal,
        "Scaled up replica set {rs} to {count}",
        false,
    ),
    s(
        "deployment-controller",
        Deployment,
        "ScalingReplicaSet",
        Normal,
        "Scaled down replica set {rs} from {count} to {count2}",
        false,
    ),
    s(
        "horizontal-pod-autoscaler",
        HorizontalPodAutoscaler,
        "FailedGetResourceMetric",
        Warning,
        "failed to get cpu utilization: unable to get metrics for resource cpu: no metrics returned from resource metrics API",
        true,
    ),
    s(
        "horizontal-pod-autoscaler",
        HorizontalPodAutoscaler,
        "FailedComputeMetricsReplicas",
        Warning,
        "invalid metrics (1 invalid out of 1), first error is: failed to get cpu resource metric value: failed to get cpu utilization: unable to get metrics for resource cpu: no metrics returned from resource metrics API",
        true,
    ),
    s(
        "horizontal-pod-autoscaler",
        HorizontalPodAutoscaler,
        "SuccessfulRescale",
        Normal,
        "New size: {count}; reason: cpu resource utilization (percentage of request) above target",
        false,
    ),
    s(
        "job-controller",
        Job,
        "SuccessfulCreate",
        Normal,
        "Created pod: {pod}",
        false,
    ),
    s(
        "job-controller",
        Job,
        "Completed",
        Normal,
        "Job completed",
        false,
    ),
    s(
        "job-controller",
        Job,
        "BackoffLimitExceeded",
        Warning,
        "Job has reached the specified backoff limit",
        true,
    ),
    s(
        "job-controller",
        Job,
        "DeadlineExceeded",
        Warning,
        "Job was active longer than specified deadline",
        true,
    ),
    s(
        "cronjob-controller",
        CronJob,
        "SuccessfulCreate",
        Normal,
        "Created job {job}",
        false,
    ),
    s(
        "cronjob-controller",
        CronJob,
        "SawCompletedJob",
        Normal,
        "Saw completed job: {job}, status: Complete",
        false,
    ),
    s(
        "persistentvolume-controller",
        PersistentVolumeClaim,
        "ProvisioningFailed",
        Warning,
        "storageclass.storage.k8s.io \"{volume}\" not found",
        true,
    ),
    s(
        "persistentvolume-controller",
        PersistentVolumeClaim,
        "FailedBinding",
        Warning,
        "no persistent volumes available for this claim and no storage class is set",
        true,
    ),
    s(
        "persistentvolume-controller",
        PersistentVolumeClaim,
        "WaitForFirstConsumer",
        Normal,
        "waiting for first consumer to be created before binding",
        false,
    ),
    s(
        "persistentvolume-controller",
        PersistentVolumeClaim,
        "ExternalProvisioning",
        Normal,
        "Waiting for a volume to be created either by the external provisioner 'ebs.csi.aws.com' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.",
        false,
    ),
    s(
        "ebs.csi.aws.com_ebs-csi-controller",
        PersistentVolumeClaim,
        "ProvisioningSucceeded",
        Normal,
        "Successfully provisioned volume {pv}",
        false,
    ),
    s(
        "endpoint-controller",
        Endpoints,
        "FailedToUpdateEndpoint",
        Warning,
        "Failed to update endpoint {ns}/{workload}: Operation cannot be fulfilled on endpoints \"{workload}\": the object has been modified; please apply your changes to the latest version and try again",
        true,
    ),
    s(
        "attachdetach-controller",
        Pod,
        "FailedAttachVolume",
        Warning,
        "Multi-Attach error for volume \"{pv}\" Volume is already exclusively attached to one node and can't be attached to another",
        true,
    ),
    s(
        "attachdetach-controller",
        Pod,
        "SuccessfulAttachVolume",
        Normal,
        "AttachVolume.Attach succeeded for volume \"{pv}\"",
        false,
    ),
    // cluster-autoscaler
    s(
        CA,
        Pod,
        "TriggeredScaleUp",
        Normal,
        "pod triggered scale-up: [{{{pool} {count}->{count2} (max: {count3})}}]",
        false,
    ),
    s(
        CA,
        Pod,
        "NotTriggerScaleUp",
        Normal,
        "pod didn't trigger scale-up: {count} node(s) didn't match Pod's node affinity/selector, {count2} max node group size reached",
        true,
    ),
    s(
        CA,
        Pod,
        "NotTriggerScaleUp",
        Normal,
        "pod didn't trigger scale-up: max total nodes in cluster reached",
        true,
    ),
    s(
        CA,
        Pod,
        "ScaleDown",
        Normal,
        "deleting pod for node scale down",
        false,
    ),
    s(
        CA,
        Node,
        "ScaleDown",
        Normal,
        "marked the node as toBeDeleted/unschedulable",
        false,
    ),
    // ingress controllers
    s(NGINX, Ingress, "Sync", Normal, "Scheduled for sync", false),
    s(
        NGINX,
        Pod,
        "RELOAD",
        Normal,
        "NGINX reload triggered due to a change in configuration",
        false,
    ),
    s(
        NGINX,
        Pod,
        "RELOAD",
        Warning,
        "Error reloading NGINX: \n-------------------------------------------------------------------------------\nError: exit status 1\nnginx: [emerg] unknown directive \"more_set_headerss\" in /tmp/nginx/nginx-cfg{random}:{count}\nnginx: configuration file /tmp/nginx/nginx-cfg{random} test failed\n\n-------------------------------------------------------------------------------\n",
        true,
    ),
    s(
        NGINX,
        Ingress,
        "Rejected",
        Warning,
        "{ns}/{workload} was rejected: spec.rules[0].host: Invalid value: \"{workload}_{ns}.example.com\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        true,
    ),
    s(
        NGINX,
        Ingress,
        "AddedOrUpdated",
        Normal,
        "Configuration for {ns}/{workload} was added or updated",
        false,
    ),
];

/// A coarse component name for a reporter, to count the catalog by.
pub fn component(reporter: &str) -> &'static str {
    match reporter {
        KUBELET => "kubelet",
        SCHEDULER => "default-scheduler",
        NPD => "node-problem-detector",
        CA => "cluster-autoscaler",
        NGINX => "ingress-nginx",
        "ebs.csi.aws.com_ebs-csi-controller" => "csi external-provisioner",
        _ => "kube-controller-manager",
    }
}
