//! The journal: every operation, its parameters, its cluster and each step
//! with its state and times, in SQLite (WAL) under the state directory. A
//! destructive step is recorded as started before its call is sent, so
//! after a crash the journal names the step that was in flight. It never
//! holds key material: clusters are named by context and CA fingerprint.
//!
//! Format 2 (this one) stores an operation's parameters as its
//! [`OpSpec`](super::OpSpec), its facts as the operation's typed facts and
//! each step as its typed step. A journal written before (format 1, string
//! steps and loose parameters) is upgraded in place: its records stay
//! listable and showable, and an operation of format 1 can only be
//! abandoned, never resumed, so nothing is misread.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension as _, params};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::OpsError;
use super::fresh::CheckRecord;
use super::plan::{Facts, Step};
use super::spec::OpSpec;

#[path = "journal_schema.rs"]
mod schema;
#[path = "journal_settle.rs"]
mod settle;
pub use settle::Unsaved;
use settle::UnsavedEnd;

/// The format this version writes.
pub(crate) const FORMAT: u32 = 2;

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum OpState {
    /// Running, or interrupted by a crash (then no process holds its lock).
    Running,
    /// Every step succeeded.
    Succeeded,
    /// A step failed; the steps say which and why.
    Failed,
    /// Ended by `abandon` without further action.
    Abandoned,
    /// Cancelled before any destructive step; nothing was changed.
    Cancelled,
    /// Interrupted with a step in flight that is not safe to continue
    /// unattended: a person decides (`resume` or `abandon`).
    NeedsAttention,
}

/// Where a step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum StepState {
    /// Not started.
    Pending,
    /// Started (for a destructive step: recorded before its call was sent).
    Running,
    /// Finished.
    Done,
    /// Not needed (e.g. no forfeit when the node does not lead).
    Skipped,
    /// Failed.
    Failed,
}

/// One step of an operation as journaled.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StepRecord {
    /// Position in the plan, from 0.
    pub index: usize,
    /// The step's name (`snapshot`, `leave`, `reset`, ...).
    pub name: String,
    /// The node it acts on, when the operation has several (apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// What it does.
    pub description: String,
    /// Whether it changes the cluster.
    pub destructive: bool,
    /// Where it stands.
    pub state: StepState,
    /// When it started (RFC 3339).
    pub started: Option<String>,
    /// When it ended (RFC 3339).
    pub finished: Option<String>,
    /// How long it took.
    pub duration_ms: Option<u64>,
    /// Its result or failure, in words.
    pub detail: Option<String>,
    /// The fencing check made right before it (a destructive step of an
    /// operation holding the cluster lock): the Lease still ours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<super::Fence>,
    /// The checks the engine ran right before sending it (a destructive
    /// step), every attempt's, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckRecord>,
    /// The typed step (format 2).
    #[serde(skip_serializing, default)]
    pub(crate) step: Option<Step>,
}

impl StepRecord {
    /// Its name, with its node when it has one (`try 10.5.0.2`).
    pub fn label(&self) -> String {
        super::plan::label(&self.name, self.node.as_deref())
    }

    /// Whether the cluster cannot be put back as it was once this step
    /// ran ([`Step::point_of_no_return`]); false for a record of an earlier
    /// format, which holds no typed step.
    pub fn point_of_no_return(&self) -> bool {
        self.step.as_ref().is_some_and(Step::point_of_no_return)
    }
}

/// One operation as journaled.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OpRecord {
    /// Its id.
    pub id: String,
    /// `snapshot`, `retire`, `join`, `migrate` or `apply`.
    pub kind: String,
    /// The talosconfig context it ran against.
    pub context: String,
    /// sha256 of the cluster CA certificate (hex).
    pub ca_fingerprint: String,
    /// Its parameters: the [`OpSpec`] (format 2).
    pub params: serde_json::Value,
    /// Facts found by the preflight and gathered while running (snapshot
    /// path, gap, ...): the operation's typed facts (format 2).
    pub facts: serde_json::Value,
    /// The journal format it was written in.
    #[serde(default = "format_one")]
    pub format: u32,
    /// Where it stands.
    pub state: OpState,
    /// When it was created (RFC 3339).
    pub created: String,
    /// When it last changed (RFC 3339).
    pub updated: String,
    /// Its steps, in order.
    pub steps: Vec<StepRecord>,
    /// How it holds the cluster lock (none for an operation that changes
    /// nothing, or one journaled before there was a cluster lock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_lock: Option<super::ClusterLockRecord>,
}

