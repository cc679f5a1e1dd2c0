//! Subjects and the escaping of the tokens they are built from.
//!
//! Kubernetes names contain dots (`kube-root-ca.crt`), colons (`system:node`) and, in labels and hostile
//! input, anything at all; a NATS subject token must contain none of `.`, `*`, `>` or whitespace. Every token
//! built from outside input goes through [`escape`]:
//!
//! - `A-Z`, `a-z`, `0-9` and `-` stay as they are;
//! - every other byte of the UTF-8 encoding becomes `~XX` (two upper-case hex digits), so `a.b` → `a~2Eb`;
//! - the empty string becomes `_` (a lone `_` can't come from a non-empty name, since `_` itself is escaped);
//! - a result longer than [`MAX_TOKEN`] bytes is cut to a prefix and suffixed with `~~` and 16 hex digits of
//!   the SHA-256 of the original, so long hostile names stay bounded and distinct (such tokens can't be
//!   unescaped; the payload carries the real name).
//!
//! The mapping is injective for tokens up to the length limit, and [`unescape`] reverses it.

use std::borrow::Cow;

/// Longest token [`escape`] produces, in bytes.
pub const MAX_TOKEN: usize = 200;

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-'
}

/// Escapes a string into one safe subject token (see the module docs).
pub fn escape(raw: &str) -> Cow<'_, str> {
    if raw.is_empty() {
        return Cow::Borrowed("_");
    }
    if raw.len() <= MAX_TOKEN && raw.bytes().all(is_plain) {
        return Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len() + 8);
    for b in raw.bytes() {
        if is_plain(b) {
            out.push(b as char);
        } else {
            out.push('~');
            out.push_str(&format!("{b:02X}"));
        }
    }
    if out.len() > MAX_TOKEN {
        // Cut to a readable prefix, then make it unique with a digest of the original.
        let mut cut = MAX_TOKEN - 18;
        // Never split a `~XX` triple: `~` only ever starts an escape.
        if let Some(i) = out[..cut].rfind('~')
            && cut - i < 3
        {
            cut = i;
        }
        let digest = crate::stable_id(&[raw]);
        out.truncate(cut);
        out.push_str("~~");
        out.push_str(&digest[..16]);
    }
    Cow::Owned(out)
}

/// Reverses [`escape`]. `None` for a hashed (over-long) token or a token [`escape`] can't have produced.
pub fn unescape(token: &str) -> Option<String> {
    if token == "_" {
        return Some(String::new());
    }
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'~' => {
                let hex = token.get(i + 1..i + 3)?;
                let b = u8::from_str_radix(hex, 16).ok()?;
                if is_plain(b) || hex.bytes().any(|c| c.is_ascii_lowercase()) {
                    return None;
                }
                out.push(b);
                i += 3;
            }
            b if is_plain(b) => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// Whether a string is a valid subject token as NATS sees it (no separators, wildcards or whitespace).
pub fn is_valid_token(token: &str) -> bool {
    !token.is_empty()
        && !token
            .bytes()
            .any(|b| b == b'.' || b == b'*' || b == b'>' || b.is_ascii_whitespace())
}

/// A family of subjects: `fleet.<class>` and how many tokens follow it. Readers filter with it instead of
/// spelling subjects out: [`Family::all`] (`fleet.state.>`), [`Family::partition`] (the subjects of one
/// partition, whose token the server's subject mapping appends on partitioned streams) and
/// [`Family::contains`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    prefix: &'static str,
    tokens: usize,
}

impl Family {
    /// `fleet.<class>`.
    pub const fn prefix(self) -> &'static str {
        self.prefix
    }

    /// Every subject of the family: `fleet.<class>.>`.
    pub fn all(self) -> String {
        format!("{}.>", self.prefix)
    }

    /// The family's subjects of one cluster: `fleet.<class>.<cluster>.>` (or the subject itself when the
    /// cluster is its last token).
    pub fn of_cluster(self, cluster: &str) -> String {
        if self.tokens == 1 {
            format!("{}.{}", self.prefix, escape(cluster))
        } else {
            format!("{}.{}.>", self.prefix, escape(cluster))
        }
    }

    /// The family's subjects in partition `k`: its tokens as wildcards, then `k`.
    pub fn partition(self, k: u32) -> String {
        format!("{}{}.{k}", self.prefix, ".*".repeat(self.tokens))
    }

    /// The family's subjects whose last token is `last` (escaped), whatever comes before:
    /// `RELEASE.ending_in("batch")` is `fleet.release.*.batch`.
    pub fn ending_in(self, last: &str) -> String {
        format!(
            "{}{}.{}",
            self.prefix,
            ".*".repeat(self.tokens.saturating_sub(1)),
            escape(last)
        )
    }

    /// Whether `subject` belongs to the family.
    pub fn contains(self, subject: &str) -> bool {
        subject
            .strip_prefix(self.prefix)
            .is_some_and(|rest| rest.starts_with('.'))
    }
}

