//! Wait states from the shim's wait records (issue 37, docs/waits.md),
//! from every rank of a job on this node: the records of one collective
//! instance, matched by their sequence number on `MPI_COMM_WORLD`
//! ([`coll`]), and the two halves of one point-to-point message, matched by
//! their envelope and their number on it ([`p2p`]); Scalasca's formulas
//! applied to them. Pure: records in, figures out; the registry drains the
//! rings (`export/registry/waits.rs`) and the metrics render the figures
//! (`export/metrics/waits.rs`).
//!
//! **Scalasca's definitions** (its pattern documentation, and the callbacks
//! of `MPI.pattern` in its sources). E and L are the enter and leave times
//! of a call; a wait is counted only when positive. The collective patterns
//! are in [`coll`], Late Sender and Late Receiver in [`p2p`].
//!
//! **Exact or not at all.** An instance is evaluated once every member of
//! `MPI_COMM_WORLD` has given its record, a message once both its ranks
//! have, which on one node is exact: the records' clock (the CPU's counter,
//! scaled by the rate the rings give, or `CLOCK_MONOTONIC`) is the node's.
//! What still misses a part [`TIMEOUT_NS`] after its first record (a rank
//! on another node, a rank without the shim's records, a record lost) is
//! counted unresolved, never as a wait, so no culprit is ever named from
//! part of a job.
//!
//! **Trust.** Records come from the job's own processes, so a user can only
//! distort their own job's figures. Which rank a record is from, and so
//! every rank named, is the daemon's (from `/proc`), not the record's. What a
//! job can make the daemon hold is bounded: one entry per rank per
//! instance, [`MAX_PENDING`] instances and as many messages per job.

mod coll;
mod p2p;

use std::collections::{BTreeMap, HashMap, VecDeque};

use observer_common::{FUNCTIONS, functions::Collective, waits};

/// The patterns, in the order of [`Pattern::ALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pattern {
    /// Wait at Barrier.
    WaitBarrier,
    /// Wait at N×N.
    WaitNxn,
    /// Late Broadcast.
    LateBroadcast,
    /// Early Reduce.
    EarlyReduce,
    /// Late Sender.
    LateSender,
    /// Late Receiver.
    LateReceiver,
}

/// How many patterns there are.
pub const PATTERNS: usize = 6;

impl Pattern {
    /// Every pattern.
    pub const ALL: [Pattern; PATTERNS] = [
        Pattern::WaitBarrier,
        Pattern::WaitNxn,
        Pattern::LateBroadcast,
        Pattern::EarlyReduce,
        Pattern::LateSender,
        Pattern::LateReceiver,
    ];

    /// The `pattern` label.
    pub fn label(self) -> &'static str {
        match self {
            Pattern::WaitBarrier => "wait_barrier",
            Pattern::WaitNxn => "wait_nxn",
            Pattern::LateBroadcast => "late_broadcast",
            Pattern::EarlyReduce => "early_reduce",
            Pattern::LateSender => "late_sender",
            Pattern::LateReceiver => "late_receiver",
        }
    }

    /// The pattern of a collective function, if it has one.
    pub fn of(function: u16) -> Option<Pattern> {
        use Collective::*;
        Some(match FUNCTIONS.get(usize::from(function))?.collective? {
            Barrier => Pattern::WaitBarrier,
            Allreduce | Allgather | Allgatherv | Alltoall | Alltoallv | ReduceScatter
            | ReduceScatterBlock => Pattern::WaitNxn,
            Bcast | Scatter | Scatterv => Pattern::LateBroadcast,
            Reduce | Gather | Gatherv => Pattern::EarlyReduce,
            _ => return None,
        })
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Why an instance or a message was not evaluated, in the order of
/// [`Unresolved::ALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unresolved {
    /// A part was missing when it timed out: a rank on another node or
    /// without records, or its record was lost.
    Incomplete,
    /// Its parts disagree: a collective's function or root, a message's
    /// size, or a message received before it was sent (a rank that lost
    /// count of its messages).
    Mismatch,
    /// More than [`MAX_PENDING`] instances, or messages, of the job were
    /// waiting for parts: one was given up.
    Overflow,
    /// Its parts' times cannot be compared: their rings keep different
    /// clocks, or the counter's rate was never given.
    Clock,
    /// A message the shim did not record: its rank had lost count of its
    /// messages, its call's start was not on the ring's clock, or its
    /// envelope found no room in the rank's table.
    Skipped,
}

impl Unresolved {
    /// Every reason.
    pub const ALL: [Unresolved; 5] = [
        Unresolved::Incomplete,
        Unresolved::Mismatch,
        Unresolved::Overflow,
        Unresolved::Clock,
        Unresolved::Skipped,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Unresolved::Incomplete => "incomplete",
            Unresolved::Mismatch => "mismatch",
            Unresolved::Overflow => "overflow",
            Unresolved::Clock => "clock",
            Unresolved::Skipped => "skipped",
        }
    }
}

