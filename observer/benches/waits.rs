//! The wait-state matcher's CPU at 128 ranks a node (issue 37):
//! `cargo bench -p mpi-observer --bench waits`; `cargo xtask bench waits`
//! runs it and writes the report (xtask/src/bench_waits.rs).
//!
//! The matcher is pure, so no MPI is needed: each scenario makes the
//! records the shim would write (observer-common's `waits::Plain`, as
//! shim/src/stats/waits.rs fills them) for a simulated job, and feeds them
//! as the daemon does (export/registry/waits.rs): every 250 ms, each rank's
//! records since its last drain through [`Waits::add`], then
//! [`Waits::settle`]. Only those calls are timed (this thread's CPU time);
//! making the records is not.
//!
//! - `coll`: every rank records every blocking collective on
//!   `MPI_COMM_WORLD` (`MPI_OBSERVER_WAITS=1`, the default): per 8
//!   instances, 5 `MPI_Allreduce`, an `MPI_Bcast` and an `MPI_Reduce` from
//!   rank 0, an `MPI_Barrier`; the ranks enter up to 3 µs apart and one rank
//!   (another each time) 5 µs late, so every instance is evaluated and its
//!   waits charged.
//! - `p2p`: a halo exchange on a periodic 16-column grid, each rank sending
//!   to and receiving from its 4 neighbours once an iteration, one message
//!   in 8 recorded per envelope (`MPI_OBSERVER_WAITS_P2P=8`, the default):
//!   left and right by `MPI_Irecv` + `MPI_Isend` + `MPI_Waitall` (post
//!   records, sends flagged LATER and their SENT records from the
//!   Waitall, receives flagged MULTI, a group end), up and down by a
//!   blocking `MPI_Send` and an `MPI_Recv` (POSTED_HERE), so Late Sender,
//!   Late Receiver and the groups all run. The same jitter and late rank.
//!   At 1 k messages a second per rank besides the 10 k and 100 k asked
//!   for: a job's messages pending between two settles are bounded
//!   (`MAX_PENDING`), and 1 k stays under it at 128 ranks.
//! - `...x3`: the same job on 3 nodes of 128 ranks: this node's ranks
//!   drained here, the 256 of 2 peers fed through [`Waits::add_remote`] as
//!   the peer thread does (every 500 ms, the peers' two 250 ms drains up to
//!   250 ms ago), their times on their own clocks (offset by +3.7 and
//!   −12.1 ms). This node's records are then in `CLOCK_MONOTONIC` ns (the
//!   daemon converts them before the matcher, untimed here); on one node
//!   they are the counter's ticks.
//!
//! Ranks are drained one after the other, 4 µs apart, so an instance can
//! straddle two drains as it does in the daemon. Scenarios run round-robin
//! `BENCH_WAITS_REPS` times (7); each run simulates `BENCH_WAITS_SECONDS`
//! (4) seconds of the job. Prints one `run ...` line of `key=value` words
//! per run, which `cargo xtask bench waits` reads; `BENCH_WAITS_ONLY=A,B`
//! runs only the scenarios named (`coll-1k`, `p2p-10kx3`...).

use std::time::Instant;

use mpi_observer::collect::waits::{Drain, MAX_PENDING, Pattern, Unresolved, Waits};
use observer_common::{
    function_by_name,
    waits::{self, Plain, flag, kind},
};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
/// The daemon's drain period.
const TICK: u64 = 250 * MS;
/// The peers' records come every this many ticks (daemon/peers.rs: 500 ms).
const REMOTE_EVERY: u64 = 2;
/// Where the job's time starts, on this node's clock.
const T0: u64 = 1_000 * S;
/// Ranks on each node.
const PER_NODE: u32 = 128;
/// The grid's columns (the halo exchange).
const COLS: u32 = 16;
/// One drain reads rank r this long after rank 0.
const DRAIN_STEP: u64 = 4 * US;
/// The peers' clocks' offsets to this node's, in ns (node 0 is this one).
const OFFSETS: [i64; 3] = [0, 3_700_000, -12_100_000];
/// The peers' names.
const PEERS: [&str; 3] = ["", "http://node-a:9479", "http://node-b:9479"];
/// 32.32 ns per tick of a 2 GHz counter.
const NS_PER_TICK: u64 = 1 << 31;
/// A thread number, as the shim derives it from its thread block.
const THREAD: u32 = 0x2a_5e10;
/// `MPI_OBSERVER_WAITS_P2P=8`: the ring's `p2p_shift` (log2 8, plus one).
const P2P_SHIFT: u64 = 4;
/// One message in this many is recorded.
const P2P_PERIOD: u64 = 8;
/// A halo message's bytes.
const HALO_BYTES: u64 = 8_192;
/// How late the late rank is.
const LATE: u64 = 5 * US;
/// The job's label set.
const JOB: &str = "{jobid=\"bench\"}";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Coll,
    P2p,
}

