//! Exporting a collection: to Prometheus, to the report data, to the demo's
//! table. Uses [`crate::os`], [`crate::attach`] and [`crate::collect`].
//!
//! [`metrics`] renders a snapshot as the exposition, [`server`] serves it
//! over HTTP(S) as [`web_config`] says, [`summary`] prints the live table,
//! and [`simulate`] runs many synthetic nodes through the same path.

pub mod metrics;
pub mod names;
pub mod registry;
pub mod report;
pub mod server;
pub mod simulate;
pub mod summary;
pub mod web_config;
