//! Settings: the role's own (`alerts` section of the hub config) and the routing file, which follows
//! Alertmanager's configuration shape (`route`, `receivers`, `inhibit_rules`) so operators reuse what they
//! know; an Alertmanager file as it is loads too, what the router does not use named (`compat`). Keys
//! neither knows are errors, not silently ignored.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::matcher::Matcher;

/// The embedded default routing: everything to the `fleet` receiver, which publishes on
/// `fleet.alert.fleet` for integrations that subscribe; cluster-unreachable inhibits the rest of its cluster.
pub const DEFAULT_ROUTING: &str = include_str!("../alerts.yaml");

/// The role's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where silences, alerts, the notification log and pending notifications live (sled).
    pub data_dir: String,
    /// The store's page cache in bytes (sled's `cache_capacity`). Alerts and groups are held in memory
    /// and written at checkpoints, so the cache only speeds up those writes and the start.
    pub cache_bytes: u64,
    /// The routing file (Alertmanager-shaped YAML); empty: the embedded `alerts.yaml`.
    pub routing: Option<String>,
    /// The HTTP API (silences, alerts, receivers). With auth off it must be a loopback address.
    pub listen: String,
    /// Who may use the API: the console's token model (a viewer reads, an operator changes silences).
    /// Off by default, which only a loopback `listen` allows.
    pub auth: multipilot_runtime::auth::Config,
    /// Messages per pull from FLEET_INCIDENTS.
    pub batch: usize,
    /// How often groups are checked for due notifications.
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// How often the alerts changed since the last checkpoint are written to the store, marked with the
    /// durable's ack floor read before them. Alerts live in memory; a restart loads the last checkpoint and
    /// takes in again what FLEET_INCIDENTS holds after its mark (at most about this long of the stream).
    /// Notifications, silences and posted alerts are written at once whatever this is; 0: every tick.
    #[serde(with = "humantime_serde")]
    pub checkpoint: Duration,
    /// Resolved alerts are forgotten this long after they resolved (once their groups have been told).
    #[serde(with = "humantime_serde")]
    pub retain_resolved: Duration,
    /// Deduplicated event digests (`fleet.digest.>`) at or above this severity become alerts too
    /// (`info`, `warning`, `critical`; `off` ignores them).
    pub event_min_severity: EventThreshold,
    /// An event alert resolves this long after the digest that last refreshed it (events never say "over").
    #[serde(with = "humantime_serde")]
    pub event_ttl: Duration,
    /// Replicas of the `MULTIPILOT_SILENCES`, `MULTIPILOT_NFLOG` and `MULTIPILOT_ALERTS` buckets, where
    /// silences, the notification log and posted alerts are written through (in the hub: `provision.replicas` unless set here).
    pub kv_replicas: usize,
    /// Input limit of its consumer (incidents and digests per second, with a burst): a storm of incidents
    /// can't swamp the router. 0 = off (the default).
    pub rate: multipilot_bus::limit::Config,
    /// Notification log entries are forgotten this long after they were written, once their group is gone;
    /// also the max age of `MULTIPILOT_NFLOG` (Alertmanager's `--data.retention`). Keep it above the
    /// longest `repeat_interval`.
    #[serde(with = "humantime_serde")]
    pub nflog_retention: Duration,
    /// An alert posted to `POST /api/v2/alerts` without `endsAt` resolves this long after it was last
    /// posted unless posted again (Alertmanager's `global.resolve_timeout`).
    #[serde(with = "humantime_serde")]
    pub resolve_timeout: Duration,
}

/// The lowest event severity that becomes an alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventThreshold {
    /// Event digests are ignored.
    Off,
    /// Info and above.
    Info,
    /// Warning and above.
    Warning,
    /// Critical only.
    Critical,
}

impl EventThreshold {
    /// Whether a digest of this severity passes.
    pub fn passes(self, s: multipilot_schemas::payload::Severity) -> bool {
        use multipilot_schemas::payload::Severity;
        match self {
            EventThreshold::Off => false,
            EventThreshold::Info => true,
            EventThreshold::Warning => s >= Severity::Warning,
            EventThreshold::Critical => s >= Severity::Critical,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: "./data/hub/alerts".into(),
            cache_bytes: 16 << 20,
            routing: None,
            listen: "127.0.0.1:9467".into(),
            auth: multipilot_runtime::auth::Config {
                enabled: false,
                ..Default::default()
            },
            batch: 500,
            tick: Duration::from_millis(200),
            checkpoint: Duration::from_secs(10),
            retain_resolved: Duration::from_secs(3600),
            event_min_severity: EventThreshold::Warning,
            event_ttl: Duration::from_secs(3600),
            kv_replicas: 1,
            rate: multipilot_bus::limit::Config::default(),
            nflog_retention: Duration::from_secs(120 * 3600),
            resolve_timeout: Duration::from_secs(300),
        }
    }
}

