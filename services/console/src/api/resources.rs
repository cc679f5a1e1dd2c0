//! Resources across the fleet: search, one object's full state (read back from FLEET_STATE), the field diff between clusters and the per-cluster comparison.

use super::*;

// Resources

/// One object in a search result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResourceRow {
    /// Cluster.
    pub cluster: String,
    /// Kind.
    pub kind: String,
    /// Namespace (absent when cluster-scoped).
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// `group/version`.
    pub api_version: String,
    /// Spec hash.
    pub spec_hash: String,
    /// Labels+annotations hash.
    pub metadata_hash: String,
    /// Ready.
    pub ready: Option<bool>,
    /// Phase.
    pub phase: Option<String>,
    /// `ready/desired` replicas.
    pub replicas: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

pub(super) fn ns_param(ns: Option<&str>) -> Option<&str> {
    // `_` is the subject token of "no namespace"
    ns.map(|n| if n == "_" { "" } else { n })
}

/// The kind as stored, matched without regard to case (`deployment` → `Deployment`).
pub(super) fn resolve_kind(st: &Store, kind: &str) -> Option<String> {
    st.clusters
        .values()
        .flat_map(|c| c.objects.keys())
        .map(|k| &k.kind)
        .find(|k| k.eq_ignore_ascii_case(kind))
        .map(|k| k.to_string())
}

#[derive(Debug, Deserialize)]
pub(super) struct ResourcesQuery {
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    selector: Option<String>,
    cluster: Option<String>,
    limit: Option<usize>,
}

pub(super) async fn resources(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
    Query(q): Query<ResourcesQuery>,
) -> ApiResult<ResourcePage> {
    let selector = Selector::parse(q.selector.as_deref().unwrap_or(""))
        .map_err(|e| ApiError::bad(e.to_string()))?;
    let limit = q.limit.unwrap_or(500).clamp(1, 10_000);
    let clusters: Option<BTreeSet<&str>> = q
        .cluster
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(|c| c.split(',').collect());
    let kind = q.kind.as_deref().filter(|k| !k.is_empty());
    let ns = ns_param(q.namespace.as_deref().filter(|n| !n.is_empty()));
    let name = q.name.as_deref().filter(|n| !n.is_empty());
    let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
    let (mut items, mut total) = (Vec::new(), 0usize);
    if let Some(named) = &clusters {
        for c in named {
            may_see(&p, c)?;
        }
    }
    for (cname, c) in &st.clusters {
        if !p.sees(cname)
            || clusters
                .as_ref()
                .is_some_and(|s| !s.contains(cname.as_str()))
        {
            continue;
        }
        for (k, o) in &c.objects {
            if kind.is_some_and(|want| !k.kind.eq_ignore_ascii_case(want))
                || ns.is_some_and(|want| &*k.namespace != want)
                || name.is_some_and(|want| !k.name.contains(want))
                || !selector.matches(|key| o.label(key))
            {
                continue;
            }
            total += 1;
            if items.len() < limit {
                items.push(ResourceRow {
                    cluster: cname.clone(),
                    kind: k.kind.to_string(),
                    namespace: (!k.namespace.is_empty()).then(|| k.namespace.to_string()),
                    name: k.name.to_string(),
                    api_version: o.api_version.to_string(),
                    spec_hash: o.spec_hash.to_string(),
                    metadata_hash: o.metadata_hash.to_string(),
                    ready: o.ready,
                    phase: o.phase.as_deref().map(str::to_string),
                    replicas: o.replicas.map(|(d, r)| format!("{r}/{d}")),
                    labels: o
                        .labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                });
            }
        }
    }
    Ok(axum::Json(ResourcePage { total, items }))
}

/// The answer of `/api/v1/resources`: the first `limit` matches and how many there are in all.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResourcePage {
    /// Matches in all.
    pub total: usize,
    /// The first `limit` of them.
    pub items: Vec<ResourceRow>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ObjectQuery {
    cluster: String,
    kind: String,
    namespace: Option<String>,
    name: String,
}

