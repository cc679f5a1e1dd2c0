//! A kubelet and kube-proxy stand-in for the deployment drill: runs the workloads of rendered Kubernetes
//! manifests on this machine the way a node would, so the shipped manifests are proven to start, not just
//! to parse.
//!
//! Each pod gets its own network namespace (a veth on a private bridge, its own address, `/etc/hosts` with
//! the cluster's DNS names), its own mount and UTS namespaces (ConfigMap, Secret, PVC and emptyDir volumes
//! bind-mounted at their real absolute paths, the service-account files at
//! `/var/run/secrets/kubernetes.io/serviceaccount`, a read-only root where the container asks for one) and
//! runs as the user its security context names. Environment variables follow the pod spec (`value`,
//! `valueFrom` ConfigMap/Secret keys and downward-API fields, `envFrom`, `$(VAR)` expansion), plus
//! `KUBERNETES_SERVICE_HOST/PORT` when an apiserver is given. Containers restart per `restartPolicy`.
//! Services with a cluster IP get an address on the bridge and a TCP proxy to their ready endpoints
//! (`targetPort`, by number or name); headless Services resolve to their pods.
//!
//! What it does not emulate: images (a container's `command[0]` names a binary of this machine), resource
//! limits, probes other than HTTP GET and TCP, init containers, service-links environment variables, and
//! scheduling. It needs root, `ip` (iproute2), `unshare`, `setpriv` and `mount`.

pub mod compose;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use base64::Engine as _;
use serde_json::Value;

/// Rendered manifests: every object of a `kubectl kustomize` output (or any multi-document YAML).
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    /// The objects, in order.
    pub objects: Vec<Value>,
}

impl Manifests {
    /// Parses multi-document YAML.
    pub fn parse(yaml: &str) -> Result<Self> {
        let mut objects = Vec::new();
        for doc in serde_yaml::Deserializer::from_str(yaml) {
            let v: Value = serde::Deserialize::deserialize(doc).context("a YAML document")?;
            if !v.is_null() {
                objects.push(v);
            }
        }
        Ok(Manifests { objects })
    }

    /// `kubectl kustomize DIR`.
    pub fn render(dir: &Path) -> Result<Self> {
        let out = Command::new("kubectl")
            .arg("kustomize")
            .arg(dir)
            .output()
            .context("running kubectl kustomize (is kubectl installed?)")?;
        if !out.status.success() {
            bail!(
                "kubectl kustomize {} failed: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Self::parse(&String::from_utf8_lossy(&out.stdout))
    }

    /// Adds objects (e.g. the Secrets an operator creates by hand).
    pub fn extend(&mut self, other: Manifests) {
        self.objects.extend(other.objects);
    }

    /// Objects of one kind.
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects.iter().filter(move |o| o["kind"] == kind)
    }

    /// One object by kind, namespace and name.
    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.objects.iter().find(|o| {
            o["kind"] == kind && o["metadata"]["name"] == name && namespace_of(o) == namespace
        })
    }

    /// The whole set as multi-document YAML (for `kubectl apply -f -`).
    pub fn to_yaml(&self) -> Result<String> {
        let mut out = String::new();
        for o in &self.objects {
            out.push_str("---\n");
            out.push_str(&serde_yaml::to_string(o)?);
        }
        Ok(out)
    }
}

/// An object's namespace (`default` when unset).
pub fn namespace_of(o: &Value) -> &str {
    o["metadata"]["namespace"].as_str().unwrap_or("default")
}

/// A map of strings (labels, a selector); empty when absent.
fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn str_of<'a>(v: &'a Value, what: &str) -> Result<&'a str> {
    v.as_str()
        .ok_or_else(|| anyhow!("{what} is missing or not a string"))
}

/// The apiserver pods reach through their service account.
#[derive(Debug, Clone)]
pub struct ApiServer {
    /// Its address, reachable from the pod network (the bridge's address).
    pub host: Ipv4Addr,
    /// Its port.
    pub port: u16,
    /// The token written to every pod's service-account `token` file.
    pub token: String,
    /// The CA that signed its serving certificate (`ca.crt`).
    pub ca_pem: String,
}

/// Settings of one emulated node.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `command[0]` → the binary that stands in for it.
    pub binaries: BTreeMap<String, PathBuf>,
    /// The apiserver behind `kubernetes.default.svc` and the service-account files.
    pub apiserver: Option<ApiServer>,
}

#[derive(Debug, Clone)]
struct PodPlan {
    name: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    ip: Ipv4Addr,
    spec: Value,
    /// Owner kind (Deployment, StatefulSet, Job, DaemonSet).
    owner: String,
    /// Per-pod claims (StatefulSet volumeClaimTemplates): volume name → claim name.
    claims: BTreeMap<String, String>,
    /// StatefulSet pods: `<pod>.<serviceName>`.
    subdomain: Option<String>,
}

/// What the node knows of one pod while it runs.
#[derive(Debug, Default)]
struct PodState {
    /// Process ids of the running containers.
    pids: Mutex<Vec<u32>>,
    restarts: AtomicU32,
    succeeded: AtomicBool,
    /// Why it can't start (a missing Secret, an unknown binary…), as `kubectl describe` would say.
    failure: Mutex<Option<String>>,
}

/// A Service as kube-proxy and DNS see it.
#[derive(Debug, Clone)]
struct ServicePlan {
    name: String,
    namespace: String,
    selector: BTreeMap<String, String>,
    /// `None`: headless.
    ip: Option<Ipv4Addr>,
    /// (port, targetPort as written).
    ports: Vec<(u16, Value)>,
}