/// [`state`]: `fleet.state.<cluster>.<kind>.<namespace>.<name>`.
pub const STATE: Family = Family {
    prefix: "fleet.state",
    tokens: 4,
};
/// [`resync`]: `fleet.resync.<cluster>.<kind>`.
pub const RESYNC: Family = Family {
    prefix: "fleet.resync",
    tokens: 2,
};
/// [`facts`]: `fleet.facts.<cluster>`.
pub const FACTS: Family = Family {
    prefix: "fleet.facts",
    tokens: 1,
};
/// [`heartbeat`]: `fleet.hb.<cluster>`.
pub const HEARTBEAT: Family = Family {
    prefix: "fleet.hb",
    tokens: 1,
};
/// [`probe`]: `fleet.probe.<cluster>.<probe>`.
pub const PROBE: Family = Family {
    prefix: "fleet.probe",
    tokens: 2,
};
/// [`event`]: `fleet.event.<cluster>.<involved kind>`.
pub const EVENT: Family = Family {
    prefix: "fleet.event",
    tokens: 2,
};
/// [`metrics`]: `fleet.metrics.<cluster>`.
pub const METRICS: Family = Family {
    prefix: "fleet.metrics",
    tokens: 1,
};
/// [`incident`]: `fleet.incident.<cluster>.<kind>`.
pub const INCIDENT: Family = Family {
    prefix: "fleet.incident",
    tokens: 2,
};
/// [`fleet_incident`]: `fleet.fleet-incident.<kind>`.
pub const FLEET_INCIDENT: Family = Family {
    prefix: "fleet.fleet-incident",
    tokens: 1,
};
/// [`digest`]: `fleet.digest.<cluster>.<involved kind>`.
pub const DIGEST: Family = Family {
    prefix: "fleet.digest",
    tokens: 2,
};
/// [`compliance`]: `fleet.compliance.<cluster>`.
pub const COMPLIANCE: Family = Family {
    prefix: "fleet.compliance",
    tokens: 1,
};
/// [`alert`]: `fleet.alert.<receiver>`.
pub const ALERT: Family = Family {
    prefix: "fleet.alert",
    tokens: 1,
};
/// [`release`]: `fleet.release.<release>.<what>`.
pub const RELEASE: Family = Family {
    prefix: "fleet.release",
    tokens: 2,
};
/// [`audit`]: `fleet.audit.<role>.<action>`.
pub const AUDIT: Family = Family {
    prefix: "fleet.audit",
    tokens: 2,
};
/// [`dlq`]: `fleet.dlq.<stream>`.
pub const DLQ: Family = Family {
    prefix: "fleet.dlq",
    tokens: 1,
};
/// [`command`]: `fleet.cmd.<cluster>.<verb>`.
pub const COMMAND: Family = Family {
    prefix: "fleet.cmd",
    tokens: 2,
};

/// Token for an optional namespace: `_` for cluster-scoped objects.
fn ns(namespace: Option<&str>) -> Cow<'_, str> {
    escape(namespace.unwrap_or(""))
}

/// `fleet.state.<cluster>.<kind>.<namespace>.<name>`: an object's current state (or its tombstone).
pub fn state(cluster: &str, kind: &str, namespace: Option<&str>, name: &str) -> String {
    format!(
        "fleet.state.{}.{}.{}.{}",
        escape(cluster),
        escape(kind),
        ns(namespace),
        escape(name)
    )
}

/// `fleet.resync.<cluster>.<kind>`: the resync marker after a (re)list of one kind.
pub fn resync(cluster: &str, kind: &str) -> String {
    format!("fleet.resync.{}.{}", escape(cluster), escape(kind))
}

