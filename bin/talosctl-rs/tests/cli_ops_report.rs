//! `ops report`: the risk report flags each condition when the simulator
//! is made to show it, with exit code 0/1/2, and changes nothing on the
//! cluster.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use talos_test_support as common;

use common::cli::{Run, run};
use common::sim::{SimCluster, wait_for};

const TARGET: &str = "ghcr.io/siderolabs/installer:v1.14.0";

async fn report(talosconfig: &Path, state: &Path, extra: &[&str]) -> (i32, Value) {
    let mut args = vec![
        "-o",
        "json",
        "ops",
        "--state-dir",
        state.to_str().unwrap(),
        "report",
    ];
    args.extend_from_slice(extra);
    let out: Run = run(talosconfig, &args).await;
    assert!(
        (0..=2).contains(&out.code),
        "exit {}: {}",
        out.code,
        out.stderr
    );
    let json: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", out.stdout, out.stderr));
    assert_eq!(
        json["level"].as_str().unwrap(),
        ["ok", "warning", "critical"][out.code as usize],
        "the exit code is the report's level: {json}"
    );
    (out.code, json)
}

/// The findings of `check`, as (level, message).
fn findings(report: &Value, check: &str) -> Vec<(String, String)> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == check)
        .map(|f| {
            (
                f["level"].as_str().unwrap().to_string(),
                f["message"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Each member's `db-size` finding is the one its quota share (as the same
/// report read it) calls for: critical from 0.9, a warning from 0.7, none
/// below.
fn assert_db_findings_follow_the_shares(report: &Value) {
    for m in report["members"].as_array().unwrap() {
        let share = m["quota_share"].as_f64().unwrap();
        let name = m["name"].as_str().unwrap();
        let level: Vec<&str> = report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["check"] == "db-size" && f["subject"] == name)
            .map(|f| f["level"].as_str().unwrap())
            .collect();
        let want: &[&str] = if share >= 0.9 {
            &["critical"]
        } else if share >= 0.7 {
            &["warning"]
        } else {
            &[]
        };
        assert_eq!(level, want, "{name} at {share}: {report}");
    }
}

fn etcdctl(sim: &SimCluster, args: &[&str]) -> Result<String, String> {
    let endpoint = sim.cluster.nodes()[0].etcd_client_url.clone();
    let output = sim
        .cluster
        .etcdctl()
        .expect("the etcd release is built")
        .arg("--endpoints")
        .arg(endpoint)
        .args(args)
        .output()
        .expect("etcdctl runs");
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// A cluster with no backup is critical; a verified snapshot clears that,
/// and the thresholds make it old; a database near its quota, a
/// certificate about to expire, a version skew, a learner that is never
/// promoted and a member with no node behind it are each flagged.
#[tokio::test]
async fn the_report_flags_each_risk_the_cluster_is_made_to_show() {
    let sim = SimCluster::start(3).await;
    let admin = sim.dir.path().join("talosconfig");
    let state = tempfile::tempdir().unwrap();
    let state = state.path();

    // Nothing on record: no backup (critical), no drill, nothing off-host.
    let (code, first) = report(&admin, state, &[]).await;
    assert_eq!(code, 2, "{first}");
    assert_eq!(findings(&first, "backup")[0].0, "critical", "{first}");
    assert_eq!(findings(&first, "drill")[0].0, "warning", "{first}");
    assert_eq!(findings(&first, "off-host-backup")[0].0, "warning");
    let members = first["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{first}");
    for m in members {
        assert_eq!(m["node_behind"], true, "{m}");
        assert_eq!(m["talos_version"], "v1.13.9", "{m}");
        assert!(
            m["etcd_version"].as_str().unwrap().starts_with("3.6."),
            "{m}"
        );
        assert!(m["db_size"].as_i64().unwrap() > 0, "{m}");
    }
    for check in [
        "orphan",
        "learner",
        "version-skew",
        "voters",
        "db-size",
        "certificate",
    ] {
        assert!(findings(&first, check).is_empty(), "{check}: {first}");
    }
    assert_eq!(first["certificates"][0]["roles"][0], "os:admin", "{first}");

    // A verified snapshot: the backup finding is gone, the report warns
    // (drill, off-host) but is not critical.
    run(
        &admin,
        &[
            "ops",
            "--state-dir",
            state.to_str().unwrap(),
            "snapshot",
            "--yes",
        ],
    )
    .await
    .ok();
    let (code, after) = report(&admin, state, &[]).await;
    assert_eq!(code, 1, "{after}");
    assert!(findings(&after, "backup").is_empty(), "{after}");
    assert!(
        after["backup_on_host"]["location"]
            .as_str()
            .is_some_and(|l| Path::new(l).is_file()),
        "{after}"
    );
    // Old once the thresholds say so (the snapshot is a second old at least).
    let old = wait_for(
        "the snapshot to age a second",
        Duration::from_secs(10),
        || async {
            let (_, r) = report(
                &admin,
                state,
                &["--backup-warn", "0s", "--backup-crit", "1000h"],
            )
            .await;
            (!findings(&r, "backup").is_empty()).then_some(r)
        },
    )
    .await;
    let (level, message) = &findings(&old, "backup")[0];
    assert_eq!(level, "warning", "{old}");
    assert!(message.contains("old"), "{message}");
    let (_, very_old) = report(
        &admin,
        state,
        &["--backup-warn", "0s", "--backup-crit", "0s"],
    )
    .await;
    assert_eq!(findings(&very_old, "backup")[0].0, "critical", "{very_old}");

    // A quota just above the largest database: critical at 95% of it, a
    // warning at 80%. The databases grow a little by themselves (etcd's own
    // writes), so each member's finding is checked against the share the
    // same report read.
    let largest = after["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["db_size"].as_i64().unwrap())
        .max()
        .unwrap();
    let quota = ((largest as f64 / 0.95) as u64).to_string();
    let (code, full) = report(&admin, state, &["--quota", &quota]).await;
    assert_eq!(code, 2, "{full}");
    assert_db_findings_follow_the_shares(&full);
    assert!(
        findings(&full, "db-size")
            .iter()
            .any(|(l, m)| l == "critical" && m.contains("quota")),
        "{full}"
    );
    let quota = ((largest as f64 / 0.8) as u64).to_string();
    let (_, filling) = report(&admin, state, &["--quota", &quota]).await;
    assert_db_findings_follow_the_shares(&filling);
    assert!(
        findings(&filling, "db-size")
            .iter()
            .any(|(l, _)| l == "warning"),
        "{filling}"
    );

    // A talosconfig whose certificate expires in four days: critical; a
    // critical bound below that makes it a warning.
    let short = state.join("short-talosconfig");
    run(
        &admin,
        &[
            "config",
            "new",
            "--crt-ttl",
            "100h",
            short.to_str().unwrap(),
        ],
    )
    .await
    .ok();
    let (code, expiring) = report(&short, state, &[]).await;
    assert_eq!(code, 2, "{expiring}");
    let cert = findings(&expiring, "certificate");
    assert_eq!(cert[0].0, "critical", "{expiring}");
    assert!(cert[0].1.contains("expires in 4 days"), "{}", cert[0].1);
    let (_, warned) = report(&short, state, &["--cert-crit", "1h"]).await;
    assert_eq!(findings(&warned, "certificate")[0].0, "warning", "{warned}");

    // One control-plane node upgraded to 1.14: Talos and etcd minors differ.
    run(&admin, &["upgrade", "--image", TARGET, "-n", &sim.ip(3)])
        .await
        .ok();
    sim.wait_etcd_healthy(3).await;
    let skewed = wait_for(
        "the upgraded member's status",
        Duration::from_secs(60),
        || async {
            let (_, r) = report(&admin, state, &[]).await;
            let all_behind = r["members"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["node_behind"] == true);
            all_behind.then_some(r)
        },
    )
    .await;
    let skew = findings(&skewed, "version-skew");
    assert!(
        skew.iter()
            .any(|(_, m)| m.starts_with("Talos") && m.contains("v1.14.0") && m.contains("v1.13.9")),
        "{skewed}"
    );
    assert!(
        skew.iter()
            .any(|(_, m)| m.starts_with("etcd") && m.contains("3.7.") && m.contains("3.6.")),
        "{skewed}"
    );

    // A learner added with no machine behind it: on the first look an
    // unconfirmed orphan (a warning) and a learner just seen; on the next,
    // a confirmed orphan (critical) and a learner stuck past the window.
    // etcd refuses a member change until every member has been up a few
    // seconds ("unhealthy cluster"): the upgraded one just restarted.
    wait_for(
        "etcd to take a new member",
        Duration::from_secs(60),
        || async {
            etcdctl(
                &sim,
                &[
                    "member",
                    "add",
                    "ghost",
                    "--learner",
                    "--peer-urls=https://127.0.99.99:2380",
                ],
            )
            .inspect_err(|e| eprintln!("{e}"))
            .ok()
        },
    )
    .await;
    let (_, look1) = report(&admin, state, &["--learner-window", "0s"]).await;
    let orphan = findings(&look1, "orphan");
    assert_eq!(orphan.len(), 1, "{look1}");
    assert_eq!(orphan[0].0, "warning", "{look1}");
    assert!(orphan[0].1.contains("127.0.99.99"), "{}", orphan[0].1);
    assert!(findings(&look1, "learner").is_empty(), "{look1}");
    let (code, look2) = report(&admin, state, &["--learner-window", "0s"]).await;
    assert_eq!(code, 2, "{look2}");
    assert_eq!(findings(&look2, "orphan")[0].0, "critical", "{look2}");
    let learner = findings(&look2, "learner");
    assert_eq!(learner.len(), 1, "{look2}");
    assert!(learner[0].1.contains("127.0.99.99"), "{}", learner[0].1);
    // The default window (10 minutes) is not over yet.
    let (_, look3) = report(&admin, state, &[]).await;
    assert!(findings(&look3, "learner").is_empty(), "{look3}");

    // The report wrote nothing to the cluster: the members are as added.
    let list = etcdctl(&sim, &["member", "list"]).unwrap();
    assert_eq!(list.lines().count(), 4, "{list}");
    // The table says the same, with the level first.
    let table = run(
        &admin,
        &["ops", "--state-dir", state.to_str().unwrap(), "report"],
    )
    .await;
    assert_eq!(table.code, 2, "{}", table.stderr);
    assert!(table.stdout.starts_with("context "), "{}", table.stdout);
    assert!(table.stdout.contains("CRITICAL"), "{}", table.stdout);
    assert!(table.stdout.contains("127.0.99.99"), "{}", table.stdout);
}

/// Bad thresholds are refused before anything is read.
#[tokio::test]
async fn bad_thresholds_are_refused_with_the_flag_named() {
    let dir = tempfile::tempdir().unwrap();
    let talosconfig = dir.path().join("talosconfig");
    for (flag, value) in [
        ("--db-warn", "1.5"),
        ("--db-crit", "0"),
        ("--quota", "0"),
        ("--backup-warn", "soon"),
    ] {
        let out = run(&talosconfig, &["ops", "report", flag, value]).await;
        assert_eq!(out.code, 2, "{flag} {value}: {}", out.stderr);
        assert!(out.stderr.contains(flag), "{flag}: {}", out.stderr);
    }
}
