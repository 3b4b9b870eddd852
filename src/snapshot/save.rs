//! Saving a streamed snapshot: `PATH.part`, checks, rename, sidecar.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use tokio::sync::mpsc;

use super::direct::{self, Aligned, BulkSums, Layout};
use super::{
    CheckFailure, SnapshotError, SnapshotReport, TRAILER_SIZE, check_database, compare_trailer,
    has_trailer, report, split_io,
};

/// Size of each write buffer; two are in use (one filling, one writing).
/// The smallest write the writer thread gets (but the last): few hand-offs
/// between threads, few system calls.
const BATCH_MIN: usize = 64 * 1024;

/// A snapshot [`save`] kept.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SavedSnapshot {
    /// What it contains.
    pub report: SnapshotReport,
    /// Where it is.
    pub path: PathBuf,
    /// The JSON sidecar (`PATH.json`), a [`SnapshotMetadata`].
    pub sidecar: PathBuf,
    /// When it was saved.
    pub time: OffsetDateTime,
}

/// The JSON sidecar written next to a saved snapshot (`PATH.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SnapshotMetadata {
    /// The node the snapshot was taken from.
    pub node: String,
    /// When it was saved (RFC 3339, UTC).
    #[serde(with = "time::serde::rfc3339")]
    pub time: OffsetDateTime,
    /// What the snapshot contains.
    #[serde(flatten)]
    pub report: SnapshotReport,
}

/// Starts saving the snapshot `stream` (from
/// [`Client::etcd_snapshot`](crate::Client::etcd_snapshot)); the node is the
/// one the stream comes from. Finish with [`Save::to`]:
///
/// ```no_run
/// # async fn run(client: talos_client::Client<talos_client::One>) -> Result<(), Box<dyn std::error::Error>> {
/// let stream = client.etcd_snapshot().await?;
/// let saved = talos_client::snapshot::save(stream)
///     .progress(|bytes| eprintln!("{bytes} bytes"))
///     .to(std::path::Path::new("etcd.db"))
///     .await?;
/// println!("revision {}", saved.report.status.revision);
/// # Ok(()) }
/// ```
pub fn save(stream: crate::client::ByteStream) -> Save<crate::client::ByteStream> {
    let node = stream.node().to_string();
    Save::from_chunks(stream, node)
}

/// A snapshot save being set up: see [`save`] and [`Save::to`].
#[must_use = "a Save does nothing until `.to(path)` is awaited"]
pub struct Save<S> {
    chunks: S,
    node: String,
    progress: Option<Box<dyn FnMut(u64) + Send>>,
}

impl<S> Save<S>
where
    S: Stream<Item = Result<Bytes, crate::client::Error>> + Unpin,
{
    /// Saves any stream of snapshot chunks, recording `node` as its source.
    pub fn from_chunks(chunks: S, node: impl Into<String>) -> Self {
        Save {
            chunks,
            node: node.into(),
            progress: None,
        }
    }

    /// Calls `progress` with the byte count received so far after every
    /// chunk.
    pub fn progress(mut self, progress: impl FnMut(u64) + Send + 'static) -> Self {
        self.progress = Some(Box::new(progress));
        self
    }

    /// Saves the stream at `path`, verified.
    ///
    /// The chunks go to `PATH.part` (mode 0600) through large buffers written on
    /// a blocking thread, which also computes the sha256 of everything but the
    /// last 32 bytes.
    /// Then: fsync, trailer check, sha256 check, bbolt check, status; only when
    /// all pass is `PATH.part` renamed to `PATH` (replacing an older snapshot),
    /// the directory synced and `PATH.json` written atomically.
    ///
    /// - A failed transfer removes `PATH.part` and returns
    ///   [`SnapshotError::Transfer`]: nothing is left behind.
    /// - A failed check renames `PATH.part` to `PATH.corrupt` (replacing an
    ///   older one) and returns [`SnapshotError::Check`] naming the check and the
    ///   corrupt copy.
    ///
    /// Either way an existing `PATH` is untouched. Dropping the future removes
    /// `PATH.part`.
    pub async fn to(mut self, path: &Path) -> Result<SavedSnapshot, SnapshotError> {
        let mut progress = self.progress.take();
        let mut report = |n: u64| {
            if let Some(p) = progress.as_mut() {
                p(n)
            }
        };
        save_chunks(self.chunks, path, &self.node, &mut report).await
    }
}

