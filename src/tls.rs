//! PEM handling with Talos's key labels, the rustls client configuration for
//! the Talos API, the facts a client certificate carries (roles, subject,
//! validity), and explaining TLS failures in operator terms.
//!
//! Talos writes Ed25519 private keys under the non-standard PEM label
//! `ED25519 PRIVATE KEY`; the DER inside is ordinary PKCS#8 (RFC 8410), so it is
//! relabelled before parsing. Rust PEM readers skip unknown labels silently,
//! which would otherwise surface as a confusing "no key found".

use std::fmt;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

/// ALPN protocol spoken by gRPC.
const ALPN_H2: &[u8] = b"h2";

/// Which piece of TLS material a problem was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Material {
    /// The certificate authority that signs the Talos API server certificates.
    Ca,
    /// The client (or server) certificate.
    Certificate,
    /// The private key belonging to the certificate.
    Key,
}

impl fmt::Display for Material {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Material::Ca => "CA certificate",
            Material::Certificate => "certificate",
            Material::Key => "private key",
        })
    }
}

/// Errors building TLS configurations from PEM material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The PEM text could not be read at all.
    #[error("{material}: not valid PEM: {source}")]
    Pem {
        /// Which input was bad.
        material: Material,
        /// What the PEM reader reported.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// The PEM text holds no block of the expected kind.
    #[error("{material}: no {expected} PEM block found{}", found_labels(.found))]
    Missing {
        /// Which input was bad.
        material: Material,
        /// The PEM label(s) that were expected.
        expected: &'static str,
        /// The labels that were present instead.
        found: Vec<String>,
    },
    /// A certificate's DER could not be parsed as X.509.
    #[error("{material}: not a valid X.509 certificate: {reason}")]
    X509 {
        /// Which input was bad.
        material: Material,
        /// The parser's explanation.
        reason: String,
    },
    /// The key is of a type rustls cannot sign with, or is damaged.
    #[error("private key: unusable: {source}")]
    UnusableKey {
        /// What rustls reported.
        #[source]
        source: rustls::Error,
    },
    /// The private key does not belong to the certificate.
    #[error("private key does not match the certificate (subject {subject})")]
    KeyMismatch {
        /// Subject of the certificate the key was paired with.
        subject: String,
    },
    /// The CA certificate was rejected as a trust anchor.
    #[error("CA certificate: cannot be used as a trust anchor: {reason}")]
    BadTrustAnchor {
        /// Why it was rejected.
        reason: String,
    },
    /// The client certificate's validity period has ended.
    #[error("client certificate (subject {subject}) expired at {not_after}")]
    Expired {
        /// Certificate subject.
        subject: String,
        /// End of validity, RFC 3339.
        not_after: String,
    },
    /// The client certificate is not valid yet.
    #[error("client certificate (subject {subject}) is not valid before {not_before}")]
    NotYetValid {
        /// Certificate subject.
        subject: String,
        /// Start of validity, RFC 3339.
        not_before: String,
    },
    /// rustls refused the assembled configuration.
    #[error("TLS configuration rejected: {0}")]
    Config(#[from] rustls::Error),
}

fn found_labels(found: &[String]) -> String {
    if found.is_empty() {
        " (the input contains no PEM blocks)".to_string()
    } else {
        format!(" (found: {})", found.join(", "))
    }
}

/// The CA, certificate and private key of one Talos API identity, as PEM.
///
/// `Debug` never prints the key.
#[derive(Clone)]
pub struct Credentials {
    ca_pem: Vec<u8>,
    crt_pem: Vec<u8>,
    key_pem: Arc<Vec<u8>>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("crt_pem", &format_args!("{} bytes", self.crt_pem.len()))
            .field("key_pem", &format_args!("<redacted>"))
            .finish()
    }
}

impl Credentials {
    /// Bundles PEM-encoded CA certificate(s), certificate (chain) and private key.
    pub fn from_pem(
        ca_pem: impl Into<Vec<u8>>,
        crt_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        Credentials {
            ca_pem: ca_pem.into(),
            crt_pem: crt_pem.into(),
            key_pem: Arc::new(key_pem.into()),
        }
    }

    /// The CA certificate(s), PEM.
    pub fn ca_pem(&self) -> &[u8] {
        &self.ca_pem
    }

    /// The certificate (chain), PEM.
    pub fn crt_pem(&self) -> &[u8] {
        &self.crt_pem
    }

    /// The private key, PEM. Handle with care: never log it.
    pub fn key_pem(&self) -> &[u8] {
        &self.key_pem
    }

