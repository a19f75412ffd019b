//! The report's findings: one plain sentence each, with the figure that
//! triggered it and the next step, the most costly first (issue 37).
//!
//! Every rule's thresholds and wording are in [`RULES`], one row each: a
//! finding is its row's `finding` and `next` with the `{names}` filled in
//! by its `check`, which also says how many seconds the finding is about
//! (the order: the most first, then the table's order; rules about the
//! figures themselves weigh nothing and come last).

use serde::Serialize;

use super::{Report, waits::pattern_name};

/// One finding of a job's report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Finding {
    /// The rule's id ([`Rule::id`]).
    pub rule: String,
    /// What was found, with its figures.
    pub text: String,
    /// What to do next.
    pub next: String,
    /// The seconds (summed over ranks) it is about.
    pub seconds: f64,
    /// The ranks it names as the ones to look at (culprits), for a program
    /// reading the JSON.
    pub ranks: Vec<u32>,
}

/// A rule: when it applies, and what it then says.
pub struct Rule {
    /// Its id, as [`Finding::rule`].
    pub id: &'static str,
    /// Its thresholds, named, in the order `check` reads them.
    pub limits: &'static [(&'static str, f64)],
    /// The finding's sentence, with `{name}`s that `check` gives.
    pub finding: &'static str,
    /// The next step, likewise.
    pub next: &'static str,
    /// Whether it applies to the report: the seconds it is about and the
    /// values of the names, with the ranks it names.
    check: fn(&Report, &Limits) -> Option<Hit>,
}

/// What a rule's check found.
struct Hit {
    seconds: f64,
    values: Vec<(&'static str, String)>,
    ranks: Vec<u32>,
}

/// A rule's thresholds, by position.
struct Limits(&'static [(&'static str, f64)]);

impl Limits {
    fn at(&self, i: usize) -> f64 {
        self.0.get(i).map_or(f64::INFINITY, |l| l.1)
    }
}

