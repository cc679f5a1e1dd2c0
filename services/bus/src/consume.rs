//! The consumer runner: what every hub role uses to read a stream.
//!
//! - Pulls from a durable consumer (defined in [`crate::topology`]) in batches, the next asked for while the
//!   last is settled.
//! - Decodes each message against the payload type the role reads; what can't be decoded (truncated or
//!   malformed MessagePack, a wrong or unknown schema version, an oversized body, an implausible timestamp)
//!   is published to `fleet.dlq.<stream>` as a [`DeadLetter`] with its reason, counted, and terminated.
//!   The valid messages around it are processed normally.
//! - Acks unread, without decoding, the subjects the role says are not its own ([`Config::skip`]: a durable
//!   reading its whole stream instead of several filter subjects).
//! - Applies the rate limits ([`crate::limit`]): a key (cluster) over its own rate is nak'ed with the delay
//!   after which it may go on, so other clusters' messages keep flowing; the global rate is waited for, so
//!   the configured input rate is never exceeded.
//! - Hands each message to the [`Handler`]; after the batch, calls [`Handler::commit`] (where the handler
//!   makes its work durable) and only then acks. A retryable failure is nak'ed with exponential backoff; a
//!   rejected message is dead-lettered with the handler's reason.
//!
//! Delivery is at-least-once: after a crash between commit and ack, messages come again, so handlers are
//! idempotent (they key their writes by what the message is: Msg-Id, source sequence, object uid).

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use multipilot_schemas::{
    DecodeError, Envelope, HEADER_CONTENT_TYPE, HEADER_MSG_ID, HEADER_SCHEMA, Payload,
    payload::DeadLetter, subject,
};
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::limit::{self, Decision, Limiter};
use crate::metrics::BusMetrics;
use crate::publish;

/// Runner settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Stream to read.
    pub stream: String,
    /// Durable consumer name (as in `deploy/streams.yaml`).
    pub durable: String,
    /// Messages per pull.
    pub batch: usize,
    /// How long one pull waits for messages.
    #[serde(with = "humantime_serde")]
    pub fetch_wait: Duration,
    /// Longest a message waits for its batch's commit and ack: a consumer that has caught up takes what
    /// arrived since its last pull once this has passed (one pull, one commit; not woken for every message
    /// as it arrives), and a pull still filling commits what it has once its oldest message has waited this
    /// long (a backlog fills whole pulls sooner).
    #[serde(with = "humantime_serde")]
    pub commit_within: Duration,
    /// First redelivery delay after a retryable failure; doubles per delivery up to `retry_max`.
    #[serde(with = "humantime_serde")]
    pub retry_initial: Duration,
    /// Longest redelivery delay.
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
    /// Bodies larger than this are dead-lettered.
    pub max_message_bytes: usize,
    /// Input rate limits.
    pub rate: limit::Config,
    /// Subjects (NATS patterns) the durable delivers that are not the role's: acked unread. A durable that
    /// reads its whole stream and skips a rare subject costs the server less than one with several
    /// filter subjects, which nats-server answers by intersecting each message block's subjects with the
    /// filters for every message it delivers (62 % of its CPU while the alert router drained).
    #[serde(default)]
    pub skip: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            stream: String::new(),
            durable: String::new(),
            batch: 500,
            fetch_wait: Duration::from_secs(1),
            commit_within: Duration::from_millis(100),
            retry_initial: Duration::from_millis(500),
            retry_max: Duration::from_secs(60),
            max_message_bytes: multipilot_schemas::codec::DEFAULT_MAX_BYTES,
            rate: limit::Config::default(),
            skip: Vec::new(),
        }
    }
}

/// Runner failures (the runner itself only stops for these; message-level problems never stop it).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stream or consumer does not exist (provision first).
    #[error("consumer {stream}/{durable} not available: {reason}")]
    Consumer {
        /// Stream.
        stream: String,
        /// Durable name.
        durable: String,
        /// Why.
        reason: String,
    },
}

