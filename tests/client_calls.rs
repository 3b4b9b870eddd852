//! The typed client against an in-process mTLS server: every call shape,
//! node targeting, per-node errors, status mapping, retries and failover.

use talos_test_support as common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::server::{TestPki, TestServer, dead_endpoint, hex, snapshot_byte};
use sha2::Digest as _;
use talos_client::client::MemberId;
use talos_client::{Client, Error};

fn client(pki: &TestPki, endpoints: Vec<String>) -> Client {
    Client::builder()
        .endpoints(endpoints)
        .credentials(pki.client_credentials(&pki.admin))
        .connect_timeout(Duration::from_secs(5))
        .call_timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

#[tokio::test]
async fn unary_call_sends_node_metadata() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    let client = client(&pki, vec![server.endpoint()]);

    let version = client.node("10.5.0.2").version().await.expect("version");
    assert_eq!(version.tag, "v1.13.9");
    assert!(version.rbac);
    // The test server echoes the `node` metadata it received in platform.mode.
    assert_eq!(version.platform_mode.as_deref(), Some("10.5.0.2"));

    let seen = server.state.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].node.as_deref(), Some("10.5.0.2"));
    assert!(seen[0].nodes.is_empty());
}

#[tokio::test]
async fn endpoint_node_gets_no_node_metadata() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    let client = client(&pki, vec![server.endpoint()]);

    assert_eq!(client.hostname().await.unwrap(), "cp-1");
    let seen = server.state.seen.lock().unwrap().clone();
    assert_eq!(seen[0].node, None);
}

#[tokio::test]
async fn fan_out_calls_each_node_and_labels_results() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    let client = client(&pki, vec![server.endpoint()]);

    let replies = client
        .nodes(["10.5.0.2", "10.5.0.3"])
        .version()
        .await
        .unwrap();
    let mut labelled: Vec<(String, String)> = replies
        .into_iter()
        .map(|r| (r.node, r.result.unwrap().platform_mode.unwrap()))
        .collect();
    labelled.sort();
    assert_eq!(
        labelled,
        vec![
            ("10.5.0.2".to_string(), "10.5.0.2".to_string()),
            ("10.5.0.3".to_string(), "10.5.0.3".to_string())
        ]
    );
    let mut nodes: Vec<_> = server
        .state
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.node.clone().unwrap())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["10.5.0.2", "10.5.0.3"]);
}

#[tokio::test]
async fn aggregated_response_surfaces_a_failed_node_as_its_error() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    let client = client(&pki, vec![server.endpoint()]);

    let replies = client
        .aggregate(["n1", "down", "n2"])
        .etcd_member_list(true)
        .await
        .expect("the call as a whole succeeds");
    assert_eq!(replies.len(), 3);
    assert_eq!(replies[0].node, "n1");
    let members = replies[0].result.as_ref().unwrap();
    assert_eq!(members[0].id, MemberId(0xabcdef0123456789));
    assert_eq!(members[0].id.to_string(), "abcdef0123456789");
    assert_eq!(members[0].hostname, "member-of-n1");
    assert!(members[0].is_learner, "query_local reached the server");
    assert_eq!(replies[1].node, "down");
    match &replies[1].result {
        Err(Error::Unavailable(failure)) => {
            assert_eq!(failure.node.as_deref(), Some("down"));
            assert!(failure.message.contains("connection refused"), "{failure}");
        }
        other => panic!("expected the node's own error, got {other:?}"),
    }
    assert!(replies[2].result.is_ok());

    let seen = server.state.seen.lock().unwrap().clone();
    assert_eq!(seen[0].nodes, ["n1", "down", "n2"]);
    assert_eq!(seen[0].node, None);
}

#[tokio::test]
async fn single_node_client_reports_a_metadata_error_as_error() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    let client = client(&pki, vec![server.endpoint()]);
    // One-node aggregate answered with only an error message.
    let replies = client
        .aggregate(["down"])
        .etcd_member_list(false)
        .await
        .unwrap();
    assert!(matches!(replies[0].result, Err(Error::Unavailable(_))));
}

