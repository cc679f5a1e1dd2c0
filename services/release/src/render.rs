//! Rendering a spec's templates for one cluster (minijinja, undefined variables are errors) and splitting
//! the result into Kubernetes objects.
//!
//! Template context: `cluster` (`name`, `labels`, `version` as `1.31`, `git_version`, `facts` = the whole
//! `ClusterFacts`), `vars` (the spec's variables) and `release` (`name`).

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

/// Renders every template for one cluster and returns the objects, in order.
pub fn render(spec: &Spec, cluster: &str, facts: &ClusterFacts) -> Result<Vec<Value>, Error> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_keep_trailing_newline(true);
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
    use serde::Deserialize;
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let document = i + 1;
        let bad = |message: String| Error::Document {
            template,
            document,
            message,
        };
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
