//! `cargo xtask bench inject`: what `attach --inject` buys and costs.
//!
//! - One-way latency of an 8-byte and a 64 KiB ping-pong between two ranks,
//!   four ways: bare; observed by the probes (`attach`); injected (`attach
//!   --inject`, measured once the handover is done and the probes' links
//!   are closed); and the shim preloaded with `stats` from the start.
//! - Per injected rank, from the daemon's own line: the time from the
//!   request to the handover (goal ≤ 250 ms), the time the stopped thread
//!   stays stopped (goal ≤ 20 ms), and from the stop to the shim's commit.
//!
//! The ranks wait for a go file making an `MPI_Iprobe` call every
//! millisecond, where the daemon can stop them. Configurations run
//! round-robin, `REPS` times each, in one invocation, so drift on a shared
//! VM hits all alike; each run reports the median of 15 timed batches, the
//! report the median of the runs. Results go to
//! `docs/benchmarks-inject.md` with the command and machine.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::mpsc::Receiver,
    thread,
    time::Duration,
};

use anyhow::{Context as _, Result};

use crate::bench_common::{
    Mpi, field, lines, loadavg, machine, median, rank_pids, reap, release_binaries, round_robin,
    signal, spread, start_daemon, wait_line, write_report,
};

/// Runs per configuration; odd, so the median is a run.
const REPS: usize = 7;
/// After the handover the probes' links take about 200 ms to close; the
/// timed part starts after this.
const SETTLE: Duration = Duration::from_millis(1000);

