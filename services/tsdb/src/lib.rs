//! The `tsdb` role: durable fleet metrics and a Prometheus-compatible query API.
//!
//! Reads `fleet.metrics.<cluster>` (`MetricBatch`, decoded as a [`batch::ScrapeBatch`]) from the FLEET_METRICS stream with the durable
//! consumer `tsdb` (with `partitions: N`, `tsdb-p<k>-of-<N>` reading `fleet.metrics.<cluster>.<k>`, the
//! partition token added by the server's subject mapping); writes nothing to the bus (undecodable batches go to `fleet.dlq.FLEET_METRICS` through
//! the consumer runner). Samples are stored in Gorilla-compressed chunks ([`chunk`]) on sled ([`disk`]),
//! indexed and placed in time by [`store`]; a batch is acked only after its samples are in a flushed
//! write-ahead record. PromQL ([`promql`]) is served on the Prometheus HTTP API ([`http`]); samples can
//! also be forwarded to a Prometheus remote-write endpoint ([`remote_write`]).

pub mod batch;
pub mod chunk;
pub mod disk;
pub mod federate;
pub mod http;
pub mod promql;
pub mod remote_write;
pub mod rules;
pub mod store;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use multipilot_bus::consume::{self, Handler, Outcome, Received, Runner};
use multipilot_runtime::Context;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};

use crate::batch::ScrapeBatch;
use crate::store::{SampleView as _, Store};

/// Role settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Directory of the sled database.
    pub data_dir: PathBuf,
    /// How long samples are kept (removed a day at a time once older).
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// How far behind its series' newest sample a late sample is still stored.
    #[serde(with = "humantime_serde")]
    pub out_of_order_window: Duration,
    /// Listen address of the Prometheus HTTP API.
    pub listen: String,
    /// The consumer (stream FLEET_METRICS, durable `tsdb`).
    pub consumer: consume::Config,
    /// How often heads are saved and the write-ahead log truncated.
    #[serde(with = "humantime_serde")]
    pub checkpoint_interval: Duration,
    /// How often retention runs.
    #[serde(with = "humantime_serde")]
    pub retention_interval: Duration,
    /// Samples per sealed chunk.
    pub chunk_samples: usize,
    /// sled page cache in bytes (default 16 MiB: recent chunks and the index pages; older chunks are read
    /// through the OS page cache). What the store writes and rarely reads (series records, the write-ahead
    /// log) fills it: at 64 MiB the TSDB of a 30-cluster steady run ended ~33 MiB larger.
    pub cache_bytes: u64,
    /// Bytes of sealed chunks (120 samples of a series each) kept in memory until the writer thread has
    /// nothing to append and writes them (default 16 MiB; 0: each written by the append that sealed it).
    /// Every series of a scrape target seals its chunk at the same scrape: written at once, they held up
    /// the batches behind. Reported as `multipilot_tsdb_sealed_chunk_bytes`.
    pub sealed_chunk_bytes: usize,
    /// How far back an instant selector looks for a sample (PromQL's lookback delta).
    #[serde(with = "humantime_serde")]
    pub lookback_delta: Duration,
    /// Forward ingested samples to a Prometheus remote-write endpoint (off when absent).
    pub remote_write: Option<remote_write::Config>,
    /// Partitions the fleet's metrics are split into (1: this instance stores every cluster). With N > 1
    /// the NATS server adds `partition(N, cluster)` as a last token to `fleet.metrics.<cluster>`
    /// (`deploy/nats/partitions.conf`) and each instance reads its partition through its own durable
    /// consumer `<consumer.durable>-p<k>-of-<N>`, so every batch is stored by exactly one instance.
    pub partitions: u32,
    /// This instance's partition, 0..partitions.
    pub partition: u32,
    /// Base URLs (`http://host:port`) of the other partitions' query APIs. A PromQL query received here
    /// also reads the series its selectors need from each peer (`POST /internal/v1/select`), so any
    /// instance answers for the whole fleet. A peer that does not answer fails the query (no silent
    /// partial results).
    pub peers: Vec<String>,
    /// How long a query waits for a peer.
    #[serde(with = "humantime_serde")]
    pub peer_timeout: Duration,
    /// Who may query (the same token model as the console's: every role may read). Off by default, which
    /// only a loopback `listen` allows.
    pub auth: multipilot_runtime::auth::Config,
    /// The bearer token this instance sends to its `peers` (a viewer's token of theirs).
    pub peer_token: Option<multipilot_bus::connect::Secret>,
    /// Prometheus rule files (recording and alerting rules; `*` and `?` allowed in the file name), checked
    /// at start (a bad file stops the role) and reloaded on SIGHUP or `POST /-/reload`.
    pub rule_files: Vec<PathBuf>,
    /// How often a rule group without its own `interval` is evaluated.
    #[serde(with = "humantime_serde")]
    pub rule_evaluation_interval: Duration,
    /// Base URL of an Alertmanager-compatible API (the alert router, `http://host:9467`) that firing and
    /// resolved alerts are posted to (`POST /api/v2/alerts`); alerts are only evaluated when absent.
    pub alertmanager_url: Option<String>,
    /// The bearer token sent to `alertmanager_url` (an operator's token of the router's).
    pub alertmanager_token: Option<multipilot_bus::connect::Secret>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("data/tsdb"),
            retention: Duration::from_secs(90 * 86_400),
            out_of_order_window: Duration::from_secs(3600),
            listen: "127.0.0.1:9466".into(),
            consumer: consume::Config {
                stream: multipilot_schemas::streams::name::METRICS.into(),
                durable: "tsdb".into(),
                batch: 200,
                ..Default::default()
            },
            checkpoint_interval: Duration::from_secs(300),
            retention_interval: Duration::from_secs(3600),
            chunk_samples: 120,
            cache_bytes: 16 << 20,
            sealed_chunk_bytes: 16 << 20,
            lookback_delta: Duration::from_secs(300),
            remote_write: None,
            partitions: 1,
            partition: 0,
            peers: Vec::new(),
            peer_timeout: Duration::from_secs(10),
            auth: multipilot_runtime::auth::Config {
                enabled: false,
                ..Default::default()
            },
            peer_token: None,
            rule_files: Vec::new(),
            rule_evaluation_interval: Duration::from_secs(60),
            alertmanager_url: None,
            alertmanager_token: None,
        }
    }
}

