//! KubePrism on each simulated node: a TCP load balancer in front of the
//! cluster's kube-apiservers, which the kubelet and pods reach the API
//! through. It mirrors Talos 1.13.9's controllers
//! (internal/app/machined/pkg/controllers/k8s/kubeprism.go,
//! kubeprism_config.go and kubeprism_endpoints.go) and the balancer they
//! run, siderolabs/go-loadbalancer (pinned at v0.5.0 by Talos; read at
//! 5e7a8b2: controlplane/controlplane.go, loadbalancer/loadbalancer.go,
//! loadbalancer/target.go, loadbalancer/node.go, upstream/upstream.go)
//! over siderolabs/tcpproxy (tcpproxy.go, DialProxy).
//!
//! - On: `machine.features.kubePrism.enabled` in a configuration with a
//!   `cluster` section (on 1.14, a `KubePrismConfig` document too); port
//!   `machine.features.kubePrism.port`, 7445 when unset. Upstream listens
//!   on 127.0.0.1; simulated nodes share the host, so each listens on its
//!   own address instead. A change of port restarts it, disabling stops
//!   it; neither cuts the connections it already proxies (tcpproxy keeps no
//!   track of them), while a node that goes down (power off, reboot, reset)
//!   takes them with it.
//! - Upstreams, as the endpoints controller lists them: the control-plane
//!   endpoint (port 443 when it names none), the node's own API server when
//!   it is a control plane (upstream's `localhost:6443`: here the node's own
//!   address) and every control-plane member's address and API server port,
//!   duplicates dropped. Discovery keeps a member that powered off, so a
//!   node that is down stays listed (its health checks fail); the list is
//!   refreshed whenever any node boots or changes its configuration.
//! - Health: a TCP connect to each upstream in turn, each within
//!   [`TalosTiming::kubeprism_health_timeout`](crate::TalosTiming), every
//!   [`TalosTiming::kubeprism_health_interval`](crate::TalosTiming) after
//!   the previous round ends. The first round comes one interval after the
//!   start: upstream's list checks at once while it is still empty (the
//!   endpoints arrive on a channel after the start), so upstreams start
//!   unchecked. A success raises the score by one (at most 3) and sets the
//!   tier from how long the connect took; a failure lowers it by one (at
//!   least -3) and keeps the tier. New upstreams start at score 1, tier 1.
//! - A connection: the next upstream, round-robin from the last one picked,
//!   among those with a score of 0 or more in the lowest tier that has any;
//!   none, and it is closed. The picked upstream is dialled once (within
//!   [`TalosTiming::kubeprism_dial_timeout`](crate::TalosTiming)); when that
//!   fails the client's connection is closed and the upstream's score goes
//!   down by one: no other upstream is tried. Otherwise bytes are copied
//!   both ways until both sides are done; the connection stays on that
//!   upstream for its life.
//!
//! Not simulated: SO_LINGER on the health probes, the KubePrismStatuses
//! resource, `localAPIServerPort` (the simulator's API servers listen on
//! 6443), a member's other addresses, and 1.14's `tlsServerName`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use serde_norway::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::node::{Node, Power};
use crate::shared::Shared;

/// The port when the configuration names none (constants.DefaultKubePrismPort).
pub const DEFAULT_PORT: u16 = 7445;

/// TCP keep-alive period on both sides of a proxied connection
/// (constants.KubePrismKeepAlivePeriod).
const KEEP_ALIVE_PERIOD: Duration = Duration::from_secs(30);

/// TCP_USER_TIMEOUT on both sides of a proxied connection
/// (constants.KubePrismTCPUserTimeout).
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

/// Score bounds, steps and start: upstream.List's defaults.
const LOW_SCORE: i32 = -3;
const HIGH_SCORE: i32 = 3;
const FAIL_DELTA: i32 = -1;
const SUCCESS_DELTA: i32 = 1;
const INITIAL_SCORE: i32 = 1;

/// Tiers as loadbalancer.TCP's routes set them: 0 to 5, new upstreams in 1.
const MIN_TIER: u8 = 0;
const MAX_TIER: u8 = 5;
const INITIAL_TIER: u8 = 1;

/// The least connect time of each tier (loadbalancer/node.go).
const TIER_FLOORS: [Duration; 6] = [
    Duration::ZERO,
    Duration::from_micros(100),
    Duration::from_millis(1),
    Duration::from_millis(10),
    Duration::from_millis(100),
    Duration::from_secs(1),
];

