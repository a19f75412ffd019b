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
//! The variable is 40 bytes:
//!
//! | offset | size | what |
//! |---|---|---|
//! | 0 | 4 | unused (it held the level before the stack was bound, issue 24) |
//! | 4 | 4 | the timing flag (see [`crate::timing`]): 1 while a call that reached the `stats` level is being timed |
//! | 8 | 8 | the call site: the return address of the last call of an exported entry point on this thread |
//! | 16 | 4 | the event ring this thread claimed for a recording, plus one (see [`crate::stats::trace`]) |
//! | 20 | 4 | 1 while an application-level call that emitted its Enter is open |
//! | 24 | 8 | the recording (generation) the ring was claimed for |
//! | 32 | 8 | the library mark ([`IN_LIB`]): 0, or the stack pointer of the innermost library gate open on this thread |
//!
//! Every exported entry point is a trampoline (`entry!` in
//! [`crate::dispatch`]) that stores the return address at its entry (`[rsp]`
//! on x86_64, `x30` on aarch64), the address its caller's call instruction
//! returns to, at offset 8 ([`SITE`]), then
//! jumps to the first level. The `stats` layer reads it back when it opens
//! a timed call: the application's call site. Calls between levels do not
//! pass through the trampolines (the stack is bound, see
//! [`crate::bind`]), so a tool's own calls never overwrite it.

// A spare u32 and the timing flag of `crate::timing`, then the call site (a
// u64), then the recording's ring, traced flag and generation
// (`crate::stats::trace`), then the library mark.
tls_block!(40);

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

/// The library mark.
///
/// # Safety
/// `block` is this thread's variable ([`slot`]).
#[inline(always)]
pub(crate) unsafe fn in_lib(block: *mut u32) -> usize {
    // SAFETY: the variable is 40 bytes, 8-byte aligned, the mark at IN_LIB.
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
    // SAFETY: the variable is 40 bytes, 8-byte aligned, the site at SITE.
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
