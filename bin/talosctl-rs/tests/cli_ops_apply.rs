//! `talosctl-rs ops apply` against the simulator (real etcd, Talos 1.13.9
//! apply semantics): a passing gate confirmed, a failing check rolled back
//! and verified, the path and issuer guards, a change that needs a reboot,
//! and a crash at each step followed by `ops resume`.
//!
//! The simulator cancels a pending TRY rollback on any non-TRY request,
//! dry runs included, as Talos 1.13.9 does (talos#14343): the rollback test
//! therefore also proves that the operation sends no such request while
//! its TRY is pending.

mod ops_fixture;

use ops_fixture::{Fixture, newest};

const SANS: (&str, &str) = ("certSANs: []", "certSANs: [vip.example]");

impl Fixture {
    async fn apply(&self, file: &std::path::Path, extra: &[&str]) -> talos_test_support::cli::Run {
        let ip = self.sim.ip(1);
        let file = file.to_str().unwrap();
        let mut args = vec!["--yes", "-n", &ip, "apply", "-f", file];
        args.extend_from_slice(extra);
        self.ops(&args).await
    }
}

fn step_states(record: &serde_json::Value) -> Vec<(String, String)> {
    record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                // A step's name never holds its node: the node is a field.
                format!(
                    "{} {}",
                    s["name"].as_str().unwrap(),
                    s["node"].as_str().unwrap()
                ),
                s["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_passing_gate_is_confirmed_and_persisted() {
    let f = Fixture::start(3).await;
    let file = f.config_with("sans.yaml", &[SANS]);
    let run = f
        .apply(
            &file,
            &[
                "--expect-change",
                "machine.certSANs",
                "--try-timeout",
                "20s",
                "--check",
                "test \"$TALOS_NODE\" != \"\"",
            ],
        )
        .await
        .ok();
    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    let ip = f.sim.ip(1);
    assert_eq!(
        step_states(&record),
        [
            (format!("try {ip}"), "done".into()),
            (format!("gate {ip}"), "done".into()),
            (format!("confirm {ip}"), "done".into()),
        ]
    );
    assert!(
        run.stderr.contains("changed paths: machine.certSANs"),
        "{}",
        run.stderr
    );
    let node = f.sim.cluster.node("cp-1").unwrap();
    // Confirmed: no rollback pending, the file persisted and running.
    assert!(!node.rollback_pending());
    assert!(node.active_config().contains("vip.example"));
    let persisted = std::fs::read_to_string(node.config_path()).unwrap();
    assert!(persisted.contains("vip.example"));
    // The journal holds the file's hash, never its contents (keys).
    let shown = f.ops(&["show", record["id"].as_str().unwrap()]).await.ok();
    assert!(
        !shown.stdout.contains("talos-sim-token"),
        "{}",
        shown.stdout
    );
}

#[tokio::test]
async fn a_failing_check_sends_nothing_more_and_the_rollback_is_verified() {
    let f = Fixture::start(1).await;
    let node = f.sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    let file = f.config_with("sans.yaml", &[SANS]);
    let run = f
        .apply(
            &file,
            &[
                "--expect-change",
                "machine.certSANs",
                "--try-timeout",
                "3s",
                "--check",
                "echo API unreachable >&2; exit 3",
            ],
        )
        .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("API unreachable"), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("rolled back to its previous configuration (verified)"),
        "{}",
        run.stderr
    );
    let record = newest(&f).await;
    assert_eq!(record["state"], "failed", "{record}");
    let ip = f.sim.ip(1);
    assert_eq!(
        step_states(&record),
        [
            (format!("try {ip}"), "done".into()),
            (format!("gate {ip}"), "failed".into()),
            (format!("confirm {ip}"), "pending".into()),
        ]
    );
    assert_eq!(node.active_config(), before);
    assert!(!node.rollback_pending());
    assert!(
        !std::fs::read_to_string(node.config_path())
            .unwrap()
            .contains("vip.example")
    );
}

#[tokio::test]
async fn an_unexpected_changed_path_is_refused_before_anything_is_sent() {
    let f = Fixture::start(1).await;
    let node = f.sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    let file = f.config_with(
        "two.yaml",
        &[SANS, ("clusterName: talos-sim", "clusterName: other")],
    );
    let run = f
        .apply(&file, &["--expect-change", "machine.certSANs"])
        .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("changes cluster.clusterName, outside the expected changes machine.certSANs")
            && run
                .stderr
                .contains("hint: add the path with --expect-change"),
        "{}",
        run.stderr
    );
    assert_eq!(f.ops(&["list"]).await.ok().json(), serde_json::json!([]));
    assert_eq!(node.active_config(), before);
    assert!(!node.rollback_pending());
}

