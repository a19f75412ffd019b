//! The slice's cut, on event streams made here: what goes out, what is
//! left out, and why it is not cut when it cannot be.

use super::*;

fn id(name: &str) -> u16 {
    FUNCTIONS.iter().position(|f| f.name == name).unwrap() as u16
}

fn ev(kind: Kind, func: &str, t: u64) -> TraceEvent {
    TraceEvent {
        t_ns: t,
        kind: kind as u16,
        func: id(func),
        peer: -1,
        ..TraceEvent::default()
    }
}

/// A stream of one rank: (thread, event), in each thread's order.
#[derive(Default)]
struct Stream(Vec<(u32, TraceEvent)>);

impl Stream {
    /// A whole blocking collective `func` numbered `seq` on thread `tid`,
    /// entered at `t` and left at `t + 10`.
    fn coll(&mut self, tid: u32, func: &str, seq: Option<u64>, t: u64) -> &mut Self {
        let mut end = ev(Kind::CollectiveEnd, func, t + 9);
        end.request = seq.map_or(0, |s| s + 1);
        self.0.extend([
            (tid, ev(Kind::Enter, func, t)),
            (tid, ev(Kind::CollectiveBegin, func, t + 1)),
            (tid, end),
            (tid, ev(Kind::Leave, func, t + 10)),
        ]);
        self
    }

    /// A collective numbered `seq` that ends at `t` in a call begun
    /// before the recording.
    fn mark(&mut self, tid: u32, seq: u64, t: u64) -> &mut Self {
        let mut m = ev(Kind::WorldMark, "MPI_Barrier", t);
        m.request = seq + 1;
        self.0.push((tid, m));
        self
    }

    /// A call of `func` on thread `tid` from `t` to `t + 5`.
    fn call(&mut self, tid: u32, func: &str, t: u64) -> &mut Self {
        self.0.extend([
            (tid, ev(Kind::Enter, func, t)),
            (tid, ev(Kind::Leave, func, t + 5)),
        ]);
        self
    }
}

/// What went out: per rank, (thread, kind, function, time).
type Out = BTreeMap<usize, Vec<(u32, u16, u16, u64)>>;

/// Feeds `streams` (one per rank) through a slice in `batches` equal
/// parts, flushing after each, then finishes it.
fn run(slice: &mut Slice, streams: &[&Stream], batches: usize) -> Out {
    let mut out = Out::new();
    let mut put = |rank: usize, tid: u32, e: &TraceEvent| -> Result<(), ()> {
        out.entry(rank)
            .or_default()
            .push((tid, e.kind, e.func, e.t_ns));
        Ok(())
    };
    for b in 0..batches {
        for (rank, s) in streams.iter().enumerate() {
            let n = s.0.len();
            let (lo, hi) = (n * b / batches, n * (b + 1) / batches);
            for (tid, e) in &s.0[lo..hi] {
                slice.push(rank, *tid, e);
            }
        }
        slice.flush(&mut put).unwrap();
    }
    slice.finish(&mut put).unwrap();
    out
}

/// The times of what went out of `rank` for function `func`.
fn times(out: &Out, rank: usize, func: &str) -> Vec<u64> {
    out.get(&rank)
        .map(|v| v.iter().filter(|e| e.2 == id(func)).map(|e| e.3).collect())
        .unwrap_or_default()
}

/// The case: rank 1 was in the first Barrier when the recording
/// began, rank 0 was not; rank 0 stops later than rank 1. The slice runs
/// from the Barrier's end to the last Allreduce's on both, whatever the
/// batches.
#[test]
fn cut_at_the_first_and_last_common_collective() {
    let mut a = Stream::default();
    a.call(1, "MPI_Send", 100)
        .coll(1, "MPI_Barrier", Some(0), 200)
        .call(1, "MPI_Send", 300)
        .coll(1, "MPI_Allreduce", Some(1), 400)
        .call(1, "MPI_Send", 500)
        .coll(1, "MPI_Allreduce", Some(2), 600)
        .call(1, "MPI_Send", 700);
    let mut b = Stream::default();
    b.mark(2, 0, 250)
        .call(2, "MPI_Recv", 300)
        .coll(2, "MPI_Allreduce", Some(1), 400)
        .call(2, "MPI_Recv", 500)
        .coll(2, "MPI_Allreduce", Some(2), 620);
    for batches in [1, 2, 5, 40] {
        let mut s = Slice::new(&[0, 1], None);
        let out = run(&mut s, &[&a, &b], batches);
        assert!(s.is_cut(), "{batches}: {}", s.said());
        assert_eq!(
            times(&out, 0, "MPI_Send"),
            [300, 305, 500, 505],
            "{batches}"
        );
        assert_eq!(times(&out, 0, "MPI_Barrier"), [0u64; 0], "{batches}");
        assert_eq!(
            times(&out, 1, "MPI_Recv"),
            [300, 305, 500, 505],
            "{batches}"
        );
        // Both Allreduces whole on both ranks: Enter, Begin, End, Leave.
        assert_eq!(times(&out, 0, "MPI_Allreduce").len(), 8, "{batches}");
        assert_eq!(
            times(&out, 1, "MPI_Allreduce"),
            [400, 401, 409, 410, 620, 621, 629, 630],
            "{batches}"
        );
        // Rank 0: a call and the Barrier before, a call after.
        assert_eq!((s.before, s.after), (2 + 4, 2), "{batches}");
        assert_eq!(
            s.said(),
            "the slice runs from the end of blocking collective #1 on MPI_COMM_WORLD to the end of blocking collective #3 on MPI_COMM_WORLD on every rank (6 events before it and 2 after it left out)"
        );
    }
}

