//! x86-64's registers (`PTRACE_GETREGS`).

use std::io;

use super::super::InjectError;

/// The general registers (`PTRACE_GETREGS`).
pub(in super::super) type Regs = libc::user_regs_struct;

/// Where the thread executes.
pub(in super::super) fn pc(r: &Regs) -> u64 {
    r.rip
}

/// Its stack pointer.
pub(in super::super) fn sp(r: &Regs) -> u64 {
    r.rsp
}

/// Points it at `at`.
pub(in super::super) fn set_pc(r: &mut Regs, at: u64) {
    r.rip = at;
}

/// x86-64 has no IP0: the stub jumps back through its tail.
pub(in super::super) fn ip0(_: &Regs) -> u64 {
    0
}

/// Whether it stopped outside a system call (`orig_rax` is -1 then).
pub(in super::super) fn outside_syscall(r: &Regs) -> bool {
    r.orig_rax as i64 == -1
}

/// Reads `tid`'s registers; it must be stopped under our trace.
pub(in super::super) fn get(pid: u32, tid: u32) -> Result<Regs, InjectError> {
    // SAFETY: zeroed plain struct, filled by the kernel.
    let mut regs: Regs = unsafe { core::mem::zeroed() };
    // SAFETY: PTRACE_GETREGS into a user_regs_struct of a stopped tracee.
    let r = unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &mut regs) };
    if r != 0 {
        return Err(InjectError::Os {
            pid,
            what: "PTRACE_GETREGS",
            source: io::Error::last_os_error(),
        });
    }
    Ok(regs)
}

/// Writes `tid`'s registers; it must be stopped under our trace.
pub(in super::super) fn set(pid: u32, tid: u32, regs: &Regs) -> Result<(), InjectError> {
    // SAFETY: PTRACE_SETREGS from a user_regs_struct, tracee stopped.
    let r = unsafe { libc::ptrace(libc::PTRACE_SETREGS, tid, 0, regs) };
    if r != 0 {
        return Err(InjectError::Os {
            pid,
            what: "PTRACE_SETREGS",
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}
