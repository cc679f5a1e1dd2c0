//! The declarative definition of every stream and durable consumer, and its idempotent provisioning.
//!
//! The definition is `deploy/streams.yaml`, embedded at build time ([`Topology::embedded`]), so what the
//! services provision and what `deploy/` documents are one file.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use serde::{Deserialize, Deserializer};

/// The embedded `deploy/streams.yaml`.
pub const STREAMS_YAML: &str = include_str!("../../../deploy/streams.yaml");

/// Provisioning failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The definition file is not valid.
    #[error("invalid stream definitions: {0}")]
    Definition(String),
    /// JetStream refused a stream.
    #[error("provisioning stream {name}: {source}")]
    Stream {
        /// Stream name.
        name: String,
        /// Why.
        #[source]
        source: async_nats::jetstream::context::CreateStreamError,
    },
    /// JetStream refused a consumer.
    #[error("provisioning consumer {stream}/{durable}: {source}")]
    Consumer {
        /// Stream name.
        stream: String,
        /// Durable name.
        durable: String,
        /// Why.
        #[source]
        source: async_nats::jetstream::stream::ConsumerError,
    },
    /// A stream the consumer needs does not exist.
    #[error("stream {name} not found: {source}")]
    MissingStream {
        /// Stream name.
        name: String,
        /// Why.
        #[source]
        source: async_nats::jetstream::context::GetStreamError,
    },
}

/// One stream.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamDef {
    /// Name.
    pub name: String,
    /// What it holds.
    #[serde(default)]
    pub description: String,
    /// Subjects.
    pub subjects: Vec<String>,
    /// Keep only this many messages per subject (1 = last-value); 0 = unlimited.
    #[serde(default)]
    pub max_msgs_per_subject: i64,
    /// Age limit; 0 = unlimited.
    #[serde(default, with = "humantime_serde")]
    pub max_age: Duration,
    /// Size limit in bytes (accepts `8GiB`, `512MiB`); 0 = unlimited.
    #[serde(default, deserialize_with = "bytes")]
    pub max_bytes: i64,
    /// How long JetStream remembers `Nats-Msg-Id`s.
    #[serde(default = "two_minutes", with = "humantime_serde")]
    pub duplicate_window: Duration,
    /// Replicas (overridden by [`Topology::with_replicas`] for a cluster).
    #[serde(default = "one")]
    pub replicas: usize,
    /// Forbid deleting single messages.
    #[serde(default)]
    pub deny_delete: bool,
    /// Forbid purging.
    #[serde(default)]
    pub deny_purge: bool,
}

/// One durable pull consumer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerDef {
    /// The stream it reads.
    pub stream: String,
    /// Durable name.
    pub durable: String,
    /// Only these subjects (all of the stream's when empty).
    #[serde(default)]
    pub filter_subjects: Vec<String>,
    /// How long a delivered message may stay unacked before redelivery.
    #[serde(default = "thirty_seconds", with = "humantime_serde")]
    pub ack_wait: Duration,
    /// Most unacked messages outstanding.
    #[serde(default = "ten_thousand")]
    pub max_ack_pending: i64,
}

fn two_minutes() -> Duration {
    Duration::from_secs(120)
}
fn thirty_seconds() -> Duration {
    Duration::from_secs(30)
}
fn ten_thousand() -> i64 {
    10_000
}
fn one() -> usize {
    1
}

fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        N(i64),
        S(String),
    }
    match Raw::deserialize(d)? {
        Raw::N(n) => Ok(n),
        Raw::S(s) => {
            parse_bytes(&s).ok_or_else(|| serde::de::Error::custom(format!("invalid size {s:?}")))
        }
    }
}

/// Parses `123`, `64KiB`, `512MiB`, `8GiB`, `1TiB` (and the decimal `KB`/`MB`/`GB`).
pub fn parse_bytes(s: &str) -> Option<i64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: i64 = n.parse().ok()?;
    let mult: i64 = match unit.trim() {
        "" | "B" => 1,
        "KB" => 1000,
        "MB" => 1000 * 1000,
        "GB" => 1000 * 1000 * 1000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Every stream and durable consumer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Streams.
    pub streams: Vec<StreamDef>,
    /// Durable consumers.
    #[serde(default)]
    pub consumers: Vec<ConsumerDef>,
}

