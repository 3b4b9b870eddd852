//! The etcd calls of a simulated node, against its real etcd member. Each
//! mirrors the handler of the same name in siderolabs/talos
//! internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go and the
//! helpers in internal/pkg/etcd/etcd.go.
//!
//! Errors reach the client as they leave a Go handler (see
//! [`super::go_errors`]): an etcd server error the Go client knows becomes
//! Unknown with its bare description; any other error of the etcd client
//! (a transport failure) keeps its gRPC code, its text prefixed by the
//! handler's `fmt.Errorf("...: %w")` context where there is one.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use tonic::{Code, Status};

use super::etcd_client::EtcdClient;
use super::go_errors::{EtcdError, etcd_returned, etcd_wrapped};
use super::ledger::MemberChange;
use super::node::Node;
use super::shared::Shared;
use crate::api::{common, etcdserverpb as pb, machine};

/// Talos streams snapshots in chunks of this size (pkg/chunker/stream).
pub(crate) const SNAPSHOT_CHUNK: usize = 1024;

/// A client for every configured control-plane node's etcd, as upstream's
/// `etcd.NewClientFromControlPlaneIPs`.
async fn cluster_client(shared: &Shared) -> Result<EtcdClient, Status> {
    EtcdClient::connect(&shared.control_plane_etcd_urls(), &shared.etcd_pki).await
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
    // Returned as is by the handler.
    let members = client.member_list().await.map_err(etcd_returned)?;
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
    // One call; only the caller's deadline ends it (v1alpha1_server.go
    // passes the request's context).
    let Err(status) = cluster_client(shared)
        .await?
        .member_remove_within(id, None)
        .await
    else {
        let name = node.ledger.member_name(id).unwrap_or_default();
        node.ledger.member(MemberChange::Removed, id, &name, false);
        return Ok(());
    };
    // RemoveMemberByMemberID wraps the error ("failed to remove member
    // %d"); the handler maps "member not found" to NotFound and wraps
    // anything else once more.
    let error = EtcdError::from_status(&status);
    if error.is(MEMBER_NOT_FOUND) {
        return Err(Status::not_found(format!(
            "failed to remove member {id}: {}",
            error.text()
        )));
    }
    Err(error.wrapped(&format!(
        "failed to remove member: failed to remove member {id}"
    )))
}

const MEMBER_NOT_FOUND: &str = "etcdserver: member not found";

/// Waits for the local etcd member to be running and healthy and returns
/// its id, as upstream's GetLocalMemberID (internal/pkg/etcd/local.go)
/// waits for the etcd.Member resource, which exists only while the etcd
/// service runs and its health check (a linearizable read, which a learner
/// refuses) last passed. After `local_member_wait` (3 min upstream) it
/// fails with the context's error: DeadlineExceeded.
async fn wait_local_member_id(node: &Node, shared: &Shared) -> Result<u64, Status> {
    let deadline = Instant::now() + shared.cfg.timing.local_member_wait;
    loop {
        if node.etcd_running().await && node.etcd_health.is_healthy() {
            let url = node.etcd_client_url();
            if let Ok(client) =
                EtcdClient::connect(std::slice::from_ref(&url), &shared.etcd_pki).await
                && let Ok(status) = client.status(&url).await
                && let Some(header) = status.header
            {
                return Ok(header.member_id);
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Status::deadline_exceeded(
                "failed to get local etcd member ID: context deadline exceeded",
            ));
        }
        tokio::time::sleep((deadline - now).min(Duration::from_millis(100))).await;
    }
}

/// Errors collected by a retry, as siderolabs/go-retry's ErrorSet: each
/// distinct text once, in order.
#[derive(Default)]
struct ErrorSet {
    texts: Vec<String>,
    /// The first error that carries a gRPC status (what grpc-go finds
    /// through `errors.As`), else the set reaches the client as Unknown.
    status_code: Option<Code>,
}

impl ErrorSet {
    fn push(&mut self, text: String, code: Option<Code>) {
        if !self.texts.contains(&text) {
            self.texts.push(text);
            if self.status_code.is_none() {
                self.status_code = code;
            }
        }
    }

    fn into_status(self, context: &str) -> Status {
        let mut message = format!("{context}: {} error(s) occurred:", self.texts.len());
        for text in &self.texts {
            message.push_str("\n\t");
            message.push_str(text);
        }
        Status::new(self.status_code.unwrap_or(Code::Unknown), message)
    }
}

