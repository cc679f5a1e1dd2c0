//! PromQL functions returning instant vectors, with Prometheus' semantics (extrapolation for `rate`,
//! `increase` and `delta`; counter resets; stale markers excluded from range vectors).

use promql_parser::parser::{Call, Expr};

use std::collections::HashMap;

use super::{
    ComputeFn, Error, Eval, Result, Series, Streamed, Value, bad, drop_name, millis, render,
    valid_label_name,
};
use crate::chunk::is_stale;
use crate::store::{Labels, METRIC_NAME, label};

/// The functions of a range vector.
const RANGE_FUNCTIONS: [&str; 10] = [
    "rate",
    "increase",
    "delta",
    "irate",
    "avg_over_time",
    "sum_over_time",
    "count_over_time",
    "min_over_time",
    "max_over_time",
    "last_over_time",
];

/// The divisions `extrapolated` needs, kept from one step to the next: in regularly scraped data every
/// window of a series spans the same time with the same number of samples, so they are computed once per
/// series instead of once per step (a division costs as much as the rest of the step).
#[derive(Debug, Default)]
struct Recip {
    /// (sampled ms, intervals, range ms) the values below are for; sampled is never 0 in use.
    key: (i64, usize, i64),
    inv_sampled: f64,
    half_interval: f64,
    per_second: f64,
}

impl Recip {
    fn get(&mut self, sampled: i64, intervals: usize, range: i64) -> &Recip {
        if self.key != (sampled, intervals, range) {
            self.key = (sampled, intervals, range);
            self.inv_sampled = 1.0 / sampled as f64;
            self.half_interval = sampled as f64 / intervals as f64 / 2.0;
            self.per_second = 1000.0 / range as f64;
        }
        self
    }
}

fn math_fn(name: &str) -> Option<fn(f64) -> f64> {
    Some(match name {
        "abs" => f64::abs,
        "ceil" => f64::ceil,
        "floor" => f64::floor,
        "round" => |v| (v + 0.5).floor(),
        "sqrt" => f64::sqrt,
        "exp" => f64::exp,
        "ln" => f64::ln,
        "log2" => f64::log2,
        "log10" => f64::log10,
        _ => return None,
    })
}

fn sum(s: &[(i64, f64)]) -> f64 {
    s.iter().map(|x| x.1).sum()
}

fn fold(s: &[(i64, f64)], f: fn(f64, f64) -> f64) -> Option<f64> {
    let (first, rest) = s.split_first()?;
    Some(rest.iter().fold(first.1, |a, x| f(a, x.1)))
}

/// Prometheus' `extrapolatedRate`: the change over the samples in the range, corrected for counter resets
/// and extrapolated towards the range's edges (not further than half a sample interval, nor below zero for
/// counters).
///
/// This runs once per series and step (86M times for a day of 30,000 series at 30 s), so it works in
/// milliseconds (the extrapolation factor is a ratio of durations) and takes its reciprocals from `recip`
/// instead of dividing; the results agree with the textbook form to rounding.
fn extrapolated(
    s: &[(i64, f64)],
    range_start: i64,
    range_end: i64,
    is_counter: bool,
    is_rate: bool,
    has_reset: bool,
    recip: &mut Recip,
) -> Option<f64> {
    if s.len() < 2 {
        return None;
    }
    let (first_t, first_v) = s[0];
    let (last_t, last_v) = s[s.len() - 1];
    let mut result = last_v - first_v;
    if is_counter && has_reset {
        let mut prev = first_v;
        for &(_, v) in &s[1..] {
            if v < prev {
                result += prev;
            }
            prev = v;
        }
    }
    // Samples lie in (range_start, range_end], so only the range itself can overflow (an absurd one).
    let r = recip.get(
        last_t - first_t,
        s.len() - 1,
        range_end.saturating_sub(range_start),
    );
    let intervals = (s.len() - 1) as f64;
    let sampled = (last_t - first_t) as f64;
    let mut to_start = first_t.saturating_sub(range_start) as f64;
    let mut to_end = (range_end - last_t) as f64;
    // `to ≥ 1.1 × average interval`, i.e. `to × intervals ≥ 1.1 × sampled`: more than a sample is missing
    // at that edge, so extrapolate by half an interval only.
    let threshold = sampled * 1.1;
    if to_start * intervals >= threshold {
        to_start = r.half_interval;
    }
    // A counter is not extrapolated below zero: `sampled × first / result` is where it would reach zero.
    if is_counter && result > 0.0 && first_v >= 0.0 && sampled * first_v < to_start * result {
        to_start = sampled * (first_v / result);
    }
    if to_end * intervals >= threshold {
        to_end = r.half_interval;
    }
    let factor = (sampled + to_start + to_end) * r.inv_sampled;
    Some(if is_rate {
        result * factor * r.per_second
    } else {
        result * factor
    })
}