impl Topology {
    /// Parses a definition and checks it (unique names, consumers on known streams, no overlapping subjects).
    pub fn parse(yaml: &str) -> Result<Self, Error> {
        let t: Topology =
            serde_yaml::from_str(yaml).map_err(|e| Error::Definition(e.to_string()))?;
        let mut names = std::collections::HashSet::new();
        for s in &t.streams {
            if !names.insert(s.name.as_str()) {
                return Err(Error::Definition(format!(
                    "stream {} defined twice",
                    s.name
                )));
            }
            if !s.max_age.is_zero() && s.duplicate_window > s.max_age {
                return Err(Error::Definition(format!(
                    "stream {}: duplicate_window exceeds max_age",
                    s.name
                )));
            }
            if s.subjects.is_empty() {
                return Err(Error::Definition(format!(
                    "stream {} has no subjects",
                    s.name
                )));
            }
        }
        let mut durables = std::collections::HashSet::new();
        for c in &t.consumers {
            if !names.contains(c.stream.as_str()) {
                return Err(Error::Definition(format!(
                    "consumer {} reads unknown stream {}",
                    c.durable, c.stream
                )));
            }
            if !durables.insert((c.stream.as_str(), c.durable.as_str())) {
                return Err(Error::Definition(format!(
                    "consumer {}/{} defined twice",
                    c.stream, c.durable
                )));
            }
        }
        Ok(t)
    }

    /// The definition shipped in `deploy/streams.yaml`.
    pub fn embedded() -> Self {
        // The file is checked by a unit test; a broken file fails the build's tests, not production.
        Self::parse(STREAMS_YAML).unwrap_or_else(|e| panic!("deploy/streams.yaml is invalid: {e}"))
    }

    /// The same topology with every stream at `n` replicas (for a JetStream cluster).
    pub fn with_replicas(mut self, n: usize) -> Self {
        for s in &mut self.streams {
            s.replicas = n;
        }
        self
    }

    /// A stream by name.
    pub fn stream(&self, name: &str) -> Option<&StreamDef> {
        self.streams.iter().find(|s| s.name == name)
    }

    /// A consumer by stream and durable name.
    pub fn consumer(&self, stream: &str, durable: &str) -> Option<&ConsumerDef> {
        self.consumers
            .iter()
            .find(|c| c.stream == stream && c.durable == durable)
    }

    /// The stream whose subjects match a concrete subject.
    pub fn stream_for_subject(&self, subject: &str) -> Option<&StreamDef> {
        self.streams
            .iter()
            .find(|s| s.subjects.iter().any(|p| subject_matches(p, subject)))
    }

    /// Creates every stream and consumer, or updates it in place: running it twice changes nothing.
    pub async fn provision(&self, js: &jetstream::Context) -> Result<(), Error> {
        for s in &self.streams {
            js.create_or_update_stream(s.to_config())
                .await
                .map_err(|source| Error::Stream {
                    name: s.name.clone(),
                    source,
                })?;
        }
        for c in &self.consumers {
            let stream = js
                .get_stream(&c.stream)
                .await
                .map_err(|source| Error::MissingStream {
                    name: c.stream.clone(),
                    source,
                })?;
            stream
                .create_consumer(c.to_config())
                .await
                .map_err(|source| Error::Consumer {
                    stream: c.stream.clone(),
                    durable: c.durable.clone(),
                    source,
                })?;
        }
        Ok(())
    }
}

impl StreamDef {
    /// The JetStream configuration.
    pub fn to_config(&self) -> stream::Config {
        stream::Config {
            name: self.name.clone(),
            description: (!self.description.is_empty()).then(|| self.description.clone()),
            subjects: self.subjects.clone(),
            max_messages_per_subject: if self.max_msgs_per_subject == 0 {
                -1
            } else {
                self.max_msgs_per_subject
            },
            max_age: self.max_age,
            max_bytes: if self.max_bytes == 0 {
                -1
            } else {
                self.max_bytes
            },
            max_messages: -1,
            duplicate_window: self.duplicate_window,
            num_replicas: self.replicas,
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::Limits,
            discard: stream::DiscardPolicy::Old,
            deny_delete: self.deny_delete,
            deny_purge: self.deny_purge,
            allow_direct: true,
            allow_rollup: self.max_msgs_per_subject == 1,
            ..Default::default()
        }
    }
}

impl ConsumerDef {
    /// The JetStream configuration.
    pub fn to_config(&self) -> consumer::pull::Config {
        consumer::pull::Config {
            durable_name: Some(self.durable.clone()),
            filter_subjects: self.filter_subjects.clone(),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            // Unlimited: the runner decides when a message is hopeless (dead-letter), not a delivery count,
            // which rate-limit naks would also raise.
            max_deliver: -1,
            max_ack_pending: self.max_ack_pending,
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        }
    }
}

