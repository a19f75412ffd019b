//! The QMPI table: what the QMPI adapters read at every call, published
//! once when the stack is built ([`crate::qmpi`] `publish`). The QMPI
//! counterpart of [`crate::table`].
//!
//! A level above a QMPI instance calls the instance's entry adapter
//! ([`qenter!`], generated per row and instance slot into
//! `generated/next.rs`), which passes the context ([`context`]: the
//! instances' storage) and the instance's id before the arguments to the
//! instance's own function ([`function`]). An instance calls on through
//! what `QMPI_Get_function` gave it: another instance's function, or the
//! exit adapter ([`qexit!`]), which reads the level from the id
//! ([`exit_target`]) and calls that level's function.
//!
//! Kept apart from [`crate::qmpi`] (registration, placement, the `QMPI_*`
//! interface) so that the generated adapters, which expand the macros here,
//! and `qmpi`, which hands out their addresses, do not use each other:
//! this module names only the row type and the crate's [`crate::fatal`].

use core::{
    ffi::{c_int, c_void},
    sync::atomic::{AtomicPtr, AtomicU32, Ordering},
};

use observer_common::FUNCTIONS;

use crate::rows::Raw;

/// Most instances a stack can hold (adapter slots per row; `qenter!`
/// expands this many).
pub(crate) const MAX_INSTANCES: usize = 8;

/// The id naming a non-QMPI level in `QMPI_Get_function`'s answer: this
/// plus the level. The MPI library is 0, as in MPICH.
pub(crate) const LEVEL_ID_BASE: c_int = 0x1_0000;

/// Each instance's storage, by id (index 0: the library, none): what the
/// context's `storage_stack` points to.
pub(crate) static STORAGE: [AtomicPtr<c_void>; MAX_INSTANCES + 1] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_INSTANCES + 1];
/// Each instance slot's functions by row (a leaked array of
/// `FUNCTION_COUNT`).
static FNS: [AtomicPtr<Raw>; MAX_INSTANCES] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_INSTANCES];
/// Every level's function for every row (`row * levels + level`, leaked),
/// for the exit adapters; and the number of levels.
static LEVEL_FNS: AtomicPtr<Raw> = AtomicPtr::new(core::ptr::null_mut());
static LEVELS: AtomicU32 = AtomicU32::new(0);

/// Publishes instance slot `k`'s functions by row (`FUNCTION_COUNT` of
/// them, leaked).
pub(crate) fn publish_instance(k: usize, fns: Vec<Raw>) {
    FNS[k].store(Vec::leak(fns).as_mut_ptr(), Ordering::Release);
}

/// Publishes every level's function for every row (`fns[row * n +
/// level]`, copied and leaked) for the exit adapters, and the number of
/// levels `n`.
pub(crate) fn publish_levels(fns: &[Raw], n: usize) {
    LEVEL_FNS.store(Vec::leak(fns.to_vec()).as_mut_ptr(), Ordering::Release);
    LEVELS.store(n as u32, Ordering::Release);
}

/// Instance slot `k`'s own function for `row`.
#[inline(always)]
pub(crate) fn function(k: usize, row: usize) -> Raw {
    let p = FNS[k].load(Ordering::Acquire);
    if p.is_null() {
        return Raw::NONE;
    }
    // SAFETY: a leaked array of FUNCTION_COUNT, and `row` a C row.
    unsafe { *p.add(row) }
}

/// The context passed to every QMPI function: its one word, the storage
/// stack.
#[inline(always)]
pub(crate) fn context() -> usize {
    STORAGE.as_ptr() as usize
}

/// Where the exit adapter of `row` called with id `next` goes: the level
/// that id names (0: the library, through its gate). An id that names no
/// level ends the process in one line: calling on would run the wrong
/// code.
#[inline(always)]
pub(crate) fn exit_target(row: usize, next: c_int) -> *const c_void {
    let n = LEVELS.load(Ordering::Relaxed) as usize;
    let level = if next == 0 {
        n.wrapping_sub(1)
    } else {
        next.wrapping_sub(LEVEL_ID_BASE) as usize
    };
    let fns = LEVEL_FNS.load(Ordering::Acquire);
    let f = if fns.is_null() || level >= n {
        Raw::NONE
    } else {
        // SAFETY: a leaked array of rows x levels; both in range.
        unsafe { *fns.add(row * n + level) }
    };
    if f.is_none() {
        crate::fatal(&format!(
            "QMPI: a tool called {} with next id {next}, which names no level of this stack that defines it (pass the id QMPI_Get_function gave with the function)",
            FUNCTIONS[row].name
        ));
    }
    f.0
}

/// An entry into QMPI instance slot `K` for one row (`$row`, its words and
/// return type): calls the instance's function with the context and the
/// instance's id before the row's words. Expands to the row's adapters,
/// one per instance slot.
macro_rules! qenter {
    ($row:expr, $ret:ty, ($($a:ident),*)) => {{
        #[doc = "A QMPI instance's entry: see `qenter!`."]
        unsafe extern "C" fn enter<const K: usize>($($a: usize),*) -> $ret {
            type Instance = unsafe extern "C" fn(usize, core::ffi::c_int, $(word!($a)),*) -> $ret;
            let f = $crate::qmpi_table::function(K, $row);
            // SAFETY: the function instance K registered for this row (the
            // adapter is only bound where it did), which takes the context,
            // the instance's id, then the row's words.
            let f: Instance = unsafe { core::mem::transmute(f.0) };
            // SAFETY: the words this call was made with, passed on.
            unsafe { f($crate::qmpi_table::context(), K as core::ffi::c_int + 1, $($a),*) }
        }
        const _: () = assert!($crate::qmpi_table::MAX_INSTANCES == 8);
        [
            $crate::rows::Raw(enter::<0> as *const core::ffi::c_void),
            $crate::rows::Raw(enter::<1> as *const core::ffi::c_void),
            $crate::rows::Raw(enter::<2> as *const core::ffi::c_void),
            $crate::rows::Raw(enter::<3> as *const core::ffi::c_void),
            $crate::rows::Raw(enter::<4> as *const core::ffi::c_void),
            $crate::rows::Raw(enter::<5> as *const core::ffi::c_void),
            $crate::rows::Raw(enter::<6> as *const core::ffi::c_void),
            $crate::rows::Raw(enter::<7> as *const core::ffi::c_void),
        ]
    }};
}

/// The exit from QMPI for one row: what `QMPI_Get_function` hands a tool
/// when the next level is not an instance. Drops the context, reads the
/// level from the id, and calls that level's function with the row's
/// words.
macro_rules! qexit {
    ($row:expr, $ret:ty, ($($a:ident),*)) => {{
        #[doc = "A QMPI exit: see `qexit!`."]
        unsafe extern "C" fn exit(_context: usize, next: usize, $($a: usize),*) -> $ret {
            // The id is a C `int`: the upper half of its register is not
            // defined.
            let f = $crate::qmpi_table::exit_target($row, next as u32 as core::ffi::c_int);
            // SAFETY: that level's function for this row, which takes the
            // row's words.
            let f: unsafe extern "C" fn($(word!($a)),*) -> $ret = unsafe { core::mem::transmute(f) };
            // SAFETY: the words this call was made with, passed on.
            unsafe { f($($a),*) }
        }
        $crate::rows::Raw(exit as *const core::ffi::c_void)
    }};
}
