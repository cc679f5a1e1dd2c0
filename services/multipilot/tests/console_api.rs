//! The console's API against a real nats-server: states, facts, health, incidents and compliance published
//! as the agent and the correlator publish them (objects taken from `../shared/fixtures`), read back through
//! the HTTP API with bearer tokens of each role; the live incident stream and acknowledging/resolving
//! through the real correlator. It lives with the hub crate because it runs two roles together (no role
//! crate depends on another).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result};
use async_nats::jetstream;
use chrono::{DateTime, Utc};
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use multipilot_bus::topology::Topology;
use multipilot_console::auth::{self, Role, TokenEntry};
use multipilot_schemas::payload::*;
use multipilot_schemas::{Envelope, Payload, stable_id, subject};
use multipilot_testkit::NatsServer;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const VIEWER: &str = "viewer-token-123";
const OPERATOR: &str = "operator-token-456";
/// A team's token (`multipilot team add`): sees prod-a only.
const TEAM: &str = "team-token-789";

struct Console {
    nats: NatsServer,
    js: jetstream::Context,
    base: String,
    http: reqwest::Client,
    cancel: CancellationToken,
    /// The console's task.
    console: tokio::task::JoinHandle<Result<(), multipilot_console::Error>>,
    seq: u64,
    _dir: tempfile::TempDir,
}

impl Drop for Console {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Console {
    /// A nats-server with the streams, the console (and, with `correlator`, the correlator) in-process.
    async fn start(correlator: bool) -> Result<Console> {
        let nats = NatsServer::start().await?;
        let client = nats.client().await?;
        let js = jetstream::new(client.clone());
        Topology::embedded().provision(&js).await?;
        let cancel = CancellationToken::new();
        let ctx = multipilot_runtime::Context::new(client.clone(), "console-test", cancel.clone());
        // the console is started again on another port when it could not listen: `free_port` lets its port
        // go, and a test running beside this one may take it first (a console that failed to listen had
        // left this wait to time out)
        let mut attempts = 0;
        let (port, console) = loop {
            attempts += 1;
            let port = multipilot_testkit::free_port()?;
            let config = multipilot_console::Config {
                listen: format!("127.0.0.1:{port}"),
                auth: auth::Config {
                    enabled: true,
                    tokens_file: None,
                    tokens: vec![
                        TokenEntry::plain(VIEWER, "vera", Role::Viewer),
                        TokenEntry::plain(OPERATOR, "otto", Role::Operator),
                        TokenEntry {
                            team: Some("payments".into()),
                            clusters: Some(vec!["prod-a".into()]),
                            ..TokenEntry::plain(TEAM, "team-payments", Role::Operator)
                        },
                    ],
                },
                ..Default::default()
            };
            let console = tokio::spawn(multipilot_console::run(config, ctx.clone()));
            let http = reqwest::Client::new();
            let url = format!("http://127.0.0.1:{port}/api/v1/whoami");
            let answered = multipilot_testkit::wait::until("the console answers", 60, async || {
                if console.is_finished() {
                    return Ok(Some(false));
                }
                let resp = http.get(&url).bearer_auth(VIEWER).send().await;
                Ok(resp.is_ok_and(|r| r.status().is_success()).then_some(true))
            })
            .await?;
            // (an answer while this console has failed came from whoever holds the port)
            if answered && !console.is_finished() {
                break (port, console);
            }
            match console.await? {
                Err(e) if e.is_retryable() && attempts < 5 => continue,
                Err(e) => return Err(e.into()),
                Ok(()) => anyhow::bail!("the console stopped before it answered"),
            }
        };
        let dir = tempfile::tempdir()?;
        if correlator {
            let cfg = multipilot_correlator::Config {
                data_dir: dir.path().join("correlator").to_string_lossy().into_owned(),
                tick_ms: 200,
                ..Default::default()
            };
            tokio::spawn(multipilot_correlator::run(cfg, ctx));
        }
        let c = Console {
            nats,
            js,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            cancel,
            console,
            seq: 0,
            _dir: dir,
        };
        Ok(c)
    }

    async fn send<T: Payload>(
        &mut self,
        subject: String,
        cluster: &str,
        at: DateTime<Utc>,
        payload: T,
    ) -> Result<()> {
        self.seq += 1;
        let env = Envelope::new(cluster, format!("agent/{cluster}"), at, self.seq, payload);
        let id = stable_id(&[cluster, &self.seq.to_string(), &subject]);
        self.raw(Outgoing::envelope(subject, id, &env)?).await
    }

