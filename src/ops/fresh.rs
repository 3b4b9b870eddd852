//! The fresh check before every destructive send, enforced by the engine.
//!
//! Every destructive step declares its precondition as a typed check
//! ([`StepInfo::precondition`](super::plan::StepInfo::precondition), a
//! [`CheckKind`]); the engine builds the check's subject from the
//! operation's facts ([`Check`]) and runs it in the same process right
//! before the step is sent: on the first run, a retry, `ops resume` (a step
//! in flight that its reconciler sends again included) and the daemon's
//! recovery alike. A plan made minutes ago, or an operation interrupted an
//! hour ago, says nothing about a voter that froze since.
//!
//! The proof is a value: every destructive call of the operations goes
//! through a function that takes a [`Fresh`] (src/ops/send.rs), and only
//! [`Ops::guard_destructive`] makes one. The engine hands each step a
//! [`Guard`] holding the step's check; right before each send the step asks
//! it for a proof, and the guard runs the check then. A `Fresh` is spent by
//! one send, so a step that sends twice (an install, then its reboot; a
//! reset sent again) is checked before each. The time from the check's last
//! read to the send is bounded by [`MAX_GAP`] and journaled with the step
//! ([`CheckRecord`]), with the check and what it saw. A check that fails
//! sends nothing: the step fails, the operation needs attention, and the
//! error names the check and what it saw.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::retire::RetireFacts;
use super::{Event, Ops, OpsError};
use crate::client::MemberId;

/// The longest time from a check's last read to the send it allows.
pub(crate) const MAX_GAP: Duration = Duration::from_secs(5);

/// The precondition a destructive step declares (what the engine checks
/// right before the step is sent). `docs/ops/engine.md` has a paragraph on
/// each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum CheckKind {
    /// Quorum holds without the node: every other voter answers within
    /// the bound, healthy and caught up, the lists agree, no learner; the
    /// node is still the planned machine and member (or, planned as dead,
    /// still silent).
    QuorumWithout,
    /// Every voter (but the one the step takes out) answers within the
    /// bound and is healthy, the lists agree, no learner; the node is still
    /// the planned member.
    VotersHealthy,
    /// The node is out of etcd: it left in this process moments ago, or no
    /// survivor lists a member at its address, name or id and it is the
    /// planned machine running no member (a node found reset already is
    /// counted done without a send).
    OutOfEtcd,
    /// The node answers and runs its saved configuration (no change
    /// pending), and every voter is healthy.
    ApplyReady,
    /// The TRY of the file is pending on the node: same boot, it runs the
    /// file, its window is open (a node that saved the file already is
    /// counted done without a send).
    TryPending,
    /// Quorum is really lost: no etcd of the cluster answers with a
    /// leader, and the node to restore onto answers and runs no etcd.
    QuorumLost,
    /// The node answers in maintenance mode (its certificate as pinned) and
    /// is no etcd member.
    InMaintenance,
}

impl CheckKind {
    /// Its name, as journaled and shown (`quorum-without`).
    pub fn name(self) -> &'static str {
        match self {
            CheckKind::QuorumWithout => "quorum-without",
            CheckKind::VotersHealthy => "voters-healthy",
            CheckKind::OutOfEtcd => "out-of-etcd",
            CheckKind::ApplyReady => "apply-ready",
            CheckKind::TryPending => "try-pending",
            CheckKind::QuorumLost => "quorum-lost",
            CheckKind::InMaintenance => "in-maintenance",
        }
    }
}

impl std::fmt::Display for CheckKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One run of a step's check, journaled with the step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CheckRecord {
    /// Which check.
    pub check: CheckKind,
    /// Whether it held.
    pub held: bool,
    /// What it saw, in words.
    pub saw: String,
    /// When it last read the cluster (RFC 3339).
    pub read_at: String,
    /// Milliseconds from its last read to the send it allowed; `None` when
    /// nothing was sent on it (it failed, found the step done, or the step
    /// found nothing to send).
    pub gap_ms: Option<u64>,
}

/// What a node upgraded, defragmented or forfeited is, as planned.
#[derive(Debug, Clone)]
pub(crate) struct PlannedNode {
    /// Its address.
    pub address: String,
    /// Its hostname.
    pub hostname: String,
    /// Its etcd member id; `None` for a worker.
    pub member_id: Option<MemberId>,
}

/// The subject of [`CheckKind::VotersHealthy`].
#[derive(Debug, Clone)]
pub(crate) struct Voters {
    /// The node the step acts on, checked to be the planned member.
    pub node: Option<PlannedNode>,
    /// A voter whose health does not count (the one the step takes out).
    pub except: Option<MemberId>,
    /// A NOSPACE alarm counts as healthy (what a defragmentation clears).
    pub nospace_ok: bool,
}

