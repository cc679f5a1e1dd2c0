//! Kustomize sources, built with the host's real `kubectl kustomize`: a fleet repository (real Git) holds
//! `base/`, `overlays/prod` and `overlays/dev` and a release spec whose `kustomize` path picks the overlay
//! by the cluster's `env` label; the release role (library) follows it against the fleet simulator (a prod
//! and a dev cluster) and the real `multipilot-agent`.
//!
//! - Each cluster's plan holds what its overlay builds (name prefix, replicas), dry-run and diffed as
//!   inline manifests are; the release applies them. A `{{` the overlay builds is not a template.
//! - A commit that changes only the base changes what is built, so the release is planned again.
//! - A broken kustomization refuses the commit, naming the spec, the overlay's path and the commit.
//! - The CLI builds a plain path itself (`release plan -f`), and refuses a templated one.

#[path = "../../agent/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use async_nats::jetstream;
use multipilot_bus::topology::Topology;
use multipilot_release::config::{GitOps, Repo};
use multipilot_release::gitops::Report;
use multipilot_release::model::{NameRequest, Release, Reply, State};
use multipilot_sim::fleet::{self, Fleet};
use multipilot_sim::store::ResKey;
use multipilot_testkit::NatsServer;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const PROD: &str = "prod-kz-1";
const DEV: &str = "dev-kz-2";
const T: Duration = Duration::from_secs(30);

struct H {
    nats: NatsServer,
    fleet: Arc<Fleet>,
    sim_cancel: CancellationToken,
    role_cancel: CancellationToken,
    dir: tempfile::TempDir,
    agent: Option<Child>,
    client: async_nats::Client,
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

fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=kz-test",
            "-c",
            "user.email=test@multipilot.invalid",
        ])
        .args(args)
        .output()
        .context("running git")?;
    anyhow::ensure!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn commit(dir: &Path, msg: &str) -> Result<String> {
    git(dir, &["add", "-A"])?;
    git(dir, &["commit", "-qm", msg])?;
    git(dir, &["rev-parse", "--short=12", "HEAD"])
}

fn write(root: &Path, files: &[(&str, &str)]) -> Result<()> {
    for (path, text) in files {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().context("a parent")?)?;
        std::fs::write(p, text)?;
    }
    Ok(())
}

const BASE_DEPLOYMENT: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default, labels: {app: web}}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: "registry.example.com/web:1.0"}]}
"#;

const DEV_OVERLAY: &str = concat!(
    "resources: [../../base]\nnamePrefix: dev-\n",
    "configMapGenerator:\n",
    "- name: web-config\n  namespace: default\n",
    "  options: {disableNameSuffixHash: true}\n",
    "  literals: ['greeting={{ .Values.greeting }}']\n",
);

/// The repository: base, two overlays (prod: 3 replicas, dev: 1 and a ConfigMap holding a Go template)
/// and the release spec picking the overlay by label.
fn fleet_repo(root: &Path) -> Result<()> {
    write(
        root,
        &[
            (
                "apps/web/base/kustomization.yaml",
                "resources: [deployment.yaml]\n",
            ),
            ("apps/web/base/deployment.yaml", BASE_DEPLOYMENT),
            (
                "apps/web/overlays/prod/kustomization.yaml",
                "resources: [../../base]\nnamePrefix: prod-\nreplicas: [{name: web, count: 3}]\n",
            ),
            ("apps/web/overlays/dev/kustomization.yaml", DEV_OVERLAY),
            (
                "releases/web.yaml",
                concat!(
                    "name: web\n",
                    "targets: {selector: env}\n",
                    "kustomize: ../apps/web/overlays/{{ cluster.labels.env }}\n",
                    "manifests: |\n",
                    "  apiVersion: v1\n  kind: ConfigMap\n",
                    "  metadata: {name: web-env, namespace: default}\n",
                    "  data: {env: '{{ cluster.labels.env }}'}\n",
                ),
            ),
        ],
    )
}

