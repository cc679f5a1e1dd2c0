//! The scenarios, and what they share: options, seq accounting, reading what the streams hold, the
//! standard figures and plots.

pub mod crash;
pub mod delivery;
pub mod faults;
pub mod fleet_phase;
pub mod scaleout;
pub mod steady;
pub mod storm;
pub mod throughput;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::Result;
use multipilot_schemas::Envelope;
use multipilot_schemas::payload::{Heartbeat, Incident, MetricBatch, Notification};
use serde::de::IgnoredAny;

use crate::record::{Recorder, Summary};
use crate::report::Report;
use crate::system::{Bins, System};

/// Options every scenario takes (each has its own defaults for a full and a short run).
#[derive(Debug, Clone, clap::Args)]
pub struct Opts {
    /// The short variant (what `./scripts/test` runs): small fleet, seconds instead of minutes.
    #[arg(long)]
    pub short: bool,
    /// Where the report goes (report.md, report.json, series.json, plots/).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Where the system's binaries are (default: next to this one).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Keep the run's data and logs (printed at the end) instead of deleting them.
    #[arg(long)]
    pub keep: bool,
    /// Simulated clusters.
    #[arg(long)]
    pub clusters: Option<usize>,
    /// Objects per cluster.
    #[arg(long)]
    pub objects: Option<usize>,
    /// Kubernetes events per second per cluster.
    #[arg(long)]
    pub events_per_second: Option<f64>,
    /// Object changes per second per cluster.
    #[arg(long)]
    pub churn: Option<f64>,
    /// Agent processes.
    #[arg(long)]
    pub agents: Option<usize>,
    /// Seconds of load (steady), of outage (storm), or of drilling (crash).
    #[arg(long)]
    pub duration: Option<u64>,
    /// Rounds (crash drill: kills of each role).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Runs only these parts (throughput: publish, correlator, storm, live, tsdb, alerts, console), e.g. to
    /// profile one role.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Steady: a reconnect storm in the middle of the load window, NATS down for this many seconds.
    #[arg(long)]
    pub storm: Option<u64>,
    /// Throughput: samples per synthetic scrape (default 500), e.g. to see how the raw pull and the TSDB
    /// scale with a message's size.
    #[arg(long)]
    pub samples: Option<usize>,
}

impl Opts {
    /// `short` or `full` value.
    pub fn pick<T>(&self, short: T, full: T) -> T {
        if self.short { short } else { full }
    }

    /// Whether the part `name` of the scenario runs (every part unless `--only` names some).
    pub fn runs(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == name)
    }

    /// The binaries.
    pub fn bins(&self) -> Result<Bins> {
        let dir = match &self.bin_dir {
            Some(d) => d.clone(),
            None => std::env::current_exe()?
                .parent()
                .map(PathBuf::from)
                .unwrap_or_default(),
        };
        Bins::in_dir(&dir)
    }
}

/// A routing file for drills: the default tree with short group timings, so a drill sees each change
/// notified within seconds (the default waits 30 s / 5 min).
pub const FAST_ROUTING: &str = r#"
route:
  receiver: fleet
  group_by: [cluster, alertname]
  group_wait: 1s
  group_interval: 2s
  repeat_interval: 4h
receivers:
  - name: fleet
    nats_configs: [{}]
inhibit_rules:
  - source_matchers: ['alertname="cluster-unreachable"']
    target_matchers: ['alertname!="cluster-unreachable"']
    equal: [cluster]
"#;

/// One switch of the rolling DNS fault.
#[derive(Debug, Clone)]
pub struct Injection {
    /// The cluster.
    pub cluster: String,
    /// When it was switched on.
    pub at: std::time::Instant,
    /// The same, by the wall clock.
    pub wall: chrono::DateTime<chrono::Utc>,
    /// Held for the whole `hold` (the last one may be cut short when the roll is stopped).
    pub held: bool,
}

