//! The per-thread block the entry points and the `stats` layer share.
//!
//! It must be cheap: every call of an exported entry point writes it once
//! and reads it once. Rust's `thread_local!` in a cdylib compiles to the general-dynamic TLS
//! model (a `__tls_get_addr` call per access) and stable Rust cannot choose
//! the model, so the variable is defined in assembly and read with the
//! initial-exec model: one GOT load and one `%fs`-relative access. The linker
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
//! [`crate::dispatch`]) that stores `[rsp]` at its entry, the address its
//! caller's `call` instruction returns to, at offset 8 ([`SITE`]), then
//! jumps to the first level. The `stats` layer reads it back when it opens
//! a timed call: the application's call site. Calls between levels do not
//! pass through the trampolines (the stack is bound, see
//! [`crate::bind`]), so a tool's own calls never overwrite it.

core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    // Global so every codegen unit can reach it, hidden so it is not exported.
    ".globl mpi_observer_shim_depth",
    ".hidden mpi_observer_shim_depth",
    ".type mpi_observer_shim_depth,@object",
    // A spare u32 and the timing flag of `crate::timing`, then the call
    // site (a u64), then the recording's ring, traced flag and generation
    // (`crate::stats::trace`), then the library mark.
    ".size mpi_observer_shim_depth,40",
    "mpi_observer_shim_depth:",
    ".zero 40",
    ".popsection",
);

/// Byte offset of the call site in the variable; the trampolines' store
/// (`entry!` in [`crate::dispatch`]) spells it as a literal `8`.
pub(crate) const SITE: usize = 8;

/// Byte offset of the library mark; the trampolines' compare spells it as a
/// literal `32`. A gate ([`crate::dispatch`]'s `gate!`) sets it to its own
/// stack pointer around its call of the MPI library, so an entry point
/// called while `rsp` is below it runs inside the library (the library
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
    let sp: usize;
    // SAFETY: reads a register.
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags));
    }
    sp
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
