//! Bearer-token authentication with three roles: viewer < operator < releaser.
//!
//! Tokens come from the config (`auth.tokens`) and/or a file (`auth.tokens_file`, YAML or JSON: a list of
//! `{token, subject, role}`). Only a SHA-256 digest of each token is kept in memory, and a request's token is
//! looked up by its digest. Auth can be switched off only when the console listens on a loopback address
//! (the local demo); [`crate::run`] refuses to start otherwise.

use std::collections::HashMap;
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

/// One token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// The bearer token (shown as `***` by `--print-config`).
    pub token: Secret,
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
    /// A token is empty or given twice.
    #[error("invalid token for {subject:?}: {reason}")]
    Invalid {
        /// Whose token.
        subject: String,
        /// What is wrong.
        reason: &'static str,
    },
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
    by_digest: HashMap<[u8; 32], Principal>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
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
            entries.extend(more);
        }
        let mut by_digest = HashMap::new();
        for e in entries {
            if e.token.0.trim().is_empty() {
                return Err(Error::Invalid {
                    subject: e.subject,
                    reason: "empty token",
                });
            }
            let principal = Principal {
                subject: e.subject.clone(),
                role: e.role,
            };
            if by_digest.insert(digest(&e.token.0), principal).is_some() {
                return Err(Error::Invalid {
                    subject: e.subject,
                    reason: "the same token is configured twice",
                });
            }
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
        self.by_digest.get(&digest(token?)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(token: &str, subject: &str, role: Role) -> TokenEntry {
        TokenEntry {
            token: Secret(token.into()),
            subject: subject.into(),
            role,
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
    fn tokens_never_show_in_the_rendered_config() {
        let c = Config {
            tokens: vec![entry("s3cr3t", "a", Role::Viewer)],
            ..Default::default()
        };
        assert!(!serde_yaml::to_string(&c).unwrap().contains("s3cr3t"));
        assert!(!format!("{c:?}").contains("s3cr3t"));
    }
}
