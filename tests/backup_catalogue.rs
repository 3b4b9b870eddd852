//! The catalogue lists this library's backups in local and S3 stores and
//! nothing else; retention deletes only what the plan says, only there.

mod s3;

use bytes::Bytes;
use futures::stream;
use talos_client::backup::{
    BackupRequest, Identity, LocalStore, Retention, Store, apply_retention, backup_chunks,
    catalogue,
};
use talos_client::client::Error as ClientError;
use talos_test_support::etcd::fixture;

use s3::S3Server;

fn chunks(bytes: &[u8]) -> stream::Iter<std::vec::IntoIter<Result<Bytes, ClientError>>> {
    let items: Vec<_> = bytes
        .chunks(64 * 1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    stream::iter(items)
}

async fn keys(store: &dyn Store) -> Vec<String> {
    store
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalogue_lists_our_backups_and_retention_touches_nothing_else() {
    let server = S3Server::start(false).await;
    let remote = server.store("team");
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::new(dir.path());
    let identity = Identity::generate();

    let mut request = BackupRequest::new("prod");
    request.recipients = vec![identity.recipient()];
    request.kit = Some(talos_client::backup::RecoveryKit::new("prod"));
    for name in ["prod/a.db.zst.age", "prod/b.db.zst.age"] {
        request.key = Some(name.into());
        backup_chunks(&remote, chunks(fixture()), "cp-1", &request)
            .await
            .unwrap();
    }
    backup_chunks(
        &local,
        chunks(fixture()),
        "cp-1",
        &BackupRequest::new("prod"),
    )
    .await
    .unwrap();

    // Objects other tools wrote, and sidecars that are not ours.
    let foreign = [
        ("other/backup.db", &b"someone else's"[..]),
        ("other/backup.db.json", b"{\"format\":\"another-tool\"}"),
        ("prod/loose.db.zst.age", b"no sidecar"),
        ("prod/liar.db.zst.json", b"not json"),
    ];
    for (key, bytes) in foreign {
        remote.put(key, Bytes::from_static(bytes)).await.unwrap();
    }
    // A sidecar of ours copied beside another object names the wrong key.
    let copied = talos_client::backup::get_all(&remote, "prod/a.db.zst.age.json")
        .await
        .unwrap();
    remote
        .put("prod/copy.db.zst.age.json", copied.into())
        .await
        .unwrap();

    let entries = catalogue(&[&remote, &local]).await.unwrap();
    let mut listed: Vec<(String, String, bool)> = entries
        .iter()
        .map(|e| (e.store.clone(), e.metadata.object.key.clone(), e.complete))
        .collect();
    listed.sort();
    let local_key = keys(&local)
        .await
        .into_iter()
        .find(|k| k.ends_with(".db.zst"))
        .unwrap();
    let mut expected = vec![
        (
            "s3://backups/team".to_owned(),
            "prod/a.db.zst.age".to_owned(),
            true,
        ),
        (
            "s3://backups/team".to_owned(),
            "prod/b.db.zst.age".to_owned(),
            true,
        ),
        (local.describe(), local_key, true),
    ];
    expected.sort();
    assert_eq!(listed, expected);
    assert!(
        entries
            .windows(2)
            .all(|w| w[0].metadata.time >= w[1].metadata.time)
    );

    // Keep one per store and cluster: the older remote backup goes, with
    // its kit and sidecar; the local one stays (another store).
    let mut retention = Retention::default();
    retention.keep_last = 1;
    let plan = retention.plan(&entries);
    assert_eq!(plan.delete.len(), 1);
    assert_eq!(plan.delete[0].metadata.object.key, "prod/a.db.zst.age");
    let before_local = keys(&local).await;
    let deleted = apply_retention(&remote, &plan).await.unwrap();
    assert_eq!(
        deleted,
        [
            "prod/a.db.zst.age",
            "prod/a.db.zst.age.kit.age",
            "prod/a.db.zst.age.json"
        ]
    );
    let mut left = keys(&remote).await;
    left.sort();
    let mut want: Vec<String> = foreign.iter().map(|(k, _)| k.to_string()).collect();
    want.extend(
        [
            "prod/b.db.zst.age",
            "prod/b.db.zst.age.json",
            "prod/b.db.zst.age.kit.age",
            "prod/copy.db.zst.age.json",
        ]
        .map(String::from),
    );
    want.sort();
    assert_eq!(left, want);
    assert_eq!(keys(&local).await, before_local);
    // The same plan applied to the local store deletes nothing there.
    assert!(apply_retention(&local, &plan).await.unwrap().is_empty());
}
