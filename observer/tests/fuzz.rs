//! Property tests ("fuzzing") of the parsers of user-controlled input
//! (issue 21): the stats segment reader, the trace-ring reader, the
//! `/proc/PID/maps` parser, ELF symbol reading, `--web.config.file`, the
//! `/metrics/ranks` query and the report data format. Each starts
//! from valid inputs and mutates them (bytes, words set to edge values,
//! truncation, extension), or makes them up entirely, and asserts that the
//! parser does not panic, allocates a bounded amount (a counting allocator
//! of this test binary; one allocation over 1 GiB aborts with a message),
//! and answers with an error rather than nonsense.
//!
//! CI mode (`cargo test --release -p mpi-observer --test fuzz`): a fixed
//! seed, no failure files, a few hundred cases per property, a few seconds
//! in all. `cargo xtask fuzz [--cases N]` runs the same properties with
//! `PROPTEST_CASES=N` and a fresh seed (`PROPTEST_RNG_SEED`, printed so a
//! failure can be replayed).

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    mem::{offset_of, size_of},
    path::{Path, PathBuf},
};

use mpi_observer::{
    attach::identity::LABEL_CAP,
    attach::symbols,
    client::report::{self, Data, FunctionData, PeerData, RankData, SiteData, StatsData},
    collect::segment::{self, Segment},
    export::{server, web_config},
    os::procfs::{self, MapEntry},
    record::shim::ShimRecorder,
};
use observer_common::{
    FUNCTION_COUNT,
    generated::functions::SPEC_FINGERPRINT,
    maps::HIST_SLOTS,
    segment::{self as seg, Header, Layout as SegLayout},
    trace::{self as t, Kind, RingHeader, TraceHeader},
};
use proptest::{
    prelude::*,
    test_runner::{Config, RngSeed},
};

// ---------------------------------------------------------------------
// Allocation accounting.

/// A single allocation above this aborts the test binary with a message:
/// a parser sized a buffer from its input.
const HARD_CAP: usize = 1 << 30;

thread_local! {
    /// Bytes allocated minus freed by this thread (frees of other threads'
    /// memory make it lower, never higher).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The highest `LIVE` since the last [`bounded`] began.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

struct Counting;

fn too_big(size: usize) -> ! {
    // No allocation here: format the number on the stack.
    let mut buf = [0u8; 128];
    let head = b"fuzz: one allocation of ";
    let tail = b" bytes, over the 1 GiB cap: a parser trusts a size from its input\n";
    let mut n = 0;
    buf[..head.len()].copy_from_slice(head);
    n += head.len();
    let mut digits = [0u8; 20];
    let (mut v, mut d) = (size, 0);
    loop {
        digits[d] = b'0' + (v % 10) as u8;
        d += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in (0..d).rev() {
        buf[n] = digits[i];
        n += 1;
    }
    let tail = &tail[..tail.len().min(buf.len() - n)];
    buf[n..n + tail.len()].copy_from_slice(tail);
    n += tail.len();
    // SAFETY: write(2) of our own stack buffer to stderr.
    unsafe { libc::write(2, buf.as_ptr().cast(), n) };
    std::process::abort()
}

fn account(delta: isize) {
    let _ = LIVE.try_with(|l| {
        let v = l.get().wrapping_add(delta);
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

// SAFETY: every call goes to the system allocator unchanged; we only count.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() > HARD_CAP {
            too_big(l.size());
        }
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            account(l.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.size() > HARD_CAP {
            too_big(l.size());
        }
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            account(l.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, l) };
        account(-(l.size() as isize));
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > HARD_CAP {
            too_big(new);
        }
        // SAFETY: the caller's contract, passed on.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            account(new as isize - l.size() as isize);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` and asserts that this thread's live heap grew by at most
/// `limit` bytes at any moment meanwhile.
fn bounded<T>(what: &str, limit: usize, f: impl FnOnce() -> T) -> T {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let r = f();
    let peak = PEAK.with(Cell::get) - start;
    assert!(
        peak <= limit as isize,
        "{what}: the heap grew by {peak} bytes, over the {limit} allowed"
    );
    r
}

// ---------------------------------------------------------------------
// Test configuration and mutations.

/// The CI configuration: `cases` cases unless `PROPTEST_CASES` says
/// otherwise, a fixed seed unless `PROPTEST_RNG_SEED` gives one, no
/// failure-persistence files (a failure prints its minimal input).
fn config(cases: u32) -> Config {
    let env = Config::default();
    Config {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            env.cases
        } else {
            cases
        },
        rng_seed: if std::env::var_os("PROPTEST_RNG_SEED").is_some() {
            env.rng_seed
        } else {
            RngSeed::Fixed(0x6d70_692d_6f62_7321)
        },
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..env
    }
}

/// One change to a valid input.
#[derive(Clone, Debug)]
enum Mutation {
    /// Flip one bit.
    Flip { at: usize, bit: u8 },
    /// Set one byte.
    Byte { at: usize, value: u8 },
    /// Overwrite 4 or 8 bytes (aligned) with an edge value.
    Word { at: usize, value: u64, wide: bool },
    /// Cut the input to a length.
    Truncate { at: usize },
    /// Append bytes.
    Extend { bytes: Vec<u8> },
    /// Remove a range.
    Delete { at: usize, len: usize },
}

/// Values parsers tend to trust.
fn edge_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::from(u32::MAX)),
        Just(u64::from(u32::MAX) + 1),
        Just(u64::MAX),
        Just(i64::MAX as u64),
        Just(1 << 40),
        Just(1 << 20),
        Just(4096),
        0u64..70_000,
        any::<u64>(),
    ]
}

