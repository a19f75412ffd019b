//! `cargo xtask bench mechanisms`: what each attach mechanism (issue 35)
//! costs, on this machine's kernel, with Debian's Open MPI.
//!
//! 1. Probe cost per call of `PMPI_Comm_rank` (`attach --pid P --functions
//!    MPI_Comm_rank`): no probe, `uprobe_multi`, `perf_link` and
//!    `perf_ioctl` (forced with [`FORCE`]), in paired rounds: every
//!    configuration once per round, the order rotated; the median of the
//!    runs and of each round's ratio to the round's bare run.
//! 2. What a process that maps the library but is not observed pays under
//!    `--all`: a root rank is observed (the anchor), `--user-max-processes
//!    1` refuses root's second one, which then times its calls. With
//!    classic probes (`perf_link`) the library file is probed for every
//!    process mapping it, so the refused process traps; with
//!    `uprobe_multi` the links filter by pid. Paired rounds against the
//!    same program with no daemon at all.
//! 3. Attach and detach time and the daemon's perf-event and BPF-link
//!    descriptors for 1, 16 and 64 ranks of one job: `uprobe_multi` by
//!    pid and `--all`, `perf_link --all` (probes per file), and
//!    `perf_link` by pid for one rank only (a classic probe takes about a
//!    tenth of a second to close, one at a time in the kernel: more ranks
//!    would take minutes to detach). One run of each.
//!
//! The daemon is the release build already in `target/` (this bench does
//! not build it). The report is printed as the Markdown section of
//! BENCHMARKS.md and written to `target/bench-mechanisms/report.md`.

use std::{
    collections::HashSet,
    fmt::Write as _,
    fs,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc::{self, Receiver},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

pub mod guest;

use crate::bench_common::{
    Mpi, STEP, free_port, lines, loadavg, machine, median, reap, signal, spread, wait_line,
};

/// The daemon's hidden override of the mechanism.
const FORCE: &str = "MPI_OBSERVER_ATTACH_MECHANISM";
/// Rounds of the probe-cost part; odd, so the median is a run.
const REPS: usize = 9;
/// Rounds of the unobserved-process part.
const UNOBSERVED_REPS: usize = 9;
/// Timed batches per probe-cost run, and calls per batch.
const BATCHES: u32 = 15;
const CALLS: u32 = 4000;
/// Pause between the probes going in (or not) and the timed part.
const SETTLE: Duration = Duration::from_millis(200);
/// Ranks of the attach and detach part.
const SIZES: [u32; 3] = [1, 16, 64];
/// How long 64 oversubscribed ranks may take to start, and a daemon with
/// classic probes to close them.
const SLOW: Duration = Duration::from_secs(300);
/// The only implementation measured.
const MPI: Mpi = Mpi::OpenMpi;

/// A rank for the attach part: its pid in `DIR/pid.RANK`, then
/// `MPI_Comm_rank` every 100 ms and a barrier every second until
/// `DIR/stop` exists (rank 0 looks and tells the others).
const RANK_C: &str = r#"#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    char path[4096], tmp[4096], stop[4096];
    int rank, r;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    snprintf(path, sizeof path, "%s/pid.%d", argv[1], rank);
    snprintf(tmp, sizeof tmp, "%s/.pid.%d", argv[1], rank);
    snprintf(stop, sizeof stop, "%s/stop", argv[1]);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return 1;
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    rename(tmp, path);
    for (long i = 1;; i++) {
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        usleep(100000);
        if (i % 10 == 0) {
            int done = rank == 0 && access(stop, F_OK) == 0;
            MPI_Barrier(MPI_COMM_WORLD);
            MPI_Bcast(&done, 1, MPI_INT, 0, MPI_COMM_WORLD);
            if (done)
                break;
        }
    }
    MPI_Finalize();
    return 0;
}
"#;

/// An attach mechanism, as [`FORCE`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mech {
    UprobeMulti,
    PerfLink,
    PerfIoctl,
}

