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
//! continues down the stack by calling the shim's own `PMPI_X` (for example
//! `crate::generated::c::PMPI_Send`), exactly as a PMPI tool does; the shim
//! sets the depth before calling it, so nothing else is needed.
//!
//! The `stats` layer wraps point-to-point traffic ([`p2p`]), request
//! completion ([`complete`]) and collectives ([`coll`]), and writes its
//! figures to the process's shared-memory segment ([`segment`]) that
//! `mpi-observer attach` exports. Every other C row is a pass-through: the
//! shim's own `PMPI_X`, which continues at the next level. docs/stats.md
//! defines every figure.

use core::ffi::c_void;

use observer_common::FunctionId as F;

use crate::{generated::c::PMPI_SELF, table::Raw};

mod abi;
mod coll;
mod comms;
mod complete;
mod p2p;
mod requests;
mod segment;

/// A layer implemented inside the shim.
pub(crate) struct Builtin {
    /// The keyword that selects it in the tools list.
    pub(crate) name: &'static str,
    /// The function this layer runs for a row, or [`Raw::NONE`].
    pub(crate) resolve: fn(usize) -> Raw,
}

/// The `stats` keyword's layer.
pub(crate) static LAYER: Builtin = Builtin {
    name: "stats",
    resolve,
};

/// Continue at the next level for every C procedure; skip Fortran rows (the
/// Fortran layer turns them into C calls, which this layer then sees).
pub(crate) fn pass_through(row: usize) -> Raw {
    PMPI_SELF.get(row).copied().unwrap_or(Raw::NONE)
}

/// `(row, wrapper)` for a wrapper generic over its row: `w!(p2p::send, Send, false)`.
macro_rules! w {
    ($f:ident, $id:ident $(, $extra:expr)*) => {
        (F::$id as usize, Raw($f::<{ F::$id as usize } $(, $extra)*> as *const c_void))
    };
}

/// Every row the layer watches, with its wrapper.
fn wrapped() -> Vec<(usize, Raw)> {
    use self::{coll::*, complete::*, p2p::*};
    vec![
        w!(init, Init),
        w!(init_thread, InitThread),
        w!(finalize, Finalize),
        w!(comm_free, CommFree),
        w!(comm_free, CommDisconnect),
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
        // Collectives.
        w!(barrier, Barrier),
        w!(ibarrier, Ibarrier),
        w!(bcast_, Bcast),
        w!(ibcast, Ibcast),
        w!(reduce_, Reduce),
        w!(ireduce, Ireduce),
        w!(allreduce_, Allreduce),
        w!(iallreduce, Iallreduce),
        w!(gather_, Gather),
        w!(igather, Igather),
        w!(gatherv_, Gatherv),
        w!(igatherv, Igatherv),
        w!(scatter_, Scatter),
        w!(iscatter, Iscatter),
        w!(scatterv_, Scatterv),
        w!(iscatterv, Iscatterv),
        w!(allgather_, Allgather),
        w!(iallgather, Iallgather),
        w!(allgatherv_, Allgatherv),
        w!(iallgatherv, Iallgatherv),
        w!(alltoall_, Alltoall),
        w!(ialltoall, Ialltoall),
        w!(alltoallv_, Alltoallv),
        w!(ialltoallv, Ialltoallv),
        w!(alltoallw_, Alltoallw),
        w!(ialltoallw, Ialltoallw),
        w!(reduce_scatter_, ReduceScatter),
        w!(ireduce_scatter, IreduceScatter),
        w!(reduce_scatter_block_, ReduceScatterBlock),
        w!(ireduce_scatter_block, IreduceScatterBlock),
        w!(scan_, Scan),
        w!(iscan, Iscan),
        w!(exscan_, Exscan),
        w!(iexscan, Iexscan),
    ]
}

/// The layer's function for `row`: its wrapper, or a pass-through. Called
/// once per row while the stack is built.
fn resolve(row: usize) -> Raw {
    wrapped()
        .into_iter()
        .find(|&(r, _)| r == row)
        .map_or_else(|| pass_through(row), |(_, f)| f)
}