/// How long an instance (or a message) waits for its last part.
pub const TIMEOUT_NS: u64 = 5_000_000_000;
/// Instances, and messages, a job may have waiting for parts.
pub const MAX_PENDING: usize = 16_384;
/// The culprits' and waiters' window: `_1m`.
pub const WINDOW_NS: u64 = 60_000_000_000;
/// Culprits and waiting ranks named per job: the k of `k="1"`..
pub const TOP_K: usize = 3;
/// Buckets of the window.
const BUCKETS: u64 = 6;
/// One bucket's span.
const BUCKET_NS: u64 = WINDOW_NS / BUCKETS;

/// The key of [`JobWaits::functions`] for a function id no shim writes.
pub const UNKNOWN_FUNCTION: u16 = u16::MAX;

/// One job's wait figures on this node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobWaits {
    /// Seconds the job's ranks waited, per pattern (sampled × period), in ns.
    pub waited_ns: [u64; PATTERNS],
    /// Sampled instances evaluated, per pattern (for Late Sender: receiving
    /// calls).
    pub instances: [u64; PATTERNS],
    /// Instances and messages not evaluated, per reason of
    /// [`Unresolved::ALL`].
    pub unresolved: [u64; 5],
    /// Records the rings lapped, or that changed while they were read.
    pub records_lost: u64,
    /// Records no shim writes (another kind or communicator, a function
    /// that is no collective, a peer or root out of range, a rank's second
    /// record of one instance, a leave before the enter): not matched.
    pub records_invalid: u64,
    /// The collectives' sampling period (the largest its ranks use).
    pub sample_period: u64,
    /// The messages' sampling period (the largest its ranks use), 0 while no
    /// rank records messages.
    pub p2p_sample_period: u64,
    /// The ranks that made the others wait longest over the last minute
    /// (all patterns), at most [`TOP_K`], the most first, each with the
    /// seconds per second it made them wait.
    pub culprits: Vec<(u32, f64)>,
    /// The ranks that waited longest over the last minute, likewise, with
    /// the seconds per second each waited.
    pub waiters: Vec<(u32, f64)>,
    /// Since the job's first record, per rank that waited or made others
    /// wait: what it waited and what it caused, per pattern (the report's
    /// figures). Only ranks the daemon named are keys, so a job holds at
    /// most one entry per rank of it on this node.
    pub ranks: BTreeMap<u32, RankWaits>,
    /// Since the job's first record, what was waited per (function of the
    /// waiting call, pattern), in ns: at most every function times every
    /// pattern.
    pub functions: BTreeMap<(u16, Pattern), u64>,
}

/// One rank's wait figures since its job's first record, in ns, per
/// pattern of [`Pattern::ALL`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankWaits {
    /// What it waited.
    pub waited_ns: [u64; PATTERNS],
    /// What it made others wait, summed over them, as their root cause:
    /// its own lateness, and what others passed on of it (see
    /// [`Job::charge`]).
    pub caused_ns: [u64; PATTERNS],
    /// What others waited for it as the rank that came late (Scalasca's
    /// culprit of each instance), whether or not it was late because it was
    /// itself waiting.
    pub late_ns: [u64; PATTERNS],
}

impl JobWaits {
    /// The first of [`JobWaits::culprits`].
    pub fn culprit(&self) -> Option<(u32, f64)> {
        self.culprits.first().copied()
    }
}

/// One job's matching state.
#[derive(Debug, Default)]
struct Job {
    figures: JobWaits,
    world_size: u32,
    shift: u32,
    /// log2 of the messages' sampling period, once a rank records them.
    p2p_shift: Option<u32>,
    /// The counter's rate, ns per tick in 32.32, as the ranks' rings last
    /// gave it (every rank of a node reads the same counter).
    ns_per_tick: u64,
    coll: coll::Instances,
    p2p: p2p::Messages,
    /// Each rank's ring's count of messages it skipped, as last read.
    skipped: BTreeMap<u32, u64>,
    /// Wait caused per root-cause rank, per 10-second bucket (its index).
    caused: Window,
    /// This settle's evaluated waits, charged at its end, in time order.
    fresh: Vec<Fresh>,
    /// Each rank's last waits ([`RECENT`]), on the records' clock in ns,
    /// with their root causes: what a later wait for it may have been
    /// passed on from.
    recent: BTreeMap<u32, VecDeque<Interval>>,
    /// Wait per waiting rank, likewise.
    waited: Window,
    /// When the job's first record was matched.
    since_ns: Option<u64>,
}

/// The matcher of every job on the node, by job label set.
#[derive(Debug, Default)]
pub struct Waits {
    jobs: HashMap<String, Job>,
}

