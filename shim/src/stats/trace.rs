//! Events for `mpi-observer record` (issue 13): the producer side of the
//! rings in the segment's path plus `.trace` (the layout and the ring
//! algorithm are in `observer_common::trace`).
//!
//! The file is created with the stats segment. While no recording is on,
//! every hook costs one load of the file's `active` word (and the dispatch
//! only looks when it times a call). While one is on, an application-level
//! call emits Enter and Leave, and the stats layer's wrappers emit the
//! message, request and collective events inside it, into the ring of the
//! calling thread, claimed at its first event of a recording and kept
//! while the thread lives (see [`claim`]). A call
//! emits its Leave if and only if it emitted its Enter, and the other events
//! only inside such a call, so a recording that starts or stops mid-call
//! stays balanced. A full ring drops and counts; nothing here blocks,
//! allocates or takes a lock.

use core::{
    ffi::c_int,
    ptr::null_mut,
    sync::atomic::{AtomicPtr, Ordering::*},
};
use std::ffi::CString;

pub(crate) use observer_common::trace::Kind;
use observer_common::{
    FUNCTION_COUNT, FUNCTIONS,
    trace::{
        self as t, DEFAULT_RING_EVENTS, DEFAULT_RINGS, RANKS_PER_RECORD, RingHeader, TraceEvent,
        TraceHeader,
    },
};

use super::{
    comms::{self, CommInfo},
    segment::State,
};
use crate::generated::fortran::FORTRAN;

/// The process's trace file, once created.
pub(crate) struct Tracer {
    header: &'static TraceHeader,
    base: *mut u8,
    fd: c_int,
    rings: u32,
    events: u32,
    path: CString,
}

// SAFETY: the mapping is shared memory used through atomics and the
// single-producer ring protocol.
unsafe impl Sync for Tracer {}
// SAFETY: as above.
unsafe impl Send for Tracer {}

static TRACER: AtomicPtr<Tracer> = AtomicPtr::new(null_mut());

/// The tracer, whatever the recording state.
#[inline(always)]
fn tracer() -> Option<&'static Tracer> {
    // SAFETY: null, or a leaked Tracer published once.
    unsafe { TRACER.load(Acquire).as_ref() }
}

/// The tracer while a recording is on.
#[inline(always)]
fn recording() -> Option<&'static Tracer> {
    tracer().filter(|t| t.header.active.load(Relaxed) != 0)
}

/// An environment variable as a number within `range`.
fn env_u32(name: &str, default: u32, range: core::ops::RangeInclusive<u32>) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .map_or(default, |v| v.clamp(*range.start(), *range.end()))
}

