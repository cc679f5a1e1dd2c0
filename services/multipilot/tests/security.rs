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
                    outcome: multipilot_schemas::payload::AuditOutcome::Ok,
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
    // it can't ask about a stream, nor read it through a consumer
    assert!(
        ajs.get_stream("FLEET_STATE").await.is_err(),
        "agent-prod-1 read FLEET_STATE's stream info"
    );
    let stream = ajs.get_stream_no_info("FLEET_STATE").await?;
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

/// A directory with a copy of the shipped accounts file (and the mappings it includes) and the CA that
/// `multipilot cluster add` puts into an agent's Secret: what an operator onboards clusters in.
fn shipped_accounts_copy() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    for file in ["accounts.conf", "fleet-mappings.conf"] {
        std::fs::copy(root().join("deploy/nats").join(file), dir.path().join(file))?;
    }
    std::fs::create_dir_all(dir.path().join("secrets/material"))?;
    std::fs::write(
        dir.path().join("secrets/material/ca.crt"),
        "-----BEGIN CERTIFICATE-----\n",
    )?;
    Ok(dir)
}

/// `multipilot <group> …` (cluster, team) on a copy of the shipped accounts file.
fn accounts_cmd(group: &str, args: &[&str], dir: &Path) -> Result<std::process::Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_multipilot"))
        .arg(group)
        .args(args)
        .arg("--accounts")
        .arg(dir.join("accounts.conf"))
        .arg("--secrets-dir")
        .arg(dir.join("secrets"))
        .current_dir(root())
        .output()?)
}

