//! `multipilot silence add|list|expire`: the alert router's silences, through its HTTP API (Alertmanager's
//! v2 shapes). A bearer token, when the router wants one, comes from `MULTIPILOT_TOKEN`.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use chrono::{DateTime, Utc};
use clap::Subcommand;
use multipilot_alerts::matcher::{ApiMatcher, Matcher};
use serde_json::{Value, json};

/// Silence subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Silence the alerts every matcher matches, e.g. `cluster="prod-1" alertname=~"cert-.*"`.
    Add {
        /// Matchers in Alertmanager's syntax: name=value, name!=value, name=~regex, name!~regex.
        #[arg(required = true)]
        matchers: Vec<String>,
        /// How long from now.
        #[arg(long, short = 'd', default_value = "1h", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Why (shown to everyone who lists silences).
        #[arg(long)]
        comment: String,
        /// Who (default: $USER).
        #[arg(long, env = "USER", default_value = "operator")]
        author: String,
    },
    /// List silences (active and pending; --expired adds the ended ones).
    List {
        /// Include expired silences.
        #[arg(long)]
        expired: bool,
        /// Output format.
        #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
        output: String,
    },
    /// End silences now.
    Expire {
        /// Silence ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

fn client() -> Result<(reqwest::Client, Option<String>)> {
    Ok((
        reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?,
        std::env::var("MULTIPILOT_TOKEN")
            .ok()
            .filter(|t| !t.is_empty()),
    ))
}

async fn answer(resp: reqwest::Response, what: &str) -> Result<Value> {
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let msg = body
            .get("error")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| body.to_string());
        bail!("{what}: {status}: {msg}");
    }
    Ok(body)
}

/// Runs a silence subcommand against the router at `url`.
pub async fn run(url: &str, cmd: Command) -> Result<()> {
    let (http, token) = client()?;
    let url = url.trim_end_matches('/');
    let auth = |r: reqwest::RequestBuilder| match &token {
        Some(t) => r.bearer_auth(t),
        None => r,
    };
    let unreachable = || {
        format!("the alert router at {url} (is `multipilot alerts` or `all` running? set --url)")
    };
    match cmd {
        Command::Add {
            matchers,
            duration,
            comment,
            author,
        } => {
            let parsed: Vec<ApiMatcher> = matchers
                .iter()
                .map(|m| Matcher::parse(m).map(|m| ApiMatcher::from(&m)))
                .collect::<Result<_, _>>()?;
            let now = Utc::now();
            let body = json!({
                "matchers": parsed,
                "startsAt": now,
                "endsAt": now + chrono::Duration::from_std(duration)?,
                "createdBy": author,
                "comment": comment,
            });
            let resp = auth(http.post(format!("{url}/api/v2/silences")).json(&body))
                .send()
                .await
                .with_context(unreachable)?;
            let v = answer(resp, "adding the silence").await?;
            println!("{}", v["silenceID"].as_str().unwrap_or_default());
        }
        Command::List { expired, output } => {
            let resp = auth(http.get(format!("{url}/api/v2/silences")))
                .send()
                .await
                .with_context(unreachable)?;
            let v = answer(resp, "listing silences").await?;
            let items: Vec<&Value> = v.as_array().map(|a| a.iter().collect()).unwrap_or_default();
            let items: Vec<&Value> = items
                .into_iter()
                .filter(|s| expired || s["status"]["state"] != "expired")
                .collect();
            if output == "json" {
                println!("{}", serde_json::to_string_pretty(&items)?);
                return Ok(());
            }
            let mut rows = vec![[
                "ID".to_string(),
                "STATE".into(),
                "MATCHERS".into(),
                "ENDS".into(),
                "CREATED BY".into(),
                "COMMENT".into(),
            ]];
            for s in items {
                let matchers: Vec<String> = s["matchers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|m| serde_json::from_value::<ApiMatcher>(m.clone()).ok())
                    .filter_map(|m| Matcher::try_from(&m).ok())
                    .map(|m| m.to_string())
                    .collect();
                let ends = s["endsAt"]
                    .as_str()
                    .and_then(|t| t.parse::<DateTime<Utc>>().ok())
                    .map(|t| t.format("%Y-%m-%d %H:%M:%SZ").to_string())
                    .unwrap_or_default();
                rows.push([
                    s["id"].as_str().unwrap_or_default().to_string(),
                    s["status"]["state"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    matchers.join(" "),
                    ends,
                    s["createdBy"].as_str().unwrap_or_default().to_string(),
                    s["comment"].as_str().unwrap_or_default().to_string(),
                ]);
            }
            let widths: Vec<usize> = (0..6)
                .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
                .collect();
            for r in rows {
                let line: Vec<String> = r
                    .iter()
                    .zip(&widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect();
                println!("{}", line.join("  ").trim_end());
            }
        }
        Command::Expire { ids } => {
            for id in ids {
                let resp = auth(http.delete(format!("{url}/api/v2/silence/{id}")))
                    .send()
                    .await
                    .with_context(unreachable)?;
                answer(resp, &format!("expiring {id}")).await?;
                println!("expired {id}");
            }
        }
    }
    Ok(())
}
