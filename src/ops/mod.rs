//! Safe composite operations: the seeds' runbooks as plain library code,
//! run by `talosctl-rs ops` and usable by any program that links the crate
//! (feature `ops`).
//!
//! Every operation reads the cluster first (preflight), builds a [`Plan`]
//! of named steps that can be shown before anything changes, then runs it
//! step by step through the [`Journal`]: a destructive step is recorded as
//! started before its call is sent, so after a crash [`Ops::show`] names
//! the step in flight and [`Ops::resume`] reconciles it with the cluster
//! before going on. One operation runs per cluster at a time
//! ([`ClusterLock`]).
//!
//! - [`Ops::plan_snapshot`]: a verified snapshot from a healthy voter, with
//!   retention;
//! - [`Ops::plan_retire`]: snapshot, forfeit, leave, reset at once, wait
//!   until the node is silent;
//! - [`Ops::plan_join`]: wait until a new member is a healthy voter;
//! - [`Ops::plan_apply`]: a configuration on trial (TRY), a health gate
//!   within the try window, then confirmation or a verified rollback;
//! - [`Ops::plan_migrate`]: join a new node (from maintenance mode), then
//!   retire an old one, as one operation.
//!
//! A [`StopHandle`] given to [`Ops::set_stop`] parks a running operation at
//! its next step boundary (resumable) or cancels it before any destructive
//! step; a daemon uses it for cancel requests and shutdown.

mod apply;
mod apply_steps;
mod cluster;
mod config_diff;
mod guard;
mod join;
mod journal;
mod lock;
mod migrate;
mod retire;
mod snapshot;
mod stop;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use sha2::Digest as _;

use crate::Client;
use crate::config::ResolvedContext;

pub use apply::ApplyOptions;
pub use config_diff::ConfigParseError;
pub use guard::check_plain_reset;
pub use join::{JoinOptions, MaintenanceApply};
pub use journal::{Journal, OpRecord, OpState, StepRecord, StepState};
pub use lock::ClusterLock;
pub use migrate::MigrateOptions;
pub use retire::RetireOptions;
pub use snapshot::SnapshotOptions;
pub use stop::{CancelRefused, StopHandle};

use journal::StepEnd;

/// Why an operation was refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// The preflight found the cluster unfit for the operation; nothing was
    /// changed.
    #[error("refused: {0}")]
    Refused(String),
    /// Another operation holds this cluster.
    #[error("another operation is running on this cluster: {running}")]
    Busy {
        /// Its id.
        running: String,
    },
    /// An earlier operation on this cluster was interrupted.
    #[error(
        "operation {id} on this cluster was interrupted at step {step:?}: run `ops resume {id}` or `ops abandon {id}` first"
    )]
    Interrupted {
        /// Its id.
        id: String,
        /// The step in flight, or the next one.
        step: String,
    },
    /// The operation was parked at a step boundary on request
    /// ([`StopHandle::park`]); it stays resumable.
    #[error("operation {id} parked before step {step:?}: resume it to go on")]
    Parked {
        /// Its id.
        id: String,
        /// The next step.
        step: String,
    },
    /// The operation was cancelled before any destructive step
    /// ([`StopHandle::cancel`]).
    #[error("operation {id} cancelled before step {step:?}; nothing was changed")]
    Cancelled {
        /// Its id.
        id: String,
        /// The step it stopped before.
        step: String,
    },
    /// A step failed.
    #[error("step {step:?} failed: {reason}")]
    StepFailed {
        /// The step.
        step: String,
        /// Why.
        reason: String,
    },
    /// No operation has this id.
    #[error("no operation {0:?} in the journal")]
    UnknownOperation(String),
    /// The id prefix matches several operations.
    #[error("{0:?} matches several operations; give more of the id")]
    AmbiguousOperation(String),
    /// The operation cannot be resumed or abandoned in its state.
    #[error("operation {id} is {state:?}: {reason}")]
    NotResumable {
        /// Its id.
        id: String,
        /// Its state.
        state: OpState,
        /// Why.
        reason: String,
    },
    /// The operation belongs to another cluster than the one connected to.
    #[error("operation {id} ran against another cluster (context {context:?})")]
    OtherCluster {
        /// Its id.
        id: String,
        /// Its context.
        context: String,
    },
    /// A call to the cluster failed.
    #[error(transparent)]
    Client(#[from] crate::Error),
    /// The journal could not be read or written.
    #[error("journal {}: {source}", .path.display())]
    Journal {
        /// The database file.
        path: PathBuf,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
    /// A file or directory operation failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A snapshot failed.
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SnapshotError),
}

