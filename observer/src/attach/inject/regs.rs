//! The stopped thread's registers, per instruction set: what the
//! injection reads (where the thread is, its stack, whether it is inside a
//! system call) and writes (where it resumes). x86-64 is implemented;
//! elsewhere (aarch64: issue 36) [`supported`] says no and the injection
//! refuses in one line before tracing anything.

use std::io;

use super::InjectError;

/// The instruction set the injection's stub is written for, if this
/// build has one.
pub(super) fn supported() -> bool {
    cfg!(target_arch = "x86_64")
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::*;

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
}

/// Without a stub for this instruction set: never reached, as
/// [`super::load_shim`] refuses first; each call says so if it were.
#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use super::*;

    /// No registers are read.
    #[derive(Clone, Copy)]
    pub(in super::super) struct Regs;

    pub(in super::super) fn pc(_: &Regs) -> u64 {
        0
    }

    pub(in super::super) fn sp(_: &Regs) -> u64 {
        0
    }

    pub(in super::super) fn set_pc(_: &mut Regs, _: u64) {}

    pub(in super::super) fn outside_syscall(_: &Regs) -> bool {
        false
    }

    pub(in super::super) fn get(pid: u32, _: u32) -> Result<Regs, InjectError> {
        Err(unsupported(pid))
    }

    pub(in super::super) fn set(pid: u32, _: u32, _: &Regs) -> Result<(), InjectError> {
        Err(unsupported(pid))
    }

    fn unsupported(pid: u32) -> InjectError {
        InjectError::Os {
            pid,
            what: "reading the stopped thread's registers",
            source: io::Error::from(io::ErrorKind::Unsupported),
        }
    }
}

pub(super) use imp::*;
