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

    /// The highest major version of `schema` this type decodes, or `None` when it doesn't decode it. A
    /// payload accepts its own schema; a union of payloads (what a consumer of a stream carrying several
    /// schemas reads, e.g. heartbeats and probe results) accepts each member's.
    fn accepts(schema: &str) -> Option<u32> {
        (schema == Self::SCHEMA).then_some(Self::VERSION)
    }

    /// Decodes the body of a message whose (accepted) schema is `schema`.
    fn decode_envelope(
        schema: &str,
        body: &[u8],
    ) -> Result<Envelope<Self>, rmp_serde::decode::Error>
    where
        Self: Sized,
    {
        let _ = schema;
        rmp_serde::from_slice(body)
    }

    /// As [`Payload::decode_envelope`], given the message's own buffer: a payload that keeps the body's
    /// bytes (the TSDB's batch, whose strings are spans of them) shares it instead of copying it.
    fn decode_envelope_shared(
        schema: &str,
        body: &bytes::Bytes,
    ) -> Result<Envelope<Self>, rmp_serde::decode::Error>
    where
        Self: Sized,
    {
        Self::decode_envelope(schema, body)
    }
}

impl<T> Envelope<T> {
    /// The same envelope around another payload (e.g. a member payload lifted into a union).
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Envelope<U> {
        Envelope {
            schema: self.schema,
            version: self.version,
            cluster: self.cluster,
            source: self.source,
            cluster_time: self.cluster_time,
            agent_time: self.agent_time,
            seq: self.seq,
            payload: f(self.payload),
        }
    }
}

/// Decodes a member payload's envelope and lifts it into a union (for [`Payload::decode_envelope`] of a
/// union type).
pub fn decode_member<M: Payload, U>(
    body: &[u8],
    lift: impl FnOnce(M) -> U,
) -> Result<Envelope<U>, rmp_serde::decode::Error> {
    Ok(rmp_serde::from_slice::<Envelope<M>>(body)?.map(lift))
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
