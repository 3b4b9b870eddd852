//! The backup pipeline against a real S3 server on loopback (s3s-fs):
//! what it stores is the standard age and zstd format that Debian's `age`
//! and `zstd` read back into a snapshot `etcdctl` reads; a snapshot that
//! fails a check leaves nothing; both addressing styles work.

mod s3;

use std::process::{Command, Stdio};

use bytes::Bytes;
use futures::stream;
use sha2::{Digest, Sha256};
use talos_client::backup::{
    Addressing, BackupError, BackupRequest, Encryption, EncryptionSecret, Identity, KitMember,
    RecoveryKit, S3Store, SecretString, Store, backup_chunks, get_all, read_kit,
};
use talos_client::client::Error as ClientError;
use talos_client::snapshot::verify_file;
use talos_test_support::etcd::{etcdctl_status, fixture, reseal, write};

use s3::S3Server;

fn chunks(bytes: &[u8]) -> stream::Iter<std::vec::IntoIter<Result<Bytes, ClientError>>> {
    let items: Vec<_> = bytes
        .chunks(7000)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    stream::iter(items)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn kit() -> RecoveryKit {
    let mut member = KitMember::new(42, "cp-1");
    member.peer_urls = vec!["https://10.5.0.2:2380".into()];
    member.client_urls = vec!["https://10.5.0.2:2379".into()];
    let mut kit = RecoveryKit::new("prod");
    kit.encryption_secrets = vec![EncryptionSecret::new(
        "secretbox",
        SecretString::new("a2l0LXNlY3JldC10aGF0LW11c3Qtbm90LWxlYWs="),
    )];
    kit.members = vec![member];
    kit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_backup_reads_back_with_age_and_zstd() {
    let server = S3Server::start(false).await;
    let store = server.store("clusters");
    let snapshot = fixture();
    let identity = Identity::generate();
    let other = Identity::generate();
    let mut request = BackupRequest::new("prod");
    request.recipients = vec![identity.recipient(), other.recipient()];
    request.kit = Some(kit());
    request.talos_version = Some("v1.13.9".into());

    let stored = backup_chunks(&store, chunks(snapshot), "10.5.0.2", &request)
        .await
        .expect("backup");
    let meta = &stored.metadata;
    let key = meta.object.key.clone();
    assert!(
        key.starts_with("prod/") && key.ends_with("-10.5.0.2.db.zst.age"),
        "{key}"
    );

    // The sidecar describes the snapshot as the local checks see it, and
    // the object as stored.
    let dir = tempfile::tempdir().unwrap();
    let original = write(dir.path(), "original.db", snapshot);
    assert_eq!(meta.snapshot, verify_file(&original).unwrap());
    let object = std::fs::read(server.object_file(&format!("clusters/{key}"))).unwrap();
    assert_eq!(meta.object.size, object.len() as u64);
    assert_eq!(meta.object.sha256, hex(&Sha256::digest(&object)));
    assert_eq!(
        meta.object.encryption,
        Encryption::Age {
            recipients: vec![
                identity.recipient().to_string(),
                other.recipient().to_string()
            ]
        }
    );
    let sidecar: talos_client::backup::BackupMetadata =
        serde_json::from_slice(&get_all(&store, &meta.sidecar_key()).await.unwrap()).unwrap();
    assert_eq!(&sidecar, meta);
    assert_eq!(sidecar.talos_version.as_deref(), Some("v1.13.9"));

    // Debian's age and zstd turn it back into the snapshot.
    let id_file = write(dir.path(), "id.txt", identity.to_secret_text().as_bytes());
    let object_file = write(dir.path(), "object.age", &object);
    let restored = dir.path().join("restored.db");
    let pipeline = format!(
        "age -d -i {} {} | zstd -d -q -o {}",
        id_file.display(),
        object_file.display(),
        restored.display()
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(&pipeline)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{pipeline}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&restored).unwrap(), snapshot);
    let status = etcdctl_status(&restored);
    assert_eq!(
        status["revision"].as_i64().unwrap(),
        meta.snapshot.status.revision
    );
    assert_eq!(
        u64::from(meta.snapshot.status.hash),
        status["hash"].as_u64().unwrap()
    );

    // The kit: encrypted (its secret appears nowhere in the store), and
    // read back with either identity, with the snapshot's revision.
    let secret = b"a2l0LXNlY3JldC10aGF0LW11c3Qtbm90LWxlYWs=";
    for file in server.files() {
        let bytes = std::fs::read(server.root().join(&file)).unwrap();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret),
            "{file} holds the secret"
        );
    }
    let read = read_kit(&store, meta, std::slice::from_ref(&other))
        .await
        .unwrap();
    assert_eq!(read.revision, meta.snapshot.status.revision);
    assert_eq!(read.encryption_secrets, kit().encryption_secrets);
    assert_eq!(read.members, kit().members);
    let stranger = Identity::generate();
    assert!(read_kit(&store, meta, &[stranger]).await.is_err());
}

