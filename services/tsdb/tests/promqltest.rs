//! Prometheus' own PromQL conformance tests (`/work/shared/fixtures/promql/*.test`, the promqltest format
//! described in `FORMAT.md` there) run against this engine, the series held in memory
//! ([`Source::Gathered`], the seam the engine evaluates against; no NATS, no disk reads).
//!
//! Every `eval` is a case: it passes when the result matches (labels exactly, floats within promqltest's
//! relative tolerance of 1e-6, order only under `expect ordered`; `expect fail` needs an error, and the
//! message when one is given). Skipped, and counted with the reason, are only cases about native
//! histograms (`{{…}}` samples loaded or expected, the histogram series `load_with_nhcb` adds) and about
//! features Prometheus marks experimental. Annotations (`expect info/warn/no_info/no_warn`) are not
//! produced by this engine: those lines are not checked (counted in the output), the rest of the case is.
//!
//! Also skipped are the cases of `name_label_dropping.test` that only hold under delayed name removal
//! ([`DELAYED_NAME_REMOVAL`]): Prometheus' test engine turns that experimental feature
//! (`--enable-feature=promql-delayed-name-removal`) on, a Prometheus server has it off, and this engine
//! answers as the server does; `differential.rs` asks the same queries of a real Prometheus and agrees.
//!
//! Every case that is not skipped must pass; the test prints every failing case's first line, and also
//! fails when fewer cases pass than [`MIN_PASSED`] (so a skip rule can't quietly swallow passing cases).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use multipilot_tsdb::chunk::STALE_NAN_BITS;
use multipilot_tsdb::promql::{self, Engine, Gathered, Source, Value};
use multipilot_tsdb::store::{Labels, Options, Store};
use promql_parser::label::MatchOp;
use promql_parser::parser::Expr;

/// Cases that passed when this was last raised (of 1,281; see the README's TSDB section).
const MIN_PASSED: usize = 849;

/// The queries of `name_label_dropping.test` whose expected answer assumes delayed name removal: with it
/// off (Prometheus' default) the label functions and the aggregations over `rate` of two names fail with
/// "vector cannot contain metrics with the same labelset" (and the `expect fail` one succeeds), as a real
/// Prometheus does (see `differential.rs`), and the last three keep or drop `__name__` differently.
const DELAYED_NAME_REMOVAL: [&str; 9] = [
    r#"label_replace(rate({env="1"}[10m]), "my_name", "rate_$1", "__name__", "(.+)")"#,
    r#"label_replace(rate({env="1"}[10m]), "__name__", "rate_$1", "__name__", "(.+)")"#,
    r#"label_join(rate({env="1"}[10m]), "my_name", "_", "__name__")"#,
    r#"label_join(rate({env="1"}[10m]), "__name__", "_", "__name__", "env")"#,
    r#"sum by (__name__) (rate({env="1"}[10m]))"#,
    r#"sum(rate({env="1"}[10m])) by (env)"#,
    r#"label_replace(sum by (__name__) (rate(metric_total{env="2"}[5m])), "__name__", "$1", "__name__", "(.+)")"#,
    r#"sum by (__name__) (metric_total{env="1"} or rate(metric_total{env="2"}[5m]))"#,
    r#"sum by (__name__) (rate(metric_total{env="2"}[5m]) or metric_total{env="1"})"#,
];

/// promqltest's `defaultEpsilon`.
const EPSILON: f64 = 1e-6;

/// Functions and aggregations Prometheus 3.x (`promql/parser/functions.go`, `lex.go`) marks experimental
/// (enabled only with `--enable-feature=promql-experimental-functions`).
const EXPERIMENTAL: [&str; 18] = [
    "double_exponential_smoothing",
    "end",
    "first_over_time",
    "histogram_quantiles",
    "info",
    "integral",
    "limit_ratio",
    "limitk",
    "mad_over_time",
    "range",
    "sort_by_label",
    "sort_by_label_desc",
    "start",
    "step",
    "ts_of_first_over_time",
    "ts_of_last_over_time",
    "ts_of_max_over_time",
    "ts_of_min_over_time",
];

fn fixtures() -> PathBuf {
    std::env::var_os("PROMQL_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/shared/fixtures/promql"))
}