/// The subject of [`CheckKind::TryPending`].
#[derive(Debug, Clone)]
pub(crate) struct PendingTry {
    /// The node.
    pub node: String,
    /// The tried file and its planned sha256.
    pub config_path: std::path::PathBuf,
    /// Its planned sha256.
    pub config_sha256: String,
    /// When its TRY window closes (ms since the epoch).
    pub deadline_ms: u64,
    /// Its boot id before the try.
    pub boot_id: Option<String>,
}

/// A step's check with its subject, built from the operation's facts.
#[derive(Debug, Clone)]
pub(crate) enum Check {
    /// [`CheckKind::QuorumWithout`].
    QuorumWithout(Box<RetireFacts>),
    /// [`CheckKind::VotersHealthy`].
    VotersHealthy(Voters),
    /// [`CheckKind::OutOfEtcd`].
    OutOfEtcd(Box<RetireFacts>),
    /// [`CheckKind::ApplyReady`] of the node.
    ApplyReady(String),
    /// [`CheckKind::TryPending`].
    TryPending(PendingTry),
    /// [`CheckKind::QuorumLost`]: the node restored onto, and every host
    /// whose etcd must not answer with a leader.
    QuorumLost {
        /// The node.
        node: String,
        /// The hosts asked (the node among them).
        hosts: Vec<String>,
    },
    /// [`CheckKind::InMaintenance`]: the node and its certificate pins.
    InMaintenance {
        /// The node (`host[:port]`).
        node: String,
        /// The pins (empty: not verified).
        pins: Vec<String>,
    },
}

impl Check {
    /// Its kind.
    pub fn kind(&self) -> CheckKind {
        match self {
            Check::QuorumWithout(_) => CheckKind::QuorumWithout,
            Check::VotersHealthy(_) => CheckKind::VotersHealthy,
            Check::OutOfEtcd(_) => CheckKind::OutOfEtcd,
            Check::ApplyReady(_) => CheckKind::ApplyReady,
            Check::TryPending(_) => CheckKind::TryPending,
            Check::QuorumLost { .. } => CheckKind::QuorumLost,
            Check::InMaintenance { .. } => CheckKind::InMaintenance,
        }
    }
}

/// What a check found.
pub(crate) enum Verdict {
    /// It holds; what it saw, and when it last read.
    Holds(String, Instant),
    /// The step's effect is there already (what shows it): nothing to send.
    Done(String),
    /// It does not hold: what it saw.
    Fails(String),
}

/// Proof that a step's check held moments ago, spent by one destructive
/// send ([`Ops::spend`]). Only [`Ops::guard_destructive`] makes one.
#[must_use = "a Fresh is the proof a destructive send needs"]
pub(crate) struct Fresh {
    kind: CheckKind,
    label: String,
    read_at: Instant,
    /// Its record in the step's ledger.
    slot: usize,
}

/// What [`Guard::verdict`] found.
pub(crate) enum Guarded {
    /// Send, with this proof.
    Fresh(Fresh),
    /// Nothing to send: the step's effect is there (what shows it).
    Done(String),
}

/// Where a step stands in its operation, for its guard.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GuardAt<'a> {
    /// The operation's id.
    pub op: &'a str,
    /// The step's position.
    pub index: usize,
    /// The second half of a unit, sent at once after the first (a reset
    /// after its leave): the first's fencing covers it.
    pub bound: bool,
}

/// A step's check, handed to the step by the engine: the step asks it for
/// a [`Fresh`] right before each send, and it runs the check then.
pub(crate) struct Guard<'a> {
    op: String,
    index: usize,
    bound: bool,
    label: String,
    name: &'static str,
    node: Option<String>,
    check: Option<Check>,
    /// Told when a check held ([`Event::StepChecked`]).
    observe: &'a mut (dyn FnMut(Event<'_>) + Send),
}

