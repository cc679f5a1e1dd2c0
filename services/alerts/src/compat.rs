//! Alertmanager's own `alertmanager.yml`, as people have it, read into the router's routing file: what the
//! router supports is taken over (the deprecated `match` / `match_re` and `source_match*` / `target_match*`
//! become matchers, `global.slack_api_url` fills Slack receivers' `api_url`), and what it does not is taken
//! out and named in one note each — integrations it does not have, Go template files, `http_config` — so
//! such a file loads with a clear account instead of a parse error. (Time intervals it has: the older
//! top-level `mute_time_intervals` list is read into `time_intervals`.)
//!
//! Works on the YAML tree before it is decoded; anything neither Alertmanager nor the router knows stays
//! in, so the decoder still names a misspelt key.

use std::collections::BTreeMap;

use serde_yaml::{Mapping, Value};

use crate::config::ConfigError;

/// The integrations a receiver can have in the router.
const INTEGRATIONS: &[&str] = &[
    "webhook_configs",
    "alertmanager_configs",
    "slack_configs",
    "nats_configs",
];

/// What the router does with each Alertmanager webhook setting it does not have.
const WEBHOOK_UNUSED: &[&str] = &["http_config", "url_file", "timeout"];

/// The Slack settings the router has; the others are Alertmanager's message templates and options.
const SLACK_KEYS: &[&str] = &["api_url", "channel", "send_resolved"];

/// Rewrites an Alertmanager-shaped tree in place into the router's routing file; returns the notes.
pub fn adapt(doc: &mut Value) -> Result<Vec<String>, ConfigError> {
    let mut notes = Vec::new();
    let Some(top) = doc.as_mapping_mut() else {
        return Ok(notes);
    };
    let global = top.remove("global");
    let slack_api_url = global
        .as_ref()
        .and_then(|g| g.get("slack_api_url"))
        .and_then(Value::as_str)
        .map(str::to_string);
    if let Some(g) = global.as_ref().and_then(Value::as_mapping) {
        let unused: Vec<String> = keys(g)
            .into_iter()
            .filter(|k| k != "slack_api_url")
            .collect();
        if !unused.is_empty() {
            notes.push(format!(
                "global: {} not used (the router's `alerts.resolve_timeout` in the hub config is its \
                 resolve_timeout; the others belong to integrations it does not have)",
                unused.join(", ")
            ));
        }
    }
    // Alertmanager's `templates:` is a list of Go template files; the router's is {title, text}
    if top.get("templates").is_some_and(Value::is_sequence) {
        let files = top.remove("templates").unwrap_or_default();
        notes.push(format!(
            "templates: the Go template files {} are not read: the router renders titles and texts with \
             its own `templates: {{title, text}}` (minijinja)",
            compact(&files)
        ));
    }
    // Alertmanager's older name for the same list: read into `time_intervals`
    if let Some(Value::Sequence(old)) = top.remove("mute_time_intervals") {
        match top.get_mut("time_intervals") {
            Some(Value::Sequence(list)) => list.extend(old),
            _ => {
                top.insert("time_intervals".into(), Value::Sequence(old));
            }
        }
    }
    if let Some(route) = top.get_mut("route") {
        adapt_route(route, "route")?;
    }
    if let Some(Value::Sequence(rules)) = top.get_mut("inhibit_rules") {
        for (i, rule) in rules.iter_mut().enumerate() {
            if let Some(m) = rule.as_mapping_mut() {
                for side in ["source", "target"] {
                    fold_matchers(m, side, &format!("inhibit_rules[{i}]"))?;
                }
            }
        }
    }
    if let Some(Value::Sequence(receivers)) = top.get_mut("receivers") {
        for r in receivers.iter_mut() {
            adapt_receiver(r, slack_api_url.as_deref(), &mut notes)?;
        }
    }
    Ok(notes)
}

fn adapt_route(route: &mut Value, at: &str) -> Result<(), ConfigError> {
    let Some(m) = route.as_mapping_mut() else {
        return Ok(());
    };
    fold_matchers(m, "", at)?;
    if let Some(Value::Sequence(children)) = m.get_mut("routes") {
        for (i, c) in children.iter_mut().enumerate() {
            adapt_route(c, &format!("{at}.routes[{i}]"))?;
        }
    }
    Ok(())
}

