//! The streamed backup: etcd's snapshot stream -> checks -> zstd -> age ->
//! multipart upload, in one pass with flat memory.
//!
//! One blocking thread takes the stream in batches and feeds each batch
//! to two places: the encrypted [spool](super::spool) (with the sha256 of
//! everything but the trailer), and the zstd encoder, whose output goes
//! through age into batches that an async task uploads as multipart parts.
//! When the stream ends the spool holds the whole snapshot, sealed; the
//! same checks as [`snapshot::save`](crate::snapshot::save) run over it
//! (trailer, sha256, bbolt consistency, status). Only then is the upload
//! completed; a failed check, a failed transfer or any error aborts it, so
//! nothing appears under the final key. The kit and the sidecar follow.

use std::io::{self, Write};
use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use tokio::sync::mpsc;

use crate::snapshot::bbolt::Db;
use crate::snapshot::{
    CheckFailure, Hex, SnapshotReport, TRAILER_SIZE, compare_trailer, has_trailer, report,
};

use super::BackupError;
use super::keys::{Recipient, encryptor};
use super::metadata::{
    BackupMetadata, Encryption, FORMAT, KIT_SUFFIX, RecoveryKit, StoredObject, sidecar_key,
};
use super::spool::Spool;
use super::store::{Store, Upload};

/// Plaintext batches handed to the worker: at least this large.
const BATCH_MIN: usize = 64 * 1024;
/// Stored bytes handed to the upload: this large (the last may be less).
const OUT_BATCH: usize = 1 << 20;

/// What to store and how.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BackupRequest {
    /// The cluster's name: the first segment of the key, and in the
    /// sidecar.
    pub cluster: String,
    /// age recipients; empty stores the snapshot unencrypted (compressed).
    pub recipients: Vec<Recipient>,
    /// A recovery kit to store beside it (needs recipients).
    pub kit: Option<RecoveryKit>,
    /// zstd level (1-19); 3 by default.
    pub zstd_level: i32,
    /// Where the encrypted spool lives while the snapshot is checked
    /// (default: the system's temporary directory).
    pub spool_dir: Option<PathBuf>,
    /// The object key; by default `CLUSTER/YYYYMMDDTHHMMSS.mmmZ-NODE.db.zst`
    /// (plus `.age` when encrypted).
    pub key: Option<String>,
    /// The node's Talos version, for the sidecar.
    pub talos_version: Option<String>,
    /// The node's etcd version, for the sidecar.
    pub etcd_version: Option<String>,
}

impl BackupRequest {
    /// A request for `cluster` with the defaults: no encryption, no kit,
    /// zstd level 3.
    pub fn new(cluster: impl Into<String>) -> BackupRequest {
        BackupRequest {
            cluster: cluster.into(),
            recipients: Vec::new(),
            kit: None,
            zstd_level: 3,
            spool_dir: None,
            key: None,
            talos_version: None,
            etcd_version: None,
        }
    }

    fn default_key(&self, node: &str, time: OffsetDateTime) -> String {
        let clean = |s: &str| -> String {
            s.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                        c
                    } else {
                        '_'
                    }
                })
                .collect()
        };
        // To the millisecond: two backups of one node within a second
        // must not share a key (the second would replace the first).
        let stamp = format!(
            "{:04}{:02}{:02}T{:02}{:02}{:02}.{:03}Z",
            time.year(),
            u8::from(time.month()),
            time.day(),
            time.hour(),
            time.minute(),
            time.second(),
            time.millisecond()
        );
        let age = if self.recipients.is_empty() {
            ""
        } else {
            ".age"
        };
        format!(
            "{}/{stamp}-{}.db.zst{age}",
            clean(&self.cluster),
            clean(node)
        )
    }
}

/// A backup that was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredBackup {
    /// Its sidecar, as stored at [`BackupMetadata::sidecar_key`].
    pub metadata: BackupMetadata,
}

/// Backs up the snapshot `stream` (from
/// [`Client::etcd_snapshot`](crate::Client::etcd_snapshot)) to `store`.
pub async fn backup(
    store: &dyn Store,
    stream: crate::client::ByteStream,
    request: &BackupRequest,
) -> Result<StoredBackup, BackupError> {
    let node = stream.node().to_string();
    backup_chunks(store, stream, &node, request).await
}

