//! Progressive delivery across the fleet (issue 30): releases judged by the fleet's own metrics, and held
//! by sync windows.
//!
//! On every simulated cluster a first release puts an annotated Service and a Deployment `web` (v1), whose
//! request counters the agent scrapes into the TSDB. Every later version is a new revision of that release
//! `web`, as an operator ships one. Then:
//! 1. a **bad version** (`…:2.0.0-errors30`: the simulator fails 30 % of its requests, its rollout stays
//!    healthy) goes out in batches of 2 with the ready-made `error-ratio` analysis: the first batch's
//!    analysis must fail against the baseline of the clusters not changed yet, nothing may reach the second
//!    batch, and every cluster changed must be back at v1 (read from the simulator's API servers); the
//!    measured values come from the history, with the time from the batch's apply to the failing verdict
//!    and to the rollback done;
//! 2. a **good version** passes every batch's analysis (rounds and time per batch);
//! 3. a **deny window** is configured (its cron start is the current minute, computed at that moment in
//!    UTC, with a duration that closes it some tens of seconds later) and the release role restarted with
//!    it: a release applied during it is `held`, names the window in its history, `release status` and
//!    `gitops status`, has nothing applied while the window is open and is applied once it closes (the
//!    role retries held releases every 5 s); a release under a second deny window that allows manual syncs
//!    passes it with `release apply --override-windows`, recorded as an `override` entry.
//!
//! Everything goes through the `multipilot` CLI as an operator would type it. Throughout, the harness
//! asks the TSDB for every cluster's error ratio of `web` and plots it, and counts the `release-drift`
//! incidents the releases' own batches and rollbacks open (a goal: none).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use chrono::{DateTime, Datelike as _, SubsecRound as _, Timelike as _, Utc};
use multipilot_schemas::payload::IncidentStatus;
use serde_json::Value;

use super::{Opts, report_processes};
use crate::observe::Observer;
use crate::record::Recorder;
use crate::report::Report;
use crate::system::{Spec, System};

/// The image of each version.
const V1: &str = "registry.example.com/web:1.0.0";
const BAD: &str = "registry.example.com/web:2.0.0-errors30";
const GOOD: &str = "registry.example.com/web:2.0.1";
const API: &str = "registry.example.com/api:1.0.0";
const FROZEN: &str = "registry.example.com/web:3.0.0";

/// What the window phase's windows say, so the checks can look for it.
const FREEZE: &str = "delivery drill freeze";
const HOTFIX_WINDOW: &str = "delivery drill freeze, hotfixes by manual sync";

/// The timings of one run.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Timings {
    /// Seconds between the agent's scrapes.
    scrape_s: u32,
    /// The analysis' interval (s) and measurements per cluster.
    interval_s: u64,
    count: u32,
    /// Soak per batch (s).
    soak_s: u64,
    /// How long the deny window stays open after the release role is given it (s).
    hold_s: u64,
}

/// The release role's settings: short soaks and timeouts for a drill.
fn role_config(windows: &str) -> String {
    format!(
        "release:\n  default_soak: 1s\n  health_timeout: 60s\n  command_timeout: 10s\n{windows}"
    )
}

/// The Deployment `app` at `image` (4 replicas, as in the agent's end-to-end test).
fn deployment(app: &str, image: &str) -> String {
    format!(
        r#"  apiVersion: apps/v1
  kind: Deployment
  metadata: {{name: {app}, namespace: default, labels: {{app: {app}}}}}
  spec:
    replicas: 4
    selector: {{matchLabels: {{app: {app}}}}}
    template:
      metadata: {{labels: {{app: {app}}}}}
      spec:
        containers:
          - name: {app}
            image: "{image}"
"#
    )
}

