//! Encoding and decoding of enveloped payloads.
//!
//! Encoding is always named MessagePack (`rmp_serde::to_vec_named`). Decoding checks, in order: the size
//! limit, the content type, the schema header (name and major version), the body, and that the body's
//! envelope agrees with the header. Every failure is a [`DecodeError`] with a short
//! [`reason`](DecodeError::reason) class for dead-letter entries and metrics.

use chrono::{DateTime, TimeZone, Utc};

use crate::envelope::{Envelope, Payload};

/// Largest body a decoder accepts by default: NATS' default `max_payload`.
pub const DEFAULT_MAX_BYTES: usize = 1024 * 1024;

/// Encoding failed (a bug in the producer, never retryable).
#[derive(Debug, thiserror::Error)]
#[error("encoding failed: {0}")]
pub struct EncodeError(#[from] rmp_serde::encode::Error);

/// Why a message could not be decoded. None of these is retryable: the same bytes fail the same way.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The body is larger than the decoder accepts.
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Body size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The content type header names something other than MessagePack.
    #[error("unsupported content type {0:?} (expected application/msgpack)")]
    ContentType(String),
    /// No `Multipilot-Schema` header.
    #[error("missing Multipilot-Schema header")]
    MissingSchema,
    /// The header is not `<Name>/<major>`.
    #[error("malformed Multipilot-Schema header {0:?} (expected <Name>/<major>)")]
    MalformedSchema(String),
    /// A different payload type than this consumer reads.
    #[error("schema {got:?} where {expected:?} was expected")]
    WrongSchema {
        /// Expected schema name.
        expected: &'static str,
        /// Schema name found.
        got: String,
    },
    /// A major version this decoder does not know.
    #[error(
        "schema {schema} version {version} is not supported (this consumer reads up to {supported})"
    )]
    UnsupportedVersion {
        /// Schema name.
        schema: String,
        /// Version found.
        version: u32,
        /// Highest version supported.
        supported: u32,
    },
    /// The body is not a valid envelope of this payload type.
    #[error("malformed MessagePack body: {0}")]
    Malformed(#[from] rmp_serde::decode::Error),
    /// The body decoded but breaks a rule of the contract.
    #[error("invalid envelope: {0}")]
    Invalid(String),
}

impl DecodeError {
    /// A short, fixed class for dead-letter entries and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::TooLarge { .. } => "too-large",
            DecodeError::ContentType(_) => "content-type",
            DecodeError::MissingSchema
            | DecodeError::MalformedSchema(_)
            | DecodeError::WrongSchema { .. } => "schema",
            DecodeError::UnsupportedVersion { .. } => "version",
            DecodeError::Malformed(_) => "decode",
            DecodeError::Invalid(_) => "invalid",
        }
    }
}

/// Encodes an envelope as named MessagePack.
pub fn encode<T: Payload>(envelope: &Envelope<T>) -> Result<Vec<u8>, EncodeError> {
    Ok(rmp_serde::to_vec_named(envelope)?)
}

/// Parses a `Multipilot-Schema` header value into name and major version.
pub fn parse_schema_header(value: &str) -> Result<(&str, u32), DecodeError> {
    let (name, version) = value
        .split_once('/')
        .ok_or_else(|| DecodeError::MalformedSchema(value.to_string()))?;
    let version = version
        .parse::<u32>()
        .map_err(|_| DecodeError::MalformedSchema(value.to_string()))?;
    if name.is_empty() {
        return Err(DecodeError::MalformedSchema(value.to_string()));
    }
    Ok((name, version))
}

/// Decodes a message body into an envelope of `T`, checking its headers first.
///
/// `content_type` and `schema` are the header values (`None` when absent). A missing content type is
/// accepted (MessagePack is the only encoding); a missing schema header is not.
pub fn decode<T: Payload>(
    content_type: Option<&str>,
    schema: Option<&str>,
    body: &[u8],
    max_bytes: usize,
) -> Result<Envelope<T>, DecodeError> {
    decode_with(content_type, schema, body, max_bytes, T::decode_envelope)
}

