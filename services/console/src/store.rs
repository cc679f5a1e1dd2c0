//! The console's in-memory picture of the fleet, built from the streams alone.
//!
//! Memory is what limits a console at fleet scale (30 clusters × 1,000 workloads, with their ReplicaSets and
//! pods, is 100k+ objects), so an object is only a small index entry: interned kind/namespace/label keys,
//! hashes, a status summary, labels for selectors, and the stream sequence of its state. The full state
//! (spec, annotations, conditions) stays in FLEET_STATE, a last-value stream, and is read back by that
//! sequence only when a diff or a detail view asks for it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use multipilot_schemas::Envelope;
use multipilot_schemas::payload::{
    ClusterFacts, ComplianceReport, Heartbeat, Incident, IncidentStatus, ProbeResult, ProbeStatus,
    ResourceDeleted, ResourceState, ResyncMarker,
};
use serde::Serialize;

/// Where an object lives in a cluster. The namespace is empty for cluster-scoped objects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjKey {
    /// Kind.
    pub kind: Arc<str>,
    /// Namespace (`""` when cluster-scoped).
    pub namespace: Arc<str>,
    /// Name.
    pub name: Box<str>,
}

/// The index entry of one object.
#[derive(Debug, Clone)]
pub struct Obj {
    /// `group/version` the agent read it with.
    pub api_version: Arc<str>,
    /// Spec hash.
    pub spec_hash: Box<str>,
    /// Labels+annotations hash.
    pub metadata_hash: Box<str>,
    /// Labels, keys interned.
    pub labels: Box<[(Arc<str>, Box<str>)]>,
    /// Ready by its kind's rule.
    pub ready: Option<bool>,
    /// Phase.
    pub phase: Option<Box<str>>,
    /// Desired and ready replicas.
    pub replicas: Option<(i64, i64)>,
    /// Stream sequence of the state (where the full state is read back from).
    pub seq: u64,
}

impl Obj {
    /// A label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| &**v)
    }
}

/// A heartbeat as received.
#[derive(Debug, Clone)]
pub struct HeartbeatRec {
    /// The heartbeat.
    pub heartbeat: Heartbeat,
    /// In the cluster's clock.
    pub cluster_time: DateTime<Utc>,
    /// Stored by JetStream.
    pub ingest_time: DateTime<Utc>,
}

/// A probe's latest result.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeRec {
    /// Outcome.
    pub status: ProbeStatus,
    /// One line.
    pub detail: String,
    /// In the cluster's clock.
    pub cluster_time: DateTime<Utc>,
}

/// Everything the console knows of one cluster.
#[derive(Debug, Default)]
pub struct ClusterRec {
    /// Facts and their cluster time.
    pub facts: Option<(ClusterFacts, DateTime<Utc>)>,
    /// Latest heartbeat.
    pub heartbeat: Option<HeartbeatRec>,
    /// Latest result per probe.
    pub probes: BTreeMap<String, ProbeRec>,
    /// Latest compliance report.
    pub compliance: Option<ComplianceReport>,
    /// Objects.
    pub objects: BTreeMap<ObjKey, Obj>,
    /// Multi-part resync markers being gathered, by kind.
    resync: HashMap<Arc<str>, Resync>,
}

/// A resync marker being gathered: (epoch, parts seen, present (namespace, name), lowest stream seq).
type Resync = (u64, BTreeSet<u32>, HashSet<(Arc<str>, Box<str>)>, u64);

/// An incident with what the console measured about its delivery.
#[derive(Debug, Clone, Serialize)]
pub struct IncidentView {
    /// The incident (latest revision).
    #[serde(flatten)]
    pub incident: Incident,
    /// JetStream stored the triggering observation this long after it happened in the cluster
    /// (`ingest_time − cluster time`), in milliseconds; absent when the incident has no triggering message.
    pub delivery_lag_ms: Option<i64>,
    /// When the incident's latest revision was stored (the hub's clock).
    pub stored_at: DateTime<Utc>,
}

/// One message on FLEET_RELEASE, kept as it came (the release role defines its payloads).
#[derive(Debug, Clone, Serialize)]
pub struct ReleaseRecord {
    /// `fleet.release.<release>.<what>`: the `<what>`.
    pub what: String,
    /// Schema header.
    pub schema: String,
    /// Cluster (empty for fleet-wide records).
    pub cluster: String,
    /// Producer's cluster time.
    pub cluster_time: DateTime<Utc>,
    /// Stored by JetStream.
    pub ingest_time: DateTime<Utc>,
    /// Payload as JSON.
    pub payload: serde_json::Value,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Counts {
    /// Messages applied.
    pub applied: u64,
    /// Messages skipped (undecodable or unexpected).
    pub skipped: u64,
}

/// Records kept per release.
const RELEASE_RECORDS: usize = 200;

/// How many resolved fleet incidents the console keeps.
pub const MAX_RESOLVED_FLEET: usize = 500;

/// The store.
#[derive(Debug, Default)]
pub struct Store {
    /// Clusters by name.
    pub clusters: BTreeMap<String, ClusterRec>,
    /// Incidents by id (latest revision).
    pub incidents: HashMap<String, IncidentView>,
    /// Fleet incidents by id (latest revision); resolved ones beyond the newest [`MAX_RESOLVED_FLEET`] are
    /// dropped.
    pub fleet_incidents: BTreeMap<String, multipilot_schemas::payload::FleetIncident>,
    /// Release records by release name, oldest first.
    pub releases: BTreeMap<String, VecDeque<ReleaseRecord>>,
    interned: HashSet<Arc<str>>,
    /// Counters.
    pub counts: Counts,
}

fn ns_of(ns: &Option<String>) -> &str {
    ns.as_deref().unwrap_or("")
}

impl Store {
    /// Interns a short, often repeated string (kinds, namespaces, label keys).
    pub fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.interned.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.interned.insert(a.clone());
        a
    }

