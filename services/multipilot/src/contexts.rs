//! The CLI's own settings file, like a kubeconfig: named contexts, each with the console's address, a token
//! (or a file holding it), an optional NATS URL and a default output format, and the current context.
//!
//! The file is `$MULTIPILOT_CLI_CONFIG`, else `$XDG_CONFIG_HOME/multipilot/config.yaml`, else
//! `~/.config/multipilot/config.yaml` (`MULTIPILOT_CONFIG` is the hub's own config file, so it is not
//! reused). A missing file is an empty one. `multipilot config …` writes it, readable by its owner only.
//!
//! What a command uses comes from, first to last: its flags (`--console`, `--token`, `-o`), the environment
//! (`MULTIPILOT_CONSOLE_URL`, `MULTIPILOT_TOKEN`), the context (`--context NAME`, else the current one), the
//! defaults (`http://<console.listen>` of the hub's config, no token, tables).

#![allow(clippy::print_stdout)] // `multipilot config` prints its answers

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Subcommand;
use serde::{Deserialize, Serialize};

/// The output formats a context may default to.
pub const OUTPUTS: [&str; 5] = ["table", "wide", "json", "yaml", "name"];

/// The settings file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// The context used when no `--context` is given.
    #[serde(
        rename = "current-context",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub current_context: Option<String>,
    /// Every context, in the order they were made.
    #[serde(default)]
    pub contexts: Vec<Context>,
}

/// One named way to reach a hub.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    /// Its name.
    pub name: String,
    /// The console's address (`https://hub.example.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console: Option<String>,
    /// Bearer token for the console.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// A file holding the token (read at each use; surrounding whitespace ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// NATS URL for the commands that ask the hub over NATS (status, incidents, compliance, release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats: Option<String>,
    /// Default output format (table, wide, json, yaml, name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

/// Where the file is, given the environment (`None`: no home to keep one in).
pub fn path(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(p) = set("MULTIPILOT_CLI_CONFIG") {
        return Some(PathBuf::from(p));
    }
    // XDG: a relative XDG_CONFIG_HOME is invalid and ignored
    if let Some(x) = set("XDG_CONFIG_HOME").filter(|x| Path::new(x).is_absolute()) {
        return Some(Path::new(&x).join("multipilot/config.yaml"));
    }
    set("HOME").map(|h| Path::new(&h).join(".config/multipilot/config.yaml"))
}

/// The file at its usual place, from the process environment.
pub fn default_path() -> Option<PathBuf> {
    path(|k| std::env::var(k).ok())
}

impl File {
    /// Reads `path`; a missing file is an empty one, one that doesn't parse is an error naming it.
    pub fn load(path: &Path) -> Result<File> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(File::default()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        if text.trim().is_empty() {
            return Ok(File::default());
        }
        let file: File = serde_yaml::from_str(&text)
            .with_context(|| format!("{} is not a valid multipilot CLI config", path.display()))?;
        for c in &file.contexts {
            if let Some(o) = &c.output
                && !OUTPUTS.contains(&o.as_str())
            {
                bail!(
                    "{}: context {:?} has output {o:?}; one of {}",
                    path.display(),
                    c.name,
                    OUTPUTS.join(", ")
                );
            }
        }
        Ok(file)
    }

    /// Writes the file whole (a temporary file renamed over it), readable and writable by its owner only:
    /// it holds tokens.
    pub fn save(&self, path: &Path) -> Result<()> {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = dir {
            let mut b = std::fs::DirBuilder::new();
            b.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
            b.create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
        }
        let text = serde_yaml::to_string(self)?;
        let tmp = path.with_extension("yaml.tmp");
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let write = || -> std::io::Result<()> {
            let mut f = opts.open(&tmp)?;
            // an older temporary file keeps its mode: make sure
            #[cfg(unix)]
            f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().with_context(|| format!("writing {}", path.display()))
    }

    /// The context named `name`.
    pub fn get(&self, name: &str) -> Option<&Context> {
        self.contexts.iter().find(|c| c.name == name)
    }

    /// The context a command uses: the one named by `--context`, else the current one, else none. Naming
    /// one the file doesn't have is an error.
    pub fn chosen(&self, flag: Option<&str>, path: &Path) -> Result<Option<&Context>> {
        let Some(name) = flag.or(self.current_context.as_deref()) else {
            return Ok(None);
        };
        self.get(name).map(Some).ok_or_else(|| {
            anyhow!(
                "no context {name:?} in {} (`multipilot config get-contexts` lists them)",
                path.display()
            )
        })
    }
}

/// What a fleet command reads from one source; the first source that has a value wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layer {
    /// Console address.
    pub console: Option<String>,
    /// Bearer token.
    pub token: Option<String>,
    /// Output format.
    pub output: Option<String>,
}

