//! The bbolt reader on hand-built databases: the cases a real etcd snapshot
//! does not have (a stored freelist, its 0xFFFF count convention, nested
//! buckets, a meta page choice) and one damage at a time, plus random damage
//! that must never panic.

use std::path::{Path, PathBuf};

use talos_client::snapshot::bbolt::{BboltError, Corruption, Db, Entry, MetaProblem, NO_FREELIST};
use talos_client::snapshot::status;

const PAGE: usize = 4096;
const BRANCH: u16 = 0x01;
const LEAF: u16 = 0x02;
const META: u16 = 0x04;
const FREELIST: u16 = 0x10;

fn fnv1a64(data: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf29ce484222325;
    for &b in data {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x100000001b3);
    }
    hash
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A page image: header, then elements, then keys and values.
fn header(id: u64, flags: u16, count: u16, overflow: u32, size: usize) -> Vec<u8> {
    let mut p = vec![0u8; size];
    put64(&mut p, 0, id);
    put16(&mut p, 8, flags);
    put16(&mut p, 10, count);
    put32(&mut p, 12, overflow);
    p
}

/// A leaf page (or inline page, id 0) of `(is_bucket, key, value)`; spans
/// overflow pages when needed.
fn leaf(id: u64, elements: &[(bool, &[u8], Vec<u8>)]) -> Vec<u8> {
    let data: usize = elements.iter().map(|(_, k, v)| k.len() + v.len()).sum();
    let need = 16 + 16 * elements.len() + data;
    let pages = need.div_ceil(PAGE).max(1);
    let mut p = header(
        id,
        LEAF,
        elements.len() as u16,
        pages as u32 - 1,
        pages * PAGE,
    );
    let mut at = 16 + 16 * elements.len();
    for (i, (bucket, key, value)) in elements.iter().enumerate() {
        let e = 16 + 16 * i;
        put32(&mut p, e, u32::from(*bucket));
        put32(&mut p, e + 4, (at - e) as u32);
        put32(&mut p, e + 8, key.len() as u32);
        put32(&mut p, e + 12, value.len() as u32);
        p[at..at + key.len()].copy_from_slice(key);
        at += key.len();
        p[at..at + value.len()].copy_from_slice(value);
        at += value.len();
    }
    p
}

fn inline_leaf(elements: &[(bool, &[u8], Vec<u8>)]) -> Vec<u8> {
    let mut p = leaf(0, elements);
    let used = 16
        + elements
            .iter()
            .map(|(_, k, v)| 16 + k.len() + v.len())
            .sum::<usize>();
    p.truncate(used);
    p
}

fn branch(id: u64, elements: &[(&[u8], u64)]) -> Vec<u8> {
    let mut p = header(id, BRANCH, elements.len() as u16, 0, PAGE);
    let mut at = 16 + 16 * elements.len();
    for (i, (key, child)) in elements.iter().enumerate() {
        let e = 16 + 16 * i;
        put32(&mut p, e, (at - e) as u32);
        put32(&mut p, e + 4, key.len() as u32);
        put64(&mut p, e + 8, *child);
        p[at..at + key.len()].copy_from_slice(key);
        at += key.len();
    }
    p
}

fn freelist(id: u64, ids: &[u64], big_count: bool) -> Vec<u8> {
    let mut p = header(id, FREELIST, 0, 0, PAGE);
    let mut at = 16;
    if big_count {
        put16(&mut p, 10, 0xFFFF);
        put64(&mut p, 16, ids.len() as u64);
        at += 8;
    } else {
        put16(&mut p, 10, ids.len() as u16);
    }
    for (i, free) in ids.iter().enumerate() {
        put64(&mut p, at + 8 * i, *free);
    }
    p
}

fn bucket_value(root: u64, inline: Option<Vec<u8>>) -> Vec<u8> {
    let mut v = vec![0u8; 16];
    put64(&mut v, 0, root);
    put64(&mut v, 8, 7);
    v.extend(inline.unwrap_or_default());
    v
}

