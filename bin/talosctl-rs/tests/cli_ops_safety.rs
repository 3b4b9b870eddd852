//! A retire on a bad night, on the simulator (real etcd) with injected
//! faults: the plan going stale before the leave (a survivor's etcd frozen
//! after the preflight), and a resume that finds another member at the
//! retired node's address. Each must stop before harm, change nothing
//! more, and say why.

use std::time::Duration;

use talos_client::client::ResetRequest;
use talos_client::ops::{Facts, OpSpec, OpsError};
use talos_test_support::sim::wait_for;

mod ops_fixture;

use ops_fixture::{Fixture, newest, retire_killed_after_leave};

/// A survivor whose etcd froze after the plan was made stops the retire at
/// the fresh check before the forfeit and the leave: nothing is changed,
/// and the operation fails (it does not need attention: nothing
/// irreversible ran).
#[tokio::test]
async fn a_survivor_frozen_after_the_plan_stops_the_retire_before_the_leave() {
    let f = Fixture::start(3).await;
    let target = f.sim.ip(2);
    // The other survivor: neither the target nor the snapshot's source.
    let (mut ops, plan, frozen) = f.plan_retire_with_bystander().await;
    let node = f.sim.cluster.node(&frozen).unwrap();
    assert!(node.freeze_etcd().await, "etcd runs on {frozen}");
    let result = ops.run(plan, &mut |_| {}).await;
    assert!(node.thaw_etcd().await);
    match &result {
        Err(OpsError::StepFailed { step, reason }) => {
            assert_eq!(step, "check", "{reason}");
            assert!(reason.contains(&node.name), "{reason}");
        }
        other => panic!("expected the check to fail, got {other:?}"),
    }
    let record = newest(&f).await;
    assert_eq!(record["state"], "failed", "{record}");
    let states: Vec<_> = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states[..4],
        [
            ("snapshot", "done"),
            ("check", "failed"),
            ("forfeit", "pending"),
            ("leave", "pending")
        ],
        "{record}"
    );
    assert_eq!(f.voters(1).await, ["cp-1", "cp-2", "cp-3"]);
    f.sim.admin().node(target.as_str()).version().await.unwrap();
}

/// The process dies right after the leave answered, before the reset was
/// sent; meanwhile the node is reset without STATE wiped and rejoins at the
/// same address as a new voter under its old name. `ops resume` must not
/// reset that live voter: it stops as needs-attention naming the member,
/// and the cluster keeps three voters.
#[tokio::test]
async fn resume_does_not_reset_a_live_member_back_at_the_address() {
    let f = Fixture::start(3).await;
    let target = f.sim.ip(2);
    let id = retire_killed_after_leave(&f, &target).await;
    let admin = f.sim.admin();
    let old = admin
        .node(f.sim.ip(1))
        .etcd_member_list(false)
        .await
        .unwrap();
    assert!(
        !old.iter().any(|m| m.hostname == "cp-2"),
        "the leave went through: {old:?}"
    );
    // The node comes back at its address as a new member.
    admin
        .node(target.as_str())
        .reset(
            ResetRequest::default()
                .with_graceful(false)
                .with_reboot(true)
                .with_system_labels_to_wipe(vec!["EPHEMERAL".into()]),
        )
        .await
        .expect("reset accepted");
    let rejoined = wait_for(
        "cp-2 to rejoin as a voter",
        Duration::from_secs(120),
        || async {
            let members = admin.node(f.sim.ip(1)).etcd_member_list(false).await.ok()?;
            let cp2 = members.iter().find(|m| m.hostname == "cp-2")?;
            (members.len() == 3 && !cp2.is_learner).then_some(cp2.id)
        },
    )
    .await;

    let resumed = f.ops(&["resume", &id]).await;
    assert_ne!(resumed.code, 0, "{}", resumed.stdout);
    assert!(
        resumed.stderr.contains("needs attention")
            && resumed.stderr.contains("check out-of-etcd failed")
            && resumed.stderr.contains(&rejoined.to_string()),
        "{}",
        resumed.stderr
    );
    let shown = f.ops(&["show", &id]).await.ok().json();
    assert_eq!(shown["state"], "needs-attention", "{shown}");
    // The live voter was not reset.
    assert_eq!(f.voters(1).await, ["cp-1", "cp-2", "cp-3"]);
    let status = admin.node(target.as_str()).etcd_status().await.unwrap();
    assert_eq!(status.member_id, rejoined);
    // And the cluster stays blocked until a person decides.
    let blocked = f.ops(&["--yes", "snapshot"]).await;
    assert_ne!(blocked.code, 0);
    assert!(blocked.stderr.contains(&id), "{}", blocked.stderr);
}

