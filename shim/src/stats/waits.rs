//! Wait-state records (issue 37, docs/waits.md): for each sampled blocking
//! collective on a numbered communicator (`MPI_COMM_WORLD`, or one made
//! from it by a constructor the layer follows, `super::construct`), when
//! this rank entered and left it, under the instance's sequence number and
//! the communicator's id; for each sampled point-to-point message on one,
//! when the call that posted its send was entered (and
//! left, for a blocking `MPI_Send` or `MPI_Ssend`: Late Receiver), when the
//! blocking call that completed its receive was entered and left, and when
//! the receive was posted, under the message's number on its envelope. They go into the segment's
//! wait ring (`observer_common::waits`); the node daemon matches the records
//! of one instance, or of one message, across the job's ranks and computes
//! who waited for whom.
//!
//! **Collectives are numbered without communication.** MPI requires every
//! member of a communicator to call its collectives in the same order, and
//! a blocking collective matches only a blocking one, so the n-th blocking
//! collective this rank makes on `MPI_COMM_WORLD` is the n-th of every
//! other rank of the job; on another communicator, of every other member,
//! which names the communicator alike ([`derive`]). Nonblocking and persistent collectives are not
//! numbered (they never match a blocking one). Only calls that reach the
//! `stats` level count, and every rank runs the same stack, so the numbers
//! agree. A shim injected into a running process keeps no records: its
//! numbers would start where it was injected.
//!
//! **So are messages.** MPI's non-overtaking rule: two messages with one
//! envelope (sender, receiver, communicator, tag) are received in the order
//! they were sent. So the k-th message a rank sends to rank r with tag t is
//! the k-th it receives from this rank with tag t: the sender counts its
//! sends per (destination, tag) when it posts them, the receiver its
//! receives per (source, tag) when they complete, from the status (which
//! resolves wildcards), and the numbers agree (per communicator: the
//! envelope's key holds its id). Every send and every receive on a
//! numbered communicator must be counted for that: a message this process
//! cannot count (a request its table had no room for, a receive freed while
//! active, a cancelled send, a matched probe on another communicator than
//! `MPI_COMM_WORLD`) makes it stop recording messages for good ([`lose`]); what it then
//! does not record is counted in the ring's `skipped`. A receive that
//! completed in the Test family is recorded so that its send finds it, and
//! counts no wait (Scalasca's rule).
//!
//! **Sampling.** With `MPI_OBSERVER_WAITS=N` (a power of two) a rank keeps
//! the collective instances whose number is a multiple of N, and with
//! `MPI_OBSERVER_WAITS_P2P=M` the messages whose number on their envelope
//! is a multiple of M (8 unless told): the same instances and messages on
//! every rank, with no coordination.
//!
//! **The clock** is the CPU's counter where the kernel keeps time with it
//! (`crate::timing` decides, and measures its rate in the process's first
//! 5 ms of timing; the first record after that puts the rate in the ring's
//! header), else `CLOCK_MONOTONIC`: either is one clock for the node. A
//! message's enter time is the start the timing of its call already took
//! (kept in the thread's block), so only its leave costs a read.
//!
//! **Cost.** A handle compare and a counter per collective (also with the
//! records off: `record` cuts its slices at these numbers); for a sampled
//! one, two reads of the counter (about 13 ns each on the AMD VM of
//! BENCHMARKS.md, against 32 for the vDSO's `clock_gettime`) and one
//! 64-byte record. A collective costs microseconds. Per message on
//! `MPI_COMM_WORLD`, a lookup in a small table of envelopes; for a sampled
//! receive, one read of the counter per completing call and a record; for a
//! sampled send, a record (and a read of the counter for a blocking one);
//! per `MPI_Irecv` on `MPI_COMM_WORLD`, a load and a store of its start,
//! and per sampled receive it posted, one more record.

use core::{
    cell::Cell,
    sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
};

use observer_common::{
    FUNCTION_COUNT,
    waits::{self, Plain, flag},
};

