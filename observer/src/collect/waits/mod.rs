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

mod clocks;
mod coll;
mod p2p;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

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
/// Instances, and messages (at least: see [`MESSAGES_PER_RANK`]), a job
/// may have waiting for parts.
pub const MAX_PENDING: usize = 16_384;
/// Messages a job may have waiting for a half, per rank the daemon knows
/// (drained here, or shipped by a peer; never as many as a record claims):
/// a drain's messages wait for their other half until the settle, and a
/// halo exchange of 128 ranks, 4 neighbours and 10,000 messages a second
/// each, sampled 1 in 8, has 160,000 in 250 ms.
pub const MESSAGES_PER_RANK: usize = 2_048;
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
    /// For a job whose records came from other nodes too: the largest
    /// uncertainty of their clocks' offsets to this node's, in ns (half the
    /// interval the records bound it to; infinite while a side is
    /// unbounded). `None` for a job on this node only.
    pub clock_uncertainty_ns: Option<f64>,
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
    /// The ranks this daemon drained.
    local: HashSet<u32>,
    /// The other nodes' ranks and clocks.
    nodes: clocks::Nodes,
    /// The settle's time (`CLOCK_MONOTONIC`): the clocks' bounds drift
    /// from when they were learned.
    now_ns: u64,
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
        j.local.insert(d.rank);
        j.sizes(d);
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
            j.take(d.rank, d.clock, 0, r, now_ns);
        }
    }

    /// Matches what rank `d.rank` of job `job` on another node gave, as
    /// that node's daemon shipped it (`node`: the peer as this daemon's
    /// configuration names it), its times in that node's `CLOCK_MONOTONIC`
    /// nanoseconds (`d.clock` is `waits::clock::NS`), at `now_ns`.
    ///
    /// Its lost and skipped records are that node's to count. A rank this
    /// daemon drains itself, or one another peer shipped first, is not
    /// taken: its records count as invalid.
    pub fn add_remote(&mut self, job: &str, node: &str, d: &Drain<'_>, now_ns: u64) {
        let j = self.jobs.entry(job.to_string()).or_default();
        let claimed = match j.nodes.id(node) {
            Some(id) if !j.local.contains(&d.rank) && j.nodes.claim(d.rank, id) => Some(id),
            _ => None,
        };
        let Some(id) = claimed else {
            let n = d.records.len() as u64;
            j.figures.records_invalid = j.figures.records_invalid.saturating_add(n);
            return;
        };
        j.sizes(d);
        for r in d.records {
            j.take(d.rank, d.clock, id, r, now_ns);
        }
    }

    /// Evaluates the instances and messages whose every part has come, and
    /// gives up those that waited [`TIMEOUT_NS`]; then refreshes the
    /// culprits.
    pub fn settle(&mut self, now_ns: u64) {
        for j in self.jobs.values_mut() {
            j.now_ns = now_ns;
            j.settle_coll(now_ns);
            j.settle_p2p(now_ns);
            j.charge_fresh();
            let since = j.since_ns.unwrap_or(now_ns);
            j.figures.culprits = j.caused.top(now_ns, since);
            j.figures.waiters = j.waited.top(now_ns, since);
            j.figures.clock_uncertainty_ns = j.nodes.uncertainty(now_ns);
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
    /// What a drain says of the job's size and sampling: the largest of
    /// its ranks'.
    fn sizes(&mut self, d: &Drain<'_>) {
        self.world_size = self.world_size.max(d.world_size);
        self.shift = self.shift.max(d.shift.min(31));
        self.figures.sample_period = 1 << self.shift;
        if let Some(p) = d.p2p_shift.checked_sub(1) {
            let p = p.min(31) as u32;
            let s = self.p2p_shift.map_or(p, |s| s.max(p));
            self.p2p_shift = Some(s);
            self.figures.p2p_sample_period = 1 << s;
        }
    }

    /// Takes a record of `rank`, on a ring keeping `clock`, from node
    /// `node` (0: this one).
    fn take(&mut self, rank: u32, clock: u64, node: u16, r: &waits::Plain, now_ns: u64) {
        // Instances and messages may be on any communicator the shim
        // names: `r.comm` is part of what matches them.
        let valid = (clock == waits::clock::NS || clock == waits::clock::TICKS)
            && r.leave >= r.enter
            && rank < self.world_size;
        match r.kind {
            waits::kind::COLL if valid => self.take_coll(rank, clock, node, r, now_ns),
            waits::kind::SEND
            | waits::kind::RECV
            | waits::kind::POSTED
            | waits::kind::SENT
            | waits::kind::GROUP_END
                if valid =>
            {
                self.take_p2p(rank, clock, node, r, now_ns)
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

    /// Messages the job may have waiting for a half: [`MAX_PENDING`], or
    /// [`MESSAGES_PER_RANK`] for each rank the daemon knows.
    fn max_messages(&self) -> usize {
        let ranks = self.local.len() + self.nodes.ranks();
        MAX_PENDING.max(MESSAGES_PER_RANK.saturating_mul(ranks))
    }

    /// Whether `rank` is this node's: a rank no peer shipped records of.
    fn is_local(&self, rank: u32) -> bool {
        self.nodes.of(rank) == 0
    }

    /// Counts one instance or message not evaluated, for `why`, if this
    /// node is the one that counts it: the node of `owner` (see
    /// [`Charge::owner`]), so that summing over a job's nodes counts it
    /// once.
    fn unresolved(&mut self, why: Unresolved, owner: u32) {
        if self.is_local(owner) {
            let n = &mut self.figures.unresolved[why as usize];
            *n = n.saturating_add(1);
        }
    }

    /// Counts one evaluated instance of `pattern`, made of calls of
    /// `function`, whose members waited `waits`, the rank that came late
    /// being `c.culprit`; the waits are charged at the settle's end
    /// ([`Job::charge_fresh`]). Across nodes, each node counts the waits of
    /// its own ranks, and the instance if it holds `c.owner`.
    fn count(&mut self, pattern: Pattern, function: u16, waits: &[Wait], c: Charge) {
        if self.is_local(c.owner) {
            self.figures.instances[pattern.index()] += 1;
        }
        // A function no shim writes (a hostile record) is filed under one
        // key, [`UNKNOWN_FUNCTION`], so the map stays bounded.
        let function = if usize::from(function) < FUNCTIONS.len() {
            function
        } else {
            UNKNOWN_FUNCTION
        };
        for w in waits {
            if w.ns == 0 || !self.is_local(w.rank) {
                continue;
            }
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
    /// The rank whose node counts the instance: the lowest member of a
    /// collective's, the receiver of a Late Sender's, the sender of a Late
    /// Receiver's (the waiting side's).
    owner: u32,
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
mod nodes_tests;
#[cfg(test)]
mod tests;
