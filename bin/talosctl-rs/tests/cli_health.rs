//! `talosctl-rs health` against the simulator: passes on a healthy cluster
//! with its progress lines, fails (exit 1) while a member is powered off.

use talos_test_support::cli::run;
use talos_test_support::sim::SimCluster;

#[tokio::test]
async fn health_passes_then_fails_while_a_member_is_down() {
    let sim = SimCluster::start(3).await;
    let tc = sim.dir.path().join("talosconfig");
    let node = sim.ip(1);

    let healthy = run(&tc, &["-n", &node, "health", "--wait-timeout", "30s"])
        .await
        .ok();
    assert!(
        healthy
            .stdout
            .contains("waiting for etcd to be healthy: OK"),
        "{}",
        healthy.stdout
    );
    let json = run(&tc, &["-o", "json", "-n", &node, "health"])
        .await
        .ok()
        .json();
    assert_eq!(json["healthy"], true, "{json}");
    assert!(json["messages"].as_array().unwrap().len() >= 4, "{json}");

    sim.cluster.power_off("cp-3").await.unwrap();
    let down = run(&tc, &["-n", &node, "health", "--wait-timeout", "2s"]).await;
    assert_eq!(
        down.code, 1,
        "stdout:\n{}\nstderr:\n{}",
        down.stdout, down.stderr
    );
    assert!(
        down.stderr.contains("cluster health check failed"),
        "{}",
        down.stderr
    );
    // Usage errors are exit 2.
    let bad = run(&tc, &["health", "--wait-timeout", "soon"]).await;
    assert_eq!(bad.code, 2, "{}", bad.stderr);
}
