//! The report's wait states (issue 37, docs/waits.md): the figures each
//! node's daemon matched for a job ([`WaitData`]), summed over the nodes,
//! and the job's time split into computation, waiting (by pattern) and the
//! rest of MPI.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{JobKey, Report, per_cent};
use crate::export::report::{Data, WaitData};

/// A pattern as a reader names it, by its label (docs/waits.md).
pub fn pattern_name(label: &str) -> &str {
    match label {
        "wait_barrier" => "Wait at Barrier",
        "wait_nxn" => "Wait at N×N",
        "late_broadcast" => "Late Broadcast",
        "early_reduce" => "Early Reduce",
        "late_sender" => "Late Sender",
        "late_receiver" => "Late Receiver",
        other => other,
    }
}

/// A job's wait states, summed over its nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WaitSummary {
    /// Seconds waited, every pattern.
    pub seconds: f64,
    /// Per pattern, every pattern, in the order the data gives.
    pub patterns: Vec<PatternLine>,
    /// The ranks that waited, the most first.
    pub waiting: Vec<WaitRankLine>,
    /// The ranks that made the others wait, as root causes, the most
    /// first.
    pub culprits: Vec<CulpritLine>,
    /// Ranks others waited for that were late only from waiting
    /// themselves: the most waited for as the rank that came late (a tenth
    /// of all waiting or more), of which under a quarter is their own.
    pub passers: Vec<u32>,
    /// The calls the ranks waited in, the most first.
    pub functions: Vec<FunctionWaitLine>,
    /// Instances and messages evaluated.
    pub instances: u64,
    /// Not evaluated, per reason (only those with any).
    pub unresolved: Vec<(String, u64)>,
    /// Still waiting for a part when the data was taken.
    pub pending: u64,
    /// Records overwritten before they were read.
    pub records_lost: u64,
    /// Records no shim writes.
    pub records_invalid: u64,
    /// The collectives' sampling period (the largest of the nodes').
    pub sample_period: u64,
    /// The messages' (0: not recorded).
    pub p2p_sample_period: u64,
    /// Across nodes: the largest uncertainty of a node's clock offset, in
    /// ns, over the nodes (`u64::MAX`: unbounded); `None` on one node.
    pub clock_uncertainty_ns: Option<u64>,
}

impl WaitSummary {
    /// Instances and messages not evaluated, every reason.
    pub fn unresolved_total(&self) -> u64 {
        self.unresolved
            .iter()
            .map(|u| u.1)
            .fold(0, u64::saturating_add)
    }

    /// The clocks' agreement across nodes, as a reader reads it: `; the
    /// nodes' clocks agree within ±0.300 ms` (empty on one node).
    pub fn clocks(&self) -> String {
        match self.clock_uncertainty_ns {
            None => String::new(),
            Some(u64::MAX) => "; the nodes' clocks are not bound yet".into(),
            Some(u) => format!("; the nodes' clocks agree within ±{:.3} ms", u as f64 / 1e6),
        }
    }

    /// The reasons instances went unresolved, as a reader reads them:
    /// `1 clock, 22 incomplete` (empty when none did).
    pub fn reasons(&self) -> String {
        let v: Vec<String> = self
            .unresolved
            .iter()
            .map(|(r, c)| format!("{c} {r}"))
            .collect();
        v.join(", ")
    }

    /// Seconds waited under pattern `label`.
    pub fn pattern_seconds(&self, label: &str) -> f64 {
        self.patterns
            .iter()
            .find(|p| p.pattern == label)
            .map_or(0.0, |p| p.seconds)
    }
}

/// One pattern of a job.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PatternLine {
    /// Its label.
    pub pattern: String,
    /// Its name.
    pub name: String,
    /// Seconds waited.
    pub seconds: f64,
    /// Instances evaluated (sampled).
    pub instances: u64,
    /// Share of the job's MPI time, in percent.
    pub mpi_percent: f64,
}

/// One rank that waited.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WaitRankLine {
    /// World rank.
    pub rank: u32,
    /// Seconds it waited.
    pub seconds: f64,
    /// Share of its own MPI time, in percent (0 when the report has no
    /// line for it).
    pub mpi_percent: f64,
    /// The pattern it waited most in (label).
    pub pattern: String,
}

/// One rank that made others wait.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CulpritLine {
    /// World rank.
    pub rank: u32,
    /// Seconds it made the others wait, summed over them.
    pub seconds: f64,
    /// Share of all the job's waiting, in percent.
    pub wait_percent: f64,
    /// The pattern it caused most (label).
    pub pattern: String,
    /// Seconds others waited for it as the rank that came late.
    pub late_seconds: f64,
}

