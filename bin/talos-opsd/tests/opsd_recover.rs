//! talos-opsd's recovery after a crash resumes every kind of operation,
//! and the engine's fresh check decides: a defragmentation or an upgrade
//! killed mid-way goes on by itself when the cluster allows it, and when a
//! voter froze meanwhile nothing is sent, the operation needs attention,
//! and the step names the check that failed.

mod daemon;

use std::path::Path;
use std::time::Duration;

use daemon::{Daemon, cluster_toml};
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::{SimCluster, wait_for};

const IMAGE: &str = "ghcr.io/siderolabs/installer:v1.14.0";

/// A start of `kind` on cluster `a` (the simulator runs no Kubernetes to
/// hold the cluster lock).
fn start(kind: Kind) -> proto::StartOperationRequest {
    proto::StartOperationRequest {
        cluster: "a".into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(kind),
    }
}

fn defrag_all() -> Kind {
    Kind::Defrag(proto::DefragParams {
        all: true,
        ..Default::default()
    })
}

/// Starts `kind` on a daemon that dies at `point`; returns the operation's
/// id, read from the journal once the daemon is gone.
async fn start_and_crash(d: &mut Daemon, kind: Kind, point: &str) -> String {
    d.set_env(&[("TALOS_OPSD_TEST_CRASH", point)]);
    d.spawn().await;
    let mut client = d.client().await;
    // The daemon may die before it answers.
    let _ = client.start_operation(start(kind)).await;
    assert!(
        !d.wait_exit().await.success(),
        "the daemon was to die at {point}"
    );
    d.set_env(&[]);
    let journal = talos_client::ops::Journal::open(&d.dir.join("state")).unwrap();
    let op = journal.list(None).unwrap().remove(0);
    assert_eq!(op.state, talos_client::ops::OpState::Running, "{op:?}");
    op.id
}

/// The step of `op` that failed, with its detail.
fn failed_step(op: &proto::Operation) -> &proto::Step {
    op.steps
        .iter()
        .find(|s| s.state == "failed")
        .unwrap_or_else(|| panic!("a failed step: {op:?}"))
}

/// Ends operation `id` as abandoned, with no daemon running.
fn abandon(dir: &Path, tc: &Path, id: &str) {
    use talos_client::config::{Overrides, TalosConfig};
    let config = TalosConfig::read(tc).unwrap();
    let context = config.resolve(&Overrides::default(), tc).unwrap();
    let client = talos_client::Client::from_context(&context).unwrap();
    let mut ops = talos_client::ops::Ops::open(&context, client, &dir.join("state")).unwrap();
    ops.abandon(id).unwrap();
}

/// Each member's etcd database size, by address.
async fn db_size(sim: &SimCluster, address: &str) -> i64 {
    sim.admin()
        .node(address)
        .etcd_status()
        .await
        .unwrap()
        .db_size
}

/// The safety issue's D1: a defragmentation killed with a member's
/// defragmentation in flight used to block its cluster (needs attention,
/// scheduled snapshots refused) until a person stepped in. Now: with a
/// voter frozen before the restart, its check fails and nothing is sent;
/// killed again and restarted on a healthy cluster, it goes on by itself
/// and the cluster takes new operations.
#[tokio::test]
async fn an_interrupted_defrag_resumes_by_itself_only_while_its_check_holds() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    // Space for a defragmentation to give back, on every member.
    sim.cluster
        .fill("/talos-sim/fill/", 100, 16 * 1024)
        .await
        .unwrap();
    sim.cluster.clear("/talos-sim/fill/").await.unwrap();
    let mut d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    let mut client = d.client().await;
    let plan = client
        .plan_operation(start(defrag_all()))
        .await
        .unwrap()
        .into_inner();
    let first = plan
        .steps
        .iter()
        .find(|s| s.name == "defrag")
        .unwrap()
        .node
        .clone();
    assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));
    let point = format!("started:defrag {first}");

    // A voter frozen while the daemon is down: the restart resumes the
    // operation, whose check fails; the member is not defragmented.
    let id = start_and_crash(&mut d, defrag_all(), &point).await;
    let before = db_size(&sim, &first).await;
    let other = (1..=3).map(|i| sim.ip(i)).find(|ip| *ip != first).unwrap();
    let frozen = sim.cluster.node(&other).unwrap();
    assert!(frozen.freeze_etcd().await);
    d.spawn().await;
    let stopped = d.until_ended(&id).await;
    assert!(frozen.thaw_etcd().await);
    assert_eq!(stopped.state, "needs-attention", "{stopped:?}");
    let step = failed_step(&stopped);
    assert_eq!(
        (step.name.as_str(), step.node.as_str()),
        ("defrag", first.as_str())
    );
    assert!(
        step.detail.contains("check voters-healthy failed") && step.detail.contains(&frozen.name),
        "{step:?}"
    );
    assert!(db_size(&sim, &first).await >= before, "not defragmented");
    assert!(
        d.log_text().contains("resuming an interrupted defrag"),
        "{}",
        d.log_text()
    );
    assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));
    abandon(dir.path(), &tc, &id);

    // Killed the same way, restarted on a healthy cluster: it ends by
    // itself, and the cluster takes the next operation.
    let id = start_and_crash(&mut d, defrag_all(), &point).await;
    d.spawn().await;
    let done = d.until_ended(&id).await;
    assert_eq!(done.state, "succeeded", "{done:?}");
    assert!(db_size(&sim, &first).await < before, "{done:?}");
    let mut client = d.client().await;
    client
        .plan_operation(start(Kind::Snapshot(proto::SnapshotParams { keep: 0 })))
        .await
        .expect("the cluster is not blocked");
}

