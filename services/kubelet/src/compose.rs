//! `compose.yaml` as the [`crate`] node runs it: each compose service becomes a pod (a Deployment, or
//! a Job for `restart: on-failure`) with a headless Service of its name, so services find each other by
//! name as on a compose network.
//!
//! Translated: YAML merge keys (`<<:`), `${VAR}`, `${VAR:?message}` and `${VAR:-default}` from the given
//! environment (as from `.env`), `command` after the image's entrypoint, `environment`, bind mounts
//! (`./path:/target[:ro]`, relative to the project directory) and named volumes, and the image's user.
//! Not translated: `build`, published `ports` (the test reaches pods at their addresses), `depends_on` (the
//! restart policies make the order converge, as a compose `restart:` does), healthchecks, networks.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::Manifests;

/// What an image brings that a compose file doesn't say: its entrypoint and its user.
#[derive(Debug, Clone, Default)]
pub struct Image {
    /// Prepended to `command`.
    pub entrypoint: Vec<String>,
    /// `USER` of the image.
    pub user: Option<u64>,
}

/// `${VAR}`, `${VAR:?message}`, `${VAR:-default}` and `$$`.
fn interpolate(s: &str, env: &BTreeMap<String, String>) -> Result<String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(inner) = after.strip_prefix('{') {
            let end = inner.find('}').context("an unclosed ${")?;
            let expr = &inner[..end];
            let value = if let Some((name, msg)) = expr.split_once(":?") {
                match env.get(name).filter(|v| !v.is_empty()) {
                    Some(v) => v.clone(),
                    None => bail!("required variable {name} is missing a value: {msg}"),
                }
            } else if let Some((name, default)) = expr.split_once(":-") {
                env.get(name)
                    .filter(|v| !v.is_empty())
                    .cloned()
                    .unwrap_or_else(|| default.to_string())
            } else {
                env.get(expr).cloned().unwrap_or_default()
            };
            out.push_str(&value);
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn strings(v: &Value, env: &BTreeMap<String, String>) -> Result<Vec<String>> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(s.split_whitespace().map(String::from).collect()),
        Value::Array(a) => a
            .iter()
            .map(|x| interpolate(x.as_str().unwrap_or_default(), env))
            .collect(),
        _ => bail!("expected a string or a list"),
    }
}

/// The objects a node runs for `compose_yaml` in `project_dir`, in namespace `compose`.
pub fn manifests(
    compose_yaml: &str,
    project_dir: &Path,
    env: &BTreeMap<String, String>,
    images: &BTreeMap<String, Image>,
) -> Result<Manifests> {
    let mut doc: serde_yaml::Value = serde_yaml::from_str(compose_yaml).context("compose.yaml")?;
    doc.apply_merge().context("compose.yaml merge keys")?;
    let doc: Value = serde_json::to_value(doc)?;
    let services = doc["services"]
        .as_object()
        .context("compose.yaml has no services")?;
    let ns = "compose";
    let mut objects = Vec::new();
    for (name, svc) in services {
        let image_name = svc["image"].as_str().unwrap_or_default();
        let image = images
            .iter()
            .find(|(prefix, _)| image_name.starts_with(prefix.as_str()))
            .map(|(_, i)| i.clone())
            .with_context(|| format!("service {name}: unknown image {image_name}"))?;
        let mut command = image.entrypoint.clone();
        command.extend(strings(&svc["command"], env)?);
        let mut container_env = Vec::new();
        match &svc["environment"] {
            Value::Object(m) => {
                for (k, v) in m {
                    let v = match v {
                        Value::String(s) => interpolate(s, env)?,
                        Value::Null => String::new(),
                        other => other.to_string(),
                    };
                    container_env.push(json!({"name": k, "value": v}));
                }
            }
            Value::Array(a) => {
                for kv in a {
                    let kv = interpolate(kv.as_str().unwrap_or_default(), env)?;
                    let (k, v) = kv.split_once('=').unwrap_or((&kv, ""));
                    container_env.push(json!({"name": k, "value": v}));
                }
            }
            _ => {}
        }
        let mut volumes = Vec::new();
        let mut mounts = Vec::new();
        for (i, v) in svc["volumes"].as_array().into_iter().flatten().enumerate() {
            let spec = interpolate(
                v.as_str().context("long-form volumes are not translated")?,
                env,
            )?;
            let parts: Vec<&str> = spec.split(':').collect();
            let (src, target, ro) = match parts.as_slice() {
                [s, t] => (*s, *t, false),
                [s, t, mode] => (*s, *t, mode.split(',').any(|m| m == "ro")),
                _ => bail!("service {name}: volume {spec:?}"),
            };
            let vname = format!("v{i}");
            if src.starts_with('.') || src.starts_with('/') {
                let path = project_dir.join(src);
                if !path.exists() {
                    bail!(
                        "service {name}: bind mount source {} does not exist",
                        path.display()
                    );
                }
                volumes.push(json!({"name": vname, "hostPath": {"path": path}}));
            } else {
                // a named volume: one directory per volume, shared by every service that names it
                volumes.push(json!({"name": vname, "persistentVolumeClaim": {"claimName": src}}));
                if !objects.iter().any(|o: &Value| {
                    o["kind"] == "PersistentVolumeClaim" && o["metadata"]["name"] == src
                }) {
                    objects.push(json!({
                        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": {"name": src, "namespace": ns},
                    }));
                }
            }
            mounts.push(json!({"name": vname, "mountPath": target, "readOnly": ro}));
        }
        let labels = json!({"compose.service": name});
        let restart = svc["restart"].as_str().unwrap_or("no");
        let mut security = json!({});
        if let Some(u) = image.user {
            security = json!({"runAsUser": u, "runAsGroup": u, "fsGroup": u});
        }
        let pod = json!({
            "metadata": {"labels": labels},
            "spec": {
                "automountServiceAccountToken": false,
                "restartPolicy": if restart == "on-failure" { "OnFailure" } else { "Always" },
                "securityContext": security,
                "containers": [{
                    "name": name,
                    "command": command,
                    "env": container_env,
                    "volumeMounts": mounts,
                }],
                "volumes": volumes,
            },
        });
        let kind = if restart == "on-failure" || restart == "no" {
            "Job"
        } else {
            "Deployment"
        };
        objects.push(json!({
            "apiVersion": if kind == "Job" { "batch/v1" } else { "apps/v1" },
            "kind": kind,
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"matchLabels": labels}, "template": pod},
        }));
        objects.push(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": "None", "selector": labels},
        }));
    }
    Ok(Manifests { objects })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_interpolate_as_compose_does() {
        let env = BTreeMap::from([("A".to_string(), "x".to_string())]);
        assert_eq!(interpolate("${A}-${B:-d}-$$", &env).unwrap(), "x-d-$");
        let err = interpolate("${B:?set in .env}", &env).unwrap_err();
        assert!(err.to_string().contains("set in .env"), "{err}");
    }
}