/// `match: {a: b}` → `matchers: ['a="b"']`, `match_re: {a: b}` → `a=~"b"` (with `side` `source` or
/// `target`: an inhibition rule's `source_match` etc.).
fn fold_matchers(m: &mut Mapping, side: &str, at: &str) -> Result<(), ConfigError> {
    let prefix = if side.is_empty() {
        String::new()
    } else {
        format!("{side}_")
    };
    let mut extra = Vec::new();
    for (key, op) in [("match", "="), ("match_re", "=~")] {
        let key = format!("{prefix}{key}");
        let Some(v) = m.remove(key.as_str()) else {
            continue;
        };
        let pairs: BTreeMap<String, Value> = serde_yaml::from_value(v)
            .map_err(|e| ConfigError(format!("{at}: {key} must be a map of labels: {e}")))?;
        for (name, value) in pairs {
            let value = match value {
                Value::String(s) => s,
                other => compact(&other),
            };
            let quoted = serde_json::to_string(&value).unwrap_or_default();
            extra.push(Value::String(format!("{name}{op}{quoted}")));
        }
    }
    if extra.is_empty() {
        return Ok(());
    }
    let key = Value::String(format!("{prefix}matchers"));
    match m.get_mut(&key) {
        Some(Value::Sequence(s)) => s.extend(extra),
        _ => {
            m.insert(key, Value::Sequence(extra));
        }
    }
    Ok(())
}

