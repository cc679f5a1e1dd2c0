//! Every payload type of the contract.
//!
//! Rules that keep old consumers working: every field added after a schema's first version is optional
//! (`#[serde(default)]`), decoders ignore fields they don't know, and enums that may grow carry an
//! `Other` catch-all where a consumer must keep going on a value it hasn't seen.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::closed::closed_set;
use crate::envelope::Payload;

macro_rules! payload {
    ($ty:ty, $name:literal, $version:literal) => {
        impl Payload for $ty {
            const SCHEMA: &'static str = $name;
            const VERSION: u32 = $version;
        }
    };
}

// ---------------------------------------------------------------------------------------------------------
// Shared pieces

/// A reference to a Kubernetes object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct ObjectRef {
    /// `group/version` (`v1` for the core group). Empty when the source didn't say.
    #[serde(default)]
    pub api_version: String,
    /// Kind, e.g. `Deployment`.
    pub kind: String,
    /// Namespace; absent for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// UID, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// A Kubernetes owner reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OwnerRef {
    /// Owner's `group/version`.
    pub api_version: String,
    /// Owner's kind.
    pub kind: String,
    /// Owner's name.
    pub name: String,
    /// Owner's UID.
    pub uid: String,
    /// Whether the owner is the managing controller.
    #[serde(default)]
    pub controller: bool,
}

/// One status condition, as Kubernetes reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Condition {
    /// Condition type, e.g. `Ready`, `Available`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the condition last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<DateTime<Utc>>,
}

/// Replica counts of a workload (Deployment, ReplicaSet, StatefulSet, DaemonSet).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Replicas {
    /// Desired replicas (`spec.replicas`, or `desiredNumberScheduled` for a DaemonSet).
    pub desired: i64,
    /// Replicas on the current template.
    pub updated: i64,
    /// Ready replicas.
    pub ready: i64,
    /// Available replicas.
    pub available: i64,
    /// The generation the controller has acted on (`status.observedGeneration`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A normalised status snapshot: what a fleet operator compares across clusters, the same shape for every
/// kind and every Kubernetes version.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StatusSnapshot {
    /// Phase, for kinds that have one (Pod, Namespace, PersistentVolumeClaim, …) or a derived one
    /// (`CrashLoopBackOff`, `ContainerCreating` for pods waiting on those reasons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Whether the object is ready/healthy by its kind's rule, when that is defined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Replica counts, for workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<Replicas>,
    /// Status conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Kind-specific facts worth comparing (e.g. `restarts`, `node`, `loadBalancerIP`), as strings.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub detail: BTreeMap<String, String>,
}

/// Severity shared by events, findings, incidents and alerts.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// For the record.
    #[default]
    Info,
    /// Someone should look soon.
    Warning,
    /// Someone should look now.
    Critical,
}

// ---------------------------------------------------------------------------------------------------------
// Resources

/// The current state of one Kubernetes object, normalised across Kubernetes versions.
///
/// Subject `fleet.state.<cluster>.<kind>.<namespace>.<name>` on a last-value stream: the stream itself is the
/// fleet inventory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ResourceState {
    /// The `group/version` the agent read the object with (the best version this cluster serves).
    pub api_version: String,
    /// Kind, e.g. `CronJob`.
    pub kind: String,
    /// Namespace; absent for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// `metadata.resourceVersion` the state was read at.
    pub resource_version: String,
    /// `metadata.generation`, where the kind has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Stable hash of the canonicalised spec (keys sorted; server-managed fields excluded).
    pub spec_hash: String,
    /// Stable hash of labels and annotations (the last-applied annotation excluded).
    pub metadata_hash: String,
    /// The canonicalised spec the hash was computed from (what a field-level diff compares). Never present
    /// for Secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<serde_json::Value>,
    /// Normalised status snapshot.
    #[serde(default)]
    pub status: StatusSnapshot,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations (the last-applied annotation excluded).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Owner references.
    #[serde(default)]
    pub owner_refs: Vec<OwnerRef>,
    /// Finalizers.
    #[serde(default)]
    pub finalizers: Vec<String>,
    /// Set while the object is being deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<DateTime<Utc>>,
    /// `metadata.creationTimestamp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<DateTime<Utc>>,
    /// Who owns which fields (`metadata.managedFields`, as server-side apply records it): what tells a
    /// field someone edited from one a controller (an HPA) took over. Never present for Secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub field_managers: Vec<FieldManager>,
}
payload!(ResourceState, "ResourceState", 1);

/// One entry of an object's `metadata.managedFields`: a manager and the fields it owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FieldManager {
    /// The field manager, e.g. `multipilot`, `kubectl-edit`, `kube-controller-manager`.
    pub manager: String,
    /// `Apply` (server-side apply) or `Update` (any other write).
    pub operation: String,
    /// The subresource written through (`scale`, `status`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subresource: Option<String>,
    /// The owned fields (leaves of `fieldsV1`), written as a field-level diff names them:
    /// `.spec.replicas`, `.spec.template.spec.containers[web].image`, `.metadata.labels.app`. A list item
    /// keyed by something other than `name` is written with its key, `.spec.ports[port=80,protocol=TCP]`.
    #[serde(default)]
    pub fields: Vec<String>,
}

/// An object was deleted. Published on the object's own state subject, so the last-value stream keeps the
/// tombstone rather than a stale state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ResourceDeleted {
    /// `group/version`.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Namespace; absent for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// UID of the deleted object.
    pub uid: String,
    /// Last resourceVersion seen.
    #[serde(default)]
    pub resource_version: String,
    /// Spec hash of the last state seen.
    #[serde(default)]
    pub last_spec_hash: String,
}
payload!(ResourceDeleted, "ResourceDeleted", 1);

