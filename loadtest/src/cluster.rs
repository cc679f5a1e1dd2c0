//! One virtual cluster: its version profile, store, PKI, clock, faults and request statistics.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use crate::profile::Profile;
use crate::store::Store;
use crate::tls::Pki;

/// Apiserver overload: added latency and a share of rejected requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Overload {
    /// Added latency per request.
    pub latency_ms: u64,
    /// Share of requests answered 429 or 500 (half each).
    pub error_rate: f64,
}

/// The faults switched on in a cluster (what `GET /clusters` shows).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Faults {
    /// Overloaded apiserver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overload: Option<Overload>,
    /// Connections are dropped as soon as they are accepted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unreachable: bool,
    /// The cluster's clock runs this many seconds ahead (negative: behind).
    #[serde(skip_serializing_if = "is_zero")]
    pub clock_skew_s: i64,
    /// The serving certificate expires in this many days.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_expiry_days: Option<i64>,
    /// This node is NotReady.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_not_ready: Option<String>,
    /// CoreDNS has no ready pods and no endpoints.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub coredns_down: bool,
    /// Half of the CNI daemonset is not ready.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cni_down: bool,
    /// The GPU device plugin was upgraded past the nodes' driver: GPU pods stuck in ContainerCreating.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub gpu_mismatch: bool,
    /// A ConfigMap stuck terminating behind a finalizer nobody removes: `namespace/name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stuck_finalizer: Option<String>,
    /// A Service with `spec.externalIPs`: `namespace/name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_ips: Option<String>,
    /// The ingress controller's ConfigMap differs from the shipped one: `key=value`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingress_setting: Option<String>,
    /// `/readyz/etcd` fails.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub etcd_unhealthy: bool,
    /// The kube-scheduler lease is no longer renewed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub scheduler_down: bool,
    /// The kube-controller-manager lease is no longer renewed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub controller_manager_down: bool,
    /// An object last applied with a deprecated API version: `kind/namespace/name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deprecated_api: Option<String>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// Request counters, exported as `apiserver_request_total` and used by the benchmark.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests by (verb, resource, code).
    pub requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    /// Watches open now.
    pub watches: AtomicU64,
    /// Deprecated API versions requested: (group, version, resource, removed_release) → count.
    pub deprecated: Mutex<BTreeMap<(String, String, String, String), u64>>,
    /// Request latency by verb, exported as `apiserver_request_duration_seconds`.
    pub latency: Mutex<BTreeMap<&'static str, Latency>>,
}

/// The upper bounds of the apiserver's request latency histogram (a subset of the real one's).
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 5.0, 10.0,
];

/// One verb's latency histogram: cumulative counts per bucket of [`LATENCY_BUCKETS`], then sum and count.
#[derive(Debug, Default, Clone)]
pub struct Latency {
    /// Requests at or under each bound.
    pub buckets: [u64; LATENCY_BUCKETS.len()],
    /// Seconds, summed.
    pub sum: f64,
    /// Requests.
    pub count: u64,
}

impl Stats {
    /// Counts one request.
    pub fn count(&self, verb: &str, resource: &str, code: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((verb.to_string(), resource.to_string(), code))
            .or_default() += 1;
    }

    /// Observes one request's latency.
    pub fn observe(&self, verb: &'static str, seconds: f64) {
        let mut m = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        let h = m.entry(verb).or_default();
        for (n, le) in h.buckets.iter_mut().zip(LATENCY_BUCKETS) {
            if seconds <= le {
                *n += 1;
            }
        }
        h.sum += seconds;
        h.count += 1;
    }
}

/// Settings for one cluster.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Name (kubeconfig context and registry key).
    pub name: String,
    /// Registry labels (env, region, owner, provider).
    pub labels: BTreeMap<String, String>,
    /// Version profile.
    pub profile: Profile,
    /// Seed of this cluster's randomness.
    pub seed: u64,
    /// Objects to seed (approximate).
    pub objects: usize,
    /// Churn: object changes per second.
    pub churn: f64,
    /// Interval between watch bookmarks.
    pub bookmark_interval: Duration,
    /// Watch history kept for resumption (changes).
    pub history: usize,
    /// Extra Kubernetes events per second (on top of those the churn makes), in up to ten bursts a second.
    pub events_per_second: f64,
    /// Lease duration of the control-plane leases (renewed every 2 s).
    pub lease_duration_s: u32,
    /// Extra scrape bodies served by `fixture-<name>` pods in `monitoring`.
    pub metric_fixtures: BTreeMap<String, Arc<String>>,
    /// The address the apiserver listens on, named in its serving certificate.
    pub listen_host: std::net::IpAddr,
}

