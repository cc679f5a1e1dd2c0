//! Watching a run from the outside, as its users would: subscribers on the subjects (heartbeats, probes,
//! incidents, notifications), the TSDB's query API, JetStream's monitoring endpoint, each role's
//! `/metrics`, and `/proc` for CPU and memory.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use multipilot_schemas::Envelope;
use multipilot_schemas::payload::{EventDigest, FleetIncident, Heartbeat, Incident, Notification};
use tokio_util_free::Token;

use crate::record::Recorder;
use crate::system::{System, Watched};

/// A tiny cancellation flag (no extra dependency).
mod tokio_util_free {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Set once to stop the observer's tasks.
    #[derive(Debug, Clone, Default)]
    pub struct Token(Arc<AtomicBool>);

    impl Token {
        /// Stop.
        pub fn cancel(&self) {
            self.0.store(true, Ordering::SeqCst);
        }
        /// Stopped?
        pub fn is_cancelled(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }
}

/// A heartbeat or probe seen on the bus.
#[derive(Debug, Clone)]
pub struct Beat {
    /// When the subscriber got it.
    pub at: Instant,
    /// Cluster.
    pub cluster: String,
    /// Heartbeat (true) or probe result.
    pub heartbeat: bool,
    /// Its cluster_time.
    pub cluster_time: DateTime<Utc>,
}

/// An incident message seen on the bus.
#[derive(Debug, Clone)]
pub struct SeenIncident {
    /// When the subscriber got it.
    pub at: Instant,
    /// Wall clock then.
    pub wall: DateTime<Utc>,
    /// The incident.
    pub incident: Incident,
}

/// Everything the subscribers saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Heartbeats and probes.
    pub beats: Vec<Beat>,
    /// The latest heartbeat per cluster.
    pub last_heartbeat: BTreeMap<String, Heartbeat>,
    /// When it arrived.
    pub heartbeat_at: BTreeMap<String, Instant>,
    /// Incident changes.
    pub incidents: Vec<SeenIncident>,
    /// Fleet incident changes, as the subscriber got them.
    pub fleet: Vec<(Instant, FleetIncident)>,
    /// Notification ids as received (a re-sent notification shows twice).
    pub notifications: Vec<(Instant, String)>,
    /// TSDB lag samples: seconds from a sample's timestamp to the moment a query first returned it.
    pub sample_lags: Vec<f64>,
    /// Event → digest lags, seconds from the newest event's time (cluster clock) to the moment a subscriber
    /// got the digest: (when seen, lag, whether that time was to the microsecond). core/v1 Events carry
    /// whole seconds unless they repeat (`series.lastObservedTime`), so a coarse lag is up to 1 s high.
    pub digest_lags: Vec<(Instant, f64, bool)>,
    /// Event → stored lags: seconds from an event's time (cluster clock) to JetStream storing it, read once
    /// a second from the newest message of FLEET_EVENTS (when seen, lag): the part of event → digest spent
    /// before the hub (the simulator serving it, the agent publishing it, NATS storing it).
    pub ingest_lags: Vec<(Instant, f64)>,
    /// The same messages' event → agent lags: seconds from the event's time to its agent reading it from the
    /// watch (`agent_time`), the part of `ingest_lags` before the agent's outbox and drain.
    pub agent_lags: Vec<(Instant, f64)>,
}

