//! End to end through a browser: `./scripts/up` on scratch ports and data starts the whole system (nats,
//! the hub with every role, the fleet simulator, the agent); headless Chromium, driven over the DevTools
//! protocol, opens the console and must see the simulated clusters, an incident caused by a fault injected
//! into the simulator appearing without a reload (then acknowledged from the page), a cross-cluster diff
//! showing the field that differs between two clusters, and the GitOps tab with the demo fleet repository's
//! policy bundle synced everywhere and its sync windows table.
//!
//! It uses the binaries next to this test's `multipilot` (`cargo build --bins` or `./scripts/test` builds
//! them). Skipped, with a message, only when no Chromium is installed (`./scripts/test` installs Debian's).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use common::system::System;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

fn chromium() -> Option<PathBuf> {
    let fixed = Path::new("/usr/bin/chromium");
    if fixed.is_file() {
        return Some(fixed.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n)))
        .find(|p| p.is_file())
}

/// Headless Chromium with a DevTools connection to its page.
struct Browser {
    child: Child,
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    async fn launch(bin: &Path) -> Result<Browser> {
        let profile = tempfile::Builder::new().prefix("mp-chromium-").tempdir()?;
        let port = multipilot_testkit::free_port()?;
        let child = Command::new(bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=1400,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("--remote-debugging-port={port}"))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting chromium")?;
        let http = reqwest::Client::new();
        let mut ws_url = None;
        for _ in 0..150 {
            if let Ok(r) = http
                .get(format!("http://127.0.0.1:{port}/json/list"))
                .send()
                .await
                && let Ok(list) = r.json::<Vec<Value>>().await
                && let Some(u) = list
                    .iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            {
                ws_url = Some(u.to_string());
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let ws_url = ws_url.context("chromium's DevTools endpoint did not come up")?;
        let (ws, _) = tokio_tungstenite::connect_async(ws_url.as_str()).await?;
        Ok(Browser {
            child,
            ws,
            next_id: 0,
            _profile: profile,
        })
    }

    async fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws.send(Message::Text(msg.into())).await?;
        loop {
            let m = tokio::time::timeout(Duration::from_secs(30), self.ws.next())
                .await
                .with_context(|| format!("no answer to {method}"))?
                .context("devtools connection closed")??;
            let Ok(text) = m.to_text() else { continue };
            let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            if v["id"] == id {
                if let Some(e) = v.get("error") {
                    bail!("{method}: {e}");
                }
                return Ok(v["result"].clone());
            }
        }
    }

    /// Evaluates JavaScript in the page and returns its (JSON) value.
    async fn eval(&mut self, js: &str) -> Result<Value> {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": js, "returnByValue": true, "awaitPromise": true}),
            )
            .await?;
        if let Some(ex) = r.get("exceptionDetails") {
            bail!("page error in `{js}`: {ex}");
        }
        Ok(r["result"]["value"].clone())
    }

    /// Polls a JavaScript condition until it yields something other than null/false.
    async fn wait_for(&mut self, what: &str, js: &str, secs: u64) -> Result<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.eval(js).await?;
            if !(v.is_null() || v == json!(false)) {
                return Ok(v);
            }
            if tokio::time::Instant::now() > deadline {
                let shot = self.screenshot("console-e2e-failure.png").await;
                bail!("timed out waiting for {what} (screenshot: {shot:?})");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn screenshot(&mut self, name: &str) -> Result<PathBuf> {
        let r = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await?;
        save_png(r, name)
    }

    /// A picture of one element of the page (scrolled to, the whole element even where it is taller than
    /// the window).
    async fn screenshot_of(&mut self, selector: &str, name: &str) -> Result<PathBuf> {
        let rect = self
            .eval(&format!(
                "(() => {{ document.querySelector('header').style.position = 'static'; \
                 const e = document.querySelector({}); e.scrollIntoView(); const r = e.getBoundingClientRect(); \
                 return {{x: r.left + scrollX, y: r.top + scrollY, width: Math.max(1, r.width), height: Math.max(1, r.height), scale: 1}}; }})()",
                json!(selector)
            ))
            .await?;
        let r = self
            .call(
                "Page.captureScreenshot",
                json!({"format": "png", "clip": rect, "captureBeyondViewport": true}),
            )
            .await?;
        save_png(r, name)
    }
}

/// Where the screenshots go for a person to look at: `$MULTIPILOT_TEST_OUTPUT` or
/// `target/test-output/console/`.
fn output_dir() -> PathBuf {
    std::env::var_os("MULTIPILOT_TEST_OUTPUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // target/<profile>/deps/<this test> → target/test-output
            std::env::current_exe()
                .ok()
                .and_then(|p| p.ancestors().nth(3).map(Path::to_path_buf))
                .unwrap_or_else(std::env::temp_dir)
                .join("test-output")
        })
        .join("console")
}

