//! The dispatch table: one row per layered entry point, the C procedures
//! first, indexed by the project-wide [`FunctionId`](observer_common::FunctionId),
//! then one row per Fortran symbol family (see [`crate::generated::fortran`]).
//! A row has one slot per *start level*: the level a call begins its search
//! at (`depth` for `MPI_X`, `depth + 1` for `PMPI_X`). Each slot already
//! holds the answer of the seed's search loop — the first level at or below
//! the start that defines the function, and that level's function pointer —
//! so a layered call (`dispatch!` in [`crate::dispatch`]) is a TLS load, one
//! table load, a TLS store, the indirect call and a TLS store to restore the
//! depth.
//!
//! Before initialisation every slot is empty. [`crate::layers`] fills the
//! table once; the entry points read it. Nothing here calls either, so the
//! table sits below both.

use core::ffi::c_void;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use observer_common::FUNCTION_COUNT;

use crate::{generated::fortran::FORTRAN_COUNT, rows::Raw};

/// Most levels a stack can have, counting the Fortran layer and the MPI
/// library at the bottom.
pub(crate) const MAX_LEVELS: usize = 16;

/// Rows: C procedures, then Fortran symbol families.
pub(crate) const ROWS: usize = FUNCTION_COUNT + FORTRAN_COUNT;

/// The resolved target of a call starting at some level.
pub(crate) struct Slot {
    f: AtomicPtr<c_void>,
    level: AtomicU32,
}

/// `SLOTS[row][start]`. `start` ranges over `0..=MAX_LEVELS` because a
/// `PMPI_X` call from the bottom level starts one past it.
static SLOTS: [[Slot; MAX_LEVELS + 1]; ROWS] = [const {
    [const {
        Slot {
            f: AtomicPtr::new(core::ptr::null_mut()),
            level: AtomicU32::new(0),
        }
    }; MAX_LEVELS + 1]
}; ROWS];

/// Publishes the target of `row` for calls starting at `start`. Called only
/// during initialisation, before the `Once` that guards it completes.
pub(crate) fn publish(row: usize, start: usize, f: Raw, level: u32) {
    let s = &SLOTS[row][start];
    s.level.store(level, Ordering::Relaxed);
    // Release pairs with the Acquire in `target`: a reader that sees the
    // pointer also sees its level.
    s.f.store(f.0.cast_mut(), Ordering::Release);
}

/// The function and level a call of `row` starting at `start` goes to; a
/// null function if the slot is empty (see `fill` in [`crate::dispatch`]).
#[inline(always)]
pub(crate) fn lookup(row: usize, start: u32) -> (*const c_void, u32) {
    // SAFETY: `row` is a generated constant below ROWS, and the depth is only
    // ever set to a level below MAX_LEVELS, so `start <= MAX_LEVELS`.
    let s = unsafe { SLOTS.get_unchecked(row).get_unchecked(start as usize) };
    // Acquire is a plain load on x86_64.
    (s.f.load(Ordering::Acquire), s.level.load(Ordering::Relaxed))
}
