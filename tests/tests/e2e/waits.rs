//! End-to-end tests of the wait states (issue 37, docs/waits.md): a real
//! 4-rank job under the shim's `stats` layer plants one late rank in every
//! collective of a kind (tests/programs/waits/late.c), and the daemon's
//! `/metrics` must say how long the others waited, under which of
//! Scalasca's patterns, and name the late rank as the culprit; on Debian's
//! Open MPI and MPICH. Two more modes plant Late Senders: a blocking
//! receive each, and an `MPI_Waitall` whose latest sender is late; one
//! plants Late Receivers: an `MPI_Ssend` each to a rank that posts its
//! receives late, one after the other; two more the same with
//! `MPI_Issend`, waiting in the call that completes it: an `MPI_Wait`, or
//! one `MPI_Waitall` of two sends, which waits for its latest receiver.
//!
//! Messages are sampled as shipped, one in 8 per envelope: 16 rounds keep
//! 2 of each, which stand for all 16. The planted wait is DELAY × ROUNDS =
//! 1.6 s per waiting rank. Every message plant makes instances of both
//! message patterns: a receive completed in a blocking call is a Late
//! Sender's, a message sent in `MPI_Send` or `MPI_Ssend` a Late Receiver's,
//! whether or not anybody waited, so each count is exact in every plant.
//!
//! **The truth** is what the ranks' own clocks say: late.c times every call
//! it makes (CLOCK_MONOTONIC around the call, one clock for the node), and
//! the test applies Scalasca's formulas to those times, with the daemon's
//! sampling. Each pattern's figure must match it within 5% or 1 ms an
//! evaluated instance, the planted one included, and every other pattern
//! too, but for the synchronising barrier after the start, when it is not
//! the plant: 15 ms (its one instance is only as good as the ranks' clock
//! reads outside the shim, [`SYNC_NOISE_S`]; the trace holds it to 1 ms).
//! The plant only sets
//! what should happen: on a loaded machine the late rank sleeps longer,
//! and 4 ranks on 2 cores leave a collective with a skew (a rank that
//! leaves a Bcast 3 ms after its root truly waits 3 ms less in the next),
//! so a band around the planted figure alone failed under load (r7 of
//! issue 34: MPICH's Barrier 7.7 s where 4.8 s were planted, with the late
//! rank descheduled). Half the planted figure is still a floor: the plant
//! must have happened (under load a Bcast's skew took MPICH's to 0.87 of
//! it, and the truth agreed). Every count is exact.
//!
//! **Live against the trace.** Every run is also recorded whole by
//! `mpi-observer record`, whose slice starts at the synchronising
//! Barrier's Enter on every rank and ends at the end of the recording
//! (every rank entered `MPI_Finalize`): the instances the daemon evaluated.
//! tests/programs/waits/trace_waits.py applies Scalasca's formulas to that
//! archive through python3-otf2, a reader that shares nothing with the
//! daemon, and the daemon's `/report.json` must agree with it per pattern
//! (seconds and instances) and per rank (what it waited, and what others
//! waited for it as the rank that came late), within 5% or 1 ms an
//! instance: issue 37's live-versus-trace check, on one node, where the
//! clock is shared.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, compile, program, require, scratch, shim_launcher, sum,
    workspace_root,
};
use serde_json::Value;

use crate::record::{anchor, end_record, readers, start_record};

const NP: u32 = 4;
pub(crate) const ROUNDS: u64 = 16;
/// The messages' sampling period the shim uses unless told.
pub(crate) const P2P_PERIOD: u64 = 8;
pub(crate) const DELAY_MS: u64 = 100;
/// How far the ranks' own clocks may be from the shim's on the one
/// synchronising barrier when it is not the plant: the ranks reach it from
/// their own starts, and a rank descheduled between late.c's clock read
/// and the shim's (4 busy-polling ranks on 2 cores: a scheduler slice,
/// several ms) moves the latest enter, so every other rank's wait, by
/// that much (seen: 7.3 ms on MPICH, idle machine). That instance is still
/// held to the trace within 1 ms (`live_against_trace`), on the shim's own
/// clock reads.
pub(crate) const SYNC_NOISE_S: f64 = 0.015;
pub(crate) const PATTERNS: [&str; 6] = [
    "wait_barrier",
    "wait_nxn",
    "late_broadcast",
    "early_reduce",
    "late_sender",
    "late_receiver",
];

/// The sampling period of `pattern`'s instances: the messages' for the
/// patterns of messages, none for collectives (the shim records every one).
pub(crate) fn period(pattern: &str) -> u64 {
    if matches!(pattern, "late_sender" | "late_receiver") {
        P2P_PERIOD
    } else {
        1
    }
}

/// One mode of late.c: the pattern it plants, the ranks that wait, the
/// culprit, and what a round makes of the message patterns' instances.
struct Plant {
    mode: &'static str,
    pattern: &'static str,
    waiters: u32,
    culprit: u32,
    /// Blocking calls a round completes receives in (Late Sender's
    /// instances, a wait or not): a receive's call, or a `MPI_Waitall`'s
    /// (a round's messages share their numbers, so all of its receives are
    /// sampled together).
    receiving_calls: u32,
    /// Late Receiver's instances a round, a wait or not: envelopes whose
    /// messages are sent in `MPI_Send` or `MPI_Ssend`, and calls of the
    /// Wait family that complete nonblocking sends.
    blocking_sends: u32,
}

