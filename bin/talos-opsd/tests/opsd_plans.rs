//! PlanOperation is read-only and takes no lock: any number of plans
//! answer at once, and a plan of a cluster that does not answer holds
//! nothing while it waits (the lock belongs to a start). A plan's
//! fingerprint covers what a confirmation is about, not numbers that
//! change by themselves: a busy cluster's defragmentation, confirmed once,
//! runs.

mod daemon;

use std::time::Duration;

use daemon::{Daemon, cluster_fingerprint, cluster_toml, talosconfig_with_endpoint};
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::SimCluster;

fn snapshot(cluster: &str) -> proto::StartOperationRequest {
    proto::StartOperationRequest {
        cluster: cluster.into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(Kind::Snapshot(proto::SnapshotParams { keep: 0 })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_plans_all_answer() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    // Several connections, as many callers would have.
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(d.client().await);
    }
    // Each plan reads the whole cluster (every member's status through
    // one simulator process): 200 at once still finds a plan that holds a
    // lock (199 of them were refused ABORTED), and stays within the calls'
    // deadlines on a loaded 2-core machine, where 500 did not.
    let plans = (0..200).map(|i| {
        let mut client = clients[i % clients.len()].clone();
        async move { client.plan_operation(snapshot("a")).await }
    });
    let answers = futures::future::join_all(plans).await;
    let refused: Vec<_> = answers
        .iter()
        .filter_map(|a| a.as_ref().err())
        .map(|s| format!("{:?}: {}", s.code(), s.message()))
        .collect();
    assert!(
        refused.is_empty(),
        "{} of 200 plans refused, e.g. {:?}",
        refused.len(),
        refused.first()
    );
    let mut fingerprints = std::collections::BTreeMap::<String, usize>::new();
    for answer in answers {
        *fingerprints
            .entry(answer.unwrap().into_inner().fingerprint)
            .or_default() += 1;
    }
    // One cluster, one plan: a member's health read at a slow moment may
    // change a few (health is in the fingerprint on purpose), a fingerprint
    // that covered something changing by itself would change most.
    let most = fingerprints.values().max().copied().unwrap_or(0);
    assert!(most >= 180, "{fingerprints:?}");
    // Nothing was journaled, and a start is not held off by them.
    let op = clients[0]
        .start_operation(snapshot("a"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.until_ended(&op.id).await.state, "succeeded");
}

#[tokio::test]
async fn a_plan_of_a_silent_cluster_holds_no_lock() {
    let sim = SimCluster::start(1).await;
    // The cluster's only endpoint accepts connections and says nothing.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = silent.local_addr().unwrap().to_string();
    let (accepted_tx, mut accepted_rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            held.push(conn);
            let _ = accepted_tx.send(()).await;
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let tc = dir.path().join("talosconfig");
    talosconfig_with_endpoint(&sim.dir.path().join("talosconfig"), &tc, &endpoint, true);
    let d = Daemon::start(dir.path(), &cluster_toml("s", &tc, "")).await;
    let mut client = d.client().await;
    let plan = tokio::spawn(async move { client.plan_operation(snapshot("s")).await });
    tokio::time::timeout(Duration::from_secs(30), accepted_rx.recv())
        .await
        .expect("the plan reached the silent endpoint");
    // While the plan waits on the cluster, its lock is free: another
    // process (here, this test) takes it at once.
    let state = dir.path().join("state");
    let fingerprint = cluster_fingerprint(&tc, &state);
    let lock = talos_client::ops::ClusterLock::acquire(&state, &fingerprint, "test");
    assert!(
        lock.is_ok(),
        "a plan holds the cluster's lock: {:?}",
        lock.err()
    );
    assert!(!plan.is_finished(), "the plan still waits on the cluster");
    plan.abort();
}

/// Sizes change by themselves on a cluster that is written to; a plan's
/// fingerprint does not, so the defragmentation confirmed runs.
#[tokio::test]
async fn a_busy_clusters_defrag_confirmed_once_runs() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    let mut client = d.client().await;
    let request = proto::StartOperationRequest {
        cluster: "a".into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(Kind::Defrag(proto::DefragParams {
            all: true,
            ..Default::default()
        })),
    };
    let plan = client
        .plan_operation(request.clone())
        .await
        .unwrap()
        .into_inner();
    // Writes between the plan shown and the start: every database grows.
    sim.cluster
        .fill("/registry/busy/", 300, 4096)
        .await
        .unwrap();
    let again = client
        .plan_operation(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_ne!(again.facts_json, plan.facts_json, "the sizes changed");
    assert_eq!(again.fingerprint, plan.fingerprint);
    let op = client
        .start_operation(proto::StartOperationRequest {
            plan_fingerprint: plan.fingerprint.clone(),
            ..request
        })
        .await
        .expect("the confirmed plan runs")
        .into_inner();
    assert_eq!(d.until_ended(&op.id).await.state, "succeeded");
}
