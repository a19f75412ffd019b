//! The metric names that more than one module speaks: the renderer
//! ([`crate::export::metrics`]) writes them and `top`
//! (`crate::client::top`) reads them back, so both take them from here and
//! a rename cannot leave one side behind (README, Metrics).

/// One series per observed rank: pid, world size, library (README, Metrics).
pub const RANK_INFO: &str = "mpi_rank_info";
/// 1 while the rank runs, 0 once it exited.
pub const RANK_UP: &str = "mpi_rank_up";
/// Completed calls per function.
pub const CALLS: &str = "mpi_calls_total";
/// Time inside completed calls per function.
pub const SECONDS: &str = "mpi_call_seconds_total";
/// Bytes per function and direction, from the probes.
pub const BYTES: &str = "mpi_bytes_total";
/// Bytes per function and direction, from the shim's `stats` layer: the
/// only bytes of a rank timed by the shim (`attach --shim-timing`).
pub const LAYER_BYTES: &str = "mpi_layer_bytes_total";
/// Point-to-point bytes per peer and direction (`stats` layer).
pub const PEER_BYTES: &str = "mpi_peer_bytes_total";
/// Seconds inside completed calls, all functions: every rank has it on the
/// bounded /metrics, where per-function series are the detail ranks' only.
pub const RANK_MPI_SECONDS: &str = "mpi_rank_mpi_seconds_total";
/// Requests started and not completed (`stats` layer).
pub const OUTSTANDING: &str = "mpi_requests_outstanding";
/// Age of the oldest outstanding request (`stats` layer).
pub const OLDEST_AGE: &str = "mpi_request_oldest_age_seconds";

/// Seconds a job's ranks on a node waited for late ranks, per wait-state
/// pattern (`stats` layer, docs/waits.md): a job-level series of the
/// bounded `/metrics`.
pub const WAIT_SECONDS: &str = "mpi_job_wait_seconds_total";
/// The world rank the others waited for most over the last minute, as the
/// value, per `k` (1 the most).
pub const WAIT_CULPRIT: &str = "mpi_job_wait_culprit_rank";
/// How much that rank made the others wait, in seconds per second.
pub const WAIT_CULPRIT_FRACTION: &str = "mpi_job_wait_culprit_fraction_1m";
/// The job-level wait-state series `top` reads from `/metrics`.
pub const WAIT_METRICS: [&str; 3] = [WAIT_SECONDS, WAIT_CULPRIT, WAIT_CULPRIT_FRACTION];

/// The counters whose rates `top` shows.
pub const COUNTERS: [&str; 7] = [
    CALLS,
    SECONDS,
    BYTES,
    LAYER_BYTES,
    PEER_BYTES,
    RANK_MPI_SECONDS,
    WAIT_SECONDS,
];
/// Every series `top` reads.
pub const METRICS: [&str; 13] = [
    RANK_INFO,
    RANK_UP,
    RANK_MPI_SECONDS,
    CALLS,
    SECONDS,
    BYTES,
    LAYER_BYTES,
    PEER_BYTES,
    OUTSTANDING,
    OLDEST_AGE,
    WAIT_SECONDS,
    WAIT_CULPRIT,
    WAIT_CULPRIT_FRACTION,
];

/// The first line of `/metrics/ranks`, a comment: how a reader (`top
/// --endpoint`) knows an observer answered, with no self-metrics to tell.
pub const RANKS_MARK: &str =
    "# mpi-observer: the full per-rank series of this node (/metrics/ranks)";
