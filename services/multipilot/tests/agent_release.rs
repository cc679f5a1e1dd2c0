//! Release orchestration end to end: a real nats-server, the fleet simulator (1.24 and 1.31 side by side),
//! the real `multipilot-agent` binary with its release executor, and the release role (library) — planning,
//! approvals, batches behind health gates, rollback to snapshots, and the agent's checks on commands.

#[path = "../../agent/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use async_nats::jetstream;
use chrono::Utc;
use multipilot_bus::topology::Topology;
use multipilot_release::exec::{Command as Cmd, Sender};
use multipilot_release::model::{ApplyRequest, NameRequest, PlanRequest, Reply, State};
use multipilot_release::signer::Signer;
use multipilot_schemas::payload::{ApplyOutcome, ReleaseAction};
use multipilot_sim::fleet::{self, Fleet};
use multipilot_sim::store::ResKey;
use multipilot_testkit::NatsServer;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct H {
    _nats: NatsServer,
    fleet: Arc<Fleet>,
    sim_cancel: CancellationToken,
    role_cancel: CancellationToken,
    dir: tempfile::TempDir,
    agent: Option<Child>,
    client: async_nats::Client,
    key: PathBuf,
}

impl Drop for H {
    fn drop(&mut self) {
        if let Some(mut a) = self.agent.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
        self.role_cancel.cancel();
        self.sim_cancel.cancel();
    }
}

const T: Duration = Duration::from_secs(60);

impl H {
    async fn start() -> Result<H> {
        H::start_with(None, Vec::new()).await
    }

    /// The fleet with the TSDB role (in this process, on `tsdb_port`) that release analyses query; the
    /// agent scrapes every second.
    async fn start_with_tsdb() -> Result<(H, String)> {
        let port = multipilot_testkit::free_port()?;
        let url = format!("http://127.0.0.1:{port}");
        Ok((H::start_with(Some(port), Vec::new()).await?, url))
    }

    async fn start_with(
        tsdb_port: Option<u16>,
        windows: Vec<multipilot_release::windows::Window>,
    ) -> Result<H> {
        let nats = NatsServer::start().await?;
        let client = nats.client().await?;
        Topology::embedded()
            .provision(&jetstream::new(client.clone()))
            .await?;
        let sim_cancel = CancellationToken::new();
        let fleet = Arc::new(
            Fleet::start(
                &fleet::Config {
                    clusters: 2,
                    versions: vec!["1.24".into(), "1.31".into()],
                    names: vec!["old-124".into(), "new-131".into()],
                    objects: 120,
                    churn: 0.0,
                    ..Default::default()
                },
                sim_cancel.clone(),
            )
            .await?,
        );
        let dir = tempfile::tempdir()?;
        let role_cancel = CancellationToken::new();
        if let Some(port) = tsdb_port {
            let config = multipilot_tsdb::Config {
                data_dir: dir.path().join("tsdb"),
                listen: format!("127.0.0.1:{port}"),
                ..Default::default()
            };
            let ctx = multipilot_runtime::Context::new(
                nats.client().await?,
                "tsdb-test",
                role_cancel.clone(),
            );
            tokio::spawn(async move {
                if let Err(e) = multipilot_tsdb::run(config, ctx).await {
                    eprintln!("tsdb role failed: {e:#}");
                }
            });
        }
        let kubeconfig = dir.path().join("kubeconfig.yaml");
        fleet.write_kubeconfig(&kubeconfig)?;
        // the role first: it creates the signing key the agent trusts
        let config = multipilot_release::Config {
            data_dir: dir.path().join("release").to_string_lossy().into_owned(),
            default_soak: Duration::from_secs(1),
            health_timeout: Duration::from_secs(10),
            command_timeout: Duration::from_secs(5),
            tsdb_url: tsdb_port
                .map(|p| format!("http://127.0.0.1:{p}"))
                .unwrap_or_else(|| multipilot_release::Config::default().tsdb_url),
            windows,
            ..Default::default()
        };
        let key = config.signing_key_path();
        let ctx = multipilot_runtime::Context::new(
            nats.client().await?,
            "release-test",
            role_cancel.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = multipilot_release::run(config, ctx).await {
                eprintln!("release role failed: {e:#}");
            }
        });
        let pub_key = PathBuf::from(format!("{}.pub", key.display()));
        for _ in 0..100 {
            if pub_key.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let agent_cfg = dir.path().join("agent.yaml");
        std::fs::write(
            &agent_cfg,
            format!(
                "release:\n  enabled: true\n  trusted_key_files: [{:?}]\n",
                pub_key.display().to_string()
            ),
        )?;
        let log = std::fs::File::create(dir.path().join("agent.log"))?;
        let agent = Command::new(common::agent_bin())
            .arg("--config")
            .arg(&agent_cfg)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--cluster", "old-124", "--cluster", "new-131"])
            .env("MULTIPILOT_AGENT__NATS__URL", nats.url())
            .env("MULTIPILOT_AGENT__OUTBOX__PATH", dir.path().join("outbox"))
            .env("MULTIPILOT_AGENT__HTTP__LISTEN", "127.0.0.1:0")
            .env("MULTIPILOT_AGENT__TIMINGS__DISCOVERY_INTERVAL_S", "5")
            .env(
                "MULTIPILOT_AGENT__SCRAPE__INTERVAL_S",
                if tsdb_port.is_some() { "1" } else { "30" },
            )
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting multipilot-agent")?;
        let h = H {
            _nats: nats,
            fleet,
            sim_cancel,
            role_cancel,
            dir,
            agent: Some(agent),
            client,
            key,
        };
        // ready: both clusters in the registry and both agents answering a dry-run
        let probe = "name: probe\ntargets: {clusters: [old-124, new-131]}\nmanifests: |\n  apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: probe, namespace: default}\n";
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            // the role writes its key before it subscribes: until then nobody answers, which is not
            // an answer either
            let why = match h.plan(probe).await {
                Ok(r) if r.ok && r.release.as_ref().is_some_and(|r| r.plan.clean()) => break,
                Ok(r) => format!(
                    "{:?}",
                    r.error
                        .or_else(|| r.release.map(|r| r.plan.problems().join("; ")))
                ),
                Err(e) => e.to_string(),
            };
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the fleet never became plannable: {why}\n{}",
                h.agent_log()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(h)
    }

