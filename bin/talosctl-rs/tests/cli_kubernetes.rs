//! The operations' checks that ask Kubernetes, against the simulator's
//! real kube-apiserver (needs the binary: `scripts/kube-apiserver.sh`
//! builds it, and the test command runs it).
//!
//! - `ops apply`: a token minted before the change must still authenticate
//!   in the gate, so an endpoint change the issuer guard was told to allow
//!   is caught and rolled back, and a pinned one passes.
//! - `ops retire`: controllers renewing their leases through a node's
//!   KubePrism lose none (the reset follows the leave within milliseconds),
//!   where the same handover typed by hand with a pause loses some (seed
//!   000's surprise), and the retired node's API server stops accepting
//!   connections.

use std::time::Duration;

mod ops_fixture;

use ops_fixture::Fixture;
use talos_client::kube::{KubeClient, KubeConfig, LeaseRenewer, LeaseRenewerOptions, RenewalStats};
use talos_test_support::cli::Run;
use talos_test_support::sim::{kube_apiserver_binary, timing_divisor, wait_for};

#[tokio::test]
async fn kubernetes_an_unpinned_endpoint_change_fails_the_token_check_and_rolls_back() {
    let f = Fixture::with_kubernetes(1).await;
    let ip = f.sim.ip(1);
    let node = f.sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    let old_endpoint = format!("https://{ip}:6443");
    let endpoint = (old_endpoint.as_str(), "https://k8s.example:6443");

    // The issuer guard is overridden: only the token check stands between
    // this change and every token of the cluster.
    let unpinned = f.config_with("unpinned.yaml", &[endpoint]);
    let run = apply_endpoint(
        &f,
        &unpinned,
        &[
            "--allow-issuer-change",
            "controlplane",
            "--try-timeout",
            "60s",
        ],
        None,
    )
    .await;
    assert_failed_with(
        &run,
        &[
            "rejects the service-account token minted before the change (401 Unauthorized)",
            "a definitive answer",
            "the gate ends at once",
            "rolled back to its previous configuration (verified)",
        ],
    );
    assert_eq!(
        node.active_config(),
        before,
        "the node runs its old configuration"
    );
    wait_old_flags(&f, &old_endpoint).await;

    // Pinned (issuer and audiences, as 1.13.9 needs), the same change
    // passes the token check and is confirmed.
    let pin = format!(
        "cluster:\n  apiServer:\n    extraArgs:\n      service-account-issuer: {old_endpoint}\n      api-audiences: {old_endpoint}\n"
    );
    let pinned = f.config_with("pinned.yaml", &[endpoint, ("cluster:\n", pin.as_str())]);
    let run = apply_endpoint(
        &f,
        &pinned,
        &[
            "--expect-change",
            "cluster.apiServer",
            "--try-timeout",
            "30s",
        ],
        None,
    )
    .await
    .ok();
    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    let details: Vec<String> = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["detail"].as_str().map(str::to_string))
        .collect();
    assert!(
        details
            .iter()
            .any(|d| d.contains("a token of kube-system/default minted for the gate")),
        "{details:?}"
    );
    assert!(
        details
            .iter()
            .any(|d| d.contains("still accepts the token minted before the change")),
        "{details:?}"
    );
    assert!(node.active_config().contains("k8s.example"));
}

/// Checks that `run` exited 1 and its error holds each of `expected`.
fn assert_failed_with(run: &Run, expected: &[&str]) {
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    for expected in expected {
        assert!(
            run.stderr.contains(expected),
            "{expected:?} not in:\n{}",
            run.stderr
        );
    }
}

