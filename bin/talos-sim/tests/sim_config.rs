//! ApplyConfiguration on the simulator: validation, dry-run diffs, modes,
//! TRY rollback and confirmation, and the single-apply lock.

use talos_test_support as common;

use std::time::Duration;

use common::sim::{SimCluster, wait_for};
use talos_client::client::{ApplyMode, ApplyRequest};
use talos_client::{Client, Error};

fn changed(sim: &SimCluster) -> String {
    std::fs::read_to_string(sim.dir.path().join("controlplane.yaml"))
        .unwrap()
        .replace("clusterName: talos-sim", "clusterName: renamed")
}

async fn dry_run(client: &Client, config: &str) -> String {
    client
        .apply_configuration(ApplyRequest::new(config, ApplyMode::NoReboot).with_dry_run(true))
        .await
        .unwrap()
        .mode_details
}

#[tokio::test]
async fn dry_run_shows_the_diff_and_changes_nothing() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let same = std::fs::read_to_string(sim.dir.path().join("controlplane.yaml")).unwrap();
    let details = dry_run(&client, &same).await;
    assert!(
        details.starts_with(
            "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\n"
        ),
        "{details}"
    );
    assert!(
        details.ends_with("Config diff:\n\nNo changes."),
        "{details}"
    );

    let details = dry_run(&client, &changed(&sim)).await;
    assert!(details.contains("--- a\n+++ b\n"), "{details}");
    assert!(
        details.contains("-  clusterName: talos-sim\n+  clusterName: renamed"),
        "{details}"
    );
    // Nothing was applied.
    assert!(
        dry_run(&client, &changed(&sim))
            .await
            .contains("+  clusterName: renamed")
    );
}

#[tokio::test]
async fn invalid_configs_are_invalid_argument() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    for bad in [
        "version: v1alpha1\nmachine: [unclosed\n",
        "apiVersion: v1alpha1\nkind: Layer2VIPConfig\n",
    ] {
        match client
            .apply_configuration(ApplyRequest::new(bad, ApplyMode::Auto))
            .await
        {
            Err(Error::InvalidArgument(_)) => {}
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn auto_is_reported_as_no_reboot_and_persists() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let result = client
        .apply_configuration(ApplyRequest::new(changed(&sim), ApplyMode::Auto))
        .await
        .unwrap();
    assert_eq!(result.mode, ApplyMode::NoReboot);
    assert_eq!(
        result.mode_details,
        "Applied configuration without a reboot"
    );
    assert!(
        dry_run(&client, &changed(&sim))
            .await
            .ends_with("No changes.")
    );
    let persisted =
        std::fs::read_to_string(sim.cluster.node("cp-1").unwrap().config_path()).unwrap();
    assert!(persisted.contains("clusterName: renamed"));
}

fn try_request(config: String, timeout: Duration) -> ApplyRequest {
    ApplyRequest::new(config, ApplyMode::Try).with_try_timeout(timeout)
}

#[tokio::test]
async fn try_rolls_back_to_the_config_active_when_it_started() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let node = sim.cluster.node("cp-1").unwrap();
    let original = node.active_config();
    let result = client
        .apply_configuration(try_request(changed(&sim), Duration::from_secs(2)))
        .await
        .unwrap();
    assert_eq!(result.mode, ApplyMode::Try);
    assert!(
        result
            .mode_details
            .ends_with("will be automatically reverted back in 2s"),
        "{}",
        result.mode_details
    );
    assert!(node.active_config().contains("clusterName: renamed"));
    wait_for("the rollback", Duration::from_secs(20), || async {
        (!node.rollback_pending()).then_some(())
    })
    .await;
    assert_eq!(node.active_config(), original);

    // Two TRYs in a row: the second rolls back to the first's config, not to
    // the persisted one (v1alpha1_runtime.go, RollbackToConfigAfter).
    client
        .apply_configuration(try_request(changed(&sim), Duration::from_secs(60)))
        .await
        .unwrap();
    let second = changed(&sim).replace("clusterName: renamed", "clusterName: again");
    let zero = client
        .apply_configuration(try_request(second, Duration::ZERO))
        .await
        .unwrap();
    // A zero timeout rolls back at once, formatted as Go formats it.
    assert!(
        zero.mode_details.ends_with("reverted back in 0s"),
        "{}",
        zero.mode_details
    );
    wait_for(
        "the immediate rollback",
        Duration::from_secs(10),
        || async { (!node.rollback_pending()).then_some(()) },
    )
    .await;
    assert!(
        node.active_config().contains("clusterName: renamed"),
        "back to the first TRY's config"
    );
}

