//! Bulk pages around the page cache.
//!
//! Most of a large etcd database can be the overflow pages of big values:
//! a leaf page whose one value is 1 MiB continues over 256 more pages. The
//! whole pages inside such values are bulk: they are written with
//! `O_DIRECT`, straight to the device rather than copied into freshly
//! allocated page-cache pages. (A long run that is not a leaf, or whose
//! element table cannot be read, has all of its middle in the bulk: its
//! pages after the first, up to the last.) Everything else (meta, branch
//! and leaf pages, the first and last page of every run, the pages where
//! one value ends and the next key begins, short runs) goes through the
//! page cache, where the check's many small reads find it.
//!
//! Which bytes are bulk is read off the stream as it passes ([`Layout`]):
//! the page size from meta page 0, then each page header, whose overflow
//! count says how far its run goes. That is a placement hint only: the
//! bytes written are the bytes received whatever the hint says, and a file
//! system that refuses direct I/O gets every byte through the page cache.
//!
//! For each range of bulk inside a value, the CRC-32C is taken from the
//! very bytes written, as they are written ([`BulkSums`]). The bbolt check
//! reads everything else back from the file (every page header, element
//! table and key, both ends of every value, the KeyValue fields around a
//! big one) and combines the CRCs into etcd's status hash instead of
//! reading those pages from the device. A range the check would have to
//! look into (a key in it, a value that only partly covers it, a bucket)
//! is read back after all.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::bbolt::{FLAG_BRANCH, FLAG_FREELIST, FLAG_LEAF, MAGIC, MAX_PAGE_SIZE};

/// Alignment of direct I/O: file offsets, lengths and memory. 4 KiB
/// satisfies every logical block size up to it.
pub(crate) const ALIGN: usize = 4096;

/// A run's middle (its pages after the first, up to the last) of at least
/// this many bytes goes direct; shorter ones are not worth a device round
/// trip.
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

/// Where the bulk of a snapshot is, read off its bytes in order; also which
/// parts of the bulk the check can take as CRCs ([`BulkSums::want`]).
#[derive(Debug, Default)]
pub(crate) struct Layout {
    /// The start of meta page 0, up to its page size.
    meta: [u8; META_PREFIX],
    /// The database's page size; 0 until known, and for good when the
    /// stream does not start with a usable meta page.
    page_size: u64,
    /// The header of the page being received.
    header: [u8; 16],
    /// The bulk ranges still to come (or under way), in order.
    bulk: VecDeque<Range<u64>>,
    /// The middle of the latest long run (its pages after the first, up to
    /// the last).
    middle: Range<u64>,
    /// Where the latest run recognised ends: page headers before it are
    /// not inspected (they are the run's data).
    run_end: u64,
    /// The first page of a bulk leaf run, while it is received (empty
    /// otherwise): its element table says where its values are.
    first: Vec<u8>,
    /// Bytes seen so far.
    seen: u64,
}

/// Largest page size whose first pages are read for their element tables.
const TABLE_PAGE_MAX: u64 = 64 * 1024;

/// Smallest part of a value worth leaving unread: four 4 KiB pages.
const SUM_MIN: u64 = 16 * 1024;

