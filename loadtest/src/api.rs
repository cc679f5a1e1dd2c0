//! The Kubernetes HTTP API of one virtual cluster: discovery, health, metrics, get/list/watch,
//! create/update/patch (server-side apply included)/delete, `dryRun`, finalizers, Tables for kubectl, the
//! `scale` subresource, and the service/pod proxy used to scrape metrics (the exporters', and a Service's
//! workloads' request counters).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use rand::Rng;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use crate::apply;
use crate::cluster::Cluster;
use crate::metrics;
use crate::profile::ApiResource;
use crate::status::ApiError;
use crate::store::{Change, EventType, FieldSelector, LabelSelector, Pointer, ResKey, str_at};

/// The router of one cluster.
pub fn router(cluster: Arc<Cluster>) -> Router {
    Router::new().fallback(handle).with_state(cluster)
}

type Query = BTreeMap<String, String>;

fn parse_query(uri: &Uri) -> Query {
    let mut q = Query::new();
    if let Some(raw) = uri.query() {
        for pair in raw.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            q.insert(pct_decode(k), pct_decode(v));
        }
    }
    q
}

fn pct_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn json_response(code: StatusCode, v: &Value) -> Response {
    let mut r = (code, v.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &ApiError) -> Response {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = json_response(code, &e.to_status());
    if e.code == 429 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

fn text(code: StatusCode, body: String) -> Response {
    let mut r = (code, body).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Paths anyone may read (the apiserver's `system:public-info-viewer`).
fn is_public(path: &str) -> bool {
    matches!(path, "/version" | "/healthz" | "/livez" | "/readyz")
        || path.starts_with("/livez/")
        || path.starts_with("/readyz/")
}

async fn handle(
    State(c): State<Arc<Cluster>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = std::time::Instant::now();
    let q = parse_query(&uri);
    let verb = match method {
        Method::GET if is_true(q.get("watch")) => "WATCH",
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        _ => "OTHER",
    };
    let path = uri.path().to_string();
    if !is_public(&path) {
        let ok = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| t == c.token);
        if !ok {
            return error_response(&ApiError::unauthorized());
        }
    }
    if let Some(o) = c.faults().overload {
        tokio::time::sleep(Duration::from_millis(o.latency_ms)).await;
        let roll: f64 = c.rng().random();
        if roll < o.error_rate {
            let e = if roll < o.error_rate / 2.0 {
                ApiError::too_many_requests()
            } else {
                ApiError::internal("etcdserver: request timed out")
            };
            c.stats.count(method.as_str(), "", e.code);
            c.stats.observe(verb, started.elapsed().as_secs_f64());
            return error_response(&e);
        }
    }
    let mut resp = match route(&c, &method, &path, &q, &headers, body).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    };
    let date = c.now().format("%a, %d %b %Y %H:%M:%S GMT").to_string();
    if let Ok(v) = HeaderValue::from_str(&date) {
        resp.headers_mut().insert(header::DATE, v);
    }
    if path != "/metrics" {
        c.stats.observe(verb, started.elapsed().as_secs_f64());
    }
    resp
}

async fn route(
    c: &Arc<Cluster>,
    method: &Method,
    path: &str,
    q: &Query,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let p = c.profile();
    let ok = |v: Value| Ok(json_response(StatusCode::OK, &v));
    match segs.as_slice() {
        ["version"] => return ok(p.version_json()),
        ["api"] => return ok(p.core_versions_json(&c.server_url().replace("https://", ""))),
        ["apis"] => return ok(p.group_list_json()),
        ["apis", group] => {
            let list = p.group_list_json();
            let found = list["groups"]
                .as_array()
                .and_then(|gs| gs.iter().find(|g| g["name"] == *group).cloned());
            return match found {
                Some(mut g) => {
                    g["kind"] = json!("APIGroup");
                    g["apiVersion"] = json!("v1");
                    ok(g)
                }
                None => Err(ApiError::no_route()),
            };
        }
        ["api", "v1"] => {
            return p
                .resource_list_json("", "v1")
                .map_or(Err(ApiError::no_route()), ok);
        }
        ["apis", group, version] => {
            return p
                .resource_list_json(group, version)
                .map_or(Err(ApiError::no_route()), ok);
        }
        ["healthz"] | ["livez"] | ["readyz"] => return Ok(health(c, segs[0], None, q)),
        ["livez", check] | ["readyz", check] => return Ok(health(c, segs[0], Some(check), q)),
        ["metrics"] => return Ok(text(StatusCode::OK, metrics::apiserver(c))),
        ["openapi", "v2"] => {
            let mut r = Response::new(Body::from(openapi_v2_protobuf(&p.git_version)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                ),
            );
            return Ok(r);
        }
        ["openapi", "v3"] => return ok(openapi_root(c)),
        ["openapi", "v3", "api", "v1"] => {
            return openapi_gv(c, "", "v1").map_or(Err(ApiError::no_route()), ok);
        }
        ["openapi", "v3", "apis", group, version] => {
            return openapi_gv(c, group, version).map_or(Err(ApiError::no_route()), ok);
        }
        _ => {}
    }
    let (group, version, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::no_route()),
    };
    let target = Target::parse(c, group, version, rest)?;
    if let Some(dep) = deprecated_removal(group, version) {
        let mut m = c.stats.deprecated.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((
            group.to_string(),
            version.to_string(),
            target.res.plural.to_string(),
            dep.to_string(),
        ))
        .or_default() += 1;
    }
    let verb;
    let result = match (method, &target.name, target.sub.as_deref()) {
        (&Method::GET, None, None) if is_true(q.get("watch")) => {
            verb = "WATCH";
            watch(c, &target, q, wants_metadata(headers))
        }
        (&Method::GET, None, None) => {
            verb = "LIST";
            list(c, &target, q, headers)
        }
        (&Method::GET, Some(name), None) => {
            verb = "GET";
            let obj = c
                .store
                .get(&target.key(), target.ns_str(), name)
                .ok_or_else(|| ApiError::not_found(group, target.res.plural, name))?;
            let body = if wants_metadata(headers) {
                Cow::Owned(partial(&obj))
            } else {
                present(&target.res, &obj)
            };
            Ok(json_response(StatusCode::OK, &body))
        }
        (&Method::GET, Some(name), Some("proxy")) => {
            verb = "GET";
            proxy(c, &target, name)
        }
        (&Method::GET, Some(name), Some("status")) => {
            verb = "GET";
            let obj = c
                .store
                .get(&target.key(), target.ns_str(), name)
                .ok_or_else(|| ApiError::not_found(group, target.res.plural, name))?;
            Ok(json_response(StatusCode::OK, &present(&target.res, &obj)))
        }
        (&Method::GET, Some(name), Some("scale")) => {
            verb = "GET";
            get_scale(c, &target, name)
        }
        (&Method::PUT, Some(name), Some("scale")) => {
            verb = "PUT";
            update_scale(c, &target, name, q, headers, &body)
        }
        (&Method::PATCH, Some(name), Some("scale")) => {
            verb = "PATCH";
            patch_scale(c, &target, name, q, headers, &body)
        }
        (&Method::POST, None, None) => {
            verb = "POST";
            create(c, &target, q, headers, &body)
        }
        (&Method::PUT, Some(name), None) => {
            verb = "PUT";
            update(c, &target, name, q, headers, &body)
        }
        (&Method::PATCH, Some(name), sub @ (None | Some("status"))) => {
            verb = "PATCH";
            patch(c, &target, name, sub.is_some(), q, headers, &body)
        }
        (&Method::DELETE, Some(name), None) => {
            verb = "DELETE";
            delete(c, &target, name, q)
        }
        _ => {
            verb = "OTHER";
            Err(ApiError::method_not_allowed())
        }
    };
    let code = match &result {
        Ok(r) => r.status().as_u16(),
        Err(e) => e.code,
    };
    c.stats.count(verb, target.res.plural, code);
    result
}

/// `/openapi/v2` as the gnostic protobuf `Document` clients fetch: `swagger`, `info` and no definitions,
/// so kubectl's client-side validation finds no schema and leaves the checks to the server (which is where
/// the simulator validates).
fn openapi_v2_protobuf(version: &str) -> Vec<u8> {
    fn field(out: &mut Vec<u8>, number: u8, bytes: &[u8]) {
        out.push((number << 3) | 2);
        let mut len = bytes.len();
        loop {
            let b = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
        out.extend_from_slice(bytes);
    }
    let mut info = Vec::new();
    field(&mut info, 1, b"Kubernetes");
    field(&mut info, 2, version.as_bytes());
    let mut doc = Vec::new();
    field(&mut doc, 1, b"2.0");
    field(&mut doc, 2, &info);
    doc
}

/// `/openapi/v3`: the index of per-group-version documents.
fn openapi_root(c: &Cluster) -> Value {
    let mut paths = serde_json::Map::new();
    for (group, version) in c.profile().group_versions() {
        let path = if group.is_empty() {
            format!("api/{version}")
        } else {
            format!("apis/{group}/{version}")
        };
        let hash = format!(
            "{:016X}",
            crate::hash64(&format!("{}/{path}", c.profile().git_version))
        );
        paths.insert(
            path.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}")}),
        );
    }
    json!({"paths": paths})
}

/// One group-version's OpenAPI v3 document: the operations with their GVK extensions and parameters
/// (kubectl reads the PATCH operations to learn that the server validates fields itself). Schemas are
/// left open (`x-kubernetes-preserve-unknown-fields`): the simulator validates what releases meet.
fn openapi_gv(c: &Cluster, group: &str, version: &str) -> Option<Value> {
    let p = c.profile();
    if !p
        .group_versions()
        .iter()
        .any(|(g, v)| *g == group && *v == version)
    {
        return None;
    }
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    let gv_list = p.resource_list_json(group, version)?;
    for r in gv_list["resources"].as_array().into_iter().flatten() {
        let plural = r["name"].as_str().unwrap_or_default();
        if plural.contains('/') {
            continue;
        }
        let Some(res) = p.resource(group, version, plural) else {
            continue;
        };
        let gvk = json!({"group": group, "version": version, "kind": res.kind});
        let param = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
        let params = |extra: &[&str]| {
            let mut v: Vec<Value> = vec![
                param("dryRun"),
                param("fieldManager"),
                param("fieldValidation"),
            ];
            v.extend(extra.iter().map(|e| param(e)));
            v
        };
        let schema_name = format!(
            "io.k8s.sim.{}.{}.{}",
            if group.is_empty() { "core" } else { group },
            version,
            res.kind
        );
        schemas.insert(schema_name.clone(), json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true, "x-kubernetes-group-version-kind": [gvk]}));
        let body = json!({"content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema_name}")}}}});
        let op = |action: &str, extra: &[&str]| {
            json!({"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk, "parameters": params(extra),
                   "operationId": format!("{action}{}", res.kind), "responses": {"200": body.clone()}})
        };
        let item = if res.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{plural}/{{name}}")
        } else {
            format!("{prefix}/{plural}/{{name}}")
        };
        let collection = if res.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{plural}")
        } else {
            format!("{prefix}/{plural}")
        };
        let mut item_ops = serde_json::Map::new();
        let verbs: Vec<&str> = res.verbs.to_vec();
        if verbs.contains(&"get") {
            item_ops.insert("get".into(), op("get", &[]));
        }
        if verbs.contains(&"patch") {
            item_ops.insert("patch".into(), op("patch", &["force"]));
        }
        if verbs.contains(&"update") {
            item_ops.insert("put".into(), op("put", &[]));
        }
        if verbs.contains(&"delete") {
            item_ops.insert("delete".into(), op("delete", &[]));
        }
        paths.insert(item, Value::Object(item_ops));
        if verbs.contains(&"create") || verbs.contains(&"list") {
            let mut coll = serde_json::Map::new();
            if verbs.contains(&"create") {
                coll.insert("post".into(), op("post", &[]));
            }
            if verbs.contains(&"list") {
                coll.insert("get".into(), op("list", &[]));
            }
            paths.insert(collection, Value::Object(coll));
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": p.git_version},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

fn is_true(v: Option<&String>) -> bool {
    v.is_some_and(|v| v == "true" || v == "1")
}

/// The Kubernetes release that removes a deprecated group/version still served by some profiles.
fn deprecated_removal(group: &str, version: &str) -> Option<&'static str> {
    Some(match (group, version) {
        ("batch", "v1beta1")
        | ("policy", "v1beta1")
        | ("discovery.k8s.io", "v1beta1")
        | ("autoscaling", "v2beta1")
        | ("events.k8s.io", "v1beta1")
        | ("node.k8s.io", "v1beta1") => "1.25",
        ("autoscaling", "v2beta2") | ("flowcontrol.apiserver.k8s.io", "v1beta1") => "1.26",
        ("storage.k8s.io", "v1beta1") => "1.27",
        ("flowcontrol.apiserver.k8s.io", "v1beta2") => "1.29",
        ("flowcontrol.apiserver.k8s.io", "v1beta3") => "1.32",
        _ => return None,
    })
}