impl<'a> Guard<'a> {
    /// The guard of the step `at` (`name`, on `node`), with its `check`
    /// (none for a step that changes nothing): made by the engine.
    pub(super) fn new(
        at: GuardAt<'_>,
        name: &'static str,
        node: Option<&str>,
        check: Option<Check>,
        observe: &'a mut (dyn FnMut(Event<'_>) + Send),
    ) -> Guard<'a> {
        Guard {
            op: at.op.to_string(),
            index: at.index,
            bound: at.bound,
            label: super::plan::label(name, node),
            name,
            node: node.map(str::to_string),
            check,
            observe,
        }
    }

    /// The proof for the send that follows at once: the check, run now. A
    /// check that finds the step done is an error here (only
    /// [`Guard::verdict`]'s callers can take that answer).
    pub async fn proof(&mut self, ops: &Ops) -> Result<Fresh, OpsError> {
        match self.verdict(ops).await? {
            Guarded::Fresh(fresh) => Ok(fresh),
            Guarded::Done(saw) => Err(OpsError::attention(
                &self.label,
                format!("its check found it done already ({saw}), where it was to be sent"),
            )),
        }
    }

    /// The check's answer for the send that follows at once, run now: a
    /// proof, or evidence that the step's effect is there already.
    pub async fn verdict(&mut self, ops: &Ops) -> Result<Guarded, OpsError> {
        let Some(check) = &self.check else {
            return Err(undeclared(&self.label));
        };
        let at = GuardAt {
            op: &self.op,
            index: self.index,
            bound: self.bound,
        };
        let guarded = ops.guard_destructive(at, &self.label, check).await?;
        if let Guarded::Fresh(_) = &guarded {
            (self.observe)(Event::StepChecked {
                index: self.index,
                name: self.name,
                node: self.node.as_deref(),
            });
        }
        Ok(guarded)
    }
}

/// The error of a send in a step that declares no precondition.
pub(super) fn undeclared(label: &str) -> OpsError {
    OpsError::step(
        label,
        "it declares no precondition, so nothing destructive may be sent in it",
    )
}

impl Ops {
    /// Right before a destructive send: THE one place where it happens.
    /// Runs `check` for step `label` (at `at`), journals what it saw in the
    /// step's ledger, then the cluster lock's fencing: the Lease must still
    /// be this operation's ([`Ops::fence`], journaled with the step; the
    /// second half of a unit goes with its first, nothing may come between
    /// a leave and its reset). Only then is the proof a send needs made. A
    /// check that does not hold, or a lock no longer ours, is an error that
    /// says so (the operation then needs attention); nothing is sent.
    pub(super) async fn guard_destructive(
        &self,
        at: GuardAt<'_>,
        label: &str,
        check: &Check,
    ) -> Result<Guarded, OpsError> {
        let kind = check.kind();
        let verdict = match self.evaluate(label, check).await {
            Ok(verdict) => verdict,
            Err(e @ (OpsError::StoppedWaiting { .. } | OpsError::MissingFact(_))) => return Err(e),
            Err(e) => Verdict::Fails(e.to_string()),
        };
        let (held, saw, read_at) = match &verdict {
            Verdict::Holds(saw, at) => (true, saw.clone(), *at),
            Verdict::Done(saw) => (true, saw.clone(), Instant::now()),
            Verdict::Fails(saw) => (false, saw.clone(), Instant::now()),
        };
        let slot = self.note_check(CheckRecord {
            check: kind,
            held,
            saw: saw.clone(),
            read_at: wall_clock(read_at),
            gap_ms: None,
        });
        match verdict {
            Verdict::Fails(saw) => Err(OpsError::attention(
                label,
                format!("check {kind} failed: {saw}; nothing was sent"),
            )),
            Verdict::Done(saw) => Ok(Guarded::Done(saw)),
            Verdict::Holds(_, read_at) => {
                if !at.bound {
                    self.fence(at.op, at.index, label).await?;
                }
                Ok(Guarded::Fresh(Fresh {
                    kind,
                    label: label.to_string(),
                    read_at,
                    slot,
                }))
            }
        }
    }

    /// Spends `fresh` on the send that follows at once: refused when its
    /// check last read more than [`MAX_GAP`] ago; the gap is journaled.
    pub(super) fn spend(&self, fresh: Fresh) -> Result<(), OpsError> {
        let gap = fresh.read_at.elapsed();
        if gap > MAX_GAP {
            return Err(OpsError::attention(
                &fresh.label,
                format!(
                    "check {} last read {} ms before the send, more than the {} ms allowed; nothing was sent",
                    fresh.kind,
                    gap.as_millis(),
                    MAX_GAP.as_millis()
                ),
            ));
        }
        let mut ledger = self.checks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(record) = ledger.get_mut(fresh.slot) {
            record.gap_ms = Some(gap.as_millis() as u64);
        }
        Ok(())
    }

    fn note_check(&self, record: CheckRecord) -> usize {
        let mut ledger = self.checks.lock().unwrap_or_else(|e| e.into_inner());
        ledger.push(record);
        ledger.len() - 1
    }

    /// The checks the current step ran, for its journal record.
    pub(super) fn take_checks(&self) -> Vec<CheckRecord> {
        std::mem::take(&mut *self.checks.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// `at` on the wall clock, RFC 3339.
fn wall_clock(at: Instant) -> String {
    let ago = at.elapsed();
    (time::OffsetDateTime::now_utc() - ago)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
