//! What the correlator knows of each cluster: heartbeats, probe streaks, recent changes, the inventory the
//! baseline is judged on, recent warning events. Plain data, persisted per cluster
//! (MessagePack), with what changes often (heartbeats, probes, changes, the storm window) in records of its own.

use std::collections::{BTreeMap, VecDeque};

use chrono::{DateTime, Utc};
use multipilot_schemas::payload::{ComplianceReport, ObjectRef, ProbeStatus};
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
    /// For a workload whose compared settings or images changed, what changed; None for a restart
    /// (settings unchanged), another kind, or a workload seen for the first time. (Boxed: most changes have
    /// none, and a cluster holds hundreds.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<Box<Delta>>,
    /// Its place in its cluster's changes ([`ClusterState::changes_next`]); the store keeps it in the
    /// record's key.
    #[serde(skip)]
    pub seq: u64,
}

/// What a workload's change changed ([`crate::consistency::delta`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// A fingerprint of each setting's new value, or its removal: the same rollout on several clusters
    /// has the same one, whatever else differs there.
    pub id: u64,
    /// The names of the settings it changed, as [`crate::consistency::workload_settings`] keys them.
    pub changed: Vec<String>,
}

/// The store key of `cluster`'s change numbered `seq` (sorting in `seq` order).
pub fn change_key(cluster: &str, seq: u64) -> String {
    format!("{cluster}/{seq:016x}")
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
    /// Per rule kind, when its failing streak began: kept while the streak or its incident lasts (a healthy
    /// round between failing ones doesn't move it), so what changed afterwards is no evidence.
    #[serde(default)]
    pub onsets: BTreeMap<String, Onset>,
    /// The latest rounds, when and what (oldest first, at most [`ProbeTrack::MAX_ROUNDS`]; rounds that
    /// could not tell, `unknown`, left out), for rules judged over a window (`within`).
    #[serde(default)]
    pub rounds: VecDeque<(DateTime<Utc>, ProbeStatus)>,
}

impl ProbeTrack {
    /// The most rounds kept in [`ProbeTrack::rounds`].
    pub const MAX_ROUNDS: usize = 60;

    /// Takes in a round's status.
    pub fn remember(&mut self, at: DateTime<Utc>, status: ProbeStatus) {
        if status == ProbeStatus::Unknown {
            return;
        }
        self.rounds.push_back((at, status));
        while self.rounds.len() > Self::MAX_ROUNDS {
            self.rounds.pop_front();
        }
    }

    /// When the rounds among the last `within` had a status in `on` (oldest first).
    pub fn failing_within(&self, on: &[ProbeStatus], within: u32) -> Vec<DateTime<Utc>> {
        let from = self.rounds.len().saturating_sub(within as usize);
        self.rounds
            .range(from..)
            .filter(|(_, s)| on.contains(s))
            .map(|(at, _)| *at)
            .collect()
    }
}

/// When a rule's failing streak began, and what its incident said had changed before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Onset {
    /// The first failing round (cluster clock).
    pub at: DateTime<Utc>,
    /// The incident's `{changes}` as it opened: kept, so its summary does not change as the cluster's
    /// change history moves on.
    #[serde(default)]
    pub changes: Option<String>,
}

/// A cluster's heartbeat fields, as the store keeps them (apart from the rest of its state).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Beat {
    /// [`ClusterState::hb_last_ingest`].
    pub last_ingest: Option<DateTime<Utc>>,
    /// [`ClusterState::hb_interval_s`].
    pub interval_s: u32,
    /// [`ClusterState::hb_streak`].
    pub streak: u32,
    /// [`ClusterState::hb_last_seq`].
    pub last_seq: u64,
    /// [`ClusterState::skew_samples`].
    pub skew_samples: VecDeque<f64>,
}

/// The store key of `cluster`'s probe `probe`.
pub fn probe_key(cluster: &str, probe: &str) -> String {
    format!("{cluster}/{probe}")
}

