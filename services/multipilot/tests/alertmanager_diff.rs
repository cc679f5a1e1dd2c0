//! The alert router against a real Alertmanager (Debian's `prometheus-alertmanager`), side by side: the same
//! routing file (nested routes, `continue`, regex and negative matchers, `group_by` given, `[]`, `['...']`
//! and absent, `max_alerts`, mute and active time intervals, an inhibition rule), the same silence and the same posted alerts — one of them
//! already resolved — go to both; then some alerts resolve. Their alert lists, groups and webhook payloads
//! (a sink per side records them) must agree: receiver, `groupKey`, status, group and common labels, the
//! alerts in each notification in order, `truncatedAlerts`. Alertmanager must be installed (`./scripts/test`
//! installs it); without it the test fails and says so.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use chrono::Utc;
use common::{Proc, Receiver, Router};
use multipilot_testkit::free_port;
use serde_json::{Value, json};

/// The routing file, its webhooks under `base`. The root groups by alertname and cluster.
fn routing(base: &str) -> String {
    format!(
        r#"
route:
  receiver: default
  group_by: [alertname, cluster]
  group_wait: 2s
  group_interval: 3s
  repeat_interval: 1h
  routes:
    # `[]` inherits the root's grouping; continue on to the siblings
    - matchers: ['team="db"']
      receiver: db
      group_by: []
      continue: true
    # every label: one group per alert
    - matchers: ['severity=~"critical|page"']
      receiver: pager
      group_by: ['...']
    # time intervals: muted all day (in Berlin), or active only in a year long past
    - matchers: ['team="quiet"']
      receiver: db
      mute_time_intervals: [all-day]
    - matchers: ['team="later"']
      receiver: db
      active_time_intervals: [last-century]
    - matchers: ['team="web"']
      receiver: web
      group_by: [service]
      routes:
        # absent: inherits [service]; at most one alert per payload
        - matchers: ['env!="prod"', 'service=~"check.*"']
          receiver: web-dev
receivers:
  - name: default
    webhook_configs: [{{url: "{base}/default"}}]
  - name: db
    webhook_configs: [{{url: "{base}/db"}}]
  - name: pager
    webhook_configs: [{{url: "{base}/pager", send_resolved: false}}]
  - name: web
    webhook_configs: [{{url: "{base}/web"}}]
  - name: web-dev
    webhook_configs: [{{url: "{base}/web-dev", max_alerts: 1}}]
time_intervals:
  - name: all-day
    time_intervals:
      - times: [{{start_time: '00:00', end_time: '24:00'}}]
        location: Europe/Berlin
  - name: last-century
    time_intervals: [{{years: ['1999']}}]
inhibit_rules:
  - source_matchers: ['alertname="ClusterDown"']
    target_matchers: ['alertname!="ClusterDown"']
    equal: [cluster]
"#
    )
}

/// A real Alertmanager with `config` on free ports (no clustering), until dropped.
struct Alertmanager {
    _proc: Proc,
    _dir: tempfile::TempDir,
    api: String,
}

