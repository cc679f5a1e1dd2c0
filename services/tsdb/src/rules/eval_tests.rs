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

    fn last_samples(
        &self,
        name: &str,
        alertname: &str,
        from: i64,
        to: i64,
    ) -> Result<Vec<(crate::store::Labels, i64, f64)>, promql::Error> {
        let mut last: BTreeMap<Vec<(String, String)>, (i64, f64)> = BTreeMap::new();
        for s in self.samples.borrow().iter() {
            let matches = s.name == name
                && s.labels.get("alertname").map(String::as_str) == Some(alertname)
                && (from..=to).contains(&s.timestamp_ms);
            if matches {
                let labels = s.labels.clone().into_iter().collect();
                let e = last.entry(labels).or_insert((s.timestamp_ms, s.value));
                if s.timestamp_ms >= e.0 {
                    *e = (s.timestamp_ms, s.value);
                }
            }
        }
        Ok(last.into_iter().map(|(l, (t, v))| (l, t, v)).collect())
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

/// The samples of `name` the rules wrote at `minute`, as `alertstate value` (`stale` for a marker), sorted.
fn written_at(t: &Table, name: &str, minute: i64) -> Vec<String> {
    let mut v: Vec<String> = t
        .samples
        .borrow()
        .iter()
        .filter(|s| s.name == name && s.timestamp_ms == at(minute))
        .map(|s| {
            let state = s.labels.get("alertstate").cloned().unwrap_or_default();
            let value = if crate::chunk::is_stale(s.value) {
                "stale".to_string()
            } else {
                s.value.to_string()
            };
            format!("{state} {value}").trim().to_string()
        })
        .collect();
    v.sort();
    v
}

/// A group evaluated at each minute of `minutes`, restored when due (after its second evaluation), as the
/// manager does.
fn eval_minutes(g: &mut Group, t: &Table, minutes: impl IntoIterator<Item = i64>) {
    for m in minutes {
        g.eval(t, at(m), "");
        g.restore_for_state(t);
    }
}

#[test]
fn alerting_rules_write_alerts_series_as_prometheus_does_and_mark_what_stopped_stale() {
    let t = Table::new();
    t.put("high", &[("cluster", "c1")], 1.0, &[0, 1, 2, 3, 4, 5]);
    t.put("load", &[("cluster", "c1")], 5.0, &[0, 1]);
    let mut g = group(concat!(
        "      - alert: High\n        expr: high\n        for: 3m\n",
        "      - record: cluster:load\n        expr: load\n",
    ));
    eval_minutes(&mut g, &t, 0..=6);
    // the two evaluations before the `for` state is restored write no ALERTS
    assert!(written_at(&t, ALERTS, 0).is_empty() && written_at(&t, ALERTS, 1).is_empty());
    assert_eq!(written_at(&t, ALERTS, 2), ["pending 1"]);
    // pending to firing: the pending series ends
    assert_eq!(written_at(&t, ALERTS, 3), ["firing 1", "pending stale"]);
    assert_eq!(written_at(&t, ALERTS, 5), ["firing 1"]);
    assert_eq!(written_at(&t, ALERTS, 6), ["firing stale"]);
    let since = ((at(0) / 1000) as f64).to_string();
    assert_eq!(written_at(&t, ALERTS_FOR_STATE, 5), [since]);
    assert_eq!(written_at(&t, ALERTS_FOR_STATE, 6), ["stale"]);
    // a recording rule's series that its expression no longer returns
    assert_eq!(written_at(&t, "cluster:load", 1), ["5"]);
    assert_eq!(written_at(&t, "cluster:load", 2), ["stale"]);
    assert!(written_at(&t, "cluster:load", 3).is_empty());
    let labels = &t
        .samples
        .borrow()
        .iter()
        .find(|s| s.name == ALERTS)
        .expect("written")
        .labels
        .clone();
    assert_eq!(
        labels.keys().map(String::as_str).collect::<Vec<_>>(),
        ["alertname", "alertstate", "cluster"]
    );
}

/// Minutes `from..=to` of `high` (the condition holding).
fn holding(t: &Table, from: i64, to: i64) {
    t.put(
        "high",
        &[("cluster", "c1")],
        1.0,
        &(from..=to).collect::<Vec<_>>(),
    );
}

const FOR_15M: &str = "      - alert: High\n        expr: high\n        for: 15m\n";

#[test]
fn after_a_restart_a_pending_alert_takes_its_for_state_back_moved_by_the_time_down() {
    let t = Table::new();
    holding(&t, 0, 40);
    eval_minutes(&mut group(FOR_15M), &t, 0..=5);
    // back at minute 8, restored after the evaluation at 9: active from minute 0 plus the 4 minutes since
    // its state was last written, it fires at 19
    let mut g = group(FOR_15M);
    eval_minutes(&mut g, &t, 8..=8);
    assert_eq!(alerts(&g)[0].active_at, at(8));
    eval_minutes(&mut g, &t, 9..=9);
    assert_eq!(alerts(&g)[0].active_at, at(4));
    eval_minutes(&mut g, &t, 10..=18);
    assert_eq!(states(&g), [AlertState::Pending]);
    eval_minutes(&mut g, &t, 19..=19);
    assert_eq!(states(&g), [AlertState::Firing]);
}

#[test]
fn a_restored_alert_fires_no_sooner_than_the_grace_period_after_the_restart() {
    let t = Table::new();
    holding(&t, 0, 40);
    // 12 of its 15 minutes held when the TSDB went down; back at 14, restored at 15 with 10 minutes'
    // grace: firing at 25
    eval_minutes(&mut group(FOR_15M), &t, 0..=12);
    let mut g = group(FOR_15M);
    eval_minutes(&mut g, &t, 14..=24);
    assert_eq!(alerts(&g)[0].active_at, at(10));
    assert_eq!(states(&g), [AlertState::Pending]);
    eval_minutes(&mut g, &t, 25..=25);
    assert_eq!(states(&g), [AlertState::Firing]);
}

#[test]
fn what_is_not_restored_waits_its_for_again() {
    // a `for` shorter than the grace period
    let t = Table::new();
    holding(&t, 0, 100);
    let short = "      - alert: High\n        expr: high\n        for: 5m\n";
    eval_minutes(&mut group(short), &t, 0..=3);
    let mut g = group(short);
    eval_minutes(&mut g, &t, 4..=5);
    assert!(g.restored);
    assert_eq!(alerts(&g)[0].active_at, at(4));
    // an alert that stopped (its state marked stale) before the restart
    let t = Table::new();
    holding(&t, 0, 5);
    holding(&t, 8, 30);
    eval_minutes(&mut group(FOR_15M), &t, 0..=7);
    let mut g = group(FOR_15M);
    eval_minutes(&mut g, &t, 8..=9);
    assert!(g.restored);
    assert_eq!(alerts(&g)[0].active_at, at(8));
    // down longer than the outage tolerance (1 h)
    let t = Table::new();
    holding(&t, 0, 5);
    holding(&t, 66, 70);
    eval_minutes(&mut group(FOR_15M), &t, 0..=5);
    let mut g = group(FOR_15M);
    eval_minutes(&mut g, &t, 66..=67);
    assert!(g.restored);
    assert_eq!(alerts(&g)[0].active_at, at(66));
}

#[test]
fn an_alert_that_was_firing_before_the_restart_fires_again_once_restored() {
    let t = Table::new();
    holding(&t, 0, 40);
    eval_minutes(&mut group(FOR_15M), &t, 0..=20);
    // firing since 15 when the TSDB went down at 20; back at 22, restored at 23: its `for` is over
    let mut g = group(FOR_15M);
    eval_minutes(&mut g, &t, 22..=23);
    assert_eq!(alerts(&g)[0].active_at, at(0));
    assert_eq!(states(&g), [AlertState::Pending]);
    eval_minutes(&mut g, &t, 24..=24);
    assert_eq!(states(&g), [AlertState::Firing]);
}
