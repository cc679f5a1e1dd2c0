//! Prometheus recording and alerting rules, evaluated against the store with the PromQL [`Engine`].
//!
//! Rule files have Prometheus' format (`groups: [{name, interval, rules: [{record|alert, expr, for,
//! keep_firing_for, labels, annotations}]}]`) and are checked at load as `promtool check rules` does: a bad
//! file is refused with the file, group and rule named. Each group is evaluated on its interval at the
//! current time: a recording rule's result is written back into the store (`__name__` = `record`, plus the
//! rule's labels); an alerting rule's alerts go pending, fire once `for` has elapsed, stay firing
//! `keep_firing_for` after their condition clears, and are then resolved, as in Prometheus. Firing and
//! recently resolved alerts are posted to an Alertmanager-compatible `POST /api/v2/alerts` (the alert
//! router) after every evaluation, resolved ones with `endsAt`. Annotation and label templates use Go
//! template syntax for the forms rules commonly use (`{{ $labels.x }}`, `{{ $value }}`,
//! `{{ humanize $value }}`, `{{ $value | humanizePercentage }}`, `{{ printf "%.2f" $value }}`), translated to
//! minijinja. `ALERTS`/`ALERTS_FOR_STATE` series are not written. `GET /api/v1/rules`, `GET /api/v1/alerts`
//! and `POST /-/reload` are served by [`router`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use multipilot_schemas::payload::Sample;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::promql::{self, Engine, Value};
use crate::store::{Labels, METRIC_NAME};

/// Rule loading and evaluation failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A rule file could not be read (or a glob's directory listed).
    #[error("{file}: {source}")]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A rule file is not valid YAML, or has fields Prometheus does not know.
    #[error("{file}: {message}")]
    Yaml {
        /// The file.
        file: PathBuf,
        /// serde_yaml's message (line and column included).
        message: String,
    },
    /// A group is invalid (no name, a duplicate name, a bad interval).
    #[error("{file}: group {group:?}: {reason}")]
    Group {
        /// The file.
        file: PathBuf,
        /// The group.
        group: String,
        /// Why.
        reason: String,
    },
    /// A rule is invalid.
    #[error("{file}: group {group:?}, rule {index} ({name:?}): {reason}")]
    Rule {
        /// The file.
        file: PathBuf,
        /// The group.
        group: String,
        /// The rule's position in its group, from 1 (as promtool counts).
        index: usize,
        /// `record` or `alert`.
        name: String,
        /// Why.
        reason: String,
    },
    /// A query failed during evaluation (the rule stays loaded, its health `err`).
    #[error(transparent)]
    Query(#[from] promql::Error),
    /// A template failed to render.
    #[error("template: {0}")]
    Template(String),
}

impl Error {
    /// Only unreadable files may succeed on retry; bad rules never do.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Read { .. })
    }
}

/// Rules result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A rule file as Prometheus writes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDef {
    groups: Vec<GroupDef>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupDef {
    name: String,
    #[serde(default)]
    interval: Option<String>,
    #[serde(default)]
    query_offset: Option<String>,
    #[serde(default)]
    limit: Option<u64>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    rules: Vec<RuleDef>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleDef {
    #[serde(default)]
    record: Option<String>,
    #[serde(default)]
    alert: Option<String>,
    expr: serde_yaml::Value,
    #[serde(default, rename = "for")]
    for_: Option<String>,
    #[serde(default)]
    keep_firing_for: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// Prometheus' duration syntax: `1h30m`, `5m`, `90s`, `500ms`, `1d`, `1w`, `1y`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0u64;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let ms = match &rest[..unit] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "y" => 365 * 86_400_000,
            _ => return None,
        };
        total = total.checked_add(n.checked_mul(ms)?)?;
        rest = &rest[unit..];
    }
    Some(Duration::from_millis(total))
}

fn is_metric_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A rule's kind and its kind's settings.
#[derive(Debug)]
pub enum Kind {
    /// Writes `expr`'s result as the series `record`.
    Recording {
        /// The series name.
        record: String,
    },
    /// Alerts for every series of `expr`'s result.
    Alerting {
        /// `alertname`.
        alert: String,
        /// How long a condition holds before the alert fires.
        hold: Duration,
        /// How long the alert keeps firing after its condition clears.
        keep_firing_for: Duration,
        /// Annotation templates (translated to minijinja).
        annotations: BTreeMap<String, String>,
        /// Active alerts by label hash.
        active: BTreeMap<u64, Alert>,
    },
}

/// An alert's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertState {
    /// Resolved (kept a while to be re-sent with `endsAt`).
    Inactive,
    /// The condition holds, `for` has not elapsed.
    Pending,
    /// Firing.
    Firing,
}

