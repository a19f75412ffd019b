//! Where `record`'s archive starts and ends: at points every recorded rank
//! recorded, so that no blocking collective on `MPI_COMM_WORLD` is half
//! inside the slice, and no message that such a collective separates from
//! its edges. Scalasca's replay needs it: with each rank starting and
//! stopping at its own instant, one rank had 36 Barriers where the others
//! had 37, and 37 sends against 36 receives, and `scout.mpi` waited for
//! ever (issue 37). Any reader that matches events across ranks is better
//! off for it.
//!
//! **The points** are the ends of the blocking collectives on
//! `MPI_COMM_WORLD`, which the shim numbers alike on every rank with no
//! communication (MPI orders a communicator's collectives the same on all
//! its members; shim/src/stats/waits.rs): its `CollectiveEnd` carries the
//! number, and a collective that ends in a call begun before the recording
//! is said by a `WorldMark`. A rank's point is the instant it left that
//! collective (its Leave, or the end itself when no Leave follows). One
//! more point is `MPI_Finalize`, which every rank enters with all its
//! communication complete.
//!
//! **The slice** starts at the first point every rank recorded (at that
//! collective's Enter if every rank recorded it whole, else just after its
//! end) and ends just after the last one (with `MPI_Finalize`, at the end
//! of the recording): a rank's events before its start, or after its end
//! point, are left out and counted. Until two common points are known
//! every event is held; then a rank's events go out as soon as every rank
//! has passed a point after them, so what is held is what came since the
//! slowest rank's last collective on `MPI_COMM_WORLD`.
//!
//! **When it cannot cut**, the slice is the whole recording, each rank from
//! its own start to its own stop, as before, and the last line says why:
//! `--whole`; a rank recorded through the probes (which see no numbers); no
//! two points common to every rank (a rank made no numbered collective: its
//! shim was injected into the running process, or is older than this
//! recorder); or more than [`HOLD_MAX`] events held before two common
//! points. Past the start, more than [`HOLD_MAX`] held events, or a rank
//! whose rings were lost, end the holding: the rest goes out, each rank to
//! its own stop, and that is said too. A message posted before a collective and received after it (only
//! nonblocking or buffered sends allow it) can still straddle an edge.

use std::collections::{BTreeMap, HashMap, VecDeque};

use observer_common::{
    FUNCTIONS,
    trace::{Kind, TraceEvent},
};

/// Events held at most, over all ranks: 72 bytes each (the event and its
/// thread), about 72 MiB.
pub(super) const HOLD_MAX: usize = 1 << 20;

/// The key of the `MPI_Finalize` point, after every collective's number.
const FINALIZE: u64 = u64::MAX;

/// The slice being cut: the events of every rank go in through
/// [`Slice::push`] and out through [`Slice::flush`] and [`Slice::finish`],
/// in each thread's order.
pub(super) struct Slice {
    ranks: Vec<RankCut>,
    mode: Mode,
    held: usize,
    hold_max: usize,
    /// `MPI_Finalize`'s `FunctionId`.
    finalize: Option<u16>,
    /// Events left out before the slice's start.
    pub(super) before: u64,
    /// Events left out after its end.
    pub(super) after: u64,
}

#[derive(Debug, PartialEq)]
enum Mode {
    /// Looking for two points every rank recorded; every event held.
    Seeking,
    /// Cut at `start` (at its Enter on every rank if `whole_start`, else
    /// after its end); every rank's events up to point `upto` went out.
    Cut {
        start: u64,
        whole_start: bool,
        upto: u64,
    },
    /// Cut at `start`, but the end is each rank's own stop: why.
    OpenEnd {
        start: u64,
        whole_start: bool,
        why: String,
    },
    /// Not cut: why.
    Whole(String),
}

