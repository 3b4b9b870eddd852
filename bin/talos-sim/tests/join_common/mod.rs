//! The join path checked against upstream's etcd service
//! (internal/app/machined/pkg/system/services/etcd.go): a learner is
//! promoted no sooner than one promotion interval after it joins, and its
//! etcd service is never healthy while it is a learner (the health check is
//! a linearizable read, internal/pkg/etcd/etcd.go ValidateQuorum).

use std::time::{Duration, Instant};

use talos_sim::TalosTiming;
use talos_test_support::sim::{SimCluster, wait_for};

/// What one poll of the joining node saw.
struct Seen {
    learner: bool,
    unknown: bool,
    healthy: bool,
}

async fn look(sim: &SimCluster, ip: &str) -> Option<Seen> {
    let client = sim.admin();
    let members = client.etcd_member_list(false).await.ok()?;
    let member = members.into_iter().find(|m| m.hostname == "cp-4")?;
    let services = client.node(ip).service_list().await.ok()?;
    let etcd = services.into_iter().find(|s| s.id == "etcd")?;
    Some(Seen {
        learner: member.is_learner,
        unknown: etcd.health.unknown,
        healthy: etcd.health.healthy,
    })
}

/// Adds a node to a three-node cluster on `timing` and follows it until
/// its etcd service is healthy as a voter.
pub async fn learner_is_promoted_on_schedule_and_unhealthy_until_then(timing: TalosTiming) {
    let sim = SimCluster::start_with(3, |cfg| cfg.timing = timing).await;
    let started = Instant::now();
    let added = sim.cluster.add_node().await.expect("add node");
    let ip = added.ip.to_string();
    let limit = timing.promote_interval * 3 + timing.health_period * 2 + Duration::from_secs(30);
    let deadline = Instant::now() + limit;
    let mut learner_checked_unhealthy = false;
    let promoted_at = loop {
        assert!(
            Instant::now() < deadline,
            "cp-4 was not promoted in {limit:?}"
        );
        if let Some(seen) = look(&sim, &ip).await {
            assert!(
                !(seen.learner && seen.healthy),
                "a learner's etcd service must not be healthy"
            );
            learner_checked_unhealthy |= seen.learner && !seen.unknown && !seen.healthy;
            if !seen.learner {
                break started.elapsed();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        promoted_at >= timing.promote_interval,
        "promoted after {promoted_at:?}, before the first retry ({:?}): the first attempt \
         comes before etcd starts and must fail",
        timing.promote_interval
    );
    if timing.health_initial_delay + timing.health_period / 2 < timing.promote_interval {
        assert!(
            learner_checked_unhealthy,
            "the learner's health check ran and reported unhealthy"
        );
    }
    let client = sim.admin().node(ip.clone());
    wait_for(
        "cp-4's etcd service to be healthy as a voter",
        timing.health_period * 2 + Duration::from_secs(10),
        || async {
            let services = client.service_list().await.ok()?;
            services
                .into_iter()
                .find(|s| s.id == "etcd" && s.health.healthy)
        },
    )
    .await;
}