/// Configuration and start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is out of range.
    #[error("invalid tsdb config: {0}")]
    Invalid(String),
    /// Auth is misconfigured (off on an exposed address, or an unreadable tokens file).
    #[error(transparent)]
    Auth(#[from] multipilot_runtime::auth::Error),
    /// The store could not be opened.
    #[error("opening the store: {0}")]
    Store(#[from] store::Error),
    /// A rule file is unreadable or invalid (named with its group and rule).
    #[error("rules: {0}")]
    Rules(#[from] rules::Error),
    /// The durable consumer could not be set up (retry once NATS is back).
    #[error("consumer {stream}/{durable}: {reason}")]
    Consumer {
        /// Stream.
        stream: String,
        /// Durable name.
        durable: String,
        /// What went wrong.
        reason: String,
    },
    /// The federation peers' settings.
    #[error(transparent)]
    Peers(#[from] federate::Error),
    /// The writer thread could not be started.
    #[error("the writer thread: {0}")]
    Writer(std::io::Error),
    /// The query API could not listen.
    #[error("query API on {listen}: {source}")]
    Listen {
        /// The address.
        listen: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The consumer stopped (its stream or durable is gone).
    #[error(transparent)]
    Consume(#[from] multipilot_bus::consume::Error),
    /// The store stayed locked after closing.
    #[error(transparent)]
    Release(#[from] multipilot_runtime::store::Error),
}

impl Error {
    /// Whether starting again later may succeed (NATS or the disk were away) rather than needing a changed
    /// setting.
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self,
            Error::Invalid(_) | Error::Auth(_) | Error::Peers(_) | Error::Rules(_)
        )
    }
}

impl Config {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: &str| Err(Error::Invalid(m.into()));
        if self.retention < Duration::from_secs(3600) {
            return bad("retention must be at least 1h");
        }
        if self.chunk_samples < 2 || self.chunk_samples > chunk::MAX_SAMPLES {
            return bad("chunk_samples must be between 2 and 65535");
        }
        if self.checkpoint_interval.is_zero() || self.retention_interval.is_zero() {
            return bad("checkpoint_interval and retention_interval must be positive");
        }
        if self.lookback_delta.is_zero() {
            return bad("lookback_delta must be positive");
        }
        if self.consumer.stream.is_empty() || self.consumer.durable.is_empty() {
            return bad("consumer.stream and consumer.durable must be set");
        }
        if self.partitions == 0 || self.partition >= self.partitions {
            return bad("partition must be in 0..partitions (and partitions at least 1)");
        }
        if let Some(p) = self
            .peers
            .iter()
            .find(|p| !(p.starts_with("http://") || p.starts_with("https://")))
        {
            return Err(Error::Invalid(format!(
                "peers must be http(s) base URLs, not {p:?}"
            )));
        }
        if self.peer_timeout.is_zero() {
            return bad("peer_timeout must be positive");
        }
        if self.rule_evaluation_interval.is_zero() {
            return bad("rule_evaluation_interval must be positive");
        }
        if let Some(u) = &self.alertmanager_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            return bad("alertmanager_url must be an http(s) base URL");
        }
        if let Some(rw) = &self.remote_write
            && (!(rw.url.starts_with("http://") || rw.url.starts_with("https://"))
                || rw.max_samples_per_send == 0)
        {
            return bad(
                "remote_write.url must be an http(s) URL and max_samples_per_send positive",
            );
        }
        Ok(())
    }

    /// The engine options these settings give.
    pub fn store_options(&self) -> store::Options {
        store::Options {
            out_of_order_window: self.out_of_order_window,
            chunk_samples: self.chunk_samples,
            cache_bytes: self.cache_bytes,
            retention: Some(self.retention),
            sealed_bytes: self.sealed_chunk_bytes,
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// The role's metrics (`multipilot_tsdb_*`).
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    samples: Family<OutcomeLabel, Counter>,
    series: Gauge,
    label_strings: Gauge,
    label_string_bytes: Gauge,
    scrape_cache_targets: Gauge,
    scrape_cache_bytes: Gauge,
    scrape_cache_hits: Counter,
    disk_bytes: Gauge,
    partitions_dropped: Counter,
    remote_write: Family<OutcomeLabel, Counter>,
    writer_queue: Gauge,
    sealed_chunk_bytes: Gauge,
}

impl Metrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = Metrics::default();
        registry.register(
            "multipilot_tsdb_samples",
            "Samples received, by outcome (appended, out_of_order, duplicate, too_old, invalid)",
            m.samples.clone(),
        );
        registry.register(
            "multipilot_tsdb_series",
            "Series in the index",
            m.series.clone(),
        );
        registry.register(
            "multipilot_tsdb_label_strings",
            "Distinct label names and values held in memory (each once, shared by its series and postings)",
            m.label_strings.clone(),
        );
        registry.register(
            "multipilot_tsdb_label_string_bytes",
            "Bytes of the distinct label names and values held in memory",
            m.label_string_bytes.clone(),
        );
        registry.register(
            "multipilot_tsdb_scrape_cache_targets",
            "Scrape targets whose last scrape is cached (series found by the samples' spelling, as Prometheus' scrape cache does; at most 16,384)",
            m.scrape_cache_targets.clone(),
        );
        registry.register(
            "multipilot_tsdb_scrape_cache_hits",
            "Samples whose series the scrape cache knew (spelled as at their position in the target's last scrape)",
            m.scrape_cache_hits.clone(),
        );
        registry.register(
            "multipilot_tsdb_scrape_cache_bytes",
            "Bytes of the scrape cache: each cached target's last samples as spelled, and their series",
            m.scrape_cache_bytes.clone(),
        );
        registry.register(
            "multipilot_tsdb_disk_bytes",
            "Bytes the store uses on disk",
            m.disk_bytes.clone(),
        );
        registry.register(
            "multipilot_tsdb_retention_partitions_dropped",
            "Day partitions dropped by retention",
            m.partitions_dropped.clone(),
        );
        registry.register(
            "multipilot_tsdb_remote_write_samples",
            "Samples forwarded by remote write, by outcome (sent, dropped, failed)",
            m.remote_write.clone(),
        );
        registry.register(
            "multipilot_tsdb_writer_queue",
            "Decoded batches (and commits) waiting for the writer thread, counted as it takes one (the queue holds 32: near full, appending is what limits ingestion; near 0, receiving and decoding are)",
            m.writer_queue.clone(),
        );
        registry.register(
            "multipilot_tsdb_sealed_chunk_bytes",
            "Bytes of sealed chunks held in memory until the writer thread is idle and writes them (at most tsdb.sealed_chunk_bytes; past it, appends write the chunks they seal)",
            m.sealed_chunk_bytes.clone(),
        );
        m
    }

    /// Sets the gauges of the store's sizes.
    fn gauges(&self, store: &Store) {
        self.series.set(store.series_count() as i64);
        let (strings, bytes) = store.label_strings();
        self.label_strings.set(strings as i64);
        self.label_string_bytes.set(bytes as i64);
        let (targets, bytes) = store.scrape_cache();
        self.scrape_cache_targets.set(targets as i64);
        self.scrape_cache_bytes.set(bytes as i64);
        self.disk_bytes.set(store.size_on_disk() as i64);
        self.sealed_chunk_bytes.set(store.sealed_bytes() as i64);
    }

    pub(crate) fn remote_write(&self, outcome: &'static str, n: u64) {
        self.remote_write
            .get_or_create(&OutcomeLabel { outcome })
            .inc_by(n);
    }

    fn count(&self, s: store::AppendStats) {
        self.scrape_cache_hits.inc_by(s.cached);
        for (outcome, n) in [
            ("appended", s.appended),
            ("out_of_order", s.out_of_order),
            ("duplicate", s.duplicates),
            ("too_old", s.too_old),
            ("invalid", s.invalid),
        ] {
            if n > 0 {
                self.samples
                    .get_or_create(&OutcomeLabel { outcome })
                    .inc_by(n);
            }
        }
    }
}

/// The consumer handler: hands each batch to the store's writer thread, and commits (WAL + flush) once the
/// writer has appended everything handed to it, before the runner acks; a message whose append failed is
/// named to the runner then ([`Handler::deferred_outcomes`]), which naks it alone.
///
/// The writer is a thread of its own so that appending a batch (the series lookups, the Gorilla encoding,
/// the sealed chunks: the larger part of a scrape's cost) runs beside the runner's receiving and decoding of
/// the next batches, on the other core, instead of after them. At most [`WRITER_QUEUE`] batches wait for it:
/// past that the runner waits (the messages it pulled wait in the consumer, the stream holds the rest).
#[derive(Debug)]
pub struct Ingest {
    store: Arc<Store>,
    jobs: tokio::sync::mpsc::Sender<Job>,
    /// The messages whose append failed, found at the last commit (see `deferred_outcomes`).
    failed: Vec<(u64, Outcome)>,
    writer: std::thread::JoinHandle<()>,
    /// Cancelled when the writer is found gone (it panicked): the runner stops, and `run` fails the role
    /// with the panic's message instead of nak'ing every batch while it looks healthy.
    stop: tokio_util::sync::CancellationToken,
}

/// The writer's answer to a barrier: the messages whose append failed and why, and the samples to log.
type Appended = (Vec<(u64, String)>, store::Pending);

/// How many decoded batches may wait for the writer (500-sample scrapes: a few MiB).
pub const WRITER_QUEUE: usize = 32;

#[derive(Debug)]
enum Job {
    Append {
        cluster: String,
        /// The message's stream sequence, to name it if its append fails.
        seq: u64,
        batch: ScrapeBatch,
    },
    /// Answered once every job handed over before it is done, with the messages whose append failed since
    /// the last barrier and why (the runner naks those for redelivery and acks the others: an append that
    /// failed part way leaves what it appended, found again as duplicates), and the samples to commit.
    Barrier(tokio::sync::oneshot::Sender<Appended>),
}

impl Ingest {
    /// A handler writing to `store`, and forwarding the samples to a remote-write output when one is given;
    /// `stop` is cancelled if the writer thread dies.
    pub fn new(
        store: Arc<Store>,
        metrics: Metrics,
        remote: Option<remote_write::Sender>,
        stop: tokio_util::sync::CancellationToken,
    ) -> std::io::Result<Self> {
        let (jobs, queue) = tokio::sync::mpsc::channel(WRITER_QUEUE);
        let writer = std::thread::Builder::new()
            .name("tsdb-writer".into())
            .spawn({
                let store = store.clone();
                move || write(&store, &metrics, remote.as_ref(), queue)
            })?;
        Ok(Ingest {
            store,
            jobs,
            failed: Vec::new(),
            writer,
            stop,
        })
    }

    /// Lets the writer finish what was handed to it and waits for its thread to end; an error when it
    /// panicked. (A handler dropped without this closes the queue the same way; its thread then ends on its
    /// own.)
    pub async fn finish(self) -> Result<(), Error> {
        let Ingest { jobs, writer, .. } = self;
        drop(jobs);
        let joined = tokio::task::spawn_blocking(move || writer.join())
            .await
            .map_err(|e| Error::Writer(std::io::Error::other(e)))?;
        joined.map_err(|panic| {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            Error::Writer(std::io::Error::other(format!(
                "the writer thread died: {why}"
            )))
        })
    }

    /// The writer is gone: the role stops (see `stop`).
    fn writer_gone(&self) -> String {
        self.stop.cancel();
        WRITER_GONE.into()
    }
}

/// The writer thread: appends each batch in the order handed over, until the handler is gone.
fn write(
    store: &Store,
    metrics: &Metrics,
    remote: Option<&remote_write::Sender>,
    mut queue: tokio::sync::mpsc::Receiver<Job>,
) {
    let mut failed = Vec::new();
    // sealed chunks are written while nothing waits to be appended, a slice at a time; after a failed write,
    // not again before the next job
    let mut sealed_left = 0;
    loop {
        let job = match queue.try_recv() {
            Ok(job) => job,
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) if sealed_left > 0 => {
                sealed_left = store.write_sealed(store::SEALED_SLICE).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "writing sealed chunks failed; trying again after the next batch");
                    0
                });
                metrics.sealed_chunk_bytes.set(store.sealed_bytes() as i64);
                // the head's lock, taken again at once, would starve a query waiting for it
                std::thread::yield_now();
                continue;
            }
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => match queue.blocking_recv() {
                Some(job) => job,
                None => break,
            },
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => break,
        };
        metrics.writer_queue.set(queue.len() as i64);
        match job {
            Job::Append {
                cluster,
                seq,
                batch,
            } => match store.append_scrape(&cluster, &batch) {
                Ok(stats) => {
                    metrics.count(stats);
                    sealed_left = usize::MAX;
                    if let Some(remote) = remote {
                        remote.offer(
                            batch
                                .samples()
                                .filter(|s| !s.name().is_empty())
                                .map(|s| {
                                    let labels = store::sample_labels(&s, &cluster);
                                    (labels, s.timestamp_ms(), s.value())
                                })
                                .collect(),
                        );
                    }
                }
                Err(e) => failed.push((seq, format!("appending a batch of {cluster}: {e}"))),
            },
            Job::Barrier(done) => {
                if let Err((_, pending)) =
                    done.send((std::mem::take(&mut failed), store.take_pending()))
                {
                    // the commit that asked is gone: the next one logs them
                    store.restore_pending(pending);
                }
            }
        }
    }
    // what is left goes to disk before the role closes the store (which would write it too)
    if let Err(e) = store.write_sealed(usize::MAX) {
        tracing::warn!(error = %e, "writing sealed chunks failed at shutdown; the write-ahead log keeps their samples");
    }
    metrics.sealed_chunk_bytes.set(store.sealed_bytes() as i64);
}

