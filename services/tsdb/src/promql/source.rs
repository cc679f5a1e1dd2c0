//! Where the engine reads series from: the local [`Store`], or the series one query gathered in memory
//! from the local store and the other partitions' instances (see [`crate::federate`]).
//!
//! [`plan`] says what a query reads: the matcher sets of all its selectors and the time range that covers
//! every step, range, offset, `@` and subquery, so a peer is asked once per query.

use std::sync::Arc;
use std::time::Duration;

use promql_parser::label::Matcher;
use promql_parser::parser::{AtModifier, Expr};

use super::{Result, millis, offset_ms, selector_matchers, system_ms};
use crate::store::{self, Labels, SeriesId, Store};

/// A series source.
#[derive(Debug, Clone)]
pub enum Source {
    /// The local store.
    Local(Arc<Store>),
    /// Series gathered for one query.
    Gathered(Arc<Gathered>),
}

/// One gathered series: labels and samples.
type Held = (Arc<Labels>, Vec<(i64, f64)>);

/// Series held in memory, sorted by labels, each with its samples sorted by time (one per timestamp).
#[derive(Debug, Default)]
pub struct Gathered {
    series: Vec<Held>,
}

impl Gathered {
    /// Merges series from several sources: the same labels from two sources become one series (samples
    /// unioned by timestamp, the first source's value kept on a tie).
    pub fn new(parts: impl IntoIterator<Item = (Labels, Vec<(i64, f64)>)>) -> Self {
        let mut by: std::collections::BTreeMap<Labels, Vec<(i64, f64)>> = Default::default();
        for (mut labels, samples) in parts {
            labels.sort();
            let into = by.entry(labels).or_default();
            if into.is_empty() {
                *into = samples;
            } else {
                into.extend(samples);
            }
        }
        let series = by
            .into_iter()
            .map(|(labels, mut samples)| {
                // stable: on equal timestamps the first (local) sample stays first and survives dedup
                samples.sort_by_key(|s| s.0);
                samples.dedup_by_key(|s| s.0);
                (Arc::new(labels), samples)
            })
            .collect();
        Gathered { series }
    }

    /// Number of series.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

impl Source {
    /// The series matching any of the matcher sets, sorted by labels.
    pub fn select(&self, alternatives: &[Vec<Matcher>]) -> Vec<(SeriesId, Arc<Labels>)> {
        match self {
            Source::Local(s) => s.select(alternatives),
            Source::Gathered(g) => g
                .series
                .iter()
                .enumerate()
                .filter(|(_, (labels, _))| {
                    alternatives.iter().any(|set| {
                        set.iter()
                            .all(|m| m.is_match(store::label(labels, &m.name)))
                    })
                })
                .map(|(i, (labels, _))| (i as SeriesId, labels.clone()))
                .collect(),
        }
    }

    /// The ids of the series [`Source::select`] gives, in the source's cheapest order (series id order for
    /// the local store: no label comparisons), without their labels (fetched one at a time with
    /// [`Source::labels`]).
    pub fn select_ids(&self, alternatives: &[Vec<Matcher>]) -> Vec<SeriesId> {
        match self {
            Source::Local(s) => s.select_ids(alternatives),
            Source::Gathered(_) => self
                .select(alternatives)
                .into_iter()
                .map(|(id, _)| id)
                .collect(),
        }
    }

    /// A series' labels, by an id [`Source::select_ids`] gave.
    pub fn labels(&self, id: SeriesId) -> Option<Arc<Labels>> {
        match self {
            Source::Local(s) => s.labels(id),
            Source::Gathered(g) => usize::try_from(id)
                .ok()
                .and_then(|i| g.series.get(i))
                .map(|(labels, _)| labels.clone()),
        }
    }

    /// The samples of a series in `[mint, maxt]`.
    pub fn samples(&self, id: SeriesId, mint: i64, maxt: i64) -> Result<Vec<(i64, f64)>> {
        let mut out = Vec::new();
        self.samples_into(id, mint, maxt, &mut out)?;
        Ok(out)
    }

    /// [`Source::samples`] into a reused buffer (cleared first).
    pub fn samples_into(
        &self,
        id: SeriesId,
        mint: i64,
        maxt: i64,
        out: &mut Vec<(i64, f64)>,
    ) -> Result<()> {
        match self {
            Source::Local(s) => Ok(s.samples_into(id, mint, maxt, out)?),
            Source::Gathered(g) => {
                out.clear();
                if let Some((_, samples)) = usize::try_from(id).ok().and_then(|i| g.series.get(i)) {
                    let from = samples.partition_point(|s| s.0 < mint);
                    let to = samples.partition_point(|s| s.0 <= maxt);
                    if from < to {
                        out.extend_from_slice(&samples[from..to]);
                    }
                }
                Ok(())
            }
        }
    }
}

/// What a query reads: every selector's matcher sets and one time range covering all of them (ms,
/// inclusive).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Matcher sets (a series matching any set is read).
    pub matchers: Vec<Vec<Matcher>>,
    /// Earliest sample time needed.
    pub mint: i64,
    /// Latest sample time needed.
    pub maxt: i64,
}

