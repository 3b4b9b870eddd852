//! `talosctl-rs ops retire` on the Talos 1.14 profile, where etcd keeps its
//! data on a volume of its own (`ETCD`): the default wipe gains that label,
//! read from the node's `VolumeStatuses` through COSI, and the plan says so;
//! on 1.13.9 (no such volume) the default stays STATE and EPHEMERAL.

use talos_sim::TalosVersion;
use talos_test_support::sim::SimCluster;

mod ops_fixture;

use ops_fixture::Fixture;

async fn fixture(version: TalosVersion) -> Fixture {
    Fixture {
        sim: SimCluster::start_with(3, |cfg| cfg.talos_version = version).await,
        state: tempfile::tempdir().unwrap(),
    }
}

fn reset_wipe(record: &serde_json::Value) -> Vec<String> {
    record["facts"]["wipe"]
        .as_array()
        .unwrap_or_else(|| panic!("no wipe in {record}"))
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_retire_on_1_14_wipes_the_etcd_volume_too_and_says_so() {
    let f = fixture(TalosVersion::V1_14_0).await;
    let node = f.sim.cluster.node("cp-3").unwrap();
    let address = f.sim.ip(3);
    assert!(
        node.volume("ETCD").join("etcd").exists(),
        "etcd's data is on the ETCD volume"
    );
    // Something beside the data directory, which the leave alone removes:
    // only a wipe of the volume takes it away.
    let leftover = node.volume("ETCD").join("leftover");
    std::fs::write(&leftover, b"old member").unwrap();
    let plan = f.ops(&["--plan", "retire", "cp-3"]).await.ok();
    assert!(
        plan.stderr
            .contains("wipe STATE, EPHEMERAL, ETCD, no reboot, not graceful"),
        "{}",
        plan.stderr
    );
    assert!(
        plan.stderr.contains(&format!(
            "{address} keeps etcd's data on its own volume ETCD (Talos 1.14)"
        )),
        "{}",
        plan.stderr
    );
    let record = f.ops(&["--yes", "retire", "cp-3"]).await.ok().json();
    assert_eq!(record["state"], "succeeded", "{record}");
    assert_eq!(reset_wipe(&record), ["STATE", "EPHEMERAL", "ETCD"]);
    assert!(!leftover.exists(), "the ETCD volume was wiped");
}

#[tokio::test]
async fn a_wipe_named_by_the_operator_is_kept_as_given() {
    let f = fixture(TalosVersion::V1_14_0).await;
    let plan = f
        .ops(&["--plan", "retire", "cp-3", "--wipe", "STATE"])
        .await
        .ok();
    assert!(
        plan.stderr.contains("wipe STATE, no reboot"),
        "{}",
        plan.stderr
    );
    assert!(!plan.stderr.contains("ETCD"), "{}", plan.stderr);
}

#[tokio::test]
async fn on_1_13_9_the_default_wipe_is_state_and_ephemeral() {
    let f = fixture(TalosVersion::V1_13_9).await;
    let plan = f.ops(&["--plan", "retire", "cp-3"]).await.ok();
    assert!(
        plan.stderr
            .contains("wipe STATE, EPHEMERAL, no reboot, not graceful"),
        "{}",
        plan.stderr
    );
    assert!(!plan.stderr.contains("ETCD"), "{}", plan.stderr);
}
