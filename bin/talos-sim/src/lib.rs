//! talos-sim: simulated Talos control-plane nodes on loopback, each backed
//! by a real etcd member, behind a Talos API front that behaves like apid and
//! machined for the calls this crate speaks.
//!
//! ```no_run
//! use talos_sim::{Cluster, SimConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! // Three nodes on a private 127.x.y.0/24 with free ports (what tests use).
//! let cluster = Cluster::up(SimConfig::isolated(dir.path(), 3)).await?;
//! println!("talosconfig: {}", cluster.talosconfig_path().display());
//! cluster.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Layout, top down (a module uses only the layers below it, which
//! `tests/sim_layers.rs` checks): [`cluster`] is the facade that starts and
//! stops nodes and writes the talosconfigs, over [`control`] (the control
//! socket); each node's supervisor starts its API and runs the power
//! actions (reboot, reset, shutdown, boot after a maintenance apply) that
//! the API's handlers queue on the node; under it the lifecycle (the
//! reboot and reset sequences, booting, joining etcd), then the handlers
//! (the machined part that answers the Talos calls, and the front that
//! routes `node`/`nodes` metadata like apid), then etcd's calls, and at the
//! bottom the state every node shares and [`node`], one simulated machine
//! (etcd process, machine config, volumes, power). Where behaviour had to
//! be chosen, it follows upstream and names the upstream file.

pub mod api;
mod auth;
pub mod campaign;
mod client_config;
pub mod cluster;
mod config_schema;
pub mod control;
pub mod controllers;
pub mod cosi;
mod cosi_state;
mod dial;
mod diff;
mod documents;
pub mod etcd_client;
mod etcd_health;
pub mod etcd_process;
pub mod etcd_tls;
mod events;
mod files;
mod front;
mod go_errors;
mod health;
mod immediate;
mod kube_apiserver;
mod kube_controllers;
mod kubeconfig;
mod kubelet;
mod kubeprism;
pub mod ledger;
mod lifecycle;
mod machined;
mod machined_apply;
mod machined_control;
mod machined_etcd;
mod machined_streams;
mod machined_upgrade;
mod maintenance;
pub mod node;
pub mod pki;
mod proxy;
pub mod rules;
mod runtime_validate;
pub mod serve;
mod shared;
mod strict;
mod supervisor;
mod textdiff;
pub mod tls;
pub mod upgrade_state;
mod validate;

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use auth::CallRecord;
pub use cluster::{Cluster, NodeInfo};
pub use kubeprism::KubePrismUpstream;
pub use upgrade_state::UpgradeFault;

