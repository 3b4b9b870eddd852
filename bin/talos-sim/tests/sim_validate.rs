//! The v1alpha1 Validate a node runs on every apply, configured or in
//! maintenance (pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go,
//! pkg/machinery/config/container/container.go): refused with upstream's
//! go-multierror text, nothing changed; warnings come back with the result.

use talos_test_support as common;

use common::sim::SimCluster;
use talos_client::Error;
use talos_client::client::{ApplyMode, ApplyRequest};
use talos_client::maintenance::MaintenanceClient;
use talos_sim::{TalosTiming, TalosVersion};

async fn start(version: TalosVersion, workers: usize) -> SimCluster {
    SimCluster::start_with(1, |cfg| {
        cfg.timing = TalosTiming::scaled_down(10);
        cfg.talos_version = version;
        cfg.workers = workers;
    })
    .await
}

fn file(sim: &SimCluster, name: &str) -> String {
    std::fs::read_to_string(sim.dir.path().join(name)).unwrap()
}

/// The message a node sends for `errors` of the v1alpha1 document.
fn upstream(errors: &[&str]) -> String {
    let inner = if errors.len() == 1 {
        format!("1 error occurred:\n\t* {}\n\n", errors[0])
    } else {
        let points: Vec<String> = errors.iter().map(|e| format!("* {e}")).collect();
        format!(
            "{} errors occurred:\n\t{}\n\n",
            errors.len(),
            points.join("\n\t")
        )
    };
    format!("1 error occurred:\n\t* v1alpha1.Config: {inner}\n\n")
}

