//! `ops upgrade` through talos-opsd's API: planned (order and versions in
//! the plan), started with the plan's fingerprint, watched node by node,
//! and each node's duration in the metrics.

mod daemon;

use std::time::Duration;

use daemon::{Daemon, cluster_toml};
use talos_opsd::proto::operation_event::Event as Ev;
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::{SimCluster, wait_for};

#[tokio::test]
async fn an_upgrade_through_the_api_is_planned_watched_and_measured() {
    let sim = SimCluster::start(3).await;
    let leader = sim.leader().await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let port = daemon::free_port();
    let d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &tc, ""),
        &[],
        &["--metrics-addr", &format!("127.0.0.1:{port}")],
    )
    .await;
    let mut client = d.client().await;
    let request = proto::StartOperationRequest {
        cluster: "a".into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(Kind::Upgrade(proto::UpgradeParams {
            image: "ghcr.io/siderolabs/installer:v1.14.0".into(),
            ..Default::default()
        })),
    };
    let plan = client
        .plan_operation(request.clone())
        .await
        .unwrap()
        .into_inner();
    let planned: Vec<(&str, &str)> = plan
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.node.as_str()))
        .collect();
    assert_eq!(planned.len(), 9, "{planned:?}");
    assert_eq!(planned[6], ("forfeit", leader.as_str()), "{planned:?}");
    assert_eq!(planned[7], ("upgrade", leader.as_str()), "{planned:?}");
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("v1.13.9 -> v1.14.0") && n.contains("the leader last")),
        "{:?}",
        plan.notes
    );
    let id = client
        .start_operation(proto::StartOperationRequest {
            plan_fingerprint: plan.fingerprint.clone(),
            without_cluster_lock: true,
            ..request
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    let mut stream = client
        .watch_operation(proto::WatchOperationRequest { id })
        .await
        .unwrap()
        .into_inner();
    let mut back = Vec::new();
    let mut finished = None;
    while let Some(event) = stream.message().await.unwrap() {
        match event.event.unwrap() {
            Ev::StepEnded(s) if s.name == "wait-back" => back.push(s.detail),
            Ev::Finished(f) => finished = Some(f),
            _ => {}
        }
    }
    let finished = finished.expect("a Finished event");
    assert_eq!(finished.state, "succeeded", "{finished:?}");
    assert_eq!(back.len(), 3, "{back:?}");
    assert!(
        back.iter().all(|d| d.contains("back on v1.14.0")),
        "{back:?}"
    );
    let metrics = wait_for("the upgrade's metrics", Duration::from_secs(10), || async {
        let m = daemon::scrape(port).await?;
        m.contains("talos_opsd_upgrade_last_success_timestamp_seconds{cluster=\"a\"}")
            .then_some(m)
    })
    .await;
    for i in 1..=3 {
        let series =
            format!("talos_opsd_upgrade_node_duration_seconds{{cluster=\"a\",member=\"cp-{i}\"}} ");
        let value: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{series}: {metrics}"));
        assert!(value > 0.0, "{series}{value}");
    }
}