/// [`decode`] of a message's own buffer, which the payload may keep instead of copying
/// ([`Payload::decode_envelope_shared`]).
pub fn decode_shared<T: Payload>(
    content_type: Option<&str>,
    schema: Option<&str>,
    body: &bytes::Bytes,
    max_bytes: usize,
) -> Result<Envelope<T>, DecodeError> {
    decode_with(content_type, schema, body, max_bytes, |name, _| {
        T::decode_envelope_shared(name, body)
    })
}

fn decode_with<T: Payload>(
    content_type: Option<&str>,
    schema: Option<&str>,
    body: &[u8],
    max_bytes: usize,
    decode_body: impl FnOnce(&str, &[u8]) -> Result<Envelope<T>, rmp_serde::decode::Error>,
) -> Result<Envelope<T>, DecodeError> {
    if body.len() > max_bytes {
        return Err(DecodeError::TooLarge {
            size: body.len(),
            limit: max_bytes,
        });
    }
    if let Some(ct) = content_type
        && ct != crate::CONTENT_TYPE_MSGPACK
    {
        return Err(DecodeError::ContentType(ct.to_string()));
    }
    let (name, version) = parse_schema_header(schema.ok_or(DecodeError::MissingSchema)?)?;
    let Some(supported) = T::accepts(name) else {
        return Err(DecodeError::WrongSchema {
            expected: T::SCHEMA,
            got: name.to_string(),
        });
    };
    if version == 0 || version > supported {
        return Err(DecodeError::UnsupportedVersion {
            schema: name.to_string(),
            version,
            supported,
        });
    }
    let envelope: Envelope<T> = decode_body(name, body)?;
    if envelope.schema != name {
        return Err(DecodeError::Invalid(format!(
            "body says schema {:?}, header says {name:?}",
            envelope.schema
        )));
    }
    validate(&envelope)?;
    Ok(envelope)
}

/// Earliest timestamp the contract accepts (2000-01-01T00:00:00Z).
pub fn earliest_time() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0)
        .single()
        .unwrap_or_default()
}

/// Latest timestamp the contract accepts (2200-01-01T00:00:00Z).
pub fn latest_time() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2200, 1, 1, 0, 0, 0)
        .single()
        .unwrap_or_default()
}

