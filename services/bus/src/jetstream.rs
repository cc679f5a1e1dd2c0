//! The JetStream toolkit every role reads streams with, beyond the consumer runner: durable consumers set up
//! per partition (and recreated to replay), an ordered reader for a stream's history, typed "not found"
//! checks, and header/decoding helpers for a raw message.

use std::time::Duration;

use async_nats::jetstream::{
    self, ErrorCode, consumer,
    context::{ConsumerInfoError, ConsumerInfoErrorKind, GetStreamError, GetStreamErrorKind},
    stream::{ConsumerError, ConsumerErrorKind},
};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use multipilot_schemas::{DecodeError, Envelope, HEADER_CONTENT_TYPE, HEADER_SCHEMA, Payload};

use crate::topology::Topology;

/// What the toolkit's calls fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stream does not exist (not provisioned yet).
    #[error("stream {stream} not found (is the topology provisioned?)")]
    NoStream {
        /// Stream.
        stream: String,
    },
    /// The topology defines no such consumer.
    #[error("deploy/streams.yaml defines no consumer {durable} on {stream}")]
    NotInTopology {
        /// Stream.
        stream: String,
        /// Durable.
        durable: String,
    },
    /// The server refused or did not answer.
    #[error("{what} {stream}/{durable}: {reason}")]
    Server {
        /// What was being done.
        what: &'static str,
        /// Stream.
        stream: String,
        /// Durable (empty for an ordered reader).
        durable: String,
        /// Why.
        reason: String,
    },
    /// No message came before the end of what was to be read.
    #[error("reading {stream}: no message for {0:?} before its end", .timeout)]
    Stalled {
        /// Stream.
        stream: String,
        /// How long it waited.
        timeout: Duration,
    },
}

impl Error {
    /// Whether trying again later may succeed (the server was unreachable or slow), as opposed to a
    /// definition that will stay wrong.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Server { .. } | Error::Stalled { .. })
    }
}

/// Whether a consumer call failed because the consumer does not exist.
pub fn consumer_not_found(e: &ConsumerError) -> bool {
    matches!(e.kind(), ConsumerErrorKind::JetStream(j) if j.error_code() == ErrorCode::CONSUMER_NOT_FOUND)
}

/// Whether a consumer info call failed because the consumer (or its stream) does not exist.
pub fn consumer_info_not_found(e: &ConsumerInfoError) -> bool {
    matches!(
        e.kind(),
        ConsumerInfoErrorKind::NotFound | ConsumerInfoErrorKind::StreamNotFound
    )
}

/// Whether a stream lookup failed because the stream does not exist.
pub fn stream_not_found(e: &GetStreamError) -> bool {
    matches!(e.kind(), GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// A header of a message, as a string.
pub fn header<'a>(msg: &'a async_nats::Message, name: &str) -> Option<&'a str> {
    msg.headers.as_ref()?.get(name).map(|v| v.as_str())
}

/// Decodes a message of the contract by its `Content-Type` and `Multipilot-Schema` headers.
pub fn decode<T: Payload>(
    msg: &async_nats::Message,
    max_bytes: usize,
) -> Result<Envelope<T>, DecodeError> {
    multipilot_schemas::decode::<T>(
        header(msg, HEADER_CONTENT_TYPE),
        header(msg, HEADER_SCHEMA),
        &msg.payload,
        max_bytes,
    )
}

/// The name of partition `k` of `n` of a topology durable: `<base>-p<k>-of-<n>` (the base itself when the
/// fleet is not partitioned).
pub fn partition_durable(base: &str, partition: u32, partitions: u32) -> String {
    if partitions <= 1 {
        base.to_string()
    } else {
        format!("{base}-p{partition}-of-{partitions}")
    }
}

/// One instance's durable consumer on a topology consumer: the shared one, or its partition's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durable {
    /// Stream.
    pub stream: String,
    /// The topology's durable (`deploy/streams.yaml`), whose settings the partition's durable copies.
    pub base: String,
    /// Partitions the fleet is split into (1: none).
    pub partitions: u32,
    /// This instance's partition.
    pub partition: u32,
    /// With partitions: the partition's subjects (the server's mapping adds the partition as a last token).
    pub filters: Vec<String>,
}

impl Durable {
    /// The shared topology durable.
    pub fn shared(stream: &str, base: &str) -> Self {
        Durable {
            stream: stream.into(),
            base: base.into(),
            partitions: 1,
            partition: 0,
            filters: Vec::new(),
        }
    }

    /// Partition `partition` of `partitions`, reading `filters`.
    pub fn partitioned(
        stream: &str,
        base: &str,
        partition: u32,
        partitions: u32,
        filters: Vec<String>,
    ) -> Self {
        Durable {
            stream: stream.into(),
            base: base.into(),
            partitions,
            partition,
            filters,
        }
    }

    /// The durable's name on the server.
    pub fn name(&self) -> String {
        partition_durable(&self.base, self.partition, self.partitions)
    }

    fn server(&self, what: &'static str, reason: impl ToString) -> Error {
        Error::Server {
            what,
            stream: self.stream.clone(),
            durable: self.name(),
            reason: reason.to_string(),
        }
    }

