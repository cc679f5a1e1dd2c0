//! Every payload decoder on the bus: the first byte picks the payload type (the catalog's order), the second
//! which headers are present, the rest is the body. Decoding returns a value or a classified error, never a
//! panic; what decodes re-encodes.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use multipilot_schemas::payload::*;
use multipilot_schemas::{Payload, decode};

fn one<T: Payload>(flags: u8, body: &[u8]) {
    let schema = T::schema_header();
    let schema_h = match flags & 0b11 {
        0 => Some(schema.as_str()),
        1 => None,
        2 => Some("Heartbeat/9"),
        _ => Some("garbage"),
    };
    let ct = if flags & 0b100 == 0 {
        Some("application/msgpack")
    } else {
        None
    };
    if let Ok(env) = decode::<T>(ct, schema_h, body, 1 << 20) {
        multipilot_schemas::encode(&env).expect("a decoded envelope re-encodes");
    }
}

fn names() -> &'static [&'static str] {
    static N: OnceLock<Vec<&'static str>> = OnceLock::new();
    N.get_or_init(|| {
        multipilot_schemas::catalog::entries()
            .iter()
            .map(|e| e.name)
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let [sel, flags, body @ ..] = data else {
        return;
    };
    let names = names();
    let name = names[*sel as usize % names.len()];
    match name {
        "ResourceState" => one::<ResourceState>(*flags, body),
        "ResourceDeleted" => one::<ResourceDeleted>(*flags, body),
        "ResyncMarker" => one::<ResyncMarker>(*flags, body),
        "KubeEvent" => one::<KubeEvent>(*flags, body),
        "ProbeResult" => one::<ProbeResult>(*flags, body),
        "Heartbeat" => one::<Heartbeat>(*flags, body),
        "ClusterFacts" => one::<ClusterFacts>(*flags, body),
        "MetricBatch" => one::<MetricBatch>(*flags, body),
        "Incident" => one::<Incident>(*flags, body),
        "EventDigest" => one::<EventDigest>(*flags, body),
        "ComplianceReport" => one::<ComplianceReport>(*flags, body),
        "Notification" => one::<Notification>(*flags, body),
        "ReleaseCommand" => one::<ReleaseCommand>(*flags, body),
        "ReleaseResult" => one::<ReleaseResult>(*flags, body),
        "ReleaseEvent" => one::<ReleaseEvent>(*flags, body),
        "AuditRecord" => one::<AuditRecord>(*flags, body),
        "DeadLetter" => one::<DeadLetter>(*flags, body),
        other => panic!("the fuzz target does not know payload type {other}: add it"),
    }
});