    /// Parses the leaf certificate and returns its roles, subject and validity.
    pub fn certificate_info(&self) -> Result<CertificateInfo, TlsError> {
        let chain = parse_certificates(&self.crt_pem, Material::Certificate)?;
        CertificateInfo::from_der(&chain[0], Material::Certificate)
    }

    /// Builds the rustls configuration a Talos API client uses: the server is
    /// verified against the CA (IP SANs included), this certificate is
    /// presented, TLS 1.2 or 1.3, ALPN `h2`.
    ///
    /// An expired or not-yet-valid client certificate is refused here, with
    /// its dates, rather than later as an opaque handshake failure.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let provider = provider();
        let roots = root_store(&self.ca_pem)?;
        let chain = parse_certificates(&self.crt_pem, Material::Certificate)?;
        let info = CertificateInfo::from_der(&chain[0], Material::Certificate)?;
        info.check_validity(OffsetDateTime::now_utc())?;
        let key = parse_private_key(&self.key_pem)?;
        let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| TlsError::BadTrustAnchor {
                reason: e.to_string(),
            })?;
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_webpki_verifier(verifier)
            .with_client_auth_cert(chain, key)
            .map_err(|e| key_error(e, &info.subject))?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Arc::new(config))
    }
}

/// The rustls configuration of an HTTPS/1.1 client (the Kubernetes API):
/// the server verified against `ca_pem`, and, when given, a client
/// certificate and key presented. Dates are left to the server to judge.
#[cfg(feature = "kubernetes")]
pub(crate) fn http1_client_config(
    ca_pem: &[u8],
    client: Option<(&[u8], &[u8])>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = provider();
    let roots = root_store(ca_pem)?;
    let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| TlsError::BadTrustAnchor {
            reason: e.to_string(),
        })?;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_webpki_verifier(verifier);
    let mut config = match client {
        Some((crt_pem, key_pem)) => {
            let chain = parse_certificates(crt_pem, Material::Certificate)?;
            let info = CertificateInfo::from_der(&chain[0], Material::Certificate)?;
            let key = parse_private_key(key_pem)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| key_error(e, &info.subject))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn key_error(e: rustls::Error, subject: &str) -> TlsError {
    match e {
        rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch {
            subject: subject.to_string(),
        },
        other => TlsError::UnusableKey { source: other },
    }
}

/// The crypto provider used for every connection: ring.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn root_store(ca_pem: &[u8]) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in parse_certificates(ca_pem, Material::Ca)? {
        CertificateInfo::from_der(&cert, Material::Ca)?;
        roots.add(cert).map_err(|e| TlsError::BadTrustAnchor {
            reason: e.to_string(),
        })?;
    }
    Ok(Arc::new(roots))
}

/// Labels of every PEM block in `pem`, for error messages.
fn pem_labels(pem: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(pem)
        .lines()
        .filter_map(|line| {
            line.trim()
                .strip_prefix("-----BEGIN ")?
                .strip_suffix("-----")
                .map(str::to_string)
        })
        .collect()
}

/// Parses every `CERTIFICATE` block in `pem`.
pub fn parse_certificates(
    pem: &[u8],
    material: Material,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem { material, source })?;
    if certs.is_empty() {
        return Err(TlsError::Missing {
            material,
            expected: "CERTIFICATE",
            found: pem_labels(pem),
        });
    }
    Ok(certs)
}

/// Parses the first private key in `pem`: `ED25519 PRIVATE KEY` (Talos),
/// `PRIVATE KEY` (PKCS#8), `EC PRIVATE KEY` (SEC1) or `RSA PRIVATE KEY`
/// (PKCS#1).
pub fn parse_private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    let text = String::from_utf8_lossy(pem);
    let relabelled = text
        .replace(
            "-----BEGIN ED25519 PRIVATE KEY-----",
            "-----BEGIN PRIVATE KEY-----",
        )
        .replace(
            "-----END ED25519 PRIVATE KEY-----",
            "-----END PRIVATE KEY-----",
        );
    match PrivateKeyDer::from_pem_slice(relabelled.as_bytes()) {
        Ok(key) => Ok(key),
        Err(rustls_pki_types::pem::Error::NoItemsFound) => Err(TlsError::Missing {
            material: Material::Key,
            expected: "ED25519 PRIVATE KEY, PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY",
            found: pem_labels(pem),
        }),
        Err(source) => Err(TlsError::Pem {
            material: Material::Key,
            source,
        }),
    }
}

/// The roles Talos grants (pkg/machinery/role/role.go, `role.All`): the
/// organisation values of a client certificate that mean something to a
/// node. Others are kept in a certificate but grant nothing.
pub const KNOWN_ROLES: &[&str] = &[
    "os:admin",
    "os:operator",
    "os:reader",
    "os:etcd:backup",
    "os:image:verifier",
    "os:meta:writer",
    "os:impersonator",
];

