//! The on-disk layout, on sled. Everything the rest of the crate knows about sled is in this file, so the
//! embedded store can change without touching the head, the index or the query engine.
//!
//! Trees:
//! - `series`: series id (`u64` BE) → its labels (JSON). Written when a series is first seen.
//! - `chunks-<day>`: one tree per UTC day of chunk start time; key = series id (`u64` BE) + chunk start
//!   (`i64` BE, sign-flipped so keys sort by time); value = an encoded [`crate::chunk`]. Retention drops
//!   whole trees, which frees their pages in bulk without touching the trees that are written.
//! - `wal-<generation>`: the write-ahead log of stores written before the WAL files (below): key = sequence
//!   (`u64` BE), value = the samples of one commit. Replayed and dropped as the files are.
//! - `heads`: series id → the bytes of its open (head) chunk, as stores before the heads file kept them
//!   (read when there is no heads file; emptied by the first checkpoint that writes one).
//!
//! Beside sled's files, the write-ahead log is one file per generation, `wal-<generation>.log` (`WalFile`):
//! each commit's samples ([`encode_wal`]) appended as one framed record and synced with sled's flush. A
//! checkpoint starts a new generation and deletes the older files once the heads it snapshotted are
//! durable. (Kept in sled, each commit's record of ~1 MB went through sled's log and a blob file of its own:
//! 8 % of the TSDB's ingest samples in the 2026-12-06 profile, against one `write` here.) A failed sync of
//! the file fails every later flush until the store is opened again: the kernel may drop the pages it could
//! not write and report the next sync as a success, so nothing written before can be called durable.
//!
//! `heads.ckpt` holds every series' open chunk at the last checkpoint ([`HeadsWriter`]):
//! a plain file written sequentially, then synced and renamed into place, so a checkpoint costs a buffer
//! rather than a new version of 100k sled records in sled's log (which held ~300 MiB for a 100k-series
//! checkpoint).
//! - `meta`: `wal_from` = the first WAL generation recovery must replay; `initialized` = written once the
//!   role has set up its consumer for this store (its absence on an empty store means a new or wiped data
//!   directory, which the role rebuilds from the stream).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use crate::chunk;
use crate::store::{Labels, SeriesId};

/// Disk failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// sled failed (I/O error or corruption): retryable for ingestion, fatal at open.
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// The store was not released in time after it was closed.
    #[error(transparent)]
    Close(#[from] multipilot_runtime::store::Error),
    /// Reading or writing the heads file failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was done.
        what: &'static str,
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A stored record could not be decoded.
    #[error("corrupt {what}: {detail}")]
    Corrupt {
        /// Which record.
        what: &'static str,
        /// Why.
        detail: String,
    },
}

/// Disk result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Milliseconds in one chunk partition (one tree).
pub const PARTITION_MS: i64 = 86_400_000;

const WAL_PREFIX: &str = "wal-";
const WAL_SUFFIX: &str = ".log";
const HEADS_FILE: &str = "heads.ckpt";
const HEADS_MAGIC: &[u8; 8] = b"MPHEADS1";
const CHUNK_PREFIX: &str = "chunks-";

fn sortable(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

fn chunk_key(id: SeriesId, start: i64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&id.to_be_bytes());
    k[8..].copy_from_slice(&sortable(start));
    k
}

fn partition_of(t: i64) -> i64 {
    t.div_euclid(PARTITION_MS)
}

fn corrupt(what: &'static str, detail: impl ToString) -> Error {
    Error::Corrupt {
        what,
        detail: detail.to_string(),
    }
}

fn u64_of(bytes: &[u8], what: &'static str) -> Result<u64> {
    let arr: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt(what, "short key"))?;
    Ok(u64::from_be_bytes(arr))
}

/// The current WAL generation's file: each record is its length (`u32` BE), its CRC-32 (`u32` BE) and its
/// bytes. A crash in the middle of a write leaves a torn last record, which recovery skips (it was never
/// acknowledged: a commit is acknowledged only after the file is synced). A write that fails is cut off
/// and the next one starts where it started, so a failed write never hides the records after it.
#[derive(Debug)]
struct WalFile {
    generation: u64,
    file: std::fs::File,
    path: PathBuf,
    /// Bytes of whole records in the file (a failed write is cut back to it).
    len: u64,
    /// A failed write could not be cut off: the next record goes to a new file.
    broken: bool,
    /// Records appended, and how many of them are known synced.
    written: u64,
    synced: u64,
}

