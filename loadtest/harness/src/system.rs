//! The whole system on this machine, for one run: nats-server (one node, or a 3-node JetStream cluster from
//! the test kit), the hub roles as separate processes (so each has its own CPU and memory figures), the fleet
//! simulator and the agents. Everything lives under the run's directory; nothing is shared with
//! `./scripts/up`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use multipilot_bus::topology::Topology;
use multipilot_testkit::{NatsCluster, NatsServer, free_port};
use serde::Serialize;

use crate::proc::Proc;

/// The NATS subject mapping that partitions agent subjects (`deploy/nats/partitions.conf`).
const PARTITIONS_CONF: &str = include_str!("../../../deploy/nats/partitions.conf");

/// The release role's config file, in the run's directory.
const RELEASE_CONFIG: &str = "release.yaml";

/// Where the system's binaries are.
#[derive(Debug, Clone)]
pub struct Bins {
    /// `multipilot` (hub roles).
    pub multipilot: PathBuf,
    /// `multipilot-agent`.
    pub agent: PathBuf,
    /// `multipilot-sim`.
    pub sim: PathBuf,
}

impl Bins {
    /// The binaries in `dir`, or a clear error naming what is missing and how to build it.
    pub fn in_dir(dir: &Path) -> Result<Self> {
        let b = Bins {
            multipilot: dir.join("multipilot"),
            agent: dir.join("multipilot-agent"),
            sim: dir.join("multipilot-sim"),
        };
        for p in [&b.multipilot, &b.agent, &b.sim] {
            if !p.is_file() {
                bail!(
                    "{} not found: build the system first (`cargo build --release --bins`, or `cargo build --bins` \
                     with --bin-dir target/debug)",
                    p.display()
                );
            }
        }
        Ok(b)
    }
}

/// Consumer input limits given to the hub roles.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Rate {
    /// Messages per second per consumer.
    pub per_second: u32,
    /// Burst.
    pub burst: u32,
}

/// What to start.
#[derive(Debug, Clone, Serialize)]
pub struct Spec {
    /// Simulated clusters.
    pub clusters: usize,
    /// Objects per cluster.
    pub objects: usize,
    /// Object changes per second per cluster.
    pub churn: f64,
    /// Extra Kubernetes events per second per cluster.
    pub events_per_second: f64,
    /// Seconds between metric scrapes.
    pub scrape_interval_s: u32,
    /// Seconds between probe rounds (None: the agent's default).
    pub probe_interval_s: Option<u32>,
    /// Agent processes (clusters are spread over them).
    pub agents: usize,
    /// Correlator instances (partitions when > 1).
    pub correlators: u32,
    /// TSDB instances (partitions when > 1).
    pub tsdbs: u32,
    /// Keep every message in the last-value streams too, so every seq can be accounted for.
    pub accounting: bool,
    /// Consumer input limits of the hub roles (None: unlimited, the default).
    pub rate: Option<Rate>,
    /// JetStream nodes (1, or 3 for a cluster).
    pub nats_nodes: usize,
    /// The alert router's routing file (None: the default).
    pub alerts_routing: Option<String>,
    /// Agent outbox disk budget (None: the default).
    pub outbox_max_bytes: Option<u64>,
    /// Runs the release role with this hub config file (YAML; its `release:` section), and lets the agents
    /// take its commands (None: no release role).
    pub release: Option<String>,
}

/// What a hub role process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleKind {
    /// `multipilot correlator`.
    Correlator,
    /// `multipilot tsdb`.
    Tsdb,
    /// `multipilot alerts`.
    Alerts,
    /// `multipilot release`.
    Release,
}

impl RoleKind {
    /// The subcommand.
    pub fn command(self) -> &'static str {
        match self {
            RoleKind::Correlator => "correlator",
            RoleKind::Tsdb => "tsdb",
            RoleKind::Alerts => "alerts",
            RoleKind::Release => "release",
        }
    }
}

/// One hub role process.
#[derive(Debug)]
pub struct Role {
    /// Which role.
    pub kind: RoleKind,
    /// Its partition (0 without partitions).
    pub partition: u32,
    /// The process.
    pub proc: Proc,
    /// `http://127.0.0.1:<port>` of `/readyz` and `/metrics`.
    pub http: String,
    /// The role's API (TSDB queries, alert router API).
    pub api: Option<String>,
    /// Its data directory.
    pub data_dir: PathBuf,
}