/// What the engine tracks of one cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    /// Registry labels (from facts).
    pub labels: BTreeMap<String, String>,
    // The heartbeat's fields and the probes change with every heartbeat and probe result; they are stored
    // apart (a [`Beat`] per cluster, a [`ProbeTrack`] per probe) so that those do not rewrite the rest.
    // [`ClusterState::record`] leaves them empty (written so, an older version still reads the record); a
    // store written before holds them here: read as it was, and moved when the store opens.
    /// ingest_time of the latest heartbeat.
    #[serde(default)]
    pub hb_last_ingest: Option<DateTime<Utc>>,
    /// Heartbeat interval the agent announced.
    #[serde(default)]
    pub hb_interval_s: u32,
    /// Heartbeats in a row since the last silence.
    #[serde(default)]
    pub hb_streak: u32,
    /// Highest heartbeat seq applied.
    #[serde(default)]
    pub hb_last_seq: u64,
    /// (cluster_time - ingest_time) of recent heartbeats, seconds.
    #[serde(default)]
    pub skew_samples: VecDeque<f64>,
    /// Probes.
    #[serde(default)]
    pub probes: BTreeMap<String, ProbeTrack>,
    /// Recent spec changes (at most [`ClusterState::MAX_CHANGES`], oldest first). Stored apart, one record
    /// per change under its `seq`, so that a heartbeat does not rewrite hundreds of them: a store written
    /// before holds them here and is read as it was, never written so again.
    #[serde(default, skip_serializing)]
    pub changes: VecDeque<ChangeRec>,
    /// The `seq` the next change gets.
    #[serde(default)]
    pub changes_next: u64,
    /// Release batches applied here lately (hub time, newest last; the last 2 h, at most
    /// [`ClusterState::MAX_RELEASES`]).
    #[serde(default)]
    pub releases: VecDeque<(DateTime<Utc>, multipilot_schemas::payload::ReleaseRef)>,
    /// The releases that run here: the newest revision a batch applied, by release name, until it is
    /// rolled back (at most [`ClusterState::MAX_RUNNING`], the most recently applied kept).
    #[serde(default)]
    pub running: BTreeMap<String, Running>,
    /// Spec hash per `kind/ns/name`: read only from a store written before the machine kept them per object
    /// (the store moves them when it opens one), never written.
    #[serde(default, skip_serializing)]
    pub spec_hashes: BTreeMap<String, String>,
    /// What the baseline is judged on.
    pub inventory: Inventory,
    /// Latest compliance report.
    pub compliance: Option<ComplianceReport>,
    /// The settings of the objects the fleet-consistency report compares, by object
    /// ([`crate::consistency::Tracked::key`]).
    #[serde(default)]
    pub settings: BTreeMap<String, BTreeMap<String, String>>,
    /// Warning events of the last minute (cluster time, in time order), with `reason object`. Stored apart
    /// from the rest of the state, as a [`StormWindow`] (it changes with every warning; the rest rarely).
    #[serde(default, skip_serializing)]
    pub warnings: VecDeque<(DateTime<Utc>, String)>,
    /// Warning events seen so far (stored with the window).
    #[serde(default, skip_serializing)]
    pub warnings_seen: u64,
    /// `warnings_seen` as of the hub time it last changed (a storm without warnings for a minute is over;
    /// stored with the window).
    #[serde(default, skip_serializing)]
    pub warnings_checked: Option<(u64, DateTime<Utc>)>,
}

/// A release as it runs on a cluster (from the release role's `batch` records).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    /// The revision.
    pub revision: u64,
    /// The Git commit it came from.
    #[serde(default)]
    pub commit: Option<String>,
    /// The fleet repository it came from (GitOps).
    #[serde(default)]
    pub repo: Option<String>,
    /// A policy bundle (a fleet repository's `policies/`).
    #[serde(default)]
    pub policy: bool,
    /// When its batch started here (hub time).
    pub at: DateTime<Utc>,
}

impl ClusterState {
    /// How many release batches a cluster remembers.
    pub const MAX_RELEASES: usize = 50;
    /// How many running releases a cluster remembers.
    pub const MAX_RUNNING: usize = 200;
    /// How many spec changes a cluster remembers (~360 bytes each; a cluster changing more than 10 objects a
    /// minute fills it before the change window ends: 1,000 would hold 5 MiB more on 30 such clusters).
    pub const MAX_CHANGES: usize = 500;

    /// Records a spec change, numbered, and forgets those older than `window` before the newest and beyond
    /// [`ClusterState::MAX_CHANGES`].
    pub fn push_change(&mut self, mut change: ChangeRec, window: chrono::Duration) {
        change.seq = self.changes_next;
        self.changes_next += 1;
        let newest = change.at;
        self.changes.push_back(change);
        while self
            .changes
            .front()
            .is_some_and(|ch| ch.at < newest - window)
            || self.changes.len() > Self::MAX_CHANGES
        {
            self.changes.pop_front();
        }
    }

    /// The `seq`s of the changes held: from the oldest's to [`ClusterState::changes_next`].
    pub fn change_seqs(&self) -> std::ops::Range<u64> {
        self.changes.front().map_or(self.changes_next, |c| c.seq)..self.changes_next
    }

    /// The heartbeat's fields, as stored apart.
    pub fn beat(&self) -> Beat {
        Beat {
            last_ingest: self.hb_last_ingest,
            interval_s: self.hb_interval_s,
            streak: self.hb_streak,
            last_seq: self.hb_last_seq,
            skew_samples: self.skew_samples.clone(),
        }
    }

