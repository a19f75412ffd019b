//! The matcher across nodes: records of ranks whose daemon is another
//! node's, on that node's clock, offset from this one's by an amount the
//! matcher is never told.

use observer_common::waits::{self, Plain, flag, kind};

use super::{Drain, Pattern, Unresolved, Waits};

const MS: u64 = 1_000_000;
const US: u64 = 1_000;
/// Where the job's time starts (true time).
const T0: u64 = 1_000 * MS;
/// The other node's clock runs this far ahead of ours.
const AHEAD: u64 = 5 * MS;
/// Ranks 0 and 1 are on node "a", 2 and 3 on node "b".
const SIZE: u32 = 4;

fn f(name: &str) -> u16 {
    observer_common::function_by_name(name).unwrap()
}

fn coll(seq: u64, function: &str, root: i32, enter: u64, leave: u64) -> Plain {
    Plain {
        enter,
        leave,
        seq,
        comm: waits::WORLD,
        function: f(function),
        kind: kind::COLL,
        peer: root,
        ..Default::default()
    }
}

fn msg(kind: u8, peer: i32, enter: u64, leave: u64, flags: u8) -> Plain {
    Plain {
        enter,
        leave,
        seq: 0,
        comm: waits::WORLD,
        function: f(if kind == waits::kind::SEND {
            "MPI_Ssend"
        } else {
            "MPI_Recv"
        }),
        kind,
        flags,
        peer,
        tag: 7,
        thread: 1,
        bytes: 8,
    }
}

/// Every rank's records in true time; `sync` adds the barrier that starts
/// every round of the planted programs (entered 100 µs apart, left
/// together at 500 µs).
fn job(sync: bool) -> Vec<Vec<Plain>> {
    (0..SIZE as u64)
        .map(|r| {
            if sync {
                vec![coll(0, "MPI_Barrier", -1, T0 + r * 100 * US, T0 + 500 * US)]
            } else {
                Vec::new()
            }
        })
        .collect()
}

/// This daemon's view, when it is node `here` ("a" or "b"): its ranks'
/// records as drained, the other node's as shipped, on the other node's
/// clock (b's is [`AHEAD`] of a's).
fn view(here: &str, per_rank: &[Vec<Plain>], now: u64) -> Waits {
    let mut w = Waits::default();
    for (rank, recs) in per_rank.iter().enumerate() {
        let rank = rank as u32;
        let node = if rank < 2 { "a" } else { "b" };
        let shift =
            |t: u64| if node == "b" { t + AHEAD } else { t } - if here == "b" { AHEAD } else { 0 };
        let recs: Vec<Plain> = recs
            .iter()
            .map(|r| Plain {
                enter: shift(r.enter),
                leave: shift(r.leave),
                ..*r
            })
            .collect();
        let d = Drain {
            p2p_shift: 1,
            ..Drain::ns(rank, SIZE, &recs)
        };
        if node == here {
            w.add("j", &d, now);
        } else {
            w.add_remote("j", &format!("http://{node}:9479"), &d, now);
        }
    }
    w.settle(now);
    w
}

const NOW: u64 = 10_000 * MS;

#[test]
fn a_barrier_across_nodes_needs_no_clock_and_bounds_the_offset() {
    // Rank 3 (node b) comes 100 ms late to 10 barriers after the sync.
    let mut per_rank = job(true);
    for i in 1..=10u64 {
        let t = T0 + i * 200 * MS;
        for (r, recs) in per_rank.iter_mut().enumerate() {
            let enter = if r == 3 { t + 100 * MS } else { t };
            recs.push(coll(i, "MPI_Barrier", -1, enter, t + 100 * MS + 200 * US));
        }
    }
    let a = view("a", &per_rank, NOW);
    let j = a.figures("j").unwrap();
    // Ranks 0 and 1 each waited 100 ms a barrier, and 300 and 200 µs at
    // the sync (own duration less rank 3's, the shortest).
    assert_eq!(j.waited_ns[0], 2 * 1_000 * MS + 500 * US);
    assert_eq!(j.instances[0], 11);
    assert_eq!(j.unresolved, [0; 5]);
    assert_eq!(j.culprit().map(|c| c.0), Some(3));
    // The sync bounds b's offset to [-AHEAD - 400 µs, -AHEAD + 200 µs].
    assert_eq!(j.clock_uncertainty_ns, Some(300_000.0));
    assert_eq!(a.pending(), 0);
    // Node b's daemon counts rank 2's waits (rank 3 waited none), and
    // not the instances: rank 0's node does.
    let b = view("b", &per_rank, NOW);
    let j = b.figures("j").unwrap();
    assert_eq!(j.waited_ns[0], 1_000 * MS + 100 * US);
    assert_eq!((j.instances[0], j.unresolved), (0, [0; 5]));
    assert_eq!(j.culprit().map(|c| c.0), Some(3));
    let ranks: Vec<u32> = j.ranks.keys().copied().collect();
    assert_eq!(ranks, [2, 3]);
}

