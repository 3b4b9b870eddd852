//! A PKI for the daemon's TCP listener in tests: CAs and leaf
//! certificates made with rcgen, written as the configuration names them.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

pub struct Ca {
    pub issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

pub fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A leaf certificate and key (PEM) signed by `ca`.
pub fn leaf(ca: &Ca, name: &str, server: bool) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let sans = if server {
        vec!["localhost".to_string()]
    } else {
        Vec::new()
    };
    let mut params = CertificateParams::new(sans).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![if server {
        rcgen::ExtendedKeyUsagePurpose::ServerAuth
    } else {
        rcgen::ExtendedKeyUsagePurpose::ClientAuth
    }];
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

pub fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A `[tcp]` table listening on `port` with a server certificate from a
/// new CA and clients from `client_ca`; returns it and the server's CA.
pub fn tcp_config(dir: &Path, port: u16, client_ca: &Ca) -> (String, Ca) {
    let server_ca = ca("opsd server CA");
    let (cert, key) = leaf(&server_ca, "opsd", true);
    let config = format!(
        "\n[tcp]\nlisten = \"127.0.0.1:{port}\"\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\n",
        write(dir, "server.crt", &cert),
        write(dir, "server.key", &key),
        write(dir, "clients.crt", &client_ca.pem),
    );
    (config, server_ca)
}