/// The waiting in one function.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FunctionWaitLine {
    /// MPI name of the waiting call.
    pub function: String,
    /// Pattern label.
    pub pattern: String,
    /// Seconds.
    pub seconds: f64,
}

/// The job's time, summed over its ranks: computation (outside MPI),
/// waiting for other ranks, and the rest of MPI.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TimeSplit {
    /// Wall seconds counted.
    pub wall_seconds: f64,
    /// Outside MPI: wall − MPI.
    pub compute_seconds: f64,
    /// Inside MPI.
    pub mpi_seconds: f64,
    /// Of MPI, waiting for a late rank (when measured), per pattern label;
    /// scaled down together if sampling made them exceed the MPI time.
    pub waiting: Vec<(String, f64)>,
    /// Of MPI, the rest: moving data, the library's own work, and waiting
    /// no pattern covers.
    pub other_mpi_seconds: f64,
}

impl TimeSplit {
    /// All waiting.
    pub fn waiting_seconds(&self) -> f64 {
        self.waiting.iter().map(|w| w.1).sum()
    }
}

fn ns(v: u64) -> f64 {
    v as f64 / 1e9
}

/// Each job's wait data, summed over nodes: the newest data of each node
/// (a node given twice, as a file and a live daemon, counts once).
pub(super) fn by_job(data: &[Data]) -> BTreeMap<JobKey<'_>, Vec<&WaitData>> {
    let mut newest: BTreeMap<(&str, &str, Option<u32>), (&WaitData, f64)> = BTreeMap::new();
    for d in data {
        for w in &d.waits {
            let key = (d.host.as_str(), w.jobid.as_str(), w.uid);
            if newest.get(&key).is_none_or(|(_, t)| *t <= d.taken) {
                newest.insert(key, (w, d.taken));
            }
        }
    }
    let mut jobs: BTreeMap<JobKey<'_>, Vec<&WaitData>> = BTreeMap::new();
    for ((_, jobid, uid), (w, _)) in newest {
        jobs.entry((jobid, uid)).or_default().push(w);
    }
    jobs
}

