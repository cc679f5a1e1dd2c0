//! Health probes, each on its own interval, each publishing a ProbeResult on
//! `fleet.probe.<cluster>.<probe>`: apiserver, etcd, scheduler, controller-manager, nodes, cni, coredns,
//! gpu-device-plugin, certificates, finalizers, external-ips, deprecated-apis.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Endpoints;
use kube::api::Api;
use multipilot_schemas::payload::{Finding, ObjectRef, ProbeResult, ProbeStatus, Severity};
use multipilot_schemas::{stable_id, subject};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::cluster::{CNI_DAEMONSETS, ClusterCtx};
use crate::outbox::Class;
use crate::sink::Meta;

/// A device-plugin release and the oldest driver it works with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuCompat {
    /// Plugin versions from this one on (semver, `v` optional)…
    pub plugin_from: String,
    /// …need at least this driver major version.
    pub min_driver_major: u32,
}

/// Probe settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Default seconds between rounds of each probe.
    pub interval_s: u32,
    /// Per-probe interval overrides (probe name → seconds).
    pub intervals: BTreeMap<String, u32>,
    /// Seconds between rounds while a probe finds trouble (unhealthy or degraded), so the correlator's
    /// "N rounds in a row" confirms it in seconds rather than minutes; back to the interval once healthy
    /// (resolution keeps its slower hysteresis).
    pub confirm_interval_s: u32,
    /// A probe whose input the watches changed (a node's Ready condition, a CNI or device-plugin
    /// DaemonSet, a GPU pod, a terminating object, a Service's externalIPs, a last-applied API version)
    /// runs this many milliseconds after the change, instead of at its next round.
    pub on_change_delay_ms: u64,
    /// API server answers slower than this are `degraded`.
    pub apiserver_slow_ms: u64,
    /// Certificate expiring within this many days: degraded.
    pub cert_warn_days: i64,
    /// Certificate expiring within this many days: unhealthy.
    pub cert_critical_days: i64,
    /// Objects terminating longer than this with finalizers left are stuck.
    pub terminating_after_s: i64,
    /// Device-plugin / driver compatibility, newest rule first.
    pub gpu_compat: Vec<GpuCompat>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            interval_s: 15,
            // the API server is the probe whose trouble everything else follows (and the one an overload
            // shows on first): checked more often, it is cheap (one request)
            intervals: BTreeMap::from([("apiserver".to_string(), 5), ("etcd".to_string(), 10)]),
            confirm_interval_s: 3,
            on_change_delay_ms: 500,
            apiserver_slow_ms: 1000,
            cert_warn_days: 30,
            cert_critical_days: 7,
            terminating_after_s: 300,
            gpu_compat: vec![
                GpuCompat {
                    plugin_from: "v0.17.0".into(),
                    min_driver_major: 550,
                },
                GpuCompat {
                    plugin_from: "v0.15.0".into(),
                    min_driver_major: 525,
                },
                GpuCompat {
                    plugin_from: "v0.13.0".into(),
                    min_driver_major: 470,
                },
            ],
        }
    }
}

/// The probes, by name.
pub use multipilot_schemas::probes::PROBES;

/// What a probe concluded.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Status.
    pub status: ProbeStatus,
    /// One line for a person.
    pub detail: String,
    /// Measurements.
    pub observations: BTreeMap<String, f64>,
    /// Findings.
    pub findings: Vec<Finding>,
    /// When the outcome is due to change by itself (a lease expiring, an object crossing the stuck
    /// threshold): the next round is run then, if that is sooner than the interval.
    pub recheck_in: Option<Duration>,
}

impl Outcome {
    fn new(status: ProbeStatus, detail: impl Into<String>) -> Self {
        Outcome {
            status,
            detail: detail.into(),
            observations: BTreeMap::new(),
            findings: Vec::new(),
            recheck_in: None,
        }
    }

    fn obs(mut self, k: &str, v: f64) -> Self {
        self.observations.insert(k.into(), v);
        self
    }
}

/// Runs every probe until cancelled: each on its interval, at once (after `on_change_delay_ms`) when the
/// watches change what it reads, every `confirm_interval_s` while it finds trouble, and when its outcome
/// is due to change by itself ([`Outcome::recheck_in`]).
pub async fn run(ctx: Arc<ClusterCtx>, config: Config, cancel: CancellationToken) {
    let config = Arc::new(config);
    let mut set = tokio::task::JoinSet::new();
    for name in PROBES {
        let (ctx, config, cancel) = (ctx.clone(), config.clone(), cancel.clone());
        set.spawn(async move { run_one(&ctx, &config, name, &cancel).await });
    }
    while set.join_next().await.is_some() {}
}

/// When a probe runs next.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Schedule {
    interval: Duration,
    confirm: Duration,
}

