//! The journal's tests: formats, concurrent opens, failed writes and
//! their settlement.

use super::{FORMAT, Journal, OpRecord, OpState, StepEnd, StepRecord, StepState, Unsaved};
use crate::ops::OpsError;

fn record(id: &str, destructive: &[bool]) -> OpRecord {
    OpRecord {
        id: id.into(),
        kind: "snapshot".into(),
        context: "c".into(),
        ca_fingerprint: "fp".into(),
        params: serde_json::json!({}),
        facts: serde_json::json!({"op": "snapshot", "snapshot": null}),
        format: FORMAT,
        state: OpState::Running,
        created: super::now(),
        updated: super::now(),
        steps: destructive
            .iter()
            .enumerate()
            .map(|(index, &destructive)| StepRecord {
                index,
                name: format!("s{index}"),
                node: None,
                description: String::new(),
                destructive,
                state: StepState::Pending,
                started: None,
                finished: None,
                duration_ms: None,
                detail: None,
                fence: None,
                checks: Vec::new(),
                step: None,
            })
            .collect(),
        cluster_lock: None,
    }
}

/// A step's end that the journal cannot write (the database locked by
/// another process past the busy timeout) is remembered with its facts;
/// once the journal takes writes again the operation is recorded as
/// failed with the reason, never left running.
#[test]
fn a_failed_write_is_remembered_and_settled_honestly() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path()).unwrap();
    journal.create(&record("op-1", &[false, false])).unwrap();
    journal.step_started("op-1", 0).unwrap();
    journal
        .conn()
        .busy_timeout(std::time::Duration::from_millis(50))
        .unwrap();
    let blocker = rusqlite::Connection::open(dir.path().join("journal.sqlite")).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let facts = serde_json::json!({"op": "snapshot", "snapshot": "/s/x.db"});
    let end = StepEnd {
        state: StepState::Done,
        duration_ms: 7,
        detail: Some("/s/x.db (from n)"),
        started: None,
        checks: &[],
        finished: None,
    };
    let failed = journal
        .step_ended("op-1", 0, end, &facts, None)
        .unwrap_err();
    assert!(failed.to_string().contains("locked"), "{failed}");
    let unsaved = journal.unsaved("op-1").unwrap();
    assert_eq!(unsaved.facts(), Some(&facts));
    let durable = journal.get("op-1").unwrap();
    let settled = durable.settled(&failed.to_string(), Some(&unsaved));
    assert!(journal.settle(&settled).is_err(), "still locked");
    blocker.execute_batch("ROLLBACK").unwrap();
    assert!(journal.settle(&settled).unwrap());
    let now = journal.get("op-1").unwrap();
    assert_eq!(now.state, OpState::Failed);
    assert_eq!(now.facts, facts);
    let step = &now.steps[0];
    assert_eq!((step.state, step.duration_ms), (StepState::Done, Some(7)));
    let detail = step.detail.as_deref().unwrap();
    assert!(detail.starts_with("/s/x.db (from n); the journal could not record this"));
    assert!(detail.contains("locked"), "{detail}");
    assert_eq!(now.steps[1].state, StepState::Pending);
    assert!(journal.unsaved("op-1").is_none());
    // Settled once: a second settle changes nothing.
    assert!(!journal.settle(&settled).unwrap());
}

/// The end state follows what had happened: all steps done is
/// succeeded; a destructive step started is needs-attention with the
/// step in flight left running for `resume`; nothing destructive is
/// failed with the step in flight failed; an intended state stands.
#[test]
fn settled_states_are_honest() {
    let all_done = {
        let mut r = record("a", &[false, true]);
        r.steps.iter_mut().for_each(|s| s.state = StepState::Done);
        r
    };
    assert_eq!(all_done.settled("x", None).state, OpState::Succeeded);

    let mut leave_in_flight = record("b", &[false, true, true]);
    leave_in_flight.steps[0].state = StepState::Done;
    leave_in_flight.steps[1].state = StepState::Running;
    let settled = leave_in_flight.settled("disk full", None);
    assert_eq!(settled.state, OpState::NeedsAttention);
    assert_eq!(settled.steps[1].state, StepState::Running);
    assert!(
        settled.steps[1]
            .detail
            .as_deref()
            .unwrap()
            .contains("disk full")
    );

    let mut snapshot_in_flight = record("c", &[false, false]);
    snapshot_in_flight.steps[0].state = StepState::Running;
    let settled = snapshot_in_flight.settled("disk full", None);
    assert_eq!(settled.state, OpState::Failed);
    assert_eq!(settled.steps[0].state, StepState::Failed);
    assert!(settled.steps[0].finished.is_some());

    let not_started = record("d", &[true]);
    let settled = not_started.settled("disk full", None);
    assert_eq!(settled.state, OpState::Failed);
    let detail = settled.steps[0].detail.as_deref().unwrap();
    assert!(detail.starts_with("not started: "), "{detail}");

    let cancelled = Unsaved {
        state: Some(OpState::Cancelled),
        ..Unsaved::default()
    };
    let settled = record("e", &[true]).settled("x", Some(&cancelled));
    assert_eq!(settled.state, OpState::Cancelled);

    let mut ended = record("f", &[false]);
    ended.state = OpState::Failed;
    assert_eq!(ended.settled("x", None).state, OpState::Failed);
    assert!(ended.settled("x", None).steps[0].detail.is_none());
}

