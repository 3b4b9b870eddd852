//! Page-level parsing: element tables, keys and values, page sets, fields.

use std::ops::Range;

use super::{BboltError, Corruption, ELEMENT_SIZE, FLAG_BRANCH, FLAG_LEAF, Hole, PAGE_HEADER_SIZE};

const BUCKET_LEAF_FLAG: u32 = 0x01;

/// FNV-1a, 64 bits.
pub(crate) fn fnv1a64(data: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in data {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// A parsed branch or leaf page (or an inline bucket's page), with its
/// element table checked to fit.
pub(crate) struct Node<'a> {
    pub(crate) page: u64,
    pub(crate) flags: u16,
    pub(crate) count: u16,
    data: &'a [u8],
}

pub(crate) struct LeafElement<'a> {
    flags: u32,
    pub(crate) key: &'a [u8],
    pub(crate) value: &'a [u8],
}

impl LeafElement<'_> {
    pub(crate) fn is_bucket(&self) -> bool {
        self.flags & BUCKET_LEAF_FLAG != 0
    }
}

impl<'a> Node<'a> {
    /// Parses the header of the page in `data`; `page` is used in errors.
    pub(crate) fn parse(page: u64, data: &'a [u8]) -> Result<Node<'a>, BboltError> {
        if data.len() < PAGE_HEADER_SIZE {
            return Err(corrupt(
                page,
                Corruption::ElementTable {
                    count: 0,
                    bytes: data.len(),
                },
            ));
        }
        let flags = le16(data, 8);
        let count = le16(data, 10);
        if flags == FLAG_BRANCH || flags == FLAG_LEAF {
            let table = PAGE_HEADER_SIZE + usize::from(count) * ELEMENT_SIZE;
            if table > data.len() {
                return Err(corrupt(
                    page,
                    Corruption::ElementTable {
                        count,
                        bytes: data.len(),
                    },
                ));
            }
        }
        Ok(Node {
            page,
            flags,
            count,
            data,
        })
    }

    /// Branch element `index` (< count): its key and child page.
    pub(crate) fn branch(&self, index: u16) -> Result<(&'a [u8], u64), BboltError> {
        let at = PAGE_HEADER_SIZE + usize::from(index) * ELEMENT_SIZE;
        let pos = le32(self.data, at) as usize;
        let ksize = le32(self.data, at + 4) as usize;
        let child = le64(self.data, at + 8);
        let key = self.slice(index, at, pos, ksize)?;
        Ok((key, child))
    }

    /// Leaf element `index` (< count).
    pub(crate) fn leaf(&self, index: u16) -> Result<LeafElement<'a>, BboltError> {
        let (flags, key, value) = self.leaf_spans(index)?;
        Ok(LeafElement {
            flags,
            key: &self.data[key],
            value: &self.data[value],
        })
    }

    /// Leaf element `index` (< count): its flags and where its key and value
    /// are in the page, checked to lie in it.
    pub(crate) fn leaf_spans(
        &self,
        index: u16,
    ) -> Result<(u32, Range<usize>, Range<usize>), BboltError> {
        let at = PAGE_HEADER_SIZE + usize::from(index) * ELEMENT_SIZE;
        let flags = le32(self.data, at);
        let pos = le32(self.data, at + 4) as usize;
        let ksize = le32(self.data, at + 8) as usize;
        let vsize = le32(self.data, at + 12) as usize;
        let key = self.span(index, at, pos, ksize)?;
        let value = self.span(index, at, pos.saturating_add(ksize), vsize)?;
        Ok((flags, key, value))
    }

    /// Whether the walk of this leaf needs nothing in `holes` (parts of the
    /// page, in order) but the CRC of their bytes: the element table ends
    /// before the first, no key reaches into any, and a value that reaches
    /// into one spans it whole and reaches into no other (and is no
    /// bucket). Elements that do not fit the page answer `false` (the full
    /// read reports them).
    pub(crate) fn leaf_skips(&self, holes: &[Hole]) -> bool {
        let table = PAGE_HEADER_SIZE + usize::from(self.count) * ELEMENT_SIZE;
        let Some(first) = holes.first() else {
            return true;
        };
        if self.flags != FLAG_LEAF || table > first.range.start {
            return false;
        }
        let touched = |span: Range<usize>| {
            holes
                .iter()
                .filter(move |h| span.start < h.range.end && h.range.start < span.end)
        };
        (0..self.count).all(|i| match self.leaf_spans(i) {
            Ok((flags, key, value)) => {
                let mut in_value = touched(value.clone());
                touched(key).next().is_none()
                    && match (in_value.next(), in_value.next()) {
                        (None, _) => true,
                        (Some(hole), None) => {
                            flags & BUCKET_LEAF_FLAG == 0
                                && value.start <= hole.range.start
                                && value.end >= hole.range.end
                        }
                        (Some(_), Some(_)) => false,
                    }
            }
            Err(_) => false,
        })
    }

    /// `len` bytes at `pos` from the element at `at`, checked to lie in the
    /// page.
    fn slice(&self, index: u16, at: usize, pos: usize, len: usize) -> Result<&'a [u8], BboltError> {
        Ok(&self.data[self.span(index, at, pos, len)?])
    }

    fn span(
        &self,
        index: u16,
        at: usize,
        pos: usize,
        len: usize,
    ) -> Result<Range<usize>, BboltError> {
        at.checked_add(pos)
            .and_then(|start| Some(start..start.checked_add(len)?))
            .filter(|range| range.end <= self.data.len())
            .ok_or_else(|| corrupt(self.page, Corruption::ElementOutOfPage { index }))
    }
}

