//! `ops snapshot --to s3://BUCKET/PREFIX --encrypt RECIPIENT` against the
//! simulator (real etcd) and a real S3 server on loopback (s3s-fs): the
//! verified snapshot is stored compressed and age-encrypted (nothing in the
//! bucket or on disk is plaintext), retention keeps the newest N of the
//! cluster's backups in the store, and a restore drill of what was stored
//! passes with the identity.

#[path = "../../../tests/s3/mod.rs"]
mod s3;

mod ops_fixture;

use talos_client::backup::{self, DrillOptions, Identity, Store as _};
use talos_test_support::cli::{Run, command};

use ops_fixture::Fixture;
use s3::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY};

async fn snapshot_to(f: &Fixture, server: &S3Server, extra: &[&str]) -> Run {
    let mut cmd = command(&f.talosconfig());
    cmd.args(["-o", "json", "ops", "--without-cluster-lock", "--state-dir"])
        .arg(f.state.path())
        .args(["snapshot", "--to", &format!("s3://{BUCKET}/prod")])
        .args(extra)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", &server.endpoint);
    let output = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[tokio::test]
async fn an_encrypted_off_host_snapshot_is_stored_kept_and_drills() {
    let f = Fixture::start(3).await;
    f.sim
        .cluster
        .fill("/registry/offhost/", 40, 512)
        .await
        .unwrap();
    let server = S3Server::start(false).await;
    let identity = Identity::generate();
    let recipient = identity.recipient().to_string();
    let args = ["--encrypt", recipient.as_str(), "--keep", "1"];
    let first = snapshot_to(&f, &server, &args).await.ok().json();
    assert_eq!(first["state"], "succeeded", "{first}");
    let second = snapshot_to(&f, &server, &args).await.ok().json();
    assert_eq!(second["state"], "succeeded", "{second}");
    let stored = second["steps"][0]["detail"].as_str().unwrap();
    assert!(stored.contains("age-encrypted for 1 recipient"), "{stored}");
    let removed = second["steps"][1]["detail"].as_str().unwrap();
    assert!(removed.starts_with("removed "), "{removed}");

    let store = server.store("prod");
    let entries = backup::catalogue(&[&store]).await.unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let key = entries[0].metadata.object.key.clone();
    assert!(key.ends_with(".db.zst.age"), "{key}");
    assert!(stored.contains(&key), "{stored}");
    // Nothing readable in the bucket: the object is age's format.
    let bytes = std::fs::read(server.object_file(&format!("prod/{key}"))).unwrap();
    assert!(
        bytes.starts_with(b"age-encryption.org/v1"),
        "{}",
        store.describe()
    );
    let mut options = DrillOptions::default();
    options.identities = vec![identity];
    let report = backup::drill(&store, &key, &options).await.unwrap();
    assert!(report.ok, "{report:?}");
    assert!(report.keys.unwrap() >= 40, "{report:?}");
}

#[tokio::test]
async fn bad_off_host_settings_are_refused_before_anything_is_sent() {
    let f = Fixture::start(1).await;
    let server = S3Server::start(false).await;
    let refused = snapshot_to(&f, &server, &["--encrypt", "age1notakey"]).await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains("age1notakey"), "{}", refused.stderr);
    let refused = snapshot_to(&f, &server, &["--s3-addressing", "sideways"]).await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains("sideways"), "{}", refused.stderr);
    assert!(server.files().is_empty(), "{:?}", server.files());
    // A directory is a store too: a bad recipient is refused there the
    // same way, and nothing is written.
    let local = f.state.path().join("local");
    let mut cmd = command(&f.talosconfig());
    cmd.args(["ops", "--without-cluster-lock", "--state-dir"])
        .arg(f.state.path())
        .args(["snapshot", "--to"])
        .arg(&local)
        .args(["--encrypt", "age1xyz"]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("age1xyz"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written: Vec<_> = std::fs::read_dir(&local)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(written.is_empty(), "{written:?}");
}

/// `ops snapshot --to DIR --encrypt R --kit`: the directory holds the same
/// object set as a bucket (age over zstd, the sidecar, the kit), with no
/// plaintext snapshot beside it; Debian's age and zstd and etcdctl read it,
/// and `ops drill --from DIR` proves it. Tiers keep a plain directory too.
#[tokio::test]
async fn an_encrypted_snapshot_in_a_directory_is_the_same_object_set() {
    let f = Fixture::start(3).await;
    f.sim
        .cluster
        .fill("/registry/local/", 25, 256)
        .await
        .unwrap();
    let identity = Identity::generate();
    let key_file = f.state.path().join("key.txt");
    std::fs::write(&key_file, identity.to_secret_text()).unwrap();
    let recipient = identity.recipient().to_string();
    let dir = f.state.path().join("backups");
    let run = |args: Vec<String>| {
        let mut cmd = command(&f.talosconfig());
        cmd.args(["-o", "json", "ops", "--without-cluster-lock", "--state-dir"])
            .arg(f.state.path())
            .args(args);
        async move {
            let output = tokio::task::spawn_blocking(move || cmd.output())
                .await
                .unwrap()
                .unwrap();
            Run {
                code: output.status.code().unwrap_or(-1),
                stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            }
        }
    };
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a = vec!["snapshot".to_string(), "--to".into()];
        a.push(dir.display().to_string());
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let stored = run(args(&["--encrypt", &recipient, "--kit"]))
        .await
        .ok()
        .json();
    assert_eq!(stored["state"], "succeeded", "{stored}");
    let key = stored["facts"]["off_host"]["key"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(key.ends_with(".db.zst.age"), "{key}");
    // Keys are CLUSTER/STAMP-NODE.db.zst.age, as in a bucket.
    let object = dir.join(&key);
    let cluster_dir = object.parent().unwrap();
    let mut names: Vec<String> = std::fs::read_dir(cluster_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let base = object.file_name().unwrap().to_str().unwrap();
    assert!(names.contains(&format!("{base}.kit.age")), "{names:?}");
    assert!(names.contains(&format!("{base}.json")), "{names:?}");
    assert!(
        names.iter().all(|n| !n.ends_with(".db")),
        "no plaintext snapshot: {names:?}"
    );
    let restored = f.state.path().join("restored.db");
    let pipeline = format!(
        "age -d -i {} {} | zstd -d -q -o {} && ETCDCTL_API=3 etcdctl snapshot status {} -w json",
        key_file.display(),
        object.display(),
        restored.display(),
        restored.display()
    );
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&pipeline)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{pipeline}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(status["totalKey"].as_u64().unwrap() >= 25, "{status}");

    let drilled = run(vec![
        "drill".into(),
        "--from".into(),
        dir.display().to_string(),
        "-i".into(),
        key_file.display().to_string(),
    ])
    .await
    .ok()
    .json();
    assert_eq!(drilled["state"], "succeeded", "{drilled}");
    assert_eq!(drilled["facts"]["key"], key.as_str(), "{drilled}");
    assert_eq!(drilled["facts"]["report"]["ok"], true, "{drilled}");

    // The object cut short (a copy that stopped halfway): the drill names
    // the backup and the check it failed, not merely "no complete backup".
    let bytes = std::fs::read(&object).unwrap();
    std::fs::write(&object, &bytes[..bytes.len() / 2]).unwrap();
    let truncated = run(vec![
        "drill".into(),
        "--from".into(),
        dir.display().to_string(),
        "-i".into(),
        key_file.display().to_string(),
    ])
    .await;
    assert_eq!(truncated.code, 1, "{}", truncated.stdout);
    assert!(
        truncated.stderr.contains(&key)
            && truncated.stderr.contains("failed the size check")
            && truncated
                .stderr
                .contains(&format!("holds {} bytes", bytes.len() / 2)),
        "{}",
        truncated.stderr
    );

    // Plain snapshots in another directory, kept by tiers alone: with
    // --keep 0 --keep-daily 1 only the newest of today stays.
    let plain = f.state.path().join("plain");
    for _ in 0..2 {
        let mut a = vec!["snapshot".to_string(), "--to".into()];
        a.push(plain.display().to_string());
        a.extend(["--keep", "0", "--keep-daily", "1"].map(String::from));
        let done = run(a).await.ok().json();
        assert_eq!(done["state"], "succeeded", "{done}");
    }
    let dbs: Vec<String> = std::fs::read_dir(&plain)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".db"))
        .collect();
    assert_eq!(dbs.len(), 1, "{dbs:?}");
}

