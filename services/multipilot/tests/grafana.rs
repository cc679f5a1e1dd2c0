//! The Grafana files of `deploy/grafana` against the real TSDB: the fleet simulator (1.24 and 1.31), the real
//! agent binary and a real nats-server feed the real `multipilot tsdb` process (auth on), and every template
//! variable query and every panel query of every dashboard (rows' nested panels included) is run as Grafana
//! would run it — variables and `$__rate_interval`/`$__interval`/`$__range` substituted, through the
//! provisioned data source's URL, method and `Authorization` header — instant and range, and must return
//! data. The provisioning files must parse, provide the data source uid every panel names and load the
//! dashboards from the folder the README says to copy them to.

#[path = "../../agent/tests/common/mod.rs"]
mod agent_common;
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use common::{Proc, root};
use multipilot_testkit::free_port;
use serde_json::Value;

/// The token the provisioned data source sends (`MULTIPILOT_GRAFANA_TOKEN` in Grafana's environment).
const TOKEN: &str = "grafana-viewer-token-for-the-dashboards-test";

fn grafana_dir() -> PathBuf {
    root().join("deploy/grafana")
}

/// `${VAR}` and `$VAR` expanded from `env`, as Grafana expands its provisioning files.
fn expand(text: &str, env: &BTreeMap<&str, String>) -> String {
    let mut out = text.to_string();
    for (k, v) in env {
        out = out
            .replace(&format!("${{{k}}}"), v)
            .replace(&format!("${k}"), v);
    }
    out
}

/// The provisioned data source, as Grafana would use it.
struct DataSource {
    url: String,
    post: bool,
    /// `jsonData.timeInterval` in seconds: the scrape interval Grafana assumes.
    scrape_s: u64,
    headers: Vec<(String, String)>,
}

fn duration_s(v: &str) -> Result<u64> {
    Ok(humantime::parse_duration(v)
        .with_context(|| format!("not a duration: {v:?}"))?
        .as_secs())
}

fn load_datasource(env: &BTreeMap<&str, String>) -> Result<DataSource> {
    let path = grafana_dir().join("provisioning/datasources/multipilot.yaml");
    let text = expand(&std::fs::read_to_string(&path)?, env);
    let doc: Value = serde_yaml::from_str(&text).with_context(|| path.display().to_string())?;
    ensure!(doc["apiVersion"] == 1, "{}: apiVersion 1", path.display());
    let sources = doc["datasources"].as_array().context("datasources")?;
    ensure!(sources.len() == 1, "one data source: {sources:?}");
    let ds = &sources[0];
    ensure!(
        ds["type"] == "prometheus" && ds["uid"] == "multipilot" && ds["access"] == "proxy",
        "a prometheus data source, uid multipilot, proxied: {ds}"
    );
    let json = &ds["jsonData"];
    let secure = &ds["secureJsonData"];
    let mut headers = Vec::new();
    for i in 1.. {
        let Some(name) = json[format!("httpHeaderName{i}")].as_str() else {
            break;
        };
        let value = secure[format!("httpHeaderValue{i}")]
            .as_str()
            .with_context(|| format!("httpHeaderValue{i} for {name}"))?;
        headers.push((name.to_string(), value.to_string()));
    }
    let post = match json["httpMethod"].as_str().unwrap_or("POST") {
        "POST" => true,
        "GET" => false,
        m => bail!("httpMethod {m}"),
    };
    Ok(DataSource {
        url: ds["url"].as_str().context("url")?.to_string(),
        post,
        scrape_s: duration_s(json["timeInterval"].as_str().unwrap_or("15s"))?,
        headers,
    })
}

impl DataSource {
    fn request(
        &self,
        http: &reqwest::Client,
        path: &str,
        params: &[(&str, String)],
    ) -> reqwest::RequestBuilder {
        let url = format!("{}{path}", self.url);
        // Grafana asks for label values with GET whatever the data source's method
        let mut req = if self.post && !path.starts_with("/api/v1/label/") {
            http.post(url).form(params)
        } else {
            http.get(url).query(params)
        };
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        req
    }

    /// The `data` of a successful answer, or why there is none.
    async fn call(
        &self,
        http: &reqwest::Client,
        path: &str,
        params: &[(&str, String)],
    ) -> Result<Value> {
        let resp = self.request(http, path, params).send().await?;
        let status = resp.status();
        let body: Value = resp
            .json()
            .await
            .with_context(|| format!("{path}: HTTP {status}, not JSON"))?;
        ensure!(
            status.is_success() && body["status"] == "success",
            "HTTP {status}: {}",
            body
        );
        Ok(body["data"].clone())
    }
}

