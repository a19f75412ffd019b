//! Collective instances: the records of one blocking collective on
//! `MPI_COMM_WORLD`, one per member, matched by the instance's sequence
//! number, and Scalasca's formulas applied once every member has given its
//! record.
//!
//! - Wait at Barrier (Barrier) and Wait at N×N (Allreduce, Allgather(v),
//!   Alltoall(v), Reduce_scatter(_block)): `E_max = max E_j`, each member
//!   waits `min(E_max, L_i) − E_i`; the culprit is the last to arrive.
//! - Late Broadcast (Bcast, Scatter(v)): each member but the root waits
//!   `min(E_root, L_i) − E_i`; the culprit is the root.
//! - Early Reduce (Reduce, Gather(v)): only the root waits,
//!   `min(E_max, L_root) − E_root` with `E_max` the latest enter of the
//!   others; the culprit is that latest sender.
//!
//! **Across nodes** (an instance with members whose records another node's
//! daemon shipped, [`super::clocks`]): Wait at Barrier and Wait at N×N need
//! no common clock. All members leave together (within the network's
//! latency), so a member waited its own duration less the instance's
//! shortest, `(L_i − E_i) − min_j (L_j − E_j)`, and the member with the
//! shortest came last. That is exact when they leave together; Scalasca's
//! wait lies between its values at the ends of the offsets' bound, so the
//! clock-free wait is held to them (exact to the uncertainty once the
//! bound is tight, clock-free while it is loose or unbounded), and the
//! culprit is the latest by the bound's middle (the shortest while
//! unbounded). Late Broadcast and Early Reduce compare
//! a member's enter with the root's, or the root's with the latest
//! sender's, on the offsets the records bound; a wait whose sign the bound
//! cannot tell counts `unresolved{reason="clock"}`. A barrier's members
//! bound the offsets. Each node counts its own ranks' waits.
//!
//! Scan, Exscan, Alltoallw and the neighbourhood collectives have no such
//! pattern here (Scalasca has none, or "Early Scan"): their instances are
//! matched, so that their records are not taken for invalid ones, and not
//! counted.

use std::collections::{BTreeMap, btree_map::Entry as Slot};

use observer_common::{FUNCTIONS, waits};

use super::{Charge, Job, MAX_PENDING, Pattern, TIMEOUT_NS, Unresolved, Wait, clocks};

/// One member's part of an instance.
#[derive(Clone, Copy, Debug)]
struct Part {
    rank: u32,
    /// Its ring's clock (`waits::clock`).
    clock: u64,
    /// The node whose daemon drained it (0: this one).
    node: u16,
    function: u16,
    root: i32,
    /// How many members its instance has: the job's size on
    /// `MPI_COMM_WORLD`, else what the record says.
    members: u32,
    enter: u64,
    leave: u64,
}

/// An instance waiting for members.
#[derive(Debug)]
struct Instance {
    /// When its first record was matched.
    first_ns: u64,
    parts: Vec<Part>,
    /// How many of `parts`, from the first, are known to be one a rank
    /// (sorted by rank): the rest came since the last settle.
    checked: usize,
}

/// A job's collective instances waiting for members, by communicator (its
/// id in the records) and sequence number.
#[derive(Debug, Default)]
pub(super) struct Instances {
    pending: BTreeMap<(u64, u64), Instance>,
}

impl Instances {
    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }
}

impl Instance {
    /// How many members it has, as its first record says (the others
    /// are held to it when it is evaluated).
    fn members(&self) -> usize {
        self.parts
            .first()
            .map_or(usize::MAX, |p| p.members as usize)
    }
}

