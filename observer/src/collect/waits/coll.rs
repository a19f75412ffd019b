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
//! Scan, Exscan, Alltoallw and the neighbourhood collectives have no such
//! pattern here (Scalasca has none, or "Early Scan"): their instances are
//! matched, so that their records are not taken for invalid ones, and not
//! counted.

use std::collections::{BTreeMap, btree_map::Entry as Slot};

use observer_common::{FUNCTIONS, waits};

use super::{Charge, Job, MAX_PENDING, Pattern, TIMEOUT_NS, Unresolved, Wait};

/// One member's part of an instance.
#[derive(Clone, Copy, Debug)]
struct Part {
    rank: u32,
    /// Its ring's clock (`waits::clock`).
    clock: u64,
    function: u16,
    root: i32,
    enter: u64,
    leave: u64,
}

/// An instance waiting for members.
#[derive(Debug)]
struct Instance {
    /// When its first record was matched.
    first_ns: u64,
    parts: Vec<Part>,
}

/// A job's collective instances waiting for members, by sequence number.
#[derive(Debug, Default)]
pub(super) struct Instances {
    pending: BTreeMap<u64, Instance>,
}

impl Instances {
    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }
}

impl Job {
    /// Takes a collective record of `rank`, on a ring keeping `clock`.
    pub(super) fn take_coll(&mut self, rank: u32, clock: u64, r: &waits::Plain, now_ns: u64) {
        let valid = FUNCTIONS
            .get(usize::from(r.function))
            .is_some_and(|f| f.collective.is_some())
            && (r.peer == waits::NO_ROOT
                || (0..i64::from(self.world_size)).contains(&i64::from(r.peer)));
        if !valid {
            self.figures.records_invalid += 1;
            return;
        }
        let part = Part {
            rank,
            clock,
            function: r.function,
            root: r.peer,
            enter: r.enter,
            leave: r.leave,
        };
        let pending = &mut self.coll.pending;
        if !pending.contains_key(&r.seq) && pending.len() >= MAX_PENDING {
            pending.pop_first();
            self.figures.unresolved[Unresolved::Overflow as usize] += 1;
        }
        match pending.entry(r.seq) {
            Slot::Occupied(mut o) => {
                if o.get().parts.iter().any(|p| p.rank == rank) {
                    self.figures.records_invalid += 1;
                } else {
                    o.get_mut().parts.push(part);
                }
            }
            Slot::Vacant(v) => {
                v.insert(Instance {
                    first_ns: now_ns,
                    parts: vec![part],
                });
            }
        }
    }

    /// Evaluates the instances every member has given, and gives up those
    /// that waited [`TIMEOUT_NS`].
    pub(super) fn settle_coll(&mut self, now_ns: u64) {
        let n = self.world_size as usize;
        // A whole instance in ticks waits for the counter's rate, until the
        // timeout.
        let rate = self.ns_per_tick;
        let ready = |i: &Instance| {
            i.parts.len() >= n
                && (rate != 0 || i.parts.iter().all(|p| p.clock != waits::clock::TICKS))
        };
        let done: Vec<u64> = self
            .coll
            .pending
            .iter()
            .filter(|(_, i)| ready(i) || now_ns.saturating_sub(i.first_ns) >= TIMEOUT_NS)
            .map(|(&s, _)| s)
            .collect();
        for seq in done {
            let Some(i) = self.coll.pending.remove(&seq) else {
                continue;
            };
            if i.parts.len() < n {
                self.figures.unresolved[Unresolved::Incomplete as usize] += 1;
                continue;
            }
            let Some(scale) = self.scale(i.parts.iter().map(|p| p.clock)) else {
                self.figures.unresolved[Unresolved::Clock as usize] += 1;
                continue;
            };
            match evaluate(&i.parts) {
                Err(Mismatch) => self.figures.unresolved[Unresolved::Mismatch as usize] += 1,
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
                    };
                    // Every member called the same function (evaluated).
                    let function = i.parts.first().map_or(0, |p| p.function);
                    self.count(pattern, function, &waits, charge);
                }
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
