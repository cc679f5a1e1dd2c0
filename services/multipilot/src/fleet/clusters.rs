//! `multipilot clusters`: every cluster with its health, version, labels, nodes, CNI, certificate expiry,
//! baseline compliance and open incidents.

use anyhow::{Context as _, Result};
use multipilot_console::api::ClusterOverview;

use super::ConsoleArgs;
use super::output::{ALL, structured, table};
use super::session::{Session, Settings, get};

/// Lists the clusters matching `query` (text or key=value), sorted by `sort`.
#[allow(clippy::print_stdout)]
pub(super) async fn run(
    settings: Settings<'_>,
    args: &ConsoleArgs,
    query: Option<String>,
    sort: String,
) -> Result<()> {
    let session = &Session::new(args, settings, ALL)?;
    let mut q = vec![("sort", sort)];
    if let Some(x) = query {
        q.push(("q", x));
    }
    let v = get(session, "/api/v1/clusters", &q).await?;
    if structured(&v, &session.output)? {
        return Ok(());
    }
    let list: Vec<ClusterOverview> =
        serde_json::from_value(v).context("the console answered something else than clusters")?;
    if session.output == "name" {
        for c in &list {
            println!("{}", c.name);
        }
        return Ok(());
    }
    let dash = || "-".to_string();
    let rows = list
        .iter()
        .map(|c| {
            let label = |k: &str| c.labels.get(k).cloned().unwrap_or_else(dash);
            vec![
                c.name.clone(),
                if c.failing_probes.is_empty() {
                    c.health.as_str().to_string()
                } else {
                    format!("{} ({})", c.health.as_str(), c.failing_probes.len())
                },
                c.version.clone().unwrap_or_else(dash),
                label("env"),
                label("region"),
                label("owner"),
                c.nodes
                    .as_ref()
                    .map_or_else(dash, |n| format!("{}/{}", n.ready, n.total)),
                c.cni.clone().unwrap_or_else(dash),
                c.cert_days_left.map_or_else(dash, |d| format!("{d}d")),
                match c.compliant {
                    Some(true) => "compliant".into(),
                    Some(false) => format!("drift({})", c.failing_rules.len()),
                    None => dash(),
                },
                c.open_incidents.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "HEALTH",
            "VERSION",
            "ENV",
            "REGION",
            "OWNER",
            "NODES",
            "CNI",
            "CERT",
            "BASELINE",
            "INCIDENTS",
        ],
        rows,
    );
    Ok(())
}
