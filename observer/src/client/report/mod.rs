//! `mpi-observer report`: an mpiP/IPM-style account of each job, from a
//! live daemon (`--url`, which serves [`Data`] at `/report.json`) or from
//! the snapshot a daemon writes when its last rank exits (`attach
//! --report-file`).
//!
//! Two layers: [`Data`] is what a daemon knows of its ranks, every figure
//! exact and every call site named (the snapshot file's format, versioned
//! by [`FORMAT`]); [`analyse`] turns the data of one or more daemons (nodes)
//! into a [`Report`] per job, which [`text`], JSON and [`html`] render.

pub mod advice;
pub mod command;
pub mod html;
pub mod text;
pub mod waits;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    path::Path,
};

use observer_common::maps::HIST_SLOTS;
use serde::Serialize;
use thiserror::Error;

pub use self::{
    advice::Finding,
    waits::{TimeSplit, WaitSummary},
};

pub use crate::export::report::{
    CountData, Data, FORMAT, FunctionData, FunctionWaitData, PatternWaitData, PeerData, RankData,
    RankWaitData, SchedulerData, SiteData, StatsData, WaitData,
};

impl Data {
    /// Reads a snapshot file.
    pub fn read(path: &Path) -> Result<Data, ReportError> {
        let text = fs::read(path).map_err(|source| ReportError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Data::parse(&text, &path.display().to_string())
    }

    /// Parses [`Data`] read from `from` (a path or a URL, for the message).
    pub fn parse(text: &[u8], from: &str) -> Result<Data, ReportError> {
        let d: Data = serde_json::from_slice(text).map_err(|e| ReportError::NotAReport {
            from: from.into(),
            why: e.to_string(),
        })?;
        if d.format != FORMAT {
            return Err(ReportError::NotAReport {
                from: from.into(),
                why: format!("its format is `{}`, this reader reads `{FORMAT}`", d.format),
            });
        }
        Ok(d)
    }
}

/// Errors of `report`.
#[derive(Debug, Error)]
pub enum ReportError {
    /// A snapshot file could not be read.
    #[error(
        "cannot read the report snapshot {path}: {source}; give a file written by `attach --report-file`"
    )]
    Read {
        /// Its path.
        path: String,
        /// The I/O error.
        source: io::Error,
    },
    /// What was read is not report data.
    #[error(
        "{from} is not mpi-observer report data ({why}): give a file written by `attach --report-file` or an observer's address for --url"
    )]
    NotAReport {
        /// A path or URL.
        from: String,
        /// What was wrong.
        why: String,
    },
    /// The daemon did not answer.
    #[error("{0}")]
    Fetch(#[from] crate::client::http_get::FetchError),
    /// Nothing to report.
    #[error("{0}")]
    Empty(String),
    /// `--job` or `--uid` matched no job of the data.
    #[error("no {wanted} in the data (jobs there: {known}); give one of those to --job{}", if *by_uid { " and its uid to --uid" } else { "" })]
    NoSuchJob {
        /// What was asked for: "job `42`", "job `42` of uid 1000".
        wanted: String,
        /// The jobs the data holds, as [`Report::title`] names them, or
        /// "none".
        known: String,
        /// `--uid` was given.
        by_uid: bool,
    },
    /// Writing the output failed.
    #[error("cannot write the report to {path}: {source}")]
    Write {
        /// Where.
        path: String,
        /// The I/O error.
        source: io::Error,
    },
}

// ---------------------------------------------------------------------------
// Analysis.

