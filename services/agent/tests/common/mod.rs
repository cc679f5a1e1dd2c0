//! Shared by the agent's integration tests: a real nats-server, the fleet simulator in-process (1.24 and
//! 1.31), the real `multipilot-agent` binary, and readers of the streams.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use multipilot_bus::topology::Topology;
use multipilot_schemas::Envelope;
use multipilot_sim::fleet::{self, Fleet};
use multipilot_testkit::NatsServer;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub struct Harness {
    pub nats: NatsServer,
    pub fleet: Arc<Fleet>,
    sim_cancel: CancellationToken,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
    agent: Option<Child>,
    runs: usize,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(mut a) = self.agent.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
        self.sim_cancel.cancel();
    }
}

/// The `multipilot-agent` binary of this build: cargo's path when testing the agent's own crate, else the
/// one beside the test executable's `deps/` directory (the hub crate's tests, which run the agent with
/// other roles; `cargo test --workspace` builds it).
pub fn agent_bin() -> PathBuf {
    if let Some(p) = option_env!("CARGO_BIN_EXE_multipilot-agent") {
        return PathBuf::from(p);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("multipilot-agent")))
        .unwrap_or_else(|| PathBuf::from("multipilot-agent"))
}

pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures")
}

/// A topology that keeps every message (the accounting needs each one, not only the last per subject);
/// with `short_event_dedup`, a one-second duplicate window on events, so an occurrence the agent sent
/// twice would be stored twice and seen.
pub fn test_topology(short_event_dedup: bool) -> Topology {
    let mut t = Topology::embedded();
    for s in &mut t.streams {
        s.max_msgs_per_subject = -1;
        if s.name == "FLEET_EVENTS" && short_event_dedup {
            s.duplicate_window = Duration::from_secs(1);
        }
    }
    t
}

pub async fn harness(churn: f64, lease_duration_s: u32) -> Result<Harness> {
    harness_with(churn, lease_duration_s, false).await
}

pub async fn harness_with(
    churn: f64,
    lease_duration_s: u32,
    short_event_dedup: bool,
) -> Result<Harness> {
    let nats = NatsServer::start().await?;
    let js = jetstream::new(nats.client().await?);
    test_topology(short_event_dedup).provision(&js).await?;
    let mut fixtures = BTreeMap::new();
    for f in [
        "node-exporter",
        "kube-state-metrics-v1.35",
        "prometheus-alltypes",
    ] {
        let text = std::fs::read_to_string(fixture_dir().join(format!("metrics/{f}.prom")))?;
        fixtures.insert(f.to_string(), Arc::new(text));
    }
    let cfg = fleet::Config {
        clusters: 2,
        versions: vec!["1.24".into(), "1.31".into()],
        names: vec!["old-124".into(), "new-131".into()],
        objects: 250,
        churn,
        metric_fixtures: fixtures,
        lease_duration_s,
        ..Default::default()
    };
    let sim_cancel = CancellationToken::new();
    let fleet = Arc::new(Fleet::start(&cfg, sim_cancel.clone()).await?);
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig.yaml");
    fleet.write_kubeconfig(&kubeconfig)?;
    Ok(Harness {
        nats,
        fleet,
        sim_cancel,
        kubeconfig,
        dir,
        agent: None,
        runs: 0,
    })
}

impl Harness {
    pub fn start_agent(&mut self) -> Result<()> {
        self.runs += 1;
        let log = std::fs::File::create(self.dir.path().join(format!("agent-{}.log", self.runs)))?;
        let child = Command::new(agent_bin())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--cluster", "old-124", "--cluster", "new-131"])
            .env("MULTIPILOT_AGENT__NATS__URL", self.nats.url())
            .env(
                "MULTIPILOT_AGENT__OUTBOX__PATH",
                self.dir.path().join("outbox"),
            )
            .env("MULTIPILOT_AGENT__HTTP__LISTEN", "127.0.0.1:0")
            .env("MULTIPILOT_AGENT__PROBES__INTERVAL_S", "1")
            .env("MULTIPILOT_AGENT__SCRAPE__INTERVAL_S", "2")
            .env("MULTIPILOT_AGENT__TIMINGS__HEARTBEAT_INTERVAL_S", "1")
            .env("MULTIPILOT_AGENT__TIMINGS__DISCOVERY_INTERVAL_S", "5")
            .env("RUST_LOG", "info,multipilot_agent=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting multipilot-agent")?;
        self.agent = Some(child);
        Ok(())
    }

    pub fn kill_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            let _ = a.kill(); // SIGKILL
            let _ = a.wait();
        }
    }

    /// SIGTERM: the agent stops collecting, writes a last heartbeat and drains.
    pub fn stop_agent(&mut self) -> Result<()> {
        if let Some(mut a) = self.agent.take() {
            Command::new("kill")
                .arg("-TERM")
                .arg(a.id().to_string())
                .status()?;
            let status = a.wait()?;
            anyhow::ensure!(
                status.success(),
                "agent exited with {status}\n{}",
                self.agent_log()
            );
        }
        Ok(())
    }

    pub fn agent_log(&self) -> String {
        let mut out = String::new();
        for i in 1..=self.runs {
            let text = std::fs::read_to_string(self.dir.path().join(format!("agent-{i}.log")))
                .unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            out.push_str(&format!(
                "--- agent run {i} ---\n{}\n",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        out
    }

    pub fn cluster(&self, name: &str) -> Arc<multipilot_sim::cluster::Cluster> {
        self.fleet.get(name).cloned().expect("cluster")
    }

    pub async fn js(&self) -> Result<jetstream::Context> {
        Ok(jetstream::new(self.nats.client().await?))
    }
}

/// Every message of a stream: (subject, envelope).
pub async fn read_stream(
    js: &jetstream::Context,
    stream: &str,
) -> Result<Vec<(String, Envelope<Value>)>> {
    let s = js.get_stream(stream).await?;
    let total = s.cached_info().state.messages;
    let c = s
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await?;
    let mut msgs = c.messages().await?;
    let mut out = Vec::new();
    while (out.len() as u64) < total {
        let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(5), msgs.next()).await else {
            break;
        };
        let m = m.map_err(|e| anyhow::anyhow!("{e}"))?;
        let env: Envelope<Value> =
            rmp_serde::from_slice(&m.payload).context("decoding an envelope")?;
        out.push((m.subject.to_string(), env));
    }
    Ok(out)
}

/// Polls `f` until it is true.
pub async fn eventually<F, Fut>(what: &str, secs: u64, mut f: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    until(what, secs, || {
        let fut = f();
        async move { Ok(fut.await?.then_some(())) }
    })
    .await
}

/// Polls `f` until it yields a value.
pub async fn until<T, F, Fut>(what: &str, secs: u64, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    multipilot_testkit::wait::until_every(what, secs, Duration::from_millis(300), async || {
        f().await
    })
    .await
}
