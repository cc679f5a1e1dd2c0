//! A realistic fleet event stream made of the real shapes in [`crate::shapes`], for the dedup benchmark
//! and its tests.
//!
//! Five clusters run the same fourteen workloads (Deployments, StatefulSets, CronJobs) on three node
//! pools. Normal lifecycle dominates: pods created, scheduled, pulled, started; rollouts, rescales, ingress
//! syncs and reloads, volumes provisioned, nodes joining and scaled down. Problems are (cluster, subject,
//! shape) triples drawn from every problem shape and every subject it fits; a few are loud and most are a
//! long tail (Zipf weights, exponent 1.1). A problem repeats either as its current Event object recorded
//! again (same uid, count + 1, as client-go's event correlator does) or as a new Event object (new uid;
//! for a pod problem, usually a new pod), with every volatile placeholder drawn again; one Event object in
//! twenty is a client-go aggregate (`(combined from similar events): ...`) whose message changes on every
//! re-record. Each event carries its ground-truth problem id, `None` for normal lifecycle.
//!
//! The subject of a workload problem is the workload (its pods, ReplicaSets and Jobs are one subject); the
//! subject of a node problem is the node pool, and for a kernel line naming a process, the pool and the
//! process (the line says no more).
//!
//! Deterministic: xorshift from a seed, no RNG crate.

use std::collections::VecDeque;

use chrono::{DateTime, Duration, Utc};
use multipilot_schemas::payload::{KubeEvent, ObjectRef, Severity};

use crate::shapes::{EventType, Kind, Placeholder, SHAPES, Shape};

/// The clusters of the fleet.
pub const CLUSTERS: &[&str] = &[
    "prod-eu-1",
    "prod-us-2",
    "staging-eu-1",
    "dev-ap-1",
    "prod-gpu-1",
];

/// Node pools (the same in every cluster).
pub const POOLS: &[&str] = &["general", "memory-optimized", "gpu"];

/// How a workload runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadKind {
    /// A Deployment (pods `<name>-<hash>-<suffix>`).
    Deployment,
    /// A StatefulSet (pods `<name>-<ordinal>`).
    StatefulSet,
    /// A CronJob (pods `<name>-<minute>-<suffix>`).
    CronJob,
}

/// How a workload's images are tagged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tags {
    /// `v1.7.12`
    Semver,
    /// `1.27.3`
    Plain,
    /// `1.27-alpine`
    Alpine,
    /// `sha-3f9c2a1`
    GitSha,
    /// `2024.06.11-3f9c2a1`
    Dated,
}

/// A workload of the fleet.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Namespace.
    pub ns: &'static str,
    /// Name.
    pub name: &'static str,
    /// How it runs.
    pub kind: WorkloadKind,
    /// Its container.
    pub container: &'static str,
    /// Its main process, as the kernel names it.
    pub process: &'static str,
    /// Image repository with registry.
    pub repo: &'static str,
    tags: Tags,
    /// Index into [`POOLS`].
    pub pool: usize,
    /// A secret/configmap/volume/service account/storage class name it refers to.
    pub volume: &'static str,
}

// a row of the workload table
#[allow(clippy::too_many_arguments)]
const fn w(
    ns: &'static str,
    name: &'static str,
    kind: WorkloadKind,
    container: &'static str,
    process: &'static str,
    repo: &'static str,
    tags: Tags,
    pool: usize,
    volume: &'static str,
) -> Workload {
    Workload {
        ns,
        name,
        kind,
        container,
        process,
        repo,
        tags,
        pool,
        volume,
    }
}

use WorkloadKind::{CronJob, Deployment, StatefulSet};

