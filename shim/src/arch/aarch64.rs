//! aarch64 (AAPCS64, Linux): see the contract in [`crate::arch`].
//!
//! At the entry of a function `x30` holds the return address (the call
//! site; unsigned even under PAC, which signs in the callee), x0-x7 and the
//! stack from `sp` the arguments, `x8` the indirect result address, and
//! `x16`/`x17` (IP0/IP1) carry nothing: the trampolines use only those two.
//! `x18`, the platform register, is never touched. Indirect jumps go
//! through `x16` or `x17`, the only registers a `bti c` landing pad (or
//! `paciasp`) accepts a `br` from in a BTI-guarded tool or library.
//!
//! It runs under qemu-user (`cargo xtask qemu-shim`, part of `cargo xtask
//! test`), which shows neither Arm's weak memory ordering (TCG on an x86
//! host is stronger) nor other page sizes; it has not run on hardware.

/// The base page sizes Linux runs with here, smallest first (4 KiB on
/// Debian, 16 KiB on Apple silicon and Debian's `-16k` kernels, 64 KiB on
/// RHEL's, common on Grace).
pub(crate) const PAGE_SIZES: &[usize] = &[4096, 16_384, 65_536];

/// `R_AARCH64_ABS64`.
pub(crate) const R_ABS64: u32 = 257;
/// `R_AARCH64_GLOB_DAT`.
pub(crate) const R_GLOB_DAT: u32 = 1025;
/// `R_AARCH64_JUMP_SLOT`.
pub(crate) const R_JUMP_SLOT: u32 = 1026;

/// What glibc adds to the symbol's value when it fills a slot of relocation
/// type `ty` with addend `addend`, or `None` for a type that is not one of
/// the three above. aarch64 writes S + A for all three (A is 0 in practice
/// for GLOB_DAT and JUMP_SLOT).
#[inline(always)]
pub(crate) fn slot_addend(ty: u32, addend: i64) -> Option<usize> {
    match ty {
        R_GLOB_DAT | R_JUMP_SLOT | R_ABS64 => Some(addend as usize),
        _ => None,
    }
}

/// Defines the thread block `mpi_observer_shim_depth`, `$size` bytes of
/// `.tbss`: global so every codegen unit can reach it, hidden so it is not
/// exported.
macro_rules! tls_block {
    ($size:expr) => {
        core::arch::global_asm!(
            ".pushsection .tbss,\"awT\",%nobits",
            ".p2align 3",
            ".globl mpi_observer_shim_depth",
            ".hidden mpi_observer_shim_depth",
            ".type mpi_observer_shim_depth,%object",
            ".size mpi_observer_shim_depth,{size}",
            "mpi_observer_shim_depth:",
            ".zero {size}",
            ".popsection",
            size = const $size,
        );
    };
}

/// The caller's stack pointer.
#[inline(always)]
pub(crate) fn stack_pointer() -> usize {
    let sp: usize;
    // SAFETY: reads a register.
    unsafe {
        core::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags));
    }
    sp
}

/// The address of the calling thread's block: `tpidr_el0` (the thread
/// pointer) plus the variable's initial-exec offset from the GOT.
#[inline(always)]
pub(crate) fn thread_block() -> *mut u32 {
    let p: *mut u32;
    // SAFETY: reads the thread pointer and the GOT entry of the TLS variable
    // `tls_block!` defines; no memory is written.
    unsafe {
        core::arch::asm!(
            "mrs {p}, tpidr_el0",
            "adrp {t}, :gottprel:mpi_observer_shim_depth",
            "ldr {t}, [{t}, #:gottprel_lo12:mpi_observer_shim_depth]",
            "add {p}, {p}, {t}",
            p = out(reg) p,
            t = out(reg) _,
            options(nostack, pure, readonly, preserves_flags),
        );
    }
    p
}

/// [`thread_block`], recomputed: not `pure`, so the compiler cannot reuse a
/// value computed before a call.
#[inline(always)]
pub(crate) fn thread_block_again() -> *mut u32 {
    let p: *mut u32;
    // SAFETY: as in `thread_block`.
    unsafe {
        core::arch::asm!(
            "mrs {p}, tpidr_el0",
            "adrp {t}, :gottprel:mpi_observer_shim_depth",
            "ldr {t}, [{t}, #:gottprel_lo12:mpi_observer_shim_depth]",
            "add {p}, {p}, {t}",
            p = out(reg) p,
            t = out(reg) _,
            options(nostack, readonly, preserves_flags),
        );
    }
    p
}

