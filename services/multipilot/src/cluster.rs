//! `multipilot cluster add|remove|rotate|list`: onboarding a workload cluster.
//!
//! `add` mints the cluster's bus credentials and writes what to apply in that cluster:
//! - a NATS account and user `agent-<name>` in the accounts file (`deploy/nats/accounts.conf`), made from
//!   the shipped `agent-prod-1` account with every `prod-1` token replaced, so it has exactly the imports and
//!   permissions the shipped agent has, scoped to the cluster's own subjects, command subject and inbox
//!   prefix; and the FLEET account's import of its command subject. An account of its own, not a user of
//!   FLEET: the answer to a request goes to the reply subject the requester names, in the account the request
//!   is handled in, and a stream of FLEET listening there would store it. Across a service import, the reply
//!   subject is the server's own and the answer goes back to the agent's account. Its password is stored as a
//!   bcrypt hash, so the accounts file (and the ConfigMap made from it) holds nothing secret;
//! - the Secret `multipilot-agent-nats` (password, the bus CA) as a manifest under `--secrets-dir`, kept out of
//!   Git like every other Secret;
//! - an agent overlay (`kustomization.yaml` + `agent.yaml`: name, labels, NATS URL) under `--overlay-dir`.
//!
//! `remove` deletes the user (the NATS servers drop its connections when they load the new accounts file),
//! `rotate` replaces its password. Both take effect once the NATS config is rolled out again (`kubectl apply
//! -k`: the ConfigMap's name carries a hash of the file, so the StatefulSet restarts).

#![allow(clippy::print_stdout)] // a CLI: stdout is its output

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context as _, Result, bail, ensure};
use base64::Engine as _;
use clap::Subcommand;
use rand::RngCore as _;

/// The cluster the accounts file's agent block is written for.
const TEMPLATE_CLUSTER: &str = "prod-1";
pub(crate) const AGENTS_MARK: &str = "# --- agents ---";
pub(crate) const AGENTS_END: &str = "# --- end of agents ---";
/// The FLEET account's imports of the agents' command subjects.
const COMMANDS_MARK: &str = "# --- agent commands ---";
const COMMANDS_END: &str = "# --- end of agent commands ---";
pub(crate) const TEAMS_MARK: &str = "# --- teams ---";
pub(crate) const ROLES_MARK: &str = "# --- hub roles ---";

/// `multipilot cluster …`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Onboard a cluster: mint its agent's bus user, write its Secret and its agent overlay.
    Add {
        /// The cluster's name: a DNS label (lower-case letters, digits, `-`), unique in the fleet.
        name: String,
        /// Registry labels (env, region, owner…), KEY=VALUE, repeatable.
        #[arg(long = "label", short = 'l')]
        labels: Vec<String>,
        #[command(flatten)]
        files: Files,
        /// Where the agent overlay goes (`<dir>/<name>/`).
        #[arg(long, default_value = "deploy/site/agents")]
        overlay_dir: PathBuf,
        /// The agent base the overlay builds on.
        #[arg(long, default_value = "deploy/k8s/agent")]
        base: PathBuf,
        /// The bus as the workload cluster reaches it (a name in the NATS certificate).
        #[arg(long, default_value = "nats://nats.multipilot.example.com:4222")]
        nats_url: String,
        /// Also execute releases (the `release-executor` component and the release role's public key from
        /// `<secrets-dir>/material/signing.key.pub`).
        #[arg(long)]
        release: bool,
    },
    /// Offboard a cluster: delete its agent's bus user (its Secret and overlay are yours to delete).
    Remove {
        /// The cluster's name.
        name: String,
        #[command(flatten)]
        files: Files,
    },
    /// Give a cluster's agent a new password (the old one stops working with the new accounts file).
    Rotate {
        /// The cluster's name.
        name: String,
        #[command(flatten)]
        files: Files,
    },
    /// The clusters that have an agent user.
    List {
        #[command(flatten)]
        files: Files,
    },
}