fn adapt_receiver(
    r: &mut Value,
    slack_api_url: Option<&str>,
    notes: &mut Vec<String>,
) -> Result<(), ConfigError> {
    let Some(m) = r.as_mapping_mut() else {
        return Ok(());
    };
    let name = m
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string();
    let unsupported: Vec<String> = keys(m)
        .into_iter()
        .filter(|k| k.ends_with("_configs") && !INTEGRATIONS.contains(&k.as_str()))
        .collect();
    for k in &unsupported {
        m.remove(k.as_str());
    }
    if !unsupported.is_empty() {
        let left = INTEGRATIONS.iter().any(|k| {
            m.get(*k)
                .and_then(Value::as_sequence)
                .is_some_and(|s| !s.is_empty())
        });
        notes.push(format!(
            "receiver {name}: {} not supported by the router: {} (an `alertmanager_configs` entry can \
             hand its alerts to an Alertmanager that has them)",
            unsupported.join(", "),
            if left {
                "the rest of the receiver is used"
            } else {
                "nothing is sent to this receiver"
            }
        ));
    }
    if let Some(Value::Sequence(hooks)) = m.get_mut("webhook_configs") {
        for (i, h) in hooks.iter_mut().enumerate() {
            let Some(h) = h.as_mapping_mut() else {
                continue;
            };
            let dropped: Vec<String> = WEBHOOK_UNUSED
                .iter()
                .filter(|k| h.remove(**k).is_some())
                .map(|k| k.to_string())
                .collect();
            if !dropped.is_empty() {
                notes.push(format!(
                    "receiver {name} webhook_configs[{i}]: {} not supported: sent without",
                    dropped.join(", ")
                ));
            }
        }
    }
    if let Some(Value::Sequence(slacks)) = m.get_mut("slack_configs") {
        for (i, s) in slacks.iter_mut().enumerate() {
            let Some(s) = s.as_mapping_mut() else {
                continue;
            };
            let dropped: Vec<String> = keys(s)
                .into_iter()
                .filter(|k| !SLACK_KEYS.contains(&k.as_str()))
                .collect();
            for k in &dropped {
                s.remove(k.as_str());
            }
            if !dropped.is_empty() {
                notes.push(format!(
                    "receiver {name} slack_configs[{i}]: {} not used (the receiver's `templates` render \
                     the message)",
                    dropped.join(", ")
                ));
            }
            if s.get("api_url").is_none() {
                match slack_api_url {
                    Some(u) => {
                        s.insert("api_url".into(), u.into());
                    }
                    None => {
                        return Err(ConfigError(format!(
                            "receiver {name} slack_configs[{i}]: no api_url, and no global.slack_api_url"
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

fn keys(m: &Mapping) -> Vec<String> {
    m.keys()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

/// A YAML value on one line.
fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use crate::config::Routing;

    /// An alertmanager.yml as people have it (the shape of Alertmanager's own example configuration).
    const AM: &str = r#"
global:
  resolve_timeout: 5m
  smtp_smarthost: 'localhost:25'
  smtp_from: 'alertmanager@example.org'
  slack_api_url: 'https://hooks.slack.com/services/T000/B000/XXX'
templates:
  - '/etc/alertmanager/template/*.tmpl'
route:
  group_by: ['alertname', 'cluster', 'service']
  group_wait: 30s
  group_interval: 5m
  repeat_interval: 3h
  receiver: team-X-mails
  routes:
    - match_re:
        service: ^(foo1|foo2|baz)$
      receiver: team-X-mails
      routes:
        - match:
            severity: critical
          receiver: team-X-pager
          mute_time_intervals: [offhours]
    - match:
        service: database
      matchers: ['owner="team-Y"']
      receiver: team-DB-pager
      group_by: [alertname, cluster, database]
inhibit_rules:
  - source_match:
      severity: 'critical'
    target_match_re:
      severity: 'warning|info'
    equal: ['alertname', 'cluster', 'service']
receivers:
  - name: 'team-X-mails'
    email_configs:
      - to: 'team-X+alerts@example.org'
  - name: 'team-X-pager'
    email_configs:
      - to: 'team-X+alerts-critical@example.org'
    pagerduty_configs:
      - service_key: <team-X-key>
    slack_configs:
      - channel: '#pager'
        title: '{{ template "slack.title" . }}'
  - name: 'team-DB-pager'
    webhook_configs:
      - url: 'http://hooks.example/db'
        http_config: {bearer_token: secret}
time_intervals:
  - name: offhours
    time_intervals:
      - times: [{start_time: '18:00', end_time: '24:00'}]
"#;

    #[test]
    fn an_alertmanager_file_as_people_have_it_loads_and_what_is_left_out_is_named() {
        let (r, notes) = Routing::parse(AM, "alertmanager.yml").unwrap();
        let all = notes.join("\n");
        for said in [
            "global: resolve_timeout, smtp_smarthost, smtp_from not used",
            "templates: the Go template files [\"/etc/alertmanager/template/*.tmpl\"] are not read",
            "receiver team-X-mails: email_configs not supported by the router: nothing is sent",
            "receiver team-X-pager: email_configs, pagerduty_configs not supported by the router: the rest",
            "receiver team-X-pager slack_configs[0]: title not used",
            "receiver team-DB-pager webhook_configs[0]: http_config not supported",
        ] {
            assert!(all.contains(said), "{said:?} not in:\n{all}");
        }
        // what is supported works: match / match_re as matchers, in the tree as Alertmanager builds it
        let t = crate::route::Tree::new(&r.route);
        let at = |kv: &[(&str, &str)]| {
            let l = kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            t.matches(&l)
                .into_iter()
                .map(|i| t.node(i).receiver.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            at(&[("service", "foo1"), ("severity", "critical")]),
            ["team-X-pager"]
        );
        assert_eq!(at(&[("service", "foo1")]), ["team-X-mails"]);
        assert_eq!(
            at(&[("service", "database"), ("owner", "team-Y")]),
            ["team-DB-pager"]
        );
        assert_eq!(at(&[("service", "database")]), ["team-X-mails"]);
        // its time interval is the router's too
        assert_eq!(r.time_intervals[0].name, "offhours");
        assert_eq!(
            r.route.routes[0].routes[0].mute_time_intervals,
            ["offhours"]
        );
        let slack = &r.receiver("team-X-pager").unwrap().slack_configs[0];
        assert_eq!(
            slack.api_url,
            "https://hooks.slack.com/services/T000/B000/XXX"
        );
        let rule = &r.inhibit_rules[0];
        assert_eq!(rule.source_matchers[0].to_string(), "severity=\"critical\"");
        assert_eq!(
            rule.target_matchers[0].to_string(),
            "severity=~\"warning|info\""
        );
    }

    #[test]
    fn what_neither_knows_is_still_an_error() {
        let bad = "route: {receiver: a, gruop_by: [x]}\nreceivers: [{name: a}]";
        assert!(
            Routing::parse(bad, "f")
                .unwrap_err()
                .to_string()
                .contains("unknown field `gruop_by`")
        );
        let no_url = "route: {receiver: a}\nreceivers: [{name: a, slack_configs: [{channel: x}]}]";
        assert!(
            Routing::parse(no_url, "f")
                .unwrap_err()
                .to_string()
                .contains("no global.slack_api_url")
        );
    }
}