impl Job {
    /// Takes a collective record of `rank`, on a ring keeping `clock`.
    pub(super) fn take_coll(
        &mut self,
        rank: u32,
        clock: u64,
        node: u16,
        r: &waits::Plain,
        now_ns: u64,
    ) {
        // Another communicator's records say its size (in the tag): at
        // most the job's, and the instance holds one member a rank.
        let members = if r.comm == waits::WORLD {
            Some(self.world_size)
        } else {
            u32::try_from(r.tag)
                .ok()
                .filter(|&n| (1..=self.world_size).contains(&n))
        };
        let valid = FUNCTIONS
            .get(usize::from(r.function))
            .is_some_and(|f| f.collective.is_some())
            && (r.peer == waits::NO_ROOT
                || (0..i64::from(self.world_size)).contains(&i64::from(r.peer)));
        let (true, Some(members)) = (valid, members) else {
            self.figures.records_invalid += 1;
            return;
        };
        let part = Part {
            rank,
            clock,
            node,
            function: r.function,
            root: r.peer,
            members,
            enter: r.enter,
            leave: r.leave,
        };
        let key = (r.comm, r.seq);
        let pending = &mut self.coll.pending;
        if !pending.contains_key(&key) && pending.len() >= MAX_PENDING {
            pending.pop_first();
            self.figures.unresolved[Unresolved::Overflow as usize] += 1;
        }
        // A rank's second record of the instance is found at the settle
        // (`one_a_rank`): looking for it here costs a pass over the parts
        // per record, quadratic in the members.
        match pending.entry(key) {
            Slot::Occupied(mut o) => o.get_mut().parts.push(part),
            Slot::Vacant(v) => {
                v.insert(Instance {
                    first_ns: now_ns,
                    parts: vec![part],
                    checked: 0,
                });
            }
        }
    }

    /// Keeps the first part each rank gave of every instance that grew
    /// since the last settle; the others count as invalid records. A job's
    /// instance so holds one part a rank, and at most one drain's records
    /// more.
    fn one_a_rank(&mut self) {
        let mut invalid = 0u64;
        for i in self.coll.pending.values_mut() {
            if i.parts.len() > i.checked {
                // Stable: of a rank's parts, the first taken stays.
                i.parts.sort_by_key(|p| p.rank);
                let before = i.parts.len();
                i.parts.dedup_by_key(|p| p.rank);
                invalid += (before - i.parts.len()) as u64;
                i.checked = i.parts.len();
            }
        }
        self.figures.records_invalid = self.figures.records_invalid.saturating_add(invalid);
    }

    /// Evaluates the instances every member has given, and gives up those
    /// that waited [`TIMEOUT_NS`].
    pub(super) fn settle_coll(&mut self, now_ns: u64) {
        self.one_a_rank();
        // A whole instance in ticks waits for the counter's rate, until the
        // timeout.
        let rate = self.ns_per_tick;
        let ready = |i: &Instance| {
            i.parts.len() >= i.members()
                && (rate != 0 || i.parts.iter().all(|p| p.clock != waits::clock::TICKS))
        };
        let done: Vec<(u64, u64)> = self
            .coll
            .pending
            .iter()
            .filter(|(_, i)| ready(i) || now_ns.saturating_sub(i.first_ns) >= TIMEOUT_NS)
            .map(|(&k, _)| k)
            .collect();
        for key in done {
            let Some(i) = self.coll.pending.remove(&key) else {
                continue;
            };
            // The lowest member's node counts the instance.
            let owner = i.parts.iter().map(|p| p.rank).min().unwrap_or(0);
            let n = i.members();
            if i.parts.len() > n || i.parts.iter().any(|p| p.members as usize != n) {
                // Members that disagree on the communicator's size, or
                // more of them than it has.
                self.unresolved(Unresolved::Mismatch, owner);
                continue;
            }
            if i.parts.len() < n {
                self.unresolved(Unresolved::Incomplete, owner);
                continue;
            }
            let Some(scale) = self.scale(i.parts.iter().map(|p| p.clock)) else {
                self.unresolved(Unresolved::Clock, owner);
                continue;
            };
            if i.parts.iter().any(|p| p.node != 0) {
                // Another node's times are its CLOCK_MONOTONIC's: never
                // the counter's ticks, which only this node's rate scales.
                if scale.0 != 0 {
                    self.unresolved(Unresolved::Clock, owner);
                } else {
                    self.across(&i.parts, owner, now_ns);
                }
                continue;
            }
            match evaluate(&i.parts) {
                Err(Mismatch) => self.unresolved(Unresolved::Mismatch, owner),
                // A collective without a pattern (Scan, Alltoallw...).
                Ok(None) => {}
                Ok(Some((pattern, mut waits, culprit))) => {
                    for w in &mut waits {
                        w.ns = scale.ns(w.ns);
                        w.start = scale.ns(w.start);
                    }
                    let charge = Charge {
                        culprit,
                        period: self.figures.sample_period.max(1),
                        now_ns,
                        owner,
                    };
                    // Every member called the same function (evaluated).
                    let function = i.parts.first().map_or(0, |p| p.function);
                    self.count(pattern, function, &waits, charge);
                }
            }
        }
    }
}

