//! Upgrades on the simulator: the legacy MachineService.Upgrade, the
//! ImageService.Pull + LifecycleService.Upgrade + Reboot path, and the
//! upgrade faults (old partition, never back).

use talos_test_support as common;

use std::time::Duration;

use common::sim::{SimCluster, wait_for};
use futures::StreamExt as _;
use talos_client::client::{
    ApplyMode, ApplyRequest, ImageNamespace, InstallProgress, RebootMode, UpgradeRequest,
};
use talos_client::{Client, Error};
use talos_sim::UpgradeFault;
use talos_sim::node::Power;

const TARGET: &str = "ghcr.io/siderolabs/installer:v1.14.0";

/// Waits until node `i` answers Version from a boot other than `before`,
/// and returns the tag it reports.
async fn back_from_boot(sim: &SimCluster, i: usize, before: &str) -> String {
    let client = sim.admin().node(sim.ip(i));
    let node = sim.cluster.node(&format!("cp-{i}")).unwrap();
    wait_for(
        "the node back from a new boot",
        Duration::from_secs(60),
        || {
            let (client, node) = (client.clone(), node.clone());
            async move {
                if node.boot_id() == before {
                    return None;
                }
                client.version().await.ok().map(|v| v.tag)
            }
        },
    )
    .await
}

/// Waits until node `i`'s member is a healthy voter again (its etcd
/// answers status without errors and the member list shows it voting).
async fn healthy_voter(
    admin: &Client,
    sim: &SimCluster,
    i: usize,
) -> talos_client::client::MemberId {
    let client = admin.node(sim.ip(i));
    wait_for("a healthy voting member", Duration::from_secs(60), || {
        let client = client.clone();
        async move {
            let status = client.etcd_status().await.ok()?;
            if !status.errors.is_empty() || status.is_learner {
                return None;
            }
            let members = client.etcd_member_list(false).await.ok()?;
            let me = members.iter().find(|m| m.id == status.member_id)?;
            (!me.is_learner).then_some(status.member_id)
        }
    })
    .await
}

#[tokio::test]
async fn legacy_upgrade_boots_the_target_as_the_same_member_with_its_data() {
    let sim = SimCluster::start(3).await;
    let admin = sim.admin();
    let node = sim.cluster.node("cp-2").unwrap();
    let member = healthy_voter(&admin, &sim, 2).await;
    let (boot, data) = (node.boot_id(), node.etcd_data_dir());
    let pid = node.etcd_pid().await.expect("etcd runs");
    assert!(data.join("member").exists());

    let ack = admin
        .node(sim.ip(2))
        .upgrade_legacy(&UpgradeRequest::new(TARGET))
        .await
        .expect("upgrade accepted");
    assert_eq!(ack.ack, "Upgrade request received");
    assert_eq!(ack.actor_id.len(), 36, "a UUID actor id: {}", ack.actor_id);

    assert_eq!(back_from_boot(&sim, 2, &boot).await, "v1.14.0");
    assert_eq!(node.talos_version(), talos_sim::TalosVersion::V1_14_0);
    // The same member, restarted from the same data directory (a 1.13
    // node keeps its etcd data on EPHEMERAL after the upgrade).
    assert_eq!(healthy_voter(&admin, &sim, 2).await, member);
    assert_eq!(node.etcd_data_dir(), data);
    assert_ne!(node.etcd_pid().await, Some(pid), "etcd restarted");
    let members = admin.node(sim.ip(1)).etcd_member_list(false).await.unwrap();
    assert_eq!(members.len(), 3);
    // The other nodes were not touched.
    assert_eq!(
        admin.node(sim.ip(1)).version().await.unwrap().tag,
        "v1.13.9"
    );

    // The upgraded node behaves as 1.14 (v1alpha1_server.go at v1.14.0):
    // REBOOT refused, AUTO applied in place; its 1.13.9 peers keep
    // 1.13.9's answers to the same requests.
    let config = node
        .active_config()
        .replace("certSANs: []", "certSANs: [upgraded.example]");
    let request = |mode| ApplyRequest::new(config.clone(), mode).with_dry_run(true);
    match admin
        .node(sim.ip(2))
        .apply_configuration(request(ApplyMode::Reboot))
        .await
    {
        Err(Error::Unimplemented(f)) => assert_eq!(
            f.message,
            "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead"
        ),
        other => panic!("expected Unimplemented from the upgraded node, got {other:?}"),
    }
    let token = config.replace("token: talos-sim-token", "token: another-token");
    let auto = |ip: String| {
        let (node, token) = (admin.node(ip), token.clone());
        async move {
            node.apply_configuration(ApplyRequest::new(token, ApplyMode::Auto).with_dry_run(true))
                .await
        }
    };
    assert_eq!(auto(sim.ip(2)).await.unwrap().mode, ApplyMode::NoReboot);
    assert_eq!(auto(sim.ip(1)).await.unwrap().mode, ApplyMode::Reboot);
    let peer = admin
        .node(sim.ip(1))
        .apply_configuration(request(ApplyMode::Reboot))
        .await
        .unwrap();
    assert_eq!(peer.mode, ApplyMode::Reboot);
}