fn format_one() -> u32 {
    1
}

impl OpRecord {
    /// Refuses a record of an earlier format, saying what to do.
    fn current(&self) -> Result<(), OpsError> {
        if self.format == FORMAT {
            return Ok(());
        }
        Err(OpsError::EarlierFormat {
            id: self.id.clone(),
            format: self.format,
        })
    }

    /// Its spec.
    pub fn spec(&self) -> Result<OpSpec, OpsError> {
        self.current()?;
        serde_json::from_value(self.params.clone()).map_err(|e| self.unreadable("params", e))
    }

    /// Its typed facts.
    pub fn typed_facts(&self) -> Result<Facts, OpsError> {
        self.current()?;
        serde_json::from_value(self.facts.clone()).map_err(|e| self.unreadable("facts", e))
    }

    /// Its typed steps.
    pub(crate) fn typed_steps(&self) -> Result<Vec<Step>, OpsError> {
        self.current()?;
        self.steps
            .iter()
            .map(|s| {
                s.step.clone().ok_or_else(|| OpsError::Unreadable {
                    id: self.id.clone(),
                    what: format!("step {}", s.index + 1),
                    reason: "no typed step".into(),
                })
            })
            .collect()
    }

    fn unreadable(&self, what: &str, e: serde_json::Error) -> OpsError {
        OpsError::Unreadable {
            id: self.id.clone(),
            what: what.into(),
            reason: e.to_string(),
        }
    }

    /// The step that was started and not finished: after a crash, the one
    /// in flight.
    pub fn in_flight(&self) -> Option<&StepRecord> {
        self.steps.iter().find(|s| s.state == StepState::Running)
    }
}

/// The journal database. Its connection sits behind a mutex, so a journal
/// (and an [`Ops`](super::Ops) holding one) can be shared between tasks and
/// an operation's future is `Send`; no lock is held across an await.
pub struct Journal {
    conn: std::sync::Mutex<Connection>,
    path: PathBuf,
    /// What a failed write was about to record, per operation.
    unsaved: std::sync::Mutex<std::collections::HashMap<String, Unsaved>>,
}

