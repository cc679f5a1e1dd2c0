//! One virtual cluster's object store: objects as JSON, a cluster-wide resourceVersion, a bounded watch
//! history (older resourceVersions answer `410 Gone`, as after etcd compaction), list pagination and
//! label/field selectors.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use serde::Deserialize as _;

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use crate::event::EventRecord;
use crate::status::ApiError;

/// A resource, independent of the version it is served in: (group, plural).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResKey {
    /// API group ("" for core).
    pub group: String,
    /// Plural resource name.
    pub plural: String,
}

impl ResKey {
    /// Builds a key.
    pub fn new(group: &str, plural: &str) -> Self {
        ResKey {
            group: group.into(),
            plural: plural.into(),
        }
    }
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

impl EventType {
    /// The watch event `type` string.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watchers see it.
#[derive(Debug, Clone)]
pub struct Change {
    /// resourceVersion of the change.
    pub rv: u64,
    /// Resource changed.
    pub res: ResKey,
    /// Type.
    pub kind: EventType,
    /// The object after the change (before it, for deletions), kept as the store keeps it: an event as its
    /// record or its JSON, so the watch history (1,000 changes a cluster, most of them events) holds well
    /// under 1 KB an event rather than a parsed tree of several.
    object: Slot,
}

impl Change {
    /// The object after the change (before it, for deletions).
    pub fn object(&self) -> Arc<Value> {
        self.object.value()
    }

    /// The event, when the object is one the simulator's kubelets recorded: what a watch serialises
    /// without building the tree.
    pub fn event(&self) -> Option<&EventRecord> {
        match &self.object {
            Slot::Event(e) => Some(e),
            _ => None,
        }
    }

    /// The object's namespace ("" for a cluster-scoped one), without parsing the whole object when it is
    /// kept as JSON: how a namespaced watch passes over another namespace's events.
    pub fn namespace(&self) -> String {
        #[derive(serde::Deserialize, Default)]
        struct Meta {
            #[serde(default)]
            namespace: String,
        }
        #[derive(serde::Deserialize)]
        struct Object {
            #[serde(default)]
            metadata: Meta,
        }
        match &self.object {
            Slot::Tree(v) => str_at(v, &["metadata", "namespace"]).to_string(),
            Slot::Event(e) => e.namespace.to_string(),
            Slot::Json(json) => serde_json::from_slice::<Object>(json)
                .map(|o| o.metadata.namespace)
                .unwrap_or_default(),
        }
    }
}

type ObjKey = (String, String);

/// How an object is kept. Events are the one kind written at a fleet's event rate and read back rarely (a
/// list when a watcher starts, the TTL sweep), and an API server keeps them in etcd for an hour: those the
/// simulator's kubelets record are kept as typed records (~0.6 KB, see [`crate::event`]), those written
/// through the API as their JSON (~0.9 KB), rather than as a parsed tree (~6 KB), which otherwise held
/// well over a GiB in a 30-cluster `steady` run. Everything else stays parsed, as the controllers read it
/// all the time.
#[derive(Debug, Clone)]
enum Slot {
    Tree(Arc<Value>),
    Json(Arc<[u8]>),
    Event(Arc<EventRecord>),
}

impl Slot {
    fn new(res: &ResKey, obj: &Arc<Value>) -> Slot {
        if res.plural == "events" {
            // a Value always serializes; the tree is kept in the impossible other case
            if let Ok(json) = serde_json::to_vec(&**obj) {
                return Slot::Json(json.into());
            }
        }
        Slot::Tree(obj.clone())
    }

