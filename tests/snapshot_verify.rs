//! Verification of real etcd 3.4 snapshots: our status against
//! `etcdctl snapshot status`, and rejection of damaged files.

use std::path::Path;

use talos_client::snapshot::bbolt::{BboltError, Corruption, Db, Entry};
use talos_client::snapshot::{CheckFailure, SnapshotError, SnapshotReport, verify_file};

use talos_test_support::etcd::{etcdctl_status, fixture, reseal, write};

fn rejection(result: Result<SnapshotReport, SnapshotError>) -> (CheckFailure, String) {
    match result {
        Err(SnapshotError::Check {
            failure,
            corrupt_copy,
            ..
        }) => {
            assert!(corrupt_copy.is_none(), "verify_file keeps no copies");
            let message = failure.to_string();
            (*failure, message)
        }
        other => panic!("expected a failed check, got {other:?}"),
    }
}

fn page_size(path: &Path, len: u64) -> u64 {
    u64::from(Db::open(path, len).expect("open").page_size())
}

#[test]
fn status_matches_etcdctl() {
    let snapshot = fixture();
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "snap.db", snapshot);

    // etcdctl 3.4 keeps the trailer the server streams.
    assert_eq!(
        snapshot.len() % 512,
        32,
        "etcdctl's file has a sha256 trailer"
    );

    let report = verify_file(&path).expect("a real snapshot verifies");
    let etcdctl = etcdctl_status(&path);
    eprintln!("ours: {report:?}\netcdctl: {etcdctl}");
    assert_eq!(
        u64::from(report.status.hash),
        etcdctl["hash"].as_u64().unwrap()
    );
    assert_eq!(
        report.status.revision,
        etcdctl["revision"].as_i64().unwrap()
    );
    // etcdctl 3.4 counts every entry; etcd 3.6 (talosctl) live keys.
    assert_eq!(
        report.status.total_entries,
        etcdctl["totalKey"].as_u64().unwrap()
    );
    assert_eq!(
        report.status.total_size,
        etcdctl["totalSize"].as_u64().unwrap()
    );

    assert_eq!(report.size, snapshot.len() as u64);
    assert_eq!(report.status.total_size, report.size - 32);
    let trailer = &snapshot[snapshot.len() - 32..];
    let hex: String = trailer.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(report.sha256, hex);
    // 400 puts, 240 overwrites, 58 deletes, 3 big puts, all in revisions.
    assert!(
        report.status.revision >= 9,
        "revision {}",
        report.status.revision
    );
    assert!(
        report.status.total_entries > 700,
        "total entries {}",
        report.status.total_entries
    );
    // 400 keys less the 58 deleted, and the two big ones.
    assert_eq!(report.status.total_keys, 344);
}

#[test]
fn reader_sees_buckets_keys_and_overflow_values() {
    let snapshot = fixture();
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "snap.db", snapshot);
    let db = Db::open(&path, snapshot.len() as u64 - 32).unwrap();
    let summary = db.check().expect("consistent");
    assert_eq!(summary.high_water * u64::from(summary.page_size), db.size());
    assert_eq!(
        summary.reachable_pages + summary.free_pages,
        summary.high_water
    );

    let mut buckets = Vec::new();
    let mut largest = 0;
    let mut previous: Option<Vec<u8>> = None;
    db.for_each_bucket(|name, bucket| {
        buckets.push(String::from_utf8_lossy(name).into_owned());
        db.for_each(&bucket, |key, entry| {
            if let Some(p) = &previous {
                assert!(p.as_slice() < key, "keys in order");
            }
            previous = Some(key.to_vec());
            if let Entry::Value(v) = entry {
                largest = largest.max(v.len());
            }
            Ok::<(), BboltError>(())
        })?;
        previous = None;
        Ok::<(), BboltError>(())
    })
    .unwrap();
    for expected in ["cluster", "key", "lease", "members", "meta"] {
        assert!(buckets.iter().any(|b| b == expected), "{buckets:?}");
    }
    let mut sorted = buckets.clone();
    sorted.sort();
    assert_eq!(buckets, sorted, "buckets in order");
    assert!(
        largest > 2 * db.page_size() as usize,
        "a value spans overflow pages (largest {largest})"
    );
}

