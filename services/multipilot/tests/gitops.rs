//! GitOps end to end, as an operator runs it: `./scripts/up` (nats, the hub with every role, the fleet
//! simulator with 6 clusters, the agent) follows a local Git repository made from
//! `deploy/examples/fleet-repo`; the test commits to it, approves with the CLI, edits the simulated clusters
//! with real `kubectl`, and reads `multipilot gitops status`, `multipilot incidents` and FLEET_RELEASE.
//!
//! - The first commit converges the fleet: the policy bundles everywhere, then the `hello` release on the
//!   dev and staging clusters; the prod clusters only after `multipilot release approve hello gate`.
//! - A commit with invalid YAML, then one with an API version the 1.25+ clusters no longer serve, are
//!   refused whole (reported on FLEET_RELEASE) and change nothing; the next good commit is taken.
//! - `kubectl set image` on one cluster raises `release-drift` naming the field within 30 s; self-heal puts
//!   the image back and the incident resolves. Replicas written by `kube-controller-manager` through the scale
//!   subresource (as an HPA does) are not drift. A policy object deleted by hand (self-heal turned off by a commit) is
//!   `policy-drift` and fails the cluster's `policy-bundles` compliance check; the commit turning self-heal
//!   back on restores it.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use async_nats::jetstream::{self, consumer};
use common::system::System;
use futures::StreamExt;
use multipilot_schemas::Envelope;
use multipilot_schemas::payload::{Incident, IncidentStatus, ReleaseEvent};
use serde_json::Value;

fn git(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=gitops-test",
            "-c",
            "user.email=test@multipilot.invalid",
        ])
        .args(args)
        .output()
        .context("running git (./scripts/test installs it)")?;
    anyhow::ensure!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn commit(dir: &Path, msg: &str) -> Result<String> {
    git(dir, &["add", "-A"])?;
    git(dir, &["commit", "-qm", msg])?;
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
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

struct Ops<'a> {
    sys: &'a System,
    bin: &'a Path,
}

