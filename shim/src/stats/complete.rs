//! The Wait and Test families, `MPI_Start(all)`, `MPI_Cancel`,
//! `MPI_Request_free`, and the calls that bound the layer's life
//! (`MPI_Init*`, `MPI_Finalize`, `MPI_Comm_free`, `MPI_Comm_disconnect`).
//!
//! Every completion call looks its requests up in the table *before* the
//! library runs: completing a request nulls the caller's handle (so it can
//! no longer be found), and MPICH may hand the same value to another
//! thread's new request straight away. When a completed receive needs a
//! status the caller ignored, the layer passes statuses of its own.

use core::{ffi::c_int, mem::MaybeUninit};
use std::cell::RefCell;

use super::{
    abi::{MAX_STATUS, Status, int},
    comms, lifecycle,
    p2p::{next, status_or},
    requests::{self, NO_SLOT},
    segment::{State, state},
    waits::{Call, How},
};

/// Requests handled on the stack; larger arrays use a per-thread buffer
/// that grows once and is reused.
const STACK: usize = 32;

thread_local! {
    static BIG: RefCell<(Vec<u32>, Vec<u64>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `f` with `n` slot entries and room for `n` statuses (8-aligned).
#[inline(always)]
fn scratch<R>(n: usize, f: impl FnOnce(&mut [u32], *mut u8) -> R) -> R {
    if n <= STACK {
        let mut slots = [MaybeUninit::<u32>::uninit(); STACK];
        let mut statuses = [MaybeUninit::<u64>::uninit(); STACK * MAX_STATUS / 8];
        // SAFETY: u32 has no invalid values and every entry is written
        // before it is read (see `lookup`).
        let slots = unsafe { &mut *(&raw mut slots[..n] as *mut [u32]) };
        f(slots, statuses.as_mut_ptr().cast())
    } else {
        big(n, f)
    }
}

#[cold]
#[inline(never)]
fn big<R>(n: usize, f: impl FnOnce(&mut [u32], *mut u8) -> R) -> R {
    let words = n * MAX_STATUS / 8;
    BIG.with(|b| match b.try_borrow_mut() {
        Ok(mut b) => {
            let (slots, statuses) = &mut *b;
            slots.resize(n, NO_SLOT);
            if statuses.len() < words {
                statuses.resize(words, 0);
            }
            f(&mut slots[..n], statuses.as_mut_ptr().cast())
        }
        // Re-entered (a signal handler calling MPI): use fresh buffers.
        Err(_) => f(&mut vec![NO_SLOT; n], vec![0u64; words].as_mut_ptr().cast()),
    })
}

/// Fills `slots` from the caller's request array and marks them pending
/// (each occurrence of a handle its own entry: see
/// [`requests::find_in_array`]); true if any completion will need a status.
#[inline(always)]
fn lookup(s: &State, reqs: usize, slots: &mut [u32]) -> bool {
    let mut need = false;
    for (i, slot) in slots.iter_mut().enumerate() {
        // SAFETY: the caller's array of `slots.len()` requests.
        *slot = requests::find_in_array(s, unsafe { s.abi.handle_at(reqs, i) });
        need |= requests::needs_status(*slot);
    }
    requests::end_lookup(s, slots);
    need
}

/// Completes `slots[i]` and forgets it, so [`unpend_rest`] leaves it be.
///
/// # Safety
/// As [`requests::complete`].
#[inline(always)]
unsafe fn complete_at(s: &State, slots: &mut [u32], i: usize, status: *const u8, call: &Call) {
    // SAFETY: per the caller.
    unsafe { requests::complete(s, slots[i], status, call) };
    slots[i] = NO_SLOT;
}

/// Clears the mark of every slot that did not complete.
#[inline(always)]
fn unpend_rest(s: &State, slots: &[u32]) {
    if s.multi {
        for &slot in slots {
            requests::unpend(s, slot);
        }
    }
}

/// The status array to pass: the caller's, or `own` if it passed
/// `MPI_STATUSES_IGNORE` and a status is needed; and the one to read
/// completions from (null if none).
#[inline(always)]
fn statuses(s: &State, statuses: usize, need: bool, own: *mut u8) -> (usize, *const u8) {
    if statuses != s.abi.c.status_ignore {
        (statuses, statuses as *const u8)
    } else if need {
        (own as usize, own)
    } else {
        (statuses, core::ptr::null())
    }
}

/// Status `i` of an array (or null).
#[inline(always)]
fn nth(s: &State, array: *const u8, i: usize) -> *const u8 {
    if array.is_null() {
        array
    } else {
        array.wrapping_add(i * s.abi.c.status_size)
    }
}

/// After a failed multiple completion (`MPI_ERR_IN_STATUS` under
/// `MPI_ERRORS_RETURN`): release what the library has nulled, without
/// figures, so no entry leaks.
fn after_error(s: &State, reqs: usize, slots: &mut [u32]) {
    for i in 0..slots.len() {
        // SAFETY: the caller's array.
        if slots[i] != NO_SLOT && unsafe { s.abi.handle_at(reqs, i) } == s.abi.request_null {
            // SAFETY: a null status: no figures are read (and a send it
            // completed is said to have waited for nothing).
            unsafe { complete_at(s, slots, i, core::ptr::null(), &Call::new(How::Test)) };
        }
    }
    unpend_rest(s, slots);
}

/// `MPI_Wait`.
pub(crate) unsafe extern "C" fn wait<const ROW: usize>(req: usize, status: usize) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; req, status);
    };
    // SAFETY: the caller's request.
    let slot = requests::find_for_completion(s, unsafe { s.abi.handle_at(req, 0) });
    let mut own = Status::new();
    let st = if requests::needs_status(slot) {
        status_or(s, status, &mut own)
    } else {
        status
    };
    let rc = next!(ROW; req, st);
    if rc == 0 && slot != NO_SLOT {
        let p = if st == s.abi.c.status_ignore { 0 } else { st };
        // SAFETY: null or the status the library filled.
        unsafe { requests::complete(s, slot, p as *const u8, &Call::new(How::One)) };
    } else {
        requests::unpend(s, slot);
    }
    rc
}

