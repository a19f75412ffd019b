//! mpi-observer: attach eBPF probes to the PMPI entry points of running MPI
//! ranks and export exact per-rank statistics to Prometheus.
//!
//! Rooms, one folder each, in the order they may use each other
//! (docs/architecture.md; `cargo xtask layout` enforces it):
//!
//! - [`os`]: `/proc`, the trusted `/dev/shm` mapping under the SIGBUS
//!   guard, the clock, the host name, raw system calls;
//! - [`attach`]: what to probe in a rank and how (symbols, functions,
//!   datatypes, identity, probes, budgets, the symbolizer, the shim
//!   injection's mechanism);
//! - [`collect`]: one collection's facts ([`collect::snapshot`], the leaf
//!   owning the shared types), the stats segments, the call sites, the
//!   shim's launcher;
//! - [`export`]: the ranks the daemon follows ([`export::registry`]), the
//!   metric names in one place, the exposition, the HTTP(S) server, the
//!   report data;
//! - [`daemon`]: `attach` itself, its attacher thread, the injection
//!   workflow, and the dispatch of every command.
//!
//! os <- attach <- collect <- export <- daemon; beside them, [`record`]
//! (`mpi-observer record`) uses only os and attach, and [`client`] (`top`,
//! `report`) only the report data and the metric names. At the top level:
//! this file, main.rs and [`cli`].

pub mod attach;
pub mod cli;
pub mod client;
pub mod collect;
pub mod daemon;
pub mod export;
pub mod os;
pub mod record;

/// The eBPF object built by build.rs.
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/observer-ebpf"));

/// Prints an error and its causes as one line.
pub fn one_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s.replace('\n', " ")
}