/// A process the sampler watches.
#[derive(Debug, Clone)]
pub struct Watch {
    /// pid while running.
    pub pid: Option<u32>,
    /// Its `/metrics`, if it has one.
    pub metrics: Option<String>,
}

/// The processes to sample, by name (updated on every start and kill).
pub type Watched = Arc<Mutex<BTreeMap<String, Watch>>>;

/// The NATS side.
#[derive(Debug)]
pub enum Nats {
    /// One node.
    Single(NatsServer),
    /// A JetStream cluster.
    Cluster(NatsCluster),
}

/// The running system.
#[derive(Debug)]
pub struct System {
    /// The run's directory.
    pub dir: PathBuf,
    /// What was started.
    pub spec: Spec,
    /// NATS.
    pub nats: Nats,
    /// Monitoring base URLs, one per node.
    pub monitors: Vec<String>,
    /// A client of the harness itself.
    pub client: async_nats::Client,
    /// JetStream.
    pub js: jetstream::Context,
    /// Hub roles.
    pub roles: Vec<Role>,
    /// The simulator.
    pub sim: Proc,
    /// Its control API.
    pub sim_control: String,
    /// The simulated clusters.
    pub clusters: Vec<String>,
    /// Agent processes and their health URLs.
    pub agents: Vec<(Proc, String)>,
    /// For the sampler.
    pub watched: Watched,
    /// The NATS URL(s) the processes use.
    pub url: String,
    bins: Bins,
    http: reqwest::Client,
}