/// Every rule, in the order equal findings are given.
pub const RULES: &[Rule] = &[
    Rule {
        id: "culprit_computes_longer",
        limits: &[
            ("the culprit's share of all waiting, at least", 0.5),
            ("waiting's share of the job's MPI time, at least", 0.05),
            (
                "the culprit's computation over the others' mean, at least",
                1.2,
            ),
        ],
        finding: "{who_wait} {seconds} s ({mpi_share} of their MPI time) in {functions}, mostly for rank {culprit} ({pattern}, {culprit_share} of all waiting); rank {culprit} computes {ratio}× longer between its MPI calls than the others.{passers}",
        next: "Look at how the work is divided: rank {culprit} has more of it, or is slower at it; balancing it would save up to {seconds} s of the ranks' time.",
        check: culprit_computes_longer,
    },
    Rule {
        id: "culprit_late_otherwise",
        limits: &[
            ("the culprit's share of all waiting, at least", 0.5),
            ("waiting's share of the job's MPI time, at least", 0.05),
            (
                "the culprit's computation over the others' mean, under",
                1.2,
            ),
        ],
        finding: "{who_wait} {seconds} s ({mpi_share} of their MPI time) in {functions}, mostly for rank {culprit} ({pattern}, {culprit_share} of all waiting), though rank {culprit} computes about as long as the others ({ratio}×).{passers}",
        next: "Rank {culprit} is late for another reason: look at what it does before those calls that the others do not (I/O, its own MPI traffic with other ranks, a slower core or node).",
        check: culprit_late_otherwise,
    },
    Rule {
        id: "spread",
        limits: &[
            ("waiting's share of the job's MPI time, at least", 0.1),
            ("no culprit's share of all waiting reaches", 0.5),
        ],
        finding: "Waiting for late ranks takes {seconds} s ({mpi_share} of the job's MPI time), caused by several ranks: {culprits}.",
        next: "The work is unevenly divided among several ranks: balance it; the imbalance table shows which calls differ most between ranks.",
        check: spread,
    },
    Rule {
        id: "barrier",
        limits: &[
            ("Wait at Barrier's share of all waiting, at least", 0.2),
            ("its share of the job's MPI time, at least", 0.05),
        ],
        finding: "{seconds} s of waiting ({wait_share} of all waiting) is in MPI_Barrier.",
        next: "A barrier only moves waiting to the next call: remove those correctness does not need; the imbalance behind them stays, and then shows where data is exchanged.",
        check: barrier,
    },
    Rule {
        id: "late_sender",
        limits: &[
            ("Late Sender's share of all waiting, at least", 0.2),
            ("its share of the job's MPI time, at least", 0.05),
        ],
        finding: "{seconds} s of waiting ({wait_share} of all waiting) is receives waiting for late senders, most in {function}.",
        next: "Send as soon as the data is ready, and post receives early: MPI_Irecv before the computation and MPI_Wait after it, so a late sender costs less.",
        check: late_sender,
    },
    Rule {
        id: "late_receiver",
        limits: &[
            ("Late Receiver's share of all waiting, at least", 0.2),
            ("its share of the job's MPI time, at least", 0.05),
        ],
        finding: "{seconds} s of waiting ({wait_share} of all waiting) is sends waiting for their receivers to post the receive, most in {function}.",
        next: "Post receives early (MPI_Irecv before the computation), or send with MPI_Isend and complete it (MPI_Wait) after the computation, not before: an MPI_Ssend or MPI_Issend always waits for its receive, and an MPI_Send or MPI_Isend does too when its message is over the library's eager limit, a setting per transport (Open MPI's `ompi_info --all` and MPICH's `mpivars` list them).",
        check: late_receiver,
    },
    Rule {
        id: "communication_bound",
        limits: &[
            ("MPI's share of the run, at least", 0.3),
            ("waiting's share of MPI time, under", 0.25),
        ],
        finding: "MPI takes {mpi_share} of the run, and only {wait_share} of that is waiting for other ranks: the rest, {seconds} s, is the cost of communication itself.",
        next: "{small} of the messages are under 1 KiB: send fewer, larger messages, or overlap communication with computation (nonblocking calls).",
        check: communication_bound,
    },
    Rule {
        id: "compute_bound",
        limits: &[("MPI's share of the run, under", 0.1)],
        finding: "MPI takes {mpi_share} of the run: communication is not what limits this job.",
        next: "Look at the computation, with a sampling profiler such as perf.",
        check: compute_bound,
    },
    Rule {
        id: "unresolved",
        limits: &[("unresolved share of instances and messages, at least", 0.1)],
        finding: "{count} of {total} collective instances and messages could not be evaluated ({reasons}): the waiting figures are a lower bound.",
        next: "{why}",
        check: unresolved,
    },
    Rule {
        id: "records_lost",
        limits: &[("records lost, at least", 1.0)],
        finding: "{lost} wait records were overwritten before the daemon read them: the waiting figures miss them.",
        next: "Record fewer: MPI_OBSERVER_WAITS=8 and MPI_OBSERVER_WAITS_P2P=64 sample one in 8 collectives and one in 64 messages, on every rank alike.",
        check: records_lost,
    },
    Rule {
        id: "not_measured",
        limits: &[],
        finding: "Who waits for whom was not measured: the ranks ran without the shim's wait records.",
        next: "Run the job under the shim's stats layer (`mpirun -np N mpi-observer run --tools stats -- ./app`) to see which rank makes the others wait.",
        check: not_measured,
    },
];

/// What to do about unresolved instances, by their main reason.
const UNRESOLVED_NEXT: &[(&str, &str)] = &[
    (
        "incomplete",
        "Instances missed a rank: ranks on other nodes whose daemons do not ship their records to this one's (give each daemon the others with --waits.peers), or ranks without the shim's wait records (docs/waits.md).",
    ),
    (
        "skipped",
        "A rank lost count of its messages (MPI_Isendrecv, a cancelled send, a full envelope table): its Late Sender and Late Receiver figures are partial (docs/waits.md).",
    ),
    (
        "mismatch",
        "The ranks' records disagree: the program's ranks did not call the same collectives in the same order, or records were overwritten.",
    ),
    (
        "clock",
        "Waits were shorter than what the nodes' clocks can tell apart (the job synchronises too rarely for their offsets to be bound), or the ranks' records were kept on different clocks, or the CPU counter's rate never came: check the node's clocksource (docs/waits.md, \"Across nodes\").",
    ),
    (
        "overflow",
        "Too many instances waited for their members at once: sample with MPI_OBSERVER_WAITS=8.",
    ),
];