/// A DNS fault (`coredns-down`) on one cluster at a time, round robin: `hold` seconds on, `gap` off, until
/// the task is aborted. Returns the task and the injections made so far.
pub fn roll_dns_faults(
    faults: crate::system::Faults,
    clusters: Vec<String>,
    hold: u64,
    gap: u64,
) -> (
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<Vec<Injection>>>,
) {
    let injections: std::sync::Arc<std::sync::Mutex<Vec<Injection>>> = Default::default();
    let log = injections.clone();
    let task = tokio::spawn(async move {
        for c in clusters.iter().cycle() {
            if faults.set(c, "coredns-down", true, &[]).await.is_ok() {
                log.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Injection {
                        cluster: c.clone(),
                        at: std::time::Instant::now(),
                        wall: chrono::Utc::now(),
                        held: false,
                    });
            }
            tokio::time::sleep(std::time::Duration::from_secs(hold)).await;
            if let Some(last) = log.lock().unwrap_or_else(|e| e.into_inner()).last_mut() {
                last.held = true;
            }
            let _ = faults.set(c, "coredns-down", false, &[]).await;
            tokio::time::sleep(std::time::Duration::from_secs(gap)).await;
        }
    });
    (task, injections)
}

/// One cluster's seq accounting (see the agent's outbox policy: each seq is delivered, superseded or
/// dropped).
#[derive(Debug, Clone, Default)]
pub struct Accounting {
    /// The seq of the last heartbeat (whose counters close the accounting).
    pub last_seq: u64,
    /// Distinct seqs stored, up to `last_seq`.
    pub stored: u64,
    /// Messages stored up to `last_seq` (more than `stored` means a seq stored twice).
    pub messages: u64,
    /// The agent's counters.
    pub superseded: u64,
    /// Metric batches dropped by the disk budget.
    pub dropped: u64,
    /// Duplicates the agent knows it suppressed.
    pub duplicates: u64,
}

impl Accounting {
    /// Seqs neither stored nor accounted for by the agent (negative: more accounted than missing).
    pub fn unaccounted(&self) -> i64 {
        let missing = self.last_seq as i64 - self.stored as i64;
        missing - (self.superseded + self.dropped + self.duplicates) as i64
    }
}

/// Reads every agent stream and accounts for every seq of every cluster.
pub async fn account(sys: &System) -> Result<BTreeMap<String, Accounting>> {
    let mut seqs: BTreeMap<String, (BTreeSet<u64>, Vec<u64>)> = BTreeMap::new();
    let mut last_hb: BTreeMap<String, (u64, Heartbeat)> = BTreeMap::new();
    for stream in [
        "FLEET_STATE",
        "FLEET_FACTS",
        "FLEET_HEALTH",
        "FLEET_EVENTS",
        "FLEET_METRICS",
    ] {
        sys.for_each_message(stream, "", |subject, body| {
            if subject.starts_with("fleet.hb.") {
                if let Ok(env) = rmp_serde::from_slice::<Envelope<Heartbeat>>(body) {
                    let e = seqs.entry(env.cluster.clone()).or_default();
                    e.0.insert(env.seq);
                    e.1.push(env.seq);
                    let newer = last_hb.get(&env.cluster).is_none_or(|(s, _)| env.seq > *s);
                    if newer {
                        last_hb.insert(env.cluster, (env.seq, env.payload));
                    }
                }
            } else if let Ok(env) = rmp_serde::from_slice::<Envelope<IgnoredAny>>(body) {
                let e = seqs.entry(env.cluster).or_default();
                e.0.insert(env.seq);
                e.1.push(env.seq);
            }
        })
        .await?;
    }
    let mut out = BTreeMap::new();
    for (cluster, (set, all)) in seqs {
        let Some((last, hb)) = last_hb.get(&cluster) else {
            continue;
        };
        out.insert(
            cluster,
            Accounting {
                last_seq: *last,
                stored: set.range(..=*last).count() as u64,
                messages: all.iter().filter(|s| **s <= *last).count() as u64,
                superseded: hb.superseded,
                dropped: hb.dropped_metric_batches,
                duplicates: hb.duplicates,
            },
        );
    }
    Ok(out)
}

