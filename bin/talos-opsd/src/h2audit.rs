//! An audit line for the requests that HTTP/2 itself refuses on the Unix
//! socket, before any of the daemon's code sees them. The HTTP/2 server
//! (h2, under tonic) resets a stream whose headers are malformed with
//! `PROTOCOL_ERROR` and logs nothing at the default level; the usual cause
//! is a gRPC C-core client (grpc-python among them) that sends the socket's
//! path as `:authority` for a `unix:` target (`run%2Ftalos-opsd%2Ftalos-opsd.sock`
//! is no URI authority). Accepting such a request would mean rewriting the
//! client's compressed (HPACK) header blocks in front of the API; the fix
//! is the client's (`grpc.default_authority`, see docs/talos-opsd.md), and this
//! makes the refusal visible: the frames the server writes are scanned
//! (server frames only, from the first byte: over the socket HTTP/2 has no
//! TLS and the server sends no preface), and a `RST_STREAM` or `GOAWAY`
//! with an error is audited with the peer's credentials.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tonic::transport::server::Connected;

const RST_STREAM: u8 = 0x3;
const GOAWAY: u8 = 0x7;
const PROTOCOL_ERROR: u32 = 0x1;
/// Larger than any frame a server may send (2^24 - 1 is the cap of the
/// length field; h2 sends at most 16 KiB unless told otherwise).
const MAX_FRAME: usize = 1 << 24;

/// Where the scan stands in the server's frames.
#[derive(Debug, Default)]
pub struct Frames {
    head: Vec<u8>,
    kind: u8,
    stream: u32,
    left: usize,
    payload: Vec<u8>,
    /// Stops at anything that does not look like HTTP/2 frames.
    lost: bool,
}

/// A refusal seen in the server's frames.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A stream reset with an error code.
    Reset { stream: u32, code: u32 },
    /// The connection ended with an error code.
    GoAway { code: u32 },
}

impl Frames {
    /// Scans `bytes`, the next the server wrote; returns the refusals in
    /// them.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Vec<Refusal> {
        let mut found = Vec::new();
        while !bytes.is_empty() && !self.lost {
            if self.head.len() < 9 {
                let take = (9 - self.head.len()).min(bytes.len());
                self.head.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if self.head.len() < 9 {
                    break;
                }
                let h = &self.head;
                self.left =
                    (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
                self.kind = h[3];
                self.stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                self.payload.clear();
                if self.left >= MAX_FRAME {
                    self.lost = true;
                    break;
                }
            }
            let take = self.left.min(bytes.len());
            if matches!(self.kind, RST_STREAM | GOAWAY) && self.payload.len() < 8 {
                let keep = take.min(8 - self.payload.len());
                self.payload.extend_from_slice(&bytes[..keep]);
            }
            bytes = &bytes[take..];
            self.left -= take;
            if self.left == 0 {
                found.extend(self.refusal());
                self.head.clear();
            }
        }
        found
    }

    fn refusal(&self) -> Option<Refusal> {
        let code = |at: usize| {
            self.payload
                .get(at..at + 4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        };
        match self.kind {
            RST_STREAM => Some(Refusal::Reset {
                stream: self.stream,
                code: code(0)?,
            })
            .filter(|r| matches!(r, Refusal::Reset { code, .. } if *code == PROTOCOL_ERROR)),
            GOAWAY => code(4)
                .filter(|c| *c != 0)
                .map(|code| Refusal::GoAway { code }),
            _ => None,
        }
    }
}

/// A Unix socket connection whose refusals by HTTP/2 are audited.
pub struct Audited {
    inner: UnixStream,
    who: String,
    /// The user, the unit its audit lines are bounded in.
    user: String,
    frames: Frames,
}

impl Audited {
    /// `inner`, audited as its peer's credentials.
    pub fn new(inner: UnixStream) -> Audited {
        let (who, user) = match inner.peer_cred() {
            Ok(cred) => (
                format!(
                    "uid={} pid={}",
                    cred.uid(),
                    cred.pid().map_or("?".to_string(), |p| p.to_string())
                ),
                format!("uid={}", cred.uid()),
            ),
            Err(_) => (
                "unix socket peer (no credentials)".to_string(),
                "unix socket peer (no credentials)".to_string(),
            ),
        };
        Audited {
            inner,
            who,
            user,
            frames: Frames::default(),
        }
    }

    fn audit(&mut self, written: &[u8]) {
        for refusal in self.frames.feed(written) {
            if !crate::ratelimit::audit_allowed(&self.user) {
                continue;
            }
            match refusal {
                Refusal::Reset { stream, .. } => tracing::warn!(
                    target: "audit",
                    who = %self.who,
                    stream,
                    "request refused before it reached the API: its HTTP/2 headers are malformed (stream reset, PROTOCOL_ERROR); most often an :authority that is not a host name, as gRPC C-core clients (grpc-python among them) send for a unix: target: set the client's authority to localhost (grpc.default_authority)"
                ),
                Refusal::GoAway { code } => tracing::warn!(
                    target: "audit",
                    who = %self.who,
                    code,
                    "connection ended by HTTP/2 with an error (GOAWAY): the peer does not speak HTTP/2 as gRPC does"
                ),
            }
        }
    }
}

impl Connected for Audited {
    type ConnectInfo = <UnixStream as Connected>::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl AsyncRead for Audited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Audited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            self.audit(&buf[..n]);
        }
        written
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, 0];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// A reset with PROTOCOL_ERROR is found however the writes split the
    /// frames; other frames and other reset codes are not refusals.
    #[test]
    fn refusals_are_found_across_split_writes() {
        let mut bytes = frame(0x4, 0, &[0, 3, 0, 0, 0, 100]);
        bytes.extend(frame(RST_STREAM, 3, &8u32.to_be_bytes()));
        bytes.extend(frame(0x1, 1, &[0x88]));
        bytes.extend(frame(RST_STREAM, 5, &PROTOCOL_ERROR.to_be_bytes()));
        let mut goaway = 5u32.to_be_bytes().to_vec();
        goaway.extend_from_slice(&PROTOCOL_ERROR.to_be_bytes());
        bytes.extend(frame(GOAWAY, 0, &goaway));
        for split in [1, 2, 7, 9, 10, bytes.len()] {
            let mut frames = Frames::default();
            let found: Vec<_> = bytes.chunks(split).flat_map(|c| frames.feed(c)).collect();
            assert_eq!(
                found,
                [
                    Refusal::Reset {
                        stream: 5,
                        code: PROTOCOL_ERROR
                    },
                    Refusal::GoAway {
                        code: PROTOCOL_ERROR
                    }
                ],
                "split {split}"
            );
        }
    }
}
