//! Field management: server-side apply with `managedFields` in the real `FieldsV1` format, conflicts
//! between managers, `force`, and ownership taken by ordinary updates.
//!
//! The merge follows the structured-merge rules closely enough for what releases do: maps merge
//! recursively; lists whose items are all objects with a `name` are associative (keyed by `name`, as
//! containers, env, ports and volumes are); every other list is atomic.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::store::Pointer;

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Seg {
    /// A map key (`f:<key>`).
    Field(String),
    /// An associative-list item by name (`k:{"name":"<v>"}`).
    Key(String),
}

/// A field path.
pub type Path = Vec<Seg>;

/// `.spec.template.spec.containers[name="web"].image`: how conflicts name a field.
pub fn path_string(p: &Path) -> String {
    let mut s = String::new();
    for seg in p {
        match seg {
            Seg::Field(f) => {
                s.push('.');
                s.push_str(f);
            }
            Seg::Key(k) => s.push_str(&format!("[name=\"{k}\"]")),
        }
    }
    s
}

fn is_assoc(list: &[Value]) -> bool {
    !list.is_empty()
        && list
            .iter()
            .all(|i| i.get("name").and_then(Value::as_str).is_some())
}

/// Leaf paths set by `v` (the fields a manager owns by sending `v`). Identity and server-managed fields
/// are not owned.
pub fn leaves(v: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    if let Some(map) = v.as_object() {
        for (k, child) in map {
            if k == "apiVersion" || k == "kind" || k == "status" {
                continue;
            }
            if k == "metadata" {
                if let Some(meta) = child.as_object() {
                    for mk in ["labels", "annotations"] {
                        if let Some(m) = meta.get(mk) {
                            walk(
                                m,
                                &mut vec![Seg::Field("metadata".into()), Seg::Field(mk.into())],
                                &mut out,
                            );
                        }
                    }
                    if let Some(f) = meta.get("finalizers") {
                        let _ = f;
                        out.insert(vec![
                            Seg::Field("metadata".into()),
                            Seg::Field("finalizers".into()),
                        ]);
                    }
                }
                continue;
            }
            walk(child, &mut vec![Seg::Field(k.clone())], &mut out);
        }
    }
    out
}

fn walk(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, child) in map {
                path.push(Seg::Field(k.clone()));
                walk(child, path, out);
                path.pop();
            }
        }
        Value::Array(list) if is_assoc(list) => {
            for item in list {
                let name = item.get("name").and_then(Value::as_str).unwrap_or_default();
                path.push(Seg::Key(name.to_string()));
                // the key field itself is owned with the item
                out.insert(path.clone());
                if let Some(m) = item.as_object() {
                    for (k, child) in m {
                        if k == "name" {
                            continue;
                        }
                        path.push(Seg::Field(k.clone()));
                        walk(child, path, out);
                        path.pop();
                    }
                }
                path.pop();
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

/// The value at a path, if any.
pub fn get<'a>(v: &'a Value, path: &[Seg]) -> Option<&'a Value> {
    let mut cur = v;
    for seg in path {
        cur = match seg {
            Seg::Field(f) => cur.get(f)?,
            Seg::Key(k) => cur
                .as_array()?
                .iter()
                .find(|i| i.get("name").and_then(Value::as_str) == Some(k))?,
        };
    }
    Some(cur)
}