/// Backs up any stream of snapshot chunks, recording `node` as its source.
pub async fn backup_chunks<S>(
    store: &dyn Store,
    chunks: S,
    node: &str,
    request: &BackupRequest,
) -> Result<StoredBackup, BackupError>
where
    S: Stream<Item = Result<Bytes, crate::client::Error>> + Unpin,
{
    if request.kit.is_some() && request.recipients.is_empty() {
        return Err(BackupError::KitNeedsRecipients);
    }
    let time = OffsetDateTime::now_utc();
    let key = request
        .key
        .clone()
        .unwrap_or_else(|| request.default_key(node, time));
    let spool_dir = request.spool_dir.clone().unwrap_or_else(std::env::temp_dir);
    let spool = Spool::create(&spool_dir).map_err(|source| BackupError::Io {
        path: spool_dir.clone(),
        source,
    })?;
    let sealer = match request.recipients.is_empty() {
        true => None,
        false => Some(encryptor(&request.recipients)?),
    };

    let mut upload = store.start_upload(&key).await?;
    let outcome = stream_through(upload.as_mut(), chunks, spool, sealer, request.zstd_level).await;
    let (worked, stored) = match outcome {
        Ok(done) => done,
        Err(error) => {
            let _ = upload.abort().await;
            return Err(error);
        }
    };
    let checked = tokio::task::spawn_blocking(move || check_spool(worked))
        .await
        .map_err(|e| BackupError::Pipeline {
            stage: "check",
            source: io::Error::other(e),
        })?;
    let snapshot = match checked {
        Ok(snapshot) => snapshot,
        Err(failure) => {
            upload.abort().await?;
            return Err(BackupError::Check {
                key,
                failure: Box::new(failure),
            });
        }
    };
    upload.complete().await?;

    let encryption = match request.recipients.is_empty() {
        true => Encryption::None,
        false => Encryption::Age {
            recipients: request.recipients.iter().map(|r| r.to_string()).collect(),
        },
    };
    let kit = match &request.kit {
        Some(kit) => Some(store_kit(store, &key, kit, &snapshot, request, &encryption).await?),
        None => None,
    };
    let metadata = BackupMetadata {
        format: FORMAT.to_owned(),
        cluster: request.cluster.clone(),
        node: node.to_owned(),
        time,
        snapshot,
        object: StoredObject {
            key: key.clone(),
            size: stored.size,
            sha256: stored.sha256,
            compression: "zstd".into(),
            encryption,
        },
        kit,
        talos_version: request.talos_version.clone(),
        etcd_version: request.etcd_version.clone(),
        tool_version: env!("CARGO_PKG_VERSION").to_owned(),
    };
    let mut json = serde_json::to_vec_pretty(&metadata).map_err(|e| BackupError::Pipeline {
        stage: "sidecar",
        source: io::Error::other(e),
    })?;
    json.push(b'\n');
    store.put(&sidecar_key(&key), json.into()).await?;
    Ok(StoredBackup { metadata })
}

/// Encrypts the kit (with the snapshot's revision) to the recipients and
/// stores it at `KEY.kit.age`.
async fn store_kit(
    store: &dyn Store,
    key: &str,
    kit: &RecoveryKit,
    snapshot: &SnapshotReport,
    request: &BackupRequest,
    encryption: &Encryption,
) -> Result<StoredObject, BackupError> {
    let mut kit = kit.clone();
    kit.revision = snapshot.status.revision;
    let json = serde_json::to_vec(&kit).map_err(|e| BackupError::Pipeline {
        stage: "kit",
        source: io::Error::other(e),
    })?;
    let mut sealed = Vec::new();
    encryptor(&request.recipients)?
        .wrap_output(&mut sealed)
        .and_then(|mut w| w.write_all(&json).map(|()| w))
        .and_then(|w| w.finish())
        .map_err(|source| BackupError::Pipeline {
            stage: "kit encryption",
            source,
        })?;
    let kit_key = format!("{key}{KIT_SUFFIX}");
    let object = StoredObject {
        key: kit_key.clone(),
        size: sealed.len() as u64,
        sha256: Hex(&Sha256::digest(&sealed)).to_string(),
        compression: "none".into(),
        encryption: encryption.clone(),
    };
    store.put(&kit_key, sealed.into()).await?;
    Ok(object)
}

