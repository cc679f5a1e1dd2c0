//! Analysis gates: queries against the fleet TSDB, measured over a batch's soak and judged by conditions,
//! like Argo Rollouts' AnalysisTemplate (metrics, interval, count, success and failure conditions, failure
//! and inconclusive limits) and Flagger's metric checks — on the fleet's own metrics, per cluster, with the
//! clusters the release has not changed yet as the baseline.
//!
//! ```yaml
//! analysis:
//!   interval: 30s            # between measurements (default 30s)
//!   initial_delay: 1m        # before the first interval (default: two of the batch's scrape intervals)
//!   count: 4                 # measurements per metric and cluster (default: enough to fill the soak)
//!   failure_limit: 0         # failed measurements tolerated; one more fails the batch (default 0)
//!   inconclusive_limit: 1    # inconclusive ones tolerated; one more holds the batch (default 0)
//!   consecutive_error_limit: 4  # errors in a row taken again; one more is inconclusive (default 4)
//!   metrics:
//!     - name: errors
//!       template: error-ratio            # a ready-made check (see TEMPLATES), its conditions kept...
//!       failure: result > 0.05           # ...unless given
//!     - name: p99
//!       query: |
//!         histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket{
//!           cluster="{{cluster}}", namespace=~"{{namespace}}", deployment=~"{{workloads}}"}[{{rate_interval}}])))
//!       success: result < 0.5 && (baseline == null || result <= baseline * 2.0)
//! ```
//!
//! A query's placeholders: `{{cluster}}` (the cluster measured), `{{namespace}}` and `{{workloads}}` (the
//! namespaces and names of the release's Deployments, StatefulSets and DaemonSets on that cluster, as a
//! regular-expression alternation, for `=~`), `{{interval}}` (the measurement interval, e.g. `30s`) and
//! `{{rate_interval}}` (Grafana's `$__rate_interval`: the interval plus a scrape interval, at least four
//! scrape intervals — a range that holds the two samples `rate()` needs, where a range of `{{interval}}`
//! shorter than two scrape intervals answers at best now and then, and one no longer than a scrape interval
//! never). The scrape interval is the slowest of the round's clusters (the batch's and the baseline's, so
//! that all are measured over one range), each the one its agent reports in its facts, 30 s (the agent's
//! default) when it does not. Consecutive measurements' ranges overlap by the rate interval less the
//! interval: a short burst of errors is in several of them. A query's answer must be one number (a scalar,
//! or an instant vector of one sample; more than one sample is inconclusive).
//!
//! Conditions are CEL expressions over `result` (the cluster's number) and `baseline` (the median of the
//! same query on the release's target clusters it has not changed yet, or `null` when there is none, such
//! as on the last batch). A measurement is:
//! - **failed** when `failure` holds, or when only `success` is given and it does not hold;
//! - **successful** when `success` holds (and `failure` does not), or when only `failure` is given and it
//!   does not hold;
//! - an **error** when the query answers no sample or NaN (no data yet: a new workload's first scrapes; no
//!   requests to divide), or the TSDB does not answer, times out or is unavailable: as in Argo Rollouts it
//!   is taken again at the next interval and counts for nothing, unless it is one more than
//!   `consecutive_error_limit` in a row, which is inconclusive;
//! - **inconclusive** when both are given and neither holds, or when the query is refused (bad PromQL, an
//!   execution error such as many-to-many matching), answers more than one sample or not a number, a rate
//!   over `[{{interval}}]` no longer than a scrape interval answers nothing, or a condition can't be
//!   evaluated — never a pass.
//!
//! A metric and cluster measured `count` times is not measured again while the others catch up.
//!
//! A batch fails as soon as a metric on one of its clusters has more failed measurements than
//! `failure_limit` (the release rolls back); it holds (waits for the `analysis-<batch>` approval, or a
//! rollback) as soon as one has more inconclusive ones than `inconclusive_limit`; it passes when every
//! metric on every cluster has its `count` measurements within both limits.

use std::collections::BTreeMap;
use std::time::Duration;

use cel::{Context, Program, Value as Cel};
use serde::{Deserialize, Serialize};

/// The ready-made checks: name, query, default success and failure conditions. Written for the metrics the
/// agent collects: an application's `http_requests_total{namespace, deployment, code}` (the shape of the
/// client libraries' default HTTP metrics, with the workload's name as `deployment`), and
/// kube-state-metrics' series.
pub const TEMPLATES: &[Template] = &[
    Template {
        name: "error-ratio",
        description: "share of the workloads' HTTP requests answered 5xx",
        // a workload that never answered 5xx has no such series yet (client libraries make it on the first):
        // zero errors, not no sample
        query: "(sum(rate(http_requests_total{cluster=\"{{cluster}}\",namespace=~\"{{namespace}}\",deployment=~\"{{workloads}}\",code=~\"5..\"}[{{rate_interval}}])) or vector(0)) / sum(rate(http_requests_total{cluster=\"{{cluster}}\",namespace=~\"{{namespace}}\",deployment=~\"{{workloads}}\"}[{{rate_interval}}]))",
        success: None,
        failure: Some(
            "result > 0.05 || (baseline != null && result > 0.01 && result > baseline * 2.0)",
        ),
    },
    Template {
        name: "restarts",
        description: "container restarts of the workloads' pods over the rate interval, against the baseline's",
        query: "sum(increase(kube_pod_container_status_restarts_total{cluster=\"{{cluster}}\",namespace=~\"{{namespace}}\",pod=~\"({{workloads}})-.*\"}[{{rate_interval}}])) or vector(0)",
        success: None,
        // a fleet whose pods restart now and then anyway (the baseline) fails only on clearly more
        failure: Some(
            "baseline == null ? result >= 3.0 : result >= 1.0 && result > baseline * 2.0 + 1.0",
        ),
    },
    Template {
        name: "readiness",
        description: "available replicas over desired replicas of the Deployments",
        query: "sum(kube_deployment_status_replicas_available{cluster=\"{{cluster}}\",namespace=~\"{{namespace}}\",deployment=~\"{{workloads}}\"}) / sum(kube_deployment_spec_replicas{cluster=\"{{cluster}}\",namespace=~\"{{namespace}}\",deployment=~\"{{workloads}}\"})",
        success: Some("result >= 1.0"),
        failure: None,
    },
];

