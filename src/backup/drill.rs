//! Restore drills: a backup fetched, decrypted, verified, restored into a
//! throwaway etcd on this host, and compared with its sidecar. A drill
//! never touches the cluster.
//!
//! Checks, in order (the first to fail is named in the report):
//! `sidecar` (the sidecar is ours and readable), `object` (the stored
//! bytes have the sidecar's size and sha256), `decrypt` (age, with the
//! identities given), `decompress` (zstd), `snapshot-trailer`,
//! `snapshot-sha256`, `snapshot-bbolt`, `snapshot-status` (the checks of a
//! saved snapshot), `sidecar-match` (the snapshot is the one the sidecar
//! describes), `restore` (`etcdutl snapshot restore`, or `etcdctl snapshot
//! restore` where etcdutl is missing, as on Debian's etcd 3.4), `start`
//! (etcd on free loopback ports, healthy), `revision` and `keys` (what the
//! running etcd reports equals the sidecar's revision and key count), and
//! `prefixes` (every key read back, counted per top-level prefix:
//! `/registry/<type>` for Kubernetes data).
//!
//! The decrypted snapshot and the restored data directory exist, as etcd
//! needs them, only inside a private (0700) temporary directory that is
//! removed when the drill ends.

mod etcd;

use std::collections::BTreeMap;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::snapshot::{Hex, SnapshotError, SnapshotReport, verify_file};

use super::BackupError;
use super::catalogue::read_kit;
use super::keys::Identity;
use super::metadata::{BackupMetadata, Encryption, FORMAT, sidecar_key};
use super::store::{Store, StoreError, get_all};

/// How to run a drill.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DrillOptions {
    /// Identities to decrypt with (needed for an encrypted backup).
    pub identities: Vec<Identity>,
    /// Where the private working directory is made (default: the system's
    /// temporary directory).
    pub work_dir: Option<PathBuf>,
    /// The etcd binaries' directory; by default they are looked up in
    /// `PATH`.
    pub etcd_bin_dir: Option<PathBuf>,
    /// How long etcd may take to become healthy.
    pub start_timeout: Duration,
}

impl Default for DrillOptions {
    fn default() -> Self {
        DrillOptions {
            identities: Vec::new(),
            work_dir: None,
            etcd_bin_dir: None,
            start_timeout: Duration::from_secs(60),
        }
    }
}

/// One check of a drill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DrillCheck {
    /// Its name (see the module docs).
    pub name: String,
    /// Whether it passed.
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

/// The outcome of a drill, as JSON for people and machines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DrillReport {
    /// The store ([`Store::describe`]).
    pub store: String,
    /// The backup's object key.
    pub key: String,
    /// Whether every check passed.
    pub ok: bool,
    /// The first check that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_check: Option<String>,
    /// The checks run, in order.
    pub checks: Vec<DrillCheck>,
    /// The revision of the restored etcd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// The keys of the restored etcd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<u64>,
    /// Keys per top-level prefix of the restored etcd.
    pub prefixes: BTreeMap<String, u64>,
    /// The restore tool used (`etcdutl` or `etcdctl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_tool: Option<String>,
    /// How long the drill took, in milliseconds.
    pub duration_ms: u64,
}

impl DrillReport {
    fn pass(&mut self, name: &str, detail: impl Into<String>) {
        self.checks.push(DrillCheck {
            name: name.into(),
            ok: true,
            detail: detail.into(),
        });
    }

    /// Records a failed check and ends the drill.
    fn fail(&mut self, name: &str, detail: impl Into<String>) {
        self.checks.push(DrillCheck {
            name: name.into(),
            ok: false,
            detail: detail.into(),
        });
        self.ok = false;
        self.failed_check = Some(name.into());
    }
}

