//! `mpi-observer record`: OTF2 traces of running ranks, on demand.
//!
//! [`archive`] writes the OTF2 archive through Debian's libotf2; `slice`
//! cuts it at points every rank recorded.

pub mod archive;
pub mod command;
pub mod shim;
mod slice;
