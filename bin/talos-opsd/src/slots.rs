//! The connection slots of a listener, shared fairly: each connection
//! holds one from its accept to its end, and says whether a request is in
//! progress on it. When every slot is taken, a new connection takes the
//! slot of the oldest connection that has not sent a request's head yet,
//! else of the one idle the longest (no request in progress), which is
//! closed; a connection with a request in progress is never closed to make
//! room. So connections that say nothing (or dribble a byte a second)
//! cannot keep a client out: a client's connection is the newest, and is
//! served in milliseconds.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use tokio::sync::Notify;

/// Why a connection was closed by the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Closed {
    /// Its slot was taken by a newer connection while it was idle.
    Evicted = 1,
    /// It did not send its request's head (the HTTP/2 preface) in time.
    Slow = 2,
    /// It was idle (no request in progress) for too long.
    Idle = 3,
}

/// One connection's state, shared between its slot, its stream and the
/// requests served on it.
#[derive(Debug)]
pub struct ConnState {
    /// Who is at the other end, for audit lines.
    pub peer: String,
    accepted: Instant,
    active: AtomicUsize,
    /// Milliseconds from `accepted` to the moment it last became idle.
    idle_since: AtomicU64,
    spoke: AtomicBool,
    closed: AtomicU8,
    /// The stream's task, woken when the connection is closed.
    pub(crate) waker: AtomicWaker,
    closed_notify: Notify,
}

impl ConnState {
    fn new(peer: String) -> ConnState {
        ConnState {
            peer,
            accepted: Instant::now(),
            active: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            spoke: AtomicBool::new(false),
            closed: AtomicU8::new(0),
            waker: AtomicWaker::new(),
            closed_notify: Notify::new(),
        }
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.accepted).as_millis()).unwrap_or(u64::MAX)
    }

    /// A request starts on this connection.
    pub fn begin(&self) {
        self.spoke.store(true, Ordering::SeqCst);
        self.active.fetch_add(1, Ordering::SeqCst);
    }

    /// A request on this connection ended (its response is sent).
    pub fn end(&self) {
        self.idle_since
            .store(self.millis(Instant::now()), Ordering::SeqCst);
        self.active.fetch_sub(1, Ordering::SeqCst);
    }

    /// The peer sent the head of its first request (for HTTP/2, its
    /// connection preface).
    pub fn spoke(&self) {
        self.spoke.store(true, Ordering::SeqCst);
    }

    /// Whether the peer has sent the head of a request.
    pub fn has_spoken(&self) -> bool {
        self.spoke.load(Ordering::SeqCst)
    }

    /// How long it has been idle at `now`; `None` while a request is in
    /// progress.
    pub fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.active.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let since = self.idle_since.load(Ordering::SeqCst);
        Some(Duration::from_millis(
            self.millis(now).saturating_sub(since),
        ))
    }

    /// Closes the connection (its stream fails its next read or write).
    pub fn close(&self, why: Closed) {
        if self
            .closed
            .compare_exchange(0, why as u8, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.waker.wake();
            self.closed_notify.notify_waiters();
        }
    }

    /// Why it was closed, if it was.
    pub fn closed(&self) -> Option<Closed> {
        match self.closed.load(Ordering::SeqCst) {
            1 => Some(Closed::Evicted),
            2 => Some(Closed::Slow),
            3 => Some(Closed::Idle),
            _ => None,
        }
    }

    /// Resolves once the connection is closed.
    pub async fn until_closed(&self) {
        loop {
            let notified = self.closed_notify.notified();
            if self.closed().is_some() {
                return;
            }
            notified.await;
        }
    }
}

#[derive(Debug)]
struct Inner {
    what: &'static str,
    limit: usize,
    live: Mutex<Vec<Arc<ConnState>>>,
    freed: Notify,
}

/// A listener's slots; cheap to clone.
#[derive(Debug, Clone)]
pub struct Slots(Arc<Inner>);

/// A connection's slot, freed when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: Slots,
    /// The connection's state.
    pub state: Arc<ConnState>,
}

impl Slots {
    /// `limit` slots for listener `what` (named in audit lines).
    pub fn new(what: &'static str, limit: usize) -> Slots {
        Slots(Arc::new(Inner {
            what,
            limit: limit.max(1),
            live: Mutex::new(Vec::new()),
            freed: Notify::new(),
        }))
    }

    /// A slot for a new connection from `peer`: a free one, else the slot
    /// of the connection idle the longest, which is closed; when every
    /// connection has a request in progress, waits for one to end.
    pub async fn admit(&self, peer: String) -> Slot {
        let state = Arc::new(ConnState::new(peer));
        loop {
            let freed = self.0.freed.notified();
            if self.try_admit(&state) {
                return Slot {
                    slots: self.clone(),
                    state,
                };
            }
            freed.await;
        }
    }

    fn try_admit(&self, state: &Arc<ConnState>) -> bool {
        let mut live = self.0.live.lock().unwrap_or_else(PoisonError::into_inner);
        if live.len() >= self.0.limit {
            let now = Instant::now();
            // A connection that has not sent a request's head yet goes
            // first (the oldest of them), then the one idle the longest: a
            // client that spoke at once is not closed for a flood of
            // connections that came after it and say nothing.
            let idlest = live
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.idle_for(now).map(|idle| (i, !c.has_spoken(), idle)))
                .max_by_key(|(_, silent, idle)| (*silent, *idle))
                .map(|(i, _, _)| i);
            let Some(at) = idlest else {
                return false;
            };
            let evicted = live.swap_remove(at);
            evicted.close(Closed::Evicted);
            if crate::ratelimit::audit_allowed(&evicted.peer) {
                tracing::warn!(target: "audit", who = %evicted.peer, listener = self.0.what, "connection closed to make room: all {} connections of the listener were taken and this one was idle the longest", self.0.limit);
            }
        }
        live.push(Arc::clone(state));
        true
    }

    /// Connections holding a slot now.
    pub fn taken(&self) -> usize {
        self.0
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut live = self
            .slots
            .0
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = live.iter().position(|c| Arc::ptr_eq(c, &self.state)) {
            live.swap_remove(at);
        }
        drop(live);
        self.slots.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn when_full_a_silent_then_an_idle_connection_makes_room() {
        let slots = Slots::new("test", 2);
        let a = slots.admit("a".into()).await;
        a.state.begin();
        let b = slots.admit("b".into()).await;
        let c = slots.admit("c".into()).await;
        assert_eq!(b.state.closed(), Some(Closed::Evicted));
        assert_eq!(a.state.closed(), None, "a call in progress is never closed");
        // The evicted slot's drop frees nothing twice.
        drop(b);
        assert_eq!(slots.taken(), 2);
        // `a` spoke and is idle now: newer silent ones go first.
        a.state.end();
        let d = slots.admit("d".into()).await;
        assert_eq!(c.state.closed(), Some(Closed::Evicted));
        let _e = slots.admit("e".into()).await;
        assert_eq!(d.state.closed(), Some(Closed::Evicted));
        assert_eq!(a.state.closed(), None);
        assert_eq!(slots.taken(), 2);
    }

    #[tokio::test]
    async fn when_every_connection_is_busy_a_new_one_waits() {
        let slots = Slots::new("test", 2);
        let a = slots.admit("a".into()).await;
        let b = slots.admit("b".into()).await;
        a.state.begin();
        b.state.begin();
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.admit("c".into()).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(a);
        let admitted = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("admitted once a slot is free")
            .unwrap();
        assert_eq!(admitted.state.closed(), None);
        assert_eq!(b.state.closed(), None);
    }
}