/// A decoded message with what JetStream knows about it.
#[derive(Debug, Clone)]
pub struct Received<T> {
    /// The envelope.
    pub envelope: Envelope<T>,
    /// Subject it was published on.
    pub subject: String,
    /// When JetStream stored it (the server's clock): the `ingest_time` consumers carry forward.
    pub ingest_time: DateTime<Utc>,
    /// Stream sequence.
    pub stream_seq: u64,
    /// Delivery attempt, from 1.
    pub delivered: u64,
    /// `Nats-Msg-Id`, if set.
    pub msg_id: Option<String>,
}

/// What the handler made of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Handled; ack after the batch's commit (unless the handler names it in
    /// [`Handler::deferred_outcomes`] then).
    Done,
    /// Could not handle it now (a dependency is away): redeliver later with backoff.
    Retry(String),
    /// Can never be handled (it is invalid for this role): dead-letter with this reason class and error.
    Reject {
        /// Short class, e.g. `invalid`.
        reason: String,
        /// The full error.
        error: String,
    },
}

/// How a runner asks for its next messages, by what its last pull brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pace {
    /// A whole batch came and more were waiting behind it (or nothing is known yet): a whole batch is asked
    /// for again, ahead of the commit.
    Backlog,
    /// Fewer came than asked, or nothing was waiting behind the last of them: the consumer has caught up.
    /// What arrives meanwhile is taken together one `commit_within` after `since` (when the last pull was
    /// asked for), by a pull that ends once it has delivered what was waiting (JetStream's no-wait pull;
    /// given an expiry, with nothing waiting it ends with the first messages to come, or after
    /// `fetch_wait`). A pull left open would deliver each message alone as it is stored, waking the role,
    /// reading the socket and committing per handful (live, the correlator spent 2.3× its drain's CPU on
    /// each event).
    CaughtUp {
        /// When the last pull was asked for.
        since: tokio::time::Instant,
    },
}

impl Pace {
    /// The pace after a pull asked for at `at` that wanted `wanted` messages and delivered `delivered`, the
    /// last of them with `behind` messages waiting behind it (as JetStream told with it).
    fn after(
        wanted: usize,
        delivered: usize,
        behind: Option<u64>,
        at: tokio::time::Instant,
    ) -> Pace {
        if delivered < wanted || behind == Some(0) {
            Pace::CaughtUp { since: at }
        } else {
            Pace::Backlog
        }
    }
}

/// Longest a commit may take for the pull asked for ahead of it to be used; past it that pull's messages are
/// nak'ed for redelivery (its handling would run into async-nats' end of the pull, `fetch_wait` + 5 s after
/// it was asked for).
const PULL_AHEAD_HOLD: Duration = Duration::from_secs(2);

/// Naks, for redelivery at once, the messages of a pull already received (what a stopping runner, or one
/// dropping a pull, did not handle; what is still on its way waits for the ack wait).
async fn release(batch: &mut pull::Batch) {
    use futures::FutureExt as _;
    while let Some(Some(Ok(m))) = batch.next().now_or_never() {
        let _ = m.ack_with(AckKind::Nak(None)).await;
    }
}

/// Why a batch's work could not be made durable (its messages are nak'ed for redelivery either way).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct CommitError {
    /// What went wrong.
    pub reason: String,
    /// Whether trying again may succeed by itself (a server away, a full disk clearing); a failure that
    /// won't (an encoding error, a store refusing the data) needs an operator, and is logged so.
    pub retryable: bool,
}

impl CommitError {
    /// A failure that may pass.
    pub fn retryable(reason: impl std::fmt::Display) -> Self {
        CommitError {
            reason: reason.to_string(),
            retryable: true,
        }
    }

    /// A failure that will not pass by itself.
    pub fn permanent(reason: impl std::fmt::Display) -> Self {
        CommitError {
            reason: reason.to_string(),
            retryable: false,
        }
    }
}

/// A role's message handler.
pub trait Handler<T: Payload>: Send {
    /// Handles one message.
    fn handle(&mut self, msg: Received<T>) -> impl Future<Output = Outcome> + Send;

    /// Makes the work of the batch durable; called before the batch's messages are acked. An error naks
    /// them all for redelivery.
    fn commit(&mut self) -> impl Future<Output = Result<(), CommitError>> + Send {
        async { Ok(()) }
    }