/// A wait honours a cancel between its polls: a join waiting for a node
/// that never comes ends cancelled within a poll, not at its timeout.
#[tokio::test]
async fn a_waiting_join_ends_at_a_cancel() {
    let f = Fixture::start(3).await;
    let mut ops = f.open_ops();
    let stop = talos_client::ops::StopHandle::new();
    ops.set_stop(stop.clone());
    let mut options = talos_client::ops::JoinOptions::new("cp-9");
    options.timeout = Duration::from_secs(3600);
    let plan = ops.plan(&OpSpec::Join(options)).await.unwrap();
    let (waiting_tx, waiting_rx) = tokio::sync::oneshot::channel();
    let mut waiting_tx = Some(waiting_tx);
    let run = tokio::spawn(async move {
        ops.run(plan, &mut move |event| {
            if let talos_client::ops::Event::StepStarted { name, .. } = event
                && name == "wait-voter"
                && let Some(tx) = waiting_tx.take()
            {
                let _ = tx.send(());
            }
        })
        .await
    });
    waiting_rx.await.unwrap();
    stop.cancel().unwrap();
    let result = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the wait ends at the cancel")
        .unwrap();
    assert!(
        matches!(result, Err(OpsError::Cancelled { ref step, .. }) if step == "wait-voter"),
        "{result:?}"
    );
    assert_eq!(newest(&f).await["state"], "cancelled");
}

/// A wait that could not end is refused when planned, naming the option.
#[tokio::test]
async fn an_absurd_timeout_is_refused_at_plan_time() {
    let f = Fixture::start(1).await;
    let mut options = talos_client::ops::JoinOptions::new("cp-9");
    options.timeout = Duration::from_secs(4_294_967_295);
    let refused = f.open_ops().plan(&OpSpec::Join(options)).await;
    match refused {
        Err(OpsError::Refused(talos_client::ops::Refusal::OutOfBounds { option, .. })) => {
            assert_eq!(option, "timeout")
        }
        other => panic!("expected OutOfBounds, got {other:?}"),
    }
    let run = f
        .ops(&["--yes", "join", "cp-9", "--timeout", "100000h"])
        .await;
    // Refused by the flag parser (a usage error, exit 2) with the bounds.
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("--timeout") && run.stderr.contains("between 1s and 24h"),
        "{}",
        run.stderr
    );
}

/// A snapshot source that stops sending (its etcd frozen: the stream
/// stays open and stalls at zero bytes) fails after the stall bound, and
/// the snapshot is taken once more from another healthy voter.
#[tokio::test]
async fn a_stalled_snapshot_source_is_left_for_another_voter() {
    let f = Fixture::start(3).await;
    let mut ops = f.open_ops();
    ops.set_snapshot_stall(Duration::from_secs(3));
    let plan = ops
        .plan(&OpSpec::Snapshot(
            talos_client::ops::SnapshotOptions::default(),
        ))
        .await
        .unwrap();
    let Facts::Snapshot(facts) = &plan.facts else {
        panic!("snapshot facts")
    };
    let source = facts.source.address.clone();
    let node = f.sim.cluster.node(&source).unwrap();
    assert!(node.freeze_etcd().await);
    let result = ops.run(plan, &mut |_| {}).await;
    assert!(node.thaw_etcd().await);
    let record = result.unwrap();
    let detail = record.steps[0].detail.clone().unwrap();
    assert!(
        detail.contains("stalled") && detail.contains("instead"),
        "{detail}"
    );
    assert!(!detail.contains(&format!("(from {source})")), "{detail}");
    let Facts::Snapshot(after) = record.typed_facts().unwrap() else {
        panic!("snapshot facts")
    };
    let saved = after.snapshot.unwrap();
    talos_client::snapshot::verify_file(&saved).unwrap();
}

