//! The simulator as kube-rs and kubectl meet it: over real HTTPS, with the generated kubeconfig.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::{FutureExt as _, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::Discovery;
use kube::runtime::watcher;
use kube::{Client, Config};
use multipilot_sim::fleet::{self, Fleet};
use multipilot_sim::world;
use serde_json::json;
use tokio_util::sync::CancellationToken;

struct Sim {
    fleet: Arc<Fleet>,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
    cancel: CancellationToken,
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn start(versions: &[&str], objects: usize, churn: f64) -> Result<Sim> {
    let dir = tempfile::tempdir()?;
    let cfg = fleet::Config {
        clusters: versions.len(),
        versions: versions.iter().map(|v| v.to_string()).collect(),
        objects,
        churn,
        bookmark_interval: Duration::from_millis(200),
        history: 5_000,
        ..Default::default()
    };
    let cancel = CancellationToken::new();
    let fleet = Arc::new(Fleet::start(&cfg, cancel.clone()).await?);
    let kubeconfig = dir.path().join("kubeconfig.yaml");
    fleet.write_kubeconfig(&kubeconfig)?;
    Ok(Sim {
        fleet,
        kubeconfig,
        _dir: dir,
        cancel,
    })
}

async fn client(kubeconfig: &Path, context: &str) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let opts = KubeConfigOptions {
        context: Some(context.to_string()),
        ..Default::default()
    };
    let config = Config::from_custom_kubeconfig(kc, &opts).await?;
    Ok(Client::try_from(config)?)
}

fn name(sim: &Sim, i: usize) -> String {
    sim.fleet.clusters[i].name().to_string()
}

