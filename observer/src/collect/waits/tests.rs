//! The matcher's unit tests: collectives, the culprit window, clocks.

use super::*;

fn f(name: &str) -> u16 {
    observer_common::function_by_name(name).unwrap()
}

fn rec(seq: u64, function: &str, root: i32, enter: u64, leave: u64) -> waits::Plain {
    waits::Plain {
        enter,
        leave,
        seq,
        comm: waits::WORLD,
        function: f(function),
        kind: waits::kind::COLL,
        peer: root,
        ..Default::default()
    }
}

const MS: u64 = 1_000_000;

/// Feeds each rank's records of a `size`-rank job, then settles at `now`.
fn run(size: u32, shift: u32, per_rank: &[Vec<waits::Plain>], now: u64) -> Waits {
    let mut w = Waits::default();
    for (rank, recs) in per_rank.iter().enumerate() {
        w.add(
            "j",
            &Drain {
                shift,
                p2p_shift: 0,
                ..Drain::ns(rank as u32, size, recs)
            },
            now,
        );
    }
    w.settle(now);
    w
}

#[test]
fn wait_at_barrier_is_charged_to_the_last_to_arrive() {
    // Rank 3 arrives 100 ms late at 10 barriers; everyone leaves at
    // its arrival + 1 ms.
    let per_rank: Vec<Vec<waits::Plain>> = (0..4)
        .map(|r| {
            (0..10)
                .map(|i| {
                    let t = 1_000 * MS + i * 200 * MS;
                    let enter = if r == 3 { t + 100 * MS } else { t + r * MS };
                    rec(i, "MPI_Barrier", -1, enter, t + 101 * MS)
                })
                .collect()
        })
        .collect();
    let w = run(4, 0, &per_rank, 5_000 * MS);
    let j = w.figures("j").unwrap();
    // Ranks 0, 1, 2 wait 100, 99, 98 ms each time.
    assert_eq!(j.waited_ns, [10 * 297 * MS, 0, 0, 0, 0, 0]);
    assert_eq!(j.instances, [10, 0, 0, 0, 0, 0]);
    assert_eq!(j.unresolved, [0; 5]);
    let (rank, rate) = j.culprit().unwrap();
    assert_eq!(rank, 3);
    // 2.97 s caused over the job's first 10 s (the shortest span).
    assert!((rate - 0.297).abs() < 1e-9, "{rate}");
    assert_eq!(j.culprits.len(), 1);
    // The waiters, the longest first: 1, 0.99, 0.98 s over 10 s.
    let waiters: Vec<(u32, f64)> = j.waiters.clone();
    assert_eq!(waiters.iter().map(|w| w.0).collect::<Vec<_>>(), [0, 1, 2]);
    for ((_, got), want) in waiters.iter().zip([0.1, 0.099, 0.098]) {
        assert!((got - want).abs() < 1e-9, "{got} {want}");
    }
    assert_eq!(w.pending(), 0);
    // The report's figures: since the first record, per rank and per
    // function; rank 3 waited nothing and caused it all.
    let wb = Pattern::WaitBarrier.index();
    let waited: Vec<(u32, u64)> = j.ranks.iter().map(|(r, f)| (*r, f.waited_ns[wb])).collect();
    assert_eq!(
        waited,
        [(0, 1_000 * MS), (1, 990 * MS), (2, 980 * MS), (3, 0)]
    );
    let caused: Vec<(u32, u64)> = j.ranks.iter().map(|(r, f)| (*r, f.caused_ns[wb])).collect();
    assert_eq!(caused, [(0, 0), (1, 0), (2, 0), (3, 2_970 * MS)]);
    let barrier = (f("MPI_Barrier"), Pattern::WaitBarrier);
    assert_eq!(
        j.functions.iter().collect::<Vec<_>>(),
        [(&barrier, &(2_970 * MS))]
    );
    assert_eq!(w.pending_of("j"), 0);
}

#[test]
fn nxn_waits_are_clamped_to_the_leave() {
    // Rank 1 leaves before the last arrives (Scalasca's min(E_max, L)).
    let per_rank = vec![
        vec![rec(0, "MPI_Allreduce", -1, 0, 50 * MS)],
        vec![rec(0, "MPI_Allreduce", -1, 10 * MS, 20 * MS)],
        vec![rec(0, "MPI_Allreduce", -1, 30 * MS, 50 * MS)],
    ];
    let j = run(3, 0, &per_rank, 1_000 * MS);
    let j = j.figures("j").unwrap();
    assert_eq!(j.waited_ns[Pattern::WaitNxn.index()], 30 * MS + 10 * MS);
    assert_eq!(j.culprit().map(|c| c.0), Some(2));
}