/// Per-second rate from the last two samples (a decrease is a counter reset).
fn irate(s: &[(i64, f64)]) -> Option<f64> {
    let [.., (t0, v0), (t1, v1)] = s else {
        return None;
    };
    let dt = (t1 - t0) as f64 / 1000.0;
    if dt <= 0.0 {
        return None;
    }
    let delta = if v1 < v0 { *v1 } else { v1 - v0 };
    Some(delta / dt)
}

/// The computation of a range function (`rate`, `*_over_time`, …) over one series, and whether its output
/// keeps the metric name: for each reference time `t`, the function of the samples in `(t - range, t]`.
pub(super) fn range_compute(name: &str, range: i64) -> Option<(Box<ComputeFn<'static>>, bool)> {
    // Each function gets its own copy of the window loop (a generic), so the per-step function is inlined
    // into it: it runs once per series and step.
    let compute: Box<ComputeFn<'static>> = match name {
        "rate" => windowed(range, |s, start, end, r, c| {
            extrapolated(s, start, end, true, true, r, c)
        }),
        "increase" => windowed(range, |s, start, end, r, c| {
            extrapolated(s, start, end, true, false, r, c)
        }),
        "delta" => windowed(range, |s, start, end, _, c| {
            extrapolated(s, start, end, false, false, false, c)
        }),
        "irate" => windowed(range, |s, _, _, _, _| irate(s)),
        "avg_over_time" => windowed(range, |s, _, _, _, _| {
            (!s.is_empty()).then(|| sum(s) / s.len() as f64)
        }),
        "sum_over_time" => windowed(range, |s, _, _, _, _| (!s.is_empty()).then(|| sum(s))),
        "count_over_time" => windowed(range, |s, _, _, _, _| {
            (!s.is_empty()).then_some(s.len() as f64)
        }),
        "min_over_time" => windowed(range, |s, _, _, _, _| {
            fold(s, |a, b| if b < a || a.is_nan() { b } else { a })
        }),
        "max_over_time" => windowed(range, |s, _, _, _, _| {
            fold(s, |a, b| if b > a || a.is_nan() { b } else { a })
        }),
        "last_over_time" => windowed(range, |s, _, _, _, _| s.last().map(|x| x.1)),
        _ => return None,
    };
    Some((compute, name == "last_over_time"))
}

/// The window loop of a range function `func` of (samples in one step's range, range start, range end,
/// whether those samples hold a counter reset, the series' reciprocal cache). One pass over the samples:
/// the window slides forward with the (sorted) reference times.
fn windowed<F>(range: i64, func: F) -> Box<ComputeFn<'static>>
where
    F: Fn(&[(i64, f64)], i64, i64, bool, &mut Recip) -> Option<f64> + Sync + 'static,
{
    Box::new(
        move |refs: &[i64], samples: &[(i64, f64)], out: &mut Vec<Option<f64>>| {
            // Range vectors never hold stale markers.
            let owned: Vec<(i64, f64)>;
            let samples = if samples.iter().any(|s| is_stale(s.1)) {
                owned = samples.iter().copied().filter(|s| !is_stale(s.1)).collect();
                &owned[..]
            } else {
                samples
            };
            // resets[j]: counter resets among samples 1..=j, so a window's are found in O(1).
            let mut resets = Vec::with_capacity(samples.len());
            let mut n = 0u32;
            for (j, s) in samples.iter().enumerate() {
                if j > 0 && s.1 < samples[j - 1].1 {
                    n += 1;
                }
                resets.push(n);
            }
            let monotonic = refs.is_sorted();
            let mut recip = Recip::default();
            let (mut lo, mut hi) = (0usize, 0usize);
            out.clear();
            out.extend(refs.iter().map(|&t| {
                let start = t.saturating_sub(range);
                if monotonic {
                    while lo < samples.len() && samples[lo].0 <= start {
                        lo += 1;
                    }
                    hi = hi.max(lo);
                    while hi < samples.len() && samples[hi].0 <= t {
                        hi += 1;
                    }
                } else {
                    lo = samples.partition_point(|s| s.0 <= start);
                    hi = samples.partition_point(|s| s.0 <= t).max(lo);
                }
                let slice = &samples[lo..hi];
                let has_reset = hi >= lo + 2 && resets[hi - 1] > resets[lo];
                func(slice, start, t, has_reset, &mut recip)
            }));
            out.iter().any(Option::is_some)
        },
    )
}

