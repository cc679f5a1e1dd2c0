//! Least privilege on the bus, checked against the shipped `deploy/nats/accounts.conf` on a real
//! nats-server: every hub role and the agent do their whole job under their own user (no permission
//! violation in the server's log), and the agent of prod-1 can't publish as another cluster, read another
//! cluster's commands or anybody's replies, read streams through consumers, or publish incidents, alerts,
//! audit records or commands.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use async_nats::jetstream;
use chrono::Utc;
use common::{Proc, root};
use futures::StreamExt;
use multipilot_bus::topology::Topology;
use multipilot_schemas::payload::{AuditRecord, Heartbeat};
use multipilot_schemas::{Envelope, subject};
use multipilot_testkit::{NatsServer, free_port};
use tokio_util::sync::CancellationToken;

const ROLES: [&str; 5] = ["correlator", "tsdb", "alerts", "console", "release"];

/// The shipped accounts file with a password per user in place of the environment variables.
fn accounts() -> Result<String> {
    accounts_from(&root().join("deploy/nats/accounts.conf"))
}

/// An accounts file with `pw-<user>` in place of each `$MULTIPILOT_<USER>_PASSWORD`, and the file it includes
/// (its sibling `fleet-mappings.conf`) inlined, so the test server's config can live anywhere.
fn accounts_from(path: &Path) -> Result<String> {
    let mappings = std::fs::read_to_string(
        path.parent()
            .context("accounts file's directory")?
            .join("fleet-mappings.conf"),
    )?;
    let text = std::fs::read_to_string(path)?.replace("include ./fleet-mappings.conf", &mappings);
    let re = regex::Regex::new(r"\$MULTIPILOT_([A-Z0-9_]+)_PASSWORD")?;
    Ok(re
        .replace_all(&text, |c: &regex::Captures<'_>| {
            format!("\"pw-{}\"", c[1].to_lowercase())
        })
        .into_owned())
}

fn password(user: &str) -> String {
    format!("pw-{}", user.replace('-', "_"))
}

async fn connect(nats: &NatsServer, user: &str, inbox: &str) -> Result<async_nats::Client> {
    Ok(async_nats::ConnectOptions::new()
        .user_and_password(user.into(), password(user))
        .custom_inbox_prefix(inbox)
        .connect(nats.url())
        .await?)
}