/// One upstream of a node's KubePrism: where it stands and what went to
/// it since KubePrism last started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubePrismUpstream {
    /// `host:port`.
    pub address: String,
    /// Health score, -3 to 3; picked only at 0 or more.
    pub score: i32,
    /// Latency tier from the last successful health check (0 fastest);
    /// the lowest tier with a usable upstream is picked from.
    pub tier: u8,
    /// Connections proxied to it (the dial succeeded).
    pub proxied: u64,
    /// Connections picked for it whose dial failed (each closed, and the
    /// score lowered).
    pub dial_failures: u64,
    /// Proxied connections still open.
    pub open: u64,
}

impl KubePrismUpstream {
    /// Whether a new connection may be sent to it.
    pub fn usable(&self) -> bool {
        self.score >= 0
    }
}

/// A node's KubePrism.
pub(crate) struct KubePrism {
    /// Where the members are discovered (set when the node's supervisor
    /// starts).
    cluster: OnceLock<Weak<Shared>>,
    running: Mutex<Option<Instance>>,
    /// Fires when the node goes down: every proxied connection ends.
    process: Mutex<CancellationToken>,
}

struct Instance {
    port: u16,
    /// Stops the listener and the health checks.
    serving: CancellationToken,
    balancer: Arc<Balancer>,
}

impl KubePrism {
    pub(crate) fn new() -> KubePrism {
        KubePrism {
            cluster: OnceLock::new(),
            running: Mutex::new(None),
            process: Mutex::new(CancellationToken::new()),
        }
    }

    /// Stops it with the node: the listener, the health checks and every
    /// connection it proxies.
    pub(crate) fn stop(&self) {
        if let Some(instance) = self.running.lock().expect("kubeprism lock").take() {
            instance.serving.cancel();
        }
        let mut process = self.process.lock().expect("kubeprism lock");
        process.cancel();
        *process = CancellationToken::new();
    }

    /// Where it listens, while it does.
    pub(crate) fn addr(&self) -> Option<SocketAddr> {
        let running = self.running.lock().expect("kubeprism lock");
        let instance = running.as_ref()?;
        *instance.balancer.addr.lock().expect("kubeprism lock")
    }

    /// Its upstreams and their counters, while it runs.
    pub(crate) fn upstreams(&self) -> Vec<KubePrismUpstream> {
        self.balancer().map(|b| b.upstreams()).unwrap_or_default()
    }

    /// Connections proxied to each upstream since it started, by address
    /// (upstreams dropped from the list since included).
    pub(crate) fn upstream_connections(&self) -> BTreeMap<String, u64> {
        let Some(balancer) = self.balancer() else {
            return BTreeMap::new();
        };
        let counts = balancer.counts.lock().expect("kubeprism lock");
        counts
            .iter()
            .map(|(address, c)| (address.clone(), c.proxied))
            .collect()
    }

    fn balancer(&self) -> Option<Arc<Balancer>> {
        let running = self.running.lock().expect("kubeprism lock");
        running.as_ref().map(|i| i.balancer.clone())
    }
}

/// Remembers where `node`'s members are discovered.
pub(crate) fn attach(shared: &Arc<Shared>, node: &Node) {
    let _ = node.kubeprism.cluster.set(Arc::downgrade(shared));
}

/// Brings `node`'s KubePrism in line with the node (running on the port
/// its configuration gives while it is up, stopped otherwise), as
/// kubeprism.go's controller does on a config change, then refreshes
/// every node's upstreams: a node booting or changing its configuration
/// is what changes the members the others discover.
pub(crate) fn reconcile(node: &Node) {
    let want = if node.power() == Power::On && node.is_configured() {
        configured_port(&node.active_config(), node.talos_version().at_least_1_14())
    } else {
        None
    };
    {
        let mut running = node.kubeprism.running.lock().expect("kubeprism lock");
        let keep = matches!((running.as_ref(), want), (Some(i), Some(p)) if i.port == p);
        if !keep {
            if let Some(old) = running.take() {
                // Upstream's Shutdown closes the listener; the proxied
                // connections go on.
                old.serving.cancel();
                tracing::info!(node = %node.name, "KubePrism is disabled");
            }
            if let Some(port) = want {
                *running = Some(start(node, port));
            }
        }
    }
    let Some(shared) = node.kubeprism.cluster.get().and_then(Weak::upgrade) else {
        return;
    };
    let nodes = shared.nodes();
    for n in &nodes {
        if let Some(balancer) = n.kubeprism.balancer() {
            balancer.reconcile(&endpoints(n, &nodes));
        }
    }
}