/// Namespace and name of an object present after a (re)list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ObjectKey {
    /// Namespace; absent for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

/// Sent after each complete (re)list of a kind: consumers drop the objects of that kind that are not in
/// `present` (they vanished while nobody was watching). Large lists are split into `parts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ResyncMarker {
    /// The `group/version` the kind was listed with.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Increases with every relist of this kind by this agent.
    pub epoch: u64,
    /// How many objects the list held.
    pub object_count: u64,
    /// The objects present (this part of them).
    #[serde(default)]
    pub present: Vec<ObjectKey>,
    /// This part's index, from 0.
    #[serde(default)]
    pub part: u32,
    /// How many parts the marker was split into (at least 1).
    #[serde(default = "one")]
    pub parts: u32,
}
payload!(ResyncMarker, "ResyncMarker", 1);

fn one() -> u32 {
    1
}

// ---------------------------------------------------------------------------------------------------------
// Events

/// A Kubernetes event, normalised from `core/v1` Event and `events.k8s.io/v1` Event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KubeEvent {
    /// A stable id for this occurrence (event uid + count/series or last time): the same occurrence read
    /// twice has the same id.
    pub occurrence_id: String,
    /// Event object UID.
    pub uid: String,
    /// The object the event is about.
    pub involved: ObjectRef,
    /// Short machine-readable reason, e.g. `BackOff`.
    pub reason: String,
    /// Human-readable message.
    #[serde(default)]
    pub message: String,
    /// `Normal` or `Warning` (other values are kept as they came).
    pub event_type: String,
    /// Severity derived from the type (`Warning` → warning, else info).
    #[serde(default)]
    pub severity: Severity,
    /// Occurrences so far (`count`, or `series.count`; 1 for a single event).
    #[serde(default = "one_u64")]
    pub count: u64,
    /// First occurrence, where the source says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_time: Option<DateTime<Utc>>,
    /// Latest occurrence: `series.lastObservedTime`, `eventTime` or `lastTimestamp`.
    pub last_time: DateTime<Utc>,
    /// Reporting controller or component.
    #[serde(default)]
    pub reporter: String,
    /// `events.k8s.io/v1` action, where given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Which API the event was read from: `v1` or `events.k8s.io/v1`.
    pub source_api: String,
}
payload!(KubeEvent, "KubeEvent", 1);

fn one_u64() -> u64 {
    1
}

// ---------------------------------------------------------------------------------------------------------
// Health

/// Outcome of one probe round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProbeStatus {
    /// Working as expected.
    Healthy,
    /// Working, but something is off (slow, partly available, close to a limit).
    Degraded,
    /// Not working.
    Unhealthy,
    /// The probe could not tell (e.g. the API server did not answer).
    #[default]
    Unknown,
}

/// One thing a probe found (a node not ready, a Service with externalIPs, an object stuck terminating).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Finding {
    /// How bad it is.
    pub severity: Severity,
    /// The object concerned, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<ObjectRef>,
    /// What is wrong, for a person.
    pub message: String,
}

/// The result of one probe round: apiserver, etcd, scheduler, controller-manager, nodes, cni, coredns,
/// gpu-device-plugin, certificates, finalizers, external-ips, deprecated-apis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProbeResult {
    /// Probe name (a subject token), e.g. `apiserver`.
    pub probe: String,
    /// Outcome.
    pub status: ProbeStatus,
    /// How long the probe took, in milliseconds.
    pub latency_ms: f64,
    /// One line for a person.
    #[serde(default)]
    pub detail: String,
    /// Probe round, increasing per probe.
    pub round: u64,
    /// Numbers the probe measured (e.g. `p95_ms`, `error_ratio`, `days_left`).
    #[serde(default)]
    pub observations: BTreeMap<String, f64>,
    /// What it found.
    #[serde(default)]
    pub findings: Vec<Finding>,
}
payload!(ProbeResult, "ProbeResult", 1);

/// The agent is alive; sent every few seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Heartbeat {
    /// Seconds between heartbeats (so a consumer knows when one is missed).
    pub interval_s: u32,
    /// Agent version.
    pub agent_version: String,
    /// When the agent started.
    pub started_at: DateTime<Utc>,
    /// Messages waiting in the agent's outbox.
    #[serde(default)]
    pub outbox_depth: u64,
    /// Metric batches dropped by the outbox's disk budget since start.
    #[serde(default)]
    pub dropped_metric_batches: u64,
    /// Whether the agent could reach the cluster's API server at its last attempt.
    #[serde(default = "yes")]
    pub apiserver_reachable: bool,
    /// Messages replaced in the outbox by a newer one with the same key (a newer state of the same object,
    /// a newer heartbeat) before they were sent, since the outbox was created. With
    /// `dropped_metric_batches`, this accounts for every `seq` up to this heartbeat's that never arrives.
    #[serde(default)]
    pub superseded: u64,
    /// Messages JetStream answered as duplicates of one it already stored (same `Nats-Msg-Id`, re-sent
    /// after a crash): their `seq` never appears either.
    #[serde(default)]
    pub duplicates: u64,
}
payload!(Heartbeat, "Heartbeat", 1);

fn yes() -> bool {
    true
}

// ---------------------------------------------------------------------------------------------------------
// Facts

/// Kubernetes version as `/version` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KubeVersion {
    /// Major, e.g. `1`.
    pub major: u32,
    /// Minor, e.g. `31`.
    pub minor: u32,
    /// `gitVersion`, e.g. `v1.31.4`.
    pub git_version: String,
    /// `platform`, e.g. `linux/amd64`.
    #[serde(default)]
    pub platform: String,
}

