//! Late Sender and Late Receiver on one node: the messages' unit tests.

use observer_common::waits::{self, Plain, flag, kind};

use super::super::{Drain, JobWaits, Pattern, TIMEOUT_NS, Unresolved, Waits};

const MS: u64 = 1_000_000;
const LS: usize = Pattern::LateSender as usize;
const LR: usize = Pattern::LateReceiver as usize;
const SSEND: u16 = observer_common::FunctionId::Ssend as u16;

fn send(dest: i32, tag: i32, seq: u64, enter: u64) -> Plain {
    Plain {
        enter,
        leave: enter,
        seq,
        kind: kind::SEND,
        peer: dest,
        tag,
        thread: 1,
        bytes: 8,
        ..Plain::default()
    }
}

/// A blocking MPI_Ssend.
fn ssend(dest: i32, tag: i32, seq: u64, enter: u64, leave: u64) -> Plain {
    Plain {
        leave,
        flags: flag::BLOCKING,
        function: SSEND,
        ..send(dest, tag, seq, enter)
    }
}

/// The post, at `enter`, of a receive completed later.
fn posted(src: i32, tag: i32, seq: u64, enter: u64) -> Plain {
    Plain {
        kind: kind::POSTED,
        bytes: 0,
        ..send(src, tag, seq, enter)
    }
}

fn recv(src: i32, tag: i32, seq: u64, enter: u64, leave: u64, flags: u8) -> Plain {
    Plain {
        kind: kind::RECV,
        leave,
        flags,
        ..send(src, tag, seq, enter)
    }
}

/// Feeds each rank's records of a `size`-rank job (one message in
/// `1 << shift` sampled), then settles at `now`.
fn feed(w: &mut Waits, size: u32, shift: u64, per_rank: &[Vec<Plain>], now: u64) {
    for (rank, recs) in per_rank.iter().enumerate() {
        w.add(
            "j",
            &Drain {
                p2p_shift: shift + 1,
                ..Drain::ns(rank as u32, size, recs)
            },
            now,
        );
    }
    w.settle(now);
}

fn run(size: u32, shift: u64, per_rank: &[Vec<Plain>], now: u64) -> (Waits, JobWaits) {
    let mut w = Waits::default();
    feed(&mut w, size, shift, per_rank, now);
    let j = w.figures("j").unwrap().clone();
    (w, j)
}

#[test]
fn a_receive_posted_early_waits_for_its_late_sender() {
    // Rank 1 enters MPI_Recv at 0 ms each 100 ms; rank 0 sends 20 ms
    // later; the receive ends 1 ms after that.
    let per_rank: Vec<Vec<Plain>> = vec![
        (0..10)
            .map(|i| send(1, 5, i, i * 100 * MS + 20 * MS))
            .collect(),
        (0..10)
            .map(|i| recv(0, 5, i, i * 100 * MS, i * 100 * MS + 21 * MS, 0))
            .collect(),
    ];
    let (w, j) = run(2, 0, &per_rank, 2_000 * MS);
    assert_eq!(j.waited_ns[LS], 10 * 20 * MS);
    assert_eq!(j.instances[LS], 10);
    assert_eq!(j.unresolved, [0; 5]);
    assert_eq!(j.culprit().map(|c| c.0), Some(0));
    assert_eq!(w.pending(), 0);
    assert_eq!(j.ranks[&1].waited_ns[LS], 200 * MS);
    assert_eq!(j.ranks[&0].caused_ns[LS], 200 * MS);
    let by_fn: Vec<_> = j.functions.iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(by_fn, [((0, Pattern::LateSender), 200 * MS)]);
    // A function no shim writes is filed under one key.
    let mut odd = per_rank.clone();
    for r in &mut odd[1] {
        r.function = 60_000;
    }
    let (_, j) = run(2, 0, &odd, 2_000 * MS);
    let by_fn: Vec<_> = j.functions.iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(
        by_fn,
        [(
            (super::super::UNKNOWN_FUNCTION, Pattern::LateSender),
            200 * MS
        )]
    );
    // A sender in time makes nobody wait; sampled ones count N times.
    let per_rank = vec![
        vec![send(1, 0, 0, 0), send(1, 0, 8, 0)],
        vec![recv(0, 0, 0, 10, 11, 0), recv(0, 0, 8, 0, 7, 0)],
    ];
    let (_, j) = run(2, 3, &per_rank, 0);
    assert_eq!((j.waited_ns[LS], j.instances[LS]), (0, 2));
    assert_eq!(j.p2p_sample_period, 8);
    let per_rank = vec![vec![send(1, 0, 0, 5)], vec![recv(0, 0, 0, 0, 7, 0)]];
    let (_, j) = run(2, 3, &per_rank, 0);
    assert_eq!(j.waited_ns[LS], 5 * 8);
}

