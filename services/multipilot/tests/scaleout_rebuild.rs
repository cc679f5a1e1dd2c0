//! Scale-out and rebuild against a real nats-server and the real `multipilot` processes: two TSDB
//! partitions store every batch once between them and either answers for the whole fleet; a TSDB and a
//! correlator whose data directory is wiped rebuild from the streams.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use async_nats::jetstream;
use chrono::{DateTime, TimeZone, Utc};
use common::{Correlator, Proc, facts};
use multipilot_bus::metrics::BusMetrics;
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use multipilot_bus::topology::Topology;
use multipilot_schemas::payload::*;
use multipilot_schemas::{Envelope, subject};
use multipilot_testkit::{NatsServer, free_port};
use multipilot_tsdb::federate::{SelectRequest, WireMatcher, WireSeries};

fn tsdb(
    nats: &str,
    data: &Path,
    listen: u16,
    partition: Option<(u32, u16)>,
    log: &Path,
) -> Result<Proc> {
    let mut cmd = common::role("tsdb", nats, data, log)?;
    cmd.env("MULTIPILOT_TSDB__LISTEN", format!("127.0.0.1:{listen}"));
    if let Some((k, peer)) = partition {
        cmd.env("MULTIPILOT_TSDB__PARTITIONS", "2")
            .env("MULTIPILOT_TSDB__PARTITION", k.to_string())
            .env(
                "MULTIPILOT_TSDB__PEERS",
                format!("[\"http://127.0.0.1:{peer}\"]"),
            );
    }
    Proc::spawn(&mut cmd)
}

/// A minute-aligned time an hour ago (well inside FLEET_METRICS' 6 h and the store's retention).
fn t0() -> i64 {
    (Utc::now().timestamp_millis() - 3_600_000) / 60_000 * 60_000
}

/// Batch `index` of `cluster`: one sample of `scaleout_requests{cluster, pod}` per pod, value
/// `cluster_no * 100 + pod`, at `t0 + index * 30s`.
fn batch(t0: i64, cluster_no: usize, index: i64, pods: usize) -> MetricBatch {
    MetricBatch {
        job: "app".into(),
        instance: "i1".into(),
        families: Vec::new(),
        samples: (0..pods)
            .map(|p| Sample {
                name: "scaleout_requests".into(),
                labels: BTreeMap::from([("pod".to_string(), p.to_string())]),
                value: (cluster_no * 100 + p) as f64,
                timestamp_ms: t0 + index * 30_000,
            })
            .collect(),
        rejected_lines: 0,
    }
}

async fn publish_metrics(
    js: &jetstream::Context,
    t0: i64,
    clusters: &[String],
    batches: i64,
    pods: usize,
) -> Result<()> {
    let mut publisher = Publisher::new(js.clone(), 64, BusMetrics::default());
    let mut done = Vec::new();
    for (n, c) in clusters.iter().enumerate() {
        for i in 0..batches {
            let env = Envelope::new(
                c.as_str(),
                format!("agent-{c}"),
                Utc.timestamp_millis_opt(t0 + i * 30_000)
                    .single()
                    .context("time")?,
                i as u64 + 1,
                batch(t0, n, i, pods),
            );
            let msg = Outgoing::envelope(subject::metrics(c), format!("m-{c}-{i}"), &env)?;
            done.extend(publisher.send((), msg).await);
        }
    }
    done.extend(publisher.flush().await);
    for c in done {
        anyhow::ensure!(matches!(c, Completion::Stored { .. }), "not stored: {c:?}");
    }
    Ok(())
}

/// The series one instance holds itself (its internal endpoint answers from the local store only).
async fn local_series(http: &reqwest::Client, port: u16) -> Result<Vec<WireSeries>> {
    let req = SelectRequest {
        matchers: vec![vec![WireMatcher {
            name: "__name__".into(),
            op: "=".into(),
            value: "scaleout_requests".into(),
        }]],
        mint: i64::MIN,
        maxt: i64::MAX,
        samples: true,
    };
    let resp = http
        .post(format!(
            "http://127.0.0.1:{port}{}",
            multipilot_tsdb::federate::SELECT_PATH
        ))
        .header("content-type", multipilot_tsdb::federate::CONTENT_TYPE)
        .body(rmp_serde::to_vec_named(&req)?)
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success(), "select: {}", resp.status());
    Ok(rmp_serde::from_slice(&resp.bytes().await?)?)
}

