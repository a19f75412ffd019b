//! Request tracking, the Vftrace model: a request is entered in the
//! segment's table when it is posted (or a persistent one created), and
//! leaves it when the Wait/Test family completes it or `MPI_Request_free`
//! frees it, so nothing leaks. The daemon reads the outstanding count and
//! the oldest start from the table itself.
//!
//! The table is an open-addressing hash on the handle's value, probed over a
//! bounded window: a request that finds the window full is not tracked and
//! is counted in `request_table_full`. What only the process needs (the
//! communicator and kind of a receive, the bytes of a persistent send, the
//! cancelled flag) sits in private arrays beside it, indexed by slot.
//! A request is used by one thread at a time (MPI's rule), so its slot's
//! private data needs no ordering beyond the slot's own `state`.

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

use observer_common::segment::{REQUEST_SLOTS, request_state};

use super::{
    segment::{State, now_ns},
    waits::{self, Call, How, Post},
};

const N: usize = REQUEST_SLOTS as usize;
/// Slots probed before giving up: bounds the cost of a miss.
const PROBE: usize = 64;

/// What completing a request means for the figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Kind {
    /// A send: counted when posted or started; completion only releases.
    Send = 0,
    /// A receive on a communicator: counted at completion, from the status.
    Recv = 1,
    /// A matched receive (`MPI_Imrecv`): the peer was fixed by the probe.
    Mrecv = 2,
    /// A nonblocking collective: tracked for request health only.
    Collective = 3,
}

const KIND_MASK: u64 = 3;
const PERSISTENT: u64 = 4;
const CANCELLED: u64 = 8;
/// A send whose record was written ([`waits::Completes::Later`]): the call
/// that completes it is recorded too, under [`LATER_SEQ`] and
/// [`LATER_COMM`], [`LATER_PEER`] and `TAG`.
const SAMPLED: u64 = 16;

/// Per-slot private data: flags, a handle (communicator), a world rank and
/// a byte count.
static FLAGS: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static COMM: [AtomicUsize; N] = [const { AtomicUsize::new(0) }; N];
static PEER: [AtomicI32; N] = [const { AtomicI32::new(0) }; N];
static BYTES: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
/// A persistent collective's receive bytes (its send bytes are in `BYTES`,
/// its function row in `COMM`).
static RECV_BYTES: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
/// When a receive was posted: the start of its `MPI_Irecv` (or its last
/// `MPI_Start`) as `waits::posted_now` read it, 0 if not known; for Late
/// Receiver.
static POSTED: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
/// A persistent send's destination and tag, or an `MPI_Isendrecv`'s
/// receive's source (a world rank) and tag ([`Entry::dest_tag`]).
static DEST: [AtomicI32; N] = [const { AtomicI32::new(0) }; N];
/// That tag, or a sampled nonblocking send's ([`SAMPLED`]).
static TAG: [AtomicI32; N] = [const { AtomicI32::new(0) }; N];
/// A [`SAMPLED`] send's number on its envelope, its communicator's
/// wait-record id and its destination's world rank (a persistent one's
/// `PEER` is not always that, and stays for its next starts).
static LATER_SEQ: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static LATER_COMM: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static LATER_PEER: [AtomicI32; N] = [const { AtomicI32::new(0) }; N];
/// Set while a thread is inside a completion call (or `MPI_Request_free`)
/// for the slot's request. The library may free the handle inside that
/// call and hand the same value to another thread's new request before the
/// slot is released; [`find`] skips pending slots, so the other thread
/// finds its own entry and never the stale one. Completion calls take the
/// mark with a compare-and-swap ([`find_for_completion`]), so no two
/// threads ever hold one slot for completion. MPI forbids two threads
/// completing one request at once, so a pending slot is never the one a
/// second thread is looking for. Held for a whole completion call under
/// `MPI_THREAD_MULTIPLE` only; below it, only while one call's request
/// array is looked up ([`find_in_array`]).
static PENDING: [AtomicBool; N] = [const { AtomicBool::new(false) }; N];

/// No slot.
pub(crate) const NO_SLOT: u32 = u32::MAX;

