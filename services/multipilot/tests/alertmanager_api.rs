//! The alert router's Alertmanager API v2 (the real `multipilot alerts` process on a real nats-server)
//! against the real clients: Debian's `amtool` lists, adds and silences alerts and reads the status; a real
//! Prometheus, with an always-firing rule, delivers its alert end to end (router API and a webhook
//! receiver); invalid posts are refused in Alertmanager's words; a posted alert resolves after
//! `resolve_timeout` unless posted again, or at its `endsAt`; and posted alerts survive a kill -9 and a
//! wiped data directory (from the `MULTIPILOT_ALERTS` bucket). amtool and Prometheus must be installed
//! (`./scripts/test` installs Debian's `prometheus-alertmanager` and `prometheus`); without them the tests
//! fail and say so.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use common::{Got, Proc, Receiver, Router, eventually};
use multipilot_schemas::payload::{IncidentStatus, Severity};
use multipilot_schemas::stable_id;
use multipilot_testkit::free_port;
use serde_json::{Value, json};

fn tool(name: &str, package: &str) -> Result<PathBuf> {
    let p = PathBuf::from("/usr/bin").join(name);
    if p.exists() {
        return Ok(p);
    }
    bail!("{name} not found in /usr/bin: install Debian's {package} (./scripts/test does)")
}

