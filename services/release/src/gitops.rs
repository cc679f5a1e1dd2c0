//! Fleet repositories: the release role follows Git branches and turns each new commit into plans and
//! applies, and reports every release's sync status per cluster.
//!
//! Layout of a fleet repository (under the repository's `path`):
//!
//! ```text
//! releases/<name>.yaml   one release spec each (the format of `multipilot release apply -f`;
//!                        `manifest_files` are read from the same commit, relative to the spec)
//! policies/<name>.yaml   policy bundles: release specs too (RBAC, quotas, network policies, Pod Security
//!                        labels), rendered per cluster from its labels; reported as policies
//! ```
//!
//! A spec's `kustomize` path (relative to the spec, a template over the cluster context) is rendered for
//! every cluster the spec targets when the commit is read; each distinct overlay is built with
//! `kubectl kustomize` (`release.gitops.kubectl`) on the commit's files, written out once per commit next to
//! the bare clone (`git read-tree` + `git checkout-index` into `<name>.tree` with an index of its own, so
//! the clone is left alone) and removed afterwards. What it built goes into the spec (`kustomized`), so a
//! commit that changes only a base changes the spec and is planned; a build that fails refuses the commit,
//! naming the spec, the path and the commit.
//!
//! A commit is taken whole, in two waves: the policy bundles first (the namespaces, quotas and roles the
//! releases rely on), then the releases. Every file must parse, and every spec a wave changes is planned
//! (render, API-version gate, risks, dry-run on every target) before any of the wave is applied; if a file
//! does not parse or a plan is not clean, nothing (more) of the commit is applied, and the problem is
//! recorded on the release stream (`fleet.release.gitops-<repo>.sync`) and shown by
//! `multipilot gitops status`. Otherwise each changed release with `sync.auto` (the default) starts
//! applying in batches behind the health gates; batches holding a cluster of `sync.approval_selector` wait
//! for the `gate` approval. A spec whose content did not change is not planned again. Removing a spec from
//! the repository stops following it; it deletes nothing from the clusters.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use multipilot_schemas::payload::{
    AuditOutcome, AuditRecord, ReleaseEntry, ReleaseEvent, ReleaseState,
};
use multipilot_schemas::{Envelope, Payload, stable_id, subject};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Mutex;

use crate::Service;
use crate::config::Repo;
use crate::drift::DriftItem;
use crate::model::{BatchState, Release, Source, State};
use crate::spec::Spec;

/// What the role knows of one followed repository.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RepoStatus {
    /// Name.
    pub name: String,
    /// URL.
    pub url: String,
    /// Branch.
    pub branch: String,
    /// The commit fetched last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    /// The last commit taken whole (planned, and handed to apply where allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced: Option<String>,
    /// When the branch was fetched last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetched_at: Option<DateTime<Utc>>,
    /// Why the last fetch or the head commit failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The head commit, when it was refused. It is tried again with backoff (a plan may have failed on
    /// something passing: an agent away, a cluster not registered yet), at once on `multipilot gitops sync`,
    /// and a new commit is taken as soon as it is fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// When a refused head commit is tried again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<DateTime<Utc>>,
    /// Times the head commit was refused.
    #[serde(default)]
    pub attempts: u32,
    /// Releases in the head commit, with their file.
    #[serde(default)]
    pub releases: BTreeMap<String, String>,
    /// Policy bundles in the head commit, with their file.
    #[serde(default)]
    pub policies: BTreeMap<String, String>,
}

/// The sync status of a release on one cluster, in Argo CD's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Sync {
    /// Runs what the repository says.
    Synced,
    /// Runs something else: a commit not applied yet (waiting, refused), or drift.
    OutOfSync,
    /// Being applied or rolled back.
    Progressing,
    /// Failed, rolled back, or self-heal gave up.
    Degraded,
}

/// One cluster of a release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterSync {
    /// Cluster.
    pub cluster: String,
    /// Status.
    pub status: Sync,
    /// The release revision it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// The commit it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Why it is not synced.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// What drifted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<DriftItem>,
}

/// A release's sync status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleaseSync {
    /// Release.
    pub release: String,
    /// The repository it comes from (none: applied by hand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// Its file there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Whether it is a policy bundle.
    #[serde(default)]
    pub policy: bool,
    /// The worst of its clusters.
    pub status: Sync,
    /// Revision and state of the latest plan.
    pub revision: u64,
    /// State.
    pub state: State,
    /// The commit of the latest plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Per cluster.
    pub clusters: Vec<ClusterSync>,
}

/// The `gitops` reply: repositories and releases.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Followed repositories.
    pub repos: Vec<RepoStatus>,
    /// Every release.
    pub releases: Vec<ReleaseSync>,
    /// The sync windows (`release.windows`): each one, open now or when it next opens.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<crate::windows::ActiveWindow>,
}