#[test]
fn a_wait_passed_on_is_charged_to_its_root_cause() {
    // The demo's step: rank 3 computes 20 ms longer. Rank 0 waits for
    // its message (10-30 ms), sends to rank 1 at 31; rank 1 waits for
    // that (10-31); in the Allreduce, rank 1 is last (32), so rank 2
    // waits 10-32 for it and ranks 0 and 3 a little.
    let allreduce = |enter: u64| Plain {
        enter: enter * MS,
        leave: 33 * MS,
        seq: 0,
        comm: waits::WORLD,
        kind: kind::COLL,
        peer: waits::NO_ROOT,
        function: observer_common::function_by_name("MPI_Allreduce").unwrap(),
        ..Plain::default()
    };
    let per_rank = vec![
        vec![
            recv(3, 0, 0, 10 * MS, 30 * MS, 0),
            send(1, 1, 0, 31 * MS),
            allreduce(31),
        ],
        vec![recv(0, 1, 0, 10 * MS, 31 * MS, 0), allreduce(32)],
        vec![allreduce(10)],
        vec![send(0, 0, 0, 30 * MS), allreduce(30)],
    ];
    let (_, j) = run(4, 0, &per_rank, 0);
    let nxn = Pattern::WaitNxn as usize;
    // Waited: rank 0 20 + 1, rank 1 21, rank 2 22, rank 3 2.
    assert_eq!(j.waited_ns[LS], 41 * MS);
    assert_eq!(j.waited_ns[nxn], 25 * MS);
    // Who came late: rank 3 for rank 0, rank 0 for rank 1, rank 1 in
    // the Allreduce.
    let late = |r: u32| j.ranks[&r].late_ns;
    assert_eq!(
        (late(3)[LS], late(0)[LS], late(1)[nxn]),
        (20 * MS, 21 * MS, 25 * MS)
    );
    // Root causes: rank 0 was waiting for rank 3 during 20 of rank 1's
    // 21 ms (the last one is rank 0's own); of rank 2's 22 ms, rank 1
    // was waiting 20 for rank 3 (passed on through rank 0) and 1 for
    // rank 0, and 1 is rank 1's own; rank 3's 2 ms are rank 0's and
    // rank 1's, rank 0's 1 ms rank 1's.
    let caused = |r: u32| j.ranks[&r].caused_ns;
    assert_eq!(caused(3)[LS], 40 * MS);
    assert_eq!(caused(3)[nxn], 20 * MS);
    assert_eq!(caused(0)[LS], MS);
    assert_eq!(caused(0)[nxn], 2 * MS);
    assert_eq!(caused(1)[nxn], 3 * MS);
    assert_eq!(j.culprit().map(|c| c.0), Some(3));
    // Nothing is charged twice: the root causes add up to the waits.
    let all = |f: fn(&super::super::RankWaits) -> [u64; super::super::PATTERNS]| {
        j.ranks
            .values()
            .map(|r| f(r).iter().sum::<u64>())
            .sum::<u64>()
    };
    assert_eq!(all(|r| r.caused_ns), 66 * MS);
    assert_eq!(all(|r| r.late_ns), 66 * MS);
    assert_eq!(all(|r| r.waited_ns), 66 * MS);
}