/// Mutations, their positions drawn within `len` (or within one of
/// `regions`, the parts of the input a parser reads first, half the time).
fn mutations(len: usize, regions: Vec<(usize, usize)>) -> impl Strategy<Value = Vec<Mutation>> {
    let len = len.max(1);
    let pos = {
        let regions = regions.clone();
        (any::<bool>(), any::<prop::sample::Index>(), any::<usize>()).prop_map(
            move |(in_region, which, off)| {
                if in_region && !regions.is_empty() {
                    let (start, n) = regions[which.index(regions.len())];
                    (start + off % n.max(1)).min(len - 1)
                } else {
                    off % len
                }
            },
        )
    };
    let one = prop_oneof![
        4 => (pos.clone(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        4 => (pos.clone(), any::<u8>()).prop_map(|(at, value)| Mutation::Byte { at, value }),
        4 => (pos.clone(), edge_value(), any::<bool>())
            .prop_map(|(at, value, wide)| Mutation::Word { at, value, wide }),
        1 => (0..len).prop_map(|at| Mutation::Truncate { at }),
        1 => prop::collection::vec(any::<u8>(), 1..4096).prop_map(|bytes| Mutation::Extend { bytes }),
        1 => (pos, 1usize..256).prop_map(|(at, len)| Mutation::Delete { at, len }),
    ];
    prop::collection::vec(one, 1..8)
}

fn apply(mut b: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let n = b.len();
        match *m {
            Mutation::Flip { at, bit } if at < n => b[at] ^= 1 << bit,
            Mutation::Byte { at, value } if at < n => b[at] = value,
            Mutation::Word { at, value, wide } => {
                let w = if wide { 8 } else { 4 };
                let at = at & !(w - 1);
                if at + w <= n {
                    b[at..at + w].copy_from_slice(&value.to_ne_bytes()[..w]);
                }
            }
            Mutation::Truncate { at } => b.truncate(at),
            Mutation::Extend { ref bytes } => b.extend_from_slice(bytes),
            Mutation::Delete { at, len } if at < n => {
                b.drain(at..(at + len).min(n));
            }
            _ => {}
        }
    }
    b
}

/// A scratch directory of this test binary.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mpi-observer-fuzz.{}.{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn put(b: &mut [u8], off: usize, v: &[u8]) {
    b[off..off + v.len()].copy_from_slice(v);
}

// ---------------------------------------------------------------------
// The stats segment reader (observer/src/collect/segment.rs), through the file the
// daemon reads: this process's own segment path.

/// A valid version-4 segment with 4 peers, 8 request slots, 16 call-site
/// slots and a wait ring of 16; every counter after the header (the ring
/// too) is from `body`.
fn segment_image(body: &[u8]) -> Vec<u8> {
    let (peers, funcs, reqs, sites, waits) = (4u32, FUNCTION_COUNT as u32, 8u32, 16u32, 16u32);
    let l = SegLayout::new(seg::VERSION, peers, funcs, reqs, sites, waits);
    let mut b = vec![0u8; l.size as usize];
    for (i, x) in b.iter_mut().enumerate().skip(l.header_size as usize) {
        *x = body.get(i % body.len().max(1)).copied().unwrap_or(0);
    }
    put(&mut b, 0, &seg::MAGIC);
    put(
        &mut b,
        offset_of!(Header, version),
        &seg::VERSION.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(Header, header_size),
        &(l.header_size as u32).to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(Header, total_size),
        &l.size.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(Header, spec_fingerprint),
        &SPEC_FINGERPRINT.to_ne_bytes(),
    );
    put(&mut b, offset_of!(Header, world_size), &4u32.to_ne_bytes());
    put(&mut b, offset_of!(Header, peer_slots), &peers.to_ne_bytes());
    put(
        &mut b,
        offset_of!(Header, function_slots),
        &funcs.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(Header, request_slots),
        &reqs.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(Header, counters_offset),
        &l.counters.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(Header, peers_offset),
        &l.peers.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(Header, functions_offset),
        &l.functions.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(Header, requests_offset),
        &l.requests.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(Header, timing_offset),
        &l.timing.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(Header, callsites_offset),
        &l.callsites.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(Header, callsite_slots),
        &sites.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(Header, waits_offset),
        &l.waits.to_ne_bytes(),
    );
    put(&mut b, offset_of!(Header, wait_slots), &waits.to_ne_bytes());
    put(&mut b, offset_of!(Header, ready), &1u32.to_ne_bytes());
    b
}

/// The tests share this process's one segment path.
static SEGMENT_PATH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `bytes` as this process's shim file (the segment, or the trace file if
/// `trace`), under the shim's naming and mapped as the shim keeps it, so
/// the readers find it in `/proc/self/maps`; unmapped and removed on drop.
struct OwnShimFile {
    path: std::path::PathBuf,
    map: *mut libc::c_void,
}

impl OwnShimFile {
    fn new(bytes: &[u8], trace: bool) -> OwnShimFile {
        use std::os::{fd::AsRawFd as _, unix::fs::PermissionsExt as _};
        let mut b = [0u8; seg::NAME_MAX];
        let n = seg::Name {
            // SAFETY: getuid cannot fail.
            uid: Some(unsafe { libc::getuid() }),
            pid: std::process::id(),
            random: Some(0xf022),
            trace,
        }
        .write(&mut b);
        let path = std::path::Path::new(seg::DIR).join(std::str::from_utf8(&b[..n]).unwrap());
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: a shared read-only mapping of a file we own; never
        // touched (a page past its end is never accessed).
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        OwnShimFile { path, map }
    }
}

