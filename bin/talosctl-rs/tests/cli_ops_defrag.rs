//! `ops defrag` on the simulator's real etcd members: space left by
//! deleted, compacted data is given back on every member, the leader last
//! after handing its leadership over; an unhealthy member refuses the
//! whole operation before anything runs.

use std::time::Duration;

use talos_test_support::sim::wait_for;

mod ops_fixture;

use ops_fixture::Fixture;

/// Each member's (hostname, db_size, db_size_in_use), and the leader's
/// address.
async fn sizes(f: &Fixture) -> (Vec<(String, i64, i64)>, String) {
    let admin = f.sim.admin();
    let mut out = Vec::new();
    let mut leader = String::new();
    for i in 1..=3 {
        let node = admin.node(f.sim.ip(i));
        let status = node.etcd_status().await.unwrap();
        if status.is_leader() {
            leader = f.sim.ip(i);
        }
        out.push((
            node.hostname().await.unwrap(),
            status.db_size,
            status.db_size_in_use,
        ));
    }
    (out, leader)
}

#[tokio::test]
async fn defrag_reclaims_space_on_every_member_leader_last() {
    let f = Fixture::start(3).await;
    f.sim
        .cluster
        .fill("/talos-sim/fill/", 300, 16 * 1024)
        .await
        .unwrap();
    assert_eq!(f.sim.cluster.clear("/talos-sim/fill/").await.unwrap(), 300);
    // bbolt counts the pages the compaction freed as free only after later
    // commits (no reader holds them then); a live cluster writes all the
    // time, so a small write per poll stands in for that traffic.
    let (before, leader) = wait_for(
        "every member to free the compacted pages",
        Duration::from_secs(60),
        || async {
            f.sim.cluster.fill("/talos-sim/tick/", 1, 8).await.unwrap();
            let (sizes, leader) = sizes(&f).await;
            sizes
                .iter()
                .all(|(_, size, in_use)| (*in_use as f64) < 0.5 * *size as f64)
                .then_some((sizes, leader))
        },
    )
    .await;
    assert!(!leader.is_empty(), "a member leads");

    let result = f.ops(&["--yes", "defrag"]).await.ok().json();
    assert_eq!(result["state"], "succeeded", "{result}");
    let steps: Vec<(String, String)> = result["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["node"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let names: Vec<&str> = steps.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["check", "defrag", "defrag", "forfeit", "defrag"],
        "{result}"
    );
    // The leader's turn is last, after the forfeit.
    assert_eq!(steps[3].1, leader, "{result}");
    assert_eq!(steps[4].1, leader, "{result}");
    // Every member gave space back, as recorded and as etcd now reports.
    let members = result["facts"]["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{result}");
    for m in members {
        let (size, after) = (
            m["db_size"].as_i64().unwrap(),
            m["db_size_after"].as_i64().unwrap(),
        );
        assert!(after < size, "{m}");
    }
    let (now, _) = sizes(&f).await;
    for ((name, size, _), (_, after, _)) in before.iter().zip(&now) {
        assert!(after < size, "{name}: {size} -> {after}");
    }
    assert_eq!(f.voters(1).await, ["cp-1", "cp-2", "cp-3"]);
}

#[tokio::test]
async fn defrag_refuses_a_bad_threshold_and_an_unhealthy_member() {
    let f = Fixture::start(3).await;
    let bad = f.ops(&["--yes", "defrag", "--threshold", "0"]).await;
    // A usage error (exit 2) that names the flag and the range.
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(
        bad.stderr.contains("--threshold") && bad.stderr.contains("(0, 1]"),
        "{}",
        bad.stderr
    );

    // The leader hangs: the endpoint's linearizable member list cannot
    // answer until another member leads, so the preflight must read the
    // members another way and name the frozen one, not time out.
    let (before, leader) = sizes(&f).await;
    let frozen = f.sim.cluster.node(&leader).unwrap();
    assert!(frozen.freeze_etcd().await);
    let refused = f.ops(&["--yes", "defrag", "--all"]).await;
    assert!(frozen.thaw_etcd().await);
    assert_ne!(refused.code, 0, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("unhealthy") && refused.stderr.contains(&frozen.name),
        "{}",
        refused.stderr
    );
    // Nothing ran: no member was rewritten.
    let (after, _) = sizes(&f).await;
    assert_eq!(
        before.iter().map(|(_, s, _)| *s).collect::<Vec<_>>(),
        after.iter().map(|(_, s, _)| *s).collect::<Vec<_>>()
    );
}

