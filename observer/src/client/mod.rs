//! Reading daemons (or Prometheus) back: `mpi-observer top` and `mpi-observer
//! report`, over [`http_get`]. Uses only the report data and the metric
//! names of [`crate::export`].

pub mod http_get;
pub mod report;
pub mod top;