    fn agent_log(&self) -> String {
        let t = std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default();
        let lines: Vec<&str> = t.lines().rev().take(40).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    async fn plan(&self, spec: &str) -> Result<Reply> {
        Ok(multipilot_release::call(
            &self.client,
            "plan",
            &PlanRequest {
                spec: spec.into(),
                actor: "tester".into(),
                ..Default::default()
            },
            T,
        )
        .await?)
    }

    async fn call<B: serde::Serialize>(&self, verb: &str, body: &B) -> Result<Reply> {
        Ok(multipilot_release::call(&self.client, verb, body, T).await?)
    }

    /// The role's answer to `history` of a release: it and its history.
    async fn history(&self, name: &str) -> Result<Reply> {
        self.call(
            "history",
            &NameRequest {
                release: Some(name.into()),
                actor: String::new(),
            },
        )
        .await
    }

    /// Applies `spec` (the release `name`) and waits until it is no longer busy: the role's last answer,
    /// and its history one line an entry.
    async fn apply_and_wait(&self, spec: &str, name: &str) -> Result<(Reply, Vec<String>)> {
        let r = self
            .call(
                "apply",
                &ApplyRequest {
                    spec: Some(spec.into()),
                    actor: "tester".into(),
                    ..Default::default()
                },
            )
            .await?;
        anyhow::ensure!(r.ok, "{r:?}");
        let done = self.wait_state(name, 120).await?;
        let entries = done
            .history
            .iter()
            .map(|e| format!("{} {} {}", e.what, e.ok, e.summary))
            .collect();
        Ok((done, entries))
    }

    async fn wait_until_state(&self, name: &str, want: State, secs: u64) -> Result<Reply> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let r = self.history(name).await?;
            if r.release.as_ref().is_some_and(|rel| rel.state == want) {
                return Ok(r);
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "release {name} not {want} after {secs}s: {:?}",
                r.history.iter().map(|e| &e.summary).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    async fn wait_state(&self, name: &str, secs: u64) -> Result<Reply> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let r = self.history(name).await?;
            if let Some(rel) = &r.release
                && !rel.state.busy()
            {
                return Ok(r);
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "release {name} still busy after {secs}s: {:?}",
                r.history.iter().map(|e| &e.summary).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    fn object(
        &self,
        cluster: &str,
        group: &str,
        plural: &str,
        ns: &str,
        name: &str,
    ) -> Option<Value> {
        let c = self.fleet.get(cluster)?;
        c.store
            .get(&ResKey::new(group, plural), ns, name)
            .map(|v| (*v).clone())
    }

    fn sender(&self, key: &Path) -> Result<Sender> {
        Ok(Sender {
            nats: self.client.clone(),
            signer: Arc::new(Signer::load_or_create(key)?),
            timeout: Duration::from_secs(5),
            attempts: 1,
            validity: Duration::from_secs(120),
            source: "test".into(),
        })
    }
}

fn spec_hash(obj: &Value) -> String {
    let spec = multipilot_agent::normalize::canonical_spec(obj);
    multipilot_agent::normalize::hash(&multipilot_agent::normalize::canonical_json(&spec))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_block_what_a_cluster_does_not_serve_and_gate_risks() -> Result<()> {
    let h = H::start().await?;
    // batch/v1beta1 CronJob and policy/v1beta1 PodSecurityPolicy on 1.24 and 1.31
    let spec = r#"
name: old-apis
targets: {selector: "version>=1.24"}
manifests: |
  apiVersion: batch/v1beta1
  kind: CronJob
  metadata: {name: backup, namespace: default}
  spec:
    schedule: "0 3 * * *"
    jobTemplate: {spec: {template: {spec: {restartPolicy: OnFailure, containers: [{name: b, image: busybox}]}}}}
  ---
  apiVersion: policy/v1beta1
  kind: PodSecurityPolicy
  metadata: {name: restricted}
  spec: {privileged: false, seLinux: {rule: RunAsAny}, runAsUser: {rule: MustRunAsNonRoot}, supplementalGroups: {rule: RunAsAny}, fsGroup: {rule: RunAsAny}, volumes: ["*"]}
"#;
    let r = h.plan(spec).await?;
    let rel = r.release.context(format!("{:?}", r.error))?;
    assert_eq!(rel.state, State::Blocked);
    let obj = |cluster: &str, kind: &str| {
        rel.plan
            .clusters
            .iter()
            .find(|c| c.cluster == cluster)
            .and_then(|c| c.objects.iter().find(|o| o.object.kind == kind))
            .cloned()
            .expect("planned object")
    };
    let cj_old = obj("old-124", "CronJob");
    assert_eq!(cj_old.action, "would-create", "{cj_old:?}");
    assert!(
        cj_old
            .verdict
            .warning
            .as_deref()
            .unwrap_or("")
            .contains("batch/v1")
    );
    let cj_new = obj("new-131", "CronJob");
    assert_eq!(cj_new.action, "blocked");
    let why = cj_new.error.clone().unwrap_or_default();
    assert!(
        why.contains("use batch/v1") && why.contains("v1.25"),
        "{why}"
    );
    let psp_new = obj("new-131", "PodSecurityPolicy");
    assert_eq!(psp_new.action, "blocked");
    assert!(
        psp_new
            .error
            .as_deref()
            .unwrap_or("")
            .contains("Pod Security admission"),
        "{psp_new:?}"
    );
    let psp_old = obj("old-124", "PodSecurityPolicy");
    assert_eq!(psp_old.action, "would-create", "{psp_old:?}");
    assert_eq!(rel.plan.blocked, 2);
    // nothing was created by the dry-run
    assert!(
        h.object("old-124", "batch", "cronjobs", "default", "backup")
            .is_none()
    );

    // dry-run errors from every cluster, gathered in one plan
    let spec = r#"
name: bad-ns
targets: {clusters: [old-124, new-131]}
manifests: |
  apiVersion: v1
  kind: ConfigMap
  metadata: {name: c, namespace: does-not-exist}
  ---
  apiVersion: apps/v1
  kind: Deployment
  metadata: {name: d, namespace: default}
  spec: {replicas: 1, selector: {matchLabels: {app: x}}, template: {metadata: {labels: {app: y}}, spec: {containers: [{name: c, image: i}]}}}
"#;
    let rel = h.plan(spec).await?.release.context("plan")?;
    let problems = rel.plan.problems();
    assert_eq!(rel.plan.errors, 4, "{problems:#?}");
    for c in ["old-124", "new-131"] {
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with(c) && p.contains("does-not-exist")),
            "{problems:#?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with(c) && p.contains("selector")),
            "{problems:#?}"
        );
    }
    let refused = h
        .call(
            "apply",
            &ApplyRequest {
                release: Some("bad-ns".into()),
                actor: "tester".into(),
                ..Default::default()
            },
        )
        .await?;
    assert!(!refused.ok && refused.error.as_deref().unwrap_or("").contains("blocked"));

    // externalIPs need an explicit approval; with it the release goes through
    let spec = r#"
name: lb
targets: {clusters: [old-124, new-131]}
batches: {size: 1}
soak: 1s
manifests: |
  apiVersion: v1
  kind: Service
  metadata: {name: lb, namespace: default}
  spec:
    selector: {app: lb}
    ports: [{name: http, port: 80, targetPort: 8080}]
    externalIPs: [203.0.113.9]
    externalTrafficPolicy: Local
    type: LoadBalancer
"#;
    let rel = h.plan(spec).await?.release.context("plan")?;
    assert_eq!(rel.state, State::Planned);
    assert!(rel.plan.required_approvals.contains("external-ips"));
    let risks: Vec<String> = rel.plan.clusters[0].objects[0]
        .risks
        .iter()
        .map(|r| r.code.clone())
        .collect();
    assert_eq!(risks, vec!["external-ips", "external-traffic-policy-local"]);
    let no = h
        .call(
            "apply",
            &ApplyRequest {
                release: Some("lb".into()),
                actor: "tester".into(),
                ..Default::default()
            },
        )
        .await?;
    assert!(
        !no.ok && no.error.as_deref().unwrap_or("").contains("external-ips"),
        "{no:?}"
    );
    assert!(
        h.object("old-124", "", "services", "default", "lb")
            .is_none()
    );
    let yes = h
        .call(
            "apply",
            &ApplyRequest {
                release: Some("lb".into()),
                approve: vec!["external-ips".into()],
                actor: "alice".into(),
                ..Default::default()
            },
        )
        .await?;
    assert!(yes.ok, "{yes:?}");
    let done = h.wait_state("lb", 60).await?;
    assert_eq!(
        done.release.as_ref().map(|r| r.state),
        Some(State::Succeeded),
        "{:#?}",
        done.history
    );
    for c in ["old-124", "new-131"] {
        let svc = h
            .object(c, "", "services", "default", "lb")
            .context("service applied")?;
        assert_eq!(svc["spec"]["externalIPs"][0], "203.0.113.9");
    }
    let whats: Vec<&str> = done.history.iter().map(|e| e.what.as_str()).collect();
    for w in [
        "plan", "approve", "apply", "batch", "step", "health", "done",
    ] {
        assert!(whats.contains(&w), "{w} missing from {whats:?}");
    }
    let approve = done
        .history
        .iter()
        .find(|e| e.what == "approve")
        .expect("approve");
    assert_eq!(approve.actor, "alice");
    // the history is on FLEET_RELEASE and the audit stream too
    let js = jetstream::new(h.client.clone());
    let rel_msgs = js
        .get_stream("FLEET_RELEASE")
        .await?
        .info()
        .await?
        .state
        .messages;
    let audit = js
        .get_stream("FLEET_AUDIT")
        .await?
        .info()
        .await?
        .state
        .messages;
    assert!(rel_msgs >= done.history.len() as u64, "{rel_msgs}");
    assert!(audit >= done.history.len() as u64, "{audit}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_health_gate_in_batch_2_rolls_every_changed_cluster_back() -> Result<()> {
    let h = H::start().await?;
    // a Deployment every cluster already runs
    let mut before = Vec::new();
    for c in ["old-124", "new-131"] {
        let cl = h.fleet.get(c).context("cluster")?;
        multipilot_sim::world::put(
            cl,
            "apps",
            "deployments",
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "web", "image": "registry.example.com/web:1",
                            "ports": [{"containerPort": 8080, "protocol": "TCP"}]}]}}},
                "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2}}),
        )
        .context("seed web")?;
        let web = h
            .object(c, "apps", "deployments", "default", "web")
            .context("web")?;
        before.push((c, spec_hash(&web), web["spec"].clone()));
    }
    let spec = r#"
