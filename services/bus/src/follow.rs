//! Following a stream as a picture of now: an ephemeral ordered consumer that reads the last message of
//! every subject (or everything the stream keeps), then what comes live — the one reader behind the
//! console's feeds, the release role's drift judge and its fleet registry.
//!
//! The consumer lives on the server only while it is read (no durable, nothing to clean up). When it is
//! lost (the server restarted, the stream was recreated, the connection dropped for longer than the client's
//! own gap recovery), [`Follower::next`] logs why, waits (200 ms, doubling to 5 s) and creates it again,
//! resuming after the last message it returned, so nothing is read twice and nothing is skipped that the
//! stream still holds. Messages are decoded through the contract ([`Followed::decode`]): schema, version
//! and size checked as every other reader does.

use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use multipilot_schemas::{DecodeError, Envelope, Payload, codec::DEFAULT_MAX_BYTES};

use crate::jetstream::{Error, get_stream};

/// What a follower reads first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// The last message of every subject (the latest state of each thing), then live.
    LastPerSubject,
    /// Everything the stream keeps, oldest first, then live (when the last per subject is not enough:
    /// several things share a subject, or the history itself is the point).
    All,
}

/// One message a follower read, with what JetStream says of it.
#[derive(Debug)]
pub struct Followed {
    /// The message.
    pub message: async_nats::Message,
    /// Its stream sequence.
    pub stream_seq: u64,
    /// When JetStream stored it (`ingest_time`).
    pub published: DateTime<Utc>,
}

impl Followed {
    /// Decodes the message as the contract's `T` (by its `Content-Type` and `Multipilot-Schema` headers,
    /// within the contract's size limit).
    pub fn decode<T: Payload>(&self) -> Result<Envelope<T>, DecodeError> {
        crate::jetstream::decode::<T>(&self.message, DEFAULT_MAX_BYTES)
    }
}

/// What [`Follower::next`] brings.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // returned once per message, never kept: a box would only add an allocation
pub enum Next {
    /// A message.
    Message(Followed),
    /// Everything the stream held (of the subjects followed) when the follower started has been read:
    /// once, right after the message that was the last of them (or at once, when there was none).
    CaughtUp,
}

/// A stream followed from the last message per subject (or its start), then live. See the module docs.
pub struct Follower {
    js: jetstream::Context,
    stream: String,
    filters: Vec<String>,
    from: Replay,
    messages: Option<consumer::pull::Ordered>,
    last_seq: Option<u64>,
    caught_up: bool,
    announced: bool,
    pause: Duration,
    /// After a loss: not before this (kept across calls, so a `select!` that drops `next` keeps the pause).
    retry_at: Option<tokio::time::Instant>,
}

impl std::fmt::Debug for Follower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("stream", &self.stream)
            .field("filters", &self.filters)
            .field("from", &self.from)
            .field("last_seq", &self.last_seq)
            .field("caught_up", &self.caught_up)
            .finish_non_exhaustive()
    }
}

const FIRST_PAUSE: Duration = Duration::from_millis(200);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

impl Follower {
    /// A follower of `stream`'s `filters` (subjects with wildcards), starting as `from` says. Nothing is
    /// asked of the server before the first [`Follower::next`].
    pub fn new(
        js: jetstream::Context,
        stream: impl Into<String>,
        filters: impl IntoIterator<Item = impl Into<String>>,
        from: Replay,
    ) -> Follower {
        Follower {
            js,
            stream: stream.into(),
            filters: filters.into_iter().map(Into::into).collect(),
            from,
            messages: None,
            last_seq: None,
            caught_up: false,
            announced: false,
            pause: FIRST_PAUSE,
            retry_at: None,
        }
    }

    /// Whether the follower has read what its stream held (of its subjects) when it first started.
    pub fn caught_up(&self) -> bool {
        self.caught_up
    }

    /// The next message, or the news that the follower caught up. Waits as long as it takes; a lost
    /// consumer is logged and created again after a pause, resuming after the last message returned.
    /// Cancel-safe: drop the future (in a `select!` with a cancellation) and call again later.
    pub async fn next(&mut self) -> Next {
        loop {
            if self.caught_up && !self.announced {
                self.announced = true;
                return Next::CaughtUp;
            }
            if let Some(at) = self.retry_at {
                tokio::time::sleep_until(at).await;
                self.retry_at = None;
            }
            match self.try_next().await {
                Ok(Some(m)) => {
                    self.pause = FIRST_PAUSE;
                    return Next::Message(m);
                }
                Ok(None) => continue,
                Err(e) => {
                    self.messages = None;
                    tracing::warn!(stream = %self.stream, error = %e, retry_in = ?self.pause, "following a stream: consumer lost, creating it again");
                    self.retry_at = Some(tokio::time::Instant::now() + self.pause);
                    self.pause = (self.pause * 2).min(LONGEST_PAUSE);
                }
            }
        }
    }

    /// `None`: nothing to return yet (the consumer was just opened: whether it is caught up is known).
    async fn try_next(&mut self) -> Result<Option<Followed>, Error> {
        loop {
            if self.messages.is_none() {
                self.messages = Some(self.open().await?);
                return Ok(None);
            }
            let Some(messages) = self.messages.as_mut() else {
                continue;
            };
            let m = match messages.next().await {
                Some(Ok(m)) => m,
                Some(Err(e)) => return Err(self.fail("reading", e)),
                None => return Err(self.fail("reading", "the ordered consumer ended")),
            };
            let Ok(info) = m.info() else {
                // not a stream message (a status the client should have handled): nothing to return
                continue;
            };
            let (seq, published, pending) = (info.stream_sequence, info.published, info.pending);
            self.last_seq = Some(seq);
            if pending == 0 {
                self.caught_up = true;
            }
            return Ok(Some(Followed {
                message: m.message,
                stream_seq: seq,
                published,
            }));
        }
    }

    async fn open(&mut self) -> Result<consumer::pull::Ordered, Error> {
        let stream = get_stream(&self.js, &self.stream).await?;
        let deliver_policy = match (self.last_seq, self.from) {
            (Some(seq), _) => consumer::DeliverPolicy::ByStartSequence {
                start_sequence: seq + 1,
            },
            (None, Replay::LastPerSubject) => consumer::DeliverPolicy::LastPerSubject,
            (None, Replay::All) => consumer::DeliverPolicy::All,
        };
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subjects: self.filters.clone(),
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|e| self.fail("creating an ordered consumer on", e))?;
        if consumer.cached_info().num_pending == 0 {
            self.caught_up = true;
        }
        consumer
            .messages()
            .await
            .map_err(|e| self.fail("reading", e))
    }

    fn fail(&self, what: &'static str, reason: impl std::fmt::Display) -> Error {
        Error::Server {
            what,
            stream: self.stream.clone(),
            durable: String::new(),
            reason: reason.to_string(),
        }
    }
}