/// One rank's part.
#[derive(Default)]
struct RankCut {
    /// Its world rank, for what is said.
    rank: u32,
    /// Events not yet out, with their thread, in the order they came.
    held: VecDeque<(u32, TraceEvent)>,
    /// The points it passed: key (a collective's number, or [`FINALIZE`])
    /// → the instant it passed it.
    points: BTreeMap<u64, u64>,
    /// Per thread, a numbered collective whose end came and whose Leave
    /// has not: (its number, the end's instant).
    ending: HashMap<u32, (u64, u64)>,
    /// The numbered collectives it recorded whole: number → its Enter.
    entered: BTreeMap<u64, u64>,
    /// Per thread, the Enter of the call it is in.
    open: HashMap<u32, u64>,
    /// Events at or before this instant are before the slice.
    lo: u64,
}

impl RankCut {
    /// Takes note of the point `ev` passes, if any.
    fn note(&mut self, tid: u32, ev: &TraceEvent, finalize: Option<u16>) {
        // The event after a numbered end on its thread places that point:
        // at the Leave that closes the collective, or, when none came
        // (lost), at the end itself.
        if let Some((seq, t_end)) = self.ending.remove(&tid) {
            let t = if Kind::of(ev) == Some(Kind::Leave) {
                ev.t_ns
            } else {
                t_end
            };
            self.points.insert(seq, t);
        }
        match Kind::of(ev) {
            Some(Kind::Enter) => {
                self.open.insert(tid, ev.t_ns);
            }
            Some(Kind::Leave) => {
                self.open.remove(&tid);
            }
            _ => {}
        }
        match Kind::of(ev) {
            Some(Kind::WorldMark) => {
                if let Some(seq) = ev.world_seq() {
                    self.points.insert(seq, ev.t_ns);
                }
            }
            Some(Kind::CollectiveEnd) => {
                if let Some(seq) = ev.world_seq() {
                    self.ending.insert(tid, (seq, ev.t_ns));
                    if let Some(&enter) = self.open.get(&tid) {
                        self.entered.insert(seq, enter);
                    }
                }
            }
            Some(Kind::Enter) if Some(ev.func) == finalize => {
                self.points.insert(FINALIZE, ev.t_ns);
            }
            _ => {}
        }
    }

    /// Places the points whose Leave never came, at their end.
    fn settle(&mut self) {
        for (_, (seq, t)) in self.ending.drain() {
            self.points.insert(seq, t);
        }
    }

    /// The instant the slice ends for this rank if it ends at `point`.
    fn bound(&self, point: u64) -> u64 {
        if point == FINALIZE {
            u64::MAX
        } else {
            self.points.get(&point).copied().unwrap_or(0)
        }
    }
}

impl Slice {
    /// A slice of the ranks `ranks` (world ranks, in the recorder's order),
    /// cut at common points, or whole for the reason `whole`.
    pub(super) fn new(ranks: &[u32], whole: Option<String>) -> Slice {
        Slice::with_hold(ranks, whole, HOLD_MAX)
    }

    fn with_hold(ranks: &[u32], whole: Option<String>, hold_max: usize) -> Slice {
        Slice {
            ranks: ranks
                .iter()
                .map(|&rank| RankCut {
                    rank,
                    ..RankCut::default()
                })
                .collect(),
            mode: whole.map_or(Mode::Seeking, Mode::Whole),
            held: 0,
            hold_max,
            finalize: FUNCTIONS
                .iter()
                .position(|f| f.name == "MPI_Finalize")
                .map(|i| i as u16),
            before: 0,
            after: 0,
        }
    }

    /// Takes in event `ev` of thread `tid` of the `rank`-th rank (a
    /// non-definition event of its shim's rings, in its thread's order).
    pub(super) fn push(&mut self, rank: usize, tid: u32, ev: &TraceEvent) {
        let Some(r) = self.ranks.get_mut(rank) else {
            return;
        };
        // Points matter until the end is known to be each rank's own.
        if matches!(self.mode, Mode::Seeking | Mode::Cut { .. }) {
            r.note(tid, ev, self.finalize);
        }
        // A mark is no event of the archive.
        if Kind::of(ev) != Some(Kind::WorldMark) {
            r.held.push_back((tid, *ev));
            self.held += 1;
        }
    }