async fn save_chunks<S>(
    mut chunks: S,
    path: &Path,
    node: &str,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<SavedSnapshot, SnapshotError>
where
    S: Stream<Item = Result<Bytes, crate::client::Error>> + Unpin,
{
    let part = with_suffix(path, ".part");
    let (file, direct) = blocking(&part, {
        let part = part.clone();
        move || {
            let file = create_private(&part)?;
            Ok((file, direct::open(&part, true)))
        }
    })
    .await?;
    let mut guard = PartGuard(Some(part.clone()));

    // The writer thread takes batches of at least `BATCH_MIN` bytes: the
    // stream's own when they are that large (no copy), small chunks
    // gathered into one otherwise. Two in flight at most: memory stays flat.
    let (full_tx, mut full_rx) = mpsc::channel::<Bytes>(1);
    let abort = Arc::new(AtomicBool::new(false));
    let writer = tokio::task::spawn_blocking({
        let abort = abort.clone();
        move || -> io::Result<Sink> {
            let mut sink = Sink::new(file, direct);
            while let Some(batch) = full_rx.blocking_recv() {
                sink.write(&batch)?;
            }
            if !abort.load(Ordering::Relaxed) {
                sink.finish()?;
            }
            Ok(sink)
        }
    });

    let mut gathered = BytesMut::new();
    let mut received = 0u64;
    let mut transfer_error = None;
    while let Some(item) = chunks.next().await {
        let chunk = match item {
            Ok(chunk) => chunk,
            Err(e) => {
                transfer_error = Some(e);
                break;
            }
        };
        received += chunk.len() as u64;
        let batch = if gathered.is_empty() && chunk.len() >= BATCH_MIN {
            chunk
        } else {
            gathered.extend_from_slice(&chunk);
            if gathered.len() < BATCH_MIN {
                progress(received);
                continue;
            }
            gathered.split().freeze()
        };
        // A closed channel means the writer failed: its error is collected
        // below.
        if full_tx.send(batch).await.is_err() {
            gathered.clear();
            break;
        }
        progress(received);
    }
    if transfer_error.is_some() {
        abort.store(true, Ordering::Relaxed);
    } else if !gathered.is_empty() {
        let _ = full_tx.send(gathered.freeze()).await;
    }
    drop(full_tx);
    let written = writer.await.map_err(|e| SnapshotError::Io {
        path: part.clone(),
        source: io::Error::other(e),
    });
    if let Some(source) = transfer_error {
        remove(&mut guard).await;
        return Err(SnapshotError::Transfer {
            source: Box::new(source),
        });
    }
    let sink = match written? {
        Ok(sink) => sink,
        Err(source) => {
            remove(&mut guard).await;
            return Err(SnapshotError::Io { path: part, source });
        }
    };

    let size = sink.written;
    let checked = blocking(&part, {
        let part = part.clone();
        move || Ok(verify_part(sink, &part))
    })
    .await?;
    let (digest, status) = match checked.map_err(|failure| split_io(failure, &part)) {
        Ok(ok) => ok,
        Err(Err(io)) => {
            remove(&mut guard).await;
            return Err(io);
        }
        Err(Ok(failure)) => {
            let corrupt = with_suffix(path, ".corrupt");
            let (from, to) = (part.clone(), corrupt.clone());
            blocking(&corrupt, move || fs::rename(&from, &to)).await?;
            guard.0 = None;
            return Err(SnapshotError::Check {
                path: path.to_owned(),
                corrupt_copy: Some(corrupt),
                failure: Box::new(failure),
            });
        }
    };

    let report = report(size, &digest, &status);
    let time = OffsetDateTime::now_utc();
    let metadata = SnapshotMetadata {
        node: node.to_owned(),
        time,
        report: report.clone(),
    };
    let sidecar = with_suffix(path, ".json");
    let (from, to, json) = (part.clone(), path.to_owned(), sidecar.clone());
    blocking(path, move || {
        fs::rename(&from, &to)?;
        crate::atomic::sync_parent(&to)?;
        write_sidecar(&json, &metadata)
    })
    .await?;
    guard.0 = None;
    Ok(SavedSnapshot {
        report,
        path: path.to_owned(),
        sidecar,
        time,
    })
}

/// Size of the staging buffer for bulk bytes written direct: one 1 MiB
/// value's continuation.
const STAGE: usize = 1 << 20;

/// The bytes written so far, with the sha256 of all but the last 32 of them.
struct Sink {
    file: File,
    hasher: Sha256,
    /// The last bytes seen (up to 32), not yet hashed: the trailer at the end.
    lag: [u8; 32],
    lag_len: usize,
    written: u64,
    /// Where the bulk is (see [`direct`]).
    layout: Layout,
    /// The file opened for direct I/O, while the file system takes it.
    direct: Option<File>,
    /// Bulk bytes waiting to be written direct, from file offset `staged_at`.
    stage: Aligned,
    staged: usize,
    staged_at: u64,
    /// Bytes written direct.
    direct_written: u64,
    /// The CRC-32C of each bulk range, for the check.
    sums: BulkSums,
}

impl Sink {
    fn new(file: File, direct: Option<File>) -> Sink {
        Sink {
            file,
            hasher: Sha256::new(),
            lag: [0; 32],
            lag_len: 0,
            written: 0,
            layout: Layout::default(),
            stage: Aligned::new(if direct.is_some() { STAGE } else { 0 }),
            direct,
            staged: 0,
            staged_at: 0,
            direct_written: 0,
            sums: BulkSums::default(),
        }
    }

    fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.place(data)?;
        self.written += data.len() as u64;
        if data.len() >= 32 {
            let cut = data.len() - 32;
            self.hasher.update(&self.lag[..self.lag_len]);
            self.hasher.update(&data[..cut]);
            self.lag.copy_from_slice(&data[cut..]);
            self.lag_len = 32;
        } else {
            let mut joined = [0u8; 64];
            let total = self.lag_len + data.len();
            joined[..self.lag_len].copy_from_slice(&self.lag[..self.lag_len]);
            joined[self.lag_len..total].copy_from_slice(data);
            let keep = total.min(32);
            self.hasher.update(&joined[..total - keep]);
            self.lag[..keep].copy_from_slice(&joined[total - keep..total]);
            self.lag_len = keep;
        }
        Ok(())
    }

    /// Writes `data` (the next bytes of the stream) at its offset: bulk
    /// through the stage, the rest through the page cache; takes the sums
    /// of the bulk.
    fn place(&mut self, mut data: &[u8]) -> io::Result<()> {
        let mut at = self.written;
        // Consecutive pages that are not bulk (all of them without direct
        // I/O) go out in one write.
        let mut plain = 0;
        while plain < data.len() {
            let (len, bulk) = self.layout.next_segment(&data[plain..], &mut self.sums);
            if bulk {
                self.sums.note(at + plain as u64, &data[plain..plain + len]);
            }
            if !bulk || self.direct.is_none() {
                plain += len;
                continue;
            }
            self.file.write_all_at(&data[..plain], at)?;
            at += plain as u64;
            self.stage_bulk(&data[plain..plain + len], at)?;
            at += len as u64;
            data = &data[plain + len..];
            plain = 0;
        }
        self.file.write_all_at(data, at)
    }

    fn stage_bulk(&mut self, mut data: &[u8], mut at: u64) -> io::Result<()> {
        while !data.is_empty() {
            if self.staged > 0 && self.staged_at + self.staged as u64 != at {
                self.flush()?;
            }
            if self.staged == 0 {
                self.staged_at = at;
            }
            let stage = self.stage.as_mut_slice();
            let n = data.len().min(stage.len() - self.staged);
            stage[self.staged..self.staged + n].copy_from_slice(&data[..n]);
            self.staged += n;
            if self.staged == stage.len() {
                self.flush()?;
            }
            at += n as u64;
            data = &data[n..];
        }
        Ok(())
    }

    /// Writes what is staged (direct, or through the page cache once the
    /// file system has refused direct I/O).
    fn flush(&mut self) -> io::Result<()> {
        let data = &self.stage.as_mut_slice()[..self.staged];
        match &self.direct {
            Some(direct) => match direct::write_staged(direct, &self.file, data, self.staged_at)? {
                Some(n) => self.direct_written += n as u64,
                None => self.direct = None,
            },
            None => self.file.write_all_at(data, self.staged_at)?,
        }
        self.staged = 0;
        Ok(())
    }

    /// Writes what is staged and makes the file durable.
    fn finish(&mut self) -> io::Result<()> {
        self.flush()?;
        self.file.sync_all()
    }
}

