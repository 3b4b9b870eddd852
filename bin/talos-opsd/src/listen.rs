//! Where the API listens: a Unix socket made mode 0600 before the first
//! connection is accepted, and optionally TCP with mutual TLS against a
//! client CA of the daemon's own (never plain TCP).

use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
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

/// Binds the socket at `path` (replacing a stale one) so that it is never
/// reachable with another mode than 0600: it is bound in a private
/// directory (0700) beside `path`, given its mode there, and renamed into
/// place. Refuses a directory that another user owns or that group or
/// others may write (anyone could swap the socket, or a symlink, in).
pub fn bind_unix(path: &Path) -> anyhow::Result<UnixListener> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    if !parent.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    check_socket_dir(&parent)?;
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => anyhow::bail!("{}: another daemon is listening there", path.display()),
        Err(_) => {
            use std::os::unix::fs::FileTypeExt as _;
            if let Ok(meta) = std::fs::symlink_metadata(path)
                && !meta.file_type().is_socket()
            {
                anyhow::bail!("{}: exists and is not a socket", path.display());
            }
        }
    }
    let private = parent.join(format!(".talos-opsd-bind.{}", std::process::id()));
    if std::fs::symlink_metadata(&private).is_ok() {
        // Left by a crash of a process with our pid; the directory is ours.
        std::fs::remove_dir_all(&private)
            .with_context(|| format!("removing {}", private.display()))?;
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .with_context(|| format!("creating {}", private.display()))?;
    let staged = private.join("s");
    let bound = UnixListener::bind(&staged)
        .with_context(|| format!("binding {}", path.display()))
        .and_then(|l| {
            std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("chmod 0600 {}", staged.display()))?;
            std::fs::rename(&staged, path)
                .with_context(|| format!("moving the socket to {}", path.display()))?;
            Ok(l)
        });
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&private);
    let listener = bound?;
    Ok(listener)
}

/// Refuses `dir` as the socket's directory when another user owns it or
/// group or others may write to it.
pub fn check_socket_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(dir).with_context(|| format!("{}", dir.display()))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        anyhow::bail!(
            "{}: the socket's directory is owned by uid {}, not by this user (uid {me}): use a directory of the daemon's own",
            dir.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o022 != 0 {
        anyhow::bail!(
            "{}: the socket's directory is writable by group or others (mode {:o}): use a directory of the daemon's own, e.g. chmod 0700",
            dir.display(),
            meta.mode() & 0o7777
        );
    }
    Ok(())
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
    fn new(stream: TlsStream<TcpStream>, addr: SocketAddr, slot: crate::slots::Slot) -> TlsConn {
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
            stream: accept::Held::new(stream, slot),
            peer: TlsPeer { subject, addr },
        }
    }
}

tokio::task_local! {
    /// The subject of the client certificate offered in the handshake the
    /// current task runs (set by [`Recording`] as it verifies it).
    static OFFERED: std::cell::RefCell<Option<String>>;
}

/// The TLS handshake on `tcp`, within [`accept::TLS_HANDSHAKE_TIMEOUT`];
/// a refusal or a timeout is audited with the offered certificate's subject
/// (quoted and cut, for it is the peer's text), or that none was offered.
async fn handshake_with(
    acceptor: &tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    addr: SocketAddr,
) -> Option<TlsStream<TcpStream>> {
    let offered = std::cell::RefCell::new(None);
    let spoke = std::sync::atomic::AtomicBool::new(false);
    let handshake = tokio::time::timeout(accept::TLS_HANDSHAKE_TIMEOUT, async {
        // Whether the peer sent anything at all, for the audit line.
        tcp.peek(&mut [0u8; 1]).await?;
        spoke.store(true, std::sync::atomic::Ordering::Relaxed);
        acceptor.accept(tcp).await
    });
    let (result, offered) = OFFERED
        .scope(offered, async {
            let result = handshake.await;
            (result, OFFERED.with(|o| o.borrow_mut().take()))
        })
        .await;
    let cert = match offered {
        Some(subject) => format!(
            "client certificate {:?}",
            crate::input::truncated(&subject, 256)
        ),
        None => "no client certificate".to_string(),
    };
    if !matches!(result, Ok(Ok(_))) && !crate::ratelimit::audit_allowed(&addr.ip().to_string()) {
        return None;
    }
    match result {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            tracing::warn!(target: "audit", who = %addr, offered = %cert, "TLS handshake refused: {e}");
            None
        }
        Err(_) if !spoke.load(std::sync::atomic::Ordering::Relaxed) => {
            tracing::warn!(target: "audit", who = %addr, "connection closed: it sent nothing within the TLS handshake timeout ({:?})", accept::TLS_HANDSHAKE_TIMEOUT);
            None
        }
        Err(_) => {
            tracing::warn!(target: "audit", who = %addr, offered = %cert, "TLS handshake timed out: not completed within {:?}", accept::TLS_HANDSHAKE_TIMEOUT);
            None
        }
    }
}