    async fn raw(&self, msg: Outgoing) -> Result<()> {
        let mut p: Publisher<u64> = Publisher::new(
            self.js.clone(),
            4,
            multipilot_bus::metrics::BusMetrics::register(&mut Default::default()),
        );
        p.send(0, msg).await;
        for c in p.flush().await {
            anyhow::ensure!(matches!(c, Completion::Stored { .. }), "not stored: {c:?}");
        }
        Ok(())
    }

    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
    ) -> Result<(u16, Value)> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        Ok((status, resp.json().await.unwrap_or(Value::Null)))
    }

    async fn get_as(&self, path: &str, token: Option<&str>) -> Result<Value> {
        let (status, body) = self.request(reqwest::Method::GET, path, token).await?;
        anyhow::ensure!(status == 200, "GET {path}: {status} {body}");
        Ok(body)
    }

    async fn get(&self, path: &str) -> Result<Value> {
        self.get_as(path, Some(VIEWER)).await
    }

    /// Polls `f` until it yields a value (a deadline, never a fixed sleep, decides).
    async fn until<T, F, Fut>(&self, what: &str, f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>>>,
    {
        multipilot_testkit::wait::until(what, 60, async || f().await).await
    }
}

fn fixture(path: &str) -> Result<String> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(path);
    std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
}

/// The cockroachdb StatefulSet of the Kubernetes examples, as the agent would normalise it.
fn statefulset(mutate: impl Fn(&mut Value)) -> Result<ResourceState> {
    let text = fixture("manifests/k8s-examples-cockroachdb-statefulset.yaml")?;
    let mut obj = None;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc)?;
        if v["kind"] == "StatefulSet" {
            obj = Some(v);
        }
    }
    let mut obj = obj.context("no StatefulSet in the fixture")?;
    mutate(&mut obj);
    let mut spec = obj.as_object().cloned().unwrap_or_default();
    for k in ["apiVersion", "kind", "metadata", "status"] {
        spec.remove(k);
    }
    let spec = Value::Object(spec);
    let labels: BTreeMap<String, String> =
        serde_json::from_value(obj["metadata"]["labels"].clone()).unwrap_or_default();
    Ok(ResourceState {
        api_version: "apps/v1".into(),
        kind: "StatefulSet".into(),
        namespace: Some("db".into()),
        name: obj["metadata"]["name"].as_str().unwrap_or_default().into(),
        uid: "u-cockroach".into(),
        resource_version: "1".into(),
        generation: Some(1),
        spec_hash: stable_id(&[&spec.to_string()]),
        metadata_hash: stable_id(&[&format!("{labels:?}")]),
        spec: Some(spec),
        status: Default::default(),
        labels,
        annotations: Default::default(),
        owner_refs: vec![],
        finalizers: vec![],
        deletion_timestamp: None,
        creation_timestamp: None,
        field_managers: Vec::new(),
    })
}

fn object(kind: &str, ns: Option<&str>, name: &str, spec: Value) -> ResourceState {
    ResourceState {
        api_version: "v1".into(),
        kind: kind.into(),
        namespace: ns.map(Into::into),
        name: name.into(),
        uid: format!("u-{name}"),
        resource_version: "1".into(),
        generation: None,
        spec_hash: stable_id(&[&spec.to_string()]),
        metadata_hash: "m".into(),
        spec: Some(spec),
        status: Default::default(),
        labels: BTreeMap::from([("app".into(), name.into())]),
        annotations: Default::default(),
        owner_refs: vec![],
        finalizers: vec![],
        deletion_timestamp: None,
        creation_timestamp: None,
        field_managers: Vec::new(),
    }
}

fn facts(minor: u32, env: &str, cert_days: i64, gpus: &[(u32, u32)]) -> ClusterFacts {
    ClusterFacts {
        node_software: Vec::new(),
        version: KubeVersion {
            major: 1,
            minor,
            git_version: format!("v1.{minor}.3"),
            platform: "linux/amd64".into(),
        },
        api_versions: vec![],
        preferred_versions: Default::default(),
        nodes: NodeCounts {
            total: 5,
            ready: 4,
            control_plane: 1,
        },
        cni: Some(Component {
            name: "cilium".into(),
            version: "v1.15.6".into(),
            ready: Some("5/5".into()),
        }),
        coredns: None,
        ingress_controller: None,
        gpu_device_plugin: (!gpus.is_empty()).then(|| Component {
            name: "nvidia-device-plugin".into(),
            version: "v0.15.0".into(),
            ready: Some("2/2".into()),
        }),
        ingress_classes: vec![],
        storage_classes: vec![],
        default_storage_class: None,
        apiserver_cert_expiry: Some(Utc::now() + chrono::Duration::days(cert_days)),
        gpus: gpus
            .iter()
            .enumerate()
            .map(|(i, (alloc, used))| GpuNode {
                node: format!("gpu-{i}"),
                model: "NVIDIA-A100-SXM4-40GB".into(),
                driver_version: "535.183".into(),
                capacity: *alloc,
                allocatable: *alloc,
                allocated: *used,
            })
            .collect(),
        labels: BTreeMap::from([
            ("env".into(), env.into()),
            ("region".into(), "eu-west-1".into()),
            ("owner".into(), "platform".into()),
        ]),
        scrape_interval_s: None,
    }
}

