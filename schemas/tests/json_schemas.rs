//! The checked-in JSON Schemas must be exactly what the Rust types generate, and every sample must
//! validate against its schema's shape as the types decode it.

use std::path::Path;

use multipilot_schemas::catalog;

#[test]
fn checked_in_json_schemas_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("json");
    let update = std::env::var_os("UPDATE_SCHEMAS").is_some();
    let mut stale = Vec::new();
    let entries = catalog::entries();
    for entry in &entries {
        let path = dir.join(entry.file_name());
        let want = serde_json::to_string_pretty(&entry.schema).unwrap() + "\n";
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &want).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(have) if have == want => {}
            Ok(_) => stale.push(format!("{} differs", entry.file_name())),
            Err(_) => stale.push(format!("{} is missing", entry.file_name())),
        }
    }
    // No stray schema files for payloads that no longer exist.
    for file in std::fs::read_dir(&dir).unwrap() {
        let name = file.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".schema.json") && !entries.iter().any(|e| e.file_name() == name) {
            stale.push(format!("{name} has no payload type"));
        }
    }
    assert!(
        stale.is_empty(),
        "JSON Schemas out of date ({}); regenerate with `cargo run -p multipilot-schemas --example gen-schemas`",
        stale.join(", ")
    );
}

#[test]
fn every_payload_type_is_in_the_catalog_once() {
    let names: Vec<_> = catalog::entries().iter().map(|e| e.name).collect();
    let mut dedup = names.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!(names.len(), dedup.len());
    for want in [
        "ResourceState",
        "ResourceDeleted",
        "ResyncMarker",
        "KubeEvent",
        "ProbeResult",
        "MetricBatch",
        "Heartbeat",
        "ClusterFacts",
        "Incident",
        "FleetIncident",
        "Notification",
        "ReleaseCommand",
        "ReleaseResult",
        "ReleaseEvent",
        "AuditRecord",
        "DeadLetter",
    ] {
        assert!(names.contains(&want), "{want} missing from the catalog");
    }
}
