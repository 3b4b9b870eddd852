//! `ops upgrade` on the simulator's real etcd members: a verified snapshot,
//! then one control-plane node at a time, the leader last after a forfeit,
//! each counted as upgraded only once it answers from a new boot on the
//! image's release with its member a healthy voter; a node that boots its
//! old partition stops the operation there, the others untouched.

use talos_sim::UpgradeFault;

mod ops_fixture;

use ops_fixture::Fixture;

const IMAGE: &str = "ghcr.io/siderolabs/installer:v1.14.0";

/// Each node's (address, Talos tag).
async fn versions(f: &Fixture) -> Vec<(String, String)> {
    let admin = f.sim.admin();
    let mut out = Vec::new();
    for i in 1..=3 {
        let tag = admin.node(f.sim.ip(i)).version().await.unwrap().tag;
        out.push((f.sim.ip(i), tag));
    }
    out
}

/// The (name, node) of each step of an ops result.
fn steps(result: &serde_json::Value) -> Vec<(String, String)> {
    result["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["node"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn an_upgrade_moves_every_node_the_leader_last_after_a_verified_snapshot() {
    let f = Fixture::start(3).await;
    let leader = f.sim.leader().await;
    assert!(versions(&f).await.iter().all(|(_, v)| v == "v1.13.9"));

    let result = f
        .ops(&["--yes", "upgrade", "--image", IMAGE])
        .await
        .ok()
        .json();
    assert_eq!(result["state"], "succeeded", "{result}");
    let steps = steps(&result);
    let names: Vec<&str> = steps.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "check",
            "snapshot",
            "upgrade",
            "wait-back",
            "upgrade",
            "wait-back",
            "forfeit",
            "upgrade",
            "wait-back"
        ],
        "{result}"
    );
    // The leader's turn is last, after its forfeit.
    assert_eq!(steps[6].1, leader, "{result}");
    assert_eq!(steps[7].1, leader, "{result}");
    assert_ne!(steps[2].1, steps[4].1);
    // The snapshot came first and verified.
    let snapshot = result["facts"]["snapshot"].as_str().unwrap();
    assert!(std::path::Path::new(snapshot).exists(), "{result}");
    assert!(std::path::Path::new(&format!("{snapshot}.json")).exists());
    // Every node runs the target, three voters again.
    assert!(
        versions(&f).await.iter().all(|(_, v)| v == "v1.14.0"),
        "{:?}",
        versions(&f).await
    );
    assert_eq!(f.voters(1).await, ["cp-1", "cp-2", "cp-3"]);
}

