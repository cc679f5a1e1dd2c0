//! Fleet judgement: one failure across clusters is one fleet incident. Cluster incidents of one kind that
//! open within [`FleetRule::window`] of each other on [`FleetRule::min_clusters`] or more clusters are
//! linked as the members of a [`FleetIncident`]; later incidents of that kind join it while it is open; a
//! member leaves when its incident resolves (or its cluster goes silent for good), and the fleet incident
//! resolves when its last member has. For each, it ranks what the failing clusters share that the healthy
//! ones don't (version, CNI, ingress controller, CoreDNS, device plugin and driver, registry labels; for
//! a problem of one workload, what its failing copies run that its healthy ones don't: image, resources,
//! env, pod annotations) and weighs the changes that reached the failing clusters shortly before against
//! the healthy ones: a change seen as often on healthy clusters, or one the failing clusters make that
//! often anyway, is ordinary churn, not a suspect.
//!
//! Plain data and pure functions over the machine's view of the fleet; [`crate::machine::Machine`] calls
//! it after every change of a cluster incident and on its ticks, and emits what changed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Duration, Utc};
use multipilot_schemas::payload::{
    BlastRadius, FleetIncident, FleetMember, Incident, IncidentStatus, ObjectRef, ReleaseRef,
    Severity, SharedAttribute, Suspect, SuspectVerdict,
};
use multipilot_schemas::stable_id;

use crate::blast;
use crate::consistency;
use crate::dedup::Record;
use crate::mask;
use crate::rules::FleetRule;
use crate::state::{ClusterState, Delta};

/// The machine's view of the fleet a judgement reads.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    /// Every cluster the correlator knows.
    pub clusters: &'a BTreeMap<String, ClusterState>,
    /// Every cluster incident, by key.
    pub incidents: &'a BTreeMap<String, Incident>,
    /// How many objects of a change kind ([`is_change_kind`]) each cluster holds, by cluster.
    pub changeable: &'a BTreeMap<String, usize>,
    /// Each cluster's workloads' compared settings and images, keyed `<kind> <ns>/<name>`
    /// ([`crate::consistency::workload_settings`]).
    pub workloads: &'a BTreeMap<String, BTreeMap<String, BTreeMap<String, String>>>,
    /// Every cluster's objects, keyed `kind/ns/name` (what a lost cluster takes down: [`blast`]).
    pub specs: &'a BTreeMap<String, BTreeMap<String, String>>,
    /// The incident kinds that make a whole cluster unusable (the rules' inhibition roots).
    pub roots: &'a [String],
}

impl View<'_> {
    /// The clusters with an open incident of a kind that makes the whole cluster unusable.
    pub fn down(&self) -> BTreeSet<&str> {
        self.incidents
            .values()
            .filter(|i| i.status != IncidentStatus::Resolved && self.roots.contains(&i.kind))
            .map(|i| i.cluster.as_str())
            .collect()
    }
}

/// Whether a spec change of this kind is a change someone made (Pods, ReplicaSets, EndpointSlices and
/// Secrets change as a consequence, or too often to say anything).
pub fn is_change_kind(kind: &str) -> bool {
    !matches!(kind, "Pod" | "ReplicaSet" | "Secret" | "EndpointSlice")
}

/// How likely an object changes on `cluster` by chance in one lookback: the share of the objects of a
/// change kind it holds that changed in `[from, to]` (at least one object counted, so a cluster whose
/// objects have not arrived yet is a certain churn, never evidence).
/// `touches` and `held` are the cluster's ([`touches`], [`held`]).
fn churn(touches: &[Touch<'_>], held: usize, from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    let changed: BTreeSet<String> = touches
        .iter()
        .filter(|t| t.release().is_none() && t.at >= from && t.at <= to)
        .map(Touch::key)
        .collect();
    changed.len() as f64 / held.max(changed.len()).max(1) as f64
}

/// The objects of a change kind `cluster` holds.
fn held(view: View<'_>, cluster: &str) -> usize {
    view.changeable.get(cluster).copied().unwrap_or(0)
}

/// The coincidences at most expected before an object changed on several failing clusters is named a
/// suspect: the expected number of objects changing on all of them by chance (objects held × the product
/// of each cluster's churn) must stay below this; and the chance that this object, at its own pace, would
/// have changed on all of them anyway ([`Habits::chance`]) too.
const MAX_CHANCE: f64 = 0.2;

/// Below this many healthy clusters, an object's changes on them say too little of whether its change on
/// the failing ones is routine, and its own habit there is weighed ([`Habits`]).
const FEW_HEALTHY: u32 = 4;

/// How often each object changes on one failing cluster anyway: its changes held from before the lookback
/// (what happened in the lookback is what is judged: a bad change applied again and again there is no habit)
/// over the history they came from. Churn is not spread evenly over objects: an application's config or a
/// controller-written object changes every few minutes, and with few or no healthy clusters to compare
/// nothing else shows its change in the lookback to be routine.
struct Habits<'a> {
    /// Changes held from before the lookback, by object.
    counts: HashMap<TouchId<'a>, u32>,
    /// The history before the lookback: from the oldest change held to the lookback's start.
    span: Duration,
}

impl<'a> Habits<'a> {
    fn of(touches: &[Touch<'a>], at: DateTime<Utc>, lookback: Duration) -> Self {
        let start = at - lookback;
        let mut counts: HashMap<TouchId<'a>, u32> = HashMap::new();
        let mut oldest = start;
        for t in touches.iter().filter(|t| t.release().is_none()) {
            oldest = oldest.min(t.at);
            if t.at < start {
                *counts.entry(t.id()).or_default() += 1;
            }
        }
        Habits {
            counts,
            span: start - oldest,
        }
    }

    fn count(&self, id: &TouchId<'_>) -> u32 {
        self.counts.get(id).copied().unwrap_or(0)
    }

    /// The chance that the object changes at least once in a lookback at its pace (Poisson), its pace
    /// counted over the history and one lookback more: a short history says little, and one change in it
    /// is not yet a habit.
    fn chance(&self, id: &TouchId<'_>, lookback: Duration) -> f64 {
        let over = (self.span + lookback).num_seconds().max(1) as f64;
        1.0 - (-(self.count(id) as f64) * lookback.num_seconds() as f64 / over).exp()
    }
}

/// The key of the current fleet incident of a kind.
pub fn key(kind: &str) -> String {
    kind.to_string()
}

/// The key a fleet incident is kept under while current: its kind, or for an event problem
/// [`event_key`] of the problem it carries in its `problem` label.
pub fn key_of(f: &FleetIncident) -> String {
    match f.labels.get("problem") {
        Some(p) if f.kind == EVENT => event_key(p),
        _ => key(&f.kind),
    }
}

/// The kind of a fleet incident of event problems (its members are event digests).
pub const EVENT: &str = "event";

/// The key of the current fleet incident of one event problem (see [`problem`]).
pub fn event_key(problem: &str) -> String {
    format!("{EVENT}/{problem}")
}

/// An event problem without its cluster: involved kind, namespace, masked name, reason, masked message
/// (the dedup fingerprint less the cluster) in the words every release uses and one class for the several
/// messages of one failure ([`mask::fleet_message`]), so the same problem on two clusters, of one release or
/// two, has one id.
pub fn problem(rec: &Record) -> String {
    problem_of(
        &rec.object.kind,
        rec.object.namespace.as_deref().unwrap_or(""),
        &rec.object.name,
        &rec.reason,
        &rec.last_message,
    )
}

/// [`problem`] of an event's parts.
pub fn problem_of(kind: &str, namespace: &str, name: &str, reason: &str, message: &str) -> String {
    stable_id(&[
        kind,
        namespace,
        &mask::mask_name(name),
        reason,
        &mask::fleet_message(message),
    ])
}

/// Where a fleet incident is kept once a newer one of its kind replaced it.
pub fn history_key(kind: &str, id: &str) -> String {
    format!("{kind}#{id}")
}

/// Attribute values above this many per cluster are not compared (labels of a label-happy registry).
const MAX_ATTRIBUTES: usize = 128;
/// Shared attributes and suspects kept per fleet incident.
const MAX_SHARED: usize = 6;
/// Of them, at most this many of the failing workload's settings (a new version may change many at once).
const MAX_WORKLOAD_SHARED: usize = 3;
const MAX_SUSPECTS: usize = 5;
const MAX_COMMON: usize = 3;

/// A cluster's measured clock offset (cluster − hub), whole seconds; 0 under 2 s.
fn skew(view: View<'_>, cluster: &str) -> Duration {
    let est = view
        .clusters
        .get(cluster)
        .map(|c| {
            c.skew_samples
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, f64::max)
        })
        .filter(|s| s.is_finite() && s.abs() >= 2.0)
        .unwrap_or(0.0);
    Duration::milliseconds((est * 1000.0) as i64)
}

