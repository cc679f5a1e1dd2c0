//! Kubernetes label selectors, as `kubectl -l` takes them: `app=web`, `tier!=db`, `env in (prod,staging)`,
//! `env notin (dev)`, `team` (exists), `!legacy` (does not exist), joined by commas.

/// One requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(Vec<Req>);

/// A selector that doesn't parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid label selector {0:?}")]
pub struct ParseError(pub String);

fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn set(rest: &str, whole: &str) -> Result<Vec<String>, ParseError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| ParseError(whole.to_string()))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl Selector {
    /// Parses a selector.
    pub fn parse(s: &str) -> Result<Self, ParseError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let err = || ParseError(s.to_string());
            let req = if let Some((k, v)) = p.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some(k) = p.strip_prefix('!') {
                Req::Absent(k.trim().into())
            } else if let Some((k, rest)) = p.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set(rest, s)?)
            } else if let Some((k, rest)) = p.split_once(" in ") {
                Req::In(k.trim().into(), set(rest, s)?)
            } else {
                Req::Exists(p.into())
            };
            let key = match &req {
                Req::Eq(k, _)
                | Req::Ne(k, _)
                | Req::In(k, _)
                | Req::NotIn(k, _)
                | Req::Exists(k)
                | Req::Absent(k) => k,
            };
            if !valid_key(key) {
                return Err(err());
            }
            reqs.push(req);
        }
        Ok(Selector(reqs))
    }

    /// Whether labels (as key/value pairs) match.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::Ne(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Req::Exists(k) => get(k).is_some(),
            Req::Absent(k) => get(k).is_none(),
        })
    }

    /// Whether the selector is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn m(s: &Selector, labels: &[(&str, &str)]) -> bool {
        let l: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        s.matches(|k| l.get(k).map(String::as_str))
    }

    #[test]
    fn kubectl_selector_forms() {
        let s = Selector::parse("app=web,tier!=db,env in (prod, staging),!legacy,team").unwrap();
        assert!(m(&s, &[("app", "web"), ("env", "prod"), ("team", "x")]));
        assert!(!m(&s, &[("app", "web"), ("env", "dev"), ("team", "x")]));
        assert!(!m(
            &s,
            &[
                ("app", "web"),
                ("env", "prod"),
                ("team", "x"),
                ("legacy", "")
            ]
        ));
        assert!(!m(&s, &[("app", "web"), ("env", "prod")]));
        let n = Selector::parse("app.kubernetes.io/name notin (db)").unwrap();
        assert!(m(&n, &[]));
        assert!(!m(&n, &[("app.kubernetes.io/name", "db")]));
        assert!(Selector::parse("").unwrap().is_empty());
        assert!(Selector::parse("a in b").is_err());
        assert!(Selector::parse("=x").is_err());
    }
}