    /// The `rank`-th rank's rings were lost mid-recording: it records no
    /// more points, so the slice can end at none: until then uncut, the
    /// recording is whole; cut already, its end is each rank's own.
    pub(super) fn lose(&mut self, rank: usize) {
        let Some(r) = self.ranks.get(rank) else {
            return;
        };
        let why = format!("rank {}'s rings were lost mid-recording", r.rank);
        self.mode = match self.mode {
            Mode::Seeking => Mode::Whole(why),
            Mode::Cut {
                start, whole_start, ..
            } => Mode::OpenEnd {
                start,
                whole_start,
                why,
            },
            _ => return,
        };
    }

    /// Sends out what may go now: everything while the slice is whole;
    /// once cut, every rank's events up to the latest point every rank
    /// passed.
    pub(super) fn flush<E>(
        &mut self,
        out: &mut impl FnMut(usize, u32, &TraceEvent) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.mode == Mode::Seeking {
            self.prune_seeking();
            let common = self.common();
            if common.len() >= 2 && common[0] != FINALIZE {
                self.start_at(common[0]);
            } else if self.held > self.hold_max {
                self.mode = Mode::Whole(format!(
                    "more than {} events came before every rank had ended two blocking collectives on MPI_COMM_WORLD",
                    self.hold_max
                ));
            }
        }
        match self.mode {
            Mode::Seeking => Ok(()),
            Mode::Cut {
                start,
                whole_start,
                upto,
            } => {
                let latest = self.common().last().copied().unwrap_or(upto);
                let upto = upto.max(latest);
                self.mode = Mode::Cut {
                    start,
                    whole_start,
                    upto,
                };
                for (i, r) in self.ranks.iter_mut().enumerate() {
                    let bound = r.bound(upto);
                    while r.held.front().is_some_and(|(_, e)| e.t_ns <= bound) {
                        let (tid, ev) = r.held.pop_front().expect("a front");
                        self.held -= 1;
                        if ev.t_ns <= r.lo {
                            self.before += 1;
                        } else {
                            out(i, tid, &ev)?;
                        }
                    }
                    // Only `upto` and later can be a later point.
                    r.points = r.points.split_off(&upto);
                    r.entered.clear();
                }
                if self.held > self.hold_max {
                    self.mode = Mode::OpenEnd {
                        start,
                        whole_start,
                        why: format!(
                            "more than {} events came after the last blocking collective on MPI_COMM_WORLD every rank had ended",
                            self.hold_max
                        ),
                    };
                    return self.release(out);
                }
                Ok(())
            }
            Mode::OpenEnd { .. } | Mode::Whole(_) => self.release(out),
        }
    }

    /// The end of the recording: sends out the rest of the slice and
    /// leaves out what comes after its end.
    pub(super) fn finish<E>(
        &mut self,
        out: &mut impl FnMut(usize, u32, &TraceEvent) -> Result<(), E>,
    ) -> Result<(), E> {
        for r in &mut self.ranks {
            r.settle();
        }
        self.flush(out)?;
        match self.mode {
            Mode::Seeking => {
                self.mode = Mode::Whole(match self.ranks.iter().find(|r| r.points.is_empty()) {
                    Some(r) => format!(
                        "rank {} recorded no numbered blocking collective on MPI_COMM_WORLD (it made none, or its shim was injected into the running process, or is older than this recorder)",
                        r.rank
                    ),
                    None => "fewer than two blocking collectives on MPI_COMM_WORLD (or MPI_Finalize) were recorded by every rank".into(),
                });
                self.release(out)
            }
            Mode::Cut { upto, .. } => {
                for (i, r) in self.ranks.iter_mut().enumerate() {
                    let bound = r.bound(upto);
                    for (tid, ev) in r.held.drain(..) {
                        if ev.t_ns <= r.lo {
                            self.before += 1;
                        } else if ev.t_ns <= bound {
                            out(i, tid, &ev)?;
                        } else {
                            self.after += 1;
                        }
                    }
                }
                self.held = 0;
                Ok(())
            }
            Mode::OpenEnd { .. } | Mode::Whole(_) => self.release(out),
        }
    }

