//! The stopped thread's registers, per instruction set, one file each with
//! the same items: what the injection reads (where the thread is, its
//! stack, whether it is inside a system call, aarch64's x16) and writes
//! (where it resumes). x86-64 and aarch64 are implemented; elsewhere
//! [`supported`] says no and the injection refuses in one line before
//! tracing anything.

/// Whether this build injects: where it has a stub and registers for the
/// instruction set (x86-64 and aarch64; docs/inject.md).
pub(super) fn supported() -> bool {
    cfg!(any(target_arch = "x86_64", target_arch = "aarch64"))
}

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "aarch64")]
use aarch64 as imp;
#[cfg(target_arch = "x86_64")]
use x86_64 as imp;

/// Without a stub for this instruction set: never reached, as
/// [`super::load_shim`] refuses first; each call says so if it were.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod imp {
    use std::io;

    use super::super::InjectError;

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

    pub(in super::super) fn ip0(_: &Regs) -> u64 {
        0
    }

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
