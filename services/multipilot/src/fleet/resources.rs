//! `multipilot get` (objects of a kind across the fleet, like `kubectl get`) and `multipilot
//! api-resources` (the kinds it takes).

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use multipilot_console::api::{ClusterOverview, ResourcePage};

use super::ConsoleArgs;
use super::output::{ALL, structured, table};
use super::session::{Session, Settings, get};
use crate::kinds;

/// Which objects `get` shows.
#[derive(Debug, Clone, clap::Args)]
pub struct Filter {
    /// Name contains.
    pub(super) name: Option<String>,
    /// Label selector (app=web,tier!=db,env in (prod)).
    #[arg(short = 'l', long)]
    pub(super) selector: Option<String>,
    /// Clusters, comma-separated (default: all).
    #[arg(long)]
    pub(super) cluster: Option<String>,
    /// Namespace (ignored for cluster-scoped kinds).
    #[arg(short = 'n', long)]
    pub(super) namespace: Option<String>,
    /// Every namespace: what no --namespace means already; wins over --namespace, as in kubectl.
    #[arg(short = 'A', long)]
    pub(super) all_namespaces: bool,
    /// At most this many objects.
    #[arg(long, default_value_t = 500)]
    pub(super) limit: usize,
}

/// Lists the objects of the kind `given` (as kubectl takes it) that `filter` selects.
#[allow(clippy::print_stdout)]
pub(super) async fn get_objects(
    settings: Settings<'_>,
    args: &ConsoleArgs,
    given: &str,
    filter: Filter,
) -> Result<()> {
    let Filter {
        name,
        selector,
        cluster,
        namespace,
        all_namespaces,
        limit,
    } = filter;
    let kind = super::kind(given)?;
    let session = &Session::new(args, settings, ALL)?;
    // kubectl: -A wins over -n; a cluster-scoped kind has no namespace
    let namespace = namespace.filter(|_| !all_namespaces && kind.namespaced);
    let mut q = vec![
        ("kind", kind.kind.to_string()),
        ("limit", limit.to_string()),
    ];
    for (k, v) in [
        ("name", name),
        ("selector", selector),
        ("cluster", cluster),
        ("namespace", namespace.clone()),
    ] {
        if let Some(v) = v {
            q.push((k, v));
        }
    }
    let v = get(session, "/api/v1/resources", &q).await?;
    if structured(&v, &session.output)? {
        return Ok(());
    }
    let page: ResourcePage =
        serde_json::from_value(v).context("the console answered something else than resources")?;
    if page.total == 0 {
        match &namespace {
            Some(ns) => eprintln!("No resources found in {ns} namespace."),
            None => eprintln!("No resources found"),
        }
        return Ok(());
    }
    if page.total > page.items.len() {
        eprintln!(
            "({} of {} shown; --limit to see more)",
            page.items.len(),
            page.total
        );
    }
    if session.output == "name" {
        for o in &page.items {
            println!("{}/{}", kind.qualified(), o.name);
        }
        return Ok(());
    }
    let wide = session.output == "wide";
    // the clusters' env and region, for -o wide
    let cluster_labels: BTreeMap<String, BTreeMap<String, String>> = if wide {
        let v = get(session, "/api/v1/clusters", &[]).await?;
        serde_json::from_value::<Vec<ClusterOverview>>(v)
            .context("the console answered something else than clusters")?
            .into_iter()
            .map(|c| (c.name, c.labels))
            .collect()
    } else {
        BTreeMap::new()
    };
    let with_ns = namespace.is_none() && kind.namespaced;
    let mut header = vec!["CLUSTER"];
    if with_ns {
        header.push("NAMESPACE");
    }
    header.extend(["NAME", "READY", "SPEC"]);
    if wide {
        header.extend(["API-VERSION", "ENV", "REGION", "LABELS"]);
    }
    let dash = || "-".to_string();
    let rows = page
        .items
        .iter()
        .map(|o| {
            let ready = match (&o.replicas, o.ready) {
                (Some(r), _) => r.clone(),
                (None, Some(true)) => "ready".into(),
                (None, Some(false)) => "not ready".into(),
                (None, None) => o.phase.clone().unwrap_or_else(dash),
            };
            let mut row = vec![o.cluster.clone()];
            if with_ns {
                row.push(o.namespace.clone().unwrap_or_else(dash));
            }
            row.extend([o.name.clone(), ready]);
            if wide {
                let label = |k: &str| {
                    cluster_labels
                        .get(&o.cluster)
                        .and_then(|l| l.get(k))
                        .cloned()
                        .unwrap_or_else(dash)
                };
                let labels = o
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",");
                row.extend([
                    o.spec_hash.clone(),
                    o.api_version.clone(),
                    label("env"),
                    label("region"),
                    if labels.is_empty() { dash() } else { labels },
                ]);
            } else {
                row.push(o.spec_hash.chars().take(12).collect());
            }
            row
        })
        .collect();
    table(&header, rows);
    Ok(())
}

/// Lists the kinds `get`, `diff` and `compare` take, with their short names and whether the agent
/// collects them.
pub(super) fn api_resources() {
    let rows = kinds::KINDS
        .iter()
        .map(|k| {
            vec![
                k.plural.to_string(),
                k.short.join(","),
                if k.group.is_empty() {
                    "v1".into()
                } else {
                    k.group.to_string()
                },
                k.namespaced.to_string(),
                k.kind.to_string(),
                if k.collected { "yes" } else { "no" }.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "SHORTNAMES",
            "APIGROUP",
            "NAMESPACED",
            "KIND",
            "COLLECTED",
        ],
        rows,
    );
}