/// A release spec of the Deployment `app` at `image` on `clusters`.
#[allow(clippy::too_many_arguments)]
fn release(
    name: &str,
    app: &str,
    clusters: &[String],
    batch_size: usize,
    soak_s: u64,
    analysis: Option<(u64, u32)>,
    with_service: bool,
    image: &str,
) -> String {
    let mut s = format!(
        "name: {name}\ntargets: {{clusters: {}}}\nbatches: {{size: {batch_size}}}\nsoak: {soak_s}s\nhealth_timeout: 60s\n",
        serde_json::to_string(clusters).unwrap_or_default()
    );
    if let Some((interval, count)) = analysis {
        // the ready-made check with its own conditions: above 5 %, or above 1 % and twice the baseline
        s.push_str(&format!(
            "analysis:\n  interval: {interval}s\n  count: {count}\n  metrics:\n    - name: errors\n      template: error-ratio\n"
        ));
    }
    s.push_str("manifests: |\n");
    if with_service {
        // scraped by the agent through the API server's service proxy, as Prometheus' annotations say
        s.push_str(
            r#"  apiVersion: v1
  kind: Service
  metadata:
    name: web
    namespace: default
    annotations: {prometheus.io/scrape: "true", prometheus.io/port: "80"}
  spec:
    selector: {app: web}
    ports: [{port: 80, targetPort: 8080}]
  ---
"#,
        );
    }
    s.push_str(&deployment(app, image));
    s
}

/// The error ratio of `web` per cluster, over `window_s`.
fn ratio_query(window_s: u64) -> String {
    let sel = r#"http_requests_total{namespace="default",deployment="web""#;
    format!(
        "sum by (cluster) (rate({sel},code=~\"5..\"}}[{window_s}s])) / sum by (cluster) (rate({sel}}}[{window_s}s]))"
    )
}

/// A release's state, batches and history, as `multipilot release status|history -o json` print them.
#[derive(Debug, Default)]
struct Seen {
    release: Value,
    history: Vec<Value>,
}

impl Seen {
    fn state(&self) -> &str {
        self.release["state"].as_str().unwrap_or("?")
    }

    fn batches(&self) -> Vec<&Value> {
        self.release["batches"]
            .as_array()
            .map(|a| a.iter().collect())
            .unwrap_or_default()
    }

    fn entries(&self, what: &str) -> Vec<&Value> {
        self.history.iter().filter(|e| e["what"] == what).collect()
    }