/// Adds the accounting invariants to a report.
pub fn report_accounting(r: &mut Report, clusters: &[String], acc: &BTreeMap<String, Accounting>) {
    let missing_clusters: Vec<&String> =
        clusters.iter().filter(|c| !acc.contains_key(*c)).collect();
    let bad: Vec<String> = acc
        .iter()
        .filter(|(_, a)| a.unaccounted() != 0)
        .map(|(c, a)| {
            format!(
                "{c}: last seq {}, stored {}, superseded {}, dropped {}, duplicates {}",
                a.last_seq, a.stored, a.superseded, a.dropped, a.duplicates
            )
        })
        .collect();
    let twice: Vec<String> = acc
        .iter()
        .filter(|(_, a)| a.messages != a.stored)
        .map(|(c, a)| format!("{c}: {} messages for {} seqs", a.messages, a.stored))
        .collect();
    let total: u64 = acc.values().map(|a| a.last_seq).sum();
    let stored: u64 = acc.values().map(|a| a.stored).sum();
    let superseded: u64 = acc.values().map(|a| a.superseded).sum();
    let dropped: u64 = acc.values().map(|a| a.dropped).sum();
    r.figure(
        "seq accounting",
        format!(
            "{total} seqs from {} clusters: {stored} stored, {superseded} superseded in the outbox, {dropped} metric batches dropped",
            acc.len()
        ),
    );
    r.invariant(
        "every cluster's accounting is closed by a last heartbeat",
        missing_clusters.is_empty(),
        if missing_clusters.is_empty() {
            format!("{} clusters", clusters.len())
        } else {
            format!("no heartbeat from {missing_clusters:?}")
        },
    );
    r.invariant(
        "nothing lost: every seq stored, superseded or dropped (by the agent's own count)",
        bad.is_empty(),
        if bad.is_empty() {
            format!("{total} seqs accounted for")
        } else {
            bad.join("; ")
        },
    );
    r.invariant(
        "no seq stored twice",
        twice.is_empty(),
        if twice.is_empty() {
            format!("{stored} distinct seqs")
        } else {
            twice.join("; ")
        },
    );
}

/// Every incident change the stream holds, in order.
pub async fn stored_incidents(sys: &System) -> Result<Vec<Incident>> {
    let mut out = Vec::new();
    sys.for_each_message("FLEET_INCIDENTS", "fleet.incident.>", |_, body| {
        if let Ok(env) = rmp_serde::from_slice::<Envelope<Incident>>(body) {
            out.push(env.payload);
        }
    })
    .await?;
    Ok(out)
}

/// Every notification the stream holds, in order.
pub async fn stored_notifications(sys: &System) -> Result<Vec<Notification>> {
    let mut out = Vec::new();
    sys.for_each_message("FLEET_ALERTS", "fleet.alert.>", |_, body| {
        if let Ok(env) = rmp_serde::from_slice::<Envelope<Notification>>(body) {
            out.push(env.payload);
        }
    })
    .await?;
    Ok(out)
}

/// Per cluster, the timestamps of one series (`name` with `resource="pods"`-like label filter) in the
/// metric batches the stream holds.
pub async fn stored_sample_times(
    sys: &System,
    name: &str,
    label: (&str, &str),
) -> Result<BTreeMap<String, BTreeSet<i64>>> {
    let mut out: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    sys.for_each_message("FLEET_METRICS", "", |_, body| {
        if let Ok(env) = rmp_serde::from_slice::<Envelope<MetricBatch>>(body) {
            for s in &env.payload.samples {
                if s.name == name && s.labels.get(label.0).map(String::as_str) == Some(label.1) {
                    out.entry(env.cluster.clone())
                        .or_default()
                        .insert(s.timestamp_ms);
                }
            }
        }
    })
    .await?;
    Ok(out)
}