/// What a rank gave in one drain.
pub struct Drain<'a> {
    /// Its world rank.
    pub rank: u32,
    /// `MPI_COMM_WORLD`'s size as it saw it.
    pub world_size: u32,
    /// log2 of its collectives' sampling period.
    pub shift: u32,
    /// Its ring's `p2p_shift`: log2 of its messages' sampling period plus
    /// one, 0 when it records none.
    pub p2p_shift: u64,
    /// Its ring's clock (`waits::clock`).
    pub clock: u64,
    /// With `waits::clock::TICKS`: the counter's rate, 0 while unknown.
    pub ns_per_tick: u64,
    /// The records read.
    pub records: &'a [waits::Plain],
    /// Records lost.
    pub lost: u64,
    /// Its ring's count of sampled messages it did not record (a running
    /// total).
    pub skipped: u64,
}

#[cfg(test)]
impl<'a> Drain<'a> {
    /// Rank `rank` of a `world_size`-rank job, every instance and message
    /// recorded on `CLOCK_MONOTONIC`, nothing lost or skipped: the tests'
    /// common drain, changed with `..` where a test needs.
    fn ns(rank: u32, world_size: u32, records: &'a [waits::Plain]) -> Drain<'a> {
        Drain {
            rank,
            world_size,
            shift: 0,
            p2p_shift: 1,
            clock: waits::clock::NS,
            ns_per_tick: 0,
            records,
            lost: 0,
            skipped: 0,
        }
    }
}

impl Waits {
    /// Matches what rank `d.rank` of job `job` gave, at `now_ns`
    /// (`CLOCK_MONOTONIC`).
    pub fn add(&mut self, job: &str, d: &Drain<'_>, now_ns: u64) {
        let j = self.jobs.entry(job.to_string()).or_default();
        j.world_size = j.world_size.max(d.world_size);
        j.shift = j.shift.max(d.shift.min(31));
        j.figures.sample_period = 1 << j.shift;
        if let Some(p) = d.p2p_shift.checked_sub(1) {
            let p = p.min(31) as u32;
            let s = j.p2p_shift.map_or(p, |s| s.max(p));
            j.p2p_shift = Some(s);
            j.figures.p2p_sample_period = 1 << s;
        }
        j.figures.records_lost = j.figures.records_lost.saturating_add(d.lost);
        // A running total per rank; one that goes back (a hostile ring, or
        // a rank's new segment) counts from where it went.
        let before = j.skipped.insert(d.rank, d.skipped).unwrap_or(0);
        let skipped = &mut j.figures.unresolved[Unresolved::Skipped as usize];
        *skipped = skipped.saturating_add(d.skipped.saturating_sub(before));
        if d.clock == waits::clock::TICKS && d.ns_per_tick != 0 {
            j.ns_per_tick = d.ns_per_tick;
        }
        for r in d.records {
            j.take(d.rank, d.clock, r, now_ns);
        }
    }

    /// Evaluates the instances and messages whose every part has come, and
    /// gives up those that waited [`TIMEOUT_NS`]; then refreshes the
    /// culprits.
    pub fn settle(&mut self, now_ns: u64) {
        for j in self.jobs.values_mut() {
            j.settle_coll(now_ns);
            j.settle_p2p(now_ns);
            j.charge_fresh();
            let since = j.since_ns.unwrap_or(now_ns);
            j.figures.culprits = j.caused.top(now_ns, since);
            j.figures.waiters = j.waited.top(now_ns, since);
        }
    }

    /// Forgets the jobs `keep` says no more.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.jobs.retain(|k, _| keep(k));
    }

    /// The figures of job `job`, if it has given records.
    pub fn figures(&self, job: &str) -> Option<&JobWaits> {
        self.jobs.get(job).map(|j| &j.figures)
    }

    /// Every job's figures, by job label set.
    pub fn all(&self) -> impl Iterator<Item = (&str, &JobWaits)> {
        self.jobs.iter().map(|(k, j)| (k.as_str(), &j.figures))
    }

    /// Instances and messages waiting for parts, over every job.
    pub fn pending(&self) -> usize {
        self.jobs.values().map(|j| j.coll.len() + j.p2p.len()).sum()
    }

    /// Instances and messages of job `job` waiting for parts: evaluated, or
    /// given up, within [`TIMEOUT_NS`].
    pub fn pending_of(&self, job: &str) -> usize {
        self.jobs.get(job).map_or(0, |j| j.coll.len() + j.p2p.len())
    }
}

/// How a set of records' times become nanoseconds: as they are, or ticks
/// times the counter's rate.
#[derive(Clone, Copy, Debug)]
struct Scale(u64);

impl Scale {
    /// Nanoseconds in `v` of the records' clock.
    fn ns(self, v: u64) -> u64 {
        if self.0 == 0 {
            v
        } else {
            waits::ticks_to_ns(v, self.0)
        }
    }
}

