//! Making a plan: choose the targets from the registry, render for each, judge every object against the
//! cluster's served api-versions and the deprecation table, flag risks, then dry-run on every target at once
//! (server-side apply with `dryRun=All` through its agent) and gather every error from every cluster before
//! anything is applied; the dry-run's would-be objects give a field-level diff against the live ones.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use chrono::Utc;
use futures::StreamExt;
use multipilot_schemas::payload::{ApplyOutcome, ClusterFacts, ObjectRef, ReleaseAction};
use serde_json::Value;

use crate::Service;
use crate::exec::Command;
use crate::judge::{self, Verdict};
use crate::model::{Action, ClusterPlan, Plan, PlannedObject};
use crate::render;
use crate::spec::{Spec, parse_selector};

/// The labels a selector sees for a cluster: its registry labels plus `cluster` and `version`.
pub fn selector_labels(name: &str, facts: &ClusterFacts) -> BTreeMap<String, String> {
    let mut l = facts.labels.clone();
    l.insert("cluster".into(), name.into());
    l.insert(
        "version".into(),
        format!("{}.{}", facts.version.major, facts.version.minor),
    );
    l
}

/// Why no plan could be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec names clusters the registry does not know.
    #[error("{}", unknown_text(.unknown, .known, .more))]
    UnknownClusters {
        /// The clusters not known.
        unknown: Vec<String>,
        /// The first 30 clusters known.
        known: Vec<String>,
        /// Whether more than 30 are known.
        more: bool,
    },
    /// Neither the names nor the selector choose a cluster.
    #[error("no cluster matches the targets (selector {selector:?}; {known} clusters known)")]
    NoMatch {
        /// The selector.
        selector: String,
        /// Clusters the registry knows.
        known: usize,
    },
    /// The spec's selectors or batches.
    #[error(transparent)]
    Spec(#[from] crate::spec::Error),
}

fn unknown_text(unknown: &[String], known: &[String], more: &bool) -> String {
    format!(
        "unknown cluster{} {}: the registry (FLEET_FACTS) knows {}{}",
        if unknown.len() > 1 { "s" } else { "" },
        unknown.join(", "),
        if known.is_empty() {
            "no cluster yet (is an agent running?)".to_string()
        } else {
            known.join(", ")
        },
        if *more { ", …" } else { "" }
    )
}

/// The target clusters of a spec, sorted; unknown explicit clusters and empty selections are errors.
pub fn targets(spec: &Spec, reg: &BTreeMap<String, ClusterFacts>) -> Result<Vec<String>, Error> {
    let mut out = BTreeSet::new();
    let mut unknown = Vec::new();
    for c in &spec.targets.clusters {
        if reg.contains_key(c) {
            out.insert(c.clone());
        } else {
            unknown.push(c.clone());
        }
    }
    if !unknown.is_empty() {
        return Err(Error::UnknownClusters {
            unknown,
            known: reg.keys().take(30).cloned().collect(),
            more: reg.len() > 30,
        });
    }
    if let Some(text) = &spec.targets.selector {
        let sel = parse_selector(text)?;
        for (name, facts) in reg {
            if sel.matches_map(&selector_labels(name, facts)) {
                out.insert(name.clone());
            }
        }
    }
    if out.is_empty() {
        return Err(Error::NoMatch {
            selector: spec.targets.selector.clone().unwrap_or_default(),
            known: reg.len(),
        });
    }
    Ok(out.into_iter().collect())
}

/// The batches with the clusters `gated` holds moved behind all others (each batch split in two, order
/// kept): what needs an approval goes last, so everything else converges without waiting for it.
pub fn gated_last(batches: Vec<Vec<String>>, gated: impl Fn(&str) -> bool) -> Vec<Vec<String>> {
    let (mut open, mut held) = (Vec::new(), Vec::new());
    for b in batches {
        let (g, o): (Vec<String>, Vec<String>) = b.into_iter().partition(|c| gated(c));
        open.push(o);
        held.push(g);
    }
    open.into_iter()
        .chain(held)
        .filter(|b| !b.is_empty())
        .collect()
}

/// The object a rendered manifest names.
pub fn oref(obj: &Value) -> ObjectRef {
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).map(str::to_string);
    ObjectRef {
        api_version: s("/apiVersion").unwrap_or_default(),
        kind: s("/kind").unwrap_or_default(),
        namespace: s("/metadata/namespace"),
        name: s("/metadata/name").unwrap_or_default(),
        uid: None,
    }
}