/// The client certificate verifier of the TCP listener: the given one,
/// which decides, noting the subject of the certificate offered for the
/// audit line of a refused handshake.
#[derive(Debug)]
struct Recording(Arc<dyn rustls::server::danger::ClientCertVerifier>);

impl rustls::server::danger::ClientCertVerifier for Recording {
    fn offer_client_auth(&self) -> bool {
        self.0.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.0.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        let subject = x509_parser::parse_x509_certificate(end_entity.as_ref())
            .map(|(_, cert)| cert.subject().to_string())
            .unwrap_or_else(|_| "(not a parsable X.509 certificate)".into());
        let _ = OFFERED.try_with(|o| *o.borrow_mut() = Some(subject));
        self.0.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

impl Connected for TlsConn {
    type ConnectInfo = accept::Conn<TlsPeer>;
    fn connect_info(&self) -> Self::ConnectInfo {
        accept::Conn {
            peer: self.peer.clone(),
            state: std::sync::Arc::clone(self.stream.state()),
        }
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
        .with_client_cert_verifier(Arc::new(Recording(verifier)))
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
    let handshakes = crate::handshakes::Handshakes::new(accept::MAX_TLS_HANDSHAKES);
    let listener = Arc::new(listener);
    tokio::spawn(async move {
        accept::run(
            "tcp",
            crate::slots::Slots::new("tcp", accept::MAX_TCP_CONNECTIONS),
            || {
                let listener = Arc::clone(&listener);
                async move {
                    let (tcp, addr) = listener.accept().await?;
                    Ok(((tcp, addr), addr.ip().to_string()))
                }
            },
            |(tcp, addr), conn_slot| {
                let slot = match handshakes.admit(addr.ip()) {
                    Ok((slot, evicted)) => {
                        if let Some(ip) = evicted
                            && crate::ratelimit::audit_allowed(&ip.to_string())
                        {
                            tracing::warn!(target: "audit", who = %ip, "TLS handshake abandoned: all {} handshake slots were taken and this address held the most", accept::MAX_TLS_HANDSHAKES);
                        }
                        slot
                    }
                    Err(refused) => {
                        if crate::ratelimit::audit_allowed(&addr.ip().to_string()) {
                            tracing::warn!(target: "audit", who = %addr, "TLS handshake refused: {refused}");
                        }
                        return;
                    }
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut slot = slot;
                    let state = std::sync::Arc::clone(&conn_slot.state);
                    let stream = tokio::select! {
                        stream = handshake_with(&acceptor, tcp, addr) => stream,
                        _ = &mut slot.abandoned => None,
                        // Its connection slot was taken by a newer one.
                        _ = state.until_closed() => None,
                    };
                    let Some(stream) = stream else {
                        return;
                    };
                    drop(slot);
                    let _ = tx.send(Ok(TlsConn::new(stream, addr, conn_slot))).await;
                });
            },
        )
        .await;
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    #[tokio::test]
    async fn a_socket_dir_writable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for bits in [0o777, 0o770, 0o702] {
            let sub = dir.path().join(format!("d{bits:o}"));
            std::fs::create_dir(&sub).unwrap();
            std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(bits)).unwrap();
            let e = bind_unix(&sub.join("s.sock")).unwrap_err().to_string();
            assert!(e.contains("writable by group or others"), "{bits:o}: {e}");
            assert!(!sub.join("s.sock").exists());
        }
    }

    #[tokio::test]
    async fn a_socket_dir_of_another_user_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        // SAFETY: geteuid has no preconditions.
        let sub = if unsafe { libc::geteuid() } == 0 {
            let sub = dir.path().join("theirs");
            std::fs::create_dir(&sub).unwrap();
            std::os::unix::fs::chown(&sub, Some(65534), Some(65534)).unwrap();
            sub
        } else {
            PathBuf::from("/")
        };
        let e = bind_unix(&sub.join("s.sock")).unwrap_err().to_string();
        assert!(e.contains("not by this user"), "{e}");
    }

    /// Under umask 000 the socket still appears only as 0600 (it is made in
    /// a private directory and renamed), nothing is left beside it, and a
    /// symlink at its path is refused without touching its target.
    #[tokio::test]
    async fn the_socket_is_0600_whatever_the_umask_and_symlinks_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run").join("s.sock");
        // SAFETY: umask has no preconditions; restored below.
        let old = unsafe { libc::umask(0) };
        let bound = bind_unix(&path);
        unsafe { libc::umask(old) };
        let _listener = bound.unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        let left: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("s.sock")]);

        let target = dir.path().join("target");
        std::fs::write(&target, "x").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = dir.path().join("run").join("link.sock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = bind_unix(&link).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(mode(&target), 0o644);
    }
}