/// The writer thread is gone: it panicked (its batches are not committed, so not acked, and come again).
const WRITER_GONE: &str = "the TSDB's writer thread stopped";

impl Handler<ScrapeBatch> for Ingest {
    async fn handle(&mut self, msg: Received<ScrapeBatch>) -> Outcome {
        let job = Job::Append {
            cluster: msg.envelope.cluster,
            seq: msg.stream_seq,
            batch: msg.envelope.payload,
        };
        match self.jobs.send(job).await {
            Ok(()) => Outcome::Done,
            Err(_) => Outcome::Retry(self.writer_gone()),
        }
    }

    async fn commit(&mut self) -> Result<(), multipilot_bus::consume::CommitError> {
        use multipilot_bus::consume::CommitError;
        let (done, appended) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Job::Barrier(done))
            .await
            .map_err(|_| CommitError::retryable(self.writer_gone()))?;
        let mut answer = Answer {
            rx: Some(appended),
            store: &self.store,
        };
        let received = match answer.rx.as_mut() {
            Some(rx) => rx.await,
            None => return Err(CommitError::retryable(self.writer_gone())),
        };
        answer.rx = None;
        let (failed, pending) = match received {
            Ok(answer) => answer,
            Err(_) => return Err(CommitError::retryable(self.writer_gone())),
        };
        self.store
            .commit_taken(pending)
            .await
            .map_err(CommitError::retryable)?;
        self.failed = failed
            .into_iter()
            .map(|(seq, why)| (seq, Outcome::Retry(why)))
            .collect();
        Ok(())
    }

    fn deferred_outcomes(&mut self) -> Vec<(u64, Outcome)> {
        std::mem::take(&mut self.failed)
    }
}