impl Plant {
    /// Instances of `pattern` the daemon evaluates over the run.
    fn instances(&self, pattern: &str) -> u64 {
        // Messages: one envelope's number is the round, sampled one in
        // the period.
        let sampled = ROUNDS / P2P_PERIOD;
        match pattern {
            "late_sender" => sampled * u64::from(self.receiving_calls),
            "late_receiver" => sampled * u64::from(self.blocking_sends),
            // The synchronising barrier after the start, too.
            "wait_barrier" if self.pattern == pattern => ROUNDS + 1,
            "wait_barrier" => 1,
            _ if self.pattern == pattern => ROUNDS,
            _ => 0,
        }
    }
}

const PLANTS: [Plant; 9] = [
    Plant {
        mode: "barrier",
        pattern: "wait_barrier",
        waiters: 3,
        culprit: 3,
        receiving_calls: 0,
        blocking_sends: 0,
    },
    Plant {
        mode: "nxn",
        pattern: "wait_nxn",
        waiters: 3,
        culprit: 2,
        receiving_calls: 0,
        blocking_sends: 0,
    },
    Plant {
        mode: "bcast",
        pattern: "late_broadcast",
        waiters: 3,
        culprit: 0,
        receiving_calls: 0,
        blocking_sends: 0,
    },
    Plant {
        mode: "reduce",
        pattern: "early_reduce",
        // Only the root waits in a reduce.
        waiters: 1,
        culprit: 3,
        receiving_calls: 0,
        blocking_sends: 0,
    },
    Plant {
        mode: "sender",
        pattern: "late_sender",
        waiters: 3,
        culprit: 3,
        // An MPI_Recv per waiter, from the last rank's MPI_Sends.
        receiving_calls: 3,
        blocking_sends: 3,
    },
    Plant {
        mode: "waitall",
        pattern: "late_sender",
        // Rank 0, for its latest sender only.
        waiters: 1,
        culprit: 3,
        // Rank 0's MPI_Waitall, of the others' MPI_Sends.
        receiving_calls: 1,
        blocking_sends: 3,
    },
    Plant {
        mode: "receiver",
        pattern: "late_receiver",
        // Every rank but the last, in its MPI_Ssend.
        waiters: 3,
        culprit: 3,
        // The last rank's MPI_Recvs, each of a sender in time.
        receiving_calls: 3,
        blocking_sends: 3,
    },
    Plant {
        mode: "issend",
        pattern: "late_receiver",
        // Every rank but the last, in the MPI_Wait of its MPI_Issend.
        waiters: 3,
        culprit: 3,
        receiving_calls: 3,
        // Each sender's MPI_Wait.
        blocking_sends: 3,
    },
    Plant {
        mode: "issendall",
        pattern: "late_receiver",
        // Every rank but the last, in the MPI_Waitall of its two
        // MPI_Issends, for its later receive.
        waiters: 3,
        culprit: 3,
        // Two MPI_Recvs of the last rank per sender.
        receiving_calls: 6,
        // Each sender's MPI_Waitall.
        blocking_sends: 3,
    },
];

/// One call late.c timed: its name, round, the peer it sends to or
/// receives from (-1 if several), and its enter and leave in
/// CLOCK_MONOTONIC ns.
pub(crate) struct Timed {
    pub(crate) name: String,
    pub(crate) round: i64,
    pub(crate) peer: i64,
    pub(crate) enter: u64,
    pub(crate) leave: u64,
}

/// What each of the `np` ranks of the job timed (late.c writes
/// `GO.times.RANK`), by rank.
pub(crate) fn timings(go: &Path, np: u32) -> Vec<Vec<Timed>> {
    (0..np)
        .map(|r| {
            let path = PathBuf::from(format!("{}.times.{r}", go.display()));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            text.lines()
                .map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    assert_eq!(f.len(), 5, "{}: {l}", path.display());
                    Timed {
                        name: f[0].to_string(),
                        round: f[1].parse().unwrap(),
                        peer: f[2].parse().unwrap(),
                        enter: f[3].parse().unwrap(),
                        leave: f[4].parse().unwrap(),
                    }
                })
                .collect()
        })
        .collect()
}

/// One wait by Scalasca's formulas (docs/waits.md) from the ranks' own
/// timings: rank `rank` waited `ns` under `pattern` (0 if it did not; a
/// message's wait times the messages' sampling period) until a time of
/// rank `late` (the last to enter, the root, the sender or the receiver).
/// `margin` is the wait before it is clamped at 0, unsampled, in ns:
/// negative, how early the awaited time came (a send that completed before
/// its receive was posted: how long before). An error between the two
/// ranks' clocks moves it by as much at most; a wait whose margin is
/// smaller than the error could be taken for none, and the other way.
pub(crate) struct Waited {
    pub(crate) pattern: &'static str,
    pub(crate) rank: usize,
    pub(crate) late: usize,
    pub(crate) ns: u64,
    pub(crate) margin: i64,
}

