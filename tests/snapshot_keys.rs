//! The two key counts of a snapshot's status, on a real etcd database with
//! overwritten, deleted, re-created and compacted keys:
//!
//! - `total_keys`, what talosctl v1.13.9 prints (etcd 3.6's `etcdutl
//!   snapshot status`): the distinct live keys, checked against the keys
//!   the test wrote and against etcd's own count of them;
//! - `total_entries`, etcd 3.4's `totalKey` (every entry of every bucket),
//!   checked against Debian's `etcdctl snapshot status`.

use std::collections::BTreeSet;
use std::path::Path;

use talos_client::snapshot::{SnapshotReport, verify_file};

use talos_test_support::etcd::{Etcd, etcdctl_status};

/// The keys the test has written and not deleted since.
#[derive(Default)]
struct Model(BTreeSet<String>);

impl Model {
    fn put(&mut self, etcd: &Etcd, keys: &[String], round: usize) {
        let ops: Vec<String> = keys
            .iter()
            .map(|k| format!("put {k} \"round {round}\""))
            .collect();
        etcd.txn(&ops);
        self.0.extend(keys.iter().cloned());
    }

    fn delete(&mut self, etcd: &Etcd, keys: &[String]) {
        let ops: Vec<String> = keys.iter().map(|k| format!("del {k}")).collect();
        etcd.txn(&ops);
        for k in keys {
            assert!(self.0.remove(k), "{k} was live");
        }
    }
}

fn keys(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i:03}")).collect()
}

/// etcd's own answer: the number of live keys and the current revision.
fn live_in_etcd(etcd: &Etcd) -> (u64, i64) {
    let out = etcd.ctl(&["get", "", "--from-key", "--keys-only", "-w", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let count = json.get("count").and_then(|c| c.as_u64()).unwrap_or(0);
    (count, json["header"]["revision"].as_i64().unwrap())
}

/// Verifies the snapshot at `path` and checks it against etcdctl 3.4 and
/// against the live keys.
fn check(path: &Path, model: &Model, live_in_etcd: u64) -> SnapshotReport {
    let report = verify_file(path).expect("a real snapshot verifies");
    let etcdctl = etcdctl_status(path);
    eprintln!("ours: {report:?}\netcdctl 3.4: {etcdctl}");
    let status = report.status;
    assert_eq!(status.total_keys, model.0.len() as u64, "the keys written");
    assert_eq!(status.total_keys, live_in_etcd, "etcd's count");
    assert_eq!(
        status.total_entries,
        etcdctl["totalKey"].as_u64().unwrap(),
        "etcdctl 3.4 counts every entry"
    );
    assert_eq!(u64::from(status.hash), etcdctl["hash"].as_u64().unwrap());
    assert_eq!(status.revision, etcdctl["revision"].as_i64().unwrap());
    assert_eq!(status.total_size, etcdctl["totalSize"].as_u64().unwrap());
    report
}

#[test]
fn total_keys_counts_live_keys_and_total_entries_every_entry() {
    let etcd = Etcd::start(&[]);
    let mut model = Model::default();
    let main = |r| keys("/t/main/", r);

    // 100 keys, half of them overwritten twice.
    model.put(&etcd, &main(0..100), 0);
    model.put(&etcd, &main(0..50), 1);
    model.put(&etcd, &main(0..50), 2);
    // 30 deleted, 5 of those re-created.
    model.delete(&etcd, &main(50..80));
    model.put(&etcd, &main(60..65), 3);
    // Created, deleted, re-created, deleted again: gone.
    let gone = keys("/t/gone/", 0..3);
    for round in 0..2 {
        model.put(&etcd, &gone, round);
        model.delete(&etcd, &gone);
    }
    // Deleted as a range: one tombstone per key.
    let ranged = keys("/t/range/", 0..10);
    model.put(&etcd, &ranged, 0);
    let out = etcd.ctl(&["del", "--prefix", "/t/range/"]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "10",
        "{out:?}"
    );
    for k in &ranged {
        model.0.remove(k);
    }
    assert_eq!(model.0.len(), 100 - 30 + 5);

    let dir = tempfile::tempdir().unwrap();
    let before = dir.path().join("before.db");
    etcd.snapshot(&before);
    let (live, revision) = live_in_etcd(&etcd);
    let first = check(&before, &model, live);
    // 100 + 50 + 50 puts, 30 + 5 more, 12 for `gone`, 20 for `range`: each
    // a revision entry in bucket `key`, beside etcd's own bookkeeping.
    assert!(first.status.total_entries >= 267, "{:?}", first.status);

    // Compaction drops superseded revisions and old tombstones; live keys
    // keep their latest revision. Then a little more history.
    let out = etcd.ctl(&["compact", &revision.to_string(), "--physical"]);
    assert!(out.status.success(), "{out:?}");
    model.put(&etcd, &main(0..10), 4);
    model.delete(&etcd, &main(90..100));
    model.put(&etcd, &keys("/t/new/", 0..4), 0);
    let after = dir.path().join("after.db");
    etcd.snapshot(&after);
    let (live, _) = live_in_etcd(&etcd);
    let second = check(&after, &model, live);
    assert_eq!(second.status.total_keys, 75 - 10 + 4);
    assert!(
        second.status.total_entries < first.status.total_entries,
        "compaction removed entries: {:?} then {:?}",
        first.status,
        second.status
    );
}
