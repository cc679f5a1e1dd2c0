//! Connecting to NATS: auth, TLS, and retry until the server answers.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A credential: shown as `***` in `Debug` and when serialised (so `--print-config` and logs never carry it).
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Secret {
    /// Whether no secret is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("***")
    }
}

/// TLS settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Refuse to connect without TLS.
    pub required: bool,
    /// CA bundle to verify the server with (PEM).
    pub ca_file: Option<PathBuf>,
    /// Client certificate for mutual TLS (PEM).
    pub cert_file: Option<PathBuf>,
    /// Client key for mutual TLS (PEM).
    pub key_file: Option<PathBuf>,
}

/// How to reach NATS.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Server URL, or several separated by commas (the client fails over between them).
    pub url: String,
    /// Connection name shown by the server (`nats server report connections`).
    pub name: Option<String>,
    /// User for user/password auth.
    pub user: Option<String>,
    /// Password for user/password auth.
    pub password: Option<Secret>,
    /// Token auth.
    pub token: Option<Secret>,
    /// NKey seed (`SU…`) for nkey auth.
    pub nkey_seed: Option<Secret>,
    /// Decentralised-auth credentials file (JWT + seed).
    pub creds_file: Option<PathBuf>,
    /// TLS.
    pub tls: TlsConfig,
    /// Timeout of one connection attempt.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Give up connecting after this long; `0s` means keep trying forever.
    #[serde(with = "humantime_serde")]
    pub give_up_after: Duration,
    /// Return at once and connect in the background (for the agent, which must keep collecting while NATS is
    /// unreachable).
    pub background: bool,
    /// Prefix of this client's reply subjects (default `_INBOX`). With per-user prefixes such as
    /// `_INBOX_prod-1`, each user's permissions allow only its own replies (`deploy/nats/accounts.conf`),
    /// so no client can read another's request/reply or JetStream API traffic.
    pub inbox_prefix: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            url: "nats://127.0.0.1:4222".into(),
            name: None,
            user: None,
            password: None,
            token: None,
            nkey_seed: None,
            creds_file: None,
            tls: TlsConfig::default(),
            connect_timeout: Duration::from_secs(5),
            give_up_after: Duration::ZERO,
            background: false,
            inbox_prefix: None,
        }
    }
}

