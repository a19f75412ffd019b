//! The shim's event rings for `mpi-observer record`: a second shared-memory
//! file next to the stats segment, the segment's name plus `.trace`
//! (`/dev/shm/mpi-observer.<uid>.<pid>.<random>.trace`, see
//! [`crate::segment::Name`]), created `0600` by the shim when it creates its
//! segment and kept mapped while the process lives.
//!
//! ```text
//! TraceHeader | Ring[ring_count], each: RingHeader (128 B) | TraceEvent[ring_events]
//! ```
//!
//! Each ring has one producer, the application thread that claimed it
//! (`owner`, a CAS from 0, at its first event of a recording), and one
//! consumer, the recorder. The producer writes a record at
//! `head % ring_events`, then publishes it by storing `head + 1`
//! (Release); the consumer reads the records between its `tail` and
//! `head` (Acquire), then stores `tail` (Release). A full ring drops the
//! event and counts it in `dropped`: the application never waits.
//!
//! The recorder starts a recording with `active == 0`: every ring's tail
//! to its head, the owner of a ring whose thread exited back to 0, then
//! `generation + 1`, then `active = 1` (Release). A live thread keeps its
//! ring from one recording to the next (it may be writing a Leave while
//! the next recording starts: handing its ring to another thread would
//! make two producers); it checks at its first event of each generation
//! that the ring is still its own. While `active == 0` the shim writes
//! nothing but the Leaves of calls whose Enter it wrote.
//!
//! The file is sized with `ftruncate` and so costs no memory until a ring is
//! used; a thread claiming a ring first reserves that ring's pages with
//! `posix_fallocate` (so a full `/dev/shm` is a refused claim, counted in
//! `no_ring`, never a SIGBUS).

use core::sync::atomic::{AtomicU32, AtomicU64};

/// First bytes of the file.
pub const MAGIC: [u8; 8] = *b"MPIOTRC\0";
/// Layout version.
pub const VERSION: u32 = 1;
/// The file's path is the stats segment's with this suffix.
pub const PATH_SUFFIX: &str = ".trace";
/// Rings unless `MPI_OBSERVER_TRACE_RINGS` says otherwise.
pub const DEFAULT_RINGS: u32 = 8;
/// Events per ring unless `MPI_OBSERVER_TRACE_RING_EVENTS` says otherwise
/// (4 MiB of records, reserved only when a thread claims the ring).
pub const DEFAULT_RING_EVENTS: u32 = 65_536;
/// Bounds of the ring count.
pub const RINGS: core::ops::RangeInclusive<u32> = 1..=256;
/// Bounds of the events per ring (rounded down to a power of two).
pub const RING_EVENTS: core::ops::RangeInclusive<u32> = 64..=(1 << 20);
/// Largest file a recorder maps.
pub const MAX_BYTES: u64 = 1 << 32;

/// The file's header.
#[repr(C)]
pub struct TraceHeader {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`VERSION`].
    pub version: u32,
    /// `size_of::<TraceHeader>()`.
    pub header_size: u32,
    /// Size of the whole file.
    pub total_size: u64,
    /// Number of rings.
    pub ring_count: u32,
    /// Events per ring, a power of two.
    pub ring_events: u32,
    /// Offset of the first ring.
    pub rings_offset: u64,
    /// This process's rank in `MPI_COMM_WORLD`.
    pub world_rank: u32,
    /// `MPI_COMM_WORLD`'s size.
    pub world_size: u32,
    /// 1 while a recording is on.
    pub active: AtomicU32,
    /// 1 once the header is written.
    pub ready: AtomicU32,
    /// Bumped by the recorder at each start.
    pub generation: AtomicU64,
    /// Events lost because their thread found no ring to claim.
    pub no_ring: AtomicU64,
}

