//! Another team can consume every subject with a MessagePack library and the JSON Schemas alone: the Python
//! consumer in `schemas/examples/consumer.py` (nats-py + msgpack + jsonschema) reads one message of every
//! payload type from a real nats-server and validates it.

use std::process::Command;

use anyhow::{Context as _, Result};
use multipilot_bus::metrics::BusMetrics;
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use multipilot_bus::topology::Topology;
use multipilot_schemas::catalog;
use multipilot_testkit::NatsServer;

#[tokio::test]
async fn python_consumer_decodes_and_validates_every_payload_type() -> Result<()> {
    let server = NatsServer::start().await?;
    let js = async_nats::jetstream::new(server.client().await?);
    Topology::embedded().provision(&js).await?;
    let mut publisher = Publisher::new(js.clone(), 64, BusMetrics::default());
    for e in catalog::entries() {
        let msg = Outgoing::raw(
            e.subject.clone(),
            format!("py-{}", e.name),
            &e.header(),
            e.sample.clone().into(),
        );
        publisher.send(e.name, msg).await;
    }
    for c in publisher.flush().await {
        anyhow::ensure!(matches!(c, Completion::Stored { .. }), "{c:?}");
    }
    let python = std::env::var("MULTIPILOT_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/consumer.py");
    let out = tokio::task::spawn_blocking({
        let url = server.url();
        move || {
            Command::new(&python)
                .args([script, "--url", &url, "--expect", "all", "--timeout", "60"])
                .output()
                .with_context(|| {
                    format!(
                        "running {python} (./scripts/test installs nats-py, msgpack, jsonschema)"
                    )
                })
        }
    })
    .await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "python consumer failed:\n{stdout}\n{stderr}"
    );
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("{}"))?;
    for e in catalog::entries() {
        assert!(
            summary["validated"][e.name].as_u64().unwrap_or(0) >= 1,
            "{} not validated:\n{stdout}",
            e.name
        );
    }
    assert_eq!(summary["errors"], serde_json::json!([]));
    Ok(())
}