impl Schedule {
    /// The wait after a round that ended with `status` and `recheck_in`.
    fn next_wait(self, status: ProbeStatus, recheck_in: Option<Duration>) -> Duration {
        let base = if matches!(status, ProbeStatus::Unhealthy | ProbeStatus::Degraded) {
            self.confirm.min(self.interval)
        } else {
            self.interval
        };
        recheck_in.map_or(base, |r| r.clamp(Duration::from_millis(500), base))
    }
}

async fn run_one(
    ctx: &ClusterCtx,
    config: &Config,
    name: &'static str,
    cancel: &CancellationToken,
) {
    let secs = config
        .intervals
        .get(name)
        .copied()
        .unwrap_or(config.interval_s)
        .max(1);
    let schedule = Schedule {
        interval: Duration::from_secs(secs.into()),
        confirm: Duration::from_secs(config.confirm_interval_s.max(1).into()),
    };
    let delay = Duration::from_millis(config.on_change_delay_ms);
    let mut changes = ctx.view.subscribe();
    let mut seen = changes.borrow_and_update().get(name).copied().unwrap_or(0);
    let mut round = 0u64;
    // let the watchers fill the view before the first round
    let mut next = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut watching = true;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep_until(next) => {}
            r = changes.changed(), if watching => {
                if r.is_err() {
                    // the view is gone with the agent: rounds go on until cancelled
                    watching = false;
                    continue;
                }
                let now_seen = changes.borrow_and_update().get(name).copied().unwrap_or(0);
                if now_seen == seen {
                    continue;
                }
                seen = now_seen;
                // a change arrives with its neighbours (a node's pods, a rollout's steps): read them together
                let at = tokio::time::Instant::now() + delay;
                if at >= next {
                    continue;
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep_until(at) => {}
                }
                seen = changes.borrow_and_update().get(name).copied().unwrap_or(seen);
            }
        }
        round += 1;
        let started = Instant::now();
        let outcome = tokio::time::timeout(Duration::from_secs(20), probe(ctx, config, name))
            .await
            .unwrap_or_else(|_| Outcome::new(ProbeStatus::Unknown, "probe timed out after 20s"));
        let wait = schedule.next_wait(outcome.status, outcome.recheck_in);
        publish(ctx, name, round, started.elapsed(), outcome);
        next = tokio::time::Instant::now() + wait;
    }
}

fn publish(ctx: &ClusterCtx, name: &str, round: u64, took: Duration, o: Outcome) {
    let result = ProbeResult {
        probe: name.to_string(),
        status: o.status,
        latency_ms: took.as_secs_f64() * 1000.0,
        detail: o.detail,
        round,
        observations: o.observations,
        findings: o.findings,
    };
    let now = Utc::now();
    if let Err(e) = ctx.sink.emit(
        Meta {
            class: Class::Probe,
            subject: subject::probe(ctx.name(), name),
            msg_id: stable_id(&[
                ctx.name(),
                "probe",
                name,
                &ctx.started_at.to_rfc3339(),
                &round.to_string(),
            ]),
            collapse: None,
            cluster_time: now,
        },
        result,
    ) {
        tracing::error!(cluster = ctx.name(), probe = name, error = %e, "probe result lost: the outbox refused it");
    }
}

async fn probe(ctx: &ClusterCtx, cfg: &Config, name: &str) -> Outcome {
    match name {
        "apiserver" => apiserver(ctx, cfg).await,
        "etcd" => etcd(ctx).await,
        "scheduler" => lease(ctx, "kube-scheduler").await,
        "controller-manager" => lease(ctx, "kube-controller-manager").await,
        "nodes" => nodes(ctx),
        "cni" => cni(ctx),
        "coredns" => coredns(ctx).await,
        "gpu-device-plugin" => gpu(ctx, cfg),
        "certificates" => certificates(ctx, cfg).await,
        "finalizers" => finalizers(ctx, cfg).await,
        "external-ips" => external_ips(ctx),
        "deprecated-apis" => deprecated(ctx).await,
        other => Outcome::new(ProbeStatus::Unknown, format!("unknown probe {other}")),
    }
}

async fn get_raw(
    ctx: &ClusterCtx,
    path: &str,
) -> Result<(u16, String, Option<DateTime<Utc>>), kube::Error> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let resp = ctx.client.send(req.map(kube::client::Body::from)).await?;
    let status = resp.status().as_u16();
    let date = resp
        .headers()
        .get(http::header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(|d| DateTime::parse_from_rfc2822(d).ok())
        .map(|t| t.with_timezone(&Utc));
    let body = resp.into_body().collect_bytes().await?;
    Ok((status, String::from_utf8_lossy(&body).into_owned(), date))
}