async fn eventually<F, Fut>(what: &str, mut f: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    multipilot_testkit::wait::eventually(what, 30, async || f().await.then_some(())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_serves_each_release_profile() -> Result<()> {
    let versions = [
        "1.24", "1.25", "1.26", "1.27", "1.28", "1.29", "1.30", "1.31", "1.32", "1.33", "1.34",
        "1.35",
    ];
    let sim = start(&versions, 30, 0.0).await?;
    for (i, v) in versions.iter().enumerate() {
        let c = client(&sim.kubeconfig, &name(&sim, i)).await?;
        let info = c.apiserver_version().await?;
        assert_eq!(format!("{}.{}", info.major, info.minor), *v);
        let discovery = Discovery::new(c.clone()).run().await?;
        let served = |group: &str, version: &str| {
            discovery
                .get(group)
                .is_some_and(|g| g.versions().any(|gv| gv == version))
        };
        let minor: u32 = v[2..].parse()?;
        assert!(served("batch", "v1"), "{v}: batch/v1");
        assert_eq!(
            served("batch", "v1beta1"),
            minor <= 24,
            "{v}: batch/v1beta1"
        );
        assert_eq!(
            served("policy", "v1beta1"),
            minor <= 24,
            "{v}: policy/v1beta1"
        );
        assert_eq!(
            served("discovery.k8s.io", "v1beta1"),
            minor <= 24,
            "{v}: discovery.k8s.io/v1beta1"
        );
        assert_eq!(
            served("autoscaling", "v2beta1"),
            minor <= 24,
            "{v}: autoscaling/v2beta1"
        );
        assert_eq!(
            served("autoscaling", "v2beta2"),
            minor <= 25,
            "{v}: autoscaling/v2beta2"
        );
        assert_eq!(
            served("flowcontrol.apiserver.k8s.io", "v1beta2"),
            minor <= 28,
            "{v}: flowcontrol v1beta2"
        );
        assert_eq!(
            served("flowcontrol.apiserver.k8s.io", "v1"),
            minor >= 29,
            "{v}: flowcontrol v1"
        );
        // the recommended CronJob version is batch/v1 everywhere
        let (ar, _) = discovery
            .resolve_gvk(&kube::api::GroupVersionKind::gvk("batch", "v1", "CronJob"))
            .context("batch/v1 CronJob")?;
        assert_eq!(ar.plural, "cronjobs");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unserved_version_is_the_real_404() -> Result<()> {
    let sim = start(&["1.24", "1.31"], 200, 0.0).await?;
    let old = client(&sim.kubeconfig, &name(&sim, 0)).await?;
    let new = client(&sim.kubeconfig, &name(&sim, 1)).await?;
    let req = || {
        http::Request::get("/apis/batch/v1beta1/cronjobs")
            .body(Vec::new())
            .expect("request")
    };
    let list: serde_json::Value = old.request(req()).await?;
    assert_eq!(list["kind"], "CronJobList");
    assert_eq!(list["apiVersion"], "batch/v1beta1");
    assert!(!list["items"].as_array().expect("items").is_empty());
    match new.request::<serde_json::Value>(req()).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 404);
            assert_eq!(s.reason, "NotFound");
        }
        other => panic!("expected 404, got {other:?}"),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_and_watcher_relists_after_410() -> Result<()> {
    let sim = start(&["1.31"], 400, 0.0).await?;
    let c = client(&sim.kubeconfig, &name(&sim, 0)).await?;
    let pods: Api<Pod> = Api::all(c.clone());
    let all = pods.list(&ListParams::default()).await?;
    let first = pods.list(&ListParams::default().limit(7)).await?;
    assert_eq!(first.items.len(), 7);
    let token = first.metadata.continue_.clone().context("continue token")?;
    let second = pods
        .list(&ListParams::default().limit(1000).continue_token(&token))
        .await?;
    assert_eq!(first.items.len() + second.items.len(), all.items.len());
    assert!(
        second
            .metadata
            .continue_
            .as_deref()
            .unwrap_or("")
            .is_empty()
    );

    // label and field selectors
    let dns = pods
        .list(&ListParams::default().labels("k8s-app=kube-dns"))
        .await?;
    assert_eq!(dns.items.len(), 2);
    let node = dns.items[0]
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .context("node")?;
    let on_node = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    assert!(
        on_node
            .items
            .iter()
            .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()))
    );

    // a kube-rs watcher sees a change, then relists when its resourceVersion expires
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let mut stream = watcher(cms.clone(), watcher::Config::default()).boxed();
    let mut inits = 0;
    let mut gone = false;
    let mut saw_change = false;
    let cluster = sim.fleet.clusters[0].clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        let ev = match tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await
            .context("watcher stalled")?
        {
            Ok(ev) => ev.context("watcher ended")?,
            Err(watcher::Error::WatchError(e)) if e.code == 410 => {
                gone = true;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        match ev {
            watcher::Event::Init => inits += 1,
            watcher::Event::InitDone if inits == 1 => {
                cms.create(
                    &PostParams::default(),
                    &serde_json::from_value(
                        json!({"metadata": {"name": "probe"}, "data": {"a": "1"}}),
                    )?,
                )
                .await?;
            }
            watcher::Event::Apply(cm)
                if cm.metadata.name.as_deref() == Some("probe") && inits == 1 =>
            {
                saw_change = true;
                world::set_fault(&cluster, "watch-expire", true, &BTreeMap::new())?;
            }
            watcher::Event::InitDone if inits == 2 => break,
            _ => {}
        }
    }
    assert!(saw_change, "the watch delivered the new ConfigMap");
    assert!(gone, "the resumed watch was answered 410 Gone");
    assert_eq!(inits, 2, "the watcher relisted after 410 Gone");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sends_bookmarks_and_expired_version_is_gone() -> Result<()> {
    let sim = start(&["1.28"], 60, 0.0).await?;
    let c = client(&sim.kubeconfig, &name(&sim, 0)).await?;
    let cms: Api<ConfigMap> = Api::all(c);
    let rv = cms
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .context("rv")?;
    let mut stream = cms
        .watch(&WatchParams::default().timeout(10), &rv)
        .await?
        .boxed();
    let mut bookmark = false;
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(5), stream.next()).await? {
        if let WatchEvent::Bookmark(b) = ev? {
            assert!(!b.metadata.resource_version.is_empty());
            bookmark = true;
            break;
        }
    }
    assert!(bookmark);
    sim.fleet.clusters[0].store.compact();
    let mut stream = cms.watch(&WatchParams::default(), "1").await?.boxed();
    match stream.next().await {
        Some(Ok(WatchEvent::Error(e))) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    Ok(())
}

fn deployment(replicas: i32, image: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "ssa-demo", "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "ssa-demo"}},
            "template": {"metadata": {"labels": {"app": "ssa-demo"}}, "spec": {"containers": [{"name": "web", "image": image}]}}}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_conflicts_force_and_dry_run() -> Result<()> {
    let sim = start(&["1.31"], 60, 0.0).await?;
    let c = client(&sim.kubeconfig, &name(&sim, 0)).await?;
    let deps: Api<Deployment> = Api::namespaced(c, "default");

    // dry-run apply validates and returns the result, but nothing is stored
    let dry = deps
        .patch(
            "ssa-demo",
            &PatchParams::apply("alice").dry_run(),
            &Patch::Apply(deployment(2, "nginx:1.25")),
        )
        .await?;
    assert_eq!(dry.spec.replicas, Some(2));
    assert!(
        deps.get_opt("ssa-demo").await?.is_none(),
        "dry-run persisted nothing"
    );

    let applied = deps
        .patch(
            "ssa-demo",
            &PatchParams::apply("alice"),
            &Patch::Apply(deployment(2, "nginx:1.25")),
        )
        .await?;
    let managers: Vec<_> = applied
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(managers, vec![("alice".to_string(), "Apply".to_string())]);

    // bob changes a field alice owns: 409 naming the manager and the field
    match deps
        .patch(
            "ssa-demo",
            &PatchParams::apply("bob"),
            &Patch::Apply(deployment(5, "nginx:1.25")),
        )
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 409);
            assert_eq!(s.reason, "Conflict");
            assert!(
                s.message.contains("conflict with \"alice\""),
                "{}",
                s.message
            );
            assert!(s.message.contains(".spec.replicas"), "{}", s.message);
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    let forced = deps
        .patch(
            "ssa-demo",
            &PatchParams::apply("bob").force(),
            &Patch::Apply(deployment(5, "nginx:1.25")),
        )
        .await?;
    assert_eq!(forced.spec.replicas, Some(5));
    assert_eq!(forced.metadata.generation, Some(2));

    // an invalid object is refused even in dry-run
    let mut bad = deployment(1, "nginx");
    bad["spec"]["template"]["metadata"]["labels"] = json!({"app": "other"});
    match deps
        .patch(
            "ssa-demo",
            &PatchParams::apply("alice").dry_run().force(),
            &Patch::Apply(bad),
        )
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 422),
        other => panic!("expected 422 Invalid, got {other:?}"),
    }

    // create with dryRun=All persists nothing either
    let cms: Api<ConfigMap> = Api::namespaced(deps.clone().into_client(), "default");
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    cms.create(
        &pp,
        &serde_json::from_value(json!({"metadata": {"name": "dry"}}))?,
    )
    .await?;
    assert!(cms.get_opt("dry").await?.is_none());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizer_blocks_deletion_until_removed() -> Result<()> {
    let sim = start(&["1.26"], 60, 0.0).await?;
    let c = client(&sim.kubeconfig, &name(&sim, 0)).await?;
    let cms: Api<ConfigMap> = Api::namespaced(c, "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}),
        )?,
    )
    .await?;
    cms.delete("held", &DeleteParams::default()).await?;
    let held = cms.get("held").await?;
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "terminating, still present"
    );
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    assert!(
        cms.get_opt("held").await?.is_none(),
        "gone once the finalizer is removed"
    );
    // without finalizers, delete is immediate
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "free"}}))?,
    )
    .await?;
    cms.delete("free", &DeleteParams::default()).await?;
    assert!(cms.get_opt("free").await?.is_none());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_show_through_the_api() -> Result<()> {
    let sim = start(&["1.33"], 80, 0.0).await?;
    let cluster = sim.fleet.clusters[0].clone();
    let c = client(&sim.kubeconfig, &name(&sim, 0)).await?;
    let none = BTreeMap::new();

    // etcd check
    let readyz = |c: Client| async move {
        c.request_text(
            http::Request::get("/readyz/etcd")
                .body(Vec::new())
                .expect("req"),
        )
        .await
    };
    assert_eq!(readyz(c.clone()).await?, "ok");
    world::set_fault(&cluster, "etcd-unhealthy", true, &none)?;
    assert!(readyz(c.clone()).await.is_err());
    world::set_fault(&cluster, "etcd-unhealthy", false, &none)?;

    // node NotReady
    world::set_fault(&cluster, "node-not-ready", true, &none)?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    let worker = nodes.get(&format!("{}-worker-0", cluster.name())).await?;
    let ready = worker
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .context("Ready")?;
    assert_ne!(ready.status, "True");

    // external IPs and a stuck finalizer
    world::set_fault(&cluster, "external-ips", true, &none)?;
    world::set_fault(&cluster, "stuck-finalizer", true, &none)?;
    let svcs: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(c.clone(), "default");
    assert!(
        svcs.get("exposed-debug")
            .await?
            .spec
            .and_then(|s| s.external_ips)
            .is_some()
    );
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    assert!(
        cms.get("legacy-config")
            .await?
            .metadata
            .deletion_timestamp
            .is_some()
    );
    world::set_fault(&cluster, "stuck-finalizer", false, &none)?;
    assert!(cms.get_opt("legacy-config").await?.is_none());

    // overload: some requests rejected with 429/500
    world::set_fault(
        &cluster,
        "overload",
        true,
        &BTreeMap::from([
            ("latency_ms".into(), "1".into()),
            ("error_rate".into(), "0.9".into()),
        ]),
    )?;
    let mut failures = 0;
    for _ in 0..20 {
        if c.apiserver_version().await.is_err() {
            failures += 1;
        }
    }
    assert!(failures > 0);
    world::set_fault(&cluster, "overload", false, &none)?;

    // unreachable: connections dropped
    world::set_fault(&cluster, "unreachable", true, &none)?;
    let fresh = client(&sim.kubeconfig, cluster.name()).await?;
    assert!(fresh.apiserver_version().await.is_err());
    world::set_fault(&cluster, "unreachable", false, &none)?;
    eventually("reachable again", || {
        let fresh = fresh.clone();
        async move { fresh.apiserver_version().await.is_ok() }
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_rollout_progresses() -> Result<()> {
    let sim = start(&["1.31"], 60, 0.0).await?;
    let c = client(&sim.kubeconfig, &name(&sim, 0)).await?;
    let deps: Api<Deployment> = Api::namespaced(c, "default");
    deps.patch("roll", &PatchParams::apply("rel").force(), &Patch::Apply(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "roll", "namespace": "default"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "roll"}},
            "template": {"metadata": {"labels": {"app": "roll"}}, "spec": {"containers": [{"name": "c", "image": "img:1"}]}}}
    }))).await?;
    eventually("rollout complete", || {
        let deps = deps.clone();
        async move {
            let d = deps.get("roll").await.ok();
            let s = d
                .as_ref()
                .and_then(|d| d.status.clone())
                .unwrap_or_default();
            s.observed_generation == Some(1)
                && s.updated_replicas == Some(3)
                && s.available_replicas == Some(3)
        }
    })
    .await
}

