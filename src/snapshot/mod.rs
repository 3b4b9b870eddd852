//! Verified etcd snapshots.
//!
//! An etcd snapshot, as etcd's `Maintenance.Snapshot` streams it and Talos
//! forwards it, is a bbolt database followed by a 32-byte trailer: the
//! sha256 of the database bytes. Its size is therefore 32 more than a
//! multiple of 512.
//!
//! [`save`] streams a snapshot to disk with constant memory and keeps it only
//! if it passes every check: the trailer is present, it matches the contents
//! (recomputed, which talosctl does not do), the bbolt database is consistent
//! (`bbolt::Db::check`), and etcd's status can be computed
//! ([`status::status`]). A JSON sidecar records the facts. [`verify_file`]
//! runs the same checks on a file already on disk.
//!
//! The long overflow runs of big values are written around the page cache
//! (`O_DIRECT` on Linux), the rest through it. The check reads the file's
//! structure back, but takes the whole pages inside big values from the
//! CRC-32C of the bytes written there; see the `direct` module.
//!
//! - `bbolt`: a read-only bbolt reader using positioned reads (no mmap),
//!   public for the checks' own tests and hidden from the docs: it is not
//!   part of the API the crate promises to keep;
//! - [`status`]: etcd's snapshot status (hash, revision, key counts, size) as
//!   talosctl computes it with etcd 3.6's `etcdutl`, with etcd 3.4's key
//!   count alongside.

#[doc(hidden)]
pub mod bbolt;
mod direct;
mod save;
pub mod status;

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use save::{Save, SavedSnapshot, SnapshotMetadata, save};
pub use status::Status;

use bbolt::{BboltError, Db};
use status::StatusError;

/// Size of the sha256 trailer.
pub const TRAILER_SIZE: u64 = 32;

/// What a verified snapshot contains.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SnapshotReport {
    /// File size, trailer included.
    pub size: u64,
    /// sha256 of the contents (everything before the trailer), hex; equal
    /// to the trailer.
    pub sha256: String,
    /// etcd's status: hash, revision, total keys (etcd 3.6), total entries
    /// (etcd 3.4's total keys), total size.
    #[serde(flatten)]
    pub status: Status,
}

/// Errors of saving or verifying a snapshot.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// A file operation failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Receiving the snapshot failed (e.g. the node went away); nothing was
    /// kept.
    #[error("snapshot transfer failed: {source}")]
    Transfer {
        /// The client error.
        #[source]
        source: Box<crate::client::Error>,
    },
    /// The snapshot failed a check.
    #[error(
        "{}: snapshot failed the {} check: {failure}{}",
        .path.display(),
        .failure.check(),
        kept(.corrupt_copy)
    )]
    Check {
        /// The snapshot (for [`save`]: the path it was to be saved at).
        path: PathBuf,
        /// Where [`save`] left the rejected data, for inspection.
        corrupt_copy: Option<PathBuf>,
        /// Which check failed, and how.
        #[source]
        failure: Box<CheckFailure>,
    },
}

fn kept(copy: &Option<PathBuf>) -> String {
    match copy {
        Some(path) => format!(" (corrupt copy kept at {})", path.display()),
        None => String::new(),
    }
}

/// A check a snapshot failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckFailure {
    /// The size is not 32 more than a multiple of 512: no sha256 trailer
    /// (or a truncated transfer).
    #[error("no sha256 trailer: size {size} is not a multiple of 512 plus 32")]
    MissingTrailer {
        /// The size received.
        size: u64,
    },
    /// The trailer does not match the contents.
    #[error("sha256 mismatch: the trailer says {expected}, the contents hash to {actual}")]
    Sha256Mismatch {
        /// The trailer, hex.
        expected: String,
        /// The sha256 of the contents, hex.
        actual: String,
    },
    /// The bbolt database is damaged or inconsistent.
    #[error("bbolt: {0}")]
    Bbolt(#[source] BboltError),
    /// etcd's status could not be computed (not an etcd database).
    #[error("status: {0}")]
    Status(#[source] StatusError),
}

impl CheckFailure {
    /// A short name of the check: `trailer`, `sha256`, `bbolt` or `status`.
    pub fn check(&self) -> &'static str {
        match self {
            CheckFailure::MissingTrailer { .. } => "trailer",
            CheckFailure::Sha256Mismatch { .. } => "sha256",
            CheckFailure::Bbolt(_) => "bbolt",
            CheckFailure::Status(_) => "status",
        }
    }
}