/// One alert of an alerting rule.
#[derive(Debug, Clone)]
pub struct Alert {
    /// Labels (`alertname` and the rule's labels included).
    pub labels: BTreeMap<String, String>,
    /// Rendered annotations.
    pub annotations: BTreeMap<String, String>,
    /// State.
    pub state: AlertState,
    /// The value of the last evaluation that returned it.
    pub value: f64,
    /// When the condition started to hold (ms).
    pub active_at: i64,
    /// When it started firing (ms).
    pub fired_at: Option<i64>,
    /// When it was resolved (ms).
    pub resolved_at: Option<i64>,
    /// First evaluation its condition no longer held while `keep_firing_for` kept it firing.
    pub keep_firing_since: Option<i64>,
}

/// A rule.
#[derive(Debug)]
pub struct Rule {
    /// The expression.
    pub expr: String,
    /// Extra labels (templates for alerting rules).
    pub labels: BTreeMap<String, String>,
    /// Recording or alerting.
    pub kind: Kind,
    /// The last evaluation's error.
    pub last_error: Option<String>,
    /// The last evaluation (ms).
    pub last_evaluation: Option<i64>,
    /// How long the last evaluation took.
    pub evaluation_time: Duration,
}

impl Rule {
    /// `record` or `alert`.
    pub fn name(&self) -> &str {
        match &self.kind {
            Kind::Recording { record } => record,
            Kind::Alerting { alert, .. } => alert,
        }
    }
}

/// A group of rules evaluated together on one interval.
#[derive(Debug)]
pub struct Group {
    /// The file it came from.
    pub file: PathBuf,
    /// Its name.
    pub name: String,
    /// Evaluation interval.
    pub interval: Duration,
    /// The rules, in order (a later rule sees an earlier recording rule's output).
    pub rules: Vec<Rule>,
    /// The last evaluation (ms).
    pub last_evaluation: Option<i64>,
    /// How long it took.
    pub evaluation_time: Duration,
}

/// An alert in Alertmanager's `postableAlert` shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostableAlert {
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// When it became active.
    pub starts_at: DateTime<Utc>,
    /// When it resolved, or (firing) when the receiver may consider it resolved if not re-sent.
    pub ends_at: DateTime<Utc>,
    /// Where it came from.
    #[serde(rename = "generatorURL")]
    pub generator_url: String,
}

/// What one group evaluation produced.
#[derive(Debug, Default)]
pub struct Evaluated {
    /// Recording rules' samples (already appended when evaluated by [`Group::eval`]).
    pub samples: Vec<Sample>,
    /// Firing and recently resolved alerts to send.
    pub alerts: Vec<PostableAlert>,
}

/// Resolved alerts are kept (and re-sent) this long, as in Prometheus.
const RESOLVED_RETENTION_MS: i64 = 15 * 60_000;

fn template_env() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.add_filter("humanize", |v: f64| humanize(v));
    env.add_filter("humanizePercentage", |v: f64| {
        format!("{}%", format_g(v * 100.0, 4))
    });
    env.add_filter("humanizeDuration", |v: f64| humanize_duration(v));
    env.add_filter("goFloat", |v: f64| go_float(v));
    env.add_function("printf", printf);
    env
}

/// Go's `printf` for the verbs rule templates use: `%s`, `%v`, `%d`, `%f`, `%.Nf`, `%g`, `%%`.
fn printf(fmt: String, args: minijinja::value::Rest<minijinja::Value>) -> String {
    let mut out = String::new();
    let mut args = args.iter();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = String::new();
        while let Some(&n) = chars.peek() {
            chars.next();
            if n.is_ascii_alphabetic() || n == '%' {
                spec.push(n);
                break;
            }
            spec.push(n);
        }
        let verb = spec.pop().unwrap_or('v');
        if verb == '%' {
            out.push('%');
            continue;
        }
        let arg = args.next().cloned().unwrap_or_default();
        let num = f64::try_from(arg.clone()).ok();
        match (verb, num) {
            ('f', Some(v)) => {
                let prec = spec
                    .strip_prefix('.')
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(6);
                out.push_str(&format!("{v:.prec$}"));
            }
            ('d', Some(v)) => out.push_str(&format!("{}", v as i64)),
            ('g', Some(v)) => out.push_str(&format_g(v, 6)),
            _ => out.push_str(&arg.to_string()),
        }
    }
    out
}

/// Go's `%v` of a float64 (shortest representation, exponent below 1e-4 and from 1e21).
pub fn go_float(v: f64) -> String {
    if !v.is_finite() || v == 0.0 {
        return format_g(v, 4);
    }
    if v.abs() >= 1e21 || v.abs() < 1e-4 {
        format_e(v)
    } else {
        format!("{v}")
    }
}

