//! The storage engine's rules for time, duplicates and retention, through restarts and checkpoints.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use multipilot_schemas::payload::Sample;
use multipilot_tsdb::store::{AppendStats, Options, SeriesId, Store};
use promql_parser::label::{MatchOp, Matcher};

const MIN: i64 = 60_000;
const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

fn s(name: &str, cluster: &str, t: i64, v: f64) -> Sample {
    Sample {
        name: name.into(),
        labels: BTreeMap::from([("cluster".to_string(), cluster.to_string())]),
        value: v,
        timestamp_ms: t,
    }
}

fn only(store: &Store, name: &str) -> SeriesId {
    let found = store.select(&[vec![Matcher::new(MatchOp::Equal, "__name__", name)]]);
    assert_eq!(found.len(), 1, "{name}");
    found[0].0
}

fn all(store: &Store, name: &str) -> Result<Vec<(i64, f64)>> {
    Ok(store.samples(only(store, name), i64::MIN, i64::MAX)?)
}

#[tokio::test]
async fn late_samples_within_the_window_are_placed_by_their_time() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    let base = 1_750_000_000_000;
    // In order every minute for 3 hours (two sealed chunks plus a head), leaving out minute 150 and 170.
    let mut batch = Vec::new();
    for m in 0..180 {
        if m != 150 && m != 170 {
            batch.push(s("x", "a", base + m * MIN, m as f64));
        }
    }
    let st = store.append("", &batch)?;
    assert_eq!(st.appended, 178);
    // 29 and 9 minutes late: within the 1 h window, stored out of order.
    let st = store.append(
        "",
        &[
            s("x", "a", base + 150 * MIN, 150.0),
            s("x", "a", base + 170 * MIN, 170.0),
        ],
    )?;
    assert_eq!(st.out_of_order, 2, "{st:?}");
    // 2 hours late: refused.
    let st = store.append("", &[s("x", "a", base + 60 * MIN - 1, -1.0)])?;
    assert_eq!(st.too_old, 1, "{st:?}");
    store.commit().await?;
    let got = all(&store, "x")?;
    assert_eq!(got.len(), 180);
    assert!(
        got.iter()
            .enumerate()
            .all(|(m, (t, v))| *t == base + m as i64 * MIN && *v == m as f64)
    );

    // Still so after the out-of-order samples are written as chunks and after a restart.
    store.checkpoint().await?;
    store.close().await?;
    let store = Store::open(dir.path(), Options::default())?;
    let got = all(&store, "x")?;
    assert_eq!(got.len(), 180);
    assert!(
        got.iter()
            .enumerate()
            .all(|(m, (t, _))| *t == base + m as i64 * MIN)
    );
    Ok(())
}

#[tokio::test]
async fn the_same_sample_written_twice_is_stored_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    let base = 1_750_000_000_000;
    let batch: Vec<Sample> = (0..300)
        .map(|i| s("d", "a", base + i * 30_000, i as f64))
        .collect();
    assert_eq!(store.append("", &batch)?.appended, 300);
    store.commit().await?;
    // A redelivery of the whole batch: the recent part is in the head, the older part in sealed chunks
    // (or, out of the window, refused): nothing is stored twice.
    let again = store.append("", &batch)?;
    assert_eq!(again.appended + again.out_of_order, 0, "{again:?}");
    assert_eq!(again.duplicates + again.too_old, 300);
    // A duplicate with another value keeps the first value.
    let st = store.append(
        "",
        &[
            s("d", "a", base + 299 * 30_000, -5.0),
            s("d", "a", base + 290 * 30_000, -5.0),
        ],
    )?;
    assert_eq!(st.duplicates, 2, "{st:?}");
    store.commit().await?;
    store.checkpoint().await?;
    store.close().await?;

    // Replaying the WAL and redelivering once more after a restart changes nothing either.
    let store = Store::open(dir.path(), Options::default())?;
    let again = store.append("", &batch[200..])?;
    assert_eq!(again.duplicates, 100, "{again:?}");
    let got = all(&store, "d")?;
    assert_eq!(got.len(), 300);
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, (t, v))| *t == base + i as i64 * 30_000 && *v == i as f64)
    );
    let (_, sealed) = store.chunk_stats()?;
    assert!(sealed <= 300, "{sealed} samples in sealed chunks");
    Ok(())
}

