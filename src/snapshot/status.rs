//! etcd's snapshot status, computed from a bbolt file exactly as
//! `etcdutl snapshot status` (and etcd 3.4's `etcdctl snapshot status`) do:
//!
//! - hash: CRC-32C (Castagnoli) over, for each top-level bucket in order, the
//!   bucket name, then each of its keys followed by its value (a nested
//!   bucket contributes its name and no value);
//! - revision: the main revision (first 8 bytes, big-endian) of the last key
//!   of bucket `key`;
//! - total keys: entries across all top-level buckets;
//! - total size: bbolt's `Tx.Size`, high-water mark times page size, which
//!   for a snapshot is the file size without the trailer.

use serde::{Deserialize, Serialize};

use super::bbolt::{BboltError, Db, Entry};

/// etcd's summary of a snapshot (`etcdctl snapshot status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// CRC-32C of bucket names, keys and values.
    pub hash: u32,
    /// The latest main revision in bucket `key` (0 if it is empty).
    pub revision: i64,
    /// Number of entries across the top-level buckets.
    pub total_keys: u64,
    /// Database size in bytes (high-water mark times page size).
    pub total_size: u64,
}

/// Errors computing the status.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
    /// The database could not be read.
    #[error(transparent)]
    Db(#[from] BboltError),
    /// A key of bucket `key` is too short to hold a revision.
    #[error("bucket \"key\": key of {len} bytes is too short for a revision")]
    RevisionKey {
        /// The key's length.
        len: usize,
    },
}

/// The bucket whose keys are revisions.
const KEY_BUCKET: &[u8] = b"key";

/// Computes the status of `db`. Does not check consistency: run
/// [`Db::check`] first.
pub fn status(db: &Db) -> Result<Status, StatusError> {
    let mut hash = 0u32;
    let mut revision = 0i64;
    let mut total_keys = 0u64;
    db.for_each_bucket(|name, bucket| {
        hash = crc32c::crc32c_append(hash, name);
        let is_key_bucket = name == KEY_BUCKET;
        db.for_each(&bucket, |key, entry| {
            hash = crc32c::crc32c_append(hash, key);
            if let Entry::Value(value) = entry {
                hash = crc32c::crc32c_append(hash, value);
            }
            if is_key_bucket {
                let main: [u8; 8] = key
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .ok_or(StatusError::RevisionKey { len: key.len() })?;
                revision = i64::from_be_bytes(main);
            }
            total_keys += 1;
            Ok::<(), StatusError>(())
        })
    })?;
    Ok(Status {
        hash,
        revision,
        total_keys,
        total_size: db.size(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32c_appends_like_go_hash_writer() {
        // Go's crc32.New(Castagnoli) followed by writes equals one CRC over
        // the concatenation; crc32c_append must behave the same.
        let whole = crc32c::crc32c(b"keyabcvalue");
        let mut parts = 0;
        for part in [&b"key"[..], b"abc", b"", b"value"] {
            parts = crc32c::crc32c_append(parts, part);
        }
        assert_eq!(whole, parts);
        // The standard CRC-32C check value.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }
}