fn meta(id: u64, root: u64, freelist: u64, high_water: u64, txid: u64) -> Vec<u8> {
    let mut p = header(id, META, 0, 0, PAGE);
    let m = 16;
    put32(&mut p, m, 0xED0C_DAED);
    put32(&mut p, m + 4, 2);
    put32(&mut p, m + 8, PAGE as u32);
    put64(&mut p, m + 16, root);
    put64(&mut p, m + 32, freelist);
    put64(&mut p, m + 40, high_water);
    put64(&mut p, m + 48, txid);
    let sum = fnv1a64(&p[m..m + 56]);
    put64(&mut p, m + 56, sum);
    p
}

/// The pieces of the reference database, to be damaged one at a time.
struct Spec {
    free: Vec<u64>,
    big_count: bool,
    alpha_children: [u64; 2],
    alpha_keys: [&'static [u8]; 2],
    second_leaf_keys: [&'static [u8]; 2],
    freelist_page: u64,
    /// A plain value `zeta` in the root bucket, after the buckets.
    root_value: bool,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            free: vec![10, 11],
            big_count: false,
            alpha_children: [5, 6],
            alpha_keys: [b"a1", b"b1"],
            second_leaf_keys: [b"b1", b"b2"],
            freelist_page: 2,
            root_value: false,
        }
    }
}

