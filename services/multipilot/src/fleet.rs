//! `multipilot clusters | get | diff | compare | gpu | api-resources`: the fleet as the console sees it, for
//! people (tables) and scripts (`-o json|yaml|name`). They ask the console's API; where it is, the token and
//! the default output come from the flags, the environment (`MULTIPILOT_CONSOLE_URL`, `MULTIPILOT_TOKEN`), the
//! CLI config's context (see [`crate::contexts`]) or the defaults (`http://<console.listen>`), in that order.
//! Kinds are named as kubectl names them ([`crate::kinds`]).
//!
//! One module per group of commands: [`clusters`], [`resources`] (`get`, `api-resources`), [`drift`]
//! (`diff`, `compare`) and [`gpu`]; [`session`] resolves the settings and asks the console, [`output`]
//! prints.

mod clusters;
mod drift;
mod gpu;
mod output;
mod resources;
mod session;

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Subcommand;

pub use output::table;
use session::Settings;

use crate::contexts;
use crate::kinds;

/// Where the console is, how to sign in, how to print.
#[derive(Debug, Clone, clap::Args)]
pub struct ConsoleArgs {
    /// The console's address [else $MULTIPILOT_CONSOLE_URL, the context's, http://<console.listen>].
    #[arg(long = "console")]
    pub url: Option<String>,
    /// Bearer token for the console [else $MULTIPILOT_TOKEN, the context's].
    #[arg(long)]
    pub token: Option<String>,
    /// Use this context of the CLI config instead of the current one.
    #[arg(long)]
    pub context: Option<String>,
    /// Output format [else the context's, else table].
    #[arg(short = 'o', long, value_parser = contexts::OUTPUTS)]
    pub output: Option<String>,
}

/// The fleet commands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Every cluster: health, version, env/region/owner, nodes, CNI, ingress, certificate expiry, baseline,
    /// open incidents.
    Clusters {
        #[command(flatten)]
        args: ConsoleArgs,
        /// Filter: text, or key=value (env=prod, health=degraded, version=1.31).
        #[arg(short = 'q', long)]
        query: Option<String>,
        /// Sort by name, cert_expiry (soonest first), health (worst first) or incidents.
        #[arg(long, default_value = "name")]
        sort: String,
    },
    /// Objects of a kind across the fleet, like `kubectl get`.
    Get {
        #[command(flatten)]
        args: ConsoleArgs,
        /// Kind as kubectl takes it: `deployments`, `deploy`, `Deployment`, `deployments.apps`
        /// (`multipilot api-resources` lists them).
        kind: String,
        #[command(flatten)]
        filter: resources::Filter,
    },
    /// One object across clusters: spec hashes and the fields that differ (labels and annotations apart).
    Diff {
        #[command(flatten)]
        args: ConsoleArgs,
        /// `<namespace>/<kind>/<name>` (`_` as namespace for cluster-scoped objects; the kind as `get` takes
        /// it).
        object: String,
        /// Clusters, comma-separated (default: every cluster that has it).
        #[arg(long, value_delimiter = ',')]
        clusters: Vec<String>,
    },
    /// What differs between two clusters: objects only in one, objects whose spec differs.
    Compare {
        #[command(flatten)]
        args: ConsoleArgs,
        /// First cluster.
        a: String,
        /// Second cluster.
        b: String,
        /// Only this kind, as `get` takes it (default: everything but Pods, ReplicaSets, EndpointSlices,
        /// Leases, Nodes…).
        #[arg(long)]
        kind: Option<String>,
        /// Only this namespace.
        #[arg(short = 'n', long)]
        namespace: Option<String>,
    },
    /// The GPU pool: allocatable, allocated and free `nvidia.com/gpu` per cluster, most free first.
    Gpu {
        #[command(flatten)]
        args: ConsoleArgs,
    },
    /// The kinds `get`, `diff` and `compare` take, with their short names.
    ApiResources,
}

/// A kind as the user typed it, resolved, or the error with its suggestion.
fn kind(given: &str) -> Result<&'static kinds::Kind> {
    let k = kinds::resolve(given)?;
    if !k.collected {
        bail!(
            "the agent doesn't collect {}, so the fleet has none to show (`multipilot api-resources` lists what it collects)",
            k.plural
        );
    }
    Ok(k)
}

/// Runs a fleet command; `listen` is the hub config's `console.listen`, `file` the CLI config.
pub async fn run(listen: &str, file: Option<PathBuf>, cmd: Command) -> Result<()> {
    let settings = Settings {
        listen,
        file: file.as_deref(),
    };
    match cmd {
        Command::Clusters { args, query, sort } => {
            clusters::run(settings, &args, query, sort).await
        }
        Command::Get { args, kind, filter } => {
            resources::get_objects(settings, &args, &kind, filter).await
        }
        Command::Diff {
            args,
            object,
            clusters,
        } => drift::diff(settings, &args, &object, &clusters).await,
        Command::Compare {
            args,
            a,
            b,
            kind,
            namespace,
        } => drift::compare(settings, &args, a, b, kind, namespace).await,
        Command::Gpu { args } => gpu::run(settings, &args).await,
        Command::ApiResources => {
            resources::api_resources();
            Ok(())
        }
    }
}
