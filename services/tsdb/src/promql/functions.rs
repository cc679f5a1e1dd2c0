//! PromQL functions returning instant vectors, with Prometheus' semantics (extrapolation for `rate`,
//! `increase` and `delta`; counter resets; stale markers excluded from range vectors).

use promql_parser::parser::{Call, Expr};

use std::collections::HashMap;

use super::{
    ComputeFn, Error, Eval, Result, Series, Streamed, Value, bad, drop_name, kahan_inc, millis,
    valid_label_name,
};
use crate::chunk::is_stale;
use crate::store::{Labels, METRIC_NAME, label};

/// The functions of a range vector.
const RANGE_FUNCTIONS: [&str; 19] = [
    "rate",
    "increase",
    "delta",
    "irate",
    "idelta",
    "avg_over_time",
    "sum_over_time",
    "count_over_time",
    "min_over_time",
    "max_over_time",
    "last_over_time",
    "present_over_time",
    "stddev_over_time",
    "stdvar_over_time",
    "quantile_over_time",
    "changes",
    "resets",
    "deriv",
    "predict_linear",
];

fn math_fn(name: &str) -> Option<fn(f64) -> f64> {
    Some(match name {
        "abs" => f64::abs,
        "ceil" => f64::ceil,
        "floor" => f64::floor,
        "sqrt" => f64::sqrt,
        "exp" => f64::exp,
        "ln" => f64::ln,
        "log2" => f64::log2,
        "log10" => f64::log10,
        "sin" => f64::sin,
        "cos" => f64::cos,
        "tan" => f64::tan,
        "asin" => f64::asin,
        "acos" => f64::acos,
        "atan" => f64::atan,
        "sinh" => f64::sinh,
        "cosh" => f64::cosh,
        "tanh" => f64::tanh,
        "asinh" => f64::asinh,
        "acosh" => f64::acosh,
        "atanh" => f64::atanh,
        "rad" => |v| v * std::f64::consts::PI / 180.0,
        "deg" => |v| v * 180.0 / std::f64::consts::PI,
        "sgn" => |v| {
            if v < 0.0 {
                -1.0
            } else if v > 0.0 {
                1.0
            } else {
                v // 0 and NaN
            }
        },
        _ => return None,
    })
}

/// The calendar functions of a Unix time in seconds (UTC), as Prometheus' `dateWrapper`.
fn date_fn(name: &str) -> Option<fn(f64) -> f64> {
    use chrono::{Datelike, Timelike};
    fn at(v: f64) -> chrono::DateTime<chrono::Utc> {
        // Go's int64(v) of NaN/±Inf is i64::MIN on amd64; chrono can't hold that: the epoch instead.
        chrono::DateTime::from_timestamp(v as i64, 0).unwrap_or_default()
    }
    Some(match name {
        "year" => |v| at(v).year() as f64,
        "month" => |v| at(v).month() as f64,
        "day_of_month" => |v| at(v).day() as f64,
        "day_of_week" => |v| at(v).weekday().num_days_from_sunday() as f64,
        "day_of_year" => |v| at(v).ordinal() as f64,
        "hour" => |v| at(v).hour() as f64,
        "minute" => |v| at(v).minute() as f64,
        "days_in_month" => |v| {
            let d = at(v);
            let (y, m) = (d.year(), d.month());
            let next = if m == 12 {
                chrono::NaiveDate::from_ymd_opt(y + 1, 1, 1)
            } else {
                chrono::NaiveDate::from_ymd_opt(y, m + 1, 1)
            };
            next.and_then(|n| n.pred_opt())
                .map_or(f64::NAN, |l| l.day() as f64)
        },
        _ => return None,
    })
}

/// Compensated sum of the values, as Prometheus' `sum_over_time`.
fn sum(s: &[(i64, f64)]) -> f64 {
    let (mut t, mut c) = (0.0, 0.0);
    for x in s {
        (t, c) = kahan_inc(x.1, t, c);
    }
    if t.is_infinite() { t } else { t + c }
}

