//! The faults drill's fleet phase: failures across clusters judged as one (`FleetIncident`).
//!
//! Cases: the same fault on the clusters that share one CNI, at once and then staggered; the same fault on
//! two clusters a release's batch record reached just before (the simulator has no release that breaks a
//! cluster: the drill publishes the record as the release role would, then injects the fault there); a
//! cluster going unreachable (its incident carries what it takes down); and an ingress setting changed on
//! one cluster of an env (the simulator's `ingress-setting`), which no alert catches but the consistency
//! report names. Per case: seconds from the second member's
//! incident to the fleet incident, whether the top shared attribute and the first suspect are the true ones,
//! notifications sent. False fleet incidents are counted over the quiet period by the caller.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Result;
use chrono::Utc;
use multipilot_schemas::payload::{
    ClusterFacts, FleetIncident, IncidentStatus, ReleaseEvent, SuspectVerdict,
};
use multipilot_schemas::{Envelope, stable_id, subject};

use super::Opts;
use crate::observe::Observer;
use crate::record::Recorder;
use crate::report::Report;
use crate::system::System;

/// The kind the drill's fault becomes.
const KIND: &str = "dns-failure";
const FAULT: &str = "coredns-down";

/// Each cluster's facts, as the agents last published them.
async fn facts(sys: &System) -> BTreeMap<String, ClusterFacts> {
    let mut out = BTreeMap::new();
    let Ok(stream) = sys.js.get_stream("FLEET_FACTS").await else {
        return out;
    };
    for c in &sys.clusters {
        if let Ok(m) = stream
            .get_last_raw_message_by_subject(&subject::facts(c))
            .await
            && let Ok(env) = rmp_serde::from_slice::<Envelope<ClusterFacts>>(&m.payload)
        {
            out.insert(c.clone(), env.payload);
        }
    }
    out
}

/// The fleet incidents of the drill's kind first seen after `since`: (first seen, latest revision).
fn fleet_since(obs: &Observer, since: Instant) -> BTreeMap<String, (Instant, FleetIncident)> {
    obs.with(|s| {
        let mut out: BTreeMap<String, (Instant, FleetIncident)> = BTreeMap::new();
        for (at, f) in s
            .fleet
            .iter()
            .filter(|(at, f)| *at >= since && f.kind == KIND)
        {
            let e = out.entry(f.id.clone()).or_insert((*at, f.clone()));
            if f.revision >= e.1.revision {
                e.1 = f.clone();
            }
        }
        out
    })
}

/// When the `n`-th of `clusters` opened its incident of the drill's kind after `since`.
fn nth_member(obs: &Observer, clusters: &[String], since: Instant, n: usize) -> Option<Instant> {
    obs.with(|s| {
        let mut firsts: BTreeMap<&str, Instant> = BTreeMap::new();
        for i in s.incidents.iter().filter(|i| {
            i.at >= since
                && i.incident.kind == KIND
                && i.incident.status != IncidentStatus::Resolved
                && clusters.contains(&i.incident.cluster)
        }) {
            firsts.entry(i.incident.cluster.as_str()).or_insert(i.at);
        }
        let mut times: Vec<Instant> = firsts.into_values().collect();
        times.sort();
        times.get(n.saturating_sub(1)).copied()
    })
}

/// The result of one case.
struct Case {
    /// The fleet incidents of the kind opened during the case.
    opened: Vec<FleetIncident>,
    /// Second member's incident → the fleet incident first seen with two members.
    to_fleet: Option<f64>,
    /// Notifications sent during the case.
    notifications: usize,
}

