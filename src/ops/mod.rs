//! Safe composite operations: the runbooks of moving the control plane to
//! new machines as plain library code, run by `talosctl-rs ops` and the
//! talos-opsd daemon, and usable by any program that links the crate
//! (feature `ops`).
//!
//! An operation is a typed value, an [`OpSpec`]: one variant per operation
//! with its options type. [`Ops::plan`] takes the cluster's lock, reads the
//! cluster (preflight) and builds a [`Plan`] of typed steps with the facts
//! they start from, or refuses with a typed [`Refusal`]; nothing has
//! changed yet, and the lock stays held by the plan through a confirmation
//! until [`Ops::run`] ends. The run goes step by step through the
//! [`Journal`], which stores the spec as the operation's parameters: a
//! destructive step is recorded as started before its call is sent, so
//! after a crash [`Ops::show`] names the step in flight and [`Ops::resume`]
//! reconciles it with the cluster before going on.
//!
//! - [`OpSpec::Snapshot`]: a verified snapshot from a healthy voter, with
//!   retention;
//! - [`OpSpec::Retire`]: snapshot, forfeit, leave, reset at once, wait
//!   until the node is silent;
//! - [`OpSpec::Join`]: wait until a new member is a healthy voter;
//! - [`OpSpec::Apply`]: a configuration on trial (TRY), a health gate
//!   within the try window, then confirmation or a verified rollback;
//! - [`OpSpec::Migrate`]: join a new node (from maintenance mode), then
//!   retire an old one, as one operation: the join's steps, a fresh check,
//!   the retire's steps.
//!
//! A new operation is one file here (its options, step enum, facts, plan
//! and steps), one [`OpSpec`] variant (with its [`Step`] and [`Facts`]
//! variants and its arm in the engine's dispatch).
//!
//! A [`StopHandle`] given to [`Ops::set_stop`] parks a running operation at
//! its next step boundary (resumable) or cancels it before any destructive
//! step; a daemon uses it for cancel requests and shutdown.

mod apply;
mod apply_kube;
mod apply_steps;
mod apply_vip;
mod cluster;
mod cluster_lock;
mod config_diff;
mod defrag;
mod drill;
mod engine;
mod fresh;
mod fresh_checks;
mod guard;
mod identity;
mod join;
mod journal;
#[cfg(feature = "backup")]
mod kit;
mod lock;
mod migrate;
mod offhost;
pub(crate) mod plan;
mod policy;
mod preflight;
mod refusal;
mod report;
mod restore;
mod retire;
mod sa_validation;
mod secret_paths;
mod send;
mod snapshot;
mod spec;
mod stop;
mod upgrade;
mod wipe;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use sha2::Digest as _;

use crate::Client;
use crate::config::ResolvedContext;

pub use apply::{ApplyFacts, ApplyPhase, ApplyStep};
pub use cluster_lock::{ClusterLockPolicy, ClusterLockRecord, Fence, LEASE_NAME, LEASE_NAMESPACE};
pub use config_diff::ConfigParseError;
pub use defrag::{DefragFacts, DefragMember, DefragPhase, DefragStep};
pub use drill::{DrillFacts, DrillStep};
pub use fresh::{CheckKind, CheckRecord};
pub use guard::check_plain_reset;
pub use identity::TargetIdentity;
pub use join::{JoinFacts, JoinStep, PlannedMaintenance};
pub use journal::{Journal, OpRecord, OpState, StepRecord, StepState, Unsaved};
pub use lock::ClusterLock;
pub use migrate::{MigrateFacts, MigrateStep};
pub use offhost::S3Access;
pub use plan::{Facts, Plan, PlannedStep, Step};
pub use policy::Source;
pub use refusal::Refusal;
pub use report::{
    BackupSeen, CertificateSeen, DEFAULT_QUOTA_BYTES, DrillSeen, Finding, Level, LockSeen,
    MemberSeen, REPORT_CHECKS, ReportOptions, RiskReport, Thresholds, age_text,
};
pub use restore::{RestoreFacts, RestoreStep};
pub use retire::{PlannedMember, RetireFacts, RetireStep};
pub use sa_validation::MachineRole;
pub use snapshot::{OffHost, SnapshotFacts, SnapshotStep, Tiers, held_snapshots};
pub use spec::{
    ApplyOptions, DURATION_BOUNDS, DefragOptions, DrillOptions, JoinOptions, LeaseProbe,
    MaintenanceApply, MigrateOptions, OpKind, OpSpec, RestoreOptions, RetireOptions,
    SnapshotOptions, UpgradeOptions, duration_bounds,
};
pub use stop::{CancelRefused, StopHandle};
pub use upgrade::{UpgradeFacts, UpgradeNode, UpgradePhase, UpgradeStep, image_release};

