//! Faults drill: every fault the simulator can inject, alone and in pairs on one cluster, at the agent's
//! and correlator's default settings. Per fault class: injection → incident visible, the evidence ranked
//! first, healing → resolved; and false incidents over a quiet run with churn and watch disconnects.
//!
//! Phases: a quiet period (churn, events, a watch disconnect and a watch expiry: every incident opened is
//! false), then waves (one fault class per cluster at once, as a fleet-wide event would be), then pairs
//! (two faults on one cluster: two incidents, each with its own evidence).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Result;
use multipilot_schemas::payload::{EvidenceKind, Incident, IncidentStatus};

use super::{Opts, report_processes};
use crate::observe::Observer;
use crate::record::{Recorder, Summary};
use crate::report::Report;
use crate::system::{Spec, System};

/// What the evidence ranked first must be for a class.
#[derive(Debug, Clone, Copy)]
enum First {
    /// The probe's own trend (an overload's latency or error ratio).
    Trend,
    /// A change (spec) of an object of this kind: the causal change.
    Change(&'static str),
    /// A finding naming an object of this kind.
    Object(&'static str),
    /// Anything (the finding is a fact about the cluster: its clock, its certificate).
    Any,
}

impl First {
    fn holds(self, inc: &Incident) -> bool {
        let Some(e) = inc.evidence.first() else {
            return matches!(self, First::Any);
        };
        match self {
            First::Trend => e.kind == EvidenceKind::Trend,
            First::Change(kind) => {
                e.kind == EvidenceKind::Change && e.object.as_ref().is_some_and(|o| o.kind == kind)
            }
            First::Object(kind) => e.object.as_ref().is_some_and(|o| o.kind == kind),
            First::Any => true,
        }
    }

    fn describe(self) -> String {
        match self {
            First::Trend => "the probe's trend".into(),
            First::Change(k) => format!("the {k} change"),
            First::Object(k) => format!("the {k} the finding names"),
            First::Any => "any".into(),
        }
    }
}

/// A fault class: what is injected, the incident it must become, and the evidence that must come first.
#[derive(Debug, Clone, Copy)]
struct Class {
    fault: &'static str,
    params: &'static [(&'static str, &'static str)],
    kind: &'static str,
    first: First,
    /// One-shot faults heal by themselves (nothing to switch off).
    one_shot: bool,
    /// A condition defined by its duration (a finalizer is "stuck" after `terminating_after_s`): its goal
    /// is that duration plus 30 s.
    defined_after_s: u64,
    /// Part of the short variant.
    short: bool,
}

const CLASSES: &[Class] = &[
    Class {
        fault: "node-not-ready",
        params: &[],
        kind: "node-not-ready",
        first: First::Object("Node"),
        one_shot: false,
        defined_after_s: 0,
        short: true,
    },
    Class {
        fault: "gpu-mismatch",
        params: &[],
        kind: "gpu-driver-mismatch",
        first: First::Change("DaemonSet"),
        one_shot: false,
        defined_after_s: 0,
        short: true,
    },
    Class {
        fault: "overload",
        params: &[("latency_ms", "1500"), ("error_rate", "0.05")],
        kind: "apiserver-overload",
        first: First::Trend,
        one_shot: false,
        defined_after_s: 0,
        short: true,
    },
    Class {
        fault: "etcd-unhealthy",
        params: &[],
        kind: "etcd-unhealthy",
        first: First::Any,
        one_shot: false,
        defined_after_s: 0,
        short: false,
    },
    Class {
        fault: "coredns-down",
        params: &[],
        kind: "dns-failure",
        first: First::Object("Deployment"),
        one_shot: false,
        defined_after_s: 0,
        short: false,
    },
    Class {
        fault: "scheduler-down",
        params: &[],
        kind: "scheduler-down",
        first: First::Object("Lease"),
        one_shot: false,
        defined_after_s: 0,
        short: false,
    },
    Class {
        fault: "controller-manager-down",
        params: &[],
        kind: "controller-manager-down",
        first: First::Object("Lease"),
        one_shot: false,
        defined_after_s: 0,
        short: false,
    },
    Class {
        fault: "cni-down",
        params: &[],
        kind: "cni-degraded",
        first: First::Object("DaemonSet"),
        one_shot: false,
        defined_after_s: 0,
        short: false,
    },
    Class {
        fault: "external-ips",
        params: &[],
        kind: "external-ip-exposure",
        first: First::Object("Service"),
        one_shot: false,
        defined_after_s: 0,
        short: false,
    },
    Class {
        fault: "deprecated-api",
        params: &[],
        kind: "deprecated-api-in-use",
        first: First::Any,
        one_shot: false,
        defined_after_s: 0,
        short: false,
    },
    Class {
        fault: "cert-expiry",
        params: &[("days", "5")],
        kind: "cert-expiring",
        first: First::Any,
        one_shot: false,
        defined_after_s: 0,
        short: false,
    },
    Class {
        fault: "clock-skew",
        params: &[("seconds", "300")],
        kind: "clock-skew",
        first: First::Any,
        one_shot: false,
        defined_after_s: 0,
        short: false,
    },
    Class {
        fault: "unreachable",
        params: &[],
        kind: "apiserver-down",
        first: First::Any,
        one_shot: false,
        defined_after_s: 0,
        short: false,
    },
    Class {
        fault: "warning-burst",
        params: &[("count", "450")],
        kind: "event-storm",
        first: First::Any,
        one_shot: true,
        defined_after_s: 0,
        short: false,
    },
    Class {
        fault: "stuck-finalizer",
        params: &[],
        kind: "finalizer-stuck",
        first: First::Object("ConfigMap"),
        one_shot: false,
        defined_after_s: 300,
        short: false,
    },
];

/// Pairs of faults on one cluster.
const PAIRS: &[(&str, &str)] = &[
    ("node-not-ready", "coredns-down"),
    ("gpu-mismatch", "overload"),
    ("etcd-unhealthy", "external-ips"),
    ("scheduler-down", "deprecated-api"),
];

fn class(fault: &str) -> Class {
    *CLASSES
        .iter()
        .find(|c| c.fault == fault)
        .expect("a pair names known classes")
}

/// One injection's outcome.
#[derive(Debug, Clone)]
struct Outcome {
    class: Class,
    cluster: String,
    /// Injection → incident visible.
    to_incident: Option<f64>,
    /// Healing → resolved.
    to_resolved: Option<f64>,
    incident: Option<Incident>,
}

fn open_incident(
    obs: &Observer,
    cluster: &str,
    kind: &str,
    since: Instant,
) -> Option<(f64, Incident)> {
    obs.with(|s| {
        s.incidents
            .iter()
            .find(|i| {
                i.at >= since
                    && i.incident.cluster == cluster
                    && i.incident.kind == kind
                    && i.incident.status != IncidentStatus::Resolved
            })
            .map(|i| (i.at.duration_since(since).as_secs_f64(), i.incident.clone()))
    })
}

fn resolved(obs: &Observer, id: &str, since: Instant) -> Option<f64> {
    obs.with(|s| {
        s.incidents
            .iter()
            .find(|i| {
                i.at >= since
                    && i.incident.id == id
                    && i.incident.status == IncidentStatus::Resolved
            })
            .map(|i| i.at.duration_since(since).as_secs_f64())
    })
}

/// Incidents first opened (revision 1) after `since`, as (cluster, kind), once each.
fn opened_since(obs: &Observer, since: Instant) -> Vec<(String, String)> {
    obs.with(|s| {
        let mut ids = BTreeSet::new();
        s.incidents
            .iter()
            .filter(|i| i.at >= since && i.incident.revision == 1)
            .filter(|i| ids.insert(i.incident.id.clone()))
            .map(|i| (i.incident.cluster.clone(), i.incident.kind.clone()))
            .collect()
    })
}

/// Incident changes seen on the bus more than once (the same id and revision published twice).
fn published_twice(obs: &Observer) -> usize {
    obs.with(|s| {
        let mut seen = BTreeSet::new();
        s.incidents
            .iter()
            .filter(|i| !seen.insert((i.incident.id.clone(), i.incident.revision)))
            .count()
    })
}

/// What a wave saw besides its outcomes.
#[derive(Debug, Default)]
struct Seen {
    /// Incidents of kinds not injected on their cluster, opened during the wave.
    unexpected: Vec<(String, String)>,
    /// Injected (cluster, kind) opened more than once (it resolved and reopened: flapping).
    flapped: Vec<(String, String)>,
}

/// Injects `faults` (class lists per cluster) at once, waits for each incident, heals them, and waits for
/// each resolution.
async fn wave(
    sys: &System,
    obs: &Observer,
    rec: &Recorder,
    faults: &[(String, Vec<Class>)],
    wait: Duration,
) -> Result<(Vec<Outcome>, Seen)> {
    let started = Instant::now();
    let mut injected = Vec::new();
    for (cluster, classes) in faults {
        for c in classes {
            let t0 = Instant::now();
            sys.fault(cluster, c.fault, true, c.params).await?;
            rec.mark(format!("{} on {cluster}", c.fault));
            injected.push((cluster.clone(), *c, t0));
        }
    }
    let mut outcomes: Vec<Outcome> = injected
        .iter()
        .map(|(cluster, c, _)| Outcome {
            class: *c,
            cluster: cluster.clone(),
            to_incident: None,
            to_resolved: None,
            incident: None,
        })
        .collect();
    loop {
        let mut all = true;
        for (o, (_, c, t0)) in outcomes.iter_mut().zip(&injected) {
            if o.incident.is_none() {
                match open_incident(obs, &o.cluster, c.kind, *t0) {
                    Some((secs, inc)) => {
                        rec.point(&format!("faults/to-incident/{}", c.fault), "s", secs);
                        o.to_incident = Some(secs);
                        o.incident = Some(inc);
                    }
                    None => all = false,
                }
            }
        }
        let budget = wait
            + Duration::from_secs(
                injected
                    .iter()
                    .map(|(_, c, _)| c.defined_after_s)
                    .max()
                    .unwrap_or(0),
            );
        if all || started.elapsed() > budget {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // what else opened while the faults were on: expected kinds on the faulted clusters are not false
    let expected: BTreeSet<(String, &str)> = injected
        .iter()
        .map(|(cluster, c, _)| (cluster.clone(), c.kind))
        .collect();
    let mut unexpected: Vec<(String, String)> = opened_since(obs, started)
        .into_iter()
        .filter(|(cluster, kind)| !expected.contains(&(cluster.clone(), kind.as_str())))
        .collect();
    // heal
    let healed = Instant::now();
    for (cluster, c, _) in &injected {
        if !c.one_shot {
            sys.fault(cluster, c.fault, false, &[]).await?;
            rec.mark(format!("{} off {cluster}", c.fault));
        }
    }
    loop {
        let mut all = true;
        for o in outcomes.iter_mut() {
            if o.to_resolved.is_some() {
                continue;
            }
            let Some(inc) = &o.incident else { continue };
            match resolved(obs, &inc.id, healed) {
                Some(secs) => {
                    rec.point(&format!("faults/to-resolved/{}", o.class.fault), "s", secs);
                    o.to_resolved = Some(secs);
                }
                None => all = false,
            }
        }
        if all || healed.elapsed() > Duration::from_secs(180) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // anything still open that the healing should have ended is reported by the caller; incidents opened
    // during healing count as unexpected too
    unexpected.extend(
        opened_since(obs, healed)
            .into_iter()
            .filter(|(cluster, kind)| !expected.contains(&(cluster.clone(), kind.as_str()))),
    );
    unexpected.sort();
    unexpected.dedup();
    let mut openings: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (cluster, kind) in opened_since(obs, started) {
        if expected.contains(&(cluster.clone(), kind.as_str())) {
            *openings.entry((cluster, kind)).or_default() += 1;
        }
    }
    let flapped = openings
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(k, _)| k)
        .collect();
    Ok((
        outcomes,
        Seen {
            unexpected,
            flapped,
        },
    ))
}

fn evidence_line(inc: &Incident) -> String {
    inc.evidence
        .iter()
        .take(2)
        .map(|e| {
            format!(
                "[{}] {}",
                e.kind,
                e.summary.chars().take(90).collect::<String>()
            )
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

/// Runs it.
pub async fn run(o: &Opts, dir: &std::path::Path) -> Result<(Report, Recorder)> {
    let spec = Spec {
        clusters: o.clusters.unwrap_or(o.pick(4, 6)),
        objects: o.objects.unwrap_or(300),
        churn: o.churn.unwrap_or(1.0),
        events_per_second: o.events_per_second.unwrap_or(2.0),
        scrape_interval_s: 30,
        probe_interval_s: None,
        agents: o.agents.unwrap_or(1),
        correlators: 1,
        tsdbs: 1,
        accounting: false,
        rate: None,
        nats_nodes: 1,
        alerts_routing: None,
        outbox_max_bytes: None,
        release: None,
    };
    let quiet_s = o.duration.unwrap_or(o.pick(40, 1800));
    let classes: Vec<Class> = CLASSES
        .iter()
        .filter(|c| !o.short || c.short)
        .copied()
        .collect();
    let mut r = Report::new(
        "faults",
        o.short,
        serde_json::json!({"spec": spec, "quiet_s": quiet_s,
                           "classes": classes.iter().map(|c| c.fault).collect::<Vec<_>>(),
                           "pairs": if o.short { &PAIRS[..1] } else { PAIRS },
                           "settings": "defaults"}),
    );
    let rec = Recorder::new();
    let mut sys = System::start(spec.clone(), dir, o.bins()?).await?;
    let obs = Observer::start(&sys, &rec, Duration::from_secs(1), false).await?;
    rec.mark("system up");
    let clusters = sys.clusters.clone();

    // quiet: churn and events go on, and watches break; nothing should open
    tokio::time::sleep(Duration::from_secs(o.pick(30, 60))).await;
    let quiet_from = Instant::now();
    rec.mark("quiet period");
    let third = Duration::from_secs(quiet_s / 3);
    tokio::time::sleep(third).await;
    sys.fault(&clusters[0], "watch-disconnect", true, &[])
        .await?;
    rec.mark("watch-disconnect");
    tokio::time::sleep(third).await;
    sys.fault(&clusters[clusters.len() - 1], "watch-expire", true, &[])
        .await?;
    rec.mark("watch-expire");
    tokio::time::sleep(third).await;
    let false_quiet = opened_since(&obs, quiet_from);
    let (false_fleet, event_fleet) = super::fleet_phase::false_fleet(&obs, quiet_from);
    let cluster_days = clusters.len() as f64 * quiet_from.elapsed().as_secs_f64() / 86_400.0;

    // waves: one class per cluster at once
    let mut outcomes = Vec::new();
    let mut unexpected = Vec::new();
    let mut flapped = Vec::new();
    for chunk in classes.chunks(clusters.len()) {
        let faults: Vec<(String, Vec<Class>)> = chunk
            .iter()
            .zip(&clusters)
            .map(|(c, cluster)| (cluster.clone(), vec![*c]))
            .collect();
        let (o, seen) = wave(&sys, &obs, &rec, &faults, Duration::from_secs(120)).await?;
        outcomes.extend(o);
        unexpected.extend(seen.unexpected);
        flapped.extend(seen.flapped);
    }
    // pairs: two faults on one cluster
    let pairs = if o.short { &PAIRS[..1] } else { PAIRS };
    let faults: Vec<(String, Vec<Class>)> = pairs
        .iter()
        .zip(&clusters)
        .map(|((a, b), cluster)| (cluster.clone(), vec![class(a), class(b)]))
        .collect();
    let (pair_outcomes, seen) = wave(&sys, &obs, &rec, &faults, Duration::from_secs(120)).await?;
    unexpected.extend(seen.unexpected);
    flapped.extend(seen.flapped);

    // failures across clusters: one fleet incident each
    super::fleet_phase::run(o, &sys, &obs, &rec, &mut r).await?;

    // figures per class
    let mut missed = Vec::new();
    let mut wrong_first = Vec::new();
    let mut slow = Vec::new();
    let mut unresolved = Vec::new();
    let mut times = Vec::new();
    let mut resolves = Vec::new();
    for out in &outcomes {
        let c = out.class;
        let goal = 30.0 + c.defined_after_s as f64;
        match (&out.incident, out.to_incident) {
            (Some(inc), Some(secs)) => {
                if c.defined_after_s == 0 {
                    times.push(secs);
                }
                if secs > goal {
                    slow.push(format!("{} {secs:.1} s", c.fault));
                }
                if !c.first.holds(inc) {
                    wrong_first.push(format!(
                        "{}: expected {}, got {}",
                        c.fault,
                        c.first.describe(),
                        evidence_line(inc)
                    ));
                }
                match out.to_resolved {
                    Some(s) => resolves.push(s),
                    None => unresolved.push(c.fault),
                }
                r.figure(
                    format!("{} → {} ({})", c.fault, c.kind, out.cluster),
                    format!(
                        "{secs:.1} s to incident{}; resolved {} after healing; first evidence: {}",
                        if c.defined_after_s > 0 {
                            format!(" (stuck is defined as {} s)", c.defined_after_s)
                        } else {
                            String::new()
                        },
                        out.to_resolved
                            .map_or("not within 180 s".into(), |s| format!("{s:.1} s")),
                        evidence_line(inc)
                    ),
                );
            }
            _ => {
                missed.push(format!("{} on {}", c.fault, out.cluster));
                r.figure(
                    format!("{} → {} ({})", c.fault, c.kind, out.cluster),
                    "no incident",
                );
            }
        }
    }
    let t = Summary::of(&times);
    let rs = Summary::of(&resolves);
    r.figure("injection → incident, every class", t.line("s"));
    r.figure("healing → resolved, every class", rs.line("s"));
    r.invariant(
        "every fault class became its incident",
        missed.is_empty(),
        if missed.is_empty() {
            format!("{} of {}", outcomes.len(), outcomes.len())
        } else {
            format!("missed: {}", missed.join(", "))
        },
    );
    r.invariant(
        "the causal evidence ranks first",
        wrong_first.is_empty(),
        if wrong_first.is_empty() {
            "every class".into()
        } else {
            wrong_first.join("; ")
        },
    );
    r.goal(
        "every fault class within 30 s (a condition defined by a duration: within it + 30 s)",
        slow.is_empty() && missed.is_empty(),
        if slow.is_empty() {
            format!("slowest {:.1} s", t.max)
        } else {
            format!("slower: {}", slow.join(", "))
        },
    );
    r.goal(
        "every incident resolves after healing (within 180 s)",
        unresolved.is_empty(),
        if unresolved.is_empty() {
            format!("slowest {:.1} s", rs.max)
        } else {
            format!("still open: {unresolved:?}")
        },
    );

    // pairs
    let mut by_cluster: BTreeMap<&str, Vec<&Outcome>> = BTreeMap::new();
    for out in &pair_outcomes {
        by_cluster
            .entry(out.cluster.as_str())
            .or_default()
            .push(out);
    }
    let mut pair_problems = Vec::new();
    for (cluster, outs) in &by_cluster {
        let ids: BTreeSet<&str> = outs
            .iter()
            .filter_map(|o| o.incident.as_ref().map(|i| i.id.as_str()))
            .collect();
        let line = outs
            .iter()
            .map(|o| {
                format!(
                    "{} → {}",
                    o.class.fault,
                    o.incident.as_ref().map_or("none".into(), |i| format!(
                        "{} in {:.1} s, first evidence: {}",
                        i.kind,
                        o.to_incident.unwrap_or_default(),
                        evidence_line(i)
                    ))
                )
            })
            .collect::<Vec<_>>()
            .join(" | ");
        r.figure(format!("pair on {cluster}"), line);
        if ids.len() != outs.len() {
            pair_problems.push(format!(
                "{cluster}: {} incidents for {} faults",
                ids.len(),
                outs.len()
            ));
        }
        for o in outs {
            if let Some(inc) = &o.incident
                && !o.class.first.holds(inc)
            {
                pair_problems.push(format!(
                    "{cluster} {}: evidence {}",
                    o.class.fault,
                    evidence_line(inc)
                ));
            }
        }
    }
    r.invariant(
        "two faults on one cluster are two incidents, each with its own evidence first",
        pair_problems.is_empty() && !by_cluster.is_empty(),
        if pair_problems.is_empty() {
            format!("{} pairs", by_cluster.len())
        } else {
            pair_problems.join("; ")
        },
    );

    // false incidents
    let per_day = false_quiet.len() as f64 / cluster_days.max(1e-9);
    r.figure(
        "false incidents in the quiet period",
        format!(
            "{} in {:.2} cluster-hours ({per_day:.1} per cluster-day){}",
            false_quiet.len(),
            cluster_days * 24.0,
            if false_quiet.is_empty() {
                String::new()
            } else {
                format!(": {false_quiet:?}")
            }
        ),
    );
    r.figure(
        "fleet incidents in the quiet period",
        format!(
            "{} of a cluster incident kind{}; {event_fleet} of event problems (the simulator's churn makes the same \
             warning events on several clusters: real, and common to them)",
            false_fleet.len(),
            if false_fleet.is_empty() {
                String::new()
            } else {
                format!(": {false_fleet:?}")
            }
        ),
    );
    r.goal(
        "no fleet incident of a cluster incident kind in the quiet period",
        false_fleet.is_empty(),
        format!("{false_fleet:?}"),
    );
    r.figure(
        "incidents of kinds not injected, during the waves",
        if unexpected.is_empty() {
            "none".into()
        } else {
            format!("{unexpected:?}")
        },
    );
    r.goal(
        "no incident flaps (resolves and reopens) while its fault is on or healing",
        flapped.is_empty(),
        if flapped.is_empty() {
            "none".into()
        } else {
            format!("{flapped:?}")
        },
    );
    r.goal(
        "≤ 1 false incident per cluster-day (quiet period with churn and watch breaks)",
        per_day <= 1.0,
        format!(
            "{per_day:.1} per cluster-day over {:.2} cluster-hours",
            cluster_days * 24.0
        ),
    );
    let twice = published_twice(&obs);
    r.goal(
        "each incident change published once (no re-sends without a crash)",
        twice == 0,
        format!("{twice} changes seen twice on fleet.incident.>"),
    );
    let mut lines: Vec<(String, String)> = classes
        .iter()
        .map(|c| {
            (
                c.fault.to_string(),
                format!("faults/to-incident/{}", c.fault),
            )
        })
        .collect();
    lines.sort();
    lines.dedup();
    r.plot(
        "time-to-incident",
        "Injection → incident visible, per fault class",
        "seconds",
        lines,
    );
    let mut lines: Vec<(String, String)> = classes
        .iter()
        .filter(|c| c.defined_after_s == 0)
        .map(|c| {
            (
                c.fault.to_string(),
                format!("faults/to-resolved/{}", c.fault),
            )
        })
        .collect();
    lines.sort();
    r.plot(
        "time-to-resolved",
        "Healing → incident resolved, per fault class",
        "seconds",
        lines,
    );
    obs.stop().await;
    report_processes(&mut r, &rec);
    r.note("Default settings: probes every 15 s (API server 5 s, etcd 10 s), re-run every 3 s while failing and within 0.5 s of a watched change; the correlator's default rules (3 rounds in a row for most, `for` 10–20 s where a brief dip is normal). Resolution needs 2–3 healthy rounds at the normal interval (hysteresis).");
    r.note("A finalizer is stuck by definition after `probes.terminating_after_s` (300 s): its goal is that plus 30 s. The warning burst is one-shot (450 warnings at once); its event-storm resolves when the rate falls.");
    sys.stop();
    Ok((r, rec))
}
