//! The MultiPilot fleet simulator: many virtual Kubernetes clusters, each behind its own loopback HTTPS
//! port, speaking the real Kubernetes API for what the agent and the release engine use (discovery per
//! version profile, list/watch with bookmarks and `410 Gone`, server-side apply with conflicts, dry-run,
//! finalizers, the scale subresource, health and metrics endpoints), with realistic churn, workloads whose
//! request metrics follow their images ([`traffic`]), and faults injected at runtime.
//!
//! It is test infrastructure: it never ships into a cluster.

pub mod api;
pub mod apply;
pub mod cluster;
pub mod event;
pub mod fleet;
pub mod metrics;
pub mod profile;
pub mod status;
pub mod store;
pub mod tls;
pub mod traffic;
pub mod world;

/// A stable 64-bit hash (FNV-1a) for deterministic names and values.
pub fn hash64(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