/// The report of one job.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    /// Job ID.
    pub jobid: String,
    /// The uid its ranks run as, where the data says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Nodes its ranks ran on.
    pub hosts: Vec<String>,
    /// What the batch scheduler said of the job: its lowest rank's facts
    /// (ranks on other nodes may differ, e.g. in step); absent for a
    /// launcher's job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<SchedulerData>,
    /// Unix time of the newest data.
    pub taken: f64,
    /// Per rank, by rank.
    pub ranks: Vec<RankLine>,
    /// Summed over ranks.
    pub totals: Totals,
    /// Per function, summed over ranks, most time first.
    pub functions: Vec<FunctionLine>,
    /// Per (function, call site), summed over ranks, most time first.
    pub callsites: Vec<SiteLine>,
    /// Whether any rank captured call sites.
    pub callsites_captured: bool,
    /// Per function, time across ranks, most imbalanced (max/mean) first.
    pub imbalance: Vec<ImbalanceLine>,
    /// Message sizes: from the stats layer where there is one.
    pub message_sizes: MessageSizes,
    /// Point-to-point pairs, most bytes first; from the stats layer.
    pub peer_pairs: Vec<PairLine>,
    /// Bytes sent, `matrix[i][j]` from the i-th to the j-th of
    /// `matrix_ranks`; empty without the stats layer.
    pub matrix: Vec<Vec<u64>>,
    /// The world ranks of the matrix's rows and columns.
    pub matrix_ranks: Vec<u32>,
    /// Latency histograms of the top functions, summed over ranks.
    pub latency: Vec<LatencyLine>,
    /// Wait states (who waits for whom), from the ranks' wait records;
    /// absent when no rank kept them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waits: Option<WaitSummary>,
    /// The job's time: computation, waiting, the rest of MPI.
    pub split: TimeSplit,
    /// What the figures say and what to do, the most costly first.
    pub findings: Vec<Finding>,
}

/// One rank's times.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RankLine {
    /// Rank.
    pub rank: String,
    /// Its job step, when the job's ranks ran in more than one (a batch
    /// job's `srun` after `srun`): the rank alone does not say which.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub step: String,
    /// Node.
    pub host: String,
    /// Process ID.
    pub pid: u32,
    /// Seconds counted: from `since` to exit (or the collection).
    pub wall_seconds: f64,
    /// Seconds inside MPI calls (outermost calls only).
    pub mpi_seconds: f64,
    /// `mpi_seconds` / `wall_seconds` x 100 (above 100 with threads that
    /// call MPI at once).
    pub mpi_percent: f64,
    /// MPI calls.
    pub calls: u64,
    /// Where the figures come from.
    pub source: String,
    /// Whether it still ran at the collection.
    pub running: bool,
}

/// Job-wide sums.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Ranks.
    pub ranks: usize,
    /// Summed wall seconds.
    pub wall_seconds: f64,
    /// Summed MPI seconds.
    pub mpi_seconds: f64,
    /// Their ratio x 100.
    pub mpi_percent: f64,
    /// MPI calls.
    pub calls: u64,
}

/// One function over the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FunctionLine {
    /// MPI name.
    pub name: String,
    /// Calls.
    pub calls: u64,
    /// Seconds.
    pub seconds: f64,
    /// Share of the job's MPI time, in percent.
    pub mpi_percent: f64,
    /// Mean microseconds per call.
    pub mean_us: f64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Bytes received.
    pub bytes_recv: u64,
}

/// One call site over the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SiteLine {
    /// MPI name.
    pub function: String,
    /// The site's name.
    pub site: String,
    /// Calls from there.
    pub calls: u64,
    /// Seconds.
    pub seconds: f64,
    /// Mean microseconds per call.
    pub mean_us: f64,
    /// Ranks that called from there.
    pub ranks: usize,
}

/// One function's time across the job's ranks (a rank that never called it
/// counts zero).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ImbalanceLine {
    /// MPI name.
    pub name: String,
    /// Least seconds on one rank.
    pub min_seconds: f64,
    /// Mean seconds per rank.
    pub mean_seconds: f64,
    /// Most seconds on one rank.
    pub max_seconds: f64,
    /// The rank with the most.
    pub max_rank: String,
    /// max / mean (1 = balanced).
    pub max_over_mean: f64,
}

/// Message sizes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MessageSizes {
    /// Ranks with the stats layer, whose messages are in the histograms.
    pub ranks_with_stats: usize,
    /// Messages sent per log2 size slot (as [`StatsData::sizes_sent`]).
    pub sent: Vec<u64>,
    /// Messages received per slot.
    pub recv: Vec<u64>,
    /// Point-to-point and collective functions' mean bytes per call, from
    /// the call figures of every rank.
    pub mean_bytes: Vec<MeanBytes>,
}