/// The observer of one run.
#[derive(Debug)]
pub struct Observer {
    /// What was seen.
    pub seen: Arc<Mutex<Seen>>,
    cancel: Token,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Observer {
    /// Subscribes and starts sampling every `every`.
    pub async fn start(
        sys: &System,
        rec: &Recorder,
        every: Duration,
        watch_samples: bool,
    ) -> anyhow::Result<Observer> {
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let cancel = Token::default();
        let mut tasks = Vec::new();
        for subject in ["fleet.hb.>", "fleet.probe.>"] {
            let mut sub = sys.client.subscribe(subject).await?;
            let seen = seen.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(m) = sub.next().await {
                    let at = Instant::now();
                    if m.subject.starts_with("fleet.hb.") {
                        if let Ok(env) = rmp_serde::from_slice::<Envelope<Heartbeat>>(&m.payload) {
                            let mut g = seen.lock().unwrap_or_else(|e| e.into_inner());
                            g.beats.push(Beat {
                                at,
                                cluster: env.cluster.clone(),
                                heartbeat: true,
                                cluster_time: env.cluster_time,
                            });
                            g.heartbeat_at.insert(env.cluster.clone(), at);
                            g.last_heartbeat.insert(env.cluster, env.payload);
                        }
                    } else if let Ok(env) =
                        rmp_serde::from_slice::<Envelope<serde::de::IgnoredAny>>(&m.payload)
                    {
                        seen.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .beats
                            .push(Beat {
                                at,
                                cluster: env.cluster,
                                heartbeat: false,
                                cluster_time: env.cluster_time,
                            });
                    }
                }
            }));
        }
        {
            let mut sub = sys.client.subscribe("fleet.incident.>").await?;
            let seen = seen.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(m) = sub.next().await {
                    if let Ok(env) = rmp_serde::from_slice::<Envelope<Incident>>(&m.payload) {
                        seen.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .incidents
                            .push(SeenIncident {
                                at: Instant::now(),
                                wall: Utc::now(),
                                incident: env.payload,
                            });
                    }
                }
            }));
        }
        {
            let mut sub = sys.client.subscribe("fleet.fleet-incident.>").await?;
            let seen = seen.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(m) = sub.next().await {
                    if let Ok(env) = rmp_serde::from_slice::<Envelope<FleetIncident>>(&m.payload) {
                        seen.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .fleet
                            .push((Instant::now(), env.payload));
                    }
                }
            }));
        }
        {
            let mut sub = sys.client.subscribe("fleet.digest.>").await?;
            let seen = seen.clone();
            let rec = rec.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(m) = sub.next().await {
                    if let Ok(env) = rmp_serde::from_slice::<Envelope<EventDigest>>(&m.payload) {
                        let last = env.payload.last_seen;
                        let lag = (Utc::now() - last).num_microseconds().unwrap_or(0) as f64 / 1e6;
                        rec.point("lag/event-digest", "s", lag);
                        seen.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .digest_lags
                            .push((Instant::now(), lag, last.timestamp_subsec_nanos() != 0));
                    }
                }
            }));
        }
        {
            let mut sub = sys.client.subscribe("fleet.alert.>").await?;
            let seen = seen.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(m) = sub.next().await {
                    if let Ok(env) = rmp_serde::from_slice::<Envelope<Notification>>(&m.payload) {
                        seen.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .notifications
                            .push((Instant::now(), env.payload.id));
                    }
                }
            }));
        }
        tasks.push(tokio::spawn(sample_loop(
            sys.watched.clone(),
            sys.monitors.clone(),
            rec.clone(),
            seen.clone(),
            every,
            cancel.clone(),
        )));
        if watch_samples {
            tasks.push(tokio::spawn(ingest_lag_loop(
                async_nats::jetstream::new(sys.client.clone()),
                rec.clone(),
                seen.clone(),
                cancel.clone(),
            )));
        }
        if watch_samples && let Some(tsdb) = sys.tsdb_api() {
            tasks.push(tokio::spawn(sample_lag_loop(
                tsdb,
                rec.clone(),
                seen.clone(),
                cancel.clone(),
            )));
        }
        Ok(Observer {
            seen,
            cancel,
            tasks,
        })
    }

    /// Runs `f` on what was seen.
    pub fn with<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Stops every task.
    pub async fn stop(self) {
        self.cancel.cancel();
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
    }
}

/// Parses Prometheus text for `multipilot_bus_consumed_total{consumer="…",outcome="done"}` counters
/// (counted when a batch commits).
pub fn consumed_done(text: &str) -> BTreeMap<String, f64> {
    per_consumer(
        text,
        "multipilot_bus_consumed_total{",
        Some("outcome=\"done\""),
    )
}

/// Parses Prometheus text for `multipilot_bus_admitted_total{consumer="…"}` counters (counted as the input
/// limiter lets each message in).
pub fn admitted(text: &str) -> BTreeMap<String, f64> {
    per_consumer(text, "multipilot_bus_admitted_total{", None)
}

