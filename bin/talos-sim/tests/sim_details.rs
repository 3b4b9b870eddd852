//! Smaller differences with Talos 1.13.9, each as upstream behaves: the
//! code of a failure to persist an applied configuration, and a snapshot
//! that etcd refuses.

use talos_test_support as common;

use std::time::Duration;

use common::sim::SimCluster;
use talos_client::client::{ApplyMode, ApplyRequest};
use talos_sim::TalosTiming;

async fn start() -> SimCluster {
    SimCluster::start_with(1, |cfg| cfg.timing = TalosTiming::scaled_down(10)).await
}

/// The handler returns the state's error as is, which grpc-go sends as
/// Unknown (v1alpha1_server.go, ApplyConfiguration).
#[tokio::test]
async fn a_failure_to_persist_the_configuration_is_unknown() {
    let sim = start().await;
    let node = sim.cluster.node("cp-1").unwrap();
    // The configuration's file made a non-empty directory: it cannot be
    // replaced.
    let path = node.config_path();
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir_all(path.join("in-the-way")).unwrap();
    let config = std::fs::read_to_string(sim.dir.path().join("controlplane.yaml")).unwrap();
    let err = sim
        .admin()
        .apply_configuration(ApplyRequest::new(config, ApplyMode::NoReboot))
        .await
        .expect_err("the configuration cannot be persisted");
    assert_eq!(err.code(), Some(tonic::Code::Unknown), "{err:?}");
    assert!(
        err.failure()
            .is_some_and(|f| f.message.starts_with("failed to persist config: ")),
        "{err:?}"
    );
}

fn etcdctl(sim: &SimCluster, endpoint: &str, args: &[&str]) {
    let output = sim
        .cluster
        .etcdctl()
        .expect("the etcd release is built")
        .arg("--endpoints")
        .arg(endpoint)
        .args(args)
        .output()
        .expect("etcdctl runs");
    assert!(
        output.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// etcd's Go client opens the snapshot stream without waiting, so a
/// refusal arrives as a read error: the chunker ends the stream and the
/// call is OK with no data (client/v3 maintenance.go, Snapshot;
/// v1alpha1_server.go, EtcdSnapshot; pkg/chunker/stream).
#[tokio::test]
async fn a_snapshot_etcd_refuses_at_open_is_ok_with_no_data() {
    let sim = start().await;
    let node = sim.cluster.node("cp-1").unwrap();
    let endpoint = node.etcd_client_url();
    // With authentication on, etcd refuses a snapshot without credentials
    // before sending anything ("auth: user name is empty").
    etcdctl(&sim, &endpoint, &["role", "add", "root"]);
    etcdctl(&sim, &endpoint, &["user", "add", "root:sim-root"]);
    etcdctl(&sim, &endpoint, &["user", "grant-role", "root", "root"]);
    etcdctl(&sim, &endpoint, &["auth", "enable"]);
    let client = sim
        .admin()
        .with_call_timeout(Duration::from_secs(30))
        .node(sim.ip(1));
    let stream = client.etcd_snapshot().await.expect("the call is answered");
    let path = sim.dir.path().join("refused.db");
    let size = common::stream_to_file(stream, &path)
        .await
        .expect("no error reaches the client");
    assert_eq!(size, 0);
}