async fn apiserver(ctx: &ClusterCtx, cfg: &Config) -> Outcome {
    let mut ok = 0;
    let mut slowest = 0f64;
    let mut failures = Vec::new();
    let mut skew = None;
    // at once: under overload three sequential answers would take three times as long to judge
    let answers =
        futures::future::join_all(["/readyz", "/livez", "/version"].map(|path| async move {
            let t = Instant::now();
            (path, get_raw(ctx, path).await, t.elapsed())
        }))
        .await;
    for (path, answer, took) in answers {
        match answer {
            Ok((200, _, date)) => {
                ok += 1;
                if let Some(d) = date {
                    skew = Some((d - Utc::now()).num_milliseconds() as f64 / 1000.0);
                }
            }
            Ok((code, body, _)) => {
                let checks: Vec<&str> = body
                    .lines()
                    .filter(|l| l.starts_with("[-]"))
                    .map(str::trim)
                    .collect();
                failures.push(if checks.is_empty() {
                    format!("{path}: HTTP {code}")
                } else {
                    format!("{path}: HTTP {code} {}", checks.join(" "))
                })
            }
            Err(e) => failures.push(format!("{path}: {e}")),
        }
        slowest = slowest.max(took.as_secs_f64() * 1000.0);
    }
    ctx.reachable
        .store(ok > 0, std::sync::atomic::Ordering::Relaxed);
    // /readyz or /livez failing only on checks another probe owns (etcd: both include it) says nothing
    // about the API server's own load: that probe reports it, and an overload incident would repeat it
    failures.retain(|f| !health_failure_owned_elsewhere(f));
    let error_ratio = failures.len() as f64 / 3.0;
    let status = if ok == 0 {
        ProbeStatus::Unhealthy
    } else if !failures.is_empty() || slowest > cfg.apiserver_slow_ms as f64 {
        ProbeStatus::Degraded
    } else {
        ProbeStatus::Healthy
    };
    let detail = if failures.is_empty() {
        format!("ready and live; slowest answer {slowest:.0} ms")
    } else {
        failures.join("; ")
    };
    let mut o = Outcome::new(status, detail)
        .obs("max_latency_ms", slowest)
        .obs("error_ratio", error_ratio);
    if let Some(s) = skew {
        // the Date header has second resolution: half a second either way is noise
        let ms = if s.abs() < 1.5 {
            0
        } else {
            (s * 1000.0) as i64
        };
        ctx.clock_offset_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
        o = o.obs("clock_skew_s", s);
    }
    o
}

/// Whether a `/readyz` or `/livez` failure (`/readyz: HTTP 500 [-]etcd failed: …`) names only checks
/// another probe owns.
fn health_failure_owned_elsewhere(failure: &str) -> bool {
    if !(failure.starts_with("/readyz: HTTP 500") || failure.starts_with("/livez: HTTP 500")) {
        return false;
    }
    let named: Vec<&str> = failure
        .split("[-]")
        .skip(1)
        .filter_map(|c| c.split_whitespace().next())
        .collect();
    !named.is_empty() && named.iter().all(|c| c.starts_with("etcd"))
}

async fn etcd(ctx: &ClusterCtx) -> Outcome {
    match get_raw(ctx, "/readyz/etcd").await {
        Ok((200, _, _)) => Outcome::new(ProbeStatus::Healthy, "etcd check passed"),
        Ok((404, _, _)) => Outcome::new(
            ProbeStatus::Unknown,
            "this API server has no etcd readiness check",
        ),
        Ok((code, body, _)) => Outcome::new(
            ProbeStatus::Unhealthy,
            format!("/readyz/etcd: HTTP {code}: {}", one_line(&body)),
        ),
        Err(e) => Outcome::new(ProbeStatus::Unknown, format!("API server unreachable: {e}")),
    }
}

/// A health endpoint's answer as one line (`[-]etcd failed: reason withheld; readyz check failed`), cut
/// after 300 bytes with an ellipsis: a probe's detail goes into one-line incident summaries.
fn one_line(body: &str) -> String {
    let mut line = body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    if line.len() > 300 {
        let mut end = 300;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
        line.push('…');
    }
    line
}

/// The cluster's clock, from the API server's Date header.
async fn cluster_now(ctx: &ClusterCtx) -> DateTime<Utc> {
    match get_raw(ctx, "/version").await {
        Ok((_, _, Some(d))) => d,
        _ => Utc::now(),
    }
}