/// Seconds waited per pattern, by Scalasca's formulas (docs/waits.md)
/// from the ranks' own timings ([`timings`], on one clock), with the
/// daemon's sampling of messages (the rounds whose number on the envelope
/// is a multiple of the period, times the period).
pub(crate) fn truth(ranks: &[Vec<Timed>]) -> BTreeMap<&'static str, f64> {
    let mut out: BTreeMap<&'static str, f64> = BTreeMap::new();
    for w in waited(ranks) {
        *out.entry(w.pattern).or_default() += w.ns as f64 / 1e9;
    }
    out
}

/// Every wait of [`truth`], one per waiting member of a collective, per
/// blocking call that completed a receive, per message sent in a blocking
/// send, in that order.
pub(crate) fn waited(ranks: &[Vec<Timed>]) -> Vec<Waited> {
    let mut out = Vec::new();
    let mut add = |pattern: &'static str, rank: usize, late: usize, ns: u64, margin: i64| {
        out.push(Waited {
            pattern,
            rank,
            late,
            ns,
            margin,
        })
    };
    let wait = |enter: u64, until: u64, leave: u64| until.min(leave).saturating_sub(enter);
    // `wait` before the clamp at 0.
    let margin = |enter: u64, until: u64, leave: u64| until.min(leave) as i64 - enter as i64;
    // Collectives, by (name, round): one call per rank.
    let mut colls: BTreeMap<(&str, i64), Vec<(usize, &Timed)>> = BTreeMap::new();
    for (r, calls) in ranks.iter().enumerate() {
        for c in calls.iter().filter(|c| {
            matches!(
                c.name.as_str(),
                "MPI_Barrier" | "MPI_Allreduce" | "MPI_Bcast" | "MPI_Reduce"
            )
        }) {
            colls
                .entry((c.name.as_str(), c.round))
                .or_default()
                .push((r, c));
        }
    }
    for ((name, _), parts) in &colls {
        assert_eq!(parts.len(), ranks.len(), "{name}: a call per rank");
        let (last, latest) = parts
            .iter()
            .map(|p| (p.0, p.1.enter))
            .max_by_key(|p| p.1)
            .unwrap();
        let root = parts.iter().find(|p| p.0 == 0).unwrap().1;
        match *name {
            "MPI_Barrier" | "MPI_Allreduce" => {
                let p = if *name == "MPI_Barrier" {
                    "wait_barrier"
                } else {
                    "wait_nxn"
                };
                for (r, c) in parts {
                    let (e, l) = (c.enter, c.leave);
                    add(p, *r, last, wait(e, latest, l), margin(e, latest, l));
                }
            }
            "MPI_Bcast" => {
                for (r, c) in parts.iter().filter(|p| p.0 != 0) {
                    let (e, l) = (c.enter, c.leave);
                    let ns = wait(e, root.enter, l);
                    add("late_broadcast", *r, 0, ns, margin(e, root.enter, l));
                }
            }
            "MPI_Reduce" => {
                let (sender, others) = parts
                    .iter()
                    .filter(|p| p.0 != 0)
                    .map(|p| (p.0, p.1.enter))
                    .max_by_key(|p| p.1)
                    .unwrap();
                let (e, l) = (root.enter, root.leave);
                add(
                    "early_reduce",
                    0,
                    sender,
                    wait(e, others, l),
                    margin(e, others, l),
                );
            }
            other => panic!("late.c timed {other}"),
        }
    }
    // Messages: the sampled rounds, each standing for the period's. A
    // round sends one message per envelope, so the round is its number.
    let sampled = |round: i64| round >= 0 && (round as u64).is_multiple_of(P2P_PERIOD);
    let is_send = |c: &Timed| matches!(c.name.as_str(), "MPI_Send" | "MPI_Ssend" | "MPI_Issend");
    let is_blocking = |c: &Timed| matches!(c.name.as_str(), "MPI_Send" | "MPI_Ssend");
    // The send of the message from `from` to `to` in `round`.
    let sent = |from: usize, to: usize, round: i64| {
        let from = ranks.get(from).expect("a sender of the job");
        from.iter()
            .find(|c| is_send(c) && c.peer == to as i64 && c.round == round)
    };
    // Late Sender: per blocking call that completed a receive.
    for (r, calls) in ranks.iter().enumerate() {
        for c in calls.iter().filter(|c| sampled(c.round)) {
            let (e, l) = (c.enter, c.leave);
            match c.name.as_str() {
                "MPI_Recv" => {
                    let from = usize::try_from(c.peer).expect("a receive from one rank");
                    let s = sent(from, r, c.round).expect("its send");
                    let ns = P2P_PERIOD * wait(e, s.enter, l);
                    add("late_sender", r, from, ns, margin(e, s.enter, l));
                }
                // The latest of its senders (waitall's; issendall's
                // complete sends, to one peer).
                "MPI_Waitall" if c.peer < 0 => {
                    let (from, s) = ranks
                        .iter()
                        .enumerate()
                        .flat_map(|(from, calls)| calls.iter().map(move |s| (from, s)))
                        .filter(|(_, s)| is_send(s) && s.peer == r as i64 && s.round == c.round)
                        .max_by_key(|(_, s)| s.enter)
                        .expect("its sends");
                    let ns = P2P_PERIOD * wait(e, s.enter, l);
                    add("late_sender", r, from, ns, margin(e, s.enter, l));
                }
                _ => {}
            }
        }
    }
    // Late Receiver: per message sent in a blocking MPI_Send or MPI_Ssend
    // (entered at E_S, left at L_S) whose receive was posted at P, the
    // enter of the MPI_Recv that received it or the MPI_Irecv that posted
    // it: the sender waited P - E_S if it was still in its send then.
    for (r, calls) in ranks.iter().enumerate() {
        for s in calls.iter().filter(|c| sampled(c.round) && is_blocking(c)) {
            let to = usize::try_from(s.peer).expect("a send to one rank");
            let posted = ranks[to]
                .iter()
                .find(|c| {
                    matches!(c.name.as_str(), "MPI_Recv" | "MPI_Irecv")
                        && c.peer == r as i64
                        && c.round == s.round
                })
                .expect("its receive")
                .enter;
            let (ns, margin) = late_receiver(s.enter, s.leave, posted);
            add("late_receiver", r, to, P2P_PERIOD * ns, margin);
        }
        // The same in the call W that completed MPI_Issends (entered at
        // E_W, left at L_W): P - E_W if W was still running then, for
        // the latest of its receives' posts (a Waitall waits for its
        // latest receiver; issendall's send to one peer only).
        for w in calls
            .iter()
            .filter(|c| sampled(c.round) && matches!(c.name.as_str(), "MPI_Wait" | "MPI_Waitall"))
        {
            let issends =
                |x: &&Timed| x.name == "MPI_Issend" && x.round == w.round && x.peer == w.peer;
            if !calls.iter().any(|x| issends(&x)) {
                continue;
            }
            let to = usize::try_from(w.peer).expect("sends to one rank");
            let posted = ranks[to]
                .iter()
                .filter(|c| c.name == "MPI_Recv" && c.peer == r as i64 && c.round == w.round)
                .map(|c| c.enter)
                .max()
                .expect("its receives");
            let (ns, margin) = late_receiver(w.enter, w.leave, posted);
            add("late_receiver", r, to, P2P_PERIOD * ns, margin);
        }
    }
    out
}

