//! PromQL evaluation over the [`Store`], on ASTs from the `promql-parser` crate.
//!
//! A query is evaluated for all its steps at once: an instant vector is a set of series, each with one
//! optional value per step, so a range query reads every series once. Selectors feeding an aggregation are
//! streamed series by series, so `sum by (cluster) (rate(x[5m]))` holds only the groups in memory.
//!
//! Supported: vector selectors (`=`, `!=`, `=~`, `!~`, `offset`, `@` with `start()`/`end()`), range vectors
//! and subqueries (`expr[range:step]`, also as a whole instant query) in functions; the range functions
//! `rate`, `irate`, `increase`, `delta`, `idelta`, `deriv`, `predict_linear`, `changes`, `resets`,
//! `absent_over_time`, `present_over_time`, `quantile_over_time` and `{avg,min,max,sum,count,last,stddev,
//! stdvar}_over_time`; `histogram_quantile` and `histogram_fraction` over classic buckets, `label_replace`,
//! `label_join`, `absent`, `timestamp`, `sort`, `sort_desc`, the math (`abs`, `ceil`, `floor`, `round` with
//! `to_nearest`, `sqrt`, `exp`, `ln`, `log2`, `log10`, `sgn`, `clamp`, `clamp_min`, `clamp_max`), trigonometric
//! (`sin` … `atanh`, `deg`, `rad`, `pi`) and calendar (`year` … `minute`, `days_in_month`) functions, `time`,
//! `vector`, `scalar`, `min_of`, `max_of`; aggregations `sum`, `avg` (compensated sums as Prometheus), `min`,
//! `max`, `count`, `group`, `stddev`, `stdvar`, `quantile`, `count_values`, `topk`, `bottomk` with
//! `by`/`without`; binary `+ - * / % ^`, comparisons (with `bool`) and `and`/`or`/`unless` between scalars
//! and vectors, vector matching one-to-one, many-to-one and one-to-many (`on`/`ignoring`,
//! `group_left`/`group_right`). Native histograms, experimental functions and delayed name removal are not
//! supported. Anything
//! else is a clear `bad_data` error.

mod functions;
pub mod source;

pub use source::{Gathered, Plan, Source, plan, plan_expr};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::token::*;
use promql_parser::parser::{
    AggregateExpr, AtModifier, BinaryExpr, Call, Expr, LabelModifier, Offset, SubqueryExpr,
    VectorMatchCardinality, VectorSelector,
};

use crate::chunk::is_stale;
use crate::store::{self, Labels, METRIC_NAME, Store};

/// Query failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The query does not parse, or uses something the engine does not evaluate (the client's fault).
    #[error("{0}")]
    BadData(String),
    /// The query is valid but its evaluation hit a condition Prometheus refuses at run time (two series
    /// with one labelset, many-to-many matching, …): `errorType: execution`, HTTP 422, as Prometheus.
    #[error("{0}")]
    Execution(String),
    /// Reading the store failed.
    #[error("storage: {0}")]
    Storage(#[from] store::Error),
    /// The engine failed (a bug).
    #[error("internal: {0}")]
    Internal(String),
}

/// Query result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn bad<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::BadData(msg.into()))
}

fn exec<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Execution(msg.into()))
}

/// One output series: labels and an optional value per step.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Labels (sorted by name).
    pub labels: Labels,
    /// One value per step (`None`: no value at that step).
    pub values: Vec<Option<f64>>,
}

/// What an expression evaluates to.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A scalar per step.
    Scalar(Vec<f64>),
    /// An instant vector per step.
    Vector(Vec<Series>),
    /// Raw samples (only as the result of an instant query of a range selector).
    Matrix(Vec<(Labels, Vec<(i64, f64)>)>),
    /// A string.
    String(String),
}

/// Evaluates queries against a store.
#[derive(Debug, Clone)]
pub struct Engine {
    store: Arc<Store>,
    source: Source,
    lookback_ms: i64,
}

