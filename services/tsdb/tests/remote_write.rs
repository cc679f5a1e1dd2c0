//! The remote-write output against a real HTTP receiver: snappy + protobuf bodies with the 1.0 headers,
//! retried after a 5xx.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use multipilot_schemas::payload::Sample;
use multipilot_tsdb::remote_write::{self, proto};
use multipilot_tsdb::{Metrics, store};
use prost::Message as _;
use tokio_util::sync::CancellationToken;

#[derive(Default, Clone)]
struct Received {
    requests: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
}

#[tokio::test]
async fn samples_are_forwarded_as_remote_write_requests_and_retried() -> Result<()> {
    let got = Received::default();
    let seen = got.clone();
    let app = Router::new().route(
        "/push",
        post(move |headers: HeaderMap, body: Bytes| {
            let seen = seen.clone();
            async move {
                let mut r = seen.requests.lock().unwrap_or_else(|e| e.into_inner());
                r.push((headers, body));
                // The first request fails: the sender must retry it.
                if r.len() == 1 {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::NO_CONTENT
                }
            }
        }),
    );
    let cancel = CancellationToken::new();
    let (addr, server) =
        multipilot_runtime::http::serve("127.0.0.1:0", app, cancel.clone()).await?;
    let sender = remote_write::spawn(
        remote_write::Config {
            url: format!("http://{addr}/push"),
            ..Default::default()
        },
        Metrics::default(),
        cancel.clone(),
    );
    let labels = BTreeMap::from([("job".to_string(), "node".to_string())]);
    let sample = |name: &str| Sample {
        name: name.into(),
        labels: labels.clone(),
        value: 0.0,
        timestamp_ms: 0,
    };
    let (up, load) = (sample("up"), sample("load"));
    sender.offer(vec![
        (store::sample_labels(&&up, "c1"), 1000, 1.0),
        (store::sample_labels(&&up, "c1"), 2000, f64::NAN),
        (store::sample_labels(&&load, "c2"), 1000, 0.5),
    ]);

    let end = Instant::now() + Duration::from_secs(30);
    while got.requests.lock().unwrap_or_else(|e| e.into_inner()).len() < 2 {
        anyhow::ensure!(Instant::now() < end, "no retry arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let requests = got
        .requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    assert_eq!(
        requests[0].1, requests[1].1,
        "the retry sends the same body"
    );
    let (headers, body) = &requests[1];
    assert_eq!(headers["content-encoding"], "snappy");
    assert_eq!(headers["content-type"], "application/x-protobuf");
    assert_eq!(headers["x-prometheus-remote-write-version"], "0.1.0");
    let raw = snap::raw::Decoder::new().decompress_vec(body)?;
    let req = proto::WriteRequest::decode(raw.as_slice())?;
    assert_eq!(req.timeseries.len(), 2, "{req:?}");
    let names: Vec<Vec<(&str, &str)>> = req
        .timeseries
        .iter()
        .map(|ts| {
            ts.labels
                .iter()
                .map(|l| (l.name.as_str(), l.value.as_str()))
                .collect()
        })
        .collect();
    assert_eq!(
        names,
        vec![
            vec![("__name__", "load"), ("cluster", "c2"), ("job", "node")],
            vec![("__name__", "up"), ("cluster", "c1"), ("job", "node")],
        ]
    );
    let up = &req.timeseries[1].samples;
    assert_eq!(up.len(), 2);
    assert_eq!((up[0].timestamp, up[0].value), (1000, 1.0));
    assert!(up[1].value.is_nan() && up[1].timestamp == 2000);

    cancel.cancel();
    server.await?;
    Ok(())
}