fn per_consumer(text: &str, prefix: &str, must: Option<&str>) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(prefix) else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        if must.is_some_and(|m| !labels.contains(m)) {
            continue;
        }
        let consumer = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("consumer=\""))
            .map(|v| v.trim_end_matches('"').to_string());
        if let (Some(c), Ok(v)) = (consumer, value.trim().parse::<f64>()) {
            *out.entry(c).or_default() += v;
        }
    }
    out
}

async fn sample_loop(
    watched: Watched,
    monitors: Vec<String>,
    rec: Recorder,
    seen: Arc<Mutex<Seen>>,
    every: Duration,
    cancel: Token,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_default();
    let mut last_cpu: BTreeMap<String, (u32, f64, Instant)> = BTreeMap::new();
    let mut outbox_t = 0.0;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !cancel.is_cancelled() {
        tick.tick().await;
        let procs: Vec<(String, crate::system::Watch)> = watched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let now = Instant::now();
        for (name, w) in &procs {
            let Some(pid) = w.pid else { continue };
            // a process that has exited (a zombie until reaped) has no RSS: not a sample
            let Some((cpu_s, rss)) = crate::proc::usage(pid).filter(|(_, rss)| *rss > 0) else {
                continue;
            };
            rec.point(&format!("rss/{name}"), "MiB", rss as f64 / 1048576.0);
            if let Some(pss) = crate::proc::pss(pid) {
                rec.point(&format!("pss/{name}"), "MiB", pss as f64 / 1048576.0);
            }
            if let Some((lpid, lcpu, lat)) = last_cpu.get(name)
                && *lpid == pid
            {
                let dt = now.duration_since(*lat).as_secs_f64();
                if dt > 0.0 {
                    rec.point(&format!("cpu/{name}"), "%", (cpu_s - lcpu) / dt * 100.0);
                }
            }
            last_cpu.insert(name.clone(), (pid, cpu_s, now));
            if let Some(url) = &w.metrics
                && let Ok(r) = http.get(url).send().await
                && let Ok(text) = r.text().await
            {
                for (consumer, v) in consumed_done(&text) {
                    rec.point(&format!("consumed/{name}/{consumer}"), "msgs", v);
                }
                for (consumer, v) in admitted(&text) {
                    rec.point(&format!("admitted/{name}/{consumer}"), "msgs", v);
                }
            }
        }
        // JetStream: stream input (last_seq as a counter), consumer backlogs
        for m in &monitors {
            let url = format!("{m}{}", crate::system::JSZ);
            let Ok(r) = http.get(&url).send().await else {
                continue;
            };
            let Ok(v) = r.json::<serde_json::Value>().await else {
                continue;
            };
            for acc in v["account_details"].as_array().into_iter().flatten() {
                for s in acc["stream_detail"].as_array().into_iter().flatten() {
                    let name = s["name"].as_str().unwrap_or_default();
                    if let Some(seq) = s["state"]["last_seq"].as_f64() {
                        rec.point(&format!("stored/{name}"), "msgs", seq);
                    }
                    for c in s["consumer_detail"].as_array().into_iter().flatten() {
                        // durable consumers only: ephemeral ones (KV watchers, ordered readers) come and go
                        if !crate::system::is_durable(c) {
                            continue;
                        }
                        let cname = c["name"].as_str().unwrap_or_default();
                        let pending = c["num_pending"].as_f64().unwrap_or(0.0)
                            + c["num_ack_pending"].as_f64().unwrap_or(0.0);
                        rec.point(&format!("backlog/{cname}"), "msgs", pending);
                    }
                }
            }
            break;
        }
        // the outboxes' depth as the heartbeats tell it, timed by the oldest of them: while NATS is away
        // (or an agent's drain stalls) no heartbeat comes and the figure is not repeated as if current
        let (depth, oldest) = {
            let g = seen.lock().unwrap_or_else(|e| e.into_inner());
            // an agent silent for 30 s is gone (stopped, killed, or cut off by a long outage), not late:
            // neither its depth nor its time counts
            let live: Vec<(&String, &Instant)> = g
                .heartbeat_at
                .iter()
                .filter(|(_, at)| at.elapsed() < Duration::from_secs(30))
                .collect();
            let depth: u64 = live
                .iter()
                .filter_map(|(c, _)| g.last_heartbeat.get(*c))
                .map(|h| h.outbox_depth)
                .sum();
            (depth, live.iter().map(|(_, at)| **at).min())
        };
        if let Some(oldest) = oldest {
            let t = oldest.saturating_duration_since(rec.start()).as_secs_f64();
            if t > outbox_t {
                outbox_t = t;
                rec.point_at("backlog/agent-outboxes", "msgs", t, depth as f64);
            }
        }
    }
}