impl Job {
    fn take(&mut self, rank: u32, clock: u64, r: &waits::Plain, now_ns: u64) {
        let valid = (clock == waits::clock::NS || clock == waits::clock::TICKS)
            && r.comm == waits::WORLD
            && r.leave >= r.enter
            && rank < self.world_size;
        match r.kind {
            waits::kind::COLL if valid => self.take_coll(rank, clock, r, now_ns),
            waits::kind::SEND
            | waits::kind::RECV
            | waits::kind::POSTED
            | waits::kind::GROUP_END
                if valid =>
            {
                self.take_p2p(rank, clock, r, now_ns)
            }
            _ => {
                self.figures.records_invalid += 1;
                return;
            }
        }
        self.since_ns.get_or_insert(now_ns);
    }

    /// How the times of records kept on `clocks` compare: `None` when they
    /// cannot (two clocks, or ticks whose rate is not known).
    fn scale(&self, mut clocks: impl Iterator<Item = u64>) -> Option<Scale> {
        let first = clocks.next()?;
        if clocks.any(|c| c != first) {
            return None;
        }
        match first {
            waits::clock::TICKS if self.ns_per_tick != 0 => Some(Scale(self.ns_per_tick)),
            waits::clock::NS => Some(Scale(0)),
            _ => None,
        }
    }

    /// Counts one evaluated instance of `pattern`, made of calls of
    /// `function`, whose members waited `waits`, the rank that came late
    /// being `c.culprit`; the waits are charged at the settle's end
    /// ([`Job::charge_fresh`]).
    fn count(&mut self, pattern: Pattern, function: u16, waits: &[Wait], c: Charge) {
        self.figures.instances[pattern.index()] += 1;
        // A function no shim writes (a hostile record) is filed under one
        // key, [`UNKNOWN_FUNCTION`], so the map stays bounded.
        let function = if usize::from(function) < FUNCTIONS.len() {
            function
        } else {
            UNKNOWN_FUNCTION
        };
        for w in waits.iter().filter(|w| w.ns > 0) {
            self.fresh.push(Fresh {
                wait: *w,
                pattern,
                function,
                charge: c,
            });
        }
    }

    /// Charges the waits this settle evaluated, in the order they ended
    /// (then began, then by rank): a rank's wait is known before any wait
    /// for it that it may have passed on, since it arrived late only after
    /// its own wait ended.
    fn charge_fresh(&mut self) {
        let mut fresh = std::mem::take(&mut self.fresh);
        fresh.sort_by_key(|f| {
            (
                f.wait.start.saturating_add(f.wait.ns),
                f.wait.start,
                f.wait.rank,
            )
        });
        for f in &fresh {
            self.charge(f);
        }
        // The allocation is kept for the next settle.
        fresh.clear();
        self.fresh = fresh;
    }

    /// Charges one wait: to the waiting rank as waited, to the culprit as
    /// the rank that came late, and to its root causes. The part of the
    /// wait during which the culprit was itself waiting (its
    /// [`Job::recent`] waits overlapping this one) was passed on: it is
    /// charged to the root cause of that wait of the culprit's; the rest
    /// is the culprit's own lateness. This is Scalasca's distinction of
    /// direct and propagated wait states (Böhme et al., "Identifying the
    /// root causes of wait states in large-scale parallel applications",
    /// ICPP 2010), followed one wait at a time: a chain A waits for B, who
    /// waited for C, charges C.
    fn charge(&mut self, f: &Fresh) {
        let p = f.pattern.index();
        let (w, c) = (f.wait, f.charge);
        let scaled = |ns: u64| ns.saturating_mul(c.period);
        let ns = scaled(w.ns);
        self.waited.add(w.rank, ns, c.now_ns);
        let r = self.figures.ranks.entry(w.rank).or_default();
        r.waited_ns[p] = r.waited_ns[p].saturating_add(ns);
        let late = &mut self.figures.ranks.entry(c.culprit).or_default().late_ns[p];
        *late = late.saturating_add(ns);
        self.figures.waited_ns[p] = self.figures.waited_ns[p].saturating_add(ns);
        let fw = self
            .figures
            .functions
            .entry((f.function, f.pattern))
            .or_default();
        *fw = fw.saturating_add(ns);
        // The culprit's own waits during this one were passed on: each
        // such stretch is charged to its root cause, the rest of the wait
        // to the culprit's own lateness. The stretches become this rank's
        // record of the wait, for a later wait passed on from it.
        let end = w.start.saturating_add(w.ns);
        let mut over: Vec<Interval> = self
            .recent
            .get(&c.culprit)
            .into_iter()
            .flatten()
            .filter_map(|iv| {
                let (a, b) = (iv.start.max(w.start), iv.end.min(end));
                (a < b).then_some(Interval {
                    start: a,
                    end: b,
                    root: iv.root,
                })
            })
            .collect();
        over.sort_by_key(|iv| iv.start);
        let mut stretches: Vec<Interval> = Vec::with_capacity(over.len() * 2 + 1);
        let mut at = w.start;
        for iv in over {
            // A thread's waits do not overlap; another thread's might:
            // each instant is charged once.
            let from = iv.start.max(at);
            if from >= iv.end {
                continue;
            }
            if at < from {
                stretches.push(Interval {
                    start: at,
                    end: from,
                    root: c.culprit,
                });
            }
            stretches.push(Interval {
                start: from,
                end: iv.end,
                root: iv.root,
            });
            at = iv.end;
        }
        if at < end {
            stretches.push(Interval {
                start: at,
                end,
                root: c.culprit,
            });
        }
        for iv in &stretches {
            let part = scaled(iv.end - iv.start);
            self.caused.add(iv.root, part, c.now_ns);
            let r = &mut self.figures.ranks.entry(iv.root).or_default().caused_ns[p];
            *r = r.saturating_add(part);
        }
        let mine = self.recent.entry(w.rank).or_default();
        for iv in stretches {
            if mine.len() >= RECENT {
                mine.pop_front();
            }
            mine.push_back(iv);
        }
    }
}

