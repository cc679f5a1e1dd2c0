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

#[tokio::test]
async fn a_refused_large_body_closes_its_connection_and_the_next_request_gets_a_fresh_one()
-> anyhow::Result<()> {
    use axum::routing::post;
    let health = Health::default();
    let router = http::router(health, Arc::new(RwLock::new(Registry::default())))
        .merge(axum::Router::new().route("/echo", post(|b: axum::body::Bytes| async move { b })));
    let cancel = CancellationToken::new();
    let (addr, task) = http::serve("127.0.0.1:0", router, cancel.clone()).await?;
    // one pooled client, as every integration uses: after each refusal the very next request must succeed
    let client = reqwest::Client::new();
    for _ in 0..20 {
        let r = client
            .post(format!("http://{addr}/echo"))
            .body(vec![b'x'; 4 << 20])
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 413);
        assert_eq!(
            r.headers().get("connection").and_then(|v| v.to_str().ok()),
            Some("close")
        );
        let ok = client.get(format!("http://{addr}/healthz")).send().await?;
        assert_eq!(ok.status().as_u16(), 200);
    }
    cancel.cancel();
    task.await?;
    Ok(())
}
