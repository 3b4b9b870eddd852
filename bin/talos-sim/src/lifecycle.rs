//! A simulated node's lifecycle: serving its API, powering off, rebooting,
//! resetting, joining etcd and bootstrapping.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::SimError;
use super::cluster::Shared;
use super::etcd_client::EtcdClient;
use super::etcd_process::ClusterState;
use super::front;
use super::machined::Machined;
use super::node::{Node, Power};
use super::serve::{serve_http2, tls_incoming};

/// Serves the node's API on its address until its power goes off.
pub(crate) async fn start_front(shared: &Arc<Shared>, node: &Arc<Node>) -> Result<(), SimError> {
    let addr = node.api_addr();
    let listener = bind_with_retry(&addr).await?;
    let token = CancellationToken::new();
    node.set_front(Some((token.clone(), node.is_configured())));
    let machined = Machined {
        node: node.clone(),
        shared: shared.clone(),
    };
    let (machine_front, cluster_front) = front::services(machined.clone());
    let incoming = tls_incoming(listener, node.api_tls(), token.clone());
    let routes = tonic::service::Routes::new(machine_front)
        .add_service(cluster_front)
        .add_service(crate::cosi::front(machined));
    tokio::spawn(serve_http2(incoming, routes, token));
    node.set_power(Power::On);
    Ok(())
}

/// Powers a node off: its API stops answering (open connections break)
/// and etcd stops, keeping its data.
pub(crate) async fn power_off(node: &Node) {
    node.set_front(None);
    node.set_power(Power::Off);
    node.stop_etcd().await;
}

/// Reboots a node: down for the boot delay, then up with its persisted
/// (or staged) configuration.
pub(crate) async fn reboot(shared: &Arc<Shared>, node: &Arc<Node>) {
    node.set_front(None);
    node.set_power(Power::Rebooting);
    node.stop_etcd().await;
    tokio::time::sleep(shared.cfg.boot_delay).await;
    {
        let mut state = node.config.lock().expect("config lock");
        if let Some(rollback) = state.rollback.take() {
            rollback.abort();
        }
        if let Some(persisted) = node.persisted_config() {
            state.active = persisted;
        }
        state.rebooting = false;
    }
    boot(shared, node).await;
}

/// Brings a node up: etcd from its data (or joining the cluster anew when
/// its data was wiped but it still has a configuration), then its API.
pub(crate) async fn boot(shared: &Arc<Shared>, node: &Arc<Node>) {
    if node.is_control_plane() {
        let started = if node.etcd_data_dir().join("member").exists() {
            node.restart_etcd().await
        } else {
            join_etcd(shared, node).await
        };
        if let Err(e) = started {
            tracing::warn!(node = %node.name, error = %e, "etcd did not start after boot");
        }
    }
    if let Err(e) = start_front(shared, node).await {
        tracing::warn!(node = %node.name, error = %e, "node API did not start after boot");
    }
}

/// The reset sequence, after the call has been answered: leave etcd when
/// graceful (abort if that fails), stop, wipe, then power off or reboot.
pub(crate) async fn reset(
    shared: &Arc<Shared>,
    node: &Arc<Node>,
    graceful: bool,
    reboot: bool,
    labels: &[String],
) {
    let _one_reset = node.reset_lock.lock().await;
    if graceful
        && node.etcd_running().await
        && let Err(status) = super::machined_etcd::leave_cluster(node, shared).await
    {
        tracing::warn!(node = %node.name, error = %status.message(), "reset aborted: leaving etcd failed");
        return;
    }
    node.set_front(None);
    node.set_power(Power::Rebooting);
    node.stop_etcd().await;
    for label in labels {
        if let Err(e) = node.wipe(label) {
            tracing::warn!(node = %node.name, %label, error = %e, "wipe failed");
        }
    }
    if reboot {
        tokio::time::sleep(shared.cfg.boot_delay).await;
        boot(shared, node).await;
    } else {
        node.set_power(Power::Off);
    }
}

/// Adds `node` to the etcd cluster as a learner, starts its member, and
/// promotes it once it has caught up (in the background).
pub(crate) async fn join_etcd(shared: &Arc<Shared>, node: &Arc<Node>) -> Result<(), SimError> {
    let peers: Vec<String> = shared
        .nodes()
        .iter()
        .filter(|n| n.name != node.name && n.is_control_plane() && n.power() == Power::On)
        .map(|n| n.etcd_client_url())
        .collect();
    if peers.is_empty() {
        return Err(SimError::Refused("no running etcd member to join".into()));
    }
    let client = EtcdClient::connect(&peers).await?;
    // etcd refuses new members until the cluster has been fully connected
    // for a few seconds ("unhealthy cluster"); Talos retries the same way.
    let deadline = Instant::now() + Duration::from_secs(60);
    let member = loop {
        match client.member_add(&node.etcd_peer_url(), true).await {
            Ok(member) => break member,
            Err(s) if s.code() == tonic::Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(s) => return Err(s.into()),
        }
    };
    let initial_cluster = client
        .member_list()
        .await?
        .into_iter()
        .filter_map(|m| {
            let name = if m.id == member.id {
                node.name.clone()
            } else {
                m.name.clone()
            };
            m.peer_ur_ls.first().map(|url| format!("{name}={url}"))
        })
        .collect::<Vec<_>>()
        .join(",");
    node.start_etcd(initial_cluster, ClusterState::Existing)
        .await?;
    let name = node.name.clone();
    tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(300);
        while Instant::now() < deadline {
            match client.member_promote(member.id).await {
                Ok(()) => {
                    tracing::info!(node = %name, "learner promoted to voting member");
                    return;
                }
                Err(s) if s.message().contains("not a learner") => return,
                Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
    });
    Ok(())
}

/// Starts etcd on a node without data: a new single-member cluster, or
/// one restored from the snapshot uploaded with EtcdRecover.
pub(crate) async fn bootstrap(
    node: &Node,
    recover: bool,
    skip_hash_check: bool,
) -> Result<(), Status> {
    let data = node.etcd_data_dir();
    if std::fs::read_dir(&data)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
    {
        return Err(Status::already_exists("etcd data directory is not empty"));
    }
    let initial_cluster = format!("{}={}", node.name, node.etcd_peer_url());
    if recover {
        let snapshot = node.recovery_snapshot_path();
        if !snapshot.exists() {
            return Err(Status::failed_precondition(
                "no etcd snapshot was uploaded for recovery",
            ));
        }
        let (data_dir, peer_url) = (node.etcd_data_dir(), node.etcd_peer_url());
        let target = super::etcd_process::RestoreTarget {
            data_dir: &data_dir,
            name: &node.name,
            peer_url: &peer_url,
        };
        super::etcd_process::restore_snapshot(&snapshot, target, &initial_cluster, skip_hash_check)
            .await
            .map_err(|e| Status::unknown(format!("failed to recover etcd: {e}")))?;
    }
    node.start_etcd(initial_cluster, ClusterState::New)
        .await
        .map_err(|e| Status::unknown(e.to_string()))
}

/// Binds the API address, retrying briefly while a previous listener of the
/// same node is still closing.
async fn bind_with_retry(addr: &str) -> Result<tokio::net::TcpListener, SimError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(source) => {
                return Err(SimError::Bind {
                    addr: addr.to_string(),
                    source,
                });
            }
        }
    }
}
