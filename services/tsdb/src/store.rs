//! The storage engine: the series index, the in-memory head and the rules for time.
//!
//! - **Index**: labels → series id (a hash map checked for collisions) and postings (label name → value →
//!   sorted ids) for matching. Rebuilt from the `series` tree at open. Every label name and value is kept
//!   once in memory (`Interner`): a series holds each of its labels as two 4-byte numbers of it and the
//!   postings share its strings, so `namespace` or a namespace's name costs one allocation in the whole
//!   head, not one per series.
//! - **Head**: per series one open Gorilla chunk; it is sealed at [`Options::chunk_samples`] samples or when
//!   it would span more than [`Options::max_chunk_span`], and written to [`crate::disk`] by the append that
//!   sealed it, or kept in memory (read with the head) until [`Store::write_sealed`] or a checkpoint writes
//!   it ([`Options::sealed_bytes`]).
//! - **Durability**: every appended sample also goes to a pending write-ahead record; [`Store::commit`]
//!   appends it to the WAL file and syncs that file beside sled's flush, so what the consumer acks after
//!   `commit` survives `kill -9`.
//!   [`Store::checkpoint`] saves the heads and starts a new WAL generation so the log stays short.
//! - **Time**: a sample newer than its series' newest is appended; an older one within
//!   [`Options::out_of_order_window`] of the newest goes to the series' out-of-order buffer (written as its
//!   own chunk at the next checkpoint; reads merge by timestamp); an older one is rejected. A sample whose
//!   (series, timestamp) is stored already is a duplicate and dropped: the first value wins.
//! - **Retention**: [`Store::apply_retention`] drops whole day partitions and forgets series without data.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use multipilot_schemas::payload::Sample;
use promql_parser::label::{MatchOp, Matcher};

use crate::batch::ScrapeBatch;
use crate::chunk::{self, Chunk};
use crate::disk::{self, Disk};

/// A series id (assigned in order of first sight, never reused).
pub type SeriesId = u64;

/// A series' labels, sorted by name, the metric name as `__name__`.
pub type Labels = Vec<(String, String)>;

/// The label that carries the metric name.
pub const METRIC_NAME: &str = "__name__";

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The disk layer failed (retryable for ingestion: nothing is acked).
    #[error(transparent)]
    Disk(#[from] disk::Error),
    /// A head chunk could not be decoded.
    #[error("head chunk of series {id}: {source}")]
    Chunk {
        /// Series.
        id: SeriesId,
        /// Why.
        #[source]
        source: chunk::Error,
    },
}

/// Store result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Engine settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// How far behind its series' newest sample a sample may arrive and still be stored.
    pub out_of_order_window: Duration,
    /// Samples per sealed chunk.
    pub chunk_samples: usize,
    /// Longest time one chunk spans.
    pub max_chunk_span: Duration,
    /// sled page cache.
    pub cache_bytes: u64,
    /// Samples older than this (by the wall clock) are refused as too old; `None` keeps everything.
    pub retention: Option<Duration>,
    /// Chunks an append seals wait in memory (read with the head) for [`Store::write_sealed`], up to this
    /// many bytes, instead of being written by the append; past it, and with 0, the append writes them.
    pub sealed_bytes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            out_of_order_window: Duration::from_secs(3600),
            chunk_samples: 120,
            max_chunk_span: Duration::from_secs(2 * 3600),
            cache_bytes: 256 << 20,
            retention: None,
            sealed_bytes: 0,
        }
    }
}

/// What happened to the samples of one append.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppendStats {
    /// Stored in order.
    pub appended: u64,
    /// Stored out of order (within the window).
    pub out_of_order: u64,
    /// Already stored.
    pub duplicates: u64,
    /// Older than the out-of-order window.
    pub too_old: u64,
    /// Unusable (empty metric name).
    pub invalid: u64,
    /// Of all the above, the samples whose series the scrape cache knew by their spelling.
    pub cached: u64,
}

impl AppendStats {
    fn add(&mut self, o: AppendStats) {
        self.appended += o.appended;
        self.out_of_order += o.out_of_order;
        self.duplicates += o.duplicates;
        self.too_old += o.too_old;
        self.invalid += o.invalid;
        self.cached += o.cached;
    }
}

/// A label name or value as the head keeps it: one allocation shared by the interner and the postings.
type Text = Arc<str>;

/// A label string's number in the head's [`Interner`].
type Sym = u32;

/// A series' labels in the head: sorted by name, `__name__` included, each string by its number (8 bytes
/// a label where two shared pointers took 32: a quarter of the head's memory at 100k series).
type HeadLabels = Box<[(Sym, Sym)]>;

/// The head's label strings, each kept once and numbered.
#[derive(Debug, Default)]
struct Interner {
    ids: foldhash::HashMap<Text, Sym>,
    /// By number; `None` for a number freed by [`Interner::sweep`] and not yet given again.
    texts: Vec<Option<Text>>,
    free: Vec<Sym>,
}

impl Interner {
    /// The number of `s`, given a new one the first time.
    fn get(&mut self, s: &str) -> Sym {
        if let Some(&sym) = self.ids.get(s) {
            return sym;
        }
        let t: Text = Arc::from(s);
        let sym = match self.free.pop() {
            Some(sym) => {
                self.texts[sym as usize] = Some(t.clone());
                sym
            }
            None => {
                // 2^32 distinct label strings would take hundreds of GiB before this could wrap
                let sym = Sym::try_from(self.texts.len()).unwrap_or(Sym::MAX);
                self.texts.push(Some(t.clone()));
                sym
            }
        };
        self.ids.insert(t, sym);
        sym
    }

    /// The string numbered `sym` (empty for a number not in use: a series only holds numbers in use).
    fn text(&self, sym: Sym) -> &Text {
        static NONE: std::sync::LazyLock<Text> = std::sync::LazyLock::new(|| Arc::from(""));
        self.texts
            .get(sym as usize)
            .and_then(Option::as_ref)
            .unwrap_or(&NONE)
    }

    fn str(&self, sym: Sym) -> &str {
        self.text(sym)
    }

    /// Forgets the strings no posting holds any more. Every label of every series is in the postings, so
    /// a string only the interner holds (its map and its list: two references) is no series' either.
    fn sweep(&mut self) {
        let Interner { ids, texts, free } = self;
        ids.retain(|t, sym| {
            let keep = Arc::strong_count(t) > 2;
            if !keep {
                texts[*sym as usize] = None;
                free.push(*sym);
            }
            keep
        });
    }

    /// Strings held.
    fn len(&self) -> usize {
        self.ids.len()
    }

    /// Bytes of the strings held.
    fn bytes(&self) -> usize {
        self.ids.keys().map(|t| t.len()).sum()
    }
}

#[derive(Debug)]
struct Series {
    labels: HeadLabels,
    hash: u64,
    head: Chunk,
    /// Samples stored out of order since the last checkpoint (boxed: almost every series has none, and
    /// 8 bytes a series is less than an empty map's 24).
    #[allow(clippy::box_collection)]
    ooo: Option<Box<BTreeMap<i64, f64>>>,
    /// Newest timestamp stored in order (`i64::MIN` when none).
    max_t: i64,
}

impl Series {
    fn has_ooo(&self) -> bool {
        self.ooo.as_ref().is_some_and(|m| !m.is_empty())
    }
}

/// The head's series by id, kept side by side in one vector and found through an id → position map. A
/// hash map of whole series (112 bytes each) kept up to half of its buckets empty after growing: 36 MB for
/// 120k series, where the series themselves take 13.
#[derive(Debug, Default)]
struct SeriesTable {
    slots: foldhash::HashMap<SeriesId, usize>,
    ids: Vec<SeriesId>,
    series: Vec<Series>,
}

impl SeriesTable {
    /// Reads the first and last bytes of the open chunk of the series in `slots` (hints: a slot out of the
    /// table is passed over), where an append writes (its sample count, its new bits): one after another,
    /// independent loads wait for memory together; appended one by one, each sample waited for its own
    /// series' chunk (a sixth of the TSDB's ingest CPU, on a 24-target drain).
    fn touch(&self, slots: impl Iterator<Item = usize>) {
        let mut seen = 0u8;
        for slot in slots {
            if let Some(s) = self.series.get(slot)
                && let [first, .., last] = s.head.bytes()
            {
                seen ^= first ^ last;
            }
        }
        std::hint::black_box(seen);
    }