/// One ring's header: the producer's line, then the consumer's.
#[repr(C, align(64))]
pub struct RingHeader {
    /// Thread ID of the producer, 0 if unclaimed (kept across recordings
    /// while the thread lives).
    pub owner: AtomicU32,
    /// Zero.
    pub pad: u32,
    /// Records written since the file was created (the producer's count).
    pub head: AtomicU64,
    /// Events this ring's producer could not write (ring full).
    pub dropped: AtomicU64,
    /// Zero.
    pub pad2: [u64; 5],
    /// Records read (the consumer's count).
    pub tail: AtomicU64,
    /// Zero.
    pub pad3: [u64; 7],
}

/// Bytes of a ring with `events` records.
pub const fn ring_bytes(events: u32) -> u64 {
    core::mem::size_of::<RingHeader>() as u64 + events as u64 * EVENT_BYTES
}

/// Size of the header block: the header, rounded up to a page.
pub const HEADER_BYTES: u64 = 4096;

/// Total size of a file of `rings` rings of `events` records.
pub const fn file_bytes(rings: u32, events: u32) -> u64 {
    HEADER_BYTES + rings as u64 * ring_bytes(events)
}

/// Offset of ring `i`.
pub const fn ring_offset(i: u32, events: u32) -> u64 {
    HEADER_BYTES + i as u64 * ring_bytes(events)
}

/// One event: 64 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    /// CLOCK_MONOTONIC nanoseconds (the clock of `bpf_ktime_get_ns`).
    pub t_ns: u64,
    /// A [`Kind`].
    pub kind: u16,
    /// The `FunctionId` of the call it belongs to.
    pub func: u16,
    /// The communicator: 0 for `MPI_COMM_WORLD`, else the id a
    /// [`Kind::CommDef`] defined.
    pub comm: u32,
    /// A rank in `comm`: receiver, actual sender, or root; -1 for none.
    /// [`Kind::CommDef`]: the communicator's size; [`Kind::CommRanks`]:
    /// the index of the first rank it carries.
    pub peer: i32,
    /// The message tag.
    pub tag: i32,
    /// Message bytes, or a collective's bytes sent.
    pub bytes: u64,
    /// A collective's bytes received.
    pub bytes2: u64,
    /// The request handle (request events). [`Kind::CollectiveEnd`] and
    /// [`Kind::WorldMark`]: 1 + the collective's number among the
    /// process's blocking collectives on `MPI_COMM_WORLD`, the same on
    /// every rank of the job, or 0 when it has none (another communicator,
    /// or a shim that cannot number: injected); see
    /// [`TraceEvent::world_seq`].
    pub request: u64,
    /// Zero, or ranks of a [`Kind::CommRanks`] (see [`TraceEvent::comm_ranks`]).
    pub aux: [u32; 4],
}

/// Size of a [`TraceEvent`].
pub const EVENT_BYTES: u64 = 64;
const _: () = assert!(core::mem::size_of::<TraceEvent>() == EVENT_BYTES as usize);
const _: () = assert!(core::mem::size_of::<RingHeader>() == 128);
const _: () = assert!(core::mem::size_of::<TraceHeader>() <= HEADER_BYTES as usize);

/// World ranks one [`Kind::CommRanks`] record carries: `bytes`, `bytes2`,
/// `request` and `aux` as 10 `u32`s.
pub const RANKS_PER_RECORD: usize = 10;

impl TraceEvent {
    /// The number of the blocking collective on `MPI_COMM_WORLD` that a
    /// [`Kind::CollectiveEnd`] or [`Kind::WorldMark`] ends, if it has one.
    pub fn world_seq(&self) -> Option<u64> {
        match self.kind {
            11 | 14 => self.request.checked_sub(1),
            _ => None,
        }
    }

    /// The world ranks a [`Kind::CommRanks`] record carries (unused
    /// entries are `u32::MAX`).
    pub fn comm_ranks(&self) -> [u32; RANKS_PER_RECORD] {
        let w = [self.bytes, self.bytes2, self.request];
        let mut out = [u32::MAX; RANKS_PER_RECORD];
        for (i, x) in w.iter().enumerate() {
            out[2 * i] = *x as u32;
            out[2 * i + 1] = (*x >> 32) as u32;
        }
        out[6..].copy_from_slice(&self.aux);
        out
    }

