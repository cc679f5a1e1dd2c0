//! `multipilot status`: what is in the streams and how far behind each consumer is.

use anyhow::Result;
use async_nats::jetstream;
use futures::StreamExt;
use serde::Serialize;

#[derive(Debug, Serialize)]
struct StreamRow {
    stream: String,
    messages: u64,
    bytes: u64,
    subjects: u64,
    consumers: Vec<ConsumerRow>,
}

#[derive(Debug, Serialize)]
struct ConsumerRow {
    name: String,
    pending: u64,
    unacked: usize,
    redelivered: usize,
}

/// Prints every stream and its consumers as a table or JSON.
pub async fn print(js: &jetstream::Context, output: &str) -> Result<()> {
    let mut rows = Vec::new();
    let mut names: Vec<String> = js
        .stream_names()
        .filter_map(|n| async { n.ok() })
        .collect()
        .await;
    names.sort();
    for name in names {
        let mut stream = js.get_stream(&name).await?;
        let info = stream.info().await?.clone();
        let mut consumers = Vec::new();
        let mut list = stream.consumers();
        while let Some(c) = list.next().await {
            let c = c?;
            consumers.push(ConsumerRow {
                name: c.name.clone(),
                pending: c.num_pending,
                unacked: c.num_ack_pending,
                redelivered: c.num_redelivered,
            });
        }
        rows.push(StreamRow {
            stream: name,
            messages: info.state.messages,
            bytes: info.state.bytes,
            subjects: info.state.subjects_count,
            consumers,
        });
    }
    #[allow(clippy::print_stdout)]
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!(
            "{:<18} {:>10} {:>12} {:>9}  CONSUMERS (pending/unacked)",
            "STREAM", "MESSAGES", "BYTES", "SUBJECTS"
        );
        for r in rows {
            let cs: Vec<String> = r
                .consumers
                .iter()
                .map(|c| format!("{} {}/{}", c.name, c.pending, c.unacked))
                .collect();
            println!(
                "{:<18} {:>10} {:>12} {:>9}  {}",
                r.stream,
                r.messages,
                r.bytes,
                r.subjects,
                cs.join(", ")
            );
        }
    }
    Ok(())
}