/// Creates the trace file next to the segment (its path `segment` plus
/// `.trace`); on failure prints one line and leaves tracing off (the stats
/// layer works as before).
pub(crate) fn create(world_rank: u32, world_size: u32, segment: &std::ffi::CStr) {
    if tracer().is_some() {
        return;
    }
    let rings = env_u32("MPI_OBSERVER_TRACE_RINGS", DEFAULT_RINGS, t::RINGS);
    let events = 1u32
        << (31
            - env_u32(
                "MPI_OBSERVER_TRACE_RING_EVENTS",
                DEFAULT_RING_EVENTS,
                t::RING_EVENTS,
            )
            .leading_zeros());
    let size = t::file_bytes(rings, events);
    let path = format!("{}{}", segment.to_string_lossy(), t::PATH_SUFFIX);
    let Ok(cpath) = CString::new(path.clone()) else {
        return;
    };
    let fail = |what: &str, fd: c_int| {
        let line = format!(
            "mpi-observer-shim: stats: cannot create {path}: {what}: {}; `mpi-observer record` will see this rank through probes only\n",
            std::io::Error::last_os_error()
        );
        // SAFETY: our descriptor and file; one write(2) of an owned buffer.
        unsafe {
            if fd >= 0 {
                libc::close(fd);
                libc::unlink(cpath.as_ptr());
            }
            libc::write(2, line.as_ptr().cast(), line.len());
        }
    };
    let fd = super::segment::create_own(&cpath);
    if fd < 0 {
        return fail("open", -1);
    }
    // SAFETY: our descriptor. The header page is reserved now; the rings
    // only when a thread claims one (see `claim`), so an idle file costs
    // one page of memory.
    let ok = unsafe {
        libc::fchmod(fd, 0o600) == 0
            && libc::ftruncate(fd, size as libc::off_t) == 0
            && libc::posix_fallocate(fd, 0, t::HEADER_BYTES as libc::off_t) == 0
    };
    if !ok {
        return fail("sizing", fd);
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
        return fail("mmap", fd);
    }
    let base = base.cast::<u8>();
    // SAFETY: the header page is ours, zeroed and reserved.
    let h = unsafe { &mut *base.cast::<TraceHeader>() };
    h.magic = t::MAGIC;
    h.version = t::VERSION;
    h.header_size = size_of::<TraceHeader>() as u32;
    h.total_size = size;
    h.ring_count = rings;
    h.ring_events = events;
    h.rings_offset = t::HEADER_BYTES;
    h.world_rank = world_rank;
    h.world_size = world_size;
    h.ready.store(1, Release);
    let tr = Tracer {
        header: h,
        base,
        fd,
        rings,
        events,
        path: cpath,
    };
    TRACER.store(Box::into_raw(Box::new(tr)), Release);
}

/// Unlinks the file (at `MPI_Finalize` and exit, with the segment's); a
/// recorder that opened it keeps its mapping.
pub(crate) fn finish() {
    if let Some(t) = tracer() {
        // SAFETY: NUL-terminated path.
        unsafe { libc::unlink(t.path.as_ptr()) };
    }
}

/// The TLS words after the call site: ring + 1, traced flag, generation.
#[inline(always)]
fn tls() -> *mut u32 {
    // SAFETY: the thread's block is 40 bytes; these are bytes 16..32.
    unsafe { crate::depth::slot_again().add(4) }
}

