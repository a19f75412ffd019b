//! `cargo xtask bench stats`: what the shim's `stats` layer costs.
//!
//! - Added ns per point-to-point call: one rank sending to itself, a
//!   blocking `MPI_Sendrecv` (1 call, a send and a receive accounted) and a
//!   nonblocking triple (`MPI_Irecv` + `MPI_Isend` + `MPI_Waitall`, 3
//!   calls, 2 requests tracked), 8 bytes each,
//!   without the shim, with the shim and a C pass-through tool wrapping the
//!   same calls, and with the shim and `stats`. The difference to the
//!   pass-through is the layer's own work; to no shim, everything it adds.
//! - Latency: 8-byte ping-pong between two ranks with `stats` against none.
//! - What the wait records (docs/waits.md) add to a collective: 2-rank
//!   `MPI_Barrier` and 8-byte `MPI_Allreduce` under `stats` with every
//!   instance recorded against `MPI_OBSERVER_WAITS=0`, paired in each round.
//! - What numbering and recording messages adds to a point-to-point call:
//!   the one-rank patterns above under `stats` as shipped (one message in 8
//!   per envelope recorded) and with every message recorded, against
//!   `MPI_OBSERVER_WAITS_P2P=0` (no numbering), paired in each round.
//!
//! Configurations run round-robin, `REPS` times each, so drift on a shared
//! VM hits all alike; each run reports the median of 9 timed loops and the
//! report quotes the median of the runs. The C sources are written next to
//! the binaries from this file, so the benchmark is self-contained.
//! Results go to `docs/benchmarks-stats.md` with the command and machine.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench_common::{Mpi, loadavg, machine, median, spread, write_report},
    cargo,
    setup::run_cmd,
};

/// Runs per configuration; odd, so the median is a run.
const REPS: usize = 11;

