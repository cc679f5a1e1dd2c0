//! Recording and alerting rules: the shipped fleet rules checked and unit-tested by the real `promtool`
//! (Debian's `prometheus` package; the test fails and says how to get it when it is missing), and the
//! TSDB's evaluator run against a real store, its API served over HTTP.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use multipilot_tsdb::promql::{Engine, Value};
use multipilot_tsdb::rules::{self, AlertState, Group, Kind};
use multipilot_tsdb::store::{Options, Store};

mod common;
use common::{promtool, sample};

const BASE_MS: i64 = 1_750_000_000_000;
const MIN: i64 = 60_000;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run_promtool(args: &[&str]) -> Result<String> {
    let out = Command::new(promtool()?)
        .args(args)
        .current_dir(repo_root())
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(out.status.success(), "promtool {args:?} failed:\n{text}");
    Ok(text)
}

#[test]
fn shipped_fleet_rules_pass_promtool_check_and_unit_tests() -> Result<()> {
    let check = run_promtool(&["check", "rules", "deploy/rules/fleet.rules.yaml"])?;
    ensure!(check.contains("SUCCESS"), "{check}");
    let test = run_promtool(&["test", "rules", "deploy/rules/fleet.rules.test.yaml"])?;
    ensure!(test.contains("SUCCESS"), "{test}");
    Ok(())
}

#[test]
fn shipped_fleet_rules_load_in_the_evaluator() -> Result<()> {
    let groups = rules::load_files(
        &[repo_root().join("deploy/rules/*.rules.yaml")],
        Duration::from_secs(60),
    )?;
    let names: Vec<&str> = groups
        .iter()
        .flat_map(|g| g.rules.iter().map(|r| r.name()))
        .collect();
    for want in [
        "NodeNotReady",
        "PodCrashLooping",
        "GPUsExhausted",
        "APIServerErrorRatioHigh",
        "ClientCertificateExpiresSoon",
        "cluster:apiserver_request_errors:ratio_rate5m",
    ] {
        ensure!(names.contains(&want), "{want} missing from {names:?}");
    }
    Ok(())
}

fn group(text: &str) -> Result<Group> {
    let mut groups =
        rules::parse_file(Path::new("test.rules.yaml"), text, Duration::from_secs(60))?;
    ensure!(groups.len() == 1);
    Ok(groups.remove(0))
}

fn instant(engine: &Engine, q: &str, t: i64) -> Result<Vec<(BTreeMap<String, String>, f64)>> {
    match engine.instant(q, t)? {
        Value::Vector(v) => Ok(v
            .into_iter()
            .filter_map(|s| Some((s.labels.into_iter().collect(), s.values[0]?)))
            .collect()),
        other => bail!("unexpected {other:?}"),
    }
}

#[test]
fn recording_rule_writes_its_series_into_the_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::open(dir.path(), Options::default())?);
    for k in 0..=10 {
        let t = BASE_MS + k * 15_000;
        store.append(
            "c1",
            &[
                sample("requests_total", &[("code", "200")], (k * 30) as f64, t),
                sample("requests_total", &[("code", "500")], (k * 3) as f64, t),
            ],
        )?;
    }
    let engine = Engine::new(store.clone(), Duration::from_secs(300));
    let mut g = group(
        r#"
groups:
  - name: rec
    rules:
      - record: cluster:requests:rate1m
        expr: sum by (cluster) (rate(requests_total[1m]))
        labels:
          source: rule
"#,
    )?;
    let now = BASE_MS + 150_000;
    let out = g.eval(&engine, now, "http://tsdb");
    ensure!(
        g.rules[0].last_error.is_none(),
        "{:?}",
        g.rules[0].last_error
    );
    ensure!(out.samples.len() == 1, "{:?}", out.samples);
    let got = instant(&engine, "cluster:requests:rate1m", now)?;
    ensure!(got.len() == 1, "{got:?}");
    let (labels, v) = &got[0];
    ensure!(labels.get("cluster").map(String::as_str) == Some("c1"));
    ensure!(labels.get("source").map(String::as_str) == Some("rule"));
    ensure!((v - 2.2).abs() < 1e-9, "rate was {v}");
    Ok(())
}

fn alert_states(g: &Group) -> Vec<AlertState> {
    match &g.rules[0].kind {
        Kind::Alerting { active, .. } => active.values().map(|a| a.state).collect(),
        Kind::Recording { .. } => Vec::new(),
    }
}