#[tokio::test]
async fn wal_replay_restores_uncheckpointed_samples_and_cluster_labels() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let base = 1_750_000_000_000;
    {
        let store = Store::open(dir.path(), Options::default())?;
        let mut unlabelled = s("w", "", base, 1.0);
        unlabelled.labels.clear();
        store.append("envelope-cluster", &[unlabelled])?;
        store.append(
            "",
            &(1..130)
                .map(|i| s("w2", "a", base + i * 1000, i as f64))
                .collect::<Vec<_>>(),
        )?;
        store.commit().await?;
        // Appended but never committed: may be lost (it was never acked).
        store.append("", &[s("w2", "a", base + 999_000, 0.0)])?;
    }
    // dropped as by a crash: wait only for sled's threads to let go of the directory
    multipilot_runtime::store::wait_released(dir.path(), Duration::from_secs(30)).await?;
    let store = Store::open(dir.path(), Options::default())?;
    let found = store.select(&[vec![Matcher::new(
        MatchOp::Equal,
        "cluster",
        "envelope-cluster",
    )]]);
    assert_eq!(
        found.len(),
        1,
        "the envelope's cluster labels a sample without one"
    );
    let got = all(&store, "w2")?;
    assert!(got.len() >= 129);
    assert!(
        got[..129]
            .iter()
            .enumerate()
            .all(|(i, (t, _))| *t == base + (i as i64 + 1) * 1000)
    );
    Ok(())
}

#[tokio::test]
async fn retention_drops_old_days_in_bulk_and_forgets_dead_series() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    let day0 = 20_000 * DAY;
    // Series "old" lives on days 0–2; "live" on days 0–5. Every 5 minutes.
    for day in 0..6 {
        let mut batch = Vec::new();
        for k in 0..(DAY / (5 * MIN)) {
            let t = day0 + day * DAY + k * 5 * MIN;
            if day < 3 {
                batch.push(s("old", "a", t, k as f64));
            }
            batch.push(s("live", "a", t, k as f64));
        }
        store.append("", &batch)?;
        store.commit().await?;
    }
    store.checkpoint().await?;
    let (bytes_before, _) = store.chunk_stats()?;
    // two series, five distinct strings: `__name__`, `cluster` and `a` kept once for both
    assert_eq!(store.label_strings().0, 5);

    // Keep 2.5 days back from the end of day 5: days 0–2 are entirely older (their chunks end before).
    let cutoff = day0 + 6 * DAY - (5 * DAY / 2);
    let (partitions, series) = store.apply_retention(cutoff)?;
    assert_eq!(partitions, 3, "days 0, 1, 2 dropped");
    assert_eq!(series, 1, "`old` forgotten");
    let (bytes_after, _) = store.chunk_stats()?;
    assert!(
        bytes_after * 2 < bytes_before,
        "{bytes_after} of {bytes_before} bytes left"
    );
    assert!(
        store
            .select(&[vec![Matcher::new(MatchOp::Equal, "__name__", "old")]])
            .is_empty()
    );
    // `old`'s name is no longer held in memory; what `live` uses is
    let (strings, bytes) = store.label_strings();
    assert_eq!(
        (strings, bytes),
        (
            4,
            "__name__".len() + "cluster".len() + "a".len() + "live".len()
        ),
        "only `live`'s label strings are left"
    );
    let live = all(&store, "live")?;
    assert!(
        live.first()
            .is_some_and(|(t, _)| *t >= day0 + 3 * DAY - 2 * HOUR),
        "{:?}",
        live.first()
    );
    assert_eq!(live.last().map(|x| x.0), Some(day0 + 6 * DAY - 5 * MIN));

    // A restart does not bring anything back.
    store.close().await?;
    let store = Store::open(dir.path(), Options::default())?;
    assert!(
        store
            .select(&[vec![Matcher::new(MatchOp::Equal, "__name__", "old")]])
            .is_empty()
    );
    assert_eq!(all(&store, "live")?.first(), live.first());
    Ok(())
}

#[test]
fn samples_older_than_retention_are_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(
        dir.path(),
        Options {
            retention: Some(Duration::from_secs(86_400)),
            ..Default::default()
        },
    )?;
    let now = chrono::Utc::now().timestamp_millis();
    let st = store.append(
        "",
        &[
            s("r", "a", now - 2 * DAY, 1.0),
            s("r", "a", now - HOUR, 2.0),
        ],
    )?;
    assert_eq!(
        st,
        AppendStats {
            appended: 1,
            too_old: 1,
            ..Default::default()
        }
    );
    Ok(())
}

