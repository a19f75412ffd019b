//! `cargo xtask bench finalize`: what the shim's exit knock
//! (`shim/src/stats/exit_handover.rs`) costs a rank at `MPI_Finalize`.
//!
//! A tiny program (below, [`PROGRAM`]) runs 2 ranks with the shim's
//! `stats` layer preloaded: `MPI_Init`, a pause of [`PAUSE_MS`] (a short
//! job's life), 10 barriers, then `MPI_Finalize` timed with
//! `clock_gettime(CLOCK_MONOTONIC)` around it; each rank prints its time.
//! The knock runs inside it, after `PMPI_Finalize`, just before the shim
//! unlinks its segment. The library's own `MPI_Finalize` takes milliseconds
//! and varies by as much from run to run, so a PMPI tool below `stats`
//! ([`TOOL`], `MPI_TOOLS_ENTRY=stats,TOOL`) times `PMPI_Finalize` alone:
//! the shim's part of a rank's `MPI_Finalize` (the knock, the unlink, the
//! dispatch) is the program's time minus the tool's, per rank.
//! Configurations, for Open MPI and MPICH:
//! - no daemon: the knock is one failed connect (nothing listens at the
//!   default socket);
//! - a daemon, `attach --all` with its default eBPF discovery, and
//!   `attach --all --no-bpf`, each listening under the default
//!   `--handover-socket`: the daemon holds the segment, then answers;
//! - each of those with the knock disabled by the job
//!   (`MPI_OBSERVER_HANDOVER_SOCKET=none`), so the knock's cost is the
//!   difference under the same daemon, whose own work (attaching the
//!   ranks) the two share.
//!
//! Every configuration runs [`JOBS`] jobs per round, [`ROUNDS`] rounds
//! round-robin in one invocation, a daemon started afresh for each of its
//! turns. The report gives the median and p90 of every rank's times, the
//! knock's outcomes as the daemon counted them
//! (`mpi_observer_exit_handovers_total`), and the distance from the shim's
//! bound on its wait (250 ms). Results go to `docs/benchmarks-finalize.md`
//! with the command and the machine.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{ErrorKind, Read as _, Write as _},
    net::TcpStream,
    os::unix::net::UnixStream,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::bench_common::{
    Mpi, drain, field, free_port, lines, loadavg, machine, median, quantile, reap,
    release_binaries, signal, wait_line, write_report,
};

/// Rounds; odd, so the median is a run.
const ROUNDS: usize = 9;
/// Jobs per configuration and round.
const JOBS: usize = 3;
/// Ranks per job.
const NP: u32 = 2;
/// The pause between `MPI_Init` and the barriers, ms.
const PAUSE_MS: u32 = 200;
/// The shim's bound on its wait for the daemon's answer.
const BOUND_MS: f64 = 250.0;
/// The socket a shim knocks at unless told otherwise.
const SOCKET: &str = "/run/mpi-observer/handover.sock";

/// The timed program.
const PROGRAM: &str = r#"/* cargo xtask bench finalize: the time MPI_Finalize takes.
 * usage: finalize MS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    usleep((useconds_t)(argc > 1 ? atoi(argv[1]) : 0) * 1000);
    for (int i = 0; i < 10; i++) MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_us();
    int rc = MPI_Finalize();
    double t1 = now_us();
    printf("FINALIZE rank=%d us=%.1f rc=%d\n", rank, t1 - t0, rc);
    fflush(stdout);
    return rc;
}
"#;

/// The PMPI tool below `stats` that times the library's `MPI_Finalize`.
const TOOL: &str = r#"/* cargo xtask bench finalize: the library's own MPI_Finalize, timed from
 * the level just above the library (MPI_TOOLS_ENTRY=stats,THIS). */
#include <mpi.h>
#include <stdio.h>
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int MPI_Finalize(void) {
    int rank = -1;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    double t0 = now_us();
    int rc = PMPI_Finalize();
    double t1 = now_us();
    printf("LIBRARY rank=%d us=%.1f\n", rank, t1 - t0);
    fflush(stdout);
    return rc;
}
"#;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Daemon {
    None,
    Bpf,
    NoBpf,
}