/// The writer's answer to a barrier, awaited: a commit dropped while it waits puts the samples the writer
/// handed over back, for the next commit to log (else their batch, come again, would find them in memory as
/// duplicates and be acked with them never logged).
struct Answer<'a> {
    rx: Option<tokio::sync::oneshot::Receiver<Appended>>,
    store: &'a Store,
}

impl Drop for Answer<'_> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take()
            && let Ok((_, pending)) = rx.try_recv()
        {
            self.store.restore_pending(pending);
        }
    }
}

/// Opens the store (blocking work, off the async threads).
pub async fn open_store(config: &Config) -> Result<Arc<Store>, Error> {
    let dir = config.data_dir.clone();
    let opts = config.store_options();
    let store = tokio::task::spawn_blocking(move || Store::open(&dir, opts))
        .await
        .map_err(|e| Error::Invalid(format!("store open task: {e}")))??;
    Ok(Arc::new(store))
}

/// The subject filter of partition `k` (the partition is the last token the server's mapping adds).
pub fn partition_filter(partition: u32) -> String {
    multipilot_schemas::subject::METRICS.partition(partition)
}

/// Sets up the durable consumer this instance reads with and returns the runner's settings: the shared
/// `consumer.durable`, or with partitions the partition's own `<durable>-p<k>-of-<n>` filtered to
/// [`partition_filter`]. With `replay` (a fresh store) the durable is deleted and created again, so
/// delivery starts at the oldest batch the stream still holds instead of the last acked position.
pub async fn prepare_consumer(
    js: &async_nats::jetstream::Context,
    config: &Config,
    replay: bool,
) -> Result<consume::Config, Error> {
    let mut runner = config.consumer.clone();
    let base = config.consumer.durable.clone();
    let durable = if config.partitions > 1 {
        multipilot_bus::jetstream::Durable::partitioned(
            &runner.stream,
            &base,
            config.partition,
            config.partitions,
            vec![partition_filter(config.partition)],
        )
    } else {
        multipilot_bus::jetstream::Durable::shared(&runner.stream, &base)
    };
    runner.durable = durable
        .ensure(js, replay)
        .await
        .map_err(|e| Error::Consumer {
            stream: runner.stream.clone(),
            durable: durable.name(),
            reason: e.to_string(),
        })?;
    Ok(runner)
}

