//! etcd's snapshot status, computed from a bbolt file as
//! `etcdutl snapshot status` computes it in etcd 3.6 (the status talosctl
//! v1.13.9 prints after `etcd snapshot`; mirrored from
//! `etcdutl/snapshot/v3_snapshot.go`, `v3Manager.Status`, tag v3.6.12):
//!
//! - hash: CRC-32C (Castagnoli) over, for each top-level bucket in order, the
//!   bucket name, then each of its keys followed by its value (a nested
//!   bucket contributes its name and no value);
//! - revision: the main revision (first 8 bytes, big-endian) of the last key
//!   of bucket `key`;
//! - total keys ([`Status::total_keys`]): the distinct live user keys of
//!   bucket `key`, see below;
//! - total size: bbolt's `Tx.Size`, high-water mark times page size, which
//!   for a snapshot is the file size without the trailer.
//!
//! Bucket `key` maps revisions to `mvccpb.KeyValue` protobufs. A revision
//! key is 17 bytes (main revision, `_`, sub revision, both big-endian), or
//! 18 with a trailing `t` when the revision deletes its key (a tombstone).
//! Walking the bucket in revision order, a revision adds its user key
//! (field 1 of the protobuf) to the set of live keys and a tombstone
//! removes it; etcd 3.6 reports the size of the set. etcd 3.4's
//! `etcdctl snapshot status` instead counted every entry of every
//! top-level bucket (all revisions, tombstones, and the entries of
//! `meta`, `members`, `lease`...): that number is kept as
//! [`Status::total_entries`].
//!
//! Memory: the set holds a 16-byte digest (truncated SHA-256) per distinct
//! live key, not the key, so it grows with the number of keys and never
//! with the size of the file or of the values: about 20 to 40 bytes per
//! key with the table's slack, 4 MiB for 100,000 keys. Everything else
//! stays flat.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Hex;
use super::bbolt::{BboltError, Corruption, Db, Entry, Value, Visit};

/// etcd's summary of a snapshot (`etcdutl snapshot status`), with etcd
/// 3.4's key count alongside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Status {
    /// CRC-32C of bucket names, keys and values.
    pub hash: u32,
    /// The latest main revision in bucket `key` (0 if it is empty).
    pub revision: i64,
    /// Distinct live keys: user keys whose latest revision in bucket `key`
    /// is not a deletion. etcd 3.6's `TotalKey` (`etcdutl snapshot
    /// status`), the "total keys" talosctl v1.13.9 prints.
    pub total_keys: u64,
    /// Every entry of every top-level bucket: each revision and tombstone
    /// of bucket `key` plus etcd's bookkeeping entries. etcd 3.4's
    /// `totalKey` (`etcdctl snapshot status` of Debian's etcd-client).
    pub total_entries: u64,
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
    /// A key of bucket `key` has the wrong length for a revision.
    #[error(
        "bucket \"key\": key of {len} bytes is not a revision \
         ({REVISION_LEN} bytes, or {} with a tombstone mark)",
        REVISION_LEN + 1
    )]
    RevisionKey {
        /// The key's length.
        len: usize,
    },
    /// A key of bucket `key` has the length of a revision but is not one.
    #[error("bucket \"key\": key {key} is not a revision: {problem}")]
    Revision {
        /// The key, hex.
        key: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A value of bucket `key` is not an etcd `KeyValue` protobuf.
    #[error("bucket \"key\": the value at revision {key} is not a KeyValue: {problem}")]
    KeyValue {
        /// The revision key, hex.
        key: String,
        /// What is wrong with the value.
        problem: &'static str,
    },
}

/// The bucket whose keys are revisions.
const KEY_BUCKET: &[u8] = b"key";

/// Length of a revision key: 8-byte main revision, `_`, 8-byte sub revision.
const REVISION_LEN: usize = 17;