impl From<StatusError> for CheckFailure {
    fn from(e: StatusError) -> Self {
        match e {
            StatusError::Db(e) => CheckFailure::Bbolt(e),
            other => CheckFailure::Status(other),
        }
    }
}

/// Verifies a snapshot file on disk: trailer present, sha256 of the contents
/// equal to it (recomputed, streaming), bbolt consistency, then etcd's
/// status.
pub fn verify_file(path: &Path) -> Result<SnapshotReport, SnapshotError> {
    let io_error = |source| SnapshotError::Io {
        path: path.to_owned(),
        source,
    };
    let rejected = |failure| SnapshotError::Check {
        path: path.to_owned(),
        corrupt_copy: None,
        failure: Box::new(failure),
    };
    let file = File::open(path).map_err(io_error)?;
    let size = file.metadata().map_err(io_error)?.len();
    if !has_trailer(size) {
        return Err(rejected(CheckFailure::MissingTrailer { size }));
    }
    let contents = size - TRAILER_SIZE;

    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    while offset < contents {
        let n = (contents - offset).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], offset)
            .map_err(io_error)?;
        hasher.update(&buf[..n]);
        offset += n as u64;
    }
    let mut trailer = [0u8; TRAILER_SIZE as usize];
    file.read_exact_at(&mut trailer, contents)
        .map_err(io_error)?;
    let digest: [u8; 32] = hasher.finalize().into();
    compare_trailer(&digest, &trailer).map_err(rejected)?;

    let status =
        check_database(file, None, direct::BulkSums::default(), contents).map_err(|failure| {
            match split_io(failure, path) {
                Ok(failure) => rejected(failure),
                Err(io) => io,
            }
        })?;
    Ok(report(size, &digest, &status))
}

/// Separates read errors, which say nothing about the snapshot, from failed
/// checks. `path` is the file that was being read.
pub(crate) fn split_io(failure: CheckFailure, path: &Path) -> Result<CheckFailure, SnapshotError> {
    match failure {
        CheckFailure::Bbolt(BboltError::Io { source, .. } | BboltError::Open { source, .. }) => {
            Err(SnapshotError::Io {
                path: path.to_owned(),
                source,
            })
        }
        other => Ok(other),
    }
}

/// Whether a snapshot of `size` bytes ends with a sha256 trailer (etcd's own
/// test).
pub(crate) fn has_trailer(size: u64) -> bool {
    size % 512 == TRAILER_SIZE
}

pub(crate) fn compare_trailer(digest: &[u8; 32], trailer: &[u8; 32]) -> Result<(), CheckFailure> {
    if digest == trailer {
        Ok(())
    } else {
        Err(CheckFailure::Sha256Mismatch {
            expected: Hex(trailer).to_string(),
            actual: Hex(digest).to_string(),
        })
    }
}

/// Opens the first `len` bytes of `file` as a bbolt database, checks it and
/// computes the status. `direct`, the same file opened for direct I/O,
/// reads long overflow runs around the page cache; `sums` hold the CRC of
/// bulk ranges as they were written, which the check need not read back
/// (see [`direct`]).
pub(crate) fn check_database(
    file: File,
    direct: Option<File>,
    sums: direct::BulkSums,
    len: u64,
) -> Result<Status, CheckFailure> {
    let mut db = Db::from_file(file, len).map_err(CheckFailure::Bbolt)?;
    db.direct = direct;
    db.sums = sums;
    status::checked_status(&db)
}

pub(crate) fn report(size: u64, digest: &[u8; 32], status: &Status) -> SnapshotReport {
    SnapshotReport {
        size,
        sha256: Hex(digest).to_string(),
        status: *status,
    }
}

/// Lower-case hex of bytes.
pub(crate) struct Hex<'a>(pub(crate) &'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}
