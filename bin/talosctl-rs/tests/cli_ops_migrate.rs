//! New control-plane nodes from maintenance mode: `ops join --config` and
//! `ops migrate`, moving the control plane to new machines in one command, against the simulator
//! (real etcd).

use std::time::Duration;

use talos_test_support::cli::run;
use talos_test_support::sim::wait_for;

mod ops_fixture;

use ops_fixture::{Fixture, newest};

fn controlplane(f: &Fixture) -> String {
    f.sim
        .dir
        .path()
        .join("controlplane.yaml")
        .to_str()
        .unwrap()
        .to_string()
}

fn step_names(record: &serde_json::Value) -> Vec<String> {
    record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn join_applies_the_config_in_maintenance_mode_and_waits_for_a_voter() {
    let f = Fixture::start(3).await;
    let new = f.sim.cluster.add_maintenance_node().await.unwrap();
    let fingerprint = new.maintenance_fingerprint.clone().unwrap();
    let config = controlplane(&f);

    // A wrong fingerprint is refused before anything is sent.
    let wrong = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let refused = f
        .ops(&[
            "--yes",
            "join",
            &new.api,
            "--config",
            &config,
            "--cert-fingerprint",
            wrong,
        ])
        .await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(
        refused.stderr.contains(wrong) && refused.stderr.contains(&fingerprint),
        "{}",
        refused.stderr
    );
    assert_eq!(f.members().await.len(), 3);
    // Without a fingerprint or --insecure it says what to pass.
    let bare = f
        .ops(&["--yes", "join", &new.api, "--config", &config])
        .await;
    assert_eq!(bare.code, 1);
    assert!(
        bare.stderr.contains("--cert-fingerprint"),
        "{}",
        bare.stderr
    );

    let record = f
        .ops(&[
            "--yes",
            "join",
            &new.api,
            "--config",
            &config,
            "--cert-fingerprint",
            &fingerprint,
        ])
        .await
        .ok()
        .json();
    assert_eq!(record["state"], "succeeded", "{record}");
    assert_eq!(step_names(&record), ["apply-config", "wait-voter"]);
    let members = f.members().await;
    assert_eq!(members.len(), 4, "{members:?}");
    assert!(members.iter().all(|(_, learner)| !learner), "{members:?}");
}

async fn migrate(nodes: usize) {
    let f = Fixture::start(nodes).await;
    let new = f.sim.cluster.add_maintenance_node().await.unwrap();
    let fingerprint = new.maintenance_fingerprint.clone().unwrap();
    // The new node becomes an endpoint before the old one goes away.
    run(&f.talosconfig(), &["config", "add-endpoint", &new.api])
        .await
        .ok();
    let old = f.sim.ip(1);
    let run = f
        .ops(&[
            "--yes",
            "migrate",
            "--from",
            &old,
            "--to",
            &new.api,
            "--config",
            &controlplane(&f),
            "--cert-fingerprint",
            &fingerprint,
        ])
        .await
        .ok();
    assert!(
        run.stderr.contains(&format!(
            "between the join and the retire the cluster has {} members",
            nodes + 1
        )),
        "{}",
        run.stderr
    );
    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    assert_eq!(
        step_names(&record),
        [
            "apply-config",
            "wait-voter",
            "check-retire",
            "snapshot",
            "check",
            "forfeit",
            "leave",
            "reset",
            "confirm",
            "wait-silent"
        ]
    );
    assert!(
        record["facts"]["leave_to_reset_gap_ms"].as_f64().is_some(),
        "{record}"
    );
    let client = f.sim.admin();
    let members = wait_for(
        "the members without cp-1",
        Duration::from_secs(30),
        || async {
            client
                .node(new.ip.to_string())
                .etcd_member_list(false)
                .await
                .ok()
        },
    )
    .await;
    let mut names: Vec<_> = members.iter().map(|m| m.hostname.clone()).collect();
    names.sort();
    let expected: Vec<String> = (2..=nodes + 1).map(|i| format!("cp-{i}")).collect();
    assert_eq!(names, expected);
    assert!(members.iter().all(|m| !m.is_learner));
    assert!(
        client.node(old.as_str()).version().await.is_err(),
        "cp-1 still answers"
    );
    let status = client.node(new.ip.to_string()).etcd_status().await.unwrap();
    assert!(status.errors.is_empty());
    assert_eq!(newest(&f).await["kind"], "migrate");
}

#[tokio::test]
async fn migrate_from_a_single_node_to_a_new_one() {
    migrate(1).await;
}

#[tokio::test]
async fn migrate_replaces_one_of_three() {
    migrate(3).await;
}

#[tokio::test]
async fn apply_config_insecure_checks_the_pinned_fingerprint() {
    let f = Fixture::start(1).await;
    let new = f.sim.cluster.add_maintenance_node().await.unwrap();
    let fingerprint = new.maintenance_fingerprint.clone().unwrap();
    let config = controlplane(&f);
    let base = [
        "apply-config",
        "--insecure",
        "-n",
        &new.api,
        "-f",
        &config,
        "--dry-run",
    ];

    let wrong = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let mut args = base.to_vec();
    args.extend(["--cert-fingerprint", wrong]);
    let refused = run(&f.talosconfig(), &args).await;
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains(wrong) && refused.stderr.contains(&fingerprint),
        "{}",
        refused.stderr
    );

    let mut args = base.to_vec();
    args.extend(["--cert-fingerprint", &fingerprint]);
    let dry = run(&f.talosconfig(), &args).await.ok();
    assert!(dry.stderr.contains("Dry run summary:"), "{}", dry.stderr);
    // A dry run changed nothing: the node is still in maintenance mode.
    assert_eq!(
        f.sim.cluster.nodes()[1].maintenance_fingerprint,
        Some(fingerprint)
    );
    assert!(
        f.sim
            .admin()
            .node(new.ip.to_string())
            .version()
            .await
            .is_err()
    );
}

