//! Load for the console benchmark (`loadtest/bench/console`).
//!
//! `console-bench feed NATS_URL CLUSTERS WORKLOADS CHURN_PER_S SECONDS` publishes, per cluster, facts, a
//! heartbeat and 12 probe results, WORKLOADS Deployments with one ReplicaSet and two Pods each (states shaped
//! like the agent's, specs like the simulator's), a compliance report and 10 incidents with evidence; then
//! keeps changing CHURN_PER_S objects per second (spec changes, heartbeats, incident revisions) for SECONDS.
//!
//! `console-bench measure URL TOKEN PATH REQUESTS` requests `PATH` REQUESTS times, one at a time, and prints
//! p50/p95/p99/max latency in milliseconds.

#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use chrono::Utc;
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use multipilot_schemas::payload::*;
use multipilot_schemas::{Envelope, Payload, stable_id, subject};
use serde_json::{Value, json};

struct Feed {
    publisher: Publisher<u64>,
    seq: u64,
    failed: u64,
}

impl Feed {
    async fn send<T: Payload>(&mut self, subject: String, cluster: &str, payload: T) -> Result<()> {
        self.seq += 1;
        let env = Envelope::new(
            cluster,
            format!("bench/{cluster}"),
            Utc::now(),
            self.seq,
            payload,
        );
        let id = stable_id(&["bench", &self.seq.to_string()]);
        for c in self
            .publisher
            .send(self.seq, Outgoing::envelope(subject, id, &env)?)
            .await
        {
            if matches!(c, Completion::Failed { .. }) {
                self.failed += 1;
            }
        }
        Ok(())
    }

    async fn flush(&mut self) {
        for c in self.publisher.flush().await {
            if matches!(c, Completion::Failed { .. }) {
                self.failed += 1;
            }
        }
    }
}

fn labels(app: &str, team: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), app.into()),
        ("app.kubernetes.io/part-of".into(), team.into()),
        ("team".into(), team.into()),
    ])
}

fn container(image: &str) -> Value {
    json!({"name": "app", "image": image, "ports": [{"containerPort": 8080, "protocol": "TCP"}],
           "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
           "env": [{"name": "LOG_LEVEL", "value": "info"}], "imagePullPolicy": "IfNotPresent"})
}

fn state(
    kind: &str,
    ns: &str,
    name: &str,
    spec: Value,
    l: BTreeMap<String, String>,
    ready: bool,
) -> ResourceState {
    ResourceState {
        api_version: if kind == "Pod" {
            "v1".into()
        } else {
            "apps/v1".into()
        },
        kind: kind.into(),
        namespace: Some(ns.into()),
        name: name.into(),
        uid: stable_id(&[kind, ns, name]),
        resource_version: "1".into(),
        generation: Some(1),
        spec_hash: stable_id(&[&spec.to_string()]),
        metadata_hash: stable_id(&[&format!("{l:?}")]),
        spec: Some(spec),
        status: StatusSnapshot {
            phase: (kind == "Pod").then(|| "Running".into()),
            ready: Some(ready),
            replicas: (kind != "Pod").then_some(Replicas {
                desired: 2,
                updated: 2,
                ready: 2,
                available: 2,
                observed_generation: Some(1),
            }),
            conditions: vec![],
            detail: BTreeMap::new(),
        },
        labels: l,
        annotations: BTreeMap::from([("deployment.kubernetes.io/revision".into(), "1".into())]),
        owner_refs: vec![],
        finalizers: vec![],
        deletion_timestamp: None,
        creation_timestamp: Some(Utc::now()),
        field_managers: Vec::new(),
    }
}

