//! Shared by the hub's integration tests: the real `multipilot` role processes (killed on drop), polling
//! with a deadline, the operator CLI, a local HTTP receiver that records what it is sent, the alert router
//! and the correlator each on its own nats-server, and the envelopes the tests publish to them.
// Every test file is its own crate and uses only part of this module.
#![allow(dead_code)]

pub mod system;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use async_nats::jetstream::{self, consumer};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use multipilot_bus::metrics::BusMetrics;
use multipilot_bus::publish::{Completion, Outgoing, Publisher, publish_one};
use multipilot_bus::topology::Topology;
use multipilot_schemas::payload::{
    ClusterFacts, ComplianceReport, Incident, IncidentStatus, KubeVersion, NodeCounts, Severity,
};
use multipilot_schemas::{Envelope, Payload, stable_id, subject};
use multipilot_testkit::{NatsServer, free_port};
use serde_json::Value;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The facts of a healthy 3-node cluster on Kubernetes 1.`minor` labelled `env=prod`, with no components.
pub fn facts(minor: u32) -> ClusterFacts {
    ClusterFacts {
        node_software: Vec::new(),
        version: KubeVersion {
            major: 1,
            minor,
            git_version: format!("v1.{minor}.2"),
            platform: "linux/amd64".into(),
        },
        api_versions: vec![],
        preferred_versions: Default::default(),
        nodes: NodeCounts {
            total: 3,
            ready: 3,
            control_plane: 1,
        },
        cni: None,
        coredns: None,
        ingress_controller: None,
        gpu_device_plugin: None,
        ingress_classes: vec![],
        storage_classes: vec![],
        default_storage_class: None,
        apiserver_cert_expiry: Some(Utc::now() + chrono::Duration::days(300)),
        gpus: vec![],
        labels: BTreeMap::from([("env".into(), "prod".into())]),
        scrape_interval_s: None,
    }
}

// ---------------------------------------------------------------------------------------------------------
// Processes.

/// A child process, killed (SIGKILL) and reaped on drop.
pub struct Proc(pub Child);

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Result<Proc> {
        Ok(Proc(cmd.spawn()?))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The real `multipilot <role>` on `nats_url`, keeping its data in `data` and appending its stderr to `log`;
/// its own HTTP listener on a free port. Callers add the role's settings and spawn it.
pub fn role(role: &str, nats_url: &str, data: &Path, log: &Path) -> Result<Command> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_multipilot"));
    cmd.arg(role)
        .env("MULTIPILOT_NATS__URL", nats_url)
        .env("MULTIPILOT_HTTP__LISTEN", "127.0.0.1:0")
        .env("MULTIPILOT_STORAGE__DATA_DIR", data)
        .stdout(Stdio::null())
        .stderr(log);
    Ok(cmd)
}

