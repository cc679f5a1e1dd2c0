//! `multipilot team add|list|rotate|remove`: access for another team to the clusters a label selector picks.
//!
//! A team gets three credentials, all scoped to its clusters:
//! - a NATS user `team-<name>` in the accounts file (between the `# --- teams ---` and `# --- hub roles ---`
//!   marks) that may subscribe to its clusters' subjects (states, facts, heartbeats, probes, events,
//!   incidents, event digests, compliance) and to its alert receiver's subject `fleet.alert.team-<name>`,
//!   as they happen, and may publish nothing. Not even a JetStream request: the server sends its answer
//!   (a consumer's info, a stored message, a publish acknowledgement) to whatever reply subject the
//!   requester names, inside the account, where a stream listening on that subject stores it — so a
//!   user with any JetStream request could write into other clusters' subjects or the audit stream.
//! - a NATS user `team-<name>-replay` (the same password) in an account of the team's own, `team-<name>`
//!   (between the `# --- team accounts ---` marks, made again from the team blocks on every change), which
//!   imports from FLEET, under the API prefix `$JS.FLEET.API`, only the requests of its consumers
//!   `<name>_<cluster>_<class>`: create with that class' filter of that cluster, pull, info, delete, ack
//!   ([`replay_requests`]). It replays what the streams hold of its clusters, can't widen a filter or read
//!   another consumer, and every answer goes back to its account;
//! - an API token (kept as its SHA-256 in the hub's tokens file) with `team` and `clusters`: the console
//!   lists only those clusters, the TSDB adds `cluster=~"<them>"` to every selector, the alert router
//!   shows and silences only their alerts.
//!
//! Clusters are picked by a label selector (`env=prod,region in (eu,us)`; `cluster` is every cluster's
//! own name) over the registry labels `multipilot cluster add --label` records. The selector is kept:
//! `cluster add` puts a new cluster into every team whose selector matches it, `cluster remove` takes it
//! out, and both update the tokens file, which the hub's services read again when it changes (no
//! restart). The bus learns of it when the accounts file is rolled out to NATS (a reload).

#![allow(clippy::print_stdout)] // a CLI: stdout is its output

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result, bail, ensure};
use clap::Subcommand;
use multipilot_runtime::auth::{Role, sha256_hex};
use multipilot_schemas::selector::Selector;
use multipilot_schemas::streams::name;
use multipilot_schemas::subject::{self, Family};

use crate::cluster::{
    Files, ROLES_MARK, TEAMS_MARK, blocks_in, check_name, hash, new_password, read, registry,
    section, write_atomic,
};

/// `multipilot team …`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Give a team a bus user and an API token that see only the clusters its selector picks.
    Add {
        /// The team's name: a DNS label.
        name: String,
        /// A label selector over the clusters' registry labels (`env=prod`, `cluster in (a,b)`).
        #[arg(long)]
        clusters: String,
        /// What its API token may do: viewer, or operator (acknowledge its incidents, silence its alerts).
        #[arg(long, default_value = "operator")]
        role: String,
        #[command(flatten)]
        files: Files,
    },
    /// The teams, their selectors and clusters.
    List {
        #[command(flatten)]
        files: Files,
    },
    /// Give a team a new bus password and a new API token (the old ones stop working).
    Rotate {
        /// The team's name.
        name: String,
        #[command(flatten)]
        files: Files,
    },
    /// Take a team's access away.
    Remove {
        /// The team's name.
        name: String,
        #[command(flatten)]
        files: Files,
    },
}

/// A team as its block records it.
#[derive(Debug, Clone, PartialEq)]
struct Team {
    name: String,
    selector: String,
    clusters: Vec<String>,
    password_hash: String,
}

/// The classes of a cluster's subjects a team reads and may replay: the class (its consumer's suffix), the
/// stream that keeps it, the subject family, and whether the hub's partition mapping appends a token to
/// the family's subjects (a one-token family then needs `<cluster>.*` as well).
const CLASSES: [(&str, &str, Family, bool); 9] = [
    ("state", name::STATE, subject::STATE, true),
    ("resync", name::STATE, subject::RESYNC, true),
    ("facts", name::FACTS, subject::FACTS, true),
    ("hb", name::HEALTH, subject::HEARTBEAT, true),
    ("probe", name::HEALTH, subject::PROBE, true),
    ("event", name::EVENTS, subject::EVENT, true),
    ("incident", name::INCIDENTS, subject::INCIDENT, false),
    ("digest", name::INCIDENTS, subject::DIGEST, false),
    ("compliance", name::INCIDENTS, subject::COMPLIANCE, false),
];

