//! A credential per purpose: a cluster's `backup_talosconfig` (a client
//! certificate with `os:etcd:backup`) serves its snapshots, scheduled or
//! started through the API, and the admin talosconfig is never presented
//! for them, as the simulator's log of the roles each call was judged by
//! shows; a backup credential whose roles cannot take a snapshot is
//! refused by check-config, naming the line, the key and the roles.

mod daemon;

use std::ffi::OsStr;
use std::path::Path;
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

/// `talos-opsd check-config` on a file at `path` with state and socket under
/// `dir` and `cluster` (TOML): its exit status and stderr.
async fn check_config(
    dir: &Path,
    path: &Path,
    state: &str,
    socket: &str,
    cluster: &str,
) -> (std::process::ExitStatus, String) {
    std::fs::write(
        path,
        format!(
            "state_dir = {:?}\nsocket = {:?}\n{cluster}",
            dir.join(state),
            dir.join(socket)
        ),
    )
    .unwrap();
    run_to_exit(&[
        OsStr::new("--config"),
        path.as_os_str(),
        OsStr::new("check-config"),
    ])
    .await
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
    daemon::until_succeeded(
        &client,
        "a",
        "two scheduled snapshots",
        Duration::from_secs(90),
        |ops| ops.len() >= 2,
    )
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
    let (status, stderr) = check_config(
        dir.path(),
        &path,
        "state",
        "opsd.sock",
        &cluster_toml("a", &admin, &format!("backup_talosconfig = {reader:?}\n")),
    )
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
    let (status, stderr) = check_config(
        dir.path(),
        &path,
        "state",
        "opsd.sock",
        &cluster_toml("a", &admin, &format!("backup_talosconfig = {backup:?}\n")),
    )
    .await;
    assert!(status.success(), "{stderr}");
}

/// The risk report reads with the cluster's reader credential: every call
/// it makes presents `os:reader`, and the only one Talos refuses it is the
/// admin kubeconfig the cluster lock's Lease needs (so the lock is
/// "unknown"). GetReport, the CLI through the socket and `/metrics` say the
/// same; thresholds are the CLI's own and are refused through the daemon.
#[tokio::test]
async fn the_report_reads_with_the_reader_credential_and_sets_the_metrics() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let admin = sim.dir.path().join("talosconfig");
    let backup = sim.dir.path().join("talosconfig-backup");
    let reader = sim.dir.path().join("talosconfig-reader");
    let extra = format!("backup_talosconfig = {backup:?}\nreader_talosconfig = {reader:?}\n");
    let port = daemon::free_port();
    let addr = format!("127.0.0.1:{port}");
    let d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &admin, &extra),
        &[],
        &["--metrics-addr", &addr],
    )
    .await;
    let before = sim.cluster.calls().len();
    let answer = d
        .client()
        .await
        .get_report(proto::GetReportRequest {
            cluster: "a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.level,
        proto::ReportLevel::Critical as i32,
        "{answer:?}"
    );
    assert!(
        answer
            .findings
            .iter()
            .any(|f| f.check == "backup" && f.level == proto::ReportLevel::Critical as i32),
        "no backup yet: {answer:?}"
    );
    let report: serde_json::Value = serde_json::from_str(&answer.json).unwrap();
    let members = report["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{report}");
    assert!(
        members.iter().all(|m| m["talos_version"] == "v1.13.9"),
        "a reader may call Version: {report}"
    );
    assert_eq!(report["lock"]["state"], "unknown", "{report}");
    let purposes: Vec<&str> = report["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["purpose"].as_str().unwrap())
        .collect();
    assert_eq!(purposes, ["admin", "backup", "reader"], "{report}");

    let calls = sim.cluster.calls();
    assert!(calls.len() > before, "the report's calls are logged");
    for call in &calls[before..] {
        assert_eq!(call.roles, ["os:reader".to_string()], "{call:?}");
        assert!(
            call.allowed || call.method == "/machine.MachineService/Kubeconfig",
            "only the kubeconfig is refused to a reader: {call:?}"
        );
    }

    let metrics = wait_for("the metrics listener", Duration::from_secs(30), || {
        daemon::scrape(port)
    })
    .await;
    for line in [
        "talos_opsd_report_level{cluster=\"a\"} 2",
        "talos_opsd_report_check_level{cluster=\"a\",check=\"backup\"} 2",
        "talos_opsd_report_check_level{cluster=\"a\",check=\"orphan\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} not in {metrics}");
    }
    let remaining: i64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "talos_opsd_certificate_remaining_seconds{cluster=\"a\",purpose=\"reader\"} ",
            )
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no reader certificate in {metrics}"));
    assert!(remaining > 86400, "{remaining}");

    // The CLI through the socket: the daemon's report, its exit code.
    let cli = daemon::ops_cli(&admin, &d.socket, &["report"]).await;
    assert_eq!(cli.code, 2, "{}", cli.stderr);
    assert_eq!(cli.json()["level"], "critical", "{}", cli.stdout);
    let refused = daemon::ops_cli(&admin, &d.socket, &["report", "--backup-warn", "1h"]).await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains("--local"), "{}", refused.stderr);

    // A backup credential cannot serve the report (no Version): refused.
    let path = dir.path().join("other.toml");
    let (status, stderr) = check_config(
        dir.path(),
        &path,
        "state2",
        "other.sock",
        &cluster_toml("a", &admin, &format!("reader_talosconfig = {backup:?}\n")),
    )
    .await;
    assert!(!status.success(), "accepted:\n{stderr}");
    for expected in [
        "reader_talosconfig",
        "(os:etcd:backup) cannot read the risk report",
        "os:reader",
    ] {
        assert!(stderr.contains(expected), "{expected:?} not in {stderr}");
    }
}
