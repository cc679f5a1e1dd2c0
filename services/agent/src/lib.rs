//! The MultiPilot agent: normalises each cluster it serves into the contract and publishes it through a
//! durable outbox — resources, events, probes, facts, metrics and heartbeats.
//!
//! Reads: the Kubernetes API of each cluster (kubeconfig contexts, or in-cluster). Writes (JetStream):
//! `fleet.state.>`, `fleet.resync.>`, `fleet.event.>`, `fleet.facts.>`, `fleet.hb.>`, `fleet.probe.>`,
//! `fleet.metrics.>`. With `release.enabled`, answers signed release commands on
//! `fleet.cmd.<cluster>.release` (request/reply).

pub mod agent;
pub mod cluster;
pub mod drain;
pub mod exposition;
pub mod kinds;
pub mod normalize;
pub mod outbox;
pub mod probes;
pub mod release;
pub mod scrape;
pub mod sink;
pub mod view;