impl Drop for OwnShimFile {
    fn drop(&mut self) {
        // SAFETY: our mapping, unused by now.
        unsafe { libc::munmap(self.map, 4096) };
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Reads `bytes` as this process's segment, as the daemon does.
fn read_segment(bytes: &[u8]) -> Result<segment::Figures, segment::SegmentProblem> {
    let _one = SEGMENT_PATH.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    let file = OwnShimFile::new(bytes, false);
    let r = bounded("the segment reader", 8 << 20, || {
        Segment::open(pid).map(|s| {
            let s = s.expect("the segment just written");
            // The wait ring, drained as the daemon does, and its records
            // matched as a 4-rank job's rank 1.
            let (mut cursor, mut records) = (0, Vec::new());
            if let Ok(Some(d)) = s.drain_waits(&mut cursor, &mut records) {
                assert_eq!(records.len() as u64, d.drained.read);
                assert!(d.drained.read <= u64::from(observer_common::waits::MAX_RING_SLOTS));
                let mut w = mpi_observer::collect::waits::Waits::default();
                w.add(
                    "job",
                    &mpi_observer::collect::waits::Drain {
                        rank: 1,
                        world_size: d.world_size,
                        shift: d.sample_shift,
                        clock: d.drained.clock,
                        ns_per_tick: d.drained.ns_per_tick,
                        records: &records,
                        lost: d.drained.lost,
                        p2p_shift: d.drained.p2p_shift,
                        skipped: d.drained.skipped,
                    },
                    0,
                );
                w.settle(u64::MAX);
                assert_eq!(w.pending(), 0);
            }
            s.read()
        })
    });
    drop(file);
    r?
}

fn check_figures(f: &segment::Figures) {
    assert!(f.peers.len() <= seg::MAX_PEER_SLOTS as usize);
    assert!(f.functions.len() <= FUNCTION_COUNT);
    assert!(f.timing.len() <= FUNCTION_COUNT);
    assert!(f.callsites.len() <= seg::CALLSITE_SLOTS as usize);
    assert!(f.outstanding <= u64::from(seg::REQUEST_SLOTS));
}

fn header_regions() -> Vec<(usize, usize)> {
    vec![(0, size_of::<Header>())]
}

#[test]
fn segment_reader_valid_image_reads() {
    let f = read_segment(&segment_image(&[0])).expect("a valid zeroed segment");
    assert!(f.ready);
    assert_eq!(f.world_size, 4);
}

proptest! {
    #![proptest_config(config(512))]

    /// Mutated valid segments: figures within the layout's bounds, or an
    /// error; never a panic.
    #[test]
    fn segment_reader_mutated(
        body in prop::collection::vec(any::<u8>(), 1..512),
        ms in mutations(segment_image(&[0]).len(), header_regions()),
    ) {
        let img = apply(segment_image(&body), &ms);
        if let Ok(f) = read_segment(&img) {
            check_figures(&f);
        }
    }

    /// Random bytes behind the magic, of random lengths.
    #[test]
    fn segment_reader_random(tail in prop::collection::vec(any::<u8>(), 0..8192)) {
        let mut img = seg::MAGIC.to_vec();
        img.extend(tail);
        if let Ok(f) = read_segment(&img) {
            check_figures(&f);
        }
    }
}

// ---------------------------------------------------------------------
// The trace-ring reader (observer/src/record/shim.rs with
// observer_common::trace), through this process's own trace file.

const TRACE_RINGS: u32 = 2;
const TRACE_EVENTS: u32 = 64;

/// A valid trace file of 2 rings of 64 events; ring heads, tails, owners
/// and events from `body`.
fn trace_image(body: &[u8]) -> Vec<u8> {
    let len = t::file_bytes(TRACE_RINGS, TRACE_EVENTS) as usize;
    let mut b = vec![0u8; len];
    for (i, x) in b.iter_mut().enumerate().skip(t::HEADER_BYTES as usize) {
        *x = body.get(i % body.len().max(1)).copied().unwrap_or(0);
    }
    put(&mut b, offset_of!(TraceHeader, magic), &t::MAGIC);
    put(
        &mut b,
        offset_of!(TraceHeader, version),
        &t::VERSION.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(TraceHeader, header_size),
        &(size_of::<TraceHeader>() as u32).to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(TraceHeader, total_size),
        &(len as u64).to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(TraceHeader, ring_count),
        &TRACE_RINGS.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(TraceHeader, ring_events),
        &TRACE_EVENTS.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(TraceHeader, rings_offset),
        &t::HEADER_BYTES.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(TraceHeader, world_size),
        &2u32.to_ne_bytes(),
    );
    put(&mut b, offset_of!(TraceHeader, ready), &1u32.to_ne_bytes());
    // Keep each ring's head and tail near each other half the time, so
    // drains read events rather than refuse a corrupt head.
    for i in 0..TRACE_RINGS {
        let r = t::ring_offset(i, TRACE_EVENTS) as usize;
        let base = u64::from(body.first().copied().unwrap_or(0)) << 8;
        let ahead = u64::from(body.get(1).copied().unwrap_or(0)) % 80;
        if body.get(2).is_some_and(|x| x % 2 == 0) {
            put(
                &mut b,
                r + offset_of!(RingHeader, tail),
                &base.to_ne_bytes(),
            );
            put(
                &mut b,
                r + offset_of!(RingHeader, head),
                &(base + ahead).to_ne_bytes(),
            );
        }
    }
    b
}

/// The tests share this process's one trace path.
static TRACE_PATH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Opens `bytes` as this process's trace file and records from it as
/// `mpi-observer record` does; returns the events drained, or `None` when
/// the reader refused the file.
fn record_from(bytes: &[u8]) -> Option<u64> {
    let _one = TRACE_PATH.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    let file = OwnShimFile::new(bytes, true);
    let r = bounded("the trace reader", 8 << 20, || {
        let mut rec = ShimRecorder::open(pid)?;
        let _ = (rec.world_rank(), rec.world_size());
        let mut n = 0;
        let mut visit = |_owner: u32, e: &t::TraceEvent| {
            let _ = Kind::of(e);
            let _ = e.comm_ranks();
            n += 1;
        };
        // A drain before the start reads what the file claims is there.
        // The file never shrinks here: no page can vanish.
        let before = rec.drain(&mut visit).expect("no page vanished");
        rec.start();
        let after = rec.drain(&mut visit).expect("no page vanished");
        let _ = rec.dropped();
        rec.stop();
        let last = rec.drain(&mut visit).expect("no page vanished");
        let ring_cap = u64::from(TRACE_RINGS) * u64::from(TRACE_EVENTS);
        assert!(before <= ring_cap && after <= ring_cap && last <= ring_cap);
        assert_eq!(before + after + last, n);
        Some(n)
    });
    drop(file);
    r
}

#[test]
fn trace_reader_valid_file_opens() {
    assert_eq!(record_from(&trace_image(&[0, 0, 0])), Some(0));
}

proptest! {
    #![proptest_config(config(512))]

    /// Mutated valid trace files: bounded drains, or refused; never a
    /// panic or a read outside the mapping.
    #[test]
    fn trace_reader_mutated_and_random(
        body in prop::collection::vec(any::<u8>(), 3..256),
        ms in mutations(
            t::file_bytes(TRACE_RINGS, TRACE_EVENTS) as usize,
            vec![
                (0, size_of::<TraceHeader>()),
                (t::HEADER_BYTES as usize, size_of::<RingHeader>()),
                (t::ring_offset(1, TRACE_EVENTS) as usize, size_of::<RingHeader>()),
            ],
        ),
        random in prop::collection::vec(any::<u8>(), 0..8192),
    ) {
        let _ = record_from(&apply(trace_image(&body), &ms));
        let mut img = t::MAGIC.to_vec();
        img.extend(random);
        let _ = record_from(&img);
    }
}

// ---------------------------------------------------------------------
// The `/proc/PID/maps` parser (observer/src/os/procfs.rs `parse_maps`): the
// kernel writes the fields, but the path is the user's choice (spaces,
// ` (deleted)` in the name, any byte but a newline).

/// A maps line as the kernel prints it.
fn maps_line(m: &MapEntry, raw_path: &[u8]) -> Vec<u8> {
    let perms = [
        if m.read { 'r' } else { '-' },
        if m.write { 'w' } else { '-' },
        if m.exec { 'x' } else { '-' },
        if m.shared { 's' } else { 'p' },
    ];
    let mut l = format!(
        "{:08x}-{:08x} {} {:08x} {:02x}:{:02x} {}",
        m.start,
        m.end,
        perms.iter().collect::<String>(),
        m.offset,
        m.dev.0,
        m.dev.1,
        m.inode
    )
    .into_bytes();
    if !raw_path.is_empty() {
        // The kernel pads the path to a column.
        l.resize(73.max(l.len() + 1), b' ');
        l.extend_from_slice(raw_path);
    }
    l
}

/// A path a user can give her file: absolute, any byte but NUL and the
/// newline, spaces and a fake ` (deleted)` included.
fn user_path() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        4 => b'a'..=b'z',
        2 => Just(b' '),
        1 => Just(b'/'),
        1 => 1u8..=255,
    ]
    .prop_filter("no newline", |b| *b != b'\n');
    (
        prop::collection::vec(byte, 0..40),
        prop_oneof![
            Just(&b""[..]),
            Just(&b" (deleted)"[..]),
            Just(&b"libmpi.so.40"[..])
        ],
    )
        .prop_map(|(mut p, tail)| {
            p.insert(0, b'/');
            p.extend_from_slice(tail);
            p
        })
}

