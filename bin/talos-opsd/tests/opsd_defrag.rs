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