/// A function's mean bytes per call.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MeanBytes {
    /// MPI name.
    pub name: String,
    /// Calls.
    pub calls: u64,
    /// Mean bytes sent and received per call.
    pub mean_bytes: f64,
}

/// Traffic from one rank to another.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PairLine {
    /// Sender's world rank.
    pub from: u32,
    /// Receiver's world rank.
    pub to: u32,
    /// Messages.
    pub messages: u64,
    /// Bytes.
    pub bytes: u64,
}

/// One function's latency histogram over the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencyLine {
    /// MPI name.
    pub name: String,
    /// Calls per log2-nanosecond slot.
    pub hist: Vec<u64>,
}

/// How much of each list a report shows.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Functions, call sites, imbalance lines and peer pairs.
    pub top: usize,
    /// Latency histograms.
    pub histograms: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            top: 20,
            histograms: 6,
        }
    }
}

fn rank_key(r: &str) -> (u64, String) {
    (r.parse::<u64>().unwrap_or(u64::MAX), r.to_string())
}

fn per_cent(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b * 100.0 } else { 0.0 }
}

fn mean_us(ns: u64, calls: u64) -> f64 {
    if calls == 0 {
        0.0
    } else {
        ns as f64 / calls as f64 / 1e3
    }
}

impl SchedulerData {
    /// The facts in a line: `slurm job 42 step 0, user alice, account
    /// physics, partition debug, array job 4 task 1`, absent ones left out.
    pub fn line(&self, jobid: &str) -> String {
        let mut s = format!("{} job {jobid}", self.scheduler);
        let mut add = |sep: &str, name: &str, v: &str| {
            if !v.is_empty() {
                s.push_str(&format!("{sep}{name} {v}"));
            }
        };
        add(" ", "step", &self.step);
        add(", ", "user", &self.user);
        add(", ", "account", &self.account);
        add(", ", "partition", &self.partition);
        add(", ", "array job", &self.array_job);
        add(
            if self.array_job.is_empty() { ", " } else { " " },
            "task",
            &self.array_task,
        );
        s
    }
}

impl Report {
    /// The job as a reader names it: its ID, and its uid where known.
    pub fn title(&self) -> String {
        match self.uid {
            Some(uid) => format!("{} of uid {uid}", self.jobid),
            None => self.jobid.clone(),
        }
    }
}

/// The reports of `reports` that are job `job` (if given) of uid `uid` (if
/// given): none of another user's, whose processes may claim any job id.
/// Refused when nothing is left.
pub fn select(
    reports: Vec<Report>,
    job: Option<&str>,
    uid: Option<u32>,
) -> Result<Vec<Report>, ReportError> {
    if job.is_none() && uid.is_none() {
        return Ok(reports);
    }
    let known: Vec<String> = reports.iter().map(Report::title).collect();
    let kept: Vec<Report> = reports
        .into_iter()
        .filter(|r| job.is_none_or(|j| r.jobid == j) && uid.is_none_or(|u| r.uid == Some(u)))
        .collect();
    if !kept.is_empty() {
        return Ok(kept);
    }
    let wanted = match (job, uid) {
        (Some(j), Some(u)) => format!("job `{j}` of uid {u}"),
        (Some(j), None) => format!("job `{j}`"),
        (None, _) => format!("job of uid {}", uid.unwrap_or_default()),
    };
    Err(ReportError::NoSuchJob {
        wanted,
        known: if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        },
        by_uid: uid.is_some(),
    })
}

/// The sum of `v`, saturating: figures come from user-written segments.
fn saturating_sum(v: impl Iterator<Item = u64>) -> u64 {
    v.fold(0, u64::saturating_add)
}

fn add_into(to: &mut Vec<u64>, from: &[u64]) {
    if to.len() < from.len() {
        to.resize(from.len(), 0);
    }
    for (a, b) in to.iter_mut().zip(from) {
        *a = a.saturating_add(*b);
    }
}