/// The keys under the bucket, upload parts included.
fn leftovers(server: &S3Server) -> Vec<String> {
    server.files()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_failing_a_check_leaves_nothing_in_the_bucket() {
    let server = S3Server::start(false).await;
    let store = server.store("p");
    let identity = Identity::generate();
    let mut request = BackupRequest::new("prod");
    request.recipients = vec![identity.recipient()];
    request.key = Some("prod/bad.db.zst.age".into());

    // Larger than one part, so parts were uploaded before the check.
    let good = fixture();
    let mut damaged = good.to_vec();
    let page = 4096 * 3;
    damaged[page + 100] ^= 0xff; // contents changed, trailer not
    let mut resealed = damaged.clone();
    reseal(&mut resealed); // trailer matches: the bbolt or status check must catch it
    let truncated = &good[..good.len() - 100];

    for (bytes, check) in [(&damaged[..], "sha256"), (truncated, "trailer")] {
        let error = backup_chunks(&store, chunks(bytes), "n", &request)
            .await
            .expect_err("a bad snapshot");
        match &error {
            BackupError::Check { key, failure } => {
                assert_eq!(failure.check(), check, "{error}");
                assert_eq!(key, "prod/bad.db.zst.age");
            }
            other => panic!("expected a failed check, got {other}"),
        }
        assert!(error.to_string().contains("aborted"), "{error}");
        assert!(store.list("").await.unwrap().is_empty());
        assert_eq!(
            leftovers(&server),
            Vec::<String>::new(),
            "after the {check} check"
        );
    }
    let error = backup_chunks(&store, chunks(&resealed), "n", &request)
        .await
        .expect_err("a damaged page");
    let BackupError::Check { failure, .. } = &error else {
        panic!("expected a failed check, got {error}");
    };
    assert!(matches!(failure.check(), "bbolt" | "status"), "{error}");
    assert_eq!(leftovers(&server), Vec::<String>::new());

    // A kit without recipients is refused before anything is sent.
    let mut plain = BackupRequest::new("prod");
    plain.kit = Some(kit());
    let error = backup_chunks(&store, chunks(good), "n", &plain)
        .await
        .unwrap_err();
    assert!(matches!(error, BackupError::KitNeedsRecipients), "{error}");
    assert_eq!(leftovers(&server), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_transfer_aborts_the_upload() {
    let server = S3Server::start(false).await;
    let store = server.store("p");
    let snapshot = fixture();
    let mut items: Vec<Result<Bytes, ClientError>> = snapshot
        .chunks(7000)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let half = items.len() / 2;
    items.truncate(half);
    items.push(Err(ClientError::Unavailable(
        talos_client::client::Failure {
            node: Some("10.5.0.2".into()),
            message: "connection reset".into(),
        },
    )));
    let error = backup_chunks(&store, stream::iter(items), "n", &BackupRequest::new("c"))
        .await
        .unwrap_err();
    assert!(matches!(error, BackupError::Transfer { .. }), "{error}");
    assert!(error.to_string().contains("connection reset"), "{error}");
    assert_eq!(leftovers(&server), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_addressing_styles_reach_the_bucket() {
    for (virtual_hosts, addressing) in [(false, Addressing::Path), (true, Addressing::Virtual)] {
        let server = S3Server::start(virtual_hosts).await;
        let store = S3Store::new(server.settings("x/y", addressing)).unwrap();
        let stored = backup_chunks(&store, chunks(fixture()), "n", &BackupRequest::new("c"))
            .await
            .unwrap_or_else(|e| panic!("{addressing:?}: {e}"));
        let key = &stored.metadata.object.key;
        assert!(
            server.object_file(&format!("x/y/{key}")).is_file(),
            "{addressing:?}"
        );
        let listed: Vec<String> = store
            .list("")
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect();
        assert_eq!(
            listed,
            vec![key.clone(), format!("{key}.json")],
            "{addressing:?}"
        );
        // Virtual-hosted requests do not name the bucket in the path: a
        // server that reads buckets from paths only finds no bucket "x".
        if addressing == Addressing::Path {
            let wrong = S3Store::new(server.settings("x/y", Addressing::Virtual)).unwrap();
            let error = wrong
                .put("k", Bytes::from_static(b"v"))
                .await
                .expect_err("virtual-hosted on a path-style server");
            assert!(error.to_string().contains("s3://backups/x/y"), "{error}");
        }
    }
}
