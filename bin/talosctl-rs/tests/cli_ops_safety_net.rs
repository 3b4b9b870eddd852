//! A retire when the network, not etcd, goes wrong, on the simulator (real
//! etcd) with injected faults: a survivor cut off while it runs, the
//! retired node cut off between its leave and its reset, and a leave that
//! lands after the client's deadline. Silence is never taken as a reset,
//! and a leave nobody can confirm is never taken as failed.

use std::time::Duration;

use talos_client::ops::{OpSpec, OpsError, RetireOptions};
use talos_test_support::sim::wait_for;

mod ops_fixture;

use ops_fixture::{Fixture, newest, retire_killed_after_leave};

/// `(name, state)` of every step of a journal record.
fn step_states(record: &serde_json::Value) -> Vec<(String, String)> {
    record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The detail of step `name` of a journal record.
fn detail<'a>(record: &'a serde_json::Value, name: &str) -> &'a str {
    record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .and_then(|s| s["detail"].as_str())
        .unwrap_or_default()
}

/// A survivor whose API was cut off after the plan (it keeps running, its
/// etcd keeps voting) stops the retire at the fresh check: nobody can say
/// it is healthy, so nothing is changed.
#[tokio::test]
async fn a_partitioned_survivor_stops_the_retire_at_the_check() {
    let f = Fixture::start(3).await;
    let (mut ops, plan, cut) = f.plan_retire_with_bystander().await;
    let name = f.sim.cluster.node(&cut).unwrap().name.clone();
    assert!(f.sim.cluster.partition(&cut).await.unwrap(), "{cut} is up");
    let result = ops.run(plan, &mut |_| {}).await;
    assert!(f.sim.cluster.heal(&cut).await.unwrap());
    match &result {
        Err(OpsError::StepFailed { step, reason }) => {
            assert_eq!(step, "check", "{reason}");
            assert!(
                reason.contains(&name) || reason.contains(&cut),
                "names the node cut off: {reason}"
            );
        }
        other => panic!("expected the check to fail, got {other:?}"),
    }
    let record = newest(&f).await;
    assert_eq!(record["state"], "failed", "{record}");
    assert_eq!(
        step_states(&record)[..3],
        [
            ("snapshot".into(), "done".into()),
            ("check".into(), "failed".into()),
            ("forfeit".into(), "pending".into()),
        ],
        "{record}"
    );
    assert_eq!(f.voters(1).await, ["cp-1", "cp-2", "cp-3"]);
}

/// The process dies after the leave answered, before the reset; then the
/// node's API is cut off while it runs (out of etcd, its API server still
/// up: the field reports' second surprise). `ops resume` must not count its
/// silence as a reset while the survivors' discovery still lists it: it
/// needs attention. Once the node is reachable again, the resume sends the
/// reset and the retire ends.
#[tokio::test]
async fn a_silent_node_still_in_discovery_is_not_counted_as_reset() {
    let f = Fixture::start(3).await;
    let target = f.sim.ip(2);
    let id = retire_killed_after_leave(&f, &target).await;
    assert_eq!(
        f.voters(1).await,
        ["cp-1", "cp-3"],
        "the leave went through"
    );
    assert!(f.sim.cluster.partition(&target).await.unwrap());

    let resumed = f.ops(&["resume", &id]).await;
    assert_ne!(resumed.code, 0, "{}", resumed.stdout);
    assert!(
        resumed.stderr.contains("needs attention") && resumed.stderr.contains("discovery"),
        "{}",
        resumed.stderr
    );
    let shown = f.ops(&["show", &id]).await.ok().json();
    assert_eq!(shown["state"], "needs-attention", "{shown}");
    // The node was not reset: back on the network, it still runs with the
    // cluster's configuration.
    assert!(f.sim.cluster.heal(&target).await.unwrap());
    let node = f.sim.cluster.node(&target).unwrap();
    assert!(node.is_configured(), "cp-2 was not reset");
    f.sim.admin().node(target.as_str()).version().await.unwrap();

    let resumed = f.ops(&["resume", &id]).await.ok().json();
    assert_eq!(resumed["state"], "succeeded", "{resumed}");
    assert!(
        detail(&resumed, "reset").contains("reset accepted"),
        "{resumed}"
    );
    assert!(!node.is_configured(), "cp-2 was reset");
    assert_eq!(f.voters(1).await, ["cp-1", "cp-3"]);
}

