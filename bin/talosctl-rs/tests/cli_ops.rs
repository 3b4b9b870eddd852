//! `talosctl-rs ops` against the simulator (real etcd): retire end to end,
//! every refusal with nothing changed, join, snapshot retention, one
//! operation per cluster, and a crash at every step of a retire followed by
//! `ops show` and `ops resume`.

use std::path::PathBuf;
use std::time::Duration;

use talos_test_support::cli::{Run, command, run};
use talos_test_support::sim::wait_for;

mod ops_fixture;

use ops_fixture::{Fixture, newest};

/// After a retire of `address`: two healthy voters, the node silent.
async fn assert_retired(f: &Fixture, address: &str) {
    let client = f.sim.admin();
    let survivor = (1..=3)
        .map(|i| f.sim.ip(i))
        .find(|ip| ip != address)
        .unwrap();
    let members = client
        .node(survivor.as_str())
        .etcd_member_list(false)
        .await
        .unwrap();
    assert_eq!(members.len(), 2, "{members:?}");
    assert!(members.iter().all(|m| !m.is_learner));
    for m in &members {
        let host = m.peer_urls[0]
            .split("//")
            .nth(1)
            .unwrap()
            .split(':')
            .next()
            .unwrap();
        let status = client.node(host).etcd_status().await.unwrap();
        assert!(status.errors.is_empty());
    }
    assert!(
        client.node(address).version().await.is_err(),
        "the retired node still answers"
    );
}

#[tokio::test]
async fn retire_of_the_leader_forfeits_leaves_resets_and_reports_the_gap() {
    let f = Fixture::start(3).await;
    f.sim
        .cluster
        .fill("/registry/test/", 50, 256)
        .await
        .unwrap();
    let leader = f.sim.leader().await;
    let run = f.ops(&["--yes", "retire", &leader]).await.ok();
    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    let steps: Vec<_> = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let names: Vec<_> = steps.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "snapshot",
            "check",
            "forfeit",
            "leave",
            "reset",
            "confirm",
            "wait-silent"
        ]
    );
    assert_eq!(steps[2].1, "done", "the leader forfeited: {record}");
    assert!(record["facts"]["leave_to_reset_gap_ms"].as_f64().unwrap() > 0.0);
    // The leave ended before the reset, sent at once after it, started
    // (its end is journaled with the reset's, its time is its own).
    let at = |step: usize, field: &str| {
        let text = record["steps"][step][field].as_str().unwrap();
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).unwrap()
    };
    assert!(at(3, "finished") <= at(4, "started"), "{record}");
    assert!(run.stderr.contains("[4] leave done"), "{}", run.stderr);
    // The snapshot is verified (its sidecar exists) and holds the data.
    let snapshot = PathBuf::from(record["facts"]["snapshot"].as_str().unwrap());
    let report = talos_client::snapshot::verify_file(&snapshot).unwrap();
    assert!(report.status.revision >= 50);
    assert!(PathBuf::from(format!("{}.json", snapshot.display())).exists());
    assert_retired(&f, &leader).await;
}

#[tokio::test]
async fn refusals_change_nothing() {
    let f = Fixture::start(3).await;
    let before = f.members().await;
    let refused = |run: Run, why: &str| {
        assert_eq!(
            run.code, 1,
            "stdout:\n{}\nstderr:\n{}",
            run.stdout, run.stderr
        );
        assert!(run.stderr.contains(why), "want {why:?} in:\n{}", run.stderr);
    };
    refused(
        f.ops(&["--yes", "retire", "10.99.0.1"]).await,
        "is not an etcd member",
    );
    // No terminal and no --yes.
    refused(f.ops(&["retire", "cp-2"]).await, "pass --yes");
    // The node is the talosconfig's only endpoint.
    let only = f.state.path().join("only-cp2");
    std::fs::copy(f.talosconfig(), &only).unwrap();
    let cp2_api = f.sim.cluster.nodes()[1].api.clone();
    run(&only, &["config", "endpoint", &cp2_api]).await.ok();
    refused(
        f.ops_with(&only, &["--yes", "retire", "cp-2"], None).await,
        "only endpoint",
    );
    // A learner is present (one that never starts, added straight to etcd).
    let urls: Vec<String> = f
        .sim
        .cluster
        .nodes()
        .iter()
        .map(|n| n.etcd_client_url.clone())
        .collect();
    let etcd = talos_sim::etcd_client::EtcdClient::connect(&urls, &f.sim.cluster.etcd_pki())
        .await
        .unwrap();
    let learner = wait_for(
        "etcd to accept a learner",
        Duration::from_secs(30),
        || async { etcd.member_add("http://127.0.0.1:9", true).await.ok() },
    )
    .await;
    refused(f.ops(&["--yes", "retire", "cp-2"]).await, "learner");
    etcd.member_remove(learner.id).await.unwrap();
    // --plan shows the plan, exits 0 and changes nothing.
    let plan = f.ops(&["--plan", "retire", "cp-1"]).await.ok();
    assert!(
        plan.stderr.contains("leave: EtcdLeaveCluster on cp-1"),
        "{}",
        plan.stderr
    );
    assert_eq!(f.members().await, before);
    // A remaining voter is down.
    f.sim.cluster.power_off("cp-3").await.unwrap();
    refused(
        f.ops(&["--yes", "retire", "cp-2"]).await,
        "voters are unhealthy: cp-3",
    );
    assert_eq!(
        f.members().await,
        before,
        "member lists identical before and after"
    );
}