/// A rollout to an image that never pulls stalls with one new pod in ImagePullBackOff, whose kubelet says
/// so in its own words; a rollout back to a good image takes that pod away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_never_pulls_leaves_a_pod_in_image_pull_back_off_until_rolled_back()
-> Result<()> {
    let sim = start(&["1.31"], 60, 0.0).await?;
    let c = client(&sim.kubeconfig, &name(&sim, 0)).await?;
    let deps: Api<Deployment> = Api::namespaced(c.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c, "default");
    let apply = |image: &'static str| {
        let deps = deps.clone();
        async move {
            deps.patch("pull", &PatchParams::apply("rel").force(), &Patch::Apply(json!({
                "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "pull", "namespace": "default"},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "pull"}},
                    "template": {"metadata": {"labels": {"app": "pull"}}, "spec": {"containers": [{"name": "c", "image": image}]}}}
            }))).await
        }
    };
    let stuck = |pods: Api<Pod>| async move {
        let list = pods.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("pull-"))
                && p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|c| c.first())
                    .and_then(|c| c.state.as_ref())
                    .and_then(|s| s.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    == Some("ImagePullBackOff")
        })
    };
    apply("unpullable.invalid/pull:2").await?;
    eventually("a pod waiting for its image", || {
        stuck(pods.clone()).map(|p| p.is_some())
    })
    .await?;
    let pod = stuck(pods.clone()).await.context("the stuck pod")?;
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let said = || {
        let (events, pod_name) = (events.clone(), pod_name.clone());
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            Some(
                list.items
                    .into_iter()
                    .filter(|e| e.involved_object.name.as_deref() == Some(pod_name.as_str()))
                    .map(|e| {
                        (
                            e.type_.unwrap_or_default(),
                            e.reason.unwrap_or_default(),
                            e.message.unwrap_or_default(),
                        )
                    })
                    .collect::<Vec<(String, String, String)>>(),
            )
        }
    };
    let all_said = |said: &[(String, String, String)]| {
        let has = |ty: &str, reason: &str, start: &str| {
            said.iter()
                .any(|(t, r, m)| t == ty && r == reason && m.starts_with(start))
        };
        has(
            "Warning",
            "Failed",
            "Failed to pull image \"unpullable.invalid/pull:2\": rpc error: code = NotFound",
        ) && has("Warning", "Failed", "Error: ErrImagePull")
            && has(
                "Normal",
                "BackOff",
                "Back-off pulling image \"unpullable.invalid/pull:2\"",
            )
            && has("Warning", "Failed", "Error: ImagePullBackOff")
    };
    let waited = eventually("the kubelet's words about the pull", || {
        said().map(move |s| s.is_some_and(|s| all_said(&s)))
    })
    .await;
    assert!(waited.is_ok(), "{:#?}", said().await);
    apply("registry.example.com/pull:1").await?;
    eventually("the stuck pod gone", || {
        stuck(pods.clone()).map(|p| p.is_none())
    })
    .await
}

