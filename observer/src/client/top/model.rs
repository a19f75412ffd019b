//! What `top` shows, computed from readings: a [`Frame`] of ranks with their
//! counters and rates, and the rows of each screen, sorted and filtered.
//! Pure functions of their input, so the tests need no terminal or server.

use std::{
    cmp::Ordering,
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use super::source::{Reading, Sample};
use crate::{
    client::report::waits::pattern_name,
    export::names::{
        BYTES, CALLS, LAYER_BYTES, OLDEST_AGE, OUTSTANDING, PEER_BYTES, RANK_INFO,
        RANK_MPI_SECONDS, RANK_UP, SECONDS, WAIT_CULPRIT, WAIT_CULPRIT_FRACTION, WAIT_SECONDS,
    },
};

/// A counter's value and its per-second rate (0 until known).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counter {
    /// Since the rank was attached.
    pub total: f64,
    /// Per second, over the last interval.
    pub rate: f64,
}

/// One function's figures on one rank.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Func {
    /// Completed calls.
    pub calls: Counter,
    /// Seconds inside them.
    pub seconds: Counter,
    /// Bytes, both directions.
    pub bytes: Counter,
}

/// A rank's identity: its job and rank, ordered numerically by rank.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RankKey {
    /// The `jobid` label.
    pub jobid: String,
    num: u64,
    /// The `rank` label (`unknown` when the observer could not tell).
    pub rank: String,
}

impl RankKey {
    /// The key of `rank` in `jobid`.
    pub fn new(jobid: &str, rank: &str) -> RankKey {
        RankKey {
            jobid: jobid.to_string(),
            num: rank.parse().unwrap_or(u64::MAX),
            rank: rank.to_string(),
        }
    }
}

/// One rank as read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rank {
    /// The `instance` its figures came from: its node.
    pub node: String,
    /// From `mpi_rank_info`, empty if absent.
    pub pid: String,
    /// World size, from `mpi_rank_info`.
    pub size: String,
    /// MPI library and version, from `mpi_rank_info`.
    pub library: String,
    /// The library's version.
    pub version: String,
    /// Whether it still runs (`mpi_rank_up`).
    pub up: bool,
    /// Per function.
    pub functions: BTreeMap<String, Func>,
    /// Bytes per function from the `stats` layer (used when the rank has
    /// no probe bytes).
    layer_bytes: BTreeMap<String, Counter>,
    has_probe_bytes: bool,
    /// Bytes sent to each peer rank (`stats` layer).
    pub peers_sent: BTreeMap<String, Counter>,
    /// Outstanding requests and the oldest one's age (`stats` layer).
    pub requests: Option<(f64, f64)>,
    /// Seconds in MPI, all functions: what a rank without per-function
    /// series (not a detail rank, through Prometheus) is shown by.
    pub mpi_seconds: Counter,
}

impl Rank {
    /// Its MPI time per second: the fraction of wall time in MPI calls.
    pub fn mpi_fraction(&self) -> f64 {
        if self.functions.is_empty() {
            return self.mpi_seconds.rate;
        }
        self.functions.values().map(|f| f.seconds.rate).sum()
    }

    fn calls_rate(&self) -> f64 {
        self.functions.values().map(|f| f.calls.rate).sum()
    }

    fn bytes_rate(&self) -> f64 {
        self.functions.values().map(|f| f.bytes.rate).sum()
    }

    /// Seconds per function over the last interval, or since attach when
    /// the interval had none.
    fn time_by_function(&self) -> impl Iterator<Item = (&str, f64)> {
        let recent = self.functions.values().any(|f| f.seconds.rate > 0.0);
        self.functions.iter().map(move |(n, f)| {
            let t = if recent {
                f.seconds.rate
            } else {
                f.seconds.total
            };
            (n.as_str(), t)
        })
    }

    /// The function it spent most time in (see [`Rank::time_by_function`]).
    pub fn busiest(&self) -> Option<&str> {
        busiest(self.time_by_function())
    }
}

fn busiest<'a>(it: impl Iterator<Item = (&'a str, f64)>) -> Option<&'a str> {
    it.filter(|(_, t)| *t > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(n, _)| n)
}

