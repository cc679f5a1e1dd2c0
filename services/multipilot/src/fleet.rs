//! `multipilot clusters | get | diff | compare | gpu | api-resources`: the fleet as the console sees it, for
//! people (tables) and scripts (`-o json|yaml|name`). They ask the console's API; where it is, the token and
//! the default output come from the flags, the environment (`MULTIPILOT_CONSOLE_URL`, `MULTIPILOT_TOKEN`), the
//! CLI config's context (see [`crate::contexts`]) or the defaults (`http://<console.listen>`), in that order.
//! Kinds are named as kubectl names them ([`crate::kinds`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use clap::Subcommand;
use multipilot_console::api::{ClusterOverview, ResourcePage};
use serde_json::Value;

use crate::contexts::{self, Layer};
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

/// One command's resolved settings.
#[derive(Debug, Clone)]
struct Session {
    base: String,
    token: Option<String>,
    output: String,
}

impl Session {
    /// Flags, then the environment, then the context of the CLI config at `file`, then the defaults.
    /// `outputs` are the formats this command prints: asking for another is an error, a context's default
    /// it can't print is a table.
    fn new(
        args: &ConsoleArgs,
        listen: &str,
        file: Option<PathBuf>,
        outputs: &[&str],
    ) -> Result<Session> {
        if let Some(o) = &args.output
            && !outputs.contains(&o.as_str())
        {
            bail!("-o {o}: this command prints {}", outputs.join(", "));
        }
        let flags = Layer {
            console: args.url.clone(),
            token: args.token.clone(),
            output: args.output.clone(),
        };
        let mut context = Layer::default();
        if let Some(path) = file {
            let f = contexts::File::load(&path)?;
            if let Some(c) = f.chosen(args.context.as_deref(), &path)? {
                context = Layer::from_context(c)?;
            }
        } else if let Some(name) = &args.context {
            bail!("--context {name}: there is no CLI config (set MULTIPILOT_CLI_CONFIG or HOME)");
        }
        let r = flags
            .or(Layer::from_env(|k| std::env::var(k).ok()))
            .or(context);
        Ok(Session {
            base: r
                .console
                .unwrap_or_else(|| format!("http://{}", listen.replace("0.0.0.0", "127.0.0.1")))
                .trim_end_matches('/')
                .to_string(),
            token: r.token,
            output: r
                .output
                .filter(|o| outputs.contains(&o.as_str()))
                .unwrap_or_else(|| "table".into()),
        })
    }
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
        /// Name contains.
        name: Option<String>,
        /// Label selector (app=web,tier!=db,env in (prod)).
        #[arg(short = 'l', long)]
        selector: Option<String>,
        /// Clusters, comma-separated (default: all).
        #[arg(long)]
        cluster: Option<String>,
        /// Namespace (ignored for cluster-scoped kinds).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        /// Every namespace: what no --namespace means already; wins over --namespace, as in kubectl.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// At most this many objects.
        #[arg(long, default_value_t = 500)]
        limit: usize,
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

async fn get(session: &Session, path: &str, query: &[(&str, String)]) -> Result<Value> {
    let url = format!("{}{path}", session.base);
    let mut req = reqwest::Client::new().get(&url).query(query);
    if let Some(t) = &session.token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.with_context(|| {
        format!("reaching the console at {url} (is `multipilot console` or `all` running?)")
    })?;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let msg = body["error"].as_str().unwrap_or("request failed");
        if status.as_u16() == 401 {
            bail!(
                "{msg} (set MULTIPILOT_TOKEN, --token, or a context's token: `multipilot config set-context`)"
            );
        }
        bail!("{status}: {msg}");
    }
    Ok(body)
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

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Prints rows as aligned columns.
#[allow(clippy::print_stdout)]
pub fn table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let n = cells.len();
        cells
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                if i + 1 == n {
                    c
                } else {
                    format!("{c:<width$}", width = w[i])
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("{}", line(header.iter().map(|h| h.to_string()).collect()));
    for r in rows {
        println!("{}", line(r));
    }
}

#[allow(clippy::print_stdout)]
fn structured(v: &Value, output: &str) -> Result<bool> {
    match output {
        "json" => println!("{}", serde_json::to_string_pretty(v)?),
        "yaml" => print!("{}", serde_yaml::to_string(v)?),
        _ => return Ok(false),
    }
    Ok(true)
}

/// Every format; `diff`, `compare` and `gpu` print all but `name`.
const ALL: &[&str] = &contexts::OUTPUTS;
const NO_NAME: &[&str] = &["table", "wide", "json", "yaml"];

/// Runs a fleet command; `listen` is the hub config's `console.listen`, `file` the CLI config.
#[allow(clippy::print_stdout)]
pub async fn run(listen: &str, file: Option<PathBuf>, cmd: Command) -> Result<()> {
    match cmd {
        Command::Clusters { args, query, sort } => {
            let session = &Session::new(&args, listen, file, ALL)?;
            let mut q = vec![("sort", sort)];
            if let Some(x) = query {
                q.push(("q", x));
            }
            let v = get(session, "/api/v1/clusters", &q).await?;
            if structured(&v, &session.output)? {
                return Ok(());
            }
            let list: Vec<ClusterOverview> = serde_json::from_value(v)
                .context("the console answered something else than clusters")?;
            if session.output == "name" {
                for c in &list {
                    println!("{}", c.name);
                }
                return Ok(());
            }
            let dash = || "-".to_string();
            let rows = list
                .iter()
                .map(|c| {
                    let label = |k: &str| c.labels.get(k).cloned().unwrap_or_else(dash);
                    vec![
                        c.name.clone(),
                        if c.failing_probes.is_empty() {
                            c.health.as_str().to_string()
                        } else {
                            format!("{} ({})", c.health.as_str(), c.failing_probes.len())
                        },
                        c.version.clone().unwrap_or_else(dash),
                        label("env"),
                        label("region"),
                        label("owner"),
                        c.nodes
                            .as_ref()
                            .map_or_else(dash, |n| format!("{}/{}", n.ready, n.total)),
                        c.cni.clone().unwrap_or_else(dash),
                        c.cert_days_left.map_or_else(dash, |d| format!("{d}d")),
                        match c.compliant {
                            Some(true) => "compliant".into(),
                            Some(false) => format!("drift({})", c.failing_rules.len()),
                            None => dash(),
                        },
                        c.open_incidents.to_string(),
                    ]
                })
                .collect();
            table(
                &[
                    "NAME",
                    "HEALTH",
                    "VERSION",
                    "ENV",
                    "REGION",
                    "OWNER",
                    "NODES",
                    "CNI",
                    "CERT",
                    "BASELINE",
                    "INCIDENTS",
                ],
                rows,
            );
        }
        Command::Get {
            args,
            kind: given,
            name,
            selector,
            cluster,
            namespace,
            all_namespaces,
            limit,
        } => {
            let kind = self::kind(&given)?;
            let session = &Session::new(&args, listen, file, ALL)?;
            // kubectl: -A wins over -n; a cluster-scoped kind has no namespace
            let namespace = namespace.filter(|_| !all_namespaces && kind.namespaced);
            let mut q = vec![
                ("kind", kind.kind.to_string()),
                ("limit", limit.to_string()),
            ];
            for (k, v) in [
                ("name", name),
                ("selector", selector),
                ("cluster", cluster),
                ("namespace", namespace.clone()),
            ] {
                if let Some(v) = v {
                    q.push((k, v));
                }
            }
            let v = get(session, "/api/v1/resources", &q).await?;
            if structured(&v, &session.output)? {
                return Ok(());
            }
            let page: ResourcePage = serde_json::from_value(v)
                .context("the console answered something else than resources")?;
            if page.total == 0 {
                match &namespace {
                    Some(ns) => eprintln!("No resources found in {ns} namespace."),
                    None => eprintln!("No resources found"),
                }
                return Ok(());
            }
            if page.total > page.items.len() {
                eprintln!(
                    "({} of {} shown; --limit to see more)",
                    page.items.len(),
                    page.total
                );
            }
            if session.output == "name" {
                for o in &page.items {
                    println!("{}/{}", kind.qualified(), o.name);
                }
                return Ok(());
            }
            let wide = session.output == "wide";
            // the clusters' env and region, for -o wide
            let cluster_labels: BTreeMap<String, BTreeMap<String, String>> = if wide {
                let v = get(session, "/api/v1/clusters", &[]).await?;
                serde_json::from_value::<Vec<ClusterOverview>>(v)
                    .context("the console answered something else than clusters")?
                    .into_iter()
                    .map(|c| (c.name, c.labels))
                    .collect()
            } else {
                BTreeMap::new()
            };
            let with_ns = namespace.is_none() && kind.namespaced;
            let mut header = vec!["CLUSTER"];
            if with_ns {
                header.push("NAMESPACE");
            }
            header.extend(["NAME", "READY", "SPEC"]);
            if wide {
                header.extend(["API-VERSION", "ENV", "REGION", "LABELS"]);
            }
            let dash = || "-".to_string();
            let rows = page
                .items
                .iter()
                .map(|o| {
                    let ready = match (&o.replicas, o.ready) {
                        (Some(r), _) => r.clone(),
                        (None, Some(true)) => "ready".into(),
                        (None, Some(false)) => "not ready".into(),
                        (None, None) => o.phase.clone().unwrap_or_else(dash),
                    };
                    let mut row = vec![o.cluster.clone()];
                    if with_ns {
                        row.push(o.namespace.clone().unwrap_or_else(dash));
                    }
                    row.extend([o.name.clone(), ready]);
                    if wide {
                        let label = |k: &str| {
                            cluster_labels
                                .get(&o.cluster)
                                .and_then(|l| l.get(k))
                                .cloned()
                                .unwrap_or_else(dash)
                        };
                        let labels = o
                            .labels
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(",");
                        row.extend([
                            o.spec_hash.clone(),
                            o.api_version.clone(),
                            label("env"),
                            label("region"),
                            if labels.is_empty() { dash() } else { labels },
                        ]);
                    } else {
                        row.push(o.spec_hash.chars().take(12).collect());
                    }
                    row
                })
                .collect();
            table(&header, rows);
        }
        Command::Diff {
            args,
            object,
            clusters,
        } => {
            let parts: Vec<&str> = object.splitn(3, '/').collect();
            let [ns, kind, name] = parts[..] else {
                bail!("give the object as <namespace>/<kind>/<name> (`_` for cluster-scoped)");
            };
            let kind = self::kind(kind)?;
            let session = &Session::new(&args, listen, file, NO_NAME)?;
            let mut q = vec![("kind", kind.kind.to_string()), ("name", name.to_string())];
            if ns != "_" && !ns.is_empty() {
                q.push(("namespace", ns.to_string()));
            }
            if !clusters.is_empty() {
                q.push(("clusters", clusters.join(",")));
            }
            let v = get(session, "/api/v1/diff", &q).await?;
            if structured(&v, &session.output)? {
                return Ok(());
            }
            let cl = v["clusters"].as_array().cloned().unwrap_or_default();
            let names: Vec<String> = cl.iter().map(|c| s(&c["cluster"])).collect();
            table(
                &["CLUSTER", "SPEC HASH", "METADATA HASH", "VERSION"],
                cl.iter()
                    .map(|c| {
                        if c["present"].as_bool() == Some(true) {
                            vec![
                                s(&c["cluster"]),
                                s(&c["spec_hash"]),
                                s(&c["metadata_hash"]),
                                s(&c["api_version"]),
                            ]
                        } else {
                            vec![s(&c["cluster"]), "(absent)".into(), "-".into(), "-".into()]
                        }
                    })
                    .collect(),
            );
            println!();
            if v["identical"].as_bool() == Some(true) {
                println!("spec: the same in every cluster");
            }
            for (title, key) in [
                ("spec", "fields"),
                ("labels", "labels"),
                ("annotations", "annotations"),
            ] {
                let rows = v[key].as_array().cloned().unwrap_or_default();
                if rows.is_empty() {
                    if key != "fields" {
                        println!("{title}: the same everywhere");
                    }
                    continue;
                }
                println!("{title} differs:");
                let mut header = vec!["PATH".to_string()];
                header.extend(names.iter().map(|n| n.to_uppercase()));
                let header: Vec<&str> = header.iter().map(String::as_str).collect();
                table(
                    &header,
                    rows.iter()
                        .map(|f| {
                            let mut r = vec![s(&f["path"])];
                            r.extend(
                                f["values"]
                                    .as_array()
                                    .cloned()
                                    .unwrap_or_default()
                                    .iter()
                                    .map(|x| if x.is_null() { "(absent)".into() } else { s(x) }),
                            );
                            r
                        })
                        .collect(),
                );
                println!();
            }
        }
        Command::Compare {
            args,
            a,
            b,
            kind,
            namespace,
        } => {
            let kind = kind.as_deref().map(self::kind).transpose()?;
            let session = &Session::new(&args, listen, file, NO_NAME)?;
            let mut q = vec![("a", a.clone()), ("b", b.clone())];
            if let Some(k) = kind {
                q.push(("kind", k.kind.to_string()));
            }
            if let Some(n) = namespace {
                q.push(("namespace", n));
            }
            let v = get(session, "/api/v1/compare", &q).await?;
            if structured(&v, &session.output)? {
                return Ok(());
            }
            let c = &v["counts"];
            println!(
                "{} identical, {} differ, {} only in {a}, {} only in {b}",
                c["same"], c["differ"], c["only_in_a"], c["only_in_b"]
            );
            let label = |o: &Value| {
                format!(
                    "{}\t{}\t{}",
                    s(&o["kind"]),
                    o["namespace"].as_str().unwrap_or("-"),
                    s(&o["name"])
                )
            };
            let mut rows = Vec::new();
            for (what, key) in [
                ("differs", "differ"),
                (&*format!("only in {a}"), "only_in_a"),
                (&*format!("only in {b}"), "only_in_b"),
            ] {
                for o in v[key].as_array().cloned().unwrap_or_default() {
                    let l = label(&o);
                    let mut cols: Vec<String> = l.split('\t').map(str::to_string).collect();
                    cols.push(what.to_string());
                    rows.push(cols);
                }
            }
            if !rows.is_empty() {
                println!();
                table(&["KIND", "NAMESPACE", "NAME", "WHAT"], rows);
            }
        }
        Command::Gpu { args } => {
            let session = &Session::new(&args, listen, file, NO_NAME)?;
            let v = get(session, "/api/v1/gpu", &[]).await?;
            if structured(&v, &session.output)? {
                return Ok(());
            }
            let rows = v
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|g| {
                    let models: Vec<String> = g["models"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .iter()
                        .map(|m| format!("{}×{}", s(&m["model"]), m["allocatable"]))
                        .collect();
                    let drivers: std::collections::BTreeSet<String> = g["models"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .iter()
                        .flat_map(|m| m["driver_versions"].as_array().cloned().unwrap_or_default())
                        .map(|d| s(&d))
                        .collect();
                    vec![
                        s(&g["cluster"]),
                        s(&g["free"]),
                        s(&g["allocated"]),
                        s(&g["allocatable"]),
                        models.join(","),
                        drivers.into_iter().collect::<Vec<_>>().join(","),
                        format!(
                            "{} {}",
                            s(&g["device_plugin"]["name"]),
                            s(&g["device_plugin"]["version"])
                        ),
                        s(&g["plugin_health"]),
                    ]
                })
                .collect();
            table(
                &[
                    "CLUSTER",
                    "FREE",
                    "ALLOCATED",
                    "ALLOCATABLE",
                    "MODELS",
                    "DRIVERS",
                    "PLUGIN",
                    "PLUGIN HEALTH",
                ],
                rows,
            );
        }
        Command::ApiResources => {
            let rows = kinds::KINDS
                .iter()
                .map(|k| {
                    vec![
                        k.plural.to_string(),
                        k.short.join(","),
                        if k.group.is_empty() {
                            "v1".into()
                        } else {
                            k.group.to_string()
                        },
                        k.namespaced.to_string(),
                        k.kind.to_string(),
                        if k.collected { "yes" } else { "no" }.to_string(),
                    ]
                })
                .collect();
            table(
                &[
                    "NAME",
                    "SHORTNAMES",
                    "APIGROUP",
                    "NAMESPACED",
                    "KIND",
                    "COLLECTED",
                ],
                rows,
            );
        }
    }
    Ok(())
}