async fn kubectl(kubeconfig: &Path, context: &str, args: &[&str]) -> Result<(bool, String)> {
    let out =
        tokio::process::Command::new(std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into()))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--context")
            .arg(context)
            .args(args)
            .output()
            .await
            .context("running kubectl (install it: apt-get install kubectl, or set KUBECTL)")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures")
        .join(rel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_works_unchanged() -> Result<()> {
    let sim = start(&["1.24", "1.31"], 120, 0.0).await?;
    let (old, new) = (name(&sim, 0), name(&sim, 1));
    let kc = sim.kubeconfig.clone();

    let (ok, out) = kubectl(&kc, &new, &["version", "-o", "json"]).await?;
    assert!(ok, "{out}");
    assert!(out.contains("\"gitVersion\": \"v1.31."), "{out}");

    let (ok, out) = kubectl(&kc, &old, &["api-versions"]).await?;
    assert!(ok, "{out}");
    assert!(out.lines().any(|l| l == "batch/v1beta1"), "{out}");
    let (ok, out) = kubectl(&kc, &new, &["api-versions"]).await?;
    assert!(ok && !out.lines().any(|l| l == "batch/v1beta1"), "{out}");

    let (ok, out) = kubectl(&kc, &new, &["get", "pods", "-A"]).await?;
    assert!(ok, "{out}");
    assert!(
        out.contains("NAMESPACE") && out.contains("coredns-"),
        "{out}"
    );

    let manifest = fixture("manifests/ingress-nginx-HEAD-cloud-deploy.yaml");
    let (ok, out) = kubectl(
        &kc,
        &new,
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "-f",
            manifest.to_str().context("path")?,
        ],
    )
    .await?;
    assert!(ok, "{out}");
    assert!(out.contains("serverside-applied (server dry run)"), "{out}");

    // an old manifest: accepted by 1.24, refused by 1.31 (the API is no longer served)
    let old_cron = fixture("manifests/old-apis/cronjob-v1beta1.yaml");
    let old_cron = old_cron.to_str().context("path")?;
    let (ok, out) = kubectl(
        &kc,
        &old,
        &["apply", "--server-side", "--dry-run=server", "-f", old_cron],
    )
    .await?;
    assert!(ok, "{out}");
    let (ok, out) = kubectl(
        &kc,
        &new,
        &["apply", "--server-side", "--dry-run=server", "-f", old_cron],
    )
    .await?;
    assert!(!ok && out.contains("batch/v1beta1"), "{out}");
    Ok(())
}

#[tokio::test]
async fn a_rate_out_of_range_is_refused_before_anything_starts() {
    for (events, churn, flag) in [
        (f64::INFINITY, 0.0, "--events-per-second"),
        (f64::NAN, 0.0, "--events-per-second"),
        (0.0, -1.0, "--churn"),
        (0.0, f64::INFINITY, "--churn"),
        (1e300, 0.0, "--events-per-second"),
        (1e-300, 0.0, "--events-per-second"),
    ] {
        let cfg = fleet::Config {
            events_per_second: events,
            churn,
            ..Default::default()
        };
        let err = Fleet::start(&cfg, CancellationToken::new())
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(flag), "{events} {churn}: {err}");
    }
}

/// A one-cluster fleet, a client of it, and one of its pods with the pod's name and namespace.
async fn one_cluster_and_a_pod() -> Result<(Sim, Client, Arc<serde_json::Value>, String, String)> {
    let sim = start(&["1.33"], 40, 0.0).await?;
    let c = client(&sim.kubeconfig, &name(&sim, 0)).await?;
    let pod = sim.fleet.clusters[0]
        .store
        .nth(&multipilot_sim::store::ResKey::new("", "pods"), 0)
        .context("a pod")?;
    let s = |k: &str| pod["metadata"][k].as_str().unwrap_or_default().to_string();
    let (pod_name, ns) = (s("name"), s("namespace"));
    Ok((sim, c, pod, pod_name, ns))
}