/// Waits until cp-1's API server runs with `old_endpoint` as its issuer
/// again (kubelet restarts it at its next poll after the rollback), and is
/// ready.
async fn wait_old_flags(f: &Fixture, old_endpoint: &str) {
    let node = f.sim.cluster.node("cp-1").unwrap();
    let flag = format!("--service-account-issuer={old_endpoint}");
    wait_for(
        "the API server with its old flags again",
        Duration::from_secs(60),
        || async { node.kube_apiserver_args()?.contains(&flag).then_some(()) },
    )
    .await;
    f.sim.wait_kubernetes_ready(1).await;
}

/// `ops apply` of `file` to cp-1 expecting an endpoint change, with
/// `extra` arguments, dying at `crash` when given.
async fn apply_endpoint(
    f: &Fixture,
    file: &std::path::Path,
    extra: &[&str],
    crash: Option<&str>,
) -> Run {
    let ip = f.sim.ip(1);
    let mut args = vec![
        "--yes",
        "-n",
        &ip,
        "apply",
        "-f",
        file.to_str().unwrap(),
        "--expect-change",
        "cluster.controlPlane.endpoint",
    ];
    args.extend_from_slice(extra);
    f.ops_with(&f.talosconfig(), &args, crash).await
}

/// kubelet restarts the API server's static pod at its next poll of the
/// static pods (every 20 s by default), so right after the TRY the old API
/// server still answers, with the old flags, and accepts every token. A
/// soak shorter than that poll passed on it and confirmed an unpinned
/// issuer change; the gate now waits for the restart (a later process
/// start in the API server's metrics) before a pass counts.
#[tokio::test]
async fn kubernetes_the_gate_waits_for_the_api_server_to_restart_with_the_new_flags() {
    let f = Fixture::with_kubernetes_and(1, |cfg| {
        cfg.timing.static_pod_poll = Duration::from_secs(20);
    })
    .await;
    let ip = f.sim.ip(1);
    let node = f.sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    let old_endpoint = format!("https://{ip}:6443");
    let unpinned = f.config_with(
        "unpinned.yaml",
        &[(old_endpoint.as_str(), "https://k8s.example:6443")],
    );
    // A 45 s window: a 15 s soak, shorter than the poll.
    let run = apply_endpoint(
        &f,
        &unpinned,
        &[
            "--allow-issuer-change",
            "controlplane",
            "--try-timeout",
            "45s",
        ],
        None,
    )
    .await;
    assert_failed_with(
        &run,
        &[
            "rejects the service-account token minted before the change (401 Unauthorized)",
            "rolled back to its previous configuration (verified)",
        ],
    );
    assert_eq!(
        node.active_config(),
        before,
        "the node runs its old configuration"
    );
}

/// The token lives in memory only (never in the journal): a run that dies
/// in the gate takes it along. Resumed, an apply whose issuer change was
/// allowed cannot show that tokens survive, so it is not confirmed and
/// rolls back; a pinned change keeps every issuer, and its resumed gate
/// checks readiness alone and says so.
#[tokio::test]
async fn kubernetes_a_crash_in_the_gate_loses_the_token_and_an_allowed_issuer_change_rolls_back() {
    let f = Fixture::with_kubernetes(1).await;
    let ip = f.sim.ip(1);
    let node = f.sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    let old_endpoint = format!("https://{ip}:6443");
    let endpoint = (old_endpoint.as_str(), "https://k8s.example:6443");
    let crash_point = format!("started:gate {ip}");
    let resume = |crashed: Run| {
        let f = &f;
        async move {
            assert_ne!(
                crashed.code, 0,
                "the CLI was to die in the gate:\n{}",
                crashed.stderr
            );
            let id = ops_fixture::newest(f).await["id"]
                .as_str()
                .unwrap()
                .to_string();
            f.ops(&["resume", &id]).await
        }
    };

    let unpinned = f.config_with("unpinned.yaml", &[endpoint]);
    let crashed = apply_endpoint(
        &f,
        &unpinned,
        &[
            "--allow-issuer-change",
            "controlplane",
            "--try-timeout",
            "30s",
        ],
        Some(&crash_point),
    )
    .await;
    let resumed = resume(crashed).await;
    assert_failed_with(
        &resumed,
        &[
            "was lost with the run that stopped",
            "the change is not confirmed",
            "rolled back to its previous configuration (verified)",
        ],
    );
    assert_eq!(
        node.active_config(),
        before,
        "the node runs its old configuration"
    );

    wait_old_flags(&f, &old_endpoint).await;
    let pin = format!(
        "cluster:\n  apiServer:\n    extraArgs:\n      service-account-issuer: {old_endpoint}\n      api-audiences: {old_endpoint}\n"
    );
    let pinned = f.config_with("pinned.yaml", &[endpoint, ("cluster:\n", pin.as_str())]);
    let crashed = apply_endpoint(
        &f,
        &pinned,
        &[
            "--expect-change",
            "cluster.apiServer",
            "--try-timeout",
            "30s",
        ],
        Some(&crash_point),
    )
    .await;
    let record = resume(crashed).await.ok().json();
    assert_eq!(record["state"], "succeeded", "{record}");
    assert!(
        record["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["detail"].as_str().is_some_and(
                |d| d.contains("no token check: the token was minted by an earlier run")
            )),
        "{record}"
    );
    assert!(node.active_config().contains("k8s.example"));
}

