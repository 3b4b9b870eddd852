//! The client's COSI calls against the simulator: per-node results of a
//! multi-node client, generic reads, definitions, and a watch of a whole
//! type.

use talos_test_support as common;

use std::time::Duration;

use common::sim::SimCluster;
use futures::StreamExt as _;
use talos_client::Error;
use talos_client::client::resources::{ConfigId, EventKind, types};

#[tokio::test]
async fn fan_out_gives_each_node_its_own_result() {
    let sim = SimCluster::start(2).await;
    let nodes = [sim.ip(1), sim.ip(2), "10.255.255.1".to_string()];
    let replies = sim
        .admin()
        .nodes(nodes.clone())
        .resources()
        .machine_status()
        .await
        .unwrap();
    let names: Vec<_> = replies.iter().map(|r| r.node.as_str()).collect();
    assert_eq!(names, nodes.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(replies[0].result.as_ref().unwrap().ready);
    assert!(replies[1].result.as_ref().unwrap().ready);
    // A node apid cannot reach is that node's error, attributed to it.
    let error = replies[2].result.as_ref().unwrap_err();
    assert_eq!(error.node(), Some("10.255.255.1"));

    // The same through apid's `nodes` style target: still one call per node.
    let replies = sim
        .admin()
        .aggregate([sim.ip(1), sim.ip(2)])
        .resources()
        .machine_config(ConfigId::Persistent)
        .await
        .unwrap();
    assert_eq!(replies.len(), 2);
    assert!(
        replies
            .iter()
            .all(|r| r.result.as_ref().is_ok_and(|c| c.id == "persistent"))
    );
}

#[tokio::test]
async fn generic_reads_definitions_and_a_kind_watch() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let definitions = client.resources().definitions().await.unwrap();
    let mc = definitions
        .iter()
        .find(|d| d.resource_type == types::MACHINE_CONFIG)
        .unwrap();
    assert!(mc.sensitive);
    assert!(mc.all_aliases.iter().any(|a| a == "mc"));
    let services = client
        .resources()
        .list(types::RUNTIME_NAMESPACE, types::SERVICE)
        .await
        .unwrap();
    assert!(
        services
            .iter()
            .any(|r| r.metadata.id == "etcd" && !r.spec_proto.is_empty())
    );
    let value = services[0].spec_value().unwrap();
    assert!(value.get("running").is_some(), "{value:?}");

    // A whole type: current contents, then the marker.
    let mut watch = client
        .resources()
        .watch(types::RUNTIME_NAMESPACE, types::SERVICE, None)
        .await
        .unwrap();
    let mut created = 0;
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match event.kind {
            EventKind::Created => created += 1,
            EventKind::Bootstrapped => break,
            other => panic!("unexpected {other:?} before the marker"),
        }
    }
    assert_eq!(created, services.len());
    // Stopping etcd is seen as the etcd service going away.
    sim.cluster.node("cp-1").unwrap().stop_etcd().await;
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let event = watch.next().await.unwrap().unwrap();
            if event.kind == EventKind::Destroyed {
                return event.resource.unwrap().metadata.id;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(gone, "etcd");
    let missing = client.resources().etcd_member().await;
    assert!(matches!(missing, Err(Error::NotFound(_))), "{missing:?}");
}