/// A time on `cluster`'s clock, on the hub's.
pub fn hub_time(view: View<'_>, cluster: &str, t: DateTime<Utc>) -> DateTime<Utc> {
    t - skew(view, cluster)
}

/// What a cluster is, as `(attribute, value)` pairs, from its facts and registry labels.
pub fn attributes(c: &ClusterState) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(f) = &c.inventory.facts {
        if f.version.major > 0 {
            out.push((
                "kubernetes-version".into(),
                format!("{}.{}", f.version.major, f.version.minor),
            ));
        }
        for (attr, comp) in [
            ("cni", &f.cni),
            ("ingress-controller", &f.ingress_controller),
            ("coredns", &f.coredns),
            ("gpu-device-plugin", &f.gpu_device_plugin),
        ] {
            if let Some(comp) = comp {
                out.push((attr.into(), comp.name.clone()));
                if !comp.version.is_empty() {
                    out.push((attr.into(), format!("{} {}", comp.name, comp.version)));
                }
            }
        }
        let drivers: BTreeSet<&str> = f
            .gpus
            .iter()
            .map(|g| g.driver_version.as_str())
            .filter(|d| !d.is_empty())
            .collect();
        for d in drivers {
            out.push(("gpu-driver".into(), d.to_string()));
        }
        // what its nodes run: each value any of them runs
        let mut software: BTreeSet<(&str, &str)> = BTreeSet::new();
        for n in &f.node_software {
            for (attr, v) in [
                ("node-os", &n.os_image),
                ("kernel", &n.kernel_version),
                ("container-runtime", &n.container_runtime),
            ] {
                if !v.is_empty() {
                    software.insert((attr, v));
                }
            }
        }
        for (attr, v) in software {
            out.push((attr.into(), v.to_string()));
        }
    }
    for (k, v) in &c.labels {
        out.push((format!("label:{k}"), v.clone()));
    }
    // what was rolled out there: each release's (or policy bundle's) revision, and the newest commit
    // of each fleet repository
    let mut commits: BTreeMap<&str, (DateTime<Utc>, &str)> = BTreeMap::new();
    for (name, r) in &c.running {
        let attr = if r.policy { "policy" } else { "release" };
        out.push((format!("{attr}:{name}"), format!("revision {}", r.revision)));
        if let (Some(repo), Some(commit)) = (&r.repo, &r.commit) {
            let newest = commits.entry(repo).or_insert((r.at, commit));
            if r.at > newest.0 {
                *newest = (r.at, commit);
            }
        }
    }
    for (repo, (_, commit)) in commits {
        out.push((format!("gitops:{repo}"), format!("commit {commit}")));
    }
    out.truncate(MAX_ATTRIBUTES);
    out
}

/// Each cluster's [`attributes`] as a set, worked out once for all the fleet incidents judged together
/// (a first start judges hundreds of event problems over the same clusters).
#[derive(Debug, Default)]
pub struct Attributes(HashMap<String, BTreeSet<(String, String)>>);

impl Attributes {
    fn fill(&mut self, view: View<'_>, cluster: &str) {
        if let Some(state) = view.clusters.get(cluster)
            && !self.0.contains_key(cluster)
        {
            let set = attributes(state).into_iter().collect();
            self.0.insert(cluster.to_string(), set);
        }
    }

    /// A filled cluster's attributes; none for a cluster without any.
    fn get(&self, cluster: &str) -> Option<&BTreeSet<(String, String)>> {
        self.0.get(cluster).filter(|a| !a.is_empty())
    }
}

fn phrase(attr: &str, value: &str) -> String {
    let Some((what, name)) = attr.split_once(':') else {
        return format!("run {attr} {value}");
    };
    match what {
        "label" => format!("have {name}={value}"),
        "release" => format!("run release {name} {value}"),
        "policy" => format!("run policy bundle {name} {value}"),
        "gitops" => format!("run {value} of fleet repository {name}"),
        "workload" => match value
            .strip_prefix(consistency::IMAGE)
            .and_then(|v| v.split_once('='))
        {
            Some((_, image)) => format!("run {name} with image {image}"),
            None => format!("run {name} with {value}"),
        },
        _ => format!("run {attr} {value}"),
    }
}

/// Attributes at least two failing clusters share, ranked by how well they separate `failing` from
/// `healthy` (clusters with facts only); for a problem of one workload (`workload`, `<kind> <ns>/<name>`),
/// also the settings its failing copies run and its healthy ones don't, judged among the clusters that run
/// it, first among equals.
pub fn shared(
    view: View<'_>,
    failing: &BTreeSet<String>,
    healthy: &BTreeSet<String>,
    attrs: &mut Attributes,
    workload: Option<&str>,
) -> Vec<SharedAttribute> {
    for c in failing.iter().chain(healthy) {
        attrs.fill(view, c);
    }
    let facts = |set: &BTreeSet<String>| -> Vec<&BTreeSet<(String, String)>> {
        set.iter().filter_map(|c| attrs.get(c)).collect()
    };
    // `calico` with the same counts as `calico v3.27.3` says nothing more; a fact of one failing cluster
    // alone (its region, of two failing) is no trait they share
    let mut facts_out: Vec<(f64, SharedAttribute)> = Vec::new();
    for (sep, s) in rank(&facts(failing), &facts(healthy), 2) {
        if facts_out.len() == MAX_SHARED {
            break;
        }
        let redundant = facts_out.iter().any(|(_, o)| {
            o.attribute == s.attribute
                && o.failing == s.failing
                && o.healthy == s.healthy
                && o.value.starts_with(&s.value)
        });
        if !redundant {
            facts_out.push((sep, s));
        }
    }
    let mut out: Vec<(f64, SharedAttribute)> = match workload {
        Some(w) => {
            let (f, h) = workload_values(view, failing, healthy, w);
            // a setting's value one failing copy alone has (its cluster's name in an env var) separates
            // nothing; of equals, the image first (a new version's image says more than its settings)
            let mut ranked = rank(
                &f.iter().collect::<Vec<_>>(),
                &h.iter().collect::<Vec<_>>(),
                2,
            );
            let image = |s: &SharedAttribute| !s.value.starts_with(consistency::IMAGE);
            ranked.sort_by(|(a, x), (b, y)| {
                b.total_cmp(a)
                    .then(image(x).cmp(&image(y)))
                    .then(x.value.cmp(&y.value))
            });
            ranked.truncate(MAX_WORKLOAD_SHARED);
            ranked
        }
        None => Vec::new(),
    };
    out.extend(facts_out);
    // stable: of equal separation, the workload's settings stay first
    out.sort_by(|(a, _), (b, _)| b.total_cmp(a));
    out.into_iter().take(MAX_SHARED).map(|(_, s)| s).collect()
}