/// A renewal's renew deadline and retry period here: client-go's 10 s and
/// 2 s, as kube-controller-manager and kube-scheduler run them (the
/// hand-typed pause below is longer than the deadline; the retire's
/// leave-to-reset gap far shorter). Halved, a loaded machine (clippy and
/// other simulated clusters beside) once stretched one reconnect past 5 s.
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// client-go's lease duration.
const LEASE_DURATION: Duration = Duration::from_secs(15);
/// The pause of the hand-typed handover between `etcd leave` and `reset`:
/// longer than the renew deadline by half of it.
const HAND_PAUSE: Duration = Duration::from_secs(15);

/// Three control-plane nodes with Kubernetes, KubePrism health checks off
/// (every upstream stays in one tier: connections go round-robin, so
/// three controllers land on the three API servers, one each).
async fn round_robin_cluster() -> Fixture {
    let binary = kube_apiserver_binary();
    let f = Fixture::start_with(3, |cfg| {
        cfg.timing = talos_sim::TalosTiming {
            kubeprism_health_interval: Duration::from_secs(3600),
            ..talos_sim::TalosTiming::scaled_down(timing_divisor())
        };
        cfg.kube_apiserver = Some(binary);
    })
    .await;
    f.sim.wait_kubernetes_ready(3).await;
    f.sim.wait_etcd_healthy(3).await;
    f
}

/// cp-1's KubePrism as `https://IP:PORT`.
fn prism_url(f: &Fixture) -> String {
    let prism = f
        .sim
        .cluster
        .node("cp-1")
        .unwrap()
        .kubeprism_addr()
        .unwrap();
    format!("https://{prism}")
}

/// Open proxied connections per upstream of cp-1's KubePrism.
fn open_connections(f: &Fixture) -> Vec<(String, u64)> {
    let node = f.sim.cluster.node("cp-1").unwrap();
    node.kubeprism_upstreams()
        .into_iter()
        .map(|u| (u.address, u.open))
        .collect()
}

