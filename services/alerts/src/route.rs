//! The route tree, resolved: every node carries its inherited receiver, grouping and timings, and an alert's
//! labels find the nodes that take it with Alertmanager's rules (depth first; the first matching child wins
//! unless it says `continue`; a node none of whose children match takes the alert itself).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::Route;
use crate::matcher::{Matcher, all_match};

/// How a node groups its alerts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupBy {
    /// By these labels (empty: one group for everything).
    Labels(Vec<String>),
    /// By every label (`group_by: ['...']`): one group per alert.
    All,
}

/// One resolved node.
#[derive(Debug, Clone)]
pub struct Node {
    /// Path in the tree, e.g. `0/1/0` (unique: part of the router's own group key).
    pub id: String,
    /// Alertmanager's route key: the matchers of each node from the root down, e.g.
    /// `{}/{team="db"}` (not unique in general; part of the `groupKey` receivers see).
    pub key: String,
    /// Receiver.
    pub receiver: String,
    /// Grouping.
    pub group_by: GroupBy,
    /// First-notification delay of a new group.
    pub group_wait: Duration,
    /// Delay between notifications about a group's changes.
    pub group_interval: Duration,
    /// Delay before an unchanged notification is sent again.
    pub repeat_interval: Duration,
    /// Time intervals during which it sends nothing (its own, not inherited, as in Alertmanager).
    pub mute_time_intervals: Vec<String>,
    /// Time intervals outside which it sends nothing (its own, not inherited).
    pub active_time_intervals: Vec<String>,
    matchers: Vec<Matcher>,
    continue_: bool,
    children: Vec<usize>,
}

/// The resolved tree.
#[derive(Debug, Clone)]
pub struct Tree {
    nodes: Vec<Node>,
}

impl Tree {
    /// Resolves a route tree (defaults as in Alertmanager: group_wait 30 s, group_interval 5 m,
    /// repeat_interval 4 h, no grouping labels).
    pub fn new(root: &Route) -> Tree {
        let mut t = Tree { nodes: Vec::new() };
        let defaults = Node {
            id: "0".into(),
            key: String::new(),
            receiver: root.receiver.clone().unwrap_or_default(),
            group_by: GroupBy::Labels(Vec::new()),
            group_wait: Duration::from_secs(30),
            group_interval: Duration::from_secs(300),
            repeat_interval: Duration::from_secs(4 * 3600),
            mute_time_intervals: Vec::new(),
            active_time_intervals: Vec::new(),
            matchers: Vec::new(),
            continue_: false,
            children: Vec::new(),
        };
        t.add(root, &defaults, "0".into(), true);
        t
    }

    fn add(&mut self, r: &Route, parent: &Node, id: String, root: bool) -> usize {
        let matchers = if root { Vec::new() } else { r.matchers.clone() };
        let node = Node {
            id: id.clone(),
            key: if root {
                matchers_key(&matchers)
            } else {
                format!("{}/{}", parent.key, matchers_key(&matchers))
            },
            receiver: r
                .receiver
                .clone()
                .unwrap_or_else(|| parent.receiver.clone()),
            // as Alertmanager: labels given replace the parent's; `['...']` groups by all; absent or
            // `[]` inherits the parent's grouping (labels, or all)
            group_by: match &r.group_by {
                Some(l) if l.iter().any(|x| x == "...") => GroupBy::All,
                Some(l) if !l.is_empty() => GroupBy::Labels(l.clone()),
                _ => parent.group_by.clone(),
            },
            group_wait: r.group_wait.unwrap_or(parent.group_wait),
            group_interval: r.group_interval.unwrap_or(parent.group_interval),
            repeat_interval: r.repeat_interval.unwrap_or(parent.repeat_interval),
            mute_time_intervals: r.mute_time_intervals.clone(),
            active_time_intervals: r.active_time_intervals.clone(),
            matchers,
            continue_: r.continue_,
            children: Vec::new(),
        };
        let me = self.nodes.len();
        self.nodes.push(node.clone());
        for (i, c) in r.routes.iter().enumerate() {
            let child = self.add(c, &node, format!("{id}/{i}"), false);
            self.nodes[me].children.push(child);
        }
        me
    }

