//! A simulated node's lifecycle below its API: powering off, the reboot
//! and reset sequences, booting and joining etcd. The node's supervisor
//! (`crate::supervisor`) runs these and serves the API; nothing here
//! reaches up to the API's handlers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::SimError;
use super::etcd_client::EtcdClient;
use super::etcd_process::ClusterState;
use super::events::publish;
use super::ledger::{Down, MemberChange};
use super::node::{Node, Power};
use super::shared::Shared;
use crate::api::machine::machine_status_event::MachineStage;

/// How long the API stays up after a sequence's last event, so that
/// watchers receive it before the node goes down.
const EVENTS_GRACE: Duration = Duration::from_millis(200);

/// Powers a node off: its API stops answering (open connections break)
/// and etcd stops, keeping its data.
pub(crate) async fn power_off(node: &Node) {
    power_off_as(node, Down::PowerOff).await
}

/// [`power_off`], recorded in the ledger as `how` (a shutdown, a pulled
/// plug).
pub(crate) async fn power_off_as(node: &Node, how: Down) {
    if node.power() != Power::Off {
        node.ledger.down(&node.name, how, &[]);
    }
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

/// The reboot sequence up to the boot: the node goes down for the boot
/// delay and takes its persisted (or staged) configuration; the caller
/// holds the sequence lock and boots it. The events are those of
/// upstream's reboot sequence (runtime/v1alpha1/v1alpha1_sequencer.go,
/// Reboot), under the call's actor id.
pub(crate) async fn reboot(shared: &Arc<Shared>, node: &Arc<Node>, actor: &str) {
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
    go_down(shared, node, Down::Reboot).await;
}

/// The end of a reboot-like sequence: the API serves its last events, then
/// the node goes down for the boot delay and takes its persisted (or
/// staged) configuration.
async fn go_down(shared: &Arc<Shared>, node: &Arc<Node>, how: Down) {
    tokio::time::sleep(EVENTS_GRACE).await;
    node.ledger.down(&node.name, how, &[]);
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
}

/// The legacy upgrade's sequence (runtime/v1alpha1/v1alpha1_sequencer.go
/// upstream: Upgrade, or StageUpgrade with `stage`, which installs on the
/// way up instead): its phases and tasks under the call's actor id, the
/// install of `target` on the other boot partition, then down for the
/// boot delay like a reboot. etcd stops with the node and keeps its data:
/// the node comes back as the same member.
pub(crate) async fn upgrade(
    shared: &Arc<Shared>,
    node: &Arc<Node>,
    target: super::TalosVersion,
    stage: bool,
    actor: &str,
) {
    let log = &node.runtime_events;
    let sequence = if stage { "stageUpgrade" } else { "upgrade" };
    publish::sequence(log, sequence, true, "", actor);
    publish::stage(log, MachineStage::Upgrading, false, actor);
    let mut phases = Vec::new();
    if !stage {
        phases.push(("drain", "cordonAndDrainNode"));
    }
    phases.extend([
        ("cleanup", "stopAllPods"),
        ("dbus", "stopDBus"),
        ("stopServices", "stopServicesEphemeral"),
        (if stage { "umount" } else { "unmount" }, "unmountPodMounts"),
        ("unmountBind", "unmountSystemDiskBindMounts"),
        ("unmountSystem", "unmountEphemeralPartition"),
        ("volumeFinalize", "teardownVolumeLifecycle"),
    ]);
    if !stage {
        phases.extend([("upgrade", "upgrade"), ("meta", "reloadMeta")]);
    }
    phases.extend([
        ("kexec", "kexecPrepare"),
        ("stopEverything", "stopAllServices"),
        ("reboot", "reboot"),
    ]);
    for (phase, task) in phases {
        publish::phase_with_task(log, phase, task, actor);
    }
    node.upgrade.install(target);
    go_down(shared, node, Down::Upgrade).await;
}

/// At boot, after going down: the boot loader picks the partition an
/// upgrade installed, if any, unless a fault armed for the upgrade says
/// otherwise. False when the node does not come back at all (it stays off).
pub(crate) fn switch_partition(node: &Node) -> bool {
    let Some(target) = node.upgrade.take_installed() else {
        return true;
    };
    match node.upgrade.take_fault() {
        Some(super::upgrade_state::UpgradeFault::NeverComesBack) => {
            tracing::info!(node = %node.name, "upgrade fault: the node never comes back");
            node.set_power(Power::Off);
            false
        }
        Some(super::upgrade_state::UpgradeFault::BootsOldPartition) => {
            tracing::info!(node = %node.name, "upgrade fault: the old partition boots");
            true
        }
        _ => {
            node.set_talos_version(target);
            true
        }
    }
}

/// The boot up to serving the API: etcd from its data (or joining the
/// cluster anew when its data was wiped but it still has a configuration).
/// The supervisor then starts the API and calls [`boot_end`].
pub(crate) async fn boot_begin(shared: &Arc<Shared>, node: &Arc<Node>) {
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
            let cause = crate::ledger::current_cause();
            tokio::spawn(crate::ledger::with_cause(cause, async move {
                if let Err(e) = join_etcd(&shared, &node, true).await {
                    tracing::warn!(node = %node.name, error = %e, "etcd did not join after boot");
                }
            }));
        }
    }
}