#[tokio::test]
async fn pull_then_lifecycle_upgrade_installs_and_the_reboot_boots_it() {
    let sim = SimCluster::start(1).await;
    let target = sim.admin().node(sim.ip(1));
    let node = sim.cluster.node("cp-1").unwrap();
    let boot = node.boot_id();

    let name = target
        .pull_image(TARGET, ImageNamespace::System)
        .await
        .expect("pulled");
    assert!(
        name.starts_with("ghcr.io/siderolabs/installer@sha256:"),
        "pinned to a digest: {name}"
    );
    let progress: Vec<_> = target
        .lifecycle_upgrade(&name, ImageNamespace::System)
        .await
        .expect("upgrade started")
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(progress.last(), Some(&InstallProgress::ExitCode(0)));
    assert!(progress.len() > 1, "installer output streams: {progress:?}");
    // Installed, not running yet: the node did not reboot.
    assert_eq!(target.version().await.unwrap().tag, "v1.13.9");
    assert_eq!(node.boot_id(), boot);

    target.reboot(RebootMode::Default).await.unwrap();
    assert_eq!(back_from_boot(&sim, 1, &boot).await, "v1.14.0");
    healthy_voter(&sim.admin(), &sim, 1).await;
}

#[tokio::test]
async fn upgrade_faults_old_partition_and_never_back() {
    let sim = SimCluster::start(3).await;
    let admin = sim.admin();
    sim.cluster
        .serve_control(&sim.dir.path().join("control.sock"))
        .unwrap();

    // Armed through the control socket: cp-3 comes back on its old version.
    talos_sim::control::send(
        sim.dir.path(),
        &talos_sim::control::Request::FailNextUpgrade {
            node: "cp-3".into(),
            fault: UpgradeFault::BootsOldPartition,
        },
    )
    .await
    .unwrap();
    let node3 = sim.cluster.node("cp-3").unwrap();
    let boot = node3.boot_id();
    admin
        .node(sim.ip(3))
        .upgrade_legacy(&UpgradeRequest::new(TARGET))
        .await
        .unwrap();
    assert_eq!(back_from_boot(&sim, 3, &boot).await, "v1.13.9");
    healthy_voter(&admin, &sim, 3).await;
    // The fault was for one upgrade: the next one lands.
    let boot = node3.boot_id();
    admin
        .node(sim.ip(3))
        .upgrade_legacy(&UpgradeRequest::new(TARGET))
        .await
        .unwrap();
    assert_eq!(back_from_boot(&sim, 3, &boot).await, "v1.14.0");
    healthy_voter(&admin, &sim, 3).await;

    // Armed through the facade: cp-2 goes down and stays down.
    sim.cluster
        .fail_next_upgrade("cp-2", UpgradeFault::NeverComesBack)
        .unwrap();
    let node2 = sim.cluster.node("cp-2").unwrap();
    admin
        .node(sim.ip(2))
        .upgrade_legacy(&UpgradeRequest::new(TARGET))
        .await
        .unwrap();
    wait_for("cp-2 to power off", Duration::from_secs(60), || {
        let node2 = node2.clone();
        async move { (node2.power() == Power::Off).then_some(()) }
    })
    .await;
    assert!(!node2.etcd_running().await);
    assert!(admin.node(sim.ip(2)).version().await.is_err());
    assert_eq!(node2.talos_version(), talos_sim::TalosVersion::V1_13_9);
}

