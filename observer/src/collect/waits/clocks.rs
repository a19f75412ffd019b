//! The clocks of a job's other nodes, as this node sees them: no common
//! clock is assumed, the offsets are learned from the records themselves.
//!
//! Each node's records are on its own `CLOCK_MONOTONIC` (the daemon turns
//! the CPU counter's ticks into it before shipping them), so a time `t` of
//! node k is `t + off_k` on this node's clock, for an `off_k` nobody
//! measured. Two facts of MPI bound it, whatever the network, the site's
//! NTP or PTP, or the boot times:
//!
//! - **a message is received after it was sent**: the receiving call's
//!   leave is after the sending call's enter;
//! - **nobody leaves a barrier before everybody entered it**: every member's
//!   leave is after every member's enter.
//!
//! A local event `a` before an event `b` of node k gives `off_k ≥ a − b`; an
//! event of node k before a local one gives `off_k ≤ b − a`. The tightest of
//! each kind is kept, so `off_k` lies in `[lo, hi]`: its half-width is the
//! uncertainty the daemon exports, and a wait whose sign it cannot tell is
//! counted `unresolved{reason="clock"}`, never as a wait. Other collectives
//! are not used: one with a zero count (an `MPI_Allreduce` of nothing) may
//! return without waiting for anybody, and a wrong bound is worse than none.
//!
//! Clocks drift apart (crystals by tens of parts per million; NTP keeps
//! `CLOCK_MONOTONIC` closer): a bound learned at `τ` is held, at `t`, to be
//! looser by [`DRIFT_PPM`] × (t − τ), so a job that stops synchronising
//! sees its uncertainty grow rather than trust an old bound. A lower bound
//! above the upper one (a clock that drifted faster, or records made up by
//! the job) keeps only the newer of the two.

/// The drift two nodes' clocks are held to at most, in parts per million.
pub const DRIFT_PPM: i128 = 100;

/// Other nodes a job may span, as seen from one daemon: the peers it was
/// given, so a configuration's size; the rest are not matched.
pub const MAX_NODES: usize = 4_096;

/// A bound on an offset, learned at `at` (the daemon's `CLOCK_MONOTONIC`).
#[derive(Clone, Copy, Debug)]
struct Bound {
    value: i128,
    at: u64,
}

impl Bound {
    /// How much looser the bound is at `now` than when learned.
    fn drift(self, now: u64) -> i128 {
        i128::from(now.saturating_sub(self.at)) * DRIFT_PPM / 1_000_000
    }
}

/// What is known of one node's offset to this node's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct Offset {
    lo: Option<Bound>,
    hi: Option<Bound>,
}

impl Offset {
    /// The offset is at least `value` (learned at `now`).
    pub fn at_least(&mut self, value: i128, now: u64) {
        if self.lo.is_none_or(|b| value > b.value - b.drift(now)) {
            self.lo = Some(Bound { value, at: now });
        }
        self.reconcile(now);
    }

    /// The offset is at most `value` (learned at `now`).
    pub fn at_most(&mut self, value: i128, now: u64) {
        if self.hi.is_none_or(|b| value < b.value + b.drift(now)) {
            self.hi = Some(Bound { value, at: now });
        }
        self.reconcile(now);
    }

    /// Bounds that contradict each other: the newer stands.
    fn reconcile(&mut self, now: u64) {
        if let (Some(lo), Some(hi)) = (self.lo, self.hi)
            && lo.value - lo.drift(now) > hi.value + hi.drift(now)
        {
            if lo.at >= hi.at {
                self.hi = None;
            } else {
                self.lo = None;
            }
        }
    }

    /// The interval the offset lies in at `now`, in ns; `None` while a side
    /// is unbounded.
    pub fn interval(&self, now: u64) -> Option<(i128, i128)> {
        let (lo, hi) = (self.lo?, self.hi?);
        Some((lo.value - lo.drift(now), hi.value + hi.drift(now)))
    }

    /// Half the interval's width at `now`, in ns: infinite while unbounded.
    pub fn uncertainty(&self, now: u64) -> f64 {
        self.interval(now)
            .map_or(f64::INFINITY, |(lo, hi)| (hi - lo) as f64 / 2.0)
    }
}

/// The nodes a job's records came from: this one (0) and its peers (1..),
/// which rank is on which, and each peer's offset.
#[derive(Debug, Default)]
pub struct Nodes {
    /// The peers' names (as this daemon's configuration gives them), node
    /// `i + 1` at `i`.
    names: Vec<String>,
    offsets: Vec<Offset>,
    /// The node of every rank a peer shipped records of.
    of_rank: std::collections::HashMap<u32, u16>,
}

impl Nodes {
    /// The id of the peer named `name`, made on its first records; `None`
    /// past [`MAX_NODES`].
    pub fn id(&mut self, name: &str) -> Option<u16> {
        if let Some(i) = self.names.iter().position(|n| n == name) {
            return Some(i as u16 + 1);
        }
        if self.names.len() >= MAX_NODES {
            return None;
        }
        self.names.push(name.to_string());
        self.offsets.push(Offset::default());
        Some(self.names.len() as u16)
    }

    /// Node `node` holds `rank`; false if another node claimed it first.
    pub fn claim(&mut self, rank: u32, node: u16) -> bool {
        *self.of_rank.entry(rank).or_insert(node) == node
    }

    /// The ranks peers shipped records of.
    pub fn ranks(&self) -> usize {
        self.of_rank.len()
    }

