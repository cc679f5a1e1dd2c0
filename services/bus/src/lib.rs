//! NATS JetStream plumbing shared by every MultiPilot service.
//!
//! - [`connect`]: connect with retry and any of NATS' auth methods (user/password, token, nkey, creds file,
//!   TLS); credentials never reach a log.
//! - [`topology`]: the declarative definition of every stream and durable consumer (`deploy/streams.yaml`,
//!   embedded here) and its idempotent provisioning.
//! - [`publish`]: a publisher that keeps a bounded window of async publish acks in flight and sets
//!   `Nats-Msg-Id` so JetStream drops replays.
//! - [`consume`]: the consumer runner: pull in batches, ack after the handler's work is durable, nak with
//!   backoff on retryable errors, dead-letter what can't be decoded or is invalid, rate-limit per key.
//! - [`follow`]: a stream as a picture of now: the last message per subject (or everything kept), then
//!   live, through an ordered consumer created again (and resumed) when lost.
//! - [`jetstream`]: durables per partition (and recreated to replay), an ordered history reader, typed
//!   not-found checks, header and decoding helpers.
//! - [`request`]: scatter-gather request/reply to every instance of a partitioned role.
//! - [`limit`]: the keyed rate limiter (governor) the runner uses.
//! - [`metrics`]: the bus' Prometheus metrics.
//! - [`kv`]: replicated key-value buckets for state that can't be rebuilt from the streams.

pub mod connect;
pub mod consume;
pub mod follow;
pub mod jetstream;
pub mod kv;
pub mod limit;
pub mod metrics;
pub mod publish;
pub mod request;
pub mod topology;

pub use async_nats;
