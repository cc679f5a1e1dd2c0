//! `multipilot gpu`: the fleet's GPU pool per cluster (allocatable, allocated, free `nvidia.com/gpu`,
//! models, drivers, device plugin).

use anyhow::Result;

use super::ConsoleArgs;
use super::output::{NO_NAME, s, structured, table};
use super::session::{Session, Settings, get};

/// Lists the clusters' GPUs, most free first (as the console orders them).
pub(super) async fn run(settings: Settings<'_>, args: &ConsoleArgs) -> Result<()> {
    let session = &Session::new(args, settings, NO_NAME)?;
    let v = get(session, "/api/v1/gpu", &[]).await?;
    if structured(&v, &session.output)? {
        return Ok(());
    }
    let rows = v
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|g| {
            let models: Vec<String> = g["models"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|m| format!("{}×{}", s(&m["model"]), m["allocatable"]))
                .collect();
            let drivers: std::collections::BTreeSet<String> = g["models"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .flat_map(|m| m["driver_versions"].as_array().cloned().unwrap_or_default())
                .map(|d| s(&d))
                .collect();
            vec![
                s(&g["cluster"]),
                s(&g["free"]),
                s(&g["allocated"]),
                s(&g["allocatable"]),
                models.join(","),
                drivers.into_iter().collect::<Vec<_>>().join(","),
                format!(
                    "{} {}",
                    s(&g["device_plugin"]["name"]),
                    s(&g["device_plugin"]["version"])
                ),
                s(&g["plugin_health"]),
            ]
        })
        .collect();
    table(
        &[
            "CLUSTER",
            "FREE",
            "ALLOCATED",
            "ALLOCATABLE",
            "MODELS",
            "DRIVERS",
            "PLUGIN",
            "PLUGIN HEALTH",
        ],
        rows,
    );
    Ok(())
}