    fn cluster(&mut self, name: &str) -> &mut ClusterRec {
        if !self.clusters.contains_key(name) {
            self.clusters
                .insert(name.to_string(), ClusterRec::default());
        }
        self.clusters.get_mut(name).expect("inserted above")
    }

    /// An object's state, stored at `seq` in FLEET_STATE.
    pub fn apply_state(&mut self, cluster: &str, s: &StateSummary, seq: u64) {
        let key = ObjKey {
            kind: self.intern(&s.kind),
            namespace: self.intern(ns_of(&s.namespace)),
            name: s.name.as_str().into(),
        };
        let labels: Box<[(Arc<str>, Box<str>)]> = s
            .labels
            .iter()
            .map(|(k, v)| (self.intern(k), v.as_str().into()))
            .collect();
        let obj = Obj {
            api_version: self.intern(&s.api_version),
            spec_hash: s.spec_hash.as_str().into(),
            metadata_hash: s.metadata_hash.as_str().into(),
            labels,
            ready: s.status.ready,
            phase: s.status.phase.as_deref().map(Into::into),
            replicas: s.status.replicas.map(|r| (r.desired, r.ready)),
            seq,
        };
        let c = self.cluster(cluster);
        match c.objects.get(&key) {
            Some(old) if old.seq > seq => {}
            _ => {
                c.objects.insert(key, obj);
            }
        }
    }

    /// An object's tombstone.
    pub fn apply_deleted(&mut self, cluster: &str, d: &ResourceDeleted, seq: u64) {
        let key = ObjKey {
            kind: self.intern(&d.kind),
            namespace: self.intern(ns_of(&d.namespace)),
            name: d.name.as_str().into(),
        };
        let c = self.cluster(cluster);
        if c.objects.get(&key).is_some_and(|o| o.seq < seq) {
            c.objects.remove(&key);
        }
    }

    /// A resync marker: objects of the kind not present at the (re)list, and not changed since, are gone.
    pub fn apply_resync(&mut self, cluster: &str, r: &ResyncMarker, seq: u64) {
        let kind = self.intern(&r.kind);
        let keys: Vec<(Arc<str>, Box<str>)> = r
            .present
            .iter()
            .map(|k| (self.intern(ns_of(&k.namespace)), k.name.as_str().into()))
            .collect();
        let c = self.cluster(cluster);
        let parts = r.parts.max(1);
        let entry = c
            .resync
            .entry(kind.clone())
            .or_insert_with(|| (r.epoch, BTreeSet::new(), HashSet::new(), seq));
        if entry.0 != r.epoch {
            *entry = (r.epoch, BTreeSet::new(), HashSet::new(), seq);
        }
        entry.1.insert(r.part);
        entry.2.extend(keys);
        entry.3 = entry.3.min(seq);
        if entry.1.len() < parts as usize {
            return; // wait for the other parts
        }
        let Some((_, _, present, first_seq)) = c.resync.remove(&kind) else {
            return;
        };
        c.objects.retain(|k, o| {
            k.kind != kind
                || o.seq > first_seq
                || present.contains(&(k.namespace.clone(), k.name.clone()))
        });
    }

    /// Cluster facts.
    pub fn apply_facts(&mut self, cluster: &str, f: ClusterFacts, at: DateTime<Utc>) {
        let c = self.cluster(cluster);
        if c.facts.as_ref().is_none_or(|(_, t)| *t <= at) {
            c.facts = Some((f, at));
        }
    }

    /// A heartbeat.
    pub fn apply_heartbeat(&mut self, env: &Envelope<Heartbeat>, ingest: DateTime<Utc>) {
        let c = self.cluster(&env.cluster);
        if c.heartbeat.as_ref().is_none_or(|h| h.ingest_time <= ingest) {
            c.heartbeat = Some(HeartbeatRec {
                heartbeat: env.payload.clone(),
                cluster_time: env.cluster_time,
                ingest_time: ingest,
            });
        }
    }

    /// A probe result.
    pub fn apply_probe(&mut self, env: &Envelope<ProbeResult>) {
        let c = self.cluster(&env.cluster);
        let p = &env.payload;
        if c.probes
            .get(&p.probe)
            .is_none_or(|old| old.cluster_time <= env.cluster_time)
        {
            c.probes.insert(
                p.probe.clone(),
                ProbeRec {
                    status: p.status,
                    detail: p.detail.clone(),
                    cluster_time: env.cluster_time,
                },
            );
        }
    }