/// One emulated node: a pod network, the pods of some manifests, and kube-proxy for their Services.
#[derive(Debug)]
pub struct Node {
    prefix: String,
    net: [u8; 3],
    bridge: String,
    manifests: Manifests,
    options: Options,
    pods: Vec<(PodPlan, Arc<PodState>)>,
    services: Vec<ServicePlan>,
    dir: tempfile::TempDir,
    created_dirs: Vec<PathBuf>,
    cancel: tokio_util::sync::CancellationToken,
    namespaces: Vec<String>,
    /// Extra DNS names → (namespace, Service): how another cluster reaches an exposed Service.
    aliases: Vec<(String, String, String)>,
}

/// Mount points created on the host, with how many nodes use each.
static MOUNTPOINTS: Mutex<BTreeMap<PathBuf, usize>> = Mutex::new(BTreeMap::new());

/// Tells nodes of one process apart (bridge, namespace and interface names, subnets).
static NODES: AtomicU32 = AtomicU32::new(0);

fn sh(cmd: &str) -> Result<()> {
    let out = Command::new("sh").arg("-c").arg(cmd).output()?;
    if !out.status.success() {
        bail!(
            "`{cmd}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Node {
    /// Checks what the node needs: root and the namespace tools.
    pub fn preflight() -> Result<()> {
        let uid = Command::new("id").arg("-u").output()?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            bail!("the deployment drill runs pods in network and mount namespaces: it needs root");
        }
        for tool in ["ip", "unshare", "setpriv", "mount", "hostname"] {
            if Command::new("sh")
                .arg("-c")
                .arg(format!("command -v {tool}"))
                .output()?
                .stdout
                .is_empty()
            {
                bail!("the deployment drill needs `{tool}` (iproute2 / util-linux)");
            }
        }
        Ok(())
    }

    /// Creates the pod network (a bridge with the gateway address `<net>.1`) and plans a pod for every
    /// workload of `manifests`. The bridge's address is [`Node::gateway`]: start an apiserver there.
    pub fn new(manifests: Manifests, options: Options) -> Result<Self> {
        Self::preflight()?;
        let n = NODES.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("mp{:03x}{n:x}", std::process::id() & 0xfff);
        // a /24 no interface of this machine uses yet (another node, another test process)
        let used = String::from_utf8_lossy(
            &Command::new("ip")
                .args(["-o", "-4", "addr"])
                .output()?
                .stdout,
        )
        .into_owned();
        let start = (std::process::id() + n * 37) % 200;
        let third = (0..200)
            .map(|i| 16 + ((start + i) % 200) as u8)
            .find(|t| !used.contains(&format!(" 10.213.{t}.")))
            .context("no free 10.213.x.0/24 for the pod network")?;
        let net = [10, 213, third];
        let bridge = format!("{prefix}br");
        let _ = sh(&format!("ip link del {bridge} 2>/dev/null"));
        sh(&format!(
            "ip link add {bridge} type bridge && ip addr add {}.{}.{}.1/24 dev {bridge} && ip link set {bridge} up",
            net[0], net[1], net[2]
        ))?;
        let mut node = Node {
            prefix,
            net,
            bridge,
            manifests: Manifests::default(),
            options,
            pods: Vec::new(),
            services: Vec::new(),
            dir: tempfile::tempdir()?,
            created_dirs: Vec::new(),
            cancel: tokio_util::sync::CancellationToken::new(),
            namespaces: Vec::new(),
            aliases: Vec::new(),
        };
        node.plan(manifests)?;
        Ok(node)
    }

    /// Makes `name` resolve, in every pod, to the Service `namespace/service` (before [`Node::start`]): an
    /// exposed Service as workloads in other clusters reach it (a load balancer and its DNS record).
    pub fn alias(&mut self, name: &str, namespace: &str, service: &str) {
        self.aliases
            .push((name.to_string(), namespace.to_string(), service.to_string()));
    }

    /// Sets the apiserver the pods' service accounts reach (before [`Node::start`]).
    pub fn set_apiserver(&mut self, api: ApiServer) {
        self.options.apiserver = Some(api);
    }

    /// The bridge's address: where the host side (an apiserver, the test) is reachable from pods.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.net[0], self.net[1], self.net[2], 1)
    }

    fn addr(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(self.net[0], self.net[1], self.net[2], host)
    }

    fn plan(&mut self, manifests: Manifests) -> Result<()> {
        let mut next = 10u8;
        for o in &manifests.objects {
            let kind = o["kind"].as_str().unwrap_or_default();
            let (replicas, template) = match kind {
                "Deployment" | "StatefulSet" => (
                    o["spec"]["replicas"].as_u64().unwrap_or(1),
                    &o["spec"]["template"],
                ),
                "DaemonSet" | "Job" => (1, &o["spec"]["template"]),
                _ => continue,
            };
            let name = str_of(&o["metadata"]["name"], "metadata.name")?;
            for i in 0..replicas {
                let pod_name = match kind {
                    "StatefulSet" => format!("{name}-{i}"),
                    "Job" => format!("{name}-job"),
                    _ => format!("{name}-{i:x}pod"),
                };
                let mut claims = BTreeMap::new();
                if kind == "StatefulSet" {
                    for t in o["spec"]["volumeClaimTemplates"]
                        .as_array()
                        .into_iter()
                        .flatten()
                    {
                        let v = str_of(&t["metadata"]["name"], "volumeClaimTemplates name")?;
                        claims.insert(v.to_string(), format!("{v}-{pod_name}"));
                    }
                }
                let labels = string_map(&template["metadata"]["labels"]);
                let ip = self.addr(next);
                next = next.checked_add(1).context("too many pods for one node")?;
                self.pods.push((
                    PodPlan {
                        name: pod_name,
                        namespace: namespace_of(o).to_string(),
                        labels,
                        ip,
                        spec: template["spec"].clone(),
                        owner: kind.to_string(),
                        claims,
                        subdomain: (kind == "StatefulSet")
                            .then(|| o["spec"]["serviceName"].as_str().map(String::from))
                            .flatten(),
                    },
                    Arc::new(PodState::default()),
                ));
            }
        }
        let mut next_svc = 200u8;
        for s in manifests.of_kind("Service") {
            let headless = s["spec"]["clusterIP"] == "None";
            let ip = if headless {
                None
            } else {
                let ip = self.addr(next_svc);
                next_svc = next_svc.checked_add(1).context("too many Services")?;
                Some(ip)
            };
            let selector = string_map(&s["spec"]["selector"]);
            let ports = s["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    let port = p["port"].as_u64().unwrap_or(0) as u16;
                    let target = if p["targetPort"].is_null() {
                        Value::from(port)
                    } else {
                        p["targetPort"].clone()
                    };
                    (port, target)
                })
                .collect();
            self.services.push(ServicePlan {
                name: str_of(&s["metadata"]["name"], "Service name")?.to_string(),
                namespace: namespace_of(s).to_string(),
                selector,
                ip,
                ports,
            });
        }
        self.manifests = manifests;
        Ok(())
    }

    /// The pods planned, by name, with their addresses.
    pub fn pods(&self) -> Vec<(String, Ipv4Addr)> {
        self.pods
            .iter()
            .map(|(p, _)| (p.name.clone(), p.ip))
            .collect()
    }

    fn selects(s: &ServicePlan, p: &PodPlan) -> bool {
        !s.selector.is_empty()
            && s.namespace == p.namespace
            && s.selector.iter().all(|(k, v)| p.labels.get(k) == Some(v))
    }

    /// A Service's address and port as a client inside the cluster reaches it (the proxy's address for a
    /// ClusterIP Service, the first pod for a headless one).
    pub fn service_addr(&self, namespace: &str, name: &str, port: u16) -> Result<SocketAddr> {
        let s = self
            .services
            .iter()
            .find(|s| s.namespace == namespace && s.name == name)
            .with_context(|| format!("no Service {namespace}/{name}"))?;
        match s.ip {
            Some(ip) => Ok(SocketAddr::from((ip, port))),
            None => {
                let (p, _) = self
                    .pods
                    .iter()
                    .find(|(p, _)| Self::selects(s, p))
                    .with_context(|| format!("headless Service {name} selects no pod"))?;
                let (_, target) = s
                    .ports
                    .iter()
                    .find(|(sp, _)| *sp == port)
                    .with_context(|| format!("Service {name} has no port {port}"))?;
                Ok(SocketAddr::from((p.ip, resolve_port(&p.spec, target)?)))
            }
        }
    }

    /// `/etc/hosts` as a pod in `namespace` sees the cluster's DNS.
    fn hosts_for(&self, me: &PodPlan) -> String {
        let mut out = String::from("127.0.0.1 localhost\n");
        let full = |n: &str, ns: &str| format!("{n}.{ns} {n}.{ns}.svc {n}.{ns}.svc.cluster.local");
        let mut line = format!("{} {}", me.ip, me.name);
        if let Some(sub) = &me.subdomain {
            line.push_str(&format!(
                " {}.{sub}.{}.svc.cluster.local",
                me.name, me.namespace
            ));
        }
        out.push_str(&line);
        out.push('\n');
        if self.options.apiserver.is_some() {
            out.push_str(&format!(
                "{} kubernetes kubernetes.default kubernetes.default.svc kubernetes.default.svc.cluster.local\n",
                self.gateway()
            ));
        }
        for (alias, ns, svc) in &self.aliases {
            let target = self
                .services
                .iter()
                .find(|s| &s.namespace == ns && &s.name == svc)
                .and_then(|s| {
                    s.ip.or_else(|| {
                        self.pods
                            .iter()
                            .find(|(p, _)| Self::selects(s, p))
                            .map(|(p, _)| p.ip)
                    })
                });
            if let Some(ip) = target {
                out.push_str(&format!("{ip} {alias}\n"));
            }
        }
        for s in &self.services {
            let short = if s.namespace == me.namespace {
                format!("{} ", s.name)
            } else {
                String::new()
            };
            let names = format!("{short}{}", full(&s.name, &s.namespace));
            match s.ip {
                Some(ip) => out.push_str(&format!("{ip} {names}\n")),
                None => {
                    let mut first = true;
                    for (p, _) in self.pods.iter().filter(|(p, _)| Self::selects(s, p)) {
                        let mut l = format!(
                            "{} {}.{}.{}.svc.cluster.local",
                            p.ip, p.name, s.name, s.namespace
                        );
                        if first {
                            l.push(' ');
                            l.push_str(&names);
                            first = false;
                        }
                        out.push_str(&l);
                        out.push('\n');
                    }
                }
            }
        }
        out
    }

    /// Starts the Service proxies and every pod. Pods that can't start (a missing Secret…) are recorded:
    /// see [`Node::failure`].
    pub async fn start(&mut self) -> Result<()> {
        for s in self.services.clone() {
            let Some(ip) = s.ip else { continue };
            sh(&format!("ip addr add {ip}/32 dev {}", self.bridge))?;
            for (port, target) in &s.ports {
                let listener = tokio::net::TcpListener::bind((ip, *port))
                    .await
                    .with_context(|| format!("Service {} proxy on {ip}:{port}", s.name))?;
                let endpoints: Vec<(Ipv4Addr, u16, Arc<PodState>)> = self
                    .pods
                    .iter()
                    .filter(|(p, _)| Self::selects(&s, p))
                    .filter_map(|(p, st)| {
                        resolve_port(&p.spec, target)
                            .ok()
                            .map(|tp| (p.ip, tp, st.clone()))
                    })
                    .collect();
                tokio::spawn(proxy(listener, endpoints, self.cancel.clone()));
            }
        }
        for i in 0..self.pods.len() {
            let (plan, state) = self.pods[i].clone();
            match self.prepare(&plan) {
                Ok(launch) => {
                    tokio::spawn(supervise(plan, state, launch, self.cancel.clone()));
                }
                Err(e) => {
                    *state.failure.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(format!("{e:#}"));
                }
            }
        }
        Ok(())
    }

    /// Why a pod could not start, if it could not.
    pub fn failure(&self, pod: &str) -> Option<String> {
        self.pods
            .iter()
            .find(|(p, _)| p.name == pod)
            .and_then(|(_, s)| s.failure.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// How often a pod's containers were restarted.
    pub fn restarts(&self, pod: &str) -> u32 {
        self.pods
            .iter()
            .find(|(p, _)| p.name == pod)
            .map(|(_, s)| s.restarts.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// A pod's log (every container, every restart).
    pub fn log(&self, pod: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("logs").join(format!("{pod}.log")))
            .unwrap_or_default()
    }

    /// Whether a pod is ready now: a Job's pod has succeeded; any other pod answers every container's
    /// readiness probe (a container without one is ready once running).
    pub async fn ready(&self, pod: &str) -> bool {
        let Some((plan, state)) = self.pods.iter().find(|(p, _)| p.name == pod) else {
            return false;
        };
        if plan.owner == "Job" {
            return state.succeeded.load(Ordering::Relaxed);
        }
        if state
            .pids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            return false;
        }
        for c in plan.spec["containers"].as_array().into_iter().flatten() {
            let probe = &c["readinessProbe"];
            if probe.is_null() {
                continue;
            }
            if !probe_once(plan, probe).await {
                return false;
            }
        }
        true
    }

    /// Waits until every pod is ready, or fails naming those that are not, with their last log lines.
    pub async fn wait_all_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut waiting = Vec::new();
            for (p, _) in &self.pods {
                if !self.ready(&p.name).await {
                    waiting.push(p.name.clone());
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let mut msg = format!("pods not ready after {timeout:?}: {waiting:?}");
                for w in &waiting {
                    if let Some(f) = self.failure(w) {
                        msg.push_str(&format!("\n{w}: cannot start: {f}"));
                    }
                    let log = self.log(w);
                    let tail: Vec<&str> = log.lines().rev().take(15).collect();
                    msg.push_str(&format!(
                        "\n--- {w} (restarts {}) ---\n{}",
                        self.restarts(w),
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    ));
                }
                bail!(msg);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// For every Service port: a pod it selects listens on its `targetPort`. Returns one line per port
    /// checked.
    pub async fn check_services(&self) -> Result<Vec<String>> {
        let mut checked = Vec::new();
        for s in &self.services {
            let pods: Vec<&PodPlan> = self
                .pods
                .iter()
                .map(|(p, _)| p)
                .filter(|p| Self::selects(s, p))
                .collect();
            if pods.is_empty() {
                bail!("Service {}/{} selects no pod", s.namespace, s.name);
            }
            for (port, target) in &s.ports {
                let mut ok = false;
                for p in &pods {
                    let tp = resolve_port(&p.spec, target).with_context(|| {
                        format!("Service {}/{} port {port}", s.namespace, s.name)
                    })?;
                    if tokio::net::TcpStream::connect((p.ip, tp)).await.is_ok() {
                        ok = true;
                        checked.push(format!(
                            "{}/{}:{port} -> {}:{tp}",
                            s.namespace, s.name, p.name
                        ));
                        break;
                    }
                }
                if !ok {
                    bail!(
                        "Service {}/{} port {port} (targetPort {target}): no selected pod listens there",
                        s.namespace,
                        s.name
                    );
                }
            }
        }
        Ok(checked)
    }

    fn volume_dir(&self, plan: &PodPlan, vol: &Value) -> Result<PathBuf> {
        let name = str_of(&vol["name"], "volume name")?;
        let pod_dir = self.dir.path().join("pods").join(&plan.name);
        let find = |kind: &str, obj: &str| self.manifests.get(kind, &plan.namespace, obj);
        let write_keys =
            |dir: &Path, data: BTreeMap<String, Vec<u8>>, items: &Value| -> Result<()> {
                std::fs::create_dir_all(dir)?;
                match items.as_array() {
                    Some(items) => {
                        for it in items {
                            let key = str_of(&it["key"], "items.key")?;
                            let path = str_of(&it["path"], "items.path")?;
                            let bytes = data
                                .get(key)
                                .with_context(|| format!("key {key} is not in it"))?;
                            let target = dir.join(path);
                            if let Some(parent) = target.parent() {
                                std::fs::create_dir_all(parent)?;
                            }
                            std::fs::write(target, bytes)?;
                        }
                    }
                    None => {
                        for (k, v) in data {
                            std::fs::write(dir.join(k), v)?;
                        }
                    }
                }
                Ok(())
            };
        if let Some(cm) = vol.get("configMap") {
            let cm_name = str_of(&cm["name"], "configMap.name")?;
            let dir = pod_dir.join("volumes").join(name);
            match find("ConfigMap", cm_name) {
                Some(obj) => write_keys(&dir, config_map_data(obj), &cm["items"])
                    .with_context(|| format!("volume {name}: ConfigMap {cm_name}"))?,
                None if cm["optional"] == true => std::fs::create_dir_all(&dir)?,
                None => bail!("volume {name}: configmap \"{cm_name}\" not found"),
            }
            return Ok(dir);
        }
        if let Some(sec) = vol.get("secret") {
            let sec_name = str_of(&sec["secretName"], "secret.secretName")?;
            let dir = pod_dir.join("volumes").join(name);
            match find("Secret", sec_name) {
                Some(obj) => write_keys(&dir, secret_data(obj)?, &sec["items"])
                    .with_context(|| format!("volume {name}: Secret {sec_name}"))?,
                None if sec["optional"] == true => std::fs::create_dir_all(&dir)?,
                None => bail!("volume {name}: secret \"{sec_name}\" not found"),
            }
            return Ok(dir);
        }
        if let Some(proj) = vol.get("projected") {
            let dir = pod_dir.join("volumes").join(name);
            std::fs::create_dir_all(&dir)?;
            for src in proj["sources"].as_array().into_iter().flatten() {
                if let Some(cm) = src.get("configMap") {
                    let n = str_of(&cm["name"], "projected configMap.name")?;
                    match find("ConfigMap", n) {
                        Some(obj) => write_keys(&dir, config_map_data(obj), &cm["items"])?,
                        None if cm["optional"] == true => {}
                        None => bail!("volume {name}: configmap \"{n}\" not found"),
                    }
                } else if let Some(sec) = src.get("secret") {
                    let n = str_of(&sec["name"], "projected secret.name")?;
                    match find("Secret", n) {
                        Some(obj) => write_keys(&dir, secret_data(obj)?, &sec["items"])?,
                        None if sec["optional"] == true => {}
                        None => bail!("volume {name}: secret \"{n}\" not found"),
                    }
                } else {
                    bail!("volume {name}: only configMap and secret projections are emulated");
                }
            }
            return Ok(dir);
        }
        if let Some(hp) = vol.get("hostPath") {
            // the node's own file or directory, as it is (never chown'd)
            let path = PathBuf::from(str_of(&hp["path"], "hostPath.path")?);
            if !path.exists() {
                bail!("volume {name}: hostPath {} does not exist", path.display());
            }
            return Ok(path);
        }
        if vol.get("emptyDir").is_some() {
            let dir = pod_dir.join("volumes").join(name);
            std::fs::create_dir_all(&dir)?;
            return Ok(dir);
        }
        if let Some(pvc) = vol.get("persistentVolumeClaim") {
            let claim = str_of(&pvc["claimName"], "claimName")?;
            if find("PersistentVolumeClaim", claim).is_none() {
                bail!("volume {name}: persistentvolumeclaim \"{claim}\" not found");
            }
            return self.claim_dir(&plan.namespace, claim);
        }
        bail!(
            "volume {name}: this node knows configMap, secret, emptyDir and persistentVolumeClaim volumes only"
        )
    }

    fn claim_dir(&self, namespace: &str, claim: &str) -> Result<PathBuf> {
        let dir = self.dir.path().join("claims").join(namespace).join(claim);
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// Everything needed to start the pod's containers, or why it can't start.
    fn prepare(&mut self, plan: &PodPlan) -> Result<Launch> {
        let spec = &plan.spec;
        let pod_dir = self.dir.path().join("pods").join(&plan.name);
        std::fs::create_dir_all(&pod_dir)?;
        std::fs::create_dir_all(self.dir.path().join("logs"))?;
        // volumes
        let mut volumes: BTreeMap<String, PathBuf> = BTreeMap::new();
        let mut host_paths = Vec::new();
        for v in spec["volumes"].as_array().into_iter().flatten() {
            let name = str_of(&v["name"], "volume name")?.to_string();
            if v.get("hostPath").is_some() {
                host_paths.push(name.clone());
            }
            volumes.insert(name, self.volume_dir(plan, v)?);
        }
        for (vol, claim) in &plan.claims {
            volumes.insert(vol.clone(), self.claim_dir(&plan.namespace, claim)?);
        }
        let psc = &spec["securityContext"];
        let fs_group = psc["fsGroup"].as_u64();
        if let Some(g) = fs_group {
            for (name, dir) in &volumes {
                if host_paths.contains(name) {
                    continue;
                }
                sh(&format!(
                    "chgrp -R {g} '{}' && chmod -R g+rwX '{}'",
                    dir.display(),
                    dir.display()
                ))?;
            }
        }
        // the service account's files
        let mut sa_dir = None;
        if spec["automountServiceAccountToken"] != false
            && let Some(api) = &self.options.apiserver
        {
            let dir = pod_dir.join("serviceaccount");
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("token"), &api.token)?;
            std::fs::write(dir.join("ca.crt"), &api.ca_pem)?;
            std::fs::write(dir.join("namespace"), &plan.namespace)?;
            sh(&format!("chmod -R a+rX '{}'", dir.display()))?;
            sa_dir = Some(dir);
        }
        // the network namespace
        let netns = format!("{}-{}", self.prefix, plan.ip.octets()[3]);
        let veth = format!("{}v{}", self.prefix, plan.ip.octets()[3]);
        let _ = sh(&format!("ip netns del {netns} 2>/dev/null"));
        sh(&format!(
            "ip netns add {netns} && ip link add {veth}a type veth peer name {veth}b && \
             ip link set {veth}b netns {netns} && ip link set {veth}a master {br} up && \
             ip -n {netns} addr add {ip}/24 dev {veth}b && ip -n {netns} link set {veth}b up && \
             ip -n {netns} link set lo up && ip -n {netns} route add default via {gw}",
            br = self.bridge,
            ip = plan.ip,
            gw = self.gateway()
        ))?;
        self.namespaces.push(netns.clone());
        let etc = PathBuf::from("/etc/netns").join(&netns);
        std::fs::create_dir_all(&etc)?;
        std::fs::write(etc.join("hosts"), self.hosts_for(plan))?;
        std::fs::write(etc.join("resolv.conf"), "")?;

        let mut containers = Vec::new();
        for c in spec["containers"].as_array().into_iter().flatten() {
            let cname = str_of(&c["name"], "container name")?;
            let env = self.env_of(plan, c)?;
            let command: Vec<String> = c["command"]
                .as_array()
                .with_context(|| {
                    format!("container {cname}: no command (this node runs no images)")
                })?
                .iter()
                .chain(c["args"].as_array().into_iter().flatten())
                .map(|a| expand(a.as_str().unwrap_or_default(), &env))
                .collect();
            let binary = self
                .options
                .binaries
                .get(&command[0])
                .with_context(|| {
                    format!(
                        "container {cname}: no binary stands in for `{}`",
                        command[0]
                    )
                })?
                .clone();
            let mut mounts = Vec::new();
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                let vname = str_of(&m["name"], "volumeMount name")?;
                let src = volumes.get(vname).with_context(|| {
                    format!("container {cname}: volumeMount {vname} names no volume")
                })?;
                let src = match m["subPath"].as_str() {
                    Some(sub) => src.join(sub),
                    None => src.clone(),
                };
                let target = PathBuf::from(str_of(&m["mountPath"], "mountPath")?);
                mounts.push((src, target, m["readOnly"] == true));
            }
            if let Some(dir) = &sa_dir {
                mounts.push((
                    dir.clone(),
                    PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount"),
                    true,
                ));
            }
            for (src, target, _) in &mounts {
                self.ensure_mountpoint(target, src.is_dir())?;
            }
            let csc = &c["securityContext"];
            let user = csc["runAsUser"].as_u64().or(psc["runAsUser"].as_u64());
            let group = csc["runAsGroup"]
                .as_u64()
                .or(psc["runAsGroup"].as_u64())
                .or(user);
            containers.push(ContainerLaunch {
                name: cname.to_string(),
                binary,
                args: command[1..].to_vec(),
                env,
                mounts,
                read_only_root: csc["readOnlyRootFilesystem"] == true,
                user,
                group,
                fs_group,
            });
        }
        Ok(Launch {
            netns,
            hostname: plan.name.clone(),
            containers,
            log: self
                .dir
                .path()
                .join("logs")
                .join(format!("{}.log", plan.name)),
            restart: match spec["restartPolicy"].as_str() {
                Some("Never") => Restart::Never,
                Some("OnFailure") => Restart::OnFailure,
                _ if plan.owner == "Job" => Restart::OnFailure,
                _ => Restart::Always,
            },
        })
    }

    /// Makes sure a mount point exists on the host (an empty directory or file). What a node creates is
    /// counted process-wide, so that nodes running side by side (parallel tests) share mount points and only
    /// the last one to stop removes them: unlinking a directory that is a mount point in another pod's mount
    /// namespace would detach that pod's volume.
    fn ensure_mountpoint(&mut self, target: &Path, dir: bool) -> Result<()> {
        let mut created = MOUNTPOINTS.lock().unwrap_or_else(|e| e.into_inner());
        // every missing ancestor, outermost first, then the target
        let mut chain: Vec<PathBuf> = target
            .ancestors()
            .filter(|p| created.contains_key(*p) || !p.exists())
            .map(Path::to_path_buf)
            .collect();
        chain.reverse();
        for (i, p) in chain.iter().enumerate() {
            if let Some(n) = created.get_mut(p) {
                *n += 1;
            } else {
                let is_target = i + 1 == chain.len();
                if is_target && !dir {
                    std::fs::write(p, b"")?;
                } else {
                    std::fs::create_dir(p)?;
                }
                created.insert(p.clone(), 1);
            }
            self.created_dirs.push(p.clone());
        }
        Ok(())
    }

    fn env_of(&self, plan: &PodPlan, c: &Value) -> Result<Vec<(String, String)>> {
        let mut env: Vec<(String, String)> = vec![
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("HOSTNAME".into(), plan.name.clone()),
        ];
        if let Some(api) = &self.options.apiserver {
            env.push(("KUBERNETES_SERVICE_HOST".into(), api.host.to_string()));
            env.push(("KUBERNETES_SERVICE_PORT".into(), api.port.to_string()));
        }
        let find = |kind: &str, name: &str| self.manifests.get(kind, &plan.namespace, name);
        for from in c["envFrom"].as_array().into_iter().flatten() {
            let prefix = from["prefix"].as_str().unwrap_or_default();
            let (data, what) = if let Some(r) = from.get("configMapRef") {
                let n = str_of(&r["name"], "configMapRef.name")?;
                match find("ConfigMap", n) {
                    Some(o) => (config_map_data(o), n),
                    None if r["optional"] == true => continue,
                    None => bail!("envFrom: configmap \"{n}\" not found"),
                }
            } else if let Some(r) = from.get("secretRef") {
                let n = str_of(&r["name"], "secretRef.name")?;
                match find("Secret", n) {
                    Some(o) => (secret_data(o)?, n),
                    None if r["optional"] == true => continue,
                    None => bail!("envFrom: secret \"{n}\" not found"),
                }
            } else {
                continue;
            };
            let _ = what;
            for (k, v) in data {
                env.push((
                    format!("{prefix}{k}"),
                    String::from_utf8_lossy(&v).into_owned(),
                ));
            }
        }
        for e in c["env"].as_array().into_iter().flatten() {
            let name = str_of(&e["name"], "env name")?.to_string();
            let value = if let Some(v) = e.get("value") {
                expand(v.as_str().unwrap_or_default(), &env)
            } else if let Some(vf) = e.get("valueFrom") {
                let key_of = |r: &Value, kind: &str| -> Result<Option<String>> {
                    let n = str_of(&r["name"], "keyRef name")?;
                    let k = str_of(&r["key"], "keyRef key")?;
                    let data = match (kind, find(kind, n)) {
                        ("ConfigMap", Some(o)) => config_map_data(o),
                        ("Secret", Some(o)) => secret_data(o)?,
                        (_, None) if r["optional"] == true => return Ok(None),
                        (_, _) => bail!("env {name}: {} \"{n}\" not found", kind.to_lowercase()),
                    };
                    match data.get(k) {
                        Some(v) => Ok(Some(String::from_utf8_lossy(v).into_owned())),
                        None if r["optional"] == true => Ok(None),
                        None => bail!("env {name}: key {k} not in {} {n}", kind.to_lowercase()),
                    }
                };
                let got = if let Some(r) = vf.get("configMapKeyRef") {
                    key_of(r, "ConfigMap")?
                } else if let Some(r) = vf.get("secretKeyRef") {
                    key_of(r, "Secret")?
                } else if let Some(f) = vf.get("fieldRef") {
                    Some(match f["fieldPath"].as_str().unwrap_or_default() {
                        "metadata.name" => plan.name.clone(),
                        "metadata.namespace" => plan.namespace.clone(),
                        "status.podIP" => plan.ip.to_string(),
                        "spec.nodeName" => "drill-node".into(),
                        "spec.serviceAccountName" => plan.spec["serviceAccountName"]
                            .as_str()
                            .unwrap_or("default")
                            .into(),
                        other => bail!("env {name}: fieldRef {other} is not emulated"),
                    })
                } else {
                    bail!("env {name}: this valueFrom is not emulated")
                };
                match got {
                    Some(v) => v,
                    None => continue,
                }
            } else {
                String::new()
            };
            env.retain(|(k, _)| *k != name);
            env.push((name, value));
        }
        Ok(env)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.cancel.cancel();
        for (_, st) in &self.pods {
            for pid in st.pids.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                let _ = Command::new("kill")
                    .arg("-9")
                    .arg(pid.to_string())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
            let _ = std::fs::remove_dir_all(PathBuf::from("/etc/netns").join(ns));
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .stderr(Stdio::null())
            .status();
        let mut created = MOUNTPOINTS.lock().unwrap_or_else(|e| e.into_inner());
        for d in self.created_dirs.iter().rev() {
            let Some(n) = created.get_mut(d) else {
                continue;
            };
            *n -= 1;
            if *n == 0 {
                created.remove(d);
                // only what is still empty: never anything a pod wrote through to the host
                let _ = if d.is_dir() {
                    std::fs::remove_dir(d)
                } else {
                    std::fs::remove_file(d)
                };
            }
        }
    }
}

fn config_map_data(o: &Value) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for (k, v) in o["data"].as_object().into_iter().flatten() {
        out.insert(
            k.clone(),
            v.as_str().unwrap_or_default().as_bytes().to_vec(),
        );
    }
    for (k, v) in o["binaryData"].as_object().into_iter().flatten() {
        if let Ok(b) =
            base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap_or_default())
        {
            out.insert(k.clone(), b);
        }
    }
    out
}

fn secret_data(o: &Value) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    for (k, v) in o["data"].as_object().into_iter().flatten() {
        let b = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .with_context(|| format!("secret key {k} is not base64"))?;
        out.insert(k.clone(), b);
    }
    for (k, v) in o["stringData"].as_object().into_iter().flatten() {
        out.insert(
            k.clone(),
            v.as_str().unwrap_or_default().as_bytes().to_vec(),
        );
    }
    Ok(out)
}