#[test]
fn alert_goes_pending_then_firing_then_resolved_with_templates_rendered() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::open(dir.path(), Options::default())?);
    // queue depth 10 until minute 5, 2000 from minute 5 to minute 9, 10 after
    for m in 0..=20 {
        let v = if (5..9).contains(&m) { 2000.0 } else { 10.0 };
        store.append(
            "c1",
            &[sample(
                "queue_depth",
                &[("queue", "jobs")],
                v,
                BASE_MS + m * MIN,
            )],
        )?;
    }
    let engine = Engine::new(store.clone(), Duration::from_secs(300));
    let mut g = group(
        r#"
groups:
  - name: alerts
    rules:
      - alert: QueueBacklog
        expr: queue_depth > 100
        for: 2m
        keep_firing_for: 1m
        labels:
          severity: "{{ $labels.queue }}-page"
        annotations:
          summary: "{{ $labels.queue }} in {{ $labels.cluster }} holds {{ humanize $value }} items"
          exact: "{{ $value }}"
"#,
    )?;
    let at = |m: i64| BASE_MS + m * MIN;

    let out = g.eval(&engine, at(4), "http://tsdb");
    ensure!(alert_states(&g).is_empty() && out.alerts.is_empty());

    let out = g.eval(&engine, at(5), "http://tsdb");
    ensure!(
        alert_states(&g) == [AlertState::Pending],
        "{:?}",
        alert_states(&g)
    );
    ensure!(out.alerts.is_empty(), "pending alerts are not sent");
    g.eval(&engine, at(6), "http://tsdb");
    ensure!(alert_states(&g) == [AlertState::Pending]);

    let out = g.eval(&engine, at(7), "http://tsdb");
    ensure!(
        alert_states(&g) == [AlertState::Firing],
        "{:?}",
        alert_states(&g)
    );
    ensure!(out.alerts.len() == 1);
    let a = &out.alerts[0];
    ensure!(a.labels.get("alertname").map(String::as_str) == Some("QueueBacklog"));
    ensure!(a.labels.get("severity").map(String::as_str) == Some("jobs-page"));
    ensure!(a.labels.get("cluster").map(String::as_str) == Some("c1"));
    ensure!(!a.labels.contains_key("__name__"));
    ensure!(
        a.annotations.get("summary").map(String::as_str) == Some("jobs in c1 holds 2k items"),
        "{:?}",
        a.annotations
    );
    ensure!(a.annotations.get("exact").map(String::as_str) == Some("2000"));
    ensure!(a.starts_at.timestamp_millis() == at(7));
    ensure!(
        a.ends_at.timestamp_millis() > at(7),
        "firing: endsAt in the future"
    );
    ensure!(
        a.generator_url
            .starts_with("http://tsdb/graph?g0.expr=queue_depth")
    );

    // re-sent every evaluation while firing
    let out = g.eval(&engine, at(8), "http://tsdb");
    ensure!(out.alerts.len() == 1 && alert_states(&g) == [AlertState::Firing]);

    // the condition clears at minute 9: keep_firing_for holds it one more minute
    let out = g.eval(&engine, at(9), "http://tsdb");
    ensure!(
        alert_states(&g) == [AlertState::Firing],
        "{:?}",
        alert_states(&g)
    );
    ensure!(out.alerts[0].ends_at.timestamp_millis() > at(9));

    let out = g.eval(&engine, at(10), "http://tsdb");
    ensure!(
        alert_states(&g) == [AlertState::Inactive],
        "{:?}",
        alert_states(&g)
    );
    ensure!(out.alerts.len() == 1, "resolved alerts are sent");
    ensure!(out.alerts[0].ends_at.timestamp_millis() == at(10));
    ensure!(out.alerts[0].starts_at.timestamp_millis() == at(7));
    Ok(())
}

#[test]
fn pending_alert_whose_condition_clears_never_fires() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::open(dir.path(), Options::default())?);
    for m in 0..=10 {
        let v = if m == 3 { 1.0 } else { 0.0 };
        store.append("c1", &[sample("broken", &[], v, BASE_MS + m * MIN)])?;
    }
    let engine = Engine::new(store, Duration::from_secs(300));
    let mut g = group(
        "groups:\n  - name: g\n    rules:\n      - alert: Broken\n        expr: broken == 1\n        for: 5m\n",
    )?;
    g.eval(&engine, BASE_MS + 3 * MIN, "");
    ensure!(alert_states(&g) == [AlertState::Pending]);
    let out = g.eval(&engine, BASE_MS + 4 * MIN, "");
    ensure!(alert_states(&g).is_empty() && out.alerts.is_empty());
    Ok(())
}