/// A job's wait states on one node, as its observer exports them (the
/// `stats` layer's, docs/waits.md): per job and node, never per rank.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeWaits {
    /// Seconds the node's ranks waited, per pattern label.
    pub seconds: BTreeMap<String, Counter>,
    /// By `k` (1 the most): the rank the others waited for, and how long
    /// per second, over the last minute.
    pub culprits: BTreeMap<String, (Option<String>, f64)>,
}

/// Every rank of one reading, with rates.
#[derive(Clone, Debug)]
pub struct Frame {
    /// When it was read.
    pub at: Instant,
    /// The ranks.
    pub ranks: BTreeMap<RankKey, Rank>,
    /// The jobs' wait states, by job id and node.
    pub waits: BTreeMap<(String, String), NodeWaits>,
    /// Whether rates are known: false for an observer's first reading.
    pub rated: bool,
}

impl Frame {
    /// Builds a frame from a reading; an observer's rates come from `prev`.
    pub fn new(reading: &Reading, prev: Option<&Frame>) -> Frame {
        let mut f = Frame::from_samples(reading.at, &reading.samples);
        match (&reading.rates, prev) {
            (Some(rates), _) => f.apply_rates(rates),
            (None, Some(prev)) => f.derive_rates(prev),
            (None, None) => {}
        }
        f.finish();
        f
    }

    /// The ranks and their totals, without rates.
    fn from_samples(at: Instant, samples: &[Sample]) -> Frame {
        let mut ranks: BTreeMap<RankKey, Rank> = BTreeMap::new();
        // mpi_rank_info first: it names each rank's node, and a rank seen
        // from two nodes (two observers on one process) is taken from one.
        let mut ordered: Vec<&Sample> = samples.iter().collect();
        ordered.sort_by_key(|s| s.name != RANK_INFO);
        let mut waits: BTreeMap<(String, String), NodeWaits> = BTreeMap::new();
        for s in ordered {
            let node = s.label("instance").unwrap_or_default();
            if matches!(
                s.name.as_str(),
                WAIT_SECONDS | WAIT_CULPRIT | WAIT_CULPRIT_FRACTION
            ) {
                let Some(jobid) = s.label("jobid") else {
                    continue;
                };
                let w = waits.entry((jobid.into(), node.into())).or_default();
                let k = || s.label("k").unwrap_or_default().to_string();
                match s.name.as_str() {
                    WAIT_SECONDS => {
                        let p = s.label("pattern").unwrap_or("?").to_string();
                        w.seconds.entry(p).or_default().total += s.value;
                    }
                    // A rank is a whole number; anything else names none.
                    WAIT_CULPRIT => {
                        w.culprits.entry(k()).or_default().0 = (s.value >= 0.0
                            && s.value < f64::from(u32::MAX)
                            && s.value.fract() == 0.0)
                            .then(|| format!("{}", s.value as u32));
                    }
                    _ => w.culprits.entry(k()).or_default().1 = s.value,
                }
                continue;
            }
            let (Some(jobid), Some(rank)) = (s.label("jobid"), s.label("rank")) else {
                continue;
            };
            let r = ranks
                .entry(RankKey::new(jobid, rank))
                .or_insert_with(|| Rank {
                    node: node.to_string(),
                    up: true,
                    ..Rank::default()
                });
            if r.node != node {
                continue;
            }
            let l = |k| s.label(k).unwrap_or_default().to_string();
            let func = || s.label("function").unwrap_or("?").to_string();
            match s.name.as_str() {
                RANK_INFO => {
                    (r.pid, r.size, r.library, r.version) =
                        (l("pid"), l("size"), l("library"), l("version"));
                }
                RANK_UP => r.up = s.value != 0.0,
                CALLS => r.functions.entry(func()).or_default().calls.total += s.value,
                SECONDS => r.functions.entry(func()).or_default().seconds.total += s.value,
                BYTES => {
                    r.has_probe_bytes = true;
                    r.functions.entry(func()).or_default().bytes.total += s.value;
                }
                LAYER_BYTES => r.layer_bytes.entry(func()).or_default().total += s.value,
                PEER_BYTES if s.label("direction") == Some("send") => {
                    r.peers_sent.entry(l("peer")).or_default().total += s.value;
                }
                RANK_MPI_SECONDS => r.mpi_seconds.total += s.value,
                OUTSTANDING => r.requests.get_or_insert((0.0, 0.0)).0 = s.value,
                OLDEST_AGE => r.requests.get_or_insert((0.0, 0.0)).1 = s.value,
                _ => {}
            }
        }
        Frame {
            at,
            ranks,
            waits,
            rated: false,
        }
    }

