//! A fleet command's session with the console: where it is, the token and the output format, resolved from
//! the flags, the environment, the CLI config's context and the defaults; and the console's API asked.

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::ConsoleArgs;
use crate::contexts::{self, Layer};

/// What a command's [`Session`] is resolved from besides its flags.
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings<'a> {
    /// The hub config's `console.listen` (the console's address when nothing else says).
    pub(super) listen: &'a str,
    /// The CLI config, if there is one.
    pub(super) file: Option<&'a Path>,
}

/// One command's resolved settings.
#[derive(Debug, Clone)]
pub(super) struct Session {
    base: String,
    token: Option<String>,
    /// The output format.
    pub(super) output: String,
}

impl Session {
    /// Flags, then the environment, then the context of the CLI config, then the defaults. `outputs` are
    /// the formats this command prints: asking for another is an error, a context's default it can't print
    /// is a table.
    pub(super) fn new(
        args: &ConsoleArgs,
        settings: Settings<'_>,
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
        if let Some(path) = settings.file {
            let f = contexts::File::load(path)?;
            if let Some(c) = f.chosen(args.context.as_deref(), path)? {
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
                .unwrap_or_else(|| {
                    format!("http://{}", settings.listen.replace("0.0.0.0", "127.0.0.1"))
                })
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

/// GETs `path` from the console; a refusal is an error with the console's reason.
pub(super) async fn get(session: &Session, path: &str, query: &[(&str, String)]) -> Result<Value> {
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