    /// Puts back the heartbeat's fields stored apart.
    pub fn set_beat(&mut self, b: Beat) {
        self.hb_last_ingest = b.last_ingest;
        self.hb_interval_s = b.interval_s;
        self.hb_streak = b.streak;
        self.hb_last_seq = b.last_seq;
        self.skew_samples = b.skew_samples;
    }

    /// Whether the record holds what is now stored apart (a store written by an older version).
    pub fn holds_beat_or_probes(&self) -> bool {
        !self.probes.is_empty() || self.hb_last_ingest.is_some() || self.hb_last_seq > 0
    }

    /// The cluster's state as its store record holds it: everything but what is stored apart (its changes,
    /// storm window, heartbeat and probes), without copying those.
    pub fn record(&self) -> ClusterState {
        let ClusterState {
            labels,
            hb_last_ingest: _,
            hb_interval_s: _,
            hb_streak: _,
            hb_last_seq: _,
            skew_samples: _,
            probes: _,
            changes: _,
            changes_next,
            releases,
            running,
            spec_hashes: _,
            inventory,
            compliance,
            settings,
            warnings: _,
            warnings_seen: _,
            warnings_checked: _,
        } = self;
        ClusterState {
            labels: labels.clone(),
            changes_next: *changes_next,
            releases: releases.clone(),
            running: running.clone(),
            inventory: inventory.clone(),
            compliance: compliance.clone(),
            settings: settings.clone(),
            ..ClusterState::default()
        }
    }

    /// Records that `name` runs `r` here, unless a newer revision of it does.
    pub fn running_applied(&mut self, name: &str, r: Running) {
        if self
            .running
            .get(name)
            .is_some_and(|x| (x.revision, x.at) >= (r.revision, r.at))
        {
            return;
        }
        self.running.insert(name.to_string(), r);
        while self.running.len() > Self::MAX_RUNNING {
            let Some(oldest) = self
                .running
                .iter()
                .min_by_key(|(_, x)| x.at)
                .map(|(n, _)| n.clone())
            else {
                break;
            };
            self.running.remove(&oldest);
        }
    }

    /// Forgets `name` here if `revision` of it was rolled back (a rollback restores what ran before it,
    /// which the correlator does not know); whether it did.
    pub fn running_rolled_back(&mut self, name: &str, revision: u64) -> bool {
        let rolled_back = self
            .running
            .get(name)
            .is_some_and(|x| x.revision == revision);
        if rolled_back {
            self.running.remove(name);
        }
        rolled_back
    }

    /// Forgets that `revision` of `name` reached this cluster (its batch was stopped before changing
    /// it); whether it had been remembered.
    pub fn release_not_applied(&mut self, name: &str, revision: u64) -> bool {
        let before = self.releases.len();
        self.releases
            .retain(|(_, r)| !(r.name == name && r.revision == revision));
        self.releases.len() != before
    }

    /// Remembers a release batch applied here at `at` (hub time), forgetting those older than 2 h.
    pub fn release_applied(
        &mut self,
        at: DateTime<Utc>,
        r: multipilot_schemas::payload::ReleaseRef,
    ) {
        if self.releases.iter().any(|(t, x)| *t == at && *x == r) {
            return;
        }
        self.releases.push_back((at, r));
        self.releases.make_contiguous().sort_by_key(|r| r.0);
        let newest = self.releases.back().map(|(t, _)| *t).unwrap_or(at);
        while self.releases.len() > Self::MAX_RELEASES
            || self
                .releases
                .front()
                .is_some_and(|(t, _)| *t < newest - chrono::Duration::hours(2))
        {
            self.releases.pop_front();
        }
    }
}

/// A cluster's event-storm window as the store keeps it: written at most every
/// [`StormWindow::SAVE_EVERY`] of the cluster's time while warnings come (and at once when it is cleared or
/// the correlator stops), not with every warning: a crash loses at most those seconds of the window, which
/// only delays the judgement of a storm that was building.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StormWindow {
    /// [`ClusterState::warnings`].
    pub warnings: VecDeque<(DateTime<Utc>, String)>,
    /// [`ClusterState::warnings_seen`].
    pub seen: u64,
    /// [`ClusterState::warnings_checked`].
    pub checked: Option<(u64, DateTime<Utc>)>,
}

impl StormWindow {
    /// How much of the cluster's time may pass between two writes of a changing window.
    pub const SAVE_EVERY: chrono::Duration = chrono::Duration::seconds(5);

    /// The window of a cluster's state.
    pub fn of(c: &ClusterState) -> Self {
        StormWindow {
            warnings: c.warnings.clone(),
            seen: c.warnings_seen,
            checked: c.warnings_checked,
        }
    }

    /// Puts the window back into a cluster's state.
    pub fn restore_into(self, c: &mut ClusterState) {
        c.warnings = self.warnings;
        c.warnings_seen = self.seen;
        c.warnings_checked = self.checked;
    }
}
