//! Sync windows: times when the role may apply a release to a cluster (and self-heal its drift), after Argo
//! CD's `SyncWindows`. A window is `allow` or `deny`, opens on a 5-field cron `schedule` evaluated in its
//! `time_zone` and stays open for `duration`; it covers the clusters its `clusters` selector matches and the
//! releases its `releases` names or globs match (empty: all of them).
//!
//! For one release on one cluster, with the windows that cover it:
//! - no window covers it: allowed;
//! - a deny window is open: denied (deny wins over an open allow window);
//! - allow windows cover it and none is open: denied;
//! - otherwise (an allow window is open, or only deny windows cover it and none is open): allowed.
//!
//! `manual_sync` lets an operator's explicit sync pass a window that holds it: when every open deny window
//! that denies has it, or, outside the allow windows, when one of them has it. The caller audits that.
//!
//! A window is open at `t` when a start `s` of its schedule has `s ≤ t < s + duration`; starts that follow
//! one another closer than `duration` make one longer opening. The schedule is read on the zone's wall
//! clock as cron does (a window `0 22 * * *` in Europe/Berlin opens at 22:00 local on both sides of a DST
//! change); a start the clock skips (02:30 on the spring-forward night) is taken at the first instant after
//! the gap, a start the clock repeats once, at its first instant; `duration` is elapsed time.
//!
//! Pure: no I/O, the time is an argument. The schedules are parsed and walked by `croner`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use multipilot_schemas::selector::{Selector, SelectorError};
use serde::{Deserialize, Serialize};

/// Whether a window lets applies through or holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Applies only while an allow window is open (when any allow window covers the release).
    Allow,
    /// No applies while it is open.
    Deny,
}

impl Kind {
    /// `allow` or `deny`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Allow => "allow",
            Kind::Deny => "deny",
        }
    }
}

/// One sync window, as the settings write it:
///
/// ```yaml
/// - kind: deny                 # or allow
///   schedule: "0 18 * * FRI"   # 5-field cron: minute hour day-of-month month day-of-week
///   duration: 63h              # open until Monday 09:00
///   time_zone: Europe/Berlin   # IANA; UTC when absent
///   clusters: env=prod         # a label selector; empty: every cluster
///   releases: ["payments-*"]   # names or globs (`*`, `?`); empty: every release
///   manual_sync: true          # an operator's explicit sync may pass it (audited)
///   description: weekend freeze, CHG-1234
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// `allow` or `deny`.
    pub kind: Kind,
    /// When it opens: a 5-field cron schedule (`minute hour day-of-month month day-of-week`) with ranges
    /// (`1-5`), steps (`*/15`), lists (`1,15`) and names (`MON`, `JAN`); a day matches when its day of the
    /// month or its day of the week does, if both are restricted (as cron has it).
    pub schedule: String,
    /// How long it stays open after each start (`1h`, `30m`, `2d`).
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
    /// The IANA time zone the schedule is read in (`Europe/Berlin`, `America/New_York`).
    #[serde(default = "utc")]
    pub time_zone: String,
    /// The clusters it covers: a label selector on their registry labels plus `cluster` (the name), as
    /// release targets take it (`env=prod`, `cluster in (eu-1,eu-2)`). Empty: every cluster.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub clusters: String,
    /// The releases it covers: names or globs (`payments-*`, `web-?`). Empty: every release.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub releases: Vec<String>,
    /// Whether an operator's explicit sync may pass it while it holds (the caller audits the override).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub manual_sync: bool,
    /// What it is for (a change ticket, "weekend freeze"), shown with it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

fn utc() -> String {
    "UTC".into()
}

/// A window that can't be used: which one and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The time zone is not an IANA name.
    #[error(
        "windows[{index}] (schedule {schedule:?}): unknown time zone {zone:?} (an IANA name such as \
         Europe/Berlin, America/New_York or UTC)"
    )]
    UnknownTimeZone {
        /// The window's place in the list.
        index: usize,
        /// Its schedule.
        schedule: String,
        /// The zone as written.
        zone: String,
    },
    /// The schedule is not a 5-field cron schedule.
    #[error(
        "windows[{index}]: schedule {schedule:?} is not a 5-field cron schedule (minute hour day-of-month \
         month day-of-week): {source}"
    )]
    Schedule {
        /// The window's place in the list.
        index: usize,
        /// The schedule as written.
        schedule: String,
        /// What the cron parser found wrong.
        #[source]
        source: croner::errors::CronError,
    },
    /// The schedule parses but names no time that exists (`0 0 30 2 *`).
    #[error("windows[{index}]: schedule {schedule:?} never fires (no such day)")]
    NeverFires {
        /// The window's place in the list.
        index: usize,
        /// The schedule as written.
        schedule: String,
    },
    /// The duration is zero.
    #[error("windows[{index}] (schedule {schedule:?}): duration must be more than zero")]
    ZeroDuration {
        /// The window's place in the list.
        index: usize,
        /// Its schedule.
        schedule: String,
    },
    /// The duration is too long to add to a time.
    #[error("windows[{index}] (schedule {schedule:?}): duration {duration:?} is too long")]
    LongDuration {
        /// The window's place in the list.
        index: usize,
        /// Its schedule.
        schedule: String,
        /// The duration as given.
        duration: Duration,
    },
    /// The cluster selector doesn't parse.
    #[error("windows[{index}] (schedule {schedule:?}): clusters: {source}")]
    Selector {
        /// The window's place in the list.
        index: usize,
        /// Its schedule.
        schedule: String,
        /// Why the selector doesn't parse.
        #[source]
        source: SelectorError,
    },
    /// A release pattern is empty.
    #[error("windows[{index}] (schedule {schedule:?}): releases has an empty name")]
    EmptyRelease {
        /// The window's place in the list.
        index: usize,
        /// Its schedule.
        schedule: String,
    },
}