/// Three controllers, each renewing its own Lease on its own connection
/// through cp-1's KubePrism; returns once each has renewed and the three
/// connections sit on three different API servers.
async fn controllers(f: &Fixture) -> Vec<LeaseRenewer> {
    let yaml = f.sim.admin().node(f.sim.ip(1)).kubeconfig().await.unwrap();
    let config = KubeConfig::from_yaml(&yaml)
        .unwrap()
        .with_server(prism_url(f))
        .with_tls_server_name("localhost");
    let mut renewers = Vec::new();
    for i in 1..=3 {
        let client = KubeClient::new(&config)
            .unwrap()
            .with_timeout(RENEW_DEADLINE);
        let mut options = LeaseRenewerOptions::new("kube-system", format!("controller-{i}"));
        options.renew_deadline = RENEW_DEADLINE;
        options.retry_period = RETRY_PERIOD;
        options.lease_duration = LEASE_DURATION;
        renewers.push(LeaseRenewer::start(client, options).await.unwrap());
    }
    wait_for(
        "every controller to renew",
        Duration::from_secs(30),
        || async {
            renewers
                .iter()
                .all(|r| r.stats().renewed >= 2)
                .then_some(())
        },
    )
    .await;
    // Round-robin: one connection per API server, cp-2's among them.
    let cp2 = format!("{}:6443", f.sim.ip(2));
    let open = open_connections(f);
    assert!(
        open.iter().any(|(address, n)| *address == cp2 && *n >= 1),
        "a controller's connection sits on cp-2's API server: {open:?}"
    );
    renewers
}

/// Stops the controllers once each renewed again after `since` (they
/// recovered), and sums what they saw.
async fn stop_after_recovery(renewers: Vec<LeaseRenewer>, since: &[u64]) -> RenewalStats {
    wait_for(
        "every controller to renew again",
        Duration::from_secs(60),
        || async {
            renewers
                .iter()
                .zip(since)
                .all(|(r, n)| r.stats().renewed > *n)
                .then_some(())
        },
    )
    .await;
    let mut total = RenewalStats::default();
    for r in renewers {
        let s = r.stop().await;
        total.renewed += s.renewed;
        total.failed += s.failed;
        total.failed_attempts += s.failed_attempts;
        total.longest_gap_ms = total.longest_gap_ms.max(s.longest_gap_ms);
        total.last_error = total.last_error.or(s.last_error);
    }
    total
}

#[tokio::test]
async fn kubernetes_ops_retire_loses_no_lease_renewal_through_kubeprism() {
    let f = round_robin_cluster().await;
    let renewers = controllers(&f).await;
    let since: Vec<u64> = renewers.iter().map(|r| r.stats().renewed).collect();
    let ip2 = f.sim.ip(2);
    let url = prism_url(&f);
    let deadline = format!("{}s", RENEW_DEADLINE.as_secs());
    let run = f
        .ops(&[
            "--yes",
            "retire",
            &ip2,
            "--lease-probe",
            &url,
            "--lease-probe-tls-server-name",
            "localhost",
            "--lease-probe-deadline",
            &deadline,
        ])
        .await
        .ok();
    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    let controllers = stop_after_recovery(renewers, &since).await;
    eprintln!("ops retire: controllers {controllers:?}");
    assert_eq!(
        controllers.failed, 0,
        "no controller lost its lease: {controllers:?}"
    );

    // The operation's own probe saw the same.
    let probe = &record["facts"]["lease_renewals"];
    assert!(probe["renewed"].as_u64().unwrap() > 0, "{probe}");
    assert_eq!(probe["failed"], 0, "{probe}");
    let last = record["steps"].as_array().unwrap().last().unwrap();
    let detail = last["detail"].as_str().unwrap();
    for expected in [
        "its Kubernetes API server (port 6443) no longer accepts connections",
        "0 failed (a lease lost each)",
    ] {
        assert!(detail.contains(expected), "{expected:?} not in {detail:?}");
    }
    assert!(
        std::net::TcpStream::connect((ip2.as_str(), 6443)).is_err(),
        "nothing listens on the retired node's port 6443"
    );
}

