//! One scenario per rule of [`RULES`]: the rule applies with the figures
//! that should trigger it, names what it should, and does not apply just
//! below its thresholds.

use std::collections::BTreeSet;

use super::{super::waits, *};
use crate::client::report::{
    RankLine, Report,
    waits::{CulpritLine, FunctionWaitLine, PatternLine, WaitRankLine, WaitSummary},
};

fn line(rank: u32, wall: f64, mpi: f64) -> RankLine {
    RankLine {
        rank: rank.to_string(),
        wall_seconds: wall,
        mpi_seconds: mpi,
        ..Default::default()
    }
}

/// A job's report with these rank lines and wait states.
fn report(lines: Vec<RankLine>, w: Option<WaitSummary>) -> Report {
    let mut r = Report::default();
    r.totals.ranks = lines.len();
    r.totals.wall_seconds = lines.iter().map(|l| l.wall_seconds).sum();
    r.totals.mpi_seconds = lines.iter().map(|l| l.mpi_seconds).sum();
    r.ranks = lines;
    r.waits = w;
    r.split = waits::split(&r);
    r
}

/// Wait states: seconds per pattern, per waiting rank, per culprit (each
/// charged with the first pattern), per (function, pattern).
fn wait_states(
    patterns: &[(&str, f64)],
    waiting: &[(u32, f64)],
    culprits: &[(u32, f64)],
    functions: &[(&str, &str, f64)],
) -> WaitSummary {
    let total: f64 = patterns.iter().map(|p| p.1).sum();
    let main = patterns.first().map_or("", |p| p.0).to_string();
    WaitSummary {
        seconds: total,
        patterns: patterns
            .iter()
            .map(|(p, s)| PatternLine {
                pattern: (*p).into(),
                name: waits::pattern_name(p).into(),
                seconds: *s,
                instances: 100,
                mpi_percent: 0.0,
            })
            .collect(),
        waiting: waiting
            .iter()
            .map(|&(rank, seconds)| WaitRankLine {
                rank,
                seconds,
                mpi_percent: 0.0,
                pattern: main.clone(),
            })
            .collect(),
        culprits: culprits
            .iter()
            .map(|&(rank, seconds)| CulpritLine {
                rank,
                seconds,
                wait_percent: seconds / total * 100.0,
                pattern: main.clone(),
                late_seconds: seconds,
            })
            .collect(),
        functions: functions
            .iter()
            .map(|(f, p, s)| FunctionWaitLine {
                function: (*f).into(),
                pattern: (*p).into(),
                seconds: *s,
            })
            .collect(),
        instances: 100 * patterns.len() as u64,
        sample_period: 1,
        p2p_sample_period: 8,
        ..Default::default()
    }
}

/// The findings' rule ids, in order; every one's text whole.
fn ids(r: &Report) -> Vec<String> {
    let f = findings(r);
    for x in &f {
        assert!(
            !x.text.contains('{') && !x.next.contains('{'),
            "a name left unfilled: {x:?}"
        );
        assert!(!x.text.is_empty() && !x.next.is_empty());
    }
    f.into_iter().map(|x| x.rule).collect()
}

/// The demo's shape: rank 3 computes 2.5 times as long; ranks 0-2 wait for
/// it in Allreduce (24 s) and, rank 0, in Waitall (6 s).
fn demo() -> Report {
    let lines = vec![
        line(0, 20.0, 12.0),
        line(1, 20.0, 12.0),
        line(2, 20.0, 12.0),
        line(3, 20.0, 0.0),
    ];
    let w = wait_states(
        &[("wait_nxn", 24.0), ("late_sender", 6.0)],
        &[(0, 14.0), (1, 8.0), (2, 8.0)],
        &[(3, 30.0)],
        &[
            ("MPI_Allreduce", "wait_nxn", 24.0),
            ("MPI_Waitall", "late_sender", 6.0),
        ],
    );
    report(lines, Some(w))
}

#[test]
fn the_demos_first_finding_names_its_late_rank_and_what_to_do() {
    let r = demo();
    let f = findings(&r);
    assert_eq!(ids(&r), ["culprit_computes_longer", "late_sender"]);
    assert_eq!(f[0].ranks, [3]);
    assert_eq!(
        f[0].text,
        "Ranks 0–2 wait 30.0 s (83% of their MPI time) in MPI_Allreduce and MPI_Waitall, \
         mostly for rank 3 (Wait at N×N, 100% of all waiting); rank 3 computes 2.5× longer \
         between its MPI calls than the others."
    );
    assert!(f[0].next.contains("rank 3 has more of it"), "{}", f[0].next);
    assert_eq!(f[0].seconds, 30.0);
    assert_eq!(
        f[1].text,
        "6.00 s of waiting (20% of all waiting) is receives waiting for late senders, most in MPI_Waitall."
    );
}

