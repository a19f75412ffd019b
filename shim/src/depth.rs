//! The per-thread block the entry points and the `stats` layer share.
//!
//! It must be cheap: every call of an exported entry point writes it once
//! and reads it once. Rust's `thread_local!` in a cdylib compiles to the general-dynamic TLS
//! model (a `__tls_get_addr` call per access) and stable Rust cannot choose
//! the model, so the variable is defined in assembly ([`crate::arch`]'s
//! `tls_block!`) and read with the initial-exec model: one GOT load and one
//! access relative to the thread pointer. The linker
//! marks the object `STATIC_TLS`, which an `LD_PRELOAD`ed library (or one
//! dlopened into glibc's surplus static TLS) satisfies.
//!
//! The variable is 48 bytes:
//!
//! | offset | size | what |
//! |---|---|---|
//! | 0 | 4 | the timed call's row ([`CALL_ROW`]): set with its start |
//! | 4 | 4 | the timing flag (see [`crate::timing`]): 1 while a call that reached the `stats` level is being timed |
//! | 8 | 8 | the call site: the return address of the last call of an exported entry point on this thread |
//! | 16 | 4 | the event ring this thread claimed for a recording, plus one (see [`crate::stats::trace`]) |
//! | 20 | 4 | 1 while an application-level call that emitted its Enter is open |
//! | 24 | 8 | the recording (generation) the ring was claimed for |
//! | 32 | 8 | the library mark ([`IN_LIB`]): 0, or the stack pointer of the innermost library gate open on this thread |
//! | 40 | 8 | the timed call's start ([`CALL_START`]): while a call that reached the `stats` level is timed, its start as [`crate::timing`] took it; 0 otherwise |
//!
//! Every exported entry point is a trampoline (`entry!` in
//! [`crate::dispatch`]) that stores the return address at its entry (`[rsp]`
//! on x86_64, `x30` on aarch64), the address its caller's call instruction
//! returns to, at offset 8 ([`SITE`]), then
//! jumps to the first level. The `stats` layer reads it back when it opens
//! a timed call: the application's call site. Calls between levels do not
//! pass through the trampolines (the stack is bound, see
//! [`crate::bind`]), so a tool's own calls never overwrite it.

// The timed call's row and the timing flag of `crate::timing`, then the call site (a
// u64), then the recording's ring, traced flag and generation
// (`crate::stats::trace`), then the library mark, then the timed call's
// start.
tls_block!(48);

/// Byte offset of the call site in the variable; the trampolines' store
/// (`entry!` in [`crate::dispatch`]) takes it as a constant.
pub(crate) const SITE: usize = 8;

/// Byte offset of the library mark; the trampolines' compare takes it as a
/// constant. A gate ([`crate::dispatch`]'s `gate!`) sets it to its own
/// stack pointer around its call of the MPI library, so an entry point
/// called while the stack pointer is below it runs inside the library (the library
/// itself, a component it loaded, or a callback it made) and goes straight
/// to the library, as the MPI library's own calls always have.
pub(crate) const IN_LIB: usize = 32;

/// Byte offset of the timed call's start: the wait records
/// (`crate::stats::waits`) take a send's or a receive's call's enter time
/// from it, so no call pays a second clock read for them.
pub(crate) const CALL_START: usize = 40;

/// Byte offset of the timed call's dispatch row, which the wait records
/// name their call by.
pub(crate) const CALL_ROW: usize = 0;

/// The row of the call being timed on this thread ([`CALL_ROW`]).
///
/// # Safety
/// As for [`in_lib`].
#[inline(always)]
pub(crate) unsafe fn call_row(block: *mut u32) -> u32 {
    // SAFETY: the variable is 48 bytes, 8-byte aligned, the row at 0.
    unsafe { block.cast::<u8>().add(CALL_ROW).cast::<u32>().read() }
}

/// The start of the call being timed on this thread ([`CALL_START`]).
///
/// # Safety
/// As for [`in_lib`].
#[inline(always)]
pub(crate) unsafe fn call_start(block: *mut u32) -> u64 {
    // SAFETY: the variable is 48 bytes, 8-byte aligned, the start at
    // CALL_START.
    unsafe { block.cast::<u8>().add(CALL_START).cast::<u64>().read() }
}

