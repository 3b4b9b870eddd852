//! A node in maintenance mode: an API without client certificates, behind a
//! certificate pinned by its SPKI fingerprint, that takes a control-plane
//! configuration and then joins the cluster's etcd.

use talos_test_support as common;

use std::sync::Arc;
use std::time::Duration;

use common::sim::{SimCluster, wait_for};
use talos_client::Error;
use talos_client::client::{ApplyMode, ApplyRequest};
use talos_client::maintenance::MaintenanceClient;

fn controlplane(sim: &SimCluster) -> String {
    std::fs::read_to_string(sim.dir.path().join("controlplane.yaml")).unwrap()
}

#[tokio::test]
async fn the_fingerprint_is_checked_and_a_wrong_one_is_named() {
    let sim = SimCluster::start(1).await;
    let added = sim.cluster.add_maintenance_node().await.unwrap();
    let fingerprint = added
        .maintenance_fingerprint
        .clone()
        .expect("a fingerprint");
    let pinned = MaintenanceClient::pinned(&added.api, &[&fingerprint]).unwrap();
    let version = pinned.version().await.unwrap();
    assert!(version.tag.starts_with('v'));
    // Not configured: the node reports no features, as in maintenance.
    assert!(!version.rbac);

    let wrong = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let err = MaintenanceClient::pinned(&added.api, &[wrong])
        .unwrap()
        .version()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&fingerprint) && text.contains(wrong),
        "{text}"
    );

    // The admin talosconfig cannot talk to it: its certificate is not
    // from the cluster's CA.
    assert!(
        sim.admin()
            .node(added.ip.to_string())
            .version()
            .await
            .is_err()
    );
}

#[tokio::test]
async fn only_apply_and_version_are_served_to_a_caller_without_a_certificate() {
    let sim = SimCluster::start(1).await;
    let added = sim.cluster.add_maintenance_node().await.unwrap();
    let channel = raw_insecure_channel(&added.api).await;
    let mut machine =
        talos_client::api::machine::machine_service_client::MachineServiceClient::new(channel);
    let status = machine
        .read(talos_client::api::machine::ReadRequest {
            path: "/system/state/config.yaml".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    let status = machine
        .reset(talos_client::api::machine::ResetRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(machine.version(()).await.is_ok());
}

#[tokio::test]
async fn a_control_plane_config_makes_it_join_and_be_promoted() {
    let sim = SimCluster::start(3).await;
    let added = sim.cluster.add_maintenance_node().await.unwrap();
    let fingerprint = added.maintenance_fingerprint.clone().unwrap();
    let node = MaintenanceClient::pinned(&added.api, &[&fingerprint]).unwrap();

    // A configuration of another cluster is refused, nothing changes.
    let foreign = controlplane(&sim).replace("crt: ", "crt: AAAA");
    match node
        .apply_configuration(ApplyRequest::new(foreign, ApplyMode::Auto))
        .await
    {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("expected InvalidArgument, got {other:?}"),
    }

    let dry = node
        .apply_configuration(
            ApplyRequest::new(controlplane(&sim), ApplyMode::Auto).with_dry_run(true),
        )
        .await
        .unwrap();
    assert!(
        dry.mode_details.contains("+version: v1alpha1"),
        "{}",
        dry.mode_details
    );
    let applied = node
        .apply_configuration(ApplyRequest::new(controlplane(&sim), ApplyMode::Reboot))
        .await
        .unwrap();
    // In maintenance REBOOT is taken as NO_REBOOT, as upstream does.
    assert_eq!(applied.mode, ApplyMode::NoReboot);

    let client = sim.admin();
    wait_for("cp-4 a voter", Duration::from_secs(60), || async {
        let members = client.etcd_member_list(false).await.ok()?;
        let m = members.into_iter().find(|m| m.hostname == "cp-4")?;
        (!m.is_learner).then_some(())
    })
    .await;
    // It now serves the cluster's certificate and mutual TLS.
    let hostname = wait_for("cp-4's API with mTLS", Duration::from_secs(30), || async {
        client.node(added.ip.to_string()).hostname().await.ok()
    })
    .await;
    assert_eq!(hostname, "cp-4");
    assert!(node.version().await.is_err(), "the maintenance API is gone");
}

/// A gRPC channel over TLS with no client certificate and no server
/// verification, built by hand to send calls the maintenance client does
/// not offer.
async fn raw_insecure_channel(addr: &str) -> tonic::transport::Channel {
    #[derive(Debug)]
    struct AnyServer(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for AnyServer {
        fn verify_server_cert(
            &self,
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &[rustls_pki_types::CertificateDer<'_>],
            _: &rustls_pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls_pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &rustls_pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &rustls_pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let config = Arc::new(config);
    let addr = addr.to_string();
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let (config, addr) = (config.clone(), addr.clone());
            async move {
                let tcp = tokio::net::TcpStream::connect(&addr).await?;
                let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
                let tls = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .unwrap()
}
