//! talos-opsd as a real process against talos-sim (real etcd): the socket's
//! mode, a retire through the API with every step watched in order, one
//! operation per cluster, cancel refusals, scheduled snapshots with
//! retention and the catalogue, metrics, and configuration errors.

mod daemon;

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use daemon::{Daemon, cluster_toml, free_port};
use talos_opsd::proto::operation_event::Event as Ev;
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::{SimCluster, wait_for};

fn retire(node: &str) -> proto::StartOperationRequest {
    proto::StartOperationRequest {
        cluster: "a".into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(Kind::Retire(proto::RetireParams {
            node: node.into(),
            ..Default::default()
        })),
    }
}

fn snapshot(cluster: &str) -> proto::StartOperationRequest {
    proto::StartOperationRequest {
        cluster: cluster.into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(Kind::Snapshot(proto::SnapshotParams { keep: 0 })),
    }
}

/// Every event of operation `id` until its end.
pub async fn watch_all(
    client: &mut proto::opsd_client::OpsdClient<tonic::transport::Channel>,
    id: &str,
) -> Vec<Ev> {
    let mut stream = client
        .watch_operation(proto::WatchOperationRequest { id: id.into() })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(event) = stream.message().await.unwrap() {
        assert_eq!(event.operation_id, id);
        events.push(event.event.unwrap());
    }
    events
}