/// What a resource URL names.
struct Target {
    res: ApiResource,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    /// Path after the subresource (proxy paths).
    tail: String,
}

impl Target {
    fn parse(c: &Cluster, group: &str, version: &str, rest: &[&str]) -> Result<Self, ApiError> {
        let p = c.profile();
        let find = |plural: &str| p.resource(group, version, plural).cloned();
        let (ns, plural, name, sub, tail): (
            Option<&str>,
            &str,
            Option<&str>,
            Option<&str>,
            &[&str],
        ) = match rest {
            ["namespaces", ns, plural, more @ ..] if find(plural).is_some_and(|r| r.namespaced) => {
                (
                    Some(*ns),
                    *plural,
                    more.first().copied(),
                    more.get(1).copied(),
                    more.get(2..).unwrap_or(&[]),
                )
            }
            [plural, more @ ..] => (
                None,
                *plural,
                more.first().copied(),
                more.get(1).copied(),
                more.get(2..).unwrap_or(&[]),
            ),
            [] => return Err(ApiError::no_route()),
        };
        let res = find(plural).ok_or_else(ApiError::no_route)?;
        if res.namespaced && ns.is_none() && name.is_some() {
            return Err(ApiError::no_route());
        }
        Ok(Target {
            res,
            ns: ns.map(str::to_string),
            name: name.map(str::to_string),
            sub: sub.map(str::to_string),
            tail: tail.join("/"),
        })
    }

    fn key(&self) -> ResKey {
        // events.k8s.io Events are a view of the core Events (one store, as in the apiserver)
        if self.res.group == "events.k8s.io" {
            return ResKey::new("", self.res.plural);
        }
        ResKey::new(self.res.group, self.res.plural)
    }

    fn ns_str(&self) -> &str {
        if self.res.namespaced {
            self.ns.as_deref().unwrap_or("")
        } else {
            ""
        }
    }
}

/// Whether the client asked for metadata only (`as=PartialObjectMetadata[List]`), as kube-rs'
/// `metadata_watcher` does: the object's data never leaves the server.
fn wants_metadata(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

fn partial(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}

/// The object as this group/version serves it (borrowed when stored in that version).
fn present<'a>(res: &ApiResource, obj: &'a Value) -> Cow<'a, Value> {
    let api_version = res.api_version();
    if res.group == "events.k8s.io" {
        Cow::Owned(event_to_events_api(obj, &api_version))
    } else if str_at(obj, &["apiVersion"]) == api_version {
        Cow::Borrowed(obj)
    } else {
        let mut v = obj.clone();
        v["apiVersion"] = json!(api_version);
        Cow::Owned(v)
    }
}

/// core/v1 Event → events.k8s.io Event (the same stored object, as the apiserver converts it).
fn event_to_events_api(e: &Value, api_version: &str) -> Value {
    // built by cloning: `json!` copies each field through serialization (a sixth of the watch path's
    // samples at 50 clusters)
    let field = |k: &str| e.get(k).cloned().unwrap_or(Value::Null);
    let mut out = Value::Object(serde_json::Map::from_iter([
        (
            "apiVersion".to_string(),
            Value::String(api_version.to_string()),
        ),
        ("kind".to_string(), Value::String("Event".to_string())),
        ("metadata".to_string(), field("metadata")),
        ("eventTime".to_string(), field("eventTime")),
        ("reason".to_string(), field("reason")),
        ("note".to_string(), field("message")),
        ("type".to_string(), field("type")),
        ("regarding".to_string(), field("involvedObject")),
        (
            "reportingController".to_string(),
            e.get("reportingComponent")
                .cloned()
                .unwrap_or_else(|| e["source"]["component"].clone()),
        ),
        ("reportingInstance".to_string(), field("reportingInstance")),
        ("action".to_string(), field("action")),
    ]));
    if let Some(s) = e.get("series").filter(|s| !s.is_null()) {
        out["series"] = s.clone();
    }
    if let Some(n) = e.get("count") {
        out["deprecatedCount"] = n.clone();
    }
    for (from, to) in [
        ("firstTimestamp", "deprecatedFirstTimestamp"),
        ("lastTimestamp", "deprecatedLastTimestamp"),
    ] {
        if let Some(t) = e.get(from).filter(|t| !t.is_null()) {
            out[to] = t.clone();
        }
    }
    if let Some(src) = e.get("source") {
        out["deprecatedSource"] = src.clone();
    }
    out
}

/// A request's label and field selectors.
struct Selectors {
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Selectors {
    fn parse(q: &Query) -> Result<Self, ApiError> {
        Ok(Selectors {
            labels: LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))?,
            fields: FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str))?,
        })
    }

    fn matches(&self, o: &Value) -> bool {
        self.labels
            .matches(o.at("/metadata/labels").and_then(Value::as_object))
            && self.fields.matches(o)
    }

    /// Whether the request selects everything.
    fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// As a list's filter: none when the request selects everything.
    fn filter(&self) -> Option<impl Fn(&Value) -> bool + '_> {
        (!self.is_empty()).then_some(|o: &Value| self.matches(o))
    }
}

fn list(c: &Cluster, t: &Target, q: &Query, headers: &HeaderMap) -> Result<Response, ApiError> {
    let selectors = Selectors::parse(q)?;
    // a Table's options are checked before anything is listed, as the API server does
    let table_wanted = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
        .then(|| IncludeObject::parse(q.get("includeObject").map_or("", String::as_str)))
        .transpose()?;
    let filter = selectors.filter();
    let limit = q.get("limit").and_then(|l| l.parse().ok());
    let page = c.store.list(
        &t.key(),
        t.ns.as_deref().filter(|_| t.res.namespaced),
        filter.as_ref().map(|f| f as &dyn Fn(&Value) -> bool),
        limit,
        q.get("continue")
            .map(String::as_str)
            .filter(|s| !s.is_empty()),
    )?;
    let mut meta = json!({"resourceVersion": page.rv.to_string()});
    if let Some(token) = &page.continue_token {
        meta["continue"] = json!(token);
        if let Some(remaining) = page.remaining {
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    if let Some(include) = table_wanted {
        return Ok(json_response(
            StatusCode::OK,
            &table(c.now(), &t.res, &page.items, meta, include),
        ));
    }
    if wants_metadata(headers) {
        let items: Vec<Value> = page.items.iter().map(|o| partial(o)).collect();
        return Ok(json_response(
            StatusCode::OK,
            &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items}),
        ));
    }
    let items: Vec<Cow<'_, Value>> = page.items.iter().map(|o| present(&t.res, o)).collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "kind": format!("{}List", t.res.kind),
            "apiVersion": t.res.api_version(),
            "metadata": meta,
            "items": items,
        }),
    ))
}

/// A `meta.k8s.io/v1` Table, as `kubectl get` asks for.
/// What each row of a Table carries (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum IncludeObject {
    /// Nothing (`null`).
    None,
    /// The object's metadata, as `PartialObjectMetadata` (the default).
    Metadata,
    /// The whole object as the requested version serves it (what `kubectl get --sort-by` sorts by).
    Object,
}