    /// After a commit that succeeded: the messages, by stream sequence, that `handle` answered `Done` but
    /// whose work the commit did not make after all (a handler that works behind `handle`, as the TSDB's
    /// writer thread does, learns only then that a message failed), each with what to do with it instead of
    /// acking it (`Retry`: nak'ed with backoff; `Reject`: dead-lettered). Taken once per commit.
    fn deferred_outcomes(&mut self) -> Vec<(u64, Outcome)> {
        Vec::new()
    }
}

/// Reads one durable consumer until cancelled.
#[derive(Debug)]
pub struct Runner {
    js: jetstream::Context,
    config: Config,
    limiter: Limiter,
    metrics: BusMetrics,
}

impl Runner {
    /// A runner for one consumer.
    pub fn new(js: jetstream::Context, config: Config, metrics: BusMetrics) -> Self {
        let limiter = Limiter::new(&config.rate);
        Runner {
            js,
            config,
            limiter,
            metrics,
        }
    }

    /// Effective messages per pull: with a global rate, no more than ~5 s worth, so a batch is always acked
    /// well within the consumer's ack wait.
    fn batch_size(&self) -> usize {
        let n = self.config.batch.max(1);
        match self.config.rate.per_second {
            0 => n,
            r => n.min((r as usize * 5).max(1)),
        }
    }

    fn backoff(&self, delivered: u64) -> Duration {
        let exp = delivered.saturating_sub(1).min(20) as u32;
        let base = self
            .config
            .retry_initial
            .saturating_mul(2u32.saturating_pow(exp))
            .min(self.config.retry_max);
        // ±20% jitter so retries of many messages don't come back in one wave.
        let jitter = rand::rng().random_range(0.8..1.2);
        base.mul_f64(jitter)
    }