#[test]
fn a_kubelet_says_what_its_release_says() {
    let pod = json!({
        "metadata": {"name": "web-7d4b9c8f5-x2x9k", "namespace": "shop", "uid": "0b6f-41"},
        "spec": {"containers": [{"name": "web", "image": "registry.example.com/web:2.0.0"}]}
    });
    let image = "Container image \"registry.example.com/web:2.0.0\" already present on machine";
    let backoff =
        "Back-off restarting failed container web in pod web-7d4b9c8f5-x2x9k_shop(0b6f-41)";
    for minor in [24, 25, 26, 31, 32, 33, 35] {
        let said = |reason: &str| world::kubelet_message(minor, &pod, reason, 7);
        let bare = "Back-off restarting failed container";
        assert_eq!(
            said("BackOff"),
            if minor <= 25 { bare } else { backoff },
            "1.{minor}"
        );
        let pulled = match minor {
            33.. => format!("{image} and can be accessed by the pod"),
            _ => image.to_string(),
        };
        assert_eq!(said("Pulled"), pulled, "1.{minor}");
        let created = match minor {
            32.. => "Created container: web",
            _ => "Created container web",
        };
        assert_eq!(said("Created"), created, "1.{minor}");
        assert_eq!(said("Started"), "Started container web");
        assert_eq!(said("Killing"), "Stopping container web");
    }
    // a failing probe: one of four status codes
    let codes: std::collections::BTreeSet<String> = (0..8)
        .map(|n| world::kubelet_message(31, &pod, "Unhealthy", n))
        .collect();
    assert_eq!(
        codes.into_iter().collect::<Vec<_>>(),
        (500..504)
            .map(|c| format!("Readiness probe failed: HTTP probe failed with statuscode: {c}"))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_repeat_their_events_in_each_releases_words() -> Result<()> {
    use k8s_openapi::api::core::v1::Event;
    // no generator or churn of its own: the test makes every occurrence
    let sim = start(&["1.24", "1.33"], 200, 0.0).await?;
    for (i, cluster) in sim.fleet.clusters.iter().enumerate() {
        let c = client(&sim.kubeconfig, &name(&sim, i)).await?;
        let events: Api<Event> = Api::all(c.clone());
        let pods = Api::<Pod>::all(c).list(&ListParams::default()).await?.items;
        let listed = async || -> Result<(usize, i64)> {
            let items = events.list(&ListParams::default()).await?.items;
            Ok((
                items.len(),
                items.iter().map(|e| e.count.unwrap_or(1) as i64).sum(),
            ))
        };
        let (before, counted_before) = listed().await?;
        let occurrences = 4_000;
        for _ in 0..occurrences {
            world::event_once(cluster);
        }
        let (after, counted_after) = listed().await?;
        // every occurrence counted, on an event of its own or as a repeat
        assert_eq!(counted_after - counted_before, occurrences);
        // a pod's reasons have one message each, a failing probe four: at most 7 events a pod
        // (a random part in the messages made ~10 a pod and reason here, ~2,000)
        let new = after - before;
        assert!(
            new <= 7 * pods.len(),
            "{new} new events for {} pods",
            pods.len()
        );
        // each release's words (the pod and the image named in them)
        let items = events.list(&ListParams::default()).await?.items;
        // (repeated: the test's, not the seed's)
        let said = |reason: &str, ok: &dyn Fn(&str) -> bool| {
            let repeated: Vec<&str> = items
                .iter()
                .filter(|e| e.reason.as_deref() == Some(reason) && e.count.unwrap_or(1) > 1)
                .filter_map(|e| e.message.as_deref())
                .collect();
            !repeated.is_empty() && repeated.into_iter().all(ok)
        };
        let old = cluster.settings.profile.minor <= 24;
        assert!(said("BackOff", &|m| match old {
            true => m == "Back-off restarting failed container",
            false =>
                m.starts_with("Back-off restarting failed container ") && m.contains(" in pod "),
        }));
        assert!(said("Pulled", &|m| m.starts_with("Container image \"")
            && m.ends_with(match old {
                true => "\" already present on machine",
                false => "\" already present on machine and can be accessed by the pod",
            })));
        assert!(said("Killing", &|m| m
            .strip_prefix("Stopping container ")
            .is_some_and(|c| pods.iter().any(|p| p
                .spec
                .as_ref()
                .is_some_and(|s| s.containers[0].name == c)))));
        assert!(said("Unhealthy", &|m| m.starts_with(
            "Readiness probe failed: HTTP probe failed with statuscode: 50"
        )));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn similar_events_are_combined_as_the_kubelet_does() -> Result<()> {
    let (sim, c, pod, pod_name, ns) = one_cluster_and_a_pod().await?;
    let cluster = sim.fleet.clusters[0].clone();
    // 25 occurrences of one reason with 25 different messages on one pod
    for i in 0..25 {
        world::event(
            &cluster,
            &pod,
            "Normal",
            "Pulled",
            &format!("Container image pulled in {i}ms"),
            "kubelet",
        );
    }
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c, &ns);
    let mine: Vec<_> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(&pod_name)
                && e.reason.as_deref() == Some("Pulled")
        })
        .collect();
    // the first 9 distinct messages stand alone; the rest went into one combined event counting them
    assert_eq!(mine.len(), 10, "{mine:#?}");
    let combined: Vec<_> = mine
        .iter()
        .filter(|e| {
            e.message
                .as_deref()
                .is_some_and(|m| m.starts_with("(combined from similar events): "))
        })
        .collect();
    assert_eq!(combined.len(), 1);
    assert_eq!(combined[0].count, Some(16));
    assert_eq!(
        combined[0].message.as_deref(),
        Some("(combined from similar events): Container image pulled in 24ms")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_events_are_watched_in_both_event_apis_and_one_written_through_the_api_keeps_counting()
-> Result<()> {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event;
    let (sim, c, pod, pod_name, ns) = one_cluster_and_a_pod().await?;
    let cluster = sim.fleet.clusters[0].clone();
    let new: Api<Event> = Api::namespaced(c.clone(), &ns);
    let core: Api<CoreEvent> = Api::namespaced(c.clone(), &ns);
    let rv = new
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version;
    let rv = rv.context("list resourceVersion")?;
    let mut watch_new = new.watch(&WatchParams::default(), &rv).await?.boxed();
    let mut watch_core = core.watch(&WatchParams::default(), &rv).await?.boxed();
    // one event three times: recorded, then repeated twice (a series from the third)
    let back_off = || {
        world::event(
            &cluster,
            &pod,
            "Warning",
            "BackOff",
            "Back-off restarting failed container",
            "kubelet",
        )
    };
    for _ in 0..3 {
        back_off();
    }
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let got = tokio::time::timeout(Duration::from_secs(10), watch_new.try_next())
            .await
            .context("events.k8s.io watch stalled")??
            .context("watch ended")?;
        match got {
            WatchEvent::Added(e) | WatchEvent::Modified(e)
                if e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&pod_name) =>
            {
                seen.push(e)
            }
            _ => {}
        }
    }
    let last = &seen[2];
    assert_eq!(last.reason.as_deref(), Some("BackOff"));
    assert_eq!(
        last.note.as_deref(),
        Some("Back-off restarting failed container")
    );
    assert_eq!(last.deprecated_count, Some(3));
    assert_eq!(last.series.as_ref().map(|s| s.count), Some(3));
    assert_eq!(last.reporting_controller.as_deref(), Some("kubelet"));
    assert!(seen[0].series.is_none() && seen[0].deprecated_count == Some(1));
    let name = last.metadata.name.clone().context("event name")?;
    let mut core_seen = Vec::new();
    while core_seen.len() < 3 {
        let got = tokio::time::timeout(Duration::from_secs(10), watch_core.try_next())
            .await
            .context("v1 watch stalled")??
            .context("watch ended")?;
        if let WatchEvent::Added(e) | WatchEvent::Modified(e) = got
            && e.metadata.name.as_deref() == Some(&name)
        {
            core_seen.push(e);
        }
    }
    assert_eq!(core_seen[2].count, Some(3));
    assert_eq!(
        core_seen[2].involved_object.name.as_deref(),
        Some(pod_name.as_str())
    );
    // the same event read back by name, and changed through the API: the kubelet's next repeat counts on
    let got = core.get(&name).await?;
    assert_eq!(got.count, Some(3));
    core.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"team": "shop"}}})),
    )
    .await?;
    back_off();
    let got = core.get(&name).await?;
    assert_eq!(got.count, Some(4));
    // kubectl sorts by a field of the object, which the table rows carry when asked (includeObject=Object);
    // the event's name is a wide column, as the API server has it
    let (ok, out) = kubectl(
        &sim.kubeconfig,
        sim.fleet.clusters[0].name(),
        &[
            "get",
            "events",
            "-n",
            &ns,
            "--sort-by=.lastTimestamp",
            "-o",
            "wide",
        ],
    )
    .await?;
    assert!(ok && out.contains(&name), "{out}");
    assert_eq!(got.series.as_ref().and_then(|s| s.count), Some(4));
    assert_eq!(
        got.metadata
            .annotations
            .unwrap_or_default()
            .get("team")
            .map(String::as_str),
        Some("shop"),
        "a repeat keeps what the API wrote"
    );
    Ok(())
}