use super::{
    comms::{CommInfo, peer},
    segment::{State, state},
};
use crate::generated::fortran::FORTRAN;

/// Blocking collectives this process has made on `MPI_COMM_WORLD`: the next
/// one's sequence number.
static WORLD_SEQ: AtomicU64 = AtomicU64::new(0);

/// The counter's rate (ns per tick, 32.32) once measured; 0 before.
static RATE: AtomicU64 = AtomicU64::new(0);

/// Records the counter's rate; the next record copies it into the ring.
pub(crate) fn counter_rate(ns_per_tick: u64) {
    RATE.store(ns_per_tick, Relaxed);
}

/// A blocking collective's number ([`number`]): the instance, named alike
/// on every member.
pub(crate) struct Numbered {
    /// Its sequence number on its communicator.
    pub(crate) seq: u64,
    /// Its communicator's wait-record id (`waits::WORLD`, or one
    /// [`derive`]d).
    comm: u64,
    /// For another communicator than `MPI_COMM_WORLD`: what the layer
    /// keeps of it (its size, and its ranks' world ranks for the root).
    info: Option<&'static CommInfo>,
}

impl Numbered {
    /// Its number on `MPI_COMM_WORLD`, if it is there (`record` cuts its
    /// slices at those).
    #[inline(always)]
    pub(crate) fn world(&self) -> Option<u64> {
        (self.comm == waits::WORLD).then_some(self.seq)
    }
}

/// A sampled instance in progress.
pub(crate) struct Open {
    seq: u64,
    enter: u64,
    comm: u64,
    info: Option<&'static CommInfo>,
}

/// The records' clock now: the counter's ticks, or nanoseconds.
#[inline(always)]
fn now(ticks: bool) -> u64 {
    if ticks {
        crate::arch::ticks()
    } else {
        super::segment::monotonic_ns()
    }
}

/// `counter`'s next value, counting this one.
#[inline(always)]
fn bump(counter: &AtomicU64, multi: bool) -> u64 {
    if multi {
        counter.fetch_add(1, Relaxed)
    } else {
        let v = counter.load(Relaxed);
        counter.store(v + 1, Relaxed);
        v
    }
}

/// Numbers a blocking collective on `comm` (the handle's word): its
/// sequence number among this process's blocking collectives on that
/// communicator, the same on every member (see the module docs), under the
/// communicator's id; `None` for a communicator whose collectives are not
/// numbered ([`CommInfo::waits_id`]), or in a shim that cannot number
/// (injected: its numbers would start where it was injected). The wait
/// records sample by it and `record` cuts its slices at the numbers on
/// `MPI_COMM_WORLD`.
#[inline(always)]
pub(crate) fn number(comm: usize) -> Option<Numbered> {
    let s = state()?;
    if !s.world_numbered {
        return None;
    }
    let comm = s.abi.handle(comm);
    if comm == s.abi.comm_world {
        return Some(Numbered {
            seq: bump(&WORLD_SEQ, s.multi),
            comm: waits::WORLD,
            info: None,
        });
    }
    if s.wait_records.is_empty() {
        return None;
    }
    let info = super::comms::info(s, comm)?;
    let id = info.waits_id?;
    Some(Numbered {
        seq: bump(&info.coll_seq, s.multi),
        comm: id,
        info: Some(info),
    })
}

/// A constructor is about to make a communicator from `parent` (a handle):
/// counts it on the parent, and returns what names the new one
/// ([`derive`]), if the parent's collectives are numbered. Every member of
/// the parent calls its constructors in one order (they are collective), so
/// the count agrees on every member.
///
/// `None` when the records are off (nothing to do); `Some(None)` when the
/// parent's collectives are not numbered (the new communicator's are not
/// either).
#[inline(always)]
pub(crate) fn constructing(s: &State, parent: usize) -> Option<Option<(u64, u64)>> {
    if !s.world_numbered || s.wait_records.is_empty() {
        return None;
    }
    let Some(p) = super::comms::info(s, s.abi.handle(parent)) else {
        return Some(None);
    };
    let k = bump(&p.made, s.multi);
    Some(p.waits_id.map(|id| (id, k)))
}