/// Streams the result series of a vector function call.
pub(super) fn call(ev: &Eval<'_>, c: &Call, f: &mut dyn FnMut(Series) -> Result<()>) -> Result<()> {
    let name = c.func.name;
    let args = &c.args.args;
    if RANGE_FUNCTIONS.contains(&name) {
        let range = match args.first().map(|a| a.as_ref()) {
            Some(Expr::MatrixSelector(ms)) => millis(ms.range),
            Some(Expr::Subquery(sq)) => millis(sq.range),
            _ => return bad(format!("{name}() needs a range vector argument")),
        };
        let Some((compute, keep_name)) = range_compute(name, range) else {
            return bad(format!("function {name}() is not supported by this TSDB"));
        };
        return match args.first().map(|a| a.as_ref()) {
            Some(Expr::MatrixSelector(ms)) => ev.map_selected(
                &Streamed {
                    vs: &ms.vs,
                    window: range,
                    keep_name,
                    compute,
                },
                f,
            ),
            Some(Expr::Subquery(sq)) => ev.map_subquery(sq, keep_name, &*compute, f),
            _ => bad(format!("{name}() needs a range vector argument")),
        };
    }
    match name {
        "histogram_quantile" => return histogram_quantile(ev, c, f),
        "label_replace" => return label_replace(ev, c, f),
        "label_join" => return label_join(ev, c, f),
        _ => {}
    }
    let first = args
        .first()
        .ok_or_else(|| Error::BadData(format!("{name}() needs an argument")))?;
    if let Some(m) = math_fn(name) {
        return ev.each_series(first, &mut |mut s| {
            drop_name(&mut s.labels);
            for v in s.values.iter_mut().flatten() {
                *v = m(*v);
            }
            f(s)
        });
    }
    if name == "clamp_min" || name == "clamp_max" {
        let bound = match args.get(1) {
            Some(b) => ev.eval_scalar(b)?,
            None => return bad(format!("{name}() needs two arguments")),
        };
        let is_min = name == "clamp_min";
        return ev.each_series(first, &mut |mut s| {
            drop_name(&mut s.labels);
            for (i, v) in s.values.iter_mut().enumerate() {
                if let Some(v) = v {
                    *v = if is_min {
                        v.max(bound[i])
                    } else {
                        v.min(bound[i])
                    };
                }
            }
            f(s)
        });
    }
    bad(format!("function {name}() is not supported by this TSDB"))
}

/// The string literal argument `i` of a call.
fn string_arg(ev: &Eval<'_>, c: &Call, i: usize) -> Result<String> {
    let name = c.func.name;
    match c.args.args.get(i).map(|a| ev.eval(a)).transpose()? {
        Some(Value::String(s)) => Ok(s),
        _ => bad(format!("{name}() needs a string as argument {}", i + 1)),
    }
}

/// Collects relabelled series, merging those that end up with the same labels (a range query's series
/// can meet at different steps); the same labels at the same step is Prometheus' "same labelset" error.
#[derive(Default)]
struct Merge {
    out: Vec<Series>,
    index: HashMap<Labels, usize>,
}

impl Merge {
    fn push(&mut self, s: Series) -> Result<()> {
        let Some(&k) = self.index.get(&s.labels) else {
            self.index.insert(s.labels.clone(), self.out.len());
            self.out.push(s);
            return Ok(());
        };
        let into = &mut self.out[k];
        for (a, b) in into.values.iter_mut().zip(s.values) {
            if b.is_some() && a.replace(b.unwrap_or_default()).is_some() {
                return bad(format!(
                    "vector cannot contain metrics with the same labelset {}",
                    render(&s.labels)
                ));
            }
        }
        Ok(())
    }