/// One value of a series line: a float, a histogram (`{{…}}`), or nothing (`_`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Point {
    Float(f64),
    Histogram,
    Omitted,
}

/// Milliseconds of a Prometheus duration (`1m`, `10s53ms`, `-1m`, `0`).
fn duration_ms(s: &str) -> Result<i64> {
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    if let Ok(n) = s.parse::<i64>() {
        // a bare number is seconds
        return Ok(if neg { -n * 1000 } else { n * 1000 });
    }
    let mut total = 0i64;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: i64 = rest[..digits]
            .parse()
            .with_context(|| format!("duration {s:?}"))?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let mult = match &rest[..unit] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "y" => 365 * 86_400_000,
            u => bail!("unit {u:?} in duration {s:?}"),
        };
        total += n * mult;
        rest = &rest[unit..];
    }
    Ok(if neg { -total } else { total })
}

/// A float as promqltest writes one (`Inf`, `-inf`, `NaN`, `1e3`, `stale`; `0x59` is 0 repeated, not hex).
fn number(s: &str) -> Option<f64> {
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let v = match body.to_ascii_lowercase().as_str() {
        "inf" => f64::INFINITY,
        "nan" => f64::NAN,
        "stale" if !neg => return Some(f64::from_bits(STALE_NAN_BITS)),
        b if b.starts_with(|c: char| c.is_ascii_digit() || c == '.') => b.parse().ok()?,
        _ => return None,
    };
    Some(if neg { -v } else { v })
}

/// Expands the value part of a series line (`0+10x100`, `1x3`, `_x2`, `stale`, `{{…}}`).
fn expand_points(s: &str) -> Result<Vec<Point>> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        if rest.starts_with("{{") {
            // a histogram, possibly `{{…}}+{{…}}xN` or `{{…}}xN`: all histogram points
            let end = rest
                .find("}}")
                .ok_or_else(|| anyhow!("unclosed histogram"))?
                + 2;
            let mut end2 = end;
            let tail = &rest[end..];
            if tail.starts_with('+') || tail.starts_with('-') {
                let e = tail
                    .find("}}")
                    .ok_or_else(|| anyhow!("unclosed histogram"))?
                    + 2;
                end2 += e;
            }
            let tail = &rest[end2..];
            let mut n = 1;
            if let Some(x) = tail.strip_prefix('x') {
                let digits = x.find(|c: char| !c.is_ascii_digit()).unwrap_or(x.len());
                n = x[..digits].parse::<usize>()? + 1;
                end2 += 1 + digits;
            }
            out.extend(std::iter::repeat_n(Point::Histogram, n));
            rest = rest[end2..].trim_start();
            continue;
        }
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let token = &rest[..end];
        rest = rest[end..].trim_start();
        if token == "_" {
            out.push(Point::Omitted);
            continue;
        }
        if let Some(n) = token.strip_prefix("_x") {
            out.extend(std::iter::repeat_n(Point::Omitted, n.parse()?));
            continue;
        }
        if let Some(v) = number(token) {
            out.push(Point::Float(v));
            continue;
        }
        // a[+-]bxN or axN: the base ends at the first sign that does not follow an exponent's `e`
        let (body, times) = token
            .rsplit_once('x')
            .ok_or_else(|| anyhow!("bad value {token:?}"))?;
        let times: usize = times.parse().with_context(|| format!("value {token:?}"))?;
        let bytes = body.as_bytes();
        let split = (1..bytes.len()).find(|&i| {
            (bytes[i] == b'+' || bytes[i] == b'-') && !matches!(bytes[i - 1], b'e' | b'E')
        });
        let (base, inc) = match split {
            Some(i) => (&body[..i], &body[i..]),
            None => (body, "0"),
        };
        let mut v = number(base).ok_or_else(|| anyhow!("bad value {token:?}"))?;
        let inc = number(inc).ok_or_else(|| anyhow!("bad value {token:?}"))?;
        for _ in 0..=times {
            out.push(Point::Float(v));
            v += inc;
        }
    }
    Ok(out)
}

