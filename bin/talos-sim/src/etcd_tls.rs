//! The TLS of a simulated cluster's etcd, as Talos sets it up: every member
//! serves its client and peer URLs over TLS with certificates from the
//! cluster's etcd CA (`cluster.etcd.ca`) and asks every client and peer for
//! a certificate from that CA (upstream's etcd service flags in
//! internal/app/machined/pkg/system/services/etcd.go; the certificates of
//! internal/pkg/etcd/certs.go, issued by
//! internal/app/machined/pkg/controllers/secrets/etcd.go): a server and a
//! peer certificate per node (ServerAuth and ClientAuth, the node's
//! hostname and addresses as SANs), a client certificate `CN=talos` for
//! machined's own calls and one `CN=kube-apiserver` for the API server.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use talos_client::tls::Credentials;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::SimError;
use crate::pki::{Ca, CertAndKey, LeafSpec, Usage};

/// The etcd CA of a cluster and the client identity the simulated nodes'
/// machined uses to reach their etcd members.
pub struct EtcdPki {
    ca: Ca,
    admin: CertAndKey,
    client: Arc<ClientConfig>,
}

impl std::fmt::Debug for EtcdPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdPki").finish_non_exhaustive()
    }
}

/// Where one member's certificates were written.
#[derive(Debug, Clone)]
pub(crate) struct MemberCerts {
    /// The etcd CA certificate (`trusted-ca-file`, `peer-trusted-ca-file`).
    pub ca: PathBuf,
    /// The server certificate and key (`cert-file`, `key-file`).
    pub server: (PathBuf, PathBuf),
    /// The peer certificate and key (`peer-cert-file`, `peer-key-file`).
    pub peer: (PathBuf, PathBuf),
}

impl EtcdPki {
    /// The TLS material of a cluster whose etcd CA is `ca`: issues
    /// machined's client certificate (`CN=talos`).
    pub(crate) fn new(ca: Ca) -> Result<EtcdPki, SimError> {
        let admin = ca.issue(&client_spec("talos"))?;
        let client = Credentials::from_pem(
            ca.cert_pem.as_bytes(),
            admin.cert_pem.as_bytes(),
            admin.key_pem.as_bytes(),
        )
        .client_config()?;
        Ok(EtcdPki { ca, admin, client })
    }

    /// The etcd CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca.cert_pem
    }

    /// The client certificate machined presents (`CN=talos`), PEM.
    pub fn client_cert_pem(&self) -> &str {
        &self.admin.cert_pem
    }

    /// The key of [`EtcdPki::client_cert_pem`], PEM. Never log it.
    pub fn client_key_pem(&self) -> &str {
        &self.admin.key_pem
    }

    /// The rustls configuration of a client of this cluster's etcd.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }

    /// Issues a member's server and peer certificates for `name` at `ip`
    /// and writes them, with the CA, under `dir` (0600).
    pub(crate) fn write_member(
        &self,
        dir: &Path,
        name: &str,
        ip: Ipv4Addr,
    ) -> Result<MemberCerts, SimError> {
        let ips = [IpAddr::V4(ip), IpAddr::V4(Ipv4Addr::LOCALHOST)];
        // The server certificate also names localhost; the peer one does
        // not (certs.go: buildOptions(true, true) and (true, false)). etcd
        // checks a peer's certificate against the address the connection
        // comes from, and on loopback every member dials from 127.0.0.1
        // whatever its own address: both certificates name it.
        let mut server = LeafSpec::server(&ips, &[name, "localhost"]).usage(Usage::Both);
        server.common_name = Some(name.to_string());
        let mut peer = LeafSpec::server(&ips, &[name]).usage(Usage::Both);
        peer.common_name = Some(name.to_string());
        let ca = dir.join("ca.crt");
        write(&ca, &self.ca.cert_pem)?;
        let server = self.write_pair(dir, "server", &server)?;
        let peer = self.write_pair(dir, "peer", &peer)?;
        Ok(MemberCerts { ca, server, peer })
    }

    /// Issues a client certificate `CN=common_name` and writes it and its
    /// key as `dir/NAME.crt` and `dir/NAME.key`; returns their paths.
    pub(crate) fn write_client(
        &self,
        dir: &Path,
        file: &str,
        common_name: &str,
    ) -> Result<(PathBuf, PathBuf), SimError> {
        self.write_pair(dir, file, &client_spec(common_name))
    }

    fn write_pair(
        &self,
        dir: &Path,
        file: &str,
        spec: &LeafSpec,
    ) -> Result<(PathBuf, PathBuf), SimError> {
        let issued = self.ca.issue(spec)?;
        let (crt, key) = (
            dir.join(format!("{file}.crt")),
            dir.join(format!("{file}.key")),
        );
        write(&crt, &issued.cert_pem)?;
        write(&key, &issued.key_pem)?;
        Ok((crt, key))
    }
}

/// A client certificate from the etcd CA: ClientAuth only, no roles.
fn client_spec(common_name: &str) -> LeafSpec {
    let mut spec = LeafSpec::client(&[]);
    spec.common_name = Some(common_name.to_string());
    spec
}

fn write(path: &Path, text: &str) -> Result<(), SimError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| SimError::io(parent, e))?;
    }
    talos_client::write_private_file(path, text.as_bytes()).map_err(|e| SimError::io(path, e))
}

/// Dials an etcd member's `https://ip:port` and performs the TLS handshake,
/// verifying the member's certificate against the etcd CA.
#[derive(Clone)]
pub(crate) struct Connector {
    pub(crate) tls: Arc<ClientConfig>,
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl tower::Service<http::Uri> for Connector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let name = ServerName::try_from(this.host.clone())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let tcp = TcpStream::connect((this.host.as_str(), this.port)).await?;
            tcp.set_nodelay(true)?;
            let stream = tokio_rustls::TlsConnector::from(this.tls)
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(stream))
        })
    }
}

/// A channel to an etcd member whose calls end at the deadline they carry
/// (`grpc-timeout`), the wait for a connection included, as grpc-go's calls
/// end at their context's deadline: etcd's client waits for a ready
/// connection (WaitForReady), so a member that accepts the connection and
/// never completes the TLS handshake (a frozen process) holds a call until
/// its deadline, as on a Talos node, instead of failing at a connect
/// timeout. A call without a deadline waits until its caller gives up.
#[derive(Clone)]
pub(crate) struct DeadlineChannel(pub(crate) tonic::transport::Channel);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<http::Request<tonic::body::Body>> for DeadlineChannel {
    type Response = http::Response<tonic::body::Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let deadline = request
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(grpc_timeout);
        let call = self.0.call(request);
        Box::pin(async move {
            match deadline {
                None => call.await.map_err(Into::into),
                Some(deadline) => match tokio::time::timeout(deadline, call).await {
                    Ok(result) => result.map_err(Into::into),
                    Err(_) => Err(Box::new(tonic::Status::deadline_exceeded(
                        "context deadline exceeded",
                    )) as BoxError),
                },
            }
        })
    }
}

/// A `grpc-timeout` header's value: digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(value: &str) -> Option<std::time::Duration> {
    use std::time::Duration;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::grpc_timeout;
    use std::time::Duration;

    #[test]
    fn grpc_timeouts_parse_with_their_units() {
        assert_eq!(grpc_timeout("10S"), Some(Duration::from_secs(10)));
        assert_eq!(grpc_timeout("1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(grpc_timeout("5x"), None);
        assert_eq!(grpc_timeout(""), None);
    }
}