impl IncludeObject {
    /// The parameter's value; a `400` with the API server's message for another.
    fn parse(value: &str) -> Result<Self, ApiError> {
        match value {
            "" | "Metadata" => Ok(IncludeObject::Metadata),
            "Object" => Ok(IncludeObject::Object),
            "None" => Ok(IncludeObject::None),
            other => Err(ApiError::bad_request(&format!(
                "Unable to convert to Table as requested: includeObject: Invalid value: \"{other}\": must be 'Metadata', 'Object', 'None', or empty"
            ))),
        }
    }
}

fn table(
    now: chrono::DateTime<chrono::Utc>,
    res: &ApiResource,
    items: &[Arc<Value>],
    meta: Value,
    include: IncludeObject,
) -> Value {
    let row_object = |o: &Value| match include {
        IncludeObject::Metadata => partial(o),
        IncludeObject::Object => present(res, o).into_owned(),
        IncludeObject::None => Value::Null,
    };
    let age = |o: &Value| since(now, str_at(o, &["metadata", "creationTimestamp"]));
    // priority 1: shown by `-o wide` only
    let col_at = |name: &str, ty: &str, priority: u8| json!({"name": name, "type": ty, "format": if name == "Name" {"name"} else {""}, "description": "", "priority": priority});
    let col = |name: &str, ty: &str| col_at(name, ty, 0);
    type Cells<'a> = Box<dyn Fn(&Value) -> Vec<Value> + 'a>;
    let (columns, cells): (Vec<Value>, Cells) = if res.plural == "events" {
        // the API server's (`printEvent`), for either API and either shape an event is kept in
        (
            vec![
                col("Last Seen", "string"),
                col("Type", "string"),
                col("Reason", "string"),
                col("Object", "string"),
                col_at("Subobject", "string", 1),
                col_at("Source", "string", 1),
                col("Message", "string"),
                col_at("First Seen", "string", 1),
                col_at("Count", "string", 1),
                col_at("Name", "string", 1),
            ],
            Box::new(move |e: &Value| event_cells(now, e)),
        )
    } else if res.plural == "pods" {
        (
            vec![
                col("Name", "string"),
                col("Ready", "string"),
                col("Status", "string"),
                col("Restarts", "string"),
                col("Age", "string"),
            ],
            Box::new(move |o: &Value| {
                let statuses = o
                    .at("/status/containerStatuses")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let ready = statuses
                    .iter()
                    .filter(|s| s["ready"] == json!(true))
                    .count();
                let restarts: i64 = statuses
                    .iter()
                    .filter_map(|s| s["restartCount"].as_i64())
                    .sum();
                let waiting = statuses.iter().find_map(|s| {
                    s.at("/state/waiting/reason")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                });
                let status = if o.at("/metadata/deletionTimestamp").is_some() {
                    "Terminating".to_string()
                } else {
                    waiting.unwrap_or_else(|| str_at(o, &["status", "phase"]).to_string())
                };
                vec![
                    json!(str_at(o, &["metadata", "name"])),
                    json!(format!("{ready}/{}", statuses.len().max(1))),
                    json!(status),
                    json!(restarts.to_string()),
                    json!(age(o)),
                ]
            }),
        )
    } else {
        (
            vec![col("Name", "string"), col("Age", "string")],
            Box::new(move |o: &Value| vec![json!(str_at(o, &["metadata", "name"])), json!(age(o))]),
        )
    };
    let rows: Vec<Value> = items
        .iter()
        .map(|o| json!({"cells": cells(o), "object": row_object(o)}))
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": columns, "rows": rows})
}

/// A table row's cells for an Event, as the API server's `printEvent` writes them: the last time it was seen
/// (its series' last observation, else `lastTimestamp`, else the first time), type, reason, the object as
/// `kind/name` (the kind alone without a name), its field path, the source (`component, host`, else the
/// reporting controller and instance), the message, the first time (`firstTimestamp`, else `eventTime`), the
/// count (the series' when it has one; 1 for a singleton without one) and the name. An event written through
/// `events.k8s.io` is kept in that shape: its fields are read under their names there.
fn event_cells(now: chrono::DateTime<chrono::Utc>, e: &Value) -> Vec<Value> {
    let s = |path: &str| e.at(path).and_then(Value::as_str).unwrap_or_default();
    let either = |a: &str, b: &str| match s(a) {
        "" => s(b),
        v => v,
    };
    let since = |t: &str| since(now, t);
    let first = since(
        match either("/firstTimestamp", "/deprecatedFirstTimestamp") {
            "" => s("/eventTime"),
            t => t,
        },
    );
    let series = e.get("series").filter(|v| v.is_object());
    let last = match (series, either("/lastTimestamp", "/deprecatedLastTimestamp")) {
        (Some(_), _) => since(s("/series/lastObservedTime")),
        (None, "") => first.clone(),
        (None, t) => since(t),
    };
    let count = match series {
        Some(series) => series["count"].as_i64().unwrap_or(0),
        None => ["count", "deprecatedCount"]
            .iter()
            .find_map(|k| e.get(*k).and_then(Value::as_i64))
            .filter(|c| *c != 0)
            .unwrap_or(1),
    };
    let involved = match e.get("involvedObject") {
        Some(o) if o.is_object() => "/involvedObject",
        _ => "/regarding",
    };
    let kind = s(&format!("{involved}/kind")).to_lowercase();
    let object = match s(&format!("{involved}/name")) {
        "" => kind,
        name => format!("{kind}/{name}"),
    };
    let component = match either("/source/component", "/deprecatedSource/component") {
        "" => either("/reportingComponent", "/reportingController"),
        c => c,
    };
    let source = match either("/source/host", "/deprecatedSource/host") {
        "" => s("/reportingInstance"),
        h => h,
    };
    let source = match source {
        "" => component.to_string(),
        host => format!("{component}, {host}"),
    };
    vec![
        json!(last),
        json!(s("/type")),
        json!(s("/reason")),
        json!(object),
        json!(s(&format!("{involved}/fieldPath"))),
        json!(source),
        json!(either("/message", "/note").trim()),
        json!(first),
        json!(count),
        json!(s("/metadata/name")),
    ]
}

/// The age of an RFC 3339 time at `now`, as kubectl prints it; `<unknown>` for a time missing or malformed
/// (apimachinery's `translateTimestampSince`).
fn since(now: chrono::DateTime<chrono::Utc>, t: &str) -> String {
    match chrono::DateTime::parse_from_rfc3339(t) {
        Ok(t) => human_age(now.signed_duration_since(t.with_timezone(&chrono::Utc))),
        Err(_) => "<unknown>".to_string(),
    }
}

/// A duration as kubectl prints an age (apimachinery's `duration.HumanDuration`).
fn human_age(d: chrono::Duration) -> String {
    let secs = d.num_seconds();
    if secs < -1 {
        return "<invalid>".into();
    }
    let secs = secs.max(0);
    if secs < 120 {
        return format!("{secs}s");
    }
    let (mins, hours, days) = (secs / 60, secs / 3600, secs / 86_400);
    let with = |big: i64, unit: &str, small: i64, small_unit: &str| match small {
        0 => format!("{big}{unit}"),
        _ => format!("{big}{unit}{small}{small_unit}"),
    };
    match () {
        _ if mins < 10 => with(mins, "m", secs % 60, "s"),
        _ if mins < 180 => format!("{mins}m"),
        _ if hours < 8 => with(hours, "h", mins % 60, "m"),
        _ if hours < 48 => format!("{hours}h"),
        _ if hours < 24 * 8 => with(days, "d", hours % 24, "h"),
        _ if hours < 24 * 365 * 2 => format!("{days}d"),
        _ if hours < 24 * 365 * 8 => with(days / 365, "y", days % 365, "d"),
        _ => format!("{}y", days / 365),
    }
}