    /// The slot of series `id`: `hint` when the series is still there, else looked up.
    fn slot(&self, id: SeriesId, hint: usize) -> Option<usize> {
        match self.ids.get(hint) {
            Some(&at) if at == id => Some(hint),
            _ => self.slots.get(&id).copied(),
        }
    }

    fn get(&self, id: &SeriesId) -> Option<&Series> {
        self.series.get(*self.slots.get(id)?)
    }

    fn get_mut(&mut self, id: &SeriesId) -> Option<&mut Series> {
        self.series.get_mut(*self.slots.get(id)?)
    }

    /// Adds a series, or replaces the one with this id.
    fn insert(&mut self, id: SeriesId, series: Series) {
        match self.slots.get(&id) {
            Some(&slot) => self.series[slot] = series,
            None => {
                self.slots.insert(id, self.series.len());
                self.ids.push(id);
                self.series.push(series);
            }
        }
    }

    /// Removes a series; the last one takes its place.
    fn remove(&mut self, id: &SeriesId) -> Option<Series> {
        let slot = self.slots.remove(id)?;
        self.ids.swap_remove(slot);
        let series = self.series.swap_remove(slot);
        if let Some(moved) = self.ids.get(slot) {
            self.slots.insert(*moved, slot);
        }
        Some(series)
    }

    fn iter(&self) -> impl Iterator<Item = (&SeriesId, &Series)> {
        self.ids.iter().zip(&self.series)
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (&SeriesId, &mut Series)> {
        self.ids.iter().zip(&mut self.series)
    }

    fn keys(&self) -> impl Iterator<Item = &SeriesId> {
        self.ids.iter()
    }

    fn len(&self) -> usize {
        self.series.len()
    }
}

#[derive(Debug, Default)]
struct Head {
    series: SeriesTable,
    /// Label hash → the series with it; a second series with the same hash (a collision: ~never) goes to
    /// `collisions`, so the usual entry holds one id and no allocation.
    by_hash: foldhash::HashMap<u64, SeriesId>,
    collisions: foldhash::HashMap<u64, Vec<SeriesId>>,
    postings: BTreeMap<Text, BTreeMap<Text, Vec<SeriesId>>>,
    strings: Interner,
    next_id: SeriesId,
    pending: Vec<(SeriesId, i64, f64)>,
    /// Per scrape target (a hash of cluster, job and instance): its last scrape's samples as spelled and
    /// their series ([`Store::append_scrape`]).
    scrape_cache: foldhash::HashMap<u64, ScrapeCache>,
    sealed: Sealed,
}

/// Chunks sealed by appends and not on disk yet, oldest first per series (see [`Options::sealed_bytes`]).
///
/// All series of a target reach a chunk's 120 samples at the same scrape, and all targets scraped at one
/// interval together: the appends that seal them wrote thousands of chunks at once (sled inserts, ~2.5 µs
/// each), while the batches behind waited. On a 24-target drain the decoder stood idle 14 % of the time for
/// these bursts. Kept here, they are written by the writer thread when it has nothing to append.
#[derive(Debug, Default)]
struct Sealed {
    /// By series: written in the order of their keys on disk, as they were when each append wrote them.
    chunks: BTreeMap<SeriesId, Vec<Vec<u8>>>,
    bytes: usize,
    /// Chunks written from here so far.
    written: u64,
}

impl Sealed {
    fn of(&self, id: SeriesId) -> &[Vec<u8>] {
        self.chunks.get(&id).map_or(&[], Vec::as_slice)
    }
}

/// A target's last scrape, as Prometheus' scrape cache keeps it: each position's name and labels as the
/// message spelled them (MessagePack bytes) and the series they were stored in. A sample spelled as the one
/// at its position last time is that series: no labels to build, hash or compare.
///
/// A spelling is kept as what it does not share with the one before it (a scrape's neighbours differ in a
/// label value or two): ~200 bytes a series kept whole were 41 MB at 50 clusters, a fifth of the TSDB.
#[derive(Debug, Default)]
struct ScrapeCache {
    /// The target (cluster, job, instance, each with its length before it): the map's key is a hash of it,
    /// which an agent choosing its job and instance could make collide with another cluster's.
    target: Box<[u8]>,
    /// Each position's spelling but its shared start and end, one after another.
    middles: Vec<u8>,
    rows: Vec<CachedRow>,
}

#[derive(Debug, Clone, Copy)]
struct CachedRow {
    /// Its series (`SeriesId::MAX`: none, as for a refused sample).
    id: SeriesId,
    /// The series' slot in the table when cached (a hint: checked before use).
    slot: u32,
    /// Where its middle ends in `middles` (it starts where the one before ends).
    end: u32,
    /// Bytes its spelling shares with the spelling before it: at its start, at its end.
    prefix: u16,
    suffix: u16,
}

impl ScrapeCache {
    fn middle(&self, pos: usize) -> Option<&[u8]> {
        let start = match pos {
            0 => 0,
            _ => self.rows.get(pos - 1)?.end as usize,
        };
        self.middles.get(start..self.rows.get(pos)?.end as usize)
    }

    /// Appends a position spelled `ident`, the position before it spelled `prev`.
    fn push(&mut self, prev: &[u8], ident: &[u8], id: SeriesId, slot: u32) {
        let max = u16::MAX as usize;
        let prefix = prev
            .iter()
            .zip(ident)
            .take_while(|(a, b)| a == b)
            .count()
            .min(max);
        let room = prev.len().min(ident.len()) - prefix;
        let suffix = (prev.iter().rev().zip(ident.iter().rev()))
            .take(room)
            .take_while(|(a, b)| a == b)
            .count()
            .min(max);
        self.middles
            .extend_from_slice(&ident[prefix..ident.len() - suffix]);
        self.rows.push(CachedRow {
            id,
            slot,
            end: u32::try_from(self.middles.len()).unwrap_or(u32::MAX),
            prefix: prefix as u16,
            suffix: suffix as u16,
        });
    }

    /// A copy of the first `n` positions.
    fn first(&self, n: usize) -> ScrapeCache {
        let n = n.min(self.rows.len());
        let end = n
            .checked_sub(1)
            .map_or(0, |last| self.rows[last].end as usize);
        ScrapeCache {
            target: self.target.clone(),
            middles: self.middles[..end.min(self.middles.len())].to_vec(),
            rows: self.rows[..n].to_vec(),
        }
    }

    /// Keeps the first `n` positions.
    fn truncate(&mut self, n: usize) {
        self.rows.truncate(n);
        self.middles
            .truncate(self.rows.last().map_or(0, |r| r.end as usize));
    }

    /// Bytes held (reported as a metric).
    fn bytes(&self) -> usize {
        self.target.len()
            + self.middles.capacity()
            + self.rows.capacity() * std::mem::size_of::<CachedRow>()
    }
}

/// Writes the chunks of up to `max` series of `sealed` to `disk`, each series' oldest first; a chunk whose
/// write fails is put back with those after it.
fn write_sealed(disk: &Disk, sealed: &mut Sealed, max: usize) -> Result<()> {
    for _ in 0..max {
        let Some((id, chunks)) = sealed.chunks.pop_first() else {
            break;
        };
        let mut chunks = chunks.into_iter();
        while let Some(bytes) = chunks.next() {
            if let Err(e) = disk.write_chunk(id, &bytes) {
                let left: Vec<Vec<u8>> = std::iter::once(bytes).chain(chunks).collect();
                sealed.chunks.insert(id, left);
                return Err(e.into());
            }
            sealed.bytes -= bytes.capacity();
            sealed.written += 1;
        }
    }
    Ok(())
}

/// Series whose sealed chunks [`Store::write_sealed`] is asked to write at a time between batches, holding
/// the head's lock (~2.5 µs a chunk: queries wait no longer than for one batch's append).
pub const SEALED_SLICE: usize = 64;

/// Samples appended and not committed yet, taken from the store ([`Store::take_pending`]).
#[derive(Debug, Default)]
pub struct Pending(Vec<(SeriesId, i64, f64)>);

/// A scrape target's key in the scrape cache, and the target itself (see [`ScrapeCache::target`]).
fn scrape_target(cluster: &str, job: &str, instance: &str) -> (u64, Box<[u8]>) {
    let key = hash_pairs([(cluster, ""), (job, instance)].into_iter());
    let mut target = Vec::with_capacity(cluster.len() + job.len() + instance.len() + 24);
    for part in [cluster, job, instance] {
        target.extend_from_slice(&(part.len() as u64).to_le_bytes());
        target.extend_from_slice(part.as_bytes());
    }
    (key, target.into_boxed_slice())
}

/// Goes through a cached scrape position by position beside a new one, telling which positions are
/// spelled as last time.
struct Walk<'c> {
    cache: &'c ScrapeCache,
    /// The cached spelling of the position before, when `differs` (else it is the new one's).
    own: Vec<u8>,
    differs: bool,
    spare: Vec<u8>,
    /// The cache does not add up (never made so): every later position reads as new.
    broken: bool,
}