#[tokio::test]
async fn an_endpoint_change_needs_the_issuer_pinned() {
    let f = Fixture::start(1).await;
    let node = f.sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    let old_endpoint = format!("https://{}:6443", f.sim.ip(1));
    let endpoint = (old_endpoint.as_str(), "https://k8s.example:6443");
    let file = f.config_with("endpoint.yaml", &[endpoint]);
    // Nothing expected: any change is refused, with the changed paths.
    let run = f.apply(&file, &[]).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("changes cluster.controlPlane.endpoint, and no change was expected"),
        "{}",
        run.stderr
    );
    let expect = ["--expect-change", "cluster.controlPlane.endpoint"];
    let run = f.apply(&file, &expect).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!(
            "(Talos v1.13.9, controlplane): the issuer(s) {old_endpoint} would no longer be accepted"
        )),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("--allow-issuer-change controlplane"),
        "{}",
        run.stderr
    );
    assert_eq!(node.active_config(), before);
    // The operator may accept it knowingly for the control plane (plan only
    // here); allowing it for workers does not cover this node.
    f.apply(
        &file,
        &[
            expect[0],
            expect[1],
            "--plan",
            "--allow-issuer-change",
            "controlplane",
        ],
    )
    .await
    .ok();
    let run = f
        .apply(
            &file,
            &[
                expect[0],
                expect[1],
                "--plan",
                "--allow-issuer-change",
                "worker",
            ],
        )
        .await;
    assert_eq!(run.code, 1, "{}", run.stderr);

    // With the old issuer pinned, the change goes through. Talos 1.13.9 (the
    // simulator's default) has no KubeServiceAccountConfig (its config
    // registry refuses the kind): the pin is the API server's flags.
    let pin = format!(
        "cluster:\n  apiServer:\n    extraArgs:\n      service-account-issuer: {old_endpoint}\n      api-audiences: {old_endpoint}\n"
    );
    let pinned = f.config_with("pinned.yaml", &[endpoint, ("cluster:\n", pin.as_str())]);
    let record = f
        .apply(
            &pinned,
            &[
                "--expect-change",
                "cluster.controlPlane.endpoint",
                "--expect-change",
                "cluster.apiServer",
                "--try-timeout",
                "20s",
            ],
        )
        .await
        .ok()
        .json();
    assert_eq!(record["state"], "succeeded", "{record}");
    assert!(node.active_config().contains("k8s.example"));
}

/// Talos 1.13.9 derives --api-audiences from the endpoint too: pinning the
/// issuer alone still rejects every token bound to the old audience; and it
/// does not know KubeServiceAccountConfig at all.
#[tokio::test]
async fn an_issuer_pin_without_the_audiences_is_refused_on_1_13_9() {
    let f = Fixture::start(1).await;
    let node = f.sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    let old_endpoint = format!("https://{}:6443", f.sim.ip(1));
    let endpoint = (old_endpoint.as_str(), "https://k8s.example:6443");
    let pin = format!(
        "cluster:\n  apiServer:\n    extraArgs:\n      service-account-issuer: {old_endpoint}\n"
    );
    let file = f.config_with(
        "issuer-only.yaml",
        &[endpoint, ("cluster:\n", pin.as_str())],
    );
    let expect = [
        "--expect-change",
        "cluster.controlPlane.endpoint",
        "--expect-change",
        "cluster.apiServer",
    ];
    let run = f.apply(&file, &expect).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    let ip = f.sim.ip(1);
    assert!(
        run.stderr.contains(&format!(
            "{ip} (Talos v1.13.9, controlplane): the API audience(s) {old_endpoint} would no longer be accepted (audiences after: https://k8s.example:6443)"
        )),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("both cluster.apiServer.extraArgs.service-account-issuer and api-audiences")
            && run.stderr.contains("hint:")
            && run.stderr.contains("--allow-issuer-change controlplane"),
        "{}",
        run.stderr
    );

    // The VIP field report's pin: a document 1.13.9 does not register.
    let mut config = std::fs::read_to_string(f.sim.dir.path().join("controlplane.yaml"))
        .unwrap()
        .replace(endpoint.0, endpoint.1);
    config.push_str(&format!(
        "---\napiVersion: v1alpha1\nkind: KubeServiceAccountConfig\nissuer:\n  issuerURL: {old_endpoint}\n"
    ));
    let sa = f.state.path().join("sa.yaml");
    std::fs::write(&sa, config).unwrap();
    let run = f
        .apply(&sa, &["--expect-change", "cluster.controlPlane.endpoint"])
        .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("runs Talos v1.13.9, which refuses")
            && run
                .stderr
                .contains("\"KubeServiceAccountConfig\" \"v1alpha1\": not registered"),
        "{}",
        run.stderr
    );
    assert_eq!(f.ops(&["list"]).await.ok().json(), serde_json::json!([]));
    assert_eq!(node.active_config(), before);
    assert!(!node.rollback_pending());
}

