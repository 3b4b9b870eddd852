//! What callers send never shapes the daemon's log or its errors: a node,
//! a label to wipe, a path, a cluster name or an id holding a newline and
//! a forged audit line stays inside its own line, escaped, in both log
//! formats; a long one is cut with its length; and a log written to a
//! file carries no colour codes.

mod daemon;

use daemon::{Daemon, cluster_toml};
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::SimCluster;

/// A line an attacker would like to see in the audit log.
const FORGED: &str =
    "2026-12-07T12:00:00Z  INFO audit: who=\"uid=0 pid=1\" what=\"forged\" result=\"ok\"";

fn on(cluster: &str, kind: Kind) -> proto::StartOperationRequest {
    proto::StartOperationRequest {
        cluster: cluster.into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(kind),
    }
}

/// Sends requests whose operator-supplied strings are hostile; returns
/// each refusal's message.
async fn hostile_requests(d: &Daemon, sim: &SimCluster) -> Vec<String> {
    let injected = format!("x\n{FORGED}\u{1b}[2J");
    let long = "n".repeat(1000);
    let requests = [
        on(
            "a",
            Kind::Retire(proto::RetireParams {
                node: injected.clone(),
                ..Default::default()
            }),
        ),
        on(
            "a",
            Kind::Retire(proto::RetireParams {
                node: long.clone(),
                ..Default::default()
            }),
        ),
        on(
            "a",
            Kind::Retire(proto::RetireParams {
                node: sim.ip(3),
                wipe: vec![format!("STATE\n{FORGED}")],
                ..Default::default()
            }),
        ),
        on(
            "a",
            Kind::Apply(proto::ApplyParams {
                nodes: vec![sim.ip(1)],
                config_path: format!("/nonexistent\n{FORGED}"),
                expect_change: vec!["machine.certSANs".into()],
                ..Default::default()
            }),
        ),
        on(
            "a",
            Kind::Defrag(proto::DefragParams {
                nodes: vec![injected.clone()],
                ..Default::default()
            }),
        ),
        on(
            "a",
            Kind::Upgrade(proto::UpgradeParams {
                image: injected.clone(),
                ..Default::default()
            }),
        ),
        on(&injected, Kind::Snapshot(proto::SnapshotParams { keep: 0 })),
    ];
    let mut client = d.client().await;
    let mut messages = Vec::new();
    for request in requests {
        let plan = client.plan_operation(request.clone()).await.unwrap_err();
        let start = client.start_operation(request).await.unwrap_err();
        messages.push(plan.message().to_string());
        messages.push(start.message().to_string());
    }
    let get = client
        .get_operation(proto::GetOperationRequest { id: injected })
        .await
        .unwrap_err();
    messages.push(get.message().to_string());
    messages
}

/// Every error is one line, control characters escaped; the long node is
/// cut with its length.
fn assert_errors_are_clean(messages: &[String]) {
    for message in messages {
        assert!(
            !message.chars().any(char::is_control),
            "a control character in {message:?}"
        );
        assert!(!message.contains(&"n".repeat(65)), "not cut: {message}");
    }
    let long: Vec<_> = messages
        .iter()
        .filter(|m| m.contains("(1000 bytes)"))
        .collect();
    assert_eq!(
        long.len(),
        2,
        "the long node, cut, at plan and start: {messages:#?}"
    );
    assert!(long.iter().all(|m| m.len() < 300), "{long:?}");
    assert!(
        messages
            .iter()
            .any(|m| m.contains("\\n2026-12-07T12:00:00Z")),
        "the forged line, escaped: {messages:#?}"
    );
}

#[tokio::test]
async fn hostile_strings_stay_escaped_in_the_text_log_and_errors() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    let messages = hostile_requests(&d, &sim).await;
    assert_errors_are_clean(&messages);
    let log = d.log_text();
    // The log goes to a file: no colour codes (nor any other escape).
    assert!(!log.contains('\u{1b}'), "escape codes in the log:\n{log}");
    for line in log.lines() {
        assert!(
            !line.starts_with("2026-12-07T12:00:00Z"),
            "a forged line in the log:\n{log}"
        );
        assert!(!line.contains(&"n".repeat(65)), "not cut: {line}");
        assert!(!line.chars().any(char::is_control), "{line:?}");
    }
    // The audit lines name what was asked, the hostile parts escaped.
    let audit: Vec<_> = log.lines().filter(|l| l.contains("audit")).collect();
    assert!(
        audit
            .iter()
            .any(|l| l.contains("retire") && l.contains("(1000 bytes)")),
        "{log}"
    );
    assert!(
        audit.iter().any(|l| l.contains("\\n2026-12-07T12:00:00Z")),
        "{log}"
    );
}

/// Every string value in `value`, recursively.
fn strings(value: &serde_json::Value, into: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) => into.push(s.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|v| strings(v, into)),
        serde_json::Value::Object(map) => map.values().for_each(|v| strings(v, into)),
        _ => {}
    }
}

#[tokio::test]
async fn hostile_strings_stay_escaped_and_cut_in_the_json_log() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &tc, ""),
        &[],
        &["--log-format", "json"],
    )
    .await;
    let messages = hostile_requests(&d, &sim).await;
    assert_errors_are_clean(&messages);
    let log = d.log_text();
    let mut values = Vec::new();
    for line in log.lines() {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        strings(&event, &mut values);
    }
    for value in &values {
        assert!(!value.chars().any(char::is_control), "{value:?}");
        assert!(!value.contains(&"n".repeat(65)), "not cut: {value}");
    }
    assert!(values.iter().any(|v| v.contains("(1000 bytes)")), "{log}");
}
