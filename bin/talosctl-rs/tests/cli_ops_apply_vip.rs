//! `talosctl-rs ops apply` with a `Layer2VIPConfig` document in the change
//! (the field report's move of the Kubernetes API to a VIP): the gate waits until
//! the VIP is held by exactly one control-plane node, read through COSI
//! (`AddressStatuses`), and fails, with the rollback verified, when the
//! tried configuration puts it nowhere.

use std::path::PathBuf;

mod ops_fixture;

use ops_fixture::{Fixture, newest};

const VIP: &str = "10.5.0.50";

/// The simulator's configuration plus a `Layer2VIPConfig` for [`VIP`] on
/// `link`, written to the state directory.
fn with_vip(f: &Fixture, link: &str) -> PathBuf {
    let mut config = std::fs::read_to_string(f.sim.dir.path().join("controlplane.yaml")).unwrap();
    config.push_str(&format!(
        "\n---\napiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: {VIP}\nlink: {link}\n"
    ));
    let path = f.state.path().join(format!("vip-{link}.yaml"));
    std::fs::write(&path, config).unwrap();
    path
}

async fn apply(
    f: &Fixture,
    file: &std::path::Path,
    extra: &[&str],
) -> talos_test_support::cli::Run {
    let ip = f.sim.ip(1);
    let file = file.to_str().unwrap();
    let mut args = vec!["--yes", "-n", &ip, "apply", "-f", file];
    args.extend_from_slice(extra);
    f.ops(&args).await
}

/// Who holds the VIP now, as `AddressStatuses` of every node show it.
async fn holders(f: &Fixture) -> Vec<String> {
    let mut out = Vec::new();
    for i in 1..=3 {
        let ip = f.sim.ip(i);
        let addresses = f
            .sim
            .admin()
            .node(ip.as_str())
            .resources()
            .address_statuses()
            .await
            .unwrap();
        if addresses
            .iter()
            .any(|a| a.ip().is_some_and(|v| v.to_string() == VIP))
        {
            out.push(ip);
        }
    }
    out
}

#[tokio::test]
async fn the_gate_passes_once_the_vip_is_held_by_one_control_plane_node() {
    let f = Fixture::start(3).await;
    let file = with_vip(&f, "eth0");
    let run = apply(
        &f,
        &file,
        &["--expect-change", "Layer2VIPConfig", "--try-timeout", "20s"],
    )
    .await
    .ok();
    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    assert!(
        run.stderr.contains("the VIP check: option vip_check"),
        "{}",
        run.stderr
    );
    let gate = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "gate")
        .unwrap()
        .to_string();
    assert!(
        gate.contains(&format!("the VIP {VIP} is held by {} alone", f.sim.ip(1))),
        "{gate}"
    );
    assert_eq!(holders(&f).await, [f.sim.ip(1)]);
}

#[tokio::test]
async fn a_vip_placed_nowhere_fails_the_gate_and_the_rollback_is_verified() {
    let f = Fixture::start(3).await;
    let node = f.sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    // The simulated nodes have no link ens18: no node can announce the VIP.
    let file = with_vip(&f, "ens18");
    let run = apply(
        &f,
        &file,
        &["--expect-change", "Layer2VIPConfig", "--try-timeout", "3s"],
    )
    .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains(&format!("no control-plane node holds the VIP {VIP}")),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("rolled back to its previous configuration (verified)"),
        "{}",
        run.stderr
    );
    let record = newest(&f).await;
    assert_eq!(record["state"], "failed", "{record}");
    assert_eq!(node.active_config(), before);
    assert!(!node.rollback_pending());
    assert!(holders(&f).await.is_empty());
}

#[tokio::test]
async fn the_vip_check_can_be_turned_off() {
    let f = Fixture::start(1).await;
    let file = with_vip(&f, "ens18");
    let record = apply(
        &f,
        &file,
        &[
            "--expect-change",
            "Layer2VIPConfig",
            "--try-timeout",
            "20s",
            "--vip-check=false",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(record["state"], "succeeded", "{record}");
    let node = f.sim.cluster.node("cp-1").unwrap();
    assert!(node.active_config().contains("Layer2VIPConfig"));
}