/// The dashboard's time range and what Grafana derives from it for a panel.
struct Range {
    start: i64,
    end: i64,
    /// `$__interval` and the range query's step, seconds.
    step: i64,
    /// `$__rate_interval`, seconds.
    rate: i64,
}

impl Range {
    /// The last `secs` seconds with Grafana's interval rules: the step is range / max data points, at least
    /// the data source's scrape interval; the rate interval max(step + scrape, 4 × scrape); start and end
    /// aligned down to the step.
    fn last(secs: i64, max_points: i64, scrape_s: u64) -> Range {
        let scrape = scrape_s as i64;
        let step = (secs / max_points).max(scrape).max(1);
        let now = chrono::Utc::now().timestamp();
        Range {
            start: (now - secs) / step * step,
            end: now / step * step,
            step,
            rate: (step + scrape).max(4 * scrape),
        }
    }

    fn builtins(&self) -> Vec<(&'static str, String)> {
        let range = self.end - self.start;
        // longest names first: `$__range_s` before `$__range`
        vec![
            ("$__rate_interval_ms", (self.rate * 1000).to_string()),
            ("$__rate_interval", format!("{}s", self.rate)),
            ("${__rate_interval}", format!("{}s", self.rate)),
            ("$__interval_ms", (self.step * 1000).to_string()),
            ("$__interval", format!("{}s", self.step)),
            ("${__interval}", format!("{}s", self.step)),
            ("$__range_ms", (range * 1000).to_string()),
            ("$__range_s", range.to_string()),
            ("$__range", format!("{range}s")),
            ("${__range}", format!("{range}s")),
        ]
    }
}

