//! KubePrism on a simulated node: a TCP load balancer on the node's
//! address (port `machine.features.kubePrism.port`, 7445 by default) over
//! every control-plane node's API server, with go-loadbalancer's health
//! scores, round-robin pick and dial-failure handling.
//!
//! The first two tests put stand-in API servers (a greeting, then an echo)
//! on each control-plane address, port 6443, so that which upstream a
//! connection reached can be read off the wire; the `kubernetes_` test
//! goes through KubePrism to real kube-apiservers (it needs the binary:
//! `scripts/kube-apiserver.sh` builds it).

use talos_test_support as common;

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine as _;
use common::sim::{SimCluster, wait_for};
use talos_client::client::{ApplyMode, ApplyRequest};
use talos_sim::TalosTiming;
use talos_sim::node::Node;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

const API_PORT: u16 = 6443;

fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

/// A stand-in API server: greets each connection with its name, then
/// answers every line with its name and the line.
struct Fake {
    task: tokio::task::JoinHandle<()>,
}

impl Fake {
    async fn start(at: SocketAddr, name: &str) -> Fake {
        let listener = TcpListener::bind(at).await.unwrap();
        let name = name.to_string();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let name = name.clone();
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut lines = BufReader::new(read).lines();
                    if write
                        .write_all(format!("{name}\n").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                    while let Ok(Some(line)) = lines.next_line().await {
                        let reply = format!("{name} {line}\n");
                        if write.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Fake { task }
    }

    /// Stops listening (connections already made go on).
    async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// A client connection through KubePrism.
struct Conn {
    lines: Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

const READ_LIMIT: Duration = Duration::from_secs(10);

impl Conn {
    /// Connects and reads the greeting: the connection and the upstream's
    /// name, or None when KubePrism closed it without one.
    async fn open(prism: SocketAddr) -> Option<(Conn, String)> {
        let stream = TcpStream::connect(prism).await.ok()?;
        let (read, write) = stream.into_split();
        let mut conn = Conn {
            lines: BufReader::new(read).lines(),
            write,
        };
        let greeting = conn.line().await?;
        Some((conn, greeting))
    }

    async fn line(&mut self) -> Option<String> {
        tokio::time::timeout(READ_LIMIT, self.lines.next_line())
            .await
            .expect("an answer or a close in time")
            .ok()
            .flatten()
    }

    async fn ask(&mut self, line: &str) -> Option<String> {
        self.write
            .write_all(format!("{line}\n").as_bytes())
            .await
            .ok()?;
        self.line().await
    }
}

/// The upstream a fresh connection reaches, None when it is closed.
async fn hello(prism: SocketAddr) -> Option<String> {
    Conn::open(prism).await.map(|(_, name)| name)
}

/// Applies node `i`'s configuration with `machine.features.kubePrism`
/// set to `prism` (a YAML mapping), in `mode`.
async fn set_kubeprism(sim: &SimCluster, i: usize, prism: &str, mode: ApplyMode) {
    use serde_norway::{Mapping, Value};
    let node = sim.cluster.node(&sim.ip(i)).unwrap();
    let mut doc: Value = serde_norway::from_str(&node.active_config()).unwrap();
    let machine = doc["machine"].as_mapping_mut().unwrap();
    if !machine.contains_key("features") {
        machine.insert("features".into(), Value::Mapping(Mapping::new()));
    }
    machine["features"]
        .as_mapping_mut()
        .unwrap()
        .insert("kubePrism".into(), serde_norway::from_str(prism).unwrap());
    let config = serde_norway::to_string(&doc).unwrap();
    sim.admin()
        .node(sim.ip(i))
        .apply_configuration(ApplyRequest::new(config, mode))
        .await
        .unwrap();
}

/// Enables KubePrism on node `i` (a new `features` section: Talos 1.13.9
/// applies it with a reboot) and waits for it to listen.
async fn enable(sim: &SimCluster, i: usize, prism: &str) -> SocketAddr {
    set_kubeprism(sim, i, prism, ApplyMode::Auto).await;
    let node = sim.cluster.node(&sim.ip(i)).unwrap();
    wait_for("KubePrism to listen", Duration::from_secs(60), || async {
        node.kubeprism_addr()
    })
    .await
}

fn upstream(node: &Node, at: SocketAddr) -> talos_sim::KubePrismUpstream {
    node.kubeprism_upstreams()
        .into_iter()
        .find(|u| u.address == at.to_string())
        .unwrap_or_else(|| panic!("{at} is not an upstream"))
}

/// Without health checks (their interval is an hour), every upstream
/// stands at score 1 in tier 1: connections go round-robin, each stays on
/// its upstream; a dial that fails closes the client's connection and
/// costs the upstream one point, so it is picked once more (score 0) and
/// then no longer (-1); a power off cuts the proxied connections.
#[tokio::test]
async fn kubeprism_round_robin_sticky_connections_and_dial_failures() {
    let sim = SimCluster::start_with(3, |cfg| {
        cfg.timing = TalosTiming {
            kubeprism_health_interval: Duration::from_secs(3600),
            ..TalosTiming::scaled_down(common::sim::timing_divisor())
        };
    })
    .await;
    let node = sim.cluster.node("cp-1").unwrap();
    let mut fakes = Vec::new();
    for i in 1..=3 {
        fakes.push(Fake::start(addr(&sim.ip(i), API_PORT), &format!("cp-{i}")).await);
    }
    // On by default, as `talosctl gen config` writes it.
    let prism = node.kubeprism_addr().expect("KubePrism runs by default");
    assert_eq!(
        prism,
        addr(&sim.ip(1), 7445),
        "the node's address, port 7445"
    );
    let apis: Vec<SocketAddr> = (1..=3).map(|i| addr(&sim.ip(i), API_PORT)).collect();
    // The endpoint (cp-1), the node's own API server and the members, once
    // each.
    let listed: Vec<String> = node
        .kubeprism_upstreams()
        .into_iter()
        .map(|u| u.address)
        .collect();
    let expected: Vec<String> = apis.iter().map(|a| a.to_string()).collect();
    assert_eq!(listed, expected);

    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(hello(prism).await.expect("proxied"));
    }
    seen.sort();
    assert_eq!(seen, ["cp-1", "cp-2", "cp-3"], "round-robin");

    // A connection stays on its upstream while the next ones move on.
    let (mut held, on) = Conn::open(prism).await.unwrap();
    let mut others = Vec::new();
    for _ in 0..2 {
        others.push(hello(prism).await.unwrap());
    }
    assert!(!others.contains(&on), "{others:?} after {on}");
    for n in 0..3 {
        assert_eq!(
            held.ask(&format!("ping {n}")).await.as_deref(),
            Some(format!("{on} ping {n}").as_str())
        );
    }
    let held_at = apis[on.trim_start_matches("cp-").parse::<usize>().unwrap() - 1];
    assert_eq!(upstream(&node, held_at).open, 1);
    let counts = node.kubeprism_upstream_connections();
    assert_eq!(counts.values().sum::<u64>(), 6);

    // cp-3's API server goes away. KubePrism does not try another
    // upstream: the two connections picked for cp-3 are closed.
    fakes.pop().unwrap().stop().await;
    let mut answers = Vec::new();
    for _ in 0..6 {
        answers.push(hello(prism).await);
    }
    assert_eq!(
        answers.iter().filter(|a| a.is_none()).count(),
        2,
        "{answers:?}"
    );
    let dead = upstream(&node, apis[2]);
    assert_eq!((dead.dial_failures, dead.score), (2, -1), "{dead:?}");
    let proxied_before = dead.proxied;
    for _ in 0..6 {
        let name = hello(prism).await.expect("a live upstream");
        assert_ne!(name, "cp-3");
    }
    let dead = upstream(&node, apis[2]);
    assert_eq!(
        (dead.dial_failures, dead.proxied),
        (2, proxied_before),
        "nothing more for cp-3"
    );

    // The node powers off: KubePrism's process goes, and the proxied
    // connection with it.
    sim.cluster.power_off("cp-1").await.unwrap();
    assert_eq!(node.kubeprism_addr(), None);
    assert_eq!(held.ask("after").await, None, "the connection was cut");
    assert!(TcpStream::connect(prism).await.is_err());
}

/// Health checks alone take a dead upstream out of the pick (no client
/// connection ever reached it) and bring it back once it answers; the port
/// follows the configuration, and disabling stops KubePrism, both without
/// a reboot once the configuration has a `features` section.
#[tokio::test]
async fn kubeprism_health_checks_and_configuration_changes() {
    let sim = SimCluster::start_with(3, |cfg| {
        cfg.timing = TalosTiming {
            kubeprism_health_interval: Duration::from_millis(100),
            kubeprism_health_timeout: Duration::from_millis(500),
            ..TalosTiming::scaled_down(common::sim::timing_divisor())
        };
    })
    .await;
    let mut fakes = Vec::new();
    for i in 1..=3 {
        fakes.push(Fake::start(addr(&sim.ip(i), API_PORT), &format!("cp-{i}")).await);
    }
    let prism = enable(&sim, 2, "{enabled: true, port: 7446}").await;
    assert_eq!(prism, addr(&sim.ip(2), 7446));
    let node = sim.cluster.node("cp-2").unwrap();
    let dead_at = addr(&sim.ip(3), API_PORT);
    wait_for(
        "every upstream at the highest score",
        Duration::from_secs(30),
        || async {
            let ups = node.kubeprism_upstreams();
            (ups.len() == 3 && ups.iter().all(|u| u.score == 3)).then_some(())
        },
    )
    .await;

    fakes.pop().unwrap().stop().await;
    wait_for(
        "health checks to take cp-3 out",
        Duration::from_secs(30),
        || async { (!upstream(&node, dead_at).usable()).then_some(()) },
    )
    .await;
    let dead = upstream(&node, dead_at);
    assert_eq!((dead.proxied, dead.dial_failures), (0, 0), "{dead:?}");
    for _ in 0..6 {
        let name = hello(prism).await.expect("a live upstream");
        assert_ne!(name, "cp-3");
    }
    assert_eq!(upstream(&node, dead_at).dial_failures, 0);

    fakes.push(Fake::start(dead_at, "cp-3").await);
    wait_for(
        "health checks to bring cp-3 back",
        Duration::from_secs(30),
        || async { upstream(&node, dead_at).usable().then_some(()) },
    )
    .await;

    // A new port: KubePrism restarts on it at once.
    let (mut held, _) = Conn::open(prism).await.unwrap();
    set_kubeprism(&sim, 2, "{enabled: true, port: 7447}", ApplyMode::NoReboot).await;
    let moved = addr(&sim.ip(2), 7447);
    wait_for("KubePrism on 7447", Duration::from_secs(10), || async {
        (node.kubeprism_addr() == Some(moved)).then_some(())
    })
    .await;
    assert!(hello(moved).await.is_some());
    wait_for("7446 to close", Duration::from_secs(10), || async {
        TcpStream::connect(prism).await.is_err().then_some(())
    })
    .await;
    // Upstream's shutdown closes the listener, not what it proxies.
    assert!(held.ask("still there").await.is_some());

    set_kubeprism(&sim, 2, "{enabled: false}", ApplyMode::NoReboot).await;
    assert_eq!(node.kubeprism_addr(), None);
    wait_for("7447 to close", Duration::from_secs(10), || async {
        TcpStream::connect(moved).await.is_err().then_some(())
    })
    .await;
}

/// The admin credentials of the kubeconfig a node serves, as files.
struct Admin {
    dir: tempfile::TempDir,
}

impl Admin {
    async fn of(sim: &SimCluster) -> Admin {
        let yaml = sim.admin().node(sim.ip(1)).kubeconfig().await.unwrap();
        let config: serde_json::Value = serde_norway::from_slice(&yaml).unwrap();
        let decode = |v: &serde_json::Value| {
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap())
                .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        for (name, value) in [
            (
                "ca.crt",
                &config["clusters"][0]["cluster"]["certificate-authority-data"],
            ),
            (
                "admin.crt",
                &config["users"][0]["user"]["client-certificate-data"],
            ),
            ("admin.key", &config["users"][0]["user"]["client-key-data"]),
        ] {
            std::fs::write(dir.path().join(name), decode(value)).unwrap();
        }
        Admin { dir }
    }

    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// `GET https://localhost:PORT/readyz` with `localhost` resolved to
    /// `ip`, as the admin: (HTTP status, body); status 0 when no answer
    /// came. Run without blocking the runtime the simulator shares.
    async fn readyz(&self, ip: &str, port: u16) -> (u16, String) {
        let out = tokio::process::Command::new("curl")
            .args(["-s", "-m", "10", "-w", "\n%{http_code}"])
            .args(["--cacert", &self.file("ca.crt")])
            .args(["--cert", &self.file("admin.crt")])
            .args(["--key", &self.file("admin.key")])
            .args(["--resolve", &format!("localhost:{port}:{ip}")])
            .arg(format!("https://localhost:{port}/readyz"))
            .output()
            .await
            .expect("curl runs (scripts/install-deps.sh installs it)");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    async fn wait_ready(&self, ip: &str) {
        wait_for(
            "kube-apiserver /readyz",
            Duration::from_secs(120),
            || async { (self.readyz(ip, API_PORT).await == (200, "ok".into())).then_some(()) },
        )
        .await;
    }
}

/// Through cp-1's KubePrism, `/readyz` answers 200 "ok" from the
/// cluster's kube-apiservers; once cp-3 is powered off and KubePrism's
/// health checks have seen it fail, every request still succeeds and none
/// goes to cp-3.
#[tokio::test]
async fn kubernetes_readyz_through_kubeprism_skips_a_powered_off_control_plane_node() {
    let sim = SimCluster::start_with_kubernetes(3).await;
    let admin = Admin::of(&sim).await;
    let prism = enable(&sim, 1, "{enabled: true}").await;
    assert_eq!(prism, addr(&sim.ip(1), 7445));
    for i in 1..=3 {
        admin.wait_ready(&sim.ip(i)).await;
    }
    let node = sim.cluster.node("cp-1").unwrap();
    let ip1 = sim.ip(1);
    for _ in 0..6 {
        assert_eq!(admin.readyz(&ip1, 7445).await, (200, "ok".into()));
    }
    let counts = node.kubeprism_upstream_connections();
    assert_eq!(counts.values().sum::<u64>(), 6, "{counts:?}");

    sim.cluster.power_off("cp-3").await.unwrap();
    let dead_at = addr(&sim.ip(3), API_PORT);
    wait_for(
        "KubePrism's health checks to see cp-3 fail",
        Duration::from_secs(120),
        || async { (!upstream(&node, dead_at).usable()).then_some(()) },
    )
    .await;
    let before = upstream(&node, dead_at);
    let total: u64 = node.kubeprism_upstream_connections().values().sum();
    for _ in 0..6 {
        assert_eq!(admin.readyz(&ip1, 7445).await, (200, "ok".into()));
    }
    let after = upstream(&node, dead_at);
    assert_eq!(
        (after.proxied, after.dial_failures),
        (before.proxied, before.dial_failures),
        "no connection went to cp-3 after its failure was seen"
    );
    let now: u64 = node.kubeprism_upstream_connections().values().sum();
    assert_eq!(now, total + 6, "every request was proxied to a live node");
}
