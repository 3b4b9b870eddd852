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
use super::events::publish;
use super::front;
use super::machined::Machined;
use super::node::{Node, Power};
use super::serve::{serve_http2, tls_incoming};
use crate::api::machine::machine_status_event::MachineStage;

/// How long the API stays up after a sequence's last event, so that
/// watchers receive it before the node goes down.
const EVENTS_GRACE: Duration = Duration::from_millis(200);

/// Serves the node's API on its address until its power goes off.
/// A partitioned node comes up silent; [`heal`] starts its API.
pub(crate) async fn start_front(shared: &Arc<Shared>, node: &Arc<Node>) -> Result<(), SimError> {
    if node.is_partitioned() {
        node.set_power(Power::On);
        return Ok(());
    }
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

/// Cuts the node's API off (see [`super::cluster::Cluster::partition`]):
/// the API stops, and a listener that never accepts takes its address, so
/// a connection completes in the kernel and then nothing answers, as when
/// packets are dropped on the way.
pub(crate) async fn partition(node: &Node) -> Result<bool, SimError> {
    if node.power() != Power::On || node.is_partitioned() {
        return Ok(false);
    }
    node.set_front(None);
    let listener = bind_with_retry(&node.api_addr()).await?;
    node.set_blackhole(Some(listener));
    Ok(true)
}

/// Ends a partition: the silent listener goes and the API serves again.
pub(crate) async fn heal(shared: &Arc<Shared>, node: &Arc<Node>) -> Result<bool, SimError> {
    if !node.is_partitioned() {
        return Ok(false);
    }
    node.set_blackhole(None);
    start_front(shared, node).await?;
    Ok(true)
}

/// Reboots a node: down for the boot delay, then up with its persisted
/// (or staged) configuration. The events are those of upstream's reboot
/// sequence (runtime/v1alpha1/v1alpha1_sequencer.go, Reboot), under the
/// call's actor id.
pub(crate) async fn reboot(shared: &Arc<Shared>, node: &Arc<Node>, actor: &str) {
    let Some(_sequence) = lock_sequence(node, "reboot") else {
        return;
    };
    let log = &node.runtime_events;
    publish::sequence(log, "reboot", true, "", actor);
    publish::stage(log, MachineStage::Rebooting, false, actor);
    for (phase, task) in [
        ("cleanup", "stopAllPods"),
        ("dbus", "stopDBus"),
        ("stopEverything", "stopAllServices"),
        ("reboot", "reboot"),
    ] {
        publish::phase_with_task(log, phase, task, actor);
    }
    tokio::time::sleep(EVENTS_GRACE).await;
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
    // machined's event log and the kernel's ring buffer live in memory.
    node.new_boot();
    node.runtime_events.clear();
    *node.kmsg.lock().expect("kmsg lock") = Vec::new();
    super::events::kernel_boot_messages(node);
    let log = &node.runtime_events;
    publish::sequence(log, "boot", true, "", "");
    publish::stage(log, MachineStage::Booting, false, "");
    if node.is_control_plane() {
        if node.etcd_data_dir().join("member").exists() {
            if let Err(e) = node.restart_etcd().await {
                tracing::warn!(node = %node.name, error = %e, "etcd did not start after boot");
            }
        } else {
            // The etcd service joins in the background while the API
            // serves (it waits, printing its bootstrap hint, upstream).
            let (shared, node) = (shared.clone(), node.clone());
            tokio::spawn(async move {
                if let Err(e) = join_etcd(&shared, &node, true).await {
                    tracing::warn!(node = %node.name, error = %e, "etcd did not join after boot");
                }
            });
        }
    }
    if let Err(e) = start_front(shared, node).await {
        tracing::warn!(node = %node.name, error = %e, "node API did not start after boot");
    }
    publish::sequence(log, "boot", false, "", "");
    let stage = if node.is_configured() {
        MachineStage::Running
    } else {
        MachineStage::Maintenance
    };
    publish::stage(log, stage, true, "");
}

/// The reset sequence, after the call has been answered: leave etcd when
/// graceful (abort if that fails), stop, wipe, then power off or reboot.
pub(crate) async fn reset(
    shared: &Arc<Shared>,
    node: &Arc<Node>,
    graceful: bool,
    reboot: bool,
    labels: &[String],
    by_spec: bool,
    actor: &str,
) {
    let Some(_sequence) = lock_sequence(node, "reset") else {
        return;
    };
    let log = &node.runtime_events;
    publish::sequence(log, "reset", true, "", actor);
    publish::stage(log, MachineStage::Resetting, false, actor);
    publish::phase_with_task(log, "cleanup", "stopAllPods", actor);
    publish::phase_with_task(log, "dbus", "stopDBus", actor);
    if graceful {
        publish::phase(log, "leave", true, actor);
        publish::task(log, "leaveEtcd", true, actor);
        if node.etcd_running().await
            && let Err(status) = super::machined_etcd::leave_cluster(node, shared).await
        {
            tracing::warn!(node = %node.name, error = %status.message(), "reset aborted: leaving etcd failed");
            publish::sequence(log, "reset", false, status.message(), actor);
            publish::stage(log, MachineStage::Running, true, actor);
            return;
        }
        publish::task(log, "leaveEtcd", false, actor);
        publish::phase(log, "leave", false, actor);
    }
    // The phases run in upstream's order (runtime/v1alpha1/
    // v1alpha1_sequencer.go, Reset); the API goes away with them, so
    // what remains is published first.
    publish::phase_with_task(log, "preReset", "sendResetSignal", actor);
    publish::phase_with_task(log, "stopEverything", "stopAllServices", actor);
    publish::phase_with_task(log, "forceCleanup", "forceCleanup", actor);
    if !by_spec {
        publish::phase_with_task(log, "reset", "resetSystemDisk", actor);
    } else {
        publish::phase_with_task(log, "resetSpec", "resetSystemDiskSpec", actor);
    }
    if reboot {
        publish::phase_with_task(log, "reboot", "reboot", actor);
    } else {
        publish::phase_with_task(log, "shutdown", "shutdown", actor);
    }
    // The API serves through the sequence: its watchers get the events.
    tokio::time::sleep(EVENTS_GRACE).await;
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
/// promotes it in the background, as upstream's etcd service does
/// (internal/app/machined/pkg/system/services/etcd.go): member add is
/// retried on any error every `join_interval` plus jitter for up to
/// `join_limit` (3 s, 1 s and `EtcdJoinTimeout`, 30 min, upstream), so a
/// second learner waits for the first to be promoted; promotion starts
/// before etcd does (so its first attempt fails) and is retried every
/// `promote_interval` plus jitter.
/// With `after_boot`, the join gives up when the node powers off.
pub(crate) async fn join_etcd(
    shared: &Arc<Shared>,
    node: &Arc<Node>,
    after_boot: bool,
) -> Result<(), SimError> {
    let timing = node.timing;
    let deadline = Instant::now() + timing.join_limit;
    let (client, initial_cluster, member_id) = loop {
        // Bootstrapped meanwhile, or gone down: this join has no purpose.
        if node.etcd_running().await {
            return Ok(());
        }
        if after_boot && node.power() == Power::Off {
            return Err(SimError::Refused("the node powered off".into()));
        }
        let attempt = tokio::time::timeout(
            timing.join_attempt_timeout,
            add_member(shared, node, Instant::now() + timing.join_attempt_timeout),
        )
        .await
        .unwrap_or_else(|_| Err("context deadline exceeded".into()));
        match attempt {
            Ok(joined) => break joined,
            Err(e) => {
                let pause = super::jittered(timing.join_interval, timing.join_jitter);
                if Instant::now() + pause >= deadline {
                    return Err(SimError::Refused(format!(
                        "failed to build cluster arguments: {e}"
                    )));
                }
                tracing::info!(node = %node.name, error = %e, "etcd join attempt failed; retrying");
                tokio::time::sleep(pause).await;
            }
        }
    };
    tokio::spawn(promote(client, member_id, node.name.clone(), timing));
    node.start_etcd(initial_cluster, ClusterState::Existing)
        .await
}

/// One attempt of upstream's addMember: remove a member that carries the
/// joining node's name (left behind by a reset without a leave), add the
/// node as a learner, and build the initial cluster from the new list.
/// Each membership change is a single call within the attempt's deadline.
async fn add_member(
    shared: &Arc<Shared>,
    node: &Arc<Node>,
    deadline: Instant,
) -> Result<(EtcdClient, String, u64), String> {
    let left = || Some(deadline.saturating_duration_since(Instant::now()));
    let peers: Vec<String> = shared
        .nodes()
        .iter()
        .filter(|n| n.name != node.name && n.is_control_plane() && n.power() == Power::On)
        .map(|n| n.etcd_client_url())
        .collect();
    if peers.is_empty() {
        return Err("no running etcd member to join".into());
    }
    let client = EtcdClient::connect(&peers)
        .await
        .map_err(|s| s.message().to_string())?;
    let list = client
        .member_list()
        .await
        .map_err(|s| format!("error getting etcd member list: {}", s.message()))?;
    for stale in list.iter().filter(|m| m.name == node.name) {
        client
            .member_remove_within(stale.id, left())
            .await
            .map_err(|s| format!("error removing self from the member list: {}", s.message()))?;
    }
    let member = client
        .member_add_within(&node.etcd_peer_url(), true, left())
        .await
        .map_err(|s| format!("error adding member: {}", s.message()))?;
    let initial_cluster = client
        .member_list()
        .await
        .map_err(|s| format!("error getting second etcd member list: {}", s.message()))?
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
    Ok((client, initial_cluster, member.id))
}

/// Promotes a learner as upstream's promoteMember: an attempt at once, then
/// one every `promote_interval` plus jitter, for up to `promote_limit`;
/// each attempt a single MemberPromote call within
/// `promote_attempt_timeout`.
async fn promote(client: EtcdClient, member_id: u64, name: String, timing: super::TalosTiming) {
    let deadline = Instant::now() + timing.promote_limit;
    loop {
        match client
            .member_promote_within(member_id, Some(timing.promote_attempt_timeout))
            .await
        {
            Ok(()) => {
                tracing::info!(node = %name, "learner promoted to voting member");
                return;
            }
            Err(s) if s.message().contains("not a learner") => return,
            Err(s) if s.message().contains("member not found") => return,
            Err(s) => {
                tracing::info!(node = %name, error = %s.message(), "promotion attempt failed")
            }
        }
        let pause = super::jittered(timing.promote_interval, timing.promote_jitter);
        if Instant::now() + pause >= deadline {
            tracing::warn!(node = %name, "failed promoting member: timeout");
            return;
        }
        tokio::time::sleep(pause).await;
    }
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

/// Takes the sequencer lock, or, while another sequence holds it, refuses
/// `sequence` as upstream's controller does after the call was answered
/// (runtime/v1alpha1/v1alpha1_controller.go, Run): a NOOP sequence event
/// with a LOCKED error, and a log line; nothing else happens.
fn lock_sequence<'a>(node: &'a Node, sequence: &str) -> Option<tokio::sync::MutexGuard<'a, ()>> {
    match node.sequence_lock.try_lock() {
        Ok(guard) => Some(guard),
        Err(_) => {
            tracing::warn!(node = %node.name, %sequence, "sequence not started: locked");
            let event = crate::api::machine::SequenceEvent {
                sequence: sequence.to_string(),
                action: crate::api::machine::sequence_event::Action::Noop as i32,
                error: Some(crate::api::common::Error {
                    code: crate::api::common::Code::Locked as i32,
                    message: "sequence not started: locked".to_string(),
                    details: Vec::new(),
                }),
            };
            node.runtime_events.publish("SequenceEvent", &event, "");
            None
        }
    }
}

/// The events and kernel messages of a node that has just booted, for a
/// node started with the cluster or added to it.
pub(crate) fn record_boot(node: &Node) {
    super::events::kernel_boot_messages(node);
    let log = &node.runtime_events;
    publish::sequence(log, "boot", true, "", "");
    publish::stage(log, MachineStage::Booting, false, "");
    publish::sequence(log, "boot", false, "", "");
    let stage = if node.is_configured() {
        MachineStage::Running
    } else {
        MachineStage::Maintenance
    };
    publish::stage(log, stage, true, "");
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