impl Ops<'_> {
    fn nats(&self) -> String {
        format!("nats://127.0.0.1:{}", self.sys.var("MULTIPILOT_NATS_PORT"))
    }

    fn cli(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(self.bin)
            .args(args)
            .env("MULTIPILOT_NATS__URL", self.nats())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "multipilot {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn status(&self) -> Result<Value> {
        Ok(serde_json::from_str(
            &self.cli(&["gitops", "status", "-o", "json"])?,
        )?)
    }

    /// Per cluster: (status, commit) of a release.
    fn clusters(&self, release: &str) -> Result<Vec<(String, String, String)>> {
        let st = self.status()?;
        let r = st["releases"]
            .as_array()
            .and_then(|l| l.iter().find(|r| r["release"] == release))
            .cloned()
            .unwrap_or(Value::Null);
        Ok(r["clusters"]
            .as_array()
            .map(|l| {
                l.iter()
                    .map(|c| {
                        (
                            c["cluster"].as_str().unwrap_or_default().to_string(),
                            c["status"].as_str().unwrap_or_default().to_string(),
                            c["commit"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Whether every cluster of `release` (but those in `except`) is Synced at `commit`; how many it has.
    fn synced_at(&self, release: &str, commit: &str, except: &[&str]) -> Result<(bool, usize)> {
        let cs = self.clusters(release)?;
        let all = cs
            .iter()
            .filter(|(c, _, _)| !except.contains(&c.as_str()))
            .all(|(_, s, c)| s == "Synced" && c == commit);
        Ok((all, cs.len()))
    }

    fn incidents(&self) -> Result<Vec<Incident>> {
        Ok(serde_json::from_str(&self.cli(&[
            "incidents",
            "--all",
            "-o",
            "json",
        ])?)?)
    }

    /// The `policy-bundles` check of a cluster's compliance report.
    fn policy_check(&self, cluster: &str) -> Result<Option<Value>> {
        let reports: Value =
            serde_json::from_str(&self.cli(&["compliance", "--by-cluster", "-o", "json"])?)?;
        Ok(reports
            .as_array()
            .and_then(|l| l.iter().find(|r| r["cluster"] == cluster))
            .and_then(|r| r["checks"].as_array())
            .and_then(|l| l.iter().find(|c| c["rule"] == "policy-bundles"))
            .cloned())
    }

    fn kubectl(&self, context: &str, args: &[&str]) -> Result<String> {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.sys.data.path().join("sim/kubeconfig.yaml"))
            .args(["--context", context])
            .args(args)
            .output()
            .context("running kubectl (./scripts/test installs it)")?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl {args:?} on {context}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Asks for a sync and waits until `commit` is refused; its problem.
    async fn refused(&self, commit: &str) -> Result<String> {
        self.cli(&["gitops", "sync"])?;
        self.until(&format!("commit {commit} refused"), 90, || {
            let st = self.status()?;
            let r = &st["repos"][0];
            Ok((r["refused"] == commit)
                .then(|| r["error"].as_str().unwrap_or_default().to_string()))
        })
        .await
    }

    /// The image of the hello Deployment on `cluster`.
    fn image(&self, cluster: &str) -> Result<String> {
        self.kubectl(
            cluster,
            &[
                "-n",
                "hello",
                "get",
                "deployment",
                "hello",
                "-o",
                "jsonpath={.spec.template.spec.containers[0].image}",
            ],
        )
    }

    /// Polls `f` until it gives a value (a deadline for a busy machine, not a timing assertion).
    async fn until<T>(
        &self,
        what: &str,
        secs: u64,
        mut f: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        let mut last = String::new();
        loop {
            match f() {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => {}
                Err(e) => last = format!("{e:#}"),
            }
            if std::time::Instant::now() > deadline {
                let st = self
                    .cli(&["gitops", "status"])
                    .unwrap_or_else(|e| e.to_string());
                bail!(
                    "{what}: not within {secs}s ({last})\n{st}\n{}",
                    self.sys.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

async fn release_events(nats: &str) -> Result<Vec<ReleaseEvent>> {
    let client = async_nats::connect(nats).await?;
    let js = jetstream::new(client);
    let stream = js.get_stream("FLEET_RELEASE").await?;
    let mut c = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: "fleet.release.>".into(),
            ..Default::default()
        })
        .await?;
    let n = c.info().await?.num_pending;
    let mut msgs = c.messages().await?;
    let mut out = Vec::new();
    for _ in 0..n {
        let Some(m) = msgs.next().await else { break };
        let m = m?;
        let env: Envelope<ReleaseEvent> = rmp_serde::from_slice(&m.payload)?;
        out.push(env.payload);
    }
    Ok(out)
}

const PROD: [&str; 2] = ["prod-euw-1", "prod-wus2-4"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_repository_converges_the_fleet_refuses_bad_commits_and_heals_drift() -> Result<()>
{
    let repo_dir = tempfile::Builder::new()
        .prefix("mp-fleet-repo-")
        .tempdir()?;
    let repo = repo_dir.path();
    copy_dir(&common::root().join("deploy/examples/fleet-repo"), repo)?;
    git(repo, &["init", "-q", "-b", "main"])?;
    let first = commit(repo, "the demo fleet")?;
    let repo_s = repo.display().to_string();
    let sys = System::up_with(&[
        ("MULTIPILOT_FLEET_REPO", repo_s.as_str()),
        ("MULTIPILOT_FLEET_REPO_INTERVAL", "2s"),
    ])?;
    let bin = Path::new(env!("CARGO_BIN_EXE_multipilot"));
    let ops = Ops { sys: &sys, bin };

    // 1. the first commit: policies everywhere, hello on dev and staging; prod waits for the gate
    let hello = ops
        .until("hello synced outside prod", 240, || {
            let cs = ops.clusters("hello")?;
            let done = cs.len() == 6
                && cs.iter().all(|(c, s, commit)| {
                    if PROD.contains(&c.as_str()) {
                        s == "OutOfSync"
                    } else {
                        s == "Synced" && *commit == first
                    }
                });
            Ok(done.then_some(cs))
        })
        .await?;
    assert_eq!(hello.len(), 6);
    for policy in ["policy-namespaces", "policy-rbac"] {
        let cs = ops.clusters(policy)?;
        assert!(
            cs.len() == 6 && cs.iter().all(|(_, s, c)| s == "Synced" && *c == first),
            "{policy}: {cs:?}"
        );
    }
    let st = ops.status()?;
    let prod_msg = st["releases"]
        .as_array()
        .and_then(|l| l.iter().find(|r| r["release"] == "hello"))
        .and_then(|r| {
            r["clusters"]
                .as_array()?
                .iter()
                .find(|c| c["cluster"] == PROD[0])
                .cloned()
        })
        .context("prod cluster")?;
    assert!(
        prod_msg["message"]
            .as_str()
            .unwrap_or_default()
            .contains("release approve hello gate"),
        "{prod_msg}"
    );
    assert!(
        ops.kubectl(PROD[0], &["-n", "hello", "get", "deployment", "hello"])
            .is_err(),
        "nothing reaches prod before the approval"
    );
    let quota = ops.kubectl(
        PROD[0],
        &[
            "-n",
            "hello",
            "get",
            "resourcequota",
            "team-quota",
            "-o",
            "jsonpath={.spec.hard.requests\\.cpu}",
        ],
    )?;
    assert_eq!(
        quota, "16",
        "the policy bundle renders per cluster: prod's quota"
    );
    assert_eq!(
        ops.kubectl(
            "dev-aps-6",
            &[
                "-n",
                "hello",
                "get",
                "resourcequota",
                "team-quota",
                "-o",
                "jsonpath={.spec.hard.requests\\.cpu}"
            ]
        )?,
        "4"
    );

    // 2. approved: prod converges too
    ops.cli(&["release", "approve", "hello", "gate"])?;
    ops.until("hello synced everywhere", 180, || {
        let (synced, n) = ops.synced_at("hello", &first, &[])?;
        Ok((synced && n == 6).then_some(()))
    })
    .await?;

    // 3. a broken commit, then one with an API version the newer clusters no longer serve: refused whole
    std::fs::write(
        repo.join("releases/broken.yaml"),
        "name: broken\ntargets: {selector: env\nmanifests: [\n",
    )?;
    std::fs::write(
        repo.join("releases/hello.yaml"),
        std::fs::read_to_string(repo.join("releases/hello.yaml"))?
            .replace("hello:1.0.0", "hello:1.1.0"),
    )?;
    let broken = commit(repo, "a typo")?;
    let err = ops.refused(&broken).await?;
    assert!(err.contains("releases/broken.yaml"), "{err}");
    std::fs::remove_file(repo.join("releases/broken.yaml"))?;
    std::fs::write(
        repo.join("releases/cron.yaml"),
        "name: cleanup\ntargets: {selector: env}\nmanifests: |\n  apiVersion: batch/v1beta1\n  kind: CronJob\n  metadata: {name: cleanup, namespace: hello}\n  spec:\n    schedule: \"0 3 * * *\"\n    jobTemplate:\n      spec:\n        template:\n          spec:\n            restartPolicy: Never\n            containers: [{name: c, image: busybox}]\n",
    )?;
    let blocked = commit(repo, "a CronJob on batch/v1beta1")?;
    let err = ops.refused(&blocked).await?;
    assert!(err.contains("batch/v1beta1"), "{err}");
    // nothing changed: every cluster still runs the first commit's image
    for (c, _, commit) in ops.clusters("hello")? {
        assert_eq!(commit, first, "{c}");
        let image = ops.image(&c)?;
        assert_eq!(image, "registry.example.com/hello:1.0.0", "{c}");
    }
    let events = release_events(&ops.nats()).await?;
    for bad in [&broken, &blocked] {
        assert!(
            events
                .iter()
                .any(|e| e.what == "sync" && !e.ok && e.commit.as_deref() == Some(bad.as_str())),
            "no refusal of {bad} on FLEET_RELEASE"
        );
    }
    std::fs::remove_file(repo.join("releases/cron.yaml"))?;
    let fixed = commit(repo, "without the CronJob")?;
    ops.cli(&["gitops", "sync"])?;
    ops.until("the fixed commit taken", 60, || {
        Ok((ops.status()?["repos"][0]["synced"] == fixed.as_str()).then_some(()))
    })
    .await?;
    // the new image goes out outside prod; prod's batch holds for a new approval of the new revision
    ops.until("hello 1.1.0 outside prod", 180, || {
        Ok(ops.synced_at("hello", &fixed, &PROD)?.0.then_some(()))
    })
    .await?;

    // 4. an edit by hand is drift, named with its field, and self-heal puts it back
    let edited = "staging-fra-5";
    ops.kubectl(
        edited,
        &[
            "-n",
            "hello",
            "set",
            "image",
            "deployment/hello",
            "hello=registry.example.com/hello:6.6.6",
        ],
    )?;
    let started = std::time::Instant::now();
    let inc = ops
        .until("a release-drift incident", 60, || {
            Ok(ops
                .incidents()?
                .into_iter()
                .find(|i| i.kind == "release-drift" && i.cluster == edited))
        })
        .await?;
    let took = started.elapsed();
    assert!(
        inc.summary.contains(
            ".spec.template.spec.containers[hello].image is \"registry.example.com/hello:6.6.6\""
        ) && inc.summary.contains("kubectl-set"),
        "{}",
        inc.summary
    );
    eprintln!("kubectl set image → release-drift incident: {took:?}");
    ops.until("the image healed", 60, || {
        let image = ops.image(edited)?;
        Ok((image == "registry.example.com/hello:1.1.0").then_some(()))
    })
    .await?;
    ops.until("the drift incident resolved", 60, || {
        Ok(ops
            .incidents()?
            .iter()
            .any(|i| {
                i.kind == "release-drift"
                    && i.cluster == edited
                    && i.status == IncidentStatus::Resolved
            })
            .then_some(()))
    })
    .await?;
    let history = ops.cli(&["release", "history", "hello"])?;
    assert_eq!(
        history
            .matches("self-heal on staging-fra-5: re-applied Deployment hello/hello")
            .count(),
        1,
        "one edit, one heal (however many states came before the heal's own):\n{history}"
    );
    assert!(!history.contains("gave up"), "{history}");

    // 5. replicas an HPA sets (kube-controller-manager, through the scale subresource as the HPA
    // controller writes them) are not drift: they stay, nothing opens
    ops.kubectl(
        "dev-euw4-3",
        &[
            "-n",
            "hello",
            "patch",
            "deployment",
            "hello",
            "--subresource=scale",
            "--field-manager=kube-controller-manager",
            "-p",
            "{\"spec\":{\"replicas\":5}}",
        ],
    )?;
    // a check that nothing happens: the drift judge publishes only changes, so there is no condition to
    // wait for; 5 s is ten times what an edit took to become an incident above
    tokio::time::sleep(Duration::from_secs(5)).await;
    let replicas = ops.kubectl(
        "dev-euw4-3",
        &[
            "-n",
            "hello",
            "get",
            "deployment",
            "hello",
            "-o",
            "jsonpath={.spec.replicas}",
        ],
    )?;
    assert_eq!(
        replicas, "5",
        "self-heal must leave an HPA's replicas alone"
    );
    assert!(
        !ops.incidents()?
            .iter()
            .any(|i| i.kind == "release-drift" && i.cluster == "dev-euw4-3"),
        "an HPA's replicas are not drift"
    );
    let cs = ops.clusters("hello")?;
    assert!(
        cs.iter()
            .any(|(c, s, _)| c == "dev-euw4-3" && s == "Synced"),
        "{cs:?}"
    );

    // 6. a policy object deleted by hand is drift and fails the cluster's compliance; self-heal (off for
    // this, then on again by a commit) brings it back and the cluster is compliant again
    let policy_file = repo.join("policies/namespaces.yaml");
    let policy_text = std::fs::read_to_string(&policy_file)?;
    std::fs::write(
        &policy_file,
        policy_text.replace("self_heal: true", "self_heal: false"),
    )?;
    let no_heal = commit(repo, "policies: no self-heal")?;
    ops.cli(&["gitops", "sync"])?;
    ops.until("the policy bundle at the new commit", 120, || {
        Ok(ops
            .synced_at("policy-namespaces", &no_heal, &[])?
            .0
            .then_some(()))
    })
    .await?;
    ops.kubectl(
        "dev-aps-6",
        &["-n", "hello", "delete", "networkpolicy", "default-deny"],
    )?;
    let inc = ops
        .until("drift for the deleted policy", 60, || {
            Ok(ops.incidents()?.into_iter().find(|i| {
                i.kind == "policy-drift"
                    && i.cluster == "dev-aps-6"
                    && i.status != IncidentStatus::Resolved
            }))
        })
        .await?;
    assert!(
        inc.summary
            .contains("NetworkPolicy hello/default-deny was deleted"),
        "{}",
        inc.summary
    );
    let check = ops
        .until(
            "policy-bundles failing in the compliance report",
            60,
            || {
                Ok(ops
                    .policy_check("dev-aps-6")?
                    .filter(|c| c["status"] == "fail"))
            },
        )
        .await?;
    assert!(
        check["message"]
            .as_str()
            .unwrap_or_default()
            .contains("default-deny"),
        "{check}"
    );
    assert_eq!(
        ops.policy_check("dev-euw4-3")?.map(|c| c["status"].clone()),
        Some(Value::from("pass")),
        "the other clusters keep their policies"
    );
    std::fs::write(&policy_file, policy_text)?;
    let healing = commit(repo, "policies: self-heal again")?;
    ops.cli(&["gitops", "sync"])?;
    ops.until("the network policy back", 120, || {
        Ok(ops
            .kubectl(
                "dev-aps-6",
                &[
                    "-n",
                    "hello",
                    "get",
                    "networkpolicy",
                    "default-deny",
                    "-o",
                    "name",
                ],
            )
            .ok()
            .filter(|s| !s.is_empty()))
    })
    .await?;
    ops.until("compliant again", 60, || {
        Ok(ops
            .policy_check("dev-aps-6")?
            .filter(|c| c["status"] == "pass"))
    })
    .await?;
    ops.until("the policy drift resolved", 60, || {
        Ok(ops
            .incidents()?
            .iter()
            .any(|i| {
                i.kind == "policy-drift"
                    && i.cluster == "dev-aps-6"
                    && i.status == IncidentStatus::Resolved
            })
            .then_some(()))
    })
    .await?;
    ops.until(
        "the policy bundle synced at the healing commit",
        120,
        || {
            Ok(ops
                .synced_at("policy-namespaces", &healing, &[])?
                .0
                .then_some(()))
        },
    )
    .await?;
    drop(sys);
    Ok(())
}
