//! Starting, changing and stopping a simulated cluster: the facade over
//! the nodes' supervisors and the shared state.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::etcd_client::EtcdClient;
use super::etcd_process::ClusterState;
use super::node::Node;
use super::pki::{Ca, LeafSpec};
pub use super::shared::NodeInfo;
use super::shared::{NodeKind, Shared};
use super::{SimConfig, SimError};
use talos_client::config::{Context, TalosConfig};
use talos_client::tls::Credentials;

/// A running simulated cluster. Dropping it without
/// [`shutdown`](Cluster::shutdown) still kills every etcd it started.
pub struct Cluster {
    shared: Arc<Shared>,
}

fn write_private(path: &Path, data: &[u8]) -> Result<(), SimError> {
    talos_client::write_private_file(path, data).map_err(|e| SimError::io(path, e))
}

/// The cluster's CAs: Talos's OS CA, and the Kubernetes and etcd CAs its
/// machine configuration carries (`cluster.ca`, `cluster.etcd.ca`).
pub(crate) struct ClusterCas {
    pub(crate) os: Ca,
    pub(crate) kubernetes: Ca,
    pub(crate) etcd: Ca,
    /// The service-account signing key (`cluster.serviceAccount.key`),
    /// PEM. Talos makes an RSA key for new clusters; the simulator an ECDSA
    /// P-256 one (which Talos made before, and kube-apiserver takes alike).
    pub(crate) service_account: String,
}

impl ClusterCas {
    /// Loads the CAs kept in `dir/pki`, making and storing those missing.
    fn load_or_create(dir: &Path) -> Result<ClusterCas, SimError> {
        Ok(ClusterCas {
            os: load_or_create_ca(dir, "ca", Ca::generate)?,
            kubernetes: load_or_create_ca(dir, "kubernetes-ca", Ca::generate_kubernetes)?,
            etcd: load_or_create_ca(dir, "etcd-ca", Ca::generate_etcd)?,
            service_account: load_or_create_key(dir, "service-account")?,
        })
    }
}

/// Loads the key kept in `dir/pki/NAME.key`, or makes and stores one.
fn load_or_create_key(dir: &Path, name: &str) -> Result<String, SimError> {
    let path = dir.join(format!("pki/{name}.key"));
    if path.exists() {
        return std::fs::read_to_string(&path).map_err(|e| SimError::io(&path, e));
    }
    let key = crate::pki::generate_ec_key_pem()?;
    write_private(&path, key.as_bytes())?;
    Ok(key)
}

/// Loads the CA kept in `dir/pki/NAME.{crt,key}`, or makes and stores one.
fn load_or_create_ca(
    dir: &Path,
    name: &str,
    generate: fn() -> Result<Ca, crate::pki::PkiError>,
) -> Result<Ca, SimError> {
    let (crt, key) = (
        dir.join(format!("pki/{name}.crt")),
        dir.join(format!("pki/{name}.key")),
    );
    if crt.exists() && key.exists() {
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| SimError::io(p, e));
        return Ok(Ca::load(&read(&crt)?, &read(&key)?)?);
    }
    let ca = generate()?;
    write_private(&crt, ca.cert_pem.as_bytes())?;
    write_private(&key, ca.key_pem().as_bytes())?;
    Ok(ca)
}

