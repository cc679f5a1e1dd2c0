//! Fleet incidents attributed to a release. When the correlator names a release the first suspect of a
//! fleet incident (its batches reached the failing clusters, and few healthy ones, shortly before), the
//! release's history says so: an `incident` entry with the fleet incident, its members and the suspect's
//! support, once per fleet incident and release revision. During the soak the batch also stops on it
//! (`machine::new_incidents`); the history entry is what remains when nobody watches the rollout any more
//! (`multipilot release history`, the console).
//!
//! Reads (ordered consumer, from the start, then live): `fleet.fleet-incident.>` on FLEET_INCIDENTS.

use std::sync::Arc;

use multipilot_bus::follow::{Follower, Next, Replay};
use multipilot_schemas::payload::{FleetIncident, ReleaseEntry, SuspectVerdict};
use multipilot_schemas::{streams::name, subject};
use serde_json::json;

use crate::Service;

/// What the entry is recorded as (`fleet.release.<release>.incident`).
pub const WHAT: ReleaseEntry = ReleaseEntry::Incident;

impl Service {
    /// Follows the fleet incidents (all FLEET_INCIDENTS keeps, then live) until cancelled.
    pub async fn follow_attributions(self: Arc<Self>) {
        let mut f = Follower::new(
            self.js.clone(),
            name::INCIDENTS,
            [subject::FLEET_INCIDENT.all()],
            Replay::All,
        );
        loop {
            let next = tokio::select! {
                _ = self.cancel.cancelled() => return,
                n = f.next() => n,
            };
            let Next::Message(m) = next else { continue };
            match m.decode::<FleetIncident>() {
                Ok(env) => self.attribute(&env.payload).await,
                // not ours to dead-letter (the correlator's own subject): skipped, said once per message
                Err(e) => {
                    tracing::debug!(subject = %m.message.subject, error = %e, "fleet incident not decoded")
                }
            }
        }
    }

    /// Records `f` in the history of the release it names first, unless that release's history has it.
    pub(crate) async fn attribute(&self, f: &FleetIncident) {
        let Some((suspect, named)) = f
            .suspects
            .iter()
            .find(|s| s.verdict == SuspectVerdict::Suspect)
            .and_then(|s| s.release.as_ref().map(|r| (s, r)))
        else {
            return;
        };
        let _g = self.lock.lock().await;
        let Ok(Some(mut r)) = self.store.get(&named.name) else {
            // another role's release, or one deleted since
            return;
        };
        let seen = match self.store.history(&named.name) {
            Ok(h) => h.iter().any(|e| {
                e.what == WHAT
                    && e.detail["fleet_incident"] == f.id.as_str()
                    && e.detail["revision"] == named.revision
            }),
            Err(e) => {
                tracing::warn!(release = %named.name, error = %e, "release history not read");
                return;
            }
        };
        if seen {
            return;
        }
        let members: Vec<String> = f.clusters().into_iter().map(str::to_string).collect();
        let summary = format!(
            "fleet incident {} ({}, {} of {} clusters) names revision {} first suspect: {}",
            f.id,
            f.kind,
            members.len(),
            f.fleet_size,
            named.revision,
            suspect.summary
        );
        tracing::info!(release = %named.name, fleet_incident = %f.id, "fleet incident attributed to the release");
        self.record(
            &mut r,
            WHAT,
            true,
            "correlator",
            named.batch,
            members,
            summary,
            json!({
                "fleet_incident": f.id,
                "kind": f.kind,
                "revision": named.revision,
                "severity": f.severity,
                "suspect": suspect.summary,
            }),
        )
        .await;
    }
}
