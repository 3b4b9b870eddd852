//! Two admins on one state directory: the first plans a retire and waits at
//! its prompt on a terminal (a pseudo-terminal here); the second operation
//! is refused at plan time, naming the first, and nothing changes. The lock
//! is taken before the preflight and held through the prompt.

use std::io::Write as _;
use std::process::Stdio;
use std::time::Duration;

use talos_test_support::cli::command;
use talos_test_support::pty::{Screen, openpty};

mod ops_fixture;

use ops_fixture::Fixture;

#[tokio::test(flavor = "multi_thread")]
async fn a_second_operation_is_refused_while_the_first_waits_at_its_prompt() {
    let f = Fixture::start(3).await;
    let before = f.members().await;
    let (controller, terminal) = openpty();
    let mut first = command(&f.talosconfig());
    first
        .args(["ops", "--without-cluster-lock", "--state-dir"])
        .arg(f.state.path())
        .args(["retire", "cp-3"])
        .stdin(Stdio::from(terminal.try_clone().unwrap()))
        .stdout(Stdio::null())
        .stderr(Stdio::from(terminal));
    let mut first = first.spawn().unwrap();
    drop(first.stdin.take());
    let controller = std::fs::File::from(controller);
    let mut answer = controller.try_clone().unwrap();
    let mut screen = Screen::new(controller);
    let shown = tokio::task::block_in_place(|| {
        screen
            .wait_for("proceed? [y/N]", Duration::from_secs(60))
            .to_string()
    });
    assert!(shown.contains("reset"), "the plan is shown first: {shown}");

    // Admin B, same state directory, another node: refused at plan time.
    let second = f.ops(&["--yes", "retire", "cp-2"]).await;
    assert_eq!(second.code, 1, "{}", second.stderr);
    assert!(
        second
            .stderr
            .contains("another operation holds this cluster")
            && second.stderr.contains(&format!("(pid {})", first.id())),
        "{}",
        second.stderr
    );
    let snapshot = f.ops(&["--yes", "snapshot"]).await;
    assert_eq!(
        snapshot.code, 1,
        "even a snapshot waits: {}",
        snapshot.stderr
    );

    // A declines: nothing changed, nothing journaled.
    answer.write_all(b"n\n").unwrap();
    let status = tokio::task::spawn_blocking(move || first.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(1));
    let shown = tokio::task::block_in_place(|| {
        screen
            .wait_for("nothing was changed", Duration::from_secs(30))
            .to_string()
    });
    assert!(shown.contains("not confirmed"), "{shown}");
    assert_eq!(f.members().await, before);
    assert_eq!(
        f.ops(&["list"]).await.ok().json(),
        serde_json::json!([]),
        "a declined plan journals nothing"
    );
    // The lock went with A: B's plan now goes through.
    let plan = f.ops(&["--plan", "retire", "cp-2"]).await.ok();
    assert!(plan.stderr.contains("leave"), "{}", plan.stderr);
}