/// `(attribute, value)` pairs held by at least half of the `failing` sets (and by `min` of them) and by a
/// smaller share of the `healthy` ones, with how well each separates them, best first; of equals, the more specific value (`calico v3.27.3` before `calico`). None without a set of
/// each to compare.
fn rank(
    failing: &[&BTreeSet<(String, String)>],
    healthy: &[&BTreeSet<(String, String)>],
    min: u32,
) -> Vec<(f64, SharedAttribute)> {
    fn counts<'a>(sets: &[&'a BTreeSet<(String, String)>]) -> BTreeMap<&'a (String, String), u32> {
        let mut counts = BTreeMap::new();
        for a in sets.iter().copied().flatten() {
            *counts.entry(a).or_insert(0) += 1;
        }
        counts
    }
    let (ft, ht) = (failing.len() as u32, healthy.len() as u32);
    // with no healthy cluster to compare with, nothing separates the failing ones
    if ft == 0 || ht == 0 {
        return Vec::new();
    }
    let hc = counts(healthy);
    let mut v: Vec<(f64, SharedAttribute)> = counts(failing)
        .into_iter()
        .filter_map(|(pair, f)| {
            let h = hc.get(pair).copied().unwrap_or(0);
            let (attr, value) = pair.clone();
            let fr = f as f64 / ft as f64;
            let hr = h as f64 / ht as f64;
            // it must be the failing clusters' common trait, and rarer among the healthy ones
            (fr >= 0.5 && f >= min && fr > hr).then(|| {
                let support = format!(
                    "{f} of {ft} failing {}; {h} of {ht} healthy do",
                    phrase(&attr, &value)
                );
                (
                    fr - hr,
                    SharedAttribute {
                        attribute: attr,
                        value,
                        failing: f,
                        failing_total: ft,
                        healthy: h,
                        healthy_total: ht,
                        support,
                    },
                )
            })
        })
        .collect();
    v.sort_by(|(a, x), (b, y)| {
        b.total_cmp(a)
            .then(y.value.len().cmp(&x.value.len()))
            .then(x.attribute.cmp(&y.attribute))
    });
    v
}

/// Each copy's `(attribute, value)` pairs ([`workload_values`]).
type Values = Vec<BTreeSet<(String, String)>>;

/// What each of the `failing` and of the `healthy` clusters that run `workload` run it with, as
/// `(workload:<kind> <ns>/<name>, <setting>=<value>)` pairs, for the settings whose value differs among
/// those copies; one a copy lacks is `<setting> unset`, but for the images of a copy held without any (from
/// before images were held: unknown, not unset).
fn workload_values(
    view: View<'_>,
    failing: &BTreeSet<String>,
    healthy: &BTreeSet<String>,
    workload: &str,
) -> (Values, Values) {
    let held = |c: &String| view.workloads.get(c).and_then(|w| w.get(workload));
    let copies: Vec<&BTreeMap<String, String>> =
        failing.iter().chain(healthy).filter_map(held).collect();
    let mut values: BTreeMap<&String, BTreeSet<Option<&String>>> = BTreeMap::new();
    for copy in &copies {
        for k in copy.keys() {
            values.entry(k).or_default();
        }
    }
    for (k, v) in &mut values {
        v.extend(copies.iter().map(|c| c.get(*k)));
    }
    // a setting every copy has alike separates nothing
    let differing: Vec<&String> = values
        .into_iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(k, _)| k)
        .collect();
    let attr = format!("workload:{workload}");
    let of = |set: &BTreeSet<String>| -> Values {
        set.iter()
            .filter_map(held)
            .map(|settings| {
                let has_images = settings.keys().any(|k| k.starts_with(consistency::IMAGE));
                differing
                    .iter()
                    .filter_map(|k| {
                        let value = match settings.get(*k) {
                            Some(v) => format!("{k}={v}"),
                            None if k.starts_with(consistency::IMAGE) && !has_images => {
                                return None;
                            }
                            None => format!("{k} unset"),
                        };
                        Some((attr.clone(), value))
                    })
                    .collect()
            })
            .collect()
    };
    (of(failing), of(healthy))
}

/// The workload an event problem is about (`<kind> <ns>/<name>`, as the failing clusters hold it): the
/// object itself when it is one, a Pod's by its masked name (`web-*` → `Deployment shop/web`, `db-*` →
/// `StatefulSet shop/db`, `worker-*` → `Deployment shop/worker-1`); the one most failing clusters run. A
/// cluster where two workloads could own the pods (`worker` and `worker-1`) names none. None for other
/// problems.
fn workload_of(view: View<'_>, f: &FleetIncident, failing: &BTreeSet<String>) -> Option<String> {
    if f.kind != EVENT {
        return None;
    }
    let (ns, object, kind) = (
        f.labels.get("namespace")?,
        f.labels.get("object")?,
        f.labels.get("object_kind")?,
    );
    let kinds: Vec<&str> = if kind == "Pod" {
        consistency::WORKLOAD_KINDS.to_vec()
    } else if consistency::WORKLOAD_KINDS.contains(&kind.as_str()) {
        vec![kind.as_str()]
    } else {
        return None;
    };
    let mut found: BTreeMap<&String, usize> = BTreeMap::new();
    for c in failing {
        let Some(held) = view.workloads.get(c) else {
            continue;
        };
        let mut candidates = kinds.iter().flat_map(|k| {
            let prefix = format!("{k} {ns}/");
            held.range(prefix.clone()..)
                .take_while(move |(key, _)| key.starts_with(&prefix))
                .filter(|(key, _)| {
                    let name = key.rsplit_once('/').map_or("", |(_, n)| n);
                    if kind == "Pod" {
                        mask::mask_name(&format!("{name}-*")) == *object
                    } else {
                        name == object || mask::mask_name(name) == *object
                    }
                })
                .map(|(key, _)| key)
        });
        if let (Some(key), None) = (candidates.next(), candidates.next()) {
            *found.entry(key).or_default() += 1;
        }
    }
    let most = found.values().copied().max()?;
    found
        .into_iter()
        .find(|(_, n)| *n == most)
        .map(|(k, _)| k.clone())
}

fn object_key(o: &ObjectRef) -> String {
    match &o.namespace {
        Some(ns) => format!("{} {ns}/{}", o.kind, o.name),
        None => format!("{} {}", o.kind, o.name),
    }
}

/// One thing that changed on a cluster at a hub time: an object's spec, or a release batch applied there.
/// It borrows from the machine's view: a judgement reads every cluster's changes, and only those that
/// fall in its windows are named (allocated).
struct Touch<'a> {
    at: DateTime<Utc>,
    what: Touched<'a>,
    /// What a workload's change changed ([`ChangeRec::delta`](crate::state::ChangeRec::delta)).
    delta: Option<&'a Delta>,
}

enum Touched<'a> {
    Object(&'a ObjectRef),
    Release(&'a ReleaseRef),
}

/// What changed, borrowed: equal for two touches exactly when their [`Touch::key`]s are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum TouchId<'a> {
    Object(&'a str, Option<&'a str>, &'a str),
    Release(&'a str, u64),
}

impl<'a> Touch<'a> {
    /// What changed, as one key: a release revision is one change, whichever batch took it where.
    fn key(&self) -> String {
        match self.what {
            Touched::Object(o) => object_key(o),
            Touched::Release(r) => format!("release {} revision {}", r.name, r.revision),
        }
    }

    /// [`Touch::key`] without naming it: the healthy clusters' changes are many and are only looked up.
    fn id(&self) -> TouchId<'a> {
        match self.what {
            Touched::Object(o) => TouchId::Object(&o.kind, o.namespace.as_deref(), &o.name),
            Touched::Release(r) => TouchId::Release(&r.name, r.revision),
        }
    }

    fn object(&self) -> ObjectRef {
        match self.what {
            Touched::Object(o) => o.clone(),
            Touched::Release(r) => ObjectRef {
                api_version: String::new(),
                kind: "Release".into(),
                namespace: None,
                name: r.name.clone(),
                uid: None,
            },
        }
    }

    fn release(&self) -> Option<&ReleaseRef> {
        match self.what {
            Touched::Object(_) => None,
            Touched::Release(r) => Some(r),
        }
    }
}

/// What changed on `cluster`: its objects' spec changes (their times corrected by its skew) and the
/// release batches applied there (the release role's clock is the hub's).
fn touches<'a>(view: View<'a>, cluster: &str) -> Vec<Touch<'a>> {
    let Some(state) = view.clusters.get(cluster) else {
        return Vec::new();
    };
    let skew = skew(view, cluster);
    let mut out: Vec<Touch<'a>> = state
        .changes
        .iter()
        .map(|ch| Touch {
            at: ch.at - skew,
            what: Touched::Object(&ch.object),
            delta: ch.delta.as_deref(),
        })
        .collect();
    out.extend(state.releases.iter().map(|(at, r)| Touch {
        at: *at,
        what: Touched::Release(r),
        delta: None,
    }));
    out
}