impl<'c> Walk<'c> {
    fn new(cache: &'c ScrapeCache) -> Self {
        Walk {
            cache,
            own: Vec::new(),
            differs: false,
            spare: Vec::new(),
            broken: false,
        }
    }

    /// The cached row of position `pos` if it was spelled `ident` there last time; `prev` is the new
    /// spelling of the position before. Called for every position in order.
    fn same(&mut self, pos: usize, prev: &[u8], ident: &[u8]) -> Option<CachedRow> {
        if self.broken {
            return None;
        }
        let row = *self.cache.rows.get(pos)?;
        let middle = self.cache.middle(pos)?;
        let before = if self.differs { &self.own[..] } else { prev };
        let (p, s) = (row.prefix as usize, row.suffix as usize);
        if before.len() < p + s {
            self.broken = true;
            return None;
        }
        let tail = &before[before.len() - s..];
        let same = ident.len() == p + middle.len() + s
            && ident[..p] == before[..p]
            && &ident[p..p + middle.len()] == middle
            && &ident[p + middle.len()..] == tail;
        if !same {
            // the cached spelling, for the next position's comparison
            self.spare.clear();
            self.spare.extend_from_slice(&before[..p]);
            self.spare.extend_from_slice(middle);
            self.spare.extend_from_slice(tail);
            std::mem::swap(&mut self.own, &mut self.spare);
        }
        self.differs = !same;
        same.then_some(row)
    }
}

/// The store. Cheap to share behind an `Arc`; one writer (the ingester) and any number of readers.
#[derive(Debug)]
pub struct Store {
    disk: Disk,
    head: RwLock<Head>,
    opts: Options,
}

/// A series' label hash (in memory only: the index is rebuilt at open), and a scrape target's key.
/// foldhash, not SipHash: a collision costs a comparison (of the labels, of the target), not correctness, and
/// hashing every sample's labels was a tenth of the ingest time.
fn hash_pairs<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> u64 {
    let mut h = foldhash::fast::FixedState::with_seed(0x6d75_6c74_6970_696c).build_hasher();
    for (k, v) in pairs {
        k.hash(&mut h);
        v.hash(&mut h);
    }
    h.finish()
}

/// A sample as the store reads it, its strings borrowed for `'a`: an owned [`Sample`] or a
/// [`crate::batch::SampleRef`] of a decoded batch.
pub trait SampleView<'a> {
    /// The metric name.
    fn name(&self) -> &'a str;
    /// The labels, sorted by name, each name once.
    fn labels(&self) -> impl Iterator<Item = (&'a str, &'a str)>;
    /// The value.
    fn value(&self) -> f64;
    /// Milliseconds since the epoch.
    fn timestamp_ms(&self) -> i64;
    /// The sample's name and labels as its message spelled them, for the scrape cache
    /// ([`Store::append_scrape`]); empty when unknown (never cached).
    fn ident(&self) -> &'a [u8] {
        &[]
    }
}

impl<'a> SampleView<'a> for &'a Sample {
    fn name(&self) -> &'a str {
        &self.name
    }
    fn labels(&self) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.labels.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
    fn value(&self) -> f64 {
        self.value
    }
    fn timestamp_ms(&self) -> i64 {
        self.timestamp_ms
    }
}

/// A sample's labels into `out` (cleared first; the ingest path reuses one buffer for every sample), in
/// sorted order with `__name__` merged in, empty values dropped (as in Prometheus), and `cluster` when the
/// sample has no `cluster` label of its own and `cluster` is not empty. Returns whether the sample is
/// valid: not a label bomb (too many labels, an empty name, a name or value longer than [`MAX_LABEL_BYTES`]).
fn fill_pairs<'a>(
    out: &mut Vec<(&'a str, &'a str)>,
    name: &'a str,
    labels: impl Iterator<Item = (&'a str, &'a str)>,
    cluster: &'a str,
) -> bool {
    out.clear();
    out.push((METRIC_NAME, name));
    let mut invalid = name.is_empty() || name.len() > MAX_LABEL_BYTES;
    let (mut count, mut has_cluster) = (0usize, false);
    for (k, v) in labels {
        count += 1;
        invalid |= k.is_empty() || k.len() > MAX_LABEL_BYTES || v.len() > MAX_LABEL_BYTES;
        has_cluster |= k == "cluster";
        if k != METRIC_NAME && !v.is_empty() {
            out.push((k, v));
        }
    }
    if !has_cluster && !cluster.is_empty() {
        out.push(("cluster", cluster));
    }
    // the labels come sorted: only `__name__` and `cluster` may be out of place
    if !out.is_sorted_by(|a, b| a.0 <= b.0) {
        out.sort_unstable_by(|a, b| a.0.cmp(b.0));
    }
    !invalid && count <= MAX_LABELS
}

/// The labels a sample is stored under: its labels (empty values dropped), `__name__`, and `cluster` from
/// the envelope when the sample has none.
pub fn sample_labels<'a>(sample: &impl SampleView<'a>, cluster: &'a str) -> Labels {
    let mut out = Vec::new();
    fill_pairs(&mut out, sample.name(), sample.labels(), cluster);
    out.into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Whether stored labels are these pairs.
fn same_labels(strings: &Interner, labels: &HeadLabels, pairs: &[(&str, &str)]) -> bool {
    labels.len() == pairs.len()
        && labels
            .iter()
            .zip(pairs)
            .all(|((k, v), (pk, pv))| strings.str(*k) == *pk && strings.str(*v) == *pv)
}

/// A series' labels as the store hands them out.
fn owned_labels(strings: &Interner, labels: &HeadLabels) -> Arc<Labels> {
    Arc::new(
        labels
            .iter()
            .map(|(k, v)| (strings.str(*k).to_string(), strings.str(*v).to_string()))
            .collect(),
    )
}

/// The value of label `name` among stored labels (empty when absent).
fn head_label<'a>(strings: &'a Interner, labels: &HeadLabels, name: &str) -> &'a str {
    labels
        .iter()
        .find(|(k, _)| strings.str(*k) == name)
        .map_or("", |(_, v)| strings.str(*v))
}

/// Scrape targets whose last scrape's series are remembered; beyond it the cache starts over.
const MAX_CACHED_TARGETS: usize = 16_384;

/// Samples' room the pending buffer keeps between commits (6 MiB: a batch of 500 scrapes of 500 samples).
const MAX_KEPT_PENDING: usize = 262_144;

fn intersect(a: &[SeriesId], b: &[SeriesId]) -> Vec<SeriesId> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                out.push(a[i]);
                i += 1;
                j += 1;
            }
        }
    }
    out
}

/// The value of a label (empty when absent).
pub fn label<'a, S: AsRef<str>>(labels: &'a [(S, S)], name: &str) -> &'a str {
    labels
        .iter()
        .find(|(k, _)| k.as_ref() == name)
        .map(|(_, v)| v.as_ref())
        .unwrap_or("")
}

/// Most labels one series may have (Prometheus' `label_limit` idea; kube-state-metrics stays far below).
pub const MAX_LABELS: usize = 64;
/// Longest label name or value, and metric name, in bytes.
pub const MAX_LABEL_BYTES: usize = 4096;