/// Labels of a series descriptor (`metric{a="b"}`, `{a="b"}`, `{}`), parsed as a selector so PromQL's
/// quoting and escapes apply.
fn descriptor_labels(desc: &str) -> Result<Labels> {
    let desc = desc.trim();
    if desc == "{}" {
        return Ok(Vec::new());
    }
    let expr = promql::parse(desc).map_err(|e| anyhow!("series {desc:?}: {e}"))?;
    let Expr::VectorSelector(vs) = expr else {
        bail!("series {desc:?} is not a selector");
    };
    let mut labels: Labels = Vec::new();
    if let Some(name) = &vs.name {
        labels.push(("__name__".into(), name.clone()));
    }
    for m in &vs.matchers.matchers {
        if m.op != MatchOp::Equal {
            bail!("series {desc:?}: only = in a series descriptor");
        }
        if m.name == "__name__" && vs.name.is_some() {
            continue;
        }
        labels.push((m.name.clone(), m.value.clone()));
    }
    labels.sort();
    Ok(labels)
}

/// Splits a series line into its labels and its points (a line of only values has no labels).
fn series_line(line: &str) -> Result<(Labels, Vec<Point>)> {
    let line = line.trim();
    if line.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+' || c == '.')
        || number(line.split_whitespace().next().unwrap_or("")).is_some()
    {
        return Ok((Vec::new(), expand_points(line)?));
    }
    // The descriptor ends after the closing brace outside quotes, or at the first blank without braces.
    let mut end = None;
    let mut in_quote: Option<char> = None;
    let mut escaped = false;
    let mut seen_brace = false;
    for (i, c) in line.char_indices() {
        if let Some(q) = in_quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                in_quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => in_quote = Some(c),
            '{' => seen_brace = true,
            '}' if seen_brace => {
                end = Some(i + 1);
                break;
            }
            c if c.is_whitespace() && !seen_brace => {
                end = Some(i);
                break;
            }
            _ => {}
        }
    }
    let end = end.unwrap_or(line.len());
    Ok((
        descriptor_labels(&line[..end])?,
        expand_points(&line[end..])?,
    ))
}

#[derive(Debug)]
enum Kind {
    Instant(i64),
    Range { start: i64, end: i64, step: i64 },
}

#[derive(Debug, Default)]
struct FailExpect {
    msg: Option<String>,
    regex: Option<String>,
}

#[derive(Debug)]
struct Case {
    line: usize,
    query: String,
    kind: Kind,
    fail: Option<FailExpect>,
    ordered: bool,
    /// `expect string`.
    string: Option<String>,
    /// `expect range vector from … to … step …`.
    range_vector: Option<(i64, i64, i64)>,
    expected: Vec<(Labels, Vec<Point>)>,
    /// Annotation expectations not checked.
    annotations: usize,
    /// Expected output holds a histogram.
    expects_histogram: bool,
}

enum Command {
    Load {
        interval: i64,
        nhcb: bool,
        series: Vec<(Labels, Vec<Point>)>,
    },
    Clear,
    Eval(Box<Case>),
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    let b = s.as_bytes();
    if b.len() >= 2 && (b[0] == b'"' || b[0] == b'`') && b[b.len() - 1] == b[0] {
        s[1..s.len() - 1].to_string()
    } else {
        s.to_string()
    }
}

