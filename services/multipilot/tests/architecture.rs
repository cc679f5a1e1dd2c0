//! The architecture, kept as it was built (issue 31): these read the source tree and fail, naming each file and
//! line, when
//! - a role crate depends on another role crate (roles meet on the bus, through the contract in `schemas`);
//! - a shipped crate spells a subject or a stream name (`"fleet.…"`, `"FLEET_…"`) instead of taking it from
//!   `schemas` (`subject::STATE.all()`, `subject::incident(..)`, `streams::name::INCIDENTS`);
//! - a library crate has a `Result<_, String>` (errors are types: `thiserror` in libraries, `anyhow` in
//!   binaries and tests).
//!
//! Test code is left out: `#[cfg(test)]` modules (by convention at the end of their file), `*_tests.rs`,
//! `tests/`, `examples/`. The load-test harness reads the bus as an outside observer would and may spell
//! subjects; the contract (`schemas`) and the bus toolkit (`bus`) are where the names live.

use std::path::{Path, PathBuf};

const ROLES: [&str; 6] = [
    "agent",
    "correlator",
    "release",
    "tsdb",
    "alerts",
    "console",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`, test files left out.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs")
                && !p.to_string_lossy().ends_with("_tests.rs")
            {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The lines of a source file before its test module, comments dropped, with their numbers.
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push((i + 1, line.to_string()));
    }
    out
}

fn relative(p: &Path) -> String {
    p.strip_prefix(root())
        .unwrap_or(p)
        .to_string_lossy()
        .into_owned()
}

/// The `[dependencies]` section's crate names of a Cargo.toml.
fn dependencies(toml: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in toml.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            inside = t == "[dependencies]";
            continue;
        }
        if inside && let Some((name, _)) = t.split_once('=') {
            out.push(name.trim().to_string());
        }
    }
    out
}

#[test]
fn no_role_crate_depends_on_another() {
    let mut found = Vec::new();
    for role in ROLES {
        let path = root().join("services").join(role).join("Cargo.toml");
        let toml = std::fs::read_to_string(&path).expect("a role's Cargo.toml");
        for dep in dependencies(&toml) {
            if ROLES
                .iter()
                .any(|other| *other != role && dep == format!("multipilot-{other}"))
            {
                found.push(format!("{}: depends on {dep}", relative(&path)));
            }
        }
    }
    assert!(
        found.is_empty(),
        "role crates meet on the bus:\n{}",
        found.join("\n")
    );
}

#[test]
fn dependencies_parse_as_cargo_writes_them() {
    let toml = "[package]\nname = \"x\"\n[dependencies]\nmultipilot-bus.workspace = true\nserde = { version = \"1\" }\n[dev-dependencies]\nmultipilot-agent = { path = \"../agent\" }\n";
    assert_eq!(dependencies(toml), ["multipilot-bus.workspace", "serde"]);
}

/// A string literal that names a subject or a stream.
fn spelled_name(line: &str) -> bool {
    line.contains("\"fleet.") || line.contains("\"FLEET_")
}

#[test]
fn shipped_crates_take_subjects_and_streams_from_the_contract() {
    let mut dirs: Vec<PathBuf> = ROLES
        .iter()
        .chain(&["runtime", "multipilot"])
        .map(|c| root().join("services").join(c).join("src"))
        .collect();
    dirs.push(root().join("loadtest/src"));
    let mut found = Vec::new();
    for dir in dirs {
        for file in sources(&dir) {
            for (n, line) in code_lines(&file) {
                if spelled_name(&line) {
                    found.push(format!("{}:{n}: {}", relative(&file), line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "subjects and stream names come from multipilot_schemas (subject::…, streams::name::…):\n{}",
        found.join("\n")
    );
}

/// Whether a line has a `Result<T, String>`: the second type argument of a `Result<…>` is `String` (so
/// `Result<HashMap<String, String>, Error>` is not one).
fn string_result(line: &str) -> bool {
    let mut rest = line;
    while let Some(at) = rest.find("Result<") {
        let inner = &rest[at + "Result<".len()..];
        let (mut depth, mut comma, mut end) = (0i32, None, None);
        for (i, c) in inner.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => comma = Some(i),
                _ => {}
            }
        }
        if let (Some(c), Some(e)) = (comma, end)
            && inner[c + 1..e].trim() == "String"
        {
            return true;
        }
        rest = inner;
    }
    false
}

#[test]
fn string_results_are_found_and_nested_strings_are_not() {
    assert!(string_result("fn f() -> Result<(), String> {"));
    assert!(string_result(
        "type R = HashMap<u32, Result<(ApiResource, bool), String>>;"
    ));
    assert!(!string_result(
        "fn f() -> Result<HashMap<String, String>, Error> {"
    ));
    assert!(!string_result(
        "fn f() -> Result<Vec<(String, String)>, Error> {"
    ));
    assert!(!string_result("fn f() -> io::Result<String> {"));
}

#[test]
fn library_crates_return_typed_errors() {
    let mut libs: Vec<PathBuf> = std::fs::read_dir(root().join("services"))
        .expect("services/")
        .flatten()
        .map(|e| e.path().join("src"))
        .chain([root().join("schemas/src"), root().join("loadtest/src")])
        .filter(|src| src.join("lib.rs").is_file())
        .collect();
    libs.sort();
    assert!(libs.len() >= 10, "{libs:?}");
    let mut found = Vec::new();
    for dir in libs {
        for file in sources(&dir) {
            for (n, line) in code_lines(&file) {
                if string_result(&line) {
                    found.push(format!("{}:{n}: {}", relative(&file), line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "library crates return typed errors (thiserror), not Result<_, String>:\n{}",
        found.join("\n")
    );
}
