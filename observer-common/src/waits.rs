//! Wait-state records: the shim's `stats` layer writes one per sampled
//! collective instance, and one per sampled point-to-point send and receive,
//! into a ring in its segment (layout version 4), and the node daemon drains
//! the rings of a job's ranks, matches the records of one instance (or of
//! one message) and computes Scalasca's wait states from them
//! (docs/waits.md).
//!
//! **The ring laps; it never blocks and never reads the consumer.** The
//! producer writes a record in place (a seqlock per slot: `pos` is 0 while
//! the slot is written, then the record's position + 1) and moves `head` on.
//! It never looks at the reader: a reader that falls more than a ring behind
//! loses the oldest records, and [`drain`] counts each one lost, so no
//! figure is lost silently. A record overwritten while it is copied is
//! counted lost too. The trace ring of `mpi-observer record`
//! ([`crate::trace`]) is the other kind: it drops the newest when full and
//! the producer reads the consumer's tail at every push; a wait record is
//! written on every sampled collective, always on, where that cross-core
//! read would cost more than the record.
//!
//! **Times** are the CPU's counter (the TSC on x86-64, the generic timer's
//! virtual count on aarch64) where the kernel keeps time with it, which it
//! does only for a counter that is invariant and synchronised across CPUs:
//! then every rank of a node reads one counter, at about a third of a vDSO
//! `clock_gettime` (12.7 against 32 ns on the AMD VM of BENCHMARKS.md). The
//! ring says so ([`clock::TICKS`]) and, once the shim has measured it, the
//! counter's rate ([`RingHeader::ns_per_tick`]); the reader scales
//! differences of ticks with it. Elsewhere records hold `CLOCK_MONOTONIC`
//! nanoseconds ([`clock::NS`]), also one clock for the whole node.

use core::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
    fence,
};

/// Slots of a ring (a power of two): at the daemon's 250 ms drain, 32 k
/// sampled collectives per second per rank before records are lost.
pub const RING_SLOTS: u32 = 8_192;
/// Most slots a reader accepts.
pub const MAX_RING_SLOTS: u32 = 1 << 20;
/// The communicator id of `MPI_COMM_WORLD`.
pub const WORLD: u64 = 0;
/// `root` of a collective that has none.
pub const NO_ROOT: i32 = -1;

/// The clock of a ring's records ([`RingHeader::clock`]).
pub mod clock {
    /// `CLOCK_MONOTONIC` nanoseconds.
    pub const NS: u64 = 1;
    /// The CPU's counter, in ticks.
    pub const TICKS: u64 = 2;
}

/// Nanoseconds in `ticks` of a counter running at `ns_per_tick` (32.32
/// fixed point, as the shim's calibration gives it).
pub const fn ticks_to_ns(ticks: u64, ns_per_tick: u64) -> u64 {
    let ns = (ticks as u128 * ns_per_tick as u128) >> 32;
    if ns > u64::MAX as u128 {
        u64::MAX
    } else {
        ns as u64
    }
}

/// What a record stands for.
pub mod kind {
    /// A blocking collective.
    pub const COLL: u8 = 1;
    /// A point-to-point send, posted by the call it was entered in (a
    /// blocking send, a nonblocking one, a persistent one's start, the send
    /// half of a `Sendrecv`).
    pub const SEND: u8 = 2;
    /// A point-to-point receive, completed in the call it was entered in
    /// (a `Recv`, a `Sendrecv`, a `Mrecv`, or a call of the Wait or Test
    /// families).
    pub const RECV: u8 = 3;
    /// The end of a call's group of receives and completed sends
    /// ([`super::flag::MULTI`]): written after the last of them, with the
    /// call's thread and enter time, and in `seq` how many records the
    /// group has.
    pub const GROUP_END: u8 = 4;
    /// When a receive completed later in another call was posted: `enter`
    /// is the enter of the call that posted it (`MPI_Irecv`, or the
    /// `MPI_Start` of a persistent one); `peer`, `tag` and `seq` name its
    /// message as the [`RECV`] record written just after it does. Late
    /// Receiver measures the sender's wait up to this instant.
    pub const POSTED: u8 = 5;
    /// When a nonblocking send (an `MPI_Isend` and its modes, or a
    /// persistent one's `MPI_Start`) was completed, by a later call of the
    /// Wait or Test family: `enter` and `leave` are that call's, `function`
    /// it; `peer`, `tag` and `seq` name its message as the [`SEND`] record
    /// (flagged [`super::flag::LATER`]) written when it was posted. With
    /// [`super::flag::MULTI`] the call may complete several (`MPI_Waitall`,
    /// `MPI_Waitsome`) and the send is one of its group, with
    /// [`super::flag::TEST`] it waited for nothing (the Test family, or a
    /// request freed or never tracked). Late Receiver measures a wait in the
    /// completing call, as Scalasca does.
    pub const SENT: u8 = 6;
}