fn parse_file(text: &str) -> Result<Vec<Command>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    // the indented (or at least non-command) lines of a block, up to a blank line or the next command
    let block = |i: &mut usize| -> Vec<(usize, &str)> {
        let mut body = Vec::new();
        while *i < lines.len() {
            let l = lines[*i];
            let t = l.trim();
            if t.is_empty() {
                break;
            }
            if !l.starts_with(char::is_whitespace)
                && (t.starts_with("load") || t.starts_with("eval") || t == "clear")
            {
                break;
            }
            if !t.starts_with('#') {
                body.push((*i + 1, t));
            }
            *i += 1;
        }
        body
    };
    while i < lines.len() {
        let line = lines[i].trim();
        let lineno = i + 1;
        i += 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line == "clear" {
            out.push(Command::Clear);
        } else if let Some(rest) = line.strip_prefix("load") {
            let (nhcb, rest) = match rest.strip_prefix("_with_nhcb") {
                Some(r) => (true, r),
                None => (false, rest),
            };
            let interval = duration_ms(rest.trim())?;
            let mut series = Vec::new();
            for (n, l) in block(&mut i) {
                series.push(series_line(l).with_context(|| format!("line {n}"))?);
            }
            out.push(Command::Load {
                interval,
                nhcb,
                series,
            });
        } else if line.starts_with("eval") {
            let (head, rest) = line.split_once(' ').unwrap_or((line, ""));
            let mut fail = (head == "eval_fail").then(FailExpect::default);
            let ordered = head == "eval_ordered";
            let annotations = usize::from(head == "eval_warn" || head == "eval_info");
            let rest = rest.trim();
            let (kind, query) = if let Some(r) = rest.strip_prefix("instant at ") {
                let (t, q) = r.split_once(' ').ok_or_else(|| anyhow!("line {lineno}"))?;
                (Kind::Instant(duration_ms(t)?), q)
            } else if let Some(r) = rest.strip_prefix("range from ") {
                let parts: Vec<&str> = r.splitn(6, ' ').collect();
                let [start, "to", end, "step", step, q] = parts[..] else {
                    bail!("line {lineno}: bad range eval");
                };
                (
                    Kind::Range {
                        start: duration_ms(start)?,
                        end: duration_ms(end)?,
                        step: duration_ms(step)?,
                    },
                    q,
                )
            } else {
                bail!("line {lineno}: bad eval {line:?}");
            };
            let mut case = Case {
                line: lineno,
                query: query.trim().to_string(),
                kind,
                fail: None,
                ordered,
                string: None,
                range_vector: None,
                expected: Vec::new(),
                annotations,
                expects_histogram: false,
            };
            for (n, l) in block(&mut i) {
                if let Some(e) = l.strip_prefix("expect ") {
                    let e = e.trim();
                    let (what, arg) = e.split_once(char::is_whitespace).unwrap_or((e, ""));
                    match what {
                        "fail" => {
                            let f = fail.get_or_insert_with(FailExpect::default);
                            let arg = arg.trim();
                            if let Some(m) = arg.strip_prefix("msg:") {
                                f.msg = Some(unquote(m));
                            } else if let Some(r) = arg.strip_prefix("regex:") {
                                f.regex = Some(unquote(r));
                            }
                        }
                        "ordered" => case.ordered = true,
                        "info" | "warn" | "no_info" | "no_warn" => case.annotations += 1,
                        "string" => case.string = Some(unquote(arg)),
                        "range" => {
                            let p: Vec<&str> = arg.split_whitespace().collect();
                            let ["vector", "from", a, "to", b, "step", s] = p[..] else {
                                bail!("line {n}: bad expect range vector");
                            };
                            case.range_vector =
                                Some((duration_ms(a)?, duration_ms(b)?, duration_ms(s)?));
                        }
                        _ => bail!("line {n}: unknown expectation {l:?}"),
                    }
                } else if let Some(m) = l.strip_prefix("expected_fail_message ") {
                    fail.get_or_insert_with(FailExpect::default).msg = Some(m.trim().into());
                } else if let Some(r) = l.strip_prefix("expected_fail_regexp ") {
                    fail.get_or_insert_with(FailExpect::default).regex = Some(r.trim().into());
                } else {
                    if l.contains("{{") {
                        case.expects_histogram = true;
                        continue;
                    }
                    case.expected
                        .push(series_line(l).with_context(|| format!("line {n}"))?);
                }
            }
            case.fail = fail;
            out.push(Command::Eval(Box::new(case)));
        } else {
            bail!("line {lineno}: unknown command {line:?}");
        }
    }
    Ok(out)
}

/// The data loaded so far: float series, and the labels of series holding native histograms.
#[derive(Default)]
struct Data {
    /// Samples by time: a series loaded twice keeps the later value at the same time.
    floats: BTreeMap<Labels, BTreeMap<i64, f64>>,
    histograms: Vec<Labels>,
}

