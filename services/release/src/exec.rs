//! Sending signed commands to a cluster's agent (`fleet.cmd.<cluster>.release`, request/reply) and reading
//! its `ReleaseResult`. A command that gets no answer is sent again with the same `command_id` and a fresh
//! nonce (and so a fresh signature): the agent executes a command id once and answers retries from its
//! stored result.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use multipilot_schemas::payload::{ReleaseAction, ReleaseCommand, ReleaseResult};
use multipilot_schemas::{Envelope, Payload, subject};
use serde_json::Value;

use crate::signer::Signer;

/// Why no result came back.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// No agent answered (no responders, or timeouts on every attempt). Retryable later.
    #[error("no answer from the agent of cluster {cluster} after {attempts} attempts: {last}")]
    NoAnswer {
        /// Cluster.
        cluster: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// The answer was not a `ReleaseResult`.
    #[error("cluster {cluster}: undecodable answer: {reason}")]
    Decode {
        /// Cluster.
        cluster: String,
        /// Why.
        reason: String,
    },
    /// The command couldn't be signed.
    #[error("signing: {0}")]
    Sign(String),
    /// The command couldn't be encoded.
    #[error("encoding the command: {0}")]
    Encode(String),
    /// One attempt got no answer (no responders, a timeout): worth another.
    #[error("{0}")]
    Unanswered(String),
}

/// How commands are sent.
#[derive(Debug, Clone)]
pub struct Sender {
    /// NATS client.
    pub nats: async_nats::Client,
    /// The signing key.
    pub signer: Arc<Signer>,
    /// Wait per attempt.
    pub timeout: Duration,
    /// Attempts per command.
    pub attempts: u32,
    /// Command validity.
    pub validity: Duration,
    /// `source` of the envelopes.
    pub source: String,
}

/// What to send (the fields a caller chooses).
#[derive(Debug, Clone)]
pub struct Command {
    /// Stable id: retries and re-sends of the same step reuse it.
    pub id: String,
    /// Release name.
    pub release: String,
    /// Target cluster.
    pub cluster: String,
    /// Action.
    pub action: ReleaseAction,
    /// Field manager.
    pub field_manager: String,
    /// Force conflicts.
    pub force: bool,
    /// Objects.
    pub objects: Vec<Value>,
}

impl Sender {
    /// A signed, enveloped command with a fresh nonce, ready to send.
    pub fn build(&self, c: &Command) -> Result<Envelope<ReleaseCommand>, Error> {
        let now = Utc::now();
        let nonce: [u8; 16] = rand::random();
        let mut cmd = ReleaseCommand {
            command_id: c.id.clone(),
            release: c.release.clone(),
            cluster: c.cluster.clone(),
            action: c.action,
            field_manager: c.field_manager.clone(),
            force: c.force,
            objects: c.objects.clone(),
            issued_at: now,
            expires_at: now
                + chrono::Duration::from_std(self.validity).unwrap_or(chrono::Duration::minutes(5)),
            nonce: hex::encode(nonce),
            key_id: String::new(),
            signature: String::new(),
        };
        self.signer
            .sign(&mut cmd)
            .map_err(|e| Error::Sign(e.to_string()))?;
        Ok(Envelope {
            schema: ReleaseCommand::SCHEMA.into(),
            version: ReleaseCommand::VERSION,
            cluster: c.cluster.clone(),
            source: self.source.clone(),
            cluster_time: now,
            agent_time: now,
            seq: 0,
            payload: cmd,
        })
    }

    /// Sends an already built envelope once and decodes the answer.
    pub async fn send_envelope(
        &self,
        env: &Envelope<ReleaseCommand>,
    ) -> Result<ReleaseResult, Error> {
        let body = multipilot_schemas::encode(env).map_err(|e| Error::Encode(e.to_string()))?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            multipilot_schemas::HEADER_CONTENT_TYPE,
            multipilot_schemas::CONTENT_TYPE_MSGPACK,
        );
        headers.insert(
            multipilot_schemas::HEADER_SCHEMA,
            ReleaseCommand::schema_header().as_str(),
        );
        let req = async_nats::Request::new()
            .payload(body.into())
            .headers(headers)
            .timeout(Some(self.timeout));
        let msg = self
            .nats
            .send_request(subject::command(&env.payload.cluster, "release"), req)
            .await
            .map_err(|e| Error::Unanswered(e.to_string()))?;
        let h = msg.headers.as_ref();
        let env: Envelope<ReleaseResult> = multipilot_schemas::decode(
            h.and_then(|h| h.get(multipilot_schemas::HEADER_CONTENT_TYPE))
                .map(|v| v.as_str()),
            h.and_then(|h| h.get(multipilot_schemas::HEADER_SCHEMA))
                .map(|v| v.as_str()),
            &msg.payload,
            64 << 20,
        )
        .map_err(|e| Error::Decode {
            cluster: env.payload.cluster.clone(),
            reason: format!("decode: {e}"),
        })?;
        Ok(env.payload)
    }

    /// Sends a command, retrying (same id, fresh nonce) when no answer comes.
    pub async fn send(&self, c: &Command) -> Result<ReleaseResult, Error> {
        let mut last = String::new();
        for attempt in 1..=self.attempts {
            let env = self.build(c)?;
            match self.send_envelope(&env).await {
                Ok(r) => return Ok(r),
                Err(Error::Unanswered(e)) => {
                    tracing::warn!(cluster = %c.cluster, command = %c.id, attempt, error = %e, "no answer to a release command");
                    last = e;
                }
                // neither a new nonce nor waiting makes it encodable or decodable
                Err(e) => return Err(e),
            }
            if attempt < self.attempts {
                tokio::time::sleep(Duration::from_millis(500 * u64::from(attempt))).await;
            }
        }
        Err(Error::NoAnswer {
            cluster: c.cluster.clone(),
            attempts: self.attempts,
            last,
        })
    }
}
