//! `multipilot diff` (one object across clusters) and `multipilot compare` (what differs between two
//! clusters): drift, as the console's spec hashes see it.

use anyhow::{Result, bail};
use serde_json::Value;

use super::ConsoleArgs;
use super::output::{NO_NAME, s, structured, table};
use super::session::{Session, Settings, get};

/// Shows `object` (`<namespace>/<kind>/<name>`) in `clusters` (every cluster that has it when empty):
/// spec hashes, then the fields, labels and annotations that differ.
#[allow(clippy::print_stdout)]
pub(super) async fn diff(
    settings: Settings<'_>,
    args: &ConsoleArgs,
    object: &str,
    clusters: &[String],
) -> Result<()> {
    let parts: Vec<&str> = object.splitn(3, '/').collect();
    let [ns, kind, name] = parts[..] else {
        bail!("give the object as <namespace>/<kind>/<name> (`_` for cluster-scoped)");
    };
    let kind = super::kind(kind)?;
    let session = &Session::new(args, settings, NO_NAME)?;
    let mut q = vec![("kind", kind.kind.to_string()), ("name", name.to_string())];
    if ns != "_" && !ns.is_empty() {
        q.push(("namespace", ns.to_string()));
    }
    if !clusters.is_empty() {
        q.push(("clusters", clusters.join(",")));
    }
    let v = get(session, "/api/v1/diff", &q).await?;
    if structured(&v, &session.output)? {
        return Ok(());
    }
    let cl = v["clusters"].as_array().cloned().unwrap_or_default();
    let names: Vec<String> = cl.iter().map(|c| s(&c["cluster"])).collect();
    table(
        &["CLUSTER", "SPEC HASH", "METADATA HASH", "VERSION"],
        cl.iter()
            .map(|c| {
                if c["present"].as_bool() == Some(true) {
                    vec![
                        s(&c["cluster"]),
                        s(&c["spec_hash"]),
                        s(&c["metadata_hash"]),
                        s(&c["api_version"]),
                    ]
                } else {
                    vec![s(&c["cluster"]), "(absent)".into(), "-".into(), "-".into()]
                }
            })
            .collect(),
    );
    println!();
    if v["identical"].as_bool() == Some(true) {
        println!("spec: the same in every cluster");
    }
    for (title, key) in [
        ("spec", "fields"),
        ("labels", "labels"),
        ("annotations", "annotations"),
    ] {
        let rows = v[key].as_array().cloned().unwrap_or_default();
        if rows.is_empty() {
            if key != "fields" {
                println!("{title}: the same everywhere");
            }
            continue;
        }
        println!("{title} differs:");
        let mut header = vec!["PATH".to_string()];
        header.extend(names.iter().map(|n| n.to_uppercase()));
        let header: Vec<&str> = header.iter().map(String::as_str).collect();
        table(
            &header,
            rows.iter()
                .map(|f| {
                    let mut r = vec![s(&f["path"])];
                    r.extend(
                        f["values"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default()
                            .iter()
                            .map(|x| if x.is_null() { "(absent)".into() } else { s(x) }),
                    );
                    r
                })
                .collect(),
        );
        println!();
    }
    Ok(())
}

/// Counts and lists the objects that differ between clusters `a` and `b` or are in only one of them.
#[allow(clippy::print_stdout)]
pub(super) async fn compare(
    settings: Settings<'_>,
    args: &ConsoleArgs,
    a: String,
    b: String,
    kind: Option<String>,
    namespace: Option<String>,
) -> Result<()> {
    let kind = kind.as_deref().map(super::kind).transpose()?;
    let session = &Session::new(args, settings, NO_NAME)?;
    let mut q = vec![("a", a.clone()), ("b", b.clone())];
    if let Some(k) = kind {
        q.push(("kind", k.kind.to_string()));
    }
    if let Some(n) = namespace {
        q.push(("namespace", n));
    }
    let v = get(session, "/api/v1/compare", &q).await?;
    if structured(&v, &session.output)? {
        return Ok(());
    }
    let c = &v["counts"];
    println!(
        "{} identical, {} differ, {} only in {a}, {} only in {b}",
        c["same"], c["differ"], c["only_in_a"], c["only_in_b"]
    );
    let label = |o: &Value| {
        format!(
            "{}\t{}\t{}",
            s(&o["kind"]),
            o["namespace"].as_str().unwrap_or("-"),
            s(&o["name"])
        )
    };
    let mut rows = Vec::new();
    for (what, key) in [
        ("differs", "differ"),
        (&*format!("only in {a}"), "only_in_a"),
        (&*format!("only in {b}"), "only_in_b"),
    ] {
        for o in v[key].as_array().cloned().unwrap_or_default() {
            let l = label(&o);
            let mut cols: Vec<String> = l.split('\t').map(str::to_string).collect();
            cols.push(what.to_string());
            rows.push(cols);
        }
    }
    if !rows.is_empty() {
        println!();
        table(&["KIND", "NAMESPACE", "NAME", "WHAT"], rows);
    }
    Ok(())
}
