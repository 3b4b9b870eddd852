//! A read-only reader for bbolt database files, the storage format of etcd's
//! backend (an etcd snapshot is a bbolt file followed by a sha256 trailer).
//!
//! Pages are read with positioned reads (`pread`), one page or one overflow
//! run at a time, never mapped: mapped file pages would count in the
//! process's resident memory, and memory has to stay flat for databases of
//! many GiB. Bookkeeping is two bitsets of one bit per page.
//!
//! On-disk layout (all integers little-endian):
//!
//! - every page starts with a 16-byte header: page id `u64`, flags `u16`
//!   (branch 0x01, leaf 0x02, meta 0x04, freelist 0x10), element count `u16`,
//!   number of overflow pages `u32`; a page with overflow continues over the
//!   following `overflow` pages;
//! - pages 0 and 1 are meta pages: magic `u32` (0xED0CDAED), version `u32`
//!   (2), page size `u32`, flags `u32`, root bucket (root page `u64`,
//!   sequence `u64`), freelist page `u64` (all ones when the freelist is not
//!   stored), high-water page id `u64`, transaction id `u64`, and a FNV-1a
//!   64 checksum of the preceding 56 bytes. The valid one with the higher
//!   transaction id is current;
//! - branch elements are 16 bytes: key offset `u32` (from the element
//!   itself), key size `u32`, child page `u64`;
//! - leaf elements are 16 bytes: flags `u32` (0x01: the value is a bucket),
//!   key offset `u32`, key size `u32`, value size `u32`; the value follows the
//!   key;
//! - a bucket value is a 16-byte header (root page `u64`, sequence `u64`);
//!   root 0 means an inline bucket whose leaf page follows the header;
//! - a freelist page lists free page ids as `u64`s; a count of 0xFFFF means
//!   the real count is the first `u64` and the ids follow it.
//!
//! [`Db::check`] (in the `check` submodule) mirrors bbolt's `Tx.Check`.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

mod check;
mod error;
mod page;

pub use check::CheckSummary;
pub(crate) use check::{Value, Visit};
pub use error::{BboltError, Corruption, MetaProblem};

use super::direct::{self, BulkSums};
use page::{Node, PageSet, corrupt, fnv1a64, le16, le32, le64, unexpected};

/// The magic number of a bbolt meta page.
pub const MAGIC: u32 = 0xED0C_DAED;
/// The only bbolt data format version there is.
pub const VERSION: u32 = 2;
/// The freelist page id of a database that does not store its freelist
/// (bbolt's `NoFreelistSync`, which etcd uses): free pages are then all pages
/// below the high-water mark that no bucket reaches.
pub const NO_FREELIST: u64 = u64::MAX;
/// Smallest page size accepted.
pub const MIN_PAGE_SIZE: u32 = 512;
/// Largest page size accepted (the largest bbolt probes for).
pub const MAX_PAGE_SIZE: u32 = 16 << 20;

const PAGE_HEADER_SIZE: usize = 16;
const ELEMENT_SIZE: usize = 16;
const META_SIZE: usize = 64;
const META_CHECKSUM_OFFSET: usize = 56;
const BUCKET_HEADER_SIZE: usize = 16;

pub(crate) const FLAG_BRANCH: u16 = 0x01;
pub(crate) const FLAG_LEAF: u16 = 0x02;
pub(crate) const FLAG_META: u16 = 0x04;
pub(crate) const FLAG_FREELIST: u16 = 0x10;

/// How many levels of pages (branch levels of a bucket's tree, plus the
/// trees of the buckets it is nested in) are followed before the structure
/// is taken for a cycle. Real trees are a handful of levels deep; the bound
/// keeps recursion far from the stack's limit.
const MAX_DEPTH: usize = 64;

/// The current meta page of a database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// Which meta page (0 or 1) is current.
    pub page: u64,
    /// The page size.
    pub page_size: u32,
    /// Meta flags.
    pub flags: u32,
    /// The root bucket's root page.
    pub root: u64,
    /// The root bucket's sequence.
    pub root_sequence: u64,
    /// The freelist page, or [`NO_FREELIST`].
    pub freelist: u64,
    /// The high-water mark: the number of pages in use.
    pub high_water: u64,
    /// The transaction id that wrote this meta page.
    pub txid: u64,
}

