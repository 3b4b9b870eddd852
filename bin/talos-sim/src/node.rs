//! One simulated Talos control-plane machine: its etcd member, machine
//! configuration, system volumes and power state.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::ServerConfig;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::SimError;
use super::etcd_client::EtcdClient;
use super::etcd_process::{ClusterState, EtcdBinaries, EtcdProcess, EtcdSpec};
use super::etcd_tls::EtcdPki;
use super::ledger::{Cause, EtcdState, Ledger, current_cause};

/// The system volumes of a simulated node, by label: the partitions of an
/// installed Talos 1.13 control plane's system disk, the image cache
/// included. Upstream resolves reset labels against VolumeStatus resources
/// (v1alpha1_server.go, Reset).
pub const SYSTEM_VOLUMES: [&str; 4] = ["STATE", "EPHEMERAL", "META", "IMAGECACHE"];

/// The system volumes of a Talos 1.14 control plane: etcd's data has a
/// volume of its own, `ETCD` (constants.EtcdDataVolumeID), so wiping STATE
/// and EPHEMERAL leaves it behind.
pub const SYSTEM_VOLUMES_1_14: [&str; 5] = ["STATE", "EPHEMERAL", "META", "IMAGECACHE", "ETCD"];

/// The system volumes of a node running `version`.
pub fn system_volumes(version: super::TalosVersion) -> &'static [&'static str] {
    if version.at_least_1_14() {
        &SYSTEM_VOLUMES_1_14
    } else {
        &SYSTEM_VOLUMES
    }
}

/// A volume upstream knows but could not locate on any disk: the image
/// cache's ISO volume, which only a boot from ISO provides.
pub const UNLOCATED_VOLUMES: [&str; 1] = ["IMAGECACHE-ISO"];

/// Where a volume named by a reset label stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeLookup {
    /// A volume on a disk: it can be wiped.
    Located,
    /// A volume Talos knows of but found on no disk.
    NotLocated,
    /// No such volume.
    Missing,
}

/// One entry of a service's event history.
#[derive(Debug, Clone)]
pub struct ServiceEvent {
    /// What happened.
    pub message: String,
    /// State entered.
    pub state: String,
    /// When.
    pub at: SystemTime,
}

/// The machine configuration as the node holds it.
#[derive(Debug, Default)]
pub(crate) struct ConfigState {
    /// The configuration in effect; the one persisted on STATE takes effect
    /// at the next boot (so a STAGED apply only persists).
    pub active: String,
    /// The rollback of a TRY apply that has not been confirmed.
    pub rollback: Option<tokio::task::AbortHandle>,
    /// An apply in REBOOT mode is rebooting the node.
    pub rebooting: bool,
}

/// Power state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Power {
    /// The API answers.
    On,
    /// Rebooting: down for a moment.
    Rebooting,
    /// Powered off: nothing answers until the simulator restarts.
    Off,
}