async fn lease(ctx: &ClusterCtx, holder: &str) -> Outcome {
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), "kube-system");
    let lease = match api.get_opt(holder).await {
        Ok(Some(l)) => l,
        Ok(None) => {
            return Outcome::new(
                ProbeStatus::Unknown,
                format!("no {holder} lease (a managed control plane hides it)"),
            );
        }
        Err(e) => {
            return Outcome::new(
                ProbeStatus::Unknown,
                format!("cannot read the {holder} lease: {e}"),
            );
        }
    };
    let now = cluster_now(ctx).await;
    let spec = lease.spec.unwrap_or_default();
    let duration = f64::from(spec.lease_duration_seconds.unwrap_or(15));
    let Some(renewed) = spec.renew_time.map(|t| t.0) else {
        return Outcome::new(
            ProbeStatus::Unhealthy,
            format!("{holder} lease was never renewed"),
        );
    };
    let renewed: DateTime<Utc> = DateTime::from_timestamp(
        renewed.as_second(),
        renewed.subsec_nanosecond().max(0) as u32,
    )
    .unwrap_or(now);
    let age = (now - renewed).num_milliseconds() as f64 / 1000.0;
    let holder_id = spec.holder_identity.unwrap_or_default();
    // a lease not renewed within its duration has expired: any candidate may take it, and none has
    let status = if age > duration {
        ProbeStatus::Unhealthy
    } else {
        ProbeStatus::Healthy
    };
    let mut o = Outcome::new(
        status,
        format!("leader {holder_id} renewed {age:.0}s ago (lease {duration:.0}s)"),
    )
    .obs("lease_age_s", age)
    .obs("lease_duration_s", duration);
    // looked at again just after it would expire, unless renewed by then
    o.recheck_in = (status == ProbeStatus::Healthy)
        .then(|| Duration::from_secs_f64((duration - age).max(0.0) + 1.0));
    if status != ProbeStatus::Healthy {
        o.findings.push(Finding {
            severity: Severity::Critical,
            object: Some(ObjectRef {
                api_version: "coordination.k8s.io/v1".into(),
                kind: "Lease".into(),
                namespace: Some("kube-system".into()),
                name: holder.into(),
                uid: None,
            }),
            message: format!("{holder} has not renewed its lease for {age:.0}s: no active leader"),
        });
    }
    o
}

fn nodes(ctx: &ClusterCtx) -> Outcome {
    let view = ctx.view.read();
    let total = view.nodes.len();
    if total == 0 {
        return Outcome::new(ProbeStatus::Unknown, "no nodes seen yet");
    }
    let mut o = Outcome::new(ProbeStatus::Healthy, "");
    for (name, n) in &view.nodes {
        if n.ready != Some(true) {
            o.findings.push(Finding {
                severity: Severity::Critical,
                object: Some(ObjectRef {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    namespace: None,
                    name: name.clone(),
                    uid: None,
                }),
                message: format!(
                    "node {name} is not Ready: {}",
                    if n.reason.is_empty() {
                        "no Ready condition"
                    } else {
                        &n.reason
                    }
                ),
            });
        }
    }
    let bad = o.findings.len();
    o.status = if bad == 0 {
        ProbeStatus::Healthy
    } else {
        ProbeStatus::Unhealthy
    };
    let not_ready: Vec<&str> = o
        .findings
        .iter()
        .filter_map(|f| f.object.as_ref().map(|r| r.name.as_str()))
        .collect();
    o.detail = nodes_detail(total, &not_ready);
    o.obs("nodes", total as f64).obs("not_ready", bad as f64)
}

/// `6/8 nodes Ready; also not Ready: b, c`: an incident's summary names the first node not Ready (its
/// first finding), the detail the others (five, then how many more).
fn nodes_detail(total: usize, not_ready: &[&str]) -> String {
    let mut detail = format!("{}/{total} nodes Ready", total - not_ready.len());
    if let [_, others @ ..] = not_ready
        && !others.is_empty()
    {
        let shown = others.len().min(5);
        detail += &format!("; also not Ready: {}", others[..shown].join(", "));
        if others.len() > shown {
            detail += &format!(" and {} more", others.len() - shown);
        }
    }
    detail
}

fn daemonset_outcome(ds: &crate::view::WorkloadView, what: &str) -> Outcome {
    let status = if ds.desired > 0 && ds.ready >= ds.desired {
        ProbeStatus::Healthy
    } else {
        ProbeStatus::Unhealthy
    };
    let mut o = Outcome::new(
        status,
        format!(
            "{what} {}/{}: {}/{} ready",
            ds.object.namespace.clone().unwrap_or_default(),
            ds.object.name,
            ds.ready,
            ds.desired
        ),
    )
    .obs("ready", ds.ready as f64)
    .obs("desired", ds.desired as f64);
    if status != ProbeStatus::Healthy {
        o.findings.push(Finding {
            severity: Severity::Critical,
            object: Some(ds.object.clone()),
            message: format!(
                "{what} is not ready on {} of {} nodes",
                ds.desired - ds.ready,
                ds.desired
            ),
        });
    }
    o
}

fn cni(ctx: &ClusterCtx) -> Outcome {
    let view = ctx.view.read();
    let found = CNI_DAEMONSETS.iter().find_map(|(name, label)| {
        view.workloads
            .values()
            .find(|w| w.object.kind == "DaemonSet" && w.object.name == *name)
            .map(|w| (w.clone(), *label))
    });
    match found {
        Some((ds, label)) => daemonset_outcome(&ds, &format!("CNI ({label})")),
        None => Outcome::new(ProbeStatus::Unknown, "no known CNI daemonset found"),
    }
}