/// `fleet.facts.<cluster>`: the cluster's registry entry.
pub fn facts(cluster: &str) -> String {
    format!("fleet.facts.{}", escape(cluster))
}

/// `fleet.hb.<cluster>`: heartbeats.
pub fn heartbeat(cluster: &str) -> String {
    format!("fleet.hb.{}", escape(cluster))
}

/// `fleet.probe.<cluster>.<probe>`: probe results.
pub fn probe(cluster: &str, probe: &str) -> String {
    format!("fleet.probe.{}.{}", escape(cluster), escape(probe))
}

/// `fleet.event.<cluster>.<involved kind>`: Kubernetes events.
pub fn event(cluster: &str, involved_kind: &str) -> String {
    format!("fleet.event.{}.{}", escape(cluster), escape(involved_kind))
}

/// `fleet.metrics.<cluster>`: metric batches.
pub fn metrics(cluster: &str) -> String {
    format!("fleet.metrics.{}", escape(cluster))
}

/// `fleet.incident.<cluster>.<kind>`: incident changes.
pub fn incident(cluster: &str, kind: &str) -> String {
    format!("fleet.incident.{}.{}", escape(cluster), escape(kind))
}

/// `fleet.fleet-incident.<kind>`: fleet incident changes (one failure across clusters).
pub fn fleet_incident(kind: &str) -> String {
    format!("fleet.fleet-incident.{}", escape(kind))
}

/// `fleet.digest.<cluster>.<involved kind>`: deduplicated event problems (announced when new or its severity
/// changes, updated in place while it keeps occurring).
pub fn digest(cluster: &str, involved_kind: &str) -> String {
    format!("fleet.digest.{}.{}", escape(cluster), escape(involved_kind))
}

/// `fleet.compliance.<cluster>`: the cluster's current baseline compliance report.
pub fn compliance(cluster: &str) -> String {
    format!("fleet.compliance.{}", escape(cluster))
}

/// `fleet.alert.<receiver>`: notifications for integrations that subscribe.
pub fn alert(receiver: &str) -> String {
    format!("fleet.alert.{}", escape(receiver))
}

/// `fleet.release.<release>.<what>`: release plans, steps and results.
pub fn release(release: &str, what: &str) -> String {
    format!("fleet.release.{}.{}", escape(release), escape(what))
}

/// `fleet.audit.<role>.<action>`: audit records.
pub fn audit(role: &str, action: &str) -> String {
    format!("fleet.audit.{}.{}", escape(role), escape(action))
}

/// `fleet.dlq.<stream>`: dead letters of one stream. Stream names are our own (`FLEET_EVENTS`) and valid
/// tokens, so they stay readable; anything else is escaped.
pub fn dlq(stream: &str) -> String {
    if is_valid_token(stream) && stream.is_ascii() {
        format!("fleet.dlq.{stream}")
    } else {
        format!("fleet.dlq.{}", escape(stream))
    }
}

/// `fleet.cmd.<cluster>.<verb>`: request/reply commands to one cluster's agent.
pub fn command(cluster: &str, verb: &str) -> String {
    format!("fleet.cmd.{}.{}", escape(cluster), escape(verb))
}