#[test]
fn rooted_patterns_name_the_root_or_the_latest_sender() {
    // Bcast from a late root 0; Reduce to an early root 0, rank 2 late.
    let per_rank = vec![
        vec![
            rec(0, "MPI_Bcast", 0, 100 * MS, 101 * MS),
            rec(1, "MPI_Reduce", 0, 200 * MS, 280 * MS),
        ],
        vec![
            rec(0, "MPI_Bcast", 0, 0, 102 * MS),
            rec(1, "MPI_Reduce", 0, 210 * MS, 211 * MS),
        ],
        vec![
            rec(0, "MPI_Bcast", 0, 40 * MS, 103 * MS),
            rec(1, "MPI_Reduce", 0, 270 * MS, 271 * MS),
        ],
    ];
    let w = run(3, 0, &per_rank, 1_000 * MS);
    let j = w.figures("j").unwrap();
    assert_eq!(
        j.waited_ns[Pattern::LateBroadcast.index()],
        100 * MS + 60 * MS
    );
    // Only the root waits in a reduce: for rank 2, 70 ms.
    assert_eq!(j.waited_ns[Pattern::EarlyReduce.index()], 70 * MS);
    assert_eq!(j.instances, [0, 0, 1, 1, 0, 0]);
    // Rank 0 caused 160 ms, rank 2 70 ms.
    assert_eq!(j.culprit().map(|c| c.0), Some(0));
}

#[test]
fn an_instance_without_all_its_members_is_never_a_wait() {
    // A 4-rank job with 3 ranks here: nothing evaluated before the
    // timeout, then counted unresolved.
    let per_rank: Vec<Vec<waits::Plain>> = (0..3)
        .map(|r| vec![rec(0, "MPI_Barrier", -1, r * MS, 10 * MS)])
        .collect();
    let mut w = run(4, 0, &per_rank, 1_000 * MS);
    assert_eq!(w.pending(), 1);
    assert_eq!(w.figures("j").unwrap().unresolved, [0; 5]);
    w.settle(1_000 * MS + TIMEOUT_NS);
    let j = w.figures("j").unwrap();
    assert_eq!(j.unresolved, [1, 0, 0, 0, 0]);
    assert_eq!((j.waited_ns, j.culprit()), ([0; PATTERNS], None));
}

#[test]
fn disagreeing_and_invalid_records_are_counted_not_matched() {
    let per_rank = vec![
        vec![
            rec(0, "MPI_Barrier", -1, 0, 1),
            rec(1, "MPI_Bcast", 0, 0, 1),
            // Not a collective, a root beyond the job, time backwards,
            // another communicator, and a second record of seq 0.
            rec(2, "MPI_Send", -1, 0, 1),
            rec(3, "MPI_Bcast", 9, 0, 1),
            rec(4, "MPI_Barrier", -1, 5, 1),
            waits::Plain {
                comm: 7,
                ..rec(5, "MPI_Barrier", -1, 0, 1)
            },
            rec(0, "MPI_Barrier", -1, 0, 1),
        ],
        vec![
            rec(0, "MPI_Allreduce", -1, 0, 1),
            rec(1, "MPI_Bcast", 1, 0, 1),
        ],
    ];
    let w = run(2, 0, &per_rank, 0);
    let j = w.figures("j").unwrap();
    assert_eq!(j.unresolved, [0, 2, 0, 0, 0]);
    assert_eq!(j.records_invalid, 5);
    // A collective without a pattern is matched and not counted; a
    // rooted one without a root is a mismatch.
    let per_rank = vec![
        vec![rec(0, "MPI_Scan", -1, 0, 9), rec(1, "MPI_Bcast", -1, 0, 1)],
        vec![rec(0, "MPI_Scan", -1, 5, 9), rec(1, "MPI_Bcast", -1, 0, 1)],
    ];
    let w = run(2, 0, &per_rank, 0);
    let j = w.figures("j").unwrap();
    assert_eq!((j.unresolved, j.records_invalid), ([0, 1, 0, 0, 0], 0));
    assert_eq!((j.waited_ns, j.instances), ([0; PATTERNS], [0; PATTERNS]));
    assert_eq!(w.pending(), 0);
    // A rank beyond the job's size: its records are not matched.
    let mut w = Waits::default();
    w.add(
        "j",
        &Drain {
            rank: 5,
            world_size: 2,
            shift: 0,
            clock: waits::clock::NS,
            ns_per_tick: 0,
            records: &[rec(0, "MPI_Barrier", -1, 0, 1)],
            lost: 3,
            p2p_shift: 0,
            skipped: 0,
        },
        0,
    );
    let j = w.figures("j").unwrap();
    assert_eq!((j.records_invalid, j.records_lost), (1, 3));
}