fn workload(cluster: usize, i: usize, version: u64) -> Vec<ResourceState> {
    let team = [
        "payments", "search", "checkout", "ml", "identity", "catalog", "ledger", "notify",
    ][i % 8];
    let ns = format!("{team}-{}", i / 40);
    let app = format!("svc-{i}");
    let image = format!(
        "registry.example.com/{team}/{app}:1.{version}.{}",
        cluster % 3
    );
    let l = labels(&app, team);
    let template = json!({"metadata": {"labels": l}, "spec": {"containers": [container(&image)],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst"}});
    let dep = json!({"spec": {"replicas": 2, "selector": {"matchLabels": l}, "template": template,
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
        "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600}});
    let hash = &stable_id(&[&image])[..10];
    let rs = json!({"spec": {"replicas": 2, "selector": {"matchLabels": l}, "template": template}});
    let mut out = vec![
        state("Deployment", &ns, &app, dep, l.clone(), true),
        state(
            "ReplicaSet",
            &ns,
            &format!("{app}-{hash}"),
            rs,
            l.clone(),
            true,
        ),
    ];
    for p in 0..2 {
        let pod = json!({"spec": {"containers": [container(&image)], "nodeName": format!("node-{}", (i + p) % 8),
            "restartPolicy": "Always", "serviceAccountName": "default", "schedulerName": "default-scheduler"}});
        out.push(state(
            "Pod",
            &ns,
            &format!("{app}-{hash}-p{p}"),
            pod,
            l.clone(),
            true,
        ));
    }
    out
}

fn facts(c: usize) -> ClusterFacts {
    let comp = |n: &str, v: &str| {
        Some(Component {
            name: n.into(),
            version: v.into(),
            ready: Some("8/8".into()),
        })
    };
    ClusterFacts {
        node_software: Vec::new(),
        version: KubeVersion {
            major: 1,
            minor: 24 + (c % 10) as u32,
            git_version: format!("v1.{}.3", 24 + c % 10),
            platform: "linux/amd64".into(),
        },
        api_versions: vec!["v1".into(), "apps/v1".into(), "batch/v1".into()],
        preferred_versions: BTreeMap::new(),
        nodes: NodeCounts {
            total: 10,
            ready: 10,
            control_plane: 1,
        },
        cni: comp("cilium", "v1.15.6"),
        coredns: comp("coredns", "v1.11.1"),
        ingress_controller: comp("ingress-nginx", "v1.10.1"),
        gpu_device_plugin: comp("nvidia-device-plugin", "v0.14.5"),
        ingress_classes: vec!["nginx".into()],
        storage_classes: vec!["standard".into()],
        default_storage_class: Some("standard".into()),
        apiserver_cert_expiry: Some(Utc::now() + chrono::Duration::days(30 + c as i64 * 7)),
        gpus: (0..2)
            .map(|n| GpuNode {
                node: format!("gpu-{n}"),
                model: "NVIDIA-A100-SXM4-40GB".into(),
                driver_version: "535.183".into(),
                capacity: 8,
                allocatable: 8,
                allocated: (c % 8) as u32,
            })
            .collect(),
        labels: BTreeMap::from([
            ("env".into(), ["prod", "staging", "dev"][c % 3].into()),
            ("region".into(), format!("region-{}", c % 5)),
            ("owner".into(), "platform".into()),
        ]),
        scrape_interval_s: None,
    }
}

fn incident(cluster: &str, k: usize, revision: u64) -> Incident {
    let at = Utc::now();
    Incident {
        id: stable_id(&[cluster, &k.to_string()]),
        cluster: cluster.into(),
        kind: [
            "dns-failure",
            "baseline-drift",
            "node-not-ready",
            "cert-expiring",
            "event-storm",
        ][k % 5]
            .into(),
        severity: if k.is_multiple_of(3) {
            Severity::Critical
        } else {
            Severity::Warning
        },
        status: if revision % 4 == 3 {
            IncidentStatus::Resolved
        } else {
            IncidentStatus::Open
        },
        summary: format!(
            "Something on {cluster} needs a look (#{k}, revision {revision}): 3 deployments changed there in the 93s before"
        ),
        opened_at: at - chrono::Duration::minutes(30),
        updated_at: at,
        resolved_at: None,
        ingest_time: Some(at + chrono::Duration::milliseconds(40)),
        evidence: (1..=3)
            .map(|r| Evidence {
                rank: r,
                kind: multipilot_schemas::payload::EvidenceKind::Change,
                summary: format!(
                    "Deployment team/svc-{r} changed (spec aaaa1111 → bbbb2222) {r}m before"
                ),
                cluster_time: at,
                object: None,
                why: "changed on this cluster before".into(),
            })
            .collect(),
        labels: BTreeMap::from([
            ("cluster".into(), cluster.into()),
            ("env".into(), "prod".into()),
        ]),
        revision,
        acknowledged_by: None,
        blast_radius: None,
        explains: Vec::new(),
    }
}

async fn feed(url: &str, clusters: usize, workloads: usize, churn: f64, secs: u64) -> Result<()> {
    let client = async_nats::connect(url).await?;
    let js = async_nats::jetstream::new(client);
    let metrics = multipilot_bus::metrics::BusMetrics::register(&mut Default::default());
    let mut f = Feed {
        publisher: Publisher::new(js, 1024, metrics),
        seq: 0,
        failed: 0,
    };
    let names: Vec<String> = (0..clusters).map(|c| format!("bench-{c:02}")).collect();
    let started = Instant::now();
    let mut objects = 0u64;
    for (c, name) in names.iter().enumerate() {
        f.send(subject::facts(name), name, facts(c)).await?;
        f.send(
            subject::heartbeat(name),
            name,
            Heartbeat {
                interval_s: 5,
                agent_version: "bench".into(),
                started_at: Utc::now(),
                outbox_depth: 0,
                dropped_metric_batches: 0,
                apiserver_reachable: true,
                superseded: 0,
                duplicates: 0,
            },
        )
        .await?;
        for &p in multipilot_schemas::probes::PROBES {
            f.send(
                subject::probe(name, p),
                name,
                ProbeResult {
                    probe: p.into(),
                    status: ProbeStatus::Healthy,
                    latency_ms: 3.0,
                    detail: format!("{p} ok"),
                    round: 1,
                    observations: BTreeMap::new(),
                    findings: vec![],
                },
            )
            .await?;
        }
        for i in 0..workloads {
            for s in workload(c, i, 0) {
                let subj = subject::state(name, &s.kind, s.namespace.as_deref(), &s.name);
                f.send(subj, name, s).await?;
                objects += 1;
            }
        }
        f.send(
            subject::compliance(name),
            name,
            ComplianceReport {
                cluster: name.clone(),
                baseline: "fleet".into(),
                compliant: c % 2 == 0,
                checks: vec![ComplianceCheck {
                    rule: "kubernetes-version".into(),
                    status: if c % 2 == 0 {
                        CheckStatus::Pass
                    } else {
                        CheckStatus::Fail
                    },
                    message: "v1.x".into(),
                    objects: vec![],
                }],
                evaluated_at: Utc::now(),
            },
        )
        .await?;
        for k in 0..10 {
            let inc = incident(name, k, 1);
            f.send(subject::incident(name, &inc.kind), name, inc)
                .await?;
        }
    }
    f.flush().await;
    println!(
        "fed {objects} objects, {} clusters, {} incidents in {:.1}s ({} failed)",
        clusters,
        clusters * 10,
        started.elapsed().as_secs_f64(),
        f.failed
    );
    // churn: spec changes, heartbeats and incident revisions, spread over the clusters
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let per_tick = (churn / 10.0).max(1.0) as usize;
    let (mut n, mut version) = (0usize, 1u64);
    while Instant::now() < deadline {
        tick.tick().await;
        for _ in 0..per_tick {
            let c = n % clusters;
            let name = &names[c];
            let i = (n / clusters * 7919) % workloads.max(1);
            for s in workload(c, i, version) {
                if s.kind == "Deployment" {
                    let subj = subject::state(name, &s.kind, s.namespace.as_deref(), &s.name);
                    f.send(subj, name, s).await?;
                }
            }
            if n % 20 == 0 {
                let k = n % 10;
                let inc = incident(name, k, version + 1);
                f.send(subject::incident(name, &inc.kind), name, inc)
                    .await?;
                f.send(
                    subject::heartbeat(name),
                    name,
                    Heartbeat {
                        interval_s: 5,
                        agent_version: "bench".into(),
                        started_at: Utc::now(),
                        outbox_depth: 0,
                        dropped_metric_batches: 0,
                        apiserver_reachable: true,
                        superseded: 0,
                        duplicates: 0,
                    },
                )
                .await?;
            }
            n += 1;
            if n.is_multiple_of(clusters * workloads.max(1)) {
                version += 1;
            }
        }
        f.flush().await;
    }
    println!("churned {n} changes over {secs}s ({} failed)", f.failed);
    Ok(())
}

async fn measure(url: &str, token: &str, path: &str, requests: usize) -> Result<()> {
    let http = reqwest::Client::new();
    let full = format!("{}{path}", url.trim_end_matches('/'));
    let mut ms = Vec::with_capacity(requests);
    let mut bytes = 0usize;
    for _ in 0..requests {
        let t = Instant::now();
        let r = http.get(&full).bearer_auth(token).send().await?;
        anyhow::ensure!(r.status().is_success(), "{full}: {}", r.status());
        bytes = r.bytes().await?.len();
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    let q = |p: f64| ms[((ms.len() as f64 * p).ceil() as usize).clamp(1, ms.len()) - 1];
    println!(
        "{path}: {requests} requests, {bytes} bytes each: p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        q(0.50),
        q(0.95),
        q(0.99),
        ms[ms.len() - 1]
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = |i: usize| {
        args.get(i)
            .cloned()
            .context("missing argument (see the file's doc)")
    };
    match args.first().map(String::as_str) {
        Some("feed") => {
            feed(
                &a(1)?,
                a(2)?.parse()?,
                a(3)?.parse()?,
                a(4)?.parse()?,
                a(5)?.parse()?,
            )
            .await
        }
        Some("measure") => measure(&a(1)?, &a(2)?, &a(3)?, a(4)?.parse()?).await,
        _ => bail!(
            "usage: console-bench feed NATS CLUSTERS WORKLOADS CHURN SECONDS | measure URL TOKEN PATH N"
        ),
    }
}
