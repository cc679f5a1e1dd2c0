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
/// state (inventory, facts, last heartbeat). A workload counts as running elsewhere only on a cluster not in
/// `down` (the clusters lost already: a workload whose other copies are on a cluster that is down too is
/// lost with this one).
pub fn of(
    cluster: &str,
    specs: &BTreeMap<String, BTreeMap<String, String>>,
    state: Option<&ClusterState>,
    down: &BTreeSet<&str>,
) -> BlastRadius {
    let states: BTreeMap<&str, &ClusterState> = state.map(|s| (cluster, s)).into_iter().collect();
    of_all(&[cluster], specs, &states, down)
}

/// Whether two blast radii lose the same: the same workloads, Services, external IPs and GPUs, whenever
/// their states were heard and however they are worded.
pub fn same_loss(a: &BlastRadius, b: &BlastRadius) -> bool {
    let loss = |r: &BlastRadius| {
        (
            r.cluster.clone(),
            r.workloads,
            r.elsewhere,
            r.only_here.clone(),
            r.only_here_total,
            r.services,
            r.exposed.clone(),
            r.gpus,
            r.gpus_allocated,
        )
    };
    loss(a) == loss(b)
}

/// The blast radius of several clusters lost together (the members of one fleet incident): their
/// workloads and Services counted once by kind, namespace and name, what runs on none of the clusters still
/// up (neither in `lost` nor in `down`), their GPUs summed. `states`: what is known of each.
pub fn of_all(
    lost: &[&str],
    specs: &BTreeMap<String, BTreeMap<String, String>>,
    states: &BTreeMap<&str, &ClusterState>,
    down: &BTreeSet<&str>,
) -> BlastRadius {
    let mut namespaces = BTreeSet::new();
    let (mut workloads, mut services) = (BTreeSet::new(), BTreeSet::new());
    for objs in lost.iter().filter_map(|c| specs.get(*c)) {
        for key in objs.keys() {
            let Some((kind, ns, _)) = split(key) else {
                continue;
            };
            if system(ns) {
                continue;
            }
            if kind == "Service" {
                services.insert(key.as_str());
            } else if WORKLOADS.contains(&kind) {
                workloads.insert(key.as_str());
                namespaces.insert(ns.to_string());
            }
        }
    }
    let up = |c: &str| !lost.contains(&c) && !down.contains(c);
    let mut elsewhere = 0u32;
    let mut only_here = Vec::new();
    for key in &workloads {
        if specs
            .iter()
            .any(|(c, objs)| up(c) && objs.contains_key(*key))
        {
            elsewhere += 1;
        } else if let Some((kind, ns, name)) = split(key) {
            only_here.push(format!("{kind} {ns}/{name}"));
        }
    }
    let only_here_total = only_here.len() as u32;
    only_here.truncate(MAX_ONLY_HERE);
    let (mut gpus, mut gpus_allocated) = (0, 0);
    let mut exposed = BTreeSet::new();
    let mut as_of = None;
    for c in lost.iter().filter_map(|c| states.get(c)) {
        if let Some(f) = &c.inventory.facts {
            // (summed without overflow, whatever an agent reported)
            for g in &f.gpus {
                gpus = u32::saturating_add(gpus, g.capacity);
                gpus_allocated = u32::saturating_add(gpus_allocated, g.allocated);
            }
        }
        exposed.extend(c.inventory.external_ips.keys().cloned());
        // the oldest of the states judged on
        as_of = match (as_of, c.hb_last_ingest) {
            (Some(a), Some(b)) => Some(b.min(a)),
            (a, b) => a.or(b),
        };
    }
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let (w, n) = (workloads.len(), namespaces.len());
    let mut summary = format!(
        "takes down {w} workload{} in {n} namespace{}",
        plural(w),
        plural(n)
    );
    // other clusters down make "nowhere else" a stronger claim than it is: say which is meant
    let others_down = lost.len() > 1 || down.iter().any(|d| !lost.contains(d));
    let verb = if only_here_total == 1 { "runs" } else { "run" };
    if only_here_total > 0 {
        let names: Vec<&str> = only_here.iter().take(5).map(String::as_str).collect();
        let nowhere = if others_down {
            "on no cluster still up"
        } else {
            "nowhere else"
        };
        summary.push_str(&format!(
            "; {only_here_total} {verb} {nowhere} ({}{})",
            names.join(", "),
            if only_here_total > 5 { ", …" } else { "" }
        ));
    } else if w > 0 {
        summary.push_str(if others_down {
            "; every one also runs on a cluster still up"
        } else {
            "; every one also runs on another cluster"
        });
    }
    if !services.is_empty() {
        summary.push_str(&format!(
            "; {} service{}",
            services.len(),
            plural(services.len())
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
        cluster: lost.join(", "),
        as_of,
        namespaces: namespaces.into_iter().collect(),
        workloads: w as u32,
        elsewhere,
        only_here,
        only_here_total,
        services: services.len() as u32,
        exposed: exposed.into_iter().collect(),
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
        let none = BTreeSet::new();
        let br = of("a", &specs, None, &none);
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
        assert_eq!(of("c", &specs, None, &none).workloads, 0);
    }

    #[test]
    fn what_runs_only_on_clusters_that_are_down_is_lost_with_them() {
        let specs = BTreeMap::from([
            (
                "a".to_string(),
                objs(&[
                    "Deployment/shop/web",
                    "StatefulSet/data/db",
                    "Deployment/data/etl",
                    "Service/shop/web",
                ]),
            ),
            (
                "b".to_string(),
                objs(&[
                    "StatefulSet/data/db",
                    "Deployment/data/etl",
                    "Service/shop/web",
                ]),
            ),
            ("c".to_string(), objs(&["Deployment/shop/web"])),
        ]);
        // a alone: everything runs elsewhere
        let none = BTreeSet::new();
        assert_eq!(of("a", &specs, None, &none).only_here_total, 0);
        // a with b down: db and etl run on no cluster still up
        let br = of("a", &specs, None, &BTreeSet::from(["b"]));
        assert_eq!(
            br.only_here,
            vec!["Deployment data/etl", "StatefulSet data/db"]
        );
        assert!(
            br.summary.contains("2 run on no cluster still up"),
            "{}",
            br.summary
        );
        // a and b lost together: each workload and Service once
        let both = of_all(&["a", "b"], &specs, &BTreeMap::new(), &none);
        assert_eq!(
            (
                both.cluster.as_str(),
                both.workloads,
                both.elsewhere,
                both.services
            ),
            ("a, b", 3, 1, 1)
        );
        assert_eq!(
            both.summary,
            "takes down 3 workloads in 2 namespaces; 2 run on no cluster still up (Deployment data/etl, StatefulSet data/db); 1 service"
        );
        // and with c down too, nothing is left
        assert_eq!(
            of_all(
                &["a", "b"],
                &specs,
                &BTreeMap::new(),
                &BTreeSet::from(["c"])
            )
            .only_here_total,
            3
        );
    }
}