/// One member's wait in an evaluated instance or message: who, how long
/// (ns, before the sampling period), from when (ns on the records' clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Wait {
    rank: u32,
    ns: u64,
    start: u64,
}

/// A wait evaluated in this settle, not charged yet.
#[derive(Clone, Copy, Debug)]
struct Fresh {
    wait: Wait,
    pattern: Pattern,
    function: u16,
    charge: Charge,
}

/// A stretch of a rank's past wait, with its root cause.
#[derive(Clone, Copy, Debug)]
struct Interval {
    start: u64,
    end: u64,
    root: u32,
}

/// Stretches of waits remembered per rank for [`Job::charge`]: a wait is
/// passed on within the next few calls, and a job holds at most this many
/// per rank.
const RECENT: usize = 32;

/// To whom, and how, an evaluated instance's wait is charged.
#[derive(Clone, Copy, Debug)]
struct Charge {
    /// The rank that came late.
    culprit: u32,
    /// The sampling period the waits are multiplied by.
    period: u64,
    /// When (`CLOCK_MONOTONIC`), for the one-minute window.
    now_ns: u64,
}

/// Nanoseconds per rank over the last minute, in 10-second buckets (each
/// with its epoch).
#[derive(Debug, Default)]
struct Window([(u64, BTreeMap<u32, u64>); BUCKETS as usize]);

impl Window {
    fn add(&mut self, rank: u32, ns: u64, now_ns: u64) {
        let epoch = now_ns / BUCKET_NS;
        let b = &mut self.0[(epoch % BUCKETS) as usize];
        if b.0 != epoch {
            *b = (epoch, BTreeMap::new());
        }
        let c = b.1.entry(rank).or_default();
        *c = c.saturating_add(ns);
    }

    /// The [`TOP_K`] ranks with the most over the window, the most first
    /// (the lowest rank of equals), each with its nanoseconds per second of
    /// the window (or since `since_ns`, the job's first record, if later).
    fn top(&self, now_ns: u64, since_ns: u64) -> Vec<(u32, f64)> {
        let epoch = now_ns / BUCKET_NS;
        let mut sum: BTreeMap<u32, u64> = BTreeMap::new();
        for (e, m) in &self.0 {
            if *e + BUCKETS > epoch && *e <= epoch {
                for (&r, &ns) in m {
                    let s = sum.entry(r).or_default();
                    *s = s.saturating_add(ns);
                }
            }
        }
        let mut all: Vec<(u32, u64)> = sum.into_iter().collect();
        all.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let span = now_ns.saturating_sub(since_ns).clamp(BUCKET_NS, WINDOW_NS);
        all.into_iter()
            .take(TOP_K)
            .map(|(r, ns)| (r, ns as f64 / span as f64))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str) -> u16 {
        observer_common::function_by_name(name).unwrap()
    }

    fn rec(seq: u64, function: &str, root: i32, enter: u64, leave: u64) -> waits::Plain {
        waits::Plain {
            enter,
            leave,
            seq,
            comm: waits::WORLD,
            function: f(function),
            kind: waits::kind::COLL,
            peer: root,
            ..Default::default()
        }
    }

    const MS: u64 = 1_000_000;

    /// Feeds each rank's records of a `size`-rank job, then settles at `now`.
    fn run(size: u32, shift: u32, per_rank: &[Vec<waits::Plain>], now: u64) -> Waits {
        let mut w = Waits::default();
        for (rank, recs) in per_rank.iter().enumerate() {
            w.add(
                "j",
                &Drain {
                    shift,
                    p2p_shift: 0,
                    ..Drain::ns(rank as u32, size, recs)
                },
                now,
            );
        }
        w.settle(now);
        w
    }

