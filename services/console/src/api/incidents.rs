//! Incidents: the list, the live stream (SSE) and the operator commands, carried out by the correlator.

use super::*;

// Incidents

#[derive(Debug, Deserialize)]
pub(super) struct IncidentsQuery {
    status: Option<String>,
    cluster: Option<String>,
    severity: Option<String>,
    limit: Option<usize>,
}

pub(super) async fn incidents(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
    Query(q): Query<IncidentsQuery>,
) -> ApiResult<Vec<crate::store::IncidentView>> {
    let want = q.status.as_deref().unwrap_or("active");
    let status_ok = |s: IncidentStatus| match want {
        "all" => Ok(true),
        "active" => Ok(s != IncidentStatus::Resolved),
        "open" => Ok(s == IncidentStatus::Open),
        "acknowledged" => Ok(s == IncidentStatus::Acknowledged),
        "resolved" => Ok(s == IncidentStatus::Resolved),
        other => Err(ApiError::bad(format!(
            "unknown status {other:?}: active, open, acknowledged, resolved or all"
        ))),
    };
    status_ok(IncidentStatus::Open)?;
    let severity: Option<Severity> = match q.severity.as_deref() {
        None | Some("") => None,
        Some(s) => Some(
            serde_json::from_value(Value::String(s.to_string()))
                .map_err(|_| ApiError::bad(format!("unknown severity {s:?}")))?,
        ),
    };
    let clusters: Option<BTreeSet<&str>> = q
        .cluster
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(|c| c.split(',').collect());
    let mut list: Vec<crate::store::IncidentView> = {
        let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
        st.incidents
            .values()
            .filter(|v| p.sees(&v.incident.cluster))
            .filter(|v| status_ok(v.incident.status).unwrap_or(false))
            .filter(|v| severity.is_none_or(|s| v.incident.severity == s))
            .filter(|v| {
                clusters
                    .as_ref()
                    .is_none_or(|c| c.contains(v.incident.cluster.as_str()))
            })
            .cloned()
            .collect()
    };
    // the timeline: newest change first, by the cluster's clock
    list.sort_by(|a, b| {
        b.incident
            .updated_at
            .cmp(&a.incident.updated_at)
            .then(b.incident.opened_at.cmp(&a.incident.opened_at))
            .then(a.incident.id.cmp(&b.incident.id))
    });
    list.truncate(q.limit.unwrap_or(1000).clamp(1, 10_000));
    Ok(axum::Json(list))
}

pub(super) struct SseGuard(prometheus_client::metrics::gauge::Gauge);
impl Drop for SseGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

pub(super) async fn incident_stream(
    State(app): State<App>,
    req: Request,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = app.shared.incidents.subscribe();
    app.shared.metrics.sse_clients.inc();
    let guard = SseGuard(app.shared.metrics.sse_clients.clone());
    // kept to be checked again while the stream lasts
    let token = auth::token_of(&req);
    let tokens = app.tokens.clone();
    let cancel = app.cancel.clone();
    let hello = Event::default().event("hello").data("{}");
    let first = futures::stream::once(async move { Ok::<_, Infallible>(hello) });
    let live = futures::stream::unfold((rx, guard), move |(mut rx, guard)| {
        let (tokens, token, cancel) = (tokens.clone(), token.clone(), cancel.clone());
        async move {
            loop {
                // the console shutting down ends the stream: the server's graceful shutdown waits for it
                let next = tokio::select! {
                    next = rx.recv() => next,
                    _ = cancel.cancelled() => return None,
                };
                let ev = match next {
                    Ok(v) => {
                        // the token is looked at again for every incident: one revoked, or a team whose
                        // clusters changed, is answered as it is now
                        let p = tokens.check(token.as_deref())?;
                        if !p.sees(&v.incident.cluster) {
                            continue;
                        }
                        let data = serde_json::to_string(&*v).unwrap_or_default();
                        Event::default().event("incident").data(data)
                    }
                    // the client fell behind: tell it to reload the list
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        Event::default().event("resync").data(json!({}).to_string())
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                };
                return Some((Ok(ev), (rx, guard)));
            }
        }
    });
    Sse::new(futures::StreamExt::chain(first, live)).keep_alive(KeepAlive::default())
}