impl Job {
    /// Evaluates a whole instance whose members are on several nodes, their
    /// times each on its node's `CLOCK_MONOTONIC` in ns (see the module's
    /// doc): this node's members' waits.
    fn across(&mut self, parts: &[Part], owner: u32, now_ns: u64) {
        let Some(first) = parts.first() else { return };
        if parts
            .iter()
            .any(|p| p.function != first.function || p.root != first.root)
        {
            self.unresolved(Unresolved::Mismatch, owner);
            return;
        }
        let Some(pattern) = Pattern::of(first.function) else {
            return;
        };
        if pattern == Pattern::WaitBarrier {
            self.learn_offsets(parts, now_ns);
        }
        let mine = |p: &&Part| p.node == 0;
        let mut unclear = 0u64;
        let (waits, culprit) = match pattern {
            Pattern::WaitBarrier | Pattern::WaitNxn => {
                let dur = |p: &Part| p.leave - p.enter;
                // The shortest, the lowest rank of equals, came last: that
                // needs no clock.
                let Some(shortest) = parts.iter().min_by_key(|p| (dur(p), p.rank)) else {
                    return;
                };
                let latest = self.latest(parts.iter(), now_ns);
                let w = parts
                    .iter()
                    .filter(mine)
                    .map(|p| {
                        let free = dur(p) - dur(shortest);
                        // Scalasca's wait lies between its values at the
                        // bound's ends: the clock-free one, held to them.
                        let ns = match latest {
                            Some((lo, hi, _)) => {
                                let w = |x: i128| {
                                    let x = x.min(i128::from(p.leave)) - i128::from(p.enter);
                                    u64::try_from(x.max(0)).unwrap_or(u64::MAX)
                                };
                                free.clamp(w(lo), w(hi))
                            }
                            None => free,
                        };
                        Wait {
                            rank: p.rank,
                            ns,
                            start: p.enter,
                        }
                    })
                    .collect::<Vec<_>>();
                (w, latest.map_or(shortest.rank, |l| l.2))
            }
            Pattern::LateBroadcast => {
                let Some(root) = parts.iter().find(|p| p.root == p.rank as i32) else {
                    self.unresolved(Unresolved::Mismatch, owner);
                    return;
                };
                let at = self.nodes.local(root.node, root.enter, now_ns);
                let mut w = Vec::new();
                for p in parts.iter().filter(mine).filter(|p| p.rank != root.rank) {
                    match at.map(|at| clocks::wait_for(p.enter, p.leave, at)) {
                        Some(Ok(ns)) => w.push(Wait {
                            rank: p.rank,
                            ns,
                            start: p.enter,
                        }),
                        _ => unclear += 1,
                    }
                }
                (w, root.rank)
            }
            Pattern::EarlyReduce => {
                let Some(root) = parts.iter().find(|p| p.root == p.rank as i32) else {
                    self.unresolved(Unresolved::Mismatch, owner);
                    return;
                };
                let others = parts.iter().filter(|q| q.rank != root.rank);
                let mut w = Vec::new();
                let culprit = match (root.node, self.latest(others.clone(), now_ns)) {
                    // Only the root waits: another node's to count.
                    (1.., l) => l.map(|l| l.2),
                    (0, Some((lo, hi, rank))) => {
                        match clocks::wait_for(root.enter, root.leave, (lo, hi)) {
                            Ok(ns) => w.push(Wait {
                                rank: root.rank,
                                ns,
                                start: root.enter,
                            }),
                            Err(()) => unclear += 1,
                        }
                        Some(rank)
                    }
                    // A job of one rank: nobody to wait for.
                    (0, None) if others.clone().next().is_none() => None,
                    (0, None) => {
                        unclear += 1;
                        None
                    }
                };
                (w, culprit.unwrap_or(root.rank))
            }
            Pattern::LateSender | Pattern::LateReceiver => return,
        };
        let n = &mut self.figures.unresolved[Unresolved::Clock as usize];
        *n = n.saturating_add(unclear);
        let charge = Charge {
            culprit,
            period: self.figures.sample_period.max(1),
            now_ns,
            owner,
        };
        self.count(pattern, first.function, &waits, charge);
    }