impl WalFile {
    fn create(dir: &Path, generation: u64) -> Result<Self> {
        let path = wal_path(dir, generation);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .map_err(io_error("creating", &path))?;
        // the new file's name is durable once its directory is synced
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_error("syncing", dir))?;
        Ok(WalFile {
            generation,
            file,
            path,
            len: 0,
            broken: false,
            written: 0,
            synced: 0,
        })
    }

    fn append(&mut self, record: &[u8]) -> Result<()> {
        use std::io::Write as _;
        let len = u32::try_from(record.len()).map_err(|e| corrupt("wal record", e))?;
        let mut header = [0u8; 8];
        header[..4].copy_from_slice(&len.to_be_bytes());
        header[4..].copy_from_slice(&crc32fast::hash(record).to_be_bytes());
        let written = self
            .file
            .write_all(&header)
            .and_then(|()| self.file.write_all(record));
        if let Err(source) = written {
            self.cut_back();
            return Err(Error::Io {
                what: "writing",
                path: self.path.display().to_string(),
                source,
            });
        }
        self.len += 8 + record.len() as u64;
        self.written += 1;
        Ok(())
    }

    /// Cuts off what a failed write left of its record (it would hide the records after it from recovery),
    /// and puts the write position back where that write started (cutting the file does not move it).
    fn cut_back(&mut self) {
        use std::io::Seek as _;
        let cut = self
            .file
            .set_len(self.len)
            .and_then(|()| self.file.seek(std::io::SeekFrom::Start(self.len)));
        if cut.is_err() {
            tracing::warn!(path = %self.path.display(), "could not cut a failed WAL write; the next commit starts a new file");
            self.broken = true;
        }
    }

    /// Syncs what was appended and not synced yet (before the file is replaced by another).
    fn sync(&mut self) -> Result<()> {
        if self.written > self.synced {
            self.file
                .sync_data()
                .map_err(io_error("syncing", &self.path))?;
            self.synced = self.written;
        }
        Ok(())
    }
}

fn wal_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("{WAL_PREFIX}{generation:016x}{WAL_SUFFIX}"))
}

fn sync_failed() -> Error {
    Error::Io {
        what: "syncing",
        path: "the write-ahead log".to_string(),
        source: std::io::Error::other(
            "a sync of the WAL failed earlier: what was written since the last good sync may be lost, so no commit can be made durable until the TSDB is restarted (it then replays what is durable, and the stream redelivers the rest)",
        ),
    }
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.display().to_string();
    move |source| Error::Io { what, path, source }
}

