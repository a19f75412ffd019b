//! The loader stub the daemon writes into a target process and has one of
//! its threads run (docs/inject.md, "The stub").
//!
//! The thread is stopped in the prologue of an application-level MPI call.
//! Its registers are left as they were except `rip`, which points at the
//! stub. The stub:
//!
//! 1. steps below the red zone and the strings the daemon put under the
//!    stack pointer ([`STACK_RESERVED`] bytes), saves the flags, every
//!    general-purpose register and (with `fxsave64`) the SSE and x87 state:
//!    at a call boundary the System V ABI makes every vector register
//!    caller-saved, and MXCSR and the x87 control word callee-saved, so
//!    this keeps everything a caller may rely on, the argument registers of
//!    a variadic `MPI_Pcontrol` included;
//! 2. `dlopen(mailbox.path, mailbox.dlopen_flags)`, `dlsym(handle, entry)`
//!    and calls the entry with the mailbox's address, or stores `dlerror()`
//!    in `mailbox.error` and state LOAD_FAILED;
//! 3. copies the state into `outcome`, stores state DONE, restores
//!    everything and jumps back to the interrupted instruction.
//!
//! It is position-independent. Its [`Data`] block, which the stub and the
//! shim write to, lives in writable memory the daemon chose; the code finds
//! it through the first of two words that follow it ([`Tail`]), read
//! relative to `rip`, and jumps back through the second. So the daemon
//! copies the code and its tail anywhere executable, and the data anywhere
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

/// The two words right after the code, in the same (executable, read-only
/// to the process) memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Tail {
    /// Where the [`Data`] block is.
    pub data: u64,
    /// Where the thread was stopped: the stub jumps back there.
    pub resume: u64,
}

// x86-64 only: elsewhere `load_shim` refuses before a stub is needed
// (regs::supported), and `code` is empty.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .rodata.mpi_observer_stub,\"a\",@progbits",
    ".p2align 4",
    ".globl mpi_observer_stub_code",
    ".hidden mpi_observer_stub_code",
    "mpi_observer_stub_code:",
    "lea rsp, [rsp - {reserved}]",
    "pushfq",
    "push rax",
    "push rbx",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push rbp",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "push r12",
    "push r13",
    "push r14",
    "push r15",
    "mov rbp, rsp",
    "and rsp, -64",
    "sub rsp, 512",
    "fxsave64 [rsp]",
    "cld",
    "mov rbx, [rip + mpi_observer_stub_tail]",
    "mov dword ptr [rbx + {state}], {loading}",
    "mov rdi, [rbx + {path}]",
    "mov esi, [rbx + {flags}]",
    "call [rbx + {dlopen}]",
    "test rax, rax",
    "jz 2f",
    "mov rdi, rax",
    "lea rsi, [rbx + {entry}]",
    "call [rbx + {dlsym}]",
    "test rax, rax",
    "jz 2f",
    "mov rdi, rbx",
    "call rax",
    "jmp 3f",
    "2:",
    "call [rbx + {dlerror}]",
    "mov [rbx + {error}], rax",
    "mov dword ptr [rbx + {state}], {load_failed}",
    "3:",
    "mov eax, [rbx + {state}]",
    "mov [rbx + {outcome}], eax",
    "fxrstor64 [rsp]",
    "mov rsp, rbp",
    // The last store to the block before the registers come back; the
    // jump below reads the tail's `resume`, which only the daemon writes.
    "mov dword ptr [rbx + {state}], {done}",
    "pop r15",
    "pop r14",
    "pop r13",
    "pop r12",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rbp",
    "pop rdi",
    "pop rsi",
    "pop rdx",
    "pop rcx",
    "pop rbx",
    "pop rax",
    "popfq",
    // lea, not add: the flags are restored.
    "lea rsp, [rsp + {reserved}]",
    "jmp [rip + mpi_observer_stub_tail + {resume}]",
    ".p2align 3",
    ".globl mpi_observer_stub_tail",
    ".hidden mpi_observer_stub_tail",
    "mpi_observer_stub_tail:",
    ".popsection",
    reserved = const STACK_RESERVED,
    state = const core::mem::offset_of!(Mailbox, state),
    path = const core::mem::offset_of!(Mailbox, path),
    flags = const core::mem::offset_of!(Mailbox, dlopen_flags),
    error = const core::mem::offset_of!(Mailbox, error),
    outcome = const core::mem::offset_of!(Mailbox, outcome),
    dlopen = const core::mem::offset_of!(Data, dlopen),
    dlsym = const core::mem::offset_of!(Data, dlsym),
    dlerror = const core::mem::offset_of!(Data, dlerror),
    resume = const core::mem::offset_of!(Tail, resume),
    entry = const core::mem::offset_of!(Data, entry),
    loading = const observer_common::inject::state::LOADING,
    load_failed = const observer_common::inject::state::LOAD_FAILED,
    done = const observer_common::inject::state::DONE,
);

#[cfg(target_arch = "x86_64")]
unsafe extern "C" {
    static mpi_observer_stub_code: [u8; 0];
    static mpi_observer_stub_tail: [u8; 0];
}

/// The stub's machine code (none where this build has no stub, see
/// `regs::supported`); its [`Tail`] goes right after it.
#[cfg(not(target_arch = "x86_64"))]
pub fn code() -> &'static [u8] {
    &[]
}

/// The stub's machine code; its [`Tail`] goes right after it.
#[cfg(target_arch = "x86_64")]
pub fn code() -> &'static [u8] {
    // SAFETY: both labels are in the one section above, code first; the
    // bytes between them are the assembled code (read-only data).
    unsafe {
        let start = (&raw const mpi_observer_stub_code).cast::<u8>();
        let end = (&raw const mpi_observer_stub_tail).cast::<u8>();
        core::slice::from_raw_parts(start, end.offset_from(start) as usize)
    }
}

/// Executable bytes the stub needs in the target: its code and its tail.
pub fn code_size() -> usize {
    code().len() + size_of::<Tail>()
}

/// The code followed by `tail`, as written to the target.
pub fn code_bytes(tail: &Tail) -> Vec<u8> {
    let mut out = code().to_vec();
    out.extend_from_slice(&tail.data.to_ne_bytes());
    out.extend_from_slice(&tail.resume.to_ne_bytes());
    out
}

/// `data` as the bytes to write to the target.
pub fn data_bytes(data: &Data) -> Vec<u8> {
    // SAFETY: Data is repr(C), Copy, made of integers with no padding
    // (asserted in the tests), so every byte is initialised.
    unsafe {
        core::slice::from_raw_parts((data as *const Data).cast::<u8>(), size_of::<Data>()).to_vec()
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn stub_is_small_and_data_has_no_padding() {
        assert!(code().len() > 64 && code().len() < 256, "{}", code().len());
        assert_eq!(size_of::<Data>(), size_of::<Mailbox>() + 3 * 8 + 32);
        // The tail is 8-aligned after the code.
        assert_eq!(code().len() % 8, 0);
        assert_eq!(code_bytes(&Tail::default()).len(), code_size());
    }
}