/// The followers' shared state.
#[derive(Debug, Default)]
pub struct Follower {
    repos: Mutex<BTreeMap<String, RepoStatus>>,
    /// One sync at a time per role (the interval's and an operator's).
    syncing: Mutex<()>,
    wake: tokio::sync::Notify,
}

/// A spec read from a commit.
struct Found {
    file: String,
    policy: bool,
    text: String,
    spec: Spec,
}

fn short(commit: &str) -> String {
    commit.chars().take(12).collect()
}

/// Why git did not give what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GitError {
    /// It ran too long (and was killed).
    #[error("git {0} took longer than 120s")]
    Timeout(String),
    /// It could not be started.
    #[error("running {git}: {error}")]
    Spawn {
        /// The git binary configured.
        git: String,
        /// Why.
        error: Arc<std::io::Error>,
    },
    /// It failed: its command and what it said.
    #[error("git {command}: {stderr}")]
    Failed {
        /// The git command (`clone`, `fetch`, `show`…).
        command: String,
        /// Its standard error.
        stderr: String,
    },
    /// The work directory could not be made.
    #[error("{0}")]
    WorkDir(Arc<std::io::Error>),
    /// A manifest file the spec names is not in the commit.
    #[error("not in the commit")]
    NotInCommit,
}

/// Why a spec's kustomize overlay was not built from a commit. The path, the commit, a build that fails
/// and what it builds are the commit's to fix; a timeout or a `kubectl` that does not start may pass (the
/// refused commit is tried again with backoff).
#[derive(Debug, thiserror::Error)]
pub enum KustomizeError {
    /// The path leaves the repository.
    #[error("the path leaves the repository")]
    Outside,
    /// The commit has no such directory.
    #[error("no such directory in the commit")]
    Missing,
    /// The commit's files could not be written out.
    #[error("writing the commit's files out: {0}")]
    Tree(#[source] GitError),
    /// `kubectl kustomize` ran too long (and was killed).
    #[error("kubectl kustomize took longer than {}s", KUSTOMIZE_TIMEOUT.as_secs())]
    Timeout,
    /// `kubectl` could not be started.
    #[error("running {kubectl}: {error}")]
    Spawn {
        /// The kubectl program configured.
        kubectl: String,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// `kubectl kustomize` failed: what it said (paths relative to the commit).
    #[error("kubectl kustomize: {0}")]
    Failed(String),
    /// What it built is not Kubernetes objects.
    #[error("document {document} it built: {message}")]
    Output {
        /// Which document (from 1).
        document: usize,
        /// What is wrong.
        message: String,
    },
}

/// How long `kubectl kustomize` may take (as `git`).
const KUSTOMIZE_TIMEOUT: Duration = Duration::from_secs(120);

/// A commit's files, written out for `kubectl kustomize`; removed when dropped.
struct Tree {
    dir: PathBuf,
    index: PathBuf,
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.index);
    }
}

/// Why a commit's releases don't go after its policies.
#[derive(Debug, thiserror::Error)]
pub enum Held {
    /// A policy bundle of the commit did not apply.
    #[error("policy bundle {bundle} is {state}")]
    Failed {
        /// The bundle.
        bundle: String,
        /// Its state.
        state: &'static str,
    },
    /// The role is stopping.
    #[error("the release role is stopping")]
    Stopping,
}

