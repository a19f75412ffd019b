//! `cargo xtask bench scan`: the daemon's CPU per `attach --all` fallback
//! scan of `/proc`, by how many processes it remembers as not MPI.
//!
//! Every second the scan reads each process's `/proc/PID/stat`, then
//! `/proc/PID/comm` of every process it remembers as not MPI (a changed
//! name, an exec since, gets it looked at again), then `stat` again to
//! forget the ones gone (`observer/src/daemon/mod.rs`, `Scanner`). This
//! bench adds N idle non-MPI processes (`sleep 600` children; N in
//! [`COUNTS`]) to the machine's own, starts the daemon (`attach --all`,
//! with its default eBPF exec events and with `--no-bpf`, the process
//! connector), lets [`SETTLE`] pass (the first scan reads every process's
//! maps once), then over [`WINDOW`] reads the daemon's CPU time (utime +
//! stime of `/proc/PID/stat`, and the threads' `schedstat`, in ns) and
//! counts its scans with a bpftrace uprobe and uretprobe on
//! `Scanner::scan` (which also gives each scan's wall time). CPU per scan
//! = CPU over the window / scans; the cost per 1,000 remembered processes
//! is (CPU per scan at N − at 0) / (N / 1,000), within one round.
//!
//! [`ROUNDS`] rounds; each runs every (N, source) once, the sleeps grown
//! from 0 to 1,000 to 5,000 and killed at its end. The daemon attaching
//! another user's MPI process meanwhile would disturb a window: the report
//! counts them. Results go to `docs/benchmarks-scan.md` with the command
//! and the machine.

use std::{
    fmt::Write as _,
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench_common::{
        drain, free_port, lines, loadavg, machine, median, reap, signal, spread, wait_line,
        write_report,
    },
    cargo,
    setup::run_cmd,
};

/// Rounds; odd, so the median is a run.
const ROUNDS: usize = 3;
/// Idle non-MPI processes added.
const COUNTS: [usize; 3] = [0, 1000, 5000];
/// From the daemon's start to the window: the first scans read every new
/// process's maps once.
const SETTLE: Duration = Duration::from_secs(3);
/// The measured window.
const WINDOW: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, PartialEq, Debug)]
enum Source {
    Bpf,
    NoBpf,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Bpf => "`attach --all` (eBPF exec events)",
            Source::NoBpf => "`attach --all --no-bpf` (process connector)",
        }
    }
}

/// One window.
#[derive(Clone, Copy, Debug)]
struct Window {
    /// utime + stime, ns (clock ticks × 10^9 / CLK_TCK).
    stat_ns: f64,
    /// Sum of the threads' time on CPU (`schedstat`), ns.
    sched_ns: f64,
    scans: u64,
    /// Wall time inside `Scanner::scan`, ns, all scans together.
    scan_wall_ns: f64,
    /// Processes in /proc at the window's start.
    procs: usize,
    /// Processes the daemon attached (other users' MPI jobs).
    foreign: usize,
}

impl Window {
    fn per_scan_us(&self) -> f64 {
        self.sched_ns / self.scans.max(1) as f64 / 1e3
    }
    fn per_scan_stat_us(&self) -> f64 {
        self.stat_ns / self.scans.max(1) as f64 / 1e3
    }
}

/// The `sleep 600` children; killed (by their own pids) when dropped.
#[derive(Default)]
struct Sleepers(Vec<Child>);

