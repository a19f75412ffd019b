//! The per-thread call depth: the level the current thread is executing in.
//!
//! It must be cheap: every layered call reads it once and writes it twice.
//! Rust's `thread_local!` in a cdylib compiles to the general-dynamic TLS
//! model (a `__tls_get_addr` call per access) and stable Rust cannot choose
//! the model, so the variable is defined in assembly and read with the
//! initial-exec model: one GOT load and one `%fs`-relative access. The linker
//! marks the object `STATIC_TLS`, which an `LD_PRELOAD`ed library (or one
//! dlopened into glibc's surplus static TLS) satisfies.
//!
//! The variable is 32 bytes:
//!
//! | offset | size | what |
//! |---|---|---|
//! | 0 | 4 | the depth |
//! | 4 | 4 | the timing flag (see [`crate::timing`]): 1 while an application-level call is being timed |
//! | 8 | 8 | the call site: the return address of the last call of an exported entry point on this thread |
//! | 16 | 4 | the event ring this thread claimed for a recording, plus one (see [`crate::stats::trace`]) |
//! | 20 | 4 | 1 while an application-level call that emitted its Enter is open |
//! | 24 | 8 | the recording (generation) the ring was claimed for |
//!
//! Every exported entry point is a trampoline (`entry!` in
//! [`crate::dispatch`]) that stores `[rsp]` at its entry, the address its
//! caller's `call` instruction returns to, at offset 8 ([`SITE`]), then
//! jumps to the layered call, which reads it back at once if it times the
//! call (nested calls overwrite it).

core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    // Global so every codegen unit can reach it, hidden so it is not exported.
    ".globl mpi_observer_shim_depth",
    ".hidden mpi_observer_shim_depth",
    ".type mpi_observer_shim_depth,@object",
    // The depth and the timing flag of `crate::timing` (one u32 each),
    // then the call site (a u64), then the recording's ring, traced flag
    // and generation (`crate::stats::trace`).
    ".size mpi_observer_shim_depth,32",
    "mpi_observer_shim_depth:",
    ".zero 32",
    ".popsection",
);

/// Byte offset of the call site in the variable; the trampolines' store
/// (`entry!` in [`crate::dispatch`]) spells it as a literal `8`.
pub(crate) const SITE: usize = 8;

/// The call site the last trampoline on this thread stored.
///
/// # Safety
/// `depth` is this thread's depth variable ([`slot`]).
#[inline(always)]
pub(crate) unsafe fn site(depth: *mut u32) -> u64 {
    // SAFETY: the variable is 16 bytes, 8-byte aligned, the site at SITE.
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

/// The address of the calling thread's depth: `%fs:0` (the thread pointer)
/// plus the variable's initial-exec offset. Taken once per call, so the
/// compiler keeps it in a register across the layer's call.
#[inline(always)]
pub(crate) fn slot() -> *mut u32 {
    let p: *mut u32;
    // SAFETY: reads the thread pointer and the GOT entry of the TLS variable
    // defined above; no memory is written.
    unsafe {
        core::arch::asm!(
            "mov {p}, qword ptr fs:[0]",
            "add {p}, qword ptr [rip + mpi_observer_shim_depth@GOTTPOFF]",
            p = out(reg) p,
            options(nostack, pure, readonly),
        );
    }
    p
}

/// [`slot`], recomputed rather than reused: after the layer's call, two
/// instructions are cheaper than a callee-saved register kept across it.
#[inline(always)]
pub(crate) fn slot_again() -> *mut u32 {
    let p: *mut u32;
    // SAFETY: as in `slot`; not `pure`, so the compiler cannot reuse the
    // value computed before the call.
    unsafe {
        core::arch::asm!(
            "mov {p}, qword ptr fs:[0]",
            "add {p}, qword ptr [rip + mpi_observer_shim_depth@GOTTPOFF]",
            p = out(reg) p,
            options(nostack, readonly),
        );
    }
    p
}

/// The calling thread's current level; 0 on a new thread.
#[inline(always)]
pub(crate) fn get() -> u32 {
    // SAFETY: `slot` is this thread's live, aligned TLS variable.
    unsafe { slot().read() }
}

/// Sets the calling thread's current level.
#[inline(always)]
pub(crate) fn set(v: u32) {
    // SAFETY: as in `get`; the variable is private to this thread.
    unsafe { slot().write(v) }
}
