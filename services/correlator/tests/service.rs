//! The correlator role in-process against a real nats-server: probe results published as an agent publishes
//! them become an incident on `fleet.incident.>`, answered on the query subject and acknowledged through
//! the command subject; stopped and started again on the same store, it neither re-announces nor forgets
//! the incident. (The process-level drills — kill -9, partitions, a wiped store — run the `multipilot`
//! binary, in `services/multipilot/tests/`.)

use std::time::Duration;

use anyhow::{Context as _, Result};
use chrono::Utc;
use futures::StreamExt;
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use multipilot_bus::request::{gather_arrays, incident_command};
use multipilot_bus::topology::Topology;
use multipilot_schemas::control::{
    CommandOutcome, IncidentAction, IncidentCommand, QUERY_INCIDENTS,
};
use multipilot_schemas::payload::{Incident, IncidentStatus, ProbeResult, ProbeStatus};
use multipilot_schemas::{Envelope, stable_id, subject};
use multipilot_testkit::NatsServer;
use multipilot_testkit::wait::{eventually, until};
use tokio_util::sync::CancellationToken;

struct Running {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), multipilot_correlator::Error>>,
}

impl Running {
    async fn stop(self) -> Result<()> {
        self.cancel.cancel();
        Ok(self.task.await.context("correlator task")??)
    }
}

fn start(client: &async_nats::Client, dir: &std::path::Path) -> Running {
    let cancel = CancellationToken::new();
    let ctx = multipilot_runtime::Context::new(client.clone(), "correlator-0", cancel.clone());
    let config = multipilot_correlator::Config {
        data_dir: dir.to_string_lossy().into_owned(),
        tick_ms: 200,
        ..Default::default()
    };
    Running {
        cancel,
        task: tokio::spawn(multipilot_correlator::run(config, ctx)),
    }
}