/// The plan of `query` evaluated from `start` to `end` (the same for an instant query) with the given
/// lookback delta.
pub fn plan(query: &str, start: i64, end: i64, lookback: Duration) -> Result<Plan> {
    Ok(plan_expr(&super::parse(query)?, start, end, lookback))
}

/// [`plan`] of a parsed query.
pub fn plan_expr(expr: &Expr, start: i64, end: i64, lookback: Duration) -> Plan {
    let mut p = Plan {
        matchers: Vec::new(),
        mint: i64::MAX,
        maxt: i64::MIN,
    };
    walk(expr, start, end, millis(lookback).max(1), &mut p);
    if p.mint > p.maxt {
        // no selector: nothing to read
        p.mint = start;
        p.maxt = end;
    }
    p
}

/// The evaluation times a selector's `@` pins it to (`start()`/`end()` stay within the enclosing range).
fn pinned(at: &Option<AtModifier>, s: i64, e: i64) -> (i64, i64) {
    match at {
        Some(AtModifier::At(t)) => {
            let t = system_ms(*t);
            (t, t)
        }
        _ => (s, e),
    }
}

fn walk(expr: &Expr, s: i64, e: i64, lookback: i64, p: &mut Plan) {
    let need = |from: i64, to: i64, p: &mut Plan| {
        p.mint = p.mint.min(from);
        p.maxt = p.maxt.max(to);
    };
    match expr {
        Expr::VectorSelector(vs) => {
            let (s, e) = pinned(&vs.at, s, e);
            let off = offset_ms(&vs.offset);
            need(
                s.saturating_sub(off).saturating_sub(lookback),
                e.saturating_sub(off),
                p,
            );
            p.matchers.extend(selector_matchers(vs));
        }
        Expr::MatrixSelector(ms) => {
            let (s, e) = pinned(&ms.vs.at, s, e);
            let off = offset_ms(&ms.vs.offset);
            need(
                s.saturating_sub(off).saturating_sub(millis(ms.range)),
                e.saturating_sub(off),
                p,
            );
            p.matchers.extend(selector_matchers(&ms.vs));
        }
        Expr::Subquery(sq) => {
            let (s, e) = pinned(&sq.at, s, e);
            let off = offset_ms(&sq.offset);
            let step = sq
                .step
                .map(millis)
                .filter(|x| *x > 0)
                .unwrap_or(super::DEFAULT_SUBQUERY_STEP_MS);
            let inner_s = s
                .saturating_sub(off)
                .saturating_sub(millis(sq.range))
                .saturating_sub(step);
            walk(&sq.expr, inner_s, e.saturating_sub(off), lookback, p);
        }
        Expr::Aggregate(a) => {
            walk(&a.expr, s, e, lookback, p);
            if let Some(param) = &a.param {
                walk(param, s, e, lookback, p);
            }
        }
        Expr::Unary(u) => walk(&u.expr, s, e, lookback, p),
        Expr::Paren(x) => walk(&x.expr, s, e, lookback, p),
        Expr::Binary(b) => {
            walk(&b.lhs, s, e, lookback, p);
            walk(&b.rhs, s, e, lookback, p);
        }
        Expr::Call(c) => {
            for a in &c.args.args {
                walk(a, s, e, lookback, p);
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_covers_ranges_offsets_and_subqueries() {
        let lb = Duration::from_secs(300);
        let p = plan("sum(rate(x[5m] offset 1h)) + y", 10_000_000, 10_060_000, lb).expect("plan");
        assert_eq!(p.matchers.len(), 2);
        assert_eq!(p.mint, 10_000_000 - 3_600_000 - 300_000);
        assert_eq!(p.maxt, 10_060_000);
        let p = plan("max_over_time(x[10m:1m])", 10_000_000, 10_000_000, lb).expect("plan");
        assert!(p.mint <= 10_000_000 - 600_000 - 60_000 - 300_000, "{p:?}");
        let p = plan("vector(1)", 5, 6, lb).expect("plan");
        assert!(p.matchers.is_empty());
        assert!(plan("sum(", 0, 0, lb).is_err());
    }

    #[test]
    fn gathered_merges_the_same_series_and_selects_by_matchers() {
        let a: Labels = vec![
            ("__name__".into(), "up".into()),
            ("cluster".into(), "a".into()),
        ];
        let b: Labels = vec![
            ("__name__".into(), "up".into()),
            ("cluster".into(), "b".into()),
        ];
        let g = Gathered::new([
            (a.clone(), vec![(1, 1.0), (3, 3.0)]),
            (b.clone(), vec![(1, 5.0)]),
            (a.clone(), vec![(2, 2.0), (3, 9.0)]),
        ]);
        assert_eq!(g.len(), 2);
        let src = Source::Gathered(Arc::new(g));
        let sel = src.select(&[vec![Matcher::new(
            promql_parser::label::MatchOp::Equal,
            "cluster",
            "a",
        )]]);
        assert_eq!(sel.len(), 1);
        let samples = src.samples(sel[0].0, 0, 10).expect("samples");
        assert_eq!(samples, vec![(1, 1.0), (2, 2.0), (3, 3.0)]);
        assert_eq!(
            src.samples(sel[0].0, 2, 2).expect("samples"),
            vec![(2, 2.0)]
        );
        assert!(src.samples(99, 0, 10).expect("none").is_empty());
    }
}