/// A setting, the routing file or a template that can't be used; the message names what and where
/// (`checking routes.yaml: receiver ops: "ftp://x" is not an http(s) URL`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl ConfigError {
    /// The same error, said to be found in `what`.
    pub fn within(self, what: impl std::fmt::Display) -> Self {
        ConfigError(format!("{what}: {}", self.0))
    }
}

type Result<T, E = ConfigError> = std::result::Result<T, E>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(ConfigError(format!($($fmt)+)));
        }
    };
}

impl Config {
    /// Checks what serde can't.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            (1..=5).contains(&self.kv_replicas),
            "alerts.kv_replicas must be 1..=5, not {}",
            self.kv_replicas
        );
        ensure!(
            !self.nflog_retention.is_zero(),
            "alerts.nflog_retention must be > 0"
        );
        ensure!(
            !self.resolve_timeout.is_zero(),
            "alerts.resolve_timeout must be > 0"
        );
        Ok(())
    }
}

/// The routing file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Routing {
    /// The route tree's root (its matchers are ignored: everything enters it).
    pub route: Route,
    /// Receivers by name.
    pub receivers: Vec<Receiver>,
    /// Inhibition rules.
    #[serde(default)]
    pub inhibit_rules: Vec<InhibitRule>,
    /// Default title and text templates (minijinja); receivers may override them.
    #[serde(default)]
    pub templates: Templates,
    /// While a fleet incident's alert (`scope="fleet"`) fires, its members' own alerts (the cluster
    /// incidents it links) are muted, shown as inhibited by it: one failure across clusters pages once.
    /// `false` notifies the members as well.
    #[serde(default = "yes")]
    pub mute_fleet_members: bool,
    /// While an incident's alert fires, the alerts of the event digests it accounts for
    /// (`Incident.explains`: warnings on what its probe found, a DNS failure's `Unhealthy` on the coredns
    /// pods) are muted, shown as inhibited by it (or by its fleet alert), and resolve with it; so is an
    /// event fleet alert whose members are all accounted for. `false` notifies them as well.
    #[serde(default = "yes")]
    pub mute_explained_events: bool,
    /// A firing fleet alert that reaches one more cluster (the failure spread) is notified again at its
    /// group's next flush, as a cluster's own alert joining the group would be in Alertmanager, though
    /// the new member's alert is muted (with `mute_fleet_members: false` it pages too: a receiver of fleet
    /// alerts alone is still told). An `alertmanager_configs` receiver gets the alert posted again with its
    /// new annotations; that Alertmanager, seeing the same alert, notifies it at its own repeat interval.
    /// `false`: a cluster that fails the same way later joins silently (the alert's annotations say so at
    /// its next notification).
    #[serde(default = "yes")]
    pub notify_fleet_spread: bool,
    /// Alerts posted to the API (Prometheus' rules) that a correlator incident accounts for on its cluster:
    /// the same problem as a rule sees it, minutes later. See [`AccountsFor`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accounts_for: Vec<AccountsFor>,
    /// Named time intervals that routes mute or limit their notifications with (Alertmanager's
    /// `time_intervals`; its older `mute_time_intervals` list is read into this one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub time_intervals: Vec<crate::timeinterval::Named>,
}

/// One node of the route tree. Unset timings and receiver are inherited from the parent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// Receiver name.
    #[serde(default)]
    pub receiver: Option<String>,
    /// Labels that split alerts into groups; `["..."]` groups by every label.
    #[serde(default)]
    pub group_by: Option<Vec<String>>,
    /// Matchers an alert must meet to enter this route.
    #[serde(default)]
    pub matchers: Vec<Matcher>,
    /// Go on matching the siblings after this route matched.
    #[serde(default, rename = "continue")]
    pub continue_: bool,
    /// How long a new group waits for more alerts before its first notification.
    #[serde(default, with = "humantime_serde")]
    pub group_wait: Option<Duration>,
    /// How long a group waits before notifying about changes.
    #[serde(default, with = "humantime_serde")]
    pub group_interval: Option<Duration>,
    /// How long before a notification that changed nothing is sent again.
    #[serde(default, with = "humantime_serde")]
    pub repeat_interval: Option<Duration>,
    /// Child routes.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// No notifications from this route while any of these time intervals holds (not inherited).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mute_time_intervals: Vec<String>,
    /// Notifications from this route only while one of these time intervals holds (not inherited).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active_time_intervals: Vec<String>,
}