/// Injects the fault on `clusters`, `stagger` apart, waits for one fleet incident holding all of them,
/// heals, and waits for it to resolve.
async fn case(
    sys: &System,
    obs: &Observer,
    rec: &Recorder,
    name: &str,
    clusters: &[String],
    stagger: Duration,
) -> Result<Case> {
    let since = Instant::now();
    let notes_before = obs.with(|s| s.notifications.len());
    for (i, c) in clusters.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(stagger).await;
        }
        sys.fault(c, FAULT, true, &[]).await?;
        rec.mark(format!("{name}: {FAULT} on {c}"));
    }
    let want: BTreeSet<&str> = clusters.iter().map(String::as_str).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let all = fleet_since(obs, since).values().any(|(_, f)| {
            let m: BTreeSet<&str> = f.members.iter().map(|m| m.cluster.as_str()).collect();
            want.is_subset(&m)
        });
        if all {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // the first revision seen with two members
    let second = nth_member(obs, clusters, since, 2);
    let first_two = obs.with(|s| {
        s.fleet
            .iter()
            .find(|(at, f)| *at >= since && f.kind == KIND && f.members.len() >= 2)
            .map(|(at, _)| *at)
    });
    let to_fleet = match (second, first_two) {
        (Some(a), Some(b)) => Some(b.saturating_duration_since(a).as_secs_f64()),
        _ => None,
    };
    // heal, and wait for the fleet incident to resolve with its members
    for c in clusters {
        sys.fault(c, FAULT, false, &[]).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    while Instant::now() < deadline {
        let open = fleet_since(obs, since)
            .values()
            .any(|(_, f)| f.status != IncidentStatus::Resolved);
        if !open {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    rec.mark(format!("{name}: healed"));
    Ok(Case {
        opened: fleet_since(obs, since)
            .into_values()
            .map(|(_, f)| f)
            .collect(),
        to_fleet,
        notifications: obs.with(|s| s.notifications.len()) - notes_before,
    })
}

/// Publishes a release's batch record for `clusters`, as the release role does when a batch starts.
async fn release_batch(sys: &System, name: &str, clusters: &[String]) -> Result<()> {
    let now = Utc::now();
    let e = ReleaseEvent {
        release: name.into(),
        revision: 1,
        what: multipilot_schemas::payload::ReleaseEntry::Batch,
        state: multipilot_schemas::payload::ReleaseState::Applying,
        actor: "drill".into(),
        batch: Some(1),
        clusters: clusters.to_vec(),
        ok: true,
        summary: format!("batch 1 starts: {}", clusters.join(", ")),
        detail: serde_json::json!({}),
        commit: Some(stable_id(&[name])[..12].to_string()),
        at: now,
    };
    let env = Envelope::new("fleet", "release/drill", now, 1, e);
    multipilot_bus::publish::publish_one(
        &sys.js,
        subject::release(name, "batch"),
        stable_id(&[name, "batch", "1"]),
        &env,
    )
    .await?;
    Ok(())
}

fn describe(f: Option<&FleetIncident>) -> String {
    f.map_or("no fleet incident".into(), |f| {
        let top = f
            .shared
            .first()
            .map_or("no shared attribute".into(), |s| s.support.clone());
        let first = f
            .suspects
            .iter()
            .find(|s| s.verdict == SuspectVerdict::Suspect)
            .map_or("no suspect".into(), |s| s.summary.clone());
        format!(
            "{} members; top shared: {top}; first suspect: {first}",
            f.members.len()
        )
    })
}

/// Runs the fleet phase and adds its figures and checks to `r`.
pub async fn run(
    o: &Opts,
    sys: &System,
    obs: &Observer,
    rec: &Recorder,
    r: &mut Report,
) -> Result<()> {
    let facts = facts(sys).await;
    // the clusters that share a CNI (the larger group; the simulator alternates calico and cilium)
    let mut by_cni: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (c, f) in &facts {
        if let Some(cni) = &f.cni {
            by_cni.entry(cni.name.clone()).or_default().push(c.clone());
        }
    }
    let Some((cni, failing)) = by_cni
        .into_iter()
        .filter(|(_, v)| v.len() >= 2)
        .max_by_key(|(_, v)| v.len())
    else {
        r.figure(
            "fleet phase",
            "skipped: no two clusters share a CNI (facts missing?)",
        );
        return Ok(());
    };
    let failing: Vec<String> = failing.into_iter().take(3).collect();

    // 1. at once
    rec.mark("fleet: at once");
    let at_once = case(sys, obs, rec, "at once", &failing, Duration::ZERO).await?;
    let f = at_once.opened.first();
    let one = at_once.opened.len() == 1
        && f.is_some_and(|f| {
            failing
                .iter()
                .all(|c| f.members.iter().any(|m| &m.cluster == c))
        });
    r.invariant(
        format!(
            "the same fault on {} clusters at once is one fleet incident of them all",
            failing.len()
        ),
        one,
        format!(
            "{} fleet incident(s): {}",
            at_once.opened.len(),
            describe(f)
        ),
    );
    // the true attribute: their CNI, which no other cluster runs
    let top_is_cni = f.is_some_and(|f| {
        let score = |s: &multipilot_schemas::payload::SharedAttribute| {
            s.failing as f64 / s.failing_total.max(1) as f64
                - s.healthy as f64 / s.healthy_total.max(1) as f64
        };
        let best = f.shared.first().map(score).unwrap_or(f64::MIN);
        f.shared
            .iter()
            .any(|s| s.attribute == "cni" && s.value.starts_with(&cni) && score(s) >= best)
    });
    r.goal(
        format!("the top shared attribute is the true one (cni {cni})"),
        top_is_cni,
        describe(f),
    );
    r.figure(
        format!("at once on {}", failing.join(", ")),
        format!(
            "second member → fleet incident {}; {} notification(s); {}",
            at_once
                .to_fleet
                .map_or("never".into(), |s| format!("{s:.1} s")),
            at_once.notifications,
            describe(f)
        ),
    );

    // 2. staggered over two minutes (20 s in the short run)
    rec.mark("fleet: staggered");
    let stagger = Duration::from_secs(o.pick(10, 60));
    let staggered = case(sys, obs, rec, "staggered", &failing, stagger).await?;
    r.goal(
        "the same fault staggered over the window is one fleet incident",
        staggered.opened.len() == 1,
        format!(
            "{} fleet incident(s), {} s apart: {}",
            staggered.opened.len(),
            stagger.as_secs(),
            describe(staggered.opened.first())
        ),
    );
    r.figure(
        format!("staggered {} s apart", stagger.as_secs()),
        format!(
            "second member → fleet incident {}; {} notification(s)",
            staggered
                .to_fleet
                .map_or("never".into(), |s| format!("{s:.1} s")),
            staggered.notifications
        ),
    );

    // 3. a release that reached two clusters, then the fault there
    rec.mark("fleet: release");
    let two: Vec<String> = sys.clusters.iter().rev().take(2).cloned().collect();
    release_batch(sys, "drill-web", &two).await?;
    // the correlator reads FLEET_RELEASE every 5 s; the failure comes after the release, as in life
    tokio::time::sleep(Duration::from_secs(6)).await;
    let released = case(sys, obs, rec, "release", &two, Duration::ZERO).await?;
    let rf = released.opened.first();
    let named = rf.is_some_and(|f| {
        f.suspects
            .iter()
            .find(|s| s.verdict == SuspectVerdict::Suspect)
            .and_then(|s| s.release.as_ref())
            .is_some_and(|r| r.name == "drill-web")
    });
    r.goal(
        "a release that reached exactly the failing clusters is the first suspect",
        named,
        describe(rf),
    );
    r.figure(
        format!("after a release to {}", two.join(", ")),
        format!(
            "second member → fleet incident {}; {} notification(s); {}",
            released
                .to_fleet
                .map_or("never".into(), |s| format!("{s:.1} s")),
            released.notifications,
            describe(rf)
        ),
    );

    // 4. a cluster unreachable: what it takes down
    rec.mark("fleet: unreachable");
    let victim = sys.clusters[0].clone();
    let since = Instant::now();
    sys.fault(&victim, "unreachable", true, &[]).await?;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut blast = None;
    while Instant::now() < deadline && blast.is_none() {
        blast = obs.with(|s| {
            s.incidents
                .iter()
                .filter(|i| i.at >= since && i.incident.cluster == victim)
                .find_map(|i| i.incident.blast_radius.clone())
        });
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    sys.fault(&victim, "unreachable", false, &[]).await?;
    r.goal(
        "an unreachable cluster's incident says what it takes down",
        blast.is_some(),
        blast
            .as_ref()
            .map_or("no blast radius".into(), |b| b.summary.clone()),
    );

    // 5. an ingress setting changed on one cluster of an env: no alert of its own, but the consistency
    // report names it among its env peers
    let consistency = async || {
        multipilot_bus::request::gather_arrays::<multipilot_schemas::payload::SettingDivergence>(
            &sys.client,
            multipilot_schemas::control::QUERY_CONSISTENCY,
            bytes::Bytes::from_static(b"{}"),
            Duration::from_secs(5),
        )
        .await
    };
    let summaries = |d: &[multipilot_schemas::payload::SettingDivergence]| {
        if d.is_empty() {
            "none".to_string()
        } else {
            d.iter()
                .map(|x| x.summary.clone())
                .collect::<Vec<_>>()
                .join("; ")
        }
    };
    match consistency().await {
        Ok(d) => r.figure(
            "settings that differ among the clusters of one env, before the change",
            summaries(&d),
        ),
        Err(e) => r.figure(
            "settings that differ among the clusters of one env, before the change",
            format!("no answer: {e}"),
        ),
    }
    let mut by_env: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (c, f) in &facts {
        by_env
            .entry(f.labels.get("env").cloned().unwrap_or_default())
            .or_default()
            .push(c.clone());
    }
    if let Some(peers) = by_env
        .values()
        .filter(|v| v.len() >= 2)
        .max_by_key(|v| v.len())
    {
        let changed = peers[0].clone();
        let names = |d: &multipilot_schemas::payload::SettingDivergence| {
            d.setting == "proxy-read-timeout"
                && d.values
                    .iter()
                    .any(|v| v.value == "20" && v.clusters == [changed.clone()])
        };
        let at = Instant::now();
        sys.fault(&changed, "ingress-setting", true, &[]).await?;
        rec.mark(format!("fleet: proxy-read-timeout 20 on {changed}"));
        let mut found = None;
        while at.elapsed() < Duration::from_secs(60) {
            if let Ok(d) = consistency().await
                && let Some(x) = d.iter().find(|x| names(x))
            {
                found = Some((at.elapsed().as_secs_f64(), x.summary.clone()));
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        r.goal(
            "an ingress setting changed on one cluster is in the consistency report within 30 s",
            found.as_ref().is_some_and(|(s, _)| *s <= 30.0),
            found.as_ref().map_or_else(
                || format!("{changed}'s proxy-read-timeout 20 not reported in 60 s"),
                |(s, summary)| format!("{s:.1} s after the change: {summary}"),
            ),
        );
        sys.fault(&changed, "ingress-setting", false, &[]).await?;
        let at = Instant::now();
        let mut gone = None;
        while at.elapsed() < Duration::from_secs(60) {
            if let Ok(d) = consistency().await
                && !d.iter().any(|x| x.setting == "proxy-read-timeout")
            {
                gone = Some(at.elapsed().as_secs_f64());
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        r.figure(
            "the setting set back: gone from the report after",
            gone.map_or("still there after 60 s".into(), |s| format!("{s:.1} s")),
        );
    } else {
        r.figure(
            "an ingress setting changed on one cluster",
            "not run: no env holds two clusters",
        );
    }
    Ok(())
}

/// Fleet incidents first opened after `since`, except event problems: (kind, members).
pub fn false_fleet(obs: &Observer, since: Instant) -> (Vec<(String, usize)>, usize) {
    obs.with(|s| {
        let mut ids = BTreeSet::new();
        let mut kinds = Vec::new();
        let mut events = 0;
        for (_, f) in s
            .fleet
            .iter()
            .filter(|(at, f)| *at >= since && f.revision == 1)
        {
            if !ids.insert(f.id.clone()) {
                continue;
            }
            if f.kind == "event" {
                events += 1;
            } else {
                kinds.push((f.kind.clone(), f.members.len()));
            }
        }
        (kinds, events)
    })
}