/// The process dies with the leader's defragmentation in flight (after
/// its forfeit): `ops resume` runs that step again (a defragmentation is
/// safe to repeat) and the operation ends as an uninterrupted one does.
#[tokio::test]
async fn a_defrag_killed_in_flight_is_resumed_to_the_end() {
    let f = Fixture::start(3).await;
    let (_, leader) = sizes(&f).await;
    let crash = format!("started:defrag {leader}");
    let crashed = f
        .ops_with(
            &f.talosconfig(),
            &["--yes", "defrag", "--all"],
            Some(&crash),
        )
        .await;
    assert_ne!(crashed.code, 0, "{}", crashed.stderr);
    let listed = f.ops(&["list"]).await.ok().json();
    let id = listed[0]["id"].as_str().unwrap().to_string();
    let shown = f.ops(&["show", &id]).await.ok().json();
    let states: Vec<&str> = shown["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states,
        ["done", "done", "done", "done", "running"],
        "{shown}"
    );
    let resumed = f.ops(&["resume", &id]).await.ok().json();
    assert_eq!(resumed["state"], "succeeded", "{resumed}");
    let last = &resumed["steps"][4];
    assert_eq!(last["node"], leader.as_str(), "{resumed}");
    assert!(
        last["detail"].as_str().unwrap().contains("reclaimed"),
        "{resumed}"
    );
    assert_eq!(f.voters(1).await, ["cp-1", "cp-2", "cp-3"]);
}

/// etcd's quota really exceeded (a 4 MiB quota filled up): NOSPACE is
/// raised and writes are refused. After the data is deleted and compacted,
/// `ops defrag --all` rewrites every member and only then disarms the
/// alarm, as its last step; writes are accepted again and the alarm stays
/// off (a disarm before the space was given back would see it raised again).
#[tokio::test]
async fn a_nospace_alarm_is_disarmed_only_after_the_defrag_that_freed_space() {
    use talos_client::client::AlarmType;
    let f = Fixture {
        sim: talos_test_support::sim::SimCluster::start_with(3, |c| {
            c.quota_backend_bytes = 4 << 20
        })
        .await,
        state: tempfile::tempdir().unwrap(),
    };
    let mut written = 0;
    let refused = loop {
        match f
            .sim
            .cluster
            .fill(&format!("/talos-sim/fill/{written:04}-"), 1, 64 << 10)
            .await
        {
            Ok(()) => written += 1,
            Err(e) => break e.to_string(),
        }
        assert!(written < 200, "4 MiB quota never exceeded");
    };
    assert!(refused.contains("space exceeded"), "{refused}");
    let admin = f.sim.admin();
    let alarms = admin.node(f.sim.ip(1)).etcd_alarm_list().await.unwrap();
    assert!(
        alarms.iter().any(|a| a.alarm == AlarmType::Nospace),
        "{alarms:?}"
    );
    // Deletes and compaction are what etcd still accepts under NOSPACE.
    assert!(f.sim.cluster.clear("/talos-sim/fill/").await.unwrap() >= written);

    let result = f.ops(&["--yes", "defrag", "--all"]).await.ok().json();
    assert_eq!(result["state"], "succeeded", "{result}");
    let names: Vec<&str> = result["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["check", "defrag", "defrag", "forfeit", "defrag", "disarm"],
        "the disarm comes after every defragmentation: {result}"
    );
    for m in result["facts"]["members"].as_array().unwrap() {
        let (size, after) = (
            m["db_size"].as_i64().unwrap(),
            m["db_size_after"].as_i64().unwrap(),
        );
        assert!(after < size / 2, "{m}");
    }
    assert!(
        admin
            .node(f.sim.ip(1))
            .etcd_alarm_list()
            .await
            .unwrap()
            .is_empty()
    );
    f.sim
        .cluster
        .fill("/talos-sim/after/", 1, 1024)
        .await
        .expect("writes are accepted again");
    assert!(
        admin
            .node(f.sim.ip(2))
            .etcd_alarm_list()
            .await
            .unwrap()
            .is_empty()
    );
}
