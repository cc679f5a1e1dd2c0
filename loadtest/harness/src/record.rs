//! What a run records: time series (seconds since the start → value), marks on the timeline ("NATS down"),
//! and samples of latencies.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

/// One time series.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Series {
    /// Unit of the values.
    pub unit: String,
    /// (seconds since the run started, value).
    pub points: Vec<(f64, f64)>,
}

/// Everything recorded, shared between the run's tasks.
#[derive(Debug, Clone)]
pub struct Recorder {
    start: Instant,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default, Serialize)]
struct Inner {
    series: BTreeMap<String, Series>,
    marks: Vec<(f64, String)>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// Starts the clock.
    pub fn new() -> Self {
        Recorder {
            start: Instant::now(),
            inner: Arc::default(),
        }
    }

    /// Seconds since the start.
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// The start.
    pub fn start(&self) -> Instant {
        self.start
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a point to a series, now.
    pub fn point(&self, name: &str, unit: &str, value: f64) {
        let t = self.now();
        self.point_at(name, unit, t, value);
    }

    /// Adds a point at a given time.
    pub fn point_at(&self, name: &str, unit: &str, t: f64, value: f64) {
        let mut g = self.lock();
        let s = g.series.entry(name.to_string()).or_default();
        if s.unit.is_empty() {
            s.unit = unit.to_string();
        }
        s.points.push((t, value));
    }

    /// Marks a moment ("NATS down", "kill -9 correlator").
    pub fn mark(&self, what: impl Into<String>) {
        let what = what.into();
        tracing::info!(at = format!("{:.1}s", self.now()), "{what}");
        let t = self.now();
        self.lock().marks.push((t, what));
    }

    /// A copy of one series.
    pub fn series(&self, name: &str) -> Option<Series> {
        self.lock().series.get(name).cloned()
    }

    /// Copies of every series whose name starts with `prefix`.
    pub fn series_with_prefix(&self, prefix: &str) -> Vec<(String, Series)> {
        self.lock()
            .series
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The marks.
    pub fn marks(&self) -> Vec<(f64, String)> {
        self.lock().marks.clone()
    }

    /// Everything, as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(&*self.lock()).unwrap_or_default()
    }
}

/// p50/p95/p99/max/mean/count of a sample set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Summary {
    /// Summarises samples (nearest-rank percentiles); all zero when empty.
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Summary::default();
        }
        v.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
            v[i]
        };
        Summary {
            count: v.len(),
            p50: rank(0.50),
            p95: rank(0.95),
            p99: rank(0.99),
            max: v[v.len() - 1],
            mean: v.iter().sum::<f64>() / v.len() as f64,
        }
    }

    /// `p50 1.2 / p95 3.4 / p99 5.6 (max 7.8, n=90)` with a unit.
    pub fn line(&self, unit: &str) -> String {
        if self.count == 0 {
            return "no samples".into();
        }
        format!(
            "p50 {:.2} {unit} / p95 {:.2} {unit} / p99 {:.2} {unit} (max {:.2}, n={})",
            self.p50, self.p95, self.p99, self.max, self.count
        )
    }
}

/// Per-interval rates of a counter series: (t, (v1 - v0) / (t1 - t0)), skipping resets (a restarted process).
pub fn rates(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    points
        .windows(2)
        .filter(|w| w[1].1 >= w[0].1 && w[1].0 > w[0].0)
        .map(|w| (w[1].0, (w[1].1 - w[0].1) / (w[1].0 - w[0].0)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&v);
        assert_eq!((s.p50, s.p95, s.p99, s.max), (50.0, 95.0, 99.0, 100.0));
        assert_eq!(s.count, 100);
        assert_eq!(Summary::of(&[]).count, 0);
        assert_eq!(Summary::of(&[3.0]).p99, 3.0);
    }

    #[test]
    fn rates_skip_counter_resets() {
        let r = rates(&[(0.0, 0.0), (1.0, 10.0), (2.0, 3.0), (4.0, 7.0)]);
        assert_eq!(r, vec![(1.0, 10.0), (4.0, 2.0)]);
    }
}