    /// Rates from the previous reading of an observer: the increase over
    /// the time between them (a counter that went down was reset, so all of
    /// its value is new). A rank new since then, or with another pid, has
    /// none yet.
    pub fn derive_rates(&mut self, prev: &Frame) {
        let dt = self.at.saturating_duration_since(prev.at).as_secs_f64();
        if dt <= 0.0 {
            return;
        }
        let rate = |now: &mut Counter, before: Option<&Counter>| {
            let b = before.map_or(0.0, |c| c.total);
            let inc = if now.total >= b {
                now.total - b
            } else {
                now.total
            };
            now.rate = inc / dt;
        };
        for (k, r) in &mut self.ranks {
            let Some(p) = prev.ranks.get(k).filter(|p| p.pid == r.pid) else {
                continue;
            };
            for (n, f) in &mut r.functions {
                let pf = p.functions.get(n);
                rate(&mut f.calls, pf.map(|f| &f.calls));
                rate(&mut f.seconds, pf.map(|f| &f.seconds));
                rate(&mut f.bytes, pf.map(|f| &f.bytes));
            }
            for (n, c) in &mut r.layer_bytes {
                rate(c, p.layer_bytes.get(n));
            }
            rate(&mut r.mpi_seconds, Some(&p.mpi_seconds));
            for (n, c) in &mut r.peers_sent {
                rate(c, p.peers_sent.get(n));
            }
        }
        for (k, w) in &mut self.waits {
            let Some(p) = prev.waits.get(k) else {
                continue;
            };
            for (n, c) in &mut w.seconds {
                if let Some(b) = p.seconds.get(n) {
                    rate(c, Some(b));
                }
            }
        }
        self.rated = true;
    }

    /// Rates a source computed (Prometheus's `irate`), named and labelled
    /// as the counters are.
    pub fn apply_rates(&mut self, rates: &[Sample]) {
        for s in rates {
            if s.name == WAIT_SECONDS {
                let key = (
                    s.label("jobid").unwrap_or_default().to_string(),
                    s.label("instance").unwrap_or_default().to_string(),
                );
                let p = s.label("pattern").unwrap_or("?");
                if let Some(c) = self.waits.get_mut(&key).and_then(|w| w.seconds.get_mut(p)) {
                    c.rate += s.value;
                }
                continue;
            }
            let (Some(jobid), Some(rank)) = (s.label("jobid"), s.label("rank")) else {
                continue;
            };
            let Some(r) = self.ranks.get_mut(&RankKey::new(jobid, rank)) else {
                continue;
            };
            if s.label("instance").unwrap_or_default() != r.node {
                continue;
            }
            let func = s.label("function").unwrap_or("?");
            let f = r.functions.get_mut(func);
            let c = match s.name.as_str() {
                CALLS => f.map(|f| &mut f.calls),
                SECONDS => f.map(|f| &mut f.seconds),
                BYTES => f.map(|f| &mut f.bytes),
                LAYER_BYTES => r.layer_bytes.get_mut(func),
                RANK_MPI_SECONDS => Some(&mut r.mpi_seconds),
                PEER_BYTES if s.label("direction") == Some("send") => {
                    r.peers_sent.get_mut(s.label("peer").unwrap_or_default())
                }
                _ => None,
            };
            if let Some(c) = c {
                c.rate += s.value;
            }
        }
        self.rated = true;
    }

    /// A rank without probe bytes takes the `stats` layer's.
    fn finish(&mut self) {
        for r in self.ranks.values_mut() {
            if !r.has_probe_bytes {
                for (n, c) in &r.layer_bytes {
                    r.functions.entry(n.clone()).or_default().bytes = *c;
                }
            }
        }
    }

    /// The ranks of `jobid`.
    fn job(&self, jobid: &str) -> impl Iterator<Item = (&RankKey, &Rank)> {
        self.ranks.iter().filter(move |(k, _)| k.jobid == jobid)
    }
}

/// Case-insensitive substring match over a row's fields; an empty filter
/// matches everything.
pub fn matches(filter: &str, fields: &[&str]) -> bool {
    let f = filter.to_lowercase();
    f.is_empty() || fields.iter().any(|x| x.to_lowercase().contains(&f))
}