fn watch(c: &Arc<Cluster>, t: &Target, q: &Query, meta_only: bool) -> Result<Response, ApiError> {
    let selectors = Selectors::parse(q)?;
    let key = t.key();
    let ns = t.ns.clone().filter(|_| t.res.namespaced);
    let res = t.res.clone();
    let rv_param = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let bookmarks = is_true(q.get("allowWatchBookmarks"));
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let (initial, from) = match rv_param {
        "" | "0" => {
            // "Any" resourceVersion: synthetic ADDED events for the current state, then changes.
            let filter = selectors.filter();
            let filter = filter.as_ref().map(|f| f as &dyn Fn(&Value) -> bool);
            let page = c.store.list(&key, ns.as_deref(), filter, None, None)?;
            (page.items, page.rv)
        }
        rv => {
            let rv = rv
                .parse::<u64>()
                .map_err(|_| ApiError::bad_request(&format!("invalid resource version: {rv}")))?;
            (Vec::new(), rv)
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(WATCH_WRITES_QUEUED);
    let started = c.store.watch_from(&key, from);
    let (backlog, mut sub) = match started {
        Ok(x) => x,
        Err(e) => {
            // The real apiserver answers an expired watch with 200 and one ERROR event.
            let body = watch_line("ERROR", &e.to_status());
            return Ok(stream_response(futures::stream::iter([
                Ok::<_, Infallible>(body),
            ])));
        }
    };
    fn shown<'a>(meta_only: bool, res: &ApiResource, o: &'a Value) -> Cow<'a, Value> {
        if meta_only {
            Cow::Owned(partial(o))
        } else {
            present(res, o)
        }
    }
    let api_version = res.api_version();
    let mut epoch = c.watch_epoch.subscribe();
    epoch.borrow_and_update();
    let c2 = c.clone();
    let bookmark_every = c.settings.bookmark_interval;
    tokio::spawn(async move {
        c2.stats
            .watches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // the change's watch event, when the watch shows it
        let render = |ch: &Change| {
            if ch.res != key || ns.as_deref().is_some_and(|n| ch.namespace() != n) {
                return None;
            }
            if let Some(e) = ch.event().filter(|_| !meta_only && selectors.is_empty()) {
                if res.group == "events.k8s.io" {
                    return Some(watch_line(ch.kind.as_str(), &e.events_api(&api_version)));
                }
                if api_version == "v1" {
                    return Some(watch_line(ch.kind.as_str(), &e.core()));
                }
            }
            let object = ch.object();
            selectors
                .matches(&object)
                .then(|| watch_line(ch.kind.as_str(), &shown(meta_only, &res, &object)))
        };
        let mut last_rv = from;
        let send = async |b: Bytes| tx.send(Ok(b)).await.is_ok();
        let fell_behind = || {
            watch_line(
                "ERROR",
                &ApiError::expired("watch fell behind; resource version too old").to_status(),
            )
        };
        // the current state (a list's worth of ADDED) and the retained changes, WATCH_BATCH_MAX a write
        let mut alive = true;
        let mut batch = Batch::default();
        for o in &initial {
            if let Some(full) = batch.push(&watch_line("ADDED", &shown(meta_only, &res, o))) {
                alive = send(full).await;
                if !alive {
                    break;
                }
            }
        }
        for ch in backlog {
            last_rv = ch.rv;
            if !alive {
                continue;
            }
            if let Some(full) = render(&ch).and_then(|event| batch.push(&event)) {
                alive = send(full).await;
            }
        }
        if let Some(rest) = batch.take().filter(|_| alive) {
            alive = send(rest).await;
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(bookmark_every);
        tick.tick().await;
        while alive {
            tokio::select! {
                _ = &mut deadline => break,
                _ = epoch.changed() => break,
                _ = tx.closed() => break,
                _ = tick.tick(), if bookmarks => {
                    // Every change up to `now` is in the channel already (sent under the store's lock): they
                    // go out first, so a client resuming from the bookmark skips none of them.
                    let now = c2.store.resource_version();
                    while alive {
                        let ended = match sub.try_recv() {
                            Ok(ch) => {
                                let (out, ended) = ready_lines(ch, &mut sub, &mut last_rv, render);
                                if !out.is_empty() {
                                    alive = send(Bytes::from(out)).await;
                                }
                                ended
                            }
                            Err(TryRecvError::Empty) => break,
                            Err(e) => Some(e),
                        };
                        match ended {
                            Some(TryRecvError::Lagged(_)) => {
                                let _ = send(fell_behind()).await;
                                alive = false;
                            }
                            Some(_) => alive = false,
                            None => {}
                        }
                    }
                    if alive {
                        let bm = json!({"kind": res.kind, "apiVersion": res.api_version(), "metadata": {"resourceVersion": last_rv.max(now).to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}});
                        alive = send(watch_line("BOOKMARK", &bm)).await;
                    }
                }
                got = sub.recv() => match got {
                    Ok(ch) => {
                        let (out, ended) = ready_lines(ch, &mut sub, &mut last_rv, render);
                        if !out.is_empty() {
                            alive = send(Bytes::from(out)).await;
                        }
                        match ended {
                            Some(TryRecvError::Lagged(_)) => {
                                let _ = send(fell_behind()).await;
                                break;
                            }
                            Some(_) => break,
                            None => {}
                        }
                    }
                    Err(RecvError::Lagged(_)) => {
                        let _ = send(fell_behind()).await;
                        break;
                    }
                    Err(RecvError::Closed) => break,
                }
            }
        }
        c2.stats
            .watches
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    });
    Ok(stream_response(tokio_stream_from(rx)))
}

/// At most this many changes go out in one write of a watch.
const WATCH_BATCH_MAX: usize = 32;

/// Writes a watch keeps waiting for its client: with [`WATCH_BATCH_MAX`], at most 256 changes, as when
/// each went out alone in a channel of 256. Past that a slow client leaves the changes in the store's
/// channel, and falls behind it (410) as before.
const WATCH_WRITES_QUEUED: usize = 256 / WATCH_BATCH_MAX;

/// Watch lines gathered into writes of at most [`WATCH_BATCH_MAX`].
#[derive(Default)]
struct Batch {
    out: Vec<u8>,
    lines: usize,
}

impl Batch {
    /// Adds a line; a full write, when this one filled it.
    fn push(&mut self, line: &[u8]) -> Option<Bytes> {
        self.out.extend_from_slice(line);
        self.lines += 1;
        if self.lines == WATCH_BATCH_MAX {
            self.take()
        } else {
            None
        }
    }

    /// What was gathered, if anything.
    fn take(&mut self) -> Option<Bytes> {
        self.lines = 0;
        (!self.out.is_empty()).then(|| Bytes::from(std::mem::take(&mut self.out)))
    }
}

/// The watch lines of `first` and of the changes already waiting behind it, at most [`WATCH_BATCH_MAX`]
/// changes: one write's worth (a controller's pass or a burst of events is many changes at once, and a
/// write each — a TLS record, a syscall — was most of the cost of serving a watch). Changes at or below
/// `last_rv` are passed over; `last_rv` moves to the last one taken. Also what ended the batch when it
/// was not the channel running dry: the watcher fell behind, or the store is gone.
fn ready_lines(
    first: Arc<Change>,
    sub: &mut crate::store::Subscription,
    last_rv: &mut u64,
    render: impl Fn(&Change) -> Option<Bytes>,
) -> (Vec<u8>, Option<TryRecvError>) {
    let mut out = Vec::new();
    let mut next = Some(first);
    let mut taken = 0;
    while let Some(ch) = next.take() {
        taken += 1;
        if ch.rv > *last_rv {
            *last_rv = ch.rv;
            if let Some(line) = render(&ch) {
                out.extend_from_slice(&line);
            }
        }
        if taken == WATCH_BATCH_MAX {
            break;
        }
        match sub.try_recv() {
            Ok(ch) => next = Some(ch),
            Err(TryRecvError::Empty) => {}
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

/// One watch event, serialised straight from the stored object (no copy of it).
fn watch_line<T: serde::Serialize + ?Sized>(kind: &str, object: &T) -> Bytes {
    #[derive(serde::Serialize)]
    struct Line<'a, T: ?Sized> {
        #[serde(rename = "type")]
        kind: &'a str,
        object: &'a T,
    }
    // an object always serialises
    let mut s = serde_json::to_vec(&Line { kind, object }).unwrap_or_default();
    s.push(b'\n');
    Bytes::from(s)
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, Infallible>>,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn stream_response<S>(s: S) -> Response
where
    S: futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
{
    let mut r = Response::new(Body::from_stream(s));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The manager a write is recorded under: the `fieldManager` parameter, else the client's User-Agent up
/// to its first '/' (printable characters, at most 128 bytes), as the apiserver's `managerOrUserAgent` does:
/// `kubectl/v1.31.0 (linux/amd64) kubernetes/…` writes as `kubectl`, the controllers as
/// `kube-controller-manager`.
fn field_manager(q: &Query, headers: &HeaderMap) -> String {
    if let Some(m) = q.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.clone();
    }
    let ua = headers
        .get(header::USER_AGENT)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let mut out = String::new();
    for ch in ua.split('/').next().unwrap_or_default().chars() {
        if ch.is_control() {
            continue;
        }
        if out.len() + ch.len_utf8() > 128 {
            break;
        }
        out.push(ch);
    }
    out
}

/// The request's media type, without parameters.
fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

fn is_dry_run(q: &Query) -> bool {
    q.get("dryRun").is_some_and(|v| v == "All")
}

fn parse_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if ct.contains("yaml") {
        serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(&format!("error decoding YAML: {e}")))
    } else if ct.contains("protobuf") {
        Err(ApiError::unsupported_media(ct))
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(&format!("error decoding JSON: {e}")))
    }
}

/// Validation the apiserver does before anything is stored (the part releases meet).
fn validate(t: &Target, obj: &Value) -> Result<(), ApiError> {
    let name = str_at(obj, &["metadata", "name"]);
    let kind = str_at(obj, &["kind"]);
    let mut causes = Vec::new();
    if kind != t.res.kind {
        return Err(ApiError::bad_request(&format!(
            "the kind of the object ({kind}) does not match the resource ({})",
            t.res.kind
        )));
    }
    let api = str_at(obj, &["apiVersion"]);
    if api != t.res.api_version() {
        return Err(ApiError::bad_request(&format!(
            "the API version in the data ({api}) does not match the expected API version ({})",
            t.res.api_version()
        )));
    }
    if name.is_empty() {
        causes.push((
            "metadata.name".to_string(),
            "Required value: name or generateName is required".to_string(),
        ));
    } else if name.len() > 253
        || !name
            .chars()
            .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-' || ch == '.')
    {
        causes.push((
            "metadata.name".to_string(),
            format!("Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"),
        ));
    }
    let body_ns = str_at(obj, &["metadata", "namespace"]);
    if t.res.namespaced && !body_ns.is_empty() && Some(body_ns) != t.ns.as_deref() {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    if matches!(
        t.res.kind,
        "Deployment" | "ReplicaSet" | "DaemonSet" | "StatefulSet"
    ) {
        let selector = obj
            .at("/spec/selector/matchLabels")
            .and_then(Value::as_object);
        let labels = obj
            .at("/spec/template/metadata/labels")
            .and_then(Value::as_object);
        match (selector, labels) {
            (None, _) => causes.push(("spec.selector".into(), "Required value".into())),
            (Some(sel), labels) => {
                let all = sel
                    .iter()
                    .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v));
                if !all {
                    causes.push((
                        "spec.template.metadata.labels".into(),
                        "Invalid value: `selector` does not match template `labels`".into(),
                    ));
                }
            }
        }
        if let Some(r) = obj.at("/spec/replicas")
            && r.as_i64().is_none_or(|r| r < 0)
        {
            causes.push((
                "spec.replicas".into(),
                format!("Invalid value: {r}: must be greater than or equal to 0"),
            ));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(t.res.kind, name, &causes))
    }
}

/// NamespaceLifecycle admission: nothing is created in a namespace that doesn't exist.
fn namespace_exists(c: &Cluster, t: &Target) -> Result<(), ApiError> {
    if !t.res.namespaced {
        return Ok(());
    }
    let ns = t.ns_str();
    if c.store
        .get(&ResKey::new("", "namespaces"), "", ns)
        .is_none()
    {
        return Err(ApiError::not_found("", "namespaces", ns));
    }
    Ok(())
}