impl Data {
    fn load(&mut self, interval: i64, nhcb: bool, series: &[(Labels, Vec<Point>)]) {
        for (labels, points) in series {
            let mut has_histogram = false;
            for (k, p) in points.iter().enumerate() {
                match p {
                    Point::Float(v) => self
                        .floats
                        .entry(labels.clone())
                        .or_default()
                        .insert(k as i64 * interval, *v)
                        .map_or((), drop),
                    Point::Histogram => has_histogram = true,
                    Point::Omitted => {}
                }
            }
            if has_histogram {
                self.histograms.push(labels.clone());
            }
            if nhcb {
                // The native histogram with custom buckets Prometheus builds from a classic one: the
                // metric name without `_bucket`/`_count`/`_sum`, no `le`.
                let mut h: Labels = labels.iter().filter(|(k, _)| k != "le").cloned().collect();
                for (k, v) in &mut h {
                    if k == "__name__" {
                        for suffix in ["_bucket", "_count", "_sum"] {
                            if let Some(base) = v.strip_suffix(suffix) {
                                *v = base.to_string();
                                break;
                            }
                        }
                    }
                }
                self.histograms.push(h);
            }
        }
    }

    fn engine(&self, base: &Engine) -> Engine {
        let parts = self
            .floats
            .iter()
            .map(|(l, s)| (l.clone(), s.iter().map(|(t, v)| (*t, *v)).collect()))
            .collect::<Vec<_>>();
        base.with_source(Source::Gathered(Arc::new(Gathered::new(parts))))
    }
}

/// Why a case is skipped, if it is.
fn skip_reason(case: &Case, data: &Data) -> Option<String> {
    if DELAYED_NAME_REMOVAL.contains(&case.query.trim()) {
        return Some("experimental: delayed name removal".into());
    }
    let words = regex::Regex::new(r"[A-Za-z_][A-Za-z0-9_]*\s*\(").expect("regex");
    for m in words.find_iter(&case.query) {
        let name = m.as_str().trim_end_matches('(').trim_end();
        // `@ start()` and `@ end()` are the (stable) at modifier, not the experimental functions
        let at_modifier = case.query[..m.start()].trim_end().ends_with('@');
        if EXPERIMENTAL.contains(&name) && !at_modifier {
            return Some(format!("experimental: {name}"));
        }
    }
    for (kw, what) in [
        (r"\b(anchored|smoothed)\b", "extended range selectors"),
        (r"\bfill(_left|_right)?\s*\(", "binary fill modifiers"),
        (r"\[[^\]]*[-+*/%^(][^\]]*\]", "duration expressions"),
        (
            r"offset\s+[-+]?\s*\(|@\s*\(|offset\s+[0-9a-z]+\s*[-+*/]",
            "duration expressions",
        ),
    ] {
        if regex::Regex::new(kw).expect("regex").is_match(&case.query) {
            return Some(format!("experimental: {what}"));
        }
    }
    if case.expects_histogram {
        return Some("native histograms: expected histogram output".into());
    }
    if !data.histograms.is_empty()
        && let Ok(plan) = promql::plan(&case.query, 0, 0, Duration::from_secs(300))
    {
        let hit = data.histograms.iter().any(|labels| {
            plan.matchers.iter().any(|set| {
                set.iter().all(|m| {
                    let v = labels
                        .iter()
                        .find(|(k, _)| *k == m.name)
                        .map_or("", |(_, v)| v.as_str());
                    m.is_match(v)
                })
            })
        });
        if hit {
            return Some("native histograms: selects histogram series".into());
        }
    }
    None
}

/// promqltest's `almost.Equal`.
fn almost_equal(a: f64, b: f64) -> bool {
    if a.is_nan() && b.is_nan() {
        return true;
    }
    if a == b {
        return true;
    }
    let min_normal = f64::from_bits(0x0010_0000_0000_0000);
    let abs_sum = a.abs() + b.abs();
    let diff = (a - b).abs();
    if a == 0.0 || b == 0.0 || abs_sum < min_normal {
        return diff < EPSILON * min_normal;
    }
    diff / abs_sum.min(f64::MAX) < EPSILON
}

fn render(labels: &Labels) -> String {
    let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{{{}}}", inner.join(", "))
}

