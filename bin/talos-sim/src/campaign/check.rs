//! The invariants, checked after each run against the cluster's ledger
//! (ground truth: what the nodes received and what happened) and the
//! hosts' journals (what the operations say they did):
//!
//! - I1: no quorum loss caused by a call an operation sent;
//! - I2: no live voter reset, rebooted, upgraded or shut down out of
//!   quorum by such a call;
//! - I4: the journal's final state and each step's state match what
//!   happened (needs-attention wherever the operation could not know);
//! - I5: never two operations at once on one cluster;
//! - I6: no panic, and no run beyond its declared time bound.
//!
//! A loss or reset a fault made unavoidable is not held against the
//! operation: when a fault struck after the caller's last read before the
//! call (and that read was fresh, within [`FRESH_BOUND_MS`] of the call),
//! no check could have seen it.

use serde::Serialize;

use super::draw::OpKind;
use super::run::Gathered;
use crate::ledger::{CallKind, Cause, Down, Entry, Event, MemberChange};

/// How old the last read before a destructive call may be for a fault
/// after it to excuse the call: a check that old was fresh.
pub const FRESH_BOUND_MS: u64 = 5_000;

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which (`I1` ... `I6`).
    pub invariant: &'static str,
    /// What happened, with the ledger's evidence.
    pub what: String,
}

fn violation(invariant: &'static str, what: String) -> Violation {
    Violation { invariant, what }
}

/// What the checks know of a run besides the ledger and the journals.
pub struct Known<'a> {
    /// The certificate subjects of the operations' hosts (a call from
    /// another subject, the campaign's preparation, is not theirs).
    pub ours: Vec<String>,
    /// Maps an address (or name) to a node's name.
    pub name_of: &'a dyn Fn(&str) -> Option<String>,
}

impl Known<'_> {
    fn ours(&self, cause: &Option<Cause>) -> Option<(u64, CallKind, String, String)> {
        match cause {
            Some(Cause::Call {
                call,
                kind,
                node,
                subject,
            }) if self.is_ours(subject) => Some((*call, *kind, node.clone(), subject.clone())),
            _ => None,
        }
    }

    fn is_ours(&self, subject: &str) -> bool {
        // A node in maintenance mode takes no client certificate: only
        // an operation (a join's apply) talks to one.
        subject.is_empty() || self.ours.iter().any(|o| o == subject)
    }

    pub(super) fn name(&self, address: &str) -> String {
        (self.name_of)(address).unwrap_or_else(|| address.to_string())
    }
}

/// Every broken invariant of a run.
pub fn check(known: &Known<'_>, gathered: &Gathered) -> Vec<Violation> {
    let ledger = &gathered.ledger;
    let mut found = Vec::new();
    found.extend(quorum_lost(known, ledger));
    found.extend(live_voters_down(known, ledger));
    found.extend(super::check_journal::journal_matches(known, gathered));
    found.extend(two_at_once(gathered));
    found.extend(panics_and_bounds(gathered));
    found
}

/// The call `call` in the ledger: its position, time and subject.
fn find_call(ledger: &[Entry], call: u64) -> Option<(usize, u64, String)> {
    ledger.iter().enumerate().find_map(|(i, e)| match &e.event {
        Event::Call {
            call: c, caller, ..
        } if *c == call => Some((i, e.at_ms, caller.subject.clone())),
        _ => None,
    })
}

/// Whether a fault excuses the effect at `effect` of call `call`: one
/// struck after the caller's last read before the call, that read being
/// within [`FRESH_BOUND_MS`] of the call.
fn excused(ledger: &[Entry], call: u64, effect: usize) -> bool {
    let Some((at, call_ms, subject)) = find_call(ledger, call) else {
        return false;
    };
    let last_read = ledger[..at].iter().rev().find(|e| {
        matches!(&e.event, Event::Call { kind, caller, .. }
            if !kind.changes_something() && caller.subject == subject)
    });
    let Some(read) = last_read else {
        return false;
    };
    if call_ms.saturating_sub(read.at_ms) > FRESH_BOUND_MS {
        return false;
    }
    ledger[read.seq as usize..effect].iter().any(|e| {
        matches!(
            (&e.event, &e.cause),
            (
                Event::Etcd { .. } | Event::Power { .. } | Event::Member { .. },
                Some(Cause::Fault { .. })
            )
        )
    })
}

/// I1: quorum lost by a call of ours.
fn quorum_lost(known: &Known<'_>, ledger: &[Entry]) -> Vec<Violation> {
    ledger
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match (&e.event, known.ours(&e.cause)) {
            (
                Event::Quorum {
                    held: false,
                    voters,
                    serving,
                },
                Some((call, kind, node, subject)),
            ) if !excused(ledger, call, i) => Some(violation(
                "I1",
                format!(
                    "quorum lost by {kind:?} on {node} (call #{call} from {subject}, ledger entry {}): voters {voters:?}, serving {serving:?}",
                    e.seq
                ),
            )),
            _ => None,
        })
        .collect()
}