impl Mech {
    fn name(self) -> &'static str {
        match self {
            Mech::UprobeMulti => "uprobe_multi",
            Mech::PerfLink => "perf_link",
            Mech::PerfIoctl => "perf_ioctl",
        }
    }

    /// What the daemon's "attaching with" line says of it.
    fn said(self) -> &'static str {
        match self {
            Mech::UprobeMulti => "uprobe_multi links",
            Mech::PerfLink => "one BPF link per site",
            Mech::PerfIoctl => "attached by ioctl",
        }
    }
}

/// A running `mpi-observer attach`.
struct Daemon {
    child: Child,
    /// Its stderr lines, each with when it was read.
    err: Receiver<(Instant, String)>,
    spawned: Instant,
    port: u16,
    mech: Mech,
    /// Its stderr so far.
    log: Vec<String>,
}

/// What a daemon took to attach its ranks.
struct Attached {
    /// From spawning the daemon to the last rank's `attached` line.
    last: Duration,
    /// From spawning it until its first rank's attach began: that line's
    /// time less the milliseconds the line gives for the attach.
    first_began: Duration,
    /// The probes the lines name (`--pid`'s lines do; `--all`'s do not).
    probes: u64,
}

impl Daemon {
    /// Starts `attach ARGS` with `mech` forced.
    fn start(observer: &Path, mech: Mech, args: &[String]) -> Result<Daemon> {
        let port = free_port()?;
        let spawned = Instant::now();
        let mut child = Command::new(observer)
            .env(FORCE, mech.name())
            .arg("attach")
            .args(args)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--retain-exited", "0"])
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", observer.display()))?;
        let stderr = child.stderr.take().context("stderr")?;
        let (tx, err) = mpsc::channel();
        // Stamped as read, so a line's time does not depend on when the
        // bench gets to it.
        thread::spawn(move || {
            for l in BufReader::new(stderr).lines() {
                let Ok(l) = l else { break };
                let _ = tx.send((Instant::now(), l));
            }
        });
        Ok(Daemon {
            child,
            err,
            spawned,
            port,
            mech,
            log: Vec::new(),
        })
    }

    /// The next stderr line `want` accepts, within `limit`, and how long
    /// after the spawn it was read.
    fn wait(&mut self, limit: Duration, want: impl Fn(&str) -> bool) -> Result<(Duration, String)> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.err.recv_timeout(left) {
                Ok((at, l)) => {
                    self.log.push(l.clone());
                    if want(&l) {
                        return Ok((at.saturating_duration_since(self.spawned), l));
                    }
                }
                Err(e) => {
                    self.kill();
                    bail!(
                        "mpi-observer: {e} while waiting; it said:\n{}",
                        self.log.join("\n")
                    );
                }
            }
        }
    }

    /// Waits until every pid in `pids` is attached, and the daemon has said
    /// its mechanism (checked: the one forced) and that it serves, in
    /// whatever order it says them.
    fn attached(&mut self, pids: &[u32]) -> Result<Attached> {
        let mut left: HashSet<u32> = pids.iter().copied().collect();
        let mut got = Attached {
            last: Duration::ZERO,
            first_began: Duration::ZERO,
            probes: 0,
        };
        let mut first = true;
        // Its signal handlers are in once it serves: a SIGTERM before then
        // would kill it.
        let (mut serving, mut said) = (false, false);
        while !left.is_empty() || !serving || !said {
            let (at, l) = self.wait(SLOW, |l| {
                l.contains("attached to pid ")
                    || l.contains(": serving ")
                    || l.contains("attaching with")
            })?;
            if l.contains("attaching with") {
                if !l.contains(self.mech.said()) {
                    self.kill();
                    bail!("{FORCE}={}: the daemon said `{l}`", self.mech.name());
                }
                said = true;
            } else if l.contains(": serving ") {
                serving = true;
            } else if let Some(pid) = number_after(&l, "attached to pid ")
                && left.remove(&(pid as u32))
            {
                got.last = at;
                if first {
                    first = false;
                    let own = Duration::from_secs_f64(ms_before(&l).unwrap_or(0.0) / 1e3);
                    got.first_began = at.saturating_sub(own);
                }
                got.probes += number_after(&l, "(")
                    .filter(|_| l.contains(" probes"))
                    .unwrap_or(0);
            }
        }
        // The handlers go in just after the line that says it serves.
        thread::sleep(Duration::from_millis(100));
        Ok(got)
    }

    /// The daemon's open perf events and BPF links.
    fn fds(&self) -> Result<(usize, usize)> {
        let (mut perf, mut links) = (0, 0);
        for e in fs::read_dir(format!("/proc/{}/fd", self.child.id()))?.flatten() {
            let Ok(t) = fs::read_link(e.path()) else {
                continue;
            };
            let t = t.to_string_lossy();
            perf += usize::from(t == "anon_inode:[perf_event]");
            links += usize::from(t == "anon_inode:bpf_link");
        }
        Ok((perf, links))
    }

    /// SIGTERM; the time until it exited, which must be cleanly and after
    /// saying it detached.
    fn stop(mut self) -> Result<Duration> {
        let t = Instant::now();
        signal(&self.child, "-TERM");
        let took = loop {
            if let Some(st) = self.child.try_wait()? {
                let took = t.elapsed();
                if !st.success() {
                    bail!("mpi-observer exited with {st}: {}", self.log.join("\n"));
                }
                break took;
            }
            if t.elapsed() > SLOW {
                self.kill();
                bail!("mpi-observer did not exit within {SLOW:?} of SIGTERM");
            }
            thread::sleep(Duration::from_millis(2));
        };
        while let Ok((_, l)) = self.err.recv_timeout(Duration::from_secs(1)) {
            self.log.push(l);
        }
        if !self.log.iter().any(|l| l.contains("detached, exiting")) {
            bail!(
                "mpi-observer exited without `detached, exiting`:\n{}",
                self.log.join("\n")
            );
        }
        Ok(took)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    /// A daemon left by an error is killed (a no-op once it has exited).
    fn drop(&mut self) {
        self.kill();
    }
}