#[tokio::test]
async fn a_secret_must_be_named_itself_and_nothing_expected_refuses_any_change() {
    let f = Fixture::start(1).await;
    let node = f.sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    let file = f.config_with(
        "token.yaml",
        &[("token: talos-sim-token", "token: rotated"), SANS],
    );
    // Nothing expected: the changed paths are shown and refused.
    let run = f.apply(&file, &[]).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("changes machine.certSANs, machine.token, and no change was expected")
            && run
                .stderr
                .contains("hint: name each changed path with --expect-change"),
        "{}",
        run.stderr
    );
    // A token is a secret: its section does not cover it.
    let run = f.apply(&file, &["--expect-change", "machine"]).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("changes the secret(s) machine.token")
            && run.stderr.contains("hint: name each secret path itself"),
        "{}",
        run.stderr
    );
    // Named, it reaches the node's own verdict (a reboot here).
    let run = f
        .apply(
            &file,
            &[
                "--expect-change",
                "machine",
                "--expect-change",
                "machine.token",
            ],
        )
        .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("cannot be applied without a reboot"),
        "{}",
        run.stderr
    );
    assert_eq!(f.ops(&["list"]).await.ok().json(), serde_json::json!([]));
    assert_eq!(node.active_config(), before);
}

#[tokio::test]
async fn a_change_that_needs_a_reboot_is_refused_unless_allowed() {
    let f = Fixture::start(3).await;
    let node = f.sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    let file = f.config_with(
        "token.yaml",
        &[("token: talos-sim-token", "token: rotated")],
    );
    let run = f.apply(&file, &["--expect-change", "machine.token"]).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("cannot be applied without a reboot"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("--allow-reboot"), "{}", run.stderr);
    assert_eq!(node.active_config(), before);

    let run = f
        .apply(
            &file,
            &[
                "--expect-change",
                "machine.token",
                "--allow-reboot",
                "--reboot-timeout",
                "2m",
            ],
        )
        .await
        .ok();
    assert!(
        run.stderr.contains("NO automatic rollback"),
        "{}",
        run.stderr
    );
    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    let ip = f.sim.ip(1);
    assert_eq!(
        step_states(&record),
        [
            (format!("reboot {ip}"), "done".into()),
            (format!("wait-back {ip}"), "done".into()),
        ]
    );
    assert!(node.active_config().contains("token: rotated"));
    assert_eq!(f.members().await.len(), 3);
}

async fn crash_and_resume(point: &str) {
    let f = Fixture::start(1).await;
    let ip = f.sim.ip(1);
    let file = f.config_with("sans.yaml", &[SANS]);
    let point = format!("{point} {ip}");
    let args = [
        "--yes",
        "-n",
        ip.as_str(),
        "apply",
        "-f",
        file.to_str().unwrap(),
        "--expect-change",
        "machine.certSANs",
        "--try-timeout",
        "30s",
    ];
    let crashed = f.ops_with(&f.talosconfig(), &args, Some(&point)).await;
    assert_ne!(
        crashed.code, 0,
        "the CLI was to die at {point}:\n{}",
        crashed.stderr
    );
    let record = newest(&f).await;
    let id = record["id"].as_str().unwrap().to_string();
    let step = point.split_once(':').unwrap().1.to_string();
    let shown = f.ops(&["show", &id]).await.ok().json();
    let in_flight: Vec<_> = step_states(&shown)
        .into_iter()
        .filter(|(_, state)| state == "running")
        .map(|(name, _)| name)
        .collect();
    assert_eq!(in_flight, [step], "{shown}");
    let resumed = f.ops(&["resume", &id]).await.ok().json();
    assert_eq!(resumed["state"], "succeeded", "{resumed}");
    let node = f.sim.cluster.node("cp-1").unwrap();
    assert!(!node.rollback_pending());
    assert!(node.active_config().contains("vip.example"));
    assert!(
        std::fs::read_to_string(node.config_path())
            .unwrap()
            .contains("vip.example")
    );
}

