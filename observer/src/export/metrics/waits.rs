//! The wait-state families (issue 37, docs/waits.md): per job and node, a
//! fixed set of series whatever the ranks, from the matcher's figures
//! ([`crate::collect::waits`]). Ranks are values, never labels: the culprit
//! is the gauge `mpi_job_wait_culprit_rank`, so a 64 k-rank job costs the
//! same few series as a 2-rank one.

use super::budget::{Family, Tier};
use crate::{
    collect::{
        snapshot::{Labels, RankSnapshot},
        waits::{Pattern, Unresolved, Waits},
    },
    export::names,
};

const T: Tier = Tier::Job;

/// Seconds from nanoseconds, for the exposition.
fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Every wait-state family of the jobs in `waits`.
pub fn families(fams: &mut Vec<Family>, waits: &Waits) {
    let mut seconds = Family::new(
        names::WAIT_SECONDS,
        "counter",
        "Seconds this node's ranks of the job waited in MPI for a late rank, per wait-state pattern (Scalasca's: wait_barrier, wait_nxn, late_broadcast, early_reduce from blocking collectives, late_sender and late_receiver from point-to-point messages, on MPI_COMM_WORLD and the communicators made from it that the shim follows); sampled instances times the sampling period. Instances and messages with ranks on other nodes are evaluated when those nodes' daemons ship their records (--waits.peers), else counted in mpi_job_wait_unresolved_total; each node counts its own ranks' waits.",
    );
    let mut instances = Family::new(
        "mpi_job_wait_instances_total",
        "counter",
        "Sampled instances evaluated for wait states, per pattern: collective instances, for late_sender the blocking calls that completed sampled receives, and for late_receiver the sampled messages whose send completed in MPI_Send or MPI_Ssend and the calls of the Wait family that completed sampled nonblocking sends.",
    );
    let mut unresolved = Family::new(
        "mpi_job_wait_unresolved_total",
        "counter",
        "Sampled collective instances and messages not evaluated, by reason: incomplete (a part never came: a rank on another node whose daemon ships no records to this one, or without the shim's records, or its record was lost), mismatch (the parts disagree: a collective's function, root or communicator size, a message's size, or a message received before it was sent), overflow (too many waited for parts), clock (their times cannot be compared: different clocks, or the CPU counter's rate never given; across nodes, a wait shorter than mpi_job_wait_clock_uncertainty_seconds, one per waiting rank), skipped (messages a rank did not record: it had lost count of its messages, the call's start was not on the ring's clock, or the envelope found no room in its table).",
    );
    let mut lost = Family::new(
        "mpi_job_wait_records_lost_total",
        "counter",
        "Wait records this node's ranks wrote that the daemon could not read: their ring lapped it, or changed under it.",
    );
    let mut invalid = Family::new(
        "mpi_job_wait_records_invalid_total",
        "counter",
        "Wait records no shim of this version writes (unknown kind or flags, not a collective, a communicator size out of range, a root or peer out of range, a second record of one instance or message, time running backwards): not matched.",
    );
    let mut period = Family::new(
        "mpi_job_wait_sample_period",
        "gauge",
        "The job's ranks record one blocking collective in this many on each communicator (MPI_OBSERVER_WAITS).",
    );
    let mut p2p_period = Family::new(
        "mpi_job_wait_p2p_sample_period",
        "gauge",
        "The job's ranks record one point-to-point message in this many per envelope (MPI_OBSERVER_WAITS_P2P); absent while none records messages.",
    );
    let mut culprit = Family::new(
        names::WAIT_CULPRIT,
        "gauge",
        "The world rank (as the value) that made the job's other ranks wait the k-th longest over the last minute, all patterns (k 1 to 3), as their root cause: its own lateness, and the waits of ranks that were late only from waiting for it (docs/waits.md, Root causes); absent when nobody waited.",
    );
    let mut culprit_rate = Family::new(
        names::WAIT_CULPRIT_FRACTION,
        "gauge",
        "Seconds of wait per second that mpi_job_wait_culprit_rank of the same k caused over the last minute (or since the job's first record, if younger): can exceed 1 when it made several ranks wait.",
    );
    let mut waiter = Family::new(
        "mpi_job_wait_waiting_rank",
        "gauge",
        "The world rank (as the value) that waited the k-th longest for late ranks over the last minute, all patterns (k 1 to 3); absent when nobody waited.",
    );
    let mut waiter_rate = Family::new(
        "mpi_job_wait_waiting_fraction_1m",
        "gauge",
        "Seconds per second that mpi_job_wait_waiting_rank of the same k waited over the last minute (or since the job's first record, if younger).",
    );
    let mut uncertainty = Family::new(
        "mpi_job_wait_clock_uncertainty_seconds",
        "gauge",
        "For a job whose ranks are on other nodes too (their daemons ship their records, --waits.peers): the largest uncertainty of those nodes' clock offsets to this node's, as the records bound them (half the interval; +Inf while a side is unbounded). Waits shorter than it count as unresolved{reason=\"clock\"}, never as waits. Absent for a job on this node only.",
    );
    let mut jobs: Vec<_> = waits.all().collect();
    jobs.sort_unstable_by_key(|(job, _)| *job);
    for (job, w) in jobs {
        for p in Pattern::ALL {
            let i = p as usize;
            let l = p.label();
            seconds.line(
                T,
                format_args!(
                    "mpi_job_wait_seconds_total{{{job},pattern=\"{l}\"}} {}",
                    secs(w.waited_ns[i])
                ),
            );
            instances.line(
                T,
                format_args!(
                    "mpi_job_wait_instances_total{{{job},pattern=\"{l}\"}} {}",
                    w.instances[i]
                ),
            );
        }
        for (i, r) in Unresolved::ALL.iter().enumerate() {
            unresolved.line(
                T,
                format_args!(
                    "mpi_job_wait_unresolved_total{{{job},reason=\"{}\"}} {}",
                    r.label(),
                    w.unresolved[i]
                ),
            );
        }
        lost.line(
            T,
            format_args!(
                "mpi_job_wait_records_lost_total{{{job}}} {}",
                w.records_lost
            ),
        );
        invalid.line(
            T,
            format_args!(
                "mpi_job_wait_records_invalid_total{{{job}}} {}",
                w.records_invalid
            ),
        );
        period.line(
            T,
            format_args!("mpi_job_wait_sample_period{{{job}}} {}", w.sample_period),
        );
        if w.p2p_sample_period != 0 {
            p2p_period.line(
                T,
                format_args!(
                    "mpi_job_wait_p2p_sample_period{{{job}}} {}",
                    w.p2p_sample_period
                ),
            );
        }
        if let Some(ns) = w.clock_uncertainty_ns {
            uncertainty.line(
                T,
                format_args!(
                    "mpi_job_wait_clock_uncertainty_seconds{{{job}}} {}",
                    if ns.is_finite() {
                        (ns / 1e9).to_string()
                    } else {
                        "+Inf".to_string()
                    }
                ),
            );
        }
        for (i, (rank, rate)) in w.culprits.iter().enumerate() {
            let k = i + 1;
            culprit.line(
                T,
                format_args!("mpi_job_wait_culprit_rank{{{job},k=\"{k}\"}} {rank}"),
            );
            culprit_rate.line(
                T,
                format_args!("mpi_job_wait_culprit_fraction_1m{{{job},k=\"{k}\"}} {rate}"),
            );
        }
        for (i, (rank, rate)) in w.waiters.iter().enumerate() {
            let k = i + 1;
            waiter.line(
                T,
                format_args!("mpi_job_wait_waiting_rank{{{job},k=\"{k}\"}} {rank}"),
            );
            waiter_rate.line(
                T,
                format_args!("mpi_job_wait_waiting_fraction_1m{{{job},k=\"{k}\"}} {rate}"),
            );
        }
    }
    fams.extend([
        seconds,
        instances,
        unresolved,
        lost,
        invalid,
        period,
        p2p_period,
        culprit,
        culprit_rate,
        waiter,
        waiter_rate,
        uncertainty,
    ]);
}