/// Removes the local member, retrying as upstream's `Client.LeaveCluster`
/// (internal/pkg/etcd/etcd.go) does: only "unhealthy cluster" and "server
/// stopped" are retried, every `leave_retry_interval` until
/// `leave_retry_limit` (10 s and 5 min upstream); "member not found" counts
/// as done; anything else ends the retry at once. The errors come back as
/// go-retry's set ("N error(s) occurred:", "timeout" when time ran out).
async fn remove_self(client: &EtcdClient, member_id: u64, shared: &Shared) -> Result<(), ErrorSet> {
    let timing = shared.cfg.timing;
    let deadline = Instant::now() + timing.leave_retry_limit;
    let mut errors = ErrorSet::default();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt =
            tokio::time::timeout(left, client.member_remove_within(member_id, None)).await;
        let status = match attempt {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(status)) => status,
            Err(_) => {
                errors.push("timeout".into(), None);
                return Err(errors);
            }
        };
        let error = EtcdError::from_status(&status);
        if error.is(MEMBER_NOT_FOUND) {
            return Ok(());
        }
        let retry = error.is("etcdserver: unhealthy cluster")
            || error.is("etcdserver: server stopped")
            || matches!(error, EtcdError::Deadline);
        let (text, code) = match &error {
            // go-retry records a deadline inside an attempt as "timeout".
            EtcdError::Deadline => ("timeout".to_string(), None),
            EtcdError::Server(_) => (
                format!("failed to remove member {member_id}: {}", error.text()),
                None,
            ),
            EtcdError::Transport(s) => (
                format!("failed to remove member {member_id}: {}", error.text()),
                Some(s.code()),
            ),
        };
        errors.push(text, code);
        if !retry {
            return Err(errors);
        }
        let now = Instant::now();
        if now + timing.leave_retry_interval >= deadline {
            tokio::time::sleep(deadline.saturating_duration_since(now)).await;
            errors.push("timeout".into(), None);
            return Err(errors);
        }
        tokio::time::sleep(timing.leave_retry_interval).await;
    }
}