/// The filters of one class of cluster `c`'s subjects.
fn class_filters(family: Family, partitioned: bool, c: &str) -> Vec<String> {
    let own = family.of_cluster(c);
    if partitioned && !own.ends_with('>') {
        vec![own.clone(), format!("{own}.*")]
    } else {
        vec![own]
    }
}

/// Marks the accounts of the teams' replay users (after the agents' accounts); made again from the teams'
/// blocks whenever they change.
const ACCOUNTS_MARK: &str = "# --- team accounts ---";
const ACCOUNTS_END: &str = "# --- end of team accounts ---";

/// The consumer a team replays a class of a cluster's subjects with: `<team>_<cluster>_<class>`.
pub fn consumer_name(team: &str, cluster: &str, class: &str) -> String {
    format!("{team}_{cluster}_{class}")
}

/// The JetStream API prefix of a team's account (`jetstream::with_prefix`): its requests there are
/// FLEET's `$JS.API` ones it imports. (The account has no JetStream of its own, and the server answers
/// `$JS.API` requests in such an account itself: "JetStream not enabled".)
pub const REPLAY_API_PREFIX: &str = "$JS.FLEET.API";

/// The JetStream requests a team's replay user makes, as `(in its account, in FLEET)`, each imported by
/// its account from FLEET as a service: per cluster and class, creating its consumer with that filter (or
/// a narrower one: the filter is part of the request subject, and the server checks it against the
/// request), pulling from it, its info, deleting it, and acknowledging its messages. Nothing else of FLEET
/// reaches the account, and the answers come back to it whatever reply subject it names.
pub fn replay_requests(team: &str, clusters: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut api = |what: String| {
        out.push((
            format!("{REPLAY_API_PREFIX}.{what}"),
            format!("$JS.API.{what}"),
        ))
    };
    let mut acks = Vec::new();
    for c in clusters {
        for (class, stream, family, partitioned) in CLASSES {
            let name = consumer_name(team, c, class);
            for f in class_filters(family, partitioned, c) {
                api(format!("CONSUMER.CREATE.{stream}.{name}.{f}"));
            }
            api(format!("CONSUMER.MSG.NEXT.{stream}.{name}"));
            api(format!("CONSUMER.INFO.{stream}.{name}"));
            api(format!("CONSUMER.DELETE.{stream}.{name}"));
            // a message's acknowledgement subject is FLEET's: the same in the team's account
            let ack = format!("$JS.ACK.{stream}.{name}.>");
            acks.push((ack.clone(), ack));
        }
    }
    out.extend(acks);
    out
}

/// The account of a team's replay user, `team-<name>`: its user `team-<name>-replay` (the team's
/// password) and its imports.
fn account_block(t: &Team) -> String {
    let pairs = replay_requests(&t.name, &t.clusters);
    let requests: Vec<String> = pairs.iter().map(|(local, _)| local.clone()).collect();
    let imports: Vec<String> = pairs
        .iter()
        .map(|(local, remote)| {
            format!("{{ service: {{ account: FLEET, subject: \"{remote}\" }}, to: \"{local}\" }}")
        })
        .collect();
    format!(
        "  team-{name} {{\n\
         \x20   # the replay user of team {name}: consumers of its clusters' subjects (see FLEET's exports)\n\
         \x20   users: [\n\
         \x20     {{\n\
         \x20       user: team-{name}-replay, password: \"{hash}\"\n\
         \x20       permissions: {{\n\
         \x20         publish: {{ allow: [\n\
         \x20           {requests}\n\
         \x20         ] }}\n\
         \x20         subscribe: {{ allow: [\"_INBOX_team-{name}.>\"] }}\n\
         \x20       }}\n\
         \x20     }}\n\
         \x20   ]\n\
         \x20   imports: [\n\
         \x20     {imports}\n\
         \x20   ]\n\
         \x20 }}\n",
        name = t.name,
        hash = t.password_hash,
        requests = quoted(&requests).replace("\n              ", "\n            "),
        imports = imports.join(",\n      "),
    )
}

