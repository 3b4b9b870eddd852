//! Test-only hooks, compiled only with the `test-hooks` feature (release
//! builds leave it off, so the shipped daemon has none): the crash-safety
//! and journal-failure tests stop the daemon, or hold its journal, at a
//! named step through environment variables. The fault campaign kills
//! processes from outside and needs none of this.

use std::sync::atomic::{AtomicBool, Ordering};

use talos_client::ops::Event;

/// Every hook, run on each event of an operation.
pub(crate) fn observe(event: &Event<'_>, state_dir: &std::path::Path) {
    crash_hook(event);
    journal_busy_hook(event, state_dir);
}

/// `TALOS_OPSD_TEST_CRASH=started:STEP`, `checked:STEP` (a destructive
/// step's check held, nothing sent yet) or `answered:STEP` aborts the
/// daemon at that point, as a crash would (for the crash-safety tests).
fn crash_hook(event: &Event<'_>) {
    let Ok(crash) = std::env::var("TALOS_OPSD_TEST_CRASH") else {
        return;
    };
    let point = match event {
        Event::StepStarted { name, node, .. } => format!("started:{}", label(name, *node)),
        Event::StepChecked { name, node, .. } => format!("checked:{}", label(name, *node)),
        Event::StepAnswered { name, node, .. } => format!("answered:{}", label(name, *node)),
        _ => return,
    };
    if point == crash {
        std::process::abort();
    }
}

/// `TALOS_OPSD_TEST_JOURNAL_BUSY=answered:STEP` takes the journal's write
/// lock from another connection when STEP's work has answered (before its
/// end is journaled), as another process holding the journal would, and
/// holds it until the file `STATE_DIR/journal-busy.release` exists: the
/// operation's next journal write fails with SQLITE_BUSY. Once per process
/// (for the journal-failure tests).
fn journal_busy_hook(event: &Event<'_>, state_dir: &std::path::Path) {
    static FIRED: AtomicBool = AtomicBool::new(false);
    let Ok(point) = std::env::var("TALOS_OPSD_TEST_JOURNAL_BUSY") else {
        return;
    };
    let Event::StepAnswered { name, node, .. } = event else {
        return;
    };
    if point != format!("answered:{}", label(name, *node)) || FIRED.swap(true, Ordering::SeqCst) {
        return;
    }
    let conn = rusqlite::Connection::open(state_dir.join("journal.sqlite"))
        .and_then(|conn| conn.execute_batch("BEGIN IMMEDIATE").map(|()| conn));
    let conn = match conn {
        Ok(conn) => conn,
        Err(e) => return tracing::error!("journal busy hook: {e}"),
    };
    let release = state_dir.join("journal-busy.release");
    tracing::warn!(
        "journal busy hook: the journal is locked until {} exists",
        release.display()
    );
    std::thread::spawn(move || {
        while !release.exists() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = conn.execute_batch("ROLLBACK");
    });
}

/// `NAME` or `NAME NODE`, as the journal's step labels read.
fn label(name: &str, node: Option<&str>) -> String {
    match node {
        Some(node) => format!("{name} {node}"),
        None => name.to_string(),
    }
}
