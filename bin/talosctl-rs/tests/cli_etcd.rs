//! The real talosctl-rs binary against talos-sim: etcd commands.

use talos_test_support as common;

use common::cli::{etcd_members_json, run};
use common::sim::SimCluster;

fn is_member_id(v: &serde_json::Value) -> bool {
    v.as_str()
        .is_some_and(|s| s.len() == 16 && s.chars().all(|c| c.is_ascii_hexdigit()))
}

#[tokio::test]
async fn members_status_and_alarms() {
    let sim = SimCluster::start(3).await;
    let tc = sim.dir.path().join("talosconfig");

    let table = run(&tc, &["etcd", "members"]).await.ok();
    let header = table.stdout.lines().next().unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        [
            "NODE", "ID", "HOSTNAME", "PEER", "URLS", "CLIENT", "URLS", "LEARNER"
        ]
    );
    assert_eq!(table.stdout.lines().count(), 4);

    let members = run(&tc, &["-o", "json", "etcd", "members"])
        .await
        .ok()
        .json();
    let list = members[0]["result"].as_array().unwrap();
    assert_eq!(members[0]["node"], sim.ip(1));
    assert_eq!(list.len(), 3);
    assert!(
        list.iter()
            .all(|m| is_member_id(&m["id"]) && m["is_learner"] == false)
    );

    let nodes = format!("{},{},{}", sim.ip(1), sim.ip(2), sim.ip(3));
    let status = run(&tc, &["-o", "json", "-n", &nodes, "etcd", "status"])
        .await
        .ok()
        .json();
    let status = status.as_array().unwrap();
    assert_eq!(status.len(), 3);
    let leader = &status[0]["result"]["leader"];
    assert!(is_member_id(leader));
    assert!(status.iter().all(|s| &s["result"]["leader"] == leader));

    let alarms = run(&tc, &["-o", "yaml", "etcd", "alarm", "list"])
        .await
        .ok();
    let alarms: serde_norway::Value = serde_norway::from_str(&alarms.stdout).unwrap();
    assert_eq!(alarms[0]["result"].as_sequence().unwrap().len(), 0);
    run(&tc, &["etcd", "alarm", "disarm"]).await.ok();
    run(&tc, &["etcd", "defrag"]).await.ok();
}

