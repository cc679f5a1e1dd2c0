//! Order between releases (`depends_on`): a release waits on a cluster until the releases it depends on are
//! healthy there, and a cycle is refused at plan time — as Flux's `dependsOn` between Kustomizations and
//! HelmReleases does. Pure: the releases are given as stored.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Release, State};

/// What `release` still waits for on `clusters`, one line per dependency not ready; `None` when none.
///
/// A dependency counts on the clusters it targets only (a release it needs elsewhere does not hold this
/// one here). It is ready on a cluster when it runs there (`deployed`) and is not in the middle of
/// changing it: applying, held or waiting with a newer revision not yet there, rolling back, failed.
pub fn waiting_for(
    release: &Release,
    clusters: &[String],
    stored: &BTreeMap<String, Release>,
) -> Option<String> {
    let mut waits = Vec::new();
    for dep in &release.spec.depends_on {
        let Some(d) = stored.get(dep) else {
            waits.push(format!("release {dep} (it depends on) does not exist"));
            continue;
        };
        let not_ready: Vec<&str> = clusters
            .iter()
            .filter(|c| d.plan.clusters.iter().any(|p| &p.cluster == *c))
            .filter(|c| !ready_on(d, c))
            .map(String::as_str)
            .collect();
        if !not_ready.is_empty() {
            waits.push(format!(
                "release {dep} is not healthy on {} ({}, revision {})",
                not_ready.join(", "),
                d.state,
                d.revision
            ));
        }
    }
    (!waits.is_empty()).then(|| format!("depends on: {}", waits.join("; ")))
}

fn ready_on(d: &Release, cluster: &str) -> bool {
    let Some(dep) = d.deployed.get(cluster) else {
        return false;
    };
    match d.state {
        State::Succeeded | State::Planned | State::Blocked | State::RolledBack => true,
        // its new revision is on its way: ready where it arrived
        State::Applying | State::Held | State::WaitingApproval => dep.revision == d.revision,
        State::RollingBack
        | State::Failed
        | State::RollbackFailed
        | State::Interrupted
        | State::Refused => false,
    }
}

/// The cycle `name` (depending on `depends_on`) would close among the stored releases' `depends_on`, as
/// `a → b → a`; `None` when there is none.
pub fn cycle(
    name: &str,
    depends_on: &[String],
    stored: &BTreeMap<String, Vec<String>>,
) -> Option<String> {
    let edges = |n: &str| -> Vec<String> {
        if n == name {
            depends_on.to_vec()
        } else {
            stored.get(n).cloned().unwrap_or_default()
        }
    };
    // depth-first from `name`, the path kept to show the cycle
    fn visit(
        n: &str,
        name: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
        edges: &dyn Fn(&str) -> Vec<String>,
    ) -> bool {
        for next in edges(n) {
            if next == name {
                path.push(next);
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if visit(&next, name, path, seen, edges) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![name.to_string()];
    let mut seen = BTreeSet::new();
    visit(name, name, &mut path, &mut seen, &edges).then(|| path.join(" → "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClusterPlan, Deployed, Plan};
    use crate::spec::Spec;
    use chrono::Utc;

    fn release(
        name: &str,
        deps: &[&str],
        state: State,
        revision: u64,
        on: &[(&str, u64)],
    ) -> Release {
        let mut spec = Spec::parse(&format!(
            "name: {name}\nmanifests: x\ntargets: {{clusters: [a, b]}}\n"
        ))
        .expect("spec");
        spec.depends_on = deps.iter().map(|d| d.to_string()).collect();
        let now = Utc::now();
        Release {
            name: name.into(),
            revision,
            state,
            spec,
            source: Default::default(),
            actor: "t".into(),
            created_at: now,
            updated_at: now,
            plan: Plan {
                planned_at: now,
                batches: vec![vec!["a".into(), "b".into()]],
                clusters: ["a", "b"]
                    .iter()
                    .map(|c| ClusterPlan {
                        cluster: c.to_string(),
                        version: "1.31".into(),
                        batch: 1,
                        objects: Vec::new(),
                        error: None,
                        scrape_interval_s: None,
                    })
                    .collect(),
                required_approvals: Default::default(),
                blocked: 0,
                errors: 0,
                dry_run_ms: 1,
            },
            approvals: Default::default(),
            batches: Vec::new(),
            changed: Vec::new(),
            rollbacks: 0,
            error: None,
            waiting_for: None,
            override_windows: false,
            events: 0,
            deployed: on
                .iter()
                .map(|(c, rev)| {
                    (
                        c.to_string(),
                        Deployed {
                            revision: *rev,
                            commit: None,
                            at: now,
                            field_manager: "m".into(),
                            objects: Vec::new(),
                        },
                    )
                })
                .collect(),
            deployed_before: Default::default(),
        }
    }

    #[test]
    fn a_release_waits_per_cluster_for_what_it_depends_on() {
        let app = release("app", &["db"], State::Planned, 1, &[]);
        let both = vec!["a".to_string(), "b".to_string()];
        let mut stored = BTreeMap::new();
        assert_eq!(
            waiting_for(&app, &both, &stored).as_deref(),
            Some("depends on: release db (it depends on) does not exist")
        );
        stored.insert(
            "db".into(),
            release("db", &[], State::Applying, 2, &[("a", 2), ("b", 1)]),
        );
        assert_eq!(
            waiting_for(&app, &both, &stored).as_deref(),
            Some("depends on: release db is not healthy on b (applying, revision 2)")
        );
        assert_eq!(
            waiting_for(&app, &["a".to_string()], &stored),
            None,
            "ready on a"
        );
        stored.insert(
            "db".into(),
            release("db", &[], State::Succeeded, 2, &[("a", 2), ("b", 2)]),
        );
        assert_eq!(waiting_for(&app, &both, &stored), None);
        stored.insert(
            "db".into(),
            release("db", &[], State::RollingBack, 2, &[("a", 2), ("b", 2)]),
        );
        assert!(waiting_for(&app, &both, &stored).is_some());
        // a dependency that does not target a cluster does not hold it there
        let mut db = release("db", &[], State::Succeeded, 1, &[("a", 1)]);
        db.plan.clusters.retain(|p| p.cluster == "a");
        stored.insert("db".into(), db);
        assert_eq!(waiting_for(&app, &both, &stored), None);
    }

    #[test]
    fn cycles_are_found_with_their_path() {
        let stored: BTreeMap<String, Vec<String>> = [
            ("db".to_string(), vec!["net".to_string()]),
            ("net".to_string(), vec![]),
            ("cache".to_string(), vec!["app".to_string()]),
        ]
        .into_iter()
        .collect();
        assert_eq!(cycle("app", &["db".into()], &stored), None);
        assert_eq!(
            cycle("app", &["db".into(), "cache".into()], &stored).as_deref(),
            Some("app → cache → app")
        );
        let mut stored = stored;
        stored.insert("net".into(), vec!["app".into()]);
        assert_eq!(
            cycle("app", &["db".into()], &stored).as_deref(),
            Some("app → db → net → app")
        );
    }
}