/// The accounts file with the teams' accounts made again from their blocks (the section is added after
/// the agents' accounts when there is none).
fn sync_accounts(text: &str) -> Result<String> {
    let mut text = text.to_string();
    if !text.contains(ACCOUNTS_MARK) {
        let at = text.find(crate::cluster::AGENTS_END).with_context(|| {
            format!(
                "no `{}` line in the accounts file",
                crate::cluster::AGENTS_END
            )
        })?;
        let line_end = text[at..]
            .find('\n')
            .map(|i| at + i + 1)
            .unwrap_or(text.len());
        text.insert_str(line_end, &format!("  {ACCOUNTS_MARK}\n  {ACCOUNTS_END}\n"));
    }
    let (from, to) = section(&text, ACCOUNTS_MARK, &[ACCOUNTS_END])?;
    let blocks: String = teams(&text)?
        .iter()
        .map(|(_, _, t)| account_block(t))
        .collect();
    text.replace_range(from..to, &blocks);
    Ok(text)
}

/// What a team's bus user may subscribe to: its clusters' subjects and its receiver's alerts. It may
/// publish nothing: no JetStream request either, since the server answers any request on the reply
/// subject the requester names, in the account, where a stream may store it.
pub fn permissions(team: &str, clusters: &[String]) -> Vec<String> {
    let mut subscribe: Vec<String> = clusters
        .iter()
        .flat_map(|c| {
            CLASSES.iter().flat_map(move |(_, _, family, partitioned)| {
                class_filters(*family, *partitioned, c)
            })
        })
        .collect();
    subscribe.push(subject::alert(&format!("team-{team}")));
    subscribe
}

fn quoted(items: &[String]) -> String {
    items
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(",\n              ")
}

fn team_block(t: &Team) -> Result<String> {
    let subscribe = permissions(&t.name, &t.clusters);
    Ok(format!(
        "      {{\n\
         \x20       # team: {name}\n\
         \x20       # selector: {selector}\n\
         \x20       # clusters: {clusters}\n\
         \x20       user: team-{name}, password: \"{hash}\"\n\
         \x20       permissions: {{\n\
         \x20         publish: {{ deny: [\">\"] }}\n\
         \x20         subscribe: {{\n\
         \x20           allow: [\n\
         \x20             {subscribe}\n\
         \x20           ]\n\
         \x20         }}\n\
         \x20       }}\n\
         \x20     }}\n",
        name = t.name,
        selector = serde_json::to_string(&t.selector)?,
        clusters = serde_json::to_string(&t.clusters)?,
        hash = t.password_hash,
        subscribe = quoted(&subscribe),
    ))
}

/// The accounts file with a teams section (added before the hub roles when it has none).
fn with_section(text: &str) -> Result<String> {
    if text.contains(TEAMS_MARK) {
        return Ok(text.to_string());
    }
    let at = text
        .find(ROLES_MARK)
        .with_context(|| format!("no `{ROLES_MARK}` line in the accounts file"))?;
    let line = text[..at].rfind('\n').map(|i| i + 1).unwrap_or(at);
    Ok(format!(
        "{}      {TEAMS_MARK}{}\n{}",
        &text[..line],
        "-".repeat(90),
        &text[line..]
    ))
}

fn team_section(text: &str) -> Result<(usize, usize)> {
    section(text, TEAMS_MARK, &[ROLES_MARK])
}