/// Compares actual (labels, points) series with expected ones.
fn compare(
    actual: Vec<(Labels, Vec<(i64, f64)>)>,
    expected: Vec<(Labels, Vec<(i64, f64)>)>,
    ordered: bool,
) -> Result<(), String> {
    if actual.len() != expected.len() {
        let a: Vec<String> = actual.iter().map(|s| render(&s.0)).take(4).collect();
        return Err(format!(
            "{} series, expected {} (got {})",
            actual.len(),
            expected.len(),
            a.join(" ")
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (labels, _) in &actual {
        if !seen.insert(labels.clone()) {
            return Err(format!("duplicate series {}", render(labels)));
        }
    }
    for (i, (labels, points)) in expected.iter().enumerate() {
        let found = if ordered {
            (actual[i].0 == *labels).then_some(&actual[i])
        } else {
            actual.iter().find(|s| s.0 == *labels)
        };
        let Some((_, got)) = found else {
            return Err(if ordered {
                format!(
                    "position {i}: {} instead of {}",
                    render(&actual[i].0),
                    render(labels)
                )
            } else {
                format!("missing {}", render(labels))
            });
        };
        let same = got.len() == points.len()
            && got
                .iter()
                .zip(points)
                .all(|(a, b)| a.0 == b.0 && almost_equal(a.1, b.1));
        if !same {
            return Err(format!(
                "{}: got {:?}, expected {:?}",
                render(labels),
                got.iter().take(6).collect::<Vec<_>>(),
                points.iter().take(6).collect::<Vec<_>>()
            ));
        }
    }
    Ok(())
}

/// Expected points of a series line whose values fall on `start + k·step`.
fn expected_points(points: &[Point], start: i64, step: i64) -> Vec<(i64, f64)> {
    points
        .iter()
        .enumerate()
        .filter_map(|(k, p)| match p {
            Point::Float(v) => Some((start + k as i64 * step, *v)),
            _ => None,
        })
        .collect()
}

fn run_case(case: &Case, engine: &Engine) -> Result<(), String> {
    let result = match case.kind {
        Kind::Instant(t) => engine.instant(&case.query, t),
        Kind::Range { start, end, step } => engine.range(&case.query, start, end, step),
    };
    if let Some(f) = &case.fail {
        return match result {
            Ok(_) => Err("expected an error, got a result".into()),
            Err(e) => {
                let msg = e.to_string();
                if let Some(want) = &f.msg
                    && msg != *want
                {
                    return Err(format!("error {msg:?}, expected {want:?}"));
                }
                if let Some(re) = &f.regex
                    && !regex::Regex::new(re).is_ok_and(|r| r.is_match(&msg))
                {
                    return Err(format!("error {msg:?} does not match {re:?}"));
                }
                Ok(())
            }
        };
    }
    let value = result.map_err(|e| format!("error: {e}"))?;
    if let Some(want) = &case.string {
        return match value {
            Value::String(s) if s == *want => Ok(()),
            v => Err(format!("got {v:?}, expected string {want:?}")),
        };
    }
    match (&case.kind, value) {
        (Kind::Instant(_), Value::Scalar(v)) => {
            let [(labels, points)] = &case.expected[..] else {
                return Err(format!("got scalar {v:?}, expected a vector"));
            };
            match (labels.is_empty(), points[..].first(), v.first()) {
                (true, Some(Point::Float(want)), Some(got)) if almost_equal(*want, *got) => Ok(()),
                _ => Err(format!("got scalar {v:?}")),
            }
        }
        (Kind::Instant(t), Value::Vector(series)) => {
            let actual = series
                .into_iter()
                .filter_map(|s| s.values[0].map(|v| (s.labels, vec![(*t, v)])))
                .collect();
            let expected = case
                .expected
                .iter()
                .map(|(l, p)| (l.clone(), expected_points(&p[..1.min(p.len())], *t, 0)))
                .collect();
            compare(actual, expected, case.ordered)
        }
        (Kind::Instant(_), Value::Matrix(series)) => {
            let Some((start, _, step)) = case.range_vector else {
                return Err("got a range vector, no `expect range vector`".into());
            };
            let expected = case
                .expected
                .iter()
                .map(|(l, p)| (l.clone(), expected_points(p, start, step)))
                .collect();
            compare(series, expected, case.ordered)
        }
        (Kind::Range { start, step, .. }, Value::Vector(series)) => {
            let actual = series
                .into_iter()
                .map(|s| {
                    let pts = s
                        .values
                        .iter()
                        .enumerate()
                        .filter_map(|(k, v)| v.map(|v| (start + k as i64 * step, v)))
                        .collect();
                    (s.labels, pts)
                })
                .collect();
            let expected = case
                .expected
                .iter()
                .map(|(l, p)| (l.clone(), expected_points(p, *start, *step)))
                .collect();
            compare(actual, expected, case.ordered)
        }
        (Kind::Range { start, step, .. }, Value::Scalar(v)) => {
            // a scalar range result is a series without labels
            let actual = vec![(
                Vec::new(),
                v.iter()
                    .enumerate()
                    .map(|(k, v)| (start + k as i64 * step, *v))
                    .collect(),
            )];
            let expected = case
                .expected
                .iter()
                .map(|(l, p)| (l.clone(), expected_points(p, *start, *step)))
                .collect();
            compare(actual, expected, false)
        }
        (_, v) => Err(format!("unexpected result {v:?}")),
    }
}

#[derive(Default)]
struct Tally {
    passed: usize,
    failed: usize,
    skipped: usize,
    annotations: usize,
    failures: Vec<String>,
    skips: BTreeMap<String, usize>,
}

fn run_file(path: &Path, base: &Engine) -> Result<Tally> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let commands = parse_file(&text).with_context(|| path.display().to_string())?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut tally = Tally::default();
    let mut data = Data::default();
    let mut engine = data.engine(base);
    for c in commands {
        match c {
            Command::Clear => {
                data = Data::default();
                engine = data.engine(base);
            }
            Command::Load {
                interval,
                nhcb,
                series,
            } => {
                data.load(interval, nhcb, &series);
                engine = data.engine(base);
            }
            Command::Eval(case) => {
                if let Some(reason) = skip_reason(&case, &data) {
                    tally.skipped += 1;
                    if std::env::var_os("PROMQLTEST_VERBOSE").is_some() {
                        eprintln!("skip {name}:{} {} -- {reason}", case.line, case.query);
                    }
                    *tally.skips.entry(reason).or_default() += 1;
                    continue;
                }
                tally.annotations += case.annotations;
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_case(&case, &engine)
                }))
                .unwrap_or_else(|_| Err("the engine panicked".into()));
                match outcome {
                    Ok(()) => tally.passed += 1,
                    Err(why) => {
                        tally.failed += 1;
                        let mut why = why;
                        why.truncate(300);
                        tally
                            .failures
                            .push(format!("{name}:{} {} -- {why}", case.line, case.query));
                    }
                }
            }
        }
    }
    Ok(tally)
}