/// Kubernetes' `$(VAR)` expansion in command, args and env values (`$$` escapes).
fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&format!("$({name})")),
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A Service `targetPort` (number or container port name) → the pod's port number.
fn resolve_port(spec: &Value, target: &Value) -> Result<u16> {
    if let Some(n) = target.as_u64() {
        return Ok(n as u16);
    }
    let name = target
        .as_str()
        .context("targetPort is neither a number nor a name")?;
    if let Ok(n) = name.parse::<u16>() {
        return Ok(n);
    }
    for c in spec["containers"].as_array().into_iter().flatten() {
        for p in c["ports"].as_array().into_iter().flatten() {
            if p["name"] == name {
                return Ok(p["containerPort"].as_u64().unwrap_or(0) as u16);
            }
        }
    }
    bail!("no container port is named {name}")
}

async fn probe_once(plan: &PodPlan, probe: &Value) -> bool {
    let port = |p: &Value| resolve_port(&plan.spec, p).ok();
    if let Some(get) = probe.get("httpGet") {
        let Some(port) = port(&get["port"]) else {
            return false;
        };
        let path = get["path"].as_str().unwrap_or("/");
        let scheme = get["scheme"].as_str().unwrap_or("HTTP").to_lowercase();
        let client = match reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .danger_accept_invalid_certs(true)
            .build()
        {
            Ok(c) => c,
            Err(_) => return false,
        };
        return client
            .get(format!("{scheme}://{}:{port}{path}", plan.ip))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success() || r.status().is_redirection());
    }
    if let Some(tcp) = probe.get("tcpSocket") {
        let Some(port) = port(&tcp["port"]) else {
            return false;
        };
        return tokio::net::TcpStream::connect((plan.ip, port))
            .await
            .is_ok();
    }
    false
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Restart {
    Always,
    OnFailure,
    Never,
}