/// An installed component (CNI, CoreDNS, ingress controller, GPU device plugin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Component {
    /// Component name, e.g. `calico`, `coredns`, `ingress-nginx`, `nvidia-device-plugin`.
    pub name: String,
    /// Version, from the image tag or a version label.
    pub version: String,
    /// Ready / desired instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
}

/// Node counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NodeCounts {
    /// All nodes.
    pub total: u32,
    /// Nodes whose Ready condition is True.
    pub ready: u32,
    /// Control-plane nodes.
    #[serde(default)]
    pub control_plane: u32,
}

/// GPUs of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GpuNode {
    /// Node name.
    pub node: String,
    /// GPU model (from the `nvidia.com/gpu.product` label).
    pub model: String,
    /// Driver version (from the node's driver label).
    #[serde(default)]
    pub driver_version: String,
    /// `nvidia.com/gpu` capacity.
    pub capacity: u32,
    /// `nvidia.com/gpu` allocatable.
    pub allocatable: u32,
    /// GPUs requested by pods scheduled on the node.
    pub allocated: u32,
}

/// What some of a cluster's nodes run (`status.nodeInfo`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct NodeSoftware {
    /// `osImage`, e.g. `Ubuntu 22.04.4 LTS`.
    pub os_image: String,
    /// `kernelVersion`, e.g. `5.15.0-1057-aws`.
    pub kernel_version: String,
    /// `containerRuntimeVersion`, e.g. `containerd://1.7.13`.
    pub container_runtime: String,
    /// How many nodes run it.
    pub nodes: u32,
}

/// What a cluster is: the registry entry the console, the release planner and the baseline use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClusterFacts {
    /// Kubernetes version.
    pub version: KubeVersion,
    /// Every served `group/version`, sorted.
    pub api_versions: Vec<String>,
    /// For each kind the agent reads, the `group/version` it chose (the best one served).
    #[serde(default)]
    pub preferred_versions: BTreeMap<String, String>,
    /// Node counts.
    #[serde(default)]
    pub nodes: NodeCounts,
    /// CNI plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<Component>,
    /// CoreDNS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coredns: Option<Component>,
    /// Ingress controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_controller: Option<Component>,
    /// GPU device plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_device_plugin: Option<Component>,
    /// IngressClass names.
    #[serde(default)]
    pub ingress_classes: Vec<String>,
    /// StorageClass names.
    #[serde(default)]
    pub storage_classes: Vec<String>,
    /// The default StorageClass, if one is marked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_storage_class: Option<String>,
    /// When the API server's serving certificate expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apiserver_cert_expiry: Option<DateTime<Utc>>,
    /// GPU inventory per node.
    #[serde(default)]
    pub gpus: Vec<GpuNode>,
    /// The nodes' software (`status.nodeInfo`): one entry per distinct OS image, kernel and container
    /// runtime, with how many nodes run it; most nodes first. Absent from agents before it was added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_software: Vec<NodeSoftware>,
    /// Registry labels of the cluster (`env`, `region`, `owner`, `team`, …), from the agent's config.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Seconds between the agent's scrapes of the cluster's metrics (`scrape.interval_s`): what a query's
    /// range must span to hold two samples. Absent when the agent does not scrape, or predates the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_interval_s: Option<u32>,
}
payload!(ClusterFacts, "ClusterFacts", 1);

// ---------------------------------------------------------------------------------------------------------
// Metrics

/// Prometheus metric type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MetricType {
    /// Counter.
    Counter,
    /// Gauge.
    Gauge,
    /// Histogram (its `_bucket`, `_sum`, `_count` samples).
    Histogram,
    /// Summary (its quantile, `_sum`, `_count` samples).
    Summary,
    /// Untyped or unknown.
    #[default]
    Untyped,
}

/// Type and help of a metric family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MetricFamily {
    /// Family name.
    pub name: String,
    /// Type.
    #[serde(rename = "type")]
    pub type_: MetricType,
    /// HELP text.
    #[serde(default)]
    pub help: String,
}

/// One sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Sample {
    /// Series name.
    pub name: String,
    /// Labels, `cluster` included.
    pub labels: BTreeMap<String, String>,
    /// Value (may be NaN or ±Inf, as in the exposition format; the NaN with bits `0x7ff0000000000002` is
    /// Prometheus' staleness marker: the series is gone).
    pub value: f64,
    /// Milliseconds since the epoch, in the cluster's clock.
    pub timestamp_ms: i64,
}

impl Sample {
    /// A sample from borrowed labels (a label given twice keeps its last value).
    pub fn new(name: &str, labels: &[(&str, &str)], value: f64, timestamp_ms: i64) -> Sample {
        Sample {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
            timestamp_ms,
        }
    }
}

/// Samples of one scrape, with the scrape's own series (`up`, `scrape_duration_seconds`,
/// `scrape_samples_scraped`, `scrape_samples_post_metric_relabeling`, `scrape_series_added`) and
/// staleness markers for the series gone since the target's previous scrape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MetricBatch {
    /// The scrape target's job name, e.g. `kube-state-metrics`.
    pub job: String,
    /// The scraped endpoint.
    #[serde(default)]
    pub instance: String,
    /// Metric families seen in the scrape.
    #[serde(default)]
    pub families: Vec<MetricFamily>,
    /// The samples.
    pub samples: Vec<Sample>,
    /// Lines of the scrape that could not be parsed (skipped, counted).
    #[serde(default)]
    pub rejected_lines: u64,
}
payload!(MetricBatch, "MetricBatch", 1);

// ---------------------------------------------------------------------------------------------------------
// Incidents and notifications

