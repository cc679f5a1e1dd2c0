//! The dispatcher's core: alerts into route-tree groups; on each group's timer, what is firing and resolved
//! (minus silenced and inhibited alerts) is compared with the notification log, and a notification is
//! decided only when Alertmanager would send one (new firing alerts, newly resolved ones for receivers that
//! want them, everything resolved, or the repeat interval passed) — and, MultiPilot's own, when a firing
//! fleet alert reached another cluster (`notify_fleet_spread`: a member's own alert is muted by it).
//!
//! It does no I/O and reads no clock: every input carries its time (`now`), [`Engine::tick`] returns the
//! groups' decisions ([`Notify`]: the notifications and the log entry they imply) and
//! [`Engine::take_changes`] what else changed, for the shell ([`crate::router`]) to make durable (and
//! write through to the KV buckets) before anything is sent. It starts from what the store held
//! ([`Snapshot`]).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Duration, Utc};
use multipilot_schemas::payload::{
    AlertState, EventDigest, FleetIncident, Incident, IncidentStatus, Notification, NotifiedAlert,
    SuspectVerdict,
};
use multipilot_schemas::stable_id;
use serde::Serialize;

use crate::config::{Receiver, Routing};
use crate::matcher::all_match;
use crate::route::Tree;
use crate::store::{Alert, NflogEntry, Pending, Silence, nflog_key};
use crate::template;

/// One aggregation group.
#[derive(Debug, Clone)]
struct Group {
    node: usize,
    /// Alertmanager's `groupKey` of it.
    group_key: String,
    labels: BTreeMap<String, String>,
    alerts: BTreeSet<String>,
    phase: Phase,
}

/// Where a group is in its timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Its first wait (group_wait), due at this time; an alert whose wait is already over brings it
    /// forward.
    Waiting(DateTime<Utc>),
    /// Judged at least once (or notified before a restart): due again at this time, group_interval after.
    Flushed(DateTime<Utc>),
}

impl Phase {
    fn due(self) -> DateTime<Utc> {
        match self {
            Phase::Waiting(t) | Phase::Flushed(t) => t,
        }
    }
}

/// The annotation of an event alert resolved with the alert that held it (the incident that accounted for
/// it, or its event fleet alert once quiet): that alert's id (see `Engine::end_held`).
pub const RESOLVED_WITH: &str = "resolved_with";

/// What mutes alerts, worked out once per flush: per inhibition rule, the firing sources by their `equal`
/// label values; per member alert, the firing fleet alerts that list it; per event alert, the firing
/// incident alerts that account for it.
struct Index {
    rules: Vec<HashMap<Vec<String>, Vec<String>>>,
    fleet: HashMap<String, Vec<String>>,
    explained: HashMap<String, Vec<String>>,
    /// Per `accounts_for` entry, by cluster: its incidents' alerts firing or within their hold.
    accounting: Vec<HashMap<String, Vec<Accounting>>>,
}

/// An incident's alert that accounts for posted alerts on its cluster (`Routing::accounts_for`).
struct Accounting {
    id: String,
    severity: Option<u8>,
    /// When it ended (none: firing): it mutes only alerts that started (fired) before.
    ended: Option<DateTime<Utc>>,
}

/// A `severity` label's rank, when it is one of the usual three (any case).
fn severity_rank(labels: &BTreeMap<String, String>) -> Option<u8> {
    let s = labels.get("severity")?;
    [("info", 1), ("warning", 2), ("critical", 3)]
        .into_iter()
        .find(|(name, _)| s.eq_ignore_ascii_case(name))
        .map(|(_, rank)| rank)
}

/// Why an alert is not notified.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Muted {
    /// Active silences that match it.
    pub silenced_by: Vec<String>,
    /// Firing alerts that inhibit it.
    pub inhibited_by: Vec<String>,
}

impl Muted {
    fn is_muted(&self) -> bool {
        !self.silenced_by.is_empty() || !self.inhibited_by.is_empty()
    }
}

/// Counters for tests and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Incident changes taken in.
    pub incidents_in: u64,
    /// Older or repeated revisions ignored.
    pub stale_ignored: u64,
    /// Notifications enqueued.
    pub notifications: u64,
}

/// What an input did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// The alert is new or changed: held, grouped, and to be written.
    Placed,
    /// An older or repeated revision (a redelivery): ignored.
    Stale,
    /// A re-post of an alert already resolved at that same time: nothing changes.
    Unchanged,
}

/// What the store held, to start from.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Alerts.
    pub alerts: Vec<Alert>,
    /// Silences.
    pub silences: Vec<Silence>,
    /// The notification log by [`nflog_key`].
    pub nflog: Vec<(String, NflogEntry)>,
}

/// What changed since the last [`Engine::take_changes`], for the store to write. The store writes a
/// posted alert through to its bucket with it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Changes {
    /// Alerts new or changed (an incident's alert once however many revisions came in between).
    pub alerts: Vec<Alert>,
    /// Alerts forgotten (resolved longer than `retain_resolved`).
    pub forgotten: Vec<Alert>,
    /// Notification log entries forgotten (their group gone, older than the retention).
    pub nflog_forgotten: Vec<String>,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.alerts.is_empty() && self.forgotten.is_empty() && self.nflog_forgotten.is_empty()
    }
}

/// One group's decision at a flush: the notifications to send (one per integration of the receiver that
/// gets any of its alerts) and the notification log entry they imply. Both are made durable together before
/// anything is sent; the entry alone when nothing is to be sent (a receiver without integrations).
#[derive(Debug, Clone, PartialEq)]
pub struct Notify {
    /// The log key ([`nflog_key`] of the receiver and the group).
    pub nflog_key: String,
    /// What the receiver is now told about the group.
    pub entry: NflogEntry,
    /// The notifications, with the receiver, Alertmanager's `groupKey` and the alerts.
    pub pending: Vec<Pending>,
}

