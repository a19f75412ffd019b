//! The entry points, their cold path, and the library gates.
//!
//! **Entry points.** Every exported `MPI_X`, `PMPI_X` and Fortran spelling
//! is a naked trampoline (`entry!`, its body in [`crate::arch`]). It stores
//! the return address of its caller's call (the call site: `[rsp]` on
//! x86_64, `x30` on aarch64) in the thread's block
//! ([`crate::depth`]) and *jumps* into the first level that defines the
//! procedure ([`crate::table::ENTRY`]). A jump, not a call: the first
//! level's wrapper runs with the application's return address and the
//! application's stack above it, exactly as when the tool is preloaded
//! alone, so `__builtin_return_address(0)`, `backtrace()` and libunwind name
//! the application's call, and a tool that returns returns straight to the
//! application. Arguments, stack-passed ones included, and `rax` (the
//! vector count of the variadic `MPI_Pcontrol` on x86_64) are untouched: the
//! trampoline uses only two scratch registers that carry nothing at a
//! function's entry (`r10` and `r11` in the SysV ABI, `x16` and `x17` in
//! AAPCS64).
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
/// `RAW[row]` when called inside the library (the stack pointer below the
/// thread's library mark; the mark is 0, below every stack, when no gate is
/// open).
/// The cold path gets `row * 4 + pmpi`, plus 2 from inside the library.
macro_rules! entry {
    ([$($vis:tt)*] $name:ident, $doc:expr, $row:expr, $pmpi:expr) => {
        #[doc = $doc]
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        $($vis)* unsafe extern "C" fn $name() {
            trampoline_asm!(
                entry: $crate::table::ENTRY,
                off: (($row) * 2 + ($pmpi)) * 8,
                raw: $crate::table::RAW,
                roff: ($row) * 8,
                code: ($row) * 4 + ($pmpi),
                site: $crate::depth::SITE,
                in_lib: $crate::depth::IN_LIB,
            )
        }
    };
}

// The cold path of every entry point (`mpi_observer_shim_cold`): the
// trampoline's scratch register holds `row * 4 + pmpi (+ 2 inside the
// library)`, the argument registers and the stack hold the call's
// arguments. It saves them (and the vector registers, which a variadic call
// may use), asks `cold_target` where the call goes, and jumps there with
// everything as it was. Written as global assembly ([`crate::arch`]), with
// its unwind information, so a profiler's stack walk through it (the stack
// is being built) stays correct.
cold_path!(cold_target);

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
/// x86_64 SysV ABI, and passed in x registers or 8-byte stack slots in
/// AAPCS64 (handles are pointers in Open MPI and `int`s in MPICH,
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