/// A set of page ids below a bound, one bit each.
pub(crate) struct PageSet {
    words: Vec<u64>,
    bound: u64,
}

impl PageSet {
    /// An empty set for ids below `bound` (bounded by the file size at open).
    pub(crate) fn new(bound: u64) -> PageSet {
        PageSet {
            words: vec![0; bound.div_ceil(64) as usize],
            bound,
        }
    }

    /// Adds `id` (below the bound); false if it was already there.
    pub(crate) fn insert(&mut self, id: u64) -> bool {
        if id >= self.bound {
            return false;
        }
        let (word, bit) = ((id / 64) as usize, 1u64 << (id % 64));
        match self.words.get_mut(word) {
            Some(w) => {
                let new = *w & bit == 0;
                *w |= bit;
                new
            }
            None => false,
        }
    }

    pub(crate) fn contains(&self, id: u64) -> bool {
        if id >= self.bound {
            return false;
        }
        let (word, bit) = ((id / 64) as usize, 1u64 << (id % 64));
        self.words.get(word).is_some_and(|w| w & bit != 0)
    }
}

pub(crate) fn corrupt(page: u64, problem: Corruption) -> BboltError {
    BboltError::Corrupt {
        page,
        bucket: String::new(),
        problem,
    }
}

pub(crate) fn unexpected(page: u64, expected: &'static str, flags: u16) -> BboltError {
    corrupt(page, Corruption::UnexpectedType { expected, flags })
}

// Little-endian field readers. Callers pass offsets already checked against
// the slice (fixed headers of fixed-size buffers, or element tables checked
// in `Node::parse`).
pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_reference_values() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// A leaf run of `len` bytes whose elements (flags, key size, value
    /// size) are packed after the table.
    fn leaf_run(len: usize, elements: &[(u32, u32, u32)]) -> Vec<u8> {
        let mut data = vec![0u8; len];
        data[8..10].copy_from_slice(&FLAG_LEAF.to_le_bytes());
        data[10..12].copy_from_slice(&(elements.len() as u16).to_le_bytes());
        let mut pos = PAGE_HEADER_SIZE + ELEMENT_SIZE * elements.len();
        for (i, &(flags, ksize, vsize)) in elements.iter().enumerate() {
            let at = PAGE_HEADER_SIZE + ELEMENT_SIZE * i;
            data[at..at + 4].copy_from_slice(&flags.to_le_bytes());
            data[at + 4..at + 8].copy_from_slice(&((pos - at) as u32).to_le_bytes());
            data[at + 8..at + 12].copy_from_slice(&ksize.to_le_bytes());
            data[at + 12..at + 16].copy_from_slice(&vsize.to_le_bytes());
            pos += (ksize + vsize) as usize;
        }
        data
    }

    /// Holes at the given (start, end) pairs.
    fn holes(ranges: &[(usize, usize)]) -> Vec<Hole> {
        ranges
            .iter()
            .map(|&(start, end)| Hole {
                range: start..end,
                crc: 0,
                offset: 0,
            })
            .collect()
    }

    #[test]
    fn a_leaf_skips_holes_only_inside_single_values() {
        // Two values of 40,000 bytes after keys of 17 bytes: the table ends
        // at 48, the first value at 40,065, the second at 80,082.
        let run = leaf_run(24 * 4096, &[(0, 17, 40_000), (0, 17, 40_000)]);
        let node = Node::parse(7, &run).unwrap();
        let (_, _, v0) = node.leaf_spans(0).unwrap();
        let (_, k1, v1) = node.leaf_spans(1).unwrap();
        assert_eq!((v0, k1, v1), (65..40_065, 40_065..40_082, 40_082..80_082));
        assert!(node.leaf_skips(&[]));
        assert!(node.leaf_skips(&holes(&[(4096, 36_864)])));
        assert!(node.leaf_skips(&holes(&[(4096, 36_864), (40_960, 77_824)])));
        // The second key lies in the hole.
        assert!(!node.leaf_skips(&holes(&[(36_864, 40_960 + 4096)])));
        // Half in a value, half out of it.
        assert!(!node.leaf_skips(&holes(&[(77_824, 86_016)])));
        // One value over two holes.
        assert!(!node.leaf_skips(&holes(&[(4096, 8192), (12_288, 16_384)])));
        // The element table reaching into a hole.
        assert!(!node.leaf_skips(&holes(&[(0, 4096)])));

        // A bucket's value is read whatever its size.
        let run = leaf_run(24 * 4096, &[(1, 17, 40_000)]);
        let node = Node::parse(7, &run).unwrap();
        assert!(!node.leaf_skips(&holes(&[(4096, 8192)])));
        // An element beyond the page is left to the full read to report.
        let run = leaf_run(4 * 4096, &[(0, 17, 40_000)]);
        let node = Node::parse(7, &run).unwrap();
        assert!(!node.leaf_skips(&holes(&[(4096, 8192)])));
        // So is a branch page.
        let mut run = leaf_run(24 * 4096, &[(0, 17, 40_000)]);
        run[8..10].copy_from_slice(&FLAG_BRANCH.to_le_bytes());
        let node = Node::parse(7, &run).unwrap();
        assert!(!node.leaf_skips(&holes(&[(4096, 8192)])));
    }

    #[test]
    fn page_set() {
        let mut s = PageSet::new(130);
        assert!(s.insert(0));
        assert!(s.insert(129));
        assert!(!s.insert(129));
        assert!(s.contains(129) && !s.contains(128));
        assert!(!s.insert(130), "out of bound ids are never inserted");
        assert!(!s.contains(130));
    }
}