/// `MPI_Test`.
pub(crate) unsafe extern "C" fn test<const ROW: usize>(
    req: usize,
    flag: usize,
    status: usize,
) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; req, flag, status);
    };
    // SAFETY: the caller's request.
    let slot = requests::find_for_completion(s, unsafe { s.abi.handle_at(req, 0) });
    let mut own = Status::new();
    let st = if requests::needs_status(slot) {
        status_or(s, status, &mut own)
    } else {
        status
    };
    let rc = next!(ROW; req, flag, st);
    // SAFETY: the library set the flag.
    if rc == 0 && slot != NO_SLOT && unsafe { *(flag as *const c_int) } != 0 {
        let p = if st == s.abi.c.status_ignore { 0 } else { st };
        // SAFETY: null or the status the library filled.
        unsafe { requests::complete(s, slot, p as *const u8, &Call::new(How::Test)) };
    } else {
        requests::unpend(s, slot);
    }
    rc
}

/// `MPI_Waitall` (`TEST` false) and `MPI_Testall` (`TEST` true, which
/// takes a flag before the statuses).
unsafe fn all<const ROW: usize, const TEST: bool>(
    n: usize,
    reqs: usize,
    flag: usize,
    sts: usize,
) -> c_int {
    let call = |st: usize| {
        if TEST {
            next!(ROW; n, reqs, flag, st)
        } else {
            next!(ROW; n, reqs, st)
        }
    };
    let Some(s) = state() else {
        return call(sts);
    };
    let count = int(n).max(0) as usize;
    scratch(count, |slots, own| {
        let need = lookup(s, reqs, slots);
        let (pass, read) = statuses(s, sts, need, own);
        let rc = call(pass);
        // SAFETY: the library set the flag.
        let done = !TEST || unsafe { *(flag as *const c_int) } != 0;
        if rc == 0 && done {
            let call = Call::new(if TEST { How::Test } else { How::Multi });
            for (i, &slot) in slots.iter().enumerate() {
                // SAFETY: null or status i, filled by the library.
                unsafe { requests::complete(s, slot, nth(s, read, i), &call) };
            }
            call.end();
        } else if rc != 0 {
            after_error(s, reqs, slots);
        } else {
            unpend_rest(s, slots);
        }
        rc
    })
}

