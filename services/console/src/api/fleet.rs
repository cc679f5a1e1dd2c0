//! Who is asking, the hub's status, and the fleet overview: every cluster's health, versions, compliance and incidents.

use super::*;

// Who and what

#[derive(Debug, Serialize)]
pub(super) struct WhoAmI {
    subject: String,
    role: Role,
    auth_enabled: bool,
    /// The team whose token it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    team: Option<String>,
    /// The clusters it sees (absent: all of them).
    #[serde(skip_serializing_if = "Option::is_none")]
    clusters: Option<BTreeSet<String>>,
}

pub(super) async fn whoami(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
) -> ApiResult<WhoAmI> {
    Ok(axum::Json(WhoAmI {
        auth_enabled: app.tokens.enabled(),
        team: p.team.clone(),
        clusters: p.clusters.clone(),
        subject: p.subject,
        role: p.role,
    }))
}

pub(super) async fn status(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
) -> ApiResult<Value> {
    let synced: Vec<&str> = app
        .shared
        .synced
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .copied()
        .collect();
    let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
    if p.scoped() {
        // only what its clusters hold
        let objects: usize = st
            .clusters
            .iter()
            .filter(|(n, _)| p.sees(n))
            .map(|(_, c)| c.objects.len())
            .sum();
        return Ok(axum::Json(json!({
            "clusters": st.clusters.keys().filter(|n| p.sees(n)).count(),
            "objects": objects,
            "incidents": st.incidents.values().filter(|v| p.sees(&v.incident.cluster)).count(),
            "synced": synced,
        })));
    }
    Ok(axum::Json(json!({
        "clusters": st.clusters.len(),
        "objects": st.object_count(),
        "incidents": st.incidents.len(),
        "releases": st.releases.len(),
        "synced": synced,
        "applied": st.counts.applied,
        "skipped": st.counts.skipped,
    })))
}

// Fleet overview

/// One cluster in the overview.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterOverview {
    /// Name.
    pub name: String,
    /// How it is.
    pub health: Health,
    /// Probes not healthy.
    pub failing_probes: Vec<String>,
    /// Seconds since the last heartbeat was stored.
    pub heartbeat_age_s: Option<i64>,
    /// Agent version.
    pub agent_version: Option<String>,
    /// Kubernetes version (`v1.31.4`).
    pub version: Option<String>,
    /// Registry labels.
    pub labels: BTreeMap<String, String>,
    /// Node counts.
    pub nodes: Option<multipilot_schemas::payload::NodeCounts>,
    /// CNI `name version`.
    pub cni: Option<String>,
    /// CoreDNS version.
    pub coredns: Option<String>,
    /// Ingress controller `name version`.
    pub ingress: Option<String>,
    /// API server certificate expiry.
    pub apiserver_cert_expiry: Option<DateTime<Utc>>,
    /// Days until then.
    pub cert_days_left: Option<i64>,
    /// Baseline compliance: `true`, `false`, or absent when not judged yet.
    pub compliant: Option<bool>,
    /// Failing baseline rules.
    pub failing_rules: Vec<String>,
    /// Open or acknowledged incidents.
    pub open_incidents: usize,
    /// The worst severity among them.
    pub worst_severity: Option<Severity>,
    /// Objects the console holds for it.
    pub objects: usize,
}

/// A cluster's health in the overview, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Its heartbeats stopped (3 intervals missed) or its agent can't reach its API server.
    Unreachable,
    /// A probe is unhealthy.
    Unhealthy,
    /// A probe is degraded.
    Degraded,
    /// No heartbeat yet.
    Unknown,
    /// Every probe healthy.
    Healthy,
}

impl Health {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Unreachable => "unreachable",
            Health::Unhealthy => "unhealthy",
            Health::Degraded => "degraded",
            Health::Unknown => "unknown",
            Health::Healthy => "healthy",
        }
    }
}

pub(super) fn health_of(c: &ClusterRec, now: DateTime<Utc>) -> (Health, Vec<String>, Option<i64>) {
    let failing: Vec<String> = c
        .probes
        .iter()
        .filter(|(_, p)| matches!(p.status, ProbeStatus::Unhealthy | ProbeStatus::Degraded))
        .map(|(n, _)| n.clone())
        .collect();
    let Some(hb) = &c.heartbeat else {
        return (Health::Unknown, failing, None);
    };
    let age = (now - hb.ingest_time).num_seconds().max(0);
    // the correlator calls a cluster unreachable after 3 missed heartbeats; so does the overview (which shows
    // what it last heard: unlike the correlator, it waits out no grace after its own start)
    let stale = age > i64::from(hb.heartbeat.interval_s.max(1)) * 3;
    let health = if stale || !hb.heartbeat.apiserver_reachable {
        Health::Unreachable
    } else if c
        .probes
        .values()
        .any(|p| p.status == ProbeStatus::Unhealthy)
    {
        Health::Unhealthy
    } else if !failing.is_empty() {
        Health::Degraded
    } else {
        Health::Healthy
    };
    (health, failing, Some(age))
}