async fn ops_in(f: &Fixture, server: &S3Server, args: &[&str]) -> Run {
    let mut cmd = command(&f.talosconfig());
    cmd.args(["-o", "json", "ops", "--without-cluster-lock", "--state-dir"])
        .arg(f.state.path())
        .args(args)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", &server.endpoint);
    let output = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `ops drill` restores the newest backup of the cluster into a throwaway
/// etcd and reports its revision and keys as the sidecar says; a tampered
/// object fails the drill naming the check; the cluster is not touched.
#[tokio::test]
async fn ops_drill_proves_the_newest_backup_and_catches_a_tampered_one() {
    let f = Fixture::start(3).await;
    f.sim
        .cluster
        .fill("/registry/drill/", 30, 256)
        .await
        .unwrap();
    let server = S3Server::start(false).await;
    let identity = Identity::generate();
    let key_file = f.state.path().join("key.txt");
    std::fs::write(&key_file, identity.to_secret_text()).unwrap();
    let recipient = identity.recipient().to_string();
    let stored = snapshot_to(&f, &server, &["--encrypt", recipient.as_str()])
        .await
        .ok()
        .json();
    assert_eq!(stored["state"], "succeeded", "{stored}");
    let from = format!("s3://{BUCKET}/prod");
    let key_path = key_file.to_str().unwrap();
    let drilled = ops_in(&f, &server, &["drill", "--from", &from, "-i", key_path])
        .await
        .ok()
        .json();
    assert_eq!(drilled["state"], "succeeded", "{drilled}");
    let report = &drilled["facts"]["report"];
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(
        report["revision"], drilled["facts"]["revision"],
        "{drilled}"
    );
    assert!(report["keys"].as_u64().unwrap() >= 30, "{report}");

    // The risk report reads both from the journal: the backup stored off
    // the host, and the drill that passed.
    let risk = ops_in(&f, &server, &["report"]).await.json();
    assert_eq!(risk["backup_off_host"]["op"], stored["id"], "{risk}");
    let location = risk["backup_off_host"]["location"].as_str().unwrap();
    assert!(location.starts_with(&from), "{risk}");
    assert_eq!(risk["drill"]["ok"], true, "{risk}");
    assert_eq!(risk["drill"]["op"], drilled["id"], "{risk}");
    for check in ["backup", "off-host-backup", "drill"] {
        assert!(
            risk["findings"]
                .as_array()
                .unwrap()
                .iter()
                .all(|f| f["check"] != check),
            "{check}: {risk}"
        );
    }

    // One flipped byte in the stored object: the drill fails, naming the
    // check that caught it.
    let key = drilled["facts"]["key"].as_str().unwrap().to_string();
    let file = server.object_file(&format!("prod/{key}"));
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&file, bytes).unwrap();
    let failed = ops_in(
        &f,
        &server,
        &["drill", "--from", &from, &key, "-i", key_path],
    )
    .await;
    assert_eq!(failed.code, 1, "{}", failed.stdout);
    assert!(
        failed.stderr.contains("failed the check"),
        "{}",
        failed.stderr
    );
    // The report says the last drill failed: critical.
    let after = ops_in(&f, &server, &["report"]).await;
    assert_eq!(after.code, 2, "{}", after.stderr);
    let after = after.json();
    assert_eq!(after["drill"]["ok"], false, "{after}");
    assert!(
        after["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["check"] == "drill" && f["level"] == "critical"),
        "{after}"
    );
    // Without the identity it cannot decrypt, and says so before anything.
    let refused = ops_in(
        &f,
        &server,
        &["drill", "--from", &from, "-i", "/nonexistent/key"],
    )
    .await;
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("/nonexistent/key"),
        "{}",
        refused.stderr
    );
}