/// A job: its ID and the uid its ranks run as.
type JobKey<'a> = (&'a str, Option<u32>);

/// The reports of every job in `data` (one per daemon), by job ID and uid
/// (one job ID claimed by two users is two jobs). A rank two daemons both
/// hold (the same host and pid) counts once, from the newest data.
pub fn analyse(data: &[Data], limits: Limits) -> Vec<Report> {
    let mut newest: BTreeMap<(String, u32), (&RankData, f64)> = BTreeMap::new();
    for d in data {
        for r in &d.ranks {
            let key = (r.host.clone(), r.pid);
            if newest.get(&key).is_none_or(|(_, t)| *t <= d.taken) {
                newest.insert(key, (r, d.taken));
            }
        }
    }
    let mut jobs: BTreeMap<JobKey<'_>, Vec<(&RankData, f64)>> = BTreeMap::new();
    for (r, taken) in newest.into_values() {
        jobs.entry((r.jobid.as_str(), r.uid))
            .or_default()
            .push((r, taken));
    }
    let wait_data = waits::by_job(data);
    jobs.into_iter()
        .map(|((jobid, uid), mut ranks)| {
            ranks.sort_by_key(|a| rank_key(&a.0.rank));
            let mut rep = job(jobid, &ranks, limits);
            rep.uid = uid;
            if let Some(w) = wait_data.get(&(jobid, uid)) {
                rep.waits = Some(waits::summary(w, &rep, limits.top));
            }
            rep.split = waits::split(&rep);
            rep.findings = advice::findings(&rep);
            rep
        })
        .collect()
}

