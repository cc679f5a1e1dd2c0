//! Dedup on a realistic fleet stream made of real event shapes (`stream.rs`, `shapes.rs`): how many
//! warning events there are, how many distinct problems and records, how many messages an operator is told
//! (announcements of warnings, as `machine.rs` publishes digests only for warnings) and how many digests
//! go out with the in-place updates, whether every problem came through, and how many events per second
//! one correlator handles (in memory; the store writes only the records that changed).
//! `cargo run --release -p multipilot-correlator --example dedup-bench -- [EVENTS]`

#![allow(clippy::print_stdout)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use multipilot_correlator::dedup::Dedup;
use multipilot_eventshapes::stream::ShapeStream;
use multipilot_schemas::payload::Severity;

fn pct(part: u64, of: u64) -> f64 {
    100.0 * (1.0 - part as f64 / of.max(1) as f64)
}

fn main() -> anyhow::Result<()> {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);

    let mut stream = ShapeStream::new(42);
    let events: Vec<_> = (0..n).map(|_| stream.next_event()).collect();
    let mut d = Dedup::new();
    let (mut warnings, mut told, mut digests, mut passes) = (0u64, 0u64, 0u64, 0u64);
    let mut problems = BTreeSet::new();
    let mut passed = BTreeSet::new();
    let mut problem_records: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut record_problems: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    let started = Instant::now();
    for e in &events {
        let (rec, pass) = d.observe(&e.cluster, &e.event);
        let warning = e.event.severity >= Severity::Warning;
        warnings += u64::from(warning);
        if let Some(p) = &e.problem {
            problems.insert(p.as_str());
            problem_records
                .entry(p.as_str())
                .or_default()
                .insert(rec.id.clone());
            record_problems
                .entry(rec.id.clone())
                .or_default()
                .insert(p.as_str());
        }
        if let Some(pass) = pass {
            passes += 1;
            if warning {
                digests += 1;
                told += u64::from(pass.is_announcement());
            }
            if let Some(p) = &e.problem {
                passed.insert(p.as_str());
            }
        }
    }
    let took = started.elapsed();
    let split = problem_records.values().filter(|r| r.len() > 1).count();
    let shared = record_problems.values().filter(|p| p.len() > 1).count();
    let span = events
        .last()
        .zip(events.first())
        .map(|(l, f)| (l.event.last_time - f.event.last_time).num_minutes())
        .unwrap_or(0);
    println!(
        "shapes: events {n} over {span} min, warning events {warnings}, distinct problems {}, records {} ({} holding a problem; problems split {split}, records shared {shared}), operator-facing announcements {told} ({:.2}% fewer than warnings), digests incl. updates {digests} ({:.2}% fewer), all passes incl. normal-lifecycle records {passes} ({:.2} per warning event; normal records are not published), problems missed {}, {:.0} events/s",
        problems.len(),
        d.len(),
        record_problems.len(),
        pct(told, warnings),
        pct(digests, warnings),
        passes as f64 / warnings.max(1) as f64,
        problems.len() - passed.len(),
        n as f64 / took.as_secs_f64()
    );

    Ok(())
}