/// `--kit` stores the cluster's recovery kit beside an encrypted snapshot:
/// Debian's `age` and `zstd` turn the object back into a snapshot etcdctl
/// reads, and the drill opens a Secret kube-apiserver encrypted at rest
/// with the kit's key; a kit is refused without a recipient.
#[tokio::test]
async fn a_kit_goes_beside_the_snapshot_and_its_key_opens_a_secret() {
    use talos_client::backup::at_rest;

    let f = Fixture::start(3).await;
    let config = std::fs::read_to_string(f.sim.cluster.dir().join("controlplane.yaml")).unwrap();
    let secretbox = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("secretboxEncryptionSecret: "))
        .expect("the control plane's configuration has a secretbox key")
        .to_string();
    // A Secret as kube-apiserver stores it with Talos' encryption config.
    let sealed = at_rest::seal_secretbox(&secretbox, b"k8s\0\n\x0c\n\x02v1\x12\x06Secret").unwrap();
    f.sim
        .cluster
        .put(b"/registry/secrets/default/db-password", &sealed)
        .await
        .unwrap();
    let server = S3Server::start(false).await;
    let identity = Identity::generate();
    let key_file = f.state.path().join("key.txt");
    std::fs::write(&key_file, identity.to_secret_text()).unwrap();
    let recipient = identity.recipient().to_string();

    let refused = snapshot_to(&f, &server, &["--kit"]).await;
    assert_eq!(
        refused.code, 2,
        "clap: --kit needs --encrypt: {}",
        refused.stderr
    );
    assert!(refused.stderr.contains("--encrypt"), "{}", refused.stderr);

    let stored = snapshot_to(&f, &server, &["--encrypt", recipient.as_str(), "--kit"])
        .await
        .ok()
        .json();
    assert_eq!(stored["state"], "succeeded", "{stored}");
    let detail = stored["steps"][0]["detail"].as_str().unwrap();
    assert!(
        detail
            .contains("kit: 1 encryption key(s), 3 member(s), 3 CA(s), 3 configuration digest(s)"),
        "{detail}"
    );
    let key = stored["facts"]["off_host"]["key"]
        .as_str()
        .unwrap()
        .to_string();
    let files = server.files();
    assert!(
        files
            .iter()
            .any(|f| f.ends_with(&format!("prod/{key}.kit.age"))),
        "{files:?}"
    );
    // The kit is age's format: no key in plain text in the bucket.
    let kit_bytes = std::fs::read(server.object_file(&format!("prod/{key}.kit.age"))).unwrap();
    assert!(kit_bytes.starts_with(b"age-encryption.org/v1"));
    assert!(!String::from_utf8_lossy(&kit_bytes).contains(&secretbox));

    // Debian's age and zstd, then etcdctl, read what was stored.
    let object = server.object_file(&format!("prod/{key}"));
    let restored = f.state.path().join("restored.db");
    let pipeline = format!(
        "age -d -i {} {} | zstd -d -q -o {} && ETCDCTL_API=3 etcdctl snapshot status {} -w json",
        key_file.display(),
        object.display(),
        restored.display(),
        restored.display()
    );
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&pipeline)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{pipeline}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(status["revision"].as_i64().unwrap() > 0, "{status}");

    // The drill opens the Secret with the kit's key.
    let from = format!("s3://{BUCKET}/prod");
    let drilled = ops_in(
        &f,
        &server,
        &["drill", "--from", &from, "-i", key_file.to_str().unwrap()],
    )
    .await
    .ok()
    .json();
    assert_eq!(drilled["state"], "succeeded", "{drilled}");
    let checks = drilled["facts"]["report"]["checks"].as_array().unwrap();
    let check = |name: &str| {
        checks
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name} check: {checks:?}"))
            .clone()
    };
    assert_eq!(check("kit")["ok"], true, "{checks:?}");
    let secret = check("kit-secret");
    assert_eq!(secret["ok"], true, "{secret}");
    assert!(
        secret["detail"].as_str().unwrap().starts_with(
            "/registry/secrets/default/db-password opened with the kit's secretbox key key2"
        ),
        "{secret}"
    );
}

