//! `snapshot::save` from a stream of 1 KiB chunks of a real etcd snapshot:
//! what it keeps, what it rejects, and what it leaves behind.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::stream;
use talos_client::client::{Error as ClientError, Failure};
use talos_client::snapshot::{CheckFailure, Save, SnapshotError, SnapshotMetadata, verify_file};

use talos_test_support::etcd::{fixture, reseal};

fn chunks(bytes: &[u8]) -> Vec<Result<Bytes, ClientError>> {
    bytes
        .chunks(1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect()
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    PathBuf::from(format!("{}{suffix}", path.display()))
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn save_keeps_a_good_snapshot_with_its_sidecar() {
    let snapshot = fixture();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("etcd.snapshot");
    // An older snapshot is replaced, but only by the final rename.
    std::fs::write(&path, b"previous").unwrap();

    let mut calls = 0u64;
    let mut last = 0u64;
    let mut monotonic = true;
    let (tx, rx) = std::sync::mpsc::channel();
    let saved = Save::from_chunks(stream::iter(chunks(snapshot)), "10.5.0.2")
        .progress(move |n| tx.send(n).unwrap())
        .to(&path)
        .await
        .expect("save");
    for n in rx.try_iter() {
        calls += 1;
        monotonic &= n >= last;
        last = n;
    }

    assert_eq!(calls, snapshot.len().div_ceil(1024) as u64);
    assert!(monotonic);
    assert_eq!(last, snapshot.len() as u64);

    assert_eq!(saved.path, path);
    assert_eq!(saved.sidecar, with_suffix(&path, ".json"));
    assert_eq!(std::fs::read(&path).unwrap(), snapshot);
    assert_eq!(mode(&path), 0o600);
    assert!(!with_suffix(&path, ".part").exists());
    assert!(!with_suffix(&path, ".corrupt").exists());

    let expected = verify_file(&path).unwrap();
    assert_eq!(saved.report, expected);

    let sidecar: SnapshotMetadata =
        serde_json::from_slice(&std::fs::read(&saved.sidecar).unwrap()).unwrap();
    assert_eq!(sidecar.node, "10.5.0.2");
    assert_eq!(sidecar.report, expected);
    assert_eq!(sidecar.time, saved.time);
    assert_eq!(sidecar.time.offset(), time::UtcOffset::UTC);
    // The time is RFC 3339 text in the file.
    let raw: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&saved.sidecar).unwrap()).unwrap();
    let text = raw["time"].as_str().unwrap();
    assert!(text.ends_with('Z') && text.contains('T'), "{text}");
    assert!(!with_suffix(&saved.sidecar, ".tmp").exists());
}

#[tokio::test]
async fn a_failed_transfer_leaves_nothing() {
    let snapshot = fixture();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("etcd.snapshot");
    let mut items = chunks(snapshot);
    let half = items.len() / 2;
    items.truncate(half);
    items.push(Err(ClientError::Unavailable(Failure {
        node: Some("10.5.0.2".into()),
        message: "connection reset".into(),
    })));
    items.extend(chunks(&snapshot[half * 1024..]));

    let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let error = Save::from_chunks(stream::iter(items), "10.5.0.2")
        .progress({
            let seen = seen.clone();
            move |n| seen.store(n, std::sync::atomic::Ordering::Relaxed)
        })
        .to(&path)
        .await
        .expect_err("the transfer failed");
    let seen = seen.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        matches!(&error, SnapshotError::Transfer { source } if matches!(**source, ClientError::Unavailable(_))),
        "{error}"
    );
    assert!(error.to_string().contains("connection reset"), "{error}");
    assert_eq!(seen, half as u64 * 1024, "progress stops at the failure");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "nothing left behind: {left:?}");
}