fn gettid() -> u32 {
    // SAFETY: a syscall without arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// The TLS ring word of a thread that found no ring in its generation.
const NO_RING: u32 = u32::MAX;

/// This thread's ring for the current recording, claiming one if needed.
#[inline(always)]
fn ring(t: &Tracer) -> Option<(&RingHeader, *mut TraceEvent)> {
    let w = tls();
    let gen_now = t.header.generation.load(Acquire);
    // SAFETY: this thread's TLS words.
    let (idx, generation) = unsafe { (w.read(), w.add(2).cast::<u64>().read()) };
    let i = if idx != 0 && generation == gen_now {
        if idx == NO_RING {
            t.header.no_ring.fetch_add(1, Relaxed);
            return None;
        }
        idx - 1
    } else {
        claim(t, idx, gen_now)?
    };
    // SAFETY: ring `i` lies within the mapping; its header is 128 bytes.
    unsafe { Some(ring_at(t, i)) }
}

/// Ring `i`'s header and records.
///
/// # Safety
/// `i < t.rings`.
unsafe fn ring_at(t: &Tracer, i: u32) -> (&RingHeader, *mut TraceEvent) {
    let off = t::ring_offset(i, t.events) as usize;
    // SAFETY: per the caller, the ring lies within the mapping.
    unsafe {
        let h = &*t.base.add(off).cast::<RingHeader>();
        let recs = t
            .base
            .add(off + size_of::<RingHeader>())
            .cast::<TraceEvent>();
        (h, recs)
    }
}

/// This thread's ring for recording `generation`, its TLS ring word being
/// `cached`. A ring stays its owner's from one recording to the next (the
/// recorder frees only the rings of threads that exited), so no ring ever
/// has two producers: a thread first takes back the ring it had, else the
/// ring of an exited thread whose id it now has, else a free one (CAS
/// 0 → tid). A thread that finds none counts its events in `no_ring`
/// without looking again until the next recording.
#[cold]
#[inline(never)]
fn claim(t: &Tracer, cached: u32, generation: u64) -> Option<u32> {
    let tid = gettid();
    let w = tls();
    // Stores the TLS ring word (ring + 1, or NO_RING) and the generation.
    let keep = |word: u32| {
        // SAFETY: this thread's TLS words.
        unsafe {
            w.write(word);
            w.add(2).cast::<u64>().write(generation);
        }
    };
    if cached != 0 && cached != NO_RING && cached <= t.rings {
        // SAFETY: cached - 1 < t.rings.
        let (h, _) = unsafe { ring_at(t, cached - 1) };
        if h.owner.load(Acquire) == tid {
            keep(cached);
            return Some(cached - 1);
        }
    }
    for i in 0..t.rings {
        let off = t::ring_offset(i, t.events);
        // The ring's pages are reserved before it is touched at all (even
        // read: a fault on a page /dev/shm cannot back would be a SIGBUS).
        // SAFETY: within our file.
        let ok = unsafe {
            libc::posix_fallocate(
                t.fd,
                off as libc::off_t,
                t::ring_bytes(t.events) as libc::off_t,
            ) == 0
        };
        if !ok {
            break;
        }
        // SAFETY: i < t.rings.
        let (h, _) = unsafe { ring_at(t, i) };
        let owner = h.owner.load(Acquire);
        if owner == tid || (owner == 0 && h.owner.compare_exchange(0, tid, AcqRel, Relaxed).is_ok())
        {
            keep(i + 1);
            return Some(i);
        }
    }
    keep(NO_RING);
    t.header.no_ring.fetch_add(1, Relaxed);
    None
}

fn now() -> u64 {
    super::segment::monotonic_ns()
}

/// Writes `ev` to this thread's ring; false if it was dropped.
fn emit(t: &Tracer, ev: &TraceEvent) -> bool {
    match ring(t) {
        // SAFETY: this thread owns the ring for this recording.
        Some((h, recs)) => unsafe { t::push(h, recs, t.events, ev) },
        None => false,
    }
}

fn event(kind: Kind, func: usize) -> TraceEvent {
    TraceEvent {
        t_ns: now(),
        kind: kind as u16,
        func: func as u16,
        peer: -1,
        ..TraceEvent::default()
    }
}

/// The C function of dispatch row `row`.
fn function(row: usize) -> usize {
    if row < FUNCTION_COUNT {
        row
    } else {
        FORTRAN[row - FUNCTION_COUNT].function as usize
    }
}

/// At the start of a timed (application-level) call of `row`: emits its
/// Enter if a recording is on; true if it did ([`leave`] then follows).
#[inline(always)]
pub(crate) fn enter(row: usize) -> bool {
    let Some(t) = recording() else {
        return false;
    };
    enter_slow(t, row)
}

#[inline(never)]
fn enter_slow(t: &Tracer, row: usize) -> bool {
    // The ring before the time: a thread's first event of a recording
    // claims its ring and reserves its memory, which takes a millisecond
    // or more; taken after it, the Enter's time leaves that out of the
    // call (a reader computing waits would count it as waiting).
    let ring = ring(t);
    let ev = event(Kind::Enter, function(row));
    if let Some((h, recs)) = ring {
        // SAFETY: this thread owns the ring for this recording.
        unsafe { t::push(h, recs, t.events, &ev) };
    }
    // SAFETY: this thread's traced flag.
    unsafe { tls().add(1).write(1) };
    true
}

/// At the end of a call whose Enter [`enter`] emitted.
#[inline(never)]
pub(crate) fn leave(row: usize) {
    // SAFETY: this thread's traced flag.
    unsafe { tls().add(1).write(0) };
    if let Some(t) = tracer() {
        emit(t, &event(Kind::Leave, function(row)));
    }
}

/// The tracer, if this thread is inside a traced call: the wrappers'
/// events are emitted only then.
#[inline(always)]
pub(crate) fn traced() -> Option<&'static Tracer> {
    let t = recording()?;
    // SAFETY: this thread's traced flag.
    (unsafe { tls().add(1).read() } != 0).then_some(t)
}

