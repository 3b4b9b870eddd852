//! State every node of a simulated cluster shares: the node list, the CA,
//! the configurations new nodes start with and the channels apid uses to
//! reach its peers. The cluster facade, the supervisors and the handlers all
//! read it; it calls none of them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tonic::Status;
use tonic::transport::Channel;

use crate::SimConfig;
use crate::SimError;
use crate::etcd_client::EtcdClient;
use crate::etcd_tls::EtcdPki;
use crate::node::{Node, NodeLayout, Power};
use crate::pki::{Ca, LeafSpec};
use talos_client::tls::Credentials;

/// What a simulated node is, for printing and for scripts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeInfo {
    /// Hostname and etcd member name.
    pub name: String,
    /// Address.
    pub ip: IpAddr,
    /// apid endpoint (`ip:port`).
    pub api: String,
    /// etcd client URL.
    pub etcd_client_url: String,
    /// While in maintenance mode: the API certificate's SPKI fingerprint,
    /// for `--cert-fingerprint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_fingerprint: Option<String>,
    /// A worker: no etcd.
    #[serde(default)]
    pub worker: bool,
}

impl NodeInfo {
    pub(crate) fn of(node: &Node) -> NodeInfo {
        NodeInfo {
            name: node.name.clone(),
            ip: IpAddr::V4(node.ip),
            api: node.api_addr(),
            etcd_client_url: node.etcd_client_url(),
            maintenance_fingerprint: (!node.is_configured())
                .then(|| node.maintenance_fingerprint.clone()),
            worker: node.is_worker(),
        }
    }
}

/// State shared by every node of a cluster.
pub(crate) struct Shared {
    pub cfg: SimConfig,
    pub(crate) ca: Ca,
    /// The etcd CA and machined's etcd client identity.
    pub(crate) etcd_pki: Arc<EtcdPki>,
    pub(crate) nodes: RwLock<Vec<Arc<Node>>>,
    /// The identity apids use to forward calls to each other.
    pub(crate) proxy_identity: Credentials,
    /// How a peer sees a call this simulator's apids forward to it without
    /// the network hop: the proxy identity's certificate and roles.
    pub(crate) proxy_peer: crate::serve::PeerInfo,
    pub(crate) backends: tokio::sync::Mutex<HashMap<String, Channel>>,
    pub(crate) machine_config: String,
    pub(crate) worker_config: String,
    pub(crate) add_lock: tokio::sync::Mutex<()>,
    /// Cancelled when the cluster shuts down or is dropped: the nodes'
    /// supervisors stop.
    pub(crate) stop: tokio_util::sync::CancellationToken,
    /// What happened in the cluster (see [`crate::ledger`]).
    pub(crate) ledger: Arc<crate::ledger::Ledger>,
    /// Who called what, as each node's front judged it.
    pub(crate) calls: crate::auth::CallLog,
}

/// What a new node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeKind {
    ControlPlane,
    Worker,
    Maintenance,
}

impl Shared {
    pub(crate) async fn fill(
        &self,
        prefix: &str,
        count: usize,
        value_size: usize,
    ) -> Result<(), SimError> {
        let client = EtcdClient::connect(&self.control_plane_etcd_urls(), &self.etcd_pki).await?;
        let value = vec![b'x'; value_size];
        for i in 0..count {
            client
                .put(format!("{prefix}{i:08}").into_bytes(), value.clone())
                .await?;
        }
        Ok(())
    }

    pub(crate) async fn clear(&self, prefix: &str) -> Result<i64, SimError> {
        let client = EtcdClient::connect(&self.control_plane_etcd_urls(), &self.etcd_pki).await?;
        Ok(client.delete_prefix_and_compact(prefix.as_bytes()).await?)
    }

    /// The cluster's CA (the simulator's only one).
    pub(crate) fn ca(&self) -> &Ca {
        &self.ca
    }

    pub(crate) fn node_infos(&self) -> Vec<NodeInfo> {
        self.nodes().iter().map(|n| NodeInfo::of(n)).collect()
    }