impl Sleepers {
    fn grow_to(&mut self, n: usize) -> Result<()> {
        while self.0.len() < n {
            let c = Command::new("sleep")
                .arg("600")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting `sleep 600`")?;
            self.0.push(c);
        }
        Ok(())
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

/// utime + stime of `pid`, in clock ticks.
fn stat_ticks(pid: u32) -> Result<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = s.rsplit_once(')').context("stat")?.1;
    // Fields 14 and 15 (utime, stime); `rest` starts at field 3.
    let f: Vec<&str> = rest.split_whitespace().collect();
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

/// The time on CPU of every thread of `pid`, ns (first `schedstat` field).
fn sched_ns(pid: u32) -> Result<u64> {
    let mut sum = 0;
    for t in fs::read_dir(format!("/proc/{pid}/task"))? {
        let s = fs::read_to_string(t?.path().join("schedstat")).unwrap_or_default();
        sum += s
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(sum)
}

fn processes() -> usize {
    fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .count()
        })
        .unwrap_or(0)
}

fn clk_tck() -> f64 {
    crate::bench_common::first_line("getconf", &["CLK_TCK"])
        .parse()
        .unwrap_or(100.0)
}

/// The mangled name of `Scanner::scan` in the daemon's binary.
fn scan_symbol(observer: &Path) -> Result<String> {
    let o = Command::new("nm")
        .arg(observer)
        .output()
        .context("running nm")?;
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .find(|s| s.contains("6daemon7Scanner4scan"))
        .map(str::to_string)
        .with_context(|| {
            format!(
                "no Scanner::scan symbol in {} (inlined?): the scans cannot be counted",
                observer.display()
            )
        })
}

fn window(observer: &Path, symbol: &str, source: Source, tck: f64) -> Result<Window> {
    let mut d = Command::new(observer);
    d.args(["attach", "--all"])
        .args(["--listen", &format!("127.0.0.1:{}", free_port()?)]);
    if source == Source::NoBpf {
        d.arg("--no-bpf");
    }
    let mut d = d
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .context("starting mpi-observer")?;
    let err = lines(d.stderr.take().context("stderr")?);
    let pid = d.id();
    let result = (|| -> Result<Window> {
        wait_line(&err, "serving", "mpi-observer")?;
        thread::sleep(SETTLE);
        let prog = format!(
            "uprobe:{bin}:{symbol} /pid == {pid}/ {{ @start[tid] = nsecs; }}\n\
             uretprobe:{bin}:{symbol} /pid == {pid} && @start[tid]/ {{ \
             @scans = count(); @wall = sum(nsecs - @start[tid]); delete(@start[tid]); }}\n",
            bin = observer.display()
        );
        let mut bt = Command::new("bpftrace")
            .args(["-e", &prog])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting bpftrace")?;
        let out = lines(bt.stdout.take().context("stdout")?);
        let bt_err = lines(bt.stderr.take().context("stderr")?);
        if let Err(e) = wait_line(&out, "Attaching", "bpftrace") {
            signal(&bt, "-KILL");
            let _ = bt.wait();
            let why: Vec<String> = bt_err.try_iter().collect();
            bail!("{e}; bpftrace said: {}", why.join(" / "));
        }
        let procs = processes();
        let (s0, c0) = (stat_ticks(pid)?, sched_ns(pid)?);
        thread::sleep(WINDOW);
        let (s1, c1) = (stat_ticks(pid)?, sched_ns(pid)?);
        signal(&bt, "-INT");
        let _ = bt.wait();
        let text = drain(&out);
        let value = |key: &str| -> f64 {
            text.iter()
                .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
                .unwrap_or(0.0)
        };
        Ok(Window {
            stat_ns: (s1 - s0) as f64 * 1e9 / tck,
            sched_ns: (c1 - c0) as f64,
            scans: value("@scans:") as u64,
            scan_wall_ns: value("@wall:"),
            procs,
            foreign: 0,
        })
    })();
    signal(&d, "-TERM");
    reap(&mut d, "mpi-observer")?;
    let mut w = result?;
    w.foreign = drain(&err)
        .iter()
        .filter(|l| l.contains("attached to pid"))
        .count();
    if w.scans == 0 {
        bail!("bpftrace counted no scan of {source:?} in {WINDOW:?}");
    }
    Ok(w)
}

/// `cargo xtask bench scan`.
pub fn run(root: &Path) -> Result<()> {
    run_cmd(cargo().args(["build", "--release", "-p", "mpi-observer"]))?;
    let observer = root.join("target/release/mpi-observer");
    let symbol = scan_symbol(&observer)?;
    let tck = clk_tck();
    let sources = [Source::Bpf, Source::NoBpf];
    let load_before = loadavg();
    let started = Instant::now();
    // results[round][count][source]
    let mut results = Vec::new();
    for round in 0..ROUNDS {
        let mut sleepers = Sleepers::default();
        let mut by_count = Vec::new();
        for &n in &COUNTS {
            sleepers.grow_to(n)?;
            let mut by_source = Vec::new();
            for &s in &sources {
                println!(
                    "bench scan: round {} of {ROUNDS}, {n} sleeps, {s:?}, at {:.0} s",
                    round + 1,
                    started.elapsed().as_secs_f64()
                );
                by_source.push(window(&observer, &symbol, s, tck)?);
            }
            by_count.push(by_source);
        }
        drop(sleepers);
        results.push(by_count);
    }
    let mut report = String::new();
    let _ = writeln!(
        report,
        "# `cargo xtask bench scan`\n\nMachine: {}\n\n\
         Command: `cargo xtask bench scan` (as root; needs bpftrace). N idle `sleep 600` \
         children added to the machine's own processes; the daemon started afresh for \
         each window, {} s after its start a window of {} s: its CPU time (all threads' \
         `schedstat`, and utime + stime of `/proc/PID/stat` in ticks of 1/{tck:.0} s) and \
         its scans (a bpftrace uprobe/uretprobe on `Scanner::scan`, which also gives the \
         wall time inside it). {ROUNDS} rounds, each every (N, source) once; medians of \
         the rounds (lowest–highest). Run of {:.0} s.\n",
        machine(),
        SETTLE.as_secs(),
        WINDOW.as_secs(),
        started.elapsed().as_secs_f64()
    );
    let _ = writeln!(
        report,
        "| source | N added | processes in /proc | scans/s | CPU per scan, µs (schedstat) | \
         CPU per scan, µs (utime+stime) | wall in `scan`, µs per scan | daemon CPU, % of a core | \
         added per 1,000 processes, µs CPU per scan |\n|---|---|---|---|---|---|---|---|---|"
    );
    let mut foreign = 0;
    for (si, s) in sources.iter().enumerate() {
        for (ci, &n) in COUNTS.iter().enumerate() {
            let ws: Vec<Window> = results.iter().map(|r| r[ci][si]).collect();
            foreign += ws.iter().map(|w| w.foreign).sum::<usize>();
            let f = |g: &dyn Fn(&Window) -> f64| ws.iter().map(g).collect::<Vec<f64>>();
            let per = f(&|w| w.per_scan_us());
            let per_stat = f(&|w| w.per_scan_stat_us());
            let wall = f(&|w| w.scan_wall_ns / w.scans.max(1) as f64 / 1e3);
            let rate = f(&|w| w.scans as f64 / WINDOW.as_secs_f64());
            let core = f(&|w| w.sched_ns / WINDOW.as_secs_f64() / 1e7);
            let procs = f(&|w| w.procs as f64);
            let added = if n == 0 {
                "–".to_string()
            } else {
                // Paired within each round: the same machine minutes.
                let v: Vec<f64> = results
                    .iter()
                    .map(|r| {
                        (r[ci][si].per_scan_us() - r[0][si].per_scan_us()) / (n as f64 / 1000.0)
                    })
                    .collect();
                format!("**{:.0}** ({})", median(&v), spread(&v, 0))
            };
            let _ = writeln!(
                report,
                "| {} | {n} | {:.0} | {:.2} | {:.0} ({}) | {:.0} ({}) | {:.0} | {:.2} | {added} |",
                s.name(),
                median(&procs),
                median(&rate),
                median(&per),
                spread(&per, 0),
                median(&per_stat),
                spread(&per_stat, 0),
                median(&wall),
                median(&core),
            );
        }
    }
    let _ = writeln!(
        report,
        "\nProcesses the daemons attached during the windows (another user's MPI job; \
         each would add its attach to that window): {foreign}.\n"
    );
    write_report(root, "benchmarks-scan.md", report, &load_before)
}

/// How one pass reads a remembered process.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Reads {
    /// As `Scanner::scan` does: `stat` (`read_to_end`), `comm`
    /// (`read_to_string`), then `stat` again in the pass that forgets
    /// processes gone.
    Daemon,
    /// One open and one read of `stat` into a fixed buffer, the comm taken
    /// from its field 2, no second read.
    Once,
}

