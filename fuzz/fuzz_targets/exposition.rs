//! The agent's Prometheus text exposition parser: any bytes (also invalid UTF-8, made lossy as the agent
//! does) give samples and a count of rejected lines, never a panic.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let body = String::from_utf8_lossy(data);
    let extra = BTreeMap::from([("cluster".to_string(), "fuzz".to_string())]);
    let parsed = multipilot_agent::exposition::parse(&body, 1_700_000_000_000, &extra);
    let batch = multipilot_agent::exposition::into_batch(parsed, "fuzz", "fuzz:9100");
    for s in &batch.samples {
        assert!(s.labels.iter().any(|(k, v)| k == "cluster" && v == "fuzz"));
    }
});