#[tokio::test]
async fn a_node_that_boots_its_old_partition_stops_the_upgrade_there() {
    let f = Fixture::start(3).await;
    let leader = f.sim.leader().await;
    // The first node in the plan's order: a follower.
    let plan = f.ops(&["--plan", "upgrade", "--image", IMAGE]).await.ok();
    assert!(!plan.stdout.is_empty(), "{}", plan.stderr);
    let plan = plan.json();
    let first = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "upgrade")
        .and_then(|s| s["node"].as_str())
        .unwrap()
        .to_string();
    assert_ne!(first, leader);
    f.sim
        .cluster
        .fail_next_upgrade(&first, UpgradeFault::BootsOldPartition)
        .unwrap();

    let run = f.ops(&["--yes", "upgrade", "--image", IMAGE]).await;
    assert_ne!(run.code, 0, "{}", run.stdout);
    assert!(run.stderr.contains("old partition"), "{}", run.stderr);
    let listed = f.ops(&["list"]).await.ok().json();
    let id = listed[0]["id"].as_str().unwrap().to_string();
    let result = f.ops(&["show", &id]).await.ok().json();
    assert_eq!(result["state"], "needs-attention", "{result}");
    let failed = result["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["state"] == "failed")
        .unwrap_or_else(|| panic!("a failed step: {result}"));
    assert_eq!(failed["name"], "wait-back", "{result}");
    assert_eq!(failed["node"], first.as_str(), "{result}");
    let detail = failed["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("old partition"), "{detail}");
    // Nothing continued to the next node.
    let upgraded = result["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == "upgrade" && s["state"] == "done")
        .count();
    assert_eq!(upgraded, 1, "{result}");
    for (node, version) in versions(&f).await {
        assert_eq!(version, "v1.13.9", "{node}: the others untouched");
    }
}

#[tokio::test]
async fn an_unsupported_step_or_an_image_without_a_release_changes_nothing() {
    let f = Fixture::start(3).await;
    let skip = f
        .ops(&[
            "--yes",
            "upgrade",
            "--image",
            "ghcr.io/siderolabs/installer:v1.15.0",
        ])
        .await;
    assert_ne!(skip.code, 0);
    assert!(
        skip.stderr.contains("skips a minor release"),
        "{}",
        skip.stderr
    );
    let untagged = f
        .ops(&[
            "--yes",
            "upgrade",
            "--image",
            "ghcr.io/siderolabs/installer:latest",
        ])
        .await;
    assert_ne!(untagged.code, 0);
    assert!(
        untagged.stderr.contains("names no Talos release"),
        "{}",
        untagged.stderr
    );
    for (node, version) in versions(&f).await {
        assert_eq!(version, "v1.13.9", "{node}");
    }
}

/// The process dies as the leader's upgrade is answered, before the
/// journal records it: `ops resume` does not send it a second time once
/// the node runs the target, and ends as an uninterrupted run does.
#[tokio::test]
async fn an_upgrade_killed_after_the_leaders_upgrade_was_sent_resumes_to_the_end() {
    let f = Fixture::start(3).await;
    let leader = f.sim.leader().await;
    let crash = format!("answered:upgrade {leader}");
    let crashed = f
        .ops_with(
            &f.talosconfig(),
            &["--yes", "upgrade", "--image", IMAGE],
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
        [
            "done", "done", "done", "done", "done", "done", "done", "running", "pending"
        ],
        "{shown}"
    );
    let resumed = f.ops(&["resume", &id]).await.ok().json();
    assert_eq!(resumed["state"], "succeeded", "{resumed}");
    let steps = steps(&resumed);
    assert_eq!(
        steps[7],
        ("upgrade".to_string(), leader.clone()),
        "{resumed}"
    );
    assert_eq!(steps[8], ("wait-back".to_string(), leader), "{resumed}");
    assert!(
        versions(&f).await.iter().all(|(_, v)| v == "v1.14.0"),
        "{:?}",
        versions(&f).await
    );
    assert_eq!(f.voters(1).await, ["cp-1", "cp-2", "cp-3"]);
}

/// The process dies at `point` (a step as labelled; `FIRST` and `LEADER`
/// stand for the first node in the plan's order and the leader), then
/// `ops resume` ends the operation as an uninterrupted run does: every node
/// on the target, three voters.
async fn crash_and_resume(point: &str) {
    let f = Fixture::start(3).await;
    let plan = f.ops(&["--plan", "upgrade", "--image", IMAGE]).await.ok();
    let plan = plan.json();
    let upgrades: Vec<String> = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == "upgrade")
        .map(|s| s["node"].as_str().unwrap().to_string())
        .collect();
    let point = point
        .replace("FIRST", &upgrades[0])
        .replace("LEADER", &upgrades[2]);
    let crashed = f
        .ops_with(
            &f.talosconfig(),
            &["--yes", "upgrade", "--image", IMAGE],
            Some(&point),
        )
        .await;
    assert_ne!(crashed.code, 0, "{point}: {}", crashed.stderr);
    let listed = f.ops(&["list"]).await.ok().json();
    let id = listed[0]["id"].as_str().unwrap().to_string();
    let resumed = f.ops(&["resume", &id]).await;
    assert_eq!(resumed.code, 0, "{point}: {}", resumed.stderr);
    let resumed = resumed.json();
    assert_eq!(resumed["state"], "succeeded", "{point}: {resumed}");
    assert!(
        versions(&f).await.iter().all(|(_, v)| v == "v1.14.0"),
        "{point}: {:?}",
        versions(&f).await
    );
    assert_eq!(f.voters(1).await, ["cp-1", "cp-2", "cp-3"], "{point}");
}

#[tokio::test]
async fn crash_while_taking_the_snapshot() {
    crash_and_resume("started:snapshot").await;
}

#[tokio::test]
async fn crash_before_the_first_upgrade_is_sent() {
    crash_and_resume("started:upgrade FIRST").await;
}

#[tokio::test]
async fn crash_after_the_first_upgrade_answered() {
    crash_and_resume("answered:upgrade FIRST").await;
}

#[tokio::test]
async fn crash_while_waiting_for_the_first_node() {
    crash_and_resume("started:wait-back FIRST").await;
}

#[tokio::test]
async fn crash_after_the_forfeit_answered() {
    crash_and_resume("answered:forfeit LEADER").await;
}

#[tokio::test]
async fn crash_while_waiting_for_the_leader() {
    crash_and_resume("started:wait-back LEADER").await;
}

/// `--workers --parallel 2`: after the control plane, both workers go at
/// once (their upgrades sent, then each awaited), each gated on its boot,
/// release and services.
#[tokio::test]
async fn workers_follow_the_control_plane_two_at_a_time() {
    let f = Fixture {
        sim: talos_test_support::sim::SimCluster::start_with(3, |c| c.workers = 2).await,
        state: tempfile::tempdir().unwrap(),
    };
    let result = f
        .ops(&[
            "--yes",
            "upgrade",
            "--image",
            IMAGE,
            "--workers",
            "--parallel",
            "2",
        ])
        .await
        .ok()
        .json();
    assert_eq!(result["state"], "succeeded", "{result}");
    let steps = steps(&result);
    let names: Vec<&str> = steps.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[9..],
        ["upgrade", "upgrade", "wait-back", "wait-back"],
        "{result}"
    );
    let admin = f.sim.admin();
    for node in f.sim.cluster.nodes() {
        let tag = admin.node(node.ip.to_string()).version().await.unwrap().tag;
        assert_eq!(tag, "v1.14.0", "{}", node.name);
    }
    let workers: Vec<String> = f
        .sim
        .cluster
        .nodes()
        .iter()
        .filter(|n| n.worker)
        .map(|n| n.ip.to_string())
        .collect();
    assert_eq!(workers.len(), 2);
    assert!(workers.contains(&steps[9].1) && workers.contains(&steps[10].1));
    assert_ne!(steps[9].1, steps[10].1);
}