/// The body of a naked entry point (`entry!` in [`crate::dispatch`]): stores
/// `x30` at `$site` in the thread block; below the block's library mark (at
/// `$in_lib`) jumps through `$raw` + `$roff`, else through `$entry` +
/// `$off`; a null slot goes to `mpi_observer_shim_cold` with `$code` (+ 2
/// from inside the library) in `x16`.
///
/// The slot is loaded with `ldar`: the level it names reads its own GOT,
/// rewritten by the thread that built the stack before it published the
/// slot (Release), and an address or control dependency does not order
/// those later loads on Arm. `ldar` waits only on earlier `stlr`s, and
/// there are none here.
///
/// The `b` to the cold path stays within the shim, far inside its ±128 MiB
/// range, so the linker adds no veneer that could overwrite `x16`.
macro_rules! trampoline_asm {
    (
        entry: $entry:path, off: $off:expr, raw: $raw:path, roff: $roff:expr,
        code: $code:expr, site: $site:expr, in_lib: $in_lib:expr $(,)?
    ) => {
        core::arch::naked_asm!(
            // No stack change and x30 untouched: the caller's frame rule
            // holds at every instruction.
            ".cfi_startproc",
            "mrs x16, tpidr_el0",
            "adrp x17, :gottprel:mpi_observer_shim_depth",
            "ldr x17, [x17, #:gottprel_lo12:mpi_observer_shim_depth]",
            "add x16, x16, x17",
            "str x30, [x16, #{site}]",
            "ldr x17, [x16, #{in_lib}]",
            "cmp sp, x17",
            "b.lo 2f",
            "adrp x16, {entry}+{off}",
            "add x16, x16, #:lo12:{entry}+{off}",
            "ldar x17, [x16]",
            "cbz x17, 3f",
            "br x17",
            "2:",
            "adrp x16, {raw}+{roff}",
            "add x16, x16, #:lo12:{raw}+{roff}",
            "ldar x17, [x16]",
            "cbz x17, 4f",
            "br x17",
            "3:",
            "mov x16, #{code}",
            "b mpi_observer_shim_cold",
            "4:",
            "mov x16, #{code_lib}",
            "b mpi_observer_shim_cold",
            ".cfi_endproc",
            entry = sym $entry,
            raw = sym $raw,
            off = const $off,
            roff = const $roff,
            code = const $code,
            code_lib = const $code + 2,
            site = const $site,
            in_lib = const $in_lib,
        )
    };
}

/// `mpi_observer_shim_cold`: `x16` holds the trampoline's code, x0-x7 and
/// the stack the call's arguments, x8 the indirect result address. Saves
/// them (and q0-q7, which a variadic `MPI_Pcontrol` may use), calls
/// `$target(code)` and jumps to the address it returns with everything as
/// it was. With its unwind information, so a profiler's stack walk through
/// it stays correct.
macro_rules! cold_path {
    ($target:path) => {
        core::arch::global_asm!(
            ".pushsection .text.mpi_observer_shim_cold,\"ax\",%progbits",
            ".p2align 4",
            ".globl mpi_observer_shim_cold",
            ".hidden mpi_observer_shim_cold",
            ".type mpi_observer_shim_cold,%function",
            "mpi_observer_shim_cold:",
            ".cfi_startproc",
            // 224 bytes: x29, x30, x0-x8 (one word spare) and q0-q7.
            "stp x29, x30, [sp, #-224]!",
            ".cfi_def_cfa_offset 224",
            ".cfi_offset x29, -224",
            ".cfi_offset x30, -216",
            "mov x29, sp",
            ".cfi_def_cfa x29, 224",
            "stp x0, x1, [sp, #16]",
            "stp x2, x3, [sp, #32]",
            "stp x4, x5, [sp, #48]",
            "stp x6, x7, [sp, #64]",
            "str x8, [sp, #80]",
            "stp q0, q1, [sp, #96]",
            "stp q2, q3, [sp, #128]",
            "stp q4, q5, [sp, #160]",
            "stp q6, q7, [sp, #192]",
            "mov x0, x16",
            "bl {target}",
            "mov x16, x0",
            "ldp q0, q1, [sp, #96]",
            "ldp q2, q3, [sp, #128]",
            "ldp q4, q5, [sp, #160]",
            "ldp q6, q7, [sp, #192]",
            "ldr x8, [sp, #80]",
            "ldp x6, x7, [sp, #64]",
            "ldp x4, x5, [sp, #48]",
            "ldp x2, x3, [sp, #32]",
            "ldp x0, x1, [sp, #16]",
            "ldp x29, x30, [sp], #224",
            ".cfi_def_cfa sp, 0",
            ".cfi_restore x29",
            ".cfi_restore x30",
            "br x16",
            ".cfi_endproc",
            ".size mpi_observer_shim_cold, . - mpi_observer_shim_cold",
            ".popsection",
            target = sym $target,
        );
    };
}

