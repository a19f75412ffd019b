//! Everything the shim says in one instruction set's terms, one file per
//! ISA (`x86_64.rs`, `aarch64.rs`) with the same item names, chosen by
//! `target_arch` (as observer-ebpf's `arch` and mpiP's `arch/arch.h`).
//! Adding an ISA is adding a file that defines the contract below.
//!
//! A leaf: the macros take every symbol they reach as a `sym` path from
//! their caller, so this module uses no other.
//!
//! The contract:
//!
//! - Pages: [`PAGE_SIZES`], the base page sizes Linux runs with on the ISA.
//! - Relocations: [`R_ABS64`], [`R_GLOB_DAT`], [`R_JUMP_SLOT`] (the numbers
//!   of `Elf64_Rela::r_info`'s low half) and [`slot_addend`], what the
//!   dynamic linker adds to the symbol's value for each of them.
//! - The thread block ([`crate::depth`] keeps its layout): `tls_block!(size)`
//!   defines `mpi_observer_shim_depth` in `.tbss`; [`thread_block`] and
//!   [`thread_block_again`] compute its address with the initial-exec
//!   model; [`stack_pointer`].
//! - The entry points ([`crate::dispatch`]): `trampoline_asm!` is the body of
//!   every naked entry point, `cold_path!` the global `mpi_observer_shim_cold`
//!   they jump to with the code in the ISA's first scratch register.
//! - The dynamic loader ([`crate::exports`]): `refresh_then_asm!`, the body
//!   of the `dlopen`/`dlsym` hooks; `ifunc_asm!`, the startup IFUNC;
//!   [`mprotect_raw`], `mprotect(2)` without libc.
//! - The clock ([`crate::timing`]): [`ticks`], the counter;
//!   [`COUNTER_CLOCKSOURCE`], the kernel's clocksource name when it keeps
//!   time with that counter; [`counter_hz`], the counter's frequency where
//!   the ISA says it.

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
compile_error!(
    "the shim runs on Linux on x86_64 or aarch64: add shim/src/arch/<isa>.rs for another ISA"
);

#[cfg(target_arch = "aarch64")]
#[macro_use]
mod aarch64;
#[cfg(target_arch = "x86_64")]
#[macro_use]
mod x86_64;

#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::*;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::*;
