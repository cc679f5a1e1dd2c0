//! Reading the streams into the [`Store`] with ephemeral ordered consumers (no acks, nothing kept on the
//! server once the console is gone).
//!
//! | feed | stream | subjects | from |
//! |---|---|---|---|
//! | state | FLEET_STATE | `fleet.state.>`, `fleet.resync.>` | the last message per subject, then live |
//! | facts | FLEET_FACTS | `fleet.facts.>` | last per subject, then live |
//! | health | FLEET_HEALTH | `fleet.hb.>`, `fleet.probe.>` | last per subject (each cluster's latest heartbeat and each probe's latest round), then live |
//! | incidents | FLEET_INCIDENTS | `fleet.incident.>`, `fleet.fleet-incident.>` | everything kept (incident ids share subjects, so the last per subject is not enough), then live |
//! | compliance | FLEET_INCIDENTS | `fleet.compliance.>` | last per subject, then live |
//! | releases | FLEET_RELEASE | `fleet.release.>` | everything kept, then live |
//!
//! A message that doesn't decode (wrong schema, truncated body, implausible timestamps) is skipped, counted
//! in `multipilot_console_skipped_total` and logged; the console never dead-letters (it owns no durable).

use std::sync::{Arc, RwLock};

use async_nats::jetstream;
use chrono::Utc;
use multipilot_bus::follow::{Follower, Next, Replay};
use multipilot_schemas::payload::{ClusterFacts, FleetIncident};
use multipilot_schemas::streams::{HealthMsg, IncidentsMsg, StateMsg, name};
use multipilot_schemas::{Envelope, HEADER_SCHEMA, Payload, codec::DEFAULT_MAX_BYTES};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::store::{IncidentView, ReleaseRecord, StateSummary, Store};
use crate::telemetry::Metrics;

/// One stream the console follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// Resource states.
    State,
    /// Cluster facts.
    Facts,
    /// Heartbeats and probes.
    Health,
    /// Incident changes.
    Incidents,
    /// Compliance reports.
    Compliance,
    /// Release records.
    Releases,
}

impl Feed {
    /// Every feed.
    pub const ALL: [Feed; 6] = [
        Feed::Facts,
        Feed::Health,
        Feed::Compliance,
        Feed::Incidents,
        Feed::Releases,
        Feed::State,
    ];

    /// The feed's name (a metric label).
    pub fn name(self) -> &'static str {
        match self {
            Feed::State => "state",
            Feed::Facts => "facts",
            Feed::Health => "health",
            Feed::Incidents => "incidents",
            Feed::Compliance => "compliance",
            Feed::Releases => "releases",
        }
    }

    fn stream(self) -> &'static str {
        match self {
            Feed::State => name::STATE,
            Feed::Facts => name::FACTS,
            Feed::Health => name::HEALTH,
            Feed::Incidents | Feed::Compliance => name::INCIDENTS,
            Feed::Releases => name::RELEASE,
        }
    }

    /// The subjects it follows, and from where.
    fn subjects(self) -> (Vec<String>, Replay) {
        use multipilot_schemas::subject::{
            COMPLIANCE, FACTS, FLEET_INCIDENT, HEARTBEAT, INCIDENT, PROBE, RELEASE, RESYNC, STATE,
        };
        let (families, replay): (&[_], _) = match self {
            Feed::State => (&[STATE, RESYNC], Replay::LastPerSubject),
            Feed::Facts => (&[FACTS], Replay::LastPerSubject),
            Feed::Health => (&[HEARTBEAT, PROBE], Replay::LastPerSubject),
            Feed::Incidents => (&[INCIDENT, FLEET_INCIDENT], Replay::All),
            Feed::Compliance => (&[COMPLIANCE], Replay::LastPerSubject),
            Feed::Releases => (&[RELEASE], Replay::All),
        };
        (families.iter().map(|f| f.all()).collect(), replay)
    }
}

/// What the feeds share.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The store.
    pub store: Arc<RwLock<Store>>,
    /// Incident changes, for the live timeline.
    pub incidents: broadcast::Sender<Arc<IncidentView>>,
    /// Metrics.
    pub metrics: Metrics,
    /// Feeds that have caught up with what their stream held when they started.
    pub synced: Arc<RwLock<std::collections::BTreeSet<&'static str>>>,
}

fn decode<T: Payload>(m: &async_nats::Message) -> Result<Envelope<T>, (&'static str, String)> {
    multipilot_bus::jetstream::decode::<T>(m, DEFAULT_MAX_BYTES)
        .map_err(|e| (e.reason(), e.to_string()))
}

