//! The output of every operation held to golden files in
//! tests/golden/ops/: for snapshot, defrag, apply, join, migrate, retire,
//! drill, restore and upgrade, the
//! plan (`--plan`: the table on stderr, JSON on stdout) and the result (the
//! JSON record of the run, and `ops show` as a table), on one simulator
//! cluster. Run-dependent values (ids, addresses, hostnames, times,
//! durations, hashes, temporary paths) are normalised first, and table
//! spacing folded, as tests/cli_golden.rs does.
//!
//! After an intended change of output: `UPDATE_GOLDEN=1 cargo test -p
//! talosctl-rs --test cli_golden_ops`, then review the diff.

use std::path::PathBuf;

use regex::Regex;

mod ops_fixture;

use ops_fixture::Fixture;

/// One operation's golden outputs, compared (or written) under `name`.
async fn check(f: &Fixture, name: &str, args: &[&str], mismatches: &mut Vec<String>) {
    let mut plan_args = vec!["--plan"];
    plan_args.extend_from_slice(args);
    let plan = f.ops(&plan_args).await.ok();
    let mut run_args = vec!["--yes"];
    run_args.extend_from_slice(args);
    let run = f.ops(&run_args).await.ok();
    let record = run.json();
    assert_eq!(record["state"], "succeeded", "{name}: {record}");
    let id = record["id"].as_str().unwrap();
    let shown = talos_test_support::cli::run(
        &f.talosconfig(),
        &[
            "ops",
            "--without-cluster-lock",
            "--state-dir",
            f.state.path().to_str().unwrap(),
            "show",
            id,
        ],
    )
    .await
    .ok();
    for (kind, text, table) in [
        ("plan.table", &plan.stderr, true),
        ("plan.json", &plan.stdout, false),
        ("result.json", &run.stdout, false),
        ("result.table", &shown.stdout, true),
    ] {
        compare(
            &format!("{name}-{kind}"),
            &normalise(text, table),
            mismatches,
        );
    }
}

fn compare(file: &str, got: &str, mismatches: &mut Vec<String>) {
    let path = golden_dir().join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    if got != want {
        mismatches.push(format!(
            "{}:\n--- want\n{want}--- got\n{got}",
            path.display()
        ));
    }
}

/// A voter that does not lead, so the plans say the same every run.
async fn follower(f: &Fixture) -> String {
    let leader = f.sim.leader().await;
    (1..=3)
        .map(|i| f.sim.ip(i))
        .find(|ip| *ip != leader)
        .unwrap()
}