    #[test]
    fn wait_at_barrier_is_charged_to_the_last_to_arrive() {
        // Rank 3 arrives 100 ms late at 10 barriers; everyone leaves at
        // its arrival + 1 ms.
        let per_rank: Vec<Vec<waits::Plain>> = (0..4)
            .map(|r| {
                (0..10)
                    .map(|i| {
                        let t = 1_000 * MS + i * 200 * MS;
                        let enter = if r == 3 { t + 100 * MS } else { t + r * MS };
                        rec(i, "MPI_Barrier", -1, enter, t + 101 * MS)
                    })
                    .collect()
            })
            .collect();
        let w = run(4, 0, &per_rank, 5_000 * MS);
        let j = w.figures("j").unwrap();
        // Ranks 0, 1, 2 wait 100, 99, 98 ms each time.
        assert_eq!(j.waited_ns, [10 * 297 * MS, 0, 0, 0, 0, 0]);
        assert_eq!(j.instances, [10, 0, 0, 0, 0, 0]);
        assert_eq!(j.unresolved, [0; 5]);
        let (rank, rate) = j.culprit().unwrap();
        assert_eq!(rank, 3);
        // 2.97 s caused over the job's first 10 s (the shortest span).
        assert!((rate - 0.297).abs() < 1e-9, "{rate}");
        assert_eq!(j.culprits.len(), 1);
        // The waiters, the longest first: 1, 0.99, 0.98 s over 10 s.
        let waiters: Vec<(u32, f64)> = j.waiters.clone();
        assert_eq!(waiters.iter().map(|w| w.0).collect::<Vec<_>>(), [0, 1, 2]);
        for ((_, got), want) in waiters.iter().zip([0.1, 0.099, 0.098]) {
            assert!((got - want).abs() < 1e-9, "{got} {want}");
        }
        assert_eq!(w.pending(), 0);
        // The report's figures: since the first record, per rank and per
        // function; rank 3 waited nothing and caused it all.
        let wb = Pattern::WaitBarrier.index();
        let waited: Vec<(u32, u64)> = j.ranks.iter().map(|(r, f)| (*r, f.waited_ns[wb])).collect();
        assert_eq!(
            waited,
            [(0, 1_000 * MS), (1, 990 * MS), (2, 980 * MS), (3, 0)]
        );
        let caused: Vec<(u32, u64)> = j.ranks.iter().map(|(r, f)| (*r, f.caused_ns[wb])).collect();
        assert_eq!(caused, [(0, 0), (1, 0), (2, 0), (3, 2_970 * MS)]);
        let barrier = (f("MPI_Barrier"), Pattern::WaitBarrier);
        assert_eq!(
            j.functions.iter().collect::<Vec<_>>(),
            [(&barrier, &(2_970 * MS))]
        );
        assert_eq!(w.pending_of("j"), 0);
    }

    #[test]
    fn nxn_waits_are_clamped_to_the_leave() {
        // Rank 1 leaves before the last arrives (Scalasca's min(E_max, L)).
        let per_rank = vec![
            vec![rec(0, "MPI_Allreduce", -1, 0, 50 * MS)],
            vec![rec(0, "MPI_Allreduce", -1, 10 * MS, 20 * MS)],
            vec![rec(0, "MPI_Allreduce", -1, 30 * MS, 50 * MS)],
        ];
        let j = run(3, 0, &per_rank, 1_000 * MS);
        let j = j.figures("j").unwrap();
        assert_eq!(j.waited_ns[Pattern::WaitNxn.index()], 30 * MS + 10 * MS);
        assert_eq!(j.culprit().map(|c| c.0), Some(2));
    }

    #[test]
    fn rooted_patterns_name_the_root_or_the_latest_sender() {
        // Bcast from a late root 0; Reduce to an early root 0, rank 2 late.
        let per_rank = vec![
            vec![
                rec(0, "MPI_Bcast", 0, 100 * MS, 101 * MS),
                rec(1, "MPI_Reduce", 0, 200 * MS, 280 * MS),
            ],
            vec![
                rec(0, "MPI_Bcast", 0, 0, 102 * MS),
                rec(1, "MPI_Reduce", 0, 210 * MS, 211 * MS),
            ],
            vec![
                rec(0, "MPI_Bcast", 0, 40 * MS, 103 * MS),
                rec(1, "MPI_Reduce", 0, 270 * MS, 271 * MS),
            ],
        ];
        let w = run(3, 0, &per_rank, 1_000 * MS);
        let j = w.figures("j").unwrap();
        assert_eq!(
            j.waited_ns[Pattern::LateBroadcast.index()],
            100 * MS + 60 * MS
        );
        // Only the root waits in a reduce: for rank 2, 70 ms.
        assert_eq!(j.waited_ns[Pattern::EarlyReduce.index()], 70 * MS);
        assert_eq!(j.instances, [0, 0, 1, 1, 0, 0]);
        // Rank 0 caused 160 ms, rank 2 70 ms.
        assert_eq!(j.culprit().map(|c| c.0), Some(0));
    }