/// Judges one cluster's rendered objects (no cluster call).
pub fn judge_cluster(spec: &Spec, cluster: &str, facts: &ClusterFacts, batch: u32) -> ClusterPlan {
    let version = format!("{}.{}", facts.version.major, facts.version.minor);
    let mut plan = ClusterPlan {
        cluster: cluster.to_string(),
        version,
        batch,
        objects: Vec::new(),
        error: None,
        scrape_interval_s: facts.scrape_interval_s,
    };
    match render::render(spec, cluster, facts) {
        Err(e) => plan.error = Some(format!("render: {e}")),
        Ok(objs) => {
            for obj in objs {
                let r = oref(&obj);
                let verdict = judge::judge(
                    &r.api_version,
                    &r.kind,
                    &facts.api_versions,
                    facts.version.minor,
                );
                let blocked = verdict.blocked.clone();
                plan.objects.push(PlannedObject {
                    object: r,
                    action: if blocked.is_some() {
                        Action::Blocked
                    } else {
                        Action::NotTried
                    },
                    risks: judge::risks(&obj),
                    verdict,
                    diff: Vec::new(),
                    error: blocked,
                    rendered: obj,
                    delete: false,
                });
            }
        }
    }
    for d in &spec.delete {
        let obj = d.to_object();
        let r = oref(&obj);
        plan.objects.push(PlannedObject {
            risks: vec![judge::deletion(&d.kind, &crate::model::obj_name(&r))],
            object: r,
            action: Action::NotTried,
            verdict: Verdict {
                served: facts.api_versions.contains(&d.api_version),
                ..Default::default()
            },
            diff: Vec::new(),
            error: None,
            rendered: obj,
            delete: true,
        });
    }
    plan
}

impl Service {
    /// Makes a plan for `spec` at `revision` (renders, judges, dry-runs everywhere).
    pub async fn make_plan(&self, spec: &Spec, revision: u64) -> Result<Plan, Error> {
        self.registry.wait_loaded(self.config.registry_wait).await;
        let reg = self.registry.snapshot();
        let clusters = targets(spec, &reg)?;
        let mut batches = spec.batches(&clusters)?;
        if let Some(text) = &spec.sync.approval_selector {
            let sel = parse_selector(text)?;
            batches = gated_last(batches, |c| {
                reg.get(c)
                    .is_some_and(|f| sel.matches_map(&selector_labels(c, f)))
            });
        }
        let mut plans = Vec::new();
        for (i, batch) in batches.iter().enumerate() {
            for c in batch {
                let facts = &reg[c];
                plans.push(judge_cluster(spec, c, facts, i as u32 + 1));
            }
        }
        let started = Instant::now();
        let fm = self.field_manager(spec);
        let tag: u32 = rand::random();
        let results: Vec<ClusterPlan> = futures::stream::iter(plans.into_iter().map(|p| {
            let fm = fm.clone();
            async move { self.dry_run(spec, revision, tag, p, &fm).await }
        }))
        .buffered(self.config.parallelism)
        .collect()
        .await;
        let dry_run_ms = started.elapsed().as_millis() as u64;
        let mut required = BTreeSet::new();
        let (mut blocked, mut errors) = (0, 0);
        for c in &results {
            errors += usize::from(c.error.is_some());
            for o in &c.objects {
                match o.action {
                    Action::Blocked => blocked += 1,
                    Action::Error => errors += 1,
                    _ => {}
                }
                required.extend(o.risks.iter().filter_map(|r| r.approval.clone()));
            }
        }
        Ok(Plan {
            planned_at: Utc::now(),
            batches,
            clusters: results,
            required_approvals: required,
            blocked,
            errors,
            dry_run_ms,
        })
    }

    pub(crate) fn field_manager(&self, spec: &Spec) -> String {
        spec.field_manager
            .clone()
            .unwrap_or_else(|| self.config.field_manager.clone())
    }