/// Prometheus' `avg_over_time`: a compensated sum while it stays finite, then an incremental mean.
fn avg(s: &[(i64, f64)]) -> Option<f64> {
    let (first, rest) = s.split_first()?;
    let (mut total, mut c, mut mean, mut incremental) = (first.1, 0.0, 0.0, false);
    for (i, x) in rest.iter().enumerate() {
        let count = (i + 2) as f64;
        if !incremental {
            let (t, nc) = kahan_inc(x.1, total, c);
            if !t.is_infinite() {
                (total, c) = (t, nc);
                continue;
            }
            incremental = true;
            mean = total / (count - 1.0);
            c /= count - 1.0;
        }
        let q = (count - 1.0) / count;
        (mean, c) = kahan_inc(x.1 / count, q * mean, q * c);
    }
    let n = s.len() as f64;
    Some(if incremental {
        mean + c
    } else {
        total / n + c / n
    })
}

/// Population variance of the values, as Prometheus' `stdvar_over_time` (compensated running mean).
fn variance(s: &[(i64, f64)]) -> Option<f64> {
    if s.is_empty() {
        return None;
    }
    let (mut count, mut mean, mut c_mean, mut aux, mut c_aux) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for x in s {
        count += 1.0;
        let delta = x.1 - (mean + c_mean);
        (mean, c_mean) = kahan_inc(delta / count, mean, c_mean);
        (aux, c_aux) = kahan_inc(delta * (x.1 - (mean + c_mean)), aux, c_aux);
    }
    Some((aux + c_aux) / count)
}