#[tokio::test]
async fn crash_before_the_try_is_sent() {
    crash_and_resume("started:try").await;
}

#[tokio::test]
async fn crash_after_the_try_answered() {
    crash_and_resume("answered:try").await;
}

#[tokio::test]
async fn crash_during_the_gate() {
    crash_and_resume("started:gate").await;
}

#[tokio::test]
async fn crash_before_the_confirmation_is_sent() {
    crash_and_resume("started:confirm").await;
}

#[tokio::test]
async fn crash_after_the_confirmation_answered() {
    crash_and_resume("answered:confirm").await;
}

#[tokio::test]
async fn several_nodes_go_one_at_a_time_and_stop_at_the_first_failure() {
    let f = Fixture::start(3).await;
    let (ip1, ip2) = (f.sim.ip(1), f.sim.ip(2));
    let file = f.config_with("sans.yaml", &[SANS]);
    let nodes = format!("{ip1},{ip2}");
    // The check fails on the first node only.
    let check = format!("test \"$TALOS_NODE\" != {ip1}");
    let run = f
        .ops(&[
            "--yes",
            "-n",
            &nodes,
            "apply",
            "-f",
            file.to_str().unwrap(),
            "--expect-change",
            "machine.certSANs",
            "--try-timeout",
            "3s",
            "--check",
            &check,
        ])
        .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    let record = newest(&f).await;
    assert_eq!(
        step_states(&record),
        [
            (format!("try {ip1}"), "done".into()),
            (format!("gate {ip1}"), "failed".into()),
            (format!("confirm {ip1}"), "pending".into()),
            (format!("try {ip2}"), "pending".into()),
            (format!("gate {ip2}"), "pending".into()),
            (format!("confirm {ip2}"), "pending".into()),
        ]
    );
    for name in ["cp-1", "cp-2"] {
        let node = f.sim.cluster.node(name).unwrap();
        assert!(!node.active_config().contains("vip.example"), "{name}");
        assert!(!node.rollback_pending(), "{name}");
    }
}

#[tokio::test]
async fn a_crash_after_the_reboot_answered_resumes_to_the_node_back() {
    let f = Fixture::start(1).await;
    let ip = f.sim.ip(1);
    let file = f.config_with(
        "token.yaml",
        &[("token: talos-sim-token", "token: rotated")],
    );
    let args = [
        "--yes",
        "-n",
        ip.as_str(),
        "apply",
        "-f",
        file.to_str().unwrap(),
        "--expect-change",
        "machine.token",
        "--allow-reboot",
    ];
    let point = format!("answered:reboot {ip}");
    let crashed = f.ops_with(&f.talosconfig(), &args, Some(&point)).await;
    assert_ne!(crashed.code, 0, "{}", crashed.stderr);
    let id = newest(&f).await["id"].as_str().unwrap().to_string();
    let resumed = f.ops(&["resume", &id]).await.ok().json();
    assert_eq!(resumed["state"], "succeeded", "{resumed}");
    assert_eq!(
        step_states(&resumed),
        [
            (format!("reboot {ip}"), "done".into()),
            (format!("wait-back {ip}"), "done".into()),
        ]
    );
    assert!(
        f.sim
            .cluster
            .node("cp-1")
            .unwrap()
            .active_config()
            .contains("token: rotated")
    );
}

/// A node whose saved configuration is ahead of the one it runs (a STAGED
/// apply waiting for a reboot) is refused at plan time, naming the paths
/// that differ: applying now would replace the staged change unseen.
#[tokio::test]
async fn a_staged_change_waiting_for_a_reboot_is_refused() {
    use talos_client::client::{ApplyMode, ApplyRequest};
    let f = Fixture::start(1).await;
    let node = f.sim.cluster.node("cp-1").unwrap();
    let staged = f.config_with(
        "staged.yaml",
        &[("clusterName: talos-sim", "clusterName: staged")],
    );
    f.sim
        .admin()
        .node(f.sim.ip(1).as_str())
        .apply_configuration(ApplyRequest::new(
            std::fs::read(&staged).unwrap(),
            ApplyMode::Staged,
        ))
        .await
        .expect("staged");
    let running = node.active_config();
    let file = f.config_with("sans.yaml", &[SANS]);
    let run = f
        .apply(&file, &["--expect-change", "machine.certSANs"])
        .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("saved a configuration that differs from the one it runs")
            && run.stderr.contains("cluster.clusterName")
            && run
                .stderr
                .contains("hint: let the pending change finish first"),
        "{}",
        run.stderr
    );
    assert_eq!(f.ops(&["list"]).await.ok().json(), serde_json::json!([]));
    assert_eq!(node.active_config(), running);
    let saved = f
        .sim
        .admin()
        .node(f.sim.ip(1).as_str())
        .resources()
        .machine_config(talos_client::client::resources::ConfigId::Persistent)
        .await
        .unwrap();
    assert!(saved.yaml.contains("clusterName: staged"), "{}", saved.yaml);
}