/// Pages: 0, 1 meta; 2 freelist; 3 root leaf (buckets alpha, beta inline,
/// gamma); 4 alpha's branch; 5 and 6-7 (overflow) alpha's leaves; 8
/// gamma's leaf, holding bucket sub; 9 sub's leaf; 10, 11 free.
fn build(spec: &Spec) -> Vec<u8> {
    let big = (0..6000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
    let beta = inline_leaf(&[(false, b"x", b"1".to_vec()), (false, b"y", b"2".to_vec())]);
    let pages: Vec<Vec<u8>> = vec![
        meta(0, 3, spec.freelist_page, 12, 10),
        meta(1, 3, spec.freelist_page, 12, 9),
        freelist(2, &spec.free, spec.big_count),
        leaf(3, &{
            let mut root = vec![
                (true, &b"alpha"[..], bucket_value(4, None)),
                (true, b"beta", bucket_value(0, Some(beta))),
                (true, b"gamma", bucket_value(8, None)),
            ];
            if spec.root_value {
                root.push((false, b"zeta", b"z".to_vec()));
            }
            root
        }),
        branch(
            4,
            &[
                (spec.alpha_keys[0], spec.alpha_children[0]),
                (spec.alpha_keys[1], spec.alpha_children[1]),
            ],
        ),
        leaf(
            5,
            &[
                (false, b"a1", b"v1".to_vec()),
                (false, b"a2", b"v2".to_vec()),
            ],
        ),
        leaf(
            6,
            &[
                (false, spec.second_leaf_keys[0], b"v3".to_vec()),
                (false, spec.second_leaf_keys[1], big),
            ],
        ),
        leaf(
            8,
            &[
                (false, b"plain", b"p".to_vec()),
                (true, b"sub", bucket_value(9, None)),
            ],
        ),
        leaf(9, &[(false, b"s", b"t".to_vec())]),
        header(10, LEAF, 0, 0, PAGE),
        header(11, LEAF, 0, 0, PAGE),
    ];
    let file: Vec<u8> = pages.concat();
    assert_eq!(file.len(), 12 * PAGE, "layout");
    file
}

fn save(dir: &Path, bytes: &[u8]) -> PathBuf {
    let path = dir.join(format!("db-{}", fnv1a64(bytes)));
    std::fs::write(&path, bytes).unwrap();
    path
}

fn open(bytes: &[u8]) -> Result<Db, BboltError> {
    let dir = tempfile::tempdir().unwrap();
    let path = save(dir.path(), bytes);
    // The open file survives the directory's removal.
    Db::open(&path, bytes.len() as u64)
}

fn check(bytes: &[u8]) -> Result<(), BboltError> {
    open(bytes)?.check().map(|_| ())
}

fn corruption(result: Result<(), BboltError>) -> (u64, Corruption) {
    match result {
        Err(BboltError::Corrupt { page, problem, .. }) => (page, problem),
        other => panic!("expected corruption, got {other:?}"),
    }
}

#[test]
fn reference_database_reads_and_checks() {
    let bytes = build(&Spec::default());
    let db = open(&bytes).unwrap();
    assert_eq!(db.meta().txid, 10);
    let summary = db.check().unwrap();
    assert_eq!(summary.high_water, 12);
    assert_eq!(summary.free_pages, 2);
    assert_eq!(summary.reachable_pages, 10);
    assert_eq!(summary.buckets, 4);
    assert!(summary.freelist_stored);

    // Everything, nested buckets included, in order.
    let mut seen = Vec::new();
    fn walk(
        db: &Db,
        bucket: &talos_client::snapshot::bbolt::Bucket,
        prefix: String,
        seen: &mut Vec<String>,
    ) {
        db.for_each(bucket, |key, entry| {
            let name = format!("{prefix}/{}", String::from_utf8_lossy(key));
            match entry {
                Entry::Value(v) => seen.push(format!("{name}={}", v.len())),
                Entry::Bucket(child) => {
                    seen.push(format!("{name}[{}]", child.is_inline()));
                    walk(db, &child, name, seen);
                }
            }
            Ok::<(), BboltError>(())
        })
        .unwrap();
    }
    walk(&db, &db.root_bucket(), String::new(), &mut seen);
    assert_eq!(
        seen,
        [
            "/alpha[false]",
            "/alpha/a1=2",
            "/alpha/a2=2",
            "/alpha/b1=2",
            "/alpha/b2=6000",
            "/beta[true]",
            "/beta/x=1",
            "/beta/y=1",
            "/gamma[false]",
            "/gamma/plain=1",
            "/gamma/sub[false]",
            "/gamma/sub/s=1",
        ]
    );

    // etcd's status: names, keys and values of the top-level buckets; a
    // nested bucket adds its name only.
    let big = (0..6000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
    let mut crc = 0;
    for part in [
        &b"alpha"[..],
        b"a1",
        b"v1",
        b"a2",
        b"v2",
        b"b1",
        b"v3",
        b"b2",
        &big,
        b"beta",
        b"x",
        b"1",
        b"y",
        b"2",
        b"gamma",
        b"plain",
        b"p",
        b"sub",
    ] {
        crc = crc32c::crc32c_append(crc, part);
    }
    let status = status::status(&db).unwrap();
    assert_eq!(status.hash, crc);
    assert_eq!(status.total_entries, 8);
    assert_eq!(status.total_keys, 0, "no bucket `key`, no live keys");
    assert_eq!(status.total_size, 12 * PAGE as u64);
    assert_eq!(status.revision, 0, "no bucket `key`");

    // A saved or verified snapshot gets its status from the consistency
    // check's own pass over the file: the same status.
    use sha2::Digest as _;
    let mut snapshot = bytes.clone();
    snapshot.extend_from_slice(&sha2::Sha256::digest(&bytes));
    let dir = tempfile::tempdir().unwrap();
    let report = talos_client::snapshot::verify_file(&save(dir.path(), &snapshot)).unwrap();
    assert_eq!(report.status, status);
}

/// A top-level entry that is not a bucket: the check passes (bbolt's does
/// too) but etcd's status cannot be computed, whether walked on its own or
/// in the check's pass.
#[test]
fn a_value_in_the_root_fails_the_status_both_ways() {
    let bytes = build(&Spec {
        root_value: true,
        ..Spec::default()
    });
    let db = open(&bytes).unwrap();
    db.check().unwrap();
    let alone = status::status(&db).unwrap_err().to_string();
    use sha2::Digest as _;
    let mut snapshot = bytes.clone();
    snapshot.extend_from_slice(&sha2::Sha256::digest(&bytes));
    let dir = tempfile::tempdir().unwrap();
    let verified = talos_client::snapshot::verify_file(&save(dir.path(), &snapshot))
        .unwrap_err()
        .to_string();
    assert!(alone.contains("bucket entry in the root"), "{alone}");
    assert!(verified.contains("bucket entry in the root"), "{verified}");
}

#[test]
fn freelist_count_overflow_convention() {
    let spec = Spec {
        big_count: true,
        ..Spec::default()
    };
    let summary = open(&build(&spec)).unwrap().check().unwrap();
    assert_eq!(summary.free_pages, 2);
}

#[test]
fn freelist_damage_is_detected() {
    let cases: [(Vec<u64>, u64, Corruption); 5] = [
        (vec![10, 11, 10], 10, Corruption::AlreadyFreed),
        (vec![10], 11, Corruption::UnreachableUnfreed),
        (vec![10, 11, 5], 5, Corruption::ReachableFreed),
        (vec![10, 11, 7], 7, Corruption::ReachableFreed),
        (
            vec![10, 11, 12],
            12,
            Corruption::FreedOutOfRange { high_water: 12 },
        ),
    ];
    for (free, page, problem) in cases {
        let bytes = build(&Spec {
            free: free.clone(),
            ..Spec::default()
        });
        assert_eq!(corruption(check(&bytes)), (page, problem), "free {free:?}");
    }
    // The freelist page itself listed as free.
    let bytes = build(&Spec {
        free: vec![10, 11, 2],
        ..Spec::default()
    });
    assert_eq!(corruption(check(&bytes)), (2, Corruption::ReachableFreed));
    // A freelist pointer at a leaf.
    let bytes = build(&Spec {
        freelist_page: 9,
        ..Spec::default()
    });
    assert!(matches!(
        corruption(check(&bytes)),
        (9, Corruption::UnexpectedType { flags: LEAF, .. })
    ));
}

#[test]
fn tree_damage_is_detected() {
    // Two branch elements leading to the same leaf.
    let bytes = build(&Spec {
        alpha_children: [5, 5],
        free: vec![6, 7, 10, 11],
        ..Spec::default()
    });
    assert_eq!(
        corruption(check(&bytes)),
        (5, Corruption::MultipleReferences)
    );
    // A child at the high-water mark.
    let bytes = build(&Spec {
        alpha_children: [5, 12],
        ..Spec::default()
    });
    assert!(matches!(
        corruption(check(&bytes)),
        (12, Corruption::OutOfBounds { .. })
    ));
    // A branch pointing at the freelist page.
    let bytes = build(&Spec {
        alpha_children: [5, 2],
        ..Spec::default()
    });
    assert_eq!(
        corruption(check(&bytes)),
        (2, Corruption::MultipleReferences)
    );
    // A leaf key below the branch key that leads to it.
    let bytes = build(&Spec {
        second_leaf_keys: [b"a0", b"b2"],
        ..Spec::default()
    });
    assert!(matches!(
        corruption(check(&bytes)),
        (6, Corruption::KeyOrder { index: 0, .. })
    ));
    // Keys out of order within a leaf.
    let bytes = build(&Spec {
        second_leaf_keys: [b"b3", b"b2"],
        ..Spec::default()
    });
    assert!(matches!(
        corruption(check(&bytes)),
        (6, Corruption::KeyOrder { index: 1, .. })
    ));
    // A branch key at or above the next one.
    let bytes = build(&Spec {
        alpha_keys: [b"b1", b"a1"],
        ..Spec::default()
    });
    // (The first leaf, then below its lower bound, is where it shows.)
    assert!(matches!(
        corruption(check(&bytes)),
        (5, Corruption::KeyOrder { index: 0, .. })
    ));
    // An overflow run reaching the high-water mark.
    let mut bytes = build(&Spec::default());
    put32(&mut bytes, 6 * PAGE + 12, 6);
    assert_eq!(
        corruption(check(&bytes)),
        (
            6,
            Corruption::OutOfBounds {
                last: 12,
                high_water: 12
            }
        )
    );
    // An unreachable, unfreed page: drop sub's bucket entry flag, so page 9
    // is orphaned (and "sub" becomes a 16-byte value).
    let mut bytes = build(&Spec::default());
    let element = 8 * PAGE + 16 + 16;
    put32(&mut bytes, element, 0);
    assert_eq!(
        corruption(check(&bytes)),
        (9, Corruption::UnreachableUnfreed)
    );
    // A nested bucket's damage names its bucket path.
    let mut bytes = build(&Spec::default());
    put64(&mut bytes, 9 * PAGE, 99);
    match check(&bytes) {
        Err(e @ BboltError::Corrupt { .. }) => {
            let message = e.to_string();
            assert!(message.contains("gamma/sub"), "{message}");
            assert!(message.contains("page 9"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn meta_page_choice() {
    // Meta 1 with the higher transaction id wins when valid.
    let mut bytes = build(&Spec::default());
    let newer = meta(1, 3, 2, 12, 11);
    bytes[PAGE..2 * PAGE].copy_from_slice(&newer);
    assert_eq!(open(&bytes).unwrap().meta().page, 1);

    // A damaged newer meta page falls back to the older one.
    bytes[PAGE + 16 + 48] ^= 1;
    let db = open(&bytes).unwrap();
    assert_eq!((db.meta().page, db.meta().txid), (0, 10));
    db.check().unwrap();

    // Meta 0 damaged: the page size is found from meta 1.
    let mut bytes = build(&Spec::default());
    bytes[16] ^= 1;
    let db = open(&bytes).unwrap();
    assert_eq!((db.meta().page, db.page_size()), (1, PAGE as u32));

    // Both damaged.
    bytes[PAGE + 16 + 4] = 3;
    match open(&bytes) {
        Err(BboltError::NoValidMeta { meta0, meta1 }) => {
            assert!(matches!(meta0, MetaProblem::Magic(_)), "{meta0}");
            assert_eq!(meta1, MetaProblem::Version(3));
        }
        other => panic!("{other:?}"),
    }

    // A meta page that points past the end.
    let mut bytes = build(&Spec::default());
    let long = meta(0, 3, 2, 13, 12);
    bytes[..PAGE].copy_from_slice(&long);
    assert!(matches!(open(&bytes), Err(BboltError::Truncated { .. })));

    // No stored freelist: unreachable pages are free.
    let mut bytes = build(&Spec::default());
    bytes[..PAGE].copy_from_slice(&meta(0, 3, NO_FREELIST, 12, 12));
    let summary = open(&bytes).unwrap().check().unwrap();
    assert!(!summary.freelist_stored);
    assert_eq!(summary.free_pages, 3, "pages 2, 10, 11");
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_damage_never_panics() {
    let good = build(&Spec::default());
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut rejected = 0;
    for round in 0..1500 {
        let mut bytes = good.clone();
        // Damage headers and element tables more often than payloads.
        for _ in 0..1 + rng.next() % 4 {
            let page = (rng.next() % 12) as usize;
            let at = if rng.next().is_multiple_of(4) {
                rng.next() as usize % PAGE
            } else {
                rng.next() as usize % 96
            };
            let value = rng.next() as u8;
            bytes[page * PAGE + at] = if round % 2 == 0 { value } else { 0xff };
        }
        let cut = if round % 10 == 0 {
            bytes.len() - (rng.next() as usize % bytes.len())
        } else {
            bytes.len()
        };
        let path = dir.path().join("fuzz.db");
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let outcome = Db::open(&path, cut as u64).and_then(|db| {
            db.check()?;
            Ok(status::status(&db).is_ok())
        });
        if !matches!(outcome, Ok(true)) {
            rejected += 1;
        }
    }
    assert!(rejected > 500, "most damage is noticed: {rejected}");
}