/// The WAL files in `dir`, by generation.
fn wal_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error("listing", dir))? {
        let entry = entry.map_err(io_error("listing", dir))?;
        let name = entry.file_name();
        let Some(hex) = name
            .to_str()
            .and_then(|n| n.strip_prefix(WAL_PREFIX)?.strip_suffix(WAL_SUFFIX))
        else {
            continue;
        };
        if let Ok(g) = u64::from_str_radix(hex, 16) {
            out.push((g, entry.path()));
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The whole records of a WAL file (see [`WalFile`]), oldest first; a torn or damaged tail is skipped with
/// a warning.
fn read_wal_file(path: &Path) -> Result<Vec<Vec<u8>>> {
    let bytes = std::fs::read(path).map_err(io_error("reading", path))?;
    let mut out = Vec::new();
    let mut rest = bytes.as_slice();
    while !rest.is_empty() {
        let frame = rest.split_first_chunk::<8>().and_then(|(h, body)| {
            let len = u32::from_be_bytes(h[..4].try_into().ok()?) as usize;
            let crc = u32::from_be_bytes(h[4..].try_into().ok()?);
            let record = body.get(..len)?;
            // no empty record is written: zeros are a tail a crash left (a file extended, not written)
            (len > 0 && crc32fast::hash(record) == crc).then_some((record, &body[len..]))
        });
        let Some((record, after)) = frame else {
            tracing::warn!(
                path = %path.display(),
                offset = bytes.len() - rest.len(),
                skipped = rest.len(),
                "the WAL file ends in a torn or damaged record (a write the crash interrupted: it was never acknowledged); replaying what is before it"
            );
            break;
        };
        out.push(record.to_vec());
        rest = after;
    }
    Ok(out)
}

/// The sled database with the crate's layout.
#[derive(Debug)]
pub struct Disk {
    dir: PathBuf,
    db: sled::Db,
    series: sled::Tree,
    heads: sled::Tree,
    meta: sled::Tree,
    partitions: RwLock<BTreeMap<i64, sled::Tree>>,
    wal: Mutex<WalFile>,
    /// A WAL file failed to sync: nothing appended before can be called durable (see the module docs).
    sync_failed: std::sync::atomic::AtomicBool,
}

impl Disk {
    /// Opens (or creates) the store in `dir` with a page cache of `cache_bytes`.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Self> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .mode(sled::Mode::HighThroughput)
            .open()?;
        let series = db.open_tree("series")?;
        let heads = db.open_tree("heads")?;
        let meta = db.open_tree("meta")?;
        let mut partitions = BTreeMap::new();
        let mut max_gen = None;
        for name in db.tree_names() {
            let name = String::from_utf8_lossy(&name).into_owned();
            if let Some(hex) = name.strip_prefix(CHUNK_PREFIX) {
                let p = u64::from_str_radix(hex, 16).map_err(|e| corrupt("tree name", e))? as i64;
                partitions.insert(p, db.open_tree(&name)?);
            } else if let Some(hex) = name.strip_prefix(WAL_PREFIX) {
                let g = u64::from_str_radix(hex, 16).map_err(|e| corrupt("tree name", e))?;
                max_gen = max_gen.max(Some(g));
            }
        }
        max_gen = max_gen.max(wal_files(dir)?.last().map(|(g, _)| *g));
        let generation = max_gen.map(|g| g + 1).unwrap_or(0);
        // a heads file a crash left half-written: the last finished one (or the WAL) stands
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(HEADS_FILE) && name.ends_with(".tmp") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let wal = WalFile::create(dir, generation)?;
        Ok(Disk {
            dir: dir.to_path_buf(),
            db,
            series,
            heads,
            meta,
            partitions: RwLock::new(partitions),
            wal: Mutex::new(wal),
            sync_failed: Default::default(),
        })
    }

    /// Flushes and closes the store: when this returns, sled's lock is released and `dir` may be opened
    /// again, in this process or another.
    pub async fn close(self) -> Result<()> {
        self.db.flush_async().await?;
        let dir = self.dir.clone();
        drop(self);
        multipilot_runtime::store::wait_released(&dir, std::time::Duration::from_secs(30)).await?;
        Ok(())
    }

    /// Whether the `initialized` marker is written.
    pub fn initialized(&self) -> Result<bool> {
        Ok(self.meta.contains_key("initialized")?)
    }

    /// Writes the `initialized` marker and flushes.
    pub async fn mark_initialized(&self) -> Result<()> {
        self.meta.insert("initialized", &[1u8])?;
        self.db.flush_async().await?;
        Ok(())
    }

    /// Every stored series.
    pub fn load_series(&self) -> Result<Vec<(SeriesId, Labels)>> {
        let mut out = Vec::new();
        for kv in self.series.iter() {
            let (k, v) = kv?;
            let id = u64_of(&k, "series key")?;
            let labels: Labels = serde_json::from_slice(&v).map_err(|e| corrupt("series", e))?;
            out.push((id, labels));
        }
        Ok(out)
    }

    /// Records a new series.
    pub fn put_series(&self, id: SeriesId, labels: &[(&str, &str)]) -> Result<()> {
        let v = serde_json::to_vec(labels).map_err(|e| corrupt("series", e))?;
        self.series.insert(id.to_be_bytes(), v)?;
        Ok(())
    }

    /// Forgets a series (retention removed all its data).
    pub fn remove_series(&self, id: SeriesId) -> Result<()> {
        self.series.remove(id.to_be_bytes())?;
        self.heads.remove(id.to_be_bytes())?;
        Ok(())
    }

    /// The head chunks saved at the last checkpoint: series id → `max_t` (`i64` BE) + the chunk's bytes.
    pub fn load_heads(&self) -> Result<Vec<(SeriesId, Vec<u8>)>> {
        let path = self.dir.join(HEADS_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => return decode_heads(&bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(Error::Io {
                    what: "reading",
                    path: path.display().to_string(),
                    source,
                });
            }
        }
        // a store written before the heads file
        let mut out = Vec::new();
        for kv in self.heads.iter() {
            let (k, v) = kv?;
            out.push((u64_of(&k, "head key")?, v.to_vec()));
        }
        Ok(out)
    }

    fn partition(&self, p: i64) -> Result<sled::Tree> {
        if let Some(t) = self
            .partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&p)
        {
            return Ok(t.clone());
        }
        let mut parts = self.partitions.write().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = parts.get(&p) {
            return Ok(t.clone());
        }
        let tree = self
            .db
            .open_tree(format!("{CHUNK_PREFIX}{:016x}", p as u64))?;
        parts.insert(p, tree.clone());
        Ok(tree)
    }

    /// Stores a sealed chunk. If a chunk with the same series and start is stored already (a replay after a
    /// crash, or out-of-order samples), the two are merged: a sample is never lost by an overwrite.
    pub fn write_chunk(&self, id: SeriesId, bytes: &[u8]) -> Result<()> {
        let mut it = chunk::iter(bytes).map_err(|e| corrupt("chunk", e))?;
        let Some(first) = it.next() else {
            return Ok(());
        };
        let start = first.map_err(|e| corrupt("chunk", e))?.0;
        let tree = self.partition(partition_of(start))?;
        let key = chunk_key(id, start);
        // one look-up in the usual case (no chunk there yet: stored), not a get before the insert
        let stored = tree.compare_and_swap(key, None::<&[u8]>, Some(bytes))?;
        match stored.err().and_then(|e| e.current) {
            None => {}
            Some(old) if old.as_ref() == bytes => {}
            Some(old) => {
                let merged = merge_chunks(&old, bytes)?;
                for c in merged {
                    let start = chunk::iter(&c)
                        .ok()
                        .and_then(|mut i| i.next())
                        .and_then(|r| r.ok())
                        .map(|s| s.0)
                        .unwrap_or(start);
                    self.partition(partition_of(start))?
                        .insert(chunk_key(id, start), c)?;
                }
            }
        }
        Ok(())
    }

    /// Appends the samples of chunks of `id` that may hold samples in `[mint, maxt]` to `out` (unfiltered:
    /// the caller trims). A chunk never spans more than `max_span` ms.
    pub fn read_chunks(
        &self,
        id: SeriesId,
        mint: i64,
        maxt: i64,
        max_span: i64,
        out: &mut Vec<(i64, f64)>,
    ) -> Result<()> {
        let from = mint.saturating_sub(max_span);
        let trees: Vec<sled::Tree> = self
            .partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .range(partition_of(from)..=partition_of(maxt))
            .map(|(_, t)| t.clone())
            .collect();
        for tree in trees {
            for kv in tree.range(chunk_key(id, from)..=chunk_key(id, maxt)) {
                let (_, v) = kv?;
                chunk::decode_into(&v, out).map_err(|e| corrupt("chunk", e))?;
            }
        }
        Ok(())
    }

    /// Adds one commit's samples to the current WAL generation (durable after [`Disk::flush`]).
    pub fn append_wal(&self, record: &[u8]) -> Result<()> {
        let mut wal = self.wal.lock().unwrap_or_else(|e| e.into_inner());
        if wal.broken {
            // a failed write that could not be cut off ends the file; what other commits appended to it
            // before is made durable first (recovery reads up to the failed write)
            self.replace_wal(&mut wal)?;
        }
        wal.append(record)
    }

    /// `synced`, remembering a failure: every later flush fails (see the module docs).
    fn noting_sync_failure(&self, synced: Result<()>) -> Result<()> {
        if synced.is_err() {
            self.sync_failed
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        synced
    }

    /// Starts the next WAL generation's file once the current one's records are synced (a commit may have
    /// appended to it and not flushed yet: its flush syncs the new file only); returns its generation. On a
    /// failed sync the current file stays, and every later flush fails.
    fn replace_wal(&self, wal: &mut WalFile) -> Result<u64> {
        self.noting_sync_failure(wal.sync())?;
        let generation = wal.generation + 1;
        *wal = WalFile::create(&self.dir, generation)?;
        Ok(generation)
    }

    /// The WAL records recovery must replay, oldest first; drops generations a finished checkpoint made
    /// obsolete.
    pub fn wal_records(&self) -> Result<Vec<Vec<u8>>> {
        let from = match self.meta.get("wal_from")? {
            Some(v) => u64_of(&v, "wal_from")?,
            None => 0,
        };
        let current = self
            .wal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .generation;
        let mut out = Vec::new();
        // the trees of a store written before the files hold the older generations
        for g in self.wal_trees() {
            let name = format!("{WAL_PREFIX}{g:016x}");
            if g < from {
                self.db.drop_tree(name)?;
                continue;
            }
            let tree = self.db.open_tree(name)?;
            for kv in tree.iter() {
                out.push(kv?.1.to_vec());
            }
        }
        for (g, path) in wal_files(&self.dir)? {
            if g == current {
                continue;
            }
            if g < from {
                std::fs::remove_file(&path).map_err(io_error("removing", &path))?;
                continue;
            }
            out.extend(read_wal_file(&path)?);
        }
        Ok(out)
    }

    /// The generations of the WAL trees a store written before the WAL files holds, oldest first.
    fn wal_trees(&self) -> Vec<u64> {
        let mut gens: Vec<u64> = self
            .db
            .tree_names()
            .iter()
            .filter_map(|n| {
                let n = std::str::from_utf8(n).ok()?;
                u64::from_str_radix(n.strip_prefix(WAL_PREFIX)?, 16).ok()
            })
            .collect();
        gens.sort_unstable();
        gens
    }

    /// Starts a new WAL generation; returns its number. Records appended from now on go to it.
    pub fn rotate_wal(&self) -> Result<u64> {
        let mut wal = self.wal.lock().unwrap_or_else(|e| e.into_inner());
        self.replace_wal(&mut wal)
    }

    /// First half of a checkpoint: a heads file for WAL `generation`, to fill with every series' head.
    pub fn begin_heads(&self, generation: u64) -> Result<HeadsWriter> {
        let tmp = self.dir.join(format!("{HEADS_FILE}.{generation:016x}.tmp"));
        let file = std::fs::File::create(&tmp).map_err(|source| Error::Io {
            what: "creating",
            path: tmp.display().to_string(),
            source,
        })?;
        let mut w = HeadsWriter {
            out: std::io::BufWriter::with_capacity(1 << 20, file),
            crc: crc32fast::Hasher::new(),
            tmp,
        };
        w.write(HEADS_MAGIC)?;
        Ok(w)
    }

    /// Second half of a checkpoint: makes the heads file durable and puts it in place, then marks
    /// `generation` as the first to replay and drops the older WAL generations. A crash before the rename
    /// leaves the previous heads file and `wal_from`; one after it leaves newer heads with the older
    /// `wal_from`, whose replay finds its samples stored already.
    pub async fn finish_checkpoint(&self, heads: HeadsWriter, generation: u64) -> Result<()> {
        let path = self.dir.join(HEADS_FILE);
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || heads.finish(&path, &dir))
            .await
            .map_err(|e| corrupt("heads file", e))??;
        self.meta.insert("wal_from", &generation.to_be_bytes())?;
        self.db.flush_async().await?;
        for g in self.wal_trees() {
            if g < generation {
                self.db.drop_tree(format!("{WAL_PREFIX}{g:016x}"))?;
            }
        }
        for (g, path) in wal_files(&self.dir)? {
            if g < generation {
                std::fs::remove_file(&path).map_err(io_error("removing", &path))?;
            }
        }
        if !self.heads.is_empty() {
            // the heads of a store written before the heads file: superseded now
            self.heads.clear()?;
        }
        Ok(())
    }

    /// Makes everything written so far durable.
    pub async fn flush(&self) -> Result<()> {
        if self.sync_failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(sync_failed());
        }
        // the WAL file synced beside sled's flush, not after it
        let wal = {
            let wal = self.wal.lock().unwrap_or_else(|e| e.into_inner());
            match wal.written > wal.synced {
                true => {
                    let file = wal
                        .file
                        .try_clone()
                        .map_err(io_error("opening", &wal.path))?;
                    Some((file, wal.path.clone(), wal.generation, wal.written))
                }
                false => None,
            }
        };
        let sync = async {
            let Some((file, path, generation, written)) = wal else {
                return Ok(());
            };
            let synced = tokio::task::spawn_blocking(move || {
                file.sync_data().map_err(io_error("syncing", &path))
            })
            .await
            .map_err(|e| corrupt("wal sync task", e))
            .and_then(|r| r);
            self.noting_sync_failure(synced)?;
            let mut wal = self.wal.lock().unwrap_or_else(|e| e.into_inner());
            if wal.generation == generation {
                wal.synced = wal.synced.max(written);
            }
            Ok(())
        };
        let (flushed, synced) = tokio::join!(self.db.flush_async(), sync);
        flushed?;
        synced
    }

    /// Drops every chunk partition whose chunks all end before `cutoff` (ms); returns how many.
    pub fn drop_partitions_before(&self, cutoff: i64, max_span: i64) -> Result<usize> {
        let old: Vec<i64> = {
            let parts = self.partitions.read().unwrap_or_else(|e| e.into_inner());
            parts
                .keys()
                .copied()
                .filter(|p| {
                    p.saturating_add(1)
                        .saturating_mul(PARTITION_MS)
                        .saturating_add(max_span)
                        <= cutoff
                })
                .collect()
        };
        for p in &old {
            self.partitions
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(p);
            self.db
                .drop_tree(format!("{CHUNK_PREFIX}{:016x}", *p as u64))?;
        }
        Ok(old.len())
    }

    /// Bytes sled and the WAL files use on disk.
    pub fn size_on_disk(&self) -> u64 {
        let wal: u64 = wal_files(&self.dir)
            .unwrap_or_default()
            .iter()
            .filter_map(|(_, path)| std::fs::metadata(path).ok())
            .map(|m| m.len())
            .sum();
        self.db.size_on_disk().unwrap_or(0) + wal
    }

    /// Encoded bytes of every stored chunk, and the number of samples they hold (for size accounting).
    pub fn chunk_stats(&self) -> Result<(u64, u64)> {
        let trees: Vec<sled::Tree> = self
            .partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let (mut bytes, mut samples) = (0u64, 0u64);
        for t in trees {
            for kv in t.iter() {
                let (k, v) = kv?;
                bytes += (k.len() + v.len()) as u64;
                if v.len() >= 2 {
                    samples += u16::from_be_bytes([v[0], v[1]]) as u64;
                }
            }
        }
        Ok((bytes, samples))
    }
}

