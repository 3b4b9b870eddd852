//! The consistency check, with the semantics of bbolt's `Tx.Check`:
//!
//! - no page is listed as free twice;
//! - every page a bucket reaches (with its overflow run) is below the
//!   high-water mark, reached only once, not free, and a branch or leaf page;
//! - keys are strictly increasing within a leaf, and every key of a subtree
//!   lies between the branch key that leads to it (inclusive) and the next
//!   one (exclusive);
//! - every page below the high-water mark is reachable (meta pages, freelist
//!   run, bucket pages) or free. Without a stored freelist (etcd's
//!   configuration), free means unreachable, as bbolt rebuilds it that way.
//!
//! A few checks bbolt leaves to chance are added: page headers must name the
//! page they are read from, element tables and elements must lie within
//! their page, inline buckets are checked like the others, and freelist
//! entries must be real pages.

use std::ops::Range;

use super::{
    BboltError, Bucket, Corruption, Db, FLAG_BRANCH, FLAG_FREELIST, FLAG_LEAF, FLAG_META, Hole,
    MAX_DEPTH, NO_FREELIST, Node, PAGE_HEADER_SIZE, PageSet, corrupt, le16, le32, le64, unexpected,
};

/// What a successful [`Db::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckSummary {
    /// The high-water mark: pages in use, including free ones.
    pub high_water: u64,
    /// The page size.
    pub page_size: u32,
    /// Pages reachable from the meta pages (meta, freelist, bucket pages).
    pub reachable_pages: u64,
    /// Free pages.
    pub free_pages: u64,
    /// Buckets, nested ones included (the root bucket is not counted).
    pub buckets: u64,
    /// Whether the database stores its freelist.
    pub freelist_stored: bool,
}

/// A value as the check shows it: its bytes, but for a part left unread
/// whose CRC-32C stands for it (the middle of a long run, see
/// [`Db::read_run_sparse`]).
#[derive(Debug, Clone)]
pub(crate) struct Value<'a> {
    /// The value's bytes; those in `unread` are not the file's.
    bytes: &'a [u8],
    /// The part not read, and its CRC.
    unread: Option<(Range<usize>, u32)>,
    /// The value's file offset (0 when it is not known: no part unread).
    offset: u64,
}

impl<'a> Value<'a> {
    /// A value read whole.
    pub(crate) fn whole(bytes: &'a [u8]) -> Value<'a> {
        Value {
            bytes,
            unread: None,
            offset: 0,
        }
    }

    /// A value whose bytes in `unread` were not read, their CRC-32C being
    /// `crc`.
    #[cfg(test)]
    pub(crate) fn with_unread(bytes: &'a [u8], unread: Range<usize>, crc: u32) -> Value<'a> {
        Value {
            bytes,
            unread: Some((unread, crc)),
            offset: 0,
        }
    }

    /// The part not read.
    #[cfg(test)]
    pub(crate) fn unread(&self) -> Option<Range<usize>> {
        self.unread.as_ref().map(|(range, _)| range.clone())
    }

    /// Its length.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Where it starts in the file (known for a value with a part unread).
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// The bytes at `range`, when they were read (`None` also when `range`
    /// lies past the end).
    pub(crate) fn get(&self, range: Range<usize>) -> Option<&'a [u8]> {
        if let Some((unread, _)) = &self.unread
            && range.start < unread.end
            && unread.start < range.end
        {
            return None;
        }
        self.bytes.get(range)
    }

    /// `crc` (a CRC-32C so far) extended by the value's bytes.
    pub(crate) fn crc32c_append(&self, crc: u32) -> u32 {
        match &self.unread {
            None => crc32c::crc32c_append(crc, self.bytes),
            Some((unread, unread_crc)) => {
                let head = crc32c::crc32c_append(crc, &self.bytes[..unread.start]);
                let joined = crc32c::crc32c_combine(head, *unread_crc, unread.len());
                crc32c::crc32c_append(joined, &self.bytes[unread.end..])
            }
        }
    }
}

/// How many freelist entries are read at a time.
const FREELIST_BATCH: usize = 8192;

/// What [`Db::check_visiting`] shows of the data as it checks it, in the
/// order a walk of the top-level buckets gives (bbolt's `Tx.ForEach`, then
/// each bucket's `ForEach`).
pub(crate) enum Visit<'k> {
    /// A top-level bucket; its entries follow.
    Bucket(&'k [u8]),
    /// An entry of the last top-level bucket: a value, or `None` for a
    /// nested bucket.
    Entry(&'k [u8], Option<Value<'k>>),
    /// A top-level entry that is not a bucket, on page `page`.
    RootValue { page: u64 },
}

impl Db {
    /// Checks the database's consistency (see the module docs); returns the
    /// first problem found.
    pub fn check(&self) -> Result<CheckSummary, BboltError> {
        self.check_visiting(None)
    }