/// A ready-made check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Template {
    /// Its name (`template:` in a metric).
    pub name: &'static str,
    /// What it measures.
    pub description: &'static str,
    /// The PromQL query, with placeholders.
    pub query: &'static str,
    /// Default success condition.
    pub success: Option<&'static str>,
    /// Default failure condition.
    pub failure: Option<&'static str>,
}

const PLACEHOLDERS: &[&str] = &[
    "{{cluster}}",
    "{{namespace}}",
    "{{workloads}}",
    "{{interval}}",
    "{{rate_interval}}",
];

/// The scrape interval of a cluster whose agent does not report one: the agent's default.
pub const DEFAULT_SCRAPE_INTERVAL: Duration = Duration::from_secs(30);

/// The `analysis` section of a release spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Analysis {
    /// Between measurements.
    #[serde(default = "default_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// After the batch is healthy, before the first interval starts (Argo Rollouts' `initialDelay`); by
    /// default two scrape intervals of the batch's slowest cluster: the new pods' first two samples, which a
    /// rate needs.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub initial_delay: Option<Duration>,
    /// Measurements per metric and cluster (default: as many intervals as fit in the soak, at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Failed measurements tolerated per metric and cluster.
    #[serde(default)]
    pub failure_limit: u32,
    /// Inconclusive measurements tolerated per metric and cluster.
    #[serde(default)]
    pub inconclusive_limit: u32,
    /// Errors (no sample, the TSDB not answering) in a row taken again per metric and cluster; one more is
    /// an inconclusive measurement (Argo Rollouts' `consecutiveErrorLimit`, and its default).
    #[serde(default = "default_error_limit")]
    pub consecutive_error_limit: u32,
    /// What is measured.
    pub metrics: Vec<Metric>,
}

fn default_interval() -> Duration {
    Duration::from_secs(30)
}

fn default_error_limit() -> u32 {
    4
}

/// One metric of an analysis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metric {
    /// Its name (in the history and the console).
    pub name: String,
    /// A ready-made check ([`TEMPLATES`]); `query`, `success` and `failure` override its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// PromQL, with placeholders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// CEL over `result` and `baseline`: the measurement passes when it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success: Option<String>,
    /// CEL over `result` and `baseline`: the measurement fails when it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// An analysis that can't be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No metric.
    #[error("analysis: no metric to measure")]
    NoMetric,
    /// Two metrics of one name.
    #[error("analysis: two metrics are named {0:?}")]
    Duplicate(String),
    /// A template not shipped.
    #[error("analysis metric {metric:?}: no template {template:?} (there are: {known})")]
    UnknownTemplate {
        /// Metric.
        metric: String,
        /// The template named.
        template: String,
        /// The templates there are.
        known: String,
    },
    /// Neither query nor template.
    #[error("analysis metric {0:?}: give a query or a template")]
    NoQuery(String),
    /// Neither condition.
    #[error("analysis metric {0:?}: give a success or a failure condition")]
    NoCondition(String),
    /// `{{something}}` the role does not fill.
    #[error("analysis metric {metric:?}: unknown placeholder {placeholder} (there are: {known})")]
    Placeholder {
        /// Metric.
        metric: String,
        /// The placeholder.
        placeholder: String,
        /// The placeholders there are.
        known: String,
    },
    /// A condition that does not compile.
    #[error(
        "analysis metric {metric:?}: the {field} condition {source_text:?} does not compile: {error}"
    )]
    Condition {
        /// Metric.
        metric: String,
        /// `success` or `failure`.
        field: &'static str,
        /// The condition.
        source_text: String,
        /// The CEL error.
        error: String,
    },
    /// Zero interval or count.
    #[error("analysis: {0} must be more than zero")]
    Zero(&'static str),
    /// A duration or count past what a batch's soak can be.
    #[error("analysis: {0} must be at most {1}")]
    TooLong(&'static str, &'static str),
}

/// The longest `interval` and `initial_delay`, and the most measurements, an analysis may ask for.
const MAX_INTERVAL: Duration = Duration::from_secs(3600);
const MAX_INITIAL_DELAY: Duration = Duration::from_secs(24 * 3600);
const MAX_COUNT: u32 = 10_000;

/// An analysis ready to measure.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// Between measurements.
    pub interval: Duration,
    /// See [`Analysis::initial_delay`].
    pub initial_delay: Option<Duration>,
    /// Measurements per metric and cluster.
    pub count: u32,
    /// See [`Analysis::failure_limit`].
    pub failure_limit: u32,
    /// See [`Analysis::inconclusive_limit`].
    pub inconclusive_limit: u32,
    /// See [`Analysis::consecutive_error_limit`].
    pub consecutive_error_limit: u32,
    metrics: Vec<CompiledMetric>,
}

#[derive(Clone)]
struct CompiledMetric {
    name: String,
    query: String,
    success: Option<(String, std::sync::Arc<Program>)>,
    failure: Option<(String, std::sync::Arc<Program>)>,
}

impl std::fmt::Debug for CompiledMetric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledMetric")
            .field("name", &self.name)
            .field("query", &self.query)
            .field("success", &self.success.as_ref().map(|s| &s.0))
            .field("failure", &self.failure.as_ref().map(|s| &s.0))
            .finish()
    }
}

fn template(name: &str) -> Option<&'static Template> {
    TEMPLATES.iter().find(|t| t.name == name)
}

