//! Release drift: what a release applied, against what the cluster now holds.
//!
//! - The live objects come from FLEET_STATE (an ephemeral ordered consumer: the last state of every
//!   object, then live). Only objects some release plans or runs are kept.
//! - An object drifts when a field the release set has another value now, or the object is gone. A field
//!   the release never set is not drift (defaults, status, annotations others add); neither is a field
//!   the release set that a controller now owns (`metadata.managedFields`, as the agent reports it:
//!   `ResourceState::field_managers`), e.g. `spec.replicas` scaled by an HPA (`kube-controller-manager`).
//!   Which managers count as controllers is `release.drift_ignore_managers`.
//! - Each cluster's verdict goes to the correlator as the probe `release-drift` on
//!   `fleet.probe.<cluster>.release-drift` (one finding per drifted object, naming its fields), which
//!   opens and resolves the `release-drift` incident.
//! - A release with `sync.self_heal` re-applies a drifted object (server-side apply, forcing back the
//!   fields it owns), at most `heal_limit` times per object in `heal_window`; then it gives up, says so in
//!   the finding, and records it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use multipilot_bus::follow::{Follower, Next, Replay};
use multipilot_schemas::payload::ReleaseEntry;
use multipilot_schemas::payload::{
    FieldManager, Finding, ObjectRef, ProbeResult, ProbeStatus, ReleaseAction, Severity,
};
use multipilot_schemas::streams::{StateMsg, name};
use multipilot_schemas::{Envelope, stable_id, subject};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::Service;
use crate::diff;
use crate::exec::Command;
use crate::model::{Release, State, obj_name};

/// The probe name (and the correlator's incident kind) for releases.
pub const PROBE: &str = "release-drift";
/// The probe name for policy bundles (and the `policy-bundles` check of the compliance report).
pub const POLICY_PROBE: &str = "policy-drift";

fn probe_of(policy: bool) -> &'static str {
    if policy { POLICY_PROBE } else { PROBE }
}

/// One field of an object that is not what the release applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FieldDrift {
    /// `.spec.template.spec.containers[web].image`.
    pub path: String,
    /// What the release applied.
    pub applied: Option<Value>,
    /// What the cluster holds (absent: the field is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<Value>,
    /// Who owns the field now (`kubectl-edit`, …), from `managedFields`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub managers: Vec<String>,
}

/// An object of a release that drifted on a cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriftItem {
    /// The object.
    pub object: ObjectRef,
    /// It was deleted.
    #[serde(default)]
    pub deleted: bool,
    /// The fields that differ.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldDrift>,
    /// When the cluster changed it (the state's `cluster_time`).
    pub since: DateTime<Utc>,
    /// Self-heal gave up on it (something keeps undoing the release).
    #[serde(default)]
    pub gave_up: bool,
}

impl DriftItem {
    /// One line for a person: `Deployment shop/web: .spec.replicas is 5, applied 3 (by kubectl-edit)`.
    pub fn describe(&self, release: &str, commit: Option<&str>) -> String {
        let what = format!("{} {}", self.object.kind, obj_name(&self.object));
        let rel = match commit {
            Some(c) => format!("release {release} at {c}"),
            None => format!("release {release}"),
        };
        let mut s = if self.deleted {
            format!("{what} was deleted ({rel} applied it)")
        } else {
            let fields: Vec<String> = self
                .fields
                .iter()
                .take(3)
                .map(|f| {
                    let v = |v: &Option<Value>| match v {
                        Some(Value::String(s)) => format!("{s:?}"),
                        Some(v) => v.to_string(),
                        None => "absent".into(),
                    };
                    let by = if f.managers.is_empty() {
                        String::new()
                    } else {
                        format!(" by {}", f.managers.join(", "))
                    };
                    format!(
                        "{} is {}, {rel} applied {}{by}",
                        f.path,
                        v(&f.live),
                        v(&f.applied)
                    )
                })
                .collect();
            let more = self.fields.len().saturating_sub(3);
            format!(
                "{what}: {}{}",
                fields.join("; "),
                if more > 0 {
                    format!(" (+{more} more fields)")
                } else {
                    String::new()
                }
            )
        };
        if self.gave_up {
            s.push_str(" — self-heal gave up: something keeps changing it back");
        }
        s
    }
}

