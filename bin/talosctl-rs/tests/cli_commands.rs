//! The real talosctl-rs binary: version, config, apply-config, reset,
//! completion, man, and exit codes.

use talos_test_support as common;

use common::cli::{etcd_members_json, run, run_bare};
use common::sim::SimCluster;
use talos_client::config::{Context, TalosConfig};
use talos_sim::pki::{Ca, LeafSpec};
use time::OffsetDateTime;

#[tokio::test]
async fn version_and_config_info() {
    let sim = SimCluster::start(1).await;
    let tc = sim.dir.path().join("talosconfig");
    let version = run(&tc, &["-o", "json", "version"]).await.ok().json();
    assert_eq!(version[0]["node"], sim.ip(1));
    assert_eq!(version[0]["result"]["tag"], "v1.13.9");
    let table = run(&tc, &["version"]).await.ok();
    assert!(table.stdout.starts_with("Client:\n"), "{}", table.stdout);
    assert!(
        table.stdout.contains("Server:\n\tNODE:        "),
        "{}",
        table.stdout
    );

    let info = run(&tc, &["-o", "json", "config", "info"])
        .await
        .ok()
        .json();
    assert_eq!(info["context"], "sim");
    assert_eq!(info["roles"], serde_json::json!(["os:admin"]));
    assert_eq!(info["nodes"], serde_json::json!([sim.ip(1)]));
    assert!(info["certTTL"].as_str().unwrap().ends_with("from now"));
    assert!(info["warnings"].as_array().unwrap().is_empty());
    let text = run(&tc, &["config", "info"]).await.ok();
    assert!(
        text.stdout.starts_with("Current context:     sim\n"),
        "{}",
        text.stdout
    );
}

fn expiring_talosconfig(dir: &std::path::Path, not_after: OffsetDateTime) -> std::path::PathBuf {
    let ca = Ca::generate().unwrap();
    let not_before = not_after - std::time::Duration::from_secs(86400 * 400);
    let crt = ca
        .issue(&LeafSpec::client(&["os:reader"]).valid(not_before, not_after))
        .unwrap();
    let context = Context::new(
        vec!["127.0.0.1".into()],
        ca.cert_pem.as_bytes(),
        crt.cert_pem.as_bytes(),
        crt.key_pem.as_bytes(),
    );
    let path = dir.join("talosconfig-expiry");
    std::fs::write(&path, TalosConfig::with_context("old", context).to_yaml()).unwrap();
    path
}

#[tokio::test]
async fn config_info_reports_expired_and_expiring_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let now = OffsetDateTime::now_utc();
    let expired = expiring_talosconfig(dir.path(), now - std::time::Duration::from_secs(3 * 86400));
    let out = run(&expired, &["config", "info"]).await.ok();
    assert!(
        out.stdout.contains("Certificate expires: 3 days ago"),
        "{}",
        out.stdout
    );
    assert!(
        out.stderr
            .contains("WARNING: the client certificate expired"),
        "{}",
        out.stderr
    );
    // Connecting with it is refused before any network traffic.
    let call = run(&expired, &["version"]).await;
    assert_eq!(call.code, 1);
    assert!(call.stderr.contains("expired at"), "{}", call.stderr);

    let soon = expiring_talosconfig(dir.path(), now + std::time::Duration::from_secs(10 * 86400));
    let info = run(&soon, &["-o", "json", "config", "info"])
        .await
        .ok()
        .json();
    assert!(
        info["warnings"][0]
            .as_str()
            .unwrap()
            .contains("renew it soon"),
        "{info}"
    );
}