impl Alertmanager {
    async fn start(config: &str) -> Result<Alertmanager> {
        let bin = PathBuf::from("/usr/bin/prometheus-alertmanager");
        if !bin.exists() {
            bail!(
                "{} not found: install Debian's prometheus-alertmanager (./scripts/test does)",
                bin.display()
            );
        }
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("alertmanager.yml"), config)?;
        let port = free_port()?;
        let log = std::fs::File::create(dir.path().join("alertmanager.log"))?;
        let proc = Proc::spawn(
            Command::new(&bin)
                .arg(format!(
                    "--config.file={}",
                    dir.path().join("alertmanager.yml").display()
                ))
                .arg(format!(
                    "--storage.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .arg("--cluster.listen-address=")
                .stdout(Stdio::null())
                .stderr(log),
        )?;
        let api = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        for _ in 0..100 {
            if http
                .get(format!("{api}/-/ready"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return Ok(Alertmanager {
                    _proc: proc,
                    _dir: dir,
                    api,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!(
            "alertmanager did not get ready: {}",
            std::fs::read_to_string(dir.path().join("alertmanager.log")).unwrap_or_default()
        )
    }
}

async fn post(api: &str, path: &str, body: &Value) -> Result<Value> {
    let resp = reqwest::Client::new()
        .post(format!("{api}{path}"))
        .json(body)
        .send()
        .await?;
    let status = resp.status();
    let text = resp.text().await?;
    anyhow::ensure!(status.is_success(), "POST {api}{path}: {status} {text}");
    Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn get(api: &str, path: &str) -> Result<Value> {
    Ok(reqwest::get(format!("{api}{path}")).await?.json().await?)
}

/// What a receiver must agree on in a webhook payload (not `externalURL`, nor the router's extra fields).
fn payload(path: &str, b: &Value) -> Value {
    let alerts: Vec<Value> = b["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|a| {
            json!({
                "status": a["status"],
                "labels": a["labels"],
                "fingerprint": a["fingerprint"],
                // to the millisecond (Alertmanager keeps nanoseconds)
                "startsAt": a["startsAt"].as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()).map(|t| t.timestamp_millis()),
                "ended": a["endsAt"] != "0001-01-01T00:00:00Z",
            })
        })
        .collect();
    json!({
        "path": path,
        "version": b["version"],
        "receiver": b["receiver"],
        "groupKey": b["groupKey"],
        "status": b["status"],
        "truncatedAlerts": b["truncatedAlerts"],
        "groupLabels": b["groupLabels"],
        "commonLabels": b["commonLabels"],
        "alerts": alerts,
    })
}

/// Every payload a sink got, in a stable order (by receiver and groupKey, then as received).
fn payloads(rx: &Receiver) -> Vec<Value> {
    let mut v: Vec<Value> = rx.all().iter().map(|g| payload(&g.path, &g.body)).collect();
    v.sort_by_key(|p| (p["path"].to_string(), p["groupKey"].to_string()));
    v
}

/// Waits until both sinks got `expected` payloads, then a group interval and a second more, so that one
/// sending more than the other shows in the comparison.
async fn settle(am: &Receiver, router: &Receiver, expected: usize) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while am.all().len() < expected || router.all().len() < expected {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "not {expected} notifications on each side: Alertmanager {:#?}\nrouter {:#?}",
            payloads(am),
            payloads(router)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    Ok(())
}

/// The alert list as both must show it: labels, state, and how many silence or inhibit it.
async fn listed(api: &str) -> Result<Vec<Value>> {
    let v = get(api, "/api/v2/alerts").await?;
    let mut out: Vec<Value> = v
        .as_array()
        .context("an alert list")?
        .iter()
        .map(|a| {
            json!({
                "labels": a["labels"],
                "fingerprint": a["fingerprint"],
                "state": a["status"]["state"],
                "silenced": a["status"]["silencedBy"].as_array().map_or(0, Vec::len),
                "inhibited": a["status"]["inhibitedBy"].as_array().map_or(0, Vec::len),
                "receivers": a["receivers"].as_array().map(|r| {
                    let mut names: Vec<String> = r.iter().map(|x| x["name"].as_str().unwrap_or("").to_string()).collect();
                    names.sort();
                    names
                }),
            })
        })
        .collect();
    out.sort_by_key(|a| a["fingerprint"].to_string());
    Ok(out)
}

/// The groups as both must show them: receiver, group labels, and their alerts' fingerprints.
async fn groups(api: &str) -> Result<Vec<Value>> {
    let v = get(api, "/api/v2/alerts/groups").await?;
    let mut out: Vec<Value> = v
        .as_array()
        .context("a group list")?
        .iter()
        .map(|g| {
            let mut fps: Vec<String> = g["alerts"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|x| x["fingerprint"].as_str().unwrap_or("").to_string())
                        .collect()
                })
                .unwrap_or_default();
            fps.sort();
            json!({"receiver": g["receiver"]["name"], "labels": g["labels"], "alerts": fps})
        })
        .collect();
    out.sort_by_key(|g| g.to_string());
    Ok(out)
}

/// A JSON value's shape: the keys of its objects and the types of its values (what a client decodes).
fn shape(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
        Value::Array(a) => json!([a.first().map(shape)]),
        Value::String(_) => json!("string"),
        Value::Number(_) => json!("number"),
        Value::Bool(_) => json!("bool"),
        Value::Null => json!("null"),
    }
}

/// A posted alert from `a=1,b=2` labels.
fn alert(labels: &str, starts: &str, ends: Option<&str>) -> Value {
    let labels: BTreeMap<&str, &str> = labels
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let mut a = json!({"labels": labels, "annotations": {"summary": "s"}, "startsAt": starts});
    if let Some(e) = ends {
        a["endsAt"] = json!(e);
    }
    a
}

const DB_N1: &str = "alertname=DiskPressure,cluster=dev-1,team=db,instance=n1";
const NODE_C: &str = "alertname=NodeDown,cluster=c,severity=critical,job=node";
const ERRORS_E: &str = "alertname=Errors,cluster=e,team=web,service=checkout,env=dev";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_notifies_lists_and_groups_as_a_real_alertmanager_does() -> Result<()> {
    let am_rx = Receiver::start().await?;
    let router_rx = Receiver::start().await?;
    let am = Alertmanager::start(&routing(&am_rx.url)).await?;
    let router = Router::start(&routing(&router_rx.url)).await?;
    let apis = [am.api.as_str(), router.api.as_str()];

    // the same silence on both: the db alert of cluster b
    let ends = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let starts_silence = Utc::now().to_rfc3339();
    for api in apis {
        post(
            api,
            "/api/v2/silences",
            &json!({
                "matchers": [
                    {"name": "team", "value": "db", "isRegex": false, "isEqual": true},
                    {"name": "cluster", "value": "b", "isRegex": false, "isEqual": true},
                ],
                "startsAt": starts_silence, "endsAt": ends, "createdBy": "test", "comment": "diff",
            }),
        )
        .await?;
    }

    // the same alerts in one post each; they start now, so each group waits its group_wait
    let now = Utc::now();
    let starts = now.to_rfc3339();
    let before = (now - chrono::Duration::minutes(10)).to_rfc3339();
    let ended = (now - chrono::Duration::minutes(1)).to_rfc3339();
    let firing = [
        DB_N1,
        "alertname=DiskPressure,cluster=dev-1,team=db,instance=n2",
        "alertname=DiskPressure,cluster=b,team=db",
        NODE_C,
        "alertname=NodeDown,cluster=d,severity=page,job=node",
        "alertname=Latency,cluster=c,team=web,service=shop,env=prod",
        "alertname=Errors,cluster=c,team=web,service=shop,env=prod",
        "alertname=Latency,cluster=e,team=web,service=checkout,env=dev",
        ERRORS_E,
        // routes muted by a time interval, or outside their active one: nothing sent
        "alertname=Backup,cluster=g,team=quiet",
        "alertname=Backup,cluster=g,team=later",
        // the inhibition: ClusterDown on f mutes f's other alerts
        "alertname=ClusterDown,cluster=f",
        "alertname=PodCrash,cluster=f,pod=web-1",
    ];
    let mut batch: Vec<Value> = firing.iter().map(|l| alert(l, &starts, None)).collect();
    // posted already resolved: in no notification
    batch.push(alert(
        "alertname=DiskPressure,cluster=dev-2,team=db",
        &before,
        Some(&ended),
    ));
    let batch = Value::Array(batch);
    for api in apis {
        post(api, "/api/v2/alerts", &batch).await?;
    }
    // db dev-1 (b is silenced; dev-2 came resolved), default ClusterDown f (PodCrash f is inhibited),
    // pager ×2, web shop, web-dev checkout
    settle(&am_rx, &router_rx, 6).await?;
    let (a, r) = (payloads(&am_rx), payloads(&router_rx));
    assert_eq!(
        serde_json::to_string_pretty(&a)?,
        serde_json::to_string_pretty(&r)?,
        "first notifications differ (left Alertmanager, right the router)"
    );
    assert_eq!(
        listed(apis[0]).await?,
        listed(apis[1]).await?,
        "alert lists differ"
    );
    assert_eq!(
        groups(apis[0]).await?,
        groups(apis[1]).await?,
        "groups differ"
    );

    // some resolve: a db alert, a pager alert (its receiver does not want resolved ones), a web-dev one
    let n = am_rx.all().len();
    let resolved_at = Utc::now().to_rfc3339();
    let resolve = Value::Array(
        [DB_N1, NODE_C, ERRORS_E]
            .iter()
            .map(|l| alert(l, &starts, Some(&resolved_at)))
            .collect(),
    );
    for api in apis {
        post(api, "/api/v2/alerts", &resolve).await?;
    }
    // db dev-1 and web-dev checkout; pager does not want resolved alerts
    settle(&am_rx, &router_rx, n + 2).await?;
    let (a, r) = (payloads(&am_rx), payloads(&router_rx));
    assert_eq!(
        serde_json::to_string_pretty(&a)?,
        serde_json::to_string_pretty(&r)?,
        "notifications after the resolutions differ (left Alertmanager, right the router)"
    );
    assert_eq!(
        listed(apis[0]).await?,
        listed(apis[1]).await?,
        "alert lists differ"
    );
    // what clients decode from the status (amtool reads it before every command)
    let (sa, sr) = (
        get(apis[0], "/api/v2/status").await?,
        get(apis[1], "/api/v2/status").await?,
    );
    assert_eq!(
        serde_json::to_string_pretty(&shape(&sa))?,
        serde_json::to_string_pretty(&shape(&sr))?,
        "the status differs in shape:\n{sa:#}\n{sr:#}"
    );
    eprintln!(
        "{} webhook payloads agree with Alertmanager's, e.g. {}",
        a.len(),
        a.iter()
            .find(|p| p["path"] == "/db")
            .map(|p| p["groupKey"].to_string())
            .unwrap_or_default()
    );
    Ok(())
}

/// Debian's sample `alertmanager.yml` (e-mail and PagerDuty receivers, Go templates, `match` / `match_re`,
/// `source_match` / `target_match`) as it is.
const DEBIAN_SAMPLE: &str = "/etc/prometheus/alertmanager.yml";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debians_sample_alertmanager_yml_loads_as_it_is_and_routes_as_alertmanager_does()
-> Result<()> {
    let text = std::fs::read_to_string(DEBIAN_SAMPLE).with_context(|| {
        format!("reading {DEBIAN_SAMPLE}: install Debian's prometheus-alertmanager (./scripts/test does)")
    })?;
    // the CLI says what the router leaves out
    let out = common::cli(&["check-routing", DEBIAN_SAMPLE], &[])?;
    assert!(
        out.contains("loads: 8 routes, 5 receivers, 1 inhibition rule;")
            && out
                .contains("receiver team-X-pager: email_configs, pagerduty_configs not supported"),
        "{out}"
    );
    let am = Alertmanager::start(&text).await?;
    let router = Router::start(&text).await?;
    let starts = Utc::now().to_rfc3339();
    let batch = Value::Array(
        [
            "alertname=Down,service=foo1,severity=critical,cluster=a",
            "alertname=Down,service=foo1,severity=warning,cluster=a",
            "alertname=Slow,service=baz,cluster=b",
            "alertname=Full,service=files,severity=critical,cluster=c",
            "alertname=Full,service=database,owner=team-Y,cluster=d",
            "alertname=Full,service=database,cluster=d,database=orders",
            "alertname=Other,cluster=e",
        ]
        .iter()
        .map(|l| alert(l, &starts, None))
        .collect(),
    );
    for api in [&am.api, &router.api] {
        post(api, "/api/v2/alerts", &batch).await?;
    }
    // the same receivers for each alert, and the same inhibition (critical mutes the warning of the
    // same alertname, cluster and service)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (a, r) = (listed(&am.api).await?, listed(&router.api).await?);
        if a.len() == 7 && a == r {
            assert!(
                a.iter().any(|x| x["inhibited"] == 1),
                "the sample's inhibition rule muted nothing: {a:#?}"
            );
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "alert lists differ:\n{a:#?}\n{r:#?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(groups(&am.api).await?, groups(&router.api).await?);
    Ok(())
}
