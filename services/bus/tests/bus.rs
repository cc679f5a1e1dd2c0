//! The bus against a real nats-server: provisioning, publishing, de-duplication, the consumer runner's
//! dead-lettering, retries and rate limits.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use async_nats::jetstream;
use chrono::Utc;
use futures::StreamExt;
use multipilot_bus::consume::{self, Handler, Outcome, Received, Runner};
use multipilot_bus::limit;
use multipilot_bus::metrics::BusMetrics;
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use multipilot_bus::topology::Topology;
use multipilot_schemas::payload::*;
use multipilot_schemas::{Envelope, Payload, catalog, subject};
use multipilot_testkit::NatsServer;
use tokio_util::sync::CancellationToken;

async fn setup() -> Result<(NatsServer, jetstream::Context)> {
    let server = NatsServer::start().await?;
    let js = jetstream::new(server.client().await?);
    Topology::embedded().provision(&js).await?;
    Ok((server, js))
}

/// Polls `f` until it is true or the deadline passes (a condition, not a timing assertion).
async fn wait_until(what: &str, deadline: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let every = Duration::from_millis(20);
    multipilot_testkit::wait::eventually_every(what, deadline.as_secs(), every, async || {
        f().then_some(())
    })
    .await
}

fn heartbeat(cluster: &str, seq: u64) -> Envelope<Heartbeat> {
    Envelope::new(
        cluster,
        format!("agent-{cluster}"),
        Utc::now(),
        seq,
        Heartbeat {
            interval_s: 5,
            agent_version: "test".into(),
            started_at: Utc::now(),
            outbox_depth: 0,
            dropped_metric_batches: 0,
            apiserver_reachable: true,
            superseded: 0,
            duplicates: 0,
        },
    )
}

fn hb_msg(cluster: &str, seq: u64) -> Outgoing {
    let env = heartbeat(cluster, seq);
    Outgoing::envelope(
        subject::heartbeat(cluster),
        format!("hb-{cluster}-{seq}"),
        &env,
    )
    .unwrap()
}

/// Publishes heartbeats `seqs` of `cluster` and waits until each is stored.
async fn publish_heartbeats(
    js: &jetstream::Context,
    cluster: &str,
    seqs: impl IntoIterator<Item = u64>,
) {
    let mut p = Publisher::new(js.clone(), 8, BusMetrics::default());
    for seq in seqs {
        p.send(seq, hb_msg(cluster, seq)).await;
    }
    p.flush().await;
}

/// A temporary durable on FLEET_HEALTH for one test.
async fn health_consumer(js: &jetstream::Context, durable: &str) -> Result<()> {
    js.get_stream("FLEET_HEALTH")
        .await?
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some(durable.into()),
            filter_subject: "fleet.hb.>".into(),
            max_deliver: -1,
            max_ack_pending: 20_000,
            ..Default::default()
        })
        .await?;
    Ok(())
}

#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<(String, u64, Instant)>>>,
    fail_first: Arc<Mutex<std::collections::HashSet<u64>>>,
}

impl Handler<Heartbeat> for Recorder {
    async fn handle(&mut self, msg: Received<Heartbeat>) -> Outcome {
        if self.fail_first.lock().unwrap().remove(&msg.envelope.seq) {
            return Outcome::Retry("dependency away".into());
        }
        self.seen.lock().unwrap().push((
            msg.envelope.cluster.clone(),
            msg.envelope.seq,
            Instant::now(),
        ));
        Outcome::Done
    }
}

fn runner(
    js: &jetstream::Context,
    durable: &str,
    rate: limit::Config,
    metrics: BusMetrics,
) -> Runner {
    Runner::new(
        js.clone(),
        consume::Config {
            stream: "FLEET_HEALTH".into(),
            durable: durable.into(),
            fetch_wait: Duration::from_millis(200),
            retry_initial: Duration::from_millis(50),
            rate,
            ..Default::default()
        },
        metrics,
    )
}

fn spawn_runner(r: Runner, mut h: Recorder) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    let task = tokio::spawn(async move {
        r.run(&mut h, c).await.expect("runner");
    });
    (cancel, task)
}