    /// When the latest of `parts` entered, on this node's clock: between
    /// the latest of their earliest enters and the latest of their latest
    /// (the offsets' bounds), and which member that is by the middles (the
    /// lowest rank of equals); `None` when there are none, or a member's
    /// node's offset is unbounded.
    fn latest<'a>(
        &self,
        parts: impl Iterator<Item = &'a Part>,
        now_ns: u64,
    ) -> Option<(i128, i128, u32)> {
        let mut latest: Option<(i128, i128, (i128, std::cmp::Reverse<u32>))> = None;
        for q in parts {
            let (lo, hi) = self.nodes.local(q.node, q.enter, now_ns)?;
            let key = (lo + (hi - lo) / 2, std::cmp::Reverse(q.rank));
            latest = Some(match latest {
                None => (lo, hi, key),
                Some((l, h, k)) => (l.max(lo), h.max(hi), k.max(key)),
            });
        }
        latest.map(|(lo, hi, (_, r))| (lo, hi, r.0))
    }

    /// What a barrier's members say of the offsets: each other node's
    /// members entered before this node's left, and this node's entered
    /// before theirs left.
    fn learn_offsets(&mut self, parts: &[Part], now_ns: u64) {
        let here = parts.iter().filter(|p| p.node == 0);
        let (Some(enter), Some(leave)) = (
            here.clone().map(|p| p.enter).max(),
            here.map(|p| p.leave).min(),
        ) else {
            return;
        };
        let mut nodes: Vec<u16> = parts.iter().map(|p| p.node).filter(|&n| n != 0).collect();
        nodes.sort_unstable();
        nodes.dedup();
        for node in nodes {
            let there = parts.iter().filter(|p| p.node == node);
            let their_enter = there.clone().map(|p| p.enter).max().unwrap_or(0);
            let their_leave = there.map(|p| p.leave).min().unwrap_or(0);
            if let Some(o) = self.nodes.offset_mut(node) {
                o.at_most(i128::from(leave) - i128::from(their_enter), now_ns);
                o.at_least(i128::from(enter) - i128::from(their_leave), now_ns);
            }
        }
    }
}

/// The members of an instance disagree on its function or root.
struct Mismatch;

/// What an instance's members waited, each from its enter (in the
/// records' clock).
type Waited = Vec<Wait>;

/// Scalasca's formula for one whole instance: its pattern, what each member
/// waited, and the culprit; `None` for a collective without a pattern.
fn evaluate(parts: &[Part]) -> Result<Option<(Pattern, Waited, u32)>, Mismatch> {
    let Some(first) = parts.first() else {
        return Ok(None);
    };
    if parts
        .iter()
        .any(|p| p.function != first.function || p.root != first.root)
    {
        return Err(Mismatch);
    }
    let Some(pattern) = Pattern::of(first.function) else {
        return Ok(None);
    };
    shapes(pattern, parts).map(Some).ok_or(Mismatch)
}

/// [`evaluate`] of agreeing members: `None` when a rooted collective names
/// no member as its root.
fn shapes(pattern: Pattern, parts: &[Part]) -> Option<(Pattern, Waited, u32)> {
    let wait = |p: &Part, until: u64| Wait {
        rank: p.rank,
        ns: until.min(p.leave).saturating_sub(p.enter),
        start: p.enter,
    };
    // The latest to enter, the lowest rank of equals.
    let latest = |of: &mut dyn Iterator<Item = &Part>| {
        of.max_by(|a, b| a.enter.cmp(&b.enter).then(b.rank.cmp(&a.rank)))
            .copied()
    };
    match pattern {
        Pattern::WaitBarrier | Pattern::WaitNxn => {
            let last = latest(&mut parts.iter())?;
            let w = parts.iter().map(|p| wait(p, last.enter)).collect();
            Some((pattern, w, last.rank))
        }
        Pattern::LateBroadcast => {
            let root = parts.iter().find(|p| p.root == p.rank as i32)?;
            let w = parts
                .iter()
                .filter(|p| p.rank != root.rank)
                .map(|p| wait(p, root.enter))
                .collect();
            Some((pattern, w, root.rank))
        }
        Pattern::EarlyReduce => {
            let root = parts.iter().find(|p| p.root == p.rank as i32)?;
            let Some(last) = latest(&mut parts.iter().filter(|p| p.rank != root.rank)) else {
                // A job of one rank: nobody to wait for.
                return Some((pattern, Vec::new(), root.rank));
            };
            Some((pattern, vec![wait(root, last.enter)], last.rank))
        }
        // Not a collective's pattern.
        Pattern::LateSender | Pattern::LateReceiver => None,
    }
}
