//! `multipilot incidents` and `multipilot compliance`: what the correlator says needs a person.

use std::time::Duration;

use anyhow::{Context as _, Result};
use chrono::Utc;
use futures::StreamExt;
use multipilot_schemas::payload::{
    BlastRadius, CheckStatus, ComplianceReport, FleetIncident, Incident, IncidentStatus,
    SettingDivergence, SuspectVerdict,
};
use multipilot_schemas::{Envelope, subject};

fn ago(t: chrono::DateTime<Utc>) -> String {
    let s = (Utc::now() - t).num_seconds().max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn status(s: IncidentStatus) -> &'static str {
    match s {
        IncidentStatus::Open => "open",
        IncidentStatus::Acknowledged => "acked",
        IncidentStatus::Resolved => "resolved",
    }
}

fn line(i: &Incident) -> String {
    format!(
        "{:<9} {:<8} {:<16} {:<24} {:>5}  {}",
        format!("{:?}", i.severity).to_lowercase(),
        status(i.status),
        i.cluster,
        i.kind,
        ago(i.opened_at),
        i.summary
    )
}

/// What a fleet incident is about: its kind, or for an event problem `event <reason>`.
fn fleet_kind(f: &FleetIncident) -> String {
    match f.labels.get("alertname") {
        Some(reason) if f.kind == "event" => format!("event {reason}"),
        _ => f.kind.clone(),
    }
}

/// A fleet incident's line (`FLEET` where a cluster incident names its cluster).
fn fleet_line(f: &FleetIncident) -> String {
    format!(
        "{:<9} {:<8} {:<16} {:<24} {:>5}  {}",
        format!("{:?}", f.severity).to_lowercase(),
        status(f.status),
        format!("FLEET ({})", f.clusters().len()),
        fleet_kind(f),
        ago(f.opened_at),
        f.summary
    )
}

/// A fleet incident with what it found and the cluster incidents it is part of, then its members (the
/// cluster incidents, when `listed`).
fn print_fleet(f: &FleetIncident, incidents: &[Incident], listed: bool) -> Vec<String> {
    let mut out = vec![fleet_line(f)];
    let pad = format!("{:>70}", "");
    if let Some(br) = &f.blast_radius {
        out.push(format!("{pad}  blast:   {}", br.summary));
    }
    let by = f.accounted_for(incidents);
    if !by.is_empty() {
        let by: Vec<String> = by
            .iter()
            .map(|i| format!("{} on {}", i.kind, i.cluster))
            .collect();
        out.push(format!(
            "{pad}  part of: {} (what each found)",
            by.join(", ")
        ));
    }
    let incidents = if listed { incidents } else { &[] };
    for s in f.shared.iter().take(3) {
        out.push(format!("{pad}  shared:  {}", s.support));
    }
    for s in &f.suspects {
        let what = match s.verdict {
            SuspectVerdict::Suspect => "suspect:",
            _ => "churn:  ",
        };
        out.push(format!("{pad}  {what} {}", s.summary));
    }
    for m in &f.members {
        match incidents.iter().find(|i| i.id == m.incident_id) {
            Some(i) => out.push(format!("  └ {}", line(i))),
            None => out.push(format!(
                "  └ {:<9} {:<8} {:<16} {:<24} {:>5}  {}{}",
                format!("{:?}", m.severity).to_lowercase(),
                status(m.status),
                m.cluster,
                fleet_kind(f),
                ago(m.opened_at),
                m.summary,
                if m.left_because.is_empty() {
                    String::new()
                } else {
                    format!(" (left: {})", m.left_because)
                }
            )),
        }
    }
    out
}

async fn request<T: serde::de::DeserializeOwned>(
    client: &async_nats::Client,
    subject: &str,
    body: &[u8],
) -> Result<Vec<T>> {
    multipilot_bus::request::gather_arrays(
        client,
        subject,
        body.to_vec().into(),
        Duration::from_secs(3),
    )
    .await
    .with_context(|| {
        format!("asking the correlator on {subject} (is `multipilot correlator` or `all` running?)")
    })
}