impl Error {
    /// Never: a window that doesn't compile needs its settings changed.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

type Result<T, E = Error> = std::result::Result<T, E>;

/// How far ahead a verdict's change and a window's end are looked for.
const HORIZON_DAYS: i64 = 400;
/// Openings merged into one before its end is called unforeseeable: a window whose starts follow one
/// another closer than its duration (`* * * * *` for `1m`) is open for good, and finding that out start by
/// start would take long.
const MAX_MERGES: usize = 64;
/// Steps of the walk to a verdict's change before it is called unforeseeable.
const MAX_STEPS: usize = 256;

/// A checked window, ready to judge times.
#[derive(Debug, Clone)]
struct Compiled {
    index: usize,
    window: Window,
    cron: Cron,
    tz: Tz,
    selector: Selector,
    duration: chrono::TimeDelta,
}

/// The sync windows of the role, checked.
#[derive(Debug, Clone, Default)]
pub struct Windows {
    windows: Vec<Compiled>,
}

/// Whether a release may be applied to a cluster now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// Applies and self-heal may run.
    pub allowed: bool,
    /// An operator's explicit sync may run (always when `allowed`; otherwise the windows holding it allow a
    /// manual sync, and the caller audits it).
    pub manual_sync_allowed: bool,
    /// Which windows decided, for people (`held by deny window 0 ("0 22 * * *" Europe/Berlin, 1h) until
    /// 2026-03-28 22:00 UTC`).
    pub reason: String,
    /// When `allowed` next flips (the holding deny windows close, an allow window opens, a deny window
    /// opens…); `None` when it won't within about a year, or can't be foreseen.
    pub next_change: Option<DateTime<Utc>>,
}

/// A window as shown to operators: open now, or its next opening.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveWindow {
    /// Its place in the settings' list.
    pub index: usize,
    /// `allow` or `deny`.
    pub kind: Kind,
    /// Its cron schedule.
    pub schedule: String,
    /// Its time zone.
    pub time_zone: String,
    /// Its duration, as `humantime` writes it (`1h`).
    pub duration: String,
    /// Its cluster selector (empty: all).
    pub clusters: String,
    /// Its release names or globs (empty: all).
    pub releases: Vec<String>,
    /// Whether an operator's explicit sync may pass it.
    pub manual_sync: bool,
    /// Its description.
    pub description: String,
    /// Whether it is open at the time asked.
    pub active: bool,
    /// When the opening began (open) or begins (not open).
    pub start: DateTime<Utc>,
    /// When that opening ends, with later openings that overlap it; `None` when not within about a year.
    pub end: Option<DateTime<Utc>>,
}

impl Windows {
    /// Checks the windows: time zones, schedules, durations, selectors and release names.
    pub fn compile(windows: Vec<Window>) -> Result<Windows> {
        let parser = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build();
        let mut out = Vec::with_capacity(windows.len());
        for (index, window) in windows.into_iter().enumerate() {
            let schedule = || window.schedule.clone();
            let zone = window.time_zone.trim();
            let tz: Tz = if zone.is_empty() {
                Tz::UTC
            } else {
                zone.parse().map_err(|_| Error::UnknownTimeZone {
                    index,
                    schedule: schedule(),
                    zone: window.time_zone.clone(),
                })?
            };
            let cron = parser
                .parse(&window.schedule)
                .map_err(|source| Error::Schedule {
                    index,
                    schedule: schedule(),
                    source,
                })?;
            // a schedule such as `0 0 30 2 *` parses: find out whether it ever fires (Feb 29 does, in 2028)
            let from = DateTime::<Utc>::from_timestamp(0, 0).unwrap_or_default();
            if cron.find_next_occurrence(&from, true).is_err() {
                return Err(Error::NeverFires {
                    index,
                    schedule: schedule(),
                });
            }
            if window.duration.is_zero() {
                return Err(Error::ZeroDuration {
                    index,
                    schedule: schedule(),
                });
            }
            let duration = chrono::TimeDelta::from_std(window.duration)
                .ok()
                .filter(|d| *d < chrono::TimeDelta::days(100 * 366))
                .ok_or_else(|| Error::LongDuration {
                    index,
                    schedule: schedule(),
                    duration: window.duration,
                })?;
            let selector = Selector::parse(&window.clusters).map_err(|source| Error::Selector {
                index,
                schedule: schedule(),
                source,
            })?;
            if window.releases.iter().any(|r| r.trim().is_empty()) {
                return Err(Error::EmptyRelease {
                    index,
                    schedule: schedule(),
                });
            }
            out.push(Compiled {
                index,
                window,
                cron,
                tz,
                selector,
                duration,
            });
        }
        Ok(Windows { windows: out })
    }

    /// Whether there are no windows (everything is allowed, always).
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// The windows as given.
    pub fn windows(&self) -> impl Iterator<Item = &Window> {
        self.windows.iter().map(|c| &c.window)
    }