/// Thread CPU of the calling thread, ns (first `schedstat` field).
fn thread_ns() -> u64 {
    fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Start ticks (field 22) and comm (field 2) of a `stat` text.
fn parse_stat(text: &str) -> Option<(u64, &str)> {
    let (head, rest) = text.rsplit_once(')')?;
    let comm = head.split_once('(')?.1;
    let ticks = rest.split_whitespace().nth(19)?.parse().ok()?;
    Some((ticks, comm))
}

/// One pass over `pids` the `how` way; the number of processes read.
fn pass(pids: &[u32], how: Reads) -> usize {
    use std::io::Read as _;
    let mut seen = 0;
    for &pid in pids {
        match how {
            Reads::Daemon => {
                let stat = || -> Option<u64> {
                    let f = fs::File::open(format!("/proc/{pid}/stat")).ok()?;
                    let mut buf = Vec::new();
                    f.take(4097).read_to_end(&mut buf).ok()?;
                    parse_stat(&String::from_utf8_lossy(&buf)).map(|(t, _)| t)
                };
                let Some(t) = stat() else { continue };
                let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                if stat() == Some(t) && !comm.is_empty() {
                    seen += 1;
                }
            }
            Reads::Once => {
                let Ok(mut f) = fs::File::open(format!("/proc/{pid}/stat")) else {
                    continue;
                };
                let mut buf = [0u8; 1024];
                let Ok(n) = f.read(&mut buf) else { continue };
                let text = String::from_utf8_lossy(&buf[..n]);
                if parse_stat(&text).is_some_and(|(_, c)| !c.is_empty()) {
                    seen += 1;
                }
            }
        }
    }
    seen
}

/// `cargo xtask bench scan-reads`: the scan's reads of a remembered
/// process, the daemon's way against one read of `stat`, timed in this
/// process (thread CPU) over every process with [`READS_SLEEPS`] idle ones
/// added; [`READS_ROUNDS`] passes of each, alternating. Not the product's
/// code: its read pattern, copied, to size a cheaper scan. Run it optimized
/// (`cargo run --release -p xtask -- bench scan-reads`), as the daemon is.
/// Results go to `docs/benchmarks-scan-reads.md`.
pub fn run_reads(root: &Path) -> Result<()> {
    let load_before = loadavg();
    let mut sleepers = Sleepers::default();
    sleepers.grow_to(READS_SLEEPS)?;
    thread::sleep(Duration::from_secs(1));
    let pids: Vec<u32> = fs::read_dir("/proc")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let ways = [Reads::Daemon, Reads::Once];
    let results = crate::bench_common::round_robin(&ways, READS_ROUNDS, |how| {
        let t0 = thread_ns();
        let n = pass(&pids, how);
        let ns = thread_ns() - t0;
        Ok(ns as f64 / n.max(1) as f64 / 1e3)
    })?;
    drop(sleepers);
    let (daemon, once) = (median(&results[0]), median(&results[1]));
    let mut report = String::new();
    let _ = writeln!(
        report,
        "# `cargo xtask bench scan-reads`\n\nMachine: {}\n\n\
         Command: `cargo run --release -p xtask -- bench scan-reads` (optimized, as the \
         daemon is; `cargo xtask` builds xtask unoptimized). {} processes ({READS_SLEEPS} idle `sleep 600` \
         added); each pass reads every one of them, {READS_ROUNDS} passes of each way, \
         alternating; the thread's CPU (`schedstat`) per process, median (lowest–highest).\n\n\
         | reads per remembered process | µs CPU per process |\n|---|---|\n\
         | the daemon's: `stat` (`read_to_end`), `comm` (`read_to_string`), `stat` again | \
         {daemon:.1} ({}) |\n\
         | one open and one 1 KiB read of `stat`, comm from its field 2 | {once:.1} ({}) |\n\n\
         Ratio: {:.2}.\n",
        machine(),
        pids.len(),
        spread(&results[0], 1),
        spread(&results[1], 1),
        daemon / once
    );
    write_report(root, "benchmarks-scan-reads.md", report, &load_before)
}

/// Idle processes `scan-reads` adds.
const READS_SLEEPS: usize = 5000;
/// Passes of each way.
const READS_ROUNDS: usize = 9;