/// The changes on the failing clusters in the lookback before their incident (`since` maps each failing
/// cluster to its incident's hub time), weighed against the same changes on the healthy clusters over the
/// whole span: objects' spec changes, and release batches (a release revision is one change, whichever
/// batch took it where). A suspect changed on at least three quarters of the failing clusters (all of two
/// or three) and on at most a quarter of the healthy ones; a change at least as common on the healthy
/// clusters is `common` (ordinary churn); anything between says too little to be listed. An object's change
/// on several failing clusters is a suspect only if chance could hardly explain it: with most objects
/// churning, some object changes on the same two clusters by chance, and two or three healthy clusters are
/// too few to show it (`MAX_CHANCE`). Nor is an object that changes that often on those clusters anyway: at
/// the pace it changed there before the lookback, it would change on all of them in one lookback with a
/// chance of `MAX_CHANCE` or more (`Habits`); it is `common`. A release is a deliberate change, never chance. A
/// release that is a suspect comes first: it is what an operator undoes. Nor is a workload's change made
/// alike on each failing cluster (its settings to the same values) — with enough healthy clusters to show a
/// change made everywhere, or when it is the failing `workload` itself — and a healthy cluster counts only
/// if it made that change too or already runs what it changed to. A change reported up to 5 s after a
/// cluster began failing still counts as before it.
pub fn suspects(
    view: View<'_>,
    lookback: Duration,
    since: &BTreeMap<String, DateTime<Utc>>,
    healthy: &BTreeSet<String>,
    workload: Option<&str>,
) -> Vec<Suspect> {
    let Some((&first, &last)) = since.values().min().zip(since.values().max()) else {
        return Vec::new();
    };
    // change → (failing clusters, latest time on one of them, the object, the release, its identity,
    // what each failing cluster's changes of a workload changed: fingerprint → the settings' names)
    type Reached<'c> = (
        BTreeSet<&'c str>,
        DateTime<Utc>,
        ObjectRef,
        Option<ReleaseRef>,
        TouchId<'c>,
        BTreeMap<&'c str, BTreeMap<u64, &'c [String]>>,
    );
    // each failing cluster's changes and objects, read once
    let read: BTreeMap<&str, (Vec<Touch<'_>>, usize)> = since
        .keys()
        .map(|c| (c.as_str(), (touches(view, c), held(view, c))))
        .collect();
    let habits: BTreeMap<&str, Habits<'_>> = since
        .iter()
        .filter_map(|(c, at)| {
            let (touches, _) = read.get(c.as_str())?;
            Some((c.as_str(), Habits::of(touches, *at, lookback)))
        })
        .collect();
    // a change reported a moment after a cluster began failing still came before: the agent's watches
    // race, and an event's time is whole seconds (a bad image's pull fails in the second it was set)
    let late = crate::evidence::REPORTED_LATE;
    let mut failing: BTreeMap<String, Reached<'_>> = BTreeMap::new();
    for (c, at) in since {
        for t in read.get(c.as_str()).map_or(&[][..], |(t, _)| t) {
            if t.at >= *at - lookback && t.at <= *at + late {
                let e = failing.entry(t.key()).or_insert_with(|| {
                    (
                        BTreeSet::new(),
                        t.at,
                        t.object(),
                        None,
                        t.id(),
                        BTreeMap::new(),
                    )
                });
                e.0.insert(c.as_str());
                e.1 = e.1.max(t.at);
                let deltas = e.5.entry(c.as_str()).or_default();
                if let Some(d) = t.delta {
                    deltas.insert(d.id, &d.changed[..]);
                }
                // the first batch that took it to a failing cluster
                if let Some(r) = t.release()
                    && e.3.as_ref().is_none_or(|old| r.batch < old.batch)
                {
                    e.3 = Some(r.clone());
                }
            }
        }
    }
    let healthy_total = healthy
        .iter()
        .filter(|c| view.clusters.contains_key(*c))
        .count() as u32;
    let failing_total = since.len() as u32;
    // one change made alike on every failing cluster where the object changed (the same settings
    // changed to the same values: one rollout, not churn; a restart changes none): it counts on a healthy
    // cluster that made it too, or runs what it changed to (a rollout that reached it earlier). With
    // few healthy clusters to show a change made everywhere, only for the failing workload itself. Each
    // is the change and the settings it changed, with their values on a failing cluster.
    type Alike<'c> = (u64, Vec<(&'c String, Option<&'c String>)>);
    let alike: HashMap<TouchId<'_>, Alike<'_>> = failing
        .iter()
        .filter(|(key, r)| {
            r.0.len() >= 2 && (healthy_total >= FEW_HEALTHY || workload == Some(key.as_str()))
        })
        .filter_map(|(key, r)| {
            let (d, names) =
                r.5.values()
                    .next()?
                    .iter()
                    .find(|(d, _)| r.5.values().all(|s| s.contains_key(*d)))?;
            // what it changed to, as a failing cluster runs it now
            let runs =
                r.0.iter()
                    .find_map(|c| view.workloads.get(*c)?.get(key.as_str()))?;
            let to = names.iter().map(|n| (n, runs.get(n))).collect();
            Some((r.4, (*d, to)))
        })
        .collect();
    // on how many healthy clusters each of those changes happened over the whole span (each cluster's
    // changes looked up, not named: a fleet's healthy clusters churn thousands of objects)
    let mut on_healthy: HashMap<TouchId<'_>, u32> = failing.values().map(|r| (r.4, 0)).collect();
    for c in healthy {
        let mut changed: HashSet<TouchId<'_>> = touches(view, c)
            .iter()
            .filter(|t| t.at >= first - lookback && t.at <= last + late)
            .filter(|t| on_healthy.contains_key(&t.id()))
            .filter(|t| {
                alike
                    .get(&t.id())
                    .is_none_or(|(d, _)| t.delta.map(|x| x.id) == Some(*d))
            })
            .map(Touch::id)
            .collect();
        let runs = view.workloads.get(c);
        for (id, (_, to)) in &alike {
            let TouchId::Object(kind, Some(ns), name) = id else {
                continue;
            };
            let held = runs.and_then(|w| w.get(&consistency::object_key(kind, ns, name)));
            if held.is_some_and(|h| to.iter().all(|(n, v)| h.get(*n) == *v)) {
                changed.insert(*id);
            }
        }
        for id in changed {
            *on_healthy.entry(id).or_default() += 1;
        }
    }
    // each failing cluster's churn in its own lookback, and how many objects could have changed by chance
    let churns: BTreeMap<&str, f64> = since
        .iter()
        .filter_map(|(c, at)| {
            let (touches, held) = read.get(c.as_str())?;
            Some((c.as_str(), churn(touches, *held, *at - lookback, *at)))
        })
        .collect();
    let held = read.values().map(|(_, h)| *h).max().unwrap_or(0) as f64;
    let mut out: Vec<(bool, bool, f64, Suspect)> = Vec::new();
    for (key, (clusters, latest, object, release, id, _)) in failing {
        let alike = alike.contains_key(&id);
        let h = on_healthy.get(&id).copied().unwrap_or(0);
        let f = clusters.len() as u32;
        let fr = f as f64 / failing_total as f64;
        let hr = if healthy_total == 0 {
            0.0
        } else {
            h as f64 / healthy_total as f64
        };
        // a suspect reached (nearly) every failing cluster and few healthy ones: with dozens of objects
        // churning, some object always changes on two of three clusters by chance
        let needed = if failing_total == 1 {
            1
        } else {
            (failing_total * 3).div_ceil(4).max(2)
        };
        let chance = held
            * clusters
                .iter()
                .map(|c| churns.get(c).copied().unwrap_or(1.0))
                .product::<f64>();
        let by_chance = release.is_none() && !alike && f >= 2 && chance >= MAX_CHANCE;
        // an object that changes this often on those clusters anyway, when the healthy ones are too few
        // to show it: how often, on average
        let habitual = release.is_none()
            && !alike
            && healthy_total < FEW_HEALTHY
            && clusters
                .iter()
                .map(|c| habits.get(c).map_or(0.0, |h| h.chance(&id, lookback)))
                .product::<f64>()
                >= MAX_CHANCE;
        let every = habitual.then(|| {
            let (n, span) = clusters
                .iter()
                .filter_map(|c| habits.get(c))
                .fold((0, Duration::zero()), |(n, span), h| {
                    (n + h.count(&id), span + h.span)
                });
            span / n.max(1) as i32
        });
        let singled_out = f >= needed && hr <= 0.25 && hr < fr && !by_chance;
        let verdict = if singled_out && every.is_none() {
            SuspectVerdict::Suspect
        } else if singled_out || (h > 0 && hr >= fr) {
            SuspectVerdict::Common
        } else {
            continue;
        };
        let what = match &release {
            Some(r) => {
                let mut w = format!("release {} revision {}", r.name, r.revision);
                if let Some(b) = r.batch {
                    w.push_str(&format!(" (batch {b}"));
                    if let Some(c) = &r.commit {
                        w.push_str(&format!(", commit {}", &c[..c.len().min(12)]));
                    }
                    w.push(')');
                }
                w
            }
            None => key.clone(),
        };
        let healthy_of = if healthy_total == 0 {
            "none healthy to compare".to_string()
        } else {
            format!("{h} of {healthy_total} healthy")
        };
        let summary = match verdict {
            SuspectVerdict::Suspect => format!(
                "{what} {} {f} of {failing_total} failing clusters, {healthy_of}, in the {} before{}",
                if release.is_some() {
                    "reached"
                } else {
                    "changed on"
                },
                crate::evidence::secs(lookback),
                if alike {
                    ", the same change on each"
                } else {
                    ""
                }
            ),
            _ => match every {
                Some(every) if singled_out => format!(
                    "{what} changed on {f} of {failing_total} failing clusters, {healthy_of}, in the {} before, as it does there every {} on average: ordinary churn, not a suspect",
                    crate::evidence::secs(lookback),
                    crate::evidence::secs(every),
                ),
                _ => format!(
                    "{what} {} {f} of {failing_total} failing and {h} of {healthy_total} healthy clusters: ordinary churn, not a suspect",
                    if release.is_some() {
                        "reached"
                    } else {
                        "changed on"
                    },
                ),
            },
        };
        out.push((
            release.is_some() && verdict == SuspectVerdict::Suspect,
            // ordinary churn the healthy clusters showed before churn judged by habit alone
            !(singled_out && every.is_some()),
            fr - hr,
            Suspect {
                verdict,
                object,
                failing: f,
                failing_total,
                healthy: h,
                healthy_total,
                last_changed: latest,
                summary,
                release,
            },
        ));
    }
    out.sort_by(|(ra, ea, a, x), (rb, eb, b, y)| {
        rb.cmp(ra)
            .then(eb.cmp(ea))
            .then(b.total_cmp(a))
            .then(y.failing.cmp(&x.failing))
            .then(y.last_changed.cmp(&x.last_changed))
    });
    let (mut s, mut c) = (0, 0);
    out.into_iter()
        .map(|(_, _, _, x)| x)
        .filter(|x| match x.verdict {
            SuspectVerdict::Suspect => {
                s += 1;
                s <= MAX_SUSPECTS
            }
            _ => {
                c += 1;
                c <= MAX_COMMON
            }
        })
        .collect()
}

