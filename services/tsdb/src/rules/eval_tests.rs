//! The machine fed directly: a table of samples answers the queries, the evaluation time is an argument.

use std::cell::RefCell;
use std::path::Path;

use super::*;
use crate::promql::Series;
use crate::rules::parse_file;

const T0: i64 = 1_750_000_000_000;
const MIN: i64 = 60_000;

fn at(minute: i64) -> i64 {
    T0 + minute * MIN
}

/// Answers a bare metric name with the samples put at exactly the evaluation time; `broken` fails.
struct Table {
    samples: RefCell<Vec<Sample>>,
    start: Instant,
}

impl Table {
    fn new() -> Self {
        Table {
            samples: RefCell::new(Vec::new()),
            start: Instant::now(),
        }
    }

    fn put(&self, name: &str, labels: &[(&str, &str)], value: f64, minutes: &[i64]) {
        for &m in minutes {
            self.samples
                .borrow_mut()
                .push(Sample::new(name, labels, value, at(m)));
        }
    }
}

impl Querier for Table {
    fn instant(&self, expr: &str, ts: i64) -> Result<Value, promql::Error> {
        if expr == "broken" {
            return Err(promql::Error::BadData("no such thing".into()));
        }
        let series = self
            .samples
            .borrow()
            .iter()
            .filter(|s| s.name == expr && s.timestamp_ms == ts)
            .map(|s| Series {
                labels: std::iter::once((METRIC_NAME.to_string(), s.name.clone()))
                    .chain(s.labels.clone())
                    .collect(),
                values: vec![Some(s.value)],
            })
            .collect();
        Ok(Value::Vector(series))
    }

    fn record(&self, samples: &[Sample]) -> Result<(), promql::Error> {
        self.samples.borrow_mut().extend_from_slice(samples);
        Ok(())
    }

    fn stopwatch(&self) -> Instant {
        self.start
    }
}

fn group(rules: &str) -> Group {
    let text = format!("groups:\n  - name: g\n    rules:\n{rules}");
    parse_file(Path::new("t.rules.yaml"), &text, Duration::from_secs(60))
        .expect("valid rules")
        .remove(0)
}

fn alerts(g: &Group) -> Vec<&Alert> {
    match &g.rules[0].kind {
        Kind::Alerting { active, .. } => active.values().collect(),
        Kind::Recording { .. } => Vec::new(),
    }
}

fn states(g: &Group) -> Vec<AlertState> {
    alerts(g).iter().map(|a| a.state).collect()
}

#[test]
fn alert_is_pending_until_for_has_elapsed_then_fires() {
    let t = Table::new();
    t.put("high", &[("cluster", "c1")], 1.0, &[1, 2, 3, 4]);
    let mut g = group("      - alert: High\n        expr: high\n        for: 2m\n");

    let out = g.eval(&t, at(0), "");
    assert!(states(&g).is_empty() && out.alerts.is_empty());
    let out = g.eval(&t, at(1), "");
    assert_eq!(states(&g), [AlertState::Pending]);
    assert!(out.alerts.is_empty(), "pending alerts are not sent");
    g.eval(&t, at(2), "");
    assert_eq!(states(&g), [AlertState::Pending], "1m of 2m held");

    let out = g.eval(&t, at(3), "http://tsdb");
    assert_eq!(states(&g), [AlertState::Firing]);
    assert_eq!(alerts(&g)[0].active_at, at(1));
    assert_eq!(alerts(&g)[0].fired_at, Some(at(3)));
    assert_eq!(out.alerts.len(), 1);
    let a = &out.alerts[0];
    assert_eq!(a.starts_at.timestamp_millis(), at(3));
    assert_eq!(
        a.ends_at.timestamp_millis(),
        at(7),
        "four resend intervals ahead"
    );
    assert_eq!(a.generator_url, "http://tsdb/graph?g0.expr=high&g0.tab=1");

    let out = g.eval(&t, at(4), "");
    assert_eq!(out.alerts.len(), 1, "re-sent while firing");
}

#[test]
fn alert_without_for_fires_at_its_first_evaluation() {
    let t = Table::new();
    t.put("high", &[], 1.0, &[0]);
    let mut g = group("      - alert: High\n        expr: high\n");
    let out = g.eval(&t, at(0), "");
    assert_eq!(states(&g), [AlertState::Firing]);
    assert_eq!(out.alerts.len(), 1);
}

#[test]
fn cleared_alert_is_resolved_sent_with_ends_at_and_kept_fifteen_minutes() {
    let t = Table::new();
    t.put("high", &[], 1.0, &[0, 1]);
    let mut g = group("      - alert: High\n        expr: high\n");
    g.eval(&t, at(0), "");
    g.eval(&t, at(1), "");

    let out = g.eval(&t, at(2), "");
    assert_eq!(states(&g), [AlertState::Inactive]);
    assert_eq!(alerts(&g)[0].resolved_at, Some(at(2)));
    assert_eq!(out.alerts.len(), 1, "resolved alerts are sent");
    assert_eq!(out.alerts[0].starts_at.timestamp_millis(), at(0));
    assert_eq!(out.alerts[0].ends_at.timestamp_millis(), at(2));

    let out = g.eval(&t, at(17), "");
    assert_eq!(states(&g), [AlertState::Inactive]);
    assert_eq!(out.alerts[0].ends_at.timestamp_millis(), at(2));
    let out = g.eval(&t, at(18), "");
    assert!(states(&g).is_empty() && out.alerts.is_empty());
}

