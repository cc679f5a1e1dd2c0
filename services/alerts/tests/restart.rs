//! The router's alerts across a crash: incidents are acked once taken in memory, and written at the
//! router's checkpoints (with the durable's ack floor as the store's mark) off that path; a router killed
//! before it wrote them takes them in again from FLEET_INCIDENTS when it starts, and does not notify
//! again what it had notified.

use std::path::Path;
use std::time::Duration;

use async_nats::jetstream;
use chrono::Utc;
use multipilot_alerts::Config;
use multipilot_bus::publish::publish_one;
use multipilot_bus::topology::Topology;
use multipilot_schemas::payload::{Incident, IncidentStatus, Severity};
use multipilot_schemas::{Envelope, stable_id, subject};
use multipilot_testkit::NatsServer;
use multipilot_testkit::wait::eventually;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const ROUTING: &str = r#"
route:
  receiver: out
  group_by: [cluster]
  group_wait: 100ms
  group_interval: 1h
  repeat_interval: 4h
receivers:
  - name: out
    nats_configs: [{}]
"#;

/// A router process stand-in: `run` in a task, with its own cancellation.
struct Running {
    cancel: CancellationToken,
    task: JoinHandle<std::result::Result<(), multipilot_alerts::Error>>,
}

impl Running {
    /// Starts the router on `dir`, once the previous one let go of the store: it ticks every `tick` and
    /// writes its alerts every `checkpoint`.
    async fn start(
        nats: &NatsServer,
        dir: &Path,
        tick: Duration,
        checkpoint: Duration,
    ) -> Result<Running> {
        std::fs::write(dir.join("routing.yaml"), ROUTING)?;
        let data = dir.join("data");
        eventually("the store free", 30, async || {
            multipilot_alerts::store::Store::open(&data.display().to_string(), 1 << 20)
                .ok()
                .map(drop)
        })
        .await?;
        let config = Config {
            data_dir: data.display().to_string(),
            routing: Some(dir.join("routing.yaml").display().to_string()),
            listen: "127.0.0.1:0".into(),
            tick,
            checkpoint,
            ..Default::default()
        };
        let cancel = CancellationToken::new();
        let ctx =
            multipilot_runtime::Context::new(nats.client().await?, "alerts-test", cancel.clone());
        let task = tokio::spawn(multipilot_alerts::run(config, ctx));
        Ok(Running { cancel, task })
    }

    /// kill -9: nothing of its shutdown runs (the API's server is stopped so the store can be opened again).
    async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
        self.cancel.cancel();
    }

    /// A clean stop.
    async fn stop(self) -> Result {
        self.cancel.cancel();
        self.task.await??;
        Ok(())
    }
}

async fn open_incident(js: &jetstream::Context, cluster: &str) -> Result {
    let now = Utc::now();
    let kind = "node-not-ready";
    let id = stable_id(&[cluster, kind]);
    let inc = Incident {
        id: id.clone(),
        cluster: cluster.into(),
        kind: kind.into(),
        severity: Severity::Warning,
        status: IncidentStatus::Open,
        summary: format!("{kind} on {cluster}"),
        opened_at: now,
        updated_at: now,
        resolved_at: None,
        ingest_time: Some(now),
        evidence: Vec::new(),
        labels: [("cluster".to_string(), cluster.to_string())].into(),
        revision: 1,
        acknowledged_by: None,
        blast_radius: None,
        explains: Vec::new(),
    };
    let env = Envelope::new(cluster, "correlator-test", now, 1, inc);
    publish_one(
        js,
        subject::incident(cluster, kind),
        format!("{id}-1"),
        &env,
    )
    .await?;
    Ok(())
}

/// Notifications published for the receiver `out`.
async fn notified(js: &jetstream::Context) -> Option<u64> {
    let mut s = js.get_stream("FLEET_ALERTS").await.ok()?;
    Some(s.info().await.ok()?.state.messages)
}

/// The clusters of the alerts the store holds (once the stopped router let go of it).
async fn stored_clusters(dir: &Path) -> Result<std::collections::BTreeSet<String>> {
    let data = dir.join("data").display().to_string();
    let store = eventually("the store free", 30, async || {
        multipilot_alerts::store::Store::open(&data, 1 << 20).ok()
    })
    .await?;
    Ok(
        multipilot_alerts::store::all::<multipilot_alerts::store::Alert>(&store.alerts)
            .into_iter()
            .filter_map(|(_, a)| a.labels.get("cluster").cloned())
            .collect(),
    )
}

/// Whether the durable `alerts` acked everything FLEET_INCIDENTS holds.
async fn all_acked(js: &jetstream::Context) -> Option<()> {
    let mut s = js.get_stream("FLEET_INCIDENTS").await.ok()?;
    let last = s.info().await.ok()?.state.last_sequence;
    let c = s.consumer_info("alerts").await.ok()?;
    (c.ack_floor.stream_sequence >= last && c.num_ack_pending == 0).then_some(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incident_acked_before_its_alert_was_written_is_taken_in_again_after_a_crash() -> Result
{
    let nats = NatsServer::start().await?;
    let js = jetstream::new(nats.client().await?);
    Topology::embedded().provision(&js).await?;
    let dir = tempfile::tempdir()?;

    const NEVER: Duration = Duration::from_secs(3600);
    const TICK: Duration = Duration::from_millis(100);
    // a tick that never comes after the first: incidents are acked but never written
    let r = Running::start(&nats, dir.path(), NEVER, NEVER).await?;
    open_incident(&js, "k00").await?;
    eventually("k00 acked", 30, async || all_acked(&js).await).await?;
    r.kill().await;
    assert_eq!(notified(&js).await, Some(0));

    // started again (a checkpoint at every tick), it takes k00 in again from the stream and notifies it
    let r = Running::start(&nats, dir.path(), TICK, Duration::ZERO).await?;
    eventually("k00 notified", 30, async || {
        (notified(&js).await? == 1).then_some(())
    })
    .await?;
    r.stop().await?;

    // after a clean restart it does not notify k00 again, while a new incident is notified; its alert is
    // in memory only (no checkpoint comes) when the router is killed
    let r = Running::start(&nats, dir.path(), TICK, NEVER).await?;
    open_incident(&js, "k01").await?;
    eventually("k01 notified", 30, async || {
        (notified(&js).await? >= 2).then_some(())
    })
    .await?;
    r.kill().await;
    assert!(
        !stored_clusters(dir.path()).await?.contains("k01"),
        "k01's alert was not checkpointed"
    );
    // a third restart: k01 is taken in again from the stream and not notified again (its notification
    // is in the log), a new incident is
    let r = Running::start(&nats, dir.path(), TICK, NEVER).await?;
    open_incident(&js, "k02").await?;
    eventually("k02 notified", 30, async || {
        (notified(&js).await? >= 3).then_some(())
    })
    .await?;
    r.stop().await?;
    // the clean stop wrote every alert, k01's taken in again included
    assert_eq!(
        stored_clusters(dir.path()).await?,
        ["k00", "k01", "k02"].map(String::from).into()
    );
    let mut s = js.get_stream("FLEET_ALERTS").await?;
    assert_eq!(
        s.info().await?.state.messages,
        3,
        "one notification per group"
    );
    Ok(())
}