    /// A node.
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// The nodes that take an alert with these labels.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> Vec<usize> {
        let mut out = Vec::new();
        self.walk(0, labels, &mut out);
        out
    }

    fn walk(&self, i: usize, labels: &BTreeMap<String, String>, out: &mut Vec<usize>) -> bool {
        let n = &self.nodes[i];
        if !all_match(&n.matchers, labels) {
            return false;
        }
        let mut any = false;
        for &c in &n.children {
            if self.walk(c, labels, out) {
                any = true;
                if !self.nodes[c].continue_ {
                    break;
                }
            }
        }
        if !any {
            out.push(i);
        }
        true
    }

    /// The group an alert falls into at a node.
    pub fn group_of(&self, i: usize, labels: &BTreeMap<String, String>, alert_id: &str) -> Grouped {
        let group_labels = self.group_labels(i, labels);
        Grouped {
            key: self.group_id(i, labels, alert_id),
            group_key: format!("{}:{}", self.nodes[i].key, label_set(&group_labels)),
            labels: group_labels,
        }
    }

    /// [`Grouped::key`] alone: what finds an alert's group once it exists (the router places an alert on
    /// every revision; the rest of [`Tree::group_of`] is made only for a new group).
    pub fn group_id(&self, i: usize, labels: &BTreeMap<String, String>, alert_id: &str) -> String {
        let n = &self.nodes[i];
        let mut key = String::with_capacity(64);
        key.push_str(&n.id);
        key.push_str(":{");
        let mut first = true;
        let mut push = |k: &str, v: &str| {
            if !first {
                key.push(',');
            }
            first = false;
            key.push_str(k);
            key.push('=');
            // a JSON string: as is when nothing needs escaping (the usual case), else as serde_json writes it
            if v.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
                key.push_str(&serde_json::to_string(v).unwrap_or_default());
            } else {
                key.push('"');
                key.push_str(v);
                key.push('"');
            }
        };
        match &n.group_by {
            GroupBy::All => labels.iter().for_each(|(k, v)| push(k, v)),
            GroupBy::Labels(names) => {
                // in label-name order, as the map of the group's labels iterates
                let mut names: Vec<&String> = names.iter().collect();
                names.sort_unstable();
                names.dedup();
                for k in names {
                    if let Some(v) = labels.get(k) {
                        push(k, v);
                    }
                }
            }
        }
        key.push('}');
        if n.group_by == GroupBy::All {
            key.push('#');
            key.push_str(alert_id);
        }
        key
    }

    /// The grouping labels an alert has at a node.
    fn group_labels(
        &self,
        i: usize,
        labels: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        match &self.nodes[i].group_by {
            GroupBy::All => labels.clone(),
            GroupBy::Labels(names) => names
                .iter()
                .filter_map(|k| labels.get(k).map(|v| (k.clone(), v.clone())))
                .collect(),
        }
    }
}

/// The group an alert falls into at a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grouped {
    /// The router's key: node path and grouping label values (unique per group).
    pub key: String,
    /// Alertmanager's `groupKey`: the route key, then the group's labels, e.g.
    /// `{}/{team="db"}:{alertname="DiskPressure", cluster="dev-1"}` (receivers deduplicate by it).
    pub group_key: String,
    /// The grouping labels and their values.
    pub labels: BTreeMap<String, String>,
}

