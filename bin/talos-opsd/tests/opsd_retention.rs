//! Retention never removes a snapshot that an operation which has not
//! succeeded took as its safety copy, nor the cluster's newest.

mod daemon;

use std::path::PathBuf;

use daemon::{Daemon, cluster_toml};
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::SimCluster;

fn start(kind: Kind) -> proto::StartOperationRequest {
    proto::StartOperationRequest {
        cluster: "a".into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(kind),
    }
}

/// A retire takes its safety snapshot, then fails its fresh check (the
/// daemon dies as the check starts; a survivor's etcd is frozen before the
/// restart resumes it). A snapshot with keep=1 into the same directory
/// afterwards leaves the failed retire's copy in place.
#[tokio::test]
async fn keep_one_spares_a_failed_retires_safety_snapshot() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let mut d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &tc, ""),
        &[("TALOS_OPSD_TEST_CRASH", "started:check")],
        &[],
    )
    .await;
    let target = sim.ip(3);
    let mut client = d.client().await;
    let _ = client
        .start_operation(start(Kind::Retire(proto::RetireParams {
            node: target.clone(),
            ..Default::default()
        })))
        .await;
    assert!(!d.wait_exit().await.success());
    let journal = talos_client::ops::Journal::open(&dir.path().join("state")).unwrap();
    let retire = journal.list(None).unwrap().remove(0);
    drop(journal);
    let safety = PathBuf::from(
        retire.facts["snapshot"]
            .as_str()
            .expect("a safety snapshot"),
    );
    let source = retire.facts["source"]["address"]
        .as_str()
        .unwrap()
        .to_string();
    let frozen = (1..=3)
        .map(|i| sim.ip(i))
        .find(|ip| *ip != target && *ip != source)
        .unwrap();
    let node = sim.cluster.node(&frozen).unwrap();
    assert!(node.freeze_etcd().await);
    d.set_env(&[]);
    d.spawn().await;
    let failed = d.until_ended(&retire.id).await;
    assert!(node.thaw_etcd().await);
    assert_eq!(failed.state, "failed", "{failed:?}");
    assert!(safety.exists(), "{}", safety.display());

    let mut client = d.client().await;
    let snap = client
        .start_operation(start(Kind::Snapshot(proto::SnapshotParams { keep: 1 })))
        .await
        .unwrap()
        .into_inner();
    let done = d.until_ended(&snap.id).await;
    assert_eq!(done.state, "succeeded", "{done:?}");
    assert!(
        safety.exists(),
        "retention removed the failed retire's safety snapshot: {done:?}"
    );
    assert!(PathBuf::from(format!("{}.json", safety.display())).exists());
    let retention = done.steps.iter().find(|s| s.name == "retention").unwrap();
    assert_eq!(retention.detail, "nothing to remove", "{retention:?}");
}