    /// One line per history entry, for a failed check's detail.
    fn trail(&self) -> String {
        self.history
            .iter()
            .map(|e| {
                format!(
                    "{} {} {}",
                    e["what"].as_str().unwrap_or("?"),
                    if e["ok"] == true { "ok" } else { "FAIL" },
                    e["summary"].as_str().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

/// When an entry (or a batch's field) happened.
fn at(v: &Value) -> Option<DateTime<Utc>> {
    v.as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
}

fn secs(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Option<f64> {
    Some((to? - from?).num_milliseconds() as f64 / 1000.0)
}

fn fmt_s(s: Option<f64>) -> String {
    s.map_or("never".into(), |s| format!("{s:.1} s"))
}

/// A release's status and the history of one of its revisions.
async fn seen(sys: &System, name: &str, revision: u64) -> Result<Seen> {
    let release =
        serde_json::from_str(&sys.cli(&["release", "status", name, "-o", "json"]).await?)?;
    let history: Vec<Value> =
        serde_json::from_str(&sys.cli(&["release", "history", name, "-o", "json"]).await?)?;
    let history = history
        .into_iter()
        .filter(|e| e["revision"].as_u64() == Some(revision))
        .collect();
    Ok(Seen { release, history })
}

/// Polls a release's revision until `done` says so or `secs` pass; returns what was seen last.
async fn wait_release(
    sys: &System,
    name: &str,
    revision: u64,
    secs: u64,
    done: impl Fn(&str) -> bool,
) -> Result<Seen> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let s = seen(sys, name, revision).await;
        match s {
            Ok(s) if done(s.state()) || Instant::now() > deadline => return Ok(s),
            Err(e) if Instant::now() > deadline => return Err(e),
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// A state the release stays in by itself.
fn settled(state: &str) -> bool {
    !matches!(state, "planned" | "applying" | "rolling-back" | "failed")
}

/// Writes a spec file (`file`.yaml) and applies it with the CLI (no --wait: the harness follows the
/// release itself); returns the revision it became.
async fn apply(sys: &System, file: &str, spec: &str, extra: &[&str]) -> Result<u64> {
    let dir = sys.dir.join("specs");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{file}.yaml"));
    std::fs::write(&path, spec)?;
    let path = path.to_string_lossy().into_owned();
    let mut args = vec!["release", "apply", "-f", path.as_str(), "-o", "json"];
    args.extend_from_slice(extra);
    let out: Value = serde_json::from_str(&sys.cli(&args).await?)?;
    out["revision"]
        .as_u64()
        .with_context(|| format!("no revision in the apply's answer: {out}"))
}

/// The image of the Deployment `app` on every cluster, read from the simulator's API servers.
async fn images(sys: &System, app: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for c in &sys.clusters {
        let path = format!("/apis/apps/v1/namespaces/default/deployments/{app}");
        let image = match sys.cluster_get(c, &path).await {
            Ok(d) => d["spec"]["template"]["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or("?")
                .to_string(),
            Err(e) => format!("unreadable: {e}"),
        };
        out.insert(c.clone(), image);
    }
    out
}

/// Whether every cluster runs `image`, and the detail.
fn all_at(images: &BTreeMap<String, String>, image: &str) -> (bool, String) {
    let off: Vec<String> = images
        .iter()
        .filter(|(_, i)| *i != image)
        .map(|(c, i)| format!("{c}: {i}"))
        .collect();
    if off.is_empty() {
        (true, format!("{} clusters at {image}", images.len()))
    } else {
        (false, format!("not at {image}: {}", off.join(", ")))
    }
}

/// Asks the TSDB for every cluster's error ratio of `web` every 2 s, as `ratio/<cluster>`.
fn sample_ratios(tsdb: String, rec: Recorder, window_s: u64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        let q = ratio_query(window_s);
        loop {
            if let Ok(r) = http
                .get(format!("{tsdb}/api/v1/query"))
                .query(&[("query", q.as_str())])
                .timeout(Duration::from_secs(5))
                .send()
                .await
                && let Ok(v) = r.json::<Value>().await
            {
                for s in v["data"]["result"].as_array().into_iter().flatten() {
                    let cluster = s["metric"]["cluster"].as_str().unwrap_or("?");
                    if let Some(x) = s["value"][1].as_str().and_then(|x| x.parse::<f64>().ok())
                        && x.is_finite()
                    {
                        rec.point(&format!("ratio/{cluster}"), "ratio", x);
                    }
                }
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    })
}

/// The highest error ratio the sampler saw for `cluster` between two recorder times.
fn peak_ratio(rec: &Recorder, cluster: &str, from: f64, to: f64) -> Option<f64> {
    rec.series(&format!("ratio/{cluster}")).and_then(|s| {
        s.points
            .iter()
            .filter(|(t, _)| *t >= from && *t <= to)
            .map(|p| p.1)
            .reduce(f64::max)
    })
}

/// Runs it.
pub async fn run(o: &Opts, dir: &Path) -> Result<(Report, Recorder)> {
    let t = o.pick(
        Timings {
            scrape_s: 1,
            interval_s: 4,
            count: 2,
            soak_s: 2,
            hold_s: 25,
        },
        Timings {
            scrape_s: 2,
            interval_s: 10,
            count: 3,
            soak_s: 10,
            hold_s: 90,
        },
    );
    let spec = Spec {
        clusters: o.clusters.unwrap_or(6),
        objects: o.objects.unwrap_or(o.pick(150, 400)),
        // no churn and no extra events: a soak fails on any new incident, and this drill is about the metrics
        churn: o.churn.unwrap_or(0.0),
        events_per_second: o.events_per_second.unwrap_or(0.0),
        scrape_interval_s: t.scrape_s,
        probe_interval_s: None,
        agents: o.agents.unwrap_or(o.pick(1, 2)),
        correlators: 1,
        tsdbs: 1,
        accounting: false,
        rate: None,
        nats_nodes: 1,
        alerts_routing: None,
        outbox_max_bytes: None,
        release: Some(role_config("")),
    };
    let mut r = Report::new(
        "delivery",
        o.short,
        serde_json::json!({"spec": spec, "timings": t, "images": {"v1": V1, "bad": BAD, "good": GOOD,
                           "api": API, "frozen": FROZEN}}),
    );
    let rec = Recorder::new();
    let mut sys = System::start(spec.clone(), dir, o.bins()?).await?;
    let obs = Observer::start(&sys, &rec, Duration::from_secs(1), false).await?;
    rec.mark("system up");
    let clusters = sys.clusters.clone();
    let tsdb = sys.tsdb_api().context("no TSDB")?;
    let window_s = (t.interval_s).max(u64::from(t.scrape_s) * 4);
    let sampler = sample_ratios(tsdb.clone(), rec.clone(), window_s);
    let busy = (t.interval_s * u64::from(t.count) + t.soak_s + 90) * 4;

    // the fleet is plannable once every cluster is in the registry and its agent answers a dry-run
    let probe = format!(
        "name: probe\ntargets: {{clusters: {}}}\nmanifests: |\n  apiVersion: v1\n  kind: ConfigMap\n  metadata: {{name: probe, namespace: default}}\n",
        serde_json::to_string(&clusters)?
    );
    let probe_path = sys.dir.join("probe.yaml");
    std::fs::write(&probe_path, probe)?;
    let probe_path = probe_path.to_string_lossy().into_owned();
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Err(e) = sys
        .cli(&["release", "plan", "-f", &probe_path, "-o", "json"])
        .await
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the fleet never became plannable: {e}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    rec.mark("fleet plannable");
    let since = Instant::now();

    // 0. web v1 everywhere, behind an annotated Service; then its request rate in the TSDB. Every version
    // after it is a new revision of the same release `web` (two releases owning one object would each
    // see the other's change as drift)
    let web = |image: &str, batch: usize, soak_s: u64, analysis: Option<(u64, u32)>| {
        release(
            "web", "web", &clusters, batch, soak_s, analysis, true, image,
        )
    };
    let start = Instant::now();
    let rev = apply(&sys, "web-v1", &web(V1, clusters.len(), 1, None), &[]).await?;
    let s = wait_release(&sys, "web", rev, busy, settled).await?;
    let seeded = start.elapsed().as_secs_f64();
    rec.mark("web v1 everywhere");
    r.invariant(
        "web v1 and its annotated Service are released on every cluster",
        s.state() == "succeeded",
        format!("{} in {seeded:.1} s; {}", s.state(), s.trail()),
    );
    let q = format!(
        "sum by (cluster) (rate(http_requests_total{{namespace=\"default\",deployment=\"web\"}}[{window_s}s]))"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let rates = loop {
        let got = sys.query(&tsdb, &q).await.unwrap_or_default();
        if got.len() >= clusters.len() || Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let rate_detail: Vec<String> = rates
        .iter()
        .map(|s| {
            format!(
                "{} {:.1}/s",
                s["metric"]["cluster"].as_str().unwrap_or("?"),
                s["value"][1]
                    .as_str()
                    .and_then(|x| x.parse::<f64>().ok())
                    .unwrap_or(f64::NAN)
            )
        })
        .collect();
    r.invariant(
        "web's request rate reaches the TSDB from every cluster",
        rates.len() == clusters.len(),
        format!(
            "{} of {} clusters, {:.1} s after the release (the first rates answered, over {window_s} s): {}",
            rates.len(),
            clusters.len(),
            start.elapsed().as_secs_f64() - seeded,
            rate_detail.join(", ")
        ),
    );
    // a full analysis interval of samples before the first batch is judged against a baseline
    tokio::time::sleep(Duration::from_secs(window_s)).await;

    // 1. the bad version
    rec.mark("bad version");
    let bad_from = rec.now();
    let analysis = Some((t.interval_s, t.count));
    let rev = apply(&sys, "web-bad", &web(BAD, 2, t.soak_s, analysis), &[]).await?;
    let s = wait_release(&sys, "web", rev, busy, |st| {
        matches!(
            st,
            "rolled-back" | "rollback-failed" | "succeeded" | "held" | "waiting-approval"
        )
    })
    .await?;
    let bad_to = rec.now();
    rec.mark("bad version over");
    let batches = s.batches();
    let first: Vec<String> = batches
        .first()
        .and_then(|b| b["clusters"].as_array())
        .map(|a| {
            a.iter()
                .filter_map(|c| c.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let error = batches
        .first()
        .and_then(|b| b["error"].as_str())
        .unwrap_or("")
        .to_string();
    r.invariant(
        "the bad version's first batch fails its analysis",
        batches.first().is_some_and(|b| b["state"] == "failed")
            && error.starts_with("analysis failed"),
        format!(
            "batch 1 ({}) {}: {error}",
            first.join(", "),
            batches
                .first()
                .map_or("missing".into(), |b| b["state"].to_string())
        ),
    );
    let later_steps = s
        .entries("step")
        .into_iter()
        .filter(|e| e["batch"].as_u64().unwrap_or(0) > 1)
        .count();
    let pending_after = batches.iter().skip(1).all(|b| b["state"] == "pending");
    let changed: Vec<String> = s.release["changed"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    r.invariant(
        "nothing of the bad version reaches the second batch",
        pending_after && later_steps == 0 && changed.iter().all(|c| first.contains(c)),
        format!(
            "batches after the first: {}; apply steps beyond batch 1: {later_steps}; clusters changed: {}",
            batches
                .iter()
                .skip(1)
                .map(|b| format!("{} {}", b["index"], b["state"].as_str().unwrap_or("?")))
                .collect::<Vec<_>>()
                .join(", "),
            changed.join(", ")
        ),
    );
    r.invariant(
        "every cluster the bad version changed is rolled back",
        s.state() == "rolled-back" && s.entries("rolled-back").iter().any(|e| e["ok"] == true),
        format!("state {}: {}", s.state(), s.trail()),
    );
    let (ok, detail) = all_at(&images(&sys, "web").await, V1);
    r.invariant(
        "web is back at v1 on every cluster (read from the simulator)",
        ok,
        detail,
    );
    // the measured values, from the history
    let rounds = s.entries("analysis");
    let failing = rounds.iter().find(|e| e["ok"] == false).copied();
    let measured: Vec<String> = rounds
        .iter()
        .flat_map(|e| {
            e["detail"]["measurements"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|m| {
            format!(
                "{} {:.4} vs baseline {} → {}",
                m["cluster"].as_str().unwrap_or("?"),
                m["value"].as_f64().unwrap_or(f64::NAN),
                m["baseline"]
                    .as_f64()
                    .map_or("none".into(), |b| format!("{b:.4}")),
                m["verdict"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let failed_values: Vec<Value> = failing.map_or(Vec::new(), |e| {
        e["detail"]["measurements"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m["verdict"] == "failed")
            .collect()
    });
    r.invariant(
        "the history holds the failing measurements: the error ratio well above its baseline",
        !failed_values.is_empty()
            && failed_values.iter().all(|m| {
                m["value"].as_f64().is_some_and(|v| v > 0.05 && v <= 0.31)
                    && m["baseline"].as_f64().is_some_and(|b| b < 0.01)
                    && m["cluster"]
                        .as_str()
                        .is_some_and(|c| first.iter().any(|f| f == c))
            }),
        if measured.is_empty() {
            "no analysis entry".to_string()
        } else {
            measured.join("; ")
        },
    );
    r.figure(
        "bad version: analysis rounds over batch 1",
        format!("{}; measured: {}", rounds.len(), measured.join("; ")),
    );
    // the timeline of batch 1, from the history (the hub's clock)
    let started = batches.first().and_then(|b| at(&b["started_at"]));
    let applied = s
        .entries("step")
        .into_iter()
        .filter(|e| e["batch"].as_u64() == Some(1) && e["ok"] == true)
        .filter_map(|e| at(&e["at"]))
        .max();
    let verdict = failing.and_then(|e| at(&e["at"]));
    let rolled_back = s
        .entries("rolled-back")
        .into_iter()
        .find_map(|e| at(&e["at"]));
    r.figure(
        "bad version, batch 1: applied → failing verdict",
        format!(
            "{} (batch started → applied on its clusters {}; analysis every {} s after the rollouts complete)",
            fmt_s(secs(applied, verdict)),
            fmt_s(secs(started, applied)),
            t.interval_s
        ),
    );
    r.figure(
        "bad version, batch 1: applied → rollback done",
        format!(
            "{} (failing verdict → rolled back {})",
            fmt_s(secs(applied, rolled_back)),
            fmt_s(secs(verdict, rolled_back))
        ),
    );
    // the release role's default initial delay: two scrapes, or enough that the first rate interval
    // (max(interval + scrape, 4 × scrape)) starts after the batch was healthy
    let scrape = u64::from(t.scrape_s);
    let rate = (t.interval_s + scrape).max(4 * scrape);
    let delay = (2 * scrape).max(rate.saturating_sub(t.interval_s));
    r.goal(
        "the failing verdict comes with the first measurement (within the initial delay + an interval + 10 s of the apply)",
        secs(applied, verdict).is_some_and(|d| d <= (delay + t.interval_s) as f64 + 10.0),
        format!(
            "applied → verdict {} (initial delay {delay} s, interval {} s)",
            fmt_s(secs(applied, verdict)),
            t.interval_s
        ),
    );
    // the TSDB's own view: only the first batch's clusters ever served the bad version's errors
    let peaks: Vec<(String, Option<f64>)> = clusters
        .iter()
        .map(|c| (c.clone(), peak_ratio(&rec, c, bad_from, bad_to)))
        .collect();
    let others_clean = peaks
        .iter()
        .filter(|(c, _)| !first.contains(c))
        .all(|(_, p)| p.is_some_and(|p| p < 0.05));
    r.invariant(
        "in the TSDB, only the first batch's clusters ever served the bad version's errors",
        others_clean,
        peaks
            .iter()
            .map(|(c, p)| {
                format!(
                    "{c}{} peak {}",
                    if first.contains(c) { " (batch 1)" } else { "" },
                    p.map_or("no sample".into(), |p| format!("{:.1} %", p * 100.0))
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    );

    // 2. the good version
    rec.mark("good version");
    let rev = apply(&sys, "web-good", &web(GOOD, 2, t.soak_s, analysis), &[]).await?;
    let s = wait_release(&sys, "web", rev, busy * 3, settled).await?;
    rec.mark("good version over");
    let batches = s.batches();
    let rounds = s.entries("analysis");
    let per_batch: Vec<String> = batches
        .iter()
        .map(|b| {
            let i = b["index"].as_u64().unwrap_or(0);
            let n = rounds
                .iter()
                .filter(|e| e["batch"].as_u64() == Some(i))
                .count();
            format!(
                "batch {i} ({}): {n} round(s), {}",
                b["clusters"]
                    .as_array()
                    .map(|a| a
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(", "))
                    .unwrap_or_default(),
                fmt_s(secs(at(&b["started_at"]), at(&b["finished_at"])))
            )
        })
        .collect();
    // each batch measured `count` times (a round without a number yet, asked again, does not count)
    let rounds_ok = batches.iter().all(|b| {
        let i = b["index"].as_u64();
        rounds
            .iter()
            .filter(|e| e["batch"].as_u64() == i)
            .filter_map(|e| e["detail"]["round"].as_u64())
            .max()
            == Some(u64::from(t.count))
    });
    r.invariant(
        "the good version passes every batch's analysis",
        s.state() == "succeeded"
            && batches.iter().all(|b| b["state"] == "done")
            && !rounds.is_empty()
            && rounds.iter().all(|e| e["ok"] == true)
            && rounds_ok,
        if s.state() == "succeeded" {
            format!("{}: {}", s.state(), per_batch.join("; "))
        } else {
            format!("{}: {}", s.state(), s.trail())
        },
    );
    r.figure(
        "good version: rounds and time per batch (start → done)",
        per_batch.join("; "),
    );
    let (ok, detail) = all_at(&images(&sys, "web").await, GOOD);
    r.invariant(
        "web runs the good version on every cluster (read from the simulator)",
        ok,
        detail,
    );

    // 3. sync windows from the current minute (UTC) until `hold_s` from now: a deny window on `web`, and
    // one on `api` that lets an operator's manual sync pass
    rec.mark("deny windows");
    let now = Utc::now();
    let opened = now.trunc_subsecs(0).with_second(0).unwrap_or(now);
    let duration_s = (now + chrono::Duration::seconds(t.hold_s as i64) - opened).num_seconds();
    let closes = opened + chrono::Duration::seconds(duration_s);
    let schedule = format!(
        "{} {} {} {} *",
        opened.minute(),
        opened.hour(),
        opened.day(),
        opened.month()
    );
    let window = |release: &str, description: &str, manual: bool| {
        format!(
            "    - {{kind: deny, schedule: \"{schedule}\", duration: {duration_s}s, time_zone: UTC, releases: [{release}], manual_sync: {manual}, description: \"{description}\"}}\n"
        )
    };
    let windows = format!(
        "  windows:\n{}{}",
        window("web", FREEZE, false),
        window("api", HOTFIX_WINDOW, true)
    );
    sys.reconfigure_release(&role_config(&windows)).await?;
    rec.mark("release role restarted with the windows");
    r.figure(
        "deny windows",
        format!(
            "\"{schedule}\" UTC for {duration_s} s: open {} – {} (the release role restarted with them {:.1} s before they close)",
            opened.format("%H:%M:%S"),
            closes.format("%H:%M:%S"),
            (closes - Utc::now()).num_milliseconds() as f64 / 1000.0
        ),
    );
    // held
    let applied_at = Utc::now();
    let rev = apply(
        &sys,
        "web-frozen",
        &web(FROZEN, clusters.len(), 1, None),
        &[],
    )
    .await?;
    let s = wait_release(&sys, "web", rev, 60, settled).await?;
    let waiting = s
        .entries("waiting")
        .first()
        .map(|e| e["detail"]["held"].as_str().unwrap_or("").to_string())
        .unwrap_or_default();
    r.invariant(
        "a release applied inside a deny window is held, the window named",
        s.state() == "held" && waiting.contains("deny window 0") && waiting.contains(FREEZE),
        format!(
            "{}: {}",
            s.state(),
            if waiting.is_empty() {
                s.trail()
            } else {
                waiting.split("; ").next().unwrap_or("").to_string()
            }
        ),
    );
    let status = sys
        .cli(&["release", "status", "web"])
        .await
        .unwrap_or_else(|e| e.to_string());
    let gitops = sys
        .cli(&["gitops", "status", "-o", "json"])
        .await
        .and_then(|t| Ok(serde_json::from_str::<Value>(&t)?));
    let (gitops_ok, gitops_detail) = match &gitops {
        Ok(g) => {
            let open = g["windows"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|w| w["active"] == true && w["description"] == FREEZE);
            let messages: Vec<String> = g["releases"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|x| x["release"] == "web")
                .flat_map(|x| x["clusters"].as_array().cloned().unwrap_or_default())
                .map(|c| c["message"].as_str().unwrap_or("").to_string())
                .collect();
            let named =
                !messages.is_empty() && messages.iter().all(|m| m.contains("deny window 0"));
            (
                open && named,
                format!(
                    "the window listed as open: {open}; web on {} clusters, the first: {}",
                    messages.len(),
                    messages
                        .first()
                        .and_then(|m| m.split("; ").next())
                        .unwrap_or("not listed")
                ),
            )
        }
        Err(e) => (false, e.to_string()),
    };
    r.invariant(
        "`release status` and `gitops status` show the hold and the window",
        status.contains("held") && gitops_ok,
        format!(
            "release status: {}; gitops status: {gitops_detail}",
            status.lines().next().unwrap_or("")
        ),
    );
    // an operator's override passes the window that allows a manual sync
    rec.mark("api with --override-windows");
    let api_at = Utc::now();
    let api_spec = release("api", "api", &clusters, clusters.len(), 1, None, false, API);
    let api = match apply(&sys, "api", &api_spec, &["--override-windows"]).await {
        Ok(rev) => wait_release(&sys, "api", rev, 90, settled).await?,
        Err(e) => Seen {
            history: vec![serde_json::json!({"what": "apply", "summary": e.to_string()})],
            ..Seen::default()
        },
    };
    let overrides = api.entries("override");
    let api_steps: Vec<DateTime<Utc>> = api
        .entries("step")
        .into_iter()
        .filter_map(|e| at(&e["at"]))
        .collect();
    let last_step = api_steps.iter().max().copied();
    r.invariant(
        "`release apply --override-windows` passes a deny window with manual_sync, recorded as an override",
        api.state() == "succeeded"
            && !overrides.is_empty()
            && api.entries("waiting").is_empty()
            && last_step.is_some_and(|s| s < closes),
        if api.state() == "succeeded" {
            format!(
                "applied on {} clusters {} after the apply, {} before the window closed; override: {}",
                api_steps.len(),
                fmt_s(secs(Some(api_at), last_step)),
                fmt_s(secs(last_step, Some(closes))),
                overrides
                    .first()
                    .and_then(|e| e["summary"].as_str())
                    .and_then(|s| s.split("; ").next())
                    .unwrap_or("none"),
            )
        } else {
            format!("{}: {}", api.state(), api.trail())
        },
    );
    // the held release waits for the window to close, then goes on by itself
    if let Ok(d) = (closes - chrono::Duration::seconds(2) - Utc::now()).to_std() {
        tokio::time::sleep(d).await;
    }
    let during = seen(&sys, "web", rev).await?;
    let imgs = images(&sys, "web").await;
    let frozen_on = imgs.values().filter(|i| *i == FROZEN).count();
    r.invariant(
        "nothing of the held release is applied while the window is open",
        during.state() == "held" && during.entries("step").is_empty() && frozen_on == 0,
        format!(
            "2 s before it closes: {}, {} apply steps, at {FROZEN} on {frozen_on} cluster(s)",
            during.state(),
            during.entries("step").len(),
        ),
    );
    rec.mark("window closes");
    let s = wait_release(&sys, "web", rev, 60 + busy, |st| {
        matches!(
            st,
            "succeeded" | "rolled-back" | "rollback-failed" | "waiting-approval"
        )
    })
    .await?;
    rec.mark("held release done");
    let resumed = s
        .history
        .iter()
        .filter_map(|e| at(&e["at"]))
        .find(|a| *a >= closes);
    let first_step = s
        .entries("step")
        .into_iter()
        .filter_map(|e| at(&e["at"]))
        .min();
    r.invariant(
        "the held release is applied once the window closes, within 5 s + one retry",
        s.state() == "succeeded"
            && first_step.is_some_and(|f| f >= closes)
            && secs(Some(closes), resumed).is_some_and(|d| d <= 10.0),
        format!(
            "{}; window closed → resumed {}, → first apply step {}",
            if s.state() == "succeeded" {
                s.state().to_string()
            } else {
                format!("{}: {}", s.state(), s.trail())
            },
            fmt_s(secs(Some(closes), resumed)),
            fmt_s(secs(Some(closes), first_step))
        ),
    );
    r.figure(
        "held release: hold time, delay after the window closed",
        format!(
            "held {} (apply → first apply step); resumed {} and applied {} after the window closed; done {} after",
            fmt_s(secs(Some(applied_at), first_step)),
            fmt_s(secs(Some(closes), resumed)),
            fmt_s(secs(Some(closes), first_step)),
            fmt_s(secs(
                Some(closes),
                s.entries("done").into_iter().find_map(|e| at(&e["at"]))
            ))
        ),
    );
    let (ok, detail) = all_at(&images(&sys, "web").await, FROZEN);
    r.invariant(
        "web runs the held release's version on every cluster afterwards (read from the simulator)",
        ok,
        detail,
    );

    // a release's own batches and rollbacks are not drift: no release-drift incident should open
    let drift: BTreeMap<String, String> = obs.with(|seen| {
        let mut out: BTreeMap<String, (f64, Option<f64>, String)> = BTreeMap::new();
        for i in seen
            .incidents
            .iter()
            .filter(|i| i.at >= since && i.incident.kind == "release-drift")
        {
            let t = i.at.duration_since(rec.start()).as_secs_f64();
            let e = out.entry(i.incident.id.clone()).or_insert_with(|| {
                (
                    t,
                    None,
                    format!(
                        "{}: {}",
                        i.incident.cluster,
                        i.incident.summary.chars().take(300).collect::<String>()
                    ),
                )
            });
            if i.incident.status == IncidentStatus::Resolved && e.1.is_none() {
                e.1 = Some(t);
            }
        }
        out.into_iter()
            .map(|(id, (opened, resolved, what))| {
                let resolved =
                    resolved.map_or("never resolved".into(), |r| format!("resolved at {r:.0} s"));
                (id, format!("opened at {opened:.0} s, {resolved}: {what}"))
            })
            .collect()
    });
    r.goal(
        "no release-drift incident from the releases' own applies and rollbacks",
        drift.is_empty(),
        if drift.is_empty() {
            "none opened".to_string()
        } else {
            format!(
                "{} opened: {}",
                drift.len(),
                drift.values().cloned().collect::<Vec<_>>().join("; ")
            )
        },
    );

    sampler.abort();
    let _ = sampler.await;
    obs.stop().await;
    r.plot(
        "error-ratio",
        "web's error ratio per cluster (TSDB)",
        "ratio",
        clusters
            .iter()
            .map(|c| (c.clone(), format!("ratio/{c}")))
            .collect(),
    );
    report_processes(&mut r, &rec);
    r.note(format!(
        "The analysis is the ready-made `error-ratio` check with its own conditions (failed: result > 0.05, or > 0.01 and twice the baseline, the median of the clusters not changed yet), every {} s, {} times per cluster, over a {} s soak; the agent scrapes every {} s.",
        t.interval_s, t.count, t.soak_s, t.scrape_s
    ));
    r.note("Every version is a new revision of one release `web` (Service + Deployment), as an operator ships one; times are the release history's (the hub's clock, on the same machine); images are read from the simulated clusters' API servers with the simulator's kubeconfig.");
    r.note("The window phase restarts the release role with the windows in its config file, as an operator changing `release.windows` would; the windows' cron start is the minute the phase started (UTC), their duration ends them `hold_s` seconds later.");
    sys.stop();
    Ok((r, rec))
}
