//! Label matchers in Alertmanager's syntax: `name="value"`, `name!=value`, `name=~"regex"`, `name!~regex`.
//! Regular expressions are anchored at both ends, as in Alertmanager.

use std::collections::BTreeMap;
use std::fmt;

use regex::Regex;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How a matcher compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// `=`
    Eq,
    /// `!=`
    Ne,
    /// `=~`
    Re,
    /// `!~`
    NotRe,
}

impl Op {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Op::Eq => "=",
            Op::Ne => "!=",
            Op::Re => "=~",
            Op::NotRe => "!~",
        }
    }
}

/// One label matcher.
#[derive(Clone)]
pub struct Matcher {
    /// Label name.
    pub name: String,
    /// Operator.
    pub op: Op,
    /// Value (a regular expression for `=~` and `!~`).
    pub value: String,
    re: Option<Regex>,
}

impl fmt::Debug for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl PartialEq for Matcher {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.op == other.op && self.value == other.value
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{}{}",
            self.name,
            self.op.as_str(),
            serde_json::to_string(&self.value).unwrap_or_default()
        )
    }
}

/// A matcher that can't be parsed.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("matcher {input:?}: {reason}")]
pub struct Error {
    /// What was given.
    pub input: String,
    /// What is wrong.
    pub reason: String,
}

fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

impl Matcher {
    /// A matcher from its parts (compiles the regular expression).
    pub fn new(name: &str, op: Op, value: &str) -> Result<Matcher, Error> {
        let err = |reason: String| Error {
            input: format!("{name}{}{value}", op.as_str()),
            reason,
        };
        if !valid_name(name) {
            return Err(err(format!("{name:?} is not a label name")));
        }
        let re = match op {
            Op::Re | Op::NotRe => Some(
                Regex::new(&format!("^(?:{value})$"))
                    .map_err(|e| err(format!("bad regular expression: {e}")))?,
            ),
            _ => None,
        };
        Ok(Matcher {
            name: name.to_string(),
            op,
            value: value.to_string(),
            re,
        })
    }

    /// Parses `name<op>value`; the value may be double-quoted (with JSON escapes).
    pub fn parse(s: &str) -> Result<Matcher, Error> {
        let s = s.trim();
        let err = |reason: &str| Error {
            input: s.to_string(),
            reason: reason.to_string(),
        };
        let pos = s
            .find(['=', '!'])
            .ok_or_else(|| err("expected name=value, name!=value, name=~regex or name!~regex"))?;
        let name = s[..pos].trim();
        let rest = &s[pos..];
        let (op, value) = if let Some(v) = rest.strip_prefix("=~") {
            (Op::Re, v)
        } else if let Some(v) = rest.strip_prefix("!~") {
            (Op::NotRe, v)
        } else if let Some(v) = rest.strip_prefix("!=") {
            (Op::Ne, v)
        } else if let Some(v) = rest.strip_prefix('=') {
            (Op::Eq, v)
        } else {
            return Err(err("unknown operator"));
        };
        let value = value.trim();
        let value = if value.starts_with('"') {
            serde_json::from_str::<String>(value).map_err(|_| err("bad quoted value"))?
        } else {
            value.to_string()
        };
        Matcher::new(name, op, &value).map_err(|e| Error {
            input: s.to_string(),
            reason: e.reason,
        })
    }

    /// Whether the labels match (a missing label is the empty string, as in Alertmanager).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.name).map(String::as_str).unwrap_or("");
        match self.op {
            Op::Eq => v == self.value,
            Op::Ne => v != self.value,
            Op::Re => self.re.as_ref().is_some_and(|r| r.is_match(v)),
            Op::NotRe => !self.re.as_ref().is_some_and(|r| r.is_match(v)),
        }
    }
}

/// Whether every matcher matches.
pub fn all_match(matchers: &[Matcher], labels: &BTreeMap<String, String>) -> bool {
    matchers.iter().all(|m| m.matches(labels))
}

impl Serialize for Matcher {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Matcher {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Matcher::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Alertmanager's API form of a matcher (`{"name","value","isRegex","isEqual"}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiMatcher {
    /// Label name.
    pub name: String,
    /// Value or regular expression.
    pub value: String,
    /// Whether `value` is a regular expression.
    pub is_regex: bool,
    /// `true` for `=`/`=~`, `false` for `!=`/`!~`.
    #[serde(default = "yes")]
    pub is_equal: bool,
}

fn yes() -> bool {
    true
}

impl TryFrom<&ApiMatcher> for Matcher {
    type Error = Error;
    fn try_from(m: &ApiMatcher) -> Result<Matcher, Error> {
        let op = match (m.is_regex, m.is_equal) {
            (false, true) => Op::Eq,
            (false, false) => Op::Ne,
            (true, true) => Op::Re,
            (true, false) => Op::NotRe,
        };
        Matcher::new(&m.name, op, &m.value)
    }
}

impl From<&Matcher> for ApiMatcher {
    fn from(m: &Matcher) -> ApiMatcher {
        ApiMatcher {
            name: m.name.clone(),
            value: m.value.clone(),
            is_regex: matches!(m.op, Op::Re | Op::NotRe),
            is_equal: matches!(m.op, Op::Eq | Op::Re),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_every_operator_and_quoting() {
        let l = labels(&[("severity", "critical"), ("cluster", "prod-1")]);
        for (s, want) in [
            ("severity=critical", true),
            ("severity = \"critical\"", true),
            ("severity!=critical", false),
            ("severity=~\"crit.*|warning\"", true),
            ("severity=~crit", false), // anchored
            ("cluster!~\"staging-.*\"", true),
            ("team=\"\"", true), // missing label is ""
            ("team!=\"\"", false),
        ] {
            let m = Matcher::parse(s).unwrap();
            assert_eq!(m.matches(&l), want, "{s}");
        }
    }

    #[test]
    fn bad_matchers_are_errors_not_panics() {
        for s in [
            "",
            "severity",
            "1abc=x",
            "a=~\"(\"",
            "a=\"unterminated",
            "=x",
        ] {
            assert!(Matcher::parse(s).is_err(), "{s} should be refused");
        }
    }

    #[test]
    fn round_trips_through_display_and_api_form() {
        for s in ["a=\"b\"", "a!=\"b c\"", "a=~\"x|y\"", "a!~\".*\""] {
            let m = Matcher::parse(s).unwrap();
            assert_eq!(Matcher::parse(&m.to_string()).unwrap(), m);
            let api = ApiMatcher::from(&m);
            assert_eq!(Matcher::try_from(&api).unwrap(), m);
        }
    }
}