fn start(node: &Node, port: u16) -> Instance {
    let serving = CancellationToken::new();
    let balancer = Arc::new(Balancer::default());
    let process = node
        .kubeprism
        .process
        .lock()
        .expect("kubeprism lock")
        .clone();
    let addr = SocketAddr::new(IpAddr::V4(node.ip), port);
    tokio::spawn(run(
        balancer.clone(),
        addr,
        serving.clone(),
        process,
        node.timing,
        node.name.clone(),
    ));
    Instance {
        port,
        serving,
        balancer,
    }
}

/// The port KubePrism listens on under `config`, None when it is off
/// (kubeprism_config.go; the endpoints controller needs the machine and
/// cluster sections). On 1.14 a `KubePrismConfig` document comes first.
pub(crate) fn configured_port(config: &str, v1_14: bool) -> Option<u16> {
    use serde::Deserialize as _;
    let docs: Vec<Value> = serde_norway::Deserializer::from_str(config)
        .filter_map(|doc| Value::deserialize(doc).ok())
        .collect();
    let v1alpha1 = docs
        .iter()
        .find(|d| d.get("machine").is_some() || d.get("cluster").is_some())?;
    let present = |key: &str| v1alpha1.get(key).is_some_and(|v| !v.is_null());
    if !present("machine") || !present("cluster") {
        return None;
    }
    let port = |v: Option<&Value>| -> Option<u16> {
        match v.and_then(Value::as_u64) {
            None | Some(0) => Some(DEFAULT_PORT),
            Some(p) => u16::try_from(p).ok(),
        }
    };
    if v1_14
        && let Some(doc) = docs
            .iter()
            .find(|d| d.get("kind").and_then(Value::as_str) == Some("KubePrismConfig"))
    {
        return port(doc.get("port"));
    }
    let prism = v1alpha1
        .get("machine")
        .and_then(|m| m.get("features"))
        .and_then(|f| f.get("kubePrism"))?;
    if prism.get("enabled").and_then(Value::as_bool) != Some(true) {
        return None;
    }
    port(prism.get("port"))
}

/// `node`'s upstreams among `nodes` (kubeprism_endpoints.go), in order,
/// duplicates included (the list drops them).
fn endpoints(node: &Node, nodes: &[Arc<Node>]) -> Vec<String> {
    let api = crate::kube_apiserver::PORT;
    let mut found = Vec::new();
    if let Some(endpoint) = cluster_endpoint(&node.active_config()) {
        found.push(endpoint);
    }
    if node.is_control_plane() {
        found.push(SocketAddr::new(IpAddr::V4(node.ip), api).to_string());
    }
    found.extend(
        nodes
            .iter()
            .filter(|n| n.is_control_plane())
            .map(|n| SocketAddr::new(IpAddr::V4(n.ip), api).to_string()),
    );
    found
}

/// `cluster.controlPlane.endpoint` as `host:port`, 443 when it names no
/// port or one that does not parse (toPort upstream).
fn cluster_endpoint(config: &str) -> Option<String> {
    use serde::Deserialize as _;
    let endpoint = serde_norway::Deserializer::from_str(config)
        .filter_map(|doc| Value::deserialize(doc).ok())
        .find_map(|doc| {
            doc.get("cluster")?
                .get("controlPlane")?
                .get("endpoint")?
                .as_str()
                .map(str::to_string)
        })?;
    let (host, port) = split_endpoint(&endpoint)?;
    let port: u32 = port.parse().unwrap_or(443);
    Some(if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

/// Host and port (possibly empty) of a URL's authority.
fn split_endpoint(url: &str) -> Option<(&str, &str)> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        return Some((host, after.strip_prefix(':').unwrap_or("")));
    }
    let (host, port) = authority.rsplit_once(':').unwrap_or((authority, ""));
    (!host.is_empty()).then_some((host, port))
}

/// The balancer: its upstream list and what went to each upstream.
#[derive(Default)]
struct Balancer {
    /// Where it listens, once it does.
    addr: Mutex<Option<SocketAddr>>,
    list: Mutex<List>,
    counts: Mutex<BTreeMap<String, Counts>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    proxied: u64,
    dial_failures: u64,
    open: u64,
}

