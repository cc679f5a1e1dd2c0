//! The short variant of every scenario, as `./scripts/test` runs it: the real binaries (hub roles, agent,
//! simulator, nats-server) started by `multipilot-loadtest`, whose exit status says whether every invariant
//! held (nothing lost, bounds held, no duplicates). Timings are in the report, never asserted here.
//!
//! The system's binaries must be built next to this one (`cargo build --bins`; `cargo test --workspace`
//! builds them).

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

/// One scenario at a time: each starts a whole system, and the machine has few cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn run(scenario: &str) {
    run_with(scenario, &[]);
}

fn run_with(scenario: &str, args: &[&str]) {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let exe = Path::new(env!("CARGO_BIN_EXE_multipilot-loadtest"));
    let bins = exe.parent().expect("the binary's directory");
    for b in ["multipilot", "multipilot-agent", "multipilot-sim"] {
        assert!(
            bins.join(b).is_file(),
            "{} is missing: build the system first (`cargo build --bins`)",
            bins.join(b).display()
        );
    }
    let out = tempfile::tempdir().expect("a temporary directory");
    let output = Command::new(exe)
        .arg(scenario)
        .arg("--short")
        .args(args)
        .arg("--out")
        .arg(out.path())
        .env("RUST_LOG", "warn")
        .output()
        .expect("running multipilot-loadtest");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{scenario} --short: {}\n{stdout}\n{stderr}",
        output.status
    );
    let report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.path().join("report.json")).expect("report.json written"),
    )
    .expect("report.json is JSON");
    assert_eq!(report["passed"], true, "{stdout}");
    let checks = report["report"]["checks"].as_array().expect("checks");
    assert!(
        checks.iter().any(|c| c["kind"] == "invariant"),
        "the report checks invariants"
    );
    let md = std::fs::read_to_string(out.path().join("report.md")).expect("report.md written");
    assert!(md.contains("## Checks"), "{md}");
    let plots: Vec<_> = std::fs::read_dir(out.path().join("plots"))
        .expect("plots written")
        .flatten()
        .collect();
    assert!(!plots.is_empty(), "plots written");
    for p in plots {
        let svg = std::fs::read_to_string(p.path()).expect("an SVG");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
}

#[test]
fn steady_short() {
    // with the reconnect storm in the middle (5 s without NATS), as the 50-cluster variant runs it
    run_with("steady", &["--storm", "5"]);
}

#[test]
fn storm_short() {
    run("storm");
}

#[test]
fn faults_short() {
    run("faults");
}

#[test]
fn crash_drill_short() {
    run("crash");
}

#[test]
fn scaleout_short() {
    run("scaleout");
}

#[test]
fn delivery_short() {
    run("delivery");
}
