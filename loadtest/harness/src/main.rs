//! `multipilot-loadtest <scenario>`: one command per load test or drill.

#![allow(clippy::print_stdout)] // a CLI: stdout is its output

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use multipilot_loadtest::scenario::{self, Opts};

/// Load tests and drills of the whole MultiPilot system on this machine.
#[derive(Debug, Parser)]
#[command(name = "multipilot-loadtest", version, about)]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// 30 clusters × 1,000 objects, 50 events/s each, metrics every 15 s: throughput, lags, CPU, memory.
    Steady(Opts),
    /// NATS away for 10 minutes while the fleet churns, then back: nothing lost, limits held, drain time.
    Storm(Opts),
    /// Every simulator fault, alone and in pairs: time to the right incident, its first evidence, time to
    /// resolution, false incidents in a quiet run with churn and watch breaks.
    Faults(Opts),
    /// kill -9 each consumer role in turn mid-stream: no lost or duplicated incidents, notifications, samples.
    Crash(Opts),
    /// Two correlators and two TSDBs on a 3-node JetStream cluster: shared load, a lost node, wiped stores.
    Scaleout(Opts),
    /// Publishing and draining rates of the agent's publisher, the correlator and the TSDB, each against a
    /// bare async-nats reference on the same server (ratios, as the machines are noisy).
    Throughput(Opts),
    /// Progressive delivery on 6 clusters: a bad version fails its first batch's error-ratio analysis and
    /// is rolled back, a good one passes every batch, a deny window holds a release until it closes.
    Delivery(Opts),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> Result<bool> {
    let (name, o) = match &cli.scenario {
        Scenario::Steady(o) => ("steady", o),
        Scenario::Storm(o) => ("storm", o),
        Scenario::Faults(o) => ("faults", o),
        Scenario::Crash(o) => ("crash", o),
        Scenario::Scaleout(o) => ("scaleout", o),
        Scenario::Throughput(o) => ("throughput", o),
        Scenario::Delivery(o) => ("delivery", o),
    };
    let out = o.out.clone().unwrap_or_else(|| {
        PathBuf::from("target/loadtest")
            .join(format!("{name}{}", if o.short { "-short" } else { "" }))
    });
    let work = tempfile::Builder::new()
        .prefix(&format!("multipilot-loadtest-{name}-"))
        .tempdir()
        .context("creating the run's directory")?;
    let started = std::time::Instant::now();
    let run = async {
        match &cli.scenario {
            Scenario::Steady(o) => scenario::steady::run(o, work.path()).await,
            Scenario::Storm(o) => scenario::storm::run(o, work.path()).await,
            Scenario::Faults(o) => scenario::faults::run(o, work.path()).await,
            Scenario::Crash(o) => scenario::crash::run(o, work.path()).await,
            Scenario::Throughput(o) => scenario::throughput::run(o, work.path()).await,
            Scenario::Scaleout(o) => scenario::scaleout::run(o, work.path()).await,
            Scenario::Delivery(o) => scenario::delivery::run(o, work.path()).await,
        }
    };
    // Ctrl-C or SIGTERM drops the run, and with it every process it started
    let result = tokio::select! {
        r = run => r,
        _ = interrupted() => Err(anyhow::anyhow!("interrupted; every process of the run was stopped")),
    };
    let keep = o.keep;
    let (mut report, rec) = match result {
        Ok(x) => x,
        Err(e) => {
            let dir = work.keep();
            eprintln!(
                "the run failed; its data and logs are kept in {}",
                dir.display()
            );
            print_log_tails(&dir);
            return Err(e);
        }
    };
    report.duration_s = started.elapsed().as_secs_f64();
    let md = report.write(&out, &rec)?;
    println!("{}", report.markdown());
    println!("report: {}", md.display());
    let passed = report.passed();
    if keep || !passed {
        let dir = work.keep();
        println!("run data and logs: {}", dir.display());
        if !passed {
            print_log_tails(&dir);
        }
    }
    Ok(passed)
}

async fn interrupted() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn print_log_tails(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir.join("logs")) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        eprintln!(
            "--- {} (last lines)\n{}",
            p.display(),
            multipilot_loadtest::proc::tail(&p, 15)
        );
    }
}