/// Late Receiver of a call entered at `enter` and left at `leave` that
/// waited for a receive posted at `posted`: its wait, `posted − enter` if
/// the call was still running then, and its margin: posted before the
/// call returned, how long after it was entered; else how long after it
/// returned (negative).
fn late_receiver(enter: u64, leave: u64, posted: u64) -> (u64, i64) {
    let ns = if leave > posted && posted > enter {
        posted - enter
    } else {
        0
    };
    let margin = if posted < leave {
        posted as i64 - enter as i64
    } else {
        leave as i64 - posted as i64
    };
    (ns, margin)
}

fn by(samples: &[Sample], name: &str, label: &str, value: &str) -> f64 {
    sum(samples, name, &[(label, value)])
}

/// What a plant's run must show against `truth` ([`truth`], from the
/// ranks' own timings): every pattern's seconds as they say it happened (a
/// loaded machine makes the late rank later than planted, and the others
/// wait that long), within 5% or 1 ms an evaluated instance (the lone
/// synchronising barrier when it is not `pattern`: [`SYNC_NOISE_S`]); at
/// least half of the `waiters` × DELAY × ROUNDS planted under `pattern`
/// (the plant did happen); and `culprit` named first, as a value.
fn against_truth(
    what: &str,
    s: &[Sample],
    truth: &BTreeMap<&'static str, f64>,
    pattern: &str,
    waiters: u32,
    culprit: u32,
) {
    for p in PATTERNS {
        let got = by(s, "mpi_job_wait_seconds_total", "pattern", p);
        let want = truth.get(p).copied().unwrap_or(0.0);
        let n = by(s, "mpi_job_wait_instances_total", "pattern", p);
        let per_instance = if p == "wait_barrier" && p != pattern {
            SYNC_NOISE_S
        } else {
            0.001
        };
        let tolerance = (0.05 * want).max(per_instance * n * period(p) as f64);
        assert!(
            (got - want).abs() <= tolerance,
            "{what}: {p} waited {got:.4} s by the daemon, {want:.4} s by the ranks' own clocks \
             (planted: {})",
            if p == pattern { "this one" } else { "another" }
        );
    }
    // Messages as sampled: the kept rounds stand for the period's.
    let planted = (DELAY_MS * ROUNDS) as f64 / 1000.0 * f64::from(waiters);
    let got = by(s, "mpi_job_wait_seconds_total", "pattern", pattern);
    assert!(
        got >= 0.5 * planted,
        "{what}: {pattern} waited {got:.3} s, planted {planted:.3} s"
    );
    eprintln!(
        "{what}: {pattern} {got:.3} s by the daemon, {:.3} s by the ranks' clocks, planted {planted:.3} s",
        truth.get(pattern).copied().unwrap_or(0.0)
    );
    assert_eq!(
        sum(s, "mpi_job_wait_culprit_rank", &[("k", "1")]),
        f64::from(culprit),
        "{what}: the culprit"
    );
}

