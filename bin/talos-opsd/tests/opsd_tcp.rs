//! The TCP listener requires mutual TLS with the daemon's own client CA: a
//! client without a certificate, or with one from another CA, is refused;
//! one from the CA is served and audited by its subject.

mod daemon;

use std::sync::Arc;
use std::time::Duration;

use daemon::tls::{ca, leaf, write};
use daemon::{Daemon, free_port};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use talos_opsd::proto::{self, opsd_client::OpsdClient};
use talos_test_support::sim::wait_for;
use tonic::transport::{Endpoint, Uri};

async fn call(
    port: u16,
    server_ca: &str,
    client: Option<&(String, String)>,
) -> Result<proto::ListOperationsResponse, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(server_ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let channel = Endpoint::try_from("http://localhost")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                let tls = connector
                    .connect(ServerName::try_from("localhost").unwrap(), tcp)
                    .await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    OpsdClient::new(channel)
        .list_operations(proto::ListOperationsRequest::default())
        .await
        .map(|r| r.into_inner())
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test]
async fn tcp_requires_a_client_certificate_from_its_own_ca() {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = ca("opsd server CA");
    let client_ca = ca("opsd client CA");
    let stranger_ca = ca("someone else's CA");
    let (cert, key) = leaf(&server_ca, "opsd", true);
    let port = free_port();
    let config = format!(
        "\n[tcp]\nlisten = \"127.0.0.1:{port}\"\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\n",
        write(dir.path(), "server.crt", &cert),
        write(dir.path(), "server.key", &key),
        write(dir.path(), "clients.crt", &client_ca.pem),
    );
    let d = Daemon::start(dir.path(), &config).await;
    d.until_logged("mutual TLS listener").await;

    let none = call(port, &server_ca.pem, None).await;
    assert!(none.is_err(), "served without a client certificate");
    let stranger = leaf(&stranger_ca, "mallory", false);
    let other = call(port, &server_ca.pem, Some(&stranger)).await;
    assert!(other.is_err(), "served a certificate from another CA");

    let alice = leaf(&client_ca, "alice", false);
    let listed = call(port, &server_ca.pem, Some(&alice)).await.unwrap();
    assert!(listed.operations.is_empty());
    let log = d.log_text();
    assert!(log.contains("CN=alice"), "audited by subject: {log}");
    assert!(!log.contains("PRIVATE KEY"), "{log}");
}

/// `check-config` loads the TCP files as the daemon does: a key that is
/// not the certificate's is refused naming them; the matching key passes.
#[test]
fn check_config_refuses_a_tcp_key_that_does_not_match_its_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = ca("opsd server CA");
    let (cert, key) = leaf(&server_ca, "opsd", true);
    let (_, other_key) = leaf(&server_ca, "another", true);
    let check = |key: &str| {
        let config = write(
            dir.path(),
            "config.toml",
            &format!(
                "state_dir = {:?}\nsocket = {:?}\n[tcp]\nlisten = \"127.0.0.1:1\"\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\n",
                dir.path().join("state"),
                dir.path().join("opsd.sock"),
                write(dir.path(), "server.crt", &cert),
                write(dir.path(), "server.key", key),
                write(dir.path(), "clients.crt", &server_ca.pem),
            ),
        );
        std::process::Command::new(talos_test_support::cli::cargo_bin("talos-opsd"))
            .arg("--config")
            .arg(&config)
            .arg("check-config")
            .output()
            .unwrap()
    };
    let refused = check(&other_key);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("tcp.cert and tcp.key"), "{stderr}");
    let ok = check(&key);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

