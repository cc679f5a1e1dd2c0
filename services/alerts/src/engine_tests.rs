//! The dispatcher's core on its own: alerts and silences in with their times, the clock moved by hand,
//! decisions out; no store, no server. Timing (group_wait, group_interval, repeat_interval, mutes) is
//! checked here to the second, where the end-to-end tests only check the wiring.

use chrono::{TimeZone, Utc};
use multipilot_schemas::payload::{Incident, IncidentStatus, Severity};

use super::*;
use crate::matcher::Matcher;
use crate::store::fingerprint;

/// The routing of these tests: `ops` gets everything by cluster, `pager` the ClusterDown alerts (and not
/// their resolution), `quiet` team=quiet outside office hours (09:00–17:00 UTC), `web` team=web at most two
/// alerts per payload. ClusterDown mutes its cluster's other alerts.
const ROUTING: &str = r#"
route:
  receiver: ops
  group_by: [cluster]
  group_wait: 30s
  group_interval: 5m
  repeat_interval: 4h
  routes:
    - matchers: ['alertname="ClusterDown"']
      receiver: pager
      group_by: [alertname]
    - matchers: ['team="quiet"']
      receiver: quiet
      mute_time_intervals: [office-hours]
    - matchers: ['team="web"']
      receiver: web
receivers:
  - name: ops
    webhook_configs: [{url: "http://ops.test/hook"}]
  - name: pager
    webhook_configs: [{url: "http://pager.test/hook", send_resolved: false}]
  - name: quiet
    webhook_configs: [{url: "http://quiet.test/hook"}]
  - name: web
    webhook_configs: [{url: "http://web.test/hook", max_alerts: 2}]
time_intervals:
  - name: office-hours
    time_intervals: [{times: [{start_time: '09:00', end_time: '17:00'}]}]
inhibit_rules:
  - source_matchers: ['alertname="ClusterDown"']
    target_matchers: ['alertname!="ClusterDown"']
    equal: [cluster]
"#;

/// Tuesday 1 December 2026, 10:00 UTC (within office hours).
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 10, 0, 0)
        .single()
        .expect("valid time")
}

fn secs(n: i64) -> Duration {
    Duration::seconds(n)
}

fn mins(n: i64) -> Duration {
    Duration::minutes(n)
}

fn routing() -> Routing {
    Routing::parse(ROUTING, "the test routing")
        .expect("the test routing is valid")
        .0
}

fn engine(now: DateTime<Utc>) -> Engine {
    engine_from(Snapshot::default(), now)
}

fn engine_from(held: Snapshot, now: DateTime<Utc>) -> Engine {
    Engine::new(routing(), std::time::Duration::from_secs(3600), held, now)
}

