//! mpi-observer: attach eBPF probes to the PMPI entry points of running MPI
//! ranks and export exact per-rank statistics to Prometheus.
//!
//! Rooms: [`procfs`] and [`symbols`] find what to probe, [`probes`] attaches
//! and reads the maps back, [`registry`] tracks ranks and collects a
//! [`snapshot`] of them, [`metrics`] renders it, [`daemon`] runs it all,
//! [`server`] speaks HTTP(S) as [`web_config`] says; [`report`] and [`top`]
//! read daemons (or Prometheus) back.

pub mod attacher;
pub mod budget;
pub mod callsites;
pub mod checks;
pub mod cli;
pub mod commands;
pub mod daemon;
pub mod datatypes;
pub mod functions;
pub mod http_get;
pub mod identity;
pub mod inject;
pub mod launcher;
pub mod layout;
pub mod metrics;
pub mod multi;
pub mod probes;
pub mod procevents;
pub mod procfs;
pub mod record;
pub mod registry;
pub mod report;
pub mod segment;
pub mod server;
pub mod shm;
pub mod simulate;
pub mod snapshot;
pub mod summary;
pub mod symbolizer;
pub mod symbols;
pub mod sys;
pub mod top;
pub mod userfile;
pub mod web_config;

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