/// Prints the current incidents, each fleet incident first with its members under it; with `only_fleet`
/// the fleet incidents alone; with `watch`, then every change.
#[allow(clippy::print_stdout)]
pub async fn print(
    client: &async_nats::Client,
    all: bool,
    only_fleet: bool,
    watch: bool,
    output: &str,
) -> Result<()> {
    let body = serde_json::to_string(&multipilot_schemas::control::IncidentsQuery { all })?;
    let mut fleet: Vec<FleetIncident> = match request(
        client,
        multipilot_schemas::control::QUERY_FLEET_INCIDENTS,
        body.as_bytes(),
    )
    .await
    {
        Ok(f) => f,
        // a correlator from before fleet incidents doesn't answer: its cluster incidents still do
        Err(e) if !only_fleet => {
            tracing::debug!(error = %e, "no fleet incidents");
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    fleet.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(b.updated_at.cmp(&a.updated_at))
    });
    let json = output == "json" && !watch;
    // (with the fleet incidents alone, the cluster incidents still say which event problems are
    // part of one of theirs)
    let asked = if only_fleet && json {
        Ok(Vec::new())
    } else {
        request(
            client,
            multipilot_schemas::control::QUERY_INCIDENTS,
            body.as_bytes(),
        )
        .await
    };
    let mut incidents: Vec<Incident> = match asked {
        Ok(i) => i,
        Err(e) if only_fleet => {
            eprintln!("(the cluster incidents did not come: {e:#})");
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    incidents.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(b.updated_at.cmp(&a.updated_at))
    });
    if json {
        if only_fleet {
            println!("{}", serde_json::to_string_pretty(&fleet)?);
        } else {
            println!("{}", serde_json::to_string_pretty(&incidents)?);
        }
        return Ok(());
    }
    println!(
        "{:<9} {:<8} {:<16} {:<24} {:>5}  SUMMARY",
        "SEVERITY", "STATUS", "CLUSTER", "KIND", "AGE"
    );
    let members: std::collections::BTreeSet<&str> = fleet
        .iter()
        .flat_map(|f| f.members.iter().map(|m| m.incident_id.as_str()))
        .collect();
    for f in &fleet {
        for l in print_fleet(f, &incidents, !only_fleet) {
            println!("{l}");
        }
    }
    for i in incidents
        .iter()
        .filter(|i| !only_fleet && !members.contains(i.id.as_str()))
    {
        println!("{}", line(i));
        for e in &i.evidence {
            println!("{:>70}  {}. [{}] {}", "", e.rank, e.kind, e.summary);
            if !e.why.is_empty() {
                println!("{:>70}     why: {}", "", e.why);
            }
        }
    }
    if (only_fleet || incidents.is_empty()) && fleet.is_empty() {
        println!(
            "(no {}{}incidents)",
            if all { "" } else { "open " },
            if only_fleet { "fleet " } else { "" }
        );
    }
    if !watch {
        return Ok(());
    }
    let mut subs = futures::stream::select(
        client.subscribe(subject::FLEET_INCIDENT.all()).await?,
        client.subscribe(subject::INCIDENT.all()).await?,
    );
    while let Some(m) = subs.next().await {
        if subject::FLEET_INCIDENT.contains(&m.subject) {
            match rmp_serde::from_slice::<Envelope<FleetIncident>>(&m.payload) {
                Ok(env) if output == "json" => {
                    println!("{}", serde_json::to_string(&env.payload)?)
                }
                Ok(env) => println!("{}", fleet_line(&env.payload)),
                Err(e) => eprintln!("undecodable fleet incident on {}: {e}", m.subject),
            }
            continue;
        }
        if only_fleet {
            continue;
        }
        match rmp_serde::from_slice::<Envelope<Incident>>(&m.payload) {
            Ok(env) if output == "json" => println!("{}", serde_json::to_string(&env.payload)?),
            Ok(env) => println!("{}", line(&env.payload)),
            Err(e) => eprintln!("undecodable incident on {}: {e}", m.subject),
        }
    }
    Ok(())
}

/// Prints what `cluster`'s loss would take down.
#[allow(clippy::print_stdout)]
pub async fn blast_radius(client: &async_nats::Client, cluster: &str, output: &str) -> Result<()> {
    let body = serde_json::to_vec(&multipilot_schemas::control::BlastRadiusQuery {
        cluster: cluster.to_string(),
    })?;
    let found: Vec<BlastRadius> = request(
        client,
        multipilot_schemas::control::QUERY_BLAST_RADIUS,
        &body,
    )
    .await?;
    let Some(br) = found.into_iter().next() else {
        anyhow::bail!(
            "the correlator knows no cluster {cluster:?} (`multipilot status` and the console list the fleet)"
        );
    };
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(&br)?);
        return Ok(());
    }
    println!("{cluster} {}", br.summary);
    if let Some(t) = br.as_of {
        println!(
            "  as of       {} ({} ago)",
            t.format("%Y-%m-%d %H:%M:%SZ"),
            ago(t)
        );
    }
    println!(
        "  workloads   {} in {} namespaces ({}); {} also run on another cluster that is up",
        br.workloads,
        br.namespaces.len(),
        br.namespaces.join(", "),
        br.elsewhere
    );
    if !br.only_here.is_empty() {
        println!("  only here   {} of them:", br.only_here_total);
        for w in &br.only_here {
            println!("                {w}");
        }
    }
    println!("  services    {}", br.services);
    if !br.exposed.is_empty() {
        println!("  exposed     {}", br.exposed.join(", "));
    }
    if br.gpus > 0 {
        println!(
            "  GPUs        {} ({} allocated)",
            br.gpus, br.gpus_allocated
        );
    }
    Ok(())
}