/// Starts late.c's `mode` as a 4-rank job under the shim's `stats`,
/// waiting at its go file, and a daemon observing it.
fn start_plant(mpi: Mpi, dir: &Path, exe: &Path, mode: &str) -> (Job, Daemon, PathBuf) {
    let go = dir.join(format!("go-{mode}"));
    let mut launcher = shim_launcher(mpi, NP, "stats");
    launcher.arg(exe).args([
        mode.to_string(),
        ROUNDS.to_string(),
        DELAY_MS.to_string(),
        go.display().to_string(),
    ]);
    let job = Job::spawn(launcher, NP, go.clone());
    let daemon = Daemon::start(&[vec!["--no-bpf".to_string()], job.pid_args()].concat());
    (job, daemon, go)
}

/// Runs `plant` once and checks what the daemon says of it.
fn run(mpi: Mpi, dir: &Path, exe: &Path, plant: &Plant) {
    let (job, mut daemon, go) = start_plant(mpi, dir, exe, plant.mode);
    let what = format!("{mpi:?} {}", plant.mode);
    // The same run recorded, from before its first MPI call after the go
    // file to its exit.
    let trace = dir.join(format!("trace-{}", plant.mode));
    let mut args = job.pid_args();
    args.extend(["-o".into(), trace.display().to_string()]);
    let (rec, lines) = start_record(&args);
    job.finish("OK ");
    let (code, rest) = end_record(rec, lines);
    assert_eq!(code, Some(0), "{what}: record: {rest:?}");
    let last = rest.last().cloned().unwrap_or_default();
    assert!(
        last.contains("the slice runs from the start of blocking collective #1 on MPI_COMM_WORLD on every rank to the end of the recording"),
        "{what}: {last}"
    );
    let s = daemon.final_scrape();
    live_against_trace(&what, &daemon, &trace);
    // Every instance evaluated, none unresolved, nothing lost.
    for p in PATTERNS {
        let want = plant.instances(p);
        assert_eq!(
            by(&s, "mpi_job_wait_instances_total", "pattern", p) as u64,
            want,
            "{what}: instances of {p}"
        );
    }
    assert_eq!(sum(&s, "mpi_job_wait_unresolved_total", &[]), 0.0, "{what}");
    assert_eq!(
        sum(&s, "mpi_job_wait_records_lost_total", &[]),
        0.0,
        "{what}"
    );
    assert_eq!(
        sum(&s, "mpi_job_wait_records_invalid_total", &[]),
        0.0,
        "{what}"
    );
    assert_eq!(sum(&s, "mpi_job_wait_sample_period", &[]), 1.0, "{what}");
    assert_eq!(
        sum(&s, "mpi_job_wait_p2p_sample_period", &[]),
        P2P_PERIOD as f64,
        "{what}"
    );
    let truth = truth(&timings(&go, NP));
    against_truth(
        &what,
        &s,
        &truth,
        plant.pattern,
        plant.waiters,
        plant.culprit,
    );
    assert!(sum(&s, "mpi_job_wait_culprit_fraction_1m", &[("k", "1")]) > 0.0);
    // The rank that waited most is one the plant made wait: rank 0 where
    // it is the only one (the root of a reduce, the Waitall's receiver),
    // and never the culprit.
    let waiter = sum(&s, "mpi_job_wait_waiting_rank", &[("k", "1")]);
    if plant.waiters == 1 {
        assert_eq!(waiter, 0.0, "{what}: the waiting rank");
    } else {
        assert_ne!(waiter, f64::from(plant.culprit), "{what}: the waiting rank");
    }
    assert!(sum(&s, "mpi_job_wait_waiting_fraction_1m", &[("k", "1")]) > 0.0);
    per_rank_series(&what, &daemon, &s, plant);
    let _ = daemon.stop(e2e::signal::TERM);
}

/// `/metrics/ranks` says, rank by rank, what the job's series sum: the
/// planted pattern's seconds are the waiting ranks' (the late rank waited
/// hardly any of them), and the late rank is their root cause.
fn per_rank_series(what: &str, daemon: &Daemon, job: &[Sample], plant: &Plant) {
    let (status, body) = e2e::http_get(&daemon.addr, "/metrics/ranks").expect("/metrics/ranks");
    assert_eq!(status, 200, "{what}: {body}");
    let r = e2e::parse_metrics(&body);
    let p = plant.pattern;
    let total = by(job, "mpi_job_wait_seconds_total", "pattern", p);
    let waited: f64 = (0..NP)
        .map(|k| {
            sum(
                &r,
                "mpi_rank_wait_seconds_total",
                &[("rank", &k.to_string()), ("pattern", p)],
            )
        })
        .sum();
    assert!(
        (waited - total).abs() <= 1e-6 * total.max(1.0),
        "{what}: {p}: the ranks waited {waited} s, the job {total} s"
    );
    let culprit = plant.culprit.to_string();
    let late = sum(
        &r,
        "mpi_rank_wait_seconds_total",
        &[("rank", &culprit), ("pattern", p)],
    );
    // Only as the others may be late to it by chance (the synchronising
    // barrier after the start, a rank descheduled).
    assert!(
        late <= 0.05 * total,
        "{what}: the late rank waited {late} s of {total} s under {p}"
    );
    let caused = sum(
        &r,
        "mpi_rank_wait_caused_seconds_total",
        &[("rank", &culprit), ("pattern", p)],
    );
    assert!(
        caused >= 0.5 * total,
        "{what}: rank {culprit} caused {caused} s of {total} s under {p}"
    );
}

