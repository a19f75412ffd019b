//! The clock every figure is stamped with, and the CPU's counter turned
//! into it.
//!
//! The shim stamps its wait records with the CPU's counter where the
//! kernel keeps time with it (`waits::clock::TICKS`, docs/waits.md), and
//! gives the counter's rate it measured in its first 5 ms, about 0.1 %
//! accurate. Records shipped to another node's daemon must be in this
//! node's `CLOCK_MONOTONIC` nanoseconds instead, which a rate 0.1 % off
//! would distort by a millisecond a second of the counter's value. The
//! daemon runs on the same node, so it reads the same counter: it takes
//! (counter, `CLOCK_MONOTONIC`) pairs itself ([`CounterClock`]), and its
//! rate is its own baseline's, from its first pair to each later one, once
//! that baseline is [`MIN_BASELINE_NS`] long (the ring's rate until then).

use std::collections::VecDeque;

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock the shim stamps with.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "aarch64")]
pub use aarch64::counter;
#[cfg(target_arch = "x86_64")]
pub use x86_64::counter;

/// No counter the shim stamps with on other instruction sets: their
/// records are `CLOCK_MONOTONIC` already.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn counter() -> Option<u64> {
    None
}

/// The shortest baseline (from the first pair) whose rate is believed
/// over the ring's: 1 s, over which the pairs' few tens of nanoseconds
/// of uncertainty are below 10⁻⁷.
pub const MIN_BASELINE_NS: u64 = 1_000_000_000;
/// Pairs kept as anchors of the conversion: a record is converted by the
/// last one taken before it, so one not much older than the pairs kept
/// converts alike however late it is drained.
const ANCHORS: usize = 128;
/// The least time between two anchors, so that [`ANCHORS`] cover at least
/// 12.8 s whatever calls [`CounterClock::refresh`] how often.
const ANCHOR_EVERY_NS: u64 = 100_000_000;

/// One reading of the counter and of `CLOCK_MONOTONIC`, taken together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair {
    /// The counter, in ticks.
    pub ticks: u64,
    /// `CLOCK_MONOTONIC`, in nanoseconds.
    pub ns: u64,
}

/// Reads a [`Pair`]: the counter either side of `clock_gettime`, the
/// narrowest of a few tries, the counter taken at the middle. `None`
/// without a counter.
pub fn pair() -> Option<Pair> {
    let mut best: Option<(u64, Pair)> = None;
    for _ in 0..5 {
        let a = counter()?;
        let ns = monotonic_ns();
        let b = counter()?;
        let Some(w) = b.checked_sub(a) else { continue };
        if best.is_none_or(|(bw, _)| w < bw) {
            best = Some((
                w,
                Pair {
                    ticks: a + w / 2,
                    ns,
                },
            ));
        }
    }
    best.map(|(_, p)| p)
}

/// Nanoseconds per tick as a ratio: `num` ns in `den` ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    num: u64,
    den: u64,
}

impl Rate {
    /// The rate a ring gives: ns per tick in 32.32 fixed point, `None` while
    /// unknown (0).
    pub fn from_q32(ns_per_tick: u64) -> Option<Rate> {
        (ns_per_tick != 0).then_some(Rate {
            num: ns_per_tick,
            den: 1 << 32,
        })
    }

    /// The rate between two pairs, `None` unless `later` is at least
    /// [`MIN_BASELINE_NS`] after `first` and the counter moved on.
    pub fn between(first: Pair, later: Pair) -> Option<Rate> {
        let ns = later.ns.checked_sub(first.ns)?;
        let ticks = later.ticks.checked_sub(first.ticks)?;
        (ns >= MIN_BASELINE_NS && ticks != 0).then_some(Rate {
            num: ns,
            den: ticks,
        })
    }

