//! Bearer-token authentication with three roles, viewer < operator < releaser: one model for every HTTP API
//! a deployment exposes (the console, the TSDB's Prometheus API, the alert router's Alertmanager API).
//!
//! Tokens come from the config (`auth.tokens`) and/or a file (`auth.tokens_file`, YAML or JSON: a list of
//! `{token_sha256, subject, role}`), so one tokens file can serve every API. A token is kept as its SHA-256
//! digest: in the file (`token_sha256`, what `multipilot token new` and `multipilot token hash` print; the
//! plain `token` form is still read, with a warning that says how to convert) and in memory, where a
//! request's token is compared with every known digest in constant time. Clients send
//! `Authorization: Bearer <token>` (what Grafana data sources, Prometheus' `alertmanagers` config and
//! `amtool --http.config.file` send); `?access_token=` is accepted where a client can't set headers
//! (`EventSource`). Auth can be off only on a loopback listen address ([`Config::check_listen`]).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use multipilot_bus::connect::Secret;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a token may do. Ordered: a higher role may do everything a lower one may.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read everything.
    #[default]
    Viewer,
    /// Also acknowledge and resolve incidents, silence alerts.
    Operator,
    /// Also apply and roll back releases.
    Releaser,
}

impl Role {
    /// The role's name.
    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Releaser => "releaser",
        }
    }
}

/// One token: its SHA-256 digest (`token_sha256`), or (read, with a warning) the token itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// The bearer token in plain text (shown as `***` by `--print-config`); prefer `token_sha256`.
    #[serde(default, skip_serializing_if = "Secret::is_empty")]
    pub token: Secret,
    /// The token's SHA-256 digest, 64 hex digits (`multipilot token hash` prints it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
    /// Who it belongs to (recorded as the actor of what it does).
    pub subject: String,
    /// What it may do.
    #[serde(default)]
    pub role: Role,
}

/// Auth settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Require a bearer token on every API request. May be false only on a loopback listen address.
    pub enabled: bool,
    /// A YAML or JSON file with a list of `{token, subject, role}`.
    pub tokens_file: Option<PathBuf>,
    /// Tokens given inline.
    pub tokens: Vec<TokenEntry>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            enabled: true,
            tokens_file: None,
            tokens: Vec::new(),
        }
    }
}

/// Auth setup failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tokens file can't be read.
    #[error("reading the tokens file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The tokens file doesn't parse.
    #[error("parsing the tokens file {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Auth is off on an address others can reach.
    #[error(
        "{what} listens on {listen}, which is not a loopback address, with auth off: set its `auth.enabled: true` and tokens (`auth.tokens_file`)"
    )]
    Open {
        /// Which API.
        what: String,
        /// Its listen address.
        listen: String,
    },
    /// A token is empty or given twice.
    #[error("invalid token for {subject:?}: {reason}")]
    Invalid {
        /// Whose token.
        subject: String,
        /// What is wrong.
        reason: &'static str,
    },
}

impl Config {
    /// Refuses an API that anyone who reaches it could use: auth off on a non-loopback `listen` address.
    pub fn check_listen(&self, what: &str, listen: &str) -> Result<(), Error> {
        if self.enabled || is_loopback(listen) {
            Ok(())
        } else {
            Err(Error::Open {
                what: what.to_string(),
                listen: listen.to_string(),
            })
        }
    }
}

/// Whether a listen address is loopback only (`127.0.0.0/8`, `::1`, `localhost`).
pub fn is_loopback(listen: &str) -> bool {
    if let Ok(addr) = listen.parse::<SocketAddr>() {
        return addr.ip().is_loopback();
    }
    let host = listen.rsplit_once(':').map(|(h, _)| h).unwrap_or(listen);
    if host.trim_matches(['[', ']']).parse::<IpAddr>().is_ok() {
        return false;
    }
    // a host name counts only if every address it resolves to is loopback
    match listen.to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<SocketAddr> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

/// Who is asking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Principal {
    /// Token subject (`anonymous` with auth off).
    pub subject: String,
    /// Role.
    pub role: Role,
}

/// The token table.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    enabled: bool,
    by_digest: Vec<([u8; 32], Principal)>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A token's digest as the tokens file keeps it (`token_sha256`): 64 lower-case hex digits.
