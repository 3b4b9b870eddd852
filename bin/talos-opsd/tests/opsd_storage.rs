//! Storage that fails is the daemon's trouble, not the caller's: a full
//! file system under the cluster lock or the journal answers UNAVAILABLE
//! naming the file, and a snapshot into a full directory fails naming it;
//! a path the caller gave that does not exist stays INVALID_ARGUMENT.
//!
//! The full file system is real: a small tmpfs (`mount -t tmpfs -o
//! size=...`), filled to the last page. Mounting needs root (CAP_SYS_ADMIN),
//! as the tests run in CI; chmod would not do, root writes anyway.

mod daemon;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use daemon::{Daemon, cluster_toml};
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::SimCluster;

/// A tmpfs of `size` mounted at a new directory; unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: PathBuf, size: &str) -> Tmpfs {
        std::fs::create_dir_all(&at).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "mounting a tmpfs at {} (this test needs root): {}",
            at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(at)
    }

    /// Writes a file until the file system is full; returns it.
    fn fill(&self) -> PathBuf {
        let path = self.0.join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 4096];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        path
    }

    /// Frees exactly one page of the filler.
    fn free_one_page(&self, filler: &Path) {
        let len = std::fs::metadata(filler).unwrap().len();
        let pages = len.div_ceil(4096);
        std::fs::OpenOptions::new()
            .write(true)
            .open(filler)
            .unwrap()
            .set_len((pages - 1) * 4096)
            .unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

fn snapshot() -> proto::StartOperationRequest {
    proto::StartOperationRequest {
        cluster: "a".into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(Kind::Snapshot(proto::SnapshotParams { keep: 0 })),
    }
}

#[tokio::test]
async fn a_full_state_directory_is_unavailable_naming_the_file() {
    let sim = SimCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    // The state directory (journal, locks) on a small file system.
    let fs = Tmpfs::mount(dir.path().join("state"), "2m");
    let mut d = Daemon::start(dir.path(), &cluster_toml("a", &tc, "")).await;
    let mut client = d.client().await;
    let filler = fs.fill();

    // Not one page left: the cluster's lock file cannot be written.
    let refused = client.start_operation(snapshot()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    let lock_dir = dir.path().join("state").join("locks");
    assert!(
        refused.message().contains(&lock_dir.display().to_string()),
        "{refused:?}"
    );
    assert!(refused.message().contains("No space left"), "{refused:?}");

    // One page: the lock is written, the journal cannot record the
    // operation it is to run.
    fs.free_one_page(&filler);
    let refused = client.start_operation(snapshot()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    let journal = dir.path().join("state").join("journal.sqlite");
    assert!(
        refused.message().contains(&journal.display().to_string()),
        "{refused:?}"
    );
    assert!(refused.message().contains("full"), "{refused:?}");

    // Space again: the same start runs.
    std::fs::remove_file(&filler).unwrap();
    let op = client
        .start_operation(snapshot())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.until_ended(&op.id).await.state, "succeeded");
    assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));
}

#[tokio::test]
async fn a_full_snapshot_directory_fails_the_snapshot_naming_it() {
    let sim = SimCluster::start(1).await;
    sim.cluster
        .fill("/registry/test/", 100, 4096)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let fs = Tmpfs::mount(dir.path().join("snaps"), "1m");
    let extra = format!(
        "[cluster.snapshots]\ninterval = \"24h\"\ndir = {:?}\n",
        fs.0
    );
    let d = Daemon::start(dir.path(), &cluster_toml("a", &tc, &extra)).await;
    let mut client = d.client().await;
    fs.fill();
    let op = client
        .start_operation(snapshot())
        .await
        .unwrap()
        .into_inner();
    let ended = d.until_ended(&op.id).await;
    assert_eq!(ended.state, "failed", "{ended:?}");
    let step = ended.steps.iter().find(|s| s.name == "snapshot").unwrap();
    assert!(
        step.detail.contains(&fs.0.display().to_string()),
        "{step:?}"
    );
    assert!(step.detail.contains("No space left"), "{step:?}");

    // A path the caller gave that does not exist is the caller's error.
    let refused = client
        .start_operation(proto::StartOperationRequest {
            cluster: "a".into(),
            plan_fingerprint: String::new(),
            without_cluster_lock: true,
            kind: Some(Kind::Apply(proto::ApplyParams {
                nodes: vec![sim.ip(1)],
                config_path: dir.path().join("no-such.yaml").display().to_string(),
                expect_change: vec!["machine.certSANs".into()],
                ..Default::default()
            })),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("no-such.yaml"), "{refused:?}");
}