/// A refused handshake's audit line names the certificate offered (its
/// subject) or that none was; a connection that sends nothing until the
/// handshake timeout, and one that stops mid-handshake, are audited too.
#[tokio::test]
async fn refused_and_silent_handshakes_are_audited_with_the_offered_subject() {
    use tokio::io::AsyncWriteExt as _;
    let dir = tempfile::tempdir().unwrap();
    let server_ca = ca("opsd server CA");
    let client_ca = ca("opsd client CA");
    let stranger_ca = ca("someone else's CA");
    let (cert, key) = leaf(&server_ca, "opsd", true);
    let port = free_port();
    let config = format!(
        "\n[tcp]\nlisten = \"127.0.0.1:{port}\"\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\n",
        write(dir.path(), "server.crt", &cert),
        write(dir.path(), "server.key", &key),
        write(dir.path(), "clients.crt", &client_ca.pem),
    );
    let d = Daemon::start(dir.path(), &config).await;
    d.until_logged("mutual TLS listener").await;
    let refused = |log: &str, needle: &str| {
        log.lines()
            .any(|l| l.contains("TLS handshake refused") && l.contains(needle))
    };

    let mallory = leaf(&stranger_ca, "mallory", false);
    assert!(call(port, &server_ca.pem, Some(&mallory)).await.is_err());
    assert!(call(port, &server_ca.pem, None).await.is_err());
    // Silent: connects and sends nothing. Stalled: one byte of a record.
    let _silent = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut stalled = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stalled.write_all(&[0x16]).await.unwrap();
    let log = wait_for("the audit lines", Duration::from_secs(20), || {
        let log = d.log_text();
        async move {
            (log.contains("sent nothing within the TLS handshake timeout")
                && log.contains("TLS handshake timed out"))
            .then_some(log)
        }
    })
    .await;
    assert!(refused(&log, "CN=mallory"), "{log}");
    assert!(refused(&log, "no client certificate"), "{log}");
    assert!(
        log.lines()
            .filter(|l| l.contains("audit"))
            .all(|l| !l.contains("PRIVATE KEY")),
        "{log}"
    );
}

/// Whether `stream` is open with nothing to read.
fn would_block(stream: &tokio::net::TcpStream) -> bool {
    matches!(stream.try_read(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Opens `count` TCP connections to the daemon from `from` that never send
/// a byte.
async fn silent_from(from: [u8; 4], port: u16, count: usize) -> Vec<tokio::net::TcpStream> {
    let mut held = Vec::new();
    for _ in 0..count {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((from, 0).into()).unwrap();
        held.push(socket.connect(([127, 0, 0, 1], port).into()).await.unwrap());
    }
    held
}

/// Peers that connect and say nothing cannot keep a client with a
/// certificate out: one address gets a few handshake slots and no more,
/// and when many addresses fill every slot a newcomer takes the oldest.
/// Both rounds run within one handshake timeout, so nothing here waits
/// for the silent ones to be dropped.
#[tokio::test]
async fn silent_peers_do_not_starve_authenticated_clients() {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = ca("opsd server CA");
    let client_ca = ca("opsd client CA");
    let (cert, key) = leaf(&server_ca, "opsd", true);
    let port = free_port();
    let config = format!(
        "\n[tcp]\nlisten = \"127.0.0.1:{port}\"\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\n",
        write(dir.path(), "server.crt", &cert),
        write(dir.path(), "server.key", &key),
        write(dir.path(), "clients.crt", &client_ca.pem),
    );
    let d = Daemon::start(dir.path(), &config).await;
    d.until_logged("mutual TLS listener").await;
    let alice = leaf(&client_ca, "alice", false);

    // One address, many connections: all but its share are closed at
    // once (their audit lines are bounded, so the closes are counted).
    let one = silent_from([127, 0, 0, 2], port, 200).await;
    wait_for("the per-address refusals", Duration::from_secs(4), || {
        // They never receive data: a read that does not block is the close.
        let closed = one.iter().filter(|s| !would_block(s)).count();
        async move { (closed >= 100).then_some(()) }
    })
    .await;
    assert!(d.log_text().contains("in progress"), "{}", d.log_text());
    call(port, &server_ca.pem, Some(&alice))
        .await
        .expect("a client with a certificate is served beside a silent address");

    // Many addresses, one connection each, more than there are slots.
    let mut many = Vec::new();
    for n in 1..=100u8 {
        many.extend(silent_from([127, 0, 1, n], port, 1).await);
    }
    wait_for(
        "slots taken from the oldest",
        Duration::from_secs(4),
        || {
            let log = d.log_text();
            async move { log.contains("TLS handshake abandoned").then_some(()) }
        },
    )
    .await;
    call(port, &server_ca.pem, Some(&alice))
        .await
        .expect("a client with a certificate is served when silent peers fill every slot");
}
