//! `talosctl-rs ops` through a running talos-opsd (`--socket`): the same
//! output and exit codes as in-process, `ops watch`, and `--local` on the
//! shared journal. Uses the talosctl-rs binary the workspace builds.

mod daemon;

use std::path::Path;

use daemon::{Daemon, cluster_toml, ops_cli as ops};
use talos_test_support::cli::command;
use talos_test_support::sim::SimCluster;

#[tokio::test]
async fn the_cli_runs_operations_through_the_daemon() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;

    let run = ops(&tc, &d.socket, &["--yes", "retire", &sim.ip(3)])
        .await
        .ok();
    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    let names: Vec<_> = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "snapshot",
            "check",
            "forfeit",
            "leave",
            "reset",
            "confirm",
            "wait-silent"
        ]
    );
    assert!(run.stderr.contains("[4] leave done"), "{}", run.stderr);
    assert!(record["facts"]["leave_to_reset_gap_ms"].as_f64().unwrap() > 0.0);
    let id = record["id"].as_str().unwrap().to_string();
    // Journaled by the daemon: the daemon's audit names the request.
    assert!(d.log_text().contains("start retire"), "{}", d.log_text());

    // A refusal exits 1 with the reason, as in-process.
    let refused = ops(&tc, &d.socket, &["--yes", "retire", "10.99.0.1"]).await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("is not an etcd member"),
        "{}",
        refused.stderr
    );

    // watch replays the ended operation; list and show come from the daemon.
    let watched = ops(&tc, &d.socket, &["watch", &id]).await.ok();
    assert!(
        watched.stderr.contains("[7] wait-silent done"),
        "{}",
        watched.stderr
    );
    assert_eq!(watched.json()["id"], id.as_str());
    let listed = ops(&tc, &d.socket, &["list"]).await.ok().json();
    assert_eq!(listed[0]["id"], id.as_str());
    // --local reads the same journal in this process.
    let state = dir.path().join("state");
    let local = ops(
        &tc,
        &d.socket,
        &[
            "--local",
            "--state-dir",
            state.to_str().unwrap(),
            "show",
            &id,
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(local["state"], "succeeded");
    assert_eq!(local["steps"], record["steps"]);
}

#[tokio::test]
async fn a_migrate_through_the_daemon_joins_from_maintenance_mode_and_retires() {
    let sim = SimCluster::start(3).await;
    let new = sim.cluster.add_maintenance_node().await.unwrap();
    let fingerprint = new.maintenance_fingerprint.clone().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    talos_test_support::cli::run(&tc, &["config", "add-endpoint", &new.api])
        .await
        .ok();
    let config = sim.dir.path().join("controlplane.yaml");
    let config = config.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;

    // Refused by the daemon as in-process: neither pinned nor --insecure.
    let bare = ops(
        &tc,
        &d.socket,
        &["--yes", "join", &new.api, "--config", config],
    )
    .await;
    assert_eq!(bare.code, 1, "{}", bare.stderr);
    assert!(
        bare.stderr.contains("--cert-fingerprint"),
        "{}",
        bare.stderr
    );

    // A join with a configuration changes a node: without --yes and
    // without a terminal it is refused after the daemon's plan is shown,
    // and the node stays in maintenance mode.
    let unconfirmed = ops(
        &tc,
        &d.socket,
        &[
            "join",
            &new.api,
            "--config",
            config,
            "--cert-fingerprint",
            &fingerprint,
        ],
    )
    .await;
    assert_eq!(unconfirmed.code, 1, "{}", unconfirmed.stderr);
    assert!(
        unconfirmed.stderr.contains("apply-config: apply")
            && unconfirmed.stderr.contains("[changes the cluster]")
            && unconfirmed.stderr.contains("pass --yes"),
        "{}",
        unconfirmed.stderr
    );
    let listed = ops(&tc, &d.socket, &["list"]).await.ok().json();
    assert_eq!(listed, serde_json::json!([]), "nothing was started");

    let old = sim.ip(1);
    let run = ops(
        &tc,
        &d.socket,
        &[
            "--yes",
            "migrate",
            "--from",
            &old,
            "--to",
            &new.api,
            "--config",
            config,
            "--cert-fingerprint",
            &fingerprint,
        ],
    )
    .await
    .ok();
    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    assert_eq!(record["kind"], "migrate", "{record}");
    let names: Vec<_> = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names[..2], ["apply-config", "wait-voter"], "{names:?}");
    assert_eq!(names.last(), Some(&"wait-silent"), "{names:?}");
    assert!(d.log_text().contains("start migrate"), "{}", d.log_text());

    let members = sim
        .admin()
        .node(new.ip.to_string())
        .etcd_member_list(false)
        .await
        .unwrap();
    let mut hostnames: Vec<_> = members.iter().map(|m| m.hostname.clone()).collect();
    hostnames.sort();
    assert_eq!(hostnames, ["cp-2", "cp-3", "cp-4"]);
    assert!(members.iter().all(|m| !m.is_learner), "{members:?}");
}