impl OpsError {
    fn journal(path: &Path, source: rusqlite::Error) -> OpsError {
        OpsError::Journal {
            path: path.to_owned(),
            source,
        }
    }

    fn step(step: &str, reason: impl std::fmt::Display) -> OpsError {
        OpsError::StepFailed {
            step: step.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// The kinds of operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    /// A verified snapshot with retention.
    Snapshot,
    /// Retire a control-plane node.
    Retire,
    /// Wait for a new member to become a healthy voter.
    Join,
    /// Apply a configuration on trial, gate it on health, then confirm.
    Apply,
    /// Join a new node, then retire an old one.
    Migrate,
}

impl OpKind {
    fn name(self) -> &'static str {
        match self {
            OpKind::Snapshot => "snapshot",
            OpKind::Retire => "retire",
            OpKind::Join => "join",
            OpKind::Apply => "apply",
            OpKind::Migrate => "migrate",
        }
    }
}

/// One planned step.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedStep {
    /// Its name.
    pub name: String,
    /// What it will do, in the cluster's terms.
    pub description: String,
    /// Whether it changes the cluster.
    pub destructive: bool,
}

/// What an operation will do, from its preflight; nothing has changed yet.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// The kind.
    pub kind: OpKind,
    /// Its parameters, as journaled.
    pub params: serde_json::Value,
    /// The steps, in order.
    pub steps: Vec<PlannedStep>,
    /// What the preflight found worth saying (e.g. an even member count).
    pub notes: Vec<String>,
    /// Facts the steps start from (node addresses, member ids).
    #[serde(skip)]
    facts: serde_json::Map<String, serde_json::Value>,
}

impl Plan {
    /// Whether any step changes the cluster (a confirmation is due).
    pub fn is_destructive(&self) -> bool {
        self.steps.iter().any(|s| s.destructive)
    }
}

/// Progress of a running operation, for a CLI or a daemon to render.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Event<'a> {
    /// The operation was journaled under this id.
    Started {
        /// Its id.
        id: &'a str,
    },
    /// A step starts (a destructive one is already journaled as started).
    StepStarted {
        /// Its position.
        index: usize,
        /// Its name.
        name: &'a str,
        /// Whether it changes the cluster.
        destructive: bool,
    },
    /// A step's work returned and is about to be journaled as ended.
    StepAnswered {
        /// Its position.
        index: usize,
        /// Its name.
        name: &'a str,
    },
    /// A step ended.
    StepEnded {
        /// Its position.
        index: usize,
        /// Its name.
        name: &'a str,
        /// How.
        state: StepState,
        /// How long it took.
        duration_ms: u64,
        /// Its result in words.
        detail: &'a str,
    },
}

/// How a step's work ended.
struct Outcome {
    state: StepState,
    detail: String,
}

impl Outcome {
    fn done(detail: impl Into<String>) -> Outcome {
        Outcome {
            state: StepState::Done,
            detail: detail.into(),
        }
    }

    fn skipped(detail: impl Into<String>) -> Outcome {
        Outcome {
            state: StepState::Skipped,
            detail: detail.into(),
        }
    }
}

/// The operations layer for one cluster: a client, its identity and the
/// journal in a state directory.
pub struct Ops {
    client: Client,
    context: String,
    endpoints: Vec<String>,
    fingerprint: String,
    state_dir: PathBuf,
    journal: Journal,
    /// When the leave of a retire was answered (for the gap to the reset).
    leave_answered: Option<Instant>,
    /// Park or cancel requests from outside, checked at step boundaries.
    stop: StopHandle,
}

