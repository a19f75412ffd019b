//! The loader stub the daemon writes into a target process and has one of
//! its threads run (docs/inject.md, "The stub"), one file per instruction
//! set (`x86_64`, `aarch64`) with the same items: [`code`] and the
//! placement-dependent part of it (`link`).
//!
//! The thread is stopped in the prologue of an application-level MPI call.
//! Its registers are left as they were except its program counter, which
//! points at the stub. The stub:
//!
//! 1. steps below the red zone and the strings the daemon put under the
//!    stack pointer ([`STACK_RESERVED`] bytes) and saves everything a
//!    caller may rely on at a call boundary: the flags, every
//!    general-purpose register and the vector and floating-point state
//!    (x86-64: `fxsave64`, since the System V ABI makes every vector
//!    register caller-saved and MXCSR and the x87 control word
//!    callee-saved; aarch64: q0–q31, FPCR and FPSR), the argument
//!    registers of a variadic `MPI_Pcontrol` included;
//! 2. `dlopen(mailbox.path, mailbox.dlopen_flags)`, `dlsym(handle, entry)`
//!    and calls the entry with the mailbox's address, or stores `dlerror()`
//!    in `mailbox.error` and state LOAD_FAILED;
//! 3. copies the state into `outcome`, stores state DONE, restores
//!    everything and jumps back to the interrupted instruction.
//!
//! It is position-independent. Its [`Data`] block, which the stub and the
//! shim write to, lives in writable memory the daemon chose; the code finds
//! it through the first word that follows it ([`Tail`]), read relative to
//! the program counter. x86-64 jumps back through the second; aarch64
//! loads x16 from the third and branches back directly, the one
//! instruction the daemon encodes for where it put the code. So the daemon
//! copies the code and its tail anywhere executable (within aarch64's
//! branch reach of the stopped instruction), and the data anywhere
//! writable. Nothing in the stub depends on the daemon once it runs: a
//! daemon killed while it runs changes nothing.

use observer_common::inject::Mailbox;

/// Bytes under the thread's stack pointer the stub leaves alone: the
/// 128-byte red zone, then room for the strings the daemon writes there.
pub const STACK_RESERVED: u64 = 128 + 4096;

/// The stub's writable block, in the target: the mailbox, then the
/// addresses the stub calls, then the entry's name. It outlives the stub:
/// the shim keeps the mailbox's address, and a later detach finds it by its
/// magic.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Data {
    /// The conversation with the shim.
    pub mailbox: Mailbox,
    /// `dlopen` in the target's libc.
    pub dlopen: u64,
    /// `dlsym`.
    pub dlsym: u64,
    /// `dlerror`.
    pub dlerror: u64,
    /// The entry's name, NUL-terminated.
    pub entry: [u8; 32],
}

/// The three words right after the code, in the same (executable,
/// read-only to the process) memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Tail {
    /// Where the [`Data`] block is.
    pub data: u64,
    /// Where the thread was stopped: the stub jumps back there.
    pub resume: u64,
    /// aarch64: the thread's x16 (IP0) when it was stopped, which the stub
    /// loads last, by a PC-relative load that needs no register (unused on
    /// x86-64).
    pub ip0: u64,
}

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "aarch64")]
use aarch64 as imp;
#[cfg(target_arch = "x86_64")]
use x86_64 as imp;

/// Without a stub for this instruction set: no code (`load_shim` refuses
/// before a stub is needed, see `regs::supported`).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod imp {
    pub(super) fn link(_: &mut [u8], _: u64, _: u64) -> bool {
        false
    }
}

// The labels every instruction set's assembly defines, in one read-only
// section: the code's first byte and its tail's, right after the code.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
unsafe extern "C" {
    static mpi_observer_stub_code: [u8; 0];
    static mpi_observer_stub_tail: [u8; 0];
}

/// The stub's machine code (none where this build has no stub); its
/// [`Tail`] goes right after it.
pub fn code() -> &'static [u8] {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    // SAFETY: both labels are in the arch file's one section, code first;
    // the bytes between them are the assembled code (read-only data).
    unsafe {
        let start = (&raw const mpi_observer_stub_code).cast::<u8>();
        let end = (&raw const mpi_observer_stub_tail).cast::<u8>();
        core::slice::from_raw_parts(start, end.offset_from(start) as usize)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    &[]
}

/// Executable bytes the stub needs in the target: its code and its tail.
pub fn code_size() -> usize {
    code().len() + size_of::<Tail>()
}

/// The code followed by `tail`, as written to the target at `code_at`;
/// `None` when the code there cannot reach `tail.resume` (aarch64's
/// direct branch back reaches 128 MiB either way).
pub fn code_bytes(tail: &Tail, code_at: u64) -> Option<Vec<u8>> {
    let mut out = code().to_vec();
    if !imp::link(&mut out, code_at, tail.resume) {
        return None;
    }
    out.extend_from_slice(&tail.data.to_ne_bytes());
    out.extend_from_slice(&tail.resume.to_ne_bytes());
    out.extend_from_slice(&tail.ip0.to_ne_bytes());
    Some(out)
}

/// `data` as the bytes to write to the target.
pub fn data_bytes(data: &Data) -> Vec<u8> {
    // SAFETY: Data is repr(C), Copy, made of integers with no padding
    // (asserted in the tests), so every byte is initialised.
    unsafe {
        core::slice::from_raw_parts((data as *const Data).cast::<u8>(), size_of::<Data>()).to_vec()
    }
}

#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests {
    use super::*;

    #[test]
    fn stub_is_small_and_data_has_no_padding() {
        assert!(code().len() > 64 && code().len() < 512, "{}", code().len());
        assert_eq!(size_of::<Data>(), size_of::<Mailbox>() + 3 * 8 + 32);
        // The tail is 8-aligned after the code.
        assert_eq!(code().len() % 8, 0);
        let at = 0x7f00_0000_0000;
        let tail = Tail {
            resume: at + 0x1000,
            ..Tail::default()
        };
        assert_eq!(code_bytes(&tail, at).map(|c| c.len()), Some(code_size()));
    }
}
