//! What the TSDB's test files share.

use std::process::Command;

use anyhow::{Result, bail};

/// The real `promtool` (`PROMTOOL_BIN`, else the one on PATH), or an error saying how to install it.
#[allow(dead_code)] // not every test binary uses it
pub fn promtool() -> Result<String> {
    let path = std::env::var("PROMTOOL_BIN").unwrap_or_else(|_| "promtool".into());
    match Command::new(&path).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(path),
        _ => bail!(
            "promtool not found: install Debian's `prometheus` package (`apt-get install -y prometheus`, which \
             ./scripts/test does) or point PROMTOOL_BIN at a promtool binary"
        ),
    }
}

/// One sample of `name` with `labels` at `t` (ms).
#[allow(dead_code)] // not every test binary uses it
pub fn sample(
    name: &str,
    labels: &[(&str, &str)],
    value: f64,
    t: i64,
) -> multipilot_schemas::payload::Sample {
    multipilot_schemas::payload::Sample::new(name, labels, value, t)
}