/// One rank talking to itself: per-iteration ns of each pattern.
const P2P_COST_C: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define LOOPS 9
#define ITERS 100000

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double loop(int nonblocking, int iters) {
    char sb[8] = {0}, rb[8];
    double t0 = now();
    for (int i = 0; i < iters; i++) {
        if (nonblocking) {
            MPI_Request r[2];
            MPI_Irecv(rb, 8, MPI_BYTE, 0, 2, MPI_COMM_WORLD, &r[0]);
            MPI_Isend(sb, 8, MPI_BYTE, 0, 2, MPI_COMM_WORLD, &r[1]);
            MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
        } else {
            /* Not Send then Recv: MPICH's blocking send to itself waits
             * for the receive. */
            MPI_Sendrecv(sb, 8, MPI_BYTE, 0, 1, rb, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
        }
    }
    return (now() - t0) / iters;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    double med[2];
    for (int nb = 0; nb < 2; nb++) {
        double v[LOOPS];
        loop(nb, ITERS / 4);
        for (int k = 0; k < LOOPS; k++)
            v[k] = loop(nb, ITERS);
        qsort(v, LOOPS, sizeof(double), cmp);
        med[nb] = v[LOOPS / 2];
    }
    printf("blocking_ns=%.2f nonblocking_ns=%.2f\n", med[0], med[1]);
    MPI_Finalize();
    return 0;
}
"#;

/// A PMPI tool that only continues to the next level, for the calls above.
const PASS_THROUGH_C: &str = r#"
#include <mpi.h>
int MPI_Send(const void *b, int n, MPI_Datatype t, int d, int g, MPI_Comm c) {
    return PMPI_Send(b, n, t, d, g, c);
}
int MPI_Recv(void *b, int n, MPI_Datatype t, int s, int g, MPI_Comm c, MPI_Status *st) {
    return PMPI_Recv(b, n, t, s, g, c, st);
}
int MPI_Sendrecv(const void *sb, int sn, MPI_Datatype st, int d, int sg, void *rb, int rn,
                 MPI_Datatype rt, int s, int rg, MPI_Comm c, MPI_Status *status) {
    return PMPI_Sendrecv(sb, sn, st, d, sg, rb, rn, rt, s, rg, c, status);
}
int MPI_Isend(const void *b, int n, MPI_Datatype t, int d, int g, MPI_Comm c, MPI_Request *r) {
    return PMPI_Isend(b, n, t, d, g, c, r);
}
int MPI_Irecv(void *b, int n, MPI_Datatype t, int s, int g, MPI_Comm c, MPI_Request *r) {
    return PMPI_Irecv(b, n, t, s, g, c, r);
}
int MPI_Waitall(int n, MPI_Request *r, MPI_Status *st) { return PMPI_Waitall(n, r, st); }
"#;

/// Two ranks: median one-way latency of 8-byte messages.
const PING_PONG_C: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define BATCHES 15
#define ITERS 20000

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double batch(int rank, int iters) {
    char buf[8] = {0};
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        if (rank == 0) {
            MPI_Send(buf, 8, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, 8, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, 8, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, 8, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
    }
    return (MPI_Wtime() - t0) / (2.0 * iters) * 1e9;
}

int main(int argc, char **argv) {
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    double v[BATCHES];
    batch(rank, ITERS / 4);
    for (int b = 0; b < BATCHES; b++)
        v[b] = batch(rank, ITERS);
    qsort(v, BATCHES, sizeof(double), cmp);
    if (rank == 0)
        printf("pingpong_ns=%.1f\n", v[BATCHES / 2]);
    MPI_Finalize();
    return 0;
}
"#;

/// Two ranks: median ns per `MPI_Barrier` and per 8-byte `MPI_Allreduce`.
const COLL_COST_C: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define LOOPS 9
#define ITERS 20000

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double loop(int allreduce, int iters) {
    double in = 1.0, out;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        if (allreduce)
            MPI_Allreduce(&in, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        else
            MPI_Barrier(MPI_COMM_WORLD);
    }
    return (MPI_Wtime() - t0) / iters * 1e9;
}

int main(int argc, char **argv) {
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    double med[2];
    for (int a = 0; a < 2; a++) {
        double v[LOOPS];
        loop(a, ITERS / 4);
        for (int k = 0; k < LOOPS; k++)
            v[k] = loop(a, ITERS);
        qsort(v, LOOPS, sizeof(double), cmp);
        med[a] = v[LOOPS / 2];
    }
    if (rank == 0)
        printf("barrier_ns=%.1f allreduce_ns=%.1f\n", med[0], med[1]);
    MPI_Finalize();
    return 0;
}
"#;

/// Runs a job and returns every `key=number` of its output.
fn measure(mut c: Command) -> Result<Vec<(String, f64)>> {
    let o = c.output().with_context(|| format!("running {c:?}"))?;
    let out = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        bail!(
            "{c:?} failed:\n{out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(out
        .split_whitespace()
        .filter_map(|w| {
            let (k, v) = w.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect())
}

fn get(v: &[(String, f64)], key: &str) -> Result<f64> {
    v.iter()
        .find(|(k, _)| k == key)
        .map(|(_, x)| *x)
        .with_context(|| format!("no {key}= in the benchmark's output"))
}

fn fastest(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

struct Built {
    cost: PathBuf,
    pingpong: PathBuf,
    coll: PathBuf,
    pass: PathBuf,
}

fn build(mpi: Mpi, dir: &Path) -> Result<Built> {
    let dir = dir.join(mpi.suffix());
    fs::create_dir_all(&dir)?;
    let src = |name: &str, text: &str| -> Result<PathBuf> {
        let p = dir.join(name);
        fs::write(&p, text)?;
        Ok(p)
    };
    let b = Built {
        cost: dir.join("p2pcost"),
        pingpong: dir.join("pingpong"),
        coll: dir.join("collcost"),
        pass: dir.join("libpass.so"),
    };
    mpi.mpicc(&[], &src("p2pcost.c", P2P_COST_C)?, &b.cost)?;
    mpi.mpicc(&[], &src("collcost.c", COLL_COST_C)?, &b.coll)?;
    mpi.mpicc(&[], &src("pingpong.c", PING_PONG_C)?, &b.pingpong)?;
    mpi.mpicc(
        &["-shared", "-fPIC"],
        &src("passthrough.c", PASS_THROUGH_C)?,
        &b.pass,
    )?;
    Ok(b)
}

/// `cargo xtask bench stats`.
pub fn run(root: &Path) -> Result<()> {
    run_cmd(cargo().args(["build", "--release", "-p", "mpi-observer-shim"]))?;
    let shim = root.join("target/release/libmpi_observer_shim.so");
    let dir = root.join("target/bench-stats");
    let load_before = loadavg();
    let mut report = String::new();
    writeln!(
        report,
        "# `stats` layer benchmarks\n\n\
         Command: `cargo xtask bench stats` (writes this file; the C sources are in \
         `xtask/src/bench_stats.rs`).\n\n\
         Machine: {}.\n\n\
         Every figure is the median of {REPS} runs taken round-robin across configurations \
         in one invocation (the range of the runs beside it); each run reports the median of \
         9 timed loops. Differences compare figures from the same invocation.\n",
        machine()
    )?;
    for mpi in [Mpi::OpenMpi, Mpi::Mpich] {
        let b = build(mpi, &dir)?;
        let pass = b.pass.display().to_string();
        let configs: [(&str, Option<&str>); 3] = [
            ("no shim", None),
            ("shim + C pass-through tool", Some(pass.as_str())),
            ("shim + `stats`", Some("stats")),
        ];
        let mut blocking = vec![Vec::new(); configs.len()];
        let mut nonblocking = vec![Vec::new(); configs.len()];
        for _ in 0..REPS {
            for (i, (_, list)) in configs.iter().enumerate() {
                let v = measure(mpi.job(1, list.map(|l| (shim.as_path(), l)), &b.cost))?;
                blocking[i].push(get(&v, "blocking_ns")?);
                nonblocking[i].push(get(&v, "nonblocking_ns")?);
            }
        }
        writeln!(
            report,
            "## {}: added ns per point-to-point call (8 B, one rank to itself)\n",
            mpi.name()
        )?;
        writeln!(
            report,
            "| pattern | configuration | ns per iteration | runs | added per call vs no shim | added per call vs pass-through | same, fastest runs |\n\
             |---|---|---:|---:|---:|---:|---:|"
        )?;
        for (pattern, calls, samples) in [
            ("Sendrecv", 1.0, &blocking),
            ("Irecv + Isend + Waitall", 3.0, &nonblocking),
        ] {
            let med: Vec<f64> = samples.iter().map(|v| median(v)).collect();
            // The fastest run of each configuration is the least disturbed
            // by other work on a shared machine.
            let fast: Vec<f64> = samples.iter().map(|v| fastest(v)).collect();
            for (i, (name, _)) in configs.iter().enumerate() {
                let (vs_pass, vs_pass_fast) = if i == 2 {
                    (
                        format!("{:+.1} ns", (med[2] - med[1]) / calls),
                        format!("{:+.1} ns", (fast[2] - fast[1]) / calls),
                    )
                } else {
                    ("-".into(), "-".into())
                };
                writeln!(
                    report,
                    "| {pattern} | {name} | {:.1} | {} | {:+.1} ns | {vs_pass} | {vs_pass_fast} |",
                    med[i],
                    spread(&samples[i], 1),
                    (med[i] - med[0]) / calls,
                )?;
            }
        }
        writeln!(report)?;
        let (mut base, mut stats) = (Vec::new(), Vec::new());
        for _ in 0..REPS {
            base.push(get(
                &measure(mpi.job(2, None, &b.pingpong))?,
                "pingpong_ns",
            )?);
            stats.push(get(
                &measure(mpi.job(2, Some((shim.as_path(), "stats")), &b.pingpong))?,
                "pingpong_ns",
            )?);
        }
        let (sb, ss) = (spread(&base, 1), spread(&stats, 1));
        let (mb, ms) = (median(&base), median(&stats));
        writeln!(
            report,
            "## {}: 8-byte ping-pong, one-way latency (2 ranks)\n\n\
             | configuration | median | runs | ratio |\n|---|---:|---:|---:|\n\
             | no shim | {mb:.0} ns | {sb} ns | 1.000 |\n\
             | shim + `stats` | {ms:.0} ns | {ss} ns | {:.3} |\n",
            mpi.name(),
            ms / mb
        )?;
        waits(&mut report, mpi, &shim, &b)?;
        messages(&mut report, mpi, &shim, &b)?;
    }
    write_report(root, "benchmarks-stats.md", report, &load_before)
}

/// What recording every collective's wait record adds, per call: `stats`
/// with the records against `stats` without, run in pairs.
fn waits(report: &mut String, mpi: Mpi, shim: &Path, b: &Built) -> Result<()> {
    let run = |records: bool| -> Result<(f64, f64)> {
        let mut c = mpi.job(2, Some((shim, "stats")), &b.coll);
        if !records {
            c.env("MPI_OBSERVER_WAITS", "0");
        }
        let v = measure(c)?;
        Ok((get(&v, "barrier_ns")?, get(&v, "allreduce_ns")?))
    };
    // Alternate which goes first, so neither always runs on a warmer machine.
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for rep in 0..REPS {
        let (a, b) = if rep % 2 == 0 {
            let a = run(false)?;
            (a, run(true)?)
        } else {
            let b = run(true)?;
            (run(false)?, b)
        };
        off.push(a);
        on.push(b);
    }
    writeln!(
        report,
        "## {}: wait records, ns per collective (2 ranks)\n\n\
         `stats` recording every blocking collective on `MPI_COMM_WORLD` (the default) \
         against `MPI_OBSERVER_WAITS=0`, in pairs within each round.\n\n\
         | collective | without records | runs | with records | runs | added | paired ratio (median) |\n\
         |---|---:|---:|---:|---:|---:|---:|",
        mpi.name()
    )?;
    for (name, pick) in [
        (
            "MPI_Barrier",
            (|p: &(f64, f64)| p.0) as fn(&(f64, f64)) -> f64,
        ),
        ("MPI_Allreduce, 8 B", |p: &(f64, f64)| p.1),
    ] {
        let x: Vec<f64> = off.iter().map(pick).collect();
        let y: Vec<f64> = on.iter().map(pick).collect();
        let ratios: Vec<f64> = x.iter().zip(&y).map(|(a, b)| b / a).collect();
        let (mx, my) = (median(&x), median(&y));
        writeln!(
            report,
            "| {name} | {mx:.0} ns | {} ns | {my:.0} ns | {} ns | {:+.1} ns | {:.3} |",
            spread(&x, 0),
            spread(&y, 0),
            my - mx,
            median(&ratios)
        )?;
    }
    writeln!(report)?;
    Ok(())
}

/// What numbering messages (and recording one in 8, or all) adds per
/// point-to-point call: `stats` as shipped and with `MPI_OBSERVER_WAITS_P2P=1`
/// against `MPI_OBSERVER_WAITS_P2P=0`, the three in turn within each round,
/// the first of them rotating.
fn messages(report: &mut String, mpi: Mpi, shim: &Path, b: &Built) -> Result<()> {
    const MODES: [(&str, Option<&str>); 3] = [
        ("not numbered (`MPI_OBSERVER_WAITS_P2P=0`)", Some("0")),
        ("one in 8 recorded (as shipped)", None),
        ("every one recorded (`=1`)", Some("1")),
    ];
    let run = |p2p: Option<&str>| -> Result<(f64, f64)> {
        let mut c = mpi.job(1, Some((shim, "stats")), &b.cost);
        if let Some(v) = p2p {
            c.env("MPI_OBSERVER_WAITS_P2P", v);
        }
        let v = measure(c)?;
        Ok((get(&v, "blocking_ns")?, get(&v, "nonblocking_ns")?))
    };
    let mut got = vec![Vec::new(); MODES.len()];
    for rep in 0..REPS {
        let mut round = [(0.0, 0.0); MODES.len()];
        for k in 0..MODES.len() {
            let i = (rep + k) % MODES.len();
            round[i] = run(MODES[i].1)?;
        }
        for (i, r) in round.into_iter().enumerate() {
            got[i].push(r);
        }
    }
    writeln!(
        report,
        "## {}: message numbering and records, ns per point-to-point call (8 B, one rank to itself)\n\n\
         `stats` with messages on `MPI_COMM_WORLD` numbered per envelope and sampled for Late \
         Sender records (docs/waits.md), against not numbered, the three run in turn within \
         each round. Added per call is the median over rounds of the paired difference; \
         this VM's latency jumps between two levels, so the fastest runs are compared too.\n\n\
         | pattern | configuration | ns per iteration | runs | added per call | paired ratio (median) | added, fastest runs |\n\
         |---|---|---:|---:|---:|---:|---:|",
        mpi.name()
    )?;
    for (pattern, calls, pick) in [
        (
            "Sendrecv",
            1.0,
            (|p: &(f64, f64)| p.0) as fn(&(f64, f64)) -> f64,
        ),
        ("Irecv + Isend + Waitall", 3.0, |p: &(f64, f64)| p.1),
    ] {
        let base: Vec<f64> = got[0].iter().map(pick).collect();
        for (i, (name, _)) in MODES.iter().enumerate() {
            let x: Vec<f64> = got[i].iter().map(pick).collect();
            let added: Vec<f64> = x.iter().zip(&base).map(|(a, b)| (a - b) / calls).collect();
            let ratios: Vec<f64> = x.iter().zip(&base).map(|(a, b)| a / b).collect();
            let (added, ratio, fast) = if i == 0 {
                ("-".to_string(), "1.000".to_string(), "-".to_string())
            } else {
                (
                    format!("{:+.1} ns", median(&added)),
                    format!("{:.3}", median(&ratios)),
                    format!("{:+.1} ns", (fastest(&x) - fastest(&base)) / calls),
                )
            };
            writeln!(
                report,
                "| {pattern} | {name} | {:.1} | {} | {added} | {ratio} | {fast} |",
                median(&x),
                spread(&x, 1),
            )?;
        }
    }
    writeln!(report)?;
    Ok(())
}
