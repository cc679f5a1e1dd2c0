//! Fleet judgement end to end, as `./scripts/up` runs it (six simulated clusters, the agent, the hub): the
//! same fault on three clusters at once becomes one fleet incident with the three cluster incidents as its
//! members, `multipilot incidents` groups them, the alert router pages the fleet incident once and mutes
//! the members, and healing the clusters resolves it; an ingress setting changed on one cluster shows in
//! the fleet-consistency report.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use common::system::System;
use futures::StreamExt;
use multipilot_schemas::Envelope;
use multipilot_schemas::payload::{FleetIncident, IncidentStatus, Notification, SuspectVerdict};
use serde_json::Value;

const FAILING: [&str; 3] = ["prod-euw-1", "prod-wus2-4", "staging-fra-5"];

fn cli(sys: &System, args: &[&str]) -> Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_multipilot"))
        .args(args)
        .env(
            "MULTIPILOT_NATS__URL",
            format!("nats://127.0.0.1:{}", sys.var("MULTIPILOT_NATS_PORT")),
        )
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "multipilot {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn fleet_incidents(sys: &System, all: bool) -> Result<Vec<FleetIncident>> {
    let mut args = vec!["incidents", "--fleet", "-o", "json"];
    if all {
        args.push("--all");
    }
    Ok(serde_json::from_str(&cli(sys, &args)?)?)
}

