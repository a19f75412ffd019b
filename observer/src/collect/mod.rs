//! Collecting: the ranks the daemon follows and one collection of their
//! figures. Uses [`crate::os`] and [`crate::attach`].
//!
//! [`snapshot`] is the leaf that owns the shared types (a collection's
//! facts); [`registry`] tracks ranks and takes a snapshot of them from the
//! probes' maps, the stats [`segment`]s and the [`callsites`]; [`launcher`]
//! is the shim's launcher (`mpi-observer run`) and its tools list;
//! [`qmpi_flags`] finds what a QMPI tool is built with; [`waits`] matches
//! the shim's wait records into wait states.

pub mod callsites;
pub mod launcher;
pub mod qmpi_flags;
pub mod segment;
pub mod snapshot;
pub mod waits;