/// Runs the role until `ctx.cancel` fires: opens the store, serves the query API, consumes metric batches,
/// checkpoints and applies retention in the background.
pub async fn run(config: Config, ctx: Context) -> Result<(), Error> {
    config.validate()?;
    // Bad rule files stop the role before it opens anything.
    rules::load_files(&config.rule_files, config.rule_evaluation_interval)?;
    ctx.health.register("tsdb");
    let store = open_store(&config).await?;
    // A new or wiped data directory rebuilds what FLEET_METRICS still holds (its max_age) instead of
    // starting at the durable's acked position; the marker is written once the consumer is set up, so a
    // crash in between replays again.
    let fresh = store.is_fresh()?;
    let consumer = prepare_consumer(&ctx.js, &config, fresh).await?;
    if fresh {
        store.mark_initialized().await?;
    }
    let metrics = {
        let mut registry = ctx.registry.write().unwrap_or_else(|e| e.into_inner());
        Metrics::register(&mut registry)
    };
    multipilot_runtime::store::report_cache(&ctx.registry, "tsdb", config.cache_bytes);
    // The role's own tasks stop with the process or when the consumer runner gives up.
    let local = ctx.cancel.child_token();
    config.auth.check_listen("tsdb", &config.listen)?;
    let mut http_opts = http::Options::from(&config);
    if config.auth.enabled {
        http_opts.tokens = Some(Arc::new(multipilot_runtime::auth::Tokens::load(
            &config.auth,
        )?));
    }
    let tokens = http_opts.tokens.clone();
    let mut router = http::router(store.clone(), http_opts)?;
    let rules = if config.rule_files.is_empty() {
        None
    } else {
        let engine = promql::Engine::new(store.clone(), config.lookback_delta);
        let notifier = config.alertmanager_url.as_deref().map(|url| {
            rules::Notifier::new(url, config.alertmanager_token.as_ref().map(|t| t.0.clone()))
        });
        let generator = format!("http://{}", config.listen.replace("0.0.0.0", "127.0.0.1"));
        let manager = Arc::new(rules::Manager::new(
            config.rule_files.clone(),
            config.rule_evaluation_interval,
            engine,
            notifier,
            generator,
        )?);
        // the rules and their alerts span the fleet: not for a token that sees only some clusters
        let rules_router = rules::router(manager.clone())
            .route_layer(axum::middleware::from_fn(http::whole_fleet_only));
        router = router.merge(match tokens {
            Some(tokens) => rules_router.route_layer(axum::middleware::from_fn_with_state(
                tokens,
                multipilot_runtime::auth::viewer_reads_operator_writes,
            )),
            None => rules_router,
        });
        Some(manager)
    };
    let (addr, server) = multipilot_runtime::http::serve(&config.listen, router, local.clone())
        .await
        .map_err(|source| Error::Listen {
            listen: config.listen.clone(),
            source,
        })?;
    tracing::info!(%addr, data_dir = %config.data_dir.display(), "tsdb query API listening");

    let maintenance = tokio::spawn(maintain(
        store.clone(),
        config.clone(),
        metrics.clone(),
        local.clone(),
    ));
    tracing::info!(
        durable = %consumer.durable,
        partition = config.partition,
        partitions = config.partitions,
        peers = config.peers.len(),
        "tsdb consuming"
    );
    let runner = Runner::new(ctx.js.clone(), consumer, ctx.bus_metrics.clone());
    let remote = config.remote_write.as_ref().map(|rw| {
        tracing::info!(url = %rw.url, "forwarding samples by remote write");
        remote_write::spawn(rw.clone(), metrics.clone(), local.clone())
    });
    let mut ingest = match Ingest::new(store.clone(), metrics, remote, local.clone()) {
        Ok(ingest) => ingest,
        Err(e) => {
            // the query API and the maintenance stop with the role, letting go of the store
            local.cancel();
            let _ = maintenance.await;
            let _ = server.await;
            return Err(Error::Writer(e));
        }
    };
    let rule_task = rules.map(|m| tokio::spawn(m.run(local.clone())));
    ctx.health.set("tsdb", true);
    let result = runner.run(&mut ingest, local.clone()).await;
    ctx.health.set("tsdb", false);
    local.cancel();
    let _ = maintenance.await;
    if let Some(t) = rule_task {
        let _ = t.await;
    }
    let _ = server.await;
    let writer = ingest.finish().await;
    match &writer {
        // the writer's last appends (not acked: they come again) are committed with the rest
        Ok(()) => {
            store.commit().await?;
            store.checkpoint().await?;
        }
        // what it was doing may be half done: nothing more is written (the WAL holds every acked sample,
        // the stream what was not acked)
        Err(e) => {
            tracing::error!(error = %e, "stopping without a last commit or checkpoint");
        }
    }
    // Closed when `run` returns: the same directory can be opened again at once (a restart in-process).
    match Arc::try_unwrap(store) {
        Ok(store) if writer.is_ok() => store.close().await?,
        Ok(store) => {
            drop(store);
            multipilot_runtime::store::wait_released(&config.data_dir, Duration::from_secs(30))
                .await?;
        }
        Err(shared) => {
            // an HTTP connection still finishing a query: wait until it lets go
            drop(shared);
            multipilot_runtime::store::wait_released(&config.data_dir, Duration::from_secs(30))
                .await?;
        }
    }
    writer?;
    result?;
    tracing::info!("tsdb stopped");
    Ok(())
}