/// The fleet incidents: the current one of each kind under [`key`] (of each event problem under
/// [`event_key`]), resolved ones a newer one replaced — or a problem moved to their key put aside — under
/// [`history_key`].
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Fleet {
    /// By key.
    pub incidents: BTreeMap<String, FleetIncident>,
    /// Event problems announced recently, by [`problem`]: (cluster, hub time, the record) of each digest, to
    /// find the second cluster with the same problem within the window. Not persisted: after a restart, a
    /// problem needs its second cluster again.
    recent: BTreeMap<String, Vec<(String, DateTime<Utc>, Record)>>,
    /// When each event member's digest was last refreshed (hub time); a member quiet for three refresh
    /// intervals leaves (event problems don't resolve: they stop).
    digest_seen: BTreeMap<String, DateTime<Utc>>,
    /// The members of the open event problems read back (digest id → key), until each one's digest comes
    /// again: a problem kept under another id than the one worked out now (an older correlator compared
    /// messages otherwise) then moves to its id instead of a second incident opening beside it.
    restored_members: BTreeMap<String, String>,
    /// Keys whose fleet incident a move changed since [`Fleet::take_rekeyed`]: the one moved away from
    /// (nothing is kept there now) and the history entry of a resolved one moved aside.
    rekeyed: Vec<String>,
    /// Keys of fleet incidents to judge again (members moved out of them), see [`Fleet::take_rejudge`].
    rejudge: Vec<String>,
}

impl Fleet {
    /// The fleet incidents the store read back.
    pub fn restored(incidents: BTreeMap<String, FleetIncident>) -> Self {
        let mut f = Fleet {
            incidents,
            ..Default::default()
        };
        f.index_restored();
        f
    }

    /// Notes the members of the open event problems, see `restored_members`.
    fn index_restored(&mut self) {
        self.restored_members = self
            .incidents
            .iter()
            .filter(|(_, f)| f.kind == EVENT && f.status != IncidentStatus::Resolved)
            .flat_map(|(k, f)| {
                f.members
                    .iter()
                    .filter(|m| m.left_at.is_none())
                    .map(move |m| (m.incident_id.clone(), k.clone()))
            })
            .collect();
    }

    /// The keys whose fleet incident a move changed since the last call, for the store to write again (or
    /// drop, where nothing is kept now).
    pub fn take_rekeyed(&mut self) -> Vec<String> {
        std::mem::take(&mut self.rekeyed)
    }

    /// The keys of fleet incidents whose members moved to another since the last call: to be judged again
    /// (they resolve, as their members left).
    pub fn take_rejudge(&mut self) -> Vec<String> {
        std::mem::take(&mut self.rejudge)
    }

    /// The current (open) fleet incident of `kind`.
    fn open_mut(&mut self, kind: &str) -> Option<&mut FleetIncident> {
        self.incidents
            .get_mut(&key(kind))
            .filter(|f| f.status != IncidentStatus::Resolved)
    }

    /// A cluster incident changed (it opened, was updated or resolved); `now` is the hub time of the
    /// change. Returns the key of the fleet incident whose members changed, if one did: it is judged
    /// by [`Fleet::judge`], once for all the changes of a batch.
    pub fn on_incident(
        &mut self,
        rule: &FleetRule,
        inc: &Incident,
        view: View<'_>,
        now: DateTime<Utc>,
    ) -> Option<String> {
        if rule.exclude_kinds.contains(&inc.kind) {
            return None;
        }
        let open = inc.status != IncidentStatus::Resolved;
        if let Some(f) = self.open_mut(&inc.kind) {
            let changed = match f.members.iter_mut().find(|m| m.incident_id == inc.id) {
                Some(m) => update_member(m, inc, now),
                None if open => {
                    f.members.push(member(inc, now));
                    true
                }
                None => false,
            };
            return changed.then(|| key(&inc.kind));
        }
        if !open {
            return None;
        }
        // a new fleet incident when enough clusters failed this way within the window
        let at = hub_time(view, &inc.cluster, inc.opened_at);
        let window = Duration::from_std(rule.window).unwrap_or(Duration::minutes(5));
        let mut members: Vec<&Incident> = view
            .incidents
            .values()
            .filter(|i| {
                i.kind == inc.kind
                    && i.status != IncidentStatus::Resolved
                    && (hub_time(view, &i.cluster, i.opened_at) - at).abs() <= window
            })
            .collect();
        if !members.iter().any(|i| i.id == inc.id) {
            members.push(inc);
        }
        let clusters: BTreeSet<&str> = members.iter().map(|i| i.cluster.as_str()).collect();
        if clusters.len() < rule.min_clusters.max(2) {
            return None;
        }
        members.sort_by_key(|i| (hub_time(view, &i.cluster, i.opened_at), i.cluster.clone()));
        let k = key(&inc.kind);
        if let Some(old) = self.incidents.remove(&k) {
            self.incidents.insert(history_key(&inc.kind, &old.id), old);
        }
        let f = FleetIncident {
            id: stable_id(&["fleet", &inc.kind, &now.to_rfc3339()]),
            kind: inc.kind.clone(),
            severity: inc.severity,
            status: IncidentStatus::Open,
            summary: String::new(),
            opened_at: now,
            updated_at: now,
            resolved_at: None,
            fleet_size: 0,
            members: members.iter().map(|i| member(i, now)).collect(),
            shared: Vec::new(),
            suspects: Vec::new(),
            labels: BTreeMap::new(),
            blast_radius: None,
            revision: 0,
        };
        self.incidents.insert(k.clone(), f);
        Some(k)
    }