    /// [`Db::check`], showing `visit` the top-level buckets and their
    /// entries on the way: the data is read once for both.
    pub(crate) fn check_visiting<'a>(
        &'a self,
        visit: Option<&'a mut (dyn FnMut(Visit<'_>) + 'a)>,
    ) -> Result<CheckSummary, BboltError> {
        let high_water = self.meta.high_water;
        let mut checker = Checker {
            visit,
            db: self,
            reachable: PageSet::new(high_water),
            freed: PageSet::new(high_water),
            path: Vec::new(),
            buckets: 0,
            pool: Vec::new(),
        };
        checker.reachable.insert(0);
        checker.reachable.insert(1);
        let mut header = [0u8; PAGE_HEADER_SIZE];
        self.read_at(self.offset(self.meta.page), &mut header)?;
        let flags = le16(&header, 8);
        if flags != FLAG_META {
            return Err(unexpected(self.meta.page, "meta", flags));
        }
        let freelist_stored = self.meta.freelist != NO_FREELIST;
        if freelist_stored {
            checker.load_freelist()?;
        }
        checker.check_tree(self.meta.root, None, None, 0)?;

        let mut reachable_pages = 0;
        let mut free_pages = 0;
        for id in 0..high_water {
            if checker.reachable.contains(id) {
                reachable_pages += 1;
            } else if checker.freed.contains(id) || !freelist_stored {
                free_pages += 1;
            } else {
                return Err(corrupt(id, Corruption::UnreachableUnfreed));
            }
        }
        Ok(CheckSummary {
            high_water,
            page_size: self.meta.page_size,
            reachable_pages,
            free_pages,
            buckets: checker.buckets,
            freelist_stored,
        })
    }
}

struct Checker<'a> {
    visit: Option<&'a mut (dyn FnMut(Visit<'_>) + 'a)>,
    db: &'a Db,
    reachable: PageSet,
    freed: PageSet,
    /// Names of the buckets being checked, outermost first.
    path: Vec<Vec<u8>>,
    buckets: u64,
    /// Read buffers, one per tree depth (see [`super::take_buffer`]).
    pool: Vec<Vec<u8>>,
}