    #[test]
    fn an_instance_without_all_its_members_is_never_a_wait() {
        // A 4-rank job with 3 ranks here: nothing evaluated before the
        // timeout, then counted unresolved.
        let per_rank: Vec<Vec<waits::Plain>> = (0..3)
            .map(|r| vec![rec(0, "MPI_Barrier", -1, r * MS, 10 * MS)])
            .collect();
        let mut w = run(4, 0, &per_rank, 1_000 * MS);
        assert_eq!(w.pending(), 1);
        assert_eq!(w.figures("j").unwrap().unresolved, [0; 5]);
        w.settle(1_000 * MS + TIMEOUT_NS);
        let j = w.figures("j").unwrap();
        assert_eq!(j.unresolved, [1, 0, 0, 0, 0]);
        assert_eq!((j.waited_ns, j.culprit()), ([0; PATTERNS], None));
    }

    #[test]
    fn disagreeing_and_invalid_records_are_counted_not_matched() {
        let per_rank = vec![
            vec![
                rec(0, "MPI_Barrier", -1, 0, 1),
                rec(1, "MPI_Bcast", 0, 0, 1),
                // Not a collective, a root beyond the job, time backwards,
                // another communicator, and a second record of seq 0.
                rec(2, "MPI_Send", -1, 0, 1),
                rec(3, "MPI_Bcast", 9, 0, 1),
                rec(4, "MPI_Barrier", -1, 5, 1),
                waits::Plain {
                    comm: 7,
                    ..rec(5, "MPI_Barrier", -1, 0, 1)
                },
                rec(0, "MPI_Barrier", -1, 0, 1),
            ],
            vec![
                rec(0, "MPI_Allreduce", -1, 0, 1),
                rec(1, "MPI_Bcast", 1, 0, 1),
            ],
        ];
        let w = run(2, 0, &per_rank, 0);
        let j = w.figures("j").unwrap();
        assert_eq!(j.unresolved, [0, 2, 0, 0, 0]);
        assert_eq!(j.records_invalid, 5);
        // A collective without a pattern is matched and not counted; a
        // rooted one without a root is a mismatch.
        let per_rank = vec![
            vec![rec(0, "MPI_Scan", -1, 0, 9), rec(1, "MPI_Bcast", -1, 0, 1)],
            vec![rec(0, "MPI_Scan", -1, 5, 9), rec(1, "MPI_Bcast", -1, 0, 1)],
        ];
        let w = run(2, 0, &per_rank, 0);
        let j = w.figures("j").unwrap();
        assert_eq!((j.unresolved, j.records_invalid), ([0, 1, 0, 0, 0], 0));
        assert_eq!((j.waited_ns, j.instances), ([0; PATTERNS], [0; PATTERNS]));
        assert_eq!(w.pending(), 0);
        // A rank beyond the job's size: its records are not matched.
        let mut w = Waits::default();
        w.add(
            "j",
            &Drain {
                rank: 5,
                world_size: 2,
                shift: 0,
                clock: waits::clock::NS,
                ns_per_tick: 0,
                records: &[rec(0, "MPI_Barrier", -1, 0, 1)],
                lost: 3,
                p2p_shift: 0,
                skipped: 0,
            },
            0,
        );
        let j = w.figures("j").unwrap();
        assert_eq!((j.records_invalid, j.records_lost), (1, 3));
    }

    #[test]
    fn sampled_waits_are_scaled_and_pending_instances_bounded() {
        let per_rank = vec![
            vec![rec(0, "MPI_Barrier", -1, 0, 10)],
            vec![rec(0, "MPI_Barrier", -1, 10, 10)],
        ];
        let w = run(2, 3, &per_rank, 0);
        let j = w.figures("j").unwrap();
        assert_eq!((j.waited_ns[0], j.sample_period), (80, 8));
        // A job that never completes an instance holds MAX_PENDING at most.
        let mut w = Waits::default();
        let recs: Vec<waits::Plain> = (0..MAX_PENDING as u64 + 10)
            .map(|s| rec(s, "MPI_Barrier", -1, 0, 1))
            .collect();
        w.add(
            "j",
            &Drain {
                p2p_shift: 0,
                ..Drain::ns(0, 2, &recs)
            },
            0,
        );
        assert_eq!(w.pending(), MAX_PENDING);
        assert_eq!(w.figures("j").unwrap().unresolved, [0, 0, 10, 0, 0]);
        w.retain(|_| false);
        assert_eq!(w.pending(), 0);
        assert!(w.figures("j").is_none());
    }

