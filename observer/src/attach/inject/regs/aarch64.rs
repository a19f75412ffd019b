//! aarch64's registers (`PTRACE_GETREGSET`): the general registers
//! (`NT_PRSTATUS`: x0–x30, sp, pc, pstate) and the system call the thread
//! is in (`NT_ARM_SYSTEM_CALL`), which the kernel sets to -1
//! (`NO_SYSCALL`) on every entry from user mode that is not a system call,
//! a uprobe's breakpoint included.

use std::io;

use super::super::InjectError;

/// `NT_ARM_SYSTEM_CALL` (the kernel's `elf.h`): the regset of the system
/// call number.
const NT_ARM_SYSTEM_CALL: libc::c_int = 0x404;
/// PSTATE.BTYPE, bits 11:10: the branch type the next instruction is
/// checked against where pages are guarded for BTI.
const BTYPE: u64 = 0b11 << 10;

/// The stopped thread's registers.
#[derive(Clone, Copy)]
pub(in super::super) struct Regs {
    gp: libc::user_regs_struct,
    /// The system call it is in, -1 for none.
    syscall: i32,
}

/// Where the thread executes.
pub(in super::super) fn pc(r: &Regs) -> u64 {
    r.gp.pc
}

/// Its stack pointer.
pub(in super::super) fn sp(r: &Regs) -> u64 {
    r.gp.sp
}

/// Points it at `at`, as if it had not branched (BTYPE 0).
pub(in super::super) fn set_pc(r: &mut Regs, at: u64) {
    r.gp.pc = at;
    r.gp.pstate &= !BTYPE;
}

/// x16 (IP0), which the stub's way back restores from its tail.
pub(in super::super) fn ip0(r: &Regs) -> u64 {
    r.gp.regs[16]
}

/// Whether it stopped outside a system call.
pub(in super::super) fn outside_syscall(r: &Regs) -> bool {
    r.syscall == -1
}

/// `PTRACE_GETREGSET` or `SETREGSET` of regset `kind` into or from `len`
/// bytes at `buf`; the kernel must transfer all of them.
fn regset(
    pid: u32,
    tid: u32,
    request: libc::c_uint,
    kind: libc::c_int,
    buf: *mut libc::c_void,
    len: usize,
) -> Result<(), InjectError> {
    let what = if request == libc::PTRACE_GETREGSET {
        "PTRACE_GETREGSET"
    } else {
        "PTRACE_SETREGSET"
    };
    let mut iov = libc::iovec {
        iov_base: buf,
        iov_len: len,
    };
    // SAFETY: `buf` holds `len` bytes; the tracee is stopped under our
    // trace; the kernel writes at most `iov_len` bytes and updates it.
    let r = unsafe {
        libc::ptrace(
            request,
            tid as libc::pid_t,
            kind as usize as *mut libc::c_void,
            &mut iov as *mut libc::iovec,
        )
    };
    if r != 0 {
        return Err(InjectError::Os {
            pid,
            what,
            source: io::Error::last_os_error(),
        });
    }
    if iov.iov_len != len {
        return Err(InjectError::Os {
            pid,
            what,
            source: io::Error::other(format!(
                "regset {kind:#x}: {} bytes where {len} were expected",
                iov.iov_len
            )),
        });
    }
    Ok(())
}

/// Reads `tid`'s registers; it must be stopped under our trace.
pub(in super::super) fn get(pid: u32, tid: u32) -> Result<Regs, InjectError> {
    // SAFETY: zeroed plain struct, filled by the kernel.
    let mut gp: libc::user_regs_struct = unsafe { core::mem::zeroed() };
    regset(
        pid,
        tid,
        libc::PTRACE_GETREGSET,
        libc::NT_PRSTATUS,
        (&raw mut gp).cast(),
        size_of::<libc::user_regs_struct>(),
    )?;
    let mut syscall: i32 = 0;
    regset(
        pid,
        tid,
        libc::PTRACE_GETREGSET,
        NT_ARM_SYSTEM_CALL,
        (&raw mut syscall).cast(),
        size_of::<i32>(),
    )?;
    Ok(Regs { gp, syscall })
}

/// Writes `tid`'s general registers (never its system call number); it
/// must be stopped under our trace.
pub(in super::super) fn set(pid: u32, tid: u32, regs: &Regs) -> Result<(), InjectError> {
    let mut gp = regs.gp;
    regset(
        pid,
        tid,
        libc::PTRACE_SETREGSET,
        libc::NT_PRSTATUS,
        (&raw mut gp).cast(),
        size_of::<libc::user_regs_struct>(),
    )
}