fn heartbeat() -> Heartbeat {
    Heartbeat {
        interval_s: 5,
        agent_version: "0.1.0".into(),
        started_at: Utc::now(),
        outbox_depth: 0,
        dropped_metric_batches: 0,
        apiserver_reachable: true,
        superseded: 0,
        duplicates: 0,
    }
}

fn probe(name: &str, status: ProbeStatus, round: u64) -> ProbeResult {
    ProbeResult {
        probe: name.into(),
        status,
        latency_ms: 2.0,
        detail: format!("{name}: {status:?}"),
        round,
        observations: Default::default(),
        findings: vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_decide_who_may_read_and_who_may_act() -> Result<()> {
    let c = Console::start(false).await?;
    let (status, body) = c
        .request(reqwest::Method::GET, "/api/v1/clusters", None)
        .await?;
    assert_eq!(status, 401);
    assert_eq!(body["status"], 401);
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("bearer token"),
        "{body}"
    );
    let (status, _) = c
        .request(reqwest::Method::GET, "/api/v1/clusters", Some("wrong"))
        .await?;
    assert_eq!(status, 401);
    let me = c.get("/api/v1/whoami").await?;
    assert_eq!(
        me,
        json!({"subject": "vera", "role": "viewer", "auth_enabled": true})
    );
    // a viewer may not acknowledge; an operator may try (and learns there is no such incident)
    let (status, body) = c
        .request(
            reqwest::Method::POST,
            "/api/v1/incidents/x/ack",
            Some(VIEWER),
        )
        .await?;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap_or("").contains("operator"),
        "{body}"
    );
    let (status, body) = c
        .request(
            reqwest::Method::POST,
            "/api/v1/incidents/x/ack",
            Some(OPERATOR),
        )
        .await?;
    // no correlator runs in this test: the console says so rather than pretending
    assert_eq!(status, 503, "{body}");
    // the page itself needs no token (it holds no data)
    let page = c.http.get(format!("{}/", c.base)).send().await?;
    assert_eq!(page.status(), 200);
    assert!(page.text().await?.contains("id=\"clusters-table\""));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_token_sees_only_its_clusters_and_is_refused_beyond_them() -> Result<()> {
    let mut c = Console::start(false).await?;
    let now = Utc::now();
    for (cl, env) in [("prod-a", "prod"), ("prod-b", "prod")] {
        c.send(subject::facts(cl), cl, now, facts(31, env, 200, &[(8, 4)]))
            .await?;
        c.send(subject::heartbeat(cl), cl, now, heartbeat()).await?;
        let cm = object(
            "ConfigMap",
            Some("db"),
            "settings",
            json!({"data": {"k": cl}}),
        );
        c.send(
            subject::state(cl, "ConfigMap", Some("db"), "settings"),
            cl,
            now,
            cm,
        )
        .await?;
    }
    c.until("both clusters are in", || async {
        let list = c.get("/api/v1/clusters").await?;
        Ok((list.as_array().map(Vec::len) == Some(2)).then_some(()))
    })
    .await?;
    // a fleet incident of prod-a and prod-b: the team sees its member only, and nothing about the other
    let member = |c: &str| FleetMember {
        cluster: c.into(),
        incident_id: format!("{c}-dns"),
        severity: Severity::Critical,
        status: IncidentStatus::Open,
        summary: format!("DNS fails on {c}"),
        opened_at: now,
        joined_at: now,
        left_at: None,
        left_because: String::new(),
    };
    let fleet = FleetIncident {
        id: "fleet-dns".into(),
        kind: "dns-failure".into(),
        severity: Severity::Critical,
        status: IncidentStatus::Open,
        summary: "dns-failure on 2 of 2 clusters (prod-a, prod-b)".into(),
        opened_at: now,
        updated_at: now,
        resolved_at: None,
        fleet_size: 2,
        members: vec![member("prod-a"), member("prod-b")],
        shared: vec![SharedAttribute {
            attribute: "cni".into(),
            value: "calico".into(),
            failing: 2,
            failing_total: 2,
            healthy: 0,
            healthy_total: 0,
            support: "2 of 2 failing run cni calico (prod-b)".into(),
        }],
        suspects: vec![],
        labels: [("scope".to_string(), "fleet".to_string())].into(),
        // (a fleet incident of lost clusters says what they take down together, the other team's too)
        blast_radius: Some(BlastRadius {
            cluster: "prod-a, prod-b".into(),
            only_here: vec!["Deployment ledger/db".into()],
            only_here_total: 1,
            summary: "takes down 1 workload in 1 namespace; 1 runs on no cluster still up (Deployment ledger/db)".into(),
            ..BlastRadius::default()
        }),
        revision: 1,
    };
    c.send(subject::fleet_incident("dns-failure"), "fleet", now, fleet)
        .await?;
    let full = c
        .until("the console has the fleet incident", || async {
            let v = c.get("/api/v1/fleet-incidents").await?;
            Ok((v.as_array().map(Vec::len) == Some(1)).then_some(v))
        })
        .await?;
    assert_eq!(
        full[0]["members"].as_array().map(Vec::len),
        Some(2),
        "{full}"
    );
    let team = |path: &'static str| c.request(reqwest::Method::GET, path, Some(TEAM));
    let (status, me) = team("/api/v1/whoami").await?;
    assert_eq!(status, 200);
    assert_eq!(me["team"], "payments");
    assert_eq!(me["clusters"], json!(["prod-a"]));
    let (_, list) = team("/api/v1/clusters").await?;
    let names: Vec<&str> = list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["prod-a"], "{list}");
    let (_, st) = team("/api/v1/status").await?;
    assert_eq!(st["clusters"], 1, "{st}");
    let (_, rows) = team("/api/v1/resources?kind=ConfigMap").await?;
    let seen: Vec<&str> = rows["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["cluster"].as_str())
        .collect();
    assert_eq!(seen, ["prod-a"], "{rows}");
    let (_, diff) = team("/api/v1/diff?kind=ConfigMap&namespace=db&name=settings").await?;
    assert_eq!(diff["clusters"].as_array().map(Vec::len), Some(1), "{diff}");
    let (_, mine) = team("/api/v1/fleet-incidents").await?;
    assert_eq!(
        mine[0]["members"].as_array().map(Vec::len),
        Some(1),
        "{mine}"
    );
    assert_eq!(mine[0]["members"][0]["cluster"], "prod-a");
    assert!(!mine.to_string().contains("prod-b"), "{mine}");
    assert!(!mine.to_string().contains("ledger/db"), "{mine}");

    // naming another cluster, or asking what spans the fleet: refused
    for path in [
        "/api/v1/clusters/prod-b",
        "/api/v1/resources?cluster=prod-b",
        "/api/v1/resources?cluster=prod-a,prod-b",
        "/api/v1/resource?cluster=prod-b&kind=ConfigMap&namespace=db&name=settings",
        "/api/v1/diff?kind=ConfigMap&namespace=db&name=settings&clusters=prod-a,prod-b",
        "/api/v1/compare?a=prod-a&b=prod-b",
        "/api/v1/gpu",
        "/api/v1/capacity",
        "/api/v1/compliance",
        "/api/v1/releases",
        "/api/v1/gitops",
    ] {
        let (status, body) = team(path).await?;
        assert_eq!(status, 403, "{path}: {body}");
    }
    // the CLI with the team's token: its clusters only, and a refusal it says so for the others
    let env = [
        ("MULTIPILOT_CONSOLE_URL", c.base.as_str()),
        ("MULTIPILOT_TOKEN", TEAM),
        ("HOME", "/nonexistent"),
    ];
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_multipilot"))
            .args(args)
            .envs(env)
            .env_remove("MULTIPILOT_CONFIG")
            .output()
    };
    let listed = cli(&["clusters", "-o", "name"])?;
    assert!(listed.status.success(), "{listed:?}");
    assert_eq!(String::from_utf8_lossy(&listed.stdout).trim(), "prod-a");
    let refused = cli(&["compare", "prod-a", "prod-b"])?;
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("403"), "{err}");
    // the whole fleet's viewer still sees both
    let (_, st) = c
        .request(reqwest::Method::GET, "/api/v1/status", Some(VIEWER))
        .await?;
    assert_eq!(st["clusters"], 2, "{st}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overview_diff_compare_and_gpu_come_from_the_streams() -> Result<()> {
    let mut c = Console::start(false).await?;
    let now = Utc::now();
    // three clusters: prod-a (GPUs, 4 free), prod-b (GPUs, 10 free, soonest cert), dev-c (no GPUs, no heartbeat)
    c.send(
        subject::facts("prod-a"),
        "prod-a",
        now,
        facts(31, "prod", 200, &[(8, 4)]),
    )
    .await?;
    c.send(
        subject::facts("prod-b"),
        "prod-b",
        now,
        facts(33, "prod", 20, &[(8, 2), (8, 4)]),
    )
    .await?;
    c.send(
        subject::facts("dev-c"),
        "dev-c",
        now,
        facts(24, "dev", 90, &[]),
    )
    .await?;
    c.send(subject::heartbeat("prod-a"), "prod-a", now, heartbeat())
        .await?;
    c.send(subject::heartbeat("prod-b"), "prod-b", now, heartbeat())
        .await?;
    c.send(
        subject::probe("prod-b", "coredns"),
        "prod-b",
        now,
        probe("coredns", ProbeStatus::Unhealthy, 1),
    )
    .await?;
    c.send(
        subject::probe("prod-a", "coredns"),
        "prod-a",
        now,
        probe("coredns", ProbeStatus::Healthy, 1),
    )
    .await?;
    // garbage on a facts subject is skipped and counted, never fatal
    c.raw(Outgoing::raw(
        subject::facts("broken"),
        "garbage-1".into(),
        "ClusterFacts/1",
        bytes_of(b"\xc1\xc1not msgpack"),
    ))
    .await?;
    // the same StatefulSet in both prod clusters, prod-b with more replicas, another image and a label
    let sts_a = statefulset(|_| {})?;
    let sts_b = statefulset(|o| {
        o["spec"]["replicas"] = json!(5);
        o["spec"]["template"]["spec"]["containers"][0]["image"] =
            json!("cockroachdb/cockroach:v23.1.0");
        o["metadata"]["labels"]["tier"] = json!("db");
    })?;
    let sts_subject = |cl: &str| subject::state(cl, "StatefulSet", Some("db"), &sts_a.name);
    c.send(sts_subject("prod-a"), "prod-a", now, sts_a.clone())
        .await?;
    c.send(sts_subject("prod-b"), "prod-b", now, sts_b.clone())
        .await?;
    let cm = |v: &str| {
        object(
            "ConfigMap",
            Some("db"),
            "settings",
            json!({"data": {"mode": v}}),
        )
    };
    for (cl, obj) in [
        ("prod-a", cm("fast")),
        ("prod-b", cm("fast")),
        (
            "prod-a",
            object("ConfigMap", Some("db"), "only-a", json!({})),
        ),
        (
            "prod-b",
            object("ConfigMap", Some("db"), "only-b", json!({})),
        ),
        (
            "prod-a",
            object("Pod", Some("db"), "cockroachdb-0", json!({})),
        ),
        (
            "prod-a",
            object("ConfigMap", Some("db"), "gone-later", json!({})),
        ),
        (
            "prod-a",
            object("ConfigMap", Some("db"), "dropped-by-resync", json!({})),
        ),
    ] {
        let s = subject::state(cl, &obj.kind, obj.namespace.as_deref(), &obj.name);
        c.send(s, cl, now, obj).await?;
    }
    // a tombstone and a resync marker remove what is gone
    c.send(
        subject::state("prod-a", "ConfigMap", Some("db"), "gone-later"),
        "prod-a",
        now,
        ResourceDeleted {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("db".into()),
            name: "gone-later".into(),
            uid: "u-gone-later".into(),
            resource_version: "2".into(),
            last_spec_hash: String::new(),
        },
    )
    .await?;
    let present = ["settings", "only-a"]
        .iter()
        .map(|n| ObjectKey {
            namespace: Some("db".into()),
            name: n.to_string(),
        })
        .collect::<Vec<_>>();
    c.send(
        subject::resync("prod-a", "ConfigMap"),
        "prod-a",
        now,
        ResyncMarker {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            epoch: 1,
            object_count: 2,
            present,
            part: 0,
            parts: 1,
        },
    )
    .await?;

    let list = c
        .until(
            "three clusters with facts and the resync applied",
            || async {
                let v = c.get("/api/v1/clusters").await?;
                let s = c.get("/api/v1/status").await?;
                let ready = v
                    .as_array()
                    .is_some_and(|a| a.len() == 3 && a.iter().all(|x| !x["version"].is_null()))
                    && s["skipped"].as_u64() == Some(1)
                    && c.get("/api/v1/resources?kind=configmap&cluster=prod-a")
                        .await?["total"]
                        == 2;
                Ok(ready.then_some(v))
            },
        )
        .await?;
    let by: BTreeMap<String, Value> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["name"].as_str().unwrap().to_string(), x.clone()))
        .collect();
    assert_eq!(by["prod-a"]["health"], "healthy");
    assert_eq!(by["prod-b"]["health"], "unhealthy");
    assert_eq!(by["prod-b"]["failing_probes"], json!(["coredns"]));
    assert_eq!(by["dev-c"]["health"], "unknown");
    assert_eq!(by["prod-a"]["labels"]["env"], "prod");
    assert_eq!(by["prod-a"]["nodes"]["ready"], 4);
    assert_eq!(by["prod-a"]["cni"], "cilium v1.15.6");
    assert_eq!(by["dev-c"]["version"], "v1.24.3");
    // filter and sort
    let prod = c.get("/api/v1/clusters?q=env%3Dprod").await?;
    assert_eq!(prod.as_array().unwrap().len(), 2);
    let text = c.get("/api/v1/clusters?q=v1.24").await?;
    assert_eq!(text[0]["name"], "dev-c");
    let certs = c.get("/api/v1/clusters?sort=cert_expiry").await?;
    let order: Vec<&str> = certs
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["prod-b", "dev-c", "prod-a"]);
    let (status, _) = c
        .request(
            reqwest::Method::GET,
            "/api/v1/clusters?sort=bogus",
            Some(VIEWER),
        )
        .await?;
    assert_eq!(status, 400);

    // resource search: kind in any case, label selector, namespace
    let r = c
        .get("/api/v1/resources?kind=statefulset&selector=app%3Dcockroachdb,tier%3Ddb")
        .await?;
    assert_eq!(r["total"], 1, "{r}");
    assert_eq!(r["items"][0]["cluster"], "prod-b");
    let r = c.get("/api/v1/resources?namespace=db&name=only").await?;
    assert_eq!(r["total"], 2);

    // cross-cluster diff: spec hashes, the differing fields by path, labels apart
    let d = c
        .get("/api/v1/diff?namespace=db&kind=StatefulSet&name=cockroachdb&clusters=prod-a,prod-b")
        .await?;
    assert_eq!(d["identical"], false);
    assert_eq!(d["clusters"][0]["spec_hash"], json!(sts_a.spec_hash));
    assert_eq!(d["clusters"][1]["spec_hash"], json!(sts_b.spec_hash));
    let paths: Vec<&str> = d["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "spec.replicas",
            "spec.template.spec.containers[cockroachdb].image"
        ],
        "{d}"
    );
    let image = &d["fields"][1]["values"];
    assert_eq!(image[1], "cockroachdb/cockroach:v23.1.0");
    assert_ne!(image[0], image[1]);
    assert_eq!(d["labels"][0]["path"], "tier");
    assert_eq!(d["labels"][0]["values"], json!([null, "db"]));
    // a newer state of the object: the diff reads the current one back from the stream
    let sts_b2 = statefulset(|o| {
        o["spec"]["replicas"] = json!(7);
        o["spec"]["template"]["spec"]["containers"][0]["image"] =
            json!("cockroachdb/cockroach:v23.1.0");
        o["metadata"]["labels"]["tier"] = json!("db");
    })?;
    c.send(sts_subject("prod-b"), "prod-b", now, sts_b2).await?;
    c.until("the diff showing the new replicas", || async {
        let d = c
            .get("/api/v1/diff?namespace=db&kind=statefulset&name=cockroachdb&clusters=prod-a,prod-b")
            .await?;
        Ok((d["fields"][0]["values"] == json!([3, 7])).then_some(()))
    })
    .await?;
    let detail = c
        .get("/api/v1/resource?cluster=prod-b&kind=StatefulSet&namespace=db&name=cockroachdb")
        .await?;
    assert_eq!(detail["spec"]["spec"]["replicas"], 7);
    let same = c
        .get("/api/v1/diff?namespace=db&kind=ConfigMap&name=settings")
        .await?;
    assert_eq!(same["identical"], true);
    assert_eq!(same["fields"], json!([]));
    let (status, _) = c
        .request(
            reqwest::Method::GET,
            "/api/v1/diff?namespace=db&kind=ConfigMap&name=nope",
            Some(VIEWER),
        )
        .await?;
    assert_eq!(status, 404);

    // whole-cluster comparison: only in one, spec differs; pods are left out unless asked for
    let cmp = c.get("/api/v1/compare?a=prod-a&b=prod-b").await?;
    assert_eq!(
        cmp["counts"],
        json!({"only_in_a": 1, "only_in_b": 1, "differ": 1, "same": 1}),
        "{cmp}"
    );
    assert_eq!(cmp["only_in_a"][0]["name"], "only-a");
    assert_eq!(cmp["only_in_b"][0]["name"], "only-b");
    assert_eq!(cmp["differ"][0]["kind"], "StatefulSet");
    assert_eq!(cmp["differ"][0]["metadata_differs"], true);
    let pods = c.get("/api/v1/compare?a=prod-a&b=prod-b&kind=Pod").await?;
    assert_eq!(pods["counts"]["only_in_a"], 1);

    // the compliance view: each rule once, the clusters failing it
    let check = |rule: &str, status: CheckStatus, message: &str| ComplianceCheck {
        rule: rule.into(),
        status,
        message: message.into(),
        objects: Vec::new(),
    };
    for (cluster, checks) in [
        (
            "prod-a",
            vec![
                check("kubernetes-version", CheckStatus::Pass, "v1.31.3"),
                check(
                    "pss-labels",
                    CheckStatus::Fail,
                    "2 namespaces without a level",
                ),
            ],
        ),
        (
            "dev-c",
            vec![
                check(
                    "kubernetes-version",
                    CheckStatus::Fail,
                    "v1.24.3 is outside 1.26–1.33",
                ),
                check(
                    "pss-labels",
                    CheckStatus::Fail,
                    "5 namespaces without a level",
                ),
            ],
        ),
    ] {
        let report = ComplianceReport {
            cluster: cluster.into(),
            baseline: "fleet-baseline".into(),
            compliant: false,
            checks,
            evaluated_at: now,
        };
        c.send(subject::compliance(cluster), cluster, now, report)
            .await?;
    }
    // both reports in: every rule judged on both clusters (one report alone already names both rules)
    let rules = multipilot_testkit::wait::eventually("the compliance view", 30, async || {
        let v = c.get("/api/v1/compliance").await.ok()?;
        let judged = |r: &serde_json::Value| {
            r["passing"].as_u64().unwrap_or(0)
                + r["failing"].as_array().map_or(0, |f| f.len() as u64)
        };
        let rules = v.as_array()?;
        (rules.len() == 2 && rules.iter().all(|r| judged(r) == 2)).then_some(v)
    })
    .await?;
    assert_eq!(rules[0]["rule"], "pss-labels", "{rules:#}");
    let failing: Vec<&str> = rules[0]["failing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["cluster"].as_str().unwrap())
        .collect();
    assert_eq!(failing, ["dev-c", "prod-a"]);
    assert_eq!(rules[1]["rule"], "kubernetes-version");
    assert_eq!(rules[1]["passing"], 1);
    assert_eq!(
        rules[1]["failing"][0]["message"],
        "v1.24.3 is outside 1.26–1.33"
    );

    // GPU pool: the most free GPUs first, clusters without GPUs left out
    let gpu = c.get("/api/v1/gpu").await?;
    let pools: Vec<(&str, u64)> = gpu
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["cluster"].as_str().unwrap(), g["free"].as_u64().unwrap()))
        .collect();
    assert_eq!(pools, [("prod-b", 10), ("prod-a", 4)]);
    assert_eq!(gpu[0]["models"][0]["driver_versions"], json!(["535.183"]));
    assert_eq!(gpu[0]["device_plugin"]["version"], "v0.15.0");

    // releases: nothing recorded yet is an empty list, not an error
    assert_eq!(c.get("/api/v1/releases").await?, json!({"releases": []}));
    Ok(())
}

