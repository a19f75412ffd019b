//! The process's shared-memory segment (the contract in
//! `observer_common::segment`) and the layer's global state.
//!
//! The state is built once, in `MPI_Init`/`MPI_Init_thread`, and published
//! through one pointer: until then, and forever if the segment cannot be
//! created, every wrapper sees no state and only passes the call through.
//! A shim injected into a running process (crate::inject) builds it while
//! it prepares (flag `INJECTED`, not ready), publishes it at its commit and
//! sets `ready` once its calls are routed. When each step happens is
//! `super::lifecycle`'s business: this module only makes, publishes and
//! marks the segment, and names nothing above it.

use core::{
    ffi::c_int,
    ptr::null_mut,
    sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering::*},
};
use std::ffi::CString;

use observer_common::{
    FUNCTION_COUNT,
    generated::functions::SPEC_FINGERPRINT,
    maps::hist_slot,
    segment::{
        CALLSITE_PROBE, CALLSITE_SLOTS, CallTiming, CallsiteSlot, DIR, FunctionCounters, Header,
        Layout, MAGIC, MAX_PEER_SLOTS, NAME_MAX, NAME_PREFIX, Name, PeerCounters, REQUEST_SLOTS,
        RankCounters, RequestSlot, VERSION, callsite_hash, callsite_key,
    },
    waits::{self, Record, RingHeader},
};

use super::abi::Abi;

/// A peer that is `MPI_PROC_NULL`: no message at all.
pub(crate) const NULL_PEER: i32 = i32::MIN;

/// The layer's state once the segment exists.
pub(crate) struct State {
    /// The library's ABI.
    pub(crate) abi: Abi,
    /// `MPI_COMM_WORLD`'s size.
    pub(crate) world_size: u32,
    /// Rank-wide counters.
    pub(crate) counters: &'static RankCounters,
    /// Per-peer counters, indexed by world rank.
    pub(crate) peers: &'static [PeerCounters],
    /// Per-function counters, indexed by `FunctionId`.
    pub(crate) functions: &'static [FunctionCounters],
    /// The request table.
    pub(crate) requests: &'static [RequestSlot],
    /// Per-function timing at the application's level, indexed by
    /// `FunctionId` (see [`crate::timing`]).
    pub(crate) timing: &'static [CallTiming],
    /// The call-site table: [`CALLSITE_SLOTS`] slots, or none when call
    /// sites are off (`MPI_OBSERVER_CALLSITES=0`).
    pub(crate) callsites: &'static [CallsiteSlot],
    /// The wait-state ring's header and records (none: no records are
    /// kept; see [`super::waits`]).
    pub(crate) wait_head: &'static RingHeader,
    /// The ring's records: [`waits::RING_SLOTS`], or none.
    pub(crate) wait_records: &'static [Record],
    /// Sequence numbers of sampled instances have these bits clear.
    pub(crate) wait_mask: u64,
    /// Point-to-point messages are numbered and sampled (see
    /// [`super::waits`]): the ring is kept and `MPI_OBSERVER_WAITS_P2P` is
    /// not off.
    pub(crate) p2p_waits: bool,
    /// Envelope sequence numbers of sampled messages have these bits clear.
    pub(crate) p2p_mask: u64,
    /// The records' times are the CPU's counter, not `CLOCK_MONOTONIC`.
    pub(crate) wait_ticks: bool,
    /// Blocking collectives on `MPI_COMM_WORLD` are numbered
    /// ([`super::waits::number`]): not in an injected shim, whose numbers
    /// would start where it was injected, not with its job's.
    pub(crate) world_numbered: bool,
    /// The segment's path, unlinked at `MPI_Finalize`.
    path: CString,
    /// `MPI_THREAD_MULTIPLE`: counters need atomic read-modify-writes.
    /// Below it the application never runs two MPI calls at once (and
    /// orders the calls of different threads itself), so a plain load and
    /// store is exact and several times cheaper than a locked add.
    pub(crate) multi: bool,
    /// The creating process (see [`State::created_here`]).
    pid: u32,
    /// The segment's header, for `ready`.
    header: &'static Header,
    /// The mapping, for an injected shim that aborts ([`State::discard`]).
    map: (usize, usize),
}

