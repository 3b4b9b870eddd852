//! `ops join` on the simulator with upstream's own timings (no divisor):
//! the learner is promoted after the 15 s retry of Talos's etcd service
//! (internal/app/machined/pkg/system/services/etcd.go, promoteMember), and
//! the join's gate does not pass while the new member's etcd service is
//! unhealthy (its health check is a linearizable read every 20 s, which a
//! learner refuses; HealthFunc, HealthSettings).

mod ops_fixture;

use std::time::{Duration, Instant};

use ops_fixture::Fixture;
use talos_sim::TalosTiming;
use talos_test_support::sim::SimCluster;

#[tokio::test]
async fn join_reports_the_promotion_after_the_retry_and_waits_for_a_healthy_service() {
    let timing = TalosTiming::UPSTREAM;
    let f = Fixture {
        sim: SimCluster::start_with(3, |cfg| cfg.timing = timing).await,
        state: tempfile::tempdir().unwrap(),
    };
    let started = Instant::now();
    let added = f.sim.cluster.add_node().await.expect("add node");
    let client = f.sim.admin();
    let node = client.node(added.ip.to_string());

    let op = f.ops(&["join", "cp-4", "--timeout", "300s"]);
    tokio::pin!(op);
    let mut promoted_at = None;
    let mut seen_learner = false;
    let run = loop {
        tokio::select! {
            run = &mut op => break run,
            () = tokio::time::sleep(Duration::from_millis(200)) => {
                let Ok(members) = client.etcd_member_list(false).await else { continue };
                let Some(member) = members.iter().find(|m| m.hostname == "cp-4") else { continue };
                seen_learner |= member.is_learner;
                if !member.is_learner && promoted_at.is_none() {
                    promoted_at = Some(started.elapsed());
                }
            }
        }
    };
    let run = run.ok();
    // The gate passed: at this moment the new member's etcd service must be
    // healthy, not merely promoted.
    let services = node.service_list().await.unwrap();
    let etcd = services
        .iter()
        .find(|s| s.id == "etcd")
        .expect("etcd service");
    assert!(
        etcd.health.healthy,
        "the join passed while cp-4's etcd service was {:?}; stderr:\n{}",
        etcd.health, run.stderr
    );

    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    assert!(
        record["facts"]["join_seconds"].as_f64().is_some(),
        "{record}"
    );
    assert!(
        run.stderr.contains("cp-4 is a healthy voter after"),
        "{}",
        run.stderr
    );
    assert!(seen_learner, "cp-4 was seen as a learner first");
    let promoted_at = promoted_at.expect("the promotion was seen before the join ended");
    assert!(
        promoted_at >= timing.promote_interval,
        "promoted after {promoted_at:?}, before the 15 s retry"
    );
    assert!(f.members().await.iter().all(|(_, learner)| !learner));
}