#[test]
fn rooted_collectives_across_nodes_use_the_bounded_offset() {
    let mut per_rank = job(true);
    // A Bcast from rank 2 (node b), 100 ms late; a Reduce to rank 0 for
    // which rank 3 (node b) is 100 ms late.
    let t = T0 + 200 * MS;
    let u = T0 + 400 * MS;
    for (r, recs) in per_rank.iter_mut().enumerate() {
        let bcast = if r == 2 { t + 100 * MS } else { t };
        recs.push(coll(1, "MPI_Bcast", 2, bcast, t + 100 * MS + 200 * US));
        let reduce = if r == 3 { u + 100 * MS } else { u };
        let left = if r == 0 {
            u + 100 * MS + 200 * US
        } else {
            reduce + 10 * US
        };
        recs.push(coll(2, "MPI_Reduce", 0, reduce, left));
    }
    let a = view("a", &per_rank, NOW);
    let j = a.figures("j").unwrap();
    let u = j.clock_uncertainty_ns.unwrap() as u64;
    assert_eq!(u, 300 * US);
    // Each of ranks 0 and 1 waited 100 ms for the root, within the
    // uncertainty; rank 0 100 ms for rank 3.
    let bcast = j.waited_ns[Pattern::LateBroadcast as usize];
    assert!(bcast.abs_diff(200 * MS) <= 2 * u, "{bcast}");
    let reduce = j.waited_ns[Pattern::EarlyReduce as usize];
    assert!(reduce.abs_diff(100 * MS) <= u, "{reduce}");
    assert_eq!(j.unresolved, [0; 5]);
    let late = |r: u32, p: Pattern| j.ranks.get(&r).map_or(0, |f| f.late_ns[p as usize]);
    assert_eq!(late(2, Pattern::LateBroadcast), bcast);
    assert_eq!(late(3, Pattern::EarlyReduce), reduce);
}

#[test]
fn without_a_bound_rooted_waits_are_unresolved_not_guessed() {
    // No sync barrier: nothing bounds b's offset.
    let mut per_rank = job(false);
    for (r, recs) in per_rank.iter_mut().enumerate() {
        let enter = if r == 2 { T0 + 100 * MS } else { T0 };
        recs.push(coll(0, "MPI_Bcast", 2, enter, T0 + 100 * MS + 200 * US));
    }
    let a = view("a", &per_rank, NOW);
    let j = a.figures("j").unwrap();
    assert_eq!(j.clock_uncertainty_ns, Some(f64::INFINITY));
    // Two waiting ranks here, neither said; the instance was evaluated.
    assert_eq!(j.unresolved[Unresolved::Clock as usize], 2);
    assert_eq!(j.waited_ns, [0; 6]);
    assert_eq!(j.instances[Pattern::LateBroadcast as usize], 1);
}