    /// A [`Kind::CommRanks`] record of `comm` carrying `ranks` (at most
    /// [`RANKS_PER_RECORD`]) from index `first`.
    pub fn comm_ranks_record(t_ns: u64, comm: u32, first: u32, ranks: &[u32]) -> TraceEvent {
        let mut r = [u32::MAX; RANKS_PER_RECORD];
        for (d, s) in r.iter_mut().zip(ranks) {
            *d = *s;
        }
        let pair = |i: usize| u64::from(r[i]) | u64::from(r[i + 1]) << 32;
        TraceEvent {
            t_ns,
            kind: Kind::CommRanks as u16,
            func: 0,
            comm,
            peer: first as i32,
            tag: 0,
            bytes: pair(0),
            bytes2: pair(2),
            request: pair(4),
            aux: [r[6], r[7], r[8], r[9]],
        }
    }
}

/// What a [`TraceEvent`] is, after the OTF2 event model (the seed
/// `otf2-mpi-message-matching.txt`).
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An application-level MPI call begins.
    Enter = 1,
    /// It returns.
    Leave = 2,
    /// A blocking send: receiver, tag, comm, bytes.
    MpiSend = 3,
    /// A blocking receive completed: actual sender, tag, comm, bytes.
    MpiRecv = 4,
    /// A nonblocking send posted (or a persistent one started).
    MpiIsend = 5,
    /// Its completion, by request.
    MpiIsendComplete = 6,
    /// A nonblocking receive posted (or a persistent one started).
    MpiIrecvRequest = 7,
    /// Its completion: actual sender, tag, comm, bytes, request.
    MpiIrecv = 8,
    /// A request cancelled.
    MpiRequestCancelled = 9,
    /// A blocking collective begins (after its Enter).
    CollectiveBegin = 10,
    /// It ends (before its Leave): root in `peer`, bytes sent and received;
    /// its number on `MPI_COMM_WORLD` in `request` ([`TraceEvent::world_seq`]).
    CollectiveEnd = 11,
    /// A communicator: its id in `comm`, its size in `peer`; its world
    /// ranks follow in [`Kind::CommRanks`] records.
    CommDef = 12,
    /// World ranks of a communicator being defined.
    CommRanks = 13,
    /// A blocking collective on `MPI_COMM_WORLD` ended in a call that began
    /// before the recording (so it has no Enter, Begin, End or Leave): its
    /// number in `request`. `record` cuts its slice at such points
    /// (`observer/src/record/slice.rs`); it is no event of the archive.
    WorldMark = 14,
}

impl Kind {
    /// The kind of `e`, if known.
    pub fn of(e: &TraceEvent) -> Option<Kind> {
        use Kind::*;
        Some(match e.kind {
            1 => Enter,
            2 => Leave,
            3 => MpiSend,
            4 => MpiRecv,
            5 => MpiIsend,
            6 => MpiIsendComplete,
            7 => MpiIrecvRequest,
            8 => MpiIrecv,
            9 => MpiRequestCancelled,
            10 => CollectiveBegin,
            11 => CollectiveEnd,
            12 => CommDef,
            13 => CommRanks,
            14 => WorldMark,
            _ => return None,
        })
    }
}

/// Appends `ev` to a ring: the producer's side. Returns false, counting it,
/// when the ring is full.
///
/// # Safety
/// `records` points to the ring's `events` records; only the ring's owner
/// calls this.
#[inline(always)]
pub unsafe fn push(
    ring: &RingHeader,
    records: *mut TraceEvent,
    events: u32,
    ev: &TraceEvent,
) -> bool {
    use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};
    let head = ring.head.load(Relaxed);
    if head.wrapping_sub(ring.tail.load(Acquire)) >= u64::from(events) {
        ring.dropped.store(ring.dropped.load(Relaxed) + 1, Relaxed);
        return false;
    }
    let i = (head & u64::from(events - 1)) as usize;
    // SAFETY: i < events; the consumer reads this record only after the
    // Release store below.
    unsafe { records.add(i).write_volatile(*ev) };
    ring.head.store(head + 1, Release);
    true
}

