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
    /// The team it was minted for (`multipilot team add`); the token then sees only `clusters`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The clusters it may see (absent: the whole fleet). Every API answers only about these: the console
    /// lists only them, the TSDB adds `cluster=~"<these>"` to every selector, the alert router shows and
    /// silences only their alerts. `multipilot team add|rotate` and `cluster add` keep it up to date.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<Vec<String>>,
    /// The label selector `clusters` was made from (kept for `multipilot cluster add`, which adds a new
    /// cluster to every team whose selector matches it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

impl TokenEntry {
    /// An entry with the token in plain text (tests, inline config).
    pub fn plain(token: impl Into<String>, subject: impl Into<String>, role: Role) -> Self {
        TokenEntry {
            token: Secret(token.into()),
            token_sha256: None,
            ..TokenEntry::hashed(String::new(), subject, role)
        }
    }

    /// An entry for a token kept as its digest.
    pub fn hashed(token_sha256: String, subject: impl Into<String>, role: Role) -> Self {
        TokenEntry {
            token: Secret::default(),
            token_sha256: Some(token_sha256),
            subject: subject.into(),
            role,
            team: None,
            clusters: None,
            selector: None,
        }
    }
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
    /// A scoped token names something that is not a cluster name.
    #[error(
        "the token of {subject:?} is scoped to {cluster:?}, which is not a cluster name (a DNS label)"
    )]
    BadCluster {
        /// Whose token.
        subject: String,
        /// The bad name.
        cluster: String,
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
    /// The team whose token it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The clusters it may see; `None`: every cluster (and what belongs to none, like fleet incidents).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clusters: Option<std::collections::BTreeSet<String>>,
}

impl Principal {
    /// A principal that sees the whole fleet.
    pub fn fleet(subject: impl Into<String>, role: Role) -> Self {
        Principal {
            subject: subject.into(),
            role,
            team: None,
            clusters: None,
        }
    }

    /// Whether it may see this cluster's data.
    pub fn sees(&self, cluster: &str) -> bool {
        self.clusters.as_ref().is_none_or(|c| c.contains(cluster))
    }

    /// Whether it sees only some clusters (what belongs to no cluster is then hidden from it).
    pub fn scoped(&self) -> bool {
        self.clusters.is_some()
    }