/// The workloads (the same in every cluster).
pub const WORKLOADS: &[Workload] = &[
    w(
        "shop",
        "web",
        Deployment,
        "web",
        "nginx",
        "registry.example.com/shop/web",
        Tags::Alpine,
        0,
        "web-tls",
    ),
    w(
        "shop",
        "api",
        Deployment,
        "api",
        "java",
        "registry.example.com/shop/api",
        Tags::Semver,
        0,
        "api-db-credentials",
    ),
    w(
        "shop",
        "cart",
        Deployment,
        "cart",
        "node",
        "registry.example.com/shop/cart",
        Tags::GitSha,
        0,
        "cart-config",
    ),
    w(
        "search",
        "indexer",
        StatefulSet,
        "indexer",
        "java",
        "registry.example.com/search/indexer",
        Tags::Dated,
        1,
        "indexer-data",
    ),
    w(
        "payments",
        "ledger",
        StatefulSet,
        "postgres",
        "postgres",
        "docker.io/library/postgres",
        Tags::Alpine,
        1,
        "ledger-credentials",
    ),
    w(
        "identity",
        "auth",
        Deployment,
        "keycloak",
        "java",
        "quay.io/keycloak/keycloak",
        Tags::Plain,
        0,
        "auth-realm",
    ),
    w(
        "catalog",
        "images",
        Deployment,
        "images",
        "python3",
        "registry.example.com/catalog/images",
        Tags::GitSha,
        0,
        "images-bucket",
    ),
    w(
        "monitoring",
        "prometheus",
        StatefulSet,
        "prometheus",
        "prometheus",
        "quay.io/prometheus/prometheus",
        Tags::Semver,
        1,
        "prometheus-data",
    ),
    w(
        "monitoring",
        "grafana",
        Deployment,
        "grafana",
        "grafana",
        "docker.io/grafana/grafana",
        Tags::Plain,
        0,
        "grafana-admin",
    ),
    w(
        "ingress-nginx",
        "ingress-nginx-controller",
        Deployment,
        "controller",
        "nginx",
        "registry.k8s.io/ingress-nginx/controller",
        Tags::Semver,
        0,
        "ingress-nginx-admission",
    ),
    w(
        "batch",
        "nightly-report",
        CronJob,
        "report",
        "python3",
        "registry.example.com/batch/report",
        Tags::Dated,
        0,
        "report-smtp",
    ),
    w(
        "batch",
        "billing-export",
        CronJob,
        "export",
        "java",
        "registry.example.com/batch/billing-export",
        Tags::Semver,
        1,
        "billing-sftp",
    ),
    w(
        "ml",
        "trainer",
        Deployment,
        "trainer",
        "python3",
        "registry.example.com/ml/trainer",
        Tags::GitSha,
        2,
        "trainer-datasets",
    ),
    w(
        "kube-system",
        "coredns",
        Deployment,
        "coredns",
        "coredns",
        "registry.k8s.io/coredns/coredns",
        Tags::Semver,
        0,
        "coredns",
    ),
];

/// What a problem is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A workload of a cluster (indices into [`CLUSTERS`] and [`WORKLOADS`]).
    Workload {
        /// Cluster index.
        cluster: usize,
        /// Workload index.
        workload: usize,
    },
    /// A node pool of a cluster, and the process a kernel line names.
    Pool {
        /// Cluster index.
        cluster: usize,
        /// Pool index.
        pool: usize,
        /// The process, for kernel lines that name one.
        process: Option<&'static str>,
    },
}

impl Subject {
    /// Cluster index.
    pub fn cluster(&self) -> usize {
        match self {
            Subject::Workload { cluster, .. } | Subject::Pool { cluster, .. } => *cluster,
        }
    }

    /// Namespace (empty for a node pool).
    pub fn namespace(&self) -> &'static str {
        match self {
            Subject::Workload { workload, .. } => WORKLOADS[*workload].ns,
            Subject::Pool { .. } => "",
        }
    }

    /// The ground-truth id of `shape` (an index into [`SHAPES`]) on this subject.
    pub fn problem_id(&self, shape: usize) -> String {
        match self {
            Subject::Workload { cluster, workload } => {
                let wl = &WORKLOADS[*workload];
                format!("{}/{}/{}/#{shape}", CLUSTERS[*cluster], wl.ns, wl.name)
            }
            Subject::Pool {
                cluster,
                pool,
                process,
            } => format!(
                "{}/-/{}{}/#{shape}",
                CLUSTERS[*cluster],
                POOLS[*pool],
                process.map(|p| format!(":{p}")).unwrap_or_default()
            ),
        }
    }
}

/// One rendered occurrence of a shape.
#[derive(Debug, Clone)]
pub struct Occurrence {
    /// Cluster.
    pub cluster: String,
    /// Namespace of the involved object (empty for a node).
    pub namespace: String,
    /// Name of the involved object.
    pub object: String,
    /// The message.
    pub message: String,
}