/// A constructor collective over a group of `parent`'s members only
/// (`MPI_Comm_create_group`) made a communicator: `parent`'s wait-record
/// id, counting nothing on it (its other members do not call it).
///
/// `None` when the records are off; `Some(None)` when the parent's
/// collectives are not numbered.
pub(crate) fn group_parent(s: &State, parent: usize) -> Option<Option<u64>> {
    if !s.world_numbered || s.wait_records.is_empty() {
        return None;
    }
    Some(super::comms::info(s, s.abi.handle(parent)).and_then(|p| p.waits_id))
}

/// The wait-record id of a communicator made by the `k`-th constructor
/// called on the communicator of id `parent`, whose rank 0 is world rank
/// `first` and which has `size` members: the same on each of its members,
/// and different for each communicator one call makes (they have disjoint
/// members, so different first ranks), never `waits::WORLD`.
pub(crate) fn derive((parent, k): (u64, u64), first: i32, size: i32) -> Option<u64> {
    if first < 0 || size <= 0 {
        return None;
    }
    let h = [parent, k, first as u64, size as u64]
        .into_iter()
        .fold(0x6d70_695f_636f_6d6d_u64, mix);
    Some(h | 1)
}

/// splitmix64's finaliser over the running value `h` and `v`: what
/// [`derive`] folds its words with.
pub(crate) fn mix(h: u64, v: u64) -> u64 {
    let h = (h ^ v).wrapping_add(0x9E37_79B9_7F4A_7C15);
    let h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

/// A blocking collective numbered by [`number`] is about to enter the
/// level below: returns the instance if it is sampled.
#[inline(always)]
pub(crate) fn enter(n: Option<&Numbered>) -> Option<Open> {
    let n = n?;
    let s = state()?;
    if s.wait_records.is_empty() {
        return None;
    }
    (n.seq & s.wait_mask == 0).then(|| Open {
        seq: n.seq,
        enter: now(s.wait_ticks),
        comm: n.comm,
        info: n.info,
    })
}

/// The collective `function` of [`enter`] returned success: records it,
/// with `root` (a rank of its communicator, or `waits::NO_ROOT`) as a
/// world rank, and, on another communicator than `MPI_COMM_WORLD`, its
/// size (in the record's tag).
#[inline(always)]
pub(crate) fn leave(open: Option<Open>, function: usize, root: i32) {
    let (Some(o), Some(s)) = (open, state()) else {
        return;
    };
    let leave = now(s.wait_ticks);
    let (root, size) = match o.info {
        None => (root, 0),
        Some(i) => (
            if root == waits::NO_ROOT {
                root
            } else {
                usize::try_from(root)
                    .ok()
                    .and_then(|r| i.world.get(r).copied())
                    .unwrap_or(waits::NO_ROOT)
            },
            i.size,
        ),
    };
    let r = Plain {
        enter: o.enter,
        leave,
        seq: o.seq,
        comm: o.comm,
        function: function as u16,
        kind: waits::kind::COLL,
        peer: root,
        tag: size,
        ..Plain::default()
    };
    push(s, &r);
}

/// Writes `r` into the ring, with the counter's rate into its header the
/// first time the rate is known.
#[inline(always)]
fn push(s: &State, r: &Plain) {
    if s.wait_ticks && s.wait_head.ns_per_tick.load(Relaxed) == 0 {
        let rate = RATE.load(Relaxed);
        if rate != 0 {
            s.wait_head.ns_per_tick.store(rate, Relaxed);
        }
    }
    waits::push(s.wait_head, s.wait_records, r, s.multi);
}

/// Envelopes a process can number, per direction.
const ENVELOPES: usize = 8_192;
/// Slots probed before an envelope is given up: bounds a miss.
const PROBE: usize = 32;

/// The next sequence number of each envelope (communicator, peer, tag), in
/// one direction: an open-addressing table whose
/// entries are never removed (a program uses few envelopes; one that uses
/// more, a tag per iteration say, finds no room for the later ones, and
/// their messages are not recorded).
struct Envelopes {
    keys: [AtomicU64; ENVELOPES],
    next: [AtomicU64; ENVELOPES],
}

impl Envelopes {
    const fn new() -> Envelopes {
        Envelopes {
            keys: [const { AtomicU64::new(0) }; ENVELOPES],
            next: [const { AtomicU64::new(0) }; ENVELOPES],
        }
    }

    /// The number of the message on envelope `key` (its first is 0),
    /// counting it; `None` with no room. `multi`: other threads may count
    /// at once.
    #[inline(always)]
    fn count(&self, key: u64, multi: bool) -> Option<u64> {
        let h = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize;
        for i in (0..PROBE).map(|i| (h + i) % ENVELOPES) {
            let k = self.keys[i].load(Relaxed);
            let mine = k == key
                || k == 0
                    && if multi {
                        match self.keys[i].compare_exchange(0, key, Relaxed, Relaxed) {
                            Ok(_) => true,
                            Err(now) => now == key,
                        }
                    } else {
                        self.keys[i].store(key, Relaxed);
                        true
                    };
            if mine {
                let c = &self.next[i];
                return Some(if multi {
                    c.fetch_add(1, Relaxed)
                } else {
                    let v = c.load(Relaxed);
                    c.store(v + 1, Relaxed);
                    v
                });
            }
        }
        None
    }
}

/// The key of envelope (`peer`, `tag`) on the communicator of id `comm`:
/// never 0 (`peer` is a world rank, below 2^31).
#[inline(always)]
fn key(comm: u64, peer: i32, tag: i32) -> u64 {
    let k = u64::from(tag as u32) << 32 | u64::from(peer as u32) | 1 << 31;
    if comm == waits::WORLD {
        k
    } else {
        // Another communicator's: mixed with its id, never 0. Two of the
        // few envelopes a process uses share a key by chance only (odds
        // about n² / 2^63), and then share a counter.
        ((k ^ comm).wrapping_mul(comm | 1) ^ comm) | 1
    }
}

/// Sends this process posted on numbered communicators, per (communicator,
/// destination, tag).
static SENDS: Envelopes = Envelopes::new();
/// Receives it completed there, per (communicator, source, tag).
static RECVS: Envelopes = Envelopes::new();
/// Set for good once the process lost count of a message on a numbered
/// communicator ([`lose`]).
static LOST: AtomicBool = AtomicBool::new(false);

/// How a receive was completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum How {
    /// By a call that completes one: `MPI_Recv`, `MPI_Sendrecv`,
    /// `MPI_Mrecv`, `MPI_Wait`, `MPI_Waitany`.
    One,
    /// By `MPI_Waitall` or `MPI_Waitsome`: the call's receives are one
    /// group (Scalasca counts its latest sender).
    Multi,
    /// By the Test family: no wait.
    Test,
}