name: web-2
targets: {clusters: [old-124, new-131]}
batches: {groups: [[old-124], [new-131]]}
soak: 1s
health_timeout: 8s
manifests: |
  apiVersion: v1
  kind: ConfigMap
  metadata: {name: web-config, namespace: default}
  data: {release: "2"}
  ---
  apiVersion: apps/v1
  kind: Deployment
  metadata: {name: web, namespace: default, labels: {app: web}}
  spec:
    replicas: 2
    selector: {matchLabels: {app: web}}
    template:
      metadata: {labels: {app: web}, annotations: {release: web-2}}
      spec:
        containers:
          - name: web
            image: "{% if cluster.name == 'new-131' %}unpullable.invalid/web:2{% else %}registry.example.com/web:2{% endif %}"
"#;
    let r = h
        .call(
            "apply",
            &ApplyRequest {
                spec: Some(spec.into()),
                actor: "tester".into(),
                ..Default::default()
            },
        )
        .await?;
    assert!(r.ok, "{r:?}");
    let plan = &r.release.as_ref().context("release")?.plan;
    let web_diff: Vec<String> = plan.clusters[0]
        .objects
        .iter()
        .find(|o| o.object.kind == "Deployment")
        .map(|o| o.diff.iter().map(|d| d.path.clone()).collect())
        .unwrap_or_default();
    assert!(
        web_diff.contains(&".spec.template.spec.containers[web].image".to_string()),
        "{web_diff:?}"
    );
    let done = h.wait_state("web-2", 90).await?;
    let rel = done.release.context("release")?;
    let summaries: Vec<String> = done
        .history
        .iter()
        .map(|e| format!("{} {} {}", e.what, e.ok, e.summary))
        .collect();
    assert_eq!(rel.state, State::RolledBack, "{summaries:#?}");
    assert_eq!(rel.batches[0].state, "done", "{summaries:#?}");
    assert_eq!(rel.batches[1].state, "failed", "{summaries:#?}");
    assert!(
        rel.batches[1]
            .error
            .as_deref()
            .unwrap_or("")
            .contains("updated 1/2"),
        "{:?}",
        rel.batches[1].error
    );
    assert_eq!(rel.changed, vec!["old-124", "new-131"]);
    // every changed cluster is back at its snapshot
    for (c, hash, spec) in &before {
        let web = h
            .object(c, "apps", "deployments", "default", "web")
            .context("web")?;
        assert_eq!(&web["spec"], spec, "{c}: spec differs after the rollback");
        assert_eq!(&spec_hash(&web), hash, "{c}");
        assert!(
            h.object(c, "", "configmaps", "default", "web-config")
                .is_none(),
            "{c}: the ConfigMap the release created is still there"
        );
    }
    // a rollback on demand goes through again (nothing left to change)
    let again = h
        .call(
            "rollback",
            &NameRequest {
                release: Some("web-2".into()),
                actor: "tester".into(),
            },
        )
        .await?;
    assert!(again.ok, "{again:?}");
    let done = h.wait_state("web-2", 60).await?;
    assert_eq!(done.release.map(|r| r.state), Some(State::RolledBack));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_rejects_forged_replayed_expired_and_foreign_commands_and_applies_once()
