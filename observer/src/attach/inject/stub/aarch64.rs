//! The aarch64 stub (its steps: the parent module's docs).
//!
//! - **What it keeps.** x0–x30, the condition flags (NZCV), FPCR, FPSR and
//!   q0–q31 (every SIMD and floating-point register, whole), on the
//!   thread's stack below [`STACK_RESERVED`]. AAPCS64 lets a call clobber
//!   the rest: the upper bits of SVE's Z registers, its P registers and
//!   FFR, which the kernel also discards at every system call.
//! - **The way back without a register.** Every register must hold its old
//!   value when the interrupted code resumes, and an indirect branch needs
//!   one. So the stub loads x16 (IP0) last, from its tail, with a
//!   PC-relative literal load (which needs no base register), and returns
//!   with a direct `b` to the interrupted instruction, which the daemon
//!   encodes for where it put the code ([`link`]): it reaches 128 MiB either
//!   way, and a placement out of reach is refused before anything is
//!   written. A direct branch also sets no branch type, so it may land
//!   anywhere in a library whose pages are guarded for BTI (Debian builds
//!   arm64 with `-mbranch-protection=standard`); an indirect one there would
//!   fault.
//! - **Its own entry** is reached by setting `pc` (the daemon also clears
//!   PSTATE.BTYPE), and starts with `bti jc` all the same, a no-op
//!   everywhere else.
//! - **Memory order.** The stub's last store to the mailbox (state DONE)
//!   is a store-release, so the daemon, which reads that state first, then
//!   sees every store before it.
//! - **The instruction cache.** The daemon writes the code through
//!   `/proc/PID/mem` into an executable mapping; the kernel's
//!   `copy_to_user_page` then cleans the data cache and invalidates the
//!   instruction cache for the range (`flush_ptrace_access` for a `VM_EXEC`
//!   mapping), and the thread resumes through an exception return, which is
//!   context-synchronising. Nothing is left for the stub to flush.

use observer_common::inject::Mailbox;

use super::{Data, STACK_RESERVED, Tail};

// The reserve is subtracted in two steps: an immediate holds 12 bits.
const _: () = assert!(STACK_RESERVED == 4096 + 128);

core::arch::global_asm!(
    ".pushsection .rodata.mpi_observer_stub,\"a\",%progbits",
    ".p2align 4",
    ".globl mpi_observer_stub_code",
    ".hidden mpi_observer_stub_code",
    "mpi_observer_stub_code:",
    // bti jc: a landing pad for any branch type.
    "hint #38",
    "sub sp, sp, #4096",
    "sub sp, sp, #128",
    "stp x0, x1, [sp, #-16]!",
    "stp x2, x3, [sp, #-16]!",
    "stp x4, x5, [sp, #-16]!",
    "stp x6, x7, [sp, #-16]!",
    "stp x8, x9, [sp, #-16]!",
    "stp x10, x11, [sp, #-16]!",
    "stp x12, x13, [sp, #-16]!",
    "stp x14, x15, [sp, #-16]!",
    "stp x16, x17, [sp, #-16]!",
    "stp x18, x19, [sp, #-16]!",
    "stp x20, x21, [sp, #-16]!",
    "stp x22, x23, [sp, #-16]!",
    "stp x24, x25, [sp, #-16]!",
    "stp x26, x27, [sp, #-16]!",
    "stp x28, x29, [sp, #-16]!",
    "mrs x0, nzcv",
    "stp x30, x0, [sp, #-16]!",
    "mrs x0, fpcr",
    "mrs x1, fpsr",
    "stp x0, x1, [sp, #-16]!",
    "stp q0, q1, [sp, #-32]!",
    "stp q2, q3, [sp, #-32]!",
    "stp q4, q5, [sp, #-32]!",
    "stp q6, q7, [sp, #-32]!",
    "stp q8, q9, [sp, #-32]!",
    "stp q10, q11, [sp, #-32]!",
    "stp q12, q13, [sp, #-32]!",
    "stp q14, q15, [sp, #-32]!",
    "stp q16, q17, [sp, #-32]!",
    "stp q18, q19, [sp, #-32]!",
    "stp q20, q21, [sp, #-32]!",
    "stp q22, q23, [sp, #-32]!",
    "stp q24, q25, [sp, #-32]!",
    "stp q26, q27, [sp, #-32]!",
    "stp q28, q29, [sp, #-32]!",
    "stp q30, q31, [sp, #-32]!",
    // x19 is callee-saved: it holds the data block across the calls.
    "adr x19, mpi_observer_stub_tail",
    "ldr x19, [x19]",
    "mov w0, #{loading}",
    "str w0, [x19, #{state}]",
    "ldr x0, [x19, #{path}]",
    "ldr w1, [x19, #{flags}]",
    "ldr x16, [x19, #{dlopen}]",
    "blr x16",
    "cbz x0, 2f",
    "add x1, x19, #{entry}",
    "ldr x16, [x19, #{dlsym}]",
    "blr x16",
    "cbz x0, 2f",
    "mov x16, x0",
    "mov x0, x19",
    "blr x16",
    "b 3f",
    "2:",
    "ldr x16, [x19, #{dlerror}]",
    "blr x16",
    "str x0, [x19, #{error}]",
    "mov w0, #{load_failed}",
    "str w0, [x19, #{state}]",
    "3:",
    "ldr w0, [x19, #{state}]",
    "str w0, [x19, #{outcome}]",
    // The last store to the block before the registers come back; the
    // code below reads only the tail, which only the daemon writes.
    "mov w0, #{done}",
    "add x1, x19, #{state}",
    "stlr w0, [x1]",
    "ldp q30, q31, [sp], #32",
    "ldp q28, q29, [sp], #32",
    "ldp q26, q27, [sp], #32",
    "ldp q24, q25, [sp], #32",
    "ldp q22, q23, [sp], #32",
    "ldp q20, q21, [sp], #32",
    "ldp q18, q19, [sp], #32",
    "ldp q16, q17, [sp], #32",
    "ldp q14, q15, [sp], #32",
    "ldp q12, q13, [sp], #32",
    "ldp q10, q11, [sp], #32",
    "ldp q8, q9, [sp], #32",
    "ldp q6, q7, [sp], #32",
    "ldp q4, q5, [sp], #32",
    "ldp q2, q3, [sp], #32",
    "ldp q0, q1, [sp], #32",
    "ldp x0, x1, [sp], #16",
    "msr fpcr, x0",
    "msr fpsr, x1",
    "ldp x30, x0, [sp], #16",
    "msr nzcv, x0",
    "ldp x28, x29, [sp], #16",
    "ldp x26, x27, [sp], #16",
    "ldp x24, x25, [sp], #16",
    "ldp x22, x23, [sp], #16",
    "ldp x20, x21, [sp], #16",
    "ldp x18, x19, [sp], #16",
    "ldp x16, x17, [sp], #16",
    "ldp x14, x15, [sp], #16",
    "ldp x12, x13, [sp], #16",
    "ldp x10, x11, [sp], #16",
    "ldp x8, x9, [sp], #16",
    "ldp x6, x7, [sp], #16",
    "ldp x4, x5, [sp], #16",
    "ldp x2, x3, [sp], #16",
    "ldp x0, x1, [sp], #16",
    // add, not adds: the flags are restored.
    "add sp, sp, #128",
    "add sp, sp, #4096",
    "ldr x16, mpi_observer_stub_tail + {ip0}",
    ".globl mpi_observer_stub_back",
    ".hidden mpi_observer_stub_back",
    "mpi_observer_stub_back:",
    // Encoded by the daemon: b <the interrupted instruction>.
    "b .",
    ".p2align 3",
    ".globl mpi_observer_stub_tail",
    ".hidden mpi_observer_stub_tail",
    "mpi_observer_stub_tail:",
    ".popsection",
    state = const core::mem::offset_of!(Mailbox, state),
    path = const core::mem::offset_of!(Mailbox, path),
    flags = const core::mem::offset_of!(Mailbox, dlopen_flags),
    error = const core::mem::offset_of!(Mailbox, error),
    outcome = const core::mem::offset_of!(Mailbox, outcome),
    dlopen = const core::mem::offset_of!(Data, dlopen),
    dlsym = const core::mem::offset_of!(Data, dlsym),
    dlerror = const core::mem::offset_of!(Data, dlerror),
    ip0 = const core::mem::offset_of!(Tail, ip0),
    entry = const core::mem::offset_of!(Data, entry),
    loading = const observer_common::inject::state::LOADING,
    load_failed = const observer_common::inject::state::LOAD_FAILED,
    done = const observer_common::inject::state::DONE,
);