fn violations(nats: &NatsServer) -> Vec<String> {
    std::fs::read_to_string(nats.store_dir().parent().unwrap().join("nats.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("Violation"))
        .map(str::to_string)
        .collect()
}

/// [`common::eventually`], polling every 250 ms: some checks run the CLI.
async fn eventually<T>(what: &str, secs: u64, f: impl AsyncFnMut() -> Option<T>) -> Result<T> {
    common::eventually_every(what, secs, Duration::from_millis(250), f).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_role_works_under_its_own_user_and_an_agent_speaks_only_for_its_cluster() -> Result<()>
{
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_multipilot"))
        .parent()
        .context("bin dir")?
        .to_path_buf();
    anyhow::ensure!(
        bin_dir.join("multipilot-agent").is_file(),
        "multipilot-agent is not built in {}: run `cargo build --bins` first (./scripts/test does)",
        bin_dir.display()
    );
    let accounts = accounts()?;
    // anonymous connections (the test kit's readiness probe, provisioning) are the admin user
    let nats = NatsServer::start_with(|_| format!("{accounts}\nno_auth_user: admin\n")).await?;
    let admin = nats.client().await?;
    let admin_js = jetstream::new(admin.clone());
    Topology::embedded().provision(&admin_js).await?;

    // one simulated cluster, prod-1, on 1.24 (below the baseline: non-compliant)
    let fleet_cfg = multipilot_sim::fleet::Config {
        clusters: 1,
        versions: vec!["1.24".into()],
        names: vec!["prod-1".into()],
        objects: 150,
        ..Default::default()
    };
    let sim_cancel = CancellationToken::new();
    let _guard = sim_cancel.clone().drop_guard();
    let fleet =
        Arc::new(multipilot_sim::fleet::Fleet::start(&fleet_cfg, sim_cancel.clone()).await?);
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig.yaml");
    fleet.write_kubeconfig(&kubeconfig)?;
    std::fs::write(
        dir.path().join("tokens.yaml"),
        "- token: viewer-secret-token-0123456789\n  subject: test\n  role: viewer\n",
    )?;

    let (tsdb_port, alerts_port, console_port) = (free_port()?, free_port()?, free_port()?);
    let mut procs = Vec::new();
    for role in ROLES {
        procs.push(Proc::spawn(
            common::role(
                role,
                &nats.url(),
                &dir.path().join("hub"),
                &dir.path().join(format!("{role}.log")),
            )?
            .env("MULTIPILOT_NATS__USER", role)
            .env("MULTIPILOT_NATS__PASSWORD", password(role))
            .env("MULTIPILOT_NATS__INBOX_PREFIX", format!("_INBOX_{role}"))
            .env("MULTIPILOT_PROVISION__ENABLED", "false")
            .env("MULTIPILOT_TSDB__LISTEN", format!("127.0.0.1:{tsdb_port}"))
            .env(
                "MULTIPILOT_ALERTS__LISTEN",
                format!("127.0.0.1:{alerts_port}"),
            )
            .env("MULTIPILOT_ALERTS__EVENT_MIN_SEVERITY", "off")
            .env(
                "MULTIPILOT_CONSOLE__LISTEN",
                format!("127.0.0.1:{console_port}"),
            )
            .env(
                "MULTIPILOT_CONSOLE__AUTH__TOKENS_FILE",
                dir.path().join("tokens.yaml"),
            )
            .env(
                "MULTIPILOT_CONSOLE__TSDB_URL",
                format!("http://127.0.0.1:{tsdb_port}"),
            ),
        )?);
    }
    let agent_log = std::fs::File::create(dir.path().join("agent.log"))?;
    procs.push(Proc::spawn(
        Command::new(bin_dir.join("multipilot-agent"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--cluster", "prod-1"])
            .env("MULTIPILOT_AGENT__NATS__URL", nats.url())
            .env("MULTIPILOT_AGENT__NATS__USER", "agent-prod-1")
            .env("MULTIPILOT_AGENT__NATS__PASSWORD", password("agent-prod-1"))
            .env("MULTIPILOT_AGENT__NATS__INBOX_PREFIX", "_INBOX_prod-1")
            .env("MULTIPILOT_AGENT__OUTBOX__PATH", dir.path().join("outbox"))
            .env("MULTIPILOT_AGENT__HTTP__LISTEN", "127.0.0.1:0")
            .env("MULTIPILOT_AGENT__PROBES__INTERVAL_S", "2")
            .env("MULTIPILOT_AGENT__SCRAPE__INTERVAL_S", "2")
            .env("MULTIPILOT_AGENT__TIMINGS__HEARTBEAT_INTERVAL_S", "1")
            .stdout(Stdio::null())
            .stderr(agent_log),
    )?);
    let logs = || {
        let mut out = String::new();
        for f in ROLES
            .iter()
            .map(|r| format!("{r}.log"))
            .chain(["agent.log".to_string()])
        {
            let t = std::fs::read_to_string(dir.path().join(&f)).unwrap_or_default();
            let tail: Vec<&str> = t.lines().rev().take(8).collect();
            out.push_str(&format!(
                "--- {f}\n{}\n",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        out.push_str(&violations(&nats).join("\n"));
        out
    };

    // --- every role does its work
    let operator_cli = |args: &[&str]| {
        common::cli(
            args,
            &[
                ("MULTIPILOT_NATS__URL", &nats.url()),
                ("MULTIPILOT_NATS__USER", "operator"),
                ("MULTIPILOT_NATS__PASSWORD", &password("operator")),
                ("MULTIPILOT_NATS__INBOX_PREFIX", "_INBOX_operator"),
            ],
        )
    };
    let http = reqwest::Client::new();
    eventually(
        "the correlator's compliance verdict, asked by the operator",
        120,
        async || {
            operator_cli(&["compliance", "-o", "json"])
                .ok()
                .filter(|o| o.contains("kubernetes-version") && o.contains("prod-1"))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    // a Service exposed on an external IP: an incident, through agent, correlator and alert router
    multipilot_sim::world::set_fault(
        fleet.get("prod-1").context("prod-1")?,
        "external-ips",
        true,
        &Default::default(),
    )?;
    eventually("the incident, asked by the operator", 120, async || {
        operator_cli(&["incidents", "-o", "json"])
            .ok()
            .filter(|o| o.contains("external-ip-exposure") && o.contains("prod-1"))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    eventually("samples in the TSDB", 120, async || {
        let v: serde_json::Value = http
            .get(format!("http://127.0.0.1:{tsdb_port}/api/v1/query"))
            .query(&[(
                "query",
                "count(apiserver_storage_objects{cluster=\"prod-1\"})",
            )])
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        v["data"]["result"]
            .as_array()
            .filter(|r| !r.is_empty())
            .map(|_| ())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    eventually("the alert router holding the incident", 60, async || {
        let t = http
            .get(format!("http://127.0.0.1:{alerts_port}/api/v2/alerts"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        t.contains("external-ip-exposure").then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    eventually(
        "the console listing prod-1 with its version",
        60,
        async || {
            let t = http
                .get(format!("http://127.0.0.1:{console_port}/api/v1/clusters"))
                .bearer_auth("viewer-secret-token-0123456789")
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            (t.contains("prod-1") && t.contains("1.24")).then_some(())
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    operator_cli(&["status"]).map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    let v = violations(&nats);
    assert!(
        v.is_empty(),
        "permission violations while every role did its work:\n{}",
        v.join("\n")
    );
    // no credential in any log
    for f in ROLES
        .iter()
        .map(|r| format!("{r}.log"))
        .chain(["agent.log".to_string()])
    {
        let t = std::fs::read_to_string(dir.path().join(&f))?;
        for user in ROLES.iter().copied().chain(["agent-prod-1"]) {
            assert!(
                !t.contains(&password(user)),
                "{f} shows the password of {user}"
            );
        }
        assert!(
            !t.contains("viewer-secret-token"),
            "{f} shows a console token"
        );
    }

    // --- the agent of prod-1 speaks only for prod-1
    let agent = connect(&nats, "agent-prod-1", "_INBOX_prod-1").await?;
    let ajs = jetstream::new(agent.clone());
    let hb = |cluster: &str| {
        let env = Envelope::new(
            cluster,
            "agent-test",
            Utc::now(),
            1,
            Heartbeat {
                interval_s: 1,
                agent_version: "test".into(),
                started_at: Utc::now(),
                outbox_depth: 0,
                dropped_metric_batches: 0,
                apiserver_reachable: true,
                superseded: 0,
                duplicates: 0,
            },
        );
        multipilot_schemas::encode(&env).unwrap()
    };
    // its own subject: stored
    ajs.publish(subject::heartbeat("prod-1"), hb("prod-1").into())
        .await?
        .await?;
    // anything else: refused (no ack), and not stored
    let denied: Vec<(String, Vec<u8>)> = vec![
        (subject::heartbeat("prod-2"), hb("prod-2")),
        (
            subject::state("prod-2", "Deployment", Some("shop"), "web"),
            vec![1, 2, 3],
        ),
        (subject::incident("prod-1", "forged"), vec![1]),
        (subject::digest("prod-1", "Forged"), vec![1]),
        (subject::alert("forged"), vec![1]),
        (subject::audit("release", "apply"), {
            let env = Envelope::new(
                "prod-1",
                "x",
                Utc::now(),
                1,
                AuditRecord {
                    id: "x".into(),
                    actor: "agent".into(),
                    role: "release".into(),
                    action: "forged".into(),
                    target: "x".into(),
                    outcome: "ok".into(),
                    detail: serde_json::Value::Null,
                    commit: None,
                },
            );
            multipilot_schemas::encode(&env).unwrap()
        }),
        (subject::command("prod-2", "release"), vec![1]),
        ("fleet.query.incidents".into(), b"{}".to_vec()),
    ];
    for (subj, body) in &denied {
        let r = tokio::time::timeout(Duration::from_secs(3), async {
            ajs.publish(subj.clone(), body.clone().into())
                .await?
                .await
                .map_err(anyhow::Error::from)
        })
        .await;
        assert!(
            !matches!(r, Ok(Ok(_))),
            "agent-prod-1 could publish on {subj}"
        );
    }
    for stream in [
        "FLEET_HEALTH",
        "FLEET_STATE",
        "FLEET_INCIDENTS",
        "FLEET_ALERTS",
        "FLEET_AUDIT",
    ] {
        let s = admin_js.get_stream(stream).await?;
        let subjects = s.info_with_subjects("fleet.>").await?;
        let mut names = Vec::new();
        let mut subjects = subjects;
        while let Some(x) = subjects.next().await {
            names.push(x?.0);
        }
        for (subj, _) in &denied {
            assert!(!names.contains(subj), "{subj} was stored in {stream}");
        }
    }
    // another cluster's commands and anybody's replies never reach it
    let mut theirs = agent
        .subscribe(subject::command("prod-2", "release"))
        .await?;
    let mut replies = agent.subscribe("_INBOX.>").await?;
    agent.flush().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    admin
        .publish(subject::command("prod-2", "release"), "apply".into())
        .await?;
    let _ = tokio::time::timeout(
        Duration::from_secs(2),
        admin.request("fleet.query.incidents", "{}".into()),
    )
    .await;
    admin.flush().await?;
    assert!(
        tokio::time::timeout(Duration::from_secs(2), theirs.next())
            .await
            .ok()
            .flatten()
            .is_none(),
        "agent-prod-1 read prod-2's command"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), replies.next())
            .await
            .ok()
            .flatten()
            .is_none(),
        "agent-prod-1 read another client's reply"
    );
    // it can't read the streams through a consumer
    let stream = ajs.get_stream("FLEET_STATE").await?;
    let created = stream
        .create_consumer(jetstream::consumer::pull::Config::default())
        .await;
    assert!(
        created.is_err(),
        "agent-prod-1 created a consumer on FLEET_STATE"
    );
    // and the server said why, naming the user
    let v = violations(&nats);
    assert!(v.iter().any(|l| l.contains("agent-prod-1")), "{v:?}");
    Ok(())
}

/// `multipilot cluster …` on a copy of the shipped accounts file.
fn cluster_cmd(args: &[&str], dir: &Path) -> Result<std::process::Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_multipilot"))
        .arg("cluster")
        .args(args)
        .arg("--accounts")
        .arg(dir.join("accounts.conf"))
        .arg("--secrets-dir")
        .arg(dir.join("secrets"))
        .current_dir(root())
        .output()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_onboarded_cluster_speaks_only_for_itself_and_is_refused_once_removed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    for file in ["accounts.conf", "fleet-mappings.conf"] {
        std::fs::copy(root().join("deploy/nats").join(file), dir.path().join(file))?;
    }
    std::fs::create_dir_all(dir.path().join("secrets/material"))?;
    std::fs::write(
        dir.path().join("secrets/material/ca.crt"),
        "-----BEGIN CERTIFICATE-----\n",
    )?;
    let overlays = dir.path().join("agents");
    let add = |name: &str| {
        let mut args = vec![
            "add",
            name,
            "--label",
            "env=staging",
            "--overlay-dir",
            overlays.to_str().unwrap_or_default(),
        ];
        args.push("--nats-url");
        args.push("nats://nats.example.invalid:4222");
        cluster_cmd(&args, dir.path())
    };
    let out = add("staging-2")?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // bad input changes nothing: a taken name, a name that is not a DNS label, an unknown cluster
    let before = std::fs::read_to_string(dir.path().join("accounts.conf"))?;
    for (args, want) in [
        (vec!["add", "staging-2"], "already has an agent user"),
        (vec!["add", "Staging_2"], "not a valid cluster name"),
        (vec!["remove", "nope"], "no such cluster"),
    ] {
        let out = cluster_cmd(&args, dir.path())?;
        let err = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(
            !out.status.success() && err.contains(want),
            "{args:?}: {err}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("accounts.conf"))?,
        before
    );
    let listed = cluster_cmd(&["list"], dir.path())?;
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout),
        "prod-1\nstaging-2\n"
    );

    // the overlay renders, for that cluster
    let rendered = Command::new("kubectl")
        .arg("kustomize")
        .arg(overlays.join("staging-2"))
        .output()?;
    anyhow::ensure!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let rendered = String::from_utf8_lossy(&rendered.stdout);
    assert!(rendered.contains("name: staging-2") && rendered.contains("user: agent-staging-2"));

    // the minted password, from the Secret to apply in that cluster
    let secret: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(
        dir.path()
            .join("secrets/agent-staging-2/multipilot-agent-nats.yaml"),
    )?)?;
    let password = secret["stringData"]["password"]
        .as_str()
        .context("password")?
        .to_string();
    let edited = || accounts_from(&dir.path().join("accounts.conf"));
    let accounts = edited()?;
    let nats = NatsServer::start_with(|_| format!("{accounts}\nno_auth_user: admin\n")).await?;
    Topology::embedded()
        .provision(&jetstream::new(nats.client().await?))
        .await?;
    let agent = async_nats::ConnectOptions::new()
        .user_and_password("agent-staging-2".into(), password.clone())
        .custom_inbox_prefix("_INBOX_staging-2")
        .connect(nats.url())
        .await?;
    let ajs = jetstream::new(agent.clone());
    // its own subject: stored; another cluster's: refused
    ajs.publish(subject::heartbeat("staging-2"), vec![1].into())
        .await?
        .await?;
    let other = tokio::time::timeout(Duration::from_secs(3), async {
        ajs.publish(subject::heartbeat("prod-1"), vec![1].into())
            .await?
            .await
            .map_err(anyhow::Error::from)
    })
    .await;
    assert!(
        !matches!(other, Ok(Ok(_))),
        "agent-staging-2 published as prod-1"
    );
    // and its commands, not prod-1's
    let mut own = agent
        .subscribe(subject::command("staging-2", "release"))
        .await?;
    let admin = nats.client().await?;
    admin
        .publish(subject::command("staging-2", "release"), "x".into())
        .await?;
    admin.flush().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), own.next()).await?;
    assert!(got.is_some());
    drop(agent);

    // removed: the same credentials are refused by a server with the new accounts file
    let out = cluster_cmd(&["remove", "staging-2"], dir.path())?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(nats);
    let accounts = edited()?;
    let nats = NatsServer::start_with(|_| format!("{accounts}\nno_auth_user: admin\n")).await?;
    let refused = async_nats::ConnectOptions::new()
        .user_and_password("agent-staging-2".into(), password)
        .connection_timeout(Duration::from_secs(2))
        .connect(nats.url());
    let refused = tokio::time::timeout(Duration::from_secs(5), refused).await;
    assert!(
        !matches!(refused, Ok(Ok(_))),
        "a removed cluster's agent could still connect"
    );
    Ok(())
}