/// Once a second: the newest event JetStream stored, and how long after its time it was stored.
async fn ingest_lag_loop(
    js: async_nats::jetstream::Context,
    rec: Recorder,
    seen: Arc<Mutex<Seen>>,
    cancel: Token,
) {
    let mut last_seq = 0;
    while !cancel.is_cancelled() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(stream) = js.get_stream("FLEET_EVENTS").await else {
            continue;
        };
        let seq = stream.cached_info().state.last_sequence;
        if seq == last_seq {
            continue;
        }
        last_seq = seq;
        let Ok(m) = stream.get_raw_message(seq).await else {
            continue;
        };
        let Ok(env) = rmp_serde::from_slice::<Envelope<serde::de::IgnoredAny>>(&m.payload) else {
            continue;
        };
        let lag = (m.time - env.cluster_time).num_microseconds().unwrap_or(0) as f64 / 1e6;
        let read = (env.agent_time - env.cluster_time)
            .num_microseconds()
            .unwrap_or(0) as f64
            / 1e6;
        rec.point("lag/event-stored", "s", lag);
        rec.point("lag/event-agent", "s", read);
        let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
        s.ingest_lags.push((Instant::now(), lag));
        s.agent_lags.push((Instant::now(), read));
    }
}

/// Polls the TSDB for one series per cluster (`apiserver_storage_objects{resource="pods"}`, scraped from each
/// API server) and records, for every new sample, how long after its timestamp it became queryable.
async fn sample_lag_loop(tsdb: String, rec: Recorder, seen: Arc<Mutex<Seen>>, cancel: Token) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default();
    let mut newest: BTreeMap<String, i64> = BTreeMap::new();
    while !cancel.is_cancelled() {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let url = format!("{tsdb}/api/v1/query");
        let Ok(r) = http
            .get(&url)
            .query(&[("query", "apiserver_storage_objects{resource=\"pods\"}[2m]")])
            .send()
            .await
        else {
            continue;
        };
        let Ok(v) = r.json::<serde_json::Value>().await else {
            continue;
        };
        let now_ms = Utc::now().timestamp_millis();
        for s in v["data"]["result"].as_array().into_iter().flatten() {
            let cluster = s["metric"]["cluster"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let Some(last) = s["values"]
                .as_array()
                .and_then(|a| a.last())
                .and_then(|p| p[0].as_f64())
            else {
                continue;
            };
            let ts = (last * 1000.0).round() as i64;
            let prev = newest.insert(cluster, ts);
            // the first sight of a series is not a lag (it may have been there long before we looked)
            if let Some(prev) = prev
                && ts > prev
            {
                let lag = (now_ms - ts) as f64 / 1000.0;
                rec.point("lag/sample-queryable", "s", lag);
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .sample_lags
                    .push(lag);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumed_counters_are_read_from_prometheus_text() {
        let text = "# TYPE multipilot_bus_consumed counter\n\
            multipilot_bus_consumed_total{consumer=\"tsdb\",outcome=\"done\"} 120\n\
            multipilot_bus_consumed_total{consumer=\"tsdb\",outcome=\"retry\"} 3\n\
            multipilot_bus_consumed_total{consumer=\"correlator-events\",outcome=\"done\"} 7\n";
        let m = consumed_done(text);
        assert_eq!(m.get("tsdb"), Some(&120.0));
        assert_eq!(m.get("correlator-events"), Some(&7.0));
        assert_eq!(m.len(), 2);
        let a = admitted("multipilot_bus_admitted_total{consumer=\"tsdb\"} 9\n");
        assert_eq!(a.get("tsdb"), Some(&9.0));
    }
}