impl Layer {
    /// `self`, with what it lacks taken from `below`.
    pub fn or(self, below: Layer) -> Layer {
        Layer {
            console: self.console.or(below.console),
            token: self.token.or(below.token),
            output: self.output.or(below.output),
        }
    }

    /// The environment's layer: `MULTIPILOT_CONSOLE_URL`, `MULTIPILOT_TOKEN` (empty counts as unset).
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Layer {
        let set = |k: &str| env(k).filter(|v| !v.is_empty());
        Layer {
            console: set("MULTIPILOT_CONSOLE_URL"),
            token: set("MULTIPILOT_TOKEN"),
            output: None,
        }
    }

    /// A context's layer; its `token_file` is read now (a token given inline wins over it).
    pub fn from_context(c: &Context) -> Result<Layer> {
        let token = match (&c.token, &c.token_file) {
            (Some(t), _) => Some(t.clone()),
            (None, Some(f)) => Some(
                std::fs::read_to_string(f)
                    .with_context(|| format!("reading the token file of context {:?}", c.name))
                    .with_context(|| f.display().to_string())?
                    .trim()
                    .to_string(),
            ),
            (None, None) => None,
        };
        Ok(Layer {
            console: c.console.clone(),
            token,
            output: c.output.clone(),
        })
    }
}

/// `multipilot config …`.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Create a context, or change the settings given of an existing one.
    SetContext {
        /// The context's name.
        name: String,
        /// The console's address.
        #[arg(long)]
        console: Option<String>,
        /// Bearer token (stored in the file; see --token-file to keep it elsewhere).
        #[arg(long, conflicts_with = "token_file")]
        token: Option<String>,
        /// A file holding the token, read at each use.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// NATS URL for status, incidents, compliance and release.
        #[arg(long)]
        nats: Option<String>,
        /// Default output format.
        #[arg(short = 'o', long, value_parser = OUTPUTS)]
        output: Option<String>,
    },
    /// Make a context the current one.
    UseContext {
        /// The context's name.
        name: String,
    },
    /// Remove a context.
    DeleteContext {
        /// The context's name.
        name: String,
    },
    /// List the contexts; `*` marks the current one.
    GetContexts,
    /// Print the current context's name.
    CurrentContext,
    /// Print the file, tokens redacted.
    View,
}