/// Sets what the server owns on a new object.
fn stamp_new(c: &Cluster, t: &Target, obj: &mut Value) {
    let meta = obj
        .as_object_mut()
        .map(|m| m.entry("metadata").or_insert_with(|| json!({})));
    let Some(Value::Object(meta)) = meta else {
        return;
    };
    if t.res.namespaced {
        meta.insert("namespace".into(), json!(t.ns.clone().unwrap_or_default()));
    }
    meta.insert("uid".into(), json!(c.uid()));
    meta.insert("creationTimestamp".into(), json!(c.now_str()));
    if obj.get("spec").is_some() {
        obj["metadata"]["generation"] = json!(1);
    }
}

/// Bumps `metadata.generation` when the spec changed.
fn bump_generation(old: &Value, new: &mut Value) {
    if old.get("spec") != new.get("spec") && new.get("spec").is_some() {
        let g = old
            .at("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        new["metadata"]["generation"] = json!(g + 1);
    }
}

fn create(
    c: &Cluster,
    t: &Target,
    q: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let mut obj = parse_body(headers, body)?;
    if str_at(&obj, &["metadata", "name"]).is_empty() {
        let prefix = str_at(&obj, &["metadata", "generateName"]).to_string();
        if !prefix.is_empty() {
            let suffix: String = (0..5)
                .map(|_| {
                    let n = c.rng().random_range(0..36u32);
                    char::from_digit(n, 36).unwrap_or('x')
                })
                .collect();
            obj["metadata"]["name"] = json!(format!("{prefix}{suffix}"));
        }
    }
    validate(t, &obj)?;
    namespace_exists(c, t)?;
    stamp_new(c, t, &mut obj);
    let manager = field_manager(q, headers);
    apply::record_update(None, &mut obj, &manager, &t.res.api_version(), &c.now_str());
    if is_dry_run(q) {
        if c.store
            .get(&t.key(), t.ns_str(), str_at(&obj, &["metadata", "name"]))
            .is_some()
        {
            return Err(ApiError::already_exists(
                t.res.group,
                t.res.plural,
                str_at(&obj, &["metadata", "name"]),
            ));
        }
        return Ok(json_response(StatusCode::CREATED, &present(&t.res, &obj)));
    }
    let stored = c.store.create(&t.key(), obj)?;
    Ok(json_response(
        StatusCode::CREATED,
        &present(&t.res, &stored),
    ))
}

/// Finishes a write: an object being deleted whose finalizers are all gone is removed.
fn finish(obj: Value) -> Option<Value> {
    let deleting = obj
        .at("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    let finalizers = obj
        .at("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty());
    if deleting && !finalizers {
        None
    } else {
        Some(obj)
    }
}

fn update(
    c: &Cluster,
    t: &Target,
    name: &str,
    q: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let mut obj = parse_body(headers, body)?;
    validate(t, &obj)?;
    if str_at(&obj, &["metadata", "name"]) != name {
        return Err(ApiError::bad_request(
            "the name of the object does not match the name on the URL",
        ));
    }
    let manager = field_manager(q, headers);
    let dry = is_dry_run(q);
    let now = c.now_str();
    let api = t.res.api_version();
    let mut out = None;
    let (stored, _) = c.store.mutate(&t.key(), t.ns_str(), name, |cur| {
        let Some(cur) = cur else {
            return Err(ApiError::not_found(t.res.group, t.res.plural, name));
        };
        let want_rv = str_at(&obj, &["metadata", "resourceVersion"]);
        if !want_rv.is_empty() && want_rv != str_at(cur, &["metadata", "resourceVersion"]) {
            return Err(ApiError::stale(t.res.group, t.res.plural, name));
        }
        keep_server_fields(cur, &mut obj);
        if obj.get("status").is_none()
            && let Some(s) = cur.get("status")
        {
            obj["status"] = s.clone();
        }
        bump_generation(cur, &mut obj);
        apply::record_update(Some(cur), &mut obj, &manager, &api, &now);
        let next = finish(obj.clone());
        if dry {
            out = Some(obj.clone());
            return Ok(Some(cur.clone()));
        }
        Ok(next)
    })?;
    let shown = out.map(Arc::new).unwrap_or(stored);
    Ok(json_response(StatusCode::OK, &present(&t.res, &shown)))
}

/// uid, creationTimestamp, generation and deletionTimestamp are the server's, whatever the client sent.
fn keep_server_fields(cur: &Value, new: &mut Value) {
    for f in [
        "uid",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "namespace",
    ] {
        match cur.at(&format!("/metadata/{f}")) {
            Some(v) => new["metadata"][f] = v.clone(),
            None => {
                if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove(f);
                }
            }
        }
    }
}

/// RFC 7386 merge patch; with `strategic`, lists of named items merge by name (the strategic-merge rule
/// for containers, env, ports, volumes), an item with `$patch: delete` is removed, and the other directives
/// (`$setElementOrder/…`, `$retainKeys`, as kubectl sends them) are not stored.
fn merge_patch(target: &mut Value, patch: &Value, strategic: bool) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, pv) in p {
                if strategic && k.starts_with('$') {
                    continue;
                }
                if pv.is_null() {
                    t.remove(k);
                } else {
                    let entry = t.entry(k.clone()).or_insert(Value::Null);
                    if entry.is_null() && !pv.is_object() {
                        *entry = pv.clone();
                    } else {
                        merge_patch(entry, pv, strategic);
                    }
                }
            }
        }
        (t @ Value::Array(_), Value::Array(p))
            if strategic && p.iter().all(|i| i.get("name").is_some()) =>
        {
            if let Value::Array(items) = t {
                for pi in p {
                    if pi.get("$patch").and_then(Value::as_str) == Some("delete") {
                        items.retain(|i| i.get("name") != pi.get("name"));
                        continue;
                    }
                    match items.iter_mut().find(|i| i.get("name") == pi.get("name")) {
                        Some(existing) => merge_patch(existing, pi, true),
                        None => items.push(pi.clone()),
                    }
                }
            }
        }
        (t, p) => {
            let mut v = p.clone();
            if let Value::Object(m) = &mut v {
                m.retain(|_, x| !x.is_null());
            }
            *t = v;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn patch(
    c: &Cluster,
    t: &Target,
    name: &str,
    status_only: bool,
    q: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let ct = content_type(headers);
    let dry = is_dry_run(q);
    let now = c.now_str();
    let api = t.res.api_version();
    let force = is_true(q.get("force"));
    let mut dry_out = None;
    let mut created = false;
    let (stored, _) = match ct.as_str() {
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
            let manager = q
                .get("fieldManager")
                .filter(|m| !m.is_empty())
                .cloned()
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "PATCH operation with apply patch type requires fieldManager",
                    )
                })?;
            let mut applied: Value = serde_yaml::from_slice(body)
                .map_err(|e| ApiError::bad_request(&format!("error decoding YAML: {e}")))?;
            if str_at(&applied, &["metadata", "name"]) != name {
                return Err(ApiError::bad_request(
                    "the name of the object does not match the name on the URL",
                ));
            }
            validate(t, &applied)?;
            namespace_exists(c, t)?;
            if let Some(m) = applied.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
                m.remove("managedFields");
            }
            c.store
                .mutate(&t.key(), t.ns_str(), name, |cur| {
                    let mut next = apply::apply(cur, &applied, &manager, &api, force, &now)
                        .map_err(|conflicts| {
                            ApiError::apply_conflict(t.res.group, t.res.plural, name, &conflicts)
                        })?;
                    match cur {
                        Some(cur) => {
                            keep_server_fields(cur, &mut next);
                            bump_generation(cur, &mut next);
                        }
                        None => {
                            created = true;
                            stamp_new(c, t, &mut next);
                        }
                    }
                    if dry {
                        dry_out = Some(next);
                        return Ok(cur.cloned());
                    }
                    Ok(finish(next))
                })
                .or_else(|e| match (&dry_out, e.code) {
                    // dry-run of a create: nothing stored, nothing to return from the store
                    (Some(_), 404) => Ok((Arc::new(Value::Null), None)),
                    _ => Err(e),
                })?
        }
        "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/json-patch+json" => {
            let manager = field_manager(q, headers);
            let p: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(&format!("error decoding patch: {e}")))?;
            c.store.mutate(&t.key(), t.ns_str(), name, |cur| {
                let cur =
                    cur.ok_or_else(|| ApiError::not_found(t.res.group, t.res.plural, name))?;
                let mut next = cur.clone();
                if ct == "application/json-patch+json" {
                    let ops: json_patch::Patch = serde_json::from_value(p.clone())
                        .map_err(|e| ApiError::bad_request(&format!("invalid JSON patch: {e}")))?;
                    json_patch::patch(&mut next, &ops).map_err(|e| {
                        ApiError::invalid(t.res.kind, name, &[("patch".into(), e.to_string())])
                    })?;
                } else {
                    merge_patch(&mut next, &p, ct.starts_with("application/strategic"));
                }
                if status_only {
                    let status = next.get("status").cloned();
                    next = cur.clone();
                    if let Some(s) = status {
                        next["status"] = s;
                    }
                } else {
                    validate(t, &next)?;
                }
                keep_server_fields(cur, &mut next);
                bump_generation(cur, &mut next);
                apply::record_update(Some(cur), &mut next, &manager, &api, &now);
                if dry {
                    dry_out = Some(next);
                    return Ok(Some(cur.clone()));
                }
                Ok(finish(next))
            })?
        }
        other => return Err(ApiError::unsupported_media(other)),
    };
    let shown = dry_out.map(Arc::new).unwrap_or(stored);
    let code = if created && !dry {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_response(code, &present(&t.res, &shown)))
}

// ---------------------------------------------------------------------------------------------------------
// The scale subresource

/// Whether the target is a scalable object's `/scale` (what discovery lists as `<plural>/scale`).
fn scalable(t: &Target) -> Result<(), ApiError> {
    if t.res.subresources.contains(&"scale") && t.tail.is_empty() {
        Ok(())
    } else {
        Err(ApiError::no_route())
    }
}

