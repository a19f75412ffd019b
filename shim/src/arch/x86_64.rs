//! x86_64 (System V ABI): see the contract in [`crate::arch`].
//!
//! At the entry of a function `[rsp]` holds the return address (the call
//! site), `rax` the vector count of a variadic call, and `r10` and `r11`
//! carry nothing: the trampolines use only those two.

/// The base page sizes Linux runs with here, smallest first: x86_64 has one.
pub(crate) const PAGE_SIZES: &[usize] = &[4096];

/// `R_X86_64_64`.
pub(crate) const R_ABS64: u32 = 1;
/// `R_X86_64_GLOB_DAT`.
pub(crate) const R_GLOB_DAT: u32 = 6;
/// `R_X86_64_JUMP_SLOT`.
pub(crate) const R_JUMP_SLOT: u32 = 7;

/// What glibc adds to the symbol's value when it fills a slot of relocation
/// type `ty` with addend `addend`, or `None` for a type that is not one of
/// the three above. x86_64 writes S for GLOB_DAT and JUMP_SLOT, and S + A
/// for the absolute word.
#[inline(always)]
pub(crate) fn slot_addend(ty: u32, addend: i64) -> Option<usize> {
    match ty {
        R_GLOB_DAT | R_JUMP_SLOT => Some(0),
        R_ABS64 => Some(addend as usize),
        _ => None,
    }
}

/// Defines the thread block `mpi_observer_shim_depth`, `$size` bytes of
/// `.tbss`: global so every codegen unit can reach it, hidden so it is not
/// exported.
macro_rules! tls_block {
    ($size:expr) => {
        core::arch::global_asm!(
            ".pushsection .tbss,\"awT\",@nobits",
            ".p2align 3",
            ".globl mpi_observer_shim_depth",
            ".hidden mpi_observer_shim_depth",
            ".type mpi_observer_shim_depth,@object",
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
        core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags));
    }
    sp
}

