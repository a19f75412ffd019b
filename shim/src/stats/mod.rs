//! The built-in `stats` layer (issue 4), and the extension point for layers
//! written in Rust inside the shim.
//!
//! A built-in layer is a [`Builtin`]: a name and a `resolve` function that
//! returns, for a dispatch-table row, the function the layer runs at its
//! level, or [`Raw::NONE`] to be skipped for that row. Rows are the C
//! procedures by `FunctionId as usize` (`0..FUNCTION_COUNT`), then the
//! Fortran symbol families of `generated::fortran::FORTRAN`.
//!
//! A layer function has the C signature of the procedure it stands for and
//! continues down the stack by calling [`next`]`(row)`: the next level that
//! defines the row, bound when the stack is built, as a tool's `PMPI_X` is
//! (crate::bind).
//!
//! The level's function for a row is its timing wrapper (`timed!`,
//! crate::timing, one per row in `generated/next.rs`), which calls the
//! layer's own wrapper of the row, or the next level for the rows the layer
//! only times ([`inner`]).
//!
//! The `stats` layer wraps point-to-point traffic ([`p2p`]), request
//! completion ([`complete`]) and collectives ([`coll`]), and writes its
//! figures to the process's shared-memory segment ([`segment`]) that
//! `mpi-observer attach` exports. Every other row is only timed.
//! docs/stats.md defines every figure.

use core::{
    ffi::c_void,
    sync::atomic::{AtomicPtr, Ordering},
};

use observer_common::FunctionId as F;

use crate::{rows::Raw, table::ROWS};

mod abi;
mod coll;
mod comms;
mod complete;
mod construct;
mod exit_handover;
pub(crate) mod lifecycle;
mod p2p;
mod requests;
pub(crate) mod segment;
pub(crate) mod trace;
mod waits;

/// A layer implemented inside the shim.
pub(crate) struct Builtin {
    /// The keyword that selects it in the tools list.
    pub(crate) name: &'static str,
    /// The layer's own wrapper of each row, [`Raw::NONE`] where it only
    /// times the call.
    pub(crate) wrappers: fn() -> Vec<Raw>,
}

/// The `stats` keyword's layer.
pub(crate) static LAYER: Builtin = Builtin {
    name: "stats",
    wrappers,
};

/// The next level below `stats` for each row, bound when the stack is built.
static NEXT: [AtomicPtr<c_void>; ROWS] = [const { AtomicPtr::new(core::ptr::null_mut()) }; ROWS];
/// What the timing wrapper of each row calls: the layer's own wrapper, or
/// [`NEXT`].
static INNER: [AtomicPtr<c_void>; ROWS] = [const { AtomicPtr::new(core::ptr::null_mut()) }; ROWS];

/// Binds row `row` of the layer to `next`, the next level that defines it,
/// with `own` the layer's wrapper of the row (or [`Raw::NONE`]). Called
/// while the stack is built, before any call reaches the layer.
pub(crate) fn bind(row: usize, own: Raw, next: Raw) {
    NEXT[row].store(next.0.cast_mut(), Ordering::Release);
    let inner = if own.is_none() { next } else { own };
    INNER[row].store(inner.0.cast_mut(), Ordering::Release);
}

/// The CPU counter's rate, nanoseconds per tick in 32.32 fixed point, once
/// [`crate::timing`] has measured it: the wait records' scale.
pub(crate) fn counter_rate(ns_per_tick: u64) {
    waits::counter_rate(ns_per_tick);
}

/// The next level below `stats` that defines `row`.
#[inline(always)]
pub(crate) fn next(row: usize) -> *const c_void {
    // SAFETY: `row` is a generated constant below ROWS.
    unsafe { NEXT.get_unchecked(row) }.load(Ordering::Acquire)
}

/// What the timing wrapper of `row` calls.
#[inline(always)]
pub(crate) fn inner(row: usize) -> *const c_void {
    // SAFETY: `row` is a generated constant below ROWS.
    unsafe { INNER.get_unchecked(row) }.load(Ordering::Acquire)
}

/// `(row, wrapper)` for a wrapper generic over its row: `w!(p2p::send, Send, false)`.
macro_rules! w {
    ($f:ident, $id:ident $(, $extra:expr)*) => {
        (F::$id as usize, Raw($f::<{ F::$id as usize } $(, $extra)*> as *const c_void))
    };
}