#[tokio::test]
async fn contexts_switching_and_merge() {
    let sim = SimCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = dir.path().join("config");
    std::fs::copy(sim.dir.path().join("talosconfig"), &tc).unwrap();
    let reader = sim.dir.path().join("talosconfig-reader");

    let merged = run(&tc, &["config", "merge", reader.to_str().unwrap()])
        .await
        .ok();
    assert!(
        merged
            .stderr
            .contains("renamed talosconfig context \"sim\" -> \"sim-1\""),
        "{}",
        merged.stderr
    );
    let contexts = run(&tc, &["-o", "json", "config", "contexts"])
        .await
        .ok()
        .json();
    let names: Vec<_> = contexts
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].clone(), c["current"].clone()))
        .collect();
    assert_eq!(
        names,
        [("sim".into(), false.into()), ("sim-1".into(), true.into())]
    );
    let info = run(&tc, &["-o", "json", "config", "info"])
        .await
        .ok()
        .json();
    assert_eq!(info["roles"], serde_json::json!(["os:reader"]));

    run(&tc, &["config", "context", "sim"]).await.ok();
    let info = run(&tc, &["-o", "json", "config", "info"])
        .await
        .ok()
        .json();
    assert_eq!(info["roles"], serde_json::json!(["os:admin"]));
    // --context overrides the current one for one command.
    let info = run(&tc, &["-o", "json", "--context", "sim-1", "config", "info"])
        .await
        .ok()
        .json();
    assert_eq!(info["context"], "sim-1");

    let unknown = run(&tc, &["config", "context", "nope"]).await;
    assert_eq!(unknown.code, 1);
    assert!(
        unknown
            .stderr
            .contains("context \"nope\" not found (available: sim, sim-1)"),
        "{}",
        unknown.stderr
    );
    let table = run(&tc, &["config", "contexts"]).await.ok();
    assert!(
        table.stdout.starts_with("CURRENT   NAME"),
        "{}",
        table.stdout
    );
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&tc).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[tokio::test]
async fn config_endpoint_and_node_rewrite_the_current_context_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let tc = dir.path().join("config");
    // Two contexts, unknown keys at both levels, as another tool may write.
    std::fs::write(
        &tc,
        "context: a\nfuture: keep-me\ncontexts:\n  a:\n    endpoints: [10.0.0.1]\n    nodes: [10.0.0.1]\n    ca: Y2E=\n    crt: Y3J0\n    key: a2V5\n    extra: {x: 1}\n  b:\n    endpoints: [10.9.9.9]\n",
    )
    .unwrap();
    let read = || {
        serde_norway::from_str::<serde_json::Value>(&std::fs::read_to_string(&tc).unwrap()).unwrap()
    };

    run(&tc, &["config", "endpoint", "10.0.0.2", "10.0.0.3:50001"])
        .await
        .ok();
    run(&tc, &["config", "node", "10.0.0.2", "10.0.0.3"])
        .await
        .ok();
    run(&tc, &["config", "add-endpoint", "10.0.0.4", "10.0.0.2"])
        .await
        .ok();
    run(&tc, &["config", "remove-endpoint", "10.0.0.3:50001"])
        .await
        .ok();
    let config = read();
    let a = &config["contexts"]["a"];
    assert_eq!(a["endpoints"], serde_json::json!(["10.0.0.2", "10.0.0.4"]));
    assert_eq!(a["nodes"], serde_json::json!(["10.0.0.2", "10.0.0.3"]));
    assert_eq!(a["extra"]["x"], 1, "unknown keys kept: {config}");
    assert_eq!(a["key"], "a2V5");
    assert_eq!(config["future"], "keep-me");
    assert_eq!(
        config["contexts"]["b"]["endpoints"],
        serde_json::json!(["10.9.9.9"]),
        "other contexts untouched"
    );
    let mode = std::fs::metadata(&tc).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // Bad input is refused and changes nothing.
    let before = std::fs::read(&tc).unwrap();
    let bad = run(&tc, &["config", "endpoint", "https://10.0.0.2:notaport"]).await;
    assert_eq!(bad.code, 1, "{}", bad.stderr);
    assert!(bad.stderr.contains("notaport"), "{}", bad.stderr);
    let missing = run(&tc, &["config", "remove-endpoint", "10.7.7.7"]).await;
    assert_eq!(missing.code, 1);
    assert!(missing.stderr.contains("10.7.7.7"), "{}", missing.stderr);
    let unknown = run(&tc, &["--context", "zzz", "config", "node", "10.0.0.5"]).await;
    assert_eq!(unknown.code, 1);
    assert!(unknown.stderr.contains("zzz"), "{}", unknown.stderr);
    assert_eq!(std::fs::read(&tc).unwrap(), before);

    // --context picks another context to edit.
    run(&tc, &["--context", "b", "config", "node", "10.9.9.8"])
        .await
        .ok();
    assert_eq!(
        read()["contexts"]["b"]["nodes"],
        serde_json::json!(["10.9.9.8"])
    );
}

