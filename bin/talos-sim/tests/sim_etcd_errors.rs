//! How the simulator's etcd calls fail, compared with Talos 1.13.9: which
//! errors EtcdLeaveCluster retries and for how long, what it answers when
//! etcd does not run, and which gRPC code each failure carries.

use talos_test_support as common;

use std::time::{Duration, Instant};

use common::sim::{SimCluster, wait_for};
use talos_client::Error;
use talos_sim::TalosTiming;
use talos_sim::etcd_client::EtcdClient;
use tonic::Code;

/// Upstream's schedule, made short enough for a test.
fn short_timing() -> TalosTiming {
    TalosTiming {
        leave_retry_interval: Duration::from_millis(200),
        leave_retry_limit: Duration::from_secs(2),
        local_member_wait: Duration::from_secs(1),
        ..TalosTiming::scaled_down(100)
    }
}

/// The simulator keeps upstream's schedule unless told otherwise.
#[test]
fn upstream_timing_is_the_default() {
    let cfg = talos_sim::SimConfig::isolated("/nonexistent", 1);
    assert_eq!(cfg.timing, TalosTiming::UPSTREAM);
    assert_eq!(
        TalosTiming::UPSTREAM.leave_retry_interval,
        Duration::from_secs(10)
    );
    assert_eq!(
        TalosTiming::UPSTREAM.leave_retry_limit,
        Duration::from_secs(300)
    );
    assert_eq!(
        TalosTiming::scaled_down(100).leave_retry_limit,
        Duration::from_secs(3)
    );
}

/// internal/pkg/etcd/etcd.go LeaveCluster: "unhealthy cluster" (removing a
/// voter while another is down) is retried until the limit, and the errors
/// come back as go-retry's set, Unknown since none carries a status.
#[tokio::test]
async fn leave_retries_an_unhealthy_cluster_until_the_limit() {
    let sim = SimCluster::start_with(3, |cfg| cfg.timing = short_timing()).await;
    let admin = sim.admin();
    let id = admin.node(sim.ip(1)).etcd_status().await.unwrap().member_id;
    sim.cluster.power_off(&sim.ip(3)).await.unwrap();

    let started = Instant::now();
    let err = admin
        .node(sim.ip(1))
        .etcd_leave_cluster()
        .await
        .unwrap_err();
    let Error::Status { code, failure } = err else {
        panic!("expected Unknown, got {err:?}");
    };
    assert_eq!(code, Code::Unknown);
    assert_eq!(
        failure.message,
        format!(
            "failed to leave cluster: 2 error(s) occurred:\n\tfailed to remove member {}: etcdserver: unhealthy cluster\n\ttimeout",
            id.0
        )
    );
    assert!(
        started.elapsed() >= short_timing().leave_retry_limit,
        "retried for {:?} only",
        started.elapsed()
    );
    // Nothing was removed: the member is still listed and etcd still runs.
    let members = admin.node(sim.ip(2)).etcd_member_list(false).await.unwrap();
    assert_eq!(members.len(), 3);
    assert!(sim.cluster.node("cp-1").unwrap().etcd_running().await);
}