/// A value escaped for a regex matcher as Grafana's Prometheus data source escapes it (`prometheusRegularEscape`):
/// the regex metacharacters get a backslash, itself escaped for the PromQL string (`.` becomes `\\.`).
fn regex_escape(v: &str) -> String {
    let mut out = String::new();
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\\\\\"),
            '$' | '^' | '*' | '{' | '}' | '[' | ']' | '\'' | '+' | '?' | '.' | '(' | ')' | '|' => {
                out.push_str("\\\\");
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// A template variable's value, formatted as Grafana formats it for a Prometheus query.
fn format_var(var: &Value, values: &[String]) -> String {
    let all = var["includeAll"].as_bool().unwrap_or(false);
    let multi = var["multi"].as_bool().unwrap_or(false);
    if all || multi {
        // "All" (the default of a variable that includes it): every value, regex-escaped, as an alternation
        if let Some(v) = var["allValue"].as_str().filter(|v| !v.is_empty()) {
            return v.to_string();
        }
        let escaped: Vec<String> = values.iter().map(|v| regex_escape(v)).collect();
        format!("({})", escaped.join("|"))
    } else {
        values[0].clone()
    }
}

fn substitute(
    expr: &str,
    vars: &[(String, String)],
    builtins: &[(&'static str, String)],
) -> String {
    let mut out = expr.to_string();
    for (name, value) in vars {
        out = out
            .replace(&format!("${{{name}}}"), value)
            .replace(&format!("[[{name}]]"), value);
    }
    for (name, value) in builtins {
        out = out.replace(name, value);
    }
    // `$cluster` after the longer built-ins (`$__…`), longest variable name first
    let mut plain: Vec<&(String, String)> = vars.iter().collect();
    plain.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    for (name, value) in plain {
        out = out.replace(&format!("${name}"), value);
    }
    out
}

/// `label_values(<selector>, <label>)` or `label_values(<label>)`.
fn parse_label_values(q: &str) -> Result<(Option<String>, String)> {
    let inner = q
        .trim()
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
        .with_context(|| format!("only label_values(…) variables are checked: {q:?}"))?;
    Ok(match inner.rsplit_once(',') {
        Some((sel, label)) => (Some(sel.trim().to_string()), label.trim().to_string()),
        None => (None, inner.trim().to_string()),
    })
}

/// Every panel, rows' nested panels included.
fn panels(list: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in list.as_array().into_iter().flatten() {
        out.push(p);
        out.extend(panels(&p["panels"]));
    }
    out
}

/// Whether a query answer holds data: a vector with a sample, a matrix with a point, or a scalar.
fn has_data(data: &Value) -> bool {
    match data["resultType"].as_str() {
        Some("vector") => data["result"].as_array().is_some_and(|r| !r.is_empty()),
        Some("matrix") => data["result"].as_array().is_some_and(|r| {
            r.iter()
                .any(|s| s["values"].as_array().is_some_and(|v| !v.is_empty()))
        }),
        Some("scalar") | Some("string") => true,
        _ => false,
    }
}

/// One dashboard, checked: its file name, title and the failures found.
struct Checked {
    file: String,
    title: String,
    queries: usize,
    failures: Vec<String>,
}

async fn check_dashboard(http: &reqwest::Client, ds: &DataSource, path: &Path) -> Result<Checked> {
    let file = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path)?)
        .with_context(|| format!("{file} is not JSON"))?;
    let title = dash["title"].as_str().unwrap_or_default().to_string();
    let mut failures = Vec::new();
    let mut queries = 0;
    ensure!(
        dash["uid"].as_str().is_some_and(|u| !u.is_empty()) && !title.is_empty(),
        "{file}: a uid and a title"
    );
    ensure!(
        dash["schemaVersion"].as_i64().is_some_and(|v| v >= 36),
        "{file}: schemaVersion of a current Grafana"
    );
    let range = Range::last(15 * 60, 100, ds.scrape_s);
    let window = [
        ("start", range.start.to_string()),
        ("end", range.end.to_string()),
    ];

    // template variables, in order (a later one may use an earlier one)
    let mut vars: Vec<(String, String)> = Vec::new();
    for var in dash["templating"]["list"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().context("variable name")?.to_string();
        ensure!(
            var["type"] == "query",
            "{file}: variable {name} is not a query variable"
        );
        ensure!(
            var["datasource"]["uid"] == "multipilot",
            "{file}: variable {name} uses data source {}",
            var["datasource"]
        );
        let q = var["query"]["query"]
            .as_str()
            .or(var["query"].as_str())
            .context("variable query")?;
        queries += 1;
        let q = substitute(q, &vars, &range.builtins());
        let (selector, label) = parse_label_values(&q)?;
        let mut params = window.to_vec();
        if let Some(s) = selector {
            params.push(("match[]", s));
        }
        let values = match ds
            .call(http, &format!("/api/v1/label/{label}/values"), &params)
            .await
        {
            Ok(v) => v
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default(),
            Err(e) => {
                failures.push(format!("{file}: variable {name} ({q}): {e}"));
                continue;
            }
        };
        if values.is_empty() {
            failures.push(format!("{file}: variable {name} ({q}) has no values"));
            continue;
        }
        let mut values = values;
        values.sort();
        vars.push((name, format_var(var, &values)));
    }
    if !failures.is_empty() {
        return Ok(Checked {
            file,
            title,
            queries,
            failures,
        });
    }

    for panel in panels(&dash["panels"]) {
        let ptitle = panel["title"].as_str().unwrap_or_default();
        let kind = panel["type"].as_str().unwrap_or_default();
        if matches!(kind, "row" | "text") {
            continue;
        }
        ensure!(
            matches!(kind, "timeseries" | "stat" | "table" | "gauge" | "bargauge"),
            "{file}: panel {ptitle:?} has type {kind}"
        );
        ensure!(
            panel["datasource"]["uid"] == "multipilot",
            "{file}: panel {ptitle:?} uses data source {}",
            panel["datasource"]
        );
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        ensure!(!targets.is_empty(), "{file}: panel {ptitle:?} has no query");
        for t in &targets {
            ensure!(
                t["datasource"].is_null() || t["datasource"]["uid"] == "multipilot",
                "{file}: panel {ptitle:?} target {} uses data source {}",
                t["refId"],
                t["datasource"]
            );
            let raw = t["expr"].as_str().context("a target without expr")?;
            let expr = substitute(raw, &vars, &range.builtins());
            ensure!(
                !expr.contains('$'),
                "{file}: panel {ptitle:?}: unsubstituted variable in {expr}"
            );
            queries += 1;
            let what = format!("{file} ({title}), panel {ptitle:?}, expr {expr}");
            let instant = ds
                .call(
                    http,
                    "/api/v1/query",
                    &[("query", expr.clone()), ("time", range.end.to_string())],
                )
                .await;
            match instant {
                Ok(d) if has_data(&d) => {}
                Ok(d) => failures.push(format!("{what}: instant query returned no data: {d}")),
                Err(e) => failures.push(format!("{what}: instant query failed: {e}")),
            }
            let ranged = ds
                .call(
                    http,
                    "/api/v1/query_range",
                    &[
                        ("query", expr.clone()),
                        ("start", range.start.to_string()),
                        ("end", range.end.to_string()),
                        ("step", range.step.to_string()),
                    ],
                )
                .await;
            match ranged {
                Ok(d) if has_data(&d) => {}
                Ok(d) => failures.push(format!("{what}: range query returned no data: {d}")),
                Err(e) => failures.push(format!("{what}: range query failed: {e}")),
            }
        }
    }
    Ok(Checked {
        file,
        title,
        queries,
        failures,
    })
}

#[test]
fn provisioning_files_load_the_dashboards_from_the_documented_folder() -> Result<()> {
    let path = grafana_dir().join("provisioning/dashboards/multipilot.yaml");
    let doc: Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    ensure!(doc["apiVersion"] == 1, "apiVersion 1");
    let providers = doc["providers"].as_array().context("providers")?;
    ensure!(providers.len() == 1, "{providers:?}");
    let p = &providers[0];
    ensure!(p["type"] == "file", "a file provider: {p}");
    let folder = p["options"]["path"].as_str().context("options.path")?;
    ensure!(folder.starts_with('/'), "an absolute path: {folder}");
    // the README's copy step puts deploy/grafana/dashboards exactly where the provider reads
    let readme = std::fs::read_to_string(root().join("README.md"))?;
    ensure!(
        readme.contains(&format!("deploy/grafana/dashboards/*.json {folder}/"))
            || readme.contains(&format!("deploy/grafana/dashboards {folder}")),
        "the README does not copy deploy/grafana/dashboards to {folder}"
    );
    let mut files: Vec<String> = std::fs::read_dir(grafana_dir().join("dashboards"))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "cluster.json",
            "fleet-overview.json",
            "gpu-pool.json",
            "multipilot-health.json"
        ]
    );
    let env = BTreeMap::from([
        ("MULTIPILOT_TSDB_URL", "http://tsdb:9466".to_string()),
        ("MULTIPILOT_GRAFANA_TOKEN", "t".to_string()),
    ]);
    let ds = load_datasource(&env)?;
    assert_eq!(ds.url, "http://tsdb:9466");
    assert_eq!(
        ds.headers,
        [("Authorization".to_string(), "Bearer t".to_string())]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_panel_query_returns_data_on_the_simulated_fleet() -> Result<()> {
    let mut h = agent_common::harness(1.0, 15).await?;
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        format!("- {{token: \"{TOKEN}\", subject: grafana, role: viewer}}\n"),
    )?;
    let port = free_port()?;
    let log = dir.path().join("tsdb.log");
    let mut cmd = common::role("tsdb", &h.nats.url(), &dir.path().join("data"), &log)?;
    cmd.env("MULTIPILOT_TSDB__LISTEN", format!("127.0.0.1:{port}"))
        .env("MULTIPILOT_TSDB__AUTH__ENABLED", "true")
        .env("MULTIPILOT_TSDB__AUTH__TOKENS_FILE", &tokens);
    let _tsdb = Proc::spawn(&mut cmd)?;
    let tsdb_log = || std::fs::read_to_string(&log).unwrap_or_default();
    h.start_agent()?;

    let env = BTreeMap::from([
        ("MULTIPILOT_TSDB_URL", format!("http://127.0.0.1:{port}")),
        ("MULTIPILOT_GRAFANA_TOKEN", TOKEN.to_string()),
    ]);
    let ds = load_datasource(&env)?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()?;

    // without the data source's header the TSDB refuses: the header is what lets Grafana in
    let refused = agent_common::until("the TSDB answering", 30, || async {
        Ok(http
            .get(format!("{}/api/v1/query?query=vector(1)", ds.url))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16()))
    })
    .await
    .with_context(tsdb_log)?;
    assert_eq!(refused, 401, "the TSDB runs with auth on");

    // both clusters' kube-state-metrics and apiserver scrapes, twice each (a rate needs two samples)
    agent_common::eventually("two scrapes of both clusters in the TSDB", 60, || async {
        let d = ds
            .call(
                &http,
                "/api/v1/query",
                &[(
                    "query",
                    "count by (cluster) (count_over_time(apiserver_storage_objects[1m]) >= 2) \
                     and count by (cluster) (kube_node_status_condition)"
                        .into(),
                )],
            )
            .await;
        Ok(d.is_ok_and(|d| d["result"].as_array().is_some_and(|r| r.len() == 2)))
    })
    .await
    .with_context(|| format!("tsdb log:\n{}\n{}", tsdb_log(), h.agent_log()))?;

    let mut paths: Vec<PathBuf> = std::fs::read_dir(grafana_dir().join("dashboards"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    ensure!(paths.len() == 4, "four dashboards: {paths:?}");

    // Every query must answer with data; a range query's last step lands on the newest samples only after
    // a step or so, so the whole check is repeated until it passes or the deadline comes.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut failures = Vec::new();
        let mut summary = Vec::new();
        for p in &paths {
            let c = check_dashboard(&http, &ds, p).await?;
            summary.push(format!("{} ({}): {} queries", c.file, c.title, c.queries));
            failures.extend(c.failures);
        }
        if failures.is_empty() {
            eprintln!("{}", summary.join("\n"));
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "{} dashboard queries failed:\n{}\n\ntsdb log:\n{}",
                failures.len(),
                failures.join("\n"),
                tsdb_log()
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    h.stop_agent()?;
    Ok(())
}
