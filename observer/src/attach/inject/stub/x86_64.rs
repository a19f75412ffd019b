//! The x86-64 stub (its steps: the parent module's docs). It saves the
//! flags, every general-purpose register and, with `fxsave64`, the SSE and
//! x87 state, and jumps back through its tail's `resume`.

use observer_common::inject::Mailbox;

use super::{Data, STACK_RESERVED, Tail};

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

unsafe extern "C" {
    static mpi_observer_stub_code: [u8; 0];
    static mpi_observer_stub_tail: [u8; 0];
}

/// The stub's machine code; its [`Tail`] goes right after it.
pub(super) fn code() -> &'static [u8] {
    // SAFETY: both labels are in the one section above, code first; the
    // bytes between them are the assembled code (read-only data).
    unsafe {
        let start = (&raw const mpi_observer_stub_code).cast::<u8>();
        let end = (&raw const mpi_observer_stub_tail).cast::<u8>();
        core::slice::from_raw_parts(start, end.offset_from(start) as usize)
    }
}

/// Nothing to link: the way back is an indirect jump through the tail.
pub(super) fn link(_: &mut [u8], _: u64, _: u64) -> bool {
    true
}
