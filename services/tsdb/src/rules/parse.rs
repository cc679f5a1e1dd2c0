//! Rule files in Prometheus' format (`groups: [{name, interval, rules: [{record|alert, expr, for,
//! keep_firing_for, labels, annotations}]}]`), checked as `promtool check rules` does: a bad file is refused
//! with the file, group and rule named.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::eval::{Group, Kind, Rule};
use super::template::{template_env, translate_template};
use super::{Error, Result};
use crate::promql;
use crate::store::METRIC_NAME;

/// A rule file as Prometheus writes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDef {
    groups: Vec<GroupDef>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupDef {
    name: String,
    #[serde(default)]
    interval: Option<String>,
    #[serde(default)]
    query_offset: Option<String>,
    #[serde(default)]
    limit: Option<u64>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    rules: Vec<RuleDef>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleDef {
    #[serde(default)]
    record: Option<String>,
    #[serde(default)]
    alert: Option<String>,
    expr: serde_yaml::Value,
    #[serde(default, rename = "for")]
    for_: Option<String>,
    #[serde(default)]
    keep_firing_for: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// Prometheus' duration syntax: `1h30m`, `5m`, `90s`, `500ms`, `1d`, `1w`, `1y`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0u64;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let ms = match &rest[..unit] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "y" => 365 * 86_400_000,
            _ => return None,
        };
        total = total.checked_add(n.checked_mul(ms)?)?;
        rest = &rest[unit..];
    }
    Some(Duration::from_millis(total))
}

fn is_metric_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parses and checks one rule file's text.
pub fn parse_file(file: &Path, text: &str, default_interval: Duration) -> Result<Vec<Group>> {
    let def: FileDef = serde_yaml::from_str(text).map_err(|e| Error::Yaml {
        file: file.to_path_buf(),
        message: e.to_string(),
    })?;
    let env = template_env();
    let mut names = HashSet::new();
    let mut groups = Vec::new();
    for g in def.groups {
        let group_err = |reason: String| Error::Group {
            file: file.to_path_buf(),
            group: g.name.clone(),
            reason,
        };
        if g.name.is_empty() {
            return Err(group_err("group name must not be empty".into()));
        }
        if !names.insert(g.name.clone()) {
            return Err(group_err("repeated in the same file".into()));
        }
        let interval = match &g.interval {
            Some(s) => match parse_duration(s) {
                Some(d) if !d.is_zero() => d,
                _ => return Err(group_err(format!("invalid interval {s:?}"))),
            },
            None => default_interval,
        };
        if let Some(s) = &g.query_offset
            && parse_duration(s).is_none()
        {
            return Err(group_err(format!("invalid query_offset {s:?}")));
        }
        let _ = g.limit;
        let mut rules = Vec::new();
        for (i, r) in g.rules.into_iter().enumerate() {
            let name = r.record.clone().or(r.alert.clone()).unwrap_or_default();
            let err = |reason: String| Error::Rule {
                file: file.to_path_buf(),
                group: g.name.clone(),
                index: i + 1,
                name: name.clone(),
                reason,
            };
            let expr = match &r.expr {
                serde_yaml::Value::String(s) => s.clone(),
                serde_yaml::Value::Number(n) => n.to_string(),
                _ => return Err(err("field 'expr' must be a string".into())),
            };
            if expr.trim().is_empty() {
                return Err(err("field 'expr' must be set in rule".into()));
            }
            promql::parse(&expr).map_err(|e| err(format!("could not parse expression: {e}")))?;
            let mut labels = g.labels.clone();
            labels.extend(r.labels.clone());
            for k in labels.keys() {
                if !is_label_name(k) || k == METRIC_NAME {
                    return Err(err(format!("invalid label name: {k}")));
                }
            }
            let kind = match (r.record, r.alert) {
                (Some(_), Some(_)) => {
                    return Err(err("only one of 'record' and 'alert' must be set".into()));
                }
                (None, None) => {
                    return Err(err("one of 'record' or 'alert' must be set".into()));
                }
                (Some(record), None) => {
                    if !is_metric_name(&record) {
                        return Err(err(format!("invalid recording rule name: {record}")));
                    }
                    if !r.annotations.is_empty() {
                        return Err(err("invalid field 'annotations' in recording rule".into()));
                    }
                    if r.for_.is_some() {
                        return Err(err("invalid field 'for' in recording rule".into()));
                    }
                    if r.keep_firing_for.is_some() {
                        return Err(err(
                            "invalid field 'keep_firing_for' in recording rule".into()
                        ));
                    }
                    Kind::Recording { record }
                }
                (None, Some(alert)) => {
                    if alert.is_empty() {
                        return Err(err("invalid alert name: empty".into()));
                    }
                    let dur = |field: &str, v: &Option<String>| match v {
                        None => Ok(Duration::ZERO),
                        Some(s) => parse_duration(s)
                            .ok_or_else(|| err(format!("invalid duration in '{field}': {s:?}"))),
                    };
                    let hold = dur("for", &r.for_)?;
                    let keep_firing_for = dur("keep_firing_for", &r.keep_firing_for)?;
                    for (k, t) in r.annotations.iter().chain(labels.iter()) {
                        if !is_label_name(k) {
                            return Err(err(format!("invalid annotation name: {k}")));
                        }
                        let src = translate_template(t)
                            .map_err(|e| err(format!("template of {k:?}: {e}")))?;
                        env.template_from_str(&src)
                            .map_err(|e| err(format!("template of {k:?}: {e}")))?;
                    }
                    Kind::Alerting {
                        alert,
                        hold,
                        keep_firing_for,
                        annotations: r.annotations,
                        active: BTreeMap::new(),
                    }
                }
            };
            rules.push(Rule {
                expr,
                labels,
                kind,
                last_error: None,
                last_evaluation: None,
                evaluation_time: Duration::ZERO,
                written: Default::default(),
            });
        }
        groups.push(Group {
            file: file.to_path_buf(),
            name: g.name,
            interval,
            rules,
            last_evaluation: None,
            evaluation_time: Duration::ZERO,
            restored: false,
            evaluations: 0,
        });
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_prometheus() {
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("m"), None);
    }
}
