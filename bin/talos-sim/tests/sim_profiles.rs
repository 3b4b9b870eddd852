//! Version profiles: a node behaves as the Talos release it reports
//! (internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go at
//! v1.13.9 and at v1.14.0), and both report the metal platform
//! (internal/app/machined/pkg/runtime/mode.go).

use talos_test_support as common;

use common::sim::SimCluster;
use talos_client::Error;
use talos_client::client::{ApplyMode, ApplyRequest, ResetRequest};
use talos_sim::{TalosTiming, TalosVersion};

async fn start(version: TalosVersion) -> SimCluster {
    SimCluster::start_with(1, |cfg| {
        cfg.timing = TalosTiming::scaled_down(10);
        cfg.talos_version = version;
    })
    .await
}

fn token_change(sim: &SimCluster) -> String {
    std::fs::read_to_string(sim.dir.path().join("controlplane.yaml"))
        .unwrap()
        .replace("token: talos-sim-token", "token: rotated-token")
}

#[tokio::test]
async fn version_reports_the_profile_and_the_metal_platform() {
    for (version, tag) in [
        (TalosVersion::V1_13_9, "v1.13.9"),
        (TalosVersion::V1_14_0, "v1.14.0"),
    ] {
        let sim = start(version).await;
        let reply = sim.admin().version().await.unwrap();
        assert_eq!(reply.tag, tag);
        assert_eq!(reply.platform.as_deref(), Some("metal"));
        assert_eq!(reply.platform_mode.as_deref(), Some("metal"));
        let status = sim.admin().etcd_status().await.unwrap();
        if version == TalosVersion::V1_14_0 {
            assert!(
                status.protocol_version.starts_with("3.7."),
                "{}",
                status.protocol_version
            );
        } else {
            assert!(!status.protocol_version.starts_with("3.7."));
        }
    }
}

#[test]
fn the_default_profile_is_1_13_9_and_others_are_refused() {
    let cfg = talos_sim::SimConfig::isolated("/nonexistent", 1);
    assert_eq!(cfg.talos_version, TalosVersion::V1_13_9);
    assert_eq!(
        "v1.14.0".parse::<TalosVersion>().unwrap(),
        TalosVersion::V1_14_0
    );
    let err = "1.12.0".parse::<TalosVersion>().unwrap_err().to_string();
    assert!(err.contains("\"1.12.0\" is not simulated"), "{err}");
}

/// 1.14 refuses REBOOT with Unimplemented; 1.13.9 accepts it.
#[tokio::test]
async fn reboot_mode_is_unimplemented_on_1_14_only() {
    let sim = start(TalosVersion::V1_14_0).await;
    let node = sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    let request = ApplyRequest::new(token_change(&sim), ApplyMode::Reboot);
    match sim.admin().apply_configuration(request).await {
        Err(Error::Unimplemented(failure)) => {
            assert_eq!(
                failure.message,
                "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead"
            );
        }
        other => panic!("expected Unimplemented, got {other:?}"),
    }
    assert_eq!(node.active_config(), before);

    let sim = start(TalosVersion::V1_13_9).await;
    let request = ApplyRequest::new(token_change(&sim), ApplyMode::Reboot).with_dry_run(true);
    let reply = sim.admin().apply_configuration(request).await.unwrap();
    assert_eq!(reply.mode, ApplyMode::Reboot);
}

/// 1.13.9's AUTO reboots for a change that cannot apply in place; 1.14's
/// AUTO is NO_REBOOT and applies it in place.
#[tokio::test]
async fn auto_never_reboots_on_1_14() {
    for (version, expected) in [
        (TalosVersion::V1_13_9, ApplyMode::Reboot),
        (TalosVersion::V1_14_0, ApplyMode::NoReboot),
    ] {
        let sim = start(version).await;
        let request = ApplyRequest::new(token_change(&sim), ApplyMode::Auto).with_dry_run(true);
        let reply = sim.admin().apply_configuration(request).await.unwrap();
        assert_eq!(reply.mode, expected, "{version:?}");
    }
    let sim = start(TalosVersion::V1_14_0).await;
    let node = sim.cluster.node("cp-1").unwrap();
    let request = ApplyRequest::new(token_change(&sim), ApplyMode::Auto);
    let reply = sim.admin().apply_configuration(request).await.unwrap();
    assert_eq!(reply.mode, ApplyMode::NoReboot);
    assert!(node.active_config().contains("token: rotated-token"));
    assert_eq!(node.power(), talos_sim::node::Power::On);
}

/// 1.14 keeps etcd's data on a volume of its own, `ETCD`: a reset label
/// 1.13.9 does not know.
#[tokio::test]
async fn the_etcd_volume_exists_on_1_14_only() {
    let sim = start(TalosVersion::V1_13_9).await;
    let request = ResetRequest::default()
        .with_graceful(false)
        .with_reboot(true)
        .with_system_labels_to_wipe(vec!["ETCD".into()]);
    let err = sim
        .admin()
        .reset(request.clone())
        .await
        .expect_err("1.13.9 has no ETCD volume");
    assert!(
        err.to_string()
            .contains("failed to get volume status with label \"ETCD\""),
        "{err}"
    );

    let sim = start(TalosVersion::V1_14_0).await;
    let node = sim.cluster.node("cp-1").unwrap();
    assert!(node.etcd_data_dir().starts_with(node.volume("ETCD")));
    sim.admin().reset(request).await.expect("1.14 wipes ETCD");
}

/// ServiceList names a Talos node's services in id order
/// (internal/app/machined/pkg/system/system.go, List); etcd and trustd only
/// on the control plane.
#[tokio::test]
async fn service_list_names_the_services_of_a_talos_node() {
    let sim = SimCluster::start_with(1, |cfg| {
        cfg.timing = TalosTiming::scaled_down(10);
        cfg.workers = 1;
    })
    .await;
    let ids = |services: Vec<talos_client::client::ServiceInfo>| {
        services.into_iter().map(|s| s.id).collect::<Vec<_>>()
    };
    let control_plane = sim.admin().service_list().await.unwrap();
    assert_eq!(
        ids(control_plane),
        [
            "apid",
            "containerd",
            "cri",
            "etcd",
            "kubelet",
            "machined",
            "trustd",
            "udevd"
        ]
    );
    let worker = sim.cluster.nodes()[1].ip.to_string();
    let worker = sim.admin().node(worker).service_list().await.unwrap();
    assert_eq!(
        ids(worker),
        ["apid", "containerd", "cri", "kubelet", "machined", "udevd"]
    );
}