/// The address of the calling thread's block: `%fs:0` (the thread pointer)
/// plus the variable's initial-exec offset.
#[inline(always)]
pub(crate) fn thread_block() -> *mut u32 {
    let p: *mut u32;
    // SAFETY: reads the thread pointer and the GOT entry of the TLS variable
    // `tls_block!` defines; no memory is written.
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

/// [`thread_block`], recomputed: not `pure`, so the compiler cannot reuse a
/// value computed before a call.
#[inline(always)]
pub(crate) fn thread_block_again() -> *mut u32 {
    let p: *mut u32;
    // SAFETY: as in `thread_block`.
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

/// The body of a naked entry point (`entry!` in [`crate::dispatch`]): stores
/// `[rsp]` at `$site` in the thread block; below the block's library mark
/// (at `$in_lib`) jumps through `$raw` + `$roff`, else through `$entry` +
/// `$off`; a null slot goes to `mpi_observer_shim_cold` with `$code` (+ 2
/// from inside the library) in `r10`. Plain loads of the slots suffice: x86
/// keeps stores in order, so a thread that sees a published pointer sees
/// everything written before it.
macro_rules! trampoline_asm {
    (
        entry: $entry:path, off: $off:expr, raw: $raw:path, roff: $roff:expr,
        code: $code:expr, site: $site:expr, in_lib: $in_lib:expr $(,)?
    ) => {
        core::arch::naked_asm!(
            // No stack change: the caller's frame rule (return address at
            // [rsp]) holds at every instruction.
            ".cfi_startproc",
            "mov r10, qword ptr [rip + mpi_observer_shim_depth@GOTTPOFF]",
            "mov r11, qword ptr [rsp]",
            "mov qword ptr fs:[r10 + {site}], r11",
            "cmp rsp, qword ptr fs:[r10 + {in_lib}]",
            "jb 2f",
            "mov r11, qword ptr [rip + {entry} + {off}]",
            "test r11, r11",
            "jz 3f",
            "jmp r11",
            "2:",
            "mov r11, qword ptr [rip + {raw} + {roff}]",
            "test r11, r11",
            "jz 4f",
            "jmp r11",
            "3:",
            "mov r10d, {code}",
            "jmp mpi_observer_shim_cold",
            "4:",
            "mov r10d, {code} + 2",
            "jmp mpi_observer_shim_cold",
            ".cfi_endproc",
            entry = sym $entry,
            raw = sym $raw,
            off = const $off,
            roff = const $roff,
            code = const $code,
            site = const $site,
            in_lib = const $in_lib,
        )
    };
}

/// `mpi_observer_shim_cold`: `r10` holds the trampoline's code, the
/// argument registers and the stack the call's arguments. Saves them (and
/// `rax` and xmm0-7, which a variadic call may use), calls `$target(code)`
/// and jumps to the address it returns with everything as it was. With its
/// unwind information, so a profiler's stack walk through it stays correct.
macro_rules! cold_path {
    ($target:path) => {
        core::arch::global_asm!(
            ".pushsection .text.mpi_observer_shim_cold,\"ax\",@progbits",
            ".p2align 4",
            ".globl mpi_observer_shim_cold",
            ".hidden mpi_observer_shim_cold",
            ".type mpi_observer_shim_cold,@function",
            "mpi_observer_shim_cold:",
            ".cfi_startproc",
            "push rbp",
            ".cfi_adjust_cfa_offset 8",
            ".cfi_rel_offset rbp, 0",
            "mov rbp, rsp",
            ".cfi_def_cfa_register rbp",
            "push rax",
            "push rdi",
            "push rsi",
            "push rdx",
            "push rcx",
            "push r8",
            "push r9",
            // 7 words pushed after rbp: 8 more bytes align the stack for the
            // call below, and 128 hold xmm0-7.
            "sub rsp, 136",
            "movdqu xmmword ptr [rsp], xmm0",
            "movdqu xmmword ptr [rsp + 16], xmm1",
            "movdqu xmmword ptr [rsp + 32], xmm2",
            "movdqu xmmword ptr [rsp + 48], xmm3",
            "movdqu xmmword ptr [rsp + 64], xmm4",
            "movdqu xmmword ptr [rsp + 80], xmm5",
            "movdqu xmmword ptr [rsp + 96], xmm6",
            "movdqu xmmword ptr [rsp + 112], xmm7",
            "mov rdi, r10",
            "call {target}",
            "mov r11, rax",
            "movdqu xmm0, xmmword ptr [rsp]",
            "movdqu xmm1, xmmword ptr [rsp + 16]",
            "movdqu xmm2, xmmword ptr [rsp + 32]",
            "movdqu xmm3, xmmword ptr [rsp + 48]",
            "movdqu xmm4, xmmword ptr [rsp + 64]",
            "movdqu xmm5, xmmword ptr [rsp + 80]",
            "movdqu xmm6, xmmword ptr [rsp + 96]",
            "movdqu xmm7, xmmword ptr [rsp + 112]",
            "add rsp, 136",
            "pop r9",
            "pop r8",
            "pop rcx",
            "pop rdx",
            "pop rsi",
            "pop rdi",
            "pop rax",
            "pop rbp",
            ".cfi_def_cfa rsp, 8",
            ".cfi_restore rbp",
            "jmp r11",
            ".cfi_endproc",
            ".size mpi_observer_shim_cold, . - mpi_observer_shim_cold",
            ".popsection",
            target = sym $target,
        );
    };
}

/// The body of a naked two-argument libc hook: calls `$refresh()`, then
/// jumps through the pointer in `$real` with both arguments and the
/// caller's return address (on the stack) as they came.
macro_rules! refresh_then_asm {
    ($refresh:path, $real:path) => {
        core::arch::naked_asm!(
            // Entry: rsp = 8 mod 16. Two pushes and 8 bytes realign it.
            "push rdi",
            "push rsi",
            "sub rsp, 8",
            "call {refresh}",
            "add rsp, 8",
            "pop rsi",
            "pop rdi",
            "jmp qword ptr [rip + {real}]",
            refresh = sym $refresh,
            real = sym $real,
        )
    };
}

/// The body of the naked function `$me`, made an IFUNC whose resolver is
/// `$resolver`.
macro_rules! ifunc_asm {
    ($me:path, $resolver:path) => {
        core::arch::naked_asm!(
            ".type {me}, @gnu_indirect_function",
            "jmp {resolver}",
            me = sym $me,
            resolver = sym $resolver,
        )
    };
}

/// Defines `$name`, the reference to the IFUNC `$ifunc` that makes the linker
/// emit its IRELATIVE relocation: a pointer to it, whose relocation lands
/// in `.rela.dyn`, which glibc applies after the object's others on x86_64
/// (`ELF_MACHINE_IRELATIVE`).
macro_rules! ifunc_reference {
    ($name:ident, $ifunc:path) => {
        /// The reference that makes the linker emit the IRELATIVE relocation.
        #[used]
        pub(crate) static $name: unsafe extern "C" fn() = $ifunc;
    };
}

/// `mprotect(2)` by a raw system call (10): the result, or `-errno`. Touches
/// no libc state (not `errno`, which is thread-local).
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
            "syscall",
            inlateout("rax") 10isize => ret,
            in("rdi") addr,
            in("rsi") len,
            in("rdx") prot,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// The kernel's clocksource when it keeps time with the TSC, which it only
/// chooses for an invariant, synchronised counter.
pub(crate) const COUNTER_CLOCKSOURCE: &[u8] = b"tsc\n";

/// The time-stamp counter.
#[inline(always)]
pub(crate) fn ticks() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86-64 (user mode may read it
    // unless the kernel sets CR4.TSD, which it does only for seccomp's
    // strict mode, where the kernel's clocksource check fails too).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The counter's frequency: x86 has no architectural register for the
/// TSC's, so the calibration alone decides.
#[inline(always)]
pub(crate) fn counter_hz() -> Option<u64> {
    None
}