    fn emit(self, f: &mut dyn FnMut(Series) -> Result<()>) -> Result<()> {
        self.out.into_iter().try_for_each(f)
    }
}

/// Sets `name` to `value` (removes it when `value` is empty), keeping the labels sorted.
fn set_label(labels: &mut Labels, name: &str, value: String) {
    labels.retain(|(k, _)| k != name);
    if !value.is_empty() {
        let pos = labels.partition_point(|(k, _)| k.as_str() < name);
        labels.insert(pos, (name.to_string(), value));
    }
}

/// `label_replace(v, dst, replacement, src, regex)`: where `regex` matches the whole of `src`'s value, `dst`
/// becomes `replacement` with `$1`, `${name}` expanded (an empty result removes `dst`).
fn label_replace(ev: &Eval<'_>, c: &Call, f: &mut dyn FnMut(Series) -> Result<()>) -> Result<()> {
    let [v, _, _, _, _] = &c.args.args[..] else {
        return bad("label_replace() needs 5 arguments");
    };
    let dst = string_arg(ev, c, 1)?;
    let replacement = string_arg(ev, c, 2)?;
    let src = string_arg(ev, c, 3)?;
    let pattern = string_arg(ev, c, 4)?;
    let re = regex::Regex::new(&format!("^(?s:{pattern})$")).map_err(|e| {
        Error::BadData(format!(
            "invalid regular expression in label_replace(): {pattern}: {e}"
        ))
    })?;
    if !valid_label_name(&dst) {
        return bad(format!(
            "invalid destination label name in label_replace(): {dst}"
        ));
    }
    let mut merge = Merge::default();
    ev.each_series(v, &mut |mut s| {
        if let Some(caps) = re.captures(label(&s.labels, &src)) {
            let mut value = String::new();
            caps.expand(&replacement, &mut value);
            set_label(&mut s.labels, &dst, value);
        }
        merge.push(s)
    })?;
    merge.emit(f)
}

/// `label_join(v, dst, separator, src…)`: `dst` becomes the `src` labels' values joined by `separator` (an
/// empty result removes `dst`).
fn label_join(ev: &Eval<'_>, c: &Call, f: &mut dyn FnMut(Series) -> Result<()>) -> Result<()> {
    let args = &c.args.args;
    if args.len() < 3 {
        return bad("label_join() needs at least 3 arguments");
    }
    let dst = string_arg(ev, c, 1)?;
    let sep = string_arg(ev, c, 2)?;
    let srcs = (3..args.len())
        .map(|i| string_arg(ev, c, i))
        .collect::<Result<Vec<_>>>()?;
    if !valid_label_name(&dst) {
        return bad(format!(
            "invalid destination label name in label_join(): {dst}"
        ));
    }
    let mut merge = Merge::default();
    ev.each_series(&args[0], &mut |mut s| {
        let value = srcs
            .iter()
            .map(|src| label(&s.labels, src))
            .collect::<Vec<_>>()
            .join(&sep);
        set_label(&mut s.labels, &dst, value);
        merge.push(s)
    })?;
    merge.emit(f)
}

/// One bucket series of a histogram: its upper bound and its values per step.
type Bucket = (f64, Vec<Option<f64>>);

/// `histogram_quantile(φ, buckets)` over classic histograms: the series of one histogram (same labels but
/// `le`) are its cumulative buckets; the quantile is interpolated linearly inside its bucket, as in
/// Prometheus' `bucketQuantile`.
fn histogram_quantile(
    ev: &Eval<'_>,
    c: &Call,
    f: &mut dyn FnMut(Series) -> Result<()>,
) -> Result<()> {
    let [phi, v] = &c.args.args[..] else {
        return bad("histogram_quantile() needs 2 arguments");
    };
    let phi = ev.eval_scalar(phi)?;
    let mut groups: HashMap<Labels, Vec<Bucket>> = HashMap::new();
    ev.each_series(v, &mut |mut s| {
        // Series without a parseable `le` are not buckets: ignored, as in Prometheus.
        let Ok(upper) = label(&s.labels, "le").parse::<f64>() else {
            return Ok(());
        };
        s.labels.retain(|(k, _)| k != "le" && k != METRIC_NAME);
        groups.entry(s.labels).or_default().push((upper, s.values));
        Ok(())
    })?;
    let mut out: Vec<Series> = Vec::with_capacity(groups.len());
    let mut buckets = Vec::new();
    for (labels, members) in groups {
        let values: Vec<Option<f64>> = (0..ev.n())
            .map(|i| {
                buckets.clear();
                buckets.extend(members.iter().filter_map(|(le, v)| v[i].map(|v| (*le, v))));
                (!buckets.is_empty()).then(|| bucket_quantile(phi[i], &mut buckets))
            })
            .collect();
        if values.iter().any(Option::is_some) {
            out.push(Series { labels, values });
        }
    }
    out.sort_by(|a, b| a.labels.cmp(&b.labels));
    out.into_iter().try_for_each(f)
}