    /// A regular expression (RE2, anchored by whoever matches it, as PromQL's `=~`) that matches exactly
    /// the clusters it sees: their names joined by `|`, or a pattern no name matches when it sees none.
    /// `None` when it sees every cluster.
    pub fn cluster_regex(&self) -> Option<String> {
        let c = self.clusters.as_ref()?;
        if c.is_empty() {
            // a cluster name is a DNS label: it never holds '/'
            return Some("/".into());
        }
        Some(
            c.iter()
                .map(|n| regex_escape(n))
                .collect::<Vec<_>>()
                .join("|"),
        )
    }
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether a string is a DNS label, as cluster and team names are.
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The token table: the config's tokens and the tokens file's, read again when the file changes (checked
/// at most every [`RELOAD_CHECK`]), so a team added or a cluster joining a team takes effect without a
/// restart. A file that no longer loads leaves the last good table in place, with an error logged.
#[derive(Debug, Default)]
pub struct Tokens {
    enabled: bool,
    inline: Vec<TokenEntry>,
    path: Option<PathBuf>,
    table: std::sync::RwLock<std::sync::Arc<Table>>,
    checked: std::sync::Mutex<Option<(std::time::Instant, Option<std::time::SystemTime>)>>,
}

/// Each known token's digest with whose it is.
type Table = Vec<([u8; 32], Principal)>;

/// How often the tokens file's modification time is looked at.
pub const RELOAD_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

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

fn modified(path: &std::path::Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The digest table of the inline tokens and the file's.
fn build(inline: &[TokenEntry], path: Option<&std::path::Path>) -> Result<Table, Error> {
    let mut entries = inline.to_vec();
    if let Some(path) = path {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let more: Vec<TokenEntry> = serde_yaml::from_str(&text).map_err(|e| Error::Parse {
            path: path.to_path_buf(),
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
        if e.team.is_some() && e.clusters.is_none() {
            return Err(invalid(
                "a team's token must name its clusters (`clusters: [...]`; `[]` for none)",
            ));
        }
        if let Some(bad) = e.clusters.iter().flatten().find(|c| !is_dns_label(c)) {
            return Err(Error::BadCluster {
                subject: e.subject.clone(),
                cluster: bad.clone(),
            });
        }
        by_digest.push((
            d,
            Principal {
                subject: e.subject.clone(),
                role: e.role,
                team: e.team.clone(),
                clusters: e.clusters.as_ref().map(|c| c.iter().cloned().collect()),
            },
        ));
    }
    Ok(by_digest)
}

impl Tokens {
    /// Loads the inline tokens and the tokens file.
    pub fn load(config: &Config) -> Result<Self, Error> {
        let mtime = config.tokens_file.as_deref().and_then(modified);
        let table = build(&config.tokens, config.tokens_file.as_deref())?;
        Ok(Tokens {
            enabled: config.enabled,
            inline: config.tokens.clone(),
            path: config.tokens_file.clone(),
            table: std::sync::RwLock::new(std::sync::Arc::new(table)),
            checked: std::sync::Mutex::new(Some((std::time::Instant::now(), mtime))),
        })
    }

    fn current(&self) -> std::sync::Arc<Table> {
        self.reload_if_changed();
        self.table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Reads the tokens file again if its modification time changed since the last look.
    fn reload_if_changed(&self) {
        let Some(path) = &self.path else { return };
        let mut checked = self
            .checked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = std::time::Instant::now();
        if let Some((at, _)) = *checked
            && now.duration_since(at) < RELOAD_CHECK
        {
            return;
        }
        let mtime = modified(path);
        let before = checked.and_then(|(_, m)| m);
        *checked = Some((now, mtime));
        if mtime == before {
            return;
        }
        match build(&self.inline, Some(path)) {
            Ok(table) => {
                tracing::info!(path = %path.display(), tokens = table.len(), "tokens file read again");
                *self
                    .table
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    std::sync::Arc::new(table);
            }
            Err(e) => {
                tracing::error!(error = %e, "the changed tokens file does not load; the last good tokens stay in use")
            }
        }
    }

    /// Whether tokens are required.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// How many tokens are known.
    pub fn len(&self) -> usize {
        self.current().len()
    }

    /// Whether no token is known.
    pub fn is_empty(&self) -> bool {
        self.current().is_empty()
    }

    /// Who a bearer token belongs to; with auth off, everyone is an anonymous releaser.
    pub fn check(&self, token: Option<&str>) -> Option<Principal> {
        if !self.enabled {
            return Some(Principal::fleet("anonymous", Role::Releaser));
        }
        let d = digest(token?);
        let table = self.current();
        // every digest is compared, whichever matches: the time says nothing of which one did
        let mut found = None;
        for (k, p) in table.iter() {
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
        TokenEntry::plain(token, subject, role)
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
    fn a_scoped_token_sees_its_clusters_and_a_changed_file_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens.yaml");
        let write = |clusters: &str| {
            std::fs::write(
                &file,
                format!(
                    "- token_sha256: {}\n  subject: team-pay\n  team: pay\n  clusters: [{clusters}]\n",
                    sha256_hex("t")
                ),
            )
            .unwrap();
        };
        write("alpha-1");
        let t = Tokens::load(&Config {
            enabled: true,
            tokens_file: Some(file.clone()),
            tokens: Vec::new(),
        })
        .unwrap();
        let p = t.check(Some("t")).unwrap();
        assert!(p.scoped() && p.sees("alpha-1") && !p.sees("beta-2"));
        assert_eq!(p.cluster_regex().as_deref(), Some("alpha-1"));
        assert_eq!(p.team.as_deref(), Some("pay"));
        // a cluster joins the team: seen after the next look at the file
        write("alpha-1, gamma-3");
        let bumped = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(bumped)
            .unwrap();
        *t.checked.lock().unwrap() = Some((
            std::time::Instant::now() - RELOAD_CHECK * 2,
            modified(&file).map(|m| m - std::time::Duration::from_secs(1)),
        ));
        let p = t.check(Some("t")).unwrap();
        assert!(p.sees("gamma-3"), "{p:?}");
        assert_eq!(p.cluster_regex().as_deref(), Some("alpha-1|gamma-3"));
        // a broken file keeps the last good table
        std::fs::write(&file, "- token_sha256: nope\n  subject: x\n").unwrap();
        *t.checked.lock().unwrap() = Some((std::time::Instant::now() - RELOAD_CHECK * 2, None));
        assert!(t.check(Some("t")).unwrap().sees("gamma-3"));
        // a scope that names no cluster matches nothing; a name that is not a DNS label is refused
        let none = Principal {
            clusters: Some(Default::default()),
            ..Principal::fleet("x", Role::Viewer)
        };
        assert!(!none.sees("alpha-1") && none.cluster_regex().as_deref() == Some("/"));
        assert!(
            Principal::fleet("x", Role::Viewer)
                .cluster_regex()
                .is_none()
        );
        std::fs::write(
            &file,
            format!(
                "- token_sha256: {}\n  subject: x\n  clusters: [\"a|b\"]\n",
                sha256_hex("t")
            ),
        )
        .unwrap();
        let err = Tokens::load(&Config {
            enabled: true,
            tokens_file: Some(file.clone()),
            tokens: Vec::new(),
        })
        .unwrap_err();
        assert!(err.to_string().contains("not a cluster name"), "{err}");
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