/// A bucket: where its B+tree is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    root: u64,
    sequence: u64,
    /// For an inline bucket: the leaf page that holds it and the inline page.
    inline: Option<(u64, Box<[u8]>)>,
}

impl Bucket {
    /// The root page, or `None` for an inline bucket.
    pub fn root_page(&self) -> Option<u64> {
        (self.inline.is_none()).then_some(self.root)
    }

    /// The bucket's sequence number.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Whether the bucket is stored inline in its parent's leaf.
    pub fn is_inline(&self) -> bool {
        self.inline.is_some()
    }

    fn from_value(page: u64, index: u16, value: &[u8]) -> Result<Bucket, BboltError> {
        if value.len() < BUCKET_HEADER_SIZE {
            return Err(corrupt(
                page,
                Corruption::BucketValue {
                    index,
                    len: value.len(),
                },
            ));
        }
        let root = le64(value, 0);
        let sequence = le64(value, 8);
        let inline = (root == 0).then(|| (page, value[BUCKET_HEADER_SIZE..].into()));
        Ok(Bucket {
            root,
            sequence,
            inline,
        })
    }
}

/// One entry of a bucket, as [`Db::for_each`] yields it.
#[derive(Debug)]
pub enum Entry<'a> {
    /// A plain value.
    Value(&'a [u8]),
    /// A nested bucket.
    Bucket(Bucket),
}

/// A source of positioned reads other than a plain file: for example a
/// spool that keeps the database encrypted at rest and decrypts what is
/// read ([`Db::from_reader`]).
pub trait ReadAt: Send + Sync {
    /// Fills `buf` with the bytes at `offset`, or fails.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

/// An open bbolt database (read-only).
pub struct Db {
    file: Box<dyn ReadAt>,
    len: u64,
    meta: Meta,
    /// The file opened for direct I/O: long overflow runs are read with it,
    /// around the page cache (see `snapshot::direct`).
    pub(crate) direct: Option<File>,
    /// Set once the file system refuses a direct read.
    direct_refused: AtomicBool,
    /// The CRC of bulk ranges as they were written: the check leaves those
    /// bytes unread where it only needs their CRC.
    pub(crate) sums: BulkSums,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("len", &self.len)
            .field("meta", &self.meta)
            .field("direct", &self.direct)
            .finish_non_exhaustive()
    }
}

impl Db {
    /// Opens the file at `path`, treating its first `len` bytes as the
    /// database (for an etcd snapshot: the file size less the 32-byte
    /// trailer), and reads the current meta page.
    pub fn open(path: &Path, len: u64) -> Result<Db, BboltError> {
        let file = File::open(path).map_err(|source| BboltError::Open {
            path: path.to_owned(),
            source,
        })?;
        Db::from_file(file, len)
    }

    /// Like [`Db::open`], with a file already open for reading.
    pub fn from_file(file: File, len: u64) -> Result<Db, BboltError> {
        let actual = file
            .metadata()
            .map_err(|source| BboltError::Io { offset: 0, source })?
            .len();
        if actual < len {
            return Err(BboltError::FileTooShort {
                actual,
                expected: len,
            });
        }
        Db::from_reader(Box::new(file), len)
    }

    /// Opens the first `len` bytes that `reader` holds (it must hold at
    /// least that many) as a database, and reads the current meta page.
    pub fn from_reader(reader: Box<dyn ReadAt>, len: u64) -> Result<Db, BboltError> {
        let mut db = Db {
            file: reader,
            len,
            direct: None,
            direct_refused: AtomicBool::new(false),
            sums: BulkSums::default(),
            meta: Meta {
                page: 0,
                page_size: 0,
                flags: 0,
                root: 0,
                root_sequence: 0,
                freelist: 0,
                high_water: 0,
                txid: 0,
            },
        };
        db.meta = db.load_meta()?;
        Ok(db)
    }