/// Prometheus' `linearRegression`: slope and intercept at `intercept_t` (ms) of the least-squares line.
fn linear_regression(s: &[(i64, f64)], intercept_t: i64) -> (f64, f64) {
    let init = s[0].1;
    let mut const_y = true;
    let (mut n, mut sx, mut cx, mut sy, mut cy, mut sxy, mut cxy, mut sx2, mut cx2) =
        (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (i, &(t, v)) in s.iter().enumerate() {
        if const_y && i > 0 && v != init {
            const_y = false;
        }
        n += 1.0;
        let x = (t - intercept_t) as f64 / 1e3;
        (sx, cx) = kahan_inc(x, sx, cx);
        (sy, cy) = kahan_inc(v, sy, cy);
        (sxy, cxy) = kahan_inc(x * v, sxy, cxy);
        (sx2, cx2) = kahan_inc(x * x, sx2, cx2);
    }
    if const_y {
        if init.is_infinite() {
            return (f64::NAN, f64::NAN);
        }
        return (0.0, init);
    }
    let (sx, sy, sxy, sx2) = (sx + cx, sy + cy, sxy + cxy, sx2 + cx2);
    let cov = sxy - sx * sy / n;
    let var = sx2 - sx * sx / n;
    let slope = cov / var;
    (slope, sy / n - slope * sx / n)
}

fn fold(s: &[(i64, f64)], f: fn(f64, f64) -> f64) -> Option<f64> {
    let (first, rest) = s.split_first()?;
    Some(rest.iter().fold(first.1, |a, x| f(a, x.1)))
}

/// Prometheus' `extrapolatedRate`: the change over the samples in the range, corrected for counter resets
/// and extrapolated towards the range's edges (not further than half a sample interval, nor below zero for
/// counters).
///
/// The arithmetic is Prometheus' own, operation for operation (durations in seconds, the factor divided,
/// not multiplied by a reciprocal), so results agree to the last bit: `rate(x[40s]) - rate(x[1m] offset
/// …)` over the same samples is exactly 0, as Prometheus answers it.
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
    let mut to_start = first_t.saturating_sub(range_start) as f64 / 1000.0;
    let mut to_end = range_end.saturating_sub(last_t) as f64 / 1000.0;
    let sampled = (last_t - first_t) as f64 / 1000.0;
    let average = sampled / (s.len() - 1) as f64;
    // a sample missing at an edge: the series starts or ends within the range, so extrapolate by half an
    // interval only
    let threshold = average * 1.1;
    if to_start >= threshold {
        to_start = average / 2.0;
    }
    if is_counter {
        // a counter is not extrapolated below zero
        let mut to_zero = to_start;
        if result > 0.0 && first_v >= 0.0 {
            to_zero = sampled * (first_v / result);
        }
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    if to_end >= threshold {
        to_end = average / 2.0;
    }
    let mut factor = (sampled + to_start + to_end) / sampled;
    if is_rate {
        factor /= range_end.saturating_sub(range_start) as f64 / 1000.0;
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

/// The computation of a range function (`rate`, `*_over_time`, …) over one series, and whether its output
/// keeps the metric name: for each reference time `t`, the function of the samples in `(t - range, t]`.
pub(super) fn range_compute(name: &str, range: i64) -> Option<(Box<ComputeFn<'static>>, bool)> {
    range_compute_with(name, range, Vec::new(), Vec::new())
}

/// [`range_compute`] with the per-step scalar parameter of `quantile_over_time` or `predict_linear`.
pub(super) fn range_compute_with(
    name: &str,
    range: i64,
    param: Vec<f64>,
    times: Vec<i64>,
) -> Option<(Box<ComputeFn<'static>>, bool)> {
    let param_at = move |k: usize| param.get(k).copied().unwrap_or(f64::NAN);
    // predict_linear's intercept is at the evaluation time (not the window's end under `@`/`offset`)
    let time_at = move |k: usize, end: i64| times.get(k).copied().unwrap_or(end);
    // Each function gets its own copy of the window loop (a generic), so the per-step function is inlined
    // into it: it runs once per series and step.
    let compute: Box<ComputeFn<'static>> = match name {
        "idelta" => windowed(range, |s, _, _, _| {
            let [.., (_, v0), (_, v1)] = s else {
                return None;
            };
            Some(v1 - v0)
        }),
        "present_over_time" => windowed(range, |s, _, _, _| (!s.is_empty()).then_some(1.0)),
        "stdvar_over_time" => windowed(range, |s, _, _, _| variance(s)),
        "stddev_over_time" => windowed(range, |s, _, _, _| variance(s).map(f64::sqrt)),
        "changes" => windowed(range, |s, _, _, _| {
            (!s.is_empty()).then(|| {
                s.windows(2)
                    .filter(|w| w[1].1 != w[0].1 && !(w[1].1.is_nan() && w[0].1.is_nan()))
                    .count() as f64
            })
        }),
        "resets" => windowed(range, |s, _, _, _| {
            (!s.is_empty()).then(|| s.windows(2).filter(|w| w[1].1 < w[0].1).count() as f64)
        }),
        "deriv" => windowed(range, |s, _, _, _| {
            (s.len() >= 2).then(|| linear_regression(s, s[0].0).0)
        }),
        "predict_linear" => windowed_k(range, move |s, _, t, k| {
            if s.len() < 2 {
                return None;
            }
            let (slope, intercept) = linear_regression(s, time_at(k, t));
            Some(slope * param_at(k) + intercept)
        }),
        "quantile_over_time" => windowed_k(range, move |s, _, _, k| {
            if s.is_empty() {
                return None;
            }
            let mut values: Vec<f64> = s.iter().map(|x| x.1).collect();
            Some(super::quantile(param_at(k), &mut values))
        }),
        "rate" => windowed(range, |s, start, end, r| {
            extrapolated(s, start, end, true, true, r)
        }),
        "increase" => windowed(range, |s, start, end, r| {
            extrapolated(s, start, end, true, false, r)
        }),
        "delta" => windowed(range, |s, start, end, _| {
            extrapolated(s, start, end, false, false, false)
        }),
        "irate" => windowed(range, |s, _, _, _| irate(s)),
        "avg_over_time" => windowed(range, |s, _, _, _| avg(s)),
        "sum_over_time" => windowed(range, |s, _, _, _| (!s.is_empty()).then(|| sum(s))),
        "count_over_time" => windowed(range, |s, _, _, _| {
            (!s.is_empty()).then_some(s.len() as f64)
        }),
        "min_over_time" => windowed(range, |s, _, _, _| {
            fold(s, |a, b| if b < a || a.is_nan() { b } else { a })
        }),
        "max_over_time" => windowed(range, |s, _, _, _| {
            fold(s, |a, b| if b > a || a.is_nan() { b } else { a })
        }),
        "last_over_time" => windowed(range, |s, _, _, _| s.last().map(|x| x.1)),
        _ => return None,
    };
    Some((compute, name == "last_over_time"))
}

/// [`windowed`] for a function of (samples, range start, range end, step index).
fn windowed_k<F>(range: i64, func: F) -> Box<ComputeFn<'static>>
where
    F: Fn(&[(i64, f64)], i64, i64, usize) -> Option<f64> + Sync + 'static,
{
    windowed_impl(range, move |s, start, end, _, k| func(s, start, end, k))
}

/// The window loop of a range function `func` of (samples in one step's range, range start, range end,
/// whether those samples hold a counter reset). One pass over the samples:
/// the window slides forward with the (sorted) reference times.
fn windowed<F>(range: i64, func: F) -> Box<ComputeFn<'static>>
where
    F: Fn(&[(i64, f64)], i64, i64, bool) -> Option<f64> + Sync + 'static,
{
    windowed_impl(range, move |s, start, end, r, _| func(s, start, end, r))
}

/// [`windowed`] whose function also gets the step's index.
fn windowed_impl<F>(range: i64, func: F) -> Box<ComputeFn<'static>>
where
    F: Fn(&[(i64, f64)], i64, i64, bool, usize) -> Option<f64> + Sync + 'static,
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
            let (mut lo, mut hi) = (0usize, 0usize);
            out.clear();
            out.extend(refs.iter().enumerate().map(|(k, &t)| {
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
                func(slice, start, t, has_reset, k)
            }));
            out.iter().any(Option::is_some)
        },
    )
}