/// Prints the fleet-consistency report: where the same component's settings differ within an env.
#[allow(clippy::print_stdout)]
pub async fn consistency(client: &async_nats::Client, output: &str) -> Result<()> {
    let divergent: Vec<SettingDivergence> = request(
        client,
        multipilot_schemas::control::QUERY_CONSISTENCY,
        b"{}",
    )
    .await?;
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(&divergent)?);
    } else {
        print_consistency(&divergent);
    }
    Ok(())
}

#[allow(clippy::print_stdout)]
fn print_consistency(divergent: &[SettingDivergence]) {
    println!(
        "{:<52} {:<24} {:<14} VALUES (ODD ONES OUT FIRST)",
        "FLEET CONSISTENCY: OBJECT", "SETTING", "AMONG"
    );
    for d in divergent {
        let mut values: Vec<String> = d
            .values
            .iter()
            .map(|v| format!("{:?} on {}", v.value, v.clusters.join(", ")))
            .collect();
        values.reverse();
        println!(
            "{:<52} {:<24} {:<14} {}",
            d.object,
            d.setting,
            d.group,
            values.join("; ")
        );
    }
    if divergent.is_empty() {
        println!("(every compared setting is the same on the clusters of each env)");
    }
}

/// Prints the fleet's compliance: each rule once with the clusters failing it, or (`by_cluster`) every
/// cluster's report.
#[allow(clippy::print_stdout)]
pub async fn compliance(client: &async_nats::Client, output: &str, by_cluster: bool) -> Result<()> {
    let mut reports: Vec<ComplianceReport> =
        request(client, multipilot_schemas::control::QUERY_COMPLIANCE, b"{}").await?;
    reports.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    if !by_cluster {
        let rules = multipilot_schemas::control::compliance_by_rule(&reports);
        if output == "json" {
            println!("{}", serde_json::to_string_pretty(&rules)?);
            return Ok(());
        }
        println!(
            "{:<32} {:>7} {:>7}  CLUSTERS FAILING IT",
            "RULE", "FAILING", "PASSING"
        );
        for r in &rules {
            let clusters = r
                .failing
                .iter()
                .map(|f| f.cluster.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            println!(
                "{:<32} {:>7} {:>7}  {}",
                r.rule,
                r.failing.len(),
                r.passing,
                if clusters.is_empty() { "-" } else { &clusters }
            );
            for f in &r.failing {
                println!("{:<32}   {}: {}", "", f.cluster, f.message);
            }
        }
        if rules.is_empty() {
            println!("(no reports yet)");
        }
        // the fleet-consistency report after the rules (a correlator from before it doesn't answer)
        if let Ok(divergent) = request::<SettingDivergence>(
            client,
            multipilot_schemas::control::QUERY_CONSISTENCY,
            b"{}",
        )
        .await
        {
            println!();
            print_consistency(&divergent);
        }
        return Ok(());
    }
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(&reports)?);
        return Ok(());
    }
    println!(
        "{:<16} {:<10} {:<9} {:<26} MESSAGE",
        "CLUSTER", "BASELINE", "STATUS", "RULE"
    );
    for r in &reports {
        for c in &r.checks {
            let st = match c.status {
                CheckStatus::Pass => "pass",
                CheckStatus::Fail => "FAIL",
                CheckStatus::Unknown => "unknown",
            };
            println!(
                "{:<16} {:<10} {:<9} {:<26} {}",
                r.cluster,
                if r.compliant { "compliant" } else { "drift" },
                st,
                c.rule,
                c.message
            );
        }
    }
    if reports.is_empty() {
        println!("(no reports yet)");
    }
    Ok(())
}