/// Applies one message; `Err` carries the reason class and the error when it was skipped.
fn apply(
    feed: Feed,
    shared: &Shared,
    m: &async_nats::Message,
    seq: u64,
    stored: chrono::DateTime<Utc>,
) -> Result<(), (&'static str, String)> {
    match feed {
        Feed::State => {
            // an object's state is read as the console's summary of it (its spec is never decoded)
            if multipilot_bus::jetstream::header(m, HEADER_SCHEMA)
                .is_some_and(|h| h.split('/').next() == Some(StateSummary::SCHEMA))
            {
                let env = decode::<StateSummary>(m)?;
                let mut st = shared.store.write().unwrap_or_else(|e| e.into_inner());
                st.apply_state(&env.cluster, &env.payload, seq);
                return Ok(());
            }
            let env = decode::<StateMsg>(m)?;
            let mut st = shared.store.write().unwrap_or_else(|e| e.into_inner());
            match &env.payload {
                StateMsg::State(s) => st.apply_state(&env.cluster, &StateSummary::from(s), seq),
                StateMsg::Deleted(d) => st.apply_deleted(&env.cluster, d, seq),
                StateMsg::Resync(r) => st.apply_resync(&env.cluster, r, seq),
            }
        }
        Feed::Facts => {
            let env = decode::<ClusterFacts>(m)?;
            let mut st = shared.store.write().unwrap_or_else(|e| e.into_inner());
            st.apply_facts(&env.cluster, env.payload, env.cluster_time);
        }
        Feed::Health => {
            let env = decode::<HealthMsg>(m)?;
            let mut st = shared.store.write().unwrap_or_else(|e| e.into_inner());
            match env.payload.clone() {
                HealthMsg::Heartbeat(hb) => st.apply_heartbeat(&env.map(|_| hb), stored),
                HealthMsg::Probe(p) => st.apply_probe(&env.map(|_| p)),
            }
        }
        Feed::Incidents | Feed::Compliance => {
            if multipilot_bus::jetstream::header(m, HEADER_SCHEMA)
                .is_some_and(|h| h.split('/').next() == Some(FleetIncident::SCHEMA))
            {
                let env = decode::<FleetIncident>(m)?;
                shared
                    .store
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .apply_fleet_incident(env.payload);
                return Ok(());
            }
            let env = decode::<IncidentsMsg>(m)?;
            match env.payload {
                IncidentsMsg::Incident(inc) => {
                    let view = shared
                        .store
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .apply_incident(inc, stored);
                    if let Some(v) = view {
                        // nobody listening is fine
                        let _ = shared.incidents.send(Arc::new(v));
                    }
                }
                IncidentsMsg::Compliance(r) => shared
                    .store
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .apply_compliance(r),
            }
        }
        Feed::Releases => {
            // the release role defines these payloads; keep any enveloped message as JSON
            let schema = multipilot_bus::jetstream::header(m, HEADER_SCHEMA)
                .ok_or(("schema", "missing Multipilot-Schema header".to_string()))?
                .to_string();
            let env: Envelope<serde_json::Value> =
                rmp_serde::from_slice(&m.payload).map_err(|e| ("decode", e.to_string()))?;
            let mut tokens = m.subject.splitn(4, '.').skip(2);
            let release = tokens
                .next()
                .and_then(multipilot_schemas::subject::unescape)
                .unwrap_or_default();
            let what = tokens.next().unwrap_or_default().to_string();
            let rec = ReleaseRecord {
                what,
                schema,
                cluster: env.cluster,
                cluster_time: env.cluster_time,
                ingest_time: stored,
                payload: env.payload,
            };
            shared
                .store
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .apply_release(release, rec);
        }
    }
    Ok(())
}

/// Follows one feed until cancelled (a lost consumer is created again and resumed by the follower).
pub async fn follow(js: jetstream::Context, feed: Feed, shared: Shared, cancel: CancellationToken) {
    let (subjects, replay) = feed.subjects();
    let mut f = Follower::new(js, feed.stream(), subjects, replay);
    loop {
        let next = tokio::select! {
            _ = cancel.cancelled() => return,
            n = f.next() => n,
        };
        let msg = match next {
            Next::Message(m) => m,
            Next::CaughtUp => {
                shared
                    .synced
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(feed.name());
                tracing::info!(feed = feed.name(), "console feed caught up");
                continue;
            }
        };
        match apply(feed, &shared, &msg.message, msg.stream_seq, msg.published) {
            Ok(()) => shared.metrics.applied(feed.name()),
            Err((reason, error)) => {
                shared.metrics.skipped(feed.name(), reason);
                shared
                    .store
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .counts
                    .skipped += 1;
                tracing::warn!(feed = feed.name(), subject = %msg.message.subject, seq = msg.stream_seq, reason, %error, "skipped a message the console can't use");
            }
        }
    }
}