    /// The object (built anew when kept as JSON or a record; what `new` wrote always parses).
    fn value(&self) -> Arc<Value> {
        match self {
            Slot::Tree(v) => v.clone(),
            Slot::Json(json) => Arc::new(serde_json::from_slice(json).unwrap_or(Value::Null)),
            Slot::Event(e) => Arc::new(e.to_value()),
        }
    }
}

/// An event to change, as the store keeps it.
#[derive(Debug)]
pub enum EventMut<'a> {
    /// Recorded by the simulator.
    Record(&'a mut EventRecord),
    /// Written through the API.
    Tree(&'a mut Value),
}

/// Changes after the backlog, as they happen.
pub type Subscription = broadcast::Receiver<Arc<Change>>;

#[derive(Debug, Default)]
struct Inner {
    rv: u64,
    objects: HashMap<ResKey, BTreeMap<ObjKey, Slot>>,
    history: VecDeque<(std::time::Instant, Arc<Change>)>,
    /// Changes at or below this resourceVersion are no longer in the history.
    compacted: u64,
    /// Per resource, the watchers' channel (as the apiserver keeps one watch cache per resource: a
    /// watcher wakes only for changes of its resource).
    watchers: HashMap<ResKey, broadcast::Sender<Arc<Change>>>,
    /// Per resource picked from by [`Store::nth`], its objects in key order, until the next change of one.
    picks: HashMap<ResKey, Vec<Slot>>,
}

/// The store. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Store {
    inner: Mutex<Inner>,
    history_limit: usize,
    history_age: std::time::Duration,
}

/// One page of a list.
#[derive(Debug)]
pub struct Page {
    /// Items in key order.
    pub items: Vec<Arc<Value>>,
    /// resourceVersion of the list.
    pub rv: u64,
    /// Continue token, when more items follow.
    pub continue_token: Option<String>,
    /// How many items follow this page: only for a list without a filter (the API server leaves
    /// `remainingItemCount` unset when the list has a label or field selector).
    pub remaining: Option<usize>,
}

/// Ways to read an object's position: (namespace, name).
pub fn obj_key(obj: &Value) -> ObjKey {
    (
        str_at(obj, &["metadata", "namespace"]).to_string(),
        str_at(obj, &["metadata", "name"]).to_string(),
    )
}

/// A string at a path, "" when absent.
pub fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(next) => cur = next,
            None => return "",
        }
    }
    cur.as_str().unwrap_or("")
}

/// A JSON pointer lookup answering as `Value::pointer` does, without allocating: serde_json's unescapes
/// every token into two new strings, which made its lookups a fifth of the simulator's CPU at 50 clusters
/// (the controllers read each Deployment's status and spec fields every 700 ms).
pub trait Pointer {
    /// The value at `pointer` (RFC 6901), `None` when absent.
    fn at(&self, pointer: &str) -> Option<&Value>;
}

impl Pointer for Value {
    fn at(&self, pointer: &str) -> Option<&Value> {
        if pointer.is_empty() {
            return Some(self);
        }
        let mut cur = self;
        for token in pointer.strip_prefix('/')?.split('/') {
            let unescaped;
            let token = if token.contains('~') {
                unescaped = token.replace("~1", "/").replace("~0", "~");
                unescaped.as_str()
            } else {
                token
            };
            cur = match cur {
                Value::Object(map) => map.get(token)?,
                // as serde_json: no sign, no leading zero
                Value::Array(list)
                    if !token.starts_with('+') && (token == "0" || !token.starts_with('0')) =>
                {
                    list.get(token.parse::<usize>().ok()?)?
                }
                _ => return None,
            };
        }
        Some(cur)
    }
}

impl Store {
    /// A store keeping the last `history_limit` changes for watch resumption, none older than five minutes
    /// (the apiserver's default `--etcd-compaction-interval`).
    pub fn new(history_limit: usize) -> Self {
        Self::with_compaction(history_limit, std::time::Duration::from_secs(300))
    }

