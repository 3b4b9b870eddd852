//! talos-opsd when its journal fails: a write refused in the middle of an
//! operation (the database locked by another process past the busy
//! timeout: the path a full disk takes too) ends the operation in a
//! recorded, honest state, moves the files it wrote aside, and a later
//! start proceeds once the journal takes writes again, with no restart.
//! A journal that is empty or corrupt where one existed refuses the start
//! with a message naming the file and what to do.

mod daemon;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use daemon::{Daemon, cluster_toml, run_to_exit};
use talos_opsd::proto::operation_event::Event as Ev;
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::{SimCluster, wait_for};

fn snapshot() -> proto::StartOperationRequest {
    proto::StartOperationRequest {
        cluster: "a".into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(Kind::Snapshot(proto::SnapshotParams { keep: 0 })),
    }
}

/// Every event of operation `id` until its end.
async fn watch_all(
    client: &mut proto::opsd_client::OpsdClient<tonic::transport::Channel>,
    id: &str,
) -> Vec<Ev> {
    let mut stream = client
        .watch_operation(proto::WatchOperationRequest { id: id.into() })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(event) = stream.message().await.unwrap() {
        events.push(event.event.unwrap());
    }
    events
}

fn finished(events: &[Ev]) -> proto::Finished {
    match events.last() {
        Some(Ev::Finished(f)) => f.clone(),
        other => panic!("no Finished event: {other:?}"),
    }
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_journal_write_failure_is_recorded_and_a_later_start_proceeds() {
    let sim = SimCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let snaps = dir.path().join("snaps");
    let tc = sim.dir.path().join("talosconfig");
    let extra = format!("[cluster.snapshots]\ninterval = \"24h\"\ndir = {snaps:?}\n");
    let d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &tc, &extra),
        &[("TALOS_OPSD_TEST_JOURNAL_BUSY", "answered:snapshot")],
        &[],
    )
    .await;
    let mut client = d.client().await;
    let first = client
        .start_operation(snapshot())
        .await
        .unwrap()
        .into_inner()
        .id;
    // The snapshot is taken; its end cannot be journaled (the journal is
    // locked), nor, at once, the operation's failure.
    let end = finished(&watch_all(&mut client, &first).await);
    assert_eq!(end.state, "failed", "{end:?}");
    assert!(end.error.contains("database is locked"), "{end:?}");
    // The files it wrote are not left under final names uncatalogued.
    let files = names(&snaps);
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files.iter().all(|f| f.ends_with(".orphan")), "{files:?}");
    assert!(d.log_text().contains("moved aside"), "{}", d.log_text());
    // The API shows the end the operation will be recorded with.
    let shown = client
        .get_operation(proto::GetOperationRequest { id: first.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(shown.state, "failed");
    // While the journal still refuses writes, a start says so and why.
    let refused = client.start_operation(snapshot()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains(&first), "{refused:?}");
    assert!(
        refused.message().contains("database is locked"),
        "{refused:?}"
    );
    // The journal takes writes again: a start proceeds, no restart.
    std::fs::write(dir.path().join("state/journal-busy.release"), b"").unwrap();
    let second = client
        .start_operation(snapshot())
        .await
        .unwrap()
        .into_inner()
        .id;
    let end = finished(&watch_all(&mut client, &second).await);
    assert_eq!(end.state, "succeeded", "{end:?}");
    // The first is journaled as failed, its step saying what happened.
    let recorded = wait_for("the first recorded", Duration::from_secs(30), || {
        let mut client = client.clone();
        let id = first.clone();
        async move {
            let op = client
                .get_operation(proto::GetOperationRequest { id })
                .await
                .ok()?
                .into_inner();
            (op.state == "failed").then_some(op)
        }
    })
    .await;
    let step = &recorded.steps[0];
    assert_eq!(step.name, "snapshot");
    assert!(
        step.detail.contains("the journal could not record this")
            && step.detail.contains("database is locked")
            && step.detail.contains(".orphan"),
        "{step:?}"
    );
    let facts: serde_json::Value = serde_json::from_str(&recorded.facts_json).unwrap();
    assert!(facts["snapshot"].is_null(), "{facts}");
    // The catalogue holds the second snapshot only, under its final name.
    let catalogue = client
        .list_snapshots(proto::ListSnapshotsRequest {
            cluster: "a".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .snapshots;
    assert_eq!(catalogue.len(), 1, "{catalogue:?}");
    assert_eq!(catalogue[0].operation_id, second);
    assert!(PathBuf::from(&catalogue[0].path).exists());
    let not_orphans = names(&snaps)
        .into_iter()
        .filter(|f| !f.ends_with(".orphan"))
        .count();
    assert_eq!(not_orphans, 2);
}

#[tokio::test]
async fn a_corrupt_or_emptied_journal_is_refused_with_what_to_do() {
    let sim = SimCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let mut d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    let mut client = d.client().await;
    let id = client
        .start_operation(snapshot())
        .await
        .unwrap()
        .into_inner()
        .id;
    assert_eq!(
        finished(&watch_all(&mut client, &id).await).state,
        "succeeded"
    );
    drop(client);
    assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));
    let journal = dir.path().join("state/journal.sqlite");
    // Everything in the main file (no WAL left to mask a damaged page).
    rusqlite::Connection::open(&journal)
        .unwrap()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    let _ = std::fs::remove_file(dir.path().join("state/journal.sqlite-wal"));
    let _ = std::fs::remove_file(dir.path().join("state/journal.sqlite-shm"));
    let good = std::fs::read(&journal).unwrap();
    assert!(good.len() >= 3 * 4096, "{}", good.len());
    let config = d.config.clone();
    let mut damaged_page = good.clone();
    damaged_page[4096 + 100..8192].fill(0x5a);
    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("emptied", Vec::new(), "the file is empty"),
        (
            "damaged page",
            damaged_page.clone(),
            "integrity check failed",
        ),
        (
            "half truncated",
            good[..good.len() / 2].to_vec(),
            "cannot be trusted",
        ),
    ];
    for (what, bytes, says) in cases {
        std::fs::write(&journal, &bytes).unwrap();
        let (status, stderr) = run_to_exit(&[OsStr::new("--config"), config.as_os_str()]).await;
        assert!(!status.success(), "{what}: started\n{stderr}");
        for needle in [
            journal.display().to_string().as_str(),
            "cannot be trusted",
            says,
            "--recover-journal",
        ] {
            assert!(
                stderr.contains(needle),
                "{what}: no {needle:?} in\n{stderr}"
            );
        }
        assert!(!stderr.contains("panicked"), "{what}\n{stderr}");
        // Refused, not rewritten.
        assert_eq!(std::fs::read(&journal).unwrap(), bytes, "{what}");
    }
    // --recover-journal keeps the damaged file and starts a new journal.
    std::fs::write(&journal, &damaged_page).unwrap();
    drop(d);
    let mut d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &tc, ""),
        &[],
        &["--recover-journal"],
    )
    .await;
    let kept: Vec<_> = names(&dir.path().join("state"))
        .into_iter()
        .filter(|n| n.starts_with("journal.sqlite.corrupt-"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        std::fs::read(dir.path().join("state").join(&kept[0])).unwrap(),
        damaged_page
    );
    let ops = d
        .client()
        .await
        .list_operations(proto::ListOperationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .operations;
    assert!(ops.is_empty(), "{ops:?}");
    assert!(d.log_text().contains("moved aside"), "{}", d.log_text());
    assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));
}