/// What the worker leaves: the spool, the size and the sha256 of all but
/// the last 32 bytes, and those bytes.
struct Worked {
    spool: Spool,
    digest: [u8; 32],
    trailer: [u8; 32],
    trailer_len: usize,
}

/// Size and sha256 of the stored object.
struct Stored {
    size: u64,
    sha256: String,
}

/// Moves the stream through the worker thread and the stored bytes into
/// `upload`. Errors leave the upload to the caller (to abort).
async fn stream_through<S>(
    upload: &mut dyn Upload,
    mut chunks: S,
    spool: Spool,
    sealer: Option<age::Encryptor>,
    level: i32,
) -> Result<(Worked, Stored), BackupError>
where
    S: Stream<Item = Result<Bytes, crate::client::Error>> + Unpin,
{
    let (plain_tx, plain_rx) = mpsc::channel::<Bytes>(2);
    let (out_tx, mut out_rx) = mpsc::channel::<Bytes>(2);
    let worker = tokio::task::spawn_blocking(move || work(plain_rx, out_tx, spool, sealer, level));

    // Reading the stream and uploading go on together; the upload gets
    // what the worker produced.
    // Owns the sender: the worker sees the end when the feed is done.
    let feed = async move {
        let mut gathered = BytesMut::new();
        while let Some(item) = chunks.next().await {
            let chunk = item.map_err(|e| BackupError::Transfer {
                source: Box::new(e),
            })?;
            let batch = if gathered.is_empty() && chunk.len() >= BATCH_MIN {
                chunk
            } else {
                gathered.extend_from_slice(&chunk);
                if gathered.len() < BATCH_MIN {
                    continue;
                }
                gathered.split().freeze()
            };
            if plain_tx.send(batch).await.is_err() {
                return Ok::<(), BackupError>(()); // the worker stopped: its error is reported
            }
        }
        if !gathered.is_empty() {
            let _ = plain_tx.send(gathered.freeze()).await;
        }
        Ok(())
    };
    let drain = async {
        while let Some(bytes) = out_rx.recv().await {
            upload.write(bytes).await?;
        }
        Ok::<(), BackupError>(())
    };
    let (fed, drained) = futures::join!(feed, drain);
    let worked = worker.await.map_err(|e| BackupError::Pipeline {
        stage: "worker",
        source: io::Error::other(e),
    });
    fed?;
    drained?;
    worked?
}

/// The worker thread: spool and hash every batch, compress and seal it.
fn work(
    mut plain_rx: mpsc::Receiver<Bytes>,
    out_tx: mpsc::Sender<Bytes>,
    mut spool: Spool,
    sealer: Option<age::Encryptor>,
    level: i32,
) -> Result<(Worked, Stored), BackupError> {
    let failed =
        |stage: &'static str| move |source: io::Error| BackupError::Pipeline { stage, source };
    let sink = ObjectSink {
        buf: Vec::with_capacity(OUT_BATCH),
        tx: out_tx,
        hasher: Sha256::new(),
        size: 0,
    };
    let sealed = match sealer {
        Some(encryptor) => Sealed::Age(encryptor.wrap_output(sink).map_err(failed("age"))?),
        None => Sealed::Plain(sink),
    };
    let mut encoder = zstd::stream::write::Encoder::new(sealed, level).map_err(failed("zstd"))?;
    let mut tail = TailHasher::default();
    while let Some(batch) = plain_rx.blocking_recv() {
        tail.update(&batch);
        spool.write(&batch).map_err(failed("spool"))?;
        encoder.write_all(&batch).map_err(failed("zstd"))?;
    }
    spool.finish().map_err(failed("spool"))?;
    let sealed = encoder.finish().map_err(failed("zstd"))?;
    let mut sink = sealed.finish().map_err(failed("age"))?;
    sink.send().map_err(failed("upload"))?;
    let (digest, trailer, trailer_len) = tail.finish();
    Ok((
        Worked {
            spool,
            digest,
            trailer,
            trailer_len,
        },
        Stored {
            size: sink.size,
            sha256: Hex(&sink.hasher.finalize()).to_string(),
        },
    ))
}