unsafe extern "C" {
    static mpi_observer_stub_back: [u8; 0];
}

/// Where the branch back is, in the code.
fn back_offset() -> usize {
    // SAFETY: both labels are in the section above, the code's first.
    unsafe {
        let start = (&raw const super::mpi_observer_stub_code).cast::<u8>();
        let back = (&raw const mpi_observer_stub_back).cast::<u8>();
        back.offset_from(start) as usize
    }
}

/// `b` to `to` from an instruction at `from`, if it reaches.
fn branch(from: u64, to: u64) -> Option<u32> {
    let delta = (to as i64).wrapping_sub(from as i64);
    if delta % 4 != 0 || !(-(1i64 << 27)..(1i64 << 27)).contains(&delta) {
        return None;
    }
    Some(0x1400_0000 | ((delta >> 2) as u32 & 0x03ff_ffff))
}

/// Encodes the branch back in `code` (a copy of [`code`]) for code placed
/// at `code_at` and a thread stopped at `resume`; false if it cannot reach.
pub(super) fn link(code: &mut [u8], code_at: u64, resume: u64) -> bool {
    let at = back_offset();
    let Some(insn) = branch(code_at + at as u64, resume) else {
        return false;
    };
    match code.get_mut(at..at + 4) {
        Some(slot) => {
            slot.copy_from_slice(&insn.to_le_bytes());
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_branch_back_reaches_128_mib_either_way_and_no_further() {
        // b . is 0x14000000; one instruction on, 0x14000001; one back,
        // imm26 all ones.
        assert_eq!(branch(0x1000, 0x1000), Some(0x1400_0000));
        assert_eq!(branch(0x1000, 0x1004), Some(0x1400_0001));
        assert_eq!(branch(0x1004, 0x1000), Some(0x17ff_ffff));
        let base = 0x7f00_0000_0000u64;
        assert!(branch(base, base + (1 << 27) - 4).is_some());
        assert!(branch(base, base + (1 << 27)).is_none());
        assert!(branch(base, base - (1 << 27)).is_some());
        assert!(branch(base, base - (1 << 27) - 4).is_none());
        assert!(branch(base, base + 2).is_none());
        // The placeholder is `b .`, and link writes the branch there.
        let mut c = super::super::code().to_vec();
        let at = back_offset();
        assert_eq!(&c[at..at + 4], &0x1400_0000u32.to_le_bytes());
        assert!(link(&mut c, base, base + at as u64 + 8));
        assert_eq!(&c[at..at + 4], &0x1400_0002u32.to_le_bytes());
        assert!(!link(&mut c, base, base + (1 << 30)));
    }
}
