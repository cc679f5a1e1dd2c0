//! kubectl habits in the CLI, against the real console role (`multipilot console`) on a real nats-server:
//! kinds by singular, plural, short name and `resource.group`; `-A`, `-n`, `-l`; `-o name|json|yaml|wide`;
//! an unknown kind failing with a suggestion; contexts in the CLI config standing in for the environment.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Output};

use anyhow::{Result, ensure};
use async_nats::jetstream;
use chrono::Utc;
use common::Proc;
use multipilot_bus::publish::{Completion, Outgoing, Publisher};
use multipilot_bus::topology::Topology;
use multipilot_schemas::payload::ResourceState;
use multipilot_schemas::{Envelope, Payload, stable_id, subject};
use multipilot_testkit::{NatsServer, free_port};
use serde_json::{Value, json};

const TOKEN: &str = "viewer-token-for-the-cli-0123";

/// A nats-server with the streams and the console role reading them, auth on with one viewer token.
struct Hub {
    nats: NatsServer,
    js: jetstream::Context,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:<port>`.
    console: String,
    _proc: Proc,
    seq: u64,
}

impl Hub {
    async fn start() -> Result<Hub> {
        let nats = NatsServer::start().await?;
        let js = jetstream::new(nats.client().await?);
        Topology::embedded().provision(&js).await?;
        let dir = tempfile::tempdir()?;
        std::fs::write(
            dir.path().join("tokens.yaml"),
            format!("- token: {TOKEN}\n  subject: cli-test\n  role: viewer\n"),
        )?;
        let port = free_port()?;
        let proc = Proc::spawn(
            common::role(
                "console",
                &nats.url(),
                &dir.path().join("data"),
                &dir.path().join("console.log"),
            )?
            .env("MULTIPILOT_PROVISION__ENABLED", "false")
            .env("MULTIPILOT_CONSOLE__LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "MULTIPILOT_CONSOLE__AUTH__TOKENS_FILE",
                dir.path().join("tokens.yaml"),
            ),
        )?;
        Ok(Hub {
            nats,
            js,
            dir,
            console: format!("http://127.0.0.1:{port}"),
            _proc: proc,
            seq: 0,
        })
    }

    async fn send<T: Payload>(&mut self, subject: String, cluster: &str, payload: T) -> Result<()> {
        self.seq += 1;
        let env = Envelope::new(
            cluster,
            format!("agent/{cluster}"),
            Utc::now(),
            self.seq,
            payload,
        );
        let id = stable_id(&[cluster, &self.seq.to_string(), &subject]);
        let mut p: Publisher<u64> = Publisher::new(
            self.js.clone(),
            4,
            multipilot_bus::metrics::BusMetrics::register(&mut Default::default()),
        );
        p.send(0, Outgoing::envelope(subject, id, &env)?).await;
        for c in p.flush().await {
            ensure!(matches!(c, Completion::Stored { .. }), "not stored: {c:?}");
        }
        Ok(())
    }

    /// The fleet of these tests: two clusters (`prod-a` env=prod region=eu-west-1, `prod-b`), Deployments
    /// payments/web in both and shop/cart in prod-a, a Pod in each of those namespaces, a Namespace; waits
    /// until the console has all of them.
    async fn with_fleet(&mut self) -> Result<()> {
        let mut facts = common::facts(31);
        facts.labels.insert("region".into(), "eu-west-1".into());
        self.send(subject::facts("prod-a"), "prod-a", facts).await?;
        let objects = [
            ("prod-a", object("Deployment", Some("payments"), "web")),
            ("prod-a", object("Deployment", Some("shop"), "cart")),
            ("prod-a", object("Pod", Some("payments"), "web-1")),
            ("prod-a", object("Pod", Some("shop"), "cart-1")),
            ("prod-a", object("Namespace", None, "payments")),
            ("prod-b", object("Deployment", Some("payments"), "web")),
        ];
        let n = objects.len();
        for (cluster, o) in objects {
            let s = subject::state(cluster, &o.kind, o.namespace.as_deref(), &o.name);
            self.send(s, cluster, o).await?;
        }
        let http = reqwest::Client::new();
        let url = format!("{}/api/v1/resources", self.console);
        let log = self.dir.path().join("console.log");
        common::eventually("the console holding every object", 60, async || {
            let v: Value = http
                .get(&url)
                .bearer_auth(TOKEN)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            (v["total"].as_u64() == Some(n as u64)).then_some(())
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default()))
    }

    /// `multipilot <args>` signed in by the environment, as before contexts.
    fn cli(&self, args: &[&str]) -> Output {
        let home = self.dir.path().join("home");
        run(
            args,
            &[
                ("MULTIPILOT_CONSOLE_URL", self.console.as_str()),
                ("MULTIPILOT_TOKEN", TOKEN),
                ("HOME", home.to_str().unwrap_or_default()),
            ],
        )
    }

    /// Like [`Hub::cli`], and it must succeed: its stdout.
    fn ok(&self, args: &[&str]) -> String {
        succeeded(args, self.cli(args))
    }
}

/// `multipilot <args>` with `env` and no other MULTIPILOT_* or XDG_CONFIG_HOME from the caller.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_multipilot"));
    for (k, _) in std::env::vars() {
        if k.starts_with("MULTIPILOT_") || k == "XDG_CONFIG_HOME" || k == "HOME" {
            c.env_remove(k);
        }
    }
    c.args(args)
        .envs(env.iter().copied())
        .output()
        .expect("running multipilot")
}

fn succeeded(args: &[&str], out: Output) -> String {
    assert!(
        out.status.success(),
        "multipilot {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn object(kind: &str, ns: Option<&str>, name: &str) -> ResourceState {
    let spec = json!({"replicas": 2, "of": name});
    ResourceState {
        api_version: match kind {
            "Deployment" => "apps/v1",
            _ => "v1",
        }
        .into(),
        kind: kind.into(),
        namespace: ns.map(Into::into),
        name: name.into(),
        uid: format!("u-{name}"),
        resource_version: "1".into(),
        generation: Some(1),
        spec_hash: stable_id(&[&spec.to_string()]),
        metadata_hash: "m".into(),
        spec: Some(spec),
        status: Default::default(),
        labels: BTreeMap::from([("app".into(), name.trim_end_matches("-1").into())]),
        annotations: Default::default(),
        owner_refs: vec![],
        finalizers: vec![],
        deletion_timestamp: None,
        creation_timestamp: None,
        field_managers: Vec::new(),
    }
}

/// The table's rows (header apart), each split on whitespace.
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

fn sorted_lines(s: &str) -> Vec<&str> {
    let mut v: Vec<&str> = s.lines().collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_takes_kinds_and_flags_as_kubectl_does() -> Result<()> {
    let mut hub = Hub::start().await?;
    hub.with_fleet().await?;

    // the plural (which printed "(none)" before), the short name, the singular with its group, the Kind
    let deployments = hub.ok(&["get", "deployments"]);
    assert!(
        deployments.starts_with("CLUSTER") && deployments.contains("NAMESPACE"),
        "{deployments}"
    );
    let mut names: Vec<String> = rows(&deployments)
        .iter()
        .map(|r| format!("{}/{}/{}", r[0], r[1], r[2]))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "prod-a/payments/web",
            "prod-a/shop/cart",
            "prod-b/payments/web"
        ],
        "{deployments}"
    );
    for kind in [
        "deploy",
        "deployment.apps",
        "Deployments.apps",
        "DEPLOYMENT",
    ] {
        assert_eq!(hub.ok(&["get", kind]), deployments, "get {kind}");
    }

    // -A: every namespace (what no -n means); -n: one namespace, no NAMESPACE column
    let pods = hub.ok(&["get", "po", "-A"]);
    let mut pod_rows: Vec<String> = rows(&pods).iter().map(|r| r[1..3].join("/")).collect();
    pod_rows.sort();
    assert_eq!(pod_rows, ["payments/web-1", "shop/cart-1"], "{pods}");
    let shop = hub.ok(&["get", "pods", "-n", "shop"]);
    assert!(!shop.contains("NAMESPACE"), "{shop}");
    let shop_rows = rows(&shop);
    assert_eq!(shop_rows.len(), 1, "{shop}");
    assert_eq!(shop_rows[0][..2], ["prod-a", "cart-1"], "{shop}");
    // -A wins over -n, as in kubectl
    assert_eq!(hub.ok(&["get", "po", "-A", "-n", "shop"]), pods);
    // a cluster-scoped kind ignores -n
    let ns = hub.ok(&["get", "ns", "-n", "shop"]);
    assert_eq!(rows(&ns).len(), 1, "{ns}");
    assert!(ns.contains("payments") && !ns.contains("NAMESPACE"), "{ns}");

    // -l
    let web = hub.ok(&["get", "deploy", "-l", "app=web"]);
    assert_eq!(rows(&web).len(), 2, "{web}");
    assert!(!web.contains("cart"), "{web}");

    // -o name: kind.group/name, one line per object, nothing else on stdout
    assert_eq!(
        sorted_lines(&hub.ok(&["get", "deploy", "-o", "name"])),
        [
            "deployment.apps/cart",
            "deployment.apps/web",
            "deployment.apps/web"
        ]
    );
    assert_eq!(
        hub.ok(&["get", "po", "-n", "payments", "-o", "name"]),
        "pod/web-1\n"
    );

    // -o json and -o yaml: the console's page, whole
    let json: Value = serde_json::from_str(&hub.ok(&["get", "deploy", "-o", "json"]))?;
    assert_eq!(json["total"], 3, "{json}");
    assert!(
        json["items"]
            .as_array()
            .is_some_and(|i| i.iter().all(|o| o["kind"] == "Deployment")),
        "{json}"
    );
    let yaml: Value = serde_yaml::from_str(&hub.ok(&["get", "deployments.apps", "-o", "yaml"]))?;
    assert_eq!(yaml, json);

    // -o wide: the full spec hash, the API version, the cluster's env and region, the object's labels
    let wide = hub.ok(&["get", "deploy", "--cluster", "prod-a", "-o", "wide"]);
    assert!(
        wide.contains("API-VERSION") && wide.contains("REGION"),
        "{wide}"
    );
    let web_row = rows(&wide)
        .into_iter()
        .find(|r| r[2] == "web")
        .expect("web in -o wide");
    let full_hash = object("Deployment", Some("payments"), "web").spec_hash;
    assert_eq!(
        web_row[4..],
        [
            full_hash,
            "apps/v1".into(),
            "prod".into(),
            "eu-west-1".into(),
            "app=web".into()
        ],
        "{wide}"
    );

    // nothing of a known kind: kubectl's note on stderr, nothing on stdout
    let none = hub.cli(&["get", "statefulsets"]);
    assert!(none.status.success(), "{}", stderr(&none));
    assert!(none.stdout.is_empty());
    assert!(
        stderr(&none).contains("No resources found"),
        "{}",
        stderr(&none)
    );

    // an unknown kind is an error with the nearest name
    let bad = hub.cli(&["get", "deploymnets"]);
    assert!(!bad.status.success());
    assert!(bad.stdout.is_empty());
    assert!(
        stderr(&bad).contains("did you mean deployments?"),
        "{}",
        stderr(&bad)
    );
    // a kind kubectl knows that the agent doesn't collect says so
    let pvc = hub.cli(&["get", "pvc"]);
    assert!(!pvc.status.success());
    assert!(
        stderr(&pvc).contains("persistentvolumeclaims"),
        "{}",
        stderr(&pvc)
    );

    // diff and compare take the same names
    let diff = hub.ok(&["diff", "payments/deploy/web"]);
    assert!(diff.contains("spec: the same in every cluster"), "{diff}");
    let compare = hub.ok(&["compare", "prod-a", "prod-b", "--kind", "deployments.apps"]);
    assert!(
        compare.starts_with("1 identical, 0 differ, 1 only in prod-a, 0 only in prod-b"),
        "{compare}"
    );

    // a flag beats the environment: a wrong --token is refused though MULTIPILOT_TOKEN is right
    let refused = hub.cli(&["get", "deploy", "--token", "wrong-token-0123456789"]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("token"), "{}", stderr(&refused));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_stands_in_for_the_environment() -> Result<()> {
    let mut hub = Hub::start().await?;
    hub.with_fleet().await?;
    let home = tempfile::tempdir()?;
    let xdg = home.path().join("xdg");
    let token_file = home.path().join("viewer.token");
    std::fs::write(&token_file, format!("{TOKEN}\n"))?;
    // only where to keep the config: no MULTIPILOT_* at all
    let env = [
        ("HOME", home.path().to_str().unwrap_or_default()),
        ("XDG_CONFIG_HOME", xdg.to_str().unwrap_or_default()),
    ];
    let mp = |args: &[&str]| run(args, &env);
    let ok = |args: &[&str]| succeeded(args, mp(args));

    // no config yet: not an error to ask, and `get` has nowhere to go but the default address
    assert_eq!(ok(&["config", "get-contexts"]).lines().count(), 1);
    assert!(!mp(&["config", "current-context"]).status.success());

    ok(&[
        "config",
        "set-context",
        "hub",
        "--console",
        &hub.console,
        "--token-file",
        token_file.to_str().unwrap_or_default(),
    ]);
    ok(&[
        "config",
        "set-context",
        "inline",
        "--console",
        &hub.console,
        "--token",
        "inline-secret-token",
        "-o",
        "name",
    ]);
    assert!(ok(&["config", "use-context", "hub"]).contains("\"hub\""));
    assert_eq!(ok(&["config", "current-context"]), "hub\n");

    // the file is where XDG says, readable by its owner only
    let file = xdg.join("multipilot/config.yaml");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file)?.permissions().mode() & 0o777,
            0o600
        );
    }
    let view = ok(&["config", "view"]);
    assert!(
        view.contains("current-context: hub") && !view.contains("inline-secret-token"),
        "{view}"
    );
    let contexts = ok(&["config", "get-contexts"]);
    assert!(
        contexts
            .lines()
            .any(|l| l.starts_with('*') && l.contains("hub")),
        "{contexts}"
    );

    // `get` with no MULTIPILOT_* in the environment: the current context's console and token file
    let got = ok(&["get", "deploy", "-n", "payments"]);
    assert_eq!(rows(&got).len(), 2, "{got}");
    assert!(got.contains("prod-b"), "{got}");

    // --context picks another one; its default output applies, and its (wrong) token is sent
    let other = mp(&["get", "deploy", "--context", "inline"]);
    assert!(!other.status.success());
    assert!(stderr(&other).contains("401") || stderr(&other).contains("token"));
    ok(&[
        "config",
        "set-context",
        "inline",
        "--token-file",
        token_file.to_str().unwrap_or_default(),
    ]);
    assert_eq!(
        sorted_lines(&ok(&["get", "deploy", "--context", "inline", "-n", "shop"])),
        ["deployment.apps/cart"]
    );
    // …and a flag beats it
    let table = ok(&[
        "get",
        "deploy",
        "--context",
        "inline",
        "-n",
        "shop",
        "-o",
        "table",
    ]);
    assert!(table.starts_with("CLUSTER"), "{table}");

    // the environment beats the context
    let env_token = run(
        &["get", "deploy"],
        &[
            env[0],
            env[1],
            ("MULTIPILOT_TOKEN", "wrong-token-0123456789"),
        ],
    );
    assert!(!env_token.status.success(), "{}", stderr(&env_token));
    // a context that isn't there is an error
    assert!(!mp(&["get", "deploy", "--context", "nope"]).status.success());

    // the context's NATS URL serves the commands that ask over NATS: a stream only this server has
    let marker = format!("CLI_CONTEXT_{}", std::process::id());
    hub.js
        .create_stream(jetstream::stream::Config {
            name: marker.clone(),
            subjects: vec![format!("{}.>", marker.to_lowercase())],
            ..Default::default()
        })
        .await?;
    ok(&["config", "set-context", "hub", "--nats", &hub.nats.url()]);
    let status = ok(&["status"]);
    assert!(status.contains(&marker), "{status}");

    // a malformed file is an error naming it
    std::fs::write(&file, "contexts: [{name: hub, consol: x}]\n")?;
    let broken = mp(&["get", "deploy"]);
    assert!(!broken.status.success());
    assert!(
        stderr(&broken).contains(&file.display().to_string()),
        "{}",
        stderr(&broken)
    );
    Ok(())
}

#[test]
fn completion_scripts_name_the_commands() {
    for (shell, marker) in [
        ("bash", "_multipilot()"),
        ("zsh", "#compdef multipilot"),
        ("fish", "complete -c multipilot"),
    ] {
        let out = succeeded(&["completion", shell], run(&["completion", shell], &[]));
        assert!(out.contains(marker), "{shell}: {out}");
        assert!(
            out.contains("set-context") && out.contains("get"),
            "{shell}"
        );
    }
    assert!(!run(&["completion", "tcsh"], &[]).status.success());
}

#[test]
fn api_resources_lists_kinds_with_their_short_names() {
    let out = succeeded(&["api-resources"], run(&["api-resources"], &[]));
    let deploy = out
        .lines()
        .find(|l| l.starts_with("deployments "))
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>();
    assert_eq!(
        deploy,
        ["deployments", "deploy", "apps", "true", "Deployment", "yes"]
    );
}