/// A node's matchers as Alertmanager writes them in a route key: sorted by name, value, then type,
/// `{a="1",b=~"x|y"}`, values escaped as OpenMetrics does (backslash, newline, double quote).
fn matchers_key(ms: &[Matcher]) -> String {
    let mut ms: Vec<&Matcher> = ms.iter().collect();
    ms.sort_by(|a, b| (&a.name, &a.value, a.op.as_str()).cmp(&(&b.name, &b.value, b.op.as_str())));
    let parts: Vec<String> = ms
        .iter()
        .map(|m| {
            let v = m
                .value
                .replace('\\', "\\\\")
                .replace('\n', "\\n")
                .replace('"', "\\\"");
            format!("{}{}\"{v}\"", m.name, m.op.as_str())
        })
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// A label set as Prometheus' `LabelSet.String()` writes it: sorted, `{a="1", b="2"}`, each value quoted
/// as Go's `strconv.Quote` does.
fn label_set(labels: &BTreeMap<String, String>) -> String {
    let parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect();
    format!("{{{}}}", parts.join(", "))
}

/// `strconv.Quote`: printable characters as they are, the usual escapes, `\xHH` for other bytes below
/// 0x80 and `\uHHHH` for the other control characters.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            // the other control characters (C1): Go prints no other non-printable ones in label values
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Routing;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const YAML: &str = r#"
route:
  receiver: default
  group_by: [cluster]
  group_wait: 10s
  routes:
    - matchers: ['severity="critical"']
      receiver: pager
      group_wait: 1s
      continue: true
    - matchers: ['env=~"prod|staging"']
      receiver: team
      group_by: [cluster, alertname]
      routes:
        - matchers: ['team="gpu"']
          receiver: gpu
receivers: [{name: default}, {name: pager}, {name: team}, {name: gpu}]
"#;

    fn receivers(t: &Tree, l: &BTreeMap<String, String>) -> Vec<String> {
        t.matches(l)
            .into_iter()
            .map(|i| t.node(i).receiver.clone())
            .collect()
    }

    #[test]
    fn routes_like_alertmanager() {
        let r: Routing = serde_yaml::from_str(YAML).unwrap();
        r.validate().unwrap();
        let t = Tree::new(&r.route);
        // nothing matches a child: the root takes it
        assert_eq!(receivers(&t, &labels(&[("env", "dev")])), ["default"]);
        // critical continues to the next sibling
        assert_eq!(
            receivers(&t, &labels(&[("severity", "critical"), ("env", "prod")])),
            ["pager", "team"]
        );
        // without continue, the first match wins
        assert_eq!(
            receivers(&t, &labels(&[("env", "prod"), ("team", "gpu")])),
            ["gpu"]
        );
        // critical alone: pager matched (continue) but no sibling did; the root does not take it again
        assert_eq!(
            receivers(&t, &labels(&[("severity", "critical")])),
            ["pager"]
        );
        // inherited settings
        let gpu = t.matches(&labels(&[("env", "prod"), ("team", "gpu")]))[0];
        assert_eq!(t.node(gpu).group_wait, Duration::from_secs(10));
        assert_eq!(
            t.node(gpu).group_by,
            GroupBy::Labels(vec!["cluster".into(), "alertname".into()])
        );
        let g = t.group_of(
            gpu,
            &labels(&[("cluster", "a"), ("alertname", "x"), ("team", "gpu")]),
            "id",
        );
        assert_eq!(g.key, "0/1/0:{alertname=\"x\",cluster=\"a\"}");
        assert_eq!(
            g.group_key,
            r#"{}/{env=~"prod|staging"}/{team="gpu"}:{alertname="x", cluster="a"}"#
        );
        assert_eq!(g.labels.len(), 2);
    }

    #[test]
    fn group_by_is_inherited_as_alertmanager_does() {
        let r: Routing = serde_yaml::from_str(
            r#"
route:
  receiver: default
  group_by: [cluster]
  routes:
    - matchers: ['a="1"']
      group_by: []
    - matchers: ['a="2"']
      group_by: ['...']
      routes:
        - matchers: ['b="1"']
        - matchers: ['b="2"']
          group_by: [alertname]
receivers: [{name: default}]
"#,
        )
        .unwrap();
        r.validate().unwrap();
        let t = Tree::new(&r.route);
        let by = |kv: &[(&str, &str)]| t.node(t.matches(&labels(kv))[0]).group_by.clone();
        let cluster = GroupBy::Labels(vec!["cluster".into()]);
        assert_eq!(by(&[("a", "1")]), cluster, "`[]` inherits");
        assert_eq!(by(&[("a", "2")]), GroupBy::All);
        assert_eq!(
            by(&[("a", "2"), ("b", "1")]),
            GroupBy::All,
            "absent inherits all"
        );
        assert_eq!(
            by(&[("a", "2"), ("b", "2")]),
            GroupBy::Labels(vec!["alertname".into()])
        );
    }

    /// The router's group id is stored in the notification log: it is written as before, the values as
    /// JSON strings, the grouping labels in name order whatever order `group_by` lists them in.
    #[test]
    fn group_ids_keep_their_stored_form() {
        let r: Routing = serde_yaml::from_str(
            r#"
route:
  receiver: default
  group_by: [team, cluster, team]
  routes:
    - matchers: ['all="1"']
      group_by: ['...']
receivers: [{name: default}]
"#,
        )
        .unwrap();
        let t = Tree::new(&r.route);
        let alert = labels(&[("cluster", "a\"b\\c\n\u{1}"), ("team", "é"), ("x", "1")]);
        let node = t.matches(&alert)[0];
        assert_eq!(
            t.group_id(node, &alert, "id"),
            r#"0:{cluster="a\"b\\c\n\u0001",team="é"}"#
        );
        assert_eq!(
            t.group_of(node, &alert, "id").key,
            t.group_id(node, &alert, "id")
        );
        let all = labels(&[("all", "1"), ("b", "q\"")]);
        let node = t.matches(&all)[0];
        assert_eq!(
            t.group_id(node, &all, "id-7"),
            r#"0/0:{all="1",b="q\""}#id-7"#
        );
    }

    #[test]
    fn group_keys_are_written_as_alertmanager_writes_them() {
        assert_eq!(
            label_set(&labels(&[("b", "x\"y\\z\n"), ("a", "é\u{1}")])),
            r#"{a="é\x01", b="x\"y\\z\n"}"#
        );
        let ms: Vec<Matcher> = ["z=\"1\"", "a!~\"x\\\\d\"", "a=\"x\""]
            .iter()
            .map(|m| Matcher::parse(m).unwrap())
            .collect();
        assert_eq!(matchers_key(&ms), r#"{a="x",a!~"x\\d",z="1"}"#);
    }
}