/// How often the store's size gauges are set.
const GAUGES_EVERY: Duration = Duration::from_secs(15);

/// Checkpoints, retention and the size gauges, each on its own interval, until cancelled.
async fn maintain(
    store: Arc<Store>,
    config: Config,
    metrics: Metrics,
    cancel: tokio_util::sync::CancellationToken,
) {
    let mut checkpoint = tokio::time::interval(config.checkpoint_interval);
    let mut retention = tokio::time::interval(config.retention_interval);
    // the store's sizes, as often as a fleet's scrapes come (they were set at retention, hourly: a new
    // TSDB reported no series for its first hour)
    let mut gauges = tokio::time::interval(GAUGES_EVERY);
    checkpoint.tick().await;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = checkpoint.tick() => {
                if let Err(e) = store.checkpoint().await {
                    tracing::warn!(error = %e, "checkpoint failed; the write-ahead log keeps growing");
                }
            }
            _ = retention.tick() => {
                let cutoff = chrono::Utc::now().timestamp_millis()
                    - config.retention.as_millis() as i64;
                let s = store.clone();
                match tokio::task::spawn_blocking(move || s.apply_retention(cutoff)).await {
                    Ok(Ok((partitions, series))) => {
                        metrics.partitions_dropped.inc_by(partitions as u64);
                        if partitions + series > 0 {
                            tracing::info!(partitions, series, "retention removed old data");
                        }
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "retention failed"),
                    Err(e) => tracing::warn!(error = %e, "retention task failed"),
                }
                metrics.gauges(&store);
            }
            _ = gauges.tick() => metrics.gauges(&store),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_and_rejects_unknown_keys() {
        let c = Config::default();
        c.validate().expect("defaults are valid");
        let json = serde_json::to_string(&c).expect("serializes");
        let back: Config = serde_json::from_str(&json).expect("parses");
        assert_eq!(c, back);
        assert_eq!(back.retention, Duration::from_secs(90 * 86_400));
        let partial: Config =
            serde_json::from_str(r#"{"retention":"30d","out_of_order_window":"2h"}"#)
                .expect("partial");
        assert_eq!(partial.retention, Duration::from_secs(30 * 86_400));
        assert_eq!(partial.consumer.durable, "tsdb");
        assert!(serde_json::from_str::<Config>(r#"{"retension":"30d"}"#).is_err());
    }

    #[test]
    fn partition_and_peer_settings_are_checked() {
        let ok: Config = serde_json::from_str(
            r#"{"partitions":2,"partition":1,"peers":["http://tsdb-0:9466"],"peer_timeout":"3s"}"#,
        )
        .expect("parses");
        ok.validate().expect("valid");
        let bad = |json: &str| {
            serde_json::from_str::<Config>(json)
                .expect("parses")
                .validate()
                .is_err()
        };
        assert!(bad(r#"{"partitions":2,"partition":2}"#));
        assert!(bad(r#"{"partitions":0,"partition":0}"#));
        assert!(bad(r#"{"peers":["tsdb-0:9466"]}"#));
        assert!(bad(r#"{"peer_timeout":"0s"}"#));
        assert_eq!(partition_filter(1), "fleet.metrics.*.1");
    }

    fn scrape(cluster: &str, index: i64) -> Received<ScrapeBatch> {
        use multipilot_schemas::payload::{MetricBatch, Sample};
        let t = 1_700_000_000_000 + index * 15_000;
        let batch = MetricBatch {
            job: "node".into(),
            instance: "n1:9100".into(),
            families: Vec::new(),
            samples: (0..50)
                .map(|i| Sample::new("load", &[("cpu", &i.to_string())], index as f64, t))
                .collect(),
            rejected_lines: 0,
        };
        let env = multipilot_schemas::envelope::Envelope::new(
            cluster,
            "agent",
            chrono::Utc::now(),
            index as u64,
            batch,
        );
        let bytes = bytes::Bytes::from(multipilot_schemas::encode(&env).expect("encodes"));
        // as the consumer runner decodes: the batch keeps the message's buffer
        let envelope = multipilot_schemas::decode_shared(
            Some(multipilot_schemas::CONTENT_TYPE_MSGPACK),
            Some(&<ScrapeBatch as multipilot_schemas::envelope::Payload>::schema_header()),
            &bytes,
            usize::MAX,
        )
        .expect("decodes");
        Received {
            envelope,
            subject: format!("fleet.metrics.{cluster}"),
            ingest_time: chrono::Utc::now(),
            stream_seq: index as u64 + 1,
            delivered: 1,
            msg_id: None,
        }
    }

    /// What was handed to the writer is in the WAL, in order, once the commit returns, whatever the queue
    /// held when it was asked for: the store opened again after a crash (no checkpoint, no close) replays
    /// every scrape.
    #[tokio::test]
    async fn a_commit_makes_durable_every_batch_handed_to_the_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(Store::open(dir.path(), store::Options::default()).expect("opens"));
        let stop = tokio_util::sync::CancellationToken::new();
        let mut ingest = Ingest::new(store.clone(), Metrics::default(), None, stop.clone())
            .expect("writer starts");
        // more than the queue holds: the handler waits for room rather than dropping any
        let scrapes = WRITER_QUEUE as i64 * 3;
        for index in 0..scrapes {
            assert_eq!(ingest.handle(scrape("c1", index)).await, Outcome::Done);
        }
        ingest.commit().await.expect("commits");
        ingest.finish().await.expect("the writer ends cleanly");
        assert!(!stop.is_cancelled());
        // a crash: nothing more is written
        drop(Arc::into_inner(store).expect("the writer let go of the store"));
        multipilot_runtime::store::wait_released(dir.path(), Duration::from_secs(30))
            .await
            .expect("released");
        let store = Store::open(dir.path(), store::Options::default()).expect("opens again");
        let all = store.select(&[vec![promql_parser::label::Matcher::new(
            promql_parser::label::MatchOp::Equal,
            "__name__",
            "load",
        )]]);
        assert_eq!(all.len(), 50);
        for (id, _) in all {
            let samples = store.samples(id, i64::MIN, i64::MAX).expect("reads");
            let values: Vec<f64> = samples.iter().map(|s| s.1).collect();
            let want: Vec<f64> = (0..scrapes).map(|i| i as f64).collect();
            assert_eq!(values, want, "every scrape, in order");
        }
    }

    /// The chunks appends seal wait in memory and the writer writes them once it has nothing to append.
    #[tokio::test]
    async fn the_writer_writes_sealed_chunks_when_idle() {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = store::Options {
            sealed_bytes: 1 << 20,
            ..Default::default()
        };
        let store = Arc::new(Store::open(dir.path(), opts).expect("opens"));
        let stop = tokio_util::sync::CancellationToken::new();
        let mut ingest = Ingest::new(store.clone(), Metrics::default(), None, stop.clone())
            .expect("writer starts");
        // 130 scrapes of 50 series: each series seals one chunk of 120
        for index in 0..130 {
            assert_eq!(ingest.handle(scrape("c1", index)).await, Outcome::Done);
        }
        ingest.commit().await.expect("commits");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while store.sealed_bytes() > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(store.sealed_bytes(), 0, "written while the writer was idle");
        assert_eq!(
            store.sealed_written(),
            50,
            "kept in memory first, then written"
        );
        assert_eq!(store.chunk_stats().expect("reads").1, 50 * 120);
        ingest.finish().await.expect("the writer ends cleanly");
    }
}