#[tokio::test]
async fn apply_config_dry_run_try_and_bad_input() {
    let sim = SimCluster::start(1).await;
    let tc = sim.dir.path().join("talosconfig");
    let changed = sim.dir.path().join("changed.yaml");
    let original = std::fs::read_to_string(sim.dir.path().join("controlplane.yaml")).unwrap();
    std::fs::write(
        &changed,
        original.replace("clusterName: talos-sim", "clusterName: renamed"),
    )
    .unwrap();
    let file = changed.to_str().unwrap();

    let dry = run(&tc, &["apply-config", "-f", file, "--dry-run"])
        .await
        .ok();
    assert!(dry.stderr.contains("Dry run summary:"), "{}", dry.stderr);
    assert!(
        dry.stderr.contains("+  clusterName: renamed"),
        "{}",
        dry.stderr
    );

    let tried = run(
        &tc,
        &[
            "-o",
            "json",
            "apply-config",
            "-f",
            file,
            "-m",
            "try",
            "--timeout",
            "2m",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(tried[0]["result"]["mode"], "try");
    assert!(
        tried[0]["result"]["mode_details"]
            .as_str()
            .unwrap()
            .ends_with("reverted back in 2m0s")
    );
    assert!(sim.cluster.node("cp-1").unwrap().rollback_pending());
    let confirmed = run(
        &tc,
        &["-o", "json", "apply-config", "-f", file, "-m", "no-reboot"],
    )
    .await
    .ok()
    .json();
    assert_eq!(confirmed[0]["result"]["mode"], "no-reboot");
    assert!(!sim.cluster.node("cp-1").unwrap().rollback_pending());

    let missing = run(&tc, &["apply-config", "-f", "/nonexistent.yaml"]).await;
    assert_eq!(missing.code, 1);
    assert!(
        missing
            .stderr
            .contains("--file /nonexistent.yaml: cannot read"),
        "{}",
        missing.stderr
    );
    let no_file = run(&tc, &["apply-config"]).await;
    assert_eq!(no_file.code, 2);
    let bad_mode = run(&tc, &["apply-config", "-f", file, "-m", "sometimes"]).await;
    assert_eq!(bad_mode.code, 2);
    let invalid = sim.dir.path().join("invalid.yaml");
    std::fs::write(&invalid, "version: v1alpha1\nmachine: [\n").unwrap();
    let rejected = run(&tc, &["apply-config", "-f", invalid.to_str().unwrap()]).await;
    assert_eq!(rejected.code, 1);
    assert!(
        rejected.stderr.contains("invalid argument"),
        "{}",
        rejected.stderr
    );
}

#[tokio::test]
async fn reset_guards_quorum_and_waits_for_power_off() {
    let sim = SimCluster::start(3).await;
    let tc = sim.dir.path().join("talosconfig");
    let n3 = sim.ip(3);
    let refused = run(&tc, &["-n", &n3, "reset", "--graceful=false"]).await;
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("still a voting etcd member"),
        "{}",
        refused.stderr
    );
    assert!(refused.stderr.contains("ops retire"), "{}", refused.stderr);
    // The command the hint names exists.
    run(&tc, &["ops", "retire", "--help"]).await.ok();
    // Nothing changed.
    run(&tc, &["-n", &n3, "version"]).await.ok();

    let bad_label = run(
        &tc,
        &["-n", &n3, "reset", "--system-labels-to-wipe", "BOGUS"],
    )
    .await;
    assert_eq!(bad_label.code, 1);
    assert!(
        bad_label.stderr.contains("\"BOGUS\""),
        "{}",
        bad_label.stderr
    );
    let usage = run(&tc, &["reset", "--wipe-mode", "everything"]).await;
    assert_eq!(usage.code, 2);

    let reset = run(
        &tc,
        &[
            "-n",
            &n3,
            "reset",
            "--system-labels-to-wipe",
            "STATE,EPHEMERAL",
            "--timeout",
            "1m",
        ],
    )
    .await
    .ok();
    assert!(reset.stderr.contains("reset accepted"), "{}", reset.stderr);
    assert!(
        reset.stderr.contains(&format!("{n3}: done")),
        "{}",
        reset.stderr
    );
    let down = run(&tc, &["-n", &n3, "version"]).await;
    assert_eq!(down.code, 1);
    let members = etcd_members_json(&tc).await;
    assert_eq!(
        members[0]["result"].as_array().unwrap().len(),
        2,
        "graceful: it left etcd first"
    );
}

#[tokio::test]
async fn completion_man_and_usage_errors() {
    let home = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let out = run_bare(home.path(), &["completion", shell]).await.ok();
        assert!(out.stdout.contains("talosctl-rs"), "{shell}");
    }
    let man = run_bare(home.path(), &["man"]).await.ok();
    assert!(
        man.stdout.starts_with(".ie") || man.stdout.contains(".TH talosctl-rs"),
        "{}",
        &man.stdout[..200]
    );

    let usage = run_bare(home.path(), &["etcd", "frobnicate"]).await;
    assert_eq!(usage.code, 2);
    let no_config = run_bare(home.path(), &["etcd", "members"]).await;
    assert_eq!(no_config.code, 1);
    let lines: Vec<_> = no_config.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{}", no_config.stderr);
    assert!(
        lines[0].starts_with("error: no talosconfig found"),
        "{}",
        no_config.stderr
    );
    assert!(lines[1].starts_with("hint: "), "{}", no_config.stderr);
}

