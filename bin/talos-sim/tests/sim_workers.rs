//! Worker nodes: configured, with an API, without etcd; from the start
//! (`SimConfig::workers`) or from maintenance mode with worker.yaml.

use talos_test_support as common;

use std::time::Duration;

use common::sim::{SimCluster, wait_for};
use talos_client::client::{ApplyMode, ApplyRequest};
use talos_client::config::{Overrides, TalosConfig};
use talos_client::maintenance::MaintenanceClient;
use talos_client::{Client, Error};
use talos_sim::{Cluster, SimConfig};

fn admin(dir: &std::path::Path) -> Client {
    let path = dir.join("talosconfig");
    let context = TalosConfig::read(&path)
        .unwrap()
        .resolve(&Overrides::default(), &path)
        .unwrap();
    Client::from_context(&context).unwrap()
}

#[tokio::test]
async fn workers_answer_through_apid_and_have_no_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SimConfig::isolated(dir.path(), 1);
    cfg.workers = 2;
    let cluster = Cluster::up(cfg).await.unwrap();
    let nodes = cluster.nodes();
    assert_eq!(
        nodes
            .iter()
            .map(|n| (n.name.as_str(), n.worker))
            .collect::<Vec<_>>(),
        [("cp-1", false), ("worker-1", true), ("worker-2", true)]
    );
    // Workers are no talosconfig endpoints.
    let text = std::fs::read_to_string(dir.path().join("talosconfig")).unwrap();
    assert!(!text.contains(&nodes[1].ip.to_string()), "{text}");

    let client = admin(dir.path());
    let worker = client.node(nodes[1].ip.to_string());
    assert_eq!(worker.hostname().await.unwrap(), "worker-1");
    let services = worker.service_list().await.unwrap();
    assert!(services.iter().all(|s| s.id != "etcd"), "{services:?}");
    match worker.etcd_member_list(false).await {
        Err(Error::Unimplemented(f)) => {
            assert!(
                f.message.contains("only available on control plane nodes"),
                "{f:?}"
            )
        }
        other => panic!("expected Unimplemented, got {other:?}"),
    }
    let members = client.etcd_member_list(false).await.unwrap();
    assert_eq!(members.len(), 1);
    // One call fans out to every node.
    let all: Vec<String> = nodes.iter().map(|n| n.ip.to_string()).collect();
    let versions = client.nodes(all).version().await.unwrap();
    assert_eq!(versions.len(), 3);
    assert!(versions.iter().all(|v| v.result.is_ok()), "{versions:?}");
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_maintenance_node_given_worker_yaml_becomes_a_worker() {
    let sim = SimCluster::start(1).await;
    let added = sim.cluster.add_maintenance_node().await.unwrap();
    let fingerprint = added.maintenance_fingerprint.clone().unwrap();
    let worker_yaml = std::fs::read(sim.dir.path().join("worker.yaml")).unwrap();
    assert!(
        !String::from_utf8_lossy(&worker_yaml).contains("key: "),
        "no CA key for workers"
    );
    MaintenanceClient::pinned(&added.api, &[&fingerprint])
        .unwrap()
        .apply_configuration(ApplyRequest::new(worker_yaml, ApplyMode::Auto))
        .await
        .unwrap();
    let client = sim.admin();
    let node = client.node(added.ip.to_string());
    wait_for(
        "the worker's API with mTLS",
        Duration::from_secs(30),
        || async { node.hostname().await.ok() },
    )
    .await;
    assert!(
        node.service_list()
            .await
            .unwrap()
            .iter()
            .all(|s| s.id != "etcd")
    );
    assert_eq!(client.etcd_member_list(false).await.unwrap().len(), 1);
    assert!(sim.cluster.nodes()[1].worker);
}