impl Analysis {
    /// Checks and compiles the analysis of a release soaking `soak` per batch.
    pub fn compile(&self, soak: Duration) -> Result<Compiled, Error> {
        if self.metrics.is_empty() {
            return Err(Error::NoMetric);
        }
        if self.interval.is_zero() {
            return Err(Error::Zero("interval"));
        }
        if self.count == Some(0) {
            return Err(Error::Zero("count"));
        }
        if self.interval > MAX_INTERVAL {
            return Err(Error::TooLong("interval", "1h"));
        }
        if self.initial_delay.is_some_and(|d| d > MAX_INITIAL_DELAY) {
            return Err(Error::TooLong("initial_delay", "24h"));
        }
        if self.count.is_some_and(|c| c > MAX_COUNT) {
            return Err(Error::TooLong("count", "10000"));
        }
        let count = self.count.unwrap_or_else(|| {
            let fit = soak.as_secs_f64() / self.interval.as_secs_f64();
            (fit.floor() as u32).clamp(1, MAX_COUNT)
        });
        let mut metrics = Vec::new();
        for m in &self.metrics {
            if metrics.iter().any(|c: &CompiledMetric| c.name == m.name) {
                return Err(Error::Duplicate(m.name.clone()));
            }
            let t = match &m.template {
                Some(name) => Some(template(name).ok_or_else(|| {
                    Error::UnknownTemplate {
                        metric: m.name.clone(),
                        template: name.clone(),
                        known: TEMPLATES
                            .iter()
                            .map(|t| t.name)
                            .collect::<Vec<_>>()
                            .join(", "),
                    }
                })?),
                None => None,
            };
            let query = m
                .query
                .clone()
                .or_else(|| t.map(|t| t.query.to_string()))
                .ok_or_else(|| Error::NoQuery(m.name.clone()))?;
            check_placeholders(&m.name, &query)?;
            // a metric's own conditions replace the template's as a pair: a template's default success
            // next to the operator's failure would judge by a condition nobody wrote here
            let (success, failure) = if m.success.is_some() || m.failure.is_some() {
                (m.success.clone(), m.failure.clone())
            } else {
                (
                    t.and_then(|t| t.success.map(str::to_string)),
                    t.and_then(|t| t.failure.map(str::to_string)),
                )
            };
            if success.is_none() && failure.is_none() {
                return Err(Error::NoCondition(m.name.clone()));
            }
            let compile = |field: &'static str, text: Option<String>| {
                text.map(|text| {
                    Program::compile(&text)
                        .map(|p| (text.clone(), std::sync::Arc::new(p)))
                        .map_err(|e| Error::Condition {
                            metric: m.name.clone(),
                            field,
                            source_text: text.clone(),
                            error: e.to_string(),
                        })
                })
                .transpose()
            };
            metrics.push(CompiledMetric {
                name: m.name.clone(),
                query,
                success: compile("success", success)?,
                failure: compile("failure", failure)?,
            });
        }
        Ok(Compiled {
            interval: self.interval,
            initial_delay: self.initial_delay,
            count,
            failure_limit: self.failure_limit,
            inconclusive_limit: self.inconclusive_limit,
            consecutive_error_limit: self.consecutive_error_limit,
            metrics,
        })
    }
}

fn check_placeholders(metric: &str, query: &str) -> Result<(), Error> {
    let mut rest = query;
    while let Some(at) = rest.find("{{") {
        let tail = &rest[at..];
        let end = tail.find("}}").map(|e| e + 2).unwrap_or(tail.len());
        let p = &tail[..end];
        if !PLACEHOLDERS.contains(&p) {
            return Err(Error::Placeholder {
                metric: metric.into(),
                placeholder: p.into(),
                known: PLACEHOLDERS.join(", "),
            });
        }
        rest = &tail[end..];
    }
    Ok(())
}

/// What a query is asked about: a cluster and the release's workloads there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// Cluster.
    pub cluster: String,
    /// Namespaces of the workloads.
    pub namespaces: Vec<String>,
    /// Names of the workloads.
    pub workloads: Vec<String>,
    /// Between its agent's scrapes ([`DEFAULT_SCRAPE_INTERVAL`] when not known).
    pub scrape_interval: Option<Duration>,
    /// Metrics measured `count` times on it already: not asked again.
    pub done: Vec<String>,
}

/// The slowest scrape interval of `targets` and `baseline`.
fn slowest_scrape(targets: &[Target], baseline: &[Target]) -> Duration {
    targets
        .iter()
        .chain(baseline)
        .map(Target::scrape)
        .max()
        .unwrap_or(DEFAULT_SCRAPE_INTERVAL)
}

/// PromQL functions that need two samples in their range.
const TWO_SAMPLE_FUNCTIONS: &[&str] = &[
    "rate",
    "irate",
    "increase",
    "delta",
    "idelta",
    "deriv",
    "predict_linear",
];

impl Compiled {
    /// `{{rate_interval}}` for a round measuring `targets` (the batch's clusters and the baseline's):
    /// Grafana's `$__rate_interval` of the slowest scrape among them — the interval plus a scrape interval,
    /// at least four scrape intervals.
    pub fn rate_interval(&self, targets: &[Target], baseline: &[Target]) -> Duration {
        let scrape = slowest_scrape(targets, baseline);
        (self.interval + scrape).max(scrape * 4)
    }

    /// The wait before the first interval on a round of `targets`: the analysis' `initial_delay`, or two
    /// scrape intervals of the slowest of them, longer if the rate interval needs it so that the first
    /// range starts after the batch was healthy.
    pub fn initial_delay(&self, targets: &[Target], baseline: &[Target]) -> Duration {
        self.initial_delay.unwrap_or_else(|| {
            (2 * slowest_scrape(targets, baseline)).max(
                self.rate_interval(targets, baseline)
                    .saturating_sub(self.interval),
            )
        })
    }
}

impl Target {
    /// Between its agent's scrapes (a reported 0 read as not reported).
    fn scrape(&self) -> Duration {
        self.scrape_interval
            .filter(|d| !d.is_zero())
            .unwrap_or(DEFAULT_SCRAPE_INTERVAL)
    }

