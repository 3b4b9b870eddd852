//! Resume and abandon through the daemon's API, planned and confirmed as a
//! start is: PlanResume shows the step in flight and what follows, with a
//! fingerprint; ResumeOperation and AbandonOperation need it, and refuse a
//! record that changed since. `talosctl-rs ops resume|abandon --socket`
//! use them.
//!
//! The interrupted operations here are left for a person whatever the
//! daemon's own recovery would do with them: the daemon restarts without
//! their cluster configured, and the cluster is configured again by a
//! reload (recovery runs at start only).

mod daemon;

use daemon::{Daemon, cluster_toml, ops_cli};
use talos_client::ops::{Journal, OpState};
use talos_opsd::proto::{self, opsd_client::OpsdClient, start_operation_request::Kind};
use talos_test_support::sim::SimCluster;
use tonic::transport::Channel;

/// Restarts `d` without its cluster, then configures it again by SIGHUP:
/// an operation the journal holds as running waits for a person.
async fn restart_leaving_it_to_a_person(d: &mut Daemon, cluster: &str) {
    d.set_env(&[]);
    d.rewrite("");
    d.spawn().await;
    d.rewrite(cluster);
    d.reload_and_wait("configuration reloaded").await;
}

fn only_operation(d: &Daemon) -> talos_client::ops::OpRecord {
    let journal = Journal::open(&d.dir.join("state")).unwrap();
    let mut all = journal.list(None).unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    all.remove(0)
}

async fn plan_resume(
    client: &mut OpsdClient<Channel>,
    id: &str,
) -> Result<proto::ResumePlan, tonic::Status> {
    client
        .plan_resume(proto::PlanResumeRequest { id: id.into() })
        .await
        .map(|r| r.into_inner())
}

#[tokio::test]
async fn an_interrupted_operation_is_resumed_or_abandoned_through_the_api() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let cluster = cluster_toml("a", &tc, "");
    let node = sim.ip(2);
    let point = format!("started:defrag {node}");
    let mut d = Daemon::start_with(
        dir.path(),
        &cluster,
        &[("TALOS_OPSD_TEST_CRASH", &point)],
        &[],
    )
    .await;
    // The daemon dies as the member's defragmentation starts.
    let _ = d
        .client()
        .await
        .start_operation(proto::StartOperationRequest {
            cluster: "a".into(),
            plan_fingerprint: String::new(),
            without_cluster_lock: true,
            kind: Some(Kind::Defrag(proto::DefragParams {
                nodes: vec![node.clone()],
                all: true,
                ..Default::default()
            })),
        })
        .await;
    assert!(!d.wait_exit().await.success(), "the daemon was to die");
    let id = only_operation(&d).id;

    d.set_env(&[]);
    d.rewrite("");
    d.spawn().await;
    let mut client = d.client().await;
    // Its cluster is not configured: nothing to resume it with.
    let refused = plan_resume(&mut client, &id).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("no configured cluster"),
        "{refused:?}"
    );
    d.rewrite(&cluster);
    d.reload_and_wait("configuration reloaded").await;

    // It holds the cluster: a plan names it.
    let held = client
        .plan_operation(proto::StartOperationRequest {
            cluster: "a".into(),
            plan_fingerprint: String::new(),
            without_cluster_lock: true,
            kind: Some(Kind::Snapshot(proto::SnapshotParams { keep: 0 })),
        })
        .await
        .unwrap_err();
    assert!(held.message().contains(&id), "{held:?}");

    let plan = plan_resume(&mut client, &id).await.unwrap();
    assert_eq!(plan.fingerprint.len(), 64, "{plan:?}");
    let first = &plan.steps[0];
    assert_eq!(
        (first.name.as_str(), first.node.as_str()),
        ("defrag", node.as_str())
    );
    assert!(first.description.contains("in flight"), "{first:?}");
    assert!(first.destructive);

    // Confirmed with the plan's fingerprint only.
    for (fingerprint, code) in [
        (String::new(), tonic::Code::InvalidArgument),
        ("0".repeat(64), tonic::Code::FailedPrecondition),
    ] {
        let refused = client
            .resume_operation(proto::ResumeOperationRequest {
                id: id.clone(),
                plan_fingerprint: fingerprint.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), code, "{fingerprint:?}: {refused:?}");
        let refused = client
            .abandon_operation(proto::AbandonOperationRequest {
                id: id.clone(),
                plan_fingerprint: fingerprint,
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), code, "{refused:?}");
    }
    assert_eq!(only_operation(&d).state, OpState::Running);

    // Through the CLI: shown, then refused without a confirmation.
    let unconfirmed = ops_cli(&tc, &d.socket, &["resume", &id]).await;
    assert_eq!(unconfirmed.code, 1, "{}", unconfirmed.stderr);
    assert!(
        unconfirmed.stderr.contains("in flight"),
        "{}",
        unconfirmed.stderr
    );
    assert!(
        unconfirmed.stderr.contains("--yes"),
        "{}",
        unconfirmed.stderr
    );
    assert_eq!(only_operation(&d).state, OpState::Running);
    // Confirmed: resumed by the daemon, followed to its end.
    let resumed = ops_cli(&tc, &d.socket, &["--yes", "resume", &id])
        .await
        .ok();
    assert_eq!(resumed.json()["state"], "succeeded", "{}", resumed.stderr);
    let log = d.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("audit") && l.contains("resume") && l.contains("result=\"ok\"")),
        "{log}"
    );
    // Ended: nothing left to resume.
    let ended = plan_resume(&mut client, &id).await.unwrap_err();
    assert_eq!(ended.code(), tonic::Code::FailedPrecondition, "{ended:?}");
    assert!(ended.message().contains("ended"), "{ended:?}");

    // An operation that runs in this daemon is not for PlanResume; killed
    // with it, it is abandoned through the CLI.
    let join = client
        .start_operation(proto::StartOperationRequest {
            cluster: "a".into(),
            plan_fingerprint: String::new(),
            without_cluster_lock: true,
            kind: Some(Kind::Join(proto::JoinParams {
                node: "cp-9".into(),
                timeout_s: 120,
                maintenance: None,
            })),
        })
        .await
        .unwrap()
        .into_inner();
    let running = plan_resume(&mut client, &join.id).await.unwrap_err();
    assert_eq!(
        running.code(),
        tonic::Code::FailedPrecondition,
        "{running:?}"
    );
    assert!(
        running.message().contains("runs in this daemon"),
        "{running:?}"
    );
    d.signal_and_wait(libc::SIGKILL).await;
    restart_leaving_it_to_a_person(&mut d, &cluster).await;
    let unconfirmed = ops_cli(&tc, &d.socket, &["abandon", &join.id]).await;
    assert_eq!(unconfirmed.code, 1, "{}", unconfirmed.stderr);
    let abandoned = ops_cli(&tc, &d.socket, &["--yes", "abandon", &join.id])
        .await
        .ok();
    assert_eq!(
        abandoned.json()["state"],
        "abandoned",
        "{}",
        abandoned.stderr
    );
    let journal = Journal::open(&dir.path().join("state")).unwrap();
    assert_eq!(journal.get(&join.id).unwrap().state, OpState::Abandoned);
    assert!(d.log_text().contains("abandon"), "{}", d.log_text());
}