impl Checker<'_> {
    /// Reads the freelist into `freed`, a batch of entries at a time, and
    /// marks its pages reachable.
    fn load_freelist(&mut self) -> Result<(), BboltError> {
        let db = self.db;
        let id = db.meta.freelist;
        let high_water = db.meta.high_water;
        let page_size = u64::from(db.meta.page_size);

        let mut header = [0u8; PAGE_HEADER_SIZE + 8];
        db.read_at(db.offset(id), &mut header)?;
        let found = le64(&header, 0);
        if found != id {
            return Err(corrupt(id, Corruption::IdMismatch { found }));
        }
        let flags = le16(&header, 8);
        if flags != FLAG_FREELIST {
            return Err(unexpected(id, "freelist", flags));
        }
        let last = id + u64::from(le32(&header, 12));
        if last >= high_water {
            return Err(corrupt(id, Corruption::OutOfBounds { last, high_water }));
        }
        let run = (last - id + 1) * page_size;
        let (start, count) = match le16(&header, 10) {
            0xFFFF => (PAGE_HEADER_SIZE as u64 + 8, le64(&header, PAGE_HEADER_SIZE)),
            n => (PAGE_HEADER_SIZE as u64, u64::from(n)),
        };
        let room = run - start;
        if count > room / 8 {
            return Err(corrupt(
                id,
                Corruption::FreelistCount { count, bytes: room },
            ));
        }

        let mut buf = vec![0u8; FREELIST_BATCH * 8];
        let mut done = 0u64;
        while done < count {
            let n = (count - done).min(FREELIST_BATCH as u64) as usize;
            let bytes = &mut buf[..n * 8];
            db.read_at(db.offset(id) + start + done * 8, bytes)?;
            for entry in bytes.chunks_exact(8) {
                let free = le64(entry, 0);
                if free < 2 || free >= high_water {
                    return Err(corrupt(free, Corruption::FreedOutOfRange { high_water }));
                }
                if !self.freed.insert(free) {
                    return Err(corrupt(free, Corruption::AlreadyFreed));
                }
            }
            done += n as u64;
        }

        for page in id..=last {
            if self.freed.contains(page) {
                return Err(corrupt(page, Corruption::ReachableFreed));
            }
            self.reachable.insert(page);
        }
        Ok(())
    }

    fn error(&self, page: u64, problem: Corruption) -> BboltError {
        let bucket = self
            .path
            .iter()
            .map(|name| name.escape_ascii().to_string())
            .collect::<Vec<_>>()
            .join("/");
        BboltError::Corrupt {
            page,
            bucket,
            problem,
        }
    }

    /// Adds the context of the bucket being checked to an error that lacks it.
    fn locate(&self, error: BboltError) -> BboltError {
        match error {
            BboltError::Corrupt {
                page,
                bucket,
                problem,
            } if bucket.is_empty() => self.error(page, problem),
            other => other,
        }
    }

    /// Checks the subtree at page `id`, whose keys must be `>= min` and
    /// `< max`.
    fn check_tree(
        &mut self,
        id: u64,
        min: Option<&[u8]>,
        max: Option<&[u8]>,
        depth: usize,
    ) -> Result<(), BboltError> {
        if depth > MAX_DEPTH {
            return Err(self.error(id, Corruption::TooDeep(MAX_DEPTH)));
        }
        let mut buf = super::take_buffer(&mut self.pool, depth);
        let checked = self.check_node(id, min, max, depth, &mut buf);
        self.pool[depth] = buf;
        checked
    }

    fn check_node(
        &mut self,
        id: u64,
        min: Option<&[u8]>,
        max: Option<&[u8]>,
        depth: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), BboltError> {
        // Allocates only for a run with parts left unread.
        let mut holes = Vec::new();
        let run = self
            .db
            .read_run_sparse(id, buf, &mut holes)
            .map_err(|e| self.locate(e))?;
        let buf = &mut buf[run];
        // Leave parts unread only when the walk needs nothing in them.
        if !Node::parse(id, buf).is_ok_and(|node| node.leaf_skips(&holes)) {
            for hole in holes.iter() {
                self.db.fill_hole(hole, buf).map_err(|e| self.locate(e))?;
            }
            holes.clear();
        }
        let buf = &*buf;
        let overflow = u64::from(le32(buf, 12));
        for page in id..=id + overflow {
            if !self.reachable.insert(page) {
                return Err(self.error(page, Corruption::MultipleReferences));
            }
            if self.freed.contains(page) {
                return Err(self.error(page, Corruption::ReachableFreed));
            }
        }
        let node = Node::parse(id, buf).map_err(|e| self.locate(e))?;
        match node.flags {
            FLAG_BRANCH => {
                for i in 0..node.count {
                    let (key, child) = node.branch(i).map_err(|e| self.locate(e))?;
                    if i == 0 && min.is_some_and(|m| m > key) {
                        return Err(self.order(id, i, key, "is below its ancestor's key"));
                    }
                    if max.is_some_and(|m| key >= m) {
                        return Err(self.order(id, i, key, "is not below the ancestor's next key"));
                    }
                    let next = if i + 1 < node.count {
                        Some(node.branch(i + 1).map_err(|e| self.locate(e))?.0)
                    } else {
                        max
                    };
                    self.check_tree(child, Some(key), next, depth + 1)?;
                }
                Ok(())
            }
            FLAG_LEAF => self.check_leaf(&node, &holes, min, max, depth),
            flags => Err(self.locate(unexpected(id, "branch or leaf", flags))),
        }
    }

    /// Checks key order in a leaf (a page of a bucket or an inline bucket)
    /// and checks the buckets it holds. `holes` are the parts of the page
    /// left unread, which [`Node::leaf_skips`].
    fn check_leaf(
        &mut self,
        node: &Node<'_>,
        holes: &[Hole],
        min: Option<&[u8]>,
        max: Option<&[u8]>,
        depth: usize,
    ) -> Result<(), BboltError> {
        let mut previous: Option<&[u8]> = None;
        for i in 0..node.count {
            let element = node.leaf(i).map_err(|e| self.locate(e))?;
            let key = element.key;
            let value = || {
                let mut value = Value::whole(element.value);
                if let Ok((_, _, span)) = node.leaf_spans(i)
                    && let Some(hole) = holes
                        .iter()
                        .find(|h| span.start <= h.range.start && span.end >= h.range.end)
                {
                    let start = hole.range.start - span.start;
                    value.unread = Some((start..start + hole.range.len(), hole.crc));
                    value.offset = hole.offset + span.start as u64;
                }
                value
            };
            match previous {
                None if min.is_some_and(|m| m > key) => {
                    return Err(self.order(node.page, i, key, "is below its ancestor's key"));
                }
                Some(p) if p > key => {
                    return Err(self.order(node.page, i, key, "is below the previous key"));
                }
                Some(p) if p == key => {
                    return Err(self.order(node.page, i, key, "repeats the previous key"));
                }
                _ => {}
            }
            if max.is_some_and(|m| key >= m) {
                return Err(self.order(node.page, i, key, "is not below the ancestor's next key"));
            }
            if let Some(visit) = self.visit.as_mut() {
                match (self.path.len(), element.is_bucket()) {
                    (0, true) => visit(Visit::Bucket(key)),
                    (0, false) => visit(Visit::RootValue { page: node.page }),
                    (1, true) => visit(Visit::Entry(key, None)),
                    (1, false) => visit(Visit::Entry(key, Some(value()))),
                    _ => {}
                }
            }
            if element.is_bucket() {
                let bucket =
                    Bucket::from_value(node.page, i, element.value).map_err(|e| self.locate(e))?;
                self.check_bucket(key, &bucket, depth + 1)?;
            }
            previous = Some(key);
        }
        Ok(())
    }

    /// Checks a nested bucket, whose tree starts at `depth`.
    fn check_bucket(
        &mut self,
        name: &[u8],
        bucket: &Bucket,
        depth: usize,
    ) -> Result<(), BboltError> {
        if depth > MAX_DEPTH {
            return Err(self.error(
                bucket
                    .inline
                    .as_ref()
                    .map_or(bucket.root, |(page, _)| *page),
                Corruption::TooDeep(MAX_DEPTH),
            ));
        }
        self.buckets += 1;
        self.path.push(name.to_vec());
        let result = match &bucket.inline {
            None => self.check_tree(bucket.root, None, None, depth),
            Some((page, data)) => match Node::parse(*page, data) {
                Ok(node) if node.flags == FLAG_LEAF => {
                    self.check_leaf(&node, &[], None, None, depth)
                }
                Ok(node) => Err(self.locate(unexpected(*page, "inline leaf", node.flags))),
                Err(e) => Err(self.locate(e)),
            },
        };
        self.path.pop();
        result
    }

    fn order(&self, page: u64, index: u16, key: &[u8], detail: &'static str) -> BboltError {
        let shown = &key[..key.len().min(64)];
        let mut hex = String::with_capacity(shown.len() * 2 + 3);
        for byte in shown {
            hex.push_str(&format!("{byte:02x}"));
        }
        if key.len() > shown.len() {
            hex.push_str("...");
        }
        self.error(
            page,
            Corruption::KeyOrder {
                index,
                key: hex,
                detail,
            },
        )
    }
}