#[tokio::test]
async fn every_operation_s_plan_and_result_match_the_golden_files() {
    let f = Fixture::start(3).await;
    let tc = f.talosconfig();
    let mut mismatches = Vec::new();
    check(
        &f,
        "snapshot",
        &["snapshot", "--keep", "2"],
        &mut mismatches,
    )
    .await;

    check(&f, "defrag", &["defrag", "--all"], &mut mismatches).await;

    let config = std::fs::read_to_string(f.sim.dir.path().join("controlplane.yaml"))
        .unwrap()
        .replace("certSANs: []", "certSANs: [vip.example]");
    let file = f.state.path().join("sans.yaml");
    std::fs::write(&file, config).unwrap();
    let ip2 = f.sim.ip(2);
    let apply = [
        "-n",
        ip2.as_str(),
        "apply",
        "-f",
        file.to_str().unwrap(),
        "--expect-change",
        "machine.certSANs",
        "--try-timeout",
        "20s",
    ];
    // -n is a global flag: it goes before `ops`.
    check_apply(&f, &apply, &mut mismatches).await;

    check(&f, "join", &["join", "cp-2"], &mut mismatches).await;

    let new = f.sim.cluster.add_maintenance_node().await.unwrap();
    let fingerprint = new.maintenance_fingerprint.clone().unwrap();
    talos_test_support::cli::run(&tc, &["config", "add-endpoint", &new.api])
        .await
        .ok();
    let old = follower(&f).await;
    let controlplane = f.sim.dir.path().join("controlplane.yaml");
    let migrate = [
        "migrate",
        "--from",
        old.as_str(),
        "--to",
        new.api.as_str(),
        "--config",
        controlplane.to_str().unwrap(),
        "--cert-fingerprint",
        fingerprint.as_str(),
    ];
    // The plan would apply the configuration again: plan and run once.
    check(&f, "migrate", &migrate, &mut mismatches).await;

    // The old node is gone: ask the survivors which of them leads.
    let mut target = None;
    for ip in (1..=3).map(|i| f.sim.ip(i)).filter(|ip| *ip != old) {
        let status = f.sim.admin().node(ip.as_str()).etcd_status().await.unwrap();
        if !status.is_leader() {
            target = Some(ip);
        }
    }
    let target = target.expect("a survivor that does not lead");
    check(&f, "retire", &["retire", &target], &mut mismatches).await;
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// An upgrade of the three nodes to 1.14.0, on a cluster of its own (every
/// node runs the new release afterwards).
#[tokio::test]
async fn upgrade_plan_and_result_match_the_golden_files() {
    let f = Fixture::start(3).await;
    let mut mismatches = Vec::new();
    check(
        &f,
        "upgrade",
        &["upgrade", "--image", "ghcr.io/siderolabs/installer:v1.14.0"],
        &mut mismatches,
    )
    .await;
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// The backup operations: a drill of an encrypted backup with a kit in a
/// directory store, then a restore of it onto the node after its etcd data
/// was wiped (a cluster that lost quorum).
#[tokio::test]
async fn drill_and_restore_plans_and_results_match_the_golden_files() {
    use std::time::Duration;
    use talos_client::backup::Identity;
    use talos_client::client::ResetRequest;
    use talos_test_support::sim::wait_for;

    let f = Fixture::start(1).await;
    f.sim
        .cluster
        .fill("/registry/golden/", 12, 64)
        .await
        .unwrap();
    let identity = Identity::generate();
    let key_file = f.state.path().join("key.txt");
    std::fs::write(&key_file, identity.to_secret_text()).unwrap();
    let recipient = identity.recipient().to_string();
    let store = f.state.path().join("store");
    let store = store.to_str().unwrap();
    let key = key_file.to_str().unwrap();
    let stored = f
        .ops(&[
            "--yes",
            "snapshot",
            "--to",
            store,
            "--encrypt",
            &recipient,
            "--kit",
        ])
        .await
        .ok()
        .json();
    assert_eq!(stored["state"], "succeeded", "{stored}");
    let mut mismatches = Vec::new();
    check(
        &f,
        "drill",
        &["drill", "--from", store, "-i", key],
        &mut mismatches,
    )
    .await;

    let target = f.sim.ip(1);
    let admin = f.sim.admin();
    let booted = f.sim.cluster.node(&target).unwrap().boot_id();
    admin
        .node(target.as_str())
        .reset(
            ResetRequest::default()
                .with_graceful(false)
                .with_reboot(true)
                .with_system_labels_to_wipe(vec!["EPHEMERAL".into()]),
        )
        .await
        .unwrap();
    wait_for(
        "the node back without etcd",
        Duration::from_secs(60),
        || async {
            // Back from the reset's reboot (a new boot), not merely slow to
            // answer before it.
            if f.sim.cluster.node(&target)?.boot_id() == booted {
                return None;
            }
            let node = admin.node(target.as_str());
            node.version().await.ok()?;
            node.etcd_status().await.is_err().then_some(())
        },
    )
    .await;
    check(
        &f,
        "restore",
        &["restore", "--from", store, "-i", key, &target],
        &mut mismatches,
    )
    .await;
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// An apply: `-n NODE` goes before `ops`.
async fn check_apply(f: &Fixture, args: &[&str], mismatches: &mut Vec<String>) {
    let (nodes, rest) = args.split_at(2);
    let run = |extra: &'static str| {
        let mut argv = vec!["-o", "json"];
        argv.extend_from_slice(nodes);
        argv.extend([
            "ops",
            "--without-cluster-lock",
            "--state-dir",
            f.state.path().to_str().unwrap(),
            extra,
        ]);
        argv.extend_from_slice(rest);
        argv.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let tc = f.talosconfig();
    let plan_argv = run("--plan");
    let plan_argv: Vec<&str> = plan_argv.iter().map(String::as_str).collect();
    let plan = talos_test_support::cli::run(&tc, &plan_argv).await.ok();
    let run_argv = run("--yes");
    let run_argv: Vec<&str> = run_argv.iter().map(String::as_str).collect();
    let done = talos_test_support::cli::run(&tc, &run_argv).await.ok();
    let record = done.json();
    assert_eq!(record["state"], "succeeded", "{record}");
    let id = record["id"].as_str().unwrap();
    let shown = talos_test_support::cli::run(
        &tc,
        &[
            "ops",
            "--without-cluster-lock",
            "--state-dir",
            f.state.path().to_str().unwrap(),
            "show",
            id,
        ],
    )
    .await
    .ok();
    for (kind, text, table) in [
        ("plan.table", &plan.stderr, true),
        ("plan.json", &plan.stdout, false),
        ("result.json", &done.stdout, false),
        ("result.table", &shown.stdout, true),
    ] {
        compare(
            &format!("apply-{kind}"),
            &normalise(text, table),
            mismatches,
        );
    }
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/ops")
}

/// Replaces run-dependent values with placeholders.
fn normalise(text: &str, table: bool) -> String {
    let rules = [
        (r"/tmp/[^\s\x22,;)]+", "<PATH>"),
        // Boot ids.
        (
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "<UUID>",
        ),
        (r"\b[0-9a-f]{64}\b", "<SHA256>"),
        // Certificates, keys (the simulator's, in the dry run's diff) and
        // SPKI fingerprints: generated for each run.
        (r"[A-Za-z0-9+/]{40,}={0,2}", "<BASE64>"),
        (r"\d{8}T\d{6}-[0-9a-f]{6}", "<OP>"),
        // Backup keys' stamps, short hashes and stored sizes (age's and
        // zstd's framing of a snapshot whose layout may vary).
        (r"\d{8}T\d{6}\.\d{3}Z", "<STAMP>"),
        (r"sha256 [0-9a-f]{12}\b", "sha256 <SHORT>"),
        (r"\b\d+ bytes", "<BYTES>"),
        (r"\d{4}-\d{2}-\d{2}T[0-9:.]+(Z|[+-]\d{2}:\d{2})", "<TIME>"),
        // Numbers before member ids: a gap such as 2.1234567890123456 has
        // sixteen fraction digits, which would otherwise read as a member id.
        (r"\b\d+(\.\d+)? ?(ms|s)\b", "<DUR>"),
        // JSON numbers (durations, gaps, timeouts).
        (r"(: )-?\d+(\.\d+)?(,?)$", "${1}<N>${3}"),
        (r"\b[0-9a-f]{16}\b", "<MEMBER>"),
        (r"127(\.\d+){3}", "<IP>"),
        (r"<IP>:\d+", "<IP>:<PORT>"),
        (r"\bcp-\d+\b", "cp-<N>"),
        (r"attempt \d+", "attempt <N>"),
        // Database sizes and shares in use (a defragmentation's).
        (r"\b\d+(\.\d+)? (KiB|MiB)", "<SIZE>"),
        (r"\b\d+% ", "<PCT> "),
        (r"passed \d+ times", "passed <N> times"),
        // Raft positions (an upgrade's gate).
        (r"raft index \d+ of \d+", "raft index <N> of <N>"),
    ];
    let mut out = String::new();
    for line in text.lines() {
        let mut line = line.to_string();
        for (pattern, with) in rules {
            line = Regex::new(pattern)
                .unwrap()
                .replace_all(&line, with)
                .into_owned();
        }
        if table {
            line = line.split_whitespace().collect::<Vec<_>>().join(" ");
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[test]
fn a_float_with_sixteen_fraction_digits_is_a_number_not_a_member_id() {
    let json =
        "  \"leave_to_reset_gap_ms\": 2.1234567890123456,\n  \"member_id\": \"0123456789abcdef\"";
    assert_eq!(
        normalise(json, false),
        "  \"leave_to_reset_gap_ms\": <N>,\n  \"member_id\": \"<MEMBER>\"\n"
    );
    assert_eq!(normalise("gap 3.1234567890123456 ms", true), "gap <DUR>\n");
}