-> Result<()> {
    let h = H::start().await?;
    let good = h.sender(&h.key)?;
    let stranger = h.sender(&h.dir.path().join("other/signing.key"))?;
    let cm = |v: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "once", "namespace": "default"}, "data": {"v": v}})
    };
    let cmd = |id: &str, cluster: &str, v: &str| Cmd {
        id: id.into(),
        release: "sec".into(),
        cluster: cluster.into(),
        action: ReleaseAction::Apply,
        field_manager: "multipilot".into(),
        force: false,
        objects: vec![cm(v)],
    };
    let refused = |r: &multipilot_schemas::payload::ReleaseResult, needle: &str| {
        assert!(!r.ok, "{r:?}");
        assert!(
            r.error.as_deref().unwrap_or("").contains(needle),
            "{needle}: {r:?}"
        );
    };
    // forged: an untrusted key
    let r = stranger
        .send_envelope(&stranger.build(&cmd("f1", "old-124", "x"))?)
        .await
        .map_err(anyhow::Error::msg)?;
    refused(&r, "not trusted");
    // forged: a trusted key id, but the objects changed after signing
    let mut env = good.build(&cmd("f2", "old-124", "x"))?;
    env.payload.objects = vec![cm("evil")];
    let r = good.send_envelope(&env).await.map_err(anyhow::Error::msg)?;
    refused(&r, "bad signature");
    // unsigned
    let mut env = good.build(&cmd("f3", "old-124", "x"))?;
    env.payload.signature.clear();
    refused(
        &good.send_envelope(&env).await.map_err(anyhow::Error::msg)?,
        "unsigned",
    );
    // another cluster's command, sent to this one
    let env = good.build(&cmd("o1", "new-131", "x"))?;
    let mut foreign = env.clone();
    foreign.payload.cluster = "new-131".into();
    let body_for_old = {
        // re-address the envelope to old-124's subject, keep the signed payload for new-131
        let bytes = multipilot_schemas::encode(&foreign)?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Content-Type", "application/msgpack");
        headers.insert("Multipilot-Schema", "ReleaseCommand/1");
        let m = h
            .client
            .request_with_headers(
                multipilot_schemas::subject::command("old-124", "release"),
                headers,
                bytes.into(),
            )
            .await?;
        let e: multipilot_schemas::Envelope<multipilot_schemas::payload::ReleaseResult> =
            rmp_serde::from_slice(&m.payload)?;
        e.payload
    };
    refused(&body_for_old, "for cluster \"new-131\"");
    // expired, and issued in the future (re-signed so only the times are wrong)
    let signer = Signer::load_or_create(&h.key)?;
    let mut env = good.build(&cmd("e1", "old-124", "x"))?;
    env.payload.issued_at = Utc::now() - chrono::Duration::minutes(20);
    env.payload.expires_at = Utc::now() - chrono::Duration::minutes(10);
    signer.sign(&mut env.payload)?;
    refused(
        &good.send_envelope(&env).await.map_err(anyhow::Error::msg)?,
        "expired",
    );
    let mut env = good.build(&cmd("e2", "old-124", "x"))?;
    env.payload.issued_at = Utc::now() + chrono::Duration::minutes(10);
    env.payload.expires_at = Utc::now() + chrono::Duration::minutes(11);
    signer.sign(&mut env.payload)?;
    refused(
        &good.send_envelope(&env).await.map_err(anyhow::Error::msg)?,
        "future",
    );
    assert!(
        h.object("old-124", "", "configmaps", "default", "once")
            .is_none(),
        "a refused command applied something"
    );

    // a valid command applies; the same envelope again is a replay
    let env = good.build(&cmd("a1", "old-124", "1"))?;
    let first = good.send_envelope(&env).await.map_err(anyhow::Error::msg)?;
    assert!(first.ok && !first.replayed, "{first:?}");
    assert_eq!(first.objects[0].outcome, ApplyOutcome::Created);
    refused(
        &good.send_envelope(&env).await.map_err(anyhow::Error::msg)?,
        "replayed",
    );
    // someone changes the object; the retried command (same id, fresh nonce) applies nothing
    multipilot_sim::world::change(
        h.fleet.get("old-124").context("cluster")?,
        "",
        "configmaps",
        "default",
        "once",
        |o| o["data"]["v"] = json!("changed-by-someone"),
    );
    let retry = good.send(&cmd("a1", "old-124", "1")).await?;
    assert!(retry.ok && retry.replayed, "{retry:?}");
    assert_eq!(
        retry.objects[0].outcome,
        ApplyOutcome::Created,
        "the stored result comes back"
    );
    let live = h
        .object("old-124", "", "configmaps", "default", "once")
        .context("cm")?;
    assert_eq!(
        live["data"]["v"], "changed-by-someone",
        "the retry was applied again"
    );
    // the other cluster is untouched
    assert!(
        h.object("new-131", "", "configmaps", "default", "once")
            .is_none()
    );
    Ok(())
}