/// A label selector as the apiserver's `labels.Selector.String()` writes it: requirements sorted by key,
/// `k=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, joined by ','. A plain map (a ReplicationController's
/// selector) is all `k=v`.
fn selector_string(sel: Option<&Value>) -> String {
    let Some(Value::Object(m)) = sel else {
        return String::new();
    };
    let equals = |labels: &serde_json::Map<String, Value>, out: &mut Vec<(String, String)>| {
        for (k, v) in labels {
            out.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or_default())));
        }
    };
    let mut reqs: Vec<(String, String)> = Vec::new();
    if !m.contains_key("matchLabels") && !m.contains_key("matchExpressions") {
        equals(m, &mut reqs);
    } else {
        if let Some(Value::Object(labels)) = m.get("matchLabels") {
            equals(labels, &mut reqs);
        }
        for e in m
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = str_at(e, &["key"]);
            let mut values: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            values.sort_unstable();
            values.dedup();
            let req = match str_at(e, &["operator"]) {
                "In" => format!("{key} in ({})", values.join(",")),
                "NotIn" => format!("{key} notin ({})", values.join(",")),
                "Exists" => key.to_string(),
                "DoesNotExist" => format!("!{key}"),
                _ => continue,
            };
            reqs.push((key.to_string(), req));
        }
    }
    reqs.sort_by(|a, b| a.0.cmp(&b.0));
    reqs.into_iter()
        .map(|(_, r)| r)
        .collect::<Vec<_>>()
        .join(",")
}

/// A scalable object's `autoscaling/v1` Scale, as the apiserver's `scaleFrom<Kind>` builds it: the
/// object's name, namespace, uid, resourceVersion and creationTimestamp, `spec.replicas` (omitted when 0,
/// as the Go type omits it), `status.replicas` and the selector as a string.
fn scale_of(obj: &Value) -> Value {
    let mut meta = serde_json::Map::new();
    for f in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = obj.at(&format!("/metadata/{f}")) {
            meta.insert(f.into(), v.clone());
        }
    }
    // an object stored without spec.replicas was defaulted to 1
    let replicas = obj
        .at("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let mut spec = json!({});
    if replicas != 0 {
        spec["replicas"] = json!(replicas);
    }
    let mut status =
        json!({"replicas": obj.at("/status/replicas").and_then(Value::as_i64).unwrap_or(0)});
    let selector = selector_string(obj.at("/spec/selector"));
    if !selector.is_empty() {
        status["selector"] = json!(selector);
    }
    json!({"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": meta, "spec": spec, "status": status})
}

/// `spec.replicas` of a Scale a client sent: absent is 0 (the Go zero value), and it must be an int32 ≥ 0.
fn scale_replicas(scale: &Value, name: &str) -> Result<Option<i64>, ApiError> {
    let Some(v) = scale.at("/spec/replicas").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let n = v
        .as_i64()
        .filter(|n| i32::try_from(*n).is_ok())
        .ok_or_else(|| {
            let what = match v {
                Value::String(_) => "string",
                Value::Bool(_) => "bool",
                Value::Number(_) => "number",
                Value::Array(_) => "array",
                _ => "object",
            };
            ApiError::bad_request(&format!(
                "json: cannot unmarshal {what} into Go struct field ScaleSpec.spec.replicas of type int32"
            ))
        })?;
    if n < 0 {
        return Err(ApiError::invalid_in(
            "autoscaling",
            "Scale",
            name,
            &[(
                "spec.replicas".into(),
                format!("Invalid value: {n}: must be greater than or equal to 0"),
            )],
        ));
    }
    Ok(Some(n))
}

/// `GET …/<plural>/<name>/scale`.
fn get_scale(c: &Cluster, t: &Target, name: &str) -> Result<Response, ApiError> {
    scalable(t)?;
    let obj = c
        .store
        .get(&t.key(), t.ns_str(), name)
        .ok_or_else(|| ApiError::not_found(t.res.group, t.res.plural, name))?;
    Ok(json_response(StatusCode::OK, &scale_of(&obj)))
}

/// `PUT …/<plural>/<name>/scale` with a Scale.
fn update_scale(
    c: &Cluster,
    t: &Target,
    name: &str,
    q: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    scalable(t)?;
    let scale = parse_body(headers, body)?;
    check_scale_body(&scale, name)?;
    let owner = apply::Owner::with_subresource(&field_manager(q, headers), "Update", "scale");
    write_scale(c, t, name, q, &owner, false, |_| Ok(scale))
}

/// A Scale sent to the server names the object of the URL and is a Scale.
fn check_scale_body(scale: &Value, name: &str) -> Result<(), ApiError> {
    let kind = str_at(scale, &["kind"]);
    if !kind.is_empty() && kind != "Scale" {
        return Err(ApiError::bad_request(&format!(
            "the kind of the object ({kind}) does not match the resource (Scale)"
        )));
    }
    if str_at(scale, &["metadata", "name"]) != name {
        return Err(ApiError::bad_request(
            "the name of the object does not match the name on the URL",
        ));
    }
    Ok(())
}

/// `PATCH …/<plural>/<name>/scale`: a merge or strategic-merge patch (the same on a Scale, which has no
/// lists), a JSON patch, or a server-side apply of a Scale; each is applied to the object's Scale.
fn patch_scale(
    c: &Cluster,
    t: &Target,
    name: &str,
    q: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    scalable(t)?;
    let ct = content_type(headers);
    match ct.as_str() {
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
            let manager = q
                .get("fieldManager")
                .filter(|m| !m.is_empty())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "PATCH operation with apply patch type requires fieldManager",
                    )
                })?;
            let applied: Value = serde_yaml::from_slice(body)
                .map_err(|e| ApiError::bad_request(&format!("error decoding YAML: {e}")))?;
            check_scale_body(&applied, name)?;
            let owner = apply::Owner::with_subresource(manager, "Apply", "scale");
            write_scale(c, t, name, q, &owner, is_true(q.get("force")), |_| {
                Ok(applied)
            })
        }
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            let p: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(&format!("error decoding patch: {e}")))?;
            let owner =
                apply::Owner::with_subresource(&field_manager(q, headers), "Update", "scale");
            write_scale(c, t, name, q, &owner, false, |cur| {
                let mut next = cur.clone();
                merge_patch(&mut next, &p, false);
                Ok(next)
            })
        }
        "application/json-patch+json" => {
            let ops: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(&format!("invalid JSON patch: {e}")))?;
            let owner =
                apply::Owner::with_subresource(&field_manager(q, headers), "Update", "scale");
            write_scale(c, t, name, q, &owner, false, |cur| {
                let mut next = cur.clone();
                json_patch::patch(&mut next, &ops).map_err(|e| {
                    ApiError::invalid_in(
                        "autoscaling",
                        "Scale",
                        name,
                        &[("patch".into(), e.to_string())],
                    )
                })?;
                Ok(next)
            })
        }
        other => Err(ApiError::unsupported_media(other)),
    }
}

/// Writes the replicas of the Scale `wanted` makes of the object's current one, as the apiserver's
/// `scaleUpdatedObjectInfo` does: a resourceVersion or uid in the Scale must be the object's (`409`
/// otherwise), `spec.replicas` goes to the object (its generation bumps when it changed), and the replicas
/// field moves to `owner` — an `Update` or `Apply` entry with `subresource: scale` — from whoever owned it
/// (an apply conflicts with another owner unless `force`). Answers with the object's Scale after the write.
fn write_scale(
    c: &Cluster,
    t: &Target,
    name: &str,
    q: &Query,
    owner: &apply::Owner,
    force: bool,
    wanted: impl FnOnce(&Value) -> Result<Value, ApiError>,
) -> Result<Response, ApiError> {
    let dry = is_dry_run(q);
    let now = c.now_str();
    let api = t.res.api_version();
    let mut shown = None;
    let (stored, _) = c.store.mutate(&t.key(), t.ns_str(), name, |cur| {
        let cur = cur.ok_or_else(|| ApiError::not_found(t.res.group, t.res.plural, name))?;
        let scale = wanted(&scale_of(cur))?;
        let rv = str_at(&scale, &["metadata", "resourceVersion"]);
        if !rv.is_empty() && rv != str_at(cur, &["metadata", "resourceVersion"]) {
            return Err(ApiError::stale(t.res.group, t.res.plural, name));
        }
        let uid = str_at(&scale, &["metadata", "uid"]);
        let have_uid = str_at(cur, &["metadata", "uid"]);
        if !uid.is_empty() && uid != have_uid {
            return Err(ApiError::conflict(
                t.res.group,
                &format!("{}/scale", t.res.plural),
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {have_uid}"
                ),
            ));
        }
        let current = cur
            .at("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let sent = scale_replicas(&scale, name)?;
        let replicas = match (sent, owner.operation.as_str()) {
            (Some(n), _) => n,
            // an apply without replicas leaves the value, and gives up the field
            (None, "Apply") => current,
            (None, _) => 0,
        };
        let mut next = cur.clone();
        next["spec"]["replicas"] = json!(replicas);
        if owner.operation == "Apply" {
            scale_apply_ownership(cur, &mut next, owner, sent.is_some(), force, &api, &now)
                .map_err(|conflicts| {
                    ApiError::apply_conflict(t.res.group, t.res.plural, name, &conflicts)
                })?;
        } else if replicas != current {
            apply::record_update_in(Some(cur), &mut next, owner, &api, &now);
        }
        bump_generation(cur, &mut next);
        if dry {
            shown = Some(next);
            return Ok(Some(cur.clone()));
        }
        Ok(Some(next))
    })?;
    let obj = shown.map(Arc::new).unwrap_or(stored);
    Ok(json_response(StatusCode::OK, &scale_of(&obj)))
}

