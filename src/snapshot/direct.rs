//! Bulk pages around the page cache.
//!
//! Most of a large etcd database can be the overflow pages of big values:
//! a leaf page whose one value is 1 MiB continues over 256 more pages. Those
//! continuations are written with `O_DIRECT` (straight to the device, not
//! copied into freshly allocated page-cache pages) and read back the same
//! way for the bbolt check. Everything else (meta, branch and leaf pages,
//! the first page of every run, small runs) goes through the page cache,
//! where the check's many small reads find it.
//!
//! Which bytes are bulk is read off the stream as it passes ([`Layout`]):
//! the page size from meta page 0, then each page header, whose overflow
//! count says how far its run goes. That is a placement hint only. The
//! bytes written are the bytes received whatever the hint says, the checks
//! read them back from the file, and a file system that refuses direct I/O
//! gets every byte through the page cache.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::bbolt::{FLAG_BRANCH, FLAG_FREELIST, FLAG_LEAF, MAGIC, MAX_PAGE_SIZE};

/// Alignment of direct I/O: file offsets, lengths and memory. 4 KiB
/// satisfies every logical block size up to it.
pub(crate) const ALIGN: usize = 4096;

/// A run's continuation (its pages after the first) of at least this many
/// bytes goes direct; shorter ones are not worth a device round trip.
pub(crate) const DIRECT_MIN: u64 = 64 * 1024;

/// Opens `path` for direct I/O (writing, or reading), or `None` where the
/// platform or the file system has no direct I/O.
pub(crate) fn open(path: &Path, write: bool) -> Option<File> {
    #[cfg(target_os = "linux")]
    {
        use std::fs::OpenOptions;
        use std::os::unix::fs::OpenOptionsExt;
        OpenOptions::new()
            .read(!write)
            .write(write)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (path, write);
        None
    }
}

/// Whether an I/O error means the file system refused direct I/O for this
/// request (alignment it does not accept), rather than a real failure.
pub(crate) fn refused(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::InvalidInput
}

/// A byte buffer whose usable part starts at an [`ALIGN`]ed address.
pub(crate) struct Aligned {
    buf: Vec<u8>,
    start: usize,
}

impl Aligned {
    /// `len` usable bytes.
    pub(crate) fn new(len: usize) -> Aligned {
        let buf = vec![0u8; len + ALIGN];
        let start = aligned_start(&buf);
        Aligned { buf, start }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        let end = self.buf.len() - ALIGN + self.start;
        &mut self.buf[self.start..end]
    }
}

/// How far into `buf` its first [`ALIGN`]ed byte is.
pub(crate) fn aligned_start(buf: &[u8]) -> usize {
    (ALIGN - buf.as_ptr().addr() % ALIGN) % ALIGN
}

/// Where the bulk of a snapshot is, read off its bytes in order.
#[derive(Debug, Default)]
pub(crate) struct Layout {
    /// The start of meta page 0, up to its page size.
    meta: [u8; META_PREFIX],
    /// The database's page size; 0 until known, and for good when the
    /// stream does not start with a usable meta page.
    page_size: u64,
    /// The header of the page being received.
    header: [u8; 16],
    /// The continuation of the latest run whose header said it is bulk.
    bulk: Range<u64>,
    /// Bytes seen so far.
    seen: u64,
}

