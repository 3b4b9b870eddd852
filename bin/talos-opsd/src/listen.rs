//! Where the API listens: a Unix socket made mode 0600 before the first
//! connection is accepted, and optionally TCP with mutual TLS against a
//! client CA of the daemon's own (never plain TCP).

use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::Context as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixListener};
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;

use crate::accept;
use crate::config::TcpConfig;

/// The default socket: `$XDG_RUNTIME_DIR/talos-opsd.sock`, or
/// `/run/talos-opsd/talos-opsd.sock` as root.
pub fn default_socket() -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Some(PathBuf::from("/run/talos-opsd/talos-opsd.sock"));
    }
    std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join("talos-opsd.sock"))
}

/// Binds the socket at `path` (replacing a stale one) and sets mode 0600
/// before anything is accepted.
pub fn bind_unix(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => anyhow::bail!("{}: another daemon is listening there", path.display()),
        Err(_) if path.exists() => {
            use std::os::unix::fs::FileTypeExt as _;
            let is_socket = std::fs::symlink_metadata(path)
                .map(|m| m.file_type().is_socket())
                .unwrap_or(false);
            if !is_socket {
                anyhow::bail!("{}: exists and is not a socket", path.display());
            }
            std::fs::remove_file(path)
                .with_context(|| format!("removing the stale socket {}", path.display()))?
        }
        Err(_) => {}
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", path.display()))?;
    Ok(listener)
}

/// Who is on the other end of a TLS connection: the subject of the client
/// certificate its CA signed.
#[derive(Debug, Clone)]
pub struct TlsPeer {
    /// The certificate's subject (RFC 4514 style).
    pub subject: String,
    /// The remote address.
    pub addr: SocketAddr,
}

/// A TLS connection that tells tonic who the peer is (and holds its place
/// under the listener's connection cap).
pub struct TlsConn {
    stream: accept::Held<TlsStream<TcpStream>>,
    peer: TlsPeer,
}

impl TlsConn {
    fn new(
        stream: TlsStream<TcpStream>,
        addr: SocketAddr,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> TlsConn {
        let subject = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(|c| {
                x509_parser::parse_x509_certificate(c.as_ref())
                    .ok()
                    .map(|(_, cert)| cert.subject().to_string())
            })
            .unwrap_or_default();
        TlsConn {
            stream: accept::Held::new(stream, permit),
            peer: TlsPeer { subject, addr },
        }
    }
}

/// The TLS handshake on `tcp`, within [`accept::TLS_HANDSHAKE_TIMEOUT`];
/// a refusal or a timeout is audited.
async fn handshake_with(
    acceptor: &tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    addr: SocketAddr,
) -> Option<TlsStream<TcpStream>> {
    match tokio::time::timeout(accept::TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            tracing::warn!(target: "audit", who = %addr, "TLS handshake refused: {e}");
            None
        }
        Err(_) => {
            tracing::warn!(target: "audit", who = %addr, "TLS handshake timed out");
            None
        }
    }
}

impl Connected for TlsConn {
    type ConnectInfo = TlsPeer;
    fn connect_info(&self) -> TlsPeer {
        self.peer.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The TLS configuration: our certificate, and client certificates
/// required and verified against `client_ca` alone.
pub fn server_tls(config: &TcpConfig) -> anyhow::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&config.cert)
        .and_then(|i| i.collect())
        .with_context(|| format!("tcp.cert {}", config.cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(&config.key)
        .with_context(|| format!("tcp.key {}", config.key.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(&config.client_ca)
        .with_context(|| format!("tcp.client_ca {}", config.client_ca.display()))?
    {
        roots
            .add(ca.with_context(|| format!("tcp.client_ca {}", config.client_ca.display()))?)
            .with_context(|| format!("tcp.client_ca {}", config.client_ca.display()))?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .context("tcp.client_ca")?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .context("tcp.cert and tcp.key")?;
    tls.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tls)
}

/// Accepts TCP connections on `listener` and hands each completed mutual
/// TLS handshake to the returned stream; failed handshakes are logged.
pub fn tls_incoming(
    listener: tokio::net::TcpListener,
    tls: rustls::ServerConfig,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<TlsConn>> {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let handshakes = Arc::new(tokio::sync::Semaphore::new(accept::MAX_TLS_HANDSHAKES));
    let listener = Arc::new(listener);
    tokio::spawn(async move {
        accept::run(
            "tcp",
            accept::MAX_TCP_CONNECTIONS,
            || {
                let listener = Arc::clone(&listener);
                async move { listener.accept().await }
            },
            |(tcp, addr), permit| {
                let Ok(handshake) = Arc::clone(&handshakes).try_acquire_owned() else {
                    tracing::warn!(target: "audit", who = %addr, "TLS handshake refused: too many handshakes in progress");
                    return;
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let Some(stream) = handshake_with(&acceptor, tcp, addr).await else {
                        return;
                    };
                    drop(handshake);
                    let _ = tx.send(Ok(TlsConn::new(stream, addr, permit))).await;
                });
            },
        )
        .await;
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