pub(super) fn key_for(
    st: &Store,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> Option<ObjKey> {
    let kind = resolve_kind(st, kind)?;
    Some(ObjKey {
        kind: Arc::from(kind.as_str()),
        namespace: Arc::from(ns_param(namespace).unwrap_or("")),
        name: name.into(),
    })
}

/// Reads an object's full state back from FLEET_STATE by the sequence the index holds. If that message
/// was superseded meanwhile (the stream keeps one per subject), the index has the newer sequence by the
/// next try.
pub(super) async fn fetch_state(
    app: &App,
    cluster: &str,
    key: &ObjKey,
) -> Result<Option<multipilot_schemas::payload::ResourceState>, ApiError> {
    let stream = app
        .js
        .get_stream_no_info(multipilot_schemas::streams::name::STATE)
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                format!("{}: {e}", multipilot_schemas::streams::name::STATE),
            )
        })?;
    for attempt in 0..5 {
        let seq = {
            let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
            match st.clusters.get(cluster).and_then(|c| c.objects.get(key)) {
                Some(o) => o.seq,
                None => return Ok(None),
            }
        };
        match stream.get_raw_message(seq).await {
            Ok(m) => {
                let header = |n: &str| m.headers.get(n).map(|v| v.as_str().to_string());
                let env = multipilot_schemas::decode::<multipilot_schemas::streams::StateMsg>(
                    header(multipilot_schemas::HEADER_CONTENT_TYPE).as_deref(),
                    header(multipilot_schemas::HEADER_SCHEMA).as_deref(),
                    &m.payload,
                    multipilot_schemas::codec::DEFAULT_MAX_BYTES,
                )
                .map_err(|e| {
                    ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("stored state: {e}"),
                    )
                })?;
                return Ok(match env.payload {
                    multipilot_schemas::streams::StateMsg::State(s) => Some(s),
                    _ => None,
                });
            }
            Err(e) if attempt < 4 => {
                tracing::debug!(seq, error = %e, "state superseded; reading the newer one");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                return Err(ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    format!("reading FLEET_STATE seq {seq}: {e}"),
                ));
            }
        }
    }
    Ok(None)
}

pub(super) async fn resource(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
    Query(q): Query<ObjectQuery>,
) -> ApiResult<Value> {
    may_see(&p, &q.cluster)?;
    let key = {
        let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
        key_for(&st, &q.kind, q.namespace.as_deref(), &q.name)
            .ok_or_else(|| ApiError::not_found(format!("no {} anywhere", q.kind)))?
    };
    let state = fetch_state(&app, &q.cluster, &key)
        .await?
        .ok_or_else(|| ApiError::not_found("no such object in that cluster"))?;
    Ok(axum::Json(serde_json::to_value(state).unwrap_or_default()))
}

// Diff and compare

#[derive(Debug, Deserialize)]
pub(super) struct DiffQuery {
    namespace: Option<String>,
    kind: String,
    name: String,
    clusters: Option<String>,
}

pub(super) async fn diff_handler(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
    Query(q): Query<DiffQuery>,
) -> ApiResult<Value> {
    let (key, names) = {
        let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
        let key = key_for(&st, &q.kind, q.namespace.as_deref(), &q.name)
            .ok_or_else(|| ApiError::not_found(format!("no {} anywhere", q.kind)))?;
        let names: Vec<String> = match q.clusters.as_deref().filter(|c| !c.is_empty()) {
            Some(list) => list.split(',').map(str::to_string).collect(),
            None => st
                .clusters
                .iter()
                .filter(|(n, c)| p.sees(n) && c.objects.contains_key(&key))
                .map(|(n, _)| n.clone())
                .collect(),
        };
        for n in &names {
            may_see(&p, n)?;
            if !st.clusters.contains_key(n) {
                return Err(ApiError::not_found(format!("no cluster {n:?}")));
            }
        }
        (key, names)
    };
    let mut states: Vec<Option<multipilot_schemas::payload::ResourceState>> = Vec::new();
    for n in &names {
        states.push(fetch_state(&app, n, &key).await?);
    }
    if states.iter().all(Option::is_none) {
        return Err(ApiError::not_found(format!(
            "{}/{}/{} is in none of those clusters",
            q.namespace.as_deref().unwrap_or(""),
            key.kind,
            key.name
        )));
    }
    let specs: Vec<Option<&Value>> = states
        .iter()
        .map(|s| s.as_ref().and_then(|s| s.spec.as_ref()))
        .collect();
    let hashes: Vec<Option<&str>> = states
        .iter()
        .map(|s| s.as_ref().map(|s| s.spec_hash.as_str()))
        .collect();
    let identical = hashes.windows(2).all(|w| w[0] == w[1]) && hashes.iter().all(Option::is_some);
    let fields = if identical {
        Vec::new()
    } else {
        diff::fields(&specs)
    };
    let labels = diff::maps(
        &states
            .iter()
            .map(|s| s.as_ref().map(|s| &s.labels))
            .collect::<Vec<_>>(),
    );
    let annotations = diff::maps(
        &states
            .iter()
            .map(|s| s.as_ref().map(|s| &s.annotations))
            .collect::<Vec<_>>(),
    );
    let per: Vec<Value> = names
        .iter()
        .zip(&states)
        .map(|(n, s)| match s {
            Some(s) => json!({
                "cluster": n, "present": true, "api_version": s.api_version,
                "spec_hash": s.spec_hash, "metadata_hash": s.metadata_hash,
                "resource_version": s.resource_version, "generation": s.generation,
                "ready": s.status.ready,
            }),
            None => json!({"cluster": n, "present": false}),
        })
        .collect();
    Ok(axum::Json(json!({
        "kind": &*key.kind,
        "namespace": (!key.namespace.is_empty()).then(|| key.namespace.to_string()),
        "name": &*key.name,
        "clusters": per,
        "identical": identical,
        "fields": fields,
        "labels": labels,
        "annotations": annotations,
    })))
}

