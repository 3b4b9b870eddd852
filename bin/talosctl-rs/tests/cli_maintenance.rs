//! The maintenance commands an operator types during a night on the
//! cluster, run as the real binary against a simulated cluster: what they
//! print, their per-node errors, and the streams ending cleanly on Ctrl-C.

use std::io::Write as _;
use std::time::Duration;

use talos_test_support::cli::{command, run};
use talos_test_support::pty::{CTRL_C, Screen, spawn_in_terminal};
use talos_test_support::sim::{SimCluster, wait_for};

fn talosconfig(sim: &SimCluster) -> std::path::PathBuf {
    sim.dir.path().join("talosconfig")
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_dmesg_containers_service_and_images_answer_as_talosctl_prints_them() {
    let sim = SimCluster::start(1).await;
    sim.wait_etcd_healthy(1).await;
    let tc = talosconfig(&sim);
    let ip = sim.ip(1);

    let logs = run(&tc, &["logs", "etcd", "--tail", "2"]).await.ok();
    let lines: Vec<&str> = logs.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", logs.stdout);
    for line in &lines {
        let json = line
            .strip_prefix(&format!("{ip}: "))
            .unwrap_or_else(|| panic!("no node label: {line}"));
        let entry: serde_json::Value = serde_json::from_str(json).unwrap();
        assert!(entry["level"].is_string(), "{line}");
    }
    // Any service's log is served; the simulator keeps etcd's only.
    let empty = run(&tc, &["logs", "apid"]).await.ok();
    assert_eq!(empty.stdout, "");
    let missing = run(&tc, &["logs", "-k", "kube-system/none:none"]).await;
    assert_eq!(missing.code, 1);
    assert!(
        missing.stderr.contains(&format!(
            "{ip}: container \"kube-system/none:none\" not found"
        )),
        "{}",
        missing.stderr
    );

    let dmesg = run(&tc, &["dmesg"]).await.ok();
    assert!(
        dmesg
            .stdout
            .lines()
            .all(|l| l.starts_with(&format!("{ip}: ")) && l.contains(": [")),
        "{}",
        dmesg.stdout
    );
    assert!(dmesg.stdout.contains("hostname set to cp-1"));

    let containers = run(&tc, &["containers"]).await.ok();
    let etcd_row = containers
        .stdout
        .lines()
        .find(|l| l.contains(" etcd "))
        .unwrap_or_else(|| panic!("{}", containers.stdout));
    let cells: Vec<&str> = etcd_row.split_whitespace().collect();
    assert_eq!(
        cells[..4],
        [
            ip.as_str(),
            "system",
            "etcd",
            "registry.k8s.io/etcd:v3.6.12"
        ]
    );
    assert_eq!(cells[5], "RUNNING");
    let pid = sim.cluster.node("cp-1").unwrap().etcd_pid().await.unwrap();
    assert_eq!(cells[4], pid.to_string(), "the etcd process's own pid");
    // No Kubernetes here: the CRI namespace has nothing, header only.
    let pods = run(&tc, &["containers", "-k"]).await.ok();
    assert_eq!(
        pods.stdout,
        "NODE   NAMESPACE   ID   IMAGE   PID   STATUS\n"
    );

    let service = run(&tc, &["service", "etcd"]).await.ok();
    assert!(service.stdout.starts_with(&format!("NODE     {ip}\nID       etcd\nSTATE    Running\nHEALTH   OK\nEVENTS   [Running]: Health check successful (")), "{}", service.stdout);
    let restart = run(&tc, &["service", "kubelet", "restart"]).await.ok();
    assert_eq!(
        restart.stdout.split_whitespace().collect::<Vec<_>>(),
        [
            "NODE",
            "RESPONSE",
            ip.as_str(),
            "Service",
            "\"kubelet\"",
            "restarted"
        ]
    );
    let refused = run(&tc, &["service", "etcd", "restart"]).await;
    assert_eq!(refused.code, 1);
    assert!(
        refused
            .stderr
            .contains("service \"etcd\" doesn't support restart operation via API"),
        "{}",
        refused.stderr
    );
    let unknown = run(&tc, &["service", "etcd", "bounce"]).await;
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
    assert!(
        unknown
            .stderr
            .contains("unsupported service action: \"bounce\"")
    );

    let pulled = run(
        &tc,
        &["image", "pull", "ghcr.io/siderolabs/installer:v1.13.9"],
    )
    .await
    .ok();
    assert!(
        pulled.stdout.starts_with(&format!(
            "{ip}: pulled image ghcr.io/siderolabs/installer@sha256:"
        )),
        "{}",
        pulled.stdout
    );
    let images = run(&tc, &["image", "list"]).await.ok();
    assert!(
        images
            .stdout
            .contains("ghcr.io/siderolabs/installer@sha256:"),
        "{}",
        images.stdout
    );
    let system = run(&tc, &["image", "ls", "--namespace", "system", "-o", "json"])
        .await
        .ok()
        .json();
    let names: Vec<&str> = system[0]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "ghcr.io/siderolabs/kubelet:v1.36.3",
            "registry.k8s.io/etcd:v3.6.12"
        ]
    );
}

