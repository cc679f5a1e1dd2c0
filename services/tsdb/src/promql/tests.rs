//! PromQL results against hand-computed values.
//!
//! Data (all every 30 s from t = 0 to 1200 s):
//! - `req_total{cluster="a",instance="i1"}` = t (1/s), `{cluster="a",instance="i2"}` = 2t,
//!   `{cluster="b",instance="i1"}` = 4t: counters.
//! - `temp{cluster="a"}` = 10, 20, 10, 20, … (even steps 10); `temp{cluster="b"}` = 5 throughout.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use multipilot_schemas::payload::Sample;

use super::{Engine, Series, Value};
use crate::store::{Options, Store};

fn sample(name: &str, labels: &[(&str, &str)], t_s: i64, v: f64) -> Sample {
    Sample {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        value: v,
        timestamp_ms: t_s * 1000,
    }
}

fn engine() -> (tempfile::TempDir, Engine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), Options::default()).expect("open");
    let mut batch = Vec::new();
    for i in 0..=40 {
        let t = i * 30;
        let tf = t as f64;
        batch.push(sample(
            "req_total",
            &[("cluster", "a"), ("instance", "i1")],
            t,
            tf,
        ));
        batch.push(sample(
            "req_total",
            &[("cluster", "a"), ("instance", "i2")],
            t,
            2.0 * tf,
        ));
        batch.push(sample(
            "req_total",
            &[("cluster", "b"), ("instance", "i1")],
            t,
            4.0 * tf,
        ));
        let temp = if i % 2 == 0 { 10.0 } else { 20.0 };
        batch.push(sample("temp", &[("cluster", "a")], t, temp));
        batch.push(sample("temp", &[("cluster", "b")], t, 5.0));
    }
    store.append("", &batch).expect("append");
    (dir, Engine::new(Arc::new(store), Duration::from_secs(300)))
}

/// The instant vector as (labels rendered `k=v,…`, value), sorted.
fn vector(e: &Engine, q: &str, t_s: i64) -> Vec<(String, f64)> {
    match e
        .instant(q, t_s * 1000)
        .unwrap_or_else(|err| panic!("{q}: {err}"))
    {
        Value::Vector(v) => {
            let mut out: Vec<(String, f64)> = v
                .into_iter()
                .filter_map(|s: Series| {
                    let l = s
                        .labels
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(",");
                    s.values[0].map(|v| (l, v))
                })
                .collect();
            out.sort_by(|a, b| a.0.cmp(&b.0));
            out
        }
        other => panic!("{q}: expected a vector, got {other:?}"),
    }
}

fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() < 1e-9
}

fn assert_vector(got: Vec<(String, f64)>, want: &[(&str, f64)]) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for ((gl, gv), (wl, wv)) in got.iter().zip(want) {
        assert_eq!(gl, wl, "got {got:?}");
        assert!(close(*gv, *wv), "{gl}: got {gv}, want {wv}");
    }
}

