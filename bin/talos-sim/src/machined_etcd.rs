//! The etcd calls of a simulated node, against its real etcd member. Each
//! mirrors the handler of the same name in siderolabs/talos
//! internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go and the
//! helpers in internal/pkg/etcd/etcd.go.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use tonic::{Code, Status};

use super::cluster::Shared;
use super::etcd_client::EtcdClient;
use super::node::Node;
use crate::api::{common, etcdserverpb as pb, machine};

/// Talos streams snapshots in chunks of this size (pkg/chunker/stream).
pub(crate) const SNAPSHOT_CHUNK: usize = 1024;

/// A plain (non-status) error from machined reaches the client as Unknown.
fn failed(context: &str, status: &Status) -> Status {
    Status::unknown(format!("{context}: {}", status.message()))
}

/// A client for every configured control-plane node's etcd, as upstream's
/// `etcd.NewClientFromControlPlaneIPs`.
async fn cluster_client(shared: &Shared) -> Result<EtcdClient, Status> {
    EtcdClient::connect(&shared.control_plane_etcd_urls()).await
}

fn to_member(m: pb::Member) -> machine::EtcdMember {
    machine::EtcdMember {
        id: m.id,
        hostname: m.name,
        peer_urls: m.peer_ur_ls,
        client_urls: m.client_ur_ls,
        is_learner: m.is_learner,
    }
}

pub(crate) async fn member_list(
    node: &Node,
    shared: &Shared,
    query_local: bool,
) -> Result<machine::EtcdMembers, Status> {
    let client = if query_local {
        node.local_etcd("member list").await?.0
    } else {
        node.check_controlplane("member list")?;
        cluster_client(shared).await?
    };
    let members = client.member_list().await?;
    Ok(machine::EtcdMembers {
        metadata: None,
        legacy_members: members.iter().map(|m| m.name.clone()).collect(),
        members: members.into_iter().map(to_member).collect(),
    })
}

pub(crate) async fn remove_member_by_id(
    node: &Node,
    shared: &Shared,
    id: u64,
) -> Result<(), Status> {
    node.check_controlplane("etcd remove member")?;
    match cluster_client(shared).await?.member_remove(id).await {
        Ok(()) => Ok(()),
        Err(status) if status.code() == Code::NotFound => Err(Status::not_found(format!(
            "failed to remove member {id}: {}",
            status.message()
        ))),
        Err(status) => Err(failed(&format!("failed to remove member {id}"), &status)),
    }
}

/// The local member's id, from its own status.
async fn local_member_id(node: &Node, api: &str) -> Result<u64, Status> {
    let (client, url) = node.local_etcd(api).await?;
    let status = client.status(&url).await?;
    Ok(status.header.map(|h| h.member_id).unwrap_or_default())
}

/// Removes the node's own member (retrying while etcd reports itself
/// unhealthy; "member not found" counts as done), then stops etcd and
/// deletes its data, as upstream's `Client.LeaveCluster`.
pub(crate) async fn leave_cluster(node: &Node, shared: &Shared) -> Result<(), Status> {
    let member_id = local_member_id(node, "etcd leave").await?;
    let client = cluster_client(shared).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match client.member_remove(member_id).await {
            Ok(()) => break,
            Err(status) if status.code() == Code::NotFound => break,
            Err(status) if status.code() == Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(status) => {
                return Err(failed(
                    "failed to leave cluster",
                    &Status::new(
                        status.code(),
                        format!("failed to remove member {member_id}: {}", status.message()),
                    ),
                ));
            }
        }
    }
    node.stop_etcd().await;
    let data = node.etcd_data_dir();
    if data.exists() {
        std::fs::remove_dir_all(&data).map_err(|e| {
            Status::unknown(format!(
                "failed to leave cluster: failed to remove {}: {e}",
                data.display()
            ))
        })?;
    }
    Ok(())
}

/// Moves leadership away when this node leads, as upstream's
/// `Client.ForfeitLeadership` (internal/pkg/etcd/etcd.go): the target is the
/// first other member in etcd's member list (ordered by member id), learners
/// included, so a learner listed first makes etcd refuse the move and the
/// call fails. Returns the new leader's name, or "" when this node was not
/// the leader.
pub(crate) async fn forfeit_leadership(node: &Node, shared: &Shared) -> Result<String, Status> {
    let (local, url) = node.local_etcd("etcd forfeit leadership").await?;
    let members = cluster_client(shared).await?.member_list().await?;
    if members.len() == 1 {
        return Err(Status::unknown(
            "failed to forfeit leadership: cannot forfeit leadership, only one member",
        ));
    }
    let status = local.status(&url).await?;
    let own = status.header.map(|h| h.member_id).unwrap_or_default();
    if status.leader != own {
        return Ok(String::new());
    }
    let Some(target) = members.iter().find(|m| m.id != own) else {
        return Ok(String::new());
    };
    match local.move_leader(&url, target.id).await {
        Ok(()) => Ok(target.name.clone()),
        Err(s) if s.message().contains("not leader") => Ok(String::new()),
        Err(s) => Err(failed("failed to forfeit leadership", &s)),
    }
}