#[tokio::test]
async fn a_label_bomb_is_refused_and_its_neighbours_are_stored() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    let t = 1_750_000_000_000;
    let mut bomb = s("bomb", "prod-1", t, 1.0);
    for i in 0..10_000 {
        bomb.labels.insert(format!("l{i}"), "x".into());
    }
    let mut long = s("long_value", "prod-1", t, 1.0);
    long.labels.insert("v".into(), "y".repeat(1 << 20));
    let stats = store.append(
        "prod-1",
        &[
            s("before", "prod-1", t, 1.0),
            bomb,
            long,
            s("after", "prod-1", t, 2.0),
        ],
    )?;
    assert_eq!(stats.invalid, 2, "{stats:?}");
    assert_eq!(all(&store, "before")?, vec![(t, 1.0)]);
    assert_eq!(all(&store, "after")?, vec![(t, 2.0)]);
    assert!(
        store
            .select(&[vec![Matcher::new(MatchOp::Equal, "__name__", "bomb")]])
            .is_empty()
    );
    Ok(())
}

/// Sealed chunks kept in memory (`Options::sealed_bytes`) read as if written: in order, once, duplicates
/// found in them; written by `write_sealed`, by a checkpoint, or after a crash from the write-ahead log.
#[tokio::test]
async fn chunks_sealed_in_memory_read_as_written_and_survive_a_crash() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let base = 1_750_000_000_000;
    let kept = Options {
        sealed_bytes: 1 << 20,
        ..Options::default()
    };
    let series = |from: i64, to: i64| -> Vec<Sample> {
        (from..to)
            .map(|i| s("m", "a", base + i * 1000, i as f64))
            .collect()
    };
    let want =
        |to: i64| -> Vec<(i64, f64)> { (0..to).map(|i| (base + i * 1000, i as f64)).collect() };
    {
        let store = Store::open(dir.path(), kept.clone())?;
        // 300 samples: two chunks of 120 sealed, 60 in the head chunk
        store.append("", &series(0, 300))?;
        assert!(store.sealed_bytes() > 0);
        assert_eq!(store.chunk_stats()?, (0, 0), "nothing written yet");
        assert_eq!(all(&store, "m")?, want(300));
        // a sample again, inside the first sealed chunk: a duplicate, not stored out of order
        let again = store.append("", &series(5, 6))?;
        assert_eq!((again.duplicates, again.out_of_order), (1, 0), "{again:?}");
        store.commit().await?;
        assert_eq!(store.write_sealed(usize::MAX)?, 0);
        assert_eq!(store.sealed_bytes(), 0);
        assert_eq!(store.chunk_stats()?.1, 240);
        assert_eq!(
            all(&store, "m")?,
            want(300),
            "read from disk: the same, once"
        );
        // two more sealed in memory, then a crash
        store.append("", &series(300, 560))?;
        assert!(store.sealed_bytes() > 0);
        store.commit().await?;
    }
    multipilot_runtime::store::wait_released(dir.path(), Duration::from_secs(30)).await?;
    {
        let store = Store::open(dir.path(), kept.clone())?;
        assert_eq!(
            all(&store, "m")?,
            want(560),
            "replayed from the write-ahead log"
        );
        // a checkpoint writes them before the log they are in is dropped
        store.checkpoint().await?;
        assert_eq!(store.sealed_bytes(), 0);
        assert_eq!(store.chunk_stats()?.1, 480);
        // more sealed after it, then a crash: rebuilt from the saved heads and the newer log
        store.append("", &series(560, 900))?;
        assert!(store.sealed_bytes() > 0);
        store.commit().await?;
    }
    multipilot_runtime::store::wait_released(dir.path(), Duration::from_secs(30)).await?;
    let store = Store::open(dir.path(), kept.clone())?;
    assert_eq!(all(&store, "m")?, want(900));
    store.close().await?;
    let store = Store::open(dir.path(), kept)?;
    assert_eq!(store.chunk_stats()?.1, 840, "closing wrote them");
    assert_eq!(all(&store, "m")?, want(900));
    store.close().await?;
    Ok(())
}

/// Past `sealed_bytes`, an append writes the chunks it seals (memory stays bounded).
#[test]
fn past_its_bound_a_sealed_chunk_is_written_by_the_append() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let base = 1_750_000_000_000;
    let store = Store::open(
        dir.path(),
        Options {
            sealed_bytes: 1,
            ..Options::default()
        },
    )?;
    store.append(
        "",
        &(0..250)
            .map(|i| s("m", "a", base + i * 1000, 1.0))
            .collect::<Vec<_>>(),
    )?;
    assert_eq!(store.sealed_bytes(), 0);
    assert_eq!(store.chunk_stats()?.1, 240);
    Ok(())
}