#[test]
fn condition_returning_after_pending_or_resolved_starts_a_new_pending_alert() {
    let t = Table::new();
    t.put("high", &[], 1.0, &[0, 2, 3, 5]);
    let mut g = group("      - alert: High\n        expr: high\n        for: 1m\n");
    g.eval(&t, at(0), "");
    g.eval(&t, at(1), "");
    assert!(
        states(&g).is_empty(),
        "a pending alert that clears is dropped"
    );
    g.eval(&t, at(2), "");
    g.eval(&t, at(3), "");
    assert_eq!(states(&g), [AlertState::Firing]);
    g.eval(&t, at(4), "");
    assert_eq!(states(&g), [AlertState::Inactive]);

    let out = g.eval(&t, at(5), "");
    assert_eq!(states(&g), [AlertState::Pending]);
    assert_eq!(alerts(&g)[0].active_at, at(5));
    assert_eq!(alerts(&g)[0].fired_at, None);
    assert!(out.alerts.is_empty());
}

#[test]
fn keep_firing_for_holds_a_cleared_alert_then_resolves_it() {
    let t = Table::new();
    // holds at 0, clears at 1, holds again at 2 (the hold restarts), clears from 3 on
    t.put("high", &[], 1.0, &[0, 2]);
    let mut g = group("      - alert: High\n        expr: high\n        keep_firing_for: 3m\n");
    g.eval(&t, at(0), "");
    g.eval(&t, at(1), "");
    assert_eq!(states(&g), [AlertState::Firing]);
    assert_eq!(alerts(&g)[0].keep_firing_since, Some(at(1)));
    g.eval(&t, at(2), "");
    assert_eq!(alerts(&g)[0].keep_firing_since, None);

    for m in 3..=5 {
        let out = g.eval(&t, at(m), "");
        assert_eq!(states(&g), [AlertState::Firing], "minute {m}");
        assert!(out.alerts[0].ends_at.timestamp_millis() > at(m));
    }
    let out = g.eval(&t, at(6), "");
    assert_eq!(states(&g), [AlertState::Inactive]);
    assert_eq!(out.alerts[0].ends_at.timestamp_millis(), at(6));
    assert_eq!(out.alerts[0].starts_at.timestamp_millis(), at(0));
}

#[test]
fn recording_rule_sample_is_written_and_seen_by_the_next_rule() {
    let t = Table::new();
    t.put("up", &[("cluster", "c1"), ("job", "api")], 1.0, &[0]);
    let mut g = group(concat!(
        "      - record: job:up:value\n        expr: up\n        labels:\n          source: rule\n",
        "      - alert: Recorded\n        expr: job:up:value\n",
    ));
    let out = g.eval(&t, at(0), "");

    let want = Sample {
        name: "job:up:value".into(),
        labels: BTreeMap::from([
            ("cluster".into(), "c1".into()),
            ("job".into(), "api".into()),
            ("source".into(), "rule".into()),
        ]),
        value: 1.0,
        timestamp_ms: at(0),
    };
    assert_eq!(out.samples, std::slice::from_ref(&want));
    assert!(t.samples.borrow().contains(&want), "written through");
    assert_eq!(out.alerts.len(), 1, "the next rule saw the recorded series");
    assert_eq!(
        out.alerts[0].labels.get("alertname").map(String::as_str),
        Some("Recorded")
    );
    assert_eq!(
        out.alerts[0].labels.get("source").map(String::as_str),
        Some("rule")
    );
}

#[test]
fn templates_render_the_alert_labels_and_value() {
    let t = Table::new();
    let labels = [("node", "n1"), ("tier", "gold")];
    t.put("disk_used_ratio", &labels, 0.923, &[0]);
    t.put("disk_used_ratio", &labels, 0.5, &[1]);
    let mut g = group(concat!(
        "      - alert: DiskFull\n        expr: disk_used_ratio\n",
        "        labels:\n          severity: '{{ $labels.tier }}-page'\n",
        "        annotations:\n",
        "          summary: '{{ $labels.node }} at {{ $value | humanizePercentage }}'\n",
        "          raw: '{{ $value }}'\n",
        "          fixed: '{{ printf \"%.1f\" $value }}'\n",
    ));
    let out = g.eval(&t, at(0), "");
    let a = &out.alerts[0];
    assert_eq!(a.labels["severity"], "gold-page");
    assert_eq!(a.labels["node"], "n1");
    assert!(!a.labels.contains_key(METRIC_NAME));
    assert_eq!(a.annotations["summary"], "n1 at 92.3%");
    assert_eq!(a.annotations["raw"], "0.923");
    assert_eq!(a.annotations["fixed"], "0.9");

    let out = g.eval(&t, at(1), "");
    assert_eq!(
        out.alerts[0].annotations["summary"], "n1 at 50%",
        "re-rendered with the latest value"
    );
    assert_eq!(alerts(&g)[0].value, 0.5);
}

#[test]
fn failing_rule_keeps_its_error_and_the_others_still_run() {
    let t = Table::new();
    t.put("up", &[], 1.0, &[0]);
    let mut g = group(concat!(
        "      - alert: Broken\n        expr: broken\n",
        "      - record: up:copy\n        expr: up\n",
    ));
    let out = g.eval(&t, at(0), "");
    assert!(
        g.rules[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("no such thing")),
        "{:?}",
        g.rules[0].last_error
    );
    assert_eq!(g.rules[1].last_error, None);
    assert_eq!(out.samples.len(), 1);
    assert!(g.rules.iter().all(|r| r.last_evaluation == Some(at(0))));
    assert_eq!(g.last_evaluation, Some(at(0)));
}