fn desc(a: f64, b: f64) -> Ordering {
    b.total_cmp(&a)
}

// ------------------------------------------------------------------ jobs

/// One row of the jobs screen.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRow {
    /// The `jobid` label.
    pub jobid: String,
    /// Ranks seen, running or retained.
    pub ranks: usize,
    /// Ranks still running.
    pub running: usize,
    /// Distinct nodes (observers) its ranks are on.
    pub nodes: usize,
    /// Mean fraction of wall time in MPI over its running ranks.
    pub mpi: f64,
    /// Calls per second, all ranks.
    pub calls_rate: f64,
    /// Bytes per second, all ranks.
    pub bytes_rate: f64,
    /// The function its ranks spent most time in.
    pub busiest: Option<String>,
}

/// Sort keys of the jobs screen, in the order `s` cycles them.
pub const JOB_SORTS: [&str; 5] = ["MPI %", "calls/s", "bytes/s", "ranks", "job"];

/// The jobs screen's rows, filtered on the job id and sorted by
/// `JOB_SORTS[sort]`.
pub fn jobs(frame: &Frame, filter: &str, sort: usize) -> Vec<JobRow> {
    let mut rows: Vec<JobRow> = Vec::new();
    let ids: BTreeSet<&str> = frame.ranks.keys().map(|k| k.jobid.as_str()).collect();
    for id in ids.into_iter().filter(|id| matches(filter, &[id])) {
        let ranks: Vec<&Rank> = frame.job(id).map(|(_, r)| r).collect();
        let running: Vec<&&Rank> = ranks.iter().filter(|r| r.up).collect();
        let mut time: BTreeMap<&str, f64> = BTreeMap::new();
        let recent = ranks
            .iter()
            .any(|r| r.functions.values().any(|f| f.seconds.rate > 0.0));
        for r in &ranks {
            for (n, f) in &r.functions {
                *time.entry(n).or_default() += if recent {
                    f.seconds.rate
                } else {
                    f.seconds.total
                };
            }
        }
        rows.push(JobRow {
            jobid: id.to_string(),
            ranks: ranks.len(),
            running: running.len(),
            nodes: ranks.iter().map(|r| &r.node).collect::<BTreeSet<_>>().len(),
            mpi: if running.is_empty() {
                0.0
            } else {
                running.iter().map(|r| r.mpi_fraction()).sum::<f64>() / running.len() as f64
            },
            calls_rate: ranks.iter().map(|r| r.calls_rate()).sum(),
            bytes_rate: ranks.iter().map(|r| r.bytes_rate()).sum(),
            busiest: busiest(time.into_iter()).map(str::to_string),
        });
    }
    rows.sort_by(|a, b| {
        match sort {
            0 => desc(a.mpi, b.mpi),
            1 => desc(a.calls_rate, b.calls_rate),
            2 => desc(a.bytes_rate, b.bytes_rate),
            3 => b.ranks.cmp(&a.ranks),
            _ => Ordering::Equal,
        }
        .then_with(|| a.jobid.cmp(&b.jobid))
    });
    rows
}

// ----------------------------------------------------------------- ranks

/// One row of a job's ranks screen.
#[derive(Clone, Debug, PartialEq)]
pub struct RankRow {
    /// Its key.
    pub key: RankKey,
    /// Its node.
    pub node: String,
    /// Its pid.
    pub pid: String,
    /// Whether it still runs.
    pub up: bool,
    /// Fraction of wall time in MPI.
    pub mpi: f64,
    /// Calls per second.
    pub calls_rate: f64,
    /// Bytes per second.
    pub bytes_rate: f64,
    /// The function it spent most time in.
    pub busiest: Option<String>,
    /// Outstanding requests and the oldest one's age in seconds, when the
    /// rank runs the `stats` layer.
    pub requests: Option<(f64, f64)>,
}

/// Sort keys of the ranks screen.
pub const RANK_SORTS: [&str; 5] = ["rank", "MPI %", "calls/s", "bytes/s", "outstanding"];

