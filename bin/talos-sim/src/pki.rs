//! A Talos-style PKI made with rcgen: an Ed25519 OS CA (`O=talos`), server
//! certificates with IP SANs, and client certificates whose Organization
//! values are Talos roles and whose only extended key usage is ClientAuth
//! (as upstream's `pkg/machinery/config/generate/secrets/ca.go` issues them);
//! and the cluster's ECDSA P-256 CAs for Kubernetes (`O=kubernetes`) and etcd
//! (`O=etcd`), whose leaves are ECDSA P-256 too (siderolabs/crypto
//! `x509/keypair.go`, NewKeyPair, picks the leaf's key type from the CA's).
//!
//! Private keys are written as Talos writes them: Ed25519 under the
//! `ED25519 PRIVATE KEY` PEM label, ECDSA as SEC 1 under `EC PRIVATE KEY`.

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

/// A key as Talos writes it (siderolabs/crypto `x509`): Ed25519 keys as
/// PKCS#8 v1 (RFC 5208: version 0, no public key inside) under the
/// `ED25519 PRIVATE KEY` label (ring and rcgen produce v2, RFC 5958, public
/// key included, which OpenSSL 3.0 refuses to load); ECDSA keys as Go's
/// MarshalECPrivateKey does, SEC 1 with the curve named, under
/// `EC PRIVATE KEY`.
fn talos_key_pem(key: &KeyPair) -> String {
    if key.algorithm() == &rcgen::PKCS_ECDSA_P256_SHA256 {
        let sec1 = p256_pkcs8_to_sec1(&key.serialize_der())
            .expect("ring's P-256 PKCS#8 holds a 32-byte scalar and a public point");
        return pem_block("EC PRIVATE KEY", &sec1);
    }
    if key.algorithm() != &rcgen::PKCS_ED25519 {
        return key.serialize_pem();
    }
    let v2 = key.serialize_der();
    let seed = ed25519_seed(&v2).expect("an Ed25519 PKCS#8 document holds a 32-byte seed");
    let mut v1 = ED25519_PKCS8_V1_PREFIX.to_vec();
    v1.extend_from_slice(seed);
    pem_block("ED25519 PRIVATE KEY", &v1)
}

/// DER of PKCS#8 v1 for Ed25519 up to the 32-byte seed: SEQUENCE, version
/// 0, AlgorithmIdentifier {1.3.101.112}, OCTET STRING { OCTET STRING (32) }.
const ED25519_PKCS8_V1_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// The 32-byte seed of an Ed25519 PKCS#8 document (v1 or v2): the inner
/// OCTET STRING right after the algorithm identifier.
fn ed25519_seed(der: &[u8]) -> Option<&[u8]> {
    const OID_AND_WRAP: [u8; 9] = [0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
    let at = der
        .windows(OID_AND_WRAP.len())
        .position(|w| w == OID_AND_WRAP)?;
    der.get(at + OID_AND_WRAP.len()..at + OID_AND_WRAP.len() + 32)
}

fn pem_block(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        pem.push('\n');
    }
    pem.push_str(&format!("-----END {label}-----\n"));
    pem
}

