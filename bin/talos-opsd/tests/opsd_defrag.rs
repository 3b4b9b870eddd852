//! `ops defrag` through talos-opsd's API: planned, started and watched
//! like any operation, each member's step reporting what it gave back.

mod daemon;

use daemon::{Daemon, cluster_toml};
use talos_opsd::proto::operation_event::Event as Ev;
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::SimCluster;

#[tokio::test]
async fn a_defrag_through_the_api_is_watched_member_by_member() {
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
    let planned: Vec<&str> = plan.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(planned, ["check", "defrag", "defrag", "forfeit", "defrag"]);
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
        .watch_operation(proto::WatchOperationRequest { id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    let mut ended = Vec::new();
    let mut finished = None;
    while let Some(event) = stream.message().await.unwrap() {
        match event.event.unwrap() {
            Ev::StepEnded(s) => ended.push((s.name, s.detail)),
            Ev::Finished(f) => finished = Some(f),
            _ => {}
        }
    }
    let finished = finished.expect("a Finished event");
    assert_eq!(finished.state, "succeeded", "{finished:?}");
    let defrags: Vec<&String> = ended
        .iter()
        .filter(|(name, _)| name == "defrag")
        .map(|(_, detail)| detail)
        .collect();
    assert_eq!(defrags.len(), 3, "{ended:?}");
    assert!(defrags.iter().all(|d| d.contains("reclaimed")), "{ended:?}");
}

/// The value of the series `name{labels}` (labels as printed), if present.
fn series(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}{{{labels}}} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// `[cluster.defrag]`: on a cluster that deleted data, the scheduled run
/// defragments every member (each has free pages above the threshold), and
/// the metrics show the bytes each gave back and how long it took.
#[tokio::test]
async fn a_scheduled_defrag_gives_space_back_and_shows_it_in_the_metrics() {
    use std::time::Duration;
    use talos_test_support::sim::wait_for;

    let sim = SimCluster::start(3).await;
    sim.cluster
        .fill("/registry/big/", 200, 16 << 10)
        .await
        .unwrap();
    assert!(sim.cluster.clear("/registry/big/").await.unwrap() >= 200);
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let port = daemon::free_port();
    let extra =
        "without_cluster_lock = true\n[cluster.defrag]\ninterval = \"1s\"\nthreshold = 0.9\n";
    let d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &tc, extra),
        &[],
        &["--metrics-addr", &format!("127.0.0.1:{port}")],
    )
    .await;
    let metrics = wait_for(
        "a scheduled defrag in the metrics",
        Duration::from_secs(120),
        || async {
            // bbolt counts the compacted pages as free only after later
            // commits: a small write per poll stands in for a live
            // cluster's traffic.
            sim.cluster.fill("/registry/tick/", 1, 8).await.ok()?;
            let m = daemon::scrape(port).await?;
            let reclaimed = series(
                &m,
                "talos_opsd_defrag_last_reclaimed_bytes",
                "cluster=\"a\"",
            )?;
            (reclaimed > 0.0).then_some(m)
        },
    )
    .await;
    for name in sim.cluster.nodes().iter().map(|n| n.name.clone()) {
        let labels = format!("cluster=\"a\",member=\"{name}\"");
        let bytes = series(
            &metrics,
            "talos_opsd_defrag_member_reclaimed_bytes",
            &labels,
        );
        assert!(bytes.is_some_and(|b| b > 0.0), "{name}: {metrics}");
        let took = series(
            &metrics,
            "talos_opsd_defrag_member_duration_seconds",
            &labels,
        );
        assert!(took.is_some_and(|t| t > 0.0), "{name}: {metrics}");
    }
    assert!(
        series(
            &metrics,
            "talos_opsd_defrag_last_success_timestamp_seconds",
            "cluster=\"a\""
        )
        .is_some(),
        "{metrics}"
    );
    let mut client = d.client().await;
    let ops = client
        .list_operations(proto::ListOperationsRequest {
            cluster: "a".into(),
            state: "succeeded".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .operations;
    assert!(ops.iter().any(|o| o.kind == "defrag"), "{ops:?}");
}