/// A job's ranks, filtered on rank, node, pid and busiest function.
pub fn ranks(frame: &Frame, jobid: &str, filter: &str, sort: usize) -> Vec<RankRow> {
    let mut rows: Vec<RankRow> = frame
        .job(jobid)
        .map(|(k, r)| RankRow {
            key: k.clone(),
            node: r.node.clone(),
            pid: r.pid.clone(),
            up: r.up,
            mpi: r.mpi_fraction(),
            calls_rate: r.calls_rate(),
            bytes_rate: r.bytes_rate(),
            busiest: r.busiest().map(str::to_string),
            requests: r.requests,
        })
        .filter(|r| {
            matches(
                filter,
                &[
                    &r.key.rank,
                    &r.node,
                    &r.pid,
                    r.busiest.as_deref().unwrap_or_default(),
                ],
            )
        })
        .collect();
    let out = |r: &RankRow| r.requests.map_or(-1.0, |q| q.0);
    rows.sort_by(|a, b| {
        match sort {
            1 => desc(a.mpi, b.mpi),
            2 => desc(a.calls_rate, b.calls_rate),
            3 => desc(a.bytes_rate, b.bytes_rate),
            4 => desc(out(a), out(b)),
            _ => Ordering::Equal,
        }
        .then_with(|| a.key.cmp(&b.key))
    });
    rows
}

/// A job's rank imbalance, as the dashboards define it: the busiest and
/// idlest running rank's MPI fraction, and the spread between them. The
/// idlest rank is the likely straggler: the others wait for it in MPI.
#[derive(Clone, Debug, PartialEq)]
pub struct Imbalance {
    /// The highest MPI fraction and its rank.
    pub max: (f64, String),
    /// The lowest MPI fraction and its rank.
    pub min: (f64, String),
}

/// The spread above which the dashboards' `MPIJobRankImbalance` fires.
pub const SPREAD_ALERT: f64 = 0.25;

impl Imbalance {
    /// Max minus min.
    pub fn spread(&self) -> f64 {
        self.max.0 - self.min.0
    }
}

/// The imbalance over the running ranks of a job (all of them, whatever the
/// filter); none with fewer than two, or before rates are known.
pub fn imbalance(frame: &Frame, jobid: &str) -> Option<Imbalance> {
    if !frame.rated {
        return None;
    }
    let running: Vec<(f64, &str)> = frame
        .job(jobid)
        .filter(|(_, r)| r.up)
        .map(|(k, r)| (r.mpi_fraction(), k.rank.as_str()))
        .collect();
    if running.len() < 2 {
        return None;
    }
    let max = running.iter().max_by(|a, b| a.0.total_cmp(&b.0))?;
    let min = running.iter().min_by(|a, b| a.0.total_cmp(&b.0))?;
    Some(Imbalance {
        max: (max.0, max.1.to_string()),
        min: (min.0, min.1.to_string()),
    })
}

/// What a job's ranks lose waiting for late ranks, over the last interval
/// (the `stats` layer's wait states, docs/waits.md).
#[derive(Clone, Debug, PartialEq)]
pub struct Waiting {
    /// Seconds waited per second, over the job's running ranks: the share
    /// of their time.
    pub share: f64,
    /// The same per pattern (its name, as the report gives it), the most
    /// first, those with any.
    pub patterns: Vec<(String, f64)>,
    /// The rank the others waited for most over the last minute, and how
    /// long per second, if anybody waited.
    pub culprit: Option<(String, f64)>,
}

