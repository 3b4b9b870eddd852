//! The spool: a snapshot kept on disk only in encrypted form while it is
//! checked.
//!
//! The bbolt check needs random access to the whole database, and a
//! database can be many GiB: it cannot stay in memory. Writing the
//! plaintext to a temporary file would leave a readable copy of every
//! secret in the cluster on the admin host (and on its backups, or in its
//! free blocks after a crash). The spool instead seals each 64 KiB chunk
//! with ChaCha20-Poly1305 under a key drawn for this spool alone that
//! exists only in this process's memory; the file is unlinked as soon as
//! it is open, so nothing names it and the kernel frees it when the process
//! ends, however it ends. Reads ([`ReadAt`]) open the chunks they touch
//! (authenticating them: a changed byte on disk is an error, not a wrong
//! answer) and keep the last few open.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;

use chacha20poly1305::aead::{AeadInPlace, KeyInit, OsRng};
use chacha20poly1305::{ChaCha20Poly1305, Nonce, Tag};

use crate::snapshot::bbolt::ReadAt;

/// Plaintext bytes per sealed chunk.
pub(crate) const CHUNK: usize = 64 * 1024;
/// The Poly1305 tag stored after each chunk.
const TAG: usize = 16;
/// Opened chunks kept for reads: 512 KiB.
const CACHED: usize = 8;

/// An encrypted, unlinked spool file (see the module docs).
pub(crate) struct Spool {
    file: File,
    cipher: ChaCha20Poly1305,
    /// Bytes written so far.
    len: u64,
    /// The chunk being filled.
    pending: Vec<u8>,
    cache: Mutex<Vec<(u64, Vec<u8>)>>,
}

impl Spool {
    /// Creates the spool in `dir` with a fresh key.
    pub(crate) fn create(dir: &Path) -> io::Result<Spool> {
        let name = dir.join(format!(
            ".talos-spool-{}-{}",
            std::process::id(),
            random_suffix()
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&name)?;
        // Unnamed from here on: it goes away with the last handle.
        std::fs::remove_file(&name)?;
        Ok(Spool {
            file,
            cipher: ChaCha20Poly1305::new(&ChaCha20Poly1305::generate_key(&mut OsRng)),
            len: 0,
            pending: Vec::with_capacity(CHUNK),
            cache: Mutex::new(Vec::with_capacity(CACHED)),
        })
    }

    /// Appends `data`.
    pub(crate) fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = (CHUNK - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..n]);
            self.len += n as u64;
            data = &data[n..];
            if self.pending.len() == CHUNK {
                self.seal_pending()?;
            }
        }
        Ok(())
    }

    /// Seals the last, partial chunk; no writes after this.
    pub(crate) fn finish(&mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            self.seal_pending()?;
        }
        Ok(())
    }

    /// Bytes written.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    fn seal_pending(&mut self) -> io::Result<()> {
        let index = (self.len - 1) / CHUNK as u64;
        let tag = self
            .cipher
            .encrypt_in_place_detached(&nonce(index), &[], &mut self.pending)
            .map_err(|_| io::Error::other("spool: sealing failed"))?;
        self.pending.extend_from_slice(&tag);
        self.file
            .write_all_at(&self.pending, index * (CHUNK + TAG) as u64)?;
        self.pending.clear();
        Ok(())
    }

    /// Opens chunk `index` into `out`.
    fn open_chunk(&self, index: u64, out: &mut Vec<u8>) -> io::Result<()> {
        let start = index * CHUNK as u64;
        let plain = (self.len - start).min(CHUNK as u64) as usize;
        out.resize(plain + TAG, 0);
        FileExt::read_exact_at(&self.file, out, index * (CHUNK + TAG) as u64)?;
        let tag = Tag::clone_from_slice(&out[plain..]);
        out.truncate(plain);
        self.cipher
            .decrypt_in_place_detached(&nonce(index), &[], out, &tag)
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("spool: chunk {index} failed authentication"),
                )
            })
    }
}

impl ReadAt for Spool {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&end| end <= self.len)
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let mut at = offset;
        while at < end {
            let index = at / CHUNK as u64;
            let slot = match cache.iter().position(|(i, _)| *i == index) {
                Some(slot) => slot,
                None => {
                    let mut chunk = if cache.len() == CACHED {
                        cache.remove(0).1
                    } else {
                        Vec::with_capacity(CHUNK + TAG)
                    };
                    self.open_chunk(index, &mut chunk)?;
                    cache.push((index, chunk));
                    cache.len() - 1
                }
            };
            let chunk = &cache[slot].1;
            let from = (at - index * CHUNK as u64) as usize;
            let n = (chunk.len() - from).min((end - at) as usize);
            let dst = (at - offset) as usize;
            buf[dst..dst + n].copy_from_slice(&chunk[from..from + n]);
            at += n as u64;
        }
        Ok(())
    }
}

/// The nonce of chunk `index`: unique, since a key seals each index once.
fn nonce(index: u64) -> Nonce {
    let mut nonce = [0u8; 12];
    nonce[..8].copy_from_slice(&index.to_le_bytes());
    Nonce::from(nonce)
}

fn random_suffix() -> String {
    let key = ChaCha20Poly1305::generate_key(&mut OsRng);
    key[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 253) as u8).collect()
    }

    #[test]
    fn reads_anywhere_return_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = data(3 * CHUNK + 1234);
        let mut spool = Spool::create(dir.path()).unwrap();
        for piece in bytes.chunks(5000) {
            spool.write(piece).unwrap();
        }
        spool.finish().unwrap();
        assert_eq!(spool.len(), bytes.len() as u64);
        // Unlinked: the directory is empty.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        for (at, n) in [
            (0, 10),
            (CHUNK - 3, 10),
            (5, 3 * CHUNK),
            (3 * CHUNK, 1234),
            (0, bytes.len()),
        ] {
            let mut buf = vec![0u8; n];
            spool.read_exact_at(&mut buf, at as u64).unwrap();
            assert_eq!(buf, &bytes[at..at + n], "at {at}, {n} bytes");
        }
        let mut past = [0u8; 2];
        let error = spool
            .read_exact_at(&mut past, bytes.len() as u64 - 1)
            .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn the_file_holds_no_plaintext_and_tampering_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::create(dir.path()).unwrap();
        let bytes = vec![b'A'; 2 * CHUNK];
        spool.write(&bytes).unwrap();
        spool.finish().unwrap();
        let mut raw = vec![0u8; 2 * (CHUNK + TAG)];
        FileExt::read_exact_at(&spool.file, &mut raw, 0).unwrap();
        let runs = raw.windows(32).filter(|w| w.iter().all(|&b| b == b'A'));
        assert_eq!(runs.count(), 0, "plaintext found in the spool file");
        // Flip a byte of chunk 1 on disk: reading it fails, chunk 0 reads.
        spool
            .file
            .write_all_at(&[raw[CHUNK + TAG + 9] ^ 1], (CHUNK + TAG + 9) as u64)
            .unwrap();
        let mut buf = vec![0u8; 16];
        spool.read_exact_at(&mut buf, 0).unwrap();
        let error = spool
            .read_exact_at(&mut buf, CHUNK as u64 + 100)
            .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }
}