/// The summary of one job's wait data from its nodes, with the report's
/// rank lines for the shares of MPI time.
pub(super) fn summary(nodes: &[&WaitData], rep: &Report, top: usize) -> WaitSummary {
    let mut s = WaitSummary::default();
    let mut labels: Vec<String> = Vec::new();
    let mut waited: Vec<u64> = Vec::new();
    let mut instances: Vec<u64> = Vec::new();
    let mut unresolved: BTreeMap<String, u64> = BTreeMap::new();
    // Per rank: waited, caused (root), late (direct), per pattern (its
    // index in `labels`).
    #[derive(Default)]
    struct PerRank {
        waited: BTreeMap<usize, u64>,
        caused: BTreeMap<usize, u64>,
        late: BTreeMap<usize, u64>,
    }
    let mut per_rank: BTreeMap<u32, PerRank> = BTreeMap::new();
    let mut funcs: BTreeMap<(String, String), u64> = BTreeMap::new();
    for w in nodes {
        // Where each of this node's patterns is in `labels`: its ranks'
        // figures are in the order of its own `patterns` (its daemon's
        // patterns), which another node's daemon may not share.
        let mut at: Vec<usize> = Vec::with_capacity(w.patterns.len());
        for p in &w.patterns {
            let i = match labels.iter().position(|l| *l == p.pattern) {
                Some(i) => i,
                None => {
                    labels.push(p.pattern.clone());
                    waited.push(0);
                    instances.push(0);
                    labels.len() - 1
                }
            };
            waited[i] = waited[i].saturating_add(p.waited_ns);
            instances[i] = instances[i].saturating_add(p.instances);
            at.push(i);
        }
        for u in &w.unresolved {
            let c = unresolved.entry(u.reason.clone()).or_default();
            *c = c.saturating_add(u.count);
        }
        for r in &w.ranks {
            let e = per_rank.entry(r.rank).or_default();
            add(&mut e.waited, &r.waited_ns, &at);
            add(&mut e.caused, &r.caused_ns, &at);
            add(&mut e.late, &r.late_ns, &at);
        }
        for f in &w.functions {
            let c = funcs
                .entry((f.function.clone(), f.pattern.clone()))
                .or_default();
            *c = c.saturating_add(f.waited_ns);
        }
        s.pending = s.pending.saturating_add(w.pending);
        s.records_lost = s.records_lost.saturating_add(w.records_lost);
        s.records_invalid = s.records_invalid.saturating_add(w.records_invalid);
        s.sample_period = s.sample_period.max(w.sample_period);
        s.p2p_sample_period = s.p2p_sample_period.max(w.p2p_sample_period);
        if let Some(u) = w.clock_uncertainty_ns {
            s.clock_uncertainty_ns = Some(s.clock_uncertainty_ns.unwrap_or(0).max(u));
        }
    }
    let mpi = rep.totals.mpi_seconds;
    for (i, label) in labels.iter().enumerate() {
        let seconds = ns(waited[i]);
        s.seconds += seconds;
        s.instances = s.instances.saturating_add(instances[i]);
        s.patterns.push(PatternLine {
            pattern: label.clone(),
            name: pattern_name(label).into(),
            seconds,
            instances: instances[i],
            mpi_percent: per_cent(seconds, mpi),
        });
    }
    s.unresolved = unresolved.into_iter().filter(|u| u.1 > 0).collect();
    // The pattern (label) of the largest of `v`, the first of equals.
    let main = |v: &BTreeMap<usize, u64>| {
        v.iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .and_then(|(&i, _)| labels.get(i).cloned())
            .unwrap_or_default()
    };
    // Each rank's MPI seconds, by number (a 64 k-rank job's lines are
    // looked up once each).
    let by_rank: std::collections::HashMap<u32, f64> = rep
        .ranks
        .iter()
        .filter_map(|l| Some((l.rank.parse().ok()?, l.mpi_seconds)))
        .collect();
    let rank_mpi = |rank: u32| by_rank.get(&rank).copied().unwrap_or(0.0);
    let total = |v: &BTreeMap<usize, u64>| v.values().copied().fold(0, u64::saturating_add);
    for (&rank, e) in &per_rank {
        let (w, c, l) = (&e.waited, &e.caused, &e.late);
        if ns(total(l)) >= s.seconds / 10.0 && total(c) < total(l) / 4 && s.seconds > 0.0 {
            s.passers.push(rank);
        }
        if total(w) > 0 {
            let seconds = ns(total(w));
            s.waiting.push(WaitRankLine {
                rank,
                seconds,
                mpi_percent: per_cent(seconds, rank_mpi(rank)),
                pattern: main(w),
            });
        }
        if total(c) > 0 {
            let seconds = ns(total(c));
            s.culprits.push(CulpritLine {
                rank,
                seconds,
                wait_percent: per_cent(seconds, s.seconds),
                pattern: main(c),
                late_seconds: ns(total(l)),
            });
        }
    }
    s.waiting
        .sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then(a.rank.cmp(&b.rank)));
    s.culprits
        .sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then(a.rank.cmp(&b.rank)));
    s.waiting.truncate(top);
    s.culprits.truncate(top);
    s.passers.truncate(top);
    s.functions = funcs
        .into_iter()
        .map(|((function, pattern), v)| FunctionWaitLine {
            function,
            pattern,
            seconds: ns(v),
        })
        .collect();
    s.functions.sort_by(|a, b| {
        b.seconds
            .total_cmp(&a.seconds)
            .then_with(|| (&a.function, &a.pattern).cmp(&(&b.function, &b.pattern)))
    });
    s.functions.truncate(top);
    s
}

/// Adds a node's per-pattern figures `from` into `to`, each at the index
/// `at` gives its pattern; figures past the node's patterns name none and
/// are left out.
fn add(to: &mut BTreeMap<usize, u64>, from: &[u64], at: &[usize]) {
    for (&v, &i) in from.iter().zip(at) {
        let e = to.entry(i).or_default();
        *e = e.saturating_add(v);
    }
}

/// The job's time split, with its waits where measured.
pub(super) fn split(rep: &Report) -> TimeSplit {
    let wall = rep.totals.wall_seconds;
    let mpi = rep.totals.mpi_seconds;
    let mut waiting: Vec<(String, f64)> = rep
        .waits
        .iter()
        .flat_map(|w| &w.patterns)
        .filter(|p| p.seconds > 0.0)
        .map(|p| (p.pattern.clone(), p.seconds))
        .collect();
    // Sampled waits are estimates: they may come out above the MPI time
    // the calls measured; the split never shows more waiting than MPI.
    let sum: f64 = waiting.iter().map(|w| w.1).sum();
    if sum > mpi && sum > 0.0 {
        for w in &mut waiting {
            w.1 *= mpi / sum;
        }
    }
    let waited: f64 = waiting.iter().map(|w| w.1).sum();
    TimeSplit {
        wall_seconds: wall,
        compute_seconds: (wall - mpi).max(0.0),
        mpi_seconds: mpi,
        waiting,
        other_mpi_seconds: (mpi - waited).max(0.0),
    }
}
