//! `cargo xtask bench shim`: what the layering shim costs.
//!
//! - Dispatch: ns per `MPI_Comm_rank` without the shim, and with the shim and
//!   0, 1, 2 and 4 pass-through tools (`shim/bench/passthrough.c`).
//! - Latency: 8-byte ping-pong without the shim and with the shim and two
//!   pass-through tools.
//! - Start-up: the wall time of a process that exits at once, without and
//!   with the shim preloaded, for a program without MPI (`/bin/true`: a
//!   launcher or shell inheriting `LD_PRELOAD`) and one linked with the MPI
//!   library (`shim/bench/startup.c`), where the shim looks up every name
//!   it could export in every loaded object.
//!
//! Every configuration runs `REPS` times, round-robin so that drift on a
//! shared VM hits all of them alike; each run prints its own median and the
//! report quotes the median of those. The results are written to
//! `docs/benchmarks-shim.md` with the command and the machine.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench_common::{Mpi, loadavg, machine, median, write_report},
    cargo,
    setup::run_cmd,
};

/// Runs per configuration; odd, so the median is a run.
const REPS: usize = 11;

/// Runs a job and returns the number after `key=` in its output.
fn measure(mut c: Command, key: &str) -> Result<f64> {
    let o = c.output().with_context(|| format!("running {c:?}"))?;
    let out = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        bail!(
            "{c:?} failed:\n{out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        .with_context(|| format!("no {key}= in output of {c:?}:\n{out}"))
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

struct Built {
    dispatch: PathBuf,
    pingpong: PathBuf,
    tools: Vec<PathBuf>,
}

fn build(mpi: Mpi, src: &Path, dir: &Path) -> Result<Built> {
    let dir = dir.join(mpi.suffix());
    fs::create_dir_all(&dir)?;
    let b = Built {
        dispatch: dir.join("dispatch"),
        pingpong: dir.join("pingpong"),
        tools: (1..=4)
            .map(|i| dir.join(format!("libpass{i}.so")))
            .collect(),
    };
    mpi.mpicc(&[], &src.join("dispatch.c"), &b.dispatch)?;
    mpi.mpicc(&[], &src.join("pingpong.c"), &b.pingpong)?;
    for t in &b.tools {
        mpi.mpicc(&["-shared", "-fPIC"], &src.join("passthrough.c"), t)?;
    }
    Ok(b)
}

fn list(tools: &[PathBuf]) -> String {
    tools
        .iter()
        .map(|t| t.display().to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// `cargo xtask bench shim`.
pub fn run(root: &Path) -> Result<()> {
    run_cmd(cargo().args(["build", "--release", "-p", "mpi-observer-shim"]))?;
    let shim = root.join("target/release/libmpi_observer_shim.so");
    let src = root.join("shim/bench");
    let dir = root.join("target/bench-shim");
    let load_before = loadavg();
    let mut report = String::new();
    writeln!(
        report,
        "# Shim benchmarks\n\n\
         Command: `cargo xtask bench shim` (writes this file; sources in `shim/bench/`).\n\n\
         Machine: {}.\n\n\
         Every figure is the median of {REPS} runs, taken round-robin across configurations \
         in one invocation; each run reports the fastest of its 9 timed loops, because other \
         work on a shared machine only ever adds time. Ratios compare figures from the same \
         invocation; \"runs\" gives the range over the {REPS} runs.\n",
        machine()
    )?;
    for mpi in [Mpi::OpenMpi, Mpi::Mpich] {
        let b = build(mpi, &src, &dir)?;
        // Dispatch cost.
        let configs: Vec<(String, Option<String>)> = std::iter::once(("no shim".to_string(), None))
            .chain(
                [0usize, 1, 2, 4].map(|n| (format!("shim, {n} layers"), Some(list(&b.tools[..n])))),
            )
            .collect();
        let mut samples = vec![Vec::new(); configs.len()];
        for _ in 0..REPS {
            for (i, (_, l)) in configs.iter().enumerate() {
                let job = mpi.job(1, l.as_deref().map(|l| (shim.as_path(), l)), &b.dispatch);
                samples[i].push(measure(job, "dispatch_ns")?);
            }
        }
        let runs: Vec<String> = samples
            .iter()
            .map(|v| format!("{:.2}–{:.2}", min(v), max(v)))
            .collect();
        let med: Vec<f64> = samples.iter().map(|v| median(v)).collect();
        writeln!(
            report,
            "## {}: dispatch cost, `MPI_Comm_rank`\n",
            mpi.name()
        )?;
        writeln!(
            report,
            "| configuration | ns/call | runs | added vs no shim | per layer vs 0 layers |\n|---|---:|---:|---:|---:|"
        )?;
        for (i, (name, _)) in configs.iter().enumerate() {
            let layers = [0.0, 0.0, 1.0, 2.0, 4.0][i];
            let per = if layers > 0.0 {
                format!("{:.2} ns", (med[i] - med[1]) / layers)
            } else {
                "-".into()
            };
            writeln!(
                report,
                "| {name} | {:.2} | {} | {:+.2} ns | {per} |",
                med[i],
                runs[i],
                med[i] - med[0]
            )?;
        }
        writeln!(report)?;
        // Ping-pong latency.
        let two = list(&b.tools[..2]);
        let (mut base, mut layered) = (Vec::new(), Vec::new());
        for _ in 0..REPS {
            base.push(measure(mpi.job(2, None, &b.pingpong), "pingpong_ns")?);
            layered.push(measure(
                mpi.job(2, Some((shim.as_path(), two.as_str())), &b.pingpong),
                "pingpong_ns",
            )?);
        }
        // The spread shows how much other work on a shared machine moved
        // the runs; the ratio is of medians.
        let spread = |v: &[f64]| format!("{:.0}–{:.0} ns", min(v), max(v));
        let (base_spread, layered_spread) = (spread(&base), spread(&layered));
        let (base, layered) = (median(&base), median(&layered));
        writeln!(
            report,
            "## {}: 8-byte ping-pong, one-way latency\n",
            mpi.name()
        )?;
        writeln!(
            report,
            "| configuration | median | runs | ratio |\n|---|---:|---:|---:|"
        )?;
        writeln!(report, "| no shim | {base:.0} ns | {base_spread} | 1.000 |")?;
        writeln!(
            report,
            "| shim + 2 pass-through tools | {layered:.0} ns | {layered_spread} | {:.3} |\n",
            layered / base
        )?;
        // What the dispatch figures predict: a one-way trip is one MPI_Send on
        // one side and one MPI_Recv on the other, each through two layers.
        let per_call = med[3] - med[0];
        let predicted = 2.0 * per_call;
        writeln!(
            report,
            "Predicted from the dispatch table: one send and one receive per one-way trip, each \
             {per_call:.1} ns dearer with two layers, so +{predicted:.0} ns ({:.1}%). Measured: \
             {:+.0} ns.\n",
            100.0 * predicted / base,
            layered - base
        )?;
    }
    startup(&mut report, &shim, &src, &dir)?;
    write_report(root, "benchmarks-shim.md", report, &load_before)
}

/// Spawns per timed batch of [`startup`].
const SPAWNS: u32 = 100;

/// Mean wall time of [`SPAWNS`] runs of `exe`, in µs.
fn spawn_us(exe: &Path, preload: Option<&Path>) -> Result<f64> {
    let start = std::time::Instant::now();
    for _ in 0..SPAWNS {
        let mut c = Command::new(exe);
        if let Some(p) = preload {
            c.env("LD_PRELOAD", p);
        }
        let st = c.status().with_context(|| format!("running {c:?}"))?;
        if !st.success() {
            bail!("{c:?} failed: {st}");
        }
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / f64::from(SPAWNS))
}

/// The start-up section of the report.
fn startup(report: &mut String, shim: &Path, src: &Path, dir: &Path) -> Result<()> {
    writeln!(
        report,
        "## Start-up: spawn to exit of a process that does nothing\n\n\
         Mean of {SPAWNS} spawns per run, median of {REPS} runs, round-robin. The difference \
         is everything the preloaded shim costs a process: mapping and relocating it, and \
         hiding the MPI names the process lacks (one pass over each loaded object's symbols \
         where an MPI library is loaded).\n"
    )?;
    writeln!(
        report,
        "| program | no shim | shim preloaded | added |\n|---|---:|---:|---:|"
    )?;
    let mut programs = vec![(
        "`/bin/true` (no MPI)".to_string(),
        PathBuf::from("/bin/true"),
    )];
    for mpi in [Mpi::OpenMpi, Mpi::Mpich] {
        let d = dir.join(mpi.suffix());
        fs::create_dir_all(&d)?;
        let exe = d.join("startup");
        mpi.mpicc(&[], &src.join("startup.c"), &exe)?;
        programs.push((format!("linked with {}", mpi.name()), exe));
    }
    for (name, exe) in programs {
        let (mut bare, mut preloaded) = (Vec::new(), Vec::new());
        for _ in 0..REPS {
            bare.push(spawn_us(&exe, None)?);
            preloaded.push(spawn_us(&exe, Some(shim))?);
        }
        let (bare, preloaded) = (median(&bare), median(&preloaded));
        writeln!(
            report,
            "| {name} | {bare:.0} µs | {preloaded:.0} µs | {:+.0} µs |",
            preloaded - bare
        )?;
    }
    writeln!(report)?;
    Ok(())
}
