//! Collectives. The cookie marks their buffers as possibly `MPI_IN_PLACE`;
//! root-only arguments are never read because the probe cannot tell which
//! rank is root (see the README's byte conventions).

use aya_ebpf::{macros::uprobe, programs::ProbeContext};

use crate::calls;

/// Entry of a collective call.
#[uprobe]
pub fn mpi_coll_enter(ctx: ProbeContext) -> u32 {
    calls::enter(&ctx, true);
    0
}
