//! The HTTP surface every process serves: per-client rate limits answer 429 with Retry-After.

use std::sync::{Arc, RwLock};

use multipilot_runtime::http::{self, Health, Limits};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_flooding_client_gets_429_with_retry_after() -> anyhow::Result<()> {
    let health = Health::default();
    let router = http::router(health, Arc::new(RwLock::new(Registry::default())));
    let cancel = CancellationToken::new();
    let (addr, task) = http::serve_limited(
        "127.0.0.1:0",
        router,
        cancel.clone(),
        Limits {
            per_second: 1,
            burst: 3,
        },
    )
    .await?;
    let client = reqwest::Client::new();
    let mut ok = 0;
    let mut limited = Vec::new();
    for _ in 0..20 {
        let r = client.get(format!("http://{addr}/healthz")).send().await?;
        match r.status().as_u16() {
            200 => ok += 1,
            429 => limited.push(r),
            other => anyhow::bail!("unexpected status {other}"),
        }
    }
    // 20 requests need 17 s at 1/s after a burst of 3: most are refused, whatever the machine's speed
    assert!((3..20).contains(&ok), "{ok} answered");
    let r = limited.pop().expect("some requests were limited");
    assert!(r.headers().contains_key("retry-after"));
    assert!(r.text().await?.contains("too many requests"));
    cancel.cancel();
    task.await?;
    Ok(())
}