/// Lifecycle of an incident.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum IncidentStatus {
    /// Needs attention.
    #[default]
    Open,
    /// Someone is on it.
    Acknowledged,
    /// Over.
    Resolved,
}

/// One piece of evidence attached to an incident, ranked by relevance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Evidence {
    /// 1 is the most relevant.
    pub rank: u32,
    /// What kind of evidence it is.
    pub kind: EvidenceKind,
    /// One line for a person.
    pub summary: String,
    /// When it happened, in the cluster's clock.
    pub cluster_time: DateTime<Utc>,
    /// The object concerned, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<ObjectRef>,
    /// Why it was chosen: how it bears on the finding (e.g. "the object the finding names changed").
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
}

/// What kind of evidence an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum EvidenceKind {
    /// An object's spec changed.
    Change,
    /// A release applied something.
    Release,
    /// A probe's observations moved.
    Trend,
    /// A (deduplicated) Kubernetes event.
    Event,
    /// A probe's finding.
    Probe,
    /// A cluster fact.
    Fact,
    /// A kind this consumer does not know yet.
    #[serde(other)]
    Other,
}

impl EvidenceKind {
    /// The name on the wire (`change`, `trend`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            EvidenceKind::Change => "change",
            EvidenceKind::Release => "release",
            EvidenceKind::Trend => "trend",
            EvidenceKind::Event => "event",
            EvidenceKind::Probe => "probe",
            EvidenceKind::Fact => "fact",
            EvidenceKind::Other => "other",
        }
    }
}

impl std::fmt::Display for EvidenceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A correlated incident: what a person must look at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Incident {
    /// Stable id (the same condition on the same cluster keeps its id while open).
    pub id: String,
    /// Cluster.
    pub cluster: String,
    /// Incident kind, e.g. `apiserver-overload`, `cluster-unreachable`, `cert-expiring`.
    pub kind: String,
    /// Severity.
    pub severity: Severity,
    /// Status.
    pub status: IncidentStatus,
    /// One line a person can act on.
    pub summary: String,
    /// When it opened (cluster_time of the first triggering observation).
    pub opened_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<DateTime<Utc>>,
    /// When the triggering message was stored by JetStream (for delivery lag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingest_time: Option<DateTime<Utc>>,
    /// Top evidence, most relevant first.
    #[serde(default)]
    pub evidence: Vec<Evidence>,
    /// Labels for routing (cluster labels such as env/region/team, plus kind and severity).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Increases with every change of this incident.
    #[serde(default)]
    pub revision: u64,
    /// Who acknowledged it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged_by: Option<String>,
    /// What the cluster takes down, from its last known state: on incidents that make a whole cluster
    /// unusable (`cluster-unreachable`, `apiserver-down`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blast_radius: Option<BlastRadius>,
    /// The event digests (`EventDigest.id`, on this cluster) this incident accounts for, when a component
    /// fails (its rule's `explains_warnings`): warnings on the objects its probe's findings name and their
    /// pods, and on objects named like its probe in their namespaces (a DNS failure's `Unhealthy` on
    /// `kube-system/coredns-*`), gathered while it is open, at most 32. The alert router mutes their
    /// alerts while this incident's fires, and an event fleet incident whose members it accounts for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explains: Vec<String>,
}
payload!(Incident, "Incident", 1);

/// What a cluster runs and what of it runs nowhere else, from its last known state: what its loss takes
/// down. On `cluster-unreachable` and `apiserver-down` incidents, and answered on
/// `fleet.query.blast-radius` before anything breaks; on a fleet incident of such kinds, what its clusters
/// take down together (workloads and Services counted once by kind, namespace and name, GPUs summed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BlastRadius {
    /// The cluster (on a fleet incident: the clusters lost together, comma-separated).
    pub cluster: String,
    /// When the state it is judged on was last heard from the cluster (its last heartbeat; of several
    /// clusters, the oldest of theirs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of: Option<DateTime<Utc>>,
    /// Namespaces with workloads (system namespaces, `kube-*`, left out).
    pub namespaces: Vec<String>,
    /// Workloads (Deployments, StatefulSets, DaemonSets, CronJobs) outside system namespaces.
    pub workloads: u32,
    /// Of those, how many also run on another cluster (same kind, namespace and name) that is up: one with
    /// an open `cluster-unreachable` or `apiserver-down` incident runs nothing for another.
    pub elsewhere: u32,
    /// The workloads that run on no other cluster that is up (`Deployment shop/checkout`), at most 50.
    pub only_here: Vec<String>,
    /// How many run on no other cluster that is up.
    pub only_here_total: u32,
    /// Services outside system namespaces.
    pub services: u32,
    /// Services exposed on external IPs (`ns/name`).
    #[serde(default)]
    pub exposed: Vec<String>,
    /// GPUs the cluster holds.
    pub gpus: u32,
    /// Of those, allocated to pods.
    pub gpus_allocated: u32,
    /// One line for a person.
    pub summary: String,
}

