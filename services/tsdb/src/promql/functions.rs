//! PromQL functions returning instant vectors, with Prometheus' semantics (extrapolation for `rate`,
//! `increase` and `delta`; counter resets; stale markers excluded from range vectors).

use promql_parser::parser::{Call, Expr};

use super::{Error, Eval, Result, Series, bad, drop_name, millis};
use crate::chunk::is_stale;
use crate::store::Labels;

/// A function of the samples in one step's range: (samples, range start, range end, whether the samples
/// hold a counter reset).
type RangeFn = fn(&[(i64, f64)], i64, i64, bool) -> Option<f64>;

fn range_fn(name: &str) -> Option<RangeFn> {
    Some(match name {
        "rate" => |s, start, end, r| extrapolated(s, start, end, true, true, r),
        "increase" => |s, start, end, r| extrapolated(s, start, end, true, false, r),
        "delta" => |s, start, end, _| extrapolated(s, start, end, false, false, false),
        "irate" => |s, _, _, _| irate(s),
        "avg_over_time" => |s, _, _, _| (!s.is_empty()).then(|| sum(s) / s.len() as f64),
        "sum_over_time" => |s, _, _, _| (!s.is_empty()).then(|| sum(s)),
        "count_over_time" => |s, _, _, _| (!s.is_empty()).then_some(s.len() as f64),
        "min_over_time" => |s, _, _, _| fold(s, |a, b| if b < a || a.is_nan() { b } else { a }),
        "max_over_time" => |s, _, _, _| fold(s, |a, b| if b > a || a.is_nan() { b } else { a }),
        "last_over_time" => |s, _, _, _| s.last().map(|x| x.1),
        _ => return None,
    })
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
fn extrapolated(
    s: &[(i64, f64)],
    range_start: i64,
    range_end: i64,
    is_counter: bool,
    is_rate: bool,
    has_reset: bool,
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
    let mut to_start = (first_t - range_start) as f64 / 1000.0;
    let mut to_end = (range_end - last_t) as f64 / 1000.0;
    let sampled = (last_t - first_t) as f64 / 1000.0;
    let avg = sampled / (s.len() - 1) as f64;
    let threshold = avg * 1.1;
    if to_start >= threshold {
        to_start = avg / 2.0;
    }
    if is_counter && result > 0.0 && first_v >= 0.0 {
        let to_zero = sampled * (first_v / result);
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    if to_end >= threshold {
        to_end = avg / 2.0;
    }
    let mut factor = (sampled + to_start + to_end) / sampled;
    if is_rate {
        factor /= (range_end - range_start) as f64 / 1000.0;
    }
    Some(result * factor)
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

/// Streams the result series of a vector function call.
pub(super) fn call(ev: &Eval<'_>, c: &Call, f: &mut dyn FnMut(Series) -> Result<()>) -> Result<()> {
    let name = c.func.name;
    let args = &c.args.args;
    if let Some(func) = range_fn(name) {
        let Some(Expr::MatrixSelector(ms)) = args.first().map(|a| a.as_ref()) else {
            return bad(format!("{name}() needs a range vector selector argument"));
        };
        let range = millis(ms.range);
        let keep_name = name == "last_over_time";
        let compute = |labels: &Labels, refs: &[i64], samples: &[(i64, f64)]| {
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
            let (mut lo, mut hi) = (0usize, 0usize);
            let values: Vec<Option<f64>> = refs
                .iter()
                .map(|&t| {
                    let start = t - range;
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
                    func(slice, start, t, has_reset)
                })
                .collect();
            values.iter().any(Option::is_some).then(|| {
                let mut labels = labels.clone();
                if !keep_name {
                    drop_name(&mut labels);
                }
                Series { labels, values }
            })
        };
        return ev.map_selected(&ms.vs, range, &compute, f);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_of_a_steady_counter_is_its_slope() {
        // 0, 30, 60 … every 30 s: one per second. Range (0, 300] at t=300 s holds samples 30..300 s.
        let s: Vec<(i64, f64)> = (1..=10).map(|i| (i * 30_000, i as f64 * 30.0)).collect();
        let r = extrapolated(&s, 0, 300_000, true, true, false).expect("rate");
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
        let r = extrapolated(&s, 45_000, 165_000, true, false, true).expect("increase");
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