/// The default state directory: `$XDG_STATE_HOME/talosctl-rs`, else
/// `~/.local/state/talosctl-rs`.
pub fn default_state_dir() -> Option<PathBuf> {
    match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => Some(PathBuf::from(dir).join("talosctl-rs")),
        None => std::env::home_dir().map(|h| h.join(".local/state/talosctl-rs")),
    }
}

impl Ops {
    /// The operations layer for the cluster of `context`, journaled in
    /// `state_dir`.
    pub fn open(
        context: &ResolvedContext,
        client: Client,
        state_dir: &Path,
    ) -> Result<Ops, OpsError> {
        let fingerprint = sha2::Sha256::digest(context.credentials.ca_pem())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(Ops {
            client,
            context: context.name.clone(),
            endpoints: context.endpoints.clone(),
            fingerprint,
            state_dir: state_dir.to_owned(),
            journal: Journal::open(state_dir)?,
            leave_answered: None,
            stop: StopHandle::new(),
        })
    }

    /// Lets `stop` park or cancel the next [`Ops::run`] or [`Ops::resume`]
    /// at a step boundary.
    pub fn set_stop(&mut self, stop: StopHandle) {
        self.stop = stop;
    }

    /// sha256 of this cluster's CA certificate (hex), as journaled.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Marks an interrupted operation as needing a person: it is neither
    /// resumed nor ended, and blocks the cluster until resumed or abandoned.
    pub fn mark_needs_attention(&mut self, id: &str) -> Result<OpRecord, OpsError> {
        let record = self.resumable(id)?;
        let _lock = ClusterLock::acquire(&self.state_dir, &self.fingerprint, &record.id)?;
        self.journal
            .set_state(&record.id, OpState::NeedsAttention)?;
        self.journal.get(&record.id)
    }

    /// The journal.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// This cluster's operations, newest first.
    pub fn list(&self) -> Result<Vec<OpRecord>, OpsError> {
        self.journal.list(Some(&self.fingerprint))
    }

    /// One operation (an unambiguous id prefix is enough).
    pub fn show(&self, id: &str) -> Result<OpRecord, OpsError> {
        self.journal.get(id)
    }

