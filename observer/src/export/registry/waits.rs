//! The ranks' wait records (issue 37) drained into the matcher
//! ([`crate::collect::waits`]), on the daemon's tick: each rank's ring from
//! where the last drain stopped, named by the rank the daemon knows it as
//! (from `/proc`), then the instances every member has given are evaluated.
//! A ring read while its owner truncated the file is read again next time;
//! the segment's other problems are counted by `read_segments`.
//!
//! A job spans nodes when its ranks say `MPI_COMM_WORLD` is larger than
//! the ranks of it this daemon holds. Its records are kept in the
//! [`outbox`](super::outbox) for the other nodes' daemons, in this node's
//! `CLOCK_MONOTONIC` nanoseconds (the counter's ticks turned into them by
//! [`crate::os::clock::CounterClock`]): their records come in
//! `CLOCK_MONOTONIC` nanoseconds of theirs, and each node's are on one
//! clock. A daemon with peers, or asked by one, matches every job's records
//! so, spanning or not: a job whose ranks this daemon finds one by one
//! would otherwise have its first records in ticks and its later ones in
//! nanoseconds, which no instance can mix. Ticks that cannot be converted
//! (no counter the daemon reads, no rate known yet) are matched as before
//! and not shipped, counted in `mpi_observer_waits_outbox_dropped_total`
//! once a peer has asked for records. A daemon without peers matches
//! every job as its rings give them.
//!
//! A rank whose segment is not open yet (attached before its `MPI_Init`) is
//! looked at again after 1 s, then at doubling intervals up to a minute:
//! records wait in its ring meanwhile, and a rank without the shim costs a
//! read of its maps a minute, not one a tick. Every scrape looks too.

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use observer_common::waits;

use super::{State, outbox::Shipped, scrape::open_segment};
use crate::{
    collect::waits::Drain,
    os::clock::{CounterClock, monotonic_ns},
};

/// The longest wait before looking again for a segment not found (the
/// first is [`super::rank::FIRST_LOOK`]).
const LAST_LOOK: Duration = Duration::from_secs(60);

impl State {
    /// Drains every rank's wait ring, evaluates what is complete, and
    /// forgets the jobs the state no longer holds.
    pub fn drain_waits(&mut self) {
        let now = monotonic_ns();
        let mut records = Vec::new();
        let at = Instant::now();
        // Before the drain: every record read was written before this pair.
        self.clock.refresh();
        let mut held: HashMap<String, u32> = HashMap::new();
        for r in self.ranks.values() {
            *held.entry(r.labels.job.clone()).or_default() += 1;
        }
        let mut dropped = self.outbox.expire(now);
        for r in self.ranks.values_mut() {
            if r.segment.is_none() && r.exited_at.is_none() && at >= r.segment_look.0 {
                let wait = r.segment_look.1;
                r.segment_look = (at + wait, (wait * 2).min(LAST_LOOK));
                if !open_segment(r, &self.selfm) {
                    continue;
                }
            }
            let Some(seg) = &r.segment else { continue };
            // A rank the launcher did not number has no place in an
            // instance.
            let Ok(rank) = r.identity.rank.parse::<u32>() else {
                continue;
            };
            records.clear();
            let Ok(Some(d)) = seg.drain_waits(&mut r.wait_cursor, &mut records) else {
                continue;
            };
            let mut drain = Drain {
                rank,
                world_size: d.world_size,
                shift: d.sample_shift,
                clock: d.drained.clock,
                ns_per_tick: d.drained.ns_per_tick,
                records: &records,
                lost: d.drained.lost,
                p2p_shift: d.drained.p2p_shift,
                skipped: d.drained.skipped,
            };
            let spans = held.get(&r.labels.job).is_some_and(|&n| d.world_size > n);
            let across = self.ship_waits || self.outbox.asked();
            if !across {
                self.waits.add(&r.labels.job, &drain, now);
                continue;
            }
            let Some(ns) = in_monotonic(&self.clock, &drain) else {
                // Matched on the ring's clock here; not shipped.
                if spans && drain.clock == waits::clock::TICKS && self.outbox.asked() {
                    dropped += records.len() as u64;
                }
                self.waits.add(&r.labels.job, &drain, now);
                continue;
            };
            drain.clock = waits::clock::NS;
            drain.ns_per_tick = 0;
            drain.records = &ns;
            self.waits.add(&r.labels.job, &drain, now);
            if !spans {
                continue;
            }
            dropped += self.outbox.push(
                Shipped {
                    job: r.labels.job.clone(),
                    rank,
                    world_size: drain.world_size,
                    shift: drain.shift,
                    p2p_shift: drain.p2p_shift,
                    skipped: drain.skipped,
                    records: ns,
                },
                r.uid,
                now,
            );
        }
        if dropped > 0 {
            self.selfm.waits_outbox_dropped.inc_by(dropped);
        }
        self.waits.settle(now);
        let jobs: HashSet<&str> = self.ranks.values().map(|r| r.labels.job.as_str()).collect();
        self.waits.retain(|j| jobs.contains(j));
    }
}

/// `d`'s records with their times (every kind's `enter` and `leave`,
/// observer-common's `waits::Plain`) in this node's `CLOCK_MONOTONIC` ns:
/// as they are on [`waits::clock::NS`], converted from
/// [`waits::clock::TICKS`]; `None` on another clock (a hostile ring's), or
/// ticks the daemon cannot convert.
fn in_monotonic(clock: &CounterClock, d: &Drain<'_>) -> Option<Vec<waits::Plain>> {
    match d.clock {
        waits::clock::NS => Some(d.records.to_vec()),
        waits::clock::TICKS => d
            .records
            .iter()
            .map(|r| {
                let (enter, leave) = clock.span(r.enter, r.leave, d.ns_per_tick)?;
                Some(waits::Plain { enter, leave, ..*r })
            })
            .collect(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::clock::Pair;

    #[test]
    fn ticks_become_monotonic_and_ns_stay() {
        let recs = [
            waits::Plain {
                enter: 2_000,
                leave: 2_600,
                seq: 1,
                kind: waits::kind::COLL,
                ..Default::default()
            },
            waits::Plain {
                enter: 2_400,
                leave: 2_400,
                seq: 3,
                kind: waits::kind::GROUP_END,
                ..Default::default()
            },
        ];
        let mut d = Drain {
            rank: 0,
            world_size: 4,
            shift: 0,
            p2p_shift: 0,
            clock: waits::clock::TICKS,
            ns_per_tick: 0,
            records: &recs,
            lost: 0,
            skipped: 0,
        };
        let mut clock = CounterClock::default();
        // No pair yet: not converted.
        assert_eq!(in_monotonic(&clock, &d), None);
        clock.push(Pair {
            ticks: 3_000,
            ns: 1_000_000,
        });
        // A pair, but no rate: the ring's is needed.
        assert_eq!(in_monotonic(&clock, &d), None);
        d.ns_per_tick = 1 << 31;
        let ns = in_monotonic(&clock, &d).unwrap();
        assert_eq!(
            ns.iter()
                .map(|r| (r.enter, r.leave, r.seq))
                .collect::<Vec<_>>(),
            [(999_500, 999_800, 1), (999_700, 999_700, 3)]
        );
        d.clock = waits::clock::NS;
        assert_eq!(in_monotonic(&clock, &d).as_deref(), Some(&recs[..]));
        d.clock = 7;
        assert_eq!(in_monotonic(&clock, &d), None);
    }
}