/// `MPI_Waitall`.
pub(crate) unsafe extern "C" fn waitall<const ROW: usize>(
    n: usize,
    reqs: usize,
    sts: usize,
) -> c_int {
    // SAFETY: forwarded as received.
    unsafe { all::<ROW, false>(n, reqs, 0, sts) }
}

/// `MPI_Testall`.
pub(crate) unsafe extern "C" fn testall<const ROW: usize>(
    n: usize,
    reqs: usize,
    flag: usize,
    sts: usize,
) -> c_int {
    // SAFETY: forwarded as received.
    unsafe { all::<ROW, true>(n, reqs, flag, sts) }
}

/// `MPI_Waitany` (`TEST` false) and `MPI_Testany` (`TEST` true).
unsafe fn any<const ROW: usize, const TEST: bool>(
    n: usize,
    reqs: usize,
    index: usize,
    flag: usize,
    status: usize,
) -> c_int {
    let call = |st: usize| {
        if TEST {
            next!(ROW; n, reqs, index, flag, st)
        } else {
            next!(ROW; n, reqs, index, st)
        }
    };
    let Some(s) = state() else {
        return call(status);
    };
    let count = int(n).max(0) as usize;
    scratch(count, |slots, _| {
        let need = lookup(s, reqs, slots);
        let mut own = Status::new();
        let st = if need {
            status_or(s, status, &mut own)
        } else {
            status
        };
        let rc = call(st);
        // SAFETY: the library set index (and flag).
        let (done, i) = unsafe {
            (
                !TEST || *(flag as *const c_int) != 0,
                *(index as *const c_int),
            )
        };
        if rc != 0 {
            after_error(s, reqs, slots);
            return rc;
        }
        if done
            && i != s.abi.c.undefined
            && let Some(i) = usize::try_from(i).ok().filter(|&i| i < slots.len())
        {
            let p = if st == s.abi.c.status_ignore { 0 } else { st };
            let call = Call::new(if TEST { How::Test } else { How::One });
            // SAFETY: null or the status the library filled.
            unsafe { complete_at(s, slots, i, p as *const u8, &call) };
        }
        unpend_rest(s, slots);
        rc
    })
}

/// `MPI_Waitany`.
pub(crate) unsafe extern "C" fn waitany<const ROW: usize>(
    n: usize,
    reqs: usize,
    index: usize,
    status: usize,
) -> c_int {
    // SAFETY: forwarded as received.
    unsafe { any::<ROW, false>(n, reqs, index, 0, status) }
}

/// `MPI_Testany`.
pub(crate) unsafe extern "C" fn testany<const ROW: usize>(
    n: usize,
    reqs: usize,
    index: usize,
    flag: usize,
    status: usize,
) -> c_int {
    // SAFETY: forwarded as received.
    unsafe { any::<ROW, true>(n, reqs, index, flag, status) }
}