/// An object as the cluster holds it.
#[derive(Debug, Clone)]
struct Live {
    /// `{metadata: {name, namespace, labels, annotations}, …spec}`: what a rendered object compares with.
    object: Value,
    managers: Vec<FieldManager>,
    deleted: bool,
    at: DateTime<Utc>,
    /// The agent reports only metadata for this kind (Secrets): only labels and annotations are judged.
    metadata_only: bool,
}

/// `(cluster, kind, namespace, name)`.
type Key = (String, String, String, String);

fn key_of(cluster: &str, obj: &Value) -> Key {
    let s = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (
        cluster.to_string(),
        s("/kind"),
        s("/metadata/namespace"),
        s("/metadata/name"),
    )
}

/// Whether everything `want` sets is in `have` with the same value (maps and lists of maps recursively;
/// what `have` has beyond `want`, such as defaults the API server added, does not matter).
/// With `quantities`, values are compared as resource quantities where they parse as such.
fn covers(want: &Value, have: &Value, quantities: bool) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| covers(v, hv, quantities))),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| covers(a, b, quantities))
        }
        _ => want == have || (quantities && same_quantity(want, have)),
    }
}

/// Whether a field holds a resource quantity (requests, limits, quota, LimitRange defaults, storage).
fn quantity_path(path: &str) -> bool {
    path.ends_with(".resources")
        || path.ends_with(".limits")
        || path.ends_with(".hard")
        || [
            ".resources.",
            ".hard.",
            ".limits[",
            ".default.",
            ".defaultRequest.",
            ".max.",
            ".min.",
            ".maxLimitRequestRatio.",
            ".capacity.",
            ".overhead.",
        ]
        .iter()
        .any(|p| path.contains(p))
}

/// A Kubernetes quantity's value (`500m`, `0.5`, `1Gi`, `2e3`, or a plain number).
fn quantity(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => {
            let s = s.trim();
            let split = s
                .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
                .unwrap_or(s.len());
            let (num, suffix) = s.split_at(split);
            let mult = match suffix {
                "" => 1.0,
                "m" => 1e-3,
                "k" => 1e3,
                "M" => 1e6,
                "G" => 1e9,
                "T" => 1e12,
                "P" => 1e15,
                "E" => 1e18,
                "Ki" => 1024.0,
                "Mi" => 1024f64.powi(2),
                "Gi" => 1024f64.powi(3),
                "Ti" => 1024f64.powi(4),
                "Pi" => 1024f64.powi(5),
                "Ei" => 1024f64.powi(6),
                _ => return None,
            };
            num.parse::<f64>().ok().map(|n| n * mult)
        }
        _ => None,
    }
}

/// The API server writes quantities in its canonical form (`cpu: 0.5` comes back as `500m`, `memory: 1024Mi`
/// as `1Gi`): the same amount is no drift.
fn same_quantity(want: &Value, have: &Value) -> bool {
    match (quantity(want), quantity(have)) {
        (Some(a), Some(b)) => (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0),
        _ => false,
    }
}

/// Whether `path` and an owned field `f` overlap (one is the other or inside it).
fn overlaps(path: &str, f: &str) -> bool {
    let inside = |a: &str, b: &str| {
        a == b || (a.starts_with(b) && matches!(a.as_bytes().get(b.len()), Some(b'.' | b'[')))
    };
    inside(path, f) || inside(f, path)
}

/// The fields of `intent` (a rendered object) the live object no longer holds. Fields a manager of
/// `controllers` took over are not drift; `ours` is the release's own field manager.
pub fn judge(
    intent: &Value,
    live: &Value,
    managers: &[FieldManager],
    ours: &str,
    controllers: &[String],
) -> Vec<FieldDrift> {
    let mut want = diff::content(intent);
    // identity is the key, not content
    for k in ["apiVersion", "kind"] {
        if let Some(o) = want.as_object_mut() {
            o.remove(k);
        }
    }
    diff::diff(Some(&want), live)
        .into_iter()
        .filter_map(|c| {
            let applied = c.before?;
            if let Some(now) = &c.after
                && covers(&applied, now, quantity_path(&c.path))
            {
                return None;
            }
            let owners: Vec<String> = managers
                .iter()
                .filter(|m| m.fields.iter().any(|f| overlaps(&c.path, f)))
                .map(|m| m.manager.clone())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let taken_by_controller = !owners.is_empty()
                && owners
                    .iter()
                    .all(|o| o != ours && controllers.iter().any(|c| c == o));
            if taken_by_controller {
                return None;
            }
            Some(FieldDrift {
                path: c.path,
                applied: Some(applied),
                live: c.after,
                managers: owners.into_iter().filter(|o| o != ours).collect(),
            })
        })
        .collect()
}

