//! Byte accounting at call entry: count x datatype size for each data buffer
//! the cookie describes.

use aya_ebpf::programs::ProbeContext;
use observer_common::{
    cookie::{self, Part},
    functions::CountKind,
    maps::{Inflight, lib_kind},
    std_abi,
};

use crate::{PROCS, arch, datatype};

const OMPI_IN_PLACE: u64 = 1;
const MPICH_IN_PLACE: u64 = u64::MAX;

#[inline(always)]
pub fn account(ctx: &ProbeContext, cookie: u64, tgid: u32, e: &mut Inflight) {
    // SAFETY: a PROCS value (a preallocated map), whose memory the kernel
    // keeps for the program's run; the daemon removes a process's entry
    // only after every probe link of that process is closed.
    let Some(cfg) = (unsafe { PROCS.get(&tgid) }) else {
        return;
    };
    if cfg.bytes == 0 {
        return;
    }
    if let Some(p) = cookie::part(cookie, 0) {
        one(ctx, tgid, cfg, &p, e);
    }
    if let Some(p) = cookie::part(cookie, 1) {
        one(ctx, tgid, cfg, &p, e);
    }
}

#[inline(always)]
fn one(
    ctx: &ProbeContext,
    tgid: u32,
    cfg: &observer_common::maps::ProcConfig,
    p: &Part,
    e: &mut Inflight,
) {
    let dir = (p.direction & 1) as usize;
    let in_place = match cfg.lib {
        lib_kind::MPICH => MPICH_IN_PLACE,
        lib_kind::OPEN_MPI => OMPI_IN_PLACE,
        lib_kind::STD_ABI => std_abi::IN_PLACE,
        // Conventions we do not know: no figure can be trusted.
        _ => {
            e.unknown |= 1 << dir;
            return;
        }
    };
    // MPI_IN_PLACE: this buffer is not supplied, its count is ignored.
    if p.in_place_ok && arch::word(ctx, p.buf) == Some(in_place) {
        return;
    }
    if p.kind == CountKind::Unknowable as u32 {
        e.unknown |= 1 << dir;
        return;
    }
    let Some(raw) = arch::word(ctx, p.count) else {
        e.unknown |= 1 << dir;
        return;
    };
    let count = if p.kind == CountKind::Count64 as u32 {
        raw as i64
    } else {
        i64::from(raw as i32)
    };
    if count <= 0 {
        if count < 0 {
            e.unknown |= 1 << dir;
        }
        return;
    }
    let size = arch::word(ctx, p.datatype).and_then(|dt| datatype::size(tgid, cfg, dt));
    match size {
        Some(s) => e.bytes[dir] += count as u64 * s,
        None => e.unknown |= 1 << dir,
    }
}