/// The id of `comm` in the recording (0 for `MPI_COMM_WORLD`), defining it
/// in this thread's ring first when the recording has not seen it; `None`
/// when it cannot be named (an inter-communicator, a full cache).
fn comm_id(t: &Tracer, s: &State, comm: usize) -> Option<u32> {
    if comm == s.abi.comm_world {
        return Some(0);
    }
    let info: &CommInfo = comms::info(s, comm)?;
    if info.inter {
        return None;
    }
    let generation = t.header.generation.load(Relaxed);
    if info.announced.load(Relaxed) != generation {
        let mut def = event(Kind::CommDef, 0);
        def.comm = info.trace_id;
        def.peer = info.size;
        let mut whole = emit(t, &def);
        for (k, chunk) in info.world.chunks(RANKS_PER_RECORD).enumerate() {
            let mut ranks = [u32::MAX; RANKS_PER_RECORD];
            for (d, w) in ranks.iter_mut().zip(chunk) {
                *d = *w as u32;
            }
            whole &= emit(
                t,
                &TraceEvent::comm_ranks_record(
                    def.t_ns,
                    info.trace_id,
                    (k * RANKS_PER_RECORD) as u32,
                    &ranks[..chunk.len()],
                ),
            );
        }
        // A definition that lost a record to a full ring is written again
        // at the communicator's next use.
        if whole {
            info.announced.store(generation, Relaxed);
        }
    }
    Some(info.trace_id)
}

/// A message event on `comm` with `peer` a rank in it; on a communicator
/// the recording cannot name, the peer's world rank on `MPI_COMM_WORLD`.
#[allow(clippy::too_many_arguments)]
fn message(
    t: &Tracer,
    s: &State,
    kind: Kind,
    comm: usize,
    peer: i32,
    tag: i32,
    bytes: u64,
    request: u64,
) {
    let (c, p) = match comm_id(t, s, comm) {
        Some(c) => (c, peer),
        None => (0, comms::peer(s, comm, peer)),
    };
    let mut e = event(kind, 0);
    e.comm = c;
    e.peer = p;
    e.tag = tag;
    e.bytes = bytes;
    e.request = request;
    emit(t, &e);
}

/// A blocking send (`MpiSend`), or a nonblocking one's posting
/// (`MpiIsend`, `request` non-zero).
pub(crate) fn send(s: &State, comm: usize, dest: i32, tag: i32, bytes: u64, request: u64) {
    if dest == s.abi.c.proc_null {
        return;
    }
    if let Some(t) = traced() {
        let kind = if request != 0 {
            Kind::MpiIsend
        } else {
            Kind::MpiSend
        };
        message(t, s, kind, comm, dest, tag, bytes, request);
    }
}

/// A completed receive from its status: `MpiRecv`, or `MpiIrecv` of
/// `request`.
///
/// # Safety
/// `status` is a status the library filled.
pub(crate) unsafe fn received(s: &State, comm: usize, status: *const u8, request: u64) {
    let Some(t) = traced() else {
        return;
    };
    // SAFETY: per the caller.
    let (src, tag, bytes) = unsafe {
        (
            s.abi.source(status),
            s.abi.tag(status),
            s.abi.received(status),
        )
    };
    if src == s.abi.c.proc_null {
        return;
    }
    let kind = if request != 0 {
        Kind::MpiIrecv
    } else {
        Kind::MpiRecv
    };
    message(t, s, kind, comm, src, tag, bytes.unwrap_or(0), request);
}