static STATE: AtomicPtr<State> = AtomicPtr::new(null_mut());

/// The state, or `None` while the layer only passes calls through.
#[inline(always)]
pub(crate) fn state() -> Option<&'static State> {
    // SAFETY: null, or a leaked State published once and never freed.
    unsafe { STATE.load(Acquire).as_ref() }
}

/// Calls timed before the segment existed ([`crate::timing`]); copied into
/// it when it is made.
pub(crate) static EARLY: [CallTiming; FUNCTION_COUNT] = [const {
    CallTiming {
        calls: core::sync::atomic::AtomicU64::new(0),
        time_ns: core::sync::atomic::AtomicU64::new(0),
        bytes: [const { core::sync::atomic::AtomicU64::new(0) }; 2],
        bytes_unknown: [const { core::sync::atomic::AtomicU64::new(0) }; 2],
        hist: [const { core::sync::atomic::AtomicU64::new(0) }; observer_common::maps::HIST_SLOTS],
    }
}; FUNCTION_COUNT];

/// Whether the segment made next gets a call-site table
/// (`MPI_OBSERVER_CALLSITES`); on unless told otherwise.
static CALLSITES: AtomicBool = AtomicBool::new(true);

/// log2 of the wait records' sampling period (`MPI_OBSERVER_WAITS`), or
/// [`NO_WAITS`].
static WAITS: AtomicU32 = AtomicU32::new(0);
/// [`WAITS`]: no wait records.
const NO_WAITS: u32 = u32::MAX;
/// log2 of the point-to-point records' sampling period
/// (`MPI_OBSERVER_WAITS_P2P`), or [`NO_WAITS`].
static WAITS_P2P: AtomicU32 = AtomicU32::new(NO_WAITS);
/// The wait records' clock is the CPU's counter.
static WAIT_TICKS: AtomicBool = AtomicBool::new(false);

/// Records the wait records' sampling of collectives and of point-to-point
/// messages (`None`: keep none) and whether their clock is the CPU's counter
/// (`ticks`: the kernel keeps time with it); called while the stack is
/// built, before the segment is made.
pub(crate) fn set_waits(shift: Option<u32>, p2p: Option<u32>, ticks: bool) {
    WAITS.store(shift.unwrap_or(NO_WAITS), Relaxed);
    WAITS_P2P.store(p2p.unwrap_or(NO_WAITS), Relaxed);
    WAIT_TICKS.store(ticks, Relaxed);
}

/// The wait records' sampling shift, or `None` for no records.
pub(crate) fn waits() -> Option<u32> {
    let w = WAITS.load(Relaxed);
    (w != NO_WAITS).then_some(w)
}

/// Records whether timed calls count in the call-site table; called while
/// the stack is built, before the segment is made.
pub(crate) fn set_callsites(on: bool) {
    CALLSITES.store(on, Relaxed);
}

/// Whether the segment gets a call-site table.
pub(crate) fn callsites() -> bool {
    CALLSITES.load(Relaxed)
}

