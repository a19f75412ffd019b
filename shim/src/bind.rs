//! Binding the stack: every level's references to MPI names point at the
//! level they must reach (issue 24).
//!
//! A tool at level k is an ordinary PMPI library: its `PMPI_X` must reach
//! the next level below k that defines X, its `MPI_Y` its own wrapper of Y
//! or, lacking one, the next level below that defines Y. Once the stack is
//! built those answers are fixed, so instead of finding them at every call
//! (which needs a level per thread, and a shim frame between two levels
//! that every stack walker would see), the slots through which the tool
//! calls (its GOT and PLT entries, and absolute pointers in its data) are
//! written with the answer. PnMPI binds levels the same way, by copying
//! libraries; rewriting the slots of the one loaded copy does it without
//! files.
//!
//! The same holds for the two objects of the MPI library that call MPI by
//! name:
//! - the Fortran bindings (the `fort` level): their C calls (`PMPI_Send` in
//!   Open MPI, `MPI_Send` in MPICH) continue below `fort`;
//! - the library itself (and any object holding its definitions): its own
//!   calls by name go to its own definitions, as without the shim.
//!
//! Everything else (the application, the objects it loads, a tool's helper
//! libraries and anything a tool finds with `dlsym`) calls the shim's
//! exported entry points, which enter the stack at its top
//! (crate::dispatch).

use std::collections::HashMap;

use core::ffi::c_void;

use observer_common::{FUNCTION_COUNT, FUNCTIONS};

use crate::{
    generated::fortran::FORTRAN,
    got::Rewritten,
    loaded::{self, LinkMap, Object},
    rows::Raw,
};

/// Every layered name: `MPI_X`, `PMPI_X` and the Fortran spellings, with
/// its row and whether it is a profiling spelling.
pub(crate) struct Names(HashMap<&'static [u8], (usize, usize)>);

impl Names {
    pub(crate) fn new() -> Names {
        let mut m = HashMap::with_capacity(2 * FUNCTION_COUNT + 10 * FORTRAN.len());
        for (row, f) in FUNCTIONS.iter().enumerate() {
            m.insert(f.name.as_bytes(), (row, 0));
        }
        for (i, f) in FORTRAN.iter().enumerate() {
            let row = FUNCTION_COUNT + i;
            for n in f.mpi {
                m.insert(n.as_bytes(), (row, 0));
            }
            for n in f.pmpi {
                m.insert(n.as_bytes(), (row, 1));
            }
        }
        let mut names = Names(m);
        // `PMPI_X` for every C procedure: leaked once per process, since the
        // table lives as long as the stack.
        let pmpi: &'static [String] = Vec::leak(
            FUNCTIONS
                .iter()
                .map(|f| format!("P{}", f.name))
                .collect::<Vec<_>>(),
        );
        for (row, n) in pmpi.iter().enumerate() {
            names.0.insert(n.as_bytes(), (row, 1));
        }
        names
    }

    /// The row and spelling of `name`, if it is layered.
    fn get(&self, name: &[u8]) -> Option<(usize, usize)> {
        self.0.get(name).copied()
    }
}

/// The slots of `map` that call a layered name, each with what `target(row,
/// pmpi)` says it must hold instead (skipped where that is [`Raw::NONE`],
/// or already there).
pub(crate) fn plan(
    map: &LinkMap,
    names: &Names,
    target: impl Fn(usize, usize) -> Raw,
) -> Vec<Rewritten> {
    let Some(obj) = Object::new(map) else {
        return Vec::new();
    };
    let relro = loaded::relro_pages(map);
    let mut out = Vec::new();
    for (slot, ty, addend, sym) in obj.relocations() {
        let Some(add) = crate::arch::slot_addend(ty, addend) else {
            continue;
        };
        // SAFETY: `sym` comes from this object's own relocation.
        let name = unsafe { obj.name(sym) };
        let Some((row, pmpi)) = names.get(name.to_bytes()) else {
            continue;
        };
        let t = target(row, pmpi);
        if t.is_none() {
            continue;
        }
        let new = (t.0 as usize).wrapping_add(add);
        // SAFETY: the slot is in the object's mapped segments (its
        // relocation says so), naturally aligned; only read here.
        let old = unsafe { slot.read_volatile() };
        // A slot in a segment that is neither writable nor made read-only
        // after relocation (text relocations) is left alone.
        let writable = loaded::placement(map, slot as usize).is_some_and(|p| p.writable || p.relro);
        if old == new || !writable {
            continue;
        }
        let at = slot as usize;
        out.push(Rewritten {
            slot,
            old,
            new,
            relro: relro.filter(|(a, b)| (*a..*b).contains(&at)),
        });
    }
    out
}

/// The link map of the object holding `f`, or null.
pub(crate) fn owner_of(f: Raw) -> *mut c_void {
    crate::dl::owner(f.0).0
}
