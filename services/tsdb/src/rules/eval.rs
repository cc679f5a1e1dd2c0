//! The rules' machine: a group evaluated at a given time against a [`Querier`], giving the recording rules'
//! samples and the alerts to send. An alerting rule's alerts go pending, fire once `for` has elapsed, stay
//! firing `keep_firing_for` after their condition clears, and are then resolved (kept and re-sent with
//! `endsAt` for 15 minutes), as in Prometheus. As Prometheus does, an alerting rule writes `ALERTS` (1 per
//! pending or firing alert, with `alertstate`) and `ALERTS_FOR_STATE` (when it became active, in seconds)
//! series; a series a rule wrote at its last evaluation and not at this one gets a staleness marker; and
//! after a restart a rule whose `for` is at least 10 minutes takes its alerts' `for` state back from
//! `ALERTS_FOR_STATE` ([`Group::restore_for_state`]).
//!
//! It reads no clock and does no I/O: the evaluation time is an argument, queries and recorded samples go
//! through the [`Querier`] (the shell's is the PromQL [`Engine`](crate::promql::Engine) over the store).

use std::collections::{BTreeMap, HashMap, HashSet};
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
    /// Writes samples into the store — a recording rule's (so that the rules after it see them), an
    /// alerting rule's `ALERTS` and `ALERTS_FOR_STATE`, staleness markers.
    fn record(&self, samples: &[Sample]) -> Result<(), promql::Error>;
    /// The last sample in `[from, to]` (ms), a staleness marker included, of each series named `name`
    /// with this `alertname`, by its labels without the name.
    fn last_samples(
        &self,
        name: &str,
        alertname: &str,
        from: i64,
        to: i64,
    ) -> Result<Vec<(Labels, i64, f64)>, promql::Error>;
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
    /// The series the last evaluation wrote (name and labels, by hash): those the next one does not write
    /// get a staleness marker.
    pub written: Written,
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
    /// Its `for` state restored, or not to be ([`Group::restore_for_state`]): until then, as in Prometheus,
    /// its alerting rules write no `ALERTS` or `ALERTS_FOR_STATE` samples.
    pub restored: bool,
    /// Evaluations since it was loaded.
    pub evaluations: u64,
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

/// The series of pending and firing alerts (Prometheus' names).
pub const ALERTS: &str = "ALERTS";
/// The series of when each pending or firing alert became active (seconds).
pub const ALERTS_FOR_STATE: &str = "ALERTS_FOR_STATE";
/// Prometheus' `--rules.alert.for-grace-period`: a restored alert fires no sooner than this after the
/// restart, and a rule with a shorter `for` is not restored at all (it waits its `for` again).
const FOR_GRACE_PERIOD_MS: i64 = 10 * 60_000;
/// Prometheus' `--rules.alert.for-outage-tolerance`: a `for` state older than this is not restored.
const FOR_OUTAGE_TOLERANCE_MS: i64 = 60 * 60_000;

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
    /// Whether its `for` state is to be restored now: not yet, and evaluated twice since it was loaded.
    fn restore_due(&self) -> bool {
        !self.restored && self.evaluations >= 2
    }

    /// Takes back the `for` state of its alerting rules' pending alerts from the `ALERTS_FOR_STATE` series
    /// a run before this one wrote, as Prometheus does after the second evaluation since its start (the
    /// first may run before the metrics of the time it was down are in): for a rule whose `for` is at
    /// least the grace period (10 min; a shorter one waits its `for` again), an alert whose state was
    /// written within the outage tolerance (1 h) before the last evaluation and not marked stale since
    /// takes it back: one whose `for` was over (it was firing) fires again at the next evaluation; one with
    /// less than the grace period of its `for` left fires the grace period after the restore; any other
    /// is active from when it was, moved later by the time the TSDB was down.
    pub fn restore_for_state(&mut self, querier: &impl Querier) {
        if !self.restore_due() {
            return;
        }
        let Some(ts) = self.last_evaluation else {
            return;
        };
        self.restored = true;
        for rule in &mut self.rules {
            let Kind::Alerting {
                alert,
                hold,
                active,
                ..
            } = &mut rule.kind
            else {
                continue;
            };
            let hold_ms = hold.as_millis() as i64;
            if hold_ms < FOR_GRACE_PERIOD_MS || active.is_empty() {
                continue;
            }
            let found = match querier.last_samples(
                ALERTS_FOR_STATE,
                alert,
                ts - FOR_OUTAGE_TOLERANCE_MS,
                ts,
            ) {
                Ok(found) => found,
                Err(e) => {
                    tracing::warn!(rule = %alert, error = %e, "restoring the 'for' state failed");
                    continue;
                }
            };
            let by_labels: HashMap<BTreeMap<String, String>, (i64, f64)> = found
                .into_iter()
                .map(|(labels, t, v)| (labels.into_iter().collect(), (t, v)))
                .collect();
            for a in active.values_mut() {
                let Some(&(down_at, v)) = by_labels.get(&a.labels) else {
                    continue;
                };
                if a.state != AlertState::Pending || crate::chunk::is_stale(v) {
                    continue;
                }
                // Prometheus keeps whole seconds
                let (down_at, active_at) = (down_at.div_euclid(1000) * 1000, v as i64 * 1000);
                let remaining = hold_ms - (down_at - active_at);
                a.active_at = if remaining <= 0 {
                    active_at
                } else if remaining < FOR_GRACE_PERIOD_MS {
                    ts + FOR_GRACE_PERIOD_MS - hold_ms
                } else {
                    active_at + (ts - down_at)
                };
            }
        }
    }

    /// Evaluates every rule at `ts` (ms): recording rules' samples are written through `querier` before
    /// the next rule runs; returns the samples written and the alerts to send. A failing rule is recorded
    /// in its `last_error` and the others still run. `generator` is the base of `generatorURL`.
    pub fn eval(&mut self, querier: &impl Querier, ts: i64, generator: &str) -> Evaluated {
        let started = querier.stopwatch();
        let env = template_env();
        let mut out = Evaluated::default();
        for rule in &mut self.rules {
            let t0 = querier.stopwatch();
            let result = rule
                .eval(querier, &env, ts, generator, self.restored, &mut out)
                .and_then(|written| rule.mark_stale(querier, written, ts));
            rule.last_error = result.err().map(|e| e.to_string());
            rule.last_evaluation = Some(ts);
            rule.evaluation_time = querier.stopwatch().saturating_duration_since(t0);
        }
        self.last_evaluation = Some(ts);
        self.evaluations += 1;
        self.evaluation_time = querier.stopwatch().saturating_duration_since(started);
        out
    }
}

