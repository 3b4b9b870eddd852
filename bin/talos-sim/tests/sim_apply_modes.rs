//! Which changes a simulated node applies in place and which need a reboot,
//! as Talos 1.13.9 decides it (CanApplyImmediate), and the dry-run diff of a
//! reordered file.

use talos_test_support as common;

use std::time::Duration;

use common::sim::{SimCluster, wait_for};
use talos_client::Error;
use talos_client::client::{ApplyMode, ApplyRequest};
use talos_sim::node::Power;

fn base(sim: &SimCluster) -> String {
    std::fs::read_to_string(sim.dir.path().join("controlplane.yaml")).unwrap()
}

/// A change outside the sections that apply in place.
fn token_change(sim: &SimCluster) -> String {
    base(sim).replace("token: talos-sim-token", "token: rotated-token")
}

#[tokio::test]
async fn no_reboot_and_try_refuse_a_change_that_needs_a_reboot() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let node = sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    for mode in [ApplyMode::NoReboot, ApplyMode::Try] {
        for dry_run in [true, false] {
            let request = ApplyRequest::new(token_change(&sim), mode).with_dry_run(dry_run);
            match client.apply_configuration(request).await {
                Err(Error::InvalidArgument(status)) => {
                    let message = &status.message;
                    assert!(
                        message.starts_with(
                            "this config change can't be applied in immediate mode\ndiff:\n--- a\n+++ b\n@@ -"
                        ),
                        "{message}"
                    );
                    assert!(
                        message.contains("-  token: talos-sim-token\n+  token: rotated-token\n"),
                        "{message}"
                    );
                }
                other => {
                    panic!("{mode} (dry run {dry_run}): expected InvalidArgument, got {other:?}")
                }
            }
        }
    }
    assert_eq!(node.active_config(), before);
    assert!(!node.rollback_pending());
}

#[tokio::test]
async fn auto_dry_run_reports_reboot_and_changes_nothing() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let result = client
        .apply_configuration(
            ApplyRequest::new(token_change(&sim), ApplyMode::Auto).with_dry_run(true),
        )
        .await
        .unwrap();
    assert_eq!(result.mode, ApplyMode::Reboot);
    // Upstream appends the reason only to a real apply's details.
    assert!(
        result.mode_details.starts_with(
            "Dry run summary:\nApplied configuration with a reboot (skipped in dry-run).\nConfig diff:\n\n--- a\n+++ b\n"
        ),
        "{}",
        result.mode_details
    );
    assert_eq!(sim.cluster.node("cp-1").unwrap().power(), Power::On);
}

#[tokio::test]
async fn auto_reboots_for_a_change_that_needs_it_and_keeps_the_member() {
    let sim = SimCluster::start(3).await;
    let client = sim.admin();
    let members_before = client
        .node(sim.ip(2))
        .etcd_member_list(false)
        .await
        .unwrap();
    let node = sim.cluster.node("cp-1").unwrap();
    let result = client
        .node(sim.ip(1))
        .apply_configuration(ApplyRequest::new(token_change(&sim), ApplyMode::Auto))
        .await
        .unwrap();
    assert_eq!(result.mode, ApplyMode::Reboot);
    assert!(
        result.mode_details.starts_with(
            "Applied configuration with a reboot: this config change can't be applied in immediate mode\ndiff:\n"
        ),
        "{}",
        result.mode_details
    );
    // The node goes down (etcd stopped with it) and comes back with the
    // new configuration, its etcd member kept.
    wait_for(
        "etcd stopped by the reboot",
        Duration::from_secs(30),
        || async {
            node.etcd_events()
                .iter()
                .any(|e| e.message == "Stopping service")
                .then_some(())
        },
    )
    .await;
    wait_for("the node back up", Duration::from_secs(60), || async {
        let up = node.power() == Power::On && client.node(sim.ip(1)).version().await.is_ok();
        up.then_some(())
    })
    .await;
    assert!(node.active_config().contains("token: rotated-token"));
    let members_after = wait_for("a healthy member list", Duration::from_secs(30), || async {
        client.node(sim.ip(1)).etcd_member_list(false).await.ok()
    })
    .await;
    let ids = |m: &[talos_client::client::EtcdMember]| {
        let mut ids: Vec<_> = m.iter().map(|m| m.id).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&members_before), ids(&members_after));
}

#[tokio::test]
async fn changes_in_place_sections_apply_without_a_reboot() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let config = base(&sim)
        .replace("certSANs: []", "certSANs: [vip.example]")
        .replace("clusterName: talos-sim", "clusterName: renamed");
    for mode in [ApplyMode::NoReboot, ApplyMode::Auto] {
        let result = client
            .apply_configuration(ApplyRequest::new(config.clone(), mode))
            .await
            .unwrap();
        assert_eq!(result.mode, ApplyMode::NoReboot);
        assert_eq!(
            result.mode_details,
            "Applied configuration without a reboot"
        );
    }
}

#[tokio::test]
async fn a_reordered_file_is_no_change() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    // The same configuration with its top-level sections reversed.
    let original = base(&sim);
    let (head, cluster) = original.split_once("cluster:\n").unwrap();
    let reordered = format!("cluster:\n{cluster}{head}");
    assert_ne!(reordered, original);
    let result = client
        .apply_configuration(ApplyRequest::new(reordered, ApplyMode::NoReboot).with_dry_run(true))
        .await
        .unwrap();
    assert!(
        result.mode_details.ends_with("Config diff:\n\nNo changes."),
        "{}",
        result.mode_details
    );
}