#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }

    fn hex(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b"0123456789abcdef"[self.below(16) as usize]))
            .collect()
    }
}

/// The fleet, and how to render any shape on any of its subjects.
#[derive(Debug)]
pub struct Universe {
    rng: Rng,
}

impl Universe {
    /// A universe drawing from `seed`.
    pub fn new(seed: u64) -> Self {
        Universe {
            rng: Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
        }
    }

    /// The subjects `shape` can be about, cluster by cluster.
    pub fn subjects_for(&self, shape: &Shape) -> Vec<Subject> {
        let mut out = Vec::new();
        for cluster in 0..CLUSTERS.len() {
            if shape.kind == Kind::Node {
                let names_process = shape.placeholder_names().contains(&"process");
                for pool in 0..POOLS.len() {
                    if names_process {
                        let mut seen: Vec<&str> = Vec::new();
                        for wl in WORKLOADS.iter().filter(|w| w.pool == pool) {
                            if !seen.contains(&wl.process) {
                                seen.push(wl.process);
                                out.push(Subject::Pool {
                                    cluster,
                                    pool,
                                    process: Some(wl.process),
                                });
                            }
                        }
                    } else {
                        out.push(Subject::Pool {
                            cluster,
                            pool,
                            process: None,
                        });
                    }
                }
                continue;
            }
            for (workload, wl) in WORKLOADS.iter().enumerate() {
                let fits = match shape.kind {
                    Kind::Pod => {
                        shape.reporter != "nginx-ingress-controller"
                            || wl.name == "ingress-nginx-controller"
                    }
                    Kind::Deployment
                    | Kind::ReplicaSet
                    | Kind::HorizontalPodAutoscaler
                    | Kind::Ingress => wl.kind == Deployment,
                    Kind::Endpoints => wl.kind != CronJob,
                    Kind::Job | Kind::CronJob => wl.kind == CronJob,
                    Kind::PersistentVolumeClaim => wl.kind == StatefulSet,
                    Kind::Node => false,
                };
                if fits {
                    out.push(Subject::Workload { cluster, workload });
                }
            }
        }
        out
    }

    /// One subject every shape of `kind` fits, the same each time (to compare shapes on one object).
    pub fn common_subject(&self, kind: Kind) -> Subject {
        let find = |name: &str| WORKLOADS.iter().position(|w| w.name == name).unwrap_or(0);
        match kind {
            Kind::Node => Subject::Pool {
                cluster: 0,
                pool: 0,
                process: Some("java"),
            },
            Kind::Job | Kind::CronJob => Subject::Workload {
                cluster: 0,
                workload: find("nightly-report"),
            },
            Kind::PersistentVolumeClaim => Subject::Workload {
                cluster: 0,
                workload: find("prometheus"),
            },
            _ => Subject::Workload {
                cluster: 0,
                workload: find("ingress-nginx-controller"),
            },
        }
    }

