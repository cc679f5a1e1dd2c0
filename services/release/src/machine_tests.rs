//! The release machine fed by hand, with its own clock: batches in order, gates, soaks, failures and
//! rollbacks, without a store, NATS or a timer.

use chrono::TimeZone;
use multipilot_schemas::Envelope;
use multipilot_schemas::payload::{ApplyOutcome, ObjectRef};

use super::*;
use crate::model::{Action, ClusterPlan, Plan, PlannedObject};
use crate::spec::Spec;

fn t(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_700_000_000 + secs, 0)
        .single()
        .expect("a time")
}

fn oref(kind: &str, name: &str) -> ObjectRef {
    ObjectRef {
        api_version: if kind == "Deployment" {
            "apps/v1"
        } else {
            "v1"
        }
        .into(),
        kind: kind.into(),
        namespace: Some("default".into()),
        name: name.into(),
        uid: None,
    }
}

fn planned(kind: &str, name: &str, action: Action) -> PlannedObject {
    let o = oref(kind, name);
    PlannedObject {
        rendered: json!({"apiVersion": o.api_version, "kind": kind, "metadata": {"name": name},
            "spec": {"replicas": 2}}),
        object: o,
        action,
        verdict: Default::default(),
        diff: Vec::new(),
        error: None,
        risks: Vec::new(),
        delete: false,
    }
}

/// A planned release `web` with a Deployment and a ConfigMap on every cluster.
fn release(batches: &[&[&str]]) -> Release {
    let all: Vec<&str> = batches.iter().flat_map(|b| b.iter().copied()).collect();
    let spec = Spec::parse(&format!(
        "name: web\nmanifests: x\ntargets: {{clusters: [{}]}}\n",
        all.join(", ")
    ))
    .expect("spec");
    let clusters = batches
        .iter()
        .enumerate()
        .flat_map(|(i, b)| {
            b.iter().map(move |c| ClusterPlan {
                cluster: c.to_string(),
                version: "1.31".into(),
                batch: i as u32 + 1,
                objects: vec![
                    planned("Deployment", "web", Action::WouldCreate),
                    planned("ConfigMap", "web", Action::WouldConfigure),
                ],
                error: None,
                scrape_interval_s: None,
            })
        })
        .collect();
    Release {
        name: "web".into(),
        revision: 2,
        state: State::Planned,
        spec,
        source: Default::default(),
        actor: "ann".into(),
        created_at: t(0),
        updated_at: t(0),
        plan: Plan {
            planned_at: t(0),
            batches: batches
                .iter()
                .map(|b| b.iter().map(|c| c.to_string()).collect())
                .collect(),
            clusters,
            required_approvals: Default::default(),
            blocked: 0,
            errors: 0,
            dry_run_ms: 5,
        },
        approvals: Default::default(),
        batches: Vec::new(),
        changed: Vec::new(),
        rollbacks: 0,
        error: None,
        waiting_for: None,
        override_windows: false,
        events: 0,
        deployed: Default::default(),
        deployed_before: Default::default(),
    }
}

fn policy() -> Policy {
    Policy {
        soak: Duration::from_secs(30),
        health_timeout: Duration::from_secs(120),
        health_interval: Duration::from_secs(1),
        field_manager: "multipilot".into(),
        gated: None,
        analysis: None,
        health: std::sync::Arc::new(crate::health::Rules::shipped()),
        hold: None,
    }
}

/// The policy with an analysis: one `errors` metric failing above 5 %, measured every 10 s, 3 times, the
/// first one interval after the batch is healthy (no initial delay).
fn analysed(extra: &str) -> Policy {
    analysed_with(&format!("initial_delay: 0s\n{extra}"))
}

/// The same analysis with its `initial_delay` as `extra` says (by default: from the scrape intervals).
fn analysed_with(extra: &str) -> Policy {
    let a: crate::analysis::Analysis = serde_yaml::from_str(&format!(
        "interval: 10s\ncount: 3\n{extra}metrics: [{{name: errors, template: error-ratio, failure: result > 0.05}}]"
    ))
    .expect("analysis");
    Policy {
        analysis: Some(a.compile(Duration::from_secs(30)).expect("compiles")),
        ..policy()
    }
}