async fn round_trip<T: Payload + PartialEq + std::fmt::Debug>(
    js: &jetstream::Context,
    sample: &[u8],
    subj: String,
) -> Result<()> {
    let original: Envelope<T> =
        multipilot_schemas::decode(None, Some(&T::schema_header()), sample, usize::MAX)?;
    let mut publisher = Publisher::new(js.clone(), 16, BusMetrics::default());
    let msg = Outgoing::envelope(subj.clone(), format!("rt-{}", T::SCHEMA), &original)?;
    publisher.send((), msg).await;
    for c in publisher.flush().await {
        anyhow::ensure!(
            matches!(
                c,
                Completion::Stored {
                    duplicate: false,
                    ..
                }
            ),
            "{} not stored: {c:?}",
            T::SCHEMA
        );
    }
    let stream_name = Topology::embedded()
        .stream_for_subject(&subj)
        .context("no stream")?
        .name
        .clone();
    let raw = js
        .get_stream(&stream_name)
        .await?
        .get_last_raw_message_by_subject(&subj)
        .await?;
    let headers = raw.headers;
    assert_eq!(
        headers.get("Content-Type").map(|v| v.as_str()),
        Some("application/msgpack")
    );
    assert_eq!(
        headers.get("Multipilot-Schema").map(|v| v.to_string()),
        Some(T::schema_header())
    );
    assert_eq!(
        headers.get("Nats-Msg-Id").map(|v| v.to_string()),
        Some(format!("rt-{}", T::SCHEMA))
    );
    // Named MessagePack: the body is a map carrying the envelope's field names.
    let value = rmpv::decode::read_value(&mut &raw.payload[..])?;
    let map = value.as_map().context("body is not a map")?;
    assert!(
        map.iter().any(|(k, _)| k.as_str() == Some("payload")),
        "{}: fields not named",
        T::SCHEMA
    );
    let back: Envelope<T> = multipilot_schemas::decode(
        headers.get("Content-Type").map(|v| v.as_str()),
        headers.get("Multipilot-Schema").map(|v| v.as_str()),
        &raw.payload,
        1 << 20,
    )?;
    assert_eq!(back, original, "{} changed in transit", T::SCHEMA);
    Ok(())
}

#[tokio::test]
async fn every_payload_type_round_trips_through_jetstream() -> Result<()> {
    let (_server, js) = setup().await?;
    let mut done = 0;
    for entry in catalog::entries() {
        let s = &entry.sample;
        let subj = entry.subject.clone();
        match entry.name {
            "ResourceState" => round_trip::<ResourceState>(&js, s, subj).await?,
            "ResourceDeleted" => round_trip::<ResourceDeleted>(&js, s, subj).await?,
            "ResyncMarker" => round_trip::<ResyncMarker>(&js, s, subj).await?,
            "KubeEvent" => round_trip::<KubeEvent>(&js, s, subj).await?,
            "ProbeResult" => round_trip::<ProbeResult>(&js, s, subj).await?,
            "MetricBatch" => round_trip::<MetricBatch>(&js, s, subj).await?,
            "Heartbeat" => round_trip::<Heartbeat>(&js, s, subj).await?,
            "ClusterFacts" => round_trip::<ClusterFacts>(&js, s, subj).await?,
            "Incident" => round_trip::<Incident>(&js, s, subj).await?,
            "FleetIncident" => round_trip::<FleetIncident>(&js, s, subj).await?,
            "EventDigest" => round_trip::<EventDigest>(&js, s, subj).await?,
            "ComplianceReport" => round_trip::<ComplianceReport>(&js, s, subj).await?,
            "Notification" => round_trip::<Notification>(&js, s, subj).await?,
            "ReleaseCommand" => round_trip::<ReleaseCommand>(&js, s, subj).await?,
            "ReleaseResult" => round_trip::<ReleaseResult>(&js, s, subj).await?,
            "ReleaseEvent" => round_trip::<ReleaseEvent>(&js, s, subj).await?,
            "AuditRecord" => round_trip::<AuditRecord>(&js, s, subj).await?,
            "DeadLetter" => round_trip::<DeadLetter>(&js, s, subj).await?,
            other => anyhow::bail!("no round trip for {other}: add it here"),
        }
        done += 1;
    }
    assert_eq!(done, catalog::entries().len());
    Ok(())
}

