//! Membership changes are single etcd calls, as upstream makes them
//! (internal/pkg/etcd/etcd.go, v1alpha1_server.go EtcdRemoveMemberByID,
//! internal/app/machined/pkg/system/services/etcd.go addMember and
//! promoteMember): a change etcd does not answer is not proposed again, so
//! the call waits for the caller's deadline, as it hangs on a Talos node.

use talos_test_support as common;

use std::time::{Duration, Instant};

use common::sim::SimCluster;
use talos_sim::TalosTiming;

/// Sends `signal` to `pid` with kill(1).
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {signal} {pid}");
}

/// Continues the frozen etcd processes when the test ends, failed or not.
struct Thaw(Vec<u32>);

impl Drop for Thaw {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        }
    }
}

#[tokio::test]
async fn remove_member_waits_for_the_callers_deadline_without_reproposing() {
    let sim = SimCluster::start_with(3, |cfg| cfg.timing = TalosTiming::scaled_down(10)).await;
    let client = sim.admin();
    let members = client.etcd_member_list(false).await.unwrap();
    let target = members.iter().find(|m| m.hostname == "cp-3").unwrap().id;
    // Every member frozen: etcd accepts the connection and never answers.
    let mut pids = Vec::new();
    for node in sim.cluster.nodes() {
        let pid = sim
            .cluster
            .node(&node.name)
            .unwrap()
            .etcd_pid()
            .await
            .expect("etcd runs");
        pids.push(pid);
    }
    let thaw = Thaw(pids.clone());
    for pid in &pids {
        signal(*pid, "-STOP");
    }
    let deadline = Duration::from_secs(30);
    let started = Instant::now();
    let result = client
        .with_call_timeout(deadline)
        .etcd_remove_member_by_id(target)
        .await;
    let elapsed = started.elapsed();
    drop(thaw);
    let err = result.expect_err("etcd never answers");
    // The simulator used to give up by itself after 20 s of re-proposals
    // ("etcd did not apply the membership change within 20s").
    assert!(
        elapsed >= deadline - Duration::from_secs(1),
        "ended after {elapsed:?}, before the caller's deadline: {err}"
    );
    assert!(!err.to_string().contains("did not apply"), "{err}");

    // Thawed, the removal goes through (etcd may also have taken the
    // abandoned request from its socket; then the member is gone already).
    let short = client.with_call_timeout(Duration::from_secs(10));
    common::sim::wait_for("the member removed", Duration::from_secs(90), || async {
        let _ = short.etcd_remove_member_by_id(target).await;
        let list = short.etcd_member_list(false).await.ok()?;
        list.iter().all(|m| m.id != target).then_some(())
    })
    .await;
}
