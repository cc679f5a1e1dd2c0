//! Notification titles and texts, rendered with minijinja. The context: `receiver`, `status`
//! (`firing`/`resolved`), `group_labels`, `common_labels`, `common_annotations`, `alerts`, `firing` and
//! `resolved` (each alert: `labels`, `annotations`, `starts_at`, `ends_at`, `status`).

use anyhow::{Context as _, Result};
use minijinja::Environment;
use serde::Serialize;

use crate::config::Templates;

fn env(t: &Templates) -> Result<Environment<'static>> {
    let mut env = Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Lenient);
    env.add_template_owned("title", t.title.clone())
        .context("title template")?;
    env.add_template_owned("text", t.text.clone())
        .context("text template")?;
    Ok(env)
}

/// Checks that both templates compile.
pub fn check(t: &Templates) -> Result<()> {
    env(t).map(|_| ())
}

/// Renders the title and text. A template that fails at render time falls back to a plain title and the
/// error in the text: a notification is never lost to a template mistake.
pub fn render(t: &Templates, ctx: &impl Serialize) -> (String, String) {
    let rendered = env(t).and_then(|env| {
        let title = env.get_template("title")?.render(ctx)?;
        let text = env.get_template("text")?.render(ctx)?;
        Ok((title.trim().to_string(), text.trim_end().to_string()))
    });
    match rendered {
        Ok(r) => r,
        Err(e) => (
            "MultiPilot notification".into(),
            format!("(template error: {e:#})"),
        ),
    }
}