/// A virtual cluster.
#[derive(Debug)]
pub struct Cluster {
    /// Settings it was made with.
    pub settings: Settings,
    /// Objects.
    pub store: Store,
    /// PKI (switchable serving certificate).
    pub pki: Mutex<Pki>,
    /// Bearer token clients must present.
    pub token: String,
    faults: Mutex<Faults>,
    skew: AtomicI64,
    /// Bumped to close every open watch.
    pub watch_epoch: tokio::sync::watch::Sender<u64>,
    /// Counters.
    pub stats: Stats,
    /// Where it listens (set once bound).
    pub addr: OnceLock<SocketAddr>,
    rng: Mutex<StdRng>,
    uid_counter: AtomicU64,
    /// Mixed into every uid: a cluster started again is a new cluster (its store starts empty), and a
    /// real one never hands out a uid of an object that existed before (consumers that remember uids,
    /// such as the correlator's Event identities, would take a new object for an old one).
    incarnation: u64,
    /// The kubelet's event aggregator state (see [`crate::world::event`]).
    event_aggregates: Mutex<crate::world::EventAggregates>,
    /// The Deployments' request counters and the templates their controller rolled out.
    traffic: Mutex<crate::traffic::Workloads>,
}

impl Cluster {
    /// A cluster with an empty store.
    pub fn new(settings: Settings) -> Result<Arc<Self>, crate::tls::Error> {
        let pki = Pki::with_hosts(&settings.name, &[settings.listen_host.to_string()])?;
        let token = format!(
            "sim-{}-{:016x}",
            settings.name,
            settings.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        );
        let (watch_epoch, _) = tokio::sync::watch::channel(0);
        Ok(Arc::new(Cluster {
            store: Store::new(settings.history),
            pki: Mutex::new(pki),
            token,
            faults: Mutex::new(Faults::default()),
            skew: AtomicI64::new(0),
            watch_epoch,
            stats: Stats::default(),
            addr: OnceLock::new(),
            rng: Mutex::new(StdRng::seed_from_u64(settings.seed)),
            uid_counter: AtomicU64::new(0),
            incarnation: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id()).rotate_left(32),
            event_aggregates: Mutex::default(),
            traffic: Mutex::default(),
            settings,
        }))
    }

    /// Name.
    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// Version profile.
    pub fn profile(&self) -> &Profile {
        &self.settings.profile
    }

    /// The cluster's clock (skewed when the fault is on).
    pub fn now(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::seconds(self.skew.load(Ordering::Relaxed))
    }

    /// The cluster's clock as an RFC 3339 string with seconds (the format of Kubernetes timestamps).
    pub fn now_str(&self) -> String {
        self.now().to_rfc3339_opts(SecondsFormat::Secs, true)
    }

    /// The cluster's clock with microseconds (MicroTime: eventTime, lease renewTime).
    pub fn now_micro(&self) -> String {
        self.now().to_rfc3339_opts(SecondsFormat::Micros, true)
    }

    /// Current faults.
    pub fn faults(&self) -> Faults {
        self.faults_mut().clone()
    }

    /// The faults, to change them.
    pub fn faults_mut(&self) -> MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the clock skew.
    pub fn set_skew(&self, seconds: i64) {
        self.skew.store(seconds, Ordering::Relaxed);
        self.faults_mut().clock_skew_s = seconds;
    }

    /// The kubelet's event aggregator state.
    pub(crate) fn event_aggregates(&self) -> MutexGuard<'_, crate::world::EventAggregates> {
        self.event_aggregates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The Deployments' traffic (see [`crate::traffic`]). The controllers hold it while they write to the
    /// store, so it is never taken inside a store mutation.
    pub fn traffic(&self) -> MutexGuard<'_, crate::traffic::Workloads> {
        self.traffic.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cluster's seeded random generator.
    pub fn rng(&self) -> MutexGuard<'_, StdRng> {
        self.rng.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new uid (UUID-shaped): unique to this cluster, its order and this start of the simulator (names
    /// and values follow the seed; uids, like a real cluster's, are never handed out again).
    pub fn uid(&self) -> String {
        let n = self.uid_counter.fetch_add(1, Ordering::Relaxed);
        let h = crate::hash64(&format!(
            "{}/{}/{}/{n}",
            self.settings.name, self.settings.seed, self.incarnation
        ));
        let l = crate::hash64(&format!("{n}/{}/{}", self.settings.seed, self.incarnation));
        format!(
            "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
            (h >> 32) as u32,
            (h >> 16) as u16,
            h as u16 & 0xfff,
            (l >> 48) as u16 & 0xfff,
            l & 0xffff_ffff_ffff
        )
    }

    /// Closes every open watch (clients re-watch from their last resourceVersion).
    pub fn disconnect_watches(&self) {
        self.watch_epoch.send_modify(|e| *e += 1);
    }

    /// The server URL.
    pub fn server_url(&self) -> String {
        match self.addr.get() {
            Some(a) => format!("https://{a}"),
            None => String::new(),
        }
    }
}
