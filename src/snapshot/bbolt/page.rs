//! Page-level parsing: element tables, keys and values, page sets, fields.

use super::{BboltError, Corruption, ELEMENT_SIZE, FLAG_BRANCH, FLAG_LEAF, PAGE_HEADER_SIZE};

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
        let at = PAGE_HEADER_SIZE + usize::from(index) * ELEMENT_SIZE;
        let flags = le32(self.data, at);
        let pos = le32(self.data, at + 4) as usize;
        let ksize = le32(self.data, at + 8) as usize;
        let vsize = le32(self.data, at + 12) as usize;
        let key = self.slice(index, at, pos, ksize)?;
        let value = self.slice(index, at, pos.saturating_add(ksize), vsize)?;
        Ok(LeafElement { flags, key, value })
    }

    /// `len` bytes at `pos` from the element at `at`, checked to lie in the
    /// page.
    fn slice(&self, index: u16, at: usize, pos: usize, len: usize) -> Result<&'a [u8], BboltError> {
        at.checked_add(pos)
            .and_then(|start| Some(start..start.checked_add(len)?))
            .and_then(|range| self.data.get(range))
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
