//! The correlation engine: a deterministic state machine from messages (heartbeats, probe results,
//! events, states, facts) to incidents and compliance reports. Its state and its not-yet-published outputs
//! are persisted together, with a per-consumer high-water mark, so a restart neither loses nor repeats
//! anything: replayed messages at or below the mark are skipped, outputs are re-published with the same
//! Msg-Ids (JetStream drops the repeats).

use std::collections::{BTreeMap, VecDeque};

use chrono::{DateTime, Duration, Utc};
use multipilot_schemas::payload::{
    AuditRecord, CheckStatus, ClusterFacts, ComplianceReport, EventDigest, Evidence, Heartbeat,
    Incident, IncidentStatus, KubeEvent, ObjectRef, ProbeResult, ProbeStatus, ResourceDeleted,
    ResourceState, ResyncMarker, Severity,
};
use multipilot_schemas::{Envelope, stable_id, subject};
use serde::{Deserialize, Serialize};

use crate::baseline::{self, Baseline, Inventory};
use crate::dedup::{Dedup, Pass};
use crate::rules::{Rules, render};

/// A change seen on a cluster (evidence for incidents that follow it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeRec {
    /// When (cluster clock).
    pub at: DateTime<Utc>,
    /// Object.
    pub object: ObjectRef,
    /// Previous spec hash.
    pub from: String,
    /// New spec hash.
    pub to: String,
}

/// What the engine tracks of one probe on one cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeTrack {
    /// cluster_time of the latest result applied.
    pub last_time: Option<DateTime<Utc>>,
    /// Failing rounds in a row, per rule kind.
    pub bad: BTreeMap<String, u32>,
    /// Healthy rounds in a row.
    pub good: u32,
    /// When the current failing streak began.
    pub failing_since: Option<DateTime<Utc>>,
    /// Latest detail.
    pub detail: String,
    /// Latest first finding.
    pub finding: String,
    /// Objects the latest findings name (changes to them are the most relevant evidence).
    #[serde(default)]
    pub related: Vec<ObjectRef>,
    /// Recent observations (oldest first), for trends.
    pub history: VecDeque<(DateTime<Utc>, BTreeMap<String, f64>)>,
}

/// What the engine tracks of one cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    /// Registry labels (from facts).
    pub labels: BTreeMap<String, String>,
    /// ingest_time of the latest heartbeat.
    pub hb_last_ingest: Option<DateTime<Utc>>,
    /// Heartbeat interval the agent announced.
    pub hb_interval_s: u32,
    /// Heartbeats in a row since the last silence.
    pub hb_streak: u32,
    /// Highest heartbeat seq applied.
    pub hb_last_seq: u64,
    /// (cluster_time - ingest_time) of recent heartbeats, seconds.
    pub skew_samples: VecDeque<f64>,
    /// Probes.
    pub probes: BTreeMap<String, ProbeTrack>,
    /// Recent spec changes.
    pub changes: VecDeque<ChangeRec>,
    /// Spec hash per `kind/ns/name`.
    pub spec_hashes: BTreeMap<String, String>,
    /// What the baseline is judged on.
    pub inventory: Inventory,
    /// Latest compliance report.
    pub compliance: Option<ComplianceReport>,
    /// Warning events of the last minute (cluster time), with `reason object`.
    pub warnings: VecDeque<(DateTime<Utc>, String)>,
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
}

/// The engine.
#[derive(Debug)]
pub struct Engine {
    rules: Rules,
    baseline: Baseline,
    source: String,
    /// Per-cluster state.
    pub clusters: BTreeMap<String, ClusterState>,
    /// Incidents by key (`cluster/kind/target`): the current one of each condition.
    pub incidents: BTreeMap<String, Incident>,
    /// Outputs not yet confirmed by JetStream.
    pub out: Vec<Out>,
    /// High-water mark per consumer (stream sequence).
    pub hwm: BTreeMap<String, u64>,
    dedup: Dedup,
    db: sled::Db,
    /// Counters.
    pub stats: Stats,
    /// Apply events without publishing digests (a rebuild replaying history already digested).
    pub quiet_digests: bool,
    /// While a wiped store replays FLEET_STATE and FLEET_FACTS, the baseline is not judged: a half-replayed
    /// inventory would pass checks it fails (and resolve drift that is still there). Released by
    /// [`Engine::release_judgement`] once the replay has caught up.
    pub hold_judgement: bool,
}