fn remove(v: &mut Value, path: &[Seg]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for seg in parent {
        let next = match seg {
            Seg::Field(f) => cur.get_mut(f),
            Seg::Key(k) => cur.as_array_mut().and_then(|a| {
                a.iter_mut()
                    .find(|i| i.get("name").and_then(Value::as_str) == Some(k))
            }),
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    match last {
        Seg::Field(f) => {
            if let Some(m) = cur.as_object_mut() {
                m.remove(f);
            }
        }
        Seg::Key(k) => {
            if let Some(a) = cur.as_array_mut() {
                a.retain(|i| i.get("name").and_then(Value::as_str) != Some(k));
            }
        }
    }
}

/// Merges `patch` into `base` with the structured-merge rules above.
pub fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, pv) in p {
                match b.get_mut(k) {
                    Some(bv) => merge(bv, pv),
                    None => {
                        b.insert(k.clone(), pv.clone());
                    }
                }
            }
        }
        (Value::Array(b), Value::Array(p)) if is_assoc(p) && (b.is_empty() || is_assoc(b)) => {
            for item in p {
                let name = item.get("name");
                match b.iter_mut().find(|i| i.get("name") == name) {
                    Some(existing) => merge(existing, item),
                    None => b.push(item.clone()),
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

/// Converts a set of paths to `FieldsV1` JSON.
pub fn to_fields_v1(paths: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for p in paths {
        let mut cur = &mut root;
        for seg in p {
            let key = match seg {
                Seg::Field(f) => format!("f:{f}"),
                Seg::Key(k) => format!("k:{}", json!({"name": k})),
            };
            let entry = cur.entry(key).or_insert_with(|| json!({}));
            if matches!(seg, Seg::Key(_)) {
                entry
                    .as_object_mut()
                    .map(|m| m.entry(".").or_insert_with(|| json!({})));
            }
            cur = match entry.as_object_mut() {
                Some(m) => m,
                None => break,
            };
        }
    }
    Value::Object(root)
}

/// Reads `FieldsV1` JSON back into leaf paths.
pub fn from_fields_v1(v: &Value) -> BTreeSet<Path> {
    fn rec(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
        let Some(m) = v.as_object() else { return };
        let children: Vec<_> = m.iter().filter(|(k, _)| *k != ".").collect();
        if (children.is_empty() || m.contains_key(".")) && !path.is_empty() {
            out.insert(path.clone());
        }
        for (k, child) in children {
            let seg = if let Some(f) = k.strip_prefix("f:") {
                Seg::Field(f.to_string())
            } else if let Some(key) = k.strip_prefix("k:") {
                let name = serde_json::from_str::<Value>(key)
                    .ok()
                    .and_then(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or_default();
                Seg::Key(name)
            } else {
                continue;
            };
            path.push(seg);
            rec(child, path, out);
            path.pop();
        }
    }
    let mut out = BTreeSet::new();
    rec(v, &mut Vec::new(), &mut out);
    out
}

/// Who owns fields: a manager, the operation it wrote with (`Apply` or `Update`) and the subresource it wrote
/// through (`""` for the object itself, `"scale"`, `"status"`), as a `managedFields` entry names it. The
/// apiserver keeps one entry per distinct triple.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner {
    /// `manager`.
    pub manager: String,
    /// `operation`.
    pub operation: String,
    /// `subresource` (empty for the main resource).
    pub subresource: String,
}

impl Owner {
    /// An owner writing through the main resource.
    pub fn new(manager: &str, operation: &str) -> Self {
        Owner::with_subresource(manager, operation, "")
    }

    /// An owner writing through `subresource`.
    pub fn with_subresource(manager: &str, operation: &str, subresource: &str) -> Self {
        Owner {
            manager: manager.to_string(),
            operation: operation.to_string(),
            subresource: subresource.to_string(),
        }
    }

    /// How an apply conflict names the owner: `"alice"`, or `"kubectl" with subresource "scale"` (the
    /// apiserver's wording).
    pub fn describe(&self) -> String {
        if self.subresource.is_empty() {
            format!("\"{}\"", self.manager)
        } else {
            format!(
                "\"{}\" with subresource \"{}\"",
                self.manager, self.subresource
            )
        }
    }
}

/// Owners and their fields (with the apiVersion each wrote in).
#[derive(Debug, Clone, Default)]
pub struct Managed(pub BTreeMap<Owner, (String, BTreeSet<Path>)>);

impl Managed {
    /// Reads `metadata.managedFields`.
    pub fn read(obj: &Value) -> Self {
        let mut m = BTreeMap::new();
        if let Some(list) = obj.at("/metadata/managedFields").and_then(Value::as_array) {
            for e in list {
                let field = |k: &str, default: &'static str| {
                    e.get(k).and_then(Value::as_str).unwrap_or(default)
                };
                let fields = e.get("fieldsV1").map(from_fields_v1).unwrap_or_default();
                m.insert(
                    Owner::with_subresource(
                        field("manager", ""),
                        field("operation", "Update"),
                        field("subresource", ""),
                    ),
                    (field("apiVersion", "").to_string(), fields),
                );
            }
        }
        Managed(m)
    }

    /// Writes `metadata.managedFields` (managers owning nothing are dropped).
    pub fn write(&self, obj: &mut Value, time: &str) {
        let list: Vec<Value> = self
            .0
            .iter()
            .filter(|(_, (_, f))| !f.is_empty())
            .map(|(owner, (api, fields))| {
                let mut e = json!({
                    "manager": owner.manager, "operation": owner.operation, "apiVersion": api, "time": time,
                    "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(fields),
                });
                if !owner.subresource.is_empty() {
                    e["subresource"] = json!(owner.subresource);
                }
                e
            })
            .collect();
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Server-side apply of `applied` by `manager` onto `current` (None = create). Returns the new object,
/// or the conflicting (owner as [`Owner::describe`] names it, field) pairs when `force` is false.
pub fn apply(
    current: Option<&Value>,
    applied: &Value,
    manager: &str,
    api_version: &str,
    force: bool,
    time: &str,
) -> Result<Value, Vec<(String, String)>> {
    let applied_paths = leaves(applied);
    let me = Owner::new(manager, "Apply");
    let mut managed = current.map(Managed::read).unwrap_or_default();
    let mut obj = current.cloned().unwrap_or_else(|| json!({}));

    // Conflicts: a field another manager owns, whose value this apply changes.
    let mut conflicts = Vec::new();
    for (owner, (_, fields)) in &managed.0 {
        if *owner == me {
            continue;
        }
        for p in fields.intersection(&applied_paths) {
            if get(&obj, p) != get(applied, p) {
                conflicts.push((owner.describe(), path_string(p)));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        conflicts.sort();
        conflicts.dedup();
        return Err(conflicts);
    }
    if force {
        for (owner, (_, fields)) in managed.0.iter_mut() {
            if *owner == me {
                continue;
            }
            let taken: Vec<Path> = fields
                .intersection(&applied_paths)
                .filter(|p| get(&obj, p) != get(applied, p))
                .cloned()
                .collect();
            for p in taken {
                fields.remove(&p);
            }
        }
    }

    // Fields this manager applied before and no longer sends are removed, unless someone else owns them.
    let previous = managed
        .0
        .get(&me)
        .map(|(_, f)| f.clone())
        .unwrap_or_default();
    for p in previous.difference(&applied_paths) {
        let owned_elsewhere = managed
            .0
            .iter()
            .any(|(o, (_, f))| *o != me && f.contains(p));
        if !owned_elsewhere {
            remove(&mut obj, p);
            // an emptied map disappears, as Go's `omitempty` maps and optional structs do
            for depth in (1..p.len()).rev() {
                if get(&obj, &p[..depth])
                    .is_some_and(|v| v.as_object().is_some_and(|m| m.is_empty()))
                {
                    remove(&mut obj, &p[..depth]);
                } else {
                    break;
                }
            }
        }
    }
    let mut body = applied.clone();
    if let Some(m) = body.as_object_mut() {
        m.remove("status");
    }
    merge(&mut obj, &body);
    managed
        .0
        .insert(me, (api_version.to_string(), applied_paths));
    managed.write(&mut obj, time);
    Ok(obj)
}

/// Records an ordinary write (create, update, merge patch) by `manager`: the fields whose values it set
/// or changed become its (operation `Update`) and leave other managers.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    time: &str,
) {
    record_update_in(old, new, &Owner::new(manager, "Update"), api_version, time);
}

/// [`record_update`] by any owner: e.g. an `Update` through the `scale` subresource, whose entry names
/// `subresource: scale` (the apiserver's `ScaleHandler` moves `.spec.replicas` to it from whoever owned it).
pub fn record_update_in(
    old: Option<&Value>,
    new: &mut Value,
    me: &Owner,
    api_version: &str,
    time: &str,
) {
    let mut managed = old.map(Managed::read).unwrap_or_default();
    let changed: BTreeSet<Path> = leaves(new)
        .into_iter()
        .filter(|p| old.is_none_or(|o| get(o, p) != get(new, p)))
        .collect();
    if changed.is_empty() {
        managed.write(new, time);
        return;
    }
    for (owner, (_, fields)) in managed.0.iter_mut() {
        if owner != me {
            fields.retain(|p| !changed.contains(p));
        }
    }
    let entry = managed
        .0
        .entry(me.clone())
        .or_insert_with(|| (api_version.to_string(), BTreeSet::new()));
    entry.0 = api_version.to_string();
    entry.1.extend(changed);
    managed.write(new, time);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy(replicas: u64, image: &str) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "web", "image": image}]}}}
        })
    }

    #[test]
    fn fields_v1_round_trips() {
        let paths = leaves(&deploy(2, "nginx:1"));
        let v = to_fields_v1(&paths);
        assert!(
            v.at("/f:spec/f:template/f:spec/f:containers/k:{\"name\":\"web\"}/f:image")
                .is_some()
        );
        assert_eq!(from_fields_v1(&v), paths);
    }

    #[test]
    fn other_managers_changed_field_conflicts_unless_forced() {
        let t = "2026-01-01T00:00:00Z";
        let a = apply(None, &deploy(2, "nginx:1"), "alice", "apps/v1", false, t).unwrap();
        // same value: shared ownership, no conflict
        apply(Some(&a), &deploy(2, "nginx:1"), "bob", "apps/v1", false, t).unwrap();
        let err = apply(Some(&a), &deploy(3, "nginx:1"), "bob", "apps/v1", false, t).unwrap_err();
        assert_eq!(
            err,
            vec![("\"alice\"".to_string(), ".spec.replicas".to_string())]
        );
        let forced = apply(Some(&a), &deploy(3, "nginx:1"), "bob", "apps/v1", true, t).unwrap();
        assert_eq!(forced.at("/spec/replicas"), Some(&json!(3)));
        let m = Managed::read(&forced);
        let alice = &m.0[&Owner::new("alice", "Apply")].1;
        assert!(!alice.contains(&vec![
            Seg::Field("spec".into()),
            Seg::Field("replicas".into())
        ]));
    }

    #[test]
    fn field_dropped_from_apply_is_removed() {
        let t = "2026-01-01T00:00:00Z";
        let mut first = deploy(2, "nginx:1");
        first["metadata"]["labels"]["extra"] = json!("yes");
        let a = apply(None, &first, "alice", "apps/v1", false, t).unwrap();
        let b = apply(
            Some(&a),
            &deploy(2, "nginx:1"),
            "alice",
            "apps/v1",
            false,
            t,
        )
        .unwrap();
        assert!(b.at("/metadata/labels/extra").is_none());
        assert_eq!(b.at("/metadata/labels/app"), Some(&json!("web")));
    }

    #[test]
    fn update_takes_ownership() {
        let t = "2026-01-01T00:00:00Z";
        let a = apply(None, &deploy(2, "nginx:1"), "alice", "apps/v1", false, t).unwrap();
        let mut scaled = a.clone();
        scaled["spec"]["replicas"] = json!(5);
        record_update(Some(&a), &mut scaled, "kubectl-scale", "apps/v1", t);
        let err = apply(
            Some(&scaled),
            &deploy(2, "nginx:1"),
            "alice",
            "apps/v1",
            false,
            t,
        )
        .unwrap_err();
        assert_eq!(err[0].0, "\"kubectl-scale\"");
    }
}
