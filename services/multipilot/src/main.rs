//! `multipilot`, the MultiPilot hub: one subcommand per consumer role, `all` to run every role in one process,
//! and operator commands.

#![allow(clippy::print_stdout)] // a CLI: stdout is its output

/// jemalloc, as TiKV, Vector and GreptimeDB use: it returns freed memory to the system (background
/// purging) and does not fragment under the many small, short-lived allocations of message decoding.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{CommandFactory as _, Parser, Subcommand};
use multipilot_runtime::config as cfg;

mod cluster;
mod config;
mod contexts;
mod fleet;
mod incidents;
mod kinds;
mod release;
mod roles;
mod silence;
mod status;
mod team;

use config::Config;
use roles::Role;

/// MultiPilot: a fleet of Kubernetes clusters, visible, controlled and traceable.
#[derive(Debug, Parser)]
#[command(name = "multipilot", version, about)]
struct Cli {
    /// Config file (TOML or YAML). Environment variables `MULTIPILOT_<SECTION>__<KEY>` override it.
    #[arg(long, short = 'c', global = true, env = "MULTIPILOT_CONFIG")]
    config: Option<PathBuf>,
    /// Print the effective configuration (defaults < file < environment) and exit.
    #[arg(long, global = true)]
    print_config: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run every hub role in one process (the demo and small fleets).
    All,
    /// Run the correlator role (dedup, incidents, baseline drift).
    Correlator,
    /// Run the TSDB role (metric storage, Prometheus-compatible queries).
    Tsdb,
    /// Run the alert router role.
    Alerts,
    /// Run the release orchestration role; with a subcommand, ask it (plan, apply, approve, rollback,
    /// status, history).
    Release {
        /// How long to wait for the release role's answer.
        #[arg(long, global = true, default_value = "120s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
        #[command(subcommand)]
        command: Option<release::Command>,
    },
    /// The fleet repositories the release role follows, and each release's sync status per cluster
    /// (Synced, OutOfSync, Progressing, Degraded) with the commit it runs and what drifted.
    Gitops {
        /// How long to wait for the release role's answer.
        #[arg(long, global = true, default_value = "120s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
        #[command(subcommand)]
        command: release::GitopsCommand,
    },
    /// Run the console role (HTTP API and web UI).
    Console,
    /// Create or update every stream and durable consumer, then exit.
    Provision,
    /// Show the streams and consumers: messages, bytes, pending and unacked counts.
    Status {
        /// Output format.
        #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
        output: String,
    },
    /// What a cluster's loss would take down, from its last known state (from the correlator): its
    /// workloads and namespaces, which of them run nowhere else, its Services and GPUs.
    BlastRadius {
        /// The cluster.
        cluster: String,
        /// Output format.
        #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
        output: String,
    },
    /// Show the fleet's current incidents (from the correlator); --watch follows every change.
    Incidents {
        /// Include resolved incidents of the last week.
        #[arg(long)]
        all: bool,
        /// Only the fleet incidents (one failure across clusters: their members, what the failing
        /// clusters share, the suspects).
        #[arg(long)]
        fleet: bool,
        /// After the list, print every incident change as it happens.
        #[arg(long, short = 'w')]
        watch: bool,
        /// Output format.
        #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
        output: String,
    },
    /// Check an alert routing file — the router's own, or an Alertmanager `alertmanager.yml` as it is —
    /// and say what the router uses of it and what it leaves out; exits non-zero if it can't be loaded.
    CheckRouting {
        /// The file.
        file: String,
    },
    /// Add, list or expire silences of the alert router (its HTTP API, `alerts.listen`).
    Silence {
        /// The alert router's API (default: http://<alerts.listen>).
        #[arg(long, global = true, env = "MULTIPILOT_ALERTS_URL")]
        url: Option<String>,
        #[command(subcommand)]
        command: silence::Command,
    },
    /// Onboard (add), offboard (remove), re-key (rotate) or list workload clusters: each cluster's agent
    /// gets its own bus user, scoped to its own subjects, a Secret and an overlay to apply in that cluster.
    Cluster {
        #[command(subcommand)]
        command: cluster::Command,
    },
    /// Give another team access to some clusters (add), re-key (rotate), take it away (remove) or list
    /// teams: a bus user that reads only those clusters' subjects and an API token the console, TSDB and
    /// alert router answer only about them.
    Team {
        #[command(subcommand)]
        command: team::Command,
    },
    /// The fleet as the console sees it: clusters, get, diff, compare, gpu, api-resources.
    #[command(flatten)]
    Fleet(fleet::Command),
    /// Show the fleet's compliance with the baseline (from the correlator): each rule once, with the
    /// clusters failing it.
    Compliance {
        /// Output format.
        #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
        output: String,
        /// Every check of every cluster instead, cluster by cluster.
        #[arg(long)]
        by_cluster: bool,
        /// Only the fleet-consistency report: where the same component's settings differ among the
        /// clusters of one env (ingress controller, CoreDNS, kube-proxy configuration).
        #[arg(long, conflicts_with = "by_cluster")]
        consistency: bool,
    },
    /// Make an API token and its tokens-file entry (`new`), or print the digest the tokens file keeps of
    /// one (`hash`): tokens are kept as `token_sha256`, never in plain text.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// The CLI's contexts, like a kubeconfig: where the console is, its token, the default output
    /// (`$MULTIPILOT_CLI_CONFIG`, else `~/.config/multipilot/config.yaml`).
    Config {
        #[command(subcommand)]
        command: contexts::Command,
    },
    /// Print a shell completion script: `source <(multipilot completion bash)`.
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // `multipilot gitops status | head`: a closed pipe ends the output quietly, as for other Unix tools
    // (Rust ignores SIGPIPE and `println!` then panics; `unsafe` to restore the signal is forbidden here)
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default_hook(info);
    }));
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("multipilot: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// How long an operator command tries to reach NATS when `nats.give_up_after` is not set.
const OPERATOR_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(10);

async fn run() -> Result<()> {
    let cli = Cli::parse();
    // commands about the CLI itself need no hub config
    match cli.command {
        Command::Config { command } => return contexts::run(contexts::default_path(), command),
        Command::Token { command } => return token(command),
        Command::Completion { shell } => {
            // into a buffer first: a closed pipe (`| head`) is then an error, not a panic
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "multipilot", &mut script);
            return std::io::Write::write_all(&mut std::io::stdout(), &script)
                .context("writing the completion script");
        }
        Command::Fleet(fleet::Command::ApiResources) => {
            return fleet::run("", None, fleet::Command::ApiResources).await;
        }
        _ => {}
    }
    for (name, meant) in cfg::misspelled_env::<Config>("MULTIPILOT_") {
        eprintln!("multipilot: warning: {name} is ignored; settings are named {meant}");
    }
    let mut config: Config = cfg::load(cli.config.as_deref(), "MULTIPILOT_", &["agent__"])?;
    config.validate()?;
    // role data directories default to subdirectories of storage.data_dir; show and use the resolved ones
    config.correlator = config.correlator();
    config.tsdb = config.tsdb();
    config.alerts = config.alerts();
    config.console = config.console();
    config.release = config.release();
    if cli.print_config {
        print!("{}", cfg::render(&config));
        return Ok(());
    }
    let operator_command = matches!(
        cli.command,
        Command::Provision
            | Command::Status { .. }
            | Command::Incidents { .. }
            | Command::BlastRadius { .. }
            | Command::Compliance { .. }
            | Command::Silence { .. }
            | Command::CheckRouting { .. }
            | Command::Fleet(_)
            | Command::Cluster { .. }
            | Command::Release {
                command: Some(_),
                ..
            }
            | Command::Gitops { .. }
    );
    let nats_command = matches!(
        cli.command,
        Command::Provision
            | Command::Status { .. }
            | Command::Incidents { .. }
            | Command::BlastRadius { .. }
            | Command::Compliance { .. }
            | Command::Release {
                command: Some(_),
                ..
            }
            | Command::Gitops { .. }
    );
    if nats_command && config.nats.give_up_after.is_zero() {
        // a person is waiting: say the hub is unreachable (as kubectl does) instead of retrying forever;
        // the roles keep the configured default (retry until NATS answers)
        config.nats.give_up_after = OPERATOR_GIVE_UP;
    }
    if nats_command
        && cli.config.is_none()
        && std::env::var_os("MULTIPILOT_NATS__URL").is_none()
        && let Some(path) = contexts::default_path()
        && let Some(ctx) = contexts::File::load(&path)?.chosen(None, &path)?
        && let Some(url) = &ctx.nats
    {
        // the context's NATS URL, when neither the hub config file nor the environment gives one
        config.nats.url = url.clone();
    }
    let mut log = config.log.clone();
    if operator_command {
        // Operator commands print their result; only problems belong in the log.
        log.level = "warn".into();
    }
    multipilot_runtime::telemetry::init(&log);
    let roles = match cli.command {
        Command::All => Role::ALL.to_vec(),
        Command::Correlator => vec![Role::Correlator],
        Command::Tsdb => vec![Role::Tsdb],
        Command::Alerts => vec![Role::Alerts],
        Command::Release { command: None, .. } => vec![Role::Release],
        Command::Release {
            command: Some(cmd),
            timeout,
        } => {
            let client = multipilot_bus::connect::connect(&config.nats).await?;
            return release::run(&client, cmd, timeout).await;
        }
        Command::Gitops { command, timeout } => {
            let client = multipilot_bus::connect::connect(&config.nats).await?;
            return release::gitops(&client, command, timeout).await;
        }
        Command::Console => vec![Role::Console],
        Command::Provision => {
            let client = multipilot_bus::connect::connect(&config.nats).await?;
            let js = async_nats::jetstream::new(client);
            config
                .topology()
                .provision(&js)
                .await
                .context("provisioning streams")?;
            let topo = config.topology();
            eprintln!(
                "provisioned {} streams and {} consumers",
                topo.streams.len(),
                topo.consumers.len()
            );
            return Ok(());
        }
        Command::Status { output } => {
            let client = multipilot_bus::connect::connect(&config.nats).await?;
            return status::print(&async_nats::jetstream::new(client), &output).await;
        }
        Command::Incidents {
            all,
            fleet,
            watch,
            output,
        } => {
            let client = multipilot_bus::connect::connect(&config.nats).await?;
            let only_fleet = fleet;
            return incidents::print(&client, all, only_fleet, watch, &output).await;
        }
        Command::CheckRouting { file } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {file}"))?;
            let (routing, notes) = multipilot_alerts::config::Routing::parse(&text, &file)?;
            for n in &notes {
                println!("- {n}");
            }
            fn count(r: &multipilot_alerts::config::Route) -> usize {
                1 + r.routes.iter().map(count).sum::<usize>()
            }
            let n = |k: usize, what: &str| format!("{k} {what}{}", if k == 1 { "" } else { "s" });
            println!(
                "{file}: loads: {}, {}, {}; {} not used",
                n(count(&routing.route), "route"),
                n(routing.receivers.len(), "receiver"),
                n(routing.inhibit_rules.len(), "inhibition rule"),
                n(notes.len(), "part"),
            );
            return Ok(());
        }
        Command::Silence { url, command } => {
            let url = url.unwrap_or_else(|| format!("http://{}", config.alerts.listen));
            return silence::run(&url, command).await;
        }
        Command::BlastRadius { cluster, output } => {
            let client = multipilot_bus::connect::connect(&config.nats).await?;
            return incidents::blast_radius(&client, &cluster, &output).await;
        }
        Command::Compliance {
            output,
            by_cluster,
            consistency,
        } => {
            let client = multipilot_bus::connect::connect(&config.nats).await?;
            if consistency {
                return incidents::consistency(&client, &output).await;
            }
            return incidents::compliance(&client, &output, by_cluster).await;
        }
        Command::Fleet(cmd) => {
            return fleet::run(&config.console.listen, contexts::default_path(), cmd).await;
        }
        Command::Cluster { command } => return cluster::run(command),
        Command::Team { command } => return team::run(command),
        Command::Config { .. } | Command::Completion { .. } | Command::Token { .. } => {
            unreachable!("handled above")
        }
    };
    roles::run(config, roles).await
}