#[tokio::test]
async fn kubernetes_a_hand_typed_leave_pause_reset_loses_lease_renewals() {
    let f = round_robin_cluster().await;
    let renewers = controllers(&f).await;
    let ip2 = f.sim.ip(2);
    // The simulator runs in this process: the CLI runs off its threads.
    let ctl = |args: &[&str]| {
        let mut cmd = talos_test_support::cli::command(&f.talosconfig());
        cmd.args(["-n", &ip2]).args(args);
        async move {
            let out = tokio::task::spawn_blocking(move || cmd.output())
                .await
                .unwrap()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    ctl(&["etcd", "leave"]).await;
    // The pause is what this test measures: an operator reading the output
    // before typing the next command.
    tokio::time::sleep(HAND_PAUSE).await;
    ctl(&[
        "reset",
        "--system-labels-to-wipe",
        "STATE",
        "--system-labels-to-wipe",
        "EPHEMERAL",
        "--reboot=false",
        "--graceful=false",
        "--wait=false",
    ])
    .await;
    let since: Vec<u64> = renewers.iter().map(|r| r.stats().renewed).collect();
    let controllers = stop_after_recovery(renewers, &since).await;
    eprintln!("hand-typed: controllers {controllers:?}");
    assert!(
        controllers.failed > 0,
        "the controller on cp-2's API server lost its lease during the pause: {controllers:?}"
    );
}

/// `talosctl-rs` with the simulator's talosconfig, off the test's threads
/// (the simulator runs in this process).
async fn cli(f: &Fixture, args: &[&str]) -> std::process::Output {
    let mut cmd = talos_test_support::cli::command(&f.talosconfig());
    cmd.args(args);
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn kubernetes_health_and_apply_wait_for_or_refuse_a_frozen_api_server() {
    let f = Fixture::with_kubernetes(3).await;
    f.sim.wait_etcd_healthy(3).await;
    let ip1 = f.sim.ip(1);
    let out = cli(&f, &["-n", &ip1, "health", "--wait-timeout", "2m"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for i in 1..=3 {
        let line = format!(
            "waiting for kube-apiserver https://{}:6443 to be ready: OK",
            f.sim.ip(i)
        );
        assert!(stdout.contains(&line), "{line:?} not in:\n{stdout}");
    }
    assert!(
        stdout.contains("waiting for all k8s nodes to report ready: none registered"),
        "{stdout}"
    );

    // cp-2's API server frozen: it accepts connections and answers
    // nothing; the check waits for it and fails naming it.
    let pid = f
        .sim
        .cluster
        .node("cp-2")
        .unwrap()
        .kube_apiserver_pid()
        .unwrap();
    /// Thaws the API server however the test ends.
    struct Frozen(u32);
    impl Drop for Frozen {
        fn drop(&mut self) {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &self.0.to_string()])
                .status();
        }
    }
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(stopped.success(), "kill -STOP {pid}");
    let frozen = Frozen(pid);
    let out = cli(&f, &["-n", &ip1, "health", "--wait-timeout", "30s"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let expected = format!(
        "Kubernetes health check failed: kube-apiserver https://{}:6443",
        f.sim.ip(2)
    );
    assert!(stderr.contains(&expected), "{expected:?} not in:\n{stderr}");

    // An apply to cp-2 cannot mint its token there: refused before
    // anything is sent, the way to go on without the check named.
    let ip2 = f.sim.ip(2);
    let node = f.sim.cluster.node("cp-2").unwrap();
    let before = node.active_config();
    let file = f.config_with("sans.yaml", &[("certSANs: []", "certSANs: [vip.example]")]);
    let run = f
        .ops(&[
            "--yes",
            "-n",
            &ip2,
            "apply",
            "-f",
            file.to_str().unwrap(),
            "--expect-change",
            "machine.certSANs",
        ])
        .await;
    drop(frozen);
    assert_eq!(run.code, 1, "{}", run.stderr);
    for expected in [
        "API server cannot be checked before the change",
        "nothing was sent (--skip-kube-check applies without the Kubernetes check)",
    ] {
        assert!(
            run.stderr.contains(expected),
            "{expected:?} not in:\n{}",
            run.stderr
        );
    }
    assert_eq!(node.active_config(), before);
    assert!(!node.rollback_pending());
}
