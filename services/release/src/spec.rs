//! The release spec (YAML): what to render, where, in which batches, with which soak and approvals; and the
//! cluster selector.
//!
//! ```yaml
//! name: web-1-2
//! manifests: |                # minijinja templates, multi-document YAML
//!   apiVersion: apps/v1
//!   kind: Deployment
//!   metadata: {name: web, namespace: shop, labels: {env: "{{ cluster.labels.env }}"}}
//!   ...
//! kustomize: ../overlays/{{ cluster.labels.env }}  # and/or a kustomization (relative to this file;
//!                             # the path is a template, what `kubectl kustomize` builds is not)
//! vars: {image: registry.example.com/web:1.2}
//! targets:
//!   clusters: [prod-euw-1]    # and/or
//!   selector: env=prod,version>=1.25
//! batches: {size: 2}          # or {groups: [[a], [b, c]]}
//! soak: 30s
//! depends_on: [db-schema]     # applied on a cluster once these releases are healthy there
//! analysis:                   # metrics judged over each batch's soak (see the analysis module)
//!   metrics: [{name: errors, template: error-ratio}]
//! field_manager: multipilot
//! force: false
//! approvals: [external-ips]
//! delete:                     # objects the release removes
//!   - {apiVersion: v1, kind: ConfigMap, namespace: shop, name: old-config}
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A spec that can't be used, and why.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not YAML, or not the spec's shape.
    #[error("the release spec is not valid: {0}")]
    Parse(String),
    /// Parsed, but breaks a rule.
    #[error("the release spec is not valid: {0}")]
    Invalid(String),
    /// The analysis can't be used.
    #[error("the release spec is not valid: {0}")]
    Analysis(#[from] crate::analysis::Error),
    /// A selector that doesn't parse.
    #[error("bad selector {selector:?}: {reason}")]
    Selector {
        /// The selector text.
        selector: String,
        /// What is wrong.
        reason: String,
    },
}

/// The release spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Release name: lower-case letters, digits, `-` and `.`, at most 63 characters.
    pub name: String,
    /// What the release is for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Multi-document YAML templates (minijinja): one text, or a list of texts.
    #[serde(default)]
    pub manifests: Manifests,
    /// A directory holding a kustomization, relative to the spec file (to the spec's directory in the
    /// fleet repository); a minijinja template over the same context as the manifests, so that each
    /// cluster picks its overlay (`../overlays/{{ cluster.labels.env }}`). `kubectl kustomize` builds it
    /// (the CLI, or the role from the same commit); its objects come after the manifests' and are not
    /// templates themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kustomize: Option<String>,
    /// What `kubectl kustomize` built, per path as rendered for the targets (normalised, relative to the
    /// spec): filled in by whoever reads the spec file (the CLI, the role's fleet repository reader),
    /// not written by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kustomized: Option<BTreeMap<String, String>>,
    /// Release variables, available to the templates as `vars`.
    #[serde(default)]
    pub vars: BTreeMap<String, Value>,
    /// Which clusters.
    pub targets: Targets,
    /// In which order.
    #[serde(default)]
    pub batches: Batches,
    /// Wait this long after a batch is healthy, with no new incident on its clusters, before the next.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub soak: Option<Duration>,
    /// How long a batch's rollouts may take (default: the role's `health_timeout`).
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub health_timeout: Option<Duration>,
    /// Field manager for server-side apply (default: the role's `field_manager`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_manager: Option<String>,
    /// Take fields other managers own (server-side apply `force`). Off unless said.
    #[serde(default)]
    pub force: bool,
    /// Risks approved in the reviewed spec itself (e.g. `external-ips`).
    #[serde(default)]
    pub approvals: Vec<String>,
    /// Objects the release deletes (snapshotted first; a rollback re-creates them).
    #[serde(default)]
    pub delete: Vec<DeleteRef>,
    /// How the release follows its fleet repository and guards what it applied.
    #[serde(default, skip_serializing_if = "Sync::is_default")]
    pub sync: Sync,
    /// Releases that must be healthy on a cluster before this one is applied there (those that target
    /// it); a cycle is refused at plan time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Metrics measured over each batch's soak against the fleet TSDB (see [`crate::analysis`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<crate::analysis::Analysis>,
}