#[tokio::test]
async fn server_streaming_snapshot_arrives_intact() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    *server.state.snapshot_size.lock().unwrap() = 100 * 1024 + 17;
    let client = client(&pki, vec![server.endpoint()]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snap.db");

    let stream = client.node("10.5.0.2").etcd_snapshot().await.unwrap();
    assert_eq!(stream.node(), "10.5.0.2");
    let written = talos_test_support::stream_to_file(stream, &path)
        .await
        .unwrap();
    assert_eq!(written, 100 * 1024 + 17);
    let data = std::fs::read(&path).unwrap();
    assert_eq!(data.len() as u64, written);
    assert!(
        data.iter()
            .enumerate()
            .all(|(i, b)| *b == snapshot_byte(i as u64))
    );
}

/// The endpoint in use goes away between two calls: the snapshot stream is
/// opened through the next endpoint, as a unary read would be, instead of
/// failing with the broken connection's "transport error".
#[tokio::test]
async fn a_snapshot_stream_fails_over_when_its_endpoint_breaks() {
    let pki = TestPki::new();
    let first = TestServer::start(&pki, "cp-1").await;
    let second = TestServer::start(&pki, "cp-2").await;
    *second.state.snapshot_size.lock().unwrap() = 4096;
    let client = client(&pki, vec![first.endpoint(), second.endpoint()]);
    assert_eq!(client.hostname().await.unwrap(), "cp-1");
    first.cut();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snap.db");
    let stream = client.node("10.5.0.3").etcd_snapshot().await.unwrap();
    let written = talos_test_support::stream_to_file(stream, &path)
        .await
        .unwrap();
    assert_eq!(written, 4096);
    assert_eq!(client.hostname().await.unwrap(), "cp-2");
}

#[tokio::test]
async fn client_streaming_recover_uploads_every_byte() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    let client = client(&pki, vec![server.endpoint()]);
    let payload: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    let chunks: Vec<Bytes> = payload.chunks(4096).map(Bytes::copy_from_slice).collect();

    client
        .node("10.5.0.2")
        .etcd_recover(futures::stream::iter(chunks))
        .await
        .expect("recover");

    let recovered = server.state.recovered.lock().unwrap().clone();
    assert_eq!(
        recovered,
        Some((payload.len() as u64, hex(&sha2::Sha256::digest(&payload))))
    );
}

#[tokio::test]
async fn statuses_map_to_matchable_variants() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    let reader = Client::builder()
        .endpoints([server.endpoint()])
        .credentials(pki.client_credentials(&pki.reader))
        .build()
        .unwrap();
    match reader.node("10.5.0.2").etcd_leave_cluster().await {
        Err(Error::PermissionDenied(f)) => assert_eq!(f.node.as_deref(), Some("10.5.0.2")),
        other => panic!("expected PermissionDenied, got {other:?}"),
    }

    let admin = client(&pki, vec![server.endpoint()]);
    let err = admin
        .node("10.5.0.2")
        .etcd_remove_member_by_id(MemberId(0x1234))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::NotFound));
    assert!(err.to_string().contains("0000000000001234"), "{err}");
    assert_eq!(err.node(), Some("10.5.0.2"));
}

#[tokio::test]
async fn reads_are_retried_on_unavailable() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    server.state.member_list_failures.store(1, Ordering::SeqCst);
    let client = client(&pki, vec![server.endpoint()]);

    let members = client
        .node("n1")
        .etcd_member_list(false)
        .await
        .expect("retried");
    assert_eq!(members.len(), 1);
    assert_eq!(server.state.member_list_calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn destructive_calls_are_never_retried() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    server.state.leave_failures.store(1, Ordering::SeqCst);
    let client = client(&pki, vec![server.endpoint()]);

    let err = client.node("n1").etcd_leave_cluster().await.unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert_eq!(server.state.leave_calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn fails_over_when_the_first_endpoint_is_down() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-2").await;
    let client = client(&pki, vec![dead_endpoint(), server.endpoint()]);

    assert_eq!(client.hostname().await.unwrap(), "cp-2");
    // The working endpoint stays in use.
    assert_eq!(client.hostname().await.unwrap(), "cp-2");
}

#[tokio::test]
async fn reports_every_endpoint_when_none_answers() {
    let pki = TestPki::new();
    let (a, b) = (dead_endpoint(), dead_endpoint());
    let client = client(&pki, vec![a.clone(), b.clone()]);
    match client.version().await {
        Err(Error::Connect(attempts)) => {
            let tried: Vec<_> = attempts.iter().map(|a| a.endpoint.clone()).collect();
            assert_eq!(tried, [a, b]);
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
}