/// The files the commands edit.
#[derive(Debug, clap::Args)]
pub struct Files {
    /// The NATS accounts file that gets the agent users.
    #[arg(long, default_value = "deploy/nats/accounts.conf")]
    pub(crate) accounts: PathBuf,
    /// Where Secrets are written (`agent-<name>/`) and the bus CA is read (`material/ca.crt`), as
    /// `deploy/examples/secrets.sh` lays them out.
    #[arg(long, default_value = "secrets")]
    pub(crate) secrets_dir: PathBuf,
    /// The API tokens file of the hub (console, TSDB, alert router), where teams' tokens are kept; default
    /// `<secrets-dir>/material/tokens.yaml`, as `deploy/examples/secrets.sh` lays it out.
    #[arg(long)]
    tokens: Option<PathBuf>,
}

impl Files {
    /// The tokens file.
    pub(crate) fn tokens(&self) -> PathBuf {
        self.tokens
            .clone()
            .unwrap_or_else(|| self.secrets_dir.join("material/tokens.yaml"))
    }
}

/// Runs a `cluster` command.
pub fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::Add {
            name,
            labels,
            files,
            overlay_dir,
            base,
            nats_url,
            release,
        } => {
            check_name(&name)?;
            let labels = parse_labels(&labels)?;
            let text = read(&files.accounts)?;
            ensure!(
                !users(&text)?.contains(&name),
                "cluster {name} already has an agent user in {}: `multipilot cluster rotate {name}` gives it a new password",
                files.accounts.display()
            );
            let password = new_password();
            let block = agent_block(&text, &name, &hash(&password)?, &labels)?;
            let updated = insert_block(&text, &block)?;
            // the teams whose selector matches the new cluster take it in
            let (updated, teams) = crate::team::join(&updated, &name)?;
            let ca = files.secrets_dir.join("material/ca.crt");
            let ca_pem = std::fs::read_to_string(&ca).with_context(|| {
                format!(
                    "reading the bus CA {} (deploy/examples/secrets.sh hub {} makes it)",
                    ca.display(),
                    files.secrets_dir.display()
                )
            })?;
            let overlay = overlay_dir.join(&name);
            write_overlay(&overlay, &base, &name, &labels, &nats_url, release)?;
            let secrets = files.secrets_dir.join(format!("agent-{name}"));
            write_secrets(&secrets, &files.secrets_dir, &password, &ca_pem, release)?;
            write_atomic(&files.accounts, &updated)?;
            crate::team::update_tokens(&files.tokens(), &updated)?;
            for team in &teams {
                println!("cluster {name} joins the team {team} (its selector matches)");
            }
            println!(
                "cluster {name}: NATS account and user agent-{name} added to {accounts}\n\
                 \n\
                 1. on the management cluster, roll the new accounts out to NATS:\n\
                 \x20    kubectl apply -k <your hub overlay>\n\
                 2. in the cluster {name}:\n\
                 \x20    kubectl --context {name} create namespace multipilot\n\
                 \x20    kubectl --context {name} apply -f {secrets}/\n\
                 \x20    kubectl --context {name} apply -k {overlay}\n\
                 \n\
                 {secrets}/ holds the agent's password: keep it out of Git.",
                accounts = files.accounts.display(),
                secrets = secrets.display(),
                overlay = overlay.display(),
            );
            Ok(())
        }
        Command::Remove { name, files } => {
            let text = read(&files.accounts)?;
            let updated = remove_block(&text, &name)
                .with_context(|| format!("cluster {name} in {}", files.accounts.display()))?;
            // and it leaves every team
            let updated = crate::team::refresh_all(&updated)?;
            write_atomic(&files.accounts, &updated)?;
            crate::team::update_tokens(&files.tokens(), &updated)?;
            println!(
                "cluster {name}: NATS account and user agent-{name} removed from {}; roll it out to NATS (kubectl apply -k \
                 <your hub overlay>) and the agent is refused",
                files.accounts.display()
            );
            Ok(())
        }
        Command::Rotate { name, files } => {
            let text = read(&files.accounts)?;
            let without = remove_block(&text, &name)
                .with_context(|| format!("cluster {name} in {}", files.accounts.display()))?;
            let password = new_password();
            let labels = labels_of(&text, &name)?;
            let updated = insert_block(
                &without,
                &agent_block(&text, &name, &hash(&password)?, &labels)?,
            )?;
            let secrets = files.secrets_dir.join(format!("agent-{name}"));
            let ca = std::fs::read_to_string(files.secrets_dir.join("material/ca.crt"))
                .context("reading the bus CA")?;
            write_secrets(&secrets, &files.secrets_dir, &password, &ca, false)?;
            write_atomic(&files.accounts, &updated)?;
            println!(
                "cluster {name}: new password in {}/; apply it in {name}, then roll the accounts out to NATS",
                secrets.display()
            );
            Ok(())
        }
        Command::List { files } => {
            let text = read(&files.accounts)?;
            for name in users(&text)? {
                let labels = labels_of(&text, &name)?;
                let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!("{name}\t{}", labels.join(","));
            }
            Ok(())
        }
    }
}