impl H {
    async fn start(repo: &Path) -> Result<H> {
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
                    versions: vec!["1.31".into()],
                    names: vec![PROD.into(), DEV.into()],
                    objects: 60,
                    churn: 0.0,
                    ..Default::default()
                },
                sim_cancel.clone(),
            )
            .await?,
        );
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig.yaml");
        fleet.write_kubeconfig(&kubeconfig)?;
        let role_cancel = CancellationToken::new();
        let config = multipilot_release::Config {
            data_dir: dir.path().join("release").to_string_lossy().into_owned(),
            default_soak: Duration::from_secs(1),
            health_timeout: Duration::from_secs(20),
            command_timeout: Duration::from_secs(5),
            gitops: GitOps {
                repos: vec![Repo {
                    name: "fleet".into(),
                    url: repo.display().to_string(),
                    branch: "main".into(),
                    path: String::new(),
                    interval: Duration::from_secs(1),
                }],
                ..Default::default()
            },
            ..Default::default()
        };
        let key = config.signing_key_path();
        let ctx = multipilot_runtime::Context::new(
            nats.client().await?,
            "release-kustomize-test",
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
                "clusters:\n  - {{name: {PROD}, labels: {{env: prod}}}}\n  - {{name: {DEV}, labels: {{env: dev}}}}\n\
                 release:\n  enabled: true\n  trusted_key_files: [{:?}]\n",
                pub_key.display().to_string()
            ),
        )?;
        let log = std::fs::File::create(dir.path().join("agent.log"))?;
        let agent = Command::new(common::agent_bin())
            .arg("--config")
            .arg(&agent_cfg)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env("MULTIPILOT_AGENT__NATS__URL", nats.url())
            .env("MULTIPILOT_AGENT__OUTBOX__PATH", dir.path().join("outbox"))
            .env("MULTIPILOT_AGENT__HTTP__LISTEN", "127.0.0.1:0")
            .env("MULTIPILOT_AGENT__TIMINGS__DISCOVERY_INTERVAL_S", "5")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting multipilot-agent (cargo build -p multipilot-agent)")?;
        Ok(H {
            nats,
            fleet,
            sim_cancel,
            role_cancel,
            dir,
            agent: Some(agent),
            client,
        })
    }

    fn agent_log(&self) -> String {
        let t = std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default();
        let lines: Vec<&str> = t.lines().rev().take(30).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    async fn call(&self, verb: &str, release: Option<&str>) -> Result<Reply> {
        Ok(multipilot_release::call(
            &self.client,
            verb,
            &NameRequest {
                release: release.map(str::to_string),
                actor: "tester".into(),
            },
            T,
        )
        .await?)
    }

    async fn release(&self, name: &str) -> Result<Option<Release>> {
        let r = self.call("status", Some(name)).await?;
        Ok(r.release.map(|b| *b))
    }

    async fn gitops(&self) -> Result<Report> {
        let r = self.call("gitops", None).await?;
        r.gitops.map(|b| *b).context("no gitops report")
    }

    /// Polls `f` until it gives a value (a deadline for a busy machine, not a timing assertion).
    async fn until<T, F, Fut>(&self, what: &str, secs: u64, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>>>,
    {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        let mut last = String::new();
        loop {
            match f().await {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => {}
                Err(e) => last = format!("{e:#}"),
            }
            if tokio::time::Instant::now() > deadline {
                let st = self
                    .gitops()
                    .await
                    .map(|r| format!("{:?}", r.repos))
                    .unwrap_or_default();
                bail!(
                    "{what}: not within {secs}s ({last})\nrepos: {st}\nagent:\n{}",
                    self.agent_log()
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The live object of the simulator.
    fn object(&self, cluster: &str, group: &str, plural: &str, name: &str) -> Option<Value> {
        let c = self.fleet.get(cluster)?;
        c.store
            .get(&ResKey::new(group, plural), "default", name)
            .map(|v| (*v).clone())
    }
}

/// A cluster's planned objects: (kind, name, rendered).
fn planned(r: &Release, cluster: &str) -> Vec<(String, String, Value)> {
    r.plan
        .clusters
        .iter()
        .find(|c| c.cluster == cluster)
        .map(|c| {
            c.objects
                .iter()
                .map(|o| {
                    (
                        o.object.kind.clone(),
                        o.object.name.clone(),
                        o.rendered.clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_cluster_runs_the_overlay_its_labels_pick_and_a_broken_one_refuses_the_commit()
-> Result<()> {
    let repo_dir = tempfile::Builder::new().prefix("mp-kz-repo-").tempdir()?;
    let repo = repo_dir.path();
    git(repo, &["init", "-q", "-b", "main"])?;
    fleet_repo(repo)?;
    let first = commit(repo, "web from a kustomization")?;
    let h = H::start(repo).await?;

    // 1. the release is planned and applied: each cluster its overlay, after the manifests
    let r = h
        .until("web applied at the first commit", 150, || async {
            // both clusters: one may report after the commit was read (it gets a new revision then)
            Ok(h.release("web").await?.filter(|r| {
                r.state == State::Succeeded
                    && r.source.commit.as_deref() == Some(first.as_str())
                    && r.plan.clusters.len() == 2
            }))
        })
        .await?;
    let prod = planned(&r, PROD);
    let names: Vec<(&str, &str)> = prod
        .iter()
        .map(|(k, n, _)| (k.as_str(), n.as_str()))
        .collect();
    assert_eq!(
        names,
        [("ConfigMap", "web-env"), ("Deployment", "prod-web")],
        "{prod:?}"
    );
    assert_eq!(prod[1].2["spec"]["replicas"], 3);
    let dev = planned(&r, DEV);
    let names: Vec<(&str, &str)> = dev
        .iter()
        .map(|(k, n, _)| (k.as_str(), n.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("ConfigMap", "web-env"),
            ("ConfigMap", "dev-web-config"),
            ("Deployment", "dev-web")
        ],
        "{dev:?}"
    );
    assert_eq!(dev[2].2["spec"]["replicas"], 1);
    assert_eq!(
        dev[1].2["data"]["greeting"], "{{ .Values.greeting }}",
        "what kustomize built is not a template"
    );
    // dry-run and diffed as inline manifests are: a new object would be created
    let web = r
        .plan
        .clusters
        .iter()
        .find(|c| c.cluster == PROD)
        .context("prod")?;
    assert!(
        web.objects.iter().all(|o| o.error.is_none()),
        "{:?}",
        web.objects
    );
    let live = h
        .object(PROD, "apps", "deployments", "prod-web")
        .context("prod-web on prod")?;
    assert_eq!(live["spec"]["replicas"], 3);
    assert!(h.object(PROD, "apps", "deployments", "dev-web").is_none());
    let live = h
        .object(DEV, "apps", "deployments", "dev-web")
        .context("dev-web on dev")?;
    assert_eq!(live["spec"]["replicas"], 1);
    let cm = h
        .object(DEV, "", "configmaps", "dev-web-config")
        .context("web-config on dev")?;
    assert_eq!(cm["data"]["greeting"], "{{ .Values.greeting }}");

    // 2. a commit that changes only the base is planned and applied again
    let revision = r.revision;
    write(
        repo,
        &[(
            "apps/web/base/deployment.yaml",
            &BASE_DEPLOYMENT.replace("web:1.0", "web:1.1"),
        )],
    )?;
    let second = commit(repo, "web 1.1 in the base")?;
    let at_second = h
        .until("web applied at the base's commit", 120, || async {
            Ok(h.release("web").await?.filter(|r| {
                r.revision > revision
                    && r.state == State::Succeeded
                    && r.source.commit.as_deref() == Some(second.as_str())
            }))
        })
        .await?;
    let live = h
        .object(PROD, "apps", "deployments", "prod-web")
        .context("prod-web")?;
    assert_eq!(
        live["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example.com/web:1.1"
    );

    // 3. a broken kustomization refuses the commit: the spec, the overlay and the commit named
    write(
        repo,
        &[(
            "apps/web/overlays/dev/kustomization.yaml",
            "resources: [../../base, missing.yaml]\nnamePrefix: dev-\n",
        )],
    )?;
    let broken = commit(repo, "dev overlay names a file it lacks")?;
    let err = h
        .until("the broken commit refused", 60, || async {
            let st = h.gitops().await?;
            let repo = st.repos.first().context("the repository")?;
            Ok((repo.refused.as_deref() == Some(broken.as_str()))
                .then(|| repo.error.clone().unwrap_or_default()))
        })
        .await?;
    assert!(
        err.contains(&format!(
            "releases/web.yaml: kustomize apps/web/overlays/dev at commit {broken}: kubectl kustomize: "
        )) && err.contains("apps/web/overlays/dev/missing.yaml")
            && !err.contains(".tree/"),
        "{err}"
    );
    eprintln!("refused: {err}");
    let r = h.release("web").await?.context("web")?;
    assert_eq!(
        (r.revision, r.source.commit.as_deref()),
        (at_second.revision, Some(second.as_str())),
        "nothing of the refused commit is planned"
    );
    // the commit's files written out for kustomize are gone
    let gitops_dir = h.dir.path().join("release/gitops");
    let left: Vec<String> = std::fs::read_dir(&gitops_dir)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["fleet.git"], "{left:?}");
    // an overlay the commit doesn't have, likewise
    write(
        repo,
        &[
            (
                "releases/web.yaml",
                &std::fs::read_to_string(repo.join("releases/web.yaml"))?
                    .replace("overlays/{{", "overlay/{{"),
            ),
            ("apps/web/overlays/dev/kustomization.yaml", DEV_OVERLAY),
        ],
    )?;
    let missing = commit(repo, "a typo in the path")?;
    let err = h
        .until("the typo refused", 60, || async {
            let st = h.gitops().await?;
            let repo = st.repos.first().context("the repository")?;
            Ok((repo.refused.as_deref() == Some(missing.as_str()))
                .then(|| repo.error.clone().unwrap_or_default()))
        })
        .await?;
    assert!(
        err.contains(&format!(
            "kustomize apps/web/overlay/prod at commit {missing}: no such directory in the commit"
        )),
        "{err}"
    );

    // 4. the CLI builds a plain path itself and sends what it built; a templated one needs the repository
    let cli = Path::new(env!("CARGO_BIN_EXE_multipilot"));
    let specs = tempfile::tempdir()?;
    write(
        specs.path(),
        &[
            (
                "web-cli.yaml",
                &format!(
                    "name: web-cli\ntargets: {{clusters: [{PROD}]}}\nkustomize: {}\n",
                    repo.join("apps/web/overlays/prod").display()
                ),
            ),
            (
                "web-rel.yaml",
                "name: web-cli\ntargets: {clusters: [prod-kz-1]}\nkustomize: overlays/prod\n",
            ),
            (
                "web-tpl.yaml",
                "name: web-cli\ntargets: {selector: env}\nkustomize: overlays/{{ cluster.labels.env }}\n",
            ),
        ],
    )?;
    copy_dir(&repo.join("apps/web"), specs.path())?;
    let run = |file: &str| {
        Command::new(cli)
            .args(["release", "plan", "-o", "json", "-f"])
            .arg(specs.path().join(file))
            .env("MULTIPILOT_NATS__URL", h.nats.url())
            .output()
    };
    let out = run("web-cli.yaml")?;
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("relative to the spec file"),
        "an absolute path is refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run("web-rel.yaml")?;
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Release = serde_json::from_slice(&out.stdout)?;
    let names: Vec<String> = planned(&r, PROD).into_iter().map(|(_, n, _)| n).collect();
    assert_eq!(names, ["prod-web"]);
    let out = run("web-tpl.yaml")?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is a template") && err.contains("fleet repository"),
        "{err}"
    );
    drop(h);
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &target)?;
        } else {
            std::fs::copy(e.path(), target)?;
        }
    }
    Ok(())
}
