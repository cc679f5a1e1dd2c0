//! The MultiPilot message contract.
//!
//! Every message on the bus is an [`Envelope`] around one payload type, encoded as MessagePack with
//! **named fields** (maps, never positional arrays) so that adding an optional field never breaks an older
//! consumer. Two headers travel with every message: [`HEADER_CONTENT_TYPE`] and [`HEADER_SCHEMA`]
//! (`<Schema>/<major version>`). The time a message was *stored* (`ingest_time`) is not part of the
//! envelope: it is the JetStream server's timestamp, read by consumers from the message metadata.
//!
//! - [`envelope`]: the envelope and the [`Payload`] trait every payload implements.
//! - [`payload`]: every payload type (resource state, events, probes, metrics, incidents, …).
//! - [`object`]: what of a Kubernetes object an apply owns (the content the agent and the release role compare).
//! - [`codec`]: encode/decode with header checks, size limits and clear errors.
//! - [`subject`]: subject tokens escaped from Kubernetes names, and the subject builders.
//! - [`catalog`]: the list of payload types and their generated JSON Schemas.
//! - [`streams`]: the streams' names, and the unions of payloads a stream (or a durable's filter) carries.
//! - [`control`]: request/reply subjects between hub roles and their JSON bodies.
//! - [`probes`]: the health probes every agent runs.
//! - [`selector`]: label selectors, the one grammar of kubectl and the API server (plus version comparisons).
//! - [`deprecations`]: the Kubernetes API deprecation table the agent and the release planner judge by.

pub mod catalog;
mod closed;
pub mod codec;
pub mod control;
pub mod deprecations;
pub mod envelope;
pub mod object;
pub mod payload;
pub mod probes;
pub mod selector;
pub mod streams;
pub mod subject;

pub use codec::{DecodeError, EncodeError, decode, decode_shared, encode};
pub use envelope::{Envelope, Payload};

/// Header naming the content type of every MultiPilot message.
pub const HEADER_CONTENT_TYPE: &str = "Content-Type";
/// The content type of every MultiPilot message body.
pub const CONTENT_TYPE_MSGPACK: &str = "application/msgpack";
/// Header naming the payload schema and its major version, e.g. `ResourceState/1`.
pub const HEADER_SCHEMA: &str = "Multipilot-Schema";
/// JetStream's de-duplication header.
pub const HEADER_MSG_ID: &str = "Nats-Msg-Id";

/// A stable identifier built from the parts that say what a message *is* (not when it was sent), used as
/// `Nats-Msg-Id` so that replays after relists, restarts and outbox re-sends are dropped by JetStream.
///
/// The parts are length-prefixed before hashing, so `["ab", "c"]` and `["a", "bc"]` differ.
pub fn stable_id(parts: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    hex::encode(&h.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_id_separates_parts() {
        assert_ne!(stable_id(&["ab", "c"]), stable_id(&["a", "bc"]));
        assert_eq!(stable_id(&["x", "y"]), stable_id(&["x", "y"]));
        assert_eq!(stable_id(&["x"]).len(), 32);
    }
}
