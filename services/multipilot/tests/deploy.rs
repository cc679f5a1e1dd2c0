//! The deployment drill: the shipped manifests install and start, as an operator would use them.
//!
//! - Every kustomize base and example overlay renders with `kubectl kustomize`, and every object is accepted
//!   by `kubectl apply --server-side --dry-run=server` against the simulator at the oldest (1.24) and the
//!   newest (1.35) supported Kubernetes version.
//! - The small-fleet example (a 3-node NATS cluster and the all-in-one hub), with the Secrets
//!   `deploy/examples/secrets.sh` makes, and an agent onboarded with `multipilot cluster add` (its own bus
//!   user, Secret and overlay), all in a copy of `deploy/` as an operator's repository, are started as a
//!   node would start them (testkit's `kubelet`: a network
//!   namespace per pod, volumes at their real paths, read-only roots, the service-account files): every pod
//!   becomes ready on its own readiness probe, every Service's targetPort reaches a listener, and the path
//!   agent → NATS → hub comes alive: the console answers through its Service with the onboarded cluster.
//! - The fleet rules, in both hub layouts and in compose: the TSDB, asked through its Service with a viewer's
//!   token, lists the shipped rule groups of `deploy/rules` (loaded from the mounted ConfigMap) and the
//!   operator's own file added as the README says, every rule evaluated without error; the own rule's alert,
//!   fired over the agent's metrics, reaches the alert router with the TSDB's token, rendered.
//! - No workload keeps the bare name of a ConfigMap the render gave a hashed name (a reference kustomize did
//!   not rewrite).
//! - An agent overlay missing its Secret does not start, and says which Secret is missing.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use multipilot_kubelet::compose;
use multipilot_kubelet::{ApiServer, Manifests, Node, Options};
use tokio_util::sync::CancellationToken;

fn root() -> PathBuf {
    common::root()
}