    /// A `generateName` suffix.
    fn suffix(&mut self) -> String {
        const A: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| char::from(A[self.rng.below(A.len() as u64) as usize]))
            .collect()
    }

    /// A pod-template-hash as the Deployment controller makes it: the decimal FNV-32 hash through
    /// `rand.SafeEncodeString`.
    fn template_hash(&mut self) -> String {
        const A: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (self.rng.next() as u32)
            .to_string()
            .bytes()
            .map(|b| char::from(A[b as usize % A.len()]))
            .collect()
    }

    fn minute(&mut self) -> u64 {
        28_790_000 + self.rng.below(100_000)
    }

    fn pod_of(&mut self, wl: &Workload) -> String {
        match wl.kind {
            Deployment => format!("{}-{}-{}", wl.name, self.template_hash(), self.suffix()),
            StatefulSet => format!("{}-{}", wl.name, self.rng.below(5)),
            CronJob => format!("{}-{}-{}", wl.name, self.minute(), self.suffix()),
        }
    }

    fn node_of(&mut self, pool: usize) -> String {
        format!("{}-{}", POOLS[pool], self.suffix())
    }

    /// The involved object's name for `kind` on `subject`.
    pub fn object_name(&mut self, kind: Kind, subject: &Subject) -> String {
        match subject {
            Subject::Pool { pool, .. } => self.node_of(*pool),
            Subject::Workload { workload, .. } => {
                let wl = &WORKLOADS[*workload];
                match kind {
                    Kind::Pod => self.pod_of(wl),
                    Kind::Node => self.node_of(wl.pool),
                    Kind::ReplicaSet => format!("{}-{}", wl.name, self.template_hash()),
                    Kind::Job => format!("{}-{}", wl.name, self.minute()),
                    Kind::PersistentVolumeClaim => {
                        format!("data-{}-{}", wl.name, self.rng.below(5))
                    }
                    Kind::Deployment
                    | Kind::CronJob
                    | Kind::HorizontalPodAutoscaler
                    | Kind::Endpoints
                    | Kind::Ingress => wl.name.to_string(),
                }
            }
        }
    }

    fn duration(&mut self) -> String {
        match self.rng.below(5) {
            0 => format!("{}ms", self.rng.range(1, 999)),
            1 => format!(
                "{}.{:09}s",
                self.rng.range(1, 59),
                self.rng.below(1_000_000_000)
            ),
            2 => format!("{}m{}s", self.rng.range(1, 59), self.rng.below(60)),
            3 => format!("{}s", self.rng.range(1, 59)),
            _ => format!(
                "{}h{}m{}s",
                self.rng.range(1, 9),
                self.rng.below(60),
                self.rng.below(60)
            ),
        }
    }

    fn quantity(&mut self) -> String {
        match self.rng.below(5) {
            0 => format!("{}m", self.rng.range(1, 40) * 50),
            1 => format!("{}Mi", self.rng.range(1, 64) * 32),
            2 => format!("{}Gi", self.rng.range(1, 16)),
            3 => format!("{}Ki", self.rng.range(1_000, 999_999)),
            _ => format!("{}", self.rng.range(1, 8)),
        }
    }

    fn tag(&mut self, tags: Tags) -> String {
        let (a, b, c) = (self.rng.below(4), self.rng.below(30), self.rng.below(20));
        match tags {
            Tags::Semver => format!("v{a}.{b}.{c}"),
            Tags::Plain => format!("{a}.{b}.{c}"),
            Tags::Alpine => format!("{}.{b}-alpine", a + 1),
            Tags::GitSha => format!("sha-{}", self.rng.hex(7)),
            Tags::Dated => format!(
                "{}.{:02}.{:02}-{}",
                2023 + a,
                1 + b % 12,
                1 + c,
                self.rng.hex(7)
            ),
        }
    }

    fn uuid(&mut self) -> String {
        format!(
            "{}-{}-{}-{}-{}",
            self.rng.hex(8),
            self.rng.hex(4),
            self.rng.hex(4),
            self.rng.hex(4),
            self.rng.hex(12)
        )
    }

    /// A value for `placeholder` on `subject`, the involved object being `kind` `object`.
    fn fill(&mut self, p: Placeholder, kind: Kind, subject: &Subject, object: &str) -> String {
        let (wl, pool, process) = match subject {
            Subject::Workload { workload, .. } => {
                let wl = &WORKLOADS[*workload];
                (Some(wl), wl.pool, wl.process)
            }
            Subject::Pool { pool, process, .. } => (None, *pool, process.unwrap_or("kubelet")),
        };
        let wl = wl.unwrap_or(&WORKLOADS[0]);
        match p {
            Placeholder::Ns => wl.ns.to_string(),
            Placeholder::Workload => wl.name.to_string(),
            Placeholder::Container => wl.container.to_string(),
            Placeholder::Process => process.to_string(),
            Placeholder::Pool => POOLS[pool].to_string(),
            Placeholder::Volume => wl.volume.to_string(),
            Placeholder::Pod => match kind {
                Kind::Pod => object.to_string(),
                Kind::ReplicaSet | Kind::Job => format!("{object}-{}", self.suffix()),
                _ => self.pod_of(wl),
            },
            Placeholder::Rs => match kind {
                Kind::ReplicaSet => object.to_string(),
                _ => format!("{}-{}", wl.name, self.template_hash()),
            },
            Placeholder::Job => match kind {
                Kind::Job => object.to_string(),
                _ => format!("{}-{}", wl.name, self.minute()),
            },
            Placeholder::Node => match kind {
                Kind::Node => object.to_string(),
                _ => self.node_of(pool),
            },
            Placeholder::Ip => format!(
                "10.{}.{}.{}",
                self.rng.range(0, 255),
                self.rng.range(0, 255),
                self.rng.range(1, 254)
            ),
            Placeholder::Port => self
                .rng
                .pick(&["8080", "8443", "9090", "3000", "8000"])
                .to_string(),
            Placeholder::Duration => self.duration(),
            Placeholder::Quantity => self.quantity(),
            Placeholder::Image => {
                let tag = self.tag(wl.tags);
                if self.rng.chance(0.2) {
                    format!("{}:{tag}@sha256:{}", wl.repo, self.rng.hex(64))
                } else {
                    format!("{}:{tag}", wl.repo)
                }
            }
            Placeholder::Tag => self.tag(wl.tags),
            Placeholder::Digest => self.rng.hex(64),
            Placeholder::Count => self.rng.range(1, 40).to_string(),
            Placeholder::Uuid => self.uuid(),
            Placeholder::Version => format!(
                "v{}.{}.{}",
                self.rng.below(3),
                self.rng.below(30),
                self.rng.below(20)
            ),
            Placeholder::Bytes => self.rng.range(1_000_000, 2_000_000_000).to_string(),
            Placeholder::Pid => self.rng.range(300, 4_000_000).to_string(),
            Placeholder::Status => self.rng.pick(&["500", "502", "503", "504"]).to_string(),
            Placeholder::Suffix => self.suffix(),
            Placeholder::Pv => format!("pvc-{}", self.uuid()),
            Placeholder::Random => (self.rng.next() as u32).to_string(),
        }
    }

    /// `shape` on `subject`, on a new object, every volatile placeholder drawn again.
    pub fn occurrence(&mut self, shape: &Shape, subject: &Subject) -> Occurrence {
        let object = self.object_name(shape.kind, subject);
        self.occurrence_on(shape, subject, object)
    }

    /// `shape` on `subject`'s object `object`.
    pub fn occurrence_on(
        &mut self,
        shape: &Shape,
        subject: &Subject,
        object: String,
    ) -> Occurrence {
        let message = shape.render(|_, p| self.fill(p, shape.kind, subject, &object));
        Occurrence {
            cluster: CLUSTERS[subject.cluster()].to_string(),
            namespace: if shape.kind == Kind::Node {
                String::new()
            } else {
                subject.namespace().to_string()
            },
            object,
            message,
        }
    }
}