impl Service {
    /// Follows one repository until the role stops: at start, every `interval`, and when asked.
    pub async fn follow_repo(self: Arc<Self>, repo: Repo) {
        self.gitops.repos.lock().await.insert(
            repo.name.clone(),
            RepoStatus {
                name: repo.name.clone(),
                url: repo.url.clone(),
                branch: repo.branch.clone(),
                ..Default::default()
            },
        );
        // the fleet registry first: plans need the clusters' facts
        self.registry.wait_loaded(self.config.registry_wait).await;
        let mut asked = false;
        loop {
            self.sync_repo(&repo, asked).await;
            asked = tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(repo.interval) => false,
                _ = self.gitops.wake.notified() => true,
            };
        }
    }

    fn work_dir(&self, repo: &Repo) -> PathBuf {
        Path::new(&self.config.data_dir)
            .join("gitops")
            .join(format!("{}.git", repo.name))
    }

    async fn git(&self, dir: Option<&Path>, args: &[&str]) -> Result<String, GitError> {
        self.git_env(dir, args, &[]).await
    }

    async fn git_env(
        &self,
        dir: Option<&Path>,
        args: &[&str],
        env: &[(&str, &Path)],
    ) -> Result<String, GitError> {
        let mut cmd = tokio::process::Command::new(&self.config.gitops.git);
        if let Some(d) = dir {
            cmd.arg("-C").arg(d);
        }
        cmd.args(args)
            .envs(env.iter().copied())
            .env("GIT_TERMINAL_PROMPT", "0")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
            .await
            .map_err(|_| GitError::Timeout(args.join(" ")))?
            .map_err(|e| GitError::Spawn {
                git: self.config.gitops.git.clone(),
                error: Arc::new(e),
            })?;
        if !out.status.success() {
            return Err(GitError::Failed {
                command: args
                    .iter()
                    .find(|a| !a.starts_with('-'))
                    .copied()
                    .unwrap_or_default()
                    .to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Clones (bare) or fetches the branch; returns its commit.
    async fn fetch(&self, repo: &Repo) -> Result<String, GitError> {
        let dir = self.work_dir(repo);
        let branch_ref = format!("refs/heads/{}", repo.branch);
        if !dir.join("HEAD").exists() {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent).map_err(|e| GitError::WorkDir(Arc::new(e)))?;
            }
            let _ = std::fs::remove_dir_all(&dir);
            let d = dir.to_string_lossy().into_owned();
            self.git(
                None,
                &[
                    "clone",
                    "--quiet",
                    "--bare",
                    "--single-branch",
                    "--branch",
                    &repo.branch,
                    &repo.url,
                    &d,
                ],
            )
            .await?;
        } else {
            let spec = format!("+{branch_ref}:{branch_ref}");
            self.git(
                Some(&dir),
                &["fetch", "--quiet", "--prune", &repo.url, &spec],
            )
            .await?;
        }
        Ok(self
            .git(Some(&dir), &["rev-parse", &branch_ref])
            .await?
            .trim()
            .to_string())
    }

    /// A file of a commit.
    async fn show(&self, dir: &Path, commit: &str, path: &str) -> Result<String, GitError> {
        self.git(Some(dir), &["show", &format!("{commit}:{path}")])
            .await
    }

    /// Writes a commit's files out (next to the bare clone, with an index of its own).
    async fn tree(&self, repo: &Repo, commit: &str) -> Result<Tree, GitError> {
        let git_dir = self.work_dir(repo);
        let workdir = |e| GitError::WorkDir(Arc::new(e));
        // absolute: git runs in the clone (-C)
        let dir = std::path::absolute(git_dir.with_extension("tree")).map_err(workdir)?;
        let tree = Tree {
            index: dir.with_extension("index"),
            dir,
        };
        // what a crash left behind
        let _ = std::fs::remove_dir_all(&tree.dir);
        let _ = std::fs::remove_file(&tree.index);
        std::fs::create_dir_all(&tree.dir).map_err(workdir)?;
        let work_tree = format!("--work-tree={}", tree.dir.display());
        let env = [("GIT_INDEX_FILE", tree.index.as_path())];
        self.git_env(Some(&git_dir), &[&work_tree, "read-tree", commit], &env)
            .await?;
        self.git_env(
            Some(&git_dir),
            &[&work_tree, "checkout-index", "--all", "--force"],
            &env,
        )
        .await?;
        Ok(tree)
    }

    /// `kubectl kustomize <path>` on a commit's files.
    async fn kustomize_build(&self, tree: &Path, path: &str) -> Result<String, KustomizeError> {
        let mut cmd = tokio::process::Command::new(&self.config.gitops.kubectl);
        cmd.arg("kustomize")
            .arg(tree.join(path))
            .current_dir(tree)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(KUSTOMIZE_TIMEOUT, cmd.output())
            .await
            .map_err(|_| KustomizeError::Timeout)?
            .map_err(|error| KustomizeError::Spawn {
                kubectl: self.config.gitops.kubectl.clone(),
                error,
            })?;
        if !out.status.success() {
            return Err(KustomizeError::Failed(kubectl_said(&out.stderr, tree)));
        }
        String::from_utf8(out.stdout)
            .map_err(|_| KustomizeError::Failed("what it built is not UTF-8 text".into()))
    }

    /// Builds the overlays a spec's `kustomize` picks for the clusters it targets now and writes them into
    /// the spec's text; a spec without one is returned as it is. Every problem names the spec, the path
    /// (in the commit) and the commit. The commit's files are written out once (`tree`); what was built
    /// is kept for the other specs of the commit (`built`, by path in the commit).
    #[allow(clippy::too_many_arguments)]
    async fn kustomize(
        &self,
        repo: &Repo,
        commit: &str,
        file: &str,
        text: String,
        tree: &mut Option<Tree>,
        built: &mut BTreeMap<String, String>,
        problems: &mut Vec<String>,
    ) -> Option<String> {
        // not a spec (yet): Spec::parse says why
        let Ok(spec) = serde_yaml::from_str::<Spec>(&text) else {
            return Some(text);
        };
        if spec.kustomize.is_none() {
            return Some(text);
        }
        let parent = Path::new(file)
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let reg = self.registry.snapshot();
        // the overlays of the clusters targeted now; a path that doesn't render for a cluster, or no
        // target, is the plan's to say (per cluster)
        let keys: std::collections::BTreeSet<String> = crate::plan::targets(&spec, &reg)
            .unwrap_or_default()
            .iter()
            .filter_map(|c| {
                crate::render::kustomize_path(&spec, c, &reg[c])
                    .ok()
                    .flatten()
            })
            .collect();
        let mut outputs = BTreeMap::new();
        let mut ok = true;
        for key in keys {
            let at = inside(&format!("{parent}/{key}"));
            let shown = at.clone().unwrap_or_else(|| format!("{parent}/{key}"));
            let mut fail = |e: KustomizeError| {
                problems.push(format!(
                    "{file}: kustomize {shown} at commit {}: {e}",
                    short(commit)
                ));
                ok = false;
            };
            let Some(at) = at else {
                fail(KustomizeError::Outside);
                continue;
            };
            if let Some(out) = built.get(&at) {
                outputs.insert(key, out.clone());
                continue;
            }
            if tree.is_none() {
                match self.tree(repo, commit).await {
                    Ok(t) => *tree = Some(t),
                    Err(e) => {
                        fail(KustomizeError::Tree(e));
                        return None;
                    }
                }
            }
            let Some(t) = tree.as_ref() else { continue };
            if !t.dir.join(&at).is_dir() {
                fail(KustomizeError::Missing);
                continue;
            }
            let out = match self.kustomize_build(&t.dir, &at).await {
                Ok(out) => out,
                Err(e) => {
                    fail(e);
                    continue;
                }
            };
            if let Err(e) = crate::render::split_with(&out, |document, message| {
                crate::render::Error::Document {
                    template: 0,
                    document,
                    message,
                }
            }) {
                fail(match e {
                    crate::render::Error::Document {
                        document, message, ..
                    } => KustomizeError::Output { document, message },
                    other => KustomizeError::Output {
                        document: 0,
                        message: other.to_string(),
                    },
                });
                continue;
            }
            built.insert(at, out.clone());
            outputs.insert(key, out);
        }
        if !ok {
            return None;
        }
        match crate::spec::inline_kustomized(&text, &outputs) {
            Ok(t) => Some(t),
            Err(e) => {
                problems.push(format!("{file}: {e}"));
                None
            }
        }
    }

    /// The specs of a commit, or every problem found reading them.
    async fn read_commit(&self, repo: &Repo, commit: &str) -> Result<Vec<Found>, Vec<String>> {
        let dir = self.work_dir(repo);
        let base = repo.path.trim_matches('/');
        let sub = |d: &str| {
            if base.is_empty() {
                d.to_string()
            } else {
                format!("{base}/{d}")
            }
        };
        let (rel, pol) = (sub("releases"), sub("policies"));
        let listed = self
            .git(
                Some(&dir),
                &["ls-tree", "-r", "--name-only", commit, "--", &rel, &pol],
            )
            .await
            .map_err(|e| vec![e.to_string()])?;
        let mut found = Vec::new();
        let mut problems = Vec::new();
        let (mut tree, mut built) = (None, BTreeMap::new());
        for file in listed.lines().filter(|f| {
            (f.ends_with(".yaml") || f.ends_with(".yml"))
                && (f.starts_with(&format!("{rel}/")) || f.starts_with(&format!("{pol}/")))
                // manifest files live in sub-directories next to the specs
                && Path::new(f).parent().is_some_and(|p| p == Path::new(&rel) || p == Path::new(&pol))
        }) {
            let text = match self.show(&dir, commit, file).await {
                Ok(t) => t,
                Err(e) => {
                    problems.push(format!("{file}: {e}"));
                    continue;
                }
            };
            // manifest_files: read from the same commit, relative to the spec
            let parent = Path::new(file)
                .parent()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            let mut wanted = Vec::new();
            if let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(&text)
                && let Some(list) = doc.get("manifest_files").and_then(|v| v.as_sequence())
            {
                wanted = list
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect();
            }
            let mut files = BTreeMap::new();
            for f in wanted {
                let p = normalize(&format!("{parent}/{f}"));
                files.insert(f, self.show(&dir, commit, &p).await);
            }
            let text = match crate::spec::inline_manifest_files(&text, |f| {
                files
                    .get(f)
                    .cloned()
                    .unwrap_or(Err(GitError::NotInCommit))
            }) {
                Ok(t) => t,
                Err(e) => {
                    problems.push(format!("{file}: {e}"));
                    continue;
                }
            };
            // kustomize: the overlays built from the same commit
            let Some(text) = self
                .kustomize(
                    repo,
                    commit,
                    file,
                    text,
                    &mut tree,
                    &mut built,
                    &mut problems,
                )
                .await
            else {
                continue;
            };
            match Spec::parse(&text) {
                Ok(spec) => found.push(Found {
                    file: file.to_string(),
                    policy: file.starts_with(&format!("{pol}/")),
                    text,
                    spec,
                }),
                Err(e) => problems.push(format!("{file}: {e}")),
            }
        }
        let mut names: BTreeMap<&str, &str> = BTreeMap::new();
        for f in &found {
            if let Some(other) = names.insert(&f.spec.name, &f.file) {
                problems.push(format!(
                    "{} and {other} both define release {}",
                    f.file, f.spec.name
                ));
            }
        }
        if problems.is_empty() {
            Ok(found)
        } else {
            Err(problems)
        }
    }

    /// One round for one repository: fetch; take a new head commit whole.
    pub(crate) async fn sync_repo(self: &Arc<Self>, repo: &Repo, asked: bool) {
        let _one = self.gitops.syncing.lock().await;
        let head = match self.fetch(repo).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(repo = %repo.name, error = %e, "fetching the fleet repository failed");
                self.set_repo(repo, |s| s.error = Some(e.to_string())).await;
                return;
            }
        };
        let label = short(&head);
        let seen = self.gitops.repos.lock().await.get(&repo.name).cloned();
        let now = Utc::now();
        self.set_repo(repo, |s| {
            s.fetched_at = Some(now);
        })
        .await;
        // a commit taken before is looked at again each round: a cluster that joined the fleet (or whose
        // labels changed) and now matches a release's selector gets it
        if !asked
            && let Some(s) = &seen
            && s.refused.as_deref() == Some(label.as_str())
            && s.retry_at.is_some_and(|t| now < t)
        {
            return;
        }
        if self.registry.snapshot().is_empty() {
            // nothing to plan against yet (the agents are starting): not a refusal, the next round tries
            self.set_repo(repo, |s| {
                s.head = Some(label.clone());
                s.error =
                    Some("waiting for the fleet registry: no cluster has reported yet".into());
            })
            .await;
            return;
        }
        let found = match self.read_commit(repo, &head).await {
            Ok(f) => f,
            Err(problems) => {
                self.refuse(repo, &label, &problems).await;
                return;
            }
        };
        self.set_repo(repo, |s| {
            s.head = Some(label.clone());
            s.releases = found
                .iter()
                .filter(|f| !f.policy)
                .map(|f| (f.spec.name.clone(), f.file.clone()))
                .collect();
            s.policies = found
                .iter()
                .filter(|f| f.policy)
                .map(|f| (f.spec.name.clone(), f.file.clone()))
                .collect();
        })
        .await;
        // what changed, and what can't be planned now
        let mut changed = Vec::new();
        for f in found {
            match self.store.get(&f.spec.name) {
                Ok(Some(r)) if r.state.busy() => {
                    tracing::info!(repo = %repo.name, release = %r.name, "busy: the commit is taken once it is done");
                    self.set_repo(repo, |s| {
                        s.error = Some(format!(
                            "release {} is {}: waiting for it",
                            r.name,
                            r.state.as_str()
                        ))
                    })
                    .await;
                    return;
                }
                // taken before (applied, applying, waiting for the gate, or failed: a failed release is
                // not retried until a commit changes it); a plan a refused commit left is planned again
                // a plan made for this very commit (waiting for a person: sync.auto off, a risk approval)
                // is not made again every round; one a refused commit left is, with the next commit
                Ok(Some(r))
                    if r.spec == f.spec
                        && self.same_targets(&r)
                        && (!matches!(r.state, State::Planned | State::Blocked)
                            || (r.state == State::Planned
                                && r.source.commit.as_deref() == Some(label.as_str()))) => {}
                Ok(_) => changed.push(f),
                Err(e) => {
                    self.set_repo(repo, |s| s.error = Some(e.to_string())).await;
                    return;
                }
            }
        }
        let actor = format!("gitops/{}", repo.name);
        // two waves: the policy bundles (namespaces, quotas, RBAC the releases rely on), then the releases
        let (policies, releases): (Vec<Found>, Vec<Found>) =
            changed.into_iter().partition(|f| f.policy);
        let mut applied_before = Vec::new();
        for (wave, files) in [("policies", policies), ("releases", releases)] {
            if files.is_empty() {
                continue;
            }
            let planned = match self.plan_wave(repo, &label, &files, &actor).await {
                Ok(p) => p,
                Err(mut problems) => {
                    if !applied_before.is_empty() {
                        problems.push(format!(
                            "the policy bundles of this commit were applied before: {}",
                            applied_before.join(", ")
                        ));
                    }
                    self.refuse(repo, &label, &problems).await;
                    return;
                }
            };
            for r in &planned {
                if !r.spec.sync.auto {
                    continue;
                }
                match self.start(&r.name, &actor, false).await {
                    Ok(_) => applied_before.push(r.name.clone()),
                    // recorded on the release's history by `start` (a missing approval waits for a person)
                    Err(e) => {
                        tracing::info!(repo = %repo.name, release = %r.name, reason = %e, "not applied")
                    }
                }
            }
            if wave == "policies" {
                // the releases rely on the policies: they go only once every policy of the commit is applied
                if let Err(why) = self.wait_applied(&applied_before).await {
                    self.refuse(
                        repo,
                        &label,
                        &[format!("the releases of this commit wait: {why}")],
                    )
                    .await;
                    return;
                }
            }
        }
        if seen.as_ref().and_then(|s| s.synced.as_deref()) != Some(label.as_str()) {
            tracing::info!(repo = %repo.name, commit = %label, "fleet repository commit taken");
        }
        self.set_repo(repo, |s| {
            s.synced = Some(label.clone());
            s.error = None;
            s.refused = None;
            s.retry_at = None;
            s.attempts = 0;
        })
        .await;
    }

    /// Whether a release's plan covers the clusters its targets select now.
    fn same_targets(&self, r: &Release) -> bool {
        let mut planned: Vec<&str> = r.plan.clusters.iter().map(|c| c.cluster.as_str()).collect();
        planned.sort_unstable();
        match crate::plan::targets(&r.spec, &self.registry.snapshot()) {
            Ok(now) => now.iter().map(String::as_str).eq(planned),
            // nothing matches now (clusters away): keep what runs
            Err(_) => true,
        }
    }

    /// Plans one wave's specs; every plan must be clean.
    async fn plan_wave(
        &self,
        repo: &Repo,
        label: &str,
        files: &[Found],
        actor: &str,
    ) -> Result<Vec<Release>, Vec<String>> {
        let mut planned = Vec::new();
        let mut problems = Vec::new();
        for f in files {
            let source = Source {
                path: Some(f.file.clone()),
                commit: Some(label.to_string()),
                dirty: None,
                repo: Some(repo.name.clone()),
                policy: f.policy,
            };
            match self.plan_new(&f.text, source, actor).await {
                Ok(r) if r.plan.clean() => planned.push(r),
                Ok(r) => problems.extend(
                    r.plan
                        .problems()
                        .into_iter()
                        .map(|p| format!("{} ({}): {p}", f.file, r.name)),
                ),
                Err(e) => problems.push(format!("{}: {e}", f.file)),
            }
        }
        if problems.is_empty() {
            Ok(planned)
        } else {
            Err(problems)
        }
    }

    /// Waits until every one of `names` is applied; why not, when one failed, waits for a person, or the
    /// role stops.
    async fn wait_applied(&self, names: &[String]) -> Result<(), Held> {
        loop {
            let mut busy = false;
            for n in names {
                let Some(r) = self.store.get(n).ok().flatten() else {
                    continue;
                };
                match r.state {
                    State::Succeeded => {}
                    // applying, or held by a window or a dependency: the releases wait for it
                    s if s.busy() || s == State::Held => busy = true,
                    s => {
                        return Err(Held::Failed {
                            bundle: n.clone(),
                            state: s.as_str(),
                        });
                    }
                }
            }
            if !busy {
                return Ok(());
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return Err(Held::Stopping),
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    async fn set_repo(&self, repo: &Repo, f: impl FnOnce(&mut RepoStatus)) {
        let mut all = self.gitops.repos.lock().await;
        let s = all.entry(repo.name.clone()).or_insert_with(|| RepoStatus {
            name: repo.name.clone(),
            url: repo.url.clone(),
            branch: repo.branch.clone(),
            ..Default::default()
        });
        f(s);
    }

    /// A commit that can't be taken: nothing of it is applied; the problem goes on the release stream.
    async fn refuse(&self, repo: &Repo, commit: &str, problems: &[String]) {
        let summary = format!(
            "commit {commit} of {} refused, nothing applied: {}",
            repo.name,
            problems.join("; ")
        );
        tracing::warn!(repo = %repo.name, commit, problems = ?problems, "fleet repository commit refused");
        let base =
            chrono::Duration::from_std(repo.interval).unwrap_or(chrono::Duration::seconds(30));
        self.set_repo(repo, |s| {
            if s.refused.as_deref() != Some(commit) {
                s.attempts = 0;
            }
            s.attempts += 1;
            let backoff = (base * 2i32.pow(s.attempts.min(10))).min(chrono::Duration::minutes(10));
            s.retry_at = Some(Utc::now() + backoff);
            s.head = Some(commit.to_string());
            s.refused = Some(commit.to_string());
            s.error = Some(summary.clone());
        })
        .await;
        let at = Utc::now();
        let ev = ReleaseEvent {
            release: repo.name.clone(),
            revision: 0,
            what: ReleaseEntry::Sync,
            state: ReleaseState::Refused,
            actor: format!("gitops/{}", repo.name),
            batch: None,
            clusters: Vec::new(),
            ok: false,
            summary: summary.clone(),
            detail: json!({"repo": repo.name, "url": repo.url, "branch": repo.branch,
                "commit": commit, "problems": problems}),
            commit: Some(commit.to_string()),
            at,
        };
        let env = |schema: &str, version: u32| Envelope {
            schema: schema.into(),
            version,
            cluster: String::new(),
            source: self.instance.clone(),
            cluster_time: at,
            agent_time: at,
            seq: 0,
            payload: (),
        };
        let e1 = env(ReleaseEvent::SCHEMA, ReleaseEvent::VERSION).map(|_| ev.clone());
        if let Err(e) = multipilot_bus::publish::publish_one(
            &self.js,
            subject::release(&format!("gitops-{}", repo.name), "sync"),
            stable_id(&["gitops-refused", &repo.name, commit, &problems.join("\n")]),
            &e1,
        )
        .await
        {
            tracing::warn!(repo = %repo.name, error = %e, "sync event not published");
        }
        let audit = AuditRecord {
            id: stable_id(&[
                "gitops-refused-audit",
                &repo.name,
                commit,
                &problems.join("\n"),
            ]),
            actor: ev.actor.clone(),
            role: "release".into(),
            action: "release.sync".into(),
            target: format!("{}@{commit}", repo.name),
            outcome: AuditOutcome::Failed,
            detail: ev.detail.clone(),
            commit: Some(commit.to_string()),
        };
        let e2 = env(AuditRecord::SCHEMA, AuditRecord::VERSION).map(|_| audit.clone());
        if let Err(e) = multipilot_bus::publish::publish_one(
            &self.js,
            subject::audit("release", "release-sync"),
            audit.id.clone(),
            &e2,
        )
        .await
        {
            tracing::warn!(repo = %repo.name, error = %e, "sync audit record not published");
        }
    }

    /// Repositories and every release's sync status.
    pub async fn report(&self) -> Result<Report, crate::store::Error> {
        let repos: Vec<RepoStatus> = self.gitops.repos.lock().await.values().cloned().collect();
        let all = self.store.all()?;
        let drift = self.drift.lock().await;
        let mut releases = Vec::new();
        for r in all {
            let head = r
                .source
                .repo
                .as_ref()
                .and_then(|name| repos.iter().find(|s| &s.name == name));
            // no longer in its repository's head commit (known once the repository was read)
            let removed = head.is_some_and(|s| {
                s.head.is_some()
                    && (!s.releases.is_empty() || !s.policies.is_empty())
                    && !s.releases.contains_key(&r.name)
                    && !s.policies.contains_key(&r.name)
            });
            if removed && r.deployed.is_empty() {
                // a plan a refused commit left behind, never applied anywhere: nothing to report
                continue;
            }
            // a newer commit of its repository that was refused, or not taken yet
            let behind = if removed {
                Some(
                    "removed from the repository: still runs what it applied (nothing is deleted)"
                        .to_string(),
                )
            } else {
                head.and_then(|s| match (&s.refused, &s.error) {
                    (Some(h), Some(e)) if r.source.commit.as_ref() != Some(h) => {
                        Some(format!("commit {h} not applied: {e}"))
                    }
                    _ => None,
                })
            };
            let mut clusters: Vec<String> =
                r.plan.clusters.iter().map(|c| c.cluster.clone()).collect();
            for c in r.deployed.keys() {
                if !clusters.contains(c) {
                    clusters.push(c.clone());
                }
            }
            let per: Vec<ClusterSync> = clusters
                .into_iter()
                .map(|c| {
                    let items = drift.items(&r.name, &c);
                    cluster_sync(&r, &c, items, behind.as_deref())
                })
                .collect();
            releases.push(ReleaseSync {
                release: r.name.clone(),
                repo: r.source.repo.clone(),
                path: r.source.path.clone(),
                policy: r.source.policy,
                status: per.iter().map(|c| c.status).max().unwrap_or(Sync::Synced),
                revision: r.revision,
                state: r.state,
                commit: r.source.commit_label(),
                clusters: per,
            });
        }
        Ok(Report {
            repos,
            releases,
            windows: self.windows.overview(Utc::now()),
        })
    }

    /// Wakes the followers (`multipilot gitops sync`).
    pub fn wake_followers(&self) {
        self.gitops.wake.notify_waiters();
    }
}

/// One cluster's sync status for a release.
fn cluster_sync(
    r: &Release,
    cluster: &str,
    drift: Vec<DriftItem>,
    behind: Option<&str>,
) -> ClusterSync {
    let dep = r.deployed.get(cluster);
    let batch = r
        .batches
        .iter()
        .find(|b| b.clusters.iter().any(|c| c == cluster));
    let batch_done = batch.is_some_and(|b| b.state == BatchState::Done);
    let at_revision = dep.is_some_and(|d| d.revision == r.revision);
    let (status, message) = if r.state.busy() && !batch_done {
        let why = if r.changed.iter().any(|c| c == cluster) {
            format!("{} (revision {})", r.state.as_str(), r.revision)
        } else {
            format!("batch {} pending", batch.map(|b| b.index).unwrap_or(0))
        };
        (Sync::Progressing, why)
    } else if matches!(
        r.state,
        State::Failed | State::RollbackFailed | State::Interrupted | State::RolledBack
    ) && r.changed.iter().any(|c| c == cluster)
    {
        (
            Sync::Degraded,
            r.error
                .clone()
                .unwrap_or_else(|| format!("revision {} {}", r.revision, r.state.as_str())),
        )
    } else if drift.iter().any(|d| d.gave_up) {
        (
            Sync::Degraded,
            "self-heal gave up on drifted objects".to_string(),
        )
    } else if !drift.is_empty() {
        (
            Sync::OutOfSync,
            format!(
                "{} object(s) drifted from what the release applied",
                drift.len()
            ),
        )
    } else if let Some(b) = behind {
        (Sync::OutOfSync, b.to_string())
    } else if !at_revision {
        let why = match r.state {
            State::WaitingApproval => format!(
                "waiting for approval: multipilot release approve {} {}",
                r.name,
                r.waiting_for
                    .as_deref()
                    .unwrap_or(crate::spec::GATE_APPROVAL)
            ),
            State::Held => format!(
                "held: {}",
                r.waiting_for
                    .as_deref()
                    .unwrap_or("a sync window or a dependency")
            ),
            State::Blocked => "the plan is blocked".to_string(),
            State::Planned => match r.missing_approvals() {
                m if !m.is_empty() => format!("needs approval: {}", m.join(", ")),
                _ => "planned, not applied".to_string(),
            },
            _ => format!("revision {} not applied here", r.revision),
        };
        (Sync::OutOfSync, why)
    } else {
        (Sync::Synced, String::new())
    };
    ClusterSync {
        cluster: cluster.to_string(),
        status,
        revision: dep.map(|d| d.revision),
        commit: dep.and_then(|d| d.commit.clone()),
        message,
        drift,
    }
}

/// What kubectl said, without klog's prefix and the directory the commit was written out to (so paths
/// are the commit's).
fn kubectl_said(stderr: &[u8], tree: &Path) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    // `E1203 13:59:39.306361   32116 run.go:72] "command failed" err="…"`
    let said = match text.find(" err=\"") {
        Some(i) => text[i + 6..]
            .trim_end_matches('"')
            .replace("\\\"", "\"")
            .replace("\\'", "'"),
        None => text.strip_prefix("Error: ").unwrap_or(text).to_string(),
    };
    let dir = tree.display().to_string();
    let said = said.replace(&format!("{dir}/"), "").replace(&dir, ".");
    match said.char_indices().nth(2000) {
        Some((i, _)) => format!("{}…", &said[..i]),
        None => said,
    }
}

/// `a/./b/../c` → `a/c`, inside a commit; none when `..` leaves it.
fn inside(p: &str) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for part in p.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            other => out.push(other),
        }
    }
    Some(out.join("/"))
}