pub(crate) fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// A cluster name is a subject token, a label value and part of object names: a DNS label.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    ensure!(
        ok,
        "{name:?} is not a valid cluster name: use a DNS label (at most 63 lower-case letters, digits and '-', \
         not starting or ending with '-')"
    );
    // an agent's inbox prefix is `_INBOX_<cluster>`: a cluster named like a hub role would read its replies
    ensure!(
        !RESERVED.contains(&name),
        "{name:?} is reserved (the name of a hub role or bus user, whose reply inbox `_INBOX_{name}` an agent of \
         that name would share): choose another"
    );
    Ok(())
}

/// Names no cluster may have: the hub's users, whose inbox prefixes an agent's would be.
const RESERVED: [&str; 9] = [
    "correlator",
    "tsdb",
    "alerts",
    "release",
    "console",
    "operator",
    "admin",
    "sys",
    "fleet",
];

fn parse_labels(labels: &[String]) -> Result<BTreeMap<String, String>> {
    labels
        .iter()
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .with_context(|| format!("label {l:?} is not KEY=VALUE"))?;
            ensure!(!k.is_empty(), "label {l:?} has no key");
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

/// 32 random bytes, URL-safe base64, starting with a letter (a leading digit would read as a number where
/// the value passes through an environment variable).
pub(crate) fn new_password() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "p{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// A bcrypt hash in the `$2a$` form nats-server accepts.
pub(crate) fn hash(password: &str) -> Result<String> {
    Ok(bcrypt::hash_with_result(password, 11)
        .context("hashing the password")?
        .format_for_version(bcrypt::Version::TwoA))
}

/// The text between the line of `mark` and the line of the next of `ends` (whichever comes first).
pub(crate) fn section(text: &str, mark: &str, ends: &[&str]) -> Result<(usize, usize)> {
    let start = text
        .find(mark)
        .with_context(|| format!("no `{mark}` line in the accounts file"))?;
    let start = start + text[start..].find('\n').unwrap_or(0) + 1;
    let end = ends
        .iter()
        .filter_map(|e| text[start..].find(e).map(|i| start + i))
        .min()
        .with_context(|| format!("no `{}` line after `{mark}`", ends.join("` or `")))?;
    // the next mark's own line starts with indentation: end the section at its line start
    let end = text[..end].rfind('\n').map(|i| i + 1).unwrap_or(end);
    Ok((start, end))
}

/// The agents' accounts: between the agents mark and its end.
fn agent_section(text: &str) -> Result<(usize, usize)> {
    ensure!(
        !text.contains(AGENTS_MARK) || text.contains(AGENTS_END),
        "this accounts file keeps its agents as users of the FLEET account (the layout before each agent \
         had an account of its own): there, the server delivers the answer to anything an agent asks to the \
         reply subject the agent names, where a stream may store it. Start from the shipped \
         deploy/nats/accounts.conf (carry your own changes to the hub roles over), then onboard each \
         cluster again with `multipilot cluster add <name> --label …` and apply its new Secret"
    );
    section(text, AGENTS_MARK, &[AGENTS_END])
}

/// FLEET's imports of the agents' command subjects, one line each.
fn commands_section(text: &str) -> Result<(usize, usize)> {
    section(text, COMMANDS_MARK, &[COMMANDS_END])
}

/// The line of FLEET's imports that brings `name`'s command subject in: (start, end).
fn command_line(text: &str, name: &str) -> Result<Option<(usize, usize)>> {
    let (start, end) = commands_section(text)?;
    let needle = format!("account: agent-{name},");
    let mut at = start;
    for line in text[start..end].split_inclusive('\n') {
        if line.contains(&needle) {
            return Ok(Some((at, at + line.len())));
        }
        at += line.len();
    }
    Ok(None)
}

/// Each `{ … }` user block of a section whose user is `<prefix><name>`: (start, end, name).
pub(crate) fn blocks_in(
    text: &str,
    (start, end): (usize, usize),
    prefix: &str,
) -> Result<Vec<(usize, usize, String)>> {
    let section = &text[start..end];
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut open = None;
    let mut line_start = 0usize;
    for (i, c) in section.char_indices() {
        match c {
            '\n' => line_start = i + 1,
            // a comment may hold braces (a team's selector): skip to the end of its line
            _ if section[line_start..i].trim_start().starts_with('#') => {}
            '{' => {
                if depth == 0 {
                    // from the start of the line, so the block keeps its indentation
                    open = Some(line_start);
                }
                depth += 1;
            }
            '}' => {
                depth = depth
                    .checked_sub(1)
                    .context("unbalanced braces in the accounts file")?;
                if depth == 0 {
                    let from = open
                        .take()
                        .context("unbalanced braces in the accounts file")?;
                    let to = section[i..].find('\n').map(|n| i + n + 1).unwrap_or(i + 1);
                    let body = &section[from..to];
                    let user = body
                        .split(&format!("user: {prefix}"))
                        .nth(1)
                        .and_then(|r| r.split([',', ' ', '\n']).next())
                        .with_context(|| format!("a block without `user: {prefix}…`: {body}"))?;
                    out.push((start + from, start + to, user.to_string()));
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Each account block of the agent section: (start, end, cluster name).
fn blocks(text: &str) -> Result<Vec<(usize, usize, String)>> {
    blocks_in(text, agent_section(text)?, "agent-")
}

/// The line of a block that records a cluster's registry labels (`multipilot cluster add --label`), which
/// team selectors are matched against.
const LABELS_LINE: &str = "# labels: ";

/// A cluster's registry labels, as its agent block records them (none for a block from before labels
/// were recorded).
pub(crate) fn labels_of(text: &str, name: &str) -> Result<BTreeMap<String, String>> {
    let (from, to, _) = blocks(text)?
        .into_iter()
        .find(|(_, _, n)| n == name)
        .with_context(|| format!("no such cluster: there is no agent-{name} user"))?;
    let Some(line) = text[from..to]
        .lines()
        .find_map(|l| l.trim().strip_prefix(LABELS_LINE))
    else {
        return Ok(BTreeMap::new());
    };
    serde_json::from_str(line).with_context(|| format!("the labels of agent-{name}: {line}"))
}

/// Every cluster with an agent user, with its registry labels.
pub(crate) fn registry(text: &str) -> Result<BTreeMap<String, BTreeMap<String, String>>> {
    users(text)?
        .into_iter()
        .map(|n| Ok((n.clone(), labels_of(text, &n)?)))
        .collect()
}

fn users(text: &str) -> Result<Vec<String>> {
    Ok(blocks(text)?.into_iter().map(|(_, _, n)| n).collect())
}

/// The template cluster's account block and command import line, rewritten for `name`, with a hashed
/// password.
fn agent_block(
    text: &str,
    name: &str,
    password_hash: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(String, String)> {
    let (from, to) = command_line(text, TEMPLATE_CLUSTER)?.with_context(|| {
        format!(
            "the accounts file imports no command subject of agent-{TEMPLATE_CLUSTER} into FLEET \
             (between `{COMMANDS_MARK}` and `{COMMANDS_END}`) to copy"
        )
    })?;
    let import = text[from..to].replace(TEMPLATE_CLUSTER, name);
    let (from, to, _) = blocks(text)?
        .into_iter()
        .find(|(_, _, n)| n == TEMPLATE_CLUSTER)
        .with_context(|| {
            format!(
                "the accounts file has no agent-{TEMPLATE_CLUSTER} block to copy permissions from"
            )
        })?;
    // the template's own registry labels are its, not the new cluster's
    let template: String = text[from..to]
        .lines()
        .filter(|l| !l.trim_start().starts_with(LABELS_LINE))
        .map(|l| format!("{l}\n"))
        .collect();
    let template = template.as_str();
    let re = regex::Regex::new(r"password: *[^\n,]+").expect("valid regex");
    ensure!(
        re.is_match(template),
        "the agent-{TEMPLATE_CLUSTER} block has no password"
    );
    // every subject, the user and the inbox prefix name the cluster by its token
    let block = template.replace(TEMPLATE_CLUSTER, name);
    // NoExpand: a bcrypt hash is full of `$`, which a replacement string would read as group references
    let password = format!("password: \"{password_hash}\"");
    let block = re.replace(&block, regex::NoExpand(&password)).into_owned();
    if labels.is_empty() {
        return Ok((block, import));
    }
    // the labels go on a comment line after the user's
    let at = block.find('\n').map(|i| i + 1).unwrap_or(block.len());
    let indent: String = block[at..].chars().take_while(|c| *c == ' ').collect();
    let block = format!(
        "{}{indent}{LABELS_LINE}{}\n{}",
        &block[..at],
        serde_json::to_string(labels)?,
        &block[at..]
    );
    Ok((block, import))
}

/// `text` with an agent's account and its command import added.
fn insert_block(text: &str, (block, import): &(String, String)) -> Result<String> {
    let (_, end) = agent_section(text)?;
    let text = format!("{}{block}{}", &text[..end], &text[end..]);
    let (_, end) = commands_section(&text)?;
    Ok(format!("{}{import}{}", &text[..end], &text[end..]))
}

fn remove_block(text: &str, name: &str) -> Result<String> {
    ensure!(
        name != TEMPLATE_CLUSTER,
        "agent-{TEMPLATE_CLUSTER} is the template every new agent user is made from; keep it (it has no \
         password unless $MULTIPILOT_AGENT_PROD_1_PASSWORD is set)"
    );
    let Some((from, to, _)) = blocks(text)?.into_iter().find(|(_, _, n)| n == name) else {
        bail!("no such cluster: there is no agent-{name} user");
    };
    let text = format!("{}{}", &text[..from], &text[to..]);
    Ok(match command_line(&text, name)? {
        Some((from, to)) => format!("{}{}", &text[..from], &text[to..]),
        None => text,
    })
}

pub(crate) fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

/// `to` relative to the directory `from` (both made absolute against the working directory).
fn relative(from: &Path, to: &Path) -> Result<PathBuf> {
    let abs = |p: &Path| -> Result<Vec<String>> {
        let p = if p.is_absolute() {
            p.to_path_buf()
        } else {
            std::env::current_dir()?.join(p)
        };
        let mut parts: Vec<String> = Vec::new();
        for c in p.components() {
            match c {
                Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
                Component::ParentDir => {
                    parts.pop();
                }
                _ => {}
            }
        }
        Ok(parts)
    };
    let (a, b) = (abs(from)?, abs(to)?);
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..a.len() {
        out.push("..");
    }
    for part in &b[common..] {
        out.push(part);
    }
    Ok(out)
}

fn write_overlay(
    dir: &Path,
    base: &Path,
    name: &str,
    labels: &BTreeMap<String, String>,
    nats_url: &str,
    release: bool,
) -> Result<()> {
    ensure!(
        base.join("kustomization.yaml").is_file(),
        "the agent base {} is not a kustomization (run from the repository's root, or give --base)",
        base.display()
    );
    ensure!(
        !dir.exists(),
        "{} exists already: move it away first",
        dir.display()
    );
    std::fs::create_dir_all(dir)?;
    let base_rel = relative(dir, base)?;
    let components = if release {
        format!(
            "components:\n  - {}\n",
            base_rel.join("components/release-executor").display()
        )
    } else {
        String::new()
    };
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "# The agent of the cluster {name}, written by `multipilot cluster add`.\n\
             apiVersion: kustomize.config.k8s.io/v1beta1\n\
             kind: Kustomization\n\
             resources:\n  - {}\n\
             {components}\
             configMapGenerator:\n  - name: multipilot-agent\n    behavior: replace\n    files: [agent.yaml]\n",
            base_rel.display()
        ),
    )?;
    let labels = serde_json::to_string(labels)?;
    std::fs::write(
        dir.join("agent.yaml"),
        format!(
            "clusters:\n  - name: {name}\n    in_cluster: true\n    labels: {labels}\n\
             nats:\n  url: {nats_url}\n  user: agent-{name}\n  inbox_prefix: _INBOX_{name}\n\
             \x20 tls:\n    required: true\n    ca_file: /etc/multipilot/nats/ca.crt\n"
        ),
    )?;
    Ok(())
}

/// A Secret manifest with string data.
pub(crate) fn secret_manifest(name: &str, data: &[(&str, &str)]) -> Result<String> {
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    Ok(serde_yaml::to_string(&serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "multipilot"},
        "type": "Opaque",
        "stringData": data,
    }))?)
}

fn write_secrets(
    dir: &Path,
    secrets_dir: &Path,
    password: &str,
    ca_pem: &str,
    release: bool,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let write = |file: &str, text: String| -> Result<()> {
        let path = dir.join(file);
        std::fs::write(&path, text)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        }
        Ok(())
    };
    write(
        "multipilot-agent-nats.yaml",
        secret_manifest(
            "multipilot-agent-nats",
            &[("password", password), ("ca.crt", ca_pem)],
        )?,
    )?;
    if release {
        let key = std::fs::read_to_string(secrets_dir.join("material/signing.key.pub"))
            .context("reading the release role's public key (material/signing.key.pub)")?;
        write(
            "multipilot-release-trust.yaml",
            secret_manifest("multipilot-release-trust", &[("signing.key.pub", &key)])?,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> String {
        std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nats/accounts.conf"),
        )
        .unwrap()
    }

    #[test]
    fn a_new_agent_user_is_the_template_with_its_own_name_and_a_hash() {
        let text = shipped();
        assert_eq!(users(&text).unwrap(), vec!["prod-1"]);
        let (block, import) =
            agent_block(&text, "staging-2", "$2a$11$abc", &BTreeMap::new()).unwrap();
        assert!(
            block.trim_start().starts_with("agent-staging-2 {"),
            "{block}"
        );
        assert!(block.contains("user: agent-staging-2"), "{block}");
        assert!(
            block.contains("{ service: { account: FLEET, subject: \"fleet.state.staging-2.>\" } }"),
            "{block}"
        );
        assert!(
            block.contains("{ service: \"fleet.cmd.staging-2.>\", accounts: [FLEET] }"),
            "{block}"
        );
        assert_eq!(
            import.trim(),
            "{ service: { account: agent-staging-2, subject: \"fleet.cmd.staging-2.>\" } }"
        );
        assert!(block.contains("\"fleet.state.staging-2.>\""), "{block}");
        assert!(
            block.contains("\"fleet.cmd.staging-2.>\", \"_INBOX_staging-2.>\""),
            "{block}"
        );
        assert!(block.contains("password: \"$2a$11$abc\""), "{block}");
        assert!(
            !block.contains("prod-1") && !block.contains("PROD_1"),
            "{block}"
        );
        let added = insert_block(&text, &(block, import)).unwrap();
        assert_eq!(users(&added).unwrap(), vec!["prod-1", "staging-2"]);
        assert!(command_line(&added, "staging-2").unwrap().is_some());
        let removed = remove_block(&added, "staging-2").unwrap();
        assert_eq!(removed, text);
    }

    #[test]
    fn bad_names_and_unknown_clusters_are_refused() {
        for bad in ["", "Prod", "prod_1", "-a", "a-", "a.b", &"x".repeat(64)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        check_name("prod-euw-1").unwrap();
        assert!(
            check_name("correlator")
                .unwrap_err()
                .to_string()
                .contains("reserved")
        );
        let err = remove_block(&shipped(), "nope").unwrap_err();
        assert!(err.to_string().contains("no such cluster"), "{err}");
        assert!(remove_block(&shipped(), "prod-1").is_err());
        assert!(parse_labels(&["env".into()]).is_err());
    }

    #[test]
    fn an_accounts_file_with_agents_inside_fleet_is_refused_with_a_way_out() {
        let old = "accounts {\n  FLEET {\n    users: [\n      # --- agents ---\n      { user: agent-a, password: x }\n      # --- hub roles ---\n    ]\n  }\n}\n";
        let err = users(old).unwrap_err().to_string();
        assert!(
            err.contains("account of its own") && err.contains("cluster add"),
            "{err}"
        );
    }

    #[test]
    fn overlay_paths_are_relative_to_the_overlay() {
        assert_eq!(
            relative(
                Path::new("/r/deploy/site/agents/x"),
                Path::new("/r/deploy/k8s/agent")
            )
            .unwrap(),
            PathBuf::from("../../../k8s/agent")
        );
    }
}