/// One failure across clusters: the cluster incidents of one kind that opened within the correlator's fleet
/// window (two or more clusters), linked as members, with what the failing clusters share that the healthy
/// ones don't and the changes that reached them. Announced once (the alert router notifies this instead of
/// each member); members join and leave; it resolves when its last member resolves. Subject
/// `fleet.fleet-incident.<kind>`; keep the latest `revision` per `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FleetIncident {
    /// Stable id (kind + when it opened).
    pub id: String,
    /// The members' incident kind, e.g. `dns-failure`; `event` for one event problem on several clusters
    /// (its members are event digests, its labels say which problem: `alertname` = the reason,
    /// `object_kind`, `namespace`, `object` = the masked name, `problem` = its cluster-free id).
    pub kind: String,
    /// The highest severity of its open members.
    pub severity: Severity,
    /// Open while any member is open; resolved when the last one resolved or left.
    pub status: IncidentStatus,
    /// One line a person can act on: how many clusters of the fleet (while it lasts, which of them are
    /// back), what they share, the first suspect.
    pub summary: String,
    /// When it opened (hub time: when the second member was seen).
    pub opened_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<DateTime<Utc>>,
    /// Clusters the correlator knew when this revision was judged (failing and healthy).
    pub fleet_size: u32,
    /// The cluster incidents it links, in the order they joined.
    pub members: Vec<FleetMember>,
    /// Attributes ranked by how well they separate the failing clusters from the healthy ones.
    #[serde(default)]
    pub shared: Vec<SharedAttribute>,
    /// Changes seen on the failing clusters shortly before they failed, suspects first; a change seen as
    /// often on healthy clusters is listed as such (`verdict: common`), not as a suspect.
    #[serde(default)]
    pub suspects: Vec<Suspect>,
    /// Labels for routing: `kind`, `severity`, `scope: fleet`, and the label values all members share.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// What the failing clusters take down together, from their last known state: on fleet incidents of
    /// kinds that make a whole cluster unusable (the rules' `inhibit.root_kinds`: `cluster-unreachable`,
    /// `apiserver-down`), over the members still open — each workload and Service once, what runs on none
    /// of the clusters still up, their GPUs summed (`cluster`: the failing clusters' names,
    /// comma-separated). Judged again when another cluster goes down or comes back; kept as last judged
    /// once every member is back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blast_radius: Option<BlastRadius>,
    /// Increases with every change.
    pub revision: u64,
}
payload!(FleetIncident, "FleetIncident", 1);

impl FleetIncident {
    /// The members' clusters, each once, in the order they joined: a cluster may have two members (an
    /// event problem's digests of two of its objects, or a member that left and came back as another).
    pub fn clusters(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for m in &self.members {
            if !out.contains(&m.cluster.as_str()) {
                out.push(&m.cluster);
            }
        }
        out
    }

    /// An event problem's open members (digests) are each accounted for by an open cluster incident of
    /// their cluster (`Incident.explains`: the coredns pods failing readiness where DNS fails): those
    /// incidents, each once, in the members' order. Empty when one is not (a problem of its own there),
    /// or for another kind. The alert router mutes such a fleet alert in favour of theirs.
    pub fn accounted_for<'a>(&self, incidents: &'a [Incident]) -> Vec<&'a Incident> {
        let mut out: Vec<&Incident> = Vec::new();
        if self.kind != "event" {
            return out;
        }
        let open = self
            .members
            .iter()
            .filter(|m| m.left_at.is_none() && m.status != IncidentStatus::Resolved);
        for m in open {
            let by = incidents.iter().find(|i| {
                i.status != IncidentStatus::Resolved
                    && i.cluster == m.cluster
                    && i.explains.contains(&m.incident_id)
            });
            match by {
                Some(i) if out.iter().any(|o| o.id == i.id) => {}
                Some(i) => out.push(i),
                None => return Vec::new(),
            }
        }
        out
    }
}

/// One setting of one component that differs among the clusters of one group (env), from the correlator's
/// fleet-consistency report (`fleet.query.consistency`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SettingDivergence {
    /// The object: `ConfigMap ingress-nginx/ingress-nginx-controller`.
    pub object: String,
    /// The setting: a ConfigMap key (`proxy-read-timeout`), a key inside a YAML value
    /// (`config.conf.mode`), or a spec path.
    pub setting: String,
    /// The clusters compared: `env=prod`.
    pub group: String,
    /// Each value and the clusters that have it, the most common first (`(unset)`: the key is missing).
    pub values: Vec<SettingValue>,
    /// The clusters off the value a strict majority holds (empty when there is no majority).
    pub odd_ones_out: Vec<String>,
    /// One line for a person.
    pub summary: String,
}

/// A value a setting has, and where.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SettingValue {
    /// The value.
    pub value: String,
    /// The clusters that have it.
    pub clusters: Vec<String>,
}

/// A cluster incident linked into a [`FleetIncident`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FleetMember {
    /// Its cluster.
    pub cluster: String,
    /// The cluster incident's id (for `kind: event`, the `EventDigest` id).
    pub incident_id: String,
    /// Its severity.
    pub severity: Severity,
    /// Its status (`resolved` once it resolved or left).
    pub status: IncidentStatus,
    /// Its summary.
    pub summary: String,
    /// When the cluster incident opened (its cluster's clock).
    pub opened_at: DateTime<Utc>,
    /// When it joined (hub time).
    pub joined_at: DateTime<Utc>,
    /// When it resolved or left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_at: Option<DateTime<Utc>>,
    /// Why it left without resolving (its cluster went silent, was removed), if so.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub left_because: String,
}

/// An attribute value and how many failing and healthy clusters have it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SharedAttribute {
    /// What: `kubernetes-version`, `cni`, `ingress-controller`, `coredns`, `gpu-device-plugin`, `gpu-driver`,
    /// `node-os`, `kernel`, `container-runtime`, `label:<key>`; what was rolled out there: `release:<name>`
    /// and `policy:<name>` (value `revision N`), `gitops:<repo>` (value `commit <sha>`, the newest applied);
    /// for an event problem of one workload's pods, how its copies run: `workload:<kind> <ns>/<name>` (value
    /// `image:<container>=<image>`, `<container>.env.<VAR>=<value>`, `<container>.resources.<path>=<value>`,
    /// `annotations.<key>=<value>`, or `<setting> unset`), counted over the clusters that run it.
    pub attribute: String,
    /// The value, e.g. `calico v3.27.3`.
    pub value: String,
    /// Failing clusters that have it.
    pub failing: u32,
    /// Failing clusters whose facts are known.
    pub failing_total: u32,
    /// Healthy clusters that have it.
    pub healthy: u32,
    /// Healthy clusters whose facts are known.
    pub healthy_total: u32,
    /// e.g. "3 of 3 failing run calico v3.27.3; 1 of 3 healthy do".
    pub support: String,
}