#[test]
fn prometheus_promql_test_files() -> Result<()> {
    let dir = fixtures();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("{}: set PROMQL_FIXTURES", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "test"));
    files.sort();
    anyhow::ensure!(!files.is_empty(), "no .test files in {}", dir.display());
    let tmp = tempfile::tempdir()?;
    let store = Arc::new(Store::open(tmp.path(), Options::default())?);
    let base = Engine::new(store, Duration::from_secs(300));
    let mut total = Tally::default();
    eprintln!(
        "{:<24} {:>7} {:>7} {:>8}",
        "file", "passed", "failed", "skipped"
    );
    for path in &files {
        let t = run_file(path, &base)?;
        eprintln!(
            "{:<24} {:>7} {:>7} {:>8}",
            path.file_name().unwrap_or_default().to_string_lossy(),
            t.passed,
            t.failed,
            t.skipped
        );
        total.passed += t.passed;
        total.failed += t.failed;
        total.skipped += t.skipped;
        total.annotations += t.annotations;
        total.failures.extend(t.failures);
        for (k, v) in t.skips {
            *total.skips.entry(k).or_default() += v;
        }
    }
    eprintln!(
        "{:<24} {:>7} {:>7} {:>8}",
        "total", total.passed, total.failed, total.skipped
    );
    eprintln!("skipped:");
    for (reason, n) in &total.skips {
        eprintln!("  {n:>4}  {reason}");
    }
    eprintln!(
        "annotation expectations (expect info/warn/no_info/no_warn) not checked: {}",
        total.annotations
    );
    eprintln!("failing cases:");
    for f in &total.failures {
        eprintln!("  {f}");
    }
    anyhow::ensure!(
        total.failed == 0,
        "{} cases failed (listed above)",
        total.failed
    );
    anyhow::ensure!(
        total.passed >= MIN_PASSED,
        "{} cases passed, fewer than the {MIN_PASSED} of the ratchet",
        total.passed
    );
    Ok(())
}