/// One simulated job.
#[derive(Clone, Copy)]
struct Scenario {
    kind: Kind,
    /// Collectives, or messages sent, per second per rank.
    rate: u64,
    /// Nodes of 128 ranks; node 0 is this daemon's.
    nodes: u32,
}

impl Scenario {
    fn name(&self) -> String {
        let k = match self.kind {
            Kind::Coll => "coll",
            Kind::P2p => "p2p",
        };
        let rate = if self.rate >= 1_000 {
            format!("{}k", self.rate / 1_000)
        } else {
            self.rate.to_string()
        };
        let nodes = if self.nodes > 1 {
            format!("x{}", self.nodes)
        } else {
            String::new()
        };
        format!("{k}-{rate}{nodes}")
    }

    fn size(&self) -> u32 {
        PER_NODE * self.nodes
    }

    /// One iteration (an instance, or a round of the halo exchange) in ns.
    fn period(&self) -> u64 {
        match self.kind {
            Kind::Coll => S / self.rate,
            // 4 messages a round.
            Kind::P2p => 4 * S / self.rate,
        }
    }

    /// Whether this node's records are the counter's ticks: on one node
    /// the daemon matches them so; a job across nodes is converted to ns.
    fn ticks(&self) -> bool {
        self.nodes == 1
    }

    /// Time `t` (this node's ns) on the clock of rank `rank`'s records.
    fn clock(&self, rank: u32, t: u64) -> u64 {
        let node = (rank / PER_NODE) as usize;
        if self.ticks() {
            t * 2
        } else {
            t.wrapping_add_signed(OFFSETS[node])
        }
    }

    /// Each rank's records whose push (this node's ns) falls in its drain
    /// `[from, to)` (each rank's drain later by [`DRAIN_STEP`] a rank), for
    /// `ranks`, on their own clocks.
    fn records(&self, ranks: std::ops::Range<u32>, from: u64, to: u64) -> Vec<Vec<Plain>> {
        let mut out: Vec<Vec<Plain>> = ranks.clone().map(|_| Vec::new()).collect();
        let p = self.period();
        // Every record of iteration i is pushed within 50 µs of its start.
        let first = from.saturating_sub(T0 + 50 * US) / p;
        let last = to.saturating_sub(T0) + u64::from(PER_NODE) * DRAIN_STEP;
        let last = last / p + 1;
        let mut pushed: Vec<(u64, Plain)> = Vec::new();
        for i in first..=last {
            if self.kind == Kind::P2p && i % P2P_PERIOD != 0 {
                continue;
            }
            let times = Times::new(self, i);
            for r in ranks.clone() {
                let cut = u64::from(r % PER_NODE) * DRAIN_STEP;
                pushed.clear();
                match self.kind {
                    Kind::Coll => times.coll(i, r, &mut pushed),
                    Kind::P2p => times.halo(i, r, &mut pushed),
                }
                let v = &mut out[(r - ranks.start) as usize];
                for &(at, rec) in &pushed {
                    if at >= from + cut && at < to + cut {
                        v.push(Plain {
                            enter: self.clock(r, rec.enter),
                            leave: self.clock(r, rec.leave),
                            ..rec
                        });
                    }
                }
            }
        }
        out
    }
}