/// Computes the status of `db`. Does not check consistency: run
/// [`Db::check`] first.
pub fn status(db: &Db) -> Result<Status, StatusError> {
    let mut tally = Tally::default();
    db.for_each_bucket(|name, bucket| {
        tally.bucket(name);
        db.for_each(&bucket, |key, entry| {
            // A nested bucket has no value (Go's ForEach passes nil).
            let value = match entry {
                Entry::Value(value) => Some(Value::whole(value)),
                Entry::Bucket(_) => None,
            };
            tally.entry(key, value, db);
            tally.error.take().map_or(Ok(()), Err)
        })
    })?;
    tally.finish(db)
}

/// Checks `db` ([`Db::check`]) and computes its status in the same pass
/// over the file.
pub(crate) fn checked_status(db: &Db) -> Result<Status, super::CheckFailure> {
    let mut tally = Tally::default();
    let mut visit = |visit: Visit<'_>| match visit {
        Visit::Bucket(name) => tally.bucket(name),
        Visit::Entry(key, value) => tally.entry(key, value, db),
        Visit::RootValue { page } => tally.fail(StatusError::Db(BboltError::Corrupt {
            page,
            bucket: String::new(),
            problem: Corruption::UnexpectedType {
                expected: "bucket entry in the root",
                flags: 0,
            },
        })),
    };
    db.check_visiting(Some(&mut visit))
        .map_err(super::CheckFailure::Bbolt)?;
    Ok(tally.finish(db)?)
}

/// The status so far, fed the top-level buckets and their entries in order;
/// keeps the first error.
#[derive(Default)]
struct Tally {
    hash: u32,
    revision: i64,
    total_entries: u64,
    live: LiveKeys,
    in_key_bucket: bool,
    error: Option<StatusError>,
}

impl Tally {
    fn bucket(&mut self, name: &[u8]) {
        self.hash = crc32c::crc32c_append(self.hash, name);
        self.in_key_bucket = name == KEY_BUCKET;
    }

    /// An entry; `db` reads what the check left unread, should it be
    /// needed.
    fn entry(&mut self, key: &[u8], value: Option<Value<'_>>, db: &Db) {
        let value = value.unwrap_or(Value::whole(&[]));
        self.hash = crc32c::crc32c_append(self.hash, key);
        self.hash = value.crc32c_append(self.hash);
        if self.in_key_bucket && self.error.is_none() {
            match self.live.record(key, &value, Some(db)) {
                Ok(revision) => self.revision = revision,
                Err(e) => self.fail(e),
            }
        }
        self.total_entries += 1;
    }

    fn fail(&mut self, error: StatusError) {
        self.error.get_or_insert(error);
    }

    fn finish(self, db: &Db) -> Result<Status, StatusError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        Ok(Status {
            hash: self.hash,
            revision: self.revision,
            total_keys: self.live.count(),
            total_entries: self.total_entries,
            total_size: db.size(),
        })
    }
}

/// The set of live user keys, fed the entries of bucket `key` in revision
/// order. Holds digests, not keys (see the module's documentation).
#[derive(Default)]
struct LiveKeys {
    digests: HashSet<[u8; 16]>,
    /// A value read whole, when its user key lies in a part the check left
    /// unread.
    scratch: Vec<u8>,
}

impl LiveKeys {
    /// Records one entry of bucket `key`; returns its main revision. `db`
    /// reads the value again when its key lies in a part left unread.
    fn record(
        &mut self,
        revision: &[u8],
        value: &Value<'_>,
        db: Option<&Db>,
    ) -> Result<i64, StatusError> {
        let (main, tombstone) = parse_revision(revision)?;
        let invalid = |problem| StatusError::KeyValue {
            key: Hex(revision).to_string(),
            problem,
        };
        let key = match key_value_key(value) {
            Err(Problem::Unread) => {
                let db = db.ok_or_else(|| invalid("part of the value was not read"))?;
                let bytes = db.read_value(value, &mut self.scratch)?;
                key_value_key(&Value::whole(bytes))
            }
            found => found,
        };
        let digest = match key {
            Ok(key) => digest(key),
            Err(Problem::Invalid(problem)) => return Err(invalid(problem)),
            Err(Problem::Unread) => unreachable!("a whole value has no unread part"),
        };
        if tombstone {
            self.digests.remove(&digest);
        } else {
            self.digests.insert(digest);
        }
        Ok(main)
    }

