//! The hub binary's configuration as an operator meets it: `--print-config`, layering, unknown keys.

use std::process::Command;

fn hub() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_multipilot"));
    // Start from a clean slate: no MULTIPILOT_* from the caller's environment.
    for (k, _) in std::env::vars() {
        if k.starts_with("MULTIPILOT_") {
            c.env_remove(k);
        }
    }
    c
}

#[test]
fn print_config_shows_layered_values_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hub.yaml");
    std::fs::write(
        &file,
        "http:\n  listen: 127.0.0.1:1111\nnats:\n  url: nats://from-file:4222\n",
    )
    .unwrap();
    let out = hub()
        .args(["--config", file.to_str().unwrap(), "--print-config", "all"])
        .env("MULTIPILOT_NATS__URL", "nats://from-env:4222")
        .env("MULTIPILOT_NATS__TOKEN", "s3cr3t-token")
        .env("MULTIPILOT_PROFILE", "debug") // a script setting, not config: ignored
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("listen: 127.0.0.1:1111"), "{stdout}");
    assert!(stdout.contains("url: nats://from-env:4222"), "{stdout}");
    assert!(
        !stdout.contains("s3cr3t-token"),
        "credential leaked: {stdout}"
    );
    // The printed config is itself a valid config file (credentials aside, which print as ***).
    let printed = dir.path().join("printed.yaml");
    std::fs::write(&printed, stdout.replace("token: '***'", "token: null")).unwrap();
    let again = hub()
        .args([
            "--config",
            printed.to_str().unwrap(),
            "--print-config",
            "all",
        ])
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

#[test]
fn unknown_keys_are_rejected_with_their_name() {
    let out = hub()
        .args(["--print-config", "all"])
        .env("MULTIPILOT_NATS__URLL", "x")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("urll"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hub.toml");
    std::fs::write(&file, "[storage]\ndata_dirr = '/x'\n").unwrap();
    let out = hub()
        .args(["--config", file.to_str().unwrap(), "--print-config", "all"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("data_dirr"));
}
