//! A Talos-style PKI made with rcgen: an Ed25519 OS CA (`O=talos`), server
//! certificates with IP SANs, and client certificates whose Organization
//! values are Talos roles and whose only extended key usage is ClientAuth
//! (as upstream's `pkg/machinery/config/generate/secrets/ca.go` issues them).
//!
//! Private keys are written with Talos's `ED25519 PRIVATE KEY` PEM label.

use std::net::IpAddr;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;

/// Errors generating certificates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PkiError {
    /// rcgen failed.
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
}

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct CertAndKey {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PEM (`ED25519 PRIVATE KEY` for Ed25519 keys).
    pub key_pem: String,
}

impl std::fmt::Debug for CertAndKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAndKey")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Serializes an rcgen key with Talos's PEM label when it is Ed25519.
fn talos_key_pem(key: &KeyPair) -> String {
    let pem = key.serialize_pem();
    if key.algorithm() == &rcgen::PKCS_ED25519 {
        pem.replace("BEGIN PRIVATE KEY", "BEGIN ED25519 PRIVATE KEY")
            .replace("END PRIVATE KEY", "END ED25519 PRIVATE KEY")
    } else {
        pem
    }
}

fn relabel_for_rcgen(key_pem: &str) -> String {
    key_pem
        .replace("BEGIN ED25519 PRIVATE KEY", "BEGIN PRIVATE KEY")
        .replace("END ED25519 PRIVATE KEY", "END PRIVATE KEY")
}

/// Which extended key usages a leaf certificate lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// ClientAuth only (Talos client certificates).
    ClientAuth,
    /// ServerAuth only (Talos server certificates).
    ServerAuth,
    /// Both (rejected by apid for clients).
    Both,
}

/// What to put in a leaf certificate.
#[derive(Debug, Clone)]
pub struct LeafSpec {
    /// Organization values (Talos roles for clients).
    pub organizations: Vec<String>,
    /// Optional common name.
    pub common_name: Option<String>,
    /// IP address SANs.
    pub ip_sans: Vec<IpAddr>,
    /// DNS SANs.
    pub dns_sans: Vec<String>,
    /// Extended key usage.
    pub usage: Usage,
    /// Start of validity.
    pub not_before: OffsetDateTime,
    /// End of validity.
    pub not_after: OffsetDateTime,
}

impl LeafSpec {
    /// A client certificate with the given Talos roles, valid for a year.
    pub fn client(roles: &[&str]) -> LeafSpec {
        let now = OffsetDateTime::now_utc();
        LeafSpec {
            organizations: roles.iter().map(|r| r.to_string()).collect(),
            common_name: None,
            ip_sans: Vec::new(),
            dns_sans: Vec::new(),
            usage: Usage::ClientAuth,
            not_before: now - Duration::from_secs(60),
            not_after: now + Duration::from_secs(365 * 24 * 3600),
        }
    }

    /// A server certificate for the given addresses and names, valid for a year.
    pub fn server(ips: &[IpAddr], names: &[&str]) -> LeafSpec {
        LeafSpec {
            organizations: Vec::new(),
            ip_sans: ips.to_vec(),
            dns_sans: names.iter().map(|n| n.to_string()).collect(),
            usage: Usage::ServerAuth,
            ..LeafSpec::client(&[])
        }
    }

    /// Sets the validity period.
    pub fn valid(mut self, not_before: OffsetDateTime, not_after: OffsetDateTime) -> LeafSpec {
        self.not_before = not_before;
        self.not_after = not_after;
        self
    }

    /// Sets the extended key usage.
    pub fn usage(mut self, usage: Usage) -> LeafSpec {
        self.usage = usage;
        self
    }
}

/// A certificate authority that can issue leaf certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// Generates a Talos OS CA: Ed25519, `O=talos`, valid for ten years.
    pub fn generate() -> Result<Ca, PkiError> {
        Ca::generate_with(&["talos"])
    }

    /// Generates an Ed25519 CA with the given Organization values.
    pub fn generate_with(organizations: &[&str]) -> Result<Ca, PkiError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        for org in organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *org);
        }
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.not_before = now - Duration::from_secs(60);
        params.not_after = now + Duration::from_secs(10 * 365 * 24 * 3600);
        let cert = params.self_signed(&key)?;
        let key_pem = talos_key_pem(&key);
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads an existing CA from its certificate and key PEM.
    pub fn load(cert_pem: &str, key_pem: &str) -> Result<Ca, PkiError> {
        let key = KeyPair::from_pem(&relabel_for_rcgen(key_pem))?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)?;
        Ok(Ca {
            issuer,
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
        })
    }

    /// The CA's private key, PEM. Never log it.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Issues an Ed25519 leaf certificate.
    pub fn issue(&self, spec: &LeafSpec) -> Result<CertAndKey, PkiError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        for org in &spec.organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, org.as_str());
        }
        if let Some(cn) = &spec.common_name {
            params
                .distinguished_name
                .push(DnType::CommonName, cn.as_str());
        }
        params.subject_alt_names = spec
            .ip_sans
            .iter()
            .map(|ip| SanType::IpAddress(*ip))
            .chain(
                spec.dns_sans
                    .iter()
                    .filter_map(|n| n.clone().try_into().ok().map(SanType::DnsName)),
            )
            .collect();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = match spec.usage {
            Usage::ClientAuth => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::ServerAuth => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Both => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        params.not_before = spec.not_before;
        params.not_after = spec.not_after;
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertAndKey {
            cert_pem: cert.pem(),
            key_pem: talos_key_pem(&key),
        })
    }
}
