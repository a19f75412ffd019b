//! Wait-state records (issue 37, docs/waits.md): for each sampled blocking
//! collective on `MPI_COMM_WORLD`, when this rank entered and left it, under
//! the instance's sequence number, into the segment's wait ring
//! (`observer_common::waits`). The node daemon matches the records of one
//! instance across the job's ranks and computes who waited for whom.
//!
//! **The sequence number needs no communication.** MPI requires every
//! member of a communicator to call its collectives in the same order, and
//! a blocking collective matches only a blocking one, so the n-th blocking
//! collective this rank makes on `MPI_COMM_WORLD` is the n-th of every
//! other rank of the job. Nonblocking and persistent collectives are not
//! numbered (they never match a blocking one). Only calls that reach the
//! `stats` level count, and every rank runs the same stack, so the numbers
//! agree. A shim injected into a running process keeps no records: its
//! numbers would start where it was injected.
//!
//! **Sampling.** With `MPI_OBSERVER_WAITS=N` (a power of two) a rank keeps
//! the instances whose number is a multiple of N: the same instances on
//! every rank, with no coordination.
//!
//! **The clock** is the CPU's counter where the kernel keeps time with it
//! (`crate::timing` decides, and measures its rate in the process's first
//! 5 ms of timing; the first record after that puts the rate in the ring's
//! header), else `CLOCK_MONOTONIC`: either is one clock for the node.
//!
//! **Cost.** A handle compare and a counter per collective; for a sampled
//! one, two reads of the counter (about 13 ns each on the AMD VM of
//! BENCHMARKS.md, against 32 for the vDSO's `clock_gettime`) and one
//! 64-byte record. A collective costs microseconds.

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use observer_common::waits::{self, Plain};

use super::segment::state;

/// Blocking collectives this process has made on `MPI_COMM_WORLD`: the next
/// one's sequence number.
static WORLD_SEQ: AtomicU64 = AtomicU64::new(0);

/// The counter's rate (ns per tick, 32.32) once measured; 0 before.
static RATE: AtomicU64 = AtomicU64::new(0);

/// Records the counter's rate; the next record copies it into the ring.
pub(crate) fn counter_rate(ns_per_tick: u64) {
    RATE.store(ns_per_tick, Relaxed);
}

/// A sampled instance in progress.
pub(crate) struct Open {
    seq: u64,
    enter: u64,
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

/// A blocking collective on `comm` (the handle's word) is about to enter
/// the level below: numbers it if `comm` is `MPI_COMM_WORLD`, and returns
/// the instance if it is sampled.
#[inline(always)]
pub(crate) fn enter(comm: usize) -> Option<Open> {
    let s = state()?;
    if s.wait_records.is_empty() || s.abi.handle(comm) != s.abi.comm_world {
        return None;
    }
    let seq = if s.multi {
        WORLD_SEQ.fetch_add(1, Relaxed)
    } else {
        let v = WORLD_SEQ.load(Relaxed);
        WORLD_SEQ.store(v + 1, Relaxed);
        v
    };
    (seq & s.wait_mask == 0).then(|| Open {
        seq,
        enter: now(s.wait_ticks),
    })
}

/// The collective `function` of [`enter`] returned success: records it,
/// with `root` (a world rank, or `waits::NO_ROOT`).
#[inline(always)]
pub(crate) fn leave(open: Option<Open>, function: usize, root: i32) {
    let (Some(o), Some(s)) = (open, state()) else {
        return;
    };
    let leave = now(s.wait_ticks);
    if s.wait_ticks && s.wait_head.ns_per_tick.load(Relaxed) == 0 {
        let rate = RATE.load(Relaxed);
        if rate != 0 {
            s.wait_head.ns_per_tick.store(rate, Relaxed);
        }
    }
    let r = Plain {
        enter: o.enter,
        leave,
        seq: o.seq,
        comm: waits::WORLD,
        function: function as u16,
        kind: waits::kind::COLL,
        root,
    };
    waits::push(s.wait_head, s.wait_records, &r, s.multi);
}