/// A simulated control-plane node.
pub struct Node {
    /// Position in the cluster (1-based); the address is base + index.
    pub index: usize,
    /// Hostname, also the etcd member name.
    pub name: String,
    /// Loopback address of all its listeners.
    pub ip: Ipv4Addr,
    /// A second address it answers to when a request names it, which etcd
    /// does not advertise.
    pub second_ip: Option<Ipv4Addr>,
    pub(crate) api_port: u16,
    etcd_client_port: u16,
    etcd_peer_port: u16,
    etcd_http_port: u16,
    /// Where the etcd releases are built (see `scripts/etcd.sh`).
    etcd_cache: PathBuf,
    /// The cluster's etcd CA and machined's etcd client identity.
    pub(crate) etcd_pki: Arc<EtcdPki>,
    quota_backend_bytes: u64,
    dir: PathBuf,
    pub(crate) server_tls: Arc<ServerConfig>,
    /// The API's TLS while the node has no configuration (maintenance).
    pub(crate) maintenance_tls: Arc<ServerConfig>,
    /// The SPKI fingerprint of the maintenance certificate, as a real node
    /// prints it on its console for `--cert-fingerprint`.
    pub maintenance_fingerprint: String,
    /// A worker: configured, but no etcd.
    worker: AtomicBool,
    /// Whether STATE holds a machine configuration: set when the file is
    /// written (node directories start empty), cleared when STATE is wiped,
    /// so that routing a request does not stat the file.
    configured: AtomicBool,
    etcd: tokio::sync::Mutex<Option<EtcdProcess>>,
    pub(crate) config: Mutex<ConfigState>,
    pub(crate) apply_lock: tokio::sync::Mutex<()>,
    power: Mutex<Power>,
    /// The API being served: the token that stops it, and whether it
    /// presents the cluster's certificate.
    front: Mutex<Option<(CancellationToken, bool)>>,
    events: Arc<Mutex<Vec<ServiceEvent>>>,
    /// The etcd service's health checker.
    pub(crate) etcd_health: super::etcd_health::EtcdHealth,
    /// The kubelet service: when it last (re)started.
    pub(crate) kubelet: super::kubelet::Kubelet,
    /// The node's kube-apiserver, when the simulator runs Kubernetes.
    pub(crate) kube_apiserver: super::kube_apiserver::KubeApiServer,
    /// The node's KubePrism, while its configuration enables it.
    pub(crate) kubeprism: super::kubeprism::KubePrism,
    /// The Talos schedules this node runs on.
    pub(crate) timing: super::TalosTiming,
    /// The Talos release the node runs.
    version: Mutex<super::TalosVersion>,
    /// etcd's data directory once an upgrade moved the node to a release
    /// that would look elsewhere: the data stays where it was.
    etcd_dir_pin: Mutex<Option<PathBuf>>,
    /// Images pulled, the version installed for the next boot, and the
    /// fault armed for the next upgrade.
    pub(crate) upgrade: super::upgrade_state::UpgradeState,
    /// machined's runtime events (Events).
    pub(crate) runtime_events: super::events::EventLog,
    /// The kernel's messages since boot (Dmesg).
    pub(crate) kmsg: Mutex<Vec<String>>,
    /// machined's sequencer lock: one reboot or reset at a time.
    pub(crate) sequence_lock: tokio::sync::Mutex<()>,
    /// A read fault armed for the next snapshot: bytes sent before it.
    boot_id: Mutex<String>,
    /// When the node last booted.
    booted: Mutex<std::time::SystemTime>,
    snapshot_fault: Mutex<Option<u64>>,
    /// While the node is partitioned: the listener that holds its API
    /// address and never accepts, so callers connect and hear nothing.
    blackhole: Mutex<Option<tokio::net::TcpListener>>,
    /// Calls other nodes tried to forward to it while it was partitioned.
    unanswered: std::sync::atomic::AtomicU64,
    /// A delay armed for the next EtcdLeaveCluster.
    leave_delay: Mutex<Option<std::time::Duration>>,
    /// Whether Kubeconfig fails, as when machined cannot generate it.
    kubeconfig_withheld: std::sync::atomic::AtomicBool,
    /// Power actions the API's handlers queued for the node's supervisor,
    /// each with the cause it was queued under.
    actions: tokio::sync::mpsc::UnboundedSender<(Action, Cause)>,
    /// The other end, until the supervisor takes it.
    queued: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<(Action, Cause)>>>,
    /// The cluster's ledger, where the node records its changes.
    pub(crate) ledger: Arc<Ledger>,
}

/// How long after the call's answer a queued action starts: machined
/// answers first and runs the sequence after (upstream's handlers start
/// the sequence in a goroutine), so the caller hears the answer.
pub(crate) const ACTION_DELAY: std::time::Duration = std::time::Duration::from_millis(200);

/// A power action an API handler asks of its node; the node's supervisor
/// (`crate::supervisor`) carries it out after [`ACTION_DELAY`].
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// The reboot sequence, then a boot.
    Reboot { actor: String },
    /// The reset sequence: a leave when graceful, the wipe of `labels`
    /// (`by_spec`: named by the caller), then a boot or power off.
    Reset {
        graceful: bool,
        reboot: bool,
        labels: Vec<String>,
        by_spec: bool,
        actor: String,
    },
    /// The legacy upgrade (MachineService.Upgrade): the upgrade sequence
    /// (`stage`: the staged one, which installs on the way up) with
    /// `target` installed for the boot that follows, unless a fault armed
    /// for the upgrade says otherwise.
    Upgrade {
        target: super::TalosVersion,
        stage: bool,
        actor: String,
    },
    /// Shutdown: the node powers off.
    PowerOff,
    /// A node in maintenance mode that received its configuration: the
    /// maintenance API goes and the node boots configured.
    BootConfigured,
}

/// Where each node keeps its files.
pub(crate) struct NodeLayout {
    pub index: usize,
    pub name: String,
    pub ip: Ipv4Addr,
    pub second_ip: Option<Ipv4Addr>,
    pub api_port: u16,
    pub etcd_client_port: u16,
    pub etcd_peer_port: u16,
    pub etcd_http_port: u16,
    pub etcd_cache: PathBuf,
    pub etcd_pki: Arc<EtcdPki>,
    pub quota_backend_bytes: u64,
    pub dir: PathBuf,
    pub server_tls: Arc<ServerConfig>,
    pub maintenance_tls: Arc<ServerConfig>,
    pub maintenance_fingerprint: String,
    pub worker: bool,
    pub timing: super::TalosTiming,
    pub kube_apiserver: Option<std::path::PathBuf>,
    pub version: super::TalosVersion,
    pub ledger: Arc<Ledger>,
}