/// Marks a call's start read from the CPU's counter (`crate::timing`'s
/// starts; the others are `CLOCK_MONOTONIC` nanoseconds).
pub(crate) const START_TICKS: u64 = 1 << 63;

/// A timed call's start `t0` (as [`call_start`] reads it) on the wait
/// records' clock: the counter's ticks if `ticks`, else `CLOCK_MONOTONIC`
/// nanoseconds. `None` when it was read on the other one (the counter's
/// first 5 ms) or no call is being timed (0).
#[inline(always)]
pub(crate) fn start_in(t0: u64, ticks: bool) -> Option<u64> {
    match (t0 & START_TICKS != 0, ticks) {
        _ if t0 == 0 => None,
        (true, true) => Some(t0 & !START_TICKS),
        (false, false) => Some(t0),
        _ => None,
    }
}

/// Sets the start and the row of the call being timed.
///
/// # Safety
/// As for [`in_lib`].
#[inline(always)]
pub(crate) unsafe fn set_call(block: *mut u32, start: u64, row: u32) {
    // SAFETY: as in `call_start` and `call_row`.
    unsafe {
        block
            .cast::<u8>()
            .add(CALL_START)
            .cast::<u64>()
            .write(start);
        block.cast::<u8>().add(CALL_ROW).cast::<u32>().write(row);
    }
}

/// The library mark.
///
/// # Safety
/// `block` is this thread's variable ([`slot`]).
#[inline(always)]
pub(crate) unsafe fn in_lib(block: *mut u32) -> usize {
    // SAFETY: the variable is 48 bytes, 8-byte aligned, the mark at IN_LIB.
    unsafe { block.cast::<u8>().add(IN_LIB).cast::<usize>().read() }
}

/// Sets the library mark.
///
/// # Safety
/// As for [`in_lib`].
#[inline(always)]
pub(crate) unsafe fn set_in_lib(block: *mut u32, v: usize) {
    // SAFETY: as in `in_lib`.
    unsafe { block.cast::<u8>().add(IN_LIB).cast::<usize>().write(v) }
}

/// The caller's stack pointer: every frame it calls lies below it.
#[inline(always)]
pub(crate) fn stack_pointer() -> usize {
    crate::arch::stack_pointer()
}

/// The call site the last trampoline on this thread stored.
///
/// # Safety
/// `depth` is this thread's depth variable ([`slot`]).
#[inline(always)]
pub(crate) unsafe fn site(depth: *mut u32) -> u64 {
    // SAFETY: the variable is 48 bytes, 8-byte aligned, the site at SITE.
    unsafe { depth.cast::<u8>().add(SITE).cast::<u64>().read() }
}

/// Sets the call site (the cold path's restore, see `dispatch!`).
///
/// # Safety
/// As for [`site`].
#[inline(always)]
pub(crate) unsafe fn set_site(depth: *mut u32, v: u64) {
    // SAFETY: as in `site`.
    unsafe { depth.cast::<u8>().add(SITE).cast::<u64>().write(v) }
}

/// The address of the calling thread's depth: the thread pointer plus the
/// variable's initial-exec offset. Taken once per call, so the compiler
/// keeps it in a register across the layer's call.
#[inline(always)]
pub(crate) fn slot() -> *mut u32 {
    crate::arch::thread_block()
}

/// [`slot`], recomputed rather than reused: after the layer's call, two
/// instructions are cheaper than a callee-saved register kept across it.
#[inline(always)]
pub(crate) fn slot_again() -> *mut u32 {
    crate::arch::thread_block_again()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_is_given_only_on_the_clock_asked_for() {
        assert_eq!(start_in(START_TICKS | 42, true), Some(42));
        assert_eq!(start_in(START_TICKS | 42, false), None);
        assert_eq!(start_in(42, false), Some(42));
        assert_eq!(start_in(42, true), None);
        assert_eq!(start_in(0, true), None);
        assert_eq!(start_in(0, false), None);
    }
}