/// Checks the rules the type system can't: header and body agree, timestamps are plausible.
///
/// Timestamps outside 2000–2200 are rejected: a clock that far off is a broken clock, and placing such a
/// message on a timeline would scramble it. Moderate skew (minutes, hours) is accepted and measured by the
/// correlator instead.
pub fn validate<T: Payload>(envelope: &Envelope<T>) -> Result<(), DecodeError> {
    let Some(supported) = T::accepts(&envelope.schema) else {
        return Err(DecodeError::Invalid(format!(
            "body says schema {:?}, header says {:?}",
            envelope.schema,
            T::SCHEMA
        )));
    };
    if envelope.version == 0 || envelope.version > supported {
        return Err(DecodeError::UnsupportedVersion {
            schema: envelope.schema.clone(),
            version: envelope.version,
            supported,
        });
    }
    let (lo, hi) = (earliest_time(), latest_time());
    for (field, t) in [
        ("cluster_time", envelope.cluster_time),
        ("agent_time", envelope.agent_time),
    ] {
        if t < lo || t >= hi {
            return Err(DecodeError::Invalid(format!(
                "{field} {t} is outside 2000..2200"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::Heartbeat;

    fn heartbeat() -> Envelope<Heartbeat> {
        Envelope::new(
            "prod-1",
            "agent-prod-1",
            Utc::now(),
            7,
            Heartbeat {
                interval_s: 5,
                agent_version: "0.1.0".into(),
                started_at: Utc::now(),
                outbox_depth: 0,
                dropped_metric_batches: 0,
                apiserver_reachable: true,
                superseded: 0,
                duplicates: 0,
            },
        )
    }

    #[test]
    fn encoding_uses_field_names() {
        let bytes = encode(&heartbeat()).unwrap();
        let value = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        let map = value.as_map().expect("envelope is a map, not an array");
        assert!(map.iter().any(|(k, _)| k.as_str() == Some("cluster_time")));
    }

    #[test]
    fn round_trip() {
        let env = heartbeat();
        let bytes = encode(&env).unwrap();
        let back: Envelope<Heartbeat> = decode(
            Some("application/msgpack"),
            Some("Heartbeat/1"),
            &bytes,
            DEFAULT_MAX_BYTES,
        )
        .unwrap();
        assert_eq!(back, env);
    }

    #[test]
    fn unknown_fields_are_ignored_and_new_fields_optional() {
        // An older producer (no `apiserver_reachable`) and a newer one (an extra field) both decode.
        let mut map = serde_json::to_value(heartbeat()).unwrap();
        let payload = map["payload"].as_object_mut().unwrap();
        payload.remove("apiserver_reachable");
        payload.insert(
            "field_from_the_future".into(),
            serde_json::json!({"x": [1, 2]}),
        );
        let bytes = rmp_serde::to_vec_named(&map).unwrap();
        let back: Envelope<Heartbeat> =
            decode(None, Some("Heartbeat/1"), &bytes, DEFAULT_MAX_BYTES).unwrap();
        assert!(back.payload.apiserver_reachable);
    }

    #[test]
    fn rejections_have_reasons() {
        let bytes = encode(&heartbeat()).unwrap();
        type Case<'a> = (Option<&'a str>, Option<&'a str>, Vec<u8>, &'a str);
        let cases: Vec<Case> = vec![
            (
                None,
                Some("Heartbeat/1"),
                bytes[..bytes.len() / 2].to_vec(),
                "decode",
            ),
            (
                None,
                Some("Heartbeat/1"),
                b"\xc1\xc1garbage".to_vec(),
                "decode",
            ),
            (None, None, bytes.clone(), "schema"),
            (None, Some("Heartbeat"), bytes.clone(), "schema"),
            (None, Some("Incident/1"), bytes.clone(), "schema"),
            (None, Some("Heartbeat/2"), bytes.clone(), "version"),
            (
                Some("application/json"),
                Some("Heartbeat/1"),
                bytes.clone(),
                "content-type",
            ),
        ];
        for (ct, schema, body, reason) in cases {
            let err = decode::<Heartbeat>(ct, schema, &body, DEFAULT_MAX_BYTES).unwrap_err();
            assert_eq!(err.reason(), reason, "{err}");
        }
        let err = decode::<Heartbeat>(None, Some("Heartbeat/1"), &bytes, 10).unwrap_err();
        assert_eq!(err.reason(), "too-large");
        // invalid UTF-8 inside a string field (the agent version "0.1.0" with a byte replaced)
        let at = bytes
            .windows(5)
            .position(|w| w == b"0.1.0")
            .expect("the version string");
        let mut bad = bytes.clone();
        bad[at] = 0xff;
        let err =
            decode::<Heartbeat>(None, Some("Heartbeat/1"), &bad, DEFAULT_MAX_BYTES).unwrap_err();
        assert_eq!(err.reason(), "decode", "{err}");
    }

    #[test]
    fn implausible_timestamps_are_invalid() {
        for year in [1970, 3000] {
            let mut env = heartbeat();
            env.cluster_time = Utc.with_ymd_and_hms(year, 1, 1, 0, 0, 0).unwrap();
            let bytes = encode(&env).unwrap();
            let err = decode::<Heartbeat>(None, Some("Heartbeat/1"), &bytes, DEFAULT_MAX_BYTES)
                .unwrap_err();
            assert_eq!(err.reason(), "invalid", "{year}: {err}");
        }
    }
}