fn job(jobid: &str, ranks: &[(&RankData, f64)], limits: Limits) -> Report {
    let mut rep = Report {
        jobid: jobid.into(),
        ..Default::default()
    };
    let mut hosts: Vec<String> = ranks.iter().map(|(r, _)| r.host.clone()).collect();
    hosts.sort();
    hosts.dedup();
    rep.hosts = hosts;
    // `ranks` come by rank.
    rep.scheduler = ranks.iter().find_map(|(r, _)| r.scheduler.clone());
    rep.taken = ranks.iter().map(|(_, t)| *t).fold(0.0, f64::max);

    // Ranks and totals.
    let step = |r: &RankData| r.scheduler.as_ref().map(|s| s.step.clone());
    let steps: BTreeSet<Option<String>> = ranks.iter().map(|(r, _)| step(r)).collect();
    for (r, taken) in ranks {
        let end = r.exited.unwrap_or(*taken);
        let wall = (end - r.since).max(0.0);
        let mpi_ns = saturating_sum(r.functions.iter().map(|f| f.time_ns));
        let calls = saturating_sum(r.functions.iter().map(|f| f.calls));
        let mpi = mpi_ns as f64 / 1e9;
        rep.ranks.push(RankLine {
            rank: r.rank.clone(),
            step: if steps.len() > 1 {
                step(r).unwrap_or_default()
            } else {
                String::new()
            },
            host: r.host.clone(),
            pid: r.pid,
            wall_seconds: wall,
            mpi_seconds: mpi,
            mpi_percent: per_cent(mpi, wall),
            calls,
            source: r.source.clone(),
            running: r.exited.is_none(),
        });
        rep.totals.wall_seconds += wall;
        rep.totals.mpi_seconds += mpi;
        rep.totals.calls = rep.totals.calls.saturating_add(calls);
    }
    rep.totals.ranks = ranks.len();
    rep.totals.mpi_percent = per_cent(rep.totals.mpi_seconds, rep.totals.wall_seconds);
    let total_mpi_ns = saturating_sum(
        ranks
            .iter()
            .flat_map(|(r, _)| &r.functions)
            .map(|f| f.time_ns),
    );

    // Functions, imbalance, latency, mean bytes.
    #[derive(Default)]
    struct F {
        calls: u64,
        time_ns: u64,
        sent: u64,
        recv: u64,
        hist: Vec<u64>,
        per_rank: Vec<u64>,
    }
    let mut funcs: BTreeMap<&str, F> = BTreeMap::new();
    for (i, (r, _)) in ranks.iter().enumerate() {
        for f in &r.functions {
            let e = funcs.entry(f.name.as_str()).or_default();
            e.calls = e.calls.saturating_add(f.calls);
            e.time_ns = e.time_ns.saturating_add(f.time_ns);
            e.sent = e.sent.saturating_add(f.bytes_sent);
            e.recv = e.recv.saturating_add(f.bytes_recv);
            add_into(&mut e.hist, &f.hist);
            e.per_rank.resize(ranks.len(), 0);
            e.per_rank[i] = e.per_rank[i].saturating_add(f.time_ns);
        }
    }
    let mut by_time: Vec<(&str, &F)> = funcs.iter().map(|(n, f)| (*n, f)).collect();
    by_time.sort_by(|a, b| b.1.time_ns.cmp(&a.1.time_ns).then(a.0.cmp(b.0)));
    for (name, f) in by_time.iter().take(limits.top) {
        rep.functions.push(FunctionLine {
            name: (*name).into(),
            calls: f.calls,
            seconds: f.time_ns as f64 / 1e9,
            mpi_percent: per_cent(f.time_ns as f64, total_mpi_ns as f64),
            mean_us: mean_us(f.time_ns, f.calls),
            bytes_sent: f.sent,
            bytes_recv: f.recv,
        });
    }
    for (name, f) in by_time.iter().take(limits.histograms) {
        rep.latency.push(LatencyLine {
            name: (*name).into(),
            hist: f.hist.clone(),
        });
    }
    for (name, f) in &by_time {
        if f.sent.saturating_add(f.recv) > 0 {
            rep.message_sizes.mean_bytes.push(MeanBytes {
                name: (*name).into(),
                calls: f.calls,
                mean_bytes: (f.sent as f64 + f.recv as f64) / f.calls.max(1) as f64,
            });
        }
    }
    rep.message_sizes
        .mean_bytes
        .sort_by(|a, b| b.calls.cmp(&a.calls).then(a.name.cmp(&b.name)));
    rep.message_sizes.mean_bytes.truncate(limits.top);
    let n = ranks.len().max(1);
    let mut imb: Vec<ImbalanceLine> = funcs
        .iter()
        .filter(|(_, f)| f.time_ns > 0)
        .map(|(name, f)| {
            let mut per = f.per_rank.clone();
            per.resize(ranks.len(), 0);
            let (imax, max) = per
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
                .map_or((0, 0), |(i, v)| (i, *v));
            let min = per.iter().copied().min().unwrap_or(0);
            let mean = f.time_ns as f64 / n as f64;
            ImbalanceLine {
                name: (*name).into(),
                min_seconds: min as f64 / 1e9,
                mean_seconds: mean / 1e9,
                max_seconds: max as f64 / 1e9,
                max_rank: ranks
                    .get(imax)
                    .map_or_else(String::new, |r| r.0.rank.clone()),
                max_over_mean: if mean > 0.0 { max as f64 / mean } else { 0.0 },
            }
        })
        .collect();
    // The functions that cost the most first, then by how imbalanced.
    imb.sort_by(|a, b| {
        (b.mean_seconds)
            .total_cmp(&a.mean_seconds)
            .then(a.name.cmp(&b.name))
    });
    imb.truncate(limits.top);
    rep.imbalance = imb;

    // Call sites.
    let mut sites: BTreeMap<(&str, &str), (u64, u64, usize)> = BTreeMap::new();
    for (r, _) in ranks {
        rep.callsites_captured |= !r.callsites.is_empty();
        for s in &r.callsites {
            let e = sites
                .entry((s.function.as_str(), s.site.as_str()))
                .or_default();
            e.0 = e.0.saturating_add(s.calls);
            e.1 = e.1.saturating_add(s.time_ns);
            e.2 += 1;
        }
    }
    let mut sites: Vec<SiteLine> = sites
        .into_iter()
        .map(|((function, site), (calls, ns, nranks))| SiteLine {
            function: function.into(),
            site: site.into(),
            calls,
            seconds: ns as f64 / 1e9,
            mean_us: mean_us(ns, calls),
            ranks: nranks,
        })
        .collect();
    sites.sort_by(|a, b| {
        b.seconds
            .total_cmp(&a.seconds)
            .then(b.calls.cmp(&a.calls))
            .then(a.function.cmp(&b.function))
            .then(a.site.cmp(&b.site))
    });
    sites.truncate(limits.top);
    rep.callsites = sites;

    // Traffic: sizes, pairs, matrix (from the senders' counters).
    let mut pairs: BTreeMap<(u32, u32), (u64, u64)> = BTreeMap::new();
    for (r, _) in ranks {
        let Some(st) = &r.stats else { continue };
        rep.message_sizes.ranks_with_stats += 1;
        add_into(&mut rep.message_sizes.sent, &st.sizes_sent);
        add_into(&mut rep.message_sizes.recv, &st.sizes_recv);
        let Ok(me) = r.rank.parse::<u32>() else {
            continue;
        };
        for p in &st.peers {
            if p.messages_sent > 0 {
                let e = pairs.entry((me, p.peer)).or_default();
                e.0 = e.0.saturating_add(p.messages_sent);
                e.1 = e.1.saturating_add(p.bytes_sent);
            }
        }
    }
    if rep.message_sizes.ranks_with_stats > 0 {
        let mut world: Vec<u32> = ranks
            .iter()
            .filter_map(|(r, _)| r.rank.parse().ok())
            .collect();
        for &(a, b) in pairs.keys() {
            world.push(a);
            world.push(b);
        }
        world.sort_unstable();
        world.dedup();
        let index: BTreeMap<u32, usize> = world.iter().enumerate().map(|(i, r)| (*r, i)).collect();
        let mut m = vec![vec![0u64; world.len()]; world.len()];
        for (&(a, b), &(_, bytes)) in &pairs {
            let cell = &mut m[index[&a]][index[&b]];
            *cell = cell.saturating_add(bytes);
        }
        rep.matrix = m;
        rep.matrix_ranks = world;
        for v in [&mut rep.message_sizes.sent, &mut rep.message_sizes.recv] {
            v.resize(HIST_SLOTS, 0);
        }
    }
    let mut pl: Vec<PairLine> = pairs
        .into_iter()
        .map(|((from, to), (messages, bytes))| PairLine {
            from,
            to,
            messages,
            bytes,
        })
        .collect();
    pl.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.messages.cmp(&a.messages))
            .then((a.from, a.to).cmp(&(b.from, b.to)))
    });
    pl.truncate(limits.top);
    rep.peer_pairs = pl;
    rep
}

