//! State that can't be rebuilt from the streams lives in replicated JetStream KV buckets too: the real
//! `multipilot alerts` process, killed with -9 and started again on a wiped data directory, gets its
//! silences and notification log back from `MULTIPILOT_SILENCES` / `MULTIPILOT_NFLOG`, rebuilds its alerts
//! by replaying FLEET_INCIDENTS, and neither re-sends what it had sent nor forgets to notify what is new.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use async_nats::jetstream;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::Utc;
use multipilot_bus::publish::publish_one;
use multipilot_bus::topology::Topology;
use multipilot_schemas::payload::{Incident, IncidentStatus, Severity};
use multipilot_schemas::{Envelope, stable_id, subject};
use multipilot_testkit::{NatsServer, free_port};
use serde_json::{Value, json};

/// One webhook delivery: (group cluster, status, notification id).
type Got = (String, String, String);

async fn receiver() -> Result<(Arc<Mutex<Vec<Got>>>, String)> {
    let got: Arc<Mutex<Vec<Got>>> = Arc::default();
    async fn take(
        State(s): State<Arc<Mutex<Vec<Got>>>>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> StatusCode {
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let id = headers
            .get("x-multipilot-notification-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        if let Ok(mut g) = s.lock() {
            g.push((
                v["groupLabels"]["cluster"]
                    .as_str()
                    .unwrap_or_default()
                    .into(),
                v["status"].as_str().unwrap_or_default().into(),
                id,
            ));
        }
        StatusCode::OK
    }
    let app = axum::Router::new()
        .fallback(axum::routing::post(take))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((got, url))
}

struct Router {
    nats: NatsServer,
    dir: tempfile::TempDir,
    child: Option<Child>,
    api: String,
    api_port: u16,
    js: jetstream::Context,
    seq: u64,
}

impl Drop for Router {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Router {
    fn data(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    async fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("hub.log"))?;
        let child = Command::new(env!("CARGO_BIN_EXE_multipilot"))
            .arg("alerts")
            .env("MULTIPILOT_NATS__URL", self.nats.url())
            .env("MULTIPILOT_HTTP__LISTEN", "127.0.0.1:0")
            .env("MULTIPILOT_STORAGE__DATA_DIR", self.data())
            .env(
                "MULTIPILOT_ALERTS__ROUTING",
                self.dir.path().join("routing.yaml"),
            )
            .env(
                "MULTIPILOT_ALERTS__LISTEN",
                format!("127.0.0.1:{}", self.api_port),
            )
            .env("MULTIPILOT_ALERTS__TICK", "100ms")
            .env("RUST_LOG", "info,multipilot_alerts=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        let http = reqwest::Client::new();
        for _ in 0..150 {
            if let Ok(r) = http
                .get(format!("{}/api/v2/silences", self.api))
                .send()
                .await
                && r.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the alert router did not start\n{}", self.log())
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("hub.log")).unwrap_or_default()
    }

    async fn incident(
        &mut self,
        cluster: &str,
        status: IncidentStatus,
        revision: u64,
    ) -> Result<()> {
        let now = Utc::now();
        let kind = "node-not-ready";
        let id = stable_id(&[cluster, kind]);
        let inc = Incident {
            id: id.clone(),
            cluster: cluster.into(),
            kind: kind.into(),
            severity: Severity::Warning,
            status,
            summary: format!("{kind} on {cluster}"),
            opened_at: now - chrono::Duration::seconds(5),
            updated_at: now,
            resolved_at: (status == IncidentStatus::Resolved).then_some(now),
            ingest_time: Some(now),
            evidence: Vec::new(),
            labels: BTreeMap::from([("cluster".to_string(), cluster.to_string())]),
            revision,
            acknowledged_by: None,
        };
        self.seq += 1;
        let env = Envelope::new(cluster, "correlator-test", now, self.seq, inc);
        publish_one(
            &self.js,
            subject::incident(cluster, kind),
            stable_id(&[&id, &revision.to_string()]),
            &env,
        )
        .await?;
        Ok(())
    }

    async fn get(&self, path: &str) -> Result<Value> {
        Ok(reqwest::get(format!("{}{path}", self.api))
            .await?
            .json()
            .await?)
    }

    /// The state the API shows for the alert of `cluster`.
    async fn alert_state(&self, cluster: &str) -> Option<String> {
        let v = self.get("/api/v2/alerts").await.ok()?;
        v.as_array()?
            .iter()
            .find(|a| a["labels"]["cluster"] == cluster)
            .and_then(|a| a["status"]["state"].as_str().map(str::to_string))
    }

    async fn pending(&self) -> Option<u64> {
        let v = self.get("/api/v1/receivers").await.ok()?;
        v.as_array()?.iter().find(|x| x["name"] == "default")?["pending"].as_u64()
    }

    fn cli(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(env!("CARGO_BIN_EXE_multipilot"))
            .args(args)
            .env("MULTIPILOT_ALERTS_URL", &self.api)
            .output()?;
        if !out.status.success() {
            bail!(
                "multipilot {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }
}

async fn eventually<T>(what: &str, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(t) = f().await {
            return Ok(t);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Distinct notifications (by id) per (cluster, status).
fn by_group(got: &[Got]) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for (c, s, id) in got {
        out.entry((c.clone(), s.clone()))
            .or_default()
            .insert(id.clone());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_router_keeps_its_silences_and_does_not_notify_twice() -> Result<()> {
    let (got, url) = receiver().await?;
    let nats = NatsServer::start().await?;
    let js = jetstream::new(nats.client().await?);
    Topology::embedded().provision(&js).await?;
    let dir = tempfile::tempdir()?;
    std::fs::write(
        dir.path().join("routing.yaml"),
        format!(
            r#"
route:
  receiver: default
  group_by: [cluster]
  group_wait: 500ms
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: default
    webhook_configs: [{{url: "{url}/default"}}]
"#
        ),
    )?;
    let api_port = free_port()?;
    let mut r = Router {
        nats,
        dir,
        child: None,
        api: format!("http://127.0.0.1:{api_port}"),
        api_port,
        js,
        seq: 0,
    };
    r.spawn().await?;
    use IncidentStatus::*;

    // before: a fires; c fires and then resolves; b is silenced
    let silence: Value = reqwest::Client::new()
        .post(format!("{}/api/v2/silences", r.api))
        .json(&json!({
            "matchers": [{"name": "cluster", "value": "b", "isRegex": false, "isEqual": true}],
            "endsAt": (Utc::now() + chrono::Duration::hours(2)).to_rfc3339(),
            "createdBy": "tester",
            "comment": "maintenance of b",
        }))
        .send()
        .await?
        .json()
        .await?;
    let silence_id = silence["silenceID"]
        .as_str()
        .context("a silence id")?
        .to_string();
    r.incident("a", Open, 1).await?;
    r.incident("b", Open, 1).await?;
    r.incident("c", Open, 1).await?;
    eventually("a and c notified as firing", 30, async || {
        let g = by_group(&got.lock().ok()?.clone());
        (g.contains_key(&("a".into(), "firing".into()))
            && g.contains_key(&("c".into(), "firing".into())))
        .then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", r.log()))?;
    r.incident("c", Resolved, 2).await?;
    eventually("c notified as resolved", 30, async || {
        let g = by_group(&got.lock().ok()?.clone());
        g.contains_key(&("c".into(), "resolved".into()))
            .then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", r.log()))?;
    eventually("b suppressed", 30, async || {
        (r.alert_state("b").await.as_deref() == Some("suppressed")).then_some(())
    })
    .await?;
    let before = by_group(&got.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone());
    assert!(
        !before.keys().any(|(c, _)| c == "b"),
        "the silence held: {before:?}"
    );

    // the machine dies and its disk with it
    r.kill();
    std::fs::remove_dir_all(r.data())?;
    r.spawn().await?;

    // the silence is back, through the API and the CLI, and still holds
    let list = r.get("/api/v2/silences").await?;
    let ids: Vec<&str> = list
        .as_array()
        .context("silences")?
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, vec![silence_id.as_str()], "{list}");
    assert!(r.cli(&["silence", "list"])?.contains(&silence_id));
    // the alerts come back from the replayed incidents
    eventually("the alerts rebuilt from FLEET_INCIDENTS", 30, async || {
        (r.alert_state("a").await.as_deref() == Some("active")
            && r.alert_state("b").await.as_deref() == Some("suppressed")
            && r.alert_state("c").await.as_deref() == Some("resolved"))
        .then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", r.log()))?;

    // after: something new on d is notified; something new on b stays silenced
    r.incident("b", Open, 2).await?;
    r.incident("d", Open, 1).await?;
    eventually("d notified", 30, async || {
        let g = by_group(&got.lock().ok()?.clone());
        g.contains_key(&("d".into(), "firing".into())).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", r.log()))?;
    // d's group waited group_wait after the replay ended; a's and c's groups (notified long before) were
    // judged at the replay's end, so anything they would re-send is already delivered or pending
    eventually("nothing pending", 30, async || {
        (r.pending().await == Some(0)).then_some(())
    })
    .await?;
    let after = by_group(&got.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone());
    for (group, ids) in &after {
        assert_eq!(
            ids.len(),
            1,
            "{group:?} notified more than once: {after:?}\n{}",
            r.log()
        );
    }
    let groups: BTreeSet<(String, String)> = after.keys().cloned().collect();
    let want: BTreeSet<(String, String)> = [
        ("a", "firing"),
        ("c", "firing"),
        ("c", "resolved"),
        ("d", "firing"),
    ]
    .into_iter()
    .map(|(c, s)| (c.to_string(), s.to_string()))
    .collect();
    assert_eq!(groups, want, "{}", r.log());

    // and the buckets hold what the router wrote
    let nflog = r.js.get_key_value("MULTIPILOT_NFLOG").await?;
    let entries = multipilot_bus::kv::load_all(&nflog).await?;
    assert!(
        entries.len() >= 3,
        "a, c and d in the log: {}",
        entries.len()
    );
    let silences = r.js.get_key_value("MULTIPILOT_SILENCES").await?;
    assert_eq!(multipilot_bus::kv::load_all(&silences).await?.len(), 1);
    Ok(())
}