async fn coredns(ctx: &ClusterCtx) -> Outcome {
    let dep = {
        let view = ctx.view.read();
        view.workloads
            .values()
            .find(|w| {
                w.object.kind == "Deployment"
                    && (w.object.name == "coredns"
                        || w.labels.get("k8s-app").is_some_and(|v| v == "kube-dns"))
            })
            .cloned()
    };
    let api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), "kube-system");
    let ready_addresses = match api.get_opt("kube-dns").await {
        Ok(Some(ep)) => Some(
            ep.subsets
                .unwrap_or_default()
                .iter()
                .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
                .sum::<usize>(),
        ),
        Ok(None) => None,
        Err(e) => {
            return Outcome::new(
                ProbeStatus::Unknown,
                format!("cannot read kube-dns endpoints: {e}"),
            );
        }
    };
    let Some(dep) = dep else {
        return Outcome::new(ProbeStatus::Unknown, "no CoreDNS deployment found");
    };
    let endpoints = ready_addresses.unwrap_or(0);
    let status = if dep.ready == 0 || endpoints == 0 {
        ProbeStatus::Unhealthy
    } else if dep.ready < dep.desired {
        ProbeStatus::Degraded
    } else {
        ProbeStatus::Healthy
    };
    let mut o = Outcome::new(
        status,
        format!(
            "{}/{} CoreDNS pods ready, {endpoints} ready endpoints",
            dep.ready, dep.desired
        ),
    )
    .obs("ready", dep.ready as f64)
    .obs("endpoints", endpoints as f64);
    if status == ProbeStatus::Unhealthy {
        o.findings.push(Finding {
            severity: Severity::Critical,
            object: Some(dep.object.clone()),
            message: "cluster DNS is down: no ready CoreDNS endpoints".into(),
        });
    }
    o
}

fn parse_semver(v: &str) -> Option<(u64, u64, u64)> {
    let v = v.trim_start_matches('v');
    let mut it = v.split(['.', '-']).map(|p| p.parse::<u64>().ok());
    Some((
        it.next()??,
        it.next().flatten().unwrap_or(0),
        it.next().flatten().unwrap_or(0),
    ))
}

/// The minimum driver major a plugin version needs, by the compatibility table.
pub fn min_driver(compat: &[GpuCompat], plugin_version: &str) -> Option<u32> {
    let pv = parse_semver(plugin_version)?;
    compat
        .iter()
        .filter_map(|c| parse_semver(&c.plugin_from).map(|from| (from, c.min_driver_major)))
        .filter(|(from, _)| pv >= *from)
        .max_by_key(|(from, _)| *from)
        .map(|(_, d)| d)
}

fn gpu(ctx: &ClusterCtx, cfg: &Config) -> Outcome {
    let view = ctx.view.read();
    let gpu_nodes: Vec<(&String, &crate::view::NodeView)> = view
        .nodes
        .iter()
        .filter(|(_, n)| n.gpu_capacity > 0 || n.gpu_model.is_some())
        .collect();
    if gpu_nodes.is_empty() {
        return Outcome::new(ProbeStatus::Healthy, "no GPU nodes");
    }
    let plugin = view
        .workloads
        .values()
        .find(|w| {
            w.object.kind == "DaemonSet"
                && (w.object.name.contains("nvidia-device-plugin")
                    || w.images.iter().any(|i| i.contains("k8s-device-plugin")))
        })
        .cloned();
    let Some(plugin) = plugin else {
        return Outcome::new(
            ProbeStatus::Unhealthy,
            format!(
                "{} GPU nodes but no NVIDIA device plugin daemonset",
                gpu_nodes.len()
            ),
        );
    };
    let version = plugin
        .images
        .first()
        .and_then(|i| i.rsplit_once(':').map(|(_, t)| t.to_string()))
        .unwrap_or_default();
    let mut o = daemonset_outcome(&plugin, &format!("GPU device plugin {version}"));
    o.detail = format!("{}; {} GPU nodes", o.detail, gpu_nodes.len());
    if let Some(need) = min_driver(&cfg.gpu_compat, &version) {
        let mut mismatched = 0;
        for (name, n) in &gpu_nodes {
            let major = n
                .gpu_driver
                .as_deref()
                .and_then(|d| d.split('.').next())
                .and_then(|m| m.parse::<u32>().ok());
            if let Some(major) = major
                && major < need
            {
                o.status = ProbeStatus::Unhealthy;
                mismatched += 1;
                // the driver mismatch is the finding a person acts on: first
                o.findings.insert(
                    0,
                    Finding {
                        severity: Severity::Critical,
                        object: Some(ObjectRef {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            namespace: None,
                            name: (*name).clone(),
                            uid: None,
                        }),
                        message: format!(
                            "device plugin {version} needs driver >= {need}, node {name} runs {}",
                            n.gpu_driver.clone().unwrap_or_default()
                        ),
                    },
                );
            }
        }
        if mismatched > 0 {
            // …and the plugin's DaemonSet, whose version is what no longer fits (its change is the cause)
            o.findings.insert(
                1,
                Finding {
                    severity: Severity::Critical,
                    object: Some(plugin.object.clone()),
                    message: format!(
                        "device plugin {version} ({}) needs driver >= {need} on {mismatched} GPU nodes",
                        plugin.object.name
                    ),
                },
            );
        }
    }
    let stuck: Vec<_> = view
        .gpu_pods
        .values()
        .filter(|p| p.phase == "ContainerCreating" || p.phase == "Pending")
        .cloned()
        .collect();
    for p in &stuck {
        o.findings.push(Finding {
            severity: Severity::Warning,
            object: Some(p.object.clone()),
            message: format!(
                "GPU pod stuck in {} on {}",
                p.phase,
                if p.node.is_empty() {
                    "no node"
                } else {
                    &p.node
                }
            ),
        });
    }
    if !stuck.is_empty() && o.status == ProbeStatus::Healthy {
        o.status = ProbeStatus::Degraded;
    }
    o.obs("gpu_pods_stuck", stuck.len() as f64)
}