#[tokio::test]
async fn provisioning_is_idempotent_and_updates_in_place() -> Result<()> {
    let (_server, js) = setup().await?;
    let topo = Topology::embedded();
    topo.provision(&js).await?;
    topo.provision(&js).await?;
    let mut changed = topo.clone();
    changed
        .streams
        .iter_mut()
        .find(|s| s.name == "FLEET_EVENTS")
        .unwrap()
        .max_age = Duration::from_secs(48 * 3600);
    changed.provision(&js).await?;
    let info = js.get_stream("FLEET_EVENTS").await?.info().await?.clone();
    assert_eq!(info.config.max_age, Duration::from_secs(48 * 3600));
    let names: Vec<String> = js
        .stream_names()
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    assert_eq!(names.len(), topo.streams.len());
    for c in &topo.consumers {
        js.get_stream(&c.stream)
            .await?
            .get_consumer::<jetstream::consumer::pull::Config>(&c.durable)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

#[tokio::test]
async fn replayed_message_is_dropped_by_its_msg_id() -> Result<()> {
    let (_server, js) = setup().await?;
    let mut p = Publisher::new(js.clone(), 8, BusMetrics::default());
    p.send(1, hb_msg("dup", 1)).await;
    p.send(2, hb_msg("dup", 1)).await; // the same message again: an outbox re-send after a lost ack
    p.send(3, hb_msg("dup", 2)).await;
    let done = p.flush().await;
    let dup: Vec<bool> = done
        .iter()
        .map(|c| match c {
            Completion::Stored { duplicate, .. } => *duplicate,
            Completion::Failed { error, .. } => panic!("{error}"),
        })
        .collect();
    assert_eq!(dup, vec![false, true, false]);
    let info = js.get_stream("FLEET_HEALTH").await?.info().await?.clone();
    assert_eq!(info.state.messages, 2);
    Ok(())
}

#[tokio::test]
async fn windowed_publisher_stores_everything_it_confirms() -> Result<()> {
    let (_server, js) = setup().await?;
    let mut p = Publisher::new(js.clone(), 256, BusMetrics::default());
    let n = 20_000u64;
    let mut stored = 0u64;
    for i in 0..n {
        for c in p.send(i, hb_msg("bulk", i)).await {
            assert!(
                matches!(
                    c,
                    Completion::Stored {
                        duplicate: false,
                        ..
                    }
                ),
                "{c:?}"
            );
            stored += 1;
        }
        assert!(p.in_flight() <= 256);
    }
    stored += p.flush().await.len() as u64;
    assert_eq!(stored, n);
    assert_eq!(
        js.get_stream("FLEET_HEALTH")
            .await?
            .info()
            .await?
            .state
            .messages,
        n
    );
    Ok(())
}

/// Sends `sig` to the server's process (`-STOP`: it reads nothing and answers nothing until `-CONT`).
fn signal(server: &NatsServer, sig: &str) -> Result<()> {
    let pid = server.pid().context("nats-server pid")?.to_string();
    let ok = std::process::Command::new("kill")
        .args([sig, &pid])
        .status()?
        .success();
    anyhow::ensure!(ok, "kill {sig} {pid}");
    Ok(())
}

/// Every one of `n` completions failed, saying `why`.
fn all_failed(done: &[Completion<u64>], n: u64, why: &str) {
    assert_eq!(done.len() as u64, n);
    for c in done {
        assert!(
            matches!(c, Completion::Failed { error, .. } if error.to_string().contains(why)),
            "{c:?}"
        );
    }
}

/// The same `n` messages of `cluster` sent again are stored (or recognised as stored).
async fn sent_again_are_stored(p: &mut Publisher<u64>, cluster: &str, n: u64) {
    for i in 0..n {
        p.send(i, hb_msg(cluster, i)).await;
    }
    let done = p.flush().await;
    assert!(
        done.iter().all(|c| matches!(c, Completion::Stored { .. })),
        "{done:?}"
    );
}

/// Acks that never come (the server stopped after the sends) fail within the ack timeout of their
/// sends, not one timeout after another as they are awaited in turn.
#[tokio::test]
async fn lost_acks_fail_together_within_the_timeout_of_their_send() -> Result<()> {
    let (server, js) = setup().await?;
    let timeout = Duration::from_secs(1);
    let mut p = Publisher::new(js.clone(), 64, BusMetrics::default()).with_ack_timeout(timeout);
    signal(&server, "-STOP")?;
    let n = 20u64;
    let started = Instant::now();
    for i in 0..n {
        assert!(p.send(i, hb_msg("lost", i)).await.is_empty());
    }
    let done = p.flush().await;
    let took = started.elapsed();
    signal(&server, "-CONT")?;
    all_failed(&done, n, "timed out");
    // awaited in turn with a fresh timeout each they would take n seconds
    assert!(
        took < timeout * 10,
        "{n} lost acks took {took:?} to fail with a {timeout:?} timeout"
    );
    // the server back, the same messages are stored (or recognised) on a re-send
    let mut p = Publisher::new(js.clone(), 64, BusMetrics::default());
    sent_again_are_stored(&mut p, "lost", n).await;
    Ok(())
}

/// Acks owed over a connection that was lost (the server killed with the messages unanswered, then back)
/// fail once the client has connected again, not at the end of their timeout.
#[tokio::test]
async fn acks_owed_over_a_lost_connection_fail_once_the_client_is_back() -> Result<()> {
    let (mut server, _) = setup().await?;
    let client = server.client().await?;
    let mut js = jetstream::new(client.clone());
    let long = Duration::from_secs(60);
    js.set_timeout(long);
    let mut p = Publisher::new(js.clone(), 256, BusMetrics::default()).with_ack_timeout(long);
    signal(&server, "-STOP")?;
    // many: failed one check apart (200 ms) they would take 40 s
    let n = 200u64;
    let stats = client.statistics();
    let out = || {
        stats
            .out_messages
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = out();
    for i in 0..n {
        assert!(p.send(i, hb_msg("reconnect", i)).await.is_empty());
    }
    // the messages written to the connection (the stopped server reads none), the server dies and
    // comes back
    wait_until("the messages written", Duration::from_secs(10), || {
        out() >= before + n
    })
    .await?;
    server.restart().await?;
    let started = Instant::now();
    let done = p.flush().await;
    let took = started.elapsed();
    all_failed(&done, n, "connection lost");
    assert!(
        took < long / 3,
        "the lost acks took {took:?} to fail (timeout {long:?})"
    );
    // sent again on the new connection, they are stored
    sent_again_are_stored(&mut p, "reconnect", n).await;
    Ok(())
}

#[tokio::test]
async fn garbage_is_dead_lettered_with_its_reason_and_valid_neighbours_are_processed() -> Result<()>
{
    let (_server, js) = setup().await?;
    health_consumer(&js, "t-dlq").await?;
    let client = js.client();
    let good = |seq| hb_msg("prod-1", seq);
    let mut p = Publisher::new(js.clone(), 8, BusMetrics::default());
    for seq in 1..=5 {
        p.send(seq, good(seq)).await;
    }
    p.flush().await;
    // Truncated MessagePack with valid headers.
    let mut bad = good(100);
    bad.payload = bad.payload.slice(..bad.payload.len() / 2);
    bad.msg_id = "bad-1".into();
    bad.headers.insert("Nats-Msg-Id", "bad-1");
    js.send_publish(
        bad.subject.clone(),
        jetstream::message::PublishMessage::build()
            .payload(bad.payload)
            .headers(bad.headers),
    )
    .await?
    .await?;
    // Plain garbage without any headers.
    js.publish(subject::heartbeat("prod-1"), "not msgpack at all".into())
        .await?
        .await?;
    // A schema version from the future.
    let mut future = good(101);
    future.headers.insert("Multipilot-Schema", "Heartbeat/9");
    future.headers.insert("Nats-Msg-Id", "bad-3");
    js.send_publish(
        future.subject.clone(),
        jetstream::message::PublishMessage::build()
            .payload(future.payload)
            .headers(future.headers),
    )
    .await?
    .await?;
    // A valid heartbeat of prod-2 published on prod-1's subject: one cluster speaking for another.
    let mut spoof = hb_msg("prod-2", 102);
    spoof.headers.insert("Nats-Msg-Id", "bad-4");
    js.send_publish(
        subject::heartbeat("prod-1"),
        jetstream::message::PublishMessage::build()
            .payload(spoof.payload)
            .headers(spoof.headers),
    )
    .await?
    .await?;
    for seq in 6..=10 {
        p.send(seq, good(seq)).await;
    }
    p.flush().await;

    let metrics = BusMetrics::default();
    let rec = Recorder::default();
    let (cancel, task) = spawn_runner(
        runner(&js, "t-dlq", limit::Config::default(), metrics.clone()),
        rec.clone(),
    );
    wait_until("10 valid messages", Duration::from_secs(20), || {
        rec.seen.lock().unwrap().len() >= 10
    })
    .await?;
    wait_until("4 dead letters", Duration::from_secs(20), || {
        ["decode", "schema", "version", "invalid"]
            .iter()
            .map(|r| metrics.dead_letters("t-dlq", r))
            .sum::<u64>()
            >= 4
    })
    .await?;
    cancel.cancel();
    task.await?;
    let mut seqs: Vec<u64> = rec.seen.lock().unwrap().iter().map(|s| s.1).collect();
    seqs.sort();
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>());

    // The dead letters are on fleet.dlq.FLEET_HEALTH with their reasons and the original bytes.
    let dlq = js.get_stream("FLEET_DLQ").await?;
    let consumer = dlq
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: None,
            ..Default::default()
        })
        .await?;
    let mut msgs = consumer.fetch().max_messages(10).messages().await?;
    let mut reasons = Vec::new();
    while let Some(m) = msgs.next().await {
        let m = m.map_err(|e| anyhow::anyhow!(e))?;
        let h = m.headers.clone().unwrap_or_default();
        let env: Envelope<DeadLetter> = multipilot_schemas::decode(
            h.get("Content-Type").map(|v| v.as_str()),
            h.get("Multipilot-Schema").map(|v| v.as_str()),
            &m.payload,
            1 << 20,
        )?;
        assert_eq!(m.subject.as_str(), "fleet.dlq.FLEET_HEALTH");
        assert_eq!(env.payload.consumer, "t-dlq");
        assert!(!env.payload.error.is_empty());
        reasons.push(env.payload.reason);
    }
    reasons.sort();
    assert_eq!(reasons, vec!["decode", "invalid", "schema", "version"]);
    drop(client);
    Ok(())
}