impl Layout {
    /// Splits the next bytes of the stream (`data`, at offset `seen`) into
    /// its first segment: how many bytes, and whether they are bulk.
    pub(crate) fn next_segment(&mut self, data: &[u8]) -> (usize, bool) {
        let at = self.seen;
        let (len, bulk) = if at < META_PREFIX as u64 {
            // Meta page 0, up to its page size.
            let at = at as usize;
            let take = (META_PREFIX - at).min(data.len());
            self.meta[at..at + take].copy_from_slice(&data[..take]);
            if at + take == META_PREFIX {
                self.page_size = meta_page_size(&self.meta).unwrap_or(0);
            }
            (take, false)
        } else if self.page_size == 0 {
            (data.len(), false)
        } else if self.bulk.contains(&at) {
            let len = (self.bulk.end - at).min(data.len() as u64) as usize;
            (len, true)
        } else {
            // A page outside the bulk: note its header, pass it through.
            let page = at / self.page_size;
            let offset = (at % self.page_size) as usize;
            let end_of_page = (self.page_size - offset as u64).min(data.len() as u64) as usize;
            if offset < self.header.len() {
                let take = (self.header.len() - offset).min(data.len());
                self.header[offset..offset + take].copy_from_slice(&data[..take]);
                if offset + take == self.header.len() {
                    self.inspect(page);
                }
            }
            (end_of_page, false)
        };
        self.seen += len as u64;
        (len, bulk)
    }

