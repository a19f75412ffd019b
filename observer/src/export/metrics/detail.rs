//! The detail ranks: per job on this node, the most and least loaded ranks
//! by MPI fraction, which keep today's full per-rank series on the bounded
//! `/metrics`. The choice is sticky, so that a rank's counters do not come
//! and go from one scrape to the next: a rank keeps its detail while it
//! runs, and is replaced only when it exits, or once it has been held for
//! [`HOLD`] and another rank is more extreme by [`MARGIN`]. Never random:
//! ties go to the lower pid.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, SystemTime},
};

use crate::collect::snapshot::{RankSnapshot, Snapshot};

/// How long a detail rank is held before a more extreme one may replace it.
pub const HOLD: Duration = Duration::from_secs(600);
/// How much more extreme (in MPI fraction) a rank must be to replace one.
pub const MARGIN: f64 = 0.05;

/// Why a rank is a detail rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// Among the highest MPI fractions of its job on this node.
    MostLoaded,
    /// Among the lowest.
    LeastLoaded,
}

impl Reason {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MostLoaded => "most_loaded",
            Reason::LeastLoaded => "least_loaded",
        }
    }

    /// Whether `a` is more extreme than `b` by at least `by` for this reason.
    fn beats(self, a: f64, b: f64, by: f64) -> bool {
        match self {
            Reason::MostLoaded => a >= b + by,
            Reason::LeastLoaded => a <= b - by,
        }
    }
}

/// The detail ranks of one collection, by pid.
pub type Detail = BTreeMap<u32, Reason>;

/// Nanoseconds a rank spent in completed MPI calls, all functions
/// (saturating).
pub fn mpi_ns(r: &RankSnapshot) -> u64 {
    r.calls.as_ref().map_or(0, |c| {
        c.values().fold(0u64, |s, st| s.saturating_add(st.time_ns))
    })
}

/// Wall time a rank's figures cover: from `counted_since` to its exit, or
/// to `now` while it runs.
pub fn wall(r: &RankSnapshot, now: SystemTime) -> Duration {
    r.exited
        .unwrap_or(now)
        .duration_since(r.counted_since)
        .unwrap_or(Duration::ZERO)
}

/// MPI seconds over wall seconds; 0 before any wall time passed.
pub fn mpi_fraction(r: &RankSnapshot, now: SystemTime) -> f64 {
    let w = wall(r, now).as_nanos();
    if w == 0 {
        0.0
    } else {
        mpi_ns(r) as f64 / w as f64
    }
}

#[derive(Clone, Copy, Debug)]
struct Held {
    pid: u32,
    reason: Reason,
    since: SystemTime,
}

/// The detail ranks chosen so far, per job (its labels); kept across
/// collections by [`crate::export::registry::State`].
#[derive(Debug, Default)]
pub struct DetailPicker {
    jobs: BTreeMap<String, Vec<Held>>,
}

struct Candidate {
    pid: u32,
    fraction: f64,
    running: bool,
}

impl DetailPicker {
    /// Updates the choice with this collection's ranks, `k` detail ranks
    /// per job and node, and returns it.
    pub fn update(&mut self, snap: &Snapshot, k: usize) -> Detail {
        let now = snap.taken;
        let mut by_job: BTreeMap<&str, Vec<Candidate>> = BTreeMap::new();
        for r in &snap.ranks {
            by_job
                .entry(r.labels.job.as_str())
                .or_default()
                .push(Candidate {
                    pid: r.pid,
                    fraction: mpi_fraction(r, now),
                    running: r.running(),
                });
        }
        self.jobs.retain(|job, _| by_job.contains_key(job.as_str()));
        let mut detail = Detail::new();
        for (job, ranks) in by_job {
            let held = self.jobs.entry(job.to_string()).or_default();
            pick(held, &ranks, k, now);
            detail.extend(held.iter().map(|h| (h.pid, h.reason)));
        }
        detail
    }
}