/// Runs `multipilot config …` on the file at `path`.
pub fn run(path: Option<PathBuf>, cmd: Command) -> Result<()> {
    let path = path.context(
        "no place for the CLI config: set MULTIPILOT_CLI_CONFIG, XDG_CONFIG_HOME or HOME",
    )?;
    let mut file = File::load(&path)?;
    match cmd {
        Command::SetContext {
            name,
            console,
            token,
            token_file,
            nats,
            output,
        } => {
            let token_file = token_file
                .map(|f| std::path::absolute(&f).with_context(|| f.display().to_string()))
                .transpose()?;
            let existing = file.contexts.iter().position(|c| c.name == name);
            if existing.is_none() && console.is_none() {
                bail!("a new context needs --console");
            }
            let i = existing.unwrap_or_else(|| {
                file.contexts.push(Context {
                    name: name.clone(),
                    ..Default::default()
                });
                file.contexts.len() - 1
            });
            let c = &mut file.contexts[i];
            if console.is_some() {
                c.console = console;
            }
            // a token replaces a token file and the other way round
            if token.is_some() {
                c.token = token;
                c.token_file = None;
            }
            if token_file.is_some() {
                c.token_file = token_file;
                c.token = None;
            }
            if nats.is_some() {
                c.nats = nats;
            }
            if output.is_some() {
                c.output = output;
            }
            file.save(&path)?;
            let what = if existing.is_some() {
                "modified"
            } else {
                "created"
            };
            println!("Context {name:?} {what}.");
        }
        Command::UseContext { name } => {
            file.chosen(Some(&name), &path)?;
            file.current_context = Some(name.clone());
            file.save(&path)?;
            println!("Switched to context {name:?}.");
        }
        Command::DeleteContext { name } => {
            file.chosen(Some(&name), &path)?;
            file.contexts.retain(|c| c.name != name);
            if file.current_context.as_deref() == Some(&name) {
                file.current_context = None;
            }
            file.save(&path)?;
            println!("Deleted context {name:?} from {}.", path.display());
        }
        Command::GetContexts => {
            let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
            let rows = file
                .contexts
                .iter()
                .map(|c| {
                    let current = file.current_context.as_deref() == Some(c.name.as_str());
                    vec![
                        if current { "*" } else { "" }.to_string(),
                        c.name.clone(),
                        dash(&c.console),
                        dash(&c.nats),
                        dash(&c.output),
                    ]
                })
                .collect();
            crate::fleet::table(&["CURRENT", "NAME", "CONSOLE", "NATS", "OUTPUT"], rows);
        }
        Command::CurrentContext => match &file.current_context {
            Some(name) => println!("{name}"),
            None => bail!("current-context is not set in {}", path.display()),
        },
        Command::View => {
            let mut shown = file.clone();
            for c in &mut shown.contexts {
                if c.token.is_some() {
                    c.token = Some("REDACTED".into());
                }
            }
            print!("{}", serde_yaml::to_string(&shown)?);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn the_file_is_found_by_variable_then_xdg_then_home() {
        let p = |vars: &[(&str, &str)]| path(env(vars));
        assert_eq!(p(&[]), None);
        assert_eq!(
            p(&[("HOME", "/home/u")]),
            Some("/home/u/.config/multipilot/config.yaml".into())
        );
        assert_eq!(
            p(&[("HOME", "/home/u"), ("XDG_CONFIG_HOME", "/xdg")]),
            Some("/xdg/multipilot/config.yaml".into())
        );
        // relative XDG_CONFIG_HOME is invalid by the spec
        assert_eq!(
            p(&[("HOME", "/home/u"), ("XDG_CONFIG_HOME", "rel")]),
            Some("/home/u/.config/multipilot/config.yaml".into())
        );
        assert_eq!(
            p(&[
                ("HOME", "/home/u"),
                ("XDG_CONFIG_HOME", "/xdg"),
                ("MULTIPILOT_CLI_CONFIG", "/etc/mp.yaml")
            ]),
            Some("/etc/mp.yaml".into())
        );
    }

    #[test]
    fn flags_beat_environment_beat_context() {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "from-file-token\n").unwrap();
        let ctx = Context {
            name: "prod".into(),
            console: Some("https://ctx".into()),
            token: None,
            token_file: Some(token_file),
            nats: None,
            output: Some("wide".into()),
        };
        let from_ctx = Layer::from_context(&ctx).unwrap();
        assert_eq!(from_ctx.token.as_deref(), Some("from-file-token"));

        // context only
        let none = Layer::default();
        let r = none
            .clone()
            .or(Layer::from_env(env(&[])))
            .or(from_ctx.clone());
        assert_eq!(r.console.as_deref(), Some("https://ctx"));
        assert_eq!(r.output.as_deref(), Some("wide"));

        // environment over the context; empty variables count as unset
        let e = Layer::from_env(env(&[
            ("MULTIPILOT_CONSOLE_URL", "https://env"),
            ("MULTIPILOT_TOKEN", ""),
        ]));
        let r = none.clone().or(e.clone()).or(from_ctx.clone());
        assert_eq!(r.console.as_deref(), Some("https://env"));
        assert_eq!(r.token.as_deref(), Some("from-file-token"));

        // flags over both
        let flags = Layer {
            console: Some("https://flag".into()),
            token: Some("flag-token".into()),
            output: Some("json".into()),
        };
        let r = flags.or(e).or(from_ctx);
        assert_eq!(
            r,
            Layer {
                console: Some("https://flag".into()),
                token: Some("flag-token".into()),
                output: Some("json".into()),
            }
        );
        // nothing anywhere: the defaults are the caller's
        assert_eq!(none.clone().or(Layer::from_env(env(&[]))), none);
    }

    #[test]
    fn missing_file_is_empty_and_a_malformed_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nope/config.yaml");
        assert_eq!(File::load(&p).unwrap(), File::default());

        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "contexts: [{name: a, consol: x}]\n").unwrap();
        let e = format!("{:#}", File::load(&bad).unwrap_err());
        assert!(e.contains("bad.yaml") && e.contains("consol"), "{e}");

        std::fs::write(&bad, "contexts: [{name: a, output: fancy}]\n").unwrap();
        let e = format!("{:#}", File::load(&bad).unwrap_err());
        assert!(e.contains("bad.yaml") && e.contains("fancy"), "{e}");
    }

    #[test]
    fn saved_file_round_trips_and_only_its_owner_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/config.yaml");
        let f = File {
            current_context: Some("a".into()),
            contexts: vec![Context {
                name: "a".into(),
                console: Some("http://x".into()),
                token: Some("t".into()),
                ..Default::default()
            }],
        };
        f.save(&p).unwrap();
        assert_eq!(File::load(&p).unwrap(), f);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("current-context: a"), "{text}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn chosen_context_is_the_flag_else_the_current_one() {
        let f = File {
            current_context: Some("a".into()),
            contexts: vec![
                Context {
                    name: "a".into(),
                    ..Default::default()
                },
                Context {
                    name: "b".into(),
                    ..Default::default()
                },
            ],
        };
        let p = Path::new("/x.yaml");
        assert_eq!(f.chosen(None, p).unwrap().unwrap().name, "a");
        assert_eq!(f.chosen(Some("b"), p).unwrap().unwrap().name, "b");
        assert!(f.chosen(Some("c"), p).is_err());
        assert!(File::default().chosen(None, p).unwrap().is_none());
    }
}