/// Connection failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is contradictory or incomplete.
    #[error("invalid NATS connection config: {0}")]
    Config(String),
    /// The credentials file could not be read.
    #[error("reading NATS credentials file {path}: {source}")]
    Creds {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server list could not be parsed.
    #[error("invalid NATS server URL {url:?}: {source}")]
    Url {
        /// The URL as configured.
        url: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Gave up after `give_up_after`.
    #[error("could not connect to NATS at {url} within {:.0} s: {last}", after.as_secs_f64())]
    GaveUp {
        /// Where.
        url: String,
        /// How long we tried.
        after: Duration,
        /// The last error.
        last: String,
    },
}

impl Config {
    /// Checks that at most one auth method is configured and TLS files come in pairs.
    pub fn validate(&self) -> Result<(), Error> {
        let methods = [
            self.user.is_some() || self.password.is_some(),
            self.token.is_some(),
            self.nkey_seed.is_some(),
            self.creds_file.is_some(),
        ];
        if methods.iter().filter(|m| **m).count() > 1 {
            return Err(Error::Config(
                "configure one auth method: user/password, token, nkey_seed or creds_file".into(),
            ));
        }
        if self.user.is_some() != self.password.is_some() {
            return Err(Error::Config("user and password go together".into()));
        }
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            return Err(Error::Config(
                "tls.cert_file and tls.key_file go together".into(),
            ));
        }
        if self.url.trim().is_empty() {
            return Err(Error::Config("url is empty".into()));
        }
        if let Some(p) = &self.inbox_prefix
            && (p.is_empty() || p.contains(['.', '*', '>']) || p.chars().any(char::is_whitespace))
        {
            return Err(Error::Config(format!(
                "inbox_prefix {p:?} must be one subject token: no '.', '*', '>' or spaces"
            )));
        }
        Ok(())
    }

    fn servers(&self) -> Result<Vec<async_nats::ServerAddr>, Error> {
        self.url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| {
                u.parse::<async_nats::ServerAddr>()
                    .map_err(|source| Error::Url {
                        url: u.to_string(),
                        source,
                    })
            })
            .collect()
    }

    async fn options(&self) -> Result<async_nats::ConnectOptions, Error> {
        let mut o = match &self.creds_file {
            Some(path) => async_nats::ConnectOptions::new()
                .credentials_file(path.clone())
                .await
                .map_err(|source| Error::Creds {
                    path: path.clone(),
                    source,
                })?,
            None => async_nats::ConnectOptions::new(),
        };
        if let (Some(u), Some(p)) = (&self.user, &self.password) {
            o = o.user_and_password(u.clone(), p.0.clone());
        }
        if let Some(t) = &self.token {
            o = o.token(t.0.clone());
        }
        if let Some(seed) = &self.nkey_seed {
            o = o.nkey(seed.0.clone());
        }
        if self.tls.required {
            o = o.require_tls(true);
        }
        if let Some(ca) = &self.tls.ca_file {
            o = o.add_root_certificates(ca.clone());
        }
        if let (Some(c), Some(k)) = (&self.tls.cert_file, &self.tls.key_file) {
            o = o.add_client_certificate(c.clone(), k.clone());
        }
        if let Some(prefix) = &self.inbox_prefix {
            o = o.custom_inbox_prefix(prefix.clone());
        }
        if let Some(name) = &self.name {
            o = o.name(name);
        }
        Ok(o.connection_timeout(self.connect_timeout)
            .max_reconnects(None)
            .event_callback(|event| async move {
                match event {
                    async_nats::Event::Connected => tracing::info!("nats connected"),
                    async_nats::Event::Disconnected => tracing::warn!("nats disconnected"),
                    other => tracing::debug!(event = %other, "nats event"),
                }
            }))
    }
}

/// Connects, retrying with capped exponential backoff until the server answers (or `give_up_after`).
/// With `background`, returns at once and the client connects (and reconnects) on its own.
pub async fn connect(config: &Config) -> Result<async_nats::Client, Error> {
    config.validate()?;
    let servers = config.servers()?;
    if config.background {
        let opts = config.options().await?.retry_on_initial_connect();
        return opts.connect(servers).await.map_err(|e| Error::GaveUp {
            url: config.url.clone(),
            after: Duration::ZERO,
            last: e.to_string(),
        });
    }
    let started = std::time::Instant::now();
    let mut delay = Duration::from_millis(100);
    loop {
        match config.options().await?.connect(servers.clone()).await {
            Ok(client) => return Ok(client),
            Err(e) => {
                let waited = started.elapsed();
                if !config.give_up_after.is_zero() && waited >= config.give_up_after {
                    return Err(Error::GaveUp {
                        url: config.url.clone(),
                        after: waited,
                        last: e.to_string(),
                    });
                }
                if config.give_up_after.is_zero() {
                    tracing::warn!(url = %config.url, error = %e, retry_in = ?delay, "nats not reachable yet");
                } else {
                    // someone waits for the verdict (an operator command): one error at the end says it
                    tracing::debug!(url = %config.url, error = %e, retry_in = ?delay, "nats not reachable yet");
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_show() {
        let c = Config {
            token: Some(Secret("s3cr3t".into())),
            ..Default::default()
        };
        assert!(!format!("{c:?}").contains("s3cr3t"));
        assert!(
            !serde_json::to_string(&c)
                .unwrap_or_default()
                .contains("s3cr3t")
        );
    }

    #[test]
    fn one_auth_method_at_a_time() {
        let c = Config {
            token: Some(Secret("t".into())),
            user: Some("u".into()),
            password: Some(Secret("p".into())),
            ..Default::default()
        };
        assert!(c.validate().is_err());
        assert!(Config::default().validate().is_ok());
    }
}