#[tokio::test]
async fn pulls_hand_over_in_stream_order_and_skipped_subjects_are_acked_unread() -> Result<()> {
    let (_server, js) = setup().await?;
    // no filter: the durable reads heartbeats and probe results, the role only heartbeats
    js.get_stream("FLEET_HEALTH")
        .await?
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("t-skip".into()),
            max_deliver: -1,
            ..Default::default()
        })
        .await?;
    let mut p = Publisher::new(js.clone(), 64, BusMetrics::default());
    // more than several pulls' worth (batch 50 below), a probe result between every 10 heartbeats
    for seq in 1..=1_000u64 {
        p.send(seq, hb_msg("prod-1", seq)).await;
        if seq % 10 == 0 {
            let mut probe = hb_msg("prod-1", seq);
            probe.subject = subject::probe("prod-1", "dns");
            probe.msg_id = format!("probe-{seq}");
            probe.headers.insert("Nats-Msg-Id", probe.msg_id.as_str());
            probe.headers.insert("Multipilot-Schema", "ProbeResult/1");
            p.send(10_000 + seq, probe).await;
        }
    }
    p.flush().await;

    let metrics = BusMetrics::default();
    let rec = Recorder::default();
    let r = Runner::new(
        js.clone(),
        consume::Config {
            stream: "FLEET_HEALTH".into(),
            durable: "t-skip".into(),
            batch: 50,
            fetch_wait: Duration::from_millis(200),
            skip: vec!["fleet.probe.>".into()],
            ..Default::default()
        },
        metrics.clone(),
    );
    let (cancel, task) = spawn_runner(r, rec.clone());
    let mut stream = js.get_stream("FLEET_HEALTH").await?;
    let last = stream.info().await?.state.last_sequence;
    for _ in 0..200 {
        let c = stream.consumer_info("t-skip").await?;
        if c.ack_floor.stream_sequence >= last && c.num_ack_pending == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cancel.cancel();
    task.await?;
    let c = stream.consumer_info("t-skip").await?;
    assert_eq!(c.ack_floor.stream_sequence, last, "everything acked");
    let seqs: Vec<u64> = rec.seen.lock().unwrap().iter().map(|s| s.1).collect();
    assert_eq!(seqs, (1..=1_000).collect::<Vec<_>>(), "in stream order");
    assert_eq!(metrics.consumed_count("t-skip", "skipped"), 100);
    assert_eq!(metrics.dead_letters("t-skip", "schema"), 0);
    Ok(())
}