/// A retire killed right after its leave's check held, and an upgrade
/// killed with its next node's upgrade in flight, each with a voter frozen
/// before the restart: the recovery resumes them, nothing is sent (the
/// member stays, the node keeps its boot and release), and each needs
/// attention naming the check that failed.
#[tokio::test]
async fn a_recovery_sends_nothing_when_a_voter_froze_meanwhile() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let mut d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));
    let admin = sim.admin();
    let members = || async {
        admin
            .node(sim.ip(1))
            .etcd_member_list(false)
            .await
            .unwrap()
            .len()
    };

    // The retire: the leave's check held, then the crash; a survivor
    // frozen before the restart.
    let target = sim.ip(2);
    let retire = Kind::Retire(proto::RetireParams {
        node: target.clone(),
        ..Default::default()
    });
    let id = start_and_crash(&mut d, retire, "checked:leave").await;
    let frozen = sim.cluster.node(&sim.ip(3)).unwrap();
    assert!(frozen.freeze_etcd().await);
    d.spawn().await;
    let stopped = d.until_ended(&id).await;
    assert!(frozen.thaw_etcd().await);
    assert_eq!(stopped.state, "needs-attention", "{stopped:?}");
    let step = failed_step(&stopped);
    assert_eq!(step.name, "leave", "{stopped:?}");
    assert!(
        step.detail.contains("check quorum-without failed") && step.detail.contains(&frozen.name),
        "{step:?}"
    );
    assert_eq!(members().await, 3);
    admin.node(target.as_str()).version().await.unwrap();
    assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));
    abandon(dir.path(), &tc, &id);

    // The upgrade: killed with the second node's upgrade in flight, the
    // leader frozen before the restart.
    d.spawn().await;
    let mut client = d.client().await;
    let upgrade = || {
        Kind::Upgrade(proto::UpgradeParams {
            image: IMAGE.into(),
            ..Default::default()
        })
    };
    let plan = client
        .plan_operation(start(upgrade()))
        .await
        .unwrap()
        .into_inner();
    let order: Vec<String> = plan
        .steps
        .iter()
        .filter(|s| s.name == "upgrade")
        .map(|s| s.node.clone())
        .collect();
    assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));
    let (next, leader) = (&order[1], &order[2]);
    let id = start_and_crash(&mut d, upgrade(), &format!("started:upgrade {next}")).await;
    let node = sim.cluster.node(next).unwrap();
    let boot = node.boot_id();
    let frozen = sim.cluster.node(leader).unwrap();
    assert!(frozen.freeze_etcd().await);
    d.spawn().await;
    let stopped = d.until_ended(&id).await;
    assert!(frozen.thaw_etcd().await);
    assert_eq!(stopped.state, "needs-attention", "{stopped:?}");
    let step = failed_step(&stopped);
    assert_eq!(
        (step.name.as_str(), step.node.as_str()),
        ("upgrade", next.as_str())
    );
    assert!(
        step.detail.contains("check voters-healthy failed") && step.detail.contains(&frozen.name),
        "{step:?}"
    );
    assert_eq!(node.boot_id(), boot, "{next} was not rebooted");
    let tag = wait_for("the node to answer", Duration::from_secs(30), || async {
        admin.node(next.as_str()).version().await.ok()
    })
    .await
    .tag;
    assert_eq!(tag, "v1.13.9");
}
