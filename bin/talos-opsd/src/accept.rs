//! Accept loops that stay bounded under pressure: at most a fixed number of
//! connections at once per listener, shared fairly ([`crate::slots`]: when
//! all are taken, the connection idle the longest makes room); a connection
//! must send the head of its first request within [`HEADER_TIMEOUT`] and is
//! closed after [`IDLE_TIMEOUT`] without a request; and an accept error
//! (EMFILE and ENFILE above all: out of descriptors) backs off instead of
//! retrying at once, which would spin a core while the pending connection
//! stays queued.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

use crate::slots::{Closed, ConnState, Slot, Slots};

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
/// How long a connection has, from its accept (on TCP: from its completed
/// handshake), to send the head of its first request: the HTTP/2 preface
/// on the API, the request line and headers on the metrics listener.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection may stay without a request in progress before it
/// is closed (a client reconnects when it next calls).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Concurrent HTTP/2 streams (calls) per API connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 64;
/// The largest request message the API decodes: a larger one is refused
/// before it is decoded. Room for one parameter far over its own bound
/// (refused by name), none for a request that would cost tens of
/// megabytes to decode (a real one is a few kilobytes).
pub const MAX_REQUEST_BYTES: usize = 2 * 1024 * 1024;
/// Connections served at once on the metrics listener.
pub const MAX_METRICS_CONNECTIONS: usize = 16;
/// The first pause after a failed accept; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// The longest pause after failed accepts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The HTTP/2 connection preface's length: a client has spoken once it
/// sent this much.
const PREFACE_LEN: usize = 24;

/// Runs `accept` forever: each accepted connection (with its peer, for
/// audit lines) gets a slot of `slots`, taking that of the connection idle
/// the longest when all are taken (or waiting while every connection has a
/// request in progress), and goes to `handle` with it. Errors back off.
pub async fn run<T, A, Fut>(
    what: &'static str,
    slots: Slots,
    mut accept: A,
    mut handle: impl FnMut(T, Slot),
) where
    A: FnMut() -> Fut,
    Fut: Future<Output = io::Result<(T, String)>>,
{
    let mut backoff = FIRST_BACKOFF;
    loop {
        match accept().await {
            Ok((conn, peer)) => {
                backoff = FIRST_BACKOFF;
                let slot = slots.admit(peer).await;
                handle(conn, slot);
            }
            Err(e) => {
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

/// Who is at the other end of an API connection, and the connection's
/// state (for the request tracking of [`crate::track`]): what tonic hands
/// each request as its connection's info.
#[derive(Debug, Clone)]
pub struct Conn<T> {
    /// The transport's own info (Unix credentials, a TLS peer).
    pub peer: T,
    /// The connection's state.
    pub state: Arc<ConnState>,
}

/// An API connection that holds its listener's slot until it is dropped,
/// and fails its next read or write once the daemon closes it: evicted to
/// make room, no HTTP/2 preface within [`HEADER_TIMEOUT`], or idle for
/// [`IDLE_TIMEOUT`].
pub struct Held<S> {
    inner: S,
    slot: Slot,
    check: Pin<Box<tokio::time::Sleep>>,
    received: usize,
}

impl<S> Held<S> {
    /// `inner`, holding `slot`; its first request's head is due within
    /// [`HEADER_TIMEOUT`] from now.
    pub fn new(inner: S, slot: Slot) -> Self {
        Held {
            inner,
            slot,
            check: Box::pin(tokio::time::sleep(HEADER_TIMEOUT)),
            received: 0,
        }
    }

    /// The connection's state.
    pub fn state(&self) -> &Arc<ConnState> {
        &self.slot.state
    }

    /// Closes the connection when its time is up; re-arms the check.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) {
        while self.check.as_mut().poll(cx).is_ready() {
            let state = &self.slot.state;
            let now = tokio::time::Instant::now();
            if !state.has_spoken() {
                if crate::ratelimit::audit_allowed(&state.peer) {
                    tracing::warn!(target: "audit", who = %state.peer, "connection closed: no request within {HEADER_TIMEOUT:?} of connecting");
                }
                state.close(Closed::Slow);
                return;
            }
            match state.idle_for(now.into_std()) {
                Some(idle) if idle >= IDLE_TIMEOUT => {
                    tracing::debug!(who = %state.peer, "connection closed: idle for {idle:?}");
                    state.close(Closed::Idle);
                    return;
                }
                Some(idle) => self.check.as_mut().reset(now + (IDLE_TIMEOUT - idle)),
                None => self.check.as_mut().reset(now + IDLE_TIMEOUT),
            }
        }
    }

    fn refused(&self) -> Option<io::Error> {
        let why = self.slot.state.closed()?;
        let what = match why {
            Closed::Evicted => "closed to make room for a newer connection",
            Closed::Slow => "no request within the header timeout",
            Closed::Idle => "idle too long",
        };
        Some(io::Error::new(io::ErrorKind::TimedOut, what))
    }
}

impl<S: Connected> Connected for Held<S> {
    type ConnectInfo = Conn<S::ConnectInfo>;
    fn connect_info(&self) -> Self::ConnectInfo {
        Conn {
            peer: self.inner.connect_info(),
            state: Arc::clone(&self.slot.state),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Held<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.slot.state.waker.register(cx.waker());
        self.poll_deadline(cx);
        if let Some(e) = self.refused() {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read
            && !self.slot.state.has_spoken()
        {
            self.received += buf.filled().len() - before;
            if self.received >= PREFACE_LEN {
                self.slot.state.spoke();
            }
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Held<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.refused() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The peer of a Unix socket connection, for audit lines: its user (the
/// unit a same-user flood is counted in).
fn unix_peer(stream: &tokio::net::UnixStream) -> String {
    match stream.peer_cred() {
        Ok(cred) => format!("uid={}", cred.uid()),
        Err(_) => "unix socket peer (no credentials)".into(),
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
            Slots::new("unix", MAX_UNIX_CONNECTIONS),
            || {
                let listener = Arc::clone(&listener);
                async move {
                    let (stream, _) = listener.accept().await?;
                    let peer = unix_peer(&stream);
                    Ok((stream, peer))
                }
            },
            |stream, slot| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let stream = crate::h2audit::Audited::new(stream);
                    let _ = tx.send(Ok(Held::new(stream, slot))).await;
                });
            },
        )
        .await;
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