/// Storage errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// sled failed.
    #[error("correlator store: {0}")]
    Sled(#[from] sled::Error),
    /// Dedup store failed.
    #[error(transparent)]
    Dedup(#[from] crate::dedup::Error),
}

const T_CLUSTERS: &str = "clusters";
const T_INCIDENTS: &str = "incidents";
const T_META: &str = "meta";
/// Key in `meta` written once the store was set up (its absence on an empty store: new or wiped).
const MARKER: &str = "initialized";

fn secs(d: Duration) -> String {
    let s = d.num_seconds().max(0);
    if s < 120 {
        format!("{s}s")
    } else if s < 7200 {
        format!("{}m", s / 60)
    } else {
        format!("{}h{}m", s / 3600, (s % 3600) / 60)
    }
}

fn obj_label(o: &ObjectRef) -> String {
    match &o.namespace {
        Some(ns) => format!("{} {ns}/{}", o.kind, o.name),
        None => format!("{} {}", o.kind, o.name),
    }
}

impl Engine {
    /// Opens the engine's state in `db`.
    pub fn open(
        db: sled::Db,
        rules: Rules,
        baseline: Baseline,
        source: &str,
    ) -> Result<Self, Error> {
        let mut clusters = BTreeMap::new();
        for item in db.open_tree(T_CLUSTERS)?.iter() {
            let (k, v) = item?;
            if let Ok(c) = serde_json::from_slice::<ClusterState>(&v) {
                clusters.insert(String::from_utf8_lossy(&k).into_owned(), c);
            }
        }
        let mut incidents = BTreeMap::new();
        for item in db.open_tree(T_INCIDENTS)?.iter() {
            let (k, v) = item?;
            if let Ok(i) = serde_json::from_slice::<Incident>(&v) {
                incidents.insert(String::from_utf8_lossy(&k).into_owned(), i);
            }
        }
        let meta = db.open_tree(T_META)?;
        let out = meta
            .get("out")?
            .and_then(|v| serde_json::from_slice(&v).ok())
            .unwrap_or_default();
        let hwm = meta
            .get("hwm")?
            .and_then(|v| serde_json::from_slice(&v).ok())
            .unwrap_or_default();
        Ok(Engine {
            dedup: Dedup::new(db.open_tree("dedup")?),
            rules,
            baseline,
            source: source.to_string(),
            clusters,
            incidents,
            out,
            hwm,
            db,
            stats: Stats::default(),
            quiet_digests: false,
            hold_judgement: false,
        })
    }

    /// Whether the store is new or wiped: never marked initialized and holding nothing.
    pub fn is_fresh(&self) -> Result<bool, Error> {
        let meta = self.db.open_tree(T_META)?;
        Ok(!meta.contains_key(MARKER)?
            && self.clusters.is_empty()
            && self.incidents.is_empty()
            && self.hwm.is_empty()
            && self.out.is_empty())
    }

    /// Persists everything and marks the store initialized (see [`Engine::is_fresh`]).
    pub async fn mark_initialized(&self) -> Result<(), Error> {
        self.db.open_tree(T_META)?.insert(MARKER, &[1u8])?;
        self.persist().await
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
                .map(|t| format!("{}/{}/{t}", inc.cluster, inc.kind))
                .unwrap_or_else(|| {
                    tracing::warn!(id = %inc.id, kind = %inc.kind, "restored incident matches no rule target; kept under its id");
                    format!("{}/{}/#{}", inc.cluster, inc.kind, inc.id)
                });
            let newer = self
                .incidents
                .get(&key)
                .is_none_or(|cur| (cur.opened_at, cur.revision) <= (inc.opened_at, inc.revision));
            if newer {
                self.incidents.insert(key, inc);
                restored += 1;
            }
        }
        restored
    }

    /// Persists everything (state, incidents, pending outputs, high-water marks) and flushes.
    pub async fn persist(&self) -> Result<(), Error> {
        let ct = self.db.open_tree(T_CLUSTERS)?;
        for (k, c) in &self.clusters {
            ct.insert(k.as_bytes(), serde_json::to_vec(c).unwrap_or_default())?;
        }
        let it = self.db.open_tree(T_INCIDENTS)?;
        for (k, i) in &self.incidents {
            it.insert(k.as_bytes(), serde_json::to_vec(i).unwrap_or_default())?;
        }
        let meta = self.db.open_tree(T_META)?;
        meta.insert("out", serde_json::to_vec(&self.out).unwrap_or_default())?;
        meta.insert("hwm", serde_json::to_vec(&self.hwm).unwrap_or_default())?;
        self.db.flush_async().await?;
        Ok(())
    }

    /// Forgets outputs JetStream confirmed.
    pub fn confirmed(&mut self, msg_ids: &[String]) {
        self.out.retain(|o| !msg_ids.contains(&o.msg_id));
    }

    /// Whether a message of `consumer` at `stream_seq` was applied already; marks it applied otherwise.
    pub fn replayed(&mut self, consumer: &str, stream_seq: u64) -> bool {
        let hwm = self.hwm.entry(consumer.to_string()).or_insert(0);
        if stream_seq <= *hwm {
            self.stats.replays_skipped += 1;
            return true;
        }
        *hwm = stream_seq;
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
    }

    /// Passes a deduplicated event problem on (`fleet.digest.<cluster>.<kind>`): the alert router and other
    /// teams read these instead of every repeat.
    fn emit_digest(&mut self, rec: &crate::dedup::Record, pass: crate::dedup::Pass) {
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
            pass: match pass {
                crate::dedup::Pass::New => "new",
                crate::dedup::Pass::Severity => "severity",
                crate::dedup::Pass::Milestone(_) => "milestone",
            }
            .into(),
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

    fn evidence(&self, cluster: &str, probe: Option<&str>, at: DateTime<Utc>) -> Vec<Evidence> {
        let window =
            Duration::from_std(self.rules.evidence.change_window).unwrap_or(Duration::minutes(30));
        let mut scored: Vec<(f64, Evidence)> = Vec::new();
        if let Some(c) = self.clusters.get(cluster) {
            let related: Vec<ObjectRef> = probe
                .and_then(|p| c.probes.get(p))
                .map(|t| t.related.clone())
                .unwrap_or_default();
            for ch in c
                .changes
                .iter()
                .filter(|ch| ch.at <= at && ch.at >= at - window)
            {
                let age = (at - ch.at).num_seconds().max(0) as f64;
                // recency, then relevance: the object a finding names, one named like the probe, its namespace
                // an unrelated change ranks below the probe's own trend and related events
                let mut score = 1.0 - age / window.num_seconds().max(1) as f64;
                let same = |o: &ObjectRef| {
                    o.kind == ch.object.kind
                        && o.namespace == ch.object.namespace
                        && o.name == ch.object.name
                };
                if related.iter().any(same) {
                    score += 5.0;
                } else if probe.is_some_and(|p| ch.object.name.contains(p)) {
                    score += 4.0;
                } else if related
                    .iter()
                    .any(|o| o.namespace.is_some() && o.namespace == ch.object.namespace)
                {
                    score += 2.0;
                }
                scored.push((
                    score,
                    Evidence {
                        rank: 0,
                        kind: "change".into(),
                        summary: format!(
                            "{} changed (spec {} → {}) {} before",
                            obj_label(&ch.object),
                            &ch.from[..ch.from.len().min(8)],
                            &ch.to[..ch.to.len().min(8)],
                            secs(at - ch.at)
                        ),
                        cluster_time: ch.at,
                        object: Some(ch.object.clone()),
                    },
                ));
            }
            if let Some(track) = probe.and_then(|p| c.probes.get(p))
                && let (Some((t0, first)), Some((t1, last))) =
                    (track.history.front(), track.history.back())
                // the observation that moved the most (relative to its size) is the one worth showing:
                // an overload's latency, not the clock skew that happens to sort first
                && let Some((k, v1)) = last
                    .iter()
                    .filter(|(k, v)| first.contains_key(*k) && v.is_finite())
                    .max_by(|(ka, va), (kb, vb)| {
                        let moved = |k: &String, v: f64| {
                            let v0 = first[k];
                            (v - v0).abs() / v0.abs().max(v.abs()).max(1e-9)
                        };
                        moved(ka, **va).total_cmp(&moved(kb, **vb))
                    })
            {
                {
                    let v0 = first[k];
                    scored.push((
                        2.5,
                        Evidence {
                            rank: 0,
                            kind: "trend".into(),
                            summary: format!(
                                "{} {k}: {v0:.1} → {v1:.1} over {} rounds ({})",
                                probe.unwrap_or(""),
                                track.history.len(),
                                secs(*t1 - *t0)
                            ),
                            cluster_time: *t1,
                            object: None,
                        },
                    ));
                }
            }
        }
        for r in self.dedup.recent(cluster, at - window, 3) {
            let sev = match r.severity {
                Severity::Critical => 0.6,
                Severity::Warning => 0.4,
                Severity::Info => 0.0,
            };
            scored.push((
                1.5 + sev,
                Evidence {
                    rank: 0,
                    kind: "event".into(),
                    summary: format!(
                        "{} ×{} on {}: {}",
                        r.reason,
                        r.count,
                        obj_label(&r.object),
                        r.last_message.chars().take(120).collect::<String>()
                    ),
                    cluster_time: r.last_seen,
                    object: Some(r.object.clone()),
                },
            ));
        }
        scored.sort_by(|a, b| {
            b.0.total_cmp(&a.0)
                .then(b.1.cluster_time.cmp(&a.1.cluster_time))
        });
        scored
            .into_iter()
            .take(self.rules.evidence.max_items)
            .enumerate()
            .map(|(i, (_, mut e))| {
                e.rank = i as u32 + 1;
                e
            })
            .collect()
    }

    fn changes_phrase(&self, cluster: &str, at: DateTime<Utc>) -> String {
        let window =
            Duration::from_std(self.rules.evidence.change_window).unwrap_or(Duration::minutes(30));
        let Some(c) = self.clusters.get(cluster) else {
            return String::new();
        };
        let recent: Vec<&ChangeRec> = c
            .changes
            .iter()
            .filter(|ch| ch.at <= at && ch.at >= at - window)
            .filter(|ch| {
                matches!(
                    ch.object.kind.as_str(),
                    "Deployment" | "DaemonSet" | "StatefulSet" | "CronJob"
                )
            })
            .collect();
        if recent.is_empty() {
            return String::new();
        }
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for ch in &recent {
            *kinds.entry(ch.object.kind.as_str()).or_default() += 1;
        }
        let what = kinds
            .iter()
            .map(|(k, n)| format!("{n} {}{}", k.to_lowercase(), if *n == 1 { "" } else { "s" }))
            .collect::<Vec<_>>()
            .join(", ");
        let earliest = recent.iter().map(|c| c.at).min().unwrap_or(at);
        format!(
            "; {what} changed there in the {} before",
            secs(at - earliest)
        )
    }

    /// Opens the incident for `(cluster, kind, target)` or updates the open one.
    #[allow(clippy::too_many_arguments)]
    fn raise(
        &mut self,
        cluster: &str,
        kind: &str,
        target: &str,
        severity: Severity,
        summary: String,
        at: DateTime<Utc>,
        ingest: Option<DateTime<Utc>>,
        probe: Option<&str>,
    ) {
        let key = format!("{cluster}/{kind}/{target}");
        let evidence = self.evidence(cluster, probe, at);
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
                // an open incident is updated when what a person reads changes, at most once a minute
                let material = inc.severity != severity
                    || (inc.summary != summary && at - inc.updated_at >= Duration::seconds(60));
                if !material || at < inc.updated_at {
                    return;
                }
                inc.severity = severity;
                inc.summary = summary;
                inc.evidence = evidence;
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
                };
                tracing::info!(cluster, kind, target, summary = %inc.summary, "incident opened");
                self.incidents.insert(key, inc.clone());
                self.emit_incident(&inc);
            }
        }
    }

    fn resolve(&mut self, cluster: &str, kind: &str, target: &str, at: DateTime<Utc>) {
        let key = format!("{cluster}/{kind}/{target}");
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

    fn is_open(&self, cluster: &str, kind: &str, target: &str) -> bool {
        self.incidents
            .get(&format!("{cluster}/{kind}/{target}"))
            .is_some_and(|i| i.status != IncidentStatus::Resolved)
    }

    /// A heartbeat.
    pub fn on_heartbeat(&mut self, env: &Envelope<Heartbeat>, ingest: DateTime<Utc>) {
        let cluster = env.cluster.clone();
        let rule = self.rules.heartbeat.clone();
        let skew_rule = self.rules.clock_skew.clone();
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
            self.raise(
                &cluster,
                &skew_rule.kind,
                "clock",
                skew_rule.severity,
                summary,
                ingest,
                Some(ingest),
                None,
            );
        } else if full
            && estimate.abs() < skew_rule.threshold_s / 2.0
            && self.is_open(&cluster, &skew_rule.kind, "clock")
        {
            self.resolve(&cluster, &skew_rule.kind, "clock", ingest);
        }
    }

    /// Time passes (the hub's clock): silent clusters become unreachable.
    pub fn tick(&mut self, now: DateTime<Utc>) {
        let rule = self.rules.heartbeat.clone();
        let silent: Vec<(String, DateTime<Utc>)> = self
            .clusters
            .iter()
            .filter_map(|(name, c)| {
                let last = c.hb_last_ingest?;
                let limit =
                    Duration::seconds(i64::from(c.hb_interval_s.max(1)) * i64::from(rule.missed));
                (now - last > limit).then(|| (name.clone(), last))
            })
            .collect();
        for (cluster, last) in silent {
            if let Some(c) = self.clusters.get_mut(&cluster) {
                c.hb_streak = 0;
            }
            if self.is_open(&cluster, &rule.kind, "heartbeat") {
                continue;
            }
            let vars =
                BTreeMap::from([("cluster", cluster.clone()), ("silence", secs(now - last))]);
            let summary = render(&rule.summary, &vars);
            self.raise(
                &cluster,
                &rule.kind,
                "heartbeat",
                rule.severity,
                summary,
                now,
                None,
                None,
            );
        }
    }

    /// A probe result.
    pub fn on_probe(&mut self, env: &Envelope<ProbeResult>, ingest: DateTime<Utc>) {
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
        let mut actions = Vec::new();
        for r in &rules {
            let failing = r.on.contains(&p.status);
            let n = track.bad.entry(r.kind.clone()).or_insert(0);
            *n = if failing { *n + 1 } else { 0 };
            actions.push((r.clone(), *n, track.good));
        }
        let (detail, finding, since) = (
            track.detail.clone(),
            track.finding.clone(),
            track.failing_since.unwrap_or(at),
        );
        for (r, bad, good) in actions {
            if bad >= r.after {
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
                    ("since", since.format("%H:%M:%S").to_string()),
                    ("changes", self.changes_phrase(&cluster, at)),
                ]);
                let summary = render(&r.summary, &vars);
                self.raise(
                    &cluster,
                    &r.kind,
                    &p.probe,
                    r.severity,
                    summary,
                    at,
                    Some(ingest),
                    Some(&p.probe),
                );
            } else if good >= r.resolve_after && self.is_open(&cluster, &r.kind, &p.probe) {
                self.resolve(&cluster, &r.kind, &p.probe, at);
            }
        }
    }

    /// A Kubernetes event.
    pub fn on_event(&mut self, env: &Envelope<KubeEvent>) -> Result<(), Error> {
        self.stats.events_in += 1;
        let e = &env.payload;
        let (rec, pass) = self.dedup.observe(&env.cluster, e)?;
        if let Some(pass) = pass {
            self.stats.events_passed += 1;
            if e.severity >= Severity::Warning && !self.quiet_digests {
                self.emit_digest(&rec, pass);
            }
        }
        if e.severity < Severity::Warning {
            return Ok(());
        }
        let rule = self.rules.event_storm.clone();
        let cluster = env.cluster.clone();
        let at = e.last_time;
        let c = self.clusters.entry(cluster.clone()).or_default();
        c.warnings
            .push_back((at, format!("{}\u{0}{}", rec.reason, obj_label(&rec.object))));
        let newest = c.warnings.iter().map(|(t, _)| *t).max().unwrap_or(at);
        while c
            .warnings
            .front()
            .is_some_and(|(t, _)| *t < newest - Duration::minutes(1))
        {
            c.warnings.pop_front();
        }
        let n = c.warnings.len() as u64;
        if n > rule.warnings_per_minute {
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
            if !self.is_open(&cluster, &rule.kind, "events") {
                self.raise(
                    &cluster,
                    &rule.kind,
                    "events",
                    rule.severity,
                    summary,
                    at,
                    None,
                    None,
                );
            }
        } else if n < rule.resolve_below_per_minute && self.is_open(&cluster, &rule.kind, "events")
        {
            self.resolve(&cluster, &rule.kind, "events", at);
        }
        let _ = Pass::New;
        Ok(())
    }

    /// A resource state, deletion or resync marker.
    pub fn on_state(&mut self, env: &Envelope<crate::StateMsg>) {
        let cluster = env.cluster.clone();
        let at = env.cluster_time;
        let c = self.clusters.entry(cluster.clone()).or_default();
        let inventory_changed = match &env.payload {
            crate::StateMsg::State(s) => {
                let key = format!(
                    "{}/{}/{}",
                    s.kind,
                    s.namespace.clone().unwrap_or_default(),
                    s.name
                );
                if let Some(prev) = c.spec_hashes.get(&key)
                    && *prev != s.spec_hash
                    && s.kind != "Pod"
                    && s.kind != "ReplicaSet"
                    && s.kind != "Secret"
                    && s.kind != "EndpointSlice"
                {
                    c.changes.push_back(ChangeRec {
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
                    });
                    let window = Duration::from_std(self.rules.evidence.change_window)
                        .unwrap_or(Duration::minutes(30));
                    let newest = c.changes.back().map(|ch| ch.at).unwrap_or(at);
                    while c.changes.front().is_some_and(|ch| ch.at < newest - window)
                        || c.changes.len() > 500
                    {
                        c.changes.pop_front();
                    }
                }
                c.spec_hashes.insert(key, s.spec_hash.clone());
                apply_inventory(&mut c.inventory, s)
            }
            crate::StateMsg::Deleted(d) => {
                c.spec_hashes.remove(&format!(
                    "{}/{}/{}",
                    d.kind,
                    d.namespace.clone().unwrap_or_default(),
                    d.name
                ));
                remove_inventory(&mut c.inventory, d)
            }
            crate::StateMsg::Resync(r) => resync_inventory(&mut c.inventory, r),
        };
        if inventory_changed {
            self.judge(&cluster, at);
        }
    }

    /// Ends [`Engine::hold_judgement`] and judges every cluster on its now complete inventory.
    pub fn release_judgement(&mut self, at: DateTime<Utc>) {
        self.hold_judgement = false;
        let clusters: Vec<String> = self.clusters.keys().cloned().collect();
        for c in clusters {
            self.judge(&c, at);
        }
    }

    /// Cluster facts.
    pub fn on_facts(&mut self, env: &Envelope<ClusterFacts>) {
        let c = self.clusters.entry(env.cluster.clone()).or_default();
        c.labels = env.payload.labels.clone();
        c.inventory.facts = Some(env.payload.clone());
        self.judge(&env.cluster.clone(), env.cluster_time);
    }

    /// Judges a cluster against the baseline; publishes the report when its verdict changed and raises or
    /// resolves drift incidents.
    fn judge(&mut self, cluster: &str, at: DateTime<Utc>) {
        if self.hold_judgement {
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
        let previous: Vec<String> = c
            .compliance
            .as_ref()
            .map(|r| {
                r.checks
                    .iter()
                    .filter(|c| c.status == CheckStatus::Fail)
                    .map(|c| c.rule.clone())
                    .collect()
            })
            .unwrap_or_default();
        if let Some(c) = self.clusters.get_mut(cluster) {
            c.compliance = Some(report.clone());
        }
        self.emit_compliance(&report);
        for check in &report.checks {
            match check.status {
                CheckStatus::Fail => {
                    let summary = format!(
                        "{cluster} drifts from the baseline ({}): {}",
                        check.rule, check.message
                    );
                    self.raise(
                        cluster,
                        "baseline-drift",
                        &check.rule,
                        Severity::Warning,
                        summary,
                        at,
                        None,
                        None,
                    );
                }
                CheckStatus::Pass if previous.contains(&check.rule) => {
                    self.resolve(cluster, "baseline-drift", &check.rule, at)
                }
                _ => {}
            }
        }
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
        cmd: &crate::IncidentCommand,
        now: DateTime<Utc>,
    ) -> (crate::CommandOutcome, Option<Incident>) {
        use crate::{CommandOutcome, IncidentAction};
        let Some(inc) = self.incidents.values_mut().find(|i| i.id == cmd.id) else {
            return (CommandOutcome::NotFound, None);
        };
        match (cmd.action, inc.status) {
            (IncidentAction::Ack, IncidentStatus::Resolved) => {
                return (CommandOutcome::Conflict, Some(inc.clone()));
            }
            (IncidentAction::Ack, IncidentStatus::Acknowledged)
            | (IncidentAction::Resolve, IncidentStatus::Resolved) => {
                return (CommandOutcome::Unchanged, Some(inc.clone()));
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
            outcome: "ok".into(),
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
        (CommandOutcome::Done, Some(inc))
    }

    /// Current compliance reports.
    pub fn compliance(&self) -> Vec<ComplianceReport> {
        self.clusters
            .values()
            .filter_map(|c| c.compliance.clone())
            .collect()
    }

    /// Expires old dedup records.
    pub fn housekeeping(&mut self, now: DateTime<Utc>) {
        if let Err(e) = self.dedup.expire(now - Duration::days(7)) {
            tracing::warn!(error = %e, "dedup expiry failed");
        }
        // resolved incidents are kept a week for the console
        self.incidents.retain(|_, i| {
            i.status != IncidentStatus::Resolved || i.updated_at > now - Duration::days(7)
        });
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