/// `ops restore --from s3://...` fetches the newest backup of the cluster,
/// decrypts and verifies it before the plan is shown, says whether the
/// node's configuration holds the kit's key, and brings a node whose etcd
/// data was wiped back with the backup's revision. A tampered object is
/// refused before anything is sent.
#[tokio::test]
async fn a_restore_from_the_store_brings_the_backup_back() {
    use std::time::Duration;
    use talos_client::client::ResetRequest;
    use talos_test_support::sim::wait_for;

    let f = Fixture::start(1).await;
    f.sim
        .cluster
        .fill("/registry/restore/", 30, 256)
        .await
        .unwrap();
    let server = S3Server::start(false).await;
    let identity = Identity::generate();
    let key_file = f.state.path().join("key.txt");
    std::fs::write(&key_file, identity.to_secret_text()).unwrap();
    let recipient = identity.recipient().to_string();
    let stored = snapshot_to(&f, &server, &["--encrypt", recipient.as_str(), "--kit"])
        .await
        .ok()
        .json();
    let key = stored["facts"]["off_host"]["key"]
        .as_str()
        .unwrap()
        .to_string();
    let store = server.store("prod");
    let entry = backup::catalogue(&[&store]).await.unwrap().remove(0);
    let revision = entry.metadata.snapshot.status.revision;

    // The node loses its etcd data.
    let target = f.sim.ip(1);
    let admin = f.sim.admin();
    admin
        .node(target.as_str())
        .reset(
            ResetRequest::default()
                .with_graceful(false)
                .with_reboot(true)
                .with_system_labels_to_wipe(vec!["EPHEMERAL".into()]),
        )
        .await
        .unwrap();
    wait_for(
        "the node back without etcd",
        Duration::from_secs(60),
        || async {
            let node = admin.node(target.as_str());
            node.version().await.ok()?;
            node.etcd_status().await.is_err().then_some(())
        },
    )
    .await;

    let from = format!("s3://{BUCKET}/prod");
    let key_path = key_file.to_str().unwrap();
    // A changed object: refused, naming the check, before anything is sent.
    let object = server.object_file(&format!("prod/{key}"));
    let original = std::fs::read(&object).unwrap();
    let mut changed = original.clone();
    let middle = changed.len() / 2;
    changed[middle] ^= 0x55;
    std::fs::write(&object, &changed).unwrap();
    let refused = ops_in(
        &f,
        &server,
        &["--yes", "restore", "--from", &from, "-i", key_path, &target],
    )
    .await;
    assert_ne!(refused.code, 0, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("failed the object check"),
        "{}",
        refused.stderr
    );
    assert!(admin.node(target.as_str()).etcd_status().await.is_err());
    std::fs::write(&object, &original).unwrap();

    let run = ops_in(
        &f,
        &server,
        &["--yes", "restore", "--from", &from, "-i", key_path, &target],
    )
    .await;
    let shown = run.stderr.clone();
    let restored = run.ok().json();
    assert_eq!(restored["state"], "succeeded", "{restored}");
    assert_eq!(
        restored["facts"]["fetched_from"],
        format!("{from}/{key}"),
        "{restored}"
    );
    assert!(
        restored["facts"]["restored"][0].as_i64().unwrap() >= revision,
        "{restored}"
    );
    // The plan said where the snapshot came from and that the node's
    // configuration opens the restored Secrets.
    assert!(shown.contains("fetched, decrypted and verified"), "{shown}");
    assert!(
        shown.contains("holds the recovery kit's secret-encryption key"),
        "{shown}"
    );
    // The fetched snapshot is private to this user.
    let fetched = restored["facts"]["snapshot"].as_str().unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(fetched).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{fetched}");
}