/// etcd's storage downgrade, on etcd 3.6: validated, enabled, cancelled;
/// one node at a time, as talosctl requires.
#[tokio::test(flavor = "multi_thread")]
async fn etcd_downgrade_validates_enables_and_cancels() {
    let sim = SimCluster::start(1).await;
    let tc = talosconfig(&sim);
    let ip = sim.ip(1);
    for (args, message) in [
        (
            &["etcd", "downgrade", "validate", "3.5"][..],
            "downgrade validate success, cluster version 3.6",
        ),
        (
            &["etcd", "downgrade", "enable", "3.5"][..],
            "downgrade enable success, cluster version 3.6",
        ),
        (
            &["etcd", "downgrade", "cancel"][..],
            "downgrade cancel success, cluster version 3.6",
        ),
    ] {
        let out = run(&tc, args).await.ok();
        assert_eq!(
            out.stdout.split_whitespace().collect::<Vec<_>>().join(" "),
            format!("NODE MESSAGE {ip} {message}")
        );
    }
    let bad = run(&tc, &["etcd", "downgrade", "validate", "3.4"]).await;
    assert_eq!(bad.code, 1);
    assert!(
        bad.stderr
            .contains("etcd downgrade is only supported to 3.5 and later versions"),
        "{}",
        bad.stderr
    );
    let many = run(
        &tc,
        &["-n", &format!("{ip},{ip}"), "etcd", "downgrade", "cancel"],
    )
    .await;
    assert_eq!(many.code, 2);
    assert!(
        many.stderr
            .contains("command \"etcd downgrade cancel\" is not supported with multiple nodes"),
        "{}",
        many.stderr
    );
}

/// A node that cannot answer is reported on stderr, the others' output
/// goes on, and the command fails, as every fanned-out command does.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_that_fails_is_reported_and_the_others_answer() {
    let sim = SimCluster::start(3).await;
    let tc = talosconfig(&sim);
    sim.cluster.power_off(&sim.ip(3)).await.unwrap();
    let nodes = format!("{},{}", sim.ip(1), sim.ip(3));
    for args in [
        &["containers"][..],
        &["service"][..],
        &["dmesg"][..],
        &["logs", "etcd", "--tail", "1"][..],
        &["image", "list"][..],
    ] {
        let mut argv = vec!["-n", nodes.as_str()];
        argv.extend_from_slice(args);
        let out = run(&tc, &argv).await;
        assert_eq!(out.code, 1, "{args:?}: {}", out.stderr);
        assert!(out.stdout.contains(&sim.ip(1)), "{args:?}: {}", out.stdout);
        assert!(!out.stdout.contains(&sim.ip(3)), "{args:?}: {}", out.stdout);
        assert!(
            out.stderr.contains(&format!("error: {}: ", sim.ip(3)))
                && out.stderr.contains("1 of 2 nodes failed"),
            "{args:?}: {}",
            out.stderr
        );
    }
}

