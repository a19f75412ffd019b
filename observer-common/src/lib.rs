//! Types shared by the eBPF programs, the `mpi-observer` daemon and the
//! layering shim: the one MPI function ID space, the probe cookie that tells a
//! probe which function it sits on, and the layouts of the BPF maps.
#![no_std]
#![warn(missing_docs)]

pub mod cookie;
pub mod functions;
#[cfg(not(target_arch = "bpf"))]
pub mod inject;
pub mod maps;
pub mod std_abi;
// Atomics the BPF target lacks; the programs never touch the segment.
#[cfg(not(target_arch = "bpf"))]
pub mod segment;
#[cfg(not(target_arch = "bpf"))]
pub mod trace;
#[cfg(not(target_arch = "bpf"))]
pub mod waits;

/// Code generated from the MPI Forum's `apis.json` by `cargo xtask codegen`;
/// do not edit it by hand. Left as generated (one line per procedure), and
/// `codegen --check` compares bytes, so rustfmt stays out.
#[rustfmt::skip]
pub mod generated {
    /// The function table and ID enum.
    pub mod functions;
}

pub use functions::{FunctionInfo, function_by_name};
pub use generated::functions::{FUNCTION_COUNT, FUNCTIONS, FunctionId};