/// Merges two chunks of one series (union by timestamp; `a` wins on equal timestamps) into chunks of at most
/// [`chunk::MAX_SAMPLES`].
/// A heads file being written: `HEADS_MAGIC`, then per series its id (`u64` BE), the length of what
/// follows (`u32` BE), `max_t` (`i64` BE) and the open chunk's bytes; last, the CRC-32 of all before it.
#[derive(Debug)]
pub struct HeadsWriter {
    out: std::io::BufWriter<std::fs::File>,
    crc: crc32fast::Hasher,
    tmp: PathBuf,
}

impl HeadsWriter {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        use std::io::Write as _;
        self.crc.update(bytes);
        self.out.write_all(bytes).map_err(|source| Error::Io {
            what: "writing",
            path: self.tmp.display().to_string(),
            source,
        })
    }

    /// Adds one series' head.
    pub fn add(&mut self, id: SeriesId, max_t: i64, chunk: &[u8]) -> Result<()> {
        let len = u32::try_from(8 + chunk.len()).map_err(|e| corrupt("head chunk", e))?;
        self.write(&id.to_be_bytes())?;
        self.write(&len.to_be_bytes())?;
        self.write(&max_t.to_be_bytes())?;
        self.write(chunk)
    }

    fn finish(self, path: &Path, dir: &Path) -> Result<()> {
        use std::io::Write as _;
        let io = io_error;
        let HeadsWriter { mut out, crc, tmp } = self;
        out.write_all(&crc.finalize().to_be_bytes())
            .map_err(io("writing", &tmp))?;
        let file = out
            .into_inner()
            .map_err(|e| e.into_error())
            .map_err(io("writing", &tmp))?;
        file.sync_all().map_err(io("syncing", &tmp))?;
        drop(file);
        std::fs::rename(&tmp, path).map_err(io("renaming", &tmp))?;
        // the rename itself is durable once the directory is synced
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io("syncing", dir))
    }
}