/// Why the segment could not be created.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SegmentError {
    /// The library is not one the layer understands.
    #[error(transparent)]
    Abi(#[from] super::abi::AbiError),
    /// `MPI_Comm_size(MPI_COMM_WORLD)` failed.
    #[error("MPI_Comm_size(MPI_COMM_WORLD) failed on {library}")]
    WorldSize {
        /// The library recognised.
        library: &'static str,
    },
    /// A system call on the segment failed.
    #[error("cannot create {path}: {what}: {source}")]
    Create {
        /// The segment's path.
        path: String,
        /// The failing step.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Publishes the state: the layer counts from the next call on (see
/// `super::lifecycle`, which also registers the exit handler).
pub(crate) fn publish(s: State) {
    STATE.store(Box::into_raw(Box::new(s)), Release);
}

/// Sets the published segment's `ready` (Release: a reader that sees 1
/// sees the whole header).
pub(crate) fn mark_ready() {
    if let Some(s) = state() {
        s.header.ready.store(1, Release);
    }
}

/// Sets the `EJECTED` flag: the injected shim has put its slots back.
pub(crate) fn mark_ejected() {
    if let Some(s) = state() {
        s.header
            .flags
            .fetch_or(observer_common::segment::flags::EJECTED, Release);
    }
}

fn os(path: &str, what: &'static str) -> SegmentError {
    SegmentError::Create {
        path: path.to_string(),
        what,
        source: std::io::Error::last_os_error(),
    }
}

/// Creates `path` as a new file of this process's, mode 0600, for reading
/// and writing; returns its descriptor, or -1 with `errno` set. A file
/// already there is never removed: with a random name it can only be
/// someone else's (or an astronomically unlikely collision), and the
/// caller draws another name.
pub(crate) fn create_own(path: &std::ffi::CStr) -> c_int {
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: NUL-terminated path.
    unsafe { libc::open(path.as_ptr(), flags, 0o600) }
}

/// Names drawn before giving up on `EEXIST`.
const NAME_TRIES: usize = 4;

/// 64 random bits from `getrandom(2)`; `None` if it fails.
fn random_u64() -> Option<u64> {
    let mut v = 0u64;
    // SAFETY: writes at most 8 bytes into `v`.
    let n = unsafe { libc::getrandom((&raw mut v).cast(), 8, libc::GRND_NONBLOCK) };
    (n == 8).then_some(v)
}

/// Creates the segment's file under a fresh name
/// (`observer_common::segment::Name`: uid, pid, 64 random bits) that no
/// other user can have taken in advance: returns its descriptor and path.
fn create_segment_file() -> Result<(c_int, CString), SegmentError> {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let mut last = String::new();
    for _ in 0..NAME_TRIES {
        let Some(random) = random_u64() else {
            return Err(os(
                &format!("{DIR}/{NAME_PREFIX}{uid}.{}.*", std::process::id()),
                "getrandom",
            ));
        };
        let name = Name {
            uid: Some(uid),
            pid: std::process::id(),
            random: Some(random),
            trace: false,
        };
        let mut b = [0u8; NAME_MAX];
        let n = name.write(&mut b);
        let path = format!(
            "{DIR}/{}",
            core::str::from_utf8(&b[..n]).expect("ASCII name")
        );
        let cpath = CString::new(path.clone()).expect("no NUL in a name");
        let fd = create_own(&cpath);
        if fd >= 0 {
            return Ok((fd, cpath));
        }
        let e = os(&path, "open");
        if !matches!(&e, SegmentError::Create { source, .. } if source.raw_os_error() == Some(libc::EEXIST))
        {
            return Err(e);
        }
        last = path;
    }
    Err(os(&last, "open (every name drawn was taken)"))
}

/// Creates the segment with header flags `marks`, `ready` set at once or
/// not, with a call-site table if `callsites`, a wait ring sampling one
/// instance in `1 << shift` if `waits` is `Some(shift)` (never for an
/// injected shim: its sequence numbers would start where it was injected,
/// not with its job's), its timing block starting from `early` (the calls
/// timed before it existed, see [`crate::timing`]).
pub(crate) fn build(
    marks: u32,
    ready: bool,
    callsites: bool,
    waits: Option<u32>,
    early: &[CallTiming],
) -> Result<State, SegmentError> {
    let abi = Abi::detect()?;
    let mut n: c_int = 0;
    // SAFETY: the library's PMPI_Comm_size with an out-pointer.
    if unsafe { (abi.comm_size)(abi.comm_world, &mut n) } != 0 || n <= 0 {
        return Err(SegmentError::WorldSize {
            library: abi.library,
        });
    }
    let world_size = n as u32;
    let mut level: c_int = 0;
    // SAFETY: the library's PMPI_Query_thread with an out-pointer. On
    // failure assume the worst (atomic adds). The levels are ordered in
    // every ABI (MULTIPLE is 3, or 4096 in the standard ABI).
    let multi = unsafe { (abi.query_thread)(&mut level) } != 0 || level >= abi.c.thread_multiple;
    let peer_slots = world_size.min(MAX_PEER_SLOTS);
    let functions = FUNCTION_COUNT as u32;
    let callsite_slots = if callsites { CALLSITE_SLOTS } else { 0 };
    let waits = waits.filter(|_| marks & observer_common::segment::flags::INJECTED == 0);
    let (wait_slots, wait_shift) = match waits {
        Some(shift) => (waits::RING_SLOTS, shift.min(31)),
        None => (0, 0),
    };
    let p2p_shift = {
        let p = WAITS_P2P.load(Relaxed);
        (p != NO_WAITS).then_some(p.min(31))
    };
    let l = Layout::new(
        VERSION,
        peer_slots,
        functions,
        REQUEST_SLOTS,
        callsite_slots,
        wait_slots,
    );
    let size = l.size;
    let (fd, cpath) = create_segment_file()?;
    let path = cpath.to_string_lossy().into_owned();
    let fail = |what| {
        let e = os(&path, what);
        // SAFETY: our descriptor and our file.
        unsafe {
            libc::close(fd);
            libc::unlink(cpath.as_ptr());
        }
        e
    };
    // SAFETY: our descriptor. fchmod because umask may only have removed
    // bits; this states the mode the daemon checks.
    if unsafe { libc::fchmod(fd, 0o600) } != 0 {
        return Err(fail("fchmod"));
    }
    // posix_fallocate, not only ftruncate: on a full tmpfs a sparse file
    // would SIGBUS on first touch of a page instead of failing here.
    // SAFETY: our descriptor.
    let rc = unsafe { libc::posix_fallocate(fd, 0, size as libc::off_t) };
    if rc != 0 {
        // SAFETY: errno is thread-local; posix_fallocate returns the error.
        unsafe { *libc::__errno_location() = rc };
        return Err(fail("posix_fallocate"));
    }
    // SAFETY: a fresh shared mapping of our own file.
    let base = unsafe {
        libc::mmap(
            null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(fail("mmap"));
    }
    // SAFETY: the mapping keeps the file alive.
    unsafe { libc::close(fd) };
    let base = base.cast::<u8>();
    let (c, p, f, r, t, cs, w) = (
        l.counters,
        l.peers,
        l.functions,
        l.requests,
        l.timing,
        l.callsites,
        l.waits,
    );
    // SAFETY: the mapping is `size` bytes of zeroes (fresh file), page
    // aligned, and every offset is 8-byte aligned (checked in
    // observer-common), so these are valid, aligned, initialised (all-zero
    // is a valid value of each) and live for the rest of the process.
    let s = unsafe {
        let h = base.cast::<Header>();
        (*h).magic = MAGIC;
        (*h).version = VERSION;
        (*h).header_size = size_of::<Header>() as u32;
        (*h).total_size = size;
        (*h).spec_fingerprint = SPEC_FINGERPRINT;
        (*h).world_size = world_size;
        (*h).peer_slots = peer_slots;
        (*h).function_slots = functions;
        (*h).request_slots = REQUEST_SLOTS;
        (*h).counters_offset = c;
        (*h).peers_offset = p;
        (*h).functions_offset = f;
        (*h).requests_offset = r;
        (*h).timing_offset = t;
        (*h).flags = core::sync::atomic::AtomicU32::new(marks);
        (*h).callsites_offset = cs;
        (*h).callsite_slots = callsite_slots;
        (*h).waits_offset = w;
        (*h).wait_slots = wait_slots;
        (*h).wait_sample_shift = wait_shift;
        // Without a ring, `wait_head` points at a header of nobody's, never
        // written (no records means nothing is pushed).
        static NO_RING: RingHeader = RingHeader {
            head: AtomicU64::new(0),
            clock: AtomicU64::new(0),
            ns_per_tick: AtomicU64::new(0),
            p2p_shift: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            reserved: [const { AtomicU64::new(0) }; 3],
        };
        let state = State {
            abi,
            world_size,
            counters: &*base.add(c as usize).cast::<RankCounters>(),
            peers: core::slice::from_raw_parts(
                base.add(p as usize).cast::<PeerCounters>(),
                peer_slots as usize,
            ),
            functions: core::slice::from_raw_parts(
                base.add(f as usize).cast::<FunctionCounters>(),
                FUNCTION_COUNT,
            ),
            requests: core::slice::from_raw_parts(
                base.add(r as usize).cast::<RequestSlot>(),
                REQUEST_SLOTS as usize,
            ),
            timing: core::slice::from_raw_parts(
                base.add(t as usize).cast::<CallTiming>(),
                FUNCTION_COUNT,
            ),
            callsites: core::slice::from_raw_parts(
                base.add(cs as usize).cast::<CallsiteSlot>(),
                callsite_slots as usize,
            ),
            wait_head: if wait_slots == 0 {
                &NO_RING
            } else {
                &*base.add(w as usize).cast::<RingHeader>()
            },
            wait_records: if wait_slots == 0 {
                &[]
            } else {
                core::slice::from_raw_parts(
                    base.add(w as usize + size_of::<RingHeader>())
                        .cast::<Record>(),
                    wait_slots as usize,
                )
            },
            wait_mask: (1u64 << wait_shift) - 1,
            p2p_waits: wait_slots != 0 && p2p_shift.is_some(),
            p2p_mask: (1u64 << p2p_shift.unwrap_or(0)) - 1,
            wait_ticks: WAIT_TICKS.load(Relaxed),
            world_numbered: marks & observer_common::segment::flags::INJECTED == 0,
            path: cpath,
            multi,
            pid: std::process::id(),
            header: &*h,
            map: (base as usize, size as usize),
        };
        seed(early, state.timing);
        if wait_slots != 0 {
            state.wait_head.clock.store(
                if state.wait_ticks {
                    waits::clock::TICKS
                } else {
                    waits::clock::NS
                },
                Relaxed,
            );
            if let Some(p) = p2p_shift {
                state.wait_head.p2p_shift.store(u64::from(p) + 1, Relaxed);
            }
        }
        if ready {
            // Last, with Release: a reader that sees 1 sees the whole header.
            state.header.ready.store(1, Release);
        }
        state
    };
    Ok(s)
}

/// Copies the calls timed before the segment existed (`from`) into its
/// timing block `to`, before the segment is published.
fn seed(from: &[CallTiming], to: &[CallTiming]) {
    for (e, t) in from.iter().zip(to) {
        t.calls.store(e.calls.load(Relaxed), Relaxed);
        t.time_ns.store(e.time_ns.load(Relaxed), Relaxed);
        for d in 0..2 {
            t.bytes[d].store(e.bytes[d].load(Relaxed), Relaxed);
            t.bytes_unknown[d].store(e.bytes_unknown[d].load(Relaxed), Relaxed);
        }
        for (a, b) in e.hist.iter().zip(&t.hist) {
            b.store(a.load(Relaxed), Relaxed);
        }
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds through the vDSO: one clock for every
/// process of the node, the daemon's too (the recorder's events, and the
/// wait records where the CPU's counter is not the kernel's clock).
#[inline(always)]
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Clock `id` in nanoseconds.
#[inline(always)]
fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(id, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds: the daemon's clock
/// (`CLOCK_MONOTONIC`) read at tick resolution, a few ns instead of a vDSO
/// call of ~20 ns. Ages come out at most one tick (≤ 4 ms) too large.
#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

impl State {
    /// The segment's path.
    pub(crate) fn path(&self) -> &std::ffi::CStr {
        &self.path
    }

    /// Whether this process created the segment (not a child forked
    /// without exec, which inherits the state).
    pub(crate) fn created_here(&self) -> bool {
        self.pid == std::process::id()
    }

    /// Removes the file and the mapping of a state nothing ever saw (an
    /// aborted injection).
    pub(crate) fn discard(self) {
        // SAFETY: our file, and a mapping no reference outlives (`self` and
        // its slices are dropped here, unpublished).
        unsafe {
            libc::unlink(self.path.as_ptr());
            libc::munmap(self.map.0 as *mut libc::c_void, self.map.1);
        }
    }

    /// Unlinks the segment's file (see `super::lifecycle::finish`).
    pub(crate) fn unlink(&self) {
        // SAFETY: NUL-terminated path.
        unsafe { libc::unlink(self.path.as_ptr()) };
    }

    /// Adds `v` to a counter: a locked add under `MPI_THREAD_MULTIPLE`, a
    /// plain load and store otherwise (see [`State::multi`]).
    #[inline(always)]
    pub(crate) fn add(&self, c: &AtomicU64, v: u64) {
        if self.multi {
            c.fetch_add(v, Relaxed);
        } else {
            c.store(c.load(Relaxed).wrapping_add(v), Relaxed);
        }
    }

    /// Counts one message of `bytes` with world rank `peer` in direction
    /// `dir`; `None` bytes or an unknown peer count as unattributed, and
    /// `MPI_PROC_NULL` ([`NULL_PEER`]) as nothing.
    #[inline(always)]
    pub(crate) fn message(&self, peer: i32, dir: usize, bytes: Option<u64>) {
        if peer == NULL_PEER {
            return;
        }
        let (Ok(p), Some(b)) = (usize::try_from(peer), bytes) else {
            self.add(&self.counters.unattributed_messages, 1);
            return;
        };
        match self.peers.get(p) {
            Some(c) => {
                self.add(&c.messages[dir], 1);
                self.add(&c.bytes[dir], b);
                self.add(&self.counters.msg_size_hist[dir][hist_slot(b)], 1);
            }
            None => {
                self.add(&self.counters.peer_overflow_messages, 1);
            }
        }
    }

    /// Counts one timed call of function `function` from call site `site`
    /// (a return address) that took `ns` in the call-site table: the slot
    /// holding its key, or the first free one claimed with a CAS, within
    /// [`CALLSITE_PROBE`] slots of its hash; else it counts in
    /// `callsite_table_full`. Nothing when the table is off.
    #[inline(always)]
    pub(crate) fn callsite(&self, function: usize, site: u64, ns: u64) {
        if self.callsites.is_empty() {
            return;
        }
        let key = callsite_key(function as u16, site);
        let mask = CALLSITE_SLOTS as usize - 1;
        let mut i = callsite_hash(key, CALLSITE_SLOTS);
        for _ in 0..CALLSITE_PROBE {
            // SAFETY: `i` is masked to the table's length (CALLSITE_SLOTS
            // when not empty).
            let slot = unsafe { self.callsites.get_unchecked(i) };
            let k = slot.key.load(Relaxed);
            let mine = k == key
                || (k == 0
                    && match slot.key.compare_exchange(0, key, Relaxed, Relaxed) {
                        Ok(_) => true,
                        // Another thread claimed it meanwhile: for this key?
                        Err(now) => now == key,
                    });
            if mine {
                self.add(&slot.calls, 1);
                self.add(&slot.time_ns, ns);
                return;
            }
            i = (i + 1) & mask;
        }
        self.add(&self.counters.callsite_table_full, 1);
    }

    /// Counts one call of function `row` with its bytes per direction.
    #[inline(always)]
    pub(crate) fn call(&self, row: usize, send: u64, recv: u64) {
        let f = &self.functions[row];
        self.add(&f.calls, 1);
        if send != 0 {
            self.add(&f.bytes[0], send);
        }
        if recv != 0 {
            self.add(&f.bytes[1], recv);
        }
    }
}
