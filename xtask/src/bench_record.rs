//! `cargo xtask bench record`: what `mpi-observer record` costs the job, and
//! how fast one core drains its events.
//!
//! One-way latency of an 8-byte ping-pong between two ranks (the C source
//! of `bench inject`), four ways: the shim preloaded with `stats`, idle and
//! recorded; no shim, alone and recorded through the probes. Configurations
//! run round-robin, `REPS` times each, in one invocation; each run reports
//! the median of 15 timed batches, the report the median of the runs. For
//! the recorded runs, `record`'s last line gives the events it wrote and
//! the CPU time it used: their ratio is what one core drains (and writes to
//! OTF2) per second. Results go to `docs/benchmarks-record.md` with the
//! command and machine.

use std::{
    fmt::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench_common::{
        Mpi, field, lines, loadavg, machine, median, reap, release_binaries, round_robin, spread,
        wait_line, write_report,
    },
    bench_inject::{PingPong, build_ping_pong},
};

/// Runs per configuration; odd, so the median is a run.
const REPS: usize = 7;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Config {
    ShimIdle,
    ShimRecorded,
    Bare,
    ProbesRecorded,
}

impl Config {
    const ALL: [Config; 4] = [
        Config::ShimIdle,
        Config::ShimRecorded,
        Config::Bare,
        Config::ProbesRecorded,
    ];

    fn name(self) -> &'static str {
        match self {
            Config::ShimIdle => "shim, `stats`, not recorded",
            Config::ShimRecorded => "shim, `stats`, recorded (full events)",
            Config::Bare => "no shim, not recorded",
            Config::ProbesRecorded => "no shim, recorded through probes (Enter/Leave)",
        }
    }

    fn recorded(self) -> bool {
        matches!(self, Config::ShimRecorded | Config::ProbesRecorded)
    }
}

/// One run: (8 B one-way latency in ns, events recorded, CPU seconds of
/// `record`, events dropped).
fn one_run(
    mpi: Mpi,
    prog: &Path,
    observer: &Path,
    shim: &Path,
    work: &Path,
    config: Config,
) -> Result<(f64, f64, f64, f64)> {
    let preload =
        matches!(config, Config::ShimIdle | Config::ShimRecorded).then_some((shim, "stats"));
    let job = PingPong::start(mpi, prog, work, preload, &[])?;
    if !config.recorded() {
        let l = job.run(Duration::from_millis(300), None)?;
        return Ok((field(&l, "lat8_ns=")?, 0.0, 0.0, 0.0));
    }
    let out = work.join("trace");
    let _ = std::fs::remove_dir_all(&out);
    let mut rec = Command::new(observer);
    rec.arg("record");
    for p in &job.pids {
        rec.args(["--pid", p]);
    }
    let mut rec = rec
        .arg("-o")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting mpi-observer record")?;
    let err = lines(rec.stderr.take().context("stderr")?);
    wait_line(&err, "mpi-observer: recording", "mpi-observer record")?;
    let l = job.run(Duration::from_millis(300), None)?;
    let (done, _) = wait_line(&err, "mpi-observer: recorded", "mpi-observer record")?;
    reap(&mut rec, "mpi-observer record")?;
    let events = done
        .split_whitespace()
        .nth(2)
        .and_then(|n| n.parse::<f64>().ok())
        .with_context(|| format!("events in `{done}`"))?;
    let cpu = done
        .split(" s of CPU")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .with_context(|| format!("CPU time in `{done}`"))?;
    if events < 1.0 {
        bail!("record wrote no event: `{done}`");
    }
    let dropped: f64 = done
        .split("dropped: ")
        .nth(1)
        .map(|d| {
            d.split(", ")
                .filter_map(|p| p.split_whitespace().next()?.parse::<f64>().ok())
                .sum()
        })
        .unwrap_or(0.0);
    Ok((field(&l, "lat8_ns=")?, events, cpu, dropped))
}

/// `cargo xtask bench record`.
pub fn run(root: &Path) -> Result<()> {
    let (observer, shim) = release_binaries(root)?;
    let work = root.join("target/bench-record");
    let load_before = loadavg();
    let mut report = String::new();
    writeln!(
        report,
        "# Recording benchmarks\n\n\
         Command: `cargo xtask bench record` (writes this file; the C source is \
         `bench inject`'s ping-pong, in `xtask/src/bench_inject.rs`).\n\n\
         Machine: {}.\n\n\
         8-byte one-way latency between two ranks; every figure is the median of {REPS} \
         runs taken round-robin across the four configurations in one invocation (the \
         range of the runs beside it); each run reports the median of 15 timed batches. \
         A recorded run records the whole ping-pong (`record --pid` on both ranks, started \
         before the ranks go, ended by their exit). Drain rate: the events `record` wrote \
         over the CPU time it used (user + system), i.e. what one core drains from the \
         rings and writes to OTF2 per second.\n",
        machine()
    )?;
    for mpi in [Mpi::OpenMpi, Mpi::Mpich] {
        let (dir, prog) = build_ping_pong(&work, mpi)?;
        let runs = round_robin(&Config::ALL, REPS, |c| {
            one_run(mpi, &prog, &observer, &shim, &dir, c)
        })?;
        let lat: Vec<Vec<f64>> = runs
            .iter()
            .map(|r| r.iter().map(|x| x.0).collect())
            .collect();
        let m: Vec<f64> = lat.iter().map(|r| median(r)).collect();
        writeln!(
            report,
            "## {}\n\n| configuration | 8 B one-way | runs |\n|---|---:|---:|",
            mpi.name()
        )?;
        for (i, c) in Config::ALL.iter().enumerate() {
            writeln!(
                report,
                "| {} | {:.1} ns | {} |",
                c.name(),
                m[i],
                spread(&lat[i], 0)
            )?;
        }
        writeln!(
            report,
            "\n| comparison | added per one-way trip | ratio |\n|---|---:|---:|\n\
             | shim: recorded vs idle | {:.1} ns | {:.2} |\n\
             | no shim: recorded through probes vs alone | {:.1} ns | {:.2} |\n",
            m[1] - m[0],
            m[1] / m[0],
            m[3] - m[2],
            m[3] / m[2],
        )?;
        writeln!(
            report,
            "| recorded configuration | events per run | dropped per run | CPU of `record` | drained per CPU second |\n|---|---:|---:|---:|---:|"
        )?;
        for (i, c) in Config::ALL.iter().enumerate() {
            if !c.recorded() {
                continue;
            }
            let ev: Vec<f64> = runs[i].iter().map(|x| x.1).collect();
            let dropped: Vec<f64> = runs[i].iter().map(|x| x.3).collect();
            let cpu: Vec<f64> = runs[i].iter().map(|x| x.2).collect();
            let rate: Vec<f64> = runs[i]
                .iter()
                .map(|x| if x.2 > 0.0 { x.1 / x.2 } else { 0.0 })
                .collect();
            writeln!(
                report,
                "| {} | {:.0} | {:.0} | {:.3} s | {:.2} M/s ({}) |",
                c.name(),
                median(&ev),
                median(&dropped),
                median(&cpu),
                median(&rate) / 1e6,
                spread(&rate.iter().map(|r| r / 1e6).collect::<Vec<_>>(), 2)
            )?;
        }
        writeln!(report)?;
    }
    write_report(root, "benchmarks-record.md", report, &load_before)
}