pub(crate) fn now() -> String {
    OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS operations (
  id TEXT PRIMARY KEY, kind TEXT NOT NULL, context TEXT NOT NULL,
  ca_fingerprint TEXT NOT NULL, params TEXT NOT NULL, facts TEXT NOT NULL,
  state TEXT NOT NULL, created TEXT NOT NULL, updated TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS steps (
  op_id TEXT NOT NULL, idx INTEGER NOT NULL, name TEXT NOT NULL,
  description TEXT NOT NULL, destructive INTEGER NOT NULL, state TEXT NOT NULL,
  started TEXT, finished TEXT, duration_ms INTEGER, detail TEXT,
  PRIMARY KEY (op_id, idx));
CREATE TABLE IF NOT EXISTS step_checks (
  op_id TEXT NOT NULL, idx INTEGER NOT NULL, seq INTEGER NOT NULL,
  record TEXT NOT NULL, PRIMARY KEY (op_id, idx, seq));
";

/// Columns added within format 2 (an earlier version reading the journal
/// ignores them): how each operation holds the cluster lock, and each
/// destructive step's fencing check.
const CLUSTER_LOCK_COLUMNS: &[(&str, &str)] = &[("operations", "cluster_lock"), ("steps", "fence")];

/// From format 1: the record's format (1 for the rows already there), each
/// step's node and typed step.
const UPGRADE_TO_2: &str = "
ALTER TABLE operations ADD COLUMN format INTEGER NOT NULL DEFAULT 1;
ALTER TABLE steps ADD COLUMN node TEXT;
ALTER TABLE steps ADD COLUMN step TEXT;
PRAGMA user_version = 2;
";

fn to_text<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn from_text<T: for<'de> Deserialize<'de>>(text: &str) -> Option<T> {
    serde_json::from_value(serde_json::Value::String(text.to_string())).ok()
}

impl Journal {
    /// Opens (creating) the journal in `state_dir` (mode 0700).
    pub fn open(state_dir: &Path) -> Result<Journal, OpsError> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(state_dir)
            .map_err(|source| OpsError::Io {
                path: state_dir.to_owned(),
                source,
            })?;
        let path = state_dir.join("journal.sqlite");
        // Another process may be creating the same journal, and SQLite
        // answers "database is locked" to a switch into WAL mode at once,
        // without its busy handler: the setup is serialised by an advisory
        // lock on a file beside the journal, held only for the setup.
        let setup_path = state_dir.join("journal.setup.lock");
        let setup = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&setup_path)
            .and_then(|file| file.lock().map(|()| file))
            .map_err(|source| OpsError::Io {
                path: setup_path,
                source,
            })?;
        // A journal is never empty once created (the switch into WAL mode
        // writes its header at once, under the setup lock): an empty file
        // is one that lost its contents, and is not taken for a new one.
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == 0) {
            return Err(OpsError::CorruptJournal {
                path,
                reason: "the file is empty (0 bytes), so the history it held is gone".into(),
            });
        }
        let conn = Connection::open(&path).map_err(|e| OpsError::journal(&path, e))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .and_then(|()| conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"))
            .map_err(|e| corrupt_or(&path, e))?;
        schema::prepare(&conn, &path)?;
        add_columns(&conn, &path)?;
        drop(setup);
        restrict(&path)?;
        Ok(Journal {
            conn: std::sync::Mutex::new(conn),
            path,
            unsaved: Default::default(),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What a failed write of operation `id` was about to record, if one
    /// failed through this journal.
    pub fn unsaved(&self, id: &str) -> Option<Unsaved> {
        self.unsaved
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    fn remember(&self, id: &str, add: impl FnOnce(&mut Unsaved)) {
        let mut all = self.unsaved.lock().unwrap_or_else(|e| e.into_inner());
        add(all.entry(id.to_string()).or_default());
    }

    /// Records `settled` (made by [`OpRecord::settled`] from the journal's
    /// own record) in one transaction: its state, facts and every step.
    /// Returns `false`, writing nothing, when the operation is no longer
    /// running in the journal (another process ended it meanwhile).
    pub fn settle(&self, settled: &OpRecord) -> Result<bool, OpsError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| self.err(e))?;
        let changed = tx
            .execute(
                "UPDATE operations SET state = ?2, facts = ?3, updated = ?4 WHERE id = ?1 AND state = 'running'",
                params![
                    settled.id,
                    to_text(&settled.state),
                    settled.facts.to_string(),
                    settled.updated
                ],
            )
            .map_err(|e| self.err(e))?;
        if changed == 0 {
            return Ok(false);
        }
        for step in &settled.steps {
            tx.execute(
                "UPDATE steps SET state = ?3, started = ?4, finished = ?5, duration_ms = ?6, detail = ?7 WHERE op_id = ?1 AND idx = ?2",
                params![
                    settled.id,
                    step.index,
                    to_text(&step.state),
                    step.started,
                    step.finished,
                    step.duration_ms,
                    step.detail
                ],
            )
            .map_err(|e| self.err(e))?;
        }
        tx.commit().map_err(|e| self.err(e))?;
        self.unsaved
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&settled.id);
        Ok(true)
    }

    fn err(&self, e: rusqlite::Error) -> OpsError {
        corrupt_or(&self.path, e)
    }

    /// Puts right in place what can be: a `user_version` set back by hand
    /// on tables of this format. Returns what was done; `None` when nothing
    /// needed it or the damage is of another kind (see
    /// [`Journal::check`]).
    pub fn repair(state_dir: &Path) -> Result<Option<String>, OpsError> {
        let path = state_dir.join("journal.sqlite");
        if !path.exists() {
            return Ok(None);
        }
        let conn = Connection::open(&path).map_err(|e| corrupt_or(&path, e))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(|e| corrupt_or(&path, e))?;
        schema::repair(&conn, &path)
    }

    /// Checks the whole database (`PRAGMA quick_check`) and the type of
    /// every value the journal reads: a journal with a damaged page, or a
    /// value of the wrong type (a BLOB where a time is due), is refused
    /// here, at start, naming the table and column, rather than answering
    /// "malformed" or a conversion error to every later call.
    pub fn check(&self) -> Result<(), OpsError> {
        let found: Vec<String> = self
            .conn()
            .prepare("PRAGMA quick_check(5)")
            .and_then(|mut s| {
                s.query_map([], |r| r.get(0))?
                    .collect::<Result<Vec<String>, _>>()
            })
            .map_err(|e| self.err(e))?;
        match found.as_slice() {
            [ok] if ok == "ok" => schema::check_values(&self.conn(), &self.path),
            _ => Err(OpsError::CorruptJournal {
                path: self.path.clone(),
                reason: format!("its integrity check failed ({})", found.join("; ")),
            }),
        }
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a new operation and its planned steps, all pending.
    pub(crate) fn create(&self, record: &OpRecord) -> Result<(), OpsError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| self.err(e))?;
        tx.execute(
            "INSERT INTO operations (id, kind, context, ca_fingerprint, params, facts, state, created, updated, format, cluster_lock) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                record.id,
                record.kind,
                record.context,
                record.ca_fingerprint,
                record.params.to_string(),
                record.facts.to_string(),
                to_text(&record.state),
                record.created,
                record.updated,
                FORMAT,
                record
                    .cluster_lock
                    .as_ref()
                    .and_then(|l| serde_json::to_string(l).ok())
            ],
        )
        .map_err(|e| self.err(e))?;
        for step in &record.steps {
            tx.execute(
                "INSERT INTO steps (op_id, idx, name, description, destructive, state, node, step) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    record.id,
                    step.index,
                    step.name,
                    step.description,
                    step.destructive,
                    to_text(&step.state),
                    step.node,
                    step.step.as_ref().and_then(|s| serde_json::to_string(s).ok())
                ],
            )
            .map_err(|e| self.err(e))?;
        }
        tx.commit().map_err(|e| self.err(e))
    }

    /// Records how operation `id` holds the cluster lock (taken again on
    /// resume).
    pub(crate) fn set_cluster_lock(
        &self,
        id: &str,
        lock: &super::ClusterLockRecord,
    ) -> Result<(), OpsError> {
        self.conn()
            .execute(
                "UPDATE operations SET cluster_lock = ?2 WHERE id = ?1",
                params![id, serde_json::to_string(lock).ok()],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Records the fencing check made right before step `index`.
    pub(crate) fn step_fenced(
        &self,
        id: &str,
        index: usize,
        fence: &super::Fence,
    ) -> Result<(), OpsError> {
        self.conn()
            .execute(
                "UPDATE steps SET fence = ?3 WHERE op_id = ?1 AND idx = ?2",
                params![id, index, serde_json::to_string(fence).ok()],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Marks step `index` started (before its call is sent).
    pub(crate) fn step_started(&self, id: &str, index: usize) -> Result<(), OpsError> {
        let now = now();
        self.conn()
            .execute(
                "UPDATE steps SET state = 'running', started = ?3, finished = NULL, detail = NULL WHERE op_id = ?1 AND idx = ?2",
                params![id, index, now],
            )
            .map_err(|e| self.err(e))?;
        self.touch(id)
    }

    /// Ends step `index` and, in the same transaction, records the facts and
    /// (optionally) starts the next step: one commit between a leave's
    /// answer and the reset.
    pub(crate) fn step_ended(
        &self,
        id: &str,
        index: usize,
        end: StepEnd<'_>,
        facts: &serde_json::Value,
        start_next: Option<usize>,
    ) -> Result<(), OpsError> {
        let written = self.write_step_end(id, index, &end, facts, start_next);
        if written.is_err() {
            self.remember_step_end(id, index, &end, facts);
        }
        written
    }

    /// Keeps the end of step `index` in memory for [`OpRecord::settled`]:
    /// its write failed, or a write it depends on did (the reset that ran
    /// after its leave, whose end the journal refused).
    pub(crate) fn remember_step_end(
        &self,
        id: &str,
        index: usize,
        end: &StepEnd<'_>,
        facts: &serde_json::Value,
    ) {
        self.remember(id, |u| {
            u.step_ends.retain(|e| e.index != index);
            u.step_ends.push(UnsavedEnd {
                index,
                state: end.state,
                duration_ms: end.duration_ms,
                detail: end.detail.map(str::to_string),
            });
            u.facts = Some(facts.clone());
        });
    }

    fn write_step_end(
        &self,
        id: &str,
        index: usize,
        end: &StepEnd<'_>,
        facts: &serde_json::Value,
        start_next: Option<usize>,
    ) -> Result<(), OpsError> {
        let now = end.finished.map_or_else(now, str::to_string);
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| self.err(e))?;
        tx.execute(
            "UPDATE steps SET state = ?3, finished = ?4, duration_ms = ?5, detail = ?6, started = COALESCE(?7, started) WHERE op_id = ?1 AND idx = ?2",
            params![
                id,
                index,
                to_text(&end.state),
                now,
                end.duration_ms,
                end.detail,
                end.started
            ],
        )
        .map_err(|e| self.err(e))?;
        for record in end.checks {
            let record = serde_json::to_string(record).unwrap_or_default();
            tx.execute(
                "INSERT INTO step_checks (op_id, idx, seq, record) VALUES (?1, ?2, (SELECT COUNT(*) FROM step_checks WHERE op_id = ?1 AND idx = ?2), ?3)",
                params![id, index, record],
            )
            .map_err(|e| self.err(e))?;
        }
        if let Some(next) = start_next {
            tx.execute(
                "UPDATE steps SET state = 'running', started = ?3 WHERE op_id = ?1 AND idx = ?2",
                params![id, next, now],
            )
            .map_err(|e| self.err(e))?;
        }
        tx.execute(
            "UPDATE operations SET facts = ?2, updated = ?3 WHERE id = ?1",
            params![id, facts.to_string(), now],
        )
        .map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))
    }

    /// Sets the operation's state.
    pub(crate) fn set_state(&self, id: &str, state: OpState) -> Result<(), OpsError> {
        let written = self.conn().execute(
            "UPDATE operations SET state = ?2, updated = ?3 WHERE id = ?1",
            params![id, to_text(&state), now()],
        );
        if let Err(e) = written {
            self.remember(id, |u| u.state = Some(state));
            return Err(self.err(e));
        }
        Ok(())
    }

    fn touch(&self, id: &str) -> Result<(), OpsError> {
        self.conn()
            .execute(
                "UPDATE operations SET updated = ?2 WHERE id = ?1",
                params![id, now()],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// One operation with its steps: the one whose id is `id`, else the one
    /// whose id starts with `id` when only one does. The prefix is compared
    /// character for character, never as a pattern (`%` and `_` are plain
    /// characters) and never ignoring case.
    pub fn get(&self, id: &str) -> Result<OpRecord, OpsError> {
        if id.is_empty() {
            return Err(OpsError::UnknownOperation(id.into()));
        }
        let ids: Vec<String> = self
            .conn()
            .prepare(
                "SELECT id FROM operations WHERE substr(id, 1, length(?1)) = ?1 \
                 ORDER BY id = ?1 DESC",
            )
            .and_then(|mut s| {
                s.query_map([id], |r| r.get(0))?
                    .collect::<Result<Vec<String>, _>>()
            })
            .map_err(|e| self.err(e))?;
        match ids.as_slice() {
            [one] => self
                .load(one)?
                .ok_or_else(|| OpsError::UnknownOperation(id.into())),
            [exact, ..] if exact == id => self
                .load(exact)?
                .ok_or_else(|| OpsError::UnknownOperation(id.into())),
            [] => Err(OpsError::UnknownOperation(id.into())),
            _ => Err(OpsError::AmbiguousOperation(id.into())),
        }
    }

    fn load(&self, id: &str) -> Result<Option<OpRecord>, OpsError> {
        let conn = self.conn();
        let op = conn
            .query_row(
                "SELECT id, kind, context, ca_fingerprint, params, facts, state, created, updated, format, cluster_lock FROM operations WHERE id = ?1",
                [id],
                |r| {
                    Ok(OpRecord {
                        id: r.get(0)?,
                        kind: r.get(1)?,
                        context: r.get(2)?,
                        ca_fingerprint: r.get(3)?,
                        params: serde_json::from_str(&r.get::<_, String>(4)?).unwrap_or_default(),
                        facts: serde_json::from_str(&r.get::<_, String>(5)?).unwrap_or_default(),
                        state: from_text(&r.get::<_, String>(6)?).unwrap_or(OpState::Failed),
                        created: r.get(7)?,
                        updated: r.get(8)?,
                        format: r.get(9)?,
                        steps: Vec::new(),
                        cluster_lock: r
                            .get::<_, Option<String>>(10)?
                            .and_then(|s| serde_json::from_str(&s).ok()),
                    })
                },
            )
            .optional()
            .map_err(|e| self.err(e))?;
        let Some(mut op) = op else { return Ok(None) };
        op.steps = conn
            .prepare(
                "SELECT idx, name, description, destructive, state, started, finished, duration_ms, detail, node, step, fence FROM steps WHERE op_id = ?1 ORDER BY idx",
            )
            .and_then(|mut s| {
                s.query_map([id], |r| {
                    Ok(StepRecord {
                        index: r.get::<_, i64>(0)? as usize,
                        name: r.get(1)?,
                        description: r.get(2)?,
                        destructive: r.get(3)?,
                        state: from_text(&r.get::<_, String>(4)?).unwrap_or(StepState::Failed),
                        started: r.get(5)?,
                        finished: r.get(6)?,
                        duration_ms: r.get::<_, Option<i64>>(7)?.map(|d| d as u64),
                        detail: r.get(8)?,
                        node: r.get(9)?,
                        checks: Vec::new(),
                        step: r
                            .get::<_, Option<String>>(10)?
                            .and_then(|s| serde_json::from_str(&s).ok()),
                        fence: r
                            .get::<_, Option<String>>(11)?
                            .and_then(|s| serde_json::from_str(&s).ok()),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|e| self.err(e))?;
        let checks: Vec<(usize, String)> = conn
            .prepare("SELECT idx, record FROM step_checks WHERE op_id = ?1 ORDER BY idx, seq")
            .and_then(|mut s| {
                s.query_map([id], |r| Ok((r.get::<_, i64>(0)? as usize, r.get(1)?)))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|e| self.err(e))?;
        for (index, record) in checks {
            let step = op.steps.iter_mut().find(|s| s.index == index);
            if let (Some(step), Ok(record)) = (step, serde_json::from_str(&record)) {
                step.checks.push(record);
            }
        }
        Ok(Some(op))
    }

    /// Every operation, newest first; optionally only one cluster's.
    pub fn list(&self, ca_fingerprint: Option<&str>) -> Result<Vec<OpRecord>, OpsError> {
        let ids: Vec<String> = self
            .conn()
            .prepare(
                "SELECT id FROM operations WHERE ?1 IS NULL OR ca_fingerprint = ?1 ORDER BY created DESC, id DESC",
            )
            .and_then(|mut s| {
                s.query_map([ca_fingerprint], |r| r.get(0))?
                    .collect::<Result<Vec<String>, _>>()
            })
            .map_err(|e| self.err(e))?;
        ids.iter()
            .filter_map(|id| self.load(id).transpose())
            .collect()
    }
}

/// A corrupt database or not a database at all is [`OpsError::CorruptJournal`];
/// any other error is the journal's error.
fn corrupt_or(path: &Path, e: rusqlite::Error) -> OpsError {
    use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
    match e.sqlite_error_code() {
        Some(DatabaseCorrupt | NotADatabase) => OpsError::CorruptJournal {
            path: path.to_owned(),
            reason: e.to_string(),
        },
        _ => OpsError::journal(path, e),
    }
}

/// The journal and its WAL files are the owner's only (0600), whatever
/// the umask they were created under.
fn restrict(path: &Path) -> Result<(), OpsError> {
    use std::os::unix::fs::PermissionsExt as _;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    for file in [
        path.to_owned(),
        path.with_file_name(format!("{name}-wal")),
        path.with_file_name(format!("{name}-shm")),
    ] {
        let Ok(meta) = std::fs::symlink_metadata(&file) else {
            continue;
        };
        if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).map_err(
                |source| OpsError::Io {
                    path: file.clone(),
                    source,
                },
            )?;
        }
    }
    Ok(())
}

/// Adds the [`CLUSTER_LOCK_COLUMNS`] a journal lacks.
fn add_columns(conn: &Connection, path: &Path) -> Result<(), OpsError> {
    for (table, column) in CLUSTER_LOCK_COLUMNS {
        let present: bool = conn
            .query_row(
                &format!("SELECT COUNT(*) > 0 FROM pragma_table_info('{table}') WHERE name = ?1"),
                [column],
                |r| r.get(0),
            )
            .map_err(|e| corrupt_or(path, e))?;
        if !present {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} TEXT;"))
                .map_err(|e| corrupt_or(path, e))?;
        }
    }
    Ok(())
}

/// How a step ended.
pub(crate) struct StepEnd<'a> {
    pub state: StepState,
    pub duration_ms: u64,
    pub detail: Option<&'a str>,
    /// The start of the attempt whose end this is, when it is not the start
    /// already journaled (a step run again on resume, the second half of a
    /// unit journaled after its call).
    pub started: Option<&'a str>,
    /// The checks the engine ran for this attempt.
    pub checks: &'a [CheckRecord],
    /// When the attempt ended, if not now (the first half of a unit,
    /// written after the second half ran).
    pub finished: Option<&'a str>,
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