#[derive(Debug, Clone)]
struct ContainerLaunch {
    name: String,
    binary: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// (source on the host, mount path in the container, read-only)
    mounts: Vec<(PathBuf, PathBuf, bool)>,
    read_only_root: bool,
    user: Option<u64>,
    group: Option<u64>,
    fs_group: Option<u64>,
}

#[derive(Debug, Clone)]
struct Launch {
    netns: String,
    hostname: String,
    containers: Vec<ContainerLaunch>,
    log: PathBuf,
    restart: Restart,
}

fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// The container's process: `ip netns exec` (network namespace, /etc/hosts) → `unshare` (mount and UTS
/// namespaces) → a shell that mounts the volumes, makes the root read-only and sets the hostname → `setpriv`
/// (the user) → the binary, with exactly the pod's environment.
fn container_command(l: &Launch, c: &ContainerLaunch) -> Result<tokio::process::Command> {
    let mut script = String::from("set -e\n");
    script.push_str(&format!("hostname '{}'\n", l.hostname));
    // shallow mounts first, so a nested mount point is made inside its parent volume (as a container
    // runtime does); read-only only once every mount is in place
    let mut mounts = c.mounts.clone();
    mounts.sort_by_key(|(_, target, _)| target.components().count());
    for (src, target, _) in &mounts {
        let make = if src.is_dir() { "mkdir -p" } else { "touch" };
        script.push_str(&format!(
            "[ -e {t} ] || {make} {t}\nmount --bind {} {t}\n",
            quote(src),
            t = quote(target)
        ));
    }
    for (_, target, ro) in &mounts {
        if *ro {
            script.push_str(&format!("mount -o remount,bind,ro {}\n", quote(target)));
        }
    }
    if c.read_only_root {
        script.push_str("mount -o remount,bind,ro /\n");
    }
    let mut privs = String::new();
    if let Some(u) = c.user {
        privs = format!(
            "setpriv --reuid {u} --regid {} {} --",
            c.group.unwrap_or(u),
            match c.fs_group {
                Some(g) => format!("--groups {g}"),
                None => "--clear-groups".into(),
            }
        );
    }
    script.push_str(&format!("exec {privs} \"$@\"\n"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&l.log)?;
    let mut cmd = tokio::process::Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        &l.netns,
        "unshare",
        "--mount",
        "--uts",
        "--propagation",
        "private",
    ])
    .arg("sh")
    .arg("-c")
    .arg(script)
    .arg(&c.name)
    .arg(&c.binary)
    .args(&c.args)
    .env_clear()
    .envs(c.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    .stdin(Stdio::null())
    .stdout(log.try_clone()?)
    .stderr(log)
    .kill_on_drop(true);
    Ok(cmd)
}

