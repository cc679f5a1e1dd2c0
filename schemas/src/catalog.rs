//! The list of payload types, their JSON Schemas, and one sample message of each.
//!
//! The JSON Schemas under `schemas/json/` are generated from these types (`cargo run -p multipilot-schemas
//! --example gen-schemas`, or `UPDATE_SCHEMAS=1 cargo test -p multipilot-schemas`); a test fails when the
//! checked-in files differ from what the types generate.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;

use crate::envelope::{Envelope, Payload};
use crate::payload::*;
use crate::subject;

/// One payload type of the contract.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Schema name.
    pub name: &'static str,
    /// Major version.
    pub version: u32,
    /// The generated JSON Schema of the whole envelope with this payload.
    pub schema: serde_json::Value,
    /// A sample message (the envelope, encoded), for round-trip tests and consumers' examples.
    pub sample: Vec<u8>,
    /// A subject the sample would be published on.
    pub subject: String,
}

impl Entry {
    /// The file the schema is checked in as, e.g. `ResourceState.v1.schema.json`.
    pub fn file_name(&self) -> String {
        format!("{}.v{}.schema.json", self.name, self.version)
    }

    /// The `Multipilot-Schema` header value.
    pub fn header(&self) -> String {
        format!("{}/{}", self.name, self.version)
    }
}

/// The JSON Schema of an envelope carrying `T`.
pub fn json_schema<T: Payload>() -> serde_json::Value {
    let schema = schemars::schema_for!(Envelope<T>);
    let mut value = serde_json::to_value(schema).unwrap_or_default();
    if let Some(obj) = value.as_object_mut() {
        obj.insert(
            "$id".into(),
            format!(
                "https://multipilot.invalid/schemas/{}.v{}.schema.json",
                T::SCHEMA,
                T::VERSION
            )
            .into(),
        );
        obj.insert(
            "title".into(),
            format!("{} v{} envelope", T::SCHEMA, T::VERSION).into(),
        );
    }
    value
}

fn entry<T: Payload>(subject: String, payload: T) -> Entry {
    let env = Envelope {
        schema: T::SCHEMA.into(),
        version: T::VERSION,
        cluster: "prod-eu-1".into(),
        source: "agent-prod-eu-1".into(),
        cluster_time: t(0),
        agent_time: t(1),
        seq: 42,
        payload,
    };
    Entry {
        name: T::SCHEMA,
        version: T::VERSION,
        schema: json_schema::<T>(),
        sample: crate::codec::encode(&env).unwrap_or_default(),
        subject,
    }
}

fn t(offset_s: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 10, 2, 0)
        .single()
        .unwrap_or_default()
        + chrono::Duration::seconds(offset_s)
}