/// What ending a silence does.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// It ends now: this is it ended, to be stored.
    Ends(Silence),
    /// It had ended already: unchanged.
    Over(Silence),
}

/// The dispatcher's state.
#[derive(Debug)]
pub struct Engine {
    routing: Routing,
    /// The routing's time intervals, compiled, by name.
    intervals: BTreeMap<String, Vec<crate::timeinterval::Interval>>,
    tree: Tree,
    alerts: HashMap<String, Alert>,
    groups: BTreeMap<String, Group>,
    silences: BTreeMap<String, Silence>,
    nflog: HashMap<String, NflogEntry>,
    retain_resolved: Duration,
    nflog_retention: Duration,
    replaying: bool,
    /// Alerts changed since the last [`Engine::take_changes`] (an incident's alert is written once per
    /// tick, however many revisions of it came in meanwhile).
    unsaved: BTreeSet<String>,
    /// Alerts forgotten since then.
    forgotten: BTreeMap<String, Alert>,
    /// Log entries forgotten since then.
    nflog_forgotten: BTreeSet<String>,
    /// Counters.
    pub stats: Stats,
}

/// An alert as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct AlertView<'a> {
    /// The alert.
    #[serde(flatten)]
    pub alert: &'a Alert,
    /// Muted by what.
    pub muted: Muted,
    /// Receivers it routes to.
    pub receivers: Vec<String>,
}

/// Labels and annotations an incident becomes.
pub fn alert_of(inc: &Incident, now: DateTime<Utc>) -> Alert {
    let mut labels = inc.labels.clone();
    labels.insert("alertname".into(), inc.kind.clone());
    labels.insert("kind".into(), inc.kind.clone());
    labels.insert("cluster".into(), inc.cluster.clone());
    labels.insert(
        "severity".into(),
        format!("{:?}", inc.severity).to_lowercase(),
    );
    let mut annotations = BTreeMap::from([("summary".to_string(), inc.summary.clone())]);
    if !inc.evidence.is_empty() {
        let lines: Vec<String> = inc
            .evidence
            .iter()
            .take(5)
            .map(|e| {
                format!(
                    "{} {}: {}",
                    e.cluster_time.format("%H:%M:%SZ"),
                    e.kind,
                    e.summary
                )
            })
            .collect();
        annotations.insert("evidence".into(), lines.join("\n"));
    }
    if inc.status == IncidentStatus::Acknowledged {
        annotations.insert(
            "acknowledged_by".into(),
            inc.acknowledged_by.clone().unwrap_or_default(),
        );
    }
    Alert {
        id: inc.id.clone(),
        labels,
        annotations,
        starts_at: inc.opened_at,
        ends_at: match inc.status {
            IncidentStatus::Resolved => Some(inc.resolved_at.unwrap_or(inc.updated_at)),
            _ => None,
        },
        revision: inc.revision,
        updated_at: now,
        expires_at: None,
        posted: false,
        generator_url: None,
        members: Vec::new(),
        refreshed_at: None,
        explains: inc.explains.iter().map(|d| format!("event:{d}")).collect(),
    }
}

/// The clusters a fleet alert spans, as [`alert_of_fleet`] writes them in its `clusters` annotation;
/// `None` for any other alert.
fn fleet_span(a: &Alert) -> Option<BTreeSet<String>> {
    if a.labels.get("scope").map(String::as_str) != Some("fleet") {
        return None;
    }
    let clusters = a.annotations.get("clusters")?;
    Some(
        clusters
            .split(',')
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect(),
    )
}

/// The alert a fleet incident becomes: labelled `scope="fleet"` with its kind and severity and the
/// labels its members agree on (no `cluster`: it spans several), the members, shared attributes,
/// suspects and what lost clusters take down together in annotations; while it fires, its members' own
/// alerts are muted (see `Engine::muted`).
pub fn alert_of_fleet(f: &FleetIncident, now: DateTime<Utc>) -> Alert {
    let mut labels = f.labels.clone();
    labels.remove("cluster");
    // an event problem's alertname is its reason, as its digests' alerts say it
    labels
        .entry("alertname".into())
        .or_insert_with(|| f.kind.clone());
    labels.insert("kind".into(), f.kind.clone());
    labels.insert("scope".into(), "fleet".into());
    labels.insert(
        "severity".into(),
        format!("{:?}", f.severity).to_lowercase(),
    );
    let members: Vec<String> = f
        .members
        .iter()
        .map(|m| {
            format!(
                "{} ({}): {}",
                m.cluster,
                format!("{:?}", m.status).to_lowercase(),
                m.summary
            )
        })
        .collect();
    let mut annotations = BTreeMap::from([
        ("summary".to_string(), f.summary.clone()),
        ("members".to_string(), members.join("\n")),
        ("clusters".to_string(), f.clusters().join(",")),
    ]);
    if !f.shared.is_empty() {
        let lines: Vec<&str> = f
            .shared
            .iter()
            .take(3)
            .map(|s| s.support.as_str())
            .collect();
        annotations.insert("shared".into(), lines.join("\n"));
    }
    let suspects: Vec<&str> = f
        .suspects
        .iter()
        .filter(|s| s.verdict == SuspectVerdict::Suspect)
        .take(3)
        .map(|s| s.summary.as_str())
        .collect();
    if !suspects.is_empty() {
        annotations.insert("suspects".into(), suspects.join("\n"));
    }
    // whole clusters lost: what they take down together
    if let Some(br) = &f.blast_radius {
        annotations.insert("blast_radius".into(), br.summary.clone());
    }
    Alert {
        id: f.id.clone(),
        labels,
        annotations,
        starts_at: f.opened_at,
        ends_at: match f.status {
            IncidentStatus::Resolved => Some(f.resolved_at.unwrap_or(f.updated_at)),
            _ => None,
        },
        revision: f.revision,
        updated_at: now,
        expires_at: None,
        posted: false,
        generator_url: None,
        // the members' alert ids: an incident's id, an event digest's `event:<id>` (see alert_of_digest)
        members: f
            .members
            .iter()
            .map(|m| {
                if f.kind == "event" {
                    format!("event:{}", m.incident_id)
                } else {
                    m.incident_id.clone()
                }
            })
            .collect(),
        explains: Vec::new(),
        refreshed_at: None,
    }
}