/// A change on the failing clusters shortly before they failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Suspect {
    /// `suspect`: reached more of the failing clusters than of the healthy ones; `common`: ordinary churn,
    /// not a cause (seen as often on healthy clusters, or an object the failing clusters change that often
    /// anyway).
    pub verdict: SuspectVerdict,
    /// The object changed (`kind`, `namespace`, `name`).
    pub object: ObjectRef,
    /// Failing clusters where it changed in the lookback before their incident.
    pub failing: u32,
    /// Failing clusters.
    pub failing_total: u32,
    /// Healthy clusters where it changed in the same span.
    pub healthy: u32,
    /// Healthy clusters.
    pub healthy_total: u32,
    /// The latest such change on a failing cluster (its clock; the hub's for a release).
    pub last_changed: DateTime<Utc>,
    /// One line for a person.
    pub summary: String,
    /// When the change is a release batch (`object.kind` `Release`): which release, revision, batch and
    /// Git commit. A release that reached the failing clusters and few healthy ones is the first suspect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<ReleaseRef>,
}

/// A release's revision as it reached some clusters (a batch of `fleet.release.<release>.batch`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct ReleaseRef {
    /// The release.
    pub name: String,
    /// Its revision.
    pub revision: u64,
    /// The batch that applied it on the failing clusters (the first one, when several did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    /// The Git commit it came from (GitOps or a plan made from a checkout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// How a change bears on a fleet incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SuspectVerdict {
    /// Reached the failing clusters more than the healthy ones.
    Suspect,
    /// As common on healthy clusters, or as often changed on the failing ones anyway: not a cause.
    Common,
    /// A verdict this consumer does not know yet.
    #[serde(other)]
    Other,
}

/// A deduplicated Kubernetes event problem: announced by the correlator once when it is new, again when its
/// severity changes, and otherwise updated in place (same `id`, `pass: update`, at most once per refresh
/// interval) while it keeps occurring: the digest of a stream of repeats. Keep the latest per `id`.
/// Subject `fleet.digest.<cluster>.<involved kind>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EventDigest {
    /// Stable id of the problem (cluster + masked object + reason + masked message).
    pub id: String,
    /// Cluster.
    pub cluster: String,
    /// The object (its name masked to the workload, e.g. `checkout-*` for its pods).
    pub object: ObjectRef,
    /// Event reason, e.g. `BackOff`.
    pub reason: String,
    /// Severity of the latest occurrence.
    pub severity: Severity,
    /// The latest message, as it came.
    pub message: String,
    /// First occurrence (cluster clock).
    pub first_seen: DateTime<Utc>,
    /// Latest occurrence (cluster clock).
    pub last_seen: DateTime<Utc>,
    /// Occurrences so far.
    pub count: u64,
    /// Why it was passed on.
    pub pass: DigestPass,
}
payload!(EventDigest, "EventDigest", 1);

/// Why an event digest was passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DigestPass {
    /// The problem was seen for the first time.
    New,
    /// Its severity changed.
    Severity,
    /// Its count crossed a milestone (10, 100, 1000, …). No longer sent (see `update`); kept so
    /// that older digests in a stream still decode.
    Milestone,
    /// It keeps occurring: the same id with the count and last-seen so far, at most once per refresh
    /// interval (5 min by default). Update the record in place; nobody needs telling again.
    Update,
    /// A reason this consumer does not know yet.
    #[serde(other)]
    Other,
}

impl DigestPass {
    /// The name on the wire (`new`, `severity`, `update`; `milestone` from older correlators).
    pub fn as_str(self) -> &'static str {
        match self {
            DigestPass::New => "new",
            DigestPass::Severity => "severity",
            DigestPass::Milestone => "milestone",
            DigestPass::Update => "update",
            DigestPass::Other => "other",
        }
    }
}

impl std::fmt::Display for DigestPass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Outcome of one baseline check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    /// The cluster meets the rule.
    #[default]
    Pass,
    /// It doesn't.
    Fail,
    /// It can't be told yet (no facts).
    Unknown,
}

/// One baseline rule judged on one cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ComplianceCheck {
    /// Rule id, e.g. `kubernetes-version`, `component:coredns`, `pss-labels`, `external-ips`, `cert-validity`.
    pub rule: String,
    /// Outcome.
    pub status: CheckStatus,
    /// What was found, for a person.
    pub message: String,
    /// Objects violating the rule (at most a few dozen).
    #[serde(default)]
    pub objects: Vec<ObjectRef>,
}

/// A cluster judged against the fleet baseline; republished whenever the verdict changes.
///
/// Subject `fleet.compliance.<cluster>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ComplianceReport {
    /// Cluster.
    pub cluster: String,
    /// Name of the baseline the cluster was judged against.
    pub baseline: String,
    /// Whether every check passed.
    pub compliant: bool,
    /// The checks.
    pub checks: Vec<ComplianceCheck>,
    /// When it was evaluated (the hub's clock).
    pub evaluated_at: DateTime<Utc>,
}
payload!(ComplianceReport, "ComplianceReport", 1);

/// Firing or resolved, as Alertmanager says it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AlertState {
    /// Active.
    #[default]
    Firing,
    /// Over.
    Resolved,
}