/// One event of the stream.
#[derive(Debug, Clone)]
pub struct StreamEvent {
    /// The cluster it came from.
    pub cluster: String,
    /// The event.
    pub event: KubeEvent,
    /// Its ground-truth problem id; `None` for normal lifecycle.
    pub problem: Option<String>,
    /// Its shape (index into [`SHAPES`]).
    pub shape: usize,
}

#[derive(Debug)]
struct Series {
    uid: String,
    count: u64,
    first: DateTime<Utc>,
    occurrence: Occurrence,
    combined: bool,
}

#[derive(Debug)]
struct Problem {
    shape: usize,
    subject: Subject,
    id: String,
    series: Option<Series>,
}

/// How many (cluster, subject, shape) problems the fleet has.
pub const PROBLEMS: usize = 320;
/// The share of events that are problems.
pub const PROBLEM_SHARE: f64 = 0.3;
/// How often a problem's next occurrence records its current Event object again.
pub const RE_RECORD: f64 = 0.6;
/// How often a new Event object is a client-go aggregate.
pub const COMBINED: f64 = 0.05;
/// What client-go puts before an aggregated Event's message.
pub const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// The generator.
#[derive(Debug)]
pub struct ShapeStream {
    u: Universe,
    t: DateTime<Utc>,
    n: u64,
    problems: Vec<Problem>,
    cumulative: Vec<f64>,
    queue: VecDeque<Queued>,
}

/// A lifecycle event waiting its turn: shape, subject and, to keep one pod through an episode, its object.
type Queued = (usize, Subject, Option<String>);