#[tokio::test]
async fn any_non_try_request_cancels_a_pending_rollback_even_a_dry_run() {
    // Talos 1.13.9's quirk (talos#14343): the simulator reports 1.13.9.
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let node = sim.cluster.node("cp-1").unwrap();
    client
        .apply_configuration(try_request(changed(&sim), Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(node.rollback_pending());
    assert!(
        dry_run(&client, &changed(&sim))
            .await
            .ends_with("No changes.")
    );
    assert!(
        !node.rollback_pending(),
        "the dry run cancelled the rollback"
    );
    assert!(node.active_config().contains("clusterName: renamed"));

    // Even an invalid request does, before it is rejected.
    client
        .apply_configuration(try_request(changed(&sim), Duration::from_secs(60)))
        .await
        .unwrap();
    let invalid = client
        .apply_configuration(ApplyRequest::new("not: [a config", ApplyMode::NoReboot))
        .await;
    assert!(invalid.is_err());
    assert!(
        !node.rollback_pending(),
        "the invalid request cancelled it too"
    );

    // A TRY does not cancel: it replaces the pending one.
    client
        .apply_configuration(try_request(changed(&sim), Duration::from_secs(60)))
        .await
        .unwrap();
    client
        .apply_configuration(try_request(changed(&sim), Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(node.rollback_pending());
}

#[tokio::test]
async fn a_concurrent_apply_is_refused() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let node = sim.cluster.node("cp-1").unwrap();
    let _in_progress = node.hold_apply_lock().await;
    match client
        .apply_configuration(ApplyRequest::new(changed(&sim), ApplyMode::Auto))
        .await
    {
        Err(Error::FailedPrecondition(f)) => {
            assert!(f.message.contains("already in progress"), "{f}")
        }
        other => panic!("expected FailedPrecondition, got {other:?}"),
    }
}

#[tokio::test]
async fn staged_waits_for_the_next_boot() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let result = client
        .apply_configuration(ApplyRequest::new(changed(&sim), ApplyMode::Staged))
        .await
        .unwrap();
    assert_eq!(result.mode, ApplyMode::Staged);
    assert!(
        dry_run(&client, &changed(&sim))
            .await
            .contains("+  clusterName: renamed")
    );
}

#[tokio::test]
async fn a_cluster_of_no_nodes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    match talos_sim::Cluster::up(talos_sim::SimConfig::isolated(dir.path(), 0)).await {
        Err(talos_sim::SimError::Refused(reason)) => {
            assert!(reason.contains("at least one node"), "{reason}")
        }
        Err(other) => panic!("expected a refusal, got {other}"),
        Ok(_) => panic!("a cluster of no nodes started"),
    }
}

#[tokio::test]
async fn no_free_ports_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    // Addresses this machine does not have: nothing can bind there (only
    // binding is tried; nothing is sent).
    let cfg = talos_sim::SimConfig {
        base_ip: std::net::Ipv4Addr::new(192, 0, 2, 10),
        ..talos_sim::SimConfig::isolated(dir.path(), 1)
    };
    match talos_sim::Cluster::up(cfg).await {
        Err(talos_sim::SimError::Refused(reason)) => {
            assert!(reason.contains("no ports free"), "{reason}")
        }
        Err(other) => panic!("expected a refusal, got {other}"),
        Ok(_) => panic!("a cluster started on addresses this machine lacks"),
    }
}

async fn read_all(
    client: &talos_client::Client<talos_client::One>,
    path: &str,
) -> Result<Vec<u8>, talos_client::Error> {
    use futures::StreamExt as _;
    let mut stream = client.read(path).await?;
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        bytes.extend_from_slice(&chunk?);
    }
    Ok(bytes)
}