/// NATS subject matching: `*` matches one token, `>` the rest (at least one token).
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contracts_stream_names_and_families_are_the_topologys() {
        use multipilot_schemas::{streams::name, subject};
        let t = Topology::embedded();
        let names: Vec<&str> = t.streams.iter().map(|s| s.name.as_str()).collect();
        let mut ours = name::ALL.to_vec();
        ours.sort();
        let mut theirs = names.clone();
        theirs.sort();
        assert_eq!(ours, theirs);
        // every family is stored by the stream the contract says
        let stores = |stream: &str, family: subject::Family| {
            t.streams.iter().any(|s| {
                s.name == stream
                    && s.subjects.iter().any(|f| {
                        f == &family.all() || f.starts_with(&format!("{}.", family.prefix()))
                    })
            })
        };
        for (stream, family) in [
            (name::STATE, subject::STATE),
            (name::STATE, subject::RESYNC),
            (name::FACTS, subject::FACTS),
            (name::HEALTH, subject::HEARTBEAT),
            (name::HEALTH, subject::PROBE),
            (name::EVENTS, subject::EVENT),
            (name::INCIDENTS, subject::DIGEST),
            (name::METRICS, subject::METRICS),
            (name::INCIDENTS, subject::INCIDENT),
            (name::INCIDENTS, subject::FLEET_INCIDENT),
            (name::INCIDENTS, subject::COMPLIANCE),
            (name::ALERTS, subject::ALERT),
            (name::RELEASE, subject::RELEASE),
            (name::AUDIT, subject::AUDIT),
            (name::DLQ, subject::DLQ),
        ] {
            assert!(
                stores(stream, family),
                "{stream} does not store {}",
                family.all()
            );
        }
    }

    #[test]
    fn shipped_definition_is_valid_and_covers_every_subject_class() {
        let t = Topology::embedded();
        for (subject, stream) in [
            (
                multipilot_schemas::subject::state("c", "Pod", Some("ns"), "p"),
                "FLEET_STATE",
            ),
            (
                multipilot_schemas::subject::resync("c", "Pod"),
                "FLEET_STATE",
            ),
            (multipilot_schemas::subject::facts("c"), "FLEET_FACTS"),
            (multipilot_schemas::subject::heartbeat("c"), "FLEET_HEALTH"),
            (
                multipilot_schemas::subject::probe("c", "etcd"),
                "FLEET_HEALTH",
            ),
            (
                multipilot_schemas::subject::event("c", "Pod"),
                "FLEET_EVENTS",
            ),
            (multipilot_schemas::subject::metrics("c"), "FLEET_METRICS"),
            (
                multipilot_schemas::subject::incident("c", "dns-failure"),
                "FLEET_INCIDENTS",
            ),
            (multipilot_schemas::subject::alert("oncall"), "FLEET_ALERTS"),
            (
                multipilot_schemas::subject::release("r", "plan"),
                "FLEET_RELEASE",
            ),
            (
                multipilot_schemas::subject::audit("release", "release.apply"),
                "FLEET_AUDIT",
            ),
            (
                multipilot_schemas::subject::dlq("FLEET_EVENTS"),
                "FLEET_DLQ",
            ),
        ] {
            assert_eq!(
                t.stream_for_subject(&subject).map(|s| s.name.as_str()),
                Some(stream),
                "{subject}"
            );
        }
        // Commands are request/reply, never stored.
        assert!(
            t.stream_for_subject(&multipilot_schemas::subject::command("c", "release"))
                .is_none()
        );
        assert_eq!(
            t.stream("FLEET_METRICS").map(|s| s.max_bytes),
            Some(8 << 30)
        );
    }

    #[test]
    fn subject_matching() {
        assert!(subject_matches("fleet.state.>", "fleet.state.a.b"));
        assert!(!subject_matches("fleet.state.>", "fleet.state"));
        assert!(subject_matches("fleet.*.x", "fleet.a.x"));
        assert!(!subject_matches("fleet.*.x", "fleet.a.y"));
    }

    #[test]
    fn bad_definitions_are_refused() {
        assert!(
            Topology::parse("streams: [{name: A, subjects: [a]}, {name: A, subjects: [b]}]")
                .is_err()
        );
        assert!(
            Topology::parse(
                "streams: [{name: A, subjects: [a]}]\nconsumers: [{stream: B, durable: x}]"
            )
            .is_err()
        );
        assert!(Topology::parse("streams: [{name: A, subjects: [a], bogus: 1}]").is_err());
        assert_eq!(parse_bytes("512MiB"), Some(512 << 20));
        assert_eq!(parse_bytes("12 parsecs"), None);
    }
}
