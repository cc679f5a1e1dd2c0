//! Where collectors put what they produce: the envelope is stamped (cluster, source, cluster_time,
//! agent_time, seq), encoded once and accepted into the cluster's outbox.

use chrono::{DateTime, Utc};
use multipilot_schemas::{Envelope, Payload};
use serde::Serialize;

use crate::outbox::{self, Class, Item, Outbox, PushError};

/// One cluster's sink.
#[derive(Debug, Clone)]
pub struct Sink {
    cluster: String,
    source: String,
    outbox: Outbox,
}

/// What to emit besides the payload.
#[derive(Debug, Clone)]
pub struct Meta {
    /// Drain class.
    pub class: Class,
    /// Subject.
    pub subject: String,
    /// `Nats-Msg-Id` (a stable id of what the message is).
    pub msg_id: String,
    /// Collapse key: a newer message with the same key replaces this one while both wait.
    pub collapse: Option<String>,
    /// When it happened, in the cluster's clock.
    pub cluster_time: DateTime<Utc>,
}

impl Sink {
    /// A sink for `cluster`.
    pub fn new(cluster: &str, outbox: Outbox) -> Self {
        Sink {
            cluster: cluster.to_string(),
            source: format!("agent/{cluster}"),
            outbox,
        }
    }

    /// The cluster.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The outbox.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Accepts a payload into the outbox; returns its seq. Errors are disk errors (logged by the caller).
    pub fn emit<T: Payload + Serialize>(
        &self,
        meta: Meta,
        payload: T,
    ) -> Result<u64, outbox::Error> {
        let (cluster, source) = (self.cluster.clone(), self.source.clone());
        let res = self.outbox.push(meta.class, |seq| {
            let env = Envelope::new(cluster, source, meta.cluster_time, seq, payload);
            let body = multipilot_schemas::encode(&env)?;
            Ok::<_, multipilot_schemas::EncodeError>(Item {
                subject: meta.subject,
                msg_id: meta.msg_id,
                schema: T::schema_header(),
                body,
                collapse: meta.collapse,
            })
        });
        match res {
            Ok(seq) => Ok(seq),
            Err(PushError::Outbox(e)) => Err(e),
            Err(PushError::Build(e)) => Err(outbox::Error::Corrupt {
                key: Vec::new(),
                reason: format!("encoding {}: {e}", T::SCHEMA),
            }),
        }
    }
}