async fn save_rejected(bytes: &[u8], previous: Option<&[u8]>) -> (CheckFailure, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("etcd.snapshot");
    if let Some(previous) = previous {
        std::fs::write(&path, previous).unwrap();
    }
    let error = Save::from_chunks(stream::iter(chunks(bytes)), "n")
        .to(&path)
        .await
        .expect_err("rejected");
    let message = error.to_string();
    let SnapshotError::Check {
        path: reported,
        corrupt_copy,
        failure,
    } = error
    else {
        panic!("expected a failed check: {message}");
    };
    let corrupt = with_suffix(&path, ".corrupt");
    assert_eq!(reported, path);
    assert_eq!(corrupt_copy.as_deref(), Some(corrupt.as_path()));
    assert!(
        message.contains(&format!("{}", corrupt.display())),
        "the error names the corrupt copy: {message}"
    );
    assert!(message.contains(failure.check()), "{message}");
    assert_eq!(std::fs::read(&corrupt).unwrap(), bytes);
    assert!(!with_suffix(&path, ".part").exists());
    assert!(!with_suffix(&path, ".json").exists());
    match previous {
        Some(previous) => assert_eq!(std::fs::read(&path).unwrap(), previous),
        None => assert!(!path.exists(), "nothing under the final name"),
    }
    // Keep the directory alive until the checks above are done.
    drop(dir);
    (*failure, corrupt)
}

#[tokio::test]
async fn a_corrupted_snapshot_is_kept_aside_as_corrupt() {
    let mut bytes = fixture().to_vec();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x80;
    let (failure, _) = save_rejected(&bytes, None).await;
    match failure {
        CheckFailure::Sha256Mismatch { expected, actual } => {
            assert_eq!(expected.len(), 64);
            assert_ne!(expected, actual);
        }
        other => panic!("{other}"),
    }
}

#[tokio::test]
async fn a_rejected_snapshot_does_not_replace_the_previous_one() {
    let mut bytes = fixture().to_vec();
    // Damage a meta page, with a matching trailer: only the bbolt check can
    // tell.
    let page = u32::from_le_bytes(bytes[24..28].try_into().unwrap()) as usize;
    bytes[16 + 24] ^= 0x01;
    bytes[page + 16 + 24] ^= 0x01;
    reseal(&mut bytes);
    let (failure, _) = save_rejected(&bytes, Some(b"the previous good snapshot")).await;
    assert!(matches!(failure, CheckFailure::Bbolt(_)), "{failure}");
}

#[tokio::test]
async fn a_truncated_stream_fails_the_trailer_check() {
    let snapshot = fixture();
    let (failure, _) = save_rejected(&snapshot[..snapshot.len() - 1000], None).await;
    assert!(
        matches!(failure, CheckFailure::MissingTrailer { .. }),
        "{failure}"
    );
    let (failure, _) = save_rejected(&[], None).await;
    assert!(
        matches!(failure, CheckFailure::MissingTrailer { size: 0 }),
        "{failure}"
    );
}

#[tokio::test]
async fn an_older_corrupt_copy_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let corrupt = with_suffix(&path, ".corrupt");
    std::fs::write(&corrupt, b"old corrupt").unwrap();
    let bytes = &fixture()[..4096];
    Save::from_chunks(stream::iter(chunks(bytes)), "n")
        .to(&path)
        .await
        .expect_err("rejected");
    assert_eq!(std::fs::read(&corrupt).unwrap(), bytes);
}

#[tokio::test]
async fn save_fails_when_the_part_file_cannot_be_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing-dir").join("s.db");
    let error = Save::from_chunks(stream::iter(chunks(fixture())), "n")
        .to(&path)
        .await
        .expect_err("no directory");
    match error {
        SnapshotError::Io { path: failed, .. } => {
            assert_eq!(failed, with_suffix(&path, ".part"))
        }
        other => panic!("{other}"),
    }
}

#[test]
fn the_save_future_is_send_for_send_streams() {
    fn assert_send<T: Send>(_: T) {}
    let path = std::path::Path::new("/nonexistent/never-polled");
    assert_send(
        Save::from_chunks(stream::iter(Vec::<Result<Bytes, ClientError>>::new()), "n")
            .progress(|_| {})
            .to(path),
    );
}