#[tokio::test]
async fn bad_requests_fail_as_upstream_answers_them() {
    let sim = SimCluster::start(1).await;
    let target = sim.admin().node(sim.ip(1));
    let missing = "ghcr.io/siderolabs/installer:v9.9.9";
    match target.upgrade_legacy(&UpgradeRequest::new(missing)).await {
        Err(Error::Status { failure, .. }) => {
            assert!(
                failure.message.contains("error validating installer image"),
                "{failure}"
            );
        }
        other => panic!("expected Unknown, got {other:?}"),
    }
    match target.pull_image(missing, ImageNamespace::System).await {
        Err(Error::NotFound(f)) => assert!(f.message.contains("error pulling image"), "{f}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    // An image that was never pulled cannot be installed.
    let unpulled = "ghcr.io/siderolabs/installer@sha256:00";
    match target
        .lifecycle_upgrade(unpulled, ImageNamespace::System)
        .await
    {
        Err(Error::Status {
            code: tonic::Code::Internal,
            failure,
        }) => assert!(failure.message.contains("upgrade failed"), "{failure}"),
        Err(other) => panic!("expected Internal, got {other:?}"),
        Ok(_) => panic!("an unpulled image was installed"),
    }
    // A reader may neither pull nor upgrade.
    let reader = sim.client_from("talosconfig-reader").node(sim.ip(1));
    assert!(matches!(
        reader.pull_image(TARGET, ImageNamespace::System).await,
        Err(Error::PermissionDenied(_))
    ));
    assert!(matches!(
        reader.upgrade_legacy(&UpgradeRequest::new(TARGET)).await,
        Err(Error::PermissionDenied(_))
    ));
    // Nothing was upgraded.
    assert_eq!(target.version().await.unwrap().tag, "v1.13.9");
}

#[tokio::test]
async fn a_two_member_cluster_refuses_an_unforced_upgrade() {
    let sim = SimCluster::start(2).await;
    let target = sim.admin().node(sim.ip(2));
    healthy_voter(&sim.admin(), &sim, 2).await;
    let err = target
        .upgrade_legacy(&UpgradeRequest::new(TARGET))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("etcd member count(2) is insufficient to maintain quorum"),
        "{err}"
    );
    let boot = sim.cluster.node("cp-2").unwrap().boot_id();
    target
        .upgrade_legacy(&UpgradeRequest::new(TARGET).with_force(true))
        .await
        .expect("forced upgrades skip the check");
    assert_eq!(back_from_boot(&sim, 2, &boot).await, "v1.14.0");
}

/// The type and name of an event, and its action (`sequence upgrade
/// START`), or its stage.
fn describe(event: &talos_client::api::machine::Event) -> String {
    use prost::Message as _;
    use talos_client::api::machine;
    let data = event.data.clone().unwrap_or_default();
    let value = data.value.as_slice();
    match data.type_url.as_str() {
        "talos/runtime/machine.SequenceEvent" => {
            let e = machine::SequenceEvent::decode(value).unwrap();
            format!("sequence {} {}", e.sequence, e.action().as_str_name())
        }
        "talos/runtime/machine.PhaseEvent" => {
            let e = machine::PhaseEvent::decode(value).unwrap();
            format!("phase {} {}", e.phase, e.action().as_str_name())
        }
        "talos/runtime/machine.MachineStatusEvent" => {
            let e = machine::MachineStatusEvent::decode(value).unwrap();
            format!("stage {}", e.stage().as_str_name())
        }
        other => other.to_string(),
    }
}

#[tokio::test]
async fn a_watch_sees_the_upgrade_sequence_under_the_calls_actor() {
    let sim = SimCluster::start(1).await;
    let node = sim.admin().node(sim.ip(1));
    let mut stream = node
        .machine_service()
        .await
        .unwrap()
        .events(talos_client::api::machine::EventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    stream.next().await.unwrap().unwrap();
    let ack = node
        .upgrade_legacy(&UpgradeRequest::new(TARGET))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(Ok(event)) = stream.next().await {
            assert_eq!(event.actor_id, ack.actor_id, "{}", describe(&event));
            seen.push(describe(&event));
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stream ends when the node goes down: {seen:?}"
    );
    for expected in [
        "sequence upgrade START",
        "stage UPGRADING",
        "phase upgrade STOP",
        "phase reboot START",
    ] {
        assert!(
            seen.contains(&expected.to_string()),
            "{expected} in {seen:?}"
        );
    }
}

#[tokio::test]
async fn a_1_14_node_retries_a_missing_image_before_not_found() {
    let unit = Duration::from_millis(40);
    let sim = SimCluster::start_with(1, |cfg| {
        cfg.talos_version = talos_sim::TalosVersion::V1_14_0;
        cfg.timing = talos_sim::TalosTiming {
            image_pull_retry_unit: unit,
            ..talos_sim::TalosTiming::scaled_down(10)
        };
    })
    .await;
    let target = sim.admin().node(sim.ip(1));
    let started = std::time::Instant::now();
    let missing = "ghcr.io/siderolabs/installer:v9.9.9";
    match target.pull_image(missing, ImageNamespace::System).await {
        Err(Error::NotFound(f)) => assert!(f.message.contains("error pulling image"), "{f}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    // 0 + 1 + 3 + 7 + 15 units of backoff went by first.
    assert!(started.elapsed() >= unit * 26, "{:?}", started.elapsed());
    // The upgrade paths themselves are served as on 1.13.9.
    let name = target
        .pull_image(TARGET, ImageNamespace::System)
        .await
        .unwrap();
    assert!(name.contains("@sha256:"), "{name}");
}

#[tokio::test]
async fn a_staged_upgrade_runs_the_stage_sequence_and_boots_the_target() {
    let sim = SimCluster::start(1).await;
    let node = sim.admin().node(sim.ip(1));
    let mut stream = node
        .machine_service()
        .await
        .unwrap()
        .events(talos_client::api::machine::EventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    stream.next().await.unwrap().unwrap();
    let boot = sim.cluster.node("cp-1").unwrap().boot_id();
    node.upgrade_legacy(&UpgradeRequest::new(TARGET).with_stage(true))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(Ok(event)) = stream.next().await {
            seen.push(describe(&event));
        }
    })
    .await;
    assert!(ended.is_ok(), "{seen:?}");
    assert!(
        seen.contains(&"sequence stageUpgrade START".to_string()),
        "{seen:?}"
    );
    // The install happens on the way up, not in the sequence.
    assert!(
        !seen.contains(&"phase upgrade START".to_string()),
        "{seen:?}"
    );
    assert_eq!(back_from_boot(&sim, 1, &boot).await, "v1.14.0");
}