/// Server-side apply of a Scale by `owner`: it owns `.spec.replicas` when it sent it (taking it from the
/// others if the value changes, which conflicts unless `force`), and gives it up when it did not.
fn scale_apply_ownership(
    cur: &Value,
    next: &mut Value,
    owner: &apply::Owner,
    sent: bool,
    force: bool,
    api: &str,
    now: &str,
) -> Result<(), Vec<(String, String)>> {
    let path = vec![
        apply::Seg::Field("spec".into()),
        apply::Seg::Field("replicas".into()),
    ];
    let mut managed = apply::Managed::read(cur);
    if sent {
        let changes = cur.at("/spec/replicas") != next.at("/spec/replicas");
        if changes {
            let mut conflicts: Vec<(String, String)> = managed
                .0
                .iter()
                .filter(|(o, (_, f))| *o != owner && f.contains(&path))
                .map(|(o, _)| (o.describe(), apply::path_string(&path)))
                .collect();
            if !conflicts.is_empty() && !force {
                conflicts.sort();
                return Err(conflicts);
            }
            for (o, (_, fields)) in managed.0.iter_mut() {
                if o != owner {
                    fields.remove(&path);
                }
            }
        }
        let entry = managed
            .0
            .entry(owner.clone())
            .or_insert_with(|| (api.to_string(), Default::default()));
        entry.0 = api.to_string();
        entry.1.insert(path);
    } else if let Some((_, fields)) = managed.0.get_mut(owner) {
        fields.remove(&path);
    }
    managed.write(next, now);
    Ok(())
}

fn delete(c: &Cluster, t: &Target, name: &str, q: &Query) -> Result<Response, ApiError> {
    let dry = is_dry_run(q);
    let now = c.now_str();
    let mut shown = None;
    let (stored, kind) = c.store.mutate(&t.key(), t.ns_str(), name, |cur| {
        let cur = cur.ok_or_else(|| ApiError::not_found(t.res.group, t.res.plural, name))?;
        let has_finalizers = cur
            .at("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let next = if has_finalizers {
            let mut next = cur.clone();
            if next.at("/metadata/deletionTimestamp").is_none() {
                next["metadata"]["deletionTimestamp"] = json!(now);
                next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            }
            Some(next)
        } else {
            None
        };
        if dry {
            shown = Some(next.clone().unwrap_or_else(|| cur.clone()));
            return Ok(Some(cur.clone()));
        }
        Ok(next)
    })?;
    let obj = shown.map(Arc::new).unwrap_or(stored);
    let code = if kind == Some(EventType::Deleted) || dry {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok(json_response(code, &present(&t.res, &obj)))
}

fn health(c: &Cluster, endpoint: &str, check: Option<&&str>, q: &Query) -> Response {
    let f = c.faults();
    let checks: Vec<(&str, bool)> = vec![
        ("ping", true),
        ("log", true),
        ("etcd", !f.etcd_unhealthy),
        ("poststarthook/start-informers", true),
        ("informer-sync", true),
        ("shutdown", true),
    ];
    if let Some(name) = check {
        return match checks.iter().find(|(n, _)| *n == *name) {
            Some((_, true)) => text(StatusCode::OK, "ok".into()),
            Some((n, false)) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("[-]{n} failed: reason withheld\n{endpoint} check failed\n"),
            ),
            None => text(StatusCode::NOT_FOUND, "404 page not found\n".into()),
        };
    }
    let healthy = checks.iter().all(|(_, ok)| *ok);
    let verbose = q.contains_key("verbose") || !healthy;
    let body = if verbose {
        let mut s = String::new();
        for (n, ok) in &checks {
            if *ok {
                s.push_str(&format!("[+]{n} ok\n"));
            } else {
                s.push_str(&format!("[-]{n} failed: reason withheld\n"));
            }
        }
        s.push_str(&format!(
            "{endpoint} check {}\n",
            if healthy { "passed" } else { "failed" }
        ));
        s
    } else {
        "ok".to_string()
    };
    text(
        if healthy {
            StatusCode::OK
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        },
        body,
    )
}