/// A deterministic hash: the jitter of rank `r` in iteration `i`.
fn mix(i: u64, r: u32, salt: u64) -> u64 {
    let mut z = i
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(r) << 20)
        .wrapping_add(salt.wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The functions the records name.
struct Ids {
    allreduce: u16,
    bcast: u16,
    reduce: u16,
    barrier: u16,
    isend: u16,
    waitall: u16,
    send: u16,
    recv: u16,
}

fn ids() -> Ids {
    let f = |n: &str| function_by_name(n).unwrap_or_else(|| panic!("{n} is not in FUNCTIONS"));
    Ids {
        allreduce: f("MPI_Allreduce"),
        bcast: f("MPI_Bcast"),
        reduce: f("MPI_Reduce"),
        barrier: f("MPI_Barrier"),
        isend: f("MPI_Isend"),
        waitall: f("MPI_Waitall"),
        send: f("MPI_Send"),
        recv: f("MPI_Recv"),
    }
}

/// Every rank's times in one iteration (this node's ns, true time).
struct Times {
    ids: Ids,
    size: u32,
    /// When each rank starts the iteration.
    enter: Vec<u64>,
    /// Collectives: the function and root.
    function: u16,
    root: i32,
    /// The latest enter (collectives), and the latest of the non-roots'.
    e_max: u64,
    e_others: u64,
    /// Halo: each rank's `MPI_Waitall`'s leave, its first vertical send's
    /// enter, its first receive's leave, its second send's enter.
    h_leave: Vec<u64>,
    v1: Vec<u64>,
    r1_leave: Vec<u64>,
    v2: Vec<u64>,
}

impl Times {
    fn new(s: &Scenario, i: u64) -> Times {
        let size = s.size();
        let start = T0 + i * s.period();
        let late = (mix(i, 0, 99) % u64::from(size)) as u32;
        let enter: Vec<u64> = (0..size)
            .map(|r| start + mix(i, r, 0) % (3 * US) + if r == late { LATE } else { 0 })
            .collect();
        let ids = ids();
        let (function, root) = match i % 8 {
            5 => (ids.bcast, 0),
            6 => (ids.reduce, 0),
            7 => (ids.barrier, waits::NO_ROOT),
            _ => (ids.allreduce, waits::NO_ROOT),
        };
        let e_max = enter.iter().copied().max().unwrap_or(start);
        let e_others = enter.iter().skip(1).copied().max().unwrap_or(start);
        let mut t = Times {
            ids,
            size,
            enter,
            function,
            root,
            e_max,
            e_others,
            h_leave: Vec::new(),
            v1: Vec::new(),
            r1_leave: Vec::new(),
            v2: Vec::new(),
        };
        if s.kind == Kind::P2p {
            t.halo_times(i);
        }
        t
    }

    fn neighbours(&self, r: u32) -> [u32; 4] {
        let rows = self.size / COLS;
        let (row, col) = (r / COLS, r % COLS);
        let at = |row: u32, col: u32| row * COLS + col;
        [
            at(row, (col + COLS - 1) % COLS),
            at(row, (col + 1) % COLS),
            at((row + rows - 1) % rows, col),
            at((row + 1) % rows, col),
        ]
    }

    fn halo_times(&mut self, i: u64) {
        let n = self.size as usize;
        let e = &self.enter;
        // Isend to the left at e + 200, to the right at e + 300; a message
        // arrives 1 µs after its send; the Waitall is entered at e + 400.
        self.h_leave = (0..self.size)
            .map(|r| {
                let [l, rt, _, _] = self.neighbours(r);
                let arrived = (e[l as usize] + 300 + US).max(e[rt as usize] + 200 + US);
                (e[r as usize] + 600).max(arrived + 100)
            })
            .collect();
        self.v1 = (0..n)
            .map(|r| self.h_leave[r] + 300 + mix(i, r as u32, 1) % 500)
            .collect();
        // Sent up by the rank below, received 1 µs later.
        self.r1_leave = (0..self.size)
            .map(|r| {
                let down = self.neighbours(r)[3] as usize;
                (self.v1[r as usize] + 800).max(self.v1[down] + US + 100)
            })
            .collect();
        self.v2 = self.r1_leave.iter().map(|l| l + 200).collect();
    }

    /// Rank `r`'s record of collective `i`, with when it is pushed.
    fn coll(&self, i: u64, r: u32, out: &mut Vec<(u64, Plain)>) {
        let e = self.enter[r as usize];
        let tail = 1_500 + mix(i, r, 2) % 500;
        let leave = if self.function == self.ids.bcast {
            if r == 0 {
                e + US
            } else {
                e.max(self.enter[0]) + tail
            }
        } else if self.function == self.ids.reduce {
            if r == 0 {
                e.max(self.e_others) + tail
            } else {
                e + US
            }
        } else {
            self.e_max + tail
        };
        out.push((
            leave,
            Plain {
                enter: e,
                leave,
                seq: i,
                comm: waits::WORLD,
                function: self.function,
                kind: kind::COLL,
                peer: self.root,
                ..Plain::default()
            },
        ));
    }

    /// Rank `r`'s records of halo round `i` (a sampled one: every envelope
    /// numbers its messages alike, so each has message `i`), in ring order.
    fn halo(&self, i: u64, r: u32, out: &mut Vec<(u64, Plain)>) {
        let [left, right, up, down] = self.neighbours(r);
        let ru = r as usize;
        let e = self.enter[ru];
        let msg = |kind: u8, function: u16, peer: u32, tag: i32, enter: u64, leave: u64| Plain {
            enter,
            leave,
            seq: i,
            comm: waits::WORLD,
            function,
            kind,
            flags: 0,
            peer: peer as i32,
            tag,
            thread: THREAD,
            bytes: HALO_BYTES,
        };
        let ids = &self.ids;
        // Irecv left at e, right at e + 100; Isend left, right, each
        // flagged: its completion is recorded too (Late Receiver).
        for (peer, at) in [(left, e + 200), (right, e + 300)] {
            let isend = Plain {
                flags: flag::LATER,
                ..msg(kind::SEND, ids.isend, peer, 1, at, at)
            };
            out.push((at, isend));
        }
        // The Waitall completes both sends and both receives: for each
        // send, the call that completed it; for each receive, its post,
        // then the receive; then the group's end.
        let (w, wl) = (e + 400, self.h_leave[ru]);
        for peer in [left, right] {
            let sent = Plain {
                flags: flag::MULTI,
                bytes: u64::MAX,
                ..msg(kind::SENT, ids.waitall, peer, 1, w, wl)
            };
            out.push((wl, sent));
        }
        for (peer, post) in [(left, e), (right, e + 100)] {
            let rec = Plain {
                flags: flag::MULTI,
                ..msg(kind::RECV, ids.waitall, peer, 1, w, wl)
            };
            let posted = Plain {
                kind: kind::POSTED,
                enter: post,
                leave: post,
                flags: 0,
                bytes: 0,
                ..rec
            };
            out.push((wl, posted));
            out.push((wl, rec));
        }
        out.push((
            wl,
            Plain {
                enter: w,
                leave: wl,
                seq: 2,
                comm: waits::WORLD,
                kind: kind::GROUP_END,
                peer: waits::NO_ROOT,
                thread: THREAD,
                ..Plain::default()
            },
        ));
        // Send up, receive from below; send down, receive from above.
        let blocking = |peer: u32, at: u64| Plain {
            flags: flag::BLOCKING,
            ..msg(kind::SEND, ids.send, peer, 2, at, at + 500)
        };
        let received = |peer: u32, enter: u64, leave: u64| Plain {
            flags: flag::POSTED_HERE,
            ..msg(kind::RECV, ids.recv, peer, 2, enter, leave)
        };
        let v1 = self.v1[ru];
        out.push((v1 + 500, blocking(up, v1)));
        let r1 = self.r1_leave[ru];
        out.push((r1, received(down, v1 + 600, r1)));
        let v2 = self.v2[ru];
        out.push((v2 + 500, blocking(down, v2)));
        let r2 = (v2 + 800).max(self.v2[up as usize] + US + 100);
        out.push((r2, received(up, v2 + 600, r2)));
    }
}

/// This thread's CPU time in ns.
fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * S + t.tv_nsec as u64
}