/// Errors of the simulator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A file or directory operation failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The etcd release a node runs is not built.
    #[error(
        "etcd {release} is not built ({} is missing): run scripts/etcd.sh {release} \
         (about a minute), or set TALOS_SIM_ETCD_CACHE to the directory it builds into",
        .path.display()
    )]
    EtcdNotBuilt {
        /// The release (`v3.6.12`).
        release: &'static str,
        /// The binary looked for.
        path: PathBuf,
    },
    /// etcd could not be started.
    #[error("cannot run {}: {source} (scripts/etcd.sh builds it)", .binary.display())]
    EtcdSpawn {
        /// The binary tried.
        binary: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// etcd exited while starting.
    #[error("etcd member {name} exited ({status}); see {}", .log.display())]
    EtcdExited {
        /// The member.
        name: String,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
    },
    /// etcd did not become ready in time.
    #[error("etcd member {name} did not become ready; see {}", .log.display())]
    EtcdNotReady {
        /// The member.
        name: String,
        /// Its log file.
        log: PathBuf,
    },
    /// An etcd API call failed.
    #[error("etcd: {0}")]
    Etcd(#[from] tonic::Status),
    /// Certificates could not be made.
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    /// A listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// TLS material was rejected.
    #[error(transparent)]
    Tls(#[from] talos_client::tls::TlsError),
    /// A talosconfig could not be written.
    #[error(transparent)]
    Config(#[from] talos_client::config::ConfigError),
    /// The request cannot be carried out in the cluster's state.
    #[error("{0}")]
    Refused(String),
    /// The control socket of a running simulator could not be used.
    #[error("{}: {reason}", .socket.display())]
    Control {
        /// The socket.
        socket: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

impl SimError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> SimError {
        SimError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// How to lay out a simulated cluster.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Number of control-plane nodes to start.
    pub nodes: usize,
    /// Directory for the talosconfigs, PKI, logs and node data.
    pub dir: PathBuf,
    /// Node `i` (from 1) listens on `base_ip + i`.
    pub base_ip: Ipv4Addr,
    /// apid port, shared by all nodes like real Talos (50000); 0 picks a
    /// port free on every node's address when the cluster starts.
    pub api_port: u16,
    /// etcd client port on every node (2379); 0 picks a free one.
    pub etcd_client_port: u16,
    /// etcd peer port on every node (2380); 0 picks a free one.
    pub etcd_peer_port: u16,
    /// etcd's HTTP port on every node that runs etcd 3.7 (Talos 1.14:
    /// `/health` and `/metrics` on 2383); 0 picks a free one.
    pub etcd_http_port: u16,
    /// Where `scripts/etcd.sh` built the etcd releases the nodes run
    /// ([`etcd_process::default_etcd_cache`] unless set).
    pub etcd_cache: PathBuf,
    /// How long a simulated reboot keeps the node down.
    pub boot_delay: Duration,
    /// etcd backend quota, bytes.
    pub quota_backend_bytes: u64,
    /// Number of worker nodes (no etcd) started after the control plane.
    pub workers: usize,
    /// Waits and retries Talos runs on a fixed schedule; upstream's values
    /// unless a test or `talos-sim up --timing-divisor` scales them down.
    pub timing: TalosTiming,
    /// The Talos release the nodes start on.
    pub talos_version: TalosVersion,
    /// A second interface on every node, which etcd does not advertise
    /// (a multi-homed machine): node `i` also answers, when a request names
    /// it, to `second_base_ip + i`. None by default.
    pub second_base_ip: Option<Ipv4Addr>,
    /// A kube-apiserver binary to run on every control-plane node, as
    /// Talos runs its static pod (see `scripts/kube-apiserver.sh`). None by
    /// default: no Kubernetes.
    pub kube_apiserver: Option<PathBuf>,
}

/// The fixed waits and retry schedules of Talos that the simulator
/// reproduces. [`TalosTiming::UPSTREAM`] is the default everywhere; only an
/// explicit choice makes them shorter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TalosTiming {
    /// EtcdLeaveCluster: the pause between attempts to remove the member
    /// while etcd answers "unhealthy cluster" or "server stopped".
    pub leave_retry_interval: Duration,
    /// EtcdLeaveCluster: how long removal is retried in all.
    pub leave_retry_limit: Duration,
    /// EtcdLeaveCluster and EtcdForfeitLeadership: how long they wait for the
    /// local etcd member to be running and healthy.
    pub local_member_wait: Duration,
    /// A joining learner's promotion: the pause between attempts.
    pub promote_interval: Duration,
    /// A joining learner's promotion: the most added to each pause at random.
    pub promote_jitter: Duration,
    /// A joining learner's promotion: how long it is retried in all.
    pub promote_limit: Duration,
    /// A joining learner's promotion: the deadline of one attempt (its
    /// single MemberPromote call).
    pub promote_attempt_timeout: Duration,
    /// Joining etcd (member add): the pause between attempts.
    pub join_interval: Duration,
    /// Joining etcd: the most added to each pause at random.
    pub join_jitter: Duration,
    /// Joining etcd: how long it is retried in all (`EtcdJoinTimeout`).
    pub join_limit: Duration,
    /// Joining etcd: the deadline of one attempt (member list, removal of
    /// a stale member, member add, member list, each a single call).
    pub join_attempt_timeout: Duration,
    /// The etcd service's health check: the wait before the first check.
    pub health_initial_delay: Duration,
    /// The etcd service's health check: the period between checks.
    pub health_period: Duration,
    /// The etcd service's health check: the deadline of one check.
    pub health_timeout: Duration,
    /// The kubelet service's health check: the wait before the first check
    /// after the service (re)starts.
    pub kubelet_health_initial_delay: Duration,
    /// ImageService.Pull from 1.14: the unit of the exponential backoff
    /// between attempts to pull an image the registry does not have
    /// (internal/pkg/containers/image: PullRetryInterval, five retries
    /// after the first "not found"; 1.13.9 asks for none).
    pub image_pull_retry_unit: Duration,
    /// KubePrism: the pause between rounds of health checks of its
    /// upstreams.
    pub kubeprism_health_interval: Duration,
    /// KubePrism: the deadline of one upstream's health check (a TCP
    /// connect).
    pub kubeprism_health_timeout: Duration,
    /// KubePrism: the deadline of the dial to the upstream picked for a
    /// connection.
    pub kubeprism_dial_timeout: Duration,
    /// How long after a change of its flags or keys the kube-apiserver
    /// static pod is restarted: kubelet reads the static pods Talos serves
    /// (kubelet_spec.go sets only `staticPodURL`) every
    /// `httpCheckFrequency`, 20 s by default, so the old API server keeps
    /// answering until its next poll. The simulator takes the whole period,
    /// the longest it can be.
    pub static_pod_poll: Duration,
}

impl TalosTiming {
    /// Talos 1.13.9: removal retried every 10 s for 5 min
    /// (internal/pkg/etcd/etcd.go, LeaveCluster), the local member awaited
    /// for 3 min (internal/pkg/etcd/local.go, GetLocalMemberID); a learner's
    /// promotion retried every 15 s plus up to 1 s for 10 min, member add
    /// every 3 s plus up to 1 s for 30 min (each attempt, and each promotion
    /// attempt, within 30 s), and the etcd service checked
    /// 5 s after it starts, then every 20 s with a 15 s deadline
    /// (internal/app/machined/pkg/system/services/etcd.go: promoteMember,
    /// buildInitialCluster, HealthSettings; constants.EtcdJoinTimeout); the
    /// kubelet service first checked 2 s after it starts (services/kubelet.go);
    /// KubePrism's upstreams checked every 20 s, each within 15 s, and a
    /// connection's upstream dialled within 15 s (pkg/machinery/constants:
    /// KubePrismHealthCheckInterval, KubePrismHealthCheckTimeout,
    /// KubePrismDialTimeout).
    pub const UPSTREAM: TalosTiming = TalosTiming {
        leave_retry_interval: Duration::from_secs(10),
        leave_retry_limit: Duration::from_secs(300),
        local_member_wait: Duration::from_secs(180),
        promote_interval: Duration::from_secs(15),
        promote_jitter: Duration::from_secs(1),
        promote_limit: Duration::from_secs(600),
        promote_attempt_timeout: Duration::from_secs(30),
        join_interval: Duration::from_secs(3),
        join_jitter: Duration::from_secs(1),
        join_limit: Duration::from_secs(1800),
        join_attempt_timeout: Duration::from_secs(30),
        health_initial_delay: Duration::from_secs(5),
        health_period: Duration::from_secs(20),
        health_timeout: Duration::from_secs(15),
        kubelet_health_initial_delay: Duration::from_secs(2),
        image_pull_retry_unit: Duration::from_secs(5),
        kubeprism_health_interval: Duration::from_secs(20),
        kubeprism_health_timeout: Duration::from_secs(15),
        kubeprism_dial_timeout: Duration::from_secs(15),
        static_pod_poll: Duration::from_secs(20),
    };

    /// Upstream's schedule with every duration divided by `divisor` (at
    /// least 1).
    pub fn scaled_down(divisor: u32) -> TalosTiming {
        let d = divisor.max(1);
        let up = TalosTiming::UPSTREAM;
        TalosTiming {
            leave_retry_interval: up.leave_retry_interval / d,
            leave_retry_limit: up.leave_retry_limit / d,
            local_member_wait: up.local_member_wait / d,
            promote_interval: up.promote_interval / d,
            promote_jitter: up.promote_jitter / d,
            promote_limit: up.promote_limit / d,
            promote_attempt_timeout: up.promote_attempt_timeout / d,
            join_interval: up.join_interval / d,
            join_jitter: up.join_jitter / d,
            join_limit: up.join_limit / d,
            join_attempt_timeout: up.join_attempt_timeout / d,
            health_initial_delay: up.health_initial_delay / d,
            health_period: up.health_period / d,
            health_timeout: up.health_timeout / d,
            kubelet_health_initial_delay: up.kubelet_health_initial_delay / d,
            image_pull_retry_unit: up.image_pull_retry_unit / d,
            kubeprism_health_interval: up.kubeprism_health_interval / d,
            kubeprism_health_timeout: up.kubeprism_health_timeout / d,
            kubeprism_dial_timeout: up.kubeprism_dial_timeout / d,
            static_pod_poll: up.static_pod_poll / d,
        }
    }
}

/// `base` plus a random part of `jitter`, as go-retry's WithJitter.
pub(crate) fn jittered(base: Duration, jitter: Duration) -> Duration {
    let nanos = jitter.as_nanos() as u64;
    if nanos == 0 {
        return base;
    }
    base + Duration::from_nanos(random_u64() % nanos)
}

impl Default for TalosTiming {
    fn default() -> Self {
        TalosTiming::UPSTREAM
    }
}

/// The Talos release whose API behaviour the simulator follows by default.
pub const SIMULATED_TALOS_VERSION: &str = "v1.13.9";

/// A Talos release whose behaviour a simulated node follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TalosVersion {
    /// Talos v1.13.9 (the default).
    #[default]
    V1_13_9,
    /// Talos v1.14.0: REBOOT apply mode refused, AUTO never reboots, etcd
    /// on its own `ETCD` volume, etcd 3.7.
    V1_14_0,
}

impl TalosVersion {
    /// The etcd release this Talos runs (`DefaultEtcdVersion`,
    /// pkg/machinery/constants/constants.go: v3.6.12 at v1.13.9, v3.7.1
    /// at v1.14.0-rc.1).
    pub fn etcd_release(self) -> etcd_process::EtcdRelease {
        match self {
            TalosVersion::V1_13_9 => etcd_process::EtcdRelease::V3_6_12,
            TalosVersion::V1_14_0 => etcd_process::EtcdRelease::V3_7_1,
        }
    }
}

impl TalosVersion {
    /// The tag Version reports.
    pub fn tag(self) -> &'static str {
        match self {
            TalosVersion::V1_13_9 => "v1.13.9",
            TalosVersion::V1_14_0 => "v1.14.0",
        }
    }

    /// Whether this release is 1.14 or later.
    pub fn at_least_1_14(self) -> bool {
        self != TalosVersion::V1_13_9
    }
}

impl std::str::FromStr for TalosVersion {
    type Err = SimError;

    /// `1.13.9` or `1.14.0`, with or without a leading `v`.
    fn from_str(s: &str) -> Result<TalosVersion, SimError> {
        match s.trim_start_matches('v') {
            "1.13.9" => Ok(TalosVersion::V1_13_9),
            "1.14.0" => Ok(TalosVersion::V1_14_0),
            other => Err(SimError::Refused(format!(
                "talos version {other:?} is not simulated (choose 1.13.9 or 1.14.0)"
            ))),
        }
    }
}

/// The first address of the default layout: nodes are 127.0.0.11, .12, ...
pub const DEFAULT_BASE_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 10);

impl SimConfig {
    /// The default layout: nodes at 127.0.0.11, .12, ...; Talos's and
    /// etcd's standard ports.
    pub fn new(dir: impl Into<PathBuf>, nodes: usize) -> SimConfig {
        SimConfig {
            nodes,
            dir: dir.into(),
            base_ip: DEFAULT_BASE_IP,
            api_port: 50000,
            etcd_client_port: 2379,
            etcd_peer_port: 2380,
            etcd_http_port: 2383,
            etcd_cache: etcd_process::default_etcd_cache(),
            boot_delay: Duration::from_secs(2),
            quota_backend_bytes: 8 << 30,
            workers: 0,
            timing: TalosTiming::UPSTREAM,
            talos_version: TalosVersion::default(),
            second_base_ip: None,
            kube_apiserver: None,
        }
    }

    /// A layout that cannot collide with another simulator or service: a
    /// random 127.a.b.0/24, and ports that [`Cluster::up`] finds free on
    /// every address it will use.
    pub fn isolated(dir: impl Into<PathBuf>, nodes: usize) -> SimConfig {
        let seed = random_u64();
        SimConfig {
            base_ip: Ipv4Addr::new(127, 1 + (seed % 250) as u8, (seed >> 8) as u8, 10),
            api_port: 0,
            etcd_client_port: 0,
            etcd_peer_port: 0,
            etcd_http_port: 0,
            boot_delay: Duration::from_millis(500),
            ..SimConfig::new(dir, nodes)
        }
    }

    /// Replaces ports given as 0 with distinct ports free on the address of
    /// every node, and of four more for nodes added later; gives up after a
    /// bounded number of tries.
    pub(crate) fn pick_free_ports(&mut self) -> Result<(), SimError> {
        let fields = [
            self.api_port,
            self.etcd_client_port,
            self.etcd_peer_port,
            self.etcd_http_port,
        ];
        if !fields.contains(&0) {
            return Ok(());
        }
        let addresses: Vec<Ipv4Addr> = (1..=self.nodes + self.workers + 4)
            .map(|i| self.node_ip(i))
            .collect();
        for _ in 0..32 {
            let Some(mut ports) = (0..fields.len())
                .map(|_| free_port_on(&addresses))
                .collect::<Option<Vec<u16>>>()
            else {
                continue;
            };
            ports.sort_unstable();
            ports.dedup();
            if ports.len() == fields.len() {
                for (field, port) in [
                    &mut self.api_port,
                    &mut self.etcd_client_port,
                    &mut self.etcd_peer_port,
                    &mut self.etcd_http_port,
                ]
                .into_iter()
                .zip(ports)
                {
                    if *field == 0 {
                        *field = port;
                    }
                }
                return Ok(());
            }
        }
        Err(SimError::Refused(format!(
            "found no ports free on every address from {} to {}",
            addresses[0],
            addresses[addresses.len() - 1]
        )))
    }

    /// The address of node `index` (from 1).
    pub fn node_ip(&self, index: usize) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base_ip) + index as u32)
    }

    /// The second, unadvertised address of node `index`, when the nodes
    /// have one ([`SimConfig::second_base_ip`]).
    pub fn second_ip(&self, index: usize) -> Option<Ipv4Addr> {
        self.second_base_ip
            .map(|base| Ipv4Addr::from(u32::from(base) + index as u32))
    }
}

/// A port that is free on every address given (checked by binding).
fn free_port_on(addresses: &[Ipv4Addr]) -> Option<u16> {
    for _ in 0..20 {
        let probe = TcpListener::bind(SocketAddrV4::new(addresses[0], 0)).ok()?;
        let port = probe.local_addr().ok()?.port();
        let held: Vec<_> = addresses[1..]
            .iter()
            .map_while(|ip| TcpListener::bind(SocketAddrV4::new(*ip, port)).ok())
            .collect();
        if held.len() == addresses.len() - 1 {
            return Some(port);
        }
    }
    None
}

pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}