/// `MPI_Waitsome` and `MPI_Testsome` (same signature).
pub(crate) unsafe extern "C" fn some<const ROW: usize>(
    n: usize,
    reqs: usize,
    outcount: usize,
    indices: usize,
    sts: usize,
) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; n, reqs, outcount, indices, sts);
    };
    let count = int(n).max(0) as usize;
    scratch(count, |slots, own| {
        let need = lookup(s, reqs, slots);
        let (pass, read) = statuses(s, sts, need, own);
        let rc = next!(ROW; n, reqs, outcount, indices, pass);
        if rc != 0 {
            after_error(s, reqs, slots);
            return rc;
        }
        // SAFETY: the library set outcount and that many indices.
        let out = unsafe { *(outcount as *const c_int) };
        let call = Call::new(if ROW == observer_common::FunctionId::Testsome as usize {
            How::Test
        } else {
            How::Multi
        });
        for j in 0..usize::try_from(out).unwrap_or(0) {
            // SAFETY: as above.
            let i = unsafe { *(indices as *const c_int).add(j) };
            if let Some(i) = usize::try_from(i).ok().filter(|&i| i < slots.len()) {
                // SAFETY: null or status j, filled by the library.
                unsafe { complete_at(s, slots, i, nth(s, read, j), &call) };
            }
        }
        call.end();
        unpend_rest(s, slots);
        rc
    })
}

/// `MPI_Start`.
pub(crate) unsafe extern "C" fn start<const ROW: usize>(req: usize) -> c_int {
    let rc = next!(ROW; req);
    if rc == 0
        && let Some(s) = state()
    {
        // SAFETY: the caller's request; persistent handles do not change.
        requests::started(s, requests::find(s, unsafe { s.abi.handle_at(req, 0) }));
    }
    rc
}

/// `MPI_Startall`.
pub(crate) unsafe extern "C" fn startall<const ROW: usize>(n: usize, reqs: usize) -> c_int {
    let rc = next!(ROW; n, reqs);
    if rc == 0
        && let Some(s) = state()
    {
        for i in 0..int(n).max(0) as usize {
            // SAFETY: the caller's array of n requests.
            requests::started(s, requests::find(s, unsafe { s.abi.handle_at(reqs, i) }));
        }
    }
    rc
}

/// `MPI_Cancel`.
pub(crate) unsafe extern "C" fn cancel<const ROW: usize>(req: usize) -> c_int {
    let rc = next!(ROW; req);
    if rc == 0
        && let Some(s) = state()
    {
        // SAFETY: the caller's request, still live after MPI_Cancel.
        requests::cancel(requests::find(s, unsafe { s.abi.handle_at(req, 0) }));
    }
    rc
}

/// `MPI_Request_free`.
pub(crate) unsafe extern "C" fn request_free<const ROW: usize>(req: usize) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; req);
    };
    // SAFETY: the caller's request, read before the call nulls it.
    let slot = requests::find_for_completion(s, unsafe { s.abi.handle_at(req, 0) });
    let rc = next!(ROW; req);
    if rc == 0 {
        requests::freed(s, slot);
    } else {
        requests::unpend(s, slot);
    }
    rc
}

/// `MPI_Comm_free` and `MPI_Comm_disconnect`.
pub(crate) unsafe extern "C" fn comm_free<const ROW: usize>(comm: usize) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; comm);
    };
    // SAFETY: the caller's communicator, read before the call nulls it.
    let c = unsafe { s.abi.handle_at(comm, 0) };
    let rc = next!(ROW; comm);
    if rc == 0 {
        comms::forget(c);
    }
    rc
}

/// `MPI_Init`: the segment is created once the library is up and the
/// world size known.
pub(crate) unsafe extern "C" fn init<const ROW: usize>(argc: usize, argv: usize) -> c_int {
    let rc = next!(ROW; argc, argv);
    if rc == 0 {
        lifecycle::init();
    }
    rc
}

/// `MPI_Init_thread`.
pub(crate) unsafe extern "C" fn init_thread<const ROW: usize>(
    argc: usize,
    argv: usize,
    required: usize,
    provided: usize,
) -> c_int {
    let rc = next!(ROW; argc, argv, required, provided);
    if rc == 0 {
        lifecycle::init();
    }
    rc
}

/// `MPI_Finalize`: the segment's file goes (see [`lifecycle::finish`]).
pub(crate) unsafe extern "C" fn finalize<const ROW: usize>() -> c_int {
    let rc = next!(ROW;);
    lifecycle::finish();
    rc
}
