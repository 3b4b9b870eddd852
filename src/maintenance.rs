//! Talking to a node in maintenance mode, as talosctl's `--insecure` does.
//!
//! A node that has no machine configuration yet serves its API over TLS with
//! a certificate from a root of its own, accepts callers without a client
//! certificate, and gives every caller the reader role; applying a
//! configuration is the one change it takes. There is no CA to verify it
//! against: either pin its certificate's SPKI fingerprint (the base64
//! SHA-256 of its SubjectPublicKeyInfo, what talosctl's `--cert-fingerprint`
//! takes and a maintenance node prints on its console), or skip verification
//! knowingly with [`MaintenanceClient::dangerous_unverified`].
//!
//! The client offers only the calls a maintenance node serves: `Version` and
//! `ApplyConfiguration`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), talos_client::Error> {
//! use talos_client::client::{ApplyMode, ApplyRequest};
//! use talos_client::maintenance::MaintenanceClient;
//!
//! let node = MaintenanceClient::pinned("10.0.0.24", &["base64-sha256-of-spki="])?;
//! let config = std::fs::read("controlplane.yaml").unwrap();
//! node.apply_configuration(ApplyRequest::new(config, ApplyMode::Auto)).await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use base64::Engine as _;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};

use crate::client::{ApplyRequest, ApplyResult, VersionInfo};
use crate::tls::{Material, TlsError};
use crate::{Client, Error};

/// The SPKI fingerprint of a DER certificate, as talosctl prints and takes
/// it: base64 (standard, padded) of the SHA-256 of its SubjectPublicKeyInfo
/// (siderolabs/crypto x509.SPKIFingerprint).
pub fn spki_fingerprint(cert_der: &[u8]) -> Result<String, TlsError> {
    use sha2::Digest as _;
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(cert_der).map_err(|e| TlsError::X509 {
        material: Material::Certificate,
        reason: e.to_string(),
    })?;
    let digest = sha2::Sha256::digest(cert.public_key().raw);
    Ok(base64::engine::general_purpose::STANDARD.encode(digest))
}

/// A client for one node in maintenance mode.
#[derive(Clone)]
pub struct MaintenanceClient {
    inner: Client,
}

impl std::fmt::Debug for MaintenanceClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaintenanceClient").finish_non_exhaustive()
    }
}

impl MaintenanceClient {
    /// Connects to `endpoint` (`host`, `host:port`; port 50000 by default)
    /// and accepts its certificate only if its SPKI fingerprint is one of
    /// `fingerprints`. A mismatch fails the call, naming both.
    pub fn pinned(endpoint: &str, fingerprints: &[&str]) -> Result<MaintenanceClient, Error> {
        let mut pins = Vec::new();
        for fp in fingerprints {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(fp.trim())
                .map_err(|_| {
                    Error::Builder("a certificate fingerprint is base64 of a SHA-256 digest")
                })?;
            if bytes.len() != 32 {
                return Err(Error::Builder(
                    "a certificate fingerprint is base64 of a SHA-256 digest (32 bytes)",
                ));
            }
            pins.push(fp.trim().to_string());
        }
        if pins.is_empty() {
            return Err(Error::Builder("no certificate fingerprint given"));
        }
        Self::with_verifier(endpoint, Some(pins))
    }

    /// Connects to `endpoint` WITHOUT verifying the server at all: anyone
    /// on the path can read the configuration (and its keys) you send.
    /// Prefer [`MaintenanceClient::pinned`].
    pub fn dangerous_unverified(endpoint: &str) -> Result<MaintenanceClient, Error> {
        Self::with_verifier(endpoint, None)
    }

    fn with_verifier(
        endpoint: &str,
        pins: Option<Vec<String>>,
    ) -> Result<MaintenanceClient, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Arc::new(MaintenanceVerifier {
            pins,
            provider: provider.clone(),
        });
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls {
                origin: "maintenance connection".into(),
                source: Box::new(TlsError::from(e)),
            })?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let inner = Client::builder()
            .endpoints([endpoint])
            .read_attempts(1)
            .build_with_tls(Arc::new(config))?;
        Ok(MaintenanceClient { inner })
    }

    /// The node's Talos version.
    pub async fn version(&self) -> Result<VersionInfo, Error> {
        self.inner.version().await
    }

    /// Applies a machine configuration; a maintenance node takes REBOOT as
    /// NO_REBOOT and then boots into the configuration.
    pub async fn apply_configuration(&self, request: ApplyRequest) -> Result<ApplyResult, Error> {
        self.inner.apply_configuration(request).await
    }
}

/// Accepts the server's certificate when its SPKI fingerprint is pinned (or
/// when nothing is pinned, for [`MaintenanceClient::dangerous_unverified`]);
/// handshake signatures are always checked.
#[derive(Debug)]
struct MaintenanceVerifier {
    pins: Option<Vec<String>>,
    provider: Arc<CryptoProvider>,
}

/// A pinned fingerprint that does not match.
#[derive(Debug, thiserror::Error)]
#[error(
    "the server certificate's fingerprint {actual} does not match the pinned --cert-fingerprint {pinned}"
)]
struct FingerprintMismatch {
    actual: String,
    pinned: String,
}

impl ServerCertVerifier for MaintenanceVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(pins) = &self.pins else {
            return Ok(ServerCertVerified::assertion());
        };
        let actual = spki_fingerprint(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        if pins.contains(&actual) {
            return Ok(ServerCertVerified::assertion());
        }
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::Other(rustls::OtherError(Arc::new(FingerprintMismatch {
                actual,
                pinned: pins.join(", "),
            }))),
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
