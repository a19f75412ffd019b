//! The ranks' wait records (issue 37) drained into the matcher
//! ([`crate::collect::waits`]), on the daemon's tick: each rank's ring from
//! where the last drain stopped, named by the rank the daemon knows it as
//! (from `/proc`), then the instances every member has given are evaluated.
//! A ring read while its owner truncated the file is read again next time;
//! the segment's other problems are counted by `read_segments`.
//!
//! A rank whose segment is not open yet (attached before its `MPI_Init`) is
//! looked at again after 1 s, then at doubling intervals up to a minute:
//! records wait in its ring meanwhile, and a rank without the shim costs a
//! read of its maps a minute, not one a tick. Every scrape looks too.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use super::{State, scrape::open_segment};
use crate::{collect::waits::Drain, os::clock::monotonic_ns};

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
            if let Ok(Some(d)) = seg.drain_waits(&mut r.wait_cursor, &mut records) {
                self.waits.add(
                    &r.labels.job,
                    &Drain {
                        rank,
                        world_size: d.world_size,
                        shift: d.sample_shift,
                        clock: d.drained.clock,
                        ns_per_tick: d.drained.ns_per_tick,
                        records: &records,
                        lost: d.drained.lost,
                        p2p_shift: d.drained.p2p_shift,
                        skipped: d.drained.skipped,
                    },
                    now,
                );
            }
        }
        self.waits.settle(now);
        let jobs: HashSet<&str> = self.ranks.values().map(|r| r.labels.job.as_str()).collect();
        self.waits.retain(|j| jobs.contains(j));
    }
}
