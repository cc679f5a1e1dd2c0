//! What each stream carries, for consumers that read a stream holding several payload types: one union per
//! stream (or per durable's filter), decoded by the `Multipilot-Schema` header of each message.

/// The streams' names, as `deploy/streams.yaml` defines them (the bus' topology test checks they agree).
pub mod name {
    /// Resource states and resync markers.
    pub const STATE: &str = "FLEET_STATE";
    /// Cluster facts.
    pub const FACTS: &str = "FLEET_FACTS";
    /// Heartbeats and probe results.
    pub const HEALTH: &str = "FLEET_HEALTH";
    /// Kubernetes events.
    pub const EVENTS: &str = "FLEET_EVENTS";
    /// Metric batches.
    pub const METRICS: &str = "FLEET_METRICS";
    /// Incidents, event digests, fleet incidents and compliance reports.
    pub const INCIDENTS: &str = "FLEET_INCIDENTS";
    /// Notifications.
    pub const ALERTS: &str = "FLEET_ALERTS";
    /// Release records.
    pub const RELEASE: &str = "FLEET_RELEASE";
    /// Audit records.
    pub const AUDIT: &str = "FLEET_AUDIT";
    /// Dead letters.
    pub const DLQ: &str = "FLEET_DLQ";
    /// Every stream.
    pub const ALL: [&str; 10] = [
        STATE, FACTS, HEALTH, EVENTS, METRICS, INCIDENTS, ALERTS, RELEASE, AUDIT, DLQ,
    ];
}

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::envelope::{Envelope, Payload, decode_member};
use crate::payload::{
    ClusterFacts, ComplianceReport, EventDigest, FleetIncident, Heartbeat, Incident, ProbeResult,
    ResourceDeleted, ResourceState, ResyncMarker,
};

/// Declares a union of payloads: an untagged enum whose [`Payload`] impl accepts each member's schema and
/// decodes a message as the member its schema header names.
macro_rules! union {
    ($(#[$meta:meta])* $name:ident = $schema:literal { $($(#[$vmeta:meta])* $variant:ident($member:ty)),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(untagged)]
        #[allow(clippy::large_enum_variant)] // one message at a time: boxing would only add an allocation
        pub enum $name {
            $($(#[$vmeta])* $variant($member),)+
        }

        impl Payload for $name {
            const SCHEMA: &'static str = $schema;
            const VERSION: u32 = 1;
            fn accepts(schema: &str) -> Option<u32> {
                None $(.or_else(|| <$member>::accepts(schema)))+
            }
            fn decode_envelope(
                schema: &str,
                body: &[u8],
            ) -> Result<Envelope<Self>, rmp_serde::decode::Error> {
                $(if schema == <$member>::SCHEMA {
                    return decode_member(body, $name::$variant);
                })+
                Err(rmp_serde::decode::Error::Uncategorized(format!(
                    "{schema} is not one of {}", $schema
                )))
            }
        }
    };
}

union! {
    /// FLEET_HEALTH: heartbeats and probe results.
    HealthMsg = "Heartbeat|ProbeResult" {
        /// `fleet.hb.<cluster>`.
        Heartbeat(Heartbeat),
        /// `fleet.probe.<cluster>.<probe>`.
        Probe(ProbeResult),
    }
}

union! {
    /// FLEET_STATE: object states, their tombstones and resync markers.
    StateMsg = "ResourceState|ResourceDeleted|ResyncMarker" {
        /// `fleet.state.<cluster>.<kind>.<namespace>.<name>`: an object's state.
        State(ResourceState),
        /// The same subject: its tombstone.
        Deleted(ResourceDeleted),
        /// `fleet.resync.<cluster>.<kind>`: what a relist found.
        Resync(ResyncMarker),
    }
}

union! {
    /// FLEET_INCIDENTS as the console reads it: incident changes and compliance reports.
    IncidentsMsg = "Incident|ComplianceReport" {
        /// `fleet.incident.<cluster>.<kind>`.
        Incident(Incident),
        /// `fleet.compliance.<cluster>`.
        Compliance(ComplianceReport),
    }
}

union! {
    /// FLEET_INCIDENTS as the alert router reads it: incident changes and event digests.
    AlertInput = "Incident|EventDigest|FleetIncident" {
        /// `fleet.incident.<cluster>.<kind>`.
        Incident(Incident),
        /// `fleet.digest.<cluster>.<kind>`.
        Digest(EventDigest),
        /// `fleet.fleet-incident.<kind>`.
        Fleet(FleetIncident),
    }
}

/// FLEET_FACTS carries one payload type.
pub type FactsMsg = ClusterFacts;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::ResyncMarker;

    #[test]
    fn a_union_decodes_each_member_by_its_schema_and_refuses_others() {
        let marker = ResyncMarker {
            api_version: "v1".into(),
            kind: "Namespace".into(),
            epoch: 3,
            object_count: 0,
            present: Vec::new(),
            part: 0,
            parts: 1,
        };
        let env = Envelope::new("c1", "agent/c1", chrono::Utc::now(), 7, marker.clone());
        let body = crate::encode(&env).expect("encode");
        let got = StateMsg::decode_envelope(ResyncMarker::SCHEMA, &body).expect("decoded");
        assert_eq!(got.payload, StateMsg::Resync(marker));
        assert_eq!(got.seq, 7);
        assert_eq!(StateMsg::accepts("ResourceState"), Some(1));
        assert_eq!(StateMsg::accepts("Heartbeat"), None);
        assert!(StateMsg::decode_envelope("Heartbeat", &body).is_err());
    }
}
