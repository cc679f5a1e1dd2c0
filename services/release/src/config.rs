//! The role's settings (`release` section of the hub config).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The release role's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where releases, snapshots and history live (sled); the hub resolves the default to
    /// `<storage.data_dir>/release`.
    pub data_dir: String,
    /// The ed25519 signing key (64 hex digits: the seed). Empty: `<data_dir>/signing.key`. Created on first
    /// start when absent, with the public key written next to it as `<key>.pub` (hex) for agents to trust.
    pub signing_key: String,
    /// How long to wait for an agent's answer to one command (then it is retried with the same id).
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    /// Attempts per command (same command id, fresh nonce each time; the agent applies it once).
    pub command_attempts: u32,
    /// A command's validity (`expires_at − issued_at`).
    #[serde(with = "humantime_serde")]
    pub command_validity: Duration,
    /// How long a batch's rollouts may take to complete before the health gate fails.
    #[serde(with = "humantime_serde")]
    pub health_timeout: Duration,
    /// Soak time after a batch is healthy, when the spec gives none.
    #[serde(with = "humantime_serde")]
    pub default_soak: Duration,
    /// Field manager for server-side apply, when the spec gives none.
    pub field_manager: String,
    /// Clusters dry-run, snapshotted or applied at once.
    pub parallelism: usize,
    /// How long a plan waits for the fleet registry after the role started.
    #[serde(with = "humantime_serde")]
    pub registry_wait: Duration,
    /// Replicas of the `MULTIPILOT_RELEASES` bucket, where releases, snapshots and history are written
    /// through (in the hub: `provision.replicas` unless set here).
    pub kv_replicas: usize,
    /// Field managers that are controllers: a field a release set that one of these now owns is not drift
    /// (an HPA's `kube-controller-manager` scaling `spec.replicas`).
    pub drift_ignore_managers: Vec<String>,
    /// Self-heal re-applies one object at most this many times within `heal_window`, then gives up.
    pub heal_limit: u32,
    /// See `heal_limit`.
    #[serde(with = "humantime_serde")]
    pub heal_window: Duration,
    /// Fleet repositories the role follows.
    pub gitops: GitOps,
    /// The TSDB role's Prometheus API, which release analyses query (the hub resolves the default to
    /// `tsdb.listen`).
    pub tsdb_url: String,
    /// The bearer token sent to the TSDB when its auth is on (a viewer's token).
    pub tsdb_token: Option<multipilot_bus::connect::Secret>,
    /// Sync windows (after Argo CD's): when applies and self-heal may run, per release and cluster
    /// selector. A deny window holds them while open (deny wins); when allow windows cover a release, it
    /// is applied only while one of them is open; no window: always. `manual_sync` lets an operator's
    /// explicit sync pass (audited). See [`crate::windows`].
    ///
    /// ```yaml
    /// windows:
    ///   - kind: deny                 # or allow
    ///     schedule: "0 18 * * FRI"   # 5-field cron: minute hour day-of-month month day-of-week
    ///     duration: 63h              # open until Monday 09:00
    ///     time_zone: Europe/Berlin   # IANA, read on the local clock across DST; UTC when absent
    ///     clusters: env=prod         # a label selector (`cluster` is the name); empty: every cluster
    ///     releases: ["payments-*"]   # names or globs; empty: every release
    ///     manual_sync: true          # `multipilot release apply` by an operator may pass it
    ///     description: weekend freeze
    ///   - kind: allow
    ///     schedule: "0 22 * * MON-THU"
    ///     duration: 2h
    ///     clusters: env=prod
    /// ```
    pub windows: Vec<crate::windows::Window>,
    /// Health rules for kinds the role has no rollout check of its own for (CRDs, `Job`, …): a CEL
    /// expression per `group/Kind` saying when an object is healthy, and optionally failed and what it is
    /// doing. They add to the shipped rules ([`crate::health::shipped_rules`]) and replace a shipped one of
    /// the same kind; a kind without a rule has no health (the gate does not wait on it). See
    /// [`crate::health`].
    ///
    /// ```yaml
    /// health_rules:
    ///   - kind: databases.example.com/Database   # group/Kind; a core kind is just Kind
    ///     healthy: has(self.status) && has(self.status.state) && self.status.state == 'Available'
    ///     failed: has(self.status) && has(self.status.state) && self.status.state == 'Error'
    ///     message: "has(self.status.detail) ? self.status.detail : 'no status yet'"
    /// ```
    pub health_rules: Vec<crate::health::HealthRule>,
}

/// Fleet repositories: Git as the source of the releases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GitOps {
    /// The repositories.
    pub repos: Vec<Repo>,
    /// The `git` program (the role runs `git clone --bare` and `git fetch`, so the credentials and
    /// transports of the host's Git work: https with a credential helper, ssh with a key).
    pub git: String,
    /// The `kubectl` program that builds a spec's `kustomize` overlays (`kubectl kustomize <dir>`, on the
    /// commit's files; without `--enable-helm` or plugins).
    pub kubectl: String,
}

impl Default for GitOps {
    fn default() -> Self {
        GitOps {
            repos: Vec::new(),
            git: "git".into(),
            kubectl: "kubectl".into(),
        }
    }
}