/// DER of the OIDs of a P-256 key: id-ecPublicKey and prime256v1.
const EC_PUBLIC_KEY_OID: [u8; 9] = [0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const PRIME256V1_OID: [u8; 10] = [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];

/// The scalar and the uncompressed public point (65 bytes) of a P-256
/// ECPrivateKey, wherever it sits (PKCS#8 or SEC 1): the 32-byte OCTET
/// STRING after `version 1`, and the BIT STRING of the `[1]` field.
fn p256_parts(der: &[u8]) -> Option<(&[u8], &[u8])> {
    const VERSION_AND_SCALAR: [u8; 5] = [0x02, 0x01, 0x01, 0x04, 0x20];
    const PUBLIC: [u8; 5] = [0xa1, 0x44, 0x03, 0x42, 0x00];
    let at = der
        .windows(VERSION_AND_SCALAR.len())
        .position(|w| w == VERSION_AND_SCALAR)?
        + VERSION_AND_SCALAR.len();
    let scalar = der.get(at..at + 32)?;
    let rest = &der[at + 32..];
    let public_at = rest.windows(PUBLIC.len()).position(|w| w == PUBLIC)? + PUBLIC.len();
    let point = rest.get(public_at..public_at + 65)?;
    (point[0] == 0x04).then_some((scalar, point))
}

/// ECPrivateKey (RFC 5915) with or without the `[0]` curve parameters.
fn ec_private_key(scalar: &[u8], point: &[u8], with_curve: bool) -> Vec<u8> {
    let mut body = vec![0x02, 0x01, 0x01, 0x04, 0x20];
    body.extend_from_slice(scalar);
    if with_curve {
        body.extend_from_slice(&[0xa0, PRIME256V1_OID.len() as u8]);
        body.extend_from_slice(&PRIME256V1_OID);
    }
    body.extend_from_slice(&[0xa1, 0x44, 0x03, 0x42, 0x00]);
    body.extend_from_slice(point);
    let mut der = vec![0x30, body.len() as u8];
    der.extend_from_slice(&body);
    der
}

fn p256_pkcs8_to_sec1(pkcs8: &[u8]) -> Option<Vec<u8>> {
    let (scalar, point) = p256_parts(pkcs8)?;
    Some(ec_private_key(scalar, point, true))
}

/// PKCS#8 v1 around a SEC 1 P-256 key: what ring (rcgen's backend) loads.
fn p256_sec1_to_pkcs8(sec1: &[u8]) -> Option<Vec<u8>> {
    let (scalar, point) = p256_parts(sec1)?;
    let inner = ec_private_key(scalar, point, false);
    let mut body = vec![
        0x02,
        0x01,
        0x00,
        0x30,
        (EC_PUBLIC_KEY_OID.len() + PRIME256V1_OID.len()) as u8,
    ];
    body.extend_from_slice(&EC_PUBLIC_KEY_OID);
    body.extend_from_slice(&PRIME256V1_OID);
    body.extend_from_slice(&[0x04, inner.len() as u8]);
    body.extend_from_slice(&inner);
    let mut der = vec![0x30, 0x81, body.len() as u8];
    der.extend_from_slice(&body);
    Some(der)
}

/// Loads a key in any of the forms Talos writes (see [`talos_key_pem`]),
/// or plain PKCS#8.
fn load_key(key_pem: &str) -> Result<KeyPair, PkiError> {
    if key_pem.contains("-----BEGIN EC PRIVATE KEY-----") {
        use base64::Engine as _;
        let body: String = key_pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let sec1 = base64::engine::general_purpose::STANDARD
            .decode(body.trim())
            .map_err(|_| rcgen::Error::CouldNotParseKeyPair)?;
        let pkcs8 = p256_sec1_to_pkcs8(&sec1).ok_or(rcgen::Error::CouldNotParseKeyPair)?;
        return Ok(KeyPair::try_from(pkcs8.as_slice())?);
    }
    Ok(KeyPair::from_pem(
        &key_pem
            .replace("BEGIN ED25519 PRIVATE KEY", "BEGIN PRIVATE KEY")
            .replace("END ED25519 PRIVATE KEY", "END PRIVATE KEY"),
    )?)
}

/// A new ECDSA P-256 private key as Talos writes one (SEC 1, `EC PRIVATE
/// KEY`): the cluster's service-account signing key.
pub fn generate_ec_key_pem() -> Result<String, PkiError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    Ok(talos_key_pem(&key))
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
        Ca::generate_for(&rcgen::PKCS_ED25519, organizations)
    }

    /// Generates the cluster's Kubernetes CA as upstream's NewKubernetesCA:
    /// ECDSA P-256, `O=kubernetes`, valid for ten years.
    pub fn generate_kubernetes() -> Result<Ca, PkiError> {
        Ca::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256, &["kubernetes"])
    }

    /// Generates the cluster's etcd CA as upstream's NewEtcdCA: ECDSA
    /// P-256, `O=etcd`, valid for ten years.
    pub fn generate_etcd() -> Result<Ca, PkiError> {
        Ca::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256, &["etcd"])
    }

    fn generate_for(
        algorithm: &'static rcgen::SignatureAlgorithm,
        organizations: &[&str],
    ) -> Result<Ca, PkiError> {
        let key = KeyPair::generate_for(algorithm)?;
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
        let key = load_key(key_pem)?;
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

    /// Issues a leaf certificate whose key is of the CA's own type
    /// (Ed25519 or ECDSA P-256).
    pub fn issue(&self, spec: &LeafSpec) -> Result<CertAndKey, PkiError> {
        let algorithm = if self.issuer.key().algorithm() == &rcgen::PKCS_ECDSA_P256_SHA256 {
            &rcgen::PKCS_ECDSA_P256_SHA256
        } else {
            &rcgen::PKCS_ED25519
        };
        let key = KeyPair::generate_for(algorithm)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ed25519_keys_are_pkcs8_v1_as_talos_writes_them() {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let pem = talos_key_pem(&key);
        assert!(
            pem.starts_with("-----BEGIN ED25519 PRIVATE KEY-----\nMC4CAQAw"),
            "{pem}"
        );
        // rcgen (ring) reads it back as the same key.
        let again = load_key(&pem).unwrap();
        assert_eq!(again.public_key_raw(), key.public_key_raw());
    }

    #[test]
    fn ecdsa_keys_are_sec1_with_the_curve_named_and_read_back() {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let pem = talos_key_pem(&key);
        // SEQUENCE (0x77), version 1, 32-byte scalar: "MHcCAQEEI".
        assert!(
            pem.starts_with("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEI"),
            "{pem}"
        );
        let again = load_key(&pem).unwrap();
        assert_eq!(again.public_key_raw(), key.public_key_raw());
        assert_eq!(again.algorithm(), &rcgen::PKCS_ECDSA_P256_SHA256);
    }

    #[test]
    fn a_kubernetes_ca_issues_ecdsa_leaves_and_survives_a_reload() {
        let ca = Ca::generate_kubernetes().unwrap();
        assert!(ca.key_pem().starts_with("-----BEGIN EC PRIVATE KEY-----"));
        let again = Ca::load(&ca.cert_pem, ca.key_pem()).unwrap();
        let mut spec = LeafSpec::client(&["system:masters"]);
        spec.common_name = Some("admin".into());
        let leaf = again.issue(&spec).unwrap();
        assert!(leaf.key_pem.starts_with("-----BEGIN EC PRIVATE KEY-----"));
        let der = {
            use base64::Engine as _;
            let body: String = leaf
                .cert_pem
                .lines()
                .filter(|l| !l.starts_with("-----"))
                .collect();
            base64::engine::general_purpose::STANDARD
                .decode(body)
                .unwrap()
        };
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert_eq!(cert.issuer().to_string(), "O=kubernetes");
        assert_eq!(cert.subject().to_string(), "O=system:masters, CN=admin");
        assert_eq!(
            cert.public_key().algorithm.algorithm.to_id_string(),
            "1.2.840.10045.2.1"
        );
    }
}