fn labels(spec: &str) -> BTreeMap<String, String> {
    spec.split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// An alert as `POST /api/v2/alerts` takes it in (`a=1,b=2` labels), starting at `starts_at`.
fn posted(spec: &str, starts_at: DateTime<Utc>, ends_at: Option<DateTime<Utc>>) -> Alert {
    let labels = labels(spec);
    Alert {
        id: fingerprint(&labels),
        annotations: BTreeMap::from([("summary".to_string(), spec.to_string())]),
        labels,
        starts_at,
        ends_at,
        revision: 0,
        updated_at: starts_at,
        expires_at: None,
        posted: true,
        generator_url: None,
        members: Vec::new(),
        refreshed_at: None,
        explains: Vec::new(),
    }
}

fn post(e: &mut Engine, spec: &str, now: DateTime<Utc>) -> Taken {
    e.on_posted(posted(spec, now, None), now)
}

fn resolve(e: &mut Engine, spec: &str, started: DateTime<Utc>, now: DateTime<Utc>) -> Taken {
    e.on_posted(posted(spec, started, Some(now)), now)
}

/// Per notification, its receiver and its alerts as `alertname@cluster:state`.
type Sent = Vec<(String, Vec<String>)>;

/// What a tick sent.
fn sent(decided: &[Notify]) -> Sent {
    decided
        .iter()
        .flat_map(|d| &d.pending)
        .map(|p| {
            let n = &p.notification;
            let alerts = n
                .alerts
                .iter()
                .map(|a| {
                    format!(
                        "{}@{}:{}",
                        a.labels["alertname"],
                        a.labels.get("cluster").map_or("", String::as_str),
                        format!("{:?}", a.state).to_lowercase()
                    )
                })
                .collect();
            (n.receiver.clone(), alerts)
        })
        .collect()
}

fn one(receiver: &str, alerts: &[&str]) -> Sent {
    vec![(
        receiver.to_string(),
        alerts.iter().map(|a| a.to_string()).collect(),
    )]
}

/// Ticks every `step` from `from` up to and including `to`; returns what was sent, with when.
fn run(
    e: &mut Engine,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    step: Duration,
) -> Vec<(DateTime<Utc>, Sent)> {
    let mut out = Vec::new();
    let mut now = from;
    while now <= to {
        let s = sent(&e.tick(now));
        if !s.is_empty() {
            out.push((now, s));
        }
        now += step;
    }
    out
}

#[test]
fn a_new_group_waits_group_wait_and_sends_what_it_gathered_in_one_notification() {
    let mut e = engine(t0());
    assert_eq!(
        post(&mut e, "alertname=Disk,cluster=a", t0()),
        Taken::Placed
    );
    assert!(e.tick(t0()).is_empty());
    post(&mut e, "alertname=Latency,cluster=a", t0() + secs(10));
    assert!(e.tick(t0() + secs(29)).is_empty(), "group_wait is 30 s");
    let d = e.tick(t0() + secs(30));
    assert_eq!(sent(&d), one("ops", &["Disk@a:firing", "Latency@a:firing"]));
    let n = &d[0].pending[0].notification;
    assert_eq!(n.group_key, r#"{}:{cluster="a"}"#);
    assert_eq!(n.state, AlertState::Firing);
    assert_eq!(d[0].nflog_key, nflog_key("ops", r#"0:{cluster="a"}"#));
    assert_eq!(d[0].entry.firing.len(), 2);
    assert_eq!(d[0].entry.at, Some(t0() + secs(30)));
    assert_eq!(e.stats.notifications, 1);
}

#[test]
fn a_posted_alert_whose_wait_is_over_is_sent_at_the_next_tick() {
    // a Prometheus alert whose `for` is over: started a minute before it was posted
    let mut e = engine(t0());
    e.on_posted(
        posted("alertname=Disk,cluster=a", t0() - mins(1), None),
        t0(),
    );
    assert_eq!(sent(&e.tick(t0())), one("ops", &["Disk@a:firing"]));
}

#[test]
fn a_change_waits_for_the_group_interval() {
    let mut e = engine(t0());
    post(&mut e, "alertname=Disk,cluster=a", t0());
    let first = t0() + secs(30);
    assert_eq!(sent(&e.tick(first)), one("ops", &["Disk@a:firing"]));
    post(&mut e, "alertname=Latency,cluster=a", first + mins(1));
    // nothing until group_interval (5 min) after the first notification, then the group as it is
    let got = run(&mut e, first + mins(1), first + mins(6), secs(1));
    assert_eq!(
        got,
        vec![(
            first + mins(5),
            one("ops", &["Disk@a:firing", "Latency@a:firing"])
        )]
    );
}

#[test]
fn an_unchanged_group_is_sent_again_after_the_repeat_interval() {
    let mut e = engine(t0());
    post(&mut e, "alertname=Disk,cluster=a", t0());
    let first = t0() + secs(30);
    assert_eq!(sent(&e.tick(first)).len(), 1);
    // judged every group_interval; sent again once 4 h passed since it was last sent, and 4 h after that
    let got = run(&mut e, first + mins(1), first + Duration::hours(9), mins(1));
    let at: Vec<DateTime<Utc>> = got.iter().map(|(t, _)| *t).collect();
    assert_eq!(at, [first + Duration::hours(4), first + Duration::hours(8)]);
    assert_eq!(got[0].1, one("ops", &["Disk@a:firing"]));
}

#[test]
fn a_resolved_alert_is_sent_to_receivers_that_want_it_and_leaves_its_group() {
    let mut e = engine(t0());
    post(&mut e, "alertname=Disk,cluster=a", t0());
    post(&mut e, "alertname=Latency,cluster=a", t0());
    let first = t0() + secs(30);
    assert_eq!(sent(&e.tick(first))[0].1.len(), 2);
    resolve(&mut e, "alertname=Disk,cluster=a", t0(), first + mins(1));
    // the next flush tells of the resolution, with what still fires
    let d = e.tick(first + mins(5));
    assert_eq!(
        sent(&d),
        one("ops", &["Disk@a:resolved", "Latency@a:firing"])
    );
    assert_eq!(d[0].pending[0].notification.state, AlertState::Firing);
    assert_eq!(
        e.groups(),
        [(r#"0:{cluster="a"}"#.to_string(), "ops".to_string(), 1)]
    );
    // everything resolved: a resolved notification, and the group is gone
    resolve(&mut e, "alertname=Latency,cluster=a", t0(), first + mins(6));
    let d = e.tick(first + mins(10));
    assert_eq!(sent(&d), one("ops", &["Latency@a:resolved"]));
    assert_eq!(d[0].pending[0].notification.state, AlertState::Resolved);
    assert!(e.groups().is_empty());
    assert!(e.tick(first + mins(15)).is_empty());
}

#[test]
fn a_receiver_without_send_resolved_is_not_told_but_its_log_is() {
    let mut e = engine(t0());
    post(&mut e, "alertname=ClusterDown,cluster=a", t0());
    assert_eq!(
        sent(&e.tick(t0() + secs(30))),
        one("pager", &["ClusterDown@a:firing"])
    );
    resolve(
        &mut e,
        "alertname=ClusterDown,cluster=a",
        t0(),
        t0() + mins(1),
    );
    let d = e.tick(t0() + secs(30) + mins(5));
    assert_eq!(d.len(), 1, "judged: the log says it resolved");
    assert!(d[0].pending.is_empty(), "but nothing is sent");
    assert!(d[0].entry.firing.is_empty());
    assert_eq!(d[0].entry.resolved.len(), 1);
}

#[test]
fn an_alert_posted_already_resolved_is_in_no_notification() {
    let mut e = engine(t0());
    let ended = posted(
        "alertname=Disk,cluster=dev-2",
        t0() - mins(10),
        Some(t0() - mins(1)),
    );
    assert_eq!(e.on_posted(ended.clone(), t0()), Taken::Placed);
    assert_eq!(e.groups().len(), 1);
    assert!(run(&mut e, t0(), t0() + mins(10), mins(1)).is_empty());
    assert!(e.groups().is_empty(), "dealt with at its first flush");
    // posted again as it was: nothing changes
    assert_eq!(e.on_posted(ended, t0() + mins(10)), Taken::Unchanged);
    assert!(e.groups().is_empty());
    assert!(run(&mut e, t0() + mins(10), t0() + Duration::hours(5), mins(1)).is_empty());
}

#[test]
fn a_muted_time_interval_holds_notifications_and_keeps_the_log() {
    // notified before office hours; a second alert comes during them, when the route is muted
    let early = Utc
        .with_ymd_and_hms(2026, 12, 1, 8, 50, 0)
        .single()
        .expect("valid time");
    let mut e = engine(early);
    post(&mut e, "alertname=Backup,cluster=g,team=quiet", early);
    assert_eq!(
        sent(&e.tick(early + secs(30))),
        one("quiet", &["Backup@g:firing"])
    );
    let five = Utc
        .with_ymd_and_hms(2026, 12, 1, 17, 0, 0)
        .single()
        .expect("valid time");
    assert!(run(&mut e, early + mins(1), t0() - mins(1), mins(1)).is_empty());
    post(&mut e, "alertname=Restore,cluster=g,team=quiet", t0());
    let got = run(&mut e, t0(), five - mins(1), mins(1));
    assert!(
        got.is_empty(),
        "muted 09:00–17:00, repeats included: {got:?}"
    );
    // the first flush after the mute: what was not sent is, with what was
    let got = run(&mut e, five - mins(1), five + mins(10), secs(30));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].0 >= five && got[0].0 < five + mins(5));
    assert_eq!(
        got[0].1,
        one("quiet", &["Backup@g:firing", "Restore@g:firing"])
    );
}

#[test]
fn a_group_muted_from_its_start_is_sent_when_the_mute_ends() {
    let mut e = engine(t0());
    post(&mut e, "alertname=Backup,cluster=g,team=quiet", t0());
    let five = t0() + Duration::hours(7);
    assert!(run(&mut e, t0(), five - secs(1), mins(1)).is_empty());
    let got = run(&mut e, five, five + mins(5), secs(10));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, one("quiet", &["Backup@g:firing"]));
}

fn silence(id: &str, matcher: &str, from: DateTime<Utc>, to: DateTime<Utc>) -> Silence {
    Silence {
        id: id.into(),
        matchers: vec![Matcher::parse(matcher).expect("a valid matcher")],
        starts_at: from,
        ends_at: to,
        created_by: "test".into(),
        comment: "maintenance".into(),
        updated_at: from,
    }
}

#[test]
fn a_silenced_alert_is_held_until_its_silence_ends() {
    let mut e = engine(t0());
    e.set_silence(silence(
        "s1",
        "cluster=\"d\"",
        t0(),
        t0() + Duration::hours(1),
    ));
    post(&mut e, "alertname=Disk,cluster=d", t0());
    post(&mut e, "alertname=Disk,cluster=a", t0());
    // a is sent, d is not (its group, all silenced, is not even judged)
    assert_eq!(
        sent(&e.tick(t0() + secs(30))),
        one("ops", &["Disk@a:firing"])
    );
    let views = e.alerts(t0() + secs(30));
    let d = views
        .iter()
        .find(|v| v.alert.labels["cluster"] == "d")
        .expect("d listed");
    assert_eq!(d.muted.silenced_by, ["s1"]);
    assert!(run(&mut e, t0() + mins(1), t0() + mins(21), secs(30)).is_empty());
    // ended early: the next flush of d's group sends it
    let ended = match e.ending("s1", t0() + mins(21)) {
        Some(Ending::Ends(s)) => s,
        other => panic!("the silence was active: {other:?}"),
    };
    assert_eq!(ended.ends_at, t0() + mins(21));
    e.set_silence(ended);
    assert!(matches!(
        e.ending("s1", t0() + mins(22)),
        Some(Ending::Over(_))
    ));
    assert_eq!(e.ending("nope", t0()), None);
    let got = run(
        &mut e,
        t0() + mins(21) + secs(30),
        t0() + mins(30),
        secs(30),
    );
    assert_eq!(
        got,
        vec![(t0() + secs(30) + mins(25), one("ops", &["Disk@d:firing"]))]
    );
}

#[test]
fn an_inhibited_alert_is_left_out_of_its_groups_notification() {
    let mut e = engine(t0());
    post(&mut e, "alertname=ClusterDown,cluster=c", t0());
    post(&mut e, "alertname=PodCrash,cluster=c", t0());
    post(&mut e, "alertname=Disk,cluster=c", t0());
    post(&mut e, "alertname=PodCrash,cluster=b", t0());
    let mut got = sent(&e.tick(t0() + secs(30)));
    got.sort();
    assert_eq!(
        got,
        vec![
            ("ops".to_string(), vec!["PodCrash@b:firing".to_string()]),
            (
                "pager".to_string(),
                vec!["ClusterDown@c:firing".to_string()]
            ),
        ],
        "c's other alerts are inhibited, b's are not"
    );
    let views = e.alerts(t0());
    let crash = views
        .iter()
        .find(|v| v.alert.labels["cluster"] == "c" && v.alert.labels["alertname"] == "PodCrash")
        .expect("listed");
    assert_eq!(
        crash.muted.inhibited_by,
        [fingerprint(&labels("alertname=ClusterDown,cluster=c"))]
    );
}

#[test]
fn an_inhibition_that_ends_resends_nothing_already_sent() {
    let mut e = engine(t0());
    post(&mut e, "alertname=NodeNotReady,cluster=e", t0());
    let first = t0() + secs(30);
    assert_eq!(sent(&e.tick(first)), one("ops", &["NodeNotReady@e:firing"]));
    // e goes down: its alert is inhibited through several group intervals, then e is back
    post(&mut e, "alertname=ClusterDown,cluster=e", first + mins(1));
    let got = run(&mut e, first + mins(1), first + mins(20), mins(1));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, one("pager", &["ClusterDown@e:firing"]));
    resolve(
        &mut e,
        "alertname=ClusterDown,cluster=e",
        first + mins(1),
        first + mins(21),
    );
    // ops already told of NodeNotReady: nothing more until the repeat interval
    let got = run(
        &mut e,
        first + mins(21),
        first + Duration::hours(3),
        mins(1),
    );
    assert!(got.is_empty(), "{got:?}");
    let got = run(
        &mut e,
        first + Duration::hours(3),
        first + Duration::hours(4),
        mins(1),
    );
    assert_eq!(
        got,
        vec![(
            first + Duration::hours(4),
            one("ops", &["NodeNotReady@e:firing"])
        )]
    );
}

#[test]
fn a_fleet_incident_mutes_its_members() {
    let mut e = engine(t0());
    let member = posted("alertname=DnsFailure,cluster=a", t0(), None);
    let mut fleet = posted("alertname=DnsFailure,scope=fleet", t0(), None);
    fleet.members = vec![member.id.clone()];
    e.on_posted(member, t0());
    e.on_posted(fleet, t0());
    assert_eq!(
        sent(&e.tick(t0() + secs(30))),
        one("ops", &["DnsFailure@:firing"])
    );
}

#[test]
fn max_alerts_truncates_the_webhook_payload() {
    let mut e = engine(t0());
    for name in ["A", "B", "C"] {
        post(
            &mut e,
            &format!("alertname={name},cluster=w,team=web"),
            t0(),
        );
    }
    let d = e.tick(t0() + secs(30));
    let p = &d[0].pending[0];
    assert_eq!(p.notification.alerts.len(), 3, "the notification holds all");
    let max = e
        .routing()
        .receiver("web")
        .expect("the web receiver")
        .webhook_configs[0]
        .max_alerts;
    let body = crate::deliver::webhook_payload(p, max);
    assert_eq!(body["alerts"].as_array().map(Vec::len), Some(2));
    assert_eq!(body["truncatedAlerts"], 1);
    assert_eq!(body["alerts"][0]["labels"]["alertname"], "A");
    assert_eq!(body["groupKey"], r#"{}/{team="web"}:{cluster="w"}"#);
}

#[test]
fn a_restarted_engine_continues_the_notification_log() {
    let mut e = engine(t0());
    post(&mut e, "alertname=Disk,cluster=a", t0());
    let first = t0() + secs(30);
    let d = e.tick(first);
    assert_eq!(sent(&d).len(), 1);
    // what the store holds: the changed alerts and the log entry, written with the decision
    let changes = e.take_changes();
    assert_eq!(changes.alerts.len(), 1);
    let held = Snapshot {
        alerts: changes.alerts,
        silences: Vec::new(),
        nflog: d
            .iter()
            .map(|n| (n.nflog_key.clone(), n.entry.clone()))
            .collect(),
    };
    // restarted two minutes later: not sent again; the group waits out its interval since then
    let restart = first + mins(2);
    let mut e = engine_from(held.clone(), restart);
    assert!(run(&mut e, restart, first + mins(20), secs(10)).is_empty());
    post(&mut e, "alertname=Latency,cluster=a", first + mins(21));
    let got = run(&mut e, first + mins(21), first + mins(30), secs(10));
    assert_eq!(
        got,
        vec![(
            first + mins(25),
            one("ops", &["Disk@a:firing", "Latency@a:firing"])
        )]
    );
    // without the log, the same alert would be sent again after group_wait
    let mut blank = engine_from(
        Snapshot {
            nflog: Vec::new(),
            ..held
        },
        restart,
    );
    assert_eq!(
        sent(&blank.tick(restart + secs(30))),
        one("ops", &["Disk@a:firing"])
    );
}

fn incident(rev: u64, status: IncidentStatus, at: DateTime<Utc>) -> Incident {
    Incident {
        id: "inc-1".into(),
        cluster: "a".into(),
        kind: "node-not-ready".into(),
        severity: Severity::Warning,
        status,
        summary: "node n1 is not ready".into(),
        opened_at: t0(),
        updated_at: at,
        resolved_at: (status == IncidentStatus::Resolved).then_some(at),
        ingest_time: None,
        evidence: Vec::new(),
        labels: BTreeMap::new(),
        revision: rev,
        acknowledged_by: None,
        blast_radius: None,
        explains: Vec::new(),
    }
}

#[test]
fn an_older_revision_redelivered_changes_nothing() {
    let mut e = engine(t0());
    assert_eq!(
        e.on_incident(&incident(1, IncidentStatus::Open, t0()), t0()),
        Taken::Placed
    );
    let first = t0() + secs(30);
    assert_eq!(
        sent(&e.tick(first)),
        one("ops", &["node-not-ready@a:firing"])
    );
    e.on_incident(&incident(2, IncidentStatus::Resolved, first), first);
    assert_eq!(
        sent(&e.tick(first + mins(5))),
        one("ops", &["node-not-ready@a:resolved"])
    );
    // an older revision, and the same one again
    for (rev, status) in [(1, IncidentStatus::Open), (2, IncidentStatus::Resolved)] {
        assert_eq!(
            e.on_incident(&incident(rev, status, first), first + mins(6)),
            Taken::Stale
        );
    }
    assert_eq!(e.stats.stale_ignored, 2);
    assert!(run(&mut e, first + mins(6), first + Duration::hours(5), mins(1)).is_empty());
}

#[test]
fn changes_name_each_alert_once_and_what_was_forgotten() {
    let mut e = engine(t0());
    for rev in 1..=3 {
        e.on_incident(&incident(rev, IncidentStatus::Open, t0()), t0());
    }
    let c = e.take_changes();
    assert_eq!(c.alerts.len(), 1, "written once per batch");
    assert_eq!(c.alerts[0].revision, 3);
    assert!(e.take_changes().is_empty());
    // a write that failed comes again
    e.on_incident(
        &incident(4, IncidentStatus::Resolved, t0() + mins(1)),
        t0() + mins(1),
    );
    let failed = e.take_changes();
    e.unsaved(failed.clone());
    assert_eq!(e.take_changes(), failed);
    // resolved longer than retain_resolved (1 h), its group dealt with: forgotten
    e.tick(t0() + mins(10));
    assert!(e.take_changes().forgotten.is_empty());
    e.tick(t0() + Duration::hours(2));
    let c = e.take_changes();
    assert_eq!(c.forgotten.len(), 1);
    assert!(e.alerts(t0()).is_empty());
}

#[test]
fn nothing_is_flushed_while_replaying() {
    let mut e = engine(t0());
    e.set_replaying(true);
    post(&mut e, "alertname=Disk,cluster=a", t0());
    assert!(e.tick(t0() + mins(1)).is_empty());
    e.set_replaying(false);
    assert_eq!(
        sent(&e.tick(t0() + mins(1))),
        one("ops", &["Disk@a:firing"])
    );
}

#[test]
fn a_fleet_alert_of_clusters_lost_together_says_what_they_take_down() {
    let entry = multipilot_schemas::catalog::entries()
        .into_iter()
        .find(|e| e.name == "FleetIncident")
        .expect("a sample fleet incident");
    let mut f: multipilot_schemas::payload::FleetIncident =
        rmp_serde::from_slice::<multipilot_schemas::Envelope<_>>(&entry.sample)
            .expect("it decodes")
            .payload;
    assert!(
        !alert_of_fleet(&f, t0())
            .annotations
            .contains_key("blast_radius")
    );
    f.kind = "cluster-unreachable".into();
    f.blast_radius = Some(multipilot_schemas::payload::BlastRadius {
        summary: "takes down 3 workloads in 1 namespace; 1 runs on no cluster still up (Deployment shop/checkout)".into(),
        ..Default::default()
    });
    let a = alert_of_fleet(&f, t0());
    assert_eq!(
        a.annotations.get("blast_radius").map(String::as_str),
        Some(
            "takes down 3 workloads in 1 namespace; 1 runs on no cluster still up (Deployment shop/checkout)"
        )
    );
}

/// A fleet incident of `kind` whose members are `(cluster, member id)` (for `event`, digest ids).
fn fleet_of(
    id: &str,
    kind: &str,
    members: &[(&str, &str)],
    rev: u64,
    resolved: Option<DateTime<Utc>>,
) -> multipilot_schemas::payload::FleetIncident {
    use multipilot_schemas::payload::{FleetIncident, FleetMember};
    let entry = multipilot_schemas::catalog::entries()
        .into_iter()
        .find(|e| e.name == "FleetIncident")
        .expect("a sample fleet incident");
    let sample: FleetIncident =
        rmp_serde::from_slice::<multipilot_schemas::Envelope<_>>(&entry.sample)
            .expect("it decodes")
            .payload;
    let alertname = if kind == "event" { "Unhealthy" } else { kind };
    FleetIncident {
        id: id.into(),
        kind: kind.into(),
        status: if resolved.is_some() {
            IncidentStatus::Resolved
        } else {
            IncidentStatus::Open
        },
        resolved_at: resolved,
        opened_at: t0(),
        members: members
            .iter()
            .map(|(c, m)| FleetMember {
                cluster: (*c).into(),
                incident_id: (*m).into(),
                severity: Severity::Warning,
                status: IncidentStatus::Open,
                summary: format!("{kind} on {c}"),
                opened_at: t0(),
                joined_at: t0(),
                left_at: None,
                left_because: String::new(),
            })
            .collect(),
        labels: BTreeMap::from([
            ("alertname".to_string(), alertname.to_string()),
            ("scope".to_string(), "fleet".to_string()),
        ]),
        revision: rev,
        blast_radius: None,
        ..sample
    }
}

/// The coredns pods' readiness failing on `cluster`, `count` times by `last_seen`.
fn coredns_unhealthy(
    cluster: &str,
    count: u64,
    last_seen: DateTime<Utc>,
) -> multipilot_schemas::payload::EventDigest {
    multipilot_schemas::payload::EventDigest {
        id: format!("unhealthy-coredns-{cluster}"),
        cluster: cluster.into(),
        object: multipilot_schemas::payload::ObjectRef {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: Some("kube-system".into()),
            name: "coredns-*".into(),
            uid: None,
        },
        reason: "Unhealthy".into(),
        severity: Severity::Warning,
        message: "Readiness probe failed: HTTP probe failed with statuscode: 503".into(),
        first_seen: t0(),
        last_seen,
        count,
        pass: multipilot_schemas::payload::DigestPass::New,
    }
}

fn dns_failure(cluster: &str, rev: u64, resolved: Option<DateTime<Utc>>) -> Incident {
    Incident {
        id: format!("dns-{cluster}"),
        cluster: cluster.into(),
        kind: "dns-failure".into(),
        severity: Severity::Critical,
        summary: format!("Cluster DNS failing on {cluster}"),
        explains: vec![format!("unhealthy-coredns-{cluster}")],
        ..incident(
            rev,
            if resolved.is_some() {
                IncidentStatus::Resolved
            } else {
                IncidentStatus::Open
            },
            resolved.unwrap_or(t0()),
        )
    }
}

/// The coredns pods' readiness failing on a and b at `t0`: their digests and the fleet alert `f-ev` of
/// them; its members.
fn readiness_failing_on_a_and_b(
    e: &mut Engine,
    ttl: std::time::Duration,
) -> [(&'static str, &'static str); 2] {
    for c in ["a", "b"] {
        e.on_digest(&coredns_unhealthy(c, 1, t0()), t0(), t0(), ttl);
    }
    let members = [("a", "unhealthy-coredns-a"), ("b", "unhealthy-coredns-b")];
    e.on_fleet_incident(&fleet_of("f-ev", "event", &members, 1, None), t0());
    members
}

#[test]
fn the_warnings_an_incident_accounts_for_page_neither_alone_nor_as_a_fleet_and_resolve_with_it() {
    let mut e = engine(t0());
    let ttl = std::time::Duration::from_secs(3600);
    // coredns fails readiness on a and b (events first), then their DNS probes fail
    let members = readiness_failing_on_a_and_b(&mut e, ttl);
    let at = t0() + secs(10);
    for c in ["a", "b"] {
        e.on_incident(&dns_failure(c, 1, None), at);
    }
    let dns_members = [("a", "dns-a"), ("b", "dns-b")];
    e.on_fleet_incident(&fleet_of("f-dns", "dns-failure", &dns_members, 1, None), at);
    // one page: the fleet's DNS failure
    assert_eq!(
        sent(&e.tick(t0() + secs(40))),
        one("ops", &["dns-failure@:firing"])
    );
    let views = e.alerts(at);
    let muted = |id: &str| {
        let v = views.iter().find(|v| v.alert.id == id).expect("held");
        v.muted.inhibited_by.clone()
    };
    assert_eq!(
        muted("f-ev"),
        ["f-dns"],
        "muted by the fleet alert of what accounts for it"
    );
    assert_eq!(muted("event:unhealthy-coredns-a"), ["f-ev", "dns-a"]);
    assert!(muted("f-dns").is_empty());
    // the DNS failures resolve: their warnings resolve with them, the fleet's event problem says nothing
    let fixed = t0() + mins(3);
    for c in ["a", "b"] {
        e.on_incident(&dns_failure(c, 2, Some(fixed)), fixed);
    }
    e.on_fleet_incident(
        &fleet_of("f-dns", "dns-failure", &dns_members, 2, Some(fixed)),
        fixed,
    );
    let views = e.alerts(fixed);
    let a = views
        .iter()
        .find(|v| v.alert.id == "event:unhealthy-coredns-a")
        .expect("held");
    assert_eq!(a.alert.ends_at, Some(fixed));
    assert_eq!(a.alert.annotations[RESOLVED_WITH], "dns-a");
    // a refresh of occurrences from before the fix changes nothing; the hour of the TTL passes quietly
    // but for the DNS failure's resolution
    let late = fixed + secs(20);
    assert_eq!(
        e.on_digest(&coredns_unhealthy("a", 4, fixed - secs(5)), late, late, ttl),
        Taken::Stale
    );
    let mut got = run(&mut e, fixed, fixed + mins(15), mins(1));
    // its members quiet for three refresh intervals, the correlator resolves the fleet's event problem
    let quiet = fixed + mins(16);
    e.on_fleet_incident(&fleet_of("f-ev", "event", &members, 2, Some(quiet)), quiet);
    got.extend(run(&mut e, quiet, quiet + mins(70), mins(1)));
    assert_eq!(
        got,
        vec![(t0() + mins(6), one("ops", &["dns-failure@:resolved"]))],
        "{got:?}"
    );
}

#[test]
fn a_warning_after_the_incident_that_accounted_for_it_resolved_pages() {
    let mut e = engine(t0());
    let ttl = std::time::Duration::from_secs(3600);
    e.on_digest(&coredns_unhealthy("a", 1, t0()), t0(), t0(), ttl);
    e.on_incident(&dns_failure("a", 1, None), t0());
    let fixed = t0() + mins(3);
    let mut got = run(&mut e, t0(), fixed - secs(10), secs(10));
    e.on_incident(&dns_failure("a", 2, Some(fixed)), fixed);
    got.extend(run(&mut e, fixed, fixed + mins(10), secs(10)));
    assert_eq!(
        got,
        vec![
            (t0() + secs(30), one("ops", &["dns-failure@a:firing"])),
            // (as in Alertmanager, a group's resolved notification lists its alerts resolved since,
            // muted before or not)
            (
                t0() + mins(5) + secs(30),
                one("ops", &["dns-failure@a:resolved", "Unhealthy@a:resolved"])
            ),
        ]
    );
    // within the hour the ended alert is held: the pods fail again after the fix, DNS holding — a
    // problem of its own, which pages (from its new start)
    let again = fixed + mins(12);
    assert_eq!(
        e.on_digest(&coredns_unhealthy("a", 6, again), again, again, ttl),
        Taken::Placed
    );
    let views = e.alerts(again);
    let a = views
        .iter()
        .find(|v| v.alert.id == "event:unhealthy-coredns-a")
        .expect("held");
    assert!(a.alert.firing());
    assert_eq!(a.alert.starts_at, fixed);
    assert!(!a.alert.annotations.contains_key(RESOLVED_WITH));
    let got = run(&mut e, again, again + mins(6), secs(10));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].1, one("ops", &["Unhealthy@a:firing"]));
    // an occurrence that came after the incident's end, read before it resolved, is not ended with it
    let mut e = engine(t0());
    e.on_incident(&dns_failure("a", 1, None), t0());
    let later = fixed + secs(30);
    e.on_digest(&coredns_unhealthy("a", 1, later), later, later, ttl);
    e.on_incident(&dns_failure("a", 2, Some(fixed)), later);
    assert!(
        e.alerts(later)
            .iter()
            .find(|v| v.alert.id == "event:unhealthy-coredns-a")
            .is_some_and(|v| v.alert.firing())
    );
}

#[test]
fn a_fleet_event_problem_on_a_cluster_nothing_accounts_for_pages() {
    let mut e = engine(t0());
    let ttl = std::time::Duration::from_secs(3600);
    for c in ["a", "b"] {
        e.on_digest(&coredns_unhealthy(c, 1, t0()), t0(), t0(), ttl);
    }
    // a's DNS probe fails; b's does not
    e.on_incident(&dns_failure("a", 1, None), t0());
    let members = [("a", "unhealthy-coredns-a"), ("b", "unhealthy-coredns-b")];
    e.on_fleet_incident(&fleet_of("f-ev", "event", &members, 1, None), t0());
    let mut got = sent(&e.tick(t0() + secs(30)));
    got.sort();
    assert_eq!(
        got,
        vec![
            ("ops".to_string(), vec!["Unhealthy@:firing".to_string()]),
            ("ops".to_string(), vec!["dns-failure@a:firing".to_string()]),
        ]
    );
    // and with the mute off, a's warning pages beside its incident
    let mut r = routing();
    r.mute_explained_events = false;
    let mut e = Engine::new(r, ttl, Snapshot::default(), t0());
    e.on_digest(&coredns_unhealthy("a", 1, t0()), t0(), t0(), ttl);
    e.on_incident(&dns_failure("a", 1, None), t0());
    assert_eq!(
        sent(&e.tick(t0() + secs(30))),
        one("ops", &["dns-failure@a:firing", "Unhealthy@a:firing"])
    );
}

#[test]
fn a_problem_on_several_clusters_that_stopped_does_not_page_its_members_afterwards() {
    let mut e = engine(t0());
    let ttl = std::time::Duration::from_secs(3600);
    // the same warning on a and b, nothing accounting for it: the fleet alert pages, its members not
    let members = readiness_failing_on_a_and_b(&mut e, ttl);
    let mut got = run(&mut e, t0(), t0() + mins(15), mins(1));
    // it stops; its members quiet for a quarter of an hour, the correlator resolves it
    let quiet = t0() + mins(16);
    e.on_fleet_incident(&fleet_of("f-ev", "event", &members, 2, Some(quiet)), quiet);
    let views = e.alerts(quiet);
    let a = views
        .iter()
        .find(|v| v.alert.id == "event:unhealthy-coredns-a")
        .expect("held");
    assert_eq!(a.alert.ends_at, Some(t0()), "ended at its last occurrence");
    assert_eq!(a.alert.annotations[RESOLVED_WITH], "f-ev");
    // a digest redelivered (stored then) changes nothing; the members' hour of TTL passes without a
    // page for them
    assert_eq!(
        e.on_digest(&coredns_unhealthy("a", 1, t0()), t0(), quiet, ttl),
        Taken::Stale
    );
    // (a digest that counts nothing new, whatever time it says: a cluster's clock may run ahead of the
    // end its member was given)
    let mut ahead = coredns_unhealthy("b", 1, quiet + mins(20));
    ahead.first_seen = t0();
    assert_eq!(e.on_digest(&ahead, t0(), quiet, ttl), Taken::Stale);
    got.extend(run(&mut e, quiet, quiet + mins(70), mins(1)));
    assert_eq!(
        got,
        vec![
            (t0() + mins(1), one("ops", &["Unhealthy@:firing"])),
            (quiet, one("ops", &["Unhealthy@:resolved"])),
        ],
        "{got:?}"
    );
    // b's warning comes back while its ended alert is held: it fires, on its own now, and a resolution
    // of the fleet alert read again does not end it
    let mut e = engine(t0());
    for c in ["a", "b"] {
        e.on_digest(&coredns_unhealthy(c, 1, t0()), t0(), t0(), ttl);
    }
    e.on_fleet_incident(&fleet_of("f-ev", "event", &members, 1, None), t0());
    e.on_fleet_incident(&fleet_of("f-ev", "event", &members, 2, Some(quiet)), quiet);
    let back = quiet + mins(5);
    e.on_digest(&coredns_unhealthy("b", 9, back), back, back, ttl);
    e.on_fleet_incident(&fleet_of("f-ev", "event", &members, 3, Some(quiet)), back);
    let b = e.alerts(back);
    let b = b
        .iter()
        .find(|v| v.alert.id == "event:unhealthy-coredns-b")
        .expect("held");
    assert!(b.alert.firing(), "{:?}", b.alert);
    assert_eq!(
        run(&mut e, back, back + mins(1), secs(10)),
        // (its group waited since the start: due at once)
        vec![(back, one("ops", &["Unhealthy@b:firing"]))]
    );
}

/// An engine of the test routing changed by `change`, at `t0`.
fn engine_routed(change: impl FnOnce(&mut Routing)) -> Engine {
    let mut r = routing();
    change(&mut r);
    Engine::new(
        r,
        std::time::Duration::from_secs(3600),
        Snapshot::default(),
        t0(),
    )
}

/// CNI failing on a and b, then on c (the fleet incident's revision 2 at `t0 + 2m`), then a revision that
/// reaches no cluster more (b recovered: its member resolved, still listed; `t0 + 12m`), and d joining at
/// `t0 + 30m`: what `e` sends until `t0 + 40m`.
fn cni_spreading(e: &mut Engine) -> Vec<(DateTime<Utc>, Sent)> {
    let mut got = Vec::new();
    let mut at = t0();
    for (rev, (from, cs)) in [
        (0, &["a", "b"][..]),
        (2, &["a", "b", "c"]),
        (12, &["a", "b", "c"]),
        (30, &["a", "b", "c", "d"]),
    ]
    .into_iter()
    .enumerate()
    {
        let from = t0() + mins(from);
        got.extend(run(e, at, from - secs(10), secs(10)));
        let members: Vec<_> = cs.iter().map(|c| (*c, "cni-member")).collect();
        let mut f = fleet_of("f-cni", "cni-degraded", &members, rev as u64 + 1, None);
        if rev >= 2 {
            let b = &mut f.members[1];
            b.status = IncidentStatus::Resolved;
            b.left_at = Some(t0() + mins(12));
        }
        e.on_fleet_incident(&f, from);
        at = from;
    }
    got.extend(run(e, at, t0() + mins(40), secs(10)));
    got
}

#[test]
fn a_fleet_failure_that_reaches_another_cluster_is_notified_again_at_the_groups_next_flush() {
    let mut e = engine(t0());
    let got = cni_spreading(&mut e);
    let firing = one("ops", &["cni-degraded@:firing"]);
    // group_wait after it opened; c joined at 2m: at the group's next flush (group_interval, 5m, after
    // the first); b recovering says nothing new; d joining at 30m, at the first flush after
    assert_eq!(
        got,
        vec![
            (t0() + secs(30), firing.clone()),
            (t0() + secs(330), firing.clone()),
            (t0() + secs(30 * 60 + 30), firing.clone()),
        ]
    );
    // what it said the second time: the three clusters
    let mut e = engine(t0());
    let f = |rev, cs: &[&'static str]| {
        let m: Vec<_> = cs.iter().map(|c| (*c, "cni-member")).collect();
        fleet_of("f-cni", "cni-degraded", &m, rev, None)
    };
    e.on_fleet_incident(&f(1, &["a", "b"]), t0());
    assert_eq!(sent(&e.tick(t0() + secs(30))), firing);
    e.on_fleet_incident(&f(2, &["a", "b", "c"]), t0() + mins(2));
    let d = e.tick(t0() + secs(330));
    let n = &d[0].pending[0].notification.alerts[0];
    assert_eq!(n.annotations["clusters"], "a,b,c");
    // a revision that reaches no cluster more waits for repeat_interval
    e.on_fleet_incident(&f(3, &["a", "b", "c"]), t0() + mins(6));
    assert!(run(&mut e, t0() + mins(6), t0() + mins(60), secs(10)).is_empty());
}

#[test]
fn with_notify_fleet_spread_false_a_cluster_failing_the_same_way_later_joins_silently() {
    let mut e = engine_routed(|r| r.notify_fleet_spread = false);
    assert_eq!(
        cni_spreading(&mut e),
        vec![(t0() + secs(30), one("ops", &["cni-degraded@:firing"]))]
    );
}

#[test]
fn a_log_entry_from_before_spans_were_kept_does_not_notify_a_fleet_alert_again_on_restart() {
    let mut e = engine(t0());
    let m = [("a", "cni-a"), ("b", "cni-b")];
    e.on_fleet_incident(&fleet_of("f-cni", "cni-degraded", &m, 1, None), t0());
    let d = e.tick(t0() + secs(30));
    assert_eq!(sent(&d), one("ops", &["cni-degraded@:firing"]));
    let mut nflog: Vec<(String, NflogEntry)> = d
        .iter()
        .map(|n| (n.nflog_key.clone(), n.entry.clone()))
        .collect();
    assert_eq!(
        nflog[0].1.spans["f-cni"],
        BTreeSet::from(["a".to_string(), "b".to_string()])
    );
    // as an older router wrote it
    nflog[0].1.spans.clear();
    let held = Snapshot {
        alerts: e.take_changes().alerts,
        silences: Vec::new(),
        nflog,
    };
    let restart = t0() + mins(3);
    let mut e = engine_from(held, restart);
    assert!(run(&mut e, restart, t0() + mins(30), secs(10)).is_empty());
    // nor, until the group is notified again, when it spreads: what it spanned then is not known
    e.on_fleet_incident(
        &fleet_of(
            "f-cni",
            "cni-degraded",
            &[("a", "cni-a"), ("b", "cni-b"), ("c", "cni-c")],
            2,
            None,
        ),
        t0() + mins(31),
    );
    assert!(run(&mut e, t0() + mins(31), t0() + mins(60), secs(10)).is_empty());
}

#[test]
fn with_the_shipped_routing_a_crash_loop_pages_as_its_backoff_alert_not_also_as_prometheus_restart_counter()
 {
    let routing = Routing::parse(crate::config::DEFAULT_ROUTING, "alerts.yaml")
        .expect("the shipped routing is valid")
        .0;
    let ttl = std::time::Duration::from_secs(3600);
    let mut e = Engine::new(routing, ttl, Snapshot::default(), t0());
    // shop/web crash-loops on a and b: BackOff digests, their fleet alert; on c, alone
    let backoff = |c: &str| {
        let mut d = coredns_unhealthy(c, 4, t0());
        d.id = format!("backoff-{c}");
        d.reason = "BackOff".into();
        d.object.namespace = Some("shop".into());
        d.object.name = "web-*".into();
        d
    };
    for c in ["a", "b", "c"] {
        e.on_digest(&backoff(c), t0(), t0(), ttl);
    }
    let members = [("a", "backoff-a"), ("b", "backoff-b")];
    let mut f = fleet_of("f-backoff", "event", &members, 1, None);
    f.labels.insert("alertname".into(), "BackOff".into());
    f.labels.insert("namespace".into(), "shop".into());
    e.on_fleet_incident(&f, t0());
    // what is notified, as `alertname@cluster/namespace`
    let mut alerts = Vec::new();
    let mut notified = |e: &mut Engine, from: DateTime<Utc>, to: DateTime<Utc>| {
        let mut now = from;
        while now <= to {
            for d in e.tick(now) {
                for p in &d.pending {
                    for a in &p.notification.alerts {
                        let l = |k: &str| a.labels.get(k).map_or("", String::as_str).to_string();
                        alerts.push(format!(
                            "{}@{}/{}",
                            l("alertname"),
                            l("cluster"),
                            l("namespace")
                        ));
                    }
                }
            }
            now += secs(10);
        }
    };
    notified(&mut e, t0(), t0() + mins(5));
    // Prometheus' rule fires on the same pods a few minutes later, and on another namespace's on a
    for spec in [
        "alertname=PodCrashLooping,cluster=a,namespace=shop,pod=web-1,severity=warning",
        "alertname=PodCrashLooping,cluster=b,namespace=shop,pod=web-2,severity=warning",
        "alertname=PodCrashLooping,cluster=c,namespace=shop,pod=web-3,severity=warning",
        // no BackOff alert beside it (its events not yet digested): it pages
        "alertname=PodCrashLooping,cluster=a,namespace=billing,pod=api-1,severity=warning",
    ] {
        post(&mut e, spec, t0() + mins(6));
    }
    notified(&mut e, t0() + mins(6), t0() + mins(30));
    alerts.sort();
    assert_eq!(
        alerts,
        vec![
            "BackOff@/shop",
            "BackOff@c/shop",
            "PodCrashLooping@a/billing"
        ]
    );
}

#[test]
fn with_members_paged_too_a_receiver_of_fleet_alerts_is_still_told_the_failure_spread() {
    let mut e = engine_routed(|r| r.mute_fleet_members = false);
    let firing = one("ops", &["cni-degraded@:firing"]);
    assert_eq!(
        cni_spreading(&mut e),
        vec![
            (t0() + secs(30), firing.clone()),
            (t0() + secs(330), firing.clone()),
            (t0() + secs(30 * 60 + 30), firing),
        ]
    );
}

/// A node-not-ready incident on `cluster` (its alert's id `node-<cluster>`), resolved at `resolved`.
fn node_not_ready(cluster: &str, rev: u64, resolved: Option<DateTime<Utc>>) -> Incident {
    let status = match resolved {
        Some(_) => IncidentStatus::Resolved,
        None => IncidentStatus::Open,
    };
    Incident {
        id: format!("node-{cluster}"),
        cluster: cluster.into(),
        revision: rev,
        ..incident(rev, status, resolved.unwrap_or(t0()))
    }
}

/// An engine of the shipped routing (`alerts.yaml`), at `t0`.
fn engine_shipped() -> Engine {
    let routing = Routing::parse(crate::config::DEFAULT_ROUTING, "alerts.yaml")
        .expect("the shipped routing is valid")
        .0;
    Engine::new(
        routing,
        std::time::Duration::from_secs(3600),
        Snapshot::default(),
        t0(),
    )
}

/// What ticking `e` every 10 s from `from` to `to` notified as firing, as `MMmSS alertname@cluster/node/severity`.
fn firing_from(e: &mut Engine, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<String> {
    let mut out = Vec::new();
    let mut now = from;
    while now <= to {
        let at = now - t0();
        let at = format!("{:02}m{:02}", at.num_minutes(), at.num_seconds() % 60);
        for d in e.tick(now) {
            for p in &d.pending {
                for a in &p.notification.alerts {
                    if a.state != AlertState::Firing {
                        continue;
                    }
                    let l = |k: &str| a.labels.get(k).map_or("", String::as_str).to_string();
                    out.push(format!(
                        "{at} {}@{}/{}/{}",
                        l("alertname"),
                        l("cluster"),
                        l("node"),
                        l("severity")
                    ));
                }
            }
        }
        now += secs(10);
    }
    out
}

/// What mutes the posted alert `spec` at `now`.
fn inhibitors(e: &Engine, spec: &str, now: DateTime<Utc>) -> Vec<String> {
    let id = fingerprint(&labels(spec));
    e.alerts(now)
        .into_iter()
        .find(|v| v.alert.id == id)
        .map(|v| v.muted.inhibited_by)
        .unwrap_or_default()
}

#[test]
fn with_the_shipped_routing_a_node_lost_pages_as_its_incident_not_also_as_prometheus_rule() {
    let mut e = engine_shipped();
    // a node lost on a and on b: their incidents, their fleet alert
    for c in ["a", "b"] {
        e.on_incident(&node_not_ready(c, 1, None), t0());
    }
    let members = [("a", "node-a"), ("b", "node-b")];
    e.on_fleet_incident(
        &fleet_of("f-node", "node-not-ready", &members, 1, None),
        t0(),
    );
    let mut log = firing_from(&mut e, t0(), t0() + mins(5));
    // the rules fire 5 minutes later (`for: 5m`): the shipped one and kube-prometheus' on a's and b's nodes,
    // muted; the shipped one on c, where no incident is open; on a, a rule of the user's own calling the node
    // critical, and one of no known severity, neither muted by a warning incident
    let rule = |name: &str, c: &str, node: &str, sev: &str| {
        format!("alertname={name},cluster={c},node={node},severity={sev}")
    };
    let at = t0() + mins(5) + secs(5);
    for spec in [
        rule("NodeNotReady", "a", "n1", "warning"),
        rule("KubeNodeNotReady", "a", "n1", "Warning"),
        rule("NodeNotReady", "b", "n2", "warning"),
        rule("NodeNotReady", "c", "n3", "warning"),
        rule("KubeNodeNotReady", "a", "n1", "critical"),
        rule("KubeNodeNotReady", "a", "n1", "page"),
    ] {
        post(&mut e, &spec, at);
    }
    log.extend(firing_from(&mut e, at, t0() + mins(20) - secs(5)));
    let a_n1 = rule("NodeNotReady", "a", "n1", "warning");
    assert_eq!(inhibitors(&e, &a_n1, t0() + mins(10)), ["f-node", "node-a"]);
    // both incidents end at 20m; a's rules see it at 21m (within the hold: never paged); b's rule goes on
    // firing (the node still out, say, where the probe no longer looks) and pages once the hold is over
    let end = t0() + mins(20);
    for c in ["a", "b"] {
        e.on_incident(&node_not_ready(c, 2, Some(end)), end);
    }
    e.on_fleet_incident(
        &fleet_of("f-node", "node-not-ready", &members, 2, Some(end)),
        end,
    );
    log.extend(firing_from(&mut e, end, end + mins(1)));
    assert_eq!(inhibitors(&e, &a_n1, end + mins(1)), ["node-a"]);
    for sev in ["Warning", "critical", "page"] {
        resolve(
            &mut e,
            &rule("KubeNodeNotReady", "a", "n1", sev),
            at,
            end + mins(1),
        );
    }
    resolve(&mut e, &a_n1, at, end + mins(1));
    // a rule on b that fires after the incident ended (Prometheus' `startsAt`: when it fired): news, hold
    // or not (its group is new: flushed at 21m40, within the hold)
    let n9 = rule("KubeNodeNotReady", "b", "n9", "warning");
    post(&mut e, &n9, end + mins(1) + secs(5));
    log.extend(firing_from(
        &mut e,
        end + mins(1) + secs(10),
        end + mins(40),
    ));
    log.sort();
    assert_eq!(
        log,
        [
            "00m30 node-not-ready@//critical",
            "05m35 KubeNodeNotReady@a/n1/critical",
            "05m35 KubeNodeNotReady@a/n1/page",
            "05m35 NodeNotReady@c/n3/warning",
            "21m40 KubeNodeNotReady@b/n9/warning",
            // b's group flushed at 20m40 within the hold, at its next flush once it was over
            "25m40 NodeNotReady@b/n2/warning",
        ]
    );
}

#[test]
fn the_hold_after_an_incident_counts_from_when_the_router_learned_it_ended() {
    let mut e = engine_shipped();
    e.on_incident(&node_not_ready("a", 1, None), t0());
    let spec = "alertname=NodeNotReady,cluster=a,node=n1,severity=warning";
    post(&mut e, spec, t0() + mins(5));
    let mut log = firing_from(&mut e, t0(), t0() + mins(14) - secs(10));
    // it ended at 10m by the cluster's clock; the router hears of it at 14m (a clock behind, a backlog):
    // muted until 17m, not 13m
    let end = t0() + mins(10);
    e.on_incident(&node_not_ready("a", 2, Some(end)), t0() + mins(14));
    log.extend(firing_from(&mut e, t0() + mins(14), t0() + mins(30)));
    assert_eq!(
        log,
        [
            "00m30 node-not-ready@a//warning",
            // its group flushed at 15m30 within the hold (at 13m it would have paged)
            "20m30 NodeNotReady@a/n1/warning"
        ]
    );
}