#[test]
fn sampled_waits_are_scaled_and_pending_instances_bounded() {
    let per_rank = vec![
        vec![rec(0, "MPI_Barrier", -1, 0, 10)],
        vec![rec(0, "MPI_Barrier", -1, 10, 10)],
    ];
    let w = run(2, 3, &per_rank, 0);
    let j = w.figures("j").unwrap();
    assert_eq!((j.waited_ns[0], j.sample_period), (80, 8));
    // A job that never completes an instance holds MAX_PENDING at most.
    let mut w = Waits::default();
    let recs: Vec<waits::Plain> = (0..MAX_PENDING as u64 + 10)
        .map(|s| rec(s, "MPI_Barrier", -1, 0, 1))
        .collect();
    w.add(
        "j",
        &Drain {
            p2p_shift: 0,
            ..Drain::ns(0, 2, &recs)
        },
        0,
    );
    assert_eq!(w.pending(), MAX_PENDING);
    assert_eq!(w.figures("j").unwrap().unresolved, [0, 0, 10, 0, 0]);
    w.retain(|_| false);
    assert_eq!(w.pending(), 0);
    assert!(w.figures("j").is_none());
}

#[test]
fn counter_ticks_are_scaled_by_the_rate_the_rings_give() {
    let drain = |rank, clock, ns_per_tick, records: &[waits::Plain]| {
        let records = records.to_vec();
        move |w: &mut Waits, now| {
            w.add(
                "j",
                &Drain {
                    rank,
                    world_size: 2,
                    shift: 0,
                    clock,
                    ns_per_tick,
                    records: &records,
                    lost: 0,
                    p2p_shift: 0,
                    skipped: 0,
                },
                now,
            )
        }
    };
    let ticks = waits::clock::TICKS;
    // Rank 1 is 1,000 ticks late; no rate yet: the instance waits.
    let mut w = Waits::default();
    drain(0, ticks, 0, &[rec(0, "MPI_Barrier", -1, 5_000, 6_100)])(&mut w, 0);
    drain(1, ticks, 0, &[rec(0, "MPI_Barrier", -1, 6_000, 6_100)])(&mut w, 0);
    w.settle(0);
    assert_eq!(w.pending(), 1);
    // The rate comes (2 ns a tick): 1,000 ticks are 2 µs.
    drain(1, ticks, 2 << 32, &[])(&mut w, 1);
    w.settle(1);
    let j = w.figures("j").unwrap();
    assert_eq!((j.waited_ns[0], j.instances[0]), (2_000, 1));
    // Never given: unresolved at the timeout, as a clock problem.
    let mut w = Waits::default();
    drain(0, ticks, 0, &[rec(0, "MPI_Barrier", -1, 0, 1)])(&mut w, 0);
    drain(1, ticks, 0, &[rec(0, "MPI_Barrier", -1, 0, 1)])(&mut w, 0);
    w.settle(TIMEOUT_NS);
    assert_eq!(w.figures("j").unwrap().unresolved, [0, 0, 0, 1, 0]);
    // Two clocks in one instance: never compared.
    let mut w = Waits::default();
    drain(0, ticks, 1 << 32, &[rec(0, "MPI_Barrier", -1, 0, 1)])(&mut w, 0);
    let ns = waits::clock::NS;
    drain(1, ns, 0, &[rec(0, "MPI_Barrier", -1, 0, 1)])(&mut w, 0);
    w.settle(0);
    let j = w.figures("j").unwrap();
    assert_eq!(
        (j.unresolved, j.instances),
        ([0, 0, 0, 1, 0], [0; PATTERNS])
    );
    // A clock no shim writes: the record is invalid.
    let mut w = Waits::default();
    drain(0, 9, 0, &[rec(0, "MPI_Barrier", -1, 0, 1)])(&mut w, 0);
    assert_eq!(w.figures("j").unwrap().records_invalid, 1);
}