#[test]
fn selectors_use_all_four_matcher_types() {
    let (_d, e) = engine();
    assert_vector(
        vector(&e, r#"temp{cluster="a"}"#, 600),
        &[("__name__=temp,cluster=a", 10.0)],
    );
    assert_vector(
        vector(&e, r#"temp{cluster!="a"}"#, 600),
        &[("__name__=temp,cluster=b", 5.0)],
    );
    assert_eq!(vector(&e, r#"req_total{instance=~"i.*"}"#, 600).len(), 3);
    assert_vector(
        vector(&e, r#"req_total{cluster!~"a|c"}"#, 600),
        &[("__name__=req_total,cluster=b,instance=i1", 2400.0)],
    );
    assert_eq!(vector(&e, r#"{__name__=~"temp|req_total"}"#, 600).len(), 5);
}

#[test]
fn instant_selectors_look_back_five_minutes() {
    let (_d, e) = engine();
    // Last sample at 1200 s: visible until 1200 + 300 (exclusive), gone after.
    assert_eq!(vector(&e, r#"temp{cluster="b"}"#, 1499).len(), 1);
    assert_eq!(vector(&e, r#"temp{cluster="b"}"#, 1500).len(), 0);
    // Between samples, the previous one: at 615 s the 600 s sample (10).
    assert_vector(
        vector(&e, r#"temp{cluster="a"}"#, 615),
        &[("__name__=temp,cluster=a", 10.0)],
    );
}

#[test]
fn rate_increase_and_irate_match_prometheus() {
    let (_d, e) = engine();
    // At 600 s, range (300, 600] holds 330..600: 10 samples, 270 s sampled, 30 s to the start (< 1.1 × 30),
    // zero point far away: factor 300/270. i1: increase 270 → 300, rate 1.
    assert_vector(
        vector(&e, r#"rate(req_total{cluster="a"}[5m])"#, 600),
        &[
            ("cluster=a,instance=i1", 1.0),
            ("cluster=a,instance=i2", 2.0),
        ],
    );
    assert_vector(
        vector(&e, r#"increase(req_total{cluster="b"}[5m])"#, 600),
        &[("cluster=b,instance=i1", 1200.0)],
    );
    assert_vector(
        vector(&e, r#"irate(req_total{cluster="b"}[5m])"#, 615),
        &[("cluster=b,instance=i1", 4.0)],
    );
    // One sample in range: no rate.
    assert!(vector(&e, r#"rate(req_total[30s])"#, 600).is_empty());
}

#[test]
fn over_time_functions() {
    let (_d, e) = engine();
    // (480, 600]: 510=20, 540=10, 570=20, 600=10 → avg 15, min 10, max 20, sum 60, count 4.
    for (f, want) in [
        ("avg", 15.0),
        ("min", 10.0),
        ("max", 20.0),
        ("sum", 60.0),
        ("count", 4.0),
    ] {
        assert_vector(
            vector(
                &e,
                &format!(r#"{f}_over_time(temp{{cluster="a"}}[2m])"#),
                600,
            ),
            &[("cluster=a", want)],
        );
    }
}

#[test]
fn aggregations_with_by_and_without() {
    let (_d, e) = engine();
    assert_vector(
        vector(&e, "sum by (cluster) (rate(req_total[5m]))", 600),
        &[("cluster=a", 3.0), ("cluster=b", 4.0)],
    );
    assert_vector(vector(&e, "sum(rate(req_total[5m]))", 600), &[("", 7.0)]);
    assert_vector(
        vector(&e, "avg without (instance) (req_total)", 600),
        &[("cluster=a", 900.0), ("cluster=b", 2400.0)],
    );
    assert_vector(
        vector(&e, "max by (instance) (req_total)", 600),
        &[("instance=i1", 2400.0), ("instance=i2", 1200.0)],
    );
    assert_vector(vector(&e, "min(req_total)", 600), &[("", 600.0)]);
    assert_vector(
        vector(&e, "count by (cluster) (req_total)", 600),
        &[("cluster=a", 2.0), ("cluster=b", 1.0)],
    );
    assert_vector(
        vector(&e, "topk(1, req_total)", 600),
        &[("__name__=req_total,cluster=b,instance=i1", 2400.0)],
    );
    assert_vector(
        vector(&e, "topk by (cluster) (1, req_total)", 600),
        &[
            ("__name__=req_total,cluster=a,instance=i2", 1200.0),
            ("__name__=req_total,cluster=b,instance=i1", 2400.0),
        ],
    );
    assert_vector(
        vector(&e, "bottomk(1, req_total)", 600),
        &[("__name__=req_total,cluster=a,instance=i1", 600.0)],
    );
}

#[test]
fn arithmetic_and_comparisons() {
    let (_d, e) = engine();
    assert_vector(
        vector(&e, r#"req_total{cluster="b"} / 100 + 1"#, 600),
        &[("cluster=b,instance=i1", 25.0)],
    );
    assert_vector(
        vector(&e, r#"2 * temp{cluster="b"}"#, 600),
        &[("cluster=b", 10.0)],
    );
    assert_vector(
        vector(&e, "req_total > 1000", 600),
        &[
            ("__name__=req_total,cluster=a,instance=i2", 1200.0),
            ("__name__=req_total,cluster=b,instance=i1", 2400.0),
        ],
    );
    assert_vector(
        vector(&e, "req_total > bool 1000", 600),
        &[
            ("cluster=a,instance=i1", 0.0),
            ("cluster=a,instance=i2", 1.0),
            ("cluster=b,instance=i1", 1.0),
        ],
    );
    assert_vector(
        vector(&e, "1000 < req_total", 600),
        &[
            ("__name__=req_total,cluster=a,instance=i2", 1200.0),
            ("__name__=req_total,cluster=b,instance=i1", 2400.0),
        ],
    );
    // Vector/vector one-to-one on all labels but the name, and with on().
    assert_vector(
        vector(&e, r#"req_total{cluster="b"} / on(cluster) temp"#, 600),
        &[("cluster=b", 480.0)],
    );
    assert_vector(
        vector(&e, "sum by (cluster) (req_total) - on(cluster) temp", 600),
        &[("cluster=a", 1790.0), ("cluster=b", 2395.0)],
    );
    assert_vector(
        vector(&e, "temp == temp", 600),
        &[
            ("__name__=temp,cluster=a", 10.0),
            ("__name__=temp,cluster=b", 5.0),
        ],
    );
    assert!(
        e.instant("1 + 2 * 3", 0)
            .is_ok_and(|v| v == Value::Scalar(vec![7.0]))
    );
    // Many-to-one without group_left is an error, as in Prometheus.
    assert!(e.instant("req_total / on(cluster) temp", 600_000).is_err());
}

#[test]
fn set_operators() {
    let (_d, e) = engine();
    assert_eq!(vector(&e, r#"temp and temp{cluster="a"}"#, 600).len(), 1);
    assert_eq!(vector(&e, r#"temp unless temp{cluster="a"}"#, 600).len(), 1);
    assert_eq!(vector(&e, r#"temp{cluster="a"} or temp"#, 600).len(), 2);
}

#[test]
fn range_queries_evaluate_every_step() {
    let (_d, e) = engine();
    let v = e
        .range(r#"sum(temp)"#, 540_000, 660_000, 60_000)
        .expect("range");
    // 540 s: 10 + 5, 600 s: 10 + 5, 660 s: 10 + 5 (even steps of 30 s are 10).
    let Value::Vector(series) = v else {
        panic!("vector expected")
    };
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].values, vec![Some(15.0), Some(15.0), Some(15.0)]);
    let v = e
        .range(r#"temp{cluster="a"}"#, 570_000, 600_000, 30_000)
        .expect("range");
    let Value::Vector(series) = v else {
        panic!("vector expected")
    };
    assert_eq!(series[0].values, vec![Some(20.0), Some(10.0)]);
}

#[test]
fn bad_queries_are_bad_data() {
    let (_d, e) = engine();
    for q in [
        "sum(",
        "rate(temp)",
        "temp[5m] + 1",
        "no_such_function(temp)",
        "temp[5m:1m] + 1",
        r#"count_values("not-a-label", temp)"#,
        r#"label_replace(temp, "dst", "$1", "cluster", "(")"#,
        r#"label_replace(temp, "1dst", "$1", "cluster", "(.*)")"#,
        r#"label_join(temp, "dst")"#,
        "histogram_quantile(0.5)",
        "max_over_time(temp[1y:1s])",
    ] {
        assert!(
            matches!(e.instant(q, 600_000), Err(super::Error::BadData(_))),
            "{q} should be rejected"
        );
    }
    // valid queries whose evaluation Prometheus refuses: `execution` errors (HTTP 422), as there
    for q in [
        // Two left series per cluster: group_right's "one" side must be unique.
        "req_total + on(cluster) group_right temp",
        // Both temp series lose their only distinguishing label.
        r#"label_replace(temp, "cluster", "", "cluster", ".*")"#,
    ] {
        assert!(
            matches!(e.instant(q, 600_000), Err(super::Error::Execution(_))),
            "{q} should fail in evaluation"
        );
    }
    assert!(e.range("temp", 10, 0, 1).is_err());
    // promql-parser panics on a duration too big for a `Duration` (found by fuzzing): caught, bad_data.
    let huge = format!("(1[ {}])", "1".repeat(120));
    assert!(matches!(
        e.instant(&huge, 600_000),
        Err(super::Error::BadData(_))
    ));
}

#[test]
fn counter_resets_are_added_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), Options::default()).expect("open");
    let batch: Vec<Sample> = [(60, 10.0), (90, 20.0), (120, 5.0), (150, 15.0)]
        .iter()
        .map(|&(t, v)| sample("reset_total", &[("cluster", "a")], t, v))
        .collect();
    store.append("", &batch).expect("append");
    let e = Engine::new(Arc::new(store), Duration::from_secs(300));
    // Range (45, 165]: raw increase 15 - 10 + 20 (the reset) = 25 over 90 s sampled; 15 s to each edge
    // (< 1.1 × 30 s), zero point 36 s before the first sample: factor 120 / 90.
    assert_vector(
        vector(&e, "increase(reset_total[2m])", 165),
        &[("cluster=a", 25.0 * 120.0 / 90.0)],
    );
    assert_vector(
        vector(&e, "rate(reset_total[2m])", 165),
        &[("cluster=a", 25.0 * 120.0 / 90.0 / 120.0)],
    );
    // A window after the reset holds none: 5 → 15 over (105, 165] is 10 over 30 s, extrapolated by
    // 15 s each side: 20.
    assert_vector(
        vector(&e, "increase(reset_total[1m])", 165),
        &[("cluster=a", 20.0)],
    );
}

#[test]
fn group_left_and_group_right_match_many_to_one() {
    let (_d, e) = engine();
    // At 600 s: req_total a/i1 600, a/i2 1200, b/i1 2400; temp a 10, b 5.
    assert_vector(
        vector(&e, "req_total / on(cluster) group_left temp", 600),
        &[
            ("cluster=a,instance=i1", 60.0),
            ("cluster=a,instance=i2", 120.0),
            ("cluster=b,instance=i1", 480.0),
        ],
    );
    // group_left(zone) copies `zone` from the "one" side.
    assert_vector(
        vector(
            &e,
            r#"req_total * on(cluster) group_left(zone) label_replace(temp, "zone", "z-$1", "cluster", "(.*)")"#,
            600,
        ),
        &[
            ("cluster=a,instance=i1,zone=z-a", 6000.0),
            ("cluster=a,instance=i2,zone=z-a", 12000.0),
            ("cluster=b,instance=i1,zone=z-b", 12000.0),
        ],
    );
    // group_right: the right side is the "many" side and gives the labels; the operation stays temp / req.
    assert_vector(
        vector(&e, "temp / on(cluster) group_right req_total", 600),
        &[
            ("cluster=a,instance=i1", 10.0 / 600.0),
            ("cluster=a,instance=i2", 10.0 / 1200.0),
            ("cluster=b,instance=i1", 5.0 / 2400.0),
        ],
    );
    // A filtering comparison keeps the left value and the "many" side's labels, name included.
    assert_vector(
        vector(&e, "temp < on(cluster) group_right req_total", 600),
        &[
            ("__name__=req_total,cluster=a,instance=i1", 10.0),
            ("__name__=req_total,cluster=a,instance=i2", 10.0),
            ("__name__=req_total,cluster=b,instance=i1", 5.0),
        ],
    );
    assert_vector(
        vector(
            &e,
            "req_total > ignoring(instance) group_left temp * 100",
            600,
        ),
        &[
            ("__name__=req_total,cluster=a,instance=i2", 1200.0),
            ("__name__=req_total,cluster=b,instance=i1", 2400.0),
        ],
    );
}

#[test]
fn label_replace_and_label_join() {
    let (_d, e) = engine();
    // The regex is anchored: "(a)" matches cluster "a" only.
    assert_vector(
        vector(
            &e,
            r#"label_replace(temp, "c2", "x-$1", "cluster", "(a)")"#,
            600,
        ),
        &[
            ("__name__=temp,c2=x-a,cluster=a", 10.0),
            ("__name__=temp,cluster=b", 5.0),
        ],
    );
    // A named group; an empty replacement removes the label.
    assert_vector(
        vector(
            &e,
            r#"label_replace(temp{cluster="b"}, "cluster", "${c}${c}", "cluster", "(?P<c>.)")"#,
            600,
        ),
        &[("__name__=temp,cluster=bb", 5.0)],
    );
    assert_vector(
        vector(
            &e,
            r#"label_replace(temp{cluster="b"}, "cluster", "", "cluster", "b")"#,
            600,
        ),
        &[("__name__=temp", 5.0)],
    );
    assert_vector(
        vector(
            &e,
            r#"label_join(req_total{cluster="b"}, "id", "/", "cluster", "instance", "missing")"#,
            600,
        ),
        &[("__name__=req_total,cluster=b,id=b/i1/,instance=i1", 2400.0)],
    );
}

#[test]
fn stddev_stdvar_quantile_and_count_values() {
    let (_d, e) = engine();
    // 600, 1200, 2400: mean 1400, squared deviations 640,000 + 40,000 + 1,000,000 = 1,680,000.
    assert_vector(vector(&e, "stdvar(req_total)", 600), &[("", 560_000.0)]);
    assert_vector(
        vector(&e, "stddev(req_total)", 600),
        &[("", 560_000f64.sqrt())],
    );
    assert_vector(
        vector(&e, "stdvar by (cluster) (req_total)", 600),
        &[("cluster=a", 90_000.0), ("cluster=b", 0.0)],
    );
    // Ranks interpolate: φ = 0.25 over 3 values is rank 0.5, halfway between 600 and 1200.
    assert_vector(vector(&e, "quantile(0.5, req_total)", 600), &[("", 1200.0)]);
    assert_vector(vector(&e, "quantile(0.25, req_total)", 600), &[("", 900.0)]);
    assert_vector(
        vector(&e, "quantile by (cluster) (0.9, req_total)", 600),
        &[
            ("cluster=a", 600.0 * 0.1 + 1200.0 * 0.9),
            ("cluster=b", 2400.0),
        ],
    );
    assert_vector(
        vector(&e, "quantile(2, req_total)", 600),
        &[("", f64::INFINITY)],
    );
    assert_vector(
        vector(
            &e,
            r#"count_values by (cluster) ("v", req_total > bool 1000)"#,
            600,
        ),
        &[
            ("cluster=a,v=0", 1.0),
            ("cluster=a,v=1", 1.0),
            ("cluster=b,v=1", 1.0),
        ],
    );
    assert_vector(
        vector(&e, r#"count_values("v", temp / 4)"#, 600),
        &[("v=1.25", 1.0), ("v=2.5", 1.0)],
    );
}

#[test]
fn histogram_quantile_interpolates_within_the_bucket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), Options::default()).expect("open");
    // Histogram "a": 10 ≤ 0.1, 30 ≤ 0.5, 40 ≤ 1, 50 in all. Histogram "b" has no +Inf bucket.
    let mut batch = Vec::new();
    for (le, v) in [("0.1", 10.0), ("0.5", 30.0), ("1", 40.0), ("+Inf", 50.0)] {
        batch.push(sample("lat_bucket", &[("job", "a"), ("le", le)], 60, v));
    }
    for (le, v) in [("0.1", 1.0), ("1", 2.0)] {
        batch.push(sample("lat_bucket", &[("job", "b"), ("le", le)], 60, v));
    }
    store.append("", &batch).expect("append");
    let e = Engine::new(Arc::new(store), Duration::from_secs(300));
    // φ 0.5: rank 25 falls in (0.1, 0.5] holding 20, 15 into it: 0.1 + 0.4 × 15/20.
    assert_vector(
        vector(&e, r#"histogram_quantile(0.5, lat_bucket{job="a"})"#, 60),
        &[("job=a", 0.4)],
    );
    // φ 0.1: rank 5 in the first bucket, interpolated from 0.
    assert_vector(
        vector(&e, r#"histogram_quantile(0.1, lat_bucket{job="a"})"#, 60),
        &[("job=a", 0.05)],
    );
    // φ 0.9: rank 45 falls in the +Inf bucket: the highest finite bound.
    assert_vector(
        vector(&e, r#"histogram_quantile(0.9, lat_bucket{job="a"})"#, 60),
        &[("job=a", 1.0)],
    );
    let b = vector(&e, r#"histogram_quantile(0.5, lat_bucket{job="b"})"#, 60);
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].0, "job=b");
    assert!(b[0].1.is_nan(), "no +Inf bucket gives NaN: {b:?}");
}

#[test]
fn subqueries_evaluate_at_aligned_inner_steps() {
    let (_d, e) = engine();
    // (480, 600] at 30 s: 510 (20), 540 (10), 570 (20), 600 (10).
    for (f, want) in [("max", 20.0), ("min", 10.0), ("avg", 15.0), ("count", 4.0)] {
        assert_vector(
            vector(
                &e,
                &format!(r#"{f}_over_time(temp{{cluster="a"}}[2m:30s])"#),
                600,
            ),
            &[("cluster=a", want)],
        );
    }
    // Inner steps are multiples of the step, not offsets from the query time: (510, 630] holds 540 and 600.
    assert_vector(
        vector(&e, r#"count_over_time(temp{cluster="a"}[2m:1m])"#, 630),
        &[("cluster=a", 2.0)],
    );
    // offset moves the window: (510, 570] → 540 (10), 570 (20).
    assert_vector(
        vector(
            &e,
            r#"last_over_time(temp{cluster="a"}[1m:30s] offset 30s)"#,
            600,
        ),
        &[("__name__=temp,cluster=a", 20.0)],
    );
    // A function inside the subquery.
    assert_vector(
        vector(
            &e,
            r#"max_over_time(rate(req_total{cluster="a"}[1m])[5m:1m])"#,
            600,
        ),
        &[
            ("cluster=a,instance=i1", 1.0),
            ("cluster=a,instance=i2", 2.0),
        ],
    );
    // A whole instant query of a subquery gives its points.
    match e.instant(r#"temp{cluster="b"}[2m:1m]"#, 630_000) {
        Ok(Value::Matrix(m)) => {
            assert_eq!(m.len(), 1);
            assert_eq!(m[0].1, vec![(540_000, 5.0), (600_000, 5.0)]);
        }
        other => panic!("expected a matrix, got {other:?}"),
    }
    // In a range query, every step gets its own window: sum of one 10 and one 20.
    let Ok(Value::Vector(series)) = e.range(
        r#"sum_over_time(temp{cluster="a"}[1m:30s])"#,
        600_000,
        720_000,
        60_000,
    ) else {
        panic!("range query failed")
    };
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].values, vec![Some(30.0), Some(30.0), Some(30.0)]);
}