/// internal/pkg/etcd/local.go GetLocalMemberID: without a running etcd the
/// call waits for the local member, then fails with the context's
/// DeadlineExceeded; forfeit does the same (unwrapped).
#[tokio::test]
async fn leave_and_forfeit_without_etcd_wait_then_fail_with_deadline_exceeded() {
    // Long enough a removal limit to outlast etcd's "unhealthy cluster"
    // while its members have been connected for less than 5 s.
    let timing = TalosTiming {
        leave_retry_limit: Duration::from_secs(20),
        ..short_timing()
    };
    let sim = SimCluster::start_with(3, |cfg| cfg.timing = timing).await;
    let leaver = sim.admin().node(sim.ip(3));
    leaver.etcd_leave_cluster().await.expect("first leave");

    let started = Instant::now();
    match leaver.etcd_leave_cluster().await {
        Err(Error::DeadlineExceeded(f)) => assert_eq!(
            f.message,
            "failed to leave cluster: failed to get local etcd member ID: context deadline exceeded"
        ),
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
    assert!(started.elapsed() >= short_timing().local_member_wait);
    match leaver.etcd_forfeit_leadership().await {
        Err(Error::DeadlineExceeded(f)) => assert_eq!(
            f.message,
            "failed to get local etcd member ID: context deadline exceeded"
        ),
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
}

/// v1alpha1_server.go's etcd handlers use `etcd.NewLocalClient`, whose
/// calls are sent with WaitForReady: on a node whose etcd is stopped (its
/// API up) they neither fail nor answer, and only the caller's deadline ends
/// them. The simulator answered Unavailable at once before.
#[tokio::test]
async fn local_etcd_calls_wait_for_etcd_until_the_callers_deadline() {
    let sim = SimCluster::start(3).await;
    let leaver = sim.admin().node(sim.ip(3));
    // The leaver leads, the case where the others must elect a leader
    // before they can answer: leadership is moved to it through etcd
    // (Talos's forfeit always hands it to the first other member).
    let own_id = leaver.etcd_status().await.expect("status").member_id;
    wait_for("cp-3 to lead", Duration::from_secs(30), || async {
        let leader = leaver.etcd_status().await.ok()?.leader;
        if leader == own_id {
            return Some(());
        }
        for name in ["cp-1", "cp-2"] {
            let url = sim.cluster.node(name).unwrap().etcd_client_url();
            let etcd = EtcdClient::connect(std::slice::from_ref(&url), &sim.cluster.etcd_pki())
                .await
                .ok()?;
            if etcd.status(&url).await.ok()?.header?.member_id == leader.0 {
                let _ = etcd.move_leader(&url, own_id.0).await;
            }
        }
        None
    })
    .await;
    leaver.etcd_leave_cluster().await.expect("leave");
    let deadline = Duration::from_secs(1);
    let quick = sim.admin().with_call_timeout(deadline).node(sim.ip(3));
    let started = Instant::now();
    match quick.etcd_status().await {
        Err(Error::DeadlineExceeded(_)) => {}
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
    assert!(started.elapsed() >= deadline);
    match quick.etcd_member_list(true).await {
        Err(Error::DeadlineExceeded(_)) => {}
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
    // The cluster-wide member list does not need the local etcd, but it
    // needs a leader: when the node that left was the leader, the two
    // remaining members elect a new one first, and until then each answers
    // Unavailable ("etcdserver: no leader"). A status would still name the
    // removed leader until the election, so a member list through node 1
    // is what shows the quorum answering again.
    let remaining = sim.admin().node(sim.ip(1));
    wait_for(
        "the remaining members to have a leader",
        Duration::from_secs(30),
        || async { remaining.etcd_member_list(false).await.ok().map(|_| ()) },
    )
    .await;
    let members = quick.etcd_member_list(false).await.expect("member list");
    assert_eq!(members.len(), 2);
}

/// v1alpha1_server.go EtcdMemberList returns the etcd client's error as is:
/// "etcdserver: no leader" is an rpctypes.EtcdError there, which carries no
/// status, so the client sees Unknown, not etcd's Unavailable. It comes
/// after the client's retries (client/v3 retry_interceptor.go).
#[tokio::test]
async fn member_list_without_a_leader_is_unknown_as_upstream() {
    let sim = SimCluster::start(3).await;
    let admin = sim.admin();
    sim.cluster.power_off(&sim.ip(2)).await.unwrap();
    sim.cluster.power_off(&sim.ip(3)).await.unwrap();
    let node = admin.node(sim.ip(1));
    wait_for(
        "node 1 to lose its leader",
        Duration::from_secs(30),
        || async { (node.etcd_status().await.ok()?.leader.0 == 0).then_some(()) },
    )
    .await;
    // etcd's client retries "no leader" (Unavailable) up to 100 times,
    // 25 ms apart per round: a caller whose deadline ends first sees its
    // deadline, not etcd's answer.
    let quick = admin
        .with_call_timeout(Duration::from_millis(300))
        .node(sim.ip(1));
    match quick.etcd_member_list(false).await {
        Err(Error::DeadlineExceeded(_)) => {}
        other => panic!("expected DeadlineExceeded while retrying, got {other:?}"),
    }
    let started = Instant::now();
    match node.etcd_member_list(false).await {
        Err(Error::Status { code, failure }) => {
            assert_eq!(
                (code, failure.message.as_str()),
                (Code::Unknown, "etcdserver: no leader")
            )
        }
        other => panic!("expected Unknown, got {other:?}"),
    }
    assert!(
        started.elapsed() >= Duration::from_millis(99 * 25 * 9 / 10 / 2),
        "answered after {:?}, without the client's retries",
        started.elapsed()
    );
}

/// v1alpha1_server.go EtcdMemberList lists through etcd's client, whose
/// MemberList is linearizable by default (go.etcd.io/etcd/client/v3
/// cluster.go, v3.6): with the two other members frozen, the remaining one
/// cannot confirm the membership with a quorum and the call fails, where a
/// serializable list would answer at once with what the member last saw.
#[tokio::test]
async fn member_list_is_linearizable_and_fails_without_a_quorum() {
    let sim = SimCluster::start_with(3, |cfg| cfg.timing = short_timing()).await;
    let admin = sim.admin();
    assert_eq!(
        admin
            .node(sim.ip(1))
            .etcd_member_list(true)
            .await
            .unwrap()
            .len(),
        3
    );
    for name in ["cp-2", "cp-3"] {
        assert!(sim.cluster.node(name).unwrap().freeze_etcd().await);
    }
    let started = Instant::now();
    let result = admin.node(sim.ip(1)).etcd_member_list(true).await;
    let err = result.expect_err("a member without a quorum answered the member list");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}: {err:?}",
        started.elapsed()
    );
    for name in ["cp-2", "cp-3"] {
        assert!(sim.cluster.node(name).unwrap().thaw_etcd().await);
    }
    // With the quorum back the same call answers again.
    wait_for("the member list", Duration::from_secs(30), || async {
        admin
            .node(sim.ip(1))
            .etcd_member_list(true)
            .await
            .ok()
            .filter(|m| m.len() == 3)
    })
    .await;
}
