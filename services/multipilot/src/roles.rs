//! Running roles: connect, provision, serve health and metrics, run each role until shutdown.
//!
//! The roles' own logic lives in their library crates (`multipilot-correlator`, `multipilot-tsdb`,
//! `multipilot-alerts`, `multipilot-release`, `multipilot-console`); each provisions what it reads and reports
//! ready itself.

use anyhow::{Context as _, Result};
use multipilot_runtime::Context;
use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// A hub role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Dedup, incidents, baseline.
    Correlator,
    /// Metrics store and query API.
    Tsdb,
    /// Alert routing.
    Alerts,
    /// Release orchestration.
    Release,
    /// HTTP API and web UI.
    Console,
}

impl Role {
    /// Every role, in start order.
    pub const ALL: [Role; 5] = [
        Role::Tsdb,
        Role::Correlator,
        Role::Alerts,
        Role::Release,
        Role::Console,
    ];

    /// The role's name.
    pub fn name(self) -> &'static str {
        match self {
            Role::Correlator => "correlator",
            Role::Tsdb => "tsdb",
            Role::Alerts => "alerts",
            Role::Release => "release",
            Role::Console => "console",
        }
    }
}

/// Runs the given roles in this process until SIGINT/SIGTERM.
pub async fn run(config: Config, roles: Vec<Role>) -> Result<()> {
    let names: Vec<&str> = roles.iter().map(|r| r.name()).collect();
    let instance = format!("{}-{}", names.join("+"), std::process::id());
    let mut nats_cfg = config.nats.clone();
    nats_cfg
        .name
        .get_or_insert_with(|| format!("multipilot {}", names.join(",")));
    let client = multipilot_bus::connect::connect(&nats_cfg)
        .await
        .context("connecting to NATS")?;
    let cancel = CancellationToken::new();
    let ctx = Context::new(client, instance, cancel.clone());

    ctx.health.register("streams");
    for r in &roles {
        ctx.health.register(r.name());
    }
    let router = multipilot_runtime::http::router(ctx.health.clone(), ctx.registry.clone());
    let (addr, server) =
        multipilot_runtime::http::serve(&config.http.listen, router, cancel.clone())
            .await
            .with_context(|| format!("listening on {}", config.http.listen))?;
    tracing::info!(%addr, roles = ?names, "hub serving /healthz /readyz /metrics");

    if config.provision.enabled {
        config
            .topology()
            .provision(&ctx.js)
            .await
            .context("provisioning streams")?;
    }
    ctx.health.set("streams", true);

    let mut tasks = tokio::task::JoinSet::new();
    for role in roles {
        let ctx = ctx.clone();
        let config = config.clone();
        tasks.spawn(async move {
            let r = match role {
                Role::Correlator => multipilot_correlator::run(config.correlator(), ctx)
                    .await
                    .map_err(anyhow::Error::from),
                Role::Tsdb => multipilot_tsdb::run(config.tsdb(), ctx)
                    .await
                    .map_err(anyhow::Error::from),
                Role::Alerts => multipilot_alerts::run(config.alerts(), ctx)
                    .await
                    .map_err(anyhow::Error::from),
                Role::Release => multipilot_release::run(config.release(), ctx)
                    .await
                    .map_err(anyhow::Error::from),
                Role::Console => multipilot_console::run(config.console(), ctx)
                    .await
                    .map_err(anyhow::Error::from),
            };
            (role, r)
        });
    }
    // A role that fails stops the process at once, saying why, so that whatever supervises it (the kubelet,
    // systemd, compose) restarts it with backoff: a role can't be left dead behind a live process.
    let mut failed = None;
    tokio::select! {
        _ = multipilot_runtime::shutdown_signal() => tracing::info!("shutting down"),
        Some(done) = tasks.join_next() => {
            let (role, why) = match done {
                Ok((role, Err(e))) => (role.name(), format!("{e:#}")),
                Ok((role, Ok(()))) => (role.name(), "stopped by itself".to_string()),
                Err(e) => ("a role", format!("panicked: {e}")),
            };
            tracing::error!(role, error = %why, "role failed; stopping the process");
            failed = Some(anyhow::anyhow!("{role} failed: {why}"));
        }
    }
    cancel.cancel();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok((role, Err(e))) => tracing::error!(role = role.name(), error = %e, "role failed"),
            Err(e) => tracing::error!(error = %e, "role panicked"),
            Ok((_, Ok(()))) => {}
        }
    }
    let _ = server.await;
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