/// MultiPilot's own: while an incident of kind `incident` fires on a cluster, the posted alerts matching
/// `alerts` on that cluster (their `cluster` label MultiPilot's name of it: a rule of kube-prometheus' built
/// on `absent()` has one only from a per-cluster Prometheus' `external_labels`) are muted, shown as
/// inhibited by it (and by the fleet alert it is a member of, while that fires) — the problem pages once,
/// as the incident, once for the fleet when several clusters fail alike — and they stay muted for `hold`
/// after it ends (counted from when the router learned of the end, if later) if they started (`startsAt`:
/// when the rule fired) before its end: a rule sees the recovery a scrape and an evaluation later, and a
/// muted alert never notified would page as the problem ended. An alert more severe than the incident
/// (`severity` critical > warning > info, any case) or of no known severity is never muted so, and one
/// still firing when the hold is over pages at its group's next flush.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountsFor {
    /// The incident's kind (`node-not-ready`; its alert's `alertname` and `kind`).
    pub incident: String,
    /// Matchers of the posted alerts it accounts for (Alertmanager's syntax).
    pub alerts: Vec<Matcher>,
    /// How long they stay muted after the incident ends: at most 1h, and no later than the router forgets
    /// the resolved incident (`retain_resolved` after its end, 1h by default).
    #[serde(default = "default_hold", with = "humantime_serde")]
    pub hold: Duration,
}

fn default_hold() -> Duration {
    Duration::from_secs(180)
}

/// An inhibition rule: while an alert matching `source_matchers` fires, alerts matching `target_matchers`
/// with the same values of the `equal` labels are muted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InhibitRule {
    /// The inhibiting alerts.
    pub source_matchers: Vec<Matcher>,
    /// The inhibited alerts.
    pub target_matchers: Vec<Matcher>,
    /// Labels that must be equal in both.
    #[serde(default)]
    pub equal: Vec<String>,
}

/// Title and text templates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Templates {
    /// Title.
    pub title: String,
    /// Text.
    pub text: String,
}

impl Default for Templates {
    fn default() -> Self {
        Templates {
            title: "[{{ status | upper }}{% if status == \"firing\" %}:{{ firing | length }}{% endif %}] \
                    {% for k, v in group_labels | items %}{{ v }}{% if not loop.last %} {% endif %}{% endfor %}"
                .into(),
            text: "{% for a in firing %}- [{{ a.labels.severity }}] {{ a.labels.cluster }}: {{ a.annotations.summary }}\n{% endfor %}\
                   {% if resolved %}Resolved:\n{% for a in resolved %}- {{ a.labels.cluster }}: {{ a.annotations.summary }}\n{% endfor %}{% endif %}"
                .into(),
        }
    }
}

/// A receiver: where notifications go, and how fast.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receiver {
    /// Name (also the `<receiver>` of `fleet.alert.<receiver>`).
    pub name: String,
    /// Generic webhooks (Alertmanager webhook payload, version 4).
    #[serde(default)]
    pub webhook_configs: Vec<Webhook>,
    /// Hand-off to an existing Alertmanager (`POST /api/v2/alerts`).
    #[serde(default)]
    pub alertmanager_configs: Vec<AlertmanagerTarget>,
    /// Slack-compatible incoming webhooks.
    #[serde(default)]
    pub slack_configs: Vec<Slack>,
    /// Publish on `fleet.alert.<receiver>` (FLEET_ALERTS) for integrations that subscribe.
    #[serde(default)]
    pub nats_configs: Vec<NatsTarget>,
    /// Title/text templates for this receiver (default: the file's).
    #[serde(default)]
    pub templates: Option<Templates>,
    /// Delivery limits.
    #[serde(default)]
    pub delivery: Delivery,
}

/// A generic webhook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Webhook {
    /// URL.
    pub url: String,
    /// Also notify when alerts resolve.
    #[serde(default = "yes")]
    pub send_resolved: bool,
    /// At most this many alerts per payload (0: all); the rest are counted in `truncatedAlerts`.
    #[serde(default)]
    pub max_alerts: usize,
}

