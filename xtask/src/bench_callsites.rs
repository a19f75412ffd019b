//! `cargo xtask bench callsites`: what recording call sites adds per call.
//!
//! One-way latency of an 8-byte ping-pong between two ranks (the C source
//! of `bench inject`), four ways: probes without and with `--callsites`, and
//! the shim preloaded with `stats` with its call-site table off
//! (`MPI_OBSERVER_CALLSITES=0`) and on (the default). A one-way trip has two
//! calls on its critical path (one rank's send, the other's receive), so the
//! added cost per call is half the added one-way latency. Configurations run
//! round-robin, `REPS` times each, in one invocation; each run reports the
//! median of 15 timed batches, the report the median of the runs. Results
//! go to `docs/benchmarks-callsites.md` with the command and machine.

use std::{fmt::Write as _, path::Path, time::Duration};

use anyhow::Result;

use crate::{
    bench_common::{
        Mpi, field, loadavg, machine, median, release_binaries, round_robin, spread, start_daemon,
        write_report,
    },
    bench_inject::{PingPong, build_ping_pong},
};

/// Runs per configuration; odd, so the median is a run.
const REPS: usize = 9;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Config {
    Probes,
    ProbesSites,
    ShimOff,
    ShimOn,
}

impl Config {
    const ALL: [Config; 4] = [
        Config::Probes,
        Config::ProbesSites,
        Config::ShimOff,
        Config::ShimOn,
    ];

    fn name(self) -> &'static str {
        match self {
            Config::Probes => "probes (`attach`)",
            Config::ProbesSites => "probes with call sites (`attach --callsites`)",
            Config::ShimOff => "shim, `stats`, `MPI_OBSERVER_CALLSITES=0`",
            Config::ShimOn => "shim, `stats` (call sites on, the default)",
        }
    }
}

fn one_run(
    mpi: Mpi,
    prog: &Path,
    observer: &Path,
    shim: &Path,
    work: &Path,
    config: Config,
) -> Result<f64> {
    let preload = matches!(config, Config::ShimOff | Config::ShimOn).then_some((shim, "stats"));
    let env: &[(&str, &str)] = if config == Config::ShimOff {
        &[("MPI_OBSERVER_CALLSITES", "0")]
    } else {
        &[]
    };
    let job = PingPong::start(mpi, prog, work, preload, env)?;
    let mut daemon = None;
    if matches!(config, Config::Probes | Config::ProbesSites) {
        let extra: &[&str] = if config == Config::ProbesSites {
            &["--callsites"]
        } else {
            &[]
        };
        daemon = Some(start_daemon(observer, &job.pids, extra, "attached to pid")?.0);
    }
    let l = job.run(Duration::from_millis(300), daemon)?;
    field(&l, "lat8_ns=")
}

/// `cargo xtask bench callsites`.
pub fn run(root: &Path) -> Result<()> {
    let (observer, shim) = release_binaries(root)?;
    let work = root.join("target/bench-callsites");
    let load_before = loadavg();
    let mut report = String::new();
    writeln!(
        report,
        "# Call-site capture benchmarks\n\n\
         Command: `cargo xtask bench callsites` (writes this file; the C source is \
         `bench inject`'s ping-pong, in `xtask/src/bench_inject.rs`).\n\n\
         Machine: {}.\n\n\
         8-byte one-way latency between two ranks; every figure is the median of {REPS} \
         runs taken round-robin across the four configurations in one invocation (the \
         range of the runs beside it); each run reports the median of 15 timed batches. \
         A one-way trip has two MPI calls on its critical path, so the added cost per call \
         is half the added one-way latency.\n",
        machine()
    )?;
    for mpi in [Mpi::OpenMpi, Mpi::Mpich] {
        let (dir, prog) = build_ping_pong(&work, mpi)?;
        let runs = round_robin(&Config::ALL, REPS, |c| {
            one_run(mpi, &prog, &observer, &shim, &dir, c)
        })?;
        let m: Vec<f64> = runs.iter().map(|r| median(r)).collect();
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
                spread(&runs[i], 0)
            )?;
        }
        writeln!(
            report,
            "\n| path | added per one-way trip | added per call | ratio |\n|---|---:|---:|---:|\n\
             | probes: `--callsites` vs without | {:.1} ns | {:.1} ns | {:.3} |\n\
             | shim: call sites on vs off | {:.1} ns | {:.1} ns | {:.3} |\n",
            m[1] - m[0],
            (m[1] - m[0]) / 2.0,
            m[1] / m[0],
            m[3] - m[2],
            (m[3] - m[2]) / 2.0,
            m[3] / m[2],
        )?;
    }
    write_report(root, "benchmarks-callsites.md", report, &load_before)
}