/// The findings of `rep`, the most costly first.
pub fn findings(rep: &Report) -> Vec<Finding> {
    let mut out: Vec<Finding> = RULES
        .iter()
        .filter_map(|rule| {
            let hit = (rule.check)(rep, &Limits(rule.limits))?;
            Some(Finding {
                rule: rule.id.into(),
                text: fill(rule.finding, &hit.values),
                next: fill(rule.next, &hit.values),
                seconds: hit.seconds,
                ranks: hit.ranks,
            })
        })
        .collect();
    // Stable: equal weights keep the table's order.
    out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    out
}

/// `t` with each `{name}` of `values` replaced, in one pass: a value that
/// holds a `{name}` itself (a function name from a report file) stays as
/// it is.
fn fill(t: &str, values: &[(&str, String)]) -> String {
    let mut out = String::with_capacity(t.len() + 64);
    let mut rest = t;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let value = after.find('}').and_then(|close| {
            let name = &after[..close];
            values
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (v, close))
        });
        match value {
            Some((v, close)) => {
                out.push_str(v);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Seconds as a reader wants them: three figures.
pub fn secs(x: f64) -> String {
    match x.abs() {
        a if a >= 100.0 => format!("{x:.0}"),
        a if a >= 10.0 => format!("{x:.1}"),
        a if a >= 1.0 => format!("{x:.2}"),
        _ => format!("{x:.3}"),
    }
}

fn pct(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:.0}%", part / whole * 100.0)
    } else {
        "0%".into()
    }
}

/// Ranks as a reader wants them: `0–2, 5 and 7`, at most 8 runs.
pub fn rank_list(ranks: &[u32]) -> String {
    let mut v = ranks.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for r in v {
        match runs.last_mut() {
            Some(last) if last.1.checked_add(1) == Some(r) => last.1 = r,
            _ => runs.push((r, r)),
        }
    }
    let shown = runs.len().min(8);
    let mut parts: Vec<String> = runs[..shown]
        .iter()
        .map(|&(a, b)| match b - a {
            0 => a.to_string(),
            1 => format!("{a}, {b}"),
            _ => format!("{a}–{b}"),
        })
        .collect();
    if runs.len() > shown {
        parts.push(format!("{} more", runs.len() - shown));
    }
    match parts.len() {
        0 => String::new(),
        1 => parts.remove(0),
        n => format!("{} and {}", parts[..n - 1].join(", "), parts[n - 1]),
    }
}

/// A rank's seconds outside MPI, from its line.
fn compute_of(rep: &Report, rank: u32) -> Option<f64> {
    rep.ranks
        .iter()
        .find(|l| l.rank == rank.to_string())
        .map(|l| (l.wall_seconds - l.mpi_seconds).max(0.0))
}

/// The facts of a job whose waiting has one main culprit.
struct Culprit {
    hit: Hit,
    /// Its computation over the others' mean (0 when not known).
    ratio: f64,
}

/// MPI function `function` as a finding names it: with the call site the
/// job spent the most time in it from (`MPI_Waitall (called from main at
/// traffic.c:38)`), when call sites were captured; the wait records name
/// the function, not the site, so this is the site of that function's
/// time, where the waiting is when one call site dominates.
fn called_from(rep: &Report, function: &str) -> String {
    // The report's sites are the most time first.
    match rep.callsites.iter().find(|s| s.function == function) {
        Some(s) => format!("{function} (called from {})", s.site),
        None => function.to_string(),
    }
}

