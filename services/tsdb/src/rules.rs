//! Prometheus recording and alerting rules, evaluated against the store with the PromQL
//! [`Engine`](crate::promql::Engine).
//!
//! Rule files have Prometheus' format (`groups: [{name, interval, rules: [{record|alert, expr, for,
//! keep_firing_for, labels, annotations}]}]`) and are checked at load as `promtool check rules` does: a bad
//! file is refused with the file, group and rule named. Each group is evaluated on its interval at the
//! current time: a recording rule's result is written back into the store (`__name__` = `record`, plus the
//! rule's labels); an alerting rule's alerts go pending, fire once `for` has elapsed, stay firing
//! `keep_firing_for` after their condition clears, and are then resolved, as in Prometheus. Firing and
//! recently resolved alerts are posted to an Alertmanager-compatible `POST /api/v2/alerts` (the alert
//! router) after every evaluation, resolved ones with `endsAt`. Annotation and label templates use Go
//! template syntax for the forms rules commonly use (`{{ $labels.x }}`, `{{ $value }}`,
//! `{{ humanize $value }}`, `{{ $value | humanizePercentage }}`, `{{ printf "%.2f" $value }}`), translated to
//! minijinja. `ALERTS`/`ALERTS_FOR_STATE` series are written, stale series marked, and the `for` state
//! restored after a restart, as Prometheus does (see `eval`). `GET /api/v1/rules`, `GET /api/v1/alerts`
//! and `POST /-/reload` are served by [`router`].
//!
//! A pure core and a shell, as in the correlator and the alert router: `parse` (rule files and their
//! checks), `template` (Go templates to minijinja, Go's number formatting) and `eval` (a group evaluated at
//! a given time against a [`Querier`]: recorded samples, the alert state machine) read no clock and do no
//! I/O; `manager` (files from disk, the evaluation loop, reloads), `notify` (the HTTP [`Notifier`]) and
//! `api` (the HTTP handlers) are the shell.

mod api;
mod eval;
mod manager;
mod notify;
mod parse;
mod template;

pub use api::router;
pub use eval::{Alert, AlertState, Evaluated, Group, Kind, PostableAlert, Querier, Rule};
pub use manager::{Manager, expand_globs, load_files};
pub use notify::Notifier;
pub use parse::{parse_duration, parse_file};
pub use template::{
    TranslateError, format_g, go_float, humanize, humanize_duration, translate_template,
};

use std::path::PathBuf;

use crate::promql;

/// Rule loading and evaluation failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A rule file could not be read (or a glob's directory listed).
    #[error("{file}: {source}")]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A rule file is not valid YAML, or has fields Prometheus does not know.
    #[error("{file}: {message}")]
    Yaml {
        /// The file.
        file: PathBuf,
        /// serde_yaml's message (line and column included).
        message: String,
    },
    /// A group is invalid (no name, a duplicate name, a bad interval).
    #[error("{file}: group {group:?}: {reason}")]
    Group {
        /// The file.
        file: PathBuf,
        /// The group.
        group: String,
        /// Why.
        reason: String,
    },
    /// A rule is invalid.
    #[error("{file}: group {group:?}, rule {index} ({name:?}): {reason}")]
    Rule {
        /// The file.
        file: PathBuf,
        /// The group.
        group: String,
        /// The rule's position in its group, from 1 (as promtool counts).
        index: usize,
        /// `record` or `alert`.
        name: String,
        /// Why.
        reason: String,
    },
    /// A query failed during evaluation (the rule stays loaded, its health `err`).
    #[error(transparent)]
    Query(#[from] promql::Error),
    /// A template has no translation (only a rule not checked at load gets this far).
    #[error("template: {0}")]
    Untranslatable(#[source] template::TranslateError),
    /// A template failed to render.
    #[error("template: {0}")]
    Template(#[source] minijinja::Error),
}

impl Error {
    /// Only unreadable files may succeed on retry; bad rules never do.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Read { .. })
    }
}

/// Rules result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