/// Go's `%.{prec}g`.
pub fn format_g(v: f64, prec: usize) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let exp = format!("{:.*e}", prec.saturating_sub(1), v);
    let (mantissa, e) = exp.split_once('e').unwrap_or((&exp, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if e < -4 || e >= prec as i32 {
        let sign = if e < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), e.abs())
    } else {
        let decimals = (prec as i32 - 1 - e).max(0) as usize;
        trim(&format!("{v:.decimals$}"))
    }
}

/// Prometheus' `humanize`: SI prefixes, four significant digits.
pub fn humanize(v: f64) -> String {
    if v == 0.0 || v.is_nan() || v.is_infinite() {
        return format_g(v, 4);
    }
    let mut v = v;
    if v.abs() >= 1.0 {
        let mut prefix = "";
        for p in ["k", "M", "G", "T", "P", "E", "Z", "Y"] {
            if v.abs() < 1000.0 {
                break;
            }
            prefix = p;
            v /= 1000.0;
        }
        return format!("{}{prefix}", format_g(v, 4));
    }
    let mut prefix = "";
    for p in ["m", "u", "n", "p", "f", "a", "z", "y"] {
        if v.abs() >= 1.0 {
            break;
        }
        prefix = p;
        v *= 1000.0;
    }
    format!("{}{prefix}", format_g(v, 4))
}

/// Prometheus' `humanizeDuration` (seconds to `1d 2h 3m 4s`).
pub fn humanize_duration(v: f64) -> String {
    if v.is_nan() || v.is_infinite() {
        return format_g(v, 4);
    }
    if v.abs() >= 1.0 {
        let sign = if v < 0.0 { "-" } else { "" };
        let s = v.abs() as i64;
        let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
        return if d != 0 {
            format!("{sign}{d}d {h}h {m}m {sec}s")
        } else if h != 0 {
            format!("{sign}{h}h {m}m {sec}s")
        } else if m != 0 {
            format!("{sign}{m}m {sec}s")
        } else {
            format!("{sign}{sec}s")
        };
    }
    if v == 0.0 {
        return "0s".into();
    }
    format!("{}ms", format_g(v * 1000.0, 4))
}

/// Translates a Go template (the forms Prometheus rules use) to minijinja: `$labels.x`/`.Labels.x` →
/// `labels.x`, `$value`/`.Value` → `value`, `func arg` → `arg | func`, `printf "f" a` → `printf("f", a)`.
/// Control actions (`if`, `range`, …) are refused.
pub fn translate_template(src: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = src;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| "unclosed action: missing \"}}\"".to_string())?;
        let inner = after[..close].trim_matches(|c: char| c == '-' || c.is_whitespace());
        out.push_str("{{ ");
        out.push_str(&translate_action(inner)?);
        out.push_str(" }}");
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

fn translate_operand(op: &str) -> Result<String, String> {
    let op = op.trim();
    if op.starts_with('"') || op.parse::<f64>().is_ok() {
        return Ok(op.to_string());
    }
    let mapped = if let Some(rest) = op.strip_prefix("$labels") {
        format!("labels{rest}")
    } else if let Some(rest) = op.strip_prefix(".Labels") {
        format!("labels{rest}")
    } else if op == "$value" || op == ".Value" {
        "value".to_string()
    } else if op == "$externalLabels" || op == "$externalURL" {
        "none".to_string()
    } else {
        return Err(format!("unsupported template operand {op:?}"));
    };
    Ok(mapped)
}

fn split_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

const FILTERS: [&str; 3] = ["humanize", "humanizePercentage", "humanizeDuration"];

fn translate_action(inner: &str) -> Result<String, String> {
    let mut stages = Vec::new();
    for stage in inner.split('|') {
        let words = split_words(stage);
        let Some(first) = words.first() else {
            return Err("empty template action".into());
        };
        if [
            "if", "else", "end", "range", "with", "define", "template", "block",
        ]
        .contains(&first.as_str())
        {
            return Err(format!("unsupported template action {first:?}"));
        }
        stages.push(words);
    }
    let mut expr = String::new();
    for (i, words) in stages.into_iter().enumerate() {
        let f = words[0].as_str();
        if FILTERS.contains(&f) {
            if i == 0 {
                let arg = words
                    .get(1)
                    .ok_or_else(|| format!("{f} needs an argument"))?;
                expr = format!("{} | {f}", translate_operand(arg)?);
            } else {
                expr = format!("{expr} | {f}");
            }
        } else if f == "printf" {
            let mut args: Vec<String> = words[1..]
                .iter()
                .map(|w| translate_operand(w))
                .collect::<Result<_, _>>()?;
            if i > 0 {
                args.push(std::mem::take(&mut expr));
            }
            expr = format!("printf({})", args.join(", "));
        } else if i == 0 && words.len() == 1 {
            expr = translate_operand(f)?;
        } else {
            return Err(format!("unsupported template function {f:?}"));
        }
    }
    if expr == "value" {
        // printed as Go prints a float64 (`2000`, not `2000.0`)
        expr = "value | goFloat".into();
    }
    Ok(expr)
}