impl Layout {
    /// Splits the next bytes of the stream (`data`, at offset `seen`) into
    /// its first segment: how many bytes, and whether they are bulk. The
    /// parts of values wholly inside the bulk go to `sums` as wanted.
    pub(crate) fn next_segment(&mut self, data: &[u8], sums: &mut BulkSums) -> (usize, bool) {
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
        } else if let Some(range) = self.current_bulk(at) {
            let len = (range.end - at).min(data.len() as u64) as usize;
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
            if !self.first.is_empty() {
                self.first[offset..offset + end_of_page].copy_from_slice(&data[..end_of_page]);
                if offset + end_of_page == self.first.len() {
                    self.want_values(page, sums);
                }
            }
            (end_of_page, false)
        };
        self.seen += len as u64;
        (len, bulk)
    }

    /// The bulk range that holds `at`, dropping those already passed.
    fn current_bulk(&mut self, at: u64) -> Option<Range<u64>> {
        while self.bulk.front().is_some_and(|range| range.end <= at) {
            self.bulk.pop_front();
        }
        self.bulk
            .front()
            .filter(|range| range.contains(&at))
            .cloned()
    }

    /// A complete header of page `page`, outside any run recognised: a
    /// branch, leaf or freelist page whose run continues over enough pages
    /// has bulk in its middle (its pages after the first, up to the last,
    /// where its data ends). For a leaf, that is the whole pages inside its
    /// long values, known once its first page (kept for its element table)
    /// is complete; for other pages, and leaves whose table cannot be read,
    /// the whole middle.
    fn inspect(&mut self, page: u64) {
        let h = &self.header;
        let id = u64::from_le_bytes(h[0..8].try_into().expect("8 bytes"));
        let flags = u16::from_le_bytes([h[8], h[9]]);
        let overflow = u64::from(u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")));
        let ps = self.page_size;
        if id != page
            || !matches!(flags, FLAG_BRANCH | FLAG_LEAF | FLAG_FREELIST)
            || page.saturating_mul(ps) < self.run_end
        {
            return;
        }
        self.run_end = (page + overflow + 1).saturating_mul(ps);
        if overflow.saturating_sub(1) * ps >= DIRECT_MIN {
            let start = (page + 1).saturating_mul(ps);
            self.middle = start..start.saturating_add((overflow - 1) * ps);
            if flags == FLAG_LEAF && ps <= TABLE_PAGE_MAX {
                self.first.resize(ps as usize, 0);
                self.first[..16].copy_from_slice(h);
            } else {
                self.bulk.push_back(self.middle.clone());
            }
        }
    }

    /// The first page of the long leaf run at page `page` is in `first`:
    /// the whole pages of each long value in the run's middle are bulk,
    /// and their sums wanted. The pages between values (where one ends and
    /// the next key begins) go through the page cache, where the check
    /// reads them.
    fn want_values(&mut self, page: u64, sums: &mut BulkSums) {
        let first = std::mem::take(&mut self.first);
        let ps = self.page_size;
        let run_start = page * ps;
        let word = |at: usize| u32::from_le_bytes(first[at..at + 4].try_into().expect("4 bytes"));
        let count = usize::from(u16::from_le_bytes([first[10], first[11]]));
        let mut wanted: Vec<Range<u64>> = Vec::new();
        if 16 + count * 16 > first.len() {
            self.bulk.push_back(self.middle.clone());
        } else {
            for i in 0..count {
                let at = 16 + i * 16;
                let (flags, pos, ksize, vsize) =
                    (word(at), word(at + 4), word(at + 8), word(at + 12));
                if flags & 1 != 0 {
                    continue; // a bucket
                }
                let value_start = run_start + at as u64 + u64::from(pos) + u64::from(ksize);
                let value_end = value_start + u64::from(vsize);
                let start = value_start.next_multiple_of(ps).max(self.middle.start);
                let end = (value_end / ps * ps).min(self.middle.end);
                if end >= start.saturating_add(SUM_MIN) {
                    wanted.push(start..end);
                }
            }
        }
        // A page bbolt wrote has its values in order; anything else only
        // gets the ranges that do not overlap.
        wanted.sort_by_key(|r| r.start);
        let mut last_end = 0;
        for range in wanted {
            if range.start >= last_end {
                last_end = range.end;
                self.bulk.push_back(range.clone());
                sums.want(range);
            }
        }
        self.first = first;
        self.first.clear();
    }
}

/// The CRC-32C of parts of the bulk, taken as they are written: the parts
/// of values that lie wholly in it, whole pages only, so that everything
/// around them (keys, the ends of values) is read back by the check.
///
/// One entry (24 bytes) per value long enough, so the table grows with the
/// number of such values, never with their size: 24 KiB for a 1 GiB
/// database of 1 MiB values.
#[derive(Debug, Default, Clone)]
pub(crate) struct BulkSums {
    sums: Vec<BulkSum>,
    /// Ranges whose bytes are still to come, in file order.
    wanted: VecDeque<Range<u64>>,
    /// The CRC so far of the first wanted range, and the offset of the
    /// byte it needs next.
    pending: u32,
    next: u64,
}

#[derive(Debug, Clone, Copy)]
struct BulkSum {
    start: u64,
    end: u64,
    crc: u32,
}

impl BulkSums {
    /// Asks for the CRC of `range`, which lies after every range asked for
    /// before and after the bytes noted so far.
    pub(crate) fn want(&mut self, range: Range<u64>) {
        self.wanted.push_back(range);
    }

    /// Notes `data`, the stream's bytes at `at` (bytes come in order; those
    /// outside wanted ranges need not be noted).
    pub(crate) fn note(&mut self, at: u64, data: &[u8]) {
        let end = at + data.len() as u64;
        while let Some(range) = self.wanted.front() {
            if range.start >= end {
                break;
            }
            let from = range.start.max(at);
            let to = range.end.min(end);
            if from == range.start {
                self.pending = 0;
            } else if from != self.next {
                // Bytes of the range went by unnoted: no sum for it.
                self.wanted.pop_front();
                continue;
            }
            self.next = to;
            self.pending = crc32c::crc32c_append(
                self.pending,
                &data[(from - at) as usize..(to - at) as usize],
            );
            if to < range.end {
                break;
            }
            self.sums.push(BulkSum {
                start: range.start,
                end: range.end,
                crc: self.pending,
            });
            self.wanted.pop_front();
        }
    }

