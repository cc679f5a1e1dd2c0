//! Scatter-gather request/reply: one request to every instance of a partitioned role, the answers gathered
//! until as many came as the first one's `Multipilot-Partitions` header says (or the deadline passes).

use std::time::Duration;

use futures::StreamExt;
use multipilot_schemas::control::HEADER_PARTITIONS;

/// Why a gathered request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request could not be sent.
    #[error("sending on {subject}: {reason}")]
    Send {
        /// Subject.
        subject: String,
        /// Why.
        reason: String,
    },
    /// Nobody answered before the deadline.
    #[error("no one answered on {subject} within {timeout:?}")]
    NoAnswer {
        /// Subject.
        subject: String,
        /// The deadline.
        timeout: Duration,
    },
}

impl Error {
    /// Whether trying again later may succeed (always: the responder may be starting).
    pub fn is_retryable(&self) -> bool {
        true
    }
}

/// What came back.
#[derive(Debug, Clone, Default)]
pub struct Answers {
    /// The answers' bodies, in arrival order.
    pub bodies: Vec<bytes::Bytes>,
    /// How many instances said they answer (the partitions header), when any said.
    pub expected: Option<usize>,
}

impl Answers {
    /// Whether fewer instances answered than said they would.
    pub fn partial(&self) -> bool {
        self.expected.is_some_and(|n| self.bodies.len() < n)
    }
}

/// Sends `body` on `subject` and gathers the answers until every partition answered, `done` says the
/// latest answer settles it, or `timeout` passes.
pub async fn gather(
    client: &async_nats::Client,
    subject: &str,
    body: bytes::Bytes,
    timeout: Duration,
    mut done: impl FnMut(&[u8]) -> bool,
) -> Result<Answers, Error> {
    let send = |e: &dyn std::fmt::Display| Error::Send {
        subject: subject.to_string(),
        reason: e.to_string(),
    };
    let inbox = client.new_inbox();
    let mut sub = client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| send(&e))?;
    client
        .publish_with_reply(subject.to_string(), inbox, body)
        .await
        .map_err(|e| send(&e))?;
    client.flush().await.map_err(|e| send(&e))?;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut out = Answers::default();
    while out.expected.is_none_or(|n| out.bodies.len() < n) {
        let Ok(Some(m)) = tokio::time::timeout_at(deadline, sub.next()).await else {
            break;
        };
        // the server's "no responders" (an empty status message): no instance listens, and none will
        // answer (a hub starting or stopped), which is not an answer to decode
        if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            break;
        }
        if out.expected.is_none() {
            out.expected = m
                .headers
                .as_ref()
                .and_then(|h| h.get(HEADER_PARTITIONS))
                .and_then(|v| v.as_str().parse().ok());
        }
        let settled = done(&m.payload);
        out.bodies.push(m.payload);
        if settled {
            break;
        }
    }
    if out.bodies.is_empty() {
        return Err(Error::NoAnswer {
            subject: subject.to_string(),
            timeout,
        });
    }
    Ok(out)
}

/// Why a typed request failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Sending or waiting failed.
    #[error(transparent)]
    Gather(#[from] Error),
    /// An answer was not what the subject's contract says.
    #[error("an answer on {subject} is not {expected}: {reason}")]
    Decode {
        /// Subject.
        subject: String,
        /// What was expected.
        expected: &'static str,
        /// Why.
        reason: String,
    },
}

/// Asks every instance answering `subject` (one per partition) for a JSON array and concatenates the
/// arrays; a partial answer (fewer instances than announced) is logged.
pub async fn gather_arrays<T: serde::de::DeserializeOwned>(
    client: &async_nats::Client,
    subject: &str,
    body: bytes::Bytes,
    timeout: Duration,
) -> Result<Vec<T>, CallError> {
    let answers = gather(client, subject, body, timeout, |_| false).await?;
    if answers.partial() {
        tracing::warn!(
            subject,
            answers = answers.bodies.len(),
            expected = answers.expected,
            "not every partition answered; the list is partial"
        );
    }
    let mut out = Vec::new();
    for b in &answers.bodies {
        let items: Vec<T> = serde_json::from_slice(b).map_err(|e| CallError::Decode {
            subject: subject.to_string(),
            expected: "a JSON array",
            reason: e.to_string(),
        })?;
        out.extend(items);
    }
    Ok(out)
}

/// Sends an incident command to every correlator instance and returns the answer of the one that owns the
/// incident (or `not-found` once every partition said so).
pub async fn incident_command(
    client: &async_nats::Client,
    cmd: &multipilot_schemas::control::IncidentCommand,
    timeout: Duration,
) -> Result<multipilot_schemas::control::CommandReply, CallError> {
    use multipilot_schemas::control::{COMMAND_INCIDENT, CommandOutcome, CommandReply};
    let decode = |b: &[u8]| serde_json::from_slice::<CommandReply>(b);
    let body = serde_json::to_vec(cmd).map_err(|e| CallError::Decode {
        subject: COMMAND_INCIDENT.into(),
        expected: "an encodable command",
        reason: e.to_string(),
    })?;
    let answers = gather(client, COMMAND_INCIDENT, body.into(), timeout, |b| {
        decode(b).is_ok_and(|r| r.outcome != CommandOutcome::NotFound)
    })
    .await?;
    let last = answers.bodies.last().ok_or_else(|| Error::NoAnswer {
        subject: COMMAND_INCIDENT.into(),
        timeout,
    })?;
    decode(last).map_err(|e| CallError::Decode {
        subject: COMMAND_INCIDENT.into(),
        expected: "a command reply",
        reason: e.to_string(),
    })
}