    #[test]
    fn counter_ticks_are_scaled_by_the_rate_the_rings_give() {
        let drain = |rank, clock, ns_per_tick, records: &[waits::Plain]| {
            let records = records.to_vec();
            move |w: &mut Waits, now| {
                w.add(
                    "j",
                    &Drain {
                        rank,
                        world_size: 2,
                        shift: 0,
                        clock,
                        ns_per_tick,
                        records: &records,
                        lost: 0,
                        p2p_shift: 0,
                        skipped: 0,
                    },
                    now,
                )
            }
        };
        let ticks = waits::clock::TICKS;
        // Rank 1 is 1,000 ticks late; no rate yet: the instance waits.
        let mut w = Waits::default();
        drain(0, ticks, 0, &[rec(0, "MPI_Barrier", -1, 5_000, 6_100)])(&mut w, 0);
        drain(1, ticks, 0, &[rec(0, "MPI_Barrier", -1, 6_000, 6_100)])(&mut w, 0);
        w.settle(0);
        assert_eq!(w.pending(), 1);
        // The rate comes (2 ns a tick): 1,000 ticks are 2 µs.
        drain(1, ticks, 2 << 32, &[])(&mut w, 1);
        w.settle(1);
        let j = w.figures("j").unwrap();
        assert_eq!((j.waited_ns[0], j.instances[0]), (2_000, 1));
        // Never given: unresolved at the timeout, as a clock problem.
        let mut w = Waits::default();
        drain(0, ticks, 0, &[rec(0, "MPI_Barrier", -1, 0, 1)])(&mut w, 0);
        drain(1, ticks, 0, &[rec(0, "MPI_Barrier", -1, 0, 1)])(&mut w, 0);
        w.settle(TIMEOUT_NS);
        assert_eq!(w.figures("j").unwrap().unresolved, [0, 0, 0, 1, 0]);
        // Two clocks in one instance: never compared.
        let mut w = Waits::default();
        drain(0, ticks, 1 << 32, &[rec(0, "MPI_Barrier", -1, 0, 1)])(&mut w, 0);
        let ns = waits::clock::NS;
        drain(1, ns, 0, &[rec(0, "MPI_Barrier", -1, 0, 1)])(&mut w, 0);
        w.settle(0);
        let j = w.figures("j").unwrap();
        assert_eq!(
            (j.unresolved, j.instances),
            ([0, 0, 0, 1, 0], [0; PATTERNS])
        );
        // A clock no shim writes: the record is invalid.
        let mut w = Waits::default();
        drain(0, 9, 0, &[rec(0, "MPI_Barrier", -1, 0, 1)])(&mut w, 0);
        assert_eq!(w.figures("j").unwrap().records_invalid, 1);
    }

    #[test]
    fn only_the_top_k_culprits_and_waiters_are_named() {
        // Five ranks, each late in turn by its rank's ms at one barrier,
        // 100 ms apart.
        let per_rank: Vec<Vec<waits::Plain>> = (0..5u64)
            .map(|r| {
                (0..5u64)
                    .map(|late| {
                        let t = late * 100 * MS;
                        let enter = if r == late { t + late * MS } else { t };
                        rec(late, "MPI_Barrier", -1, enter, t + 10 * MS)
                    })
                    .collect()
            })
            .collect();
        let w = run(5, 0, &per_rank, 1_000 * MS);
        let j = w.figures("j").unwrap();
        let ranks = |v: &[(u32, f64)]| v.iter().map(|c| c.0).collect::<Vec<_>>();
        // Rank 4 made four ranks wait 4 ms; rank 0 made nobody wait.
        assert_eq!(ranks(&j.culprits), [4, 3, 2]);
        // Everyone waited for the others' lateness but its own: rank 0 the
        // most (1+2+3+4 ms), rank 4 the least.
        assert_eq!(ranks(&j.waiters), [0, 1, 2]);
        assert_eq!(TOP_K, 3);
    }

    #[test]
    fn the_culprit_window_forgets_what_is_older_than_a_minute() {
        let mut w = Waits::default();
        let barrier = |seq, late: u64| {
            [
                vec![rec(seq, "MPI_Barrier", -1, 0, late)],
                vec![rec(seq, "MPI_Barrier", -1, late, late)],
            ]
        };
        let feed = |w: &mut Waits, per: [Vec<waits::Plain>; 2], now| {
            for (rank, recs) in per.iter().enumerate() {
                w.add(
                    "j",
                    &Drain {
                        p2p_shift: 0,
                        ..Drain::ns(rank as u32, 2, recs)
                    },
                    now,
                );
            }
            w.settle(now);
        };
        feed(&mut w, barrier(0, 10 * MS), 0);
        assert_eq!(w.figures("j").unwrap().culprit().map(|c| c.0), Some(1));
        // Rank 0 late, much later: rank 1's old wait has left the window.
        let t = 2 * WINDOW_NS;
        let late = [
            vec![rec(1, "MPI_Barrier", -1, t + MS, t + MS)],
            vec![rec(1, "MPI_Barrier", -1, t, t + MS)],
        ];
        feed(&mut w, late, 2 * WINDOW_NS);
        let (rank, rate) = w.figures("j").unwrap().culprit().unwrap();
        assert_eq!(rank, 0);
        assert!((rate - MS as f64 / WINDOW_NS as f64).abs() < 1e-12);
    }
}