#[test]
fn flipped_byte_is_rejected_by_sha256() {
    let mut snapshot = fixture().to_vec();
    let middle = snapshot.len() / 2;
    snapshot[middle] ^= 0x01;
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "flipped.db", &snapshot);
    let (failure, message) = rejection(verify_file(&path));
    assert!(
        matches!(failure, CheckFailure::Sha256Mismatch { .. }),
        "{message}"
    );
    assert!(message.contains("sha256 mismatch"), "{message}");
}

#[test]
fn truncated_file_is_rejected() {
    let snapshot = fixture();
    let dir = tempfile::tempdir().unwrap();

    let path = write(dir.path(), "short.db", &snapshot[..snapshot.len() - 1000]);
    let (failure, message) = rejection(verify_file(&path));
    assert!(
        matches!(failure, CheckFailure::MissingTrailer { .. }),
        "{message}"
    );

    // Cut by a whole page: the size still looks like it has a trailer.
    let page = page_size(
        &write(dir.path(), "ok.db", snapshot),
        snapshot.len() as u64 - 32,
    );
    let path = write(
        dir.path(),
        "page-short.db",
        &snapshot[..snapshot.len() - page as usize],
    );
    let (failure, message) = rejection(verify_file(&path));
    assert!(
        matches!(failure, CheckFailure::Sha256Mismatch { .. }),
        "{message}"
    );
    // Resealed, the bbolt check notices the missing page.
    let mut short = snapshot[..snapshot.len() - page as usize].to_vec();
    reseal(&mut short);
    let path = write(dir.path(), "page-short-resealed.db", &short);
    let (failure, message) = rejection(verify_file(&path));
    assert!(
        matches!(failure, CheckFailure::Bbolt(BboltError::Truncated { .. })),
        "{message}"
    );
}

/// Damages a copy of the fixture with `damage(bytes, page_size, meta)`,
/// fixes the trailer, and returns what `verify_file` says.
fn damaged(name: &str, damage: impl FnOnce(&mut [u8], usize, u64)) -> (CheckFailure, String) {
    let snapshot = fixture();
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.db", snapshot);
    let db = Db::open(&good, snapshot.len() as u64 - 32).unwrap();
    let (page, root) = (db.page_size() as usize, db.meta().root);
    let mut bytes = snapshot.to_vec();
    damage(&mut bytes, page, root);
    reseal(&mut bytes);
    let path = write(dir.path(), name, &bytes);
    rejection(verify_file(&path))
}

#[test]
fn damaged_pages_with_valid_trailer_are_rejected_by_bbolt_check() {
    // The root page's header names another page.
    let (failure, message) = damaged("id.db", |b, page, root| {
        let at = root as usize * page;
        b[at..at + 8].copy_from_slice(&12345u64.to_le_bytes());
    });
    match failure {
        CheckFailure::Bbolt(BboltError::Corrupt { page, problem, .. }) => {
            assert_eq!(problem, Corruption::IdMismatch { found: 12345 });
            assert!(page >= 2, "{message}");
        }
        other => panic!("{other}"),
    }
    assert!(
        message.contains("bbolt") && message.contains("page"),
        "{message}"
    );

    // The root page's type is garbage.
    let (failure, message) = damaged("type.db", |b, page, root| {
        let at = root as usize * page + 8;
        b[at..at + 2].copy_from_slice(&0x40u16.to_le_bytes());
    });
    assert!(
        matches!(
            failure,
            CheckFailure::Bbolt(BboltError::Corrupt {
                problem: Corruption::UnexpectedType { flags: 0x40, .. },
                ..
            })
        ),
        "{message}"
    );

    // Both meta pages damaged.
    let (failure, message) = damaged("meta.db", |b, page, _| {
        b[16 + 20] ^= 0xff;
        b[page + 16 + 20] ^= 0xff;
    });
    assert!(
        matches!(failure, CheckFailure::Bbolt(BboltError::NoValidMeta { .. })),
        "{message}"
    );
}

