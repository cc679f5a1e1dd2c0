//! `multipilot release plan|apply|approve|rollback|status|history`: the operator's side of the release role
//! (request/reply on `fleet.releasectl.*`). The spec file is read here: `manifest_files` (paths relative to
//! the spec) are read into `manifests`, a `kustomize` directory (relative to the spec) is built with the
//! host's `kubectl kustomize` into `kustomized`, and when the spec lives in a Git work tree its commit and
//! whether the tree was clean travel with the request.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::Subcommand;
use multipilot_release::model::{Release, Reply};
use multipilot_schemas::control::{ApplyRequest, ApproveRequest, NameRequest, PlanRequest, Source};
use multipilot_schemas::payload::{ReleaseEvent, ReleaseState as State};

/// Release commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Render, check and dry-run a release spec on every target; print the plan.
    Plan {
        /// The release spec (YAML).
        #[arg(short = 'f', long)]
        file: PathBuf,
        /// Output format.
        #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
        output: String,
    },
    /// Plan (from -f) or re-plan a planned release, then apply it batch by batch.
    Apply {
        /// The release spec (YAML).
        #[arg(short = 'f', long, conflicts_with = "release")]
        file: Option<PathBuf>,
        /// A release planned before.
        #[arg(required_unless_present = "file")]
        release: Option<String>,
        /// Approve a risk the plan flags (e.g. external-ips); repeatable.
        #[arg(long)]
        approve: Vec<String>,
        /// Pass closed sync windows that allow a manual sync (recorded and audited as an override).
        #[arg(long)]
        override_windows: bool,
        /// Follow the release until it ends; exit non-zero unless it succeeded.
        #[arg(long)]
        wait: bool,
        /// Output format.
        #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
        output: String,
    },
    /// Approve risks of a planned release.
    Approve {
        /// Release.
        release: String,
        /// Approvals, e.g. external-ips.
        #[arg(required = true)]
        approvals: Vec<String>,
    },
    /// Roll every cluster the release changed back to its snapshot.
    Rollback {
        /// Release.
        release: String,
        /// Follow the rollback until it ends.
        #[arg(long)]
        wait: bool,
    },
    /// Every release, or one release's progress.
    Status {
        /// Release.
        release: Option<String>,
        /// Output format.
        #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
        output: String,
    },
    /// A release's history: plans, approvals, batches, steps, health gates, rollbacks.
    History {
        /// Release.
        release: String,
        /// Output format.
        #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
        output: String,
    },
}

fn actor() -> String {
    std::env::var("MULTIPILOT_ACTOR")
        .or_else(|_| std::env::var("USER"))
        .unwrap_or_else(|_| "operator".into())
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Builds a spec's `kustomize` directory (relative to `dir`, the spec's) with `kubectl kustomize` into its
/// `kustomized`; a spec without one is returned as it is. A templated path picks an overlay per cluster
/// from labels only the role knows: that takes a fleet repository.
fn kustomize(text: &str, dir: &Path) -> Result<String> {
    let doc: serde_yaml::Value = serde_yaml::from_str(text)?;
    let Some(path) = doc.get("kustomize").and_then(serde_yaml::Value::as_str) else {
        return Ok(text.to_string());
    };
    if multipilot_release::render::templated(path) {
        bail!(
            "kustomize {path:?} is a template: an overlay picked per cluster (by its labels) is built \
             by the release role from a fleet repository (release.gitops; see the README's GitOps \
             section); from the CLI give the overlay's directory"
        );
    }
    let key = multipilot_release::render::kustomize_key(path)?;
    let target = dir.join(&key);
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&target)
        .stdin(std::process::Stdio::null())
        .output()
        .context("running kubectl kustomize (is kubectl installed?)")?;
    if !out.status.success() {
        bail!(
            "kubectl kustomize {}: {}",
            target.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let built = String::from_utf8(out.stdout).context("kubectl kustomize's output")?;
    Ok(multipilot_release::spec::inline_kustomized(
        text,
        &BTreeMap::from([(key, built)]),
    )?)
}

/// Reads a spec file: inlines `manifest_files`, builds its `kustomize` directory, and finds the Git commit
/// of its work tree.
pub fn read_spec(path: &Path) -> Result<(String, Source)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let text = multipilot_release::spec::inline_manifest_files(&text, |f| {
        let p = dir.join(f);
        std::fs::read_to_string(&p).map_err(|e| format!("reading {}: {e}", p.display()))
    })
    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let text = kustomize(&text, dir).with_context(|| path.display().to_string())?;
    let commit = git(dir, &["rev-parse", "--short=12", "HEAD"]);
    let dirty = commit
        .as_ref()
        .and_then(|_| git(dir, &["status", "--porcelain"]))
        .map(|s| !s.is_empty());
    Ok((
        text,
        Source {
            path: Some(path.display().to_string()),
            commit,
            dirty,
            repo: None,
            policy: false,
        },
    ))
}