fn any_map_entry() -> impl Strategy<Value = MapEntry> {
    (
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
        (any::<[bool; 4]>(), any::<u32>(), any::<u32>()),
    )
        .prop_map(|((a, b, offset, inode), (p, major, minor))| MapEntry {
            start: a.min(b),
            end: a.max(b),
            read: p[0],
            write: p[1],
            exec: p[2],
            shared: p[3],
            offset,
            dev: (major, minor),
            inode,
            path: None,
            deleted: false,
        })
}

proptest! {
    #![proptest_config(config(1024))]

    /// Lines as the kernel writes them, with any user path, read back
    /// whole: the path is never cut at a space, a ` (deleted)` the kernel
    /// appended is taken off (once), and the fields are exact.
    #[test]
    fn maps_parser_round_trip(
        entries in prop::collection::vec((any_map_entry(), user_path(), any::<bool>()), 1..16),
    ) {
        use std::os::unix::ffi::OsStrExt as _;
        let mut text = Vec::new();
        for (m, p, deleted) in &entries {
            let mut raw = p.clone();
            if *deleted {
                raw.extend_from_slice(b" (deleted)");
            }
            text.extend(maps_line(m, &raw));
            text.push(b'\n');
        }
        let got = bounded("parse_maps", 64 * text.len() + (1 << 20), || procfs::parse_maps(&text));
        prop_assert_eq!(got.len(), entries.len());
        for (g, (m, p, deleted)) in got.iter().zip(&entries) {
            // The kernel's mark is the last ` (deleted)`; a name of the
            // user's ending the same way is indistinguishable from it.
            let (want, marked) = match p.strip_suffix(b" (deleted)") {
                Some(stripped) if !*deleted => (stripped, true),
                _ => (&p[..], *deleted),
            };
            prop_assert_eq!(g.path.as_deref().map(|p| p.as_os_str().as_bytes()), Some(want));
            prop_assert_eq!(g.deleted, marked);
            prop_assert_eq!(
                (g.start, g.end, g.offset, g.dev, g.inode),
                (m.start, m.end, m.offset, m.dev, m.inode)
            );
            prop_assert_eq!((g.read, g.write, g.exec, g.shared), (m.read, m.write, m.exec, m.shared));
        }
    }

    /// Mutated real maps text (this process's own) and random bytes: no
    /// panic, and every entry it returns is well formed.
    #[test]
    fn maps_parser_mutated(ms in mutations(own_maps().len(), vec![]), random in prop::collection::vec(any::<u8>(), 0..2048)) {
        for text in [apply(own_maps(), &ms), random] {
            let got = bounded("parse_maps", 64 * text.len() + (1 << 20), || procfs::parse_maps(&text));
            prop_assert!(got.len() <= text.split(|b| *b == b'\n').count());
            for m in got {
                prop_assert!(m.start <= m.end);
                if let Some(p) = &m.path {
                    prop_assert!(p.is_absolute());
                }
            }
        }
    }
}

fn own_maps() -> Vec<u8> {
    static MAPS: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    MAPS.get_or_init(|| std::fs::read("/proc/self/maps").unwrap())
        .clone()
}

// ---------------------------------------------------------------------
// ELF symbol reading (observer/src/attach/symbols.rs), of mutated copies of a real
// libmpi and of a small stand-in library, from a temporary file.

/// Debian Open MPI's library, when installed.
const REAL_LIBMPI: &str = "/usr/lib/x86_64-linux-gnu/libmpi.so.40";

/// The parts of an ELF file its reader trusts first: the ELF header, the
/// program and section header tables, and the dynamic symbol and string
/// tables, as (offset, length).
fn elf_regions(data: &[u8]) -> Vec<(usize, usize)> {
    use object::{Object as _, ObjectSection as _};
    let mut r = vec![(0, 64)];
    let word = |o: usize, n: usize| {
        data.get(o..o + n)
            .map(|b| b.iter().rev().fold(0u64, |a, x| a << 8 | u64::from(*x)) as usize)
    };
    if let (Some(phoff), Some(phnum)) = (word(0x20, 8), word(0x38, 2)) {
        r.push((phoff, phnum * 56));
    }
    if let (Some(shoff), Some(shnum)) = (word(0x28, 8), word(0x3c, 2)) {
        r.push((shoff, shnum * 64));
    }
    if let Ok(f) = object::File::parse(data) {
        for name in [".dynsym", ".dynstr", ".gnu.hash", ".dynamic", ".rodata"] {
            if let Some((o, n)) = f.section_by_name(name).and_then(|s| s.file_range()) {
                r.push((o as usize, n as usize));
            }
        }
    }
    r.retain(|(o, n)| *n > 0 && o + n <= data.len());
    r
}