/// The checks on the finished `.part` file: trailer, sha256, bbolt, status.
fn verify_part(sink: Sink, part: &Path) -> Result<([u8; 32], super::Status), CheckFailure> {
    let size = sink.written;
    if !has_trailer(size) {
        return Err(CheckFailure::MissingTrailer { size });
    }
    let digest: [u8; 32] = sink.hasher.finalize().into();
    compare_trailer(&digest, &sink.lag)?;
    // The writer's handle is write-only; open it again for reading.
    let file = File::open(part).map_err(|source| {
        CheckFailure::Bbolt(super::BboltError::Open {
            path: part.to_owned(),
            source,
        })
    })?;
    // Bulk written direct and not covered by a sum is read back direct: it
    // is not in the page cache.
    let direct = (sink.direct_written > 0)
        .then(|| direct::open(part, false))
        .flatten();
    let status = check_database(file, direct, sink.sums, size - TRAILER_SIZE)?;
    Ok((digest, status))
}

/// Removes `PATH.part` when a save fails or is abandoned.
struct PartGuard(Option<PathBuf>);

impl Drop for PartGuard {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = fs::remove_file(path);
        }
    }
}

async fn remove(guard: &mut PartGuard) {
    if let Some(path) = guard.0.take() {
        let _ = tokio::fs::remove_file(path).await;
    }
}