/// A node that reboots inside the try window comes back running its
/// previous configuration: the gate must not pass on that (it checks, pass
/// after pass, that the node still runs the tried file, and a pass counts
/// only when the gate holds over its soak), so the untried file is never
/// confirmed.
#[tokio::test]
async fn a_node_rebooted_inside_the_try_window_fails_the_gate() {
    let f = Fixture::start(3).await;
    let node = f.sim.ip(2);
    let config = std::fs::read_to_string(f.sim.dir.path().join("controlplane.yaml"))
        .unwrap()
        .replace("certSANs: []", "certSANs: [rebooted.example]");
    let file = f.state.path().join("sans.yaml");
    std::fs::write(&file, &config).unwrap();
    let mut options = talos_client::ops::ApplyOptions::new(vec![node.clone()], file);
    options.expect_change = vec!["machine.certSANs".into()];
    options.try_timeout = Duration::from_secs(30);
    options.vip_check = false;
    let mut ops = f.open_ops();
    let plan = ops.plan(&OpSpec::Apply(options)).await.unwrap();
    let admin = f.sim.admin();
    let (tried_tx, tried_rx) = tokio::sync::oneshot::channel();
    let mut tried_tx = Some(tried_tx);
    let run = tokio::spawn(async move {
        ops.run(plan, &mut move |event| {
            if let talos_client::ops::Event::StepEnded { name, .. } = event
                && name == "try"
                && let Some(tx) = tried_tx.take()
            {
                let _ = tx.send(());
            }
        })
        .await
    });
    tried_rx.await.unwrap();
    admin
        .node(node.as_str())
        .reboot(talos_client::client::RebootMode::Default)
        .await
        .unwrap();
    let result = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .unwrap()
        .unwrap();
    match &result {
        Err(OpsError::StepFailed { step, reason }) => {
            assert!(step.starts_with("gate"), "{step}: {reason}");
            assert!(
                reason.contains("rebooted inside the try window"),
                "{reason}"
            );
        }
        other => panic!("expected the gate to fail, got {other:?}"),
    }
    // The file was never made permanent.
    let saved = wait_for("the node back", Duration::from_secs(60), || async {
        admin
            .node(node.as_str())
            .resources()
            .machine_config(talos_client::client::resources::ConfigId::Persistent)
            .await
            .ok()
    })
    .await;
    assert!(!saved.yaml.contains("rebooted.example"), "{}", saved.yaml);
}

/// A dead node (powered off, still a voting member) is retired by removing
/// its member through a survivor after the quorum checks; nothing is sent
/// to it, and the plan says to wipe the machine before reuse.
#[tokio::test]
async fn a_dead_node_is_removed_through_a_survivor() {
    let f = Fixture::start(3).await;
    let dead = f.sim.ip(3);
    f.sim.cluster.power_off(&dead).await.unwrap();
    let plan = f.ops(&["--plan", "retire", &dead]).await.ok();
    assert!(
        plan.stderr.contains("does not answer") && plan.stderr.contains("wipe the machine"),
        "{}",
        plan.stderr
    );
    // No reset is sent to a dead node, so the plan says nothing wipes it.
    assert!(!plan.stderr.contains("the reset wipes"), "{}", plan.stderr);
    let run = f.ops(&["--yes", "retire", &dead]).await.ok();
    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    let names: Vec<_> = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["snapshot", "check", "remove", "confirm"],
        "{record}"
    );
    assert_eq!(f.voters(1).await, ["cp-1", "cp-2"]);
}