/// What one run measured.
struct Run {
    records: u64,
    local_records: u64,
    cpu_ns: u64,
    tick_max_ns: u64,
    pending_peak: usize,
}

fn drain<'a>(s: &Scenario, rank: u32, records: &'a [Plain], local: bool) -> Drain<'a> {
    let ticks = local && s.ticks();
    Drain {
        rank,
        world_size: s.size(),
        shift: 0,
        p2p_shift: P2P_SHIFT,
        clock: if ticks {
            waits::clock::TICKS
        } else {
            waits::clock::NS
        },
        ns_per_tick: if ticks { NS_PER_TICK } else { 0 },
        records,
        lost: 0,
        skipped: 0,
    }
}

fn run(s: &Scenario, seconds: u64) -> (Run, Waits) {
    let mut w = Waits::default();
    let mut m = Run {
        records: 0,
        local_records: 0,
        cpu_ns: 0,
        tick_max_ns: 0,
        pending_peak: 0,
    };
    for k in 0..seconds * S / TICK {
        let from = T0 + k * TICK;
        let now = from + TICK;
        let local = s.records(0..PER_NODE, from, now);
        // The peers' two last drains but the newest, every 500 ms.
        let remote: Vec<(u32, Vec<Vec<Plain>>)> = if s.nodes > 1 && k % REMOTE_EVERY == 1 {
            (1..=REMOTE_EVERY)
                .rev()
                .map(|back| {
                    let f = from.saturating_sub(back * TICK);
                    (PER_NODE, s.records(PER_NODE..s.size(), f, f + TICK))
                })
                .collect()
        } else {
            Vec::new()
        };
        let t0 = thread_cpu_ns();
        for (r, recs) in local.iter().enumerate() {
            w.add(JOB, &drain(s, r as u32, recs, true), now);
            m.local_records += recs.len() as u64;
        }
        for (base, drains) in &remote {
            for (j, recs) in drains.iter().enumerate() {
                let rank = base + j as u32;
                let node = PEERS[(rank / PER_NODE) as usize];
                w.add_remote(JOB, node, &drain(s, rank, recs, false), now);
                m.records += recs.len() as u64;
            }
        }
        m.pending_peak = m.pending_peak.max(w.pending());
        w.settle(now);
        let ns = thread_cpu_ns() - t0;
        m.cpu_ns += ns;
        m.tick_max_ns = m.tick_max_ns.max(ns);
    }
    m.records += m.local_records;
    (m, w)
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let reps = env("BENCH_WAITS_REPS", 7);
    let seconds = env("BENCH_WAITS_SECONDS", 4);
    let only = std::env::var("BENCH_WAITS_ONLY").unwrap_or_default();
    let mut scenarios = Vec::new();
    for nodes in [1, 3] {
        for rate in [100, 1_000, 10_000] {
            scenarios.push(Scenario {
                kind: Kind::Coll,
                rate,
                nodes,
            });
        }
        for rate in [1_000, 10_000, 100_000] {
            scenarios.push(Scenario {
                kind: Kind::P2p,
                rate,
                nodes,
            });
        }
    }
    scenarios.retain(|s| only.is_empty() || only.split(',').any(|o| o == s.name()));
    println!(
        "ranks_per_node={PER_NODE} seconds={seconds} reps={reps} ring_slots={} max_pending={MAX_PENDING}",
        waits::RING_SLOTS
    );
    let started = Instant::now();
    for rep in 0..reps {
        for s in &scenarios {
            let (m, w) = run(s, seconds);
            let f = w.figures(JOB).expect("the job's figures");
            assert_eq!(f.records_invalid, 0, "{}: invalid records", s.name());
            let instances: u64 = f.instances.iter().sum();
            let waited: u64 = f.waited_ns.iter().sum();
            let unresolved: Vec<String> = Unresolved::ALL
                .iter()
                .map(|u| format!("{}:{}", u.label(), f.unresolved[*u as usize]))
                .collect();
            let per_pattern: Vec<String> = Pattern::ALL
                .iter()
                .map(|p| format!("{}:{}", p.label(), f.instances[*p as usize]))
                .collect();
            println!(
                "run scenario={} rep={rep} nodes={} rate={} seconds={seconds} records={} \
                 local_records={} cpu_ns={} tick_max_ns={} pending_peak={} instances={instances} \
                 waited_ms={:.1} unresolved={} patterns={} culprit={}",
                s.name(),
                s.nodes,
                s.rate,
                m.records,
                m.local_records,
                m.cpu_ns,
                m.tick_max_ns,
                m.pending_peak,
                waited as f64 / 1e6,
                unresolved.join(","),
                per_pattern.join(","),
                f.culprit().map_or(-1, |c| i64::from(c.0)),
            );
        }
    }
    println!("done elapsed_s={:.1}", started.elapsed().as_secs_f64());
}