/// A label the node has no volume for is refused at plan time, before the
/// snapshot, the forfeit and the leave: nothing changes and the node still
/// answers (upstream's Reset would refuse it only after the leave).
#[tokio::test]
async fn an_unknown_wipe_label_is_refused_before_anything_changes() {
    let f = Fixture::start(3).await;
    let before = f.members().await;
    for args in [
        ["--yes", "retire", "cp-3", "--wipe", "BOGUS"],
        ["--plan", "retire", "cp-3", "--wipe", "BOGUS"],
    ] {
        let run = f.ops(&args).await;
        assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
        assert!(
            run.stderr.contains("no located volume BOGUS") && run.stderr.contains("STATE"),
            "{}",
            run.stderr
        );
    }
    assert_eq!(f.members().await, before);
    assert!(f.sim.admin().node(f.sim.ip(3)).version().await.is_ok());
    let journal = f.ops(&["list"]).await.ok().json();
    assert_eq!(journal.as_array().map(Vec::len), Some(0), "{journal}");
}

/// A voter whose etcd service is down still answers on its API, but its
/// etcd calls wait for etcd (as on Talos): the preflight gives up on it
/// after its per-voter deadline and refuses, naming it.
#[tokio::test]
async fn a_voter_whose_etcd_is_down_is_unhealthy_for_the_preflight() {
    let f = Fixture::start(3).await;
    let before = f.members().await;
    f.sim.cluster.node("cp-3").unwrap().stop_etcd().await;
    let run = f.ops(&["--yes", "retire", "cp-2"]).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("voters are unhealthy") && run.stderr.contains("cp-3"),
        "{}",
        run.stderr
    );
    assert_eq!(f.members().await, before);
}

#[tokio::test]
async fn the_last_voter_is_not_retired() {
    let f = Fixture::start(1).await;
    let run = f.ops(&["--yes", "retire", "cp-1"]).await;
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("last voting member") || run.stderr.contains("only endpoint"),
        "{}",
        run.stderr
    );
}

#[tokio::test]
async fn join_waits_for_an_added_node_to_be_a_healthy_voter() {
    let f = Fixture::start(3).await;
    f.sim.cluster.add_node().await.unwrap();
    let run = f.ops(&["join", "cp-4", "--timeout", "90s"]).await.ok();
    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    assert!(record["facts"]["join_seconds"].as_f64().is_some());
    assert!(run.stderr.contains("even count"), "{}", run.stderr);
    assert!(f.members().await.iter().all(|(_, learner)| !learner));
}

#[tokio::test]
async fn snapshot_retention_keeps_exactly_n() {
    let f = Fixture::start(1).await;
    let dir = f.state.path().join("snaps");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("unrelated.db"), b"mine").unwrap();
    let mut taken = Vec::new();
    for _ in 0..3 {
        let record = f
            .ops(&["snapshot", "--dir", dir.to_str().unwrap(), "--keep", "2"])
            .await
            .ok()
            .json();
        taken.push(record["facts"]["snapshot"].as_str().unwrap().to_string());
    }
    let mut ours: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".db") && n != "unrelated.db")
        .collect();
    ours.sort();
    assert_eq!(ours.len(), 2, "{ours:?}");
    assert!(taken[2].ends_with(&ours[1]));
    assert!(dir.join("unrelated.db").exists());
}

#[tokio::test]
async fn one_operation_per_cluster() {
    let f = Fixture::start(3).await;
    // A join that cannot finish holds the cluster while it waits.
    let tc = f.talosconfig();
    let mut waiting = command(&tc);
    waiting
        .args(["ops", "--without-cluster-lock", "--state-dir"])
        .arg(f.state.path())
        .args(["join", "cp-9", "--timeout", "60s"]);
    let mut child = waiting
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let running = wait_for(
        "the join to be journaled",
        Duration::from_secs(30),
        || async {
            let list = f.ops(&["list"]).await.ok();
            let id = list.json()[0]["id"].as_str()?.to_string();
            Some(id)
        },
    )
    .await;
    let refused = f.ops(&["snapshot"]).await;
    assert_eq!(refused.code, 1);
    assert!(refused.stderr.contains(&running), "{}", refused.stderr);
    // Killed, the holder's lock goes with it; its operation is interrupted
    // and named until abandoned.
    child.kill().unwrap();
    child.wait().unwrap();
    let blocked = f.ops(&["snapshot"]).await;
    assert_eq!(blocked.code, 1);
    assert!(blocked.stderr.contains("interrupted"), "{}", blocked.stderr);
    f.ops(&["abandon", &running]).await.ok();
    f.ops(&["snapshot"]).await.ok();
}

