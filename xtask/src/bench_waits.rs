//! `cargo xtask bench waits`: the daemon's CPU for matching wait records
//! (issue 37) at 128 ranks a node.
//!
//! Runs `cargo bench -p mpi-observer --bench waits` (observer/benches/waits.rs),
//! which makes the records the shim writes for simulated jobs (collectives
//! at 100, 1 k and 10 k a second per rank; a halo exchange at 1 k, 10 k and
//! 100 k messages a second per rank, one in 8 recorded; each on one node and
//! on 3, the peers' records through `add_remote`) and feeds them to the
//! matcher in 250 ms drains, timing `Waits::add` and `Waits::settle` in
//! thread CPU time. The scenarios run round-robin, 7 times each; the report
//! quotes medians. Pure CPU: no root, no MPI. Results go to
//! `docs/benchmarks-waits.md`, with the machine; BENCHMARKS.md quotes them.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    path::Path,
    process::Stdio,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench_common::{loadavg, machine, median, spread, write_report},
    cargo,
};

/// One run's `key=value` words.
type Words = BTreeMap<String, String>;

fn words(line: &str) -> Words {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn num(w: &Words, key: &str) -> Result<f64> {
    w.get(key)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no number {key}= in the bench's line"))
}

/// The runs of one scenario.
struct Scenario {
    name: String,
    runs: Vec<Words>,
}

impl Scenario {
    /// The name as the report shows it: `coll-1k ×3`.
    fn shown(&self) -> String {
        self.name.replace('x', " ×")
    }

    fn each(&self, f: impl Fn(&Words) -> Result<f64>) -> Result<Vec<f64>> {
        self.runs.iter().map(f).collect()
    }

    fn median(&self, f: impl Fn(&Words) -> Result<f64>) -> Result<f64> {
        Ok(median(&self.each(f)?))
    }

    /// The median count of each reason `unresolved=` gives, the non-zero
    /// ones, per second of the job.
    fn unresolved(&self, seconds: f64) -> String {
        let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in &self.runs {
            for part in r.get("unresolved").map_or("", String::as_str).split(',') {
                if let Some((k, v)) = part.split_once(':') {
                    by.entry(k.to_string())
                        .or_default()
                        .push(v.parse().unwrap_or(0.0));
                }
            }
        }
        let out: Vec<String> = by
            .into_iter()
            .map(|(k, v)| (k, median(&v) / seconds))
            .filter(|(_, v)| *v > 0.0)
            .map(|(k, v)| {
                let v = if v < 10.0 {
                    format!("{v:.2}")
                } else {
                    thousands(v)
                };
                format!("{k} {v}/s")
            })
            .collect();
        if out.is_empty() {
            "none".to_string()
        } else {
            out.join(", ")
        }
    }
}

/// `v` with thousands separators, no decimals.
fn thousands(v: f64) -> String {
    let s = format!("{:.0}", v);
    let (sign, digits) = s.split_at(usize::from(s.starts_with('-')));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{sign}{out}")
}

/// Runs the bench binary, echoing its lines; returns its header's words
/// (with its last line's) and every run's.
fn bench() -> Result<(Words, Vec<Words>)> {
    let mut child = cargo()
        .args(["bench", "-p", "mpi-observer", "--bench", "waits"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cargo bench -p mpi-observer --bench waits")?;
    let out = child.stdout.take().context("stdout")?;
    let mut header = Words::new();
    let mut runs = Vec::new();
    for line in BufReader::new(out).lines() {
        let line = line?;
        eprintln!("{line}");
        if line.starts_with("run ") {
            runs.push(words(&line));
        } else if line.starts_with("ranks_per_node=") || line.starts_with("done ") {
            header.extend(words(&line));
        }
    }
    if !child.wait()?.success() {
        bail!("cargo bench -p mpi-observer --bench waits failed");
    }
    if runs.is_empty() {
        bail!("the waits bench printed no run");
    }
    Ok((header, runs))
}

/// `cargo xtask bench waits`.
pub fn run(root: &Path) -> Result<()> {
    let load_before = loadavg();
    let (header, runs) = bench()?;
    let mut scenarios: Vec<Scenario> = Vec::new();
    for r in runs {
        let name = r.get("scenario").context("scenario=")?.clone();
        match scenarios.iter_mut().find(|s| s.name == name) {
            Some(s) => s.runs.push(r),
            None => scenarios.push(Scenario {
                name,
                runs: vec![r],
            }),
        }
    }
    let per_node = num(&header, "ranks_per_node")?;
    let seconds = num(&header, "seconds")?;
    let slots = num(&header, "ring_slots")?;
    let reps = scenarios.iter().map(|s| s.runs.len()).min().unwrap_or(0);
    let mut report = String::new();
    let _ = writeln!(
        report,
        "# `cargo xtask bench waits`\n\nMachine: {}\n\n\
         The wait-state matcher (`observer/src/collect/waits/`) fed synthetic records as \
         the shim writes them, {per_node:.0} ranks on this node, in 250 ms drains each \
         followed by a settle, as the daemon does (`export/registry/waits.rs`), over {seconds:.0} \
         simulated seconds of the job; `×3`: the same job on 3 nodes, the 2 peers' {} ranks \
         fed through `add_remote` every 500 ms (their records on clocks offset by +3.7 and \
         −12.1 ms). CPU is this thread's, in `Waits::add`, `Waits::add_remote` and \
         `Waits::settle` only (making the records is not timed). {reps} runs of every \
         scenario, round-robin, in {:.0} s; medians (lowest–highest). See \
         `observer/benches/waits.rs` for the streams.\n\n\
         | scenario | rate per rank | records/s fed (this node's) | ns/record | CPU, % of one core | \
         longest tick | pending peak | evaluated/s | unresolved |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---|",
        machine(),
        2.0 * per_node,
        num(&header, "elapsed_s")?,
    );
    let mut laps = Vec::new();
    for s in &scenarios {
        let first = &s.runs[0];
        let kind = if s.name.starts_with("coll") {
            "collectives/s"
        } else {
            "messages/s (1 in 8 recorded)"
        };
        let rate = num(first, "rate")?;
        let records = s.median(|r| num(r, "records"))?;
        let local = s.median(|r| num(r, "local_records"))?;
        let ns = s.each(|r| Ok(num(r, "cpu_ns")? / num(r, "records")?))?;
        let cpu = s.median(|r| Ok(num(r, "cpu_ns")? / (seconds * 1e9) * 100.0))?;
        let tick = s.median(|r| num(r, "tick_max_ns"))? / 1e6;
        let peak = s.median(|r| num(r, "pending_peak"))?;
        let evaluated = s.median(|r| num(r, "instances"))? / seconds;
        let fed = if records > local {
            format!(
                "{} ({})",
                thousands(records / seconds),
                thousands(local / seconds)
            )
        } else {
            thousands(records / seconds)
        };
        let _ = writeln!(
            report,
            "| {} | {} {kind} | {fed} | {:.0} ({}) | **{cpu:.1} %** | {tick:.1} ms | {} | {} | {} |",
            s.shown(),
            thousands(rate),
            median(&ns),
            spread(&ns, 0),
            thousands(peak),
            thousands(evaluated),
            s.unresolved(seconds),
        );
        // A rank's records per drain against its ring's slots.
        let per_drain = local / per_node / (seconds * 4.0);
        if per_drain > slots {
            laps.push(format!(
                "{}: {per_drain:.0} records per rank per 250 ms drain, more than the ring's \
                 {slots:.0} slots",
                s.name
            ));
        }
    }
    report.push('\n');
    for s in &scenarios {
        if let Ok(cpu) = s.median(|r| Ok(num(r, "cpu_ns")? / (seconds * 1e9) * 100.0)) {
            let _ = writeln!(
                report,
                "- {}: the matcher costs {cpu:.1} % of one core.",
                s.shown()
            );
        }
    }
    if !laps.is_empty() {
        let _ = writeln!(
            report,
            "\nThe daemon would not see all of these records: its rings would lap ({}); the \
             bench feeds them all.",
            laps.join("; ")
        );
    }
    report.push('\n');
    write_report(root, "benchmarks-waits.md", report, &load_before)
}
