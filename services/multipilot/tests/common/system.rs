//! The whole system as `./scripts/up` starts it (nats, the hub with every role, the fleet simulator, the
//! agent) on scratch ports and data, stopped with `./scripts/down` on drop.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result};
use serde_json::Value;

use super::root;

/// The system `./scripts/up` started, stopped with `./scripts/down` on drop.
pub struct System {
    /// Settings `./scripts/up` was started with (ports, data, binaries).
    pub env: Vec<(String, String)>,
    /// The data directory.
    pub data: tempfile::TempDir,
    /// What `./scripts/up` printed.
    pub out: String,
}

impl System {
    /// Starts the system (see [`System::up_with`]).
    pub fn up() -> Result<System> {
        System::up_with(&[])
    }

    /// Starts the system with every port free and the data in a temporary directory; `extra` settings
    /// (e.g. `MULTIPILOT_FLEET_REPO`) are passed to `./scripts/up` too.
    pub fn up_with(extra: &[(&str, &str)]) -> Result<System> {
        let bin_dir = Path::new(env!("CARGO_BIN_EXE_multipilot"))
            .parent()
            .context("binary directory")?
            .to_path_buf();
        for b in ["multipilot-sim", "multipilot-agent"] {
            anyhow::ensure!(
                bin_dir.join(b).is_file(),
                "{b} is not built in {}: run `cargo build --bins` first (./scripts/test does)",
                bin_dir.display()
            );
        }
        let data = tempfile::Builder::new().prefix("mp-e2e-").tempdir()?;
        let mut env = vec![
            (
                "MULTIPILOT_DATA".to_string(),
                data.path().display().to_string(),
            ),
            (
                "MULTIPILOT_BIN_DIR".to_string(),
                bin_dir.display().to_string(),
            ),
            ("MULTIPILOT_PROFILE".to_string(), "debug".to_string()),
        ];
        for var in [
            "MULTIPILOT_NATS_PORT",
            "MULTIPILOT_NATS_MONITOR_PORT",
            "MULTIPILOT_HUB_PORT",
            "MULTIPILOT_SIM_CONTROL_PORT",
            "MULTIPILOT_AGENT_PORT",
            "MULTIPILOT_TSDB_PORT",
            "MULTIPILOT_CONSOLE_PORT",
            "MULTIPILOT_ALERTS_PORT",
        ] {
            env.push((var.into(), multipilot_testkit::free_port()?.to_string()));
        }
        for (k, v) in extra {
            env.push((k.to_string(), v.to_string()));
        }
        let mut sys = System {
            env,
            data,
            out: String::new(),
        };
        let out = sys.script("up")?;
        sys.out = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        anyhow::ensure!(
            out.status.success() && sys.out.contains("MultiPilot is up"),
            "scripts/up failed:\n{}\n{}",
            sys.out,
            sys.logs()
        );
        Ok(sys)
    }

    pub fn script(&self, name: &str) -> Result<std::process::Output> {
        let mut c = Command::new(root().join("scripts").join(name));
        c.current_dir(root()).stdin(Stdio::null());
        for (k, v) in &self.env {
            c.env(k, v);
        }
        Ok(c.output()?)
    }

    pub fn var(&self, k: &str) -> &str {
        self.env
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_default()
    }

    pub fn logs(&self) -> String {
        let mut s = String::new();
        for f in ["hub", "agent", "sim"] {
            let text = std::fs::read_to_string(self.data.path().join(format!("logs/{f}.log")))
                .unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            s.push_str(&format!("--- {f}.log ---\n"));
            for l in tail.into_iter().rev() {
                s.push_str(&l.chars().take(300).collect::<String>());
                s.push('\n');
            }
        }
        s
    }

    /// Switches the simulator's `fault` on `cluster` on or off (its control API).
    pub async fn fault(&self, cluster: &str, fault: &str, on: bool) -> Result<()> {
        let resp = reqwest::Client::new()
            .post(format!(
                "http://127.0.0.1:{}/clusters/{cluster}/faults/{fault}",
                self.var("MULTIPILOT_SIM_CONTROL_PORT")
            ))
            .json(&serde_json::json!({"on": on, "params": {}}))
            .send()
            .await?;
        anyhow::ensure!(resp.status().is_success(), "fault: {}", resp.text().await?);
        Ok(())
    }

    pub fn token(&self, role: &str) -> Result<String> {
        // the demo's copy of its tokens (tokens.yaml, which the hub reads, keeps only their digests)
        let text = std::fs::read_to_string(self.data.path().join("console/demo-tokens.yaml"))?;
        let list: Vec<Value> = serde_yaml::from_str(&text)?;
        list.iter()
            .find(|t| t["role"] == role)
            .and_then(|t| t["token"].as_str())
            .map(str::to_string)
            .with_context(|| format!("no {role} token in demo-tokens.yaml"))
    }

    pub fn kubectl_apply(&self, context: &str, manifest: &str) -> Result<()> {
        use std::io::Write as _;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.data.path().join("sim/kubeconfig.yaml"))
            .args(["--context", context, "apply", "--server-side", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running kubectl (./scripts/test installs it)")?;
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(manifest.as_bytes())?;
        let out = child.wait_with_output()?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl apply on {context}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

impl Drop for System {
    fn drop(&mut self) {
        let _ = self.script("down");
    }
}
