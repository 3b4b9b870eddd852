//! Each profile as it ships: a cluster started from the configuration the
//! simulator generates (as `talosctl gen config` of that release writes
//! it) runs its API server against the etcd release that Talos runs, and
//! the admin kubeconfig the node serves is one kubectl reads. Needs the
//! kube-apiserver (`scripts/kube-apiserver.sh`), the etcd releases
//! (`scripts/etcd.sh all`) and kubectl.

use talos_test_support as common;

use std::time::Duration;

use common::sim::{SimCluster, wait_for};
use talos_sim::TalosVersion;

async fn start_on(version: TalosVersion) -> SimCluster {
    let binary = common::sim::kube_apiserver_binary();
    SimCluster::start_with(1, |cfg| {
        cfg.timing = talos_sim::TalosTiming::scaled_down(common::sim::timing_divisor());
        cfg.talos_version = version;
        cfg.kube_apiserver = Some(binary);
    })
    .await
}

/// `kubectl --kubeconfig PATH ARGS`: (success, stdout, stderr).
fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--request-timeout", "10s"])
        .args(args)
        .output()
        .expect("kubectl is installed");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Starts `version`'s profile, waits for the API server through kubectl
/// with the kubeconfig the node serves, and returns the flags it runs
/// with.
async fn api_server_ready_through_kubectl(version: TalosVersion) -> (SimCluster, Vec<String>) {
    let sim = start_on(version).await;
    let node = sim.cluster.node("cp-1").unwrap();
    assert_eq!(
        sim.admin().etcd_status().await.unwrap().protocol_version,
        version.etcd_release().version(),
        "the etcd release {} runs",
        version.tag()
    );
    let args = node.kube_apiserver_args().unwrap_or_else(|| {
        panic!(
            "{}: the generated configuration starts no API server",
            version.tag()
        )
    });
    let yaml = sim
        .admin()
        .kubeconfig()
        .await
        .expect("the node serves a kubeconfig");
    let path = sim.dir.path().join("kubeconfig");
    std::fs::write(&path, &yaml).unwrap();
    wait_for(
        &format!("{}: kubectl get --raw /readyz", version.tag()),
        Duration::from_secs(180),
        || async {
            let (ok, out, _) = kubectl(&path, &["get", "--raw", "/readyz"]);
            (ok && out.trim() == "ok").then_some(())
        },
    )
    .await;
    let (ok, out, err) = kubectl(&path, &["get", "namespaces", "-o", "name"]);
    assert!(ok, "{}: kubectl get namespaces: {err}", version.tag());
    assert!(out.contains("namespace/kube-system"), "{out}");
    let (ok, out, err) = kubectl(
        &path,
        &[
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.contexts[0].name}",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out, "admin@talos-sim");
    (sim, args)
}

#[tokio::test]
async fn the_1_13_9_profile_runs_its_api_server_on_etcd_3_6_and_kubectl_reads_its_kubeconfig() {
    let (sim, args) = api_server_ready_through_kubectl(TalosVersion::V1_13_9).await;
    assert!(
        args.contains(&"--tls-min-version=VersionTLS12".to_string()),
        "{args:?}"
    );
    let node = sim.cluster.node("cp-1").unwrap();
    let etcd = format!("--etcd-servers={}", node.etcd_client_url());
    assert!(etcd.starts_with("--etcd-servers=https://"), "{etcd}");
    assert!(args.contains(&etcd), "{args:?}");
    for flag in ["etcd-cafile", "etcd-certfile", "etcd-keyfile"] {
        assert!(
            args.iter().any(|a| a.starts_with(&format!("--{flag}="))),
            "--{flag} missing from {args:?}"
        );
    }
}

/// 1.14's generated configuration carries the service-account key in a
/// KubeServiceAccountConfig document, not in `cluster.serviceAccount`
/// (pkg/machinery/config/generate at v1.14.0-rc.1): the API server starts
/// from it, with TLS 1.3 at least, and the node serves its kubeconfig
/// from a configuration of several documents.
#[tokio::test]
async fn the_1_14_profile_runs_its_api_server_from_the_generated_service_account_document() {
    let (sim, args) = api_server_ready_through_kubectl(TalosVersion::V1_14_0).await;
    let config = sim.cluster.node("cp-1").unwrap().active_config();
    assert!(
        config.contains("\n---\napiVersion: v1alpha1\nkind: KubeServiceAccountConfig\n"),
        "{config}"
    );
    assert!(!config.contains("serviceAccount:"), "{config}");
    let endpoint = format!("https://{}:6443", sim.ip(1));
    for flag in [
        format!("--service-account-issuer={endpoint}"),
        format!("--api-audiences={endpoint}"),
        "--tls-min-version=VersionTLS13".to_string(),
    ] {
        assert!(args.contains(&flag), "{flag} not in {args:?}");
    }
    // The worker configuration carries no control-plane document.
    let worker = std::fs::read_to_string(sim.dir.path().join("worker.yaml")).unwrap();
    assert!(!worker.contains("KubeServiceAccountConfig"), "{worker}");
}
