//! The agent's normalisation of whatever an API server returns: any JSON gives a ResourceState with stable
//! hashes, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(obj) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    for kind in ["Deployment", "Pod", "Node", "Secret", "Service", "CronJob"] {
        let a = multipilot_agent::normalize::resource_state("v1", kind, &obj, kind != "Secret");
        let b = multipilot_agent::normalize::resource_state("v1", kind, &obj, kind != "Secret");
        assert_eq!(a.spec_hash, b.spec_hash, "hashing is deterministic");
        let _ = multipilot_agent::normalize::digest(&a);
        if kind == "Secret" {
            assert!(a.spec.is_none() || a.spec == Some(serde_json::json!({})));
        }
    }
});
