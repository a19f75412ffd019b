//! `cargo xtask bench kmaps`: what the statistics map shared by the CPUs
//! (atomic adds) costs per call against the per-CPU map it replaced.
//!
//! One rank of `tests/programs/kmaps/threads.c` (Open MPI) calls
//! `MPI_Comm_rank` from 1 and from 4 threads at once (4 threads on this
//! VM's 2 CPUs: two CPUs adding to the same entry, the case atomic adds make
//! dearer). Three configurations: no probe, the daemon with the per-CPU map
//! (`MPI_OBSERVER_BENCH_PERCPU_STATS=1`, which selects the old design kept
//! in the object for this comparison), and the daemon with the shared map.
//! They run round-robin `REPS` times in one run, so drift on a shared VM hits
//! them alike; each run gives the mean thread CPU ns per call, the report
//! quotes medians and the probe cost (observed minus no probe). Every
//! observed run must have counted every call exactly.
//! Results go to `docs/benchmarks-kmaps.md`, with the command and the
//! machine; the figures are quoted in BENCHMARKS.md.

use std::{
    fmt::Write as _,
    fs,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc::{self, Receiver},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench_common::{Mpi, field, loadavg, machine, median, round_robin, spread, write_report},
    cargo,
    setup::run_cmd,
};

/// Repetitions of every configuration; odd, so the median is a run.
const REPS: usize = 7;
/// Calls per thread.
const CALLS: u64 = 200_000;
/// Threads per run.
const THREADS: [u64; 2] = [1, 4];
/// How long any one step may take.
const STEP: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, PartialEq, Debug)]
enum Map {
    None,
    PerCpu,
    Shared,
}

impl Map {
    fn name(self) -> &'static str {
        match self {
            Map::None => "no probe",
            Map::PerCpu => "per-CPU map (before)",
            Map::Shared => "shared map, atomic adds (after)",
        }
    }
}

/// Lines of a child's pipe, read on a thread so waits can time out.
fn lines(r: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for l in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits up to STEP for a line containing `needle`.
fn wait_line(rx: &Receiver<String>, needle: &str, who: &str) -> Result<String> {
    let end = Instant::now() + STEP;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(needle) => return Ok(l),
            Ok(_) => {}
            Err(e) => bail!("{who}: no line with `{needle}`: {e}"),
        }
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `mpi_calls_total` of MPI_Comm_rank in the daemon's exposition, summed.
fn counted(port: u16) -> Option<u64> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    c.read_to_string(&mut body).ok()?;
    let n = body
        .lines()
        .filter(|l| l.starts_with("mpi_calls_total{") && l.contains("function=\"MPI_Comm_rank\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    Some(n as u64)
}

fn reap(c: &mut Child, who: &str) -> Result<()> {
    let end = Instant::now() + STEP;
    while Instant::now() < end {
        if let Some(st) = c.try_wait()? {
            if !st.success() {
                bail!("{who} failed: {st}");
            }
            return Ok(());
        }
        thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
    bail!("{who} did not finish within {STEP:?}")
}

/// One run: mean thread CPU ns per call with `threads` threads under `map`.
fn run_once(observer: &Path, exe: &Path, work: &Path, map: Map, threads: u64) -> Result<f64> {
    let go = work.join("go");
    let _ = fs::remove_file(&go);
    let mut job = Mpi::OpenMpi
        .job(1, None, exe)
        .args([threads.to_string(), CALLS.to_string()])
        .arg(&go)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the threads program")?;
    let out = lines(job.stdout.take().context("stdout")?);
    let ready = wait_line(&out, "READY ", "threads")?;
    let pid = ready
        .split_whitespace()
        .nth(2)
        .context("pid in READY")?
        .to_string();
    let port = free_port()?;
    let mut daemon = None;
    if map != Map::None {
        let mut d = Command::new(observer);
        d.args(["attach", "--pid", &pid, "--functions", "MPI_Comm_rank"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stderr(Stdio::piped())
            .stdout(Stdio::null());
        if map == Map::PerCpu {
            d.env("MPI_OBSERVER_BENCH_PERCPU_STATS", "1");
        }
        let mut d = d.spawn().context("starting mpi-observer")?;
        let err = lines(d.stderr.take().context("stderr")?);
        wait_line(&err, "attached to pid", "mpi-observer")?;
        daemon = Some((d, err));
    }
    // The same pause in every configuration, so start-up work settles.
    thread::sleep(Duration::from_millis(200));
    fs::write(&go, "")?;
    let ok = wait_line(&out, "OK ", "threads")?;
    let ns = field(&ok, "ns=")?;
    reap(&mut job, "threads")?;
    fs::remove_file(&go)?;
    if let Some((mut d, _err)) = daemon {
        let want = threads * CALLS;
        let end = Instant::now() + STEP;
        loop {
            let n = counted(port).unwrap_or(0);
            if n == want {
                break;
            }
            if Instant::now() > end {
                bail!("{}: counted {n} calls, made {want}", map.name());
            }
            thread::sleep(Duration::from_millis(100));
        }
        run_cmd(Command::new("kill").args(["-TERM", &d.id().to_string()]))?;
        reap(&mut d, "mpi-observer")?;
    }
    Ok(ns)
}

/// `cargo xtask bench kmaps`.
pub fn run(root: &Path) -> Result<()> {
    run_cmd(cargo().args(["build", "--release", "-p", "mpi-observer"]))?;
    let observer = root.join("target/release/mpi-observer");
    let work = root.join("target/bench-kmaps");
    fs::create_dir_all(&work)?;
    let exe = work.join("threads");
    Mpi::OpenMpi.mpicc(
        &["-pthread"],
        &root.join("tests/programs/kmaps/threads.c"),
        &exe,
    )?;
    let load_before = loadavg();
    let started = Instant::now();
    let maps = [Map::None, Map::PerCpu, Map::Shared];
    let configs: Vec<(Map, u64)> = THREADS
        .iter()
        .flat_map(|&t| maps.iter().map(move |&m| (m, t)))
        .collect();
    let results = round_robin(&configs, REPS, |(m, t)| {
        run_once(&observer, &exe, &work, m, t)
    })?;
    let mut report = String::new();
    let _ = writeln!(
        report,
        "# `cargo xtask bench kmaps`\n\nMachine: {}\n\n\
         One Open MPI rank, `MPI_Comm_rank` from T threads at once, {CALLS} calls each; \
         {REPS} runs of every configuration, round-robin in one run of {:.0} s. Thread CPU \
         ns per call, median (lowest–highest); probe cost = observed − no probe. Every \
         observed run counted every call exactly.\n\n\
         | threads | configuration | ns/call | probe cost |\n|---|---|---|---|",
        machine(),
        started.elapsed().as_secs_f64()
    );
    for &t in &THREADS {
        let of = |m: Map| {
            configs
                .iter()
                .position(|&c| c == (m, t))
                .map(|i| &results[i])
                .expect("configuration")
        };
        let base = median(of(Map::None));
        for m in maps {
            let v = of(m);
            let cost = if m == Map::None {
                "–".to_string()
            } else {
                format!("{:.1} ns", median(v) - base)
            };
            let _ = writeln!(
                report,
                "| {t} | {} | {:.1} ({}) | {cost} |",
                m.name(),
                median(v),
                spread(v, 1)
            );
        }
    }
    report.push('\n');
    write_report(root, "benchmarks-kmaps.md", report, &load_before)
}