/// Per cluster, the timestamps the TSDB returns for a range selector.
pub async fn queried_sample_times(
    sys: &System,
    tsdb: &str,
    selector: &str,
    window_s: u64,
) -> Result<BTreeMap<String, BTreeSet<i64>>> {
    let mut out: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    for s in sys.query(tsdb, &format!("{selector}[{window_s}s]")).await? {
        let cluster = s["metric"]["cluster"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for p in s["values"].as_array().into_iter().flatten() {
            if let Some(t) = p[0].as_f64() {
                out.entry(cluster.clone())
                    .or_default()
                    .insert((t * 1000.0).round() as i64);
            }
        }
    }
    Ok(out)
}

/// Compares what the stream holds with what the TSDB answers: (samples in the stream, missing in the TSDB,
/// per-cluster detail of what is missing).
pub fn compare_samples(
    stored: &BTreeMap<String, BTreeSet<i64>>,
    queried: &BTreeMap<String, BTreeSet<i64>>,
) -> (usize, usize, Vec<String>) {
    let mut total = 0;
    let mut missing = 0;
    let mut detail = Vec::new();
    for (cluster, times) in stored {
        total += times.len();
        let q = queried.get(cluster);
        let lost: Vec<&i64> = times
            .iter()
            .filter(|t| !q.is_some_and(|q| q.contains(t)))
            .collect();
        if !lost.is_empty() {
            missing += lost.len();
            detail.push(format!(
                "{cluster}: {} of {} missing (first at {} ms)",
                lost.len(),
                times.len(),
                lost[0]
            ));
        }
    }
    (total, missing, detail)
}

/// CPU and memory figures of every process sampled, and the standard plots.
pub fn report_processes(r: &mut Report, rec: &Recorder) {
    let mut cpu_lines = Vec::new();
    let mut rss_lines = Vec::new();
    for (name, s) in rec.series_with_prefix("cpu/") {
        let proc = name.trim_start_matches("cpu/").to_string();
        let v: Vec<f64> = s.points.iter().map(|p| p.1).collect();
        let sum = Summary::of(&v);
        let rss: Vec<f64> = rec
            .series(&format!("rss/{proc}"))
            .map(|s| s.points.iter().map(|p| p.1).collect())
            .unwrap_or_default();
        let rss_max = rss.iter().copied().fold(0.0, f64::max);
        let rss_last = rss.last().copied().unwrap_or(0.0);
        r.figure(
            format!("{proc}: CPU, RSS"),
            format!(
                "CPU mean {:.0} % (p95 {:.0} %, max {:.0} %); RSS max {:.0} MiB (at the end {:.0} MiB)",
                sum.mean, sum.p95, sum.max, rss_max, rss_last
            ),
        );
        cpu_lines.push((proc.clone(), name.clone()));
        rss_lines.push((proc.clone(), format!("rss/{proc}")));
    }
    r.plot("cpu", "CPU per process", "% of one core", cpu_lines);
    r.plot("memory", "Resident memory per process", "MiB", rss_lines);
}

/// Input rate of each agent stream, processing rate of each consumer, backlogs: figures over
/// `[from, to]` seconds and the plots.
pub fn report_flow(r: &mut Report, rec: &Recorder, from: f64, to: f64) {
    let mut stored_lines = Vec::new();
    for (name, s) in rec.series_with_prefix("stored/") {
        let stream = name.trim_start_matches("stored/").to_string();
        if let Some(rate) = mean_rate(&s.points, from, to) {
            r.figure(format!("stored into {stream}"), format!("{rate:.1} msgs/s"));
        }
        stored_lines.push((stream, name));
    }
    let mut consumed_lines = Vec::new();
    for (name, s) in rec.series_with_prefix("consumed/") {
        let label = name.trim_start_matches("consumed/").to_string();
        if let Some(rate) = mean_rate(&s.points, from, to) {
            r.figure(format!("processed by {label}"), format!("{rate:.1} msgs/s"));
        }
        consumed_lines.push((label, name));
    }
    let backlog_lines: Vec<(String, String)> = rec
        .series_with_prefix("backlog/")
        .into_iter()
        .map(|(n, _)| (n.trim_start_matches("backlog/").to_string(), n))
        .collect();
    r.rate_plot(
        "stored",
        "Messages stored per second, per stream",
        "msgs/s",
        stored_lines,
    );
    r.rate_plot(
        "processed",
        "Messages processed per second, per role and consumer",
        "msgs/s",
        consumed_lines,
    );
    r.plot(
        "backlog",
        "Backlog: consumer pending + unacked, agent outboxes",
        "msgs",
        backlog_lines,
    );
}

/// Mean rate of a counter between two times (resets skipped).
pub fn mean_rate(points: &[(f64, f64)], from: f64, to: f64) -> Option<f64> {
    let inside: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|(t, _)| *t >= from && *t <= to)
        .collect();
    let span: f64 = inside
        .windows(2)
        .filter(|w| w[1].1 >= w[0].1)
        .map(|w| w[1].0 - w[0].0)
        .sum();
    if span <= 0.0 {
        return None;
    }
    let total: f64 = inside
        .windows(2)
        .filter(|w| w[1].1 >= w[0].1)
        .map(|w| w[1].1 - w[0].1)
        .sum();
    Some(total / span)
}

