//! The correlation engine: a deterministic state machine from messages (heartbeats, probe results,
//! events, states, facts) and the hub's clock to incidents, event digests and compliance reports.
//!
//! It does no I/O: [`Machine::apply`] takes one [`Input`] and returns the messages to publish; the state it
//! changed is handed to the store by [`Machine::take_changes`], and the caller ([`crate::service`]) makes
//! state and outputs durable together before publishing (an outbox: a crash in between re-publishes them
//! with the same Msg-Ids, which JetStream drops). A per-consumer high-water mark makes a redelivered or
//! replayed message a no-op ([`Machine::apply_delivered`]).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Duration, Utc};
use multipilot_schemas::control::{CommandOutcome, IncidentAction, IncidentCommand};
use multipilot_schemas::payload::{
    AuditOutcome, AuditRecord, BlastRadius, CheckStatus, ClusterFacts, ComplianceReport,
    EventDigest, Evidence, EvidenceKind, FleetIncident, Heartbeat, Incident, IncidentStatus,
    KubeEvent, ObjectRef, ProbeResult, ProbeStatus, ReleaseEvent, ReleaseRef, ResourceDeleted,
    ResourceState, ResyncMarker, SettingDivergence, Severity,
};
use multipilot_schemas::streams::StateMsg;
use multipilot_schemas::{Envelope, stable_id, subject};
use serde::{Deserialize, Serialize};

use crate::baseline::{self, Baseline, Inventory};
use crate::dedup::{Dedup, Pass, Record};
use crate::evidence::{self, obj_label, secs};
use crate::fleet::{self, Fleet};
use crate::rules::{Rules, render};
use crate::state::{Beat, ChangeRec, ClusterState, Onset, ProbeTrack, StormWindow, probe_key};
use crate::{blast, consistency};

/// The machine's state as fleet judgement reads it ([`fleet::View`]), borrowed field by field so that the
/// fleet itself can be borrowed mutably beside it.
macro_rules! fleet_view {
    ($m:expr) => {
        fleet::View {
            clusters: &$m.clusters,
            incidents: &$m.incidents,
            changeable: &$m.changeable,
            workloads: &$m.workloads,
            specs: &$m.specs,
            roots: &$m.rules.inhibit.root_kinds,
        }
    };
}

/// A message to publish.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Out {
    /// Subject.
    pub subject: String,
    /// Msg-Id.
    pub msg_id: String,
    /// Schema header.
    pub schema: String,
    /// Encoded envelope.
    pub body: Vec<u8>,
}

/// Counters for telemetry and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Events received.
    pub events_in: u64,
    /// Dedup records passed on.
    pub events_passed: u64,
    /// Messages skipped as replays (at or below the high-water mark).
    pub replays_skipped: u64,
    /// Messages ignored as late (older than what was applied for the same source).
    pub late_ignored: u64,
    /// Incidents not opened because a root incident (`inhibit.root_kinds`) was open on their cluster.
    pub held_back: u64,
}