/// Publishes a fleet incident on FLEET_INCIDENTS as the correlator does, its suspects naming `release`
/// (revision 1, a suspect) and `other` (seen as often on healthy clusters).
async fn fleet_incident(h: &H, id: &str, revision: u64, release: &str) -> Result<()> {
    use multipilot_schemas::payload::{
        FleetIncident, FleetMember, ObjectRef, ReleaseRef, Suspect, SuspectVerdict,
    };
    let entry = multipilot_schemas::catalog::entries()
        .into_iter()
        .find(|e| e.name == "FleetIncident")
        .context("the catalog's fleet incident")?;
    let mut f =
        rmp_serde::from_slice::<multipilot_schemas::Envelope<FleetIncident>>(&entry.sample)?
            .payload;
    let member = f.members.first().cloned().context("a sample member")?;
    f.id = id.into();
    f.members = ["old-124", "new-131"]
        .iter()
        .map(|c| FleetMember {
            cluster: c.to_string(),
            incident_id: format!("{c}-{id}"),
            ..member.clone()
        })
        .collect();
    f.fleet_size = 2;
    let suspect = |name: &str, verdict| Suspect {
        verdict,
        object: ObjectRef {
            api_version: String::new(),
            kind: "Release".into(),
            namespace: None,
            name: name.into(),
            uid: None,
        },
        failing: 2,
        failing_total: 2,
        healthy: 0,
        healthy_total: 0,
        last_changed: Utc::now(),
        summary: format!("release {name} revision 1 reached 2 of 2 failing"),
        release: Some(ReleaseRef {
            name: name.into(),
            revision: 1,
            batch: Some(1),
            commit: None,
        }),
    };
    f.suspects = vec![
        suspect(release, SuspectVerdict::Suspect),
        suspect("other", SuspectVerdict::Common),
    ];
    let now = Utc::now();
    let env = multipilot_schemas::Envelope::new("fleet", "correlator/test", now, revision, f);
    multipilot_bus::publish::publish_one(
        &jetstream::new(h.client.clone()),
        multipilot_schemas::subject::fleet_incident(&env.payload.kind),
        format!("{id}-{revision}"),
        &env,
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_incident_that_names_a_release_first_is_kept_in_its_history_once() -> Result<()> {
    let h = H::start().await?;
    let spec = "name: cfg\ntargets: {clusters: [old-124, new-131]}\nsoak: 1s\nmanifests: |\n  apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: cfg, namespace: default}\n  data: {k: v}\n";
    let r = h
        .call(
            "apply",
            &ApplyRequest {
                spec: Some(spec.into()),
                actor: "tester".into(),
                ..Default::default()
            },
        )
        .await?;
    assert!(r.ok, "{r:?}");
    let done = h.wait_state("cfg", 60).await?;
    assert_eq!(done.release.map(|r| r.state), Some(State::Succeeded));

    // after the rollout: the same fleet incident twice (a new revision of it), one naming a release the
    // role does not have, then a second fleet incident as a marker that the first ones were read
    fleet_incident(&h, "fi-1", 1, "cfg").await?;
    fleet_incident(&h, "fi-1", 2, "cfg").await?;
    fleet_incident(&h, "fi-x", 1, "nowhere").await?;
    fleet_incident(&h, "fi-2", 1, "cfg").await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let history = loop {
        let r = h.history("cfg").await?;
        if r.history
            .iter()
            .any(|e| e.what == "incident" && e.detail["fleet_incident"] == "fi-2")
        {
            break r.history;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no incident entry in the history: {:#?}",
            r.history.iter().map(|e| &e.summary).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let entries: Vec<_> = history.iter().filter(|e| e.what == "incident").collect();
    let ids: Vec<&str> = entries
        .iter()
        .map(|e| e.detail["fleet_incident"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ids, ["fi-1", "fi-2"], "{entries:#?}");
    let e = entries[0];
    assert_eq!(e.actor, "correlator");
    assert_eq!(e.revision, 1);
    assert_eq!(e.clusters, ["old-124", "new-131"]);
    assert!(
        e.summary.starts_with("fleet incident fi-1 (") && e.summary.contains("revision 1"),
        "{}",
        e.summary
    );
    // the state of the release is not changed by it: an attribution after the soak is a record
    let r = h.history("cfg").await?;
    assert_eq!(r.release.map(|r| r.state), Some(State::Succeeded));
    Ok(())
}

/// Seeds `web` (a Deployment of 4 replicas and a Service Prometheus' annotations say to scrape) on every
/// cluster, running `image`.
fn seed_web(h: &H, image: &str) -> Result<()> {
    for c in ["old-124", "new-131"] {
        let cl = h.fleet.get(c).context("cluster")?;
        multipilot_sim::world::put(
            cl,
            "apps",
            "deployments",
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
                "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "web", "image": image}]}}},
                "status": {"observedGeneration": 1, "replicas": 4, "updatedReplicas": 4, "readyReplicas": 4, "availableReplicas": 4}}),
        )
        .context("seed web")?;
        multipilot_sim::world::put(
            cl,
            "",
            "services",
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "default",
                    "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "80"}},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
        )
        .context("seed the web service")?;
    }
    Ok(())
}

/// A release of `web` at `image`, a batch per cluster, with an analysis of its error ratio.
fn analysed_release(name: &str, image: &str) -> String {
    format!(
        r#"
name: {name}
targets: {{clusters: [old-124, new-131]}}
batches: {{groups: [[old-124], [new-131]]}}
soak: 1s
health_timeout: 30s
analysis:
  interval: 4s
  count: 2
  metrics:
    - name: errors
      template: error-ratio
      failure: result > 0.05
manifests: |
  apiVersion: apps/v1
  kind: Deployment
  metadata: {{name: web, namespace: default, labels: {{app: web}}}}
  spec:
    replicas: 4
    selector: {{matchLabels: {{app: web}}}}
    template:
      metadata: {{labels: {{app: web}}}}
      spec:
        containers:
          - name: web
            image: "{image}"
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_error_ratio_rises_fails_its_analysis_and_a_good_one_passes() -> Result<()>
{
    let (h, tsdb) = H::start_with_tsdb().await?;
    seed_web(&h, "registry.example.com/web:1.0.0")?;
    // the analysis needs the metrics in the TSDB first: the scrape, FLEET_METRICS, the TSDB's ingest
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let q = "sum by (cluster) (rate(http_requests_total{deployment=\"web\"}[4s]))";
        let body: Value = http
            .get(format!("{tsdb}/api/v1/query"))
            .query(&[("query", q)])
            .send()
            .await?
            .json()
            .await
            .unwrap_or_default();
        if body["data"]["result"]
            .as_array()
            .is_some_and(|r| r.len() == 2)
        {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "web's request rate never reached the TSDB: {body}\n{}",
            h.agent_log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // 30 % of the new version's requests fail: its rollout is healthy, its analysis is not
    let bad = analysed_release("web-bad", "registry.example.com/web:2.0.0-errors30");
    let (done, entries) = h.apply_and_wait(&bad, "web-bad").await?;
    let rel = done.release.context("release")?;
    assert_eq!(rel.state, State::RolledBack, "{entries:#?}");
    assert_eq!(rel.batches[0].state, "failed", "{entries:#?}");
    assert_eq!(
        rel.batches[1].state, "pending",
        "nothing reached the second batch: {entries:#?}"
    );
    assert_eq!(rel.changed, vec!["old-124"], "{entries:#?}");
    let error = rel.batches[0].error.clone().unwrap_or_default();
    assert!(
        error.starts_with("analysis failed: errors on old-124: 1 failed measurements (limit 0)"),
        "{error}"
    );
    // the measured value is on the history: the error ratio, well above 5 %, and the baseline (new-131,
    // not changed) near the 0.1 % a good image fails
    let analysis = done
        .history
        .iter()
        .find(|e| e.what == "analysis")
        .context("an analysis entry")?;
    let m = &analysis.detail["measurements"][0];
    let value = m["value"].as_f64().context("a value")?;
    assert!(value > 0.05 && value <= 0.31, "{m}");
    assert_eq!(m["verdict"], "failed", "{m}");
    let baseline = m["baseline"].as_f64().context("a baseline")?;
    assert!(baseline < 0.01, "{m}");
    // the rollback put web back at 1.0.0 on old-124; new-131 never changed
    for c in ["old-124", "new-131"] {
        let web = h
            .object(c, "apps", "deployments", "default", "web")
            .context("web")?;
        assert_eq!(
            web["spec"]["template"]["spec"]["containers"][0]["image"],
            "registry.example.com/web:1.0.0",
            "{c}"
        );
    }
    // a good version passes both batches' analyses
    let good = analysed_release("web-good", "registry.example.com/web:2.0.1");
    let (done, entries) = h.apply_and_wait(&good, "web-good").await?;
    let rel = done.release.context("release")?;
    assert_eq!(rel.state, State::Succeeded, "{entries:#?}");
    // two counted rounds per batch (one without a number yet would be asked again, not counted)
    for batch in [1, 2] {
        let counted = done
            .history
            .iter()
            .filter(|e| e.what == "analysis" && e.batch == Some(batch))
            .filter_map(|e| e.detail["round"].as_u64())
            .max();
        assert_eq!(counted, Some(2), "batch {batch}: {entries:#?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_window_holds_a_release_until_it_closes() -> Result<()> {
    use chrono::Timelike;
    // a deny window on new-131 open now, closing at a minute boundary at least 20 s away
    let now = Utc::now();
    let minutes = if now.second() > 40 { 2 } else { 1 };
    let closes = now
        .with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .context("a minute")?
        + chrono::Duration::minutes(minutes);
    let window: multipilot_release::windows::Window = serde_yaml::from_str(&format!(
        "kind: deny\nschedule: \"{} {} * * *\"\nduration: {minutes}m\nclusters: cluster=new-131\ndescription: test freeze\n",
        now.minute(),
        now.hour()
    ))?;
    let h = H::start_with(None, vec![window]).await?;
    let spec = r#"
name: frozen
targets: {clusters: [old-124, new-131]}
batches: {groups: [[old-124], [new-131]]}
soak: 1s
manifests: |
  apiVersion: v1
  kind: ConfigMap
  metadata: {name: frozen, namespace: default}
  data: {release: "1"}
"#;
    let r = h
        .call(
            "apply",
            &ApplyRequest {
                spec: Some(spec.into()),
                actor: "tester".into(),
                ..Default::default()
            },
        )
        .await?;
    assert!(r.ok, "{r:?}");
    // the first batch goes; the second holds while the window is open
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let held = loop {
        let r = h.history("frozen").await?;
        let rel = r.release.clone().context("release")?;
        if rel.state == State::Held {
            break r;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline && Utc::now() < closes,
            "never held: {:?}",
            r.history.iter().map(|e| &e.summary).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let rel = held.release.context("release")?;
    assert_eq!(rel.batches[0].state, "done");
    assert_eq!(rel.batches[1].state, "pending");
    let why = rel.waiting_for.clone().unwrap_or_default();
    assert!(
        why.contains("new-131") && why.contains("deny window 0"),
        "{why}"
    );
    assert!(
        h.object("new-131", "", "configmaps", "default", "frozen")
            .is_none()
    );
    assert!(
        h.object("old-124", "", "configmaps", "default", "frozen")
            .is_some()
    );
    let gitops = h
        .call("gitops", &NameRequest::default())
        .await?
        .gitops
        .context("gitops")?;
    assert_eq!(gitops.windows.len(), 1);
    assert!(gitops.windows[0].active, "{:?}", gitops.windows);
    // once the window closes the role goes on by itself
    let done = h.wait_until_state("frozen", State::Succeeded, 150).await?;
    let at = done
        .history
        .iter()
        .find(|e| e.what == "batch" && e.batch == Some(2) && e.ok)
        .context("batch 2 started")?
        .at;
    assert!(
        at >= closes,
        "batch 2 started at {at}, before the window closed at {closes}"
    );
    assert!(
        (at - closes).num_seconds() <= 15,
        "batch 2 started {}s after the window closed",
        (at - closes).num_seconds()
    );
    assert!(
        h.object("new-131", "", "configmaps", "default", "frozen")
            .is_some()
    );
    let held_entries = done.history.iter().filter(|e| e.what == "waiting").count();
    assert_eq!(held_entries, 1, "one entry for the hold, not one per retry");
    Ok(())
}
