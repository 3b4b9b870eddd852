//! Errors of the bbolt reader.

use std::io;
use std::path::PathBuf;

use super::{MAX_PAGE_SIZE, MIN_PAGE_SIZE};

/// Errors reading or checking a bbolt file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BboltError {
    /// The file could not be opened.
    #[error("{}: {source}", .path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Reading the file failed (the caller knows which file).
    #[error("read at offset {offset}: {source}")]
    Io {
        /// Where the read started.
        offset: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file is shorter than the database length it was opened with.
    #[error("file has {actual} bytes, fewer than the {expected} expected")]
    FileTooShort {
        /// Its size.
        actual: u64,
        /// The database length it was opened with.
        expected: u64,
    },
    /// Neither meta page is valid.
    #[error("no valid meta page (page 0: {meta0}; page 1: {meta1})")]
    NoValidMeta {
        /// What is wrong with the first meta page.
        meta0: MetaProblem,
        /// What is wrong with the second meta page.
        meta1: MetaProblem,
    },
    /// The meta page gives a page size this reader does not accept.
    #[error("page size {0} is out of range ({MIN_PAGE_SIZE}..={MAX_PAGE_SIZE})")]
    PageSize(u32),
    /// The meta page claims more pages than the database holds.
    #[error(
        "database truncated: the meta page claims {high_water} pages of {page_size} bytes, \
         the database has {len} bytes"
    )]
    Truncated {
        /// The high-water page id (number of pages in use).
        high_water: u64,
        /// The page size.
        page_size: u32,
        /// The database length.
        len: u64,
    },
    /// A page is damaged or inconsistent.
    #[error("page {page}{}: {problem}", in_bucket(.bucket))]
    Corrupt {
        /// The page (for an inline bucket: the leaf page holding it).
        page: u64,
        /// The bucket path (names joined by `/`, non-printable bytes escaped),
        /// empty when not known or for the root.
        bucket: String,
        /// What is wrong.
        problem: Corruption,
    },
}

fn in_bucket(bucket: &str) -> String {
    if bucket.is_empty() {
        String::new()
    } else {
        format!(" (bucket \"{bucket}\")")
    }
}

/// Why a meta page is not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetaProblem {
    /// The database is too short to hold this meta page.
    #[error("missing")]
    Missing,
    /// Not a bbolt meta page.
    #[error("bad magic {0:#010x}")]
    Magic(u32),
    /// An unknown format version.
    #[error("unsupported version {0}")]
    Version(u32),
    /// The checksum does not match the contents.
    #[error("checksum mismatch: stored {stored:#018x}, computed {computed:#018x}")]
    Checksum {
        /// The checksum in the page.
        stored: u64,
        /// The checksum of the contents.
        computed: u64,
    },
}

/// What is wrong with a page.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Corruption {
    /// The page, or the last page of its overflow run, is at or above the
    /// high-water mark.
    #[error("out of bounds: its run ends at page {last}, the high-water mark is {high_water}")]
    OutOfBounds {
        /// The last page of the run.
        last: u64,
        /// The high-water mark.
        high_water: u64,
    },
    /// The page header names another page.
    #[error("header says page {found}")]
    IdMismatch {
        /// The id in the header.
        found: u64,
    },
    /// The page has the wrong type.
    #[error("expected a {expected} page, found flags {flags:#06x}")]
    UnexpectedType {
        /// What was expected.
        expected: &'static str,
        /// The page flags found.
        flags: u16,
    },
    /// The page is reachable along two paths.
    #[error("multiple references")]
    MultipleReferences,
    /// The page is reachable and also listed as free.
    #[error("reachable but freed")]
    ReachableFreed,
    /// The page is neither reachable nor free.
    #[error("unreachable and not freed")]
    UnreachableUnfreed,
    /// The freelist lists the page twice.
    #[error("freed twice")]
    AlreadyFreed,
    /// The freelist lists a page that cannot be free (a meta page, or one at
    /// or above the high-water mark).
    #[error("freelist entry out of range (high-water mark {high_water})")]
    FreedOutOfRange {
        /// The high-water mark.
        high_water: u64,
    },
    /// The freelist's count does not fit in its pages.
    #[error("freelist count {count} does not fit in {bytes} bytes")]
    FreelistCount {
        /// The count.
        count: u64,
        /// The room on the pages.
        bytes: u64,
    },
    /// The element table does not fit in the page.
    #[error("{count} elements do not fit in {bytes} bytes")]
    ElementTable {
        /// The element count.
        count: u16,
        /// The page run's size.
        bytes: usize,
    },
    /// An element's key or value lies outside the page.
    #[error("element {index} points outside the page")]
    ElementOutOfPage {
        /// The element's index.
        index: u16,
    },
    /// Keys are out of order.
    #[error("element {index}: key {key} {detail}")]
    KeyOrder {
        /// The element's index.
        index: u16,
        /// The key, hex (cut after 64 bytes).
        key: String,
        /// Which order rule it breaks.
        detail: &'static str,
    },
    /// A bucket value is too short for a bucket header.
    #[error("element {index}: bucket value of {len} bytes is too short")]
    BucketValue {
        /// The element's index.
        index: u16,
        /// The value's size.
        len: usize,
    },
    /// The meta page points at an impossible page.
    #[error("meta page: {0}")]
    Meta(&'static str),
    /// Pages and buckets nest deeper than any sane database (a cycle).
    #[error("nesting deeper than {0} levels")]
    TooDeep(usize),
}