/// Slack on the sampling interval: a counter is read some milliseconds after its sample's timestamp is
/// taken (more on a loaded machine), so an interval may hold a little more time than measured.
const SLACK_S: f64 = 0.25;

/// Checks, for every role's consumer, that no sampling interval saw more than `per_second * dt + burst`
/// messages let in (`multipilot_bus_admitted_total`: a token bucket allows no more), with `SLACK_S` of
/// slack on `dt`.
pub fn report_rate_limits(r: &mut Report, rec: &Recorder, per_second: u32, burst: u32) {
    let mut worst: Vec<String> = Vec::new();
    let mut max_rate: f64 = 0.0;
    let mut checked = 0;
    for (name, s) in rec.series_with_prefix("admitted/") {
        if name.contains("/agent-") {
            continue;
        }
        for w in s.points.windows(2) {
            let (dt, dv) = (w[1].0 - w[0].0, w[1].1 - w[0].1);
            if dt <= 0.0 || dv < 0.0 {
                continue;
            }
            checked += 1;
            max_rate = max_rate.max(dv / dt);
            let bound = f64::from(per_second) * (dt + SLACK_S) + f64::from(burst);
            if dv > bound {
                worst.push(format!(
                    "{}: {dv:.0} in {dt:.2} s at {:.0} s (bound {bound:.0})",
                    name.trim_start_matches("admitted/"),
                    w[1].0
                ));
            }
        }
    }
    r.figure(
        "highest consumer input rate seen",
        format!("{max_rate:.0} msgs/s (limit {per_second}/s, burst {burst})"),
    );
    r.invariant(
        "no consumer's input rate above its configured limit",
        worst.is_empty() && checked > 0,
        if worst.is_empty() {
            format!("{checked} intervals checked")
        } else {
            worst.join("; ")
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounting_balances_missing_against_the_agents_counts() {
        let a = Accounting {
            last_seq: 100,
            stored: 90,
            messages: 90,
            superseded: 8,
            dropped: 2,
            duplicates: 0,
        };
        assert_eq!(a.unaccounted(), 0);
        let lost = Accounting { stored: 89, ..a };
        assert_eq!(lost.unaccounted(), 1);
    }

    #[test]
    fn sample_comparison_names_what_is_missing() {
        let stored = BTreeMap::from([
            ("a".to_string(), BTreeSet::from([1, 2, 3])),
            ("b".to_string(), BTreeSet::from([5])),
        ]);
        let queried = BTreeMap::from([("a".to_string(), BTreeSet::from([1, 2, 3, 4]))]);
        let (total, missing, detail) = compare_samples(&stored, &queried);
        assert_eq!((total, missing), (4, 1));
        assert!(detail[0].starts_with("b: 1 of 1"));
    }

    #[test]
    fn mean_rate_spans_the_window() {
        let pts = [
            (0.0, 0.0),
            (1.0, 10.0),
            (2.0, 20.0),
            (3.0, 5.0),
            (4.0, 15.0),
        ];
        assert_eq!(mean_rate(&pts, 0.0, 2.0), Some(10.0));
        // the reset between 2 and 3 is skipped
        assert_eq!(mean_rate(&pts, 0.0, 4.0), Some(10.0));
        assert_eq!(mean_rate(&pts, 10.0, 20.0), None);
    }
}
