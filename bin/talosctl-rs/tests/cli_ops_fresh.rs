//! The fresh check before every destructive step, on the simulator (real
//! etcd): the process dies right before a destructive step (or right after
//! the engine's check of it), the step's precondition is broken meanwhile
//! (a frozen voter, a rebooted node), and `ops resume` must send nothing,
//! leave the operation needing attention, and name the check that failed
//! with what it saw. Once the precondition holds again, the resume goes on.

use talos_test_support::cli::Run;

mod ops_fixture;

use ops_fixture::{Fixture, newest};

const IMAGE: &str = "ghcr.io/siderolabs/installer:v1.14.0";

/// The (name, node, state) of each step of a shown operation.
fn states(record: &serde_json::Value) -> Vec<(String, String, String)> {
    record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["node"].as_str().unwrap_or_default().to_string(),
                s["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A resume that must stop at the named check: it fails, says the
/// operation needs attention, names the check and `saw` (what it found),
/// and the journal shows the operation needing attention with the step
/// failed and the check recorded with it.
async fn assert_stopped_by_check(f: &Fixture, id: &str, resumed: &Run, check: &str, saw: &str) {
    assert_ne!(resumed.code, 0, "{}", resumed.stdout);
    assert!(
        resumed.stderr.contains("needs attention")
            && resumed.stderr.contains(&format!("check {check} "))
            && resumed.stderr.contains(saw),
        "{}",
        resumed.stderr
    );
    let shown = f.ops(&["show", id]).await.ok().json();
    assert_eq!(shown["state"], "needs-attention", "{shown}");
    let failed = shown["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["state"] == "failed")
        .unwrap_or_else(|| panic!("a failed step: {shown}"));
    let checks = failed["checks"].as_array().expect("the checks recorded");
    let last = checks.last().unwrap();
    assert_eq!(last["check"], check, "{failed}");
    assert_eq!(last["held"], false, "{failed}");
    assert!(last["gap_ms"].is_null(), "nothing was sent: {failed}");
}

/// Reproduction 1 of the safety issue: a retire of the etcd leader killed
/// with its forfeit in flight (right after the check step), a survivor's
/// etcd frozen meanwhile: the resume used to send the forfeit, the leave
/// and the reset, leaving one healthy voter of two. Now the forfeit's
/// check (quorum without the node) fails and nothing is sent; killed again
/// right before the leave, the same; thawed, the resume ends the retire.
#[tokio::test]
async fn a_resumed_retire_checks_quorum_before_the_forfeit_and_the_leave() {
    let f = Fixture::start(3).await;
    let target = f.sim.leader().await;
    let crashed = f
        .ops_with(
            &f.talosconfig(),
            &["--yes", "retire", &target],
            Some("started:forfeit"),
        )
        .await;
    assert_ne!(crashed.code, 0, "{}", crashed.stderr);
    let id = newest(&f).await["id"].as_str().unwrap().to_string();
    let survivor = (1..=3)
        .map(|i| f.sim.ip(i))
        .find(|ip| *ip != target)
        .unwrap();
    let frozen = f.sim.cluster.node(&survivor).unwrap();
    assert!(frozen.freeze_etcd().await);
    let resumed = f.ops(&["--yes", "resume", &id]).await;
    assert!(frozen.thaw_etcd().await);
    assert_stopped_by_check(&f, &id, &resumed, "quorum-without", &frozen.name).await;
    // Nothing was sent: the target still leads, three voters, it answers.
    assert_eq!(f.sim.leader().await, target);
    assert_eq!(f.voters(1).await, ["cp-1", "cp-2", "cp-3"]);
    f.sim.admin().node(target.as_str()).version().await.unwrap();

    // Thawed: the forfeit goes out; killed again right after the leave's
    // check, then a survivor frozen: the leave is not sent.
    let crashed = f
        .ops_with(
            &f.talosconfig(),
            &["--yes", "resume", &id],
            Some("checked:leave"),
        )
        .await;
    assert_ne!(crashed.code, 0, "{}", crashed.stderr);
    assert_ne!(f.sim.leader().await, target, "the forfeit went out");
    let survivor = (1..=3)
        .map(|i| f.sim.ip(i))
        .find(|ip| *ip != target && *ip != survivor)
        .unwrap();
    let frozen = f.sim.cluster.node(&survivor).unwrap();
    assert!(frozen.freeze_etcd().await);
    let resumed = f.ops(&["--yes", "resume", &id]).await;
    assert!(frozen.thaw_etcd().await);
    assert_stopped_by_check(&f, &id, &resumed, "quorum-without", &frozen.name).await;
    assert_eq!(f.voters(1).await, ["cp-1", "cp-2", "cp-3"]);
    f.sim.admin().node(target.as_str()).version().await.unwrap();

    // The precondition holds again: the resume ends the retire, and the
    // leave records the check it passed and the gap to its send.
    let done = f.ops(&["--yes", "resume", &id]).await.ok().json();
    assert_eq!(done["state"], "succeeded", "{done}");
    let survivor = (1..=3).find(|i| f.sim.ip(*i) != target).unwrap();
    assert_eq!(f.voters(survivor).await.len(), 2);
    let leave = done["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "leave")
        .unwrap();
    let check = leave["checks"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(check["check"], "quorum-without", "{leave}");
    assert_eq!(check["held"], true, "{leave}");
    assert!(check["gap_ms"].as_u64().unwrap() < 5000, "{leave}");
}

/// Reproduction 2 of the safety issue: an upgrade killed right after the
/// first node came back (the next node's upgrade in flight), the leader's
/// etcd frozen meanwhile: the resume used to pull, install and reboot the
/// next node with one member of three up. Now the check (every voter
/// healthy) fails: the node keeps its release and its boot. And a new plan
/// is refused naming the step that failed, not the next one.
#[tokio::test]
async fn a_resumed_upgrade_checks_every_voter_before_the_next_node() {
    let f = Fixture::start(3).await;
    let plan = f
        .ops(&["--plan", "upgrade", "--image", IMAGE])
        .await
        .ok()
        .json();
    let order: Vec<String> = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == "upgrade")
        .map(|s| s["node"].as_str().unwrap().to_string())
        .collect();
    let (next, leader) = (&order[1], &order[2]);
    let crash = format!("started:upgrade {next}");
    let crashed = f
        .ops_with(
            &f.talosconfig(),
            &[
                "--yes",
                "upgrade",
                "--image",
                IMAGE,
                "--reboot-timeout",
                "30s",
            ],
            Some(&crash),
        )
        .await;
    assert_ne!(crashed.code, 0, "{}", crashed.stderr);
    let id = newest(&f).await["id"].as_str().unwrap().to_string();
    let node = f.sim.cluster.node(next).unwrap();
    let boot = node.boot_id();
    let frozen = f.sim.cluster.node(leader).unwrap();
    assert!(frozen.freeze_etcd().await);
    let resumed = f.ops(&["--yes", "resume", &id]).await;
    assert!(frozen.thaw_etcd().await);
    assert_stopped_by_check(&f, &id, &resumed, "voters-healthy", &frozen.name).await;
    // Nothing was sent to the next node: same boot, same release.
    assert_eq!(node.boot_id(), boot);
    let admin = f.sim.admin();
    assert_eq!(
        admin.node(next.as_str()).version().await.unwrap().tag,
        "v1.13.9"
    );
    let shown = f.ops(&["show", &id]).await.ok().json();
    assert!(
        states(&shown).contains(&("upgrade".into(), next.clone(), "failed".into())),
        "{shown}"
    );
    // A new plan names the failed step and says it needs attention.
    let refused = f.ops(&["--plan", "snapshot"]).await;
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains(&format!("upgrade {next}"))
            && refused.stderr.contains("needs attention")
            && !refused.stderr.contains("interrupted at step"),
        "{}",
        refused.stderr
    );
}

/// Each member's etcd database size, by address.
async fn db_size(f: &Fixture, address: &str) -> i64 {
    f.sim
        .admin()
        .node(address)
        .etcd_status()
        .await
        .unwrap()
        .db_size
}

/// A defragmentation killed right after a member's check held, another
/// voter frozen meanwhile: the member answers nothing while it is
/// defragmented, so the resume checks the others again and sends nothing;
/// thawed, it defragments.
#[tokio::test]
async fn a_resumed_defrag_checks_the_other_voters_again() {
    let f = Fixture::start(3).await;
    f.sim
        .cluster
        .fill("/talos-sim/fill/", 100, 16 * 1024)
        .await
        .unwrap();
    f.sim.cluster.clear("/talos-sim/fill/").await.unwrap();
    let plan = f.ops(&["--plan", "defrag", "--all"]).await.ok().json();
    let first = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "defrag")
        .and_then(|s| s["node"].as_str())
        .unwrap()
        .to_string();
    let crash = format!("checked:defrag {first}");
    let crashed = f
        .ops_with(
            &f.talosconfig(),
            &["--yes", "defrag", "--all"],
            Some(&crash),
        )
        .await;
    assert_ne!(crashed.code, 0, "{}", crashed.stderr);
    let id = newest(&f).await["id"].as_str().unwrap().to_string();
    let before = db_size(&f, &first).await;
    let other = (1..=3)
        .map(|i| f.sim.ip(i))
        .find(|ip| *ip != first)
        .unwrap();
    let frozen = f.sim.cluster.node(&other).unwrap();
    assert!(frozen.freeze_etcd().await);
    let resumed = f.ops(&["--yes", "resume", &id]).await;
    assert!(frozen.thaw_etcd().await);
    assert_stopped_by_check(&f, &id, &resumed, "voters-healthy", &frozen.name).await;
    assert!(db_size(&f, &first).await >= before, "not defragmented");

    let done = f.ops(&["--yes", "resume", &id]).await.ok().json();
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(db_size(&f, &first).await < before, "{done}");
}

/// An apply killed before its try (a voter frozen meanwhile) and one
/// killed before its confirmation (the node rebooted meanwhile, which
/// rolls its try back): each resume sends nothing and names the check;
/// the node never saves the file.
#[tokio::test]
async fn a_resumed_apply_checks_before_the_try_and_the_confirmation() {
    let f = Fixture::start(3).await;
    let node = f.sim.ip(2);
    let file = f.config_with(
        "sans.yaml",
        &[("certSANs: []", "certSANs: [fresh.example]")],
    );
    let file = file.to_str().unwrap();
    let apply = [
        "-n",
        node.as_str(),
        "-o",
        "json",
        "ops",
        "--without-cluster-lock",
        "--yes",
        "apply",
        "-f",
        file,
        "--expect-change",
        "machine.certSANs",
        "--try-timeout",
        "30s",
    ];
    let saved = || async {
        f.sim
            .admin()
            .node(node.as_str())
            .resources()
            .machine_config(talos_client::client::resources::ConfigId::Persistent)
            .await
            .unwrap()
            .yaml
    };
    let run = |crash: &'static str| {
        let mut cmd = talos_test_support::cli::command(&f.talosconfig());
        cmd.args(&apply[..5])
            .arg("--state-dir")
            .arg(f.state.path())
            .args(&apply[5..]);
        let crash = crash.replace("NODE", &node);
        cmd.env("TALOSCTL_RS_TEST_CRASH", crash);
        async move {
            let output = tokio::task::spawn_blocking(move || cmd.output())
                .await
                .unwrap()
                .unwrap();
            assert!(!output.status.success());
        }
    };

    // Killed before the try; a voter frozen: nothing is tried.
    run("started:try NODE").await;
    let id = newest(&f).await["id"].as_str().unwrap().to_string();
    let frozen = f.sim.cluster.node(&f.sim.ip(3)).unwrap();
    assert!(frozen.freeze_etcd().await);
    let resumed = f.ops(&["--yes", "resume", &id]).await;
    assert!(frozen.thaw_etcd().await);
    assert_stopped_by_check(&f, &id, &resumed, "apply-ready", &frozen.name).await;
    let target = f.sim.cluster.node(&node).unwrap();
    assert!(!target.rollback_pending(), "no try was sent");
    assert!(!target.active_config().contains("fresh.example"));
    f.ops(&["abandon", &id]).await.ok();

    // Killed before the confirmation; the node reboots (its try rolls
    // back): nothing is confirmed.
    run("started:confirm NODE").await;
    let id = newest(&f).await["id"].as_str().unwrap().to_string();
    let boot = target.boot_id();
    f.sim
        .admin()
        .node(node.as_str())
        .reboot(talos_client::client::RebootMode::Default)
        .await
        .unwrap();
    talos_test_support::sim::wait_for(
        "the node back from its reboot",
        std::time::Duration::from_secs(60),
        || {
            let back = target.boot_id() != boot;
            let admin = f.sim.admin();
            let node = node.clone();
            async move {
                let answers = admin.node(node.as_str()).version().await.is_ok();
                (back && answers).then_some(())
            }
        },
    )
    .await;
    let resumed = f.ops(&["--yes", "resume", &id]).await;
    assert_stopped_by_check(&f, &id, &resumed, "try-pending", "rebooted since the try").await;
    assert!(!saved().await.contains("fresh.example"));
}

/// A join killed before its apply in maintenance mode, the node cut off
/// meanwhile: the resume finds it neither joined nor answering in
/// maintenance mode, and sends nothing; healed, it is still unconfigured.
#[tokio::test]
async fn a_resumed_join_checks_the_node_is_in_maintenance_mode() {
    let f = Fixture::start(3).await;
    let new = f.sim.cluster.add_maintenance_node().await.unwrap();
    let fingerprint = new.maintenance_fingerprint.clone().unwrap();
    let config = f.sim.dir.path().join("controlplane.yaml");
    let crashed = f
        .ops_with(
            &f.talosconfig(),
            &[
                "--yes",
                "join",
                &new.api,
                "--config",
                config.to_str().unwrap(),
                "--cert-fingerprint",
                &fingerprint,
            ],
            Some("started:apply-config"),
        )
        .await;
    assert_ne!(crashed.code, 0, "{}", crashed.stderr);
    let id = newest(&f).await["id"].as_str().unwrap().to_string();
    let ip = new.ip.to_string();
    assert!(f.sim.cluster.partition(&ip).await.unwrap());
    let resumed = f.ops(&["--yes", "resume", &id]).await;
    assert!(f.sim.cluster.heal(&ip).await.unwrap());
    assert_stopped_by_check(
        &f,
        &id,
        &resumed,
        "in-maintenance",
        "does not answer in maintenance mode",
    )
    .await;
    assert!(!f.sim.cluster.node(&ip).unwrap().is_configured());
    assert_eq!(f.members().await.len(), 3);
}
