//! Where backups are kept: one trait ([`Store`]) over a local directory
//! ([`LocalStore`]) and S3-compatible object storage
//! ([`S3Store`](super::S3Store)).
//!
//! Keys are `/`-separated paths relative to the store's root (the
//! directory, or the `s3://BUCKET/PREFIX`). An object is written through an
//! [`Upload`]: nothing is visible under its key until
//! [`Upload::complete`], and [`Upload::abort`] leaves nothing.

use std::fmt;
use std::future::Future;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A boxed future of a store operation.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The bytes of an object, in order.
pub type ObjectStream = BoxStream<'static, Result<Bytes, StoreError>>;

/// Errors of a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A key that cannot name an object (empty, absolute, `.` or `..`
    /// segments).
    #[error("{store}: invalid key {key:?}")]
    InvalidKey {
        /// The store.
        store: String,
        /// The key.
        key: String,
    },
    /// No object under this key.
    #[error("{store}: no object {key}")]
    NotFound {
        /// The store.
        store: String,
        /// The key.
        key: String,
    },
    /// A file operation of a local store failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The object store answered with an error.
    #[error("{store}: {key}: {source}")]
    Remote {
        /// The store.
        store: String,
        /// The key.
        key: String,
        /// The object store's error.
        #[source]
        source: Box<object_store::Error>,
    },
    /// The settings of a store are wrong or incomplete.
    #[error("{store}: {problem}")]
    Settings {
        /// The store (its URL as given).
        store: String,
        /// What is wrong.
        problem: String,
    },
}

/// One object of a store, as [`Store::list`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectInfo {
    /// The key, relative to the store's root.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
}

/// A place to keep backups.
pub trait Store: Send + Sync + fmt::Debug {
    /// The store as a user names it: the directory, or `s3://BUCKET/PREFIX`.
    fn describe(&self) -> String;

    /// Starts writing the object `key`; nothing is visible under `key`
    /// until [`Upload::complete`].
    fn start_upload<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Box<dyn Upload>>;

    /// Writes a small object in one piece (replacing an older one).
    fn put<'a>(&'a self, key: &'a str, bytes: Bytes) -> StoreFuture<'a, ()>;

    /// Streams the object `key`.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ObjectStream>;

    /// Lists the objects whose keys start with `prefix` (`""`: all).
    fn list<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Vec<ObjectInfo>>;

    /// Deletes the object `key`.
    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ()>;
}

/// An object being written (see [`Store::start_upload`]).
pub trait Upload: Send {
    /// Appends `bytes`.
    fn write(&mut self, bytes: Bytes) -> StoreFuture<'_, ()>;
    /// Makes the object visible under its key.
    fn complete(self: Box<Self>) -> StoreFuture<'static, ()>;
    /// Discards what was written; nothing is left under the key.
    fn abort(self: Box<Self>) -> StoreFuture<'static, ()>;
}

/// Reads the whole (small) object `key`.
pub async fn get_all(store: &dyn Store, key: &str) -> Result<Vec<u8>, StoreError> {
    let mut stream = store.get(key).await?;
    let mut all = Vec::new();
    while let Some(chunk) = stream.try_next().await? {
        all.extend_from_slice(&chunk);
    }
    Ok(all)
}

/// Checks that `key` is a relative path of plain segments.
pub(crate) fn check_key(store: &dyn Store, key: &str) -> Result<(), StoreError> {
    let bad = key.is_empty()
        || key.starts_with('/')
        || key.contains('\0')
        || key
            .split('/')
            .any(|segment| segment.is_empty() || segment == "." || segment == "..");
    if bad {
        return Err(StoreError::InvalidKey {
            store: store.describe(),
            key: key.to_owned(),
        });
    }
    Ok(())
}

/// Backups in a local directory: files 0600 in directories 0700, written
/// as `KEY.part` and renamed into place once complete (then the directory
/// is synced).
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
}

/// Suffix of an object being written to a [`LocalStore`].
const PART: &str = ".part";

impl LocalStore {
    /// A store rooted at `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> LocalStore {
        LocalStore { root: root.into() }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        check_key(self, key)?;
        Ok(self.root.join(key))
    }
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

