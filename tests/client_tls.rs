//! TLS failures get clear errors that say which piece of material is wrong.

use talos_test_support as common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::server::{TestPki, TestServer};
use talos_client::tls::{Credentials, TlsError};
use talos_client::{Client, Error};
use talos_sim::pki::{Ca, LeafSpec, Usage};
use time::OffsetDateTime;

fn build(endpoint: String, credentials: Credentials) -> Result<Client, Error> {
    Client::builder()
        .endpoints([endpoint])
        .credentials(credentials)
        .connect_timeout(Duration::from_secs(5))
        .read_attempts(1)
        .build()
}

#[tokio::test]
async fn wrong_ca_is_reported_as_such() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    let other = Ca::generate().unwrap();
    let credentials = Credentials::from_pem(
        other.cert_pem.as_bytes(),
        pki.admin.cert_pem.as_bytes(),
        pki.admin.key_pem.as_bytes(),
    );
    let client = build(server.endpoint(), credentials).unwrap();
    let err = client.version().await.unwrap_err();
    let Error::Connect(attempts) = &err else {
        panic!("expected a connect error, got {err:?}");
    };
    assert!(
        attempts[0]
            .reason
            .contains("not signed by the configured CA"),
        "{err}"
    );
    assert!(server.state.seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn server_certificate_must_name_the_endpoint_ip() {
    let pki = TestPki::new();
    // A server certificate for another address only.
    let elsewhere = pki
        .ca
        .issue(&LeafSpec::server(
            &[IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9))],
            &[],
        ))
        .unwrap();
    let pki = TestPki {
        server: elsewhere,
        ..pki
    };
    let server = TestServer::start(&pki, "cp-1").await;
    let client = build(server.endpoint(), pki.client_credentials(&pki.admin)).unwrap();
    let err = client.version().await.unwrap_err();
    assert!(
        err.to_string().contains("not valid for \"127.0.0.1\""),
        "{err}"
    );
}

#[test]
fn expired_client_certificate_is_refused_before_connecting() {
    let pki = TestPki::new();
    let now = OffsetDateTime::now_utc();
    let expired = pki
        .ca
        .issue(&LeafSpec::client(&["os:admin"]).valid(
            now - Duration::from_secs(7200),
            now - Duration::from_secs(3600),
        ))
        .unwrap();
    let err = build("127.0.0.1".into(), pki.client_credentials(&expired)).unwrap_err();
    match &err {
        Error::Tls { source, .. } => assert!(matches!(**source, TlsError::Expired { .. })),
        other => panic!("expected an expiry error, got {other:?}"),
    }
    assert!(err.to_string().contains("expired at"), "{err}");
}

#[test]
fn unreadable_key_names_the_key_and_what_was_found() {
    let pki = TestPki::new();
    let credentials = Credentials::from_pem(
        pki.ca.cert_pem.as_bytes(),
        pki.admin.cert_pem.as_bytes(),
        pki.admin.cert_pem.as_bytes(), // a certificate where the key should be
    );
    let err = build("127.0.0.1".into(), credentials).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("private key: no"), "{text}");
    assert!(text.contains("found: CERTIFICATE"), "{text}");

    let garbage = Credentials::from_pem(
        pki.ca.cert_pem.as_bytes(),
        pki.admin.cert_pem.as_bytes(),
        b"not a key at all".to_vec(),
    );
    let text = build("127.0.0.1".into(), garbage).unwrap_err().to_string();
    assert!(
        text.contains("private key") && text.contains("no PEM blocks"),
        "{text}"
    );
}

#[test]
fn key_of_another_certificate_is_a_mismatch() {
    let pki = TestPki::new();
    let credentials = Credentials::from_pem(
        pki.ca.cert_pem.as_bytes(),
        pki.admin.cert_pem.as_bytes(),
        pki.reader.key_pem.as_bytes(),
    );
    let err = build("127.0.0.1".into(), credentials).unwrap_err();
    assert!(
        err.to_string().contains("does not match the certificate"),
        "{err}"
    );
}

#[tokio::test]
async fn server_rejects_a_client_certificate_without_exact_client_auth() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    let both = pki
        .ca
        .issue(&LeafSpec::client(&["os:admin"]).usage(Usage::Both))
        .unwrap();
    let client = build(server.endpoint(), pki.client_credentials(&both)).unwrap();
    let err = client.version().await.unwrap_err();
    assert!(
        server.state.seen.lock().unwrap().is_empty(),
        "request must not be served"
    );
    assert!(matches!(err, Error::Unauthenticated(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("server rejected the connection"), "{text}");
    assert!(text.contains("UnsupportedCertificate"), "{text}");
}

#[tokio::test]
async fn a_reader_certificate_reaches_the_server() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    let client = build(server.endpoint(), pki.client_credentials(&pki.reader)).unwrap();
    assert_eq!(client.hostname().await.unwrap(), "cp-1");
    let info = pki
        .client_credentials(&pki.reader)
        .certificate_info()
        .unwrap();
    assert_eq!(info.roles, ["os:reader"]);
    assert_eq!(info.issuer, "O=talos");
    assert!(info.client_auth_only);
}
