//! Fair shares of the TLS handshake slots, so that peers that connect and
//! then say nothing cannot keep authenticated clients out.
//!
//! Two rules: one address holds at most [`PER_PEER`] handshakes in
//! progress (a further connection from it is closed at once), and when
//! every slot is taken a new connection takes the oldest slot of the
//! address that holds the most, whose handshake is then abandoned. A
//! client's own handshake takes milliseconds, so only peers that stall are
//! ever the oldest; to keep a client out an attacker must open connections
//! from many addresses faster than clients complete theirs.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

/// Handshakes in progress at once from one address.
pub const PER_PEER: usize = 8;

/// Why a connection got no handshake slot.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused;

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{PER_PEER} TLS handshakes from this address are already in progress"
        )
    }
}

/// The handshake slots of one listener.
#[derive(Clone)]
pub struct Handshakes {
    inner: Arc<Mutex<State>>,
    limit: usize,
}

#[derive(Default)]
struct State {
    next: u64,
    total: usize,
    /// Per address, its handshakes oldest first: (sequence, abandon).
    peers: HashMap<IpAddr, Vec<(u64, oneshot::Sender<()>)>>,
}

/// One handshake's slot; dropping it frees the slot. `abandoned` resolves
/// when a newer connection took the slot.
pub struct Slot {
    owner: Handshakes,
    peer: IpAddr,
    seq: u64,
    /// Resolves when the slot was taken by a newer connection.
    pub abandoned: oneshot::Receiver<()>,
}

impl Handshakes {
    /// `limit` slots in all.
    pub fn new(limit: usize) -> Self {
        Handshakes {
            inner: Arc::default(),
            limit: limit.max(1),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a handshake from `peer`, taking the oldest slot of the
    /// largest holder when all are taken; refused when `peer` already holds
    /// its share. Returns the address whose handshake was abandoned, if
    /// any, for the audit line.
    pub fn admit(&self, peer: IpAddr) -> Result<(Slot, Option<IpAddr>), Refused> {
        let mut state = self.state();
        if state.peers.get(&peer).map_or(0, Vec::len) >= PER_PEER {
            return Err(Refused);
        }
        let mut evicted = None;
        if state.total >= self.limit {
            let largest = state
                .peers
                .iter()
                .max_by_key(|(_, held)| (held.len(), std::cmp::Reverse(held[0].0)))
                .map(|(ip, _)| *ip);
            if let Some(ip) = largest {
                let held = state.peers.get_mut(&ip).expect("present");
                let (_, abandon) = held.remove(0);
                if held.is_empty() {
                    state.peers.remove(&ip);
                }
                state.total -= 1;
                let _ = abandon.send(());
                evicted = Some(ip);
            }
        }
        let seq = state.next;
        state.next += 1;
        state.total += 1;
        let (tx, rx) = oneshot::channel();
        state.peers.entry(peer).or_default().push((seq, tx));
        Ok((
            Slot {
                owner: self.clone(),
                peer,
                seq,
                abandoned: rx,
            },
            evicted,
        ))
    }

    /// Slots taken now.
    #[cfg(test)]
    fn taken(&self) -> usize {
        self.state().total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.owner.state();
        let Some(held) = state.peers.get_mut(&self.peer) else {
            return;
        };
        let Some(at) = held.iter().position(|(seq, _)| *seq == self.seq) else {
            // Already taken by a newer connection.
            return;
        };
        held.remove(at);
        if held.is_empty() {
            state.peers.remove(&self.peer);
        }
        state.total -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn one_address_gets_its_share_and_no_more() {
        let slots = Handshakes::new(64);
        let held: Vec<_> = (0..PER_PEER).map(|_| slots.admit(ip(2)).unwrap()).collect();
        assert_eq!(slots.admit(ip(2)).err(), Some(Refused));
        let (client, evicted) = slots.admit(ip(1)).unwrap();
        assert_eq!(evicted, None);
        drop(held);
        assert_eq!(slots.taken(), 1);
        drop(client);
        assert_eq!(slots.taken(), 0);
        assert!(slots.admit(ip(2)).is_ok());
    }

    #[test]
    fn when_full_the_largest_holders_oldest_slot_is_taken() {
        let slots = Handshakes::new(4);
        let mut a: Vec<_> = (0..3).map(|_| slots.admit(ip(2)).unwrap().0).collect();
        let mut b = slots.admit(ip(3)).unwrap().0;
        let (mut client, evicted) = slots.admit(ip(1)).unwrap();
        assert_eq!(evicted, Some(ip(2)));
        assert_eq!(a[0].abandoned.try_recv(), Ok(()));
        assert!(a[1].abandoned.try_recv().is_err());
        assert!(b.abandoned.try_recv().is_err());
        assert!(client.abandoned.try_recv().is_err());
        assert_eq!(slots.taken(), 4);
        // The abandoned slot's drop frees nothing twice.
        drop(a.remove(0));
        assert_eq!(slots.taken(), 4);
        drop(a);
        assert_eq!(slots.taken(), 2);
    }

    #[test]
    fn many_addresses_of_one_each_give_up_their_oldest() {
        let slots = Handshakes::new(3);
        let mut held: Vec<_> = (10..13).map(|n| slots.admit(ip(n)).unwrap().0).collect();
        let (_client, evicted) = slots.admit(ip(1)).unwrap();
        assert_eq!(evicted, Some(ip(10)));
        assert_eq!(held[0].abandoned.try_recv(), Ok(()));
        assert!(held[1].abandoned.try_recv().is_err());
    }
}
