//! Rules evaluated by the real `multipilot tsdb` process reach the real `multipilot alerts` router (both on
//! a real nats-server): an alerting rule's alert is posted to the router's `POST /api/v2/alerts` and listed
//! there with its rendered annotations, `GET /api/v1/rules` and `GET /api/v1/alerts` show it, a bad file
//! on reload is refused while the loaded rules keep running, and a bad file at boot stops the role.

mod common;

use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use common::{Proc, Router, eventually};
use multipilot_testkit::free_port;
use serde_json::Value;

const RULES: &str = r#"
groups:
  - name: e2e
    interval: 1s
    rules:
      - record: e2e:one
        expr: vector(1)
      - alert: AlwaysFiring
        expr: label_replace(e2e:one, "cluster", "edge-1", "", "") > 0
        labels:
          severity: warning
        annotations:
          summary: "{{ $labels.cluster }} fires with {{ humanize $value }}"
"#;

fn routing() -> &'static str {
    r#"
route:
  receiver: default
  group_by: [alertname]
  group_wait: 500ms
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: default
"#
}

fn config(dir: &std::path::Path, listen: &str, router: &str) -> Result<std::path::PathBuf> {
    let path = dir.join("hub.yaml");
    std::fs::write(
        &path,
        format!(
            "tsdb:\n  listen: \"{listen}\"\n  rule_files: [\"{}\"]\n  rule_evaluation_interval: 1s\n  alertmanager_url: \"{router}\"\n",
            dir.join("*.rules.yaml").display()
        ),
    )?;
    Ok(path)
}

async fn get(url: &str) -> Option<Value> {
    reqwest::get(url).await.ok()?.json().await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tsdb_rule_alert_reaches_the_router_and_bad_reload_keeps_rules() -> Result<()> {
    let r = Router::start(routing()).await?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("e2e.rules.yaml"), RULES)?;
    let port = free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let cfg = config(dir.path(), &listen, &r.api)?;
    let log = dir.path().join("tsdb.log");
    let mut cmd = common::role("tsdb", &r.nats.url(), &dir.path().join("data"), &log)?;
    cmd.arg("--config").arg(&cfg);
    let _tsdb = Proc::spawn(&mut cmd)?;
    let tsdb_log = || std::fs::read_to_string(&log).unwrap_or_default();

    let alert = eventually("the rule's alert in the router", 60, async || {
        let v = r.get("/api/v2/alerts").await.ok()?;
        v.as_array()?
            .iter()
            .find(|a| a["labels"]["alertname"] == "AlwaysFiring")
            .cloned()
    })
    .await
    .with_context(tsdb_log)?;
    assert_eq!(alert["labels"]["cluster"], "edge-1", "{alert}");
    assert_eq!(alert["labels"]["severity"], "warning", "{alert}");
    assert_eq!(
        alert["annotations"]["summary"], "edge-1 fires with 1",
        "{alert}"
    );
    assert_eq!(alert["status"]["state"], "active", "{alert}");
    assert!(
        alert["generatorURL"]
            .as_str()
            .is_some_and(|u| u.starts_with(&format!("http://{listen}/graph?g0.expr="))),
        "{alert}"
    );

    let base = format!("http://{listen}");
    let rules = get(&format!("{base}/api/v1/rules"))
        .await
        .context("rules")?;
    let group = &rules["data"]["groups"][0];
    assert_eq!(group["name"], "e2e", "{rules}");
    assert_eq!(group["rules"][0]["type"], "recording", "{rules}");
    assert_eq!(group["rules"][1]["type"], "alerting", "{rules}");
    assert_eq!(group["rules"][1]["state"], "firing", "{rules}");
    assert_eq!(group["rules"][1]["health"], "ok", "{rules}");
    let alerts = get(&format!("{base}/api/v1/alerts"))
        .await
        .context("alerts")?;
    assert_eq!(alerts["data"]["alerts"][0]["state"], "firing", "{alerts}");
    assert_eq!(alerts["data"]["alerts"][0]["value"], "1e+00", "{alerts}");
    // the recording rule's series is queryable
    let q = get(&format!("{base}/api/v1/query?query=e2e:one"))
        .await
        .context("query")?;
    assert_eq!(q["data"]["result"][0]["value"][1], "1", "{q}");

    // a bad file on reload is refused with its rule named; the loaded rules keep running
    std::fs::write(
        dir.path().join("bad.rules.yaml"),
        "groups:\n  - name: broken\n    rules:\n      - alert: Oops\n        expr: 'up =='\n",
    )?;
    let resp = reqwest::Client::new()
        .post(format!("{base}/-/reload"))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 500);
    let text = resp.text().await?;
    assert!(
        text.contains("bad.rules.yaml") && text.contains("Oops"),
        "{text}"
    );
    let rules = get(&format!("{base}/api/v1/rules"))
        .await
        .context("rules")?;
    assert_eq!(
        rules["data"]["groups"].as_array().map(Vec::len),
        Some(1),
        "{rules}"
    );
    let before = rules["data"]["groups"][0]["lastEvaluation"].clone();
    eventually("evaluations after the refused reload", 10, async || {
        let v = get(&format!("{base}/api/v1/rules")).await?;
        (v["data"]["groups"][0]["lastEvaluation"] != before).then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tsdb_does_not_start_on_a_bad_rule_file() -> Result<()> {
    let r = Router::start(routing()).await?;
    let dir = tempfile::tempdir()?;
    std::fs::write(
        dir.path().join("x.rules.yaml"),
        "groups:\n  - name: g\n    rules:\n      - record: x\n        alert: Y\n        expr: up\n",
    )?;
    let cfg = config(dir.path(), &format!("127.0.0.1:{}", free_port()?), &r.api)?;
    let log = dir.path().join("tsdb.log");
    let mut cmd: Command = common::role("tsdb", &r.nats.url(), &dir.path().join("data"), &log)?;
    cmd.arg("--config").arg(&cfg);
    let mut p = Proc::spawn(&mut cmd)?;
    for _ in 0..300 {
        if let Some(status) = p.0.try_wait()? {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(!status.success(), "{log}");
            assert!(
                log.contains("x.rules.yaml") && log.contains("only one of"),
                "{log}"
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the tsdb role kept running on a bad rule file")
}
