//! Strict configuration decoding, as upstream's loader does it
//! (pkg/machinery/config/configloader/internal/decoder/decoder.go,
//! pkg/machinery/config/internal/registry, siderolabs/gen xyaml): unknown
//! keys and kinds the release does not register are refused with upstream's
//! message, before anything changes.

use talos_test_support as common;

use common::sim::SimCluster;
use talos_client::Error;
use talos_client::client::{ApplyMode, ApplyRequest};
use talos_sim::{TalosTiming, TalosVersion};

async fn start(version: TalosVersion) -> SimCluster {
    SimCluster::start_with(1, |cfg| {
        cfg.timing = TalosTiming::scaled_down(10);
        cfg.talos_version = version;
    })
    .await
}

fn base(sim: &SimCluster) -> String {
    std::fs::read_to_string(sim.dir.path().join("controlplane.yaml")).unwrap()
}

async fn refused(sim: &SimCluster, config: String, mode: ApplyMode, dry_run: bool) -> String {
    let request = ApplyRequest::new(config, mode).with_dry_run(dry_run);
    match sim.admin().apply_configuration(request).await {
        Err(Error::InvalidArgument(f)) => f.message,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[tokio::test]
async fn an_unknown_key_is_refused_with_upstreams_message() {
    for version in [TalosVersion::V1_13_9, TalosVersion::V1_14_0] {
        let sim = start(version).await;
        let node = sim.cluster.node("cp-1").unwrap();
        let before = node.active_config();
        let config = base(&sim).replace(
            "  certSANs: []\n",
            "  certSANs: []\n  certSans: [10.0.0.1]\n",
        );
        for (mode, dry_run) in [(ApplyMode::Auto, true), (ApplyMode::NoReboot, false)] {
            let message = refused(&sim, config.clone(), mode, dry_run).await;
            assert_eq!(
                message,
                "error decoding document /v1alpha1/ (line 1): unknown keys found during decoding:\nmachine:\n    certSans:\n        - 10.0.0.1\n",
                "{version:?}"
            );
        }
        assert_eq!(node.active_config(), before);
    }
}

#[tokio::test]
async fn kube_service_account_config_is_not_registered_on_1_13_9() {
    let document = "---\napiVersion: v1alpha1\nkind: KubeServiceAccountConfig\nissuer:\n  issuerURL: https://issuer.example\n";
    let sim = start(TalosVersion::V1_13_9).await;
    let config = base(&sim) + document;
    let line = base(&sim).lines().count() + 2;
    let message = refused(&sim, config, ApplyMode::Auto, true).await;
    assert_eq!(
        message,
        format!(
            "error decoding document v1alpha1/KubeServiceAccountConfig/ (line {line}): \"KubeServiceAccountConfig\" \"v1alpha1\": not registered"
        )
    );

    let sim = start(TalosVersion::V1_14_0).await;
    let config = base(&sim) + document;
    let request = ApplyRequest::new(config, ApplyMode::Auto).with_dry_run(true);
    let reply = sim.admin().apply_configuration(request).await.unwrap();
    assert!(
        reply.mode_details.contains("KubeServiceAccountConfig"),
        "{}",
        reply.mode_details
    );
}

#[tokio::test]
async fn documents_without_kind_or_twice_are_refused() {
    let sim = start(TalosVersion::V1_13_9).await;
    let no_kind = base(&sim) + "---\napiVersion: v1beta1\nname: x\n";
    let message = refused(&sim, no_kind, ApplyMode::Auto, true).await;
    assert!(message.ends_with("): missing kind"), "{message}");
    let twice = base(&sim) + "---\n" + &base(&sim);
    let message = refused(&sim, twice, ApplyMode::Auto, true).await;
    assert!(
        message.starts_with("duplicate document /v1alpha1/ is not allowed (line "),
        "{message}"
    );
}
