//! The metrics listener: `HEAD /metrics` answers as `GET` does without the
//! body; the series are restored from the journal when the daemon starts;
//! a resumed snapshot reports the times of its own snapshot step.

mod daemon;

use daemon::{Daemon, cluster_toml, free_port};
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::SimCluster;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// One raw HTTP request to the metrics port; the whole answer.
async fn http(port: u16, request: &str) -> String {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    answer
}

fn content_length(answer: &str) -> usize {
    answer
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no content-length in {answer:?}"))
}

#[tokio::test]
async fn head_on_metrics_answers_like_get_without_a_body() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _d = Daemon::start_with(dir.path(), "", &[], &["--metrics-addr", &addr]).await;
    let get = http(port, "GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(get.starts_with("HTTP/1.1 200"), "{get}");
    let head = http(port, "HEAD /metrics HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert_eq!(content_length(&head), content_length(&get), "{head}\n{get}");
    let (_, body) = head.split_once("\r\n\r\n").unwrap();
    assert_eq!(body, "", "HEAD has no body");
    let other = http(port, "HEAD /other HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    assert!(other.ends_with("\r\n\r\n"), "{other}");
}

fn snapshot() -> proto::StartOperationRequest {
    proto::StartOperationRequest {
        cluster: "a".into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(Kind::Snapshot(proto::SnapshotParams { keep: 0 })),
    }
}

/// The body of `GET /metrics`, once the listener answers: the daemon
/// binds it after its socket, which the test takes as "started", so on a
/// loaded machine a scrape right after a restart met a refused connection.
async fn scrape(port: u16) -> String {
    let answer = talos_test_support::sim::wait_for(
        "the metrics listener",
        std::time::Duration::from_secs(30),
        || daemon::scrape(port),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// The value of the series `name{cluster="a"}`.
fn value(metrics: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{cluster=\"a\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in {metrics}"))
}

fn unix(rfc3339: &str) -> f64 {
    OffsetDateTime::parse(rfc3339, &Rfc3339)
        .unwrap()
        .unix_timestamp_nanos() as f64
        / 1e9
}

/// A daemon with cluster `a` on `sim` and metrics on a free port.
async fn daemon(dir: &std::path::Path, sim: &SimCluster, crash: &str) -> (Daemon, u16) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let tc = sim.dir.path().join("talosconfig");
    let env: &[(&str, &str)] = if crash.is_empty() {
        &[]
    } else {
        &[("TALOS_OPSD_TEST_CRASH", crash)]
    };
    let d = Daemon::start_with(
        dir,
        &cluster_toml("a", &tc, ""),
        env,
        &["--metrics-addr", &addr],
    )
    .await;
    (d, port)
}

/// After a restart `/metrics` shows what it showed before it: counters,
/// histograms and last-success gauges come back from the journal.
#[tokio::test]
async fn metrics_are_restored_from_the_journal_at_start() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let (mut d, port) = daemon(dir.path(), &sim, "").await;
    let mut client = d.client().await;
    for _ in 0..2 {
        let op = client
            .start_operation(snapshot())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(d.until_ended(&op.id).await.state, "succeeded");
    }
    let before = scrape(port).await;
    assert!(
        value(&before, "talos_opsd_snapshot_last_size_bytes") > 0.0,
        "{before}"
    );
    assert!(
        before.contains(
            "talos_opsd_operations_total{cluster=\"a\",kind=\"snapshot\",result=\"succeeded\"} 2"
        ),
        "{before}"
    );
    assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));
    d.spawn().await;
    let after = scrape(port).await;
    assert_eq!(after, before, "the series after the restart");
}

/// A snapshot interrupted after its snapshot step and resumed (only its
/// retention left) reports its snapshot step's end and duration, not the
/// resume's.
#[tokio::test]
async fn a_resumed_snapshot_reports_its_own_snapshot_step() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let (mut d, port) = daemon(dir.path(), &sim, "started:retention").await;
    let mut client = d.client().await;
    let _ = client.start_operation(snapshot()).await;
    assert!(!d.wait_exit().await.success());
    let restarted = OffsetDateTime::now_utc().unix_timestamp_nanos() as f64 / 1e9;
    d.set_env(&[]);
    d.spawn().await;
    let journal = talos_client::ops::Journal::open(&dir.path().join("state")).unwrap();
    let id = journal.list(None).unwrap().remove(0).id;
    drop(journal);
    let op = d.until_ended(&id).await;
    assert_eq!(op.state, "succeeded", "{op:?}");
    let step = op.steps.iter().find(|s| s.name == "snapshot").unwrap();
    let metrics = scrape(port).await;
    let at = value(
        &metrics,
        "talos_opsd_snapshot_last_success_timestamp_seconds",
    );
    let took = value(&metrics, "talos_opsd_snapshot_last_duration_seconds");
    assert!(
        at < restarted,
        "taken before the restart: {at} vs {restarted}"
    );
    assert!((at - unix(&step.finished)).abs() < 1e-3, "{at} vs {step:?}");
    assert!(
        (took - step.duration_ms as f64 / 1000.0).abs() < 1e-9,
        "{took} vs {step:?}"
    );
}

/// A snapshot step in flight at a crash is run again on resume: its
/// journaled start and duration are those of the new attempt (here the
/// interrupted attempt is made to look an hour old, as after a long outage),
/// and its detail names the interrupted one.
#[tokio::test]
async fn a_step_run_again_on_resume_has_its_own_start_and_duration() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let (mut d, _port) = daemon(dir.path(), &sim, "answered:snapshot").await;
    let mut client = d.client().await;
    let _ = client.start_operation(snapshot()).await;
    assert!(!d.wait_exit().await.success());
    let state = dir.path().join("state");
    let id = talos_client::ops::Journal::open(&state)
        .unwrap()
        .list(None)
        .unwrap()
        .remove(0)
        .id;
    let an_hour_ago = (OffsetDateTime::now_utc() - time::Duration::hours(1))
        .format(&Rfc3339)
        .unwrap();
    let db = rusqlite::Connection::open(state.join("journal.sqlite")).unwrap();
    let changed = db
        .execute(
            "UPDATE steps SET started = ?2 WHERE op_id = ?1 AND name = 'snapshot' AND state = 'running'",
            [&id, &an_hour_ago],
        )
        .unwrap();
    assert_eq!(changed, 1, "the snapshot step is in flight");
    drop(db);
    let restarted = OffsetDateTime::now_utc().unix_timestamp_nanos() as f64 / 1e9;
    d.set_env(&[]);
    d.spawn().await;
    let op = d.until_ended(&id).await;
    assert_eq!(op.state, "succeeded", "{op:?}");
    let step = op.steps.iter().find(|s| s.name == "snapshot").unwrap();
    let (started, finished) = (unix(&step.started), unix(&step.finished));
    assert!(started >= restarted, "its own start: {step:?}");
    let wall_ms = (finished - started) * 1000.0;
    assert!(
        (wall_ms - step.duration_ms as f64).abs() < 1000.0,
        "start, end and duration agree: {step:?}"
    );
    assert!(
        step.detail.contains("run again on resume") && step.detail.contains(&an_hour_ago),
        "{step:?}"
    );
}