/// `multipilot cluster …` on a copy of the shipped accounts file.
fn cluster_cmd(args: &[&str], dir: &Path) -> Result<std::process::Output> {
    accounts_cmd("cluster", args, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_onboarded_cluster_speaks_only_for_itself_and_is_refused_once_removed() -> Result<()> {
    let dir = shipped_accounts_copy()?;
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
        "prod-1\t\nstaging-2\tenv=staging\n"
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
    publish_until_received(&admin, &subject::command("staging-2", "release"), &mut own).await?;
    // a command is a request: its answer crosses back from the agent's account to the requester's inbox
    // (the first request-shaped message: the publishes above may have been received more than once)
    let answering = agent.clone();
    let responder = tokio::spawn(async move {
        while let Some(m) = own.next().await {
            if let Some(reply) = m.reply {
                let _ = answering.publish(reply, "done".into()).await;
                let _ = answering.flush().await;
                break;
            }
        }
    });
    let answer = admin
        .request(subject::command("staging-2", "release"), "plan".into())
        .await?;
    assert_eq!(&answer.payload[..], b"done");
    responder.await?;
    // it reads back its own last message (the duplicate accounting after a crash)
    let last = ajs
        .get_stream_no_info("FLEET_HEALTH")
        .await?
        .direct_get_last_for_subject(subject::heartbeat("staging-2"))
        .await?;
    assert_eq!(&last.payload[..], [1]);

    // The answer to anything it sends stays in its own account, whatever reply subject it names: neither a
    // publish's acknowledgement nor a direct get's message is stored under another cluster's subject or in
    // the audit stream, nor reaches another agent as a command. (With the agent a user of FLEET, the server
    // delivered them to the named subject, where FLEET's streams stored them.)
    let mut spied = admin.subscribe("fleet.>").await?;
    multipilot_testkit::wait::round_trip(&admin).await?;
    let forged = [
        "fleet.hb.prod-1",
        "fleet.state.prod-1.Deployment.shop.web",
        "fleet.audit.release.forged",
        "fleet.incident.prod-1.forged",
        "fleet.cmd.prod-1.release",
    ];
    for reply in forged {
        agent
            .publish_with_reply(subject::heartbeat("staging-2"), reply, vec![2].into())
            .await?;
        agent
            .publish_with_reply(
                format!(
                    "$JS.API.DIRECT.GET.FLEET_HEALTH.{}",
                    subject::heartbeat("staging-2")
                ),
                reply,
                "".into(),
            )
            .await?;
    }
    agent.flush().await?;
    let mut leaked = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(1500), spied.next()).await {
        // its own heartbeats arrive in FLEET, as they should; nothing else may
        if m.subject.as_str() != subject::heartbeat("staging-2") {
            leaked.push(m.subject.to_string());
        }
    }
    assert!(leaked.is_empty(), "answers reached FLEET on {leaked:?}");
    let admin_js = jetstream::new(admin.clone());
    for (stream, reply) in [
        ("FLEET_HEALTH", forged[0]),
        ("FLEET_STATE", forged[1]),
        ("FLEET_AUDIT", forged[2]),
        ("FLEET_INCIDENTS", forged[3]),
    ] {
        let stored = admin_js
            .get_stream(stream)
            .await?
            .get_last_raw_message_by_subject(reply)
            .await;
        assert!(
            stored.is_err(),
            "an answer was stored in {stream} as {reply}"
        );
    }
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

/// `multipilot team …` on a copy of the shipped accounts file.
fn team_cmd(args: &[&str], dir: &Path) -> Result<std::process::Output> {
    accounts_cmd("team", args, dir)
}

/// The bus password `multipilot team add` wrote into the team's credentials.
fn team_password(dir: &Path, team: &str) -> Result<String> {
    let creds: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(
        dir.join(format!("secrets/team-{team}/credentials.yaml")),
    )?)?;
    Ok(creds["nats"]["password"]
        .as_str()
        .context("no nats.password in the team's credentials")?
        .to_string())
}

fn ok(out: std::process::Output) -> Result<String> {
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Publishes `subj` from `from` until `sub` receives it. A subscriber whose user may not publish can't make
/// a round trip (`wait::round_trip`) to know the server has its subscription; `flush` only writes the socket.
async fn publish_until_received(
    from: &async_nats::Client,
    subj: &str,
    sub: &mut async_nats::Subscriber,
) -> Result<()> {
    multipilot_testkit::wait::until(&format!("a subscriber to receive {subj}"), 10, async || {
        from.publish(subj.to_string(), "x".into()).await?;
        from.flush().await?;
        let got = tokio::time::timeout(Duration::from_millis(300), sub.next()).await;
        Ok(matches!(got, Ok(Some(_))).then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_receives_and_replays_only_its_clusters_subjects_and_writes_nothing() -> Result<()> {
    let dir = shipped_accounts_copy()?;
    let overlays = dir.path().join("agents");
    let add_cluster = |name: &str, env: &str| {
        let label = format!("env={env}");
        cluster_cmd(
            &[
                "add",
                name,
                "--label",
                &label,
                "--overlay-dir",
                overlays.to_str().unwrap_or_default(),
            ],
            dir.path(),
        )
    };
    ok(add_cluster("alpha-1", "prod")?)?;
    ok(add_cluster("beta-2", "staging")?)?;
    // bad input: a name that is not a DNS label, a selector matching nothing (which names what there is),
    // a selector that doesn't parse, a releaser's role, no selector at all
    for (args, want) in [
        (
            vec!["add", "Pay_ments", "--clusters", "env=prod"],
            "not a valid team name",
        ),
        (
            vec!["add", "payments", "--clusters", "env=nope"],
            "matches no cluster",
        ),
        (
            vec!["add", "payments", "--clusters", "env in (prod"],
            "invalid label selector",
        ),
        (
            vec![
                "add",
                "payments",
                "--clusters",
                "env=prod",
                "--role",
                "releaser",
            ],
            "releases span clusters",
        ),
        (vec!["add", "payments", "--clusters", " "], "whole fleet"),
        (vec!["remove", "nope"], "no such team"),
    ] {
        let out = team_cmd(&args, dir.path())?;
        let err = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(
            !out.status.success() && err.contains(want),
            "{args:?}: {err}"
        );
    }
    let err = String::from_utf8_lossy(
        &team_cmd(&["add", "payments", "--clusters", "env=nope"], dir.path())?.stderr,
    )
    .into_owned();
    anyhow::ensure!(
        err.contains("alpha-1 {env=prod}") && err.contains("beta-2 {env=staging}"),
        "{err}"
    );
    let said = ok(team_cmd(
        &["add", "payments", "--clusters", "env=prod"],
        dir.path(),
    )?)?;
    anyhow::ensure!(said.contains("1 cluster(s): alpha-1"), "{said}");
    let out = team_cmd(&["add", "payments", "--clusters", "env=prod"], dir.path())?;
    anyhow::ensure!(String::from_utf8_lossy(&out.stderr).contains("exists already"));
    // a prod cluster onboarded later joins the team: bus user and API token
    let said = ok(add_cluster("gamma-3", "prod")?)?;
    anyhow::ensure!(said.contains("joins the team payments"), "{said}");
    anyhow::ensure!(
        ok(team_cmd(&["list"], dir.path())?)? == "payments\tenv=prod\talpha-1,gamma-3\n",
        "team list"
    );
    let tokens: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(
        dir.path().join("secrets/material/tokens.yaml"),
    )?)?;
    let entry = &tokens[0];
    anyhow::ensure!(
        entry["team"] == "payments"
            && entry["clusters"] == serde_yaml::to_value(["alpha-1", "gamma-3"])?
            && entry["token_sha256"]
                .as_str()
                .is_some_and(|h| h.len() == 64)
            && entry.get("token").is_none(),
        "{entry:?}"
    );
    let team_password = team_password(dir.path(), "payments")?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join("secrets/team-payments/credentials.yaml"))?
            .permissions()
            .mode();
        anyhow::ensure!(
            mode & 0o077 == 0,
            "credentials readable by others: {mode:o}"
        );
    }

    let accounts = accounts_from(&dir.path().join("accounts.conf"))?;
    let nats = NatsServer::start_with(|_| format!("{accounts}\nno_auth_user: admin\n")).await?;
    let admin = nats.client().await?;
    let ajs = jetstream::new(admin.clone());
    Topology::embedded().provision(&ajs).await?;
    for c in ["alpha-1", "beta-2", "gamma-3"] {
        for s in [
            format!("fleet.event.{c}.Pod"),
            format!("fleet.incident.{c}.crashloop"),
            format!("fleet.state.{c}.Deployment.default.web"),
        ] {
            ajs.publish(s.clone(), s.into()).await?.await?;
        }
    }
    let team = async_nats::ConnectOptions::new()
        .user_and_password("team-payments".into(), team_password.clone())
        .connect(nats.url())
        .await?;
    // its clusters' subjects, as they happen
    // (the team may publish nothing, so it can't make a round trip to know the server has its
    // subscriptions: the admin publishes until they receive)
    let live = team.subscribe("fleet.event.gamma-3.>").await?;
    let incidents = team.subscribe("fleet.incident.alpha-1.>").await?;
    team.flush().await?;
    for (subj, mut sub) in [
        ("fleet.event.gamma-3.Node", live),
        ("fleet.incident.alpha-1.dns-failure", incidents),
    ] {
        publish_until_received(&admin, subj, &mut sub).await?;
    }
    // nor another cluster's subjects, fleet incidents, a role's inbox, everything
    for subj in [
        "fleet.event.beta-2.>",
        "fleet.fleet-incident.>",
        "_INBOX_correlator.>",
        "fleet.>",
    ] {
        let mut sub = team.subscribe(subj).await?;
        team.flush().await?;
        let name = subj.trim_end_matches(".>");
        admin.publish(format!("{name}.x"), "x".into()).await?;
        admin.flush().await?;
        let got = tokio::time::timeout(Duration::from_millis(700), sub.next()).await;
        anyhow::ensure!(!matches!(got, Ok(Some(_))), "the team received {subj}");
    }
    // it publishes nothing: no JetStream request (whose answer the server would send to any reply
    // subject it named, where a stream may store it), no role's request, not even its own clusters'
    // subjects
    for subj in [
        "$JS.API.CONSUMER.CREATE.FLEET_EVENTS.x.fleet.event.alpha-1.>",
        "$JS.API.STREAM.INFO.FLEET_EVENTS",
        "$JS.API.DIRECT.GET.FLEET_EVENTS.fleet.event.alpha-1.Pod",
        "$JS.API.INFO",
        "fleet.query.incidents",
        "fleet.event.alpha-1.Pod",
    ] {
        team.publish_with_reply(subj, "fleet.audit.forged", "{}".into())
            .await?;
    }
    team.flush().await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let audit = jetstream::new(admin.clone())
        .get_stream("FLEET_AUDIT")
        .await?
        .get_last_raw_message_by_subject("fleet.audit.forged")
        .await;
    anyhow::ensure!(audit.is_err(), "something was written to the audit stream");
    let seen = violations(&nats);
    anyhow::ensure!(
        seen.iter()
            .any(|l| l.contains("team-payments") && l.contains("fleet.event.beta-2")),
        "no violation logged: {seen:?}"
    );

    // replay: its replay user, in the team's own account, reads what was stored before, through the
    // consumer named for the cluster and class, and acknowledges it
    let replay = async_nats::ConnectOptions::new()
        .user_and_password("team-payments-replay".into(), team_password.clone())
        .custom_inbox_prefix("_INBOX_team-payments")
        .request_timeout(Some(Duration::from_secs(2)))
        .connect(nats.url())
        .await?;
    let rjs = jetstream::with_prefix(replay.clone(), "$JS.FLEET.API");
    let events = rjs.get_stream_no_info("FLEET_EVENTS").await?;
    let pull = |name: &str, filter: &str| jetstream::consumer::pull::Config {
        name: Some(name.into()),
        filter_subject: filter.into(),
        deliver_policy: jetstream::consumer::DeliverPolicy::All,
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ..Default::default()
    };
    let c = events
        .create_consumer(pull("payments_gamma-3_event", "fleet.event.gamma-3.>"))
        .await?;
    let mut msgs = c
        .fetch()
        .max_messages(10)
        .expires(Duration::from_secs(2))
        .messages()
        .await?;
    let mut replayed = Vec::new();
    while let Some(m) = msgs.next().await {
        let m = m.map_err(|e| anyhow::anyhow!("{e}"))?;
        replayed.push(m.subject.to_string());
        m.double_ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    // (the live check above stored one Node event or a few)
    anyhow::ensure!(
        replayed.len() >= 2
            && replayed[0] == "fleet.event.gamma-3.Pod"
            && replayed[1..]
                .iter()
                .all(|s| s == "fleet.event.gamma-3.Node"),
        "{replayed:?}"
    );
    let mut c = c;
    anyhow::ensure!(
        c.info().await?.num_ack_pending == 0,
        "acks did not reach FLEET"
    );
    // it can't widen its filter, read another cluster under its own name, take a role's consumer's name,
    // pull from a role's consumer or ask for stream information
    for (name, filter) in [
        ("payments_gamma-3_event", "fleet.event.beta-2.>"),
        ("payments_gamma-3_event", "fleet.event.>"),
        ("payments_beta-2_event", "fleet.event.beta-2.>"),
        ("correlator-events", "fleet.event.gamma-3.>"),
    ] {
        anyhow::ensure!(
            events.create_consumer(pull(name, filter)).await.is_err(),
            "the team created {name} with {filter}"
        );
    }
    for subj in [
        "$JS.FLEET.API.CONSUMER.MSG.NEXT.FLEET_EVENTS.correlator-events",
        "$JS.FLEET.API.STREAM.INFO.FLEET_EVENTS",
        "$JS.FLEET.API.STREAM.NAMES",
        "$JS.API.CONSUMER.MSG.NEXT.FLEET_EVENTS.correlator-events",
    ] {
        anyhow::ensure!(
            replay.request(subj, "{}".into()).await.is_err(),
            "the team's {subj} was answered"
        );
    }
    // whatever reply subject it names, the answer (and a pull's messages) come back to its account
    for (subj, reply) in [
        (
            "$JS.FLEET.API.CONSUMER.INFO.FLEET_EVENTS.payments_gamma-3_event",
            "fleet.audit.forged",
        ),
        (
            "$JS.FLEET.API.CONSUMER.MSG.NEXT.FLEET_EVENTS.payments_gamma-3_event",
            "fleet.event.beta-2.forged",
        ),
    ] {
        replay
            .publish_with_reply(subj, reply, r#"{"batch": 5, "no_wait": true}"#.into())
            .await?;
    }
    replay.flush().await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stored = |stream: &'static str, subj: &'static str| {
        let admin = admin.clone();
        async move {
            jetstream::new(admin)
                .get_stream(stream)
                .await?
                .get_last_raw_message_by_subject(subj)
                .await
                .map_err(anyhow::Error::from)
        }
    };
    anyhow::ensure!(
        stored("FLEET_AUDIT", "fleet.audit.forged").await.is_err()
            && stored("FLEET_EVENTS", "fleet.event.beta-2.forged")
                .await
                .is_err(),
        "a replay answer was stored in FLEET"
    );

    // removed: its credentials are refused by a server with the new accounts file
    ok(team_cmd(&["remove", "payments"], dir.path())?)?;
    let tokens = std::fs::read_to_string(dir.path().join("secrets/material/tokens.yaml"))?;
    anyhow::ensure!(!tokens.contains("payments"), "{tokens}");
    drop(team);
    drop(nats);
    let accounts = accounts_from(&dir.path().join("accounts.conf"))?;
    let nats = NatsServer::start_with(|_| format!("{accounts}\nno_auth_user: admin\n")).await?;
    anyhow::ensure!(
        !accounts.contains("team-payments"),
        "the removed team's users or account are still in the accounts file"
    );
    for user in ["team-payments", "team-payments-replay"] {
        let refused = async_nats::ConnectOptions::new()
            .user_and_password(user.into(), team_password.clone())
            .connection_timeout(Duration::from_secs(2))
            .connect(nats.url());
        let refused = tokio::time::timeout(Duration::from_secs(5), refused).await;
        anyhow::ensure!(
            !matches!(refused, Ok(Ok(_))),
            "a removed team could still connect as {user}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------
// The permission matrix: what every user of the shipped accounts file, and an agent user minted by
// `multipilot cluster add`, must be able to do ([`specs`]), checked against a real nats-server running that
// file over a generated set of everything else it must not (other clusters' subjects, every `$JS.API`
// family on every stream, other users' inboxes, the roles' request subjects). Any surprise, either way,
// fails. The README's security section shows [`matrix`], rendered from the same specs.

/// How a role reads a stream.
#[derive(Clone)]
enum Read {
    /// Durable or ephemeral consumers of any name, acked.
    Any,
    /// Ephemeral ordered consumers only (no acks, no durables): a replay.
    Ordered,
    /// Only the named durables.
    Durables(Vec<String>),
}

/// What one user must be able to do; everything else it must not.
struct Spec {
    user: String,
    /// Its reply inbox prefix (`nats.inbox_prefix`).
    inbox: String,
    /// Subjects it publishes.
    publish: Vec<String>,
    /// Request subjects it answers.
    answers: Vec<String>,
    /// Other subjects it subscribes to.
    subscribe: Vec<String>,
    /// Streams it reads.
    reads: Vec<(String, Read)>,
    /// Direct gets (stream + last-by-subject) it may make.
    direct_get: Vec<String>,
    /// The KV buckets it owns (creates, reads, writes).
    kv: Vec<String>,
    /// Other JetStream API requests.
    api: Vec<String>,
    /// Consumers it creates and reads from an account of its own, through `$JS.FLEET.API`: stream, the
    /// consumer's name and the filters it may be created with.
    replays: Vec<(String, String, Vec<String>)>,
    /// No restriction (`admin`).
    all: bool,
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn spec(user: &str, inbox: &str) -> Spec {
    Spec {
        user: user.into(),
        inbox: inbox.into(),
        publish: vec![],
        answers: vec![],
        subscribe: vec![],
        reads: vec![],
        direct_get: vec![],
        kv: vec![],
        api: vec![],
        replays: vec![],
        all: false,
    }
}

/// A team's user (`multipilot team add <team> --clusters …`) for these clusters: it receives their
/// subjects and its receiver's alerts, and publishes nothing (no JetStream request either).
fn team_spec(team: &str, clusters: &[&str]) -> Spec {
    let mut subscribe = Vec::new();
    for c in clusters {
        for x in [
            "state.{c}.>",
            "resync.{c}.>",
            "facts.{c}",
            "hb.{c}",
            "probe.{c}.>",
            "event.{c}.>",
            "incident.{c}.>",
            "digest.{c}.>",
            "compliance.{c}",
            "facts.{c}.*",
            "hb.{c}.*",
        ] {
            subscribe.push(format!("fleet.{}", x.replace("{c}", c)));
        }
    }
    subscribe.push(format!("fleet.alert.team-{team}"));
    Spec {
        subscribe,
        // it has no inbox: it makes no requests
        ..spec(&format!("team-{team}"), "")
    }
}

/// A team's replay user (in the account `team-<team>`): per cluster, one consumer per class of its
/// subjects, created with that class' filter, pulled from, acknowledged.
fn team_replay_spec(team: &str, clusters: &[&str]) -> Spec {
    let mut replays = Vec::new();
    for c in clusters {
        for (class, stream, filters) in [
            ("state", "FLEET_STATE", vec!["state.{c}.>"]),
            ("resync", "FLEET_STATE", vec!["resync.{c}.>"]),
            ("facts", "FLEET_FACTS", vec!["facts.{c}", "facts.{c}.*"]),
            ("hb", "FLEET_HEALTH", vec!["hb.{c}", "hb.{c}.*"]),
            ("probe", "FLEET_HEALTH", vec!["probe.{c}.>"]),
            ("event", "FLEET_EVENTS", vec!["event.{c}.>"]),
            ("incident", "FLEET_INCIDENTS", vec!["incident.{c}.>"]),
            ("digest", "FLEET_INCIDENTS", vec!["digest.{c}.>"]),
            ("compliance", "FLEET_INCIDENTS", vec!["compliance.{c}"]),
        ] {
            replays.push((
                stream.to_string(),
                format!("{team}_{c}_{class}"),
                filters
                    .iter()
                    .map(|f| format!("fleet.{}", f.replace("{c}", c)))
                    .collect(),
            ));
        }
    }
    Spec {
        replays,
        ..spec(
            &format!("team-{team}-replay"),
            &format!("_INBOX_team-{team}"),
        )
    }
}

fn agent_spec(c: &str) -> Spec {
    Spec {
        publish: [
            "state.{c}.>",
            "resync.{c}.>",
            "facts.{c}",
            "hb.{c}",
            "probe.{c}.>",
            "event.{c}.>",
            "metrics.{c}",
            "facts.{c}.*",
            "hb.{c}.*",
            "metrics.{c}.*",
        ]
        .iter()
        .map(|p| format!("fleet.{}", p.replace("{c}", c)))
        .collect(),
        subscribe: vec![format!("fleet.cmd.{c}.>")],
        direct_get: [
            ("FLEET_STATE", "state.{c}.>"),
            ("FLEET_STATE", "resync.{c}.>"),
            ("FLEET_FACTS", "facts.{c}"),
            ("FLEET_FACTS", "facts.{c}.*"),
            ("FLEET_HEALTH", "hb.{c}"),
            ("FLEET_HEALTH", "hb.{c}.*"),
            ("FLEET_HEALTH", "probe.{c}.>"),
            ("FLEET_EVENTS", "event.{c}.>"),
            ("FLEET_METRICS", "metrics.{c}"),
            ("FLEET_METRICS", "metrics.{c}.*"),
        ]
        .iter()
        .map(|(st, p)| format!("{st}.fleet.{}", p.replace("{c}", c)))
        .collect(),
        ..spec(&format!("agent-{c}"), &format!("_INBOX_{c}"))
    }
}

fn specs(minted: &str) -> Vec<Spec> {
    let durables = |v: &[&str]| Read::Durables(s(v));
    vec![
        agent_spec("prod-1"),
        agent_spec(minted),
        team_spec("payments", &["prod-1"]),
        team_replay_spec("payments", &["prod-1"]),
        Spec {
            publish: s(&[
                "fleet.incident.>",
                "fleet.fleet-incident.>",
                "fleet.digest.>",
                "fleet.compliance.>",
                "fleet.audit.console.incident-*",
                "fleet.dlq.>",
            ]),
            answers: s(&[
                "fleet.query.incidents",
                "fleet.query.fleet-incidents",
                "fleet.query.blast-radius",
                "fleet.query.consistency",
                "fleet.query.compliance",
                "fleet.ctl.incident",
            ]),
            reads: vec![
                ("FLEET_EVENTS".into(), Read::Any),
                ("FLEET_HEALTH".into(), Read::Any),
                ("FLEET_STATE".into(), Read::Any),
                ("FLEET_FACTS".into(), Read::Any),
                ("FLEET_INCIDENTS".into(), Read::Ordered),
                ("FLEET_RELEASE".into(), Read::Ordered),
            ],
            api: s(&["$JS.API.INFO"]),
            ..spec("correlator", "_INBOX_correlator")
        },
        Spec {
            publish: s(&["fleet.dlq.>"]),
            reads: vec![(
                "FLEET_METRICS".into(),
                durables(&["tsdb", "tsdb-p0-of-2", "tsdb-p1-of-2"]),
            )],
            api: s(&["$JS.API.INFO"]),
            ..spec("tsdb", "_INBOX_tsdb")
        },
        Spec {
            publish: s(&["fleet.alert.>", "fleet.audit.alerts.>", "fleet.dlq.>"]),
            reads: vec![("FLEET_INCIDENTS".into(), durables(&["alerts"]))],
            kv: s(&[
                "MULTIPILOT_SILENCES",
                "MULTIPILOT_NFLOG",
                "MULTIPILOT_ALERTS",
            ]),
            api: s(&["$JS.API.INFO"]),
            ..spec("alerts", "_INBOX_alerts")
        },
        Spec {
            publish: s(&[
                "fleet.cmd.*.release",
                "fleet.release.>",
                "fleet.audit.release.>",
                "fleet.query.incidents",
                "fleet.probe.*.release-drift",
                "fleet.probe.*.policy-drift",
            ]),
            answers: s(&["fleet.releasectl.>"]),
            reads: vec![
                ("FLEET_STATE".into(), Read::Ordered),
                ("FLEET_FACTS".into(), Read::Ordered),
                ("FLEET_INCIDENTS".into(), Read::Ordered),
                ("FLEET_RELEASE".into(), Read::Ordered),
            ],
            kv: s(&["MULTIPILOT_RELEASES"]),
            api: s(&["$JS.API.INFO"]),
            ..spec("release", "_INBOX_release")
        },
        Spec {
            publish: s(&[
                "fleet.ctl.incident",
                "fleet.query.>",
                "fleet.releasectl.gitops",
            ]),
            reads: vec![
                ("FLEET_STATE".into(), Read::Any),
                ("FLEET_FACTS".into(), Read::Any),
                ("FLEET_HEALTH".into(), Read::Any),
                ("FLEET_INCIDENTS".into(), Read::Any),
                ("FLEET_RELEASE".into(), Read::Any),
            ],
            // the resources page reads a stored object by sequence
            api: s(&["$JS.API.INFO", "$JS.API.STREAM.MSG.GET.FLEET_STATE"]),
            direct_get: s(&["FLEET_STATE"]),
            ..spec("console", "_INBOX_console")
        },
        Spec {
            publish: s(&["fleet.query.>", "fleet.releasectl.>"]),
            subscribe: s(&[
                "fleet.incident.>",
                "fleet.fleet-incident.>",
                "fleet.release.>",
                "fleet.alert.>",
            ]),
            api: s(&[
                "$JS.API.INFO",
                "$JS.API.STREAM.NAMES",
                "$JS.API.STREAM.LIST",
                "$JS.API.STREAM.INFO.*",
                "$JS.API.CONSUMER.NAMES.*",
                "$JS.API.CONSUMER.LIST.*",
            ]),
            ..spec("operator", "_INBOX_operator")
        },
        Spec {
            all: true,
            ..spec("admin", "_INBOX")
        },
    ]
}

/// A publish or a subscription.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Pub(String),
    Sub(String),
}

impl Spec {
    /// The patterns of what it may publish and subscribe to.
    fn patterns(&self) -> (Vec<String>, Vec<String>) {
        let mut p = self.publish.clone();
        p.extend(self.api.iter().cloned());
        for (st, how) in &self.reads {
            p.push(format!("$JS.API.STREAM.INFO.{st}"));
            let names = match how {
                Read::Durables(n) => n.clone(),
                _ => vec!["*".into()],
            };
            for n in &names {
                for f in ["CONSUMER.INFO", "CONSUMER.MSG.NEXT", "CONSUMER.DELETE"] {
                    p.push(format!("$JS.API.{f}.{st}.{n}"));
                }
                if !matches!(how, Read::Ordered) {
                    p.push(format!("$JS.API.CONSUMER.DURABLE.CREATE.{st}.{n}"));
                    p.push(format!("$JS.ACK.{st}.{n}.>"));
                }
                if n == "*" {
                    p.push(format!("$JS.API.CONSUMER.CREATE.{st}"));
                    p.push(format!("$JS.API.CONSUMER.CREATE.{st}.>"));
                    p.push(format!("$JS.FC.{st}.>"));
                } else {
                    p.push(format!("$JS.API.CONSUMER.CREATE.{st}.{n}"));
                    p.push(format!("$JS.API.CONSUMER.CREATE.{st}.{n}.>"));
                }
            }
        }
        for d in &self.direct_get {
            p.push(format!("$JS.API.DIRECT.GET.{d}"));
        }
        for (st, name, filters) in &self.replays {
            for f in filters {
                p.push(format!("$JS.FLEET.API.CONSUMER.CREATE.{st}.{name}.{f}"));
            }
            for f in ["CONSUMER.MSG.NEXT", "CONSUMER.INFO", "CONSUMER.DELETE"] {
                p.push(format!("$JS.FLEET.API.{f}.{st}.{name}"));
            }
            p.push(format!("$JS.ACK.{st}.{name}.>"));
        }
        for b in &self.kv {
            let st = format!("KV_{b}");
            for f in [
                "STREAM.INFO",
                "STREAM.CREATE",
                "STREAM.UPDATE",
                "DIRECT.GET",
                "STREAM.MSG.GET",
            ] {
                p.push(format!("$JS.API.{f}.{st}"));
            }
            p.push(format!("$JS.API.DIRECT.GET.{st}.>"));
            p.push(format!("$KV.{b}.>"));
            for f in ["CONSUMER.INFO", "CONSUMER.DELETE"] {
                p.push(format!("$JS.API.{f}.{st}.*"));
            }
            p.push(format!("$JS.API.CONSUMER.CREATE.{st}"));
            p.push(format!("$JS.API.CONSUMER.CREATE.{st}.>"));
            p.push(format!("$JS.FC.{st}.>"));
        }
        let mut sub = self.answers.clone();
        sub.extend(self.subscribe.iter().cloned());
        if !self.inbox.is_empty() {
            sub.push(format!("{}.>", self.inbox));
        }
        (p, sub)
    }

    fn allows(&self, op: &Op) -> bool {
        if self.all {
            return true;
        }
        let (p, sub) = self.patterns();
        match op {
            Op::Pub(x) => p.iter().any(|pat| covers(pat, x)),
            Op::Sub(x) => sub.iter().any(|pat| covers(pat, x)),
        }
    }
}

/// Whether every subject `subject` can match is matched by `pattern` (NATS wildcards `*` and `>`).
fn covers(pattern: &str, subject: &str) -> bool {
    let (p, s): (Vec<&str>, Vec<&str>) =
        (pattern.split('.').collect(), subject.split('.').collect());
    for (i, pt) in p.iter().enumerate() {
        match (*pt, s.get(i)) {
            (">", Some(_)) => return true,
            (_, None) => return false,
            ("*", Some(&st)) if st != ">" => {}
            (lit, Some(&st)) if lit == st && lit != "*" && lit != ">" => {}
            _ => return false,
        }
    }
    p.len() == s.len()
}

const STREAMS: [&str; 14] = [
    "FLEET_STATE",
    "FLEET_FACTS",
    "FLEET_HEALTH",
    "FLEET_EVENTS",
    "FLEET_METRICS",
    "FLEET_INCIDENTS",
    "FLEET_ALERTS",
    "FLEET_RELEASE",
    "FLEET_AUDIT",
    "FLEET_DLQ",
    "KV_MULTIPILOT_SILENCES",
    "KV_MULTIPILOT_NFLOG",
    "KV_MULTIPILOT_ALERTS",
    "KV_MULTIPILOT_RELEASES",
];

/// Everything tried for every user: what some user must be able to do and much that nobody may.
fn candidates(users: &[Spec], clusters: &[&str]) -> Vec<Op> {
    let mut pubs: Vec<String> = Vec::new();
    let mut subs: Vec<String> = s(&["fleet.>", ">", "$JS.API.>", "_INBOX.>", "$KV.>"]);
    for c in clusters {
        for x in [
            "state.{c}.Deployment.shop.web",
            "resync.{c}.Deployment.1",
            "facts.{c}",
            "hb.{c}",
            "probe.{c}.etcd",
            "probe.{c}.release-drift",
            "probe.{c}.policy-drift",
            "event.{c}.Pod",
            "metrics.{c}",
            "facts.{c}.1",
            "cmd.{c}.release",
            "cmd.{c}.drain",
            "incident.{c}.dns-failure",
            "digest.{c}.Pod",
            "compliance.{c}",
        ] {
            pubs.push(format!("fleet.{}", x.replace("{c}", c)));
        }
        for x in [
            "cmd.{c}.>",
            "cmd.{c}.release",
            "state.{c}.>",
            "event.{c}.>",
            "hb.{c}",
            "incident.{c}.>",
            "digest.{c}.>",
            "compliance.{c}",
        ] {
            subs.push(format!("fleet.{}", x.replace("{c}", c)));
        }
        // consumers named for a cluster, with its filter, another's or one widened: nobody's to make
        for other in clusters {
            pubs.push(format!(
                "$JS.API.CONSUMER.CREATE.FLEET_EVENTS.payments_{c}_event.fleet.event.{other}.Pod"
            ));
        }
        pubs.push(format!(
            "$JS.API.CONSUMER.CREATE.FLEET_EVENTS.payments_{c}_event.fleet.event.x"
        ));
        pubs.push(format!(
            "$JS.API.CONSUMER.MSG.NEXT.FLEET_EVENTS.payments_{c}_event"
        ));
        // the same through a team account's prefix
        for other in clusters {
            pubs.push(format!(
                "$JS.FLEET.API.CONSUMER.CREATE.FLEET_EVENTS.payments_{c}_event.fleet.event.{other}.Pod"
            ));
        }
        pubs.push(format!(
            "$JS.FLEET.API.CONSUMER.CREATE.FLEET_EVENTS.payments_{c}_event.fleet.event.x"
        ));
        pubs.push(format!(
            "$JS.FLEET.API.CONSUMER.CREATE.FLEET_EVENTS.payments_{c}_event.fleet.>"
        ));
        // direct gets of each cluster's subjects, the partitioned form and a wildcard across clusters
        for (st, x) in [
            ("FLEET_STATE", "state.{c}.Deployment.shop.web"),
            ("FLEET_STATE", "state.{c}.>"),
            ("FLEET_STATE", "resync.{c}.Deployment.1"),
            ("FLEET_FACTS", "facts.{c}"),
            ("FLEET_FACTS", "facts.{c}.*"),
            ("FLEET_HEALTH", "hb.{c}"),
            ("FLEET_HEALTH", "probe.{c}.etcd"),
            ("FLEET_EVENTS", "event.{c}.Pod"),
            ("FLEET_METRICS", "metrics.{c}"),
        ] {
            pubs.push(format!(
                "$JS.API.DIRECT.GET.{st}.fleet.{}",
                x.replace("{c}", c)
            ));
        }
    }
    for x in [
        "alert.default",
        "audit.release.apply",
        "audit.console.incident-ack",
        "audit.console.login",
        "audit.alerts.silence",
        "release.web.plan",
        "dlq.correlator",
        "query.incidents",
        "query.compliance",
        "query.clusters",
        "ctl.incident",
        "releasectl.gitops",
        "releasectl.apply",
        "state.*.Deployment.shop.web",
    ] {
        pubs.push(format!("fleet.{x}"));
    }
    for x in [
        "query.incidents",
        "query.compliance",
        "ctl.incident",
        "releasectl.>",
        "releasectl.gitops",
        "incident.>",
        "digest.>",
        "release.>",
        "alert.>",
        "alert.team-payments",
        "alert.team-other",
        "audit.>",
    ] {
        subs.push(format!("fleet.{x}"));
    }
    for u in users.iter().filter(|u| !u.inbox.is_empty()) {
        subs.push(format!("{}.>", u.inbox));
        pubs.push(format!("{}.x", u.inbox));
    }
    for x in [
        "INFO",
        "STREAM.NAMES",
        "STREAM.LIST",
        "ACCOUNT.PURGE.FLEET",
        "META.LEADER.STEPDOWN",
        "SERVER.REMOVE",
        "STREAM.TEMPLATE.NAMES",
    ] {
        pubs.push(format!("$JS.API.{x}"));
    }
    pubs.push("$JS.API.DIRECT.GET.FLEET_STATE.fleet.*.>".into());
    for x in [
        "INFO",
        "STREAM.NAMES",
        "STREAM.INFO.FLEET_EVENTS",
        "CONSUMER.MSG.NEXT.FLEET_EVENTS.correlator-events",
        "CONSUMER.CREATE.FLEET_EVENTS.correlator-events.fleet.event.prod-1.>",
        "DIRECT.GET.FLEET_EVENTS.fleet.event.prod-1.Pod",
    ] {
        pubs.push(format!("$JS.FLEET.API.{x}"));
    }
    let topology = Topology::embedded();
    for st in STREAMS {
        for f in [
            "STREAM.INFO",
            "STREAM.CREATE",
            "STREAM.UPDATE",
            "STREAM.DELETE",
            "STREAM.PURGE",
            "STREAM.MSG.GET",
            "STREAM.MSG.DELETE",
            "STREAM.SNAPSHOT",
            "STREAM.RESTORE",
            "DIRECT.GET",
            "CONSUMER.CREATE",
            "CONSUMER.NAMES",
            "CONSUMER.LIST",
        ] {
            pubs.push(format!("$JS.API.{f}.{st}"));
        }
        let mut names = vec!["x".to_string()];
        names.extend(
            topology
                .consumers
                .iter()
                .filter(|c| c.stream == st)
                .map(|c| c.durable.clone()),
        );
        if st == "FLEET_METRICS" {
            names.extend(s(&["tsdb-p0-of-2", "tsdb-p1-of-2"]));
        }
        for n in names {
            for f in [
                "CONSUMER.CREATE",
                "CONSUMER.DURABLE.CREATE",
                "CONSUMER.DELETE",
                "CONSUMER.INFO",
                "CONSUMER.MSG.NEXT",
                "CONSUMER.PAUSE",
            ] {
                pubs.push(format!("$JS.API.{f}.{st}.{n}"));
            }
            pubs.push(format!("$JS.API.CONSUMER.CREATE.{st}.{n}.fleet.x"));
            pubs.push(format!("$JS.ACK.{st}.{n}.1.1.1.1.0"));
            pubs.push(format!("$JS.FC.{st}.{n}.1"));
        }
        if let Some(b) = st.strip_prefix("KV_") {
            pubs.push(format!("$KV.{b}.key"));
            pubs.push(format!("$JS.API.DIRECT.GET.{st}.$KV.{b}.key"));
        }
    }
    // a candidate every spec names is tried too, so the allowed side is always exercised
    for u in users {
        let (p, sub) = u.patterns();
        pubs.extend(
            p.iter()
                .map(|x| x.replace(".>", ".x").replace(".*", ".x"))
                .filter(|x| !x.contains('*') && !x.contains('>')),
        );
        subs.extend(sub);
    }
    let mut ops: Vec<Op> = pubs
        .into_iter()
        .map(Op::Pub)
        .chain(subs.into_iter().map(Op::Sub))
        .collect();
    ops.sort();
    ops.dedup();
    ops
}

/// Destructive requests the admin is not sent (they would succeed, and the test would lose its streams).
fn destructive(op: &Op) -> bool {
    matches!(op, Op::Pub(x) if ["DELETE", "PURGE", "RESTORE", "SNAPSHOT", "STEPDOWN", "REMOVE", "UPDATE", "CREATE", "$KV.", "$JS.ACK."]
        .iter()
        .any(|w| x.contains(w)))
}

/// The README's matrix, rendered from the specs.
fn matrix<'a>(users: impl IntoIterator<Item = &'a Spec>) -> String {
    let list = |v: &[String]| {
        if v.is_empty() {
            "—".to_string()
        } else {
            v.iter()
                .map(|x| format!("`{x}`"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let mut out = String::from(
        "| user | publishes | reads streams (consumers) | other JetStream requests | subscribes to |\n|---|---|---|---|---|\n",
    );
    for u in users {
        if u.all {
            out.push_str(&format!(
                "| `{}` | everything (provisioning) | everything | everything | everything |\n",
                u.user
            ));
            continue;
        }
        let mut reads: Vec<String> = u
            .reads
            .iter()
            .map(|(st, how)| match how {
                Read::Any => format!("{st} (any)"),
                Read::Ordered => format!("{st} (ordered replay)"),
                Read::Durables(n) => format!("{st} ({})", n.join(", ")),
            })
            .collect();
        reads.extend(u.replays.iter().map(|(st, name, filters)| {
            format!(
                "{st} (`{name}` on {}, through `$JS.FLEET.API`)",
                filters
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            )
        }));

        let mut api = u.api.clone();
        api.extend(u.direct_get.iter().map(|d| format!("DIRECT.GET.{d}")));
        api.extend(u.kv.iter().map(|b| format!("KV {b}")));
        let mut sub = u.answers.clone();
        sub.extend(u.subscribe.iter().cloned());
        if !u.inbox.is_empty() {
            sub.push(format!("{}.>", u.inbox));
        }
        let generic = |x: String| {
            x.replace("prod-1", "<cluster>")
                .replace("payments", "<team>")
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            generic(u.user.clone()),
            generic(list(&u.publish)),
            if reads.is_empty() {
                "—".into()
            } else {
                generic(reads.join(", "))
            },
            generic(list(&api)),
            generic(list(&sub)),
        ));
    }
    out
}

#[test]
fn covers_is_nats_subset_matching() {
    assert!(covers("fleet.>", "fleet.a.b"));
    assert!(!covers("fleet.>", "fleet"));
    assert!(covers("fleet.*.x", "fleet.a.x"));
    assert!(covers("fleet.*.x", "fleet.*.x"));
    assert!(!covers("fleet.a.x", "fleet.*.x"));
    assert!(!covers("fleet.*", "fleet.>"));
    assert!(!covers("fleet.a", "fleet.a.b"));
    assert!(covers(
        "$JS.API.DIRECT.GET.S.fleet.facts.c.*",
        "$JS.API.DIRECT.GET.S.fleet.facts.c.*"
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_user_can_do_exactly_what_the_permission_matrix_says() -> Result<()> {
    // a copy of the shipped file with one more cluster onboarded as an operator would
    let dir = shipped_accounts_copy()?;
    let out = cluster_cmd(
        &[
            "add",
            "beta-2",
            "--overlay-dir",
            dir.path().join("agents").to_str().unwrap_or_default(),
        ],
        dir.path(),
    )?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secret: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(
        dir.path()
            .join("secrets/agent-beta-2/multipilot-agent-nats.yaml"),
    )?)?;
    let minted_password = secret["stringData"]["password"]
        .as_str()
        .context("password")?
        .to_string();
    // and a team that sees prod-1
    ok(team_cmd(
        &["add", "payments", "--clusters", "cluster=prod-1"],
        dir.path(),
    )?)?;
    let team_password = team_password(dir.path(), "payments")?;
    let accounts = accounts_from(&dir.path().join("accounts.conf"))?;
    let nats = NatsServer::start_with(|_| format!("{accounts}\nno_auth_user: admin\n")).await?;
    let admin = nats.client().await?;
    Topology::embedded()
        .provision(&jetstream::new(admin.clone()))
        .await?;

    let users = specs("beta-2");
    let ops = candidates(&users, &["prod-1", "beta-2"]);
    let log = nats
        .store_dir()
        .parent()
        .context("log dir")?
        .join("nats.log");
    let violation = regex::Regex::new(
        r#"/user:([^"]+)" - (Publish|Subscription) Violation - (?:User "[^"]*", )?Subject "([^"]+)""#,
    )?;
    let mut surprises = Vec::new();
    let mut tried = 0usize;
    for u in &users {
        let pw = match u.user.as_str() {
            "agent-beta-2" => minted_password.clone(),
            "team-payments" | "team-payments-replay" => team_password.clone(),
            _ => password(&u.user),
        };
        let client = async_nats::ConnectOptions::new()
            .user_and_password(u.user.clone(), pw)
            // (a user without an inbox makes no requests: the client's default is never used)
            .custom_inbox_prefix(if u.inbox.is_empty() {
                "_INBOX".to_string()
            } else {
                u.inbox.clone()
            })
            .connect(nats.url())
            .await
            .with_context(|| format!("{} connects", u.user))?;
        let mine: Vec<&Op> = ops
            .iter()
            .filter(|op| !(u.all && destructive(op)))
            .collect();
        let mut subs = Vec::new();
        for op in &mine {
            match op {
                Op::Pub(x) => client.publish(x.clone(), "".into()).await?,
                Op::Sub(x) => subs.push(client.subscribe(x.clone()).await?),
            }
        }
        tried += mine.len();
        // a publish nobody may make, last: once the server logged it, it has judged everything before it
        let sentinel = format!("sentinel.{}", u.user);
        client.publish(sentinel.clone(), "".into()).await?;
        client.flush().await?;
        let denied: std::collections::BTreeSet<Op> = if u.all {
            Default::default()
        } else {
            eventually(
                &format!("{}'s sentinel in the server log", u.user),
                20,
                async || {
                    let text = std::fs::read_to_string(&log).ok()?;
                    let mine: std::collections::BTreeSet<Op> = violation
                        .captures_iter(&text)
                        .filter(|c| c[1] == u.user)
                        .map(|c| {
                            if &c[2] == "Publish" {
                                Op::Pub(c[3].to_string())
                            } else {
                                Op::Sub(c[3].to_string())
                            }
                        })
                        .collect();
                    mine.contains(&Op::Pub(sentinel.clone())).then_some(mine)
                },
            )
            .await?
        };
        for op in mine {
            let (want, got) = (u.allows(op), !denied.contains(op));
            if want != got {
                surprises.push(format!(
                    "{}: {op:?} is {} but should be {}",
                    u.user,
                    if got { "allowed" } else { "denied" },
                    if want { "allowed" } else { "denied" }
                ));
            }
        }
        drop(subs);
    }
    assert!(
        surprises.is_empty(),
        "{} surprises in {tried} tries:\n{}",
        surprises.len(),
        surprises.join("\n")
    );
    // the README shows this very matrix
    let readme = std::fs::read_to_string(root().join("README.md"))?;
    // (one agent row: the minted user is the shipped one with another name)
    let want = matrix(users.iter().filter(|u| u.user != "agent-beta-2"));
    assert!(
        readme.contains(&want),
        "the README's security section does not show the permission matrix; it should read:\n{want}"
    );
    eprintln!(
        "{tried} publishes and subscriptions tried across {} users",
        users.len()
    );
    Ok(())
}