#[tokio::test]
async fn a_caught_up_consumer_takes_a_trickle_in_one_pull_per_commit_interval() -> Result<()> {
    let (_server, js) = setup().await?;
    health_consumer(&js, "t-pace").await?;
    let rec = Recorder::default();
    // commit_within 100 ms (the default); pulls of 5, which the trickle below fills before they expire
    // (a full pull alone does not mean a backlog)
    let r = Runner::new(
        js.clone(),
        consume::Config {
            stream: "FLEET_HEALTH".into(),
            durable: "t-pace".into(),
            batch: 5,
            fetch_wait: Duration::from_millis(500),
            ..Default::default()
        },
        BusMetrics::default(),
    );
    let (cancel, task) = spawn_runner(r, rec.clone());
    // a trickle the consumer keeps up with: one heartbeat stored every ~30 ms
    const N: u64 = 60;
    let mut p = Publisher::new(js.clone(), 8, BusMetrics::default());
    for seq in 1..=N {
        p.send(seq, hb_msg("c", seq)).await;
        p.flush().await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    wait_until("all handled", Duration::from_secs(20), || {
        rec.seen.lock().unwrap().len() as u64 >= N
    })
    .await?;
    cancel.cancel();
    task.await?;
    let seen = rec.seen.lock().unwrap().clone();
    let seqs: Vec<u64> = seen.iter().map(|s| s.1).collect();
    assert_eq!(
        seqs,
        (1..=N).collect::<Vec<_>>(),
        "in stream order, once each"
    );
    // messages handled together (within 10 ms of the one before) came in one pull, taken at most every
    // 100 ms: ~3 a pull. Handed over one by one as they were stored, each would be alone (30 ms apart, or
    // more on a busy machine: the bound follows the time the trickle took)
    let groups = 1 + seen
        .windows(2)
        .filter(|w| w[1].2 - w[0].2 > Duration::from_millis(10))
        .count();
    let took = seen[seen.len() - 1].2 - seen[0].2;
    let bound = (took.as_secs_f64() / 0.1 * 1.5) as usize + 3;
    assert!(
        groups <= bound,
        "{N} messages stored ≥ 30 ms apart over {took:?} were handled in {groups} groups (at most {bound} \
         expected, one per 100 ms): not taken together"
    );
    Ok(())
}

#[tokio::test]
async fn retryable_failure_is_redelivered_not_lost() -> Result<()> {
    let (_server, js) = setup().await?;
    health_consumer(&js, "t-retry").await?;
    publish_heartbeats(&js, "c", 1..=5).await;
    let rec = Recorder::default();
    rec.fail_first.lock().unwrap().extend([2, 4]);
    let metrics = BusMetrics::default();
    let (cancel, task) = spawn_runner(
        runner(&js, "t-retry", limit::Config::default(), metrics.clone()),
        rec.clone(),
    );
    wait_until("all 5 handled", Duration::from_secs(20), || {
        rec.seen.lock().unwrap().len() >= 5
    })
    .await?;
    cancel.cancel();
    task.await?;
    assert_eq!(metrics.consumed_count("t-retry", "retry"), 2);
    let mut seqs: Vec<u64> = rec.seen.lock().unwrap().iter().map(|s| s.1).collect();
    seqs.sort();
    assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
    Ok(())
}

/// A handler that says `Done` at once and learns only at its commit that some messages failed (as the
/// TSDB's writer thread does): heartbeats `fail_first` fail once.
#[derive(Clone, Default)]
struct Deferring {
    handled: Arc<Mutex<Vec<u64>>>,
    fail_first: Arc<Mutex<std::collections::HashSet<u64>>>,
    failed: Vec<(u64, Outcome)>,
}

impl Handler<Heartbeat> for Deferring {
    async fn handle(&mut self, msg: Received<Heartbeat>) -> Outcome {
        self.handled.lock().unwrap().push(msg.envelope.seq);
        if self.fail_first.lock().unwrap().remove(&msg.envelope.seq) {
            self.failed
                .push((msg.stream_seq, Outcome::Retry("the write failed".into())));
        }
        Outcome::Done
    }

    fn deferred_outcomes(&mut self) -> Vec<(u64, Outcome)> {
        std::mem::take(&mut self.failed)
    }
}

#[tokio::test]
async fn a_failure_found_at_the_commit_redelivers_that_message_and_acks_the_rest() -> Result<()> {
    let (_server, js) = setup().await?;
    health_consumer(&js, "t-deferred").await?;
    publish_heartbeats(&js, "c", 1..=5).await;
    let mut handler = Deferring::default();
    handler.fail_first.lock().unwrap().extend([2, 4]);
    let handled = handler.handled.clone();
    let metrics = BusMetrics::default();
    let r = runner(&js, "t-deferred", limit::Config::default(), metrics.clone());
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move { r.run(&mut handler, cancel).await.expect("runner") }
    });
    wait_until(
        "the two failed ones handled again",
        Duration::from_secs(20),
        || handled.lock().unwrap().len() >= 7,
    )
    .await?;
    wait_until("all acked", Duration::from_secs(20), || {
        metrics.consumed_count("t-deferred", "done") >= 5
    })
    .await?;
    cancel.cancel();
    task.await?;
    let mut seqs = handled.lock().unwrap().clone();
    seqs.sort();
    assert_eq!(
        seqs,
        vec![1, 2, 2, 3, 4, 4, 5],
        "only the failed ones came again"
    );
    assert_eq!(metrics.consumed_count("t-deferred", "retry"), 2);
    assert_eq!(metrics.consumed_count("t-deferred", "done"), 5);
    Ok(())
}

