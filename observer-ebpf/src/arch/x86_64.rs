//! x86-64: the System V calling convention. Arguments in rdi, rsi, rdx, rcx,
//! r8, r9, then on the stack above the return address, which `call` pushed:
//! at the entry, before the first instruction, rsp points at it.

use aya_ebpf::{helpers::bpf_probe_read_user, programs::ProbeContext};

/// The argument at position `n` (0-based) as a machine word.
#[inline(always)]
pub fn word(ctx: &ProbeContext, n: u32) -> Option<u64> {
    // The verifier forbids loads from a context pointer plus a variable
    // offset, so read every register field at its constant offset first.
    // SAFETY: `regs` is the kernel's pt_regs for this probe hit, valid and
    // unchanged for the program's run; it is only read.
    let regs = unsafe { &*ctx.regs };
    // SAFETY: reads of fields of a valid reference; volatile so each load
    // stays at its constant offset, as the verifier requires.
    let (a0, a1, a2, a3, a4, a5) = unsafe {
        (
            core::ptr::read_volatile(&regs.rdi),
            core::ptr::read_volatile(&regs.rsi),
            core::ptr::read_volatile(&regs.rdx),
            core::ptr::read_volatile(&regs.rcx),
            core::ptr::read_volatile(&regs.r8),
            core::ptr::read_volatile(&regs.r9),
        )
    };
    let v = match n {
        0 => a0,
        1 => a1,
        2 => a2,
        3 => a3,
        4 => a4,
        5 => a5,
        _ => {
            // The 7th argument sits just above the return address.
            // SAFETY: a field of a valid reference, read at its constant
            // offset as above.
            let rsp = unsafe { core::ptr::read_volatile(&regs.rsp) };
            let addr = rsp + 8 * (u64::from(n) - 5);
            // SAFETY: the helper checks the user address itself and fails
            // rather than faults on a bad one; any u64 is a valid value.
            return unsafe { bpf_probe_read_user(addr as *const u64) }.ok();
        }
    };
    Some(v as u64)
}

/// The return address at a function's entry: one read of user memory, at
/// rsp. `None` if that read failed.
#[inline(always)]
pub fn return_address(ctx: &ProbeContext) -> Option<u64> {
    // SAFETY: `regs` is the kernel's pt_regs for this probe hit, read at a
    // constant offset as the verifier requires.
    let rsp = unsafe { core::ptr::read_volatile(&(*ctx.regs).rsp) };
    // SAFETY: the helper checks the user address itself and fails rather
    // than faults on a bad one; any u64 is a valid value.
    unsafe { bpf_probe_read_user(rsp as *const u64) }.ok()
}

/// The probed address, at an entry probe.
#[inline(always)]
pub fn instruction_pointer(ctx: &ProbeContext) -> u64 {
    // SAFETY: as in `return_address`, a field at a constant offset.
    unsafe { core::ptr::read_volatile(&(*ctx.regs).rip) }
}
