//! Drains an outbox into JetStream: highest priority first, at a rate limited with governor (shared by
//! every cluster of the process), with a random pause after a reconnect so a fleet of agents coming back
//! together doesn't arrive at once. A message leaves the outbox only when JetStream confirms it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::stream::DirectGetErrorKind;
use governor::DefaultDirectRateLimiter;
use multipilot_bus::metrics::BusMetrics;
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::outbox::{Class, Outbox};

/// Drain settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Messages per batch read from the outbox.
    pub batch: usize,
    /// Acks in flight.
    pub window: usize,
    /// Longest pause after a reconnect before draining (a random share of it is taken).
    pub reconnect_jitter: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            batch: 512,
            window: 256,
            reconnect_jitter: Duration::from_secs(2),
        }
    }
}

/// Runs until cancelled; on cancellation tries to send what waits for up to `grace`.
pub async fn run(
    outbox: Outbox,
    client: async_nats::Client,
    limiter: Arc<DefaultDirectRateLimiter>,
    metrics: BusMetrics,
    settings: Settings,
    cancel: CancellationToken,
) {
    let js = async_nats::jetstream::new(client.clone());
    let mut publisher: Publisher<(Class, u64)> =
        Publisher::new(js.clone(), settings.window, metrics);
    let mut was_down = false;
    let mut backoff = Duration::from_millis(200);
    let cluster = outbox.cluster().to_string();
    let mut grace_deadline: Option<tokio::time::Instant> = None;
    let mut ledger = Ledger::default();
    loop {
        if cancel.is_cancelled() && grace_deadline.is_none() {
            grace_deadline = Some(tokio::time::Instant::now() + Duration::from_secs(5));
        }
        if let Some(d) = grace_deadline
            && (tokio::time::Instant::now() >= d || outbox.counters().depth == 0)
        {
            return;
        }
        if client.connection_state() != State::Connected {
            was_down = true;
            // failures while the server was away say nothing about it once it is back
            backoff = Duration::from_millis(200);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = cancel.cancelled(), if grace_deadline.is_none() => {}
            }
            continue;
        }
        if was_down {
            was_down = false;
            let pause = rand::rng().random_range(Duration::ZERO..=settings.reconnect_jitter);
            tracing::info!(%cluster, pause_ms = pause.as_millis() as u64, depth = outbox.counters().depth, "NATS is back; draining the outbox");
            tokio::time::sleep(pause).await;
        }
        let batch = match outbox.peek(settings.batch) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(%cluster, error = %e, "outbox unreadable");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if batch.is_empty() {
            if grace_deadline.is_some() {
                return;
            }
            tokio::select! {
                _ = outbox.wait(Duration::from_millis(500)) => {}
                _ = cancel.cancelled() => {}
            }
            continue;
        }
        let mut completions = Vec::new();
        for (class, seq, item) in batch {
            if let Some(&first) = ledger.in_flight.get(&item.msg_id)
                && first != seq
            {
                // the same content is in flight under an earlier seq, which is sent until JetStream has
                // it: this seq can only ever be a duplicate of another, and is counted as one unsent
                if let Err(e) = outbox.remove_duplicate(class, seq) {
                    tracing::error!(%cluster, error = %e, "cannot remove a duplicate from the outbox");
                }
                continue;
            }
            ledger.in_flight.insert(item.msg_id.clone(), seq);
            ledger
                .by_seq
                .insert(seq, (item.msg_id.clone(), item.subject.clone()));
            limiter.until_ready().await;
            let msg = Outgoing::raw(item.subject, item.msg_id, &item.schema, item.body.into());
            completions.extend(publisher.send((class, seq), msg).await);
        }
        completions.extend(publisher.flush().await);
        let mut failed = 0usize;
        for c in completions {
            match c {
                Completion::Stored {
                    key: (class, seq),
                    duplicate,
                    stream,
                    sequence,
                } => {
                    // A duplicate is this very message re-sent after a lost ack (nothing missing), or
                    // the same content stored under another seq, which leaves a gap in the sequence and is
                    // counted.
                    let (msg_id, subject) = ledger.by_seq.remove(&seq).unwrap_or_default();
                    if ledger.in_flight.get(&msg_id) == Some(&seq) {
                        ledger.in_flight.remove(&msg_id);
                    }
                    let resent = ledger.unconfirmed.remove(&seq);
                    let other_seq = if !duplicate {
                        ledger.remember(msg_id, seq, sequence);
                        false
                    } else if let Some(&(s, _)) =
                        ledger.stored.get(&msg_id).filter(|(_, at)| *at == sequence)
                    {
                        // stored and confirmed in this process: exact
                        s != seq
                    } else if !resent && !outbox.carried_over(seq) {
                        // never sent before: the stored one is another seq's
                        true
                    } else {
                        // sent before (unconfirmed) or by a process before this one: the stored message
                        // says, while it is the last of its subject
                        stored_seq(&js, &stream, &subject, sequence)
                            .await
                            .is_some_and(|s| s != seq)
                    };
                    if duplicate {
                        tracing::debug!(%cluster, seq, stream_seq = sequence, resent, other_seq, "duplicate");
                    }
                    let removed = if other_seq {
                        outbox.remove_duplicate(class, seq)
                    } else {
                        outbox.remove(class, seq)
                    };
                    if let Err(e) = removed {
                        tracing::error!(%cluster, error = %e, "cannot remove a confirmed message from the outbox");
                    }
                }
                Completion::Failed {
                    key: (_, seq),
                    error,
                } => {
                    ledger.unconfirmed.insert(seq);
                    failed += 1;
                    if failed == 1 {
                        tracing::warn!(%cluster, %error, "publish not confirmed; will retry");
                    }
                }
            }
        }
        if failed > 0 {
            tokio::time::sleep(backoff).await;
            // short: heartbeats and probes wait behind this pause, and must be out within seconds of a
            // reconnect (JetStream may answer a few publishes with errors while it recovers)
            backoff = (backoff * 2).min(Duration::from_secs(2));
        } else {
            backoff = Duration::from_millis(200);
        }
    }
}