pub(crate) const PING_PONG_C: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define BATCHES 15

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One-way ns: half the round trip. */
static double batch(int rank, char *buf, int bytes, int iters) {
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        if (rank == 0) {
            MPI_Send(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
    }
    return (MPI_Wtime() - t0) / (2.0 * iters) * 1e9;
}

static double latency(int rank, char *buf, int bytes, int iters) {
    double v[BATCHES];
    batch(rank, buf, bytes, iters / 4 + 1);
    for (int b = 0; b < BATCHES; b++) v[b] = batch(rank, buf, bytes, iters);
    qsort(v, BATCHES, sizeof(double), cmp);
    return v[BATCHES / 2];
}

int main(int argc, char **argv) {
    int rank, flag;
    char path[4096];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    snprintf(path, sizeof path, "%s/pid.%d", argv[1], rank);
    FILE *f = fopen(path, "w");
    if (!f) MPI_Abort(MPI_COMM_WORLD, 1);
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    snprintf(path, sizeof path, "%s/go", argv[1]);
    while (access(path, F_OK) != 0) {
        MPI_Iprobe(MPI_ANY_SOURCE, 99, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
        usleep(1000);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    char *buf = calloc(1, 65536);
    double l8 = latency(rank, buf, 8, 4000);
    double l64 = latency(rank, buf, 65536, 400);
    if (rank == 0) printf("lat8_ns=%.1f lat64k_ns=%.1f\n", l8, l64);
    MPI_Finalize();
    return 0;
}
"#;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Config {
    Bare,
    Probes,
    Injected,
    Preloaded,
}

impl Config {
    const ALL: [Config; 4] = [
        Config::Bare,
        Config::Probes,
        Config::Injected,
        Config::Preloaded,
    ];

    fn name(self) -> &'static str {
        match self {
            Config::Bare => "bare",
            Config::Probes => "probes (`attach`)",
            Config::Injected => "injected (`attach --inject`)",
            Config::Preloaded => "shim preloaded, `stats`",
        }
    }
}

/// One injected rank, from the daemon's line: (request to handover, stopped,
/// stop to commit), in ms.
type Injection = (f64, f64, f64);

struct Run {
    lat8: f64,
    lat64k: f64,
    injections: Vec<Injection>,
}

fn number_before(line: &str, unit_suffix: &str) -> Option<f64> {
    let at = line.find(unit_suffix)?;
    line[..at].rsplit(' ').next()?.parse().ok()
}

fn parse_injection(l: &str) -> Option<Injection> {
    let total = number_before(l, " ms in all")?;
    let stopped = number_before(l, " ms, shim live")?;
    let live_at = l.find("shim live after ")? + "shim live after ".len();
    let live = l[live_at..].split(' ').next()?.parse().ok()?;
    Some((total, stopped, live))
}

fn one_run(
    mpi: Mpi,
    prog: &Path,
    observer: &Path,
    shim: &Path,
    work: &Path,
    config: Config,
) -> Result<Run> {
    let preload = (config == Config::Preloaded).then_some((shim, "stats"));
    let job = PingPong::start(mpi, prog, work, preload, &[])?;
    let mut daemon = None;
    let mut injections = Vec::new();
    if matches!(config, Config::Probes | Config::Injected) {
        let (extra, needle): (&[&str], _) = if config == Config::Injected {
            (&["--inject"], "injected the shim into pid")
        } else {
            (&[], "attached to pid")
        };
        let (d, seen) = start_daemon(observer, &job.pids, extra, needle)?;
        if config == Config::Injected {
            for l in seen {
                injections.push(parse_injection(&l).with_context(|| format!("parsing `{l}`"))?);
            }
        }
        daemon = Some(d);
    }
    let l = job.run(SETTLE, daemon)?;
    Ok(Run {
        lat8: field(&l, "lat8_ns=")?,
        lat64k: field(&l, "lat64k_ns=")?,
        injections,
    })
}

/// A two-rank job of [`PING_PONG_C`] whose ranks wrote their pids and wait
/// for their go file.
pub(crate) struct PingPong {
    job: Child,
    out: Receiver<String>,
    dir: PathBuf,
    /// The ranks' pids.
    pub(crate) pids: Vec<String>,
}

impl PingPong {
    /// Starts `prog` for `mpi` in `work/run`, with the shim and its tools
    /// list `preload` and `env` in every rank.
    pub(crate) fn start(
        mpi: Mpi,
        prog: &Path,
        work: &Path,
        preload: Option<(&Path, &str)>,
        env: &[(&str, &str)],
    ) -> Result<PingPong> {
        let dir = work.join("run");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let mut job = mpi
            .job_env(2, preload, env, prog)
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let out = lines(job.stdout.take().context("stdout")?);
        let pids = rank_pids(&dir, 2, &mut job)?;
        Ok(PingPong {
            job,
            out,
            dir,
            pids,
        })
    }

    /// Lets the ranks go after `settle`, waits for the result line and the
    /// job's end, then stops `daemon` (if any); returns the line.
    pub(crate) fn run(mut self, settle: Duration, daemon: Option<Child>) -> Result<String> {
        thread::sleep(settle);
        fs::write(self.dir.join("go"), "")?;
        let (l, _) = wait_line(&self.out, "lat8_ns=", "ping-pong")?;
        reap(&mut self.job, "ping-pong job")?;
        if let Some(mut d) = daemon {
            signal(&d, "-TERM");
            reap(&mut d, "mpi-observer")?;
        }
        Ok(l)
    }
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// Writes and compiles [`PING_PONG_C`] for `mpi` in a directory of its own
/// under `work`; returns the directory and the program.
pub(crate) fn build_ping_pong(work: &Path, mpi: Mpi) -> Result<(PathBuf, PathBuf)> {
    let dir = work.join(mpi.suffix());
    fs::create_dir_all(&dir)?;
    let src = dir.join("pingpong.c");
    fs::write(&src, PING_PONG_C)?;
    let prog = dir.join("pingpong");
    mpi.mpicc(&[], &src, &prog)?;
    Ok((dir, prog))
}

/// `cargo xtask bench inject`.
pub fn run(root: &Path) -> Result<()> {
    let (observer, shim) = release_binaries(root)?;
    let work = root.join("target/bench-inject");
    let load_before = loadavg();
    let mut report = String::new();
    writeln!(
        report,
        "# `attach --inject` benchmarks\n\n\
         Command: `cargo xtask bench inject` (writes this file; the C source is in \
         `xtask/src/bench_inject.rs`).\n\n\
         Machine: {}.\n\n\
         Every latency is the median of {REPS} runs taken round-robin across the four \
         configurations in one invocation (the range of the runs beside it); each run \
         reports the median of 15 timed batches. Ratios compare medians of the same \
         invocation. The injected runs are timed from 1 s after the handover (the probes' \
         links are closed by then).\n",
        machine()
    )?;
    for mpi in [Mpi::OpenMpi, Mpi::Mpich] {
        let (dir, prog) = build_ping_pong(&work, mpi)?;
        let runs = round_robin(&Config::ALL, REPS, |c| {
            one_run(mpi, &prog, &observer, &shim, &dir, c)
        })?;
        let l8: Vec<Vec<f64>> = runs
            .iter()
            .map(|r| r.iter().map(|r| r.lat8).collect())
            .collect();
        let l64: Vec<Vec<f64>> = runs
            .iter()
            .map(|r| r.iter().map(|r| r.lat64k).collect())
            .collect();
        let (b8, b64) = (median(&l8[0]), median(&l64[0]));
        writeln!(
            report,
            "## {}: one-way latency, 2 ranks\n\n\
             | configuration | 8 B | runs | vs bare | 64 KiB | runs | vs bare |\n\
             |---|---:|---:|---:|---:|---:|---:|",
            mpi.name()
        )?;
        for (i, c) in Config::ALL.iter().enumerate() {
            writeln!(
                report,
                "| {} | {:.0} ns | {} | {:.3} | {:.0} ns | {} | {:.3} |",
                c.name(),
                median(&l8[i]),
                spread(&l8[i], 0),
                median(&l8[i]) / b8,
                median(&l64[i]),
                spread(&l64[i], 0),
                median(&l64[i]) / b64,
            )?;
        }
        let inj: Vec<Injection> = runs[2]
            .iter()
            .flat_map(|r| r.injections.iter().copied())
            .collect();
        let total: Vec<f64> = inj.iter().map(|i| i.0).collect();
        let stopped: Vec<f64> = inj.iter().map(|i| i.1).collect();
        let live: Vec<f64> = inj.iter().map(|i| i.2).collect();
        writeln!(
            report,
            "\n{} injections ({REPS} jobs × 2 ranks), per rank:\n\n\
             | figure | median | max | goal |\n|---|---:|---:|---:|\n\
             | request to handover (\"in all\") | {:.0} ms | {:.0} ms | ≤ 250 ms |\n\
             | thread stopped | {:.2} ms | {:.2} ms | ≤ 20 ms |\n\
             | stop to the shim's commit (`dlopen`, set-up, slots) | {:.1} ms | {:.1} ms | – |\n",
            inj.len(),
            median(&total),
            max(&total),
            median(&stopped),
            max(&stopped),
            median(&live),
            max(&live),
        )?;
    }
    write_report(root, "benchmarks-inject.md", report, &load_before)
}