/// A JSON answer of an API of the hub, `None` until there is one.
async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
    token: &str,
) -> Option<T> {
    http.get(url)
        .bearer_auth(token)
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

async fn fault(sys: &System, cluster: &str, on: bool) -> Result<()> {
    sys.fault(cluster, "coredns-down", on).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_failure_on_three_clusters_is_one_fleet_incident_paged_once() -> Result<()> {
    let sys = System::up()?;
    let nats =
        async_nats::connect(format!("127.0.0.1:{}", sys.var("MULTIPILOT_NATS_PORT"))).await?;
    // every notification the router sends on the default route (`fleet.alert.fleet`)
    let mut notes = nats.subscribe("fleet.alert.>").await?;
    multipilot_testkit::wait::round_trip(&nats).await?;

    // an ingress setting changed on one prod cluster: the fleet-consistency report names it, and
    // nothing else differs in the simulator's quiet fleet
    let patched = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(sys.data.path().join("sim/kubeconfig.yaml"))
        .args([
            "--context",
            "prod-wus2-4",
            "-n",
            "ingress-nginx",
            "patch",
            "configmap",
            "ingress-nginx-controller",
            "--type",
            "merge",
            "-p",
            r#"{"data":{"proxy-read-timeout":"20"}}"#,
        ])
        .output()?;
    anyhow::ensure!(
        patched.status.success(),
        "{}",
        String::from_utf8_lossy(&patched.stderr)
    );
    let divergent: Vec<multipilot_schemas::payload::SettingDivergence> = common::eventually_every(
        "the ingress timeout in the consistency report",
        60,
        Duration::from_millis(500),
        async || {
            let out = cli(&sys, &["compliance", "--consistency", "-o", "json"]).ok()?;
            let v: Vec<multipilot_schemas::payload::SettingDivergence> =
                serde_json::from_str(&out).ok()?;
            // (a cluster is compared once its facts, and so its env, have arrived)
            v.iter()
                .any(|d| d.setting == "proxy-read-timeout" && d.group == "env=prod")
                .then_some(v)
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", sys.logs()))?;
    assert_eq!(divergent.len(), 1, "{divergent:#?}");
    let d = &divergent[0];
    assert_eq!(
        (d.object.as_str(), d.group.as_str()),
        (
            "ConfigMap ingress-nginx/ingress-nginx-controller",
            "env=prod"
        )
    );
    let values: BTreeSet<(&str, &str)> = d
        .values
        .iter()
        .flat_map(|v| v.clusters.iter().map(|c| (v.value.as_str(), c.as_str())))
        .collect();
    assert_eq!(
        values,
        BTreeSet::from([("60", "prod-euw-1"), ("20", "prod-wus2-4")])
    );

    // every cluster judged (its facts, labels and versions known) before anything breaks
    common::eventually_every(
        "a compliance report of every cluster",
        90,
        Duration::from_millis(500),
        async || {
            let out = cli(&sys, &["compliance", "--by-cluster", "-o", "json"]).ok()?;
            let v: Vec<Value> = serde_json::from_str(&out).ok()?;
            (v.len() == 6).then_some(())
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", sys.logs()))?;

    // the simulator's crashlooping web pods (one in every fourth namespace, on every cluster) are one
    // fleet problem per workload, though 1.24 and 1.25 kubelets word their BackOff events otherwise than
    // the later ones: one fleet incident of the six clusters, not one per wording
    let back_off = common::eventually_every(
        "one fleet incident of a crashlooping web pod on the six clusters",
        120,
        Duration::from_millis(500),
        async || {
            fleet_incidents(&sys, false).ok()?.into_iter().find(|f| {
                f.labels.get("alertname").map(String::as_str) == Some("BackOff")
                    && f.members
                        .iter()
                        .map(|m| m.cluster.as_str())
                        .collect::<BTreeSet<_>>()
                        .len()
                        == 6
            })
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{:#?}", fleet_incidents(&sys, false)))?;
    eprintln!("{}", back_off.summary);
    // (the simulator's kubelets back off only from restarting crashed containers)
    let crashlooping: Vec<(String, String)> = fleet_incidents(&sys, false)?
        .iter()
        .filter(|f| f.labels.get("alertname").map(String::as_str) == Some("BackOff"))
        .map(|f| {
            let l = |k: &str| f.labels.get(k).cloned().unwrap_or_default();
            (l("namespace"), l("object"))
        })
        .collect();
    let workloads: BTreeSet<&(String, String)> = crashlooping.iter().collect();
    assert_eq!(
        workloads.len(),
        crashlooping.len(),
        "one workload's crashloop is several fleet incidents: {crashlooping:#?}"
    );

    let started = Instant::now();
    for c in FAILING {
        fault(&sys, c, true).await?;
    }
    let f = common::eventually_every(
        "one fleet incident of the three clusters",
        120,
        Duration::from_millis(500),
        async || {
            fleet_incidents(&sys, false)
                .ok()?
                .into_iter()
                .find(|f| f.kind == "dns-failure" && f.members.len() == 3)
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", sys.logs()))?;
    eprintln!(
        "fleet incident with 3 members {:.1}s after the faults: {}",
        started.elapsed().as_secs_f64(),
        f.summary
    );
    let members: BTreeSet<&str> = f.members.iter().map(|m| m.cluster.as_str()).collect();
    assert_eq!(members, BTreeSet::from(FAILING));
    assert_eq!(f.fleet_size, 6);
    assert_eq!(f.status, IncidentStatus::Open);
    assert!(f.summary.starts_with("dns-failure on 3 of 6 clusters ("));
    assert_eq!(f.labels.get("scope").map(String::as_str), Some("fleet"));
    // what they share is true of the simulator's fleet: prod-euw-1 and staging-fra-5 are owned by
    // platform, and no healthy cluster is
    let owner = f
        .shared
        .iter()
        .find(|s| s.attribute == "label:owner")
        .with_context(|| format!("{:#?}", f.shared))?;
    assert_eq!(
        (owner.value.as_str(), owner.failing, owner.healthy),
        ("platform", 2, 0)
    );
    // the demo's GitOps releases (its policy bundles) reached every cluster shortly before: weighed as
    // suspects, and named as ordinary churn since the healthy clusters got them too
    let weighed = common::eventually_every(
        "the releases weighed as suspects",
        60,
        Duration::from_millis(500),
        async || {
            fleet_incidents(&sys, false)
                .ok()?
                .into_iter()
                .find(|x| x.id == f.id && x.suspects.iter().any(|s| s.release.is_some()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{:#?}", fleet_incidents(&sys, false)))?;
    let release = weighed
        .suspects
        .iter()
        .find(|s| s.release.is_some())
        .context("a release suspect")?;
    assert_eq!(
        (release.verdict, release.healthy, release.healthy_total),
        (SuspectVerdict::Common, 3, 3),
        "{release:#?}"
    );

    // only one fleet incident of the kind, whatever the order the members came in
    assert_eq!(
        fleet_incidents(&sys, false)?
            .iter()
            .filter(|f| f.kind == "dns-failure")
            .count(),
        1
    );

    // the CLI groups the members under it
    let table = cli(&sys, &["incidents"])?;
    let fleet_row = table
        .lines()
        .position(|l| l.contains("FLEET (3)") && l.contains("dns-failure"))
        .with_context(|| table.clone())?;
    let member_rows: Vec<&str> = table
        .lines()
        .skip(fleet_row + 1)
        .filter(|l| l.starts_with("  └ ") && l.contains("dns-failure"))
        .collect();
    assert_eq!(member_rows.len(), 3, "{table}");
    // (an event problem that is part of them — the coredns pods' readiness — says so in a `part of:`
    // line, not a row)
    assert!(
        !table.lines().any(|l| !l.starts_with("  └ ")
            && l.contains("dns-failure")
            && !l.contains("FLEET")
            && !l.trim_start().starts_with("part of:")),
        "a member is listed on its own too:\n{table}"
    );

    // the alert router: the fleet alert active, each member's alert muted by it
    let alerts_api = format!(
        "http://127.0.0.1:{}/api/v2/alerts",
        sys.var("MULTIPILOT_ALERTS_PORT")
    );
    let token = sys.token("viewer")?;
    let http = reqwest::Client::new();
    common::eventually_every(
        "the fleet alert active and its members muted by it",
        60,
        Duration::from_millis(500),
        async || {
            let alerts: Vec<Value> = get_json(&http, &alerts_api, &token).await?;
            let fleet = alerts.iter().find(|a| {
                a["labels"]["scope"] == "fleet" && a["labels"]["alertname"] == "dns-failure"
            })?;
            let members: Vec<&Value> = alerts
                .iter()
                .filter(|a| {
                    a["labels"]["alertname"] == "dns-failure" && a["labels"]["scope"].is_null()
                })
                .collect();
            (fleet["status"]["state"] == "active"
                && members.len() == 3
                && members.iter().all(|m| {
                    m["status"]["state"] == "suppressed"
                        && m["status"]["inhibitedBy"][0] == fleet["fingerprint"]
                }))
            .then_some(())
        },
    )
    .await?;

    // the console shows it with its members, what they share and the suspects
    let console = format!(
        "http://127.0.0.1:{}/api/v1/fleet-incidents",
        sys.var("MULTIPILOT_CONSOLE_PORT")
    );
    let shown = common::eventually_every(
        "the console's fleet incident",
        30,
        Duration::from_millis(500),
        async || {
            let list: Vec<FleetIncident> = get_json(&http, &console, &token).await?;
            list.into_iter()
                .find(|x| x.id == f.id && x.members.len() == 3)
        },
    )
    .await?;
    assert!(
        shown.shared.iter().any(|s| s.attribute == "label:owner"),
        "{shown:#?}"
    );

    // paged once: the fleet alert is notified (after group_wait, 30 s), no member on its own
    let mut fleet_pages: std::collections::BTreeMap<String, u32> = Default::default();
    let mut member_pages = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(75);
    while let Ok(Some(m)) = tokio::time::timeout_at(deadline, notes.next()).await {
        let Ok(env) = rmp_serde::from_slice::<Envelope<Notification>>(&m.payload) else {
            continue;
        };
        // the incident, and the warning events of the DNS pods that go with it (kube-dns `Unhealthy`)
        for a in env.payload.alerts.iter().filter(|a| {
            matches!(
                a.labels.get("alertname").map(String::as_str),
                Some("dns-failure" | "Unhealthy")
            ) && a.state == multipilot_schemas::payload::AlertState::Firing
        }) {
            if a.labels.get("scope").map(String::as_str) == Some("fleet") {
                *fleet_pages
                    .entry(a.labels.get("alertname").cloned().unwrap_or_default())
                    .or_default() += 1;
            } else {
                member_pages.push(format!(
                    "{} {}",
                    a.labels.get("alertname").cloned().unwrap_or_default(),
                    a.labels.get("cluster").cloned().unwrap_or_default()
                ));
            }
        }
        if !fleet_pages.is_empty()
            && tokio::time::Instant::now() + Duration::from_secs(10) > deadline
        {
            break;
        }
    }
    assert_eq!(
        fleet_pages.get("dns-failure"),
        Some(&1),
        "the fleet incident is paged once: {fleet_pages:?}"
    );
    assert!(
        fleet_pages.values().all(|n| *n == 1),
        "each fleet problem is paged once: {fleet_pages:?}"
    );
    eprintln!("fleet pages: {fleet_pages:?}");
    assert!(
        member_pages.is_empty(),
        "members paged on their own: {member_pages:?}"
    );

    // healed: the members resolve, and the fleet incident with the last of them
    for c in FAILING {
        fault(&sys, c, false).await?;
    }
    let resolved = common::eventually_every(
        "the fleet incident resolved",
        120,
        Duration::from_millis(500),
        async || {
            fleet_incidents(&sys, true)
                .ok()?
                .into_iter()
                .find(|x| x.id == f.id && x.status == IncidentStatus::Resolved)
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", sys.logs()))?;
    assert!(
        resolved
            .members
            .iter()
            .all(|m| m.status == IncidentStatus::Resolved && m.left_because.is_empty())
    );
    // (event problems end a quarter of an hour after their events stop: the Unhealthy one is still open)
    assert!(
        !fleet_incidents(&sys, false)?
            .iter()
            .any(|f| f.kind == "dns-failure")
    );
    Ok(())
}
