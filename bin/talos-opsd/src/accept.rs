//! Accept loops that stay bounded under pressure: at most a fixed number of
//! connections at once per listener (the rest wait in the kernel's backlog),
//! and an accept error (EMFILE and ENFILE above all: out of descriptors)
//! backs off instead of retrying at once, which would spin a core while the
//! pending connection stays queued.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::Connected;

/// Connections served at once on the Unix socket.
pub const MAX_UNIX_CONNECTIONS: usize = 256;
/// Connections served at once on the TCP listener, handshakes included.
pub const MAX_TCP_CONNECTIONS: usize = 256;
/// TLS handshakes in progress at once; a peer that sends nothing holds one
/// for at most [`TLS_HANDSHAKE_TIMEOUT`], and shares them fairly with
/// others ([`crate::handshakes`]).
pub const MAX_TLS_HANDSHAKES: usize = 64;
/// How long a TCP peer has to complete the TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Concurrent HTTP/2 streams (calls) per API connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 64;
/// Connections served at once on the metrics listener.
pub const MAX_METRICS_CONNECTIONS: usize = 16;
/// The first pause after a failed accept; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// The longest pause after failed accepts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Runs `accept` forever, at most `limit` connections at a time: each
/// accepted connection goes to `handle` with the permit that holds its
/// place (drop it when the connection ends). Errors back off.
pub async fn run<T, A, Fut>(
    what: &'static str,
    limit: usize,
    mut accept: A,
    mut handle: impl FnMut(T, OwnedSemaphorePermit),
) where
    A: FnMut() -> Fut,
    Fut: Future<Output = io::Result<T>>,
{
    let slots = Arc::new(Semaphore::new(limit));
    let mut backoff = FIRST_BACKOFF;
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        match accept().await {
            Ok(conn) => {
                backoff = FIRST_BACKOFF;
                handle(conn, permit);
            }
            Err(e) => {
                drop(permit);
                if backoff == FIRST_BACKOFF || backoff == MAX_BACKOFF {
                    tracing::warn!(
                        listener = what,
                        "accept failed, retrying in {backoff:?}{}: {e}",
                        if out_of_descriptors(&e) {
                            " (out of file descriptors: raise LimitNOFILE)"
                        } else {
                            ""
                        }
                    );
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Whether `e` is EMFILE or ENFILE.
pub fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// A connection that holds its listener's slot until it is dropped.
pub struct Held<S> {
    inner: S,
    _permit: OwnedSemaphorePermit,
}

impl<S> Held<S> {
    /// `inner`, holding `permit`.
    pub fn new(inner: S, permit: OwnedSemaphorePermit) -> Self {
        Held {
            inner,
            _permit: permit,
        }
    }
}

impl<S: Connected> Connected for Held<S> {
    type ConnectInfo = S::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Held<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Held<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The Unix socket's connections, bounded and backing off, as a stream for
/// tonic; what HTTP/2 refuses on them is audited
/// ([`crate::h2audit`]).
pub fn unix_incoming(
    listener: tokio::net::UnixListener,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<Held<crate::h2audit::Audited>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let listener = Arc::new(listener);
        run(
            "unix",
            MAX_UNIX_CONNECTIONS,
            || {
                let listener = Arc::clone(&listener);
                async move { listener.accept().await.map(|(s, _)| s) }
            },
            |stream, permit| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let stream = crate::h2audit::Audited::new(stream);
                    let _ = tx.send(Ok(Held::new(stream, permit))).await;
                });
            },
        )
        .await;
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