fn refused(text: &str) -> String {
    match rules::parse_file(Path::new("bad.rules.yaml"), text, Duration::from_secs(60)) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_rule_files_are_refused_with_file_and_rule_named() {
    let e = refused("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up ==\n");
    assert!(
        e.contains("bad.rules.yaml")
            && e.contains("\"g\"")
            && e.contains("rule 1")
            && e.contains("\"A\""),
        "{e}"
    );
    assert!(e.contains("could not parse expression"), "{e}");

    let e = refused(
        "groups:\n  - name: g\n    rules:\n      - record: ok:x\n        expr: up\n      - record: a\n        alert: B\n        expr: up\n",
    );
    assert!(e.contains("rule 2") && e.contains("only one of"), "{e}");

    let e =
        refused("groups:\n  - name: g\n    rules:\n      - record: 'bad-name'\n        expr: up\n");
    assert!(e.contains("invalid recording rule name"), "{e}");

    let e = refused(
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        labels:\n          'bad-label': x\n",
    );
    assert!(e.contains("invalid label name"), "{e}");

    let e = refused(
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        fore: 5m\n",
    );
    assert!(
        e.contains("bad.rules.yaml") && e.contains("unknown field `fore`"),
        "{e}"
    );

    let e = refused(
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        annotations:\n          s: '{{ if $value }}x{{ end }}'\n",
    );
    assert!(e.contains("\"A\"") && e.contains("template"), "{e}");

    let e = refused("groups: [\n");
    assert!(e.contains("bad.rules.yaml"), "{e}");

    let e = refused("groups:\n  - name: g\n    rules: []\n  - name: g\n    rules: []\n");
    assert!(e.contains("repeated"), "{e}");
}

#[test]
fn missing_rule_file_is_named() {
    let e = rules::load_files(
        &[PathBuf::from("/nonexistent/x.rules.yaml")],
        Duration::from_secs(60),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(e.contains("/nonexistent/x.rules.yaml"), "{e}");
}

/// The shipped rules in the TSDB's own evaluator give what promtool's unit tests expect of them (a
/// deployment short of replicas, GPUs exhausted through the recording rules, with `{{ $value }}` and
/// `humanizePercentage` rendered as Prometheus renders them).
#[test]
fn shipped_fleet_rules_fire_in_the_evaluator_as_promtool_expects() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::open(dir.path(), Options::default())?);
    let ksm = [("job", "kube-state-metrics")];
    for m in 0..=30 {
        let t = BASE_MS + m * MIN;
        let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&str, &str)> {
            ksm.iter().chain(extra).copied().collect()
        };
        let dep = [("namespace", "shop"), ("deployment", "web")];
        let gpu_pod = [
            ("namespace", "ml"),
            ("pod", "train-0"),
            ("container", "t"),
            ("node", "g1"),
            ("resource", "nvidia_com_gpu"),
            ("unit", "integer"),
        ];
        store.append(
            "c1",
            &[
                sample("kube_deployment_spec_replicas", &with(&dep), 3.0, t),
                sample(
                    "kube_deployment_status_replicas_available",
                    &with(&dep),
                    if m < 2 { 3.0 } else { 1.0 },
                    t,
                ),
            ],
        )?;
        store.append(
            "gpu1",
            &[
                sample(
                    "kube_node_status_allocatable",
                    &with(&[
                        ("node", "g1"),
                        ("resource", "nvidia_com_gpu"),
                        ("unit", "integer"),
                    ]),
                    4.0,
                    t,
                ),
                sample(
                    "kube_pod_container_resource_requests",
                    &with(&gpu_pod),
                    4.0,
                    t,
                ),
                sample(
                    "kube_pod_status_phase",
                    &with(&[
                        ("namespace", "ml"),
                        ("pod", "train-0"),
                        ("phase", "Running"),
                    ]),
                    1.0,
                    t,
                ),
            ],
        )?;
    }
    let engine = Engine::new(store, Duration::from_secs(300));
    let mut groups = rules::load_files(
        &[repo_root().join("deploy/rules/fleet.rules.yaml")],
        Duration::from_secs(60),
    )?;
    let mut sent = Vec::new();
    for m in 0..=20 {
        sent.clear();
        for g in &mut groups {
            sent.extend(g.eval(&engine, BASE_MS + m * MIN, "http://tsdb").alerts);
            for r in &g.rules {
                ensure!(r.last_error.is_none(), "{}: {:?}", r.name(), r.last_error);
            }
        }
    }
    let find = |name: &str| {
        sent.iter()
            .find(|a| a.labels.get("alertname").map(String::as_str) == Some(name))
            .cloned()
    };
    let dep = find("DeploymentReplicasMismatch").context("DeploymentReplicasMismatch")?;
    ensure!(
        dep.annotations.get("description").map(String::as_str)
            == Some("3 replicas wanted; fewer have been available for 15 minutes."),
        "{:?}",
        dep.annotations
    );
    ensure!(dep.labels.get("cluster").map(String::as_str) == Some("c1"));
    let gpu = find("GPUsExhausted").context("GPUsExhausted")?;
    ensure!(
        gpu.annotations.get("summary").map(String::as_str)
            == Some("GPUs in gpu1 are 100% requested"),
        "{:?}",
        gpu.annotations
    );
    ensure!(find("NodeNotReady").is_none());
    Ok(())
}