/// The job's waiting; `None` when no node exports its wait states (the
/// job runs without the `stats` layer), or before rates are known.
pub fn waiting(frame: &Frame, jobid: &str) -> Option<Waiting> {
    if !frame.rated {
        return None;
    }
    let nodes: Vec<&NodeWaits> = frame
        .waits
        .iter()
        .filter(|((j, _), _)| j == jobid)
        .map(|(_, w)| w)
        .collect();
    if nodes.is_empty() {
        return None;
    }
    let running = frame.job(jobid).filter(|(_, r)| r.up).count().max(1) as f64;
    let mut by_pattern: BTreeMap<&str, f64> = BTreeMap::new();
    for w in &nodes {
        for (p, c) in &w.seconds {
            *by_pattern.entry(p.as_str()).or_default() += c.rate;
        }
    }
    let share = by_pattern.values().sum::<f64>() / running;
    let mut patterns: Vec<(String, f64)> = by_pattern
        .into_iter()
        .filter(|(_, r)| *r > 0.0)
        .map(|(p, r)| (pattern_name(p).to_string(), r / running))
        .collect();
    patterns.sort_by(|a, b| desc(a.1, b.1).then_with(|| a.0.cmp(&b.0)));
    // Each node names its own culprits; the job's is the one that made
    // others wait longest.
    let culprit = nodes
        .iter()
        .filter_map(|w| w.culprits.get("1"))
        .filter_map(|(rank, f)| Some((rank.clone()?, *f)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    Some(Waiting {
        share,
        patterns,
        culprit,
    })
}

// ------------------------------------------------------------- functions

/// One row of a rank's functions screen.
#[derive(Clone, Debug, PartialEq)]
pub struct FuncRow {
    /// Standard name.
    pub name: String,
    /// Calls per second.
    pub calls_rate: f64,
    /// Calls since attach.
    pub calls: f64,
    /// Its share of the rank's MPI time over the last interval (since
    /// attach when the interval had none).
    pub share: f64,
    /// Mean seconds per call over the last interval (since attach when it
    /// had no call).
    pub mean_latency: Option<f64>,
    /// Bytes per second.
    pub bytes_rate: f64,
    /// Bytes since attach.
    pub bytes: f64,
}

/// Sort keys of the functions screen.
pub const FUNC_SORTS: [&str; 5] = ["time", "calls/s", "latency", "bytes/s", "name"];

/// A rank's functions, filtered on the name; empty if the rank is gone.
pub fn functions(frame: &Frame, key: &RankKey, filter: &str, sort: usize) -> Vec<FuncRow> {
    let Some(r) = frame.ranks.get(key) else {
        return Vec::new();
    };
    let times: BTreeMap<&str, f64> = r.time_by_function().collect();
    let all: f64 = times.values().sum();
    let mut rows: Vec<FuncRow> = r
        .functions
        .iter()
        .filter(|(n, _)| matches(filter, &[n]))
        .map(|(n, f)| {
            let (dt, dc) = if f.calls.rate > 0.0 {
                (f.seconds.rate, f.calls.rate)
            } else {
                (f.seconds.total, f.calls.total)
            };
            FuncRow {
                name: n.clone(),
                calls_rate: f.calls.rate,
                calls: f.calls.total,
                share: if all > 0.0 {
                    times[n.as_str()] / all
                } else {
                    0.0
                },
                mean_latency: (dc > 0.0).then(|| dt / dc),
                bytes_rate: f.bytes.rate,
                bytes: f.bytes.total,
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        match sort {
            0 => desc(a.share, b.share).then_with(|| desc(a.calls, b.calls)),
            1 => desc(a.calls_rate, b.calls_rate),
            2 => desc(
                a.mean_latency.unwrap_or(-1.0),
                b.mean_latency.unwrap_or(-1.0),
            ),
            3 => desc(a.bytes_rate, b.bytes_rate),
            _ => Ordering::Equal,
        }
        .then_with(|| a.name.cmp(&b.name))
    });
    rows
}

// ---------------------------------------------------------------- matrix

/// The rank × rank matrix of bytes sent (`mpi_peer_bytes_total`,
/// direction `send`): row = sender, column = receiver.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    /// Every rank that sent or received, in rank order.
    pub ranks: Vec<String>,
    /// (sender index, receiver index) → bytes sent.
    pub cells: BTreeMap<(usize, usize), Counter>,
}

/// The matrix of `jobid`; `None` when none of its ranks runs the `stats`
/// layer (no peer figures).
pub fn matrix(frame: &Frame, jobid: &str) -> Option<Matrix> {
    let mut names: BTreeSet<RankKey> = BTreeSet::new();
    let mut any = false;
    for (k, r) in frame.job(jobid) {
        if r.requests.is_some() || !r.peers_sent.is_empty() {
            any = true;
            names.insert(k.clone());
            names.extend(r.peers_sent.keys().map(|p| RankKey::new(jobid, p)));
        }
    }
    if !any {
        return None;
    }
    let ranks: Vec<String> = names.into_iter().map(|k| k.rank).collect();
    let index = |r: &str| ranks.iter().position(|x| x == r);
    let mut cells = BTreeMap::new();
    for (k, r) in frame.job(jobid) {
        for (peer, c) in &r.peers_sent {
            if let (Some(i), Some(j)) = (index(&k.rank), index(peer)) {
                cells.insert((i, j), *c);
            }
        }
    }
    Some(Matrix { ranks, cells })
}

#[cfg(test)]
mod tests;