    /// An event problem was announced or refreshed on a cluster (`rec`, the dedup record; `now`, hub
    /// time). Returns the key of the fleet incident whose members changed, if one did (judged by
    /// [`Fleet::judge`]).
    pub fn on_digest(
        &mut self,
        rule: &FleetRule,
        rec: &Record,
        now: DateTime<Utc>,
    ) -> Option<String> {
        if rule.exclude_kinds.iter().any(|k| k == EVENT) {
            return None;
        }
        let problem = problem(rec);
        let k = event_key(&problem);
        self.digest_seen.insert(rec.id.clone(), now);
        let window = Duration::from_std(rule.window).unwrap_or(Duration::minutes(5));
        let moved = self.move_restored(&rec.id, &k, &problem, now);
        if let Some(f) = self
            .incidents
            .get_mut(&k)
            .filter(|f| f.status != IncidentStatus::Resolved)
        {
            let changed = match f.members.iter_mut().find(|m| m.incident_id == rec.id) {
                Some(m) if m.left_at.is_some() => {
                    // quiet for a while, now back: a member again
                    m.left_at = None;
                    m.left_because.clear();
                    m.status = IncidentStatus::Open;
                    true
                }
                Some(m) => {
                    let changed = m.severity != rec.severity;
                    m.severity = rec.severity;
                    m.summary = digest_summary(rec);
                    changed
                }
                None => {
                    f.members.push(digest_member(rec, now));
                    true
                }
            };
            // (a move changed it even when the member did not)
            return (changed || moved).then_some(k);
        }
        let recent = self.recent.entry(problem.clone()).or_default();
        // each digest once (a cluster may say one failure in several messages: each is a member)
        recent.retain(|(_, at, r)| now - *at <= window && r.id != rec.id);
        recent.push((rec.cluster.clone(), now, rec.clone()));
        let clusters: BTreeSet<&str> = recent.iter().map(|(c, _, _)| c.as_str()).collect();
        if clusters.len() < rule.min_clusters.max(2) {
            return None;
        }
        let members: Vec<FleetMember> = recent
            .iter()
            .map(|(_, _, r)| digest_member(r, now))
            .collect();
        self.recent.remove(&problem);
        if let Some(old) = self.incidents.remove(&k) {
            self.incidents.insert(history_key(&k, &old.id), old);
        }
        let ns = rec.object.namespace.clone().unwrap_or_default();
        let f = FleetIncident {
            id: stable_id(&["fleet", &k, &now.to_rfc3339()]),
            kind: EVENT.into(),
            severity: rec.severity,
            status: IncidentStatus::Open,
            summary: String::new(),
            opened_at: now,
            updated_at: now,
            resolved_at: None,
            fleet_size: 0,
            members,
            shared: Vec::new(),
            suspects: Vec::new(),
            // what the problem is, as its digests' alerts say it (the members' alerts carry the same)
            labels: BTreeMap::from([
                ("alertname".to_string(), rec.reason.clone()),
                ("kind".to_string(), EVENT.to_string()),
                ("object_kind".to_string(), rec.object.kind.clone()),
                ("namespace".to_string(), ns),
                ("object".to_string(), mask::mask_name(&rec.object.name)),
                ("problem".to_string(), problem.clone()),
            ]),
            blast_radius: None,
            revision: 0,
        };
        self.incidents.insert(k.clone(), f);
        Some(k)
    }

    /// Moves the open event problem read back with digest `id` as a member to `key` (its `problem` label
    /// `problem`) when it is kept under another key; true if it moved. When a problem is open under `key`
    /// already (one problem was two in an older correlator's words), the other's members join it instead
    /// and leave the other, which resolves ([`Fleet::take_rejudge`]).
    fn move_restored(&mut self, id: &str, key: &str, problem: &str, now: DateTime<Utc>) -> bool {
        let Some(from) = self.restored_members.remove(id) else {
            return false;
        };
        let open = |f: &FleetIncident| f.status != IncidentStatus::Resolved;
        if from == key || !self.incidents.get(&from).is_some_and(open) {
            return false;
        }
        // its other members are found under `key` from now on
        self.restored_members.retain(|_, k| *k != from);
        if let Some(target) = self
            .incidents
            .get(key)
            .filter(|f| open(f))
            .map(|f| f.id.clone())
        {
            let Some(other) = self.incidents.get_mut(&from) else {
                return false;
            };
            let mut joining = Vec::new();
            for m in other.members.iter_mut().filter(|m| m.left_at.is_none()) {
                joining.push(FleetMember {
                    joined_at: now,
                    ..m.clone()
                });
                m.status = IncidentStatus::Resolved;
                m.left_at = Some(now);
                m.left_because = format!("the same problem as fleet incident {target}");
            }
            self.rejudge.push(from);
            if let Some(f) = self.incidents.get_mut(key) {
                for m in joining {
                    match f
                        .members
                        .iter_mut()
                        .find(|x| x.incident_id == m.incident_id)
                    {
                        // a member there that had left is back
                        Some(x) if x.left_at.is_some() => {
                            x.left_at = None;
                            x.left_because.clear();
                            x.status = IncidentStatus::Open;
                        }
                        Some(_) => {}
                        None => f.members.push(m),
                    }
                }
            }
            return true;
        }
        let Some(mut f) = self.incidents.remove(&from) else {
            return false;
        };
        f.labels.insert("problem".into(), problem.to_string());
        if let Some(old) = self.incidents.remove(key) {
            let aside = history_key(key, &old.id);
            self.incidents.insert(aside.clone(), old);
            self.rekeyed.push(aside);
        }
        self.incidents.insert(key.to_string(), f);
        self.rekeyed.push(from);
        true
    }

    /// Judges the fleet incident at `key` from its members and the fleet as they are now, and gives it a
    /// new revision; false if there is none. Members change one digest or incident at a time, and a
    /// first start brings thousands of them: judged once per batch instead of once per change, fleet
    /// judgement went from 34 to 19 % of the correlator's CPU in a 50-cluster first start (`perf`).
    pub fn judge(
        &mut self,
        key: &str,
        rule: &FleetRule,
        view: View<'_>,
        now: DateTime<Utc>,
        attrs: &mut Attributes,
    ) -> bool {
        let Some(f) = self.incidents.get_mut(key) else {
            return false;
        };
        judge(f, rule, view, now, attrs);
        if f.revision == 1 {
            tracing::info!(key, clusters = f.clusters().len(), summary = %f.summary, "fleet incident opened");
        }
        true
    }