/// Runs the CLI on a terminal until `shown` appears, types Ctrl-C, and
/// returns the screen and the exit code.
fn interrupted(tc: &std::path::Path, args: &[&str], shown: &str) -> (String, Option<i32>) {
    let mut cmd = command(tc);
    cmd.args(args);
    let (mut child, controller) = spawn_in_terminal(&mut cmd);
    drop(cmd);
    let mut keyboard = controller.try_clone().unwrap();
    let mut screen = Screen::new(controller);
    screen.wait_for(shown, Duration::from_secs(60));
    keyboard.write_all(CTRL_C).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        screen.drain(Duration::from_millis(300)).to_string(),
        status.code(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn followed_streams_stop_cleanly_on_ctrl_c() {
    let sim = SimCluster::start(1).await;
    let tc = talosconfig(&sim);
    let ip = sim.ip(1);
    tokio::task::block_in_place(|| {
        let (screen, code) = interrupted(
            &tc,
            &["logs", "-f", "etcd", "--tail", "1"],
            &format!("{ip}: {{"),
        );
        assert_eq!(code, Some(0), "{screen}");
        let (screen, code) = interrupted(&tc, &["events", "--tail", "3"], "MachineStatusEvent");
        assert_eq!(code, Some(0), "{screen}");
        assert!(screen.contains("NODE"), "{screen}");
        let (screen, code) = interrupted(&tc, &["dmesg", "-f"], "boot sequence: done");
        assert_eq!(code, Some(0), "{screen}");
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn events_tail_prints_the_last_events_at_once() {
    let sim = SimCluster::start(1).await;
    let tc = talosconfig(&sim);
    let ip = sim.ip(1);
    // The stream follows: read what arrives within a few seconds on a
    // terminal, then stop it.
    let text = tokio::task::block_in_place(|| {
        let (screen, code) = interrupted(&tc, &["events", "--tail", "2"], "RUNNING");
        assert_eq!(code, Some(0));
        screen
    });
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines[0].starts_with("NODE "), "{text}");
    assert!(
        lines[0].split_whitespace().collect::<Vec<_>>()
            == ["NODE", "ID", "EVENT", "ACTOR", "SOURCE", "MESSAGE"],
        "{text}"
    );
    assert!(lines[1].starts_with(&format!("{ip}   ")), "{text}");
    assert!(
        lines[1].ends_with("talos/runtime/machine.SequenceEvent")
            || lines[1].ends_with("talos/runtime/machine.MachineStatusEvent"),
        "{text}"
    );
    let json = tokio::task::block_in_place(|| {
        interrupted(&tc, &["-o", "json", "events", "--tail", "1"], "\"kind\"").0
    });
    let event: serde_json::Value =
        serde_json::from_str(json.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!(event["payload"]["kind"], "machine_status");
    assert_eq!(event["payload"]["stage"], "RUNNING");
    assert_eq!(event["node"], ip.as_str());
}

/// Reboot waits for the node's new boot, shutdown for the node to go.
#[tokio::test(flavor = "multi_thread")]
async fn reboot_waits_for_the_new_boot_and_shutdown_for_silence() {
    let sim = SimCluster::start(3).await;
    let tc = talosconfig(&sim);
    let target = sim.ip(3);
    let boot = sim.cluster.node("cp-3").unwrap().boot_id();
    let out = run(&tc, &["-n", &target, "reboot"]).await.ok();
    assert!(
        out.stderr
            .contains(&format!("{target}: rebooted (boot id changed)")),
        "{}",
        out.stderr
    );
    assert_ne!(sim.cluster.node("cp-3").unwrap().boot_id(), boot);
    let bad = run(&tc, &["-n", &target, "reboot", "--mode", "sideways"]).await;
    assert_eq!(bad.code, 2);
    let out = run(&tc, &["-n", &target, "shutdown", "--force"]).await.ok();
    assert!(
        out.stderr.contains(&format!("{target}: powered off")),
        "{}",
        out.stderr
    );
    let gone = sim.admin().node(target.as_str()).version().await;
    assert!(gone.is_err(), "{gone:?}");
}

/// The recovery of the field reports' worst case: a node whose etcd data
/// is gone, bootstrapped from a snapshot taken before.
#[tokio::test(flavor = "multi_thread")]
async fn bootstrap_recovers_etcd_from_a_snapshot() {
    let sim = SimCluster::start(1).await;
    sim.cluster.fill("/registry/keep/", 20, 100).await.unwrap();
    let tc = talosconfig(&sim);
    let snapshot = sim.dir.path().join("backup.db");
    let path = snapshot.to_str().unwrap();
    run(&tc, &["etcd", "snapshot", path]).await.ok();
    let again = run(&tc, &["bootstrap"]).await;
    assert_eq!(again.code, 1);
    assert!(
        again.stderr.contains("etcd data directory is not empty"),
        "{}",
        again.stderr
    );

    run(
        &tc,
        &[
            "reset",
            "--system-labels-to-wipe",
            "EPHEMERAL",
            "--reboot",
            "--graceful=false",
            "--force",
        ],
    )
    .await
    .ok();
    let node = sim.admin();
    wait_for("the node to answer", Duration::from_secs(60), || async {
        node.hostname().await.ok()
    })
    .await;
    let out = run(&tc, &["bootstrap", "--recover-from", path]).await.ok();
    assert!(
        out.stdout
            .starts_with(&format!("recovering from snapshot \"{path}\": hash ")),
        "{}",
        out.stdout
    );
    let status = wait_for("etcd to run again", Duration::from_secs(60), || async {
        node.etcd_status().await.ok()
    })
    .await;
    assert!(status.is_leader());
    let verify = run(&tc, &["-o", "json", "etcd", "status"])
        .await
        .ok()
        .json();
    assert_eq!(verify[0]["result"]["protocol_version"], "3.6.12");
    // The data came back: a new snapshot holds the same keys.
    let before = talos_client::snapshot::verify_file(&snapshot).unwrap();
    let after = sim.dir.path().join("after.db");
    let saved = talos_client::snapshot::save(node.etcd_snapshot().await.unwrap())
        .to(&after)
        .await
        .unwrap();
    assert_eq!(saved.report.status.total_keys, before.status.total_keys);
    assert!(before.status.total_keys >= 20);
}
