//! Reading the n-th integer argument of the probed function at its entry,
//! including the ones the x86-64 calling convention passes on the stack.

use aya_ebpf::programs::ProbeContext;

/// The argument at position `n` (0-based) as a machine word.
#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
pub fn word(ctx: &ProbeContext, n: u32) -> Option<u64> {
    use aya_ebpf::helpers::bpf_probe_read_user;
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
            // At function entry rsp points at the return address; the 7th
            // argument sits just above it.
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

/// Arguments are only decoded on x86-64 so far; elsewhere callers count the
/// bytes as unknown rather than guess.
#[cfg(not(bpf_target_arch = "x86_64"))]
#[inline(always)]
pub fn word(_ctx: &ProbeContext, _n: u32) -> Option<u64> {
    None
}
