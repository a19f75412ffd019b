//! Job-level families: per job and node, summed over this node's ranks of
//! the job (saturating), so that the default `/metrics` costs a small
//! constant per rank whatever the functions, call sites and peers. The
//! ranks' MPI fractions are exported as a distribution: a dashboard draws
//! 64 k ranks from a few series.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt::Write as _,
    time::{Duration, SystemTime},
};

use observer_common::{FUNCTIONS, maps::CallStats};

use super::{
    budget::{Family, Tier},
    departed::DepartedJobs,
    detail, directions, histogram,
    peers::{add, peer_node},
    rank::{Labelled, SEGMENT_COUNTERS, rank_sites},
    window::Recent,
};
use crate::{
    collect::snapshot::Directed,
    collect::snapshot::{RankSnapshot, escape},
};

/// The bounds of `mpi_job_rank_mpi_fraction_bucket`, `+Inf` besides.
pub const FRACTION_BOUNDS: [&str; 11] = [
    "0.05", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "0.95",
];

/// The job-level names of [`SEGMENT_COUNTERS`], in their order.
const JOB_SEGMENT_COUNTERS: [&str; 7] = [
    "mpi_job_requests_started_total",
    "mpi_job_requests_completed_total",
    "mpi_job_requests_cancelled_total",
    "mpi_job_request_table_full_total",
    "mpi_job_callsite_table_full_total",
    "mpi_job_peer_overflow_messages_total",
    "mpi_job_unattributed_messages_total",
];

const T: Tier = Tier::Job;

