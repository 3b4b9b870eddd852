//! `talosctl-rs upgrade` against the simulator: the path talosctl 1.13.9
//! picks, the wait through the reboot, and the upgrade faults.

use talos_test_support as common;

use std::time::Duration;

use common::cli::run;
use common::sim::{SimCluster, wait_for};
use talos_sim::UpgradeFault;

const TARGET: &str = "ghcr.io/siderolabs/installer:v1.14.0";

/// Waits until node `i`'s member answers status as a healthy voter, and
/// returns its member id.
async fn healthy_voter(sim: &SimCluster, i: usize) -> String {
    let client = sim.admin().node(sim.ip(i));
    wait_for("a healthy voting member", Duration::from_secs(60), || {
        let client = client.clone();
        async move {
            let status = client.etcd_status().await.ok()?;
            if !status.errors.is_empty() || status.is_learner {
                return None;
            }
            let members = client.etcd_member_list(false).await.ok()?;
            let me = members.iter().find(|m| m.id == status.member_id)?;
            (!me.is_learner).then(|| status.member_id.to_string())
        }
    })
    .await
}

#[tokio::test]
async fn upgrade_waits_for_the_new_boot_and_reports_the_target_version() {
    let sim = SimCluster::start(3).await;
    let tc = sim.dir.path().join("talosconfig");
    let member = healthy_voter(&sim, 2).await;
    let node = sim.cluster.node("cp-2").unwrap();
    let boot = node.boot_id();

    let out = run(
        &tc,
        &["-o", "json", "upgrade", "--image", TARGET, "-n", &sim.ip(2)],
    )
    .await
    .ok()
    .json();
    let result = &out[0];
    assert_eq!(result["node"], sim.ip(2));
    // 1.13.9 is above 1.13.0-alpha.2: talosctl 1.13.9 takes the new path.
    assert_eq!(result["path"], "lifecycle");
    assert_eq!(result["version"], "v1.14.0");
    assert_eq!(result["boot_id_before"], boot.as_str());
    assert_eq!(result["boot_id"], node.boot_id().as_str());
    assert_ne!(result["boot_id"], result["boot_id_before"]);

    // As read from the node afterwards: the target, and the same member,
    // voting and healthy, restarted from its data.
    let version = sim.admin().node(sim.ip(2)).version().await.unwrap();
    assert_eq!(version.tag, "v1.14.0");
    assert_eq!(healthy_voter(&sim, 2).await, member);
    assert!(node.etcd_data_dir().join("member").exists());
    let members = sim
        .admin()
        .node(sim.ip(1))
        .etcd_member_list(false)
        .await
        .unwrap();
    assert_eq!(members.len(), 3);

    // The legacy call when asked for, in a table.
    let boot = node.boot_id();
    let table = run(
        &tc,
        &[
            "upgrade",
            "--legacy",
            "--image",
            "ghcr.io/siderolabs/installer:v1.13.9",
            "-n",
            &sim.ip(2),
        ],
    )
    .await
    .ok();
    let row = table.stdout.lines().nth(1).unwrap_or_default().to_string();
    assert!(
        table.stdout.starts_with("NODE ") && row.contains("v1.13.9"),
        "{}",
        table.stdout
    );
    assert!(!row.contains(&boot), "a new boot id: {row}");
}

#[tokio::test]
async fn without_wait_the_cli_reports_what_the_nodes_accepted() {
    let sim = SimCluster::start(1).await;
    let tc = sim.dir.path().join("talosconfig");
    let out = run(
        &tc,
        &["upgrade", "--wait=false", "-i", TARGET, "-n", &sim.ip(1)],
    )
    .await
    .ok();
    let header = out.stdout.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("NODE") && header.contains("ACTOR ID"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("lifecycle"), "{}", out.stdout);
    assert!(out.stderr.contains("upgrade completed"), "{}", out.stderr);
}

#[tokio::test]
async fn a_node_back_on_its_old_partition_fails_the_upgrade() {
    let sim = SimCluster::start(3).await;
    let tc = sim.dir.path().join("talosconfig");
    sim.cluster
        .fail_next_upgrade("cp-3", UpgradeFault::BootsOldPartition)
        .unwrap();
    let out = run(&tc, &["upgrade", "-i", TARGET, "-n", &sim.ip(3)]).await;
    assert_eq!(
        out.code, 1,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let expected = format!(
        "error: node {}: back from its reboot on v1.13.9, not v1.14.0",
        sim.ip(3)
    );
    assert!(out.stderr.contains(&expected), "{}", out.stderr);
    // It did reboot: a node back from a new boot, on its old version.
    assert_eq!(
        sim.admin().node(sim.ip(3)).version().await.unwrap().tag,
        "v1.13.9"
    );
}

#[tokio::test]
async fn a_node_that_never_comes_back_fails_at_the_timeout_naming_it() {
    let sim = SimCluster::start(3).await;
    let tc = sim.dir.path().join("talosconfig");
    sim.cluster
        .serve_control(&sim.dir.path().join("control.sock"))
        .unwrap();
    talos_sim::control::send(
        sim.dir.path(),
        &talos_sim::control::Request::FailNextUpgrade {
            node: sim.ip(2),
            fault: UpgradeFault::NeverComesBack,
        },
    )
    .await
    .unwrap();
    let out = run(
        &tc,
        &[
            "-o",
            "json",
            "upgrade",
            "-i",
            TARGET,
            "--timeout",
            "5s",
            "-n",
            &sim.ip(2),
        ],
    )
    .await;
    assert_eq!(
        out.code, 1,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let json = out.json();
    let error = json[0]["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with(&format!(
            "node {}: not back from a new boot within 5s",
            sim.ip(2)
        )),
        "{json}"
    );
    assert!(json[0].get("version").is_none(), "{json}");
    assert_eq!(
        sim.cluster.node("cp-2").unwrap().power(),
        talos_sim::node::Power::Off
    );
}