    /// Makes sure the durable exists with the topology's settings (and, with partitions, its filters); with
    /// `replay` it is deleted first and created again, so delivery starts at the beginning of what the
    /// stream holds instead of its last acked position. Returns the durable's name.
    ///
    /// The shared durable without a replay is left as provisioned from the topology.
    pub async fn ensure(&self, js: &jetstream::Context, replay: bool) -> Result<String, Error> {
        let name = self.name();
        if self.partitions <= 1 && !replay {
            return Ok(name);
        }
        let def = Topology::embedded()
            .consumer(&self.stream, &self.base)
            .cloned()
            .ok_or_else(|| Error::NotInTopology {
                stream: self.stream.clone(),
                durable: self.base.clone(),
            })?;
        let mut config = def.to_config();
        config.durable_name = Some(name.clone());
        if self.partitions > 1 {
            config.filter_subjects = self.filters.clone();
        }
        let stream = get_stream(js, &self.stream).await?;
        if replay {
            match stream.delete_consumer(&name).await {
                Ok(_) => tracing::info!(
                    durable = %name,
                    "fresh store: replaying the stream from its start"
                ),
                Err(e) if consumer_not_found(&e) => {}
                Err(e) => return Err(self.server("deleting for a replay", e)),
            }
        }
        stream
            .create_consumer(config)
            .await
            .map_err(|e| self.server("creating", e))?;
        Ok(name)
    }

    /// The durable's state on the server, `None` when it does not exist.
    pub async fn info(&self, js: &jetstream::Context) -> Result<Option<consumer::Info>, Error> {
        let stream = get_stream(js, &self.stream).await?;
        match stream.consumer_info(self.name()).await {
            Ok(i) => Ok(Some(i)),
            Err(e) if consumer_info_not_found(&e) => Ok(None),
            Err(e) => Err(self.server("reading", e)),
        }
    }

    /// Whether the durable has delivered and had acked everything the stream holds for it.
    pub async fn caught_up(&self, js: &jetstream::Context) -> bool {
        matches!(self.info(js).await, Ok(Some(i)) if i.num_pending == 0 && i.num_ack_pending == 0)
    }
}

/// The stream `name`, with a typed not-found.
pub async fn get_stream(
    js: &jetstream::Context,
    name: &str,
) -> Result<jetstream::stream::Stream, Error> {
    js.get_stream(name).await.map_err(|e| {
        if stream_not_found(&e) {
            Error::NoStream {
                stream: name.to_string(),
            }
        } else {
            Error::Server {
                what: "looking up",
                stream: name.to_string(),
                durable: String::new(),
                reason: e.to_string(),
            }
        }
    })
}

/// Where a history read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The oldest message the stream holds.
    Oldest,
    /// The first message stored at or after this time.
    Since(DateTime<Utc>),
    /// The first message after this stream sequence.
    After(u64),
}

/// One message of a history read, with what JetStream says of it.
#[derive(Debug)]
pub struct Stored<'a> {
    /// The message.
    pub message: &'a async_nats::Message,
    /// Its stream sequence.
    pub stream_seq: u64,
    /// When JetStream stored it (`ingest_time`).
    pub published: DateTime<Utc>,
}

/// Reads `stream` (only `filters`, when given) from `start` up to the last message it held when called,
/// in order, with an ordered consumer (ephemeral, flow-controlled, restarted by the client on a gap); `f`
/// gets each message. Returns how many were read.
pub async fn read_history(
    js: &jetstream::Context,
    stream: &str,
    filters: Vec<String>,
    start: Start,
    f: impl FnMut(Stored<'_>),
) -> Result<u64, Error> {
    read_range(js, stream, filters, start, None, f).await
}

/// [`read_history`], stopping after stream sequence `until` when given.
pub async fn read_range(
    js: &jetstream::Context,
    stream: &str,
    filters: Vec<String>,
    start: Start,
    until: Option<u64>,
    mut f: impl FnMut(Stored<'_>),
) -> Result<u64, Error> {
    const STALL: Duration = Duration::from_secs(10);
    let fail = |reason: String| Error::Server {
        what: "reading",
        stream: stream.to_string(),
        durable: String::new(),
        reason,
    };
    let mut s = get_stream(js, stream).await?;
    let last = s
        .info()
        .await
        .map_err(|e| fail(e.to_string()))?
        .state
        .last_sequence
        .min(until.unwrap_or(u64::MAX));
    if let Start::After(seq) = start
        && seq >= last
    {
        return Ok(0);
    }
    let mut c = s
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subjects: filters,
            deliver_policy: match start {
                Start::Since(start_time) => consumer::DeliverPolicy::ByStartTime { start_time },
                Start::Oldest => consumer::DeliverPolicy::All,
                Start::After(seq) => consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: seq + 1,
                },
            },
            ..Default::default()
        })
        .await
        .map_err(|e| fail(e.to_string()))?;
    if c.info().await.map_err(|e| fail(e.to_string()))?.num_pending == 0 {
        return Ok(0);
    }
    let mut msgs = c.messages().await.map_err(|e| fail(e.to_string()))?;
    let mut n = 0;
    loop {
        let m = match tokio::time::timeout(STALL, msgs.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(fail(e.to_string())),
            Ok(None) => break,
            Err(_) => {
                return Err(Error::Stalled {
                    stream: stream.to_string(),
                    timeout: STALL,
                });
            }
        };
        let Ok(info) = m.info() else { continue };
        let (seq, pending, published) = (info.stream_sequence, info.pending, info.published);
        if seq > last {
            break;
        }
        n += 1;
        f(Stored {
            message: &m.message,
            stream_seq: seq,
            published,
        });
        if pending == 0 || seq >= last {
            break;
        }
    }
    Ok(n)
}