/// Every row the layer watches, with its wrapper.
fn wrapped() -> Vec<(usize, Raw)> {
    use self::{coll::*, complete::*, construct::*, p2p::*};
    vec![
        w!(init, Init),
        w!(init_thread, InitThread),
        w!(finalize, Finalize),
        w!(comm_free, CommFree),
        w!(comm_free, CommDisconnect),
        // Communicator constructors: name what they make (waits).
        w!(comm_dup, CommDup),
        w!(comm_dup_with_info, CommDupWithInfo),
        w!(comm_idup, CommIdup),
        w!(comm_idup_with_info, CommIdupWithInfo),
        w!(comm_split, CommSplit),
        w!(comm_split_type, CommSplitType),
        w!(comm_create, CommCreate),
        w!(comm_create_group, CommCreateGroup),
        w!(cart_create, CartCreate),
        w!(cart_sub, CartSub),
        w!(graph_create, GraphCreate),
        w!(dist_graph_create, DistGraphCreate),
        w!(dist_graph_create_adjacent, DistGraphCreateAdjacent),
        // Blocking sends.
        w!(send, Send, false),
        w!(send, SendC, true),
        w!(send, Bsend, false),
        w!(send, BsendC, true),
        w!(send, Ssend, false),
        w!(send, SsendC, true),
        w!(send, Rsend, false),
        w!(send, RsendC, true),
        // Nonblocking sends.
        w!(isend, Isend, false),
        w!(isend, IsendC, true),
        w!(isend, Ibsend, false),
        w!(isend, IbsendC, true),
        w!(isend, Issend, false),
        w!(isend, IssendC, true),
        w!(isend, Irsend, false),
        w!(isend, IrsendC, true),
        // Persistent sends.
        w!(send_init, SendInit, false),
        w!(send_init, SendInitC, true),
        w!(send_init, BsendInit, false),
        w!(send_init, BsendInitC, true),
        w!(send_init, SsendInit, false),
        w!(send_init, SsendInitC, true),
        w!(send_init, RsendInit, false),
        w!(send_init, RsendInitC, true),
        // Receives.
        w!(recv, Recv, false),
        w!(recv, RecvC, true),
        w!(irecv, Irecv, false, false),
        w!(irecv, IrecvC, true, false),
        w!(irecv, RecvInit, false, true),
        w!(irecv, RecvInitC, true, true),
        w!(sendrecv, Sendrecv, false),
        w!(sendrecv, SendrecvC, true),
        w!(sendrecv_replace, SendrecvReplace, false),
        w!(sendrecv_replace, SendrecvReplaceC, true),
        w!(isendrecv, Isendrecv, false),
        w!(isendrecv, IsendrecvC, true),
        w!(isendrecv_replace, IsendrecvReplace, false),
        w!(isendrecv_replace, IsendrecvReplaceC, true),
        // Matched probes.
        w!(mprobe, Mprobe),
        w!(improbe, Improbe),
        w!(mrecv, Mrecv, false),
        w!(mrecv, MrecvC, true),
        w!(imrecv, Imrecv, false),
        w!(imrecv, ImrecvC, true),
        // Completion.
        w!(wait, Wait),
        w!(test, Test),
        w!(waitall, Waitall),
        w!(testall, Testall),
        w!(waitany, Waitany),
        w!(testany, Testany),
        w!(some, Waitsome),
        w!(some, Testsome),
        w!(start, Start),
        w!(startall, Startall),
        w!(cancel, Cancel),
        w!(request_free, RequestFree),
        // Collectives, and their large-count forms.
        w!(barrier, Barrier, false),
        w!(ibarrier, Ibarrier, false),
        w!(bcast_, Bcast, false),
        w!(ibcast, Ibcast, false),
        w!(bcast_, BcastC, true),
        w!(ibcast, IbcastC, true),
        w!(reduce_, Reduce, false),
        w!(ireduce, Ireduce, false),
        w!(reduce_, ReduceC, true),
        w!(ireduce, IreduceC, true),
        w!(allreduce_, Allreduce, false),
        w!(iallreduce, Iallreduce, false),
        w!(allreduce_, AllreduceC, true),
        w!(iallreduce, IallreduceC, true),
        w!(gather_, Gather, false),
        w!(igather, Igather, false),
        w!(gather_, GatherC, true),
        w!(igather, IgatherC, true),
        w!(gatherv_, Gatherv, false),
        w!(igatherv, Igatherv, false),
        w!(gatherv_, GathervC, true),
        w!(igatherv, IgathervC, true),
        w!(scatter_, Scatter, false),
        w!(iscatter, Iscatter, false),
        w!(scatter_, ScatterC, true),
        w!(iscatter, IscatterC, true),
        w!(scatterv_, Scatterv, false),
        w!(iscatterv, Iscatterv, false),
        w!(scatterv_, ScattervC, true),
        w!(iscatterv, IscattervC, true),
        w!(allgather_, Allgather, false),
        w!(iallgather, Iallgather, false),
        w!(allgather_, AllgatherC, true),
        w!(iallgather, IallgatherC, true),
        w!(allgatherv_, Allgatherv, false),
        w!(iallgatherv, Iallgatherv, false),
        w!(allgatherv_, AllgathervC, true),
        w!(iallgatherv, IallgathervC, true),
        w!(alltoall_, Alltoall, false),
        w!(ialltoall, Ialltoall, false),
        w!(alltoall_, AlltoallC, true),
        w!(ialltoall, IalltoallC, true),
        w!(alltoallv_, Alltoallv, false),
        w!(ialltoallv, Ialltoallv, false),
        w!(alltoallv_, AlltoallvC, true),
        w!(ialltoallv, IalltoallvC, true),
        w!(alltoallw_, Alltoallw, false),
        w!(ialltoallw, Ialltoallw, false),
        w!(alltoallw_, AlltoallwC, true),
        w!(ialltoallw, IalltoallwC, true),
        w!(reduce_scatter_, ReduceScatter, false),
        w!(ireduce_scatter, IreduceScatter, false),
        w!(reduce_scatter_, ReduceScatterC, true),
        w!(ireduce_scatter, IreduceScatterC, true),
        w!(reduce_scatter_block_, ReduceScatterBlock, false),
        w!(ireduce_scatter_block, IreduceScatterBlock, false),
        w!(reduce_scatter_block_, ReduceScatterBlockC, true),
        w!(ireduce_scatter_block, IreduceScatterBlockC, true),
        w!(scan_, Scan, false),
        w!(iscan, Iscan, false),
        w!(scan_, ScanC, true),
        w!(iscan, IscanC, true),
        w!(exscan_, Exscan, false),
        w!(iexscan, Iexscan, false),
        w!(exscan_, ExscanC, true),
        w!(iexscan, IexscanC, true),
        // Persistent collectives (MPI 4), counted at each start.
        w!(barrier_init, BarrierInit, false),
        w!(bcast_init, BcastInit, false),
        w!(bcast_init, BcastInitC, true),
        w!(reduce_init, ReduceInit, false),
        w!(reduce_init, ReduceInitC, true),
        w!(allreduce_init, AllreduceInit, false),
        w!(allreduce_init, AllreduceInitC, true),
        w!(gather_init, GatherInit, false),
        w!(gather_init, GatherInitC, true),
        w!(gatherv_init, GathervInit, false),
        w!(gatherv_init, GathervInitC, true),
        w!(scatter_init, ScatterInit, false),
        w!(scatter_init, ScatterInitC, true),
        w!(scatterv_init, ScattervInit, false),
        w!(scatterv_init, ScattervInitC, true),
        w!(allgather_init, AllgatherInit, false),
        w!(allgather_init, AllgatherInitC, true),
        w!(allgatherv_init, AllgathervInit, false),
        w!(allgatherv_init, AllgathervInitC, true),
        w!(alltoall_init, AlltoallInit, false),
        w!(alltoall_init, AlltoallInitC, true),
        w!(alltoallv_init, AlltoallvInit, false),
        w!(alltoallv_init, AlltoallvInitC, true),
        w!(alltoallw_init, AlltoallwInit, false),
        w!(alltoallw_init, AlltoallwInitC, true),
        w!(reduce_scatter_init, ReduceScatterInit, false),
        w!(reduce_scatter_init, ReduceScatterInitC, true),
        w!(reduce_scatter_block_init, ReduceScatterBlockInit, false),
        w!(reduce_scatter_block_init, ReduceScatterBlockInitC, true),
        w!(scan_init, ScanInit, false),
        w!(scan_init, ScanInitC, true),
        w!(exscan_init, ExscanInit, false),
        w!(exscan_init, ExscanInitC, true),
    ]
}

/// The layer's own wrapper of each row, [`Raw::NONE`] for the rows it only
/// times. Called once, while the stack is built.
fn wrappers() -> Vec<Raw> {
    let mut v = vec![Raw::NONE; ROWS];
    for (row, f) in wrapped() {
        v[row] = f;
    }
    v
}