fn ok(reply: Reply) -> Result<Reply> {
    if !reply.ok {
        bail!("{}", reply.error.unwrap_or_else(|| "failed".into()));
    }
    Ok(reply)
}

/// Runs a release command.
pub async fn run(client: &async_nats::Client, cmd: Command, timeout: Duration) -> Result<()> {
    use multipilot_release::call;
    match cmd {
        Command::Plan { file, output } => {
            let (spec, source) = read_spec(&file)?;
            let reply = ok(call(
                client,
                "plan",
                &PlanRequest {
                    spec,
                    source,
                    actor: actor(),
                },
                timeout,
            )
            .await?)?;
            let r = reply.release.context("no release in the reply")?;
            if output == "json" {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print_plan(&r);
            }
            if !r.plan.clean() {
                bail!(
                    "the plan is blocked: {} blocked objects, {} errors",
                    r.plan.blocked,
                    r.plan.errors
                );
            }
            Ok(())
        }
        Command::Apply {
            file,
            release,
            approve,
            override_windows,
            wait,
            output,
        } => {
            let mut req = ApplyRequest {
                release,
                approve,
                override_windows,
                actor: actor(),
                ..Default::default()
            };
            if let Some(f) = file {
                let (spec, source) = read_spec(&f)?;
                req.spec = Some(spec);
                req.source = source;
            }
            let reply = ok(call(client, "apply", &req, timeout).await?)?;
            let r = reply.release.context("no release in the reply")?;
            if output == "json" && !wait {
                println!("{}", serde_json::to_string_pretty(&r)?);
                return Ok(());
            }
            if output != "json" {
                print_plan(&r);
                println!(
                    "\napplying {} revision {} ({} batches)",
                    r.name,
                    r.revision,
                    r.plan.batches.len()
                );
            }
            if wait {
                follow(client, &r.name, r.events, timeout, &output).await
            } else {
                println!(
                    "follow it: multipilot release status {}   (or apply --wait)",
                    r.name
                );
                Ok(())
            }
        }
        Command::Approve { release, approvals } => {
            let reply = ok(call(
                client,
                "approve",
                &ApproveRequest {
                    release,
                    approvals,
                    actor: actor(),
                },
                timeout,
            )
            .await?)?;
            let r = reply.release.context("no release in the reply")?;
            println!(
                "{} revision {}: approved {}; still needed: {}",
                r.name,
                r.revision,
                r.approvals.keys().cloned().collect::<Vec<_>>().join(", "),
                none_if_empty(&r.missing_approvals())
            );
            Ok(())
        }
        Command::Rollback { release, wait } => {
            let reply = ok(call(
                client,
                "rollback",
                &NameRequest {
                    release: Some(release.clone()),
                    actor: actor(),
                },
                timeout,
            )
            .await?)?;
            let r = reply.release.context("no release in the reply")?;
            println!(
                "rolling back {} revision {}: {}",
                r.name,
                r.revision,
                r.changed.join(", ")
            );
            if wait {
                follow(client, &release, r.events, timeout, "table").await
            } else {
                Ok(())
            }
        }
        Command::Status { release, output } => {
            let reply = ok(call(
                client,
                "status",
                &NameRequest {
                    release: release.clone(),
                    actor: actor(),
                },
                timeout,
            )
            .await?)?;
            if output == "json" {
                match reply.release {
                    Some(r) => println!("{}", serde_json::to_string_pretty(&r)?),
                    None => println!("{}", serde_json::to_string_pretty(&reply.releases)?),
                }
                return Ok(());
            }
            match reply.release {
                Some(r) => print_status(&r),
                None => {
                    println!(
                        "{:<28} {:>4}  {:<16} {:>8} {:>8}  {:<20} UPDATED",
                        "RELEASE", "REV", "STATE", "CLUSTERS", "BATCHES", "COMMIT"
                    );
                    for s in reply.releases {
                        println!(
                            "{:<28} {:>4}  {:<16} {:>8} {:>5}/{:<2}  {:<20} {}",
                            s.name,
                            s.revision,
                            s.state.as_str(),
                            s.clusters,
                            s.done_batches,
                            s.batches,
                            s.commit.unwrap_or_else(|| "-".into()),
                            s.updated_at.format("%Y-%m-%d %H:%M:%S")
                        );
                    }
                }
            }
            Ok(())
        }
        Command::History { release, output } => {
            let reply = ok(call(
                client,
                "history",
                &NameRequest {
                    release: Some(release),
                    actor: actor(),
                },
                timeout,
            )
            .await?)?;
            if output == "json" {
                println!("{}", serde_json::to_string_pretty(&reply.history)?);
            } else {
                for e in &reply.history {
                    print_event(e);
                }
            }
            Ok(())
        }
    }
}