impl Balancer {
    fn reconcile(&self, addresses: &[String]) {
        self.list
            .lock()
            .expect("kubeprism lock")
            .reconcile(addresses);
    }

    fn pick(&self) -> Option<String> {
        self.list.lock().expect("kubeprism lock").pick()
    }

    fn count(&self, address: &str, f: impl FnOnce(&mut Counts)) {
        f(self
            .counts
            .lock()
            .expect("kubeprism lock")
            .entry(address.to_string())
            .or_default());
    }

    fn upstreams(&self) -> Vec<KubePrismUpstream> {
        let list = self.list.lock().expect("kubeprism lock").backends.clone();
        let counts = self.counts.lock().expect("kubeprism lock");
        list.into_iter()
            .map(|b| {
                let c = counts.get(&b.address).copied().unwrap_or_default();
                KubePrismUpstream {
                    address: b.address,
                    score: b.score,
                    tier: b.tier,
                    proxied: c.proxied,
                    dial_failures: c.dial_failures,
                    open: c.open,
                }
            })
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Backend {
    address: String,
    score: i32,
    tier: u8,
}

/// The upstream list (upstream/upstream.go's List, without its health
/// loop, which [`health_checks`] runs).
#[derive(Debug, Default)]
struct List {
    backends: Vec<Backend>,
    /// Where the next pick starts looking: one past the last one picked.
    next: usize,
}

impl List {
    /// Keeps the backends still listed (their scores and tiers kept),
    /// drops the others and appends new ones at the initial score and
    /// tier. The pick position is kept.
    fn reconcile(&mut self, addresses: &[String]) {
        self.backends.retain(|b| addresses.contains(&b.address));
        for address in addresses {
            if !self.backends.iter().any(|b| &b.address == address) {
                self.backends.push(Backend {
                    address: address.clone(),
                    score: INITIAL_SCORE,
                    tier: INITIAL_TIER,
                });
            }
        }
    }

    /// The next usable backend round-robin, from the lowest tier that has
    /// one.
    fn pick(&mut self) -> Option<String> {
        let len = self.backends.len();
        for tier in MIN_TIER..=MAX_TIER {
            for j in 0..len {
                let i = (self.next + j) % len;
                let backend = &self.backends[i];
                if backend.tier == tier && backend.score >= 0 {
                    self.next = i + 1;
                    return Some(backend.address.clone());
                }
            }
        }
        None
    }

    /// A success: the score up by one; the tier set when given.
    fn up(&mut self, address: &str, tier: Option<u8>) {
        for b in self.backends.iter_mut().filter(|b| b.address == address) {
            b.score = (b.score + SUCCESS_DELTA).min(HIGH_SCORE);
            if let Some(tier) = tier {
                b.tier = tier.clamp(MIN_TIER, MAX_TIER);
            }
        }
    }

    /// A failure: the score down by one, the tier kept.
    fn down(&mut self, address: &str) {
        for b in self.backends.iter_mut().filter(|b| b.address == address) {
            b.score = (b.score + FAIL_DELTA).max(LOW_SCORE);
        }
    }
}

/// The tier of a health check that connected in `elapsed`.
fn tier_for(elapsed: Duration) -> u8 {
    TIER_FLOORS
        .iter()
        .rposition(|floor| elapsed >= *floor)
        .unwrap_or(0) as u8
}

/// Listens, checks the upstreams and proxies until `serving` fires.
async fn run(
    balancer: Arc<Balancer>,
    addr: SocketAddr,
    serving: CancellationToken,
    process: CancellationToken,
    timing: crate::TalosTiming,
    name: String,
) {
    let listener = tokio::select! {
        () = serving.cancelled() => return,
        bound = bind(addr) => match bound {
            Ok(listener) => listener,
            Err(e) => {
                tracing::warn!(node = %name, %addr, error = %e, "KubePrism did not start");
                return;
            }
        },
    };
    *balancer.addr.lock().expect("kubeprism lock") = Some(addr);
    tracing::info!(node = %name, endpoint = %addr, "KubePrism is enabled");
    tokio::spawn(health_checks(
        balancer.clone(),
        serving.clone(),
        timing.kubeprism_health_interval,
        timing.kubeprism_health_timeout,
    ));
    loop {
        let conn = tokio::select! {
            () = serving.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((conn, _)) => conn,
                Err(e) => {
                    // tcpproxy stops serving a listener whose Accept fails.
                    tracing::warn!(node = %name, error = %e, "KubePrism stopped accepting");
                    return;
                }
            },
        };
        tokio::spawn(proxy(
            balancer.clone(),
            conn,
            process.clone(),
            timing.kubeprism_dial_timeout,
        ));
    }
}

/// Binds `addr`, retrying briefly while the listener of the instance
/// before (a reboot, a port change) is still being closed.
async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match TcpListener::bind(addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            result => return result,
        }
    }
}

