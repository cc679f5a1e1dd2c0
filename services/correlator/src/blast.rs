//! Blast radius: what a cluster's loss takes down, from its last known state — its workloads and the
//! namespaces they run in, which of them also run on another cluster (same kind, namespace and name) and
//! which run nowhere else, its Services and those exposed on external IPs, the GPUs it held. Pure: read from
//! the machine's per-cluster object index and inventory.

use std::collections::{BTreeMap, BTreeSet};

use multipilot_schemas::payload::BlastRadius;

use crate::state::ClusterState;

const WORKLOADS: [&str; 4] = ["Deployment", "StatefulSet", "DaemonSet", "CronJob"];
const MAX_ONLY_HERE: usize = 50;

fn system(ns: &str) -> bool {
    ns.starts_with("kube-") || ns.is_empty()
}

/// `kind/ns/name` → (kind, ns, name).
fn split(key: &str) -> Option<(&str, &str, &str)> {
    let (kind, rest) = key.split_once('/')?;
    let (ns, name) = rest.split_once('/')?;
    Some((kind, ns, name))
}

/// The blast radius of `cluster`, from `specs` (every cluster's objects, keyed `kind/ns/name`) and its
/// state (inventory, facts, last heartbeat).
pub fn of(
    cluster: &str,
    specs: &BTreeMap<String, BTreeMap<String, String>>,
    state: Option<&ClusterState>,
) -> BlastRadius {
    let empty = BTreeMap::new();
    let mine = specs.get(cluster).unwrap_or(&empty);
    let mut namespaces = BTreeSet::new();
    let (mut workloads, mut elsewhere, mut services) = (0u32, 0u32, 0u32);
    let mut only_here = Vec::new();
    for key in mine.keys() {
        let Some((kind, ns, name)) = split(key) else {
            continue;
        };
        if system(ns) {
            continue;
        }
        if kind == "Service" {
            services += 1;
            continue;
        }
        if !WORKLOADS.contains(&kind) {
            continue;
        }
        workloads += 1;
        namespaces.insert(ns.to_string());
        let other = specs
            .iter()
            .any(|(c, objs)| c != cluster && objs.contains_key(key));
        if other {
            elsewhere += 1;
        } else {
            only_here.push(format!("{kind} {ns}/{name}"));
        }
    }
    let only_here_total = only_here.len() as u32;
    only_here.truncate(MAX_ONLY_HERE);
    let (mut gpus, mut gpus_allocated) = (0, 0);
    let mut exposed = Vec::new();
    let mut as_of = None;
    if let Some(c) = state {
        if let Some(f) = &c.inventory.facts {
            gpus = f.gpus.iter().map(|g| g.capacity).sum();
            gpus_allocated = f.gpus.iter().map(|g| g.allocated).sum();
        }
        exposed = c.inventory.external_ips.keys().cloned().collect();
        as_of = c.hb_last_ingest;
    }
    let mut summary = format!(
        "takes down {workloads} workload{} in {} namespace{}",
        if workloads == 1 { "" } else { "s" },
        namespaces.len(),
        if namespaces.len() == 1 { "" } else { "s" }
    );
    if only_here_total > 0 {
        let names: Vec<&str> = only_here.iter().take(5).map(String::as_str).collect();
        summary.push_str(&format!(
            "; {only_here_total} run nowhere else ({}{})",
            names.join(", "),
            if only_here_total > 5 { ", …" } else { "" }
        ));
    } else if workloads > 0 {
        summary.push_str("; every one also runs on another cluster");
    }
    if services > 0 {
        summary.push_str(&format!(
            "; {services} service{}",
            if services == 1 { "" } else { "s" }
        ));
        if !exposed.is_empty() {
            summary.push_str(&format!(", {} on external IPs", exposed.len()));
        }
    }
    if gpus > 0 {
        summary.push_str(&format!(
            "; {gpus} GPUs leave the pool ({gpus_allocated} allocated)"
        ));
    }
    BlastRadius {
        cluster: cluster.to_string(),
        as_of,
        namespaces: namespaces.into_iter().collect(),
        workloads,
        elsewhere,
        only_here,
        only_here_total,
        services,
        exposed,
        gpus,
        gpus_allocated,
        summary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objs(keys: &[&str]) -> BTreeMap<String, String> {
        keys.iter().map(|k| (k.to_string(), "h".into())).collect()
    }

    #[test]
    fn what_runs_nowhere_else_is_named_and_system_namespaces_left_out() {
        let specs = BTreeMap::from([
            (
                "a".to_string(),
                objs(&[
                    "Deployment/shop/checkout",
                    "Deployment/shop/web",
                    "StatefulSet/ledger/db",
                    "DaemonSet/kube-system/kube-proxy",
                    "Service/shop/web",
                    "ConfigMap/shop/app",
                ]),
            ),
            (
                "b".to_string(),
                objs(&["Deployment/shop/web", "DaemonSet/kube-system/kube-proxy"]),
            ),
        ]);
        let br = of("a", &specs, None);
        assert_eq!((br.workloads, br.elsewhere, br.services), (3, 1, 1));
        assert_eq!(
            br.only_here,
            vec!["Deployment shop/checkout", "StatefulSet ledger/db"]
        );
        assert_eq!(br.namespaces, vec!["ledger", "shop"]);
        assert_eq!(
            br.summary,
            "takes down 3 workloads in 2 namespaces; 2 run nowhere else (Deployment shop/checkout, StatefulSet ledger/db); 1 service"
        );
        // a cluster nothing is known of: an honest zero
        assert_eq!(of("c", &specs, None).workloads, 0);
    }
}
