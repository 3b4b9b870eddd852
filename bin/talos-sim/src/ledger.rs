//! The cluster's ground truth: an append-only ledger of what happened,
//! written by the simulator itself as it happens, one JSON object per line
//! in `DIR/ledger.jsonl` and readable in-process ([`Ledger::entries`]).
//!
//! It records every call a node's API handled that changes something, and
//! the reads a check before a send uses ([`CallKind`]), each with its caller
//! (certificate subject, the connection's peer, the node it entered by);
//! every change of etcd's membership and of each member's availability
//! (etcd running, stopped, frozen; the node's power; its API partitioned);
//! each node that went down (reset, reboot, upgrade, shutdown), with
//! whether it was a voter then, serving, and whether the others kept a
//! quorum without it; and each loss and return of quorum with the event
//! that caused it. Quorum is derived from the simulator's own knowledge,
//! never asked of etcd: the voters are the members as the simulator added,
//! promoted and removed them, and a voter serves while its node is on and
//! its etcd runs unfrozen (a partition cuts only the node's API, so its
//! member still serves). Every event carries its cause ([`Cause`]): the call
//! being handled, a fault injected from outside, or the simulator's own
//! doing (a boot, a learner's promotion, a TRY rollback).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

mod call;

pub use call::{CallKind, Caller};

/// What caused an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "kebab-case")]
pub enum Cause {
    /// A call a node's API handled (its `call` id in the ledger).
    Call {
        /// The call's id.
        call: u64,
        /// What it was.
        kind: CallKind,
        /// The node that handled it.
        node: String,
        /// Who sent it (the certificate subject).
        subject: String,
    },
    /// A fault injected from outside (`talos-sim fault`, the control
    /// socket, a test or the campaign).
    Fault {
        /// The fault's name (`freeze-etcd`, `power-off`, ...).
        fault: String,
    },
    /// The simulator's own doing (a boot, a promotion, a rollback), or a
    /// direct call of the library with no cause in scope.
    Simulator {
        /// What.
        what: String,
    },
}

impl Cause {
    /// A fault named `fault`.
    pub fn fault(fault: impl Into<String>) -> Cause {
        Cause::Fault {
            fault: fault.into(),
        }
    }

    /// The simulator's own `what`.
    pub fn simulator(what: impl Into<String>) -> Cause {
        Cause::Simulator { what: what.into() }
    }

    /// The call's subject, when a call caused it.
    pub fn subject(&self) -> Option<&str> {
        match self {
            Cause::Call { subject, .. } => Some(subject),
            _ => None,
        }
    }
}

tokio::task_local! {
    static CAUSE: Cause;
}

/// Runs `future` with `cause` as the cause of every event it records.
pub async fn with_cause<F: std::future::Future>(cause: Cause, future: F) -> F::Output {
    CAUSE.scope(cause, future).await
}

/// The cause in scope, or the simulator's own doing.
pub fn current_cause() -> Cause {
    CAUSE
        .try_with(Cause::clone)
        .unwrap_or_else(|_| Cause::simulator("unattributed"))
}

/// A change of etcd's membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemberChange {
    /// Added (as a learner when `learner`).
    Added,
    /// A learner promoted to a voter.
    Promoted,
    /// Removed.
    Removed,
    /// A new cluster of this one member (a bootstrap or a restore): every
    /// other member is gone.
    Bootstrapped,
}

/// A node's etcd process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EtcdState {
    /// Running.
    Running,
    /// Stopped (data kept unless wiped).
    Stopped,
    /// Stopped with SIGSTOP: listed, answering nothing.
    Frozen,
    /// Running again after a freeze.
    Thawed,
}

