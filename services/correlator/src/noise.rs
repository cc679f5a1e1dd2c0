//! A realistic noisy event stream, for the dedup benchmark and its test: crashlooping pods, back-offs,
//! unschedulable pods, failing probes and mounts repeating with changing numbers, pod names and IPs, amid
//! the normal Scheduled/Pulled/Created/Started traffic of rollouts. Each event carries the problem it
//! belongs to, so a test can check that every distinct problem came through.

use chrono::{DateTime, Duration, Utc};
use multipilot_schemas::payload::{KubeEvent, ObjectRef, Severity};

/// A deterministic generator (xorshift; no dependency on a RNG crate's stream stability).
#[derive(Debug)]
pub struct Noise {
    state: u64,
    t: DateTime<Utc>,
    n: u64,
}

const CLUSTERS: &[&str] = &[
    "prod-eu-1",
    "prod-us-2",
    "staging-eu-1",
    "dev-ap-1",
    "prod-gpu-1",
];
const WORKLOADS: &[(&str, &str)] = &[
    ("shop", "web"),
    ("shop", "api"),
    ("search", "indexer"),
    ("payments", "ledger"),
    ("ml", "trainer"),
    ("identity", "auth"),
    ("catalog", "images"),
    ("monitoring", "prometheus"),
];

impl Noise {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Noise {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            t: DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default(),
            n: 0,
        }
    }

    fn next(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        x
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[(self.next() % v.len() as u64) as usize]
    }

    fn pod(&mut self, workload: &str) -> String {
        const A: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let hash = format!(
            "{:x}",
            0x5_0000_0000u64
                + (crate::mask::mask_name(workload).len() as u64 * 7919) % 0xf_ffff_ffff
        );
        let s: String = (0..5)
            .map(|_| A[(self.next() % A.len() as u64) as usize] as char)
            .collect();
        format!("{workload}-{}-{s}", &hash[..9.min(hash.len())])
    }

    /// The next event: (cluster, event, problem id or None for normal traffic).
    pub fn next_event(&mut self) -> (String, KubeEvent, Option<String>) {
        self.n += 1;
        let step = Duration::milliseconds((self.next() % 40) as i64);
        self.t += step;
        let cluster = self.pick(CLUSTERS).to_string();
        let (ns, wl) = *self.pick(WORKLOADS);
        let pod = self.pod(wl);
        let roll = self.next() % 100;
        let ip = format!("10.244.{}.{}", self.next() % 250, self.next() % 250);
        let secs = self.next() % 300;
        let (reason, message, warning, problem): (&str, String, bool, bool) = match roll {
            0..=19 => (
                "BackOff",
                format!(
                    "Back-off restarting failed container {wl} in pod {pod}_{ns}({:08x}-1c2d-4e5f-8a9b-{:012x})",
                    self.next() as u32,
                    self.next() & 0xffff_ffff_ffff
                ),
                true,
                true,
            ),
            20..=29 => (
                "Unhealthy",
                format!(
                    "Readiness probe failed: Get \"http://{ip}:8080/healthz\": context deadline exceeded (Client.Timeout exceeded while awaiting headers) after {secs}ms"
                ),
                true,
                true,
            ),
            30..=35 => (
                "FailedScheduling",
                format!(
                    "0/{} nodes are available: {} Insufficient cpu, {} node(s) had untolerated taint {{node-role.kubernetes.io/control-plane: }}. preemption: 0/{} nodes are available",
                    6 + secs % 4,
                    1 + secs % 3,
                    1,
                    6 + secs % 4
                ),
                true,
                true,
            ),
            36..=39 => (
                "FailedMount",
                format!(
                    "MountVolume.SetUp failed for volume \"pvc-{:08x}-aa\" : rpc error: code = DeadlineExceeded desc = context deadline exceeded after {secs}s",
                    self.next() as u32
                ),
                true,
                true,
            ),
            40..=42 => (
                "CrashLoopBackOff",
                format!(
                    "back-off {}m{}s restarting failed container={wl} pod={pod}",
                    secs / 60,
                    secs % 60
                ),
                true,
                true,
            ),
            43..=44 => (
                "OOMKilled",
                format!(
                    "Container {wl} was OOM-killed (memory limit {}Mi)",
                    256 + (secs % 4) * 128
                ),
                true,
                true,
            ),
            45..=59 => (
                "Scheduled",
                format!("Successfully assigned {ns}/{pod} to node-{}", secs % 12),
                false,
                false,
            ),
            60..=74 => (
                "Pulled",
                format!(
                    "Container image \"registry.example.com/{ns}/{wl}:1.{}.{}\" already present on machine and can be accessed by the pod",
                    secs % 5,
                    secs % 9
                ),
                false,
                false,
            ),
            75..=87 => ("Created", format!("Created container: {wl}"), false, false),
            _ => ("Started", format!("Started container {wl}"), false, false),
        };
        // normal traffic is about individual pods; its dedup id still groups it (that is the point)
        let problem = problem.then(|| format!("{cluster}/{ns}/{wl}/{reason}"));
        let e = KubeEvent {
            occurrence_id: format!("occ-{}", self.n),
            uid: format!("uid-{}", self.n),
            involved: ObjectRef {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: Some(ns.into()),
                name: pod,
                uid: None,
            },
            reason: reason.into(),
            message,
            event_type: if warning {
                "Warning".into()
            } else {
                "Normal".into()
            },
            severity: if warning {
                Severity::Warning
            } else {
                Severity::Info
            },
            count: 1,
            first_time: None,
            last_time: self.t,
            reporter: "kubelet".into(),
            action: None,
            source_api: "v1".into(),
        };
        (cluster, e, problem)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::dedup::Dedup;

    #[test]
    fn dedup_cuts_the_noisy_stream_by_95_percent_and_misses_no_problem() {
        let mut d = Dedup::new();
        let mut noise = Noise::new(7);
        let (mut total, mut passed) = (0u64, 0u64);
        let mut problems = BTreeSet::new();
        let mut problems_passed = BTreeSet::new();
        let mut per_problem: BTreeMap<String, u64> = BTreeMap::new();
        for _ in 0..50_000 {
            let (cluster, e, problem) = noise.next_event();
            total += 1;
            let (_, pass) = d.observe(&cluster, &e);
            if let Some(p) = &problem {
                problems.insert(p.clone());
                *per_problem.entry(p.clone()).or_default() += 1;
            }
            if pass.is_some() {
                passed += 1;
                if let Some(p) = problem {
                    problems_passed.insert(p);
                }
            }
        }
        let reduction = 1.0 - passed as f64 / total as f64;
        assert!(
            reduction >= 0.95,
            "passed {passed} of {total}: {:.1}% reduction",
            reduction * 100.0
        );
        let missed: Vec<_> = problems.difference(&problems_passed).collect();
        assert!(missed.is_empty(), "problems never passed on: {missed:?}");
        assert!(
            problems.len() > 100,
            "the stream holds many distinct problems ({})",
            problems.len()
        );
    }
}