/// The body of a naked two-argument libc hook: calls `$refresh()`, then
/// jumps through the pointer in `$real` with both arguments and the
/// caller's return address (back in `x30`) as they came, so glibc's
/// `RETURN_ADDRESS(0)` names the real caller.
macro_rules! refresh_then_asm {
    ($refresh:path, $real:path) => {
        core::arch::naked_asm!(
            "stp x29, x30, [sp, #-32]!",
            "mov x29, sp",
            "stp x0, x1, [sp, #16]",
            "bl {refresh}",
            "ldp x0, x1, [sp, #16]",
            "ldp x29, x30, [sp], #32",
            "adrp x16, {real}",
            "ldr x16, [x16, #:lo12:{real}]",
            "br x16",
            refresh = sym $refresh,
            real = sym $real,
        )
    };
}

/// The body of the naked function `$me`, made an IFUNC whose resolver is
/// `$resolver` (which ignores the hwcap arguments aarch64 passes it).
macro_rules! ifunc_asm {
    ($me:path, $resolver:path) => {
        core::arch::naked_asm!(
            ".type {me}, %gnu_indirect_function",
            "b {resolver}",
            me = sym $me,
            resolver = sym $resolver,
        )
    };
}

/// Defines `$name`, the reference to the IFUNC `$ifunc` that makes the linker
/// emit its IRELATIVE relocation. glibc's aarch64 port applies relocations
/// in table order, and a pointer to an IFUNC puts its IRELATIVE in
/// `.rela.dyn`, before `.rela.plt`: the resolver would run while the shim's
/// own PLT slots (`strlen`, `malloc`...) still hold link-time addresses. A
/// branch instead gives the IFUNC a PLT entry, and GNU ld places the
/// IRELATIVE of a local IFUNC's PLT entry after every JUMP_SLOT of
/// `.rela.plt` (it allocates IFUNC entries last). Only TLSDESC relocations
/// follow it, so the resolver must not touch a general-dynamic
/// `thread_local!`. `$name` points at a function that is never called and
/// holds only that branch.
macro_rules! ifunc_reference {
    ($name:ident, $ifunc:path) => {
        /// Never called: its branch is the reference (see `ifunc_reference!`).
        #[unsafe(naked)]
        unsafe extern "C" fn startup_branch() {
            core::arch::naked_asm!("b {f}", f = sym $ifunc)
        }
        /// The reference that makes the linker emit the IRELATIVE relocation.
        #[used]
        pub(crate) static $name: unsafe extern "C" fn() = startup_branch;
    };
}

/// `mprotect(2)` by a raw system call (226, asm-generic): the result, or
/// `-errno`. Touches no libc state (not `errno`, which is thread-local).
///
/// # Safety
/// As `mprotect(2)`: the caller answers for what the new protection does
/// to code and data in the range.
#[inline(always)]
pub(crate) unsafe fn mprotect_raw(addr: usize, len: usize, prot: usize) -> isize {
    let ret: isize;
    // SAFETY: the caller's.
    unsafe {
        core::arch::asm!(
            "svc #0",
            inlateout("x0") addr as isize => ret,
            in("x1") len,
            in("x2") prot,
            in("x8") 226usize,
            options(nostack),
        );
    }
    ret
}

/// The kernel's clocksource when it keeps time with the generic timer's
/// virtual counter.
pub(crate) const COUNTER_CLOCKSOURCE: &[u8] = b"arch_sys_counter\n";

/// The generic timer's virtual count (`cntvct_el0`). Without an `isb`
/// before it, it is as unordered as x86's plain `rdtsc`.
#[inline(always)]
pub(crate) fn ticks() -> u64 {
    let t: u64;
    // SAFETY: reads a register Linux lets user mode read (or emulates,
    // on cores with counter errata).
    unsafe {
        core::arch::asm!("mrs {}, cntvct_el0", out(reg) t, options(nomem, nostack, preserves_flags));
    }
    t
}

/// The counter's frequency (`cntfrq_el0`, which firmware sets), or `None`
/// if it reads 0.
#[inline(always)]
pub(crate) fn counter_hz() -> Option<u64> {
    let f: u64;
    // SAFETY: reads a register user mode may read.
    unsafe {
        core::arch::asm!("mrs {}, cntfrq_el0", out(reg) f, options(nomem, nostack, preserves_flags));
    }
    (f != 0).then_some(f)
}