/// An instant query; `Ok(Err(body))` when the API answered an error.
async fn query(
    http: &reqwest::Client,
    port: u16,
    q: &str,
    t_ms: i64,
) -> Result<std::result::Result<Vec<serde_json::Value>, serde_json::Value>> {
    let resp = http
        .get(format!("http://127.0.0.1:{port}/api/v1/query"))
        .query(&[("query", q), ("time", &format!("{}", t_ms as f64 / 1000.0))])
        .send()
        .await?;
    let body: serde_json::Value = resp.json().await?;
    if body["status"] == "success" {
        Ok(Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()))
    } else {
        Ok(Err(body))
    }
}

fn scalar_of(v: &serde_json::Value) -> f64 {
    v["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Polls `f` until it returns `Some`, or fails with `what` after a generous deadline.
async fn wait_for<T, F, Fut>(what: &str, log: &[PathBuf], mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for _ in 0..300 {
        if let Some(v) = f().await {
            return Ok(v);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs: String = log
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    anyhow::bail!("timed out waiting for {what}\n{logs}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tsdb_partitions_store_each_batch_once_and_either_answers_for_the_fleet() -> Result<()>
{
    let mapping = include_str!("../../../deploy/nats/partitions.conf");
    let nats = NatsServer::start_with(|_| mapping.to_string()).await?;
    let js = jetstream::new(nats.client().await?);
    Topology::embedded().provision(&js).await?;
    let dir = tempfile::tempdir()?;
    let ports = [free_port()?, free_port()?];
    let logs = [dir.path().join("t0.log"), dir.path().join("t1.log")];
    let mut procs = Vec::new();
    for k in 0..2usize {
        procs.push(tsdb(
            &nats.url(),
            &dir.path().join(format!("data-{k}")),
            ports[k],
            Some((k as u32, ports[1 - k])),
            &logs[k],
        )?);
    }
    let t0 = t0();
    let clusters: Vec<String> = (0..8).map(|i| format!("fleet-{i}")).collect();
    let (batches, pods) = (4i64, 3usize);
    publish_metrics(&js, t0, &clusters, batches, pods).await?;
    let http = reqwest::Client::new();
    let expected = clusters.len() * batches as usize * pods;
    // every sample lands once: the two local stores together hold exactly what was published
    let parts = wait_for("every sample stored", &logs, || async {
        let mut parts = Vec::new();
        for p in ports {
            parts.push(local_series(&http, p).await.ok()?);
        }
        let n: usize = parts.iter().flatten().map(|s| s.samples.len()).sum();
        (n >= expected).then_some(parts)
    })
    .await?;
    let n: usize = parts.iter().flatten().map(|s| s.samples.len()).sum();
    assert_eq!(n, expected, "a sample stored twice");
    let owners: Vec<BTreeSet<String>> = parts
        .iter()
        .map(|p| {
            p.iter()
                .map(|s| multipilot_tsdb::store::label(&s.labels, "cluster").to_string())
                .collect()
        })
        .collect();
    assert!(
        owners[0].is_disjoint(&owners[1]),
        "a cluster in both partitions: {owners:?}"
    );
    assert!(
        !owners[0].is_empty() && !owners[1].is_empty(),
        "both partitions used: {owners:?}"
    );
    assert_eq!(owners[0].len() + owners[1].len(), clusters.len());
    // the server's partition(2, cluster) is the FNV-1a hash the correlator computes too
    let stream = js.get_stream("FLEET_METRICS").await?;
    for c in &clusters {
        let k = multipilot_correlator::partition_of(c, 2);
        stream
            .get_last_raw_message_by_subject(&format!("{}.{k}", subject::metrics(c)))
            .await
            .with_context(|| format!("{c} not in partition {k}"))?;
        assert!(
            owners[k as usize].contains(c),
            "{c} stored outside partition {k}"
        );
    }
    // either instance answers for the whole fleet
    let t = t0 + (batches - 1) * 30_000;
    let want_sum: f64 = (0..clusters.len())
        .flat_map(|n| (0..pods).map(move |p| (n * 100 + p) as f64))
        .sum();
    for p in ports {
        let r = query(&http, p, "sum(scaleout_requests)", t)
            .await?
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        assert_eq!(scalar_of(&r[0]), want_sum, "sum on :{p}");
        let r = query(&http, p, "count by (cluster) (scaleout_requests)", t)
            .await?
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        assert_eq!(r.len(), clusters.len(), "every cluster's series on :{p}");
        assert!(r.iter().all(|s| scalar_of(s) == pods as f64));
        let r = query(&http, p, "sum(rate(scaleout_requests[2m]))", t)
            .await?
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        assert_eq!(scalar_of(&r[0]), 0.0, "constant series have no rate");
        let values: serde_json::Value = http
            .get(format!("http://127.0.0.1:{p}/api/v1/label/cluster/values"))
            .send()
            .await?
            .json()
            .await?;
        assert_eq!(
            values["data"].as_array().map(Vec::len),
            Some(clusters.len()),
            "{values}"
        );
    }
    // a peer that is gone fails the query, naming it, instead of answering for half the fleet
    drop(procs.pop());
    let err = query(&http, ports[0], "sum(scaleout_requests)", t)
        .await?
        .expect_err("a partial answer");
    assert_eq!(err["errorType"], "unavailable", "{err}");
    assert!(
        err["error"]
            .as_str()
            .is_some_and(|e| e.contains(&ports[1].to_string())),
        "{err}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_tsdb_rebuilds_what_fleet_metrics_holds() -> Result<()> {
    let nats = NatsServer::start().await?;
    let js = jetstream::new(nats.client().await?);
    Topology::embedded().provision(&js).await?;
    let dir = tempfile::tempdir()?;
    let (data, log, port) = (
        dir.path().join("data"),
        dir.path().join("tsdb.log"),
        free_port()?,
    );
    let logs = [log.clone()];
    let t0 = t0();
    let clusters: Vec<String> = (0..3).map(|i| format!("wipe-{i}")).collect();
    let (batches, pods) = (5i64, 2usize);
    let expected = clusters.len() * batches as usize * pods;
    let http = reqwest::Client::new();
    let first = tsdb(&nats.url(), &data, port, None, &log)?;
    publish_metrics(&js, t0, &clusters, batches, pods).await?;
    let stored = || async {
        let n: usize = local_series(&http, port)
            .await
            .ok()?
            .iter()
            .map(|s| s.samples.len())
            .sum();
        (n >= expected).then_some(n)
    };
    wait_for("the samples stored", &logs, stored).await?;
    // the durable has acked everything: a restart on the same store would not see it again
    let stream = js.get_stream("FLEET_METRICS").await?;
    wait_for("the durable acked", &logs, || async {
        let i = stream.consumer_info("tsdb").await.ok()?;
        (i.num_pending == 0 && i.num_ack_pending == 0).then_some(())
    })
    .await?;
    drop(first); // kill -9
    std::fs::remove_dir_all(&data)?;
    let _second = tsdb(&nats.url(), &data, port, None, &log)?;
    let n = wait_for("the samples rebuilt", &logs, stored).await?;
    assert_eq!(n, expected, "every sample once, none twice");
    let t = t0 + (batches - 1) * 30_000;
    let r = query(&http, port, "count(scaleout_requests)", t)
        .await?
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(scalar_of(&r[0]), (clusters.len() * pods) as f64);
    Ok(())
}

// ---- the correlator ----

// What this test sends and asks, beyond what `common` gives every test.
impl Correlator {
    /// The etcd probe `rounds` of `cluster`, all with `status`; round n at `t + n × 10 s` in its clock.
    async fn etcd_rounds(
        &mut self,
        cluster: &str,
        status: ProbeStatus,
        rounds: RangeInclusive<u64>,
        t: DateTime<Utc>,
    ) -> Result<()> {
        for round in rounds {
            let p = ProbeResult {
                probe: "etcd".into(),
                status,
                latency_ms: 3.0,
                detail: format!("etcd round {round}: {status:?}"),
                round,
                observations: BTreeMap::new(),
                findings: vec![],
            };
            let at = t + chrono::Duration::seconds(round as i64 * 10);
            self.send(subject::probe(cluster, "etcd"), cluster, at, p)
                .await?;
        }
        Ok(())
    }

    /// The incidents the correlator holds, resolved ones too.
    async fn current(&self) -> Result<Vec<Incident>> {
        let r = self
            .client
            .request(
                multipilot_schemas::control::QUERY_INCIDENTS,
                r#"{"all":true}"#.into(),
            )
            .await?;
        Ok(serde_json::from_slice(&r.payload)?)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_correlator_keeps_its_incidents_open_and_their_revisions_continue() -> Result<()> {
    let mut hub = Correlator::start().await?;
    let c = "rebuild-1";
    let t = Utc::now() - chrono::Duration::minutes(5);
    // compliant, then rolled back below the baseline: a drift incident (standing non-compliance is not one)
    hub.send(subject::facts(c), c, t, facts(31)).await?;
    // FLEET_FACTS keeps one message per subject: the compliant facts are judged before the rollback
    // replaces them. Judged, not only read: a fresh correlator holds its judgement until its inventory
    // replay caught up (up to half a second after the start), and facts read meanwhile are not compared.
    let logs = [hub.log_path()];
    wait_for("the compliant facts judged", &logs, || async {
        let reports = hub.compliance().await.ok()?;
        reports.iter().any(|r| r.cluster == c).then_some(())
    })
    .await?;
    hub.send(
        subject::facts(c),
        c,
        t + chrono::Duration::seconds(1),
        facts(24),
    )
    .await?;
    hub.etcd_rounds(c, ProbeStatus::Unhealthy, 1..=6, t).await?;
    let before = wait_for("etcd and drift incidents", &logs, || async {
        let cur = hub.current().await.ok()?;
        (cur.iter().any(|i| i.kind == "etcd-unhealthy")
            && cur.iter().any(|i| i.kind == "baseline-drift"))
        .then_some(cur)
    })
    .await?;
    let etcd = before
        .iter()
        .find(|i| i.kind == "etcd-unhealthy")
        .context("etcd")?
        .clone();
    assert_eq!(etcd.status, IncidentStatus::Open);
    // acknowledged by a person: revision 2, which the rebuild must carry on from
    let ack = multipilot_bus::request::incident_command(
        &hub.client,
        &multipilot_schemas::control::IncidentCommand {
            id: etcd.id.clone(),
            action: multipilot_schemas::control::IncidentAction::Ack,
            actor: "otto".into(),
        },
        Duration::from_secs(5),
    )
    .await?;
    assert_eq!(
        ack.outcome,
        multipilot_schemas::control::CommandOutcome::Done
    );
    let compliance_before = hub.compliance().await?;

    // kill -9, wipe, restart
    hub.kill();
    std::fs::remove_dir_all(hub.data())?;
    hub.spawn()?;
    hub.wait_ready().await?;

    let after = hub.current().await?;
    let same = after
        .iter()
        .find(|i| i.id == etcd.id)
        .context("the etcd incident is back")?;
    assert_eq!(
        (same.status, same.revision, same.acknowledged_by.as_deref()),
        (IncidentStatus::Acknowledged, 2, Some("otto")),
        "{after:#?}"
    );
    let drift_ids: BTreeSet<&str> = after
        .iter()
        .filter(|i| i.kind == "baseline-drift")
        .map(|i| i.id.as_str())
        .collect();
    let drift_before: BTreeSet<&str> = before
        .iter()
        .filter(|i| i.kind == "baseline-drift")
        .map(|i| i.id.as_str())
        .collect();
    assert_eq!(
        drift_ids, drift_before,
        "the drift incidents are the same ones"
    );
    // the inventory is back (facts replayed from FLEET_FACTS): the same verdict
    let compliance_after = wait_for("compliance back", &logs, || async {
        let r = hub.compliance().await.ok()?;
        (!r.is_empty()).then_some(r)
    })
    .await?;
    assert_eq!(
        compliance_after
            .iter()
            .map(|r| (&r.cluster, &r.checks))
            .collect::<Vec<_>>(),
        compliance_before
            .iter()
            .map(|r| (&r.cluster, &r.checks))
            .collect::<Vec<_>>()
    );
    // the condition heals: the same incident resolves with the next revision
    hub.etcd_rounds(c, ProbeStatus::Healthy, 7..=12, t).await?;
    let all = wait_for("the etcd incident resolved", &logs, || async {
        let all = hub.incidents().await.ok()?;
        all.iter()
            .any(|i| i.id == etcd.id && i.status == IncidentStatus::Resolved)
            .then_some(all)
    })
    .await?;
    let resolved = all
        .iter()
        .find(|i| i.id == etcd.id && i.status == IncidentStatus::Resolved)
        .context("resolved")?;
    assert_eq!(
        resolved.revision, 3,
        "numbering continues after the rebuild"
    );
    // no revision of any incident stored twice with different content
    let mut seen: BTreeMap<(String, u64), String> = BTreeMap::new();
    for i in &all {
        let body = serde_json::to_string(i)?;
        if let Some(prev) = seen.insert((i.id.clone(), i.revision), body.clone()) {
            assert_eq!(prev, body, "revision {} of {} re-used", i.revision, i.id);
        }
    }
    assert_eq!(
        all.iter()
            .filter(|i| i.kind == "etcd-unhealthy")
            .map(|i| i.id.as_str())
            .collect::<BTreeSet<_>>()
            .len(),
        1,
        "no second etcd incident: {all:#?}"
    );
    Ok(())
}