/// A journal written by the previous format: its records stay listable,
/// and a record of that format is refused with what to do, never read
/// as a spec.
#[test]
fn a_journal_of_the_previous_format_is_upgraded_and_its_records_refused() {
    let dir = tempfile::tempdir().unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("journal.sqlite")).unwrap();
    conn.execute_batch(super::SCHEMA).unwrap();
    conn.execute_batch(
        r#"INSERT INTO operations VALUES ('20250101T000000-abc', 'retire', 'c', 'fp',
             '{"node":"cp-1","wipe":["STATE"],"silence_timeout_s":120}',
             '{"address":"10.0.0.1","member_id":"00000000000000aa"}', 'running', 't', 't');
           INSERT INTO steps (op_id, idx, name, description, destructive, state)
             VALUES ('20250101T000000-abc', 0, 'leave', 'leave', 1, 'running');"#,
    )
    .unwrap();
    drop(conn);
    let journal = Journal::open(dir.path()).unwrap();
    let records = journal.list(None).unwrap();
    assert_eq!(records.len(), 1);
    let old = &records[0];
    assert_eq!((old.format, old.state), (1, OpState::Running));
    assert_eq!(old.steps[0].name, "leave");
    let refused = old.spec().unwrap_err();
    assert!(
        matches!(refused, OpsError::EarlierFormat { format: 1, .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("abandon it"), "{refused}");
    assert!(old.typed_steps().is_err());
    // Opening again changes nothing more.
    drop(journal);
    let again = Journal::open(dir.path()).unwrap();
    assert_eq!(again.get("2025").unwrap().format, 1);
    let version: u32 = again
        .conn()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, FORMAT);
}

/// Processes that open a new journal at the same moment (an `ops list`
/// beside the operation that creates it) wait for each other instead of
/// failing with "database is locked".
#[test]
fn concurrent_first_opens_wait_for_each_other() {
    for _ in 0..40 {
        let dir = tempfile::tempdir().unwrap();
        let barrier = std::sync::Barrier::new(6);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..6)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        Journal::open(dir.path())
                            .and_then(|journal| journal.list(None))
                            .map(|_| ())
                    })
                })
                .collect();
            for h in handles {
                if let Err(e) = h.join().unwrap() {
                    panic!("{e}");
                }
            }
        });
    }
}

/// The journal's files are the owner's only, also when they were created
/// readable by others (an umask of 022, an earlier version).
#[test]
fn journal_files_are_made_0600() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.sqlite");
    let first = Journal::open(dir.path()).unwrap();
    first.create(&record("op-1", &[false])).unwrap();
    let wal = dir.path().join("journal.sqlite-wal");
    for file in [&path, &wal] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let _again = Journal::open(dir.path()).unwrap();
    for file in [&path, &wal] {
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }
}