/// A leave that failed on record but took effect (the member is gone) is
/// reconciled on resume like one in flight: asked of a survivor, found
/// done, and the reset follows. Sent again blindly, a leave to a node that
/// already left never succeeds.
#[tokio::test]
async fn a_failed_leave_that_took_effect_is_reconciled_on_resume() {
    let f = Fixture::start(3).await;
    let target = f.sim.ip(2);
    let id = retire_killed_after_leave(&f, &target).await;
    // What a failed leave leaves on record: the step failed, the operation
    // failed.
    {
        let db = rusqlite::Connection::open(f.state.path().join("journal.sqlite")).unwrap();
        let changed = db
            .execute(
                "UPDATE steps SET state = 'failed', detail = 'deadline exceeded' WHERE op_id = ?1 AND name = 'leave'",
                [&id],
            )
            .unwrap();
        assert_eq!(changed, 1);
        db.execute(
            "UPDATE operations SET state = 'failed' WHERE id = ?1",
            [&id],
        )
        .unwrap();
    }
    let resumed = f.ops(&["resume", &id]).await.ok().json();
    assert_eq!(resumed["state"], "succeeded", "{resumed}");
    let leave = resumed["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "leave")
        .unwrap();
    assert!(
        leave["detail"].as_str().unwrap().contains("reconciled"),
        "{leave}"
    );
    assert_eq!(f.voters(1).await, ["cp-1", "cp-3"]);
    assert!(f.sim.admin().node(target.as_str()).version().await.is_err());
}

/// `--already-left` asks the node itself: a multi-homed voter named by its
/// second address (which no member list shows) says it is a member, so the
/// retire is refused before anything is sent, and it keeps voting.
#[tokio::test]
async fn already_left_asks_the_node_a_multi_homed_voter_is_not_reset() {
    let f = Fixture {
        sim: talos_test_support::sim::SimCluster::start_with(3, |cfg| {
            cfg.timing = talos_sim::TalosTiming::scaled_down(10);
            cfg.second_base_ip = Some(std::net::Ipv4Addr::from(u32::from(cfg.base_ip) + 100));
        })
        .await,
        state: tempfile::tempdir().unwrap(),
    };
    let second = f.sim.cluster.config().second_ip(3).unwrap().to_string();
    assert!(
        f.sim.admin().node(second.as_str()).version().await.is_ok(),
        "cp-3 answers at {second}"
    );
    let run = f.ops(&["--yes", "retire", &second, "--already-left"]).await;
    assert_ne!(run.code, 0, "{}", run.stdout);
    assert!(
        run.stderr
            .contains("is said to have left etcd, but it is still etcd member"),
        "{}",
        run.stderr
    );
    assert_eq!(f.voters(1).await, ["cp-1", "cp-2", "cp-3"]);
    f.sim.admin().node(second.as_str()).version().await.unwrap();
}

/// A resumed reset that finds the node cut off (silent, still discovered)
/// sends nothing and checks again until it can tell: once the network is
/// back the node is the planned machine, out of etcd, and the reset goes
/// out. A blip is not a reason to wake a person, nor evidence of a reset.
#[tokio::test]
async fn a_resumed_reset_waits_out_a_partition_then_resets() {
    let f = Fixture::start(3).await;
    let target = f.sim.ip(2);
    let id = retire_killed_after_leave(&f, &target).await;
    assert!(f.sim.cluster.partition(&target).await.unwrap());
    // The resume runs with its progress read line by line as it comes.
    let mut cmd = talos_test_support::cli::command(&f.talosconfig());
    cmd.args(["-o", "json", "ops", "--without-cluster-lock", "--state-dir"])
        .arg(f.state.path())
        .args(["resume", &id])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let progress = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let progress = progress.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stderr).lines() {
                let line = line.unwrap();
                progress.lock().unwrap().push_str(&(line + "\n"));
            }
        })
    };
    wait_for(
        "the resume to reach the reset",
        Duration::from_secs(60),
        || {
            let text = progress.lock().unwrap().clone();
            async move { text.contains("reset ...").then_some(()) }
        },
    )
    .await;
    let node = f.sim.cluster.node(&target).unwrap();
    let before = node.unanswered_calls();
    wait_for(
        "the reset's check to meet the partition",
        Duration::from_secs(30),
        || {
            let met = node.unanswered_calls() > before;
            async move { met.then_some(()) }
        },
    )
    .await;
    // The reset check finds the node silent and still discovered: it waits
    // (nothing is counted, nothing sent), and the cluster still lists no
    // member there.
    assert!(
        child.try_wait().unwrap().is_none(),
        "{}",
        progress.lock().unwrap()
    );
    assert!(f.sim.cluster.node(&target).unwrap().is_configured());
    assert!(f.sim.cluster.heal(&target).await.unwrap());
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    reader.join().unwrap();
    let resumed = talos_test_support::cli::Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: progress.lock().unwrap().clone(),
    };
    let record = resumed.ok().json();
    assert_eq!(record["state"], "succeeded", "{record}");
    let reset = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "reset")
        .unwrap();
    assert!(
        reset["detail"].as_str().unwrap().contains("reset accepted"),
        "{reset}"
    );
    assert_eq!(f.voters(1).await, ["cp-1", "cp-3"]);
}

/// A node found in maintenance mode on resume (reset by hand after the
/// crash, STATE wiped) is evidence: the reset is done without sending.
#[tokio::test]
async fn a_node_in_maintenance_mode_is_evidence_of_the_reset_on_resume() {
    let f = Fixture::start(3).await;
    let target = f.sim.ip(2);
    let id = retire_killed_after_leave(&f, &target).await;
    f.sim
        .admin()
        .node(target.as_str())
        .reset(
            ResetRequest::default()
                .with_graceful(false)
                .with_reboot(true)
                .with_system_labels_to_wipe(vec!["STATE".into(), "EPHEMERAL".into()]),
        )
        .await
        .expect("reset accepted");
    let node = f.sim.cluster.node(&target).unwrap();
    wait_for("cp-2 in maintenance mode", Duration::from_secs(60), || {
        let answers = !node.is_configured() && node.power() == talos_sim::node::Power::On;
        async move { answers.then_some(()) }
    })
    .await;
    let record = f.ops(&["resume", &id]).await.ok().json();
    assert_eq!(record["state"], "succeeded", "{record}");
    let reset = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "reset")
        .unwrap();
    assert!(
        reset["detail"]
            .as_str()
            .unwrap()
            .contains("answers in maintenance mode: it was reset"),
        "{reset}"
    );
    assert_eq!(f.voters(1).await, ["cp-1", "cp-3"]);
}