/// Streams the result series of a vector function call.
pub(super) fn call(ev: &Eval<'_>, c: &Call, f: &mut dyn FnMut(Series) -> Result<()>) -> Result<()> {
    let name = c.func.name;
    let args = &c.args.args;
    if name == "absent_over_time" {
        return absent(ev, c, f);
    }
    if RANGE_FUNCTIONS.contains(&name) {
        // quantile_over_time(φ, range), predict_linear(range, t): the range and the scalar
        let (ri, pi) = if name == "quantile_over_time" {
            (1, Some(0))
        } else if name == "predict_linear" {
            (0, Some(1))
        } else {
            (0, None)
        };
        let mut arg = args.get(ri).map(|a| a.as_ref());
        while let Some(Expr::Paren(p)) = arg {
            arg = Some(&p.expr);
        }
        let range = match arg {
            Some(Expr::MatrixSelector(ms)) => millis(ms.range),
            Some(Expr::Subquery(sq)) => millis(sq.range),
            _ => return bad(format!("{name}() needs a range vector argument")),
        };
        let param = match pi {
            Some(i) => match args.get(i) {
                Some(p) => ev.eval_scalar(p)?,
                None => return bad(format!("{name}() needs two arguments")),
            },
            None => Vec::new(),
        };
        let times = ev.steps.times.clone();
        let Some((compute, keep_name)) = range_compute_with(name, range, param, times) else {
            return bad(format!("function {name}() is not supported by this TSDB"));
        };
        return match arg {
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
        "histogram_fraction" => return histogram_fraction(ev, c, f),
        "label_replace" => return label_replace(ev, c, f),
        "label_join" => return label_join(ev, c, f),
        "absent" => return absent(ev, c, f),
        "vector" => {
            return match ev.scalar_call(c)? {
                Some(Value::Vector(v)) => v.into_iter().try_for_each(f),
                _ => bad("vector() needs a scalar argument"),
            };
        }
        "timestamp" => return timestamp(ev, c, f),
        "sort" | "sort_desc" => {
            let Some(arg) = args.first() else {
                return bad(format!("{name}() needs an argument"));
            };
            let mut out = ev.eval_vector(arg)?;
            if ev.n() == 1 {
                // ascending or descending by value, NaN last (a range query's result is not sorted)
                let desc = name == "sort_desc";
                let key = |s: &Series| s.values[0].unwrap_or(f64::NAN);
                out.sort_by(|x, y| {
                    let (a, b) = (key(x), key(y));
                    match (a.is_nan(), b.is_nan()) {
                        (true, false) => std::cmp::Ordering::Greater,
                        (false, true) => std::cmp::Ordering::Less,
                        _ if desc => b.total_cmp(&a),
                        _ => a.total_cmp(&b),
                    }
                });
            }
            return out.into_iter().try_for_each(f);
        }
        _ => {}
    }
    if let Some(d) = date_fn(name) {
        // without an argument: of the evaluation time (`vector(time())`)
        let Some(arg) = args.first() else {
            let values = ev.steps.times.iter().map(|t| Some(d(*t as f64 / 1000.0)));
            return f(Series {
                labels: Vec::new(),
                values: values.collect(),
            });
        };
        return ev.each_series(arg, &mut |mut s| {
            drop_name(&mut s.labels);
            for v in s.values.iter_mut().flatten() {
                *v = d(*v);
            }
            f(s)
        });
    }
    let first = args
        .first()
        .ok_or_else(|| Error::BadData(format!("{name}() needs an argument")))?;
    if name == "round" {
        let to_nearest = match args.get(1) {
            Some(b) => ev.eval_scalar(b)?,
            None => vec![1.0; ev.n()],
        };
        return ev.each_series(first, &mut |mut s| {
            drop_name(&mut s.labels);
            for (i, v) in s.values.iter_mut().enumerate() {
                if let Some(v) = v {
                    // exactly as Prometheus: math.Floor(v*toNearestInverse+0.5) / toNearestInverse
                    let inverse = 1.0 / to_nearest[i];
                    *v = (*v * inverse + 0.5).floor() / inverse;
                }
            }
            f(s)
        });
    }
    if name == "clamp" {
        let (Some(lo), Some(hi)) = (args.get(1), args.get(2)) else {
            return bad("clamp() needs three arguments");
        };
        let (lo, hi) = (ev.eval_scalar(lo)?, ev.eval_scalar(hi)?);
        return ev.each_series(first, &mut |mut s| {
            drop_name(&mut s.labels);
            for (i, slot) in s.values.iter_mut().enumerate() {
                if let Some(v) = *slot {
                    // max < min: no output at that step
                    *slot = (hi[i] >= lo[i] || lo[i].is_nan() || hi[i].is_nan())
                        .then(|| go_max(lo[i], go_min(hi[i], v)));
                }
            }
            if s.values.iter().any(Option::is_some) {
                f(s)
            } else {
                Ok(())
            }
        });
    }
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
                        go_max(*v, bound[i])
                    } else {
                        go_min(*v, bound[i])
                    };
                }
            }
            f(s)
        });
    }
    bad(format!("function {name}() is not supported by this TSDB"))
}

