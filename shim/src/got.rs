//! The GOT slots an injected shim rewrote, the mailbox it shares with the
//! daemon, and ejection: what a timed call polls at its end.
//!
//! The injection's workflow ([`crate::inject`]) decides which slots to
//! rewrite and when; this module holds what must outlive it and be reached
//! from the hot path ([`poll`], from [`crate::timing::leave`]), so the
//! timing depends on it and not on the workflow, which itself starts the
//! timing.

use core::{
    ffi::{c_int, c_void},
    ptr::null_mut,
    sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*},
};
use std::{ffi::CString, sync::Mutex};

use observer_common::inject::{Mailbox, go, state};

/// The mailbox of the live injection, polled for `go == EJECT`; null when
/// the shim is not injected (or has been ejected).
static MAILBOX: AtomicPtr<Mailbox> = AtomicPtr::new(null_mut());
/// Set while one thread ejects.
static EJECTING: AtomicBool = AtomicBool::new(false);

/// One rewritten slot.
pub(crate) struct Rewritten {
    /// The slot.
    pub(crate) slot: *mut usize,
    /// What it held: the library's definition, or the lazy binding stub.
    pub(crate) old: usize,
    /// The shim's definition.
    pub(crate) new: usize,
    /// The object's read-only relocation range, if the slot lies in it.
    pub(crate) relro: Option<(usize, usize)>,
}

// SAFETY: addresses only, used under the mutex.
unsafe impl Send for Rewritten {}

/// Every slot the injection rewrote, put back at ejection.
static SLOTS: Mutex<Vec<Rewritten>> = Mutex::new(Vec::new());

/// The mailbox's `u32` field at `f`, shared with the daemon, which writes
/// it through `/proc/PID/mem`.
///
/// # Safety
/// `f` points into a live mailbox.
pub(crate) unsafe fn word<'a>(f: *mut u32) -> &'a AtomicU32 {
    // SAFETY: per the caller; naturally aligned.
    unsafe { AtomicU32::from_ptr(f) }
}

/// As [`word`], for a `u64` field.
///
/// # Safety
/// `f` points into a live mailbox.
pub(crate) unsafe fn dword<'a>(f: *mut u64) -> &'a AtomicU64 {
    // SAFETY: per the caller; naturally aligned.
    unsafe { AtomicU64::from_ptr(f) }
}

/// Stores `msg` (leaked: the daemon reads it after the stub returned) as
/// the mailbox's error and `st` as its state.
///
/// # Safety
/// `mb` is a live mailbox.
pub(crate) unsafe fn finish(mb: *mut Mailbox, st: u32, msg: Option<String>) -> c_int {
    if let Some(m) = msg {
        let c = CString::new(m.replace('\0', " ")).expect("no NUL");
        // SAFETY: a live mailbox.
        unsafe { dword(&raw mut (*mb).error) }.store(c.into_raw() as u64, Release);
    }
    // SAFETY: a live mailbox.
    unsafe { word(&raw mut (*mb).state) }.store(st, Release);
    if st == state::COMMITTED || st == state::EJECTED {
        0
    } else {
        -1
    }
}

/// Makes `range` writable (`on`) or read-only again.
fn protect(range: (usize, usize), on: bool) -> bool {
    let prot = if on {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: page-aligned range of a loaded object's RELRO segment.
    unsafe { libc::mprotect(range.0 as *mut c_void, range.1 - range.0, prot) == 0 }
}

/// Swaps every slot from `from` to `to` where it still holds `from`;
/// returns how many it swapped and keeps those.
fn swap(slots: Vec<Rewritten>, forward: bool) -> Vec<Rewritten> {
    let mut done = Vec::with_capacity(slots.len());
    let mut opened: Vec<(usize, usize)> = Vec::new();
    for r in slots {
        if let Some(range) = r.relro
            && !opened.contains(&range)
        {
            if !protect(range, true) {
                continue;
            }
            opened.push(range);
        }
        let (from, to) = if forward {
            (r.old, r.new)
        } else {
            (r.new, r.old)
        };
        // SAFETY: a GOT slot, writable now, naturally aligned; a thread that
        // binds it lazily meanwhile wins, and the slot is left to it.
        let ok = unsafe { AtomicUsize::from_ptr(r.slot) }
            .compare_exchange(from, to, AcqRel, Relaxed)
            .is_ok();
        if ok {
            done.push(r);
        }
    }
    for range in opened {
        protect(range, false);
    }
    done
}

/// Rewrites the planned slots once, for good: the stack's own bindings
/// (crate::bind) of a preloaded shim, which nothing puts back.
pub(crate) fn rewrite(planned: Vec<Rewritten>) -> usize {
    swap(planned, true).len()
}

/// Rewrites the planned slots; returns how many.
pub(crate) fn apply(planned: Vec<Rewritten>) -> usize {
    let done = swap(planned, true);
    let n = done.len();
    SLOTS.lock().unwrap_or_else(|e| e.into_inner()).extend(done);
    n
}

/// Puts every rewritten slot back; returns how many.
fn restore() -> usize {
    let slots = core::mem::take(&mut *SLOTS.lock().unwrap_or_else(|e| e.into_inner()));
    swap(slots, false).len()
}

/// Makes `mb` the live injection's mailbox: from now on every timed call
/// that ends polls it ([`poll`]).
pub(crate) fn arm(mb: *mut Mailbox) {
    MAILBOX.store(mb, Release);
}

/// Called at the end of every timed call: ejects if the daemon asked.
#[inline(always)]
pub(crate) fn poll() {
    let mb = MAILBOX.load(Relaxed);
    if mb.is_null() {
        return;
    }
    // SAFETY: the live injection's mailbox, mapped for the process's life.
    if unsafe { word(&raw mut (*mb).go) }.load(Relaxed) == go::EJECT {
        eject_now(mb);
    }
}

#[cold]
#[inline(never)]
fn eject_now(mb: *mut Mailbox) {
    if EJECTING.swap(true, Acquire) {
        return;
    }
    if MAILBOX
        .compare_exchange(mb, null_mut(), AcqRel, Relaxed)
        .is_ok()
    {
        let n = restore();
        crate::stats::segment::mark_ejected();
        // SAFETY: the injection's mailbox.
        unsafe {
            word(&raw mut (*mb).slots).store(n as u32, Relaxed);
            finish(mb, state::EJECTED, None);
        }
    }
    EJECTING.store(false, Release);
}