fn bytes_of(b: &[u8]) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(b)
}

/// Reads server-sent events from a streaming response until one satisfies `want`.
async fn next_event(
    resp: &mut reqwest::Response,
    buf: &mut String,
    want: impl Fn(&str, &Value) -> bool,
) -> Result<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            let mut event = "message";
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(e) = line.strip_prefix("event:") {
                    event = if e.trim() == "incident" {
                        "incident"
                    } else {
                        "other"
                    };
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push_str(d.trim_start());
                }
            }
            if let Ok(v) = serde_json::from_str::<Value>(&data)
                && want(event, &v)
            {
                return Ok(v);
            }
        }
        let chunk = tokio::time::timeout_at(deadline, resp.chunk())
            .await
            .context("no such event before the deadline")??
            .context("the event stream ended")?;
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_stream_delivers_a_new_incident_and_operators_ack_and_resolve_it() -> Result<()> {
    let mut c = Console::start(true).await?;
    // the stream takes the token as a query parameter (EventSource can't send headers)
    let mut sse = c
        .http
        .get(format!(
            "{}/api/v1/incidents/stream?access_token={VIEWER}",
            c.base
        ))
        .send()
        .await?;
    assert_eq!(sse.status(), 200);
    let mut buf = String::new();
    let t = Utc::now() - chrono::Duration::minutes(10);
    for round in 1..=5 {
        c.send(
            subject::probe("prod-x", "etcd"),
            "prod-x",
            t + chrono::Duration::seconds(round * 15),
            probe("etcd", ProbeStatus::Unhealthy, round as u64),
        )
        .await?;
    }
    let opened = next_event(&mut sse, &mut buf, |e, v| {
        e == "incident" && v["kind"] == "etcd-unhealthy" && v["status"] == "open"
    })
    .await?;
    assert_eq!(opened["cluster"], "prod-x");
    assert_eq!(opened["revision"], 1);
    // the lag is ingest_time − cluster time of the triggering round (published ten minutes "late" here)
    let lag = opened["delivery_lag_ms"].as_i64().context("lag")?;
    assert!((500_000..700_000).contains(&lag), "lag {lag}");
    let id = opened["id"].as_str().unwrap().to_string();
    let listed = c.get("/api/v1/incidents").await?;
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["id"] == id.as_str())
    );

    // an operator acknowledges: the correlator publishes revision 2 and an audit record
    let (status, body) = c
        .request(
            reqwest::Method::POST,
            &format!("/api/v1/incidents/{id}/ack"),
            Some(OPERATOR),
        )
        .await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "done");
    let acked = next_event(&mut sse, &mut buf, |e, v| {
        e == "incident" && v["id"] == id.as_str() && v["status"] == "acknowledged"
    })
    .await?;
    assert_eq!(acked["acknowledged_by"], "otto");
    assert_eq!(acked["revision"], 2);
    let audit =
        c.js.get_stream("FLEET_AUDIT")
            .await?
            .get_last_raw_message_by_subject("fleet.audit.console.incident-ack")
            .await?;
    let record: Envelope<AuditRecord> = rmp_serde::from_slice(&audit.payload)?;
    assert_eq!(
        (
            record.payload.actor.as_str(),
            record.payload.action.as_str()
        ),
        ("otto", "incident.acknowledge")
    );
    assert_eq!(record.payload.target, id);
    // acknowledging again changes nothing
    let (status, body) = c
        .request(
            reqwest::Method::POST,
            &format!("/api/v1/incidents/{id}/ack"),
            Some(OPERATOR),
        )
        .await?;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("unchanged")));
    // resolve, then acknowledging is a conflict
    let (status, _) = c
        .request(
            reqwest::Method::POST,
            &format!("/api/v1/incidents/{id}/resolve"),
            Some(OPERATOR),
        )
        .await?;
    assert_eq!(status, 200);
    next_event(&mut sse, &mut buf, |e, v| {
        e == "incident" && v["id"] == id.as_str() && v["status"] == "resolved"
    })
    .await?;
    let (status, body) = c
        .request(
            reqwest::Method::POST,
            &format!("/api/v1/incidents/{id}/ack"),
            Some(OPERATOR),
        )
        .await?;
    assert_eq!(status, 409, "{body}");
    let (status, _) = c
        .request(
            reqwest::Method::POST,
            "/api/v1/incidents/no-such-id/resolve",
            Some(OPERATOR),
        )
        .await?;
    assert_eq!(status, 404);
    // resolved incidents leave the default (active) list but stay in status=all
    let active = c.get("/api/v1/incidents").await?;
    assert!(
        !active
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["id"] == id.as_str())
    );
    let all = c.get("/api/v1/incidents?status=all").await?;
    assert!(
        all.as_array()
            .unwrap()
            .iter()
            .any(|i| i["id"] == id.as_str())
    );
    // the console shutting down ends the stream (the browser reconnects to the next console) and stops:
    // an open stream held it up for ever
    c.cancel.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while sse.chunk().await.is_ok_and(|c| c.is_some()) {}
    })
    .await;
    assert!(ended.is_ok(), "the stream outlived the console's shutdown");
    tokio::time::timeout(Duration::from_secs(10), &mut c.console)
        .await
        .context("the console did not stop")???;
    let _ = &c.nats;
    Ok(())
}