/// The checks of [`snapshot::save`](crate::snapshot::save), over the spool.
fn check_spool(worked: Worked) -> Result<SnapshotReport, CheckFailure> {
    let size = worked.spool.len();
    if !has_trailer(size) || worked.trailer_len < 32 {
        return Err(CheckFailure::MissingTrailer { size });
    }
    compare_trailer(&worked.digest, &worked.trailer)?;
    let db = Db::from_reader(Box::new(worked.spool), size - TRAILER_SIZE)
        .map_err(CheckFailure::Bbolt)?;
    let status = crate::snapshot::status::checked_status(&db)?;
    Ok(report(size, &worked.digest, &status))
}

/// sha256 of everything but the last 32 bytes seen, and those bytes.
#[derive(Default)]
struct TailHasher {
    hasher: Sha256,
    lag: Vec<u8>,
}

impl TailHasher {
    fn update(&mut self, data: &[u8]) {
        self.lag.extend_from_slice(data);
        if self.lag.len() > 32 {
            let cut = self.lag.len() - 32;
            self.hasher.update(&self.lag[..cut]);
            self.lag.drain(..cut);
        }
    }

    fn finish(self) -> ([u8; 32], [u8; 32], usize) {
        let mut trailer = [0u8; 32];
        trailer[..self.lag.len()].copy_from_slice(&self.lag);
        (self.hasher.finalize().into(), trailer, self.lag.len())
    }
}

/// The object's bytes, hashed and handed to the upload in batches.
struct ObjectSink {
    buf: Vec<u8>,
    tx: mpsc::Sender<Bytes>,
    hasher: Sha256,
    size: u64,
}

impl ObjectSink {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(&mut self.buf, Vec::with_capacity(OUT_BATCH));
        self.tx
            .blocking_send(Bytes::from(batch))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the upload stopped"))
    }
}

impl Write for ObjectSink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.hasher.update(data);
        self.size += data.len() as u64;
        self.buf.extend_from_slice(data);
        if self.buf.len() >= OUT_BATCH {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The compressed stream, age-encrypted or not.
enum Sealed {
    Age(age::stream::StreamWriter<ObjectSink>),
    Plain(ObjectSink),
}

impl Sealed {
    fn finish(self) -> io::Result<ObjectSink> {
        match self {
            Sealed::Age(writer) => writer.finish(),
            Sealed::Plain(sink) => Ok(sink),
        }
    }
}

impl Write for Sealed {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match self {
            Sealed::Age(w) => w.write(data),
            Sealed::Plain(w) => w.write(data),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sealed::Age(w) => w.flush(),
            Sealed::Plain(w) => w.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_hasher_keeps_the_last_32_bytes_out() {
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        for split in [1usize, 31, 32, 33, 1000, 3000] {
            let mut tail = TailHasher::default();
            for piece in data.chunks(split) {
                tail.update(piece);
            }
            let (digest, trailer, n) = tail.finish();
            assert_eq!(n, 32);
            assert_eq!(&trailer[..], &data[data.len() - 32..]);
            let expected: [u8; 32] = Sha256::digest(&data[..data.len() - 32]).into();
            assert_eq!(digest, expected, "split {split}");
        }
    }

    #[test]
    fn default_keys_sort_by_time_and_are_safe() {
        let mut request = BackupRequest::new("prod/a");
        let time = time::macros::datetime!(2026-03-04 05:06:07 UTC);
        assert_eq!(
            request.default_key("10.5.0.2:50000", time),
            "prod_a/20260304T050607.000Z-10.5.0.2_50000.db.zst"
        );
        request
            .recipients
            .push(super::super::Identity::generate().recipient());
        assert!(request.default_key("n", time).ends_with(".db.zst.age"));
    }
}