    /// Why a rate over `[{{interval}}]` in `query` answers nothing here, if it can't hold two samples, and
    /// whether it never can (a range no longer than a scrape interval) rather than now and then.
    fn short_range(&self, query: &str, interval: Duration) -> Option<(String, bool)> {
        let scrape = self.scrape();
        if interval >= scrape * 2 || !two_sample_range(query) {
            return None;
        }
        let why = format!(
            "its range [{}] is shorter than two of {}'s scrapes ({} apart): use [{{{{rate_interval}}}}]",
            promql_duration(interval),
            self.cluster,
            promql_duration(scrape)
        );
        // "never" only from a scrape interval the agent reported, not the default guessed
        let known = self.scrape_interval.is_some_and(|d| !d.is_zero());
        Some((why, known && interval <= scrape))
    }
}

/// Whether `query` gives a range of exactly `{{interval}}` (not a subquery's) to a function that needs two
/// samples in it.
fn two_sample_range(query: &str) -> bool {
    // read forward: strings and comments skipped, each open parenthesis with the name before it
    let mut calls: Vec<&str> = Vec::new();
    let (mut ident_start, mut last_ident): (Option<usize>, &str) = (None, "");
    let mut chars = query.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            ident_start.get_or_insert(i);
            continue;
        }
        if let Some(start) = ident_start.take() {
            last_ident = &query[start..i];
        }
        match c {
            '"' | '\'' | '`' => {
                // to the closing quote (a backslash escapes within " and ')
                while let Some((_, d)) = chars.next() {
                    if d == '\\' && c != '`' {
                        chars.next();
                    } else if d == c {
                        break;
                    }
                }
                last_ident = "";
            }
            '#' => {
                for (_, d) in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
            }
            '(' => {
                calls.push(last_ident);
                last_ident = "";
            }
            ')' => {
                calls.pop();
                last_ident = "";
            }
            '[' if query[i..].starts_with("[{{interval}}]") => {
                if calls
                    .last()
                    .is_some_and(|f| TWO_SAMPLE_FUNCTIONS.contains(f))
                {
                    return true;
                }
                last_ident = "";
            }
            c if c.is_whitespace() => {}
            // a selector's braces, a range's brackets, operators: the name before them is no call's
            _ => last_ident = "",
        }
    }
    false
}

/// A regular-expression alternation of literal names (`a|b`); for none, `$^`, which matches nothing (a
/// query then answers no sample, and the measurement says so).
fn alternation(names: &[String]) -> String {
    if names.is_empty() {
        return "$^".into();
    }
    let mut v: Vec<String> = names.iter().map(|n| regex_escape(n)).collect();
    v.sort();
    v.dedup();
    v.join("|")
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
            // inside a PromQL double-quoted string a backslash is itself escaped
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A duration as PromQL writes it (`30s`, `2m`, `1h30m`).
fn promql_duration(d: Duration) -> String {
    let mut s = d.as_secs().max(1);
    let mut out = String::new();
    for (unit, n) in [("h", 3600), ("m", 60), ("s", 1)] {
        if s >= n {
            out.push_str(&format!("{}{unit}", s / n));
            s %= n;
        }
    }
    out
}

/// How one measurement came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Within the conditions.
    Successful,
    /// Outside them.
    Failed,
    /// Neither, or no number to judge.
    Inconclusive,
    /// No number yet (no sample, the TSDB not answering): taken again, counts for nothing unless one more
    /// than `consecutive_error_limit` in a row (then inconclusive).
    Error,
}

/// One metric measured on one cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Metric.
    pub metric: String,
    /// Cluster.
    pub cluster: String,
    /// The cluster's number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// The baseline's number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<f64>,
    /// How it came out.
    pub verdict: Verdict,
    /// Why, for a person.
    pub reason: String,
}

/// Why a query gave no number to judge (it failed, answered no sample or several, or a condition could not
/// be evaluated on it).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason}")]
pub struct NoNumber {
    /// For a person.
    pub reason: String,
    /// Why.
    pub kind: Missing,
}

/// Why there is no number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// Asking again won't give one (several samples, a query refused): inconclusive.
    Final,
    /// The query answered no sample (yet): an error, asked again (see [`Verdict::Error`]).
    NoSample,
    /// The TSDB did not answer, timed out or was unavailable: an error, asked again.
    Unanswered,
}

impl NoNumber {
    /// No number, and asking again won't give one (several samples, bad PromQL).
    pub fn new(reason: impl Into<String>) -> NoNumber {
        NoNumber {
            reason: reason.into(),
            kind: Missing::Final,
        }
    }

    /// The query answered no sample.
    pub fn no_sample() -> NoNumber {
        NoNumber {
            reason: "the query answered no sample".into(),
            kind: Missing::NoSample,
        }
    }

    /// The TSDB could not answer now.
    pub fn unanswered(reason: impl Into<String>) -> NoNumber {
        NoNumber {
            reason: reason.into(),
            kind: Missing::Unanswered,
        }
    }

    /// Whether asking again later may give a number.
    pub fn retry(&self) -> bool {
        self.kind != Missing::Final
    }
}

/// What the TSDB answered for one query: one number, or why there is none.
pub type Answer = Result<f64, NoNumber>;

impl Compiled {
    /// The metrics' names.
    pub fn metrics(&self) -> impl Iterator<Item = &str> {
        self.metrics.iter().map(|m| m.name.as_str())
    }

    /// Every metric's query for `target`, in a round whose `{{rate_interval}}` is `rate_interval` (see
    /// [`Compiled::rate_interval`]): `(metric, PromQL)`.
    pub fn queries(&self, target: &Target, rate_interval: Duration) -> Vec<(String, String)> {
        let namespace = alternation(&target.namespaces);
        let workloads = alternation(&target.workloads);
        let interval = promql_duration(self.interval);
        let rate_interval = promql_duration(rate_interval);
        self.metrics
            .iter()
            .map(|m| {
                let q = m
                    .query
                    .replace("{{cluster}}", &target.cluster.replace('"', "\\\""))
                    .replace("{{namespace}}", &namespace)
                    .replace("{{workloads}}", &workloads)
                    .replace("{{interval}}", &interval)
                    .replace("{{rate_interval}}", &rate_interval);
                (m.name.clone(), q)
            })
            .collect()
    }