    async fn dry_run(
        &self,
        spec: &Spec,
        revision: u64,
        tag: u32,
        mut plan: ClusterPlan,
        fm: &str,
    ) -> ClusterPlan {
        if plan.error.is_some() {
            return plan;
        }
        let applies: Vec<usize> = (0..plan.objects.len())
            .filter(|&i| plan.objects[i].applied())
            .collect();
        let deletes: Vec<usize> = (0..plan.objects.len())
            .filter(|&i| plan.objects[i].delete)
            .collect();
        for (idx, action, what) in [
            (applies, ReleaseAction::DryRun, "dry-run"),
            (deletes, ReleaseAction::Snapshot, "delete-check"),
        ] {
            if idx.is_empty() {
                continue;
            }
            let cmd = Command {
                id: format!(
                    "{}-r{revision}-plan{tag:08x}-{}-{what}",
                    spec.name, plan.cluster
                ),
                release: spec.name.clone(),
                cluster: plan.cluster.clone(),
                action,
                field_manager: fm.to_string(),
                force: spec.force,
                objects: idx
                    .iter()
                    .map(|&i| plan.objects[i].rendered.clone())
                    .collect(),
            };
            match self.sender.send(&cmd).await {
                Err(e) => {
                    plan.error = Some(e.to_string());
                    return plan;
                }
                Ok(r) if r.objects.len() != idx.len() => {
                    plan.error = Some(format!(
                        "the agent answered {} outcomes for {} objects: {}",
                        r.objects.len(),
                        idx.len(),
                        r.error.unwrap_or_default()
                    ));
                    return plan;
                }
                Ok(r) => {
                    for (&i, out) in idx.iter().zip(r.objects) {
                        let o = &mut plan.objects[i];
                        o.object.namespace = out.object.namespace.clone();
                        o.object.uid = out.object.uid.clone();
                        if out.outcome == ApplyOutcome::Error {
                            o.action = Action::Error;
                            o.error = out.error;
                        } else if o.delete {
                            o.action = if out.live.is_some() {
                                Action::WouldDelete
                            } else {
                                Action::Absent
                            };
                        } else {
                            o.action = out.outcome.into();
                            if let Some(after) = &out.result {
                                o.diff = crate::diff::diff(out.live.as_ref(), after);
                            }
                        }
                    }
                }
            }
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(minor: u32, labels: &[(&str, &str)]) -> ClusterFacts {
        ClusterFacts {
            node_software: Vec::new(),
            version: multipilot_schemas::payload::KubeVersion {
                major: 1,
                minor,
                git_version: format!("v1.{minor}.0"),
                platform: String::new(),
            },
            api_versions: vec!["v1".into()],
            preferred_versions: Default::default(),
            nodes: Default::default(),
            cni: None,
            coredns: None,
            ingress_controller: None,
            gpu_device_plugin: None,
            ingress_classes: vec![],
            storage_classes: vec![],
            default_storage_class: None,
            apiserver_cert_expiry: None,
            gpus: vec![],
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            scrape_interval_s: None,
        }
    }

    #[test]
    fn gated_clusters_go_last_in_their_batch_order() {
        let b = |v: &[&[&str]]| -> Vec<Vec<String>> {
            v.iter()
                .map(|x| x.iter().map(|s| s.to_string()).collect())
                .collect()
        };
        let got = gated_last(
            b(&[&["dev-1", "prod-1"], &["prod-2", "stage-1"], &["prod-3"]]),
            |c| c.starts_with("prod"),
        );
        assert_eq!(
            got,
            b(&[
                &["dev-1"],
                &["stage-1"],
                &["prod-1"],
                &["prod-2"],
                &["prod-3"]
            ])
        );
    }

    #[test]
    fn targets_by_name_and_selector_with_clear_errors() {
        let reg: BTreeMap<String, ClusterFacts> = [
            ("a".to_string(), facts(24, &[("env", "prod")])),
            ("b".to_string(), facts(31, &[("env", "prod")])),
            ("c".to_string(), facts(31, &[("env", "dev")])),
        ]
        .into();
        let spec =
            |t: &str| Spec::parse(&format!("name: w\nmanifests: x\ntargets: {t}\n")).expect("spec");
        assert_eq!(
            targets(&spec("{selector: 'env=prod,version>=1.25'}"), &reg).expect("t"),
            vec!["b"]
        );
        assert_eq!(
            targets(&spec("{clusters: [c], selector: 'version<1.25'}"), &reg).expect("t"),
            vec!["a", "c"]
        );
        let e = targets(&spec("{clusters: [zz]}"), &reg)
            .expect_err("unknown")
            .to_string();
        assert!(
            e.contains("unknown cluster zz") && e.contains("a, b, c"),
            "{e}"
        );
        let e = targets(&spec("{selector: env=qa}"), &reg)
            .expect_err("none")
            .to_string();
        assert!(e.contains("no cluster matches"), "{e}");
    }
}