/// Why the API server's serving certificate could not be read (the certificates probe's message).
#[derive(Debug, thiserror::Error)]
enum CertError {
    /// The cluster URL names no host.
    #[error("cluster URL has no host")]
    NoHost,
    /// No TCP connection within 5 s.
    #[error("connect timed out")]
    ConnectTimeout,
    /// The TCP connection failed.
    #[error(transparent)]
    Connect(std::io::Error),
    /// rustls could not be set up.
    #[error(transparent)]
    Tls(#[from] rustls::Error),
    /// The host is neither a DNS name nor an IP address.
    #[error(transparent)]
    ServerName(#[from] rustls::pki_types::InvalidDnsNameError),
    /// The TLS handshake failed.
    #[error(transparent)]
    Handshake(std::io::Error),
    /// The server sent no certificate.
    #[error("no certificate presented")]
    NoCertificate,
    /// The certificate is not X.509 DER.
    #[error(transparent)]
    X509(#[from] x509_parser::nom::Err<x509_parser::error::X509Error>),
    /// Its notAfter is out of chrono's range.
    #[error("bad notAfter")]
    NotAfter,
}

/// Reads the API server's serving certificate (a TLS handshake; nothing is sent).
async fn peer_cert_expiry(ctx: &ClusterCtx) -> Result<DateTime<Utc>, CertError> {
    let url = &ctx.kube_config.cluster_url;
    let host = url
        .host()
        .ok_or(CertError::NoHost)?
        .trim_matches(['[', ']'])
        .to_string();
    let port = url.port_u16().unwrap_or(443);
    let tcp = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    .map_err(|_| CertError::ConnectTimeout)?
    .map_err(CertError::Connect)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ReadOnly(provider)))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.clone())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(CertError::Handshake)?;
    let cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or(CertError::NoCertificate)?
        .clone();
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())?;
    DateTime::from_timestamp(parsed.validity().not_after.timestamp(), 0).ok_or(CertError::NotAfter)
}