pub fn sha256_hex(token: &str) -> String {
    digest(token).iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex(h: &str) -> Option<[u8; 32]> {
    let h = h.trim();
    if h.len() != 64 || !h.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Whether two digests are equal, in time that doesn't depend on where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

impl Tokens {
    /// Loads the inline tokens and the tokens file.
    pub fn load(config: &Config) -> Result<Self, Error> {
        let mut entries = config.tokens.clone();
        if let Some(path) = &config.tokens_file {
            let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
                path: path.clone(),
                source,
            })?;
            let more: Vec<TokenEntry> = serde_yaml::from_str(&text).map_err(|e| Error::Parse {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let plain = more.iter().filter(|e| !e.token.0.is_empty()).count();
            if plain > 0 {
                tracing::warn!(
                    path = %path.display(),
                    plain,
                    "the tokens file holds tokens in plain text: replace each `token: <secret>` with `token_sha256: <its SHA-256>` (`multipilot token hash` prints it)"
                );
            }
            entries.extend(more);
        }
        let mut by_digest: Vec<([u8; 32], Principal)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for e in entries {
            let invalid = |reason| Error::Invalid {
                subject: e.subject.clone(),
                reason,
            };
            let d = match (e.token.0.as_str(), &e.token_sha256) {
                (t, None) if t.trim().is_empty() => return Err(invalid("empty token")),
                (t, None) => digest(t),
                ("", Some(h)) => {
                    parse_hex(h).ok_or_else(|| invalid("token_sha256 is not 64 hex digits"))?
                }
                (_, Some(_)) => return Err(invalid("give token or token_sha256, not both")),
            };
            if !seen.insert(d) {
                return Err(invalid("the same token is configured twice"));
            }
            by_digest.push((
                d,
                Principal {
                    subject: e.subject.clone(),
                    role: e.role,
                },
            ));
        }
        Ok(Tokens {
            enabled: config.enabled,
            by_digest,
        })
    }

    /// Whether tokens are required.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// How many tokens are known.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// Whether no token is known.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// Who a bearer token belongs to; with auth off, everyone is an anonymous releaser.
    pub fn check(&self, token: Option<&str>) -> Option<Principal> {
        if !self.enabled {
            return Some(Principal {
                subject: "anonymous".into(),
                role: Role::Releaser,
            });
        }
        let d = digest(token?);
        // every digest is compared, whichever matches: the time says nothing of which one did
        let mut found = None;
        for (k, p) in &self.by_digest {
            if same(k, &d) {
                found = Some(p);
            }
        }
        found.cloned()
    }
}

/// The bearer token of a request (`Authorization: Bearer …`, or `?access_token=`).
pub fn token_of(req: &axum::extract::Request) -> Option<String> {
    if let Some(h) = req.headers().get(axum::http::header::AUTHORIZATION)
        && let Ok(s) = h.to_str()
        && let Some(t) = s
            .strip_prefix("Bearer ")
            .or_else(|| s.strip_prefix("bearer "))
    {
        return Some(t.trim().to_string());
    }
    let q = req.uri().query()?;
    serde_urlencoded::from_str::<std::collections::BTreeMap<String, String>>(q)
        .ok()?
        .remove("access_token")
}

/// Why a request is refused: answered as 401 (with `WWW-Authenticate: Bearer`) or 403, with a JSON body
/// `{"error", "status"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No token, or one nobody configured.
    Unauthenticated(&'static str),
    /// A known token whose role is too low.
    Forbidden(String),
}

impl axum::response::IntoResponse for Refusal {
    fn into_response(self) -> axum::response::Response {
        let (status, msg) = match self {
            Refusal::Unauthenticated(m) => (axum::http::StatusCode::UNAUTHORIZED, m.to_string()),
            Refusal::Forbidden(m) => (axum::http::StatusCode::FORBIDDEN, m),
        };
        let mut r = (
            status,
            axum::Json(serde_json::json!({"error": msg, "status": status.as_u16()})),
        )
            .into_response();
        if status == axum::http::StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

/// Who a request comes from.
pub fn authenticate(tokens: &Tokens, req: &axum::extract::Request) -> Result<Principal, Refusal> {
    let token = token_of(req);
    tokens.check(token.as_deref()).ok_or(if token.is_some() {
        Refusal::Unauthenticated("invalid token")
    } else {
        Refusal::Unauthenticated("a bearer token is required (Authorization: Bearer <token>)")
    })
}

/// `Ok` when the principal's role is at least `role`.
pub fn require(p: &Principal, role: Role) -> Result<(), Refusal> {
    if p.role >= role {
        Ok(())
    } else {
        Err(Refusal::Forbidden(format!(
            "{} has the {} role; this needs {}",
            p.subject,
            p.role.name(),
            role.name()
        )))
    }
}

async fn gate(
    tokens: &Tokens,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
    need: Role,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let p = match authenticate(tokens, &req) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = require(&p, need) {
        return r.into_response();
    }
    req.extensions_mut().insert(p);
    next.run(req).await
}

/// A middleware (for `axum::middleware::from_fn_with_state`) that lets a request through when its token's
/// role is at least viewer for reads (GET, HEAD) and at least operator for every other method, and puts the
/// [`Principal`] into the request's extensions.
pub async fn viewer_reads_operator_writes(
    axum::extract::State(tokens): axum::extract::State<std::sync::Arc<Tokens>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let need = match *req.method() {
        axum::http::Method::GET | axum::http::Method::HEAD => Role::Viewer,
        _ => Role::Operator,
    };
    gate(&tokens, req, next, need).await
}

/// A middleware that lets every request with a viewer's (or higher) token through: for read-only APIs
/// whose reads may be POSTs (Prometheus' query API).
pub async fn viewer(
    axum::extract::State(tokens): axum::extract::State<std::sync::Arc<Tokens>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    gate(&tokens, req, next, Role::Viewer).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(token: &str, subject: &str, role: Role) -> TokenEntry {
        TokenEntry {
            token: Secret(token.into()),
            token_sha256: None,
            subject: subject.into(),
            role,
        }
    }

    #[test]
    fn a_token_kept_as_its_digest_resolves_and_bad_entries_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens.yaml");
        let hex = sha256_hex("s3cret-token");
        assert_eq!(hex.len(), 64);
        std::fs::write(
            &file,
            format!("- token_sha256: {hex}\n  subject: carol\n  role: releaser\n"),
        )
        .unwrap();
        let t = Tokens::load(&Config {
            enabled: true,
            tokens_file: Some(file.clone()),
            tokens: Vec::new(),
        })
        .unwrap();
        assert_eq!(t.check(Some("s3cret-token")).unwrap().subject, "carol");
        assert!(t.check(Some("s3cret-tokeN")).is_none());
        // both forms, a malformed digest, the same token hashed and plain: refused with a reason
        for (body, want) in [
            (
                format!("- token: x\n  token_sha256: {hex}\n  subject: a\n"),
                "not both",
            ),
            (
                "- token_sha256: abc\n  subject: a\n".to_string(),
                "64 hex digits",
            ),
            (
                format!(
                    "- token_sha256: {hex}\n  subject: a\n- token: s3cret-token\n  subject: b\n"
                ),
                "twice",
            ),
            ("- subject: a\n".to_string(), "empty token"),
        ] {
            std::fs::write(&file, body).unwrap();
            let err = Tokens::load(&Config {
                enabled: true,
                tokens_file: Some(file.clone()),
                tokens: Vec::new(),
            })
            .unwrap_err();
            assert!(err.to_string().contains(want), "{err}");
        }
    }

    #[test]
    fn roles_are_ordered_and_tokens_resolve() {
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Releaser);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens.yaml");
        std::fs::write(
            &file,
            "- token: from-file\n  subject: bob\n  role: operator\n",
        )
        .unwrap();
        let t = Tokens::load(&Config {
            enabled: true,
            tokens_file: Some(file),
            tokens: vec![entry("inline", "alice", Role::Viewer)],
        })
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.check(Some("inline")).unwrap().role, Role::Viewer);
        assert_eq!(t.check(Some("from-file")).unwrap().subject, "bob");
        assert!(t.check(Some("nope")).is_none());
        assert!(t.check(None).is_none());
    }

    #[test]
    fn duplicate_and_empty_tokens_are_refused() {
        let twice = Config {
            tokens: vec![
                entry("x", "a", Role::Viewer),
                entry("x", "b", Role::Operator),
            ],
            ..Default::default()
        };
        assert!(Tokens::load(&twice).is_err());
        let empty = Config {
            tokens: vec![entry(" ", "a", Role::Viewer)],
            ..Default::default()
        };
        assert!(Tokens::load(&empty).is_err());
    }

    #[test]
    fn auth_may_be_off_only_on_loopback() {
        let off = Config {
            enabled: false,
            ..Default::default()
        };
        assert!(off.check_listen("tsdb", "127.0.0.1:9466").is_ok());
        assert!(off.check_listen("tsdb", "localhost:9466").is_ok());
        let err = off.check_listen("tsdb", "0.0.0.0:9466").unwrap_err();
        assert!(err.to_string().contains("auth.enabled"), "{err}");
        assert!(
            Config::default()
                .check_listen("tsdb", "0.0.0.0:9466")
                .is_ok()
        );
    }

    #[test]
    fn tokens_never_show_in_the_rendered_config() {
        let c = Config {
            tokens: vec![entry("s3cr3t", "a", Role::Viewer)],
            ..Default::default()
        };
        assert!(!serde_yaml::to_string(&c).unwrap().contains("s3cr3t"));
        assert!(!format!("{c:?}").contains("s3cr3t"));
    }
}
