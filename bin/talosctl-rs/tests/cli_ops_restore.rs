//! `ops restore` on the simulator's real etcd: a cluster whose members all
//! lost their etcd data (reset with EPHEMERAL, as Talos's disaster
//! recovery asks) comes back from a verified snapshot with the snapshot's
//! revision and keys, the other nodes rejoining as voters; on a live
//! cluster the restore is refused before anything is sent.

use std::time::Duration;

use talos_client::client::ResetRequest;
use talos_test_support::sim::wait_for;

mod ops_fixture;

use ops_fixture::Fixture;

#[tokio::test]
async fn a_cluster_that_lost_quorum_comes_back_from_a_snapshot() {
    // Every node waits to join from its boot until the restore gives it a
    // cluster: the join and promotion limits are upstream's own (30 min,
    // 10 min), not a tenth of them, so a slow machine does not make a node
    // give up before the restore is done.
    let timing = talos_sim::TalosTiming {
        join_limit: talos_sim::TalosTiming::UPSTREAM.join_limit,
        promote_limit: talos_sim::TalosTiming::UPSTREAM.promote_limit,
        ..talos_sim::TalosTiming::scaled_down(10)
    };
    let f = Fixture {
        sim: talos_test_support::sim::SimCluster::start_with(3, |cfg| cfg.timing = timing).await,
        state: tempfile::tempdir().unwrap(),
    };
    f.sim
        .cluster
        .fill("/talos-sim/fill/", 40, 256)
        .await
        .unwrap();
    let taken = f.ops(&["--yes", "snapshot"]).await.ok().json();
    let snapshot = taken["facts"]["snapshot"].as_str().unwrap().to_string();
    let report = talos_client::snapshot::verify_file(snapshot.as_ref()).unwrap();
    let target = f.sim.ip(1);

    // A live cluster: refused, nothing sent.
    let refused = f
        .ops(&["--yes", "restore", "--from", &snapshot, &target])
        .await;
    assert_ne!(refused.code, 0, "{}", refused.stdout);
    assert!(refused.stderr.contains("has quorum"), "{}", refused.stderr);
    // A file that is not a verified snapshot: refused too.
    let bogus = f.state.path().join("bogus.db");
    std::fs::write(&bogus, vec![0u8; 4096 + 32]).unwrap();
    let bad = f
        .ops(&[
            "--yes",
            "restore",
            "--from",
            bogus.to_str().unwrap(),
            &target,
        ])
        .await;
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("cannot be restored"), "{}", bad.stderr);

    // Every member loses its etcd data, as Talos's disaster recovery has
    // it: reset with EPHEMERAL wiped, reboot; each node then waits to join.
    let admin = f.sim.admin();
    for i in 1..=3 {
        admin
            .node(f.sim.ip(i))
            .reset(
                ResetRequest::default()
                    .with_graceful(false)
                    .with_reboot(true)
                    .with_system_labels_to_wipe(vec!["EPHEMERAL".into()]),
            )
            .await
            .unwrap();
    }
    wait_for(
        "every node back without etcd",
        Duration::from_secs(60),
        || async {
            for i in 1..=3 {
                let node = admin.node(f.sim.ip(i));
                node.version().await.ok()?;
                if node.etcd_status().await.is_ok() {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;

    // Killed right after the upload's check held; the target cut off
    // meanwhile: the resume checks again that quorum is lost and the
    // target answers with no etcd, and sends nothing.
    let crashed = f
        .ops_with(
            &f.talosconfig(),
            &["--yes", "restore", "--from", &snapshot, &target],
            Some("checked:upload"),
        )
        .await;
    assert_ne!(crashed.code, 0, "{}", crashed.stderr);
    let id = ops_fixture::newest(&f).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(f.sim.cluster.partition(&target).await.unwrap());
    let resumed = f.ops(&["--yes", "resume", &id]).await;
    assert!(f.sim.cluster.heal(&target).await.unwrap());
    assert_ne!(resumed.code, 0, "{}", resumed.stdout);
    assert!(
        resumed.stderr.contains("needs attention")
            && resumed.stderr.contains("check quorum-lost failed")
            && resumed
                .stderr
                .contains(&format!("{target} does not answer")),
        "{}",
        resumed.stderr
    );
    let shown = f.ops(&["show", &id]).await.ok().json();
    assert_eq!(shown["state"], "needs-attention", "{shown}");
    let upload = &shown["steps"][1];
    assert_eq!(upload["name"], "upload", "{shown}");
    let checks = upload["checks"].as_array().unwrap();
    assert_eq!(checks.last().unwrap()["held"], false, "{upload}");
    assert!(
        checks.iter().all(|c| c["gap_ms"].is_null()),
        "nothing was sent: {upload}"
    );

    // Reachable again: the resume restores.
    let restored = f.ops(&["--yes", "resume", &id]).await.ok().json();
    assert_eq!(restored["state"], "succeeded", "{restored}");
    let names: Vec<&str> = restored["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["verify", "upload", "bootstrap", "check", "rejoin"],
        "{restored}"
    );
    let (revision, keys) = (
        restored["facts"]["restored"][0].as_i64().unwrap(),
        restored["facts"]["restored"][1].as_u64().unwrap(),
    );
    assert!(revision >= report.status.revision, "{restored}");
    assert!(keys >= report.status.total_keys, "{restored}");
    assert_eq!(f.voters(1).await, ["cp-1", "cp-2", "cp-3"]);
    // The data written before the snapshot is there: a fresh verified
    // snapshot of another member holds at least its keys.
    let again = f.ops(&["--yes", "snapshot"]).await.ok().json();
    let path = again["facts"]["snapshot"].as_str().unwrap().to_string();
    let now = talos_client::snapshot::verify_file(path.as_ref()).unwrap();
    assert!(now.status.total_keys >= report.status.total_keys);
}