/// When the kubelet's health is known again on node 1, the time of its last
/// start (its "Started task" event).
async fn kubelet_healthy(f: &Fixture) -> time::OffsetDateTime {
    let client = f.sim.admin();
    let node = client.node(f.sim.ip(1));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let services = node.service_list().await.unwrap();
        let kubelet = services.iter().find(|s| s.id == "kubelet").unwrap();
        if kubelet.health.healthy {
            return kubelet
                .events
                .iter()
                .rev()
                .find(|e| e.msg.starts_with("Started task"))
                .and_then(|e| e.ts)
                .unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the kubelet did not become healthy: {kubelet:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A kubelet change restarts the kubelet (upstream's
/// KubeletServiceController, internal/app/machined/pkg/controllers/k8s/
/// kubelet_service.go), whose health is unknown until its first check
/// (services/kubelet.go, 2 s upstream; 8 s here). The gate counts a
/// health-checked service whose health is not known yet as not up, as
/// machined does: it fails when the try window is shorter than that, and
/// waits for it when it is not. A change outside the kubelet's inputs
/// leaves it running.
#[tokio::test]
async fn the_gate_waits_for_the_kubelet_a_kubelet_change_restarts() {
    let f = Fixture::start_with(1, |cfg| {
        cfg.timing = talos_sim::TalosTiming {
            kubelet_health_initial_delay: std::time::Duration::from_secs(8),
            ..talos_sim::TalosTiming::scaled_down(talos_test_support::sim::timing_divisor())
        }
    })
    .await;
    let booted = kubelet_healthy(&f).await;
    let kubelet = (
        "  certSANs: []\n",
        "  certSANs: []\n  kubelet:\n    extraArgs:\n      v: \"2\"\n",
    );
    let file = f.config_with("kubelet.yaml", &[kubelet]);
    let args = |timeout: &'static str| {
        [
            "--expect-change",
            "machine.kubelet",
            "--try-timeout",
            timeout,
        ]
    };

    // A window shorter than the kubelet's first check: the gate fails on
    // it, and the rollback (which restarts the kubelet again) is verified.
    let short = f.apply(&file, &args("5s")).await;
    assert_eq!(short.code, 1, "{}", short.stderr);
    assert!(
        short
            .stderr
            .contains("kubelet (Running, health not known yet)"),
        "{}",
        short.stderr
    );
    assert!(
        short
            .stderr
            .contains("rolled back to its previous configuration (verified)"),
        "{}",
        short.stderr
    );
    let rolled_back = kubelet_healthy(&f).await;
    assert!(rolled_back > booted, "the kubelet restarted");

    // Not an input of the kubelet: it keeps running, the gate passes.
    let sans = f.config_with("sans.yaml", &[SANS]);
    let run = f
        .apply(
            &sans,
            &[
                "--expect-change",
                "machine.certSANs",
                "--try-timeout",
                "20s",
            ],
        )
        .await
        .ok();
    assert_eq!(run.json()["state"], "succeeded", "{}", run.stdout);
    assert_eq!(
        kubelet_healthy(&f).await,
        rolled_back,
        "the kubelet kept running"
    );

    // A window long enough: the gate waits for the restarted kubelet.
    let both = f.config_with("both.yaml", &[kubelet, SANS]);
    let run = f
        .apply(
            &both,
            &["--expect-change", "machine.kubelet", "--try-timeout", "40s"],
        )
        .await
        .ok();
    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    let gate = record["steps"][1]["detail"].as_str().unwrap().to_string();
    assert!(!gate.contains("(attempt 1)"), "the gate waited: {gate}");
    assert!(
        kubelet_healthy(&f).await > rolled_back,
        "the kubelet restarted"
    );
}