    /// A compliance report.
    pub fn apply_compliance(&mut self, r: ComplianceReport) {
        let c = self.cluster(&r.cluster.clone());
        if c.compliance
            .as_ref()
            .is_none_or(|old| old.evaluated_at <= r.evaluated_at)
        {
            c.compliance = Some(r);
        }
    }

    /// An incident revision; returns the view when it is newer than what the store had.
    /// Takes a fleet incident's revision (an older one than held is ignored).
    pub fn apply_fleet_incident(&mut self, f: multipilot_schemas::payload::FleetIncident) {
        if self
            .fleet_incidents
            .get(&f.id)
            .is_some_and(|old| old.revision >= f.revision)
        {
            return;
        }
        self.fleet_incidents.insert(f.id.clone(), f);
        let mut resolved: Vec<(DateTime<Utc>, String)> = self
            .fleet_incidents
            .values()
            .filter(|f| f.status == IncidentStatus::Resolved)
            .map(|f| (f.updated_at, f.id.clone()))
            .collect();
        if resolved.len() > MAX_RESOLVED_FLEET {
            resolved.sort();
            for (_, id) in &resolved[..resolved.len() - MAX_RESOLVED_FLEET] {
                self.fleet_incidents.remove(id);
            }
        }
    }

    pub fn apply_incident(
        &mut self,
        inc: Incident,
        stored_at: DateTime<Utc>,
    ) -> Option<IncidentView> {
        if let Some(old) = self.incidents.get(&inc.id)
            && old.incident.revision >= inc.revision
        {
            return None;
        }
        // the lag of the observation that last raised it (a resolution carries the raise's ingest time)
        let lag = match (inc.ingest_time, inc.status) {
            (Some(t), IncidentStatus::Open) => Some((t - inc.updated_at).num_milliseconds()),
            _ => self
                .incidents
                .get(&inc.id)
                .and_then(|o| o.delivery_lag_ms)
                .or_else(|| {
                    inc.ingest_time
                        .map(|t| (t - inc.opened_at).num_milliseconds())
                }),
        };
        let view = IncidentView {
            incident: inc,
            delivery_lag_ms: lag,
            stored_at,
        };
        self.incidents
            .insert(view.incident.id.clone(), view.clone());
        Some(view)
    }

    /// Forgets incidents resolved before `cutoff`.
    pub fn expire_incidents(&mut self, cutoff: DateTime<Utc>) {
        self.incidents.retain(|_, v| {
            v.incident.status != IncidentStatus::Resolved || v.incident.updated_at >= cutoff
        });
    }

    /// A release record.
    pub fn apply_release(&mut self, release: String, rec: ReleaseRecord) {
        let list = self.releases.entry(release).or_default();
        list.push_back(rec);
        while list.len() > RELEASE_RECORDS {
            list.pop_front();
        }
    }

    /// How many objects are stored.
    pub fn object_count(&self) -> usize {
        self.clusters.values().map(|c| c.objects.len()).sum()
    }
}

/// What the console keeps of an object's state: a `ResourceState` message decoded without its spec,
/// status details and managed fields (skipped while decoding, never allocated: they were most of the
/// console's ingest time).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct StateSummary {
    /// `group/version`.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// UID (required, as in `ResourceState`: a message without one is refused, not applied).
    pub uid: String,
    /// resourceVersion (required likewise).
    pub resource_version: String,
    /// Spec hash.
    pub spec_hash: String,
    /// Metadata hash.
    pub metadata_hash: String,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Readiness, phase and replica counts.
    #[serde(default)]
    pub status: StatusSummary,
}

/// The part of a status the console shows.
#[derive(
    Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct StatusSummary {
    /// Phase.
    #[serde(default)]
    pub phase: Option<String>,
    /// Ready by its kind's rule.
    #[serde(default)]
    pub ready: Option<bool>,
    /// Replica counts.
    #[serde(default)]
    pub replicas: Option<ReplicaCounts>,
}

/// Desired and ready replicas.
#[derive(
    Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct ReplicaCounts {
    /// Desired.
    pub desired: i64,
    /// Ready.
    pub ready: i64,
}

impl multipilot_schemas::Payload for StateSummary {
    const SCHEMA: &'static str = <ResourceState as multipilot_schemas::Payload>::SCHEMA;
    const VERSION: u32 = <ResourceState as multipilot_schemas::Payload>::VERSION;
}

impl From<&ResourceState> for StateSummary {
    fn from(s: &ResourceState) -> Self {
        StateSummary {
            api_version: s.api_version.clone(),
            kind: s.kind.clone(),
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            uid: s.uid.clone(),
            resource_version: s.resource_version.clone(),
            spec_hash: s.spec_hash.clone(),
            metadata_hash: s.metadata_hash.clone(),
            labels: s.labels.clone(),
            status: StatusSummary {
                phase: s.status.phase.clone(),
                ready: s.status.ready,
                replicas: s.status.replicas.as_ref().map(|r| ReplicaCounts {
                    desired: r.desired,
                    ready: r.ready,
                }),
            },
        }
    }
}
