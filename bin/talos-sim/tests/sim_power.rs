//! Reset, reboot and shutdown on the simulator.

use talos_test_support as common;

use std::time::Duration;

use common::sim::{SimCluster, wait_for};
use talos_client::client::{ApplyMode, ApplyRequest, RebootMode, ResetRequest};
use talos_client::{Client, Error};

/// Waits until the node stops answering (connection refused or reset).
async fn wait_down(client: &Client) {
    wait_for(
        "the node to stop answering",
        Duration::from_secs(30),
        || async {
            match client.version().await {
                Err(Error::Connect(_) | Error::Unavailable(_)) => Some(()),
                _ => None,
            }
        },
    )
    .await
}

fn direct(sim: &SimCluster, i: usize) -> Client {
    // A client whose only endpoint is the node itself.
    let path = sim.dir.path().join("talosconfig");
    let config = talos_client::config::TalosConfig::read(&path).unwrap();
    let context = config
        .resolve(
            &talos_client::config::Overrides::default()
                .with_endpoints(vec![sim.cluster.nodes()[i - 1].api.clone()]),
            &path,
        )
        .unwrap();
    Client::builder_from_context(&context)
        .read_attempts(1)
        .build()
        .unwrap()
}

#[tokio::test]
async fn reset_without_reboot_powers_the_node_off() {
    let sim = SimCluster::start(3).await;
    let admin = sim.admin();
    let target = direct(&sim, 3);
    let request = ResetRequest::default()
        .with_graceful(false)
        .with_reboot(false)
        .with_system_labels_to_wipe(vec!["STATE".into(), "EPHEMERAL".into()]);
    let actor = target.reset(request).await.expect("reset accepted");
    assert_eq!(actor.len(), 36, "a UUID actor id: {actor}");
    wait_down(&target).await;
    // Proxied calls to it fail too, and its volumes are wiped: after the
    // API went (Talos stops every service, apid and etcd among them,
    // before resetSystemDisk), once etcd stopped, which takes a leader's
    // etcd a leadership transfer.
    assert!(admin.node(sim.ip(3)).version().await.is_err());
    let node = sim.cluster.node("cp-3").unwrap();
    wait_for(
        "STATE and EPHEMERAL wiped",
        Duration::from_secs(30),
        || async { (!node.config_path().exists() && !node.etcd_data_dir().exists()).then_some(()) },
    )
    .await;
    assert!(
        node.volume("META").join("meta").exists(),
        "META was not asked to be wiped"
    );
    // Not graceful: the member is still listed.
    assert_eq!(
        admin
            .node(sim.ip(1))
            .etcd_member_list(false)
            .await
            .unwrap()
            .len(),
        3
    );
}

#[tokio::test]
async fn graceful_reset_leaves_etcd_first() {
    let sim = SimCluster::start(3).await;
    let admin = sim.admin();
    let target = direct(&sim, 2);
    target.reset(ResetRequest::default()).await.unwrap();
    wait_down(&target).await;
    let members = admin.node(sim.ip(1)).etcd_member_list(false).await.unwrap();
    assert_eq!(members.len(), 2);
    assert!(members.iter().all(|m| m.hostname != "cp-2"));
}

#[tokio::test]
async fn unknown_wipe_labels_are_rejected_and_change_nothing() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let request =
        ResetRequest::default().with_system_labels_to_wipe(vec!["STATE".into(), "BOGUS".into()]);
    let err = client.reset(request).await.unwrap_err();
    assert!(err.to_string().contains("\"BOGUS\""), "{err}");
    assert_eq!(client.hostname().await.unwrap(), "cp-1");
    assert!(sim.cluster.node("cp-1").unwrap().config_path().exists());

    let request = ResetRequest::default().with_user_disks_to_wipe(vec!["/dev/sdb".into()]);
    let err = client.reset(request).await.unwrap_err();
    assert!(err.to_string().contains("/dev/sdb wasn't found"), "{err}");
}

fn wipe(labels: &[&str]) -> ResetRequest {
    ResetRequest::default()
        .with_graceful(false)
        .with_reboot(false)
        .with_system_labels_to_wipe(labels.iter().map(|l| l.to_string()).collect())
}