/// The leave lands 6 s after it is sent, past the client's 2 s deadline:
/// the retire asks a survivor, finds the member gone, and resets the node
/// at once, instead of calling the leave failed and leaving an API server
/// without etcd running.
#[tokio::test]
async fn a_leave_past_the_client_deadline_is_settled_and_the_reset_follows() {
    let f = Fixture::start(3).await;
    let target = f.sim.ip(2);
    let mut ops = f.open_ops();
    ops.set_leave_timeouts(Duration::from_secs(2), Duration::from_secs(30));
    let plan = ops
        .plan(&OpSpec::Retire(RetireOptions::new(target.clone())))
        .await
        .unwrap();
    let node = f.sim.cluster.node(&target).unwrap();
    node.delay_next_leave(Duration::from_secs(6));
    ops.run(plan, &mut |_| {}).await.unwrap();
    let record = newest(&f).await;
    assert_eq!(record["state"], "succeeded", "{record}");
    let leave = detail(&record, "leave");
    assert!(
        leave.contains("no longer lists") && leave.contains("deadline exceeded"),
        "{record}"
    );
    assert!(
        detail(&record, "reset").contains("reset accepted"),
        "{record}"
    );
    assert!(!node.is_configured(), "cp-2 was reset");
    assert_eq!(f.voters(1).await, ["cp-1", "cp-3"]);
}

/// A leave still pending when the settling time ends is neither done nor
/// failed: the retire needs attention and blocks the cluster. When the leave
/// lands, `ops resume` finds the member gone and sends the reset.
#[tokio::test]
async fn a_leave_still_pending_after_settling_needs_attention() {
    let f = Fixture::start(3).await;
    let target = f.sim.ip(2);
    let mut ops = f.open_ops();
    ops.set_leave_timeouts(Duration::from_secs(1), Duration::from_secs(2));
    let plan = ops
        .plan(&OpSpec::Retire(RetireOptions::new(target.clone())))
        .await
        .unwrap();
    let node = f.sim.cluster.node(&target).unwrap();
    node.delay_next_leave(Duration::from_secs(10));
    match ops.run(plan, &mut |_| {}).await {
        Err(OpsError::NeedsAttention { step, reason }) => {
            assert_eq!(step, "leave", "{reason}");
            assert!(reason.contains("still listed"), "{reason}");
        }
        other => panic!("expected needs-attention, got {other:?}"),
    }
    drop(ops);
    let record = newest(&f).await;
    let id = record["id"].as_str().unwrap().to_string();
    assert_eq!(record["state"], "needs-attention", "{record}");
    assert!(node.is_configured(), "no reset was sent");
    let blocked = f.ops(&["--yes", "snapshot"]).await;
    assert_ne!(blocked.code, 0);
    assert!(blocked.stderr.contains(&id), "{}", blocked.stderr);

    wait_for(
        "the late leave to land",
        Duration::from_secs(60),
        || async { (f.voters(1).await.len() == 2).then_some(()) },
    )
    .await;
    let resumed = f.ops(&["resume", &id]).await.ok().json();
    assert_eq!(resumed["state"], "succeeded", "{resumed}");
    assert!(
        detail(&resumed, "leave").contains("reconciled"),
        "{resumed}"
    );
    assert!(!node.is_configured(), "cp-2 was reset");
    assert_eq!(f.voters(1).await, ["cp-1", "cp-3"]);
}
