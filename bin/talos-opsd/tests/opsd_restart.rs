//! talos-opsd killed or stopped during a retire: on restart the operation
//! ends consistent (two healthy voters, the node silent) and the journal
//! says what happened.

mod daemon;

use std::time::Duration;

use daemon::{Daemon, cluster_toml};
use talos_opsd::proto::operation_event::Event as Ev;
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::{SimCluster, wait_for};

fn retire(node: &str) -> proto::StartOperationRequest {
    proto::StartOperationRequest {
        cluster: "a".into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(Kind::Retire(proto::RetireParams {
            node: node.into(),
            ..Default::default()
        })),
    }
}

/// Waits until operation `id` is journaled as succeeded (the restarted
/// daemon resumes it by itself).
async fn until_succeeded(d: &Daemon, id: &str) -> proto::Operation {
    let client = d.client().await;
    wait_for(
        "the resumed retire to succeed",
        Duration::from_secs(120),
        || {
            let mut client = client.clone();
            let id = id.to_string();
            async move {
                let op = client
                    .get_operation(proto::GetOperationRequest { id })
                    .await
                    .ok()?
                    .into_inner();
                assert!(op.state == "running" || op.state == "succeeded", "{op:?}");
                (op.state == "succeeded").then_some(op)
            }
        },
    )
    .await
}

async fn assert_retired(sim: &SimCluster, address: &str) {
    let client = sim.admin();
    let survivor = (1..=3).map(|i| sim.ip(i)).find(|ip| ip != address).unwrap();
    let members = client
        .node(survivor.as_str())
        .etcd_member_list(false)
        .await
        .unwrap();
    assert_eq!(members.len(), 2, "{members:?}");
    assert!(members.iter().all(|m| !m.is_learner));
    for ip in (1..=3).map(|i| sim.ip(i)).filter(|ip| ip != address) {
        let status = client.node(ip.as_str()).etcd_status().await.unwrap();
        assert!(status.errors.is_empty(), "{ip}: {:?}", status.errors);
    }
    assert!(client.node(address).version().await.is_err());
}

/// The daemon dies at `point` during a retire of cp-2; restarted, it
/// resumes the operation, which ends like an uninterrupted one.
async fn crash_and_restart(point: &str) {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let mut d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &tc, ""),
        &[("TALOS_OPSD_TEST_CRASH", point)],
        &[],
    )
    .await;
    let address = sim.ip(2);
    let mut client = d.client().await;
    // The daemon may die before it answers (a crash at the first step).
    let _ = client.start_operation(retire(&address)).await;
    let status = d.wait_exit().await;
    assert!(!status.success(), "the daemon was to die at {point}");
    // The journal names the step in flight (read while no daemon runs).
    let step = point.split(':').nth(1).unwrap();
    // The leave and the reset are one unit with no journal write between
    // them: until it ends, the leave is the step in flight.
    let step = if step == "reset" { "leave" } else { step };
    let journal = talos_client::ops::Journal::open(&dir.path().join("state")).unwrap();
    let record = journal.list(None).unwrap().remove(0);
    assert_eq!(record.kind, "retire");
    let op = record.clone();
    assert_eq!(
        record.in_flight().map(|s| s.name.as_str()),
        Some(step),
        "{record:?}"
    );
    drop(journal);
    d.set_env(&[]);
    d.spawn().await;
    let done = until_succeeded(&d, &op.id).await;
    assert!(
        done.steps
            .iter()
            .all(|s| s.state == "done" || s.state == "skipped"),
        "{done:?}"
    );
    assert!(
        d.log_text().contains("resuming an interrupted retire"),
        "{}",
        d.log_text()
    );
    let interrupted = record.in_flight().unwrap();
    let resumed = done.steps.iter().find(|s| s.name == step).unwrap();
    assert_own_times(resumed, interrupted.started.as_deref().unwrap());
    assert_retired(&sim, &address).await;
}

/// The step in flight at the crash, as the resume ended it: start, end and
/// duration agree, and the detail says how it was settled: confirmed done
/// (its start the interrupted one, `interrupted`) or run again (its own).
fn assert_own_times(step: &proto::Step, interrupted: &str) {
    use time::OffsetDateTime;
    use time::format_description::well_known::Rfc3339;
    let at = |t: &str| OffsetDateTime::parse(t, &Rfc3339).unwrap();
    let (started, finished) = (at(&step.started), at(&step.finished));
    let wall = (finished - started).whole_milliseconds() as i64;
    assert!(
        (wall - step.duration_ms as i64).abs() < 1000,
        "start, end and duration agree: {step:?}"
    );
    if step.detail.contains("confirmed on resume") {
        assert_eq!(step.started, interrupted, "{step:?}");
    } else {
        assert!(step.detail.contains("run again on resume"), "{step:?}");
        assert!(started > at(interrupted), "its own start: {step:?}");
    }
}

#[tokio::test]
async fn killed_while_taking_the_snapshot() {
    crash_and_restart("started:snapshot").await;
}

