//! talos-opsd's off-host schedule against the simulator (real etcd) and a
//! real S3 server on loopback (s3s-fs): scheduled snapshots go to
//! `s3://BUCKET/PREFIX` age-encrypted with a recovery kit, retention tiers
//! keep what they say, scheduled drills prove the newest backup restores,
//! and both show in the metrics. A bad store setting is refused by
//! `check-config` naming the key.

#[path = "../../../tests/s3/mod.rs"]
mod s3;

mod daemon;

use std::time::Duration;

use daemon::{Daemon, cluster_toml, free_port};
use s3::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY};
use talos_client::backup::{self, Identity};
use talos_opsd::proto;
use talos_test_support::cli::cargo_bin;
use talos_test_support::sim::SimCluster;

async fn scrape(port: u16) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    answer
}

/// The value of the series `name{cluster="a"}`, if present.
fn series(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}{{cluster=\"a\"}} ")))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn scheduled_backups_go_off_host_encrypted_with_a_kit_and_scheduled_drills_prove_them() {
    let sim = SimCluster::start(1).await;
    sim.cluster.fill("/registry/opsd/", 20, 128).await.unwrap();
    let server = S3Server::start(false).await;
    let dir = tempfile::tempdir().unwrap();
    let identity = Identity::generate();
    let key_file = dir.path().join("backup.key");
    std::fs::write(&key_file, identity.to_secret_text()).unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let port = free_port();
    let extra = format!(
        "[cluster.snapshots]\ninterval = \"1s\"\nkeep = 2\nstore = \"s3://{BUCKET}/opsd\"\n\
         s3_endpoint = {:?}\ns3_region = \"us-east-1\"\n\
         encrypt = [\"{}\"]\nkit = true\n\
         [cluster.drills]\ninterval = \"2s\"\nidentity = [{key_file:?}]\n",
        server.endpoint,
        identity.recipient()
    );
    // Only the credentials come from the environment: the endpoint and
    // region are the configuration's, and the drills take the snapshots'.
    let env = [
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
    ];
    let d = Daemon::start_with(
        dir.path(),
        &cluster_toml("a", &tc, &extra),
        &env,
        &["--metrics-addr", &format!("127.0.0.1:{port}")],
    )
    .await;
    let client = d.client().await;
    // Three snapshots and one drill succeeded.
    let ops = daemon::until_succeeded(
        &client,
        "a",
        "three scheduled snapshots and a drill",
        Duration::from_secs(120),
        |ops| {
            let snapshots = ops.iter().filter(|o| o.kind == "snapshot").count();
            let drills = ops.iter().filter(|o| o.kind == "drill").count();
            snapshots >= 3 && drills >= 1
        },
    )
    .await;
    // ListSnapshots lists the store's backups live, beside the files.
    let listed = client
        .clone()
        .list_snapshots(proto::ListSnapshotsRequest {
            cluster: "a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(listed.errors.is_empty(), "{:?}", listed.errors);
    let stored: Vec<_> = listed
        .snapshots
        .iter()
        .filter(|s| s.store == format!("s3://{BUCKET}/opsd"))
        .collect();
    assert!(stored.len() >= 2, "{listed:?}");
    for s in &stored {
        assert!(s.key.ends_with(".db.zst.age"), "{s:?}");
        assert!(s.path.is_empty(), "{s:?}");
        assert_eq!((s.recipients, s.kit, s.complete), (1, true, true), "{s:?}");
        assert!(s.revision > 0 && s.size > 0, "{s:?}");
    }
    let metrics = scrape(port).await;
    let mut d = d;
    assert_eq!(d.signal_and_wait(libc::SIGTERM).await, Some(0));

    // Nothing on the admin host: every snapshot went to the store.
    assert!(!dir.path().join("state/snapshots/a").exists());
    let store = server.store("opsd");
    let entries = backup::catalogue(&[&store]).await.unwrap();
    // keep = 2: retention left the newest two (a third may have been
    // stored after the last retention ran, at the SIGTERM).
    assert!(
        (2..=3).contains(&entries.len()),
        "{} backups: {entries:?}",
        entries.len()
    );
    for e in &entries {
        assert!(e.metadata.object.key.ends_with(".db.zst.age"), "{e:?}");
        assert!(e.metadata.kit.is_some(), "no kit beside {e:?}");
    }
    let kit = backup::read_kit(&store, &entries[0].metadata, &[identity])
        .await
        .unwrap();
    assert_eq!(kit.encryption_secrets.len(), 1, "{kit:?}");
    assert_eq!(kit.encryption_secrets[0].provider, "secretbox");

    // The drill's report is in its operation; the metrics show both.
    let drill = ops.iter().find(|o| o.kind == "drill").unwrap();
    let facts: serde_json::Value = serde_json::from_str(&drill.facts_json).unwrap();
    assert_eq!(facts["report"]["ok"], true, "{facts}");
    assert!(facts["report"]["keys"].as_u64().unwrap() >= 20, "{facts}");
    let drilled_at = series(&metrics, "talos_opsd_drill_last_success_timestamp_seconds")
        .unwrap_or_else(|| panic!("no drill time in\n{metrics}"));
    assert!(drilled_at > 1.7e9, "{drilled_at}");
    let revision = series(&metrics, "talos_opsd_drill_last_revision").unwrap();
    assert_eq!(Some(revision as i64), facts["report"]["revision"].as_i64());
    let size = series(&metrics, "talos_opsd_snapshot_last_size_bytes").unwrap();
    assert!(size > 0.0, "{metrics}");
}

/// A store that cannot be reached is named in ListSnapshots' errors; the
/// answer still comes, within its bound.
#[tokio::test]
async fn an_unreachable_store_is_reported_by_list_snapshots() {
    let sim = SimCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    // A port nothing listens on.
    let closed = free_port();
    let extra = format!(
        "[cluster.snapshots]\ninterval = \"1h\"\nstore = \"s3://{BUCKET}/gone\"\n\
         s3_endpoint = \"http://127.0.0.1:{closed}\"\ns3_region = \"us-east-1\"\n"
    );
    let env = [
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
    ];
    let d = Daemon::start_with(dir.path(), &cluster_toml("a", &tc, &extra), &env, &[]).await;
    let listed = d
        .client()
        .await
        .list_snapshots(proto::ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.snapshots.is_empty(), "{listed:?}");
    assert_eq!(listed.errors.len(), 1, "{listed:?}");
    let error = &listed.errors[0];
    assert_eq!(error.cluster, "a");
    assert_eq!(error.store, format!("s3://{BUCKET}/gone"));
    assert!(!error.message.is_empty(), "{error:?}");
}

/// `check-config` refuses what the store settings cannot do, naming the key
/// and its line, before anything runs.
#[tokio::test]
async fn bad_store_settings_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimCluster::start(1).await;
    let tc = sim.dir.path().join("talosconfig");
    let cases = [
        (
            "[cluster.snapshots]\ninterval = \"1h\"\nstore = \"backups\"\n",
            "cluster[0].snapshots.store",
        ),
        (
            "[cluster.snapshots]\ninterval = \"1h\"\nstore = \"s3://backups/p\"\nkit = true\n",
            "cluster[0].snapshots.kit",
        ),
        (
            "[cluster.snapshots]\ninterval = \"1h\"\nstore = \"s3://backups/p\"\nencrypt = [\"age1nope\"]\n",
            "cluster[0].snapshots.encrypt",
        ),
        (
            "[cluster.snapshots]\ninterval = \"1h\"\nstore = \"/var/backups\"\ns3_endpoint = \"http://10.0.0.5:8333\"\n",
            "cluster[0].snapshots.s3_endpoint",
        ),
        (
            "[cluster.snapshots]\ninterval = \"1h\"\nstore = \"s3://backups/p\"\ns3_endpoint = \"10.0.0.5:8333\"\n",
            "cluster[0].snapshots.s3_endpoint",
        ),
        (
            "[cluster.snapshots]\ninterval = \"1h\"\ndir = \"/var/backups\"\ns3_region = \"eu-west-1\"\n",
            "cluster[0].snapshots.s3_region",
        ),
        (
            "[cluster.drills]\ninterval = \"1d\"\nfrom = \"s3://backups/p\"\ns3_region = \"eu west\"\n",
            "cluster[0].drills.s3_region",
        ),
        ("[cluster.drills]\ninterval = \"1d\"\n", "cluster[0].drills"),
        (
            "[cluster.drills]\ninterval = \"1d\"\nfrom = \"/var/backups\"\ns3_region = \"eu-west-1\"\n",
            "cluster[0].drills.s3_region",
        ),
        (
            "[cluster.drills]\ninterval = \"1d\"\nfrom = \"s3://backups/p\"\nidentity = [\"/nonexistent/key\"]\n",
            "cluster[0].drills.identity",
        ),
    ];
    for (extra, key) in cases {
        let path = dir.path().join("config.toml");
        std::fs::write(&path, cluster_toml("a", &tc, extra)).unwrap();
        let out = std::process::Command::new(cargo_bin("talos-opsd"))
            .arg("check-config")
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra}: accepted");
        assert!(stderr.contains(key), "{extra}: {stderr}");
        assert!(stderr.contains("config.toml:"), "{extra}: {stderr}");
    }
    // A directory is a store too: encrypted with a kit and kept by tiers,
    // and a plain `dir` kept by tiers.
    let recipient = Identity::generate().recipient().to_string();
    let key_file = dir.path().join("backup.key");
    std::fs::write(&key_file, Identity::generate().to_secret_text()).unwrap();
    for extra in [
        format!(
            "[cluster.snapshots]\ninterval = \"1h\"\nstore = \"/var/backups/a\"\n\
             encrypt = [\"{recipient}\"]\nkit = true\ndaily = 7\nweekly = 4\n\
             [cluster.drills]\ninterval = \"1d\"\nidentity = [{key_file:?}]\n"
        ),
        "[cluster.snapshots]\ninterval = \"1h\"\ndir = \"/var/backups/a\"\nhourly = 24\n".into(),
    ] {
        let path = dir.path().join("config.toml");
        std::fs::write(&path, cluster_toml("a", &tc, &extra)).unwrap();
        let out = std::process::Command::new(cargo_bin("talos-opsd"))
            .arg("check-config")
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{extra}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