/// I2: a live voter reset, or taken down while the others had no quorum
/// without it, by a call of ours.
fn live_voters_down(known: &Known<'_>, ledger: &[Entry]) -> Vec<Violation> {
    ledger
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let Event::Down {
                node,
                how,
                voter: true,
                live: true,
                quorum_without,
                ..
            } = &e.event
            else {
                return None;
            };
            let (call, kind, _, subject) = known.ours(&e.cause)?;
            // A reset takes a member's data for good: no fault makes
            // resetting a live voter right, so none excuses it. A reboot
            // out of quorum is excused as a loss is.
            let (harm, excusable) = match how {
                Down::Reset => ("reset while a live voter".to_string(), false),
                Down::Reboot | Down::Upgrade | Down::Shutdown if !quorum_without => (
                    format!("{how:?} while a live voter the others had no quorum without"),
                    true,
                ),
                _ => return None,
            };
            (!(excusable && excused(ledger, call, i))).then(|| {
                violation(
                    "I2",
                    format!(
                        "{node} {harm} (by {kind:?}, call #{call} from {subject}, ledger entry {})",
                        e.seq
                    ),
                )
            })
        })
        .collect()
}

/// When an operation was in progress: from its creation to its last
/// journal write, in milliseconds since the Unix epoch.
pub(super) fn span_ms(record: &serde_json::Value) -> Option<(u64, u64)> {
    let at = |field: &str| record[field].as_str().and_then(rfc3339_ms);
    Some((at("created")?, at("updated")?))
}

/// Milliseconds since the Unix epoch of an RFC 3339 time.
pub(super) fn rfc3339_ms(text: &str) -> Option<u64> {
    let t =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Whether a journaled operation may change the cluster, by the engine's
/// own definition ([`talos_client::ops::OpSpec::may_change_cluster`]):
/// those hold the cluster lock; read-only ones (a snapshot, a drill, a
/// join without a configuration) take none and may run beside anything
/// (docs/ops/lock.md). Parameters that do not parse count as changing.
pub(super) fn may_change_cluster(record: &serde_json::Value) -> bool {
    serde_json::from_value::<talos_client::ops::OpSpec>(record["params"].clone())
        .map_or(true, |spec| spec.may_change_cluster())
}

/// I5: an operation of one host that may change the cluster in progress
/// while another host's was.
fn two_at_once(gathered: &Gathered) -> Vec<Violation> {
    let mut found = Vec::new();
    let changing = |records: &'_ [serde_json::Value]| -> Vec<serde_json::Value> {
        records
            .iter()
            .filter(|r| may_change_cluster(r))
            .cloned()
            .collect()
    };
    let (operator, second) = (changing(&gathered.operator), changing(&gathered.second));
    for a in &operator {
        for b in &second {
            let (Some((a0, a1)), Some((b0, b1))) = (span_ms(a), span_ms(b)) else {
                continue;
            };
            if a0 < b1 && b0 < a1 {
                found.push(violation(
                    "I5",
                    format!(
                        "{} {} (operator, {}) and {} {} (second admin, {}) were in progress at once for {} ms",
                        a["kind"].as_str().unwrap_or("?"),
                        a["id"].as_str().unwrap_or("?"),
                        a["state"].as_str().unwrap_or("?"),
                        b["kind"].as_str().unwrap_or("?"),
                        b["id"].as_str().unwrap_or("?"),
                        b["state"].as_str().unwrap_or("?"),
                        a1.min(b1) - a0.max(b0)
                    ),
                ));
            }
        }
    }
    found
}

/// I6: a panic (exit code 101, "panicked" in the output) or a process
/// still running at the run's bound.
fn panics_and_bounds(gathered: &Gathered) -> Vec<Violation> {
    let mut found: Vec<Violation> = gathered
        .procs
        .iter()
        .filter(|p| p.code == Some(101) || p.output.contains("panicked"))
        .map(|p| {
            let line = p
                .output
                .lines()
                .find(|l| l.contains("panicked"))
                .unwrap_or("exit code 101");
            violation("I6", format!("{} panicked: {line}", p.role))
        })
        .collect();
    found.extend(gathered.overran.iter().map(|role| {
        violation(
            "I6",
            format!(
                "{role} was still running at the run's bound of {} s",
                gathered.bound.as_secs()
            ),
        )
    }));
    found
}

/// The members the ledger knows at its end: (id, name, voter).
pub(super) fn members_at_end(ledger: &[Entry]) -> Vec<(u64, String, bool)> {
    let mut members: std::collections::BTreeMap<u64, (String, bool)> = Default::default();
    for e in ledger {
        if let Event::Member {
            change,
            id,
            name,
            learner,
        } = &e.event
        {
            match change {
                MemberChange::Added => {
                    members.insert(*id, (name.clone(), !learner));
                }
                MemberChange::Promoted => {
                    if let Some(m) = members.get_mut(id) {
                        m.1 = true;
                    }
                }
                MemberChange::Removed => {
                    members.remove(id);
                }
                MemberChange::Bootstrapped => {
                    members.clear();
                    members.insert(*id, (name.clone(), true));
                }
            }
        }
    }
    members
        .into_iter()
        .map(|(id, (name, voter))| (id, name, voter))
        .collect()
}

/// Whether `op` changes etcd's membership (its target leaves).
pub(super) fn retires(op: OpKind) -> bool {
    matches!(op, OpKind::Retire | OpKind::Migrate)
}