/// Removes the node's own member, then stops etcd and deletes its data, as
/// upstream's EtcdLeaveCluster handler and `Client.LeaveCluster`. When etcd
/// does not run here, the call waits for it as upstream does (see
/// [`wait_local_member_id`]) and fails with DeadlineExceeded.
pub(crate) async fn leave_cluster(node: &Node, shared: &Shared) -> Result<(), Status> {
    const CONTEXT: &str = "failed to leave cluster";
    node.check_controlplane("etcd leave")?;
    let client = cluster_client(shared).await?;
    let member_id = wait_local_member_id(node, shared)
        .await
        .map_err(|s| Status::new(s.code(), format!("{CONTEXT}: {}", s.message())))?;
    remove_self(&client, member_id, shared)
        .await
        .map_err(|errors| errors.into_status(CONTEXT))?;
    node.ledger
        .member(MemberChange::Removed, member_id, &node.name, false);
    node.stop_etcd().await;
    let data = node.etcd_data_dir();
    if data.exists() {
        std::fs::remove_dir_all(&data).map_err(|e| {
            Status::unknown(format!(
                "{CONTEXT}: failed to remove {}: {e}",
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
    const CONTEXT: &str = "failed to forfeit leadership";
    node.check_controlplane("etcd forfeit leadership")?;
    let client = cluster_client(shared).await?;
    let own = wait_local_member_id(node, shared).await?;
    let members = client.member_list().await.map_err(etcd_wrapped(
        "failed to forfeit leadership: failed to list etcd members",
    ))?;
    if members.len() == 1 {
        return Err(Status::unknown(format!(
            "{CONTEXT}: cannot forfeit leadership, only one member"
        )));
    }
    let Some(me) = members.iter().find(|m| m.id == own) else {
        return Err(Status::unknown(format!(
            "{CONTEXT}: failed to find \"{own:016x}\" in list of etcd members"
        )));
    };
    let Some(url) = me.client_ur_ls.first() else {
        return Ok(String::new());
    };
    let status = client.status(url).await.map_err(etcd_wrapped(CONTEXT))?;
    if status.leader != own {
        return Ok(String::new());
    }
    let Some(target) = members.iter().find(|m| m.id != own) else {
        return Ok(String::new());
    };
    match client.move_leader(url, target.id).await {
        Ok(()) => Ok(target.name.clone()),
        Err(s) if EtcdError::from_status(&s).is("etcdserver: not leader") => Ok(String::new()),
        Err(s) => Err(etcd_wrapped(CONTEXT)(s)),
    }
}

/// Streams the local member's snapshot (etcd's bytes with its sha256
/// trailer) re-cut into [`SNAPSHOT_CHUNK`]-byte messages, read from etcd
/// as the client takes them: HTTP/2 flow control paces etcd to the client,
/// with no task or channel in between.
pub(crate) async fn snapshot(
    node: &Node,
) -> Result<impl futures::Stream<Item = Result<common::Data, Status>> + Send + 'static, Status> {
    let (client, url) = node.local_etcd("etcd snapshot").await?;
    // The etcd Go client opens the stream without waiting for an answer and
    // reads etcd's refusal later, as a read error (client/v3 maintenance.go,
    // Snapshot): the chunker ends the stream and the handler returns OK
    // with no data (v1alpha1_server.go, EtcdSnapshot). Only a failure to
    // reach etcd at all fails the call.
    let (upstream, refused) = match client.snapshot(&url).await {
        Ok(upstream) => (Some(upstream), None),
        Err(status) if status.code() != tonic::Code::Unavailable => {
            (None, Some(EtcdError::from_status(&status).text()))
        }
        Err(status) => return Err(etcd_wrapped("failed reading etcd snapshot")(status)),
    };
    let mut relay = Relay {
        upstream,
        fault: node.take_snapshot_fault(),
        node: node.name.clone(),
        ended: false,
    };
    if let Some(error) = refused {
        relay.read_error(&error);
    }
    let batches = futures::stream::unfold(relay, |mut relay| async move {
        let messages = relay.next().await?;
        Some((messages, relay))
    });
    Ok(batches.flat_map(|messages| futures::stream::iter(messages.into_iter().map(Ok))))
}

/// etcd's snapshot stream, cut into Talos's messages.
struct Relay {
    /// etcd's stream; none when etcd refused it.
    upstream: Option<tonic::Streaming<pb::SnapshotResponse>>,
    /// Bytes left before a simulated read error.
    fault: Option<u64>,
    node: String,
    ended: bool,
}

impl Relay {
    /// The messages of etcd's next chunk; `None` at the end. A read error
    /// ends the stream early with status OK: upstream's chunker
    /// (pkg/chunker/stream) logs it and closes its channel, and the handler
    /// returns nil. The client sees a short snapshot.
    async fn next(&mut self) -> Option<Vec<common::Data>> {
        if self.ended {
            return None;
        }
        let blob: Bytes = match self.upstream.as_mut()?.next().await? {
            Ok(response) => response.blob,
            Err(status) => {
                self.read_error(status.message());
                return None;
            }
        };
        let mut messages = Vec::with_capacity(blob.len().div_ceil(SNAPSHOT_CHUNK));
        let mut offset = 0;
        while offset < blob.len() {
            let mut end = (offset + SNAPSHOT_CHUNK).min(blob.len());
            if let Some(left) = self.fault.as_mut() {
                if *left == 0 {
                    // What was cut before the error still goes out.
                    self.read_error("simulated read error");
                    break;
                }
                end = end.min(offset + *left as usize);
                *left -= (end - offset) as u64;
            }
            messages.push(common::Data {
                metadata: None,
                bytes: blob.slice(offset..end),
            });
            offset = end;
        }
        Some(messages)
    }

    fn read_error(&mut self, error: &str) {
        tracing::warn!(node = %self.node, %error, "snapshot read error: ending the stream");
        self.ended = true;
    }
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
        .map_err(etcd_wrapped("failed to list etcd alarms"))?;
    Ok(to_alarms(alarms))
}

pub(crate) async fn alarm_disarm(node: &Node) -> Result<Vec<machine::EtcdMemberAlarm>, Status> {
    let (client, _) = node.local_etcd("etcd alarm disarm").await?;
    let alarms = client
        .alarm_disarm_all()
        .await
        .map_err(etcd_wrapped("failed to disarm etcd alarm"))?;
    Ok(to_alarms(alarms))
}

pub(crate) async fn defragment(node: &Node) -> Result<(), Status> {
    let (client, url) = node.local_etcd("etcd defragment").await?;
    client
        .defragment(&url)
        .await
        .map_err(etcd_wrapped("failed to defragment etcd"))
}

pub(crate) async fn status(node: &Node) -> Result<machine::EtcdMemberStatus, Status> {
    let (client, url) = node.local_etcd("etcd status").await?;
    let s = client
        .status(&url)
        .await
        .map_err(etcd_wrapped("failed to query etcd status"))?;
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
        let target = crate::etcd_process::RestoreTarget {
            data_dir: &data_dir,
            name: &node.name,
            peer_url: &peer_url,
        };
        let binaries = node
            .etcd_binaries()
            .map_err(|e| Status::unknown(format!("failed to recover etcd: {e}")))?;
        crate::etcd_process::restore_snapshot(
            &binaries,
            &snapshot,
            target,
            &initial_cluster,
            skip_hash_check,
        )
        .await
        .map_err(|e| Status::unknown(format!("failed to recover etcd: {e}")))?;
    }
    node.start_etcd(initial_cluster, crate::etcd_process::ClusterState::New)
        .await
        .map_err(|e| Status::unknown(e.to_string()))?;
    // A cluster of this one member now: the ledger learns its id.
    let (client, url) = node.local_etcd_now("bootstrap").await?;
    if let Ok(status) = client.status(&url).await
        && let Some(header) = status.header
    {
        node.ledger.member(
            MemberChange::Bootstrapped,
            header.member_id,
            &node.name,
            false,
        );
    }
    Ok(())
}