    /// `answer` of `metric` on `target`, with why when it is no sample because the query rates over a range
    /// of `{{interval}}` shorter than two scrape intervals there — and inconclusive at once (no wait will
    /// help) when the range is no longer than one.
    pub fn explain(&self, metric: &str, target: &Target, answer: Answer) -> Answer {
        let Err(e) = answer else { return answer };
        let short = (e.kind == Missing::NoSample)
            .then(|| self.metrics.iter().find(|m| m.name == metric))
            .flatten()
            .and_then(|m| target.short_range(&m.query, self.interval));
        match short {
            None => Err(e),
            Some((why, never)) => Err(NoNumber {
                reason: format!("{}: {why}", e.reason),
                kind: if never { Missing::Final } else { e.kind },
            }),
        }
    }

    /// Judges a metric's answer on a cluster against its conditions, with the baseline's answer.
    pub fn judge(
        &self,
        metric: &str,
        cluster: &str,
        answer: Answer,
        baseline: Option<f64>,
    ) -> Measurement {
        let mut m = Measurement {
            metric: metric.into(),
            cluster: cluster.into(),
            value: answer.as_ref().ok().copied(),
            baseline,
            verdict: Verdict::Inconclusive,
            reason: String::new(),
        };
        let Some(def) = self.metrics.iter().find(|d| d.name == metric) else {
            m.reason = format!("no metric {metric:?} in the analysis");
            return m;
        };
        let value = match answer {
            Ok(v) if v.is_finite() => v,
            Ok(v) if v.is_nan() => {
                // 0/0: nothing in the range to divide (no requests yet): asked again
                m.verdict = Verdict::Error;
                m.reason = "the query answered NaN (nothing in its range, e.g. no requests)".into();
                return m;
            }
            Ok(v) => {
                m.reason = format!("the query answered {v}, not a number to judge");
                return m;
            }
            Err(e) => {
                if e.retry() {
                    m.verdict = Verdict::Error;
                }
                m.reason = e.reason;
                return m;
            }
        };
        let mut cx = Context::default();
        cx.add_variable_from_value("result", Cel::Float(value));
        cx.add_variable_from_value("baseline", baseline.map(Cel::Float).unwrap_or(Cel::Null));
        let eval =
            |c: &Option<(String, std::sync::Arc<Program>)>| -> Option<Result<bool, NoNumber>> {
                c.as_ref().map(|(text, p)| match p.execute(&cx) {
                    Ok(Cel::Bool(b)) => Ok(b),
                    Ok(other) => Err(NoNumber::new(format!(
                        "{text:?} gave {}, not a bool",
                        other.type_of()
                    ))),
                    Err(e) => Err(NoNumber::new(format!("{text:?}: {e}"))),
                })
            };
        let (success, failure) = match (eval(&def.success), eval(&def.failure)) {
            (Some(Err(e)), _) | (_, Some(Err(e))) => {
                m.reason = format!("condition not evaluated: {e}");
                return m;
            }
            (s, f) => (s.map(|r| r.is_ok_and(|b| b)), f.map(|r| r.is_ok_and(|b| b))),
        };
        let shown = |c: &Option<(String, std::sync::Arc<Program>)>| {
            c.as_ref().map(|(t, _)| t.clone()).unwrap_or_default()
        };
        let (verdict, reason) = match (success, failure) {
            (_, Some(true)) => (
                Verdict::Failed,
                format!("failure condition holds: {}", shown(&def.failure)),
            ),
            (Some(false), None) => (
                Verdict::Failed,
                format!("success condition does not hold: {}", shown(&def.success)),
            ),
            (Some(true), _) | (None, Some(false)) => {
                (Verdict::Successful, "within the conditions".into())
            }
            (Some(false), Some(false)) => (
                Verdict::Inconclusive,
                "neither the success nor the failure condition holds".into(),
            ),
            (None, None) => (Verdict::Inconclusive, "no condition".into()),
        };
        m.verdict = verdict;
        m.reason = reason;
        m
    }
}

/// The median of the numbers there are (`None` for none).
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Where an analysis run stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Conclusion {
    /// More measurements to take.
    Running,
    /// Every metric on every cluster measured `count` times within the limits.
    Passed,
    /// A metric on a cluster failed more often than `failure_limit`.
    Failed(String),
    /// A metric on a cluster was inconclusive more often than `inconclusive_limit`.
    Inconclusive(String),
}

/// The measurements of one batch so far, per metric and cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    /// Per (metric, cluster): successful, failed, inconclusive measurements, and errors in a row.
    counts: BTreeMap<(String, String), [u32; 4]>,
    /// Every measurement, in order (what the history shows).
    pub measurements: Vec<Measurement>,
}

impl Tally {
    /// Adds a measurement of analysis `a`, and returns it as counted: an error one more than `a`'s
    /// `consecutive_error_limit` in a row is inconclusive.
    pub fn add(&mut self, a: &Compiled, mut m: Measurement) -> Measurement {
        let c = self
            .counts
            .entry((m.metric.clone(), m.cluster.clone()))
            .or_default();
        if m.verdict == Verdict::Error {
            c[3] += 1;
            if c[3] > a.consecutive_error_limit {
                m.verdict = Verdict::Inconclusive;
                m.reason = format!(
                    "{} errors in a row (limit {}): {}",
                    c[3], a.consecutive_error_limit, m.reason
                );
                c[3] = 0;
            }
        } else {
            c[3] = 0;
        }
        match m.verdict {
            Verdict::Successful => c[0] += 1,
            Verdict::Failed => c[1] += 1,
            Verdict::Inconclusive => c[2] += 1,
            Verdict::Error => {}
        }
        self.measurements.push(m.clone());
        m
    }

    /// Measurements counted (successful, failed or inconclusive) of `metric` on `cluster`.
    pub fn counted(&self, metric: &str, cluster: &str) -> u32 {
        self.counts
            .get(&(metric.to_string(), cluster.to_string()))
            .map(|c| c[..3].iter().sum())
            .unwrap_or(0)
    }

    /// Rounds measured so far: the fewest measurements of any metric on any of `clusters`.
    pub fn rounds(&self, a: &Compiled, clusters: &[String]) -> u32 {
        a.metrics()
            .flat_map(|m| clusters.iter().map(move |c| (m, c)))
            .map(|(m, c)| self.counted(m, c))
            .min()
            .unwrap_or(0)
    }