#[tokio::test]
async fn rate_limiter_holds_a_flood_to_the_configured_rate() -> Result<()> {
    let (_server, js) = setup().await?;
    health_consumer(&js, "t-rate").await?;
    let (rate, burst, n) = (200u32, 20u32, 1_000u64);
    let mut p = Publisher::new(js.clone(), 256, BusMetrics::default());
    for seq in 0..n {
        p.send(seq, hb_msg("flood", seq)).await;
    }
    p.flush().await;
    let rec = Recorder::default();
    let cfg = limit::Config {
        per_second: rate,
        burst,
        ..Default::default()
    };
    let (cancel, task) = spawn_runner(
        runner(&js, "t-rate", cfg, BusMetrics::default()),
        rec.clone(),
    );
    wait_until("the flood to be handled", Duration::from_secs(60), || {
        rec.seen.lock().unwrap().len() as u64 >= n
    })
    .await?;
    cancel.cancel();
    task.await?;
    let mut times: Vec<Instant> = rec.seen.lock().unwrap().iter().map(|s| s.2).collect();
    times.sort();
    // Judged on counts: after the initial burst, the n - burst messages that followed took at least as long
    // as the rate allows (the limiter can only be slower, never faster, than configured).
    let after_burst = &times[burst as usize..];
    let span = after_burst
        .last()
        .unwrap()
        .duration_since(after_burst[0])
        .as_secs_f64();
    let observed = (after_burst.len() - 1) as f64 / span;
    assert!(
        observed <= rate as f64 * 1.10,
        "observed {observed:.1}/s > {rate}/s + 10%"
    );
    assert!(
        observed >= rate as f64 * 0.90,
        "observed {observed:.1}/s < {rate}/s - 10%"
    );
    // And no one-second window holds more than a second's worth plus the burst.
    for (i, t) in times.iter().enumerate() {
        let in_window = times[i..]
            .iter()
            .take_while(|u| u.duration_since(*t) < Duration::from_secs(1))
            .count();
        assert!(
            in_window as u32 <= rate + burst,
            "{in_window} messages within one second"
        );
    }
    Ok(())
}