    /// Members whose cluster went silent for good or left the machine's view leave; a fleet incident
    /// whose members have all resolved or left resolves. A silence counts only as long as it was
    /// `watched` (the hub's own downtime is not the cluster's). Returns the keys that changed.
    pub fn sweep(
        &mut self,
        rule: &FleetRule,
        view: View<'_>,
        now: DateTime<Utc>,
        watched: Duration,
    ) -> Vec<String> {
        let silent = Duration::from_std(rule.silent_member_after).unwrap_or(Duration::days(1));
        let mut changed = Vec::new();
        let mut attrs = Attributes::default();
        for (k, f) in self.incidents.iter_mut() {
            if f.status == IncidentStatus::Resolved {
                continue;
            }
            let mut any = false;
            let event = f.kind == EVENT;
            let quiet = Duration::minutes(15);
            for m in f.members.iter_mut().filter(|m| m.left_at.is_none()) {
                if event {
                    let seen = *self.digest_seen.entry(m.incident_id.clone()).or_insert(now);
                    if now - seen >= quiet {
                        m.status = IncidentStatus::Resolved;
                        m.left_at = Some(now);
                        any = true;
                    }
                    continue;
                }
                let why = match view.clusters.get(&m.cluster) {
                    None => Some("its cluster is no longer in the fleet".to_string()),
                    Some(c)
                        if watched >= silent
                            && c.hb_last_ingest.is_some_and(|t| now - t >= silent) =>
                    {
                        Some(format!(
                            "its cluster sent nothing for {}",
                            crate::evidence::secs(silent)
                        ))
                    }
                    Some(_) if !view.incidents.values().any(|i| i.id == m.incident_id) => {
                        Some("its incident is no longer kept".to_string())
                    }
                    _ => None,
                };
                if let Some(why) = why {
                    m.status = IncidentStatus::Resolved;
                    m.left_at = Some(now);
                    m.left_because = why;
                    any = true;
                }
            }
            if any {
                judge(f, rule, view, now, &mut attrs);
                changed.push(k.clone());
            }
        }
        // forget what can no longer pair or leave
        let window = Duration::from_std(rule.window).unwrap_or(Duration::minutes(5));
        self.recent.retain(|_, v| {
            v.retain(|(_, at, _)| now - *at <= window);
            !v.is_empty()
        });
        let members: BTreeSet<&str> = self
            .incidents
            .values()
            .filter(|f| f.kind == EVENT && f.status != IncidentStatus::Resolved)
            .flat_map(|f| f.members.iter().map(|m| m.incident_id.as_str()))
            .collect();
        self.digest_seen
            .retain(|id, _| members.contains(id.as_str()));
        // a restored member whose incident is no longer open has nothing left to move
        let incidents = &self.incidents;
        self.restored_members.retain(|_, k| {
            incidents
                .get(k)
                .is_some_and(|f| f.status != IncidentStatus::Resolved)
        });
        changed
    }