impl Daemon {
    fn name(self) -> &'static str {
        match self {
            Daemon::None => "none",
            Daemon::Bpf => "`attach --all` (eBPF)",
            Daemon::NoBpf => "`attach --all --no-bpf`",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
struct Config {
    mpi: Mpi,
    daemon: Daemon,
    /// The job lets the shim knock (else `MPI_OBSERVER_HANDOVER_SOCKET=none`).
    knock: bool,
}

/// One configuration's turn: every rank's `MPI_Finalize` time and the
/// shim's part of it, µs, and the daemon's knock outcomes (result label →
/// count).
struct Turn {
    us: Vec<f64>,
    shim_us: Vec<f64>,
    outcomes: BTreeMap<String, u64>,
    /// Processes the daemon attached other than ours (another user's MPI
    /// job on this shared machine would disturb the figures).
    foreign: usize,
}

/// Whether something answers at the default socket (another daemon).
fn socket_answers() -> bool {
    match UnixStream::connect(SOCKET) {
        Ok(_) => true,
        // A SOCK_SEQPACKET listener refuses a stream connect with this.
        Err(e) if e.raw_os_error() == Some(91) => true,
        Err(e) => !matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused),
    }
}

/// `mpi_observer_exit_handovers_total` by result, from the daemon's
/// self-metrics.
fn outcomes(port: u16) -> Result<BTreeMap<String, u64>> {
    let mut c = TcpStream::connect(("127.0.0.1", port))?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")?;
    let mut body = String::new();
    c.read_to_string(&mut body)?;
    let mut out = BTreeMap::new();
    for l in body
        .lines()
        .filter(|l| l.starts_with("mpi_observer_exit_handovers_total{"))
    {
        let Some(result) = l
            .split("result=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
        else {
            continue;
        };
        let n: f64 = l.rsplit(' ').next().unwrap_or("0").parse().unwrap_or(0.0);
        if n > 0.0 {
            out.insert(result.to_string(), n as u64);
        }
    }
    Ok(out)
}

/// The µs each rank printed after `tag` (`FINALIZE`, `LIBRARY`), by rank.
fn by_rank(out: &str, tag: &str) -> BTreeMap<u32, f64> {
    out.lines()
        .filter(|l| l.starts_with(tag))
        .filter_map(|l| Some((field(l, "rank=").ok()? as u32, field(l, "us=").ok()?)))
        .collect()
}

fn turn(observer: &Path, shim: &Path, exe: &Path, tool: &Path, c: Config) -> Result<Turn> {
    let mut daemon = None;
    let port = free_port()?;
    if c.daemon != Daemon::None {
        let mut d = Command::new(observer);
        d.args(["attach", "--all"])
            .args(["--listen", &format!("127.0.0.1:{port}")]);
        if c.daemon == Daemon::NoBpf {
            d.arg("--no-bpf");
        }
        let mut d = d
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .context("starting mpi-observer")?;
        let err = lines(d.stderr.take().context("stderr")?);
        let (_, before) = wait_line(&err, "serving", "mpi-observer")?;
        if let Some(l) = before.iter().find(|l| l.contains("handover socket")) {
            signal(&d, "-TERM");
            let _ = d.wait();
            bail!("the daemon has no handover socket: {l}");
        }
        daemon = Some((d, err));
    } else if socket_answers() {
        bail!("something answers at {SOCKET}: stop that daemon first");
    }
    let env: &[(&str, &str)] = if c.knock {
        &[]
    } else {
        &[("MPI_OBSERVER_HANDOVER_SOCKET", "none")]
    };
    let list = format!("stats,{}", tool.display());
    let (mut us, mut shim_us) = (Vec::new(), Vec::new());
    for _ in 0..JOBS {
        let o = c
            .mpi
            .job_env(NP, Some((shim, &list)), env, exe)
            .arg(PAUSE_MS.to_string())
            .output()
            .context("running the finalize program")?;
        let out = String::from_utf8_lossy(&o.stdout);
        let total = by_rank(&out, "FINALIZE ");
        let library = by_rank(&out, "LIBRARY ");
        let ok = out.lines().filter(|l| l.contains(" rc=0")).count();
        if !o.status.success()
            || ok != NP as usize
            || total.len() != NP as usize
            || library.len() != NP as usize
        {
            bail!(
                "{} job failed ({}): {out}{}",
                c.mpi.name(),
                o.status,
                String::from_utf8_lossy(&o.stderr)
            );
        }
        for (rank, t) in &total {
            us.push(*t);
            shim_us.push(t - library[rank]);
        }
    }
    let mut t = Turn {
        us,
        shim_us,
        outcomes: BTreeMap::new(),
        foreign: 0,
    };
    if let Some((mut d, err)) = daemon {
        t.outcomes = outcomes(port)?;
        signal(&d, "-TERM");
        reap(&mut d, "mpi-observer")?;
        t.foreign = drain(&err)
            .iter()
            .filter(|l| l.contains("attached to pid") && !l.contains("(finalize"))
            .count();
    }
    Ok(t)
}

/// `cargo xtask bench finalize`.
pub fn run(root: &Path) -> Result<()> {
    let (observer, shim) = release_binaries(root)?;
    let work = root.join("target/bench-finalize");
    fs::create_dir_all(&work)?;
    let src = work.join("finalize.c");
    fs::write(&src, PROGRAM)?;
    let tool_src = work.join("libfintime.c");
    fs::write(&tool_src, TOOL)?;
    let mpis = [Mpi::OpenMpi, Mpi::Mpich];
    for mpi in mpis {
        mpi.mpicc(&[], &src, &work.join(format!("finalize.{}", mpi.suffix())))?;
        mpi.mpicc(
            &["-shared", "-fPIC"],
            &tool_src,
            &work.join(format!("libfintime.{}.so", mpi.suffix())),
        )?;
    }
    let mut configs = Vec::new();
    for mpi in mpis {
        for daemon in [Daemon::None, Daemon::Bpf, Daemon::NoBpf] {
            for knock in [true, false] {
                configs.push(Config { mpi, daemon, knock });
            }
        }
    }
    let load_before = loadavg();
    let started = Instant::now();
    let mut round = 0;
    let results = crate::bench_common::round_robin(&configs, ROUNDS, |c| {
        if c == configs[0] {
            round += 1;
            println!(
                "bench finalize: round {round} of {ROUNDS} at {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
        let exe = work.join(format!("finalize.{}", c.mpi.suffix()));
        let tool = work.join(format!("libfintime.{}.so", c.mpi.suffix()));
        turn(&observer, &shim, &exe, &tool, c)
    })?;
    let mut report = String::new();
    let _ = writeln!(
        report,
        "# `cargo xtask bench finalize`\n\nMachine: {}\n\n\
         Command: `cargo xtask bench finalize` (as root; the program and the tool are in \
         `xtask/src/bench_finalize.rs`). {NP} ranks with the shim preloaded, \
         `MPI_TOOLS_ENTRY=stats,libfintime.so`: `MPI_Init`, {PAUSE_MS} ms, 10 barriers, \
         then `MPI_Finalize` timed with `clock_gettime(CLOCK_MONOTONIC)` around it \
         (**total**); the tool below `stats` times the library's `PMPI_Finalize` the \
         same way, and **shim** = total − library, per rank: the knock, the segment's \
         unlink, the dispatch. {JOBS} jobs per configuration and round, {ROUNDS} rounds \
         round-robin in one run of {:.0} s; a daemon started afresh for each turn. \
         Every rank's times ({} per configuration): median, p90, max, in µs. Knock off: \
         the job sets `MPI_OBSERVER_HANDOVER_SOCKET=none`. Outcomes: \
         `mpi_observer_exit_handovers_total` by result, summed over the turns.\n",
        machine(),
        started.elapsed().as_secs_f64(),
        ROUNDS * JOBS * NP as usize,
    );
    let _ = writeln!(
        report,
        "| MPI | daemon | knock | total: median / p90 / max | shim: median / p90 / max | \
         knock's cost, shim on − off (medians) | shim's max vs the 250 ms bound | outcomes |\n\
         |---|---|---|---|---|---|---|---|"
    );
    struct All {
        us: Vec<f64>,
        shim_us: Vec<f64>,
        outcomes: BTreeMap<String, u64>,
        foreign: usize,
    }
    let all = |c: &Config| -> All {
        let i = configs.iter().position(|x| x == c).expect("configuration");
        let mut a = All {
            us: Vec::new(),
            shim_us: Vec::new(),
            outcomes: BTreeMap::new(),
            foreign: 0,
        };
        for t in &results[i] {
            a.us.extend(&t.us);
            a.shim_us.extend(&t.shim_us);
            for (k, v) in &t.outcomes {
                *a.outcomes.entry(k.clone()).or_insert(0) += v;
            }
            a.foreign += t.foreign;
        }
        a
    };
    let three = |v: &[f64]| {
        format!(
            "{:.1} / {:.1} / {:.1}",
            median(v),
            quantile(v, 0.9),
            v.iter().copied().fold(0.0, f64::max)
        )
    };
    let mut foreign_total = 0;
    for c in &configs {
        let a = all(c);
        foreign_total += a.foreign;
        let off = all(&Config { knock: false, ..*c });
        let cost = if c.knock {
            format!("{:+.1} µs", median(&a.shim_us) - median(&off.shim_us))
        } else {
            "–".into()
        };
        let max = a.shim_us.iter().copied().fold(0.0, f64::max) / 1e3;
        let bound = format!(
            "{:.2} % ({:.1} ms below)",
            max / BOUND_MS * 100.0,
            BOUND_MS - max
        );
        let out = if c.daemon == Daemon::None {
            "–".to_string()
        } else if a.outcomes.is_empty() {
            "none counted".to_string()
        } else {
            a.outcomes
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            report,
            "| {} | {} | {} | {} | {} | {cost} | {bound} | {out} |",
            c.mpi.name(),
            c.daemon.name(),
            if c.knock { "on" } else { "off" },
            three(&a.us),
            three(&a.shim_us),
        );
    }
    let _ = writeln!(
        report,
        "\nProcesses the daemons attached besides the benchmark's ranks (another \
         user's MPI job would disturb the figures): {foreign_total}.\n"
    );
    write_report(root, "benchmarks-finalize.md", report, &load_before)
}
