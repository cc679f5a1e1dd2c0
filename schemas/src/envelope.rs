//! The envelope every message travels in, and the [`Payload`] trait.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// A payload type of the contract.
///
/// `SCHEMA` is the name carried in the envelope and the `Multipilot-Schema` header; `VERSION` is the
/// schema's *major* version. Adding an optional field does not change the version; removing or
/// re-typing a field does, and decoders reject majors they don't know (they go to the dead-letter stream
/// with that reason instead of being misread).
pub trait Payload: Serialize + DeserializeOwned + JsonSchema + Send + Sync + 'static {
    /// The schema name, e.g. `ResourceState`.
    const SCHEMA: &'static str;
    /// The schema's major version.
    const VERSION: u32;

    /// The value of the `Multipilot-Schema` header for this payload, e.g. `ResourceState/1`.
    fn schema_header() -> String {
        format!("{}/{}", Self::SCHEMA, Self::VERSION)
    }
}

/// One envelope for every message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Envelope<T> {
    /// Payload schema name, e.g. `ResourceState`.
    pub schema: String,
    /// Payload schema major version.
    pub version: u32,
    /// The cluster the message is about (empty for fleet-wide messages such as a release's audit record).
    pub cluster: String,
    /// Who produced it: the agent id, or the hub role instance (e.g. `correlator-0`).
    pub source: String,
    /// When it happened in the cluster: taken from the object, event or probe, in the cluster's clock.
    pub cluster_time: DateTime<Utc>,
    /// When the producer published it (its own clock).
    pub agent_time: DateTime<Utc>,
    /// Per-source sequence number, increasing by one per message, so consumers can account for gaps.
    pub seq: u64,
    /// The payload.
    pub payload: T,
}

impl<T: Payload> Envelope<T> {
    /// Wraps a payload, filling the schema name and version from the type.
    pub fn new(
        cluster: impl Into<String>,
        source: impl Into<String>,
        cluster_time: DateTime<Utc>,
        seq: u64,
        payload: T,
    ) -> Self {
        Envelope {
            schema: T::SCHEMA.to_string(),
            version: T::VERSION,
            cluster: cluster.into(),
            source: source.into(),
            cluster_time,
            agent_time: Utc::now(),
            seq,
            payload,
        }
    }
}