#[tokio::test]
async fn a_retire_through_the_api_is_watched_step_by_step() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let port = free_port();
    let d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &tc, ""),
        &[],
        &["--metrics-addr", &format!("127.0.0.1:{port}")],
    )
    .await;
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");

    let mut client = d.client().await;
    let leader = sim.leader().await;
    let started = client
        .start_operation(retire(&leader))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(started.kind, "retire");
    assert_eq!(started.cluster, "a");
    let events = watch_all(&mut client, &started.id).await;
    let mut seen = Vec::new();
    for event in &events {
        match event {
            Ev::StepStarted(s) => seen.push(format!("started {}", s.name)),
            Ev::StepEnded(s) => seen.push(format!("{} {}", s.state, s.name)),
            Ev::Finished(f) => seen.push(format!("finished {} {}", f.state, f.error)),
        }
    }
    let names = [
        "snapshot",
        "check",
        "forfeit",
        "leave",
        "reset",
        "confirm",
        "wait-silent",
    ];
    let mut want: Vec<String> = names
        .iter()
        .flat_map(|n| [format!("started {n}"), format!("done {n}")])
        .collect();
    want.push("finished succeeded ".into());
    assert_eq!(seen, want, "{}", d.log_text());

    // Ended like the CLI's retire: journaled, the gap recorded, the node gone.
    let op = client
        .get_operation(proto::GetOperationRequest {
            id: started.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(op.state, "succeeded");
    let facts: serde_json::Value = serde_json::from_str(&op.facts_json).unwrap();
    assert!(facts["leave_to_reset_gap_ms"].as_f64().unwrap() > 0.0);
    let survivor = (1..=3).map(|i| sim.ip(i)).find(|ip| *ip != leader).unwrap();
    let members = sim
        .admin()
        .node(survivor.as_str())
        .etcd_member_list(false)
        .await
        .unwrap();
    assert_eq!(members.len(), 2);
    assert!(sim.admin().node(leader.as_str()).version().await.is_err());
    // A second watch of the ended operation replays it from the journal.
    assert_eq!(
        watch_all(&mut client, &started.id).await.len(),
        events.len()
    );
    // A snapshot of what is left, catalogued; the metrics agree.
    let snap = client
        .start_operation(snapshot("a"))
        .await
        .unwrap()
        .into_inner();
    watch_all(&mut client, &snap.id).await;
    let catalogue = client
        .list_snapshots(proto::ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .snapshots;
    assert_eq!(catalogue.len(), 1, "{catalogue:?}");
    assert_eq!(catalogue[0].operation_id, snap.id);
    let metrics = scrape(port).await;
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(series))
            .unwrap_or_else(|| panic!("no {series} in {metrics}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    for kind in ["retire", "snapshot"] {
        let series = format!(
            "talos_opsd_operations_total{{cluster=\"a\",kind=\"{kind}\",result=\"succeeded\"}}"
        );
        assert_eq!(value(&series), 1.0);
    }
    let gap = value("talos_opsd_leave_to_reset_gap_seconds{cluster=\"a\"}");
    let want = facts["leave_to_reset_gap_ms"].as_f64().unwrap() / 1000.0;
    assert!((gap - want).abs() < 1e-9, "{gap} vs {want}");
    assert_eq!(
        value("talos_opsd_snapshot_last_size_bytes{cluster=\"a\"}"),
        catalogue[0].size as f64
    );
    assert!(value("talos_opsd_snapshot_last_success_timestamp_seconds{cluster=\"a\"}") > 1.7e9);
    assert!(value("talos_opsd_snapshot_last_duration_seconds{cluster=\"a\"}") > 0.0);
    // Audited with the peer's credentials.
    let log = d.log_text();
    let uid = unsafe { libc::geteuid() };
    assert!(
        log.contains(&format!("uid={uid}")) && log.contains("start retire"),
        "{log}"
    );
}

#[tokio::test]
async fn one_operation_per_cluster_and_clusters_in_parallel() {
    let a = SimCluster::start(3).await;
    let b = SimCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let config = cluster_toml("a", &a.dir.path().join("talosconfig"), "")
        + &cluster_toml("b", &b.dir.path().join("talosconfig"), "");
    let d = Daemon::start(dir.path(), &config).await;
    let mut client = d.client().await;
    // A join that cannot finish holds cluster a while it waits.
    let join = client
        .start_operation(proto::StartOperationRequest {
            cluster: "a".into(),
            plan_fingerprint: String::new(),
            without_cluster_lock: true,
            kind: Some(Kind::Join(proto::JoinParams {
                node: "cp-9".into(),
                timeout_s: 120,
                maintenance: None,
            })),
        })
        .await
        .unwrap()
        .into_inner();
    let refused = client.start_operation(snapshot("a")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Aborted, "{refused:?}");
    assert!(
        refused.message().contains(&join.id),
        "{}",
        refused.message()
    );
    // Cluster b is not held by it.
    let other = client
        .start_operation(snapshot("b"))
        .await
        .unwrap()
        .into_inner();
    let events = watch_all(&mut client, &other.id).await;
    assert!(
        matches!(events.last(), Some(Ev::Finished(f)) if f.state == "succeeded"),
        "{events:?}"
    );
    let listed = client
        .list_operations(proto::ListOperationsRequest {
            cluster: "b".into(),
            state: "succeeded".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.operations.len(), 1);
    assert_eq!(listed.operations[0].id, other.id);
}

/// Through the daemon too, a label to wipe that names no volume of the node
/// is refused at plan and at start, and nothing changes.
#[tokio::test]
async fn an_unknown_wipe_label_is_refused_before_anything_changes() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    let mut client = d.client().await;
    let members = || async {
        sim.admin()
            .node(sim.ip(1).as_str())
            .etcd_member_list(false)
            .await
            .unwrap()
            .len()
    };
    let mut request = retire(&sim.ip(3));
    if let Some(Kind::Retire(p)) = request.kind.as_mut() {
        p.wipe = vec!["BOGUS".into()];
    }
    let plan = client.plan_operation(request.clone()).await.unwrap_err();
    assert!(
        plan.message().contains("no located volume BOGUS"),
        "{plan:?}"
    );
    let start = client.start_operation(request).await.unwrap_err();
    assert!(
        start.message().contains("no located volume BOGUS"),
        "{start:?}"
    );
    assert_eq!(members().await, 3);
    assert!(sim.admin().node(sim.ip(3).as_str()).version().await.is_ok());
}

#[tokio::test]
async fn a_cancel_after_a_destructive_step_is_refused_with_the_reason() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    let mut client = d.client().await;
    let op = client
        .start_operation(retire(&sim.ip(3)))
        .await
        .unwrap()
        .into_inner();
    let mut stream = client
        .watch_operation(proto::WatchOperationRequest { id: op.id.clone() })
        .await
        .unwrap()
        .into_inner();
    // Once the forfeit (the first destructive step) starts, no cancel.
    loop {
        let event = stream.message().await.unwrap().expect("the forfeit starts");
        if matches!(&event.event, Some(Ev::StepStarted(s)) if s.destructive) {
            break;
        }
    }
    let refused = client
        .cancel_operation(proto::CancelOperationRequest { id: op.id.clone() })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("destructive step has started"),
        "{}",
        refused.message()
    );
    let events = watch_all(&mut client, &op.id).await;
    assert!(
        matches!(events.last(), Some(Ev::Finished(f)) if f.state == "succeeded"),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_cancel_before_any_destructive_step_changes_nothing() {
    let sim = SimCluster::start(3).await;
    // Enough data that the snapshot step is still running when we cancel.
    sim.cluster
        .fill("/registry/test/", 400, 4096)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    let mut client = d.client().await;
    let before = sim
        .admin()
        .node(sim.ip(1).as_str())
        .etcd_member_list(false)
        .await
        .unwrap()
        .len();
    let op = client
        .start_operation(retire(&sim.ip(3)))
        .await
        .unwrap()
        .into_inner();
    let mut stream = client
        .watch_operation(proto::WatchOperationRequest { id: op.id.clone() })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(
        matches!(&first.event, Some(Ev::StepStarted(s)) if s.name == "snapshot"),
        "{first:?}"
    );
    client
        .cancel_operation(proto::CancelOperationRequest { id: op.id.clone() })
        .await
        .unwrap();
    let events = watch_all(&mut client, &op.id).await;
    let Some(Ev::Finished(end)) = events.last() else {
        panic!("{events:?}")
    };
    assert_eq!(end.state, "cancelled", "{end:?}");
    assert!(end.error.contains("before step \"check\""), "{end:?}");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Ev::StepStarted(s) if s.destructive)),
        "{events:?}"
    );
    // Nothing changed: every member is still there and the node answers.
    let members = sim
        .admin()
        .node(sim.ip(1).as_str())
        .etcd_member_list(false)
        .await
        .unwrap();
    assert_eq!(members.len(), before);
    sim.admin()
        .node(sim.ip(3).as_str())
        .version()
        .await
        .unwrap();
    // A cancelled operation does not block the cluster.
    let next = client
        .start_operation(snapshot("a"))
        .await
        .unwrap()
        .into_inner();
    let events = watch_all(&mut client, &next.id).await;
    assert!(
        matches!(events.last(), Some(Ev::Finished(f)) if f.state == "succeeded"),
        "{events:?}"
    );
}