/// Streams the local member's snapshot (etcd's bytes with its sha256
/// trailer) re-cut into [`SNAPSHOT_CHUNK`]-byte messages. A bounded channel
/// paces etcd to the client.
pub(crate) async fn snapshot(
    node: &Node,
) -> Result<tokio_stream::wrappers::ReceiverStream<Result<common::Data, Status>>, Status> {
    let (client, url) = node.local_etcd("etcd snapshot").await?;
    let mut upstream = client
        .snapshot(&url)
        .await
        .map_err(|s| failed("failed reading etcd snapshot", &s))?;
    let mut fault = node.take_snapshot_fault();
    let name = node.name.clone();
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        // A read error ends the stream early with status OK: upstream's
        // chunker (pkg/chunker/stream) logs it and closes the channel, and
        // the handler returns nil. The client sees a short snapshot.
        let read_error = |error: &str| {
            tracing::warn!(node = %name, %error, "snapshot read error: ending the stream");
        };
        while let Some(item) = upstream.next().await {
            let blob: Bytes = match item {
                Ok(response) => response.blob,
                Err(status) => return read_error(status.message()),
            };
            let mut offset = 0;
            while offset < blob.len() {
                let mut end = (offset + SNAPSHOT_CHUNK).min(blob.len());
                if let Some(left) = fault.as_mut() {
                    if *left == 0 {
                        return read_error("simulated read error");
                    }
                    end = end.min(offset + *left as usize);
                    *left -= (end - offset) as u64;
                }
                let data = common::Data {
                    metadata: None,
                    bytes: blob.slice(offset..end),
                };
                if tx.send(Ok(data)).await.is_err() {
                    return; // the client went away
                }
                offset = end;
            }
        }
    });
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

fn to_alarms(alarms: Vec<pb::AlarmMember>) -> Vec<machine::EtcdMemberAlarm> {
    alarms
        .into_iter()
        .map(|a| machine::EtcdMemberAlarm {
            member_id: a.member_id,
            alarm: a.alarm,
        })
        .collect()
}

pub(crate) async fn alarm_list(node: &Node) -> Result<Vec<machine::EtcdMemberAlarm>, Status> {
    let (client, _) = node.local_etcd("etcd alarm list").await?;
    let alarms = client
        .alarm_list()
        .await
        .map_err(|s| failed("failed to list etcd alarms", &s))?;
    Ok(to_alarms(alarms))
}

pub(crate) async fn alarm_disarm(node: &Node) -> Result<Vec<machine::EtcdMemberAlarm>, Status> {
    let (client, _) = node.local_etcd("etcd alarm disarm").await?;
    let alarms = client
        .alarm_disarm_all()
        .await
        .map_err(|s| failed("failed to disarm etcd alarm", &s))?;
    Ok(to_alarms(alarms))
}

pub(crate) async fn defragment(node: &Node) -> Result<(), Status> {
    let (client, url) = node.local_etcd("etcd defragment").await?;
    client
        .defragment(&url)
        .await
        .map_err(|s| failed("failed to defragment etcd", &s))
}

pub(crate) async fn status(node: &Node) -> Result<machine::EtcdMemberStatus, Status> {
    let (client, url) = node.local_etcd("etcd status").await?;
    let s = client
        .status(&url)
        .await
        .map_err(|s| failed("failed to query etcd status", &s))?;
    // etcd before 3.6 leaves storageVersion empty; upstream derives it from
    // the server version.
    let storage_version = if s.storage_version.is_empty() {
        let mut parts = s.version.split('.');
        match (parts.next(), parts.next()) {
            (Some(major), Some(minor)) => format!("{major}.{minor}.0"),
            _ => "unknown".to_string(),
        }
    } else {
        s.storage_version
    };
    Ok(machine::EtcdMemberStatus {
        member_id: s.header.map(|h| h.member_id).unwrap_or_default(),
        protocol_version: s.version,
        db_size: s.db_size,
        db_size_in_use: s.db_size_in_use,
        leader: s.leader,
        raft_index: s.raft_index,
        raft_term: s.raft_term,
        raft_applied_index: s.raft_applied_index,
        errors: s.errors,
        is_learner: s.is_learner,
        storage_version,
    })
}

/// Stores an uploaded snapshot for a later Bootstrap with recover_etcd.
pub(crate) async fn recover(
    node: &Node,
    mut chunks: tonic::Streaming<common::Data>,
) -> Result<(), Status> {
    use tokio::io::AsyncWriteExt as _;
    node.check_controlplane("etcd recover")?;
    let path = node.recovery_snapshot_path();
    let mut file = tokio::fs::File::create(&path)
        .await
        .map_err(|e| Status::unknown(format!("error creating etcd recovery snapshot: {e}")))?;
    let result: Result<(), Status> = async {
        while let Some(data) = chunks.next().await {
            file.write_all(&data?.bytes)
                .await
                .map_err(|e| Status::unknown(format!("error writing snapshot: {e}")))?;
        }
        file.sync_all()
            .await
            .map_err(|e| Status::unknown(format!("error fsyncing snapshot: {e}")))
    }
    .await;
    if result.is_err() {
        let _ = tokio::fs::remove_file(&path).await;
    }
    result
}