    /// The open fleet incidents of whole clusters lost whose blast radius has changed since they were
    /// judged: another cluster went down or came back (a member's own change judges it anyway). Their keys,
    /// to judge again; only what is lost counts ([`blast::same_loss`]), not the time of the state it was
    /// judged on nor its wording.
    pub fn blast_stale(&self, view: View<'_>) -> Vec<String> {
        self.incidents
            .iter()
            .filter(|(_, f)| f.status != IncidentStatus::Resolved && view.roots.contains(&f.kind))
            .filter(|(_, f)| {
                blast_of(f, view).is_some_and(|now| {
                    !f.blast_radius
                        .as_ref()
                        .is_some_and(|was| blast::same_loss(was, &now))
                })
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Whether a fleet incident is open.
    pub fn any_open(&self) -> bool {
        self.incidents
            .values()
            .any(|f| f.status != IncidentStatus::Resolved)
    }

    /// The open fleet incidents whose judgement weighs a change made at `at` (hub time) on any cluster:
    /// from `lookback` before their first member began to 5 s after their last (a change reported a
    /// moment late). A change read after they were judged may change their suspects.
    pub fn covering(&self, view: View<'_>, lookback: Duration, at: DateTime<Utc>) -> Vec<String> {
        self.incidents
            .iter()
            .filter(|(_, f)| f.status != IncidentStatus::Resolved)
            .filter(|(_, f)| {
                let onsets = f
                    .members
                    .iter()
                    .map(|m| hub_time(view, &m.cluster, m.opened_at));
                let first = onsets.clone().min();
                let last = onsets.max();
                first.zip(last).is_some_and(|(first, last)| {
                    at >= first - lookback && at <= last + crate::evidence::REPORTED_LATE
                })
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The open fleet incidents with a member on one of `clusters`.
    pub fn with_members_on(&self, clusters: &[String]) -> Vec<String> {
        self.incidents
            .iter()
            .filter(|(_, f)| {
                f.status != IncidentStatus::Resolved
                    && f.members.iter().any(|m| clusters.contains(&m.cluster))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Something reached them after these fleet incidents (`keys`) were judged (a release batch, a change
    /// read late): each still open is judged again, and takes a new revision when that changes its suspects
    /// or shared attributes. Returns the keys of those that changed.
    pub fn rejudge(
        &mut self,
        rule: &FleetRule,
        view: View<'_>,
        now: DateTime<Utc>,
        keys: &[String],
    ) -> Vec<String> {
        let mut changed = Vec::new();
        let mut attrs = Attributes::default();
        for k in keys {
            let Some(f) = self
                .incidents
                .get_mut(k)
                .filter(|f| f.status != IncidentStatus::Resolved)
            else {
                continue;
            };
            let mut again = f.clone();
            judge(&mut again, rule, view, now, &mut attrs);
            if again.suspects != f.suspects || again.shared != f.shared {
                *f = again;
                changed.push(k.clone());
            }
        }
        changed
    }

    /// Resolved fleet incidents last changed before `before` are dropped; returns their keys.
    pub fn expire(&mut self, before: DateTime<Utc>) -> Vec<String> {
        let mut gone = Vec::new();
        self.incidents.retain(|k, f| {
            let keep = f.status != IncidentStatus::Resolved || f.updated_at > before;
            if !keep {
                gone.push(k.clone());
            }
            keep
        });
        gone
    }

    /// Fleet incidents read back from FLEET_INCIDENTS (the latest revision of each) after the store was
    /// wiped; the newest of each key is current (of an event problem, the open one first), the others are
    /// history.
    pub fn restore(&mut self, incidents: Vec<FleetIncident>) {
        self.restore_each(incidents);
        self.index_restored();
    }

    fn restore_each(&mut self, incidents: Vec<FleetIncident>) {
        for f in incidents {
            let k = key_of(&f);
            match self.incidents.get(&k) {
                Some(cur) if cur.id == f.id && cur.revision >= f.revision => {}
                // the newer is the current one; of an event problem, the open one first (a problem moved
                // to its key may have opened before a resolved one there)
                Some(cur) if cur.id != f.id && current_first(cur, &f) => {
                    self.incidents.insert(history_key(&k, &f.id), f);
                }
                Some(cur) if cur.id != f.id => {
                    let old = cur.clone();
                    self.incidents.insert(history_key(&k, &old.id), old);
                    self.incidents.insert(k, f);
                }
                _ => {
                    self.incidents.insert(k, f);
                }
            }
        }
    }

    /// Open fleet incidents (and the resolved ones with `all`), most severe and most recent first.
    pub fn current(&self, all: bool) -> Vec<FleetIncident> {
        let mut v: Vec<FleetIncident> = self
            .incidents
            .values()
            .filter(|f| all || f.status != IncidentStatus::Resolved)
            .cloned()
            .collect();
        v.sort_by(|a, b| {
            b.severity
                .cmp(&a.severity)
                .then(b.updated_at.cmp(&a.updated_at))
        });
        v
    }
}

/// Whether `a` rather than `b` is the current fleet incident of their key when both are read back: the
/// newer, but of an event problem the open one first.
fn current_first(a: &FleetIncident, b: &FleetIncident) -> bool {
    let open = |f: &FleetIncident| f.kind == EVENT && f.status != IncidentStatus::Resolved;
    (open(a), a.opened_at) > (open(b), b.opened_at)
}

fn digest_summary(rec: &Record) -> String {
    format!(
        "{} ×{} on {} {}/{}: {}",
        rec.reason,
        rec.count,
        rec.object.kind,
        rec.object.namespace.as_deref().unwrap_or("-"),
        rec.object.name,
        rec.last_message
    )
}

fn digest_member(rec: &Record, now: DateTime<Utc>) -> FleetMember {
    FleetMember {
        cluster: rec.cluster.clone(),
        incident_id: rec.id.clone(),
        severity: rec.severity,
        status: IncidentStatus::Open,
        summary: digest_summary(rec),
        opened_at: rec.first_seen,
        joined_at: now,
        left_at: None,
        left_because: String::new(),
    }
}

fn member(inc: &Incident, now: DateTime<Utc>) -> FleetMember {
    FleetMember {
        cluster: inc.cluster.clone(),
        incident_id: inc.id.clone(),
        severity: inc.severity,
        status: inc.status,
        summary: inc.summary.clone(),
        opened_at: inc.opened_at,
        joined_at: now,
        left_at: (inc.status == IncidentStatus::Resolved).then_some(now),
        left_because: String::new(),
    }
}

/// Brings a member up to its incident; whether anything a fleet reader sees changed.
fn update_member(m: &mut FleetMember, inc: &Incident, now: DateTime<Utc>) -> bool {
    let resolved = inc.status == IncidentStatus::Resolved;
    let changed = m.status != inc.status || m.severity != inc.severity;
    m.status = inc.status;
    m.severity = inc.severity;
    m.summary = inc.summary.clone();
    if resolved && m.left_at.is_none() {
        m.left_at = Some(now);
    }
    changed
}

/// What the clusters of a fleet incident of whole clusters lost take down together, over its open members
/// (`None`: another kind, or none open).
fn blast_of(f: &FleetIncident, view: View<'_>) -> Option<BlastRadius> {
    if !view.roots.contains(&f.kind) {
        return None;
    }
    let lost: BTreeSet<&str> = f
        .members
        .iter()
        .filter(|m| m.status != IncidentStatus::Resolved)
        .map(|m| m.cluster.as_str())
        .collect();
    if lost.is_empty() {
        return None;
    }
    let lost: Vec<&str> = lost.into_iter().collect();
    let states: BTreeMap<&str, &ClusterState> = lost
        .iter()
        .filter_map(|c| view.clusters.get(*c).map(|s| (*c, s)))
        .collect();
    Some(blast::of_all(&lost, view.specs, &states, &view.down()))
}

/// Recomputes what a fleet incident says from its members and the fleet, and takes a new revision.
fn judge(
    f: &mut FleetIncident,
    rule: &FleetRule,
    view: View<'_>,
    now: DateTime<Utc>,
    attrs: &mut Attributes,
) {
    let failing: BTreeSet<String> = f.members.iter().map(|m| m.cluster.clone()).collect();
    // healthy: known clusters with no open incident of this kind
    let healthy: BTreeSet<String> = view
        .clusters
        .keys()
        .filter(|c| !failing.contains(*c))
        .filter(|c| {
            !view.incidents.values().any(|i| {
                i.cluster == **c && i.kind == f.kind && i.status != IncidentStatus::Resolved
            })
        })
        .cloned()
        .collect();
    let mut since: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    for m in &f.members {
        let t = hub_time(view, &m.cluster, m.opened_at);
        let e = since.entry(m.cluster.clone()).or_insert(t);
        *e = (*e).min(t);
    }
    let lookback = Duration::from_std(rule.lookback).unwrap_or(Duration::minutes(15));
    let workload = workload_of(view, f, &failing);
    f.shared = shared(view, &failing, &healthy, attrs, workload.as_deref());
    f.suspects = suspects(view, lookback, &since, &healthy, workload.as_deref());
    f.fleet_size = view.clusters.len().max(failing.len()) as u32;
    let open: Vec<&FleetMember> = f
        .members
        .iter()
        .filter(|m| m.status != IncidentStatus::Resolved)
        .collect();
    // whole clusters lost: what they take down together (a workload whose every copy ran on them is
    // down, though the blast radius of the one lost first says it runs on the other); once all are
    // back, it stays as last judged while one was down
    if let Some(br) = blast_of(f, view) {
        f.blast_radius = Some(br);
    }
    f.severity = open
        .iter()
        .map(|m| m.severity)
        .max()
        .unwrap_or(f.severity.max(Severity::Info));
    // routing labels: the kind, and what every member's incident labels agree on (an event problem
    // keeps the labels that say which problem it is)
    let mut labels: Option<BTreeMap<String, String>> = (f.kind == EVENT).then(|| f.labels.clone());
    for m in f.members.iter().filter(|_| f.kind != EVENT) {
        let l = view
            .incidents
            .values()
            .find(|i| i.id == m.incident_id)
            .map(|i| i.labels.clone())
            .unwrap_or_default();
        labels = Some(match labels {
            None => l,
            Some(acc) => acc
                .into_iter()
                .filter(|(k, v)| l.get(k) == Some(v))
                .collect(),
        });
    }
    let mut labels = labels.unwrap_or_default();
    labels.remove("cluster");
    labels.insert("kind".into(), f.kind.clone());
    labels
        .entry("alertname".into())
        .or_insert_with(|| f.kind.clone());
    labels.insert("scope".into(), "fleet".into());
    labels.insert(
        "severity".into(),
        format!("{:?}", f.severity).to_lowercase(),
    );
    f.labels = labels;
    let names = f.clusters();
    let what = if f.kind == EVENT {
        format!(
            "{} on {} {}/{}",
            f.labels
                .get("alertname")
                .map(String::as_str)
                .unwrap_or("event"),
            f.labels
                .get("object_kind")
                .map(String::as_str)
                .unwrap_or("-"),
            f.labels.get("namespace").map(String::as_str).unwrap_or("-"),
            f.labels.get("object").map(String::as_str).unwrap_or("-"),
        )
    } else {
        f.kind.clone()
    };
    // while it lasts, the clusters whose every member resolved or left are back: said, as they still
    // count among the failing
    // (a member that left for another reason — its cluster silent for a day, gone from the fleet — is not
    // back)
    let back: Vec<&str> = names
        .iter()
        .copied()
        .filter(|c| {
            f.members
                .iter()
                .filter(|m| m.cluster == *c)
                .all(|m| m.status == IncidentStatus::Resolved && m.left_because.is_empty())
        })
        .collect();
    let back = if open.is_empty() || back.is_empty() {
        String::new()
    } else {
        format!("; {} back", back.join(", "))
    };
    let mut summary = format!(
        "{what} on {} of {} clusters ({}{back})",
        failing.len(),
        f.fleet_size,
        names.join(", ")
    );
    if let Some(br) = f
        .blast_radius
        .as_ref()
        .filter(|b| b.only_here_total > 0 && !open.is_empty())
    {
        let n = br.only_here_total;
        let names: Vec<&str> = br.only_here.iter().take(3).map(String::as_str).collect();
        summary.push_str(&format!(
            ", taking down {n} workload{} that run{} on no cluster still up ({}{})",
            if n == 1 { "" } else { "s" },
            if n == 1 { "s" } else { "" },
            names.join(", "),
            if n > 3 { ", …" } else { "" }
        ));
    }
    if let Some(s) = f.shared.first() {
        summary.push_str(&format!(": {}", s.support));
    }
    match f
        .suspects
        .iter()
        .find(|s| s.verdict == SuspectVerdict::Suspect)
    {
        Some(s) => summary.push_str(&format!("; first suspect: {}", s.summary)),
        None => {
            let common = f
                .suspects
                .iter()
                .filter(|s| s.verdict == SuspectVerdict::Common)
                .count();
            if common > 0 {
                summary.push_str(&format!(
                    "; no suspect among the changes ({common} ordinary churn)"
                ));
            }
        }
    }
    f.summary = summary;
    if open.is_empty() && f.status != IncidentStatus::Resolved {
        f.status = IncidentStatus::Resolved;
        f.resolved_at = Some(now);
        tracing::info!(kind = %f.kind, id = %f.id, "fleet incident resolved");
    }
    f.updated_at = f.updated_at.max(now);
    f.revision += 1;
}