/// `tests/programs/attack/stubmpi.c` built as a small `libmpi.so.40`: an
/// ELF file with MPI symbols whose every byte a mutation has a fair chance
/// to hit.
fn small_libmpi() -> Vec<u8> {
    let dir = scratch("elf");
    let out = dir.join("libmpi.so.40");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/programs/attack/stubmpi.c");
    let o = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-DAS_OPEN_MPI", "-o"])
        .arg(&out)
        .arg(&src)
        .output()
        .expect("running cc");
    assert!(
        o.status.success(),
        "cc {}: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::read(&out).unwrap()
}

/// Reads `bytes` as a library file named `libmpi.so.40`, as the daemon
/// does, and checks what it found against the file.
fn read_elf(bytes: &[u8], name: &str) {
    let dir = scratch(name);
    let path = dir.join("libmpi.so.40");
    std::fs::write(&path, bytes).unwrap();
    let limit = 3 * bytes.len() + (32 << 20);
    bounded("read_library", limit, || {
        if let Ok(lib) = symbols::read_library(&path) {
            assert!(lib.entries.len() <= FUNCTION_COUNT);
            for e in lib.entries.values() {
                // In the file (past a skipped prologue of at most 16 bytes).
                assert!(e.file_offset < bytes.len() as u64 + 16, "{e:?}");
            }
        }
        let _ = symbols::parse_data_symbols(bytes, "libmpi.so.40", "ompi_mpi_");
    });
    // A copy of libmpi is 1.2 MB: leave none behind in /tmp.
    let _ = std::fs::remove_file(&path);
}

#[test]
fn elf_reader_reads_the_originals() {
    let small = small_libmpi();
    let dir = scratch("elf-originals");
    let path = dir.join("libmpi.so.40");
    std::fs::write(&path, &small).unwrap();
    let lib = symbols::read_library(&path).expect("the stand-in library");
    assert_eq!(lib.entries.len(), 2, "PMPI_Barrier and PMPI_Send");
    if Path::new(REAL_LIBMPI).exists() {
        let lib = symbols::read_library(Path::new(REAL_LIBMPI)).expect("Open MPI's libmpi");
        assert_eq!(lib.name, "openmpi");
    }
}

proptest! {
    #![proptest_config(config(384))]

    /// Mutated copies of a small MPI library.
    #[test]
    fn elf_reader_small_mutated(ms in mutations(small_libmpi_len(), small_regions())) {
        read_elf(&apply(small_libmpi_cached(), &ms), "elf-small");
    }
}

proptest! {
    #![proptest_config(config(96))]

    /// Mutated copies of Debian Open MPI's libmpi (1.2 MB each: fewer
    /// cases). Skipped where it is not installed.
    #[test]
    fn elf_reader_libmpi_mutated(ms in mutations(real_len(), real_regions())) {
        if let Some(real) = real_libmpi() {
            read_elf(&apply(real, &ms), "elf-real");
        }
    }
}

fn small_libmpi_cached() -> Vec<u8> {
    static SMALL: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    SMALL.get_or_init(small_libmpi).clone()
}

fn small_libmpi_len() -> usize {
    small_libmpi_cached().len()
}

fn small_regions() -> Vec<(usize, usize)> {
    elf_regions(&small_libmpi_cached())
}

fn real_libmpi() -> Option<Vec<u8>> {
    static REAL: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
    REAL.get_or_init(|| std::fs::read(REAL_LIBMPI).ok()).clone()
}

fn real_len() -> usize {
    real_libmpi().map_or(1, |r| r.len())
}

fn real_regions() -> Vec<(usize, usize)> {
    real_libmpi().map_or_else(Vec::new, |r| elf_regions(&r))
}

// ---------------------------------------------------------------------
// `--web.config.file` (observer/src/export/web_config.rs).

/// Valid configurations (and one for each refusal), as seeds.
const WEB_CONFIGS: &[&str] = &[
    "basic_auth_users:\n  prometheus: $2y$10$X0h4W2W4kbq6fKAcnNQnqu1oZ3N0r2GAdEGE9tS4wHlKdm7bGZq0e\n",
    "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n    Strict-Transport-Security: max-age=31536000\n",
    "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  min_version: TLS12\n  max_version: TLS13\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n",
    "tls_server_config:\n  cert: \"-----BEGIN CERTIFICATE-----\\nMIIBAA==\\n-----END CERTIFICATE-----\\n\"\n  key: \"-----BEGIN PRIVATE KEY-----\\nMIIBAA==\\n-----END PRIVATE KEY-----\\n\"\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n  curve_preferences: [X25519, CurveP256]\n",
    "tls_server_config: {}\nhttp_server_config: {http2: true}\nbasic_auth_users: {}\n",
    "rate_limit:\n  interval: 1s\n",
    "",
];

/// The format's own words and YAML's punctuation, for made-up files.
const WEB_TOKENS: &[&str] = &[
    "tls_server_config:",
    "http_server_config:",
    "basic_auth_users:",
    "cert_file: ",
    "key:",
    "client_ca:",
    "headers:",
    "min_version: ",
    "client_auth_type: ",
    "\n",
    "  ",
    "- ",
    "{",
    "}",
    "[",
    "]",
    ": ",
    "\"",
    "&a ",
    "*a",
    "!!binary ",
    "<<: ",
    "TLS12",
    "$2y$31$",
    "~",
    "null",
    "1e999",
];

/// Loads `text` as a web config file from a directory holding only it.
fn load_web_config(text: &[u8]) {
    let dir = scratch("web");
    let path = dir.join("web.yml");
    std::fs::write(&path, text).unwrap();
    let limit = 64 * text.len() + (16 << 20);
    let r = bounded("web_config::load", limit, || web_config::load(&path));
    if let Err(e) = r {
        let line = e.to_string();
        assert!(!line.contains('\n'), "an error is one line: {line:?}");
        assert!(!line.is_empty());
    }
}

#[test]
fn web_config_seeds_load() {
    for (i, s) in WEB_CONFIGS.iter().enumerate() {
        let dir = scratch("web-seeds");
        let path = dir.join("web.yml");
        std::fs::write(&path, s).unwrap();
        let r = web_config::load(&path);
        // Seeds 2 and 3 name missing files and bad PEM, 5 rate_limit; the
        // others are valid (a tls_server_config without any certificate
        // serves plain HTTP).
        assert_eq!(r.is_ok(), matches!(i, 0 | 1 | 4 | 6), "seed {i}: {r:?}");
    }
}

proptest! {
    #![proptest_config(config(512))]

    /// Mutated seeds.
    #[test]
    fn web_config_mutated(
        which in 0..WEB_CONFIGS.len(),
        ms in mutations(256, vec![]),
    ) {
        load_web_config(&apply(WEB_CONFIGS[which].as_bytes().to_vec(), &ms));
    }

    /// YAML-looking text made up from the format's own words.
    #[test]
    fn web_config_random(parts in prop::collection::vec(prop_oneof![
        3 => prop::sample::select(WEB_TOKENS).prop_map(str::to_string),
        1 => "[a-zA-Z0-9:$./-]{0,12}",
    ], 0..64)) {
        load_web_config(parts.concat().as_bytes());
    }
}

// ---------------------------------------------------------------------
// The `/metrics/ranks` query (observer/src/export/server/query.rs
// `ranks_query`): the query string of any client that can reach the port.

/// Queries as scrapers and people send them (and one for each refusal),
/// as seeds.
const QUERIES: &[&str] = &[
    "",
    "jobid=42",
    "jobid=42&jobid=a%20b%22c&jobid=x+y",
    "jobid=%E2%9C%93&&jobid=",
    "jobid=1&rank=0",
    "jobid=%zz",
    "jobid=%4",
];

/// The parser's own words and escapes, for made-up queries.
const QUERY_TOKENS: &[&str] = &[
    "jobid",
    "=",
    "&",
    "+",
    "%",
    "%2",
    "%20",
    "%41",
    "%2B",
    "%26",
    "%3D",
    "%00",
    "%ff",
    "%FF",
    "%E2%9C%93",
    "%C3",
    "%c3%a9",
    "%ED%A0%80",
    "jobid=",
    "&jobid=",
    "rank",
    "%6Aobid",
];

/// Encodes `job` as a query value: `%XX` for every byte but ASCII letters
/// and digits, which `seed`'s bits leave plain or escape too (either hex
/// case), and a space as `+` or `%20`.
fn encode_query_value(job: &str, seed: u64) -> String {
    let mut out = String::with_capacity(3 * job.len());
    for (i, &b) in job.as_bytes().iter().enumerate() {
        let bit = (seed >> (i % 64)) & 1 == 1;
        let upper = seed.rotate_left(i as u32 % 64 + 1) & 1 == 1;
        match b {
            b' ' if bit => out.push('+'),
            b if b.is_ascii_alphanumeric() && !bit => out.push(char::from(b)),
            b if upper => out.push_str(&format!("%{b:02X}")),
            b => out.push_str(&format!("%{b:02x}")),
        }
    }
    out
}

/// A job id as a user or a scheduler may spell it: any Unicode, up to a
/// little over the label cap in bytes, edge lengths included.
fn any_jobid() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-zA-Z0-9._-]{0,12}",
        2 => prop::collection::vec(any::<char>(), 0..40).prop_map(String::from_iter),
        1 => (LABEL_CAP - 2..LABEL_CAP + 3).prop_map(|n| "j".repeat(n)),
        1 => (LABEL_CAP / 2 - 1..LABEL_CAP / 2 + 2).prop_map(|n| "\u{e9}".repeat(n)),
        1 => Just(" +&=%".to_string()),
    ]
}

