//! Starting a simulated cluster for a test, and waiting for conditions.

use std::future::Future;
use std::time::{Duration, Instant};

use talos_client::Client;
use talos_client::config::{Overrides, TalosConfig};
use talos_sim::{Cluster, SimConfig};

/// A running cluster with its directory; both go away when dropped (every
/// etcd is killed by the cluster's drop).
pub struct SimCluster {
    pub cluster: Cluster,
    pub dir: tempfile::TempDir,
}

impl SimCluster {
    /// Starts a cluster whose Talos schedules (EtcdLeaveCluster's retries,
    /// the wait for the local member) run ten times faster than upstream's,
    /// so a leave that meets etcd's "unhealthy cluster" just after startup
    /// retries after 1 s, not 10 s. `TALOS_SIM_TIMING_DIVISOR` sets another
    /// divisor: 1 runs the tests on upstream's own schedules.
    pub async fn start(nodes: usize) -> SimCluster {
        let divisor = timing_divisor();
        SimCluster::start_with(nodes, |cfg| {
            cfg.timing = talos_sim::TalosTiming::scaled_down(divisor)
        })
        .await
    }

    /// Starts a cluster whose isolated layout `adjust` may change first
    /// (e.g. a scaled-down [`talos_sim::TalosTiming`]).
    pub async fn start_with(nodes: usize, adjust: impl FnOnce(&mut SimConfig)) -> SimCluster {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = SimConfig::isolated(dir.path(), nodes);
        adjust(&mut cfg);
        let cluster = Cluster::up(cfg).await.expect("simulated cluster starts");
        SimCluster { cluster, dir }
    }

    /// A client from one of the talosconfigs the simulator wrote.
    pub fn client_from(&self, file: &str) -> Client {
        let path = self.dir.path().join(file);
        let config = TalosConfig::read(&path).unwrap();
        let context = config.resolve(&Overrides::default(), &path).unwrap();
        Client::builder_from_context(&context)
            .connect_timeout(Duration::from_secs(5))
            .call_timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    }

    pub fn admin(&self) -> Client {
        self.client_from("talosconfig")
    }

    /// The address of the node that currently leads, asked of every node
    /// (which node wins an election is etcd's choice).
    pub async fn leader(&self) -> String {
        let client = self.admin();
        let count = self.cluster.nodes().len();
        wait_for("a leader", Duration::from_secs(30), || async {
            for i in 1..=count {
                if client
                    .node(self.ip(i))
                    .etcd_status()
                    .await
                    .ok()?
                    .is_leader()
                {
                    return Some(self.ip(i));
                }
            }
            None
        })
        .await
    }

    /// Waits until the etcd service of each of the first `nodes` nodes is
    /// healthy (its first health check has passed): before that, Talos's
    /// leave and forfeit wait for it.
    pub async fn wait_etcd_healthy(&self, nodes: usize) {
        let client = self.admin();
        for i in 1..=nodes {
            let node = client.node(self.ip(i));
            wait_for("etcd to be healthy", Duration::from_secs(60), || async {
                let services = node.service_list().await.ok()?;
                services
                    .into_iter()
                    .find(|s| s.id == "etcd" && s.health.healthy)
            })
            .await;
        }
    }

    /// The address of node `i` (from 1).
    pub fn ip(&self, i: usize) -> String {
        self.cluster.nodes()[i - 1].ip.to_string()
    }
}

/// Polls `check` until it returns `Some`, failing the test after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The divisor of Talos's schedules for [`SimCluster::start`]: 10, or
/// `TALOS_SIM_TIMING_DIVISOR`.
pub fn timing_divisor() -> u32 {
    match std::env::var("TALOS_SIM_TIMING_DIVISOR") {
        Ok(v) => {
            v.parse().ok().filter(|d| *d >= 1).unwrap_or_else(|| {
                panic!("TALOS_SIM_TIMING_DIVISOR={v:?} is not a whole number >= 1")
            })
        }
        Err(_) => 10,
    }
}

/// The kube-apiserver binary the Kubernetes tests run:
/// `TALOS_SIM_KUBE_APISERVER`, or where `scripts/kube-apiserver.sh` caches
/// it. Fails the test, naming the script, when it is missing.
pub fn kube_apiserver_binary() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("TALOS_SIM_KUBE_APISERVER") {
        return std::path::PathBuf::from(path);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .expect("HOME or XDG_CACHE_HOME is set");
    let path = cache.join("talos-client/kube-apiserver-v1.34.4/kube-apiserver");
    assert!(
        path.exists(),
        "kube-apiserver is not built: run scripts/kube-apiserver.sh (about 4 minutes), \
         or set TALOS_SIM_KUBE_APISERVER to a kube-apiserver v1.34 binary ({} is missing)",
        path.display()
    );
    path
}

impl SimCluster {
    /// A cluster whose control-plane nodes run kube-apiserver.
    pub async fn start_with_kubernetes(nodes: usize) -> SimCluster {
        SimCluster::start_with_kubernetes_and(nodes, |_| {}).await
    }

    /// [`SimCluster::start_with_kubernetes`], with `tweak` applied to the
    /// configuration last.
    pub async fn start_with_kubernetes_and(
        nodes: usize,
        tweak: impl FnOnce(&mut talos_sim::SimConfig),
    ) -> SimCluster {
        let binary = kube_apiserver_binary();
        let divisor = timing_divisor();
        SimCluster::start_with(nodes, |cfg| {
            cfg.timing = talos_sim::TalosTiming::scaled_down(divisor);
            cfg.kube_apiserver = Some(binary);
            tweak(cfg);
        })
        .await
    }

    /// A Kubernetes client with the admin kubeconfig node `i` serves,
    /// pointed at `server` (default: node `i`'s API server).
    pub async fn kube(&self, i: usize, server: Option<&str>) -> talos_client::kube::KubeClient {
        let yaml = self.admin().node(self.ip(i)).kubeconfig().await.unwrap();
        let server = server
            .map(str::to_string)
            .unwrap_or_else(|| format!("https://{}:6443", self.ip(i)));
        let config = talos_client::kube::KubeConfig::from_yaml(&yaml)
            .unwrap()
            .with_server(server);
        talos_client::kube::KubeClient::new(&config).unwrap()
    }

    /// Waits until every control-plane node's API server is ready and
    /// `kube-system/default` exists (what a token check mints for).
    pub async fn wait_kubernetes_ready(&self, nodes: usize) {
        for i in 1..=nodes {
            let kube = self.kube(i, None).await;
            wait_for(
                &format!("node {i}'s kube-apiserver to be ready"),
                Duration::from_secs(180),
                || async { kube.readyz().await.ok().filter(|r| r.is_ready()) },
            )
            .await;
        }
        let kube = self.kube(1, None).await;
        wait_for(
            "kube-system/default to exist",
            Duration::from_secs(60),
            || async {
                kube.get("/api/v1/namespaces/kube-system/serviceaccounts/default")
                    .await
                    .ok()
            },
        )
        .await;
    }
}