fn save_png(answer: Value, name: &str) -> Result<PathBuf> {
    let data = answer["data"].as_str().context("no screenshot data")?;
    let dir = output_dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(name);
    std::fs::write(&path, base64_decode(data)?)?;
    eprintln!("screenshot: {}", path.display());
    Ok(path)
}

fn base64_decode(s: &str) -> Result<Vec<u8>> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut buf, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = A.iter().position(|a| *a == c).context("not base64")? as u32;
        buf = (buf << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
        }
    }
    Ok(out)
}

fn deployment(image: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: console-e2e\n  namespace: default\n  labels:\n    app: console-e2e\n\
         spec:\n  replicas: 1\n  selector:\n    matchLabels:\n      app: console-e2e\n  template:\n    metadata:\n      labels:\n        app: console-e2e\n\
         \x20   spec:\n      containers:\n      - name: web\n        image: {image}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_page_shows_the_fleet_a_live_incident_and_a_cross_cluster_diff() -> Result<()> {
    let Some(chrome) = chromium() else {
        eprintln!(
            "SKIPPED: no chromium found (/usr/bin/chromium or on PATH); ./scripts/test installs Debian's `chromium`"
        );
        return Ok(());
    };
    let sys = System::up()?;
    let console = format!("http://127.0.0.1:{}/", sys.var("MULTIPILOT_CONSOLE_PORT"));
    let sim = format!(
        "http://127.0.0.1:{}",
        sys.var("MULTIPILOT_SIM_CONTROL_PORT")
    );
    let operator = sys.token("operator")?;
    let clusters: Vec<String> = reqwest::get(format!("{sim}/clusters"))
        .await?
        .json::<Vec<Value>>()
        .await?
        .iter()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    anyhow::ensure!(clusters.len() == 6, "the simulator runs {clusters:?}");
    // the same Deployment in two clusters, one field apart
    let (a, b) = (&clusters[0], &clusters[1]);
    sys.kubectl_apply(a, &deployment("registry.example.com/web:1.0.0"))?;
    sys.kubectl_apply(b, &deployment("registry.example.com/web:2.0.0"))?;

    let mut br = Browser::launch(&chrome).await?;
    br.call("Page.enable", json!({})).await?;
    br.call("Page.navigate", json!({"url": console})).await?;
    br.wait_for(
        "the page",
        "document.readyState === 'complete' && !!document.querySelector('#token-form')",
        30,
    )
    .await?;
    // the page asks for a token; give it the operator's, as a person would paste it
    br.wait_for(
        "the token prompt",
        "!document.querySelector('#token-form').hidden",
        30,
    )
    .await?;
    br.eval(&format!(
        "document.querySelector('#token-input').value = {}; document.querySelector('#token-form').requestSubmit(); true",
        json!(operator)
    ))
    .await?;

    // 1. the fleet overview lists the simulated clusters
    let listed = br
        .wait_for(
            "the six clusters in the overview",
            "(() => { const r = [...document.querySelectorAll('#clusters-table tbody tr[data-cluster]')].map(t => t.dataset.cluster); \
             return r.length === 6 && r.every(n => /^[a-z]/.test(n)) ? r : null; })()",
            90,
        )
        .await?;
    let mut listed: Vec<String> = serde_json::from_value(listed)?;
    listed.sort();
    let mut want = clusters.clone();
    want.sort();
    assert_eq!(listed, want);
    br.wait_for(
        "the live incident stream",
        "document.querySelector('#live-status').dataset.state === 'live'",
        30,
    )
    .await?;
    // the fleet incidents section has been read (the simulator's churn makes some BackOff event problems
    // common to several clusters): each fleet incident listed with its members
    br.wait_for(
        "the fleet incidents section",
        "(() => { const n = document.querySelector('#fleet-count').textContent; \
           const items = [...document.querySelectorAll('#fleet-list li.fleet-incident')]; \
           return n !== '' && items.every(li => li.querySelectorAll('ul.members li[data-cluster]').length >= 2); })()",
        30,
    )
    .await?;
    // a marker that a reload would wipe
    br.eval("window.__noReload = 'still-here'; true").await?;

    // 2. a fault in the simulator becomes an incident on the page, live
    let victim = &clusters[2];
    sys.fault(victim, "external-ips", true).await?;
    let sel =
        format!("#incident-list li[data-kind=\"external-ip-exposure\"][data-cluster=\"{victim}\"]");
    let summary = br
        .wait_for(
            "the external-ip-exposure incident",
            &format!("(() => {{ const li = document.querySelector('{sel}'); return li ? li.querySelector('.summary').textContent : null; }})()"),
            150,
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", sys.logs()))?;
    assert!(
        summary.as_str().unwrap_or("").contains(victim.as_str()),
        "{summary}"
    );
    assert_eq!(
        br.eval("window.__noReload").await?,
        json!("still-here"),
        "the page reloaded"
    );
    let lag = br
        .eval(&format!("document.querySelector('{sel} .lag').textContent"))
        .await?;
    assert!(lag.as_str().unwrap_or("").starts_with("lag "), "{lag}");
    // the operator acknowledges it from the page; the new revision comes back over the stream
    br.eval(&format!(
        "document.querySelector('{sel} button[data-action=\"ack\"]').click(); true"
    ))
    .await?;
    br.wait_for(
        "the incident acknowledged",
        &format!("document.querySelector('{sel}[data-status=\"acknowledged\"]') !== null"),
        30,
    )
    .await?;

    // 3. a cross-cluster diff, opened from a resource search, shows the differing field
    br.eval("document.querySelector('#tabs button[data-tab=\"resources\"]').click(); true")
        .await?;
    br.eval(
        "document.querySelector('#res-kind').value = 'Deployment'; document.querySelector('#res-name').value = 'console-e2e'; true",
    )
    .await?;
    br.wait_for(
        "the deployment found in both clusters",
        "(() => { document.querySelector('#res-form').requestSubmit(); \
         return document.querySelectorAll('#resources-table tbody tr[data-name=\"console-e2e\"]').length === 2; })()",
        60,
    )
    .await?;
    br.eval("document.querySelector('#resources-table tbody tr[data-name=\"console-e2e\"] a.diff-link').click(); true")
        .await?;
    let row = br
        .wait_for(
            "the differing image in the diff",
            "(() => { const r = document.querySelector('#diff-fields tr.diff-field[data-path=\"spec.template.spec.containers[web].image\"]'); \
             return r ? [...r.querySelectorAll('td.differs')].map(td => td.textContent) : null; })()",
            30,
        )
        .await?;
    let mut images: Vec<String> = serde_json::from_value(row)?;
    images.sort();
    assert_eq!(
        images,
        [
            "registry.example.com/web:1.0.0",
            "registry.example.com/web:2.0.0"
        ]
    );
    assert_eq!(
        br.eval("document.querySelector('#diff-verdict').textContent")
            .await?,
        json!("spec differs")
    );
    br.screenshot("console-diff.png").await?;

    // 4. the compliance tab: each rule once, with the clusters failing it (the simulated fleet has team
    // namespaces without a Pod Security level everywhere). The correlator judges each cluster when its
    // facts are in, so the tab may open before the last verdict: it refreshes itself while open.
    br.eval("document.querySelector('#tabs button[data-tab=\"compliance\"]').click(); true")
        .await?;
    let failing = br
        .wait_for(
            "all six clusters under the pss-labels rule in the compliance tab",
            "(() => { const r = document.querySelector('#compliance-table tbody tr[data-rule=\"pss-labels\"]'); \
             const n = r ? r.querySelectorAll('li').length : 0; return n >= 6 ? n : null; })()",
            60,
        )
        .await?;
    assert_eq!(
        failing,
        json!(6),
        "every simulated cluster fails pss-labels"
    );
    // 5. the GitOps tab: the demo fleet repository `./scripts/up` follows, its policy bundle synced on every
    // cluster with the commit it runs
    br.eval("document.querySelector('#tabs button[data-tab=\"gitops\"]').click(); true")
        .await?;
    let synced = br
        .wait_for(
            "policy-rbac synced on all six clusters in the GitOps tab",
            "(() => { const rows = [...document.querySelectorAll('#gitops-table tbody tr[data-release=\"policy-rbac\"][data-status=\"Synced\"]')]; \
             return rows.length === 6 ? rows.map(r => r.children[4].textContent) : null; })()",
            120,
        )
        .await?;
    let commits: Vec<String> = serde_json::from_value(synced)?;
    let head = br
        .eval("document.querySelector('#gitops-repos tbody tr[data-repo=\"fleet\"] td.mono').textContent")
        .await?;
    assert!(
        commits.iter().all(|c| head == c.as_str()),
        "{commits:?} vs head {head}"
    );
    // the sync windows table: the demo configures none, and says so
    let windows = br
        .eval(
            "(() => { const t = document.querySelector('#gitops-windows'); if (!t) return null; \
             const rows = t.querySelectorAll('tbody tr[data-window]').length; \
             const empty = t.querySelector('#gitops-windows-empty'); \
             return [rows, empty ? empty.textContent : null]; })()",
        )
        .await?;
    anyhow::ensure!(
        windows[0].as_u64() > Some(0)
            || windows[1]
                .as_str()
                .is_some_and(|t| t.starts_with("No sync windows")),
        "the GitOps tab's sync windows table: {windows}"
    );

    // 6. DNS failing on two clusters is one fleet incident; the coredns pods' readiness warnings on the
    // same two are part of it: listed after the failures, greyed, saying what they are part of (after
    // the GitOps sync above: a release's health gate holds a batch while a target's DNS fails)
    let dns_down = [&clusters[3], &clusters[4]];
    for c in dns_down {
        sys.fault(c, "coredns-down", true).await?;
    }
    br.eval("document.querySelector('#tabs button[data-tab=\"fleet\"]').click(); true")
        .await?;
    let part = br
        .wait_for(
            "the coredns pods' warnings part of the two DNS failures",
            "(() => { const li = [...document.querySelectorAll('#fleet-list li.fleet-incident')]; \
             const dns = li.findIndex(l => l.dataset.kind === 'dns-failure'); \
             const p = li.findIndex(l => l.classList.contains('part') && /coredns/.test(l.querySelector('.summary').textContent)); \
             return dns >= 0 && p > dns ? li[p].querySelector('.part-of').textContent : null; })()",
            180,
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", sys.logs()))?;
    let part = part.as_str().unwrap_or_default();
    for c in dns_down {
        assert!(part.contains(&format!("dns-failure on {c}")), "{part}");
    }

    // 7. the pictures, each with data
    pictures(&mut br, &sys, victim).await?;
    drop(br);
    drop(sys);
    Ok(())
}

/// The console's pictures hold what the hub has: every cluster's vital signs from the TSDB, the incident
/// picked up above on the 24-hour timeline, the release × cluster matrix, a rollout's batches with their
/// steps and gates, and the GPU pool as bars; a screenshot of each goes to the test's output.
async fn pictures(br: &mut Browser, sys: &System, victim: &str) -> Result<()> {
    // the last quarter of an hour: the system under test is a few minutes old
    br.eval(
        "document.querySelector('#tabs button[data-tab=\"fleet\"]').click(); \
             document.querySelector('#vitals-range').value = '15m'; true",
    )
    .await?;
    // every vital of every cluster with points (the agent scrapes every 15 s; a rate needs two samples);
    // the page reads them again at most every 5 s while waiting
    let ready = br
        .wait_for(
            "every cluster's six vital signs with data",
            "(() => { if (!window.__vt || Date.now() - window.__vt > 5000) { window.__vt = Date.now(); loadVitals(); } \
               const rows = [...document.querySelectorAll('#vitals-table tbody tr[data-cluster]')]; \
               const full = rows.length === 6 && rows.every(r => { const cells = [...r.querySelectorAll('td.vital')]; \
                 return cells.length === 6 && cells.every(td => +td.querySelector('svg.spark').dataset.points >= 2); }); \
               return full ? rows.map(r => r.querySelector('td[data-vital=\"nodes_ready\"] .last').textContent) : null; })()",
            240,
        )
        .await?;
    // the simulated nodes are all ready: the picture says so, from the TSDB
    assert_eq!(ready, json!(vec!["100 %"; 6]), "nodes ready per cluster");
    // a series whose last point is more than two minutes before the range's last evaluation (the
    // cluster's metrics stopped) has no value now, only since when; a failed scrape's gap is shorter; a
    // day's range evaluates every 24 min, its point at the last evaluation is current
    let now = br
        .eval(
            "(() => { const end = 1796640000, start = end - 900, day = end - 86400; \
               return [vitalNow([[end - 600, 1], [end - 180, 1]], start, end, 15), \
                 vitalNow([[end - 60, 0.5]], start, end, 15), vitalNow([], start, end, 15), \
                 vitalNow([[end - 1440, 1], [end, 1]], day, end, 1440), \
                 vitalNow([[end - 1440, 1]], day, end, 1440)]; })()",
        )
        .await?;
    assert_eq!(
        now,
        json!([
            {"value": null, "since": 1796640000 - 180},
            {"value": 0.5, "since": null},
            {"value": null, "since": null},
            {"value": 1, "since": null},
            {"value": null, "since": 1796640000 - 1440}
        ])
    );
    br.screenshot_of("#vitals-table", "console-vitals.png")
        .await?;

    // the incident raised above is a bar in its cluster's lane; every fleet incident of the last 24 h is
    // one in the fleet lane, each of its members marked on its own lane
    let lanes = br
        .wait_for(
            "the incident on the 24-hour timeline",
            &format!(
                "(() => {{ renderTimeline(); const box = document.querySelector('#incident-timeline'); \
                   const mine = box.querySelectorAll('rect.tl-incident[data-cluster=\"{victim}\"]').length; \
                   const day = Date.now() - 86400e3; \
                   const recent = state.fleet.filter(f => !f.resolved_at || Date.parse(f.resolved_at) > day); \
                   const members = recent.reduce((n, f) => n + f.members.length, 0); \
                   return mine >= 1 && box.querySelectorAll('rect.tl-fleet').length === recent.length \
                     && box.querySelectorAll('path.tl-member').length === members \
                     ? [mine, recent.length, members, box.querySelectorAll('rect.tl-incident').length] : null; }})()"
            ),
            30,
        )
        .await?;
    eprintln!("timeline: [victim's bars, fleet incidents, their members, all bars] = {lanes}");
    br.screenshot_of("#incident-timeline", "console-timeline.png")
        .await?;

    // GitOps: the policy bundle synced on all six clusters in the matrix, its revision in each cell
    br.eval("document.querySelector('#tabs button[data-tab=\"gitops\"]').click(); true")
        .await?;
    let cells = br
        .wait_for(
            "policy-rbac synced in every cell of the release × cluster matrix",
            "(() => { const cells = [...document.querySelectorAll('#gitops-matrix-table tr[data-release=\"policy-rbac\"] td.cell.Synced')]; \
               return cells.length === 6 ? cells.map(c => c.textContent) : null; })()",
            60,
        )
        .await?;
    let cells: Vec<String> = serde_json::from_value(cells)?;
    assert!(
        cells
            .iter()
            .all(|c| c.starts_with('r') && c[1..].parse::<u64>().is_ok()),
        "{cells:?}"
    );
    br.screenshot_of("#gitops-matrix", "console-gitops-matrix.png")
        .await?;

    // Releases: policy-rbac's rollout, its batch passed its gate, a step per cluster
    br.eval("document.querySelector('#tabs button[data-tab=\"releases\"]').click(); true")
        .await?;
    let steps = br
        .wait_for(
            "policy-rbac's rollout with a passed gate and its steps",
            "(() => { const pic = document.querySelector('svg.rollout[data-release=\"policy-rbac\"]'); \
               if (!pic || !pic.querySelector('rect.rollout-batch[data-outcome=\"passed\"]') \
                 || !pic.querySelector('path.rollout-gate[data-outcome=\"passed\"]')) return null; \
               return pic.querySelectorAll('line.rollout-step').length; })()",
            60,
        )
        .await?;
    assert!(steps.as_u64() >= Some(6), "steps drawn: {steps}");
    br.screenshot_of(
        "div.box[data-release=\"policy-rbac\"] .picture",
        "console-rollout.png",
    )
    .await?;

    // GPU pool: a bar per cluster with GPUs, its free count as the API says
    let console = format!(
        "http://127.0.0.1:{}/api/v1/gpu",
        sys.var("MULTIPILOT_CONSOLE_PORT")
    );
    let pools: Vec<Value> = reqwest::Client::new()
        .get(console)
        .bearer_auth(sys.token("operator")?)
        .send()
        .await?
        .json()
        .await?;
    anyhow::ensure!(!pools.is_empty(), "the simulated fleet has GPUs");
    br.eval("document.querySelector('#tabs button[data-tab=\"gpu\"]').click(); true")
        .await?;
    let bars = br
        .wait_for(
            "a GPU bar per cluster",
            &format!(
                "(() => {{ const b = [...document.querySelectorAll('#gpu-svg g.gpu-bar')]; \
                   return b.length === {} ? Object.fromEntries(b.map(g => [g.dataset.cluster, [+g.dataset.allocatable, +g.dataset.free]])) : null; }})()",
                pools.len()
            ),
            30,
        )
        .await?;
    for p in &pools {
        let c = p["cluster"].as_str().unwrap_or_default();
        // a cluster's GPUs are its nodes' (fixed); how many are free moves with its pods
        let (allocatable, free) = (bars[c][0].as_u64(), bars[c][1].as_u64());
        anyhow::ensure!(
            allocatable.is_some()
                && allocatable == p["allocatable"].as_u64()
                && free <= allocatable,
            "{c}: bar {allocatable:?} with {free:?} free, the API {p}"
        );
    }
    br.screenshot_of("#gpu-bars", "console-gpu.png").await?;
    Ok(())
}