fn map<const N: usize>(pairs: [(&str, &str); N]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn obj(kind: &str, ns: Option<&str>, name: &str) -> ObjectRef {
    ObjectRef {
        api_version: "apps/v1".into(),
        kind: kind.into(),
        namespace: ns.map(Into::into),
        name: name.into(),
        uid: Some("5f1c2a9e-8d0b-4c1e-9a43-2b7f0c6d1e11".into()),
    }
}

fn json<T: Serialize>(v: T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// Every payload type of the contract, with its schema and a realistic sample.
pub fn entries() -> Vec<Entry> {
    vec![
        entry(
            subject::state("prod-eu-1", "Deployment", Some("shop"), "checkout"),
            ResourceState {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: Some("shop".into()),
                name: "checkout".into(),
                uid: "5f1c2a9e-8d0b-4c1e-9a43-2b7f0c6d1e11".into(),
                resource_version: "918273".into(),
                generation: Some(4),
                spec_hash: "9c1d3f0a6b2e4d5c".into(),
                metadata_hash: "0b7a6c5d4e3f2a1b".into(),
                spec: Some(
                    serde_json::json!({"replicas": 3, "selector": {"matchLabels": {"app": "checkout"}}}),
                ),
                status: StatusSnapshot {
                    phase: None,
                    ready: Some(true),
                    replicas: Some(Replicas {
                        desired: 3,
                        updated: 3,
                        ready: 3,
                        available: 3,
                        observed_generation: Some(4),
                    }),
                    conditions: vec![Condition {
                        type_: "Available".into(),
                        status: "True".into(),
                        reason: Some("MinimumReplicasAvailable".into()),
                        message: None,
                        last_transition_time: Some(t(-600)),
                    }],
                    detail: BTreeMap::new(),
                },
                labels: map([("app", "checkout"), ("team", "payments")]),
                annotations: map([("deployment.kubernetes.io/revision", "4")]),
                owner_refs: vec![],
                finalizers: vec![],
                deletion_timestamp: None,
                creation_timestamp: Some(t(-86_400)),
                field_managers: Vec::new(),
            },
        ),
        entry(
            subject::state("prod-eu-1", "ConfigMap", Some("shop"), "checkout-config"),
            ResourceDeleted {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: Some("shop".into()),
                name: "checkout-config".into(),
                uid: "0d2b5c3e-1111-4c1e-9a43-2b7f0c6d1e12".into(),
                resource_version: "918300".into(),
                last_spec_hash: "77aa".into(),
            },
        ),
        entry(
            subject::resync("prod-eu-1", "CronJob"),
            ResyncMarker {
                api_version: "batch/v1beta1".into(),
                kind: "CronJob".into(),
                epoch: 3,
                object_count: 2,
                present: vec![
                    ObjectKey {
                        namespace: Some("ops".into()),
                        name: "backup".into(),
                    },
                    ObjectKey {
                        namespace: Some("ops".into()),
                        name: "report".into(),
                    },
                ],
                part: 0,
                parts: 1,
            },
        ),
        entry(
            subject::event("prod-eu-1", "Pod"),
            KubeEvent {
                occurrence_id: "c2a1f0e9d8b7a6c5".into(),
                uid: "e3b0c442-98fc-4c14-9afb-f4c8996fb924".into(),
                involved: obj("Pod", Some("shop"), "checkout-7d9f8b6c5-x2kqp"),
                reason: "BackOff".into(),
                message:
                    "Back-off restarting failed container checkout in pod checkout-7d9f8b6c5-x2kqp"
                        .into(),
                event_type: "Warning".into(),
                severity: Severity::Warning,
                count: 17,
                first_time: Some(t(-900)),
                last_time: t(0),
                reporter: "kubelet".into(),
                action: None,
                source_api: "v1".into(),
            },
        ),
        entry(
            subject::probe("prod-eu-1", "apiserver"),
            ProbeResult {
                probe: "apiserver".into(),
                status: ProbeStatus::Degraded,
                latency_ms: 2412.0,
                detail: "p95 2.4 s, 31% of requests answered 429".into(),
                round: 1207,
                observations: [
                    ("p95_ms".to_string(), 2412.0),
                    ("error_ratio".to_string(), 0.31),
                ]
                .into_iter()
                .collect(),
                findings: vec![Finding {
                    severity: Severity::Warning,
                    object: None,
                    message: "31% of requests answered 429 Too Many Requests".into(),
                }],
            },
        ),
        entry(
            subject::metrics("prod-eu-1"),
            MetricBatch {
                job: "node-exporter".into(),
                instance: "10.0.3.7:9100".into(),
                families: vec![MetricFamily {
                    name: "node_load1".into(),
                    type_: MetricType::Gauge,
                    help: "1m load average.".into(),
                }],
                samples: vec![Sample {
                    name: "node_load1".into(),
                    labels: map([("cluster", "prod-eu-1"), ("instance", "10.0.3.7:9100")]),
                    value: 0.42,
                    timestamp_ms: t(0).timestamp_millis(),
                }],
                rejected_lines: 0,
            },
        ),
        entry(
            subject::heartbeat("prod-eu-1"),
            Heartbeat {
                interval_s: 5,
                agent_version: env!("CARGO_PKG_VERSION").into(),
                started_at: t(-3600),
                outbox_depth: 0,
                dropped_metric_batches: 0,
                apiserver_reachable: true,
                superseded: 0,
                duplicates: 0,
            },
        ),
        entry(
            subject::facts("prod-eu-1"),
            ClusterFacts {
                node_software: Vec::new(),
                version: KubeVersion {
                    major: 1,
                    minor: 31,
                    git_version: "v1.31.4".into(),
                    platform: "linux/amd64".into(),
                },
                api_versions: vec!["apps/v1".into(), "batch/v1".into(), "v1".into()],
                preferred_versions: map([("CronJob", "batch/v1"), ("Deployment", "apps/v1")]),
                nodes: NodeCounts {
                    total: 12,
                    ready: 12,
                    control_plane: 3,
                },
                cni: Some(Component {
                    name: "calico".into(),
                    version: "v3.28.1".into(),
                    ready: Some("12/12".into()),
                }),
                coredns: Some(Component {
                    name: "coredns".into(),
                    version: "v1.11.3".into(),
                    ready: Some("2/2".into()),
                }),
                ingress_controller: None,
                gpu_device_plugin: None,
                ingress_classes: vec!["nginx".into()],
                storage_classes: vec!["standard".into()],
                default_storage_class: Some("standard".into()),
                apiserver_cert_expiry: Some(t(86_400 * 200)),
                gpus: vec![GpuNode {
                    node: "gpu-1".into(),
                    model: "NVIDIA-A100-SXM4-80GB".into(),
                    driver_version: "550.54.15".into(),
                    capacity: 8,
                    allocatable: 8,
                    allocated: 6,
                }],
                labels: map([
                    ("env", "prod"),
                    ("region", "eu-west-1"),
                    ("owner", "platform"),
                ]),
                scrape_interval_s: Some(30),
            },
        ),
        entry(
            subject::incident("prod-eu-1", "apiserver-overload"),
            Incident {
                id: "inc-3f2a".into(),
                cluster: "prod-eu-1".into(),
                kind: "apiserver-overload".into(),
                severity: Severity::Critical,
                status: IncidentStatus::Open,
                summary: "API server of prod-eu-1 overloaded: p95 2.4 s, 31% 429s since 10:02"
                    .into(),
                opened_at: t(0),
                updated_at: t(30),
                resolved_at: None,
                ingest_time: Some(t(1)),
                evidence: vec![Evidence {
                    rank: 1,
                    kind: EvidenceKind::Change,
                    summary: "Deployment shop/checkout changed (spec hash 11aa → 9c1d)".into(),
                    cluster_time: t(-300),
                    object: Some(obj("Deployment", Some("shop"), "checkout")),
                    why: "the finding names this object; it changed 5m before".into(),
                }],
                labels: map([
                    ("env", "prod"),
                    ("kind", "apiserver-overload"),
                    ("severity", "critical"),
                ]),
                revision: 2,
                acknowledged_by: None,
                blast_radius: None,
                explains: Vec::new(),
            },
        ),
        entry(
            subject::fleet_incident("dns-failure"),
            FleetIncident {
                id: "fi-7c1e".into(),
                kind: "dns-failure".into(),
                severity: Severity::Critical,
                status: IncidentStatus::Open,
                summary: "dns-failure on 3 of 6 clusters (prod-eu-1, prod-us-2, staging-eu-5): 3 of 3 failing run cni calico v3.27.3, 0 of 3 healthy do"
                    .into(),
                opened_at: t(4),
                updated_at: t(40),
                resolved_at: None,
                fleet_size: 6,
                members: ["prod-eu-1", "prod-us-2", "staging-eu-5"]
                    .iter()
                    .enumerate()
                    .map(|(i, c)| FleetMember {
                        cluster: (*c).into(),
                        incident_id: format!("inc-{i}"),
                        severity: Severity::Critical,
                        status: IncidentStatus::Open,
                        summary: format!("cluster DNS of {c} failing: 0 of 2 CoreDNS pods ready"),
                        opened_at: t(i as i64),
                        joined_at: t(4 + 18 * i as i64),
                        left_at: None,
                        left_because: String::new(),
                    })
                    .collect(),
                shared: vec![SharedAttribute {
                    attribute: "cni".into(),
                    value: "calico v3.27.3".into(),
                    failing: 3,
                    failing_total: 3,
                    healthy: 0,
                    healthy_total: 3,
                    support: "3 of 3 failing run cni calico v3.27.3; 0 of 3 healthy do".into(),
                }],
                suspects: vec![Suspect {
                    verdict: SuspectVerdict::Common,
                    object: obj("Deployment", Some("shop"), "checkout"),
                    failing: 2,
                    failing_total: 3,
                    healthy: 2,
                    healthy_total: 3,
                    last_changed: t(-60),
                    summary: "Deployment shop/checkout changed on 2 of 3 failing and 2 of 3 healthy clusters: ordinary churn, not a suspect".into(),
                    release: None,
                }],
                labels: map([
                    ("kind", "dns-failure"),
                    ("scope", "fleet"),
                    ("severity", "critical"),
                ]),
                blast_radius: None,
                revision: 3,
            },
        ),
        entry(
            subject::digest("prod-eu-1", "Pod"),
            EventDigest {
                id: "9f1c2a7b0d3e4f56".into(),
                cluster: "prod-eu-1".into(),
                object: obj("Pod", Some("shop"), "checkout-*"),
                reason: "BackOff".into(),
                severity: Severity::Warning,
                message:
                    "Back-off restarting failed container checkout in pod checkout-7d9f8b-x2x4z"
                        .into(),
                first_seen: t(-600),
                last_seen: t(0),
                count: 100,
                pass: DigestPass::Update,
            },
        ),
        entry(
            subject::compliance("prod-eu-1"),
            ComplianceReport {
                cluster: "prod-eu-1".into(),
                baseline: "fleet-baseline".into(),
                compliant: false,
                checks: vec![
                    ComplianceCheck {
                        rule: "kubernetes-version".into(),
                        status: CheckStatus::Pass,
                        message: "v1.31.4 is within 1.28–1.33".into(),
                        objects: vec![],
                    },
                    ComplianceCheck {
                        rule: "pss-labels".into(),
                        status: CheckStatus::Fail,
                        message: "1 namespace without a Pod Security Standards level".into(),
                        objects: vec![obj("Namespace", None, "legacy")],
                    },
                ],
                evaluated_at: t(0),
            },
        ),
        entry(
            subject::alert("oncall-webhook"),
            Notification {
                id: "ntf-77b1".into(),
                receiver: "oncall-webhook".into(),
                group_key: "{}:{cluster=\"prod-eu-1\"}".into(),
                state: AlertState::Firing,
                title: "[FIRING:1] prod-eu-1 apiserver-overload".into(),
                text: "API server of prod-eu-1 overloaded".into(),
                alerts: vec![NotifiedAlert {
                    incident_id: "inc-3f2a".into(),
                    state: AlertState::Firing,
                    labels: map([("cluster", "prod-eu-1"), ("kind", "apiserver-overload")]),
                    annotations: map([("summary", "API server of prod-eu-1 overloaded")]),
                    starts_at: t(0),
                    ends_at: None,
                }],
            },
        ),
        entry(
            subject::release("ingress-1.12", "command"),
            ReleaseCommand {
                command_id: "rel-1-b1-prod-eu-1-apply".into(),
                release: "ingress-1.12".into(),
                cluster: "prod-eu-1".into(),
                action: ReleaseAction::Apply,
                field_manager: "multipilot".into(),
                force: false,
                objects: vec![json(serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "ingress", "namespace": "ingress-nginx"}, "data": {"k": "v"}
                }))],
                issued_at: t(0),
                expires_at: t(300),
                nonce: "4b1d6c0e9f3a2b7c".into(),
                key_id: "release-2026".into(),
                signature: "00".repeat(64),
            },
        ),
        entry(
            subject::release("ingress-1.12", "result"),
            ReleaseResult {
                command_id: "rel-1-b1-prod-eu-1-apply".into(),
                release: "ingress-1.12".into(),
                cluster: "prod-eu-1".into(),
                ok: true,
                error: None,
                objects: vec![ObjectOutcome {
                    object: obj("ConfigMap", Some("ingress-nginx"), "ingress"),
                    outcome: ApplyOutcome::Configured,
                    error: None,
                    live: None,
                    result: None,
                }],
                replayed: false,
            },
        ),
        entry(
            subject::release("ingress-1.12", "step"),
            ReleaseEvent {
                release: "ingress-1.12".into(),
                revision: 1,
                what: ReleaseEntry::Step,
                state: ReleaseState::Applying,
                actor: "alice".into(),
                batch: Some(1),
                clusters: vec!["prod-eu-1".into()],
                ok: true,
                summary: "applied 3 objects on prod-eu-1 (1 created, 2 configured)".into(),
                detail: serde_json::json!({"outcomes": {"created": 1, "configured": 2}}),
                commit: Some("3e1f0c2".into()),
                at: t(0),
            },
        ),
        entry(
            subject::audit("release", "release.apply"),
            AuditRecord {
                id: "aud-91c2".into(),
                actor: "alice".into(),
                role: "release".into(),
                action: "release.apply".into(),
                target: "ingress-1.12".into(),
                outcome: AuditOutcome::Ok,
                detail: serde_json::json!({"batch": 1, "clusters": ["prod-eu-1"]}),
                commit: Some("3e1f0c2".into()),
            },
        ),
        entry(
            subject::dlq("FLEET_EVENTS"),
            DeadLetter {
                stream: "FLEET_EVENTS".into(),
                consumer: "correlator".into(),
                subject: "fleet.event.prod-eu-1.Pod".into(),
                stream_seq: 1234,
                delivered: 1,
                reason: "decode".into(),
                error: "malformed MessagePack body: unexpected end of file".into(),
                headers: [(
                    "Multipilot-Schema".to_string(),
                    vec!["KubeEvent/1".to_string()],
                )]
                .into_iter()
                .collect(),
                payload_base64: "3q2+7w==".into(),
            },
        ),
    ]
}