    /// The ranges recorded within `range`, in order, with their CRCs.
    pub(crate) fn within(
        &self,
        range: &Range<u64>,
    ) -> impl Iterator<Item = (Range<u64>, u32)> + '_ {
        let from = self.sums.partition_point(|s| s.start < range.start);
        let end = range.end;
        self.sums[from..]
            .iter()
            .take_while(move |s| s.end <= end)
            .map(|s| (s.start..s.end, s.crc))
    }

    /// The ranges recorded, in order.
    #[cfg(test)]
    pub(crate) fn ranges(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        self.sums.iter().map(|s| s.start..s.end)
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

    /// Feeds `bytes` to a `Layout` in pieces of the given sizes (cycled),
    /// noting the bulk in sums as the sink does: the bulk ranges found, and
    /// the sums.
    fn lay_out(bytes: &[u8], pieces: &[usize]) -> (Vec<Range<u64>>, BulkSums) {
        let mut layout = Layout::default();
        let mut sums = BulkSums::default();
        let mut ranges: Vec<Range<u64>> = Vec::new();
        let mut at = 0usize;
        let mut i = 0;
        while at < bytes.len() {
            let end = (at + pieces[i % pieces.len()]).min(bytes.len());
            let mut rest = &bytes[at..end];
            let mut pos = at as u64;
            while !rest.is_empty() {
                let (n, bulk) = layout.next_segment(rest, &mut sums);
                assert!(n > 0);
                if bulk {
                    sums.note(pos, &rest[..n]);
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
        (ranges, sums)
    }

    /// The bulk ranges `Layout` finds (see [`lay_out`]).
    fn bulk_ranges(bytes: &[u8], pieces: &[usize]) -> Vec<Range<u64>> {
        lay_out(bytes, pieces).0
    }

    #[test]
    fn continuations_of_long_runs_are_bulk_wherever_the_stream_is_cut() {
        // Leaf 2 runs over 20 more pages (a middle of 76 KiB) with an
        // element table too long for its first page: its middle is bulk.
        // Branch 23 over 3 (short), branch 27 over 17 (a 64 KiB middle:
        // bulk), leaf 45 over 16 (a 60 KiB middle: short), a freelist page
        // 62 over 17. Pages inside a run (page 30) are never inspected.
        let mut bytes = stream(
            80,
            &[
                (2, FLAG_LEAF, 20),
                (23, FLAG_BRANCH, 3),
                (27, FLAG_BRANCH, 17),
                (30, FLAG_BRANCH, 40),
                (45, FLAG_LEAF, 16),
                (62, FLAG_FREELIST, 17),
            ],
        );
        let count = (2 * PS + 10) as usize;
        bytes[count..count + 2].copy_from_slice(&300u16.to_le_bytes());
        let expected = vec![3 * PS..22 * PS, 28 * PS..44 * PS, 63 * PS..79 * PS];
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
        // lies inside the run of page 10 and is not inspected.
        let bytes = stream(
            60,
            &[(10, FLAG_BRANCH, 20), (12, FLAG_BRANCH, 40), (9, 0x20, 20)],
        );
        let mut bytes = bytes;
        let at = (5 * PS) as usize;
        bytes[at..at + 8].copy_from_slice(&6u64.to_le_bytes());
        bytes[at + 8..at + 10].copy_from_slice(&FLAG_LEAF.to_le_bytes());
        bytes[at + 12..at + 16].copy_from_slice(&30u32.to_le_bytes());
        assert_eq!(bulk_ranges(&bytes, &[3000]), vec![11 * PS..30 * PS]);
    }

    #[test]
    fn without_a_meta_page_nothing_is_bulk() {
        let mut bytes = stream(40, &[(2, FLAG_BRANCH, 30)]);
        bytes[16] ^= 1; // not the magic
        assert!(bulk_ranges(&bytes, &[4096]).is_empty());
        let mut bytes = stream(40, &[(2, FLAG_BRANCH, 30)]);
        bytes[24..28].copy_from_slice(&512u32.to_le_bytes()); // below ALIGN
        assert!(bulk_ranges(&bytes, &[4096]).is_empty());
    }

    #[test]
    fn sums_are_the_crc_of_each_wanted_range_however_it_is_noted() {
        let data: Vec<u8> = (0..40_000u32).map(|i| (i * 31 % 253) as u8).collect();
        let ranges = [100u64..10_100, 20_000..39_000];
        for piece in [1usize, 7, 4096, 40_000] {
            let mut sums = BulkSums::default();
            for range in &ranges {
                sums.want(range.clone());
            }
            let mut at = 0;
            while at < data.len() {
                let end = (at + piece).min(data.len());
                sums.note(at as u64, &data[at..end]);
                at = end;
            }
            let got: Vec<_> = sums.within(&(0..40_000)).collect();
            let expected: Vec<_> = ranges
                .iter()
                .map(|r| {
                    (
                        r.clone(),
                        crc32c::crc32c(&data[r.start as usize..r.end as usize]),
                    )
                })
                .collect();
            assert_eq!(got, expected, "piece {piece}");
            // Only ranges wholly inside are listed.
            assert_eq!(sums.within(&(100..39_000)).count(), 2);
            assert_eq!(sums.within(&(101..39_000)).count(), 1);
            assert_eq!(sums.within(&(100..38_999)).count(), 1);
            assert_eq!(sums.within(&(10_100..20_000)).count(), 0);
        }
        // A range the stream left unfinished, or whose bytes were not all
        // noted, is not recorded.
        let mut sums = BulkSums::default();
        sums.want(0..100);
        sums.want(200..300);
        sums.want(400..500);
        sums.note(0, &data[..60]);
        sums.note(210, &data[210..300]);
        sums.note(400, &data[400..450]);
        assert_eq!(sums.within(&(0..1000)).count(), 0);
    }

    /// A long leaf run at page 2 (overflow 40) holding four elements: the
    /// bulk, and the sums wanted, are the whole pages of each long value
    /// inside the run's middle (pages 3..=41), at least four of them.
    #[test]
    fn the_values_of_a_bulk_leaf_are_wanted_by_whole_pages() {
        let mut bytes = stream(60, &[(2, FLAG_LEAF, 40)]);
        let page = (2 * PS) as usize;
        bytes[page + 10..page + 12].copy_from_slice(&4u16.to_le_bytes());
        // (flags, key size, value size); data packed after the table.
        let elements = [
            (0u32, 17u32, 50_000u32),
            (0, 17, 3 * 4096), // too short once cut to whole pages
            (1, 3, 20_000),    // a bucket: never summed
            (0, 17, 85_000),   // ends in the run's last page
        ];
        let mut data_at = 16 + 16 * elements.len();
        for (i, &(flags, ksize, vsize)) in elements.iter().enumerate() {
            let at = 16 + 16 * i;
            let e = page + at;
            bytes[e..e + 4].copy_from_slice(&flags.to_le_bytes());
            bytes[e + 4..e + 8].copy_from_slice(&((data_at - at) as u32).to_le_bytes());
            bytes[e + 8..e + 12].copy_from_slice(&ksize.to_le_bytes());
            bytes[e + 12..e + 16].copy_from_slice(&vsize.to_le_bytes());
            data_at += (ksize + vsize) as usize;
        }
        let start = |skip: u64| 2 * PS + 16 + 16 * 4 + skip;
        let v0 = start(17)..start(17 + 50_000);
        let v3 = start(17 + 50_000 + 17 + 3 * 4096 + 3 + 20_000 + 17);
        let v3 = v3..v3 + 85_000;
        let pages =
            |r: &Range<u64>, cap: u64| r.start.next_multiple_of(PS)..(r.end / PS * PS).min(cap);
        let expected = vec![pages(&v0, u64::MAX), pages(&v3, 42 * PS)];
        for pieces in [&[bytes.len()][..], &[1000], &[7, 4089, 100_000]] {
            let (bulk, sums) = lay_out(&bytes, pieces);
            // Only those pages are bulk: the pages between values are not.
            assert_eq!(bulk, expected, "pieces {pieces:?}");
            let got: Vec<_> = sums.within(&(0..u64::MAX)).map(|(r, _)| r).collect();
            assert_eq!(got, expected, "pieces {pieces:?}");
            for (range, crc) in sums.within(&(0..u64::MAX)) {
                let bytes = &bytes[range.start as usize..range.end as usize];
                assert_eq!(crc, crc32c::crc32c(bytes));
            }
        }
    }

    #[test]
    fn aligned_buffers_start_on_the_boundary() {
        let mut buf = Aligned::new(3 * ALIGN);
        let slice = buf.as_mut_slice();
        assert_eq!(slice.len(), 3 * ALIGN);
        assert_eq!(slice.as_ptr().addr() % ALIGN, 0);
    }
}
