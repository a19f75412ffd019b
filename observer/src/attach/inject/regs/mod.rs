//! The stopped thread's registers, per instruction set, one file each with
//! the same items: what the injection reads (where the thread is, its
//! stack, whether it is inside a system call, aarch64's x16) and writes
//! (where it resumes). x86-64 and aarch64 are implemented; elsewhere
//! [`supported`] says no and the injection refuses in one line before
//! tracing anything.

/// Opts in to `attach --inject` on aarch64 (docs/inject.md, "On
/// aarch64"): `1` in the daemon's environment.
pub const EXPERIMENTAL_AARCH64: &str = "MPI_OBSERVER_INJECT_AARCH64";

/// Whether this build injects: x86-64 always; aarch64 only when the
/// daemon's environment opts in ([`EXPERIMENTAL_AARCH64`]): MPICH's ranks
/// once never finished loading the shim there, which has not recurred but
/// was never explained (docs/inject.md), and a rank must never be left
/// waiting in a load that does not end.
pub(super) fn supported() -> bool {
    cfg!(target_arch = "x86_64")
        || (cfg!(target_arch = "aarch64")
            && std::env::var_os(EXPERIMENTAL_AARCH64).is_some_and(|v| v == "1"))
}

/// What the refusal adds for this instruction set.
pub(super) fn unsupported_hint() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        " (experimental there: MPI_OBSERVER_INJECT_AARCH64=1 in the daemon's environment tries it, docs/inject.md)"
    } else {
        ""
    }
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