/// Rounds of health checks, each one interval after the previous ended.
async fn health_checks(
    balancer: Arc<Balancer>,
    serving: CancellationToken,
    interval: Duration,
    timeout: Duration,
) {
    loop {
        tokio::select! {
            () = serving.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        let addresses: Vec<String> = {
            let list = balancer.list.lock().expect("kubeprism lock");
            list.backends.iter().map(|b| b.address.clone()).collect()
        };
        for address in addresses {
            let started = Instant::now();
            let probe = tokio::select! {
                () = serving.cancelled() => return,
                probe = tokio::time::timeout(timeout, TcpStream::connect(&address)) => probe,
            };
            let mut list = balancer.list.lock().expect("kubeprism lock");
            match probe {
                Ok(Ok(stream)) => {
                    drop(stream);
                    list.up(&address, Some(tier_for(started.elapsed())));
                }
                Ok(Err(e)) => {
                    tracing::debug!(%address, error = %e, "KubePrism health check failed");
                    list.down(&address);
                }
                Err(_) => {
                    tracing::debug!(%address, "KubePrism health check timed out");
                    list.down(&address);
                }
            }
        }
    }
}

/// One client connection: pick, dial once, copy both ways until both
/// sides are done or the node goes down.
async fn proxy(
    balancer: Arc<Balancer>,
    mut client: TcpStream,
    process: CancellationToken,
    dial_timeout: Duration,
) {
    let Some(address) = balancer.pick() else {
        tracing::warn!("KubePrism: no upstreams available, closing connection");
        return;
    };
    let dialled = tokio::select! {
        () = process.cancelled() => return,
        dialled = tokio::time::timeout(dial_timeout, TcpStream::connect(&address)) => dialled,
    };
    let mut upstream = match dialled {
        Ok(Ok(stream)) => stream,
        failed => {
            let error = match failed {
                Ok(Err(e)) => e.to_string(),
                _ => "dial timeout".to_string(),
            };
            tracing::warn!(%address, %error, "KubePrism: error dialing upstream");
            balancer.count(&address, |c| c.dial_failures += 1);
            balancer.list.lock().expect("kubeprism lock").down(&address);
            // Marked down before the client sees the close (upstream
            // closes first), so that a client's next connection meets the
            // new score whatever the runtime's scheduling.
            drop(client);
            return;
        }
    };
    balancer.count(&address, |c| {
        c.proxied += 1;
        c.open += 1;
    });
    keep_alive(&client);
    keep_alive(&upstream);
    tokio::select! {
        () = process.cancelled() => {}
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
    }
    balancer.count(&address, |c| c.open -= 1);
}

/// TCP keep-alive and user timeout as DialProxy sets them on both sides.
fn keep_alive(stream: &TcpStream) {
    use std::os::fd::AsRawFd as _;
    let fd = stream.as_raw_fd();
    let period = KEEP_ALIVE_PERIOD.as_secs() as libc::c_int;
    let user_timeout = TCP_USER_TIMEOUT.as_millis() as libc::c_int;
    for (level, option, value) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, period),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, period),
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, user_timeout),
    ] {
        // SAFETY: `fd` is the open socket `stream` owns for the whole call,
        // and the option value is a c_int that outlives it.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                option,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(addresses: &[&str]) -> List {
        let mut list = List::default();
        list.reconcile(&addresses.iter().map(|a| a.to_string()).collect::<Vec<_>>());
        list
    }

    #[test]
    fn picks_round_robin_among_usable_upstreams_of_the_lowest_tier() {
        let mut l = list(&["a", "b", "c"]);
        let picks: Vec<_> = (0..4).map(|_| l.pick().unwrap()).collect();
        assert_eq!(picks, ["a", "b", "c", "a"]);
        // Two failures take b from 1 to -1: skipped.
        l.down("b");
        assert_eq!(l.pick().unwrap(), "b", "a score of 0 is still usable");
        l.down("b");
        let picks: Vec<_> = (0..4).map(|_| l.pick().unwrap()).collect();
        assert_eq!(picks, ["c", "a", "c", "a"]);
        // A faster tier wins outright.
        l.up("c", Some(0));
        let picks: Vec<_> = (0..3).map(|_| l.pick().unwrap()).collect();
        assert_eq!(picks, ["c", "c", "c"]);
        l.down("a");
        l.down("a");
        l.down("c");
        l.down("c");
        l.down("c");
        assert_eq!(l.pick(), None);
    }

    #[test]
    fn scores_are_bounded_and_failures_keep_the_tier() {
        let mut l = list(&["a"]);
        for _ in 0..10 {
            l.up("a", Some(3));
        }
        assert_eq!((l.backends[0].score, l.backends[0].tier), (3, 3));
        for _ in 0..3 {
            l.down("a");
        }
        assert_eq!((l.backends[0].score, l.backends[0].tier), (0, 3));
        assert!(l.pick().is_some());
        for _ in 0..10 {
            l.down("a");
        }
        assert_eq!(l.backends[0].score, -3);
        l.up("a", None);
        assert_eq!((l.backends[0].score, l.backends[0].tier), (-2, 3));
    }

    #[test]
    fn reconcile_keeps_known_upstreams_and_drops_duplicates() {
        let mut l = list(&["a", "b", "a", "b"]);
        assert_eq!(l.backends.len(), 2);
        l.down("a");
        l.reconcile(&["c".into(), "a".into()]);
        let got: Vec<_> = l
            .backends
            .iter()
            .map(|b| (b.address.as_str(), b.score, b.tier))
            .collect();
        assert_eq!(got, [("a", 0, 1), ("c", 1, 1)]);
    }

    #[test]
    fn tiers_follow_connect_time() {
        assert_eq!(tier_for(Duration::from_micros(50)), 0);
        assert_eq!(tier_for(Duration::from_micros(100)), 1);
        assert_eq!(tier_for(Duration::from_micros(500)), 1);
        assert_eq!(tier_for(Duration::from_millis(5)), 2);
        assert_eq!(tier_for(Duration::from_millis(50)), 3);
        assert_eq!(tier_for(Duration::from_millis(500)), 4);
        assert_eq!(tier_for(Duration::from_secs(3)), 5);
    }

    const BASE: &str = "version: v1alpha1\nmachine:\n  type: controlplane\ncluster:\n  controlPlane:\n    endpoint: https://10.0.0.1:6443\n";

    #[test]
    fn port_and_switch_from_the_configuration() {
        assert_eq!(configured_port(BASE, false), None, "off unless enabled");
        let with = |prism: &str| {
            BASE.replace(
                "machine:\n",
                &format!("machine:\n  features:\n    kubePrism:\n{prism}"),
            )
        };
        assert_eq!(
            configured_port(&with("      enabled: true\n"), false),
            Some(DEFAULT_PORT)
        );
        assert_eq!(
            configured_port(&with("      enabled: true\n      port: 7446\n"), false),
            Some(7446)
        );
        assert_eq!(
            configured_port(&with("      enabled: false\n      port: 7446\n"), false),
            None
        );
        let no_cluster =
            "version: v1alpha1\nmachine:\n  features:\n    kubePrism:\n      enabled: true\n";
        assert_eq!(configured_port(no_cluster, false), None);
        let document =
            format!("{BASE}---\napiVersion: v1alpha1\nkind: KubePrismConfig\nport: 7447\n");
        assert_eq!(configured_port(&document, true), Some(7447));
        assert_eq!(configured_port(&document, false), None, "a 1.14 document");
    }

    #[test]
    fn cluster_endpoints_as_host_and_port() {
        let at =
            |endpoint: &str| cluster_endpoint(&BASE.replace("https://10.0.0.1:6443", endpoint));
        assert_eq!(
            at("https://10.0.0.1:6443").as_deref(),
            Some("10.0.0.1:6443")
        );
        assert_eq!(
            at("https://k8s.example").as_deref(),
            Some("k8s.example:443")
        );
        assert_eq!(
            at("https://k8s.example:6443/").as_deref(),
            Some("k8s.example:6443")
        );
        assert_eq!(
            at("https://[fd00::1]:6443").as_deref(),
            Some("[fd00::1]:6443")
        );
        assert_eq!(at("https://[fd00::1]").as_deref(), Some("[fd00::1]:443"));
    }
}
