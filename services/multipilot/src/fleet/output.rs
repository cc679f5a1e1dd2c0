//! How the fleet commands print: aligned tables for people, JSON or YAML for scripts.

use anyhow::Result;
use serde_json::Value;

use crate::contexts;

/// A JSON value as a table cell (`-` for null or empty).
pub(super) fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Prints rows as aligned columns.
#[allow(clippy::print_stdout)]
pub fn table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let n = cells.len();
        cells
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                if i + 1 == n {
                    c
                } else {
                    format!("{c:<width$}", width = w[i])
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("{}", line(header.iter().map(|h| h.to_string()).collect()));
    for r in rows {
        println!("{}", line(r));
    }
}

/// Prints `v` as JSON or YAML if that is the output format; false for the others (the command prints them).
#[allow(clippy::print_stdout)]
pub(super) fn structured(v: &Value, output: &str) -> Result<bool> {
    match output {
        "json" => println!("{}", serde_json::to_string_pretty(v)?),
        "yaml" => print!("{}", serde_yaml::to_string(v)?),
        _ => return Ok(false),
    }
    Ok(true)
}

/// Every format; `diff`, `compare` and `gpu` print all but `name`.
pub(super) const ALL: &[&str] = &contexts::OUTPUTS;
pub(super) const NO_NAME: &[&str] = &["table", "wide", "json", "yaml"];