/// An Alertmanager to hand alerts to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertmanagerTarget {
    /// Base URL, e.g. `http://alertmanager:9093`.
    pub url: String,
}

/// A Slack-compatible incoming webhook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slack {
    /// The incoming webhook URL.
    pub api_url: String,
    /// Channel override.
    #[serde(default)]
    pub channel: Option<String>,
    /// Also notify when alerts resolve.
    #[serde(default = "yes")]
    pub send_resolved: bool,
}

/// Publication on `fleet.alert.<receiver>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsTarget {
    /// Also publish when alerts resolve.
    #[serde(default = "yes")]
    pub send_resolved: bool,
}

fn yes() -> bool {
    true
}

/// Per-receiver delivery limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Delivery {
    /// Notifications per second (governor); 0: unlimited.
    pub rate_per_second: u32,
    /// Burst above the rate (0: one second's worth).
    pub burst: u32,
    /// Notifications in flight at once.
    pub concurrency: usize,
    /// Attempts before a notification is dead-lettered.
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt (±20% jitter) up to `backoff_max`.
    #[serde(with = "humantime_serde")]
    pub backoff_initial: Duration,
    /// Longest retry delay.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Per-request timeout.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for Delivery {
    fn default() -> Self {
        Delivery {
            rate_per_second: 10,
            burst: 0,
            concurrency: 4,
            max_attempts: 10,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            timeout: Duration::from_secs(10),
        }
    }
}

impl Routing {
    /// Loads the routing file, or the embedded default.
    pub fn load(path: Option<&str>) -> Result<Routing> {
        let (text, from) = match path {
            Some(p) if !p.is_empty() => (
                std::fs::read_to_string(p).map_err(|e| ConfigError(format!("reading {p}: {e}")))?,
                p.to_string(),
            ),
            _ => (
                DEFAULT_ROUTING.to_string(),
                "the embedded alerts.yaml".into(),
            ),
        };
        let (r, notes) = Routing::parse(&text, &from)?;
        for n in notes {
            tracing::warn!(routing = %from, "{n}");
        }
        Ok(r)
    }

    /// Reads a routing file — the router's own, or Alertmanager's `alertmanager.yml` as it is — and checks
    /// it. Returns it with a note for each part of an Alertmanager file the router does not use.
    pub fn parse(text: &str, from: &str) -> Result<(Routing, Vec<String>)> {
        let mut doc: serde_yaml::Value =
            serde_yaml::from_str(text).map_err(|e| ConfigError(format!("parsing {from}: {e}")))?;
        let notes =
            crate::compat::adapt(&mut doc).map_err(|e| e.within(format_args!("reading {from}")))?;
        let r: Routing =
            serde_yaml::from_value(doc).map_err(|e| ConfigError(format!("parsing {from}: {e}")))?;
        r.validate()
            .map_err(|e| e.within(format_args!("checking {from}")))?;
        Ok((r, notes))
    }