async fn refused(client: &talos_client::Client, config: String, dry_run: bool) -> String {
    let request = ApplyRequest::new(config, ApplyMode::Auto).with_dry_run(dry_run);
    match client.apply_configuration(request).await {
        Err(Error::InvalidArgument(f)) => f.message,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[tokio::test]
async fn an_invalid_endpoint_is_refused_with_upstreams_message() {
    for version in [TalosVersion::V1_13_9, TalosVersion::V1_14_0] {
        let sim = start(version, 0).await;
        let node = sim.cluster.node("cp-1").unwrap();
        let before = node.active_config();
        let base = file(&sim, "controlplane.yaml");
        let endpoint = base
            .lines()
            .find(|l| l.trim_start().starts_with("endpoint: "))
            .unwrap()
            .trim()
            .to_string();
        for (bad, error) in [
            ("cp.example", "hostname must not be blank"),
            (
                "https://cp.example:70000",
                "port number must be between 1 and 65535",
            ),
            (
                "https://fd00::1:6443",
                "IPv6 addresses MUST be enclosed by square brackets",
            ),
        ] {
            let config = base.replace(&endpoint, &format!("endpoint: {bad}"));
            for dry_run in [true, false] {
                assert_eq!(
                    refused(&sim.admin(), config.clone(), dry_run).await,
                    upstream(&[&format!("invalid controlplane endpoint: {error}")]),
                    "{version:?} {bad}"
                );
            }
        }
        assert_eq!(node.active_config(), before);
    }
}

#[tokio::test]
async fn every_error_is_listed_in_upstreams_order() {
    let sim = start(TalosVersion::V1_13_9, 0).await;
    let base = file(&sim, "controlplane.yaml");
    // A control plane's CA key and the etcd CA are required; persist must
    // stay on; the DNS domain must be a DNS name.
    let config = base
        .lines()
        .filter(|l| {
            !["    key: ", "    ca:", "      crt: ", "      key: "]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .map(|l| l.replace("persist: true", "persist: false"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace(
            "  clusterName: talos-sim\n",
            "  clusterName: talos-sim\n  network:\n    dnsDomain: bad..domain\n",
        )
        + "\n";
    assert_eq!(
        refused(&sim.admin(), config, true).await,
        upstream(&[
            "\"bad..domain\" is not a valid DNS name",
            "key/cert combination should not be empty",
            "issuing CA key is required for controlplane nodes (.machine.ca.key)",
            ".persist should be enabled",
        ])
    );
    let unknown = base.replace("type: controlplane", "type: master");
    let message = refused(&sim.admin(), unknown, true).await;
    assert_eq!(
        message,
        upstream(&[
            "etcd config is only allowed on control plane machines",
            "cluster CA key is not allowed on non-controlplane nodes (.cluster.ca)",
            "unknown machine type \"master\"",
        ])
    );
    let no_cluster = base.split("\ncluster:\n").next().unwrap().to_string() + "\n";
    assert_eq!(
        refused(&sim.admin(), no_cluster, true).await,
        upstream(&["cluster instructions are required"])
    );
}

#[tokio::test]
async fn a_worker_config_with_a_ca_key_or_etcd_is_refused_and_join_warns() {
    let sim = start(TalosVersion::V1_13_9, 1).await;
    let worker_ip = sim.cluster.node("worker-1").unwrap().ip.to_string();
    let worker = sim.admin().node(worker_ip);
    let control = file(&sim, "controlplane.yaml").replace("type: controlplane", "type: worker");
    assert_eq!(
        refused(&worker, control, true).await,
        upstream(&[
            "etcd config is only allowed on control plane machines",
            "cluster CA key is not allowed on non-controlplane nodes (.cluster.ca)",
            "issuing Talos API CA key is not allowed on non-controlplane nodes (.machine.ca)",
            "issuing Kubernetes API CA key is not allowed on non-controlplane nodes (.cluster.ca)",
        ])
    );
    // `join` is a worker, with a warning (staged: a type change is not
    // applied in place).
    let join = file(&sim, "worker.yaml").replace("type: worker", "type: join");
    let applied = worker
        .apply_configuration(ApplyRequest::new(join, ApplyMode::Staged))
        .await
        .unwrap();
    assert_eq!(
        applied.warnings,
        ["use \"worker\" instead of \"join\" for machine type"]
    );
}

#[tokio::test]
async fn maintenance_mode_runs_the_same_validation() {
    let sim = start(TalosVersion::V1_13_9, 0).await;
    let added = sim.cluster.add_maintenance_node().await.unwrap();
    let fingerprint = added.maintenance_fingerprint.clone().unwrap();
    let node = MaintenanceClient::pinned(&added.api, &[&fingerprint]).unwrap();
    let base = file(&sim, "controlplane.yaml");
    let no_ca: String = base
        .lines()
        .filter(|l| {
            !l.starts_with("  ca:") && !l.starts_with("    crt: ") && !l.starts_with("    key: ")
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    for dry_run in [true, false] {
        let request = ApplyRequest::new(no_ca.clone(), ApplyMode::Auto).with_dry_run(dry_run);
        match node.apply_configuration(request).await {
            Err(Error::InvalidArgument(f)) => assert_eq!(
                f.message,
                upstream(&[
                    "issuing CA or some accepted CAs are required (.machine.ca, machine.acceptedCAs)",
                    "issuing CA is required (.machine.ca)",
                ])
            ),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
    // Still in maintenance: the pinned API answers.
    assert!(node.version().await.is_ok());
}

/// `cfg` with the kube-apiserver image `image` (under `.cluster`).
fn with_apiserver_image(cfg: &str, image: &str) -> String {
    cfg.replace(
        "  clusterName: talos-sim\n",
        &format!("  clusterName: talos-sim\n  apiServer:\n    image: {image}\n"),
    )
}

/// RuntimeValidate (pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go
/// at v1.13.9) checks the Kubernetes images against the versions the
/// release supports (pkg/machinery/compatibility/kubernetes_version.go,
/// talos113: 1.31.0 up to 1.36.99), after Validate passed; 1.14 checks them
/// last in Validate (ValidateKubernetesVersions, talos114: 1.32.0 up to
/// 1.37.99), in the same list as Validate's other errors.
#[tokio::test]
async fn kubernetes_images_are_checked_against_the_release() {
    let sim = start(TalosVersion::V1_13_9, 0).await;
    let node = sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    let base = file(&sim, "controlplane.yaml");
    let too_new = with_apiserver_image(&base, "registry.k8s.io/kube-apiserver:v1.37.0");
    for dry_run in [true, false] {
        assert_eq!(
            refused(&sim.admin(), too_new.clone(), dry_run).await,
            upstream(&[
                "kube-apiserver image is not valid: version of Kubernetes 1.37.0 is too new to be used with Talos 1.13.9"
            ])
        );
    }
    let untagged = with_apiserver_image(&base, "registry.k8s.io/kube-apiserver:latest");
    assert_eq!(
        refused(&sim.admin(), untagged, true).await,
        upstream(&[
            "kube-apiserver image is not valid: failed to parse Kubernetes version from image reference \"registry.k8s.io/kube-apiserver:latest\": invalid image reference: \"registry.k8s.io/kube-apiserver:latest\""
        ])
    );
    // Validate's errors come first: RuntimeValidate only runs on a
    // configuration Validate accepted.
    let both = too_new.replace("persist: true", "persist: false");
    assert_eq!(
        refused(&sim.admin(), both, true).await,
        upstream(&[".persist should be enabled"])
    );
    assert_eq!(node.active_config(), before);
    let supported = with_apiserver_image(&base, "registry.k8s.io/kube-apiserver:v1.35.2");
    let request = ApplyRequest::new(supported, ApplyMode::Auto).with_dry_run(true);
    sim.admin().apply_configuration(request).await.unwrap();

    let sim = start(TalosVersion::V1_14_0, 0).await;
    let base = file(&sim, "controlplane.yaml");
    let accepted = with_apiserver_image(&base, "registry.k8s.io/kube-apiserver:v1.37.0");
    let request = ApplyRequest::new(accepted, ApplyMode::Auto).with_dry_run(true);
    sim.admin().apply_configuration(request).await.unwrap();
    let too_old = with_apiserver_image(&base, "registry.k8s.io/kube-apiserver:v1.31.4")
        .replace("persist: true", "persist: false");
    assert_eq!(
        refused(&sim.admin(), too_old, true).await,
        upstream(&[
            ".persist should be enabled",
            "kube-apiserver image is not valid: version of Kubernetes 1.31.4 is too old to be used with Talos 1.14.0",
        ])
    );
}

/// `.machine.install.extensions` is warned about by Validate and again by
/// RuntimeValidate, whose warnings follow Validate's in the applied result,
/// on both releases (v1alpha1_validation.go, v1alpha1_server.go
/// ApplyConfiguration); a duplicate extension is refused.
#[tokio::test]
async fn runtime_validate_warnings_come_back_with_the_result() {
    for version in [TalosVersion::V1_13_9, TalosVersion::V1_14_0] {
        let sim = start(version, 0).await;
        let base = file(&sim, "controlplane.yaml");
        let install = base
            .lines()
            .find(|l| l.starts_with("    image: ghcr.io/siderolabs/installer:"))
            .unwrap()
            .to_string();
        let with_extensions = base.replace(
            &format!("{install}\n"),
            &format!(
                "{install}\n    extensions:\n      - image: ghcr.io/siderolabs/gvisor:20250505.0\n"
            ),
        );
        let config = with_extensions.replace(
            "  clusterName: talos-sim\n",
            "  clusterName: talos-sim\n  network:\n    cni:\n      name: custom\n",
        );
        let applied = sim
            .admin()
            .apply_configuration(ApplyRequest::new(config, ApplyMode::Staged))
            .await
            .unwrap();
        assert_eq!(
            applied.warnings,
            [
                "\"urls\" field should not be empty for \"custom\" CNI",
                ".machine.install.extensions is deprecated, please see https://docs.siderolabs.com/talos/latest/platform-specific-installations/boot-assets",
                ".machine.install.extensions is deprecated, please see https://docs.siderolabs.com/talos/latest/platform-specific-installations/boot-assets",
            ],
            "{version:?}"
        );
        let extension = "      - image: ghcr.io/siderolabs/gvisor:20250505.0\n";
        let twice = with_extensions.replace(extension, &format!("{extension}{extension}"));
        assert_eq!(
            refused(&sim.admin(), twice, true).await,
            upstream(&["duplicate system extension \"ghcr.io/siderolabs/gvisor:20250505.0\""])
        );
    }
}

/// Talos 1.14 refuses a REBOOT apply once the configuration has loaded,
/// before Validate (v1alpha1_server.go at v1.14.0): an invalid
/// configuration sent with REBOOT gets Unimplemented, not InvalidArgument.
#[tokio::test]
async fn reboot_is_refused_before_validate_on_1_14() {
    let sim = start(TalosVersion::V1_14_0, 0).await;
    let invalid = file(&sim, "controlplane.yaml").replace("persist: true", "persist: false");
    let request = ApplyRequest::new(invalid, ApplyMode::Reboot);
    match sim.admin().apply_configuration(request).await {
        Err(Error::Unimplemented(failure)) => assert_eq!(
            failure.message,
            "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead"
        ),
        other => panic!("expected Unimplemented, got {other:?}"),
    }
}

/// Talos 1.14's Validate warns first about `.machine.files` and
/// `.machine.baseRuntimeSpecOverrides` (v1alpha1_validation.go at v1.14.0);
/// 1.13.9 does not.
#[tokio::test]
async fn deprecated_sections_warn_on_1_14_only() {
    let files = "  files:\n    - path: /var/etc/x\n      content: x\n      permissions: 0o644\n      op: create\n";
    for (version, expected) in [
        (TalosVersion::V1_13_9, vec![]),
        (
            TalosVersion::V1_14_0,
            vec![".machine.files is deprecated; use dedicated configuration documents instead"],
        ),
    ] {
        let sim = start(version, 0).await;
        let config = file(&sim, "controlplane.yaml")
            .replace("  certSANs: []\n", &format!("  certSANs: []\n{files}"));
        let applied = sim
            .admin()
            .apply_configuration(ApplyRequest::new(config, ApplyMode::Staged))
            .await
            .unwrap();
        assert_eq!(applied.warnings, expected, "{version:?}");
    }
}
