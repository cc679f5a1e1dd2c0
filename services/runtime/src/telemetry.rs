//! Logging setup (tracing). `RUST_LOG` overrides the configured level.

use serde::{Deserialize, Serialize};

/// Log settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Level or filter directive, e.g. `info` or `info,multipilot_bus=debug`.
    pub level: String,
    /// `text` for people, `json` for log pipelines.
    pub format: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            level: "info".into(),
            format: "text".into(),
        }
    }
}

/// Installs the global subscriber (once; later calls are ignored). Logs go to stderr, so stdout stays
/// clean for command output.
pub fn init(config: &Config) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if config.format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