    /// A complete header of page `page`: a branch, leaf or freelist page
    /// whose run continues over enough pages marks them bulk.
    fn inspect(&mut self, page: u64) {
        let h = &self.header;
        let id = u64::from_le_bytes(h[0..8].try_into().expect("8 bytes"));
        let flags = u16::from_le_bytes([h[8], h[9]]);
        let overflow = u64::from(u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")));
        let ps = self.page_size;
        if id == page
            && matches!(flags, FLAG_BRANCH | FLAG_LEAF | FLAG_FREELIST)
            && overflow * ps >= DIRECT_MIN
        {
            let start = (page + 1).saturating_mul(ps);
            self.bulk = start..start.saturating_add(overflow * ps);
        }
    }
}

/// Page header (16 bytes), then the meta page's magic, version and page
/// size.
const META_PREFIX: usize = 28;

/// The page size of meta page 0 (its first [`META_PREFIX`] bytes), when it
/// is a bbolt meta page and its page size suits direct I/O.
fn meta_page_size(meta: &[u8; META_PREFIX]) -> Option<u64> {
    let word = |at: usize| u32::from_le_bytes(meta[at..at + 4].try_into().expect("4 bytes"));
    if word(16) != MAGIC {
        return None;
    }
    let page_size = word(24);
    let usable =
        page_size.is_power_of_two() && page_size as usize >= ALIGN && page_size <= MAX_PAGE_SIZE;
    usable.then_some(u64::from(page_size))
}

/// Writes staged bulk bytes at `at`: the aligned part direct, any tail (a
/// stream that ends mid-run) through `file`. Returns how many bytes went
/// direct, or `None` when the file system refused direct I/O, every byte
/// then having gone through `file`.
pub(crate) fn write_staged(
    direct: &File,
    file: &File,
    data: &[u8],
    at: u64,
) -> io::Result<Option<usize>> {
    let aligned = data.len() / ALIGN * ALIGN;
    let mut written = Some(aligned);
    if aligned > 0 {
        match direct.write_all_at(&data[..aligned], at) {
            Ok(()) => {}
            Err(e) if refused(&e) => {
                written = None;
                file.write_all_at(&data[..aligned], at)?;
            }
            Err(e) => return Err(e),
        }
    }
    if aligned < data.len() {
        file.write_all_at(&data[aligned..], at + aligned as u64)?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PS: u64 = 4096;

    /// A stream of `pages` pages: meta page 0, then the given page headers
    /// (page id, flags, overflow), the rest zeros.
    fn stream(pages: u64, headers: &[(u64, u16, u32)]) -> Vec<u8> {
        let mut bytes = vec![0u8; (pages * PS) as usize];
        bytes[16..20].copy_from_slice(&MAGIC.to_le_bytes());
        bytes[20..24].copy_from_slice(&2u32.to_le_bytes());
        bytes[24..28].copy_from_slice(&(PS as u32).to_le_bytes());
        for &(id, flags, overflow) in headers {
            let at = (id * PS) as usize;
            bytes[at..at + 8].copy_from_slice(&id.to_le_bytes());
            bytes[at + 8..at + 10].copy_from_slice(&flags.to_le_bytes());
            bytes[at + 12..at + 16].copy_from_slice(&overflow.to_le_bytes());
        }
        bytes
    }

    /// The bulk ranges `Layout` finds when fed `bytes` in pieces of the
    /// given sizes (cycled).
    fn bulk_ranges(bytes: &[u8], pieces: &[usize]) -> Vec<Range<u64>> {
        let mut layout = Layout::default();
        let mut ranges: Vec<Range<u64>> = Vec::new();
        let mut at = 0usize;
        let mut i = 0;
        while at < bytes.len() {
            let end = (at + pieces[i % pieces.len()]).min(bytes.len());
            let mut rest = &bytes[at..end];
            let mut pos = at as u64;
            while !rest.is_empty() {
                let (n, bulk) = layout.next_segment(rest);
                assert!(n > 0);
                if bulk {
                    match ranges.last_mut() {
                        Some(last) if last.end == pos => last.end += n as u64,
                        _ => ranges.push(pos..pos + n as u64),
                    }
                }
                pos += n as u64;
                rest = &rest[n..];
            }
            at = end;
            i += 1;
        }
        ranges
    }

    #[test]
    fn continuations_of_long_runs_are_bulk_wherever_the_stream_is_cut() {
        // Leaf 2 runs over 20 more pages (80 KiB: bulk), branch 23 over 3
        // (short), leaf 27 over 16 (64 KiB: bulk), a freelist page 44 over 30.
        let bytes = stream(
            80,
            &[
                (2, FLAG_LEAF, 20),
                (23, FLAG_BRANCH, 3),
                (27, FLAG_LEAF, 16),
                (44, FLAG_FREELIST, 30),
            ],
        );
        let expected = vec![3 * PS..23 * PS, 28 * PS..44 * PS, 45 * PS..75 * PS];
        for pieces in [
            &[bytes.len()][..],
            &[1024],
            &[7, 4089, 100_000],
            &[65_536, 3],
        ] {
            assert_eq!(bulk_ranges(&bytes, pieces), expected, "pieces {pieces:?}");
        }
    }

    #[test]
    fn headers_that_do_not_name_their_page_are_not_trusted() {
        // Page 5 claims to be page 6; page 9 has an unknown type; page 12
        // lies inside the bulk of page 10 and is not inspected.
        let bytes = stream(
            60,
            &[(10, FLAG_LEAF, 20), (12, FLAG_LEAF, 40), (9, 0x20, 20)],
        );
        let mut bytes = bytes;
        let at = (5 * PS) as usize;
        bytes[at..at + 8].copy_from_slice(&6u64.to_le_bytes());
        bytes[at + 8..at + 10].copy_from_slice(&FLAG_LEAF.to_le_bytes());
        bytes[at + 12..at + 16].copy_from_slice(&30u32.to_le_bytes());
        assert_eq!(bulk_ranges(&bytes, &[3000]), vec![11 * PS..31 * PS]);
    }

    #[test]
    fn without_a_meta_page_nothing_is_bulk() {
        let mut bytes = stream(40, &[(2, FLAG_LEAF, 30)]);
        bytes[16] ^= 1; // not the magic
        assert!(bulk_ranges(&bytes, &[4096]).is_empty());
        let mut bytes = stream(40, &[(2, FLAG_LEAF, 30)]);
        bytes[24..28].copy_from_slice(&512u32.to_le_bytes()); // below ALIGN
        assert!(bulk_ranges(&bytes, &[4096]).is_empty());
    }

    #[test]
    fn aligned_buffers_start_on_the_boundary() {
        let mut buf = Aligned::new(3 * ALIGN);
        let slice = buf.as_mut_slice();
        assert_eq!(slice.len(), 3 * ALIGN);
        assert_eq!(slice.as_ptr().addr() % ALIGN, 0);
    }
}