/// `a/./b/../c` → `a/c` (paths inside a commit).
fn normalize(p: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for part in p.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_commit() {
        assert_eq!(
            inside("fleet/releases/../overlays/./prod").as_deref(),
            Some("fleet/overlays/prod")
        );
        assert_eq!(inside("releases/../..").as_deref(), None);
        assert_eq!(inside("/releases/..").as_deref(), Some(""));
    }

    #[test]
    fn what_kubectl_says_is_told_with_the_commit_s_paths() {
        let tree = Path::new("/data/gitops/fleet.tree");
        let klog = br#"E1203 13:59:39.245761   32112 run.go:72] "command failed" err="accumulating resources: accumulation err='accumulating resources from 'nope.yaml': evalsymlink failure on '/data/gitops/fleet.tree/overlays/prod/nope.yaml' : lstat /data/gitops/fleet.tree/overlays/prod/nope.yaml: no such file or directory'""#;
        let said = kubectl_said(klog, tree);
        assert!(
            said.starts_with("accumulating resources: ")
                && said.contains("lstat overlays/prod/nope.yaml")
                && !said.contains("fleet.tree"),
            "{said}"
        );
        assert_eq!(
            kubectl_said(b"Error: unknown flag: --x\n", tree),
            "unknown flag: --x"
        );
    }
}