impl Store {
    /// Opens the store in `dir`, replaying the write-ahead log.
    pub fn open(dir: &Path, opts: Options) -> Result<Self> {
        let disk = Disk::open(dir, opts.cache_bytes)?;
        let mut head = Head::default();
        for (id, labels) in disk.load_series()? {
            let pairs: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            head.insert_series(id, &pairs);
            head.next_id = head.next_id.max(id + 1);
        }
        for (id, bytes) in disk.load_heads()? {
            let Some(s) = head.series.get_mut(&id) else {
                continue;
            };
            let Some((max_t, chunk_bytes)) = bytes.split_first_chunk::<8>() else {
                continue;
            };
            s.max_t = i64::from_be_bytes(*max_t);
            s.head =
                Chunk::from_bytes(chunk_bytes).map_err(|source| Error::Chunk { id, source })?;
        }
        let store = Store {
            disk,
            head: RwLock::new(head),
            opts,
        };
        let records = store.disk.wal_records()?;
        let mut replayed = 0usize;
        {
            let mut head = store.write();
            for rec in records {
                for (id, t, v) in disk::decode_wal(&rec)? {
                    store.append_sample(&mut head, id, t, v)?;
                    replayed += 1;
                }
            }
            head.pending.clear();
        }
        tracing::info!(
            dir = %dir.display(),
            series = store.series_count(),
            replayed,
            "tsdb store opened"
        );
        Ok(store)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Head> {
        self.head.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Head> {
        self.head.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The engine settings.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    fn max_span_ms(&self) -> i64 {
        self.opts.max_chunk_span.as_millis() as i64
    }

    /// Appends samples. Samples without a `cluster` label get `cluster` (when not empty). Not durable
    /// until [`Store::commit`].
    pub fn append<'a, S: SampleView<'a>>(
        &self,
        cluster: &'a str,
        samples: impl IntoIterator<Item = S>,
    ) -> Result<AppendStats> {
        self.append_inner(cluster, None, samples)
    }

    /// Appends the samples of one scrape, as [`Store::append`], remembering the series of each position of
    /// the target's scrape (cluster, job, instance) for its next scrape, as Prometheus' scrape cache does:
    /// a target sends its series in the same order every time, so the index is searched only for what
    /// changed. A remembered series is used only if the sample is spelled byte for byte as at its position last
    /// time, for the same target.
    pub fn append_scrape(&self, cluster: &str, batch: &ScrapeBatch) -> Result<AppendStats> {
        let target = scrape_target(cluster, &batch.job, &batch.instance);
        self.append_inner(cluster, Some(target), batch.samples())
    }

    fn append_inner<'a, S: SampleView<'a>>(
        &self,
        cluster: &'a str,
        target: Option<(u64, Box<[u8]>)>,
        samples: impl IntoIterator<Item = S>,
    ) -> Result<AppendStats> {
        let mut stats = AppendStats::default();
        let cutoff = self.opts.retention.map(|r| {
            chrono::Utc::now()
                .timestamp_millis()
                .saturating_sub(r.as_millis().min(i64::MAX as u128) as i64)
        });
        let mut guard = self.write();
        let head = &mut *guard;
        // taken out while the batch is appended, put back after; another target's under the same key is
        // not this one's
        let cached = match &target {
            Some((key, t)) => head
                .scrape_cache
                .remove(key)
                .filter(|c| c.target == *t)
                .unwrap_or_else(|| ScrapeCache {
                    target: t.clone(),
                    ..Default::default()
                }),
            None => ScrapeCache::default(),
        };
        head.series
            .touch(cached.rows.iter().map(|r| r.slot as usize));
        let mut walk = Walk::new(&cached);
        // this scrape's cache, built from the first position whose spelling, series or slot is not as
        // cached
        let mut next: Option<ScrapeCache> = None;
        let mut pairs = Vec::with_capacity(16);
        let mut count = 0;
        let mut prev: &[u8] = &[];
        for (pos, s) in samples.into_iter().enumerate() {
            count = pos + 1;
            let ident = s.ident();
            let same = walk.same(pos, prev, ident);
            let (t, v) = (s.timestamp_ms(), s.value());
            let (id, slot) = 'sample: {
                if let Some(row) = same.filter(|r| r.id != SeriesId::MAX && !ident.is_empty()) {
                    // its labels were valid when cached: only the time is left to check
                    if cutoff.is_some_and(|c| t < c) {
                        stats.too_old += 1;
                        stats.cached += 1;
                        break 'sample (row.id, row.slot as usize);
                    }
                    if let Some(slot) = head.series.slot(row.id, row.slot as usize) {
                        let series = &mut head.series.series[slot];
                        let (pending, sealed) = (&mut head.pending, &mut head.sealed);
                        stats.add(self.append_to(series, pending, sealed, row.id, t, v)?);
                        stats.cached += 1;
                        break 'sample (row.id, slot);
                    }
                    // the series is gone (retention): found or made anew below
                }
                // A label bomb (thousands of labels, or megabyte values) is refused sample by sample: one
                // bad series can't bloat the index, and its valid neighbours are stored.
                if !fill_pairs(&mut pairs, s.name(), s.labels(), cluster) {
                    stats.invalid += 1;
                    break 'sample (SeriesId::MAX, usize::MAX);
                }
                if cutoff.is_some_and(|c| t < c) {
                    stats.too_old += 1;
                    break 'sample (SeriesId::MAX, usize::MAX);
                }
                let hash = hash_pairs(pairs.iter().copied());
                let id = match head.find(hash, &pairs) {
                    Some(id) => id,
                    None => {
                        let id = head.next_id;
                        self.disk.put_series(id, &pairs)?;
                        head.next_id += 1;
                        head.insert_series(id, &pairs);
                        id
                    }
                };
                stats.add(self.append_sample(head, id, t, v)?);
                (
                    id,
                    head.series.slots.get(&id).copied().unwrap_or(usize::MAX),
                )
            };
            let slot = u32::try_from(slot).unwrap_or(u32::MAX);
            let unchanged = same.is_some_and(|r| r.id == id && r.slot == slot);
            if !unchanged && next.is_none() && target.is_some() {
                // every position before this one was as cached
                next = Some(cached.first(pos));
            }
            if let Some(next) = &mut next {
                next.push(prev, ident, id, slot);
            }
            prev = ident;
        }
        if let Some((key, _)) = target {
            // as cached: the cache stands; fewer samples: the first `count` of it
            let rebuilt = next.is_some() || cached.rows.len() > count;
            drop(walk);
            let mut kept = next.unwrap_or(cached);
            kept.truncate(count);
            if rebuilt {
                // held until the target's samples change: no room left to grow into
                kept.middles.shrink_to_fit();
                kept.rows.shrink_to_fit();
            }
            // bounded: a fleet whose targets churn (pods come and go) starts over rather than growing
            if head.scrape_cache.len() >= MAX_CACHED_TARGETS {
                head.scrape_cache.clear();
            }
            head.scrape_cache.insert(key, kept);
        }
        Ok(stats)
    }

    /// Appends one sample of a known series, logging it for the next commit when it is stored.
    fn append_sample(&self, head: &mut Head, id: SeriesId, t: i64, v: f64) -> Result<AppendStats> {
        let Head {
            series,
            pending,
            sealed,
            ..
        } = head;
        match series.get_mut(&id) {
            Some(s) => self.append_to(s, pending, sealed, id, t, v),
            None => Ok(AppendStats {
                invalid: 1,
                ..Default::default()
            }),
        }
    }

    fn append_to(
        &self,
        s: &mut Series,
        pending: &mut Vec<(SeriesId, i64, f64)>,
        sealed: &mut Sealed,
        id: SeriesId,
        t: i64,
        v: f64,
    ) -> Result<AppendStats> {
        let window = self.opts.out_of_order_window.as_millis() as i64;
        let span = self.max_span_ms();
        let stats = if s.max_t == i64::MIN || t > s.max_t {
            if !s.head.is_empty()
                && (s.head.len() >= self.opts.chunk_samples.min(chunk::MAX_SAMPLES)
                    || t.saturating_sub(s.head.first_t()) >= span)
            {
                // counted as allocated (a chunk grows by doubling: ~165 bytes in 256)
                let held = s.head.bytes_allocated();
                if sealed.bytes + held <= self.opts.sealed_bytes {
                    sealed.bytes += held;
                    let full = std::mem::take(&mut s.head).into_bytes();
                    sealed.chunks.entry(id).or_default().push(full);
                } else {
                    // the head is kept when the write fails: its batch comes again
                    self.disk.write_chunk(id, s.head.bytes())?;
                    s.head = Chunk::new();
                }
            }
            s.head.append(t, v);
            s.max_t = t;
            AppendStats {
                appended: 1,
                ..Default::default()
            }
        } else if t < s.max_t.saturating_sub(window) {
            AppendStats {
                too_old: 1,
                ..Default::default()
            }
        } else if s.ooo.as_ref().is_some_and(|m| m.contains_key(&t))
            || self.stored(id, &s.head, sealed.of(id), t)?
        {
            AppendStats {
                duplicates: 1,
                ..Default::default()
            }
        } else {
            s.ooo.get_or_insert_default().insert(t, v);
            AppendStats {
                out_of_order: 1,
                ..Default::default()
            }
        };
        if stats.appended + stats.out_of_order > 0 {
            pending.push((id, t, v));
        }
        Ok(stats)
    }

    /// Whether (series, t) is in the head chunk, a chunk sealed but not written, or on disk.
    fn stored(&self, id: SeriesId, head: &Chunk, sealed: &[Vec<u8>], t: i64) -> Result<bool> {
        let in_memory = (!head.is_empty() && t >= head.first_t()).then(|| head.bytes());
        for bytes in sealed.iter().map(Vec::as_slice).chain(in_memory) {
            for s in chunk::iter(bytes).map_err(|source| Error::Chunk { id, source })? {
                let (st, _) = s.map_err(|source| Error::Chunk { id, source })?;
                if st == t {
                    return Ok(true);
                }
                if st > t {
                    break;
                }
            }
        }
        let mut out = Vec::new();
        self.disk
            .read_chunks(id, t, t, self.max_span_ms(), &mut out)?;
        Ok(out.iter().any(|s| s.0 == t))
    }

    /// Whether this is a new (or wiped) store: no series and never marked initialized.
    pub fn is_fresh(&self) -> Result<bool> {
        Ok(!self.disk.initialized()? && self.series_count() == 0)
    }

    /// Marks the store initialized (see [`Store::is_fresh`]).
    pub async fn mark_initialized(&self) -> Result<()> {
        Ok(self.disk.mark_initialized().await?)
    }

    /// Makes every sample appended so far durable (the write-ahead record appended to the WAL file, synced
    /// beside sled's flush). Samples whose record could not be written stay pending for the next commit:
    /// their batch comes again, and finds them in memory already.
    pub async fn commit(&self) -> Result<()> {
        self.commit_taken(self.take_pending()).await
    }

    /// The samples appended since the last commit, for [`Store::commit_taken`]: taken by the thread that
    /// appends, the committing one does not wait for the head's lock.
    pub fn take_pending(&self) -> Pending {
        Pending(std::mem::take(&mut self.write().pending))
    }

    /// Puts samples taken by [`Store::take_pending`] and not logged back, in front of what came meanwhile:
    /// the next commit logs them.
    pub fn restore_pending(&self, pending: Pending) {
        let Pending(mut pending) = pending;
        if pending.is_empty() {
            return;
        }
        let mut head = self.write();
        pending.append(&mut head.pending);
        head.pending = pending;
    }

    /// [`Store::commit`] of the samples taken by [`Store::take_pending`]. (Another commit in between, the
    /// rules' own, may log newer samples of a series first: a replay then finds the older ones out of
    /// order, within the window, and stores them all the same.)
    pub async fn commit_taken(&self, pending: Pending) -> Result<()> {
        let Pending(mut pending) = pending;
        let written = pending
            .chunks(65_536)
            .try_for_each(|part| self.disk.append_wal(&disk::encode_wal(part)));
        if let Err(e) = written {
            // parts written already are logged twice, which replay reads as duplicates
            self.restore_pending(Pending(pending));
            return Err(e.into());
        }
        // the buffer goes back for the next batch (grown from nothing for each, its growth and first
        // touches were ~2 % of ingest), unless samples came in meanwhile or it grew past a few batches
        pending.clear();
        // not waiting for the lock: a busy head (the writer between batches) allocates its own
        if pending.capacity() <= MAX_KEPT_PENDING
            && let Ok(mut head) = self.head.try_write()
            && head.pending.is_empty()
        {
            head.pending = pending;
        }
        self.disk.flush().await?;
        Ok(())
    }

    /// Commits what is pending and closes the store: when this returns, `dir` may be opened again.
    pub async fn close(self) -> Result<()> {
        self.commit().await?;
        self.write_sealed(usize::MAX)?;
        Ok(self.disk.close().await?)
    }

    /// Writes the chunks appends sealed and left in memory ([`Options::sealed_bytes`]) of up to `max`
    /// series; returns how many series still have some. A chunk whose write fails stays in memory (its
    /// samples are in the write-ahead log too, until a checkpoint has written it).
    pub fn write_sealed(&self, max: usize) -> Result<usize> {
        let mut head = self.write();
        write_sealed(&self.disk, &mut head.sealed, max)?;
        Ok(head.sealed.chunks.len())
    }

    /// Bytes (allocated) of the chunks sealed and not written yet.
    pub fn sealed_bytes(&self) -> usize {
        self.read().sealed.bytes
    }

    /// Chunks sealed, kept in memory and written since the store was opened.
    pub fn sealed_written(&self) -> u64 {
        self.read().sealed.written
    }

    /// Writes the sealed chunks still in memory and the out-of-order buffers as chunks, saves the changed
    /// heads and starts a new WAL generation; then drops the older generations. Ingestion waits for the
    /// in-memory part and the start of the next WAL file (the current one synced, the new one created:
    /// milliseconds every 5 minutes).
    pub async fn checkpoint(&self) -> Result<()> {
        let span = self.max_span_ms();
        // the sealed chunks first (the generations about to be dropped hold their samples): a slice at a
        // time, then what was sealed meanwhile under the lock below
        // (bounded: appends may seal more meanwhile)
        let mut rounds = self.read().sealed.chunks.len() / SEALED_SLICE + 1;
        while rounds > 0 && self.write_sealed(SEALED_SLICE)? > 0 {
            rounds -= 1;
            tokio::task::yield_now().await;
        }
        let (heads, generation) = {
            let mut head = self.write();
            write_sealed(&self.disk, &mut head.sealed, usize::MAX)?;
            // every head, written as it is read: the file is whole, so no earlier checkpoint is needed
            let generation = self.disk.rotate_wal()?;
            let mut heads = self.disk.begin_heads(generation)?;
            for (id, s) in head.series.iter_mut() {
                if let Some(ooo) = s.ooo.take() {
                    let mut c = Chunk::new();
                    for (t, v) in *ooo {
                        if !c.is_empty()
                            && (c.len() >= self.opts.chunk_samples.min(chunk::MAX_SAMPLES)
                                || t - c.first_t() >= span)
                        {
                            self.disk.write_chunk(*id, c.bytes())?;
                            c = Chunk::new();
                        }
                        c.append(t, v);
                    }
                    if !c.is_empty() {
                        self.disk.write_chunk(*id, c.bytes())?;
                    }
                }
                heads.add(*id, s.max_t, s.head.bytes())?;
            }
            (heads, generation)
        };
        self.disk.finish_checkpoint(heads, generation).await?;
        tracing::debug!(generation, "checkpoint done");
        Ok(())
    }

    /// Drops data older than `cutoff_ms` in whole day partitions and forgets series whose newest sample is
    /// older; returns (partitions dropped, series forgotten).
    pub fn apply_retention(&self, cutoff_ms: i64) -> Result<(usize, usize)> {
        let dropped = self
            .disk
            .drop_partitions_before(cutoff_ms, self.max_span_ms())?;
        let mut head = self.write();
        let old: Vec<SeriesId> = head
            .series
            .iter()
            .filter(|(_, s)| s.max_t != i64::MIN && s.max_t < cutoff_ms && !s.has_ooo())
            .map(|(id, _)| *id)
            .collect();
        for id in &old {
            self.disk.remove_series(*id)?;
            head.remove_series(*id);
        }
        if !old.is_empty() {
            head.strings.sweep();
        }
        Ok((dropped, old.len()))
    }

    /// Number of series in the index.
    pub fn series_count(&self) -> usize {
        self.read().series.len()
    }

    /// Distinct label names and values the head holds, and their bytes (each kept once however many series
    /// and postings use it).
    pub fn label_strings(&self) -> (usize, usize) {
        let head = self.read();
        (head.strings.len(), head.strings.bytes())
    }

    /// Scrape targets in the scrape cache, and the bytes their last scrapes' spellings and series take.
    pub fn scrape_cache(&self) -> (usize, usize) {
        let head = self.read();
        let bytes = head.scrape_cache.values().map(ScrapeCache::bytes).sum();
        (head.scrape_cache.len(), bytes)
    }

    /// Bytes on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.disk.size_on_disk()
    }

    /// Bytes and samples of all sealed chunks (keys included).
    pub fn chunk_stats(&self) -> Result<(u64, u64)> {
        Ok(self.disk.chunk_stats()?)
    }

    /// The series matching any of the matcher sets (each set: all must match), sorted by labels.
    pub fn select(&self, alternatives: &[Vec<Matcher>]) -> Vec<(SeriesId, Arc<Labels>)> {
        let mut out: Vec<(SeriesId, Arc<Labels>)> = {
            let head = self.read();
            head.matching_any(alternatives)
                .into_iter()
                .filter_map(|id| {
                    let s = head.series.get(&id)?;
                    Some((id, owned_labels(&head.strings, &s.labels)))
                })
                .collect()
        };
        out.sort_by(|a, b| a.1.cmp(&b.1));
        out
    }

    /// The ids of the series matching any of the matcher sets, in id order: what a caller that visits the
    /// series one at a time ([`Store::labels`]) selects, so a query over the whole head does not hold a
    /// copy of every series' labels at once.
    pub fn select_ids(&self, alternatives: &[Vec<Matcher>]) -> Vec<SeriesId> {
        self.read().matching_any(alternatives)
    }

    /// A series' labels (`None` once retention has dropped it).
    pub fn labels(&self, id: SeriesId) -> Option<Arc<Labels>> {
        let head = self.read();
        let s = head.series.get(&id)?;
        Some(owned_labels(&head.strings, &s.labels))
    }

    /// The samples of a series in `[mint, maxt]`, sorted by time, one per timestamp.
    pub fn samples(&self, id: SeriesId, mint: i64, maxt: i64) -> Result<Vec<(i64, f64)>> {
        let mut out = Vec::new();
        self.samples_into(id, mint, maxt, &mut out)?;
        Ok(out)
    }

    /// [`Store::samples`] into a buffer the caller reuses across series (cleared first).
    pub fn samples_into(
        &self,
        id: SeriesId,
        mint: i64,
        maxt: i64,
        out: &mut Vec<(i64, f64)>,
    ) -> Result<()> {
        out.clear();
        // Memory first, disk second: a chunk sealed (or an out-of-order buffer written) in between is then
        // read twice (and deduplicated) rather than missed. Disk samples go first in the result, so the
        // usual case (disk older than the head, no out-of-order data) needs no sort.
        let mut head_part = Vec::new();
        {
            let head = self.read();
            if let Some(s) = head.series.get(&id) {
                // sealed chunks not written yet: older than the head chunk, oldest first
                for bytes in head.sealed.of(id) {
                    chunk::decode_into(bytes, &mut head_part)
                        .map_err(|source| Error::Chunk { id, source })?;
                }
                if !s.head.is_empty() && s.head.last_t() >= mint && s.head.first_t() <= maxt {
                    chunk::decode_into(s.head.bytes(), &mut head_part)
                        .map_err(|source| Error::Chunk { id, source })?;
                }
                if let Some(ooo) = &s.ooo {
                    head_part.extend(ooo.range(mint..=maxt).map(|(t, v)| (*t, *v)));
                }
            }
        }
        self.disk
            .read_chunks(id, mint, maxt, self.max_span_ms(), out)?;
        out.extend(head_part);
        if out.is_sorted_by(|a, b| a.0 < b.0) {
            // The usual case: only the ends (chunks reaching past the range) need trimming.
            let end = out.partition_point(|s| s.0 <= maxt);
            out.truncate(end);
            let start = out.partition_point(|s| s.0 < mint);
            out.drain(..start);
        } else {
            out.retain(|s| s.0 >= mint && s.0 <= maxt);
            out.sort_by_key(|s| s.0);
            out.dedup_by_key(|s| s.0);
        }
        Ok(())
    }

    /// Label names of the series matching `alternatives` (all series when empty).
    pub fn label_names(&self, alternatives: &[Vec<Matcher>]) -> Vec<String> {
        if alternatives.is_empty() {
            return self.read().postings.keys().map(|k| k.to_string()).collect();
        }
        // read in place: copying every matching series' labels first cost ~800 bytes a series
        let head = self.read();
        let names: std::collections::BTreeSet<&str> = head
            .matching_any(alternatives)
            .iter()
            .filter_map(|id| head.series.get(id))
            .flat_map(|s| s.labels.iter().map(|(k, _)| head.strings.str(*k)))
            .collect();
        names.into_iter().map(str::to_string).collect()
    }

    /// Values of label `name` among the series matching `alternatives` (all series when empty).
    pub fn label_values(&self, name: &str, alternatives: &[Vec<Matcher>]) -> Vec<String> {
        if alternatives.is_empty() {
            return self
                .read()
                .postings
                .get(name)
                .map(|m| m.keys().map(|v| v.to_string()).collect())
                .unwrap_or_default();
        }
        let head = self.read();
        let values: std::collections::BTreeSet<&str> = head
            .matching_any(alternatives)
            .iter()
            .filter_map(|id| head.series.get(id))
            .map(|s| head_label(&head.strings, &s.labels, name))
            .filter(|v| !v.is_empty())
            .collect();
        values.into_iter().map(str::to_string).collect()
    }
}

impl Head {
    /// The series with these labels (their hash `hash`).
    fn find(&self, hash: u64, pairs: &[(&str, &str)]) -> Option<SeriesId> {
        let is = |id: &SeriesId| {
            self.series
                .get(id)
                .is_some_and(|s| same_labels(&self.strings, &s.labels, pairs))
        };
        let first = *self.by_hash.get(&hash)?;
        if is(&first) {
            return Some(first);
        }
        self.collisions
            .get(&hash)
            .and_then(|ids| ids.iter().copied().find(is))
    }