/// The `managedFields` entries of an object as (manager, operation, subresource, fieldsV1).
fn managed_fields(obj: &serde_json::Value) -> Vec<(String, String, String, serde_json::Value)> {
    obj.pointer("/metadata/managedFields")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (
                s("manager"),
                s("operation"),
                s("subresource"),
                e["fieldsV1"].clone(),
            )
        })
        .collect()
}

/// Who owns `.spec.replicas`, as (manager, operation, subresource).
fn replicas_owners(obj: &serde_json::Value) -> Vec<(String, String, String)> {
    managed_fields(obj)
        .into_iter()
        .filter(|(.., f)| f.pointer("/f:spec/f:replicas").is_some())
        .map(|(m, o, s, _)| (m, o, s))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scale_goes_through_the_scale_subresource() -> Result<()> {
    let sim = start(&["1.31"], 60, 0.0).await?;
    let ctx = name(&sim, 0);
    let kc = sim.kubeconfig.clone();
    let c = client(&kc, &ctx).await?;
    let deps: Api<Deployment> = Api::namespaced(c.clone(), "default");
    deps.patch(
        "web",
        &PatchParams::apply("release"),
        &Patch::Apply(json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web", "tier": "front"}},
                "template": {"metadata": {"labels": {"app": "web", "tier": "front"}},
                    "spec": {"containers": [{"name": "web", "image": "registry.example.com/web:1.0.0"}]}}}
        })),
    )
    .await?;
    let get = async |jsonpath: &str| -> Result<String> {
        let (ok, out) = kubectl(
            &kc,
            &ctx,
            &[
                "-n",
                "default",
                "get",
                "deploy/web",
                "-o",
                &format!("jsonpath={jsonpath}"),
            ],
        )
        .await?;
        anyhow::ensure!(ok, "{out}");
        Ok(out)
    };
    let status = "{.spec.replicas} {.status.replicas} {.status.updatedReplicas} {.status.readyReplicas} {.metadata.generation} {.status.observedGeneration}";
    eventually("the first rollout completes", || async {
        get(status).await.is_ok_and(|s| s == "3 3 3 3 1 1")
    })
    .await?;

    // the Scale as the apiserver serves it
    let (ok, out) = kubectl(
        &kc,
        &ctx,
        &[
            "get",
            "--raw",
            "/apis/apps/v1/namespaces/default/deployments/web/scale",
        ],
    )
    .await?;
    assert!(ok, "{out}");
    let scale: serde_json::Value = serde_json::from_str(&out)?;
    let web = deps.get("web").await?;
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["apiVersion"], "autoscaling/v1");
    assert_eq!(scale["metadata"]["name"], "web");
    assert_eq!(scale["metadata"]["namespace"], "default");
    assert_eq!(
        scale["metadata"]["uid"].as_str(),
        web.metadata.uid.as_deref()
    );
    assert_eq!(
        scale["metadata"]["resourceVersion"].as_str(),
        web.metadata.resource_version.as_deref()
    );
    assert_eq!(scale["spec"], json!({"replicas": 3}));
    assert_eq!(
        scale["status"],
        json!({"replicas": 3, "selector": "app=web,tier=front"})
    );

    // kubectl scale: a merge patch of the Scale, recorded under the User-Agent's manager
    let mut watch = deps
        .watch(
            &WatchParams::default().fields("metadata.name=web"),
            web.metadata.resource_version.as_deref().unwrap_or("0"),
        )
        .await?
        .boxed();
    let (ok, out) = kubectl(
        &kc,
        &ctx,
        &["-n", "default", "scale", "deploy/web", "--replicas=5"],
    )
    .await?;
    assert!(ok, "{out}");
    assert!(out.contains("deployment.apps/web scaled"), "{out}");
    // a watcher sees the change
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = watch.try_next().await? {
            if let WatchEvent::Modified(d) = ev
                && d.spec.replicas == Some(5)
            {
                return Ok::<_, anyhow::Error>(d);
            }
        }
        anyhow::bail!("the watch ended")
    })
    .await
    .context("no MODIFIED event with 5 replicas")??;
    assert_eq!(seen.metadata.generation, Some(2));
    // the controller scales the pods it has (same template: no new rollout)
    eventually("the scale reconciles to 5 replicas", || async {
        get(status).await.is_ok_and(|s| s == "5 5 5 5 2 2")
    })
    .await?;
    let web = serde_json::to_value(deps.get("web").await?)?;
    assert_eq!(
        replicas_owners(&web),
        vec![("kubectl".into(), "Update".into(), "scale".into())],
        "{:#?}",
        managed_fields(&web)
    );
    let kubectl_entry = managed_fields(&web)
        .into_iter()
        .find(|(m, ..)| m == "kubectl")
        .context("kubectl's entry")?;
    assert_eq!(kubectl_entry.3, json!({"f:spec": {"f:replicas": {}}}));
    assert_eq!(
        web.pointer("/metadata/managedFields")
            .and_then(|l| l.as_array())
            .and_then(|l| l.iter().find(|e| e["manager"] == "kubectl"))
            .map(|e| e["apiVersion"].clone()),
        Some(json!("apps/v1"))
    );
    // the applier keeps its other fields
    assert!(
        managed_fields(&web)
            .iter()
            .any(|(m, o, s, f)| m == "release"
                && o == "Apply"
                && s.is_empty()
                && f.pointer("/f:spec/f:template").is_some())
    );

    // a PATCH with its own fieldManager takes the field from kubectl
    let scaled = deps
        .patch_scale(
            "web",
            &PatchParams {
                field_manager: Some("canary-controller".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await?;
    assert_eq!(scaled.spec.as_ref().and_then(|s| s.replicas), Some(2));
    let web = serde_json::to_value(deps.get("web").await?)?;
    assert_eq!(
        replicas_owners(&web),
        vec![("canary-controller".into(), "Update".into(), "scale".into())],
        "{:#?}",
        managed_fields(&web)
    );
    assert!(
        !managed_fields(&web).iter().any(|(m, ..)| m == "kubectl"),
        "kubectl owns nothing any more: {:#?}",
        managed_fields(&web)
    );
    assert_eq!(web["metadata"]["generation"], 3);

    // a JSON patch, and the same value again: no write, no generation
    let req = http::Request::patch("/apis/apps/v1/namespaces/default/deployments/web/scale")
        .header("content-type", "application/json-patch+json")
        .body(serde_json::to_vec(
            &json!([{"op": "replace", "path": "/spec/replicas", "value": 2}]),
        )?)?;
    let patched: serde_json::Value = serde_json::from_str(&c.request_text(req).await?)?;
    assert_eq!(patched["spec"]["replicas"], 2);
    let again = deps.get("web").await?;
    assert_eq!(again.metadata.generation, Some(3));
    assert_eq!(
        again.metadata.resource_version.as_deref(),
        web["metadata"]["resourceVersion"].as_str()
    );

    // PUT with a stale resourceVersion: 409 as for the object itself; with the current one it goes through
    let mut stale = deps.get_scale("web").await?;
    let current_rv = stale.metadata.resource_version.clone();
    stale.metadata.resource_version = Some("1".into());
    stale.spec.get_or_insert_default().replicas = Some(4);
    match deps
        .replace_scale("web", &PostParams::default(), &stale)
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
            assert!(
                s.message
                    .contains("Operation cannot be fulfilled on deployments.apps \"web\""),
                "{}",
                s.message
            );
        }
        other => anyhow::bail!("a stale PUT was not refused: {other:?}"),
    }
    stale.metadata.resource_version = current_rv;
    let hpa = PostParams {
        field_manager: Some("hpa".into()),
        ..Default::default()
    };
    let put = deps.replace_scale("web", &hpa, &stale).await?;
    assert_eq!(put.spec.and_then(|s| s.replicas), Some(4));

    // server-side apply of a Scale: conflicts with the owner of the replicas unless forced
    let scale_of = |n: i32| json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "web"}, "spec": {"replicas": n}});
    match deps
        .patch_scale(
            "web",
            &PatchParams::apply("scaler"),
            &Patch::Apply(scale_of(7)),
        )
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 409);
            assert!(
                s.message
                    .contains(r#"conflict with "hpa" with subresource "scale": .spec.replicas"#),
                "{}",
                s.message
            );
        }
        other => anyhow::bail!("an apply over another owner's replicas went through: {other:?}"),
    }
    deps.patch_scale(
        "web",
        &PatchParams::apply("scaler").force(),
        &Patch::Apply(scale_of(7)),
    )
    .await?;
    let web = serde_json::to_value(deps.get("web").await?)?;
    assert_eq!(web["spec"]["replicas"], 7);
    assert_eq!(
        replicas_owners(&web),
        vec![("scaler".into(), "Apply".into(), "scale".into())],
        "{:#?}",
        managed_fields(&web)
    );

    // negative replicas are invalid; dry-run changes nothing
    match deps
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": -1}})),
        )
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422);
            assert!(
                s.message
                    .starts_with("Scale.autoscaling \"web\" is invalid: spec.replicas"),
                "{}",
                s.message
            );
        }
        other => anyhow::bail!("-1 replicas accepted: {other:?}"),
    }
    let dry = deps
        .patch_scale(
            "web",
            &PatchParams::default().dry_run(),
            &Patch::Merge(json!({"spec": {"replicas": 9}})),
        )
        .await?;
    assert_eq!(dry.spec.and_then(|s| s.replicas), Some(9));
    assert_eq!(deps.get("web").await?.spec.replicas, Some(7));

    // kubectl's precondition path (GET the Scale, then PUT it), and a StatefulSet
    let (ok, out) = kubectl(
        &kc,
        &ctx,
        &[
            "-n",
            "default",
            "scale",
            "deploy/web",
            "--current-replicas=7",
            "--replicas=6",
        ],
    )
    .await?;
    assert!(ok, "{out}");
    eventually("the second scale reconciles", || async {
        get("{.spec.replicas} {.status.readyReplicas}")
            .await
            .is_ok_and(|s| s == "6 6")
    })
    .await?;
    let (ok, out) = kubectl(
        &kc,
        &ctx,
        &[
            "-n",
            "default",
            "scale",
            "deploy/web",
            "--current-replicas=3",
            "--replicas=1",
        ],
    )
    .await?;
    assert!(
        !ok && out.contains("Expected replicas to be 3, was 6"),
        "{out}"
    );
    let (ok, out) = kubectl(
        &kc,
        &ctx,
        &[
            "-n",
            "monitoring",
            "scale",
            "statefulset/prometheus",
            "--replicas=3",
        ],
    )
    .await?;
    assert!(ok, "{out}");
    let (ok, out) = kubectl(
        &kc,
        &ctx,
        &[
            "-n",
            "monitoring",
            "get",
            "statefulset/prometheus",
            "-o",
            "jsonpath={.spec.replicas} {.metadata.generation}",
        ],
    )
    .await?;
    assert!(ok && out == "3 2", "{out}");
    Ok(())
}