#[test]
fn a_call_waited_in_under_two_patterns_is_named_once_with_their_sum() {
    // MPI_Waitall waits for late senders and late receivers: 5 + 2 s, more
    // than MPI_Allreduce's 6 s, so it comes first, and only once.
    let mut r = demo();
    r.waits.as_mut().unwrap().functions = wait_states(
        &[],
        &[],
        &[],
        &[
            ("MPI_Allreduce", "wait_nxn", 6.0),
            ("MPI_Waitall", "late_sender", 5.0),
            ("MPI_Waitall", "late_receiver", 2.0),
        ],
    )
    .functions;
    let f = findings(&r);
    assert!(
        f[0].text
            .contains(" in MPI_Waitall and MPI_Allreduce, mostly"),
        "{}",
        f[0].text
    );
}

#[test]
fn ranks_that_passed_a_wait_on_are_named_as_such() {
    let mut r = demo();
    r.waits.as_mut().unwrap().passers = vec![0, 1];
    let f = findings(&r);
    assert!(
        f[0].text
            .ends_with("than the others. Ranks 0, 1 came late too, only from waiting themselves."),
        "{}",
        f[0].text
    );
    r.waits.as_mut().unwrap().passers = vec![0];
    assert!(
        findings(&r)[0]
            .text
            .ends_with(" Rank 0 came late too, only from waiting itself.")
    );
}

#[test]
fn a_culprit_that_computes_no_longer_is_late_for_another_reason() {
    let mut r = demo();
    r.ranks[3] = line(3, 20.0, 12.0);
    r.totals.mpi_seconds = 48.0;
    assert_eq!(ids(&r)[0], "culprit_late_otherwise");
    let f = findings(&r);
    assert!(
        f[0].text
            .contains("computes about as long as the others (1.0×)"),
        "{}",
        f[0].text
    );
    assert_eq!(f[0].ranks, [3]);
}

#[test]
fn a_culprit_needs_half_the_waiting_and_waiting_a_twentieth_of_mpi() {
    // Rank 3 causes 49%: several ranks, not one.
    let mut r = demo();
    let w = r.waits.as_mut().unwrap();
    w.culprits = vec![
        CulpritLine {
            rank: 3,
            seconds: 14.7,
            ..Default::default()
        },
        CulpritLine {
            rank: 1,
            seconds: 9.0,
            ..Default::default()
        },
        CulpritLine {
            rank: 2,
            seconds: 6.3,
            ..Default::default()
        },
    ];
    let got = ids(&r);
    assert_eq!(got[0], "spread");
    assert!(!got.iter().any(|i| i.starts_with("culprit")));
    let f = findings(&r);
    assert_eq!(f[0].ranks, [3, 1, 2]);
    assert!(
        f[0].text
            .contains("rank 3 (49%), rank 1 (30%), rank 2 (21%)"),
        "{}",
        f[0].text
    );
    // At exactly half it is the culprit's.
    r.waits.as_mut().unwrap().culprits[0].seconds = 15.0;
    assert_eq!(ids(&r)[0], "culprit_computes_longer");
    // Waiting under 5% of MPI time says nothing of culprits or spread.
    let mut r = demo();
    r.totals.mpi_seconds = 30.0 / 0.049;
    let got = ids(&r);
    assert!(
        !got.iter()
            .any(|i| i.starts_with("culprit") || i == "spread"),
        "{got:?}"
    );
}

#[test]
fn barrier_waiting_says_barriers_only_move_it() {
    let lines = vec![line(0, 10.0, 6.0), line(1, 10.0, 1.0)];
    let w = wait_states(
        &[("wait_barrier", 2.0), ("wait_nxn", 3.0)],
        &[(0, 5.0)],
        &[(1, 5.0)],
        &[("MPI_Barrier", "wait_barrier", 2.0)],
    );
    let r = report(lines.clone(), Some(w.clone()));
    let got = ids(&r);
    assert!(got.contains(&"barrier".to_string()), "{got:?}");
    let f = findings(&r);
    let b = f.iter().find(|f| f.rule == "barrier").unwrap();
    assert_eq!(
        b.text,
        "2.00 s of waiting (40% of all waiting) is in MPI_Barrier."
    );
    // Under a fifth of the waiting: not a finding of its own.
    let mut w2 = w;
    w2.patterns[0].seconds = 0.99;
    w2.patterns[1].seconds = 4.01;
    assert!(!ids(&report(lines, Some(w2))).contains(&"barrier".to_string()));
}

