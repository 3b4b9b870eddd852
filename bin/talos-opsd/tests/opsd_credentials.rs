//! A credential per purpose: a cluster's `backup_talosconfig` (a client
//! certificate with `os:etcd:backup`) serves its snapshots, scheduled or
//! started through the API, and the admin talosconfig is never presented
//! for them, as the simulator's log of the roles each call was judged by
//! shows; a backup credential whose roles cannot take a snapshot is
//! refused by check-config, naming the line, the key and the roles.

mod daemon;

use std::ffi::OsStr;
use std::time::Duration;

use daemon::{Daemon, cluster_toml, run_to_exit};
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::{SimCluster, wait_for};

/// The roles of the calls the simulated cluster judged, one entry per
/// distinct set, with whether any was refused.
fn presented(sim: &SimCluster) -> Vec<(Vec<String>, bool)> {
    let mut seen: Vec<(Vec<String>, bool)> = Vec::new();
    for call in sim.cluster.calls() {
        match seen.iter_mut().find(|(roles, _)| *roles == call.roles) {
            Some((_, refused)) => *refused |= !call.allowed,
            None => seen.push((call.roles, !call.allowed)),
        }
    }
    seen
}

#[tokio::test]
async fn snapshots_present_the_backup_credential_and_never_the_admin_one() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let admin = sim.dir.path().join("talosconfig");
    let backup = sim.dir.path().join("talosconfig-backup");
    let snaps = dir.path().join("snaps");
    let extra = format!(
        "backup_talosconfig = {backup:?}\n[cluster.snapshots]\ninterval = \"1s\"\nkeep = 2\ndir = {snaps:?}\n"
    );
    // What the simulator judged before the daemon started is not its.
    let before = sim.cluster.calls().len();
    let d = Daemon::start(dir.path(), &cluster_toml("a", &admin, &extra)).await;
    let client = d.client().await;
    wait_for("two scheduled snapshots", Duration::from_secs(90), || {
        let mut client = client.clone();
        async move {
            let ops = client
                .list_operations(proto::ListOperationsRequest {
                    cluster: "a".into(),
                    state: "succeeded".into(),
                })
                .await
                .ok()?
                .into_inner()
                .operations;
            (ops.len() >= 2).then_some(())
        }
    })
    .await;
    // One a person starts through the API goes the same way; it waits for
    // a scheduled one in progress to end (the cluster is busy meanwhile).
    let started = wait_for(
        "a snapshot through the API",
        Duration::from_secs(60),
        || {
            let mut client = client.clone();
            async move {
                client
                    .start_operation(proto::StartOperationRequest {
                        cluster: "a".into(),
                        kind: Some(Kind::Snapshot(proto::SnapshotParams::default())),
                        ..Default::default()
                    })
                    .await
                    .ok()
                    .map(|r| r.into_inner())
            }
        },
    )
    .await;
    let ended = d.until_ended(&started.id).await;
    assert_eq!(ended.state, "succeeded", "{ended:?}");

    let calls = sim.cluster.calls();
    assert!(calls.len() > before, "the daemon's calls are logged");
    let roles = presented(&sim);
    assert!(
        roles
            .iter()
            .all(|(r, refused)| r == &["os:etcd:backup".to_string()] && !refused),
        "every call presented os:etcd:backup and was allowed: {roles:?}"
    );
    assert!(
        calls[before..]
            .iter()
            .any(|c| c.method == "/machine.MachineService/EtcdSnapshot"),
        "the snapshots were taken with it"
    );
}

#[tokio::test]
async fn a_backup_credential_that_cannot_snapshot_is_refused_by_check_config() {
    let sim = SimCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let admin = sim.dir.path().join("talosconfig");
    let reader = sim.dir.path().join("talosconfig-reader");
    let path = dir.path().join("opsd.toml");
    std::fs::write(
        &path,
        format!(
            "state_dir = {:?}\nsocket = {:?}\n{}",
            dir.path().join("state"),
            dir.path().join("opsd.sock"),
            cluster_toml("a", &admin, &format!("backup_talosconfig = {reader:?}\n"))
        ),
    )
    .unwrap();
    let (status, stderr) = run_to_exit(&[
        OsStr::new("--config"),
        path.as_os_str(),
        OsStr::new("check-config"),
    ])
    .await;
    assert!(!status.success(), "accepted:\n{stderr}");
    let want = format!("{}:7: cluster[0].backup_talosconfig:", path.display());
    for expected in [
        want.as_str(),
        "(os:reader) cannot take a snapshot",
        "os:etcd:backup",
    ] {
        assert!(stderr.contains(expected), "{expected:?} not in {stderr}");
    }

    // The same file with the backup credential passes.
    let backup = sim.dir.path().join("talosconfig-backup");
    std::fs::write(
        &path,
        format!(
            "state_dir = {:?}\nsocket = {:?}\n{}",
            dir.path().join("state"),
            dir.path().join("opsd.sock"),
            cluster_toml("a", &admin, &format!("backup_talosconfig = {backup:?}\n"))
        ),
    )
    .unwrap();
    let (status, stderr) = run_to_exit(&[
        OsStr::new("--config"),
        path.as_os_str(),
        OsStr::new("check-config"),
    ])
    .await;
    assert!(status.success(), "{stderr}");
}