fn render(
    env: &minijinja::Environment<'_>,
    template: &str,
    labels: &BTreeMap<String, String>,
    value: f64,
) -> Result<String> {
    let src = translate_template(template).map_err(Error::Template)?;
    env.render_str(
        &src,
        minijinja::context! { labels => labels, value => value },
    )
    .map_err(|e| Error::Template(e.to_string()))
}

/// Expands the `*`/`?` globs of a rule-file list (in the file name only), sorted.
pub fn expand_globs(patterns: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in patterns {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !name.contains(['*', '?']) {
            out.push(p.clone());
            continue;
        }
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
        let dir = dir.unwrap_or(Path::new("."));
        let re = regex::Regex::new(&format!(
            "^{}$",
            regex::escape(name)
                .replace(r"\*", "[^/]*")
                .replace(r"\?", ".")
        ))
        .expect("escaped glob is a valid regex");
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|source| Error::Read {
                file: p.clone(),
                source,
            })?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_str().is_some_and(|n| re.is_match(n)))
            .map(|e| e.path())
            .collect();
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// Loads and checks rule files (globs expanded); the first bad file or rule fails the whole load.
pub fn load_files(patterns: &[PathBuf], default_interval: Duration) -> Result<Vec<Group>> {
    let mut groups = Vec::new();
    for file in expand_globs(patterns)? {
        let text = std::fs::read_to_string(&file).map_err(|source| Error::Read {
            file: file.clone(),
            source,
        })?;
        groups.extend(parse_file(&file, &text, default_interval)?);
    }
    Ok(groups)
}

/// Parses and checks one rule file's text.
pub fn parse_file(file: &Path, text: &str, default_interval: Duration) -> Result<Vec<Group>> {
    let def: FileDef = serde_yaml::from_str(text).map_err(|e| Error::Yaml {
        file: file.to_path_buf(),
        message: e.to_string(),
    })?;
    let env = template_env();
    let mut names = std::collections::HashSet::new();
    let mut groups = Vec::new();
    for g in def.groups {
        let group_err = |reason: String| Error::Group {
            file: file.to_path_buf(),
            group: g.name.clone(),
            reason,
        };
        if g.name.is_empty() {
            return Err(group_err("group name must not be empty".into()));
        }
        if !names.insert(g.name.clone()) {
            return Err(group_err("repeated in the same file".into()));
        }
        let interval = match &g.interval {
            Some(s) => match parse_duration(s) {
                Some(d) if !d.is_zero() => d,
                _ => return Err(group_err(format!("invalid interval {s:?}"))),
            },
            None => default_interval,
        };
        if let Some(s) = &g.query_offset
            && parse_duration(s).is_none()
        {
            return Err(group_err(format!("invalid query_offset {s:?}")));
        }
        let _ = g.limit;
        let mut rules = Vec::new();
        for (i, r) in g.rules.into_iter().enumerate() {
            let name = r.record.clone().or(r.alert.clone()).unwrap_or_default();
            let err = |reason: String| Error::Rule {
                file: file.to_path_buf(),
                group: g.name.clone(),
                index: i + 1,
                name: name.clone(),
                reason,
            };
            let expr = match &r.expr {
                serde_yaml::Value::String(s) => s.clone(),
                serde_yaml::Value::Number(n) => n.to_string(),
                _ => return Err(err("field 'expr' must be a string".into())),
            };
            if expr.trim().is_empty() {
                return Err(err("field 'expr' must be set in rule".into()));
            }
            promql::parse(&expr).map_err(|e| err(format!("could not parse expression: {e}")))?;
            let mut labels = g.labels.clone();
            labels.extend(r.labels.clone());
            for k in labels.keys() {
                if !is_label_name(k) || k == METRIC_NAME {
                    return Err(err(format!("invalid label name: {k}")));
                }
            }
            let kind = match (r.record, r.alert) {
                (Some(_), Some(_)) => {
                    return Err(err("only one of 'record' and 'alert' must be set".into()));
                }
                (None, None) => {
                    return Err(err("one of 'record' or 'alert' must be set".into()));
                }
                (Some(record), None) => {
                    if !is_metric_name(&record) {
                        return Err(err(format!("invalid recording rule name: {record}")));
                    }
                    if !r.annotations.is_empty() {
                        return Err(err("invalid field 'annotations' in recording rule".into()));
                    }
                    if r.for_.is_some() {
                        return Err(err("invalid field 'for' in recording rule".into()));
                    }
                    if r.keep_firing_for.is_some() {
                        return Err(err(
                            "invalid field 'keep_firing_for' in recording rule".into()
                        ));
                    }
                    Kind::Recording { record }
                }
                (None, Some(alert)) => {
                    if alert.is_empty() {
                        return Err(err("invalid alert name: empty".into()));
                    }
                    let dur = |field: &str, v: &Option<String>| match v {
                        None => Ok(Duration::ZERO),
                        Some(s) => parse_duration(s)
                            .ok_or_else(|| err(format!("invalid duration in '{field}': {s:?}"))),
                    };
                    let hold = dur("for", &r.for_)?;
                    let keep_firing_for = dur("keep_firing_for", &r.keep_firing_for)?;
                    for (k, t) in r.annotations.iter().chain(labels.iter()) {
                        if !is_label_name(k) {
                            return Err(err(format!("invalid annotation name: {k}")));
                        }
                        let src = translate_template(t)
                            .map_err(|e| err(format!("template of {k:?}: {e}")))?;
                        env.template_from_str(&src)
                            .map_err(|e| err(format!("template of {k:?}: {e}")))?;
                    }
                    Kind::Alerting {
                        alert,
                        hold,
                        keep_firing_for,
                        annotations: r.annotations,
                        active: BTreeMap::new(),
                    }
                }
            };
            rules.push(Rule {
                expr,
                labels,
                kind,
                last_error: None,
                last_evaluation: None,
                evaluation_time: Duration::ZERO,
            });
        }
        groups.push(Group {
            file: file.to_path_buf(),
            name: g.name,
            interval,
            rules,
            last_evaluation: None,
            evaluation_time: Duration::ZERO,
        });
    }
    Ok(groups)
}

