//! Restore drills against backups in a real S3 server (s3s-fs) and a local
//! directory: a good backup restores into a throwaway etcd with the
//! sidecar's revision and keys; a tampered one fails naming the check.

mod s3;

use bytes::Bytes;
use futures::stream;
use sha2::{Digest, Sha256};
use talos_client::backup::{
    BackupMetadata, BackupRequest, DrillOptions, DrillReport, Identity, LocalStore, Store,
    backup_chunks, drill, get_all,
};
use talos_client::client::Error as ClientError;
use talos_test_support::etcd::Etcd;

use s3::S3Server;

fn chunks(bytes: &[u8]) -> stream::Iter<std::vec::IntoIter<Result<Bytes, ClientError>>> {
    let items: Vec<_> = bytes
        .chunks(16 * 1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    stream::iter(items)
}

/// A snapshot of an etcd holding Kubernetes-shaped keys and one other
/// prefix.
fn kubernetes_snapshot() -> Vec<u8> {
    let etcd = Etcd::start(&[]);
    let mut ops: Vec<String> = (0..5)
        .map(|i| format!("put /registry/pods/default/web-{i} \"pod {i}\""))
        .collect();
    ops.extend((0..3).map(|i| format!("put /registry/secrets/kube-system/s{i} \"secret {i}\"")));
    ops.push("put /registry/namespaces/default \"ns\"".into());
    ops.push("put /small/a 1".into());
    etcd.txn(&ops);
    etcd.txn(&["del /registry/pods/default/web-4".into()]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k8s.db");
    etcd.snapshot(&path);
    std::fs::read(&path).unwrap()
}

fn assert_failed(report: &DrillReport, check: &str) {
    assert!(!report.ok, "{report:#?}");
    assert_eq!(report.failed_check.as_deref(), Some(check), "{report:#?}");
    let last = report.checks.last().unwrap();
    assert_eq!((last.name.as_str(), last.ok), (check, false), "{report:#?}");
    assert!(report.revision.is_none() || check == "keys" || check == "prefixes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drill_restores_the_backup_and_matches_its_sidecar() {
    let server = S3Server::start(false).await;
    let store = server.store("drills");
    let identity = Identity::generate();
    let mut request = BackupRequest::new("prod");
    request.recipients = vec![identity.recipient()];
    let snapshot = kubernetes_snapshot();
    let stored = backup_chunks(&store, chunks(&snapshot), "cp-1", &request)
        .await
        .unwrap();
    let meta = &stored.metadata;
    let key = meta.object.key.clone();

    let work = tempfile::tempdir().unwrap();
    let mut options = DrillOptions::default();
    options.identities = vec![identity.clone()];
    options.work_dir = Some(work.path().to_owned());
    let report = drill(&store, &key, &options).await.unwrap();
    assert!(report.ok, "{report:#?}");
    assert_eq!(report.revision, Some(meta.snapshot.status.revision));
    assert_eq!(report.keys, Some(meta.snapshot.status.total_keys));
    assert_eq!(report.keys, Some(9));
    let prefixes: Vec<(&str, u64)> = report
        .prefixes
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(
        prefixes,
        [
            ("/registry/namespaces", 1),
            ("/registry/pods", 4),
            ("/registry/secrets", 3),
            ("/small", 1)
        ]
    );
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "sidecar",
            "object",
            "decrypt",
            "decompress",
            "snapshot",
            "sidecar-match",
            "restore",
            "start",
            "revision",
            "keys",
            "prefixes"
        ]
    );
    // The report is JSON, and reads back.
    let json = serde_json::to_string(&report).unwrap();
    assert_eq!(serde_json::from_str::<DrillReport>(&json).unwrap(), report);
    // Nothing is left in the working directory: no snapshot, no data.
    let left: Vec<_> = std::fs::read_dir(work.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");

    // Without the identity: the decrypt check fails.
    let mut stranger = DrillOptions::default();
    stranger.identities = vec![Identity::generate()];
    assert_failed(&drill(&store, &key, &stranger).await.unwrap(), "decrypt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_backup_fails_the_drill_naming_the_check() {
    let server = S3Server::start(false).await;
    let store = server.store("t");
    let identity = Identity::generate();
    let mut request = BackupRequest::new("prod");
    request.recipients = vec![identity.recipient()];
    let snapshot = kubernetes_snapshot();
    let stored = backup_chunks(&store, chunks(&snapshot), "cp-1", &request)
        .await
        .unwrap();
    let key = stored.metadata.object.key.clone();
    let mut options = DrillOptions::default();
    options.identities = vec![identity];

    // One byte changed in the stored object: its sha256 no longer matches.
    let file = server.object_file(&format!("t/{key}"));
    let mut object = std::fs::read(&file).unwrap();
    let middle = object.len() / 2;
    object[middle] ^= 0x01;
    std::fs::write(&file, &object).unwrap();
    assert_failed(&drill(&store, &key, &options).await.unwrap(), "object");

    // The sidecar rewritten to match the changed object: age's
    // authentication catches it.
    let sidecar_key = stored.metadata.sidecar_key();
    let mut meta: BackupMetadata =
        serde_json::from_slice(&get_all(&store, &sidecar_key).await.unwrap()).unwrap();
    meta.object.sha256 = Sha256::digest(&object)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    store
        .put(&sidecar_key, serde_json::to_vec(&meta).unwrap().into())
        .await
        .unwrap();
    assert_failed(&drill(&store, &key, &options).await.unwrap(), "decrypt");

    // No sidecar at all.
    assert_failed(
        &drill(&store, "t/none.db.zst", &options).await.unwrap(),
        "sidecar",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unencrypted_local_backup_drills_and_a_lying_sidecar_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::new(dir.path());
    let snapshot = kubernetes_snapshot();
    let stored = backup_chunks(
        &store,
        chunks(&snapshot),
        "cp-1",
        &BackupRequest::new("lab"),
    )
    .await
    .unwrap();
    let key = stored.metadata.object.key.clone();
    let report = drill(&store, &key, &DrillOptions::default()).await.unwrap();
    assert!(report.ok, "{report:#?}");
    assert_eq!(report.keys, Some(9));

    // A sidecar whose snapshot facts are not the object's.
    let mut meta = stored.metadata.clone();
    meta.snapshot.status.revision += 1;
    store
        .put(
            &meta.sidecar_key(),
            serde_json::to_vec(&meta).unwrap().into(),
        )
        .await
        .unwrap();
    assert_failed(
        &drill(&store, &key, &DrillOptions::default()).await.unwrap(),
        "sidecar-match",
    );
}