/// One input of the state machine.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// A Kubernetes event (FLEET_EVENTS).
    Event(&'a Envelope<KubeEvent>),
    /// A heartbeat and when JetStream stored it (FLEET_HEALTH).
    Heartbeat(&'a Envelope<Heartbeat>, DateTime<Utc>),
    /// A probe result and when JetStream stored it (FLEET_HEALTH).
    Probe(&'a Envelope<ProbeResult>, DateTime<Utc>),
    /// An object's state, tombstone or resync marker (FLEET_STATE).
    State(&'a Envelope<StateMsg>),
    /// Cluster facts (FLEET_FACTS).
    Facts(&'a Envelope<ClusterFacts>),
    /// A release's history entry (FLEET_RELEASE): a batch that started applying is remembered on its
    /// clusters, to name it when they fail.
    Release(&'a Envelope<ReleaseEvent>),
    /// The hub's clock: silent clusters become unreachable.
    Tick(DateTime<Utc>),
    /// The hub's clock, hourly: old dedup records and resolved incidents are forgotten.
    Housekeeping(DateTime<Utc>),
}

/// What changed since the last [`Machine::take_changes`], for the store to write.
#[derive(Debug, Default)]
pub struct Changes {
    /// Cluster states, without what is stored apart ([`ClusterState::record`]; `None`: forgotten, with
    /// everything stored apart).
    pub clusters: Vec<(String, Option<ClusterState>)>,
    /// Clusters' heartbeat fields (`None`: forgotten).
    pub beats: Vec<(String, Option<Beat>)>,
    /// Clusters' probes, keyed `cluster/probe` (`None`: forgotten).
    pub probes: Vec<(String, Option<ProbeTrack>)>,
    /// Clusters' spec changes, keyed `cluster/<seq, 16 hex digits>` (`None`: forgotten).
    pub changes: Vec<(String, Option<ChangeRec>)>,
    /// Storm windows (`None`: the cluster is forgotten).
    pub windows: Vec<(String, Option<StormWindow>)>,
    /// Spec hashes, keyed `cluster/kind/ns/name` (`None`: the object is gone).
    pub specs: Vec<(String, Option<String>)>,
    /// Workloads' compared settings, keyed `cluster/<kind> <ns>/<name>` (`None`: the workload is gone).
    pub workloads: Vec<(String, Option<BTreeMap<String, String>>)>,
    /// Incidents by key (`None`: forgotten).
    pub incidents: Vec<(String, Option<Incident>)>,
    /// Dedup records by id (`None`: expired).
    pub dedup: Vec<(String, Option<std::sync::Arc<Record>>)>,
    /// The high-water marks, when one moved.
    pub hwm: Option<BTreeMap<String, u64>>,
    /// Fleet incidents by key (`None`: forgotten).
    pub fleet: Vec<(String, Option<FleetIncident>)>,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
            && self.beats.is_empty()
            && self.probes.is_empty()
            && self.changes.is_empty()
            && self.windows.is_empty()
            && self.specs.is_empty()
            && self.workloads.is_empty()
            && self.incidents.is_empty()
            && self.dedup.is_empty()
            && self.hwm.is_none()
            && self.fleet.is_empty()
    }
}

#[derive(Debug, Default)]
struct Dirty {
    /// Clusters whose record changed (what is not stored apart).
    clusters: BTreeSet<String>,
    /// Clusters whose heartbeat fields changed.
    beats: BTreeSet<String>,
    /// Probes that changed, by cluster and probe.
    probes: BTreeSet<(String, String)>,
    /// Clusters with spec changes added (and so dropped) since they were handed over.
    changes: BTreeSet<String>,
    specs: BTreeSet<(String, String)>,
    workloads: BTreeSet<(String, String)>,
    incidents: BTreeSet<String>,
    fleet: BTreeSet<String>,
    hwm: bool,
    /// Clusters whose storm window changed since it was last written; with `true`, write it at once.
    windows: BTreeMap<String, bool>,
}

/// Everything the machine holds, as the store reads it back.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Cluster states.
    pub clusters: BTreeMap<String, ClusterState>,
    /// Storm windows by cluster (put into `clusters` on restore).
    pub windows: BTreeMap<String, StormWindow>,
    /// Spec hashes per cluster, keyed `kind/ns/name`.
    pub specs: BTreeMap<String, BTreeMap<String, String>>,
    /// Workloads' compared settings per cluster, keyed `<kind> <ns>/<name>`.
    pub workloads: BTreeMap<String, BTreeMap<String, BTreeMap<String, String>>>,
    /// Incidents by key.
    pub incidents: BTreeMap<String, Incident>,
    /// Dedup records.
    pub dedup: Vec<Record>,
    /// High-water marks per consumer.
    pub hwm: BTreeMap<String, u64>,
    /// Fleet incidents by key.
    pub fleet: BTreeMap<String, FleetIncident>,
}

/// The current value of each dirty (cluster, object), keyed `cluster/object` for the store (`None`: gone).
fn per_object<T: Clone>(
    dirty: BTreeSet<(String, String)>,
    held: &BTreeMap<String, BTreeMap<String, T>>,
) -> Vec<(String, Option<T>)> {
    dirty
        .into_iter()
        .map(|(c, k)| {
            let v = held.get(&c).and_then(|m| m.get(&k)).cloned();
            (format!("{c}/{k}"), v)
        })
        .collect()
}

/// The correlation state machine.
#[derive(Debug)]
pub struct Machine {
    rules: Rules,
    baseline: Baseline,
    source: String,
    clusters: BTreeMap<String, ClusterState>,
    /// Spec hash per object, per cluster (`kind/ns/name`).
    specs: BTreeMap<String, BTreeMap<String, String>>,
    /// How many of each cluster's `specs` are of a change kind ([`fleet::is_change_kind`]), counted as
    /// objects come and go: a fleet judgement reads it for every failing cluster, and counting the
    /// inventory there was half the correlator's CPU while a fleet's first listings arrived.
    changeable: BTreeMap<String, usize>,
    /// The compared settings of each workload ([`consistency::workload_settings`]), per cluster
    /// (`<kind> <ns>/<name>`): kept apart from the cluster state, which is written far more often.
    workloads: BTreeMap<String, BTreeMap<String, BTreeMap<String, String>>>,
    /// The current incident of each condition, by key ([`incident_key`]).
    incidents: BTreeMap<String, Incident>,
    /// Fleet incidents: one failure across clusters.
    fleet: Fleet,
    /// When the fleet incidents' members were last checked for silent or forgotten clusters.
    fleet_swept: Option<DateTime<Utc>>,
    /// The hub time of the last tick, and how long this machine has watched since its first: the sum of
    /// the forward steps between ticks (a clock stepped back adds nothing and takes nothing away). A
    /// cluster is silent only after as long of watching as its heartbeats may miss: a correlator that was
    /// down (a restart, a system started again) heard nothing, which says nothing about the cluster, as
    /// Kubernetes' node lifecycle controller counts a node's grace period from when it started watching.
    watched: (Option<DateTime<Utc>>, Duration),
    /// Fleet incidents whose members changed since they were last judged, with the newest change's hub
    /// time: judged at the end of each input, or with [`Machine::defer_fleet_judgement`] once per
    /// [`Machine::settle`].
    fleet_stale: BTreeMap<String, DateTime<Utc>>,
    /// Changes read while a fleet incident is open (cluster, when on its clock): those made before one
    /// was judged, though read after (a backlog, watches racing), judge it again with the rest.
    fleet_late: Vec<(String, DateTime<Utc>)>,
    /// The latest time (hub) an incident of a kind that makes a whole cluster unusable changed since the
    /// last judgement: what the clusters lost together take down may have changed
    /// ([`Fleet::blast_stale`]), looked at once per batch.
    roots_changed: Option<DateTime<Utc>>,
    /// See [`Machine::defer_fleet_judgement`].
    defer_fleet: bool,
    /// High-water mark per consumer (stream sequence).
    hwm: BTreeMap<String, u64>,
    dedup: Dedup,
    stats: Stats,
    /// Events are applied without publishing digests (a rebuild replaying history already digested).
    replaying: bool,
    /// While a wiped store replays FLEET_STATE and FLEET_FACTS, the baseline is not judged: a
    /// half-replayed inventory would pass checks it fails (and resolve drift that is still there).
    holding_judgement: bool,
    /// Outputs of the step in progress.
    out: Vec<Out>,
    dirty: Dirty,
    /// Per cluster, the newest warning time of its storm window when the window was last handed over.
    windows_saved: BTreeMap<String, DateTime<Utc>>,
    /// Per cluster, the `seq`s of the changes last handed over ([`ClusterState::change_seqs`]).
    changes_saved: BTreeMap<String, std::ops::Range<u64>>,
}

/// A condition found: what [`Machine::raise`] opens or updates an incident for.
struct Raise<'a> {
    cluster: &'a str,
    kind: &'a str,
    target: &'a str,
    severity: Severity,
    summary: String,
    /// When (cluster clock, or the hub's for silence).
    at: DateTime<Utc>,
    /// When JetStream stored the message that showed it.
    ingest: Option<DateTime<Utc>>,
    cause: Cause<'a>,
}

/// What found the condition (it decides the evidence).
enum Cause<'a> {
    /// A probe, when the rule's failing streak began (evidence: what bears on its finding, changes up to
    /// then), and whether the incident accounts for the warnings on what it found (the rule's
    /// `explains_warnings`).
    Probe(&'a str, DateTime<Utc>, bool),
    /// A baseline check (evidence: its finding and the violating objects).
    Check(&'a multipilot_schemas::payload::ComplianceCheck),
    /// The cluster as a whole: heartbeats, clock, event rate.
    Cluster,
}

/// The key of the current incident of a condition: `cluster/kind/target`.
pub fn incident_key(cluster: &str, kind: &str, target: &str) -> String {
    format!("{cluster}/{kind}/{target}")
}

/// Where an incident is kept once a newer one of its key (`cluster/kind/target`) has replaced it: resolved
/// history, listed until housekeeping drops it.
fn history_key(key: &str, id: &str) -> String {
    format!("{key}#{id}")
}

impl Machine {
    /// A machine with no state.
    pub fn new(rules: Rules, baseline: Baseline, source: &str) -> Self {
        Machine::restore_snapshot(rules, baseline, source, Snapshot::default())
    }

    /// A machine holding what the store read back.
    pub fn restore_snapshot(rules: Rules, baseline: Baseline, source: &str, s: Snapshot) -> Self {
        let mut dedup = Dedup::with_refresh(rules.digests.refresh);
        for r in s.dedup {
            dedup.restore(r);
        }
        let mut clusters = s.clusters;
        for (name, w) in s.windows {
            w.restore_into(clusters.entry(name).or_default());
        }
        Machine {
            rules,
            baseline,
            source: source.to_string(),
            windows_saved: BTreeMap::new(),
            changes_saved: clusters
                .iter()
                .map(|(name, c)| (name.clone(), c.change_seqs()))
                .collect(),
            clusters,
            changeable: s
                .specs
                .iter()
                .map(|(c, objects)| {
                    let n = objects
                        .keys()
                        .filter(|k| fleet::is_change_kind(k.split('/').next().unwrap_or_default()))
                        .count();
                    (c.clone(), n)
                })
                .collect(),
            specs: s.specs,
            workloads: s.workloads,
            incidents: s.incidents,
            fleet: Fleet::restored(s.fleet),
            fleet_swept: None,
            watched: (None, Duration::zero()),
            fleet_stale: BTreeMap::new(),
            fleet_late: Vec::new(),
            roots_changed: None,
            defer_fleet: false,
            hwm: s.hwm,
            dedup,
            stats: Stats::default(),
            replaying: false,
            holding_judgement: false,
            out: Vec::new(),
            dirty: Dirty::default(),
        }
    }

    /// Whether the machine holds nothing at all (a new or wiped store).
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
            && self.incidents.is_empty()
            && self.fleet.incidents.is_empty()
            && self.hwm.is_empty()
            && self.dedup.is_empty()
    }

    /// The highest stream sequence applied from `consumer` (0: none).
    pub fn high_water(&self, consumer: &str) -> u64 {
        self.hwm.get(consumer).copied().unwrap_or(0)
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Applies one input; returns the messages to publish (incident changes, digests, compliance reports),
    /// which the caller makes durable together with the state before publishing them.
    pub fn apply(&mut self, input: Input<'_>) -> Vec<Out> {
        match input {
            Input::Event(env) => self.on_event(env),
            Input::Heartbeat(env, ingest) => self.on_heartbeat(env, ingest),
            Input::Probe(env, ingest) => self.on_probe(env, ingest),
            Input::State(env) => self.on_state(env),
            Input::Facts(env) => self.on_facts(env),
            Input::Release(env) => self.on_release(&env.payload),
            Input::Tick(now) => self.tick(now),
            Input::Housekeeping(now) => self.housekeeping(now),
        }
        if !self.defer_fleet {
            self.judge_fleet();
        }
        std::mem::take(&mut self.out)
    }

    /// Fleet incidents are judged (and their new revisions published) at [`Machine::settle`] instead of
    /// after every input: a batch of digests adding clusters to one problem is judged once.
    pub fn defer_fleet_judgement(&mut self) {
        self.defer_fleet = true;
    }

    /// Judges the fleet incidents the inputs since the last call changed; returns what to publish.
    pub fn settle(&mut self) -> Vec<Out> {
        self.judge_fleet();
        std::mem::take(&mut self.out)
    }

    fn fleet_changed(&mut self, key: String, now: DateTime<Utc>) {
        let at = self.fleet_stale.entry(key).or_insert(now);
        *at = (*at).max(now);
    }

    fn judge_fleet(&mut self) {
        if let Some(now) = self.roots_changed.take() {
            for k in self.fleet.blast_stale(fleet_view!(self)) {
                self.fleet_changed(k, now);
            }
        }
        if !self.fleet_late.is_empty() {
            let view = fleet_view!(self);
            let lookback =
                Duration::from_std(self.rules.fleet.lookback).unwrap_or(Duration::minutes(15));
            let mut keys = BTreeSet::new();
            let mut now = None;
            for (c, at) in std::mem::take(&mut self.fleet_late) {
                let at = fleet::hub_time(view, &c, at);
                let covering = self.fleet.covering(view, lookback, at);
                if !covering.is_empty() {
                    now = now.max(Some(at));
                    keys.extend(covering);
                }
            }
            // those judged below anyway are judged once, at the time of what changed their members
            let keys: Vec<String> = keys
                .into_iter()
                .filter(|k| !self.fleet_stale.contains_key(k))
                .collect();
            if let Some(now) = now {
                for k in self.fleet.rejudge(&self.rules.fleet, view, now, &keys) {
                    self.emit_fleet(&k);
                }
            }
        }
        let mut attrs = fleet::Attributes::default();
        for (k, now) in std::mem::take(&mut self.fleet_stale) {
            let view = fleet_view!(self);
            if self
                .fleet
                .judge(&k, &self.rules.fleet, view, now, &mut attrs)
            {
                self.emit_fleet(&k);
            }
        }
    }

    /// Applies a message delivered by `consumer` at `stream_seq`, unless a message at or above that
    /// sequence was applied already (a redelivery after a crash, or a replay the rebuild applied).
    pub fn apply_delivered(
        &mut self,
        consumer: &str,
        stream_seq: u64,
        input: Input<'_>,
    ) -> Vec<Out> {
        if self.seen(consumer, stream_seq) {
            return Vec::new();
        }
        self.apply(input)
    }

    /// A release batch that started applying (`what: batch`, ok, with a batch number) is remembered on
    /// each of its clusters the correlator knows. A revision rolled back (`rolled-back`, ok) runs nowhere
    /// any more: the clusters it changed were restored, and those of a batch stopped before it changed
    /// them never ran it — there it did not reach them either (no suspect). Everything else of a
    /// release's history is not needed.
    fn on_release(&mut self, e: &ReleaseEvent) {
        if e.what == "rolled-back" {
            // (a failed rollback lists the clusters changed as well: the others were not, either way)
            let changed: BTreeSet<&str> = e.clusters.iter().map(String::as_str).collect();
            let mut touched = Vec::new();
            for (name, state) in &mut self.clusters {
                let mut forgot = e.ok && state.running_rolled_back(&e.release, e.revision);
                if !changed.contains(name.as_str()) {
                    forgot |= state.release_not_applied(&e.release, e.revision);
                }
                if forgot {
                    self.dirty.clusters.insert(name.clone());
                    touched.push(name.clone());
                }
            }
            if !touched.is_empty() {
                // the open fleet incidents of those clusters lose that suspect and shared attribute
                let view = fleet_view!(self);
                let keys = self.fleet.with_members_on(&touched);
                for k in self.fleet.rejudge(&self.rules.fleet, view, e.at, &keys) {
                    self.emit_fleet(&k);
                }
            }
            return;
        }
        if e.what != "batch" || !e.ok || e.batch.is_none() {
            return;
        }
        let running = crate::state::Running {
            revision: e.revision,
            commit: e.commit.clone(),
            repo: e.detail["repo"].as_str().map(str::to_string),
            policy: e.detail["policy"].as_bool().unwrap_or(false),
            at: e.at,
        };
        let r = ReleaseRef {
            name: e.release.clone(),
            revision: e.revision,
            batch: e.batch,
            commit: e.commit.clone(),
        };
        let mut known = Vec::new();
        for c in &e.clusters {
            if let Some(state) = self.clusters.get_mut(c) {
                state.release_applied(e.at, r.clone());
                state.running_applied(&e.release, running.clone());
                self.dirty.clusters.insert(c.clone());
                known.push(c.clone());
            }
        }
        if known.is_empty() {
            return;
        }
        let view = fleet_view!(self);
        let keys = self.fleet.with_members_on(&known);
        for k in self.fleet.rejudge(&self.rules.fleet, view, e.at, &keys) {
            self.emit_fleet(&k);
        }
    }

    /// Events are applied without publishing digests while `on` (a rebuild replaying history whose
    /// digests were published when it happened).
    pub fn set_replaying(&mut self, on: bool) {
        self.replaying = on;
    }

    /// The baseline is not judged until [`Machine::release_judgement`] (a wiped store replaying its
    /// inventory).
    pub fn hold_judgement(&mut self) {
        self.holding_judgement = true;
    }

    /// What changed since the last call, for the store. A storm window that keeps changing is handed over
    /// at most every [`StormWindow::SAVE_EVERY`] of its cluster's time (see [`Machine::take_all_changes`]).
    pub fn take_changes(&mut self) -> Changes {
        self.changes(false)
    }

    /// Everything that changed, storm windows included however recently they were written (at a stop).
    pub fn take_all_changes(&mut self) -> Changes {
        self.changes(true)
    }

    fn changes(&mut self, all: bool) -> Changes {
        let mut d = std::mem::take(&mut self.dirty);
        let mut windows = Vec::new();
        for (name, now) in std::mem::take(&mut d.windows) {
            let Some(c) = self.clusters.get(&name) else {
                windows.push((name.clone(), None));
                self.windows_saved.remove(&name);
                continue;
            };
            let newest = c.warnings.back().map(|(t, _)| *t);
            let due = all
                || now
                || match (self.windows_saved.get(&name), newest) {
                    (Some(saved), Some(newest)) => {
                        newest - *saved >= StormWindow::SAVE_EVERY || newest < *saved
                    }
                    _ => true,
                };
            if due {
                if let Some(t) = newest {
                    self.windows_saved.insert(name.clone(), t);
                }
                windows.push((name, Some(StormWindow::of(c))));
            } else {
                self.dirty.windows.insert(name, false);
            }
        }
        let mut changes = Vec::new();
        for k in d.clusters.union(&d.changes) {
            self.hand_over_changes(k, &mut changes);
        }
        Changes {
            windows,
            changes,
            beats: d
                .beats
                .into_iter()
                .map(|k| {
                    let v = self.clusters.get(&k).map(ClusterState::beat);
                    (k, v)
                })
                .collect(),
            probes: d
                .probes
                .into_iter()
                .map(|(c, p)| {
                    let v = self
                        .clusters
                        .get(&c)
                        .and_then(|s| s.probes.get(&p))
                        .cloned();
                    (probe_key(&c, &p), v)
                })
                .collect(),
            clusters: d
                .clusters
                .into_iter()
                .map(|k| {
                    let v = self.clusters.get(&k).map(ClusterState::record);
                    (k, v)
                })
                .collect(),
            specs: per_object(d.specs, &self.specs),
            workloads: per_object(d.workloads, &self.workloads),
            incidents: d
                .incidents
                .into_iter()
                .map(|k| {
                    let v = self.incidents.get(&k).cloned();
                    (k, v)
                })
                .collect(),
            dedup: self.dedup.take_changes(),
            hwm: d.hwm.then(|| self.hwm.clone()),
            fleet: d
                .fleet
                .into_iter()
                .map(|k| {
                    let v = self.fleet.incidents.get(&k).cloned();
                    (k, v)
                })
                .collect(),
        }
    }

    /// The changes of `cluster` added and dropped since they were last handed over (all of them dropped
    /// when the cluster is forgotten), keyed for the store.
    fn hand_over_changes(&mut self, cluster: &str, out: &mut Vec<(String, Option<ChangeRec>)>) {
        let key = |seq: u64| crate::state::change_key(cluster, seq);
        let held = self.clusters.get(cluster);
        let now = held.map_or(u64::MAX..u64::MAX, ClusterState::change_seqs);
        let was = self.changes_saved.get(cluster).cloned().unwrap_or(0..0);
        for seq in was.start..was.end.min(now.start) {
            out.push((key(seq), None));
        }
        if let Some(c) = held {
            let from = was.end.max(now.start);
            let added = c.changes.iter().rev().take_while(|ch| ch.seq >= from);
            let at = out.len();
            out.extend(added.map(|ch| (key(ch.seq), Some(ch.clone()))));
            out[at..].reverse();
            self.changes_saved.insert(cluster.to_string(), now);
        } else {
            self.changes_saved.remove(cluster);
        }
    }

    /// Restores incidents and compliance reports read back from FLEET_INCIDENTS after the store was wiped:
    /// `incidents` holds the latest revision of each incident, so new revisions continue its numbering
    /// (and their Msg-Ids never clash with stored ones). An incident's key (`cluster/kind/target`) is not
    /// in the message: it is found again by recomputing the id from each target the rules can give that
    /// kind; one that matches no target is kept under its id (listed and commandable, but a recurring
    /// condition opens a new incident). Of two incidents of one key the newer one is current.
    pub fn restore(&mut self, incidents: Vec<Incident>, reports: Vec<ComplianceReport>) -> usize {
        let mut drift_rules: Vec<String> = reports
            .iter()
            .flat_map(|r| r.checks.iter().map(|c| c.rule.clone()))
            .collect();
        drift_rules.sort();
        drift_rules.dedup();
        for r in reports {
            self.dirty.clusters.insert(r.cluster.clone());
            let c = self.clusters.entry(r.cluster.clone()).or_default();
            if c.compliance
                .as_ref()
                .is_none_or(|old| old.evaluated_at <= r.evaluated_at)
            {
                c.compliance = Some(r);
            }
        }
        let mut restored = 0;
        for inc in incidents {
            let mut targets: Vec<String> = self
                .rules
                .probes
                .iter()
                .filter(|r| r.kind == inc.kind)
                .map(|r| r.probe.clone())
                .collect();
            if inc.kind == self.rules.heartbeat.kind {
                targets.push("heartbeat".into());
            }
            if inc.kind == self.rules.clock_skew.kind {
                targets.push("clock".into());
            }
            if inc.kind == self.rules.event_storm.kind {
                targets.push("events".into());
            }
            if inc.kind == "baseline-drift" {
                targets.extend(drift_rules.iter().cloned());
            }
            let opened = inc.opened_at.to_rfc3339();
            let key = targets
                .iter()
                .find(|t| stable_id(&[&inc.cluster, &inc.kind, t, &opened]) == inc.id)
                .map(|t| incident_key(&inc.cluster, &inc.kind, t))
                .unwrap_or_else(|| {
                    tracing::warn!(id = %inc.id, kind = %inc.kind, "restored incident matches no rule target; kept under its id");
                    incident_key(&inc.cluster, &inc.kind, &format!("#{}", inc.id))
                });
            let newer = self
                .incidents
                .get(&key)
                .is_none_or(|cur| (cur.opened_at, cur.revision) <= (inc.opened_at, inc.revision));
            let key = if newer {
                if self.incidents.get(&key).is_some_and(|cur| cur.id != inc.id) {
                    self.retire(&key);
                }
                key
            } else {
                history_key(&key, &inc.id)
            };
            self.dirty.incidents.insert(key.clone());
            self.incidents.insert(key, inc);
            restored += 1;
        }
        restored
    }

    /// Whether a message of `consumer` at `stream_seq` was applied already; marks it applied otherwise.
    fn seen(&mut self, consumer: &str, stream_seq: u64) -> bool {
        let hwm = self.hwm.entry(consumer.to_string()).or_insert(0);
        if stream_seq <= *hwm {
            self.stats.replays_skipped += 1;
            return true;
        }
        *hwm = stream_seq;
        self.dirty.hwm = true;
        false
    }

    fn emit_incident(&mut self, inc: &Incident) {
        let mut env = Envelope::new(
            inc.cluster.as_str(),
            self.source.as_str(),
            inc.updated_at,
            inc.revision,
            inc.clone(),
        );
        env.agent_time = inc.updated_at;
        match multipilot_schemas::encode(&env) {
            Ok(body) => self.out.push(Out {
                subject: subject::incident(&inc.cluster, &inc.kind),
                msg_id: stable_id(&[&inc.id, &inc.revision.to_string()]),
                schema: <Incident as multipilot_schemas::Payload>::schema_header(),
                body,
            }),
            Err(e) => tracing::error!(error = %e, "cannot encode an incident"),
        }
        // one failure across clusters: the fleet incident it belongs to, if any
        let view = fleet_view!(self);
        let now = fleet::hub_time(view, &inc.cluster, inc.updated_at);
        if let Some(k) = self.fleet.on_incident(&self.rules.fleet, inc, view, now) {
            self.fleet_changed(k, now);
        }
        // a cluster lost or back: what the clusters lost with others take down together may change
        if self.rules.inhibit.root_kinds.contains(&inc.kind) {
            self.roots_changed = self.roots_changed.max(Some(now));
        }
    }

    /// Publishes the fleet incident at `key` (`fleet.fleet-incident.<kind>`) and marks it for the store
    /// (with the history entry a new one may have displaced).
    fn emit_fleet(&mut self, key: &str) {
        self.dirty.fleet.insert(key.to_string());
        let Some(f) = self.fleet.incidents.get(key) else {
            return;
        };
        if f.revision == 1 {
            // a new one moved its predecessor to history
            let history = format!("{key}#");
            for k in self.fleet.incidents.keys() {
                if k.starts_with(&history) {
                    self.dirty.fleet.insert(k.clone());
                }
            }
        }
        let env = Envelope::new(
            "fleet",
            self.source.as_str(),
            f.updated_at,
            f.revision,
            f.clone(),
        );
        match multipilot_schemas::encode(&env) {
            Ok(body) => self.out.push(Out {
                subject: subject::fleet_incident(&f.kind),
                msg_id: stable_id(&[&f.id, &f.revision.to_string()]),
                schema: <FleetIncident as multipilot_schemas::Payload>::schema_header(),
                body,
            }),
            Err(e) => tracing::error!(error = %e, "cannot encode a fleet incident"),
        }
    }

    /// Passes a deduplicated event problem on (`fleet.digest.<cluster>.<kind>`): the alert router and other
    /// teams read these instead of every repeat.
    fn emit_digest(&mut self, rec: &Record, pass: Pass) {
        let digest = EventDigest {
            id: rec.id.clone(),
            cluster: rec.cluster.clone(),
            object: rec.object.clone(),
            reason: rec.reason.clone(),
            severity: rec.severity,
            message: rec.last_message.clone(),
            first_seen: rec.first_seen,
            last_seen: rec.last_seen,
            count: rec.count,
            pass: pass.reason(),
        };
        let env = Envelope::new(
            rec.cluster.as_str(),
            self.source.as_str(),
            rec.last_seen,
            rec.count,
            digest,
        );
        if let Ok(body) = multipilot_schemas::encode(&env) {
            self.out.push(Out {
                subject: subject::digest(&rec.cluster, &rec.object.kind),
                msg_id: stable_id(&[
                    &rec.id,
                    &rec.count.to_string(),
                    &format!("{:?}", rec.severity),
                ]),
                schema: <EventDigest as multipilot_schemas::Payload>::schema_header(),
                body,
            });
        }
        // the same problem on other clusters: one fleet problem
        let view = fleet_view!(self);
        let now = fleet::hub_time(view, &rec.cluster, rec.last_seen);
        if let Some(k) = self.fleet.on_digest(&self.rules.fleet, rec, now) {
            self.fleet_changed(k, now);
        }
        // a problem read back under another key moved to its own (the store drops the old key and keeps
        // what it moved aside), or joined the one open there (the other resolves)
        self.dirty.fleet.extend(self.fleet.take_rekeyed());
        for k in self.fleet.take_rejudge() {
            self.fleet_changed(k, now);
        }
    }

    fn emit_compliance(&mut self, report: &ComplianceReport) {
        let digest = stable_id(&[&serde_json::to_string(&report.checks).unwrap_or_default()]);
        let env = Envelope::new(
            report.cluster.as_str(),
            self.source.as_str(),
            report.evaluated_at,
            0,
            report.clone(),
        );
        if let Ok(body) = multipilot_schemas::encode(&env) {
            self.out.push(Out {
                subject: subject::compliance(&report.cluster),
                msg_id: stable_id(&[&report.cluster, "compliance", &digest]),
                schema: <ComplianceReport as multipilot_schemas::Payload>::schema_header(),
                body,
            });
        }
    }

    fn evidence(
        &self,
        cluster: &str,
        probe: Option<&str>,
        at: DateTime<Utc>,
        onset: DateTime<Utc>,
    ) -> Vec<Evidence> {
        evidence::gather(
            &self.rules.evidence,
            cluster,
            self.clusters.get(cluster),
            &self.dedup,
            probe,
            at,
            onset,
        )
    }

    fn changes_phrase(&self, cluster: &str, at: DateTime<Utc>) -> String {
        let others: Vec<&ClusterState> = self
            .clusters
            .iter()
            .filter(|(name, _)| name.as_str() != cluster)
            .map(|(_, c)| c)
            .collect();
        evidence::changes_phrase(
            &self.rules.evidence,
            self.clusters.get(cluster),
            &others,
            at,
        )
    }

    /// Opens the incident for `(cluster, kind, target)` or updates the open one.
    fn raise(&mut self, r: Raise<'_>) {
        let Raise {
            cluster,
            kind,
            target,
            severity,
            summary,
            at,
            ingest,
            cause,
        } = r;
        // one line, whatever a probe's detail or an event's message brought along (a table row, an alert's
        // summary, a chat message)
        let summary = if summary.contains(['\n', '\r']) {
            summary
                .split(['\n', '\r'])
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("; ")
        } else {
            summary
        };
        let key = incident_key(cluster, kind, target);
        if !self.is_open(cluster, kind, target) && self.inhibited(cluster, kind) {
            self.stats.held_back += 1;
            tracing::debug!(
                cluster,
                kind,
                target,
                "held back: a root incident is open on the cluster"
            );
            return;
        }
        self.dirty.incidents.insert(key.clone());
        let mut evidence = match cause {
            Cause::Probe(p, onset, _) => self.evidence(cluster, Some(p), at, onset),
            Cause::Check(c) => evidence::of_check(&self.rules.evidence, c, at),
            Cause::Cluster => self.evidence(cluster, None, at, at),
        };
        // a whole cluster lost: what it takes down, right after the finding
        let blast_radius = self
            .rules
            .inhibit
            .root_kinds
            .iter()
            .any(|k| k == kind)
            .then(|| self.blast_radius(cluster))
            .flatten();
        if let Some(br) = &blast_radius {
            evidence.insert(
                evidence.len().min(1),
                Evidence {
                    rank: 0,
                    kind: EvidenceKind::Fact,
                    summary: format!("{cluster} {}", br.summary),
                    cluster_time: at,
                    object: None,
                    why: "what the cluster ran when last heard: what this outage takes down".into(),
                },
            );
            for (i, e) in evidence.iter_mut().enumerate() {
                e.rank = i as u32 + 1;
            }
        }
        // a cluster whose component settings are the odd ones out among its peers: last, as context
        if let Some(d) = self
            .consistency()
            .into_iter()
            .find(|d| d.odd_ones_out.iter().any(|c| c == cluster))
        {
            evidence.push(Evidence {
                rank: evidence.len() as u32 + 1,
                kind: EvidenceKind::Fact,
                summary: d.summary,
                cluster_time: at,
                object: None,
                why: format!(
                    "{cluster} is the odd one out among its {} peers: a setting no single cluster alerts on",
                    d.group
                ),
            });
        }
        // the warnings on what its probe found: its own, not problems of their own
        let explains = match cause {
            Cause::Probe(p, _, true) => evidence::explained(
                &self.rules.evidence,
                cluster,
                self.clusters.get(cluster),
                &self.dedup,
                p,
                at,
            ),
            _ => Vec::new(),
        };
        let mut labels = self
            .clusters
            .get(cluster)
            .map(|c| c.labels.clone())
            .unwrap_or_default();
        labels.insert("cluster".into(), cluster.into());
        labels.insert("kind".into(), kind.into());
        labels.insert("severity".into(), format!("{severity:?}").to_lowercase());
        match self.incidents.get_mut(&key) {
            Some(inc) if inc.status != IncidentStatus::Resolved => {
                // an open incident is updated when what a person reads changes, at most once a minute,
                // and at once when it accounts for another warning (whose alert waits to be muted)
                let more = inc.explains.len() < evidence::MAX_EXPLAINED
                    && explains
                        .iter()
                        .any(|d| inc.explains.binary_search(d).is_err());
                let material = inc.severity != severity
                    || more
                    || (inc.summary != summary && at - inc.updated_at >= Duration::seconds(60));
                if !material || at < inc.updated_at {
                    return;
                }
                if more {
                    // what it accounted for while open stays accounted for (the warnings age out of the
                    // window; they were its own), up to the most it holds
                    for d in explains {
                        if inc.explains.len() == evidence::MAX_EXPLAINED {
                            break;
                        }
                        if let Err(at) = inc.explains.binary_search(&d) {
                            inc.explains.insert(at, d);
                        }
                    }
                }
                inc.severity = severity;
                inc.summary = summary;
                inc.evidence = match cause {
                    // what changed before its streak began was said when it opened, and the change
                    // history held moves on
                    Cause::Probe(..) => evidence::keep_changes(
                        &inc.evidence,
                        evidence,
                        self.rules.evidence.max_items,
                    ),
                    _ => evidence,
                };
                inc.blast_radius = blast_radius;
                inc.updated_at = at;
                inc.ingest_time = ingest;
                inc.revision += 1;
                let inc = inc.clone();
                self.emit_incident(&inc);
            }
            Some(inc) if inc.resolved_at.is_some_and(|r| at <= r) => {
                // a message from before the resolution can't reopen it
                self.stats.late_ignored += 1;
            }
            _ => {
                self.retire(&key);
                let inc = Incident {
                    id: stable_id(&[cluster, kind, target, &at.to_rfc3339()]),
                    cluster: cluster.into(),
                    kind: kind.into(),
                    severity,
                    status: IncidentStatus::Open,
                    summary,
                    opened_at: at,
                    updated_at: at,
                    resolved_at: None,
                    ingest_time: ingest,
                    evidence,
                    labels,
                    revision: 1,
                    acknowledged_by: None,
                    blast_radius,
                    explains,
                };
                tracing::info!(cluster, kind, target, summary = %inc.summary, "incident opened");
                self.incidents.insert(key, inc.clone());
                self.emit_incident(&inc);
            }
        }
    }

    fn resolve(&mut self, cluster: &str, kind: &str, target: &str, at: DateTime<Utc>) {
        let key = incident_key(cluster, kind, target);
        self.dirty.incidents.insert(key.clone());
        let Some(inc) = self.incidents.get_mut(&key) else {
            return;
        };
        if inc.status == IncidentStatus::Resolved || at < inc.opened_at {
            return;
        }
        inc.status = IncidentStatus::Resolved;
        inc.resolved_at = Some(at);
        inc.updated_at = at;
        inc.revision += 1;
        let inc = inc.clone();
        tracing::info!(cluster, kind, target, "incident resolved");
        self.emit_incident(&inc);
    }

    /// Whether a root incident other than `kind` is open on `cluster` (see [`crate::rules::InhibitRule`]).
    fn inhibited(&self, cluster: &str, kind: &str) -> bool {
        let roots = &self.rules.inhibit.root_kinds;
        !roots.iter().any(|r| r == kind)
            && roots.iter().any(|root| {
                let prefix = format!("{cluster}/{root}/");
                self.incidents
                    .range(prefix.clone()..)
                    .take_while(|(k, _)| k.starts_with(&prefix))
                    .any(|(_, i)| i.status != IncidentStatus::Resolved)
            })
    }

    /// Moves the incident at `key` (one that has resolved and is about to be succeeded by a new one) to its
    /// history key, so `--all` and the console keep listing it for its week.
    fn retire(&mut self, key: &str) {
        if let Some(old) = self.incidents.remove(key) {
            let to = history_key(key, &old.id);
            self.dirty.incidents.insert(key.to_string());
            self.dirty.incidents.insert(to.clone());
            self.incidents.insert(to, old);
        }
    }

    fn is_open(&self, cluster: &str, kind: &str, target: &str) -> bool {
        self.incidents
            .get(&incident_key(cluster, kind, target))
            .is_some_and(|i| i.status != IncidentStatus::Resolved)
    }

    /// Marks a cluster not seen before for its record to be written (a heartbeat, probe result or event
    /// otherwise writes only its own part).
    fn mark_if_new(&mut self, cluster: &str) {
        if !self.clusters.contains_key(cluster) {
            self.dirty.clusters.insert(cluster.to_string());
        }
    }

    /// A heartbeat.
    fn on_heartbeat(&mut self, env: &Envelope<Heartbeat>, ingest: DateTime<Utc>) {
        let cluster = env.cluster.clone();
        let rule = self.rules.heartbeat.clone();
        let skew_rule = self.rules.clock_skew.clone();
        self.mark_if_new(&cluster);
        self.dirty.beats.insert(cluster.clone());
        let c = self.clusters.entry(cluster.clone()).or_default();
        if env.seq != 0 && env.seq <= c.hb_last_seq && env.payload.started_at.timestamp() != 0 {
            // an agent restart starts a new outbox seq only with a new outbox; older seqs are late
            if c.hb_last_ingest.is_some_and(|t| ingest <= t) {
                self.stats.late_ignored += 1;
                return;
            }
        }
        c.hb_last_seq = c.hb_last_seq.max(env.seq);
        c.hb_last_ingest = Some(c.hb_last_ingest.map_or(ingest, |t| t.max(ingest)));
        c.hb_interval_s = env.payload.interval_s.max(1);
        c.hb_streak += 1;
        let offset = (env.cluster_time - ingest).num_milliseconds() as f64 / 1000.0;
        c.skew_samples.push_back(offset);
        while c.skew_samples.len() > skew_rule.window.max(1) {
            c.skew_samples.pop_front();
        }
        // cluster_time - ingest_time = skew - delay: the largest over the window is the least delayed
        let estimate = c
            .skew_samples
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let streak = c.hb_streak;
        if self.is_open(&cluster, &rule.kind, "heartbeat") && streak >= rule.resolve_after {
            self.resolve(&cluster, &rule.kind, "heartbeat", ingest);
        }
        let full = self
            .clusters
            .get(&cluster)
            .is_some_and(|c| c.skew_samples.len() >= skew_rule.window.clamp(1, 3));
        if full && estimate.abs() > skew_rule.threshold_s {
            let vars = BTreeMap::from([
                ("cluster", cluster.clone()),
                ("skew", format!("{estimate:+.0}s")),
            ]);
            let summary = render(&skew_rule.summary, &vars);
            self.raise(Raise {
                cluster: &cluster,
                kind: &skew_rule.kind,
                target: "clock",
                severity: skew_rule.severity,
                summary,
                at: ingest,
                ingest: Some(ingest),
                cause: Cause::Cluster,
            });
        } else if full
            && estimate.abs() < skew_rule.threshold_s / 2.0
            && self.is_open(&cluster, &skew_rule.kind, "clock")
        {
            self.resolve(&cluster, &skew_rule.kind, "clock", ingest);
        }
    }

    /// Time passes (the hub's clock): silent clusters become unreachable, and an event storm with no warning
    /// at all for a minute is over (a storm is otherwise judged as warnings arrive).
    fn tick(&mut self, now: DateTime<Utc>) {
        let storm = self.rules.event_storm.kind.clone();
        let mut checked = Vec::new();
        let quiet: Vec<String> = self
            .clusters
            .iter_mut()
            .filter_map(|(name, c)| match c.warnings_checked {
                Some((seen, since)) if seen == c.warnings_seen => {
                    (now - since >= Duration::minutes(1)).then(|| name.clone())
                }
                _ => {
                    c.warnings_checked = Some((c.warnings_seen, now));
                    checked.push(name.clone());
                    None
                }
            })
            .collect();
        // stored with the window, when it is next written
        for name in checked {
            self.dirty.windows.entry(name).or_insert(false);
        }
        for cluster in quiet {
            if self.is_open(&cluster, &storm, "events") {
                self.dirty.windows.insert(cluster.clone(), true);
                if let Some(c) = self.clusters.get_mut(&cluster) {
                    c.warnings.clear();
                }
                self.resolve(&cluster, &storm, "events", now);
            }
        }
        let rule = self.rules.heartbeat.clone();
        if let (Some(last), _) = self.watched
            && now > last
        {
            self.watched.1 += now - last;
        }
        self.watched.0 = Some(now);
        let watched = self.watched.1;
        let silent: Vec<(String, DateTime<Utc>)> = self
            .clusters
            .iter()
            .filter_map(|(name, c)| {
                let last = c.hb_last_ingest?;
                let limit =
                    Duration::seconds(i64::from(c.hb_interval_s.max(1)) * i64::from(rule.missed));
                (now - last > limit && watched > limit).then(|| (name.clone(), last))
            })
            .collect();
        for (cluster, last) in silent {
            if let Some(c) = self.clusters.get_mut(&cluster)
                && c.hb_streak != 0
            {
                c.hb_streak = 0;
                self.dirty.beats.insert(cluster.clone());
            }
            if self.is_open(&cluster, &rule.kind, "heartbeat") {
                continue;
            }
            let vars =
                BTreeMap::from([("cluster", cluster.clone()), ("silence", secs(now - last))]);
            let summary = render(&rule.summary, &vars);
            self.raise(Raise {
                cluster: &cluster,
                kind: &rule.kind,
                target: "heartbeat",
                severity: rule.severity,
                summary,
                at: now,
                ingest: None,
                cause: Cause::Cluster,
            });
        }
        // fleet incidents: members whose cluster went silent for good or was forgotten leave
        if self
            .fleet_swept
            .is_none_or(|t| now - t >= Duration::seconds(30) || now < t)
        {
            self.fleet_swept = Some(now);
            let view = fleet_view!(self);
            for k in self.fleet.sweep(&self.rules.fleet, view, now, watched) {
                self.emit_fleet(&k);
            }
        }
    }

    /// A probe result.
    fn on_probe(&mut self, env: &Envelope<ProbeResult>, ingest: DateTime<Utc>) {
        let cluster = env.cluster.clone();
        let p = &env.payload;
        let at = env.cluster_time;
        let rules: Vec<_> = self
            .rules
            .probes
            .iter()
            .filter(|r| r.probe == p.probe)
            .cloned()
            .collect();
        self.mark_if_new(&cluster);
        self.dirty.probes.insert((cluster.clone(), p.probe.clone()));
        let c = self.clusters.entry(cluster.clone()).or_default();
        let track = c.probes.entry(p.probe.clone()).or_default();
        if track.last_time.is_some_and(|t| at <= t) {
            self.stats.late_ignored += 1;
            return;
        }
        track.last_time = Some(at);
        track.detail = p.detail.clone();
        track.finding = p
            .findings
            .first()
            .map(|f| f.message.clone())
            .unwrap_or_default();
        if p.status != ProbeStatus::Healthy {
            track.related = p
                .findings
                .iter()
                .filter_map(|f| f.object.clone())
                .take(20)
                .collect();
        }
        track.history.push_back((at, p.observations.clone()));
        while track.history.len() > 10 {
            track.history.pop_front();
        }
        if p.status == ProbeStatus::Healthy {
            track.good += 1;
            track.failing_since = None;
        } else if p.status != ProbeStatus::Unknown {
            track.good = 0;
            track.failing_since.get_or_insert(at);
        }
        track.remember(at, p.status);
        // the release role's verdict on the policy bundles a cluster runs is part of its compliance
        let policy_changed = p.probe == crate::baseline::POLICY_PROBE && {
            let verdict = crate::baseline::PolicyVerdict {
                ok: p.status == ProbeStatus::Healthy,
                findings: p
                    .findings
                    .iter()
                    .map(|f| (f.message.clone(), f.object.clone()))
                    .collect(),
            };
            let changed = c.inventory.policy.as_ref() != Some(&verdict);
            c.inventory.policy = Some(verdict);
            changed
        };
        let mut actions = Vec::new();
        for r in &rules {
            let failing = r.on.contains(&p.status);
            let n = track.bad.entry(r.kind.clone()).or_insert(0);
            *n = if failing { *n + 1 } else { 0 };
            let n = *n;
            if failing {
                track
                    .onsets
                    .entry(r.kind.clone())
                    .or_insert(Onset { at, changes: None });
            }
            let onset = track.onsets.get(&r.kind).cloned();
            // a windowed rule counts its failing rounds among the last `within`, not in a row
            let window = (r.within > 0).then(|| track.failing_within(&r.on, r.within));
            actions.push((r.clone(), n, track.good, onset, failing, window));
        }
        let (detail, finding, since) = (
            track.detail.clone(),
            track.finding.clone(),
            track.failing_since.unwrap_or(at),
        );
        for (r, bad, good, onset, failing, window) in actions {
            let key = incident_key(&cluster, &r.kind, &p.probe);
            let last = self.incidents.get(&key);
            let open = last.is_some_and(|i| i.status != IncidentStatus::Resolved);
            let onset = match onset {
                // an incident open from before onsets were kept: its streak began before it opened
                Some(o) if open && o.changes.is_none() => Some(Onset {
                    at: last.map_or(o.at, |i| i.opened_at.min(o.at)),
                    changes: None,
                }),
                // the streak of an incident resolved since (by hand, while failing again): a new one
                Some(o) if !open && last.and_then(|i| i.resolved_at).is_some_and(|r| r >= o.at) => {
                    Some(Onset { at, changes: None })
                }
                o => o,
            };
            let held_since = |from: DateTime<Utc>| {
                Duration::from_std(r.hold).is_ok_and(|hold| at - from >= hold)
            };
            // in a row: `after` failing rounds, held since the streak began, open it; `resolve_after`
            // healthy ones resolve it. Over a window: `after` of the last `within` failing (judged on a
            // failing round: a healthy one says nothing new), held since the first of them; resolved
            // once fewer than `after` of them fail and `resolve_after` healthy rounds came in a row.
            let (opens, resolves, ended, bad, onset) = match window {
                None => (
                    bad >= r.after && held_since(since),
                    good >= r.resolve_after && open,
                    bad == 0 && !open,
                    bad,
                    onset,
                ),
                Some(failed) => {
                    // until it opens, the failing rounds of the window count — those after its
                    // incident last resolved (by hand too: a new streak) — and began with the oldest
                    let resolved = (!open).then(|| last.and_then(|i| i.resolved_at)).flatten();
                    let failed: Vec<DateTime<Utc>> = failed
                        .into_iter()
                        .filter(|t| resolved.is_none_or(|r| *t > r))
                        .collect();
                    let n = u32::try_from(failed.len()).unwrap_or(u32::MAX);
                    let onset = if open {
                        onset
                    } else {
                        failed.first().map(|&at| Onset { at, changes: None })
                    };
                    (
                        failing && n >= r.after && onset.as_ref().is_some_and(|o| held_since(o.at)),
                        n < r.after && good >= r.resolve_after && open,
                        n == 0 && !open,
                        n,
                        onset,
                    )
                }
            };
            if opens {
                // (a round older than the last is ignored above: the onset is never after `at`)
                let mut onset = onset.unwrap_or(Onset { at, changes: None });
                // the changes before it began failing, as the incident said when it opened: its summary
                // does not change with the churn that follows, nor as the history held moves on
                let changes = match &onset.changes {
                    Some(c) if open => c.clone(),
                    _ => self.changes_phrase(&cluster, onset.at),
                };
                let vars = BTreeMap::from([
                    ("cluster", cluster.clone()),
                    ("probe", p.probe.clone()),
                    ("detail", detail.clone()),
                    (
                        "finding",
                        if finding.is_empty() {
                            detail.clone()
                        } else {
                            finding.clone()
                        },
                    ),
                    ("rounds", bad.to_string()),
                    // when the streak began, as the changes count back from it
                    ("since", onset.at.format("%H:%M:%S").to_string()),
                    ("changes", changes.clone()),
                ]);
                let summary = render(&r.summary, &vars);
                self.raise(Raise {
                    cluster: &cluster,
                    kind: &r.kind,
                    target: &p.probe,
                    severity: r.severity,
                    summary,
                    at,
                    ingest: Some(ingest),
                    cause: Cause::Probe(&p.probe, onset.at, r.explains_warnings),
                });
                if self.is_open(&cluster, &r.kind, &p.probe) {
                    onset.changes = Some(changes);
                }
                self.set_onset(&cluster, &p.probe, &r.kind, Some(onset));
            } else if resolves {
                self.resolve(&cluster, &r.kind, &p.probe, at);
                self.set_onset(&cluster, &p.probe, &r.kind, None);
            } else if ended {
                // a streak that ended before its incident opened
                self.set_onset(&cluster, &p.probe, &r.kind, None);
            } else {
                self.set_onset(&cluster, &p.probe, &r.kind, onset);
            }
        }
        if policy_changed {
            self.dirty.clusters.insert(cluster.clone());
            self.judge(&cluster, at);
        }
    }

    /// Keeps when the streak of `kind` began and what its incident said had changed before (`Some`), or
    /// forgets the streak (`None`: it ended, or its incident resolved).
    fn set_onset(&mut self, cluster: &str, probe: &str, kind: &str, onset: Option<Onset>) {
        let Some(onsets) = self
            .clusters
            .get_mut(cluster)
            .and_then(|c| c.probes.get_mut(probe))
            .map(|t| &mut t.onsets)
        else {
            return;
        };
        match onset {
            Some(o) => {
                onsets.insert(kind.to_string(), o);
            }
            None => {
                onsets.remove(kind);
            }
        }
    }

    /// A Kubernetes event.
    fn on_event(&mut self, env: &Envelope<KubeEvent>) {
        self.stats.events_in += 1;
        let e = &env.payload;
        // only warnings are told, judged or evidence: lifecycle events (most of a fleet's) are not recorded
        if e.severity < Severity::Warning {
            return;
        }
        let (rec, pass) = self.dedup.observe(&env.cluster, e);
        let digest = pass.filter(|_| !self.replaying).map(|p| (rec.clone(), p));
        let window_key = format!("{}\u{0}{}", rec.reason, obj_label(&rec.object));
        if pass.is_some() {
            self.stats.events_passed += 1;
        }
        if let Some((rec, pass)) = digest {
            self.emit_digest(&rec, pass);
        }
        let rule = self.rules.event_storm.clone();
        let cluster = env.cluster.clone();
        let at = e.last_time;
        self.mark_if_new(&cluster);
        self.dirty.windows.entry(cluster.clone()).or_insert(false);
        let c = self.clusters.entry(cluster.clone()).or_default();
        c.warnings_seen += 1;
        // a cluster clock set back (a skew corrected) restarts the window; otherwise the window is kept in
        // time order, so what fell out of the last minute is at its front whatever order events come in
        if c.warnings
            .back()
            .is_some_and(|(newest, _)| at < *newest - Duration::minutes(5))
        {
            c.warnings.clear();
        }
        let pos = c.warnings.partition_point(|(t, _)| *t <= at);
        c.warnings.insert(pos, (at, window_key));
        let newest = c.warnings.back().map_or(at, |(t, _)| *t);
        while c
            .warnings
            .front()
            .is_some_and(|(t, _)| *t < newest - Duration::minutes(1))
        {
            c.warnings.pop_front();
        }
        let n = c.warnings.len() as u64;
        // the summary (the commonest reason and object of the window) is only worked out for an opening
        if n > rule.warnings_per_minute && !self.is_open(&cluster, &rule.kind, "events") {
            let c = &self.clusters[&cluster];
            let mut top: BTreeMap<&str, usize> = BTreeMap::new();
            for (_, k) in &c.warnings {
                *top.entry(k.as_str()).or_default() += 1;
            }
            let (reason, object) = top
                .iter()
                .max_by_key(|(_, n)| **n)
                .map(|(k, _)| {
                    k.split_once('\u{0}')
                        .map(|(r, o)| (r.to_string(), o.to_string()))
                        .unwrap_or_default()
                })
                .unwrap_or_default();
            let vars = BTreeMap::from([
                ("cluster", cluster.clone()),
                ("count", n.to_string()),
                ("reason", reason),
                ("object", object),
            ]);
            let summary = render(&rule.summary, &vars);
            self.raise(Raise {
                cluster: &cluster,
                kind: &rule.kind,
                target: "events",
                severity: rule.severity,
                summary,
                at,
                ingest: None,
                cause: Cause::Cluster,
            });
        } else if n <= rule.warnings_per_minute
            && n < rule.resolve_below_per_minute
            && self.is_open(&cluster, &rule.kind, "events")
        {
            self.resolve(&cluster, &rule.kind, "events", at);
        }
    }

    /// A resource state, deletion or resync marker.
    fn on_state(&mut self, env: &Envelope<StateMsg>) {
        let cluster = env.cluster.clone();
        let at = env.cluster_time;
        // most states change nothing of the cluster's record (a spec change is a record of its own): it
        // is written when the cluster is new or its inventory or compared settings change
        let mut record_changed = !self.clusters.contains_key(&cluster);
        let c = self.clusters.entry(cluster.clone()).or_default();
        let inventory_changed = match &env.payload {
            StateMsg::State(s) => {
                let key = format!(
                    "{}/{}/{}",
                    s.kind,
                    s.namespace.clone().unwrap_or_default(),
                    s.name
                );
                // a workload's compared settings and images, and how they changed
                let workload = self
                    .rules
                    .fleet
                    .consistency_workloads
                    .contains(&s.kind)
                    .then(|| {
                        let object = consistency::object_key(
                            &s.kind,
                            s.namespace.as_deref().unwrap_or(""),
                            &s.name,
                        );
                        (object, consistency::workload_settings(s))
                    });
                let specs = self.specs.entry(cluster.clone()).or_default();
                if let Some(prev) = specs.get(&key)
                    && *prev != s.spec_hash
                    && fleet::is_change_kind(&s.kind)
                {
                    // what evidence names, and three fleet lookbacks and the fleet window: how often
                    // an object changed in the two lookbacks before the one judged tells routine from
                    // a suspect, also when the fleet incident is judged again as later members join
                    // (fleet::suspects)
                    let fleet = &self.rules.fleet;
                    let window = self
                        .rules
                        .evidence
                        .change_window
                        .max(fleet.lookback * 3 + fleet.window);
                    let window = Duration::from_std(window).unwrap_or(Duration::minutes(30));
                    let held = self.workloads.get(&cluster);
                    let delta = workload.as_ref().and_then(|(object, settings)| {
                        let (id, changed) = consistency::delta(held?.get(object)?, settings)?;
                        Some(Box::new(crate::state::Delta { id, changed }))
                    });
                    c.push_change(
                        ChangeRec {
                            at,
                            object: ObjectRef {
                                api_version: s.api_version.clone(),
                                kind: s.kind.clone(),
                                namespace: s.namespace.clone(),
                                name: s.name.clone(),
                                uid: Some(s.uid.clone()),
                            },
                            from: prev.clone(),
                            to: s.spec_hash.clone(),
                            delta,
                            seq: 0,
                        },
                        window,
                    );
                    self.dirty.changes.insert(cluster.clone());
                    if self.fleet.any_open() {
                        self.fleet_late.push((cluster.clone(), at));
                    }
                }
                self.dirty.specs.insert((cluster.clone(), key.clone()));
                if specs.insert(key, s.spec_hash.clone()).is_none()
                    && fleet::is_change_kind(&s.kind)
                {
                    *self.changeable.entry(cluster.clone()).or_default() += 1;
                }
                if let Some(t) = self.rules.fleet.consistency.iter().find(|t| {
                    t.kind == s.kind
                        && t.name == s.name
                        && s.namespace.as_deref().unwrap_or("") == t.namespace
                }) {
                    let settings = consistency::settings_of(s);
                    if c.settings.get(&t.key()) != Some(&settings) {
                        c.settings.insert(t.key(), settings);
                        record_changed = true;
                    }
                }
                if let Some((object, settings)) = workload {
                    let held = self.workloads.entry(cluster.clone()).or_default();
                    if held.get(&object) != Some(&settings) {
                        self.dirty
                            .workloads
                            .insert((cluster.clone(), object.clone()));
                        held.insert(object, settings);
                    }
                }
                apply_inventory(&mut c.inventory, s)
            }
            StateMsg::Deleted(d) => {
                let key = format!(
                    "{}/{}/{}",
                    d.kind,
                    d.namespace.clone().unwrap_or_default(),
                    d.name
                );
                if let Some(specs) = self.specs.get_mut(&cluster)
                    && specs.remove(&key).is_some()
                {
                    self.dirty.specs.insert((cluster.clone(), key));
                    if fleet::is_change_kind(&d.kind)
                        && let Some(n) = self.changeable.get_mut(&cluster)
                    {
                        *n = n.saturating_sub(1);
                    }
                }
                let object =
                    consistency::object_key(&d.kind, d.namespace.as_deref().unwrap_or(""), &d.name);
                record_changed |= c.settings.remove(&object).is_some();
                if let Some(held) = self.workloads.get_mut(&cluster)
                    && held.remove(&object).is_some()
                {
                    self.dirty.workloads.insert((cluster.clone(), object));
                }
                remove_inventory(&mut c.inventory, d)
            }
            StateMsg::Resync(r) => resync_inventory(&mut c.inventory, r),
        };
        if record_changed || inventory_changed {
            self.dirty.clusters.insert(cluster.clone());
        }
        if inventory_changed {
            self.judge(&cluster, at);
        }
    }

    /// Ends [`Machine::hold_judgement`] and judges every cluster on its now complete inventory; returns
    /// what to publish.
    pub fn release_judgement(&mut self, at: DateTime<Utc>) -> Vec<Out> {
        self.holding_judgement = false;
        let clusters: Vec<String> = self.clusters.keys().cloned().collect();
        for c in clusters {
            self.judge(&c, at);
        }
        std::mem::take(&mut self.out)
    }

    /// Cluster facts.
    fn on_facts(&mut self, env: &Envelope<ClusterFacts>) {
        self.dirty.clusters.insert(env.cluster.clone());
        let c = self.clusters.entry(env.cluster.clone()).or_default();
        c.labels = env.payload.labels.clone();
        c.inventory.facts = Some(env.payload.clone());
        self.judge(&env.cluster.clone(), env.cluster_time);
    }

    /// Judges a cluster against the baseline; publishes the report when its verdict changed and raises or
    /// resolves drift incidents.
    fn judge(&mut self, cluster: &str, at: DateTime<Utc>) {
        if self.holding_judgement {
            return;
        }
        // a cluster is judged once its facts are in (they follow the agent's initial lists), so the first
        // verdict isn't made on half an inventory
        let Some(c) = self
            .clusters
            .get(cluster)
            .filter(|c| c.inventory.facts.is_some())
        else {
            return;
        };
        let report = baseline::evaluate(&self.baseline, cluster, &c.inventory, at);
        let same = c
            .compliance
            .as_ref()
            .is_some_and(|old| old.checks == report.checks);
        if same {
            return;
        }
        // each rule's verdict before this one: only passing → failing is drift
        let previous: BTreeMap<String, CheckStatus> = c
            .compliance
            .as_ref()
            .map(|r| {
                r.checks
                    .iter()
                    .map(|c| (c.rule.clone(), c.status))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(c) = self.clusters.get_mut(cluster) {
            c.compliance = Some(report.clone());
            self.dirty.clusters.insert(cluster.to_string());
        }
        self.emit_compliance(&report);
        for check in &report.checks {
            match check.status {
                CheckStatus::Fail => {
                    let drifted = previous.get(&check.rule) == Some(&CheckStatus::Pass);
                    let critical = self.baseline.critical.contains(&check.rule);
                    let covered = self.baseline.probe_covered.contains(&check.rule);
                    if covered
                        || !(drifted
                            || critical
                            || self.is_open(cluster, "baseline-drift", &check.rule))
                    {
                        // standing non-compliance, or a probe's own incident: the compliance report says it
                        continue;
                    }
                    let summary = if !critical {
                        format!(
                            "{cluster} drifted from the baseline ({}): {}",
                            check.rule, check.message
                        )
                    } else {
                        format!(
                            "{cluster} fails a critical baseline rule ({}): {}",
                            check.rule, check.message
                        )
                    };
                    self.raise(Raise {
                        cluster,
                        kind: "baseline-drift",
                        target: &check.rule,
                        severity: if critical {
                            Severity::Critical
                        } else {
                            Severity::Warning
                        },
                        summary,
                        at,
                        ingest: None,
                        cause: Cause::Check(check),
                    });
                }
                CheckStatus::Pass => self.resolve(cluster, "baseline-drift", &check.rule, at),
                _ => {}
            }
        }
    }

    /// The fleet-consistency report: where the tracked components' settings differ within a group.
    pub fn consistency(&self) -> Vec<SettingDivergence> {
        consistency::report(
            &self.clusters,
            &self.workloads,
            &self.rules.fleet.consistency,
            &self.rules.fleet.consistency_group_by,
        )
    }

    /// What `cluster` takes down if it is lost, from its last known state (`None`: a cluster this instance
    /// knows nothing of).
    pub fn blast_radius(&self, cluster: &str) -> Option<BlastRadius> {
        (self.clusters.contains_key(cluster) || self.specs.contains_key(cluster)).then(|| {
            let view = fleet_view!(self);
            blast::of(
                cluster,
                &self.specs,
                self.clusters.get(cluster),
                &view.down(),
            )
        })
    }

    /// Current fleet incidents (open and acknowledged; with `all`, resolved ones of the last week too).
    pub fn current_fleet(&self, all: bool) -> Vec<FleetIncident> {
        self.fleet.current(all)
    }

    /// Restores fleet incidents read back from FLEET_INCIDENTS after the store was wiped (the latest
    /// revision of each).
    pub fn restore_fleet(&mut self, incidents: Vec<FleetIncident>) {
        self.fleet.restore(incidents);
        self.dirty
            .fleet
            .extend(self.fleet.incidents.keys().cloned());
    }

    /// Current incidents (open and acknowledged; with `all`, resolved ones too), newest first.
    pub fn current(&self, all: bool) -> Vec<Incident> {
        let mut v: Vec<Incident> = self
            .incidents
            .values()
            .filter(|i| all || i.status != IncidentStatus::Resolved)
            .cloned()
            .collect();
        v.sort_by(|a, b| {
            b.severity
                .cmp(&a.severity)
                .then(b.updated_at.cmp(&a.updated_at))
        });
        v
    }

    /// Carries out a person's command on an incident (hub clock `now`): acknowledging sets the status and
    /// who did it; resolving by hand resolves it at `now` (a condition still failing afterwards opens a new
    /// incident). A change publishes the new revision and an [`AuditRecord`] on
    /// `fleet.audit.console.incident-<action>`; the caller commits.
    pub fn command(
        &mut self,
        cmd: &IncidentCommand,
        now: DateTime<Utc>,
    ) -> (CommandOutcome, Option<Incident>, Vec<Out>) {
        let Some((key, inc)) = self.incidents.iter_mut().find(|(_, i)| i.id == cmd.id) else {
            return (CommandOutcome::NotFound, None, Vec::new());
        };
        match (cmd.action, inc.status) {
            (IncidentAction::Ack, IncidentStatus::Resolved) => {
                return (CommandOutcome::Conflict, Some(inc.clone()), Vec::new());
            }
            (IncidentAction::Ack, IncidentStatus::Acknowledged)
            | (IncidentAction::Resolve, IncidentStatus::Resolved) => {
                return (CommandOutcome::Unchanged, Some(inc.clone()), Vec::new());
            }
            (IncidentAction::Ack, _) => {
                // updated_at stays in the cluster's clock: the acknowledgement's time is in the audit record
                inc.status = IncidentStatus::Acknowledged;
                inc.acknowledged_by = Some(cmd.actor.clone());
            }
            (IncidentAction::Resolve, _) => {
                let at = now.max(inc.updated_at);
                inc.status = IncidentStatus::Resolved;
                inc.resolved_at = Some(at);
                inc.updated_at = at;
            }
        }
        inc.revision += 1;
        let inc = inc.clone();
        self.dirty.incidents.insert(key.clone());
        tracing::info!(id = %inc.id, cluster = %inc.cluster, kind = %inc.kind, action = cmd.action.name(), actor = %cmd.actor, "incident changed by hand");
        self.emit_incident(&inc);
        let record = AuditRecord {
            id: stable_id(&["audit", &inc.id, &inc.revision.to_string()]),
            actor: cmd.actor.clone(),
            role: "console".into(),
            action: match cmd.action {
                IncidentAction::Ack => "incident.acknowledge".into(),
                IncidentAction::Resolve => "incident.resolve".into(),
            },
            target: inc.id.clone(),
            outcome: AuditOutcome::Ok,
            detail: serde_json::json!({
                "cluster": inc.cluster,
                "kind": inc.kind,
                "revision": inc.revision,
                "summary": inc.summary,
                "recorded_by": self.source,
            }),
            commit: None,
        };
        let env = Envelope::new(
            inc.cluster.as_str(),
            self.source.as_str(),
            now,
            inc.revision,
            record,
        );
        match multipilot_schemas::encode(&env) {
            Ok(body) => self.out.push(Out {
                subject: subject::audit("console", &format!("incident-{}", cmd.action.name())),
                msg_id: env.payload.id.clone(),
                schema: <AuditRecord as multipilot_schemas::Payload>::schema_header(),
                body,
            }),
            Err(e) => tracing::error!(error = %e, "cannot encode an audit record"),
        }
        (
            CommandOutcome::Done,
            Some(inc),
            std::mem::take(&mut self.out),
        )
    }

    /// Current compliance reports.
    pub fn compliance(&self) -> Vec<ComplianceReport> {
        self.clusters
            .values()
            .filter_map(|c| c.compliance.clone())
            .collect()
    }

    /// Expires old dedup records.
    fn housekeeping(&mut self, now: DateTime<Utc>) {
        self.dedup.expire(now - Duration::days(7));
        // resolved incidents are kept a week for the console
        let dirty = &mut self.dirty.incidents;
        self.incidents.retain(|k, i| {
            let keep =
                i.status != IncidentStatus::Resolved || i.updated_at > now - Duration::days(7);
            if !keep {
                dirty.insert(k.clone());
            }
            keep
        });
        let gone = self.fleet.expire(now - Duration::days(7));
        self.dirty.fleet.extend(gone);
    }
}

fn apply_inventory(inv: &mut Inventory, s: &ResourceState) -> bool {
    match s.kind.as_str() {
        "Namespace" => {
            let level = s.labels.get("pod-security.kubernetes.io/enforce").cloned();
            inv.namespaces.insert(s.name.clone(), level.clone()) != Some(level)
        }
        "Service" => {
            let key = format!("{}/{}", s.namespace.clone().unwrap_or_default(), s.name);
            let ips: Vec<String> = s
                .status
                .detail
                .get("externalIPs")
                .map(|v| {
                    v.split(',')
                        .filter(|x| !x.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            if ips.is_empty() {
                inv.external_ips.remove(&key).is_some()
            } else {
                inv.external_ips.insert(key, ips.clone()) != Some(ips)
            }
        }
        _ => false,
    }
}

fn remove_inventory(inv: &mut Inventory, d: &ResourceDeleted) -> bool {
    match d.kind.as_str() {
        "Namespace" => inv.namespaces.remove(&d.name).is_some(),
        "Service" => inv
            .external_ips
            .remove(&format!(
                "{}/{}",
                d.namespace.clone().unwrap_or_default(),
                d.name
            ))
            .is_some(),
        _ => false,
    }
}

fn resync_inventory(inv: &mut Inventory, r: &ResyncMarker) -> bool {
    if r.parts > 1 {
        return false; // a multi-part marker is judged by its deletions instead
    }
    let present: std::collections::BTreeSet<String> = r
        .present
        .iter()
        .map(|k| match &k.namespace {
            Some(ns) => format!("{ns}/{}", k.name),
            None => k.name.clone(),
        })
        .collect();
    match r.kind.as_str() {
        "Namespace" => {
            let before = inv.namespaces.len();
            inv.namespaces.retain(|n, _| present.contains(n));
            before != inv.namespaces.len()
        }
        "Service" => {
            let before = inv.external_ips.len();
            inv.external_ips.retain(|k, _| present.contains(k));
            before != inv.external_ips.len()
        }
        _ => false,
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
