//! What the configuration may say: a cron expression must fire within a
//! year of the moment it is loaded (check-config, start, SIGHUP), so one
//! that never fires is refused instead of being run at a pace of its own;
//! and a file with no setting, or a reload that would drop every running
//! cluster, is refused unless `--allow-empty` says it is meant.

mod daemon;

use std::ffi::OsStr;

use daemon::{Daemon, cluster_toml, run_to_exit};
use talos_opsd::proto;
use talos_test_support::sim::SimCluster;

const NEVER: &str = "[cluster.defrag]\ncron = \"0 0 31 2 *\"\n";

#[tokio::test]
async fn a_cron_that_never_fires_is_refused_at_check_start_and_reload() {
    let sim = SimCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let path = dir.path().join("never.toml");
    std::fs::write(
        &path,
        format!(
            "state_dir = {:?}\nsocket = {:?}\n{}",
            dir.path().join("state"),
            dir.path().join("never.sock"),
            cluster_toml("a", &tc, NEVER)
        ),
    )
    .unwrap();
    for command in [vec!["check-config"], vec![]] {
        let mut args = vec![OsStr::new("--config"), path.as_os_str()];
        args.extend(command.iter().map(OsStr::new));
        let (status, stderr) = run_to_exit(&args).await;
        assert!(!status.success(), "{command:?}: accepted\n{stderr}");
        assert!(
            stderr.contains("cluster[0].defrag.cron") && stderr.contains("never fires"),
            "{command:?}: {stderr}"
        );
    }

    // A running daemon keeps its configuration when a reload brings one.
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    d.rewrite(&cluster_toml("a", &tc, NEVER));
    let log = d.reload_and_wait("configuration not reloaded").await;
    assert!(log.contains("never fires"), "{log}");
    assert!(!log.contains("scheduled operation"), "{log}");
}

#[tokio::test]
async fn an_empty_configuration_is_refused_unless_allowed() {
    let sim = SimCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let empty = dir.path().join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let (status, stderr) = run_to_exit(&[
        OsStr::new("--config"),
        empty.as_os_str(),
        OsStr::new("check-config"),
    ])
    .await;
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("--allow-empty"), "{stderr}");

    // A reload that would drop every running cluster is refused loudly.
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    d.rewrite("");
    let log = d.reload_and_wait("configuration not reloaded").await;
    assert!(log.contains("configures no cluster"), "{log}");
    let listed = d
        .client()
        .await
        .list_operations(proto::ListOperationsRequest {
            cluster: "a".into(),
            state: String::new(),
        })
        .await;
    assert!(listed.is_ok(), "cluster a is still configured: {listed:?}");
    drop(d);

    // With --allow-empty it is taken as meant.
    let d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &tc, ""),
        &[],
        &["--allow-empty"],
    )
    .await;
    d.rewrite("");
    d.reload_and_wait("configuration reloaded").await;
    let listed = d
        .client()
        .await
        .list_operations(proto::ListOperationsRequest {
            cluster: "a".into(),
            state: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(listed.code(), tonic::Code::NotFound, "{listed:?}");
}