/// `amtool --alertmanager.url=<router> <args>` to its end: its stdout, or its stderr as the error.
fn amtool(r: &Router, args: &[&str]) -> Result<String> {
    let home = tempfile::tempdir()?; // no ~/.config/amtool/config.yml of the user's
    let out = Command::new(tool("amtool", "prometheus-alertmanager")?)
        .arg(format!("--alertmanager.url={}", r.api))
        .args(args)
        .env("HOME", home.path())
        .output()
        .context("running amtool")?;
    if !out.status.success() {
        bail!(
            "amtool {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn routing(receiver_url: &str) -> String {
    format!(
        r#"
route:
  receiver: default
  group_by: [alertname]
  group_wait: 500ms
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: default
    webhook_configs: [{{url: "{receiver_url}/default"}}]
  - name: unused
    slack_configs: [{{api_url: "{receiver_url}/slack-secret-token"}}]
inhibit_rules:
  - source_matchers: ['alertname="cluster-unreachable"']
    target_matchers: ['alertname!="cluster-unreachable"']
    equal: [cluster]
"#
    )
}

async fn post(r: &Router, body: &Value) -> Result<(u16, Value)> {
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v2/alerts", r.api))
        .json(body)
        .send()
        .await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// The listed alert whose `alertname` is `name`.
async fn listed(r: &Router, query: &str, name: &str) -> Option<Value> {
    let v = r.get(&format!("/api/v2/alerts{query}")).await.ok()?;
    v.as_array()?
        .iter()
        .find(|a| a["labels"]["alertname"] == name)
        .cloned()
}

/// The (alertname, status) of each alert of every webhook notification so far.
fn notified(rx: &Receiver) -> Vec<(String, String)> {
    rx.got("/default")
        .iter()
        .flat_map(|g: &Got| g.body["alerts"].as_array().cloned().unwrap_or_default())
        .map(|a| {
            (
                a["labels"]["alertname"].as_str().unwrap_or_default().into(),
                a["status"].as_str().unwrap_or_default().into(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amtool_queries_adds_and_silences_alerts_and_reads_the_status() -> Result<()> {
    tool("amtool", "prometheus-alertmanager")?;
    let rx = Receiver::start().await?;
    let mut r = Router::start(&routing(&rx.url)).await?;

    // one alert from an incident, one added with amtool, and a posted pair where one inhibits the other
    r.incident(
        "a",
        "node-not-ready",
        Severity::Warning,
        IncidentStatus::Open,
        1,
        &[],
    )
    .await?;
    amtool(
        &r,
        &[
            "alert",
            "add",
            "alertname=DiskFull",
            "cluster=b",
            "--annotation=summary=disk 95% full",
            "--generator-url=http://prometheus/graph?g0.expr=disk",
        ],
    )?;
    let (code, body) = post(
        &r,
        &json!([
            {"labels": {"alertname": "cluster-unreachable", "cluster": "c"}},
            {"labels": {"alertname": "PodCrashLooping", "cluster": "c", "pod": "web-1"}},
        ]),
    )
    .await?;
    assert_eq!(code, 200, "{body}");

    // amtool lists what fires and isn't muted: the incident's alert and the one it added
    let out = eventually("amtool listing both alerts", 30, async || {
        let out = amtool(&r, &["alert", "query"]).ok()?;
        (out.contains("node-not-ready") && out.contains("DiskFull")).then_some(out)
    })
    .await?;
    assert!(out.contains("disk 95% full"), "{out}");
    assert!(
        !out.contains("PodCrashLooping"),
        "inhibited: not listed by default\n{out}"
    );
    let json_out: Value = serde_json::from_str(&amtool(&r, &["-o", "json", "alert", "query"])?)?;
    let disk = json_out
        .as_array()
        .context("a list")?
        .iter()
        .find(|a| a["labels"]["alertname"] == "DiskFull")
        .context("DiskFull in amtool's JSON")?;
    // Alertmanager's fingerprint of {alertname="DiskFull", cluster="b"}, the same label set it hashes
    assert_eq!(disk["fingerprint"].as_str().map(str::len), Some(16));
    assert_eq!(disk["status"]["state"], "active");
    assert_eq!(disk["receivers"][0]["name"], "default");
    assert_eq!(disk["generatorURL"], "http://prometheus/graph?g0.expr=disk");
    // amtool sent no endsAt: it resolves resolve_timeout (5 min) after now
    let ends: chrono::DateTime<chrono::Utc> = disk["endsAt"].as_str().context("endsAt")?.parse()?;
    let ahead = ends - chrono::Utc::now();
    assert!(
        ahead > chrono::Duration::minutes(4) && ahead <= chrono::Duration::minutes(5),
        "{ahead}"
    );
    // the inhibited one, with -i, says by which
    let out = amtool(&r, &["alert", "query", "-i", "alertname=PodCrashLooping"])?;
    assert!(
        out.contains("PodCrashLooping") && out.contains("suppressed"),
        "{out}"
    );
    let crash = listed(&r, "", "PodCrashLooping").await.context("listed")?;
    let unreachable = listed(&r, "", "cluster-unreachable")
        .await
        .context("listed")?;
    assert_eq!(
        crash["status"]["inhibitedBy"][0],
        unreachable["fingerprint"]
    );
    // filters as amtool sends them
    let out = amtool(&r, &["alert", "query", "cluster=~\"a|b\""])?;
    assert!(
        out.contains("node-not-ready")
            && out.contains("DiskFull")
            && !out.contains("cluster-unreachable"),
        "{out}"
    );
    assert!(
        amtool(&r, &["alert", "query", "--receiver=nobody"])?
            .lines()
            .skip(1)
            .all(|l| l.trim().is_empty())
    );

    // posted alerts are routed, grouped and notified like the others
    eventually("DiskFull notified", 30, async || {
        notified(&rx)
            .contains(&("DiskFull".into(), "firing".into()))
            .then_some(())
    })
    .await?;

    // silences: add, the alert leaves the default query, query lists the silence, expire brings it back
    let id = amtool(
        &r,
        &["silence", "add", "alertname=DiskFull", "-c", "cleaning up"],
    )?
    .trim()
    .to_string();
    assert!(!id.is_empty());
    let out = amtool(&r, &["alert", "query"])?;
    assert!(!out.contains("DiskFull"), "silenced: not listed\n{out}");
    let out = amtool(&r, &["alert", "query", "-s", "alertname=DiskFull"])?;
    assert!(
        out.contains("DiskFull") && out.contains("suppressed"),
        "{out}"
    );
    let disk = listed(&r, "", "DiskFull").await.context("listed")?;
    assert_eq!(disk["status"]["silencedBy"][0], id.as_str());
    let out = amtool(&r, &["silence", "query"])?;
    assert!(
        out.contains(&id) && out.contains("alertname=\"DiskFull\"") && out.contains("cleaning up"),
        "{out}"
    );
    let out = amtool(&r, &["silence", "query", "alertname=Other"])?;
    assert!(!out.contains(&id), "filtered out\n{out}");
    amtool(&r, &["silence", "expire", &id])?;
    let out = amtool(&r, &["silence", "query"])?;
    assert!(!out.contains(&id), "expired: not listed\n{out}");
    let out = amtool(&r, &["alert", "query"])?;
    assert!(out.contains("DiskFull"), "{out}");

    // the status: the routing in force (URLs redacted), no gossip cluster
    let out = amtool(&r, &["config", "show"])?;
    assert!(
        out.contains("receiver: default") && out.contains("<secret>"),
        "{out}"
    );
    assert!(!out.contains("slack-secret-token"), "{out}");
    let out = amtool(&r, &["cluster", "show"])?;
    assert!(out.contains("disabled"), "{out}");

    // the other v2 reads
    let receivers = r.get("/api/v2/receivers").await?;
    assert_eq!(receivers, json!([{"name": "default"}, {"name": "unused"}]));
    let groups = r.get("/api/v2/alerts/groups").await?;
    let g = groups
        .as_array()
        .context("a list")?
        .iter()
        .find(|g| g["labels"]["alertname"] == "DiskFull")
        .context("DiskFull's group")?;
    assert_eq!(g["receiver"]["name"], "default");
    assert_eq!(g["alerts"][0]["labels"]["cluster"], "b");
    let inc = listed(&r, "", "node-not-ready").await.context("listed")?;
    assert_eq!(inc["fingerprint"], stable_id(&["a", "node-not-ready"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_delivers_its_alert_end_to_end() -> Result<()> {
    let prom = tool("prometheus", "prometheus")?;
    let rx = Receiver::start().await?;
    let r = Router::start(&routing(&rx.url)).await?;
    let dir = tempfile::tempdir()?;
    let router = r.api.trim_start_matches("http://");
    std::fs::write(
        dir.path().join("rules.yml"),
        "groups:\n  - name: always\n    rules:\n      - alert: AlwaysFiring\n        expr: vector(1)\n        \
         labels: {severity: warning, cluster: prom}\n        annotations: {summary: \"it always fires\"}\n",
    )?;
    std::fs::write(
        dir.path().join("prometheus.yml"),
        format!(
            "global:\n  evaluation_interval: 1s\n  scrape_interval: 1s\nrule_files: [rules.yml]\n\
             alerting:\n  alertmanagers:\n    - api_version: v2\n      static_configs:\n        - targets: [\"{router}\"]\n"
        ),
    )?;
    let port = free_port()?;
    let _prom = Proc::spawn(
        Command::new(prom)
            .current_dir(dir.path())
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            // its first evaluation may come before it has found the router; don't wait a minute to re-send
            .arg("--rules.alert.resend-delay=1s")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log"))?),
    )?;
    let log = || std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
    let alert = eventually("Prometheus' alert in the router", 60, async || {
        listed(&r, "", "AlwaysFiring").await
    })
    .await
    .with_context(log)?;
    assert_eq!(alert["labels"]["severity"], "warning");
    assert_eq!(alert["annotations"]["summary"], "it always fires");
    assert_eq!(alert["status"]["state"], "active");
    assert!(
        alert["generatorURL"]
            .as_str()
            .is_some_and(|u| u.contains("vector%281%29") || u.contains("vector(1)")),
        "{alert}"
    );
    // Prometheus sends an endsAt ahead (a few resend delays; it re-sends every second here): the router
    // keeps it until then, and the re-sends keep it firing from the same start
    let ends: chrono::DateTime<chrono::Utc> =
        alert["endsAt"].as_str().context("endsAt")?.parse()?;
    assert!(ends > chrono::Utc::now(), "{alert}");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let still = listed(&r, "", "AlwaysFiring")
        .await
        .context("still firing")?;
    assert_eq!(still["startsAt"], alert["startsAt"]);
    let ends_later: chrono::DateTime<chrono::Utc> =
        still["endsAt"].as_str().context("endsAt")?.parse()?;
    assert!(ends_later > ends, "re-sends push endsAt on: {still}");
    // and notifies it, routed and grouped like any other
    let g = eventually("AlwaysFiring at the webhook", 60, async || {
        rx.got("/default").into_iter().find(|g| {
            g.body["alerts"]
                .as_array()
                .is_some_and(|a| a.iter().any(|a| a["labels"]["alertname"] == "AlwaysFiring"))
        })
    })
    .await?;
    assert_eq!(g.body["status"], "firing");
    assert_eq!(g.body["groupLabels"]["alertname"], "AlwaysFiring");
    assert_eq!(g.body["alerts"][0]["fingerprint"], alert["fingerprint"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_alerts_are_refused_with_alertmanagers_reasons() -> Result<()> {
    let rx = Receiver::start().await?;
    let r = Router::start(&routing(&rx.url)).await?;
    // Alertmanager 0.25's answers to the same bodies
    for (body, code, reason) in [
        (
            json!([{"labels": {}}]),
            400,
            json!("at least one label pair required"),
        ),
        (
            json!([{"labels": {"a": ""}}]),
            400,
            json!("at least one label pair required"),
        ),
        (
            json!([{"labels": {"": "x"}}]),
            400,
            json!("invalid label set: invalid name \"\""),
        ),
        (
            json!([{"labels": {"a-b": "x"}}]),
            400,
            json!("invalid label set: invalid name \"a-b\""),
        ),
        (
            json!([{"labels": {"a": "x"}, "annotations": {"b-c": "y"}}]),
            400,
            json!("invalid annotations: invalid name \"b-c\""),
        ),
        (
            json!([{"labels": {"a": "x"}, "startsAt": "2024-01-02T00:00:00Z", "endsAt": "2024-01-01T00:00:00Z"}]),
            400,
            json!("start time must be before end time"),
        ),
        (
            json!([{"annotations": {"summary": "no labels"}}]),
            422,
            json!({"code": 602, "message": "0.labels in body is required"}),
        ),
    ] {
        let (got_code, got) = post(&r, &body).await?;
        assert_eq!((got_code, &got), (code, &reason), "{body}");
    }
    let (code, got) = post(&r, &json!({"labels": {"a": "x"}})).await?;
    assert_eq!(code, 400);
    assert!(
        got["message"]
            .as_str()
            .is_some_and(|m| m.contains("parsing alerts body")),
        "{got}"
    );
    // in a mixed batch the valid alerts are taken, the invalid ones reported
    let (code, got) = post(
        &r,
        &json!([{"labels": {"alertname": "Valid"}}, {"labels": {"alertname": "x", "bad-name": "y"}}]),
    )
    .await?;
    assert_eq!(
        (code, got),
        (400, json!("invalid label set: invalid name \"bad-name\""))
    );
    assert!(listed(&r, "", "Valid").await.is_some());
    assert!(listed(&r, "", "x").await.is_none());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posted_alerts_resolve_by_timeout_or_endsat_and_survive_restarts() -> Result<()> {
    let rx = Receiver::start().await?;
    let mut r = Router::start_with(
        &routing(&rx.url),
        &[("MULTIPILOT_ALERTS__RESOLVE_TIMEOUT", "3s")],
    )
    .await?;

    // no endsAt: it resolves resolve_timeout after it was last posted…
    let once = json!([{"labels": {"alertname": "Once", "cluster": "x"}}]);
    assert_eq!(post(&r, &once).await?.0, 200);
    eventually("Once notified firing", 30, async || {
        notified(&rx)
            .contains(&("Once".into(), "firing".into()))
            .then_some(())
    })
    .await?;
    // …unless posted again: re-posting keeps it firing, from the same start
    let kept = json!([{"labels": {"alertname": "Kept", "cluster": "x"}}]);
    assert_eq!(post(&r, &kept).await?.0, 200);
    let first = listed(&r, "", "Kept").await.context("Kept listed")?;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(post(&r, &kept).await?.0, 200);
    }
    let again = listed(&r, "", "Kept").await.context("Kept still firing")?;
    assert_eq!(again["startsAt"], first["startsAt"]);
    assert_eq!(again["fingerprint"], first["fingerprint"]);
    let once_state = eventually("Once resolved by the timeout", 30, async || {
        notified(&rx)
            .contains(&("Once".into(), "resolved".into()))
            .then_some(())
    })
    .await;
    once_state?;
    assert!(
        listed(&r, "", "Once").await.is_none(),
        "resolved: not listed"
    );
    assert_eq!(
        listed(&r, "?resolved=true", "Once")
            .await
            .context("listed with resolved=true")?["status"]["state"],
        "resolved"
    );

    // an endsAt in the future keeps it firing until then; one in the past resolves it
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let held = json!([{"labels": {"alertname": "Held", "cluster": "y"}, "endsAt": later}]);
    assert_eq!(post(&r, &held).await?.0, 200);
    eventually("Held notified firing", 30, async || {
        notified(&rx)
            .contains(&("Held".into(), "firing".into()))
            .then_some(())
    })
    .await?;

    // a kill -9 keeps it (sled) …
    r.kill();
    r.spawn().await?;
    let held_alert = listed(&r, "", "Held")
        .await
        .context("Held after a restart")?;
    assert_eq!(held_alert["status"]["state"], "active");
    // … and so does a wiped data directory (restored from MULTIPILOT_ALERTS)
    r.kill();
    std::fs::remove_dir_all(r.data())?;
    r.spawn().await?;
    let restored = eventually("Held after a wipe", 30, async || {
        listed(&r, "", "Held").await
    })
    .await
    .with_context(|| r.log())?;
    assert_eq!(restored["fingerprint"], held_alert["fingerprint"]);
    assert_eq!(restored["startsAt"], held_alert["startsAt"]);
    assert_eq!(restored["endsAt"], held_alert["endsAt"]);

    // the endsAt in the past resolves it, and the receiver hears so once
    let past = (chrono::Utc::now() - chrono::Duration::seconds(1)).to_rfc3339();
    let done = json!([{"labels": {"alertname": "Held", "cluster": "y"}, "endsAt": past}]);
    assert_eq!(post(&r, &done).await?.0, 200);
    eventually("Held notified resolved", 30, async || {
        notified(&rx)
            .contains(&("Held".into(), "resolved".into()))
            .then_some(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let firing_held = notified(&rx)
        .iter()
        .filter(|a| **a == ("Held".to_string(), "firing".to_string()))
        .count();
    assert_eq!(firing_held, 1, "not notified again after the restarts");
    Ok(())
}

/// `amtool` with a bearer token (its `--http.config.file`), as a team would run it.
fn amtool_as(r: &Router, token: &str, args: &[&str]) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("http.yml");
    std::fs::write(
        &config,
        format!("authorization:\n  type: Bearer\n  credentials: {token}\n"),
    )?;
    let mut all = vec![format!("--http.config.file={}", config.display())];
    all.extend(args.iter().map(|a| a.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    amtool(r, &all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_token_shows_and_silences_only_its_clusters_alerts() -> Result<()> {
    tool("amtool", "prometheus-alertmanager")?;
    const TEAM: &str = "team-token-0123456789";
    const FLEET: &str = "fleet-token-0123456789";
    let tokens = tempfile::tempdir()?;
    let file = tokens.path().join("tokens.yaml");
    std::fs::write(
        &file,
        format!(
            "- token_sha256: {}\n  subject: team-payments\n  role: operator\n  team: payments\n  clusters: [a]\n\
             - token_sha256: {}\n  subject: oncall\n  role: operator\n",
            multipilot_runtime::auth::sha256_hex(TEAM),
            multipilot_runtime::auth::sha256_hex(FLEET),
        ),
    )?;
    let rx = Receiver::start().await?;
    let file_env = file.display().to_string();
    let mut r = Router::start_with(
        &routing(&rx.url),
        &[
            ("MULTIPILOT_ALERTS__AUTH__ENABLED", "true"),
            ("MULTIPILOT_ALERTS__AUTH__TOKENS_FILE", &file_env),
        ],
    )
    .await?;
    for c in ["a", "b"] {
        r.incident(
            c,
            "node-not-ready",
            Severity::Warning,
            IncidentStatus::Open,
            1,
            &[],
        )
        .await?;
    }
    amtool_as(
        &r,
        FLEET,
        &["alert", "add", "alertname=DiskFull", "cluster=b"],
    )?;
    // the team's view: its cluster's alerts only
    let out = eventually("the team sees a's alert", 30, async || {
        let out = amtool_as(&r, TEAM, &["alert", "query"]).ok()?;
        out.contains("node-not-ready").then_some(out)
    })
    .await?;
    let json_out: Value =
        serde_json::from_str(&amtool_as(&r, TEAM, &["-o", "json", "alert", "query"])?)?;
    let clusters: Vec<&str> = json_out
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["labels"]["cluster"].as_str())
        .collect();
    anyhow::ensure!(clusters == ["a"], "{out}\n{json_out}");
    // asking for b by name shows nothing either
    let out = amtool_as(&r, TEAM, &["-o", "json", "alert", "query", "cluster=b"])?;
    anyhow::ensure!(out.trim() == "[]", "{out}");
    // the whole fleet's token sees both
    let all: Value =
        serde_json::from_str(&amtool_as(&r, FLEET, &["-o", "json", "alert", "query"])?)?;
    anyhow::ensure!(all.as_array().map(Vec::len) == Some(3), "{all}");

    // silences: only ones pinned to its clusters
    let mine = amtool_as(
        &r,
        TEAM,
        &[
            "silence",
            "add",
            "cluster=a",
            "alertname=node-not-ready",
            "--comment=mine",
        ],
    )?;
    for args in [
        vec!["silence", "add", "cluster=b", "--comment=theirs"],
        vec![
            "silence",
            "add",
            "alertname=node-not-ready",
            "--comment=everywhere",
        ],
        vec!["silence", "add", "cluster=~a|b", "--comment=regex"],
        vec!["silence", "add", "cluster=~.+", "--comment=regex"],
        vec!["silence", "add", "cluster!=a", "--comment=negative"],
    ] {
        let err = amtool_as(&r, TEAM, &args).expect_err("refused");
        anyhow::ensure!(
            err.to_string().contains("403")
                || err.to_string().to_lowercase().contains("forbidden")
                || err.to_string().contains("sees only some clusters"),
            "{args:?}: {err}"
        );
    }
    let theirs = amtool_as(
        &r,
        FLEET,
        &["silence", "add", "cluster=b", "--comment=theirs"],
    )?;
    let listed = amtool_as(&r, TEAM, &["silence", "query", "-q"])?;
    anyhow::ensure!(
        listed.trim() == mine.trim(),
        "team sees silences {listed:?}, made {mine:?}"
    );
    let listed = amtool_as(&r, FLEET, &["silence", "query", "-q"])?;
    anyhow::ensure!(
        listed.contains(mine.trim()) && listed.contains(theirs.trim()),
        "{listed}"
    );
    // another team's silence can't be expired (nor seen) by it
    anyhow::ensure!(amtool_as(&r, TEAM, &["silence", "expire", theirs.trim()]).is_err());
    anyhow::ensure!(amtool_as(&r, FLEET, &["silence", "query", "-q"])?.contains(theirs.trim()));
    // posting an alert for another cluster, and the delivery state of every receiver: refused
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("{}/api/v2/alerts", r.api))
        .bearer_auth(TEAM)
        .json(&json!([{"labels": {"alertname": "X", "cluster": "b"}}]))
        .send()
        .await?;
    anyhow::ensure!(resp.status().as_u16() == 403, "{}", resp.status());
    for path in ["/api/v1/dead", "/api/v1/receivers"] {
        let status = client
            .get(format!("{}{path}", r.api))
            .bearer_auth(TEAM)
            .send()
            .await?
            .status()
            .as_u16();
        anyhow::ensure!(status == 403, "{path}: {status}");
    }
    Ok(())
}