/// A verifier that accepts the certificate to read it: this connection only looks at the certificate
/// (the agent's real API connection verifies it against the cluster CA).
#[derive(Debug)]
struct ReadOnly(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for ReadOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

async fn certificates(ctx: &ClusterCtx, cfg: &Config) -> Outcome {
    if ctx.kube_config.cluster_url.scheme_str() != Some("https") {
        return Outcome::new(
            ProbeStatus::Unknown,
            "the API server is not served over TLS",
        );
    }
    match peer_cert_expiry(ctx).await {
        Ok(not_after) => {
            *ctx.cert_expiry.lock().unwrap_or_else(|e| e.into_inner()) = Some(not_after);
            let days = (not_after - Utc::now()).num_seconds() as f64 / 86_400.0;
            let status = if days < cfg.cert_critical_days as f64 {
                ProbeStatus::Unhealthy
            } else if days < cfg.cert_warn_days as f64 {
                ProbeStatus::Degraded
            } else {
                ProbeStatus::Healthy
            };
            let mut o = Outcome::new(
                status,
                format!(
                    "API server certificate expires {} ({days:.0} days)",
                    not_after.format("%Y-%m-%d")
                ),
            )
            .obs("days_left", days);
            if status != ProbeStatus::Healthy {
                o.findings.push(Finding {
                    severity: if status == ProbeStatus::Unhealthy {
                        Severity::Critical
                    } else {
                        Severity::Warning
                    },
                    object: None,
                    message: format!(
                        "the API server's serving certificate expires in {days:.0} days"
                    ),
                });
            }
            o
        }
        Err(e) => Outcome::new(
            ProbeStatus::Unknown,
            format!("could not read the serving certificate: {e}"),
        ),
    }
}

async fn finalizers(ctx: &ClusterCtx, cfg: &Config) -> Outcome {
    let now = cluster_now(ctx).await;
    let view = ctx.view.read();
    let mut o = Outcome::new(ProbeStatus::Healthy, "");
    for t in view.terminating.values() {
        let age = (now - t.since).num_seconds();
        if age <= cfg.terminating_after_s && !t.finalizers.is_empty() {
            // looked at again when it crosses the threshold
            let due = Duration::from_secs((cfg.terminating_after_s - age).max(0) as u64 + 1);
            o.recheck_in = Some(o.recheck_in.map_or(due, |r| r.min(due)));
        }
        if age > cfg.terminating_after_s && !t.finalizers.is_empty() {
            o.findings.push(Finding {
                severity: Severity::Warning,
                object: Some(t.object.clone()),
                message: format!(
                    "{} {} stuck terminating for {}m, waiting on finalizers {}",
                    t.object.kind,
                    t.object.name,
                    age / 60,
                    t.finalizers.join(", ")
                ),
            });
        }
    }
    let n = o.findings.len();
    o.status = if n == 0 {
        ProbeStatus::Healthy
    } else {
        ProbeStatus::Unhealthy
    };
    o.detail = format!(
        "{n} objects stuck terminating ({} terminating)",
        view.terminating.len()
    );
    o.obs("stuck", n as f64)
}

fn external_ips(ctx: &ClusterCtx) -> Outcome {
    let view = ctx.view.read();
    let mut o = Outcome::new(ProbeStatus::Healthy, "no Service uses spec.externalIPs");
    for (oref, ips) in view.external_ips.values() {
        o.findings.push(Finding {
            severity: Severity::Critical,
            object: Some(oref.clone()),
            message: format!(
                "Service {}/{} sets externalIPs {} (anyone who can create Services can intercept that traffic, CVE-2020-8554)",
                oref.namespace.clone().unwrap_or_default(),
                oref.name,
                ips.join(",")
            ),
        });
    }
    if !o.findings.is_empty() {
        o.status = ProbeStatus::Unhealthy;
        o.detail = format!("{} Services expose externalIPs", o.findings.len());
    }
    let n = o.findings.len();
    o.obs("services", n as f64)
}

/// Judges `kind` applied as `api_version` on a cluster at `minor`: `(removed?, message)` when deprecated.
pub fn judge(api_version: &str, kind: &str, minor: u32) -> Option<(bool, String)> {
    // the agent judges Kubernetes' own APIs (the table also lists add-ons')
    let row = multipilot_schemas::deprecations::find(api_version, kind)
        .filter(|r| r.component == "k8s")?;
    let removed = row.removed_minor().is_some_and(|m| minor >= m);
    let deprecated = row.deprecated_minor().is_some_and(|m| minor >= m);
    if !removed && !deprecated {
        return None;
    }
    let replacement = if row.replacement.is_empty() {
        "no replacement".to_string()
    } else {
        format!("use {}", row.replacement)
    };
    let msg = if removed {
        format!(
            "{kind} {api_version} was removed in {}: {replacement}",
            row.removed_in
        )
    } else {
        format!(
            "{kind} {api_version} is deprecated since {} and goes in {}: {replacement}",
            row.deprecated_in,
            if row.removed_in.is_empty() {
                "a later release"
            } else {
                &row.removed_in
            }
        )
    };
    Some((removed, msg))
}

async fn deprecated(ctx: &ClusterCtx) -> Outcome {
    let minor = match ctx.client.apiserver_version().await {
        Ok(info) => info.minor.trim_end_matches('+').parse::<u32>().unwrap_or(0),
        Err(e) => return Outcome::new(ProbeStatus::Unknown, format!("cannot read /version: {e}")),
    };
    let mut o = Outcome::new(ProbeStatus::Healthy, "");
    let mut removed_count = 0;
    {
        let view = ctx.view.read();
        for (oref, applied) in view.last_applied.values() {
            if let Some((removed, msg)) = judge(applied, &oref.kind, minor) {
                removed_count += usize::from(removed);
                o.findings.push(Finding {
                    severity: if removed {
                        Severity::Critical
                    } else {
                        Severity::Warning
                    },
                    object: Some(oref.clone()),
                    message: format!("last applied as {applied}: {msg}"),
                });
            }
        }
    }
    // clients still calling deprecated APIs (the API server counts them)
    if let Ok((200, body, _)) = get_raw(ctx, "/metrics").await {
        for line in body
            .lines()
            .filter(|l| l.starts_with("apiserver_requested_deprecated_apis{"))
        {
            let label = |n: &str| {
                line.split(&format!("{n}=\""))
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .unwrap_or("")
                    .to_string()
            };
            o.findings.push(Finding {
                severity: Severity::Info,
                object: None,
                message: format!(
                    "a client requested {}/{} {} (removed in {})",
                    label("group"),
                    label("version"),
                    label("resource"),
                    label("removed_release")
                ),
            });
        }
    }
    let warn = o
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Warning)
        .count();
    o.status = if removed_count > 0 {
        ProbeStatus::Unhealthy
    } else if warn > 0 {
        ProbeStatus::Degraded
    } else {
        ProbeStatus::Healthy
    };
    let objects = if removed_count == 1 {
        "object"
    } else {
        "objects"
    };
    o.detail = format!(
        "{removed_count} {objects} last applied with removed APIs, {warn} with deprecated ones (Kubernetes 1.{minor})"
    );
    o.obs("removed", removed_count as f64)
        .obs("deprecated", warn as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_detail_names_the_nodes_after_the_first() {
        assert_eq!(nodes_detail(8, &[]), "8/8 nodes Ready");
        assert_eq!(nodes_detail(8, &["w0"]), "7/8 nodes Ready");
        assert_eq!(
            nodes_detail(8, &["w0", "w3"]),
            "6/8 nodes Ready; also not Ready: w3"
        );
        let many: Vec<String> = (0..9).map(|i| format!("w{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            nodes_detail(10, &many),
            "1/10 nodes Ready; also not Ready: w1, w2, w3, w4, w5 and 3 more"
        );
    }

    #[test]
    fn a_health_answer_becomes_one_line_of_bounded_length() {
        // what an API server answers on /readyz/etcd while etcd fails
        let body = "[-]etcd failed: reason withheld\nreadyz check failed\n";
        assert_eq!(
            one_line(body),
            "[-]etcd failed: reason withheld; readyz check failed"
        );
        let long = one_line(&"é".repeat(400));
        assert!(
            long.len() <= 300 + '…'.len_utf8() && long.ends_with('…'),
            "{long}"
        );
    }

    #[test]
    fn a_health_failure_on_etcd_alone_is_the_etcd_probes_business() {
        for path in ["/readyz", "/livez"] {
            assert!(health_failure_owned_elsewhere(&format!(
                "{path}: HTTP 500 [-]etcd failed: reason withheld"
            )));
            assert!(!health_failure_owned_elsewhere(&format!(
                "{path}: HTTP 500 [-]poststarthook/rbac/bootstrap-roles failed: not finished"
            )));
            assert!(!health_failure_owned_elsewhere(&format!(
                "{path}: HTTP 500"
            )));
        }
        assert!(!health_failure_owned_elsewhere(
            "/version: HTTP 500 [-]etcd failed: reason withheld"
        ));
    }

    #[test]
    fn a_failing_probe_is_rerun_at_the_confirm_interval_and_a_due_change_sooner() {
        let s = Schedule {
            interval: Duration::from_secs(15),
            confirm: Duration::from_secs(3),
        };
        let secs = Duration::from_secs;
        assert_eq!(s.next_wait(ProbeStatus::Healthy, None), secs(15));
        assert_eq!(s.next_wait(ProbeStatus::Unknown, None), secs(15));
        assert_eq!(s.next_wait(ProbeStatus::Unhealthy, None), secs(3));
        assert_eq!(s.next_wait(ProbeStatus::Degraded, None), secs(3));
        // a lease expiring in 6 s is looked at then, not in 15 s; never sooner than half a second
        assert_eq!(s.next_wait(ProbeStatus::Healthy, Some(secs(6))), secs(6));
        assert_eq!(
            s.next_wait(ProbeStatus::Healthy, Some(Duration::ZERO)),
            Duration::from_millis(500)
        );
        assert_eq!(s.next_wait(ProbeStatus::Healthy, Some(secs(60))), secs(15));
        // an interval shorter than the confirm interval stays
        let fast = Schedule {
            interval: Duration::from_secs(2),
            confirm: Duration::from_secs(3),
        };
        assert_eq!(fast.next_wait(ProbeStatus::Unhealthy, None), secs(2));
    }

    #[test]
    fn judges_against_the_cluster_version() {
        let (removed, msg) = judge("policy/v1beta1", "PodDisruptionBudget", 31).expect("judged");
        assert!(removed, "{msg}");
        assert!(msg.contains("policy/v1"), "{msg}");
        let (removed, _) = judge("autoscaling/v2beta2", "HorizontalPodAutoscaler", 24)
            .expect("deprecated on 1.24");
        assert!(!removed);
        assert!(judge("apps/v1", "Deployment", 31).is_none());
        assert!(
            judge("batch/v1beta1", "CronJob", 20).is_none(),
            "not yet deprecated on 1.20"
        );
    }

    #[test]
    fn device_plugin_needs_a_recent_enough_driver() {
        let c = Config::default().gpu_compat;
        assert_eq!(min_driver(&c, "v0.17.0"), Some(550));
        assert_eq!(min_driver(&c, "v0.14.5"), Some(470));
        assert_eq!(min_driver(&c, "0.16.2"), Some(525));
        assert_eq!(min_driver(&c, "v0.10.0"), None);
        assert_eq!(min_driver(&c, "latest"), None);
    }
}