/// The boot's last events, once the API serves.
pub(crate) fn boot_end(node: &Node) {
    let log = &node.runtime_events;
    publish::sequence(log, "boot", false, "", "");
    let stage = if node.is_configured() {
        MachineStage::Running
    } else {
        MachineStage::Maintenance
    };
    publish::stage(log, stage, true, "");
}

/// The reset sequence, after the call has been answered: leave etcd when
/// graceful (abort if that fails), stop, wipe, then power off or (true)
/// wait the boot delay for the caller, who holds the sequence lock, to
/// boot the node.
pub(crate) async fn reset(
    shared: &Arc<Shared>,
    node: &Arc<Node>,
    graceful: bool,
    reboot: bool,
    labels: &[String],
    by_spec: bool,
    actor: &str,
) -> bool {
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
            return false;
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
    node.ledger.down(&node.name, Down::Reset, labels);
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
    } else {
        node.set_power(Power::Off);
    }
    reboot
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
    tokio::spawn(crate::ledger::with_cause(
        crate::ledger::Cause::simulator("learner promotion"),
        promote(client, member_id, node.clone(), timing),
    ));
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
    let client = EtcdClient::connect(&peers, &shared.etcd_pki)
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
        node.ledger
            .member(MemberChange::Removed, stale.id, &node.name, false);
    }
    let member = client
        .member_add_within(&node.etcd_peer_url(), true, left())
        .await
        .map_err(|s| format!("error adding member: {}", s.message()))?;
    node.ledger
        .member(MemberChange::Added, member.id, &node.name, true);
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
async fn promote(client: EtcdClient, member_id: u64, node: Arc<Node>, timing: super::TalosTiming) {
    let name = node.name.clone();
    let deadline = Instant::now() + timing.promote_limit;
    loop {
        match client
            .member_promote_within(member_id, Some(timing.promote_attempt_timeout))
            .await
        {
            Ok(()) => {
                tracing::info!(node = %name, "learner promoted to voting member");
                node.ledger
                    .member(MemberChange::Promoted, member_id, &name, false);
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

/// Takes the sequencer lock, or, while another sequence holds it, refuses
/// `sequence` as upstream's controller does after the call was answered
/// (runtime/v1alpha1/v1alpha1_controller.go, Run): a NOOP sequence event
/// with a LOCKED error, and a log line; nothing else happens.
pub(crate) fn lock_sequence<'a>(
    node: &'a Node,
    sequence: &str,
) -> Option<tokio::sync::MutexGuard<'a, ()>> {
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
    node.kubelet.start();
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
pub(crate) async fn bind_with_retry(addr: &str) -> Result<tokio::net::TcpListener, SimError> {
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