impl Node {
    /// A node with `machine_config` persisted, or in maintenance mode
    /// (no configuration) when it is `None`.
    pub(crate) fn new(
        layout: NodeLayout,
        machine_config: Option<String>,
    ) -> Result<Node, SimError> {
        let (actions, queued) = tokio::sync::mpsc::unbounded_channel();
        let node = Node {
            index: layout.index,
            name: layout.name,
            ip: layout.ip,
            second_ip: layout.second_ip,
            api_port: layout.api_port,
            etcd_client_port: layout.etcd_client_port,
            etcd_peer_port: layout.etcd_peer_port,
            etcd_http_port: layout.etcd_http_port,
            etcd_cache: layout.etcd_cache,
            etcd_pki: layout.etcd_pki,
            quota_backend_bytes: layout.quota_backend_bytes,
            dir: layout.dir,
            server_tls: layout.server_tls,
            maintenance_tls: layout.maintenance_tls,
            maintenance_fingerprint: layout.maintenance_fingerprint,
            worker: AtomicBool::new(layout.worker),
            configured: AtomicBool::new(false),
            etcd: tokio::sync::Mutex::new(None),
            config: Mutex::new(ConfigState {
                active: machine_config.clone().unwrap_or_default(),
                ..ConfigState::default()
            }),
            apply_lock: tokio::sync::Mutex::new(()),
            power: Mutex::new(Power::Off),
            front: Mutex::new(None),
            events: Arc::new(Mutex::new(Vec::new())),
            etcd_health: super::etcd_health::EtcdHealth::new(),
            kubelet: super::kubelet::Kubelet::new(),
            kube_apiserver: super::kube_apiserver::KubeApiServer::new(
                layout.kube_apiserver.clone(),
            ),
            kubeprism: super::kubeprism::KubePrism::new(),
            timing: layout.timing,
            version: Mutex::new(layout.version),
            etcd_dir_pin: Mutex::new(None),
            upgrade: super::upgrade_state::UpgradeState::default(),
            runtime_events: super::events::EventLog::new(),
            kmsg: Mutex::new(Vec::new()),
            sequence_lock: tokio::sync::Mutex::new(()),
            boot_id: Mutex::new(new_boot_id()),
            booted: Mutex::new(std::time::SystemTime::now()),
            snapshot_fault: Mutex::new(None),
            blackhole: Mutex::new(None),
            unanswered: std::sync::atomic::AtomicU64::new(0),
            leave_delay: Mutex::new(None),
            kubeconfig_withheld: std::sync::atomic::AtomicBool::new(false),
            actions,
            queued: Mutex::new(Some(queued)),
            ledger: layout.ledger,
        };
        for label in system_volumes(layout.version) {
            let path = node.volume(label);
            std::fs::create_dir_all(&path).map_err(|e| SimError::io(&path, e))?;
        }
        if let Some(config) = &machine_config {
            node.persist_config(config)
                .map_err(|e| SimError::io(&node.config_path(), e))?;
        }
        let meta = node.volume("META").join("meta");
        std::fs::write(&meta, b"simulated META").map_err(|e| SimError::io(&meta, e))?;
        Ok(node)
    }

    /// The directory holding a system volume's contents.
    pub fn volume(&self, label: &str) -> PathBuf {
        self.dir.join("volumes").join(label)
    }

    /// etcd's data directory: on EPHEMERAL up to Talos 1.13, on the
    /// `ETCD` volume from 1.14.
    pub fn etcd_data_dir(&self) -> PathBuf {
        if let Some(pinned) = self.etcd_dir_pin.lock().expect("etcd dir lock").clone() {
            return pinned;
        }
        if self.talos_version().at_least_1_14() {
            self.volume("ETCD").join("etcd")
        } else {
            self.volume("EPHEMERAL").join("etcd")
        }
    }

    /// The Talos release the node runs.
    pub fn talos_version(&self) -> super::TalosVersion {
        *self.version.lock().expect("version lock")
    }

    /// Boots `version` from now on (an upgrade's boot). etcd's data stays
    /// where it is: a 1.13 node upgraded to 1.14 keeps it in a directory on
    /// EPHEMERAL (volumeconfig/system_volumes.go upstream creates the ETCD
    /// volume only for new installs).
    pub(crate) fn set_talos_version(&self, version: super::TalosVersion) {
        let current = self.etcd_data_dir();
        if current.join("member").exists() {
            *self.etcd_dir_pin.lock().expect("etcd dir lock") = Some(current);
        }
        *self.version.lock().expect("version lock") = version;
    }