/// What the drift judge keeps.
#[derive(Debug, Default)]
pub struct Drift {
    live: HashMap<Key, Live>,
    watched: HashSet<Key>,
    releases: BTreeMap<String, Release>,
    dirty: BTreeSet<String>,
    /// The last verdict published per cluster (its findings' messages), and the current items by release.
    published: HashMap<(String, bool), Vec<String>>,
    items: BTreeMap<(String, String), Vec<DriftItem>>,
    heals: HashMap<(String, Key), VecDeque<DateTime<Utc>>>,
    /// Objects self-heal gave up on, and when (it tries again after `heal_window`).
    gave_up: HashMap<(String, Key), DateTime<Utc>>,
    /// The drift each object was last healed from (until it is judged clean): one heal per drift, however
    /// many states (status updates) come before the heal's own.
    healed: HashMap<(String, Key), String>,
    round: u64,
}

impl Drift {
    /// The drifted objects of `release` on `cluster`.
    pub fn items(&self, release: &str, cluster: &str) -> Vec<DriftItem> {
        self.items
            .get(&(release.to_string(), cluster.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// Takes the releases as stored: which objects to watch, what to judge them against.
    fn set_releases(&mut self, all: Vec<Release>) {
        let mut watched = HashSet::new();
        for r in &all {
            for c in &r.plan.clusters {
                for o in &c.objects {
                    watched.insert((
                        c.cluster.clone(),
                        o.object.kind.clone(),
                        o.object.namespace.clone().unwrap_or_default(),
                        o.object.name.clone(),
                    ));
                }
            }
            for (c, d) in &r.deployed {
                for o in &d.objects {
                    watched.insert(key_of(c, o));
                }
            }
        }
        self.live.retain(|k, _| watched.contains(k));
        self.watched = watched;
        // what self-heal remembers of releases and objects that are gone
        let known =
            |(r, k): &(String, Key)| self.watched.contains(k) && all.iter().any(|x| &x.name == r);
        self.heals.retain(|id, _| known(id));
        self.gave_up.retain(|id, _| known(id));
        self.healed.retain(|id, _| known(id));
        self.releases = all.into_iter().map(|r| (r.name.clone(), r)).collect();
        self.dirty.extend(
            self.releases
                .values()
                .flat_map(|r| r.deployed.keys().cloned()),
        );
        // clusters that had drift but no longer run a release are judged (healthy) too
        self.dirty
            .extend(self.published.keys().map(|(c, _)| c.clone()));
    }

    /// Takes one FLEET_STATE message.
    fn take(&mut self, env: Envelope<StateMsg>) {
        let cluster = env.cluster;
        let (key, live) = match env.payload {
            StateMsg::State(s) => {
                let mut meta = serde_json::Map::new();
                meta.insert("name".into(), json!(s.name));
                if let Some(ns) = &s.namespace {
                    meta.insert("namespace".into(), json!(ns));
                }
                if !s.labels.is_empty() {
                    meta.insert("labels".into(), json!(s.labels));
                }
                if !s.annotations.is_empty() {
                    meta.insert("annotations".into(), json!(s.annotations));
                }
                let metadata_only = s.spec.is_none();
                let mut object = s.spec.unwrap_or_else(|| json!({}));
                if let Some(o) = object.as_object_mut() {
                    o.insert("metadata".into(), Value::Object(meta));
                }
                (
                    (
                        cluster.clone(),
                        s.kind,
                        s.namespace.unwrap_or_default(),
                        s.name,
                    ),
                    Live {
                        object,
                        managers: s.field_managers,
                        deleted: false,
                        at: env.cluster_time,
                        metadata_only,
                    },
                )
            }
            StateMsg::Deleted(d) => (
                (
                    cluster.clone(),
                    d.kind,
                    d.namespace.unwrap_or_default(),
                    d.name,
                ),
                Live {
                    object: Value::Null,
                    managers: Vec::new(),
                    deleted: true,
                    at: env.cluster_time,
                    metadata_only: false,
                },
            ),
            StateMsg::Resync(_) => return,
        };
        if self.watched.contains(&key) {
            self.live.insert(key, live);
            self.dirty.insert(cluster);
        }
    }

    /// Forgets what was seen of these objects on `cluster`: a rollback just rewrote them, and until their
    /// new states arrive the last seen is the failed revision's, which the restored release would call drift.
    pub fn forget(&mut self, cluster: &str, objects: impl IntoIterator<Item = ObjectRef>) {
        for o in objects {
            self.live.remove(&(
                cluster.to_string(),
                o.kind,
                o.namespace.unwrap_or_default(),
                o.name,
            ));
        }
    }

    /// Judges the dirty clusters: the new items per (release, cluster), and what to heal.
    fn judge_dirty(&mut self, controllers: &[String]) -> Vec<String> {
        let clusters: Vec<String> = std::mem::take(&mut self.dirty).into_iter().collect();
        for cluster in &clusters {
            self.items.retain(|(_, c), _| c != cluster);
            for r in self.releases.values() {
                let Some(d) = r.deployed.get(cluster) else {
                    continue;
                };
                // a cluster a running apply or rollback is changing is judged once that is done
                if r.state.busy() && r.changed.contains(cluster) && d.revision != r.revision {
                    continue;
                }
                let mut found = Vec::new();
                for intent in &d.objects {
                    let key = key_of(cluster, intent);
                    let Some(live) = self.live.get(&key) else {
                        continue;
                    };
                    let gave_up = r.spec.sync.self_heal
                        && self.gave_up.contains_key(&(r.name.clone(), key.clone()));
                    if live.deleted {
                        found.push(DriftItem {
                            object: crate::plan::oref(intent),
                            deleted: true,
                            fields: Vec::new(),
                            since: live.at,
                            gave_up,
                        });
                        continue;
                    }
                    let mut fields = judge(
                        intent,
                        &live.object,
                        &live.managers,
                        &d.field_manager,
                        controllers,
                    );
                    if live.metadata_only {
                        fields.retain(|f| f.path.starts_with(".metadata."));
                    }
                    if fields.is_empty() {
                        // clean again: the next drift is a new one
                        self.healed.remove(&(r.name.clone(), key));
                    } else {
                        found.push(DriftItem {
                            object: crate::plan::oref(intent),
                            deleted: false,
                            fields,
                            since: live.at,
                            gave_up,
                        });
                    }
                }
                if !found.is_empty() {
                    self.items.insert((r.name.clone(), cluster.clone()), found);
                }
            }
        }
        clusters
    }

    /// The verdict on a cluster's releases (or, with `policy`, its policy bundles), when it differs from
    /// the one published last. None either for a cluster that runs none and was never judged.
    fn verdict(&mut self, cluster: &str, policy: bool) -> Option<ProbeResult> {
        let runs = self
            .releases
            .values()
            .any(|r| r.source.policy == policy && r.deployed.contains_key(cluster));
        let key = (cluster.to_string(), policy);
        if !runs && !self.published.contains_key(&key) {
            return None;
        }
        let mut findings = Vec::new();
        for ((release, c), items) in &self.items {
            if c != cluster
                || self
                    .releases
                    .get(release)
                    .is_none_or(|r| r.source.policy != policy)
            {
                continue;
            }
            let commit = self
                .releases
                .get(release)
                .and_then(|r| r.deployed.get(cluster))
                .and_then(|d| d.commit.clone());
            for it in items {
                findings.push(Finding {
                    severity: Severity::Warning,
                    object: Some(it.object.clone()),
                    message: it.describe(release, commit.as_deref()),
                });
            }
        }
        let messages: Vec<String> = findings.iter().map(|f| f.message.clone()).collect();
        if self.published.get(&key) == Some(&messages) {
            return None;
        }
        // a first healthy verdict per cluster goes out too, so an incident left open before a restart resolves
        self.published.insert(key, messages);
        let n = findings.len();
        self.round = self.round.max(Utc::now().timestamp_millis() as u64) + 1;
        let what = if policy { "policy bundle" } else { "release" };
        Some(ProbeResult {
            probe: probe_of(policy).into(),
            status: if n == 0 {
                ProbeStatus::Healthy
            } else {
                ProbeStatus::Unhealthy
            },
            latency_ms: 0.0,
            detail: if n == 0 {
                format!("every object matches what its {what} applied")
            } else {
                format!("{n} object(s) differ from what their {what} applied")
            },
            round: self.round,
            observations: BTreeMap::from([("drifted_objects".to_string(), n as f64)]),
            findings,
        })
    }

    /// Whether a heal of `key` by `release` for the drift `signature` may go now; records it. `Ok(false)`:
    /// not now (this drift was healed already, its result not seen yet); `Err(newly)`: gave up after `limit`
    /// heals in the window (`newly`: just now, so the caller records it once).
    fn heal_allowed(
        &mut self,
        release: &str,
        key: &Key,
        signature: &str,
        limit: u32,
        window: Duration,
    ) -> Result<bool, bool> {
        let id = (release.to_string(), key.clone());
        let now = Utc::now();
        let window = chrono::Duration::from_std(window).unwrap_or(chrono::Duration::minutes(10));
        match self.gave_up.get(&id) {
            Some(t) if now - *t < window => return Err(false),
            Some(_) => {
                self.gave_up.remove(&id);
            }
            None => {}
        }
        if self.healed.get(&id).is_some_and(|s| s == signature) {
            return Ok(false);
        }
        let q = self.heals.entry(id.clone()).or_default();
        while q.front().is_some_and(|t| *t < now - window) {
            q.pop_front();
        }
        if q.len() as u32 >= limit {
            self.gave_up.insert(id, now);
            return Err(true);
        }
        q.push_back(now);
        self.healed.insert(id, signature.to_string());
        Ok(true)
    }
}

/// A heal to send.
struct Heal {
    release: String,
    revision: u64,
    cluster: String,
    field_manager: String,
    objects: Vec<Value>,
    items: Vec<DriftItem>,
}

impl Service {
    /// Follows FLEET_STATE (the last state of every object, then live) and judges drift until the role
    /// stops: what changed, every 500 ms or when a release changed.
    pub async fn follow_drift(self: Arc<Self>) {
        self.releases_changed().await;
        let mut states = Follower::new(
            self.js.clone(),
            name::STATE,
            [subject::STATE.all()],
            Replay::LastPerSubject,
        );
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tick.tick() => self.judge_now().await,
                _ = self.drift_wake.notified() => self.judge_now().await,
                next = states.next() => {
                    let Next::Message(m) = next else { continue };
                    match m.decode::<StateMsg>() {
                        Ok(env) => self.drift.lock().await.take(env),
                        Err(e) => tracing::debug!(subject = %m.message.subject, error = %e, "state skipped"),
                    }
                }
            }
        }
    }

    /// Re-reads the releases into the drift judge (after a release was planned, applied or rolled back).
    pub(crate) async fn releases_changed(&self) {
        // read under the judge's lock, so a slower reader never installs an older copy over a newer one
        let mut d = self.drift.lock().await;
        match self.store.all() {
            Ok(all) => {
                d.set_releases(all);
                self.drift_wake.notify_one();
            }
            Err(e) => tracing::warn!(error = %e, "reading the releases for drift failed"),
        }
    }

    /// Judges what changed; publishes verdicts that differ from the last; heals what may be healed.
    async fn judge_now(&self) {
        let (verdicts, heals, gave_up) = {
            let mut d = self.drift.lock().await;
            if d.dirty.is_empty() {
                return;
            }
            let clusters = d.judge_dirty(&self.config.drift_ignore_managers);
            let mut heals = Vec::new();
            let mut gave_up = Vec::new();
            let mut held = Vec::new();
            let items: Vec<((String, String), Vec<DriftItem>)> = d
                .items
                .iter()
                .filter(|((_, c), _)| clusters.contains(c))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for ((release, cluster), found) in items {
                let Some(r) = d.releases.get(&release).cloned() else {
                    continue;
                };
                // only a release at rest heals: not one applying or rolling back, nor one that failed,
                // was interrupted or whose rollback failed (healing would force an old revision over
                // half-changed clusters)
                if !r.spec.sync.self_heal
                    || !matches!(
                        r.state,
                        State::Succeeded
                            | State::WaitingApproval
                            | State::Held
                            | State::RolledBack
                            | State::Planned
                            | State::Blocked
                    )
                {
                    continue;
                }
                let Some(dep) = r.deployed.get(&cluster).cloned() else {
                    continue;
                };
                // outside its sync windows a release does not heal either: judged again until they open
                if !self.windows.is_empty() {
                    let labels = self
                        .registry
                        .snapshot()
                        .get(&cluster)
                        .map(|f| crate::plan::selector_labels(&cluster, f))
                        .unwrap_or_default();
                    if !self
                        .windows
                        .verdict(&release, &labels, &cluster, Utc::now())
                        .allowed
                    {
                        held.push(cluster.clone());
                        continue;
                    }
                }
                let mut heal = Heal {
                    release: release.clone(),
                    revision: dep.revision,
                    cluster: cluster.clone(),
                    field_manager: dep.field_manager.clone(),
                    objects: Vec::new(),
                    items: Vec::new(),
                };
                for it in found.iter().filter(|i| !i.gave_up) {
                    let Some(intent) = dep
                        .objects
                        .iter()
                        .find(|o| crate::plan::oref(o) == it.object)
                    else {
                        continue;
                    };
                    let key = key_of(&cluster, intent);
                    let signature =
                        serde_json::to_string(&(it.deleted, &it.fields)).unwrap_or_default();
                    match d.heal_allowed(
                        &release,
                        &key,
                        &signature,
                        self.config.heal_limit,
                        self.config.heal_window,
                    ) {
                        Ok(true) => {
                            heal.objects.push(intent.clone());
                            heal.items.push(it.clone());
                        }
                        Ok(false) => {}
                        Err(newly) => {
                            if newly {
                                gave_up.push((release.clone(), cluster.clone(), it.clone()));
                            }
                        }
                    }
                }
                if !heal.objects.is_empty() {
                    heals.push(heal);
                }
            }
            d.dirty.extend(held);
            // items that just gave up say so in the verdict
            for (release, cluster, it) in &gave_up {
                if let Some(list) = d.items.get_mut(&(release.clone(), cluster.clone())) {
                    for i in list.iter_mut().filter(|i| i.object == it.object) {
                        i.gave_up = true;
                    }
                }
            }
            let verdicts: Vec<(String, ProbeResult)> = clusters
                .iter()
                .flat_map(|c| [(c, false), (c, true)])
                .filter_map(|(c, policy)| d.verdict(c, policy).map(|v| (c.clone(), v)))
                .collect();
            (verdicts, heals, gave_up)
        };
        for (cluster, v) in verdicts {
            self.publish_verdict(&cluster, v).await;
        }
        for (release, cluster, it) in gave_up {
            self.record_heal(
                &release,
                &cluster,
                false,
                format!(
                    "self-heal gave up on {cluster}: {} was changed back {} times within {}s",
                    it.describe(&release, None),
                    self.config.heal_limit,
                    self.config.heal_window.as_secs()
                ),
                json!({"object": it.object, "fields": it.fields}),
            )
            .await;
        }
        for h in heals {
            self.heal(h).await;
        }
    }

    async fn publish_verdict(&self, cluster: &str, v: ProbeResult) {
        let round = v.round;
        let status = v.status;
        let probe = v.probe.clone();
        let env = Envelope::new(cluster, self.instance.as_str(), Utc::now(), round, v);
        let id = stable_id(&[&probe, cluster, &round.to_string()]);
        match multipilot_bus::publish::publish_one(
            &self.js,
            subject::probe(cluster, &probe),
            id,
            &env,
        )
        .await
        {
            Ok(_) => tracing::info!(cluster, probe, ?status, "drift verdict published"),
            Err(e) => {
                tracing::warn!(cluster, probe, error = %e, "drift verdict not published; will retry");
                let mut d = self.drift.lock().await;
                d.published
                    .remove(&(cluster.to_string(), probe == POLICY_PROBE));
                d.dirty.insert(cluster.to_string());
            }
        }
    }

    async fn heal(&self, h: Heal) {
        let cmd = Command {
            id: format!(
                "{}-r{}-{}-heal-{}",
                h.release,
                h.revision,
                h.cluster,
                Utc::now().timestamp_millis()
            ),
            release: h.release.clone(),
            cluster: h.cluster.clone(),
            action: ReleaseAction::Apply,
            field_manager: h.field_manager.clone(),
            // the release takes back the fields someone else took
            force: true,
            objects: h.objects,
        };
        let what: Vec<String> = h
            .items
            .iter()
            .map(|i| format!("{} {}", i.object.kind, obj_name(&i.object)))
            .collect();
        let (ok, summary) = match self.sender.send(&cmd).await {
            Ok(res) if res.ok => (
                true,
                format!("self-heal on {}: re-applied {}", h.cluster, what.join(", ")),
            ),
            Ok(res) => (
                false,
                format!(
                    "self-heal on {} failed: {}",
                    h.cluster,
                    res.objects
                        .iter()
                        .filter_map(|o| o.error.clone())
                        .chain(res.error)
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            ),
            Err(e) => (false, format!("self-heal on {} failed: {e}", h.cluster)),
        };
        if !ok {
            // a failed heal is tried again on the next judgement (it counts against the limit)
            let mut d = self.drift.lock().await;
            for o in &cmd.objects {
                d.healed.remove(&(h.release.clone(), key_of(&h.cluster, o)));
            }
            d.dirty.insert(h.cluster.clone());
        }
        let detail = json!({"command": cmd.id, "drift": h.items});
        self.record_heal(&h.release, &h.cluster, ok, summary, detail)
            .await;
    }

    async fn record_heal(
        &self,
        release: &str,
        cluster: &str,
        ok: bool,
        summary: String,
        detail: Value,
    ) {
        let _g = self.lock.lock().await;
        if let Ok(Some(mut r)) = self.store.get(release) {
            self.record(
                &mut r,
                ReleaseEntry::Heal,
                ok,
                "self-heal",
                None,
                vec![cluster.to_string()],
                summary,
                detail,
            )
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(image: &str, replicas: i64) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                    {"name": "web", "image": image, "ports": [{"containerPort": 8080}]}]}}}})
    }

    /// As the agent reports it: spec, plus metadata name/namespace/labels; the API server's defaults in.
    fn live(image: &str, replicas: i64) -> Value {
        json!({"metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                "progressDeadlineSeconds": 600, "revisionHistoryLimit": 10,
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                    {"name": "web", "image": image, "imagePullPolicy": "IfNotPresent",
                     "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                     "terminationMessagePath": "/dev/termination-log"}],
                    "restartPolicy": "Always", "dnsPolicy": "ClusterFirst"}}}})
    }

    fn m(manager: &str, fields: &[&str]) -> FieldManager {
        FieldManager {
            manager: manager.into(),
            operation: "Update".into(),
            subresource: None,
            fields: fields.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn controllers() -> Vec<String> {
        crate::Config::default().drift_ignore_managers
    }

    #[test]
    fn one_heal_per_drift_and_a_limit_per_window() {
        let mut d = Drift::default();
        let key: Key = ("c".into(), "Deployment".into(), "ns".into(), "web".into());
        let window = Duration::from_secs(600);
        assert_eq!(d.heal_allowed("r", &key, "a", 2, window), Ok(true));
        // the same drift again (a status update before the heal's result): no second heal
        assert_eq!(d.heal_allowed("r", &key, "a", 2, window), Ok(false));
        // undone again after the heal: another one
        assert_eq!(d.heal_allowed("r", &key, "b", 2, window), Ok(true));
        assert_eq!(
            d.heal_allowed("r", &key, "c", 2, window),
            Err(true),
            "gives up, once"
        );
        assert_eq!(d.heal_allowed("r", &key, "d", 2, window), Err(false));
        // after the window it tries again
        assert_eq!(
            d.heal_allowed("r", &key, "e", 2, Duration::from_millis(0)),
            Ok(true)
        );
    }

    #[test]
    fn defaults_the_api_server_added_are_not_drift() {
        let got = judge(
            &deployment("web:1.2", 3),
            &live("web:1.2", 3),
            &[m("multipilot", &[".spec.replicas"])],
            "multipilot",
            &controllers(),
        );
        assert!(got.is_empty(), "{got:?}");
    }

    #[test]
    fn an_edited_field_is_drift_and_names_who_changed_it() {
        let got = judge(
            &deployment("web:1.2", 3),
            &live("web:9.9", 3),
            &[
                m("multipilot", &[".spec.replicas"]),
                m(
                    "kubectl-edit",
                    &[".spec.template.spec.containers[web].image"],
                ),
            ],
            "multipilot",
            &controllers(),
        );
        assert_eq!(
            got,
            vec![FieldDrift {
                path: ".spec.template.spec.containers[web].image".into(),
                applied: Some(json!("web:1.2")),
                live: Some(json!("web:9.9")),
                managers: vec!["kubectl-edit".into()],
            }]
        );
    }

    #[test]
    fn replicas_an_hpa_took_over_are_not_drift_but_replicas_a_person_set_are() {
        let hpa = m("kube-controller-manager", &[".spec.replicas"]);
        let got = judge(
            &deployment("web:1.2", 3),
            &live("web:1.2", 7),
            std::slice::from_ref(&hpa),
            "multipilot",
            &controllers(),
        );
        assert!(got.is_empty(), "{got:?}");
        let person = m("kubectl-scale", &[".spec.replicas"]);
        let got = judge(
            &deployment("web:1.2", 3),
            &live("web:1.2", 7),
            &[person],
            "multipilot",
            &controllers(),
        );
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].path, ".spec.replicas");
    }

    #[test]
    fn quantities_the_api_server_rewrote_are_not_drift() {
        let mut intent = deployment("web:1.2", 3);
        intent["spec"]["template"]["spec"]["containers"][0]["resources"] =
            json!({"requests": {"cpu": 0.5, "memory": "1024Mi"}, "limits": {"cpu": "1"}});
        let mut l = live("web:1.2", 3);
        l["spec"]["template"]["spec"]["containers"][0]["resources"] =
            json!({"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1"}});
        assert!(judge(&intent, &l, &[], "multipilot", &controllers()).is_empty());
        l["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] =
            json!("600m");
        let got = judge(&intent, &l, &[], "multipilot", &controllers());
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            got[0].path,
            ".spec.template.spec.containers[web].resources.requests.cpu"
        );
        // only quantities: a label "1.10" edited to "1.1" is drift, though both parse as numbers
        let mut intent = deployment("web:1.2", 3);
        intent["metadata"]["labels"]["version"] = json!("1.10");
        let mut l = live("web:1.2", 3);
        l["metadata"]["labels"]["version"] = json!("1.1");
        let got = judge(&intent, &l, &[], "multipilot", &controllers());
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].path, ".metadata.labels.version");
    }

    #[test]
    fn a_limitrange_rewritten_by_the_api_server_is_not_drift() {
        let intent = json!({"apiVersion": "v1", "kind": "LimitRange",
            "metadata": {"name": "team-defaults", "namespace": "hello"},
            "spec": {"limits": [{"type": "Container", "default": {"cpu": "0.5", "memory": "512Mi"}}]}});
        let live = json!({"metadata": {"name": "team-defaults", "namespace": "hello"},
            "spec": {"limits": [{"type": "Container", "default": {"cpu": "500m", "memory": "512Mi"},
                "defaultRequest": {"cpu": "500m", "memory": "512Mi"}}]}});
        assert!(judge(&intent, &live, &[], "multipilot", &controllers()).is_empty());
    }

    #[test]
    fn a_removed_label_is_drift() {
        let mut l = live("web:1.2", 3);
        l["metadata"]["labels"] = json!({});
        let got = judge(
            &deployment("web:1.2", 3),
            &l,
            &[],
            "multipilot",
            &controllers(),
        );
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].path, ".metadata.labels.app");
        assert_eq!(got[0].live, None);
    }
}