/// The call a receive completes in: how, its leave time once read (one
/// read for all the receives it completes), and for a group
/// ([`How::Multi`]) its enter time and how many receives it recorded.
pub(crate) struct Call {
    how: How,
    leave: Cell<u64>,
    enter: Cell<u64>,
    thread: Cell<u32>,
    recorded: Cell<u32>,
}

impl Call {
    /// A call completing receives `how`.
    #[inline(always)]
    pub(crate) const fn new(how: How) -> Call {
        Call {
            how,
            leave: Cell::new(0),
            enter: Cell::new(0),
            thread: Cell::new(0),
            recorded: Cell::new(0),
        }
    }

    fn leave(&self, ticks: bool) -> u64 {
        let mut l = self.leave.get();
        if l == 0 {
            l = now(ticks);
            self.leave.set(l);
        }
        l
    }

    /// After the last receive of a group: if it recorded any, writes the
    /// group's end, so the daemon need not wait for the thread's next
    /// record to know the group whole.
    #[inline(always)]
    pub(crate) fn end(&self) {
        let n = self.recorded.get();
        if n == 0 {
            return;
        }
        let Some(s) = state() else { return };
        push(
            s,
            &Plain {
                enter: self.enter.get(),
                leave: self.leave.get(),
                seq: u64::from(n),
                comm: waits::WORLD,
                kind: waits::kind::GROUP_END,
                peer: waits::NO_ROOT,
                thread: self.thread.get(),
                ..Plain::default()
            },
        );
    }
}