/// The alert a deduplicated event digest becomes (resolving `ttl` after its last refresh).
pub fn alert_of_digest(d: &EventDigest, now: DateTime<Utc>, ttl: Duration) -> Alert {
    let o = &d.object;
    let mut labels = BTreeMap::from([
        ("alertname".to_string(), d.reason.clone()),
        ("kind".to_string(), "event".to_string()),
        ("cluster".to_string(), d.cluster.clone()),
        (
            "severity".to_string(),
            format!("{:?}", d.severity).to_lowercase(),
        ),
        ("object_kind".to_string(), o.kind.clone()),
        ("object".to_string(), o.name.clone()),
    ]);
    if let Some(ns) = &o.namespace {
        labels.insert("namespace".into(), ns.clone());
    }
    let at = match &o.namespace {
        Some(ns) => format!("{}/{ns}/{}", o.kind, o.name),
        None => format!("{}/{}", o.kind, o.name),
    };
    let annotations = BTreeMap::from([
        (
            "summary".to_string(),
            format!("{} {at}: {} (×{})", d.reason, d.message, d.count),
        ),
        ("count".to_string(), d.count.to_string()),
        ("last_seen".to_string(), d.last_seen.to_rfc3339()),
    ]);
    Alert {
        id: format!("event:{}", d.id),
        labels,
        annotations,
        starts_at: d.first_seen,
        ends_at: None,
        revision: d.count,
        updated_at: now,
        expires_at: Some(now + ttl),
        posted: false,
        generator_url: None,
        members: Vec::new(),
        refreshed_at: None,
        explains: Vec::new(),
    }
}

#[derive(Serialize)]
struct TemplateAlert<'a> {
    status: &'static str,
    labels: &'a BTreeMap<String, String>,
    annotations: &'a BTreeMap<String, String>,
    starts_at: String,
    ends_at: Option<String>,
}

/// The labels (or annotations) every map shares.
pub(crate) fn common<'a>(
    maps: impl Iterator<Item = &'a BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    let mut out: Option<BTreeMap<String, String>> = None;
    for m in maps {
        out = Some(match out {
            None => m.clone(),
            Some(c) => c.into_iter().filter(|(k, v)| m.get(k) == Some(v)).collect(),
        });
    }
    out.unwrap_or_default()
}

impl Engine {
    /// The dispatcher on what the store held: alerts, silences and the notification log come back, and the
    /// groups are rebuilt (a group already notified waits out its group_interval since then).
    pub fn new(
        routing: Routing,
        retain_resolved: std::time::Duration,
        held: Snapshot,
        now: DateTime<Utc>,
    ) -> Engine {
        let tree = Tree::new(&routing.route);
        let intervals = routing.intervals();
        let mut e = Engine {
            intervals,
            alerts: held.alerts.into_iter().map(|a| (a.id.clone(), a)).collect(),
            silences: held
                .silences
                .into_iter()
                .map(|s| (s.id.clone(), s))
                .collect(),
            nflog: held.nflog.into_iter().collect(),
            routing,
            tree,
            groups: BTreeMap::new(),
            retain_resolved: Duration::from_std(retain_resolved).unwrap_or(Duration::hours(1)),
            nflog_retention: Duration::hours(120),
            replaying: false,
            unsaved: BTreeSet::new(),
            forgotten: BTreeMap::new(),
            nflog_forgotten: BTreeSet::new(),
            stats: Stats::default(),
        };
        let alerts: Vec<Alert> = e.alerts.values().cloned().collect();
        for a in &alerts {
            e.place(a, now);
        }
        e
    }

    /// Forgets notification log entries this long after they were written, once their group is gone
    /// (Alertmanager's `--data.retention`).
    pub fn with_nflog_retention(mut self, retention: std::time::Duration) -> Engine {
        self.nflog_retention = Duration::from_std(retention).unwrap_or(Duration::hours(120));
        self
    }

    /// While replaying the incidents after a restore, groups are filled but not flushed: a group is judged
    /// against the restored notification log only once it holds the latest state of its alerts, so an
    /// intermediate state of the replay (firing again, before its later resolution) is never notified.
    pub fn set_replaying(&mut self, replaying: bool) {
        self.replaying = replaying;
    }

    /// Whether a replay is under way.
    pub fn replaying(&self) -> bool {
        self.replaying
    }

    /// The routing in force.
    pub fn routing(&self) -> &Routing {
        &self.routing
    }