/// The approval a gated batch waits for (`multipilot release approve <name> gate`).
pub const GATE_APPROVAL: &str = "gate";

/// Sync policy: what happens without a person, and what waits for one.
///
/// ```yaml
/// sync:
///   auto: true                 # from a fleet repository: apply each new commit (default true there)
///   approval_selector: env=prod  # batches with a matching cluster wait for the `gate` approval
///   self_heal: true            # re-apply what someone changed by hand (default false)
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sync {
    /// Apply a new commit of the fleet repository without being asked (a commit that needs a risk approval
    /// still waits for it). Only for specs from a fleet repository.
    #[serde(default = "yes")]
    pub auto: bool,
    /// Clusters matching this selector are applied last, each batch holding one only after the `gate`
    /// approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_selector: Option<String>,
    /// Re-apply objects whose fields someone changed (drift), at most `heal_limit` times per object in
    /// `heal_window`; then give up and say so.
    #[serde(default)]
    pub self_heal: bool,
}

fn yes() -> bool {
    true
}

impl Default for Sync {
    fn default() -> Self {
        Sync {
            auto: true,
            approval_selector: None,
            self_heal: false,
        }
    }
}

impl Sync {
    fn is_default(&self) -> bool {
        *self == Sync::default()
    }
}

/// Template texts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Manifests {
    /// One multi-document text.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Default for Manifests {
    fn default() -> Self {
        Manifests::Many(Vec::new())
    }
}

