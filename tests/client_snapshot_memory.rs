//! A 256 MiB snapshot streamed to a file keeps the process's peak memory
//! flat. Measured (VmHWM), not timed; alone in its own test binary so no
//! other test shares the process.

// A peak-memory check: the process's peak resident memory grows by the
// pipeline's buffers, which an unoptimised build of this crate holds as a
// release build does. It runs in the debug test build with the hot
// dependencies optimised (Cargo.toml's `profile.dev.package`), beside the
// other tests.

use talos_test_support as common;

use std::time::Duration;

use common::server::{TestPki, TestServer, snapshot_byte};
use talos_client::Client;

const SIZE: u64 = 256 * 1024 * 1024;

/// Peak resident set size of this process, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_256_mib_keeps_peak_memory_flat() {
    let pki = TestPki::new();
    let server = TestServer::start(&pki, "cp-1").await;
    *server.state.snapshot_size.lock().unwrap() = SIZE;
    let client = Client::builder()
        .endpoints([server.endpoint()])
        .credentials(pki.client_credentials(&pki.admin))
        .call_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    client.hostname().await.unwrap(); // connection and TLS set up before measuring
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.db");

    // Reset the high-water mark so only the streaming counts.
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let before = peak_rss_kib();
    let stream = client.etcd_snapshot().await.unwrap();
    let written = talos_test_support::stream_to_file(stream, &path)
        .await
        .unwrap();
    let growth_mib = (peak_rss_kib() - before) / 1024;

    assert_eq!(written, SIZE);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), SIZE);
    // Spot-check content at chunk boundaries and the end.
    let data = std::fs::read(&path).unwrap();
    for offset in [0, 1023, 1024, SIZE / 2 + 7, SIZE - 1] {
        assert_eq!(
            data[offset as usize],
            snapshot_byte(offset),
            "byte {offset}"
        );
    }
    assert!(
        growth_mib < 64,
        "peak RSS grew by {growth_mib} MiB while streaming 256 MiB"
    );
    eprintln!("peak RSS growth while streaming 256 MiB: {growth_mib} MiB");
}
