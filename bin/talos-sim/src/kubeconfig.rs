//! The admin kubeconfig of a simulated control-plane node, generated from
//! its running machine configuration and packaged as machined sends it
//! (internal/app/machined/internal/server/v1alpha1, Kubeconfig): a gzipped
//! tar archive holding one file `kubeconfig` (mode 0600), in one
//! `common.Data` message. The admin certificate (`O=system:masters`,
//! `CN=admin`, ECDSA P-256 like its CA) is issued by the cluster's
//! Kubernetes CA, `cluster.ca` of the configuration, which the kubeconfig
//! also trusts.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use tonic::Status;

use crate::pki::{Ca, LeafSpec};

/// The archive for a node whose running configuration is `config`.
pub(crate) fn archive(config: &str) -> Result<Vec<u8>, Status> {
    let yaml = admin_kubeconfig(config)?;
    package(yaml.as_bytes()).map_err(|e| Status::internal(format!("kubeconfig archive: {e}")))
}

/// A reader of string fields (`["cluster", "clusterName"]`) of a machine
/// configuration's v1alpha1 document: a configuration of several documents
/// is served alike, as a Talos node serves it.
pub(crate) fn v1alpha1_fields(
    config: &str,
) -> Result<impl Fn(&[&str]) -> Result<String, Status>, Status> {
    let doc = crate::diff::parse(config.as_bytes())
        .map_err(|e| Status::internal(format!("machine config: {}", e.message())))?
        .v1alpha1;
    Ok(move |path: &[&str]| {
        let mut value = &doc;
        for key in path {
            value = &value[*key];
        }
        value
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| Status::internal(format!("machine config has no {}", path.join("."))))
    })
}

/// The kubeconfig upstream's `kubeconfig.GenerateAdmin` writes: one cluster,
/// one user `admin@NAME`, one context `admin@NAME` (namespace default),
/// current.
pub(crate) fn admin_kubeconfig(config: &str) -> Result<String, Status> {
    let field = v1alpha1_fields(config)?;
    let cluster = field(&["cluster", "clusterName"])?;
    let endpoint = field(&["cluster", "controlPlane", "endpoint"])?;
    let pem = |path: &[&str]| -> Result<String, Status> {
        let encoded = field(path)?;
        let bytes = BASE64
            .decode(encoded.trim())
            .map_err(|e| Status::internal(format!("{}: {e}", path.join("."))))?;
        String::from_utf8(bytes)
            .map_err(|_| Status::internal(format!("{} is not PEM", path.join("."))))
    };
    let ca = Ca::load(
        &pem(&["cluster", "ca", "crt"])?,
        &pem(&["cluster", "ca", "key"])?,
    )
    .map_err(|e| Status::internal(format!("cluster.ca: {e}")))?;
    let mut spec = LeafSpec::client(&["system:masters"]);
    spec.common_name = Some("admin".into());
    let admin = ca
        .issue(&spec)
        .map_err(|e| Status::internal(format!("admin certificate: {e}")))?;
    let user = format!("admin@{cluster}");
    Ok(format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: {cluster}\n  cluster:\n    server: {endpoint}\n    certificate-authority-data: {ca}\n\
         users:\n\
         - name: {user}\n  user:\n    client-certificate-data: {crt}\n    client-key-data: {key}\n\
         contexts:\n\
         - context:\n    cluster: {cluster}\n    namespace: default\n    user: {user}\n  name: {user}\n\
         current-context: {user}\n",
        ca = BASE64.encode(&ca.cert_pem),
        crt = BASE64.encode(&admin.cert_pem),
        key = BASE64.encode(&admin.key_pem),
    ))
}

fn package(body: &[u8]) -> std::io::Result<Vec<u8>> {
    let gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gzip);
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(body.len() as u64);
    header.set_mode(0o600);
    header.set_mtime(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default(),
    );
    header.set_cksum();
    tar.append_data(&mut header, "kubeconfig", body)?;
    tar.into_inner()?.finish()
}