/// `talosctl-rs ... | head`: once the reader is gone, the process ends by
/// SIGPIPE, as talosctl does, with no panic on stderr.
#[test]
fn a_closed_stdout_ends_the_process_by_sigpipe() {
    use std::os::unix::process::ExitStatusExt as _;
    let home = tempfile::tempdir().unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let output = std::process::Command::new(common::cli::binary())
        .args(["version", "--client"])
        .env_remove("TALOSCONFIG")
        .env("HOME", home.path())
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.signal(), Some(libc::SIGPIPE), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `config new` asks a node for a certificate with the roles given: the new
/// talosconfig (private, with the endpoints in use) reads what its roles
/// allow and is refused the rest; `config info` shows its roles; a short
/// lifetime is warned about once by every command; bad input sends nothing.
#[tokio::test]
async fn config_new_issues_a_certificate_with_the_roles_asked_for() {
    use std::os::unix::fs::PermissionsExt;

    let sim = SimCluster::start(3).await;
    let admin = sim.dir.path().join("talosconfig");
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup-talosconfig");
    let backup_arg = backup.to_str().unwrap();
    let made = run(
        &admin,
        &[
            "config",
            "new",
            "--roles",
            "os:etcd:backup",
            "--crt-ttl",
            "240h",
            backup_arg,
        ],
    )
    .await
    .ok();
    assert!(
        made.stderr.contains("roles os:etcd:backup"),
        "{}",
        made.stderr
    );
    let mode = std::fs::metadata(&backup).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "the new talosconfig is private: {mode:o}");

    let info = run(&backup, &["-o", "json", "config", "info"])
        .await
        .ok()
        .json();
    assert_eq!(
        info["roles"],
        serde_json::json!(["os:etcd:backup"]),
        "{info}"
    );
    let admin_info = run(&admin, &["-o", "json", "config", "info"])
        .await
        .ok()
        .json();
    assert_eq!(info["endpoints"], admin_info["endpoints"], "{info}");
    // Ten days: within the 30-day warning, said once per command.
    assert!(
        info["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("renew it soon")),
        "{info}"
    );

    let node = sim.ip(1);
    let members = run(&backup, &["-n", &node, "etcd", "members"]).await.ok();
    assert_eq!(
        members.stderr.matches("renew it soon").count(),
        1,
        "one warning per command: {}",
        members.stderr
    );
    let snapshot = dir.path().join("db.snapshot");
    run(
        &backup,
        &["-n", &node, "etcd", "snapshot", snapshot.to_str().unwrap()],
    )
    .await
    .ok();
    assert!(std::fs::metadata(&snapshot).unwrap().len() > 0);
    // A leave needs os:admin: refused, and the member stays.
    let leave = run(&backup, &["-n", &node, "etcd", "leave"]).await;
    assert_ne!(leave.code, 0, "{}", leave.stdout);
    assert!(
        leave.stderr.contains("PermissionDenied") || leave.stderr.contains("not authorized"),
        "{}",
        leave.stderr
    );
    let members = sim
        .admin()
        .node(node.clone())
        .etcd_member_list(false)
        .await
        .unwrap();
    assert_eq!(members.len(), 3, "{members:?}");
    // Only os:admin may issue certificates.
    let again = dir.path().join("from-backup");
    let refused = run(&backup, &["config", "new", again.to_str().unwrap()]).await;
    assert_ne!(refused.code, 0);
    assert!(!again.exists());

    // Bad input: an unknown role, an existing file, a zero lifetime.
    let other = dir.path().join("other");
    let unknown = run(
        &admin,
        &[
            "config",
            "new",
            "--roles",
            "os:nonsense",
            other.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
    assert!(unknown.stderr.contains("os:nonsense"), "{}", unknown.stderr);
    let exists = run(&admin, &["config", "new", backup_arg]).await;
    assert_ne!(exists.code, 0);
    assert!(
        exists.stderr.contains("already exists"),
        "{}",
        exists.stderr
    );
    let zero = run(
        &admin,
        &["config", "new", "--crt-ttl", "0s", other.to_str().unwrap()],
    )
    .await;
    assert_eq!(zero.code, 2, "{}", zero.stderr);
    assert!(!other.exists());
}
