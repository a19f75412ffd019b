//! Each rank's MPI fraction over the last minute, from samples the daemon
//! keeps of its own collections. The busiest and idlest ranks of a job are
//! then a few job × node gauges ([`super::job`]) rather than a query over
//! every rank's counters, which at 64 k ranks is 128 k series per
//! evaluation.
//!
//! A rank's fraction over the window is the growth of its MPI seconds over
//! the growth of its wall seconds since the newest sample at least
//! [`SPAN`] old (or the oldest, once it is [`MIN_SPAN`] old: just after the
//! daemon or the rank started). Samples are kept [`SPACING`] apart, so a
//! rank holds at most [`MAX_SAMPLES`] of them whatever the scrape rate.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    time::{Duration, SystemTime},
};

use super::detail::{mpi_ns, wall};
use crate::collect::snapshot::{RankSnapshot, Snapshot};

/// The window: the `1m` of `mpi_job_rank_mpi_fraction_1m_max`.
pub const SPAN: Duration = Duration::from_secs(60);
/// The shortest history a fraction is given for.
pub const MIN_SPAN: Duration = Duration::from_secs(10);
/// The least time between two kept samples of a rank.
pub const SPACING: Duration = Duration::from_secs(5);
/// Samples kept per rank at most.
pub const MAX_SAMPLES: usize = (SPAN.as_secs() / SPACING.as_secs()) as usize + 2;

#[derive(Clone, Copy, Debug)]
struct Sample {
    at: SystemTime,
    mpi_ns: u64,
    wall: Duration,
}

#[derive(Debug, Default)]
struct History {
    /// The rank's `counted_since`: a new process under a reused pid starts
    /// a new history.
    since: Option<SystemTime>,
    samples: VecDeque<Sample>,
}

/// Running ranks' MPI fraction over the window, by pid; ranks with too
/// short a history, and exited ranks, are absent.
pub type Recent = BTreeMap<u32, f64>;

/// The samples of every rank, kept across collections by
/// [`crate::export::registry::State`].
#[derive(Debug, Default)]
pub struct FractionWindow {
    ranks: HashMap<u32, History>,
}

impl FractionWindow {
    /// Takes this collection's figures and returns each running rank's
    /// fraction over the window. Ranks gone from `snap` are forgotten.
    pub fn update(&mut self, snap: &Snapshot) -> Recent {
        let now = snap.taken;
        let live: std::collections::HashSet<u32> = snap.ranks.iter().map(|r| r.pid).collect();
        self.ranks.retain(|pid, _| live.contains(pid));
        let mut recent = Recent::new();
        for r in &snap.ranks {
            let h = self.ranks.entry(r.pid).or_default();
            if let Some(f) = h.update(r, now) {
                recent.insert(r.pid, f);
            }
        }
        recent
    }
}

impl History {
    fn update(&mut self, r: &RankSnapshot, now: SystemTime) -> Option<f64> {
        let cur = Sample {
            at: now,
            mpi_ns: mpi_ns(r),
            wall: wall(r, now),
        };
        let back = self.samples.back();
        // Another process under the pid, or a clock or counter that went
        // back: start again rather than report a negative or huge figure.
        if self.since != Some(r.counted_since)
            || back.is_some_and(|b| b.at > now || b.mpi_ns > cur.mpi_ns || b.wall > cur.wall)
        {
            self.samples.clear();
            self.since = Some(r.counted_since);
        }
        let age = |s: &Sample| now.duration_since(s.at).unwrap_or(Duration::ZERO);
        while self.samples.len() >= 2 && self.samples.get(1).is_some_and(|s| age(s) >= SPAN) {
            self.samples.pop_front();
        }
        let fraction = self.samples.front().and_then(|base| {
            if !r.running() || age(base) < MIN_SPAN {
                return None;
            }
            let dw = cur.wall.saturating_sub(base.wall).as_nanos();
            (dw > 0).then(|| {
                // A call longer than the window completes inside it with
                // all its time: count at most the window.
                (cur.mpi_ns.saturating_sub(base.mpi_ns) as f64 / dw as f64).min(1.0)
            })
        });
        if self.samples.back().is_none_or(|b| age(b) >= SPACING) {
            self.samples.push_back(cur);
        }
        while self.samples.len() > MAX_SAMPLES {
            self.samples.pop_front();
        }
        fraction
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::metrics::tests::rank_at;

    fn snap(at: SystemTime, ranks: Vec<RankSnapshot>) -> Snapshot {
        Snapshot {
            ranks,
            taken: at,
            ..Snapshot::default()
        }
    }

    #[test]
    fn the_fraction_covers_the_last_minute_not_the_lifetime() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut w = FractionWindow::default();
        // 100 s at 10 % in MPI, then 60 s at 90 %: lifetime 40 %, the last
        // minute 90 %.
        let mut at = t0;
        let mut mpi = 0u64;
        let mut last = Recent::new();
        for step in 0..=32u64 {
            if step > 0 {
                at += Duration::from_secs(5);
                mpi += if step <= 20 {
                    500_000_000
                } else {
                    4_500_000_000
                };
            }
            last = w.update(&snap(at, vec![rank_at(7, t0, mpi)]));
            if step == 1 {
                assert!(last.is_empty(), "5 s of history is too short");
            }
        }
        let f = last[&7];
        assert!((f - 0.9).abs() < 1e-9, "{f}");
        assert!(w.ranks[&7].samples.len() <= MAX_SAMPLES);
    }

    #[test]
    fn samples_stay_spaced_and_bounded_whatever_the_scrape_rate() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000);
        let mut w = FractionWindow::default();
        for ms in (0..600_000u64).step_by(250) {
            let at = t0 + Duration::from_millis(ms);
            w.update(&snap(at, vec![rank_at(3, t0, ms * 100_000)]));
        }
        let h = &w.ranks[&3];
        assert!(h.samples.len() <= MAX_SAMPLES, "{}", h.samples.len());
        let f = w.update(&snap(
            t0 + Duration::from_secs(600),
            vec![rank_at(3, t0, 600_000 * 100_000)],
        ))[&3];
        assert!((f - 0.1).abs() < 1e-6, "{f}");
    }

    #[test]
    fn a_reused_pid_or_a_counter_going_back_starts_again() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(3_000_000);
        let mut w = FractionWindow::default();
        w.update(&snap(t0, vec![rank_at(5, t0, 0)]));
        let at = t0 + Duration::from_secs(30);
        assert!(
            w.update(&snap(at, vec![rank_at(5, t0, 3_000_000_000)]))
                .contains_key(&5)
        );
        // The same pid, a process counted from later, with fewer seconds.
        let again = w.update(&snap(at + Duration::from_secs(5), vec![rank_at(5, at, 1)]));
        assert!(again.is_empty(), "{again:?}");
        // Gone from the snapshot: forgotten.
        w.update(&snap(at + Duration::from_secs(10), vec![]));
        assert!(w.ranks.is_empty());
    }
}