/// The samples of `name` in a scrape body, by their label set.
fn samples(body: &str, name: &str) -> BTreeMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let labels = series.strip_prefix(name)?.strip_prefix('{')?;
            Some((
                labels.trim_end_matches('}').to_string(),
                value.parse().ok()?,
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_counters_follow_the_image_through_the_service_proxy() -> Result<()> {
    let sim = start(&["1.31"], 300, 0.0).await?;
    let c = client(&sim.kubeconfig, &name(&sim, 0)).await?;
    let scrape = async |ns: &str, svc: &str| -> Result<String> {
        let req = http::Request::get(format!(
            "/api/v1/namespaces/{ns}/services/{svc}/proxy/metrics"
        ))
        .body(Vec::new())?;
        Ok(c.request_text(req).await?)
    };

    // the seeded demo: the team namespaces' `web` Services are annotated, and their scrape has requests
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(c.clone(), "payments");
    let web = services.get("web").await?;
    let annotations = web.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("prometheus.io/scrape").map(String::as_str),
        Some("true")
    );
    let port = annotations
        .get("prometheus.io/port")
        .context("a port annotation")?;
    let body = scrape("payments", &format!("web:{port}")).await?;
    let seeded = samples(&body, "http_requests_total");
    assert!(
        seeded.contains_key(r#"namespace="payments",deployment="web",code="200""#)
            && seeded.contains_key(r#"namespace="payments",deployment="web",code="500""#),
        "{body}"
    );
    assert!(
        body.contains("# TYPE http_request_duration_seconds histogram"),
        "{body}"
    );

    // a release of our own: a Deployment and the annotated Service that selects it
    let deps: Api<Deployment> = Api::namespaced(c.clone(), "default");
    let release = |image: &str| {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "shop", "namespace": "default"},
            "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "shop"}},
                "template": {"metadata": {"labels": {"app": "shop"}},
                    "spec": {"containers": [{"name": "shop", "image": image}]}}}
        })
    };
    deps.patch(
        "shop",
        &PatchParams::apply("release"),
        &Patch::Apply(release("registry.example.com/shop:1.0.0")),
    )
    .await?;
    let svc: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(c.clone(), "default");
    svc.patch(
        "shop",
        &PatchParams::apply("release"),
        &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "shop", "namespace": "default", "labels": {"app.kubernetes.io/name": "shop"},
                "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "80"}},
            "spec": {"selector": {"app": "shop"}, "ports": [{"name": "http", "port": 80}]}
        })),
    )
    .await?;
    let rolled_out = async |image: &str| -> bool {
        deps.get("shop").await.is_ok_and(|d| {
            let s = d.status.unwrap_or_default();
            let tpl = d
                .spec
                .template
                .spec
                .map(|s| s.containers[0].image.clone().unwrap_or_default());
            tpl.as_deref() == Some(image)
                && s.observed_generation == d.metadata.generation
                && s.updated_replicas == Some(4)
                && s.ready_replicas == Some(4)
        })
    };
    eventually("1.0.0 rolled out", || {
        rolled_out("registry.example.com/shop:1.0.0")
    })
    .await?;

    let (ok_key, err_key) = (
        r#"namespace="default",deployment="shop",code="200""#,
        r#"namespace="default",deployment="shop",code="500""#,
    );
    let mut last = (0.0, 0.0);
    // every scrape: both counters present and never lower than before
    let mut read = async || -> Result<(f64, f64)> {
        let body = scrape("default", "shop:80").await?;
        let s = samples(&body, "http_requests_total");
        let now = (
            *s.get(ok_key).context("200 counter")?,
            *s.get(err_key).context("500 counter")?,
        );
        anyhow::ensure!(
            now.0 >= last.0 && now.1 >= last.1,
            "counters went back: {last:?} → {now:?}"
        );
        last = now;
        Ok(now)
    };
    // the share of errors among requests served between two scrapes at least `n` requests apart
    let mut window = async |n: f64| -> Result<f64> {
        let start = read().await?;
        let mut end = start;
        multipilot_testkit::wait::until("requests served", 30, async || {
            end = read().await?;
            Ok((end.0 + end.1 - start.0 - start.1 >= n).then_some(()))
        })
        .await?;
        Ok((end.1 - start.1) / (end.0 + end.1 - start.0 - start.1))
    };
    let before = window(200.0).await?;
    assert!(before < 0.02, "1.0.0 fails {before}");

    // 2.0.0-errors30: the rollout stays healthy, and three in ten requests fail once it is done
    deps.patch(
        "shop",
        &PatchParams::apply("release"),
        &Patch::Apply(release("registry.example.com/shop:2.0.0-errors30")),
    )
    .await?;
    eventually("2.0.0 rolled out", || {
        rolled_out("registry.example.com/shop:2.0.0-errors30")
    })
    .await?;
    let after = window(400.0).await?;
    assert!(
        (0.25..0.35).contains(&after),
        "2.0.0-errors30 fails {after}"
    );

    // rolled back: counters keep growing, and the errors go
    deps.patch(
        "shop",
        &PatchParams::apply("release"),
        &Patch::Apply(release("registry.example.com/shop:1.0.0")),
    )
    .await?;
    eventually("1.0.0 back", || {
        rolled_out("registry.example.com/shop:1.0.0")
    })
    .await?;
    let back = window(200.0).await?;
    assert!(back < 0.02, "1.0.0 fails {back} after the rollback");

    // a Service selecting no Deployment has no endpoints
    svc.patch(
        "nothing",
        &PatchParams::apply("release"),
        &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "nothing", "namespace": "default"},
            "spec": {"selector": {"app": "nothing"}, "ports": [{"port": 80}]}
        })),
    )
    .await?;
    // (kubectl, which does not retry a 503 as kube-rs' client does)
    let (ok, out) = kubectl(
        &sim.kubeconfig,
        &name(&sim, 0),
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/services/nothing:80/proxy/metrics",
        ],
    )
    .await?;
    assert!(
        !ok && out.contains("no endpoints available for service \"nothing\""),
        "{out}"
    );
    Ok(())
}
