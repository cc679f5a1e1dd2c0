//! What the correlator knows of each cluster: heartbeats, probe streaks, recent changes, the inventory the
//! baseline is judged on, recent warning events. Plain data, persisted as JSON per cluster.

use std::collections::{BTreeMap, VecDeque};

use chrono::{DateTime, Utc};
use multipilot_schemas::payload::{ComplianceReport, ObjectRef};
use serde::{Deserialize, Serialize};

use crate::baseline::Inventory;

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
    /// Spec hash per `kind/ns/name`: read only from a store written before the machine kept them per object
    /// (the store moves them when it opens one), never written.
    #[serde(default, skip_serializing)]
    pub spec_hashes: BTreeMap<String, String>,
    /// What the baseline is judged on.
    pub inventory: Inventory,
    /// Latest compliance report.
    pub compliance: Option<ComplianceReport>,
    /// Warning events of the last minute (cluster time, in time order), with `reason object`.
    pub warnings: VecDeque<(DateTime<Utc>, String)>,
    /// Warning events seen so far.
    #[serde(default)]
    pub warnings_seen: u64,
    /// `warnings_seen` as of the hub time it last changed (a storm without warnings for a minute is over).
    #[serde(default)]
    pub warnings_checked: Option<(u64, DateTime<Utc>)>,
}