/// The per-rank wait-state families of `ranks` (the full per-rank series:
/// `/metrics/ranks`, the detail ranks, every rank with
/// `--per-rank-detail`): what each rank waited, and what others waited
/// with it as their root cause, per pattern. A pattern appears once it is
/// not zero, so a rank costs as many series as the patterns it met.
pub fn ranks(fams: &mut Vec<Family>, ranks: &[&RankSnapshot], waits: &Waits) {
    let d = Tier::Detail;
    let mut waited = Family::new(
        "mpi_rank_wait_seconds_total",
        "counter",
        "Seconds this rank waited in MPI for a late rank, per wait-state pattern (as mpi_job_wait_seconds_total, for one rank); present once not zero.",
    );
    let mut caused = Family::new(
        "mpi_rank_wait_caused_seconds_total",
        "counter",
        "Seconds other ranks waited with this rank as their root cause (its own lateness, and what ranks late only from waiting for it passed on: docs/waits.md, Root causes), per pattern of the wait; present once not zero.",
    );
    for r in ranks {
        // A process whose rank another of its job also claims was given
        // a label of its own (`rank="0#pid…"`): the figures are the
        // rank's, shown once, under its own label.
        let Ok(rank) = r.identity.rank.parse::<u32>() else {
            continue;
        };
        if r.labels != Labels::new(&r.identity) {
            continue;
        }
        let Some(w) = waits
            .figures(&r.labels.job)
            .and_then(|j| j.ranks.get(&rank))
        else {
            continue;
        };
        for p in Pattern::ALL {
            let (i, l) = (p as usize, p.label());
            if w.waited_ns[i] > 0 {
                waited.line(
                    d,
                    format_args!(
                        "mpi_rank_wait_seconds_total{{{},pattern=\"{l}\"}} {}",
                        r.labels.rank,
                        secs(w.waited_ns[i])
                    ),
                );
            }
            if w.caused_ns[i] > 0 {
                caused.line(
                    d,
                    format_args!(
                        "mpi_rank_wait_caused_seconds_total{{{},pattern=\"{l}\"}} {}",
                        r.labels.rank,
                        secs(w.caused_ns[i])
                    ),
                );
            }
        }
    }
    fams.extend([waited, caused]);
}