    /// The current meta page.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// The page size.
    pub fn page_size(&self) -> u32 {
        self.meta.page_size
    }

    /// The database size as bbolt reports it (`Tx.Size`): high-water mark
    /// times page size.
    pub fn size(&self) -> u64 {
        // Cannot overflow: checked against the length when opening.
        self.meta.high_water * u64::from(self.meta.page_size)
    }

    /// The root bucket, whose entries are the top-level buckets.
    pub fn root_bucket(&self) -> Bucket {
        Bucket {
            root: self.meta.root,
            sequence: self.meta.root_sequence,
            inline: None,
        }
    }

    /// Calls `f` with each entry of `bucket`, in key order. Stops at the
    /// first error, the callback's or the reader's. The walk refuses to visit
    /// a page twice, so it ends even on a damaged file; run [`Db::check`]
    /// first for a full consistency check.
    pub fn for_each<E, F>(&self, bucket: &Bucket, mut f: F) -> Result<(), E>
    where
        E: From<BboltError>,
        F: FnMut(&[u8], Entry<'_>) -> Result<(), E>,
    {
        match &bucket.inline {
            Some((page, data)) => {
                let node = Node::parse(*page, data)?;
                if node.flags != FLAG_LEAF {
                    return Err(unexpected(*page, "inline leaf", node.flags).into());
                }
                self.visit_leaf(&node, &mut f)
            }
            None => {
                let mut visited = PageSet::new(self.meta.high_water);
                self.walk(bucket.root, 0, &mut visited, &mut Vec::new(), &mut f)
            }
        }
    }

    /// Calls `f` with the name and handle of each top-level bucket, in order.
    /// A top-level entry that is not a bucket is corruption.
    pub fn for_each_bucket<E, F>(&self, mut f: F) -> Result<(), E>
    where
        E: From<BboltError>,
        F: FnMut(&[u8], Bucket) -> Result<(), E>,
    {
        let root = self.root_bucket();
        self.for_each(&root, |name, entry| match entry {
            Entry::Bucket(bucket) => f(name, bucket),
            Entry::Value(_) => Err(BboltError::Corrupt {
                page: self.meta.root,
                bucket: String::new(),
                problem: Corruption::UnexpectedType {
                    expected: "bucket entry in the root",
                    flags: 0,
                },
            }
            .into()),
        })
    }

    fn walk<E, F>(
        &self,
        id: u64,
        depth: usize,
        visited: &mut PageSet,
        pool: &mut Vec<Vec<u8>>,
        f: &mut F,
    ) -> Result<(), E>
    where
        E: From<BboltError>,
        F: FnMut(&[u8], Entry<'_>) -> Result<(), E>,
    {
        if depth > MAX_DEPTH {
            return Err(corrupt(id, Corruption::TooDeep(MAX_DEPTH)).into());
        }
        let mut buf = take_buffer(pool, depth);
        let walked = self.walk_node(id, depth, &mut buf, visited, pool, f);
        pool[depth] = buf;
        walked
    }

    fn walk_node<E, F>(
        &self,
        id: u64,
        depth: usize,
        buf: &mut Vec<u8>,
        visited: &mut PageSet,
        pool: &mut Vec<Vec<u8>>,
        f: &mut F,
    ) -> Result<(), E>
    where
        E: From<BboltError>,
        F: FnMut(&[u8], Entry<'_>) -> Result<(), E>,
    {
        let node = self.read_node(id, buf)?;
        if !visited.insert(id) {
            return Err(corrupt(id, Corruption::MultipleReferences).into());
        }
        match node.flags {
            FLAG_BRANCH => {
                for i in 0..node.count {
                    let (_, child) = node.branch(i)?;
                    self.walk(child, depth + 1, visited, pool, f)?;
                }
                Ok(())
            }
            FLAG_LEAF => self.visit_leaf(&node, f),
            flags => Err(unexpected(id, "branch or leaf", flags).into()),
        }
    }

    fn visit_leaf<E, F>(&self, node: &Node<'_>, f: &mut F) -> Result<(), E>
    where
        E: From<BboltError>,
        F: FnMut(&[u8], Entry<'_>) -> Result<(), E>,
    {
        for i in 0..node.count {
            let element = node.leaf(i)?;
            let entry = if element.is_bucket() {
                Entry::Bucket(Bucket::from_value(node.page, i, element.value)?)
            } else {
                Entry::Value(element.value)
            };
            f(element.key, entry)?;
        }
        Ok(())
    }

    /// Reads page `id` (with its overflow pages) into `buf` and parses it.
    fn read_node<'b>(&self, id: u64, buf: &'b mut Vec<u8>) -> Result<Node<'b>, BboltError> {
        let run = self.read_run(id, buf)?;
        Node::parse(id, &buf[run])
    }

    /// Reads page `id` and its overflow run into `buf`, after checking that
    /// the run lies below the high-water mark (and so within the file);
    /// returns where in `buf` the run is. `buf` only grows: reused for every
    /// page, it is neither allocated nor zeroed again.
    pub(crate) fn read_run(&self, id: u64, buf: &mut Vec<u8>) -> Result<Range<usize>, BboltError> {
        let run = self.read_first_page(id, buf)?;
        self.read_continuation(id, buf, run)
    }

    /// Like [`Db::read_run`], but leaves out the parts of the run that
    /// [`Db::sums`] has the CRC of, listed in `holes` (run-relative, in
    /// order): they hold whatever `buf` held before. Fill them with
    /// [`Db::fill_hole`] to look into them.
    pub(crate) fn read_run_sparse(
        &self,
        id: u64,
        buf: &mut Vec<u8>,
        holes: &mut Vec<Hole>,
    ) -> Result<Range<usize>, BboltError> {
        holes.clear();
        let run = self.read_first_page(id, buf)?;
        let page_size = self.meta.page_size as usize;
        let offset = self.offset(id);
        if run > 2 * page_size {
            let middle = offset + page_size as u64..offset + (run - page_size) as u64;
            holes.extend(self.sums.within(&middle).map(|(range, crc)| Hole {
                range: (range.start - offset) as usize..(range.end - offset) as usize,
                crc,
                offset,
            }));
        }
        if holes.is_empty() {
            return self.read_continuation(id, buf, run);
        }
        // The parts around the holes were written through the page cache.
        grow(buf, run);
        let mut at = page_size;
        for hole in holes.iter() {
            self.read_at(offset + at as u64, &mut buf[at..hole.range.start])?;
            at = hole.range.end;
        }
        self.read_at(offset + at as u64, &mut buf[at..run])?;
        Ok(0..run)
    }

    /// Reads a part of a run that [`Db::read_run_sparse`] left out; `run`
    /// is the run's bytes.
    pub(crate) fn fill_hole(&self, hole: &Hole, run: &mut [u8]) -> Result<(), BboltError> {
        let range = hole.range.clone();
        self.read_bulk(hole.offset + range.start as u64, &mut run[range])
    }

    /// Reads bulk bytes at `offset`: direct when the file is open for it
    /// and the request is aligned, else through the page cache.
    fn read_bulk(&self, offset: u64, bytes: &mut [u8]) -> Result<(), BboltError> {
        let aligned = |n: usize| n.is_multiple_of(direct::ALIGN);
        if let Some(direct) = &self.direct
            && !self.direct_refused.load(Ordering::Relaxed)
            && !bytes.is_empty()
            && aligned(bytes.len())
            && aligned(bytes.as_ptr().addr())
            && offset.is_multiple_of(direct::ALIGN as u64)
        {
            match FileExt::read_exact_at(direct, bytes, offset) {
                Ok(()) => return Ok(()),
                Err(e) if direct::refused(&e) => self.direct_refused.store(true, Ordering::Relaxed),
                Err(source) => return Err(BboltError::Io { offset, source }),
            }
        }
        self.read_at(offset, bytes)
    }

    /// Reads the bytes of `value` from the file into `buf`.
    pub(crate) fn read_value<'b>(
        &self,
        value: &Value<'_>,
        buf: &'b mut Vec<u8>,
    ) -> Result<&'b [u8], BboltError> {
        grow(buf, value.len());
        let bytes = &mut buf[..value.len()];
        self.read_at(value.offset(), bytes)?;
        Ok(bytes)
    }

    /// Reads the first page of page `id`'s run into `buf` and checks that
    /// the run lies below the high-water mark (and so within the file);
    /// returns the run's length.
    fn read_first_page(&self, id: u64, buf: &mut Vec<u8>) -> Result<usize, BboltError> {
        let high_water = self.meta.high_water;
        if id >= high_water {
            return Err(corrupt(
                id,
                Corruption::OutOfBounds {
                    last: id,
                    high_water,
                },
            ));
        }
        let page_size = self.meta.page_size as usize;
        grow(buf, page_size);
        self.read_at(self.offset(id), &mut buf[..page_size])?;
        let found = le64(buf, 0);
        if found != id {
            return Err(corrupt(id, Corruption::IdMismatch { found }));
        }
        let overflow = u64::from(le32(buf, 12));
        let last = id + overflow; // id < 2^63 here: high_water * page_size fits in u64
        if last >= high_water {
            return Err(corrupt(id, Corruption::OutOfBounds { last, high_water }));
        }
        // The run is below the high-water mark, so within the length
        // checked at open time: the allocation is bounded by the file.
        usize::try_from((overflow + 1) * u64::from(self.meta.page_size))
            .map_err(|_| corrupt(id, Corruption::OutOfBounds { last, high_water }))
    }

    /// Reads the rest of the run of `run` bytes whose first page is in
    /// `buf` (from [`Db::read_first_page`]); returns where in `buf` the run
    /// is.
    fn read_continuation(
        &self,
        id: u64,
        buf: &mut Vec<u8>,
        run: usize,
    ) -> Result<Range<usize>, BboltError> {
        let page_size = self.meta.page_size as usize;
        if run == page_size {
            return Ok(0..page_size);
        }
        let rest = self.offset(id + 1);
        let continuation = run - page_size;
        if self.direct.is_some()
            && !self.direct_refused.load(Ordering::Relaxed)
            && continuation as u64 >= direct::DIRECT_MIN
            && continuation.is_multiple_of(direct::ALIGN)
        {
            let start = align_run(buf, page_size, run);
            self.read_bulk(rest, &mut buf[start + page_size..start + run])?;
            return Ok(start..start + run);
        }
        grow(buf, run);
        self.read_at(rest, &mut buf[page_size..run])?;
        Ok(0..run)
    }

    fn offset(&self, id: u64) -> u64 {
        id * u64::from(self.meta.page_size)
    }

    pub(crate) fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BboltError> {
        ReadAt::read_exact_at(&*self.file, buf, offset)
            .map_err(|source| BboltError::Io { offset, source })
    }

    fn load_meta(&self) -> Result<Meta, BboltError> {
        // Find the page size: from the first meta page if it is valid, else by
        // probing for the second one at each possible page size.
        let first = self.read_meta_at(0)?;
        let mut second = MetaProblem::Missing;
        let page_size = match first {
            Ok(meta) => Some(meta.page_size),
            Err(_) => {
                let mut found = None;
                for shift in 0..=14u32 {
                    let pos = 1024u64 << shift;
                    if pos.saturating_add(1024) >= self.len {
                        break;
                    }
                    match self.read_meta_at(pos)? {
                        Ok(meta) => {
                            found = Some(meta.page_size);
                            break;
                        }
                        // Report what is at the usual 4 KiB page size.
                        Err(problem) if pos == 4096 => second = problem,
                        Err(_) => {}
                    }
                }
                found
            }
        };
        let Some(page_size) = page_size else {
            return Err(BboltError::NoValidMeta {
                meta0: first.err().unwrap_or(MetaProblem::Missing),
                meta1: second,
            });
        };
        if !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size) {
            return Err(BboltError::PageSize(page_size));
        }
        let meta0 = self.read_meta_at(0)?.map(|m| Meta { page: 0, ..m });
        let meta1 = self
            .read_meta_at(u64::from(page_size))?
            .map(|m| Meta { page: 1, ..m });
        let meta = match (meta0, meta1) {
            (Ok(a), Ok(b)) => {
                if b.txid > a.txid {
                    b
                } else {
                    a
                }
            }
            (Ok(a), Err(_)) => a,
            (Err(_), Ok(b)) => b,
            (Err(meta0), Err(meta1)) => return Err(BboltError::NoValidMeta { meta0, meta1 }),
        };
        if meta.page_size != page_size {
            return Err(BboltError::PageSize(meta.page_size));
        }
        let needed = meta
            .high_water
            .checked_mul(u64::from(page_size))
            .filter(|&n| n <= self.len);
        if needed.is_none() {
            return Err(BboltError::Truncated {
                high_water: meta.high_water,
                page_size,
                len: self.len,
            });
        }
        let bad = |what| Err(corrupt(meta.page, Corruption::Meta(what)));
        if meta.high_water < 3 {
            return bad("high-water mark below 3");
        }
        if meta.root < 2 || meta.root >= meta.high_water {
            return bad("root page out of range");
        }
        if meta.freelist != NO_FREELIST && (meta.freelist < 2 || meta.freelist >= meta.high_water) {
            return bad("freelist page out of range");
        }
        Ok(meta)
    }