#[test]
fn only_the_top_k_culprits_and_waiters_are_named() {
    // Five ranks, each late in turn by its rank's ms at one barrier,
    // 100 ms apart.
    let per_rank: Vec<Vec<waits::Plain>> = (0..5u64)
        .map(|r| {
            (0..5u64)
                .map(|late| {
                    let t = late * 100 * MS;
                    let enter = if r == late { t + late * MS } else { t };
                    rec(late, "MPI_Barrier", -1, enter, t + 10 * MS)
                })
                .collect()
        })
        .collect();
    let w = run(5, 0, &per_rank, 1_000 * MS);
    let j = w.figures("j").unwrap();
    let ranks = |v: &[(u32, f64)]| v.iter().map(|c| c.0).collect::<Vec<_>>();
    // Rank 4 made four ranks wait 4 ms; rank 0 made nobody wait.
    assert_eq!(ranks(&j.culprits), [4, 3, 2]);
    // Everyone waited for the others' lateness but its own: rank 0 the
    // most (1+2+3+4 ms), rank 4 the least.
    assert_eq!(ranks(&j.waiters), [0, 1, 2]);
    assert_eq!(TOP_K, 3);
}

#[test]
fn the_culprit_window_forgets_what_is_older_than_a_minute() {
    let mut w = Waits::default();
    let barrier = |seq, late: u64| {
        [
            vec![rec(seq, "MPI_Barrier", -1, 0, late)],
            vec![rec(seq, "MPI_Barrier", -1, late, late)],
        ]
    };
    let feed = |w: &mut Waits, per: [Vec<waits::Plain>; 2], now| {
        for (rank, recs) in per.iter().enumerate() {
            w.add(
                "j",
                &Drain {
                    p2p_shift: 0,
                    ..Drain::ns(rank as u32, 2, recs)
                },
                now,
            );
        }
        w.settle(now);
    };
    feed(&mut w, barrier(0, 10 * MS), 0);
    assert_eq!(w.figures("j").unwrap().culprit().map(|c| c.0), Some(1));
    // Rank 0 late, much later: rank 1's old wait has left the window.
    let t = 2 * WINDOW_NS;
    let late = [
        vec![rec(1, "MPI_Barrier", -1, t + MS, t + MS)],
        vec![rec(1, "MPI_Barrier", -1, t, t + MS)],
    ];
    feed(&mut w, late, 2 * WINDOW_NS);
    let (rank, rate) = w.figures("j").unwrap().culprit().unwrap();
    assert_eq!(rank, 0);
    assert!((rate - MS as f64 / WINDOW_NS as f64).abs() < 1e-12);
}

/// A record of instance `seq` of a collective on the communicator the
/// shim named `comm`, of `size` members.
fn on(comm: u64, size: i32, r: waits::Plain) -> waits::Plain {
    waits::Plain {
        comm,
        tag: size,
        seq: r.seq,
        ..r
    }
}