/// The daemon's `/report.json` against Scalasca's formulas applied to the
/// archive `record` wrote of the same run (see the module docs).
fn live_against_trace(what: &str, daemon: &Daemon, trace: &Path) {
    let script = workspace_root().join("tests/programs/waits/trace_waits.py");
    let o = std::process::Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(anchor(trace))
        .arg(P2P_PERIOD.to_string())
        .output()
        .expect("run /usr/bin/python3");
    assert!(
        o.status.success(),
        "{what}: trace_waits.py failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let t: Value = serde_json::from_slice(&o.stdout).expect("trace_waits.py's JSON");
    assert_eq!(
        t["mismatched"], 0,
        "{what}: every rank has the same collectives: {t}"
    );
    assert_eq!(t["unmatched"], 0, "{what}: every receive has its send: {t}");
    assert_eq!(
        t["unposted"], 0,
        "{what}: every blocking send's receive was posted in the archive: {t}"
    );
    let (status, body) = e2e::http_get(&daemon.addr, "/report.json").expect("/report.json");
    assert_eq!(status, 200, "{what}: {body}");
    let report: Value = serde_json::from_str(&body).expect("the report's JSON");
    let jobs = report["waits"].as_array().expect("the report's waits");
    assert_eq!(jobs.len(), 1, "{what}: one job: {report}");
    let live = &jobs[0];
    let patterns: Vec<&str> = live["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pattern"].as_str().unwrap())
        .collect();
    // Every pattern is compared, in the order the ranks' arrays use.
    assert_eq!(patterns, PATTERNS, "{what}: the report's patterns");
    let close = |got: u64, want: u64, instances: u64, period: u64| {
        let tolerance = (0.05 * want as f64).max(1e6 * (instances * period) as f64);
        (got as f64 - want as f64).abs() <= tolerance
    };
    for (i, p) in patterns.iter().enumerate() {
        let tp = t["patterns"]
            .get(*p)
            .unwrap_or_else(|| panic!("{what}: the trace has no {p}: {t}"));
        let period = period(p);
        let lp = &live["patterns"][i];
        let n = tp["instances"].as_u64().unwrap();
        assert_eq!(
            lp["instances"].as_u64(),
            Some(n),
            "{what}: {p} instances, live and trace"
        );
        let (got, want) = (
            lp["waited_ns"].as_u64().unwrap(),
            tp["waited_ns"].as_u64().unwrap(),
        );
        assert!(
            close(got, want, n, period),
            "{what}: {p} waited {got} ns live, {want} ns by the trace"
        );
        for rank in 0..NP {
            let live_rank = live["ranks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["rank"] == rank);
            let trace_rank = &t["ranks"][rank.to_string()];
            for field in ["waited_ns", "late_ns"] {
                let got = live_rank.map_or(0, |r| r[field][i].as_u64().unwrap_or(0));
                let want = trace_rank[field][*p].as_u64().unwrap_or(0);
                assert!(
                    close(got, want, n, period),
                    "{what}: rank {rank} {p} {field}: {got} live, {want} by the trace"
                );
            }
        }
    }
    eprintln!("{what}: live and trace agree: {t}");
}

fn every_plant_is_found_and_its_culprit_named(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) || !require(&readers()) {
        return;
    }
    let dir = scratch(&format!("waits-{}", mpi.name()));
    let exe = dir.join(format!("late-{}", mpi.name()));
    compile(mpi, &program("waits/late.c"), &exe, &[]);
    for plant in &PLANTS {
        run(mpi, &dir, &exe, plant);
    }
}

e2e::per_mpi!(
    every_plant_is_found_and_its_culprit_named => every_plant_is_found_and_its_culprit_named:
        openmpi, mpich
);

/// A plant on communicators other than `MPI_COMM_WORLD` (late.c's `split`,
/// `dup`, `idup`, `cgroup`, `subbcast` and `subsender`): the pattern, the instances of each
/// pattern over the run (but the synchronising barrier on
/// `MPI_COMM_WORLD`), the ranks that wait (their world ranks) and the
/// culprit.
struct OnComms {
    mode: &'static str,
    pattern: &'static str,
    instances: &'static [(&'static str, u64)],
    waiters: &'static [u32],
    culprit: u32,
}

