//! The console role: the whole fleet on one page, and the JSON API the page and the CLI use.
//!
//! Reads (ephemeral ordered consumers, see [`ingest`]): `fleet.state.>` + `fleet.resync.>` and
//! `fleet.facts.>` (last per subject), `fleet.hb.>` + `fleet.probe.>` (last per subject),
//! `fleet.incident.>` + `fleet.fleet-incident.>` (all) and `fleet.compliance.>` (last per subject),
//! `fleet.release.>` (all), each through `multipilot_bus::follow`. Never calls
//! a cluster. Asks the correlator over request/reply `fleet.ctl.incident` to acknowledge or resolve an
//! incident (the correlator publishes the new revision and the audit record), and the TSDB role's
//! Prometheus API for the capacity charts and the vital signs. Serves the API and the page on `console.listen` (default
//! `127.0.0.1:9468`).

pub mod api;
pub use multipilot_runtime::auth;
pub mod diff;
pub mod ingest;
pub use multipilot_schemas::selector;
pub mod store;
pub mod telemetry;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use multipilot_runtime::Context;
use serde::{Deserialize, Serialize};

/// The console's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where the API and the page listen.
    pub listen: String,
    /// The TSDB role's Prometheus API (capacity charts).
    pub tsdb_url: String,
    /// The bearer token sent to the TSDB when its auth is on (a viewer's token).
    pub tsdb_token: Option<multipilot_bus::connect::Secret>,
    /// Bearer-token auth.
    pub auth: auth::Config,
    /// Resolved incidents are shown this long after they resolved.
    #[serde(with = "humantime_serde")]
    pub resolved_retention: Duration,
    /// Requests per second per client IP (and burst) before `429 Too Many Requests`.
    pub rate_limit: multipilot_runtime::http::Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9468".into(),
            tsdb_url: "http://127.0.0.1:9466".into(),
            tsdb_token: None,
            auth: auth::Config::default(),
            resolved_retention: Duration::from_secs(7 * 86_400),
            rate_limit: multipilot_runtime::http::Limits::default(),
        }
    }
}

pub use multipilot_runtime::auth::is_loopback;

/// Why the console could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is not usable.
    #[error("console settings: {0}")]
    Config(String),
    /// The tokens could not be loaded.
    #[error("loading console tokens: {0}")]
    Auth(#[from] multipilot_runtime::auth::Error),
    /// The HTTP client for the TSDB could not be built.
    #[error("the TSDB client: {0}")]
    Client(String),
    /// The API could not listen.
    #[error("console listening on {listen}: {source}")]
    Listen {
        /// The address.
        listen: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether starting again later may succeed (the address was taken) rather than needing a changed
    /// setting.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Listen { .. })
    }
}

type Result<T, E = Error> = std::result::Result<T, E>;

impl Config {
    /// Checks what serde can't: auth may be off only on loopback.
    pub fn validate(&self) -> Result<()> {
        if !self.auth.enabled && !is_loopback(&self.listen) {
            return Err(Error::Config(format!(
                "console.auth.enabled is false but console.listen ({}) is not a loopback address: \
                 refusing to serve the fleet without authentication",
                self.listen
            )));
        }
        if !(self.tsdb_url.starts_with("http://") || self.tsdb_url.starts_with("https://")) {
            return Err(Error::Config(
                "console.tsdb_url must be an http(s) URL".into(),
            ));
        }
        Ok(())
    }
}

/// The client for TSDB queries, sending `tsdb_token` as a bearer token.
fn tsdb_client(token: Option<&multipilot_bus::connect::Secret>) -> Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(t) = token {
        let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", t.0))
            .map_err(|_| Error::Config("console.tsdb_token is not a valid header value".into()))?;
        v.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .map_err(|e| Error::Client(e.to_string()))
}

/// Runs the console until `ctx.cancel` fires.
pub async fn run(config: Config, ctx: Context) -> Result<()> {
    config.validate()?;
    let tokens = auth::Tokens::load(&config.auth)?;
    if tokens.enabled() && tokens.is_empty() {
        tracing::warn!(
            "console auth is on but no tokens are configured (console.auth.tokens or tokens_file): every API request will be refused"
        );
    }
    if !tokens.enabled() {
        tracing::warn!(listen = %config.listen, "console auth is off (loopback only)");
    }
    ctx.health.register("console");
    let metrics = {
        let mut reg = ctx.registry.write().unwrap_or_else(|e| e.into_inner());
        telemetry::Metrics::register(&mut reg)
    };
    let (tx, _) = tokio::sync::broadcast::channel(1024);
    let shared = ingest::Shared {
        store: Arc::default(),
        incidents: tx,
        metrics: metrics.clone(),
        synced: Arc::new(RwLock::default()),
    };
    let mut tasks = tokio::task::JoinSet::new();
    for feed in ingest::Feed::ALL {
        tasks.spawn(ingest::follow(
            ctx.js.clone(),
            feed,
            shared.clone(),
            ctx.cancel.clone(),
        ));
    }
    // housekeeping: resolved incidents age out, the object gauge follows the store
    {
        let (shared, cancel, keep) = (
            shared.clone(),
            ctx.cancel.clone(),
            config.resolved_retention,
        );
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let mut st = shared.store.write().unwrap_or_else(|e| e.into_inner());
                let cutoff =
                    chrono::Utc::now() - chrono::Duration::from_std(keep).unwrap_or_default();
                st.expire_incidents(cutoff);
                shared.metrics.objects.set(st.object_count() as i64);
            }
        });
    }
    let app = api::App {
        shared,
        tokens: Arc::new(tokens),
        nats: ctx.nats.clone(),
        js: ctx.js.clone(),
        http: tsdb_client(config.tsdb_token.as_ref())?,
        tsdb_url: config.tsdb_url.clone(),
        cancel: ctx.cancel.clone(),
    };
    let (addr, server) = multipilot_runtime::http::serve_limited(
        &config.listen,
        api::router(app),
        ctx.cancel.clone(),
        config.rate_limit,
    )
    .await
    .map_err(|source| Error::Listen {
        listen: config.listen.clone(),
        source,
    })?;
    ctx.health.set("console", true);
    tracing::info!(%addr, auth = config.auth.enabled, "console serving the API and the page");
    ctx.cancel.cancelled().await;
    while tasks.join_next().await.is_some() {}
    let _ = server.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_may_be_off_only_on_loopback() {
        let mut c = Config::default();
        c.auth.enabled = false;
        assert!(c.validate().is_ok());
        c.listen = "0.0.0.0:9468".into();
        assert!(c.validate().is_err());
        c.listen = "[::1]:9468".into();
        assert!(c.validate().is_ok());
        c.listen = "localhost:9468".into();
        assert!(c.validate().is_ok());
        c.listen = "10.1.2.3:9468".into();
        assert!(c.validate().is_err());
        c.auth.enabled = true;
        assert!(c.validate().is_ok());
    }

    #[test]
    fn config_round_trips_through_yaml() {
        let c = Config::default();
        let back: Config = serde_yaml::from_str(&serde_yaml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        assert!(serde_yaml::from_str::<Config>("listenn: x").is_err());
    }
}