/// A migrate killed at `point` (`started:STEP` or `answered:STEP`) shows the
/// step in flight and resumes to the same end as an uninterrupted run.
async fn crash_and_resume_migrate(point: &str) {
    let f = Fixture::start(1).await;
    let new = f.sim.cluster.add_maintenance_node().await.unwrap();
    let fingerprint = new.maintenance_fingerprint.clone().unwrap();
    run(&f.talosconfig(), &["config", "add-endpoint", &new.api])
        .await
        .ok();
    let old = f.sim.ip(1);
    let config = controlplane(&f);
    let args = [
        "--yes",
        "migrate",
        "--from",
        &old,
        "--to",
        &new.api,
        "--config",
        &config,
        "--cert-fingerprint",
        &fingerprint,
    ];
    let crashed = f.ops_with(&f.talosconfig(), &args, Some(point)).await;
    assert_ne!(
        crashed.code, 0,
        "the CLI was to die at {point}:\n{}",
        crashed.stderr
    );
    let id = newest(&f).await["id"].as_str().unwrap().to_string();
    let shown = f.ops(&["show", &id]).await.ok().json();
    let in_flight: Vec<_> = shown["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "running")
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(in_flight, [point.split_once(':').unwrap().1], "{shown}");
    let resumed = f.ops(&["resume", &id]).await.ok().json();
    assert_eq!(resumed["state"], "succeeded", "{resumed}");
    let client = f.sim.admin();
    let members = client
        .node(new.ip.to_string())
        .etcd_member_list(false)
        .await
        .unwrap();
    assert_eq!(members.len(), 1, "{members:?}");
    assert_eq!(members[0].hostname, "cp-2");
    assert!(!members[0].is_learner);
    assert!(client.node(old.as_str()).version().await.is_err());
}

#[tokio::test]
async fn migrate_crash_after_the_maintenance_apply_answered() {
    crash_and_resume_migrate("answered:apply-config").await;
}

#[tokio::test]
async fn migrate_crash_after_the_leave_answered() {
    crash_and_resume_migrate("answered:leave").await;
}
