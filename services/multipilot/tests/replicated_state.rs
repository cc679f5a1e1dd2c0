//! State that can't be rebuilt from the streams lives in replicated JetStream KV buckets too: the real
//! `multipilot alerts` process, killed with -9 and started again on a wiped data directory, gets its
//! silences and notification log back from `MULTIPILOT_SILENCES` / `MULTIPILOT_NFLOG`, rebuilds its alerts
//! by replaying FLEET_INCIDENTS, and neither re-sends what it had sent nor forgets to notify what is new.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context as _, Result};
use chrono::Utc;
use common::{Got, Receiver, Router, eventually};
use multipilot_schemas::payload::{IncidentStatus, Severity};
use serde_json::{Value, json};

impl Router {
    /// Publishes revision `revision` of a warning `node-not-ready` on `cluster`.
    async fn node_not_ready(
        &mut self,
        cluster: &str,
        status: IncidentStatus,
        revision: u64,
    ) -> Result<()> {
        self.incident(
            cluster,
            "node-not-ready",
            Severity::Warning,
            status,
            revision,
            &[],
        )
        .await
    }

    /// The state the API shows for the alert of `cluster` (resolved ones included).
    async fn alert_state(&self, cluster: &str) -> Option<String> {
        let v = self.get("/api/v2/alerts?resolved=true").await.ok()?;
        v.as_array()?
            .iter()
            .find(|a| a["labels"]["cluster"] == cluster)
            .and_then(|a| a["status"]["state"].as_str().map(str::to_string))
    }

    async fn pending(&self) -> Option<u64> {
        let v = self.get("/api/v1/receivers").await.ok()?;
        v.as_array()?.iter().find(|x| x["name"] == "default")?["pending"].as_u64()
    }
}

/// Distinct notifications (by id) per (group cluster, status).
fn by_group(got: &[Got]) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for g in got {
        let field = |v: &Value| v.as_str().unwrap_or_default().to_string();
        out.entry((
            field(&g.body["groupLabels"]["cluster"]),
            field(&g.body["status"]),
        ))
        .or_default()
        .insert(g.id.clone());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_router_keeps_its_silences_and_does_not_notify_twice() -> Result<()> {
    let rx = Receiver::start().await?;
    let url = &rx.url;
    let mut r = Router::start(&format!(
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
    ))
    .await?;
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
    r.node_not_ready("a", Open, 1).await?;
    r.node_not_ready("b", Open, 1).await?;
    r.node_not_ready("c", Open, 1).await?;
    eventually("a and c notified as firing", 30, async || {
        let g = by_group(&rx.all());
        (g.contains_key(&("a".into(), "firing".into()))
            && g.contains_key(&("c".into(), "firing".into())))
        .then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", r.log()))?;
    r.node_not_ready("c", Resolved, 2).await?;
    eventually("c notified as resolved", 30, async || {
        let g = by_group(&rx.all());
        g.contains_key(&("c".into(), "resolved".into()))
            .then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", r.log()))?;
    eventually("b suppressed", 30, async || {
        (r.alert_state("b").await.as_deref() == Some("suppressed")).then_some(())
    })
    .await?;
    let before = by_group(&rx.all());
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
    r.node_not_ready("b", Open, 2).await?;
    r.node_not_ready("d", Open, 1).await?;
    eventually("d notified", 30, async || {
        let g = by_group(&rx.all());
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
    let after = by_group(&rx.all());
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
