//! The health probes every agent runs, by the name that is the last token of `fleet.probe.<cluster>.<probe>`
//! and the `probe` field of [`crate::payload::ProbeResult`]. The correlator's rules and the console's health
//! view key on these names.

/// The probes, by name.
pub const PROBES: &[&str] = &[
    "apiserver",
    "etcd",
    "scheduler",
    "controller-manager",
    "nodes",
    "cni",
    "coredns",
    "gpu-device-plugin",
    "certificates",
    "finalizers",
    "external-ips",
    "deprecated-apis",
];