/// Rank 0 sends to rank 1, which computes 1.6 times as long and posts its
/// receives late: rank 0 waits 6 s in MPI_Ssend and MPI_Send for it (Late
/// Receiver), and 4 s in MPI_Allreduce.
fn late_receivers(late: f64, nxn: f64) -> Report {
    let lines = vec![line(0, 20.0, 10.0), line(1, 20.0, 4.0)];
    let w = wait_states(
        &[("late_receiver", late), ("wait_nxn", nxn)],
        &[(0, late + nxn)],
        &[(1, late + nxn)],
        &[
            ("MPI_Ssend", "late_receiver", late * 2.0 / 3.0),
            ("MPI_Allreduce", "wait_nxn", nxn),
            ("MPI_Send", "late_receiver", late / 3.0),
        ],
    );
    report(lines, Some(w))
}

#[test]
fn sends_waiting_for_late_receivers_are_told_to_post_receives_early() {
    let r = late_receivers(6.0, 4.0);
    assert_eq!(ids(&r), ["culprit_computes_longer", "late_receiver"]);
    let f = findings(&r);
    assert!(
        f[0].text
            .contains("mostly for rank 1 (Late Receiver, 100% of all waiting)"),
        "{}",
        f[0].text
    );
    assert_eq!(f[0].ranks, [1]);
    assert_eq!(
        f[1].text,
        "6.00 s of waiting (60% of all waiting) is sends waiting for their receivers to post the \
         receive, most in MPI_Ssend."
    );
    assert_eq!(
        f[1].next,
        "Post receives early (MPI_Irecv before the computation), or send with MPI_Isend and \
         complete it (MPI_Wait) after the computation, not before: an MPI_Ssend or MPI_Issend \
         always waits for its receive, and an MPI_Send or MPI_Isend does too when its message \
         is over the library's eager limit, a setting per transport (Open MPI's `ompi_info \
         --all` and MPICH's `mpivars` list them)."
    );
    assert_eq!(f[1].seconds, 6.0);
    assert!(f[1].ranks.is_empty());
    // No call named under it: the sends.
    let mut r2 = late_receivers(6.0, 4.0);
    r2.waits
        .as_mut()
        .unwrap()
        .functions
        .retain(|f| f.pattern != "late_receiver");
    let f = findings(&r2);
    let lr = f.iter().find(|f| f.rule == "late_receiver").unwrap();
    assert!(lr.text.ends_with(", most in sends."), "{}", lr.text);
    // At exactly a fifth of the waiting it is a finding; under it, not.
    assert!(ids(&late_receivers(2.0, 8.0)).contains(&"late_receiver".to_string()));
    assert!(!ids(&late_receivers(1.99, 8.01)).contains(&"late_receiver".to_string()));
    // Under a twentieth of the job's MPI time: not a finding either.
    let mut r3 = late_receivers(6.0, 4.0);
    r3.totals.mpi_seconds = 6.0 / 0.049;
    assert!(!ids(&r3).contains(&"late_receiver".to_string()));
    // Late Sender's rule is about receives: it stays silent.
    assert!(!ids(&r).contains(&"late_sender".to_string()));
    assert!(!ids(&demo()).contains(&"late_receiver".to_string()));
}

#[test]
fn a_job_that_mostly_moves_data_is_told_about_its_message_sizes() {
    // 45% MPI, of which 2 s of 36 s waiting; 90% of messages small.
    let lines: Vec<RankLine> = (0..4).map(|r| line(r, 20.0, 9.0)).collect();
    let w = wait_states(
        &[("wait_nxn", 2.0)],
        &[(0, 2.0)],
        &[(3, 2.0)],
        &[("MPI_Allreduce", "wait_nxn", 2.0)],
    );
    let mut r = report(lines.clone(), Some(w.clone()));
    r.message_sizes.sent = vec![0; 32];
    r.message_sizes.sent[3] = 90;
    r.message_sizes.sent[12] = 10;
    assert_eq!(ids(&r)[0], "communication_bound");
    let f = findings(&r);
    assert_eq!(
        f[0].text,
        "MPI takes 45% of the run, and only 6% of that is waiting for other ranks: the rest, 34.0 s, \
         is the cost of communication itself."
    );
    assert!(
        f[0].next.starts_with("90% of the messages are under 1 KiB"),
        "{}",
        f[0].next
    );
    // Under 30% MPI: not communication bound.
    let lines: Vec<RankLine> = (0..4).map(|r| line(r, 20.0, 5.9)).collect();
    assert!(!ids(&report(lines, Some(w))).contains(&"communication_bound".to_string()));
}

#[test]
fn a_job_with_little_mpi_is_sent_to_its_computation() {
    let lines: Vec<RankLine> = (0..2).map(|r| line(r, 20.0, 1.8)).collect();
    let r = report(lines, None);
    assert_eq!(ids(&r), ["compute_bound", "not_measured"]);
    assert_eq!(
        findings(&r)[0].text,
        "MPI takes 9% of the run: communication is not what limits this job."
    );
    let lines: Vec<RankLine> = (0..2).map(|r| line(r, 20.0, 2.0)).collect();
    assert_eq!(ids(&report(lines, None)), ["not_measured"]);
}

