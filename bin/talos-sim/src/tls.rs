//! The server side of a simulated node's TLS, as apid sets it up
//! (siderolabs/talos internal/app/apid/service.go): the node's certificate,
//! a client certificate signed by the OS CA required, TLS 1.2 or newer, ALPN
//! `h2`, and exactly the ClientAuth extended key usage on every non-CA
//! certificate the client presents.

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig};
use rustls_pki_types::{CertificateDer, UnixTime};
use talos_client::tls::{
    CertificateInfo, Credentials, Material, TlsError, parse_certificates, parse_private_key,
};

/// The rustls configuration of a node's API server with `identity` (the
/// node's certificate and key, and the CA that signs client certificates).
pub fn server_config(identity: &Credentials) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in parse_certificates(identity.ca_pem(), Material::Ca)? {
        roots.add(cert).map_err(|e| TlsError::BadTrustAnchor {
            reason: e.to_string(),
        })?;
    }
    let chain = parse_certificates(identity.crt_pem(), Material::Certificate)?;
    let key = parse_private_key(identity.key_pem())?;
    let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::BadTrustAnchor {
            reason: e.to_string(),
        })?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(ExactClientAuthVerifier { inner }))
        .with_single_cert(chain, key)
        .map_err(|source| TlsError::UnusableKey { source })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The rustls configuration of a node in maintenance mode: a certificate
/// from the node's own maintenance root, no client certificate asked for
/// (upstream's SkipVerifyingClientCert,
/// internal/app/machined/pkg/controllers/secrets/api.go and
/// runtime/api_service_config.go).
pub fn maintenance_server_config(
    cert_pem: &str,
    key_pem: &str,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = parse_certificates(cert_pem.as_bytes(), Material::Certificate)?;
    let key = parse_private_key(key_pem.as_bytes())?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|source| TlsError::UnusableKey { source })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The roles a peer certificate grants: its subject's Organization values.
pub fn roles_of(der: &[u8]) -> Result<Vec<String>, TlsError> {
    Ok(CertificateInfo::from_der(der, Material::Certificate)?.roles)
}

/// WebPKI path validation plus apid's rule (`verifyExtKeyUsage`): every
/// non-CA certificate the client presents lists exactly ClientAuth.
#[derive(Debug)]
struct ExactClientAuthVerifier {
    inner: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for ExactClientAuthVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        for der in std::iter::once(end_entity).chain(intermediates) {
            let info = CertificateInfo::from_der(der, Material::Certificate)
                .map_err(|e| rustls::Error::General(e.to_string()))?;
            if !info.is_ca && !info.client_auth_only {
                return Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::InvalidPurpose,
                ));
            }
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }
}