#[tokio::test]
async fn scheduled_snapshots_are_catalogued_and_retention_keeps_n() {
    let sim = SimCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let snaps = dir.path().join("snaps");
    let tc = sim.dir.path().join("talosconfig");
    let port = free_port();
    let extra = format!("[cluster.snapshots]\ninterval = \"1s\"\nkeep = 2\ndir = {snaps:?}\n");
    let d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &tc, &extra),
        &[],
        &["--metrics-addr", &format!("127.0.0.1:{port}")],
    )
    .await;
    let client = d.client().await;
    // Wait until at least three scheduled snapshots succeeded.
    let succeeded = daemon::until_succeeded(
        &client,
        "a",
        "three scheduled snapshots",
        Duration::from_secs(90),
        |ops| ops.len() >= 3,
    )
    .await;
    assert!(succeeded.iter().all(|o| o.kind == "snapshot"));
    let metrics = scrape(port).await;
    // Stop the schedule: a snapshot parked by the SIGTERM is finished by
    // the next start, whose schedule is too slow to tick.
    let mut d = d;
    assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));
    d.rewrite(&cluster_toml(
        "a",
        &tc,
        &format!("[cluster.snapshots]\ninterval = \"1h\"\nkeep = 2\ndir = {snaps:?}\n"),
    ));
    d.spawn().await;
    let mut client = d.client().await;
    wait_for("no running operation", Duration::from_secs(60), || {
        let mut client = client.clone();
        async move {
            let running = client
                .list_operations(proto::ListOperationsRequest {
                    cluster: "a".into(),
                    state: "running".into(),
                })
                .await
                .ok()?
                .into_inner()
                .operations;
            running.is_empty().then_some(())
        }
    })
    .await;
    let catalogue = client
        .list_snapshots(proto::ListSnapshotsRequest {
            cluster: "a".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .snapshots;
    assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));
    let mut files: Vec<_> = std::fs::read_dir(&snaps)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "db"))
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    let mut catalogued: Vec<_> = catalogue.iter().map(|e| e.path.clone()).collect();
    catalogued.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    assert_eq!(catalogued, files);
    for entry in &catalogue {
        let report =
            talos_client::snapshot::verify_file(std::path::Path::new(&entry.path)).unwrap();
        assert_eq!(report.sha256, entry.sha256);
        assert_eq!(report.size, entry.size);
        assert_eq!(report.status.revision, entry.revision);
        assert_eq!(entry.node, sim.ip(1));
    }
    // The metrics carry the series with the catalogue's values.
    let ok = succeeded.len();
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("talos_opsd_operations_total{") && l.contains("result=\"succeeded\"")
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    let value: usize = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(value >= ok, "{line} vs {ok}");
}