    /// Nanoseconds in `ticks`, rounded down; `u64::MAX` past it. Exact:
    /// the product of two u64 fits a u128.
    pub fn ns(self, ticks: u64) -> u64 {
        let ns = u128::from(ticks) * u128::from(self.num) / u128::from(self.den);
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

/// Counter value `t` in `CLOCK_MONOTONIC` ns, by the pair `at` and `rate`:
/// `at.ns - (at.ticks - t) × rate` for a `t` before the pair, `at.ns + (t -
/// at.ticks) × rate` after; 0 and `u64::MAX` where it would go past (a
/// hostile record's time). Nondecreasing in `t`.
pub fn ticks_to_monotonic(t: u64, at: Pair, rate: Rate) -> u64 {
    if t <= at.ticks {
        at.ns.saturating_sub(rate.ns(at.ticks - t))
    } else {
        at.ns.saturating_add(rate.ns(t - at.ticks))
    }
}

/// The conversion of the counter into `CLOCK_MONOTONIC`: the first pair
/// taken (the baseline's start) and the recent ones (anchors), each with
/// the rate of the baseline up to it.
///
/// A value converts by the last anchor taken at or before it (the first
/// kept, for older values): anchors taken later have a larger counter, so
/// the same value converts to the same nanoseconds in every later drain
/// while its anchor is kept. The matcher relies on that: a `Waitall`'s
/// receives and its group's end carry one enter time, and may come in two
/// drains.
#[derive(Debug, Default)]
pub struct CounterClock {
    first: Option<Pair>,
    /// Oldest first, each with the baseline's rate when it was taken
    /// (`None`: under [`MIN_BASELINE_NS`]).
    anchors: VecDeque<(Pair, Option<Rate>)>,
}

impl CounterClock {
    /// Takes a pair now, if the last anchor is old enough: before
    /// converting what was drained, so that its values are before an
    /// anchor. Nothing without a counter.
    pub fn refresh(&mut self) {
        if self
            .anchors
            .back()
            .is_some_and(|(p, _)| monotonic_ns().saturating_sub(p.ns) < ANCHOR_EVERY_NS)
        {
            return;
        }
        if let Some(p) = pair() {
            self.push(p);
        }
    }

    /// Keeps `p` as the latest anchor. A pair before the last one (a
    /// counter that went back, as some do over a suspend) starts over from
    /// it.
    pub fn push(&mut self, p: Pair) {
        if self
            .anchors
            .back()
            .is_some_and(|(last, _)| p.ticks <= last.ticks || p.ns <= last.ns)
        {
            self.first = None;
            self.anchors.clear();
        }
        let first = *self.first.get_or_insert(p);
        if self.anchors.len() >= ANCHORS {
            self.anchors.pop_front();
        }
        self.anchors.push_back((p, Rate::between(first, p)));
    }

    /// The anchor `t` converts by, and its rate: the baseline's, else the
    /// ring's `ns_per_tick` (32.32). `None` before any pair, or when neither
    /// rate is known.
    fn anchor(&self, t: u64, ns_per_tick: u64) -> Option<(Pair, Rate)> {
        let i = self.anchors.partition_point(|(p, _)| p.ticks <= t);
        let (p, rate) = self.anchors.get(i.saturating_sub(1))?;
        Some((*p, rate.or_else(|| Rate::from_q32(ns_per_tick))?))
    }

    /// A record's enter and leave, counter values, in `CLOCK_MONOTONIC`
    /// ns, both by the anchor of the enter: a leave not before its enter
    /// stays so. `None` when there is no conversion (no pair taken, no rate
    /// known, or no counter here).
    pub fn span(&self, enter: u64, leave: u64, ns_per_tick: u64) -> Option<(u64, u64)> {
        let (at, rate) = self.anchor(enter, ns_per_tick)?;
        Some((
            ticks_to_monotonic(enter, at, rate),
            ticks_to_monotonic(leave, at, rate),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn the_conversion_goes_both_ways_from_the_pair() {
        // 3 GHz: 1/3 ns a tick.
        let at = Pair {
            ticks: 3_000_000_000,
            ns: 10 * S,
        };
        let r = Rate::between(
            Pair {
                ticks: 0,
                ns: 9 * S,
            },
            at,
        )
        .unwrap();
        assert_eq!(ticks_to_monotonic(at.ticks, at, r), 10 * S);
        assert_eq!(ticks_to_monotonic(at.ticks - 3_000, at, r), 10 * S - 1_000);
        assert_eq!(ticks_to_monotonic(at.ticks + 3_000, at, r), 10 * S + 1_000);
        // Part of a nanosecond from the pair is dropped, on both sides.
        assert_eq!(ticks_to_monotonic(at.ticks + 2, at, r), 10 * S);
        assert_eq!(ticks_to_monotonic(at.ticks - 2, at, r), 10 * S);
        // A time before the clock's start, or past u64: clamped.
        assert_eq!(
            ticks_to_monotonic(0, at, Rate::from_q32(100 << 32).unwrap()),
            0
        );
        assert_eq!(
            ticks_to_monotonic(u64::MAX, at, Rate::from_q32(u64::MAX).unwrap()),
            u64::MAX
        );
        // Exact where 32.32 would not be: 41.666.. ns a tick (24 MHz).
        let r = Rate::between(
            Pair { ticks: 0, ns: 0 },
            Pair {
                ticks: 24_000_000,
                ns: S,
            },
        )
        .unwrap();
        assert_eq!(r.ns(24_000_000 * 3600), 3600 * S);
        assert_eq!(r.ns(u64::MAX), u64::MAX);
        assert_eq!(r.ns(3), 125);
    }

    #[test]
    fn a_rate_needs_a_second_of_baseline() {
        let a = Pair { ticks: 100, ns: S };
        assert_eq!(
            Rate::between(
                a,
                Pair {
                    ticks: 200,
                    ns: 2 * S - 1
                }
            ),
            None
        );
        assert!(
            Rate::between(
                a,
                Pair {
                    ticks: 200,
                    ns: 2 * S
                }
            )
            .is_some()
        );
        // A counter that did not move, or went back.
        assert_eq!(
            Rate::between(
                a,
                Pair {
                    ticks: 100,
                    ns: 5 * S
                }
            ),
            None
        );
        assert_eq!(
            Rate::between(
                a,
                Pair {
                    ticks: 50,
                    ns: 5 * S
                }
            ),
            None
        );
        assert_eq!(Rate::from_q32(0), None);
        // 1.5 ns a tick, as observer_common::waits::ticks_to_ns reads it.
        assert_eq!(Rate::from_q32(3 << 31).unwrap().ns(1000), 1500);
    }

    #[test]
    fn the_ring_rate_serves_until_the_baseline_is_long_enough() {
        let mut c = CounterClock::default();
        // No pair: no conversion.
        assert_eq!(c.span(5, 6, 1 << 32), None);
        // 2 ticks a ns, the ring saying 1 ns a tick (0.5 in truth).
        c.push(Pair {
            ticks: 2_000,
            ns: 1_000,
        });
        assert_eq!(c.span(1_000, 1_000, 0), None);
        assert_eq!(c.span(1_000, 1_400, 1 << 32), Some((0, 400)));
        c.push(Pair {
            ticks: 2_000 + 2 * S,
            ns: 1_000 + S,
        });
        // Values after the second anchor use its baseline rate.
        let t = 2_000 + 2 * S + 600;
        assert_eq!(
            c.span(t, t + 200, 1 << 32),
            Some((1_000 + S + 300, 1_000 + S + 400))
        );
        // Values before it still convert by the first anchor, at the
        // ring's rate: what converted once converts alike.
        assert_eq!(c.span(2_100, 2_100, 1 << 32), Some((1_100, 1_100)));
    }

    #[test]
    fn a_value_converts_alike_in_every_later_drain() {
        let mut c = CounterClock::default();
        let pair_at = |i: u64| Pair {
            ticks: 1_000 + 3 * i * S / 10,
            // A clock that jitters by a few ns around 1/3 ns a tick.
            ns: 5 * S + i * S / 10 + (i * 7) % 13,
        };
        for i in 0..20 {
            c.push(pair_at(i));
        }
        let t = pair_at(19).ticks - 1_000;
        let before = c.span(t, t + 30, 0).unwrap();
        for i in 20..40 {
            c.push(pair_at(i));
        }
        assert_eq!(c.span(t, t + 30, 0), Some(before));
        assert!((9..=11).contains(&(before.1 - before.0)), "{before:?}");
        // Near the truth: 1/3 ns a tick from the 18th anchor.
        let exact = pair_at(18).ns + (t - pair_at(18).ticks) / 3;
        assert!(before.0.abs_diff(exact) < 20, "{before:?} {exact}");
        // The anchors kept are bounded; the oldest serves older values.
        for i in 40..400 {
            c.push(pair_at(i));
        }
        assert_eq!(c.anchors.len(), ANCHORS);
        assert!(c.span(0, 0, 0).is_some());
    }

    #[test]
    fn a_counter_that_goes_back_starts_over() {
        let mut c = CounterClock::default();
        c.push(Pair {
            ticks: 1_000,
            ns: 0,
        });
        c.push(Pair {
            ticks: 1_000 + 2 * S,
            ns: 2 * S,
        });
        assert!(c.anchors.back().unwrap().1.is_some());
        c.push(Pair {
            ticks: 10,
            ns: 3 * S,
        });
        assert_eq!(c.anchors.len(), 1);
        assert_eq!(
            c.first,
            Some(Pair {
                ticks: 10,
                ns: 3 * S
            })
        );
        assert_eq!(c.span(10, 10, 0), None);
    }

    #[test]
    fn pairs_come_from_this_machines_counter() {
        // Where there is a counter, it moves with the clock.
        if let (Some(a), Some(b)) = (pair(), {
            std::thread::sleep(std::time::Duration::from_millis(2));
            pair()
        }) {
            assert!(b.ticks > a.ticks && b.ns > a.ns, "{a:?} {b:?}");
        } else {
            assert!(counter().is_none());
        }
    }
}
