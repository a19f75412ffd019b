//! The live per-rank table the demo prints: calls, MPI time and the top
//! functions by time, refreshed every second.

use std::fmt::Write as _;

use observer_common::FUNCTIONS;

use crate::collect::snapshot::{RankSnapshot, Snapshot};

/// Renders the table for the ranks in `snap`.
pub fn table(snap: &Snapshot) -> String {
    let mut rows: Vec<(&RankSnapshot, u64, u64, String)> = snap
        .ranks
        .iter()
        .map(|r| {
            let s = r.calls.as_ref();
            let calls = s.map(|s| s.values().map(|c| c.calls).sum()).unwrap_or(0);
            let ns = s.map(|s| s.values().map(|c| c.time_ns).sum()).unwrap_or(0);
            let mut top: Vec<(u16, u64)> = s
                .map(|s| s.iter().map(|(id, c)| (*id, c.time_ns)).collect())
                .unwrap_or_default();
            top.sort_by_key(|t| std::cmp::Reverse(t.1));
            let top = top
                .iter()
                .take(3)
                .map(|(id, t)| format!("{} {:.2}s", FUNCTIONS[*id as usize].name, *t as f64 / 1e9))
                .collect::<Vec<_>>()
                .join(", ");
            (r, calls, ns, top)
        })
        .collect();
    rows.sort_by(|a, b| {
        (
            a.0.identity.jobid.as_str(),
            a.0.identity.rank.parse::<u64>().unwrap_or(u64::MAX),
        )
            .cmp(&(
                b.0.identity.jobid.as_str(),
                b.0.identity.rank.parse::<u64>().unwrap_or(u64::MAX),
            ))
    });
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<18} {:>5} {:>8} {:>10} {:>9}  top functions by time",
        "job", "rank", "pid", "calls", "MPI s"
    );
    for (r, calls, ns, top) in rows {
        let state = if !r.running() { " (exited)" } else { "" };
        let _ = writeln!(
            out,
            "{:<18} {:>5} {:>8} {:>10} {:>9.2}  {top}{state}",
            truncate(&r.identity.jobid, 18),
            r.identity.rank,
            r.pid,
            calls,
            ns as f64 / 1e9
        );
    }
    out
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}