/// Bits of [`Plain::flags`].
pub mod flag {
    /// A receive completed by a call that may complete several
    /// (`MPI_Waitall`, `MPI_Waitsome`): the call's receives are one group,
    /// whose wait is the latest sender's (Scalasca's rule), known by the
    /// thread and the call's enter time they share.
    pub const MULTI: u8 = 1;
    /// A receive completed by the Test family: it matches its send, and
    /// counts no wait (Scalasca analyses only blocking completions).
    pub const TEST: u8 = 2;
    /// A send that completed in the call that posted it, a blocking
    /// `MPI_Send` or `MPI_Ssend` (Scalasca's blocking sends): `leave` is
    /// that call's leave, and Late Receiver applies.
    pub const BLOCKING: u8 = 4;
    /// A receive posted by the call it completed in (`MPI_Recv`,
    /// `MPI_Sendrecv(_replace)`, `MPI_Mrecv`): `enter` is also its post.
    pub const POSTED_HERE: u8 = 8;
    /// A nonblocking send whose completion the shim records: a
    /// [`super::kind::SENT`] record naming the same message follows.
    pub const LATER: u8 = 16;
    /// Every bit the shim writes.
    pub const KNOWN: u8 = MULTI | TEST | BLOCKING | POSTED_HERE | LATER;
}

/// The ring's header, one cache line.
#[repr(C)]
#[derive(Default)]
pub struct RingHeader {
    /// Records written so far: the next record's position.
    pub head: AtomicU64,
    /// The records' clock: one of [`clock`], set when the ring is made.
    pub clock: AtomicU64,
    /// With [`clock::TICKS`]: nanoseconds per tick in 32.32 fixed point, 0
    /// until the shim has measured it (its first 5 ms of timing).
    pub ns_per_tick: AtomicU64,
    /// log2 of the point-to-point sampling period plus one: the process
    /// records the sends and receives whose envelope sequence number is a
    /// multiple of `1 << (p2p_shift - 1)`; 0 when it records none.
    pub p2p_shift: AtomicU64,
    /// Sends and receives the shim did not record: sampled ones whose
    /// call's enter time was not on the ring's clock yet (the counter's
    /// first 5 ms) or that came after the process lost count of its
    /// messages, and every one of an envelope its table had no room for.
    pub skipped: AtomicU64,
    /// Zero.
    pub reserved: [AtomicU64; 3],
}

/// One record in shared memory, one cache line.
#[repr(C)]
#[derive(Default)]
pub struct Record {
    /// 0 while written; the record's position + 1 once it is whole.
    pub pos: AtomicU64,
    /// When the call was entered, in the ring's [`clock`].
    pub enter: AtomicU64,
    /// When it returned.
    pub leave: AtomicU64,
    /// The instance's sequence number on its communicator.
    pub seq: AtomicU64,
    /// The communicator's id ([`WORLD`]).
    pub comm: AtomicU64,
    /// [`Plain::meta`]: function, kind, flags and peer.
    pub meta: AtomicU64,
    /// [`Plain::envelope`]: the tag and the thread.
    pub envelope: AtomicU64,
    /// The message's bytes (point-to-point records).
    pub bytes: AtomicU64,
}

/// A record's contents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Plain {
    /// When the call was entered, in the ring's [`clock`].
    pub enter: u64,
    /// When it returned.
    pub leave: u64,
    /// The instance's sequence number on its communicator.
    pub seq: u64,
    /// The communicator's id.
    pub comm: u64,
    /// The function ID.
    pub function: u16,
    /// One of [`kind`].
    pub kind: u8,
    /// Bits of [`flag`].
    pub flags: u8,
    /// A world rank: a collective's root ([`NO_ROOT`] if it has none), a
    /// send's destination, a receive's source.
    pub peer: i32,
    /// A point-to-point message's tag.
    pub tag: i32,
    /// The thread that made the call, as a number the process gives it:
    /// with the enter time, it names a call's group of receives.
    pub thread: u32,
    /// A point-to-point message's bytes.
    pub bytes: u64,
}

