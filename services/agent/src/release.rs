//! The release command executor: carries out the release role's signed commands on one cluster.
//!
//! Reads (core NATS request/reply, only when `release.enabled`): `fleet.cmd.<cluster>.release`, a
//! `ReleaseCommand` envelope (named MessagePack). Replies a `ReleaseResult` envelope. Nothing is published
//! on a stream: the release role records what happened.
//!
//! A command is carried out only when every check passes, in this order: the ed25519 signature over
//! [`ReleaseCommand::signing_bytes`] verifies with a trusted key named by `key_id`; the command is for this
//! cluster; it has not expired (`expires_at` + `max_skew`), was not issued in the future (`issued_at` −
//! `max_skew`) and its lifetime is at most `max_lifetime`; its nonce was never seen (nonces are kept,
//! durably, until the command's expiry). A command whose `command_id` was already executed is not executed
//! again: the stored result comes back with `replayed = true`. Every refusal is a `ReleaseResult` with
//! `ok = false` and the reason in `error`.
//!
//! Actions: `dry-run` (server-side apply with `dryRun=All`), `apply` (server-side apply with the command's
//! field manager, `force` only when the command says so), `snapshot` (GET the live objects; absent ones are
//! reported `absent`), `delete`. The resource of each object is found by discovery of its apiVersion/kind
//! on this cluster; namespaced objects without a namespace go to `default`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use futures::StreamExt;
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{ApiResource, Scope};
use multipilot_schemas::object::content;
use multipilot_schemas::payload::{
    ApplyOutcome, ObjectOutcome, ObjectRef, ReleaseAction, ReleaseCommand, ReleaseResult,
};
use multipilot_schemas::{Envelope, Payload, subject};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

/// Settings of the executor (`release` section of the agent config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Accept release commands at all (off by default: the agent then never writes to its clusters).
    pub enabled: bool,
    /// Trusted ed25519 public keys, hex (64 digits).
    pub trusted_keys: Vec<String>,
    /// Files holding a trusted public key each (hex, as the release role writes `<key>.pub`); read at
    /// start and again when a command names a key not known yet.
    pub trusted_key_files: Vec<String>,
    /// Clock difference tolerated between the hub and this agent, seconds.
    pub max_skew_s: u64,
    /// Longest accepted command lifetime (`expires_at − issued_at`), seconds.
    pub max_lifetime_s: u64,
    /// How long executed commands' results are kept for idempotent retries, seconds.
    pub keep_results_s: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            enabled: false,
            trusted_keys: Vec::new(),
            trusted_key_files: Vec::new(),
            max_skew_s: 30,
            max_lifetime_s: 3600,
            keep_results_s: 7 * 24 * 3600,
        }
    }
}

/// Why the executor's settings are not usable (a changed setting is needed: never retryable).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Enabled without any trusted key.
    #[error("release.enabled needs release.trusted_keys or release.trusted_key_files")]
    NoTrustedKey,
    /// An inline trusted key is not an ed25519 public key.
    #[error("release.trusted_keys: {0}")]
    TrustedKey(#[source] KeyError),
}