/// The cluster a `fleet.<class>.<cluster>…` subject is about, unescaped (`None` if the subject has no
/// cluster token or it can't be unescaped).
pub fn cluster_of(subject: &str) -> Option<String> {
    let mut parts = subject.split('.');
    (parts.next()? == "fleet").then_some(())?;
    let class = parts.next()?;
    if matches!(
        class,
        "alert" | "release" | "audit" | "dlq" | "fleet-incident"
    ) {
        return None;
    }
    unescape(parts.next()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_filters_what_its_builder_makes() {
        let s = state("prod-1", "Deployment", Some("shop"), "web");
        assert!(STATE.contains(&s) && !RESYNC.contains(&s) && !STATE.contains("fleet.stateful.x"));
        assert_eq!(STATE.all(), "fleet.state.>");
        assert_eq!(STATE.partition(3), "fleet.state.*.*.*.*.3");
        assert_eq!(HEARTBEAT.partition(0), "fleet.hb.*.0");
        assert_eq!(
            RELEASE.ending_in("rolled-back"),
            "fleet.release.*.rolled-back"
        );
        assert_eq!(
            FACTS.of_cluster("a.b"),
            format!("fleet.facts.{}", escape("a.b"))
        );
        assert_eq!(INCIDENT.of_cluster("prod-1"), "fleet.incident.prod-1.>");
        // each family's token count is what its builder makes
        for (family, subject) in [
            (STATE, s.clone()),
            (RESYNC, resync("c", "Pod")),
            (FACTS, facts("c")),
            (HEARTBEAT, heartbeat("c")),
            (PROBE, probe("c", "dns")),
            (EVENT, event("c", "Pod")),
            (METRICS, metrics("c")),
            (INCIDENT, incident("c", "x")),
            (FLEET_INCIDENT, fleet_incident("x")),
            (DIGEST, digest("c", "Pod")),
            (COMPLIANCE, compliance("c")),
            (ALERT, alert("r")),
            (RELEASE, release("r", "plan")),
            (AUDIT, audit("r", "a")),
            (DLQ, dlq("FLEET_EVENTS")),
            (COMMAND, command("c", "apply")),
        ] {
            let tokens = subject.split('.').count() - family.prefix().split('.').count();
            assert!(family.contains(&subject), "{subject}");
            assert_eq!(tokens, family.tokens, "{subject}");
        }
    }

    fn hostile() -> Vec<String> {
        vec![
            "a.b".into(),
            "*".into(),
            ">".into(),
            "with space".into(),
            "tab\there".into(),
            "new\nline".into(),
            "x".repeat(253),
            "é".repeat(253),
            "日本語-クラスター".into(),
            "emoji-🚀".into(),
            "_".into(),
            "".into(),
            "~".into(),
            "~2E".into(),
            "system:node:a.b".into(),
            "..".into(),
            "fleet.state.>".into(),
        ]
    }

    #[test]
    fn escaped_tokens_are_valid_and_bounded() {
        for raw in hostile() {
            let t = escape(&raw);
            assert!(is_valid_token(&t), "{raw:?} -> {t:?}");
            assert!(t.len() <= MAX_TOKEN, "{raw:?} -> {} bytes", t.len());
            assert!(t.is_ascii());
        }
    }

    #[test]
    fn escaping_round_trips_and_is_injective() {
        let raws = hostile();
        let mut seen = std::collections::HashMap::new();
        for raw in &raws {
            let t = escape(raw).into_owned();
            if t.len() < MAX_TOKEN - 18 || !t.contains("~~") {
                assert_eq!(unescape(&t).as_deref(), Some(raw.as_str()), "{t}");
            }
            if let Some(other) = seen.insert(t.clone(), raw.clone()) {
                panic!("{raw:?} and {other:?} both escape to {t:?}");
            }
        }
    }

    #[test]
    fn plain_kubernetes_names_stay_readable() {
        assert_eq!(escape("coredns"), "coredns");
        assert_eq!(escape("kube-root-ca.crt"), "kube-root-ca~2Ecrt");
        assert_eq!(escape(""), "_");
    }

    #[test]
    fn long_names_differ_after_hashing() {
        let a = "x".repeat(253);
        let mut b = "x".repeat(252);
        b.push('y');
        let (ta, tb) = (escape(&a), escape(&b));
        assert_ne!(ta, tb);
        assert!(ta.len() <= MAX_TOKEN);
        let u = "é".repeat(253);
        let tu = escape(&u);
        assert!(tu.contains("~~"));
        // The prefix never ends in a split escape.
        let prefix = tu.split("~~").next().unwrap();
        assert!(unescape(prefix).is_some(), "{prefix}");
    }

    #[test]
    fn subjects_have_fixed_token_counts() {
        let s = state("prod.1", "Deployment", Some("kube system"), "web.v2");
        assert_eq!(s.split('.').count(), 6, "{s}");
        assert_eq!(state("c", "Node", None, "n1"), "fleet.state.c.Node._.n1");
        assert_eq!(cluster_of(&s).as_deref(), Some("prod.1"));
        assert_eq!(cluster_of("fleet.dlq.FLEET_EVENTS"), None);
        for raw in hostile() {
            let s = probe(&raw, &raw);
            assert_eq!(s.split('.').count(), 4, "{s}");
            assert!(s.split('.').all(is_valid_token), "{s}");
        }
    }

    #[test]
    fn unescape_rejects_what_escape_cannot_produce() {
        for t in ["a.b", "~2e", "~41", "~", "~Z1", "a b"] {
            assert_eq!(unescape(t), None, "{t}");
        }
    }
}