/// The id under which messages on `comm` (a handle) are numbered, if they
/// are: `MPI_COMM_WORLD`'s, or that of a communicator whose members name it
/// alike ([`derive`]; a lookup in the communicator cache). The callers
/// read what only numbering needs (a status's tag) after asking.
#[inline(always)]
pub(crate) fn numbered(s: &State, comm: usize) -> Option<u64> {
    if !s.p2p_waits {
        return None;
    }
    if comm == s.abi.comm_world {
        return Some(waits::WORLD);
    }
    other_numbered(s, comm)
}

/// [`numbered`] for a communicator other than `MPI_COMM_WORLD`.
#[inline(never)]
fn other_numbered(s: &State, comm: usize) -> Option<u64> {
    if !s.world_numbered {
        return None;
    }
    super::comms::info(s, comm)?.waits_id
}

/// How a send completes, for Late Receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Completes {
    /// In the call that posted it, a blocking `MPI_Send` or `MPI_Ssend`
    /// (Scalasca's blocking sends): its leave is recorded.
    Here,
    /// In a later call of the Wait or Test family (an `MPI_Isend` and its
    /// modes, a persistent send's `MPI_Start`): when sampled, its request
    /// keeps the message's name ([`Later`]) and [`completed`] records that
    /// call.
    Later,
    /// Not a wait of Scalasca's (a buffered or ready send, the send half of
    /// a `Sendrecv` or an `MPI_Isendrecv`).
    Else,
}

/// A sampled send completed later: its message's name, kept beside its
/// request until [`completed`] records the call that completes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Later {
    pub(crate) comm: u64,
    pub(crate) peer: i32,
    pub(crate) tag: i32,
    pub(crate) seq: u64,
}

/// A send to world rank `dest` with `tag` and `bytes`, on `comm` (a handle),
/// posted by the call being timed: numbered, and recorded if sampled.
/// `completes`: where it completes; for one completed later and recorded,
/// its message's name, for its request to keep.
#[inline(always)]
pub(crate) fn sent(
    s: &State,
    comm: usize,
    dest: i32,
    tag: i32,
    bytes: Option<u64>,
    completes: Completes,
) -> Option<Later> {
    if let (Some(id), true) = (numbered(s, comm), dest >= 0) {
        let seq = message(s, &SENDS, id, dest, tag, bytes, Half::Send(completes))?;
        return (completes == Completes::Later).then_some(Later {
            comm: id,
            peer: dest,
            tag,
            seq,
        });
    }
    None
}

/// A sampled send completed later ([`Completes::Later`]) was completed in
/// `call`, the call being timed: records that call, for its Late Receiver.
/// A [`How::Test`] `call` says it waited for nothing (the Test family, or a
/// request freed or never tracked).
#[cold]
pub(crate) fn completed(s: &State, later: Later, call: &Call) {
    record(
        s,
        later.seq,
        later.comm,
        later.peer,
        later.tag,
        None,
        Half::Done(call),
    );
}

/// Where a receive was posted, for Late Receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Post {
    /// By the call that completes it (`MPI_Recv`, `MPI_Sendrecv`,
    /// `MPI_Mrecv`).
    Here,
    /// By an earlier call, whose start (as [`posted_now`] read it) this is;
    /// 0 when it is not known.
    At(u64),
}