impl Manifests {
    /// The texts.
    pub fn texts(&self) -> Vec<&str> {
        match self {
            Manifests::One(s) => vec![s.as_str()],
            Manifests::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// Which clusters a release goes to: the explicit ones plus those the selector matches.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Targets {
    /// Cluster names.
    #[serde(default)]
    pub clusters: Vec<String>,
    /// A selector on the clusters' registry labels (see [`Selector`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

/// How the targets are split into batches.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batches {
    /// At most this many clusters per batch (in name order); default: one batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<usize>,
    /// Explicit ordered groups: every target must be in exactly one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<Vec<String>>,
}

/// An object to delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeleteRef {
    /// `group/version`.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Namespace (namespaced kinds; default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

impl DeleteRef {
    /// As a minimal object, the shape commands carry.
    pub fn to_object(&self) -> Value {
        let mut meta = serde_json::Map::new();
        meta.insert("name".into(), Value::String(self.name.clone()));
        if let Some(ns) = &self.namespace {
            meta.insert("namespace".into(), Value::String(ns.clone()));
        }
        serde_json::json!({"apiVersion": self.api_version, "kind": self.kind, "metadata": meta})
    }
}

/// Why a spec's `manifest_files` could not be inlined.
#[derive(Debug, thiserror::Error)]
pub enum InlineError {
    /// The spec is not YAML.
    #[error("not YAML: {0}")]
    NotYaml(serde_yaml::Error),
    /// `manifest_files` is not a list of paths.
    #[error("manifest_files must be a list of paths: {0}")]
    Files(serde_yaml::Error),
    /// `manifests` is neither a text nor a list of texts.
    #[error("manifests must be a text or a list of texts: {0}")]
    Manifests(serde_yaml::Error),
    /// A manifest file could not be read (the reader's error, as it says it).
    #[error("manifest file {file}: {error}")]
    Read {
        /// The path as the spec names it.
        file: String,
        /// Why.
        error: String,
    },
    /// The spec could not be written back.
    #[error("{0}")]
    Write(serde_yaml::Error),
}

/// Reads a spec's `manifest_files` (paths relative to the spec's directory, through `read`) into its
/// `manifests`; a spec without them is returned as it is.
pub fn inline_manifest_files<E: std::fmt::Display>(
    text: &str,
    read: impl Fn(&str) -> Result<String, E>,
) -> Result<String, InlineError> {
    let mut doc: serde_yaml::Value = serde_yaml::from_str(text).map_err(InlineError::NotYaml)?;
    let Some(files) = doc
        .as_mapping_mut()
        .and_then(|m| m.remove("manifest_files"))
    else {
        return Ok(text.to_string());
    };
    let files: Vec<String> = serde_yaml::from_value(files).map_err(InlineError::Files)?;
    let mut texts: Vec<String> = match doc.get("manifests") {
        None => Vec::new(),
        Some(serde_yaml::Value::String(s)) => vec![s.clone()],
        Some(v) => serde_yaml::from_value(v.clone()).map_err(InlineError::Manifests)?,
    };
    for f in files {
        let text = read(&f).map_err(|e| InlineError::Read {
            error: e.to_string(),
            file: f,
        })?;
        texts.push(text);
    }
    if let Some(m) = doc.as_mapping_mut() {
        m.insert(
            "manifests".into(),
            serde_yaml::to_value(texts).map_err(InlineError::Write)?,
        );
    }
    serde_yaml::to_string(&doc).map_err(InlineError::Write)
}

/// Writes what `kubectl kustomize` built (per path as rendered, see [`Spec::kustomized`]) into a spec's
/// text, replacing what it held.
pub fn inline_kustomized(
    text: &str,
    built: &BTreeMap<String, String>,
) -> Result<String, InlineError> {
    let mut doc: serde_yaml::Value = serde_yaml::from_str(text).map_err(InlineError::NotYaml)?;
    if let Some(m) = doc.as_mapping_mut() {
        m.insert(
            "kustomized".into(),
            serde_yaml::to_value(built).map_err(InlineError::Write)?,
        );
    }
    serde_yaml::to_string(&doc).map_err(InlineError::Write)
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 63
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && n.as_bytes()[0].is_ascii_alphanumeric()
        && n.as_bytes()[n.len() - 1].is_ascii_alphanumeric()
}

impl Spec {
    /// Parses and checks a spec.
    pub fn parse(yaml: &str) -> Result<Spec, Error> {
        let raw: serde_yaml::Value =
            serde_yaml::from_str(yaml).map_err(|e| Error::Parse(e.to_string()))?;
        if raw.get("manifest_files").is_some() {
            return Err(Error::Invalid(
                "manifest_files must be read into manifests by the CLI (multipilot release … -f spec.yaml)"
                    .into(),
            ));
        }
        // parse the text again (not the value) so errors carry their line and column
        drop(raw);
        let spec: Spec = serde_yaml::from_str(yaml).map_err(|e| Error::Parse(e.to_string()))?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks the rules serde can't.
    pub fn validate(&self) -> Result<(), Error> {
        if !valid_name(&self.name) {
            return Err(Error::Invalid(format!(
                "name {:?}: lower-case letters, digits, '-' and '.', starting and ending alphanumeric, at most 63",
                self.name
            )));
        }
        if self.manifests.texts().iter().all(|t| t.trim().is_empty())
            && self.kustomize.is_none()
            && self.delete.is_empty()
        {
            return Err(Error::Invalid(
                "manifests is empty, there is no kustomize and nothing is deleted".into(),
            ));
        }
        match (&self.kustomize, &self.kustomized) {
            (Some(path), built) => {
                crate::render::check_kustomize_path(path)
                    .map_err(|e| Error::Invalid(e.to_string()))?;
                if built.is_none() {
                    return Err(Error::Invalid(format!(
                        "kustomize {path:?} is built by whoever reads the spec file: the CLI \
                         (multipilot release … -f spec.yaml runs kubectl kustomize) or the role from a \
                         fleet repository"
                    )));
                }
            }
            (None, Some(_)) => {
                return Err(Error::Invalid(
                    "kustomized is what kubectl kustomize built for the kustomize path: it needs one"
                        .into(),
                ));
            }
            (None, None) => {}
        }
        if self.targets.clusters.is_empty() && self.targets.selector.is_none() {
            return Err(Error::Invalid(
                "targets needs clusters, a selector, or both".into(),
            ));
        }
        if let Some(sel) = &self.targets.selector {
            parse_selector(sel)?;
        }
        if let Some(sel) = &self.sync.approval_selector {
            parse_selector(sel)?;
        }
        if let Some(d) = self
            .depends_on
            .iter()
            .find(|d| !valid_name(d) || **d == self.name)
        {
            return Err(Error::Invalid(if *d == self.name {
                format!("depends_on: a release can't depend on itself ({d})")
            } else {
                format!("depends_on: {d:?} is not a release name")
            }));
        }
        if let Some(a) = &self.analysis {
            a.compile(self.soak.unwrap_or_default())?;
        }
        if self.batches.size == Some(0) {
            return Err(Error::Invalid("batches.size must be at least 1".into()));
        }
        if self.batches.size.is_some() && !self.batches.groups.is_empty() {
            return Err(Error::Invalid(
                "batches: give size or groups, not both".into(),
            ));
        }
        if let Some(fm) = &self.field_manager
            && (fm.is_empty() || fm.len() > 128)
        {
            return Err(Error::Invalid(
                "field_manager must be 1..=128 characters".into(),
            ));
        }
        for d in &self.delete {
            if d.api_version.is_empty() || d.kind.is_empty() || d.name.is_empty() {
                return Err(Error::Invalid(
                    "delete: every entry needs apiVersion, kind and name".into(),
                ));
            }
        }
        Ok(())
    }

    /// Splits the chosen clusters into batches (each cluster in exactly one).
    pub fn batches(&self, clusters: &[String]) -> Result<Vec<Vec<String>>, Error> {
        if !self.batches.groups.is_empty() {
            let mut seen = std::collections::BTreeSet::new();
            let mut out = Vec::new();
            for g in &self.batches.groups {
                let mut batch = Vec::new();
                for c in g {
                    if !clusters.contains(c) {
                        return Err(Error::Invalid(format!(
                            "batches.groups names {c:?}, which is not a target"
                        )));
                    }
                    if !seen.insert(c.clone()) {
                        return Err(Error::Invalid(format!("batches.groups names {c:?} twice")));
                    }
                    batch.push(c.clone());
                }
                if !batch.is_empty() {
                    out.push(batch);
                }
            }
            let missing: Vec<&String> = clusters.iter().filter(|c| !seen.contains(*c)).collect();
            if !missing.is_empty() {
                return Err(Error::Invalid(format!(
                    "targets {missing:?} are in no batches.groups entry"
                )));
            }
            return Ok(out);
        }
        let size = self.batches.size.unwrap_or(clusters.len().max(1));
        Ok(clusters.chunks(size).map(<[String]>::to_vec).collect())
    }
}

pub use multipilot_schemas::selector::Selector;

/// A selector of clusters (their registry labels, `cluster` and `version`: see
/// [`multipilot_schemas::selector`]); an empty one is refused, since it would select the whole fleet
/// without saying so.
pub fn parse_selector(text: &str) -> Result<Selector, Error> {
    let bad = |reason: String| Error::Selector {
        selector: text.to_string(),
        reason,
    };
    let sel = Selector::parse(text).map_err(|e| bad(e.reason))?;
    if sel.is_empty() {
        return Err(bad(
            "empty selector (name the clusters, or a label they have)".into(),
        ));
    }
    Ok(sel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_match_labels_and_versions() {
        let l = labels(&[
            ("env", "prod"),
            ("region", "eu-west-1"),
            ("version", "1.31"),
        ]);
        for (sel, want) in [
            ("env=prod", true),
            ("env==prod,region in (eu-west-1, us-east-1)", true),
            ("env!=prod", false),
            ("region notin (eu-west-1)", false),
            ("version>=1.25", true),
            ("version<1.31", false),
            ("version<=1.31,version>1.24", true),
            ("gpu", false),
            ("!gpu", true),
            ("env", true),
        ] {
            assert_eq!(
                parse_selector(sel).expect(sel).matches_map(&l),
                want,
                "{sel}"
            );
        }
        for bad in [
            "",
            "env=",
            "a in b",
            "version>=latest",
            "x=(y)",
            ",",
            "k in (a,)",
        ] {
            let r = parse_selector(bad);
            if bad == "env=" {
                // `env=` means "label env equals the empty string", as in Kubernetes
                assert!(r.is_ok());
                continue;
            }
            assert!(r.is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn specs_are_checked_with_clear_errors() {
        let ok = "name: web-1\nmanifests: |\n  apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: x}\ntargets: {clusters: [a]}\n";
        assert!(Spec::parse(ok).is_ok());
        for (text, needle) in [
            ("name: [", "not valid"),
            (
                "name: Web\nmanifests: x\ntargets: {clusters: [a]}\n",
                "name \"Web\"",
            ),
            ("name: w\nmanifests: x\ntargets: {}\n", "targets needs"),
            (
                "name: w\nmanifests: x\ntargets: {clusters: [a]}\nsoak: forever\n",
                "line 4",
            ),
            (
                "name: w\nmanifests: x\ntargets: {clusters: [a]}\nextra: 1\n",
                "unknown field",
            ),
            (
                "name: w\nmanifests: x\ntargets: {selector: 'a in b'}\n",
                "bad selector",
            ),
            (
                "name: w\nmanifests: x\ntargets: {clusters: [a]}\nbatches: {size: 0}\n",
                "at least 1",
            ),
        ] {
            let e = Spec::parse(text).expect_err(text).to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn kustomize_is_a_source_of_its_own_built_by_the_reader() {
        let built = "kustomized: {overlays/prod: 'apiVersion: v1'}\n";
        // kustomize alone is enough, and manifests may come with it
        for text in [
            format!("name: w\ntargets: {{clusters: [a]}}\nkustomize: overlays/prod\n{built}"),
            format!(
                "name: w\ntargets: {{clusters: [a]}}\nkustomize: ./overlays/{{{{ cluster.labels.env }}}}/\n{built}manifests: x\n"
            ),
        ] {
            let spec = Spec::parse(&text).expect(&text);
            assert!(spec.kustomize.is_some());
        }
        for (text, needle) in [
            (
                "name: w\ntargets: {clusters: [a]}\n".to_string(),
                "manifests is empty, there is no kustomize and nothing is deleted",
            ),
            (
                "name: w\ntargets: {clusters: [a]}\nkustomize: overlays/prod\n".to_string(),
                "is built by whoever reads the spec file",
            ),
            (
                format!("name: w\ntargets: {{clusters: [a]}}\nmanifests: x\n{built}"),
                "kustomized is what kubectl kustomize built",
            ),
            (
                format!("name: w\ntargets: {{clusters: [a]}}\nkustomize: /srv/overlays\n{built}"),
                "relative to the spec file",
            ),
            (
                format!("name: w\ntargets: {{clusters: [a]}}\nkustomize: '  '\n{built}"),
                "the path is empty",
            ),
            (
                format!(
                    "name: w\ntargets: {{clusters: [a]}}\nkustomize: overlays/{{{{ cluster.labels.env \n{built}"
                ),
                "kustomize \"overlays/{{ cluster.labels.env\"",
            ),
            (
                format!("name: w\ntargets: {{clusters: [a]}}\nkustomise: overlays/prod\n{built}"),
                "unknown field `kustomise`",
            ),
        ] {
            let e = Spec::parse(&text).expect_err(&text).to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
        // the reader writes what it built into the text, replacing what was there
        let text = inline_kustomized(
            "name: w\ntargets: {clusters: [a]}\nkustomize: overlays/prod\nkustomized: {old: x}\n",
            &[("overlays/prod".to_string(), "apiVersion: v1\n".to_string())].into(),
        )
        .expect("inline");
        let spec = Spec::parse(&text).expect("spec");
        assert_eq!(
            spec.kustomized,
            Some([("overlays/prod".to_string(), "apiVersion: v1\n".to_string())].into())
        );
    }

    #[test]
    fn batches_by_size_or_groups() {
        let mut s = Spec::parse(
            "name: w\nmanifests: x\ntargets: {clusters: [a, b, c]}\nbatches: {size: 2}\n",
        )
        .expect("spec");
        let cl: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        assert_eq!(s.batches(&cl).expect("b").len(), 2);
        s.batches = Batches {
            size: None,
            groups: vec![vec!["b".into()], vec!["a".into(), "c".into()]],
        };
        assert_eq!(s.batches(&cl).expect("b")[0], vec!["b".to_string()]);
        s.batches.groups = vec![vec!["b".into()]];
        assert!(s.batches(&cl).is_err());
    }
}