/// Parses `q` within an allocation budget (linear in the query) and checks
/// what any answer must hold: at most `MAX_JOBIDS` job ids, each at most
/// the label cap; a refusal is one line without control characters,
/// naming at most a label's worth of the client's text.
fn ranks_query_checked(q: &str) -> Result<Option<Vec<String>>, server::QueryError> {
    let limit = 4 * q.len() + (64 << 10);
    let r = bounded("ranks_query", limit, || server::ranks_query(Some(q)));
    match &r {
        Ok(Some(jobs)) => {
            assert!(!jobs.is_empty());
            assert!(jobs.len() <= server::MAX_JOBIDS, "{} job ids", jobs.len());
            for j in jobs {
                assert!(j.len() <= LABEL_CAP, "a job id of {} bytes", j.len());
            }
        }
        Ok(None) => {}
        Err(e) => {
            let line = e.to_string();
            // One line, with nothing of the client's that a terminal acts on.
            assert!(
                !line.is_empty() && !line.chars().any(char::is_control),
                "{line:?}"
            );
            if let server::QueryError::Unknown { name } = e {
                assert!(name.len() <= LABEL_CAP, "a name of {} bytes", name.len());
            }
        }
    }
    r
}

/// The job ids of an accepted query, encoded again (letters and digits
/// plain, every other byte escaped), are accepted as the same ids.
fn reads_back(r: Result<Option<Vec<String>>, server::QueryError>) {
    let Ok(Some(jobs)) = r else { return };
    let q: Vec<String> = jobs
        .iter()
        .map(|j| format!("jobid={}", encode_query_value(j, 0)))
        .collect();
    assert_eq!(ranks_query_checked(&q.join("&")), Ok(Some(jobs)));
}

#[test]
fn ranks_query_seeds_parse() {
    let got: Vec<bool> = QUERIES
        .iter()
        .map(|q| ranks_query_checked(q).is_ok())
        .collect();
    assert_eq!(got, [true, true, true, true, false, false, false]);
}

