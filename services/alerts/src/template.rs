//! Notification titles and texts, rendered with minijinja. The context: `receiver`, `status`
//! (`firing`/`resolved`), `group_labels`, `common_labels`, `common_annotations`, `alerts`, `firing` and
//! `resolved` (each alert: `labels`, `annotations`, `starts_at`, `ends_at`, `status`).

use minijinja::Environment;
use serde::Serialize;

use crate::config::{ConfigError, Templates};

fn env(t: &Templates) -> Result<Environment<'static>, ConfigError> {
    let mut env = Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Lenient);
    env.add_template_owned("title", t.title.clone())
        .map_err(|e| ConfigError(format!("title template: {e:#}")))?;
    env.add_template_owned("text", t.text.clone())
        .map_err(|e| ConfigError(format!("text template: {e:#}")))?;
    Ok(env)
}

/// Checks that both templates compile.
pub fn check(t: &Templates) -> Result<(), ConfigError> {
    env(t).map(|_| ())
}

/// Renders the title and text. A template that fails at render time falls back to a plain title and the
/// error in the text: a notification is never lost to a template mistake.
pub fn render(t: &Templates, ctx: &impl Serialize) -> (String, String) {
    let rendered = env(t).and_then(|env| {
        let render = |name: &str| {
            env.get_template(name)
                .and_then(|t| t.render(ctx))
                .map_err(|e| ConfigError(format!("{name} template: {e:#}")))
        };
        let (title, text) = (render("title")?, render("text")?);
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
