//! A journal whose schema was damaged (a version set back by hand, a
//! value of the wrong type, a table dropped or altered) is refused at
//! start with the table and column at fault, never met as INTERNAL on
//! every call or read as an empty history; `--recover-journal` repairs
//! what it can in place (the history kept) and moves the rest aside.

mod daemon;

use std::ffi::OsStr;
use std::path::Path;

use daemon::{Daemon, run_to_exit};
use talos_opsd::proto;

/// A journal in `state` holding one interrupted operation (format 2).
fn journal_with_one_operation(state: &Path) -> std::path::PathBuf {
    drop(talos_client::ops::Journal::open(state).unwrap());
    let path = state.join("journal.sqlite");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            r#"INSERT INTO operations (id, kind, context, ca_fingerprint, params, facts, state, created, updated, format)
                 VALUES ('20260101T000000-abcdef', 'snapshot', 'c', 'fp', '{}', '{}', 'failed',
                         '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', 2);
               INSERT INTO steps (op_id, idx, name, description, destructive, state, started)
                 VALUES ('20260101T000000-abcdef', 0, 'snapshot', 'take it', 0, 'failed', '2026-01-01T00:00:00Z');"#,
        )
        .unwrap();
    path
}

fn config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            "state_dir = {:?}\nsocket = {:?}\n",
            dir.join("state"),
            dir.join("opsd.sock")
        ),
    )
    .unwrap();
    path
}

/// The daemon refuses to start on `damage`, naming the file, what is
/// wrong (`says`) and what to do.
async fn refused_at_start(damage: &str, says: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let journal = journal_with_one_operation(&dir.path().join("state"));
    rusqlite::Connection::open(&journal)
        .unwrap()
        .execute_batch(damage)
        .unwrap();
    let config = config(dir.path());
    let (status, stderr) = run_to_exit(&[OsStr::new("--config"), config.as_os_str()]).await;
    assert!(!status.success(), "{damage}: started\n{stderr}");
    for needle in [
        journal.display().to_string().as_str(),
        "cannot be trusted",
        says,
        "--recover-journal",
    ] {
        assert!(
            stderr.contains(needle),
            "{damage}: no {needle:?} in\n{stderr}"
        );
    }
    assert!(!stderr.contains("duplicate column"), "{stderr}");
    dir
}

async fn operations(d: &Daemon) -> Vec<proto::Operation> {
    d.client()
        .await
        .list_operations(proto::ListOperationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .operations
}

#[tokio::test]
async fn a_version_set_back_is_refused_and_repaired_with_the_history_kept() {
    for version in [0, 1] {
        let dir = refused_at_start(
            &format!("PRAGMA user_version = {version}"),
            &format!("user_version is {version}"),
        )
        .await;
        let mut d = Daemon::start_with(dir.path(), "", &[], &["--recover-journal"]).await;
        let ops = operations(&d).await;
        assert_eq!(ops.len(), 1, "the history is kept: {ops:?}");
        assert!(
            d.log_text().contains("repaired in place"),
            "{}",
            d.log_text()
        );
        assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));
    }
}

#[tokio::test]
async fn a_value_of_the_wrong_type_is_named_and_moved_aside() {
    let dir = refused_at_start(
        "UPDATE steps SET started = x'00ff'",
        "column steps.started holds a blob",
    )
    .await;
    let mut d = Daemon::start_with(dir.path(), "", &[], &["--recover-journal"]).await;
    // A new journal that answers, the damaged one kept beside it.
    assert!(operations(&d).await.is_empty());
    assert!(d.log_text().contains("moved aside"), "{}", d.log_text());
    let kept = std::fs::read_dir(dir.path().join("state"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("journal.sqlite.corrupt-")
        })
        .count();
    assert!(kept >= 1);
    assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));
}

#[tokio::test]
async fn dropped_or_altered_tables_are_refused_by_name() {
    for (damage, says) in [
        ("DROP TABLE operations", "table operations is missing"),
        ("DROP TABLE steps", "table steps is missing"),
        (
            "DROP TABLE steps; DROP TABLE operations",
            "tables operations and steps are gone",
        ),
        (
            "ALTER TABLE steps RENAME COLUMN started TO begun",
            "steps has no column started",
        ),
    ] {
        refused_at_start(damage, says).await;
    }
}