    /// Arms `fault` for this node's next upgrade: the boot into the new
    /// version falls back to the old one, or never happens.
    pub fn fail_next_upgrade(&self, fault: super::upgrade_state::UpgradeFault) {
        self.upgrade.arm(fault);
    }

    /// Where the persisted machine configuration lives (on STATE).
    pub fn config_path(&self) -> PathBuf {
        self.volume("STATE").join("config.yaml")
    }

    /// Where an uploaded recovery snapshot is kept until Bootstrap.
    pub fn recovery_snapshot_path(&self) -> PathBuf {
        self.dir.join("etcd-recovery.snapshot")
    }

    /// The etcd member's log (what `Logs` serves for `etcd`).
    pub(crate) fn etcd_log(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    /// The node's etcd client URL (gRPC; HTTP too before etcd 3.7).
    pub fn etcd_client_url(&self) -> String {
        format!("https://{}:{}", self.ip, self.etcd_client_port)
    }

    /// The node's etcd peer URL.
    pub fn etcd_peer_url(&self) -> String {
        format!("https://{}:{}", self.ip, self.etcd_peer_port)
    }

    /// The URL of etcd's HTTP endpoints (`/health`, `/metrics`): their own
    /// port under Talos 1.14 (etcd 3.7), the client URL before.
    pub fn etcd_http_url(&self) -> String {
        match self.talos_version().etcd_release() {
            super::etcd_process::EtcdRelease::V3_6_12 => self.etcd_client_url(),
            _ => format!("https://{}:{}", self.ip, self.etcd_http_port),
        }
    }

    /// The etcd binaries of the release this node's Talos runs.
    pub(crate) fn etcd_binaries(&self) -> Result<EtcdBinaries, SimError> {
        EtcdBinaries::find(&self.etcd_cache, self.talos_version().etcd_release())
    }

    /// The node's API address.
    pub fn api_addr(&self) -> String {
        format!("{}:{}", self.ip, self.api_port)
    }

    /// Whether the node has a machine configuration (a wiped STATE means
    /// maintenance mode: no machine type, no etcd).
    pub fn is_configured(&self) -> bool {
        self.configured.load(Ordering::Relaxed)
    }

    /// Whether the node is a worker (configured without etcd).
    pub fn is_worker(&self) -> bool {
        self.worker.load(Ordering::Relaxed)
    }

    pub(crate) fn set_worker(&self, worker: bool) {
        self.worker.store(worker, Ordering::Relaxed);
    }

    /// Whether the node is a configured control-plane node (one with etcd).
    pub fn is_control_plane(&self) -> bool {
        self.is_configured() && !self.is_worker()
    }

    /// The TLS its API serves with now: the cluster's once configured,
    /// the maintenance one before.
    pub(crate) fn api_tls(&self) -> Arc<ServerConfig> {
        if self.is_configured() {
            self.server_tls.clone()
        } else {
            self.maintenance_tls.clone()
        }
    }

    pub(crate) fn persist_config(&self, yaml: &str) -> std::io::Result<()> {
        talos_client::write_private_file(&self.config_path(), yaml.as_bytes())?;
        self.configured.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The persisted configuration, if STATE holds one.
    pub(crate) fn persisted_config(&self) -> Option<String> {
        std::fs::read_to_string(self.config_path()).ok()
    }

    /// The current power state.
    pub fn power(&self) -> Power {
        self.power.lock().expect("power lock").clone()
    }

    pub(crate) fn set_power(&self, power: Power) {
        let on = power == Power::On;
        let word = match power {
            Power::On => "on",
            Power::Rebooting => "rebooting",
            Power::Off => "off",
        };
        let old = std::mem::replace(&mut *self.power.lock().expect("power lock"), power.clone());
        if old != power {
            self.ledger.power(&self.name, on, word);
        }
        if !on {
            self.kube_apiserver.stop();
            self.kubeprism.stop();
        }
    }

    /// Where this node's KubePrism listens (the node's address, the
    /// configured port), while it runs.
    pub fn kubeprism_addr(&self) -> Option<std::net::SocketAddr> {
        self.kubeprism.addr()
    }

    /// This node's KubePrism upstreams: score, tier and the connections
    /// sent to each since it started (empty while it does not run).
    pub fn kubeprism_upstreams(&self) -> Vec<super::KubePrismUpstream> {
        self.kubeprism.upstreams()
    }

    /// How many connections this node's KubePrism proxied to each upstream
    /// (`host:port`) since it started.
    pub fn kubeprism_upstream_connections(&self) -> std::collections::BTreeMap<String, u64> {
        self.kubeprism.upstream_connections()
    }

    /// The process id of this node's kube-apiserver, while it runs.
    pub fn kube_apiserver_pid(&self) -> Option<u32> {
        self.kube_apiserver.pid()
    }

    /// The flags this node's kube-apiserver runs with, while it runs.
    pub fn kube_apiserver_args(&self) -> Option<Vec<String>> {
        self.kube_apiserver.args()
    }

    /// The token of the API being served, while it is up and presents the
    /// cluster's server certificate (a node that booted into maintenance
    /// mode presents its own, which a peer apid does not trust); it fires
    /// when the API goes down.
    pub(crate) fn cluster_front(&self) -> Option<CancellationToken> {
        match &*self.front.lock().expect("front lock") {
            Some((token, true)) if !token.is_cancelled() => Some(token.clone()),
            _ => None,
        }
    }

    /// The token of the API being served now, whichever certificate it
    /// presents; it fires when the API goes down.
    pub(crate) fn front_token(&self) -> Option<CancellationToken> {
        self.front
            .lock()
            .expect("front lock")
            .as_ref()
            .map(|(token, _)| token.clone())
    }

    /// Records the API being served (its token, and whether it presents
    /// the cluster's certificate), stopping the one before.
    pub(crate) fn set_front(&self, front: Option<(CancellationToken, bool)>) {
        let old = std::mem::replace(&mut *self.front.lock().expect("front lock"), front);
        if let Some((old, _)) = old {
            old.cancel();
        }
    }

    fn record(&self, message: impl Into<String>, state: &str) {
        record_event(&self.events, message, state);
    }

    /// The etcd service's recent events.
    pub fn etcd_events(&self) -> Vec<ServiceEvent> {
        self.events.lock().expect("events lock").clone()
    }

    fn spec(&self, initial_cluster: String, state: ClusterState) -> Result<EtcdSpec, SimError> {
        Ok(EtcdSpec {
            name: self.name.clone(),
            ip: self.ip,
            client_port: self.etcd_client_port,
            peer_port: self.etcd_peer_port,
            http_port: self.etcd_http_port,
            data_dir: self.etcd_data_dir(),
            initial_cluster,
            state,
            quota_backend_bytes: self.quota_backend_bytes,
            binaries: self.etcd_binaries()?,
            certs_dir: self.dir.join("etcd-pki"),
        })
    }

    /// Starts etcd as a member of a new cluster (`name=peer-url,...`).
    pub(crate) async fn start_etcd(
        &self,
        initial_cluster: String,
        state: ClusterState,
    ) -> Result<(), SimError> {
        let mut slot = self.etcd.lock().await;
        if slot.is_some() {
            return Ok(());
        }
        self.record("Starting service", "Preparing");
        let spec = self.spec(initial_cluster, state)?;
        let process = EtcdProcess::start(spec, &self.etcd_pki, &self.etcd_log()).await?;
        *slot = Some(process);
        self.ledger.etcd(&self.name, EtcdState::Running);
        self.record("Started task etcd for container etcd", "Running");
        self.etcd_health.start(
            self.etcd_client_url(),
            self.etcd_pki.clone(),
            self.timing,
            self.events.clone(),
        );
        Ok(())
    }

    /// Restarts etcd from its existing data directory (after a reboot).
    pub(crate) async fn restart_etcd(&self) -> Result<(), SimError> {
        if !self.etcd_data_dir().join("member").exists() {
            return Ok(());
        }
        // With existing data etcd ignores the initial cluster settings.
        let initial = format!("{}={}", self.name, self.etcd_peer_url());
        self.start_etcd(initial, ClusterState::Existing).await
    }

    /// Stops etcd (keeping its data) while the node's API keeps answering,
    /// as when the etcd service fails: the member stays in the cluster.
    pub async fn stop_etcd(&self) {
        if let Some(process) = self.etcd.lock().await.take() {
            self.etcd_health.stop();
            self.record("Stopping service", "Stopping");
            process.stop().await;
            self.ledger.etcd(&self.name, EtcdState::Stopped);
            self.record("Service finished successfully", "Finished");
        }
    }

    /// Freezes this node's etcd (SIGSTOP): its API keeps answering, its
    /// member stays listed, and every etcd call to it hangs, as on a
    /// stalled disk. Returns once the process has stopped; false when etcd
    /// does not run (or did not stop).
    pub async fn freeze_etcd(&self) -> bool {
        let mut slot = self.etcd.lock().await;
        let Some(process) = slot.as_mut() else {
            return false;
        };
        if !process.is_running() {
            return false;
        }
        let done = process.set_frozen(true).await;
        // Recorded even when not every thread showed stopped in time:
        // the signal was sent, and the process stops (or goes on) on it.
        self.ledger.etcd(&self.name, EtcdState::Frozen);
        done
    }

    /// Thaws an etcd frozen by [`Node::freeze_etcd`].
    pub async fn thaw_etcd(&self) -> bool {
        let mut slot = self.etcd.lock().await;
        let Some(process) = slot.as_mut() else {
            return false;
        };
        if !process.is_running() {
            return false;
        }
        let done = process.set_frozen(false).await;
        // Recorded even when not every thread showed stopped in time:
        // the signal was sent, and the process stops (or goes on) on it.
        self.ledger.etcd(&self.name, EtcdState::Thawed);
        done
    }

    /// The kernel's id of the current boot
    /// (`/proc/sys/kernel/random/boot_id`): new at every boot.
    pub fn boot_id(&self) -> String {
        self.boot_id.lock().expect("boot id lock").clone()
    }

    /// A new boot: a new boot id.
    /// When the node last booted.
    pub(crate) fn boot_time(&self) -> prost_types::Timestamp {
        let at = *self.booted.lock().expect("boot time lock");
        let d = at
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        prost_types::Timestamp {
            seconds: d.as_secs() as i64,
            nanos: d.subsec_nanos() as i32,
        }
    }

    /// Queues `action` for the node's supervisor.
    pub(crate) fn queue(&self, action: Action) {
        if self.actions.send((action, current_cause())).is_err() {
            tracing::warn!(node = %self.name, "no supervisor runs this node; action dropped");
        }
    }

    /// The queued actions, for the supervisor (once).
    pub(crate) fn take_queue(
        &self,
    ) -> Option<tokio::sync::mpsc::UnboundedReceiver<(Action, Cause)>> {
        self.queued.lock().expect("queue lock").take()
    }

    pub(crate) fn new_boot(&self) {
        *self.boot_id.lock().expect("boot id lock") = new_boot_id();
        *self.booted.lock().expect("boot time lock") = std::time::SystemTime::now();
        self.kubelet.start();
    }

    /// The node's identity (`Identities.cluster.talos.dev`, id `local`):
    /// a random id kept on STATE, so it survives reboots and changes when
    /// STATE is wiped, as upstream's NodeIdentityController
    /// (internal/app/machined/pkg/controllers/cluster/node_identity.go)
    /// keeps it. `None` until the node has a configuration (STATE is not
    /// in use in maintenance mode).
    pub fn node_id(&self) -> Option<String> {
        if !self.is_configured() {
            return None;
        }
        let path = self.volume("STATE").join("node-identity.yaml");
        if let Ok(text) = std::fs::read_to_string(&path)
            && let Some(id) = text.strip_prefix("nodeId: ")
        {
            return Some(id.trim().to_string());
        }
        let id = new_node_id();
        std::fs::create_dir_all(self.volume("STATE")).ok()?;
        std::fs::write(&path, format!("nodeId: {id}\n")).ok()?;
        Some(id)
    }

    /// Makes the next EtcdSnapshot from this node fail to read etcd after
    /// `bytes` bytes, which Talos answers by ending the stream early with
    /// status OK (a truncated snapshot only a content check notices).
    pub fn fail_next_snapshot_after(&self, bytes: u64) {
        *self.snapshot_fault.lock().expect("fault lock") = Some(bytes);
    }

    pub(crate) fn take_snapshot_fault(&self) -> Option<u64> {
        self.snapshot_fault.lock().expect("fault lock").take()
    }

    /// Makes the next EtcdLeaveCluster on this node remove its member only
    /// after `delay`, whether or not the caller still waits: a leave that
    /// outlasts the client's deadline and lands anyway.
    pub fn delay_next_leave(&self, delay: std::time::Duration) {
        *self.leave_delay.lock().expect("fault lock") = Some(delay);
    }

    pub(crate) fn take_leave_delay(&self) -> Option<std::time::Duration> {
        self.leave_delay.lock().expect("fault lock").take()
    }

    /// Makes Kubeconfig fail (`withheld`) or answer again: what machined
    /// answers when it cannot generate the admin kubeconfig
    /// (`kubeconfig.GenerateAdmin` failing), while the API server runs on.
    pub fn withhold_kubeconfig(&self, withheld: bool) {
        self.kubeconfig_withheld
            .store(withheld, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn kubeconfig_withheld(&self) -> bool {
        self.kubeconfig_withheld
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether the node's API is cut off by a partition.
    pub fn is_partitioned(&self) -> bool {
        self.blackhole.lock().expect("blackhole lock").is_some()
    }

    /// How many calls other nodes tried to forward to this one while it was
    /// partitioned (each went unanswered): what a test watches to know a
    /// caller has met the partition.
    pub fn unanswered_calls(&self) -> u64 {
        self.unanswered.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn note_unanswered(&self) {
        self.unanswered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn set_blackhole(&self, listener: Option<tokio::net::TcpListener>) {
        let cut = listener.is_some();
        let was = std::mem::replace(
            &mut *self.blackhole.lock().expect("blackhole lock"),
            listener,
        );
        if was.is_some() != cut {
            self.ledger.record(super::ledger::Event::Partition {
                node: self.name.clone(),
                cut,
            });
        }
    }

    /// The machine configuration in effect (after a TRY apply: the tried
    /// one until it is confirmed or rolled back).
    pub fn active_config(&self) -> String {
        self.config.lock().expect("config lock").active.clone()
    }

    /// Whether a TRY apply awaits confirmation or rollback.
    pub fn rollback_pending(&self) -> bool {
        self.config.lock().expect("config lock").rollback.is_some()
    }

    /// Holds the apply lock as an apply in progress would, until the guard
    /// is dropped (to exercise the concurrent-apply refusal).
    #[doc(hidden)]
    pub async fn hold_apply_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.apply_lock.lock().await
    }

    /// Holds the sequencer lock as a running sequence would, until the
    /// guard is dropped (to exercise a reset refused by the lock).
    #[doc(hidden)]
    pub async fn hold_sequence_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.sequence_lock.lock().await
    }

    /// Kills etcd without waiting (for use in `Drop`).
    pub(crate) fn kill_etcd_now(&self) {
        self.etcd_health.stop();
        if let Ok(mut slot) = self.etcd.try_lock() {
            drop(slot.take());
        }
    }

    /// The process id of this node's etcd, while it runs (for tests that
    /// freeze a member with SIGSTOP).
    pub async fn etcd_pid(&self) -> Option<u32> {
        self.etcd.lock().await.as_ref().and_then(EtcdProcess::pid)
    }

    /// Whether etcd runs on this node.
    pub async fn etcd_running(&self) -> bool {
        match self.etcd.lock().await.as_mut() {
            Some(process) => process.is_running(),
            None => false,
        }
    }

    /// A client for the local etcd member, as machined's handlers get one
    /// from upstream's `etcd.NewLocalClient` (internal/pkg/etcd/etcd.go):
    /// Unimplemented in maintenance mode or on a worker (as
    /// machinehelper.CheckControlplane). While etcd is not running the call
    /// waits for it, as the etcd client's RPCs do (they are sent with
    /// grpc's WaitForReady): only etcd starting again, or the caller's
    /// deadline or cancellation (which drops this future), ends the wait.
    pub(crate) async fn local_etcd(&self, api: &str) -> Result<(EtcdClient, String), Status> {
        self.check_controlplane(api)?;
        // grpc-go's reconnect backoff starts at 1 s; etcd is usually back
        // sooner in the simulator, so it looks more often.
        while !self.etcd_running().await {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        self.local_etcd_now(api).await
    }

    /// [`Node::local_etcd`] without the wait: Unavailable at once when etcd
    /// does not run (for the simulator's own health checks, which report
    /// instead of waiting).
    pub(crate) async fn local_etcd_now(&self, api: &str) -> Result<(EtcdClient, String), Status> {
        self.check_controlplane(api)?;
        if !self.etcd_running().await {
            return Err(Status::unavailable(format!(
                "etcd is not running on {}: dial tcp {}: connect: connection refused",
                self.name,
                self.etcd_client_url().trim_start_matches("https://")
            )));
        }
        let url = self.etcd_client_url();
        let client = EtcdClient::connect(std::slice::from_ref(&url), &self.etcd_pki).await?;
        Ok((client, url))
    }

    /// Unimplemented unless the node has a configuration, as
    /// machinehelper.CheckControlplane does for a machine without a type.
    pub(crate) fn check_controlplane(&self, api: &str) -> Result<(), Status> {
        if !self.is_configured() {
            Err(Status::unimplemented(format!(
                "machine type is not set, cannot use {api} API"
            )))
        } else if self.is_worker() {
            Err(Status::unimplemented(format!(
                "{api} is only available on control plane nodes"
            )))
        } else {
            Ok(())
        }
    }

    /// Looks a reset label up as upstream looks up a VolumeStatus by id: the
    /// system volumes (the image cache's only while it is enabled), the
    /// unlocated ones, and the user volumes declared by
    /// `UserVolumeConfig` documents in the active configuration (id `u-NAME`,
    /// constants.UserVolumePrefix).
    pub fn lookup_volume(&self, label: &str) -> VolumeLookup {
        let cache = IMAGE_CACHE_VOLUMES.contains(&label);
        if cache && !image_cache_enabled(&self.active_config()) {
            return VolumeLookup::Missing;
        }
        if system_volumes(self.talos_version()).contains(&label) {
            return VolumeLookup::Located;
        }
        if UNLOCATED_VOLUMES.contains(&label) {
            return VolumeLookup::NotLocated;
        }
        let declared = label.strip_prefix("u-").is_some_and(|name| {
            user_volume_names(&self.active_config())
                .iter()
                .any(|n| n == name)
        });
        if declared {
            VolumeLookup::Located
        } else {
            VolumeLookup::Missing
        }
    }

    /// Resolves a reset label as upstream's Reset handler does
    /// (v1alpha1_server.go): a missing VolumeStatus and a volume without a
    /// location each fail with the handler's own (plain, hence Unknown)
    /// error.
    pub(crate) fn locate_for_reset(&self, label: &str) -> Result<(), tonic::Status> {
        let quoted = crate::go_errors::quote(label);
        match self.lookup_volume(label) {
            VolumeLookup::Located => Ok(()),
            VolumeLookup::NotLocated => Err(tonic::Status::unknown(format!(
                "failed to reset: volume {quoted} is not located"
            ))),
            VolumeLookup::Missing => Err(tonic::Status::unknown(format!(
                "failed to get volume status with label {quoted}: resource VolumeStatuses.block.talos.dev(runtime/{label}@undefined) doesn't exist"
            ))),
        }
    }

    /// Wipes a system volume's contents.
    pub(crate) fn wipe(&self, label: &str) -> std::io::Result<()> {
        let path = self.volume(label);
        if label == "STATE" {
            // Cleared first: a wipe that fails half-way leaves no trusted
            // configuration either.
            self.configured.store(false, Ordering::Relaxed);
        }
        if path.exists() {
            std::fs::remove_dir_all(&path)?;
        }
        std::fs::create_dir_all(&path)
    }

    /// The node's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The volumes that exist only while the image cache is enabled: upstream
/// creates their VolumeConfigs only then
/// (internal/app/machined/pkg/controllers/cri/image_cache_config.go).
pub const IMAGE_CACHE_VOLUMES: [&str; 2] = ["IMAGECACHE", "IMAGECACHE-ISO"];

/// Whether a machine configuration enables the image cache
/// (`machine.features.imageCache.localEnabled`).
pub(crate) fn image_cache_enabled(config: &str) -> bool {
    use serde::Deserialize as _;
    serde_norway::Deserializer::from_str(config)
        .filter_map(|doc| serde_norway::Value::deserialize(doc).ok())
        .any(|doc| {
            doc.get("machine")
                .and_then(|m| m.get("features"))
                .and_then(|f| f.get("imageCache"))
                .and_then(|c| c.get("localEnabled"))
                .and_then(serde_norway::Value::as_bool)
                == Some(true)
        })
}

/// The names of the `UserVolumeConfig` documents in a machine configuration.
pub(crate) fn user_volume_names(config: &str) -> Vec<String> {
    use serde::Deserialize as _;
    #[derive(serde::Deserialize)]
    struct Document {
        kind: Option<String>,
        name: Option<String>,
    }
    serde_norway::Deserializer::from_str(config)
        .filter_map(|doc| Document::deserialize(doc).ok())
        .filter(|doc| doc.kind.as_deref() == Some("UserVolumeConfig"))
        .filter_map(|doc| doc.name)
        .collect()
}

/// Appends to a service's event history, keeping the last 20 entries.
pub(crate) fn record_event(
    events: &Mutex<Vec<ServiceEvent>>,
    message: impl Into<String>,
    state: &str,
) {
    let mut events = events.lock().expect("events lock");
    events.push(ServiceEvent {
        message: message.into(),
        state: state.to_string(),
        at: SystemTime::now(),
    });
    let excess = events.len().saturating_sub(20);
    events.drain(..excess);
}

/// A new node id: 32 random bytes in base62's alphabet (upstream encodes
/// them with github.com/jxskiss/base62; only the alphabet and the
/// randomness matter to a client, which compares ids).
fn new_node_id() -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut bytes = [0u8; 43];
    // SAFETY: getrandom writes at most `len` bytes into the buffer.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    assert_eq!(n, bytes.len() as isize, "getrandom");
    bytes
        .iter()
        .map(|b| ALPHABET[(*b as usize) % ALPHABET.len()] as char)
        .collect()
}

/// A random boot id, formatted as the kernel's (a UUID).
fn new_boot_id() -> String {
    let mut b = [0u8; 16];
    // SAFETY: getrandom writes at most `len` bytes into the buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    assert_eq!(n, b.len() as isize, "getrandom");
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}