/// The start of the call being timed, as the thread's block holds it, to
/// keep with a receive it posts ([`Post::At`]): a load, converted only when
/// the receive is recorded. 0 where messages on `comm` (a handle) are not
/// numbered.
#[inline(always)]
pub(crate) fn posted_now(s: &State, comm: usize) -> u64 {
    if numbered(s, comm).is_none() {
        return 0;
    }
    // SAFETY: this thread's block.
    unsafe { crate::depth::call_start(crate::depth::slot()) }
}

/// A receive from world rank `src` with `tag` and `bytes`, on `comm` (a
/// handle), posted as `post` says and completed in `call`: numbered, and
/// recorded if sampled.
#[inline(always)]
pub(crate) fn received(
    s: &State,
    comm: usize,
    src: i32,
    tag: i32,
    bytes: Option<u64>,
    call: &Call,
    post: Post,
) {
    if let (Some(id), true) = (numbered(s, comm), src >= 0) {
        message(s, &RECVS, id, src, tag, bytes, Half::Recv { call, post });
    }
}

/// Counts a completed receive on `comm` from its status, completed in
/// `call`, and numbers it for the wait records.
///
/// # Safety
/// `status` is a status the library filled for the receive.
#[inline(always)]
pub(crate) unsafe fn status_received(
    s: &State,
    comm: usize,
    status: *const u8,
    call: &Call,
    post: Post,
) {
    // SAFETY: per the caller.
    let src = unsafe { s.abi.source(status) };
    if src == s.abi.c.proc_null {
        return;
    }
    let p = peer(s, comm, src);
    // SAFETY: per the caller.
    let bytes = unsafe { s.abi.received(status) };
    s.message(p, observer_common::segment::RECV, bytes);
    if numbered(s, comm).is_some() {
        // SAFETY: per the caller.
        received(s, comm, p, unsafe { s.abi.tag(status) }, bytes, call, post);
    }
}

/// The process could not count a message on `comm` (a handle; `None` when
/// it does not know which): it records no more messages, since its numbers
/// may no longer agree with its peers'.
#[cold]
pub(crate) fn lose(s: &State, comm: Option<usize>) {
    if s.p2p_waits && comm.is_none_or(|c| numbered(s, c).is_some()) {
        LOST.store(true, Relaxed);
    }
}