/// One fleet repository.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Repo {
    /// A short name (`[a-z0-9-]`), used in the status and the work directory.
    pub name: String,
    /// What `git clone` takes: a path, `https://…`, `ssh://…`, `git@host:org/repo`.
    pub url: String,
    /// The branch followed.
    #[serde(default = "main_branch")]
    pub branch: String,
    /// The directory in the repository holding `releases/` and `policies/` (default: its root).
    #[serde(default)]
    pub path: String,
    /// How often to fetch (`multipilot gitops sync` fetches at once).
    #[serde(default = "thirty_seconds", with = "humantime_serde")]
    pub interval: Duration,
}

fn main_branch() -> String {
    "main".into()
}

fn thirty_seconds() -> Duration {
    Duration::from_secs(30)
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: "./data/hub/release".into(),
            signing_key: String::new(),
            command_timeout: Duration::from_secs(10),
            command_attempts: 3,
            command_validity: Duration::from_secs(300),
            health_timeout: Duration::from_secs(120),
            default_soak: Duration::from_secs(30),
            field_manager: "multipilot".into(),
            parallelism: 32,
            registry_wait: Duration::from_secs(10),
            kv_replicas: 1,
            drift_ignore_managers: [
                "kube-controller-manager",
                "vpa-updater",
                "vpa-recommender",
                "cluster-autoscaler",
                "keda-operator",
            ]
            .map(String::from)
            .to_vec(),
            heal_limit: 3,
            heal_window: Duration::from_secs(600),
            gitops: GitOps::default(),
            tsdb_url: "http://127.0.0.1:9466".into(),
            tsdb_token: None,
            windows: Vec::new(),
            health_rules: Vec::new(),
        }
    }
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(crate::Error::Config(format!($($fmt)+)));
        }
    };
}

impl Config {
    /// Checks what serde can't.
    pub fn validate(&self) -> Result<(), crate::Error> {
        ensure!(!self.data_dir.is_empty(), "release.data_dir is empty");
        ensure!(
            self.command_attempts >= 1,
            "release.command_attempts must be at least 1"
        );
        ensure!(
            self.parallelism >= 1,
            "release.parallelism must be at least 1"
        );
        ensure!(
            (1..=5).contains(&self.kv_replicas),
            "release.kv_replicas must be 1..=5, not {}",
            self.kv_replicas
        );
        ensure!(
            !self.field_manager.is_empty(),
            "release.field_manager is empty"
        );
        ensure!(
            self.command_validity >= self.command_timeout,
            "release.command_validity must be at least release.command_timeout"
        );
        ensure!(
            self.heal_limit >= 1,
            "release.heal_limit must be at least 1"
        );
        let mut names = std::collections::BTreeSet::new();
        for r in &self.gitops.repos {
            ensure!(
                !r.name.is_empty()
                    && r.name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "release.gitops.repos: name {:?} must be lower-case letters, digits and '-'",
                r.name
            );
            ensure!(
                names.insert(r.name.clone()),
                "release.gitops.repos: {} is named twice",
                r.name
            );
            ensure!(
                !r.url.is_empty() && !r.url.starts_with('-'),
                "release.gitops.repos: {} needs a url (a path or URL, not starting with '-')",
                r.name
            );
            ensure!(
                !r.branch.is_empty() && !r.branch.starts_with('-'),
                "release.gitops.repos: {}: branch {:?} is not a branch name",
                r.name,
                r.branch
            );
            ensure!(
                r.interval >= Duration::from_secs(1),
                "release.gitops.repos: {}: interval must be at least 1s",
                r.name
            );
        }
        crate::windows::Windows::compile(self.windows.clone())
            .map_err(|e| crate::Error::Config(format!("release.{e}")))?;
        crate::health::Rules::load(&self.health_rules)
            .map_err(|e| crate::Error::Config(format!("release.health_rules: {e}")))?;
        Ok(())
    }

    /// The signing key file.
    pub fn signing_key_path(&self) -> std::path::PathBuf {
        if self.signing_key.is_empty() {
            std::path::Path::new(&self.data_dir).join("signing.key")
        } else {
            self.signing_key.clone().into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_and_rejects_unknown_keys() {
        let c = Config::default();
        let yaml = serde_yaml::to_string(&c).expect("yaml");
        let back: Config = serde_yaml::from_str(&yaml).expect("back");
        assert_eq!(c, back);
        let bad = serde_yaml::from_str::<Config>("sign_key: x\n");
        assert!(bad.is_err());
        let short: Config = serde_yaml::from_str("default_soak: 5s\n").expect("partial");
        assert_eq!(short.default_soak, Duration::from_secs(5));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn windows_are_read_and_checked() {
        let c: Config = serde_yaml::from_str(
            "windows:\n  - kind: deny\n    schedule: '0 18 * * FRI'\n    duration: 63h\n    time_zone: Europe/Berlin\n    clusters: env=prod\n",
        )
        .expect("windows");
        assert_eq!(c.windows.len(), 1);
        assert!(c.validate().is_ok());
        let back: Config =
            serde_yaml::from_str(&serde_yaml::to_string(&c).expect("yaml")).expect("back");
        assert_eq!(c, back);
        let bad: Config = serde_yaml::from_str(
            "windows:\n  - kind: deny\n    schedule: '0 22 * * *'\n    duration: 1h\n    time_zone: Mars/Olympus\n",
        )
        .expect("parses");
        let e = bad.validate().expect_err("unknown zone").to_string();
        assert!(
            e.contains("release.windows[0]") && e.contains("unknown time zone \"Mars/Olympus\""),
            "{e}"
        );
    }
}
