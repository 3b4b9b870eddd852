//! Memory stays flat while a large snapshot is backed up to S3: spooled
//! encrypted, checked, compressed, age-encrypted and uploaded in parts.
//!
//! Alone in its file, so this process runs nothing else while it measures
//! its peak resident memory (`VmHWM`). The S3 server (s3s-fs) runs in this
//! process too, so the figure is an upper bound of the pipeline's. The
//! snapshot is made by a real etcd holding `BACKUP_MEMTEST_MIB` (default
//! 256) MiB of 1 MB values that do not compress, so the upload is as large
//! as the snapshot.

// A peak-memory check: the process's peak resident memory grows by the
// pipeline's buffers, which an unoptimised build of this crate holds as a
// release build does. It runs in the debug test build with the hot
// dependencies optimised (Cargo.toml's `profile.dev.package`), beside the
// other tests.

mod s3;

use std::time::Instant;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use futures::StreamExt;
use talos_client::backup::{BackupRequest, Identity, backup_chunks};
use talos_client::client::Error as ClientError;
use talos_test_support::etcd::Etcd;
use tokio::io::AsyncReadExt;

const VALUE_SIZE: usize = 1_000_000;
const WRITERS: usize = 4;
/// The peak resident memory allowed, whole process.
const LIMIT_MIB: u64 = 48;

fn proc_status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM via /proc/self/clear_refs");
}

/// Incompressible bytes (xorshift), different for each `seed`.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn backing_up_a_large_snapshot_to_s3_keeps_memory_flat() {
    let mib: usize = std::env::var("BACKUP_MEMTEST_MIB")
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
                    for i in (writer..values).step_by(WRITERS) {
                        let value = BASE64.encode(noise(i as u64, VALUE_SIZE));
                        etcd.http_put_base64(format!("/registry/large/{i:05}").as_bytes(), &value);
                    }
                });
            }
        });
        etcd.snapshot(&path);
    }
    let size = std::fs::metadata(&path).unwrap().len();
    eprintln!(
        "made a {} MiB snapshot in {:.1?}",
        size >> 20,
        started.elapsed()
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = s3::S3Server::start(false).await;
        let store = server.store("mem");
        let identity = Identity::generate();
        let mut request = BackupRequest::new("big");
        request.recipients = vec![identity.recipient()];
        request.spool_dir = Some(dir.path().to_owned());
        let file = tokio::fs::File::open(&path).await.unwrap();
        // The node's stream: 64 KiB messages, read from disk as they go.
        let chunks = futures::stream::unfold(file, |mut file| async move {
            let mut buf = vec![0u8; 64 * 1024];
            let n = file.read(&mut buf).await.unwrap();
            (n > 0).then(|| {
                buf.truncate(n);
                (Ok::<_, ClientError>(Bytes::from(buf)), file)
            })
        })
        .boxed();

        reset_peak();
        let baseline = proc_status_kib("VmRSS:");
        let started = Instant::now();
        let stored = backup_chunks(&store, chunks, "cp-1", &request)
            .await
            .expect("backup");
        let peak = proc_status_kib("VmHWM:");
        let elapsed = started.elapsed();
        eprintln!(
            "backup of {} MiB ({} MiB stored) in {elapsed:.1?}: peak RSS {} KiB, {} KiB over \
             the {baseline} KiB before",
            size >> 20,
            stored.metadata.object.size >> 20,
            peak,
            peak.saturating_sub(baseline)
        );
        assert_eq!(stored.metadata.snapshot.size, size);
        assert_eq!(stored.metadata.snapshot.status.total_keys, values as u64);
        // The values are noise: what is stored is at least their size.
        assert!(stored.metadata.object.size >= (values * VALUE_SIZE) as u64);
        assert!(
            peak < LIMIT_MIB * 1024,
            "peak RSS {peak} KiB backing up {} MiB",
            size >> 20
        );
        // Nothing named is left in the spool directory.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name() != "large.db")
            .collect();
        assert!(left.is_empty(), "{left:?}");
    });
}