/// The journal refuses writes from the moment the leave answers. Nothing
/// is journaled between the leave and the reset, so the reset still goes
/// out at once: the node does not keep serving without etcd. The
/// operation then cannot record its end; it says so, and once the journal
/// takes writes again its record holds both steps as done.
#[tokio::test]
async fn a_journal_that_fails_after_the_leave_does_not_hold_back_the_reset() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &tc, ""),
        &[("TALOS_OPSD_TEST_JOURNAL_BUSY", "answered:leave")],
        &[],
    )
    .await;
    let mut client = d.client().await;
    let target = sim.ip(3);
    let id = client
        .start_operation(proto::StartOperationRequest {
            cluster: "a".into(),
            plan_fingerprint: String::new(),
            without_cluster_lock: true,
            kind: Some(Kind::Retire(proto::RetireParams {
                node: target.clone(),
                ..Default::default()
            })),
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    let end = finished(&watch_all(&mut client, &id).await);
    assert_ne!(end.state, "succeeded", "{end:?}");
    assert!(end.error.contains("database is locked"), "{end:?}");
    // The reset went out right after the leave all the same.
    let node = sim.cluster.node(&target).unwrap();
    assert!(!node.is_configured(), "cp-3 was reset");
    let members = sim
        .admin()
        .node(sim.ip(1))
        .etcd_member_list(false)
        .await
        .unwrap();
    assert_eq!(members.len(), 2, "{members:?}");

    std::fs::write(dir.path().join("state/journal-busy.release"), b"").unwrap();
    let recorded = wait_for("the retire recorded", Duration::from_secs(30), || {
        let mut client = client.clone();
        let id = id.clone();
        async move {
            let op = client
                .get_operation(proto::GetOperationRequest { id })
                .await
                .ok()?
                .into_inner();
            let leave = op.steps.iter().find(|s| s.name == "leave")?;
            (leave.state == "done").then_some(op)
        }
    })
    .await;
    let reset = recorded.steps.iter().find(|s| s.name == "reset").unwrap();
    assert_eq!(reset.state, "done", "{recorded:?}");
    // Destructive steps ran and the rest did not: a person resumes it.
    assert_eq!(recorded.state, "needs-attention", "{recorded:?}");
    assert!(reset.detail.contains("reset accepted"), "{reset:?}");
}
