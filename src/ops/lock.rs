//! One operation per cluster at a time: an advisory lock on a file per
//! cluster (by CA fingerprint) under the state directory, held for the
//! holder's lifetime. The kernel drops it when the holder exits, however it
//! exits, so a killed process never blocks the next one.
//!
//! An operation takes it before its preflight and holds it through the
//! confirmation and the run: a second operation on the cluster is refused
//! at plan time, naming the holder (its operation id and process).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};

use super::OpsError;

/// A held cluster lock; released on drop.
#[derive(Debug)]
pub struct ClusterLock {
    file: File,
    path: PathBuf,
}

impl ClusterLock {
    /// Takes the lock for the cluster with CA fingerprint `fingerprint` on
    /// behalf of operation `op_id` (of this process), or fails with the
    /// holder: its operation id and process id.
    pub fn acquire(
        state_dir: &Path,
        fingerprint: &str,
        op_id: &str,
    ) -> Result<ClusterLock, OpsError> {
        let dir = state_dir.join("locks");
        std::fs::create_dir_all(&dir).map_err(|source| OpsError::Io {
            path: dir.clone(),
            source,
        })?;
        let path = lock_path(state_dir, fingerprint);
        let io = |source| OpsError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(busy(file)),
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        let holder = format!("operation {op_id} (pid {})", std::process::id());
        file.write_all(holder.as_bytes()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(ClusterLock { file, path })
    }

    /// Refuses ([`OpsError::Busy`], naming the holder) while another
    /// holds the lock of the cluster with CA fingerprint `fingerprint`;
    /// takes it only for the instant of the test, writing nothing.
    pub fn probe(state_dir: &Path, fingerprint: &str) -> Result<(), OpsError> {
        let path = lock_path(state_dir, fingerprint);
        let file = match OpenOptions::new().read(true).open(&path) {
            Ok(file) => file,
            // Never taken yet: nobody holds it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(OpsError::Io { path, source }),
        };
        match file.try_lock() {
            Ok(()) => {
                let _ = file.unlock();
                Ok(())
            }
            Err(TryLockError::WouldBlock) => Err(busy(file)),
            Err(TryLockError::Error(source)) => Err(OpsError::Io { path, source }),
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The lock file of the cluster with CA fingerprint `fingerprint`.
fn lock_path(state_dir: &Path, fingerprint: &str) -> PathBuf {
    state_dir.join("locks").join(format!(
        "{}.lock",
        &fingerprint[..fingerprint.len().min(32)]
    ))
}

/// The refusal naming the holder, as written in the lock `file`.
fn busy(mut file: File) -> OpsError {
    let mut holder = String::new();
    let _ = file.read_to_string(&mut holder);
    let holder = holder.trim();
    OpsError::Busy {
        holder: if holder.is_empty() {
            "an operation being set up".into()
        } else {
            holder.to_string()
        },
    }
}

impl Drop for ClusterLock {
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
        let _ = self.file.unlock();
    }
}
