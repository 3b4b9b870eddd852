//! Serving tonic services over mutual TLS on a TCP listener, the way apid
//! does, and reading the caller's roles from its certificate.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::ServerConfig;
use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

use crate::tls::roles_of;

/// A server-side mutual-TLS connection; tonic exposes its [`PeerInfo`] in
/// every request's extensions. When its cancellation token fires, reads and
/// writes fail at once, so the connection dies like a powered-off host's.
pub struct MtlsStream {
    inner: TlsStream<TcpStream>,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Whether the pending small write has already let the other ready
    /// tasks run once (see [`MtlsStream::gather`]).
    deferred: bool,
}

/// Writes shorter than this wait for the other ready tasks once.
const GATHER_BELOW: usize = 8 * 1024;

impl MtlsStream {
    /// Lets the tasks already ready run once before a small write goes out,
    /// so that the answers of many concurrent calls on one connection leave
    /// in a few TLS records and syscalls instead of one each (50 nodes'
    /// answers to a fanned-out call otherwise cost 50 loopback sends, on
    /// the same 2 cores the client needs). The wake puts the connection
    /// task behind the tasks already queued; it runs again at once when
    /// there are none.
    fn gather(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<()> {
        if len >= GATHER_BELOW || self.deferred {
            self.deferred = false;
            return Poll::Ready(());
        }
        self.deferred = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn check(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        if self.cancelled.as_mut().poll(cx).is_ready() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "host is down",
            ));
        }
        Ok(())
    }
}

/// Who is on the other end of a [`MtlsStream`].
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The client's address.
    pub remote_addr: Option<SocketAddr>,
    /// The client's certificate chain, leaf first.
    pub certificates: Arc<Vec<CertificateDer<'static>>>,
    /// The roles (Organization values) of the leaf, read once per
    /// connection rather than once per call.
    pub roles: Arc<Vec<String>>,
}

impl PeerInfo {
    /// A peer presenting the certificate in `pem` from no address.
    pub(crate) fn of_certificate_pem(pem: &str) -> Result<PeerInfo, crate::SimError> {
        use rustls_pki_types::pem::PemObject as _;
        let leaf = CertificateDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| crate::SimError::Refused(format!("proxy certificate: {e}")))?;
        let roles = roles_of(&leaf)
            .map_err(|e| crate::SimError::Refused(format!("proxy certificate: {e}")))?;
        Ok(PeerInfo {
            remote_addr: None,
            certificates: Arc::new(vec![leaf]),
            roles: Arc::new(roles),
        })
    }
}

impl Connected for MtlsStream {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        let (tcp, session) = self.inner.get_ref();
        let certificates: Vec<CertificateDer<'static>> = session
            .peer_certificates()
            .map(|certs| certs.iter().map(|c| c.clone().into_owned()).collect())
            .unwrap_or_default();
        let roles = certificates
            .first()
            .and_then(|leaf| roles_of(leaf).ok())
            .unwrap_or_default();
        PeerInfo {
            remote_addr: tcp.peer_addr().ok(),
            certificates: Arc::new(certificates),
            roles: Arc::new(roles),
        }
    }
}

impl AsyncRead for MtlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for MtlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.check(cx)?;
        std::task::ready!(self.gather(cx, buf.len()));
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.check(cx)?;
        std::task::ready!(self.gather(cx, bufs.iter().map(|b| b.len()).sum()));
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Accepts connections on `listener` and completes TLS handshakes
/// concurrently; yields only connections whose handshake succeeded (a bad
/// client certificate fails its own connection, nothing else). The accept
/// loop ends when the returned stream is dropped or `cancel` fires; `cancel`
/// also breaks every connection accepted here.
pub fn tls_incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    cancel: CancellationToken,
) -> ReceiverStream<std::io::Result<MtlsStream>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                },
                () = tx.closed() => return,
                () = cancel.cancelled() => return,
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                match acceptor.accept(tcp).await {
                    Ok(inner) => {
                        let stream = MtlsStream {
                            inner,
                            cancelled: Box::pin(cancel.cancelled_owned()),
                            deferred: false,
                        };
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Err(e) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Serves `routes` over HTTP/2 on every connection `incoming` yields, until
/// `cancel` fires, with each request's [`PeerInfo`] in its extensions.
///
/// Not tonic's `transport::Server`: that one ends a call whose
/// `grpc-timeout` passed with its own Cancelled "Timeout expired". A
/// grpc-go server (Talos's apid and machined) lets the handler see its
/// context end instead, so a call waiting on something (etcd's WaitForReady
/// client) fails with DeadlineExceeded, or the client gives up first by its
/// own deadline; here the client's deadline or cancellation drops the
/// handler.
pub(crate) async fn serve_http2(
    mut incoming: ReceiverStream<std::io::Result<MtlsStream>>,
    routes: tonic::service::Routes,
    cancel: CancellationToken,
) {
    use tokio_stream::StreamExt as _;
    let routes = routes.prepare();
    let mut http2 =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    http2.http2().timer(hyper_util::rt::TokioTimer::new());
    let http2 = http2.http2_only();
    loop {
        let stream = tokio::select! {
            next = incoming.next() => match next {
                Some(Ok(stream)) => stream,
                Some(Err(_)) => continue,
                None => return,
            },
            () = cancel.cancelled() => return,
        };
        let service = WithPeer {
            info: stream.connect_info(),
            inner: routes.clone(),
        };
        let connection = http2.serve_connection(
            hyper_util::rt::TokioIo::new(stream),
            hyper_util::service::TowerToHyperService::new(service),
        );
        let connection = connection.into_owned();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
}

/// Puts the connection's [`PeerInfo`] into every request, as tonic's
/// server does for a [`Connected`] stream.
#[derive(Clone)]
struct WithPeer<S> {
    info: PeerInfo,
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for WithPeer<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        request.extensions_mut().insert(self.info.clone());
        self.inner.call(request)
    }
}

/// The roles (Organization values) of the client certificate a request
/// arrived with; empty when there is none.
pub fn peer_roles<T>(request: &tonic::Request<T>) -> Vec<String> {
    certificate_roles(request.extensions())
}

/// The roles of the client certificate recorded in a request's extensions
/// (as [`PeerInfo`]); empty when there is none.
pub fn certificate_roles(extensions: &http::Extensions) -> Vec<String> {
    extensions
        .get::<PeerInfo>()
        .map(|peer| peer.roles.as_ref().clone())
        .unwrap_or_default()
}
