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

#[tokio::test]
async fn a_stream_a_client_keeps_open_does_not_hold_a_shutdown_past_its_grace() -> anyhow::Result<()>
{
    use axum::routing::get;
    // a body that never ends, as an event stream or a watch is to a client that keeps reading it
    let forever = || async {
        let ticks = futures::stream::unfold((), |()| async {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            Some((
                Ok::<_, std::convert::Infallible>(bytes::Bytes::from_static(b"tick\n")),
                (),
            ))
        });
        axum::body::Body::from_stream(ticks)
    };
    let router = axum::Router::new().route("/stream", get(forever));
    let cancel = CancellationToken::new();
    let (addr, task) = http::serve("127.0.0.1:0", router, cancel.clone()).await?;
    let mut resp = reqwest::get(format!("http://{addr}/stream")).await?;
    assert!(resp.chunk().await?.is_some(), "the stream flows");
    let reader = tokio::spawn(async move { while let Ok(Some(_)) = resp.chunk().await {} });
    cancel.cancel();
    // the server stops once its grace is over (it waited for ever before); the bound only catches a hang
    let stopped = tokio::time::timeout(http::SHUTDOWN_GRACE * 4, task).await;
    assert!(
        stopped.is_ok(),
        "the server still waits for the open stream"
    );
    reader.abort();
    Ok(())
}
