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

/// The v1alpha1 document of the generated control-plane configuration
/// (on 1.14 the file goes on with the KubeServiceAccountConfig document
/// `talosctl gen config` writes; the tests add their own documents).
fn base(sim: &SimCluster) -> String {
    let file = std::fs::read_to_string(sim.dir.path().join("controlplane.yaml")).unwrap();
    let mut first = String::new();
    for line in file.split_inclusive('\n') {
        if line.trim_end() == "---" {
            break;
        }
        first.push_str(line);
    }
    first
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
    let config = base(&sim) + &service_account(ISSUER_KEY);
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

/// A private key as the issuer's (its body is not parsed).
const ISSUER_KEY: &str = "-----BEGIN ED25519 PRIVATE KEY-----\n    MC4CAQAwBQYDK2VwBCIEIHx0Zkc0c2ltdWxhdG9yLWtleS1mb3ItdGVzdHMtb25seQ==\n    -----END ED25519 PRIVATE KEY-----";

/// A KubeServiceAccountConfig document with `key` (indented for a block
/// scalar) as the issuer's private key.
fn service_account(key: &str) -> String {
    format!(
        "---\napiVersion: v1alpha1\nkind: KubeServiceAccountConfig\nissuer:\n  issuerURL: https://issuer.example\n  privateKey: |\n    {key}\n"
    )
}

/// The go-multierror list of the container's Validate.
fn listed(errors: &[&str]) -> String {
    let points: Vec<String> = errors.iter().map(|e| format!("* {e}")).collect();
    match errors.len() {
        1 => format!("1 error occurred:\n\t{}\n\n", points[0]),
        n => format!("{n} errors occurred:\n\t{}\n\n", points.join("\n\t")),
    }
}

/// Documents other than v1alpha1 are decoded as strictly
/// (pkg/machinery/config/configloader/internal/decoder/decoder.go runs the
/// unknown-key check on every document), the container refuses a
/// Layer2VIPConfig and an HCloudVIPConfig for one address
/// (pkg/machinery/config/container/container.go, New; ConflictsWithKinds in
/// types/network/layer2_vip.go), and each document's Validate runs with
/// the v1alpha1 document's, its errors under its id (container.go,
/// Validate; types/network/layer2_vip.go).
#[tokio::test]
async fn other_documents_are_decoded_and_validated_as_upstream_does() {
    for version in [TalosVersion::V1_13_9, TalosVersion::V1_14_0] {
        let sim = start(version).await;
        let line = base(&sim).lines().count() + 2;
        let vip = "---\napiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: 10.0.0.50\nlink: eth0\n";
        let request = ApplyRequest::new(base(&sim) + vip, ApplyMode::Auto).with_dry_run(true);
        sim.admin().apply_configuration(request).await.unwrap();

        let typo = vip.replace("link: eth0", "link: eth0\ninterface: eth0");
        assert_eq!(
            refused(&sim, base(&sim) + &typo, ApplyMode::Auto, true).await,
            format!(
                "error decoding document v1alpha1/Layer2VIPConfig/10.0.0.50 (line {line}): unknown keys found during decoding:\ninterface: eth0\n"
            ),
            "{version:?}"
        );
        let hcloud = "---\napiVersion: v1alpha1\nkind: HCloudVIPConfig\nname: 10.0.0.50\nlink: eth0\napiToken: t\n";
        assert_eq!(
            refused(&sim, base(&sim) + vip + hcloud, ApplyMode::Auto, true).await,
            "conflicting documents: Layer2VIPConfig/10.0.0.50 and HCloudVIPConfig/10.0.0.50"
        );
        let invalid = "---\napiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: vip\n";
        let with_v1alpha1_error = base(&sim).replace("persist: true", "persist: false");
        assert_eq!(
            refused(&sim, with_v1alpha1_error + invalid, ApplyMode::Auto, false).await,
            listed(&[
                &format!(
                    "v1alpha1.Config: {}",
                    listed(&[".persist should be enabled"])
                ),
                "Layer2VIPConfig/vip: name must be a valid IP address: ParseAddr(\"vip\"): unable to parse IP\nlink must be specified",
            ]),
            "{version:?}"
        );
    }
}

/// Talos 1.14's KubeServiceAccountConfig (types/k8s/service_account.go):
/// the issuer's key and URL are required, it cannot sit next to
/// `.cluster.serviceAccount`, and it belongs on control-plane machines only
/// (pkg/machinery/config/container/validate.go, validateContainer).
#[tokio::test]
async fn kube_service_account_config_is_validated_on_1_14() {
    let sim = SimCluster::start_with(1, |cfg| {
        cfg.timing = TalosTiming::scaled_down(10);
        cfg.talos_version = TalosVersion::V1_14_0;
        cfg.workers = 1;
    })
    .await;
    let bare =
        "---\napiVersion: v1alpha1\nkind: KubeServiceAccountConfig\nissuer:\n  issuerURL: \"\"\n";
    assert_eq!(
        refused(&sim, base(&sim) + bare, ApplyMode::Auto, true).await,
        listed(&[
            "KubeServiceAccountConfig: service issuer private key is required\nservice issuer URL is required"
        ])
    );
    let not_a_key = service_account("not a key");
    assert_eq!(
        refused(&sim, base(&sim) + &not_a_key, ApplyMode::Auto, true).await,
        listed(&[
            "KubeServiceAccountConfig: service issuer private key is invalid: failed to parse PEM block"
        ])
    );
    let legacy = base(&sim).replace(
        "  clusterName: talos-sim\n",
        "  clusterName: talos-sim\n  serviceAccount:\n    key: a2V5\n",
    );
    assert_eq!(
        refused(
            &sim,
            legacy + &service_account(ISSUER_KEY),
            ApplyMode::Auto,
            true
        )
        .await,
        listed(&["service account is already set in v1alpha1 config (.cluster.serviceAccount)"])
    );
    let worker_ip = sim.cluster.node("worker-1").unwrap().ip.to_string();
    let worker = std::fs::read_to_string(sim.dir.path().join("worker.yaml")).unwrap()
        + &service_account(ISSUER_KEY);
    let request = ApplyRequest::new(worker, ApplyMode::Auto).with_dry_run(true);
    match sim
        .admin()
        .node(worker_ip)
        .apply_configuration(request)
        .await
    {
        Err(Error::InvalidArgument(f)) => assert_eq!(
            f.message,
            listed(&[
                "the following document kinds are only allowed on control plane machines: [KubeServiceAccountConfig]"
            ])
        ),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}
