//! The entry points, their cold path, and the library gates.
//!
//! **Entry points.** Every exported `MPI_X`, `PMPI_X` and Fortran spelling
//! is a naked trampoline (`entry!`). It stores the return address its
//! caller's `call` pushed (`[rsp]`, the call site) in the thread's block
//! ([`crate::depth`]) and *jumps* into the first level that defines the
//! procedure ([`crate::table::ENTRY`]). A jump, not a call: the first
//! level's wrapper runs with the application's return address and the
//! application's stack above it, exactly as when the tool is preloaded
//! alone, so `__builtin_return_address(0)`, `backtrace()` and libunwind name
//! the application's call, and a tool that returns returns straight to the
//! application. Arguments, stack-passed ones included, and `rax` (the
//! vector count of the variadic `MPI_Pcontrol`) are untouched: the
//! trampoline uses only `r10` and `r11`, which carry nothing at the entry of
//! a SysV function.
//!
//! Only the application's calls come here. Every level below is bound to
//! the next one when the stack is built ([`crate::bind`]): a tool's
//! `PMPI_X` goes straight to the next level that defines X, through its own
//! GOT, with no shim code between two tools. So nothing needs to track a
//! level per thread, and a tool's tail call, a signal handler, a `longjmp`
//! or a thread it starts cannot confuse one.
//!
//! **The library gate.** A call from some level into the MPI library goes
//! through a small frame of the shim (`gate!`), which marks the thread as
//! inside the library ([`crate::depth::IN_LIB`]) for the call. An entry
//! point called below that mark (the library's own components, such as
//! Open MPI's ROMIO, or a user callback the library runs) goes straight to
//! the library ([`crate::table::RAW`]), as calls made inside the library
//! always have. The gate's frame sits below every tool, so no tool sees it.
//!
//! **The cold path.** A null slot (the stack is not built yet, or no level
//! defines the procedure) jumps to `mpi_observer_shim_cold`, which saves the argument
//! registers, builds the stack once ([`crate::layers`]) and jumps to the
//! answer, or reports a procedure no level defines.
//!
//! This is the top of the shim's dependencies: it uses the table, the
//! layers and the thread block, and nothing below names it.

use core::ffi::c_void;

/// Expands to `usize` whatever its argument: one machine word per parameter.
macro_rules! word {
    ($a:ident) => {
        usize
    };
}

/// One exported entry point for row `$row`, `$pmpi` 1 for a profiling
/// spelling: stores the call site, then jumps to `ENTRY[row][pmpi]`, or to
/// `RAW[row]` when called inside the library (`rsp` below the thread's
/// library mark; the mark is 0, below every stack, when no gate is open).
/// The cold path gets `row * 4 + pmpi`, plus 2 from inside the library.
macro_rules! entry {
    ([$($vis:tt)*] $name:ident, $doc:expr, $row:expr, $pmpi:expr) => {
        #[doc = $doc]
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        $($vis)* unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                // No stack change: the caller's frame rule (return address at
                // [rsp]) holds at every instruction.
                ".cfi_startproc",
                "mov r10, qword ptr [rip + mpi_observer_shim_depth@GOTTPOFF]",
                "mov r11, qword ptr [rsp]",
                "mov qword ptr fs:[r10 + 8], r11",
                "cmp rsp, qword ptr fs:[r10 + 32]",
                "jb 2f",
                "mov r11, qword ptr [rip + {entry} + {off}]",
                "test r11, r11",
                "jz 3f",
                "jmp r11",
                "2:",
                "mov r11, qword ptr [rip + {raw} + {roff}]",
                "test r11, r11",
                "jz 4f",
                "jmp r11",
                "3:",
                "mov r10d, {code}",
                "jmp mpi_observer_shim_cold",
                "4:",
                "mov r10d, {code} + 2",
                "jmp mpi_observer_shim_cold",
                ".cfi_endproc",
                entry = sym $crate::table::ENTRY,
                raw = sym $crate::table::RAW,
                off = const (($row) * 2 + ($pmpi)) * 8,
                roff = const ($row) * 8,
                code = const ($row) * 4 + ($pmpi),
            )
        }
    };
}

