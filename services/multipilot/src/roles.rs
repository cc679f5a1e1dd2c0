//! Running roles: connect, provision, serve health and metrics, run each role until shutdown.
//!
//! The roles' own logic lives in their library crates (`multipilot-correlator`, …); a role that has no crate
//! yet only provisions and checks the durable consumers it will read, reports ready, and says in its log that
//! it has no logic yet.

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

    /// The durable consumers (stream, durable) the role reads.
    fn consumers(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Role::Correlator => &[
                ("FLEET_EVENTS", "correlator-events"),
                ("FLEET_HEALTH", "correlator-health"),
                ("FLEET_STATE", "correlator-state"),
                ("FLEET_FACTS", "correlator-facts"),
            ],
            Role::Tsdb => &[("FLEET_METRICS", "tsdb")],
            Role::Alerts => &[("FLEET_INCIDENTS", "alerts")],
            Role::Release => &[],
            Role::Console => &[("FLEET_RELEASE", "console-release")],
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

    let mut tasks = Vec::new();
    for role in roles {
        let ctx = ctx.clone();
        let config = config.clone();
        tasks.push(tokio::spawn(async move {
            match role {
                Role::Correlator => {
                    let r = multipilot_correlator::run(config.correlator(), ctx.clone()).await;
                    if r.is_err() {
                        ctx.health.set(role.name(), false);
                    }
                    r
                }
                Role::Tsdb => {
                    let r = multipilot_tsdb::run(config.tsdb(), ctx.clone()).await;
                    if r.is_err() {
                        ctx.health.set(role.name(), false);
                    }
                    r
                }
                _ => run_role(role, ctx).await,
            }
        }));
    }
    multipilot_runtime::shutdown_signal().await;
    tracing::info!("shutting down");
    cancel.cancel();
    for t in tasks {
        match t.await {
            Ok(Err(e)) => tracing::error!(error = %e, "role failed"),
            Err(e) => tracing::error!(error = %e, "role panicked"),
            Ok(Ok(())) => {}
        }
    }
    let _ = server.await;
    Ok(())
}

async fn run_role(role: Role, ctx: Context) -> Result<()> {
    for (stream, durable) in role.consumers() {
        let s = ctx
            .js
            .get_stream(*stream)
            .await
            .with_context(|| format!("stream {stream}"))?;
        s.get_consumer::<async_nats::jetstream::consumer::pull::Config>(durable)
            .await
            .map_err(|e| anyhow::anyhow!("consumer {stream}/{durable}: {e}"))?;
    }
    ctx.health.set(role.name(), true);
    tracing::warn!(
        role = role.name(),
        "role has no processing logic in this build yet; it only holds its consumers"
    );
    ctx.cancel.cancelled().await;
    Ok(())
}