/// Runs a pod's containers and restarts them as its restart policy says, until the node stops.
async fn supervise(
    plan: PodPlan,
    state: Arc<PodState>,
    launch: Launch,
    cancel: tokio_util::sync::CancellationToken,
) {
    let mut tasks = Vec::new();
    for c in launch.containers.clone() {
        let (launch, state, cancel, pod) = (
            launch.clone(),
            state.clone(),
            cancel.clone(),
            plan.name.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut backoff = Duration::from_millis(500);
            loop {
                let mut child =
                    match container_command(&launch, &c).and_then(|mut cmd| Ok(cmd.spawn()?)) {
                        Ok(child) => child,
                        Err(e) => {
                            *state.failure.lock().unwrap_or_else(|e| e.into_inner()) =
                                Some(format!("container {}: {e:#}", c.name));
                            return;
                        }
                    };
                let pid = child.id().unwrap_or_default();
                state
                    .pids
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(pid);
                let status = tokio::select! {
                    s = child.wait() => s.ok(),
                    _ = cancel.cancelled() => {
                        let _ = child.kill().await;
                        return;
                    }
                };
                state
                    .pids
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|p| *p != pid);
                let success = status.is_some_and(|s| s.success());
                if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&launch.log) {
                    use std::io::Write as _;
                    let _ = writeln!(f, "[node] {pod}/{} exited: {status:?}", c.name);
                }
                let again = match launch.restart {
                    Restart::Always => true,
                    Restart::OnFailure => !success,
                    Restart::Never => false,
                };
                if success && launch.restart != Restart::Always {
                    state.succeeded.store(true, Ordering::Relaxed);
                }
                if !again {
                    return;
                }
                state.restarts.fetch_add(1, Ordering::Relaxed);
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = cancel.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// kube-proxy for one Service port: each connection goes to a ready endpoint, round robin.
async fn proxy(
    listener: tokio::net::TcpListener,
    endpoints: Vec<(Ipv4Addr, u16, Arc<PodState>)>,
    cancel: tokio_util::sync::CancellationToken,
) {
    let next = Arc::new(AtomicU32::new(0));
    loop {
        let (mut inbound, _) = tokio::select! {
            a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
            _ = cancel.cancelled() => return,
        };
        let endpoints = endpoints.clone();
        let next = next.clone();
        tokio::spawn(async move {
            for _ in 0..endpoints.len().max(1) {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize % endpoints.len().max(1);
                let Some((ip, port, _)) = endpoints.get(i) else {
                    return;
                };
                if let Ok(mut out) = tokio::net::TcpStream::connect((*ip, *port)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    return;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollar_paren_expansion_follows_kubernetes() {
        let env = vec![("A".to_string(), "x".to_string())];
        assert_eq!(expand("$(A)-$(B)-$$(A)-$", &env), "x-$(B)-$(A)-$");
    }

    #[test]
    fn named_target_ports_resolve_through_the_container_ports() {
        let spec = serde_json::json!({"containers": [{"ports": [{"name": "http", "containerPort": 9468}]}]});
        assert_eq!(resolve_port(&spec, &Value::from("http")).unwrap(), 9468);
        assert_eq!(resolve_port(&spec, &Value::from(80)).unwrap(), 80);
        assert!(resolve_port(&spec, &Value::from("grpc")).is_err());
    }
}