const ON_COMMS: [OnComms; 6] = [
    // Each half's barrier, on two dups of it in turn: rank 1 waits for 3.
    OnComms {
        mode: "split",
        pattern: "wait_barrier",
        instances: &[("wait_barrier", 2 * ROUNDS)],
        waiters: &[1],
        culprit: 3,
    },
    OnComms {
        mode: "dup",
        pattern: "wait_nxn",
        instances: &[("wait_nxn", ROUNDS)],
        waiters: &[0, 1, 3],
        culprit: 2,
    },
    // The same on an MPI_Comm_idup of the world (nonblocking: described as
    // its parent is).
    OnComms {
        mode: "idup",
        pattern: "wait_nxn",
        instances: &[("wait_nxn", ROUNDS)],
        waiters: &[0, 1, 3],
        culprit: 2,
    },
    // Allreduces of the odd ranks on two MPI_Comm_create_groups of their
    // half, which the even ranks never call: rank 1 waits for 3.
    OnComms {
        mode: "cgroup",
        pattern: "wait_nxn",
        instances: &[("wait_nxn", ROUNDS)],
        waiters: &[1],
        culprit: 3,
    },
    // Each half broadcasts from its rank 1: rank 1 waits for world rank 3.
    OnComms {
        mode: "subbcast",
        pattern: "late_broadcast",
        instances: &[("late_broadcast", 2 * ROUNDS)],
        waiters: &[1],
        culprit: 3,
    },
    // Each half's rank 1 sends to its rank 0: rank 1 waits for world rank
    // 3. A message a half a round, one round in the sampling period kept:
    // each a Late Sender's instance (a blocking receive) and a Late
    // Receiver's (a blocking send).
    OnComms {
        mode: "subsender",
        pattern: "late_sender",
        instances: &[
            ("late_sender", 2 * ROUNDS / P2P_PERIOD),
            ("late_receiver", 2 * ROUNDS / P2P_PERIOD),
        ],
        waiters: &[1],
        culprit: 3,
    },
];

/// Scalasca's formulas on the ranks' own timings of a plant on other
/// communicators: per pattern, seconds waited, each round's instance made
/// of the ranks of one half (`split`, `subbcast`) or of all (`dup`, `idup`, and the
/// synchronising barrier), the root of a half's broadcast its rank 1.
fn truth_on_comms(mode: &str, ranks: &[Vec<Timed>]) -> BTreeMap<&'static str, f64> {
    if mode == "subsender" {
        // Only the synchronising barrier, on MPI_COMM_WORLD, and messages
        // timed with their world ranks.
        return truth(ranks);
    }
    // (call, round, half: 2 for all ranks) → its members' calls.
    type Groups<'a> = BTreeMap<(&'a str, i64, usize), Vec<(usize, &'a Timed)>>;
    let mut groups = Groups::new();
    for (r, calls) in ranks.iter().enumerate() {
        for c in calls {
            let half = if c.round >= 0 && !matches!(mode, "dup" | "idup") {
                r % 2
            } else {
                2
            };
            groups
                .entry((c.name.as_str(), c.round, half))
                .or_default()
                .push((r, c));
        }
    }
    let mut out: BTreeMap<&'static str, f64> = BTreeMap::new();
    for ((name, _, half), parts) in &groups {
        let wait = |c: &Timed, until: u64| until.min(c.leave).saturating_sub(c.enter);
        let (pattern, waited): (&'static str, u64) = match *name {
            "MPI_Barrier" | "MPI_Allreduce" => {
                let latest = parts.iter().map(|p| p.1.enter).max().unwrap();
                let p = if *name == "MPI_Barrier" {
                    "wait_barrier"
                } else {
                    "wait_nxn"
                };
                (p, parts.iter().map(|p| wait(p.1, latest)).sum())
            }
            "MPI_Bcast" => {
                // The half's rank 1: world rank 2 or 3.
                let root = parts.iter().find(|p| p.0 == 2 + half).unwrap().1;
                let others = parts.iter().filter(|p| p.0 != 2 + half);
                (
                    "late_broadcast",
                    others.map(|p| wait(p.1, root.enter)).sum(),
                )
            }
            other => panic!("late.c timed {other}"),
        };
        *out.entry(pattern).or_default() += waited as f64 / 1e9;
    }
    out
}

/// Collectives and messages on communicators the job made (splits, dups,
/// dups of splits): each member numbers them alike, so the daemon matches
/// them as it does those on `MPI_COMM_WORLD`, names the root of a
/// sub-communicator by its world rank, and finds the plant with its
/// culprit; nothing is
/// invalid, unresolved or mismatched (two dups made one after the other
/// have distinct ids, and so have the halves of one split).
fn plants_on_other_communicators_are_found(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch(&format!("waits-comms-{}", mpi.name()));
    let exe = dir.join(format!("late-{}", mpi.name()));
    compile(mpi, &program("waits/late.c"), &exe, &[]);
    for plant in &ON_COMMS {
        let (job, mut daemon, go) = start_plant(mpi, &dir, &exe, plant.mode);
        let what = format!("{mpi:?} {}", plant.mode);
        job.finish("OK ");
        let s = daemon.final_scrape();
        for p in PATTERNS {
            // The synchronising barrier on MPI_COMM_WORLD, too.
            let want = u64::from(p == "wait_barrier")
                + plant.instances.iter().find(|i| i.0 == p).map_or(0, |i| i.1);
            assert_eq!(
                by(&s, "mpi_job_wait_instances_total", "pattern", p) as u64,
                want,
                "{what}: instances of {p}"
            );
        }
        for name in [
            "mpi_job_wait_unresolved_total",
            "mpi_job_wait_records_lost_total",
            "mpi_job_wait_records_invalid_total",
        ] {
            assert_eq!(sum(&s, name, &[]), 0.0, "{what}: {name}");
        }
        let truth = truth_on_comms(plant.mode, &timings(&go, NP));
        let waiters = plant.waiters.len() as u32;
        against_truth(&what, &s, &truth, plant.pattern, waiters, plant.culprit);
        let waiter = sum(&s, "mpi_job_wait_waiting_rank", &[("k", "1")]) as u32;
        assert!(
            plant.waiters.contains(&waiter),
            "{what}: the waiting rank {waiter}, planted {:?}",
            plant.waiters
        );
        let _ = daemon.stop(e2e::signal::TERM);
    }
}