    fn count(&self) -> u64 {
        self.digests.len() as u64
    }
}

/// 128 bits of SHA-256: two distinct keys share a digest with probability
/// about n^2 / 2^129 for n keys, nil in practice.
fn digest(key: &[u8]) -> [u8; 16] {
    let full = Sha256::digest(key);
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&full[..16]);
    digest
}

/// Parses a revision key as etcd 3.6 does (`BytesToBucketKey` in
/// `server/storage/mvcc/revision.go`): its main revision, and whether it
/// marks a deletion.
fn parse_revision(key: &[u8]) -> Result<(i64, bool), StatusError> {
    if key.len() != REVISION_LEN && key.len() != REVISION_LEN + 1 {
        return Err(StatusError::RevisionKey { len: key.len() });
    }
    let invalid = |problem| StatusError::Revision {
        key: Hex(key).to_string(),
        problem,
    };
    if key[8] != b'_' {
        return Err(invalid("no '_' between main and sub revision"));
    }
    let half = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&key[at..at + 8]);
        i64::from_be_bytes(bytes)
    };
    let (main, sub) = (half(0), half(9));
    if main < 0 || sub < 0 {
        return Err(invalid("negative revision"));
    }
    Ok((
        main,
        key.len() == REVISION_LEN + 1 && key[REVISION_LEN] == b't',
    ))
}

/// Why [`key_value_key`] found no key.
#[derive(Debug, PartialEq, Eq)]
enum Problem {
    /// The value is not a KeyValue.
    Invalid(&'static str),
    /// The walk needs bytes of the value that were not read.
    Unread,
}

/// The user key (field 1) of an `mvccpb.KeyValue`, validating the encoding
/// as the generated Go decoder does: every field well formed, the known
/// fields (1 key, 2 create_revision, 3 mod_revision, 4 version, 5 value,
/// 6 lease) of their declared wire type, unknown fields skipped. A repeated
/// field 1 counts by its last occurrence; without one the key is empty.
///
/// Fields of known length are stepped over without being looked at, so a
/// part of the value left unread (inside field 5, typically) does not
/// matter unless a tag, a length or the key lies in it.
fn key_value_key<'v>(value: &Value<'v>) -> Result<&'v [u8], Problem> {
    const VARINT: u64 = 0;
    const FIXED64: u64 = 1;
    const LEN: u64 = 2;
    const FIXED32: u64 = 5;
    let len = value.len();
    let mut at = 0;
    let mut key = 0..0;
    let skip = |at: usize, n: usize| {
        at.checked_add(n)
            .filter(|&end| end <= len)
            .ok_or(Problem::Invalid("truncated field"))
    };
    while at < len {
        let tag = read_varint(value, &mut at)?;
        let (field, wire) = (tag >> 3, tag & 7);
        if field == 0 {
            return Err(Problem::Invalid("field number 0"));
        }
        let expected = match field {
            1 | 5 => Some(LEN),
            2 | 3 | 4 | 6 => Some(VARINT),
            _ => None,
        };
        if expected.is_some_and(|expected| expected != wire) {
            return Err(Problem::Invalid("a known field has the wrong wire type"));
        }
        match wire {
            VARINT => {
                read_varint(value, &mut at)?;
            }
            FIXED64 => at = skip(at, 8)?,
            FIXED32 => at = skip(at, 4)?,
            LEN => {
                let n = read_varint(value, &mut at)?;
                let n = usize::try_from(n)
                    .map_err(|_| Problem::Invalid("field length out of range"))?;
                let end = skip(at, n)?;
                if field == 1 {
                    key = at..end;
                }
                at = end;
            }
            // Groups (3, 4) are not in the message's schema; 6, 7 do not exist.
            _ => return Err(Problem::Invalid("unsupported wire type")),
        }
    }
    value.get(key).ok_or(Problem::Unread)
}