/// Runs an operator command (`multipilot <args>`) to its end; its stdout, or its stderr as the error.
pub fn cli(args: &[&str], env: &[(&str, &str)]) -> Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_multipilot"))
        .args(args)
        .envs(env.iter().copied())
        .output()?;
    if !out.status.success() {
        bail!(
            "multipilot {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

// ---------------------------------------------------------------------------------------------------------
// Waiting on conditions.

#[allow(unused_imports)] // each test binary uses some of the common module
pub use multipilot_testkit::wait::{eventually, eventually_every};

// ---------------------------------------------------------------------------------------------------------
// A local HTTP receiver that records what it is sent and can be told to fail.

/// One request the receiver accepted.
#[derive(Debug, Clone)]
pub struct Got {
    pub path: String,
    /// The `x-multipilot-notification-id` header.
    pub id: String,
    /// The JSON body (`Null` when it is not JSON).
    pub body: Value,
    pub at: Instant,
}

#[derive(Default)]
struct Sink {
    got: Mutex<Vec<Got>>,
    /// Answer this many requests with `fail_status` before succeeding again.
    fail_next: AtomicU32,
    /// 503 by default.
    fail_status: AtomicU32,
    /// Requests refused so far.
    refused: AtomicU32,
}

pub struct Receiver {
    sink: Arc<Sink>,
    /// `http://127.0.0.1:<port>`: any path under it is taken.
    pub url: String,
}

impl Receiver {
    pub async fn start() -> Result<Receiver> {
        let sink = Arc::new(Sink::default());
        sink.fail_status.store(503, Ordering::SeqCst);
        async fn take(
            State(s): State<Arc<Sink>>,
            uri: axum::http::Uri,
            headers: HeaderMap,
            body: axum::body::Bytes,
        ) -> StatusCode {
            if s.fail_next
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                s.refused.fetch_add(1, Ordering::SeqCst);
                return StatusCode::from_u16(s.fail_status.load(Ordering::SeqCst) as u16)
                    .unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            }
            let id = headers
                .get("x-multipilot-notification-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
            s.got.lock().unwrap().push(Got {
                path: uri.path().to_string(),
                id,
                body,
                at: Instant::now(),
            });
            StatusCode::OK
        }
        let app = axum::Router::new()
            .fallback(axum::routing::post(take))
            .with_state(sink.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Receiver { sink, url })
    }

    /// Everything accepted so far, in order.
    pub fn all(&self) -> Vec<Got> {
        self.sink.got.lock().unwrap().clone()
    }

    /// What was accepted on `path`.
    pub fn got(&self, path: &str) -> Vec<Got> {
        self.sink
            .got
            .lock()
            .unwrap()
            .iter()
            .filter(|g| g.path == path)
            .cloned()
            .collect()
    }

    /// Answers the next `n` requests with `status`.
    pub fn fail(&self, n: u32, status: u16) {
        self.sink
            .fail_status
            .store(u32::from(status), Ordering::SeqCst);
        self.sink.fail_next.store(n, Ordering::SeqCst);
    }

    /// Requests refused so far.
    pub fn refused(&self) -> u32 {
        self.sink.refused.load(Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------------------------------------------------
// The alert router process (`multipilot alerts`) on its own nats-server.

pub struct Router {
    pub nats: NatsServer,
    pub dir: tempfile::TempDir,
    child: Option<Proc>,
    /// The router's API, `http://127.0.0.1:<port>`.
    pub api: String,
    api_port: u16,
    pub js: jetstream::Context,
    pub client: async_nats::Client,
    seq: u64,
    /// More environment for the process.
    env: Vec<(String, String)>,
}

impl Drop for Router {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Router {
    pub async fn start(routing: &str) -> Result<Router> {
        Router::start_with(routing, &[]).await
    }

    pub async fn start_with(routing: &str, env: &[(&str, &str)]) -> Result<Router> {
        let nats = NatsServer::start().await?;
        let client = nats.client().await?;
        let js = jetstream::new(client.clone());
        Topology::embedded().provision(&js).await?;
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("routing.yaml"), routing)?;
        let api_port = free_port()?;
        let mut r = Router {
            nats,
            dir,
            child: None,
            api: format!("http://127.0.0.1:{api_port}"),
            api_port,
            js,
            client,
            seq: 0,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        r.spawn().await?;
        Ok(r)
    }

    /// The router's data directory.
    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Starts the process and waits until its API answers. The API's port was free when picked, but the
    /// hub's own listener (port 0) may be handed the same one first: then another port is tried.
    pub async fn spawn(&mut self) -> Result<()> {
        const TAKEN: &str = "Address already in use";
        for _ in 0..3 {
            let taken_before = self.log().matches(TAKEN).count();
            if self
                .spawn_once(|log| log.matches(TAKEN).count() > taken_before)
                .await?
            {
                return Ok(());
            }
            self.child = None;
            self.api_port = free_port()?;
            self.api = format!("http://127.0.0.1:{}", self.api_port);
        }
        bail!(
            "the alert router found no free port for its API\n{}",
            self.log()
        )
    }

    /// One start: `Ok(true)` once the API answers, `Ok(false)` when `port_taken` says the log shows the
    /// API's port was taken.
    async fn spawn_once(&mut self, port_taken: impl Fn(&str) -> bool) -> Result<bool> {
        let mut cmd = role(
            "alerts",
            &self.nats.url(),
            &self.data(),
            &self.dir.path().join("hub.log"),
        )?;
        cmd.env(
            "MULTIPILOT_ALERTS__ROUTING",
            self.dir.path().join("routing.yaml"),
        )
        .env(
            "MULTIPILOT_ALERTS__LISTEN",
            format!("127.0.0.1:{}", self.api_port),
        )
        .env("MULTIPILOT_ALERTS__TICK", "100ms")
        .env("RUST_LOG", "info,multipilot_alerts=debug")
        .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        self.child = Some(Proc::spawn(&mut cmd)?);
        let http = reqwest::Client::new();
        for _ in 0..150 {
            if let Ok(r) = http
                .get(format!("{}/api/v2/silences", self.api))
                .send()
                .await
                // answering: listed, or refused for want of a token when its auth is on
                && (r.status().is_success() || r.status().as_u16() == 401)
            {
                return Ok(true);
            }
            if port_taken(&self.log()) {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the alert router did not start\n{}", self.log())
    }

    /// kill -9.
    pub fn kill(&mut self) {
        self.child = None;
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("hub.log")).unwrap_or_default()
    }

    /// Publishes revision `revision` of the incident `kind` on `cluster`, as the correlator would.
    pub async fn incident(
        &mut self,
        cluster: &str,
        kind: &str,
        severity: Severity,
        status: IncidentStatus,
        revision: u64,
        labels: &[(&str, &str)],
    ) -> Result<()> {
        let now = Utc::now();
        let id = stable_id(&[cluster, kind]);
        let mut l: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        l.insert("cluster".into(), cluster.into());
        let inc = Incident {
            id: id.clone(),
            cluster: cluster.into(),
            kind: kind.into(),
            severity,
            status,
            summary: format!("{kind} on {cluster}"),
            opened_at: now - chrono::Duration::seconds(5),
            updated_at: now,
            resolved_at: (status == IncidentStatus::Resolved).then_some(now),
            ingest_time: Some(now),
            evidence: Vec::new(),
            labels: l,
            revision,
            acknowledged_by: None,
            blast_radius: None,
            explains: Vec::new(),
        };
        self.seq += 1;
        let env = Envelope::new(cluster, "correlator-test", now, self.seq, inc);
        publish_one(
            &self.js,
            subject::incident(cluster, kind),
            stable_id(&[&id, &revision.to_string()]),
            &env,
        )
        .await?;
        Ok(())
    }

    /// GET on the router's API.
    pub async fn get(&self, path: &str) -> Result<Value> {
        Ok(reqwest::get(format!("{}{path}", self.api))
            .await?
            .json()
            .await?)
    }

    /// The operator CLI pointed at this router.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        cli(args, &[("MULTIPILOT_ALERTS_URL", self.api.as_str())])
    }
}

// ---------------------------------------------------------------------------------------------------------
// The correlator process (`multipilot correlator`) on its own nats-server.

pub struct Correlator {
    pub nats: NatsServer,
    pub dir: tempfile::TempDir,
    pub child: Option<Proc>,
    /// More correlator instances (partitions), each with its data directory.
    pub others: Vec<Proc>,
    pub js: jetstream::Context,
    pub client: async_nats::Client,
    seq: u64,
}

impl Drop for Correlator {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Correlator {
    /// A nats-server with the streams, and the correlator answering on it.
    pub async fn start() -> Result<Correlator> {
        let mut hub = Correlator::on(NatsServer::start().await?).await?;
        hub.spawn()?;
        hub.wait_ready().await?;
        Ok(hub)
    }

    /// The streams provisioned on `nats`, no correlator process yet.
    pub async fn on(nats: NatsServer) -> Result<Correlator> {
        let client = nats.client().await?;
        let js = jetstream::new(client.clone());
        Topology::embedded().provision(&js).await?;
        Ok(Correlator {
            nats,
            dir: tempfile::tempdir()?,
            child: None,
            others: Vec::new(),
            js,
            client,
            seq: 0,
        })
    }

    /// The correlator's data directory.
    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("correlator.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Starts the process, without waiting for it.
    pub fn spawn(&mut self) -> Result<()> {
        let mut cmd = role(
            "correlator",
            &self.nats.url(),
            &self.data(),
            &self.log_path(),
        )?;
        cmd.env("MULTIPILOT_CORRELATOR__TICK_MS", "200");
        self.child = Some(Proc::spawn(&mut cmd)?);
        Ok(())
    }

    /// Waits until the correlator answers incident queries.
    pub async fn wait_ready(&self) -> Result<()> {
        for _ in 0..100 {
            if let Ok(Ok(_)) = tokio::time::timeout(
                Duration::from_millis(500),
                self.client
                    .request(multipilot_schemas::control::QUERY_INCIDENTS, "{}".into()),
            )
            .await
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the correlator did not answer\n{}", self.log())
    }

    /// kill -9 of every instance.
    pub fn kill(&mut self) {
        self.child = None;
        self.others.clear();
    }

    /// Publishes `payload` on `subject` as the agent of `cluster` would, at `cluster_time` in its clock.
    pub async fn send<T: Payload>(
        &mut self,
        subject: String,
        cluster: &str,
        cluster_time: DateTime<Utc>,
        payload: T,
    ) -> Result<()> {
        self.seq += 1;
        let env = Envelope::new(
            cluster,
            format!("agent/{cluster}"),
            cluster_time,
            self.seq,
            payload,
        );
        let id = stable_id(&[cluster, &self.seq.to_string(), &subject]);
        let mut p: Publisher<u64> = Publisher::new(self.js.clone(), 16, BusMetrics::default());
        p.send(self.seq, Outgoing::envelope(subject, id, &env)?)
            .await;
        for c in p.flush().await {
            anyhow::ensure!(matches!(c, Completion::Stored { .. }), "not stored: {c:?}");
        }
        Ok(())
    }

    /// Waits until the correlator has taken and acked everything of one of its consumers (FLEET_STATE and
    /// FLEET_FACTS keep one message per subject: a test that sends a value and then its successor waits
    /// for this in between, or the successor may replace the value before the correlator read it).
    pub async fn drained(&self, stream: &str, durable: &str) -> Result<()> {
        // a deadline, not a timing assertion: generous for a busy machine
        for _ in 0..300 {
            let mut c = self
                .js
                .get_stream(stream)
                .await?
                .get_consumer::<consumer::pull::Config>(durable)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let info = c.info().await?;
            if info.num_pending == 0 && info.num_ack_pending == 0 {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!("{durable} did not drain")
    }

    /// Every incident message so far, in stream order.
    pub async fn incidents(&self) -> Result<Vec<Incident>> {
        let s = self.js.get_stream("FLEET_INCIDENTS").await?;
        let mut c = s
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: "fleet.incident.>".into(),
                ..Default::default()
            })
            .await?;
        let total = c.info().await?.num_pending;
        let mut msgs = c.messages().await?;
        let mut out = Vec::new();
        while (out.len() as u64) < total {
            let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(2), msgs.next()).await
            else {
                break;
            };
            let m = m.map_err(|e| anyhow::anyhow!("{e}"))?;
            out.push(rmp_serde::from_slice::<Envelope<Incident>>(&m.payload)?.payload);
        }
        Ok(out)
    }

    /// The compliance reports the correlator holds.
    pub async fn compliance(&self) -> Result<Vec<ComplianceReport>> {
        Ok(serde_json::from_slice(
            &self
                .client
                .request(multipilot_schemas::control::QUERY_COMPLIANCE, "{}".into())
                .await?
                .payload,
        )?)
    }
}