#[test]
fn a_waitall_waits_for_its_latest_sender_only() {
    // Rank 2's Waitall (enter 0, leave 31 ms) completes messages from
    // rank 0 (sent at 30 ms) and rank 1 (at 10 ms); its next call seals
    // the group.
    let per_rank = vec![
        vec![send(2, 0, 0, 30 * MS)],
        vec![send(2, 0, 0, 10 * MS)],
        vec![
            recv(1, 0, 0, 0, 31 * MS, flag::MULTI),
            recv(0, 0, 0, 0, 31 * MS, flag::MULTI),
            send(0, 9, 0, 40 * MS),
        ],
    ];
    let (w, j) = run(3, 0, &per_rank, 0);
    assert_eq!((j.waited_ns[LS], j.instances[LS]), (30 * MS, 1));
    assert_eq!(j.culprit().map(|c| c.0), Some(0));
    // Rank 2's send to rank 0 waits for its receive.
    assert_eq!(w.pending(), 1);
    // A group not sealed is evaluated at the timeout.
    let per_rank = vec![
        vec![send(1, 0, 0, 30 * MS)],
        vec![recv(0, 0, 0, 0, 31 * MS, flag::MULTI)],
    ];
    let mut w = Waits::default();
    feed(&mut w, 2, 0, &per_rank, 0);
    assert_eq!(w.figures("j").unwrap().instances[LS], 0);
    w.settle(TIMEOUT_NS);
    let j = w.figures("j").unwrap();
    assert_eq!((j.waited_ns[LS], j.instances[LS]), (30 * MS, 1));
    // The shim's end record makes it whole at once; one for a group
    // nobody knows ends nothing.
    let end = |enter| Plain {
        kind: kind::GROUP_END,
        peer: waits::NO_ROOT,
        seq: 1,
        ..send(0, 0, 0, enter)
    };
    let per_rank = vec![
        vec![send(1, 0, 0, 30 * MS)],
        vec![recv(0, 0, 0, 0, 31 * MS, flag::MULTI), end(0), end(7)],
    ];
    let (w, j) = run(2, 0, &per_rank, 0);
    assert_eq!((j.waited_ns[LS], j.instances[LS]), (30 * MS, 1));
    assert_eq!((w.pending(), j.records_invalid), (0, 0));
}

#[test]
fn a_group_with_an_unmatched_message_counts_no_wait() {
    // Rank 2 waits for ranks 0 and 1; rank 1's send never comes (a rank
    // on another node).
    let per_rank = vec![
        vec![send(2, 0, 0, 30 * MS)],
        vec![],
        vec![
            recv(0, 0, 0, 0, 31 * MS, flag::MULTI),
            recv(1, 0, 0, 0, 31 * MS, flag::MULTI),
            send(0, 9, 0, 40 * MS),
        ],
    ];
    let mut w = Waits::default();
    feed(&mut w, 3, 0, &per_rank, 0);
    w.settle(TIMEOUT_NS);
    let j = w.figures("j").unwrap();
    assert_eq!((j.waited_ns[LS], j.instances[LS]), (0, 0));
    // The unmatched receive and the send nobody received.
    assert_eq!(j.unresolved[Unresolved::Incomplete as usize], 2);
    assert_eq!(j.culprit(), None);
    assert_eq!(w.pending(), 0);
}

#[test]
fn tests_match_without_a_wait_and_misnumbered_pairs_are_mismatches() {
    let per_rank = vec![
        vec![
            send(1, 0, 0, 50),
            // Sent after it was received; another size.
            send(1, 0, 1, 500),
            Plain {
                bytes: 16,
                ..send(1, 0, 2, 600)
            },
            // Of unknown size: believed.
            Plain {
                bytes: u64::MAX,
                ..send(1, 0, 3, 700)
            },
        ],
        vec![
            recv(0, 0, 0, 0, 60, flag::TEST),
            recv(0, 0, 1, 0, 100, 0),
            recv(0, 0, 2, 0, 700, 0),
            recv(0, 0, 3, 650, 800, 0),
        ],
    ];
    let (w, j) = run(2, 0, &per_rank, 0);
    assert_eq!(j.unresolved[Unresolved::Mismatch as usize], 2);
    assert_eq!((j.waited_ns[LS], j.instances[LS]), (50, 1));
    assert_eq!(w.pending(), 0);
}