/// Reads a heads file (see [`HeadsWriter`]).
fn decode_heads(bytes: &[u8]) -> Result<Vec<(SeriesId, Vec<u8>)>> {
    let bad = |detail: &str| corrupt("heads file", detail);
    let Some((body, crc)) = bytes.split_last_chunk::<4>() else {
        return Err(bad("shorter than its checksum"));
    };
    if crc32fast::hash(body) != u32::from_be_bytes(*crc) {
        return Err(bad("checksum mismatch"));
    }
    let mut rest = body
        .strip_prefix(HEADS_MAGIC.as_slice())
        .ok_or_else(|| bad("not a heads file"))?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (Some((id, r)), true) = (rest.split_first_chunk::<8>(), rest.len() >= 12) else {
            return Err(bad("truncated entry"));
        };
        let (len, r) = r
            .split_first_chunk::<4>()
            .ok_or_else(|| bad("truncated entry"))?;
        let len = u32::from_be_bytes(*len) as usize;
        if r.len() < len || len < 8 {
            return Err(bad("truncated entry"));
        }
        out.push((u64::from_be_bytes(*id), r[..len].to_vec()));
        rest = &r[len..];
    }
    Ok(out)
}

fn merge_chunks(a: &[u8], b: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut all = chunk::decode(a).map_err(|e| corrupt("chunk", e))?;
    all.extend(chunk::decode(b).map_err(|e| corrupt("chunk", e))?);
    // Stable sort keeps `a`'s sample first among equal timestamps.
    all.sort_by_key(|s| s.0);
    all.dedup_by_key(|s| s.0);
    let mut out = Vec::new();
    let mut c = chunk::Chunk::new();
    for (t, v) in all {
        if c.len() >= chunk::MAX_SAMPLES {
            out.push(std::mem::take(&mut c).bytes().to_vec());
        }
        c.append(t, v);
    }
    if !c.is_empty() {
        out.push(c.bytes().to_vec());
    }
    Ok(out)
}