e2e::per_mpi!(
    plants_on_other_communicators_are_found => plants_on_other_communicators_are_found:
        openmpi, mpich
);

/// `MPI_Isendrecv` (MPI 4: MPICH here; Debian's Open MPI 4.1 has none): its
/// send is numbered when posted and its receive when its `MPI_Wait`
/// completes it, so a ring of them is matched like any other messages, and
/// the process keeps recording (it used to stop, counting them `skipped`).
/// late.c's `isendrecv`: the last rank is late, and rank 0 waits in
/// `MPI_Wait` for its message (then rank 1 for rank 0's, ...); the
/// daemon's Late Sender must equal Scalasca's formula on the ranks' own
/// timings. MPICH 4.0.2's status of a completed `MPI_Isendrecv` says
/// source 0, tag 0, count 0: the receive is numbered under the envelope it
/// was posted with.
fn isendrecv_messages_are_matched(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch(&format!("waits-isendrecv-{}", mpi.name()));
    let exe = dir.join(format!("late-{}", mpi.name()));
    compile(mpi, &program("waits/late.c"), &exe, &[]);
    let (job, mut daemon, go) = start_plant(mpi, &dir, &exe, "isendrecv");
    job.finish("OK ");
    let s = daemon.final_scrape();
    let what = format!("{mpi:?} isendrecv");
    for name in [
        "mpi_job_wait_unresolved_total",
        "mpi_job_wait_records_lost_total",
        "mpi_job_wait_records_invalid_total",
    ] {
        assert_eq!(sum(&s, name, &[]), 0.0, "{what}: {name}");
    }
    // Every rank's MPI_Wait of a sampled round completed a receive.
    let sampled = ROUNDS / P2P_PERIOD;
    assert_eq!(
        by(&s, "mpi_job_wait_instances_total", "pattern", "late_sender") as u64,
        u64::from(NP) * sampled,
        "{what}: Late Sender's instances"
    );
    // Scalasca's formula on the ranks' own timings: rank r's MPI_Wait of
    // round k waited for its left neighbour's MPI_Isendrecv of round k.
    let ranks = timings(&go, NP);
    let mut want = 0u64;
    for (r, calls) in ranks.iter().enumerate() {
        let left = (r + NP as usize - 1) % NP as usize;
        for w in calls
            .iter()
            .filter(|c| c.name == "MPI_Wait" && c.round >= 0)
            .filter(|c| (c.round as u64).is_multiple_of(P2P_PERIOD))
        {
            let sent = ranks[left]
                .iter()
                .find(|c| c.name == "MPI_Isendrecv" && c.round == w.round)
                .expect("its send");
            want += P2P_PERIOD * sent.enter.min(w.leave).saturating_sub(w.enter);
        }
    }
    let want = want as f64 / 1e9;
    let got = by(&s, "mpi_job_wait_seconds_total", "pattern", "late_sender");
    let n = by(&s, "mpi_job_wait_instances_total", "pattern", "late_sender");
    assert!(
        (got - want).abs() <= (0.05 * want).max(0.001 * n * P2P_PERIOD as f64),
        "{what}: late_sender waited {got:.4} s by the daemon, {want:.4} s by the ranks' own clocks"
    );
    let planted = (DELAY_MS * ROUNDS) as f64 / 1000.0;
    assert!(
        got >= 0.5 * planted,
        "{what}: {got:.3} s, planted {planted:.3} s"
    );
    eprintln!("{what}: late_sender {got:.3} s by the daemon, {want:.3} s by the ranks' clocks");
    assert_eq!(
        sum(&s, "mpi_job_wait_culprit_rank", &[("k", "1")]),
        f64::from(NP - 1),
        "{what}: the culprit"
    );
    // Rank 0 waits for it, then is late for rank 1 by as much, and so on
    // round the ring: the waits are passed on, their root cause the last.
    assert_ne!(
        sum(&s, "mpi_job_wait_waiting_rank", &[("k", "1")]),
        f64::from(NP - 1),
        "{what}: the waiting rank"
    );
    let _ = daemon.stop(e2e::signal::TERM);
}

e2e::per_mpi!(isendrecv_messages_are_matched => isendrecv_messages_are_matched: mpich);