fn env(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

impl System {
    /// Starts everything and waits until the agents report ready.
    pub async fn start(spec: Spec, dir: &Path, bins: Bins) -> Result<System> {
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let partitioned = spec.correlators > 1 || spec.tsdbs > 1;
        let mut partitions_conf = PARTITIONS_CONF.to_string();
        if partitioned {
            let n = spec.correlators.max(spec.tsdbs);
            anyhow::ensure!(
                spec.correlators <= 1 || spec.tsdbs <= 1 || spec.correlators == spec.tsdbs,
                "correlators and tsdbs must use the same partition count"
            );
            partitions_conf = partitions_conf.replace("partition(2,", &format!("partition({n},"));
        }
        // inlined: an `include` is resolved relative to the including file, which lives elsewhere
        let include = if partitioned {
            partitions_conf
        } else {
            String::new()
        };
        let mut monitors = Vec::new();
        let nats = if spec.nats_nodes > 1 {
            let ports: Vec<u16> = (0..spec.nats_nodes)
                .map(|_| free_port())
                .collect::<Result<_>>()?;
            monitors = ports
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect();
            Nats::Cluster(
                NatsCluster::start_with(spec.nats_nodes, |i| {
                    format!("http_port: {}\n{include}", ports[i])
                })
                .await?,
            )
        } else {
            let port = free_port()?;
            monitors.push(format!("http://127.0.0.1:{port}"));
            Nats::Single(NatsServer::start_with(|_| format!("http_port: {port}\n{include}")).await?)
        };
        let url = match &nats {
            Nats::Single(s) => s.url(),
            Nats::Cluster(c) => c.urls().join(","),
        };
        let client = match &nats {
            Nats::Single(s) => {
                async_nats::ConnectOptions::new()
                    .retry_on_initial_connect()
                    .max_reconnects(None)
                    .connect(s.url())
                    .await?
            }
            Nats::Cluster(c) => c.client().await?,
        };
        let js = jetstream::new(client.clone());
        let mut topology = Topology::embedded().with_replicas(spec.nats_nodes.min(3));
        if spec.accounting {
            for s in &mut topology.streams {
                s.max_msgs_per_subject = 0;
            }
        }
        // with partitions each instance reads through durables of its own (created by the role); the shared
        // ones would only pile up an unread backlog
        if spec.correlators > 1 {
            topology
                .consumers
                .retain(|c| !c.durable.starts_with("correlator-"));
        }
        if spec.tsdbs > 1 {
            topology.consumers.retain(|c| c.durable != "tsdb");
        }
        topology.provision(&js).await.context("provisioning")?;

        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?;
        let mut sys = System {
            dir: dir.clone(),
            spec: spec.clone(),
            nats,
            monitors,
            client,
            js,
            roles: Vec::new(),
            sim: Proc::new("sim", &bins.sim, vec![], vec![], dir.join("logs/sim.log")),
            sim_control: String::new(),
            clusters: Vec::new(),
            agents: Vec::new(),
            watched: Watched::default(),
            url: url.clone(),
            bins,
            http,
        };
        // hub roles
        let routing = match &spec.alerts_routing {
            Some(text) => {
                let p = dir.join("alerts.yaml");
                std::fs::write(&p, text)?;
                Some(p)
            }
            None => None,
        };
        let tsdb_ports: Vec<u16> = (0..spec.tsdbs)
            .map(|_| free_port())
            .collect::<Result<_>>()?;
        let mut plan = Vec::new();
        for k in 0..spec.correlators {
            plan.push((RoleKind::Correlator, k));
        }
        for k in 0..spec.tsdbs {
            plan.push((RoleKind::Tsdb, k));
        }
        plan.push((RoleKind::Alerts, 0));
        if let Some(text) = &spec.release {
            std::fs::write(dir.join(RELEASE_CONFIG), text)?;
            plan.push((RoleKind::Release, 0));
        }
        for (kind, k) in plan {
            let name = match (kind, spec.correlators, spec.tsdbs) {
                (RoleKind::Correlator, n, _) | (RoleKind::Tsdb, _, n) if n > 1 => {
                    format!("{}-{k}", kind.command())
                }
                _ => kind.command().to_string(),
            };
            let port = free_port()?;
            let data_dir = dir.join("hub").join(&name);
            let mut e = env(&[
                ("MULTIPILOT_NATS__URL", url.clone()),
                ("MULTIPILOT_HTTP__LISTEN", format!("127.0.0.1:{port}")),
                (
                    "MULTIPILOT_STORAGE__DATA_DIR",
                    data_dir.to_string_lossy().into_owned(),
                ),
                ("MULTIPILOT_PROVISION__ENABLED", "false".into()),
                (
                    "MULTIPILOT_PROVISION__REPLICAS",
                    spec.nats_nodes.min(3).to_string(),
                ),
                ("MULTIPILOT_LOG__FORMAT", "text".into()),
            ]);
            let mut api = None;
            match kind {
                RoleKind::Correlator => {
                    if spec.correlators > 1 {
                        e.extend(env(&[
                            (
                                "MULTIPILOT_CORRELATOR__PARTITIONS",
                                spec.correlators.to_string(),
                            ),
                            ("MULTIPILOT_CORRELATOR__PARTITION", k.to_string()),
                        ]));
                    }
                }
                RoleKind::Tsdb => {
                    let p = tsdb_ports[k as usize];
                    api = Some(format!("http://127.0.0.1:{p}"));
                    e.extend(env(&[(
                        "MULTIPILOT_TSDB__LISTEN",
                        format!("127.0.0.1:{p}"),
                    )]));
                    if spec.tsdbs > 1 {
                        let peers: Vec<String> = tsdb_ports
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| *i as u32 != k)
                            .map(|(_, p)| format!("\"http://127.0.0.1:{p}\""))
                            .collect();
                        e.extend(env(&[
                            ("MULTIPILOT_TSDB__PARTITIONS", spec.tsdbs.to_string()),
                            ("MULTIPILOT_TSDB__PARTITION", k.to_string()),
                            ("MULTIPILOT_TSDB__PEERS", format!("[{}]", peers.join(","))),
                        ]));
                    }
                }
                RoleKind::Alerts => {
                    let p = free_port()?;
                    api = Some(format!("http://127.0.0.1:{p}"));
                    e.extend(env(&[(
                        "MULTIPILOT_ALERTS__LISTEN",
                        format!("127.0.0.1:{p}"),
                    )]));
                    if let Some(r) = &routing {
                        e.extend(env(&[(
                            "MULTIPILOT_ALERTS__ROUTING",
                            r.to_string_lossy().into_owned(),
                        )]));
                    }
                }
                RoleKind::Release => {
                    // analyses ask the (first) TSDB; the rest of its settings come from the file
                    e.extend(env(&[
                        (
                            "MULTIPILOT_CONFIG",
                            dir.join(RELEASE_CONFIG).to_string_lossy().into_owned(),
                        ),
                        (
                            "MULTIPILOT_RELEASE__TSDB_URL",
                            format!("http://127.0.0.1:{}", tsdb_ports[0]),
                        ),
                    ]));
                }
            }
            // the release role's consumers have no rate settings
            if let Some(rate) = spec.rate.filter(|_| kind != RoleKind::Release) {
                // the TSDB's consumer settings are a section of their own (`tsdb.consumer`)
                let section = match kind {
                    RoleKind::Tsdb => "TSDB__CONSUMER".to_string(),
                    _ => kind.command().to_uppercase(),
                };
                e.extend(env(&[
                    (
                        &format!("MULTIPILOT_{section}__RATE__PER_SECOND"),
                        rate.per_second.to_string(),
                    ),
                    (
                        &format!("MULTIPILOT_{section}__RATE__BURST"),
                        rate.burst.to_string(),
                    ),
                ]));
            }
            let proc = Proc::new(
                name.clone(),
                &sys.bins.multipilot,
                vec![kind.command().into()],
                e,
                dir.join(format!("logs/{name}.log")),
            );
            sys.roles.push(Role {
                kind,
                partition: k,
                proc,
                http: format!("http://127.0.0.1:{port}"),
                api,
                data_dir,
            });
        }
        for i in 0..sys.roles.len() {
            sys.roles[i].proc.start()?;
        }
        for i in 0..sys.roles.len() {
            sys.wait_role_ready(i).await?;
        }
        // the release role writes its public key for the agents to trust on its first start
        let trusted_key = match sys.role(RoleKind::Release, 0) {
            Some(i) => {
                let key = sys.roles[i].data_dir.join("release/signing.key.pub");
                let deadline = Instant::now() + Duration::from_secs(60);
                while !key.is_file() {
                    if Instant::now() > deadline {
                        bail!(
                            "the release role wrote no {}:\n{}",
                            key.display(),
                            sys.roles[i].proc.log_tail(20)
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Some(key)
            }
            None => None,
        };

        // the simulator, its control API on a port it picks (one picked here and freed could be taken by
        // another process' outgoing connection before the simulator binds it); the state file says which
        let kubeconfig = dir.join("sim/kubeconfig.yaml");
        std::fs::create_dir_all(dir.join("sim"))?;
        sys.sim = Proc::new(
            "sim",
            &sys.bins.sim,
            vec![
                "--clusters".into(),
                spec.clusters.to_string(),
                "--objects".into(),
                spec.objects.to_string(),
                "--churn".into(),
                spec.churn.to_string(),
                "--events-per-second".into(),
                spec.events_per_second.to_string(),
                "--kubeconfig".into(),
                kubeconfig.to_string_lossy().into_owned(),
                "--control".into(),
                "127.0.0.1:0".into(),
                "--seed".into(),
                "42".into(),
            ],
            vec![],
            dir.join("logs/sim.log"),
        );
        sys.sim.start()?;
        let state = kubeconfig.with_extension("sim.json");
        let deadline = Instant::now() + Duration::from_secs(120);
        let clusters: Vec<(String, serde_json::Value)> = loop {
            if let Ok(text) = std::fs::read(&state)
                && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&text)
            {
                sys.sim_control = v["control"].as_str().unwrap_or_default().to_string();
                break v["clusters"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|c| {
                                (
                                    c["name"].as_str().unwrap_or_default().to_string(),
                                    c["labels"].clone(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
            }
            if !sys.sim.running() || Instant::now() > deadline {
                bail!("the simulator did not start:\n{}", sys.sim.log_tail(20));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        sys.clusters = clusters.iter().map(|(n, _)| n.clone()).collect();

        // the agents: clusters spread over `agents` processes
        let n_agents = spec.agents.clamp(1, clusters.len().max(1));
        for a in 0..n_agents {
            let mine: Vec<&(String, serde_json::Value)> = clusters
                .iter()
                .enumerate()
                .filter(|(i, _)| i % n_agents == a)
                .map(|(_, c)| c)
                .collect();
            let mut cfg = String::from("clusters:\n");
            for (name, labels) in &mine {
                cfg.push_str(&format!(
                    "  - name: {}\n    labels: {}\n",
                    serde_json::to_string(name)?,
                    serde_json::to_string(labels)?
                ));
            }
            if let Some(key) = &trusted_key {
                cfg.push_str(&format!(
                    "release:\n  enabled: true\n  trusted_key_files: [{}]\n",
                    serde_json::to_string(&key.to_string_lossy())?
                ));
            }
            let adir = dir.join(format!("agent-{a}"));
            std::fs::create_dir_all(&adir)?;
            std::fs::write(adir.join("agent.yaml"), cfg)?;
            let port = free_port()?;
            let mut e = env(&[
                ("MULTIPILOT_AGENT__NATS__URL", url.clone()),
                (
                    "MULTIPILOT_AGENT__HTTP__LISTEN",
                    format!("127.0.0.1:{port}"),
                ),
                (
                    "MULTIPILOT_AGENT__OUTBOX__PATH",
                    adir.join("outbox").to_string_lossy().into_owned(),
                ),
                (
                    "MULTIPILOT_AGENT__SCRAPE__INTERVAL_S",
                    spec.scrape_interval_s.to_string(),
                ),
                ("MULTIPILOT_AGENT__LOG__FORMAT", "text".into()),
            ]);
            if let Some(p) = spec.probe_interval_s {
                e.extend(env(&[(
                    "MULTIPILOT_AGENT__PROBES__INTERVAL_S",
                    p.to_string(),
                )]));
            }
            if let Some(b) = spec.outbox_max_bytes {
                e.extend(env(&[(
                    "MULTIPILOT_AGENT__OUTBOX__MAX_BYTES",
                    b.to_string(),
                )]));
            }
            let mut p = Proc::new(
                format!("agent-{a}"),
                &sys.bins.agent,
                vec![
                    "--config".into(),
                    adir.join("agent.yaml").to_string_lossy().into_owned(),
                    "--kubeconfig".into(),
                    kubeconfig.to_string_lossy().into_owned(),
                ],
                e,
                dir.join(format!("logs/agent-{a}.log")),
            );
            p.start()?;
            sys.agents.push((p, format!("http://127.0.0.1:{port}")));
        }
        for i in 0..sys.agents.len() {
            let url = format!("{}/readyz", sys.agents[i].1);
            if !sys.wait_http(&url, 120).await {
                bail!(
                    "{} did not become ready:\n{}",
                    sys.agents[i].0.name,
                    sys.agents[i].0.log_tail(20)
                );
            }
        }
        sys.refresh_watch();
        Ok(sys)
    }

    async fn wait_http(&self, url: &str, secs: u64) -> bool {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Ok(r) = self.http.get(url).send().await
                && r.status().is_success()
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    /// Waits for a role's `/readyz`.
    pub async fn wait_role_ready(&mut self, i: usize) -> Result<()> {
        let url = format!("{}/readyz", self.roles[i].http);
        if !self.wait_http(&url, 120).await {
            bail!(
                "{} did not become ready:\n{}",
                self.roles[i].proc.name,
                self.roles[i].proc.log_tail(30)
            );
        }
        Ok(())
    }

    /// Updates the sampler's list of processes.
    pub fn refresh_watch(&mut self) {
        let mut m = BTreeMap::new();
        let nats_pids: Vec<Option<u32>> = match &self.nats {
            Nats::Single(s) => vec![s.pid()],
            Nats::Cluster(c) => c.nodes.iter().map(NatsServer::pid).collect(),
        };
        for (i, pid) in nats_pids.into_iter().enumerate() {
            let name = if self.monitors.len() > 1 {
                format!("nats-{i}")
            } else {
                "nats".into()
            };
            m.insert(name, Watch { pid, metrics: None });
        }
        for r in &self.roles {
            m.insert(
                r.proc.name.clone(),
                Watch {
                    pid: r.proc.pid(),
                    metrics: Some(format!("{}/metrics", r.http)),
                },
            );
        }
        m.insert(
            "sim".into(),
            Watch {
                pid: self.sim.pid(),
                metrics: None,
            },
        );
        for (p, url) in &self.agents {
            m.insert(
                p.name.clone(),
                Watch {
                    pid: p.pid(),
                    metrics: Some(format!("{url}/metrics")),
                },
            );
        }
        *self.watched.lock().unwrap_or_else(|e| e.into_inner()) = m;
    }

    /// The index of the first role of a kind (and partition).
    pub fn role(&self, kind: RoleKind, partition: u32) -> Option<usize> {
        self.roles
            .iter()
            .position(|r| r.kind == kind && r.partition == partition)
    }

    /// kill -9 a role.
    pub fn kill_role(&mut self, i: usize) {
        self.roles[i].proc.kill9();
        self.refresh_watch();
    }

    /// Starts a role again and waits until it is ready.
    pub async fn restart_role(&mut self, i: usize) -> Result<()> {
        self.roles[i].proc.start()?;
        self.refresh_watch();
        self.wait_role_ready(i).await
    }

    /// Switches a simulator fault.
    pub async fn fault(
        &self,
        cluster: &str,
        fault: &str,
        on: bool,
        params: &[(&str, &str)],
    ) -> Result<()> {
        self.faults().set(cluster, fault, on, params).await
    }

    /// A handle that switches faults from another task.
    pub fn faults(&self) -> Faults {
        Faults {
            http: self.http.clone(),
            control: self.sim_control.clone(),
        }
    }

    /// JetStream's view (`/jsz` of the first node that answers).
    pub async fn jsz(&self) -> Result<Jsz> {
        let mut last = None;
        for m in &self.monitors {
            let url = format!("{m}{JSZ}");
            match self.http.get(&url).send().await {
                Ok(r) if r.status().is_success() => {
                    let v: serde_json::Value = r.json().await?;
                    return Ok(Jsz::from_json(&v));
                }
                Ok(r) => last = Some(anyhow::anyhow!("{url}: {}", r.status())),
                Err(e) => last = Some(e.into()),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no monitoring endpoint")))
    }

    /// Waits until every durable consumer in `durables` (all when empty) has nothing pending or unacked.
    pub async fn wait_caught_up(&self, durables: &[&str], secs: u64) -> Result<Duration> {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(secs);
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Ok(j) = self.jsz().await {
                // none seen, or one named missing, is not caught up (a /jsz without the consumers'
                // configuration would list no durable one)
                let missing: Vec<&str> = if durables.is_empty() {
                    if j.consumers.is_empty() {
                        vec!["any durable consumer"]
                    } else {
                        vec![]
                    }
                } else {
                    durables
                        .iter()
                        .copied()
                        .filter(|d| !j.consumers.iter().any(|c| c.name == *d))
                        .collect()
                };
                if !missing.is_empty() {
                    last = format!("not listed: {}", missing.join(", "));
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                let behind: Vec<String> = j
                    .consumers
                    .iter()
                    .filter(|c| durables.is_empty() || durables.contains(&c.name.as_str()))
                    .filter(|c| c.num_pending + c.num_ack_pending > 0)
                    .map(|c| {
                        format!(
                            "{}/{}: {} pending, {} unacked",
                            c.stream, c.name, c.num_pending, c.num_ack_pending
                        )
                    })
                    .collect();
                if behind.is_empty() {
                    return Ok(start.elapsed());
                }
                last = behind.join("; ");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        bail!("consumers not caught up after {secs} s: {last}")
    }

    /// Stops the agents cleanly (each sends a last heartbeat that closes its seq accounting).
    pub fn stop_agents(&mut self) {
        for (p, _) in &mut self.agents {
            p.terminate(Duration::from_secs(30));
        }
        self.refresh_watch();
    }

    /// Stops everything (roles cleanly, so their stores are flushed).
    pub fn stop(&mut self) {
        for (p, _) in &mut self.agents {
            p.terminate(Duration::from_secs(10));
        }
        self.sim.terminate(Duration::from_secs(5));
        for r in &mut self.roles {
            r.proc.terminate(Duration::from_secs(10));
        }
    }

    /// Calls `f(subject, payload)` for every message a stream holds now (on `filter`, all when empty).
    pub async fn for_each_message(
        &self,
        stream: &str,
        filter: &str,
        mut f: impl FnMut(&str, &[u8]),
    ) -> Result<u64> {
        let mut s = self.js.get_stream(stream).await?;
        let last = s.info().await?.state.last_sequence;
        if s.cached_info().state.messages == 0 {
            return Ok(0);
        }
        let c = s
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::All,
                filter_subject: filter.to_string(),
                ..Default::default()
            })
            .await?;
        let mut msgs = c.messages().await?;
        let mut n = 0;
        loop {
            let m = match tokio::time::timeout(Duration::from_secs(5), msgs.next()).await {
                Ok(Some(Ok(m))) => m,
                Ok(Some(Err(e))) => bail!("reading {stream}: {e}"),
                Ok(None) | Err(_) => break,
            };
            n += 1;
            f(m.subject.as_str(), &m.payload);
            let seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
            if seq >= last {
                break;
            }
        }
        Ok(n)
    }

    /// kill -9 the (single) NATS server.
    pub fn kill_nats(&mut self) -> Result<()> {
        match &mut self.nats {
            Nats::Single(s) => s.kill(),
            Nats::Cluster(_) => {
                bail!("kill_nats is for a single node; kill a cluster node instead")
            }
        }
        self.refresh_watch();
        Ok(())
    }

    /// Starts the (single) NATS server again with its store.
    pub async fn restart_nats(&mut self) -> Result<()> {
        match &mut self.nats {
            Nats::Single(s) => s.restart().await?,
            Nats::Cluster(_) => bail!("restart_nats is for a single node"),
        }
        self.refresh_watch();
        Ok(())
    }

    /// Runs the `multipilot` CLI against this system's NATS, as an operator would; returns its stdout.
    pub async fn cli(&self, args: &[&str]) -> Result<String> {
        let out = tokio::process::Command::new(&self.bins.multipilot)
            .args(args)
            .env("MULTIPILOT_NATS__URL", &self.url)
            .output()
            .await
            .context("running multipilot")?;
        if !out.status.success() {
            bail!(
                "multipilot {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A short HTTP GET returning the body.
    pub async fn get(&self, url: &str) -> Result<String> {
        let r = self.http.get(url).send().await?;
        let status = r.status();
        let body = r.text().await?;
        if !status.is_success() {
            bail!("GET {url}: {status}: {body}");
        }
        Ok(body)
    }

    /// A PromQL instant query against a TSDB instance: the `data.result` array.
    pub async fn query(&self, tsdb: &str, q: &str) -> Result<Vec<serde_json::Value>> {
        let r = self
            .http
            .get(format!("{tsdb}/api/v1/query"))
            .query(&[("query", q)])
            .send()
            .await?;
        let status = r.status();
        let v: serde_json::Value = r.json().await?;
        if !status.is_success() || v["status"] != "success" {
            bail!("query {q}: {status} {v}");
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// The first TSDB's API.
    pub fn tsdb_api(&self) -> Option<String> {
        self.roles
            .iter()
            .find(|r| r.kind == RoleKind::Tsdb)
            .and_then(|r| r.api.clone())
    }

    /// Gives the release role a new config file (`Spec::release`) and restarts it (cleanly) with it: the
    /// role reads its settings, such as `release.windows`, when it starts.
    pub async fn reconfigure_release(&mut self, text: &str) -> Result<()> {
        let i = self
            .role(RoleKind::Release, 0)
            .context("the system runs no release role")?;
        std::fs::write(self.dir.join(RELEASE_CONFIG), text)?;
        self.roles[i].proc.terminate(Duration::from_secs(10));
        self.restart_role(i).await
    }

    /// An object as a simulated cluster's API server serves it (`path` like
    /// `/apis/apps/v1/namespaces/default/deployments/web`), read with the simulator's kubeconfig as any
    /// client would: its CA, its bearer token.
    pub async fn cluster_get(&self, cluster: &str, path: &str) -> Result<serde_json::Value> {
        let text = std::fs::read_to_string(self.dir.join("sim/kubeconfig.yaml"))?;
        let kc: serde_json::Value = serde_yaml::from_str(&text)?;
        let named = |list: &str, name: &str| {
            kc[list]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["name"] == name))
                .cloned()
                .unwrap_or_default()
        };
        let ctx = named("contexts", cluster);
        let cl = named(
            "clusters",
            ctx["context"]["cluster"].as_str().unwrap_or(cluster),
        );
        let user = named("users", ctx["context"]["user"].as_str().unwrap_or_default());
        let server = cl["cluster"]["server"]
            .as_str()
            .with_context(|| format!("no cluster {cluster} in the simulator's kubeconfig"))?;
        let ca = base64_decode(
            cl["cluster"]["certificate-authority-data"]
                .as_str()
                .unwrap_or_default(),
        )?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
            .build()?;
        let r = http
            .get(format!("{server}{path}"))
            .bearer_auth(user["user"]["token"].as_str().unwrap_or_default())
            .send()
            .await
            .with_context(|| format!("GET {path} on {cluster}"))?;
        let status = r.status();
        let v: serde_json::Value = r.json().await?;
        if !status.is_success() {
            bail!("GET {path} on {cluster}: {status}: {v}");
        }
        Ok(v)
    }
}

/// Standard base64 (with or without padding), as a kubeconfig's `*-data` fields hold it.
fn base64_decode(text: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for ch in text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
    {
        let v = match ch {
            b'A'..=b'Z' => ch - b'A',
            b'a'..=b'z' => ch - b'a' + 26,
            b'0'..=b'9' => ch - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => bail!("not base64: {:?}", ch as char),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

/// Switches simulator faults (cheap to clone, usable from any task).
#[derive(Debug, Clone)]
pub struct Faults {
    http: reqwest::Client,
    control: String,
}

impl Faults {
    /// Switches `fault` on or off in `cluster`.
    pub async fn set(
        &self,
        cluster: &str,
        fault: &str,
        on: bool,
        params: &[(&str, &str)],
    ) -> Result<()> {
        let params: BTreeMap<&str, &str> = params.iter().copied().collect();
        let url = format!("{}/clusters/{cluster}/faults/{fault}", self.control);
        let r = self
            .http
            .post(&url)
            .json(&serde_json::json!({"on": on, "params": params}))
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        if !r.status().is_success() {
            bail!(
                "{fault} on {cluster}: {}",
                r.text().await.unwrap_or_default()
            );
        }
        Ok(())
    }
}

impl Drop for System {
    fn drop(&mut self) {
        for (p, _) in &mut self.agents {
            p.kill9();
        }
        self.sim.kill9();
        for r in &mut self.roles {
            r.proc.kill9();
        }
    }
}

/// One durable consumer in `/jsz`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ConsumerState {
    /// Stream.
    pub stream: String,
    /// Durable name.
    pub name: String,
    /// Messages not yet delivered.
    pub num_pending: u64,
    /// Delivered, not acked.
    pub num_ack_pending: u64,
    /// Redeliveries.
    pub num_redelivered: u64,
    /// Acked through this stream sequence.
    pub ack_floor_stream_seq: u64,
}

/// The `/jsz` query: streams and consumers with their configuration (which says whether one is durable).
pub const JSZ: &str = "/jsz?accounts=true&streams=true&consumers=true&config=true";

/// Whether a `/jsz` consumer is durable (its configuration names it so).
pub fn is_durable(consumer: &serde_json::Value) -> bool {
    consumer["config"]["durable_name"]
        .as_str()
        .is_some_and(|d| !d.is_empty())
}

/// One stream in `/jsz`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamState {
    /// Name.
    pub name: String,
    /// Messages held.
    pub messages: u64,
    /// Last sequence (a counter of everything stored).
    pub last_seq: u64,
}

/// `/jsz` condensed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Jsz {
    /// Streams.
    pub streams: Vec<StreamState>,
    /// Consumers.
    pub consumers: Vec<ConsumerState>,
}

impl Jsz {
    /// Streams and durable consumers (ephemeral ones — ordered readers, KV watchers — come and go, and one
    /// left behind by a client that reconnected keeps a growing backlog until the server reaps it).
    fn from_json(v: &serde_json::Value) -> Self {
        let mut j = Jsz::default();
        let u = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        for acc in v["account_details"].as_array().into_iter().flatten() {
            for s in acc["stream_detail"].as_array().into_iter().flatten() {
                let name = s["name"].as_str().unwrap_or_default().to_string();
                j.streams.push(StreamState {
                    name: name.clone(),
                    messages: u(&s["state"]["messages"]),
                    last_seq: u(&s["state"]["last_seq"]),
                });
                for c in s["consumer_detail"].as_array().into_iter().flatten() {
                    if !is_durable(c) {
                        continue;
                    }
                    j.consumers.push(ConsumerState {
                        stream: name.clone(),
                        name: c["name"].as_str().unwrap_or_default().to_string(),
                        num_pending: u(&c["num_pending"]),
                        num_ack_pending: u(&c["num_ack_pending"]),
                        num_redelivered: u(&c["num_redelivered"]),
                        ack_floor_stream_seq: u(&c["ack_floor"]["stream_seq"]),
                    });
                }
            }
        }
        j
    }

    /// A stream by name.
    pub fn stream(&self, name: &str) -> Option<&StreamState> {
        self.streams.iter().find(|s| s.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsz_is_condensed() {
        let v = serde_json::json!({"account_details": [{"name": "$G", "stream_detail": [{
            "name": "FLEET_EVENTS", "state": {"messages": 10, "last_seq": 12},
            "consumer_detail": [{"name": "correlator-events", "num_pending": 3, "num_ack_pending": 1,
                                 "num_redelivered": 0, "ack_floor": {"stream_seq": 8},
                                 "config": {"durable_name": "correlator-events"}},
                                {"name": "ZLBEmOnv", "num_pending": 40, "config": {"deliver_policy": "all"}}]}]}]});
        let j = Jsz::from_json(&v);
        assert_eq!(j.consumers.len(), 1, "the ephemeral consumer is left out");
        assert_eq!(j.stream("FLEET_EVENTS").map(|s| s.last_seq), Some(12));
        assert_eq!(j.consumers[0].num_pending, 3);
        assert_eq!(j.consumers[0].ack_floor_stream_seq, 8);
    }

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("LS0tLS1C\nRUdJTg==").unwrap(), b"-----BEGIN");
        assert!(base64_decode("a*b").is_err());
    }
}