/// Ids are looked up by exact match or a unique leading part compared
/// literally: `%` and `_` are not wildcards, case counts, and an id that is
/// also the prefix of a longer one still finds itself.
#[test]
fn ids_match_literally_never_as_patterns() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path()).unwrap();
    for id in ["op-1", "op-10", "abc-7f", "ABC-80"] {
        journal.create(&record(id, &[false])).unwrap();
    }
    let found = |id: &str| journal.get(id).map(|r| r.id);
    assert_eq!(found("op-1").unwrap(), "op-1");
    assert_eq!(found("op-10").unwrap(), "op-10");
    assert_eq!(found("abc").unwrap(), "abc-7f");
    assert_eq!(found("ABC").unwrap(), "ABC-80");
    assert!(matches!(found("op-"), Err(OpsError::AmbiguousOperation(_))));
    for pattern in ["%", "%7f", "op_1", "_bc", "a%", "", "Abc"] {
        assert!(
            matches!(found(pattern), Err(OpsError::UnknownOperation(_))),
            "{pattern:?} matched {:?}",
            found(pattern)
        );
    }
    let huge = "%".repeat(3 << 20);
    assert!(matches!(found(&huge), Err(OpsError::UnknownOperation(_))));
}

/// A format-2 journal in `dir` with one operation and one step.
fn journal_with_one(dir: &std::path::Path) -> std::path::PathBuf {
    let journal = Journal::open(dir).unwrap();
    journal.create(&record("op-1", &[false])).unwrap();
    journal.step_started("op-1", 0).unwrap();
    dir.join("journal.sqlite")
}

fn corrupt_reason(result: Result<Journal, OpsError>) -> String {
    match result {
        Err(OpsError::CorruptJournal { reason, .. }) => reason,
        Err(other) => panic!("not refused as corrupt: {other}"),
        Ok(_) => panic!("opened"),
    }
}

/// A version set back by hand on tables of this format is refused naming
/// it (never "duplicate column name"), and repaired in place with the
/// history kept.
#[test]
fn a_version_set_back_by_hand_is_refused_then_repaired() {
    for version in [0, 1] {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_with_one(dir.path());
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(&format!("PRAGMA user_version = {version}"))
            .unwrap();
        let reason = corrupt_reason(Journal::open(dir.path()));
        assert!(
            reason.contains(&format!("user_version is {version}")),
            "{reason}"
        );
        assert!(reason.contains("--recover-journal"), "{reason}");
        let done = Journal::repair(dir.path()).unwrap().unwrap();
        assert!(done.contains("set back to 2"), "{done}");
        let journal = Journal::open(dir.path()).unwrap();
        journal.check().unwrap();
        assert_eq!(journal.get("op-1").unwrap().steps.len(), 1);
        assert_eq!(Journal::repair(dir.path()).unwrap(), None);
    }
}

/// A value of the wrong type passes SQLite's own check; the journal's
/// check names its table, column and row.
#[test]
fn a_blob_where_a_time_is_due_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = journal_with_one(dir.path());
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("UPDATE steps SET started = x'00ff'")
        .unwrap();
    let journal = Journal::open(dir.path()).unwrap();
    match journal.check() {
        Err(OpsError::CorruptJournal { reason, .. }) => {
            assert!(reason.contains("steps.started"), "{reason}");
            assert!(reason.contains("blob"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

/// Dropped or altered tables are refused by name; a dropped table is
/// never made again, empty, as if the history had never been.
#[test]
fn dropped_or_altered_tables_are_refused_by_name() {
    let cases = [
        ("DROP TABLE operations", "table operations is missing"),
        ("DROP TABLE steps", "table steps is missing"),
        (
            "DROP TABLE steps; DROP TABLE operations",
            "tables operations and steps are gone",
        ),
        (
            "ALTER TABLE steps RENAME COLUMN detail TO details",
            "steps has no column detail",
        ),
        ("ALTER TABLE operations DROP COLUMN format", "half upgraded"),
        (
            "CREATE TABLE s2 (op_id TEXT, idx INTEGER, name TEXT, description TEXT, destructive INTEGER, state TEXT, started BLOB, finished TEXT, duration_ms INTEGER, detail TEXT, node TEXT, step TEXT); DROP TABLE steps; ALTER TABLE s2 RENAME TO steps",
            "steps.started is declared \"BLOB\"",
        ),
    ];
    for (damage, says) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_with_one(dir.path());
        let tables = || -> i64 {
            rusqlite::Connection::open(&path)
                .unwrap()
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
                    [],
                    |r| r.get(0),
                )
                .unwrap()
        };
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(damage)
            .unwrap();
        let damaged = tables();
        let reason = corrupt_reason(Journal::open(dir.path()));
        assert!(reason.contains(says), "{damage}: {reason}");
        assert_eq!(tables(), damaged, "{damage}: nothing is made");
        assert_eq!(Journal::repair(dir.path()).unwrap(), None, "{damage}");
    }
}