#[tokio::test]
async fn forfeit_leave_and_remove_member() {
    let sim = SimCluster::start(3).await;
    let tc = sim.dir.path().join("talosconfig");
    let bad = run(&tc, &["etcd", "remove-member", "not-hex"]).await;
    assert_eq!(bad.code, 2);
    assert!(
        bad.stderr.starts_with("error: error parsing member ID"),
        "{}",
        bad.stderr
    );
    let unknown = run(&tc, &["etcd", "remove-member", "00000000000004d2"]).await;
    assert_eq!(unknown.code, 1);
    assert!(unknown.stderr.contains("not found"), "{}", unknown.stderr);
    assert!(unknown.stderr.contains("hint:"), "{}", unknown.stderr);
    let nodes = format!("{},{},{}", sim.ip(1), sim.ip(2), sim.ip(3));
    let status = run(&tc, &["-o", "json", "-n", &nodes, "etcd", "status"])
        .await
        .ok()
        .json();
    let status = status.as_array().unwrap();
    let leader = status
        .iter()
        .find(|s| s["result"]["leader"] == s["result"]["member_id"])
        .expect("a leader")["node"]
        .as_str()
        .unwrap()
        .to_string();
    let follower = status
        .iter()
        .find(|s| s["node"] != leader.as_str())
        .unwrap()["node"]
        .as_str()
        .unwrap()
        .to_string();
    let stays = run(
        &tc,
        &["-o", "json", "-n", &follower, "etcd", "forfeit-leadership"],
    )
    .await
    .ok()
    .json();
    assert!(
        stays[0]["result"].is_null(),
        "a follower has nothing to forfeit: {stays}"
    );
    let moved = run(
        &tc,
        &["-o", "json", "-n", &leader, "etcd", "forfeit-leadership"],
    )
    .await
    .ok()
    .json();
    let new_leader = moved[0]["result"]
        .as_str()
        .expect("the leader names its successor");
    assert!(new_leader.starts_with("cp-"), "{moved}");

    // Leave is single-node only, like talosctl.
    let refused = run(&tc, &["-n", &nodes, "etcd", "leave"]).await;
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(refused.stderr.contains("not supported with multiple nodes"));

    run(&tc, &["-n", &sim.ip(3), "etcd", "leave"]).await.ok();
    let members = etcd_members_json(&tc).await;
    assert_eq!(members[0]["result"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn snapshot_is_verified_and_agrees_with_etcdctl() {
    let sim = SimCluster::start(3).await;
    sim.cluster
        .fill("/registry/test/", 200, 2048)
        .await
        .unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let path = sim.dir.path().join("backup.db");
    let out = run(
        &tc,
        &["-n", &sim.ip(2), "etcd", "snapshot", path.to_str().unwrap()],
    )
    .await
    .ok();
    let lines: Vec<_> = out.stdout.lines().collect();
    assert!(
        lines[0].starts_with(&format!(
            "etcd snapshot saved to {:?} (",
            path.display().to_string()
        )),
        "{}",
        out.stdout
    );
    assert!(
        lines[1].starts_with("snapshot info: hash "),
        "{}",
        out.stdout
    );
    assert!(lines[2].starts_with("verified: sha256 "), "{}", out.stdout);

    let sidecar: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path.with_extension("db.json")).unwrap()).unwrap();
    assert_eq!(sidecar["node"], sim.ip(2));
    let etcdctl = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "status", "-w", "json"])
        .arg(&path)
        .output()
        .expect("etcdctl (Debian's etcd-client) is installed");
    assert!(
        etcdctl.status.success(),
        "{}",
        String::from_utf8_lossy(&etcdctl.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&etcdctl.stdout).unwrap();
    assert_eq!(status["revision"], sidecar["revision"]);
    // etcdctl 3.4 counts every entry of every bucket, talosctl (etcd 3.6)
    // the live keys; the line shows talosctl's number.
    assert_eq!(status["totalKey"], sidecar["total_entries"]);
    assert!(
        lines[1].contains(&format!(", total keys {},", sidecar["total_keys"])),
        "{}",
        out.stdout
    );
    assert_eq!(status["totalSize"], sidecar["total_size"]);
    assert_eq!(status["hash"], sidecar["hash"]);
    let live = sidecar["total_keys"].as_u64().unwrap();
    assert!(live >= 200, "{sidecar}");
    assert!(
        live < sidecar["total_entries"].as_u64().unwrap(),
        "{sidecar}"
    );

    // Offline verification of the same file, then of damaged copies.
    let verified = run(
        &tc,
        &["-o", "json", "snapshot", "verify", path.to_str().unwrap()],
    )
    .await
    .ok()
    .json();
    assert_eq!(verified["sha256"], sidecar["sha256"]);
    let mut data = std::fs::read(&path).unwrap();
    let flipped = sim.dir.path().join("flipped.db");
    let middle = data.len() / 2;
    data[middle] ^= 0x40;
    std::fs::write(&flipped, &data).unwrap();
    let rejected = run(&tc, &["snapshot", "verify", flipped.to_str().unwrap()]).await;
    assert_eq!(rejected.code, 1);
    assert!(rejected.stderr.contains("sha256"), "{}", rejected.stderr);
    let truncated = sim.dir.path().join("truncated.db");
    std::fs::write(&truncated, &std::fs::read(&path).unwrap()[..middle]).unwrap();
    let rejected = run(&tc, &["snapshot", "verify", truncated.to_str().unwrap()]).await;
    assert_eq!(rejected.code, 1, "{}", rejected.stderr);

    let many = run(
        &tc,
        &[
            "-n",
            &format!("{},{}", sim.ip(1), sim.ip(2)),
            "etcd",
            "snapshot",
            "x.db",
        ],
    )
    .await;
    assert_eq!(many.code, 2);
}

#[tokio::test]
async fn a_node_killed_mid_snapshot_leaves_nothing_under_path() {
    let sim = SimCluster::start(3).await;
    // About 40 MB: far more than the transport buffers in flight.
    sim.cluster.fill("/big/", 40, 1 << 20).await.unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let path = sim.dir.path().join("killed.db");
    let part = sim.dir.path().join("killed.db.part");
    let child = common::cli::command(&tc)
        .args(["-n", &sim.ip(2), "etcd", "snapshot"])
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    common::sim::wait_for(
        "the transfer to start",
        std::time::Duration::from_secs(30),
        || async {
            std::fs::metadata(&part)
                .ok()
                .filter(|m| m.len() > 0)
                .map(|_| ())
        },
    )
    .await;
    // Freeze the client so it cannot finish, kill the node, let it go on.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    sim.cluster.power_off("cp-2").await.unwrap();
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!path.exists(), "nothing may be left under PATH");
    assert!(!part.exists(), "the partial transfer is removed");
    assert!(!path.with_extension("db.json").exists());
}