/// Reads the varint at `at` of `value`, moving `at` past it.
fn read_varint(value: &Value<'_>, at: &mut usize) -> Result<u64, Problem> {
    let mut result = 0u64;
    for i in 0..10 {
        if *at >= value.len() {
            return Err(Problem::Invalid("truncated varint"));
        }
        let byte = value.get(*at..*at + 1).ok_or(Problem::Unread)?[0];
        *at += 1;
        result |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(result);
        }
    }
    Err(Problem::Invalid("varint longer than 10 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn revision(main: i64, sub: i64, tombstone: bool) -> Vec<u8> {
        let mut key = main.to_be_bytes().to_vec();
        key.push(b'_');
        key.extend_from_slice(&sub.to_be_bytes());
        if tombstone {
            key.push(b't');
        }
        key
    }

    /// A KeyValue as etcd writes it: key, create/mod revision, version,
    /// value (a tombstone's has only the key and mod revision).
    fn key_value(key: &[u8], main: i64, value: &[u8]) -> Vec<u8> {
        let mut out = vec![0x0a, key.len() as u8];
        out.extend_from_slice(key);
        out.extend_from_slice(&[0x10, main as u8, 0x18, main as u8, 0x20, 1]);
        if !value.is_empty() {
            out.push(0x2a);
            out.push(value.len() as u8);
            out.extend_from_slice(value);
        }
        out
    }

    /// Counts live keys over (key, delete?) operations, one revision each.
    fn count(ops: &[(&str, bool)]) -> u64 {
        let mut live = LiveKeys::default();
        for (i, (key, delete)) in ops.iter().enumerate() {
            let main = i as i64 + 2;
            let value = if *delete { &b""[..] } else { b"v" };
            let got = live
                .record(
                    &revision(main, 0, *delete),
                    &Value::whole(&key_value(key.as_bytes(), main, value)),
                    None,
                )
                .unwrap();
            assert_eq!(got, main);
        }
        live.count()
    }

    #[test]
    fn live_keys_follow_puts_and_deletes_in_revision_order() {
        // The cases etcd 3.6 tests TotalKey with, and two more.
        let put = |k| (k, false);
        let del = |k| (k, true);
        assert_eq!(count(&[]), 0);
        assert_eq!(count(&[put("a"), put("b"), put("a"), put("a")]), 2);
        assert_eq!(count(&[put("a"), put("a"), del("a")]), 0);
        assert_eq!(count(&[put("a"), del("a"), put("a"), del("a")]), 0);
        assert_eq!(count(&[put("a"), del("a"), put("a")]), 1);
        assert_eq!(count(&[put("a"), put("b"), del("a")]), 1);
        // A deletion of a key never seen (compacted away) changes nothing.
        assert_eq!(count(&[put("a"), del("b")]), 1);
        // The empty key is a key.
        assert_eq!(count(&[put(""), put("a"), del("a")]), 1);
    }

    #[test]
    fn revision_keys_are_parsed_as_etcd_does() {
        assert_eq!(parse_revision(&revision(7, 3, false)).unwrap(), (7, false));
        assert_eq!(parse_revision(&revision(7, 3, true)).unwrap(), (7, true));
        // An 18th byte other than 't' is no tombstone.
        let mut marked = revision(9, 0, false);
        marked.push(b'x');
        assert_eq!(parse_revision(&marked).unwrap(), (9, false));
        for len in [0, 8, 16, 19] {
            assert!(matches!(
                parse_revision(&vec![0; len]),
                Err(StatusError::RevisionKey { len: l }) if l == len
            ));
        }
        let mut separator = revision(1, 0, false);
        separator[8] = b'-';
        assert!(matches!(
            parse_revision(&separator),
            Err(StatusError::Revision { .. })
        ));
        assert!(matches!(
            parse_revision(&revision(-1, 0, false)),
            Err(StatusError::Revision { .. })
        ));
        assert!(matches!(
            parse_revision(&revision(1, -2, false)),
            Err(StatusError::Revision { .. })
        ));
    }

    fn kv_key(bytes: &[u8]) -> Result<&[u8], Problem> {
        key_value_key(&Value::whole(bytes))
    }

    #[test]
    fn key_value_decoding_finds_the_key_and_refuses_garbage() {
        let kv = key_value(b"/registry/pods/x", 5, b"value");
        assert_eq!(kv_key(&kv).unwrap(), b"/registry/pods/x");
        // Unknown fields of every wire type are skipped; fields may come in
        // any order; the last key wins.
        let mut mixed = vec![0x30, 0x96, 0x01]; // lease 150
        mixed.extend_from_slice(&[0x39, 1, 2, 3, 4, 5, 6, 7, 8]); // 7: fixed64
        mixed.extend_from_slice(&[0x45, 1, 2, 3, 4]); // 8: fixed32
        mixed.extend_from_slice(&[0x0a, 1, b'a', 0x4a, 2, b'z', b'z', 0x0a, 1, b'b']);
        assert_eq!(kv_key(&mixed).unwrap(), b"b");
        assert_eq!(kv_key(&[]).unwrap(), b"");

        for garbage in [
            &[0x0a][..],         // truncated length
            &[0x0a, 5, b'a'],    // truncated key
            &[0x08, 1],          // key as a varint
            &[0x12, 0],          // create_revision as bytes
            &[0x2d, 0, 0, 0, 0], // value as fixed32
            &[0x00, 0],          // field 0
            &[0x0b],             // group
            &[0x10, 0x80],       // truncated varint
            &[
                0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
            b"not a protobuf at all",
        ] {
            assert!(
                matches!(kv_key(garbage), Err(Problem::Invalid(_))),
                "{garbage:x?}"
            );
        }
    }

    #[test]
    fn a_value_partly_unread_hashes_and_decodes_as_the_whole() {
        // key "/k", a 5,000-byte value (field 5), lease 5.
        let mut kv = vec![0x0a, 2, b'/', b'k', 0x2a, 0x88, 0x27];
        kv.extend((0..5000u32).map(|i| (i % 253) as u8));
        kv.extend_from_slice(&[0x30, 5]);
        let whole = Value::whole(&kv);
        let part = |range: std::ops::Range<usize>| {
            let crc = crc32c::crc32c(&kv[range.clone()]);
            Value::with_unread(&kv, range, crc)
        };
        // Inside field 5: the walk steps over it.
        let inside = part(100..4100);
        assert_eq!(inside.crc32c_append(7), whole.crc32c_append(7));
        assert_eq!(inside.crc32c_append(7), crc32c::crc32c_append(7, &kv));
        assert_eq!(key_value_key(&inside), Ok(&b"/k"[..]));
        // Over the key, a tag or a length: the walk needs the bytes.
        assert_eq!(key_value_key(&part(2..4000)), Err(Problem::Unread));
        assert_eq!(key_value_key(&part(4000..kv.len())), Err(Problem::Unread));
        assert_eq!(key_value_key(&part(5..4000)), Err(Problem::Unread));
        // A wrong CRC shows in the hash.
        let wrong = Value::with_unread(&kv, 100..4100, 0);
        assert_ne!(wrong.crc32c_append(7), whole.crc32c_append(7));
        // Garbage is found before an unread part is needed.
        let mut bad = kv.clone();
        bad[0] = 0x08; // the key as a varint
        let crc = crc32c::crc32c(&bad[100..4100]);
        assert!(matches!(
            key_value_key(&Value::with_unread(&bad, 100..4100, crc)),
            Err(Problem::Invalid(_))
        ));
        // Without a database to read it from, an unread key is an error.
        let error = LiveKeys::default()
            .record(&revision(3, 0, false), &part(2..4000), None)
            .unwrap_err();
        assert!(error.to_string().contains("not read"), "{error}");
    }

    #[test]
    fn a_bad_value_in_the_key_bucket_is_an_error() {
        let mut live = LiveKeys::default();
        let error = live
            .record(&revision(3, 0, false), &Value::whole(&[0x0a, 9]), None)
            .unwrap_err();
        assert!(error.to_string().contains("not a KeyValue"), "{error}");
    }
}