    /// Runs until `cancel` fires. Message-level failures never stop it; a lost server is retried.
    pub async fn run<T: Payload, H: Handler<T>>(
        &self,
        handler: &mut H,
        cancel: CancellationToken,
    ) -> Result<(), Error> {
        let c = &self.config;
        let consumer: jetstream::consumer::Consumer<pull::Config> = loop {
            // a missing stream or durable is a definition error (provision first); anything else may
            // pass (the server is starting, a leader election)
            let got = async {
                let stream = match self.js.get_stream(&c.stream).await {
                    Ok(s) => s,
                    Err(e) if crate::jetstream::stream_not_found(&e) => {
                        return Err((true, e.to_string()));
                    }
                    Err(e) => return Err((false, e.to_string())),
                };
                match stream.consumer_info(&c.durable).await {
                    Ok(_) => {}
                    Err(e) if crate::jetstream::consumer_info_not_found(&e) => {
                        return Err((true, e.to_string()));
                    }
                    Err(e) => return Err((false, e.to_string())),
                }
                stream
                    .get_consumer::<pull::Config>(&c.durable)
                    .await
                    .map_err(|e| (false, e.to_string()))
            }
            .await;
            match got {
                Ok(consumer) => break consumer,
                Err((true, reason)) => {
                    return Err(Error::Consumer {
                        stream: c.stream.clone(),
                        durable: c.durable.clone(),
                        reason,
                    });
                }
                Err((false, reason)) => {
                    tracing::warn!(stream = %c.stream, durable = %c.durable, %reason, "consumer not reachable yet");
                    tokio::select! {
                        _ = cancel.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            }
        };
        let mut since_shrink = 0usize;
        let mut pull_backoff = Duration::from_millis(100);
        // the next pull, asked for (in a backlog) once the current one has delivered all it will and before
        // its messages are settled: the server delivers the next batch while the role commits and acks this
        // one (a pull asked for after the acks left the server idle through every commit, and the role
        // through every delivery). Only one pull is open at a time: nats-server hands the messages of pulls
        // open together out in turn, one each, which would mix their order.
        let mut next: Option<(pull::Batch, tokio::time::Instant)> = None;
        // how the next messages are asked for (see `Pace`)
        let mut pace = Pace::Backlog;
        while !cancel.is_cancelled() {
            if let (None, Pace::CaughtUp { since }) = (&next, pace) {
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    _ = tokio::time::sleep_until(since + c.commit_within) => {}
                }
            }
            let wanted = self.batch_size();
            let (batch, asked_at) = match (next.take(), pace) {
                (Some((b, at)), _) => (Ok(b), at),
                (None, Pace::Backlog) => (self.pull(&consumer).await, tokio::time::Instant::now()),
                (None, Pace::CaughtUp { .. }) => {
                    (self.fetch(&consumer).await, tokio::time::Instant::now())
                }
            };
            let mut batch = match batch {
                Ok(b) => {
                    pull_backoff = Duration::from_millis(100);
                    b
                }
                Err(e) => {
                    tracing::warn!(durable = %c.durable, error = %e, "pull failed; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(pull_backoff) => {}
                    }
                    pull_backoff = (pull_backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            let mut to_ack = Vec::new();
            // when the oldest message of `to_ack` must be committed by
            let mut due: Option<tokio::time::Instant> = None;
            let mut ended = false;
            let mut delivered = 0usize;
            // messages waiting behind the last one delivered
            let mut behind = None;
            loop {
                let next_msg = tokio::select! {
                    _ = cancel.cancelled() => None,
                    n = batch.next() => {
                        ended = n.is_none();
                        n
                    }
                    _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => {
                        self.settle(handler, std::mem::take(&mut to_ack)).await;
                        due = None;
                        continue;
                    }
                };
                let Some(msg) = next_msg else { break };
                let msg = match msg {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::debug!(durable = %c.durable, error = %e, "batch ended");
                        break;
                    }
                };
                delivered += 1;
                behind = msg.info().ok().map(|i| i.pending);
                if let Some(m) = self.process(handler, msg).await {
                    to_ack.push(m);
                    due.get_or_insert_with(|| tokio::time::Instant::now() + c.commit_within);
                }
            }
            // not under a global input limit: its batches take up to ~5 s to hand over, and async-nats ends
            // a pull (its buffered messages left unacked until the ack wait) `fetch_wait` + 5 s after it was
            // asked for
            pace = Pace::after(wanted, delivered, behind, asked_at);
            let ahead = ended
                && !cancel.is_cancelled()
                && c.rate.per_second == 0
                && matches!(pace, Pace::Backlog);
            let asked = tokio::time::Instant::now();
            if ahead {
                // a pull that fails here is asked for again at the top
                next = self.pull(&consumer).await.ok().map(|b| (b, asked));
            }
            self.settle(handler, to_ack).await;
            if asked.elapsed() > PULL_AHEAD_HOLD
                && let Some((mut b, _)) = next.take()
            {
                // a slow commit: what the pull asked for ahead brought goes back for redelivery now rather
                // than risk async-nats ending the pull while it is handled
                release(&mut b).await;
            }
            if cancel.is_cancelled() {
                // what was delivered but not handled goes back now, not after the ack wait
                release(&mut batch).await;
                if let Some((mut b, _)) = next.take() {
                    release(&mut b).await;
                }
            }
            since_shrink += 1;
            if since_shrink >= 1000 {
                self.limiter.shrink();
                since_shrink = 0;
            }
        }
        Ok(())
    }

    /// Asks for a batch, waiting up to `fetch_wait` for it.
    async fn pull(
        &self,
        consumer: &jetstream::consumer::Consumer<pull::Config>,
    ) -> Result<pull::Batch, jetstream::consumer::pull::BatchError> {
        consumer
            .batch()
            .max_messages(self.batch_size())
            .expires(self.config.fetch_wait)
            .messages()
            .await
    }

    /// Asks for the messages waiting now (up to a batch), without waiting for more; with none waiting, for
    /// the first to come within `fetch_wait` (the expiry also ends it on the client's side if the server's
    /// answer is lost).
    async fn fetch(
        &self,
        consumer: &jetstream::consumer::Consumer<pull::Config>,
    ) -> Result<pull::Batch, jetstream::consumer::pull::BatchError> {
        consumer
            .fetch()
            .max_messages(self.batch_size())
            .expires(self.config.fetch_wait)
            .messages()
            .await
    }

    /// Commits the handler's work and acks `to_ack` (each the handler named in
    /// [`Handler::deferred_outcomes`] settled by its outcome instead), or naks them all for redelivery when
    /// the commit fails.
    async fn settle<T: Payload, H: Handler<T>>(
        &self,
        handler: &mut H,
        to_ack: Vec<jetstream::Message>,
    ) {
        if to_ack.is_empty() {
            return;
        }
        let c = &self.config;
        match handler.commit().await {
            Ok(()) => {
                let mut deferred: std::collections::HashMap<u64, Outcome> =
                    handler.deferred_outcomes().into_iter().collect();
                for m in &to_ack {
                    let (stream_seq, delivered) = m
                        .info()
                        .map(|i| (i.stream_sequence, i.delivered.max(1) as u64))
                        .unwrap_or((0, 1));
                    // 0: a message whose sequence could not be read; one named so stands for all of them
                    let outcome = match stream_seq {
                        0 => deferred.get(&0).cloned(),
                        seq => deferred.remove(&seq),
                    };
                    let outcome = outcome.unwrap_or(Outcome::Done);
                    self.settle_one(m, stream_seq, delivered, outcome).await;
                }
                deferred.remove(&0);
                if !deferred.is_empty() {
                    let named: Vec<u64> = deferred.into_keys().collect();
                    tracing::warn!(durable = %c.durable, ?named, "the handler named messages that were not in the batch it committed");
                }
            }
            Err(e) => {
                if e.retryable {
                    tracing::warn!(durable = %c.durable, reason = %e, count = to_ack.len(), "commit failed; redelivering the batch");
                } else {
                    tracing::error!(durable = %c.durable, reason = %e, count = to_ack.len(), "commit failed and will not pass by itself (the role needs attention); redelivering the batch");
                }
                for m in &to_ack {
                    let delivered = m.info().map(|i| i.delivered as u64).unwrap_or(1);
                    let _ = m
                        .ack_with(AckKind::Nak(Some(self.backoff(delivered))))
                        .await;
                    self.metrics.consumed(&c.durable, "retry");
                }
            }
        }
    }

    /// Handles one message; returns it if it should be acked after the batch commits.
    async fn process<T: Payload, H: Handler<T>>(
        &self,
        handler: &mut H,
        msg: jetstream::Message,
    ) -> Option<jetstream::Message> {
        let c = &self.config;
        if c.skip
            .iter()
            .any(|p| crate::topology::subject_matches(p, &msg.subject))
        {
            self.metrics.consumed(&c.durable, "skipped");
            let _ = msg.ack().await;
            return None;
        }
        let (ingest_time, stream_seq, delivered) = match msg.info() {
            Ok(i) => (i.published, i.stream_sequence, i.delivered.max(1) as u64),
            Err(_) => (Utc::now(), 0, 1),
        };
        let decoded: Result<Envelope<T>, DecodeError> = multipilot_schemas::decode_shared(
            crate::jetstream::header(&msg, HEADER_CONTENT_TYPE),
            crate::jetstream::header(&msg, HEADER_SCHEMA),
            &msg.payload,
            c.max_message_bytes,
        );
        let envelope = match decoded {
            Ok(e) => e,
            Err(e) => {
                self.dead_letter(&msg, stream_seq, delivered, e.reason(), &e.to_string())
                    .await;
                return None;
            }
        };
        // A publisher speaks only for the cluster its subject names (the bus' permissions pin agents to their
        // own subjects; this pins the payload to the subject).
        if let Some(owner) = subject::cluster_of(&msg.subject)
            && owner != envelope.cluster
        {
            let error = format!(
                "the envelope speaks for cluster {:?} but subject {} belongs to {owner:?}",
                envelope.cluster, msg.subject
            );
            self.dead_letter(&msg, stream_seq, delivered, "invalid", &error)
                .await;
            return None;
        }
        if let Decision::Later(wait) = self.limiter.check_key(&envelope.cluster) {
            self.metrics.consumed(&c.durable, "rate_limited");
            let _ = msg
                .ack_with(AckKind::Nak(Some(wait.max(Duration::from_millis(10)))))
                .await;
            return None;
        }
        self.limiter.until_ready().await;
        // counted when let in (not when the batch commits): what the input limit is judged by
        self.metrics.admitted(&c.durable);
        let received = Received {
            envelope,
            subject: msg.subject.to_string(),
            ingest_time,
            stream_seq,
            delivered,
            msg_id: crate::jetstream::header(&msg, HEADER_MSG_ID).map(str::to_string),
        };
        match handler.handle(received).await {
            Outcome::Done => Some(msg),
            outcome => {
                self.settle_one(&msg, stream_seq, delivered, outcome).await;
                None
            }
        }
    }

    /// Settles one message by its outcome: `Done` acks it, `Retry` naks it for redelivery with backoff,
    /// `Reject` dead-letters it.
    async fn settle_one(
        &self,
        msg: &jetstream::Message,
        stream_seq: u64,
        delivered: u64,
        outcome: Outcome,
    ) {
        let c = &self.config;
        match outcome {
            Outcome::Done => {
                if let Err(e) = msg.ack().await {
                    // The message will be redelivered after ack_wait; handlers are idempotent.
                    tracing::warn!(durable = %c.durable, error = %e, "ack failed");
                }
                self.metrics.consumed(&c.durable, "done");
            }
            Outcome::Retry(why) => {
                tracing::warn!(durable = %c.durable, stream_seq, delivered, reason = %why, "retrying message");
                self.metrics.consumed(&c.durable, "retry");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(self.backoff(delivered))))
                    .await;
            }
            Outcome::Reject { reason, error } => {
                self.dead_letter(msg, stream_seq, delivered, &reason, &error)
                    .await;
            }
        }
    }

    /// Publishes a dead letter and, once it is stored, terminates the original. If the dead letter can't be
    /// stored, the original is nak'ed instead: it is never dropped without a trace.
    async fn dead_letter(
        &self,
        msg: &jetstream::Message,
        stream_seq: u64,
        delivered: u64,
        reason: &str,
        error: &str,
    ) {
        let c = &self.config;
        let headers = msg
            .headers
            .as_ref()
            .map(|h| {
                h.iter()
                    .map(|(k, vs)| {
                        (
                            k.to_string(),
                            vs.iter().map(|v| v.as_str().to_string()).collect(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let letter = DeadLetter {
            stream: c.stream.clone(),
            consumer: c.durable.clone(),
            subject: msg.subject.to_string(),
            stream_seq,
            delivered,
            reason: reason.to_string(),
            error: error.to_string(),
            headers,
            payload_base64: base64::engine::general_purpose::STANDARD.encode(&msg.payload),
        };
        let cluster = subject::cluster_of(&msg.subject).unwrap_or_default();
        let env = Envelope::new(cluster, c.durable.clone(), Utc::now(), stream_seq, letter);
        let id =
            multipilot_schemas::stable_id(&["dlq", &c.stream, &c.durable, &stream_seq.to_string()]);
        match publish::publish_one(&self.js, subject::dlq(&c.stream), id, &env).await {
            Ok(_) => {
                tracing::warn!(durable = %c.durable, stream_seq, reason, error, "dead-lettered");
                self.metrics.dead_lettered(&c.durable, reason);
                self.metrics.consumed(&c.durable, "dead_letter");
                let _ = msg.ack_with(AckKind::Term).await;
            }
            Err(e) => {
                tracing::error!(durable = %c.durable, stream_seq, error = %e, "dead letter not stored; will retry");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(self.backoff(delivered))))
                    .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Pace;

    #[tokio::test]
    async fn the_pace_follows_what_the_last_pull_brought() {
        let at = tokio::time::Instant::now();
        let caught_up = Pace::CaughtUp { since: at };
        // a whole batch with more behind it (or nothing said): a backlog
        assert_eq!(Pace::after(500, 500, Some(7), at), Pace::Backlog);
        assert_eq!(Pace::after(500, 500, None, at), Pace::Backlog);
        // a whole batch with nothing behind it (a trickle fast enough to fill pulls): caught up
        assert_eq!(Pace::after(500, 500, Some(0), at), caught_up);
        // fewer than asked, or nothing: caught up, what arrives is taken together
        assert_eq!(Pace::after(500, 499, Some(3), at), caught_up);
        assert_eq!(Pace::after(500, 3, Some(0), at), caught_up);
        assert_eq!(Pace::after(500, 0, None, at), caught_up);
        // a batch of one (a tiny configured batch) that came whole with more behind is a backlog
        assert_eq!(Pace::after(1, 1, Some(2), at), Pace::Backlog);
    }
}