/// GET /metrics over plain HTTP.
async fn scrape(port: u16) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    body
}

#[tokio::test]
async fn a_malformed_config_is_refused_with_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "state_dir = \"/tmp/x\"\n\n[[cluster]]\nname = \"a\"\ntalosconfig = \"/nonexistent\"\n\n[cluster.snapshots]\ninterval = \"every hour\"\n",
    )
    .unwrap();
    for args in [
        vec!["check-config"],
        vec!["--socket", "/nonexistent/s.sock"],
    ] {
        let out = std::process::Command::new(talos_test_support::cli::cargo_bin("talos-opsd"))
            .arg("--config")
            .arg(&path)
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        let want = format!("{}:8: cluster[0].snapshots.interval:", path.display());
        assert!(stderr.contains(&want), "want {want:?} in {stderr}");
    }
    let sim = SimCluster::start(1).await;
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        cluster_toml("a", &sim.dir.path().join("talosconfig"), ""),
    )
    .unwrap();
    let out = std::process::Command::new(talos_test_support::cli::cargo_bin("talos-opsd"))
        .arg("--config")
        .arg(&good)
        .arg("check-config")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok (1 cluster)"));
}

/// PlanOperation changes nothing and holds nothing; a start carrying the
/// fingerprint of a plan made before the cluster changed is refused, and
/// one carrying the current plan's runs.
#[tokio::test]
async fn a_start_is_refused_when_the_cluster_no_longer_matches_its_plan() {
    let sim = SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    let mut client = d.client().await;
    let leader = sim.leader().await;
    let follower = (1..=3).map(|i| sim.ip(i)).find(|ip| *ip != leader).unwrap();
    let request = retire(&follower);
    let plan = client
        .plan_operation(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plan.kind, "retire");
    assert_eq!(plan.fingerprint.len(), 64, "{plan:?}");
    let names: Vec<_> = plan.steps.iter().map(|s| s.name.as_str()).collect();
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
    // The same cluster plans the same.
    let again = client
        .plan_operation(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.fingerprint, plan.fingerprint);

    // Leadership moves: the plan that was shown no longer holds.
    sim.admin()
        .node(leader.as_str())
        .etcd_forfeit_leadership()
        .await
        .unwrap();
    wait_for("a new leader", Duration::from_secs(30), || async {
        (sim.leader().await != leader).then_some(())
    })
    .await;
    let mut stale = request.clone();
    stale.plan_fingerprint = plan.fingerprint.clone();
    let refused = client.start_operation(stale).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("no longer matches the plan"),
        "{}",
        refused.message()
    );
    let journal = talos_client::ops::Journal::open(&dir.path().join("state")).unwrap();
    assert!(journal.list(None).unwrap().is_empty(), "nothing journaled");
    assert_eq!(
        sim.admin()
            .node(sim.ip(1))
            .etcd_member_list(false)
            .await
            .unwrap()
            .len(),
        3
    );
}