/// Kills the CLI at `point` during a retire of cp-2, then checks that `ops
/// show` names the step in flight and `ops resume` ends like an
/// uninterrupted run.
async fn crash_and_resume(point: &str) {
    let f = Fixture::start(3).await;
    let address = f.sim.ip(2);
    let crashed = f
        .ops_with(
            &f.talosconfig(),
            &["--yes", "retire", &address],
            Some(point),
        )
        .await;
    assert_ne!(
        crashed.code, 0,
        "the CLI was to die at {point}:\n{}",
        crashed.stderr
    );
    let record = newest(&f).await;
    let id = record["id"].as_str().unwrap().to_string();
    let step = point.split(':').nth(1).unwrap();
    // The leave and the reset are one unit: nothing is journaled between
    // them, so until the unit ends the leave is the step in flight.
    let step = if step == "reset" { "leave" } else { step };
    let shown = f.ops(&["show", &id]).await.ok().json();
    let in_flight: Vec<_> = shown["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "running")
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(in_flight, [step], "{shown}");
    let resumed = f.ops(&["resume", &id]).await.ok().json();
    assert_eq!(resumed["state"], "succeeded", "{resumed}");
    assert_retired(&f, &address).await;
}

#[tokio::test]
async fn crash_while_taking_the_snapshot() {
    crash_and_resume("started:snapshot").await;
}

#[tokio::test]
async fn crash_before_the_leave_is_sent() {
    crash_and_resume("started:leave").await;
}

#[tokio::test]
async fn crash_after_the_leave_answered() {
    crash_and_resume("answered:leave").await;
}

#[tokio::test]
async fn crash_before_the_reset_is_sent() {
    crash_and_resume("started:reset").await;
}

#[tokio::test]
async fn crash_after_the_reset_answered() {
    crash_and_resume("answered:reset").await;
}

#[tokio::test]
async fn crash_while_confirming() {
    crash_and_resume("started:confirm").await;
}

#[tokio::test]
async fn crash_while_waiting_for_silence() {
    crash_and_resume("started:wait-silent").await;
}

#[tokio::test]
async fn crash_after_the_snapshot_answered() {
    crash_and_resume("answered:snapshot").await;
}

#[tokio::test]
async fn crash_after_the_forfeit_answered() {
    crash_and_resume("answered:forfeit").await;
}

#[tokio::test]
async fn crash_after_the_confirmation_answered() {
    crash_and_resume("answered:confirm").await;
}

#[tokio::test]
async fn crash_before_the_forfeit() {
    crash_and_resume("started:forfeit").await;
}

#[tokio::test]
async fn a_snapshot_cut_short_with_status_ok_is_rejected_and_leaves_nothing() {
    // Talos ends the stream with status OK when reading etcd fails part-way
    // (pkg/chunker/stream): only a content check notices.
    let f = Fixture::start(1).await;
    f.sim
        .cluster
        .fill("/registry/test/", 200, 4096)
        .await
        .unwrap();
    let node = f.sim.cluster.node("cp-1").unwrap();
    let dir = f.state.path().join("cut");
    std::fs::create_dir_all(&dir).unwrap();

    node.fail_next_snapshot_after(64 * 1024);
    let path = dir.join("etcd.db");
    let cut = run(
        &f.talosconfig(),
        &[
            "-n",
            &f.sim.ip(1),
            "etcd",
            "snapshot",
            path.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(cut.code, 1, "{}", cut.stderr);
    assert!(!path.exists(), "nothing under the final name");
    assert!(!dir.join("etcd.db.json").exists());

    node.fail_next_snapshot_after(64 * 1024);
    let ops_dir = dir.join("ops");
    let failed = f
        .ops(&["snapshot", "--dir", ops_dir.to_str().unwrap()])
        .await;
    assert_eq!(failed.code, 1, "{}", failed.stderr);
    assert!(failed.stderr.contains("snapshot"), "{}", failed.stderr);
    let finals: Vec<_> = std::fs::read_dir(&ops_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".db") || n.ends_with(".json"))
        .collect();
    assert!(finals.is_empty(), "{finals:?}");

    // Unarmed, the same commands succeed.
    run(
        &f.talosconfig(),
        &[
            "-n",
            &f.sim.ip(1),
            "etcd",
            "snapshot",
            path.to_str().unwrap(),
        ],
    )
    .await
    .ok();
    f.ops(&["snapshot", "--dir", ops_dir.to_str().unwrap()])
        .await
        .ok();
}