/// What a drain knows of the messages it sends, to tell a duplicate of a message itself from one of
/// another seq without reading the stream by sequence (an agent may only read the last message of its
/// own subjects).
#[derive(Default)]
struct Ledger {
    /// Seqs whose last send was not confirmed: that send may have been stored (a lost ack).
    unconfirmed: HashSet<u64>,
    /// Msg-Id → the seq in flight with it (one content is in flight under one seq at a time).
    in_flight: HashMap<String, u64>,
    /// Seq → its Msg-Id and subject, while in flight.
    by_seq: HashMap<u64, (String, String)>,
    /// Msg-Id → (seq, stream sequence) of what this process stored lately, the oldest forgotten first.
    stored: HashMap<String, (u64, u64)>,
    stored_order: VecDeque<String>,
}

impl Ledger {
    /// Stores remembered, per cluster: enough for the duplicate window at a few messages per second.
    const STORED_KEPT: usize = 20_000;

    fn remember(&mut self, msg_id: String, seq: u64, stream_seq: u64) {
        if self
            .stored
            .insert(msg_id.clone(), (seq, stream_seq))
            .is_none()
        {
            self.stored_order.push_back(msg_id);
        }
        while self.stored_order.len() > Self::STORED_KEPT {
            if let Some(old) = self.stored_order.pop_front() {
                self.stored.remove(&old);
            }
        }
    }
}

/// The envelope `seq` of the message stored at `sequence` under `subject`, if it is still the last one
/// there. Read with a direct get scoped by subject (`$JS.API.DIRECT.GET.<stream>.<subject>`): an agent's
/// user may read back its own subjects and nothing else, and that request can only return the last
/// message of a subject. With partitions (deploy/nats/partitions.conf) the stored subject has one more
/// token. `None` when the stored message is no longer the last of its subject: the caller then takes it
/// for this very message (a newer one on the subject came after it, as after a lost ack and a retry).
async fn stored_seq(
    js: &async_nats::jetstream::Context,
    stream: &str,
    subject: &str,
    sequence: u64,
) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct SeqOnly {
        seq: u64,
    }
    let stream = js.get_stream_no_info(stream).await.ok()?;
    let msg = match stream.direct_get_last_for_subject(subject).await {
        Ok(m) => m,
        Err(e) if e.kind() == DirectGetErrorKind::NotFound => stream
            .direct_get_last_for_subject(format!("{subject}.*"))
            .await
            .ok()?,
        Err(_) => return None,
    };
    if msg.sequence != sequence {
        return None;
    }
    rmp_serde::from_slice::<SeqOnly>(&msg.payload)
        .ok()
        .map(|s| s.seq)
}