#[test]
fn records_no_shim_writes_are_counted_not_kept() {
    let per_rank = vec![vec![
        // A peer beyond the job, unknown flags, a send with flags,
        // both flags, time backwards, and a second send of one message.
        send(2, 0, 0, 0),
        recv(1, 0, 0, 0, 1, 0x80),
        Plain {
            flags: flag::MULTI,
            ..send(1, 0, 1, 0)
        },
        recv(1, 0, 1, 0, 1, flag::MULTI | flag::TEST),
        recv(1, 0, 2, 5, 1, 0),
        send(1, 0, 3, 0),
        send(1, 0, 3, 0),
        // A receive's flag on a send, a send's on a receive, a post
        // with flags, a post after its receive, two posts.
        Plain {
            flags: flag::POSTED_HERE,
            ..send(1, 0, 4, 0)
        },
        recv(1, 0, 5, 0, 1, flag::BLOCKING),
        Plain {
            flags: flag::TEST,
            ..posted(1, 0, 6, 0)
        },
        recv(1, 0, 7, 0, 1, 0),
        posted(1, 0, 7, 0),
        posted(1, 0, 8, 0),
        posted(1, 0, 8, 0),
    ]];
    let (w, j) = run(2, 0, &per_rank, 0);
    assert_eq!(j.records_invalid, 11);
    assert_eq!(w.pending(), 3);
}

#[test]
fn a_blocking_send_waits_for_its_late_receiver() {
    // Rank 0 enters MPI_Ssend at 0 and leaves at 61 ms; rank 1 enters
    // MPI_Recv at 60 ms (its post) and leaves at 61 ms.
    let per_rank = vec![
        vec![ssend(1, 0, 0, 0, 61 * MS)],
        vec![recv(0, 0, 0, 60 * MS, 61 * MS, flag::POSTED_HERE)],
    ];
    let (w, j) = run(2, 0, &per_rank, 0);
    assert_eq!((j.waited_ns[LR], j.instances[LR]), (60 * MS, 1));
    // The receive waited for nothing, and counts as Late Sender's.
    assert_eq!((j.waited_ns[LS], j.instances[LS]), (0, 1));
    assert_eq!(j.ranks[&0].waited_ns[LR], 60 * MS);
    assert_eq!(j.ranks[&1].late_ns[LR], 60 * MS);
    assert_eq!(j.culprit().map(|c| c.0), Some(1));
    let by_fn: Vec<_> = j.functions.iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(by_fn, [((SSEND, Pattern::LateReceiver), 60 * MS)]);
    assert_eq!((w.pending(), j.unresolved), (0, [0; 5]));
    // Posted by an MPI_Irecv at 40 ms, completed in an MPI_Wait entered
    // at 70: the sender waited until the post. Sampled: 8 times.
    let per_rank = vec![
        vec![ssend(1, 0, 0, 0, 71 * MS)],
        vec![posted(0, 0, 0, 40 * MS), recv(0, 0, 0, 70 * MS, 71 * MS, 0)],
    ];
    let (_, j) = run(2, 3, &per_rank, 0);
    assert_eq!((j.waited_ns[LR], j.instances[LR]), (8 * 40 * MS, 1));
    assert_eq!(j.waited_ns[LS], 0);
    // An eager send left before the receive was posted: no wait, but
    // evaluated; a send that is not blocking is not.
    let per_rank = vec![
        vec![ssend(1, 0, 0, 0, MS), send(1, 0, 1, 0)],
        vec![
            recv(0, 0, 0, 60 * MS, 61 * MS, flag::POSTED_HERE),
            recv(0, 0, 1, 60 * MS, 61 * MS, flag::POSTED_HERE),
        ],
    ];
    let (_, j) = run(2, 0, &per_rank, 0);
    assert_eq!((j.waited_ns[LR], j.instances[LR]), (0, 1));
    assert_eq!(j.instances[LS], 2);
}

#[test]
fn a_post_not_known_is_bounded_or_unresolved() {
    // The post's record lost: a receive completed in a call entered
    // before the send was posted earlier still, so no wait; one
    // entered after it cannot be said.
    let per_rank = vec![
        vec![
            ssend(1, 0, 0, 10 * MS, 71 * MS),
            ssend(1, 0, 1, 80 * MS, 90 * MS),
        ],
        vec![
            recv(0, 0, 0, 5 * MS, 71 * MS, 0),
            recv(0, 0, 1, 85 * MS, 90 * MS, 0),
        ],
    ];
    let (_, j) = run(2, 0, &per_rank, 0);
    assert_eq!((j.waited_ns[LR], j.instances[LR]), (0, 1));
    assert_eq!(j.unresolved[Unresolved::Incomplete as usize], 1);
    // A post after its receive completed: a mismatch, never a wait.
    let per_rank = vec![
        vec![ssend(1, 0, 0, 0, 71 * MS)],
        vec![posted(0, 0, 0, 80 * MS), recv(0, 0, 0, 70 * MS, 71 * MS, 0)],
    ];
    let (_, j) = run(2, 0, &per_rank, 0);
    assert_eq!((j.waited_ns[LR], j.instances[LR]), (0, 0));
    assert_eq!(j.unresolved[Unresolved::Mismatch as usize], 1);
}

