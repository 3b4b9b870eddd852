//! A bound on the audit lines one peer makes the daemon write about its
//! connections (refused or abandoned handshakes, connections closed for
//! being slow or idle, requests HTTP/2 refused): a peer that opens
//! connections in a loop would otherwise fill the log. Per peer (an
//! address, or a Unix socket user), at most [`LINES_PER_WINDOW`] such lines
//! per [`WINDOW`]; the first line held back says so, and the next line
//! after the window says how many were held back.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The lines one peer may cause per window.
pub const LINES_PER_WINDOW: u32 = 10;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Peers remembered at most; the oldest windows are forgotten first.
const MAX_PEERS: usize = 4096;

#[derive(Debug)]
struct Window {
    start: Instant,
    lines: u32,
    held_back: u32,
}

/// The windows of every peer that caused a line lately.
#[derive(Debug, Default)]
pub struct Limiter {
    peers: Mutex<HashMap<String, Window>>,
}

/// Whether to write a line, and what to say about lines held back.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Write it; `held_back` lines of this peer were not written in its
    /// previous window.
    Write {
        /// Lines held back before this one.
        held_back: u32,
    },
    /// The first line held back in this window: write one line saying
    /// further lines are held back.
    FirstHeldBack,
    /// Hold it back.
    HeldBack,
}

impl Limiter {
    /// What to do with a line from `peer` at `now`.
    pub fn check(&self, peer: &str, now: Instant) -> Verdict {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if peers.len() >= MAX_PEERS && !peers.contains_key(peer) {
            peers.retain(|_, w| now.duration_since(w.start) < WINDOW);
            if peers.len() >= MAX_PEERS {
                let oldest = peers
                    .iter()
                    .min_by_key(|(_, w)| w.start)
                    .map(|(p, _)| p.clone());
                if let Some(oldest) = oldest {
                    peers.remove(&oldest);
                }
            }
        }
        let window = peers.entry(peer.to_string()).or_insert(Window {
            start: now,
            lines: 0,
            held_back: 0,
        });
        let mut held_back = 0;
        if now.duration_since(window.start) >= WINDOW {
            held_back = window.held_back;
            *window = Window {
                start: now,
                lines: 0,
                held_back: 0,
            };
        }
        if window.lines < LINES_PER_WINDOW {
            window.lines += 1;
            return Verdict::Write { held_back };
        }
        window.held_back += 1;
        if window.held_back == 1 {
            Verdict::FirstHeldBack
        } else {
            Verdict::HeldBack
        }
    }
}

fn limiter() -> &'static Limiter {
    static LIMITER: OnceLock<Limiter> = OnceLock::new();
    LIMITER.get_or_init(Limiter::default)
}

/// Whether an audit line about `peer`'s connection is to be written now;
/// writes the line that says lines are (or were) held back.
pub fn audit_allowed(peer: &str) -> bool {
    match limiter().check(peer, Instant::now()) {
        Verdict::Write { held_back: 0 } => true,
        Verdict::Write { held_back } => {
            tracing::warn!(target: "audit", who = %peer, held_back, "{held_back} audit lines about this peer's connections were held back in the previous {} s", WINDOW.as_secs());
            true
        }
        Verdict::FirstHeldBack => {
            tracing::warn!(target: "audit", who = %peer, "more than {LINES_PER_WINDOW} audit lines about this peer's connections within {} s: further ones are held back and counted", WINDOW.as_secs());
            false
        }
        Verdict::HeldBack => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_its_share_then_a_count() {
        let limiter = Limiter::default();
        let t0 = Instant::now();
        for _ in 0..LINES_PER_WINDOW {
            assert_eq!(limiter.check("a", t0), Verdict::Write { held_back: 0 });
        }
        assert_eq!(limiter.check("a", t0), Verdict::FirstHeldBack);
        assert_eq!(limiter.check("a", t0), Verdict::HeldBack);
        // Another peer is not held back by the first.
        assert_eq!(limiter.check("b", t0), Verdict::Write { held_back: 0 });
        assert_eq!(
            limiter.check("a", t0 + WINDOW),
            Verdict::Write { held_back: 2 }
        );
        assert_eq!(
            limiter.check("a", t0 + WINDOW),
            Verdict::Write { held_back: 0 }
        );
    }
}