/// `ops ARGS` with only the credentials in the environment: the region and
/// endpoint must come from flags.
async fn ops_with_flags_only(f: &Fixture, args: &[&str]) -> Run {
    let mut cmd = command(&f.talosconfig());
    cmd.args(["-o", "json", "ops", "--without-cluster-lock", "--state-dir"])
        .arg(f.state.path())
        .args(args)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env_remove("AWS_REGION")
        .env_remove("AWS_DEFAULT_REGION")
        .env_remove("AWS_ENDPOINT_URL");
    let output = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `--s3-endpoint` and `--s3-region` reach a store the environment does
/// not name, for the snapshot and the drill alike, and the journal keeps
/// them with the operation; an endpoint that is not a URL is refused at
/// plan time, naming it, with nothing stored.
#[tokio::test]
async fn the_endpoint_and_region_can_be_given_as_flags() {
    let f = Fixture::start(1).await;
    f.sim.cluster.fill("/registry/flags/", 5, 64).await.unwrap();
    let server = S3Server::start(false).await;
    let to = format!("s3://{BUCKET}/flags");
    let bad = ops_with_flags_only(
        &f,
        &[
            "--yes",
            "snapshot",
            "--to",
            &to,
            "--s3-endpoint",
            "127.0.0.1:1",
        ],
    )
    .await;
    // A usage error (exit 2) that names the flag, the value and the form.
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(
        bad.stderr.contains("'127.0.0.1:1' for '--s3-endpoint")
            && bad.stderr.contains("http://HOST[:PORT]"),
        "{}",
        bad.stderr
    );
    assert!(server.files().is_empty(), "{:?}", server.files());

    let flags = [
        "--s3-endpoint",
        server.endpoint.as_str(),
        "--s3-region",
        "us-east-1",
    ];
    let mut args = vec!["--yes", "snapshot", "--to", &to];
    args.extend(flags);
    let stored = ops_with_flags_only(&f, &args).await.ok().json();
    assert_eq!(stored["state"], "succeeded", "{stored}");
    assert_eq!(
        stored["params"]["s3_endpoint"],
        server.endpoint.as_str(),
        "{stored}"
    );
    assert_eq!(stored["params"]["s3_region"], "us-east-1", "{stored}");
    assert!(
        server.files().iter().any(|p| p.contains("flags/")),
        "{:?}",
        server.files()
    );

    let mut args = vec!["drill", "--from", &to];
    args.extend(flags);
    let drilled = ops_with_flags_only(&f, &args).await.ok().json();
    assert_eq!(drilled["state"], "succeeded", "{drilled}");

    // Without the flags and without the environment, the store is not
    // reached at all (AWS's endpoint is not tried from a test).
    let mut cmd = command(&f.talosconfig());
    cmd.args(["ops", "--without-cluster-lock", "--state-dir"])
        .arg(f.state.path())
        .args(["drill", "--from", &to, "--s3-endpoint", "ftp://x"]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ftp://x"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