impl Plain {
    /// The function, kind, flags and peer in one word.
    pub const fn meta(&self) -> u64 {
        self.function as u64
            | (self.kind as u64) << 16
            | (self.flags as u64) << 24
            | (self.peer as u32 as u64) << 32
    }

    /// The tag and the thread in one word.
    pub const fn envelope(&self) -> u64 {
        self.tag as u32 as u64 | (self.thread as u64) << 32
    }

    /// A record of these words (`meta` and `envelope` as [`Plain::meta`] and
    /// [`Plain::envelope`] make them).
    pub const fn from_words(words: [u64; 7]) -> Plain {
        let [enter, leave, seq, comm, meta, envelope, bytes] = words;
        Plain {
            enter,
            leave,
            seq,
            comm,
            function: meta as u16,
            kind: (meta >> 16) as u8,
            flags: (meta >> 24) as u8,
            peer: (meta >> 32) as u32 as i32,
            tag: envelope as u32 as i32,
            thread: (envelope >> 32) as u32,
            bytes,
        }
    }
}

/// Bytes of a ring of `slots` records, header included.
pub const fn ring_bytes(slots: u32) -> u64 {
    if slots == 0 {
        return 0;
    }
    (size_of::<RingHeader>() + size_of::<Record>() * slots as usize) as u64
}

/// Writes `r` as the ring's next record: the producer's side. `multi`: other
/// threads of the process may push at the same time (`MPI_THREAD_MULTIPLE`),
/// so the position is claimed with an atomic add; otherwise a plain load and
/// store, as the segment's counters do.
///
/// `records.len()` is a power of two.
#[inline(always)]
pub fn push(head: &RingHeader, records: &[Record], r: &Plain, multi: bool) {
    if records.is_empty() {
        return;
    }
    let p = if multi {
        head.head.fetch_add(1, Relaxed)
    } else {
        head.head.load(Relaxed)
    };
    let slot = &records[(p & (records.len() as u64 - 1)) as usize];
    slot.pos.store(0, Relaxed);
    // The reader that sees a field of this record also sees `pos` at 0.
    fence(Release);
    slot.enter.store(r.enter, Relaxed);
    slot.leave.store(r.leave, Relaxed);
    slot.seq.store(r.seq, Relaxed);
    slot.comm.store(r.comm, Relaxed);
    slot.meta.store(r.meta(), Relaxed);
    slot.envelope.store(r.envelope(), Relaxed);
    slot.bytes.store(r.bytes, Relaxed);
    slot.pos.store(p + 1, Release);
    if !multi {
        head.head.store(p + 1, Release);
    }
}

/// Word offsets of a [`Record`]'s fields, for [`drain`]'s loads.
const WORDS: u64 = (size_of::<Record>() / 8) as u64;

/// What one [`drain`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Records passed to the callback.
    pub read: u64,
    /// Records lost: overwritten before they were read, or while they were.
    pub lost: u64,
    /// The ring's [`RingHeader::clock`] as read.
    pub clock: u64,
    /// Its [`RingHeader::ns_per_tick`] as read.
    pub ns_per_tick: u64,
    /// Its [`RingHeader::p2p_shift`] as read.
    pub p2p_shift: u64,
    /// Its [`RingHeader::skipped`] as read: a running total.
    pub skipped: u64,
}