    /// Runs `plan`, reporting progress to `observe`. Takes the cluster
    /// lock; refuses while another operation runs or an interrupted one
    /// awaits `resume` or `abandon`.
    pub async fn run(
        &mut self,
        plan: Plan,
        observe: &mut (dyn FnMut(Event<'_>) + Send),
    ) -> Result<OpRecord, OpsError> {
        let id = new_id();
        let _lock = ClusterLock::acquire(&self.state_dir, &self.fingerprint, &id)?;
        self.refuse_if_interrupted()?;
        let now = journal::now();
        let record = OpRecord {
            id: id.clone(),
            kind: plan.kind.name().into(),
            context: self.context.clone(),
            ca_fingerprint: self.fingerprint.clone(),
            params: plan.params.clone(),
            facts: {
                let mut facts = plan.facts.clone();
                facts.insert("params".into(), plan.params.clone());
                serde_json::Value::Object(facts)
            },
            state: OpState::Running,
            created: now.clone(),
            updated: now,
            steps: plan
                .steps
                .iter()
                .enumerate()
                .map(|(index, s)| StepRecord {
                    index,
                    name: s.name.clone(),
                    description: s.description.clone(),
                    destructive: s.destructive,
                    state: StepState::Pending,
                    started: None,
                    finished: None,
                    duration_ms: None,
                    detail: None,
                })
                .collect(),
        };
        self.journal.create(&record)?;
        observe(Event::Started { id: &id });
        self.drive(record, false, observe).await
    }

    /// Continues an interrupted operation: the step that was in flight is
    /// first reconciled with the cluster (done, or sent again), then the
    /// remaining steps run.
    pub async fn resume(
        &mut self,
        id: &str,
        observe: &mut (dyn FnMut(Event<'_>) + Send),
    ) -> Result<OpRecord, OpsError> {
        let record = self.resumable(id)?;
        let _lock = ClusterLock::acquire(&self.state_dir, &self.fingerprint, &record.id)?;
        observe(Event::Started { id: &record.id });
        self.drive(record, true, observe).await
    }

    /// Ends an interrupted or failed operation without further action.
    pub fn abandon(&mut self, id: &str) -> Result<OpRecord, OpsError> {
        let record = self.resumable(id)?;
        let _lock = ClusterLock::acquire(&self.state_dir, &self.fingerprint, &record.id)?;
        self.journal.set_state(&record.id, OpState::Abandoned)?;
        self.journal.get(&record.id)
    }

    fn resumable(&self, id: &str) -> Result<OpRecord, OpsError> {
        let record = self.journal.get(id)?;
        if record.ca_fingerprint != self.fingerprint {
            return Err(OpsError::OtherCluster {
                id: record.id,
                context: record.context,
            });
        }
        if matches!(
            record.state,
            OpState::Succeeded | OpState::Abandoned | OpState::Cancelled
        ) {
            return Err(OpsError::NotResumable {
                id: record.id,
                state: record.state,
                reason: "it has ended".into(),
            });
        }
        Ok(record)
    }

    fn refuse_if_interrupted(&self) -> Result<(), OpsError> {
        // The lock is ours: an operation still marked running was
        // interrupted.
        let interrupted = self
            .journal
            .list(Some(&self.fingerprint))?
            .into_iter()
            .find(|op| matches!(op.state, OpState::Running | OpState::NeedsAttention));
        match interrupted {
            Some(op) => {
                let step = op
                    .in_flight()
                    .or_else(|| op.steps.iter().find(|s| s.state == StepState::Pending))
                    .map(|s| s.name.clone())
                    .unwrap_or_default();
                Err(OpsError::Interrupted { id: op.id, step })
            }
            None => Ok(()),
        }
    }

    async fn drive(
        &mut self,
        record: OpRecord,
        resuming: bool,
        observe: &mut (dyn FnMut(Event<'_>) + Send),
    ) -> Result<OpRecord, OpsError> {
        let id = record.id.clone();
        if resuming {
            self.journal.set_state(&id, OpState::Running)?;
        }
        let mut facts = match record.facts.clone() {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        let kind = record.kind.clone();
        let steps = record.steps.clone();
        let mut started_with_previous = false;
        if steps
            .iter()
            .any(|s| s.destructive && s.state != StepState::Pending)
        {
            self.stop.enter_destructive();
        }
        for (index, step) in steps.iter().enumerate() {
            if matches!(step.state, StepState::Done | StepState::Skipped) {
                continue;
            }
            let started = Instant::now();
            // A running step is one in flight when the process died (on
            // resume) or one started in the same commit as the previous
            // step's end.
            let in_flight = step.state == StepState::Running;
            if !in_flight && !started_with_previous {
                self.stop_at_boundary(&id, step)?;
                self.journal.step_started(&id, index)?;
            }
            observe(Event::StepStarted {
                index,
                name: &step.name,
                destructive: step.destructive,
            });
            let result = if in_flight && resuming {
                if let Some(started) = &step.started {
                    facts.insert("in_flight_started".into(), started.clone().into());
                }
                self.reconcile(&kind, &step.name, &mut facts).await
            } else {
                self.execute(&kind, &step.name, &mut facts).await
            };
            observe(Event::StepAnswered {
                index,
                name: &step.name,
            });
            let duration_ms = started.elapsed().as_millis() as u64;
            let facts_value = serde_json::Value::Object(facts.clone());
            match result {
                Ok(outcome) => {
                    // A destructive next step is journaled as started in the
                    // same commit, so nothing slow sits between the two.
                    // A park or cancel stops before it, unless this step
                    // was destructive too (a sequence runs to its end).
                    let next = steps
                        .get(index + 1)
                        .filter(|s| s.destructive)
                        .filter(|_| step.destructive || !self.stop.is_stopping())
                        .filter(|_| self.stop.enter_destructive())
                        .map(|_| index + 1);
                    self.journal.step_ended(
                        &id,
                        index,
                        StepEnd {
                            state: outcome.state,
                            duration_ms,
                            detail: Some(&outcome.detail),
                        },
                        &facts_value,
                        next,
                    )?;
                    observe(Event::StepEnded {
                        index,
                        name: &step.name,
                        state: outcome.state,
                        duration_ms,
                        detail: &outcome.detail,
                    });
                    started_with_previous = next.is_some();
                }
                Err(error) => {
                    let detail = error.to_string();
                    self.journal.step_ended(
                        &id,
                        index,
                        StepEnd {
                            state: StepState::Failed,
                            duration_ms,
                            detail: Some(&detail),
                        },
                        &facts_value,
                        None,
                    )?;
                    self.journal.set_state(&id, OpState::Failed)?;
                    observe(Event::StepEnded {
                        index,
                        name: &step.name,
                        state: StepState::Failed,
                        duration_ms,
                        detail: &detail,
                    });
                    return Err(match error {
                        e @ OpsError::StepFailed { .. } => e,
                        other => OpsError::step(&step.name, other),
                    });
                }
            }
        }
        self.journal.set_state(&id, OpState::Succeeded)?;
        self.journal.get(&id)
    }

    /// At a step boundary: ends the run as cancelled or parked when asked.
    fn stop_at_boundary(&mut self, id: &str, step: &StepRecord) -> Result<(), OpsError> {
        let stopped = match self.stop.at_boundary() {
            None if !step.destructive || self.stop.enter_destructive() => return Ok(()),
            None | Some(true) => {
                self.journal.set_state(id, OpState::Cancelled)?;
                OpsError::Cancelled {
                    id: id.into(),
                    step: step.name.clone(),
                }
            }
            Some(false) => OpsError::Parked {
                id: id.into(),
                step: step.name.clone(),
            },
        };
        Err(stopped)
    }

    async fn execute(
        &mut self,
        kind: &str,
        step: &str,
        facts: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<Outcome, OpsError> {
        match kind {
            "snapshot" => self.snapshot_step(step, facts).await,
            "retire" => self.retire_step(step, facts).await,
            "join" => self.join_step(step, facts).await,
            "apply" => self.apply_step(step, facts).await,
            "migrate" => self.migrate_step(step, facts).await,
            other => Err(OpsError::step(
                step,
                format!("unknown operation kind {other:?}"),
            )),
        }
    }

    async fn reconcile(
        &mut self,
        kind: &str,
        step: &str,
        facts: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<Outcome, OpsError> {
        if (kind == "retire" || kind == "migrate")
            && let Some(outcome) = self.reconcile_retire(step, facts).await?
        {
            return Ok(outcome);
        }
        if kind == "apply"
            && let Some(outcome) = self.reconcile_apply(step, facts).await?
        {
            return Ok(outcome);
        }
        if step == "apply-config"
            && let Some(outcome) = self.reconcile_maintenance_apply(facts).await?
        {
            return Ok(outcome);
        }
        // Everything else is safe to do again.
        self.execute(kind, step, facts).await
    }
}

/// A sortable, unique operation id: UTC time and randomness.
fn new_id() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let now = time::OffsetDateTime::now_utc();
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_i128(now.unix_timestamp_nanos());
    hasher.write_u32(std::process::id());
    format!(
        "{}-{:06x}",
        compact_utc(now, false),
        hasher.finish() & 0xff_ffff
    )
}

/// `YYYYMMDDTHHMMSS` (with `.mmm` when `millis`), for sortable names.
fn compact_utc(t: time::OffsetDateTime, millis: bool) -> String {
    let base = format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    );
    if millis {
        format!("{base}.{:03}", t.millisecond())
    } else {
        base
    }
}

fn fact<'a>(facts: &'a serde_json::Map<String, serde_json::Value>, key: &str) -> &'a str {
    facts.get(key).and_then(|v| v.as_str()).unwrap_or_default()
}
