//! The release store's write-through to the `MULTIPILOT_RELEASES` KV bucket, against a real nats-server:
//! releases, snapshots and history written on one data directory come back, unchanged, into a blank one;
//! a store that predates the bucket is copied into it; the first snapshot of a revision stays the one kept.

use std::path::Path;

use anyhow::Result;
use async_nats::jetstream;
use chrono::Utc;
use multipilot_release::model::{Plan, Release, State};
use multipilot_release::spec::Spec;
use multipilot_release::store::{self, Restored, Store};
use multipilot_schemas::payload::{
    ObjectOutcome, ObjectRef, ReleaseEntry, ReleaseEvent, ReleaseState,
};
use multipilot_testkit::NatsServer;

fn release(name: &str, revision: u64, events: u64) -> Result<Release> {
    let spec = Spec::parse(&format!(
        "name: {name}\nmanifests: |\n  apiVersion: v1\n  kind: ConfigMap\n  metadata: {{name: x}}\ntargets: {{clusters: [a, b]}}\n"
    ))?;
    let now = Utc::now();
    Ok(Release {
        name: name.into(),
        revision,
        state: State::Succeeded,
        spec,
        source: Default::default(),
        actor: "tester".into(),
        created_at: now,
        updated_at: now,
        plan: Plan {
            planned_at: now,
            batches: vec![vec!["a".into()], vec!["b".into()]],
            clusters: Vec::new(),
            required_approvals: Default::default(),
            blocked: 0,
            errors: 0,
            dry_run_ms: 3,
        },
        approvals: Default::default(),
        batches: Vec::new(),
        changed: vec!["a".into(), "b".into()],
        rollbacks: 0,
        error: None,
        waiting_for: None,
        override_windows: false,
        events,
        deployed: Default::default(),
        deployed_before: Default::default(),
    })
}

fn event(name: &str, what: ReleaseEntry) -> ReleaseEvent {
    ReleaseEvent {
        release: name.into(),
        revision: 1,
        what,
        state: ReleaseState::Applying,
        actor: "tester".into(),
        batch: Some(1),
        clusters: vec!["a".into()],
        ok: true,
        summary: format!("{what} of {name}"),
        detail: serde_json::json!({"n": 1}),
        commit: None,
        at: Utc::now(),
    }
}

fn snapshot(name: &str) -> Vec<ObjectOutcome> {
    vec![ObjectOutcome {
        object: ObjectRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("default".into()),
            name: name.into(),
            uid: None,
        },
        outcome: multipilot_schemas::payload::ApplyOutcome::Unchanged,
        error: None,
        live: Some(serde_json::json!({"data": {"k": name}})),
        result: None,
    }]
}

async fn bucket(js: &jetstream::Context) -> Result<jetstream::kv::Store> {
    Ok(multipilot_bus::kv::open(
        js,
        &multipilot_bus::kv::Bucket {
            name: store::BUCKET.into(),
            description: "test".into(),
            replicas: 1,
            max_age: std::time::Duration::ZERO,
        },
    )
    .await?)
}

async fn open(dir: &Path, js: &jetstream::Context) -> Result<(Store, Restored)> {
    let s = Store::open(dir)?.with_replica(bucket(js).await?);
    let restored = s.sync_with_replica().await?;
    Ok((s, restored))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_store_gets_its_releases_snapshots_and_history_back() -> Result<()> {
    let nats = NatsServer::start().await?;
    let js = jetstream::new(nats.client().await?);
    let first = tempfile::tempdir()?;
    let (s, restored) = open(first.path(), &js).await?;
    assert_eq!(restored, Restored::default(), "nothing to restore yet");

    let r = release("web-1", 1, 2)?;
    s.add_event(1, &event("web-1", ReleaseEntry::Plan))?;
    s.add_event(2, &event("web-1", ReleaseEntry::Batch))?;
    s.put(&r).await?;
    s.put_snapshot("web-1", 1, "a", &snapshot("before")).await?;
    // a retried step reads the cluster again: the first snapshot stays the one kept
    s.put_snapshot("web-1", 1, "a", &snapshot("after")).await?;
    assert_eq!(s.outbox_len(), 0, "everything reached the bucket");
    let history = s.history("web-1")?;
    drop(s);

    // the disk is gone: a new data directory on another machine
    let second = tempfile::tempdir()?;
    let (s2, restored) = open(second.path(), &js).await?;
    assert_eq!(
        restored,
        Restored {
            releases: 1,
            snapshots: 1,
            history: 2,
            skipped: 0
        }
    );
    assert_eq!(s2.get("web-1")?, Some(r.clone()));
    assert_eq!(s2.history("web-1")?, history);
    assert_eq!(
        s2.snapshot("web-1", 1, "a")?,
        Some(snapshot("before")),
        "the snapshot a rollback needs is back"
    );
    assert_eq!(s2.snapshot("web-1", 1, "b")?, None);

    // a restored store is not blank: opening it again restores nothing, and writes go on replicating
    s2.add_event(3, &event("web-1", ReleaseEntry::Rollback))?;
    s2.put(&release("web-1", 1, 3)?).await?;
    // closed, not dropped: sled releases its lock on the directory from a background thread, and opening the
    // same directory at once raced with that (a CI failure on a busy machine: "could not acquire lock")
    s2.close(second.path()).await?;
    let (s3, restored) = open(second.path(), &js).await?;
    assert_eq!(restored, Restored::default());
    assert_eq!(s3.history("web-1")?.len(), 3);
    drop(s3);
    let third = tempfile::tempdir()?;
    let (s4, restored) = open(third.path(), &js).await?;
    assert_eq!(restored.history, 3);
    assert_eq!(s4.get("web-1")?.map(|r| r.events), Some(3));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_predates_the_bucket_is_copied_into_it() -> Result<()> {
    let nats = NatsServer::start().await?;
    let js = jetstream::new(nats.client().await?);
    let old = tempfile::tempdir()?;
    {
        // written by a version without the bucket
        let s = Store::open(old.path())?;
        s.add_event(1, &event("db-2", ReleaseEntry::Plan))?;
        s.put(&release("db-2", 4, 1)?).await?;
        s.put_snapshot("db-2", 4, "b", &snapshot("live")).await?;
        s.close(old.path()).await?;
    }
    let (s, restored) = open(old.path(), &js).await?;
    assert_eq!(
        restored,
        Restored::default(),
        "its own records stay, nothing is restored over them"
    );
    assert_eq!(s.outbox_len(), 0);
    let keys = multipilot_bus::kv::load_all(&bucket(&js).await?).await?;
    assert_eq!(keys.len(), 3, "release, snapshot and history entry copied");
    drop(s);

    let fresh = tempfile::tempdir()?;
    let (s2, restored) = open(fresh.path(), &js).await?;
    assert_eq!(
        (restored.releases, restored.snapshots, restored.history),
        (1, 1, 1)
    );
    assert_eq!(s2.snapshot("db-2", 4, "b")?, Some(snapshot("live")));
    assert_eq!(s2.get("db-2")?.map(|r| r.revision), Some(4));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_record_in_the_bucket_is_skipped_not_fatal() -> Result<()> {
    let nats = NatsServer::start().await?;
    let js = jetstream::new(nats.client().await?);
    let kv = bucket(&js).await?;
    kv.put("release.garbage", "not json".into()).await?;
    let dir = tempfile::tempdir()?;
    let (s, restored) = open(dir.path(), &js).await?;
    assert_eq!(restored.skipped, 1);
    assert!(s.all()?.is_empty());
    Ok(())
}
