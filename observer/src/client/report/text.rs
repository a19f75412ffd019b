//! The text report: mpiP's sections, one block per job, for a terminal or a
//! job's log. Every count is printed in full; times in seconds with
//! microsecond digits, means in microseconds.

use std::fmt::Write as _;

use super::{Report, slot_label, waits::pattern_name};

/// Shortens `s` to `n` characters, marking the cut.
fn fit(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('~');
        t
    }
}

fn section(out: &mut String, title: &str) {
    let _ = writeln!(
        out,
        "\n@--- {title} {}",
        "-".repeat(66usize.saturating_sub(title.len()))
    );
}

/// Renders every report.
pub fn render(reports: &[Report]) -> String {
    let mut out = String::new();
    for (i, r) in reports.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        one(&mut out, r);
    }
    out
}

fn one(out: &mut String, r: &Report) {
    let _ = writeln!(
        out,
        "mpi-observer report: job {} ({} ranks on {})",
        r.title(),
        r.totals.ranks,
        r.hosts.join(", ")
    );
    if let Some(s) = &r.scheduler {
        let _ = writeln!(out, "Scheduler: {}", s.line(&r.jobid));
    }
    let _ = writeln!(
        out,
        "MPI time {:.6} s of {:.6} s counted ({:.2}%), {} calls",
        r.totals.mpi_seconds, r.totals.wall_seconds, r.totals.mpi_percent, r.totals.calls
    );

    section(out, "Findings");
    for (i, f) in r.findings.iter().enumerate() {
        let _ = writeln!(out, "{}. {}\n   Next: {}", i + 1, f.text, f.next);
    }
    if r.findings.is_empty() {
        let _ = writeln!(out, "(none: no rule of the report applies)");
    }

    section(out, "Time split (summed over ranks)");
    split(out, r);
    waits(out, r);

    section(out, "MPI time per rank");
    let _ = writeln!(
        out,
        "{:>6} {:<16} {:>8} {:>14} {:>14} {:>7} {:>12}  source",
        "Rank", "Host", "Pid", "Wall(s)", "MPI(s)", "MPI%", "Calls"
    );
    for l in &r.ranks {
        let _ = writeln!(
            out,
            "{:>6} {:<16} {:>8} {:>14.6} {:>14.6} {:>7.2} {:>12}  {}{}{}",
            l.rank,
            fit(&l.host, 16),
            l.pid,
            l.wall_seconds,
            l.mpi_seconds,
            l.mpi_percent,
            l.calls,
            l.source,
            if l.running { " (running)" } else { "" },
            super::step_note(l)
        );
    }

    section(out, "Top functions (summed over ranks)");
    let _ = writeln!(
        out,
        "{:<28} {:>12} {:>14} {:>7} {:>12} {:>16} {:>16}",
        "Function", "Calls", "Time(s)", "MPI%", "Mean(us)", "Bytes sent", "Bytes recv"
    );
    for f in &r.functions {
        let _ = writeln!(
            out,
            "{:<28} {:>12} {:>14.6} {:>7.2} {:>12.3} {:>16} {:>16}",
            fit(&f.name, 28),
            f.calls,
            f.seconds,
            f.mpi_percent,
            f.mean_us,
            f.bytes_sent,
            f.bytes_recv
        );
    }

    section(out, "Top call sites (summed over ranks)");
    if r.callsites.is_empty() {
        let _ = writeln!(
            out,
            "(none captured: attach with --callsites, or run the ranks under the shim's stats layer)"
        );
    } else {
        let _ = writeln!(
            out,
            "{:<24} {:<44} {:>12} {:>14} {:>12} {:>6}",
            "Function", "Call site", "Calls", "Time(s)", "Mean(us)", "Ranks"
        );
        for s in &r.callsites {
            let _ = writeln!(
                out,
                "{:<24} {:<44} {:>12} {:>14.6} {:>12.3} {:>6}",
                fit(&s.function, 24),
                fit(&s.site, 44),
                s.calls,
                s.seconds,
                s.mean_us,
                s.ranks
            );
        }
    }

    section(out, "Imbalance: time per rank (min / mean / max)");
    let _ = writeln!(
        out,
        "{:<28} {:>14} {:>14} {:>14} {:>9} {:>8}",
        "Function", "Min(s)", "Mean(s)", "Max(s)", "Max/Mean", "MaxRank"
    );
    for l in &r.imbalance {
        let _ = writeln!(
            out,
            "{:<28} {:>14.6} {:>14.6} {:>14.6} {:>9.2} {:>8}",
            fit(&l.name, 28),
            l.min_seconds,
            l.mean_seconds,
            l.max_seconds,
            l.max_over_mean,
            l.max_rank
        );
    }

    section(out, "Message sizes");
    if r.message_sizes.ranks_with_stats > 0 {
        let _ = writeln!(
            out,
            "Point-to-point messages by size, {} ranks with the stats layer:",
            r.message_sizes.ranks_with_stats
        );
        let _ = writeln!(out, "{:>10} {:>14} {:>14}", "From", "Sent", "Received");
        for (i, (s, v)) in r
            .message_sizes
            .sent
            .iter()
            .zip(&r.message_sizes.recv)
            .enumerate()
        {
            // Not `s + v`: the counts are the user's, and may sum past u64.
            if *s > 0 || *v > 0 {
                let from = if i == 0 {
                    "0B".to_string()
                } else {
                    slot_label(i, "B")
                };
                let _ = writeln!(out, "{from:>10} {s:>14} {v:>14}");
            }
        }
    } else {
        let _ = writeln!(
            out,
            "(no size histogram: the ranks ran without the shim's stats layer; mean sizes below)"
        );
    }
    if !r.message_sizes.mean_bytes.is_empty() {
        let _ = writeln!(
            out,
            "{:<28} {:>12} {:>16}",
            "Function", "Calls", "Mean bytes"
        );
        for m in &r.message_sizes.mean_bytes {
            let _ = writeln!(
                out,
                "{:<28} {:>12} {:>16.1}",
                fit(&m.name, 28),
                m.calls,
                m.mean_bytes
            );
        }
    }

    section(out, "Busiest peer pairs (point-to-point, as sent)");
    if r.peer_pairs.is_empty() {
        let _ = writeln!(
            out,
            "(none: needs the shim's stats layer, `mpi-observer run --tools stats` or attach --inject)"
        );
    } else {
        let _ = writeln!(
            out,
            "{:>6} {:>6} {:>14} {:>18}",
            "From", "To", "Messages", "Bytes"
        );
        for p in &r.peer_pairs {
            let _ = writeln!(
                out,
                "{:>6} {:>6} {:>14} {:>18}",
                p.from, p.to, p.messages, p.bytes
            );
        }
    }
}