fn culprit(rep: &Report, l: &Limits) -> Option<Culprit> {
    let w = rep.waits.as_ref()?;
    let c = w.culprits.first()?;
    if w.seconds <= 0.0
        || c.seconds < l.at(0) * w.seconds
        || w.seconds < l.at(1) * rep.totals.mpi_seconds
    {
        return None;
    }
    // The ranks that waited, but the culprit: those with a tenth of the
    // longest wait or more.
    let longest = w.waiting.first().map_or(0.0, |r| r.seconds);
    let waiters: Vec<&super::waits::WaitRankLine> = w
        .waiting
        .iter()
        .filter(|r| r.rank != c.rank && r.seconds >= longest / 10.0)
        .collect();
    let ranks: Vec<u32> = waiters.iter().map(|r| r.rank).collect();
    let waited: f64 = waiters.iter().map(|r| r.seconds).sum();
    let their_mpi: f64 = rep
        .ranks
        .iter()
        .filter(|line| ranks.iter().any(|r| line.rank == r.to_string()))
        .map(|line| line.mpi_seconds)
        .sum();
    let who_wait = match ranks.as_slice() {
        [] => "Ranks wait".to_string(),
        [one] => format!("Rank {one} waits"),
        many => format!("Ranks {} wait", rank_list(many)),
    };
    // The call waited in most, and the next if it has a quarter of that:
    // a call's seconds summed over its patterns (MPI_Waitall waits both
    // for late senders and for late receivers), so it is named once.
    let mut by_function: Vec<(&str, f64)> = Vec::new();
    for f in &w.functions {
        match by_function.iter_mut().find(|(n, _)| *n == f.function) {
            Some((_, s)) => *s += f.seconds,
            None => by_function.push((&f.function, f.seconds)),
        }
    }
    by_function.sort_by(|a, b| b.1.total_cmp(&a.1));
    let most = by_function.first().map_or(0.0, |f| f.1);
    let functions: Vec<String> = by_function
        .iter()
        .take(2)
        .filter(|f| f.1 >= most / 4.0)
        .map(|f| called_from(rep, f.0))
        .collect();
    let functions = if functions.is_empty() {
        "MPI calls".to_string()
    } else {
        functions.join(" and ")
    };
    let others: Vec<f64> = rep
        .ranks
        .iter()
        .filter(|line| line.rank != c.rank.to_string())
        .map(|line| (line.wall_seconds - line.mpi_seconds).max(0.0))
        .collect();
    let mean = others.iter().sum::<f64>() / others.len().max(1) as f64;
    let ratio = match compute_of(rep, c.rank) {
        Some(mine) if mean > 0.0 => mine / mean,
        _ => 0.0,
    };
    // Ranks the others also waited for, late only from waiting
    // themselves: the wait they passed on is in the culprit's figure.
    let passers = match w.passers.as_slice() {
        [] => String::new(),
        [one] => format!(" Rank {one} came late too, only from waiting itself."),
        many => format!(
            " Ranks {} came late too, only from waiting themselves.",
            rank_list(many)
        ),
    };
    let hit = Hit {
        seconds: w.seconds,
        values: vec![
            ("passers", passers),
            ("who_wait", who_wait),
            ("seconds", secs(waited)),
            ("mpi_share", pct(waited, their_mpi)),
            ("functions", functions),
            ("culprit", c.rank.to_string()),
            ("pattern", pattern_name(&c.pattern).into()),
            ("culprit_share", pct(c.seconds, w.seconds)),
            ("ratio", format!("{ratio:.1}")),
        ],
        ranks: vec![c.rank],
    };
    Some(Culprit { hit, ratio })
}

fn culprit_computes_longer(rep: &Report, l: &Limits) -> Option<Hit> {
    let c = culprit(rep, l)?;
    (c.ratio >= l.at(2)).then_some(c.hit)
}

fn culprit_late_otherwise(rep: &Report, l: &Limits) -> Option<Hit> {
    let c = culprit(rep, l)?;
    (c.ratio < l.at(2)).then_some(c.hit)
}

fn spread(rep: &Report, l: &Limits) -> Option<Hit> {
    let w = rep.waits.as_ref()?;
    let mpi = rep.totals.mpi_seconds;
    if w.seconds <= 0.0 || w.seconds < l.at(0) * mpi {
        return None;
    }
    if w.culprits.first()?.seconds >= l.at(1) * w.seconds {
        return None;
    }
    let culprits: Vec<String> = w
        .culprits
        .iter()
        .take(4)
        .map(|c| format!("rank {} ({})", c.rank, pct(c.seconds, w.seconds)))
        .collect();
    Some(Hit {
        seconds: w.seconds,
        values: vec![
            ("seconds", secs(w.seconds)),
            ("mpi_share", pct(w.seconds, mpi)),
            ("culprits", culprits.join(", ")),
        ],
        ranks: w.culprits.iter().take(4).map(|c| c.rank).collect(),
    })
}

/// A pattern's finding: its seconds, when they reach both limits.
fn pattern_share(rep: &Report, l: &Limits, label: &str) -> Option<(f64, String)> {
    let w = rep.waits.as_ref()?;
    let s = w.pattern_seconds(label);
    if s <= 0.0 || s < l.at(0) * w.seconds || s < l.at(1) * rep.totals.mpi_seconds {
        return None;
    }
    Some((s, pct(s, w.seconds)))
}

