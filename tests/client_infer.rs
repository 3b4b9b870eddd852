//! `Client::infer()` finds the talosconfig as talosctl does and connects
//! with its current context. Alone in its file: it sets `TALOSCONFIG` for
//! the whole process before anything else runs.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use talos_client::{Client, Error};
use talos_test_support::server::{TestPki, TestServer};

#[tokio::test]
async fn infer_uses_talosconfig_from_the_environment_and_its_current_context() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("talosconfig");
    let yaml = format!(
        "context: good\ncontexts:\n  other:\n    endpoints: [127.0.0.1:1]\n  good:\n    endpoints: [{}]\n    ca: {}\n    crt: {}\n    key: {}\n",
        server.endpoint(),
        BASE64.encode(&pki.ca.cert_pem),
        BASE64.encode(&pki.admin.cert_pem),
        BASE64.encode(&pki.admin.key_pem),
    );
    std::fs::write(&path, yaml).unwrap();

    // SAFETY: the only test in this process; nothing else reads the
    // environment concurrently (a current-thread runtime).
    unsafe { std::env::set_var("TALOSCONFIG", &path) };
    let client = Client::infer().expect("a client from $TALOSCONFIG");
    assert_eq!(client.hostname().await.unwrap(), "cp-1");

    // A missing file is an error naming it.
    let missing = dir.path().join("absent");
    unsafe { std::env::set_var("TALOSCONFIG", &missing) };
    match Client::infer() {
        Err(Error::Config(e)) => assert!(e.to_string().contains("absent"), "{e}"),
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(_) => panic!("expected a config error"),
    }
}