fn teams(text: &str) -> Result<Vec<(usize, usize, Team)>> {
    if !text.contains(TEAMS_MARK) {
        return Ok(Vec::new());
    }
    blocks_in(text, team_section(text)?, "team-")?
        .into_iter()
        .map(|(from, to, name)| {
            let body = &text[from..to];
            let field = |key: &str| {
                body.lines()
                    .find_map(|l| l.trim().strip_prefix(&format!("# {key}: ")))
                    .map(str::to_string)
                    .with_context(|| format!("the block of team-{name} has no `# {key}:` line"))
            };
            let selector: String = serde_json::from_str(&field("selector")?)?;
            let clusters: Vec<String> = serde_json::from_str(&field("clusters")?)?;
            let password_hash = body
                .split("password: \"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .with_context(|| format!("the block of team-{name} has no password"))?
                .to_string();
            Ok((
                from,
                to,
                Team {
                    name,
                    selector,
                    clusters,
                    password_hash,
                },
            ))
        })
        .collect()
}

/// The clusters of the registry a selector picks (`cluster` is each one's own name).
fn pick(text: &str, selector: &str) -> Result<Vec<String>> {
    let sel = Selector::parse(selector)?;
    Ok(registry(text)?
        .into_iter()
        .filter(|(name, labels)| {
            sel.matches(|k| {
                if k == "cluster" {
                    Some(name.as_str())
                } else {
                    labels.get(k).map(String::as_str)
                }
            })
        })
        .map(|(name, _)| name)
        .collect())
}

/// Every team's block made again from its selector and the clusters there are now.
pub fn refresh_all(text: &str) -> Result<String> {
    let mut out = text.to_string();
    // from the last block back, so the earlier offsets stay right
    for (from, to, mut t) in teams(text)?.into_iter().rev() {
        t.clusters = pick(text, &t.selector)?;
        out.replace_range(from..to, &team_block(&t)?);
    }
    sync_accounts(&out)
}

/// After `cluster` was added: every team block made again; the teams that now hold the cluster.
pub fn join(text: &str, cluster: &str) -> Result<(String, Vec<String>)> {
    let out = refresh_all(text)?;
    let joined = teams(&out)?
        .into_iter()
        .filter(|(_, _, t)| t.clusters.iter().any(|c| c == cluster))
        .map(|(_, _, t)| t.name)
        .collect();
    Ok((out, joined))
}

fn load_tokens(path: &Path) -> Result<Vec<serde_yaml::Value>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = read(path)?;
    serde_yaml::from_str::<Option<Vec<serde_yaml::Value>>>(&text)
        .with_context(|| format!("parsing the tokens file {}", path.display()))
        .map(Option::unwrap_or_default)
}

fn save_tokens(path: &Path, entries: &[serde_yaml::Value]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    write_private(path, &serde_yaml::to_string(entries)?)
}

/// Writes a file only its owner can read, from its first byte (through a temporary file in the same
/// directory, renamed over it).
fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write as _;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        o.mode(0o600);
    }
    let mut f = o
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

fn team_of(entry: &serde_yaml::Value) -> Option<&str> {
    entry.get("team").and_then(|t| t.as_str())
}

/// Sets every team token's `clusters` to what the accounts file says its team has now.
pub fn update_tokens(path: &Path, accounts: &str) -> Result<()> {
    let teams: BTreeMap<String, Team> = teams(accounts)?
        .into_iter()
        .map(|(_, _, t)| (t.name.clone(), t))
        .collect();
    let mut entries = load_tokens(path)?;
    let mut changed = false;
    for e in &mut entries {
        let Some(t) = team_of(e).and_then(|n| teams.get(n)) else {
            continue;
        };
        let now = serde_yaml::to_value(&t.clusters)?;
        if e.get("clusters") != Some(&now)
            && let Some(m) = e.as_mapping_mut()
        {
            m.insert("clusters".into(), now);
            changed = true;
        }
    }
    if changed {
        save_tokens(path, &entries)?;
    }
    Ok(())
}

/// A new API token: 32 random bytes, like a password.
fn new_token() -> String {
    format!("mpt_{}", &new_password()[1..])
}