#[tokio::test]
async fn killed_before_the_forfeit() {
    crash_and_restart("started:forfeit").await;
}

#[tokio::test]
async fn killed_before_the_leave_is_sent() {
    crash_and_restart("started:leave").await;
}

#[tokio::test]
async fn killed_after_the_leave_answered() {
    crash_and_restart("answered:leave").await;
}

#[tokio::test]
async fn killed_before_the_reset_is_sent() {
    crash_and_restart("started:reset").await;
}

#[tokio::test]
async fn killed_after_the_reset_answered() {
    crash_and_restart("answered:reset").await;
}

#[tokio::test]
async fn killed_while_confirming() {
    crash_and_restart("started:confirm").await;
}

#[tokio::test]
async fn killed_while_waiting_for_silence() {
    crash_and_restart("started:wait-silent").await;
}

#[tokio::test]
async fn sigterm_parks_a_retire_at_a_step_boundary_and_the_restart_resumes_it() {
    let sim = SimCluster::start(3).await;
    sim.cluster
        .fill("/registry/test/", 200, 4096)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let mut d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    let address = sim.ip(2);
    let mut client = d.client().await;
    let op = client
        .start_operation(retire(&address))
        .await
        .unwrap()
        .into_inner();
    let mut stream = client
        .watch_operation(proto::WatchOperationRequest { id: op.id.clone() })
        .await
        .unwrap()
        .into_inner();
    // SIGTERM while the snapshot (the first step) runs.
    let first = stream.message().await.unwrap().unwrap();
    assert!(
        matches!(&first.event, Some(Ev::StepStarted(s)) if s.name == "snapshot"),
        "{first:?}"
    );
    assert_eq!(
        d.signal_and_wait(libc::SIGTERM).await,
        Some(0),
        "{}",
        d.log_text()
    );
    // Parked at a boundary: still running in the journal, nothing in
    // flight, some step still to do.
    let journal = talos_client::ops::Journal::open(&dir.path().join("state")).unwrap();
    let record = journal.get(&op.id).unwrap();
    assert_eq!(record.state, talos_client::ops::OpState::Running);
    assert!(record.in_flight().is_none(), "{record:?}");
    assert!(
        record
            .steps
            .iter()
            .any(|s| s.state == talos_client::ops::StepState::Pending),
        "{record:?}"
    );
    assert!(!d.socket.exists(), "the socket is removed on exit");
    drop(journal);
    d.spawn().await;
    until_succeeded(&d, &op.id).await;
    assert_retired(&sim, &address).await;
}

/// An apply killed with its try in flight (journaled, not sent) used to be
/// left for a person; now the restart resumes it like any operation: the
/// try is reconciled (not on the node), sent again once its check holds
/// (the node runs its saved configuration, every voter healthy), gated
/// and confirmed.
#[tokio::test]
async fn an_apply_killed_during_its_try_is_resumed_once_its_check_holds() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let config = std::fs::read_to_string(sim.dir.path().join("controlplane.yaml"))
        .unwrap()
        .replace("certSANs: []", "certSANs: [vip.example]");
    let file = dir.path().join("sans.yaml");
    std::fs::write(&file, config).unwrap();
    let node = sim.ip(1);
    let point = format!("started:try {node}");
    let mut d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &tc, ""),
        &[("TALOS_OPSD_TEST_CRASH", &point)],
        &[],
    )
    .await;
    let mut client = d.client().await;
    // The try is the first step: the daemon may die before it answers.
    let _ = client
        .start_operation(proto::StartOperationRequest {
            cluster: "a".into(),
            plan_fingerprint: String::new(),
            without_cluster_lock: true,
            kind: Some(Kind::Apply(proto::ApplyParams {
                nodes: vec![node.clone()],
                config_path: file.display().to_string(),
                expect_change: vec!["machine.certSANs".into()],
                try_timeout_s: 30,
                ..Default::default()
            })),
        })
        .await;
    assert!(
        !d.wait_exit().await.success(),
        "the daemon was to die at {point}"
    );
    let journal = talos_client::ops::Journal::open(&dir.path().join("state")).unwrap();
    let op = journal.list(None).unwrap().remove(0);
    assert_eq!(op.kind, "apply");
    assert_eq!(
        op.in_flight().map(|s| s.label()),
        Some(format!("try {node}"))
    );
    drop(journal);
    d.set_env(&[]);
    d.spawn().await;
    let done = d.until_ended(&op.id).await;
    assert_eq!(done.state, "succeeded", "{done:?}");
    assert!(
        d.log_text().contains("resuming an interrupted apply"),
        "{}",
        d.log_text()
    );
    let saved = sim
        .admin()
        .node(node.as_str())
        .resources()
        .machine_config(talos_client::client::resources::ConfigId::Persistent)
        .await
        .unwrap();
    assert!(saved.yaml.contains("vip.example"), "{}", saved.yaml);
}