fn shape_index(kind: Kind, reason: &str, needle: &str) -> usize {
    SHAPES
        .iter()
        .position(|s| s.kind == kind && s.reason == reason && s.template.contains(needle))
        .unwrap_or_else(|| panic!("no shape {kind:?} {reason} {needle:?}"))
}

impl ShapeStream {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Self {
        let mut u = Universe::new(seed);
        let mut candidates: Vec<(usize, Subject)> = Vec::new();
        for (i, sh) in SHAPES.iter().enumerate().filter(|(_, s)| s.problem) {
            for subject in u.subjects_for(sh) {
                candidates.push((i, subject));
            }
        }
        // a deterministic shuffle, then the first PROBLEMS, loudest first
        for i in (1..candidates.len()).rev() {
            let j = u.rng.below(i as u64 + 1) as usize;
            candidates.swap(i, j);
        }
        candidates.truncate(PROBLEMS);
        let problems: Vec<Problem> = candidates
            .into_iter()
            .map(|(shape, subject)| Problem {
                id: subject.problem_id(shape),
                shape,
                subject,
                series: None,
            })
            .collect();
        let mut total = 0.0;
        let cumulative = (0..problems.len())
            .map(|rank| {
                total += 1.0 / ((rank + 1) as f64).powf(1.1);
                total
            })
            .collect();
        ShapeStream {
            u,
            t: DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default(),
            n: 0,
            problems,
            cumulative,
            queue: VecDeque::new(),
        }
    }

    /// The next event.
    pub fn next_event(&mut self) -> StreamEvent {
        self.n += 1;
        // five busy clusters: ~10 events/s in all
        self.t += Duration::milliseconds(self.u.rng.below(200) as i64);
        if self.u.rng.chance(PROBLEM_SHARE) {
            self.problem_event()
        } else {
            if self.queue.is_empty() {
                self.episode();
            }
            let (shape, subject, object) = self.queue.pop_front().unwrap_or_else(|| {
                (
                    shape_index(Kind::Node, "Starting", ""),
                    Subject::Pool {
                        cluster: 0,
                        pool: 0,
                        process: None,
                    },
                    None,
                )
            });
            let sh = &SHAPES[shape];
            let o = match object {
                Some(object) => self.u.occurrence_on(sh, &subject, object),
                None => self.u.occurrence(sh, &subject),
            };
            let uid = self.uid();
            self.event(shape, o, uid, 1, self.t, None)
        }
    }

    fn uid(&mut self) -> String {
        self.u.uuid()
    }

    fn problem_event(&mut self) -> StreamEvent {
        let total = self.cumulative.last().copied().unwrap_or(1.0);
        let x = self.u.rng.unit() * total;
        let i = self
            .cumulative
            .partition_point(|c| *c < x)
            .min(self.problems.len() - 1);
        let again = self.problems[i].series.is_some() && self.u.rng.chance(RE_RECORD);
        let (shape, subject) = (self.problems[i].shape, self.problems[i].subject.clone());
        let sh = &SHAPES[shape];
        if again {
            let combined = self.problems[i].series.as_ref().is_some_and(|s| s.combined);
            let fresh = combined.then(|| {
                let object = self.problems[i]
                    .series
                    .as_ref()
                    .map(|s| s.occurrence.object.clone())
                    .unwrap_or_default();
                let mut o = self.u.occurrence_on(sh, &subject, object);
                o.message = format!("{COMBINED_PREFIX}{}", o.message);
                o
            });
            if let Some(s) = self.problems[i].series.as_mut() {
                s.count += 1;
                if let Some(o) = fresh {
                    s.occurrence = o;
                }
            }
        } else {
            let mut o = self.u.occurrence(sh, &subject);
            let combined = self.u.rng.chance(COMBINED);
            if combined {
                o.message = format!("{COMBINED_PREFIX}{}", o.message);
            }
            let uid = self.uid();
            self.problems[i].series = Some(Series {
                uid,
                count: 1,
                first: self.t,
                occurrence: o,
                combined,
            });
        }
        let p = &self.problems[i];
        let s = p
            .series
            .as_ref()
            .map(|s| (s.occurrence.clone(), s.uid.clone(), s.count, s.first));
        let (o, uid, count, first) = s.unwrap_or_else(|| {
            (
                Occurrence {
                    cluster: String::new(),
                    namespace: String::new(),
                    object: String::new(),
                    message: String::new(),
                },
                String::new(),
                1,
                self.t,
            )
        });
        let id = p.id.clone();
        self.event(shape, o, uid, count, first, Some(id))
    }

