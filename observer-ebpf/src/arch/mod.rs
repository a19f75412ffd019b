//! What the programs read from a probed thread's registers, one file per
//! instruction set: a third architecture is an added file. Each file gives
//! the same three functions:
//! - `word(ctx, n)`: the n-th integer argument at a function's entry, under
//!   that architecture's C calling convention (registers, then the stack);
//! - `return_address(ctx)`: at a function's entry, where it will return
//!   (the caller's code): the call site;
//! - `instruction_pointer(ctx)`: where the probe hit, which at an entry
//!   probe is the probed address (the kernel sets it back to the
//!   breakpoint's address before running the programs).

#[cfg(bpf_target_arch = "aarch64")]
mod aarch64;
#[cfg(bpf_target_arch = "aarch64")]
pub use aarch64::*;

#[cfg(bpf_target_arch = "x86_64")]
mod x86_64;
#[cfg(bpf_target_arch = "x86_64")]
pub use x86_64::*;

// Another instruction set needs its file: the calling convention, the
// link register or stack slot of the return address, and the pt_regs
// layout the kernel gives kprobe-type programs.
#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
compile_error!("observer-ebpf: no arch/ file for this instruction set");