/// Evaluates `g` at each minute of `minutes` (after `BASE_MS`), restoring its `for` state when due (after
/// its second evaluation), as the rules' manager does.
fn eval_minutes(g: &mut Group, engine: &Engine, minutes: std::ops::RangeInclusive<i64>) {
    for m in minutes {
        g.eval(engine, BASE_MS + m * MIN, "http://tsdb");
        g.restore_for_state(engine);
    }
}

#[test]
fn alerts_series_are_queryable_end_with_the_alert_and_restore_its_for_state_after_a_restart()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::open(dir.path(), Options::default())?);
    // the condition holds from minute 0 to 30, then its series ends (a staleness marker, as a scrape
    // writes)
    for m in 0..=31 {
        let v = match m {
            31 => f64::from_bits(multipilot_tsdb::chunk::STALE_NAN_BITS),
            _ => 1.0,
        };
        store.append("c1", &[sample("high", &[], v, BASE_MS + m * MIN)])?;
    }
    let engine = Engine::new(store, Duration::from_secs(300));
    let text = "groups:\n  - name: g\n    rules:\n      - alert: High\n        expr: high\n        for: 15m\n";
    eval_minutes(&mut group(text)?, &engine, 0..=5);
    let got = instant(&engine, "ALERTS", BASE_MS + 5 * MIN)?;
    ensure!(got.len() == 1, "{got:?}");
    let labels: Vec<(&str, &str)> = got[0]
        .0
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    ensure!(
        labels
            == [
                ("__name__", "ALERTS"),
                ("alertname", "High"),
                ("alertstate", "pending"),
                ("cluster", "c1")
            ],
        "{labels:?}"
    );
    let since = instant(&engine, "ALERTS_FOR_STATE", BASE_MS + 5 * MIN)?;
    ensure!(
        since.len() == 1 && since[0].1 == (BASE_MS / 1000) as f64,
        "{since:?}"
    );
    // back at minute 8, restored after the evaluation at 9: active from minute 0 plus the 4 minutes
    // since its state was last written, firing at 19
    let mut g = group(text)?;
    eval_minutes(&mut g, &engine, 8..=18);
    ensure!(alert_states(&g) == [AlertState::Pending]);
    eval_minutes(&mut g, &engine, 19..=19);
    ensure!(alert_states(&g) == [AlertState::Firing]);
    let firing = instant(&engine, "ALERTS{alertstate=\"firing\"}", BASE_MS + 19 * MIN)?;
    ensure!(firing.len() == 1, "{firing:?}");
    // the pending series ended at 19 (a staleness marker, not 5 minutes of lookback); the firing one at 31
    ensure!(
        instant(
            &engine,
            "ALERTS{alertstate=\"pending\"}",
            BASE_MS + 19 * MIN
        )?
        .is_empty()
    );
    eval_minutes(&mut g, &engine, 20..=31);
    ensure!(instant(&engine, "ALERTS", BASE_MS + 31 * MIN)?.is_empty());
    Ok(())
}

#[test]
fn a_rule_taken_out_by_a_reload_ends_its_alerts_series_at_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::open(&dir.path().join("store"), Options::default())?);
    let now = chrono::Utc::now().timestamp_millis();
    let start = now - 3 * MIN;
    for m in 0..=3 {
        store.append("c1", &[sample("high", &[], 1.0, start + m * MIN)])?;
    }
    let engine = Engine::new(store, Duration::from_secs(300));
    let file = dir.path().join("t.rules.yaml");
    let rule = "      - alert: High\n        expr: high\n";
    let keep = "      - record: one\n        expr: vector(1)\n";
    std::fs::write(
        &file,
        format!("groups:\n  - name: g\n    rules:\n{rule}{keep}"),
    )?;
    let manager = rules::Manager::new(
        vec![file.clone()],
        Duration::from_secs(60),
        engine.clone(),
        None,
        "http://tsdb".into(),
    )?;
    for m in 0..=2 {
        manager.eval_due(start + m * MIN);
    }
    ensure!(instant(&engine, "ALERTS", now)?.len() == 1);
    // the alerting rule taken out: its ALERTS ends at the next evaluation, not 5 minutes of lookback
    // later; the recording rule, moved to another group, carries on
    std::fs::write(&file, format!("groups:\n  - name: h\n    rules:\n{keep}"))?;
    manager.reload()?;
    let after = chrono::Utc::now().timestamp_millis();
    manager.eval_due(after);
    ensure!(instant(&engine, "ALERTS", after)?.is_empty());
    ensure!(instant(&engine, "one", after)?.len() == 1);
    Ok(())
}
