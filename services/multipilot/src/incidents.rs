//! `multipilot incidents` and `multipilot compliance`: what the correlator says needs a person.

use std::time::Duration;

use anyhow::{Context as _, Result};
use chrono::Utc;
use futures::StreamExt;
use multipilot_schemas::Envelope;
use multipilot_schemas::payload::{CheckStatus, ComplianceReport, Incident, IncidentStatus};

fn ago(t: chrono::DateTime<Utc>) -> String {
    let s = (Utc::now() - t).num_seconds().max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn status(i: &Incident) -> &'static str {
    match i.status {
        IncidentStatus::Open => "open",
        IncidentStatus::Acknowledged => "acked",
        IncidentStatus::Resolved => "resolved",
    }
}

fn line(i: &Incident) -> String {
    format!(
        "{:<9} {:<8} {:<16} {:<24} {:>5}  {}",
        format!("{:?}", i.severity).to_lowercase(),
        status(i),
        i.cluster,
        i.kind,
        ago(i.opened_at),
        i.summary
    )
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

/// Prints the current incidents; with `watch`, then every change.
#[allow(clippy::print_stdout)]
pub async fn print(
    client: &async_nats::Client,
    all: bool,
    watch: bool,
    output: &str,
) -> Result<()> {
    let body = serde_json::to_string(&multipilot_schemas::control::IncidentsQuery { all })?;
    let mut incidents: Vec<Incident> = request(
        client,
        multipilot_schemas::control::QUERY_INCIDENTS,
        body.as_bytes(),
    )
    .await?;
    incidents.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(b.updated_at.cmp(&a.updated_at))
    });
    if output == "json" && !watch {
        println!("{}", serde_json::to_string_pretty(&incidents)?);
        return Ok(());
    }
    println!(
        "{:<9} {:<8} {:<16} {:<24} {:>5}  SUMMARY",
        "SEVERITY", "STATUS", "CLUSTER", "KIND", "AGE"
    );
    for i in &incidents {
        println!("{}", line(i));
        for e in &i.evidence {
            println!("{:>70}  {}. [{}] {}", "", e.rank, e.kind, e.summary);
            if !e.why.is_empty() {
                println!("{:>70}     why: {}", "", e.why);
            }
        }
    }
    if incidents.is_empty() {
        println!("(no {}incidents)", if all { "" } else { "open " });
    }
    if !watch {
        return Ok(());
    }
    let mut sub = client.subscribe("fleet.incident.>").await?;
    while let Some(m) = sub.next().await {
        match rmp_serde::from_slice::<Envelope<Incident>>(&m.payload) {
            Ok(env) if output == "json" => println!("{}", serde_json::to_string(&env.payload)?),
            Ok(env) => println!("{}", line(&env.payload)),
            Err(e) => eprintln!("undecodable incident on {}: {e}", m.subject),
        }
    }
    Ok(())
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