/// Drills the backup whose object is `key` in `store`. Check failures are
/// in the report (`ok: false`, `failed_check`); `Err` is for a store that
/// cannot be reached or a working directory that cannot be made.
pub async fn drill(
    store: &dyn Store,
    key: &str,
    options: &DrillOptions,
) -> Result<DrillReport, BackupError> {
    let started = Instant::now();
    let mut report = DrillReport {
        store: store.describe(),
        key: key.to_owned(),
        ok: true,
        failed_check: None,
        checks: Vec::new(),
        revision: None,
        keys: None,
        prefixes: BTreeMap::new(),
        restore_tool: None,
        duration_ms: 0,
    };
    let work = WorkDir::create(options.work_dir.as_deref())?;
    run(store, key, options, &work, &mut report).await?;
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

async fn run(
    store: &dyn Store,
    key: &str,
    options: &DrillOptions,
    work: &WorkDir,
    report: &mut DrillReport,
) -> Result<(), BackupError> {
    let Some(meta) = read_sidecar(store, key, report).await? else {
        return Ok(());
    };
    let snapshot = work.path.join("snapshot.db");
    if !fetch(store, &meta, options, &snapshot, report).await? {
        return Ok(());
    }
    let Some(verified) = verify(&snapshot, &meta, report).await else {
        return Ok(());
    };
    let kit = match &meta.kit {
        None => None,
        Some(_) => match read_kit(store, &meta, &options.identities).await {
            Ok(kit) if kit.revision != meta.snapshot.status.revision => {
                report.fail(
                    "kit",
                    format!(
                        "the kit is of revision {}; the snapshot's is {}",
                        kit.revision, meta.snapshot.status.revision
                    ),
                );
                return Ok(());
            }
            Ok(kit) => {
                report.pass(
                    "kit",
                    format!(
                        "{} encryption key(s), {} member(s), {} CA fingerprint(s), {} node configuration(s)",
                        kit.encryption_secrets.len(),
                        kit.members.len(),
                        kit.ca_fingerprints.len(),
                        kit.node_configs.len()
                    ),
                );
                Some(kit)
            }
            Err(BackupError::Store(e)) => return Err(BackupError::Store(e)),
            Err(e) => {
                report.fail("kit", e.to_string());
                return Ok(());
            }
        },
    };
    let expected = etcd::Expected {
        meta: &meta,
        verified: &verified,
        kit: kit.as_ref(),
    };
    etcd::restore_and_compare(&snapshot, &work.path, expected, options, report).await;
    Ok(())
}

/// A backup fetched back: its sidecar and what verifying the snapshot
/// written out found.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Fetched {
    /// The sidecar.
    pub metadata: BackupMetadata,
    /// The verified snapshot (its report matches the sidecar's).
    pub snapshot: SnapshotReport,
}

/// Fetches the backup whose object is `key` into the new file `out` (mode
/// 0600): the object streamed through its sha256, age (with `identities`)
/// and zstd, then every check of a saved snapshot and a comparison with the
/// sidecar, as a drill does them. A check that fails is an error naming it;
/// `out` is then removed.
pub async fn fetch_snapshot(
    store: &dyn Store,
    key: &str,
    identities: &[Identity],
    out: &Path,
) -> Result<Fetched, BackupError> {
    let mut report = DrillReport {
        store: store.describe(),
        key: key.to_owned(),
        ok: true,
        failed_check: None,
        checks: Vec::new(),
        revision: None,
        keys: None,
        prefixes: BTreeMap::new(),
        restore_tool: None,
        duration_ms: 0,
    };
    let options = DrillOptions {
        identities: identities.to_vec(),
        ..DrillOptions::default()
    };
    let mut fetched = None;
    if let Some(meta) = read_sidecar(store, key, &mut report).await?
        && fetch(store, &meta, &options, out, &mut report).await?
        && let Some(snapshot) = verify(out, &meta, &mut report).await
    {
        fetched = Some(Fetched {
            metadata: meta,
            snapshot,
        });
    }
    match fetched {
        Some(fetched) if report.ok => Ok(fetched),
        _ => {
            let _ = std::fs::remove_file(out);
            let failed = report.checks.iter().find(|c| !c.ok);
            Err(BackupError::Metadata {
                key: key.to_owned(),
                problem: match failed {
                    Some(c) => format!("failed the {} check: {}", c.name, c.detail),
                    None => "could not be fetched".into(),
                },
            })
        }
    }
}