/// Go's `math.Max`: NaN if either is NaN.
fn go_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Go's `math.Min`: NaN if either is NaN.
fn go_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// The labels `absent()` gives its series, as Prometheus' `createLabelsForAbsentFunction`: the selector's
/// equality matchers but the metric name (a label matched twice, or not by equality, is left out).
fn absent_labels(arg: &Expr) -> Labels {
    let vs = match arg {
        Expr::VectorSelector(vs) => vs,
        Expr::MatrixSelector(ms) => &ms.vs,
        _ => return Vec::new(),
    };
    let mut out: Labels = Vec::new();
    let mut has: Vec<&str> = Vec::new();
    for m in &vs.matchers.matchers {
        if m.name == METRIC_NAME {
            continue;
        }
        if m.op == promql_parser::label::MatchOp::Equal && !has.contains(&m.name.as_str()) {
            out.retain(|(k, _)| *k != m.name);
            out.push((m.name.clone(), m.value.clone()));
            has.push(&m.name);
        } else {
            out.retain(|(k, _)| *k != m.name);
        }
    }
    out.sort();
    out
}

/// `absent(v)` and `absent_over_time(r)`: 1 at the steps where the argument has no series.
fn absent(ev: &Eval<'_>, c: &Call, f: &mut dyn FnMut(Series) -> Result<()>) -> Result<()> {
    let name = c.func.name;
    let Some(arg) = c.args.args.first() else {
        return bad(format!("{name}() needs an argument"));
    };
    let mut present = vec![false; ev.n()];
    let mut mark = |s: Series| {
        for (p, v) in present.iter_mut().zip(&s.values) {
            *p |= v.is_some();
        }
        Ok(())
    };
    if name == "absent_over_time" {
        let range = match arg.as_ref() {
            Expr::MatrixSelector(ms) => millis(ms.range),
            Expr::Subquery(sq) => millis(sq.range),
            _ => return bad("absent_over_time() needs a range vector argument"),
        };
        let Some((compute, _)) = range_compute("count_over_time", range) else {
            return bad("count_over_time() is missing");
        };
        match arg.as_ref() {
            Expr::MatrixSelector(ms) => ev.map_selected(
                &Streamed {
                    vs: &ms.vs,
                    window: range,
                    keep_name: false,
                    compute,
                },
                &mut mark,
            )?,
            Expr::Subquery(sq) => ev.map_subquery(sq, false, &*compute, &mut mark)?,
            _ => return bad("absent_over_time() needs a range vector argument"),
        }
    } else {
        ev.each_series(arg, &mut mark)?;
    }
    if present.iter().all(|p| *p) {
        return Ok(());
    }
    f(Series {
        labels: absent_labels(arg),
        values: present.iter().map(|p| (!p).then_some(1.0)).collect(),
    })
}

