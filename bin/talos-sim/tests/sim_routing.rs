//! apid-style routing and authorization on the simulator: `node` proxying,
//! `nodes` aggregation with a failed node, roles across the proxy hop, and
//! the TLS rules of apid.

use talos_test_support as common;

use std::time::Duration;

use common::sim::{SimCluster, wait_for};
use talos_client::Error;
use talos_sim::pki::{LeafSpec, Usage};
use tonic::Code;

#[tokio::test]
async fn aggregated_nodes_tag_each_answer_and_report_a_dead_node() {
    let sim = SimCluster::start(3).await;
    let admin = sim.admin();
    // Power node 3 off first.
    admin.node(sim.ip(3)).shutdown(true).await.unwrap();
    wait_for("node 3 to go down", Duration::from_secs(20), || async {
        admin
            .node(sim.ip(3))
            .hostname()
            .await
            .is_err()
            .then_some(())
    })
    .await;

    let replies = admin
        .aggregate([sim.ip(1), sim.ip(2), sim.ip(3)])
        .hostname()
        .await
        .expect("the call as a whole succeeds");
    assert_eq!(replies.len(), 3);
    let mut by_node: Vec<_> = replies
        .iter()
        .map(|r| (r.node.clone(), r.result.is_ok()))
        .collect();
    by_node.sort();
    assert_eq!(
        by_node,
        [(sim.ip(1), true), (sim.ip(2), true), (sim.ip(3), false)]
    );
    let dead = replies.iter().find(|r| r.node == sim.ip(3)).unwrap();
    match &dead.result {
        Err(Error::Unavailable(f)) => assert_eq!(f.node.as_deref(), Some(sim.ip(3).as_str())),
        other => panic!("expected Unavailable for the dead node, got {other:?}"),
    }
    let names: Vec<_> = replies
        .iter()
        .filter_map(|r| r.result.as_ref().ok().cloned())
        .collect();
    assert!(names.contains(&"cp-1".to_string()) && names.contains(&"cp-2".to_string()));
}

#[tokio::test]
async fn client_side_fan_out_answers_per_node() {
    let sim = SimCluster::start(2).await;
    let admin = sim.admin();
    // Fan-out on the client side returns one result per node.
    let versions = admin.nodes([sim.ip(1), sim.ip(2)]).version().await.unwrap();
    assert!(versions.iter().all(|v| v.result.is_ok()));
}

#[tokio::test]
async fn an_unknown_node_is_unavailable() {
    let sim = SimCluster::start(1).await;
    let err = sim
        .admin()
        .node("no-such-node")
        .version()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    // grpc-go's answer for a name its resolver finds no address for.
    assert!(
        err.to_string()
            .contains("name resolver error: produced zero addresses"),
        "{err}"
    );
}

/// apid (internal/app/apid/pkg/backend/apid.go, director.go): a node that
/// cannot be dialled answers with grpc-go's connection error, which names
/// the port; an empty target or one with a port fails the whole call.
#[tokio::test]
async fn dial_errors_name_the_port_and_bad_targets_fail_the_whole_call() {
    let sim = SimCluster::start(2).await;
    let admin = sim.admin();
    let port = sim.cluster.config().api_port;
    let nobody = sim.cluster.config().node_ip(200).to_string();
    let replies = admin
        .aggregate([sim.ip(1), nobody.clone()])
        .hostname()
        .await
        .expect("the call as a whole succeeds");
    let dead = replies.iter().find(|r| r.node == nobody).unwrap();
    let expected = format!(
        "connection error: desc = \"transport: Error while dialing: dial tcp {nobody}:{port}: connect: connection refused\""
    );
    match &dead.result {
        Err(Error::Unavailable(f)) => assert_eq!(f.message, expected),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    match admin.node(nobody.clone()).hostname().await {
        Err(Error::Unavailable(f)) => assert_eq!(f.message, expected),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // The same text when apid had a connection to the node before it died.
    assert_eq!(admin.node(sim.ip(2)).hostname().await.unwrap(), "cp-2");
    sim.cluster.power_off(&sim.ip(2)).await.unwrap();
    let expected = format!(
        "connection error: desc = \"transport: Error while dialing: dial tcp {}:{port}: connect: connection refused\"",
        sim.ip(2)
    );
    wait_for(
        "node 2's error to name its port",
        Duration::from_secs(20),
        || async {
            match admin.node(sim.ip(2)).hostname().await {
                Err(Error::Unavailable(f)) if f.message == expected => Some(()),
                _ => None,
            }
        },
    )
    .await;

    for bad in [format!("{}:{port}", sim.ip(1)), String::new()] {
        let invalid = format!("invalid target {bad:?}");
        match admin.aggregate([sim.ip(1), bad.clone()]).hostname().await {
            Err(Error::Status { code, failure }) => {
                assert_eq!(
                    (code, failure.message.as_str()),
                    (Code::Internal, invalid.as_str())
                )
            }
            other => panic!("expected Internal for {bad:?}, got {other:?}"),
        }
        match admin.node(bad.clone()).hostname().await {
            Err(Error::Status { code, failure }) => {
                assert_eq!(
                    (code, failure.message.as_str()),
                    (Code::Internal, invalid.as_str())
                )
            }
            other => panic!("expected Internal for {bad:?}, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn roles_are_enforced_on_the_target_node_through_the_proxy() {
    let sim = SimCluster::start(2).await;
    let reader = sim.client_from("talosconfig-reader");
    // Proxied from node 1 to node 2: node 2 sees the reader's role.
    match reader.node(sim.ip(2)).etcd_leave_cluster().await {
        Err(Error::PermissionDenied(f)) => assert_eq!(f.message, "not authorized"),
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    assert_eq!(reader.node(sim.ip(2)).hostname().await.unwrap(), "cp-2");
    assert_eq!(reader.etcd_member_list(false).await.unwrap().len(), 2);

    let backup = sim.client_from("talosconfig-backup");
    assert!(matches!(
        backup.version().await,
        Err(Error::PermissionDenied(_))
    ));
    let stream = backup
        .node(sim.ip(2))
        .etcd_snapshot()
        .await
        .expect("etcd:backup may snapshot");
    let path = sim.dir.path().join("b.db");
    assert!(
        talos_test_support::stream_to_file(stream, &path)
            .await
            .unwrap()
            > 0
    );
    // Aggregated: each node's refusal becomes that node's error.
    let replies = backup
        .aggregate([sim.ip(1), sim.ip(2)])
        .hostname()
        .await
        .unwrap();
    assert!(
        replies
            .iter()
            .all(|r| matches!(r.result, Err(Error::PermissionDenied(_))))
    );
}

#[tokio::test]
async fn client_certificates_need_exactly_client_auth() {
    let sim = SimCluster::start(1).await;
    let both = sim
        .cluster
        .issue_client(&LeafSpec::client(&["os:admin"]).usage(Usage::Both))
        .unwrap();
    let client = talos_client::Client::builder()
        .endpoints([sim.cluster.nodes()[0].api.clone()])
        .credentials(both)
        .read_attempts(1)
        .build()
        .unwrap();
    let err = client.version().await.unwrap_err();
    assert!(matches!(err, Error::Unauthenticated(_)), "{err:?}");
}