/// A message's half that this process numbers, or the completion of a
/// send it recorded.
#[derive(Clone, Copy)]
enum Half<'a> {
    Send(Completes),
    Recv { call: &'a Call, post: Post },
    Done(&'a Call),
}

/// Numbers a message's half, and records it if sampled: its number if it
/// was recorded.
#[inline(always)]
fn message(
    s: &State,
    table: &Envelopes,
    comm: u64,
    peer: i32,
    tag: i32,
    bytes: Option<u64>,
    half: Half<'_>,
) -> Option<u64> {
    match table.count(key(comm, peer, tag), s.multi) {
        Some(seq) if seq & s.p2p_mask != 0 => None,
        Some(seq) => record(s, seq, comm, peer, tag, bytes, half).then_some(seq),
        None => {
            skip(s);
            None
        }
    }
}

/// Counts a message not recorded (a sampled one, or any of an envelope
/// with no room).
#[cold]
fn skip(s: &State) {
    let c = &s.wait_head.skipped;
    if s.multi {
        c.fetch_add(1, Relaxed);
    } else {
        c.store(c.load(Relaxed) + 1, Relaxed);
    }
}

/// Records sampled message `seq`: a send, a receive, or the call that
/// completed a send; before a receive posted by an earlier call, when that
/// call was entered (`waits::kind::POSTED`). Whether it was recorded.
#[inline(never)]
fn record(
    s: &State,
    seq: u64,
    comm: u64,
    peer: i32,
    tag: i32,
    bytes: Option<u64>,
    half: Half<'_>,
) -> bool {
    let block = crate::depth::slot();
    // SAFETY: this thread's block.
    let (t0, row) = unsafe {
        (
            crate::depth::call_start(block),
            crate::depth::call_row(block),
        )
    };
    let enter = crate::depth::start_in(t0, s.wait_ticks);
    let (Some(enter), false) = (enter, LOST.load(Relaxed)) else {
        skip(s);
        return false;
    };
    let row = row as usize;
    let function = if row < FUNCTION_COUNT {
        row
    } else {
        FORTRAN
            .get(row - FUNCTION_COUNT)
            .map_or(0, |f| f.function as usize)
    };
    let thread = (block as usize >> 4) as u32;
    let mut r = Plain {
        enter,
        leave: enter,
        seq,
        comm,
        function: function as u16,
        kind: waits::kind::SEND,
        flags: 0,
        peer,
        tag,
        thread,
        bytes: bytes.unwrap_or(u64::MAX),
    };
    // A completing call's: how it completes, counted in its group.
    let completing = |c: &Call| match c.how {
        How::One => 0,
        How::Multi => {
            c.enter.set(enter);
            c.thread.set(thread);
            c.recorded.set(c.recorded.get() + 1);
            flag::MULTI
        }
        How::Test => flag::TEST,
    };
    match half {
        Half::Send(Completes::Else) => {}
        Half::Send(Completes::Later) => r.flags = flag::LATER,
        Half::Send(Completes::Here) => {
            // The call has returned: now is its leave.
            r.leave = now(s.wait_ticks);
            r.flags = flag::BLOCKING;
        }
        Half::Done(c) => {
            r.kind = waits::kind::SENT;
            r.leave = c.leave(s.wait_ticks);
            r.flags = completing(c);
        }
        Half::Recv { call: c, post } => {
            r.kind = waits::kind::RECV;
            r.leave = c.leave(s.wait_ticks);
            r.flags = completing(c);
            match post {
                Post::Here => r.flags |= flag::POSTED_HERE,
                Post::At(t) => {
                    if let Some(at) = crate::depth::start_in(t, s.wait_ticks) {
                        push(
                            s,
                            &Plain {
                                enter: at,
                                leave: at,
                                kind: waits::kind::POSTED,
                                flags: 0,
                                bytes: 0,
                                ..r
                            },
                        );
                    }
                }
            }
        }
    }
    push(s, &r);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_number_each_one_apart() {
        let t = Envelopes::new();
        let a = key(waits::WORLD, 0, 0);
        let b = key(waits::WORLD, 1, 0);
        let c = key(waits::WORLD, 0, -1);
        assert!(a != 0 && a != b && a != c && b != c);
        // The same envelope on two other communicators, and on the world.
        let (x, y) = (derive((0, 0), 0, 4).unwrap(), derive((0, 1), 0, 4).unwrap());
        let d = key(x, 0, 0);
        let e = key(y, 0, 0);
        assert!(d != 0 && e != 0 && d != e && d != a && e != a);
        assert_eq!(t.count(a, false), Some(0));
        assert_eq!(t.count(a, false), Some(1));
        assert_eq!(t.count(b, true), Some(0));
        assert_eq!(t.count(c, false), Some(0));
        assert_eq!(t.count(a, true), Some(2));
        assert_eq!(t.count(b, false), Some(1));
    }

    #[test]
    fn a_full_table_numbers_nothing_new_and_keeps_the_old() {
        let t = Envelopes::new();
        let mut refused = 0;
        for tag in 0..(ENVELOPES as i32 + 100) {
            if t.count(key(waits::WORLD, 3, tag), false).is_none() {
                refused += 1;
            }
        }
        assert!(refused >= 100, "{refused}");
        // What it numbered, it still numbers.
        assert_eq!(t.count(key(waits::WORLD, 3, 0), false), Some(1));
    }

    #[test]
    fn threads_counting_one_envelope_share_its_numbers() {
        let t = Envelopes::new();
        let mut all: Vec<u64> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    sc.spawn(|| {
                        (0..1000)
                            .map(|_| t.count(key(waits::WORLD, 7, 5), true).unwrap())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        all.sort_unstable();
        assert_eq!(all, (0..4000).collect::<Vec<_>>());
    }
}