/// `timestamp(v)`: of a selector, the time of the sample each step takes; of anything else, the step's
/// own time.
fn timestamp(ev: &Eval<'_>, c: &Call, f: &mut dyn FnMut(Series) -> Result<()>) -> Result<()> {
    let Some(arg) = c.args.args.first() else {
        return bad("timestamp() needs an argument");
    };
    let mut inner = arg.as_ref();
    while let Expr::Paren(p) = inner {
        inner = &p.expr;
    }
    if let Expr::VectorSelector(vs) = inner {
        let lookback = ev.engine.lookback_ms;
        let compute = move |refs: &[i64], samples: &[(i64, f64)], out: &mut Vec<Option<f64>>| {
            out.clear();
            out.extend(refs.iter().map(|&t| {
                let end = samples.partition_point(|s| s.0 <= t);
                let (st, v) = *samples.get(end.checked_sub(1)?)?;
                (st > t.saturating_sub(lookback) && !is_stale(v)).then_some(st as f64 / 1000.0)
            }));
            out.iter().any(Option::is_some)
        };
        return ev.map_selected(
            &Streamed {
                vs,
                window: lookback,
                keep_name: false,
                compute: Box::new(compute),
            },
            f,
        );
    }
    let times = &ev.steps.times;
    ev.each_series(arg, &mut |mut s| {
        drop_name(&mut s.labels);
        for (v, t) in s.values.iter_mut().zip(times) {
            if v.is_some() {
                *v = Some(*t as f64 / 1000.0);
            }
        }
        f(s)
    })
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
                return super::exec("vector cannot contain metrics with the same labelset");
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
    let groups = bucket_groups(ev, v)?;
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

/// `histogram_fraction(lower, upper, buckets)` over classic histograms: the estimated fraction of
/// observations between `lower` and `upper`, as Prometheus' `BucketFraction`.
fn histogram_fraction(
    ev: &Eval<'_>,
    c: &Call,
    f: &mut dyn FnMut(Series) -> Result<()>,
) -> Result<()> {
    let [lower, upper, v] = &c.args.args[..] else {
        return bad("histogram_fraction() needs 3 arguments");
    };
    let (lower, upper) = (ev.eval_scalar(lower)?, ev.eval_scalar(upper)?);
    let groups = bucket_groups(ev, v)?;
    let mut out: Vec<Series> = Vec::with_capacity(groups.len());
    let mut buckets = Vec::new();
    for (labels, members) in groups {
        let values: Vec<Option<f64>> = (0..ev.n())
            .map(|i| {
                buckets.clear();
                buckets.extend(members.iter().filter_map(|(le, v)| v[i].map(|v| (*le, v))));
                (!buckets.is_empty()).then(|| bucket_fraction(lower[i], upper[i], &mut buckets))
            })
            .collect();
        if values.iter().any(Option::is_some) {
            out.push(Series { labels, values });
        }
    }
    out.sort_by(|a, b| a.labels.cmp(&b.labels));
    out.into_iter().try_for_each(f)
}

/// The bucket series of `v` grouped by histogram (labels without `le` and the metric name).
fn bucket_groups(ev: &Eval<'_>, v: &Expr) -> Result<HashMap<Labels, Vec<Bucket>>> {
    let mut groups: HashMap<Labels, Vec<Bucket>> = HashMap::new();
    // Buckets of different metrics with otherwise the same labels meet once the name is dropped: the same
    // labelset at the same step is Prometheus' error.
    let mut seen: HashMap<Labels, Vec<bool>> = HashMap::new();
    let n = ev.n();
    ev.each_series(v, &mut |mut s| {
        // Series without a parseable `le` are not buckets: ignored, as in Prometheus.
        let Ok(upper) = label(&s.labels, "le").parse::<f64>() else {
            return Ok(());
        };
        s.labels.retain(|(k, _)| k != METRIC_NAME);
        let at = seen
            .entry(s.labels.clone())
            .or_insert_with(|| vec![false; n]);
        for (a, v) in at.iter_mut().zip(&s.values) {
            if v.is_some() && std::mem::replace(a, true) {
                return super::exec("vector cannot contain metrics with the same labelset");
            }
        }
        s.labels.retain(|(k, _)| k != "le");
        groups.entry(s.labels).or_default().push((upper, s.values));
        Ok(())
    })?;
    Ok(groups)
}

/// Sorts buckets by bound, adds up those with the same bound and forces the counts monotonic (ignoring
/// relative differences below 1e-12, float noise), as Prometheus prepares them; false without a `+Inf`
/// bucket.
fn prepare_buckets(buckets: &mut Vec<(f64, f64)>) -> bool {
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    if buckets.last().is_none_or(|b| b.0 != f64::INFINITY) {
        return false;
    }
    buckets.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 += later.1;
        }
        same
    });
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
    true
}