/// Writes the team's credentials (mode 0600) and returns where.
fn write_credentials(
    files: &Files,
    t: &Team,
    password: &str,
    token: &str,
) -> Result<std::path::PathBuf> {
    let dir = files.secrets_dir.join(format!("team-{}", t.name));
    std::fs::create_dir_all(&dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let path = dir.join("credentials.yaml");
    let body = serde_yaml::to_string(&serde_json::json!({
        "team": t.name,
        "clusters": t.clusters,
        "nats": {
            "user": format!("team-{}", t.name),
            "password": password,
            // the same password; its account creates and reads the consumers named <team>_<cluster>_<class>
            "replay_user": format!("team-{}-replay", t.name),
            "inbox_prefix": format!("_INBOX_team-{}", t.name),
        },
        "api_token": token,
    }))?;
    write_private(&path, &body)?;
    Ok(path)
}

/// Puts a team's token into the tokens file (replacing its earlier one).
fn put_token(files: &Files, t: &Team, role: Role, token: &str) -> Result<()> {
    let path = files.tokens();
    let mut entries = load_tokens(&path)?;
    entries.retain(|e| team_of(e) != Some(t.name.as_str()));
    entries.push(serde_yaml::to_value(serde_json::json!({
        "token_sha256": sha256_hex(token),
        "subject": format!("team-{}", t.name),
        "role": role.name(),
        "team": t.name,
        "clusters": t.clusters,
        "selector": t.selector,
    }))?);
    save_tokens(&path, &entries)
}

fn role_of_token(files: &Files, team: &str) -> Result<Role> {
    let entries = load_tokens(&files.tokens())?;
    Ok(entries
        .iter()
        .find(|e| team_of(e) == Some(team))
        .and_then(|e| e.get("role"))
        .and_then(|r| serde_yaml::from_value(r.clone()).ok())
        .unwrap_or(Role::Viewer))
}

fn rollout_hint(files: &Files) -> String {
    format!(
        "roll {} out to NATS (kubectl apply -k <your hub overlay>, or `nats-server --signal reload`) and {} \
         to the hub (deploy/examples/secrets.sh hub … renders the Secret multipilot-api-tokens; the \
         services read the file again when it changes)",
        files.accounts.display(),
        files.tokens().display()
    )
}

/// Runs a `team` command.
pub fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::Add {
            name,
            clusters,
            role,
            files,
        } => {
            check_name(&name).map_err(|e| {
                anyhow::anyhow!("{}", e.to_string().replace("cluster name", "team name"))
            })?;
            let role: Role = serde_yaml::from_str(&role)
                .ok()
                .with_context(|| format!("--role {role:?}: use viewer or operator"))?;
            ensure!(
                role != Role::Releaser,
                "a team's token can't be a releaser's: releases span clusters (use viewer or operator)"
            );
            ensure!(
                !clusters.trim().is_empty(),
                "--clusters is empty, which would be the whole fleet: name the team's clusters by label \
                 (env=prod) or by name (cluster in (a,b))"
            );
            let text = with_section(&read(&files.accounts)?)?;
            ensure!(
                teams(&text)?.iter().all(|(_, _, t)| t.name != name),
                "team {name} exists already: `multipilot team rotate {name}` gives it new credentials"
            );
            let picked = pick(&text, &clusters)?;
            if picked.is_empty() {
                let known: Vec<String> = registry(&text)?
                    .into_iter()
                    .map(|(n, l)| {
                        let l: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v}")).collect();
                        format!("{n} {{{}}}", l.join(","))
                    })
                    .collect();
                bail!(
                    "the selector {clusters:?} matches no cluster; the clusters and their labels: {}",
                    if known.is_empty() {
                        "none (multipilot cluster add)".to_string()
                    } else {
                        known.join(", ")
                    }
                );
            }
            let password = new_password();
            let t = Team {
                name: name.clone(),
                selector: clusters,
                clusters: picked,
                password_hash: hash(&password)?,
            };
            let (_, end) = team_section(&text)?;
            let updated = sync_accounts(&format!(
                "{}{}{}",
                &text[..end],
                team_block(&t)?,
                &text[end..]
            ))?;
            let token = new_token();
            let creds = write_credentials(&files, &t, &password, &token)?;
            put_token(&files, &t, role, &token)?;
            write_atomic(&files.accounts, &updated)?;
            println!(
                "team {name}: {} cluster(s): {}\n\
                 NATS users team-{name} (live) and team-{name}-replay (replay: consumers named \
                 {name}_<cluster>_<class>) added to {}; API token ({}) added to {}\n\
                 its credentials (NATS password, API token): {} — hand them over, keep them out of Git\n\
                 next: {}",
                t.clusters.len(),
                t.clusters.join(", "),
                files.accounts.display(),
                role.name(),
                files.tokens().display(),
                creds.display(),
                rollout_hint(&files),
            );
            Ok(())
        }
        Command::List { files } => {
            let text = read(&files.accounts)?;
            for (_, _, t) in teams(&text)? {
                println!("{}\t{}\t{}", t.name, t.selector, t.clusters.join(","));
            }
            Ok(())
        }
        Command::Rotate { name, files } => {
            let text = read(&files.accounts)?;
            let Some((from, to, mut t)) =
                teams(&text)?.into_iter().find(|(_, _, t)| t.name == name)
            else {
                bail!("no such team: there is no team-{name} user");
            };
            let password = new_password();
            t.password_hash = hash(&password)?;
            t.clusters = pick(&text, &t.selector)?;
            let mut updated = text.clone();
            updated.replace_range(from..to, &team_block(&t)?);
            let updated = sync_accounts(&updated)?;
            let token = new_token();
            let role = role_of_token(&files, &name)?;
            let creds = write_credentials(&files, &t, &password, &token)?;
            put_token(&files, &t, role, &token)?;
            write_atomic(&files.accounts, &updated)?;
            println!(
                "team {name}: new credentials in {}; {}",
                creds.display(),
                rollout_hint(&files)
            );
            Ok(())
        }
        Command::Remove { name, files } => {
            let text = read(&files.accounts)?;
            let Some((from, to, _)) = teams(&text)?.into_iter().find(|(_, _, t)| t.name == name)
            else {
                bail!("no such team: there is no team-{name} user");
            };
            let updated = sync_accounts(&format!("{}{}", &text[..from], &text[to..]))?;
            let path = files.tokens();
            let mut entries = load_tokens(&path)?;
            let before = entries.len();
            entries.retain(|e| team_of(e) != Some(name.as_str()));
            if entries.len() != before {
                save_tokens(&path, &entries)?;
            }
            write_atomic(&files.accounts, &updated)?;
            println!(
                "team {name}: NATS user and API token removed; {}",
                rollout_hint(&files)
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_team_block_round_trips_and_follows_its_selector() {
        let shipped = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nats/accounts.conf"),
        )
        .unwrap();
        let text = with_section(&shipped).unwrap();
        assert!(teams(&text).unwrap().is_empty());
        let t = Team {
            name: "payments".into(),
            selector: "env in (prod)".into(),
            clusters: vec!["prod-1".into()],
            password_hash: "$2a$11$abc".into(),
        };
        let (_, end) = team_section(&text).unwrap();
        let added = format!(
            "{}{}{}",
            &text[..end],
            team_block(&t).unwrap(),
            &text[end..]
        );
        let found = teams(&added).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].2, t);
        // prod-1 has no labels: the selector picks nothing once refreshed, `cluster in (…)` picks it
        let refreshed = refresh_all(&added).unwrap();
        assert!(teams(&refreshed).unwrap()[0].2.clusters.is_empty());
        assert_eq!(pick(&added, "cluster in (prod-1)").unwrap(), vec!["prod-1"]);
        assert!(pick(&added, "env in (prod").is_err());
        let subscribe = permissions("payments", &["prod-1".into()]);
        assert!(
            subscribe
                .iter()
                .all(|x| x.contains("prod-1") || x == "fleet.alert.team-payments")
        );
        assert!(subscribe.contains(&"fleet.incident.prod-1.>".to_string()));
        // the team's account follows its block: made, made again the same, gone with the team
        let with_account = sync_accounts(&added).unwrap();
        assert!(with_account.contains("  team-payments {\n"));
        assert!(with_account.contains(
            "{ service: { account: FLEET, subject: \"$JS.API.CONSUMER.CREATE.FLEET_EVENTS.payments_prod-1_event.fleet.event.prod-1.>\" }, to: \"$JS.FLEET.API.CONSUMER.CREATE.FLEET_EVENTS.payments_prod-1_event.fleet.event.prod-1.>\" }"
        ));
        assert_eq!(sync_accounts(&with_account).unwrap(), with_account);
        let (from, to, _) = teams(&with_account).unwrap().remove(0);
        let removed =
            sync_accounts(&format!("{}{}", &with_account[..from], &with_account[to..])).unwrap();
        assert!(!removed.contains("team-payments"), "{removed}");
    }
}