/// The worker configuration: the control-plane one with `type: worker` and
/// the CA's certificate only, as `talosctl gen config` writes worker.yaml.
/// Without the `cluster.etcd` section either, which upstream's Validate
/// refuses on a worker, nor the secretbox key, which only the control
/// plane's configuration carries (pkg/machinery/config/generate/init.go),
/// nor the control plane's other documents (1.14's service account).
fn worker_machine_config(controlplane: &str) -> String {
    let mut in_etcd = false;
    let v1alpha1 = controlplane.split("\n---\n").next().unwrap_or_default();
    v1alpha1
        .lines()
        .filter(|line| {
            if line.starts_with("  etcd:") {
                in_etcd = true;
            } else if !line.starts_with("   ") {
                in_etcd = false;
            }
            let field = line.trim_start();
            !in_etcd
                && !field.starts_with("key: ")
                && field != "serviceAccount:"
                && !field.starts_with("secretboxEncryptionSecret:")
        })
        .map(|line| line.replace("type: controlplane", "type: worker"))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The machine configuration every simulated node starts with (the nodes'
/// hostnames come from the simulator, not from this document). Like a real
/// control-plane configuration it carries the cluster's CAs, keys included:
/// a node in maintenance mode takes its PKI from it. Its etcd section
/// carries the etcd CA, which upstream's Validate requires of a control
/// plane, and `cluster.ca` the Kubernetes CA the admin kubeconfig is
/// issued from (pkg/machinery/config/generate: `talosctl gen config`).
pub(crate) fn default_machine_config(cfg: &SimConfig, cas: &ClusterCas) -> String {
    let mut config = v1alpha1_config(cfg, cas);
    if cfg.talos_version.at_least_1_14() {
        config.push_str(&service_account_document(
            &format!("https://{}:6443", cfg.node_ip(1)),
            &cas.service_account,
        ));
    }
    config
}

/// The service-account document `talosctl gen config` writes from 1.14
/// (pkg/machinery/config/generate/kubernetes.go: the issuer's key, PEM,
/// and the control-plane endpoint as issuer URL; types/k8s/
/// service_account.go), after the v1alpha1 document.
fn service_account_document(endpoint: &str, key_pem: &str) -> String {
    let key: String = key_pem
        .lines()
        .map(|line| format!("    {line}\n"))
        .collect();
    format!(
        "---\napiVersion: v1alpha1\nkind: KubeServiceAccountConfig\nissuer:\n  \
         privateKey: |\n{key}  issuerURL: {endpoint}\n"
    )
}

/// The v1alpha1 document of [`default_machine_config`].
fn v1alpha1_config(cfg: &SimConfig, cas: &ClusterCas) -> String {
    use base64::Engine as _;
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    format!(
        "version: v1alpha1\n\
         debug: false\n\
         persist: true\n\
         machine:\n  type: controlplane\n  token: talos-sim-token\n  \
         ca:\n    crt: {ca_crt}\n    key: {ca_key}\n  certSANs: []\n  \
         install:\n    disk: /dev/sda\n    image: ghcr.io/siderolabs/installer:{version}\n  \
         features:\n    kubePrism:\n      enabled: true\n      port: 7445\n\
         cluster:\n  clusterName: talos-sim\n  controlPlane:\n    endpoint: https://{ip}:6443\n  \
         secretboxEncryptionSecret: {secretbox}\n  \
         ca:\n    crt: {k8s_crt}\n    key: {k8s_key}\n  \
         {service_account}\
         etcd:\n    ca:\n      crt: {etcd_crt}\n      key: {etcd_key}\n    advertisedSubnets:\n      - 127.0.0.0/8\n",
        version = cfg.talos_version.tag(),
        ip = cfg.node_ip(1),
        ca_crt = b64(&cas.os.cert_pem),
        ca_key = b64(cas.os.key_pem()),
        k8s_crt = b64(&cas.kubernetes.cert_pem),
        k8s_key = b64(cas.kubernetes.key_pem()),
        etcd_crt = b64(&cas.etcd.cert_pem),
        etcd_key = b64(cas.etcd.key_pem()),
        // 1.14 carries the key in a KubeServiceAccountConfig document
        // instead (appended below).
        service_account = if cfg.talos_version.at_least_1_14() {
            String::new()
        } else {
            format!(
                "serviceAccount:\n    key: {}\n  ",
                b64(&cas.service_account)
            )
        },
        secretbox = b64_bytes(&random_key()),
    )
}

/// 32 random bytes: the cluster's secretbox key, as `talosctl gen config`
/// makes one for every cluster (pkg/machinery/config/generate/secrets/bundle.go).
fn random_key() -> [u8; 32] {
    use std::io::Read as _;
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .expect("/dev/urandom is readable");
    key
}

fn b64_bytes(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

impl Cluster {
    /// Starts a cluster: CA (kept in `dir/pki` across runs), one real etcd
    /// member and one API front per node, and the talosconfigs
    /// `dir/talosconfig` (admin), `dir/talosconfig-reader` and
    /// `dir/talosconfig-backup`. Any node data from an earlier run in `dir` is
    /// discarded: every `up` starts a fresh etcd cluster.
    pub async fn up(mut cfg: SimConfig) -> Result<Cluster, SimError> {
        if cfg.nodes == 0 {
            return Err(SimError::Refused(
                "a cluster needs at least one node".into(),
            ));
        }
        cfg.pick_free_ports()?;
        crate::etcd_process::EtcdBinaries::find(&cfg.etcd_cache, cfg.talos_version.etcd_release())?;
        std::fs::create_dir_all(&cfg.dir).map_err(|e| SimError::io(&cfg.dir, e))?;
        let nodes_dir = cfg.dir.join("nodes");
        if nodes_dir.exists() {
            std::fs::remove_dir_all(&nodes_dir).map_err(|e| SimError::io(&nodes_dir, e))?;
        }
        let cas = ClusterCas::load_or_create(&cfg.dir)?;
        let machine_config = default_machine_config(&cfg, &cas);
        let ca = cas.os;
        let etcd_pki = Arc::new(crate::etcd_tls::EtcdPki::new(cas.etcd)?);
        // Clients outside the simulator (etcdctl, benchmarks) reach the
        // members with machined's etcd identity.
        write_private(
            &cfg.dir.join("pki/etcd-client.crt"),
            etcd_pki.client_cert_pem().as_bytes(),
        )?;
        write_private(
            &cfg.dir.join("pki/etcd-client.key"),
            etcd_pki.client_key_pem().as_bytes(),
        )?;
        let proxy = ca.issue(&LeafSpec::client(&["os:impersonator"]))?;
        let proxy_identity = Credentials::from_pem(
            ca.cert_pem.as_bytes(),
            proxy.cert_pem.as_bytes(),
            proxy.key_pem.as_bytes(),
        );
        let proxy_peer = crate::serve::PeerInfo::of_certificate_pem(&proxy.cert_pem)?;
        write_private(
            &cfg.dir.join("controlplane.yaml"),
            machine_config.as_bytes(),
        )?;
        let worker_config = worker_machine_config(&machine_config);
        let cfg_dir = cfg.dir.clone();
        write_private(&cfg.dir.join("worker.yaml"), worker_config.as_bytes())?;
        let shared = Arc::new(Shared {
            cfg,
            ca,
            etcd_pki,
            nodes: RwLock::new(Vec::new()),
            proxy_identity,
            proxy_peer,
            backends: tokio::sync::Mutex::new(HashMap::new()),
            machine_config,
            worker_config,
            add_lock: tokio::sync::Mutex::new(()),
            stop: tokio_util::sync::CancellationToken::new(),
            ledger: Arc::new(crate::ledger::Ledger::create(&cfg_dir)),
            calls: crate::auth::CallLog::default(),
        });
        let cluster = Cluster { shared };
        cluster.start_initial_nodes().await?;
        cluster.write_talosconfigs()?;
        Ok(cluster)
    }

    async fn start_initial_nodes(&self) -> Result<(), SimError> {
        let shared = &self.shared;
        let mut created = Vec::new();
        for index in 1..=shared.cfg.nodes {
            created.push(Arc::new(shared.create_node(index, NodeKind::ControlPlane)?));
        }
        *shared.nodes.write().expect("nodes lock") = created.clone();
        let initial_cluster = created
            .iter()
            .map(|n| format!("{}={}", n.name, n.etcd_peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let starts = created
            .iter()
            .map(|n| n.start_etcd(initial_cluster.clone(), ClusterState::New));
        for result in futures::future::join_all(starts).await {
            result?;
        }
        for node in &created {
            crate::supervisor::start(shared, node).await?;
        }
        shared.wait_for_leader(Duration::from_secs(60)).await?;
        // The ledger tracks quorum from the membership etcd started with.
        let members = EtcdClient::connect(&shared.control_plane_etcd_urls(), &shared.etcd_pki)
            .await?
            .member_list()
            .await?;
        shared
            .ledger
            .seed_members(members.into_iter().map(|m| (m.id, m.name)));
        // Workers: configured, API only, no etcd.
        let first = shared.cfg.nodes + 1;
        let workers: Vec<Arc<Node>> = (first..first + shared.cfg.workers)
            .map(|index| shared.create_node(index, NodeKind::Worker).map(Arc::new))
            .collect::<Result<_, _>>()?;
        shared
            .nodes
            .write()
            .expect("nodes lock")
            .extend(workers.iter().cloned());
        for node in &workers {
            crate::supervisor::start(shared, node).await?;
        }
        Ok(())
    }

    fn write_talosconfigs(&self) -> Result<(), SimError> {
        let shared = &self.shared;
        let endpoints: Vec<String> = shared
            .nodes()
            .iter()
            .filter(|n| !n.is_worker())
            .map(|n| {
                if n.api_port == talos_client::config::DEFAULT_API_PORT {
                    n.ip.to_string()
                } else {
                    n.api_addr()
                }
            })
            .collect();
        let first = shared.nodes()[0].ip.to_string();
        for (file, roles) in [
            ("talosconfig", &["os:admin"][..]),
            ("talosconfig-reader", &["os:reader"][..]),
            ("talosconfig-backup", &["os:etcd:backup"][..]),
        ] {
            let identity = shared.ca.issue(&LeafSpec::client(roles))?;
            let mut context = Context::new(
                endpoints.clone(),
                shared.ca.cert_pem.as_bytes(),
                identity.cert_pem.as_bytes(),
                identity.key_pem.as_bytes(),
            );
            context.nodes = vec![first.clone()];
            let yaml = TalosConfig::with_context("sim", context).to_yaml();
            write_private(&shared.cfg.dir.join(file), yaml.as_bytes())?;
        }
        Ok(())
    }

    /// The admin talosconfig.
    pub fn talosconfig_path(&self) -> PathBuf {
        self.shared.cfg.dir.join("talosconfig")
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.cfg.dir
    }

    /// The layout the cluster was started with.
    pub fn config(&self) -> &SimConfig {
        &self.shared.cfg
    }

    /// What happened in the cluster so far: its ledger (see
    /// [`crate::ledger`]), also written to `DIR/ledger.jsonl`.
    pub fn ledger(&self) -> &crate::ledger::Ledger {
        &self.shared.ledger
    }

    /// The OS CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.shared.ca.cert_pem
    }

    /// The cluster's etcd CA and the etcd client identity of its nodes'
    /// machined: what a client of the members themselves needs
    /// ([`crate::etcd_client::EtcdClient::connect`]).
    pub fn etcd_pki(&self) -> Arc<crate::etcd_tls::EtcdPki> {
        self.shared.etcd_pki.clone()
    }

    /// `etcdctl` of the etcd release the cluster's Talos runs, with the
    /// etcd CA and machined's client certificate (`DIR/pki/etcd-ca.crt`,
    /// `DIR/pki/etcd-client.{crt,key}`); the caller adds `--endpoints`.
    pub fn etcdctl(&self) -> Result<std::process::Command, SimError> {
        let cfg = &self.shared.cfg;
        let binaries = crate::etcd_process::EtcdBinaries::find(
            &cfg.etcd_cache,
            cfg.talos_version.etcd_release(),
        )?;
        let pki = cfg.dir.join("pki");
        let mut command = std::process::Command::new(binaries.etcdctl());
        command
            .arg(format!("--cacert={}", pki.join("etcd-ca.crt").display()))
            .arg(format!("--cert={}", pki.join("etcd-client.crt").display()))
            .arg(format!("--key={}", pki.join("etcd-client.key").display()));
        Ok(command)
    }

    /// Issues a client certificate with the given roles from the cluster CA.
    pub fn issue_client(&self, spec: &LeafSpec) -> Result<Credentials, SimError> {
        let identity = self.shared.ca.issue(spec)?;
        Ok(Credentials::from_pem(
            self.shared.ca.cert_pem.as_bytes(),
            identity.cert_pem.as_bytes(),
            identity.key_pem.as_bytes(),
        ))
    }

    /// The calls the nodes answered or refused, oldest first, each with the
    /// roles it was judged by (the most recent
    /// 20 000): what a test reads to see which identity a client
    /// presented.
    pub fn calls(&self) -> Vec<crate::CallRecord> {
        self.shared.calls.calls()
    }

    /// Every node, in order.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.shared
            .nodes()
            .iter()
            .map(|n| NodeInfo::of(n))
            .collect()
    }

    /// A node by name or address.
    pub fn node(&self, target: &str) -> Option<Arc<Node>> {
        self.shared.find(target)
    }

    /// Powers a node off at once, as a crash or a pulled plug would: its API
    /// stops answering mid-call and etcd stops (its data is kept).
    pub async fn power_off(&self, target: &str) -> Result<(), SimError> {
        let node = self
            .shared
            .find(target)
            .ok_or_else(|| SimError::Refused(format!("no node {target:?}")))?;
        crate::lifecycle::power_off(&node).await;
        Ok(())
    }

    /// Puts a new machine at a powered-off node's address (after a reset,
    /// say): wiped, configured as a control-plane node of this cluster and
    /// booted, its etcd joining as a new member under the node's name.
    pub async fn boot_fresh(&self, target: &str) -> Result<(), SimError> {
        let node = self
            .shared
            .find(target)
            .ok_or_else(|| SimError::Refused(format!("no node {target:?}")))?;
        crate::supervisor::boot_fresh(&self.shared, &node).await
    }

    /// Arms a fault for a node's next upgrade (legacy or lifecycle path):
    /// at the boot into the new version it boots its old partition and
    /// comes back on the version it ran, or it never comes back.
    pub fn fail_next_upgrade(
        &self,
        target: &str,
        fault: crate::upgrade_state::UpgradeFault,
    ) -> Result<(), SimError> {
        let node = self
            .shared
            .find(target)
            .ok_or_else(|| SimError::Refused(format!("no node {target:?}")))?;
        node.fail_next_upgrade(fault);
        Ok(())
    }

    /// Cuts a running node's API off the network: callers (clients and
    /// the other nodes' apid) connect and hear nothing, open connections
    /// break, while the node keeps running with its etcd member. Its etcd
    /// still reaches its peers: what is cut is the path to the API, as a
    /// firewall or a broken route to port 50000 would. False when the node
    /// is not up or already partitioned.
    pub async fn partition(&self, target: &str) -> Result<bool, SimError> {
        let node = self
            .shared
            .find(target)
            .ok_or_else(|| SimError::Refused(format!("no node {target:?}")))?;
        crate::lifecycle::partition(&node).await
    }

    /// Ends [`Cluster::partition`]: the node's API serves again. False when
    /// it was not partitioned.
    pub async fn heal(&self, target: &str) -> Result<bool, SimError> {
        let node = self
            .shared
            .find(target)
            .ok_or_else(|| SimError::Refused(format!("no node {target:?}")))?;
        crate::supervisor::heal(&self.shared, &node).await
    }

    /// Writes `count` keys of `value_size` bytes through the running nodes'
    /// etcd (to give snapshots some weight).
    pub async fn fill(
        &self,
        prefix: &str,
        count: usize,
        value_size: usize,
    ) -> Result<(), SimError> {
        self.shared.fill(prefix, count, value_size).await
    }

    /// Writes one key through the running nodes' etcd (a Kubernetes
    /// object, say, as kube-apiserver would store it).
    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<(), SimError> {
        let client = EtcdClient::connect(
            &self.shared.control_plane_etcd_urls(),
            &self.shared.etcd_pki,
        )
        .await?;
        Ok(client.put(key.to_vec(), value.to_vec()).await?)
    }

    /// Deletes every key under `prefix` and compacts etcd's history, as a
    /// cluster that dropped many objects leaves its members: their
    /// databases keep the space until they are defragmented. Returns how
    /// many keys went.
    pub async fn clear(&self, prefix: &str) -> Result<i64, SimError> {
        self.shared.clear(prefix).await
    }

    /// Adds a control-plane node whose etcd joins as a learner and is
    /// promoted to a voter once it has caught up, as Talos does.
    pub async fn add_node(&self) -> Result<NodeInfo, SimError> {
        crate::supervisor::add_node(&self.shared, false).await
    }

    /// Adds a node in maintenance mode: no configuration, its API answers
    /// without a client certificate with a certificate of its own (see
    /// [`NodeInfo::maintenance_fingerprint`]); applying a control-plane
    /// configuration makes it join etcd.
    pub async fn add_maintenance_node(&self) -> Result<NodeInfo, SimError> {
        crate::supervisor::add_node(&self.shared, true).await
    }

    /// Answers [`control::Request`](crate::control::Request)s on a Unix
    /// socket (mode 0600) until the cluster shuts down.
    pub fn serve_control(&self, socket: &Path) -> Result<(), SimError> {
        use std::os::unix::fs::PermissionsExt as _;
        let _ = std::fs::remove_file(socket);
        let listener =
            tokio::net::UnixListener::bind(socket).map_err(|e| SimError::io(socket, e))?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| SimError::io(socket, e))?;
        crate::control::serve(listener, Arc::downgrade(&self.shared));
        Ok(())
    }

    /// Stops every node's API and etcd.
    pub async fn shutdown(self) {
        self.shared.stop.cancel();
        let nodes = self.shared.nodes();
        let stop = futures::future::join_all(nodes.iter().map(|n| crate::lifecycle::power_off(n)));
        crate::ledger::with_cause(crate::ledger::Cause::simulator("shutdown"), stop).await;
    }
}

impl Drop for Cluster {
    /// Without a [`Cluster::shutdown`], the APIs stop and every etcd is
    /// killed here, so a failing test leaves no process behind.
    fn drop(&mut self) {
        self.shared.stop.cancel();
        for node in self.shared.nodes() {
            node.set_front(None);
            node.kill_etcd_now();
            node.kube_apiserver.stop();
            node.kubeprism.stop();
        }
    }
}
