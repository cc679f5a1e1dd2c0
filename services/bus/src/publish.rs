//! Publishing with a bounded window of acks in flight.
//!
//! Awaiting each publish ack in turn caps JetStream at a few thousand messages a second on loopback; the
//! [`Publisher`] instead keeps up to `window` acks outstanding and only awaits the oldest when the window is
//! full, which runs at close to the server's own rate. Every message carries `Nats-Msg-Id`, so a message
//! re-sent after a lost ack (outbox replay, reconnect) is dropped by JetStream's duplicate window and the
//! ack says `duplicate`.
//!
//! Each message carries a caller-chosen key (an outbox sequence, say) that comes back with its completion,
//! so the caller learns exactly which messages are stored.

use std::collections::VecDeque;
use std::future::IntoFuture;
use std::time::Duration;

use tokio::time::Instant;

use async_nats::HeaderMap;
use async_nats::jetstream;
use async_nats::jetstream::context::{PublishAckFuture, PublishError, PublishErrorKind};
use bytes::Bytes;
use multipilot_schemas::{
    CONTENT_TYPE_MSGPACK, Envelope, HEADER_CONTENT_TYPE, HEADER_MSG_ID, HEADER_SCHEMA, Payload,
};

use crate::metrics::BusMetrics;

/// Publishing failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The payload could not be encoded (a bug; not retryable).
    #[error(transparent)]
    Encode(#[from] multipilot_schemas::EncodeError),
    /// The message could not be sent or was not stored (retryable: the server may be away).
    #[error("publish to {subject} failed: {reason}")]
    Publish {
        /// Subject.
        subject: String,
        /// Why.
        reason: String,
    },
}

/// A message ready to publish: subject, headers (content type, schema, Msg-Id) and encoded body.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// Subject.
    pub subject: String,
    /// `Nats-Msg-Id`.
    pub msg_id: String,
    /// Headers, the above included.
    pub headers: HeaderMap,
    /// Encoded envelope.
    pub payload: Bytes,
}

impl Outgoing {
    /// Encodes an envelope (named MessagePack) with the contract's headers.
    pub fn envelope<T: Payload>(
        subject: String,
        msg_id: String,
        envelope: &Envelope<T>,
    ) -> Result<Self, Error> {
        let payload = Bytes::from(multipilot_schemas::encode(envelope)?);
        Ok(Self::raw(subject, msg_id, &T::schema_header(), payload))
    }

    /// A message from already-encoded bytes (an outbox replay) and its schema header value.
    pub fn raw(subject: String, msg_id: String, schema_header: &str, payload: Bytes) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_CONTENT_TYPE, CONTENT_TYPE_MSGPACK);
        headers.insert(HEADER_SCHEMA, schema_header);
        headers.insert(HEADER_MSG_ID, msg_id.as_str());
        Outgoing {
            subject,
            msg_id,
            headers,
            payload,
        }
    }
}

/// How a message ended.
#[derive(Debug)]
pub enum Completion<K> {
    /// Stored by JetStream (or recognised as a duplicate of a stored message).
    Stored {
        /// The caller's key.
        key: K,
        /// Stream that stored it.
        stream: String,
        /// Stream sequence (of the stored original, for a duplicate).
        sequence: u64,
        /// JetStream had it already (same Msg-Id within the duplicate window).
        duplicate: bool,
    },
    /// Not confirmed: the caller should keep it and send it again later.
    Failed {
        /// The caller's key.
        key: K,
        /// Why.
        error: Error,
    },
}

/// How long a publish waits for its ack, counted from its send: async-nats' own default (5 s).
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// A JetStream publisher with a bounded window of acks in flight.
///
/// Each ack is awaited until [`ACK_TIMEOUT`] after its message was sent, or until the client has
/// connected again since the send: an ack owed over a connection that was lost never comes, and the
/// message is reported failed at once (sent again, JetStream's duplicate window drops a second copy).
/// (async-nats starts an ack's timeout only when the ack is awaited, so acks lost with a connection,
/// awaited in turn, took one timeout each: a window of seven lost acks held an agent's drain 35 s after a
/// reconnect.)
pub struct Publisher<K> {
    js: jetstream::Context,
    window: usize,
    ack_timeout: Duration,
    client: async_nats::Client,
    stats: std::sync::Arc<async_nats::Statistics>,
    in_flight: VecDeque<InFlight<K>>,
    metrics: BusMetrics,
}

/// A message sent whose ack is awaited.
struct InFlight<K> {
    key: K,
    subject: String,
    /// When its ack is given up.
    deadline: Instant,
    /// The connection it was sent over, by the client's count of connects (a message sent while the
    /// client is away goes out over the next one).
    connects: u64,
    ack: PublishAckFuture,
}

/// How often an ack still awaited checks whether the connection it was owed over is gone.
const RECONNECT_CHECK: Duration = Duration::from_millis(200);