#[test]
fn a_post_does_not_close_its_threads_group() {
    // Rank 2's Waitall completes two receives; the second's post
    // record, written between them, is another call's time.
    let per_rank = vec![
        vec![send(2, 0, 0, 30 * MS)],
        vec![send(2, 0, 0, 10 * MS)],
        vec![
            posted(1, 0, 0, 0),
            recv(1, 0, 0, MS, 31 * MS, flag::MULTI),
            posted(0, 0, 0, 0),
            recv(0, 0, 0, MS, 31 * MS, flag::MULTI),
        ],
    ];
    let mut w = Waits::default();
    feed(&mut w, 3, 0, &per_rank, 0);
    // Not sealed by the post: evaluated whole at the timeout, once.
    assert_eq!(w.figures("j").unwrap().instances[LS], 0);
    w.settle(TIMEOUT_NS);
    let j = w.figures("j").unwrap();
    assert_eq!((j.waited_ns[LS], j.instances[LS]), (29 * MS, 1));
}

#[test]
fn pending_messages_are_bounded_and_skips_counted_once() {
    // 7 sends more than a 2-rank job may hold: given up, and counted once
    // a message, at their receives.
    let n = super::MAX_PENDING as u64 + 7;
    let sends: Vec<Plain> = (0..n).map(|s| send(1, 0, s, 0)).collect();
    let (w, j) = run(2, 0, std::slice::from_ref(&sends), 0);
    assert_eq!(w.pending(), super::MAX_PENDING);
    assert_eq!(j.unresolved[Unresolved::Overflow as usize], 0);
    let recvs: Vec<Plain> = (0..n).map(|s| recv(0, 0, s, 0, MS, 0)).collect();
    let (w, j) = run(2, 0, &[sends, recvs], 0);
    assert_eq!(w.pending(), 0);
    assert_eq!(j.unresolved[Unresolved::Overflow as usize], 7);
    assert_eq!(j.instances[LS], super::MAX_PENDING as u64);
    // A ring's skipped count is a running total.
    let mut w = Waits::default();
    for (skipped, want) in [(5, 5), (7, 7), (2, 7), (4, 9)] {
        w.add(
            "j",
            &Drain {
                skipped,
                ..Drain::ns(0, 2, &[])
            },
            0,
        );
        let j = w.figures("j").unwrap();
        assert_eq!(j.unresolved[Unresolved::Skipped as usize], want);
    }
}

#[test]
fn counter_ticks_wait_for_their_rate() {
    let mut w = Waits::default();
    let drain = |w: &mut Waits, rank, rate, records: &[Plain]| {
        w.add(
            "j",
            &Drain {
                clock: waits::clock::TICKS,
                ns_per_tick: rate,
                ..Drain::ns(rank, 2, records)
            },
            0,
        );
    };
    drain(&mut w, 0, 0, &[send(1, 0, 0, 1_000)]);
    drain(&mut w, 1, 0, &[recv(0, 0, 0, 0, 1_100, 0)]);
    w.settle(0);
    assert_eq!(w.pending(), 1);
    drain(&mut w, 1, 2 << 32, &[]);
    w.settle(1);
    assert_eq!(w.figures("j").unwrap().waited_ns[LS], 2_000);
}

#[test]
fn the_bound_on_messages_grows_with_the_ranks_the_daemon_knows() {
    // 10 ranks of 2,000 sampled sends each: 20,000 waiting for their
    // receives, over MAX_PENDING, under 10 × MESSAGES_PER_RANK.
    let per_rank: Vec<Vec<Plain>> = (0..10u32)
        .map(|r| {
            (0..2_000)
                .map(|s| send(((r + 1) % 10) as i32, 0, s, 0))
                .collect()
        })
        .collect();
    let (w, j) = run(10, 0, &per_rank, 0);
    const { assert!(20_000 > super::MAX_PENDING && 20_000 <= 10 * super::super::MESSAGES_PER_RANK) };
    assert_eq!(w.pending(), 20_000);
    assert_eq!(j.unresolved, [0; 5]);
}