/// A node whose upgrade never comes back fails its wait after
/// `--reboot-timeout`, as needs-attention; nothing continues.
#[tokio::test]
async fn a_node_that_never_comes_back_stops_the_upgrade_after_its_timeout() {
    let f = Fixture::start(3).await;
    let plan = f.ops(&["--plan", "upgrade", "--image", IMAGE]).await.ok();
    let plan = plan.json();
    let first = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "upgrade")
        .and_then(|s| s["node"].as_str())
        .unwrap()
        .to_string();
    f.sim
        .cluster
        .fail_next_upgrade(&first, UpgradeFault::NeverComesBack)
        .unwrap();
    let run = f
        .ops(&[
            "--yes",
            "upgrade",
            "--image",
            IMAGE,
            "--reboot-timeout",
            "10s",
        ])
        .await;
    assert_ne!(run.code, 0, "{}", run.stdout);
    assert!(
        run.stderr
            .contains("not back on v1.14.0 and healthy within 10 s"),
        "{}",
        run.stderr
    );
    let listed = f.ops(&["list"]).await.ok().json();
    let id = listed[0]["id"].as_str().unwrap().to_string();
    let shown = f.ops(&["show", &id]).await.ok().json();
    assert_eq!(shown["state"], "needs-attention", "{shown}");
    // The others were not touched (the first one stays down).
    let admin = f.sim.admin();
    for ip in (1..=3).map(|i| f.sim.ip(i)).filter(|ip| *ip != first) {
        let tag = admin.node(ip.as_str()).version().await.unwrap().tag;
        assert_eq!(tag, "v1.13.9", "{ip}");
    }
}