    /// Checks what serde can't: receivers exist and are unique, the root has a receiver, templates
    /// compile, limits make sense.
    pub fn validate(&self) -> Result<()> {
        let mut names = BTreeSet::new();
        for r in &self.receivers {
            ensure!(
                multipilot_schemas::subject::is_valid_token(&r.name),
                "receiver name {:?} must be letters, digits and '-'",
                r.name
            );
            ensure!(
                names.insert(r.name.as_str()),
                "receiver {:?} is defined twice",
                r.name
            );
            ensure!(
                r.delivery.max_attempts >= 1,
                "receiver {}: max_attempts must be ≥ 1",
                r.name
            );
            ensure!(
                r.delivery.concurrency >= 1,
                "receiver {}: concurrency must be ≥ 1",
                r.name
            );
            for w in &r.webhook_configs {
                check_url(&w.url).map_err(|e| e.within(format_args!("receiver {}", r.name)))?;
            }
            for a in &r.alertmanager_configs {
                check_url(&a.url).map_err(|e| e.within(format_args!("receiver {}", r.name)))?;
            }
            for s in &r.slack_configs {
                check_url(&s.api_url).map_err(|e| e.within(format_args!("receiver {}", r.name)))?;
            }
            if let Some(t) = &r.templates {
                crate::template::check(t)
                    .map_err(|e| e.within(format_args!("receiver {} templates", r.name)))?;
            }
        }
        crate::template::check(&self.templates).map_err(|e| e.within("templates"))?;
        ensure!(
            self.route.receiver.is_some(),
            "the root route needs a receiver"
        );
        ensure!(
            self.route.mute_time_intervals.is_empty()
                && self.route.active_time_intervals.is_empty(),
            "the root route must not have mute or active time intervals"
        );
        for (i, a) in self.accounts_for.iter().enumerate() {
            ensure!(
                !a.incident.is_empty() && !a.alerts.is_empty(),
                "accounts_for[{i}]: needs an incident kind and the matchers of the alerts it accounts for"
            );
            ensure!(
                a.incident != "event",
                "accounts_for[{i}]: `event` is no incident kind (event digests account for nothing)"
            );
            ensure!(
                a.hold <= Duration::from_secs(3600),
                "accounts_for[{i}]: hold must be at most 1h"
            );
        }
        let mut intervals = BTreeSet::new();
        for t in &self.time_intervals {
            ensure!(
                intervals.insert(t.name.as_str()),
                "time interval {:?} is defined twice",
                t.name
            );
            for spec in &t.time_intervals {
                spec.compile()
                    .map_err(|e| e.within(format_args!("time interval {}", t.name)))?;
            }
        }
        fn walk(r: &Route, names: &BTreeSet<&str>, intervals: &BTreeSet<&str>) -> Result<()> {
            if let Some(n) = &r.receiver
                && !names.contains(n.as_str())
            {
                return Err(ConfigError(format!(
                    "route refers to receiver {n:?}, which is not defined"
                )));
            }
            for t in r.mute_time_intervals.iter().chain(&r.active_time_intervals) {
                ensure!(
                    intervals.contains(t.as_str()),
                    "route refers to time interval {t:?}, which is not defined"
                );
            }
            for d in [r.group_interval, r.repeat_interval].into_iter().flatten() {
                ensure!(
                    !d.is_zero(),
                    "group_interval and repeat_interval must be > 0"
                );
            }
            r.routes.iter().try_for_each(|c| walk(c, names, intervals))
        }
        walk(&self.route, &names, &intervals)
    }

    /// The time intervals, compiled, by name (those that don't compile are left out: `validate` refuses
    /// them first).
    pub fn intervals(
        &self,
    ) -> std::collections::BTreeMap<String, Vec<crate::timeinterval::Interval>> {
        self.time_intervals
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.time_intervals
                        .iter()
                        .filter_map(|s| s.compile().ok())
                        .collect(),
                )
            })
            .collect()
    }

    /// A receiver by name.
    pub fn receiver(&self, name: &str) -> Option<&Receiver> {
        self.receivers.iter().find(|r| r.name == name)
    }
}

fn check_url(u: &str) -> Result<()> {
    ensure!(
        u.starts_with("http://") || u.starts_with("https://"),
        "{u:?} is not an http(s) URL"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_routing_loads() {
        let r = Routing::load(None).unwrap();
        assert!(r.receiver("fleet").is_some());
        assert!(!r.inhibit_rules.is_empty());
    }

    #[test]
    fn mistakes_are_named() {
        let bad = [
            (
                "route: {receiver: nope}\nreceivers: [{name: a}]",
                "not defined",
            ),
            (
                "route: {receiver: a}\nreceivers: [{name: a}, {name: a}]",
                "twice",
            ),
            (
                "route: {receiver: a, matchers: [\"x=~(\"]}\nreceivers: [{name: a}]",
                "regular expression",
            ),
            (
                "route: {receiver: a}\nreceivers: [{name: a, webhook_configs: [{url: ftp://x}]}]",
                "http",
            ),
            (
                "route: {receiver: a, grouop_by: [x]}\nreceivers: [{name: a}]",
                "unknown field",
            ),
            (
                "route: {receiver: a}\nreceivers: [{name: a}]\ntemplates: {title: \"{{ x\"}",
                "template",
            ),
            (
                "route: {receiver: a}\nreceivers: [{name: a}]\naccounts_for: [{incident: x, alerts: []}]",
                "accounts_for[0]",
            ),
            (
                "route: {receiver: a}\nreceivers: [{name: a}]\naccounts_for: [{incident: x, alerts: ['a=b'], hold: soon}]",
                "hold",
            ),
        ];
        for (yaml, want) in bad {
            let err = serde_yaml::from_str::<Routing>(yaml)
                .map_err(|e| ConfigError(e.to_string()))
                .and_then(|r| r.validate().map(|_| r))
                .unwrap_err();
            assert!(err.to_string().contains(want), "{yaml}: {err}");
        }
    }
}