/// Why an operation was refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// The preflight found the cluster unfit for the operation; nothing was
    /// changed.
    #[error("refused: {0}")]
    Refused(#[from] Refusal),
    /// Another operation holds this cluster.
    #[error("another operation holds this cluster: {holder}")]
    Busy {
        /// Its operation id and process.
        holder: String,
    },
    /// An earlier operation on this cluster was interrupted.
    #[error(
        "operation {id} on this cluster was interrupted at step {step:?}: resume or abandon it first"
    )]
    Interrupted {
        /// Its id.
        id: String,
        /// The step in flight, or the next one.
        step: String,
    },
    /// An earlier operation on this cluster stopped needing attention.
    #[error(
        "operation {id} on this cluster needs attention: step {step:?} {what}; look, then resume or abandon it first"
    )]
    AwaitsAttention {
        /// Its id.
        id: String,
        /// The step that failed (or was in flight when it stopped).
        step: String,
        /// What happened to it, in words.
        what: String,
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
    /// A step found the node or the cluster not as it must be to go on
    /// safely, where going on could do harm (reset a live member, count a
    /// silent node as reset): a person looks, then resumes or abandons.
    #[error("step {step:?} needs attention: {reason}")]
    NeedsAttention {
        /// The step.
        step: String,
        /// What it found.
        reason: String,
    },
    /// A wait was stopped by a park (`cancel` false) or a cancel; the
    /// engine ends the run as [`OpsError::Parked`] or
    /// [`OpsError::Cancelled`].
    #[error("stopped while waiting")]
    StoppedWaiting {
        /// A cancel, not a park.
        cancel: bool,
    },
    /// A snapshot source sent nothing for the stall bound.
    #[error("the snapshot from {node} stalled: no bytes for {seconds} s")]
    SnapshotStalled {
        /// The source.
        node: String,
        /// The bound.
        seconds: u64,
    },
    /// A step needs a fact its operation's record does not hold.
    #[error("the operation's facts lack {0:?}, which this step needs: abandon the operation")]
    MissingFact(String),
    /// No operation has this id.
    #[error("no operation {} in the journal", crate::text::quoted(.0))]
    UnknownOperation(String),
    /// The id prefix matches several operations.
    #[error("{} matches several operations; give more of the id", crate::text::quoted(.0))]
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
    /// The operation was journaled in an earlier format, which this version
    /// does not run.
    #[error(
        "operation {id} was journaled by an earlier version (journal format {format}), whose parameters and steps this version does not read: finish it with that version, or abandon it"
    )]
    EarlierFormat {
        /// Its id.
        id: String,
        /// Its format.
        format: u32,
    },
    /// The journal was written by a later version.
    #[error(
        "journal {} has format {format}, newer than this version's: use the version that wrote it, or another state directory",
        .path.display()
    )]
    LaterFormat {
        /// The database file.
        path: PathBuf,
        /// Its format.
        format: u32,
    },
    /// A part of an operation's record does not read as its type.
    #[error("operation {id}: its {what} cannot be read ({reason}): abandon it")]
    Unreadable {
        /// Its id.
        id: String,
        /// Which part.
        what: String,
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
    #[error("journal {}: {source}", crate::text::shown_path(&.path.to_string_lossy()))]
    Journal {
        /// The database file.
        path: PathBuf,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
    /// The journal is empty where one existed, or corrupt: nothing is
    /// read from it, and nothing is written.
    #[error(
        "journal {} cannot be trusted: {reason}. Stop everything that uses this state directory and keep a copy of the file; then restore it from a backup, or move it aside (talos-opsd --recover-journal does so, keeping it as {}.corrupt-TIME) to start a new journal without the history",
        .path.display(), .path.display()
    )]
    CorruptJournal {
        /// The database file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file or directory operation failed.
    #[error("{}: {source}", crate::text::shown_path(&.path.to_string_lossy()))]
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

    fn attention(step: &str, reason: impl std::fmt::Display) -> OpsError {
        OpsError::NeedsAttention {
            step: step.to_string(),
            reason: reason.to_string(),
        }
    }

    /// Between two polls of a wait: stops it when a park or cancel was
    /// asked.
    fn poll_stop(stop: &StopHandle) -> Result<(), OpsError> {
        match stop.at_boundary() {
            Some(cancel) => Err(OpsError::StoppedWaiting { cancel }),
            None => Ok(()),
        }
    }

    fn step(step: &str, reason: impl std::fmt::Display) -> OpsError {
        OpsError::StepFailed {
            step: step.to_string(),
            reason: reason.to_string(),
        }
    }

    /// The refusal, when this is one.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            OpsError::Refused(r) => Some(r),
            _ => None,
        }
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
        /// The node it acts on, when the operation has several.
        node: Option<&'a str>,
        /// Whether it changes the cluster.
        destructive: bool,
    },
    /// A destructive step's check held, right before its work (and its
    /// send) begins.
    StepChecked {
        /// Its position.
        index: usize,
        /// Its name.
        name: &'a str,
        /// The node it acts on, when the operation has several.
        node: Option<&'a str>,
    },
    /// A step's work returned and is about to be journaled as ended.
    StepAnswered {
        /// Its position.
        index: usize,
        /// Its name.
        name: &'a str,
        /// The node it acts on, when the operation has several.
        node: Option<&'a str>,
    },
    /// A step ended.
    StepEnded {
        /// Its position.
        index: usize,
        /// Its name.
        name: &'a str,
        /// The node it acts on, when the operation has several.
        node: Option<&'a str>,
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
/// journal in a state directory. `Sync`, so its futures are `Send` and a
/// daemon runs each operation as a task.
pub struct Ops {
    client: Client,
    context: String,
    endpoints: Vec<String>,
    fingerprint: String,
    state_dir: PathBuf,
    journal: Journal,
    /// Where snapshots go and how many are kept unless a spec says.
    snapshot_dir: PathBuf,
    snapshot_keep: usize,
    /// When the leave of a retire was answered (for the gap to the reset).
    leave_answered: Option<Instant>,
    /// The Lease a retire renews while it runs (its lease probe).
    lease_renewer: Option<crate::kube::LeaseRenewer>,
    /// Service-account tokens an apply minted before each node's change,
    /// by node (in memory only: a token is a credential).
    kube_tokens: std::collections::BTreeMap<String, String>,
    /// How long a snapshot stream may send nothing.
    snapshot_stall: std::time::Duration,
    /// The leave's deadline, and how long an ambiguous leave is settled.
    leave_timeouts: (std::time::Duration, std::time::Duration),
    /// Park or cancel requests from outside, checked at step boundaries.
    stop: StopHandle,
    /// Whether plans and resumes take the cluster lock.
    cluster_lock_policy: ClusterLockPolicy,
    /// The cluster lock of the operation running, when held in a Lease.
    cluster_lease: Option<Arc<crate::kube::HeldLease>>,
    /// The checks the current step ran (see [`fresh`]), journaled with it.
    checks: std::sync::Mutex<Vec<CheckRecord>>,
}

impl Ops {
    /// The operations layer for the cluster of `context`, journaled in
    /// `state_dir` (snapshots into `STATE_DIR/snapshots`, all kept, unless
    /// [`Ops::set_snapshot_defaults`] says otherwise).
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
            snapshot_dir: state_dir.join("snapshots"),
            snapshot_keep: 0,
            leave_answered: None,
            lease_renewer: None,
            kube_tokens: Default::default(),
            snapshot_stall: Ops::DEFAULT_SNAPSHOT_STALL,
            leave_timeouts: (Ops::DEFAULT_LEAVE_DEADLINE, Ops::DEFAULT_LEAVE_SETTLE),
            stop: StopHandle::new(),
            cluster_lock_policy: ClusterLockPolicy::default(),
            cluster_lease: None,
            checks: Default::default(),
        })
    }

    /// Whether [`Ops::plan`], [`Ops::run`] and [`Ops::resume`] take the
    /// cluster lock of an operation that may change the cluster (default:
    /// required, refusing where Kubernetes cannot be reached).
    pub fn set_cluster_lock_policy(&mut self, policy: ClusterLockPolicy) {
        self.cluster_lock_policy = policy;
    }

    /// Where snapshots go and how many are kept (0: all) when a spec does
    /// not say.
    pub fn set_snapshot_defaults(&mut self, dir: PathBuf, keep: usize) {
        self.snapshot_dir = dir;
        self.snapshot_keep = keep;
    }

    /// How long a snapshot stream may send nothing before it fails (and
    /// the operation tries once more from another healthy voter).
    pub const DEFAULT_SNAPSHOT_STALL: std::time::Duration = std::time::Duration::from_secs(30);

    /// Sets how long a snapshot stream may send nothing (default
    /// [`Ops::DEFAULT_SNAPSHOT_STALL`]).
    pub fn set_snapshot_stall(&mut self, stall: std::time::Duration) {
        self.snapshot_stall = stall;
    }

    /// The client's deadline for EtcdLeaveCluster: past the 5 minutes
    /// Talos itself retries removing the member
    /// (internal/pkg/etcd/etcd.go, LeaveCluster), so the client does not
    /// give up on a leave that is still going to land.
    pub const DEFAULT_LEAVE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(330);

    /// How long a leave whose answer said nothing (deadline, dropped
    /// connection) is settled by asking a survivor whether the member is
    /// gone; still listed after that, the operation needs attention.
    pub const DEFAULT_LEAVE_SETTLE: std::time::Duration = std::time::Duration::from_secs(30);

    /// Sets the leave's deadline and its settling time (defaults
    /// [`Ops::DEFAULT_LEAVE_DEADLINE`], [`Ops::DEFAULT_LEAVE_SETTLE`]).
    pub fn set_leave_timeouts(
        &mut self,
        deadline: std::time::Duration,
        settle: std::time::Duration,
    ) {
        self.leave_timeouts = (deadline, settle);
    }

    /// The cluster as read now. Should the endpoint's etcd hang (a frozen
    /// leader stalls its member list), the members come from the other
    /// endpoints' own lists, so that the hung member is named as
    /// unhealthy instead of the whole read timing out.
    async fn read_view(&self) -> Result<cluster::ClusterView, crate::Error> {
        cluster::ClusterView::read_via(
            &self.client,
            cluster::VOTER_CALL_TIMEOUT,
            &self.endpoint_hosts(),
        )
        .await
    }

    /// The hosts of the talosconfig's endpoints.
    fn endpoint_hosts(&self) -> Vec<String> {
        self.endpoints
            .iter()
            .filter_map(|e| crate::config::normalize_endpoint(e).ok())
            .map(|e| e.host)
            .collect()
    }

    fn snapshot_dir(&self, dir: Option<&PathBuf>) -> PathBuf {
        dir.cloned().unwrap_or_else(|| self.snapshot_dir.clone())
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

    fn lock(&self, id: &str) -> Result<ClusterLock, OpsError> {
        ClusterLock::acquire(&self.state_dir, &self.fingerprint, id)
    }

    /// Takes the cluster's lock, refuses while an interrupted operation
    /// awaits `resume` or `abandon`, and plans `spec` from a fresh read of
    /// the cluster. The plan holds the lock until it is run or dropped.
    pub async fn plan(&self, spec: &OpSpec) -> Result<Plan, OpsError> {
        spec.check_bounds()?;
        let id = new_id();
        let lock = self.lock(&id)?;
        self.refuse_if_interrupted()?;
        let cluster_lock = match spec.may_change_cluster() {
            true => self.take_cluster_lock(&id).await?,
            false => None,
        };
        let mut plan = self.plan_spec(spec).await?;
        plan.id = id;
        plan.lock = Some(Arc::new(lock));
        // After the fingerprint: the holder names this plan's id.
        match &cluster_lock {
            Some(hold) => plan.notes.push(format!("cluster lock: {}", hold.record)),
            None if spec.may_change_cluster() => plan
                .notes
                .push("cluster lock: taken when the operation starts".into()),
            None => {}
        }
        plan.cluster_lock = cluster_lock;
        Ok(plan)
    }

    /// Plans `spec` as [`Ops::plan`] does and changes nothing, without
    /// taking a lock, neither the state directory's nor the cluster lock:
    /// any number of previews run at once, and a preview of an unreachable
    /// cluster holds nothing while it waits. Refused as a plan would be
    /// while another operation holds the cluster or an interrupted one
    /// awaits `resume` or `abandon`. The plan has no id and no lock;
    /// [`Ops::run`] takes both (and refuses as [`Ops::plan`] does) should it
    /// be run.
    pub async fn preview(&self, spec: &OpSpec) -> Result<Plan, OpsError> {
        spec.check_bounds()?;
        let waiting = self
            .journal
            .list(Some(&self.fingerprint))?
            .into_iter()
            .find(|op| matches!(op.state, OpState::Running | OpState::NeedsAttention));
        if let Some(op) = &waiting
            && op.state == OpState::Running
        {
            // Running in another process, or interrupted: only the lock
            // tells, and it is let go at once.
            ClusterLock::probe(&self.state_dir, &self.fingerprint)?;
        }
        if waiting.is_some() {
            self.refuse_if_interrupted()?;
        }
        let mut plan = self.plan_spec(spec).await?;
        if spec.may_change_cluster() {
            plan.notes
                .push("cluster lock: taken when the operation starts".into());
        }
        Ok(plan)
    }

    async fn plan_spec(&self, spec: &OpSpec) -> Result<Plan, OpsError> {
        let plan = match spec {
            OpSpec::Snapshot(o) => self.plan_snapshot(o).await?,
            OpSpec::Retire(o) => self.plan_retire(o).await?,
            OpSpec::Join(o) => self.plan_join(o).await?,
            OpSpec::Migrate(o) => self.plan_migrate(o).await?,
            OpSpec::Apply(o) => self.plan_apply(o).await?,
            OpSpec::Drill(o) => self.plan_drill(o).await?,
            OpSpec::Defrag(o) => self.plan_defrag(o).await?,
            OpSpec::Upgrade(o) => self.plan_upgrade(o).await?,
            OpSpec::Restore(o) => self.plan_restore(o).await?,
        };
        Ok(plan)
    }

    /// Marks an interrupted operation as needing a person: it is neither
    /// resumed nor ended, and blocks the cluster until resumed or abandoned.
    pub fn mark_needs_attention(&mut self, id: &str) -> Result<OpRecord, OpsError> {
        let record = self.resumable(id)?;
        let _lock = self.lock(&record.id)?;
        self.journal
            .set_state(&record.id, OpState::NeedsAttention)?;
        self.journal.get(&record.id)
    }

    /// Ends an interrupted or failed operation without further action (an
    /// operation of an earlier journal format too).
    pub fn abandon(&mut self, id: &str) -> Result<OpRecord, OpsError> {
        let record = self.resumable(id)?;
        let _lock = self.lock(&record.id)?;
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
        let unsettled = self
            .journal
            .list(Some(&self.fingerprint))?
            .into_iter()
            .find(|op| matches!(op.state, OpState::Running | OpState::NeedsAttention));
        let Some(op) = unsettled else {
            return Ok(());
        };
        let pending = || op.steps.iter().find(|s| s.state == StepState::Pending);
        if op.state == OpState::Running {
            let step = op.in_flight().or_else(pending).map(|s| s.label());
            return Err(OpsError::Interrupted {
                id: op.id.clone(),
                step: step.unwrap_or_default(),
            });
        }
        // Needing attention: the step that failed says why, else the one
        // in flight when it stopped.
        let failed = op.steps.iter().find(|s| s.state == StepState::Failed);
        let (step, what) = match (failed, op.in_flight()) {
            (Some(s), _) => (
                s.label(),
                format!("failed: {}", s.detail.as_deref().unwrap_or("no detail")),
            ),
            (None, Some(s)) => (s.label(), "was in flight when it stopped".to_string()),
            (None, None) => (
                pending().map(|s| s.label()).unwrap_or_default(),
                "is next".to_string(),
            ),
        };
        Err(OpsError::AwaitsAttention {
            id: op.id.clone(),
            step,
            what,
        })
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