/// Encodes samples (series id, timestamp ms, value) as one WAL record.
pub fn encode_wal(samples: &[(SeriesId, i64, f64)]) -> Vec<u8> {
    // ~18 bytes a sample (id 1-3, time 6-7, value 8): room for all but the widest at once
    let mut out = Vec::with_capacity(samples.len() * 20);
    for &(id, t, v) in samples {
        put_varint(&mut out, id);
        put_varint(&mut out, ((t << 1) ^ (t >> 63)) as u64);
        out.extend_from_slice(&v.to_bits().to_le_bytes());
    }
    out
}

/// Decodes a WAL record.
pub fn decode_wal(mut bytes: &[u8]) -> Result<Vec<(SeriesId, i64, f64)>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let id = get_varint(&mut bytes).ok_or_else(|| corrupt("wal", "bad id"))?;
        let z = get_varint(&mut bytes).ok_or_else(|| corrupt("wal", "bad time"))?;
        let t = ((z >> 1) as i64) ^ -((z & 1) as i64);
        let (v, rest) = bytes
            .split_first_chunk::<8>()
            .ok_or_else(|| corrupt("wal", "bad value"))?;
        bytes = rest;
        out.push((id, t, f64::from_bits(u64::from_le_bytes(*v))));
    }
    Ok(out)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        v |= ((b & 0x7f) as u64) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wal_records_round_trip() {
        let s = vec![
            (0, 0, 0.0),
            (u64::MAX, i64::MIN, f64::NAN),
            (7, -1, f64::INFINITY),
            (300, 1_700_000_000_123, 1.5),
        ];
        let back = decode_wal(&encode_wal(&s)).expect("decodes");
        assert_eq!(back.len(), s.len());
        for (a, b) in s.iter().zip(&back) {
            assert_eq!((a.0, a.1, a.2.to_bits()), (b.0, b.1, b.2.to_bits()));
        }
        assert!(decode_wal(&[0x80]).is_err());
        assert!(decode_wal(&[1, 2, 3]).is_err());
    }

    #[tokio::test]
    async fn the_wal_replays_its_files_and_the_old_trees_and_skips_a_torn_tail() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = Disk::open(dir.path(), 1 << 20).expect("opens");
        // a store before the WAL files kept its records in a tree per generation
        disk.db
            .open_tree(format!("{WAL_PREFIX}{:016x}", 0))
            .and_then(|t| t.insert(0u64.to_be_bytes(), b"from the tree"))
            .expect("tree");
        disk.append_wal(b"first").expect("appends");
        disk.append_wal(b"second").expect("appends");
        disk.flush().await.expect("flushes");
        disk.close().await.expect("closes");
        // a crash in the middle of a write: a header whose record is cut short
        let path = wal_path(dir.path(), 0);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("opens the file");
        f.write_all(&[0, 0, 0, 9, 1, 2, 3, 4, b'x'])
            .expect("writes");
        drop(f);

        let disk = Disk::open(dir.path(), 1 << 20).expect("opens again");
        let replay = |d: &Disk| -> Vec<String> {
            d.wal_records()
                .expect("records")
                .iter()
                .map(|r| String::from_utf8_lossy(r).into_owned())
                .collect()
        };
        assert_eq!(replay(&disk), ["from the tree", "first", "second"]);
        // what comes after goes to a new file, not behind the torn record
        disk.append_wal(b"third").expect("appends");
        disk.flush().await.expect("flushes");
        disk.close().await.expect("closes");
        let disk = Disk::open(dir.path(), 1 << 20).expect("opens again");
        assert_eq!(replay(&disk), ["from the tree", "first", "second", "third"]);
        // a whole record whose bytes do not match its CRC ends what is replayed of its file
        let third = wal_path(dir.path(), 1);
        let mut bytes = std::fs::read(&third).expect("reads");
        assert_eq!(bytes.len(), 8 + 5, "one record in the second file");
        bytes[9] ^= 1;
        std::fs::write(&third, bytes).expect("writes");
        assert_eq!(replay(&disk), ["from the tree", "first", "second"]);

        // a checkpoint drops the trees and files before its generation
        let generation = disk.rotate_wal().expect("rotates");
        disk.append_wal(b"after the checkpoint").expect("appends");
        let heads = disk.begin_heads(generation).expect("heads");
        disk.finish_checkpoint(heads, generation)
            .await
            .expect("checkpoint");
        disk.flush().await.expect("flushes");
        disk.close().await.expect("closes");
        let disk = Disk::open(dir.path(), 1 << 20).expect("opens again");
        assert_eq!(replay(&disk), ["after the checkpoint"]);
        assert!(disk.wal_trees().is_empty(), "the old trees are dropped");
        let files = wal_files(dir.path()).expect("lists");
        assert!(files.iter().all(|(g, _)| *g >= generation), "{files:?}");
    }

    /// A write that fails part-way is cut off and the next record goes where it started: recovery reads
    /// every record written after it.
    #[tokio::test]
    async fn a_failed_write_hides_no_later_record() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = Disk::open(dir.path(), 1 << 20).expect("opens");
        disk.append_wal(b"before").expect("appends");
        {
            // what a write that failed after 5 bytes leaves
            let mut wal = disk.wal.lock().expect("lock");
            wal.file.write_all(&[0, 0, 0, 40, 7]).expect("writes");
            wal.cut_back();
            assert!(!wal.broken);
        }
        disk.append_wal(b"after").expect("appends");
        disk.flush().await.expect("flushes");
        disk.close().await.expect("closes");
        let disk = Disk::open(dir.path(), 1 << 20).expect("opens again");
        let got: Vec<Vec<u8>> = disk.wal_records().expect("records");
        assert_eq!(got, [b"before".to_vec(), b"after".to_vec()]);
    }

    #[tokio::test]
    async fn the_heads_file_round_trips_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = Disk::open(dir.path(), 1 << 20).expect("opens");
        // a store before the heads file: its heads come from the tree until a checkpoint writes the file
        disk.heads
            .insert(9u64.to_be_bytes(), &[0u8; 8][..])
            .expect("insert");
        assert_eq!(disk.load_heads().expect("loads").len(), 1);
        let generation = disk.rotate_wal().expect("rotates");
        let mut w = disk.begin_heads(generation).expect("begins");
        w.add(1, 1_700_000_000_000, b"chunk").expect("adds");
        w.add(u64::MAX, i64::MIN, b"").expect("adds");
        disk.finish_checkpoint(w, generation)
            .await
            .expect("finishes");
        let heads = disk.load_heads().expect("loads");
        let mut first = 1_700_000_000_000i64.to_be_bytes().to_vec();
        first.extend_from_slice(b"chunk");
        assert_eq!(
            heads,
            vec![(1, first), (u64::MAX, i64::MIN.to_be_bytes().to_vec())]
        );
        assert!(disk.heads.is_empty(), "the old heads tree is emptied");

        let path = dir.path().join(HEADS_FILE);
        let good = std::fs::read(&path).expect("reads");
        for damaged in [
            good[..good.len() - 3].to_vec(),
            [&good[..12], &good[13..]].concat(),
            good.iter().map(|b| b ^ 1).collect(),
        ] {
            std::fs::write(&path, &damaged).expect("writes");
            let err = disk.load_heads().expect_err("refused").to_string();
            assert!(err.contains("heads file"), "{err}");
        }
    }

    #[test]
    fn chunk_keys_sort_by_series_then_time() {
        assert!(chunk_key(1, -5) < chunk_key(1, 3));
        assert!(chunk_key(1, i64::MAX) < chunk_key(2, i64::MIN));
        assert_eq!(partition_of(-1), -1);
    }

    #[test]
    fn colliding_chunks_are_merged_not_overwritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = Disk::open(dir.path(), 1 << 20).expect("open");
        let mut a = chunk::Chunk::new();
        a.append(1000, 1.0);
        a.append(3000, 3.0);
        let mut b = chunk::Chunk::new();
        b.append(1000, 9.0);
        b.append(2000, 2.0);
        disk.write_chunk(5, a.bytes()).expect("a");
        disk.write_chunk(5, b.bytes()).expect("b");
        let mut out = Vec::new();
        disk.read_chunks(5, 0, 10_000, 7_200_000, &mut out)
            .expect("read");
        assert_eq!(out, vec![(1000, 1.0), (2000, 2.0), (3000, 3.0)]);
    }
}