    fn place(&mut self, a: &Alert, now: DateTime<Utc>) {
        for node in self.tree.matches(&a.labels) {
            let key = self.tree.group_id(node, &a.labels, &a.id);
            let n = self.tree.node(node);
            let (wait, interval) = (
                Duration::from_std(n.group_wait).unwrap_or_default(),
                Duration::from_std(n.group_interval).unwrap_or_default(),
            );
            // as in Alertmanager, a posted alert that started longer than group_wait ago does not wait
            // again (a Prometheus alert whose `for` is over): its group's first notification is due now
            let first = if a.posted && a.starts_at + wait < now {
                now
            } else {
                now + wait
            };
            let g = match self.groups.entry(key) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    let grouped = self.tree.group_of(node, &a.labels, &a.id);
                    let last = self
                        .nflog
                        .get(&nflog_key(&n.receiver, v.key()))
                        .and_then(|e| e.at);
                    v.insert(Group {
                        node,
                        group_key: grouped.group_key,
                        labels: grouped.labels,
                        alerts: BTreeSet::new(),
                        phase: match last {
                            // notified before (a restart): the next flush comes group_interval after
                            Some(at) => Phase::Flushed((at + interval).max(now)),
                            None => Phase::Waiting(first),
                        },
                    })
                }
            };
            if let Phase::Waiting(due) = &mut g.phase {
                *due = (*due).min(first);
            }
            if !g.alerts.contains(&a.id) {
                g.alerts.insert(a.id.clone());
            }
        }
    }

    /// Takes in one incident change. Older revisions than the one held are ignored (redeliveries).
    pub fn on_incident(&mut self, inc: &Incident, now: DateTime<Utc>) -> Taken {
        self.stats.incidents_in += 1;
        self.upsert(alert_of(inc, now), now)
    }

    /// Takes in one fleet incident change. Its members' alerts are muted while it fires (unless the
    /// routing file says `mute_fleet_members: false`); a member that joins later is muted from then on.
    pub fn on_fleet_incident(&mut self, f: &FleetIncident, now: DateTime<Utc>) -> Taken {
        self.stats.incidents_in += 1;
        self.upsert(alert_of_fleet(f, now), now)
    }

    /// Takes in one event digest (the caller has checked its severity), stored on the stream at
    /// `stored_at`: its alert resolves `ttl` after that, so a digest replayed after its time arrives
    /// already resolved.
    pub fn on_digest(
        &mut self,
        d: &EventDigest,
        stored_at: DateTime<Utc>,
        now: DateTime<Utc>,
        ttl: std::time::Duration,
    ) -> Taken {
        self.stats.incidents_in += 1;
        let ttl = Duration::from_std(ttl).unwrap_or(Duration::hours(1));
        let mut alert = alert_of_digest(d, now, ttl);
        alert.refreshed_at = Some(stored_at.min(now));
        // resolved with what held it: what the problem did until then was that incident's or is over (a
        // refresh that comes after it resolved may still be of then, a redelivery counts nothing new); a
        // later occurrence is a new episode
        if let Some(old) = self.alerts.get(&alert.id)
            && old.annotations.contains_key(RESOLVED_WITH)
            && (d.count <= old.revision || old.ends_at.is_some_and(|end| d.last_seen <= end))
        {
            self.stats.stale_ignored += 1;
            return Taken::Stale;
        }
        let expires = stored_at.min(now) + ttl;
        alert.expires_at = Some(expires);
        if expires <= now {
            alert.ends_at = Some(expires);
        }
        // an event alert that expired and comes back is a new episode: it fires again
        if let Some(old) = self.alerts.get(&alert.id)
            && old.ends_at.is_some()
            && old.revision < alert.revision
        {
            alert.starts_at = alert.starts_at.max(old.ends_at.unwrap_or(alert.starts_at));
        }
        self.upsert(alert, now)
    }

    /// Takes in one alert posted to `POST /api/v2/alerts` (its id is its fingerprint, `posted` is set;
    /// a firing one carries in `expires_at` when it resolves unless posted again). As in Alertmanager, a
    /// re-post that overlaps the alert held continues it (keeping the earlier start); one that starts
    /// after the held alert resolved is a new episode. Re-posts of an alert already resolved at that same
    /// time change nothing.
    pub fn on_posted(&mut self, mut alert: Alert, now: DateTime<Utc>) -> Taken {
        if let Some(old) = self.alerts.get(&alert.id) {
            if old.ends_at.is_some()
                && old.ends_at == alert.ends_at
                && old.annotations == alert.annotations
            {
                return Taken::Unchanged;
            }
            let old_end = old.ends_at.or(old.expires_at);
            if old_end.is_none_or(|end| alert.starts_at <= end) {
                alert.starts_at = alert.starts_at.min(old.starts_at);
            }
            alert.revision = old.revision + 1;
        }
        self.upsert(alert, now)
    }

    fn upsert(&mut self, alert: Alert, now: DateTime<Utc>) -> Taken {
        if let Some(old) = self.alerts.get(&alert.id)
            && (old.revision > alert.revision
                || (old.revision == alert.revision && old.ends_at == alert.ends_at))
        {
            self.stats.stale_ignored += 1;
            return Taken::Stale;
        }
        self.changed(&alert.id);
        self.place(&alert, now);
        let holds = !alert.explains.is_empty() || !alert.members.is_empty();
        let ended = (!alert.firing() && holds).then(|| alert.clone());
        self.alerts.insert(alert.id.clone(), alert);
        if let Some(by) = ended {
            self.end_held(&by, now);
        }
        Taken::Placed
    }

    /// An alert resolved that held event alerts (muted for it): they resolve with it, marked
    /// `resolved_with` it — events never say "over", and left to their TTL they would fire, unmuted, for
    /// what is over. An incident's alert ends those it accounted for (`explains`) whose last occurrence
    /// came before its end (in their cluster's clock), at that end: what the problem did until then was
    /// the incident's. An event fleet alert (its members quiet: the correlator resolves it when they
    /// stopped) ends its members at their last occurrence. One that another firing incident still
    /// accounts for (or, for a fleet alert's member, another firing fleet alert lists) stays. A digest of
    /// an occurrence after that end fires again (see [`Engine::on_digest`]).
    fn end_held(&mut self, by: &Alert, now: DateTime<Utc>) {
        let explained = self.routing.mute_explained_events;
        let members = self.routing.mute_fleet_members;
        let by_end = by.ends_at.unwrap_or(now);
        let held = by
            .explains
            .iter()
            .filter(|_| explained)
            .map(|id| (id, true))
            .chain(by.members.iter().filter(|_| members).map(|id| (id, false)));
        let mut ended = Vec::new();
        for (id, accounted) in held {
            let Some(a) = self.alerts.get(id) else {
                continue;
            };
            if !a.firing() || a.expires_at.is_none() || a.posted {
                continue;
            }
            let Some(last_seen) = a
                .annotations
                .get("last_seen")
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc))
            else {
                continue;
            };
            // what came after the end is not the holder's: an occurrence after the incident's end; a
            // member refreshed after its fleet alert's end (a resolution read again)
            if (accounted && last_seen > by_end)
                || (!accounted && a.refreshed_at.is_some_and(|t| t > by_end))
            {
                continue;
            }
            // (an incident's end does not wait for the fleet alert its warning is a member of: that
            // one is muted for what accounts for its members)
            let still = self.alerts.values().any(|x| {
                x.firing()
                    && x.id != by.id
                    && (x.explains.contains(id) || (!accounted && x.members.contains(id)))
            });
            if still {
                continue;
            }
            let mut a = a.clone();
            // (a member at its last occurrence, in its cluster's clock: no later than its fleet
            // alert's end, should that clock run ahead)
            let end = if accounted {
                by_end
            } else {
                last_seen.min(by_end)
            };
            a.ends_at = Some(end.max(a.starts_at));
            a.annotations.insert(RESOLVED_WITH.into(), by.id.clone());
            a.updated_at = now;
            ended.push(a);
        }
        for a in ended {
            self.changed(&a.id);
            self.place(&a, now);
            self.alerts.insert(a.id.clone(), a);
        }
    }

    fn changed(&mut self, id: &str) {
        self.forgotten.remove(id);
        self.unsaved.insert(id.to_string());
    }

    /// What changed since the last call, for the store (not flushed: the shell flushes it before it acks
    /// what it consumed, answers a post, or sends).
    pub fn take_changes(&mut self) -> Changes {
        let unsaved = std::mem::take(&mut self.unsaved);
        Changes {
            alerts: unsaved
                .iter()
                .filter_map(|id| self.alerts.get(id).cloned())
                .collect(),
            forgotten: std::mem::take(&mut self.forgotten).into_values().collect(),
            nflog_forgotten: std::mem::take(&mut self.nflog_forgotten)
                .into_iter()
                .collect(),
        }
    }

    /// Takes back changes the store could not write: they come again with the next
    /// [`Engine::take_changes`] (unless changed again meanwhile: then as they are then).
    pub fn unsaved(&mut self, c: Changes) {
        for a in c.alerts {
            if !self.forgotten.contains_key(&a.id) {
                self.unsaved.insert(a.id);
            }
        }
        for a in c.forgotten {
            if !self.alerts.contains_key(&a.id) {
                self.forgotten.insert(a.id.clone(), a);
            }
        }
        for k in c.nflog_forgotten {
            if !self.nflog.contains_key(&k) {
                self.nflog_forgotten.insert(k);
            }
        }
    }

    fn inhibition_index(&self, now: DateTime<Utc>) -> Index {
        // member alert → the firing fleet alerts that list it; event alert → the firing incident alerts
        // that account for it
        let mut fleet: HashMap<String, Vec<String>> = HashMap::new();
        let mut explained: HashMap<String, Vec<String>> = HashMap::new();
        for a in self.alerts.values().filter(|a| a.firing()) {
            for m in &a.members {
                fleet.entry(m.clone()).or_default().push(a.id.clone());
            }
            for d in &a.explains {
                explained.entry(d.clone()).or_default().push(a.id.clone());
            }
        }
        let rules = self
            .routing
            .inhibit_rules
            .iter()
            .map(|r| {
                let mut idx: HashMap<Vec<String>, Vec<String>> = HashMap::new();
                for a in self.alerts.values().filter(|a| a.firing()) {
                    if all_match(&r.source_matchers, &a.labels) {
                        let key = r
                            .equal
                            .iter()
                            .map(|l| a.labels.get(l).cloned().unwrap_or_default())
                            .collect();
                        idx.entry(key).or_default().push(a.id.clone());
                    }
                }
                idx
            })
            .collect();
        let accounting = self
            .routing
            .accounts_for
            .iter()
            .map(|r| {
                let hold = Duration::from_std(r.hold).unwrap_or(Duration::zero());
                let mut by_cluster: HashMap<String, Vec<Accounting>> = HashMap::new();
                // the cluster incidents of that kind (not posted alerts, not fleet alerts), firing or
                // ended within the hold — counted from when the router learned of the end, too (the end
                // is the cluster's time of it: a clock behind, or news of it late, would use up the hold)
                let sources = self.alerts.values().filter(|a| {
                    !a.posted
                        && a.members.is_empty()
                        && a.labels.get("kind") == Some(&r.incident)
                        && a.ends_at.is_none_or(|end| {
                            end.max(a.updated_at)
                                .checked_add_signed(hold)
                                .is_none_or(|until| now < until)
                        })
                });
                for a in sources {
                    let Some(cluster) = a.labels.get("cluster") else {
                        continue;
                    };
                    by_cluster
                        .entry(cluster.clone())
                        .or_default()
                        .push(Accounting {
                            id: a.id.clone(),
                            severity: severity_rank(&a.labels),
                            ended: a.ends_at,
                        });
                }
                by_cluster
            })
            .collect();
        Index {
            rules,
            fleet,
            explained,
            accounting,
        }
    }

    /// A fleet alert whose members the router holds are each accounted for by an incident (firing, or
    /// resolved with it: see [`Engine::end_held`]) — the same coredns pods failing readiness on the
    /// clusters whose DNS fails — is muted by what accounts for them: their fleet alert where they have
    /// one (the `dns-failure` one), else the incidents' own. Empty: not muted so.
    fn explained_fleet(&self, a: &Alert, index: &Index) -> Vec<String> {
        let mut by = BTreeSet::new();
        let mut held = 0;
        for m in &a.members {
            let Some(member) = self.alerts.get(m) else {
                continue;
            };
            held += 1;
            // (resolved with an incident that accounted for it: not with another fleet alert)
            if let Some(with) = member.annotations.get(RESOLVED_WITH)
                && !member.firing()
                && self.alerts.get(with).is_some_and(|r| r.members.is_empty())
            {
                by.insert(with.clone());
                continue;
            }
            if !member.firing() {
                continue;
            }
            let Some(incidents) = index.explained.get(m) else {
                // one member is a problem of its own: the fleet alert says so
                return Vec::new();
            };
            for i in incidents {
                match index.fleet.get(i) {
                    Some(fleet) => by.extend(fleet.iter().filter(|f| **f != a.id).cloned()),
                    None => {
                        by.insert(i.clone());
                    }
                }
            }
        }
        if held == 0 {
            return Vec::new();
        }
        by.into_iter().collect()
    }

    /// The incidents that account for a firing posted alert on its cluster (`Routing::accounts_for`): those
    /// firing, and those ended within their hold if the alert fired before the end; each with the fleet
    /// alerts that list it (which the problem pages as). An alert more severe than the incident, or of no
    /// known severity, is never muted so.
    fn accounted_by(&self, a: &Alert, index: &Index) -> Vec<String> {
        let Some(cluster) = a.labels.get("cluster") else {
            return Vec::new();
        };
        let severity = severity_rank(&a.labels);
        let mut by = BTreeSet::new();
        for (rule, idx) in self.routing.accounts_for.iter().zip(&index.accounting) {
            let Some(sources) = idx.get(cluster) else {
                continue;
            };
            if !all_match(&rule.alerts, &a.labels) {
                continue;
            }
            for src in sources {
                // (an alert of no known severity, or more severe than the incident, pages)
                let milder = match (src.severity, severity) {
                    (Some(s), Some(t)) => s < t,
                    _ => true,
                };
                if milder || src.ended.is_some_and(|end| a.starts_at > end) {
                    continue;
                }
                by.extend(index.fleet.get(&src.id).into_iter().flatten().cloned());
                by.insert(src.id.clone());
            }
        }
        by.into_iter().collect()
    }

    fn muted(&self, a: &Alert, index: &Index, now: DateTime<Utc>) -> Muted {
        let mut m = Muted {
            silenced_by: self
                .silences
                .values()
                .filter(|s| s.silences(&a.labels, now))
                .map(|s| s.id.clone())
                .collect(),
            inhibited_by: Vec::new(),
        };
        if a.firing() {
            if self.routing.mute_fleet_members
                && let Some(fleet) = index.fleet.get(&a.id)
            {
                m.inhibited_by.extend(fleet.iter().cloned());
            }
            if self.routing.mute_explained_events {
                if let Some(by) = index.explained.get(&a.id) {
                    m.inhibited_by.extend(by.iter().cloned());
                }
                m.inhibited_by.extend(self.explained_fleet(a, index));
            }
            if a.posted {
                m.inhibited_by.extend(self.accounted_by(a, index));
            }
            for (rule, idx) in self.routing.inhibit_rules.iter().zip(&index.rules) {
                if !all_match(&rule.target_matchers, &a.labels) {
                    continue;
                }
                let key: Vec<String> = rule
                    .equal
                    .iter()
                    .map(|l| a.labels.get(l).cloned().unwrap_or_default())
                    .collect();
                if let Some(src) = idx.get(&key) {
                    m.inhibited_by
                        .extend(src.iter().filter(|s| **s != a.id).cloned());
                }
            }
            // each once, in the order found (an incident may mute it by more than one way)
            let mut seen = BTreeSet::new();
            m.inhibited_by.retain(|id| seen.insert(id.clone()));
        }
        m
    }

    /// Flushes the groups that are due at `now` and returns what they decided (the notification log is
    /// already updated: the shell makes the decisions durable before it sends them); then forgets
    /// long-resolved alerts and resolves expired event alerts (see [`Engine::take_changes`]). Nothing while
    /// replaying.
    pub fn tick(&mut self, now: DateTime<Utc>) -> Vec<Notify> {
        if self.replaying {
            return Vec::new();
        }
        let due: Vec<String> = self
            .groups
            .iter()
            .filter(|(_, g)| g.phase.due() <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let mut decided = Vec::new();
        if !due.is_empty() {
            let index = self.inhibition_index(now);
            for key in due {
                decided.extend(self.flush(&key, &index, now));
            }
        }
        self.gc(now);
        self.expire(now);
        decided
    }

    /// Resolves event alerts nobody refreshed within their TTL.
    fn expire(&mut self, now: DateTime<Utc>) {
        let due: Vec<Alert> = self
            .alerts
            .values()
            .filter(|a| a.firing() && a.expires_at.is_some_and(|t| t <= now))
            .cloned()
            .collect();
        for mut a in due {
            a.ends_at = a.expires_at;
            a.updated_at = now;
            self.changed(&a.id);
            self.place(&a, now);
            self.alerts.insert(a.id.clone(), a);
        }
    }

    fn flush(&mut self, key: &str, index: &Index, now: DateTime<Utc>) -> Option<Notify> {
        let g = self.groups.get(key)?.clone();
        let node = self.tree.node(g.node).clone();
        let receiver = self.routing.receiver(&node.receiver).cloned();
        let mut firing = Vec::new();
        let mut resolved = Vec::new();
        let mut resolved_now = Vec::new();
        for id in &g.alerts {
            let Some(a) = self.alerts.get(id) else {
                resolved_now.push(id.clone());
                continue;
            };
            if !a.firing() {
                resolved_now.push(id.clone());
            }
            if self.muted(a, index, now).is_muted() {
                continue;
            }
            if a.firing() {
                firing.push(a);
            } else {
                resolved.push(a);
            }
        }
        let nkey = nflog_key(&node.receiver, key);
        let entry = self.nflog.get(&nkey);
        let send_resolved = receiver.as_ref().is_some_and(wants_resolved);
        let firing_ids: BTreeSet<String> = firing.iter().map(|a| a.id.clone()).collect();
        let resolved_ids: BTreeSet<String> = resolved.iter().map(|a| a.id.clone()).collect();
        // the clusters each firing fleet alert spans: one more than was notified is news (the failure
        // spread), though the new member's own alert is muted
        let spans: BTreeMap<String, BTreeSet<String>> = if self.routing.notify_fleet_spread {
            firing
                .iter()
                .filter_map(|a| Some((a.id.clone(), fleet_span(a)?)))
                .collect()
        } else {
            BTreeMap::new()
        };
        let spread = |e: &NflogEntry| {
            spans
                .iter()
                .any(|(id, now)| e.spans.get(id).is_some_and(|then| !now.is_subset(then)))
        };
        let repeat = Duration::from_std(node.repeat_interval).unwrap_or(Duration::hours(4));
        // as in Alertmanager, a group whose every alert is muted (silenced or inhibited), or whose route
        // is muted by a time interval now, is not judged at all: its log entry stays as it was, so when the
        // mute ends what was notified is not notified again (and what was not, is)
        let all_muted = (firing.is_empty() && resolved.is_empty()) || self.time_muted(&node, now);
        let needs = match entry {
            _ if all_muted => false,
            None => !firing_ids.is_empty(),
            Some(e) if !firing_ids.is_subset(&e.firing) || spread(e) => true,
            Some(e) if firing_ids.is_empty() => !e.firing.is_empty(),
            Some(e) if send_resolved && !resolved_ids.is_subset(&e.resolved) => true,
            Some(e) => e.at.is_none_or(|at| at + repeat <= now),
        };
        let mut decided = None;
        if needs {
            let entry = NflogEntry {
                firing: firing_ids,
                resolved: resolved_ids,
                at: Some(now),
                spans,
            };
            let pending = match &receiver {
                Some(r) => {
                    let hold = (node.repeat_interval + node.group_interval).as_secs();
                    self.notifications(r, key, &g, (&firing, &resolved), now, hold)
                }
                None => Vec::new(),
            };
            if !pending.is_empty() {
                self.stats.notifications += 1;
            }
            self.nflog.insert(nkey.clone(), entry.clone());
            self.nflog_forgotten.remove(&nkey);
            decided = Some(Notify {
                nflog_key: nkey,
                entry,
                pending,
            });
        }
        // resolved alerts have been dealt with: they leave the group
        let interval = Duration::from_std(node.group_interval).unwrap_or(Duration::minutes(5));
        let g = self.groups.get_mut(key).expect("group present");
        for id in &resolved_now {
            g.alerts.remove(id);
        }
        g.phase = Phase::Flushed(now + interval);
        if g.alerts.is_empty() {
            self.groups.remove(key);
        }
        decided
    }

    /// Whether a route sends nothing at `now`: one of its mute time intervals holds, or it has active
    /// ones and none holds.
    fn time_muted(&self, node: &crate::route::Node, now: DateTime<Utc>) -> bool {
        let holds = |name: &String| {
            self.intervals
                .get(name)
                .is_some_and(|v| v.iter().any(|i| i.contains(now)))
        };
        node.mute_time_intervals.iter().any(holds)
            || (!node.active_time_intervals.is_empty()
                && !node.active_time_intervals.iter().any(holds))
    }

    fn notifications(
        &self,
        r: &Receiver,
        key: &str,
        g: &Group,
        (firing, resolved): (&[&Alert], &[&Alert]),
        now: DateTime<Utc>,
        hold_secs: u64,
    ) -> Vec<Pending> {
        let group_labels = &g.labels;
        let status = if firing.is_empty() {
            "resolved"
        } else {
            "firing"
        };
        // in Alertmanager's order: by `job`, then `instance`, then the label sets
        let mut all: Vec<&Alert> = firing.iter().chain(resolved).copied().collect();
        all.sort_by(|a, b| alertmanager_order(&a.labels, &b.labels));
        fn tpl<'a>(a: &&'a Alert) -> TemplateAlert<'a> {
            TemplateAlert {
                status: if a.firing() { "firing" } else { "resolved" },
                labels: &a.labels,
                annotations: &a.annotations,
                starts_at: a.starts_at.to_rfc3339(),
                ends_at: a.ends_at.map(|t| t.to_rfc3339()),
            }
        }
        let ctx = serde_json::json!({
            "receiver": r.name,
            "status": status,
            "group_labels": group_labels,
            "common_labels": common(all.iter().map(|a| &a.labels)),
            "common_annotations": common(all.iter().map(|a| &a.annotations)),
            "alerts": all.iter().map(tpl).collect::<Vec<_>>(),
            "firing": firing.iter().map(tpl).collect::<Vec<_>>(),
            "resolved": resolved.iter().map(tpl).collect::<Vec<_>>(),
        });
        let (title, text) = template::render(
            r.templates.as_ref().unwrap_or(&self.routing.templates),
            &ctx,
        );
        let join = |v: &[&Alert]| {
            v.iter()
                .map(|a| a.id.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        let id = stable_id(&[
            &r.name,
            key,
            &join(firing),
            &join(resolved),
            &now.to_rfc3339(),
        ]);
        let notified = |a: &&Alert| NotifiedAlert {
            incident_id: a.id.clone(),
            state: if a.firing() {
                AlertState::Firing
            } else {
                AlertState::Resolved
            },
            labels: a.labels.clone(),
            annotations: a.annotations.clone(),
            starts_at: a.starts_at,
            ends_at: a.ends_at,
        };
        let full = Notification {
            id,
            receiver: r.name.clone(),
            group_key: g.group_key.clone(),
            state: if firing.is_empty() {
                AlertState::Resolved
            } else {
                AlertState::Firing
            },
            title,
            text,
            alerts: all.iter().map(notified).collect(),
        };
        let mut out = Vec::new();
        let mut push = |integration: &str, index: usize, send_resolved: bool| {
            let mut n = full.clone();
            if !send_resolved {
                n.alerts.retain(|a| a.state == AlertState::Firing);
            }
            if n.alerts.is_empty() {
                return;
            }
            out.push(Pending {
                notification: n,
                group_labels: group_labels.clone(),
                integration: integration.into(),
                index,
                attempts: 0,
                next_attempt: now,
                created_at: now,
                last_error: None,
                hold_secs,
            });
        };
        for (i, w) in r.webhook_configs.iter().enumerate() {
            push("webhook", i, w.send_resolved);
        }
        for i in 0..r.alertmanager_configs.len() {
            push("alertmanager", i, true);
        }
        for (i, s) in r.slack_configs.iter().enumerate() {
            push("slack", i, s.send_resolved);
        }
        for (i, n) in r.nats_configs.iter().enumerate() {
            push("nats", i, n.send_resolved);
        }
        out
    }

    fn gc(&mut self, now: DateTime<Utc>) {
        // long resolved first (cheap, and usually none): the set of grouped alerts is built only then (it
        // was most of the router's CPU when built every tick)
        let mut old: Vec<String> = self
            .alerts
            .values()
            .filter(|a| a.ends_at.is_some_and(|t| t + self.retain_resolved < now))
            .map(|a| a.id.clone())
            .collect();
        if !old.is_empty() {
            let grouped: BTreeSet<&String> = self.groups.values().flat_map(|g| &g.alerts).collect();
            old.retain(|id| !grouped.contains(id));
        }
        for id in old {
            if let Some(a) = self.alerts.remove(&id) {
                self.unsaved.remove(&id);
                self.forgotten.insert(id, a);
            }
        }
        // log entries of groups long gone: the bucket drops them after the same max age
        let stale: Vec<String> = self
            .nflog
            .iter()
            .filter(|(k, e)| {
                e.at.is_none_or(|at| at + self.nflog_retention < now)
                    && k.split_once('\u{0}')
                        .is_none_or(|(_, group)| !self.groups.contains_key(group))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            self.nflog.remove(&k);
            self.nflog_forgotten.insert(k);
        }
    }

    /// Every alert, with what mutes it and where it routes.
    pub fn alerts(&self, now: DateTime<Utc>) -> Vec<AlertView<'_>> {
        let index = self.inhibition_index(now);
        let mut v: Vec<AlertView<'_>> = self
            .alerts
            .values()
            .map(|a| AlertView {
                alert: a,
                muted: self.muted(a, &index, now),
                receivers: self
                    .tree
                    .matches(&a.labels)
                    .into_iter()
                    .map(|i| self.tree.node(i).receiver.clone())
                    .collect(),
            })
            .collect();
        v.sort_by(|a, b| {
            b.alert
                .starts_at
                .cmp(&a.alert.starts_at)
                .then(a.alert.id.cmp(&b.alert.id))
        });
        v
    }

    /// Every silence.
    pub fn silences(&self) -> impl Iterator<Item = &Silence> {
        self.silences.values()
    }

    /// Adds or replaces a silence (the shell has stored it).
    pub fn set_silence(&mut self, s: Silence) {
        self.silences.insert(s.id.clone(), s);
    }

    /// A silence ended at `now` (for the shell to store and then [`Engine::set_silence`]), or `None` if
    /// there is no such silence.
    pub fn ending(&self, id: &str, now: DateTime<Utc>) -> Option<Ending> {
        let mut s = self.silences.get(id).cloned()?;
        if s.ends_at <= now {
            return Some(Ending::Over(s));
        }
        s.ends_at = now;
        s.starts_at = s.starts_at.min(now);
        s.updated_at = now;
        Some(Ending::Ends(s))
    }

    /// Every group: its labels, its receiver and its alerts (Alertmanager's `/api/v2/alerts/groups`).
    pub fn group_views(
        &self,
        now: DateTime<Utc>,
    ) -> Vec<(&BTreeMap<String, String>, String, Vec<AlertView<'_>>)> {
        let views: HashMap<&str, AlertView<'_>> = self
            .alerts(now)
            .into_iter()
            .map(|v| (v.alert.id.as_str(), v))
            .collect();
        let mut out: Vec<_> = self
            .groups
            .values()
            .map(|g| {
                let alerts = g
                    .alerts
                    .iter()
                    .filter_map(|id| views.get(id.as_str()).cloned())
                    .collect();
                (&g.labels, self.tree.node(g.node).receiver.clone(), alerts)
            })
            .collect();
        out.sort_by(|a, b| (&a.1, a.0).cmp(&(&b.1, b.0)));
        out
    }

    /// Groups and their alert counts (for the API and tests).
    pub fn groups(&self) -> Vec<(String, String, usize)> {
        self.groups
            .iter()
            .map(|(k, g)| {
                (
                    k.clone(),
                    self.tree.node(g.node).receiver.clone(),
                    g.alerts.len(),
                )
            })
            .collect()
    }
}

/// How Alertmanager orders the alerts of a notification (`types.AlertSlice`): by the `job` label, then
/// `instance` (an alert that has it before one that doesn't), then the label sets — fewer labels first,
/// then the first differing value in label-name order.
fn alertmanager_order(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Ordering {
    for k in ["job", "instance"] {
        match (a.get(k), b.get(k)) {
            (None, None) => continue,
            (Some(_), None) => return Ordering::Less,
            (None, Some(_)) => return Ordering::Greater,
            (Some(x), Some(y)) if x != y => return x.cmp(y),
            _ => {}
        }
    }
    if a.len() != b.len() {
        return a.len().cmp(&b.len());
    }
    let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for n in names {
        match (a.get(n), b.get(n)) {
            (None, _) => return Ordering::Less,
            (_, None) => return Ordering::Greater,
            (Some(x), Some(y)) if x != y => return x.cmp(y),
            _ => {}
        }
    }
    Ordering::Equal
}

fn wants_resolved(r: &Receiver) -> bool {
    r.webhook_configs.iter().any(|w| w.send_resolved)
        || !r.alertmanager_configs.is_empty()
        || r.slack_configs.iter().any(|s| s.send_resolved)
        || r.nats_configs.iter().any(|n| n.send_resolved)
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
