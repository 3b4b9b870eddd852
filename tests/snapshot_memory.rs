//! Memory stays flat while verifying a large snapshot: the bbolt reader uses
//! positioned reads of one page (or one overflow run) at a time, never mmap
//! and never the whole file.
//!
//! Alone in its file, so this process runs nothing else while it measures
//! its peak resident memory (`VmHWM`). The snapshot is made by a real etcd
//! holding `SNAPSHOT_MEMTEST_MIB` (default 256) MiB of 1 MB values.

// A peak-memory check: the process's peak resident memory grows by the
// pipeline's buffers, which an unoptimised build of this crate holds as a
// release build does. It runs in the debug test build with the hot
// dependencies optimised (Cargo.toml's `profile.dev.package`), beside the
// other tests.

use std::time::Instant;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use talos_client::snapshot::bbolt::Db;
use talos_client::snapshot::{status, verify_file};

use talos_test_support::etcd::{Etcd, etcdctl_status};

const VALUE_SIZE: usize = 1_000_000;
const WRITERS: usize = 8;

/// A field of /proc/self/status, in KiB.
fn proc_status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Resets the peak resident set size (VmHWM) to the current one.
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM via /proc/self/clear_refs");
}

#[test]
fn saving_and_verifying_a_large_snapshot_keep_memory_flat() {
    let mib: usize = std::env::var("SNAPSHOT_MEMTEST_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let values = mib * (1 << 20) / VALUE_SIZE;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large.db");

    let started = Instant::now();
    {
        let etcd = Etcd::start(&["--quota-backend-bytes=8589934592"]);
        std::thread::scope(|scope| {
            for writer in 0..WRITERS {
                let etcd = &etcd;
                scope.spawn(move || {
                    // One value, encoded once: bbolt stores each copy anyway.
                    let value: Vec<u8> = (0..VALUE_SIZE).map(|j| (j * 31 % 251) as u8).collect();
                    let value = BASE64.encode(&value);
                    for i in (writer..values).step_by(WRITERS) {
                        etcd.http_put_base64(format!("/registry/large/{i:05}").as_bytes(), &value);
                    }
                });
            }
        });
        // A few small keys too, so several buckets have data.
        etcd.txn(&["put /small/a 1".into(), "put /small/b 2".into()]);
        etcd.snapshot(&path);
    }
    let size = std::fs::metadata(&path).unwrap().len();
    eprintln!(
        "made a {} MiB snapshot in {:.1?}",
        size >> 20,
        started.elapsed()
    );
    assert!(size >= (mib as u64) << 20, "snapshot of {size} bytes");

    // Measure: peak RSS from here on, against the current RSS.
    reset_peak();
    let baseline = proc_status_kib("VmRSS:");
    let started = Instant::now();
    let db = Db::open(&path, size - 32).unwrap();
    let summary = db.check().expect("a consistent large snapshot");
    let checked = started.elapsed();
    let ours = status::status(&db).unwrap();
    let total = started.elapsed();
    let growth_kib = proc_status_kib("VmHWM:").saturating_sub(baseline);
    eprintln!(
        "check {checked:.1?}, check + status {total:.1?} over {} pages; \
         peak RSS growth {growth_kib} KiB over {baseline} KiB",
        summary.high_water
    );
    assert!(
        growth_kib < 16 * 1024,
        "peak RSS grew by {growth_kib} KiB checking {} MiB",
        size >> 20
    );

    let etcdctl = etcdctl_status(&path);
    assert_eq!(u64::from(ours.hash), etcdctl["hash"].as_u64().unwrap());
    assert_eq!(ours.revision, etcdctl["revision"].as_i64().unwrap());
    assert_eq!(ours.total_entries, etcdctl["totalKey"].as_u64().unwrap());
    assert_eq!(ours.total_keys, values as u64 + 2, "each key put once");
    assert_eq!(ours.total_size, etcdctl["totalSize"].as_u64().unwrap());

    // The whole verification adds streaming sha256 (a fixed 1 MiB buffer).
    // CI also runs this test on optimised code (scripts/test.sh).
    {
        reset_peak();
        let baseline = proc_status_kib("VmRSS:");
        let started = Instant::now();
        let report = verify_file(&path).expect("a valid large snapshot");
        let growth_kib = proc_status_kib("VmHWM:").saturating_sub(baseline);
        eprintln!(
            "verify_file {:.1?}, peak RSS growth {growth_kib} KiB",
            started.elapsed()
        );
        assert!(growth_kib < 16 * 1024, "verify_file: {growth_kib} KiB");
        assert_eq!(report.status.hash, ours.hash);
        assert_eq!(report.status.total_size, size - 32);
    }

    // The verified save path, end to end: the snapshot streamed over mutual
    // TLS in 1 KiB messages, written, hashed, checked, renamed.
    let saved = save_through_the_api(&path, &dir.path().join("saved.db"));
    assert_eq!(saved.status.hash, ours.hash);
    assert_eq!(saved.size, size);
}

fn save_through_the_api(
    source: &std::path::Path,
    target: &std::path::Path,
) -> talos_client::snapshot::SnapshotReport {
    use talos_test_support::server::{TestPki, TestServer};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pki = TestPki::new();
        let server = TestServer::start(&pki, "cp-1").await;
        *server.state.snapshot_file.lock().unwrap() = Some(source.to_path_buf());
        let client = talos_client::Client::builder()
            .endpoints([server.endpoint()])
            .credentials(pki.client_credentials(&pki.admin))
            .call_timeout(std::time::Duration::from_secs(600))
            .build()
            .unwrap();
        // Connection and TLS set up before measuring.
        client.hostname().await.unwrap();
        reset_peak();
        let baseline = proc_status_kib("VmRSS:");
        let started = Instant::now();
        let stream = client.etcd_snapshot().await.unwrap();
        let saved = talos_client::snapshot::save(stream)
            .to(target)
            .await
            .expect("a verified save");
        let growth_kib = proc_status_kib("VmHWM:").saturating_sub(baseline);
        eprintln!(
            "snapshot::save {:.1?}, peak RSS growth {growth_kib} KiB (server in process)",
            started.elapsed()
        );
        // The in-process server reads the file a chunk at a time too, so the
        // growth is the client's buffers plus both sides' HTTP/2 windows.
        assert!(growth_kib < 32 * 1024, "snapshot::save: {growth_kib} KiB");
        saved.report
    })
}