fn hash_labels(labels: &BTreeMap<String, String>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    labels.hash(&mut h);
    h.finish()
}

fn ms_to_time(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

/// One sample per series of an instant query's result (a scalar as one series without labels).
fn instant_samples(value: Value) -> Result<Vec<(Labels, f64)>> {
    Ok(match value {
        Value::Vector(series) => series
            .into_iter()
            .filter_map(|s| s.values.first().copied().flatten().map(|v| (s.labels, v)))
            .collect(),
        Value::Scalar(v) => v.first().map(|v| (Vec::new(), *v)).into_iter().collect(),
        Value::Matrix(_) | Value::String(_) => {
            return Err(promql::Error::BadData(
                "rule expressions must return an instant vector or a scalar".into(),
            )
            .into());
        }
    })
}

impl Group {
    /// Evaluates every rule at `ts` (ms): recording rules' samples are appended to the engine's store
    /// before the next rule runs; returns the samples written and the alerts to send. A failing rule is
    /// recorded in its `last_error` and the others still run. `generator` is the base of `generatorURL`.
    pub fn eval(&mut self, engine: &Engine, ts: i64, generator: &str) -> Evaluated {
        let started = std::time::Instant::now();
        let env = template_env();
        let mut out = Evaluated::default();
        for rule in &mut self.rules {
            let t0 = std::time::Instant::now();
            let result = rule.eval(engine, &env, ts, generator, &mut out);
            rule.last_error = result.err().map(|e| {
                tracing::warn!(group = %self.name, rule = %rule.name(), error = %e, "rule evaluation failed");
                e.to_string()
            });
            rule.last_evaluation = Some(ts);
            rule.evaluation_time = t0.elapsed();
        }
        self.last_evaluation = Some(ts);
        self.evaluation_time = started.elapsed();
        out
    }
}

impl Rule {
    fn eval(
        &mut self,
        engine: &Engine,
        env: &minijinja::Environment<'_>,
        ts: i64,
        generator: &str,
        out: &mut Evaluated,
    ) -> Result<()> {
        let samples = instant_samples(engine.instant(&self.expr, ts)?)?;
        match &mut self.kind {
            Kind::Recording { record } => {
                let mut written = Vec::with_capacity(samples.len());
                for (labels, v) in samples {
                    let mut l: BTreeMap<String, String> = labels
                        .into_iter()
                        .filter(|(k, _)| k != METRIC_NAME)
                        .collect();
                    l.extend(self.labels.clone());
                    written.push(Sample {
                        name: record.clone(),
                        labels: l,
                        value: v,
                        timestamp_ms: ts,
                    });
                }
                engine
                    .store()
                    .append("", &written)
                    .map_err(promql::Error::from)?;
                out.samples.extend(written);
            }
            Kind::Alerting {
                alert,
                hold,
                keep_firing_for,
                annotations,
                active,
            } => {
                let mut seen = std::collections::HashSet::new();
                for (labels, v) in samples {
                    let base: BTreeMap<String, String> = labels
                        .into_iter()
                        .filter(|(k, _)| k != METRIC_NAME)
                        .collect();
                    let mut l = base.clone();
                    for (k, t) in &self.labels {
                        l.insert(k.clone(), render(env, t, &base, v)?);
                    }
                    l.insert("alertname".into(), alert.clone());
                    let ann = annotations
                        .iter()
                        .map(|(k, t)| Ok((k.clone(), render(env, t, &base, v)?)))
                        .collect::<Result<BTreeMap<_, _>>>()?;
                    let h = hash_labels(&l);
                    seen.insert(h);
                    match active.get_mut(&h) {
                        Some(a) if a.state != AlertState::Inactive => {
                            a.value = v;
                            a.annotations = ann;
                            a.keep_firing_since = None;
                        }
                        _ => {
                            active.insert(
                                h,
                                Alert {
                                    labels: l,
                                    annotations: ann,
                                    state: AlertState::Pending,
                                    value: v,
                                    active_at: ts,
                                    fired_at: None,
                                    resolved_at: None,
                                    keep_firing_since: None,
                                },
                            );
                        }
                    }
                }
                let hold_ms = hold.as_millis() as i64;
                let keep_ms = keep_firing_for.as_millis() as i64;
                active.retain(|h, a| {
                    if seen.contains(h) {
                        if a.state == AlertState::Pending && ts - a.active_at >= hold_ms {
                            a.state = AlertState::Firing;
                            a.fired_at = Some(ts);
                        }
                        return true;
                    }
                    match a.state {
                        AlertState::Pending => false,
                        AlertState::Inactive => a
                            .resolved_at
                            .is_some_and(|r| ts - r <= RESOLVED_RETENTION_MS),
                        AlertState::Firing => {
                            let since = *a.keep_firing_since.get_or_insert(ts);
                            if keep_ms == 0 || ts - since >= keep_ms {
                                a.state = AlertState::Inactive;
                                a.resolved_at = Some(ts);
                            }
                            true
                        }
                    }
                });
                let url = format!(
                    "{generator}/graph?{}",
                    serde_urlencoded::to_string([("g0.expr", self.expr.as_str()), ("g0.tab", "1")])
                        .unwrap_or_default()
                );
                for a in active.values() {
                    let ends_at = match a.state {
                        AlertState::Pending => continue,
                        // Prometheus: 4 × the resend interval, so a receiver resolves it if we stop.
                        AlertState::Firing => ts + 4 * 60_000,
                        AlertState::Inactive => a.resolved_at.unwrap_or(ts),
                    };
                    out.alerts.push(PostableAlert {
                        labels: a.labels.clone(),
                        annotations: a.annotations.clone(),
                        starts_at: ms_to_time(a.fired_at.unwrap_or(a.active_at)),
                        ends_at: ms_to_time(ends_at),
                        generator_url: url.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Where alerts are sent.
#[derive(Debug, Clone)]
pub struct Notifier {
    client: reqwest::Client,
    url: String,
    token: Option<String>,
}

impl Notifier {
    /// Posts to `<base>/api/v2/alerts`, with `token` as a bearer token when set.
    pub fn new(base: &str, token: Option<String>) -> Self {
        Notifier {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap_or_default(),
            url: format!("{}/api/v2/alerts", base.trim_end_matches('/')),
            token,
        }
    }

    /// Sends alerts (a failure is logged: the next evaluation sends them again).
    pub async fn send(&self, alerts: &[PostableAlert]) {
        if alerts.is_empty() {
            return;
        }
        let mut req = self.client.post(&self.url).json(alerts);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => {
                tracing::warn!(url = %self.url, status = %r.status(), "alertmanager refused alerts")
            }
            Err(e) => tracing::warn!(url = %self.url, error = %e, "could not send alerts"),
        }
    }
}

/// The loaded groups, their evaluation loop and reloads.
#[derive(Debug)]
pub struct Manager {
    groups: Mutex<Vec<Group>>,
    files: Vec<PathBuf>,
    default_interval: Duration,
    engine: Engine,
    notifier: Option<Notifier>,
    generator: String,
}

impl Manager {
    /// Loads `files`; fails on the first bad file or rule (the role must not start on it).
    pub fn new(
        files: Vec<PathBuf>,
        default_interval: Duration,
        engine: Engine,
        notifier: Option<Notifier>,
        generator: String,
    ) -> Result<Self> {
        let groups = load_files(&files, default_interval)?;
        tracing::info!(
            groups = groups.len(),
            rules = groups.iter().map(|g| g.rules.len()).sum::<usize>(),
            "rules loaded"
        );
        Ok(Manager {
            groups: Mutex::new(groups),
            files,
            default_interval,
            engine,
            notifier,
            generator,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Group>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reloads the files; on an error the loaded rules keep running. Alert state carries over to a rule
    /// with the same group, name and expression.
    pub fn reload(&self) -> Result<()> {
        let mut fresh = load_files(&self.files, self.default_interval)?;
        let mut groups = self.lock();
        let mut old: HashMap<(PathBuf, String, String, String), BTreeMap<u64, Alert>> =
            HashMap::new();
        for g in groups.iter_mut() {
            for r in &mut g.rules {
                if let Kind::Alerting { alert, active, .. } = &mut r.kind {
                    old.insert(
                        (
                            g.file.clone(),
                            g.name.clone(),
                            alert.clone(),
                            r.expr.clone(),
                        ),
                        std::mem::take(active),
                    );
                }
            }
        }
        for g in &mut fresh {
            for r in &mut g.rules {
                if let Kind::Alerting { alert, active, .. } = &mut r.kind
                    && let Some(a) = old.remove(&(
                        g.file.clone(),
                        g.name.clone(),
                        alert.clone(),
                        r.expr.clone(),
                    ))
                {
                    *active = a;
                }
            }
        }
        *groups = fresh;
        tracing::info!(groups = groups.len(), "rules reloaded");
        Ok(())
    }

    /// Evaluates the groups due at `now` (ms) (never evaluated, or an interval since the last time),
    /// writes the recording rules' samples and returns the alerts to send.
    pub fn eval_due(&self, now: i64) -> Vec<PostableAlert> {
        let mut alerts = Vec::new();
        let mut groups = self.lock();
        for g in groups.iter_mut() {
            let due = g
                .last_evaluation
                .is_none_or(|last| now - last >= g.interval.as_millis() as i64);
            if due {
                alerts.extend(g.eval(&self.engine, now, &self.generator).alerts);
            }
        }
        alerts
    }

    /// Evaluates groups as they fall due, and reloads on SIGHUP, until `cancel`.
    pub async fn run(self: Arc<Self>, cancel: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            #[cfg(unix)]
            let hangup = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let hangup = std::future::pending::<Option<()>>();
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = hangup => {
                    if let Err(e) = self.reload() {
                        tracing::error!(error = %e, "rule reload failed; the loaded rules keep running");
                    }
                    continue;
                }
                _ = tick.tick() => {}
            }
            let me = self.clone();
            let now = Utc::now().timestamp_millis();
            let alerts = match tokio::task::spawn_blocking(move || me.eval_due(now)).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::error!(error = %e, "rule evaluation panicked");
                    continue;
                }
            };
            if let Err(e) = self.engine.store().commit().await {
                tracing::warn!(error = %e, "committing recorded samples failed");
            }
            if let Some(n) = &self.notifier {
                n.send(&alerts).await;
            }
        }
    }
}

fn rfc3339(ms: Option<i64>) -> String {
    ms.map(|m| ms_to_time(m).to_rfc3339_opts(SecondsFormat::Nanos, true))
        .unwrap_or_else(|| "0001-01-01T00:00:00Z".into())
}

/// Go's `strconv.FormatFloat(v, 'e', -1, 64)`, as `/api/v1/alerts` shows values.
fn format_e(v: f64) -> String {
    if !v.is_finite() {
        return format_g(v, 4);
    }
    let s = format!("{v:e}");
    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
}

fn alert_json(a: &Alert) -> serde_json::Value {
    json!({
        "labels": a.labels,
        "annotations": a.annotations,
        "state": a.state,
        "activeAt": rfc3339(Some(a.active_at)),
        "value": format_e(a.value),
    })
}

fn rules_json(m: &Manager) -> serde_json::Value {
    let groups = m.lock();
    let groups: Vec<_> = groups
        .iter()
        .map(|g| {
            let rules: Vec<_> = g
                .rules
                .iter()
                .map(|r| {
                    let health = match (&r.last_error, r.last_evaluation) {
                        (Some(_), _) => "err",
                        (None, Some(_)) => "ok",
                        (None, None) => "unknown",
                    };
                    let mut j = json!({
                        "name": r.name(),
                        "query": r.expr,
                        "labels": r.labels,
                        "health": health,
                        "lastError": r.last_error.clone().unwrap_or_default(),
                        "evaluationTime": r.evaluation_time.as_secs_f64(),
                        "lastEvaluation": rfc3339(r.last_evaluation),
                    });
                    match &r.kind {
                        Kind::Recording { .. } => j["type"] = json!("recording"),
                        Kind::Alerting {
                            hold,
                            keep_firing_for,
                            annotations,
                            active,
                            ..
                        } => {
                            let live: Vec<&Alert> = active
                                .values()
                                .filter(|a| a.state != AlertState::Inactive)
                                .collect();
                            let state = if live.iter().any(|a| a.state == AlertState::Firing) {
                                "firing"
                            } else if live.is_empty() {
                                "inactive"
                            } else {
                                "pending"
                            };
                            j["type"] = json!("alerting");
                            j["state"] = json!(state);
                            j["duration"] = json!(hold.as_secs_f64());
                            j["keepFiringFor"] = json!(keep_firing_for.as_secs_f64());
                            j["annotations"] = json!(annotations);
                            j["alerts"] = live.into_iter().map(alert_json).collect();
                        }
                    }
                    j
                })
                .collect();
            json!({
                "name": g.name,
                "file": g.file.display().to_string(),
                "interval": g.interval.as_secs_f64(),
                "limit": 0,
                "rules": rules,
                "evaluationTime": g.evaluation_time.as_secs_f64(),
                "lastEvaluation": rfc3339(g.last_evaluation),
            })
        })
        .collect();
    json!({ "status": "success", "data": { "groups": groups } })
}

fn alerts_json(m: &Manager) -> serde_json::Value {
    let groups = m.lock();
    let alerts: Vec<_> = groups
        .iter()
        .flat_map(|g| g.rules.iter())
        .filter_map(|r| match &r.kind {
            Kind::Alerting { active, .. } => Some(active.values()),
            Kind::Recording { .. } => None,
        })
        .flatten()
        .filter(|a| a.state != AlertState::Inactive)
        .map(alert_json)
        .collect();
    json!({ "status": "success", "data": { "alerts": alerts } })
}

/// `GET /api/v1/rules`, `GET /api/v1/alerts` (Prometheus' shapes) and `POST /-/reload` (a bad file answers
/// 500 with the reason; the loaded rules keep running).
pub fn router(manager: Arc<Manager>) -> axum::Router {
    axum::Router::new()
        .route(
            "/api/v1/rules",
            get(|State(m): State<Arc<Manager>>| async move {
                axum::Json(rules_json(&m)).into_response()
            }),
        )
        .route(
            "/api/v1/alerts",
            get(|State(m): State<Arc<Manager>>| async move {
                axum::Json(alerts_json(&m)).into_response()
            }),
        )
        .route(
            "/-/reload",
            post(|State(m): State<Arc<Manager>>| async move {
                let r = tokio::task::spawn_blocking(move || m.reload()).await;
                match r {
                    Ok(Ok(())) => (StatusCode::OK, "rules reloaded\n".to_string()).into_response(),
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "rule reload failed; the loaded rules keep running");
                        (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
                    }
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
                }
            }),
        )
        .with_state(manager)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_prometheus() {
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("m"), None);
    }

    #[test]
    fn numbers_humanize_like_go() {
        assert_eq!(humanize(1234.5), "1.234k");
        assert_eq!(humanize(12_345_678.0), "12.35M");
        assert_eq!(humanize(0.5), "500m");
        assert_eq!(humanize(3.0), "3");
        assert_eq!(humanize(0.0), "0");
        assert_eq!(format_g(1e-7, 4), "1e-07");
        assert_eq!(format_e(1.0), "1e+00");
        assert_eq!(format_e(0.25), "2.5e-01");
        assert_eq!(humanize_duration(3725.0), "1h 2m 5s");
    }

    #[test]
    fn go_templates_translate_to_minijinja() {
        assert_eq!(
            translate_template("{{ $labels.node }} at {{ humanize $value }}").unwrap(),
            "{{ labels.node }} at {{ value | humanize }}"
        );
        assert_eq!(
            translate_template("{{ $value | humanizePercentage }}").unwrap(),
            "{{ value | humanizePercentage }}"
        );
        assert_eq!(
            translate_template("{{ $value }}").unwrap(),
            "{{ value | goFloat }}"
        );
        assert_eq!(go_float(2000.0), "2000");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(
            translate_template(r#"{{ printf "%.2f" $value }}"#).unwrap(),
            r#"{{ printf("%.2f", value) }}"#
        );
        assert!(translate_template("{{ if $value }}x{{ end }}").is_err());
        let env = template_env();
        let labels = BTreeMap::from([("node".to_string(), "n1".to_string())]);
        assert_eq!(
            render(
                &env,
                r#"{{ $labels.node }}: {{ humanize $value }} ({{ printf "%.1f" $value }}) {{ $labels.missing }}."#,
                &labels,
                2048.0
            )
            .unwrap(),
            "n1: 2.048k (2048.0) ."
        );
    }
}