proptest! {
    #![proptest_config(config(1024))]

    /// Job ids encoded as a client may encode them, with empty pairs
    /// between, read back exactly; past `MAX_JOBIDS` ids, or an id longer
    /// than the label cap, refused with the error that says so, at the
    /// first one in order.
    #[test]
    fn ranks_query_round_trip(
        jobs in prop::collection::vec((any_jobid(), any::<u64>(), 0usize..3), 0..server::MAX_JOBIDS + 4),
    ) {
        let mut q = String::new();
        for (job, seed, empties) in &jobs {
            q.push_str(&"&".repeat(*empties));
            if !q.is_empty() {
                q.push('&');
            }
            q.push_str("jobid=");
            q.push_str(&encode_query_value(job, *seed));
        }
        let want = jobs
            .iter()
            .enumerate()
            .find_map(|(i, (j, _, _))| {
                if i == server::MAX_JOBIDS {
                    Some(server::QueryError::TooMany)
                } else if j.len() > LABEL_CAP {
                    Some(server::QueryError::TooLong)
                } else {
                    None
                }
            })
            .map_or_else(
                || Ok((!jobs.is_empty()).then(|| jobs.iter().map(|j| j.0.clone()).collect())),
                Err,
            );
        prop_assert_eq!(ranks_query_checked(&q), want, "query {:?}", q);
    }

    /// Mutated seeds (as text: a URI's query is a `&str`).
    #[test]
    fn ranks_query_mutated(which in 0..QUERIES.len(), ms in mutations(64, vec![])) {
        let bytes = apply(QUERIES[which].as_bytes().to_vec(), &ms);
        reads_back(ranks_query_checked(&String::from_utf8_lossy(&bytes)));
    }

    /// Queries made up from the parser's own words and escapes, and long
    /// runs of one (a value or a name far over the cap, escape or not).
    #[test]
    fn ranks_query_random(
        parts in prop::collection::vec(prop_oneof![
            6 => prop::sample::select(QUERY_TOKENS).prop_map(str::to_string),
            2 => "[a-zA-Z0-9%+&=]{0,8}",
            1 => (prop::sample::select(QUERY_TOKENS), 0usize..4096).prop_map(|(t, n)| t.repeat(n)),
        ], 0..96),
    ) {
        reads_back(ranks_query_checked(&parts.concat()));
    }
}

// ---------------------------------------------------------------------
// The report data format (observer/src/export/report.rs, read back by observer/src/client/report/): what `mpi-observer report
// FILE` and `--url` read, then analyse and render.

fn report_seed() -> Data {
    let rank = |r: u32| RankData {
        jobid: "job7".into(),
        rank: r.to_string(),
        size: "2".into(),
        pid: 100 + r,
        uid: Some(1000),
        host: "node1".into(),
        library: "openmpi".into(),
        version: "4.1.4".into(),
        since: 1000.0,
        exited: Some(1010.0),
        source: "shim".into(),
        functions: vec![FunctionData {
            name: "MPI_Barrier".into(),
            calls: 1000,
            time_ns: 2_000_000_000,
            bytes_sent: 0,
            bytes_recv: 0,
            hist: vec![3; HIST_SLOTS],
        }],
        callsites: vec![SiteData {
            function: "MPI_Barrier".into(),
            site: "main at two.c:10".into(),
            calls: 300,
            time_ns: 1_000_000,
        }],
        stats: Some(StatsData {
            peers: vec![PeerData {
                peer: 1 - r,
                messages_sent: 10,
                bytes_sent: 80,
                messages_recv: 10,
                bytes_recv: 80,
            }],
            sizes_sent: vec![1; HIST_SLOTS],
            sizes_recv: vec![0; HIST_SLOTS],
        }),
        scheduler: Some(report::SchedulerData {
            scheduler: "slurm".into(),
            step: "0".into(),
            user: "alice".into(),
            account: "physics".into(),
            partition: "debug".into(),
            array_job: "4".into(),
            array_task: r.to_string(),
        }),
    };
    Data {
        format: report_format(),
        host: "node1".into(),
        taken: 1011.0,
        ranks: vec![rank(0), rank(1)],
        waits: vec![report::WaitData {
            jobid: "job7".into(),
            uid: Some(1000),
            patterns: vec![
                report::PatternWaitData {
                    pattern: "wait_nxn".into(),
                    waited_ns: 3_000_000_000,
                    instances: 100,
                },
                report::PatternWaitData {
                    pattern: "late_sender".into(),
                    waited_ns: 1_000_000_000,
                    instances: 50,
                },
            ],
            unresolved: vec![report::CountData {
                reason: "incomplete".into(),
                count: 3,
            }],
            pending: 1,
            records_lost: 2,
            records_invalid: 0,
            sample_period: 1,
            p2p_sample_period: 8,
            ranks: vec![
                report::RankWaitData {
                    rank: 0,
                    waited_ns: vec![3_000_000_000, 1_000_000_000],
                    caused_ns: vec![0, 0],
                    late_ns: vec![0, 0],
                },
                report::RankWaitData {
                    rank: 1,
                    waited_ns: vec![0, 0],
                    caused_ns: vec![3_000_000_000, 1_000_000_000],
                    late_ns: vec![3_000_000_000, 1_000_000_000],
                },
            ],
            functions: vec![report::FunctionWaitData {
                function: "MPI_Allreduce".into(),
                pattern: "wait_nxn".into(),
                waited_ns: 3_000_000_000,
            }],
            clock_uncertainty_ns: Some(300_000),
        }],
    }
}

fn report_format() -> String {
    report::FORMAT.to_string()
}

/// Parses, analyses and renders `text` as `report` does.
fn report_on(text: &[u8]) {
    let limit = 64 * text.len() + (16 << 20);
    bounded("report", limit, || match Data::parse(text, "fuzz") {
        Ok(d) => analyse_and_render(d),
        Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
    });
}

fn analyse_and_render(d: Data) {
    let reps = report::analyse(&[d], report::Limits::default());
    let _ = report::text::render(&reps);
    let _ = report::html::render(&reps);
    let _ = report::json(&reps);
}

/// A rank's label as a user can set it (through OMPI_COMM_WORLD_RANK and
/// friends), edge values included.
fn label() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just("1".to_string()),
        Just("unknown".to_string()),
        Just("4294967295".to_string()),
        Just("18446744073709551615".to_string()),
        Just("-1".to_string()),
        Just(String::new()),
        "[0-9]{1,3}",
        ".{0,16}",
    ]
}

/// A histogram as a snapshot file may hold it: any length.
fn hist() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(edge_value(), 0..40)
}

