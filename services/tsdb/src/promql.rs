//! PromQL evaluation over the [`Store`], on ASTs from the `promql-parser` crate.
//!
//! A query is evaluated for all its steps at once: an instant vector is a set of series, each with one
//! optional value per step, so a range query reads every series once. Selectors feeding an aggregation are
//! streamed series by series, so `sum by (cluster) (rate(x[5m]))` holds only the groups in memory.
//!
//! Supported: vector selectors (`=`, `!=`, `=~`, `!~`, `offset`, `@`), range vectors in functions;
//! `rate`, `irate`, `increase`, `delta`, `{avg,min,max,sum,count,last}_over_time`, `abs`, `ceil`, `floor`,
//! `round`, `sqrt`, `exp`, `ln`, `log2`, `log10`, `clamp_min`, `clamp_max`, `time`, `vector`, `scalar`;
//! aggregations `sum`, `avg`, `min`, `max`, `count`, `group`, `topk`, `bottomk` with `by`/`without`; binary
//! `+ - * / % ^`, comparisons (with `bool`) and `and`/`or`/`unless` between scalars and vectors, vector
//! matching one-to-one with `on`/`ignoring`. Not supported (a clear error): subqueries, `group_left` and
//! `group_right`, other functions and aggregations.

mod functions;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::token::*;
use promql_parser::parser::{
    AggregateExpr, AtModifier, BinaryExpr, Call, Expr, LabelModifier, Offset,
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
    lookback_ms: i64,
}

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

/// Parses a query. The parser is third-party code fed with user input: a panic inside it becomes a
/// `bad_data` error instead of taking the request (or the process) down.
pub fn parse(query: &str) -> Result<Expr> {
    match std::panic::catch_unwind(|| promql_parser::parser::parse(query)) {
        Ok(Ok(expr)) => Ok(expr),
        Ok(Err(e)) => Err(Error::BadData(e)),
        Err(_) => Err(Error::BadData(format!("invalid query: {query:?}"))),
    }
}

fn drop_name(labels: &mut Labels) {
    labels.retain(|(k, _)| k != METRIC_NAME);
}

impl Engine {
    /// An engine with the given lookback delta for instant selectors.
    pub fn new(store: Arc<Store>, lookback: Duration) -> Self {
        Engine {
            store,
            lookback_ms: millis(lookback).max(1),
        }
    }

    /// Evaluates `query` at one time (ms).
    pub fn instant(&self, query: &str, time_ms: i64) -> Result<Value> {
        let expr = parse(query)?;
        let steps = Steps {
            times: vec![time_ms],
            start: time_ms,
            end: time_ms,
        };
        let ev = Eval {
            engine: self,
            steps: &steps,
        };
        if let Expr::MatrixSelector(ms) = &expr {
            return ev.raw_matrix(&ms.vs, millis(ms.range));
        }
        ev.eval(&expr)
    }