#[test]
fn other_communicators_are_matched_by_their_id_and_size() {
    // A 4-rank job split into halves {0, 2} and {1, 3} (ids 0xA1 and 0xB1):
    // both halves number their barriers from 0. Rank 3 comes 100 ms late
    // to its half's; rank 1 alone waits for it. A 2-member instance is
    // whole with 2 records, though the job has 4 ranks.
    let half = |r: u64| if r.is_multiple_of(2) { 0xA1 } else { 0xB1 };
    let per_rank: Vec<Vec<waits::Plain>> = (0..4u64)
        .map(|r| {
            (0..5)
                .map(|i| {
                    let t = 1_000 * MS + i * 200 * MS;
                    let enter = if r == 3 { t + 100 * MS } else { t };
                    let leave = if r % 2 == 1 { t + 101 * MS } else { t + MS };
                    on(half(r), 2, rec(i, "MPI_Barrier", -1, enter, leave))
                })
                .collect()
        })
        .collect();
    let w = run(4, 0, &per_rank, 5_000 * MS);
    let j = w.figures("j").unwrap();
    assert_eq!(j.instances, [10, 0, 0, 0, 0, 0]);
    assert_eq!(j.waited_ns, [5 * 100 * MS, 0, 0, 0, 0, 0]);
    assert_eq!(j.unresolved, [0; 5]);
    assert_eq!(j.culprit().unwrap().0, 3);
    assert_eq!(w.pending(), 0);
    assert_eq!(j.records_invalid, 0);

    // A Bcast on a communicator whose rank 0 is world rank 2: the root is
    // named as a world rank.
    let per_rank = vec![
        vec![],
        vec![on(0xC1, 2, rec(0, "MPI_Bcast", 2, 0, 60 * MS))],
        vec![on(0xC1, 2, rec(0, "MPI_Bcast", 2, 50 * MS, 51 * MS))],
    ];
    let w = run(3, 0, &per_rank, 5_000 * MS);
    let j = w.figures("j").unwrap();
    let lb = Pattern::LateBroadcast.index();
    assert_eq!(j.instances[lb], 1);
    assert_eq!(j.waited_ns[lb], 50 * MS);
    assert_eq!(j.culprit().unwrap().0, 2);

    // Members that disagree on the size, a size larger than the job's
    // or not positive: a mismatch, and invalid records.
    let per_rank = vec![
        vec![
            on(0xD1, 2, rec(0, "MPI_Barrier", -1, 0, MS)),
            on(0xE1, 5, rec(0, "MPI_Barrier", -1, 0, MS)),
            on(0xE1, 0, rec(1, "MPI_Barrier", -1, 0, MS)),
        ],
        vec![on(0xD1, 3, rec(0, "MPI_Barrier", -1, 0, MS))],
        vec![],
    ];
    let w = run(3, 0, &per_rank, 5_000 * MS);
    let j = w.figures("j").unwrap();
    assert_eq!(j.unresolved[Unresolved::Mismatch as usize], 1);
    assert_eq!(j.records_invalid, 2);
    // Three members of an instance of a 2-member communicator (two
    // communicators named alike): a mismatch, never a wait.
    let per_rank: Vec<Vec<waits::Plain>> = (0..3)
        .map(|r| vec![on(0xF1, 2, rec(0, "MPI_Barrier", -1, r * 10 * MS, 30 * MS))])
        .collect();
    let mut w = Waits::default();
    for (rank, recs) in per_rank.iter().enumerate() {
        w.add("j", &Drain::ns(rank as u32, 3, recs), 0);
    }
    w.settle(5_000 * MS);
    let j = w.figures("j").unwrap();
    assert_eq!(j.unresolved[Unresolved::Mismatch as usize], 1);
    assert_eq!(j.instances, [0; 6]);
    assert_eq!(j.instances, [0; 6]);

    // Messages: the same envelope and number on two communicators are
    // two messages. Rank 0 sends at 10 ms on 0xA1 and at 90 ms on 0xB1;
    // rank 1's blocking receives of each were entered at 0: it waited 10
    // ms for one and 90 for the other.
    let msg = |kind, comm, peer, enter, leave, flags| waits::Plain {
        kind,
        comm,
        peer,
        enter,
        leave,
        flags,
        tag: 7,
        bytes: 8,
        function: if kind == waits::kind::SEND {
            f("MPI_Send")
        } else {
            f("MPI_Recv")
        },
        ..Default::default()
    };
    let (send, recv, here) = (
        waits::kind::SEND,
        waits::kind::RECV,
        waits::flag::POSTED_HERE,
    );
    let per_rank = vec![
        vec![
            msg(send, 0xA1, 1, 10 * MS, 10 * MS, 0),
            msg(send, 0xB1, 1, 90 * MS, 90 * MS, 0),
        ],
        vec![
            msg(recv, 0xB1, 0, 0, 91 * MS, here),
            msg(recv, 0xA1, 0, 0, 11 * MS, here),
        ],
    ];
    let w = run(2, 0, &per_rank, 5_000 * MS);
    let j = w.figures("j").unwrap();
    let ls = Pattern::LateSender.index();
    assert_eq!(j.instances[ls], 2);
    assert_eq!(j.waited_ns[ls], 100 * MS);
    assert_eq!(j.unresolved, [0; 5]);
    assert_eq!(j.records_invalid, 0);
}
