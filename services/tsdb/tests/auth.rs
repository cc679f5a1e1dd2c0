//! The Prometheus API behind the shared token model: with auth on, every role may query, nobody else;
//! a peer sends its configured token.

use std::sync::Arc;

use anyhow::Result;
use multipilot_runtime::auth::{self, Role, TokenEntry, Tokens};
use multipilot_tsdb::http;
use multipilot_tsdb::store::{Options, Store};
use tokio_util::sync::CancellationToken;

fn tokens() -> Result<Arc<Tokens>> {
    Ok(Arc::new(Tokens::load(&auth::Config {
        enabled: true,
        tokens_file: None,
        tokens: vec![TokenEntry::plain(
            "grafana-token-0123456789",
            "grafana",
            Role::Viewer,
        )],
    })?))
}

#[tokio::test]
async fn queries_need_a_known_token_and_peers_send_theirs() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::open(dir.path(), Options::default())?);
    let cancel = CancellationToken::new();
    let router = http::router(
        store,
        http::Options {
            tokens: Some(tokens()?),
            ..Default::default()
        },
    )?;
    let (addr, server) =
        multipilot_runtime::http::serve("127.0.0.1:0", router, cancel.clone()).await?;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/api/v1/query?query=vector(1)");
    let anonymous = client.get(&url).send().await?;
    assert_eq!(anonymous.status().as_u16(), 401);
    assert_eq!(
        anonymous
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer")
    );
    assert_eq!(
        client
            .get(&url)
            .bearer_auth("wrong")
            .send()
            .await?
            .status()
            .as_u16(),
        401
    );
    let ok = client
        .get(&url)
        .bearer_auth("grafana-token-0123456789")
        .send()
        .await?;
    assert_eq!(ok.status().as_u16(), 200);
    // POST queries (Grafana's default) are reads too
    let post = client
        .post(format!("http://{addr}/api/v1/query"))
        .form(&[("query", "vector(1)")])
        .bearer_auth("grafana-token-0123456789")
        .send()
        .await?;
    assert_eq!(post.status().as_u16(), 200);

    // a second instance federating to this one: refused without its token, answered with it
    let peer_dir = tempfile::tempdir()?;
    let peer_store = Arc::new(Store::open(peer_dir.path(), Options::default())?);
    for (token, want) in [(None, false), (Some("grafana-token-0123456789"), true)] {
        let router = http::router(
            peer_store.clone(),
            http::Options {
                peers: vec![format!("http://{addr}")],
                peer_token: token.map(String::from),
                ..Default::default()
            },
        )?;
        let (peer_addr, _peer_server) =
            multipilot_runtime::http::serve("127.0.0.1:0", router, cancel.clone()).await?;
        let status = client
            .get(format!("http://{peer_addr}/api/v1/query?query=up"))
            .send()
            .await?
            .status();
        assert_eq!(status.is_success(), want, "peer token {token:?}: {status}");
    }
    cancel.cancel();
    server.await?;
    Ok(())
}