    fn event(
        &self,
        shape: usize,
        o: Occurrence,
        uid: String,
        count: u64,
        first: DateTime<Utc>,
        problem: Option<String>,
    ) -> StreamEvent {
        let sh = &SHAPES[shape];
        let warning = sh.event_type == EventType::Warning;
        let event = KubeEvent {
            occurrence_id: format!("{uid}/{count}"),
            uid,
            involved: ObjectRef {
                api_version: sh.kind.api_version().into(),
                kind: sh.kind.as_str().into(),
                namespace: (!o.namespace.is_empty()).then(|| o.namespace.clone()),
                name: o.object,
                uid: None,
            },
            reason: sh.reason.into(),
            message: o.message,
            event_type: sh.event_type.as_str().into(),
            severity: if warning {
                Severity::Warning
            } else {
                Severity::Info
            },
            count,
            first_time: (count > 1).then_some(first),
            last_time: self.t,
            reporter: sh.reporter.into(),
            action: None,
            source_api: "v1".into(),
        };
        StreamEvent {
            cluster: o.cluster,
            event,
            problem,
            shape,
        }
    }

    /// Queues one piece of normal lifecycle: a pod starting, a rollout, a rescale, an ingress sync, a job
    /// run, a volume provisioned, a scale-up or scale-down, a node joining.
    fn episode(&mut self) {
        let u = &mut self.u;
        let cluster = u.rng.below(CLUSTERS.len() as u64) as usize;
        let workload = u.rng.below(WORKLOADS.len() as u64) as usize;
        let wl = WORKLOADS[workload];
        let subject = Subject::Workload { cluster, workload };
        let pool = Subject::Pool {
            cluster,
            pool: wl.pool,
            process: None,
        };
        let q = &mut self.queue;
        let pod = u.object_name(Kind::Pod, &subject);
        let pod_start = |u: &mut Universe, q: &mut VecDeque<Queued>, pod: &str| {
            q.push_back((
                shape_index(Kind::Pod, "Scheduled", ""),
                subject.clone(),
                Some(pod.to_string()),
            ));
            if wl.kind == StatefulSet {
                q.push_back((
                    shape_index(Kind::Pod, "SuccessfulAttachVolume", ""),
                    subject.clone(),
                    Some(pod.to_string()),
                ));
            }
            let pulled = match u.rng.below(4) {
                0 => {
                    q.push_back((
                        shape_index(Kind::Pod, "Pulling", ""),
                        subject.clone(),
                        Some(pod.to_string()),
                    ));
                    shape_index(Kind::Pod, "Pulled", "Image size")
                }
                1 => {
                    q.push_back((
                        shape_index(Kind::Pod, "Pulling", ""),
                        subject.clone(),
                        Some(pod.to_string()),
                    ));
                    shape_index(Kind::Pod, "Pulled", "in {duration}")
                }
                2 => shape_index(Kind::Pod, "Pulled", "present on machine"),
                _ => shape_index(Kind::Pod, "Pulled", "accessed by the pod"),
            };
            q.push_back((pulled, subject.clone(), Some(pod.to_string())));
            let created = if u.rng.chance(0.5) {
                shape_index(Kind::Pod, "Created", "container {")
            } else {
                shape_index(Kind::Pod, "Created", "container: ")
            };
            q.push_back((created, subject.clone(), Some(pod.to_string())));
            q.push_back((
                shape_index(Kind::Pod, "Started", ""),
                subject.clone(),
                Some(pod.to_string()),
            ));
        };
        let roll = u.rng.below(100);
        match roll {
            0..=54 => {
                match wl.kind {
                    Deployment => {
                        q.push_back((
                            shape_index(Kind::ReplicaSet, "SuccessfulCreate", ""),
                            subject.clone(),
                            None,
                        ));
                    }
                    CronJob => {
                        q.push_back((
                            shape_index(Kind::CronJob, "SuccessfulCreate", ""),
                            subject.clone(),
                            None,
                        ));
                        q.push_back((
                            shape_index(Kind::Job, "SuccessfulCreate", ""),
                            subject.clone(),
                            None,
                        ));
                    }
                    StatefulSet => {}
                }
                pod_start(u, q, &pod);
                if wl.kind == CronJob {
                    q.push_back((
                        shape_index(Kind::Job, "Completed", ""),
                        subject.clone(),
                        None,
                    ));
                    q.push_back((
                        shape_index(Kind::CronJob, "SawCompletedJob", ""),
                        subject.clone(),
                        None,
                    ));
                }
            }
            55..=64 if wl.kind == Deployment => {
                q.push_back((
                    shape_index(Kind::Deployment, "ScalingReplicaSet", "Scaled up"),
                    subject.clone(),
                    None,
                ));
                q.push_back((
                    shape_index(Kind::ReplicaSet, "SuccessfulCreate", ""),
                    subject.clone(),
                    None,
                ));
                pod_start(u, q, &pod);
                q.push_back((
                    shape_index(Kind::Deployment, "ScalingReplicaSet", "Scaled down"),
                    subject.clone(),
                    None,
                ));
                q.push_back((
                    shape_index(Kind::ReplicaSet, "SuccessfulDelete", ""),
                    subject.clone(),
                    None,
                ));
                q.push_back((
                    shape_index(Kind::Pod, "Killing", "Stopping"),
                    subject.clone(),
                    None,
                ));
            }
            65..=69 if wl.kind == Deployment => {
                q.push_back((
                    shape_index(Kind::HorizontalPodAutoscaler, "SuccessfulRescale", ""),
                    subject.clone(),
                    None,
                ));
            }
            70..=77 => {
                let ingress = Subject::Workload {
                    cluster,
                    workload: WORKLOADS
                        .iter()
                        .position(|w| w.name == "ingress-nginx-controller")
                        .unwrap_or(0),
                };
                let sync_on = if wl.kind == Deployment {
                    subject.clone()
                } else {
                    ingress.clone()
                };
                q.push_back((
                    shape_index(Kind::Ingress, "Sync", ""),
                    sync_on.clone(),
                    None,
                ));
                q.push_back((shape_index(Kind::Pod, "RELOAD", "triggered"), ingress, None));
                q.push_back((
                    shape_index(Kind::Ingress, "AddedOrUpdated", ""),
                    sync_on,
                    None,
                ));
            }
            78..=83 if wl.kind == StatefulSet => {
                q.push_back((
                    shape_index(Kind::PersistentVolumeClaim, "WaitForFirstConsumer", ""),
                    subject.clone(),
                    None,
                ));
                q.push_back((
                    shape_index(Kind::PersistentVolumeClaim, "ExternalProvisioning", ""),
                    subject.clone(),
                    None,
                ));
                q.push_back((
                    shape_index(Kind::PersistentVolumeClaim, "ProvisioningSucceeded", ""),
                    subject.clone(),
                    None,
                ));
                pod_start(u, q, &pod);
            }
            84..=91 => {
                q.push_back((
                    shape_index(Kind::Pod, "TriggeredScaleUp", ""),
                    subject.clone(),
                    Some(pod.clone()),
                ));
                q.push_back((shape_index(Kind::Node, "Starting", ""), pool.clone(), None));
                q.push_back((
                    shape_index(Kind::Node, "RegisteredNode", ""),
                    pool.clone(),
                    None,
                ));
                q.push_back((shape_index(Kind::Node, "NodeReady", ""), pool.clone(), None));
                pod_start(u, q, &pod);
            }
            _ => {
                q.push_back((shape_index(Kind::Node, "ScaleDown", ""), pool.clone(), None));
                q.push_back((
                    shape_index(Kind::Pod, "ScaleDown", ""),
                    subject.clone(),
                    Some(pod.clone()),
                ));
                q.push_back((
                    shape_index(Kind::Pod, "Killing", "Stopping"),
                    subject.clone(),
                    Some(pod.clone()),
                ));
                q.push_back((
                    shape_index(Kind::Pod, "SandboxChanged", ""),
                    subject.clone(),
                    None,
                ));
            }
        }
    }
}