/// How a node went down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Down {
    /// A reset sequence: volumes wiped.
    Reset,
    /// A reboot sequence (a Reboot call, or an apply that reboots).
    Reboot,
    /// The upgrade sequence's reboot.
    Upgrade,
    /// A shutdown.
    Shutdown,
    /// Powered off from outside, as a pulled plug.
    PowerOff,
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Event {
    /// A node's API handled a call.
    Call {
        /// Its id (events it caused name it).
        call: u64,
        /// The node that handled it.
        node: String,
        /// The gRPC method.
        method: String,
        /// What it is.
        kind: CallKind,
        /// Who sent it.
        caller: Caller,
    },
    /// An apply's mode, as the node decided it.
    Apply {
        /// The node.
        node: String,
        /// The mode (`try`, `no-reboot`, `reboot`, `staged`).
        mode: String,
        /// A dry run: nothing changed.
        dry_run: bool,
    },
    /// A TRY apply rolled back.
    Rollback {
        /// The node.
        node: String,
    },
    /// etcd's membership changed.
    Member {
        /// How.
        change: MemberChange,
        /// The member's id.
        id: u64,
        /// Its name (the node's hostname).
        name: String,
        /// A learner now.
        learner: bool,
    },
    /// A node's etcd changed state.
    Etcd {
        /// The node.
        node: String,
        /// Its new state.
        state: EtcdState,
    },
    /// A node's power changed (`on`, `rebooting`, `off`).
    Power {
        /// The node.
        node: String,
        /// Its new state.
        state: String,
    },
    /// A node's API was cut off (`cut`) or healed.
    Partition {
        /// The node.
        node: String,
        /// Cut off (true) or healed.
        cut: bool,
    },
    /// A node went down.
    Down {
        /// The node.
        node: String,
        /// How.
        how: Down,
        /// Its member was a voter then.
        voter: bool,
        /// Its member served then.
        live: bool,
        /// The other voters kept a quorum without it.
        quorum_without: bool,
        /// The volumes wiped (a reset).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        wiped: Vec<String>,
    },
    /// A fault injected from outside, as its injector describes it.
    Fault {
        /// The fault.
        fault: String,
        /// The node it hits, if one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
    },
    /// Quorum was lost (`held` false) or regained.
    Quorum {
        /// Whether the voters have a quorum now.
        held: bool,
        /// The voters.
        voters: Vec<String>,
        /// The voters serving.
        serving: Vec<String>,
    },
}

/// One line of the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Its position (from 0).
    pub seq: u64,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
    /// Why (absent for a call, which is its own cause).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
}

/// A member as the simulator knows it.
#[derive(Debug, Clone)]
struct Member {
    name: String,
    learner: bool,
}

/// What the simulator knows of a node's ability to serve.
#[derive(Debug, Clone, Default)]
struct Availability {
    etcd_running: bool,
    frozen: bool,
    power_on: bool,
}

impl Availability {
    fn serving(&self) -> bool {
        self.etcd_running && !self.frozen && self.power_on
    }
}

#[derive(Default)]
struct State {
    file: Option<std::fs::File>,
    entries: Vec<Entry>,
    next_call: u64,
    members: BTreeMap<u64, Member>,
    nodes: BTreeMap<String, Availability>,
    /// Quorum is tracked from the moment the initial membership is known.
    quorum: Option<bool>,
}

/// The ledger of one cluster.
pub struct Ledger {
    path: Option<PathBuf>,
    state: Mutex<State>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").field("path", &self.path).finish()
    }
}

/// The ledger's file in a cluster directory.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join("ledger.jsonl")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

impl Ledger {
    /// A ledger written to `DIR/ledger.jsonl` (a new file: every `up` is a
    /// new cluster); in memory only when the file cannot be made.
    pub(crate) fn create(dir: &Path) -> Ledger {
        let path = path_in(dir);
        let file = std::fs::File::create(&path)
            .map_err(|e| tracing::warn!("ledger {}: {e}", path.display()))
            .ok();
        Ledger {
            path: Some(path),
            state: Mutex::new(State {
                file,
                ..State::default()
            }),
        }
    }