/// A completed matched receive (`MPI_Mrecv`, or the completion of
/// `MPI_Imrecv`'s `request`): the probe remembered the sender's world
/// rank, so the event is on `MPI_COMM_WORLD`. Nothing when that rank is
/// unknown (a sender outside the world, a full message table).
///
/// # Safety
/// `status` is a status the library filled.
pub(crate) unsafe fn received_matched(s: &State, world_peer: i32, status: *const u8, request: u64) {
    let Some(t) = traced() else {
        return;
    };
    if world_peer < 0 {
        return;
    }
    // SAFETY: per the caller.
    let (tag, bytes) = unsafe { (s.abi.tag(status), s.abi.received(status)) };
    let kind = if request != 0 {
        Kind::MpiIrecv
    } else {
        Kind::MpiRecv
    };
    let mut e = event(kind, 0);
    e.peer = world_peer;
    e.tag = tag;
    e.bytes = bytes.unwrap_or(0);
    e.request = request;
    emit(t, &e);
}

/// A request event without message fields (`MpiIrecvRequest`,
/// `MpiIsendComplete`, `MpiRequestCancelled`).
pub(crate) fn request(kind: Kind, request: u64) {
    if let Some(t) = traced() {
        let mut e = event(kind, 0);
        e.request = request;
        emit(t, &e);
    }
}

/// Whether collective `row` has a root (as its second-to-last argument,
/// before the communicator, in every rooted collective of the standard).
fn rooted(row: usize) -> bool {
    let n = FUNCTIONS[row].name;
    let base = n.trim_start_matches("MPI_I").trim_start_matches("MPI_");
    [
        "Bcast", "bcast", "Reduce", "reduce", "Gather", "gather", "Scatter", "scatter",
    ]
    .iter()
    .any(|p| base.starts_with(p))
        && !base.starts_with("Reduce_scatter")
        && !base.starts_with("reduce_scatter")
}

/// The start of blocking collective `row`.
pub(crate) fn collective_begin(row: usize) {
    if let Some(t) = traced() {
        emit(t, &event(Kind::CollectiveBegin, row));
    }
}

/// The end of blocking collective `row` with arguments `args` (the
/// communicator last), having sent and received these bytes; `seq` is its
/// number on `MPI_COMM_WORLD` ([`super::waits::number`]). A numbered one
/// that ends in a call begun before the recording is said as a
/// [`Kind::WorldMark`]: `record` cuts its slices at these numbers, and every
/// rank must show the ends it saw.
pub(crate) fn collective_end(
    s: &State,
    row: usize,
    args: &[usize],
    sent: u64,
    recv: u64,
    seq: Option<u64>,
) {
    let Some(t) = recording() else {
        return;
    };
    // SAFETY: this thread's traced flag (`traced`, with the recording
    // flag read once).
    if unsafe { tls().add(1).read() } == 0 {
        if let Some(seq) = seq {
            let mut e = event(Kind::WorldMark, row);
            e.request = seq + 1;
            emit(t, &e);
        }
        return;
    }
    let comm = s.abi.handle(args.last().copied().unwrap_or(0));
    let mut e = event(Kind::CollectiveEnd, row);
    e.comm = comm_id(t, s, comm).unwrap_or(0);
    e.peer = if rooted(row) && args.len() >= 2 {
        super::abi::int(args[args.len() - 2])
    } else {
        -1
    };
    e.bytes = sent;
    e.bytes2 = recv;
    e.request = seq.map_or(0, |q| q + 1);
    emit(t, &e);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str) -> usize {
        FUNCTIONS.iter().position(|f| f.name == name).unwrap()
    }

    #[test]
    fn rooted_collectives() {
        for n in [
            "MPI_Bcast",
            "MPI_Reduce",
            "MPI_Gather",
            "MPI_Gatherv",
            "MPI_Scatterv",
        ] {
            assert!(rooted(row(n)), "{n}");
        }
        for n in [
            "MPI_Allreduce",
            "MPI_Allgather",
            "MPI_Reduce_scatter",
            "MPI_Reduce_scatter_block",
            "MPI_Barrier",
            "MPI_Alltoall",
        ] {
            assert!(!rooted(row(n)), "{n}");
        }
    }
}