/// Prometheus' `bucketQuantile` over (upper bound, cumulative count) buckets: NaN without a `+Inf` bucket or
/// observations; buckets with the same bound are added up; counts forced monotonic.
fn bucket_quantile(q: f64, buckets: &mut Vec<(f64, f64)>) -> f64 {
    if q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    if buckets.last().is_none_or(|b| b.0 != f64::INFINITY) {
        return f64::NAN;
    }
    buckets.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 += later.1;
        }
        same
    });
    // Prometheus ignores relative differences below 1e-12 (float noise), then forces monotonicity.
    let mut prev = buckets[0].1;
    for b in buckets.iter_mut().skip(1) {
        if b.1 == prev {
            continue;
        }
        if (b.1 - prev).abs() <= 1e-12 * b.1.abs().max(prev.abs()) || b.1 < prev {
            b.1 = prev;
            continue;
        }
        prev = b.1;
    }
    if buckets.len() < 2 {
        return f64::NAN;
    }
    let observations = buckets[buckets.len() - 1].1;
    if observations == 0.0 || observations.is_nan() {
        return f64::NAN;
    }
    let mut rank = q * observations;
    let last = buckets.len() - 1;
    let b = buckets[..last].partition_point(|x| x.1 < rank);
    if b == last {
        return buckets[last - 1].0;
    }
    if b == 0 && buckets[0].0 <= 0.0 {
        return buckets[0].0;
    }
    let (mut start, end, mut count) = (0.0, buckets[b].0, buckets[b].1);
    if b > 0 {
        start = buckets[b - 1].0;
        count -= buckets[b - 1].1;
        rank -= buckets[b - 1].1;
    }
    start + (end - start) * (rank / count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_of_a_steady_counter_is_its_slope() {
        // 0, 30, 60 … every 30 s: one per second. Range (0, 300] at t=300 s holds samples 30..300 s.
        let s: Vec<(i64, f64)> = (1..=10).map(|i| (i * 30_000, i as f64 * 30.0)).collect();
        let r =
            extrapolated(&s, 0, 300_000, true, true, false, &mut Recip::default()).expect("rate");
        // first sample at 30 s is within 1.1 × 30 s of the start: extrapolate the whole 30 s, but not below
        // zero: the counter reaches 0 exactly at 0 s, so 300 s of increase at 1/s.
        assert!((r - 1.0).abs() < 1e-12, "{r}");
    }

    #[test]
    fn increase_handles_a_counter_reset() {
        // 10, 20, 5 (reset), 15 at 60, 90, 120, 150 s; range (45, 165].
        let s = [
            (60_000, 10.0),
            (90_000, 20.0),
            (120_000, 5.0),
            (150_000, 15.0),
        ];
        // Raw increase: 15 - 10 + 20 (reset) = 25 over 90 s sampled; to_start = 15 s, to_end = 15 s
        // (both below 1.1 × 30 s); zero point 90 × 10/25 = 36 s > 15 s. Factor (90 + 30) / 90.
        let r = extrapolated(
            &s,
            45_000,
            165_000,
            true,
            false,
            true,
            &mut Recip::default(),
        )
        .expect("increase");
        assert!((r - 25.0 * 120.0 / 90.0).abs() < 1e-9, "{r}");
    }

    #[test]
    fn irate_uses_the_last_two_samples() {
        let s = [(0, 1.0), (10_000, 5.0), (15_000, 15.0)];
        assert_eq!(irate(&s), Some(2.0));
        assert_eq!(irate(&[(0, 10.0), (10_000, 4.0)]), Some(0.4));
        assert_eq!(irate(&[(0, 1.0)]), None);
    }
}