/// A daemon socket this user may not use (EACCES: the socket is the
/// daemon user's, mode 0600) is an error naming the socket and the cause,
/// exit 1; the CLI never takes it for "no daemon" and runs in-process.
#[tokio::test]
async fn a_socket_this_user_may_not_use_is_an_error_not_no_daemon() {
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::process::CommandExt as _;
    let dir = tempfile::tempdir().unwrap();
    // Others may pass through to the socket (and no more).
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let d = Daemon::start(dir.path(), "").await;
    let tc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../certs-example/talosconfig");
    let mut cmd = command(&tc);
    cmd.args(["-o", "json", "ops", "list"])
        .env("TALOS_OPSD_SOCKET", &d.socket)
        .env("HOME", dir.path());
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // Root may use any socket: the CLI runs as nobody instead.
        // SAFETY: setgid/setuid between fork and exec, async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    } else {
        std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&d.socket.display().to_string())
            && stderr.to_lowercase().contains("permission denied"),
        "{stderr}"
    );
    assert!(!stderr.contains("running in this process"), "{stderr}");
}

/// A join with a configuration through the daemon, on a terminal: the
/// daemon's plan is shown before the question, a "no" starts nothing and
/// leaves the node in maintenance mode, a "yes" joins it.
#[tokio::test(flavor = "multi_thread")]
async fn a_join_through_the_daemon_on_a_terminal_shows_the_plan_and_asks() {
    use std::io::Write as _;
    use std::process::Stdio;
    use std::time::Duration;
    use talos_test_support::pty::{Screen, openpty};

    let sim = SimCluster::start(3).await;
    let new = sim.cluster.add_maintenance_node().await.unwrap();
    let fingerprint = new.maintenance_fingerprint.clone().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    talos_test_support::cli::run(&tc, &["config", "add-endpoint", &new.api])
        .await
        .ok();
    let config = sim.dir.path().join("controlplane.yaml");
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    let join = |answer: &'static [u8]| {
        let (controller, terminal) = openpty();
        let mut cmd = command(&tc);
        cmd.args([
            "ops",
            "--without-cluster-lock",
            "join",
            &new.api,
            "--config",
        ])
        .arg(&config)
        .args(["--cert-fingerprint", &fingerprint])
        .env("TALOS_OPSD_SOCKET", &d.socket)
        .stdin(Stdio::from(terminal.try_clone().unwrap()))
        .stdout(Stdio::null())
        .stderr(Stdio::from(terminal));
        let mut child = cmd.spawn().unwrap();
        let controller = std::fs::File::from(controller);
        let mut typing = controller.try_clone().unwrap();
        let mut screen = Screen::new(controller);
        let shown = screen
            .wait_for("proceed? [y/N]", Duration::from_secs(60))
            .to_string();
        typing.write_all(answer).unwrap();
        let status = child.wait().unwrap();
        let ending = if status.success() {
            "wait-voter done"
        } else {
            "nothing was changed"
        };
        let all = screen
            .wait_for(ending, Duration::from_secs(120))
            .to_string();
        (status, shown, all)
    };
    let (status, shown, all) = tokio::task::block_in_place(|| join(b"n\n"));
    assert_eq!(status.code(), Some(1), "{all}");
    assert!(
        shown.contains("apply-config: apply") && shown.contains("[changes the cluster]"),
        "the daemon's plan comes before the question: {shown}"
    );
    let listed = ops(&tc, &d.socket, &["list"]).await.ok().json();
    assert_eq!(listed, serde_json::json!([]), "nothing was started");
    assert!(
        sim.admin()
            .node(new.ip.to_string())
            .etcd_member_list(false)
            .await
            .is_err(),
        "the node is still in maintenance mode"
    );

    let (status, _, all) = tokio::task::block_in_place(|| join(b"y\n"));
    assert!(status.success(), "{all}");
    let members = sim
        .admin()
        .node(new.ip.to_string())
        .etcd_member_list(false)
        .await
        .unwrap();
    assert_eq!(members.len(), 4, "{members:?}");
    assert!(members.iter().all(|m| !m.is_learner), "{members:?}");
}