/// An MPI_Issend posted at `enter`, whose completing call is recorded.
fn issend(dest: i32, tag: i32, seq: u64, enter: u64) -> Plain {
    Plain {
        flags: flag::LATER,
        function: observer_common::FunctionId::Issend as u16,
        ..send(dest, tag, seq, enter)
    }
}

/// The call, entered at `enter` and left at `leave`, that completed the
/// send of message (`dest`, `tag`, `seq`).
fn sent_done(dest: i32, tag: i32, seq: u64, enter: u64, leave: u64, flags: u8) -> Plain {
    Plain {
        kind: kind::SENT,
        leave,
        flags,
        bytes: u64::MAX,
        function: observer_common::function_by_name("MPI_Wait").unwrap(),
        ..send(dest, tag, seq, enter)
    }
}

#[test]
fn a_send_completed_in_a_wait_waits_there_for_its_late_receiver() {
    // Rank 0 posts an MPI_Issend at 0 and waits in MPI_Wait from 1 ms;
    // rank 1 posts its receive at 30 ms: rank 0 waited 29 ms there.
    let per_rank = vec![
        vec![issend(1, 4, 0, 0), sent_done(1, 4, 0, MS, 31 * MS, 0)],
        vec![recv(1 - 1, 4, 0, 30 * MS, 31 * MS, flag::POSTED_HERE)],
    ];
    let (w, j) = run(2, 0, &per_rank, 100 * MS);
    assert_eq!((j.waited_ns[LR], j.instances[LR]), (29 * MS, 1));
    assert_eq!(j.ranks[&1].caused_ns[LR], 29 * MS);
    let wait_fn = observer_common::function_by_name("MPI_Wait").unwrap();
    assert!(j.functions.contains_key(&(wait_fn, Pattern::LateReceiver)));
    assert_eq!(j.unresolved, [0; 5]);
    assert_eq!(w.pending(), 0);
    // Its completion comes after the rest was evaluated (another drain):
    // the message waits for it.
    let mut w = Waits::default();
    let first = vec![vec![issend(1, 4, 0, 0)], per_rank[1].clone()];
    feed(&mut w, 2, 0, &first, 50 * MS);
    assert_eq!(w.figures("j").unwrap().instances[LR], 0);
    assert_eq!(w.pending(), 1);
    feed(&mut w, 2, 0, &[vec![per_rank[0][1]], vec![]], 60 * MS);
    let j = w.figures("j").unwrap();
    assert_eq!((j.waited_ns[LR], j.instances[LR]), (29 * MS, 1));
    assert_eq!(w.pending(), 0);
    // None comes: after 5 s the call is known to have been entered after
    // the receive completed, and waited for nothing.
    let mut w = Waits::default();
    feed(&mut w, 2, 0, &first, 50 * MS);
    w.settle(50 * MS + TIMEOUT_NS);
    let j = w.figures("j").unwrap();
    assert_eq!((j.instances[LR], j.unresolved), (0, [0; 5]));
    assert_eq!(w.pending(), 0);
    // Completed by the Test family: no wait, no instance.
    let per_rank = vec![
        vec![
            issend(1, 4, 0, 0),
            sent_done(1, 4, 0, 40 * MS, 41 * MS, flag::TEST),
        ],
        per_rank[1].clone(),
    ];
    let (w, j) = run(2, 0, &per_rank, 100 * MS);
    assert_eq!((j.instances[LR], j.waited_ns[LR]), (0, 0));
    assert_eq!(w.pending(), 0);
    // A completing call entered after the post waited for nothing.
    let per_rank = vec![
        vec![issend(1, 4, 0, 0), sent_done(1, 4, 0, 35 * MS, 36 * MS, 0)],
        vec![recv(0, 4, 0, 30 * MS, 31 * MS, flag::POSTED_HERE)],
    ];
    let (_, j) = run(2, 0, &per_rank, 100 * MS);
    assert_eq!((j.waited_ns[LR], j.instances[LR]), (0, 1));
}