impl<K> std::fmt::Debug for Publisher<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("window", &self.window)
            .field("in_flight", &self.in_flight.len())
            .finish()
    }
}

impl<K> Publisher<K> {
    /// A publisher keeping at most `window` acks outstanding (256 is a good default on loopback).
    pub fn new(js: jetstream::Context, window: usize, metrics: BusMetrics) -> Self {
        let client = js.client();
        Publisher {
            stats: client.statistics(),
            client,
            js,
            window: window.max(1),
            ack_timeout: ACK_TIMEOUT,
            in_flight: VecDeque::new(),
            metrics,
        }
    }

    /// Waits at most `ack_timeout` after a send for its ack (default [`ACK_TIMEOUT`]; async-nats' own
    /// timeout, the JetStream context's, still applies from the moment an ack is awaited).
    pub fn with_ack_timeout(mut self, ack_timeout: Duration) -> Self {
        self.ack_timeout = ack_timeout;
        self
    }

    /// Acks outstanding.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Sends one message. Returns the completions of older messages that had to be awaited to make room.
    ///
    /// If the message can't even be sent (client closed, payload too large), it comes back at once as a
    /// [`Completion::Failed`] with its key; nothing is lost silently.
    pub async fn send(&mut self, key: K, msg: Outgoing) -> Vec<Completion<K>> {
        let mut done = Vec::new();
        while self.in_flight.len() >= self.window {
            if let Some(c) = self.complete_oldest().await {
                done.push(c);
            }
        }
        let publish = jetstream::message::PublishMessage::build()
            .payload(msg.payload)
            .headers(msg.headers)
            .message_id(msg.msg_id);
        match self.js.send_publish(msg.subject.clone(), publish).await {
            Ok(ack) => self.in_flight.push_back(InFlight {
                key,
                subject: msg.subject,
                deadline: Instant::now() + self.ack_timeout,
                connects: self.connects()
                    + u64::from(
                        self.client.connection_state() != async_nats::connection::State::Connected,
                    ),
                ack,
            }),
            Err(e) => {
                self.metrics.published("failed");
                done.push(Completion::Failed {
                    key,
                    error: Error::Publish {
                        subject: msg.subject,
                        reason: e.to_string(),
                    },
                })
            }
        }
        done
    }

    /// Awaits every outstanding ack.
    pub async fn flush(&mut self) -> Vec<Completion<K>> {
        let mut done = Vec::with_capacity(self.in_flight.len());
        while !self.in_flight.is_empty() {
            if let Some(c) = self.complete_oldest().await {
                done.push(c);
            }
        }
        done
    }

    async fn complete_oldest(&mut self) -> Option<Completion<K>> {
        let InFlight {
            key,
            subject,
            deadline,
            connects,
            ack,
        } = self.in_flight.pop_front()?;
        let mut ack = ack.into_future();
        let acked = loop {
            // once the client has connected again, an ack not here yet is not coming: every one still
            // awaited fails at once, not one check apart
            let lost = self.connects() > connects;
            let step = if lost {
                Instant::now()
            } else {
                (Instant::now() + RECONNECT_CHECK).min(deadline)
            };
            match tokio::time::timeout_at(step, &mut ack).await {
                Ok(r) => break r.map_err(|e| e.to_string()),
                Err(_) if lost => break Err("connection lost before the ack came".to_string()),
                Err(_) if step >= deadline => {
                    break Err(PublishError::new(PublishErrorKind::TimedOut).to_string());
                }
                Err(_) => {}
            }
        };
        Some(match acked {
            Ok(ack) => {
                self.metrics
                    .published(if ack.duplicate { "duplicate" } else { "stored" });
                Completion::Stored {
                    key,
                    stream: ack.stream.clone(),
                    sequence: ack.sequence,
                    duplicate: ack.duplicate,
                }
            }
            Err(e) => {
                self.metrics.published("failed");
                Completion::Failed {
                    key,
                    error: Error::Publish { subject, reason: e },
                }
            }
        })
    }

    fn connects(&self) -> u64 {
        self.stats
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Publishes one message and waits for it to be stored: for low-volume producers (incidents, audit).
pub async fn publish_one<T: Payload>(
    js: &jetstream::Context,
    subject: String,
    msg_id: String,
    envelope: &Envelope<T>,
) -> Result<jetstream::publish::PublishAck, Error> {
    let msg = Outgoing::envelope(subject, msg_id, envelope)?;
    let publish = jetstream::message::PublishMessage::build()
        .payload(msg.payload)
        .headers(msg.headers)
        .message_id(msg.msg_id);
    let fail = |e: &dyn std::fmt::Display| Error::Publish {
        subject: msg.subject.clone(),
        reason: e.to_string(),
    };
    let fut = js
        .send_publish(msg.subject.clone(), publish)
        .await
        .map_err(|e| fail(&e))?;
    fut.await.map_err(|e| fail(&e))
}