#[tokio::test]
async fn one_flooding_cluster_does_not_starve_the_others() -> Result<()> {
    let (_server, js) = setup().await?;
    health_consumer(&js, "t-fair").await?;
    let mut p = Publisher::new(js.clone(), 256, BusMetrics::default());
    for seq in 0..400 {
        p.send(seq, hb_msg("noisy", seq)).await;
    }
    for seq in 0..20 {
        p.send(1000 + seq, hb_msg("quiet", seq)).await;
    }
    p.flush().await;
    let rec = Recorder::default();
    let cfg = limit::Config {
        per_key_per_second: 100,
        per_key_burst: 10,
        ..Default::default()
    };
    let (cancel, task) = spawn_runner(
        runner(&js, "t-fair", cfg, BusMetrics::default()),
        rec.clone(),
    );
    wait_until(
        "the quiet cluster's 20 messages",
        Duration::from_secs(30),
        || {
            rec.seen
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s.0 == "quiet")
                .count()
                >= 20
        },
    )
    .await?;
    let noisy_done = rec
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.0 == "noisy")
        .count();
    // The quiet cluster, published after the whole flood, got through while most of the flood still waits.
    assert!(
        noisy_done < 300,
        "quiet cluster waited behind {noisy_done} of 400 noisy messages"
    );
    wait_until("the whole flood", Duration::from_secs(60), || {
        rec.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.0 == "noisy")
            .count()
            >= 400
    })
    .await?;
    cancel.cancel();
    task.await?;
    Ok(())
}