// The cold path of every entry point (`mpi_observer_shim_cold`): `r10` holds `row * 4
// + pmpi (+ 2 inside the library)`, the argument registers and the stack
// hold the call's arguments. It saves them (and `rax` and the vector
// registers, which a variadic call may use), asks `cold_target` where the
// call goes, and jumps there with everything as it was. Written as global
// assembly, with its unwind information, so a profiler's stack walk through
// it (the stack is being built) stays correct.
core::arch::global_asm!(
    ".pushsection .text.mpi_observer_shim_cold,\"ax\",@progbits",
    ".p2align 4",
    ".globl mpi_observer_shim_cold",
    ".hidden mpi_observer_shim_cold",
    ".type mpi_observer_shim_cold,@function",
    "mpi_observer_shim_cold:",
    ".cfi_startproc",
    "push rbp",
    ".cfi_adjust_cfa_offset 8",
    ".cfi_rel_offset rbp, 0",
    "mov rbp, rsp",
    ".cfi_def_cfa_register rbp",
    "push rax",
    "push rdi",
    "push rsi",
    "push rdx",
    "push rcx",
    "push r8",
    "push r9",
    // 7 words pushed after rbp: 8 more bytes align the stack for the call
    // below, and 128 hold xmm0-7.
    "sub rsp, 136",
    "movdqu xmmword ptr [rsp], xmm0",
    "movdqu xmmword ptr [rsp + 16], xmm1",
    "movdqu xmmword ptr [rsp + 32], xmm2",
    "movdqu xmmword ptr [rsp + 48], xmm3",
    "movdqu xmmword ptr [rsp + 64], xmm4",
    "movdqu xmmword ptr [rsp + 80], xmm5",
    "movdqu xmmword ptr [rsp + 96], xmm6",
    "movdqu xmmword ptr [rsp + 112], xmm7",
    "mov rdi, r10",
    "call {target}",
    "mov r11, rax",
    "movdqu xmm0, xmmword ptr [rsp]",
    "movdqu xmm1, xmmword ptr [rsp + 16]",
    "movdqu xmm2, xmmword ptr [rsp + 32]",
    "movdqu xmm3, xmmword ptr [rsp + 48]",
    "movdqu xmm4, xmmword ptr [rsp + 64]",
    "movdqu xmm5, xmmword ptr [rsp + 80]",
    "movdqu xmm6, xmmword ptr [rsp + 96]",
    "movdqu xmm7, xmmword ptr [rsp + 112]",
    "add rsp, 136",
    "pop r9",
    "pop r8",
    "pop rcx",
    "pop rdx",
    "pop rsi",
    "pop rdi",
    "pop rax",
    "pop rbp",
    ".cfi_def_cfa rsp, 8",
    ".cfi_restore rbp",
    "jmp r11",
    ".cfi_endproc",
    ".size mpi_observer_shim_cold, . - mpi_observer_shim_cold",
    ".popsection",
    target = sym cold_target,
);

/// Where a call that found an empty slot goes: builds the stack if needed,
/// then answers the slot, or ends the process if no level defines the
/// procedure. `code` is `row * 4 + pmpi (+ 2 inside the library)`.
extern "C" fn cold_target(code: usize) -> *const c_void {
    let (row, pmpi, inside) = (code / 4, code & 1, code & 2 != 0);
    // Building the stack may run code that calls through a trampoline: the
    // call site is this call's again afterwards.
    // SAFETY: this thread's block.
    let site = unsafe { crate::depth::site(crate::depth::slot()) };
    crate::layers::ensure();
    // SAFETY: as above.
    unsafe { crate::depth::set_site(crate::depth::slot_again(), site) };
    let f = if inside {
        crate::table::raw(row)
    } else {
        crate::table::entry(row, pmpi)
    };
    if f.is_null() {
        crate::fatal(&format!(
            "{} is not defined by any layer, nor by the MPI library",
            crate::layers::row_name(row)
        ));
    }
    f
}

/// The library gate of row `$row`: a function taking the row's words and
/// returning `$ret`, which marks the thread as inside the library around
/// its call of the library's definition ([`crate::table::raw`]). Levels
/// above the library are bound to it instead of to the library. Expands to
/// its address.
///
/// Every argument of every MPI procedure is of the INTEGER class in the
/// x86_64 SysV ABI (handles are pointers in Open MPI and `int`s in MPICH,
/// the rest are pointers, integers or `MPI_Aint`s), so forwarding N
/// machine words in the same registers and stack slots passes them through
/// unchanged without knowing either `mpi.h`.
macro_rules! gate {
    ($row:expr, $ret:ty, ($($a:ident),*)) => {{
        #[doc = "A library gate: see `gate!`."]
        unsafe extern "C" fn gate($($a: usize),*) -> $ret {
            let block = $crate::depth::slot();
            // SAFETY: this thread's block.
            let outer = unsafe { $crate::depth::in_lib(block) };
            // SAFETY: as above. Everything the library runs for this call
            // is below this frame's stack pointer.
            unsafe { $crate::depth::set_in_lib(block, $crate::depth::stack_pointer()) };
            let f = $crate::table::raw($row);
            // SAFETY: the library's definition of this row (the gate is only
            // bound where it is non-null), which takes these words and
            // returns this type.
            let f: unsafe extern "C" fn($(word!($a)),*) -> $ret = unsafe { core::mem::transmute(f) };
            // SAFETY: the words this call was made with, passed on unchanged.
            let r = unsafe { f($($a),*) };
            // SAFETY: this thread's block.
            unsafe { $crate::depth::set_in_lib($crate::depth::slot_again(), outer) };
            r
        }
        $crate::rows::Raw(gate as *const core::ffi::c_void)
    }};
}

/// A C procedure: exports `MPI_X` and `PMPI_X`. The return type and the
/// words are the generated signature; the trampolines need neither.
macro_rules! c_procedure {
    ($row:expr, $mpi:ident, $pmpi:ident, $ret:ty, ($($a:ident),*)) => {
        entry!([] $mpi,
            concat!("Layered `", stringify!($mpi), "`: enters the stack at its top."),
            $row, 0);
        entry!([pub(crate)] $pmpi,
            concat!("Layered `", stringify!($pmpi), "`: enters the stack below its top level."),
            $row, 1);
    };
}

/// A Fortran symbol family: every spelling in `[mpi ...]` enters at the
/// top, every spelling in `[pmpi ...]` below the top level.
/// `$index` counts Fortran rows; the row is `FUNCTION_COUNT + $index`.
macro_rules! fortran_procedure {
    ($index:literal, $ret:ty, $args:tt, [$($mpi:ident),*], [$($pmpi:ident),*]) => {
        $( entry!([] $mpi, concat!("Layered Fortran `", stringify!($mpi), "`."),
            observer_common::FUNCTION_COUNT + $index, 0); )*
        $( entry!([] $pmpi, concat!("Layered Fortran `", stringify!($pmpi), "`."),
            observer_common::FUNCTION_COUNT + $index, 1); )*
    };
}