/// Runs blocking file work off the runtime; errors name `path`.
async fn blocking<T, F>(path: &Path, f: F) -> Result<T, SnapshotError>
where
    F: FnOnce() -> io::Result<T> + Send + 'static,
    T: Send + 'static,
{
    let io_error = |source| SnapshotError::Io {
        path: path.to_owned(),
        source,
    };
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io_error(io::Error::other(e)))?
        .map_err(io_error)
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

/// Creates (or truncates) a file readable and writable by the owner only.
fn create_private(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // A file left by an earlier run keeps its mode: set it.
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

/// Writes the sidecar through the one atomic writer (0600, fsync, rename,
/// directory fsync).
fn write_sidecar(path: &Path, metadata: &SnapshotMetadata) -> io::Result<()> {
    let mut json = serde_json::to_vec_pretty(metadata).map_err(io::Error::other)?;
    json.push(b'\n');
    crate::atomic::write_atomic(path, &json)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::ops::Range;

    #[test]
    fn sink_hashes_all_but_the_last_32_bytes() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        let dir = tempfile_dir("sink");
        // Odd split sizes, including ones below 32 bytes.
        for splits in [
            &[1usize, 31, 2, 33, 100][..],
            &[5000],
            &[10, 10, 10, 10],
            &[4968, 1],
        ] {
            let mut sink = Sink::new(File::create(dir.join("x")).unwrap(), None);
            feed(&mut sink, &data, splits);
            let cut = data.len() - 32;
            assert_eq!(sink.lag_len, 32);
            assert_eq!(&sink.lag[..], &data[cut..]);
            let digest: [u8; 32] = sink.hasher.finalize().into();
            let expected: [u8; 32] = Sha256::digest(&data[..cut]).into();
            assert_eq!(digest, expected, "splits {splits:?}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A stream shaped like a snapshot whose pages 2..=42 are one branch
    /// run (40 overflow pages, the first 39 of them bulk) and 60..=63 a
    /// short leaf run, with a trailer that ends the stream mid-page.
    fn bulky_stream() -> Vec<u8> {
        let ps = 4096usize;
        let mut data: Vec<u8> = (0..70 * ps + 32).map(|i| (i * 13 % 251) as u8).collect();
        let mut header = |page: usize, flags: u16, overflow: u32| {
            let at = page * ps;
            data[at..at + 8].copy_from_slice(&(page as u64).to_le_bytes());
            data[at + 8..at + 10].copy_from_slice(&flags.to_le_bytes());
            data[at + 12..at + 16].copy_from_slice(&overflow.to_le_bytes());
        };
        header(0, super::super::bbolt::FLAG_META, 0);
        header(2, super::super::bbolt::FLAG_BRANCH, 40);
        header(60, super::super::bbolt::FLAG_LEAF, 3);
        data[16..20].copy_from_slice(&super::super::bbolt::MAGIC.to_le_bytes());
        data[24..28].copy_from_slice(&(ps as u32).to_le_bytes());
        data
    }

    #[test]
    fn bulk_goes_direct_and_the_file_is_the_stream() {
        let data = bulky_stream();
        let dir = tempfile_dir("direct");
        let path = dir.join("x");
        for splits in [&[65_536usize][..], &[1000, 70_000, 3], &[data.len()]] {
            let file = File::create(&path).unwrap();
            let direct = direct::open(&path, true);
            let supported = direct.is_some();
            let mut sink = Sink::new(file, direct);
            feed(&mut sink, &data, splits);
            sink.finish().unwrap();
            assert_eq!(fs::read(&path).unwrap(), data, "splits {splits:?}");
            if supported {
                // Pages 3..=41: the run of page 2 but its first and last
                // pages; not the short run.
                assert_eq!(sink.direct_written, 39 * 4096, "splits {splits:?}");
            } else {
                eprintln!(
                    "no direct I/O in {}: only the fallback was checked",
                    dir.display()
                );
                assert_eq!(sink.direct_written, 0);
            }
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A real etcd snapshot with a 100 KB value, saved through the sink:
    /// the check reads the structure back from the file, but not the whole
    /// pages inside that value, which it takes from the sums; the status is
    /// the one a full read gives.
    #[test]
    fn the_check_takes_the_inside_of_a_long_value_from_its_sum() {
        let snapshot = talos_test_support::etcd::fixture();
        let db_len = snapshot.len() as u64 - TRAILER_SIZE;
        let dir = tempfile_dir("sums");
        let path = dir.join("x");
        for splits in [&[16_384usize, 1000][..], &[snapshot.len()]] {
            let file = File::create(&path).unwrap();
            let mut sink = Sink::new(file, direct::open(&path, true));
            feed(&mut sink, snapshot, splits);
            sink.finish().unwrap();
            // One value is long enough; a second copy of it may stay in
            // pages bbolt freed, when etcd committed the leaf holding it
            // twice (its batching is timed, so the fixture varies).
            let ranges: Vec<_> = sink.sums.ranges().collect();
            assert!(
                (1..=2).contains(&ranges.len()),
                "one value is long enough: {ranges:?}"
            );
            let check = |sums: &BulkSums| {
                check_database(File::open(&path).unwrap(), None, sums.clone(), db_len).unwrap()
            };
            let full = check(&BulkSums::default());
            assert_eq!(check(&sink.sums), full);

            // The live copy: blanking it shows in a full read's hash.
            let inside = ranges
                .iter()
                .find(|r| {
                    let mut bytes = snapshot[..db_len as usize].to_vec();
                    bytes[r.start as usize..r.end as usize].fill(0);
                    let copy = dir.join("live");
                    fs::write(&copy, &bytes).unwrap();
                    let hash = check_database(
                        File::open(&copy).unwrap(),
                        None,
                        BulkSums::default(),
                        db_len,
                    )
                    .unwrap()
                    .hash;
                    hash != full.hash
                })
                .expect("the value's live pages are among the ranges")
                .clone();

            // Blank those pages in the file: with their sum the check does
            // not read them, so the status stays; a full read sees the
            // damage in the hash.
            let file = OpenOptions::new().write(true).open(&path).unwrap();
            let zeros = vec![0u8; (inside.end - inside.start) as usize];
            file.write_all_at(&zeros, inside.start).unwrap();
            drop(file);
            assert_eq!(check(&sink.sums), full);
            let damaged = check(&BulkSums::default());
            assert_ne!(damaged.hash, full.hash);
            assert_eq!(damaged.total_keys, full.total_keys);

            // The sum is what the hash is made of.
            let sums = |bytes: &[u8], range: Range<u64>| {
                let mut sums = BulkSums::default();
                sums.want(range.clone());
                sums.note(
                    range.start,
                    &bytes[range.start as usize..range.end as usize],
                );
                sums
            };
            let file_bytes = fs::read(&path).unwrap();
            assert_eq!(check(&sums(&file_bytes, inside.clone())), damaged);

            // A sum over a range the walk must look into (one page more: the
            // start of the value, with its key) is not used: the range is
            // read, and the damage seen, though the sum is the original's.
            let widened = sums(snapshot, inside.start - 4096..inside.end);
            assert_eq!(check(&widened), damaged);
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The values the check shows with a part unread are where it says:
    /// read from the file at the value's offset, they are the snapshot's
    /// bytes, and decode to the same key.
    #[test]
    fn values_left_partly_unread_know_where_they_are() {
        use super::super::bbolt::{Db, Visit};
        let snapshot = talos_test_support::etcd::fixture();
        let dir = tempfile_dir("offsets");
        let path = dir.join("x");
        let mut sink = Sink::new(File::create(&path).unwrap(), None);
        feed(&mut sink, snapshot, &[snapshot.len()]);
        sink.finish().unwrap();
        let mut db = Db::from_file(File::open(&path).unwrap(), snapshot.len() as u64 - 32).unwrap();
        db.sums = sink.sums.clone();
        let mut partial = 0;
        let mut problems = Vec::new();
        let mut visit = |visit: Visit<'_>| {
            if let Visit::Entry(_, Some(value)) = visit
                && value.unread().is_some()
            {
                partial += 1;
                let mut buf = Vec::new();
                let bytes = db.read_value(&value, &mut buf).unwrap();
                let at = value.offset() as usize;
                if bytes != &snapshot[at..at + value.len()] {
                    problems.push(format!("value at {at} is not the file's"));
                }
                let whole = super::super::bbolt::Value::whole(bytes);
                if value.crc32c_append(0) != whole.crc32c_append(0) {
                    problems.push(format!("value at {at}: CRC differs"));
                }
            }
        };
        db.check_visiting(Some(&mut visit)).unwrap();
        assert_eq!(partial, 1);
        assert!(problems.is_empty(), "{problems:?}");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Writes `data` to `sink` in pieces of the sizes in `splits` (cycled).
    fn feed(sink: &mut Sink, data: &[u8], splits: &[usize]) {
        let mut at = 0;
        for &n in splits.iter().cycle() {
            if at == data.len() {
                break;
            }
            let n = n.min(data.len() - at);
            sink.write(&data[at..at + n]).unwrap();
            at += n;
        }
    }

    fn tempfile_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("talos-{name}-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn suffixes() {
        assert_eq!(
            with_suffix(Path::new("/a/b.db"), ".part"),
            Path::new("/a/b.db.part")
        );
    }
}