/// Every rank entered MPI_Finalize: the slice runs to the end of the
/// recording, so a job's last traffic after its last collective is in.
#[test]
fn finalize_ends_the_slice_at_the_end() {
    let mut a = Stream::default();
    a.coll(0, "MPI_Barrier", Some(0), 100)
        .call(0, "MPI_Send", 200)
        .call(0, "MPI_Finalize", 300);
    let mut b = Stream::default();
    b.mark(0, 0, 105)
        .call(0, "MPI_Recv", 200)
        .call(0, "MPI_Finalize", 310);
    let mut s = Slice::new(&[0, 1], None);
    let out = run(&mut s, &[&a, &b], 3);
    assert_eq!(times(&out, 0, "MPI_Send"), [200, 205]);
    assert_eq!(times(&out, 1, "MPI_Recv"), [200, 205]);
    assert_eq!(times(&out, 1, "MPI_Finalize"), [310, 315]);
    assert_eq!((s.before, s.after), (4, 0));
    assert!(
        s.said()
            .contains("to the end of the recording, every rank having entered MPI_Finalize"),
        "{}",
        s.said()
    );
}

/// A rank with no numbers (an injected shim): the recording is whole,
/// nothing is left out, and the reason names the rank.
#[test]
fn a_rank_without_numbers_leaves_it_whole() {
    let mut a = Stream::default();
    a.coll(0, "MPI_Barrier", Some(0), 100)
        .call(0, "MPI_Send", 200)
        .coll(0, "MPI_Barrier", Some(1), 300);
    let mut b = Stream::default();
    b.coll(0, "MPI_Barrier", None, 100)
        .call(0, "MPI_Recv", 200)
        .coll(0, "MPI_Barrier", None, 300);
    let mut s = Slice::new(&[0, 7], None);
    let out = run(&mut s, &[&a, &b], 4);
    assert!(!s.is_cut());
    assert_eq!(out[&0].len(), a.0.len());
    assert_eq!(out[&1].len(), b.0.len());
    assert_eq!((s.before, s.after), (0, 0));
    assert!(
        s.said().contains("rank 7 recorded no numbered"),
        "{}",
        s.said()
    );
}

/// One common point is no slice: whole, and said.
#[test]
fn one_common_point_is_not_enough() {
    let mut a = Stream::default();
    a.coll(0, "MPI_Barrier", Some(0), 100)
        .call(0, "MPI_Send", 200);
    let mut b = Stream::default();
    b.mark(0, 0, 110).call(0, "MPI_Recv", 200);
    let mut s = Slice::new(&[0, 1], None);
    let out = run(&mut s, &[&a, &b], 2);
    assert!(!s.is_cut());
    assert_eq!(out[&0].len(), 6);
    assert!(s.said().contains("fewer than two"), "{}", s.said());
}