fn split(out: &mut String, r: &Report) {
    let t = &r.split;
    let row = |out: &mut String, what: &str, v: f64| {
        let _ = writeln!(
            out,
            "{what:<34} {v:>14.6} {:>7.2}",
            super::per_cent(v, t.wall_seconds)
        );
    };
    let _ = writeln!(out, "{:<34} {:>14} {:>7}", "", "Seconds", "%");
    row(out, "Computation (outside MPI)", t.compute_seconds);
    row(out, "MPI", t.mpi_seconds);
    for (label, v) in &t.waiting {
        row(out, &format!("  waiting: {}", pattern_name(label)), *v);
    }
    if r.waits.is_some() {
        row(out, "  the rest of MPI", t.other_mpi_seconds);
    } else {
        let _ = writeln!(
            out,
            "  (waiting not measured: the ranks kept no wait records)"
        );
    }
}

fn waits(out: &mut String, r: &Report) {
    let Some(w) = &r.waits else { return };
    section(out, "Wait states (Scalasca's patterns, docs/waits.md)");
    let _ = writeln!(
        out,
        "{:<18} {:>14} {:>12} {:>7}",
        "Pattern", "Waited(s)", "Instances", "MPI%"
    );
    for p in &w.patterns {
        let _ = writeln!(
            out,
            "{:<18} {:>14.6} {:>12} {:>7.2}",
            p.name, p.seconds, p.instances, p.mpi_percent
        );
    }
    let _ = writeln!(
        out,
        "Sampled: 1 in {} collectives, {}; unresolved {}{}; pending {}; records lost {}, invalid {}{}",
        w.sample_period.max(1),
        if w.p2p_sample_period == 0 {
            "no messages".to_string()
        } else {
            format!("1 in {} messages", w.p2p_sample_period)
        },
        w.unresolved_total(),
        if w.unresolved.is_empty() {
            String::new()
        } else {
            format!(" ({})", w.reasons())
        },
        w.pending,
        w.records_lost,
        w.records_invalid,
        w.clocks()
    );
    let _ = writeln!(
        out,
        "\n{:>6} {:>14} {:>9} {:<18}   {:>6} {:>14} {:>7} {:<18}",
        "Waits", "Seconds", "OwnMPI%", "mostly", "Causes", "Seconds", "Wait%", "mostly"
    );
    for i in 0..w.waiting.len().max(w.culprits.len()) {
        let left = w.waiting.get(i).map_or_else(
            || format!("{:49}", ""),
            |l| {
                format!(
                    "{:>6} {:>14.6} {:>9.2} {:<18}",
                    l.rank,
                    l.seconds,
                    l.mpi_percent,
                    pattern_name(&l.pattern)
                )
            },
        );
        let right = w.culprits.get(i).map_or_else(String::new, |c| {
            format!(
                "{:>6} {:>14.6} {:>7.2} {:<18}",
                c.rank,
                c.seconds,
                c.wait_percent,
                pattern_name(&c.pattern)
            )
        });
        let _ = writeln!(out, "{}", format!("{left}   {right}").trim_end());
    }
    if !w.functions.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<28} {:<18} {:>14}",
            "Waited in", "Pattern", "Seconds"
        );
        for f in &w.functions {
            let _ = writeln!(
                out,
                "{:<28} {:<18} {:>14.6}",
                fit(&f.function, 28),
                pattern_name(&f.pattern),
                f.seconds
            );
        }
    }
}