#[test]
fn shipped_nats_configs_are_valid() -> Result<()> {
    let bin = multipilot_testkit::nats_server_bin()?;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nats");
    for conf in [
        "dev.conf",
        "cluster-n1.conf",
        "cluster-n2.conf",
        "cluster-n3.conf",
    ] {
        let mut cmd = std::process::Command::new(&bin);
        cmd.current_dir(&dir).args(["-t", "-c", conf]);
        for who in [
            "AGENT_PROD_1",
            "CORRELATOR",
            "TSDB",
            "ALERTS",
            "RELEASE",
            "CONSOLE",
            "OPERATOR",
            "ADMIN",
            "SYS",
        ] {
            cmd.env(format!("MULTIPILOT_{who}_PASSWORD"), "test-only");
        }
        let out = cmd.output()?;
        assert!(
            out.status.success(),
            "{conf}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_reads_the_last_per_subject_then_live_and_resumes_after_the_server_restarts()
-> Result<()> {
    use multipilot_bus::follow::{Followed, Follower, Next, Replay};
    let (mut server, js) = setup().await?;
    // a heartbeat as an agent publishes it (the contract's headers); its stream sequence
    let publish = async |js: &jetstream::Context, c: &str, seq: u64| -> Result<u64> {
        let m = hb_msg(c, seq);
        Ok(js
            .publish_with_headers(m.subject, m.headers, m.payload)
            .await?
            .await?
            .sequence)
    };
    // three heartbeats of a, two of b: the follower starts with a's third and b's second
    for (c, seq) in [("a", 1), ("a", 2), ("b", 1), ("a", 3), ("b", 2)] {
        publish(&js, c, seq).await?;
    }
    // an empty stream: caught up at once
    let mut empty = Follower::new(js.clone(), "FLEET_FACTS", ["fleet.facts.>"], Replay::All);
    let first = tokio::time::timeout(Duration::from_secs(30), empty.next()).await?;
    assert!(matches!(first, Next::CaughtUp), "{first:?}");
    let mut f = Follower::new(
        js.clone(),
        "FLEET_HEALTH",
        ["fleet.hb.>"],
        Replay::LastPerSubject,
    );
    let next_of = async |f: &mut Follower| -> Result<Next> {
        tokio::time::timeout(Duration::from_secs(30), f.next())
            .await
            .context("nothing from the follower")
    };
    let next = async |f: &mut Follower| -> Result<Followed> {
        match next_of(f).await? {
            Next::Message(m) => Ok(m),
            Next::CaughtUp => anyhow::bail!("caught up where a message was due"),
        }
    };
    let mut read = Vec::new();
    for _ in 0..2 {
        let m = next(&mut f).await?;
        let hb = m.decode::<Heartbeat>()?;
        read.push((m.stream_seq, hb.cluster, hb.seq));
    }
    assert_eq!(
        read,
        [(4, "a".to_string(), 3), (5, "b".to_string(), 2)],
        "the last per subject, in stream order"
    );
    assert!(f.caught_up());
    assert!(matches!(next_of(&mut f).await?, Next::CaughtUp));
    // live
    let stored = publish(&js, "b", 3).await?;
    let live = next(&mut f).await?;
    assert_eq!(
        (live.stream_seq, live.decode::<Heartbeat>()?.seq),
        (stored, 3)
    );
    // the server restarts (its store kept): the follower creates its consumer again and goes on after
    // what it returned — no message twice, none skipped
    server.restart().await?;
    let stored = multipilot_testkit::wait::until("the restarted server to store", 30, async || {
        Ok(publish(&js, "a", 4).await.ok())
    })
    .await?;
    let after = next(&mut f).await?;
    assert_eq!(
        (after.stream_seq, after.decode::<Heartbeat>()?.seq),
        (stored, 4),
        "resumed after sequence {}",
        live.stream_seq
    );
    Ok(())
}

#[tokio::test]
async fn a_request_nobody_listens_to_is_no_answer_at_once_not_an_empty_one() -> Result<()> {
    let server = NatsServer::start().await?;
    let client = server.client().await?;
    let asked = Instant::now();
    let got = multipilot_bus::request::gather_arrays::<serde_json::Value>(
        &client,
        "fleet.query.nobody",
        bytes::Bytes::from_static(b"{}"),
        Duration::from_secs(30),
    )
    .await;
    match got {
        Err(multipilot_bus::request::CallError::Gather(
            multipilot_bus::request::Error::NoAnswer { .. },
        )) => {}
        other => anyhow::bail!("expected no answer, got {other:?}"),
    }
    // the server said so: the deadline was not waited out
    assert!(asked.elapsed() < Duration::from_secs(30));
    Ok(())
}