pub(super) async fn command(
    app: &App,
    p: &Principal,
    id: String,
    action: IncidentAction,
) -> ApiResult<Value> {
    require(p, Role::Operator)?;
    if p.scoped() {
        let cluster = {
            let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
            st.incidents.get(&id).map(|v| v.incident.cluster.clone())
        };
        // another team's incident is as unknown to it as one that doesn't exist
        if !cluster.is_some_and(|c| p.sees(&c)) {
            return Err(ApiError::not_found(format!("no incident {id:?}")));
        }
    }
    let cmd = IncidentCommand {
        id: id.clone(),
        action,
        actor: p.subject.clone(),
    };
    let reply = multipilot_bus::request::incident_command(&app.nats, &cmd, Duration::from_secs(5))
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}")))?;
    let incident = reply.incident.clone();
    let body = json!({"outcome": reply.outcome, "incident": incident, "error": reply.error});
    match reply.outcome {
        CommandOutcome::Done | CommandOutcome::Unchanged => Ok(axum::Json(body)),
        CommandOutcome::NotFound => Err(ApiError::not_found(format!("no incident {id:?}"))),
        CommandOutcome::Conflict => Err(ApiError::new(
            StatusCode::CONFLICT,
            reply
                .error
                .unwrap_or_else(|| "not possible in the incident's state".into()),
        )),
        CommandOutcome::Failed => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            reply
                .error
                .unwrap_or_else(|| "the correlator failed".into()),
        )),
    }
}

pub(super) async fn ack(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Value> {
    command(&app, &p, id, IncidentAction::Ack).await
}

pub(super) async fn resolve(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Value> {
    command(&app, &p, id, IncidentAction::Resolve).await
}

// Fleet incidents

#[derive(Debug, Deserialize)]
pub(super) struct FleetIncidentsQuery {
    status: Option<String>,
}

/// A fleet incident as a token that sees only some clusters may see it: only the members on its clusters,
/// a summary that names no other cluster, and no shared attributes, suspects or blast radius (they describe
/// the other clusters too). `None` when no member is on its clusters.
pub(super) fn fleet_incident_for(
    p: &Principal,
    mut f: multipilot_schemas::payload::FleetIncident,
) -> Option<multipilot_schemas::payload::FleetIncident> {
    if !p.scoped() {
        return Some(f);
    }
    let total = f.clusters().len();
    f.members.retain(|m| p.sees(&m.cluster));
    if f.members.is_empty() {
        return None;
    }
    let names = f.clusters();
    f.summary = format!(
        "{} on {total} clusters of the fleet; {} of them yours ({})",
        f.kind,
        names.len(),
        names.join(", ")
    );
    f.shared.clear();
    f.suspects.clear();
    f.blast_radius = None;
    f.labels.remove("cluster");
    Some(f)
}

pub(super) async fn fleet_incidents(
    State(app): State<App>,
    axum::Extension(p): axum::Extension<Principal>,
    Query(q): Query<FleetIncidentsQuery>,
) -> ApiResult<Vec<multipilot_schemas::payload::FleetIncident>> {
    let all = match q.status.as_deref().unwrap_or("active") {
        "active" => false,
        "all" => true,
        other => {
            return Err(ApiError::bad(format!(
                "unknown status {other:?}: active or all"
            )));
        }
    };
    let mut list: Vec<_> = {
        let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
        st.fleet_incidents
            .values()
            .filter(|f| all || f.status != IncidentStatus::Resolved)
            .cloned()
            .filter_map(|f| fleet_incident_for(&p, f))
            .collect()
    };
    list.sort_by(|a, b| b.updated_at.cmp(&a.updated_at).then(a.id.cmp(&b.id)));
    Ok(axum::Json(list))
}