    /// A ledger in memory only.
    pub fn in_memory() -> Ledger {
        Ledger {
            path: None,
            state: Mutex::new(State::default()),
        }
    }

    /// Its file, when it has one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Every entry so far, in order.
    pub fn entries(&self) -> Vec<Entry> {
        self.state.lock().expect("ledger lock").entries.clone()
    }

    /// Reads a ledger file.
    pub fn read(path: &Path) -> std::io::Result<Vec<Entry>> {
        std::fs::read_to_string(path)?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                serde_json::from_str(line)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
            })
            .collect()
    }

    fn push(state: &mut State, event: Event, cause: Option<Cause>) {
        let entry = Entry {
            seq: state.entries.len() as u64,
            at_ms: now_ms(),
            event,
            cause,
        };
        if let Some(file) = &mut state.file {
            let mut line = serde_json::to_string(&entry).expect("entries serialize");
            line.push('\n');
            if let Err(e) = file.write_all(line.as_bytes()) {
                tracing::warn!("ledger: {e}");
                state.file = None;
            }
        }
        state.entries.push(entry);
    }

    /// Records an event with the cause in scope, then any change of quorum
    /// it made, with the same cause.
    pub(crate) fn record(&self, event: Event) {
        let cause = current_cause();
        let mut state = self.state.lock().expect("ledger lock");
        Self::push(&mut state, event, Some(cause.clone()));
        Self::check_quorum(&mut state, cause);
    }

    /// Records a fault its injector describes (the campaign's kills and
    /// restarts, which the simulator does not see); the events the fault
    /// then causes follow under [`with_cause`].
    pub fn note_fault(&self, fault: &str, node: Option<&str>) {
        let cause = Cause::fault(fault);
        let mut state = self.state.lock().expect("ledger lock");
        Self::push(
            &mut state,
            Event::Fault {
                fault: fault.into(),
                node: node.map(str::to_string),
            },
            Some(cause),
        );
    }

    /// Records a call handled by `node` and returns the cause its effects
    /// carry.
    pub(crate) fn call(&self, node: &str, method: &str, kind: CallKind, caller: Caller) -> Cause {
        let mut state = self.state.lock().expect("ledger lock");
        let call = state.next_call;
        state.next_call += 1;
        let cause = Cause::Call {
            call,
            kind,
            node: node.to_string(),
            subject: caller.subject.clone(),
        };
        Self::push(
            &mut state,
            Event::Call {
                call,
                node: node.to_string(),
                method: method.to_string(),
                kind,
                caller,
            },
            None,
        );
        cause
    }

    /// The membership etcd started with: every listed member a voter. From
    /// here on quorum is tracked.
    pub(crate) fn seed_members(&self, members: impl IntoIterator<Item = (u64, String)>) {
        let mut state = self.state.lock().expect("ledger lock");
        for (id, name) in members {
            state.members.insert(
                id,
                Member {
                    name: name.clone(),
                    learner: false,
                },
            );
            Self::push(
                &mut state,
                Event::Member {
                    change: MemberChange::Added,
                    id,
                    name,
                    learner: false,
                },
                Some(Cause::simulator("cluster created")),
            );
        }
        let (held, ..) = Self::quorum_of(&state, None);
        state.quorum = Some(held);
        Self::check_quorum(&mut state, Cause::simulator("cluster created"));
    }

    /// A membership change.
    pub(crate) fn member(&self, change: MemberChange, id: u64, name: &str, learner: bool) {
        {
            let mut state = self.state.lock().expect("ledger lock");
            match change {
                MemberChange::Added => {
                    state.members.insert(
                        id,
                        Member {
                            name: name.into(),
                            learner,
                        },
                    );
                }
                MemberChange::Promoted => {
                    if let Some(m) = state.members.get_mut(&id) {
                        m.learner = false;
                    }
                }
                MemberChange::Removed => {
                    // Gone already (a leave that found no member).
                    if state.members.remove(&id).is_none() {
                        return;
                    }
                }
                MemberChange::Bootstrapped => {
                    state.members.clear();
                    state.members.insert(
                        id,
                        Member {
                            name: name.into(),
                            learner: false,
                        },
                    );
                    state.quorum.get_or_insert(false);
                }
            }
        }
        self.record(Event::Member {
            change,
            id,
            name: name.into(),
            learner,
        });
    }

    /// The name of member `id`, as the simulator knows it.
    pub(crate) fn member_name(&self, id: u64) -> Option<String> {
        let state = self.state.lock().expect("ledger lock");
        state.members.get(&id).map(|m| m.name.clone())
    }

    /// A node's etcd changed.
    pub(crate) fn etcd(&self, node: &str, etcd: EtcdState) {
        {
            let mut state = self.state.lock().expect("ledger lock");
            let a = state.nodes.entry(node.into()).or_default();
            match etcd {
                EtcdState::Running | EtcdState::Thawed => {
                    a.etcd_running = true;
                    a.frozen = false;
                }
                EtcdState::Stopped => {
                    a.etcd_running = false;
                    a.frozen = false;
                }
                EtcdState::Frozen => a.frozen = true,
            }
        }
        self.record(Event::Etcd {
            node: node.into(),
            state: etcd,
        });
    }

    /// A node's power changed (recorded only when it did).
    pub(crate) fn power(&self, node: &str, on: bool, word: &str) {
        {
            let mut state = self.state.lock().expect("ledger lock");
            let a = state.nodes.entry(node.into()).or_default();
            a.power_on = on;
        }
        self.record(Event::Power {
            node: node.into(),
            state: word.into(),
        });
    }

    /// A node is going down: recorded with what it was then, before its
    /// etcd stops.
    pub(crate) fn down(&self, node: &str, how: Down, wiped: &[String]) {
        let event = {
            let state = self.state.lock().expect("ledger lock");
            let voter = state.members.values().any(|m| m.name == node && !m.learner);
            let live = state.nodes.get(node).is_some_and(Availability::serving);
            let (quorum_without, ..) = Self::quorum_of(&state, Some(node));
            Event::Down {
                node: node.into(),
                how,
                voter,
                live,
                quorum_without,
                wiped: wiped.to_vec(),
            }
        };
        self.record(event);
    }

    /// Whether the voters have a quorum, with `without` not serving; and
    /// the voters and those serving.
    fn quorum_of(state: &State, without: Option<&str>) -> (bool, Vec<String>, Vec<String>) {
        let mut voters: Vec<String> = state
            .members
            .values()
            .filter(|m| !m.learner)
            .map(|m| m.name.clone())
            .collect();
        voters.sort();
        let serving: Vec<String> = voters
            .iter()
            .filter(|v| Some(v.as_str()) != without)
            .filter(|v| state.nodes.get(*v).is_some_and(Availability::serving))
            .cloned()
            .collect();
        (
            !voters.is_empty() && serving.len() * 2 > voters.len(),
            voters,
            serving,
        )
    }

    fn check_quorum(state: &mut State, cause: Cause) {
        let Some(before) = state.quorum else {
            return;
        };
        let (held, voters, serving) = Self::quorum_of(state, None);
        if held != before {
            state.quorum = Some(held);
            Self::push(
                state,
                Event::Quorum {
                    held,
                    voters,
                    serving,
                },
                Some(cause),
            );
        }
    }

    /// Whether the voters have a quorum now, as the simulator knows them.
    pub fn has_quorum(&self) -> bool {
        let state = self.state.lock().expect("ledger lock");
        Self::quorum_of(&state, None).0
    }

    /// The voters' names now.
    pub fn voters(&self) -> Vec<String> {
        let state = self.state.lock().expect("ledger lock");
        Self::quorum_of(&state, None).1
    }
}