/// One job's choice, updated in place.
fn pick(held: &mut Vec<Held>, ranks: &[Candidate], k: usize, now: SystemTime) {
    let of = |pid: u32| ranks.iter().find(|c| c.pid == pid);
    held.retain(|h| of(h.pid).is_some());
    if k == 0 {
        held.clear();
        return;
    }
    let slots = |reason| match reason {
        Reason::MostLoaded => k.div_ceil(2),
        Reason::LeastLoaded => k / 2,
    };
    if ranks.len() <= k {
        // Every rank is a detail rank; a new one takes the reason with room
        // (most loaded first), held ones keep theirs.
        let mut new: Vec<&Candidate> = ranks
            .iter()
            .filter(|c| !held.iter().any(|h| h.pid == c.pid))
            .collect();
        new.sort_by(|a, b| b.fraction.total_cmp(&a.fraction).then(a.pid.cmp(&b.pid)));
        for c in new {
            let most = held
                .iter()
                .filter(|h| h.reason == Reason::MostLoaded)
                .count();
            let reason = if most < slots(Reason::MostLoaded) {
                Reason::MostLoaded
            } else {
                Reason::LeastLoaded
            };
            held.push(Held {
                pid: c.pid,
                reason,
                since: now,
            });
        }
        return;
    }
    for reason in [Reason::MostLoaded, Reason::LeastLoaded] {
        let f = |pid: u32| of(pid).map_or(0.0, |c| c.fraction);
        // Running ranks held by no reason, most extreme first.
        let free = |held: &[Held]| -> Vec<(u32, f64)> {
            let taken: BTreeSet<u32> = held.iter().map(|h| h.pid).collect();
            let mut v: Vec<(u32, f64)> = ranks
                .iter()
                .filter(|c| c.running && !taken.contains(&c.pid))
                .map(|c| (c.pid, c.fraction))
                .collect();
            v.sort_by(|a, b| {
                let by = match reason {
                    Reason::MostLoaded => b.1.total_cmp(&a.1),
                    Reason::LeastLoaded => a.1.total_cmp(&b.1),
                };
                by.then(a.0.cmp(&b.0))
            });
            v
        };
        // This reason's held ranks, least extreme first.
        let mut mine: Vec<usize> = (0..held.len())
            .filter(|&i| held[i].reason == reason)
            .collect();
        mine.sort_by(|&a, &b| {
            let (fa, fb) = (f(held[a].pid), f(held[b].pid));
            let by = match reason {
                Reason::MostLoaded => fa.total_cmp(&fb),
                Reason::LeastLoaded => fb.total_cmp(&fa),
            };
            by.then(held[a].pid.cmp(&held[b].pid))
        });
        // Fewer slots than held (k lowered, or ranks that were all detail
        // while the job was small): the least extreme go.
        let over = mine.len().saturating_sub(slots(reason));
        let gone: BTreeSet<usize> = mine.drain(..over).collect();
        for &i in &mine {
            let h = held[i];
            let Some(&(best, fb)) = free(held).first() else {
                break;
            };
            let running = of(h.pid).is_some_and(|c| c.running);
            let replace = !running
                || (now.duration_since(h.since).unwrap_or(Duration::ZERO) >= HOLD
                    && reason.beats(fb, f(h.pid), MARGIN));
            if replace {
                held[i] = Held {
                    pid: best,
                    reason,
                    since: now,
                };
            }
        }
        let mut i = 0;
        held.retain(|_| {
            i += 1;
            !gone.contains(&(i - 1))
        });
        let have = held.iter().filter(|h| h.reason == reason).count();
        for (pid, _) in free(held)
            .into_iter()
            .take(slots(reason).saturating_sub(have))
        {
            held.push(Held {
                pid,
                reason,
                since: now,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use observer_common::maps::CallStats;

    use super::*;
    use crate::{
        attach::identity::{Identity, JobidSource},
        collect::snapshot::{Health, Labels},
    };

    /// A rank of job `job` whose MPI fraction at 100 s is `fraction`.
    fn rank(pid: u32, job: &str, fraction: f64) -> RankSnapshot {
        let id = Identity::new(job, &pid.to_string(), "64", 0, JobidSource::Environment);
        let mut st = CallStats::ZERO;
        st.calls = 1;
        st.time_ns = (fraction * 100e9) as u64;
        RankSnapshot {
            pid,
            labels: Labels::new(&id),
            identity: id,
            library: "openmpi",
            version: "4.1.4".into(),
            started: UNIX_EPOCH,
            attached: UNIX_EPOCH,
            counted_since: UNIX_EPOCH,
            exited: None,
            calls: Some([(0, st)].into()),
            segment: None,
            callsites: Vec::new(),
        }
    }

    fn snap(ranks: Vec<RankSnapshot>, secs: u64) -> Snapshot {
        Snapshot {
            ranks,
            health: Health::default(),
            taken: UNIX_EPOCH + Duration::from_secs(secs),
        }
    }

    /// Fractions scaled so that they read as given at `secs`.
    fn job(fractions: &[f64], secs: u64) -> Vec<RankSnapshot> {
        fractions
            .iter()
            .enumerate()
            .map(|(i, f)| rank(i as u32 + 1, "j", f * secs as f64 / 100.0))
            .collect()
    }

    fn chosen(d: &Detail) -> Vec<(u32, &'static str)> {
        d.iter().map(|(p, r)| (*p, r.as_str())).collect()
    }

    #[test]
    fn most_and_least_loaded_then_sticky() {
        let mut p = DetailPicker::default();
        let d = p.update(&snap(job(&[0.5, 0.9, 0.1, 0.4], 100), 100), 2);
        assert_eq!(chosen(&d), [(2, "most_loaded"), (3, "least_loaded")]);
        // Others become more extreme within the hold: nothing moves.
        let d = p.update(&snap(job(&[0.99, 0.5, 0.4, 0.01], 200), 200), 2);
        assert_eq!(chosen(&d), [(2, "most_loaded"), (3, "least_loaded")]);
        // Three ranks: two most loaded, one least.
        let mut p = DetailPicker::default();
        let d = p.update(&snap(job(&[0.5, 0.9, 0.1, 0.4, 0.7], 100), 100), 3);
        assert_eq!(
            chosen(&d),
            [(2, "most_loaded"), (3, "least_loaded"), (5, "most_loaded")]
        );
    }

    #[test]
    fn replaced_after_the_hold_and_only_by_the_margin() {
        let mut p = DetailPicker::default();
        p.update(&snap(job(&[0.5, 0.9, 0.1, 0.4], 100), 100), 2);
        let t = 100 + HOLD.as_secs();
        // Held long enough, but the others are not more extreme by 0.05.
        let d = p.update(&snap(job(&[0.93, 0.9, 0.1, 0.07], t), t), 2);
        assert_eq!(chosen(&d), [(2, "most_loaded"), (3, "least_loaded")]);
        // By more than the margin: replaced, both.
        let d = p.update(&snap(job(&[0.97, 0.9, 0.1, 0.02], t), t), 2);
        assert_eq!(chosen(&d), [(1, "most_loaded"), (4, "least_loaded")]);
        // Not before the hold passes again, whatever the fractions.
        let t2 = t + 60;
        let d = p.update(&snap(job(&[0.2, 0.95, 0.6, 0.5], t2), t2), 2);
        assert_eq!(chosen(&d), [(1, "most_loaded"), (4, "least_loaded")]);
    }

    #[test]
    fn an_exited_rank_is_replaced_at_once() {
        let mut p = DetailPicker::default();
        p.update(&snap(job(&[0.5, 0.9, 0.1, 0.4], 100), 100), 2);
        let mut ranks = job(&[0.5, 0.9, 0.1, 0.4], 110);
        ranks[1].exited = Some(UNIX_EPOCH + Duration::from_secs(105));
        let d = p.update(&snap(ranks.clone(), 110), 2);
        assert_eq!(chosen(&d), [(1, "most_loaded"), (3, "least_loaded")]);
        // Forgotten ranks are dropped too.
        ranks.remove(2);
        let d = p.update(&snap(ranks, 120), 2);
        assert_eq!(chosen(&d), [(1, "most_loaded"), (4, "least_loaded")]);
        // A job whose ranks all exited keeps its last choice.
        let mut ranks = job(&[0.5, 0.9, 0.1, 0.4], 130);
        for r in &mut ranks {
            r.exited = Some(UNIX_EPOCH + Duration::from_secs(125));
        }
        let mut p = DetailPicker::default();
        p.update(&snap(job(&[0.5, 0.9, 0.1, 0.4], 100), 100), 2);
        let d = p.update(&snap(ranks, 130), 2);
        assert_eq!(chosen(&d), [(2, "most_loaded"), (3, "least_loaded")]);
    }

    #[test]
    fn small_jobs_are_all_detail_and_jobs_are_separate() {
        let mut p = DetailPicker::default();
        let mut ranks = vec![rank(7, "small", 0.2)];
        ranks.extend(job(&[0.5, 0.9, 0.1], 100));
        let d = p.update(&snap(ranks.clone(), 100), 2);
        assert_eq!(
            chosen(&d),
            [(2, "most_loaded"), (3, "least_loaded"), (7, "most_loaded")]
        );
        ranks.push(rank(8, "small", 0.9));
        let d = p.update(&snap(ranks.clone(), 100), 2);
        assert_eq!(
            d.get(&7),
            Some(&Reason::MostLoaded),
            "held keeps its reason"
        );
        assert_eq!(d.get(&8), Some(&Reason::LeastLoaded));
        // K = 0: no detail ranks at all.
        assert!(p.update(&snap(ranks, 100), 0).is_empty());
    }
}
