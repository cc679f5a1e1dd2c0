//! The rules' shell: rule files read from disk, the loaded groups evaluated against the store as they fall
//! due (recorded samples committed, alerts handed to the [`Notifier`]), reloads on SIGHUP or request.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use multipilot_schemas::payload::Sample;

use super::eval::{Alert, Group, Kind, PostableAlert, Querier};
use super::notify::Notifier;
use super::parse::parse_file;
use super::{Error, Result};
use crate::promql::{self, Engine, Value};

/// The store, through the PromQL engine; evaluations timed by the monotonic clock.
impl Querier for Engine {
    fn instant(&self, expr: &str, ts: i64) -> Result<Value, promql::Error> {
        Engine::instant(self, expr, ts)
    }

    fn record(&self, samples: &[Sample]) -> Result<(), promql::Error> {
        self.store().append("", samples)?;
        Ok(())
    }

    fn stopwatch(&self) -> Instant {
        Instant::now()
    }
}

/// Expands the `*`/`?` globs of a rule-file list (in the file name only), sorted.
pub fn expand_globs(patterns: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in patterns {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !name.contains(['*', '?']) {
            out.push(p.clone());
            continue;
        }
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
        let dir = dir.unwrap_or(Path::new("."));
        let re = regex::Regex::new(&format!(
            "^{}$",
            regex::escape(name)
                .replace(r"\*", "[^/]*")
                .replace(r"\?", ".")
        ))
        .expect("escaped glob is a valid regex");
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|source| Error::Read {
                file: p.clone(),
                source,
            })?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_str().is_some_and(|n| re.is_match(n)))
            .map(|e| e.path())
            .collect();
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// Loads and checks rule files (globs expanded); the first bad file or rule fails the whole load.
pub fn load_files(patterns: &[PathBuf], default_interval: Duration) -> Result<Vec<Group>> {
    let mut groups = Vec::new();
    for file in expand_globs(patterns)? {
        let text = std::fs::read_to_string(&file).map_err(|source| Error::Read {
            file: file.clone(),
            source,
        })?;
        groups.extend(parse_file(&file, &text, default_interval)?);
    }
    Ok(groups)
}

/// The loaded groups, their evaluation loop and reloads.
#[derive(Debug)]
pub struct Manager {
    groups: Mutex<Vec<Group>>,
    files: Vec<PathBuf>,
    default_interval: Duration,
    engine: Engine,
    notifier: Option<Notifier>,
    generator: String,
}

impl Manager {
    /// Loads `files`; fails on the first bad file or rule (the role must not start on it).
    pub fn new(
        files: Vec<PathBuf>,
        default_interval: Duration,
        engine: Engine,
        notifier: Option<Notifier>,
        generator: String,
    ) -> Result<Self> {
        let groups = load_files(&files, default_interval)?;
        tracing::info!(
            groups = groups.len(),
            rules = groups.iter().map(|g| g.rules.len()).sum::<usize>(),
            "rules loaded"
        );
        Ok(Manager {
            groups: Mutex::new(groups),
            files,
            default_interval,
            engine,
            notifier,
            generator,
        })
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Group>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reloads the files; on an error the loaded rules keep running. Alert state carries over to a rule
    /// with the same group, name and expression.
    pub fn reload(&self) -> Result<()> {
        let mut fresh = load_files(&self.files, self.default_interval)?;
        let mut groups = self.lock();
        let mut old: HashMap<(PathBuf, String, String, String), BTreeMap<u64, Alert>> =
            HashMap::new();
        for g in groups.iter_mut() {
            for r in &mut g.rules {
                if let Kind::Alerting { alert, active, .. } = &mut r.kind {
                    old.insert(
                        (
                            g.file.clone(),
                            g.name.clone(),
                            alert.clone(),
                            r.expr.clone(),
                        ),
                        std::mem::take(active),
                    );
                }
            }
        }
        for g in &mut fresh {
            for r in &mut g.rules {
                if let Kind::Alerting { alert, active, .. } = &mut r.kind
                    && let Some(a) = old.remove(&(
                        g.file.clone(),
                        g.name.clone(),
                        alert.clone(),
                        r.expr.clone(),
                    ))
                {
                    *active = a;
                }
            }
        }
        *groups = fresh;
        tracing::info!(groups = groups.len(), "rules reloaded");
        Ok(())
    }

    /// Evaluates the groups due at `now` (ms) (never evaluated, or an interval since the last time),
    /// writes the recording rules' samples and returns the alerts to send.
    pub fn eval_due(&self, now: i64) -> Vec<PostableAlert> {
        let mut alerts = Vec::new();
        let mut groups = self.lock();
        for g in groups.iter_mut() {
            let due = g
                .last_evaluation
                .is_none_or(|last| now - last >= g.interval.as_millis() as i64);
            if due {
                alerts.extend(g.eval(&self.engine, now, &self.generator).alerts);
                for r in &g.rules {
                    if let Some(e) = &r.last_error {
                        tracing::warn!(group = %g.name, rule = %r.name(), error = %e, "rule evaluation failed");
                    }
                }
            }
        }
        alerts
    }

    /// Evaluates groups as they fall due, and reloads on SIGHUP, until `cancel`.
    pub async fn run(self: Arc<Self>, cancel: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            #[cfg(unix)]
            let hangup = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let hangup = std::future::pending::<Option<()>>();
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = hangup => {
                    if let Err(e) = self.reload() {
                        tracing::error!(error = %e, "rule reload failed; the loaded rules keep running");
                    }
                    continue;
                }
                _ = tick.tick() => {}
            }
            let me = self.clone();
            let now = Utc::now().timestamp_millis();
            let alerts = match tokio::task::spawn_blocking(move || me.eval_due(now)).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::error!(error = %e, "rule evaluation panicked");
                    continue;
                }
            };
            if let Err(e) = self.engine.store().commit().await {
                tracing::warn!(error = %e, "committing recorded samples failed");
            }
            if let Some(n) = &self.notifier {
                n.send(&alerts).await;
            }
        }
    }
}