fn none_if_empty(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn print_event(e: &ReleaseEvent) {
    println!(
        "{}  r{:<3} {:<13} {:<4} {:<16} {:<14} {}",
        e.at.format("%Y-%m-%d %H:%M:%S"),
        e.revision,
        e.what,
        if e.ok { "ok" } else { "FAIL" },
        e.state,
        e.actor,
        e.summary
    );
}

async fn follow(
    client: &async_nats::Client,
    name: &str,
    mut seen: u64,
    timeout: Duration,
    output: &str,
) -> Result<()> {
    loop {
        let reply = ok(multipilot_release::call(
            client,
            "history",
            &NameRequest {
                release: Some(name.to_string()),
                actor: actor(),
            },
            timeout,
        )
        .await?)?;
        let r = reply.release.context("no release in the reply")?;
        let skip = reply
            .history
            .len()
            .saturating_sub((r.events - seen) as usize);
        if output != "json" {
            for e in reply.history.iter().skip(skip) {
                print_event(e);
            }
        }
        seen = r.events;
        if !r.state.busy() {
            if output == "json" {
                println!("{}", serde_json::to_string_pretty(&r)?);
            }
            return match r.state {
                State::Succeeded | State::RolledBack if r.error.is_none() => Ok(()),
                State::WaitingApproval => bail!(
                    "release {name} is applied up to the batch that waits for: multipilot release approve {name} {}",
                    r.waiting_for
                        .as_deref()
                        .unwrap_or(multipilot_release::spec::GATE_APPROVAL)
                ),
                State::Held => bail!(
                    "release {name} is applied up to a held batch ({}); the role goes on by itself once that changes",
                    r.waiting_for
                        .as_deref()
                        .unwrap_or("a sync window or a dependency")
                ),
                s => bail!(
                    "release {name} ended {}{}",
                    s.as_str(),
                    r.error.map(|e| format!(": {e}")).unwrap_or_default()
                ),
            };
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn print_status(r: &Release) {
    println!(
        "release {} revision {}: {}{}",
        r.name,
        r.revision,
        r.state.as_str(),
        r.source
            .commit_label()
            .map(|c| format!("  (commit {c})"))
            .unwrap_or_default()
    );
    if let Some(e) = &r.error {
        println!("  error: {e}");
    }
    if let (State::Held | State::WaitingApproval, Some(w)) = (r.state, &r.waiting_for) {
        println!("  waiting for: {w}");
    }
    for b in &r.batches {
        println!(
            "  batch {:<3} {:<15} {}{}",
            b.index,
            b.state,
            b.clusters.join(", "),
            b.error
                .as_ref()
                .map(|e| format!("\n              {e}"))
                .unwrap_or_default()
        );
    }
    if !r.changed.is_empty() {
        println!("  changed: {}", r.changed.join(", "));
    }
}

/// The plan, for a terminal.
pub fn print_plan(r: &Release) {
    let p = &r.plan;
    println!(
        "release {} revision {}{}  ({} clusters, {} batches, dry-run {} ms)",
        r.name,
        r.revision,
        r.source
            .commit_label()
            .map(|c| format!("  commit {c}"))
            .unwrap_or_else(|| "  (not in a Git work tree)".into()),
        p.clusters.len(),
        p.batches.len(),
        p.dry_run_ms
    );
    for (i, b) in p.batches.iter().enumerate() {
        println!("  batch {}: {}", i + 1, b.join(", "));
    }
    println!();
    println!(
        "{:<20} {:<6} {:<17} {:<48} NOTE",
        "CLUSTER", "K8S", "ACTION", "OBJECT"
    );
    let mut risks = Vec::new();
    for c in &p.clusters {
        if let Some(e) = &c.error {
            println!("{:<20} {:<6} {:<17} {}", c.cluster, c.version, "ERROR", e);
        }
        for o in &c.objects {
            let name = format!(
                "{} {} {}",
                o.object.kind,
                o.object.api_version,
                multipilot_release::model::obj_name(&o.object)
            );
            let note = o
                .error
                .clone()
                .or_else(|| o.verdict.warning.clone())
                .unwrap_or_default();
            println!(
                "{:<20} {:<6} {:<17} {:<48} {}",
                c.cluster,
                c.version,
                o.action.as_str().to_uppercase(),
                name,
                note
            );
            let created = o.action.as_str().ends_with("create");
            for d in o.diff.iter().filter(|_| !created).take(20) {
                let show = |v: &Option<serde_json::Value>| match v {
                    None => "(none)".to_string(),
                    Some(v) => {
                        let s = v.to_string();
                        if s.chars().count() > 60 {
                            format!("{}…", s.chars().take(60).collect::<String>())
                        } else {
                            s
                        }
                    }
                };
                println!(
                    "{:>46} {}: {} → {}",
                    "~",
                    d.path,
                    show(&d.before),
                    show(&d.after)
                );
            }
            if !created && o.diff.len() > 20 {
                println!("{:>46} … {} more changes", "~", o.diff.len() - 20);
            }
            for k in &o.risks {
                risks.push((c.cluster.clone(), k.clone()));
            }
        }
    }
    if !risks.is_empty() {
        println!("\nRISKS");
        for (c, k) in &risks {
            println!(
                "  {:<8} {:<20} {}{}",
                format!("{:?}", k.level).to_lowercase(),
                c,
                k.message,
                k.approval
                    .as_ref()
                    .map(|a| format!(" [approval: {a}]"))
                    .unwrap_or_default()
            );
        }
    }
    let problems = p.problems();
    if !problems.is_empty() {
        let clusters: std::collections::BTreeSet<&str> = problems
            .iter()
            .filter_map(|l| l.split(':').next())
            .collect();
        println!(
            "\nPROBLEMS ({} in {} clusters)",
            problems.len(),
            clusters.len()
        );
        for l in &problems {
            println!("  {l}");
        }
    }
    let missing = r.missing_approvals();
    println!(
        "\n{}",
        if !p.clean() {
            format!(
                "BLOCKED: {} blocked objects, {} errors — nothing will be applied",
                p.blocked, p.errors
            )
        } else if !missing.is_empty() {
            format!(
                "NEEDS APPROVAL: {} (apply --approve {})",
                missing.join(", "),
                missing.join(" --approve ")
            )
        } else {
            "ready to apply".to_string()
        }
    );
}

/// `multipilot gitops …`.
#[derive(Debug, Subcommand)]
pub enum GitopsCommand {
    /// Repositories (head, last commit taken, problems) and every release's status per cluster.
    Status {
        /// Only this release.
        release: Option<String>,
        /// Output format.
        #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
        output: String,
    },
    /// Fetch every followed repository now and take a new commit, then show the status.
    Sync {
        /// Output format.
        #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
        output: String,
    },
}

/// Runs a gitops command.
pub async fn gitops(
    client: &async_nats::Client,
    cmd: GitopsCommand,
    timeout: Duration,
) -> Result<()> {
    let (verb, only, output) = match cmd {
        GitopsCommand::Status { release, output } => ("gitops", release, output),
        GitopsCommand::Sync { output } => ("sync", None, output),
    };
    let req = NameRequest {
        release: None,
        actor: actor(),
    };
    let reply = ok(multipilot_release::call(client, verb, &req, timeout).await?)?;
    let mut report = reply.gitops.context("no status in the reply")?;
    if let Some(name) = &only {
        report.releases.retain(|r| &r.release == name);
        if report.releases.is_empty() {
            bail!("no release named {name}");
        }
    }
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    if only.is_none() {
        let rows = report
            .repos
            .iter()
            .map(|r| {
                vec![
                    r.name.clone(),
                    r.branch.clone(),
                    r.head.clone().unwrap_or_else(|| "-".into()),
                    r.synced.clone().unwrap_or_else(|| "-".into()),
                    r.fetched_at
                        .map(|t| format!("{}s ago", (chrono::Utc::now() - t).num_seconds().max(0)))
                        .unwrap_or_else(|| "never".into()),
                    format!("{}+{}", r.releases.len(), r.policies.len()),
                    r.error.clone().unwrap_or_default(),
                ]
            })
            .collect();
        if report.repos.is_empty() {
            println!("no fleet repository followed (release.gitops.repos)\n");
        } else {
            crate::fleet::table(
                &[
                    "REPO", "BRANCH", "HEAD", "SYNCED", "FETCHED", "SPECS", "PROBLEM",
                ],
                rows,
            );
            println!();
        }
    }
    let mut rows = Vec::new();
    for r in &report.releases {
        for c in &r.clusters {
            let drift: Vec<String> = c
                .drift
                .iter()
                .map(|d| d.describe(&r.release, c.commit.as_deref()))
                .collect();
            rows.push(vec![
                r.release.clone(),
                c.cluster.clone(),
                format!("{:?}", c.status),
                c.revision
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "-".into()),
                c.commit.clone().unwrap_or_else(|| "-".into()),
                if drift.is_empty() {
                    c.message.clone()
                } else {
                    drift.join("; ")
                },
            ]);
        }
    }
    crate::fleet::table(
        &["RELEASE", "CLUSTER", "STATUS", "REV", "COMMIT", "MESSAGE"],
        rows,
    );
    if only.is_none() && !report.windows.is_empty() {
        println!();
        let rows = report
            .windows
            .iter()
            .map(|w| {
                vec![
                    format!("{:?}", w.kind).to_lowercase(),
                    format!("{} ({}, {})", w.schedule, w.time_zone, w.duration),
                    if w.clusters.is_empty() {
                        "*".into()
                    } else {
                        w.clusters.clone()
                    },
                    if w.releases.is_empty() {
                        "*".into()
                    } else {
                        w.releases.join(",")
                    },
                    if w.active {
                        format!(
                            "open until {}",
                            w.end.map(|e| e.to_rfc3339()).unwrap_or_else(|| "-".into())
                        )
                    } else {
                        format!("opens {}", w.start.to_rfc3339())
                    },
                    if w.manual_sync {
                        "yes".into()
                    } else {
                        "no".into()
                    },
                    w.description.clone(),
                ]
            })
            .collect();
        crate::fleet::table(
            &[
                "WINDOW",
                "SCHEDULE",
                "CLUSTERS",
                "RELEASES",
                "NOW",
                "MANUAL",
                "DESCRIPTION",
            ],
            rows,
        );
    }
    Ok(())
}