#[inline(always)]
fn start(handle: usize) -> usize {
    (handle.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % N
}

/// Claims a free slot: a CAS when threads may race for it, else a load
/// and a store (see `State::multi`).
#[inline(always)]
fn claim(s: &State, state: &AtomicU32) -> bool {
    if s.multi {
        state
            .compare_exchange(request_state::FREE, request_state::BUSY, Acquire, Relaxed)
            .is_ok()
    } else if state.load(Relaxed) == request_state::FREE {
        state.store(request_state::BUSY, Relaxed);
        true
    } else {
        false
    }
}

/// What a new entry describes.
pub(crate) struct Entry {
    /// The request handle's value.
    pub(crate) handle: usize,
    /// How completion is counted.
    pub(crate) kind: Kind,
    /// Persistent (`*_init`): stays after completion, until freed.
    pub(crate) persistent: bool,
    /// Communicator (receives).
    pub(crate) comm: usize,
    /// World rank of the peer, or -1 (wildcard, collective, unknown).
    pub(crate) peer: i32,
    /// Posted bytes (a persistent send's message size; a persistent
    /// collective's send bytes).
    pub(crate) bytes: u64,
    /// A persistent collective's receive bytes.
    pub(crate) recv_bytes: u64,
    /// A persistent send's destination (a rank in `comm`) and tag, for
    /// the `MpiIsend` its starts emit when recorded (`super::trace`); an
    /// `MPI_Isendrecv`'s receive's source (a world rank) and tag, for the
    /// wait records; else (-1, 0).
    pub(crate) dest_tag: (i32, i32),
    /// A nonblocking send whose record was written: its message, for the
    /// record of the call that completes it.
    pub(crate) later: Option<waits::Later>,
}

/// Keeps sampled send `later` in slot `i`, whose flags are `flags`.
#[cold]
fn keep_later(i: usize, flags: u64, later: waits::Later) {
    LATER_SEQ[i].store(later.seq, Relaxed);
    LATER_COMM[i].store(later.comm, Relaxed);
    LATER_PEER[i].store(later.peer, Relaxed);
    TAG[i].store(later.tag, Relaxed);
    FLAGS[i].store(flags | SAMPLED, Relaxed);
}

/// The sampled send slot `i` keeps ([`keep_later`]).
fn later_of(i: usize) -> waits::Later {
    waits::Later {
        comm: LATER_COMM[i].load(Relaxed),
        peer: LATER_PEER[i].load(Relaxed),
        tag: TAG[i].load(Relaxed),
        seq: LATER_SEQ[i].load(Relaxed),
    }
}

/// Enters a request; counts `request_table_full` if there is no room.
#[inline(always)]
pub(crate) fn track(s: &State, e: Entry) {
    let h = start(e.handle);
    for i in (0..PROBE).map(|i| (h + i) % N) {
        let slot = &s.requests[i];
        if claim(s, &slot.state) {
            FLAGS[i].store(
                e.kind as u64 | if e.persistent { PERSISTENT } else { 0 },
                Relaxed,
            );
            COMM[i].store(e.comm, Relaxed);
            PEER[i].store(e.peer, Relaxed);
            BYTES[i].store(e.bytes, Relaxed);
            RECV_BYTES[i].store(e.recv_bytes, Relaxed);
            DEST[i].store(e.dest_tag.0, Relaxed);
            TAG[i].store(e.dest_tag.1, Relaxed);
            if let Some(l) = e.later {
                keep_later(i, FLAGS[i].load(Relaxed), l);
            }
            // Read only for a receive's completion; a persistent one's
            // is set by each MPI_Start (`started`).
            if !e.persistent && matches!(e.kind, Kind::Recv | Kind::Mrecv) {
                POSTED[i].store(waits::posted_now(s, e.comm), Relaxed);
            }
            slot.handle.store(e.handle as u64, Relaxed);
            slot.peer.store(e.peer.max(-1), Relaxed);
            slot.bytes.store(e.bytes, Relaxed);
            let state = if e.persistent {
                s.counters.persistent_requests.fetch_add(1, Relaxed);
                request_state::PERSISTENT_INACTIVE
            } else {
                slot.started_ns.store(now_ns(), Relaxed);
                s.add(&s.counters.requests_started, 1);
                request_state::ACTIVE
            };
            slot.state.store(state, Release);
            return;
        }
    }
    s.add(&s.counters.request_table_full, 1);
    // An untracked send's completion is never seen: its wait is not known.
    if let Some(l) = e.later {
        waits::completed(s, l, &Call::new(How::Test));
    }
    // An untracked receive's completion is never seen: its message cannot
    // be attributed, nor numbered; nor can an untracked persistent send's
    // starts.
    if matches!(e.kind, Kind::Recv | Kind::Mrecv) {
        s.add(&s.counters.unattributed_messages, 1);
        super::waits::lose(s, Some(e.comm));
    } else if e.kind == Kind::Send && e.persistent {
        super::waits::lose(s, Some(e.comm));
    }
}

/// The slot tracking `handle`, or [`NO_SLOT`]. Called before the library
/// can complete (and free, and reuse) the handle; a completion call then
/// marks the slots it found with [`pend`].
#[inline(always)]
pub(crate) fn find(s: &State, handle: usize) -> u32 {
    if handle == s.abi.request_null {
        return NO_SLOT;
    }
    let h = start(handle);
    for i in (0..PROBE).map(|i| (h + i) % N) {
        let slot = &s.requests[i];
        if slot.handle.load(Acquire) == handle as u64 {
            let st = slot.state.load(Acquire);
            // The handle again, last: between the first read and the state
            // a stale entry with this value may have been released and the
            // slot claimed for another request, whose state we then read.
            // That claim stored its own handle before its state, so the
            // second read sees it and the slot is rejected.
            if st != request_state::FREE
                && st != request_state::BUSY
                && !PENDING[i].load(Acquire)
                && slot.handle.load(Acquire) == handle as u64
            {
                return i as u32;
            }
        }
    }
    NO_SLOT
}

/// [`find`] for a completion call, which also marks the slot as being
/// completed by this thread (see [`PENDING`]). Under
/// `MPI_THREAD_MULTIPLE` the mark is taken with a compare-and-swap before
/// the slot is accepted, so two threads can never both hold one slot for
/// completion: the one that loses keeps looking for its own entry.
#[inline(always)]
pub(crate) fn find_for_completion(s: &State, handle: usize) -> u32 {
    if !s.multi {
        return find(s, handle);
    }
    if handle == s.abi.request_null {
        return NO_SLOT;
    }
    let h = start(handle);
    for i in (0..PROBE).map(|i| (h + i) % N) {
        let slot = &s.requests[i];
        if slot.handle.load(Acquire) != handle as u64 {
            continue;
        }
        if PENDING[i]
            .compare_exchange(false, true, AcqRel, Acquire)
            .is_err()
        {
            continue;
        }
        // Ours now: check it still is the entry we matched.
        let st = slot.state.load(Acquire);
        if st != request_state::FREE
            && st != request_state::BUSY
            && slot.handle.load(Acquire) == handle as u64
        {
            return i as u32;
        }
        PENDING[i].store(false, Release);
    }
    NO_SLOT
}

/// [`find_for_completion`] for one element of a request array that one
/// call completes (`MPI_Waitall`, `Testall`, `Waitany`, `Testany`,
/// `Waitsome`, `Testsome`). One handle value can stand in an array more
/// than once: MPICH hands out one shared, already complete request for
/// every send that completed at once and for every `MPI_PROC_NULL`
/// operation (`0x6c000001` for sends, `0x6c000002` for receives, or in the
/// standard ABI pointers to those objects), so three eager `MPI_Isend`s may
/// return the same value and have three entries. Each occurrence must take an entry of its own, or the others
/// leak: the pending mark makes a second lookup of the value skip the
/// first one's entry. Under `MPI_THREAD_MULTIPLE` the mark is the one
/// [`find_for_completion`] takes; below it, it is set here and cleared by
/// [`end_lookup`] once the array has been looked up.
#[inline(always)]
pub(crate) fn find_in_array(s: &State, handle: usize) -> u32 {
    if s.multi {
        return find_for_completion(s, handle);
    }
    let slot = find(s, handle);
    if slot != NO_SLOT {
        PENDING[slot as usize].store(true, Relaxed);
    }
    slot
}

/// Ends the lookup of an array by [`find_in_array`]: below
/// `MPI_THREAD_MULTIPLE`, clears the marks it set (no other thread is in
/// MPI, so nothing needs them past the lookup).
#[inline(always)]
pub(crate) fn end_lookup(s: &State, slots: &[u32]) {
    if !s.multi {
        for &slot in slots {
            if slot != NO_SLOT {
                PENDING[slot as usize].store(false, Relaxed);
            }
        }
    }
}

/// Clears the mark of a slot whose request did not complete.
#[inline(always)]
pub(crate) fn unpend(s: &State, slot: u32) {
    if s.multi && slot != NO_SLOT {
        PENDING[slot as usize].store(false, Release);
    }
}

/// Whether completing `slot` needs the status (receives, and anything
/// cancelled, whose status says whether the cancel won).
#[inline(always)]
pub(crate) fn needs_status(slot: u32) -> bool {
    if slot == NO_SLOT {
        return false;
    }
    let f = FLAGS[slot as usize].load(Relaxed);
    f & CANCELLED != 0 || matches!(f & KIND_MASK, 1 | 2)
}

/// Frees slot `i`. The mark is cleared while the handle reads 0, so no
/// thread can match the slot between the two.
fn release(s: &State, i: usize) {
    let slot = &s.requests[i];
    slot.state.store(request_state::BUSY, Relaxed);
    slot.handle.store(0, Relaxed);
    PENDING[i].store(false, Relaxed);
    slot.state.store(request_state::FREE, Release);
}

/// The library completed the request in `slot` with `status` (null if the
/// layer has none) in `call`: counts the receive, marks a persistent
/// request inactive, releases anything else, and clears the [`pend`] mark.
///
/// # Safety
/// `status` is null or a status the library just filled for this request.
pub(crate) unsafe fn complete(s: &State, slot: u32, status: *const u8, call: &Call) {
    if slot == NO_SLOT {
        return;
    }
    let i = slot as usize;
    let seg = &s.requests[i];
    let state = seg.state.load(Relaxed);
    // Waiting on an inactive persistent request returns at once, empty.
    if state != request_state::ACTIVE && state != request_state::PERSISTENT_ACTIVE {
        unpend(s, slot);
        return;
    }
    let flags = FLAGS[i].load(Relaxed);
    s.add(&s.counters.requests_completed, 1);
    // SAFETY: per the caller.
    let cancelled =
        flags & CANCELLED != 0 && !status.is_null() && unsafe { s.abi.cancelled(status) };
    let handle = seg.handle.load(Relaxed);
    if cancelled {
        s.add(&s.counters.requests_cancelled, 1);
        super::trace::request(super::trace::Kind::MpiRequestCancelled, handle);
        // A cancelled send was numbered when posted and never arrives.
        if flags & KIND_MASK == Kind::Send as u64 {
            waits::lose(s, None);
        }
    } else {
        match flags & KIND_MASK {
            0 => {
                if flags & SAMPLED != 0 {
                    waits::completed(s, later_of(i), call);
                }
                super::trace::request(super::trace::Kind::MpiIsendComplete, handle)
            }
            1 if !status.is_null() => {
                // SAFETY: per the caller.
                unsafe {
                    let post = Post::At(POSTED[i].load(Relaxed));
                    let comm = COMM[i].load(Relaxed);
                    let from = DEST[i].load(Relaxed);
                    if from >= 0 && flags & PERSISTENT == 0 {
                        // An MPI_Isendrecv's: its envelope as posted.
                        let bytes = s.abi.received(status);
                        s.message(from, observer_common::segment::RECV, bytes);
                        let tag = TAG[i].load(Relaxed);
                        waits::received(s, comm, from, tag, None, call, post);
                    } else {
                        super::waits::status_received(s, comm, status, call, post);
                    }
                    super::trace::received(s, comm, status, handle);
                }
            }
            2 if !status.is_null() => {
                // SAFETY: per the caller.
                let bytes = unsafe { s.abi.received(status) };
                let peer = PEER[i].load(Relaxed);
                s.message(peer, observer_common::segment::RECV, bytes);
                let comm = COMM[i].load(Relaxed);
                if waits::numbered(s, comm).is_some() {
                    // SAFETY: per the caller.
                    let tag = unsafe { s.abi.tag(status) };
                    let post = Post::At(POSTED[i].load(Relaxed));
                    waits::received(s, comm, peer, tag, bytes, call, post);
                }
                // SAFETY: per the caller.
                unsafe { super::trace::received_matched(s, peer, status, handle) };
            }
            1 | 2 => {
                s.add(&s.counters.unattributed_messages, 1);
                waits::lose(s, Some(COMM[i].load(Relaxed)));
            }
            _ => {}
        }
    }
    if flags & (CANCELLED | SAMPLED) != 0 {
        FLAGS[i].store(flags & !(CANCELLED | SAMPLED), Relaxed);
    }
    if flags & PERSISTENT != 0 {
        seg.state.store(request_state::PERSISTENT_INACTIVE, Release);
        unpend(s, slot);
    } else {
        release(s, i);
    }
}

/// `MPI_Start` of the persistent request in `slot`: active again, and a
/// send's message (or a collective's call) counted now.
pub(crate) fn started(s: &State, slot: u32) {
    if slot == NO_SLOT {
        return;
    }
    let i = slot as usize;
    let seg = &s.requests[i];
    let flags = FLAGS[i].load(Relaxed);
    if flags & PERSISTENT == 0 {
        return;
    }
    seg.started_ns.store(now_ns(), Relaxed);
    s.add(&s.counters.requests_started, 1);
    if flags & KIND_MASK == Kind::Collective as u64 {
        // A persistent collective: one call per start, with the bytes its
        // *_init arguments describe.
        s.call(
            COMM[i].load(Relaxed),
            BYTES[i].load(Relaxed),
            RECV_BYTES[i].load(Relaxed),
        );
    } else if flags & KIND_MASK == Kind::Send as u64 {
        let peer = PEER[i].load(Relaxed);
        if peer != super::segment::NULL_PEER {
            s.message(
                peer,
                observer_common::segment::SEND,
                Some(BYTES[i].load(Relaxed)),
            );
        }
        // Numbered by its destination's world rank, as its receiver numbers
        // it (`PEER` is unknown when the size is).
        let (comm, dest) = (COMM[i].load(Relaxed), DEST[i].load(Relaxed));
        if dest != s.abi.c.proc_null
            && waits::numbered(s, comm).is_some()
            && let Some(l) = waits::sent(
                s,
                comm,
                super::comms::peer(s, comm, dest),
                TAG[i].load(Relaxed),
                Some(BYTES[i].load(Relaxed)).filter(|_| peer != super::comms::UNKNOWN_PEER),
                waits::Completes::Later,
            )
        {
            keep_later(i, flags, l);
        }
        super::trace::send(
            s,
            COMM[i].load(Relaxed),
            DEST[i].load(Relaxed),
            TAG[i].load(Relaxed),
            BYTES[i].load(Relaxed),
            seg.handle.load(Relaxed),
        );
    } else if flags & KIND_MASK == Kind::Recv as u64 {
        POSTED[i].store(waits::posted_now(s, COMM[i].load(Relaxed)), Relaxed);
        super::trace::request(
            super::trace::Kind::MpiIrecvRequest,
            seg.handle.load(Relaxed),
        );
    }
    seg.state.store(request_state::PERSISTENT_ACTIVE, Release);
}

/// `MPI_Cancel` of the request in `slot`: its completion will ask the
/// status whether the cancel succeeded.
pub(crate) fn cancel(slot: u32) {
    if slot != NO_SLOT {
        FLAGS[slot as usize].fetch_or(CANCELLED, Relaxed);
    }
}

/// `MPI_Request_free` of the request in `slot`: the entry leaves the table.
/// An active receive freed this way will never report its status, so its
/// message is counted as unattributed.
pub(crate) fn freed(s: &State, slot: u32) {
    if slot == NO_SLOT {
        return;
    }
    let i = slot as usize;
    let flags = FLAGS[i].load(Relaxed);
    let state = s.requests[i].state.load(Relaxed);
    if flags & PERSISTENT != 0 {
        s.counters.persistent_requests.fetch_sub(1, Relaxed);
    }
    let active = state == request_state::ACTIVE || state == request_state::PERSISTENT_ACTIVE;
    if active && matches!(flags & KIND_MASK, 1 | 2) {
        s.add(&s.counters.unattributed_messages, 1);
        waits::lose(s, Some(COMM[i].load(Relaxed)));
    }
    // A sampled send freed while active: its completion is never seen.
    if flags & SAMPLED != 0 {
        waits::completed(s, later_of(i), &Call::new(How::Test));
    }
    release(s, i);
}