/// Reads the records published since the last call: the consumer's side.
/// Calls `f` for each, in order; returns how many.
///
/// # Safety
/// `records` points to the ring's `events` records; one consumer.
pub unsafe fn drain(
    ring: &RingHeader,
    records: *const TraceEvent,
    events: u32,
    mut f: impl FnMut(&TraceEvent),
) -> u64 {
    use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};
    let head = ring.head.load(Acquire);
    let mut tail = ring.tail.load(Relaxed);
    // A corrupt head (more than a ring ahead) is not believed.
    if head.wrapping_sub(tail) > u64::from(events) {
        ring.tail.store(head, Release);
        return 0;
    }
    let n = head.wrapping_sub(tail);
    while tail != head {
        let i = (tail & u64::from(events - 1)) as usize;
        // SAFETY: i < events; published by the Acquire load of head.
        let ev = unsafe { records.add(i).read_volatile() };
        f(&ev);
        tail = tail.wrapping_add(1);
    }
    ring.tail.store(tail, Release);
    n
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{boxed::Box, vec, vec::Vec};

    use super::*;

    fn ring(events: u32) -> (Box<RingHeader>, Vec<TraceEvent>) {
        // SAFETY: all-zero is a valid RingHeader.
        let h: Box<RingHeader> = Box::new(unsafe { core::mem::zeroed() });
        (h, vec![TraceEvent::default(); events as usize])
    }

    fn ev(t: u64) -> TraceEvent {
        TraceEvent {
            t_ns: t,
            kind: Kind::Enter as u16,
            ..TraceEvent::default()
        }
    }

    #[test]
    fn wraps_and_drops_when_full() {
        let (h, mut recs) = ring(4);
        let p = recs.as_mut_ptr();
        let mut got = Vec::new();
        for round in 0..3u64 {
            for t in 0..5 {
                // The fifth does not fit.
                // SAFETY: `p` is the ring's 4 records; this thread is its
                // only producer.
                let ok = unsafe { push(&h, p, 4, &ev(round * 10 + t)) };
                assert_eq!(ok, t < 4);
            }
            // SAFETY: the same 4 records; this thread is the only consumer.
            unsafe { drain(&h, p, 4, |e| got.push(e.t_ns)) };
        }
        assert_eq!(
            got,
            [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23],
            "in order across wraps"
        );
        assert_eq!(h.dropped.load(core::sync::atomic::Ordering::Relaxed), 3);
    }

    #[test]
    fn one_producer_one_consumer_threads() {
        let (h, mut recs) = ring(64);
        let p = recs.as_mut_ptr() as usize;
        let h: &'static RingHeader = Box::leak(h);
        let n = 200_000u64;
        let prod = std::thread::spawn(move || {
            let mut t = 0;
            while t < n {
                // SAFETY: `p` is the ring's 64 records, alive until the
                // join below; this thread is the only producer.
                if unsafe { push(h, p as *mut TraceEvent, 64, &ev(t)) } {
                    t += 1;
                }
            }
        });
        let mut next = 0u64;
        while next < n {
            // SAFETY: the same 64 records; this thread is the only consumer.
            unsafe {
                drain(h, p as *const TraceEvent, 64, |e| {
                    assert_eq!(e.t_ns, next, "every record once, in order");
                    next += 1;
                })
            };
        }
        prod.join().unwrap();
        drop(recs);
    }

    #[test]
    fn comm_ranks_round_trip() {
        let ranks: Vec<u32> = (100..110).collect();
        let r = TraceEvent::comm_ranks_record(5, 7, 20, &ranks);
        assert_eq!(Kind::of(&r), Some(Kind::CommRanks));
        assert_eq!((r.comm, r.peer), (7, 20));
        assert_eq!(&r.comm_ranks()[..], &ranks[..]);
        let short = TraceEvent::comm_ranks_record(5, 7, 0, &[3, 1]);
        assert_eq!(short.comm_ranks()[..3], [3, 1, u32::MAX]);
    }
}