    /// The node of `rank`: 0 (this one) unless a peer shipped its records.
    pub fn of(&self, rank: u32) -> u16 {
        self.of_rank.get(&rank).copied().unwrap_or(0)
    }

    /// The offset of node `node` (not 0).
    pub fn offset_mut(&mut self, node: u16) -> Option<&mut Offset> {
        self.offsets.get_mut(usize::from(node).checked_sub(1)?)
    }

    /// Where time `t` of node `node` lies on this node's clock at `now`:
    /// the earliest and latest it may be; `None` while unbounded.
    pub fn local(&self, node: u16, t: u64, now: u64) -> Option<(i128, i128)> {
        let t = i128::from(t);
        if node == 0 {
            return Some((t, t));
        }
        let (lo, hi) = self.offsets.get(usize::from(node) - 1)?.interval(now)?;
        Some((t + lo, t + hi))
    }

    /// The largest uncertainty over the peers, in ns; `None` for a job on
    /// this node only.
    pub fn uncertainty(&self, now: u64) -> Option<f64> {
        self.offsets
            .iter()
            .map(|o| o.uncertainty(now))
            .reduce(f64::max)
    }
}

/// The wait of a call entered at `enter` and left at `leave` (this node's
/// clock) for an event at `at` (this node's clock, as a range): Scalasca's
/// `min(at, leave) − enter`, at least 0. `Ok` with the wait (at the
/// range's middle) when the range tells: no wait at its latest, or a wait
/// at its earliest; `Err(())` when it does not (the wait is shorter than
/// the clocks' uncertainty).
pub fn wait_for(enter: u64, leave: u64, at: (i128, i128)) -> Result<u64, ()> {
    let w = |x: i128| (x.min(i128::from(leave)) - i128::from(enter)).max(0);
    let (early, late) = (w(at.0), w(at.1));
    if late == 0 {
        Ok(0)
    } else if early == 0 {
        Err(())
    } else {
        Ok(u64::try_from(w(at.0 + (at.1 - at.0) / 2)).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i128 = 1_000_000;
    const S: u64 = 1_000_000_000;

    #[test]
    fn the_tightest_bounds_are_kept_and_loosen_with_drift() {
        let mut o = Offset::default();
        assert_eq!(o.interval(0), None);
        assert_eq!(o.uncertainty(0), f64::INFINITY);
        o.at_least(-5 * MS, 0);
        o.at_most(3 * MS, 0);
        o.at_least(-6 * MS, 0);
        o.at_most(4 * MS, 0);
        assert_eq!(o.interval(0), Some((-5 * MS, 3 * MS)));
        assert_eq!(o.uncertainty(0), 4e6);
        // 10 s later: 1 ms looser each side (100 ppm).
        assert_eq!(o.interval(10 * S), Some((-6 * MS, 4 * MS)));
        // A bound learned now that is tighter than the old one drifted.
        o.at_least(-5_500_000, 10 * S);
        assert_eq!(o.interval(10 * S), Some((-5_500_000, 4 * MS)));
        // A contradiction: the newer bound stands, the other side goes.
        o.at_most(-7 * MS, 11 * S);
        assert_eq!(o.interval(11 * S), None);
        o.at_least(-8 * MS, 11 * S);
        assert_eq!(o.interval(11 * S), Some((-8 * MS, -7 * MS)));
    }

    #[test]
    fn ranks_belong_to_the_first_node_that_ships_them() {
        let mut n = Nodes::default();
        assert_eq!(n.uncertainty(0), None);
        let a = n.id("http://a:9479").unwrap();
        let b = n.id("http://b:9479").unwrap();
        assert_eq!((a, b, n.id("http://a:9479")), (1, 2, Some(1)));
        assert!(n.claim(4, a));
        assert!(!n.claim(4, b));
        assert_eq!((n.of(4), n.of(0)), (a, 0));
        assert_eq!(n.local(0, 10, 0), Some((10, 10)));
        assert_eq!(n.local(a, 10, 0), None);
        n.offset_mut(a).unwrap().at_least(-2, 0);
        n.offset_mut(a).unwrap().at_most(2, 0);
        assert_eq!(n.local(a, 10, 0), Some((8, 12)));
        assert_eq!(n.uncertainty(0), Some(f64::INFINITY));
        for i in 3..=MAX_NODES {
            assert!(n.id(&i.to_string()).is_some());
        }
        assert_eq!(n.id("one too many"), None);
    }

    #[test]
    fn a_wait_is_said_only_when_the_clocks_tell_its_sign() {
        let ms = |v: i128| v * MS;
        let m = |v: u64| v * 1_000_000;
        // Entered at 0, left at 100 ms; the culprit came at 60 ± 1 ms.
        assert_eq!(wait_for(0, m(100), (ms(59), ms(61))), Ok(m(60)));
        // At -3 ± 1 ms: surely no wait.
        assert_eq!(wait_for(0, m(100), (ms(-4), ms(-2))), Ok(0));
        // At 0.5 ± 1 ms: maybe none, maybe half a millisecond.
        assert_eq!(wait_for(0, m(100), (ms(-1), MS / 2 * 3)), Err(()));
        // Clamped to the leave: came after the call left.
        assert_eq!(wait_for(0, m(100), (ms(150), ms(160))), Ok(m(100)));
        // Exact on one clock.
        assert_eq!(wait_for(m(5), m(9), (ms(7), ms(7))), Ok(m(2)));
        assert_eq!(wait_for(m(5), m(9), (ms(5), ms(5))), Ok(0));
    }
}
