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
