//! AArch64: the AAPCS64 calling convention. Integer arguments in x0-x7, the
//! rest on the stack from sp upwards (8 bytes each for the machine words MPI
//! functions take); `bl` leaves the return address in x30 (the link
//! register), so the call site needs no read of user memory at the entry.
//! The kernel hands BPF programs of kprobe type a `user_pt_regs`: x0-x30,
//! sp, pc, pstate.

use aya_ebpf::{bindings::user_pt_regs, helpers::bpf_probe_read_user, programs::ProbeContext};

#[inline(always)]
fn regs(ctx: &ProbeContext) -> *const user_pt_regs {
    ctx.regs.cast::<user_pt_regs>().cast_const()
}

/// The argument at position `n` (0-based) as a machine word.
#[inline(always)]
pub fn word(ctx: &ProbeContext, n: u32) -> Option<u64> {
    let r = regs(ctx);
    // Each register is read at its constant offset, as the verifier
    // requires of context accesses.
    // SAFETY: `r` is the kernel's register block for this probe hit, valid
    // for the program's run; only read.
    let (a0, a1, a2, a3, a4, a5, a6, a7) = unsafe {
        (
            core::ptr::read_volatile(&(*r).regs[0]),
            core::ptr::read_volatile(&(*r).regs[1]),
            core::ptr::read_volatile(&(*r).regs[2]),
            core::ptr::read_volatile(&(*r).regs[3]),
            core::ptr::read_volatile(&(*r).regs[4]),
            core::ptr::read_volatile(&(*r).regs[5]),
            core::ptr::read_volatile(&(*r).regs[6]),
            core::ptr::read_volatile(&(*r).regs[7]),
        )
    };
    let v = match n {
        0 => a0,
        1 => a1,
        2 => a2,
        3 => a3,
        4 => a4,
        5 => a5,
        6 => a6,
        7 => a7,
        _ => {
            // The 9th argument is at sp, each further one 8 bytes up.
            // SAFETY: a field at its constant offset, as above.
            let sp = unsafe { core::ptr::read_volatile(&(*r).sp) };
            let addr = sp + 8 * (u64::from(n) - 8);
            // SAFETY: the helper checks the user address itself and fails
            // rather than faults on a bad one; any u64 is a valid value.
            return unsafe { bpf_probe_read_user(addr as *const u64) }.ok();
        }
    };
    Some(v)
}

/// The return address at a function's entry: the link register, x30.
#[inline(always)]
pub fn return_address(ctx: &ProbeContext) -> Option<u64> {
    // SAFETY: a field at a constant offset of the register block.
    Some(unsafe { core::ptr::read_volatile(&(*regs(ctx)).regs[30]) })
}

/// The probed address, at an entry probe.
#[inline(always)]
pub fn instruction_pointer(ctx: &ProbeContext) -> u64 {
    // SAFETY: a field at a constant offset of the register block.
    unsafe { core::ptr::read_volatile(&(*regs(ctx)).pc) }
}