    /// Reads and validates the meta page at `offset`: `Ok(Err(_))` when the
    /// page is readable but invalid.
    fn read_meta_at(&self, offset: u64) -> Result<Result<Meta, MetaProblem>, BboltError> {
        let size = (PAGE_HEADER_SIZE + META_SIZE) as u64;
        if offset.saturating_add(size) > self.len {
            return Ok(Err(MetaProblem::Missing));
        }
        let mut buf = [0u8; PAGE_HEADER_SIZE + META_SIZE];
        self.read_at(offset, &mut buf)?;
        Ok(parse_meta(&buf[PAGE_HEADER_SIZE..]))
    }
}

/// Validates a meta struct (64 bytes) and decodes it.
fn parse_meta(m: &[u8]) -> Result<Meta, MetaProblem> {
    let magic = le32(m, 0);
    if magic != MAGIC {
        return Err(MetaProblem::Magic(magic));
    }
    let version = le32(m, 4);
    if version != VERSION {
        return Err(MetaProblem::Version(version));
    }
    let stored = le64(m, META_CHECKSUM_OFFSET);
    let computed = fnv1a64(&m[..META_CHECKSUM_OFFSET]);
    if stored != computed {
        return Err(MetaProblem::Checksum { stored, computed });
    }
    Ok(Meta {
        page: 0,
        page_size: le32(m, 8),
        flags: le32(m, 12),
        root: le64(m, 16),
        root_sequence: le64(m, 24),
        freelist: le64(m, 32),
        high_water: le64(m, 40),
        txid: le64(m, 48),
    })
}