/// The series a rule wrote, by hash (see [`Rule::written`]).
pub type Written = HashMap<u64, (String, BTreeMap<String, String>)>;

fn written_of(samples: &[Sample]) -> Written {
    samples
        .iter()
        .map(|s| {
            let mut l = s.labels.clone();
            l.insert(METRIC_NAME.into(), s.name.clone());
            (hash_labels(&l), (s.name.clone(), s.labels.clone()))
        })
        .collect()
}

impl Rule {
    /// Writes a staleness marker at `ts` for each series the last evaluation wrote and this one
    /// (`written`) did not, as Prometheus does: a query stops seeing it at once, not 5 minutes later.
    fn mark_stale(&mut self, querier: &impl Querier, written: Written, ts: i64) -> Result<()> {
        let gone: Vec<Sample> = self
            .written
            .iter()
            .filter(|(h, _)| !written.contains_key(h))
            .map(|(_, (name, labels))| Sample {
                name: name.clone(),
                labels: labels.clone(),
                value: f64::from_bits(crate::chunk::STALE_NAN_BITS),
                timestamp_ms: ts,
            })
            .collect();
        if !gone.is_empty() {
            querier.record(&gone)?;
        }
        self.written = written;
        Ok(())
    }

    /// Evaluates the rule at `ts`; returns the series it wrote (an alerting rule's `ALERTS` and
    /// `ALERTS_FOR_STATE` only once its group's `for` state is `restored`).
    fn eval(
        &mut self,
        querier: &impl Querier,
        env: &minijinja::Environment<'_>,
        ts: i64,
        generator: &str,
        restored: bool,
        out: &mut Evaluated,
    ) -> Result<Written> {
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
                let series = written_of(&written);
                out.samples.extend(written);
                Ok(series)
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
                        // (an empty value removes the label, as in Prometheus)
                        match render(env, t, &base, v)? {
                            value if value.is_empty() => l.remove(k),
                            value => l.insert(k.clone(), value),
                        };
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
                // ALERTS and ALERTS_FOR_STATE, as Prometheus writes them
                let mut series = Vec::new();
                if restored {
                    for a in active.values() {
                        let state = match a.state {
                            AlertState::Inactive => continue,
                            AlertState::Pending => "pending",
                            AlertState::Firing => "firing",
                        };
                        let mut l = a.labels.clone();
                        series.push(Sample {
                            name: ALERTS_FOR_STATE.into(),
                            labels: l.clone(),
                            value: a.active_at.div_euclid(1000) as f64,
                            timestamp_ms: ts,
                        });
                        l.insert("alertstate".into(), state.into());
                        series.push(Sample {
                            name: ALERTS.into(),
                            labels: l,
                            value: 1.0,
                            timestamp_ms: ts,
                        });
                    }
                }
                // (after the alerts are out: a store that fails to take them stops no notification)
                if !series.is_empty() {
                    querier.record(&series)?;
                }
                Ok(written_of(&series))
            }
        }
    }
}

#[cfg(test)]
#[path = "eval_tests.rs"]
mod tests;
