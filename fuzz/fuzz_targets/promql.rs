//! The TSDB's PromQL front: any query text against a small store gives a result or an error, never a panic.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use multipilot_tsdb::promql::Engine;
use multipilot_tsdb::store::{Options, Store};

fn engine() -> &'static Engine {
    static E: OnceLock<(tempfile::TempDir, Engine)> = OnceLock::new();
    &E.get_or_init(|| {
        // The TSDB catches panics of the third-party PromQL parser and answers `bad_data`; libFuzzer's hook
        // would abort on them before they are caught. With the default hook back, a panic that escapes our
        // code still reaches the fuzz target's own catch and is reported as a crash.
        std::panic::set_hook(Box::new(|_| {}));
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path(), Options::default()).expect("store");
        let mut samples = Vec::new();
        for i in 0..60i64 {
            for (name, v) in [("up", 1.0), ("http_requests_total", (i * 7) as f64), ("temp", (i % 5) as f64 - 2.0)] {
                samples.push(multipilot_schemas::payload::Sample {
                    name: name.into(),
                    labels: [("job".to_string(), "api".to_string()), ("instance".to_string(), format!("i{}", i % 3))]
                        .into_iter()
                        .collect(),
                    value: v,
                    timestamp_ms: 1_700_000_000_000 + i * 15_000,
                });
            }
        }
        store.append("fuzz", &samples).expect("append");
        let engine = Engine::new(Arc::new(store), Duration::from_secs(300));
        (dir, engine)
    })
    .1
}

fuzz_target!(|data: &[u8]| {
    let Ok(q) = std::str::from_utf8(data) else {
        return;
    };
    if q.len() > 512 {
        return;
    }
    let e = engine();
    let _ = e.instant(q, 1_700_000_600_000);
    let _ = e.range(q, 1_700_000_000_000, 1_700_000_900_000, 60_000);
});