/// `GET .../services/<name>[:port]/proxy/<path>` and `.../pods/<name>[:port]/proxy/<path>`: serves the
/// scrape of the exporter behind that service or pod.
fn proxy(c: &Cluster, t: &Target, name: &str) -> Result<Response, ApiError> {
    let base = name.split(':').next().unwrap_or(name);
    let obj = c
        .store
        .get(&t.key(), t.ns_str(), base)
        .ok_or_else(|| ApiError::not_found(t.res.group, t.res.plural, base))?;
    if !t.tail.ends_with("metrics") {
        return Err(ApiError::no_route());
    }
    let app = obj
        .at("/metadata/labels/app.kubernetes.io~1name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let body = match (t.res.plural, app) {
        (_, "kube-state-metrics") => metrics::kube_state_metrics(c),
        ("pods", "node-exporter") => metrics::node_exporter(c, str_at(&obj, &["spec", "nodeName"])),
        ("pods", "metrics-fixture") => {
            let fixture = obj
                .at("/metadata/annotations/sim.multipilot.dev~1fixture")
                .and_then(Value::as_str)
                .unwrap_or_default();
            match c.settings.metric_fixtures.get(fixture) {
                Some(b) => b.as_str().to_string(),
                None => return Err(ApiError::internal("fixture not loaded")),
            }
        }
        ("services", _) => workload_metrics(c, &obj, base)?,
        _ => {
            return Err(ApiError::new_service_unavailable(&format!(
                "no endpoints available for {} \"{base}\"",
                t.res.singular
            )));
        }
    };
    let mut r = text(StatusCode::OK, body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(r)
}

/// What a Service's endpoints answer to a scrape: the requests of the Deployments whose pods it selects
/// (see [`crate::traffic`]), one set of series per Deployment. `503` as for a Service without endpoints
/// when no such Deployment has a ready replica.
fn workload_metrics(c: &Cluster, svc: &Value, name: &str) -> Result<String, ApiError> {
    let no_endpoints = || {
        ApiError::new_service_unavailable(&format!("no endpoints available for service \"{name}\""))
    };
    let Some(selector) = svc
        .at("/spec/selector")
        .and_then(Value::as_object)
        .filter(|s| !s.is_empty())
    else {
        return Err(no_endpoints());
    };
    let ns = str_at(svc, &["metadata", "namespace"]);
    let deployments: Vec<Arc<Value>> = c
        .store
        .all(&ResKey::new("apps", "deployments"), Some(ns))
        .into_iter()
        .filter(|d| {
            let labels = d
                .at("/spec/template/metadata/labels")
                .and_then(Value::as_object);
            selector
                .iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        })
        .collect();
    let now = std::time::Instant::now();
    let mut ready = 0.0;
    let mut counts = Vec::with_capacity(deployments.len());
    {
        let mut traffic = c.traffic();
        for d in &deployments {
            let w = traffic.observe(d, now);
            ready += w.serving().ready();
            counts.push((w.ok(), w.errors()));
        }
    }
    if ready <= 0.0 {
        return Err(no_endpoints());
    }
    let items: Vec<metrics::WorkloadRequests<'_>> = deployments
        .iter()
        .zip(counts)
        .map(|(d, (ok, errors))| metrics::WorkloadRequests {
            namespace: ns,
            deployment: str_at(d, &["metadata", "name"]),
            ok,
            errors,
        })
        .collect();
    Ok(metrics::workloads(&items))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EventRecord, ObjectRef};

    /// A kubelet's event: new, or repeated (managedFields stamped, a series).
    fn recorded(repeated: bool) -> EventRecord {
        let t = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap().to_utc();
        EventRecord {
            name: "web-7d4b9c-x2k4p.1a2b3c".into(),
            namespace: "shop".into(),
            uid: "0a1b2c3d-0000-4000-a000-000000000001".into(),
            resource_version: 812,
            created: t("2026-12-06T10:00:00Z"),
            updated: repeated.then(|| t("2026-12-06T10:05:07Z")),
            involved: ObjectRef::to(&json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web-7d4b9c-x2k4p", "namespace": "shop", "uid": "u-1", "resourceVersion": "77"}
            })),
            reason: "Unhealthy".into(),
            message: "Readiness probe failed: \"HTTP\" 503".into(),
            type_: "Warning".into(),
            count: if repeated { 3 } else { 1 },
            first: t("2026-12-06T10:00:00Z"),
            last: t(if repeated {
                "2026-12-06T10:05:07Z"
            } else {
                "2026-12-06T10:00:00Z"
            }),
            series: repeated.then(|| (3, t("2026-12-06T10:05:07.123456Z"))),
            component: "kubelet".into(),
        }
    }

    #[test]
    fn a_recorded_event_is_the_object_a_kubelet_writes() {
        let e = recorded(true);
        assert_eq!(
            e.to_value(),
            json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {
                    "name": "web-7d4b9c-x2k4p.1a2b3c", "namespace": "shop", "labels": {},
                    "uid": "0a1b2c3d-0000-4000-a000-000000000001",
                    "creationTimestamp": "2026-12-06T10:00:00Z", "resourceVersion": "812",
                    "managedFields": [{
                        "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                        "time": "2026-12-06T10:05:07Z", "fieldsType": "FieldsV1", "fieldsV1": {}
                    }]
                },
                "involvedObject": {
                    "kind": "Pod", "namespace": "shop", "name": "web-7d4b9c-x2k4p", "uid": "u-1",
                    "apiVersion": "v1", "resourceVersion": "77"
                },
                "reason": "Unhealthy", "message": "Readiness probe failed: \"HTTP\" 503", "type": "Warning",
                "count": 3, "firstTimestamp": "2026-12-06T10:00:00Z", "lastTimestamp": "2026-12-06T10:05:07Z",
                "eventTime": null,
                "series": {"count": 3, "lastObservedTime": "2026-12-06T10:05:07.123456Z"},
                "source": {"component": "kubelet"}, "reportingComponent": "kubelet", "reportingInstance": ""
            })
        );
        // the first occurrence: no managedFields yet, no series
        let mut first = recorded(false).to_value();
        let mut want = e.to_value();
        let meta = want["metadata"].as_object_mut().unwrap();
        meta.remove("managedFields");
        want.as_object_mut().unwrap().remove("series");
        want["count"] = json!(1);
        want["lastTimestamp"] = json!("2026-12-06T10:00:00Z");
        assert_eq!(first, want);
        assert_eq!(
            first["metadata"]["creationTimestamp"],
            "2026-12-06T10:00:00Z"
        );
        first["count"] = json!(2);
        assert_ne!(first, want, "the comparison sees the count");
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let d = chrono::Duration::seconds;
        for (secs, want) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (599, "9m59s"),
            (600, "10m"),
            (179 * 60 + 59, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (48 * 3600, "2d"),
            (49 * 3600, "2d1h"),
            (8 * 86_400, "8d"),
            (729 * 86_400, "729d"),
            (730 * 86_400, "2y"),
            (731 * 86_400, "2y1d"),
            (3000 * 86_400, "8y"),
        ] {
            assert_eq!(human_age(d(secs)), want, "{secs} s");
        }
    }

    #[test]
    fn an_events_table_has_the_api_servers_columns() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-06T10:10:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let res = crate::profile::Profile::parse("1.31")
            .unwrap()
            .resource("", "v1", "events")
            .unwrap()
            .clone();
        let event = |series: Value| {
            Arc::new(json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"namespace": "shop", "name": "web-1.17f"},
                "involvedObject": {"kind": "Pod", "name": "web-1", "fieldPath": "spec.containers{web}"},
                "reason": "BackOff", "message": "Back-off restarting failed container web ", "type": "Warning",
                "source": {"component": "kubelet", "host": "node-3"},
                "firstTimestamp": "2026-12-06T10:00:00Z", "lastTimestamp": "2026-12-06T10:05:00Z",
                "count": 4, "series": series}))
        };
        let t = table(
            now,
            &res,
            &[
                event(Value::Null),
                event(json!({"count": 9, "lastObservedTime": "2026-12-06T10:09:30.250000Z"})),
            ],
            json!({}),
            IncludeObject::None,
        );
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "Last Seen",
                "Type",
                "Reason",
                "Object",
                "Subobject",
                "Source",
                "Message",
                "First Seen",
                "Count",
                "Name"
            ]
        );
        let wide: Vec<u64> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["priority"].as_u64().unwrap())
            .collect();
        assert_eq!(wide, [0, 0, 0, 0, 1, 1, 0, 1, 1, 1]);
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "5m",
                "Warning",
                "BackOff",
                "pod/web-1",
                "spec.containers{web}",
                "kubelet, node-3",
                "Back-off restarting failed container web",
                "10m",
                4,
                "web-1.17f"
            ])
        );
        // a series: its last observation and its count
        assert_eq!(t["rows"][1]["cells"][0], "29s");
        assert_eq!(t["rows"][1]["cells"][8], 9);
        let cells = |e: Value| {
            table(now, &res, &[Arc::new(e)], json!({}), IncludeObject::None)["rows"][0]["cells"]
                .clone()
        };
        // what the simulated kubelets record (no host)
        assert_eq!(
            cells(recorded(false).to_value()),
            json!([
                "10m",
                "Warning",
                "Unhealthy",
                "pod/web-7d4b9c-x2k4p",
                "",
                "kubelet",
                "Readiness probe failed: \"HTTP\" 503",
                "10m",
                1,
                "web-7d4b9c-x2k4p.1a2b3c"
            ])
        );
        // a new-API singleton as v1 holds it: no timestamps or count but its eventTime, the reporting
        // controller and instance, an object without a name
        assert_eq!(
            cells(
                json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "n.1"},
                "involvedObject": {"kind": "Node"}, "reason": "Rebooted", "message": "m", "type": "Normal",
                "eventTime": "2026-12-06T10:08:00.000000Z", "reportingComponent": "kubelet",
                "reportingInstance": "node-3", "count": 0})
            ),
            json!([
                "2m",
                "Normal",
                "Rebooted",
                "node",
                "",
                "kubelet, node-3",
                "m",
                "2m",
                1,
                "n.1"
            ])
        );
        // an event written through events.k8s.io, kept in that shape
        assert_eq!(
            cells(
                json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "s.1"},
                "regarding": {"kind": "Pod", "name": "web-1"}, "reason": "Scheduled", "note": "assigned",
                "type": "Normal", "eventTime": "2026-12-06T10:09:00.000000Z",
                "reportingController": "default-scheduler", "reportingInstance": "default-scheduler-a"})
            ),
            json!([
                "60s",
                "Normal",
                "Scheduled",
                "pod/web-1",
                "",
                "default-scheduler, default-scheduler-a",
                "assigned",
                "60s",
                1,
                "s.1"
            ])
        );
    }

    #[test]
    fn a_tables_rows_carry_what_include_object_asks() {
        let res = crate::profile::Profile::parse("1.33")
            .unwrap()
            .resource("", "v1", "configmaps")
            .unwrap()
            .clone();
        let cm = Arc::new(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"namespace": "a", "name": "x", "resourceVersion": "7"}, "data": {"k": "v"}}));
        let rows = |include: &str| {
            let include = IncludeObject::parse(include)?;
            Ok::<_, ApiError>(
                table(
                    chrono::Utc::now(),
                    &res,
                    std::slice::from_ref(&cm),
                    json!({}),
                    include,
                )["rows"][0]["object"]
                    .clone(),
            )
        };
        assert_eq!(rows("").unwrap()["kind"], "PartialObjectMetadata");
        assert_eq!(rows("Metadata").unwrap()["metadata"]["name"], "x");
        assert!(rows("Metadata").unwrap().get("data").is_none());
        assert_eq!(rows("Object").unwrap(), *cm);
        assert_eq!(rows("None").unwrap(), Value::Null);
        let bad = rows("bogus").unwrap_err().to_status();
        assert_eq!(bad["code"], 400);
        assert!(
            bad["message"]
                .as_str()
                .unwrap()
                .contains("must be 'Metadata', 'Object', 'None', or empty")
        );
    }

    #[test]
    fn a_watch_writes_the_changes_waiting_together_and_says_when_it_fell_behind() {
        let store = crate::store::Store::new(100_000);
        let res = crate::store::ResKey::new("", "configmaps");
        let cm = |name: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "a", "name": name}});
        let render = |ch: &Change| {
            (str_at(&ch.object(), &["metadata", "name"]) != "hidden")
                .then(|| watch_line("ADDED", &*ch.object()))
        };
        let names = |out: &[u8]| -> Vec<String> {
            out.split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let v: Value = serde_json::from_slice(l).unwrap();
                    v["object"]["metadata"]["name"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
                .collect()
        };
        let (_, mut sub) = store.watch_from(&res, 0).unwrap();
        for i in 0..40 {
            let name = if i == 1 {
                "hidden".to_string()
            } else {
                format!("cm-{i:02}")
            };
            store.create(&res, cm(&name)).unwrap();
        }
        // at most WATCH_BATCH_MAX changes a write; one the watch does not show still moves last_rv
        let mut last_rv = 0;
        let first = sub.try_recv().unwrap();
        let (out, ended) = ready_lines(first, &mut sub, &mut last_rv, render);
        let got = names(&out);
        assert!(ended.is_none());
        assert_eq!(got.len(), WATCH_BATCH_MAX - 1);
        assert_eq!((got[0].as_str(), got[1].as_str()), ("cm-00", "cm-02"));
        assert_eq!(last_rv, WATCH_BATCH_MAX as u64);
        let first = sub.try_recv().unwrap();
        let (out, ended) = ready_lines(first, &mut sub, &mut last_rv, render);
        assert!(ended.is_none());
        assert_eq!(names(&out).len(), 40 - WATCH_BATCH_MAX);
        assert_eq!(last_rv, 40);
        // a change at or below the version already sent is passed over (a safeguard: the backlog and the
        // channel are taken under one lock, so they do not overlap)
        store.create(&res, cm("cm-40")).unwrap();
        let (out, _) = ready_lines(sub.try_recv().unwrap(), &mut sub, &mut 41, render);
        assert!(out.is_empty());
        // fell behind the store's channel (1,024 changes) while the batch was read: what was read goes out,
        // then the error
        store.create(&res, cm("cm-41")).unwrap();
        let first = sub.try_recv().unwrap();
        for i in 0..1100 {
            store.create(&res, cm(&format!("more-{i}"))).unwrap();
        }
        let (out, ended) = ready_lines(first, &mut sub, &mut last_rv, render);
        assert_eq!(names(&out), ["cm-41"]);
        assert!(matches!(ended, Some(TryRecvError::Lagged(_))), "{ended:?}");
    }

    #[test]
    fn a_recorded_event_is_served_as_the_stored_one_is_converted() {
        for repeated in [false, true] {
            let e = recorded(repeated);
            let stored = e.to_value();
            for api_version in ["events.k8s.io/v1", "events.k8s.io/v1beta1"] {
                let watched: Value =
                    serde_json::from_slice(&watch_line("MODIFIED", &e.events_api(api_version)))
                        .unwrap();
                assert_eq!(watched["type"], "MODIFIED");
                assert_eq!(
                    watched["object"],
                    event_to_events_api(&stored, api_version),
                    "{api_version}, repeated: {repeated}"
                );
            }
            let core: Value = serde_json::from_slice(&watch_line("ADDED", &e.core())).unwrap();
            assert_eq!(core["object"], stored);
        }
    }

    #[test]
    fn a_selector_is_written_as_the_apiserver_writes_it() {
        let sel = json!({
            "matchLabels": {"tier": "front", "app": "web"},
            "matchExpressions": [
                {"key": "track", "operator": "In", "values": ["stable", "canary"]},
                {"key": "env", "operator": "NotIn", "values": ["dev"]},
                {"key": "owner", "operator": "Exists"},
                {"key": "legacy", "operator": "DoesNotExist"}
            ]
        });
        assert_eq!(
            selector_string(Some(&sel)),
            "app=web,env notin (dev),!legacy,owner,tier=front,track in (canary,stable)"
        );
        // a ReplicationController's plain map
        assert_eq!(
            selector_string(Some(&json!({"b": "2", "a": "1"}))),
            "a=1,b=2"
        );
        assert_eq!(selector_string(Some(&json!({}))), "");
        assert_eq!(selector_string(None), "");
    }

    #[test]
    fn a_scale_carries_the_objects_identity_replicas_and_selector() {
        let d = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "42",
                "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 3, "labels": {"app": "web"},
                "managedFields": []},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}}},
            "status": {"replicas": 2}
        });
        assert_eq!(
            scale_of(&d),
            json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "42",
                    "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {}, "status": {"replicas": 2, "selector": "app=web"}})
        );
    }
}