fn create_dirs(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

impl Store for LocalStore {
    fn describe(&self) -> String {
        self.root.display().to_string()
    }

    fn start_upload<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Box<dyn Upload>> {
        Box::pin(async move {
            let path = self.path(key)?;
            let part = with_suffix(&path, PART);
            let file = tokio::task::spawn_blocking({
                let part = part.clone();
                move || -> io::Result<std::fs::File> {
                    if let Some(dir) = part.parent() {
                        create_dirs(dir)?;
                    }
                    let file = std::fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .mode(0o600)
                        .open(&part)?;
                    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
                    Ok(file)
                }
            })
            .await
            .map_err(io::Error::other)
            .and_then(|r| r)
            .map_err(io_error(&part))?;
            Ok(Box::new(LocalUpload {
                file: Some(tokio::fs::File::from_std(file)),
                part,
                path,
            }) as Box<dyn Upload>)
        })
    }

    fn put<'a>(&'a self, key: &'a str, bytes: Bytes) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let path = self.path(key)?;
            let target = path.clone();
            tokio::task::spawn_blocking(move || crate::atomic::write_atomic(&target, &bytes))
                .await
                .map_err(io::Error::other)
                .and_then(|r| r)
                .map_err(io_error(&path))
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ObjectStream> {
        Box::pin(async move {
            let path = self.path(key)?;
            let file = match tokio::fs::File::open(&path).await {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(StoreError::NotFound {
                        store: self.describe(),
                        key: key.to_owned(),
                    });
                }
                Err(e) => return Err(io_error(&path)(e)),
            };
            let stream = futures::stream::try_unfold((file, path), |(mut file, path)| async {
                let mut buf = vec![0u8; 1 << 20];
                let n = file.read(&mut buf).await.map_err(io_error(&path))?;
                if n == 0 {
                    return Ok(None);
                }
                buf.truncate(n);
                Ok(Some((Bytes::from(buf), (file, path))))
            });
            Ok(stream.boxed())
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Vec<ObjectInfo>> {
        Box::pin(async move {
            let root = self.root.clone();
            let prefix = prefix.to_owned();
            tokio::task::spawn_blocking(move || list_dir(&root, &prefix))
                .await
                .map_err(|e| io_error(&self.root)(io::Error::other(e)))?
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let path = self.path(key)?;
            match tokio::fs::remove_file(&path).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Err(StoreError::NotFound {
                    store: self.describe(),
                    key: key.to_owned(),
                }),
                Err(e) => Err(io_error(&path)(e)),
            }
        })
    }
}

/// The files under `root` (recursively) whose keys start with `prefix`,
/// sorted by key; objects still being written (`.part`) are left out.
fn list_dir(root: &Path, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound && dir == root => break,
            Err(e) => return Err(io_error(&dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io_error(&dir))?;
            let path = entry.path();
            let kind = entry.file_type().map_err(io_error(&path))?;
            if kind.is_dir() {
                dirs.push(path);
                continue;
            }
            let Ok(relative) = path.strip_prefix(root) else {
                continue;
            };
            let Some(key) = relative.to_str() else {
                continue;
            };
            if !kind.is_file() || key.ends_with(PART) || !key.starts_with(prefix) {
                continue;
            }
            let size = entry.metadata().map_err(io_error(&path))?.len();
            found.push(ObjectInfo {
                key: key.to_owned(),
                size,
            });
        }
    }
    found.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(found)
}

struct LocalUpload {
    file: Option<tokio::fs::File>,
    part: PathBuf,
    path: PathBuf,
}

impl Upload for LocalUpload {
    fn write(&mut self, bytes: Bytes) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let file = self.file.as_mut().expect("open until complete or abort");
            file.write_all(&bytes).await.map_err(io_error(&self.part))
        })
    }

    fn complete(mut self: Box<Self>) -> StoreFuture<'static, ()> {
        Box::pin(async move {
            let mut file = self.file.take().expect("open until complete or abort");
            let done = async {
                file.flush().await?;
                file.sync_all().await?;
                drop(file);
                tokio::fs::rename(&self.part, &self.path).await?;
                let path = self.path.clone();
                tokio::task::spawn_blocking(move || crate::atomic::sync_parent(&path))
                    .await
                    .map_err(io::Error::other)?
            }
            .await;
            if done.is_err() {
                let _ = tokio::fs::remove_file(&self.part).await;
            }
            done.map_err(io_error(&self.path))
        })
    }

    fn abort(mut self: Box<Self>) -> StoreFuture<'static, ()> {
        Box::pin(async move {
            drop(self.file.take());
            match tokio::fs::remove_file(&self.part).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io_error(&self.part)(e)),
            }
        })
    }
}

impl Drop for LocalUpload {
    fn drop(&mut self) {
        // Abandoned without complete or abort: leave nothing.
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.part);
        }
    }
}