/// The leaf pages under `id`, found by reading branch pages directly.
fn leaves_under(snapshot: &[u8], page: usize, id: u64, out: &mut Vec<u64>) {
    let at = id as usize * page;
    let le16 = |o: usize| u16::from_le_bytes([snapshot[o], snapshot[o + 1]]);
    match le16(at + 8) {
        0x01 => {
            for i in 0..le16(at + 10) as usize {
                let e = at + 16 + 16 * i;
                let child = u64::from_le_bytes(snapshot[e + 8..e + 16].try_into().unwrap());
                leaves_under(snapshot, page, child, out);
            }
        }
        0x02 => out.push(id),
        flags => panic!("page {id}: flags {flags:#x}"),
    }
}

#[test]
fn damaged_leaf_pages_are_rejected() {
    // Every leaf page of every bucket, damaged two ways: its first key made
    // to point outside the page, and its first key made larger than the
    // next (or than the bound its parent sets). Each must fail the check.
    let snapshot = fixture();
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.db", snapshot);
    let db = Db::open(&good, snapshot.len() as u64 - 32).unwrap();
    let page = db.page_size() as usize;
    let mut leaves = Vec::new();
    db.for_each_bucket(|_, bucket| {
        if let Some(root) = bucket.root_page() {
            leaves_under(snapshot, page, root, &mut leaves);
        }
        Ok::<(), BboltError>(())
    })
    .unwrap();
    assert!(leaves.len() > 5, "the fixture has leaf pages: {leaves:?}");
    let mut out_of_order = 0;
    for id in leaves {
        let at = id as usize * page;
        let count = u16::from_le_bytes([snapshot[at + 10], snapshot[at + 11]]);
        if count == 0 {
            continue;
        }
        // Element 0 is flags, pos, ksize, vsize: make the key huge.
        let mut bytes = snapshot.to_vec();
        bytes[at + 16 + 8..at + 16 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        reseal(&mut bytes);
        let (failure, message) = rejection(verify_file(&write(dir.path(), "leaf.db", &bytes)));
        assert!(
            matches!(
                failure,
                CheckFailure::Bbolt(BboltError::Corrupt {
                    problem: Corruption::ElementOutOfPage { index: 0 },
                    ..
                })
            ),
            "page {id}: {message}"
        );

        if count < 2 {
            continue;
        }
        let pos = u32::from_le_bytes(snapshot[at + 20..at + 24].try_into().unwrap()) as usize;
        let key = at + 16 + pos;
        if snapshot[key] == 0xff || snapshot[key + 1] == 0xff {
            continue;
        }
        out_of_order += 1;
        let mut bytes = snapshot.to_vec();
        bytes[key] = 0xff;
        reseal(&mut bytes);
        let (failure, message) = rejection(verify_file(&write(dir.path(), "order.db", &bytes)));
        assert!(
            matches!(
                failure,
                CheckFailure::Bbolt(BboltError::Corrupt {
                    problem: Corruption::KeyOrder { .. },
                    ..
                })
            ),
            "page {id}: {message}"
        );
    }
    eprintln!("damaged {out_of_order} leaves out of order");
    assert!(out_of_order > 0);
}

#[test]
fn etcdctl_agrees_the_fixture_is_consistent_and_ours_is_deterministic() {
    let snapshot = fixture();
    let dir = tempfile::tempdir().unwrap();
    let a = verify_file(&write(dir.path(), "a.db", snapshot)).unwrap();
    let b = verify_file(&write(dir.path(), "b.db", snapshot)).unwrap();
    assert_eq!(a, b);
    let json = serde_json::to_value(&a).unwrap();
    for field in [
        "size",
        "sha256",
        "hash",
        "revision",
        "total_keys",
        "total_entries",
        "total_size",
    ] {
        assert!(json.get(field).is_some(), "{field} in {json}");
    }
}
