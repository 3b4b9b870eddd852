//! talos-opsd holds the cluster lock (the Lease
//! kube-system/talos-client-operation) from StartOperation to the end, and
//! a `--local` CLI on another state directory is refused naming it; the
//! API names the holder. Against the simulator's real kube-apiserver.

mod daemon;

use std::time::Duration;

use daemon::{Daemon, cluster_toml};
use talos_opsd::proto;
use talos_opsd::proto::start_operation_request::Kind;
use talos_test_support::cli::command;
use talos_test_support::sim::{SimCluster, wait_for};

#[tokio::test]
async fn kubernetes_the_daemon_holds_the_cluster_lock_and_a_local_cli_is_refused() {
    let sim = SimCluster::start_with_kubernetes_and(1, |_| {}).await;
    sim.wait_kubernetes_ready(1).await;
    let ip = sim.ip(1);
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let config = std::fs::read_to_string(sim.dir.path().join("controlplane.yaml")).unwrap();
    let file = dir.path().join("sans.yaml");
    std::fs::write(
        &file,
        config.replace("certSANs: []", "certSANs: [vip.example]"),
    )
    .unwrap();
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    let mut client = d.client().await;

    // An apply whose gate soaks for a while holds the lock meanwhile.
    let started = client
        .start_operation(proto::StartOperationRequest {
            cluster: "a".into(),
            kind: Some(Kind::Apply(proto::ApplyParams {
                nodes: vec![ip.clone()],
                config_path: file.display().to_string(),
                expect_change: vec!["machine.certSANs".into()],
                try_timeout_s: 30,
                ..Default::default()
            })),
            plan_fingerprint: String::new(),
            without_cluster_lock: false,
        })
        .await
        .unwrap()
        .into_inner();
    let lock = started
        .cluster_lock
        .clone()
        .expect("the API names the lock");
    assert!(!lock.without, "{lock:?}");
    assert_eq!(lock.lease, "kube-system/talos-client-operation");
    assert!(
        lock.holder.starts_with(&format!("{}@", started.id))
            && lock
                .holder
                .ends_with(&dir.path().join("state").display().to_string()),
        "{lock:?}"
    );

    // A CLI in this process, on its own state directory, is refused.
    let other = tempfile::tempdir().unwrap();
    let mut cmd = command(&tc);
    cmd.args(["ops", "--local", "--state-dir"])
        .arg(other.path())
        .args(["--yes", "-n", &ip, "apply", "-f"])
        .arg(&file)
        .args(["--expect-change", "machine.certSANs"]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("another operation holds this cluster") && stderr.contains(&lock.holder),
        "{stderr}"
    );

    // The daemon's operation ends, its destructive steps fenced.
    let ended = d.until_ended(&started.id).await;
    assert_eq!(ended.state, "succeeded", "{ended:?}");
    for step in ended.steps.iter().filter(|s| s.destructive) {
        let fence = step.fence.as_ref().unwrap_or_else(|| panic!("{step:?}"));
        assert_eq!(fence.holder, lock.holder);
    }
    wait_for("the daemon's log", Duration::from_secs(5), || async {
        d.log_text().contains("operation ended").then_some(())
    })
    .await;
}