async fn incidents(client: &async_nats::Client) -> Result<Vec<Incident>> {
    Ok(gather_arrays(
        client,
        QUERY_INCIDENTS,
        r#"{"all":true}"#.into(),
        Duration::from_secs(2),
    )
    .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_rounds_become_an_incident_that_is_queried_acknowledged_and_survives_a_restart()
-> Result<()> {
    let nats = NatsServer::start().await?;
    let client = nats.client().await?;
    let js = async_nats::jetstream::new(client.clone());
    Topology::embedded().provision(&js).await?;
    let dir = tempfile::tempdir()?;
    let mut published = client.subscribe("fleet.incident.>").await?;
    multipilot_testkit::wait::round_trip(&client).await?;
    let running = start(&client, dir.path());
    eventually("the correlator answers queries", 30, async || {
        incidents(&client).await.ok()
    })
    .await?;

    // five unhealthy etcd rounds, as the agent of c1 publishes them
    let mut publisher: Publisher<u64> = Publisher::new(
        js.clone(),
        16,
        multipilot_bus::metrics::BusMetrics::register(&mut Default::default()),
    );
    let t = Utc::now() - chrono::Duration::minutes(2);
    let mut completions = Vec::new();
    for round in 1..=5u64 {
        let p = ProbeResult {
            probe: "etcd".into(),
            status: ProbeStatus::Unhealthy,
            latency_ms: 3.0,
            detail: "etcd readiness check failed".into(),
            round,
            observations: Default::default(),
            findings: Vec::new(),
        };
        let env = Envelope::new(
            "c1",
            "agent/c1",
            t + chrono::Duration::seconds(15 * round as i64),
            round,
            p,
        );
        let id = stable_id(&["c1", "etcd", &round.to_string()]);
        let msg = Outgoing::envelope(subject::probe("c1", "etcd"), id, &env)?;
        completions.extend(publisher.send(round, msg).await);
    }
    completions.extend(publisher.flush().await);
    assert!(
        completions
            .iter()
            .all(|c| matches!(c, Completion::Stored { .. })),
        "{completions:?}"
    );

    // announced once on the incident stream, and answered on the query subject
    let first = tokio::time::timeout(Duration::from_secs(30), published.next())
        .await
        .context("no incident published")?
        .context("subscription ended")?;
    let announced: Envelope<Incident> = rmp_serde::from_slice(&first.payload)?;
    assert_eq!(first.subject.as_str(), "fleet.incident.c1.etcd-unhealthy");
    assert_eq!(announced.payload.revision, 1);
    let listed = incidents(&client).await?;
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert_eq!(listed[0].id, announced.payload.id);

    // acknowledged through the command subject
    let reply = incident_command(
        &client,
        &IncidentCommand {
            id: announced.payload.id.clone(),
            action: IncidentAction::Ack,
            actor: "otto".into(),
        },
        Duration::from_secs(5),
    )
    .await?;
    assert_eq!(reply.outcome, CommandOutcome::Done);
    let unknown = incident_command(
        &client,
        &IncidentCommand {
            id: "no-such-incident".into(),
            action: IncidentAction::Ack,
            actor: "otto".into(),
        },
        Duration::from_secs(5),
    )
    .await?;
    assert_eq!(unknown.outcome, CommandOutcome::NotFound);

    // stopped and started on the same store: the acknowledged incident is still there, nothing is
    // announced again (the durables' acked messages are not re-applied)
    running.stop().await?;
    let running = start(&client, dir.path());
    let again = until("the restarted correlator answers", 30, async || {
        Ok(incidents(&client).await.ok())
    })
    .await?;
    assert_eq!(again.len(), 1, "{again:#?}");
    assert_eq!(
        (
            again[0].status,
            again[0].revision,
            again[0].acknowledged_by.as_deref()
        ),
        (IncidentStatus::Acknowledged, 2, Some("otto"))
    );
    // nothing announced again: once the restarted correlator has acked everything it was delivered
    // (it publishes before it acks), FLEET_INCIDENTS holds the two revisions and nothing more
    let health = multipilot_bus::jetstream::Durable::shared("FLEET_HEALTH", "correlator-health");
    eventually("the restarted correlator caught up", 30, async || {
        health.caught_up(&js).await.then_some(())
    })
    .await?;
    let mut revisions = Vec::new();
    multipilot_bus::jetstream::read_history(
        &js,
        "FLEET_INCIDENTS",
        vec!["fleet.incident.>".into()],
        multipilot_bus::jetstream::Start::Oldest,
        |m| {
            if let Ok(env) = rmp_serde::from_slice::<Envelope<Incident>>(&m.message.payload) {
                revisions.push(env.payload.revision);
            }
        },
    )
    .await?;
    assert_eq!(
        revisions,
        vec![1, 2],
        "a restart announced the incident again"
    );
    running.stop().await?;
    Ok(())
}

async fn publish_rounds(
    js: &async_nats::jetstream::Context,
    cluster: &str,
    rounds: std::ops::RangeInclusive<u64>,
    status: ProbeStatus,
    t: chrono::DateTime<Utc>,
) -> Result<()> {
    let mut publisher: Publisher<u64> = Publisher::new(
        js.clone(),
        16,
        multipilot_bus::metrics::BusMetrics::register(&mut Default::default()),
    );
    let mut completions = Vec::new();
    for round in rounds {
        let p = ProbeResult {
            probe: "etcd".into(),
            status,
            latency_ms: 3.0,
            detail: format!("etcd round {round}"),
            round,
            observations: Default::default(),
            findings: Vec::new(),
        };
        let env = Envelope::new(
            cluster,
            format!("agent/{cluster}"),
            t + chrono::Duration::seconds(15 * round as i64),
            round,
            p,
        );
        let id = stable_id(&[cluster, "etcd", &round.to_string()]);
        let msg = Outgoing::envelope(subject::probe(cluster, "etcd"), id, &env)?;
        completions.extend(publisher.send(round, msg).await);
    }
    completions.extend(publisher.flush().await);
    anyhow::ensure!(
        completions
            .iter()
            .all(|c| matches!(c, Completion::Stored { .. })),
        "{completions:?}"
    );
    Ok(())
}

/// A process that received messages and died before making them durable: the next one applies them in
/// stream order when it starts, instead of getting them back after the ack wait, behind newer messages,
/// where the probe rounds would be taken as late and the failing streak lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_crashed_process_received_but_did_not_commit_is_applied_in_order() -> Result<()> {
    use async_nats::jetstream::consumer::pull;
    let nats = NatsServer::start().await?;
    let client = nats.client().await?;
    let js = async_nats::jetstream::new(client.clone());
    Topology::embedded().provision(&js).await?;
    let dir = tempfile::tempdir()?;
    // an initialized store
    let running = start(&client, dir.path());
    eventually("the correlator answers queries", 30, async || {
        incidents(&client).await.ok()
    })
    .await?;
    running.stop().await?;

    // five failing rounds reach the durable's client and are never acked (the process died), then three
    // healthy ones are stored
    let t = Utc::now() - chrono::Duration::minutes(5);
    publish_rounds(&js, "c1", 1..=5, ProbeStatus::Unhealthy, t).await?;
    let durable = js
        .get_stream("FLEET_HEALTH")
        .await?
        .get_consumer::<pull::Config>("correlator-health")
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut batch = durable
        .fetch()
        .max_messages(5)
        .messages()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut received = 0;
    while let Some(m) = batch.next().await {
        m.map_err(|e| anyhow::anyhow!("{e}"))?;
        received += 1;
    }
    assert_eq!(
        received, 5,
        "the dead process received the five failing rounds"
    );
    publish_rounds(&js, "c1", 6..=8, ProbeStatus::Healthy, t).await?;

    // the next process opens the incident (rounds 1-5) and resolves it (6-8): in stream order
    let running = start(&client, dir.path());
    let all = until("the incident opened and resolved", 60, async || {
        let all = incidents(&client).await.unwrap_or_default();
        Ok(all
            .iter()
            .any(|i| i.kind == "etcd-unhealthy" && i.status == IncidentStatus::Resolved)
            .then_some(all))
    })
    .await?;
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0].revision, 2, "opened once, resolved once: {all:#?}");
    running.stop().await?;
    Ok(())
}