    pub(crate) fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.read().expect("nodes lock").clone()
    }

    /// A node by hostname or address.
    pub(crate) fn find(&self, target: &str) -> Option<Arc<Node>> {
        let ip = target.parse().ok();
        self.nodes
            .read()
            .expect("nodes lock")
            .iter()
            .find(|n| named(n, target, ip))
            .cloned()
    }

    /// Whether `target` names `node` itself.
    pub(crate) fn is_self(&self, node: &Node, target: &str) -> bool {
        named(node, target, target.parse().ok())
    }

    pub(crate) fn create_node(&self, index: usize, kind: NodeKind) -> Result<Node, SimError> {
        let cfg = &self.cfg;
        let ip = cfg.node_ip(index);
        let name = match kind {
            NodeKind::Worker => format!("worker-{}", index - cfg.nodes),
            _ => format!("cp-{index}"),
        };
        let cert = self.ca.issue(&LeafSpec::server(
            &[IpAddr::V4(ip), IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)],
            &[name.as_str(), "localhost"],
        ))?;
        let server_tls = Credentials::from_pem(
            self.ca.cert_pem.as_bytes(),
            cert.cert_pem.as_bytes(),
            cert.key_pem.as_bytes(),
        );
        let server_tls = crate::tls::server_config(&server_tls)?;
        // A node without configuration serves a certificate from a root of
        // its own (upstream's maintenance root, secrets/maintenance_root.go).
        let maintenance_ca = Ca::generate()?;
        let maintenance_cert = maintenance_ca.issue(&LeafSpec::server(
            &[IpAddr::V4(ip), IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)],
            &[name.as_str(), "localhost"],
        ))?;
        let maintenance_tls = crate::tls::maintenance_server_config(
            &maintenance_cert.cert_pem,
            &maintenance_cert.key_pem,
        )?;
        let der = talos_client::tls::parse_certificates(
            maintenance_cert.cert_pem.as_bytes(),
            talos_client::tls::Material::Certificate,
        )?;
        let maintenance_fingerprint = talos_client::maintenance::spki_fingerprint(&der[0])?;
        Node::new(
            NodeLayout {
                index,
                dir: cfg.dir.join("nodes").join(&name),
                name,
                ip,
                second_ip: cfg.second_ip(index),
                api_port: cfg.api_port,
                etcd_client_port: cfg.etcd_client_port,
                etcd_peer_port: cfg.etcd_peer_port,
                etcd_http_port: cfg.etcd_http_port,
                etcd_cache: cfg.etcd_cache.clone(),
                etcd_pki: self.etcd_pki.clone(),
                quota_backend_bytes: cfg.quota_backend_bytes,
                server_tls,
                maintenance_tls,
                maintenance_fingerprint,
                worker: kind == NodeKind::Worker,
                timing: cfg.timing,
                kube_apiserver: cfg.kube_apiserver.clone(),
                version: cfg.talos_version,
                ledger: self.ledger.clone(),
            },
            match kind {
                NodeKind::ControlPlane => Some(self.machine_config.clone()),
                NodeKind::Worker => Some(self.worker_config.clone()),
                NodeKind::Maintenance => None,
            },
        )
    }

    /// etcd client URLs of the configured, powered-on nodes: what upstream's
    /// `NewClientFromControlPlaneIPs` connects to.
    pub(crate) fn control_plane_etcd_urls(&self) -> Vec<String> {
        self.nodes()
            .iter()
            .filter(|n| n.is_control_plane() && n.power() == Power::On)
            .map(|n| n.etcd_client_url())
            .collect()
    }

    /// A channel to another node's apid, authenticated as a peer apid. A
    /// failure reads as grpc-go's for a fail-fast call on a channel that
    /// cannot connect (balancer/pickfirst, picker_wrapper.go): Unavailable,
    /// the connection error with the dialled `host:port`, or the name
    /// resolver's error for a name that does not resolve.
    pub(crate) async fn backend(&self, target: &str) -> Result<Channel, Status> {
        let host = match self.find(target) {
            Some(node) => node.ip.to_string(),
            None if target.parse::<IpAddr>().is_ok() => target.to_string(),
            None => {
                return Err(Status::unavailable(
                    "name resolver error: produced zero addresses",
                ));
            }
        };
        let mut backends = self.backends.lock().await;
        if let Some(channel) = backends.get(&host) {
            return Ok(channel.clone());
        }
        let tls = self
            .proxy_identity
            .client_config()
            .map_err(|e| Status::internal(e.to_string()))?;
        let channel = crate::dial::dial(&host, self.cfg.api_port, tls)
            .await
            .map_err(|desc| crate::dial::connection_error(&desc))?;
        backends.insert(host, channel.clone());
        Ok(channel)
    }

    pub(crate) async fn wait_for_leader(&self, timeout: Duration) -> Result<(), SimError> {
        let deadline = Instant::now() + timeout;
        let urls = self.control_plane_etcd_urls();
        let client = EtcdClient::connect(&urls, &self.etcd_pki).await?;
        loop {
            let mut leaders = Vec::new();
            for url in &urls {
                if let Ok(status) = client.status(url).await {
                    leaders.push(status.leader);
                }
            }
            if leaders.len() == urls.len() && leaders.iter().all(|l| *l != 0 && *l == leaders[0]) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(SimError::Refused("etcd elected no leader in time".into()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Whether `target` (already parsed as `ip` when it is an address) is
/// `node`'s hostname or address.
fn named(node: &Node, target: &str, ip: Option<std::net::Ipv4Addr>) -> bool {
    node.name == target || ip == Some(node.ip) || (ip.is_some() && ip == node.second_ip)
}