/// One alert inside a notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NotifiedAlert {
    /// The incident (or deduplicated event) it came from.
    pub incident_id: String,
    /// Firing or resolved.
    pub state: AlertState,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations (`summary`, …).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Start.
    pub starts_at: DateTime<Utc>,
    /// End, when resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<DateTime<Utc>>,
}

/// A grouped notification sent to a receiver (also published on `fleet.alert.<receiver>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Notification {
    /// Stable id: the same notification re-sent after a restart has the same id.
    pub id: String,
    /// Receiver name.
    pub receiver: String,
    /// Alertmanager's `groupKey`: the route's matchers from the root down, then the group's labels, e.g.
    /// `{}/{team="db"}:{alertname="DiskPressure", cluster="dev-1"}` (what receivers deduplicate by).
    pub group_key: String,
    /// Firing if any alert in the group fires.
    pub state: AlertState,
    /// Rendered title.
    pub title: String,
    /// Rendered text.
    #[serde(default)]
    pub text: String,
    /// The alerts in the group.
    pub alerts: Vec<NotifiedAlert>,
}
payload!(Notification, "Notification", 1);

// ---------------------------------------------------------------------------------------------------------
// Releases and audit

/// What a release command asks the agent to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ReleaseAction {
    /// Server-side apply with `dryRun=All`; nothing persists.
    DryRun,
    /// Read the live objects (for the plan's diff and the snapshot).
    Snapshot,
    /// Server-side apply.
    Apply,
    /// Delete the named objects.
    Delete,
}

/// A command from the release role to one cluster's agent (request/reply on `fleet.cmd.<cluster>.release`).
/// Signed with ed25519 over [`ReleaseCommand::signing_bytes`]; the agent rejects unsigned, expired, replayed
/// or other-cluster commands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReleaseCommand {
    /// Unique id; a retried step reuses it, and the agent applies it once.
    pub command_id: String,
    /// Release name.
    pub release: String,
    /// Target cluster.
    pub cluster: String,
    /// Action.
    pub action: ReleaseAction,
    /// Field manager for server-side apply.
    pub field_manager: String,
    /// Force conflicts (only when the release spec says so).
    #[serde(default)]
    pub force: bool,
    /// The rendered objects (JSON objects).
    pub objects: Vec<serde_json::Value>,
    /// Issued at (hub clock).
    pub issued_at: DateTime<Utc>,
    /// Not valid after.
    pub expires_at: DateTime<Utc>,
    /// Random nonce; never accepted twice.
    pub nonce: String,
    /// Which key signed it.
    pub key_id: String,
    /// Hex ed25519 signature.
    pub signature: String,
}
payload!(ReleaseCommand, "ReleaseCommand", 1);

impl ReleaseCommand {
    /// The bytes the signature covers: every field but the signature, as named MessagePack.
    pub fn signing_bytes(&self) -> Result<Vec<u8>, crate::codec::EncodeError> {
        let mut unsigned = self.clone();
        unsigned.signature.clear();
        rmp_serde::to_vec_named(&unsigned).map_err(crate::codec::EncodeError::from)
    }
}

/// What a release command did to one object (the server-side apply, delete or snapshot's answer).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyOutcome {
    /// Applied: the object did not exist.
    Created,
    /// Applied: the object changed.
    Configured,
    /// Applied (or dry-run): nothing changed.
    Unchanged,
    /// Deleted.
    Deleted,
    /// Dry-run: would be created.
    WouldCreate,
    /// Dry-run: would change.
    WouldConfigure,
    /// Snapshot: the object exists (its state is in `live`).
    Present,
    /// Snapshot or delete: the object does not exist.
    Absent,
    /// Failed (see `error`).
    Error,
    /// An outcome this consumer does not know yet.
    #[serde(other)]
    Other,
}

impl ApplyOutcome {
    /// The name on the wire (`created`, `would-configure`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyOutcome::Created => "created",
            ApplyOutcome::Configured => "configured",
            ApplyOutcome::Unchanged => "unchanged",
            ApplyOutcome::Deleted => "deleted",
            ApplyOutcome::WouldCreate => "would-create",
            ApplyOutcome::WouldConfigure => "would-configure",
            ApplyOutcome::Present => "present",
            ApplyOutcome::Absent => "absent",
            ApplyOutcome::Error => "error",
            ApplyOutcome::Other => "other",
        }
    }
}

impl std::fmt::Display for ApplyOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome for one object of a release command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ObjectOutcome {
    /// The object.
    pub object: ObjectRef,
    /// What happened to it.
    pub outcome: ApplyOutcome,
    /// The error, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The live object before the command (for snapshots and diffs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<serde_json::Value>,
    /// The object as the API server returned it after the command (the dry-run's would-be object, or the
    /// applied one), `managedFields` removed: with `live`, what a field-level diff compares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

/// The agent's reply to a release command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReleaseResult {
    /// The command answered.
    pub command_id: String,
    /// Release name.
    pub release: String,
    /// Cluster.
    pub cluster: String,
    /// Whether every object succeeded.
    pub ok: bool,
    /// Why the command was refused or failed as a whole (bad signature, expired, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Per-object outcomes.
    #[serde(default)]
    pub objects: Vec<ObjectOutcome>,
    /// Whether this reply repeats an earlier execution of the same command (idempotent retry).
    #[serde(default)]
    pub replayed: bool,
}
payload!(ReleaseResult, "ReleaseResult", 1);