/// The number that starts right after `key` in `line`.
fn number_after(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The number before the ` ms)` that ends an `attached to pid` line.
fn ms_before(line: &str) -> Option<f64> {
    let end = line.rfind(" ms)")?;
    let start = line[..end].rfind([' ', '('])? + 1;
    line[start..end].parse().ok()
}

/// GET /metrics, or None while nothing answers.
fn scrape(port: u16) -> Option<String> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut s = String::new();
    c.read_to_string(&mut s).ok()?;
    Some(s)
}

/// `mpi_calls_total` of `MPI_Comm_rank`, summed over its series (the
/// daemon observes one rank; the series name it by rank, not by pid).
fn comm_rank_calls(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("mpi_calls_total{") && l.contains("function=\"MPI_Comm_rank\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Whether an exposition has a rank with `pid`.
fn has_rank(text: &str, pid: u32) -> bool {
    let pid = format!("pid=\"{pid}\"");
    text.lines()
        .any(|l| l.starts_with("mpi_rank_info{") && l.contains(&pid))
}

/// The programs, compiled here.
struct Paths {
    /// Calls per batch: [`CALLS`], or [`guest::GUEST_CALLS`] in an emulated
    /// guest.
    calls: u32,
    observer: PathBuf,
    probecost: PathBuf,
    rank: PathBuf,
    work: PathBuf,
}

fn build(root: &Path) -> Result<Paths> {
    let work = root.join("target/bench-mechanisms");
    fs::create_dir_all(&work)?;
    let observer = root.join("target/release/mpi-observer");
    if !observer.exists() {
        bail!(
            "{} is missing: build it first (`cargo xtask build`)",
            observer.display()
        );
    }
    let p = Paths {
        calls: CALLS,
        observer,
        probecost: work.join("probecost"),
        rank: work.join("rank"),
        work,
    };
    MPI.mpicc(&[], &root.join("xtask/bench/probecost.c"), &p.probecost)?;
    let src = p.work.join("rank.c");
    fs::write(&src, RANK_C)?;
    MPI.mpicc(&[], &src, &p.rank)?;
    Ok(p)
}

/// A singleton probe-cost process, waiting for its go file.
struct Probecost {
    child: Child,
    out: Receiver<String>,
    pid: u32,
    go: PathBuf,
}

impl Probecost {
    /// Starts one that times `comm_rank` (or nothing, `batches` 0).
    fn start(p: &Paths, name: &str, batches: u32) -> Result<Probecost> {
        let go = p.work.join(format!("go-{name}"));
        let _ = fs::remove_file(&go);
        let mut c = Command::new(&p.probecost);
        MPI.env(&mut c);
        c.arg(&go)
            .arg(batches.to_string())
            .arg(p.calls.to_string())
            .stdout(Stdio::piped());
        if batches > 0 {
            c.arg("comm_rank");
        }
        let mut child = c.spawn().with_context(|| format!("{c:?}"))?;
        let out = lines(child.stdout.take().context("stdout")?);
        let (ready, _) = wait_line(&out, "ready pid=", "probecost")?;
        let pid = ready
            .trim_start_matches("ready pid=")
            .trim()
            .parse()
            .context("probecost's pid")?;
        Ok(Probecost {
            child,
            out,
            pid,
            go,
        })
    }

    /// Lets it run its batches: (CPU, wall) ns per call.
    fn run(&mut self) -> Result<(f64, f64)> {
        fs::write(&self.go, "")?;
        let (_, results) = wait_line(&self.out, "done", "probecost")?;
        let get = |key: &str| -> Result<f64> {
            results
                .iter()
                .find_map(|l| l.strip_prefix(key)?.parse().ok())
                .with_context(|| format!("no {key} in {results:?}"))
        };
        Ok((get("comm_rank_cpu=")?, get("comm_rank=")?))
    }

    /// Lets it finalize and exit.
    fn finish(mut self) -> Result<()> {
        if !self.go.exists() {
            fs::write(&self.go, "")?;
            wait_line(&self.out, "done", "probecost")?;
        }
        fs::remove_file(&self.go)?;
        reap(&mut self.child, "probecost")
    }
}

impl Drop for Probecost {
    /// One left waiting by an error is killed (a no-op once it has exited).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the figures of one configuration over the rounds give.
struct Series {
    label: String,
    cpu: Vec<f64>,
    wall: Vec<f64>,
}

/// One row per configuration: its median, spread, and the medians of its
/// per-round difference and ratio to the bare runs (the first series) and,
/// with `reference`, its per-round ratio to that series.
fn cost_table(out: &mut String, series: &[Series], reference: Option<usize>) -> Result<()> {
    let ratio_to = |s: &Series, to: &Series| -> Vec<f64> {
        s.cpu.iter().zip(&to.cpu).map(|(a, b)| a / b).collect()
    };
    // Two decimals near 1, none far from it.
    let show = |r: &[f64]| {
        let m = median(r);
        let d = if m < 10.0 { 2 } else { 0 };
        format!("**{m:.d$}×** ({})", spread(r, d))
    };
    let by = reference.map(|i| &series[i]);
    let extra = by.map_or(String::new(), |r| {
        format!(" ratio to {}, median of rounds |", r.label)
    });
    writeln!(
        out,
        "| configuration | CPU ns/call, median (runs) | added, median of rounds | ratio to bare, median of rounds |{extra} wall ns/call |\n\
         |---|---|---|---|{}---|",
        if by.is_some() { "---|" } else { "" }
    )?;
    let bare = &series[0];
    for s in series {
        let diff: Vec<f64> = s.cpu.iter().zip(&bare.cpu).map(|(a, b)| a - b).collect();
        let (added, ratio) = if std::ptr::eq(s, bare) {
            ("–".to_string(), "–".to_string())
        } else {
            (
                format!("{:+.1} ns", median(&diff)),
                show(&ratio_to(s, bare)),
            )
        };
        let extra = match by {
            None => String::new(),
            Some(r) if std::ptr::eq(s, bare) || std::ptr::eq(s, r) => " – |".to_string(),
            Some(r) => format!(" {} |", show(&ratio_to(s, r))),
        };
        writeln!(
            out,
            "| {} | {:.1} ({}) | {added} | {ratio} |{extra} {:.1} |",
            s.label,
            median(&s.cpu),
            spread(&s.cpu, 1),
            median(&s.wall),
        )?;
    }
    Ok(())
}

/// Part 1: one run of the probe-cost program under `mech` (None: no
/// daemon); checks the daemon counted every timed call.
fn probe_cost_run(p: &Paths, mech: Option<Mech>) -> Result<(f64, f64)> {
    let mut rank = Probecost::start(p, "cost", BATCHES)?;
    let daemon = match mech {
        None => None,
        Some(m) => {
            let pid = rank.pid.to_string();
            let args = ["--pid", &pid, "--functions", "MPI_Comm_rank"].map(String::from);
            let mut d = Daemon::start(&p.observer, m, &args)?;
            d.attached(&[rank.pid])?;
            Some(d)
        }
    };
    thread::sleep(SETTLE);
    let ns = rank.run()?;
    if let Some(d) = &daemon {
        let text = scrape(d.port).context("scraping the daemon")?;
        let n = comm_rank_calls(&text);
        let want = u64::from(BATCHES * p.calls);
        if n < want {
            bail!("the daemon counted {n} MPI_Comm_rank calls, expected >= {want}");
        }
    }
    rank.finish()?;
    if let Some(mut d) = daemon {
        // With --pid and --retain-exited 0 it exits after its rank.
        reap(&mut d.child, "mpi-observer")?;
    }
    Ok(ns)
}

fn probe_cost(p: &Paths, out: &mut String) -> Result<()> {
    let configs = [
        None,
        Some(Mech::UprobeMulti),
        Some(Mech::PerfLink),
        Some(Mech::PerfIoctl),
    ];
    probe_cost_of(p, &configs, REPS, out)
}

/// The probe-cost table of `configs` (the first `None`, no probe) over
/// `reps` rounds, the order rotated.
fn probe_cost_of(p: &Paths, configs: &[Option<Mech>], reps: usize, out: &mut String) -> Result<()> {
    let mut got: Vec<Vec<(f64, f64)>> = vec![Vec::new(); configs.len()];
    for rep in 0..reps {
        for k in 0..configs.len() {
            let i = (k + rep) % configs.len();
            got[i].push(probe_cost_run(p, configs[i])?);
        }
        println!("probe cost: round {} of {reps} done", rep + 1);
    }
    let series: Vec<Series> = configs
        .iter()
        .zip(&got)
        .map(|(c, v)| Series {
            label: match c {
                None => "no probe".to_string(),
                Some(m) => format!("`{}`", m.name()),
            },
            cpu: v.iter().map(|x| x.0).collect(),
            wall: v.iter().map(|x| x.1).collect(),
        })
        .collect();
    cost_table(out, &series, (configs.len() > 2).then_some(1))
}

/// A daemon's perf-event and BPF-link descriptors, and how long it took to
/// stop.
type Held = (usize, usize, Duration);
/// A job's size and how long its ranks took to start.
type Started = (u32, Duration);

/// Part 2: one run of the refused process, with the anchor observed by a
/// `--all --user-max-processes 1` daemon on `mech` (None: no daemon).
/// With a daemon, also its descriptors and the time it took to stop.
fn unobserved_run(
    p: &Paths,
    anchor: u32,
    mech: Option<Mech>,
) -> Result<((f64, f64), Option<Held>)> {
    let mut daemon = match mech {
        None => None,
        Some(m) => {
            // MPI_Comm_rank is not among the default functions.
            let args = [
                "--all",
                "--user-max-processes",
                "1",
                "--functions",
                "MPI_Comm_rank",
            ]
            .map(String::from);
            let mut d = Daemon::start(&p.observer, m, &args)?;
            d.attached(&[anchor])?;
            Some(d)
        }
    };
    let mut rank = Probecost::start(p, "refused", BATCHES)?;
    if let Some(d) = &mut daemon {
        let refused = format!("pid {} (uid", rank.pid);
        d.wait(STEP, |l| l.contains(&refused) && l.contains("not observed"))?;
    }
    thread::sleep(SETTLE);
    let ns = rank.run()?;
    let mut held = None;
    if let Some(d) = daemon {
        let text = scrape(d.port).context("scraping the daemon")?;
        if has_rank(&text, rank.pid) || !has_rank(&text, anchor) {
            bail!(
                "the anchor {anchor} must be observed and pid {} not",
                rank.pid
            );
        }
        let (perf, links) = d.fds()?;
        rank.finish()?;
        held = Some((perf, links, d.stop()?));
    } else {
        rank.finish()?;
    }
    Ok((ns, held))
}

fn unobserved(p: &Paths, out: &mut String) -> Result<Vec<Held>> {
    let anchor = Probecost::start(p, "anchor", 0)?;
    let configs = [None, Some(Mech::PerfLink), Some(Mech::UprobeMulti)];
    let mut got: Vec<Vec<(f64, f64)>> = vec![Vec::new(); configs.len()];
    let mut stops = Vec::new();
    for rep in 0..UNOBSERVED_REPS {
        for k in 0..configs.len() {
            let i = (k + rep) % configs.len();
            let (ns, held) = unobserved_run(p, anchor.pid, configs[i])?;
            got[i].push(ns);
            if configs[i] == Some(Mech::PerfLink) {
                stops.extend(held);
            }
        }
        println!("unobserved: round {} of {UNOBSERVED_REPS} done", rep + 1);
    }
    anchor.finish()?;
    let series: Vec<Series> = configs
        .iter()
        .zip(&got)
        .map(|(c, v)| Series {
            label: match c {
                None => "no daemon".to_string(),
                Some(m) => format!("`attach --all`, `{}`, process refused", m.name()),
            },
            cpu: v.iter().map(|x| x.0).collect(),
            wall: v.iter().map(|x| x.1).collect(),
        })
        .collect();
    cost_table(out, &series, None)?;
    Ok(stops)
}

/// A job of `np` ranks of [`RANK_C`] and their pids.
struct Job {
    child: Child,
    dir: PathBuf,
    pids: Vec<u32>,
    started_in: Duration,
}

impl Job {
    fn start(p: &Paths, np: u32) -> Result<Job> {
        let dir = p.work.join(format!("job{np}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let t = Instant::now();
        let child = MPI
            .job(np, None, &p.rank)
            .env("OMPI_MCA_mpi_yield_when_idle", "1")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        // Made first, so that an error below ends the job (Drop).
        let mut job = Job {
            child,
            dir,
            pids: Vec::new(),
            started_in: Duration::ZERO,
        };
        loop {
            let got: Vec<u32> = (0..np)
                .filter_map(|r| fs::read_to_string(job.dir.join(format!("pid.{r}"))).ok())
                .filter_map(|s| s.trim().parse().ok())
                .collect();
            if got.len() == np as usize {
                job.pids = got;
                break;
            }
            if let Some(st) = job.child.try_wait()? {
                bail!("the {np}-rank job exited with {st} before its ranks started");
            }
            if t.elapsed() > SLOW {
                bail!("{np} ranks did not start within {SLOW:?}");
            }
            thread::sleep(Duration::from_millis(20));
        }
        job.started_in = t.elapsed();
        Ok(job)
    }

    /// Tells the ranks to stop and waits for `mpirun` to exit.
    fn finish(&mut self) -> Result<()> {
        fs::write(self.dir.join("stop"), "")?;
        let t = Instant::now();
        while self.child.try_wait()?.is_none() {
            if t.elapsed() > SLOW {
                bail!("the job did not end within {SLOW:?} of its stop file");
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for Job {
    /// A job left by an error: SIGTERM to `mpirun` (which ends its ranks),
    /// then SIGKILL if it lingers.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            signal(&self.child, "-TERM");
            let t = Instant::now();
            while matches!(self.child.try_wait(), Ok(None)) && t.elapsed() < Duration::from_secs(20)
            {
                thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Part 3's figures for one (configuration, size).
struct Attach {
    config: &'static str,
    ranks: u32,
    startup: Duration,
    attach: Duration,
    detach: Duration,
    perf: usize,
    links: usize,
    probes: u64,
}

fn attach_run(p: &Paths, job: &Job, config: &'static str, mech: Mech) -> Result<Attach> {
    let args: Vec<String> = if config.contains("--all") {
        vec!["--all".into()]
    } else {
        job.pids
            .iter()
            .flat_map(|pid| ["--pid".to_string(), pid.to_string()])
            .collect()
    };
    let mut d = Daemon::start(&p.observer, mech, &args)?;
    let Attached {
        last: attach,
        first_began: startup,
        probes,
    } = d.attached(&job.pids)?;
    let (perf, links) = d.fds()?;
    let detach = d.stop()?;
    println!(
        "attach: {config}, {} ranks: {:.2} s attach, {:.2} s detach, {perf} perf events, {links} links",
        job.pids.len(),
        attach.as_secs_f64(),
        detach.as_secs_f64()
    );
    Ok(Attach {
        config,
        ranks: job.pids.len() as u32,
        startup,
        attach,
        detach,
        perf,
        links,
        probes,
    })
}

fn attach_detach(p: &Paths) -> Result<(Vec<Attach>, Vec<Started>)> {
    let mut rows = Vec::new();
    let mut starts = Vec::new();
    for np in SIZES {
        let mut job = Job::start(p, np)?;
        println!(
            "{np} ranks started in {:.1} s",
            job.started_in.as_secs_f64()
        );
        starts.push((np, job.started_in));
        let mut configs = vec![
            ("`uprobe_multi`, `--pid` each rank", Mech::UprobeMulti),
            ("`uprobe_multi`, `--all`", Mech::UprobeMulti),
            ("`perf_link`, `--all` (probes per file)", Mech::PerfLink),
        ];
        if np == 1 {
            configs.push(("`perf_link`, `--pid` (probes per process)", Mech::PerfLink));
        }
        for (config, mech) in configs {
            rows.push(attach_run(p, &job, config, mech)?);
        }
        job.finish()?;
    }
    Ok((rows, starts))
}

fn attach_table(
    out: &mut String,
    rows: &[Attach],
    starts: &[Started],
    stops: &[Held],
) -> Result<()> {
    writeln!(
        out,
        "| configuration | ranks | attach: daemon spawned → last rank's `attached` line (of it, until the first rank's attach began) | detach: SIGTERM → exit | perf-event fds | BPF-link fds | probes (`--pid` lines) |\n\
         |---|---:|---:|---:|---:|---:|---:|"
    )?;
    for r in rows {
        writeln!(
            out,
            "| {} | {} | {:.2} s ({:.2} s) | {:.2} s | {} | {} | {} |",
            r.config,
            r.ranks,
            r.attach.as_secs_f64(),
            r.startup.as_secs_f64(),
            r.detach.as_secs_f64(),
            r.perf,
            r.links,
            if r.probes > 0 {
                r.probes.to_string()
            } else {
                "–".into()
            },
        )?;
    }
    if let Some(one) = rows
        .iter()
        .find(|r| r.config.contains("perf_link") && r.config.contains("--pid"))
    {
        for n in [16u32, 64] {
            writeln!(
                out,
                "| `perf_link`, `--pid` (probes per process) | {n} | – | **≈ {:.0} s, computed** ({n} × the 1-rank detach; not measured) | ≈ {} computed | ≈ {} computed | ≈ {} computed |",
                f64::from(n) * one.detach.as_secs_f64(),
                n as usize * one.perf,
                n as usize * one.links,
                u64::from(n) * one.probes,
            )?;
        }
    }
    let starts: Vec<String> = starts
        .iter()
        .map(|(n, d)| {
            let ranks = if *n == 1 { "rank" } else { "ranks" };
            format!("{n} {ranks} {:.1} s", d.as_secs_f64())
        })
        .collect();
    writeln!(
        out,
        "\nThe jobs took, from `mpirun` to every rank's pid file: {}.",
        starts.join(", ")
    )?;
    if !stops.is_empty() {
        let secs: Vec<f64> = stops.iter().map(|s| s.2.as_secs_f64()).collect();
        writeln!(
            out,
            "The {} `perf_link --all --functions MPI_Comm_rank` daemons of the unobserved-process \
             part (1 rank observed, the library file's 2 probes; {} perf-event and {} BPF-link \
             fds held) took {:.2} s to stop, median ({} s).",
            secs.len(),
            stops[0].0,
            stops[0].1,
            median(&secs),
            spread(&secs, 2),
        )?;
    }
    Ok(())
}

/// `cargo xtask bench mechanisms`.
pub fn run(root: &Path) -> Result<()> {
    let p = build(root)?;
    let load_before = loadavg();
    let started = Instant::now();
    let date = crate::bench_common::first_line("date", &["-u", "+%Y-%m-%d"]);
    let mut cost = String::new();
    probe_cost(&p, &mut cost)?;
    let mut refused = String::new();
    let stops = unobserved(&p, &mut refused)?;
    let (rows, starts) = attach_detach(&p)?;
    let mut attach = String::new();
    attach_table(&mut attach, &rows, &starts, &stops)?;
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    let mut r = String::new();
    writeln!(
        r,
        "## Attach mechanisms: `cargo xtask bench mechanisms` ({date}, AMD EPYC VM, kernel 6.18)\n\n\
         Issue 35. Command: `cargo xtask bench mechanisms` (as root; {minutes:.1} minutes; source \
         `xtask/src/bench_mechanisms.rs`, `xtask/bench/probecost.c`). Machine: {}. Load average \
         before: {load_before}; after: {}. Each mechanism is forced with `{FORCE}`; every daemon's \
         `attaching with` line is checked to name it.\n",
        machine(),
        loadavg(),
    )?;
    writeln!(
        r,
        "**Probe cost per call.** A singleton Open MPI rank (`probecost.c`) waits until the probes \
         are in, then calls `PMPI_Comm_rank` in {BATCHES} batches of {CALLS}; a run reports the \
         median batch in the thread's CPU time (the trap and the programs count, time descheduled \
         does not). `mpi-observer attach --pid P --functions MPI_Comm_rank` (entry and return \
         probe). {REPS} rounds, each running every configuration once, the order rotated; each \
         run checks the daemon counted every timed call.\n"
    )?;
    r.push_str(&cost);
    writeln!(
        r,
        "\n**A process that maps the library and is not observed.** `attach --all \
         --user-max-processes 1 --functions MPI_Comm_rank` (not a default function): a \
         waiting root rank is observed first, then a second root process (the same probe-cost \
         program) is refused by the budget (the daemon's `not observed` line, and no \
         `mpi_rank_info` for it, are checked) and times its calls. With \
         classic probes under `--all` the library file is probed for every process that maps \
         it, the refused one included; `uprobe_multi` links are per process. Against the same \
         program with no daemon. {UNOBSERVED_REPS} rounds, order rotated.\n"
    )?;
    r.push_str(&refused);
    writeln!(
        r,
        "\n**Attach and detach.** A job of N Open MPI ranks (`mpirun.openmpi --oversubscribe`; \
         each rank calls `MPI_Comm_rank` every 100 ms and `MPI_Barrier` every second) is \
         started once per size; each configuration then starts a daemon on it (default \
         functions), waits for every rank's `attached to pid` line and the daemon's `serving` \
         line (the first rank's attach began at its line's time less the milliseconds the line \
         gives), counts the daemon's \
         `/proc/PID/fd` entries that are `anon_inode:[perf_event]` and `anon_inode:bpf_link`, \
         and sends SIGTERM. **One run per configuration** (seconds-long figures, not \
         nanoseconds; no spread is given).\n"
    )?;
    r.push_str(&attach);
    let path = p.work.join("report.md");
    fs::write(&path, &r)?;
    print!("\n{r}");
    println!("\nwrote {}", path.display());
    Ok(())
}