    /// The windows that cover `release` on the cluster `cluster_name` with `cluster_labels` (its registry
    /// labels; `cluster` is added as the name when absent).
    fn covering<'a>(
        &'a self,
        release: &str,
        cluster_labels: &BTreeMap<String, String>,
        cluster_name: &str,
    ) -> Vec<&'a Compiled> {
        let get = |k: &str| {
            cluster_labels
                .get(k)
                .map(String::as_str)
                .or_else(|| (k == "cluster").then_some(cluster_name))
        };
        self.windows
            .iter()
            .filter(|w| {
                (w.window.releases.is_empty()
                    || w.window.releases.iter().any(|p| glob(p.trim(), release)))
                    && w.selector.matches(get)
            })
            .collect()
    }

    /// Whether `release` may be applied to the cluster now, why, and until when.
    pub fn verdict(
        &self,
        release: &str,
        cluster_labels: &BTreeMap<String, String>,
        cluster_name: &str,
        now: DateTime<Utc>,
    ) -> Verdict {
        let covering = self.covering(release, cluster_labels, cluster_name);
        if covering.is_empty() {
            return Verdict {
                allowed: true,
                manual_sync_allowed: true,
                reason: "no sync window covers it".into(),
                next_change: None,
            };
        }
        let state = decide(&covering, now);
        let next_change = next_change(&covering, now, state.allowed);
        let until = match next_change {
            Some(t) => format!(" until {}", when(t)),
            None => String::new(),
        };
        let mut reason = match &state.by {
            By::Deny(ws) => format!("held by {}{until}", list(ws)),
            By::Allow(ws) => format!("inside {}{until}", list(ws)),
            By::OutsideAllow(ws) => match next_change {
                Some(t) => format!("outside {}; the next opens {}", list(ws), when(t)),
                None => format!("outside {}; none opens within a year", list(ws)),
            },
            By::NoneOpen => format!("no deny window open{until}"),
        };
        if !state.allowed && state.manual_sync_allowed {
            reason.push_str("; a manual sync may pass (manual_sync)");
        }
        Verdict {
            allowed: state.allowed,
            manual_sync_allowed: state.manual_sync_allowed,
            reason,
            next_change,
        }
    }

    /// The windows that cover `release` on the cluster and are open now, with when they close.
    pub fn active(
        &self,
        release: &str,
        cluster_labels: &BTreeMap<String, String>,
        cluster_name: &str,
        now: DateTime<Utc>,
    ) -> Vec<ActiveWindow> {
        self.covering(release, cluster_labels, cluster_name)
            .into_iter()
            .filter_map(|w| {
                let start = w.open_start(now)?;
                Some(w.show(true, start, w.run_end(start)))
            })
            .collect()
    }

    /// The windows that cover `release` on the cluster and are closed now, with their next opening (those
    /// that won't open within about a year are left out), soonest first.
    pub fn upcoming(
        &self,
        release: &str,
        cluster_labels: &BTreeMap<String, String>,
        cluster_name: &str,
        now: DateTime<Utc>,
    ) -> Vec<ActiveWindow> {
        let mut out: Vec<_> = self
            .covering(release, cluster_labels, cluster_name)
            .into_iter()
            .filter(|w| w.open_start(now).is_none())
            .filter_map(|w| {
                let start = w.next_start(now)?;
                Some(w.show(false, start, w.run_end(start)))
            })
            .collect();
        out.sort_by_key(|w| w.start);
        out
    }

    /// Every window, whatever it covers: its current opening when open, else its next one (for `gitops
    /// status` and the console's fleet view), in the settings' order.
    pub fn overview(&self, now: DateTime<Utc>) -> Vec<ActiveWindow> {
        self.windows
            .iter()
            .filter_map(|w| match w.open_start(now) {
                Some(start) => Some(w.show(true, start, w.run_end(start))),
                None => {
                    let start = w.next_start(now)?;
                    Some(w.show(false, start, w.run_end(start)))
                }
            })
            .collect()
    }
}

impl Compiled {
    /// The start of the opening `now` falls in, if any.
    fn open_start(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // every opening lasts as long, so only the latest start can still be open
        let s = self.prev_start(now)?;
        (now < s + self.duration).then_some(s)
    }

    /// The latest start at or before `t`.
    fn prev_start(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_previous_occurrence(&t.with_timezone(&self.tz), true)
            .ok()
            .map(|s| s.with_timezone(&Utc))
    }

    /// The first start after `t`, within the horizon.
    fn next_start(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.tz), false)
            .ok()
            .map(|s| s.with_timezone(&Utc))
            .filter(|s| *s <= t + chrono::TimeDelta::days(HORIZON_DAYS))
    }

    /// The end of the opening that began at `start`, with the openings that begin before it ends (or just
    /// as it ends); `None` when it lasts past the horizon.
    fn run_end(&self, start: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let horizon = start + chrono::TimeDelta::days(HORIZON_DAYS);
        let (mut last, mut end) = (start, start + self.duration);
        for _ in 0..MAX_MERGES {
            if end > horizon {
                return None;
            }
            match self.prev_start(end) {
                Some(s) if s > last => {
                    last = s;
                    end = s + self.duration;
                }
                _ => return Some(end),
            }
        }
        None
    }

    fn show(&self, active: bool, start: DateTime<Utc>, end: Option<DateTime<Utc>>) -> ActiveWindow {
        let w = &self.window;
        ActiveWindow {
            index: self.index,
            kind: w.kind,
            schedule: w.schedule.clone(),
            time_zone: self.tz.name().to_string(),
            duration: humantime::format_duration(w.duration).to_string(),
            clusters: w.clusters.clone(),
            releases: w.releases.clone(),
            manual_sync: w.manual_sync,
            description: w.description.clone(),
            active,
            start,
            end,
        }
    }

    /// `deny window 0 ("0 22 * * *" Europe/Berlin, 1h: weekend freeze)`
    fn label(&self) -> String {
        let w = &self.window;
        let mut s = format!(
            "{} window {} ({:?} {}, {}",
            w.kind.name(),
            self.index,
            w.schedule,
            self.tz.name(),
            humantime::format_duration(w.duration)
        );
        if !w.description.is_empty() {
            let _ = write!(s, ": {}", w.description);
        }
        s.push(')');
        s
    }
}

