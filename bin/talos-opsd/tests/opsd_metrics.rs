//! The metrics listener: `HEAD /metrics` answers as `GET` does without the
//! body; the series are restored from the journal when the daemon starts;
//! a resumed snapshot reports the times of its own snapshot step.

mod daemon;

use daemon::{Daemon, free_port};
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
    assert!(head.contains("content-type: application/openmetrics-text"), "{head}");
    assert_eq!(content_length(&head), content_length(&get), "{head}\n{get}");
    let (_, body) = head.split_once("\r\n\r\n").unwrap();
    assert_eq!(body, "", "HEAD has no body");
    let other = http(port, "HEAD /other HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    assert!(other.ends_with("\r\n\r\n"), "{other}");
}