/// The overview of every cluster (unfiltered, by name).
pub fn overview(st: &Store, now: DateTime<Utc>) -> Vec<ClusterOverview> {
    let mut open: BTreeMap<&str, (usize, Option<Severity>)> = BTreeMap::new();
    for v in st.incidents.values() {
        if v.incident.status != IncidentStatus::Resolved {
            let e = open.entry(v.incident.cluster.as_str()).or_default();
            e.0 += 1;
            e.1 = e.1.max(Some(v.incident.severity));
        }
    }
    st.clusters
        .iter()
        .map(|(name, c)| {
            let (health, failing_probes, heartbeat_age_s) = health_of(c, now);
            let facts = c.facts.as_ref().map(|(f, _)| f);
            let comp = |x: &Option<multipilot_schemas::payload::Component>| {
                x.as_ref().map(|c| format!("{} {}", c.name, c.version))
            };
            let (n_open, worst) = open.get(name.as_str()).copied().unwrap_or_default();
            ClusterOverview {
                name: name.clone(),
                health,
                failing_probes,
                heartbeat_age_s,
                agent_version: c
                    .heartbeat
                    .as_ref()
                    .map(|h| h.heartbeat.agent_version.clone()),
                version: facts.map(|f| f.version.git_version.clone()),
                labels: facts.map(|f| f.labels.clone()).unwrap_or_default(),
                nodes: facts.map(|f| f.nodes.clone()),
                cni: facts.and_then(|f| comp(&f.cni)),
                coredns: facts.and_then(|f| f.coredns.as_ref().map(|c| c.version.clone())),
                ingress: facts.and_then(|f| comp(&f.ingress_controller)),
                apiserver_cert_expiry: facts.and_then(|f| f.apiserver_cert_expiry),
                cert_days_left: facts
                    .and_then(|f| f.apiserver_cert_expiry)
                    .map(|t| (t - now).num_days()),
                compliant: c.compliance.as_ref().map(|r| r.compliant),
                failing_rules: c
                    .compliance
                    .as_ref()
                    .map(|r| {
                        r.checks
                            .iter()
                            .filter(|k| k.status == multipilot_schemas::payload::CheckStatus::Fail)
                            .map(|k| k.rule.clone())
                            .collect()
                    })
                    .unwrap_or_default(),
                open_incidents: n_open,
                worst_severity: worst,
                objects: c.objects.len(),
            }
        })
        .collect()
}

pub(super) fn matches_query(c: &ClusterOverview, q: &str) -> bool {
    q.split_whitespace().all(|term| {
        let term = term.to_lowercase();
        if let Some((k, v)) = term.split_once('=') {
            return match k {
                "name" => c.name.to_lowercase() == v,
                "health" => c.health.as_str() == v,
                "version" => c.version.as_deref().is_some_and(|x| {
                    x.trim_start_matches('v')
                        .starts_with(v.trim_start_matches('v'))
                }),
                _ => c
                    .labels
                    .iter()
                    .any(|(lk, lv)| lk.to_lowercase() == k && lv.to_lowercase() == v),
            };
        }
        let hay = [
            Some(c.name.as_str()),
            c.version.as_deref(),
            c.cni.as_deref(),
            c.ingress.as_deref(),
            Some(c.health.as_str()),
        ];
        hay.iter()
            .flatten()
            .any(|h| h.to_lowercase().contains(&term))
            || c.labels.values().any(|v| v.to_lowercase().contains(&term))
    })
}

#[derive(Debug, Deserialize)]
pub(super) struct ClustersQuery {
    q: Option<String>,
    sort: Option<String>,
}

pub(super) async fn clusters(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
    Query(q): Query<ClustersQuery>,
) -> ApiResult<Vec<ClusterOverview>> {
    let mut list = {
        let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
        overview(&st, Utc::now())
    };
    list.retain(|c| p.sees(&c.name));
    if let Some(q) = q.q.as_deref().filter(|q| !q.trim().is_empty()) {
        list.retain(|c| matches_query(c, q));
    }
    match q.sort.as_deref().unwrap_or("name") {
        "name" => {}
        "cert_expiry" | "cert" => list.sort_by_key(|c| {
            (
                c.apiserver_cert_expiry.is_none(),
                c.apiserver_cert_expiry,
                c.name.clone(),
            )
        }),
        "health" => list.sort_by_key(|c| (c.health, c.name.clone())),
        "incidents" => list.sort_by_key(|c| (std::cmp::Reverse(c.open_incidents), c.name.clone())),
        other => {
            return Err(ApiError::bad(format!(
                "unknown sort {other:?}: name, cert_expiry, health or incidents"
            )));
        }
    }
    Ok(axum::Json(list))
}

pub(super) async fn cluster_detail(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
    Path(name): Path<String>,
) -> ApiResult<Value> {
    may_see(&p, &name)?;
    let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
    let c = st
        .clusters
        .get(&name)
        .ok_or_else(|| ApiError::not_found(format!("no cluster {name:?}")))?;
    let ov = overview(&st, Utc::now())
        .into_iter()
        .find(|o| o.name == name);
    Ok(axum::Json(json!({
        "overview": ov,
        "probes": c.probes,
        "compliance": c.compliance,
        "facts": c.facts.as_ref().map(|(f, _)| f),
    })))
}