thread_local! {
    /// A query worker's sample buffer, reused from series to series.
    static SAMPLES: std::cell::RefCell<Vec<(i64, f64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Step of a subquery without one (Prometheus' default evaluation interval).
const DEFAULT_SUBQUERY_STEP_MS: i64 = 60_000;
/// Most inner steps one subquery may evaluate (ten times a range query's 11,000 points per series: a bound
/// on the memory one query can take).
const MAX_SUBQUERY_STEPS: i64 = 110_000;

/// Evaluation steps: `start`, `start + step`, … ≤ `end`, in milliseconds.
#[derive(Debug, Clone)]
struct Steps {
    times: Vec<i64>,
    start: i64,
    end: i64,
}

fn millis(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

fn system_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => millis(d),
        Err(e) => -millis(e.duration()),
    }
}

fn offset_ms(o: &Option<Offset>) -> i64 {
    match o {
        Some(Offset::Pos(d)) => millis(*d),
        Some(Offset::Neg(d)) => -millis(*d),
        None => 0,
    }
}

/// The matcher sets a selector stands for (one per `or` alternative), the metric name included.
pub fn selector_matchers(vs: &VectorSelector) -> Vec<Vec<Matcher>> {
    let name = vs
        .name
        .as_ref()
        .map(|n| Matcher::new(MatchOp::Equal, METRIC_NAME, n));
    let mut sets = if vs.matchers.or_matchers.is_empty() {
        vec![vs.matchers.matchers.clone()]
    } else {
        vs.matchers.or_matchers.clone()
    };
    for set in &mut sets {
        set.extend(name.clone());
    }
    sets
}

/// Whether every series the selector can select has one and the same metric name: then dropping the name
/// can't make two of them alike (labels are unique within a name), and a streamed aggregation needs no
/// check for the "same labelset" error Prometheus raises when it can.
fn one_name(vs: &VectorSelector) -> bool {
    selector_matchers(vs).iter().all(|set| {
        set.iter()
            .any(|m| m.name == METRIC_NAME && matches!(m.op, MatchOp::Equal))
    })
}

/// Parses a query. The parser is third-party code fed with user input: a panic inside it becomes a
/// `bad_data` error instead of taking the request (or the process) down.
pub fn parse(query: &str) -> Result<Expr> {
    match std::panic::catch_unwind(|| promql_parser::parser::parse(query)) {
        Ok(Ok(expr)) => Ok(expr),
        Ok(Err(e)) => Err(Error::BadData(e)),
        Err(_) => Err(Error::BadData(format!("invalid query: {query:?}"))),
    }
}

/// The matcher `{<label>=~"<regex>"}`, made as the parser makes one from a query.
pub fn regex_matcher(label: &str, regex: &str) -> Result<Matcher> {
    let quoted = serde_json::to_string(regex).map_err(|e| Error::Internal(e.to_string()))?;
    match parse(&format!("{{{label}=~{quoted}}}"))? {
        Expr::VectorSelector(mut vs) if vs.matchers.matchers.len() == 1 => {
            Ok(vs.matchers.matchers.remove(0))
        }
        _ => Err(Error::Internal(format!(
            "{label}=~{quoted} is not one matcher"
        ))),
    }
}

/// Adds `m` to every selector in `expr`, in each of its `or` alternatives: how a query of a token that sees
/// only some clusters is narrowed to them, whatever it asks for (as prom-label-proxy enforces a label).
/// Selectors keep their own matchers, so one that names another cluster selects nothing.
pub fn enforce(expr: &mut Expr, m: &Matcher) {
    match expr {
        Expr::VectorSelector(vs) => enforce_selector(vs, m),
        Expr::MatrixSelector(ms) => enforce_selector(&mut ms.vs, m),
        Expr::Aggregate(a) => {
            enforce(&mut a.expr, m);
            if let Some(p) = &mut a.param {
                enforce(p, m);
            }
        }
        Expr::Unary(u) => enforce(&mut u.expr, m),
        Expr::Binary(b) => {
            enforce(&mut b.lhs, m);
            enforce(&mut b.rhs, m);
        }
        Expr::Paren(p) => enforce(&mut p.expr, m),
        Expr::Subquery(sq) => enforce(&mut sq.expr, m),
        Expr::Call(c) => {
            for a in &mut c.args.args {
                enforce(a, m);
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

fn enforce_selector(vs: &mut VectorSelector, m: &Matcher) {
    if vs.matchers.or_matchers.is_empty() {
        vs.matchers.matchers.push(m.clone());
    } else {
        for set in &mut vs.matchers.or_matchers {
            set.push(m.clone());
        }
    }
}

fn drop_name(labels: &mut Labels) {
    labels.retain(|(k, _)| k != METRIC_NAME);
}

impl Engine {
    /// An engine with the given lookback delta for instant selectors.
    pub fn new(store: Arc<Store>, lookback: Duration) -> Self {
        Engine {
            source: Source::Local(store.clone()),
            store,
            lookback_ms: millis(lookback).max(1),
        }
    }

    /// The same engine reading `source` instead of the local store (a query over gathered series).
    pub fn with_source(&self, source: Source) -> Self {
        Engine {
            store: self.store.clone(),
            source,
            lookback_ms: self.lookback_ms,
        }
    }

    /// The lookback delta.
    pub fn lookback(&self) -> Duration {
        Duration::from_millis(self.lookback_ms as u64)
    }

    /// Evaluates `query` at one time (ms).
    pub fn instant(&self, query: &str, time_ms: i64) -> Result<Value> {
        self.instant_expr(&parse(query)?, time_ms)
    }

    /// Evaluates a parsed query at one time (ms).
    pub fn instant_expr(&self, expr: &Expr, time_ms: i64) -> Result<Value> {
        let steps = Steps {
            times: vec![time_ms],
            start: time_ms,
            end: time_ms,
        };
        let ev = Eval {
            engine: self,
            steps: &steps,
        };
        if let Expr::MatrixSelector(ms) = expr {
            return ev.raw_matrix(&ms.vs, millis(ms.range));
        }
        if let Expr::Subquery(sq) = expr {
            let (refs, inner) = ev.subquery_steps(sq)?;
            let t = refs.first().copied().unwrap_or(time_ms);
            let range = millis(sq.range);
            let inner_ev = Eval {
                engine: self,
                steps: &inner,
            };
            let out = inner_ev
                .eval_vector(&sq.expr)?
                .into_iter()
                .filter_map(|s| {
                    let pts: Vec<(i64, f64)> = inner
                        .times
                        .iter()
                        .zip(&s.values)
                        .filter_map(|(st, v)| {
                            v.filter(|_| *st > t.saturating_sub(range) && *st <= t)
                                .map(|v| (*st, v))
                        })
                        .collect();
                    (!pts.is_empty()).then_some((s.labels, pts))
                })
                .collect();
            return Ok(Value::Matrix(out));
        }
        ev.eval(expr)
    }

    /// Evaluates `query` from `start` to `end` every `step` (all ms).
    pub fn range(&self, query: &str, start: i64, end: i64, step: i64) -> Result<Value> {
        self.range_expr(&parse(query)?, start, end, step)
    }

    /// Evaluates a parsed query from `start` to `end` every `step` (all ms).
    pub fn range_expr(&self, expr: &Expr, start: i64, end: i64, step: i64) -> Result<Value> {
        if step <= 0 || end < start {
            return bad("invalid range: end before start or step not positive");
        }
        if (end - start) / step > 11_000 {
            return bad(
                "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)",
            );
        }
        let times = (0..=(end - start) / step)
            .map(|i| start + i * step)
            .collect();
        let steps = Steps { times, start, end };
        let ev = Eval {
            engine: self,
            steps: &steps,
        };
        match ev.eval(expr)? {
            Value::Matrix(_) | Value::String(_) => {
                bad("range queries need an expression of type scalar or instant vector")
            }
            v => Ok(v),
        }
    }

    /// The store this engine reads.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }
}

/// Computes one value per reference time from a selected series' samples into `out` (cleared first);
/// returns whether any step has a value (runs on worker threads).
type ComputeFn<'f> = dyn Fn(&[i64], &[(i64, f64)], &mut Vec<Option<f64>>) -> bool + Sync + 'f;

/// Folds one computed series (its stored labels and its values) into a worker's state.
type FoldFn<'f, S> = dyn Fn(&mut S, &Labels, &[Option<f64>]) + Sync + 'f;

/// An expression whose output series are each computed from one stored series alone (a selector, or a
/// range function of a range selector).
struct Streamed<'e> {
    vs: &'e VectorSelector,
    /// How far before each reference time samples are read.
    window: i64,
    /// Whether the output keeps the metric name.
    keep_name: bool,
    compute: Box<ComputeFn<'e>>,
}

struct Eval<'a> {
    engine: &'a Engine,
    steps: &'a Steps,
}

impl Eval<'_> {
    fn n(&self) -> usize {
        self.steps.times.len()
    }

    fn eval(&self, expr: &Expr) -> Result<Value> {
        match expr {
            Expr::NumberLiteral(n) => Ok(Value::Scalar(vec![n.val; self.n()])),
            Expr::StringLiteral(s) => Ok(Value::String(s.val.clone())),
            Expr::Paren(p) => self.eval(&p.expr),
            Expr::Unary(u) => match self.eval(&u.expr)? {
                Value::Scalar(v) => Ok(Value::Scalar(v.into_iter().map(|x| -x).collect())),
                Value::Vector(mut vs) => {
                    for s in &mut vs {
                        drop_name(&mut s.labels);
                        for v in s.values.iter_mut().flatten() {
                            *v = -*v;
                        }
                    }
                    Ok(Value::Vector(merge_same_labels(vs)?))
                }
                _ => bad("unary minus needs a scalar or an instant vector"),
            },
            Expr::VectorSelector(_) | Expr::Call(_) => {
                if let Expr::Call(c) = expr
                    && let Some(v) = self.scalar_call(c)?
                {
                    return Ok(v);
                }
                let mut out = Vec::new();
                self.each_series(expr, &mut |s| {
                    out.push(s);
                    Ok(())
                })?;
                if matches!(expr, Expr::Call(_)) {
                    out = merge_same_labels(out)?;
                }
                Ok(Value::Vector(out))
            }
            Expr::MatrixSelector(_) => bad(
                "a range vector is only allowed as a function argument or as a whole instant query",
            ),
            Expr::Aggregate(a) => self.aggregate(a),
            Expr::Binary(b) => self.binary(b),
            Expr::Subquery(_) => bad(
                "a subquery is only allowed as a range-function argument or as a whole instant query",
            ),
            Expr::Extension(_) => bad("extension expressions are not supported"),
        }
    }

    fn eval_vector(&self, expr: &Expr) -> Result<Vec<Series>> {
        match self.eval(expr)? {
            Value::Vector(v) => Ok(v),
            _ => bad(format!("expected an instant vector: {expr}")),
        }
    }

    fn eval_scalar(&self, expr: &Expr) -> Result<Vec<f64>> {
        match self.eval(expr)? {
            Value::Scalar(v) => Ok(v),
            _ => bad(format!("expected a scalar: {expr}")),
        }
    }

    /// Per-step reference times of a selector (after `@` and `offset`).
    fn ref_times(&self, vs: &VectorSelector) -> Vec<i64> {
        let off = offset_ms(&vs.offset);
        let at = vs.at.as_ref().map(|a| match a {
            AtModifier::Start => self.steps.start,
            AtModifier::End => self.steps.end,
            AtModifier::At(t) => system_ms(*t),
        });
        self.steps
            .times
            .iter()
            .map(|t| at.unwrap_or(*t).saturating_sub(off))
            .collect()
    }

    /// Computes one output series per selected series from its samples covering `window` ms before each
    /// reference time, on all cores (series in blocks, so memory stays bounded), and hands them to `f` in
    /// label order.
    fn map_selected(
        &self,
        st: &Streamed<'_>,
        f: &mut dyn FnMut(Series) -> Result<()>,
    ) -> Result<()> {
        let refs = self.ref_times(st.vs);
        let (Some(&min), Some(&max)) = (refs.iter().min(), refs.iter().max()) else {
            return Ok(());
        };
        let mint = min.saturating_sub(st.window).saturating_add(1);
        let store = &self.engine.source;
        let selected = store.select(&selector_matchers(st.vs));
        let refs = &refs[..];
        let one = |(id, labels): &(store::SeriesId, Arc<Labels>)| -> Result<Option<Series>> {
            SAMPLES.with_borrow_mut(|samples| {
                store.samples_into(*id, mint, max, samples)?;
                let mut values = Vec::new();
                if samples.is_empty() || !(st.compute)(refs, samples, &mut values) {
                    return Ok(None);
                }
                let mut labels = (**labels).clone();
                if !st.keep_name {
                    drop_name(&mut labels);
                }
                Ok(Some(Series { labels, values }))
            })
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
        for block in selected.chunks(256 * threads) {
            let results: Vec<Result<Option<Series>>> = if threads == 1 || block.len() < 32 {
                block.iter().map(one).collect()
            } else {
                let one = &one;
                std::thread::scope(|scope| {
                    let workers: Vec<_> = block
                        .chunks(block.len().div_ceil(threads))
                        .map(|part| scope.spawn(move || part.iter().map(one).collect::<Vec<_>>()))
                        .collect();
                    workers
                        .into_iter()
                        .flat_map(|w| {
                            w.join().unwrap_or_else(|_| {
                                vec![Err(Error::Internal("a query worker panicked".into()))]
                            })
                        })
                        .collect()
                })
            };
            for r in results {
                if let Some(series) = r? {
                    f(series)?;
                }
            }
        }
        Ok(())
    }

    /// The outer steps' reference times of a subquery (after `@` and `offset`) and the inner steps: the
    /// multiples of the subquery step from the first after the earliest range start to the latest
    /// reference time (as Prometheus aligns them).
    fn subquery_steps(&self, sq: &SubqueryExpr) -> Result<(Vec<i64>, Steps)> {
        let off = offset_ms(&sq.offset);
        let at = sq.at.as_ref().map(|a| match a {
            AtModifier::Start => self.steps.start,
            AtModifier::End => self.steps.end,
            AtModifier::At(t) => system_ms(*t),
        });
        let refs: Vec<i64> = self
            .steps
            .times
            .iter()
            .map(|t| at.unwrap_or(*t).saturating_sub(off))
            .collect();
        let step = sq
            .step
            .map(millis)
            .filter(|s| *s > 0)
            .unwrap_or(DEFAULT_SUBQUERY_STEP_MS);
        let (Some(&min), Some(&max)) = (refs.iter().min(), refs.iter().max()) else {
            return bad("empty evaluation range");
        };
        let from = min.saturating_sub(millis(sq.range));
        let mut first = from.div_euclid(step).saturating_mul(step);
        if first < from {
            first = first.saturating_add(step);
        }
        let count = if max < first {
            0
        } else {
            (max.saturating_sub(first) / step).saturating_add(1)
        };
        if count > MAX_SUBQUERY_STEPS {
            return bad(format!(
                "subquery {sq} needs {count} inner steps, more than {MAX_SUBQUERY_STEPS}: use a larger step"
            ));
        }
        let times = (0..count).map(|i| first + i * step).collect();
        Ok((
            refs,
            Steps {
                times,
                start: self.steps.start,
                end: self.steps.end,
            },
        ))
    }

    /// Evaluates a subquery's expression at its own steps and hands each resulting series, as samples, to
    /// `compute` with the outer steps' reference times (a range function over a subquery).
    fn map_subquery(
        &self,
        sq: &SubqueryExpr,
        keep_name: bool,
        compute: &ComputeFn<'_>,
        f: &mut dyn FnMut(Series) -> Result<()>,
    ) -> Result<()> {
        let (refs, inner) = self.subquery_steps(sq)?;
        let ev = Eval {
            engine: self.engine,
            steps: &inner,
        };
        let mut samples = Vec::new();
        for s in ev.eval_vector(&sq.expr)? {
            samples.clear();
            samples.extend(
                inner
                    .times
                    .iter()
                    .zip(&s.values)
                    .filter_map(|(t, v)| v.map(|v| (*t, v))),
            );
            if samples.is_empty() {
                continue;
            }
            let mut values = Vec::new();
            if compute(&refs, &samples, &mut values) {
                let mut labels = s.labels;
                if !keep_name {
                    drop_name(&mut labels);
                }
                f(Series { labels, values })?;
            }
        }
        Ok(())
    }

    /// Like [`Eval::map_selected`], but each worker folds its series into its own state (from `init`)
    /// instead of handing them over: nothing per series crosses threads or is kept. The workers take
    /// contiguous parts of the selection, so the states (returned in part order) and any floating-point
    /// sums over them are the same from run to run.
    fn fold_selected<S: Send>(
        &self,
        st: &Streamed<'_>,
        init: &(dyn Fn() -> S + Sync),
        fold: &FoldFn<'_, S>,
    ) -> Result<Vec<S>> {
        let refs = self.ref_times(st.vs);
        let (Some(&min), Some(&max)) = (refs.iter().min(), refs.iter().max()) else {
            return Ok(Vec::new());
        };
        let mint = min.saturating_sub(st.window).saturating_add(1);
        let store = &self.engine.source;
        // Series id order: as fixed as label order, without sorting by labels. Labels are read one series
        // at a time, and only for a series with values: `count({__name__=~".+"})` over 100k series held
        // 84 MB of copied labels at once when the selection carried them.
        let selected = store.select_ids(&selector_matchers(st.vs));
        let refs = &refs[..];
        let work = |part: &[store::SeriesId]| -> Result<S> {
            let mut state = init();
            let (mut samples, mut values) = (Vec::new(), Vec::new());
            for &id in part {
                store.samples_into(id, mint, max, &mut samples)?;
                if !samples.is_empty()
                    && (st.compute)(refs, &samples, &mut values)
                    && let Some(labels) = store.labels(id)
                {
                    fold(&mut state, &labels, &values);
                }
            }
            Ok(state)
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
        if threads == 1 || selected.len() < 64 {
            return Ok(vec![work(&selected)?]);
        }
        let work = &work;
        std::thread::scope(|scope| {
            let workers: Vec<_> = selected
                .chunks(selected.len().div_ceil(threads))
                .map(|part| scope.spawn(move || work(part)))
                .collect();
            workers
                .into_iter()
                .map(|w| {
                    w.join()
                        .unwrap_or_else(|_| Err(Error::Internal("a query worker panicked".into())))
                })
                .collect()
        })
    }

    /// How to compute the series of `expr` one stored series at a time, when it can be.
    fn streamed<'e>(&self, expr: &'e Expr) -> Option<Streamed<'e>> {
        match expr {
            Expr::Paren(p) => self.streamed(&p.expr),
            Expr::VectorSelector(vs) => {
                let lookback = self.engine.lookback_ms;
                let compute =
                    move |refs: &[i64], samples: &[(i64, f64)], out: &mut Vec<Option<f64>>| {
                        out.clear();
                        out.extend(refs.iter().map(|&t| {
                            let end = samples.partition_point(|s| s.0 <= t);
                            let (st, v) = *samples.get(end.checked_sub(1)?)?;
                            (st > t.saturating_sub(lookback) && !is_stale(v)).then_some(v)
                        }));
                        out.iter().any(Option::is_some)
                    };
                Some(Streamed {
                    vs,
                    window: lookback,
                    keep_name: true,
                    compute: Box::new(compute),
                })
            }
            Expr::Call(c) => {
                let [arg] = &c.args.args[..] else {
                    return None;
                };
                let Expr::MatrixSelector(ms) = arg.as_ref() else {
                    return None;
                };
                let range = millis(ms.range);
                let (compute, keep_name) = functions::range_compute(c.func.name, range)?;
                Some(Streamed {
                    vs: &ms.vs,
                    window: range,
                    keep_name,
                    compute,
                })
            }
            _ => None,
        }
    }

    /// Streams the series of an instant-vector expression (selectors and functions of selectors without
    /// materialising the rest).
    fn each_series(&self, expr: &Expr, f: &mut dyn FnMut(Series) -> Result<()>) -> Result<()> {
        if let Some(st) = self.streamed(expr) {
            if st.keep_name || one_name(st.vs) {
                return self.map_selected(&st, f);
            }
            // the name dropped over several names: two series may now be alike (Prometheus' error)
            let mut all = Vec::new();
            self.map_selected(&st, &mut |s| {
                all.push(s);
                Ok(())
            })?;
            for s in merge_same_labels(all)? {
                f(s)?;
            }
            return Ok(());
        }
        match expr {
            Expr::Paren(p) => self.each_series(&p.expr, f),
            Expr::Call(c) => {
                // as when the call is evaluated on its own: a function that drops the name may give two
                // series one labelset (`max(timestamp({job!=""}))`), Prometheus' error
                let mut all = Vec::new();
                functions::call(self, c, &mut |s| {
                    all.push(s);
                    Ok(())
                })?;
                for s in merge_same_labels(all)? {
                    f(s)?;
                }
                Ok(())
            }
            _ => {
                for s in self.eval_vector(expr)? {
                    f(s)?;
                }
                Ok(())
            }
        }
    }

    /// `time()`, `vector()` and `scalar()`; `None` for the vector functions.
    fn scalar_call(&self, c: &Call) -> Result<Option<Value>> {
        Ok(Some(match c.func.name {
            "time" => Value::Scalar(
                self.steps
                    .times
                    .iter()
                    .map(|t| *t as f64 / 1000.0)
                    .collect(),
            ),
            "pi" => Value::Scalar(vec![std::f64::consts::PI; self.n()]),
            "min_of" | "max_of" => {
                let [a, b] = &c.args.args[..] else {
                    return bad(format!("{}() needs two arguments", c.func.name));
                };
                let (a, b) = (self.eval_scalar(a)?, self.eval_scalar(b)?);
                let min = c.func.name == "min_of";
                // Go's math.Min/Max: NaN wins
                let pick = |x: f64, y: f64| {
                    if x.is_nan() || y.is_nan() {
                        f64::NAN
                    } else if min {
                        x.min(y)
                    } else {
                        x.max(y)
                    }
                };
                Value::Scalar(a.iter().zip(&b).map(|(x, y)| pick(*x, *y)).collect())
            }
            "vector" => {
                let arg = c
                    .args
                    .args
                    .first()
                    .ok_or(Error::BadData("vector() needs an argument".into()))?;
                let v = self.eval_scalar(arg)?;
                Value::Vector(vec![Series {
                    labels: Vec::new(),
                    values: v.into_iter().map(Some).collect(),
                }])
            }
            "scalar" => {
                let arg = c
                    .args
                    .args
                    .first()
                    .ok_or(Error::BadData("scalar() needs an argument".into()))?;
                let vs = self.eval_vector(arg)?;
                let out = (0..self.n())
                    .map(|i| {
                        let mut present = vs.iter().filter_map(|s| s.values[i]);
                        match (present.next(), present.next()) {
                            (Some(v), None) => v,
                            _ => f64::NAN,
                        }
                    })
                    .collect();
                Value::Scalar(out)
            }
            _ => return Ok(None),
        }))
    }

    /// The raw samples of a range selector at the query time (an instant query of `x[5m]`).
    fn raw_matrix(&self, vs: &VectorSelector, range: i64) -> Result<Value> {
        let t = self.ref_times(vs).first().copied().unwrap_or(0);
        let store = &self.engine.source;
        let mut out = Vec::new();
        for (id, labels) in store.select(&selector_matchers(vs)) {
            let mut pts = store.samples(id, t.saturating_sub(range).saturating_add(1), t)?;
            pts.retain(|s| !is_stale(s.1));
            if !pts.is_empty() {
                out.push(((*labels).clone(), pts));
            }
        }
        Ok(Value::Matrix(out))
    }

    fn aggregate(&self, a: &AggregateExpr) -> Result<Value> {
        let op = a.op.id();
        let n = self.n();
        let group_labels = |labels: &Labels| -> Labels {
            match &a.modifier {
                None => Vec::new(),
                Some(LabelModifier::Include(l)) => labels
                    .iter()
                    .filter(|(k, _)| l.labels.iter().any(|x| x == k))
                    .cloned()
                    .collect(),
                Some(LabelModifier::Exclude(l)) => labels
                    .iter()
                    .filter(|(k, _)| k != METRIC_NAME && !l.labels.iter().any(|x| x == k))
                    .cloned()
                    .collect(),
            }
        };
        if op == T_TOPK || op == T_BOTTOMK || op == T_QUANTILE {
            let Some(param) = &a.param else {
                return bad("topk, bottomk and quantile need a parameter");
            };
            let param = self.eval_scalar(param)?;
            if op != T_QUANTILE && param.iter().any(|k| k.is_nan()) {
                return bad("Parameter value is NaN");
            }
            let mut groups: HashMap<Labels, Vec<Series>> = HashMap::new();
            self.each_series(&a.expr, &mut |s| {
                groups.entry(group_labels(&s.labels)).or_default().push(s);
                Ok(())
            })?;
            let mut out = Vec::new();
            if op == T_QUANTILE {
                let mut present = Vec::new();
                for (labels, members) in groups {
                    let values = (0..n)
                        .map(|i| {
                            present.clear();
                            present.extend(members.iter().filter_map(|s| s.values[i]));
                            (!present.is_empty()).then(|| quantile(param[i], &mut present))
                        })
                        .collect();
                    out.push(Series { labels, values });
                }
            } else {
                let mut groups: Vec<(Labels, Vec<Series>)> = groups.into_iter().collect();
                groups.sort_by(|x, y| x.0.cmp(&y.0));
                for (_, mut members) in groups {
                    for (i, &k) in param.iter().enumerate() {
                        let k = if k.is_nan() || k < 1.0 {
                            0
                        } else {
                            k.min(members.len() as f64) as usize
                        };
                        let mut present: Vec<(usize, f64)> = members
                            .iter()
                            .enumerate()
                            .filter_map(|(j, s)| s.values[i].map(|v| (j, v)))
                            .collect();
                        // NaN sorts last for both directions, as in Prometheus.
                        present.sort_by(|x, y| {
                            let ord = if op == T_TOPK {
                                y.1.partial_cmp(&x.1)
                            } else {
                                x.1.partial_cmp(&y.1)
                            };
                            ord.unwrap_or_else(|| x.1.is_nan().cmp(&y.1.is_nan()))
                        });
                        for (j, _) in present.iter().skip(k) {
                            members[*j].values[i] = None;
                        }
                    }
                    members.retain(|s| s.values.iter().any(Option::is_some));
                    if n == 1 {
                        // An instant query lists each group's series best first, as Prometheus does.
                        let key = |s: &Series| s.values[0].unwrap_or(f64::NAN);
                        members.sort_by(|x, y| {
                            let (a, b) = (key(x), key(y));
                            match (a.is_nan(), b.is_nan()) {
                                (true, false) => std::cmp::Ordering::Greater,
                                (false, true) => std::cmp::Ordering::Less,
                                _ if op == T_TOPK => b.total_cmp(&a),
                                _ => a.total_cmp(&b),
                            }
                        });
                    } else {
                        members.sort_by(|x, y| x.labels.cmp(&y.labels));
                    }
                    out.extend(members);
                }
                return Ok(Value::Vector(out));
            }
            out.retain(|s| s.values.iter().any(Option::is_some));
            out.sort_by(|x, y| x.labels.cmp(&y.labels));
            return Ok(Value::Vector(out));
        }
        if op == T_COUNT_VALUES {
            let name = match a.param.as_deref().map(|p| self.eval(p)).transpose()? {
                Some(Value::String(s)) => s,
                _ => return bad("count_values needs a string parameter (the label name)"),
            };
            if !valid_label_name(&name) {
                return bad(format!("invalid label name {name:?} in count_values"));
            }
            let mut out: Vec<Series> = Vec::new();
            let mut index: HashMap<Labels, usize> = HashMap::new();
            self.each_series(&a.expr, &mut |s| {
                let group = group_labels(&s.labels);
                for (i, v) in s.values.iter().enumerate() {
                    let Some(v) = *v else { continue };
                    let mut labels: Labels =
                        group.iter().filter(|(k, _)| *k != name).cloned().collect();
                    labels.push((name.clone(), format_value(v)));
                    labels.sort();
                    let k = *index.entry(labels.clone()).or_insert_with(|| {
                        out.push(Series {
                            labels,
                            values: vec![None; n],
                        });
                        out.len() - 1
                    });
                    let slot = &mut out[k].values[i];
                    *slot = Some(slot.unwrap_or(0.0) + 1.0);
                }
                Ok(())
            })?;
            out.sort_by(|x, y| x.labels.cmp(&y.labels));
            return Ok(Value::Vector(out));
        }
        if ![
            T_SUM, T_AVG, T_MIN, T_MAX, T_COUNT, T_GROUP, T_STDDEV, T_STDVAR,
        ]
        .contains(&op)
        {
            return bad(format!(
                "aggregation {} is not supported by this TSDB",
                a.to_string().split('(').next().unwrap_or("")
            ));
        }
        let spread = op == T_STDDEV || op == T_STDVAR;
        let mut groups: HashMap<Labels, Acc> = HashMap::new();
        // a function that drops the name over several metric names may give two series one labelset:
        // that is Prometheus' "same labelset" error, which only the series-by-series path can see
        if !spread
            && let Some(st) = self.streamed(&a.expr)
            && (st.keep_name || one_name(st.vs))
        {
            // `sum by (cluster) (rate(x[5m]))` and the like: the workers aggregate what they compute.
            let states = self.fold_selected(
                &st,
                &HashMap::<Labels, Acc>::new,
                &|groups, labels, values| {
                    let mut group = group_labels(labels);
                    if !st.keep_name {
                        drop_name(&mut group);
                    }
                    groups
                        .entry(group)
                        .or_insert_with(|| Acc::new(n, false))
                        .add(op, values)
                },
            )?;
            for state in states {
                for (labels, acc) in state {
                    match groups.entry(labels) {
                        std::collections::hash_map::Entry::Vacant(e) => {
                            e.insert(acc);
                        }
                        std::collections::hash_map::Entry::Occupied(mut e) => {
                            e.get_mut().merge(op, acc)
                        }
                    }
                }
            }
        } else {
            self.each_series(&a.expr, &mut |s| {
                groups
                    .entry(group_labels(&s.labels))
                    .or_insert_with(|| Acc::new(n, spread))
                    .add(op, &s.values);
                Ok(())
            })?;
        }
        let mut out: Vec<Series> = groups
            .into_iter()
            .map(|(labels, acc)| Series {
                labels,
                values: acc.finish(op),
            })
            .filter(|s| s.values.iter().any(Option::is_some))
            .collect();
        out.sort_by(|x, y| x.labels.cmp(&y.labels));
        Ok(Value::Vector(out))
    }

    fn binary(&self, b: &BinaryExpr) -> Result<Value> {
        let op = b.op.id();
        let return_bool = b.modifier.as_ref().is_some_and(|m| m.return_bool);
        let lhs = self.eval(&b.lhs)?;
        let rhs = self.eval(&b.rhs)?;
        let is_cmp = [T_EQLC, T_NEQ, T_GTR, T_LSS, T_GTE, T_LTE].contains(&op);
        let is_set = [T_LAND, T_LOR, T_LUNLESS].contains(&op);
        match (lhs, rhs) {
            (Value::Scalar(l), Value::Scalar(r)) => {
                let v = l
                    .iter()
                    .zip(&r)
                    .map(|(a, b)| {
                        let v = arith(op, *a, *b)?;
                        Ok(if is_cmp {
                            v.map_or(0.0, |_| 1.0)
                        } else {
                            v.unwrap_or(f64::NAN)
                        })
                    })
                    .collect::<Result<Vec<f64>>>()?;
                Ok(Value::Scalar(v))
            }
            (Value::Vector(vs), Value::Scalar(s)) if !is_set => {
                vector_scalar(op, is_cmp, return_bool, vs, &s, false)
            }
            (Value::Scalar(s), Value::Vector(vs)) if !is_set => {
                vector_scalar(op, is_cmp, return_bool, vs, &s, true)
            }
            (Value::Vector(l), Value::Vector(r)) => {
                match self.vector_binary(b, op, is_cmp, is_set, return_bool, l, r)? {
                    Value::Vector(v) => Ok(Value::Vector(merge_same_labels(v)?)),
                    v => Ok(v),
                }
            }
            _ => bad(format!("binary operation on incompatible types: {b}")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn vector_binary(
        &self,
        b: &BinaryExpr,
        op: TokenId,
        is_cmp: bool,
        is_set: bool,
        return_bool: bool,
        lhs: Vec<Series>,
        rhs: Vec<Series>,
    ) -> Result<Value> {
        let modifier = b.modifier.as_ref();
        let matching = modifier.and_then(|m| m.matching.as_ref());
        let (include, one_to_many, explicit): (&[String], bool, bool) =
            match modifier.map(|m| &m.card) {
                Some(VectorMatchCardinality::ManyToOne(l)) => (&l.labels, false, true),
                Some(VectorMatchCardinality::OneToMany(l)) => (&l.labels, true, true),
                _ => (&[], false, false),
            };
        let signature = |labels: &Labels| -> Labels {
            match matching {
                Some(LabelModifier::Include(on)) => labels
                    .iter()
                    .filter(|(k, _)| on.labels.iter().any(|x| x == k))
                    .cloned()
                    .collect(),
                Some(LabelModifier::Exclude(ign)) => labels
                    .iter()
                    .filter(|(k, _)| k != METRIC_NAME && !ign.labels.iter().any(|x| x == k))
                    .cloned()
                    .collect(),
                None => labels
                    .iter()
                    .filter(|(k, _)| k != METRIC_NAME)
                    .cloned()
                    .collect(),
            }
        };
        let n = self.n();
        if is_set {
            let mut by_sig: HashMap<Labels, Vec<usize>> = HashMap::new();
            for (i, s) in rhs.iter().enumerate() {
                by_sig.entry(signature(&s.labels)).or_default().push(i);
            }
            let mut out = Vec::new();
            let mut lhs_sigs: HashMap<Labels, Vec<bool>> = HashMap::new();
            for mut s in lhs {
                let sig = signature(&s.labels);
                let present = lhs_sigs
                    .entry(sig.clone())
                    .or_insert_with(|| vec![false; n]);
                for (i, seen) in present.iter_mut().enumerate() {
                    if s.values[i].is_some() {
                        *seen = true;
                    }
                    let in_rhs = by_sig
                        .get(&sig)
                        .is_some_and(|ids| ids.iter().any(|j| rhs[*j].values[i].is_some()));
                    if (op == T_LAND && !in_rhs) || (op == T_LUNLESS && in_rhs) {
                        s.values[i] = None;
                    }
                }
                out.push(s);
            }
            if op == T_LOR {
                for mut s in rhs {
                    let sig = signature(&s.labels);
                    if let Some(present) = lhs_sigs.get(&sig) {
                        for (v, seen) in s.values.iter_mut().zip(present) {
                            if *seen {
                                *v = None;
                            }
                        }
                    }
                    out.push(s);
                }
            }
            out.retain(|s| s.values.iter().any(Option::is_some));
            return Ok(Value::Vector(out));
        }
        // As in Prometheus' VectorBinop: the "many" side drives, the "one" side is looked up by signature
        // (for one-to-one matching the left side drives); with group_right the operands swap roles, not
        // places in the operation.
        let (many, one) = if one_to_many { (rhs, lhs) } else { (lhs, rhs) };
        let one_side = if one_to_many { "left" } else { "right" };
        let mut by_sig: HashMap<Labels, Vec<usize>> = HashMap::new();
        for (i, s) in one.iter().enumerate() {
            by_sig.entry(signature(&s.labels)).or_default().push(i);
        }
        let result_labels = |many: &Labels, one: &Labels| -> Labels {
            let mut labels = many.clone();
            if !is_cmp || return_bool {
                drop_name(&mut labels);
            }
            if !explicit {
                match matching {
                    Some(LabelModifier::Include(on)) => {
                        labels.retain(|(k, _)| on.labels.iter().any(|x| x == k))
                    }
                    Some(LabelModifier::Exclude(ign)) => {
                        labels.retain(|(k, _)| !ign.labels.iter().any(|x| x == k))
                    }
                    None => {}
                }
            }
            // group_x(labels) copies those labels from the "one" side (an absent one is removed).
            for name in include {
                labels.retain(|(k, _)| k != name);
                let v = store::label(one, name);
                if !v.is_empty() {
                    labels.push((name.clone(), v.to_string()));
                }
            }
            labels.sort();
            labels
        };
        let mut out: Vec<Series> = Vec::new();
        let mut out_index: HashMap<Labels, usize> = HashMap::new();
        let mut sig_seen: HashMap<Labels, Vec<bool>> = HashMap::new();
        for m in many {
            let sig = signature(&m.labels);
            let Some(ids) = by_sig.get(&sig) else {
                continue;
            };
            // Output series of this "many" series, per matching "one" series.
            let mut targets: Vec<(usize, usize)> = Vec::new();
            for i in 0..n {
                let Some(a) = m.values[i] else { continue };
                let mut matches = ids
                    .iter()
                    .filter_map(|j| one[*j].values[i].map(|v| (*j, v)));
                let Some((j, c)) = matches.next() else {
                    continue;
                };
                if let Some((j2, _)) = matches.next() {
                    return exec(format!(
                        "found duplicate series for the match group {} on the {one_side} hand-side of the operation: [{}, {}];many-to-many matching not allowed: matching labels must be unique on one side",
                        render(&sig),
                        render(&one[j].labels),
                        render(&one[j2].labels)
                    ));
                }
                if !explicit {
                    let seen = sig_seen
                        .entry(sig.clone())
                        .or_insert_with(|| vec![false; n]);
                    if std::mem::replace(&mut seen[i], true) {
                        return exec(format!(
                            "multiple matches for labels {}: many-to-one matching must be explicit (group_left/group_right)",
                            render(&sig)
                        ));
                    }
                }
                let (fl, fr) = if one_to_many { (c, a) } else { (a, c) };
                let r = arith(op, fl, fr)?;
                let value = match (is_cmp, return_bool) {
                    (true, true) => Some(if r.is_some() { 1.0 } else { 0.0 }),
                    (true, false) => r.map(|_| fl),
                    _ => r,
                };
                let Some(value) = value else { continue };
                let k = match targets.iter().find(|(jj, _)| *jj == j) {
                    Some((_, k)) => *k,
                    None => {
                        let labels = result_labels(&m.labels, &one[j].labels);
                        let k = *out_index.entry(labels.clone()).or_insert_with(|| {
                            out.push(Series {
                                labels,
                                values: vec![None; n],
                            });
                            out.len() - 1
                        });
                        targets.push((j, k));
                        k
                    }
                };
                if out[k].values[i].replace(value).is_some() {
                    return exec("vector cannot contain metrics with the same labelset");
                }
            }
        }
        Ok(Value::Vector(out))
    }
}

/// Merges series that have the same labels (after a function or operator dropped the metric name, series
/// that differed only by it meet): one series when their steps do not overlap, as Prometheus builds its
/// result step by step, and its "same labelset" error when they do. The order of first appearance is kept.
pub(crate) fn merge_same_labels(series: Vec<Series>) -> Result<Vec<Series>> {
    let mut index: HashMap<Labels, usize> = HashMap::with_capacity(series.len());
    let mut out: Vec<Series> = Vec::with_capacity(series.len());
    for s in series {
        match index.get(&s.labels) {
            None => {
                index.insert(s.labels.clone(), out.len());
                out.push(s);
            }
            Some(&k) => {
                let into = &mut out[k];
                for (a, b) in into.values.iter_mut().zip(s.values) {
                    if let Some(b) = b
                        && a.replace(b).is_some()
                    {
                        return exec("vector cannot contain metrics with the same labelset");
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Neumaier's compensated addition, as Prometheus' `kahanSumInc`: returns the new sum and compensation.
pub(crate) fn kahan_inc(inc: f64, sum: f64, c: f64) -> (f64, f64) {
    let t = sum + inc;
    let c = if t.is_infinite() {
        0.0
    } else if sum.abs() >= inc.abs() {
        c + ((sum - t) + inc)
    } else {
        c + ((inc - t) + sum)
    };
    (t, c)
}

/// Per-step state of one group of a `sum`/`avg`/`min`/`max`/`count`/`group`/`stddev`/`stdvar`.
struct Acc {
    /// Sum, minimum, maximum or (for stddev/stdvar) running mean.
    value: Vec<f64>,
    count: Vec<u32>,
    /// Sum of squared deviations from the running mean (Welford), stddev/stdvar only; for sum and avg the
    /// Kahan compensation of `value`.
    m2: Vec<f64>,
    /// avg only: the running mean once the sum overflowed (Prometheus then switches to an incremental
    /// mean), `None` before.
    mean: Vec<Option<f64>>,
}

impl Acc {
    fn new(n: usize, _spread: bool) -> Self {
        Acc {
            value: vec![0.0; n],
            count: vec![0; n],
            m2: vec![0.0; n],
            mean: vec![None; n],
        }
    }

    fn add(&mut self, op: TokenId, values: &[Option<f64>]) {
        for (i, v) in values.iter().enumerate() {
            let Some(v) = *v else { continue };
            let first = self.count[i] == 0;
            self.count[i] += 1;
            let acc = &mut self.value[i];
            if op == T_MIN {
                if first || v < *acc || acc.is_nan() {
                    *acc = v;
                }
            } else if op == T_MAX {
                if first || v > *acc || acc.is_nan() {
                    *acc = v;
                }
            } else if op == T_STDDEV || op == T_STDVAR {
                // As Prometheus: mean and squared deviations updated one value at a time.
                let delta = v - *acc;
                *acc += delta / self.count[i] as f64;
                self.m2[i] += delta * (v - *acc);
            } else if op == T_AVG {
                // As Prometheus: a compensated sum while it stays finite, then an incremental mean.
                let n = self.count[i] as f64;
                if first {
                    *acc = v;
                    continue;
                }
                if self.mean[i].is_none() {
                    let (t, c) = kahan_inc(v, *acc, self.m2[i]);
                    if !t.is_infinite() {
                        (*acc, self.m2[i]) = (t, c);
                        continue;
                    }
                    self.mean[i] = Some(*acc / (n - 1.0));
                    self.m2[i] /= n - 1.0;
                }
                let q = (n - 1.0) / n;
                let mean = self.mean[i].unwrap_or_default();
                let (m, c) = kahan_inc(v / n, q * mean, q * self.m2[i]);
                self.mean[i] = Some(m);
                self.m2[i] = c;
            } else if first {
                *acc = v;
            } else {
                (*acc, self.m2[i]) = kahan_inc(v, *acc, self.m2[i]);
            }
        }
    }

    /// Adds another worker's state of the same group (not for stddev/stdvar, nor avg once it switched to
    /// an incremental mean: an overflowing avg is finished on one worker's states at a time).
    fn merge(&mut self, op: TokenId, other: Acc) {
        for i in 0..self.count.len() {
            let (c, v) = (other.count[i], other.value[i]);
            if c == 0 {
                continue;
            }
            let acc = &mut self.value[i];
            if self.count[i] == 0 {
                *acc = v;
                self.m2[i] = other.m2[i];
                self.mean[i] = other.mean[i];
            } else if op == T_SUM || op == T_AVG {
                if let (Some(a), Some(b)) = (self.mean[i], other.mean[i]) {
                    let (na, nb) = (self.count[i] as f64, c as f64);
                    self.mean[i] = Some(
                        (a + self.m2[i]) * (na / (na + nb)) + (b + other.m2[i]) * (nb / (na + nb)),
                    );
                    self.m2[i] = 0.0;
                } else if self.mean[i].is_none() && other.mean[i].is_none() {
                    let (t, k) = kahan_inc(v, *acc, self.m2[i] + other.m2[i]);
                    *acc = t;
                    self.m2[i] = k;
                } else {
                    // one side overflowed: fold both into a mean
                    let (na, nb) = (self.count[i] as f64, c as f64);
                    let ma = self.mean[i].map_or((*acc + self.m2[i]) / na, |m| m + self.m2[i]);
                    let mb = other.mean[i].map_or((v + other.m2[i]) / nb, |m| m + other.m2[i]);
                    self.mean[i] = Some(ma * (na / (na + nb)) + mb * (nb / (na + nb)));
                    self.m2[i] = 0.0;
                }
            } else if op == T_MIN {
                if v < *acc || acc.is_nan() {
                    *acc = v;
                }
            } else if op == T_MAX {
                if v > *acc || acc.is_nan() {
                    *acc = v;
                }
            } else {
                *acc += v;
            }
            self.count[i] += c;
        }
    }

    fn finish(self, op: TokenId) -> Vec<Option<f64>> {
        (0..self.count.len())
            .map(|i| {
                let c = self.count[i];
                (c > 0).then(|| match op {
                    x if x == T_COUNT => c as f64,
                    x if x == T_GROUP => 1.0,
                    x if x == T_AVG => match self.mean[i] {
                        Some(mean) => mean + self.m2[i],
                        None => self.value[i] / c as f64 + self.m2[i] / c as f64,
                    },
                    x if x == T_STDVAR => self.m2[i] / c as f64,
                    x if x == T_STDDEV => (self.m2[i] / c as f64).sqrt(),
                    x if x == T_SUM => self.value[i] + self.m2[i],
                    _ => self.value[i],
                })
            })
            .collect()
    }
}

/// Prometheus' `quantile`: linear interpolation between the closest ranks (NaN sorts first; φ < 0 is
/// -Inf, φ > 1 is +Inf).
fn quantile(q: f64, values: &mut [f64]) -> f64 {
    if values.is_empty() || q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    values.sort_by(|a, b| match (a.is_nan(), b.is_nan()) {
        (true, false) => std::cmp::Ordering::Less,
        (false, true) => std::cmp::Ordering::Greater,
        _ => a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal),
    });
    let n = values.len() as f64;
    let rank = q * (n - 1.0);
    let lower = rank.floor().max(0.0);
    let upper = (lower + 1.0).min(n - 1.0);
    let weight = rank - rank.floor();
    values[lower as usize] * (1.0 - weight) + values[upper as usize] * weight
}

/// A sample value as Prometheus writes it in a label (Go's `FormatFloat(v, 'f', -1, 64)`).
fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

/// Whether `name` is a valid (classic) Prometheus label name: `[a-zA-Z_][a-zA-Z0-9_]*`.
fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Labels as PromQL writes them: `{a="1", b="2"}`.
fn render(labels: &Labels) -> String {
    let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{{{}}}", inner.join(", "))
}

/// A vector and a scalar: each value against the scalar of its step.
fn vector_scalar(
    op: TokenId,
    is_cmp: bool,
    return_bool: bool,
    mut vs: Vec<Series>,
    s: &[f64],
    scalar_left: bool,
) -> Result<Value> {
    for series in &mut vs {
        if !is_cmp || return_bool {
            drop_name(&mut series.labels);
        }
        for (i, slot) in series.values.iter_mut().enumerate() {
            let Some(v) = *slot else { continue };
            let (a, c) = if scalar_left { (s[i], v) } else { (v, s[i]) };
            let r = arith(op, a, c)?;
            *slot = match (is_cmp, return_bool) {
                (true, true) => Some(if r.is_some() { 1.0 } else { 0.0 }),
                (true, false) => r.map(|_| v),
                _ => r,
            };
        }
    }
    vs.retain(|s| s.values.iter().any(Option::is_some));
    Ok(Value::Vector(vs))
}

/// Applies an arithmetic operator (`Some(result)`) or a comparison (`Some(lhs)` when true, `None` when
/// false).
fn arith(op: TokenId, a: f64, b: f64) -> Result<Option<f64>> {
    let cmp = |c: bool| if c { Some(a) } else { None };
    Ok(match op {
        x if x == T_ADD => Some(a + b),
        x if x == T_SUB => Some(a - b),
        x if x == T_MUL => Some(a * b),
        x if x == T_DIV => Some(a / b),
        x if x == T_MOD => Some(a % b),
        x if x == T_POW => Some(a.powf(b)),
        x if x == T_ATAN2 => Some(a.atan2(b)),
        x if x == T_EQLC => cmp(a == b),
        x if x == T_NEQ => cmp(a != b),
        x if x == T_GTR => cmp(a > b),
        x if x == T_LSS => cmp(a < b),
        x if x == T_GTE => cmp(a >= b),
        x if x == T_LTE => cmp(a <= b),
        _ => return bad("operator not supported between these operands"),
    })
}

#[cfg(test)]
mod tests;
