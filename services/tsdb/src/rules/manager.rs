//! The rules' shell: rule files read from disk, the loaded groups evaluated against the store as they fall
//! due (recorded samples committed, alerts handed to the [`Notifier`]), reloads on SIGHUP or request.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use multipilot_schemas::payload::Sample;

use super::eval::{Alert, Group, Kind, PostableAlert, Querier, Written};
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

    fn last_samples(
        &self,
        name: &str,
        alertname: &str,
        from: i64,
        to: i64,
    ) -> Result<Vec<(crate::store::Labels, i64, f64)>, promql::Error> {
        use promql_parser::label::{MatchOp, Matcher};
        let store = self.store();
        let matchers = vec![
            Matcher::new(MatchOp::Equal, crate::store::METRIC_NAME, name),
            Matcher::new(MatchOp::Equal, "alertname", alertname),
        ];
        let mut out = Vec::new();
        for (id, labels) in store.select(&[matchers]) {
            if let Some(&(t, v)) = store.samples(id, from, to)?.last() {
                let labels = labels
                    .iter()
                    .filter(|(k, _)| k != crate::store::METRIC_NAME)
                    .cloned()
                    .collect();
                out.push((labels, t, v));
            }
        }
        Ok(out)
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
    /// The series of rules a reload took out, to mark stale at the next evaluation.
    retired: Mutex<Written>,
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
            retired: Mutex::default(),
        })
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Group>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reloads the files; on an error the loaded rules keep running. Alert state, and the series to mark
    /// stale when they are no longer written, carry over to a rule with the same group, name and labels (as
    /// in Prometheus: a changed expression keeps its alerts; rules alike in all of these, in their order);
    /// the series of a rule that is gone get their staleness markers at the next evaluation, unless a rule
    /// writes them then. A group new since the start is not restored from `ALERTS_FOR_STATE` (as in
    /// Prometheus).
    pub fn reload(&self) -> Result<()> {
        let mut fresh = load_files(&self.files, self.default_interval)?;
        let mut groups = self.lock();
        type Key = (PathBuf, String, String, Vec<(String, String)>);
        type State = (BTreeMap<u64, Alert>, Written);
        let key = |g: &Group, r: &super::eval::Rule| -> Key {
            let labels = r.labels.iter().map(|(k, v)| (k.clone(), v.clone()));
            let name = r.name().to_string();
            (g.file.clone(), g.name.clone(), name, labels.collect())
        };
        let mut old: HashMap<Key, VecDeque<State>> = HashMap::new();
        let mut restored = HashMap::new();
        for g in groups.iter_mut() {
            restored.insert((g.file.clone(), g.name.clone()), g.restored);
            for i in 0..g.rules.len() {
                let k = key(g, &g.rules[i]);
                let r = &mut g.rules[i];
                let active = match &mut r.kind {
                    Kind::Alerting { active, .. } => std::mem::take(active),
                    Kind::Recording { .. } => BTreeMap::new(),
                };
                let state = (active, std::mem::take(&mut r.written));
                old.entry(k).or_default().push_back(state);
            }
        }
        for g in &mut fresh {
            g.restored = restored
                .get(&(g.file.clone(), g.name.clone()))
                .copied()
                .unwrap_or(true);
            for i in 0..g.rules.len() {
                let k = key(g, &g.rules[i]);
                let Some((active, written)) = old.get_mut(&k).and_then(VecDeque::pop_front) else {
                    continue;
                };
                let r = &mut g.rules[i];
                r.written = written;
                if let Kind::Alerting { active: a, .. } = &mut r.kind {
                    *a = active;
                }
            }
        }
        // what the rules no longer there wrote ends at the next evaluation
        self.retired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(old.into_values().flatten().flat_map(|(_, w)| w));
        *groups = fresh;
        tracing::info!(groups = groups.len(), "rules reloaded");
        Ok(())
    }

    /// Evaluates the groups due at `now` (ms) (never evaluated, or an interval since the last time),
    /// writes the recording rules' samples and returns the alerts to send.
    pub fn eval_due(&self, now: i64) -> Vec<PostableAlert> {
        let mut alerts = Vec::new();
        let mut groups = self.lock();
        let retired = std::mem::take(&mut *self.retired.lock().unwrap_or_else(|e| e.into_inner()));
        for g in groups.iter_mut() {
            let due = g
                .last_evaluation
                .is_none_or(|last| now - last >= g.interval.as_millis() as i64);
            if due {
                alerts.extend(g.eval(&self.engine, now, &self.generator).alerts);
                // after the second evaluation since the start, as Prometheus does
                g.restore_for_state(&self.engine);
                for r in &g.rules {
                    if let Some(e) = &r.last_error {
                        tracing::warn!(group = %g.name, rule = %r.name(), error = %e, "rule evaluation failed");
                    }
                }
            }
        }
        // the series of rules a reload took out, but those a rule still writes
        let gone: Vec<Sample> = retired
            .into_iter()
            .filter(|(h, _)| {
                !groups
                    .iter()
                    .any(|g| g.rules.iter().any(|r| r.written.contains_key(h)))
            })
            .map(|(_, (name, labels))| Sample {
                name,
                labels,
                value: f64::from_bits(crate::chunk::STALE_NAN_BITS),
                timestamp_ms: now,
            })
            .collect();
        if !gone.is_empty()
            && let Err(e) = self.engine.record(&gone)
        {
            tracing::warn!(error = %e, "marking the series of removed rules stale failed");
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