/// Kinds a whole-cluster comparison leaves out unless asked for by name: their names are generated or
/// belong to one cluster by nature, so they would differ everywhere.
pub const COMPARE_SKIPS: &[&str] = &[
    "Pod",
    "ReplicaSet",
    "EndpointSlice",
    "Endpoints",
    "Lease",
    "Node",
    "Event",
    "Job",
];

#[derive(Debug, Deserialize)]
pub(super) struct CompareQuery {
    a: String,
    b: String,
    kind: Option<String>,
    namespace: Option<String>,
    limit: Option<usize>,
}

pub(super) fn key_json(k: &ObjKey) -> Value {
    json!({
        "kind": &*k.kind,
        "namespace": (!k.namespace.is_empty()).then(|| k.namespace.to_string()),
        "name": &*k.name,
    })
}

pub(super) async fn compare(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
    Query(q): Query<CompareQuery>,
) -> ApiResult<Value> {
    may_see(&p, &q.a)?;
    may_see(&p, &q.b)?;
    let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
    let get = |n: &str| {
        st.clusters
            .get(n)
            .ok_or_else(|| ApiError::not_found(format!("no cluster {n:?}")))
    };
    let (ca, cb) = (get(&q.a)?, get(&q.b)?);
    let kind = q.kind.as_deref().filter(|k| !k.is_empty());
    let ns = ns_param(q.namespace.as_deref().filter(|n| !n.is_empty()));
    let keep = |k: &ObjKey| -> bool {
        let kind_ok = match kind {
            Some(want) => k.kind.eq_ignore_ascii_case(want),
            None => !COMPARE_SKIPS.contains(&&*k.kind),
        };
        kind_ok && ns.is_none_or(|want| &*k.namespace == want)
    };
    let limit = q.limit.unwrap_or(2000).clamp(1, 20_000);
    let (mut only_a, mut only_b, mut differ, mut same) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let (mut n_only_a, mut n_only_b, mut n_differ) = (0usize, 0usize, 0usize);
    for (k, oa) in ca.objects.iter().filter(|(k, _)| keep(k)) {
        match cb.objects.get(k) {
            None => {
                n_only_a += 1;
                if only_a.len() < limit {
                    only_a.push(key_json(k));
                }
            }
            Some(ob) if ob.spec_hash != oa.spec_hash => {
                n_differ += 1;
                if differ.len() < limit {
                    let mut v = key_json(k);
                    v["spec_hash_a"] = json!(&*oa.spec_hash);
                    v["spec_hash_b"] = json!(&*ob.spec_hash);
                    v["metadata_differs"] = json!(oa.metadata_hash != ob.metadata_hash);
                    differ.push(v);
                }
            }
            Some(_) => same += 1,
        }
    }
    for k in cb.objects.keys().filter(|k| keep(k)) {
        if !ca.objects.contains_key(k) {
            n_only_b += 1;
            if only_b.len() < limit {
                only_b.push(key_json(k));
            }
        }
    }
    Ok(axum::Json(json!({
        "a": q.a, "b": q.b,
        "kind": kind, "namespace": q.namespace,
        "skipped_kinds": if kind.is_none() { COMPARE_SKIPS.to_vec() } else { Vec::new() },
        "counts": {"only_in_a": n_only_a, "only_in_b": n_only_b, "differ": n_differ, "same": same},
        "only_in_a": only_a,
        "only_in_b": only_b,
        "differ": differ,
    })))
}