async fn read_sidecar(
    store: &dyn Store,
    key: &str,
    report: &mut DrillReport,
) -> Result<Option<BackupMetadata>, BackupError> {
    let sidecar = sidecar_key(key);
    let bytes = match get_all(store, &sidecar).await {
        Ok(bytes) => bytes,
        Err(StoreError::NotFound { .. }) => {
            report.fail("sidecar", format!("no sidecar {sidecar}"));
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    match serde_json::from_slice::<BackupMetadata>(&bytes) {
        Ok(meta) if meta.format == FORMAT && meta.object.key == key => {
            report.pass(
                "sidecar",
                format!("{sidecar}: revision {}", meta.snapshot.status.revision),
            );
            Ok(Some(meta))
        }
        Ok(_) => {
            report.fail("sidecar", format!("{sidecar} does not describe {key}"));
            Ok(None)
        }
        Err(e) => {
            report.fail("sidecar", format!("{sidecar}: {e}"));
            Ok(None)
        }
    }
}

/// Streams the object through sha256, age and zstd into `out`; records the
/// `object`, `decrypt` and `decompress` checks. Returns whether all passed.
async fn fetch(
    store: &dyn Store,
    meta: &BackupMetadata,
    options: &DrillOptions,
    out: &Path,
    report: &mut DrillReport,
) -> Result<bool, BackupError> {
    let mut stream = store.get(&meta.object.key).await?;
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let identities = options.identities.clone();
    let encrypted = matches!(meta.object.encryption, Encryption::Age { .. });
    let out = out.to_owned();
    let unpack = tokio::task::spawn_blocking(move || unpack(rx, encrypted, &identities, &out));
    let mut read_error = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(bytes) => {
                if tx.send(bytes).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                read_error = Some(e);
                break;
            }
        }
    }
    drop(tx);
    let unpacked = unpack.await.map_err(|e| BackupError::Pipeline {
        stage: "drill",
        source: io::Error::other(e),
    })?;
    if let Some(e) = read_error {
        return Err(e.into());
    }
    let (size, sha256) = (unpacked.size, unpacked.sha256.clone());
    if size != meta.object.size || sha256 != meta.object.sha256 {
        report.fail(
            "object",
            format!(
                "{} bytes with sha256 {sha256}; the sidecar says {} bytes with sha256 {}",
                size, meta.object.size, meta.object.sha256
            ),
        );
        return Ok(false);
    }
    report.pass("object", format!("{size} bytes, sha256 {sha256}"));
    match unpacked.failure {
        Some((stage, detail)) => {
            if stage == "decompress" && encrypted {
                report.pass("decrypt", "age");
            }
            report.fail(stage, detail);
            Ok(false)
        }
        None => {
            if encrypted {
                report.pass("decrypt", "age");
            }
            report.pass("decompress", format!("zstd, {} bytes", unpacked.plain));
            Ok(true)
        }
    }
}