/// Why a text is not an ed25519 public key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Not hex digits.
    #[error("not hex: {0}")]
    Hex(#[source] hex::FromHexError),
    /// Not 32 bytes.
    #[error("an ed25519 public key is 32 bytes (64 hex digits)")]
    Length,
    /// 32 bytes that are not a point of the curve.
    #[error("not an ed25519 public key: {0}")]
    Curve(#[source] ed25519_dalek::SignatureError),
}

impl Config {
    /// Checks what serde can't.
    pub fn validate(&self) -> Result<(), Error> {
        if self.enabled {
            if self.trusted_keys.is_empty() && self.trusted_key_files.is_empty() {
                return Err(Error::NoTrustedKey);
            }
            for k in &self.trusted_keys {
                parse_key(k).map_err(Error::TrustedKey)?;
            }
        }
        Ok(())
    }
}

/// The key id of a public key: the first 16 hex digits of its SHA-256.
pub fn key_id(public: &[u8; 32]) -> String {
    hex::encode(Sha256::digest(public))[..16].to_string()
}

fn parse_key(hex_key: &str) -> Result<VerifyingKey, KeyError> {
    let bytes = hex::decode(hex_key.trim()).map_err(KeyError::Hex)?;
    let arr: [u8; 32] = bytes.try_into().map_err(|_| KeyError::Length)?;
    VerifyingKey::from_bytes(&arr).map_err(KeyError::Curve)
}

/// The trusted keys by key id.
#[derive(Debug)]
pub struct Keys {
    config: Config,
    keys: Mutex<HashMap<String, VerifyingKey>>,
}

impl Keys {
    /// Loads the inline keys and the key files (a missing file is reported, not fatal: the hub may write
    /// it later).
    pub fn load(config: &Config) -> Self {
        let k = Keys {
            config: config.clone(),
            keys: Mutex::new(HashMap::new()),
        };
        k.reload();
        k
    }

    fn reload(&self) {
        let mut map = HashMap::new();
        for hex_key in &self.config.trusted_keys {
            if let Ok(key) = parse_key(hex_key) {
                map.insert(key_id(key.as_bytes()), key);
            }
        }
        for path in &self.config.trusted_key_files {
            match std::fs::read_to_string(path) {
                Ok(text) => match parse_key(&text) {
                    Ok(key) => {
                        map.insert(key_id(key.as_bytes()), key);
                    }
                    Err(e) => tracing::warn!(path, error = %e, "trusted key file unusable"),
                },
                Err(e) => tracing::warn!(path, error = %e, "trusted key file unreadable"),
            }
        }
        *self.keys.lock().unwrap_or_else(|e| e.into_inner()) = map;
    }

    fn get(&self, id: &str) -> Option<VerifyingKey> {
        if let Some(k) = self.keys.lock().unwrap_or_else(|e| e.into_inner()).get(id) {
            return Some(*k);
        }
        self.reload();
        self.keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .copied()
    }

    /// How many keys are trusted now.
    pub fn len(&self) -> usize {
        self.keys.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no key is trusted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Resources resolved during one command: (apiVersion, kind) → (resource, namespaced) or why not.
type Resolved = HashMap<(String, String), Result<(ApiResource, bool), NotServed>>;

/// Why a command is refused before anything is done (the reply's `error`).
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// No signature.
    #[error("rejected: unsigned command")]
    Unsigned,
    /// Signed with a key this agent doesn't trust.
    #[error("rejected: key {0:?} is not trusted by this agent")]
    UntrustedKey(String),
    /// The signature is not hex.
    #[error("rejected: signature is not hex")]
    SignatureNotHex,
    /// The signature is not 64 bytes.
    #[error("rejected: signature is not 64 bytes")]
    SignatureLength,
    /// The signed bytes of the command could not be made.
    #[error("rejected: cannot encode the command: {0}")]
    Encode(#[source] multipilot_schemas::EncodeError),
    /// The signature doesn't verify.
    #[error("rejected: bad signature")]
    BadSignature,
    /// The command is for another cluster.
    #[error("rejected: command is for cluster {command:?}, this is {this:?}")]
    OtherCluster {
        /// The command's cluster.
        command: String,
        /// This executor's.
        this: String,
    },
    /// Past its expiry (and the skew).
    #[error("rejected: expired at {0}")]
    Expired(DateTime<Utc>),
    /// Issued later than now (and the skew).
    #[error("rejected: issued in the future ({issued_at}; agent clock {now})")]
    Future {
        /// When the command says it was issued.
        issued_at: DateTime<Utc>,
        /// The agent's clock.
        now: DateTime<Utc>,
    },
    /// Lives longer than `max_lifetime_s` (that many seconds).
    #[error("rejected: lifetime over {0}s")]
    Lifetime(u64),
    /// A nonce too short to be unique.
    #[error("rejected: nonce shorter than 16 characters")]
    ShortNonce,
}

/// An object's apiVersion/kind that discovery does not find on this cluster (an object's `error`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind} {api_version} is not served by this cluster ({source})")]
struct NotServed {
    /// The object's apiVersion.
    api_version: String,
    /// Its kind.
    kind: String,
    /// Discovery's answer (shared: one failure answers every object of that kind in a command).
    #[source]
    source: Arc<kube::Error>,
}

/// Why a sled tree could not be flushed to disk.
#[derive(Debug, thiserror::Error)]
enum FlushError {
    /// sled failed.
    #[error(transparent)]
    Sled(#[from] sled::Error),
    /// The blocking task did not finish (the runtime is shutting down).
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

/// Executes release commands for one cluster.
pub struct Executor {
    cluster: String,
    client: kube::Client,
    keys: Arc<Keys>,
    config: Config,
    nonces: sled::Tree,
    results: sled::Tree,
    source: String,
    // one command at a time per cluster: the command-id check, the execution and the stored result are one
    // step, so a retry racing its original can't run twice
    serial: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("cluster", &self.cluster)
            .finish()
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    result: ReleaseResult,
    stored_at: DateTime<Utc>,
}

impl Executor {
    /// An executor over the agent's sled store (trees `release/nonces/<cluster>`,
    /// `release/results/<cluster>`).
    pub fn new(
        cluster: &str,
        client: kube::Client,
        keys: Arc<Keys>,
        config: Config,
        nonces: sled::Tree,
        results: sled::Tree,
        source: String,
    ) -> Self {
        Executor {
            cluster: cluster.to_string(),
            client,
            keys,
            config,
            nonces,
            results,
            source,
            serial: tokio::sync::Mutex::new(()),
        }
    }

    fn refuse(&self, cmd: Option<&ReleaseCommand>, why: impl Into<String>) -> ReleaseResult {
        ReleaseResult {
            command_id: cmd.map(|c| c.command_id.clone()).unwrap_or_default(),
            release: cmd.map(|c| c.release.clone()).unwrap_or_default(),
            cluster: self.cluster.clone(),
            ok: false,
            error: Some(why.into()),
            objects: Vec::new(),
            replayed: false,
        }
    }

    /// Checks the signature, the cluster and the times; `Err` is the reason for refusing.
    fn verify(&self, cmd: &ReleaseCommand, now: DateTime<Utc>) -> Result<(), Refusal> {
        if cmd.signature.is_empty() {
            return Err(Refusal::Unsigned);
        }
        let Some(key) = self.keys.get(&cmd.key_id) else {
            return Err(Refusal::UntrustedKey(cmd.key_id.clone()));
        };
        let sig_bytes = hex::decode(&cmd.signature).map_err(|_| Refusal::SignatureNotHex)?;
        let sig = Signature::from_slice(&sig_bytes).map_err(|_| Refusal::SignatureLength)?;
        let msg = cmd.signing_bytes().map_err(Refusal::Encode)?;
        key.verify(&msg, &sig).map_err(|_| Refusal::BadSignature)?;
        if cmd.cluster != self.cluster {
            return Err(Refusal::OtherCluster {
                command: cmd.cluster.clone(),
                this: self.cluster.clone(),
            });
        }
        let skew = chrono::Duration::seconds(self.config.max_skew_s as i64);
        if now > cmd.expires_at + skew {
            return Err(Refusal::Expired(cmd.expires_at));
        }
        if cmd.issued_at > now + skew {
            return Err(Refusal::Future {
                issued_at: cmd.issued_at,
                now,
            });
        }
        if cmd.expires_at - cmd.issued_at
            > chrono::Duration::seconds(self.config.max_lifetime_s as i64)
        {
            return Err(Refusal::Lifetime(self.config.max_lifetime_s));
        }
        if cmd.nonce.len() < 16 {
            return Err(Refusal::ShortNonce);
        }
        Ok(())
    }

    /// Handles one request body and returns the reply.
    pub async fn handle(&self, body: &[u8]) -> ReleaseResult {
        let env: Envelope<ReleaseCommand> = match rmp_serde::from_slice(body) {
            Ok(e) => e,
            Err(e) => return self.refuse(None, format!("rejected: undecodable command: {e}")),
        };
        if env.schema != ReleaseCommand::SCHEMA || env.version != ReleaseCommand::VERSION {
            return self.refuse(
                None,
                format!(
                    "rejected: schema {}/{} is not ReleaseCommand/1",
                    env.schema, env.version
                ),
            );
        }
        let cmd = env.payload;
        let now = Utc::now();
        if let Err(why) = self.verify(&cmd, now) {
            tracing::warn!(cluster = %self.cluster, command = %cmd.command_id, reason = %why, "release command refused");
            return self.refuse(Some(&cmd), why.to_string());
        }
        let _one = self.serial.lock().await;
        // nonce: never twice
        let keep_until = (cmd.expires_at
            + chrono::Duration::seconds(self.config.max_skew_s as i64))
        .timestamp_millis();
        match self.nonces.compare_and_swap(
            cmd.nonce.as_bytes(),
            None as Option<&[u8]>,
            Some(&keep_until.to_be_bytes()[..]),
        ) {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                tracing::warn!(cluster = %self.cluster, command = %cmd.command_id, "replayed nonce refused");
                return self.refuse(Some(&cmd), "rejected: replayed (nonce already used)");
            }
            Err(e) => return self.refuse(Some(&cmd), format!("failed: nonce store: {e}")),
        }
        if let Err(e) = flush(&self.nonces).await {
            return self.refuse(Some(&cmd), format!("failed: nonce store: {e}"));
        }
        // idempotence: a command id already carried out returns its result again
        if let Ok(Some(raw)) = self.results.get(cmd.command_id.as_bytes())
            && let Ok(stored) = serde_json::from_slice::<Stored>(&raw)
        {
            let mut r = stored.result;
            r.replayed = true;
            tracing::info!(cluster = %self.cluster, command = %cmd.command_id, "retried command answered from its stored result");
            return r;
        }
        let result = self.execute(&cmd).await;
        // reads are not remembered: a snapshot asked again must show the cluster as it is now
        if matches!(cmd.action, ReleaseAction::Apply | ReleaseAction::Delete) {
            let stored = Stored {
                result: result.clone(),
                stored_at: now,
            };
            if let Ok(bytes) = serde_json::to_vec(&stored) {
                let _ = self.results.insert(cmd.command_id.as_bytes(), bytes);
                let _ = flush(&self.results).await;
            }
        }
        tracing::info!(cluster = %self.cluster, command = %cmd.command_id, action = ?cmd.action, ok = result.ok, "release command executed");
        result
    }

    /// Forgets nonces past their expiry and results older than `keep_results_s`.
    pub fn prune(&self, now: DateTime<Utc>) {
        let now_ms = now.timestamp_millis();
        for (k, v) in self.nonces.iter().flatten() {
            let until = v.as_ref().try_into().map(i64::from_be_bytes).unwrap_or(0);
            if until < now_ms {
                let _ = self.nonces.remove(k);
            }
        }
        let keep = chrono::Duration::seconds(self.config.keep_results_s as i64);
        for (k, v) in self.results.iter().flatten() {
            let old = serde_json::from_slice::<Stored>(&v)
                .map(|s| s.stored_at + keep < now)
                .unwrap_or(true);
            if old {
                let _ = self.results.remove(k);
            }
        }
    }

    async fn resolve(
        &self,
        cache: &mut Resolved,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, bool), NotServed> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(r) = cache.get(&key) {
            return r.clone();
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let r = match kube::discovery::pinned_kind(&self.client, &gvk).await {
            Ok((ar, caps)) => Ok((ar, caps.scope == Scope::Namespaced)),
            Err(e) => Err(NotServed {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                source: Arc::new(e),
            }),
        };
        cache.insert(key, r.clone());
        r
    }

    async fn execute(&self, cmd: &ReleaseCommand) -> ReleaseResult {
        let mut cache = HashMap::new();
        let mut objects = Vec::with_capacity(cmd.objects.len());
        for obj in &cmd.objects {
            objects.push(self.one(cmd, obj, &mut cache).await);
        }
        let ok = objects.iter().all(|o| o.outcome != ApplyOutcome::Error);
        let failed = objects
            .iter()
            .filter(|o| o.outcome == ApplyOutcome::Error)
            .count();
        ReleaseResult {
            command_id: cmd.command_id.clone(),
            release: cmd.release.clone(),
            cluster: self.cluster.clone(),
            ok,
            error: (!ok).then(|| format!("{failed} of {} objects failed", objects.len())),
            objects,
            replayed: false,
        }
    }

    async fn one(&self, cmd: &ReleaseCommand, obj: &Value, cache: &mut Resolved) -> ObjectOutcome {
        let api_version = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut oref = ObjectRef {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            namespace: obj
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .map(str::to_string),
            name: name.to_string(),
            uid: None,
        };
        let fail = |oref: ObjectRef, e: String| ObjectOutcome {
            object: oref,
            outcome: ApplyOutcome::Error,
            error: Some(e),
            live: None,
            result: None,
        };
        if api_version.is_empty() || kind.is_empty() || name.is_empty() {
            return fail(
                oref,
                "object without apiVersion, kind or metadata.name".into(),
            );
        }
        let (ar, namespaced) = match self.resolve(cache, api_version, kind).await {
            Ok(r) => r,
            Err(e) => return fail(oref, e.to_string()),
        };
        let api: Api<DynamicObject> = if namespaced {
            let ns = oref.namespace.clone().unwrap_or_else(|| "default".into());
            oref.namespace = Some(ns.clone());
            Api::namespaced_with(self.client.clone(), &ns, &ar)
        } else {
            oref.namespace = None;
            Api::all_with(self.client.clone(), &ar)
        };
        let live = match api.get_opt(name).await {
            Ok(o) => o.and_then(|o| serde_json::to_value(o).ok()).map(trim),
            Err(e) => return fail(oref, format!("reading the live object: {}", kube_err(&e))),
        };
        oref.uid = live
            .as_ref()
            .and_then(|l| l.pointer("/metadata/uid"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let done =
            |oref: ObjectRef, outcome: ApplyOutcome, live: Option<Value>, result: Option<Value>| {
                ObjectOutcome {
                    object: oref,
                    outcome,
                    error: None,
                    live,
                    result,
                }
            };
        match cmd.action {
            ReleaseAction::Snapshot => {
                let outcome = if live.is_some() {
                    ApplyOutcome::Present
                } else {
                    ApplyOutcome::Absent
                };
                done(oref, outcome, live, None)
            }
            ReleaseAction::Delete => {
                if live.is_none() {
                    return done(oref, ApplyOutcome::Absent, None, None);
                }
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => done(oref, ApplyOutcome::Deleted, live, None),
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        done(oref, ApplyOutcome::Absent, None, None)
                    }
                    Err(e) => fail(oref, kube_err(&e)),
                }
            }
            ReleaseAction::DryRun | ReleaseAction::Apply => {
                let dry = cmd.action == ReleaseAction::DryRun;
                let mut pp = PatchParams::apply(&cmd.field_manager);
                if cmd.force {
                    pp = pp.force();
                }
                if dry {
                    pp = pp.dry_run();
                }
                let mut body = obj.clone();
                if namespaced
                    && let Some(m) = body.get_mut("metadata").and_then(Value::as_object_mut)
                {
                    m.insert(
                        "namespace".into(),
                        Value::String(oref.namespace.clone().unwrap_or_default()),
                    );
                }
                match api.patch(name, &pp, &Patch::Apply(&body)).await {
                    Ok(res) => {
                        let result = serde_json::to_value(res).ok().map(trim);
                        let outcome = match (&live, dry) {
                            (None, true) => ApplyOutcome::WouldCreate,
                            (None, false) => ApplyOutcome::Created,
                            (Some(l), _) if Some(content(l)) == result.as_ref().map(content) => {
                                ApplyOutcome::Unchanged
                            }
                            (Some(_), true) => ApplyOutcome::WouldConfigure,
                            (Some(_), false) => ApplyOutcome::Configured,
                        };
                        done(oref, outcome, live, result)
                    }
                    // the namespace is created by this same command (a dry-run creates nothing, so the
                    // API server can't check what goes into it): it would be created after its namespace
                    Err(kube::Error::Api(s))
                        if dry
                            && s.code == 404
                            && live.is_none()
                            && namespaced
                            && creates_namespace(cmd, oref.namespace.as_deref()) =>
                    {
                        done(oref, ApplyOutcome::WouldCreate, None, Some(body))
                    }
                    Err(e) => ObjectOutcome {
                        live,
                        ..fail(oref, kube_err(&e))
                    },
                }
            }
        }
    }
}

/// Whether a command carries the Namespace `ns` itself.
fn creates_namespace(cmd: &ReleaseCommand, ns: Option<&str>) -> bool {
    ns.is_some_and(|ns| {
        cmd.objects.iter().any(|o| {
            o.get("kind").and_then(Value::as_str) == Some("Namespace")
                && o.pointer("/metadata/name").and_then(Value::as_str) == Some(ns)
        })
    })
}

/// A blocking flush on the blocking pool: sled 0.34.7's `flush_async` next to the outbox's own flushes and
/// transactions has been seen to hang the whole database under load.
async fn flush(tree: &sled::Tree) -> Result<(), FlushError> {
    let tree = tree.clone();
    tokio::task::spawn_blocking(move || tree.flush()).await??;
    Ok(())
}

/// `managedFields` never leave the agent.
fn trim(mut v: Value) -> Value {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    v
}

fn kube_err(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        other => other.to_string(),
    }
}

/// Answers `fleet.cmd.<cluster>.release` until cancelled.
pub async fn serve(
    exec: Arc<Executor>,
    nats: async_nats::Client,
    cancel: CancellationToken,
) -> Result<(), async_nats::SubscribeError> {
    let subj = subject::command(&exec.cluster, "release");
    let mut sub = nats.subscribe(subj.clone()).await?;
    tracing::info!(cluster = %exec.cluster, subject = %subj, keys = exec.keys.len(), "release commands accepted");
    let mut prune = tokio::time::interval(Duration::from_secs(60));
    loop {
        let msg = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = prune.tick() => { exec.prune(Utc::now()); continue; }
            m = sub.next() => match m { Some(m) => m, None => return Ok(()) },
        };
        let Some(reply) = msg.reply.clone() else {
            continue;
        };
        let (exec, nats) = (exec.clone(), nats.clone());
        tokio::spawn(async move {
            let result = exec.handle(&msg.payload).await;
            let now = Utc::now();
            let env = Envelope {
                schema: ReleaseResult::SCHEMA.into(),
                version: ReleaseResult::VERSION,
                cluster: exec.cluster.clone(),
                source: exec.source.clone(),
                cluster_time: now,
                agent_time: now,
                seq: 0,
                payload: result,
            };
            match multipilot_schemas::encode(&env) {
                Ok(body) => {
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert(
                        multipilot_schemas::HEADER_CONTENT_TYPE,
                        multipilot_schemas::CONTENT_TYPE_MSGPACK,
                    );
                    headers.insert(
                        multipilot_schemas::HEADER_SCHEMA,
                        ReleaseResult::schema_header().as_str(),
                    );
                    if let Err(e) = nats.publish_with_headers(reply, headers, body.into()).await {
                        tracing::warn!(error = %e, "release reply not sent");
                    }
                }
                Err(e) => tracing::error!(error = %e, "release reply not encodable"),
            }
        });
    }
}
