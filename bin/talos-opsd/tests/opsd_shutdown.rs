//! Shutdown refuses new starts before it parks running work, as one step:
//! a start that is still planning when SIGTERM comes is refused
//! (`UNAVAILABLE`, the daemon is shutting down) or journaled and parked at
//! a step boundary, never answered OK and then cut in the middle of a step.

mod daemon;

use std::time::Duration;

use daemon::{Daemon, cluster_toml, talosconfig_with_endpoint};
use talos_client::ops::{Journal, OpState, StepState};
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::SimCluster;

#[tokio::test]
async fn a_start_still_planning_at_sigterm_is_refused_or_parked_never_cut() {
    let sim = SimCluster::start(3).await;
    sim.cluster
        .fill("/registry/test/", 200, 4096)
        .await
        .unwrap();
    // A slow plan: the first endpoint accepts and says nothing for 2 s,
    // then closes (and refuses from then on), so the client fails over.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = silent.local_addr().unwrap().to_string();
    let (accepted_tx, accepted_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (conn, _) = silent.accept().await.unwrap();
        drop(silent);
        let _ = accepted_tx.send(());
        tokio::time::sleep(Duration::from_secs(2)).await;
        drop(conn);
    });
    let dir = tempfile::tempdir().unwrap();
    let tc = dir.path().join("talosconfig");
    talosconfig_with_endpoint(&sim.dir.path().join("talosconfig"), &tc, &endpoint, false);
    let mut d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    let mut client = d.client().await;
    let start = tokio::spawn(async move {
        client
            .start_operation(proto::StartOperationRequest {
                cluster: "a".into(),
                plan_fingerprint: String::new(),
                without_cluster_lock: true,
                kind: Some(Kind::Snapshot(proto::SnapshotParams { keep: 0 })),
            })
            .await
    });
    tokio::time::timeout(Duration::from_secs(30), accepted_rx)
        .await
        .expect("the plan reached the slow endpoint")
        .unwrap();
    // The start is planning now.
    assert_eq!(
        d.signal_and_wait(libc::SIGTERM).await,
        Some(0),
        "{}",
        d.log_text()
    );
    let answer = start.await.unwrap();
    let log = d.log_text();
    let journal = Journal::open(&dir.path().join("state")).unwrap();
    let records = journal.list(None).unwrap();
    for record in &records {
        assert!(
            record.steps.iter().all(|s| s.state != StepState::Running),
            "cut in the middle of a step: {record:?}\n{log}"
        );
    }
    match answer {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            assert!(
                status.message().contains("shutting down"),
                "{status:?}\n{log}"
            );
            assert!(records.is_empty(), "{records:?}");
        }
        Ok(op) => {
            // Journaled before the shutdown began: parked at a boundary,
            // to be resumed by the next start.
            let op = op.into_inner();
            let record = journal.get(&op.id).unwrap();
            assert_eq!(record.state, OpState::Running, "{record:?}");
            assert!(log.contains("parked"), "{log}");
        }
    }
    let stopping = log
        .find("stopping: no new work")
        .expect("the shutdown line");
    assert!(
        !log[stopping..].lines().any(|l| l.contains("start snapshot")
            && l.contains("result=\"ok\"")
            && !log.contains("parked")),
        "a start accepted after the shutdown began:\n{log}"
    );
}
