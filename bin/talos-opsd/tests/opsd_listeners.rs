//! Neither listener can be starved or made to grow without bound: idle
//! connections do not keep scrapes out of the metrics port; connections
//! that dribble a byte a second do not keep API calls out of the socket;
//! a request with hundreds of thousands of list entries is refused without
//! growing the daemon; and a peer that opens connection after connection
//! writes a bounded number of audit lines.

mod daemon;

use std::time::Duration;

use daemon::{Daemon, free_port, rss_kib, scrape};
use talos_opsd::proto::{self, start_operation_request::Kind};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[tokio::test]
async fn idle_connections_do_not_starve_scrapes() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let d = Daemon::start_with(
        dir.path(),
        "",
        &[],
        &["--metrics-addr", &format!("127.0.0.1:{port}")],
    )
    .await;
    d.until_logged("metrics served on /metrics").await;
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap(),
        );
    }
    for i in 0..5 {
        let answer = tokio::time::timeout(Duration::from_secs(3), scrape(port))
            .await
            .unwrap_or_else(|_| panic!("scrape {i} not answered within 3 s"));
        let answer = answer.expect("an answer");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    drop(idle);
    drop(d);
}

/// Opens a Unix connection to `socket` that sends the HTTP/2 preface one
/// byte a second; counts itself in `connected` once connected.
fn dribbler(
    socket: std::path::PathBuf,
    connected: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Ok(mut conn) = tokio::net::UnixStream::connect(&socket).await else {
            return;
        };
        connected.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        for byte in b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".iter().cycle() {
            tick.tick().await;
            if conn.write_all(&[*byte]).await.is_err() {
                return;
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_writers_do_not_make_calls_miss_their_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), "").await;
    let connected = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let slow: Vec<_> = (0..300)
        .map(|_| dribbler(d.socket.clone(), connected.clone()))
        .collect();
    daemon::wait_for_count("the slow writers connected", &connected, 300).await;
    // Each call on a new connection, within a 2 s deadline, a second
    // apart: past the time the slow writers have to send a request's head.
    for i in 0..8 {
        let socket = d.socket.clone();
        let listed = tokio::time::timeout(Duration::from_secs(2), async move {
            daemon::connect_unix(&socket)
                .await
                .list_operations(proto::ListOperationsRequest::default())
                .await
        })
        .await;
        assert!(
            matches!(listed, Ok(Ok(_))),
            "call {i} missed its 2 s deadline: {listed:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    slow.iter().for_each(|t| t.abort());
    assert!(
        d.log_text().contains("connection closed"),
        "{}",
        d.log_text()
    );
}

#[tokio::test]
async fn a_request_with_350000_labels_is_refused_without_growing_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), "").await;
    let mut client = d.client().await;
    let before = rss_kib(d.pid());
    let request = |labels: usize| proto::StartOperationRequest {
        cluster: "a".into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(Kind::Retire(proto::RetireParams {
            node: "cp-1".into(),
            wipe: vec!["STATE1".to_string(); labels],
            ..Default::default()
        })),
    };
    let mut refusals = Vec::new();
    for _ in 0..3 {
        refusals.push(client.start_operation(request(350_000)).await.unwrap_err());
    }
    let grown = rss_kib(d.pid()).saturating_sub(before);
    assert!(
        grown < 20 * 1024,
        "the daemon grew by {grown} KiB for refused requests"
    );
    for refused in refusals {
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    }
    // A list just over the bound, in a small request, is refused by name.
    let refused = client
        .plan_operation(request(talos_opsd::input::MAX_LIST_LEN + 1))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("retire.wipe"), "{refused:?}");
}

#[tokio::test]
async fn a_peer_opening_connection_after_connection_writes_bounded_audit_lines() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let client_ca = daemon::tls::ca("opsd client CA");
    let (config, _) = daemon::tls::tcp_config(dir.path(), port, &client_ca);
    let d = Daemon::start(dir.path(), &config).await;
    d.until_logged("mutual TLS listener").await;
    for _ in 0..200 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(([127, 0, 0, 3], 0).into()).unwrap();
        let mut conn = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
        conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        // Refused: the daemon closes it.
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut rest)).await;
    }
    let log = d.log_text();
    let lines = log.lines().filter(|l| l.contains("127.0.0.3")).count();
    assert!(
        lines <= talos_opsd::ratelimit::LINES_PER_WINDOW as usize * 3,
        "{lines} audit lines for one peer:\n{log}"
    );
    assert!(log.contains("held back"), "{log}");
}