    /// Evaluates `query` from `start` to `end` every `step` (all ms).
    pub fn range(&self, query: &str, start: i64, end: i64, step: i64) -> Result<Value> {
        if step <= 0 || end < start {
            return bad("invalid range: end before start or step not positive");
        }
        if (end - start) / step > 11_000 {
            return bad(
                "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)",
            );
        }
        let expr = parse(query)?;
        let times = (0..=(end - start) / step)
            .map(|i| start + i * step)
            .collect();
        let steps = Steps { times, start, end };
        let ev = Eval {
            engine: self,
            steps: &steps,
        };
        match ev.eval(&expr)? {
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

/// Computes an output series from a selected series' labels, the per-step reference times and the samples
/// read for them (runs on worker threads).
type ComputeFn<'f> = dyn Fn(&Labels, &[i64], &[(i64, f64)]) -> Option<Series> + Sync + 'f;

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
                    Ok(Value::Vector(vs))
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
                Ok(Value::Vector(out))
            }
            Expr::MatrixSelector(_) => bad(
                "a range vector is only allowed as a function argument or as a whole instant query",
            ),
            Expr::Aggregate(a) => self.aggregate(a),
            Expr::Binary(b) => self.binary(b),
            Expr::Subquery(_) => bad("subqueries are not supported by this TSDB"),
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
        vs: &VectorSelector,
        window: i64,
        compute: &ComputeFn<'_>,
        f: &mut dyn FnMut(Series) -> Result<()>,
    ) -> Result<()> {
        let refs = self.ref_times(vs);
        let (Some(&min), Some(&max)) = (refs.iter().min(), refs.iter().max()) else {
            return Ok(());
        };
        let mint = min.saturating_sub(window).saturating_add(1);
        let store = &self.engine.store;
        let selected = store.select(&selector_matchers(vs));
        let refs = &refs[..];
        let one = |(id, labels): &(store::SeriesId, Arc<Labels>)| -> Result<Option<Series>> {
            let samples = store.samples(*id, mint, max)?;
            if samples.is_empty() {
                return Ok(None);
            }
            Ok(compute(labels, refs, &samples))
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

    /// Streams the series of an instant-vector expression (selectors and functions of selectors without
    /// materialising the rest).
    fn each_series(&self, expr: &Expr, f: &mut dyn FnMut(Series) -> Result<()>) -> Result<()> {
        match expr {
            Expr::Paren(p) => self.each_series(&p.expr, f),
            Expr::VectorSelector(vs) => {
                let lookback = self.engine.lookback_ms;
                let compute = |labels: &Labels, refs: &[i64], samples: &[(i64, f64)]| {
                    let values: Vec<Option<f64>> = refs
                        .iter()
                        .map(|&t| {
                            let end = samples.partition_point(|s| s.0 <= t);
                            let (st, v) = *samples.get(end.checked_sub(1)?)?;
                            (st > t - lookback && !is_stale(v)).then_some(v)
                        })
                        .collect();
                    values.iter().any(Option::is_some).then(|| Series {
                        labels: labels.clone(),
                        values,
                    })
                };
                self.map_selected(vs, lookback, &compute, f)
            }
            Expr::Call(c) => functions::call(self, c, f),
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
        let store = &self.engine.store;
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
        if op == T_TOPK || op == T_BOTTOMK {
            let Some(param) = &a.param else {
                return bad("topk/bottomk need a parameter");
            };
            let k = self.eval_scalar(param)?;
            let mut groups: HashMap<Labels, Vec<Series>> = HashMap::new();
            self.each_series(&a.expr, &mut |s| {
                groups.entry(group_labels(&s.labels)).or_default().push(s);
                Ok(())
            })?;
            let mut out = Vec::new();
            for (_, mut members) in groups {
                for i in 0..n {
                    let k = k[i];
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
                out.extend(
                    members
                        .into_iter()
                        .filter(|s| s.values.iter().any(Option::is_some)),
                );
            }
            out.sort_by(|x, y| x.labels.cmp(&y.labels));
            return Ok(Value::Vector(out));
        }
        if ![T_SUM, T_AVG, T_MIN, T_MAX, T_COUNT, T_GROUP].contains(&op) {
            return bad(format!(
                "aggregation {} is not supported by this TSDB",
                a.to_string().split('(').next().unwrap_or("")
            ));
        }
        struct Acc {
            sum: Vec<f64>,
            count: Vec<u32>,
        }
        let mut groups: HashMap<Labels, Acc> = HashMap::new();
        self.each_series(&a.expr, &mut |s| {
            let acc = groups
                .entry(group_labels(&s.labels))
                .or_insert_with(|| Acc {
                    sum: vec![0.0; n],
                    count: vec![0; n],
                });
            for (i, v) in s.values.iter().enumerate() {
                let Some(v) = *v else { continue };
                let first = acc.count[i] == 0;
                acc.sum[i] = if op == T_MIN {
                    if first || v < acc.sum[i] || acc.sum[i].is_nan() {
                        v
                    } else {
                        acc.sum[i]
                    }
                } else if op == T_MAX {
                    if first || v > acc.sum[i] || acc.sum[i].is_nan() {
                        v
                    } else {
                        acc.sum[i]
                    }
                } else {
                    acc.sum[i] + v
                };
                acc.count[i] += 1;
            }
            Ok(())
        })?;
        let mut out: Vec<Series> = groups
            .into_iter()
            .map(|(labels, acc)| {
                let values = (0..n)
                    .map(|i| {
                        let c = acc.count[i];
                        (c > 0).then(|| match op {
                            x if x == T_COUNT => c as f64,
                            x if x == T_GROUP => 1.0,
                            x if x == T_AVG => acc.sum[i] / c as f64,
                            _ => acc.sum[i],
                        })
                    })
                    .collect();
                Series { labels, values }
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
                self.vector_binary(b, op, is_cmp, is_set, return_bool, l, r)
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
        if let Some(m) = modifier
            && matches!(
                m.card,
                VectorMatchCardinality::ManyToOne(_) | VectorMatchCardinality::OneToMany(_)
            )
        {
            return bad("group_left/group_right matching is not supported by this TSDB");
        }
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
        let mut by_sig: HashMap<Labels, Vec<usize>> = HashMap::new();
        for (i, s) in rhs.iter().enumerate() {
            by_sig.entry(signature(&s.labels)).or_default().push(i);
        }
        if is_set {
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
        let mut out: Vec<Series> = Vec::new();
        let mut lhs_seen: HashMap<Labels, Vec<bool>> = HashMap::new();
        for l in lhs {
            let sig = signature(&l.labels);
            let Some(ids) = by_sig.get(&sig) else {
                continue;
            };
            let seen = lhs_seen
                .entry(sig.clone())
                .or_insert_with(|| vec![false; n]);
            let mut values = vec![None; n];
            for i in 0..n {
                let Some(a) = l.values[i] else { continue };
                let mut matches = ids.iter().filter_map(|j| rhs[*j].values[i]);
                let Some(c) = matches.next() else { continue };
                if matches.next().is_some() {
                    return bad(format!(
                        "found duplicate series for the match group {sig:?} on the right hand-side of the operation"
                    ));
                }
                if std::mem::replace(&mut seen[i], true) {
                    return bad(format!(
                        "multiple matches for labels {sig:?}: many-to-one matching must be explicit (group_left/group_right)"
                    ));
                }
                let r = arith(op, a, c)?;
                values[i] = match (is_cmp, return_bool) {
                    (true, true) => Some(if r.is_some() { 1.0 } else { 0.0 }),
                    (true, false) => r.map(|_| a),
                    _ => r,
                };
            }
            let mut labels = l.labels;
            if !is_cmp || return_bool {
                drop_name(&mut labels);
            }
            match matching {
                Some(LabelModifier::Include(on)) => {
                    labels.retain(|(k, _)| on.labels.iter().any(|x| x == k))
                }
                Some(LabelModifier::Exclude(ign)) => {
                    labels.retain(|(k, _)| !ign.labels.iter().any(|x| x == k))
                }
                None => {}
            }
            if values.iter().any(Option::is_some) {
                out.push(Series { labels, values });
            }
        }
        Ok(Value::Vector(out))
    }
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