/// Asked whole (or a rank recorded by probes): everything goes out at
/// the first flush, marks excepted.
#[test]
fn whole_passes_everything_at_once() {
    let mut a = Stream::default();
    a.mark(0, 0, 50)
        .call(0, "MPI_Send", 100)
        .coll(0, "MPI_Barrier", Some(1), 200);
    let mut s = Slice::new(&[0], Some("as asked (--whole)".into()));
    let mut n = 0;
    for (tid, e) in &a.0 {
        s.push(0, *tid, e);
    }
    s.flush(&mut |_, _, _| -> Result<(), ()> {
        n += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(n, a.0.len() - 1, "all but the mark");
    assert!(s.said().ends_with("as asked (--whole)"), "{}", s.said());
}

/// Too much before two common points: given up, whole, and said; past
/// the start: the end is each rank's own, and said.
#[test]
fn holding_is_bounded() {
    let mut a = Stream::default();
    a.coll(0, "MPI_Barrier", Some(0), 100);
    for k in 0..20 {
        a.call(0, "MPI_Send", 200 + 10 * k);
    }
    let mut b = Stream::default();
    for k in 0..20 {
        b.call(0, "MPI_Recv", 200 + 10 * k);
    }
    let mut s = Slice::with_hold(&[0, 1], None, 16);
    let out = run(&mut s, &[&a, &b], 4);
    assert!(!s.is_cut());
    assert_eq!(out[&0].len() + out[&1].len(), a.0.len() + b.0.len());
    assert!(
        s.said().contains("more than 16 events came before"),
        "{}",
        s.said()
    );

    let mut a = Stream::default();
    a.coll(0, "MPI_Barrier", Some(0), 100)
        .coll(0, "MPI_Barrier", Some(1), 150);
    let mut b = Stream::default();
    b.mark(0, 0, 110).coll(0, "MPI_Barrier", Some(1), 150);
    for k in 0..20 {
        a.call(0, "MPI_Send", 200 + 10 * k);
        b.call(0, "MPI_Recv", 200 + 10 * k);
    }
    let mut s = Slice::with_hold(&[0, 1], None, 16);
    let out = run(&mut s, &[&a, &b], 4);
    assert!(s.is_cut());
    assert_eq!(
        times(&out, 0, "MPI_Send").len(),
        40,
        "nothing lost past the start"
    );
    assert_eq!(s.before, 4, "rank 0's first Barrier");
    assert!(
        s.said()
            .contains("to each rank's own stop: more than 16 events came after"),
        "{}",
        s.said()
    );
}

/// Threads of one rank: a thread's events that come behind another
/// thread's later ones still go out, in their thread's order; a Leave
/// lost after a numbered end puts the point at the end. Both ranks
/// recorded the first Barrier whole: the slice starts at its Enter.
#[test]
fn threads_keep_their_order_and_a_lost_leave_is_the_end() {
    let mut a = Stream::default();
    a.coll(1, "MPI_Barrier", Some(0), 100)
        .call(1, "MPI_Send", 150)
        .call(2, "MPI_Recv", 120)
        .call(2, "MPI_Recv", 190)
        .coll(1, "MPI_Barrier", Some(1), 300)
        .call(1, "MPI_Send", 400);
    let mut b = Stream::default();
    b.coll(1, "MPI_Barrier", Some(0), 100);
    // Barrier 1 on rank 1 without its Leave: the next call places it.
    let mut end = ev(Kind::CollectiveEnd, "MPI_Barrier", 309);
    end.request = 2;
    b.0.extend([
        (1, ev(Kind::Enter, "MPI_Barrier", 300)),
        (1, ev(Kind::CollectiveBegin, "MPI_Barrier", 301)),
        (1, end),
    ]);
    b.call(1, "MPI_Send", 350);
    let mut s = Slice::new(&[0, 1], None);
    let out = run(&mut s, &[&a, &b], 1);
    assert!(s.is_cut(), "{}", s.said());
    let r0 = &out[&0];
    let order = |tid: u32| -> Vec<u64> { r0.iter().filter(|e| e.0 == tid).map(|e| e.3).collect() };
    assert_eq!(order(2), [120, 125, 190, 195]);
    assert_eq!(
        order(1),
        [100, 101, 109, 110, 150, 155, 300, 301, 309, 310],
        "the Send at 400 is after"
    );
    // Rank 1's slice ends at its Barrier's end (309): its Send is after.
    assert_eq!(times(&out, 1, "MPI_Send"), [0u64; 0]);
    assert_eq!(
        times(&out, 1, "MPI_Barrier"),
        [100, 101, 109, 110, 300, 301, 309]
    );
    assert_eq!((s.before, s.after), (0, 2 + 2));
    assert!(
        s.said().starts_with("the slice runs from the start of blocking collective #1 on MPI_COMM_WORLD to the end of blocking collective #2"),
        "{}",
        s.said()
    );
}

/// Events before a whole-recorded start are left out: a call on each rank
/// before the first Barrier every rank recorded from its Enter.
#[test]
fn a_start_recorded_whole_is_in_the_slice() {
    let mut a = Stream::default();
    a.call(0, "MPI_Send", 50)
        .coll(0, "MPI_Barrier", Some(4), 100)
        .call(0, "MPI_Send", 150)
        .coll(0, "MPI_Allreduce", Some(5), 200);
    let mut b = Stream::default();
    b.call(0, "MPI_Recv", 60)
        .coll(0, "MPI_Barrier", Some(4), 90)
        .call(0, "MPI_Recv", 150)
        .coll(0, "MPI_Allreduce", Some(5), 205);
    let mut s = Slice::new(&[0, 1], None);
    let out = run(&mut s, &[&a, &b], 2);
    assert_eq!(times(&out, 0, "MPI_Barrier"), [100, 101, 109, 110]);
    assert_eq!(times(&out, 1, "MPI_Barrier"), [90, 91, 99, 100]);
    assert_eq!(times(&out, 0, "MPI_Send"), [150, 155]);
    assert_eq!(times(&out, 1, "MPI_Recv"), [150, 155]);
    assert_eq!((s.before, s.after), (4, 0));
    assert!(
        s.said()
            .contains("from the start of blocking collective #5"),
        "{}",
        s.said()
    );
}