/// A part of a run that [`Db::read_run_sparse`] did not read.
#[derive(Debug, Clone)]
pub(crate) struct Hole {
    /// Where in the run.
    pub(crate) range: Range<usize>,
    /// The CRC-32C of the bytes there.
    pub(crate) crc: u32,
    /// The file offset of the run.
    pub(crate) offset: u64,
}

/// Makes room in `buf` for a run of `run` bytes at an address aligned for
/// direct I/O (page sizes are multiples of the alignment, so every page of
/// the run is aligned too) and moves the first page, read at the start of
/// `buf`, there; returns where the run starts.
fn align_run(buf: &mut Vec<u8>, page_size: usize, run: usize) -> usize {
    grow(buf, run + direct::ALIGN);
    let start = direct::aligned_start(buf);
    buf.copy_within(..page_size, start);
    start
}

/// Makes `buf` at least `len` long; only the added bytes are zeroed.
fn grow(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0);
    }
}

/// The read buffer of tree depth `depth` (a node's buffer stays in use
/// while its children are read), taken out of `pool`; put it back at the
/// same index.
pub(crate) fn take_buffer(pool: &mut Vec<Vec<u8>>, depth: usize) -> Vec<u8> {
    if pool.len() <= depth {
        pool.resize_with(depth + 1, Vec::new);
    }
    std::mem::take(&mut pool[depth])
}