closed_set! {
    /// What a release history entry records (the last token of its subject).
    pub enum ReleaseEntry {
        /// A plan (a new revision, or a re-plan of one not applied).
        Plan = "plan",
        /// An approval given.
        Approve = "approve",
        /// Applying started (or was refused).
        Apply = "apply",
        /// A batch started, or finished (`ok`).
        Batch = "batch",
        /// One cluster's apply step.
        Step = "step",
        /// A batch's health gate.
        Health = "health",
        /// A batch's metric analysis (queries against the fleet TSDB).
        Analysis = "analysis",
        /// Every batch applied, healthy and soaked.
        Done = "done",
        /// The release failed.
        Failed = "failed",
        /// A rollback started.
        Rollback = "rollback",
        /// One cluster restored to its snapshot.
        RollbackStep = "rollback-step",
        /// Every changed cluster restored.
        RolledBack = "rolled-back",
        /// The role restarted while applying or rolling back.
        Interrupted = "interrupted",
        /// A batch holds: for the `gate` approval, a dependency, or a sync window.
        Waiting = "waiting",
        /// Self-heal re-applied drifted objects, or gave up.
        Heal = "heal",
        /// A fleet incident named this revision its first suspect.
        Incident = "incident",
        /// A fleet repository's commit was refused (on `gitops-<repo>`).
        Sync = "sync",
        /// An operator's apply passed a closed sync window that allows manual syncs.
        Override = "override",
    }
}

closed_set! {
    /// Where a release stands.
    pub enum ReleaseState {
        /// Planned; nothing applied.
        Planned = "planned",
        /// Planned, but blocked objects or errors keep it from being applied.
        Blocked = "blocked",
        /// Batches are being applied.
        Applying = "applying",
        /// Every batch applied, healthy and soaked.
        Succeeded = "succeeded",
        /// A batch failed; the changed clusters are being (or were not yet) rolled back.
        Failed = "failed",
        /// Rolling back.
        RollingBack = "rolling-back",
        /// Every changed cluster is back at its snapshot.
        RolledBack = "rolled-back",
        /// A rollback step failed: look at the history.
        RollbackFailed = "rollback-failed",
        /// The role restarted while applying or rolling back: the clusters listed as changed may be half-way.
        Interrupted = "interrupted",
        /// The next batch holds a cluster of `sync.approval_selector`: it starts once the `gate` approval is
        /// given; the batches before it are applied.
        WaitingApproval = "waiting-approval",
        /// A fleet repository's commit was refused: nothing of it applied (only on `gitops-<repo>` entries).
        Refused = "refused",
        /// The next batch holds: a sync window is closed on its clusters, or a release it depends on is not
        /// healthy there yet; the role tries again by itself (the batches before it are applied).
        Held = "held",
    }
}

impl ReleaseState {
    /// Whether work is going on.
    pub fn busy(self) -> bool {
        matches!(self, ReleaseState::Applying | ReleaseState::RollingBack)
    }
}

closed_set! {
    /// How an audited action went.
    pub enum AuditOutcome {
        /// Done.
        Ok = "ok",
        /// Tried, and failed.
        Failed = "failed",
        /// Refused before anything was done (not allowed, bad input).
        Rejected = "rejected",
    }
}

/// One entry of a release's history, published by the release role on `fleet.release.<release>.<what>`
/// (FLEET_RELEASE): a plan, an approval, a batch starting, a step on one cluster, a health gate, the end of
/// the release, a rollback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReleaseEvent {
    /// Release name.
    pub release: String,
    /// Which run of the release (each new plan of the same name is a new revision), from 1.
    pub revision: u64,
    /// What happened (the subject's last token).
    pub what: ReleaseEntry,
    /// The release's state after it.
    pub state: ReleaseState,
    /// Who caused it (the operator, or `system`).
    pub actor: String,
    /// The batch concerned, from 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    /// The clusters concerned.
    #[serde(default)]
    pub clusters: Vec<String>,
    /// Whether it went well.
    pub ok: bool,
    /// One line for a person.
    pub summary: String,
    /// Details (structured: per-cluster outcomes, risks, blocked objects, diffs in counts).
    #[serde(default)]
    pub detail: serde_json::Value,
    /// Git commit of the spec, with `-dirty` when the work tree had changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// When it happened (hub clock).
    pub at: DateTime<Utc>,
}
payload!(ReleaseEvent, "ReleaseEvent", 1);

/// A record of something that changed the fleet or its handling: plans, approvals, steps, rollbacks,
/// acknowledgements, silences.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AuditRecord {
    /// Unique id.
    pub id: String,
    /// Who did it (token subject or `system`).
    pub actor: String,
    /// Which role recorded it.
    pub role: String,
    /// What was done, e.g. `release.apply`, `incident.acknowledge`, `silence.add`.
    pub action: String,
    /// What it was done to.
    pub target: String,
    /// How it went.
    pub outcome: AuditOutcome,
    /// Details (structured).
    #[serde(default)]
    pub detail: serde_json::Value,
    /// Git commit the change came from, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}
payload!(AuditRecord, "AuditRecord", 1);

/// A message a consumer could not use, with the reason. Published on `fleet.dlq.<stream>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DeadLetter {
    /// Stream the message came from.
    pub stream: String,
    /// Consumer that gave up on it.
    pub consumer: String,
    /// Original subject.
    pub subject: String,
    /// Stream sequence of the original.
    pub stream_seq: u64,
    /// Deliveries so far.
    pub delivered: u64,
    /// Short reason class: `decode`, `schema`, `version`, `too-large`, `invalid`, `handler`.
    pub reason: String,
    /// The full error text.
    pub error: String,
    /// Original headers.
    #[serde(default)]
    pub headers: BTreeMap<String, Vec<String>>,
    /// Original payload, base64.
    pub payload_base64: String,
}
payload!(DeadLetter, "DeadLetter", 1);
