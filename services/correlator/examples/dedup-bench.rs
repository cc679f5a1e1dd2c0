//! Dedup on the realistic noisy stream (`noise.rs`): how many events are passed on, whether every distinct
//! problem came through, and how many events per second one correlator handles (in memory; the store writes only the records that changed).
//! `cargo run --release -p multipilot-correlator --example dedup-bench -- [EVENTS]`

#![allow(clippy::print_stdout)]

use std::collections::BTreeSet;
use std::time::Instant;

use multipilot_correlator::dedup::Dedup;
use multipilot_correlator::noise::Noise;

fn main() -> anyhow::Result<()> {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let mut d = Dedup::new();
    let mut noise = Noise::new(42);
    let events: Vec<_> = (0..n).map(|_| noise.next_event()).collect();
    let (mut passed, mut problems, mut seen) = (0u64, BTreeSet::new(), BTreeSet::new());
    let started = Instant::now();
    for (cluster, e, problem) in &events {
        let (_, pass) = d.observe(cluster, e);
        if let Some(p) = problem {
            problems.insert(p.clone());
        }
        if pass.is_some() {
            passed += 1;
            if let Some(p) = problem {
                seen.insert(p.clone());
            }
        }
    }
    let took = started.elapsed();
    println!(
        "events {n}, passed on {passed} ({:.2}% reduction), distinct problems {} of which passed {} (missed {}), {:.0} events/s",
        100.0 * (1.0 - passed as f64 / n as f64),
        problems.len(),
        seen.len(),
        problems.len() - seen.len(),
        n as f64 / took.as_secs_f64()
    );
    Ok(())
}