fn measure_of(out: &[Decision]) -> (Vec<Target>, Vec<Target>) {
    out.iter()
        .find_map(|d| match d {
            Decision::Measure {
                targets, baseline, ..
            } => Some((targets.clone(), baseline.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no measurement in {out:?}"))
}

/// The `errors` metric answered for these clusters, with a baseline.
fn measured(values: &[(&str, Option<f64>)], baseline: Option<f64>) -> Input {
    Input::Measured(vec![Answered {
        metric: "errors".into(),
        clusters: values
            .iter()
            .map(|(c, v)| {
                (
                    c.to_string(),
                    v.ok_or_else(crate::analysis::NoNumber::no_sample),
                )
            })
            .collect(),
        baseline,
    }])
}

impl Run {
    /// Takes the batch whose snapshots `out` asks for to healthy (its soak and analysis start).
    fn until_soaking(&mut self, out: Vec<Decision>) -> Vec<Decision> {
        let clusters = snapshot_of(&out);
        self.each(&clusters, |c| Input::Snapshot {
            cluster: c.into(),
            failure: None,
        });
        self.each(&clusters, |c| step(c, None));
        self.feed(Input::Health(
            clusters.iter().map(|c| read(c, complete())).collect(),
        ))
    }
}

/// A release and its run, on a clock the test moves.
struct Run {
    m: Machine,
    r: Release,
    now: DateTime<Utc>,
    /// Every entry recorded, as `what` (`what:false` when not ok).
    entries: Vec<String>,
}

impl Run {
    fn new(r: Release, policy: Policy) -> Run {
        Run {
            m: Machine::new(policy, "ann"),
            r,
            now: t(100),
            entries: Vec::new(),
        }
    }

    /// Starts applying (as `release apply` does) and returns the first decisions.
    fn start(&mut self) -> Vec<Decision> {
        let e = start(&mut self.r, "ann").expect("starts");
        self.entries.push(e.what.to_string());
        self.feed(Input::Start)
    }

    fn feed(&mut self, input: Input) -> Vec<Decision> {
        let out = self.m.on(&mut self.r, input, self.now);
        for d in &out {
            if let Decision::Record(e) = d {
                self.entries.push(if e.ok {
                    e.what.to_string()
                } else {
                    format!("{}:false", e.what)
                });
            }
        }
        out
    }

    /// Feeds one answer per cluster.
    fn each(&mut self, clusters: &[String], input: impl Fn(&str) -> Input) -> Vec<Decision> {
        let mut out = Vec::new();
        for c in clusters {
            out = self.feed(input(c));
        }
        out
    }

    fn batch(&self, index: u32) -> &BatchProgress {
        self.r
            .batches
            .iter()
            .find(|b| b.index == index)
            .expect("the batch")
    }

    /// Moves the clock to the time a `WaitUntil` among `out` names and ticks.
    fn wait(&mut self, out: &[Decision]) -> Vec<Decision> {
        let at = out
            .iter()
            .find_map(|d| match d {
                Decision::WaitUntil(at) => Some(*at),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no wait in {out:?}"));
        self.now = at;
        self.feed(Input::Tick)
    }

    /// Takes a batch from its snapshots to the end of its soak, every cluster fine and no incident;
    /// returns what comes after.
    fn pass_batch(&mut self, out: Vec<Decision>) -> Vec<Decision> {
        let clusters = snapshot_of(&out);
        let out = self.each(&clusters, |c| Input::Snapshot {
            cluster: c.into(),
            failure: None,
        });
        assert_eq!(apply_of(&out), clusters, "{out:?}");
        let out = self.each(&clusters, |c| step(c, None));
        let workloads = health_of(&out);
        assert_eq!(workloads.keys().cloned().collect::<Vec<_>>(), clusters);
        self.now += chrono::TimeDelta::seconds(5);
        let out = self.feed(Input::Health(
            clusters.iter().map(|c| read(c, complete())).collect(),
        ));
        let out = self.wait(&out);
        assert!(
            matches!(&out[..], [Decision::ReadIncidents { clusters: c, .. }] if *c == clusters),
            "{out:?}"
        );
        self.feed(Input::Incidents {
            incidents: Vec::new(),
            fleet: Vec::new(),
        })
    }
}

/// A one-cluster release applied, healthy and at the end of its soak.
fn soak_ended() -> Run {
    let mut run = Run::new(release(&[&["a"]]), policy());
    run.start();
    run.feed(Input::Snapshot {
        cluster: "a".into(),
        failure: None,
    });
    run.feed(step("a", None));
    let out = run.feed(Input::Health(vec![read("a", complete())]));
    run.wait(&out);
    run
}

fn snapshot_of(out: &[Decision]) -> Vec<String> {
    out.iter()
        .find_map(|d| match d {
            Decision::Snapshot { clusters, .. } => Some(clusters.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no snapshot in {out:?}"))
}

fn apply_of(out: &[Decision]) -> Vec<String> {
    out.iter()
        .find_map(|d| match d {
            Decision::Apply { clusters, .. } => Some(clusters.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

fn health_of(out: &[Decision]) -> BTreeMap<String, Vec<Value>> {
    out.iter()
        .find_map(|d| match d {
            Decision::ReadHealth { workloads } => Some(workloads.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no health read in {out:?}"))
}

fn rollback_of(out: &[Decision]) -> Vec<String> {
    out.iter()
        .find_map(|d| match d {
            Decision::RollBack { clusters } => Some(clusters.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no rollback in {out:?}"))
}

fn outcome(kind: &str, o: ApplyOutcome, error: Option<&str>) -> ObjectOutcome {
    ObjectOutcome {
        object: oref(kind, "web"),
        outcome: o,
        error: error.map(str::to_string),
        live: None,
        result: None,
    }
}

fn step(cluster: &str, failure: Option<&str>) -> Input {
    Input::Step {
        cluster: cluster.into(),
        outcome: StepOutcome::Sent {
            outcomes: vec![
                outcome("Deployment", ApplyOutcome::Configured, None),
                outcome(
                    "ConfigMap",
                    if failure.is_some() {
                        ApplyOutcome::Error
                    } else {
                        ApplyOutcome::Created
                    },
                    failure,
                ),
            ],
            failure: failure
                .map(|e| format!("{cluster}: apply failed: ConfigMap default/web: {e}")),
        },
    }
}

fn restored(cluster: &str) -> Input {
    Input::Restored {
        cluster: cluster.into(),
        outcome: StepOutcome::Sent {
            outcomes: vec![outcome("Deployment", ApplyOutcome::Configured, None)],
            failure: None,
        },
    }
}

fn deployment(updated: i64) -> Value {
    json!({"kind": "Deployment", "metadata": {"generation": 2}, "spec": {"replicas": 2},
        "status": {"observedGeneration": 2, "updatedReplicas": updated, "availableReplicas": updated,
            "replicas": 2}})
}

fn complete() -> Vec<ObjectOutcome> {
    let mut o = outcome("Deployment", ApplyOutcome::Present, None);
    o.live = Some(deployment(2));
    vec![o]
}

fn stuck() -> Vec<ObjectOutcome> {
    let mut o = outcome("Deployment", ApplyOutcome::Present, None);
    o.live = Some(deployment(1));
    vec![o]
}

fn read(cluster: &str, objects: Vec<ObjectOutcome>) -> HealthRead {
    HealthRead {
        cluster: cluster.into(),
        objects,
        error: None,
    }
}

fn sample<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let entry = multipilot_schemas::catalog::entries()
        .into_iter()
        .find(|e| e.name == name)
        .expect("the catalog has it");
    rmp_serde::from_slice::<Envelope<T>>(&entry.sample)
        .expect("the sample decodes")
        .payload
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn batches_go_in_order_and_each_waits_for_its_health_and_soak() {
    let mut run = Run::new(release(&[&["a"], &["b", "c"]]), policy());
    let out = run.start();
    assert_eq!(run.r.state, State::Applying);
    assert_eq!(snapshot_of(&out), names(&["a"]));
    assert_eq!(run.batch(1).state, BatchState::Applying);
    assert_eq!(run.batch(1).started_at, Some(t(100)));
    // nothing counts as changed before its snapshot is stored
    assert!(run.r.changed.is_empty());
    let out = run.feed(Input::Snapshot {
        cluster: "a".into(),
        failure: None,
    });
    assert_eq!(out[0], Decision::Persist, "{out:?}");
    assert_eq!(run.r.changed, names(&["a"]));
    assert_eq!(apply_of(&out), names(&["a"]));
    let out = run.feed(step("a", None));
    assert_eq!(run.batch(1).state, BatchState::WaitingHealth);
    // only the workload is watched
    let w = health_of(&out);
    assert_eq!(w["a"].len(), 1);
    assert_eq!(w["a"][0]["kind"], "Deployment");
    let out = run.feed(Input::Health(vec![read("a", complete())]));
    assert_eq!(run.batch(1).state, BatchState::Soaking);
    assert_eq!(
        out.last(),
        Some(&Decision::WaitUntil(t(130))),
        "a 30 s soak: {out:?}"
    );
    // an early tick waits on
    run.now = t(120);
    assert_eq!(run.feed(Input::Tick), vec![Decision::WaitUntil(t(130))]);
    let out = run.wait(&out);
    assert_eq!(
        out,
        vec![Decision::ReadIncidents {
            clusters: names(&["a"]),
            since: t(100)
        }]
    );
    let out = run.feed(Input::Incidents {
        incidents: Vec::new(),
        fleet: Vec::new(),
    });
    assert_eq!(run.batch(1).state, BatchState::Done);
    assert_eq!(run.batch(1).finished_at, Some(t(130)));
    assert_eq!(run.r.deployed["a"].revision, 2);
    assert_eq!(run.r.deployed["a"].field_manager, "multipilot");
    assert_eq!(run.r.deployed["a"].objects.len(), 2);
    assert!(!run.r.deployed.contains_key("b"));
    // the second batch only now
    assert_eq!(snapshot_of(&out), names(&["b", "c"]));
    let out = run.pass_batch(out);
    assert_eq!(out.last(), Some(&Decision::Stop));
    assert!(run.m.is_over());
    assert_eq!(run.r.state, State::Succeeded);
    assert_eq!(run.r.changed, names(&["a", "b", "c"]));
    assert_eq!(
        run.entries,
        [
            "apply", "batch", "step", "health", "batch", "step", "step", "health", "done"
        ]
    );
}

#[test]
fn a_failed_step_stops_the_batch_and_rolls_back_every_changed_cluster() {
    let mut r = release(&[&["a"], &["b", "c"]]);
    // what `a` ran before this revision comes back with the rollback; `b` ran nothing of it
    let before = Deployed {
        revision: 1,
        commit: None,
        at: t(0),
        field_manager: "multipilot".into(),
        objects: Vec::new(),
    };
    r.deployed.insert("a".into(), before.clone());
    let mut run = Run::new(r, policy());
    let out = run.start();
    let out = run.pass_batch(out);
    assert_eq!(run.r.deployed["a"].revision, 2);
    let clusters = snapshot_of(&out);
    run.each(&clusters, |c| Input::Snapshot {
        cluster: c.into(),
        failure: None,
    });
    run.feed(step("b", Some("forbidden")));
    let out = run.feed(step("c", None));
    // the batch fails with the step's error, the release with the batch's
    let b = run.batch(2);
    assert_eq!(b.state, BatchState::Failed);
    assert_eq!(
        b.error.as_deref(),
        Some("b: apply failed: ConfigMap default/web: forbidden")
    );
    assert_eq!(
        run.r.error.as_deref(),
        Some("batch 2: b: apply failed: ConfigMap default/web: forbidden")
    );
    assert_eq!(run.r.state, State::RollingBack);
    assert_eq!(run.r.rollbacks, 1);
    // no health gate for a failed batch; the last changed cluster is restored first
    assert!(!out.iter().any(|d| matches!(d, Decision::ReadHealth { .. })));
    assert_eq!(rollback_of(&out), names(&["c", "b", "a"]));
    // the failure is recorded in the state it happened in
    let states: Vec<(String, State)> = out
        .iter()
        .filter_map(|d| match d {
            Decision::Record(e) => Some((e.what.to_string(), e.state)),
            _ => None,
        })
        .collect();
    assert_eq!(
        states,
        [
            ("step".to_string(), State::Applying),
            ("batch".to_string(), State::Applying),
            ("failed".to_string(), State::RollingBack),
            ("rollback".to_string(), State::RollingBack),
        ]
    );
    let out = run.each(&names(&["c", "b", "a"]), restored);
    assert_eq!(out.last(), Some(&Decision::Stop));
    assert_eq!(run.r.state, State::RolledBack);
    assert_eq!(run.r.deployed.get("a"), Some(&before));
    assert!(!run.r.deployed.contains_key("b"));
    assert_eq!(
        &run.entries[run.entries.len() - 9..],
        [
            "step:false",
            "step",
            "batch:false",
            "failed:false",
            "rollback",
            "rollback-step",
            "rollback-step",
            "rollback-step",
            "rolled-back"
        ]
    );
    assert!(run.m.is_over());
}

#[test]
fn a_new_incident_during_the_soak_rolls_back() {
    let mut run = soak_ended();
    let mut before: Incident = sample("Incident");
    before.opened_at = t(50);
    before.status = IncidentStatus::Open;
    let mut resolved: Incident = sample("Incident");
    resolved.opened_at = t(110);
    resolved.status = IncidentStatus::Resolved;
    let mut fleet: FleetIncident = sample("FleetIncident");
    fleet.status = IncidentStatus::Open;
    fleet.suspects.clear();
    // an incident from before the batch, a resolved one and a fleet incident naming nobody don't stop it
    assert!(new_incidents("web", t(100), &[before.clone(), resolved], &[fleet]).is_empty());
    let mut new: Incident = sample("Incident");
    new.opened_at = t(120);
    new.status = IncidentStatus::Open;
    new.cluster = "a".into();
    let out = run.feed(Input::Incidents {
        incidents: vec![before, new.clone()],
        fleet: Vec::new(),
    });
    let want = format!(
        "new incidents during the soak: {} on a ({:?}): {}",
        new.kind, new.severity, new.summary
    );
    assert_eq!(run.batch(1).state, BatchState::Failed);
    assert_eq!(run.batch(1).error.as_deref(), Some(want.as_str()));
    assert_eq!(run.r.error, Some(format!("batch 1: {want}")));
    assert!(run.r.deployed.is_empty());
    assert_eq!(rollback_of(&out), names(&["a"]));
    run.feed(restored("a"));
    assert_eq!(run.r.state, State::RolledBack);
}

#[test]
fn incidents_that_cannot_be_read_fail_the_soak() {
    let mut run = soak_ended();
    run.feed(Input::IncidentsUnknown("no stream".into()));
    assert_eq!(
        run.r.error.as_deref(),
        Some("batch 1: cannot tell whether incidents opened: no stream")
    );
}

#[test]
fn a_fleet_incident_stops_the_soak_of_the_release_it_names_first() {
    let suspect = |name: &str, verdict| multipilot_schemas::payload::Suspect {
        verdict,
        object: ObjectRef {
            api_version: String::new(),
            kind: "Release".into(),
            namespace: None,
            name: name.into(),
            uid: None,
        },
        failing: 2,
        failing_total: 2,
        healthy: 0,
        healthy_total: 4,
        last_changed: t(0),
        summary: String::new(),
        release: Some(multipilot_schemas::payload::ReleaseRef {
            name: name.into(),
            revision: 3,
            batch: Some(1),
            commit: None,
        }),
    };
    let mut f: FleetIncident = sample("FleetIncident");
    f.status = IncidentStatus::Open;
    f.suspects = vec![
        suspect("agents", SuspectVerdict::Common),
        suspect("web", SuspectVerdict::Suspect),
    ];
    assert!(names_first(&f, "web"));
    // a release seen as often on healthy clusters is not named
    assert!(!names_first(&f, "agents"));
    let found = new_incidents("web", t(100), &[], std::slice::from_ref(&f));
    assert_eq!(
        found,
        [format!(
            "fleet incident {} names this release first: {}",
            f.id, f.summary
        )]
    );
    f.suspects.retain(|s| s.verdict == SuspectVerdict::Common);
    assert!(!names_first(&f, "web"));
}

#[test]
fn the_gate_holds_a_batch_until_approved() {
    let gated = || Policy {
        gated: Some(Box::new(|b: &[String]| {
            b.iter().any(|c| c.starts_with("prod"))
        })),
        ..policy()
    };
    let mut run = Run::new(release(&[&["dev"], &["prod"]]), gated());
    let out = run.start();
    let out = run.pass_batch(out);
    assert_eq!(out.last(), Some(&Decision::Stop), "{out:?}");
    assert_eq!(run.r.state, State::WaitingApproval);
    assert_eq!(run.batch(2).state, BatchState::Pending);
    let Some(Decision::Record(e)) = out.iter().rfind(|d| matches!(d, Decision::Record(_))) else {
        panic!("no entry in {out:?}")
    };
    assert_eq!(
        e.summary,
        "batch 2 (prod) waits for approval: multipilot release approve web gate"
    );
    // another approval doesn't open the gate
    assert_eq!(resume(&mut run.r, "bob"), None);
    run.r.approvals.insert(
        GATE_APPROVAL.into(),
        crate::model::Approval {
            actor: "bob".into(),
            at: t(200),
        },
    );
    let e = resume(&mut run.r, "bob").expect("resumes");
    assert_eq!(e.summary, "apply resumes: prod");
    assert_eq!(run.r.state, State::Applying);
    // a new run goes on with the batch it held
    let mut run = Run {
        m: Machine::new(gated(), "bob"),
        ..run
    };
    let out = run.feed(Input::Start);
    assert_eq!(snapshot_of(&out), names(&["prod"]));
    let out = run.pass_batch(out);
    assert_eq!(out.last(), Some(&Decision::Stop));
    assert_eq!(run.r.state, State::Succeeded);
}

#[test]
fn rolling_back_a_partly_applied_batch_restores_what_it_reached() {
    let mut run = Run::new(release(&[&["a", "b", "c"]]), policy());
    run.start();
    // a's snapshot fails: the batch changed nothing, and nothing is rolled back but the empty set
    run.feed(Input::Snapshot {
        cluster: "b".into(),
        failure: None,
    });
    let out = run.each(&names(&["a", "c"]), |c| Input::Snapshot {
        cluster: c.into(),
        failure: (c == "a").then(|| "no answer from the agent of cluster a".into()),
    });
    assert_eq!(
        run.r.error.as_deref(),
        Some("batch 1: no answer from the agent of cluster a")
    );
    assert!(run.r.changed.is_empty());
    assert_eq!(out.last(), Some(&Decision::Stop));
    assert_eq!(run.r.state, State::RolledBack);
    assert!(run.entries.ends_with(&[
        "batch:false".into(),
        "failed:false".into(),
        "rollback".into(),
        "rolled-back".into()
    ]));

    // applied on a, stopped by b: a rollback asked for by hand restores both
    let mut run = Run::new(release(&[&["a", "b"]]), policy());
    run.start();
    run.each(&names(&["a", "b"]), |c| Input::Snapshot {
        cluster: c.into(),
        failure: None,
    });
    run.feed(step("a", None));
    run.r.state = State::Failed;
    let mut r = run.r.clone();
    r.changed.clear();
    assert_eq!(
        request_rollback(&mut r).expect_err("nothing").to_string(),
        "release web (revision 2) changed no cluster: nothing to roll back"
    );
    request_rollback(&mut run.r).expect("accepted");
    assert_eq!(
        request_rollback(&mut run.r.clone())
            .expect_err("busy")
            .to_string(),
        "release web is rolling-back: wait for it"
    );
    let mut rb = Run {
        m: Machine::new(policy(), "carol"),
        ..run
    };
    let out = rb.feed(Input::RollBack);
    assert_eq!(rollback_of(&out), names(&["b", "a"]));
    let records: Vec<(&str, &str, bool)> = out
        .iter()
        .filter_map(|d| match d {
            Decision::Record(e) => Some((e.actor.as_str(), e.summary.as_str(), e.ok)),
            _ => None,
        })
        .collect();
    assert_eq!(
        records,
        [
            ("carol", "batch 1 stopped: rolled back by carol", false),
            ("carol", "rollback 1 starts: a, b", true)
        ],
        "the batch it was applying is stopped, not left applying"
    );
    assert_eq!(rb.batch(1).state, BatchState::Failed);
    rb.feed(restored("b"));
    let out = rb.feed(Input::Restored {
        cluster: "a".into(),
        outcome: StepOutcome::NotSent("a: no snapshot stored".into()),
    });
    assert_eq!(out.last(), Some(&Decision::Stop));
    assert_eq!(rb.r.state, State::RollbackFailed);
    assert_eq!(
        rb.r.error.as_deref(),
        Some("rollback failed: a: no snapshot stored")
    );
    // what could not be sent has no step of its own
    assert_eq!(
        &rb.entries[rb.entries.len() - 3..],
        ["rollback", "rollback-step", "rolled-back:false"]
    );
}

#[test]
fn a_restart_resumes_from_the_stored_release() {
    let gated = || Policy {
        gated: Some(Box::new(|b: &[String]| b.contains(&"c".to_string()))),
        ..policy()
    };
    let mut run = Run::new(release(&[&["a"], &["b"], &["c"]]), gated());
    let out = run.start();
    let out = run.pass_batch(out);
    let out = run.pass_batch(out);
    assert_eq!(out.last(), Some(&Decision::Stop));
    // stored and read back by another process
    let text = serde_json::to_string(&run.r).expect("json");
    let mut r: Release = serde_json::from_str(&text).expect("loads");
    assert_eq!(r, run.r);
    r.approvals.insert(
        GATE_APPROVAL.into(),
        crate::model::Approval {
            actor: "bob".into(),
            at: t(300),
        },
    );
    resume(&mut r, "bob").expect("resumes");
    let mut m = Machine::new(gated(), "bob");
    let out = m.on(&mut r, Input::Start, t(400));
    assert_eq!(snapshot_of(&out), names(&["c"]));
    assert_eq!(r.changed, names(&["a", "b"]));
    // a role that stops while applying leaves it busy: the next one marks it interrupted, never guesses
    let e = interrupted(&mut r).expect("busy");
    assert_eq!(r.state, State::Interrupted);
    assert_eq!(e.what, "interrupted");
    assert_eq!(e.detail, json!({"was": "applying"}));
    assert_eq!(
        r.error.as_deref(),
        Some(
            "the release role restarted while applying; changed clusters: a, b — roll back with \
             `multipilot release rollback web` or plan again"
        )
    );
    assert_eq!(interrupted(&mut r), None);
}

#[test]
fn the_health_gate_times_out() {
    let mut run = Run::new(release(&[&["a", "b"]]), policy());
    run.start();
    run.each(&names(&["a", "b"]), |c| Input::Snapshot {
        cluster: c.into(),
        failure: None,
    });
    run.each(&names(&["a", "b"]), |c| step(c, None));
    // b completes; a does not, and is read again every second
    let out = run.feed(Input::Health(vec![
        read("a", stuck()),
        read("b", complete()),
    ]));
    assert_eq!(out, vec![Decision::WaitUntil(t(101))]);
    let out = run.wait(&out);
    assert_eq!(
        health_of(&out).keys().collect::<Vec<_>>(),
        ["a"],
        "only what is not complete"
    );
    run.now = t(219);
    let out = run.feed(Input::Health(vec![read("a", stuck())]));
    assert_eq!(out, vec![Decision::WaitUntil(t(220))]);
    run.now = t(220);
    run.feed(Input::Health(vec![read("a", stuck())]));
    let e =
        "rollout not complete after 120s: a: Deployment default/web: updated 1/2, available 1/2";
    assert_eq!(run.batch(1).error.as_deref(), Some(e));
    assert_eq!(run.r.error, Some(format!("batch 1: health gate: {e}")));
    assert_eq!(run.r.state, State::RollingBack);
}

#[test]
fn a_stopping_role_fails_the_wait_it_was_in() {
    let mut run = Run::new(release(&[&["a"]]), policy());
    run.start();
    run.feed(Input::Snapshot {
        cluster: "a".into(),
        failure: None,
    });
    run.feed(step("a", None));
    run.feed(Input::Stopping);
    assert_eq!(
        run.r.error.as_deref(),
        Some("batch 1: health gate: the release role is stopping")
    );
}

#[test]
fn a_start_is_refused_with_what_is_missing() {
    let mut r = release(&[&["a"]]);
    r.plan.required_approvals.insert("external-ips".into());
    let refused = start(&mut r, "ann").expect_err("an approval is missing");
    assert_eq!(
        refused.error.to_string(),
        "apply refused: needs approval: external-ips (give --approve external-ips)"
    );
    assert!(refused.entry.is_some_and(|e| !e.ok));
    assert_eq!(r.state, State::Planned);
    r.plan.blocked = 1;
    let refused = start(&mut r, "ann").expect_err("blocked");
    assert!(
        refused
            .error
            .to_string()
            .starts_with("apply refused: the plan has 1 blocked objects and 0 errors:\n  "),
        "{}",
        refused.error
    );
    r.state = State::Succeeded;
    assert_eq!(
        start(&mut r, "ann").expect_err("ran").error.to_string(),
        "release web is succeeded (revision 2): plan it again to apply it"
    );
}

#[test]
fn rollout_rules() {
    let d = |generation, obs, upd, avail, reps| {
        json!({"kind": "Deployment", "metadata": {"generation": generation}, "spec": {"replicas": 2},
            "status": {"observedGeneration": obs, "updatedReplicas": upd, "availableReplicas": avail, "replicas": reps}})
    };
    assert!(rollout_missing(&d(2, 2, 2, 2, 2)).is_none());
    assert!(rollout_missing(&d(3, 2, 2, 2, 2)).is_some());
    assert!(rollout_missing(&d(2, 2, 1, 2, 2)).is_some());
    assert!(rollout_missing(&d(2, 2, 2, 1, 2)).is_some());
    assert!(rollout_missing(&d(2, 2, 2, 2, 3)).is_some());
    assert!(rollout_missing(&json!({"kind": "ConfigMap"})).is_none());
}

#[test]
fn an_analysis_is_measured_over_the_soak_and_a_good_batch_passes() {
    let mut run = Run::new(release(&[&["a"], &["b", "c"]]), analysed(""));
    let out = run.start();
    let out = run.until_soaking(out);
    // the first measurement one interval after the batch is healthy
    assert_eq!(out.last(), Some(&Decision::WaitUntil(t(110))), "{out:?}");
    let out = run.wait(&out);
    let (targets, baseline) = measure_of(&out);
    assert_eq!(targets.len(), 1);
    assert_eq!(targets[0].cluster, "a");
    assert_eq!(
        targets[0].workloads,
        names(&["web"]),
        "the release's workloads, not its ConfigMap"
    );
    assert_eq!(targets[0].namespaces, names(&["default"]));
    // the baseline: the clusters the release has not changed
    let base: Vec<&str> = baseline.iter().map(|t| t.cluster.as_str()).collect();
    assert_eq!(base, ["b", "c"]);
    let out = run.feed(measured(&[("a", Some(0.001))], Some(0.002)));
    assert_eq!(out.last(), Some(&Decision::WaitUntil(t(120))), "{out:?}");
    let out = run.wait(&out);
    measure_of(&out);
    let out = run.feed(measured(&[("a", Some(0.0))], Some(0.002)));
    // the third at 130 s, when the 30 s soak ends too: then the incidents
    let out = run.wait(&out);
    measure_of(&out);
    let out = run.feed(measured(&[("a", Some(0.01))], None));
    assert!(
        matches!(
            &out[..],
            [Decision::Record(_), Decision::ReadIncidents { .. }]
        ),
        "{out:?}"
    );
    let Decision::Record(e) = &out[0] else {
        unreachable!()
    };
    assert_eq!(e.what, ReleaseEntry::Analysis);
    assert_eq!(e.summary, "batch 1 analysis 3/3: errors 0.0100 on a");
    assert_eq!(e.detail["conclusion"], "passed");
    assert_eq!(e.detail["measurements"][0]["value"], 0.01);
    let out = run.feed(Input::Incidents {
        incidents: Vec::new(),
        fleet: Vec::new(),
    });
    assert_eq!(run.batch(1).state, BatchState::Done);
    assert_eq!(snapshot_of(&out), names(&["b", "c"]));
}

#[test]
fn the_first_measurement_waits_until_the_rate_interval_holds_only_the_healthy_batch() {
    let mut r = release(&[&["a", "b"], &["c"]]);
    r.plan.clusters[0].scrape_interval_s = Some(15);
    r.plan.clusters[1].scrape_interval_s = Some(20);
    r.plan.clusters[2].scrape_interval_s = Some(25);
    let mut run = Run::new(r, analysed_with(""));
    let out = run.start();
    let out = run.until_soaking(out);
    // healthy at 100 s; the slowest scrape of the round is the baseline c's 25 s: a rate interval of 100 s,
    // so the first range (90 s + the 10 s interval) starts when the batch was healthy
    assert_eq!(out.last(), Some(&Decision::WaitUntil(t(200))), "{out:?}");
    let out = run.wait(&out);
    let (targets, _) = measure_of(&out);
    assert_eq!(
        targets
            .iter()
            .map(|t| t.scrape_interval)
            .collect::<Vec<_>>(),
        [Some(Duration::from_secs(15)), Some(Duration::from_secs(20))],
        "each target's own: the round's rate interval is made of them and the baseline's"
    );
    // a cluster whose agent did not say: 30 s, a rate interval of 2 min; a delay given: that
    for (extra, first) in [("", 220), ("initial_delay: 5s\n", 115)] {
        let mut run = Run::new(release(&[&["c"]]), analysed_with(extra));
        let out = run.start();
        let out = run.until_soaking(out);
        assert_eq!(
            out.last(),
            Some(&Decision::WaitUntil(t(first))),
            "{extra:?}: {out:?}"
        );
    }
}

#[test]
fn a_new_workload_without_samples_yet_is_measured_again_and_passes_when_they_come() {
    let mut run = Run::new(release(&[&["a"], &["b"]]), analysed(""));
    let out = run.start();
    let out = run.until_soaking(out);
    let mut out = run.wait(&out);
    // its first scrapes have not reached the TSDB: two rounds without a number
    for at in [120, 130] {
        measure_of(&out);
        let got = run.feed(measured(&[("a", None)], None));
        let Decision::Record(e) = &got[0] else {
            panic!("{got:?}")
        };
        assert_eq!(
            e.summary,
            "batch 1 analysis 0/3: errors ? on a (no number yet, asked again)"
        );
        assert!(e.ok, "not a bad round yet");
        assert_eq!(e.detail["measurements"][0]["verdict"], "error");
        assert_eq!(run.r.state, State::Applying);
        assert_eq!(got.last(), Some(&Decision::WaitUntil(t(at))), "{got:?}");
        out = run.wait(&got);
    }
    // then three measurements: the soak lasts until they are taken
    for (i, at) in [(1, 140), (2, 150)] {
        measure_of(&out);
        let got = run.feed(measured(&[("a", Some(0.0))], Some(0.0)));
        assert_eq!(
            got.last(),
            Some(&Decision::WaitUntil(t(at))),
            "{i}: {got:?}"
        );
        out = run.wait(&got);
    }
    measure_of(&out);
    let out = run.feed(measured(&[("a", Some(0.0))], Some(0.0)));
    let Decision::Record(e) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(e.summary, "batch 1 analysis 3/3: errors 0.0000 on a");
    assert_eq!(e.detail["conclusion"], "passed");
    assert!(
        matches!(out.last(), Some(Decision::ReadIncidents { .. })),
        "{out:?}"
    );
}

#[test]
fn a_cluster_measured_its_count_is_not_measured_again_while_another_catches_up() {
    let mut r = release(&[&["a", "b"], &["c"]]);
    r.plan.clusters[0].scrape_interval_s = Some(60);
    let mut run = Run::new(r, analysed(""));
    let out = run.start();
    let out = run.until_soaking(out);
    let mut out = run.wait(&out);
    // b has no number in the first round; a's three are in after the third
    for b in [None, Some(0.0), Some(0.0)] {
        measure_of(&out);
        let got = run.feed(measured(&[("a", Some(0.0)), ("b", b)], Some(0.0)));
        out = run.wait(&got);
    }
    // only b is asked again: a measured its three
    let (targets, _) = measure_of(&out);
    assert_eq!(
        targets
            .iter()
            .map(|t| t.cluster.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );
    // over the same range as the rounds before: a's 60 s scrapes still make it (4 × 60 s)
    let range = out.iter().find_map(|d| match d {
        Decision::Measure { rate_interval, .. } => Some(*rate_interval),
        _ => None,
    });
    assert_eq!(range, Some(Duration::from_secs(240)));
    let out = run.feed(measured(&[("b", Some(0.0))], Some(0.0)));
    let Decision::Record(e) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(e.summary, "batch 1 analysis 3/3: errors 0.0000 on b");
    assert_eq!(e.detail["conclusion"], "passed");
    assert!(
        matches!(out.last(), Some(Decision::ReadIncidents { .. })),
        "{out:?}"
    );
}

#[test]
fn a_role_stopping_mid_soak_stops_the_batch_as_it_rolls_back() {
    let mut run = Run::new(release(&[&["a"], &["b"]]), analysed(""));
    let out = run.start();
    let out = run.until_soaking(out);
    assert_eq!(run.batch(1).state, BatchState::Soaking, "{out:?}");
    let out = run.feed(Input::Stopping);
    assert_eq!(rollback_of(&out), names(&["a"]));
    assert_eq!(run.batch(1).state, BatchState::Failed);
    assert_eq!(
        run.batch(1).error.as_deref(),
        Some("stopped: the release failed: the release role is stopping")
    );
    assert_eq!(run.batch(2).state, BatchState::Pending);
    assert!(
        run.entries.contains(&"batch:false".to_string()),
        "{:?}",
        run.entries
    );
}

#[test]
fn a_failing_analysis_stops_the_batch_and_rolls_back() {
    let mut run = Run::new(release(&[&["a", "b"], &["c"]]), analysed(""));
    let out = run.start();
    let out = run.until_soaking(out);
    let out = run.wait(&out);
    measure_of(&out);
    let out = run.feed(measured(
        &[("a", Some(0.0)), ("b", Some(0.31))],
        Some(0.001),
    ));
    assert_eq!(run.batch(1).state, BatchState::Failed);
    let e = run.batch(1).error.clone().expect("why");
    assert!(
        e.starts_with("analysis failed: errors on b: 1 failed measurements (limit 0): failure condition holds: result > 0.05"),
        "{e}"
    );
    assert_eq!(rollback_of(&out), names(&["b", "a"]));
    assert!(
        !run.r.deployed.contains_key("a"),
        "nothing of the batch counts as deployed"
    );
    let what: Vec<&str> = run.entries.iter().map(String::as_str).collect();
    assert_eq!(
        what,
        [
            "apply",
            "batch",
            "step",
            "step",
            "analysis:false",
            "batch:false",
            "failed:false",
            "rollback"
        ]
    );
}

#[test]
fn an_inconclusive_analysis_holds_the_batch_until_a_person_approves_it() {
    // no sample is inconclusive at once with no error allowed in a row
    let mut run = Run::new(
        release(&[&["a"], &["b"]]),
        analysed("inconclusive_limit: 1\nconsecutive_error_limit: 0\n"),
    );
    let out = run.start();
    let out = run.until_soaking(out);
    measure_of(&run.wait(&out));
    // no sample once: within the limit, measured again
    let out = run.feed(measured(&[("a", None)], None));
    assert_eq!(run.r.state, State::Applying);
    measure_of(&run.wait(&out));
    let out = run.feed(measured(&[("a", None)], None));
    assert_eq!(out.last(), Some(&Decision::Stop), "{out:?}");
    assert_eq!(run.r.state, State::WaitingApproval);
    assert_eq!(run.r.waiting_for.as_deref(), Some("analysis-1"));
    assert_eq!(
        run.batch(1).state,
        BatchState::Soaking,
        "held, not failed, not done"
    );
    assert!(run.r.changed.contains(&"a".to_string()));
    assert!(!can_resume(&run.r));
    // the gate's approval is not this one
    run.r.approvals.insert(
        GATE_APPROVAL.into(),
        crate::model::Approval {
            actor: "bob".into(),
            at: t(200),
        },
    );
    assert!(!can_resume(&run.r));
    run.r.approvals.insert(
        "analysis-1".into(),
        crate::model::Approval {
            actor: "bob".into(),
            at: t(200),
        },
    );
    assert!(can_resume(&run.r));
    // a rollback instead stops the held batch: not soaking on a rolled-back release
    let mut other = run.r.clone();
    request_rollback(&mut other).expect("a rollback may be asked");
    let mut m = Machine::new(analysed("inconclusive_limit: 1\n"), "carol");
    m.on(&mut other, Input::RollBack, t(210));
    let b1 = other
        .batches
        .iter()
        .find(|b| b.index == 1)
        .expect("batch 1");
    assert_eq!(b1.state, BatchState::Failed);
    assert_eq!(b1.error.as_deref(), Some("stopped: rolled back by carol"));
    assert_eq!(other.batches[1].state, BatchState::Pending, "never started");
    let e = resume(&mut run.r, "bob").expect("resumes");
    assert_eq!(e.what, ReleaseEntry::Apply);
    assert_eq!(run.r.waiting_for, None);
    // a new run: the held batch is done (no second snapshot of it), the next one starts
    run.m = Machine::new(
        analysed("inconclusive_limit: 1\nconsecutive_error_limit: 0\n"),
        "bob",
    );
    let out = run.feed(Input::Start);
    assert_eq!(run.batch(1).state, BatchState::Done);
    assert_eq!(snapshot_of(&out), names(&["b"]));
}

#[test]
fn kinds_without_a_rollout_are_judged_by_their_health_rules() {
    let mut r = release(&[&["a"]]);
    let cert = ObjectRef {
        api_version: "cert-manager.io/v1".into(),
        kind: "Certificate".into(),
        namespace: Some("default".into()),
        name: "web-tls".into(),
        uid: None,
    };
    r.plan.clusters[0].objects.push(PlannedObject {
        rendered: json!({"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": "web-tls", "namespace": "default"}}),
        object: cert.clone(),
        action: Action::WouldCreate,
        verdict: Default::default(),
        diff: Vec::new(),
        error: None,
        risks: Vec::new(),
        delete: false,
    });
    let certificate = |ready: &str, issuing: Option<(&str, &str)>| {
        let mut conditions = vec![
            json!({"type": "Ready", "status": ready, "reason": "Pending",
            "message": "Issuing certificate as Secret does not exist"}),
        ];
        if let Some((status, reason)) = issuing {
            conditions.push(
                json!({"type": "Issuing", "status": status, "reason": reason,
                "message": "The certificate request has failed to complete and will be retried"}),
            );
        }
        ObjectOutcome {
            object: cert.clone(),
            outcome: ApplyOutcome::Present,
            error: None,
            live: Some(
                json!({"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
                "metadata": {"name": "web-tls", "namespace": "default", "generation": 1},
                "status": {"conditions": conditions}}),
            ),
            result: None,
        }
    };
    let mut run = Run::new(r, policy());
    run.start();
    run.feed(Input::Snapshot {
        cluster: "a".into(),
        failure: None,
    });
    let out = run.feed(step("a", None));
    // the Certificate is read with the Deployment; the ConfigMap has no health and is not
    let read_now = health_of(&out);
    let kinds: Vec<&str> = read_now["a"]
        .iter()
        .filter_map(|o| o["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["Deployment", "Certificate"]);
    let mut objects = complete();
    objects.push(certificate("False", Some(("True", "Issuing"))));
    let out = run.feed(Input::Health(vec![read("a", objects)]));
    assert_eq!(run.batch(1).state, BatchState::WaitingHealth, "{out:?}");
    let mut objects = complete();
    objects.push(certificate("False", Some(("False", "Failed"))));
    run.now = t(105);
    let out = run.feed(Input::Health(vec![read("a", objects)]));
    assert_eq!(run.batch(1).state, BatchState::Failed);
    let e = run.batch(1).error.clone().unwrap_or_default();
    assert!(
        e.starts_with("failed: a: Certificate default/web-tls: "),
        "{e}"
    );
    assert_eq!(rollback_of(&out), names(&["a"]));
}

#[test]
fn a_held_batch_waits_without_repeating_itself_and_goes_on_when_let() {
    use std::sync::{Arc, Mutex};
    let why: Arc<Mutex<Option<Hold>>> = Arc::new(Mutex::new(None));
    let policy_with = |why: Arc<Mutex<Option<Hold>>>| Policy {
        hold: Some(Box::new(move |_r: &Release, batch: &[String], _now| {
            // only the second batch is held
            if batch == ["b"] {
                why.lock().expect("lock").clone()
            } else {
                None
            }
        })),
        ..policy()
    };
    *why.lock().expect("lock") = Some(Hold {
        reason: "b: held by deny window 0 (\"0 22 * * *\" UTC, 1h) until 23:00".into(),
        overridden: Vec::new(),
    });
    let mut run = Run::new(release(&[&["a"], &["b"]]), policy_with(why.clone()));
    let out = run.start();
    let out = run.pass_batch(out);
    assert_eq!(out.last(), Some(&Decision::Stop), "{out:?}");
    assert_eq!(run.r.state, State::Held);
    assert_eq!(
        run.batch(2).state,
        BatchState::Pending,
        "nothing of batch 2 happened"
    );
    assert!(
        run.r
            .waiting_for
            .as_deref()
            .is_some_and(|w| w.contains("deny window 0"))
    );
    assert_eq!(run.entries.last().map(String::as_str), Some("waiting"));
    // tried again, still held for the same reason: no second entry
    let n = run.entries.len();
    run.r.state = State::Applying;
    run.m = Machine::new(policy_with(why.clone()), "ann");
    let out = run.feed(Input::Start);
    assert_eq!(out, vec![Decision::Persist, Decision::Stop]);
    assert_eq!(run.entries.len(), n);
    // the window opened, by an operator's override: recorded, then the batch goes
    *why.lock().expect("lock") = Some(Hold {
        reason: String::new(),
        overridden: vec!["b: deny window 0".into()],
    });
    run.r.state = State::Applying;
    run.m = Machine::new(policy_with(why.clone()), "ann");
    let out = run.feed(Input::Start);
    assert_eq!(run.r.waiting_for, None);
    assert_eq!(snapshot_of(&out), names(&["b"]));
    assert_eq!(&run.entries[n..], ["override", "batch"]);
}