#[test]
fn a_waitall_of_sends_waits_for_its_latest_receiver_unless_for_a_sender() {
    // Rank 0 posts two MPI_Issends (to ranks 1 and 2) at 0 and one
    // MPI_Irecv from rank 1, then waits in one MPI_Waitall from 1 ms to
    // 41 ms; rank 1 posts its receive at 20 ms, rank 2 at 40 ms.
    let group = |flags| {
        let w = |dest, leave| Plain {
            function: observer_common::function_by_name("MPI_Waitall").unwrap(),
            ..sent_done(dest, 0, 0, MS, leave, flags)
        };
        [w(1, 41 * MS), w(2, 41 * MS)]
    };
    let [a, b] = group(flag::MULTI);
    let end = Plain {
        kind: kind::GROUP_END,
        seq: 2,
        peer: waits::NO_ROOT,
        bytes: 0,
        ..a
    };
    let per_rank = vec![
        vec![issend(1, 0, 0, 0), issend(2, 0, 0, 0), a, b, end],
        vec![recv(0, 0, 0, 20 * MS, 21 * MS, flag::POSTED_HERE)],
        vec![recv(0, 0, 0, 40 * MS, 41 * MS, flag::POSTED_HERE)],
    ];
    let (w, j) = run(3, 0, &per_rank, 10 * TIMEOUT_NS);
    // One instance: 39 ms, for rank 2.
    assert_eq!((j.waited_ns[LR], j.instances[LR]), (39 * MS, 1));
    assert_eq!(j.ranks[&2].caused_ns[LR], 39 * MS);
    assert!(j.ranks.get(&1).is_none_or(|r| r.caused_ns[LR] == 0));
    assert_eq!(w.pending(), 0);
    // The same call also completes a receive whose sender, rank 1, was
    // late (it sent at 30 ms): the call's wait is that Late Sender's.
    let mut with_recv = per_rank.clone();
    with_recv[0].insert(
        4,
        Plain {
            function: observer_common::function_by_name("MPI_Waitall").unwrap(),
            ..recv(1, 9, 0, MS, 41 * MS, flag::MULTI)
        },
    );
    with_recv[1].insert(0, send(0, 9, 0, 30 * MS));
    let (_, j) = run(3, 0, &with_recv, 10 * TIMEOUT_NS);
    // (Ranks 1 and 2's receives are instances too, with no wait.)
    assert_eq!((j.waited_ns[LS], j.instances[LS]), (29 * MS, 3));
    assert_eq!((j.waited_ns[LR], j.instances[LR]), (0, 1));
    // A send of the group whose receive never came: the group counts no
    // Late Receiver, and the message is unresolved.
    let per_rank = vec![per_rank[0].clone(), per_rank[1].clone(), vec![]];
    let mut w = Waits::default();
    feed(&mut w, 3, 0, &per_rank, 0);
    w.settle(TIMEOUT_NS);
    let j = w.figures("j").unwrap();
    assert_eq!(j.instances[LR], 0);
    assert_eq!(j.unresolved[Unresolved::Incomplete as usize], 1);
    assert_eq!(w.pending(), 0);
}

#[test]
fn completions_no_shim_writes_are_refused() {
    let ok = sent_done(1, 0, 0, MS, 2 * MS, 0);
    for bad in [
        Plain {
            flags: flag::MULTI | flag::TEST,
            ..ok
        },
        Plain {
            flags: flag::POSTED_HERE,
            ..ok
        },
        Plain {
            flags: flag::BLOCKING | flag::LATER,
            ..issend(1, 0, 0, 0)
        },
    ] {
        let (_, j) = run(2, 0, &[vec![bad], vec![]], 0);
        assert_eq!(j.records_invalid, 1, "{bad:?}");
    }
    // Twice for one send.
    let per_rank = vec![vec![issend(1, 0, 0, 0), ok, ok], vec![]];
    let (_, j) = run(2, 0, &per_rank, 0);
    assert_eq!(j.records_invalid, 1);
    // A completion of a send never seen is not kept.
    let (w, j) = run(2, 0, &[vec![ok], vec![]], 0);
    assert_eq!((j.records_invalid, w.pending()), (0, 0));
}