#[test]
fn partial_figures_are_said_with_their_reason() {
    let mut r = demo();
    let w = r.waits.as_mut().unwrap();
    // 200 evaluated, 22 incomplete and 1 clock: 10.3%.
    w.unresolved = vec![("clock".into(), 1), ("incomplete".into(), 22)];
    w.records_lost = 3;
    let got = ids(&r);
    assert!(
        got.ends_with(&["unresolved".to_string(), "records_lost".to_string()]),
        "{got:?}"
    );
    let f = findings(&r);
    let u = f.iter().find(|f| f.rule == "unresolved").unwrap();
    assert_eq!(
        u.text,
        "23 of 223 collective instances and messages could not be evaluated (1 clock, 22 incomplete): \
         the waiting figures are a lower bound."
    );
    assert!(u.next.contains("ranks on other nodes"), "{}", u.next);
    let l = f.iter().find(|f| f.rule == "records_lost").unwrap();
    assert!(
        l.text.starts_with("3 wait records were overwritten"),
        "{}",
        l.text
    );
    // Under a tenth: not said.
    r.waits.as_mut().unwrap().unresolved = vec![("incomplete".into(), 22)];
    assert!(!ids(&r).contains(&"unresolved".to_string()));
}

#[test]
fn every_rule_has_a_scenario_and_ids_are_unique() {
    let mut fired = BTreeSet::new();
    let mut skew = demo();
    skew.ranks[3] = line(3, 20.0, 12.0);
    skew.totals.mpi_seconds = 48.0;
    let mut spread = demo();
    spread.waits.as_mut().unwrap().culprits = vec![
        CulpritLine {
            rank: 1,
            seconds: 10.0,
            ..Default::default()
        },
        CulpritLine {
            rank: 3,
            seconds: 10.0,
            ..Default::default()
        },
    ];
    let mut partial = demo();
    partial.waits.as_mut().unwrap().unresolved = vec![("mismatch".into(), 100)];
    partial.waits.as_mut().unwrap().records_lost = 1;
    let barrier = report(
        vec![line(0, 10.0, 6.0), line(1, 10.0, 1.0)],
        Some(wait_states(
            &[("wait_barrier", 5.0)],
            &[(0, 5.0)],
            &[(1, 5.0)],
            &[],
        )),
    );
    let mut comm = report(
        (0..4).map(|r| line(r, 20.0, 9.0)).collect(),
        Some(wait_states(
            &[("wait_nxn", 2.0)],
            &[(0, 2.0)],
            &[(3, 2.0)],
            &[],
        )),
    );
    comm.message_sizes.sent = vec![1; 32];
    let idle = report(vec![line(0, 20.0, 0.5)], None);
    for r in [
        demo(),
        skew,
        spread,
        partial,
        barrier,
        late_receivers(6.0, 4.0),
        comm,
        idle,
    ] {
        fired.extend(ids(&r));
    }
    let all: BTreeSet<String> = RULES.iter().map(|r| r.id.to_string()).collect();
    assert_eq!(all.len(), RULES.len(), "ids are unique");
    assert_eq!(fired, all);
}

#[test]
fn names_are_filled_once_and_unknown_ones_kept() {
    let v = [("a", "{b}".to_string()), ("b", "B".to_string())];
    assert_eq!(fill("x {a} {b} {c} {", &v), "x {b} B {c} {");
    assert_eq!(fill("", &v), "");
    assert_eq!(fill("{a}{a}", &v), "{b}{b}");
}

#[test]
fn rank_lists_read_as_ranges() {
    assert_eq!(rank_list(&[]), "");
    assert_eq!(rank_list(&[3]), "3");
    assert_eq!(rank_list(&[2, 0, 1]), "0–2");
    assert_eq!(rank_list(&[0, 1, 5]), "0, 1 and 5");
    assert_eq!(rank_list(&[0, 1, 2, 7, 9, 10]), "0–2, 7 and 9, 10");
    let many: Vec<u32> = (0..40).map(|i| i * 2).collect();
    assert_eq!(rank_list(&many), "0, 2, 4, 6, 8, 10, 12, 14 and 32 more");
    assert_eq!(
        rank_list(&[u32::MAX - 1, u32::MAX]),
        format!("{}, {}", u32::MAX - 1, u32::MAX)
    );
    assert_eq!(secs(30.0), "30.0");
    assert_eq!(secs(0.0123), "0.012");
    assert_eq!(secs(123.4), "123");
}