struct Unpacked {
    size: u64,
    sha256: String,
    plain: u64,
    failure: Option<(&'static str, String)>,
}

/// The blocking half of [`fetch`]: every byte received is hashed, even
/// after a failure, so a changed object is reported as such.
fn unpack(
    rx: mpsc::Receiver<Bytes>,
    encrypted: bool,
    identities: &[Identity],
    out: &Path,
) -> Unpacked {
    let mut reader = ChannelReader {
        rx,
        current: Bytes::new(),
        hasher: Sha256::new(),
        size: 0,
    };
    let mut plain = 0;
    let failure = unpack_into(&mut reader, encrypted, identities, out, &mut plain).err();
    let mut sink = [0u8; 64 * 1024];
    while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
    Unpacked {
        size: reader.size,
        sha256: Hex(&reader.hasher.finalize()).to_string(),
        plain,
        failure,
    }
}

fn unpack_into(
    reader: &mut ChannelReader,
    encrypted: bool,
    identities: &[Identity],
    out: &Path,
    plain: &mut u64,
) -> Result<(), (&'static str, String)> {
    let decrypted: Box<dyn Read + '_> = if encrypted {
        if identities.is_empty() {
            return Err((
                "decrypt",
                "the backup is encrypted and no identity was given".into(),
            ));
        }
        let decryptor = age::Decryptor::new_buffered(BufReader::new(&mut *reader))
            .map_err(|e| ("decrypt", e.to_string()))?;
        let stream = decryptor
            .decrypt(identities.iter().map(|i| &i.0 as &dyn age::Identity))
            .map_err(|e| ("decrypt", e.to_string()))?;
        Box::new(stream)
    } else {
        Box::new(&mut *reader)
    };
    let mut decoder =
        zstd::stream::read::Decoder::new(decrypted).map_err(|e| ("decompress", e.to_string()))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .map_err(|e| ("decompress", format!("{}: {e}", out.display())))?;
    // age reports a changed payload as an I/O error of kind InvalidData
    // while reading: that is the decrypt check.
    *plain = io::copy(&mut decoder, &mut file).map_err(|e| {
        let stage = if encrypted && is_age_error(&e) {
            "decrypt"
        } else {
            "decompress"
        };
        (stage, e.to_string())
    })?;
    file.sync_all().map_err(|e| ("decompress", e.to_string()))
}

fn is_age_error(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::InvalidData
        && !e
            .to_string()
            .to_ascii_lowercase()
            .contains("unknown frame descriptor")
        && !e.to_string().to_ascii_lowercase().contains("zstd")
}

/// The bytes of a channel as a reader, hashed as they are read.
struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
    hasher: Sha256,
    size: u64,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(bytes) => self.current = bytes,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        self.current.advance(n);
        Ok(n)
    }
}

/// The checks of a saved snapshot, then `sidecar-match`.
async fn verify(
    path: &Path,
    meta: &BackupMetadata,
    report: &mut DrillReport,
) -> Option<SnapshotReport> {
    let owned = path.to_owned();
    let verified = tokio::task::spawn_blocking(move || verify_file(&owned))
        .await
        .unwrap_or_else(|e| {
            Err(SnapshotError::Io {
                path: path.to_owned(),
                source: io::Error::other(e),
            })
        });
    let verified = match verified {
        Ok(verified) => verified,
        Err(SnapshotError::Check { failure, .. }) => {
            report.fail(
                &format!("snapshot-{}", failure.check()),
                failure.to_string(),
            );
            return None;
        }
        Err(e) => {
            report.fail("snapshot-read", e.to_string());
            return None;
        }
    };
    report.pass(
        "snapshot",
        format!(
            "trailer, sha256, bbolt and status: revision {}",
            verified.status.revision
        ),
    );
    if verified != meta.snapshot {
        report.fail(
            "sidecar-match",
            format!(
                "the snapshot has sha256 {} and revision {}; the sidecar says {} and {}",
                verified.sha256,
                verified.status.revision,
                meta.snapshot.sha256,
                meta.snapshot.status.revision
            ),
        );
        return None;
    }
    report.pass("sidecar-match", "size, sha256, hash, revision and keys");
    Some(verified)
}

/// A private working directory, removed on drop.
struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    fn create(base: Option<&Path>) -> Result<WorkDir, BackupError> {
        let base = base.map(Path::to_owned).unwrap_or_else(std::env::temp_dir);
        let mut random = [0u8; 8];
        random.copy_from_slice(
            &Sha256::digest(format!("{:?}{}", Instant::now(), std::process::id()))[..8],
        );
        let path = base.join(format!("talos-drill-{}", Hex(&random)));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| BackupError::Io {
                path: path.clone(),
                source,
            })?;
        Ok(WorkDir { path })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
