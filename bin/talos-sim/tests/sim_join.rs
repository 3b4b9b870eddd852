//! The join path on a schedule ten times faster than upstream's; see
//! sim_join_upstream.rs for the same on upstream's own timings.

mod join_common;

use std::time::{Duration, Instant};

use talos_client::client::ResetRequest;
use talos_sim::TalosTiming;
use talos_test_support::sim::{SimCluster, wait_for};

#[tokio::test]
async fn learner_is_promoted_after_the_retry_interval_and_unhealthy_until_then() {
    join_common::learner_is_promoted_on_schedule_and_unhealthy_until_then(
        TalosTiming::scaled_down(10),
    )
    .await;
}

/// Leave and forfeit find the local member through a resource that exists
/// only while the etcd service is running and healthy (internal/pkg/etcd/
/// local.go, GetLocalMemberID): on a learner they wait and time out.
#[tokio::test]
async fn leave_and_forfeit_on_a_learner_wait_for_a_healthy_member() {
    let timing = TalosTiming {
        promote_interval: Duration::from_secs(600),
        local_member_wait: Duration::from_secs(2),
        ..TalosTiming::scaled_down(10)
    };
    let sim = SimCluster::start_with(3, |cfg| cfg.timing = timing).await;
    let added = sim.cluster.add_node().await.expect("add node");
    let client = sim.admin().node(added.ip.to_string());
    for call in ["leave", "forfeit"] {
        let started = Instant::now();
        let result = match call {
            "leave" => client.etcd_leave_cluster().await.map(drop),
            _ => client.etcd_forfeit_leadership().await.map(drop),
        };
        let err = result.expect_err("a learner has no healthy local member");
        assert!(
            err.to_string()
                .contains("failed to get local etcd member ID"),
            "{call}: {err}"
        );
        assert!(
            started.elapsed() >= timing.local_member_wait,
            "{call} waited"
        );
    }
    let members = sim.admin().etcd_member_list(false).await.unwrap();
    assert!(
        members.iter().any(|m| m.hostname == "cp-4" && m.is_learner),
        "the learner is still a member: {members:?}"
    );
}

/// A node reset without a leave (only EPHEMERAL wiped) rejoins under its
/// old name: the join first removes the stale member of that name
/// (internal/app/machined/pkg/system/services/etcd.go, addMember).
#[tokio::test]
async fn a_node_reset_without_leave_rejoins_under_its_old_name() {
    let sim = SimCluster::start(3).await;
    let admin = sim.admin();
    let before = admin.etcd_member_list(false).await.unwrap();
    let old = before.iter().find(|m| m.hostname == "cp-3").unwrap().id;
    admin
        .node(sim.ip(3))
        .reset(
            ResetRequest::default()
                .with_graceful(false)
                .with_reboot(true)
                .with_system_labels_to_wipe(vec!["EPHEMERAL".into()]),
        )
        .await
        .expect("reset accepted");
    let rejoined = wait_for(
        "cp-3 to rejoin as a voter",
        Duration::from_secs(90),
        || async {
            let members = admin.node(sim.ip(1)).etcd_member_list(false).await.ok()?;
            let cp3: Vec<_> = members.iter().filter(|m| m.hostname == "cp-3").collect();
            (members.len() == 3 && cp3.len() == 1 && cp3[0].id != old && !cp3[0].is_learner)
                .then(|| cp3[0].id)
        },
    )
    .await;
    assert_ne!(rejoined, old);
}

/// A second join while the first node is still a learner: etcd refuses a
/// second learner ("too many learner members"), and upstream's addMember
/// retries any error until its join timeout
/// (internal/app/machined/pkg/system/services/etcd.go), so the second node
/// waits for the first one's promotion instead of failing; both end as
/// voters.
#[tokio::test]
async fn a_second_join_waits_for_the_first_learner_to_be_promoted() {
    let sim = SimCluster::start_with(3, |cfg| cfg.timing = TalosTiming::scaled_down(10)).await;
    let first = sim.cluster.add_node().await.expect("first join");
    let started = Instant::now();
    let second = sim
        .cluster
        .add_node()
        .await
        .expect("second join waits, then joins");
    let waited = started.elapsed();
    let members = wait_for("five voters", Duration::from_secs(60), || async {
        let members = sim
            .admin()
            .node(sim.ip(1))
            .etcd_member_list(false)
            .await
            .ok()?;
        (members.len() == 5 && members.iter().all(|m| !m.is_learner)).then_some(members)
    })
    .await;
    let names: Vec<&str> = members.iter().map(|m| m.hostname.as_str()).collect();
    assert!(names.contains(&first.name.as_str()) && names.contains(&second.name.as_str()));
    // The first learner is promoted at its second attempt at the earliest,
    // one promote interval (1.5 s here) after it started: the second join
    // could not have got in before.
    assert!(
        waited >= TalosTiming::scaled_down(10).promote_interval / 2,
        "the second join did not wait: {waited:?}"
    );
}
