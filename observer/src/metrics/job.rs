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
    detail, directions, histogram,
    rank::{Labelled, SEGMENT_COUNTERS, rank_sites},
};
use crate::{
    segment::Directed,
    snapshot::{RankSnapshot, escape},
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
pub fn histograms(hist: &mut Family, ranks: &[Labelled<'_>]) {
    let mut per_job: BTreeMap<(&str, u16), CallStats> = BTreeMap::new();
    for (r, s) in ranks {
        for (id, st) in s.iter() {
            per_job
                .entry((r.labels.job.as_str(), *id))
                .or_insert(CallStats::ZERO)
                .add(st);
        }
    }
    for ((job, id), st) in &per_job {
        hist.group(T, |out| histogram(out, job, *id, st));
    }
}

fn add(a: &mut Directed, b: Directed) {
    a.send = a.send.saturating_add(b.send);
    a.recv = a.recv.saturating_add(b.recv);
}

/// Every job-level family but the histogram, of `ranks` (all this node's),
/// `node` naming this node in peer traffic.
pub fn families(
    fams: &mut Vec<Family>,
    ranks: &[RankSnapshot],
    labelled: &[Labelled<'_>],
    node: &str,
    now: SystemTime,
) {
    calls(fams, labelled);
    callsites(fams, labelled);
    distribution(fams, ranks, now);
    segments(fams, ranks, node);
}

fn calls(fams: &mut Vec<Family>, labelled: &[Labelled<'_>]) {
    let mut sums: BTreeMap<(&str, u16), CallStats> = BTreeMap::new();
    for (r, s) in labelled {
        for (id, st) in s.iter() {
            sums.entry((r.labels.job.as_str(), *id))
                .or_insert(CallStats::ZERO)
                .add(st);
        }
    }
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

fn callsites(fams: &mut Vec<Family>, labelled: &[Labelled<'_>]) {
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
fn distribution(fams: &mut Vec<Family>, ranks: &[RankSnapshot], now: SystemTime) {
    #[derive(Default)]
    struct Job {
        running: u64,
        exited: u64,
        fractions: Vec<f64>,
    }
    let mut jobs: BTreeMap<&str, Job> = BTreeMap::new();
    for r in ranks {
        let j = jobs.entry(r.labels.job.as_str()).or_default();
        if r.running() {
            j.running += 1;
        } else {
            j.exited += 1;
        }
        j.fractions.push(detail::mpi_fraction(r, now));
    }
    let mut count = Family::always(
        "mpi_job_ranks",
        "gauge",
        "This node's observed ranks of the job, by state: running, or exited (kept for --retain-exited).",
    );
    // TYPE histogram rather than gauge: promtool (and other linters) refuse
    // `_bucket` and `le` on anything else. It is a distribution over ranks
    // at this instant, not over events: read it without rate().
    let mut buckets = Family::always(
        "mpi_job_rank_mpi_fraction",
        "histogram",
        "This node's ranks of the job by MPI fraction (mpi_rank_mpi_seconds_total / mpi_rank_wall_seconds_total): _bucket counts those at most le (cumulative), _count the ranks, _sum their fractions. A distribution over ranks now, not over time: use it without rate().",
    );
    let mut min = Family::always(
        "mpi_job_rank_mpi_fraction_min",
        "gauge",
        "The lowest MPI fraction among this node's ranks of the job.",
    );
    let mut max = Family::always(
        "mpi_job_rank_mpi_fraction_max",
        "gauge",
        "The highest MPI fraction among this node's ranks of the job.",
    );
    for (job, j) in &jobs {
        for (state, n) in [("running", j.running), ("exited", j.exited)] {
            count.line(
                T,
                format_args!("mpi_job_ranks{{{job},state=\"{state}\"}} {n}"),
            );
        }
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
        let lo = j.fractions.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = j
            .fractions
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        min.line(
            T,
            format_args!("mpi_job_rank_mpi_fraction_min{{{job}}} {lo}"),
        );
        max.line(
            T,
            format_args!("mpi_job_rank_mpi_fraction_max{{{job}}} {hi}"),
        );
    }
    fams.extend([count, buckets, min, max]);
}

/// The stats layer's figures per job and node; peer traffic node × node.
fn segments(fams: &mut Vec<Family>, ranks: &[RankSnapshot], node: &str) {
    #[derive(Default)]
    struct Job {
        outstanding: u64,
        oldest: Duration,
        active: u64,
        inactive: u64,
        counters: [u64; 7],
        peers: BTreeMap<String, (Directed, Directed)>,
        layer: BTreeMap<u16, (u64, Directed)>,
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
        j.oldest = j.oldest.max(s.oldest_request_age);
        j.active = j.active.saturating_add(f.persistent_active);
        j.inactive = j.inactive.saturating_add(f.persistent_inactive);
        for (c, (_, _, value)) in j.counters.iter_mut().zip(SEGMENT_COUNTERS) {
            *c = c.saturating_add(value(f));
        }
        // The layout names nodes its own way (Slurm's short names, or
        // `#k` for uniform blocks): the rank's own node is this one.
        let own = r
            .identity
            .rank
            .parse::<u32>()
            .ok()
            .and_then(|me| crate::layout::node_of(&r.identity, me));
        for (peer, t) in &f.peers {
            let peer_node = match crate::layout::node_of(&r.identity, *peer) {
                Some(p) if Some(&p) == own.as_ref() => node.to_string(),
                Some(p) => p,
                None => {
                    let local = here
                        .get(job)
                        .is_some_and(|h| h.contains(peer.to_string().as_str()));
                    if local {
                        node.to_string()
                    } else {
                        "remote".into()
                    }
                }
            };
            let p = j.peers.entry(peer_node).or_default();
            add(&mut p.0, t.messages);
            add(&mut p.1, t.bytes);
        }
        for (id, c) in &f.functions {
            let l = j.layer.entry(*id).or_default();
            l.0 = l.0.saturating_add(c.calls);
            add(&mut l.1, c.bytes);
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
    let mut layer_calls = Family::always(
        "mpi_job_layer_calls_total",
        "counter",
        "Calls seen by the shim's stats layer in this node's ranks of the job, per function.",
    );
    let mut layer_bytes = Family::always(
        "mpi_job_layer_bytes_total",
        "counter",
        "Bytes per function and direction by the stats layer's definition, summed over this node's ranks of the job.",
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
        for (id, (n, _)) in &j.layer {
            layer_calls.line(
                T,
                format_args!(
                    "mpi_job_layer_calls_total{{{job},function=\"{}\"}} {n}",
                    FUNCTIONS[*id as usize].name
                ),
            );
        }
        for (id, (_, b)) in &j.layer {
            for (dir, n) in directions(*b) {
                layer_bytes.line(
                    T,
                    format_args!(
                        "mpi_job_layer_bytes_total{{{job},function=\"{}\",direction=\"{dir}\"}} {n}",
                        FUNCTIONS[*id as usize].name
                    ),
                );
            }
        }
    }
    fams.extend([messages, bytes, outstanding, oldest, persistent]);
    fams.extend(counters);
    fams.extend([layer_calls, layer_bytes]);
}
