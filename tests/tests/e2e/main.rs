//! The end-to-end suite as one test binary: every area is a module, so the
//! suite builds and links once instead of once per file (as aya's
//! integration tests do). Run one area with its module path as the filter:
//! `cargo test --release -p e2e --test e2e -- inject:: --test-threads=1`.
//!
//! Tests run one at a time (`--test-threads=1`): they share BPF, mpirun,
//! ports and two cores, and several check that no probe of theirs is left.

mod advice;
mod callers;
mod callsites;
mod cluster;
mod exposition;
mod foreign;
mod handover;
mod identity;
mod inject;
mod kernels;
mod kmaps;
mod mpi4py;
mod net;
mod observer;
mod observer_abi;
mod package;
mod pidns;
mod qmpi;
mod qmpi_header;
mod record;
mod restart;
mod scale;
mod scheduler_labels;
mod security;
mod shim;
mod shim_symbols;
mod shim_timing;
mod shortjobs;
mod sites;
mod slurm;
mod stats;
mod stats_abi;
mod stats_unknown_abi;
mod symbolize_attacks;
mod top;
mod waits;
mod waits_nodes;
mod web;