    /// Where the run stands for `clusters`.
    pub fn conclusion(&self, a: &Compiled, clusters: &[String]) -> Conclusion {
        let last = |metric: &str, cluster: &str| {
            self.measurements
                .iter()
                .rev()
                .find(|m| m.metric == metric && m.cluster == cluster)
                .map(|m| m.reason.clone())
                .unwrap_or_default()
        };
        for ((metric, cluster), [_, failed, inconclusive, _]) in &self.counts {
            if !clusters.contains(cluster) {
                continue;
            }
            if *failed > a.failure_limit {
                return Conclusion::Failed(format!(
                    "{metric} on {cluster}: {failed} failed measurements (limit {}): {}",
                    a.failure_limit,
                    last(metric, cluster)
                ));
            }
            if *inconclusive > a.inconclusive_limit {
                return Conclusion::Inconclusive(format!(
                    "{metric} on {cluster}: {inconclusive} inconclusive measurements (limit {}): {}",
                    a.inconclusive_limit,
                    last(metric, cluster)
                ));
            }
        }
        if self.rounds(a, clusters) >= a.count {
            Conclusion::Passed
        } else {
            Conclusion::Running
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn analysis(yaml: &str) -> Analysis {
        serde_yaml::from_str(yaml).expect("analysis parses")
    }

    fn compiled(yaml: &str) -> Compiled {
        analysis(yaml)
            .compile(Duration::from_secs(120))
            .expect("compiles")
    }

    #[test]
    fn templates_fill_their_placeholders_and_compile() {
        let a = compiled(
            "metrics: [{name: e, template: error-ratio}, {name: r, template: restarts}, {name: ready, template: readiness}]",
        );
        assert_eq!(a.count, 4, "120 s soak / 30 s interval");
        let q = a.queries(
            &Target {
                cluster: "prod-1".into(),
                namespaces: vec!["shop".into()],
                workloads: vec!["web".into(), "api.v2".into()],
                scrape_interval: Some(Duration::from_secs(15)),
                done: Vec::new(),
            },
            Duration::from_secs(60),
        );
        assert_eq!(q.len(), 3);
        assert_eq!(
            q[0].1,
            "(sum(rate(http_requests_total{cluster=\"prod-1\",namespace=~\"shop\",deployment=~\"api\\\\.v2|web\",code=~\"5..\"}[1m])) or vector(0)) / sum(rate(http_requests_total{cluster=\"prod-1\",namespace=~\"shop\",deployment=~\"api\\\\.v2|web\"}[1m]))"
        );
        assert!(
            q[1].1.contains("pod=~\"(api\\\\.v2|web)-.*\""),
            "{}",
            q[1].1
        );
        for (_, q) in &q {
            assert!(!q.contains("{{"), "{q}");
        }
    }

    #[test]
    fn bad_analyses_are_refused_with_what_is_wrong() {
        let err = |yaml: &str| {
            analysis(yaml)
                .compile(Duration::from_secs(60))
                .expect_err("refused")
                .to_string()
        };
        assert!(err("metrics: []").contains("no metric"));
        assert!(
            err("metrics: [{name: x, template: latency}]")
                .contains("no template \"latency\" (there are: error-ratio, restarts, readiness)")
        );
        assert!(
            err("metrics: [{name: x, success: result < 1}]").contains("give a query or a template")
        );
        assert!(
            err("metrics: [{name: x, query: up}]")
                .contains("give a success or a failure condition")
        );
        let e = err(
            "metrics: [{name: x, query: 'up{cluster=\"{{clustr}}\"}', success: result == 1.0}]",
        );
        assert!(e.contains("unknown placeholder {{clustr}}"), "{e}");
        let e = err("metrics: [{name: x, query: up, success: 'result <'}]");
        assert!(
            e.contains("the success condition \"result <\" does not compile"),
            "{e}"
        );
        assert!(
            err("interval: 0s\nmetrics: [{name: x, query: up, success: 'true'}]")
                .contains("interval must be more than zero")
        );
        assert!(err("metrics: [{name: x, query: up, success: 'true'}, {name: x, query: up, success: 'true'}]").contains("two metrics are named \"x\""));
        assert!(serde_yaml::from_str::<Analysis>("metrics: []\nintervall: 1s").is_err());
    }

    #[test]
    fn measurements_follow_argo_rollouts_conditions() {
        let a = compiled(
            "metrics:\n- {name: s, query: up, success: result < 0.1}\n- {name: f, query: up, failure: result > 0.5}\n- {name: both, query: up, success: result < 0.1, failure: result > 0.5}\n- {name: base, query: up, failure: 'baseline != null && result > baseline * 2.0'}",
        );
        let v = |m: &str, x: f64, b: Option<f64>| a.judge(m, "c", Ok(x), b).verdict;
        use Verdict::*;
        assert_eq!(v("s", 0.05, None), Successful);
        assert_eq!(
            v("s", 0.2, None),
            Failed,
            "only success given, and it does not hold"
        );
        assert_eq!(
            v("f", 0.2, None),
            Successful,
            "only failure given, and it does not hold"
        );
        assert_eq!(v("f", 0.9, None), Failed);
        assert_eq!(v("both", 0.3, None), Inconclusive);
        assert_eq!(v("both", 0.9, None), Failed);
        assert_eq!(
            v("base", 0.3, Some(0.1)),
            Failed,
            "three times the baseline"
        );
        assert_eq!(v("base", 0.3, Some(0.2)), Successful);
        assert_eq!(
            v("base", 0.3, None),
            Successful,
            "no baseline: a fixed threshold decides"
        );
        let empty = a.judge("s", "c", Err(NoNumber::no_sample()), None);
        assert_eq!(empty.verdict, Error, "no data yet: asked again");
        assert_eq!(empty.reason, "the query answered no sample");
        let two = a.judge("s", "c", Err(NoNumber::new("2 samples, not one")), None);
        assert_eq!(two.verdict, Inconclusive);
        assert_eq!(
            a.judge("s", "c", Ok(f64::NAN), None).verdict,
            Error,
            "0/0: no requests in the range yet"
        );
        assert_eq!(
            a.judge("s", "c", Ok(f64::INFINITY), None).verdict,
            Inconclusive
        );
        // a condition that fails to evaluate (an int compared with a float is fine in CEL? a string is not)
        let odd = compiled("metrics: [{name: o, query: up, success: 'result < \"x\"'}]");
        let m = odd.judge("o", "c", Ok(1.0), None);
        assert_eq!(m.verdict, Inconclusive, "{m:?}");
        assert!(
            m.reason.starts_with("condition not evaluated"),
            "{}",
            m.reason
        );
    }

    #[test]
    fn the_restarts_check_judges_against_the_fleets_own_restarts() {
        let a = compiled("metrics: [{name: r, template: restarts}]");
        let v = |x: f64, b: Option<f64>| a.judge("r", "c", Ok(x), b).verdict;
        assert_eq!(v(0.0, Some(0.0)), Verdict::Successful);
        assert_eq!(
            v(2.0, Some(0.0)),
            Verdict::Failed,
            "restarts where the baseline has none"
        );
        assert_eq!(
            v(13.8, Some(12.8)),
            Verdict::Successful,
            "as often as the rest of the fleet"
        );
        assert_eq!(v(30.0, Some(12.8)), Verdict::Failed);
        assert_eq!(
            v(2.0, None),
            Verdict::Successful,
            "no baseline: a fixed threshold of 3"
        );
        assert_eq!(v(3.0, None), Verdict::Failed);
    }

    #[test]
    fn a_run_fails_holds_or_passes_by_its_limits() {
        let a = compiled(
            "count: 2\nfailure_limit: 1\nmetrics: [{name: e, query: up, success: result < 0.1}]",
        );
        let clusters = vec!["a".to_string(), "b".to_string()];
        let mut t = Tally::default();
        assert_eq!(t.conclusion(&a, &clusters), Conclusion::Running);
        t.add(&a, a.judge("e", "a", Ok(0.0), None));
        t.add(&a, a.judge("e", "b", Ok(0.5), None));
        assert_eq!(
            t.conclusion(&a, &clusters),
            Conclusion::Running,
            "one failure is within the limit"
        );
        t.add(&a, a.judge("e", "a", Ok(0.0), None));
        t.add(&a, a.judge("e", "b", Ok(0.0), None));
        assert_eq!(t.conclusion(&a, &clusters), Conclusion::Passed);
        t.add(&a, a.judge("e", "b", Ok(0.7), None));
        match t.conclusion(&a, &clusters) {
            Conclusion::Failed(why) => assert!(
                why.starts_with("e on b: 2 failed measurements (limit 1)"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
        let mut t = Tally::default();
        t.add(&a, a.judge("e", "a", Err(NoNumber::new("2 samples")), None));
        match t.conclusion(&a, &clusters) {
            Conclusion::Inconclusive(why) => assert!(why.contains("2 samples"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_number_yet_is_asked_again_up_to_the_error_limit_in_a_row() {
        let a = compiled(
            "count: 2\nconsecutive_error_limit: 2\nmetrics: [{name: e, query: up, success: result < 0.1}]",
        );
        let clusters = vec!["a".to_string()];
        let none = || Err(NoNumber::no_sample());
        let mut t = Tally::default();
        // a new workload: two rounds without data, then two good ones
        for _ in 0..2 {
            let m = t.add(&a, a.judge("e", "a", none(), None));
            assert_eq!(m.verdict, Verdict::Error, "{m:?}");
            assert_eq!(t.conclusion(&a, &clusters), Conclusion::Running);
        }
        assert_eq!(t.rounds(&a, &clusters), 0, "errors are not measurements");
        t.add(&a, a.judge("e", "a", Ok(0.0), None));
        // the streak starts over after a number
        for _ in 0..2 {
            t.add(&a, a.judge("e", "a", none(), None));
        }
        assert_eq!(t.conclusion(&a, &clusters), Conclusion::Running);
        t.add(&a, a.judge("e", "a", Ok(0.0), None));
        assert_eq!(t.conclusion(&a, &clusters), Conclusion::Passed);
        assert_eq!(t.measurements.len(), 6, "every answer is in the history");

        // one more than the limit in a row is inconclusive, and says why
        let mut t = Tally::default();
        for _ in 0..2 {
            t.add(&a, a.judge("e", "a", none(), None));
        }
        let m = t.add(&a, a.judge("e", "a", none(), None));
        assert_eq!(m.verdict, Verdict::Inconclusive);
        assert_eq!(
            m.reason,
            "3 errors in a row (limit 2): the query answered no sample"
        );
        match t.conclusion(&a, &clusters) {
            Conclusion::Inconclusive(why) => {
                assert!(why.contains("3 errors in a row"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            compiled("metrics: [{name: e, query: up, success: result < 0.1}]")
                .consecutive_error_limit,
            4,
            "Argo Rollouts' default"
        );
    }

    #[test]
    fn the_rate_interval_holds_two_scrapes_of_each_cluster() {
        let a = compiled(
            "interval: 10s\nmetrics: [{name: e, template: error-ratio}, {name: mine, query: 'sum(rate(x{cluster=\"{{cluster}}\"}[{{interval}}]))', success: result < 1}]",
        );
        let target = |scrape_s: Option<u64>| Target {
            cluster: "c".into(),
            scrape_interval: scrape_s.map(Duration::from_secs),
            ..Target::default()
        };
        // Grafana's $__rate_interval: max(interval + scrape, 4 × scrape) of the round's slowest scrape;
        // 30 s when the agent did not say (or said 0)
        for (scrapes, want, delay) in [
            (vec![None], "[2m]", 110),
            (vec![Some(15)], "[1m]", 50),
            (vec![Some(1)], "[11s]", 2),
            (vec![Some(1), Some(15)], "[1m]", 50),
            (vec![Some(0)], "[2m]", 110),
        ] {
            let round: Vec<Target> = scrapes.iter().map(|s| target(*s)).collect();
            let rate = a.rate_interval(&round, &[]);
            let q = a.queries(&round[0], rate);
            assert!(q[0].1.contains(want), "{scrapes:?}: {}", q[0].1);
            assert!(q[1].1.contains("[10s]"), "{{{{interval}}}} as given");
            // the first range starts once the batch is healthy, and holds two scrapes
            assert_eq!(
                a.initial_delay(&round, &[]),
                Duration::from_secs(delay),
                "{scrapes:?}"
            );
        }
        let given = compiled(
            "interval: 10s\ninitial_delay: 0s\nmetrics: [{name: e, template: error-ratio}]",
        );
        assert_eq!(given.initial_delay(&[target(None)], &[]), Duration::ZERO);
        assert_eq!(
            a.rate_interval(&[], &[]),
            Duration::from_secs(120),
            "no cluster: the default scrape"
        );
    }

    #[test]
    fn a_rate_over_a_range_too_short_for_two_scrapes_says_so() {
        let a = compiled(
            "interval: 10s\nmetrics: [{name: e, template: error-ratio}, {name: mine, query: 'sum(rate(x{cluster=\"{{cluster}}\"}[{{interval}}]))', success: result < 1}, {name: max, query: 'max(max_over_time(x[{{interval}}]))', success: result < 1}, {name: sub, query: 'max(rate(x[5m])[{{interval}}:1s])', success: result < 1}]",
        );
        let target = |scrape_s: u64| Target {
            cluster: "c".into(),
            scrape_interval: Some(Duration::from_secs(scrape_s)),
            ..Target::default()
        };
        let hint = "the query answered no sample: its range [10s] is shorter than two of c's scrapes (6s apart): use [{{rate_interval}}]";
        // shorter than two scrapes: answers now and then — said, and asked again
        let e = a
            .explain("mine", &target(6), Err(NoNumber::no_sample()))
            .expect_err("no number");
        assert_eq!((e.reason.as_str(), e.retry()), (hint, true));
        // no longer than one: never answers — inconclusive at once
        let e = a
            .explain("mine", &target(10), Err(NoNumber::no_sample()))
            .expect_err("no number");
        assert!(!e.retry(), "{e:?}");
        assert!(
            e.reason.ends_with("(10s apart): use [{{rate_interval}}]"),
            "{e:?}"
        );
        // not said: a range long enough, the template's rate interval, a function that needs one sample, a
        // subquery's range, an answer, the TSDB not answering
        let plain = |metric: &str, scrape: u64| {
            a.explain(metric, &target(scrape), Err(NoNumber::no_sample()))
                .expect_err("no number")
        };
        assert_eq!(plain("mine", 5), NoNumber::no_sample());
        for m in ["e", "max", "sub"] {
            assert_eq!(plain(m, 15), NoNumber::no_sample(), "{m}");
        }
        assert_eq!(a.explain("mine", &target(15), Ok(1.0)), Ok(1.0));
        // "never" only from a scrape interval the agent reported: the 30 s default is a guess
        let unknown = Target {
            cluster: "c".into(),
            ..Target::default()
        };
        let e = a
            .explain("mine", &unknown, Err(NoNumber::no_sample()))
            .expect_err("no number");
        assert!(e.retry() && e.reason.contains("(30s apart)"), "{e:?}");
        let down = NoNumber::unanswered("the TSDB at http://tsdb did not answer");
        assert_eq!(
            a.explain("mine", &target(15), Err(down.clone())),
            Err(down),
            "a TSDB down is not a range too short"
        );
    }

    #[test]
    fn two_sample_ranges_are_found_by_reading_the_query() {
        for (q, want) in [
            ("rate(x[{{interval}}])", true),
            ("sum by (le) (rate(x{a=\"b\"}[{{interval}}]))", true),
            (
                "increase (x{pod=~\"({{workloads}})-.*\"}[{{interval}}])",
                true,
            ),
            (
                "rate(x{deployment=~\"café(-canary)?\"}[{{interval}}])",
                true,
            ),
            ("rate(x{job=~'(a|b)'}[{{interval}}]) # é( here", true),
            ("max_over_time(x[{{interval}}])", false),
            ("resets(x[{{interval}}])", false),
            ("max(rate(x[5m])[{{interval}}:1s])", false),
            ("rate(x[{{rate_interval}}])", false),
            ("rate(x[1m]) + max_over_time(y[{{interval}}])", false),
            ("# rate(x[{{interval}}])\nup", false),
            (
                "label_replace(up, \"a\", \"rate(\", \"b\", \"\") > 0 and rate(x[{{interval}}])",
                true,
            ),
            ("é(((", false),
            ("\"unterminated (rate(x[{{interval}}])", false),
        ] {
            assert_eq!(two_sample_range(q), want, "{q}");
        }
    }

    #[test]
    fn bounds_keep_the_soak_finite() {
        let err = |yaml: &str| {
            analysis(yaml)
                .compile(Duration::from_secs(60))
                .expect_err("refused")
                .to_string()
        };
        let m = "metrics: [{name: x, query: up, success: 'true'}]";
        assert_eq!(
            err(&format!("interval: 2h\n{m}")),
            "analysis: interval must be at most 1h"
        );
        assert_eq!(
            err(&format!("initial_delay: 2d\n{m}")),
            "analysis: initial_delay must be at most 24h"
        );
        assert_eq!(
            err(&format!("count: 10001\n{m}")),
            "analysis: count must be at most 10000"
        );
        let a = analysis(&format!("interval: 1s\n{m}"))
            .compile(Duration::from_secs(u32::MAX as u64 * 10))
            .expect("compiles");
        assert_eq!(
            a.count, 10_000,
            "a long soak's default count is bounded too"
        );
    }

    #[test]
    fn medians_and_durations() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, f64::NAN, 2.0, 3.0]), Some(2.5));
        assert_eq!(promql_duration(Duration::from_secs(30)), "30s");
        assert_eq!(promql_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(alternation(&[]), "$^");
    }
}