    /// A store keeping at most `history_limit` changes, none older than `age`.
    pub fn with_compaction(history_limit: usize, age: std::time::Duration) -> Self {
        Store {
            inner: Mutex::new(Inner::default()),
            history_limit: history_limit.max(16),
            history_age: age,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock would leave a half-applied change; the store has no such path,
        // so a poisoned lock is taken over as is.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Number of objects stored.
    pub fn len(&self) -> usize {
        self.lock().objects.values().map(BTreeMap::len).sum()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counts per resource.
    pub fn counts(&self) -> BTreeMap<ResKey, usize> {
        self.lock()
            .objects
            .iter()
            .map(|(k, v)| (k.clone(), v.len()))
            .collect()
    }

    /// Gets one object.
    pub fn get(&self, res: &ResKey, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.lock()
            .objects
            .get(res)?
            .get(&(ns.to_string(), name.to_string()))
            .map(Slot::value)
    }

    /// Whether an object exists (without reading it: an event kept as JSON is not parsed).
    pub fn contains(&self, res: &ResKey, ns: &str, name: &str) -> bool {
        self.lock()
            .objects
            .get(res)
            .is_some_and(|m| m.contains_key(&(ns.to_string(), name.to_string())))
    }

    /// The events of `res` last seen (`lastTimestamp`) before `cutoff`, for the TTL sweep: a recorded
    /// event is read as it is, one kept as JSON only for that field. An event without a readable
    /// `lastTimestamp` is not listed.
    pub fn events_last_seen_before(&self, res: &ResKey, cutoff: DateTime<Utc>) -> Vec<ObjKey> {
        /// The one field the sweep reads.
        #[derive(serde::Deserialize)]
        struct Seen {
            #[serde(rename = "lastTimestamp", default)]
            last: Option<String>,
        }
        let before = |seen: Option<Seen>| {
            seen.and_then(|s| s.last)
                .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
                .is_some_and(|t| t < cutoff)
        };
        let inner = self.lock();
        let Some(map) = inner.objects.get(res) else {
            return Vec::new();
        };
        map.iter()
            .filter(|(_, slot)| match slot {
                Slot::Event(e) => e.last < cutoff,
                Slot::Json(json) => before(serde_json::from_slice(json).ok()),
                Slot::Tree(v) => before(Seen::deserialize(&**v).ok()),
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The `i % count`-th object of a resource (key order): how the simulation picks a random pod 50 times
    /// a second per cluster. The objects are listed once (shared, not copied) and kept until the next
    /// change of one of them, a few times a second for pods: walking the map each time, and then looking
    /// the key up in it, was 4 % of the simulator's CPU at 50 clusters.
    pub fn nth(&self, res: &ResKey, i: usize) -> Option<Arc<Value>> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let map = inner.objects.get(res)?;
        if map.is_empty() {
            return None;
        }
        let picks = inner
            .picks
            .entry(res.clone())
            .or_insert_with(|| map.values().cloned().collect());
        Some(picks[i % picks.len()].value())
    }

    /// All objects of a resource (optionally one namespace).
    pub fn all(&self, res: &ResKey, ns: Option<&str>) -> Vec<Arc<Value>> {
        let inner = self.lock();
        let Some(map) = inner.objects.get(res) else {
            return Vec::new();
        };
        map.iter()
            .filter(|((n, _), _)| ns.is_none_or(|want| want == n))
            .map(|(_, v)| v.value())
            .collect()
    }

    fn commit(
        &self,
        inner: &mut Inner,
        res: &ResKey,
        kind: EventType,
        mut obj: Value,
    ) -> Arc<Value> {
        inner.rv += 1;
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert(
                "resourceVersion".into(),
                Value::String(inner.rv.to_string()),
            );
        }
        let obj = Arc::new(obj);
        self.record(inner, res, kind, obj_key(&obj), Slot::new(res, &obj));
        obj
    }

    /// Writes a recorded event (see [`commit`](Self::commit)).
    fn commit_event(&self, inner: &mut Inner, res: &ResKey, kind: EventType, mut e: EventRecord) {
        inner.rv += 1;
        e.resource_version = inner.rv;
        let key = (e.namespace.to_string(), e.name.to_string());
        self.record(inner, res, kind, key, Slot::Event(Arc::new(e)));
    }

    /// Stores a write at the current resourceVersion and tells the history and the watchers.
    fn record(&self, inner: &mut Inner, res: &ResKey, kind: EventType, key: ObjKey, slot: Slot) {
        let rv = inner.rv;
        let map = inner.objects.entry(res.clone()).or_default();
        if kind == EventType::Deleted {
            map.remove(&key);
        } else {
            map.insert(key, slot.clone());
        }
        inner.picks.remove(res);
        let change = Arc::new(Change {
            rv,
            res: res.clone(),
            kind,
            object: slot,
        });
        let now = std::time::Instant::now();
        inner.history.push_back((now, change.clone()));
        while inner.history.len() > self.history_limit
            || inner
                .history
                .front()
                .is_some_and(|(t, _)| now.duration_since(*t) > self.history_age)
        {
            if let Some((_, old)) = inner.history.pop_front() {
                inner.compacted = old.rv;
            }
        }
        // Sent under the lock so a watcher that subscribed under the lock sees no gap and no repeat.
        if let Some(tx) = inner.watchers.get(res) {
            let _ = tx.send(change);
        }
    }

    /// Creates an object (metadata.uid, creationTimestamp set by the caller). `409 AlreadyExists` when
    /// present.
    pub fn create(&self, res: &ResKey, obj: Value) -> Result<Arc<Value>, ApiError> {
        let mut inner = self.lock();
        let key = obj_key(&obj);
        if inner.objects.get(res).is_some_and(|m| m.contains_key(&key)) {
            return Err(ApiError::already_exists(&res.group, &res.plural, &key.1));
        }
        Ok(self.commit(&mut inner, res, EventType::Added, obj))
    }

    /// Creates a recorded event. `false` (and nothing written) when one of its name exists.
    pub fn create_event(&self, res: &ResKey, e: EventRecord) -> bool {
        let mut inner = self.lock();
        let key = (e.namespace.to_string(), e.name.to_string());
        if inner.objects.get(res).is_some_and(|m| m.contains_key(&key)) {
            return false;
        }
        self.commit_event(&mut inner, res, EventType::Added, e);
        true
    }

    /// Replaces an object via `f`, which sees the current one (or `None`). `f` returns the new object, or
    /// `None` to delete it. Returns the stored result (the deleted object on deletion) and the event type,
    /// or `f`'s error. Nothing is written when `f` returns the object unchanged.
    pub fn mutate<F>(
        &self,
        res: &ResKey,
        ns: &str,
        name: &str,
        f: F,
    ) -> Result<(Arc<Value>, Option<EventType>), ApiError>
    where
        F: FnOnce(Option<&Value>) -> Result<Option<Value>, ApiError>,
    {
        let mut inner = self.lock();
        let key = (ns.to_string(), name.to_string());
        let current = inner
            .objects
            .get(res)
            .and_then(|m| m.get(&key))
            .map(Slot::value);
        let next = f(current.as_deref())?;
        match (current, next) {
            (None, None) => Err(ApiError::not_found(&res.group, &res.plural, name)),
            (None, Some(new)) => Ok((
                self.commit(&mut inner, res, EventType::Added, new),
                Some(EventType::Added),
            )),
            (Some(old), Some(new)) => {
                if equal_but_rv(&old, &new) {
                    return Ok((old, None));
                }
                Ok((
                    self.commit(&mut inner, res, EventType::Modified, new),
                    Some(EventType::Modified),
                ))
            }
            (Some(old), None) => {
                let gone = (*old).clone();
                Ok((
                    self.commit(&mut inner, res, EventType::Deleted, gone),
                    Some(EventType::Deleted),
                ))
            }
        }
    }

    /// Changes an event in place through `f`, which must change it (it is written whatever `f` does): the
    /// event is not compared, which is how a repeat bumps its count 50 times a second per cluster. `f` sees
    /// the record, or the tree of an event written through the API (kept as JSON). Returns whether the
    /// event was there.
    pub fn update_event(
        &self,
        res: &ResKey,
        ns: &str,
        name: &str,
        f: impl FnOnce(EventMut<'_>),
    ) -> bool {
        let mut inner = self.lock();
        let key = (ns.to_string(), name.to_string());
        let Some(slot) = inner.objects.get(res).and_then(|m| m.get(&key)) else {
            return false;
        };
        match slot {
            Slot::Event(e) => {
                // the history may hold the old version: it is copied (a few small strings), not shared
                let mut e = EventRecord::clone(e);
                f(EventMut::Record(&mut e));
                self.commit_event(&mut inner, res, EventType::Modified, e);
            }
            Slot::Json(_) | Slot::Tree(_) => {
                // an event's JSON parses into an object of its own, taken without a copy (a tree, kept
                // only when an event could not be written as JSON, is copied)
                let mut obj = Arc::unwrap_or_clone(slot.value());
                f(EventMut::Tree(&mut obj));
                self.commit(&mut inner, res, EventType::Modified, obj);
            }
        }
        true
    }

    /// Lists a resource, the objects `filter` keeps (all without one). `continue_token` resumes a previous
    /// page; a token older than the history is `410 Expired`, as the real apiserver answers after
    /// compaction.
    pub fn list(
        &self,
        res: &ResKey,
        ns: Option<&str>,
        filter: Option<&dyn Fn(&Value) -> bool>,
        limit: Option<usize>,
        continue_token: Option<&str>,
    ) -> Result<Page, ApiError> {
        let inner = self.lock();
        let (list_rv, start) = match continue_token {
            Some(token) => {
                let (rv, start) = decode_continue(token)?;
                if rv < inner.compacted {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                }
                (rv, Some(start))
            }
            None => (inner.rv, None),
        };
        let Some(map) = inner.objects.get(res) else {
            return Ok(Page {
                items: Vec::new(),
                rv: list_rv,
                continue_token: None,
                remaining: None,
            });
        };
        let keep = |v: &Value| filter.is_none_or(|f| f(v));
        let mut rest = map
            .iter()
            .filter(|((n, _), _)| ns.is_none_or(|want| want == n))
            .filter(|(k, _)| start.as_ref().is_none_or(|s| *k > s));
        let limit = limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let mut items = Vec::new();
        let mut last = None;
        for (k, slot) in rest.by_ref() {
            let v = slot.value();
            if !keep(&v) {
                continue;
            }
            items.push(v);
            last = Some(k.clone());
            if items.len() == limit {
                break;
            }
        }
        // what follows is counted without reading it when there is no filter; with one, only whether
        // anything follows is found out
        let (more, remaining) = match filter {
            None => {
                let n = rest.count();
                (n > 0, Some(n))
            }
            Some(_) => (rest.any(|(_, slot)| keep(&slot.value())), None),
        };
        let continue_token = match (more, last) {
            (false, _) | (_, None) => None,
            (true, Some(last)) => Some(encode_continue(list_rv, &last)),
        };
        Ok(Page {
            items,
            rv: list_rv,
            continue_token,
            remaining,
        })
    }

    /// Starts a watch of `res` after `from` (exclusive): its retained changes since then and a receiver for
    /// its next ones, with no gap between them. `410 Expired` when `from` is older than the history.
    pub fn watch_from(
        &self,
        res: &ResKey,
        from: u64,
    ) -> Result<(Vec<Arc<Change>>, Subscription), ApiError> {
        let mut inner = self.lock();
        if from < inner.compacted {
            return Err(ApiError::expired(&format!(
                "too old resource version: {from} ({})",
                inner.compacted + 1
            )));
        }
        let backlog = inner
            .history
            .iter()
            .filter(|(_, c)| c.rv > from && c.res == *res)
            .map(|(_, c)| c.clone())
            .collect();
        // Every slot keeps a version of an object alive until it is overwritten: 1,024 changes of one
        // resource are ~50 s of a busy cluster's events for a slow watcher (which then gets 410 and
        // relists), and bound the memory.
        let tx = inner
            .watchers
            .entry(res.clone())
            .or_insert_with(|| broadcast::channel(1024).0);
        Ok((backlog, tx.subscribe()))
    }

    /// Forgets the watch history (as an etcd compaction does): every resume from an older
    /// resourceVersion now gets `410 Gone`.
    pub fn compact(&self) {
        let mut inner = self.lock();
        // etcd's revision moves on with every write the cluster makes (leases, events); compaction at that
        // revision leaves every client's last-seen resourceVersion behind it.
        inner.rv += 1;
        inner.history.clear();
        inner.compacted = inner.rv;
    }
}

/// Whether two versions of an object are the same but for `metadata.resourceVersion` (compared in place:
/// every write asks).
fn equal_but_rv(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let meta_equal = |x: Option<&Value>, y: Option<&Value>| match (
        x.and_then(Value::as_object),
        y.and_then(Value::as_object),
    ) {
        (Some(x), Some(y)) => {
            let count = |m: &serde_json::Map<String, Value>| {
                m.len() - usize::from(m.contains_key("resourceVersion"))
            };
            count(x) == count(y)
                && x.iter()
                    .filter(|(k, _)| k.as_str() != "resourceVersion")
                    .all(|(k, v)| y.get(k) == Some(v))
        }
        _ => x == y,
    };
    a.len() == b.len()
        && a.iter().all(|(k, v)| {
            if k == "metadata" {
                meta_equal(Some(v), b.get(k))
            } else {
                b.get(k) == Some(v)
            }
        })
}

fn encode_continue(rv: u64, last: &ObjKey) -> String {
    use base64::Engine as _;
    let raw = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": [last.0, last.1]}).to_string();
    base64::engine::general_purpose::STANDARD.encode(raw)
}

fn decode_continue(token: &str) -> Result<(u64, ObjKey), ApiError> {
    use base64::Engine as _;
    let bad = || {
        ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion")
    };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v.get("start").and_then(Value::as_array).ok_or_else(bad)?;
    let part = |i: usize| start.get(i).and_then(Value::as_str).map(str::to_string);
    Ok((rv, (part(0).ok_or_else(bad)?, part(1).ok_or_else(bad)?)))
}

// ---------------------------------------------------------------------------------------------------------
// Selectors

/// A parsed label selector (`a=b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`).
#[derive(Debug, Clone, Default)]
pub struct LabelSelector(multipilot_schemas::selector::Selector);

impl LabelSelector {
    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Parses a selector (the product's grammar is the API server's); `400` with the reason when
    /// malformed.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        multipilot_schemas::selector::Selector::parse(s)
            .map(LabelSelector)
            .map_err(|e| {
                ApiError::bad_request(&format!("unable to parse requirement: {}", e.reason))
            })
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.0
            .matches(|k| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
    }
}

/// A parsed field selector: `path=value` / `path!=value` on dotted paths (`metadata.name`,
/// `spec.nodeName`, `status.phase`, `involvedObject.uid`…).
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(Vec<String>, String, bool)>);

impl FieldSelector {
    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Parses a selector.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v, eq) = if let Some((k, v)) = part.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, v, true)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, v, true)
            } else {
                return Err(ApiError::bad_request(&format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                )));
            };
            out.push((
                k.trim().split('.').map(str::to_string).collect(),
                v.trim().to_string(),
                eq,
            ));
        }
        Ok(FieldSelector(out))
    }

    /// Whether `obj` satisfies every term (a missing field reads as "").
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, want, eq)| {
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            let mut cur = obj;
            let mut got = String::new();
            let mut found = true;
            for p in &path {
                match cur.get(p) {
                    Some(n) => cur = n,
                    None => {
                        found = false;
                        break;
                    }
                }
            }
            if found {
                got = match cur {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
            }
            (got == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(ns: &str, name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": ns, "name": name, "labels": {"app": name}}})
    }

    /// Every pointer to every value of an object, escaped, and variants that must miss.
    fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
        out.push(at.clone());
        for bad in ["/+0", "/01", "/-", "/", "/~2", "x"] {
            out.push(format!("{at}{bad}"));
        }
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    let token = k.replace('~', "~0").replace('/', "~1");
                    pointers(child, format!("{at}/{token}"), out);
                    out.push(format!("{at}/{k}"));
                }
            }
            Value::Array(a) => {
                for (i, child) in a.iter().enumerate() {
                    pointers(child, format!("{at}/{i}"), out);
                }
                out.push(format!("{at}/{}", a.len()));
            }
            _ => {}
        }
    }

    #[test]
    fn a_pointer_finds_what_serde_json_finds() {
        let obj = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "generation": 3,
                "labels": {"app.kubernetes.io/name": "web", "a~b": "tilde", "~1": "escaped", "": "empty"},
                "annotations": {"sim.multipilot.dev/fixture": "x", "01": "zero", "0": "zero too"}},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "app", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                {"name": "side", "ports": [{"containerPort": 80}, {"containerPort": 443}]}
            ]}}},
            "status": {"conditions": [], "observedGeneration": 3, "nested": [[1, [2, {"x": null}]]]}
        });
        let mut all = Vec::new();
        pointers(&obj, String::new(), &mut all);
        let mut found = 0;
        for p in &all {
            assert_eq!(obj.at(p), obj.pointer(p), "{p:?}");
            found += usize::from(obj.at(p).is_some());
        }
        // the walk reaches every value, and most variants miss
        assert!(
            found > 40 && found < all.len() / 2,
            "{found} of {}",
            all.len()
        );
    }

    #[test]
    fn a_change_tells_its_namespace_as_its_object_does() {
        let s = Store::new(100);
        let events = ResKey::new("", "events");
        let maps = ResKey::new("", "configmaps");
        let (_, mut ev) = s.watch_from(&events, 0).unwrap();
        let (_, mut cms) = s.watch_from(&maps, 0).unwrap();
        s.create(
            &events,
            json!({"kind": "Event", "metadata": {"namespace": "a", "name": "e"}, "message": "m"}),
        )
        .unwrap();
        s.create(
            &events,
            json!({"kind": "Event", "metadata": {"name": "cluster-wide"}}),
        )
        .unwrap();
        s.create(&maps, cm("b", "x")).unwrap();
        let changes = [ev.try_recv(), ev.try_recv(), cms.try_recv()];
        for (ch, want) in changes.into_iter().zip(["a", "", "b"]) {
            let ch = ch.unwrap();
            assert_eq!(ch.namespace(), want);
            assert_eq!(str_at(&ch.object(), &["metadata", "namespace"]), want);
        }
        assert!(matches!(
            ev.try_recv().unwrap_err(),
            broadcast::error::TryRecvError::Empty
        ));
    }

    #[test]
    fn the_event_sweep_finds_old_events_however_they_are_kept() {
        let s = Store::new(100);
        let res = ResKey::new("", "events");
        let t = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().to_utc();
        let recorded = |name: &str, last: &str| EventRecord {
            name: name.into(),
            namespace: "a".into(),
            uid: "u".into(),
            resource_version: 0,
            created: t(last),
            updated: None,
            involved: crate::event::ObjectRef::to(&cm("a", "x")),
            reason: "Pulled".into(),
            message: "m".into(),
            type_: "Normal".into(),
            count: 1,
            first: t(last),
            last: t(last),
            series: None,
            component: "kubelet".into(),
        };
        assert!(s.create_event(&res, recorded("old", "2026-12-06T09:00:00Z")));
        assert!(s.create_event(&res, recorded("new", "2026-12-06T10:30:00Z")));
        assert!(
            !s.create_event(&res, recorded("new", "2026-12-06T10:31:00Z")),
            "a name is taken once"
        );
        let written = |name: &str, last: Value| {
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"namespace": "a", "name": name},
                   "lastTimestamp": last})
        };
        s.create(&res, written("api-old", json!("2026-12-06T08:00:00Z")))
            .unwrap();
        s.create(&res, written("api-new", json!("2026-12-06T10:59:00Z")))
            .unwrap();
        s.create(&res, written("api-untimed", Value::Null)).unwrap();
        let mut stale = s.events_last_seen_before(&res, t("2026-12-06T10:00:00Z"));
        stale.sort();
        assert_eq!(
            stale,
            [("a".into(), "api-old".into()), ("a".into(), "old".into())]
        );
        // every write moved the resourceVersion, the record's included
        let old = s.get(&res, "a", "old").unwrap();
        assert_eq!(old["metadata"]["resourceVersion"], "1");
        assert_eq!(s.resource_version(), 5);
    }

    #[test]
    fn nth_counts_in_key_order_through_additions_removals_and_changes() {
        let s = Store::new(100);
        let res = ResKey::new("", "configmaps");
        let names = |s: &Store| -> Vec<String> {
            (0..s.len())
                .map(|i| str_at(&s.nth(&res, i).unwrap(), &["metadata", "name"]).to_string())
                .collect()
        };
        assert!(s.nth(&res, 0).is_none());
        for n in ["c", "a", "d"] {
            s.create(&res, cm("x", n)).unwrap();
        }
        assert_eq!(names(&s), ["a", "c", "d"]);
        s.create(&res, cm("x", "b")).unwrap();
        assert_eq!(names(&s), ["a", "b", "c", "d"]);
        s.mutate(&res, "x", "c", |_| Ok(None)).unwrap();
        assert_eq!(names(&s), ["a", "b", "d"]);
        assert_eq!(
            str_at(&s.nth(&res, 4).unwrap(), &["metadata", "name"]),
            "b",
            "i wraps around the count"
        );
        // a change in place is seen, and keeps the order
        s.mutate(&res, "x", "d", |cur| {
            let mut next = cur.cloned().unwrap();
            next["data"] = json!({"k": "v"});
            Ok(Some(next))
        })
        .unwrap();
        assert_eq!(s.nth(&res, 2).unwrap()["data"]["k"], "v");
        assert_eq!(names(&s), ["a", "b", "d"]);
    }

    #[test]
    fn pages_follow_each_other_and_end() {
        let s = Store::new(100);
        let res = ResKey::new("", "configmaps");
        for i in 0..7 {
            s.create(&res, cm("a", &format!("cm-{i}"))).unwrap();
        }
        let p1 = s.list(&res, None, None, Some(3), None).unwrap();
        assert_eq!(p1.items.len(), 3);
        assert_eq!(p1.remaining, Some(4));
        let p2 = s
            .list(&res, None, None, Some(3), p1.continue_token.as_deref())
            .unwrap();
        let p3 = s
            .list(&res, None, None, Some(3), p2.continue_token.as_deref())
            .unwrap();
        assert_eq!(p3.items.len(), 1);
        assert!(p3.continue_token.is_none());
        assert_eq!(str_at(&p3.items[0], &["metadata", "name"]), "cm-6");
    }

    #[test]
    fn watch_from_compacted_version_is_gone() {
        let s = Store::new(16);
        let res = ResKey::new("", "configmaps");
        for i in 0..40 {
            s.create(&res, cm("a", &format!("cm-{i}"))).unwrap();
        }
        assert_eq!(s.watch_from(&res, 2).unwrap_err().code, 410);
        let (backlog, _) = s.watch_from(&res, 35).unwrap();
        assert_eq!(backlog.len(), 5);
        s.compact();
        assert_eq!(s.watch_from(&res, 35).unwrap_err().code, 410);
    }

    #[test]
    fn selectors_match_like_the_apiserver() {
        let labels = json!({"app": "web", "tier": "front"});
        let l = labels.as_object();
        assert!(
            LabelSelector::parse("app=web,tier in (front,back)")
                .unwrap()
                .matches(l)
        );
        assert!(!LabelSelector::parse("app!=web").unwrap().matches(l));
        assert!(LabelSelector::parse("!missing,app").unwrap().matches(l));
        assert!(
            !LabelSelector::parse("tier notin (front)")
                .unwrap()
                .matches(l)
        );
        assert!(LabelSelector::parse("app in web").is_err());
        let obj = json!({"metadata": {"name": "x"}, "status": {"phase": "Running"}});
        assert!(
            FieldSelector::parse("status.phase=Running,metadata.name!=y")
                .unwrap()
                .matches(&obj)
        );
        assert!(
            !FieldSelector::parse("spec.nodeName=n1")
                .unwrap()
                .matches(&obj)
        );
        assert!(FieldSelector::parse("bogus").is_err());
    }

    #[test]
    fn unchanged_write_is_not_an_event() {
        let s = Store::new(100);
        let res = ResKey::new("", "configmaps");
        s.create(&res, cm("a", "x")).unwrap();
        let rv = s.resource_version();
        let (_, kind) = s.mutate(&res, "a", "x", |cur| Ok(cur.cloned())).unwrap();
        assert_eq!(kind, None);
        assert_eq!(s.resource_version(), rv);
    }
}