fn any_rank() -> impl Strategy<Value = RankData> {
    let function = (
        prop_oneof![
            Just("MPI_Send".to_string()),
            Just("MPI_Barrier".to_string()),
            ".{0,8}"
        ],
        edge_value(),
        edge_value(),
        edge_value(),
        edge_value(),
        hist(),
    )
        .prop_map(
            |(name, calls, time_ns, bytes_sent, bytes_recv, hist)| FunctionData {
                name,
                calls,
                time_ns,
                bytes_sent,
                bytes_recv,
                hist,
            },
        );
    let site = (".{0,8}", ".{0,12}", edge_value(), edge_value()).prop_map(
        |(function, site, calls, time_ns)| SiteData {
            function,
            site,
            calls,
            time_ns,
        },
    );
    let peer = (
        any::<u32>(),
        edge_value(),
        edge_value(),
        edge_value(),
        edge_value(),
    )
        .prop_map(
            |(peer, messages_sent, bytes_sent, messages_recv, bytes_recv)| PeerData {
                peer,
                messages_sent,
                bytes_sent,
                messages_recv,
                bytes_recv,
            },
        );
    let stats = (prop::collection::vec(peer, 0..6), hist(), hist()).prop_map(
        |(peers, sizes_sent, sizes_recv)| StatsData {
            peers,
            sizes_sent,
            sizes_recv,
        },
    );
    let time = prop_oneof![Just(0.0), Just(-1.0), Just(f64::MAX), Just(1e300), 0.0..2e9];
    (
        (label(), label(), label(), any::<u32>()),
        (time.clone(), prop::option::of(time)),
        prop::collection::vec(function, 0..5),
        prop::collection::vec(site, 0..5),
        prop::option::of(stats),
    )
        .prop_map(
            |((jobid, rank, size, pid), (since, exited), functions, callsites, stats)| RankData {
                jobid,
                rank,
                size,
                pid,
                uid: Some(1000),
                host: "node1".into(),
                library: "openmpi".into(),
                version: "4.1.4".into(),
                since,
                exited,
                source: "shim".into(),
                functions,
                callsites,
                stats,
                scheduler: None,
            },
        )
}

/// A job's wait data as a report file may hold it: any ranks, counts and
/// lengths, labels and names of any text.
fn any_waits() -> impl Strategy<Value = report::WaitData> {
    let pattern = (
        prop_oneof![
            Just("wait_nxn".to_string()),
            Just("late_sender".to_string()),
            Just("late_receiver".to_string()),
            ".{0,8}"
        ],
        edge_value(),
        edge_value(),
    )
        .prop_map(|(pattern, waited_ns, instances)| report::PatternWaitData {
            pattern,
            waited_ns,
            instances,
        });
    let count =
        (".{0,8}", edge_value()).prop_map(|(reason, count)| report::CountData { reason, count });
    let rank =
        (any::<u32>(), hist(), hist(), hist()).prop_map(|(rank, waited_ns, caused_ns, late_ns)| {
            report::RankWaitData {
                rank,
                waited_ns,
                caused_ns,
                late_ns,
            }
        });
    let function =
        (".{0,12}", ".{0,8}", edge_value()).prop_map(|(function, pattern, waited_ns)| {
            report::FunctionWaitData {
                function,
                pattern,
                waited_ns,
            }
        });
    (
        (label(), prop::option::of(any::<u32>())),
        prop::collection::vec(pattern, 0..7),
        prop::collection::vec(count, 0..6),
        (
            edge_value(),
            edge_value(),
            edge_value(),
            edge_value(),
            edge_value(),
        ),
        prop::collection::vec(rank, 0..8),
        prop::collection::vec(function, 0..6),
    )
        .prop_map(
            |(
                (jobid, uid),
                patterns,
                unresolved,
                (pending, lost, invalid, period, p2p),
                ranks,
                functions,
            )| {
                report::WaitData {
                    jobid,
                    uid,
                    patterns,
                    unresolved,
                    pending,
                    records_lost: lost,
                    records_invalid: invalid,
                    sample_period: period,
                    p2p_sample_period: p2p,
                    ranks,
                    functions,
                    // Present or not, any value (u64::MAX: unbounded).
                    clock_uncertainty_ns: (pending % 3 == 0).then_some(lost),
                }
            },
        )
}

#[test]
fn report_seed_reads() {
    let text = serde_json::to_vec(&report_seed()).unwrap();
    let d = Data::parse(&text, "seed").expect("the seed");
    assert_eq!(d.ranks.len(), 2);
    assert_eq!(d.waits.len(), 1);
    report_on(&text);
    // The seed's waits reach the report: rank 1 made rank 0 wait.
    let reps = report::analyse(&[d], report::Limits::default());
    let w = reps[0].waits.as_ref().expect("the seed's waits");
    assert_eq!(w.culprits[0].rank, 1);
    assert_eq!(reps[0].findings[0].ranks, [1]);
}

proptest! {
    #![proptest_config(config(512))]

    /// Mutated JSON of a valid snapshot.
    #[test]
    fn report_mutated(ms in mutations(4096, vec![])) {
        let text = serde_json::to_vec(&report_seed()).unwrap();
        report_on(&apply(text, &ms));
    }

    /// Well-formed snapshots with values a user's labels and counters can
    /// take: huge ranks and peers, saturated counters, odd histograms.
    #[test]
    fn report_structured(
        ranks in prop::collection::vec(any_rank(), 0..6),
        waits in prop::collection::vec(any_waits(), 0..3),
    ) {
        let d = Data { ranks, waits, ..report_seed() };
        let text = serde_json::to_vec(&d).unwrap();
        report_on(&text);
    }
}

/// Regression: a size slot whose sent and received counts sum past u64 was
/// hidden (and overflowed with overflow checks on); the counts are the
/// user's, so the row must show.
#[test]
fn report_shows_message_sizes_that_sum_past_u64() {
    let mut d = report_seed();
    for r in &mut d.ranks {
        let s = r.stats.as_mut().unwrap();
        s.sizes_sent = vec![0; HIST_SLOTS];
        s.sizes_recv = vec![0; HIST_SLOTS];
    }
    let s = d.ranks[0].stats.as_mut().unwrap();
    s.sizes_sent[7] = u64::MAX;
    s.sizes_recv[7] = 1;
    let reps = report::analyse(&[d], report::Limits::default());
    let text = report::text::render(&reps);
    assert!(text.contains(&u64::MAX.to_string()), "{text}");
}