    /// What the slice is, for `record`'s last line.
    pub(super) fn said(&self) -> String {
        let no = |seq: u64| format!("blocking collective #{} on MPI_COMM_WORLD", seq + 1);
        let from = |start: u64, whole: bool| {
            format!(
                "the slice runs from the {} of {}",
                if whole { "start" } else { "end" },
                no(start)
            )
        };
        let left = format!(
            "{} events before it and {} after it left out",
            self.before, self.after
        );
        match &self.mode {
            Mode::Cut {
                start,
                whole_start,
                upto,
            } if *upto == FINALIZE => format!(
                "{} on every rank to the end of the recording, every rank having entered MPI_Finalize ({left})",
                from(*start, *whole_start)
            ),
            Mode::Cut {
                start,
                whole_start,
                upto,
            } => format!(
                "{} to the end of {} on every rank ({left})",
                from(*start, *whole_start),
                no(*upto)
            ),
            Mode::OpenEnd {
                start,
                whole_start,
                why,
            } => format!(
                "{} on every rank to each rank's own stop: {why} ({left})",
                from(*start, *whole_start)
            ),
            Mode::Whole(why) => {
                format!(
                    "not cut at points common to every rank, each rank runs from its own start to its own stop: {why}"
                )
            }
            Mode::Seeking => "the slice is not cut yet".into(),
        }
    }

    /// Whether the slice was cut at a common start.
    #[cfg(test)]
    fn is_cut(&self) -> bool {
        matches!(self.mode, Mode::Cut { .. } | Mode::OpenEnd { .. })
    }

    /// The points every rank passed, in order.
    fn common(&self) -> Vec<u64> {
        let Some((first, rest)) = self.ranks.split_first() else {
            return Vec::new();
        };
        first
            .points
            .keys()
            .copied()
            .filter(|k| rest.iter().all(|r| r.points.contains_key(k)))
            .collect()
    }

    /// While seeking: a point before some rank's first can never be
    /// common (a rank passes its collectives in order).
    fn prune_seeking(&mut self) {
        let Some(floor) = self
            .ranks
            .iter()
            .map(|r| r.points.keys().next().copied())
            .collect::<Option<Vec<u64>>>()
            .and_then(|firsts| firsts.into_iter().max())
        else {
            return;
        };
        for r in &mut self.ranks {
            r.points = r.points.split_off(&floor);
            r.entered = r.entered.split_off(&floor);
        }
    }

    /// Cuts the start at point `start`, which every rank passed: at its
    /// Enter if every rank recorded it whole, else after its end.
    fn start_at(&mut self, start: u64) {
        let whole_start = self.ranks.iter().all(|r| r.entered.contains_key(&start));
        for r in &mut self.ranks {
            r.lo = match r.entered.get(&start) {
                Some(&enter) if whole_start => enter.saturating_sub(1),
                _ => r.bound(start),
            };
        }
        self.mode = Mode::Cut {
            start,
            whole_start,
            upto: start,
        };
    }

    /// Sends out everything held (but what is before a cut start).
    fn release<E>(
        &mut self,
        out: &mut impl FnMut(usize, u32, &TraceEvent) -> Result<(), E>,
    ) -> Result<(), E> {
        for (i, r) in self.ranks.iter_mut().enumerate() {
            while let Some((tid, ev)) = r.held.pop_front() {
                self.held -= 1;
                if ev.t_ns <= r.lo {
                    self.before += 1;
                } else {
                    out(i, tid, &ev)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