/// What a Talos client certificate says about its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CertificateInfo {
    /// Subject distinguished name, e.g. `O=os:admin`.
    pub subject: String,
    /// Issuer distinguished name, e.g. `O=talos`.
    pub issuer: String,
    /// Talos roles: the subject's Organization values (`os:admin`, `os:reader`, ...).
    pub roles: Vec<String>,
    /// Start of validity.
    pub not_before: OffsetDateTime,
    /// End of validity.
    pub not_after: OffsetDateTime,
    /// Whether the certificate is a CA.
    pub is_ca: bool,
    /// Extended key usages: true when the extension lists exactly ClientAuth.
    pub client_auth_only: bool,
}

impl CertificateInfo {
    /// Parses one DER certificate.
    pub fn from_der(der: &[u8], material: Material) -> Result<Self, TlsError> {
        let (_, cert) = X509Certificate::from_der(der).map_err(|e| TlsError::X509 {
            material,
            reason: e.to_string(),
        })?;
        let roles = cert
            .subject()
            .iter_organization()
            .filter_map(|attr| attr.as_str().ok().map(str::to_string))
            .collect();
        let client_auth_only = match cert.extended_key_usage() {
            Ok(Some(eku)) => {
                let eku = eku.value;
                eku.client_auth
                    && !eku.any
                    && !eku.server_auth
                    && !eku.code_signing
                    && !eku.email_protection
                    && !eku.time_stamping
                    && !eku.ocsp_signing
                    && eku.other.is_empty()
            }
            _ => false,
        };
        Ok(CertificateInfo {
            subject: cert.subject().to_string(),
            issuer: cert.issuer().to_string(),
            roles,
            not_before: cert.validity().not_before.to_datetime(),
            not_after: cert.validity().not_after.to_datetime(),
            is_ca: cert.is_ca(),
            client_auth_only,
        })
    }

    /// Fails when `now` lies outside the certificate's validity period.
    pub fn check_validity(&self, now: OffsetDateTime) -> Result<(), TlsError> {
        if now > self.not_after {
            return Err(TlsError::Expired {
                subject: self.subject.clone(),
                not_after: rfc3339(self.not_after),
            });
        }
        if now < self.not_before {
            return Err(TlsError::NotYetValid {
                subject: self.subject.clone(),
                not_before: rfc3339(self.not_before),
            });
        }
        Ok(())
    }
}

/// Formats a timestamp as RFC 3339 (UTC).
pub(crate) fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.to_string())
}

/// Explains a failed connection in operator terms: which certificate check
/// failed rather than a chain of transport wrappers.
pub(crate) fn describe_connect_error(
    err: &(dyn std::error::Error + 'static),
    host: &str,
) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    let mut chain = Vec::new();
    while let Some(e) = source {
        if let Some(rustls_error) = find_rustls_error(e) {
            return describe_tls(rustls_error, host);
        }
        let text = e.to_string();
        if !chain.iter().any(|c: &String| c.contains(&text)) {
            chain.push(text);
        }
        source = e.source();
    }
    chain.join(": ")
}

/// Explains a TLS failure found anywhere in an error's source chain.
pub(crate) fn describe_tls_cause(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(rustls_error) = find_rustls_error(e) {
            return Some(describe_tls(rustls_error, "the server"));
        }
        // tokio-rustls reports alerts on reads as text only.
        let text = e.to_string();
        if let Some(alert) = text.split("received fatal alert: ").nth(1) {
            return Some(rejected(alert));
        }
        source = e.source();
    }
    None
}

fn find_rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(r) = e.downcast_ref::<rustls::Error>() {
        return Some(r);
    }
    e.downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

fn describe_tls(e: &rustls::Error, host: &str) -> String {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    match e {
        E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
            "TLS: the server certificate of {host} is not signed by the configured CA (wrong talosconfig or cluster?)"
        ),
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            format!("TLS: the server certificate is not valid for {host:?} (no matching SAN)")
        }
        E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "TLS: the server certificate has expired".to_string()
        }
        E::InvalidCertificate(C::Other(other)) => format!("TLS: {other}"),
        E::AlertReceived(
            alert @ (A::BadCertificate
            | A::CertificateExpired
            | A::UnknownCA
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateRequired),
        ) => rejected(format!("{alert:?}")),
        other => format!("TLS: {other}"),
    }
}

fn rejected(alert: impl std::fmt::Display) -> String {
    format!(
        "TLS: the server rejected the connection ({alert}); check that the client certificate is signed by this cluster's CA, not expired, and has exactly the ClientAuth usage"
    )
}
