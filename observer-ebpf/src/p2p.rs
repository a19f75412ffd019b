//! Point-to-point calls: sends, receives, Sendrecv, matched receives. Their
//! byte figure is count x datatype size of the buffer argument(s).

use aya_ebpf::{macros::uprobe, programs::ProbeContext};

use crate::calls;

/// Entry of a point-to-point call.
#[uprobe]
pub fn mpi_p2p_enter(ctx: ProbeContext) -> u32 {
    calls::enter(&ctx, true);
    0
}