/// v1alpha1_server.go Reset looks each label up as a VolumeStatus: the
/// image cache's volumes exist only while the cache is enabled
/// (controllers/cri/image_cache_config.go), and then IMAGECACHE can be wiped
/// and IMAGECACHE-ISO (no ISO on an installed node) is not located; user
/// volumes (`u-NAME`) exist once declared.
#[tokio::test]
async fn reset_labels_reach_imagecache_and_user_volumes_but_not_unlocated_ones() {
    let sim = SimCluster::start(1).await;
    let client = direct(&sim, 1);
    let node = sim.cluster.node("cp-1").unwrap();

    // The cache is disabled by default: neither volume exists.
    for label in ["IMAGECACHE", "IMAGECACHE-ISO", "EFI"] {
        let err = client.reset(wipe(&[label])).await.unwrap_err();
        assert!(
            err.to_string().contains(&format!(
                "failed to get volume status with label \"{label}\""
            )),
            "{err}"
        );
    }
    // Enabled (a change of `machine.features` takes a reboot).
    let enabled = node.active_config().replace(
        "  features:\n",
        "  features:\n    imageCache:\n      localEnabled: true\n",
    );
    assert!(enabled.contains("imageCache"), "{enabled}");
    client
        .apply_configuration(ApplyRequest::new(enabled, ApplyMode::Reboot))
        .await
        .expect("the image cache is enabled");
    wait_for(
        "the node back with the image cache",
        Duration::from_secs(60),
        || async {
            let err = client.reset(wipe(&["IMAGECACHE-ISO"])).await.err()?;
            err.to_string().contains("is not located").then_some(err)
        },
    )
    .await;
    let err = client.reset(wipe(&["IMAGECACHE-ISO"])).await.unwrap_err();
    match &err {
        Error::Status { failure, .. } => assert_eq!(
            failure.message,
            "failed to reset: volume \"IMAGECACHE-ISO\" is not located"
        ),
        other => panic!("expected Unknown, got {other:?}"),
    }
    // A user volume that no UserVolumeConfig declares does not exist.
    let err = client.reset(wipe(&["u-data"])).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("failed to get volume status with label \"u-data\""),
        "{err}"
    );

    let config = format!(
        "{}\n---\napiVersion: v1alpha1\nkind: UserVolumeConfig\nname: data\nprovisioning:\n  diskSelector:\n    match: '!system_disk'\n  minSize: 1GiB\n",
        node.active_config()
    );
    client
        .apply_configuration(ApplyRequest::new(config, ApplyMode::NoReboot))
        .await
        .expect("a user volume is declared");
    let markers = [
        node.volume("IMAGECACHE").join("cached"),
        node.volume("u-data").join("user-file"),
    ];
    for marker in &markers {
        std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
        std::fs::write(marker, b"x").unwrap();
    }
    client
        .reset(wipe(&["IMAGECACHE", "u-data"]))
        .await
        .expect("both labels resolve");
    // Powered off once the wipe is over.
    wait_for("the node to power off", Duration::from_secs(30), || async {
        (node.power() == talos_sim::node::Power::Off).then_some(())
    })
    .await;
    for marker in &markers {
        assert!(!marker.exists(), "{} survived", marker.display());
    }
    assert!(
        node.config_path().exists(),
        "STATE was not asked to be wiped"
    );
}

#[tokio::test]
async fn reboot_brings_the_node_back_with_etcd() {
    let sim = SimCluster::start(3).await;
    let target = direct(&sim, 2);
    target.reboot(RebootMode::Default).await.unwrap();
    // The reboot sequence starts a moment after the answer, as machined
    // runs it; from then until the node goes down, its machine status says
    // so, as a Talos node's does. Read until it is no longer running.
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        match target.resources().machine_status().await {
            Ok(status) if status.stage == "running" => {}
            Ok(status) => seen.push(status.stage),
            Err(_) => break,
        }
    }
    // (The window is the events' grace before the node goes down, 200 ms:
    // on a loaded machine no read may land in it, so only what was seen
    // is checked; ops upgrade's resume tests depend on it being seen.)
    assert!(seen.iter().all(|s| s == "rebooting"), "{seen:?}");
    wait_down(&target).await;
    wait_for("the node to come back", Duration::from_secs(60), || async {
        target.etcd_status().await.ok()
    })
    .await;
    assert_eq!(sim.admin().etcd_member_list(false).await.unwrap().len(), 3);
    let status = target.resources().machine_status().await.unwrap();
    assert_eq!(status.stage, "running");
}

#[tokio::test]
async fn shutdown_stops_the_node() {
    let sim = SimCluster::start(1).await;
    let target = direct(&sim, 1);
    target.shutdown(false).await.unwrap();
    wait_down(&target).await;
}

#[tokio::test]
async fn a_wiped_node_recovers_etcd_from_an_uploaded_snapshot() {
    let sim = SimCluster::start(1).await;
    sim.cluster.fill("/registry/keep/", 50, 100).await.unwrap();
    let node = direct(&sim, 1);
    let snapshot = sim.dir.path().join("backup.db");
    let saved = talos_client::snapshot::save(node.etcd_snapshot().await.unwrap())
        .to(&snapshot)
        .await
        .unwrap();

    // Wipe etcd's volume and reboot: the node comes back configured but
    // without etcd, and with no other member to join.
    let request = ResetRequest::default()
        .with_graceful(false)
        .with_reboot(true)
        .with_system_labels_to_wipe(vec!["EPHEMERAL".into()]);
    node.reset(request).await.unwrap();
    wait_down(&node).await;
    wait_for("the node to come back", Duration::from_secs(60), || async {
        node.hostname().await.ok()
    })
    .await;
    // etcd calls wait for an etcd that is not there, until the deadline.
    let status = node
        .with_call_timeout(Duration::from_millis(500))
        .etcd_status()
        .await;
    assert!(
        matches!(status, Err(Error::DeadlineExceeded(_))),
        "{status:?}"
    );

    // Bootstrap refuses to recover before a snapshot is uploaded.
    assert!(matches!(
        node.bootstrap(true, false).await,
        Err(Error::FailedPrecondition(_))
    ));
    let data = std::fs::read(&snapshot).unwrap();
    let chunks: Vec<bytes::Bytes> = data
        .chunks(1 << 16)
        .map(bytes::Bytes::copy_from_slice)
        .collect();
    node.etcd_recover(futures::stream::iter(chunks))
        .await
        .unwrap();
    node.bootstrap(true, false)
        .await
        .expect("bootstrap from the snapshot");

    let status = wait_for("etcd to run again", Duration::from_secs(30), || async {
        node.etcd_status().await.ok()
    })
    .await;
    assert!(status.is_leader(), "a single restored member leads");
    // The restored data is there: a fresh snapshot holds the same keys.
    let again = sim.dir.path().join("again.db");
    let restored = talos_client::snapshot::save(node.etcd_snapshot().await.unwrap())
        .to(&again)
        .await
        .unwrap();
    assert_eq!(
        restored.report.status.total_keys,
        saved.report.status.total_keys
    );
    // A second bootstrap is refused: etcd has data now.
    assert!(matches!(
        node.bootstrap(false, false).await,
        Err(Error::AlreadyExists(_))
    ));
}