fn barrier(rep: &Report, l: &Limits) -> Option<Hit> {
    let (s, share) = pattern_share(rep, l, "wait_barrier")?;
    Some(Hit {
        seconds: s,
        values: vec![("seconds", secs(s)), ("wait_share", share)],
        ranks: Vec::new(),
    })
}

fn late_sender(rep: &Report, l: &Limits) -> Option<Hit> {
    message_pattern(rep, l, "late_sender", "receives")
}

fn late_receiver(rep: &Report, l: &Limits) -> Option<Hit> {
    message_pattern(rep, l, "late_receiver", "sends")
}

/// A message pattern's finding: its seconds and share, with the call
/// waited in most under it (`calls` when none is named).
fn message_pattern(rep: &Report, l: &Limits, label: &str, calls: &str) -> Option<Hit> {
    let (s, share) = pattern_share(rep, l, label)?;
    let function = rep
        .waits
        .as_ref()?
        .functions
        .iter()
        .find(|f| f.pattern == label)
        .map_or(calls.to_string(), |f| called_from(rep, &f.function));
    Some(Hit {
        seconds: s,
        values: vec![
            ("seconds", secs(s)),
            ("wait_share", share),
            ("function", function),
        ],
        ranks: Vec::new(),
    })
}

fn communication_bound(rep: &Report, l: &Limits) -> Option<Hit> {
    let w = rep.waits.as_ref()?;
    let (wall, mpi) = (rep.totals.wall_seconds, rep.totals.mpi_seconds);
    if wall <= 0.0 || mpi < l.at(0) * wall || w.seconds >= l.at(1) * mpi {
        return None;
    }
    // Messages under 1 KiB: slots below 2^10.
    let sizes = &rep.message_sizes;
    let all = |v: &[u64]| v.iter().copied().fold(0u64, u64::saturating_add);
    let small = all(&sizes.sent[..sizes.sent.len().min(10)]);
    Some(Hit {
        seconds: (mpi - w.seconds).max(0.0),
        values: vec![
            ("mpi_share", pct(mpi, wall)),
            ("wait_share", pct(w.seconds, mpi)),
            ("seconds", secs((mpi - w.seconds).max(0.0))),
            ("small", pct(small as f64, all(&sizes.sent) as f64)),
        ],
        ranks: Vec::new(),
    })
}

fn compute_bound(rep: &Report, l: &Limits) -> Option<Hit> {
    let (wall, mpi) = (rep.totals.wall_seconds, rep.totals.mpi_seconds);
    if wall <= 0.0 || mpi >= l.at(0) * wall {
        return None;
    }
    Some(Hit {
        seconds: wall - mpi,
        values: vec![("mpi_share", pct(mpi, wall))],
        ranks: Vec::new(),
    })
}

fn unresolved(rep: &Report, l: &Limits) -> Option<Hit> {
    let w = rep.waits.as_ref()?;
    let count = w.unresolved_total();
    let total = count.saturating_add(w.instances);
    if count == 0 || (count as f64) < l.at(0) * total as f64 {
        return None;
    }
    let main = w.unresolved.iter().max_by_key(|u| u.1)?;
    let why = UNRESOLVED_NEXT
        .iter()
        .find(|(r, _)| *r == main.0)
        .map_or("See docs/waits.md.", |(_, t)| *t);
    Some(Hit {
        seconds: 0.0,
        values: vec![
            ("count", count.to_string()),
            ("total", total.to_string()),
            ("reasons", w.reasons()),
            ("why", why.to_string()),
        ],
        ranks: Vec::new(),
    })
}

fn records_lost(rep: &Report, l: &Limits) -> Option<Hit> {
    let w = rep.waits.as_ref()?;
    if (w.records_lost as f64) < l.at(0) {
        return None;
    }
    Some(Hit {
        seconds: 0.0,
        values: vec![("lost", w.records_lost.to_string())],
        ranks: Vec::new(),
    })
}

fn not_measured(rep: &Report, _: &Limits) -> Option<Hit> {
    rep.waits.is_none().then(|| Hit {
        seconds: 0.0,
        values: Vec::new(),
        ranks: Vec::new(),
    })
}

#[cfg(test)]
mod tests;
