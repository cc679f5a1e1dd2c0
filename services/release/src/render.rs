//! Rendering a spec's templates for one cluster (minijinja, undefined variables are errors) and splitting
//! the result into Kubernetes objects.
//!
//! Template context: `cluster` (`name`, `labels`, `version` as `1.31`, `git_version`, `facts` = the whole
//! `ClusterFacts`), `vars` (the spec's variables) and `release` (`name`).
//!
//! A spec's `kustomize` path is a template over the same context; what `kubectl kustomize` built for the
//! path a cluster renders (carried in the spec's `kustomized`) follows the manifests' objects, as it is:
//! a kustomization's output may hold `{{` legitimately (Go templates in a ConfigMap, Helm-style values), and
//! the overlay a cluster picks is where its labels go.

use minijinja::{Environment, UndefinedBehavior};
use multipilot_schemas::payload::ClusterFacts;
use serde_json::Value;

use crate::spec::Spec;

/// Why rendering failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The template doesn't parse or render.
    #[error("template {template}: {message}")]
    Template {
        /// Which template (from 1).
        template: usize,
        /// minijinja's message, with the line.
        message: String,
    },
    /// The rendered text isn't YAML, or a document isn't a Kubernetes object.
    #[error("template {template}, document {document}: {message}")]
    Document {
        /// Which template (from 1).
        template: usize,
        /// Which document of its output (from 1).
        document: usize,
        /// What is wrong.
        message: String,
    },
    /// The kustomize path doesn't render or isn't a relative path, its overlay was not built, or what
    /// was built isn't Kubernetes objects.
    #[error("kustomize {path}: {message}")]
    Kustomize {
        /// The path (as written, or as rendered for the cluster).
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// The template context for one cluster.
pub fn context(spec: &Spec, cluster: &str, facts: &ClusterFacts) -> Value {
    serde_json::json!({
        "cluster": {
            "name": cluster,
            "labels": facts.labels,
            "version": format!("{}.{}", facts.version.major, facts.version.minor),
            "git_version": facts.version.git_version,
            "facts": facts,
        },
        "vars": spec.vars,
        "release": {"name": spec.name},
    })
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_keep_trailing_newline(true);
    env
}

/// Whether a kustomize path is a template (each cluster picks its overlay).
pub fn templated(path: &str) -> bool {
    path.contains("{{") || path.contains("{%")
}

/// A kustomize path as the spec keys what was built for it: relative, `.` and inner `..` resolved, no
/// trailing `/` (`.` for the spec's own directory).
pub fn kustomize_key(path: &str) -> Result<String, Error> {
    let bad = |message: &str| Error::Kustomize {
        path: format!("{path:?}"),
        message: message.into(),
    };
    let p = path.trim();
    if p.is_empty() {
        return Err(bad("the path is empty"));
    }
    if p.starts_with('/') || p.contains("://") {
        return Err(bad(
            "the path must be a directory relative to the spec file",
        ));
    }
    let mut out: Vec<&str> = Vec::new();
    for part in p.split('/') {
        match part {
            "" | "." => {}
            ".." if out.last().is_some_and(|l| *l != "..") => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    Ok(if out.is_empty() {
        ".".into()
    } else {
        out.join("/")
    })
}

/// Checks a spec's kustomize path: a template must parse, a plain path be relative.
pub fn check_kustomize_path(path: &str) -> Result<(), Error> {
    if !templated(path) {
        return kustomize_key(path).map(drop);
    }
    let env = environment();
    env.template_from_str(path)
        .map(drop)
        .map_err(|e| Error::Kustomize {
            path: format!("{path:?}"),
            message: describe(&e),
        })
}

/// The spec's kustomize path as rendered for one cluster (keyed as [`kustomize_key`]); none without one.
pub fn kustomize_path(
    spec: &Spec,
    cluster: &str,
    facts: &ClusterFacts,
) -> Result<Option<String>, Error> {
    let Some(path) = &spec.kustomize else {
        return Ok(None);
    };
    let rendered = environment()
        .render_str(path, context(spec, cluster, facts))
        .map_err(|e| Error::Kustomize {
            path: format!("{path:?}"),
            message: describe(&e),
        })?;
    kustomize_key(&rendered).map(Some)
}

/// Renders every template for one cluster and returns the objects, in order: the manifests', then what
/// `kubectl kustomize` built for the cluster's kustomize path.
pub fn render(spec: &Spec, cluster: &str, facts: &ClusterFacts) -> Result<Vec<Value>, Error> {
    let env = environment();
    let ctx = context(spec, cluster, facts);
    let mut out = Vec::new();
    for (i, text) in spec.manifests.texts().into_iter().enumerate() {
        let template = i + 1;
        let rendered = env.render_str(text, &ctx).map_err(|e| Error::Template {
            template,
            message: describe(&e),
        })?;
        out.extend(split(&rendered, template)?);
    }
    if let Some(path) = kustomize_path(spec, cluster, facts)? {
        let built = spec
            .kustomized
            .as_ref()
            .and_then(|b| b.get(&path))
            .ok_or_else(|| Error::Kustomize {
                path: path.clone(),
                message: "not built for this cluster (the fleet repository's reader builds the \
                          overlays of the clusters targeted when it reads a commit: one that joined \
                          since is built on the next read)"
                    .into(),
            })?;
        out.extend(split_with(built, |document, message| Error::Kustomize {
            path: path.clone(),
            message: format!("document {document}: {message}"),
        })?);
    }
    Ok(out)
}

fn describe(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// Splits multi-document YAML into objects, checking each has `apiVersion`, `kind` and `metadata.name`.
/// Empty documents are skipped; `kind: List` is unrolled.
pub fn split(text: &str, template: usize) -> Result<Vec<Value>, Error> {
    split_with(text, |document, message| Error::Document {
        template,
        document,
        message,
    })
}

/// [`split`], with the error a bad document (from 1) makes.
pub fn split_with(text: &str, error: impl Fn(usize, String) -> Error) -> Result<Vec<Value>, Error> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let document = i + 1;
        let bad = |message: String| error(document, message);
        let v = serde_yaml::Value::deserialize(doc).map_err(|e| bad(e.to_string()))?;
        if v.is_null() {
            continue;
        }
        let v: Value = serde_json::to_value(v).map_err(|e| bad(e.to_string()))?;
        let items = if v.get("kind").and_then(Value::as_str) == Some("List") {
            v.get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        } else {
            vec![v]
        };
        for item in items {
            if !item.is_object() {
                return Err(bad("not a mapping".into()));
            }
            for (ptr, what) in [
                ("/apiVersion", "apiVersion"),
                ("/kind", "kind"),
                ("/metadata/name", "metadata.name"),
            ] {
                if item
                    .pointer(ptr)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    return Err(bad(format!("{what} missing")));
                }
            }
            out.push(item);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> ClusterFacts {
        ClusterFacts {
            node_software: Vec::new(),
            version: multipilot_schemas::payload::KubeVersion {
                major: 1,
                minor: 31,
                git_version: "v1.31.4".into(),
                platform: String::new(),
            },
            api_versions: vec!["v1".into()],
            preferred_versions: Default::default(),
            nodes: Default::default(),
            cni: None,
            coredns: None,
            ingress_controller: None,
            gpu_device_plugin: None,
            ingress_classes: vec![],
            storage_classes: vec![],
            default_storage_class: None,
            apiserver_cert_expiry: None,
            gpus: vec![],
            labels: [("env".to_string(), "prod".to_string())].into(),
            scrape_interval_s: None,
        }
    }

    #[test]
    fn renders_per_cluster_with_vars() {
        let spec = Spec::parse(
            "name: w\nvars: {n: 3}\ntargets: {clusters: [c]}\nmanifests: |\n  apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: cfg-{{ cluster.name }}}\n  data: {env: '{{ cluster.labels.env }}', v: '{{ cluster.version }}', n: '{{ vars.n }}'}\n  ---\n  ---\n  apiVersion: v1\n  kind: List\n  items: [{apiVersion: v1, kind: ConfigMap, metadata: {name: b}}]\n",
        )
        .expect("spec");
        let objs = render(&spec, "c", &facts()).expect("render");
        assert_eq!(objs.len(), 2);
        assert_eq!(objs[0]["metadata"]["name"], "cfg-c");
        assert_eq!(objs[0]["data"]["env"], "prod");
        assert_eq!(objs[0]["data"]["v"], "1.31");
        assert_eq!(objs[0]["data"]["n"], "3");
    }

    #[test]
    fn each_cluster_gets_the_overlay_its_labels_pick_as_it_was_built() {
        let spec = Spec::parse(concat!(
            "name: w\ntargets: {clusters: [c]}\n",
            "manifests: |\n  apiVersion: v1\n  kind: Namespace\n  metadata: {name: '{{ cluster.labels.env }}'}\n",
            "kustomize: ./overlays/{{ cluster.labels.env }}/\n",
            "kustomized:\n",
            "  overlays/prod: |\n",
            "    apiVersion: v1\n    kind: ConfigMap\n    metadata: {name: prod-cfg}\n",
            "    data: {tmpl: '{{ .Values.x }}'}\n",
            "    ---\n",
            "    apiVersion: apps/v1\n    kind: Deployment\n    metadata: {name: prod-web}\n    spec: {replicas: 3}\n",
            "  overlays/dev: |\n",
            "    apiVersion: apps/v1\n    kind: Deployment\n    metadata: {name: dev-web}\n    spec: {replicas: 1}\n",
            "  overlays/broken: |\n",
            "    apiVersion: v1\n    kind: ConfigMap\n",
        ))
        .expect("spec");
        let mut f = facts();
        let objs = render(&spec, "c", &f).expect("prod");
        let names: Vec<&str> = objs
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names, ["prod", "prod-cfg", "prod-web"], "manifests first");
        assert_eq!(
            objs[1]["data"]["tmpl"], "{{ .Values.x }}",
            "what kustomize built is not a template"
        );
        assert_eq!(objs[2]["spec"]["replicas"], 3);
        f.labels.insert("env".into(), "dev".into());
        let objs = render(&spec, "c", &f).expect("dev");
        assert_eq!(objs[1]["metadata"]["name"], "dev-web");
        for (env, needle) in [
            ("qa", "kustomize overlays/qa: not built for this cluster"),
            (
                "broken",
                "kustomize overlays/broken: document 1: metadata.name missing",
            ),
        ] {
            f.labels.insert("env".into(), env.into());
            let e = render(&spec, "c", &f).expect_err(env).to_string();
            assert!(e.contains(needle), "{env}: {e}");
        }
        f.labels.clear();
        let mut spec = spec;
        spec.manifests = Default::default();
        let e = render(&spec, "c", &f).expect_err("no env").to_string();
        assert!(
            e.contains("kustomize \"./overlays/{{ cluster.labels.env }}/\"")
                && e.contains("undefined"),
            "{e}"
        );
    }

    #[test]
    fn kustomize_paths_are_keyed_relative_and_plain() {
        for (path, key) in [
            ("overlays/prod", "overlays/prod"),
            ("./overlays//prod/", "overlays/prod"),
            ("../apps/web/../api", "../apps/api"),
            ("../../x", "../../x"),
            (".", "."),
            (" a/b \n", "a/b"),
        ] {
            assert_eq!(kustomize_key(path).expect(path), key, "{path}");
        }
        for bad in ["", "/etc", "https://github.com/org/repo//base"] {
            assert!(kustomize_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn template_errors_are_clear() {
        for (manifests, needle) in [
            ("{{ vars.nope }}", "undefined"),
            ("{% if %}", "template 1"),
            ("a: [b", "document 1"),
            ("apiVersion: v1\n  kind: ConfigMap", "metadata.name missing"),
            ("- 1", "not a mapping"),
        ] {
            let text =
                format!("name: w\ntargets: {{clusters: [c]}}\nmanifests: |\n  {manifests}\n");
            let spec = Spec::parse(&text).expect(&text);
            let e = render(&spec, "c", &facts()).expect_err(&text).to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