/// Reads the records written since `cursor`, the consumer's side, through
/// `word(i)`: an atomic load of the ring's `i`th 8-byte word, header first
/// (the daemon maps another process's ring, so it gives its own load). Moves
/// `cursor` on and counts every record it could not read. Stops at a record
/// still being written (another thread's, under `multi`): it is read next
/// time, or counted lost once it is overwritten.
///
/// Nothing the ring holds is trusted: a head more than a ring ahead counts
/// the gap lost; a head behind the cursor (a reset ring) starts over from it.
pub fn drain(
    word: impl Fn(u64) -> u64,
    slots: u32,
    cursor: &mut u64,
    mut f: impl FnMut(Plain),
) -> Drained {
    let mut out = Drained::default();
    if slots == 0 || !slots.is_power_of_two() {
        return out;
    }
    let head = word(0);
    fence(Acquire);
    out.clock = word(1);
    out.ns_per_tick = word(2);
    out.p2p_shift = word(3);
    out.skipped = word(4);
    if head < *cursor {
        *cursor = head;
        return out;
    }
    let n = u64::from(slots);
    if head - *cursor > n {
        out.lost += head - *cursor - n;
        *cursor = head - n;
    }
    let header = (size_of::<RingHeader>() / 8) as u64;
    while *cursor < head {
        let at = header + (*cursor & (n - 1)) * WORDS;
        let want = *cursor + 1;
        let pos = word(at);
        fence(Acquire);
        if pos == 0 || pos < want {
            // Not written yet (or being rewritten for a later lap, which
            // a later drain counts as a loss).
            break;
        }
        let r = Plain::from_words([
            word(at + 1),
            word(at + 2),
            word(at + 3),
            word(at + 4),
            word(at + 5),
            word(at + 6),
            word(at + 7),
        ]);
        fence(Acquire);
        if pos == want && word(at) == want {
            f(r);
            out.read += 1;
        } else {
            out.lost += 1;
        }
        *cursor += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{vec, vec::Vec};

    use super::*;

    struct Ring {
        head: RingHeader,
        records: Vec<Record>,
    }

    impl Ring {
        fn new(slots: usize) -> Ring {
            Ring {
                head: RingHeader::default(),
                records: (0..slots).map(|_| Record::default()).collect(),
            }
        }

        fn word(&self, i: u64) -> u64 {
            let header = (size_of::<RingHeader>() / 8) as u64;
            if i < header {
                return match i {
                    0 => self.head.head.load(Relaxed),
                    1 => self.head.clock.load(Relaxed),
                    2 => self.head.ns_per_tick.load(Relaxed),
                    3 => self.head.p2p_shift.load(Relaxed),
                    4 => self.head.skipped.load(Relaxed),
                    _ => 0,
                };
            }
            let r = &self.records[((i - header) / WORDS) as usize];
            match (i - header) % WORDS {
                0 => r.pos.load(Relaxed),
                1 => r.enter.load(Relaxed),
                2 => r.leave.load(Relaxed),
                3 => r.seq.load(Relaxed),
                4 => r.comm.load(Relaxed),
                5 => r.meta.load(Relaxed),
                6 => r.envelope.load(Relaxed),
                7 => r.bytes.load(Relaxed),
                _ => 0,
            }
        }

        fn drain(&self, cursor: &mut u64) -> (Vec<u64>, Drained) {
            let mut seqs = Vec::new();
            let d = drain(
                |i| self.word(i),
                self.records.len() as u32,
                cursor,
                |r| seqs.push(r.seq),
            );
            (seqs, d)
        }
    }

    fn rec(seq: u64) -> Plain {
        Plain {
            enter: 10 * seq,
            leave: 10 * seq + 5,
            seq,
            comm: WORLD,
            function: 7,
            kind: kind::COLL,
            peer: if seq.is_multiple_of(2) { NO_ROOT } else { 3 },
            ..Plain::default()
        }
    }

    #[test]
    fn layout_is_a_cache_line_each() {
        assert_eq!(size_of::<RingHeader>(), 64);
        assert_eq!(size_of::<Record>(), 64);
        assert_eq!(ring_bytes(8), 64 + 8 * 64);
        assert_eq!(ring_bytes(0), 0);
    }

    #[test]
    fn records_round_trip_in_order() {
        let ring = Ring::new(8);
        for s in 0..5 {
            push(&ring.head, &ring.records, &rec(s), false);
        }
        let mut c = 0;
        let mut got = Vec::new();
        ring.head.clock.store(clock::TICKS, Relaxed);
        ring.head.ns_per_tick.store(3 << 31, Relaxed);
        let d = drain(|i| ring.word(i), 8, &mut c, |r| got.push(r));
        assert_eq!(
            d,
            Drained {
                read: 5,
                lost: 0,
                clock: clock::TICKS,
                ns_per_tick: 3 << 31,
                p2p_shift: 0,
                skipped: 0,
            }
        );
        // 1.5 ns a tick.
        assert_eq!(ticks_to_ns(1000, d.ns_per_tick), 1500);
        assert_eq!(ticks_to_ns(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(got, (0..5).map(rec).collect::<Vec<_>>());
        assert_eq!(c, 5);
        // Nothing new, nothing read.
        let d = ring.drain(&mut c).1;
        assert_eq!((d.read, d.lost), (0, 0));
        for r in [
            Plain {
                peer: i32::MAX,
                function: u16::MAX,
                kind: u8::MAX,
                flags: u8::MAX,
                tag: i32::MIN,
                thread: u32::MAX,
                bytes: u64::MAX,
                ..rec(1)
            },
            Plain {
                peer: -1,
                tag: -1,
                kind: kind::RECV,
                flags: flag::MULTI,
                bytes: 8,
                ..rec(2)
            },
        ] {
            let words = [
                r.enter,
                r.leave,
                r.seq,
                r.comm,
                r.meta(),
                r.envelope(),
                r.bytes,
            ];
            assert_eq!(Plain::from_words(words), r);
            // And through the ring.
            push(&ring.head, &ring.records, &r, false);
            let mut back = Vec::new();
            ring.head.p2p_shift.store(4, Relaxed);
            ring.head.skipped.store(9, Relaxed);
            let d = drain(|i| ring.word(i), 8, &mut c, |r| back.push(r));
            assert_eq!((back, d.p2p_shift, d.skipped), (vec![r], 4, 9));
        }
    }

    #[test]
    fn a_lapped_reader_counts_every_record_it_lost() {
        let ring = Ring::new(8);
        let mut c = 0;
        for s in 0..3 {
            push(&ring.head, &ring.records, &rec(s), false);
        }
        assert_eq!(ring.drain(&mut c).0, vec![0, 1, 2]);
        // 20 more into 8 slots: the 12 oldest of them are gone.
        for s in 3..23 {
            push(&ring.head, &ring.records, &rec(s), false);
        }
        let (seqs, d) = ring.drain(&mut c);
        assert_eq!(seqs, (15..23).collect::<Vec<_>>());
        assert_eq!((d.read, d.lost), (8, 12));
        assert_eq!(c, 23);
    }

    #[test]
    fn a_record_being_written_is_read_later_and_a_torn_one_is_lost() {
        let ring = Ring::new(8);
        let mut c = 0;
        push(&ring.head, &ring.records, &rec(0), false);
        // A second thread has claimed position 1 and not finished.
        ring.head.head.store(2, Relaxed);
        ring.records[1].pos.store(0, Relaxed);
        let (seqs, d) = ring.drain(&mut c);
        assert_eq!((seqs, d.read, d.lost), (vec![0], 1, 0));
        assert_eq!(c, 1);
        // It finishes.
        ring.head.head.store(1, Relaxed);
        push(&ring.head, &ring.records, &rec(1), false);
        assert_eq!(ring.drain(&mut c).0, vec![1]);
        // A slot whose position is a later lap's: overwritten, lost.
        push(&ring.head, &ring.records, &rec(2), false);
        ring.records[2].pos.store(11, Relaxed);
        let d = ring.drain(&mut c).1;
        assert_eq!((d.read, d.lost), (0, 1));
    }

    #[test]
    fn hostile_heads_are_not_believed() {
        let ring = Ring::new(8);
        let mut c = 0;
        ring.head.head.store(u64::MAX, Relaxed);
        let (_, d) = ring.drain(&mut c);
        // Counted lost, never looped over.
        assert_eq!(d.lost, u64::MAX - 8);
        assert_eq!(d.read, 0);
        // A head that goes back: start over from it.
        ring.head.head.store(0, Relaxed);
        assert_eq!(ring.drain(&mut c).1, Drained::default());
        assert_eq!(c, 0);
        // Rings of a size the shim never makes are not read.
        let mut c2 = 0;
        assert_eq!(
            drain(|i| ring.word(i), 6, &mut c2, |_| panic!()),
            Drained::default()
        );
    }

    #[test]
    fn threads_pushing_together_lose_nothing_the_ring_holds() {
        extern crate std;
        let ring = Ring::new(1024);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let ring = &ring;
                s.spawn(move || {
                    for i in 0..200 {
                        push(&ring.head, &ring.records, &rec(t * 1000 + i), true);
                    }
                });
            }
        });
        let mut c = 0;
        let (mut seqs, d) = ring.drain(&mut c);
        assert_eq!((d.read, d.lost), (800, 0));
        seqs.sort_unstable();
        let want: Vec<u64> = (0..4)
            .flat_map(|t| (0..200).map(move |i| t * 1000 + i))
            .collect();
        assert_eq!(seqs, want);
    }
}