/// What decided a verdict.
enum By<'a> {
    /// These deny windows are open.
    Deny(Vec<&'a Compiled>),
    /// These allow windows are open (and no deny window).
    Allow(Vec<&'a Compiled>),
    /// Allow windows cover it, none is open.
    OutsideAllow(Vec<&'a Compiled>),
    /// Only deny windows cover it, none is open.
    NoneOpen,
}

struct State<'a> {
    allowed: bool,
    manual_sync_allowed: bool,
    by: By<'a>,
}

/// The verdict at `t` from the windows covering the release.
fn decide<'a>(covering: &[&'a Compiled], t: DateTime<Utc>) -> State<'a> {
    let open = |kind| -> Vec<&'a Compiled> {
        covering
            .iter()
            .copied()
            .filter(|w| w.window.kind == kind && w.open_start(t).is_some())
            .collect()
    };
    let denying = open(Kind::Deny);
    if !denying.is_empty() {
        // deny wins; an explicit sync passes only if every deny window holding it allows that
        let manual = denying.iter().all(|w| w.window.manual_sync);
        return State {
            allowed: false,
            manual_sync_allowed: manual,
            by: By::Deny(denying),
        };
    }
    let allowing = open(Kind::Allow);
    if !allowing.is_empty() {
        return State {
            allowed: true,
            manual_sync_allowed: true,
            by: By::Allow(allowing),
        };
    }
    let allows: Vec<_> = covering
        .iter()
        .copied()
        .filter(|w| w.window.kind == Kind::Allow)
        .collect();
    if !allows.is_empty() {
        // outside the allow windows: as Argo CD, one of them allowing a manual sync lets it through
        let manual = allows.iter().any(|w| w.window.manual_sync);
        return State {
            allowed: false,
            manual_sync_allowed: manual,
            by: By::OutsideAllow(allows),
        };
    }
    State {
        allowed: true,
        manual_sync_allowed: true,
        by: By::NoneOpen,
    }
}

/// The first time after `now` when the verdict is no longer `allowed_now`. Walks from one time the verdict
/// could change to the next, skipping what can't change it: while deny windows are open, to the last of
/// them closing; while allow windows are open, to the last of them closing or a deny window opening;
/// outside the allow windows, to one opening; with none open, to a deny window opening.
fn next_change(
    covering: &[&Compiled],
    now: DateTime<Utc>,
    allowed_now: bool,
) -> Option<DateTime<Utc>> {
    let horizon = now + chrono::TimeDelta::days(HORIZON_DAYS);
    let denies = || {
        covering
            .iter()
            .copied()
            .filter(|w| w.window.kind == Kind::Deny)
    };
    let mut at = now;
    for _ in 0..MAX_STEPS {
        let state = decide(covering, at);
        if state.allowed != allowed_now {
            return Some(at);
        }
        let next = match &state.by {
            // held until the last of them closes (never, if one is open for good)
            By::Deny(open) => last_end(open, at)?,
            By::Allow(open) => match (last_end(open, at), first_start(denies(), at)) {
                (Some(end), Some(deny)) => end.min(deny),
                (end, deny) => end.or(deny)?,
            },
            By::OutsideAllow(allows) => first_start(allows.iter().copied(), at)?,
            By::NoneOpen => first_start(denies(), at)?,
        };
        if next > horizon {
            return None;
        }
        at = next;
    }
    None
}

/// The first opening of one of `ws` after `at`, within the horizon.
fn first_start<'a>(
    ws: impl IntoIterator<Item = &'a Compiled>,
    at: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    ws.into_iter().filter_map(|w| w.next_start(at)).min()
}

/// When the last of the `open` windows closes; `None` when one of them stays open past the horizon.
fn last_end(open: &[&Compiled], at: DateTime<Utc>) -> Option<DateTime<Utc>> {
    open.iter()
        .map(|w| w.open_start(at).and_then(|s| w.run_end(s)))
        .try_fold(at, |last, end| end.map(|e| last.max(e)))
}

/// `deny window 0 (…)`, `deny windows 0 (…) and 2 (…)`
fn list(ws: &[&Compiled]) -> String {
    let labels: Vec<String> = ws.iter().map(|w| w.label()).collect();
    match labels.as_slice() {
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
        [] => String::new(),
    }
}

fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// Whether `name` matches `pattern`, where `*` is any run of characters and `?` one character.
fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    // where the last `*` was and the name position it was tried against
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(&c) if c == '?' || c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().expect(s)
    }

    fn w(kind: Kind, schedule: &str, duration: &str, zone: &str) -> Window {
        Window {
            kind,
            schedule: schedule.into(),
            duration: humantime::parse_duration(duration).expect(duration),
            time_zone: zone.into(),
            clusters: String::new(),
            releases: Vec::new(),
            manual_sync: false,
            description: String::new(),
        }
    }

    fn compile(ws: Vec<Window>) -> Windows {
        Windows::compile(ws).expect("windows compile")
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The verdict for release `web` on cluster `c1` with no labels.
    fn at(ws: &Windows, now: &str) -> Verdict {
        ws.verdict("web", &BTreeMap::new(), "c1", t(now))
    }

    #[test]
    fn no_windows_allow_everything() {
        let ws = compile(Vec::new());
        assert!(ws.is_empty());
        let v = at(&ws, "2026-03-28T12:00:00Z");
        assert!(v.allowed && v.manual_sync_allowed);
        assert_eq!(v.next_change, None);
        assert_eq!(v.reason, "no sync window covers it");
    }

    #[test]
    fn deny_window_holds_until_it_closes() {
        let ws = compile(vec![w(Kind::Deny, "0 22 * * *", "1h", "UTC")]);
        let v = at(&ws, "2026-03-28T22:30:00Z");
        assert!(!v.allowed);
        assert!(!v.manual_sync_allowed);
        assert_eq!(v.next_change, Some(t("2026-03-28T23:00:00Z")));
        assert_eq!(
            v.reason,
            "held by deny window 0 (\"0 22 * * *\" UTC, 1h) until 2026-03-28 23:00 UTC"
        );
        // its edges: open at the start, closed at the end
        assert!(!at(&ws, "2026-03-28T22:00:00Z").allowed);
        assert!(at(&ws, "2026-03-28T23:00:00Z").allowed);
        assert!(at(&ws, "2026-03-28T21:59:59Z").allowed);
        // outside it: allowed until it next opens
        let v = at(&ws, "2026-03-28T12:00:00Z");
        assert!(v.allowed);
        assert_eq!(v.next_change, Some(t("2026-03-28T22:00:00Z")));
        assert_eq!(v.reason, "no deny window open until 2026-03-28 22:00 UTC");
    }

    #[test]
    fn deny_wins_over_an_open_allow_window() {
        let ws = compile(vec![
            w(Kind::Allow, "0 20 * * *", "4h", "UTC"),
            w(Kind::Deny, "0 21 * * *", "30m", "UTC"),
        ]);
        let v = at(&ws, "2026-03-28T21:10:00Z");
        assert!(!v.allowed);
        assert!(
            v.reason.starts_with("held by deny window 1"),
            "{}",
            v.reason
        );
        // the allow window is still open when the deny window closes
        assert_eq!(v.next_change, Some(t("2026-03-28T21:30:00Z")));
        let v = at(&ws, "2026-03-28T20:30:00Z");
        assert!(v.allowed);
        assert!(
            v.reason.starts_with("inside allow window 0"),
            "{}",
            v.reason
        );
        // …until the deny window opens inside it
        assert_eq!(v.next_change, Some(t("2026-03-28T21:00:00Z")));
        let v = at(&ws, "2026-03-28T21:45:00Z");
        assert!(v.allowed);
        assert_eq!(v.next_change, Some(t("2026-03-29T00:00:00Z")));
    }

    #[test]
    fn outside_the_allow_windows_is_denied_until_one_opens() {
        let ws = compile(vec![
            w(Kind::Allow, "0 22 * * *", "1h", "UTC"),
            w(Kind::Allow, "0 6 * * MON-FRI", "2h", "UTC"),
        ]);
        // Saturday 2026-03-28 noon: the weekday window doesn't open, the nightly one does at 22:00
        let v = at(&ws, "2026-03-28T12:00:00Z");
        assert!(!v.allowed);
        assert!(!v.manual_sync_allowed);
        assert_eq!(v.next_change, Some(t("2026-03-28T22:00:00Z")));
        assert!(
            v.reason.starts_with(
                "outside allow window 0 (\"0 22 * * *\" UTC, 1h) and allow window 1 (\"0 6 * * MON-FRI\" UTC, 2h)"
            ),
            "{}",
            v.reason
        );
        assert!(
            v.reason.ends_with("the next opens 2026-03-28 22:00 UTC"),
            "{}",
            v.reason
        );
        // Sunday night after the nightly window: Monday 06:00 comes first
        let v = at(&ws, "2026-03-29T23:30:00Z");
        assert!(!v.allowed);
        assert_eq!(v.next_change, Some(t("2026-03-30T06:00:00Z")));
        let v = at(&ws, "2026-03-30T07:00:00Z");
        assert!(v.allowed);
        assert_eq!(v.next_change, Some(t("2026-03-30T08:00:00Z")));
    }

    #[test]
    fn manual_sync_passes_a_deny_window_only_when_every_open_one_allows_it() {
        let mut a = w(Kind::Deny, "0 22 * * *", "2h", "UTC");
        a.manual_sync = true;
        let b = w(Kind::Deny, "0 23 * * *", "30m", "UTC");
        let ws = compile(vec![a, b]);
        let v = at(&ws, "2026-03-28T22:30:00Z");
        assert!(!v.allowed);
        assert!(v.manual_sync_allowed);
        assert!(
            v.reason.ends_with("; a manual sync may pass (manual_sync)"),
            "{}",
            v.reason
        );
        assert_eq!(v.next_change, Some(t("2026-03-29T00:00:00Z")));
        // both open: the second has no manual override
        let v = at(&ws, "2026-03-28T23:10:00Z");
        assert!(!v.allowed && !v.manual_sync_allowed);
        assert!(
            v.reason.contains("deny window 0") && v.reason.contains("and deny window 1"),
            "{}",
            v.reason
        );
    }

    #[test]
    fn manual_sync_outside_allow_windows_when_one_allows_it() {
        let mut a = w(Kind::Allow, "0 22 * * *", "1h", "UTC");
        a.manual_sync = true;
        let ws = compile(vec![a, w(Kind::Allow, "0 3 * * *", "1h", "UTC")]);
        let v = at(&ws, "2026-03-28T12:00:00Z");
        assert!(!v.allowed && v.manual_sync_allowed);
        let ws = compile(vec![w(Kind::Allow, "0 22 * * *", "1h", "UTC")]);
        assert!(!at(&ws, "2026-03-28T12:00:00Z").manual_sync_allowed);
    }

    #[test]
    fn long_windows_span_midnight_and_days() {
        // a weekend freeze: Friday 18:00 to Monday 09:00
        let ws = compile(vec![w(Kind::Deny, "0 18 * * FRI", "63h", "UTC")]);
        assert!(at(&ws, "2026-03-27T17:59:00Z").allowed);
        for inside in [
            "2026-03-27T18:00:00Z",
            "2026-03-28T00:30:00Z",
            "2026-03-29T12:00:00Z",
            "2026-03-30T08:59:59Z",
        ] {
            let v = at(&ws, inside);
            assert!(!v.allowed, "{inside}");
            assert_eq!(v.next_change, Some(t("2026-03-30T09:00:00Z")), "{inside}");
        }
        let v = at(&ws, "2026-03-30T09:00:00Z");
        assert!(v.allowed);
        assert_eq!(v.next_change, Some(t("2026-04-03T18:00:00Z")));
        // a nightly window across midnight
        let ws = compile(vec![w(Kind::Allow, "30 22 * * *", "4h", "UTC")]);
        let v = at(&ws, "2026-03-29T01:00:00Z");
        assert!(v.allowed);
        assert_eq!(v.next_change, Some(t("2026-03-29T02:30:00Z")));
        // 36 hours, daily: open for good, no end in sight
        let ws = compile(vec![w(Kind::Deny, "0 0 * * *", "36h", "UTC")]);
        let v = at(&ws, "2026-03-29T01:00:00Z");
        assert!(!v.allowed);
        assert_eq!(v.next_change, None);
        assert_eq!(
            v.reason,
            "held by deny window 0 (\"0 0 * * *\" UTC, 1day 12h)"
        );
        let open = ws.active("web", &BTreeMap::new(), "c1", t("2026-03-29T01:00:00Z"));
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].start, t("2026-03-29T00:00:00Z"));
        assert_eq!(open[0].end, None);
    }

    #[test]
    fn overlapping_openings_of_one_window_merge() {
        // every 2 hours for 3 hours: open from Monday 00:00 to Tuesday 01:00 (the last start is 22:00)
        let ws = compile(vec![w(Kind::Deny, "0 */2 * * MON", "3h", "UTC")]);
        let v = at(&ws, "2026-03-30T05:00:00Z");
        assert!(!v.allowed);
        assert_eq!(v.next_change, Some(t("2026-03-31T01:00:00Z")));
        let open = ws.active("web", &BTreeMap::new(), "c1", t("2026-03-30T05:00:00Z"));
        assert_eq!(open[0].start, t("2026-03-30T04:00:00Z"));
        assert_eq!(open[0].end, Some(t("2026-03-31T01:00:00Z")));
    }

    #[test]
    fn the_change_is_found_past_windows_that_do_not_change_it() {
        // a weekend freeze over an allow window open ten minutes every hour: held through the freeze's
        // 63 hourly openings, then until the first of them after it
        let ws = compile(vec![
            w(Kind::Deny, "0 18 * * FRI", "63h", "UTC"),
            w(Kind::Allow, "30 * * * *", "10m", "UTC"),
        ]);
        let v = at(&ws, "2026-03-28T12:35:00Z");
        assert!(!v.allowed);
        assert_eq!(v.next_change, Some(t("2026-03-30T09:30:00Z")));
        // an allow window open for good: allowed until a deny window opens
        let ws = compile(vec![
            w(Kind::Allow, "* * * * *", "1m", "UTC"),
            w(Kind::Deny, "0 3 * * SUN", "1h", "UTC"),
        ]);
        let v = at(&ws, "2026-03-28T12:00:00Z");
        assert!(v.allowed);
        assert_eq!(v.next_change, Some(t("2026-03-29T03:00:00Z")));
        assert_eq!(
            at(&ws, "2026-03-29T03:10:00Z").next_change,
            Some(t("2026-03-29T04:00:00Z"))
        );
        // a deny window open for good: no change to wait for
        let ws = compile(vec![w(Kind::Deny, "*/5 * * * *", "10m", "UTC")]);
        let v = at(&ws, "2026-03-28T12:00:00Z");
        assert!(!v.allowed);
        assert_eq!(v.next_change, None);
        assert_eq!(v.reason, "held by deny window 0 (\"*/5 * * * *\" UTC, 10m)");
    }

    #[test]
    fn schedules_follow_the_local_clock_across_dst_in_berlin() {
        let ws = compile(vec![w(Kind::Deny, "0 22 * * *", "1h", "Europe/Berlin")]);
        // Saturday 2026-03-28, CET (UTC+1): 22:00 local is 21:00 UTC
        assert!(!at(&ws, "2026-03-28T21:30:00Z").allowed);
        assert!(at(&ws, "2026-03-28T22:30:00Z").allowed);
        // Sunday 2026-03-29, CEST (UTC+2) since 02:00: 22:00 local is 20:00 UTC
        let v = at(&ws, "2026-03-29T12:00:00Z");
        assert_eq!(v.next_change, Some(t("2026-03-29T20:00:00Z")));
        assert!(!at(&ws, "2026-03-29T20:30:00Z").allowed);
        assert!(at(&ws, "2026-03-29T21:30:00Z").allowed);
        // October: Saturday 24th still CEST, Sunday 25th CET again
        assert_eq!(
            at(&ws, "2026-10-24T12:00:00Z").next_change,
            Some(t("2026-10-24T20:00:00Z"))
        );
        let v = at(&ws, "2026-10-25T12:00:00Z");
        assert_eq!(v.next_change, Some(t("2026-10-25T21:00:00Z")));
        let v = at(&ws, "2026-10-25T21:15:00Z");
        assert!(!v.allowed);
        assert_eq!(v.next_change, Some(t("2026-10-25T22:00:00Z")));
        assert!(v.reason.contains("Europe/Berlin"), "{}", v.reason);
    }

    #[test]
    fn a_start_the_clock_skips_or_repeats_happens_once() {
        let ws = compile(vec![w(Kind::Deny, "30 2 * * *", "30m", "Europe/Berlin")]);
        // 2026-03-28 02:30 CET = 01:30 UTC
        assert!(!at(&ws, "2026-03-28T01:45:00Z").allowed);
        // 2026-03-29: 02:00–03:00 local doesn't exist; the start is the first instant after the gap,
        // 03:00 CEST = 01:00 UTC
        let v = at(&ws, "2026-03-29T00:30:00Z");
        assert!(v.allowed);
        assert_eq!(v.next_change, Some(t("2026-03-29T01:00:00Z")));
        assert!(!at(&ws, "2026-03-29T01:15:00Z").allowed);
        assert!(at(&ws, "2026-03-29T01:30:00Z").allowed);
        // 2026-10-25: 02:30 local happens twice (00:30 UTC in CEST, 01:30 UTC in CET); it opens at the first
        assert!(!at(&ws, "2026-10-25T00:45:00Z").allowed);
        let v = at(&ws, "2026-10-25T01:45:00Z");
        assert!(v.allowed);
        // next: 2026-10-26 02:30 CET = 01:30 UTC
        assert_eq!(v.next_change, Some(t("2026-10-26T01:30:00Z")));
    }

    #[test]
    fn schedules_follow_the_local_clock_across_dst_in_new_york() {
        // business hours, New York
        let ws = compile(vec![w(
            Kind::Allow,
            "0 9 * * MON-FRI",
            "8h",
            "America/New_York",
        )]);
        // Friday 2026-03-06, EST (UTC-5): 09:00–17:00 local is 14:00–22:00 UTC
        assert!(at(&ws, "2026-03-06T14:00:00Z").allowed);
        assert!(at(&ws, "2026-03-06T21:59:00Z").allowed);
        let v = at(&ws, "2026-03-06T22:00:00Z");
        assert!(!v.allowed);
        // DST began Sunday 2026-03-08: Monday 09:00 EDT (UTC-4) is 13:00 UTC
        assert_eq!(v.next_change, Some(t("2026-03-09T13:00:00Z")));
        assert!(at(&ws, "2026-03-09T13:30:00Z").allowed);
        assert!(!at(&ws, "2026-03-09T21:30:00Z").allowed);
        // and back: Monday 2026-11-02 09:00 EST is 14:00 UTC
        let v = at(&ws, "2026-10-31T12:00:00Z");
        assert_eq!(v.next_change, Some(t("2026-11-02T14:00:00Z")));
    }

    #[test]
    fn cron_syntax_ranges_steps_lists_and_names() {
        let ws = compile(vec![w(
            Kind::Allow,
            "0,30 8-10/2 1,15 jan,JUL *",
            "10m",
            "UTC",
        )]);
        assert!(at(&ws, "2026-01-15T08:35:00Z").allowed);
        assert!(at(&ws, "2026-07-01T10:05:00Z").allowed);
        assert!(!at(&ws, "2026-07-01T09:05:00Z").allowed);
        assert!(!at(&ws, "2026-02-01T08:05:00Z").allowed);
        let v = at(&ws, "2026-01-15T11:00:00Z");
        assert_eq!(v.next_change, Some(t("2026-07-01T08:00:00Z")));
        // day of month and day of week both restricted: either one (cron's rule)
        let ws = compile(vec![w(Kind::Deny, "0 12 13 * FRI", "1h", "UTC")]);
        assert!(!at(&ws, "2026-03-13T12:30:00Z").allowed); // a Friday the 13th
        assert!(!at(&ws, "2026-03-20T12:30:00Z").allowed); // a Friday
        assert!(!at(&ws, "2026-04-13T12:30:00Z").allowed); // a Monday the 13th
        assert!(at(&ws, "2026-04-14T12:30:00Z").allowed);
        // Sunday is 0 and 7
        let ws = compile(vec![w(Kind::Deny, "0 0 * * 7", "1d", "UTC")]);
        assert!(!at(&ws, "2026-03-29T12:00:00Z").allowed);
        assert!(at(&ws, "2026-03-30T12:00:00Z").allowed);
    }

    #[test]
    fn unknown_time_zone_is_refused_with_its_name() {
        let e = Windows::compile(vec![
            w(Kind::Allow, "0 22 * * *", "1h", "UTC"),
            w(Kind::Deny, "0 22 * * *", "1h", "Mars/Olympus"),
        ])
        .expect_err("Mars has no IANA zone");
        assert!(
            matches!(&e, Error::UnknownTimeZone { index: 1, zone, .. } if zone == "Mars/Olympus")
        );
        let text = e.to_string();
        assert!(text.contains("\"Mars/Olympus\""), "{text}");
        assert!(
            text.starts_with("windows[1] (schedule \"0 22 * * *\"): unknown time zone"),
            "{text}"
        );
        assert!(!e.is_retryable());
    }

    #[test]
    fn bad_schedules_are_refused() {
        for (schedule, want) in [
            ("0 22 * *", "not a 5-field cron schedule"),
            ("0 0 22 * * *", "not a 5-field cron schedule"),
            ("61 22 * * *", "not a 5-field cron schedule"),
            ("0 25 * * *", "not a 5-field cron schedule"),
            ("0 22 * * FUNDAY", "not a 5-field cron schedule"),
            ("", "not a 5-field cron schedule"),
            ("0 0 30 2 *", "never fires"),
        ] {
            let e =
                Windows::compile(vec![w(Kind::Deny, schedule, "1h", "UTC")]).expect_err(schedule);
            let text = e.to_string();
            assert!(text.contains(want), "{schedule}: {text}");
            assert!(
                text.contains(&format!("{schedule:?}")),
                "{schedule}: {text}"
            );
        }
        // Feb 29 fires, in leap years
        let ws = compile(vec![w(Kind::Deny, "0 0 29 2 *", "1d", "UTC")]);
        assert_eq!(
            at(&ws, "2026-03-01T00:00:00Z").next_change,
            None,
            "beyond the horizon"
        );
        assert!(!at(&ws, "2028-02-29T12:00:00Z").allowed);
    }

    #[test]
    fn zero_duration_bad_selector_and_empty_release_are_refused() {
        let e = Windows::compile(vec![w(Kind::Deny, "0 22 * * *", "0s", "UTC")]).expect_err("0s");
        assert!(matches!(e, Error::ZeroDuration { index: 0, .. }));
        assert!(e.to_string().contains("duration must be more than zero"));
        let mut bad = w(Kind::Deny, "0 22 * * *", "1h", "UTC");
        bad.clusters = "env in prod".into();
        let e = Windows::compile(vec![bad]).expect_err("selector");
        assert!(matches!(e, Error::Selector { .. }));
        assert!(
            e.to_string()
                .contains("clusters: invalid label selector \"env in prod\""),
            "{e}"
        );
        let mut bad = w(Kind::Deny, "0 22 * * *", "1h", "UTC");
        bad.releases = vec!["web".into(), " ".into()];
        let e = Windows::compile(vec![bad]).expect_err("release");
        assert!(matches!(e, Error::EmptyRelease { .. }));
    }

    #[test]
    fn cluster_selectors_choose_the_windows() {
        let mut prod = w(Kind::Deny, "0 22 * * *", "1h", "UTC");
        prod.clusters = "env=prod,version>=1.30".into();
        let mut named = w(Kind::Deny, "0 12 * * *", "1h", "UTC");
        named.clusters = "cluster in (eu-1,eu-2)".into();
        let ws = compile(vec![prod, named]);
        let now = t("2026-03-28T22:30:00Z");
        let prod_new = labels(&[("env", "prod"), ("version", "1.31")]);
        let prod_old = labels(&[("env", "prod"), ("version", "1.29")]);
        let staging = labels(&[("env", "staging"), ("version", "1.31")]);
        assert!(!ws.verdict("web", &prod_new, "us-1", now).allowed);
        assert!(ws.verdict("web", &prod_old, "us-1", now).allowed);
        let v = ws.verdict("web", &staging, "us-1", now);
        assert!(v.allowed);
        assert_eq!(v.reason, "no sync window covers it");
        // the `cluster` label is the name, unless the labels carry it already
        let noon = t("2026-03-28T12:30:00Z");
        assert!(!ws.verdict("web", &staging, "eu-2", noon).allowed);
        assert!(ws.verdict("web", &staging, "us-1", noon).allowed);
        let mut with_name = staging.clone();
        with_name.insert("cluster".into(), "eu-1".into());
        assert!(!ws.verdict("web", &with_name, "ignored", noon).allowed);
    }

    #[test]
    fn release_names_and_globs_choose_the_windows() {
        let mut payments = w(Kind::Deny, "0 22 * * *", "1h", "UTC");
        payments.releases = vec!["payments-*".into(), "ledger".into(), "web-?".into()];
        let ws = compile(vec![payments]);
        let now = t("2026-03-28T22:30:00Z");
        let none = BTreeMap::new();
        for held in ["payments-api", "payments-", "ledger", "web-1"] {
            assert!(!ws.verdict(held, &none, "c1", now).allowed, "{held}");
        }
        for free in ["ledger-2", "web-10", "web", "my-payments-api"] {
            assert!(ws.verdict(free, &none, "c1", now).allowed, "{free}");
        }
    }

    #[test]
    fn globs() {
        for (p, n, want) in [
            ("*", "", true),
            ("*", "abc", true),
            ("a*c", "abbbc", true),
            ("a*c", "abcd", false),
            ("*-prod", "eu-prod", true),
            ("*-prod", "eu-production", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxcyyb", false),
            ("??", "ab", true),
            ("??", "abc", false),
            ("web", "web", true),
            ("web", "webs", false),
        ] {
            assert_eq!(glob(p, n), want, "{p} ~ {n}");
        }
    }

    #[test]
    fn active_upcoming_and_overview_for_display() {
        let mut freeze = w(Kind::Deny, "0 18 * * FRI", "63h", "Europe/Berlin");
        freeze.clusters = "env=prod".into();
        freeze.description = "weekend freeze".into();
        freeze.manual_sync = true;
        let nightly = w(Kind::Allow, "0 22 * * *", "2h", "UTC");
        let ws = compile(vec![freeze, nightly]);
        let prod = labels(&[("env", "prod")]);
        // Saturday 2026-03-28 12:00 UTC: the freeze is open (since Friday 18:00 CET = 17:00 UTC)
        let now = t("2026-03-28T12:00:00Z");
        let open = ws.active("web", &prod, "c1", now);
        assert_eq!(open.len(), 1);
        let f = &open[0];
        assert_eq!(
            (f.index, f.kind, f.active, f.manual_sync),
            (0, Kind::Deny, true, true)
        );
        assert_eq!(f.start, t("2026-03-27T17:00:00Z"));
        // Friday 18:00 CET + 63h: Monday 09:00 CEST, the clocks having moved on Sunday
        assert_eq!(f.end, Some(t("2026-03-30T08:00:00Z")));
        assert_eq!(f.duration, "2days 15h");
        assert_eq!(f.time_zone, "Europe/Berlin");
        let next = ws.upcoming("web", &prod, "c1", now);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].index, 1);
        assert!(!next[0].active);
        assert_eq!(next[0].start, t("2026-03-28T22:00:00Z"));
        assert_eq!(next[0].end, Some(t("2026-03-29T00:00:00Z")));
        // the freeze covers prod only
        assert!(ws.active("web", &BTreeMap::new(), "c1", now).is_empty());
        let all = ws.overview(now);
        assert_eq!(all.len(), 2);
        assert!(all[0].active && !all[1].active);
        // the verdict names it, and may be overridden
        let v = ws.verdict("web", &prod, "c1", now);
        assert!(!v.allowed && v.manual_sync_allowed);
        // the freeze ends Monday 08:00 UTC; the next allow window opens Monday 22:00 UTC
        assert_eq!(v.next_change, Some(t("2026-03-30T22:00:00Z")));
        assert!(v.reason.contains("weekend freeze"), "{}", v.reason);
    }

    #[test]
    fn windows_read_from_yaml() {
        let yaml = r#"
- kind: deny
  schedule: "0 18 * * FRI"
  duration: 63h
  time_zone: Europe/Berlin
  clusters: env=prod
  releases: ["payments-*"]
  manual_sync: true
  description: weekend freeze
- kind: allow
  schedule: "@daily"
  duration: 30m
"#;
        let ws: Vec<Window> = serde_yaml::from_str(yaml).expect("yaml");
        assert_eq!(ws[0].duration, Duration::from_secs(63 * 3600));
        assert_eq!(ws[1].time_zone, "UTC");
        assert!(ws[1].clusters.is_empty() && ws[1].releases.is_empty() && !ws[1].manual_sync);
        let back: Vec<Window> =
            serde_yaml::from_str(&serde_yaml::to_string(&ws).expect("to yaml")).expect("back");
        assert_eq!(ws, back);
        let compiled = compile(ws);
        assert!(at(&compiled, "2026-03-28T00:10:00Z").allowed);
        assert!(!at(&compiled, "2026-03-28T12:00:00Z").allowed);
        assert!(
            serde_yaml::from_str::<Vec<Window>>(
                "- kind: deny\n  schedule: x\n  duration: 1h\n  zone: UTC\n"
            )
            .is_err()
        );
        assert!(
            serde_yaml::from_str::<Vec<Window>>("- kind: maybe\n  schedule: x\n  duration: 1h\n")
                .is_err()
        );
    }
}
