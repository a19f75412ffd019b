//! The entry table: where each exported entry point jumps. One row per
//! layered entry point, the C procedures first, indexed by the project-wide
//! [`FunctionId`](observer_common::FunctionId), then one row per Fortran
//! symbol family (see [`crate::generated::fortran`]).
//!
//! - [`ENTRY`]`[row][pmpi]`: the first level that defines the row, where an
//!   application's `MPI_X` (`pmpi` 0) or `PMPI_X` (1) call enters the stack.
//! - [`RAW`]`[row]`: the MPI library's own definition, where a call made
//!   inside the library goes (see [`crate::depth::IN_LIB`]), and where the
//!   library gates ([`crate::dispatch`]) continue.
//!
//! The trampolines read both by address from assembly, so they are plain
//! arrays of pointers, null until [`crate::layers`] fills them once. A
//! null slot sends the call to the cold path, which builds the stack (or
//! reports a procedure no level defines). Nothing here calls either, so
//! the table sits below both.

use core::ffi::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};

use observer_common::FUNCTION_COUNT;

use crate::{generated::fortran::FORTRAN_COUNT, rows::Raw};

/// Most levels a stack can have, counting the Fortran layer and the MPI
/// library at the bottom.
pub(crate) const MAX_LEVELS: usize = 16;

/// Rows: C procedures, then Fortran symbol families.
pub(crate) const ROWS: usize = FUNCTION_COUNT + FORTRAN_COUNT;

/// Where the application's calls enter: `ENTRY[row][pmpi]`.
pub(crate) static ENTRY: [[AtomicPtr<c_void>; 2]; ROWS] =
    [const { [const { AtomicPtr::new(core::ptr::null_mut()) }; 2] }; ROWS];

/// The MPI library's definition of each row.
pub(crate) static RAW: [AtomicPtr<c_void>; ROWS] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; ROWS];

/// Publishes where an application's call of `row` enters, for `MPI_X`
/// (`pmpi` 0) and `PMPI_X` (1).
pub(crate) fn publish_entry(row: usize, pmpi: usize, f: Raw) {
    // Release pairs with the trampolines' plain loads (x86_64 keeps stores
    // in order), and with `entry`'s Acquire.
    ENTRY[row][pmpi].store(f.0.cast_mut(), Ordering::Release);
}

/// Publishes the MPI library's definition of `row`.
pub(crate) fn publish_raw(row: usize, f: Raw) {
    RAW[row].store(f.0.cast_mut(), Ordering::Release);
}

/// Where an application's call of `row` enters; null if no level defines it
/// (or the stack is not built yet).
pub(crate) fn entry(row: usize, pmpi: usize) -> *const c_void {
    ENTRY[row][pmpi].load(Ordering::Acquire)
}

/// The MPI library's definition of `row`, or null.
#[inline(always)]
pub(crate) fn raw(row: usize) -> *const c_void {
    // SAFETY: `row` is a generated constant below ROWS.
    unsafe { RAW.get_unchecked(row) }.load(Ordering::Acquire)
}

/// Each level's `MPI_Pcontrol`, top first; null where a level lacks one.
static PCONTROL: [AtomicPtr<c_void>; MAX_LEVELS] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_LEVELS];

/// Publishes level `level`'s `MPI_Pcontrol`.
pub(crate) fn publish_pcontrol(level: usize, f: Raw) {
    PCONTROL[level].store(f.0.cast_mut(), Ordering::Release);
}

/// The `MPI_Pcontrol` of every level from `start` down that defines one.
pub(crate) fn pcontrol(start: usize) -> impl Iterator<Item = *const c_void> {
    PCONTROL
        .iter()
        .skip(start)
        .map(|p| p.load(Ordering::Acquire).cast_const())
        .filter(|p| !p.is_null())
}

/// What a level's own `MPI_Pcontrol`/`PMPI_Pcontrol` is bound to: the shim
/// calls every level's itself (crate::handwritten), so a level's call
/// returns `MPI_SUCCESS` at once.
pub(crate) extern "C" fn pcontrol_nested(_level: core::ffi::c_int) -> core::ffi::c_int {
    0
}
