//! Label selectors, one grammar for the whole product: what `kubectl -l` and the API server take (`app=web`,
//! `tier!=db`, `env in (prod,staging)`, `env notin (dev)`, `team` (exists), `!legacy` (absent), joined by
//! commas, all of which must hold), plus comparisons of dotted numbers (`version>=1.25`, `version<1.30`,
//! `gpus>2`), which the API server also takes (`>`/`<` on integers). The console's filters, release
//! targets and approvals, team selectors and the simulator's list calls all parse with it.
//!
//! The empty selector matches everything; an empty requirement between commas is an error, as in kubectl.

use std::cmp::Ordering;
use std::collections::BTreeMap;

/// One requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
    /// key, the ordering wanted, whether equal also holds, the dotted number
    Cmp(String, Ordering, bool, Vec<u64>),
}

/// A parsed selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(Vec<Req>);

/// A selector that doesn't parse: the text and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {selector:?}: {reason}")]
pub struct SelectorError {
    /// The selector as given.
    pub selector: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Why one requirement doesn't parse.
struct Invalid(String);

/// Splits on commas outside parentheses.
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

/// `1.25`, `v1.30.2`, `3` as numbers to compare.
fn numbers(v: &str) -> Option<Vec<u64>> {
    v.trim()
        .trim_start_matches('v')
        .split('.')
        .map(|p| p.parse().ok())
        .collect()
}

impl Selector {
    /// Parses a selector.
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        let bad = |reason: String| SelectorError {
            selector: text.to_string(),
            reason,
        };
        if text.trim().is_empty() {
            return Ok(Selector::default());
        }
        let mut reqs = Vec::new();
        for part in split_top(text) {
            let p = part.trim();
            if p.is_empty() {
                return Err(bad("empty requirement".into()));
            }
            reqs.push(Self::requirement(p).map_err(|Invalid(reason)| bad(reason))?);
        }
        Ok(Selector(reqs))
    }

    fn requirement(p: &str) -> Result<Req, Invalid> {
        let key = |k: &str| -> Result<String, Invalid> {
            let k = k.trim();
            if valid_key(k) {
                Ok(k.to_string())
            } else {
                Err(Invalid(format!("bad key {k:?}")))
            }
        };
        let set = |rest: &str| -> Result<Vec<String>, Invalid> {
            let vals: Vec<String> = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| Invalid("a set needs parentheses: key in (a,b)".into()))?
                .split(',')
                .map(|v| v.trim().to_string())
                .collect();
            if vals.iter().any(String::is_empty) {
                return Err(Invalid("empty value in a set".into()));
            }
            Ok(vals)
        };
        // `key in (…)` / `key notin (…)`
        if let Some((k, rest)) = p.split_once(char::is_whitespace) {
            let rest = rest.trim_start();
            if let Some(r) = rest
                .strip_prefix("notin")
                .filter(|r| r.trim_start().starts_with('('))
            {
                return Ok(Req::NotIn(key(k)?, set(r)?));
            }
            if let Some(r) = rest
                .strip_prefix("in")
                .filter(|r| r.trim_start().starts_with('('))
            {
                return Ok(Req::In(key(k)?, set(r)?));
            }
        }
        const OPS: [(&str, Option<(Ordering, bool)>); 7] = [
            (">=", Some((Ordering::Greater, true))),
            ("<=", Some((Ordering::Less, true))),
            ("!=", None),
            ("==", None),
            (">", Some((Ordering::Greater, false))),
            ("<", Some((Ordering::Less, false))),
            ("=", None),
        ];
        for (op, cmp) in OPS {
            let Some((k, v)) = p.split_once(op) else {
                continue;
            };
            let (k, v) = (key(k)?, v.trim());
            if v.contains(['=', '<', '>', '!', '(', ')', ' ']) {
                return Err(Invalid(format!("bad value {v:?}")));
            }
            return Ok(match (op, cmp) {
                ("!=", _) => Req::Ne(k, v.into()),
                (_, Some((ord, eq))) => {
                    let n = numbers(v).ok_or_else(|| {
                        Invalid(format!(
                            "{op} compares dotted numbers such as 1.25, not {v:?}"
                        ))
                    })?;
                    Req::Cmp(k, ord, eq, n)
                }
                _ => Req::Eq(k, v.into()),
            });
        }
        if let Some(k) = p.strip_prefix('!') {
            return Ok(Req::Absent(key(k)?));
        }
        if valid_key(p) {
            return Ok(Req::Exists(p.into()));
        }
        Err(Invalid(format!("cannot read {p:?}")))
    }

    /// Whether the labels `get` looks up satisfy every requirement.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::Ne(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            Req::Exists(k) => get(k).is_some(),
            Req::Absent(k) => get(k).is_none(),
            Req::Cmp(k, ord, eq, want) => get(k).and_then(numbers).is_some_and(|have| {
                let c = have.cmp(want);
                c == *ord || (*eq && c == Ordering::Equal)
            }),
        })
    }

    /// [`Selector::matches`] on a map of labels.
    pub fn matches_map(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches(|k| labels.get(k).map(String::as_str))
    }

    /// Whether the selector is empty (it matches everything).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &Selector, labels: &[(&str, &str)]) -> bool {
        let l: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        s.matches_map(&l)
    }

    #[test]
    fn kubectl_forms() {
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
        assert!(m(&Selector::parse("a==b").unwrap(), &[("a", "b")]));
        assert!(m(
            &Selector::parse("env in(prod)").unwrap(),
            &[("env", "prod")]
        ));
        // a key named like the operators is a key
        assert!(m(&Selector::parse("index=1").unwrap(), &[("index", "1")]));
        assert!(m(&Selector::parse("notice").unwrap(), &[("notice", "")]));
    }

    #[test]
    fn comparisons_of_dotted_numbers() {
        let s = Selector::parse("version>=1.25,version<1.30").unwrap();
        assert!(m(&s, &[("version", "1.25")]));
        assert!(m(&s, &[("version", "v1.29.4")]));
        assert!(!m(&s, &[("version", "1.30")]));
        assert!(!m(&s, &[("version", "1.9")]), "1.9 is older than 1.25");
        assert!(!m(&s, &[]));
        assert!(m(&Selector::parse("gpus>2").unwrap(), &[("gpus", "8")]));
        assert!(!m(&Selector::parse("gpus>2").unwrap(), &[("gpus", "many")]));
    }

    #[test]
    fn empty_and_malformed() {
        assert!(Selector::parse("").unwrap().is_empty());
        assert!(Selector::parse("  ").unwrap().is_empty());
        for (bad, why) in [
            ("a in b", "cannot read"),
            ("=x", "bad key"),
            ("a=b,,c", "empty requirement"),
            ("env in (prod", "parentheses"),
            ("env in (a,,b)", "empty value"),
            ("v>=latest", "dotted numbers"),
            ("a=b=c", "bad value"),
        ] {
            let e = Selector::parse(bad).expect_err(bad);
            assert!(e.reason.contains(why), "{bad}: {e}");
            assert!(e.to_string().starts_with("invalid label selector"), "{e}");
        }
    }
}