/// The label of a log2 slot's lower bound: `unit` is "ns" or "B".
pub fn slot_label(slot: usize, unit: &str) -> String {
    let v = 1u64 << slot.min(63);
    if unit == "ns" {
        match v {
            v if v < 1_000 => format!("{v}ns"),
            v if v < 1_000_000 => format!("{}us", v / 1_000),
            v if v < 1_000_000_000 => format!("{}ms", v / 1_000_000),
            v => format!("{}s", v / 1_000_000_000),
        }
    } else {
        match v {
            v if v < 1 << 10 => format!("{v}B"),
            v if v < 1 << 20 => format!("{}KiB", v >> 10),
            v if v < 1 << 30 => format!("{}MiB", v >> 20),
            v => format!("{}GiB", v >> 30),
        }
    }
}

/// The reports as JSON: `{"reports": [...]}`.
pub fn json(reports: &[Report]) -> String {
    #[derive(Serialize)]
    struct Out<'a> {
        format: &'static str,
        reports: &'a [Report],
    }
    let mut s = serde_json::to_string_pretty(&Out {
        format: "mpi-observer-analysis/1",
        reports,
    })
    .unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests;

/// What a rank line adds after its source when the job ran in several
/// steps: `, step S`.
fn step_note(l: &RankLine) -> String {
    if l.step.is_empty() {
        String::new()
    } else {
        format!(", step {}", l.step)
    }
}