/// The per-job latency histograms (unchanged from before issue 22).
pub fn histograms(hist: &mut Family, ranks: &[Labelled<'_>], departed: &DepartedJobs) {
    let per_job = call_sums(ranks, departed);
    for ((job, id), st) in &per_job {
        hist.group(T, |out| histogram(out, job, *id, st));
    }
}

/// Every job-level family but the histogram, of `ranks` (all this node's),
/// `node` naming this node in peer traffic.
pub fn families(
    fams: &mut Vec<Family>,
    ranks: &[RankSnapshot],
    labelled: &[Labelled<'_>],
    node: &str,
    now: SystemTime,
    recent: &Recent,
    departed: &DepartedJobs,
) {
    scheduler(fams, ranks);
    calls(fams, labelled, departed);
    callsites(fams, labelled, departed);
    distribution(fams, ranks, now, recent, departed);
    segments(fams, ranks, node, departed);
}

/// `mpi_job_scheduler_info`: one series per job and node with the
/// scheduler's facts of the job, those of its lowest running rank here
/// that has any, else its lowest exited one (ranks that disagree are counted as they register, see
/// `mpi_observer_scheduler_conflicts_total`). Every label is always there,
/// `""` when the scheduler did not say: Prometheus stores that as absent.
fn scheduler(fams: &mut Vec<Family>, ranks: &[RankSnapshot]) {
    let mut info = Family::new(
        "mpi_job_scheduler_info",
        "gauge",
        "The batch scheduler's facts of the job (scheduler slurm, pbs or flux; step, user, account, partition (PBS: queue), array_job, array_task; \"\" when not given), from its lowest running (else exited) rank on this node, claimed by the ranks' environment; one series per job and node: join on (instance, jobid, uid), e.g. mpi_job_calls_total * on(instance, jobid, uid) group_left(partition) mpi_job_scheduler_info.",
    );
    let mut jobs: BTreeMap<&str, &RankSnapshot> = BTreeMap::new();
    for r in ranks.iter().filter(|r| r.identity.scheduler.is_some()) {
        let e = jobs.entry(r.labels.job.as_str()).or_insert(r);
        if lowest_first(r) < lowest_first(e) {
            *e = r;
        }
    }
    for (job, r) in &jobs {
        let Some(f) = &r.identity.scheduler else {
            continue;
        };
        let mut labels = String::with_capacity(256);
        for (name, v) in f.labels() {
            let _ = write!(labels, ",{name}=\"{}\"", escape(v));
        }
        info.line(T, format_args!("mpi_job_scheduler_info{{{job}{labels}}} 1"));
    }
    fams.push(info);
}

/// The order in which a job's ranks speak for it: running ranks first
/// (a job's next step on this node follows its last), then numeric world
/// ranks, lowest first, then by rank label, then pid.
fn lowest_first(r: &RankSnapshot) -> (bool, bool, u32, &str, u32) {
    let n = r.identity.rank.parse::<u32>().ok();
    (
        !r.running(),
        n.is_none(),
        n.unwrap_or(0),
        r.labels.rank.as_str(),
        r.pid,
    )
}

/// Per (job, function): the ranks' statistics summed, with the job's
/// departed ranks'.
fn call_sums<'a>(
    labelled: &[Labelled<'a>],
    departed: &'a DepartedJobs,
) -> BTreeMap<(&'a str, u16), CallStats> {
    let mut sums: BTreeMap<(&str, u16), CallStats> = BTreeMap::new();
    for (r, s) in labelled {
        for (id, st) in s.iter() {
            sums.entry((r.labels.job.as_str(), *id))
                .or_insert(CallStats::ZERO)
                .add(st);
        }
    }
    for (job, d) in departed.iter() {
        for (id, st) in &d.calls {
            sums.entry((job, *id)).or_insert(CallStats::ZERO).add(st);
        }
    }
    sums
}

fn calls(fams: &mut Vec<Family>, labelled: &[Labelled<'_>], departed: &DepartedJobs) {
    let sums = call_sums(labelled, departed);
    let mut calls = Family::always(
        "mpi_job_calls_total",
        "counter",
        "MPI calls completed by this node's ranks of the job, per function (outermost calls only): the sum of their mpi_calls_total.",
    );
    let mut seconds = Family::always(
        "mpi_job_call_seconds_total",
        "counter",
        "Time this node's ranks of the job spent inside completed MPI calls, per function.",
    );
    let mut bytes = Family::always(
        "mpi_job_bytes_total",
        "counter",
        "Bytes in the data arguments of completed calls of this node's ranks of the job, per function and direction (as mpi_bytes_total).",
    );
    let mut unknown = Family::always(
        "mpi_job_bytes_unknown_calls_total",
        "counter",
        "Completed calls of this node's ranks of the job whose byte figure could not be known exactly (as mpi_bytes_unknown_calls_total); absent while zero.",
    );
    let mut fs = [&mut calls, &mut seconds, &mut bytes, &mut unknown];
    for ((job, id), st) in &sums {
        super::rank::call_lines(&mut fs, "mpi_job_", job, T, *id, st);
    }
    fams.extend([calls, seconds, bytes, unknown]);
}

fn callsites(fams: &mut Vec<Family>, labelled: &[Labelled<'_>], departed: &DepartedJobs) {
    // Per rank by today's rule (its named sites, then `other`), then summed
    // by site name.
    let mut sums: BTreeMap<(&str, u16, &str), (u64, u64)> = BTreeMap::new();
    for (r, calls) in labelled {
        for (id, site, (n, ns)) in rank_sites(r, calls) {
            let s = sums.entry((r.labels.job.as_str(), id, site)).or_default();
            s.0 = s.0.saturating_add(n);
            s.1 = s.1.saturating_add(ns);
        }
    }
    for (job, d) in departed.iter() {
        for ((id, site), (n, ns)) in &d.sites {
            let s = sums.entry((job, *id, site.as_str())).or_default();
            s.0 = s.0.saturating_add(*n);
            s.1 = s.1.saturating_add(*ns);
        }
    }
    let mut calls = Family::new(
        "mpi_job_callsite_calls_total",
        "counter",
        "MPI calls completed by this node's ranks of the job per function and call site (as mpi_callsite_calls_total, summed by site name; callsite=\"other\" sums each rank's other).",
    );
    let mut seconds = Family::new(
        "mpi_job_callsite_seconds_total",
        "counter",
        "Time inside completed MPI calls of this node's ranks of the job per function and call site, as mpi_job_callsite_calls_total.",
    );
    for ((job, id, site), (n, ns)) in &sums {
        let (f, s) = (FUNCTIONS[*id as usize].name, escape(site));
        calls.line(
            T,
            format_args!(
                "mpi_job_callsite_calls_total{{{job},function=\"{f}\",callsite=\"{s}\"}} {n}"
            ),
        );
        seconds.line(
            T,
            format_args!(
                "mpi_job_callsite_seconds_total{{{job},function=\"{f}\",callsite=\"{s}\"}} {}",
                *ns as f64 / 1e9
            ),
        );
    }
    fams.extend([calls, seconds]);
}

/// `mpi_job_ranks` and the distribution of the ranks' MPI fractions.
/// The extremes of one job's fractions on this node: (fraction, world
/// rank) of the highest and the lowest. Ties go to the rank seen first.
#[derive(Clone, Copy, Default)]
struct Extremes(Option<((f64, f64), (f64, f64))>);

impl Extremes {
    fn add(&mut self, fraction: f64, rank: f64) {
        let e = self.0.get_or_insert(((fraction, rank), (fraction, rank)));
        if fraction > e.0.0 {
            e.0 = (fraction, rank);
        }
        if fraction < e.1.0 {
            e.1 = (fraction, rank);
        }
    }

    /// The gauges `{name}_max`, `{name}_max_rank`, `{name}_min`,
    /// `{name}_min_rank` of one job, into `fams` in that order.
    fn lines(&self, fams: &mut [Family; 4], name: &str, job: &str) {
        let Some(((hi, hi_rank), (lo, lo_rank))) = self.0 else {
            return;
        };
        for (f, (suffix, v)) in fams.iter_mut().zip([
            ("max", hi),
            ("max_rank", hi_rank),
            ("min", lo),
            ("min_rank", lo_rank),
        ]) {
            f.line(T, format_args!("{name}_{suffix}{{{job}}} {v}"));
        }
    }
}

fn distribution(
    fams: &mut Vec<Family>,
    ranks: &[RankSnapshot],
    now: SystemTime,
    recent: &Recent,
    departed: &DepartedJobs,
) {
    #[derive(Default)]
    struct Job {
        running: u64,
        exited: u64,
        fractions: Vec<f64>,
        mpi_ns: u64,
        lifetime: Extremes,
        minute: Extremes,
    }
    let mut jobs: BTreeMap<&str, Job> = BTreeMap::new();
    for r in ranks {
        let j = jobs.entry(r.labels.job.as_str()).or_default();
        if r.running() {
            j.running += 1;
        } else {
            j.exited += 1;
        }
        let f = detail::mpi_fraction(r, now);
        j.fractions.push(f);
        j.mpi_ns = j.mpi_ns.saturating_add(detail::mpi_ns(r));
        j.lifetime.add(f, world_rank(r));
        if let Some(&m) = recent.get(&r.pid) {
            j.minute.add(m, world_rank(r));
        }
    }
    let mut count = Family::always(
        "mpi_job_ranks",
        "gauge",
        "This node's observed ranks of the job, by state: running, or exited (kept for --retain-exited).",
    );
    let mut mpi = Family::always(
        "mpi_job_mpi_seconds_total",
        "counter",
        "Time this node's ranks of the job spent inside completed MPI calls, all functions: the sum of their mpi_rank_mpi_seconds_total (one series per job and node for the job's MPI time).",
    );
    // TYPE histogram rather than gauge: promtool (and other linters) refuse
    // `_bucket` and `le` on anything else. It is a distribution over ranks
    // at this instant, not over events: read it without rate().
    let mut buckets = Family::always(
        "mpi_job_rank_mpi_fraction",
        "histogram",
        "This node's ranks of the job by MPI fraction (mpi_rank_mpi_seconds_total / mpi_rank_wall_seconds_total): _bucket counts those at most le (cumulative), _count the ranks, _sum their fractions. A distribution over ranks now, not over time: use it without rate().",
    );
    let mut lifetime = [
        Family::always(
            "mpi_job_rank_mpi_fraction_max",
            "gauge",
            "The highest MPI fraction among this node's ranks of the job.",
        ),
        Family::always(
            "mpi_job_rank_mpi_fraction_max_rank",
            "gauge",
            "World rank (as the value: no series per rank) of the rank with mpi_job_rank_mpi_fraction_max; NaN for a rank with no numeric world rank.",
        ),
        Family::always(
            "mpi_job_rank_mpi_fraction_min",
            "gauge",
            "The lowest MPI fraction among this node's ranks of the job.",
        ),
        Family::always(
            "mpi_job_rank_mpi_fraction_min_rank",
            "gauge",
            "World rank (as the value) of the rank with mpi_job_rank_mpi_fraction_min.",
        ),
    ];
    let mut minute = [
        Family::new(
            "mpi_job_rank_mpi_fraction_1m_max",
            "gauge",
            "The highest MPI fraction over the last minute among this node's running ranks of the job (from the daemon's own samples; absent until it has 10 s of history).",
        ),
        Family::new(
            "mpi_job_rank_mpi_fraction_1m_max_rank",
            "gauge",
            "World rank (as the value) of the rank with mpi_job_rank_mpi_fraction_1m_max.",
        ),
        Family::new(
            "mpi_job_rank_mpi_fraction_1m_min",
            "gauge",
            "The lowest MPI fraction over the last minute among this node's running ranks of the job.",
        ),
        Family::new(
            "mpi_job_rank_mpi_fraction_1m_min_rank",
            "gauge",
            "World rank (as the value) of the rank with mpi_job_rank_mpi_fraction_1m_min.",
        ),
    ];
    for (job, j) in &jobs {
        for (state, n) in [("running", j.running), ("exited", j.exited)] {
            count.line(
                T,
                format_args!("mpi_job_ranks{{{job},state=\"{state}\"}} {n}"),
            );
        }
        let gone = departed.get(job).map_or(0, |d| d.mpi_ns);
        mpi.line(
            T,
            format_args!(
                "mpi_job_mpi_seconds_total{{{job}}} {}",
                j.mpi_ns.saturating_add(gone) as f64 / 1e9
            ),
        );
        buckets.group(T, |out| {
            for le in FRACTION_BOUNDS {
                let bound: f64 = le.parse().unwrap_or(f64::INFINITY);
                let n = j.fractions.iter().filter(|&&f| f <= bound).count();
                let _ = writeln!(
                    out,
                    "mpi_job_rank_mpi_fraction_bucket{{{job},le=\"{le}\"}} {n}"
                );
            }
            let n = j.fractions.len();
            let sum: f64 = j.fractions.iter().sum();
            let _ = writeln!(
                out,
                "mpi_job_rank_mpi_fraction_bucket{{{job},le=\"+Inf\"}} {n}\nmpi_job_rank_mpi_fraction_sum{{{job}}} {sum}\nmpi_job_rank_mpi_fraction_count{{{job}}} {n}"
            );
        });
        j.lifetime
            .lines(&mut lifetime, "mpi_job_rank_mpi_fraction", job);
        j.minute
            .lines(&mut minute, "mpi_job_rank_mpi_fraction_1m", job);
    }
    let [max, max_rank, min, min_rank] = lifetime;
    fams.extend([count, mpi, buckets, min, min_rank, max, max_rank]);
    fams.extend(minute);
}

/// The stats layer's figures per job and node; peer traffic node × node.
fn segments(fams: &mut Vec<Family>, ranks: &[RankSnapshot], node: &str, departed: &DepartedJobs) {
    #[derive(Default)]
    struct Job {
        outstanding: u64,
        oldest: Duration,
        active: u64,
        inactive: u64,
        counters: [u64; 7],
        peers: BTreeMap<String, (Directed, Directed)>,
        /// The world rank holding the oldest outstanding request.
        oldest_rank: Option<f64>,
    }
    // The world ranks of each job found on this node.
    let mut here: HashMap<&str, HashSet<&str>> = HashMap::new();
    for r in ranks {
        here.entry(r.labels.job.as_str())
            .or_default()
            .insert(r.identity.rank.as_str());
    }
    let mut jobs: BTreeMap<&str, Job> = BTreeMap::new();
    for r in ranks {
        let Some(s) = &r.segment else { continue };
        let f = &s.figures;
        let job = r.labels.job.as_str();
        let j = jobs.entry(job).or_default();
        j.outstanding = j.outstanding.saturating_add(f.outstanding);
        // Ties go to the rank seen first.
        if f.outstanding > 0 && (j.oldest_rank.is_none() || s.oldest_request_age > j.oldest) {
            j.oldest_rank = Some(world_rank(r));
        }
        j.oldest = j.oldest.max(s.oldest_request_age);
        j.active = j.active.saturating_add(f.persistent_active);
        j.inactive = j.inactive.saturating_add(f.persistent_inactive);
        for (c, (_, _, value)) in j.counters.iter_mut().zip(SEGMENT_COUNTERS) {
            *c = c.saturating_add(value(f));
        }
        let local = |p: &str| {
            here.get(job).is_some_and(|h| h.contains(p))
                || departed.get(job).is_some_and(|d| d.world_ranks.contains(p))
        };
        for (peer, t) in &f.peers {
            let peer_node = peer_node(r, *peer, &local, node);
            let p = j.peers.entry(peer_node).or_default();
            add(&mut p.0, t.messages);
            add(&mut p.1, t.bytes);
        }
    }
    for (job, d) in departed.iter().filter(|(_, d)| d.segments) {
        let j = jobs.entry(job).or_default();
        for (c, n) in j.counters.iter_mut().zip(d.counters) {
            *c = c.saturating_add(n);
        }
        for (peer_node, (m, b)) in &d.peers {
            let p = j.peers.entry(peer_node.clone()).or_default();
            add(&mut p.0, *m);
            add(&mut p.1, *b);
        }
    }
    if jobs.is_empty() {
        return;
    }
    let mut messages = Family::always(
        "mpi_job_peer_messages_total",
        "counter",
        "Point-to-point messages of this node's ranks of the job by the node of the peer rank (peer_node; \"remote\" when the launcher's layout does not say) and direction, from the shim's stats layer.",
    );
    let mut bytes = Family::always(
        "mpi_job_peer_bytes_total",
        "counter",
        "Point-to-point bytes of this node's ranks of the job by the peer rank's node and direction (actual received sizes), from the shim's stats layer.",
    );
    let node = escape(node);
    for (job, j) in &jobs {
        for (peer_node, (m, b)) in &j.peers {
            let pn = escape(peer_node);
            for (dir, n) in directions(*m) {
                messages.line(
                    T,
                    format_args!(
                        "mpi_job_peer_messages_total{{{job},node=\"{node}\",peer_node=\"{pn}\",direction=\"{dir}\"}} {n}"
                    ),
                );
            }
            for (dir, n) in directions(*b) {
                bytes.line(
                    T,
                    format_args!(
                        "mpi_job_peer_bytes_total{{{job},node=\"{node}\",peer_node=\"{pn}\",direction=\"{dir}\"}} {n}"
                    ),
                );
            }
        }
    }
    let mut outstanding = Family::always(
        "mpi_job_requests_outstanding",
        "gauge",
        "Nonblocking and started persistent requests not yet completed, summed over this node's ranks of the job.",
    );
    let mut oldest = Family::always(
        "mpi_job_request_oldest_age_seconds",
        "gauge",
        "Age of the oldest outstanding request among this node's ranks of the job; 0 when none.",
    );
    let mut persistent = Family::always(
        "mpi_job_requests_persistent",
        "gauge",
        "Persistent requests of this node's ranks of the job by state: active or inactive.",
    );
    let mut counters: Vec<Family> = JOB_SEGMENT_COUNTERS
        .iter()
        .zip(SEGMENT_COUNTERS)
        .map(|(name, (_, help, _))| Family::always(name, "counter", help))
        .collect();
    let mut oldest_rank = Family::new(
        "mpi_job_request_oldest_rank",
        "gauge",
        "World rank (as the value) of the rank holding mpi_job_request_oldest_age_seconds's request; absent while none is outstanding, NaN for a rank with no numeric world rank.",
    );
    for (job, j) in &jobs {
        outstanding.line(
            T,
            format_args!("mpi_job_requests_outstanding{{{job}}} {}", j.outstanding),
        );
        oldest.line(
            T,
            format_args!(
                "mpi_job_request_oldest_age_seconds{{{job}}} {}",
                j.oldest.as_nanos() as f64 / 1e9
            ),
        );
        if let Some(rank) = j.oldest_rank {
            oldest_rank.line(
                T,
                format_args!("mpi_job_request_oldest_rank{{{job}}} {rank}"),
            );
        }
        for (state, n) in [("active", j.active), ("inactive", j.inactive)] {
            persistent.line(
                T,
                format_args!("mpi_job_requests_persistent{{{job},state=\"{state}\"}} {n}"),
            );
        }
        for ((f, name), n) in counters
            .iter_mut()
            .zip(JOB_SEGMENT_COUNTERS)
            .zip(j.counters)
        {
            f.line(T, format_args!("{name}{{{job}}} {n}"));
        }
    }
    fams.extend([
        messages,
        bytes,
        outstanding,
        oldest,
        oldest_rank,
        persistent,
    ]);
    fams.extend(counters);
}

/// A rank's world rank as a gauge value: NaN when its rank label is not a
/// number (a rank with no launcher's rank).
fn world_rank(r: &RankSnapshot) -> f64 {
    r.identity.rank.parse::<u32>().map_or(f64::NAN, f64::from)
}
