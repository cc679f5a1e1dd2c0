//! The rules' machine: a group evaluated at a given time against a [`Querier`], giving the recording rules'
//! samples and the alerts to send. An alerting rule's alerts go pending, fire once `for` has elapsed, stay
//! firing `keep_firing_for` after their condition clears, and are then resolved (kept and re-sent with
//! `endsAt` for 15 minutes), as in Prometheus.
//!
//! It reads no clock and does no I/O: the evaluation time is an argument, queries and recorded samples go
//! through the [`Querier`] (the shell's is the PromQL [`Engine`](crate::promql::Engine) over the store).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use multipilot_schemas::payload::Sample;
use serde::{Deserialize, Serialize};

use super::Result;
use super::template::{render, template_env};
use crate::promql::{self, Value};
use crate::store::{Labels, METRIC_NAME};

/// What a group's evaluation reads and writes.
pub trait Querier {
    /// `expr`'s value at `ts` (ms).
    fn instant(&self, expr: &str, ts: i64) -> Result<Value, promql::Error>;
    /// Writes a recording rule's samples, so that the rules after it see them.
    fn record(&self, samples: &[Sample]) -> Result<(), promql::Error>;
    /// A monotonic reading, only to time evaluations for `GET /api/v1/rules` (alert state never depends
    /// on it).
    fn stopwatch(&self) -> Instant;
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
    /// Recording rules' samples (already written through the [`Querier`] by [`Group::eval`]).
    pub samples: Vec<Sample>,
    /// Firing and recently resolved alerts to send.
    pub alerts: Vec<PostableAlert>,
}

/// Resolved alerts are kept (and re-sent) this long, as in Prometheus.
const RESOLVED_RETENTION_MS: i64 = 15 * 60_000;

fn hash_labels(labels: &BTreeMap<String, String>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    labels.hash(&mut h);
    h.finish()
}

pub(super) fn ms_to_time(ms: i64) -> DateTime<Utc> {
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
    /// Evaluates every rule at `ts` (ms): recording rules' samples are written through `querier` before
    /// the next rule runs; returns the samples written and the alerts to send. A failing rule is recorded
    /// in its `last_error` and the others still run. `generator` is the base of `generatorURL`.
    pub fn eval(&mut self, querier: &impl Querier, ts: i64, generator: &str) -> Evaluated {
        let started = querier.stopwatch();
        let env = template_env();
        let mut out = Evaluated::default();
        for rule in &mut self.rules {
            let t0 = querier.stopwatch();
            let result = rule.eval(querier, &env, ts, generator, &mut out);
            rule.last_error = result.err().map(|e| e.to_string());
            rule.last_evaluation = Some(ts);
            rule.evaluation_time = querier.stopwatch().saturating_duration_since(t0);
        }
        self.last_evaluation = Some(ts);
        self.evaluation_time = querier.stopwatch().saturating_duration_since(started);
        out
    }
}

impl Rule {
    fn eval(
        &mut self,
        querier: &impl Querier,
        env: &minijinja::Environment<'_>,
        ts: i64,
        generator: &str,
        out: &mut Evaluated,
    ) -> Result<()> {
        let samples = instant_samples(querier.instant(&self.expr, ts)?)?;
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
                querier.record(&written)?;
                out.samples.extend(written);
            }
            Kind::Alerting {
                alert,
                hold,
                keep_firing_for,
                annotations,
                active,
            } => {
                let mut seen = HashSet::new();
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

#[cfg(test)]
#[path = "eval_tests.rs"]
mod tests;