/// Prometheus' `BucketFraction` over (upper bound, cumulative count) buckets: the lowest bucket starts
/// at 0 if its bound is positive (at -Inf otherwise), interpolation is linear inside a bucket.
fn bucket_fraction(lower: f64, upper: f64, buckets: &mut Vec<(f64, f64)>) -> f64 {
    if !prepare_buckets(buckets) {
        return f64::NAN;
    }
    let count = buckets[buckets.len() - 1].1;
    if count == 0.0 || lower.is_nan() || upper.is_nan() {
        return f64::NAN;
    }
    if lower >= upper {
        return 0.0;
    }
    let (mut rank, mut lower_rank, mut upper_rank) = (0.0, 0.0, 0.0);
    let (mut lower_set, mut upper_set) = (false, false);
    for (i, &(upper_bound, b_count)) in buckets.iter().enumerate() {
        let lower_bound = if i > 0 {
            buckets[i - 1].0
        } else if upper_bound > 0.0 {
            0.0
        } else {
            f64::NEG_INFINITY
        };
        // a bucket of infinite width contributes nothing in between: the value is at its finite edge
        let interpolate = |v: f64| {
            if lower_bound == f64::NEG_INFINITY {
                b_count
            } else {
                rank + (b_count - rank) * (v - lower_bound) / (upper_bound - lower_bound)
            }
        };
        if !lower_set && lower_bound >= lower {
            lower_rank = rank;
            lower_set = true;
        }
        if !upper_set && lower_bound >= upper {
            upper_rank = rank;
            upper_set = true;
        }
        if lower_set && upper_set {
            break;
        }
        if !lower_set && lower_bound < lower && upper_bound > lower {
            lower_rank = interpolate(lower);
            lower_set = true;
        }
        if !upper_set && lower_bound < upper && upper_bound > upper {
            upper_rank = interpolate(upper);
            upper_set = true;
        }
        if lower_set && upper_set {
            break;
        }
        rank = b_count;
    }
    if !lower_set || lower_rank > count {
        lower_rank = count;
    }
    if !upper_set || upper_rank > count {
        upper_rank = count;
    }
    (upper_rank - lower_rank) / count
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
    if !prepare_buckets(buckets) {
        return f64::NAN;
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
