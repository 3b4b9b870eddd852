//! The join path on upstream's own timings (no divisor): the promotion
//! comes after the 15 s retry, and the learner's etcd service is unhealthy
//! from its first check (5 s) until it is promoted and checked again.

mod join_common;

#[tokio::test]
async fn learner_is_promoted_after_fifteen_seconds_on_upstream_timings() {
    join_common::learner_is_promoted_on_schedule_and_unhealthy_until_then(
        talos_sim::TalosTiming::UPSTREAM,
    )
    .await;
}