/// `multipilot token …`.
#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// A new random token for `subject`: printed once (give it to its owner; nothing keeps it), with the
    /// entry to add to the tokens file.
    New {
        /// Who it belongs to (recorded as the actor of what it does).
        #[arg(long)]
        subject: String,
        /// What it may do.
        #[arg(long, default_value = "viewer", value_parser = ["viewer", "operator", "releaser"])]
        role: String,
    },
    /// The `token_sha256` of a token (read from standard input when not given: it then stays out of the
    /// shell's history).
    Hash {
        /// The token.
        token: Option<String>,
    },
}

#[allow(clippy::print_stdout)]
fn token(command: TokenCommand) -> anyhow::Result<()> {
    use multipilot_runtime::auth::sha256_hex;
    match command {
        TokenCommand::New { subject, role } => {
            use rand::RngCore as _;
            let mut bytes = [0u8; 32];
            rand::rng().fill_bytes(&mut bytes);
            let token: String = format!(
                "{role}-{}",
                bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
            );
            println!("token: {token}");
            println!("# the tokens file keeps only its digest; add:");
            println!(
                "- token_sha256: {}\n  subject: {subject}\n  role: {role}",
                sha256_hex(&token)
            );
        }
        TokenCommand::Hash { token } => {
            let token = match token {
                Some(t) => t,
                None => {
                    let mut line = String::new();
                    std::io::stdin().read_line(&mut line)?;
                    line.trim().to_string()
                }
            };
            anyhow::ensure!(!token.is_empty(), "no token given");
            println!("{}", sha256_hex(&token));
        }
    }
    Ok(())
}