    /// Indexes a new series; `pairs` sorted by name.
    fn insert_series(&mut self, id: SeriesId, pairs: &[(&str, &str)]) {
        self.insert_hashed(id, pairs, hash_pairs(pairs.iter().copied()));
    }

    /// [`Head::insert_series`] under a given hash (tests force collisions with it).
    fn insert_hashed(&mut self, id: SeriesId, pairs: &[(&str, &str)], hash: u64) {
        match self.by_hash.entry(hash) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(id);
            }
            std::collections::hash_map::Entry::Occupied(_) => {
                self.collisions.entry(hash).or_default().push(id)
            }
        }
        let labels: HeadLabels = pairs
            .iter()
            .map(|(k, v)| (self.strings.get(k), self.strings.get(v)))
            .collect();
        for (k, v) in labels.iter() {
            let list = self
                .postings
                .entry(self.strings.text(*k).clone())
                .or_default()
                .entry(self.strings.text(*v).clone())
                .or_default();
            // Ids come in increasing order except at open, where the tree iterates in key (= id) order.
            if list.last().is_none_or(|last| *last < id) {
                list.push(id);
            } else if let Err(pos) = list.binary_search(&id) {
                list.insert(pos, id);
            }
        }
        self.series.insert(
            id,
            Series {
                labels,
                hash,
                head: Chunk::new(),
                ooo: None,
                max_t: i64::MIN,
            },
        );
    }

    fn remove_series(&mut self, id: SeriesId) {
        if let Some(chunks) = self.sealed.chunks.remove(&id) {
            self.sealed.bytes -= chunks.iter().map(Vec::capacity).sum::<usize>();
        }
        let Some(s) = self.series.remove(&id) else {
            return;
        };
        let others = self.collisions.get_mut(&s.hash);
        if self.by_hash.get(&s.hash) == Some(&id) {
            // a colliding series takes the freed place
            match others.and_then(|ids| ids.pop()) {
                Some(next) => self.by_hash.insert(s.hash, next),
                None => self.by_hash.remove(&s.hash),
            };
        } else if let Some(ids) = others {
            ids.retain(|x| *x != id);
        }
        if self.collisions.get(&s.hash).is_some_and(Vec::is_empty) {
            self.collisions.remove(&s.hash);
        }
        for (k, v) in s.labels.iter() {
            let (k, v) = (self.strings.str(*k), self.strings.str(*v));
            if let Some(values) = self.postings.get_mut(k) {
                if let Some(list) = values.get_mut(v) {
                    if let Ok(pos) = list.binary_search(&id) {
                        list.remove(pos);
                    }
                    if list.is_empty() {
                        values.remove(v);
                    }
                }
                if values.is_empty() {
                    self.postings.remove(k);
                }
            }
        }
    }

    /// Ids of the series any of the matcher sets match, sorted, each once.
    fn matching_any(&self, alternatives: &[Vec<Matcher>]) -> Vec<SeriesId> {
        let mut ids: Vec<SeriesId> = Vec::new();
        for matchers in alternatives {
            ids.extend(self.matching(matchers));
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Ids of the series all `matchers` match, sorted.
    fn matching(&self, matchers: &[Matcher]) -> Vec<SeriesId> {
        let mut candidates: Option<Vec<SeriesId>> = None;
        for m in matchers {
            if m.is_match("") {
                continue;
            }
            let values = self.postings.get(m.name.as_str());
            let list: Vec<SeriesId> = match &m.op {
                MatchOp::Equal => values
                    .and_then(|v| v.get(m.value.as_str()))
                    .cloned()
                    .unwrap_or_default(),
                _ => {
                    let mut ids: Vec<SeriesId> = values
                        .into_iter()
                        .flat_map(|v| v.iter())
                        .filter(|(val, _)| m.is_match(val))
                        .flat_map(|(_, ids)| ids.iter().copied())
                        .collect();
                    ids.sort_unstable();
                    ids
                }
            };
            candidates = Some(match candidates {
                None => list,
                Some(c) => intersect(&c, &list),
            });
        }
        let candidates = candidates.unwrap_or_else(|| {
            let mut all: Vec<SeriesId> = self.series.keys().copied().collect();
            all.sort_unstable();
            all
        });
        candidates
            .into_iter()
            .filter(|id| {
                self.series.get(id).is_some_and(|s| {
                    matchers
                        .iter()
                        .all(|m| m.is_match(head_label(&self.strings, &s.labels, &m.name)))
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_whose_labels_collide_on_the_hash_are_told_apart() {
        let mut head = Head::default();
        let (a, b, c) = ([("x", "1")], [("x", "2")], [("x", "3")]);
        head.insert_hashed(1, &a, 7);
        head.insert_hashed(2, &b, 7);
        head.insert_hashed(3, &c, 7);
        assert_eq!(
            (head.find(7, &a), head.find(7, &b), head.find(7, &c)),
            (Some(1), Some(2), Some(3))
        );
        assert_eq!(head.find(7, &[("x", "4")]), None);
        // the first one goes: a colliding one takes its place, the others are still found
        head.remove_series(1);
        assert_eq!(
            (head.find(7, &a), head.find(7, &b), head.find(7, &c)),
            (None, Some(2), Some(3))
        );
        head.remove_series(3);
        assert_eq!((head.find(7, &b), head.find(7, &c)), (Some(2), None));
        head.remove_series(2);
        assert!(head.by_hash.is_empty() && head.collisions.is_empty());
        assert!(head.postings.is_empty());
        head.strings.sweep();
        assert_eq!(head.strings.len(), 0, "{:?}", head.strings);
    }

    /// A cached scrape keeps each spelling as what it does not share with the one before, and a walk
    /// beside another scrape finds exactly the positions spelled the same (empty spellings included: the
    /// store does not use those), however the spellings around them changed.
    #[test]
    fn a_walk_finds_exactly_the_positions_spelled_as_last_time() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // spellings of a few shapes: shared starts and ends, one longer than the other, empty
        fn spelling(n: &mut impl FnMut() -> u64) -> Vec<u8> {
            let kind = n() % 6;
            let (v, w) = ((n() % 4) as u8, (n() % 3) as u8);
            match kind {
                0 => Vec::new(),
                1 => vec![b'a'; (n() % 5) as usize],
                // a value in the middle and one at the end
                _ => [
                    &b"\xa4name\x83"[..],
                    &[b'0' + v],
                    b"\xa3job\xa4",
                    &[b'0' + w],
                    b"node",
                ]
                .concat(),
            }
        }
        for round in 0..300 {
            let old: Vec<Vec<u8>> = (0..(next() % 12)).map(|_| spelling(&mut next)).collect();
            let mut new = old.clone();
            for _ in 0..(next() % 4) {
                if new.is_empty() {
                    break;
                }
                let at = (next() as usize) % new.len();
                match next() % 3 {
                    0 => new[at] = spelling(&mut next),
                    1 => new.insert(at, spelling(&mut next)),
                    _ => {
                        new.remove(at);
                    }
                }
            }
            let mut cache = ScrapeCache::default();
            let mut prev: &[u8] = &[];
            for (i, s) in old.iter().enumerate() {
                cache.push(prev, s, i as SeriesId, i as u32);
                prev = s;
            }
            let mut walk = Walk::new(&cache);
            let mut prev: &[u8] = &[];
            for (i, s) in new.iter().enumerate() {
                let want = old.get(i) == Some(s);
                let got = walk.same(i, prev, s).map(|r| r.id);
                assert_eq!(
                    got,
                    want.then_some(i as SeriesId),
                    "round {round} position {i}: {old:?} → {new:?}"
                );
                prev = s;
            }
            // the first n positions of a cache are the cache of the first n spellings
            let n = (next() as usize) % (old.len() + 1);
            let first = cache.first(n);
            let mut walk = Walk::new(&first);
            let mut prev: &[u8] = &[];
            for (i, s) in old.iter().enumerate() {
                let got = walk.same(i, prev, s).is_some();
                assert_eq!(got, i < n, "round {round}: first {n} of {old:?}");
                prev = s;
            }
        }
    }

    /// A scrape as the agent sends it, decoded as the ingester decodes it.
    fn scrape(job: &str, samples: &[(&str, &str, i64, f64)]) -> ScrapeBatch {
        let batch = multipilot_schemas::payload::MetricBatch {
            job: job.into(),
            instance: "i".into(),
            families: Vec::new(),
            samples: samples
                .iter()
                .map(|&(name, pod, t, v)| Sample::new(name, &[("pod", pod)], v, t))
                .collect(),
            rejected_lines: 0,
        };
        let env =
            multipilot_schemas::envelope::Envelope::new("c", "a", chrono::Utc::now(), 1, batch);
        let body = multipilot_schemas::encode(&env).expect("encodes");
        crate::batch::fast::envelope(&body)
            .expect("the agent's form")
            .payload
    }

    /// The samples of the series `name{pod}` (exactly one such series).
    fn stored(store: &Store, name: &str, pod: &str) -> Vec<(i64, f64)> {
        let found = store.select(&[vec![
            Matcher::new(MatchOp::Equal, "__name__", name),
            Matcher::new(MatchOp::Equal, "pod", pod),
        ]]);
        assert_eq!(found.len(), 1, "{name}{{pod={pod}}}");
        store
            .samples(found[0].0, i64::MIN, i64::MAX)
            .expect("reads")
    }

    /// The scrape cache finds a sample's series by its spelling at its position; whatever changes between
    /// scrapes (a series in another place, one more or fewer, a series removed by retention, another series
    /// moved into its slot) still lands every sample in its own series.
    #[tokio::test]
    async fn the_scrape_cache_follows_what_changes_between_scrapes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path(), Options::default()).expect("opens");
        let t = 1_750_000_000_000;
        let m = 60_000;
        let x = |samples: &[(&str, &str, i64, f64)]| {
            store
                .append_scrape("c", &scrape("x", samples))
                .expect("appends")
        };
        let y = |samples: &[(&str, &str, i64, f64)]| {
            store
                .append_scrape("c", &scrape("y", samples))
                .expect("appends")
        };
        x(&[("a", "1", t, 1.0), ("b", "1", t, 2.0)]);
        y(&[("c", "1", t, 3.0)]);
        // the same spellings: every sample found by the cache
        let st = x(&[("a", "1", t + m, 1.5), ("b", "1", t, 2.0)]);
        assert_eq!((st.appended, st.duplicates, st.cached), (1, 1, 2));
        assert_eq!(store.scrape_cache().0, 2);
        // b's position now holds d, and one more sample at the end
        let st = x(&[
            ("a", "1", t + 2 * m, 1.7),
            ("d", "1", t + 2 * m, 4.0),
            ("b", "1", t + 2 * m, 2.5),
        ]);
        assert_eq!(st.cached, 1);
        assert_eq!(
            x(&[
                ("a", "1", t + 2 * m + 1, 1.8),
                ("d", "1", t + 3 * m, 4.1),
                ("b", "1", t + 3 * m, 2.6)
            ])
            .cached,
            3
        );
        // fewer samples
        assert_eq!(x(&[("a", "1", t + 3 * m, 1.9)]).cached, 1);
        assert_eq!(
            x(&[("a", "1", t + 4 * m, 2.1), ("b", "1", t + 3 * m, 2.6)]).cached,
            1
        );
        assert_eq!(stored(&store, "a", "1").len(), 6);
        assert_eq!(
            stored(&store, "b", "1"),
            [(t, 2.0), (t + 2 * m, 2.5), (t + 3 * m, 2.6)]
        );
        assert_eq!(
            stored(&store, "d", "1"),
            [(t + 2 * m, 4.0), (t + 3 * m, 4.1)]
        );
        // retention removes b (its newest sample is old) while x's cache still names it, and another
        // series takes b's slot
        assert_eq!(
            x(&[("a", "1", t + 9 * m, 3.0), ("b", "1", t + 3 * m, 2.6)]).cached,
            2
        );
        x(&[("a", "1", t + 10 * m, 3.1), ("b", "1", t + 3 * m, 2.6)]);
        y(&[("c", "1", t + 10 * m, 3.3)]);
        let (_, removed) = store.apply_retention(t + 8 * m).expect("retention");
        // b, and d (not scraped since)
        assert_eq!(removed, 2);
        assert!(
            store
                .select(&[vec![Matcher::new(MatchOp::Equal, "__name__", "b")]])
                .is_empty()
        );
        // b's series is gone: found anew; c's slot moved: found by its id
        assert_eq!(
            x(&[("a", "1", t + 11 * m, 3.2), ("b", "1", t + 11 * m, 5.0)]).cached,
            1
        );
        assert_eq!(y(&[("c", "1", t + 11 * m, 3.4)]).cached, 1);
        // and both remembered anew: the next scrapes find them by their spelling and slot
        assert_eq!(
            x(&[("a", "1", t + 12 * m, 3.3), ("b", "1", t + 12 * m, 5.1)]).cached,
            2
        );
        {
            let head = store.read();
            for cache in head.scrape_cache.values() {
                for row in &cache.rows {
                    assert_eq!(
                        head.series.slots.get(&row.id).map(|&s| s as u32),
                        Some(row.slot)
                    );
                }
            }
        }
        assert_eq!(
            stored(&store, "b", "1"),
            [(t + 11 * m, 5.0), (t + 12 * m, 5.1)]
        );
        assert_eq!(
            stored(&store, "c", "1"),
            [(t, 3.0), (t + 10 * m, 3.3), (t + 11 * m, 3.4)]
        );
        assert_eq!(stored(&store, "a", "1").last(), Some(&(t + 12 * m, 3.3)));
        assert_eq!(store.series_count(), 3);
    }

    /// Two targets whose keys collide (an agent picks its job and instance) do not share a cache: the
    /// second cluster's samples never land in the first one's series.
    #[tokio::test]
    async fn a_target_under_another_targets_key_starts_its_own_cache() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path(), Options::default()).expect("opens");
        let t = 1_750_000_000_000;
        let one = [("a", "1", t, 1.0)];
        store
            .append_scrape("c1", &scrape("x", &one))
            .expect("appends");
        // as if c2's target hashed to c1's key
        {
            let mut head = store.write();
            let (key1, _) = scrape_target("c1", "x", "i");
            let (key2, _) = scrape_target("c2", "x", "i");
            let cache = head.scrape_cache.remove(&key1).expect("cached");
            head.scrape_cache.insert(key2, cache);
        }
        let st = store
            .append_scrape("c2", &scrape("x", &[("a", "1", t + 1, 2.0)]))
            .expect("appends");
        assert_eq!((st.appended, st.cached), (1, 0));
        let found = store.select(&[vec![Matcher::new(MatchOp::Equal, "__name__", "a")]]);
        assert_eq!(found.len(), 2, "a series of its own for c2");
        for (id, labels) in found {
            let cluster = labels.iter().find(|(k, _)| k == "cluster");
            let want = match cluster.map(|(_, v)| v.as_str()) {
                Some("c1") => vec![(t, 1.0)],
                _ => vec![(t + 1, 2.0)],
            };
            assert_eq!(store.samples(id, i64::MIN, i64::MAX).expect("reads"), want);
        }
    }

    #[test]
    fn the_series_table_finds_every_series_after_removals_move_others() {
        let series = |max_t| Series {
            labels: Box::new([]),
            hash: 0,
            head: Chunk::new(),
            ooo: None,
            max_t,
        };
        let mut table = SeriesTable::default();
        for id in [10, 11, 12, 13] {
            table.insert(id, series(id as i64));
        }
        assert_eq!(table.remove(&10).map(|s| s.max_t), Some(10));
        assert!(table.remove(&10).is_none());
        table.remove(&12);
        table.insert(11, series(111));
        table.insert(14, series(14));
        let mut seen: Vec<(SeriesId, i64)> = table.iter().map(|(id, s)| (*id, s.max_t)).collect();
        seen.sort();
        assert_eq!(seen, [(11, 111), (13, 13), (14, 14)]);
        for (id, t) in seen {
            assert_eq!(table.get(&id).map(|s| s.max_t), Some(t));
        }
        assert_eq!(table.len(), 3);
        assert!(table.get(&12).is_none() && table.get_mut(&10).is_none());
    }

    #[test]
    fn a_label_strings_number_freed_by_retention_serves_a_new_string_without_touching_live_series()
    {
        let mut head = Head::default();
        let (a, b) = (
            [("__name__", "up"), ("pod", "web-1")],
            [("__name__", "up"), ("pod", "web-2")],
        );
        head.insert_series(1, &a);
        head.insert_series(2, &b);
        assert_eq!(head.strings.len(), 5);
        head.remove_series(1);
        head.strings.sweep();
        // only "web-1" went: "__name__", "up" and "pod" are series 2's too
        assert_eq!(head.strings.len(), 4, "{:?}", head.strings);
        let c = [("__name__", "up"), ("pod", "web-3")];
        head.insert_series(3, &c);
        assert_eq!(
            head.strings.texts.len(),
            5,
            "the freed number is given again"
        );
        let labels =
            |id| owned_labels(&head.strings, &head.series.get(&id).expect("series").labels);
        let own = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            (labels(2), labels(3)),
            (Arc::new(own(&b)), Arc::new(own(&c)))
        );
        let h = |p: &[(&str, &str)]| hash_pairs(p.iter().copied());
        assert_eq!(
            (head.find(h(&b), &b), head.find(h(&c), &c)),
            (Some(2), Some(3))
        );
        assert_eq!(head.find(h(&a), &a), None);
        let pods: Vec<&str> = head.postings["pod"].keys().map(|v| &**v).collect();
        assert_eq!(pods, ["web-2", "web-3"]);
    }
}