#[tokio::test]
async fn read_serves_the_persisted_config_as_machined_does() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin().node(sim.ip(1));
    let node = sim.cluster.node("cp-1").unwrap();
    // Talos before v1.12.0 mounted STATE; the simulator does so on request.
    sim.cluster
        .set_state_partition_mounted("cp-1", true)
        .unwrap();
    let config = read_all(&client, "/system/state/config.yaml")
        .await
        .unwrap();
    assert_eq!(config, std::fs::read(node.config_path()).unwrap());
    // After an apply, the new config.
    sim.admin()
        .apply_configuration(ApplyRequest::new(changed(&sim), ApplyMode::NoReboot))
        .await
        .unwrap();
    let config = read_all(&client, "/system/state/config.yaml")
        .await
        .unwrap();
    assert!(
        String::from_utf8(config)
            .unwrap()
            .contains("clusterName: renamed")
    );
    match read_all(&client, "/system/state/nope.yaml").await {
        Err(talos_client::Error::NotFound(f)) => {
            assert!(
                f.message
                    .contains("stat /system/state/nope.yaml: no such file or directory"),
                "{f}"
            )
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    let dir = read_all(&client, "/system/state").await.unwrap_err();
    assert!(
        dir.to_string().contains("path must be a regular file"),
        "{dir}"
    );
    // Admin only.
    let reader = sim.client_from("talosconfig-reader").node(sim.ip(1));
    assert!(matches!(
        read_all(&reader, "/system/state/config.yaml").await,
        Err(talos_client::Error::PermissionDenied(_))
    ));
}

fn base(sim: &SimCluster) -> String {
    std::fs::read_to_string(sim.dir.path().join("controlplane.yaml")).unwrap()
}

/// `cfg` with `section` (indented for `.machine`) right after `certSANs`.
fn with_machine_section(cfg: &str, section: &str) -> String {
    cfg.replace("  certSANs: []\n", &format!("  certSANs: []\n{section}"))
}

/// Upstream diffs the configurations as its typed encoder writes them
/// (pkg/machinery/config/configdiff/configdiff.go): struct fields in the
/// order of pkg/machinery/config/types/v1alpha1/v1alpha1_types.go at every
/// depth, not only under `.machine` and `.cluster`.
#[tokio::test]
async fn dry_run_diffs_deeper_sections_in_typed_field_order() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let features = "  features:\n    hostDNS:\n      enabled: true\n    kubePrism:\n      port: 7445\n      enabled: true\n    rbac: true\n";
    let network = "  network:\n    interfaces:\n      - dhcp: true\n        addresses: [10.5.0.2/24]\n        interface: eth0\n";
    // The default configuration enables KubePrism (as `talosctl gen
    // config` does): its `features` section gives way to this one, whose
    // fields come in another order than the typed encoder's.
    let default_features = "  features:\n    kubePrism:\n      enabled: true\n      port: 7445\n";
    let without = base(&sim).replace(default_features, "");
    let config = with_machine_section(&without, &format!("{features}{network}"));
    // AUTO: `rbac` takes a reboot.
    let request = ApplyRequest::new(config, ApplyMode::Auto).with_dry_run(true);
    let details = client
        .apply_configuration(request)
        .await
        .unwrap()
        .mode_details;
    assert!(
        details.contains(
            "+  network:\n+    interfaces:\n+    - interface: eth0\n+      addresses:\n+      - 10.5.0.2/24\n+      dhcp: true\n"
        ),
        "{details}"
    );
    assert!(
        details.contains(
            "   features:\n+    rbac: true\n     kubePrism:\n       enabled: true\n       port: 7445\n+    hostDNS:\n+      enabled: true\n"
        ),
        "{details}"
    );
}

/// Upstream's diff (pkg/machinery/textdiff/textdiff.go, neticdk/go-stdlib
/// diff/myers in linear-space mode with its unified formatter) starts a
/// new hunk when two changes have six unchanged lines between them, where
/// a GNU-style unified diff joins them into one.
#[tokio::test]
async fn dry_run_hunks_split_as_upstreams_diff_splits_them() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let sans = |changed: &[usize]| -> String {
        let items: String = (1..=12)
            .map(|i| {
                let prefix = if changed.contains(&i) {
                    "10.9.9"
                } else {
                    "10.0.0"
                };
                format!("    - {prefix}.{i}\n")
            })
            .collect();
        base(&sim).replace("  certSANs: []\n", &format!("  certSANs:\n{items}"))
    };
    client
        .apply_configuration(ApplyRequest::new(sans(&[]), ApplyMode::NoReboot))
        .await
        .unwrap();
    let details = dry_run(&client, &sans(&[2, 9])).await;
    let diff = details.split("Config diff:\n\n").nth(1).unwrap();
    let hunks: Vec<&str> = diff.matches("\n@@ -").collect();
    assert_eq!(hunks.len(), 2, "{diff}");
    assert!(
        diff.contains(
            "   - 10.0.0.1\n-  - 10.0.0.2\n+  - 10.9.9.2\n   - 10.0.0.3\n   - 10.0.0.4\n   - 10.0.0.5\n@@ -"
        ),
        "{diff}"
    );
}