/// Every kustomization under `deploy/` that renders on its own (components are applied through others).
fn kustomizations() -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![root().join("deploy")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == "kustomization.yaml") {
                let text = std::fs::read_to_string(&p)?;
                if !text.contains("kind: Component") {
                    out.push(dir.clone());
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

fn kubectl(kubeconfig: &Path, context: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
    use std::io::Write as _;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--context")
        .arg(context)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("kubectl")?;
    if let Some(s) = stdin {
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(s.as_bytes())?;
    }
    drop(child.stdin.take());
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kubectl {} on {context}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

struct Sim {
    fleet: Arc<multipilot_sim::fleet::Fleet>,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
    _cancel: tokio_util::sync::DropGuard,
}

async fn simulator(
    names: &[&str],
    versions: &[&str],
    listen_host: std::net::IpAddr,
) -> Result<Sim> {
    let cfg = multipilot_sim::fleet::Config {
        clusters: names.len(),
        versions: versions.iter().map(|v| v.to_string()).collect(),
        names: names.iter().map(|v| v.to_string()).collect(),
        objects: 60,
        churn: 0.5,
        listen_host,
        ..Default::default()
    };
    let cancel = CancellationToken::new();
    let fleet = Arc::new(multipilot_sim::fleet::Fleet::start(&cfg, cancel.clone()).await?);
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig.yaml");
    fleet.write_kubeconfig(&kubeconfig)?;
    Ok(Sim {
        fleet,
        kubeconfig,
        _dir: dir,
        _cancel: cancel.drop_guard(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_overlay_renders_and_the_oldest_and_newest_apiservers_accept_every_object()
-> Result<()> {
    let dirs = kustomizations()?;
    for want in [
        "deploy/k8s/nats",
        "deploy/k8s/hub",
        "deploy/k8s/hub-roles",
        "deploy/k8s/agent",
    ] {
        ensure!(
            dirs.iter().any(|d| d.ends_with(want)),
            "{want} is not a kustomization (found {dirs:?})"
        );
    }
    ensure!(
        dirs.iter()
            .filter(|d| d.starts_with(root().join("deploy/examples")))
            .count()
            >= 2,
        "fewer than two example overlays: {dirs:?}"
    );
    let sim = simulator(
        &["oldest", "newest"],
        &["1.24", "1.35"],
        [127, 0, 0, 1].into(),
    )
    .await?;
    for dir in &dirs {
        let rendered = Manifests::render(dir)?;
        ensure!(
            !rendered.objects.is_empty(),
            "{} renders nothing",
            dir.display()
        );
        let stale = unrewritten_config_map_refs(&rendered);
        ensure!(
            stale.is_empty(),
            "{}: workloads mount ConfigMaps by their unhashed name: {stale:?}",
            dir.display()
        );
        let yaml = rendered.to_yaml()?;
        for ctx in ["oldest", "newest"] {
            // Namespaces first, for real (a dry-run can't create what the namespaced objects live in), then
            // everything as a server-side dry run.
            let namespaces = Manifests {
                objects: rendered.of_kind("Namespace").cloned().collect(),
            };
            if !namespaces.objects.is_empty() {
                kubectl(
                    &sim.kubeconfig,
                    ctx,
                    &["apply", "--server-side", "-f", "-"],
                    Some(&namespaces.to_yaml()?),
                )?;
            }
            for ns in rendered
                .objects
                .iter()
                .filter_map(|o| o["metadata"]["namespace"].as_str())
                .collect::<std::collections::BTreeSet<_>>()
            {
                if namespaces.get("Namespace", "default", ns).is_none() {
                    // a namespace the overlay expects to exist (made by another base): create it
                    let _ = kubectl(&sim.kubeconfig, ctx, &["create", "namespace", ns], None);
                }
            }
            let out = kubectl(
                &sim.kubeconfig,
                ctx,
                &["apply", "--server-side", "--dry-run=server", "-f", "-"],
                Some(&yaml),
            )
            .with_context(|| format!("{} on {ctx}", dir.display()))?;
            let accepted = out
                .lines()
                .filter(|l| l.contains("(server dry run)"))
                .count();
            ensure!(
                accepted == rendered.objects.len(),
                "{} on {ctx}: {accepted} of {} objects accepted:\n{out}",
                dir.display(),
                rendered.objects.len()
            );
        }
        eprintln!(
            "{}: {} objects accepted by 1.24 and 1.35",
            dir.strip_prefix(root())?.display(),
            rendered.objects.len()
        );
    }
    drop(sim.fleet);
    Ok(())
}

/// `(workload, ConfigMap)` for each ConfigMap a pod template mounts by a name the render only has with a
/// generator's hash suffix: a reference kustomize did not rewrite (the pod would wait for a ConfigMap that
/// never exists). A name the render lacks altogether belongs to another base and is not judged here.
fn unrewritten_config_map_refs(rendered: &Manifests) -> Vec<(String, String)> {
    let names: Vec<&str> = rendered
        .of_kind("ConfigMap")
        .filter_map(|c| c["metadata"]["name"].as_str())
        .collect();
    let hashed_only = |n: &str| {
        !names.contains(&n)
            && names.iter().any(|c| {
                c.strip_prefix(n)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|h| h.len() == 10 && h.chars().all(|x| x.is_ascii_alphanumeric()))
            })
    };
    let mut out = Vec::new();
    for o in &rendered.objects {
        let Some(volumes) = o["spec"]["template"]["spec"]["volumes"].as_array() else {
            continue;
        };
        let workload = o["metadata"]["name"].as_str().unwrap_or_default();
        for v in volumes {
            let projected = v["projected"]["sources"].as_array().into_iter().flatten();
            for cm in std::iter::once(&v["configMap"]).chain(projected.map(|s| &s["configMap"])) {
                if let Some(n) = cm["name"].as_str()
                    && hashed_only(n)
                {
                    out.push((workload.to_string(), n.to_string()));
                }
            }
        }
    }
    out
}

/// `deploy/examples/secrets.sh`, as the README tells an operator to run it.
fn secrets(args: &[&str]) -> Result<()> {
    let out = Command::new(root().join("deploy/examples/secrets.sh"))
        .args(args)
        .output()
        .context("deploy/examples/secrets.sh")?;
    ensure!(
        out.status.success(),
        "secrets.sh {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Every Secret manifest in `dir`.
fn secret_manifests(dir: &Path) -> Result<Manifests> {
    let mut all = Manifests::default();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        all.extend(Manifests::parse(&std::fs::read_to_string(&p)?)?);
    }
    Ok(all)
}

/// A node running `manifests` with this build's binaries standing in for the images.
fn node_for(manifests: Manifests) -> Result<Node> {
    Node::new(
        manifests,
        Options {
            binaries: binaries()?,
            apiserver: None,
        },
    )
}

fn binaries() -> Result<BTreeMap<String, PathBuf>> {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_multipilot"))
        .parent()
        .context("bin dir")?
        .to_path_buf();
    ensure!(
        bin_dir.join("multipilot-agent").is_file(),
        "multipilot-agent is not built in {}: run `cargo build --bins` first (./scripts/test does)",
        bin_dir.display()
    );
    Ok(BTreeMap::from([
        ("multipilot".to_string(), bin_dir.join("multipilot")),
        (
            "multipilot-agent".to_string(),
            bin_dir.join("multipilot-agent"),
        ),
        (
            "nats-server".to_string(),
            multipilot_testkit::nats_server_bin()?,
        ),
    ]))
}

/// A hub example and one onboarded cluster, running on an emulated node: the README's steps in a copy of
/// `deploy/` (the operator's repository): the hub's Secrets (the NATS certificate also names the address
/// agents reach the bus by), the operator's overlay `deploy/site/hub` on the example with a rule file of
/// their own merged into the rules ConfigMap, then `multipilot cluster add`, which mints the agent's bus user
/// and writes its Secret and overlay. Every pod becomes ready and every Service reaches a listener.
struct Onboarded {
    node: Node,
    _live: tokio::sync::MutexGuard<'static, ()>,
    /// The viewer's token from `secrets/material/api-tokens.plain.yaml`.
    viewer: String,
    _sim: Sim,
    _site: tempfile::TempDir,
}

/// One emulated fleet at a time: each is a dozen processes, and the machine has two cores.
static LIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn onboard(example: &str) -> Result<Onboarded> {
    Node::preflight()?;
    let live = LIVE.lock().await;
    let site = tempfile::tempdir()?;
    let status = Command::new("cp")
        .arg("-r")
        .arg(root().join("deploy"))
        .arg(site.path())
        .status()?;
    ensure!(status.success(), "copying deploy/");
    let out = site.path().join("secrets");
    let out_s = out.to_str().context("utf-8 path")?;
    let status = Command::new(site.path().join("deploy/examples/secrets.sh"))
        .args(["hub", out_s, "nats.multipilot.example.com"])
        .status()?;
    ensure!(status.success(), "secrets.sh hub");
    let added = Command::new(env!("CARGO_BIN_EXE_multipilot"))
        .args([
            "cluster",
            "add",
            CLUSTER,
            "--label",
            "env=staging",
            "--label",
            "region=eu-central-1",
            "--secrets-dir",
            "secrets",
            "--nats-url",
            "nats://nats.multipilot.example.com:4222",
        ])
        .current_dir(site.path())
        .output()?;
    ensure!(
        added.status.success(),
        "cluster add: {}",
        String::from_utf8_lossy(&added.stderr)
    );
    // the operator's overlay on the example, as the README's steps 2 and 6 write it
    let hub = site.path().join("deploy/site/hub");
    std::fs::create_dir_all(&hub)?;
    std::fs::write(hub.join(OWN_RULES_FILE), OWN_RULES)?;
    std::fs::write(
        hub.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [../../examples/{example}]\nconfigMapGenerator:\n  \
             - {{name: multipilot-rules, behavior: merge, files: [{OWN_RULES_FILE}]}}\n"
        ),
    )?;
    let mut manifests = Manifests::render(&hub)?;
    manifests.extend(secret_manifests(&out.join("hub"))?);
    manifests.extend(Manifests::render(
        &site.path().join("deploy/site/agents").join(CLUSTER),
    )?);
    manifests.extend(secret_manifests(&out.join(format!("agent-{CLUSTER}")))?);

    let mut node = node_for(manifests)?;
    // the workload cluster: a simulated apiserver the agent reaches through its service account
    let sim = simulator(&[CLUSTER], &["1.35"], node.gateway().into()).await?;
    let cluster = sim.fleet.get(CLUSTER).context("the simulated cluster")?;
    node.set_apiserver(ApiServer {
        host: node.gateway(),
        port: cluster.addr.get().context("sim address")?.port(),
        token: cluster.token.clone(),
        ca_pem: cluster
            .pki
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ca_pem()
            .to_string(),
    });
    // the hub's NATS as the workload cluster reaches it (a load balancer and its DNS name)
    node.alias("nats.multipilot.example.com", "multipilot-hub", "nats");
    node.start().await?;
    node.wait_all_ready(Duration::from_secs(240)).await?;
    for (pod, _) in node.pods() {
        eprintln!("{example}: ready: {pod} (restarts {})", node.restarts(&pod));
    }
    for line in node.check_services().await? {
        eprintln!("{example}: service: {line}");
    }
    let tokens: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(
        out.join("material/api-tokens.plain.yaml"),
    )?)?;
    let viewer = tokens
        .as_array()
        .and_then(|t| t.iter().find(|t| t["role"] == "viewer"))
        .and_then(|t| t["token"].as_str())
        .context("viewer token")?
        .to_string();
    Ok(Onboarded {
        node,
        _live: live,
        viewer,
        _sim: sim,
        _site: site,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_small_fleet_and_an_onboarded_agent_start_from_their_manifests_and_the_console_shows_the_cluster()
-> Result<()> {
    // bound whole: its simulated cluster, scratch files and turn live as long as the test
    let fleet = onboard("small-fleet").await?;
    let (node, viewer) = (&fleet.node, &fleet.viewer);

    // agent → NATS → hub: the console, through its Service, shows the onboarded cluster with its labels and facts
    let console = node.service_addr("multipilot-hub", "multipilot-console", 9468)?;
    let http = reqwest::Client::new();
    let refused = http
        .get(format!("http://{console}/api/v1/clusters"))
        .send()
        .await?;
    ensure!(
        refused.status().as_u16() == 401,
        "no token: {}",
        refused.status()
    );
    let clusters = common::eventually("the onboarded cluster in the console", 120, async || {
        let v = get_json(&http, &format!("http://{console}/api/v1/clusters"), viewer).await?;
        let found = v
            .as_array()
            .or_else(|| v["clusters"].as_array())?
            .iter()
            .any(|c| {
                c["name"] == CLUSTER
                    && c["labels"]["env"] == "staging"
                    && c["version"].as_str().is_some_and(|s| s.contains("1.35"))
            });
        found.then_some(v)
    })
    .await
    .with_context(|| {
        format!(
            "hub log:\n{}\nagent log:\n{}",
            tail(node, "multipilot-hub-0"),
            tail(node, "multipilot-agent-0pod")
        )
    })?;
    eprintln!("console: {clusters}");

    // Every exposed API takes the same tokens: the TSDB (Grafana's data source) and the alert router
    // (amtool, silences) refuse strangers; a viewer reads, only an operator silences.
    let tsdb = node.service_addr("multipilot-hub", "multipilot-tsdb", 9466)?;
    let query = format!("http://{tsdb}/api/v1/query?query=count(kube_pod_info)");
    ensure!(http.get(&query).send().await?.status().as_u16() == 401);
    ensure!(
        http.get(&query)
            .bearer_auth(viewer)
            .send()
            .await?
            .status()
            .is_success()
    );
    // the console's capacity charts query the TSDB with its own token
    let capacity = http
        .get(format!("http://{console}/api/v1/capacity"))
        .bearer_auth(viewer)
        .send()
        .await?;
    ensure!(
        capacity.status().is_success(),
        "capacity: {} {}",
        capacity.status(),
        capacity.text().await?
    );
    let alerts = node.service_addr("multipilot-hub", "multipilot-alerts", 9467)?;
    // The fleet rules: loaded from the mounted ConfigMap, evaluated, their alerts taken by the router.
    let rules = rules_evaluated(&http, &tsdb.to_string(), viewer)
        .await
        .with_context(|| format!("hub log:\n{}", tail(node, "multipilot-hub-0")))?;
    own_alert_delivered(&http, &alerts.to_string(), viewer, &rules, CLUSTER)
        .await
        .with_context(|| format!("hub log:\n{}", tail(node, "multipilot-hub-0")))?;
    no_refused_alerts(node, "multipilot-hub-0")?;
    let silence = serde_json::json!({
        "matchers": [{"name": "cluster", "value": CLUSTER, "isRegex": false}],
        "endsAt": "2099-01-01T00:00:00Z", "createdBy": "drill", "comment": "everything of one cluster"
    });
    let silences = format!("http://{alerts}/api/v2/silences");
    ensure!(
        http.post(&silences)
            .json(&silence)
            .send()
            .await?
            .status()
            .as_u16()
            == 401
    );
    ensure!(
        http.post(&silences)
            .json(&silence)
            .bearer_auth(viewer)
            .send()
            .await?
            .status()
            .as_u16()
            == 403
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scaled_hub_starts_with_its_partitions_and_any_tsdb_answers_for_the_onboarded_cluster()
-> Result<()> {
    // one workload per role under its own NATS user, the correlator and the TSDB in 2 partitions each,
    // NATS mapping agent subjects to partitions inside the FLEET account
    // bound whole: its simulated cluster, scratch files and turn live as long as the test
    let fleet = onboard("scaled-hub").await?;
    let (node, viewer) = (&fleet.node, &fleet.viewer);
    let http = reqwest::Client::new();
    let console = node.service_addr("multipilot-hub", "multipilot-console", 9468)?;
    common::eventually(
        "the onboarded cluster in the scaled hub's console",
        120,
        async || {
            let v = get_json(&http, &format!("http://{console}/api/v1/clusters"), viewer).await?;
            v.as_array()?
                .iter()
                .any(|c| c["name"] == CLUSTER && c["health"] == "healthy")
                .then_some(())
        },
    )
    .await?;
    // The cluster's metrics are stored by the one partition the mapping gives it (only the partition
    // durables read FLEET_METRICS here: without the mapping nothing would be stored), and each TSDB instance
    // answers for it, asking its peer for what it lacks.
    let query = format!("count(kube_pod_info{{cluster=\"{CLUSTER}\"}})");
    for instance in ["multipilot-tsdb-p0", "multipilot-tsdb-p1"] {
        let addr = node.service_addr("multipilot-hub", instance, 9466)?;
        common::eventually(
            &format!("{instance} answers for {CLUSTER}"),
            150,
            async || {
                let v: serde_json::Value = http
                    .get(format!("http://{addr}/api/v1/query"))
                    .query(&[("query", query.as_str())])
                    .bearer_auth(viewer)
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                let n: f64 = v["data"]["result"][0]["value"][1].as_str()?.parse().ok()?;
                (n > 0.0).then_some(())
            },
        )
        .await
        .with_context(|| {
            format!(
                "tsdb-p0 log:\n{}\ntsdb-p1 log:\n{}",
                tail(node, "multipilot-tsdb-p0-0"),
                tail(node, "multipilot-tsdb-p1-0")
            )
        })?;
    }
    // Each partition evaluates the rules over the clusters it stores; the own rule's alert for the cluster
    // reaches the router (the Service multipilot-alerts) from whichever partition holds it.
    let mut rules = None;
    for instance in ["multipilot-tsdb-p0", "multipilot-tsdb-p1"] {
        let addr = node.service_addr("multipilot-hub", instance, 9466)?;
        rules = Some(
            rules_evaluated(&http, &addr.to_string(), viewer)
                .await
                .with_context(|| {
                    format!("{instance} log:\n{}", tail(node, &format!("{instance}-0")))
                })?,
        );
    }
    let alerts = node.service_addr("multipilot-hub", "multipilot-alerts", 9467)?;
    own_alert_delivered(
        &http,
        &alerts.to_string(),
        viewer,
        &rules.context("no TSDB instance")?,
        CLUSTER,
    )
    .await
    .with_context(|| {
        format!(
            "tsdb-p0 log:\n{}\ntsdb-p1 log:\n{}\nalerts log:\n{}",
            tail(node, "multipilot-tsdb-p0-0"),
            tail(node, "multipilot-tsdb-p1-0"),
            tail(node, "multipilot-alerts-0")
        )
    })?;
    for pod in ["multipilot-tsdb-p0-0", "multipilot-tsdb-p1-0"] {
        no_refused_alerts(node, pod)?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_yaml_starts_and_its_console_shows_the_cluster() -> Result<()> {
    Node::preflight()?;
    let _live = LIVE.lock().await;
    // The project directory as compose.yaml's header says to prepare it: `.env`, and next to it
    // deploy/compose/kubeconfig.yaml (the agent's cluster, context prod-1) and deploy/compose/tokens.yaml.
    let project = tempfile::tempdir()?;
    let status = Command::new("cp")
        .arg("-r")
        .arg(root().join("deploy"))
        .arg(root().join("compose.yaml"))
        .arg(project.path())
        .status()?;
    ensure!(status.success(), "copying compose.yaml and deploy/");
    let compose = std::fs::read_to_string(project.path().join("compose.yaml"))?;
    let mut env = BTreeMap::new();
    let re = regex::Regex::new(r"\$\{([A-Z0-9_]+):\?")?;
    for c in re.captures_iter(&compose) {
        let var = c[1].to_string();
        let value = format!("p{}", multipilot_schemas::stable_id(&[&var, "drill"]));
        env.insert(var, value);
    }
    let viewer = "viewer-drill-token-0123456789".to_string();
    std::fs::write(
        project.path().join("deploy/compose/tokens.yaml"),
        format!(
            "- {{token: {viewer}, subject: alice, role: viewer}}\n\
             - {{token: {}, subject: console, role: viewer}}\n\
             - {{token: {}, subject: tsdb-rules, role: operator}}\n",
            env["MULTIPILOT_CONSOLE_TSDB_TOKEN"], env["MULTIPILOT_TSDB_ALERTS_TOKEN"]
        ),
    )?;
    // the operator's own rules next to the shipped ones, as deploy/compose/README.md says
    std::fs::write(
        project.path().join("deploy/rules").join(OWN_RULES_FILE),
        OWN_RULES,
    )?;
    let images = BTreeMap::from([
        (
            "nats:".to_string(),
            compose::Image {
                entrypoint: vec!["nats-server".into()],
                user: None,
            },
        ),
        (
            "multipilot:".to_string(),
            // deploy/Dockerfile: ENTRYPOINT [], USER 65532
            compose::Image {
                entrypoint: Vec::new(),
                user: Some(65532),
            },
        ),
    ]);
    // the node first (its bridge is where the simulated cluster listens), then the kubeconfig the
    // manifests mount
    let placeholder = project.path().join("deploy/compose/kubeconfig.yaml");
    std::fs::write(&placeholder, "")?;
    let manifests = compose::manifests(&compose, project.path(), &env, &images)?;
    let mut node = node_for(manifests)?;
    let sim = simulator(&["prod-1"], &["1.24"], node.gateway().into()).await?;
    std::fs::copy(&sim.kubeconfig, &placeholder)?;
    // readable by the image's user (deploy/compose/README.md says so)
    std::fs::set_permissions(
        &placeholder,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )?;
    node.start().await?;
    node.wait_all_ready(Duration::from_secs(240)).await?;
    for (pod, _) in node.pods() {
        eprintln!("compose: ready: {pod} (restarts {})", node.restarts(&pod));
    }
    // the console, as published on the host: prod-1 from the agent, through NATS, in the console
    let (_, console) = node
        .pods()
        .into_iter()
        .find(|(p, _)| p.starts_with("console-"))
        .context("no console pod")?;
    let http = reqwest::Client::new();
    common::eventually("prod-1 in the compose console", 120, async || {
        let v = get_json(
            &http,
            &format!("http://{console}:9468/api/v1/clusters"),
            &viewer,
        )
        .await?;
        v.as_array()?
            .iter()
            .any(|c| {
                c["name"] == "prod-1" && c["version"].as_str().is_some_and(|s| s.contains("1.24"))
            })
            .then_some(())
    })
    .await
    .with_context(|| {
        format!(
            "console log:\n{}\nagent log:\n{}",
            tail(&node, "console-0pod"),
            tail(&node, "agent-0pod")
        )
    })?;
    // the fleet rules from the bind-mounted deploy/rules, their alerts to the `alerts` service
    let pod_ip = |prefix: &str| {
        node.pods()
            .into_iter()
            .find(|(p, _)| p.starts_with(prefix))
            .map(|(_, ip)| ip)
            .with_context(|| format!("no {prefix} pod"))
    };
    let (tsdb, alerts) = (pod_ip("tsdb-")?, pod_ip("alerts-")?);
    let rules = rules_evaluated(&http, &format!("{tsdb}:9466"), &viewer)
        .await
        .with_context(|| format!("tsdb log:\n{}", tail(&node, "tsdb-0pod")))?;
    own_alert_delivered(&http, &format!("{alerts}:9467"), &viewer, &rules, "prod-1")
        .await
        .with_context(|| {
            format!(
                "tsdb log:\n{}\nalerts log:\n{}",
                tail(&node, "tsdb-0pod"),
                tail(&node, "alerts-0pod")
            )
        })?;
    no_refused_alerts(&node, "tsdb-0pod")?;
    Ok(())
}

/// The operator's own rule file, added next to the shipped ones (README: Deploy on Kubernetes, step 6;
/// deploy/compose/README.md): an alert per cluster with pods, firing at its first evaluation, so the drill
/// sees the TSDB's rules reach the alert router over the agent's real metrics.
const OWN_RULES_FILE: &str = "drill.rules.yaml";
const OWN_RULES: &str = r#"groups:
  - name: drill.own
    interval: 5s
    rules:
      - alert: DrillClusterHasPods
        expr: count by (cluster) (kube_pod_info) > 0
        labels: {severity: info}
        annotations:
          summary: "{{ $labels.cluster }} runs {{ $value }} pods"
"#;

/// The rule groups `deploy/rules/*.rules.yaml` ships, by name.
fn shipped_groups() -> Result<Vec<String>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(root().join("deploy/rules"))? {
        let p = e?.path();
        if !p.to_string_lossy().ends_with(".rules.yaml") {
            continue;
        }
        let file: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(&p)?)?;
        for g in file["groups"].as_array().into_iter().flatten() {
            names.push(g["name"].as_str().context("group name")?.to_string());
        }
    }
    ensure!(!names.is_empty(), "deploy/rules ships no rule groups");
    Ok(names)
}

/// `GET /api/v1/rules` of the TSDB at `addr` (host:port), as an operator asks it with a viewer's token: the
/// groups of every shipped file and of the own file, read from `/etc/multipilot/rules` (the mounted
/// ConfigMap, or compose's bind mount), each rule evaluated at least once and none failing. Returns the
/// answer.
async fn rules_evaluated(
    http: &reqwest::Client,
    addr: &str,
    viewer: &str,
) -> Result<serde_json::Value> {
    let url = format!("http://{addr}/api/v1/rules");
    let mut want = shipped_groups()?;
    want.push("drill.own".into());
    let mut last = serde_json::Value::Null;
    let every = Duration::from_millis(500);
    let found = common::eventually_every(&format!("rules at {addr}"), 90, every, async || {
        let v = get_json(http, &url, viewer).await?;
        last = v.clone();
        let groups = v["data"]["groups"].as_array()?;
        let all_there = want
            .iter()
            .all(|w| groups.iter().any(|g| g["name"] == w.as_str()));
        let all_ok = groups
            .iter()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .all(|r| r["health"] == "ok");
        (all_there && all_ok).then_some(v)
    })
    .await;
    let v = found.with_context(|| format!("want groups {want:?}; last answer: {last}"))?;
    // asked once it answers (a role restarting until the streams are provisioned refuses connections)
    let refused = http.get(&url).send().await?.status();
    ensure!(refused.as_u16() == 401, "rules without a token: {refused}");
    for g in v["data"]["groups"].as_array().into_iter().flatten() {
        let file = g["file"].as_str().unwrap_or_default();
        ensure!(
            file.starts_with("/etc/multipilot/rules/") && file.ends_with(".rules.yaml"),
            "group {} from {file}, not from the mounted rules",
            g["name"]
        );
    }
    eprintln!(
        "rules at {addr}: {}",
        v["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| format!(
                "{} ({} rules, {})",
                g["name"].as_str().unwrap_or_default(),
                g["rules"].as_array().map_or(0, Vec::len),
                g["file"].as_str().unwrap_or_default()
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(v)
}

/// The own rule's alert for `cluster` is listed by the alert router at `addr` (host:port), so the TSDB
/// posted it with a token the router takes, and its summary is rendered; and every alert of a loaded
/// rule the router holds has its annotations rendered (nothing half-made was taken).
async fn own_alert_delivered(
    http: &reqwest::Client,
    addr: &str,
    viewer: &str,
    rules: &serde_json::Value,
    cluster: &str,
) -> Result<()> {
    let url = format!("http://{addr}/api/v2/alerts");
    let mut last = serde_json::Value::Null;
    let every = Duration::from_millis(500);
    let found = common::eventually_every(
        &format!("the own alert at {addr}"),
        120,
        every,
        async || {
            let v: serde_json::Value = http
                .get(&url)
                .query(&[("filter", "alertname=\"DrillClusterHasPods\"")])
                .bearer_auth(viewer)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            last = v.clone();
            v.as_array()?
                .iter()
                .find(|a| a["labels"]["cluster"] == cluster)
                .cloned()
        },
    )
    .await;
    let alert = found.with_context(|| format!("last answer: {last}"))?;
    let summary = alert["annotations"]["summary"].as_str().unwrap_or_default();
    ensure!(
        summary.starts_with(&format!("{cluster} runs ")) && summary.ends_with(" pods"),
        "summary {summary:?}"
    );
    ensure!(
        alert["labels"]["severity"] == "info",
        "labels {}",
        alert["labels"]
    );
    let names: Vec<&str> = rules["data"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter(|r| r["type"] == "alerting")
        .filter_map(|r| r["name"].as_str())
        .collect();
    let all = get_json(http, &url, viewer)
        .await
        .context("the router's alerts")?;
    for a in all.as_array().context("alerts list")? {
        if names.contains(&a["labels"]["alertname"].as_str().unwrap_or_default()) {
            let annotations = a["annotations"].to_string();
            ensure!(!annotations.contains("{{"), "an unrendered alert: {a}");
        }
    }
    eprintln!("router at {addr}: {} {summary:?}", alert["labels"]);
    Ok(())
}

/// The TSDB in `pod` never had its alerts refused by the router (a missing or too weak token: 401/403).
fn no_refused_alerts(node: &Node, pod: &str) -> Result<()> {
    let log = node.log(pod);
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("alertmanager refused alerts"))
        .take(3)
        .collect();
    ensure!(refused.is_empty(), "{pod}: {refused:?}");
    Ok(())
}

/// GET a JSON document with a bearer token; `None` while it doesn't answer with JSON.
async fn get_json(http: &reqwest::Client, url: &str, token: &str) -> Option<serde_json::Value> {
    http.get(url)
        .bearer_auth(token)
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

/// The cluster the live drill onboards.
const CLUSTER: &str = "staging-2";

fn tail(node: &Node, pod: &str) -> String {
    let log = node.log(pod);
    let lines: Vec<&str> = log.lines().rev().take(20).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_overlay_without_its_secret_does_not_start_and_says_which_secret() -> Result<()> {
    Node::preflight()?;
    let out = tempfile::tempdir()?;
    let out_s = out.path().to_str().context("utf-8 path")?;
    secrets(&["hub", out_s])?;
    secrets(&["agent", "prod-1", out_s])?;
    // the operator applied the release trust but forgot the agent's NATS credentials
    std::fs::remove_file(out.path().join("agent-prod-1/multipilot-agent-nats.yaml"))?;
    let mut manifests = Manifests::render(&root().join("deploy/examples/agent-prod-1"))?;
    manifests.extend(secret_manifests(&out.path().join("agent-prod-1"))?);
    let mut node = node_for(manifests)?;
    node.start().await?;
    let pod = node
        .pods()
        .into_iter()
        .map(|(p, _)| p)
        .find(|p| p.starts_with("multipilot-agent"))
        .context("no agent pod")?;
    let why = node
        .failure(&pod)
        .context("the agent started without its Secret")?;
    ensure!(
        why.contains("secret \"multipilot-agent-nats\" not found"),
        "{why}"
    );
    ensure!(!node.ready(&pod).await);
    Ok(())
}