#[test]
fn messages_across_nodes_say_only_the_waits_the_clocks_can_tell() {
    let mut per_rank = job(true);
    let t = T0 + 200 * MS;
    // Rank 2 (b) sends 50 ms late to rank 0 (a): a Late Sender.
    per_rank[2].push(msg(kind::SEND, 0, t + 50 * MS, t + 50 * MS, 0));
    per_rank[0].push(msg(
        kind::RECV,
        2,
        t,
        t + 50 * MS + 100 * US,
        flag::POSTED_HERE,
    ));
    // Rank 3 (b) sends to rank 1 (a) 100 µs after rank 1 began to wait:
    // within the uncertainty, not said.
    per_rank[3].push(msg(kind::SEND, 1, t + 100 * US, t + 100 * US, 0));
    per_rank[1].push(msg(kind::RECV, 3, t, t + 150 * US, flag::POSTED_HERE));
    // Rank 0 (a) MPI_Ssends to rank 3 (b), which receives 80 ms later: a
    // Late Receiver, counted on a.
    // It leaves 20 µs after the post, well within the uncertainty: an
    // MPI_Ssend surely waited for its receive's post.
    let v = t + 100 * MS;
    per_rank[0].push(msg(kind::SEND, 3, v, v + 80 * MS + 20 * US, flag::BLOCKING));
    per_rank[3].push(msg(
        kind::RECV,
        0,
        v + 80 * MS,
        v + 80 * MS + 50 * US,
        flag::POSTED_HERE,
    ));
    // The same as a standard-mode MPI_Send (tag 8), which may have left
    // before the post (eagerly): unresolved.
    per_rank[0].push(Plain {
        function: f("MPI_Send"),
        tag: 8,
        ..msg(kind::SEND, 3, v, v + 80 * MS + 20 * US, flag::BLOCKING)
    });
    per_rank[3].push(Plain {
        tag: 8,
        ..msg(
            kind::RECV,
            0,
            v + 80 * MS,
            v + 80 * MS + 50 * US,
            flag::POSTED_HERE,
        )
    });
    // A message between b's ranks: b's alone.
    per_rank[2].push(msg(kind::SEND, 3, t, t, 0));
    per_rank[3].push(msg(kind::RECV, 2, t, t + MS, flag::POSTED_HERE));
    let a = view("a", &per_rank, NOW);
    let j = a.figures("j").unwrap();
    let u = j.clock_uncertainty_ns.unwrap() as u64;
    assert!(u <= 300 * US, "{u}");
    let ls = j.waited_ns[Pattern::LateSender as usize];
    assert!(ls.abs_diff(50 * MS) <= u, "{ls}");
    // Rank 1's receive is unresolved, not an instance.
    assert_eq!(j.instances[Pattern::LateSender as usize], 1);
    let lr = j.waited_ns[Pattern::LateReceiver as usize];
    assert!(lr.abs_diff(80 * MS) <= u, "{lr}");
    assert_eq!(j.instances[Pattern::LateReceiver as usize], 1);
    assert_eq!(j.unresolved, [0, 0, 0, 2, 0]);
    assert_eq!(a.pending(), 0);
    // b's daemon: no wait of its ranks (rank 3 received after the send
    // began), the Late Receiver is a's; the message between its ranks
    // waited 0.
    let b = view("b", &per_rank, NOW);
    let j = b.figures("j").unwrap();
    assert_eq!(j.waited_ns[Pattern::LateReceiver as usize], 0);
    assert_eq!(j.instances[Pattern::LateReceiver as usize], 0);
    assert_eq!(j.instances[Pattern::LateSender as usize], 3);
    assert_eq!(j.unresolved, [0; 5]);
}

#[test]
fn a_peer_cannot_claim_this_nodes_ranks_or_another_peers() {
    let mut w = Waits::default();
    let recs = [coll(0, "MPI_Barrier", -1, 0, 1)];
    w.add("j", &Drain::ns(0, 2, &recs), 0);
    w.add_remote("j", "http://b:9479", &Drain::ns(0, 2, &recs), 0);
    w.add_remote("j", "http://b:9479", &Drain::ns(1, 2, &recs), 0);
    w.add_remote("j", "http://c:9479", &Drain::ns(1, 2, &recs), 0);
    w.settle(0);
    let j = w.figures("j").unwrap();
    assert_eq!(j.records_invalid, 2);
    assert_eq!(j.instances[0], 1);
}

#[test]
fn a_waitall_across_nodes_is_said_when_its_latest_sender_is_known() {
    let mut per_rank = job(true);
    let t = T0 + 200 * MS;
    // Rank 0 (a) waits in one MPI_Waitall for ranks 1 (a), 2 and 3 (b):
    // rank 2 sends 100 µs after the Waitall began (within the clocks'
    // uncertainty), rank 3 60 ms late; the call ends after rank 3's.
    let end = t + 60 * MS + 100 * US;
    for (src, at) in [(1u32, t), (2, t + 100 * US), (3, t + 60 * MS)] {
        per_rank[src as usize].push(msg(kind::SEND, 0, at, at, 0));
        per_rank[0].push(msg(kind::RECV, src as i32, t, end, flag::MULTI));
    }
    per_rank[0].push(Plain {
        kind: kind::GROUP_END,
        ..msg(kind::GROUP_END, 0, t, end, 0)
    });
    let a = view("a", &per_rank, NOW);
    let j = a.figures("j").unwrap();
    let u = j.clock_uncertainty_ns.unwrap() as u64;
    // Rank 2's wait, unclear, may have been 100 + u µs at most: rank 3's
    // 60 ms is the group's.
    let ls = j.waited_ns[Pattern::LateSender as usize];
    assert!(ls.abs_diff(60 * MS) <= u, "{ls}");
    assert_eq!(j.instances[Pattern::LateSender as usize], 1);
    assert_eq!(j.unresolved, [0; 5]);
    assert_eq!(j.culprit().map(|c| c.0), Some(3));
}
