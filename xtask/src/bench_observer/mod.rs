//! `cargo xtask bench observer`: what observing a rank costs.
//!
//! 1. Probe cost per call on `PMPI_Comm_rank`: no probe, our entry+return
//!    pair (`attach --functions MPI_Comm_rank`), and a bpftrace entry+return
//!    program doing the same work, for Open MPI and MPICH.
//! 2. Single-step against emulate: the added cost of our probes on cheap
//!    functions whose first instruction the kernel emulates and on ones it
//!    must single-step, beside `mpi-observer sites`' static classification.
//! 3. Ping-pong latency, 8 B and 1 MiB, with and without the observer.
//! 4. Attach time for one rank with the default functions.
//! 5. Scrape time and RSS at 256 ranks x 60 functions
//!    (`cargo bench -p mpi-observer --bench scrape`).
//!
//! Configurations run round-robin, `REPS` times, so drift on a shared VM hits
//! them alike; the order rotates every repetition. Each run reports its own
//! median over batches and the report quotes the median of the runs. Results
//! go to `docs/benchmarks-observer.md`, with the command and the machine.
//! The instruction classes' part (2) is [`insns`].

mod insns;

use std::{
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench_common::{
        self, Mpi, STEP, first_line, free_port, lines, loadavg, median, rank_pids, reap, signal,
        start_daemon, wait_line,
    },
    bench_sites::{self, SET},
    cargo,
    setup::run_cmd,
};

/// Repetitions of every configuration; odd, so the median is a run.
const REPS: usize = 9;
/// Timed batches per probe-cost run, and calls per batch.
const BATCHES: u32 = 15;
const CALLS: u32 = 4000;
/// Pause between the probes going in (or not) and the timed part, the same
/// in every configuration, so start-up work of the launcher and the tools
/// settles first.
const SETTLE: Duration = Duration::from_millis(200);

/// A cheap function the probe-cost program can call: its name there, its
/// standard name, and the instruction it starts with in this library.
struct Probe {
    arg: &'static str,
    name: &'static str,
}

/// What only this bench needs to know of each implementation (the rest is
/// `bench_common::Mpi`'s).
impl Mpi {
    fn lib_pattern(self) -> &'static str {
        match self {
            Mpi::OpenMpi => "libmpi.so",
            Mpi::Mpich => "libmpich.so",
        }
    }

    /// Cheap functions covering each first-instruction class this library's
    /// probe sites start with (see `mpi-observer sites`).
    fn class_functions(self) -> &'static [Probe] {
        const WTIME: Probe = Probe {
            arg: "wtime",
            name: "MPI_Wtime",
        };
        const WTICK: Probe = Probe {
            arg: "wtick",
            name: "MPI_Wtick",
        };
        const QUERY: Probe = Probe {
            arg: "query_thread",
            name: "MPI_Query_thread",
        };
        const TEST: Probe = Probe {
            arg: "test",
            name: "MPI_Test",
        };
        match self {
            Mpi::OpenMpi => &[WTIME, QUERY, TEST],
            Mpi::Mpich => &[WTIME, WTICK, QUERY],
        }
    }
}

const COMM_RANK: Probe = Probe {
    arg: "comm_rank",
    name: "MPI_Comm_rank",
};

/// GET /metrics, or None while nothing listens.
fn scrape(port: u16) -> Option<String> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut s = String::new();
    c.read_to_string(&mut s).ok()?;
    Some(s)
}

/// The value of `mpi_calls_total` for `function` in an exposition.
fn calls(text: &str, function: &str) -> Option<u64> {
    let label = format!("function=\"{function}\"");
    text.lines()
        .filter(|l| l.starts_with("mpi_calls_total{") && l.contains(&label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The MPI library file a process maps.
fn mapped_library(pid: u32, pattern: &str) -> Result<String> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.rsplit('/').next().is_some_and(|f| f.starts_with(pattern)))
        .map(str::to_string)
        .with_context(|| format!("pid {pid} maps no {pattern}"))
}

struct Paths {
    observer: PathBuf,
    probecost: PathBuf,
    pingpong: PathBuf,
    work: PathBuf,
}

fn build(root: &Path, mpi: Mpi) -> Result<Paths> {
    let work = root.join("target/bench-observer").join(mpi.suffix());
    fs::create_dir_all(&work)?;
    let src = root.join("xtask/bench");
    let p = Paths {
        observer: root.join("target/release/mpi-observer"),
        probecost: work.join("probecost"),
        pingpong: work.join("pingpong"),
        work,
    };
    for (exe, c) in [(&p.probecost, "probecost.c"), (&p.pingpong, "pingpong.c")] {
        mpi.mpicc(&[], &src.join(c), exe)?;
    }
    Ok(p)
}

/// What is attached to the probe-cost rank.
#[derive(Clone, Copy, PartialEq)]
enum Tool {
    None,
    /// Our daemon on `MPI_Comm_rank` only.
    Ours,
    /// Our daemon on the class functions.
    OursClasses,
    Bpftrace,
}

/// One singleton run of the probe-cost program with `tool` attached.
/// Returns (function argument, CPU ns/call) and (argument + `_wall`, wall
/// ns/call) pairs.
fn probecost_run(mpi: Mpi, p: &Paths, tool: Tool) -> Result<Vec<(String, f64)>> {
    let funcs: Vec<&Probe> = match tool {
        Tool::None => std::iter::once(&COMM_RANK)
            .chain(mpi.class_functions())
            .collect(),
        Tool::Ours | Tool::Bpftrace => vec![&COMM_RANK],
        Tool::OursClasses => mpi.class_functions().iter().collect(),
    };
    let go = p.work.join("go");
    let _ = fs::remove_file(&go);
    let mut c = Command::new(&p.probecost);
    mpi.env(&mut c);
    c.arg(&go)
        .arg(BATCHES.to_string())
        .arg(CALLS.to_string())
        .args(funcs.iter().map(|f| f.arg))
        .stdout(Stdio::piped());
    let mut rank = c.spawn().with_context(|| format!("{c:?}"))?;
    let out = lines(rank.stdout.take().context("stdout")?);
    let (ready, _) = wait_line(&out, "ready pid=", "probecost")?;
    let pid: u32 = ready
        .trim_start_matches("ready pid=")
        .trim()
        .parse()
        .context("pid")?;
    let port = free_port()?;
    let mut tool_child = None;
    let mut bt_out = None;
    match tool {
        Tool::None => {}
        Tool::Ours | Tool::OursClasses => {
            let list = funcs.iter().map(|f| f.name).collect::<Vec<_>>().join(",");
            let mut d = Command::new(&p.observer)
                .args(["attach", "--pid", &pid.to_string(), "--functions", &list])
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--retain-exited", "0"])
                .stderr(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()?;
            let err = lines(d.stderr.take().context("stderr")?);
            wait_line(&err, "attached to pid", "mpi-observer")?;
            tool_child = Some(d);
        }
        Tool::Bpftrace => {
            let lib = mapped_library(pid, mpi.lib_pattern())?;
            let prog = format!(
                "BEGIN {{ printf(\"attached\\n\"); }} \
                 uprobe:{lib}:PMPI_Comm_rank {{ @s[tid] = nsecs; }} \
                 uretprobe:{lib}:PMPI_Comm_rank /@s[tid]/ {{ $d = nsecs - @s[tid]; \
                 @n = count(); @t = sum($d); @h = hist($d); delete(@s[tid]); }}"
            );
            let mut b = Command::new("bpftrace")
                .args(["-p", &pid.to_string(), "-e", &prog])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()?;
            let o = lines(b.stdout.take().context("stdout")?);
            wait_line(&o, "attached", "bpftrace")?;
            bt_out = Some(o);
            tool_child = Some(b);
        }
    }
    thread::sleep(SETTLE);
    fs::write(&go, "")?;
    let (_, results) = wait_line(&out, "done", "probecost")?;
    // Every timed call must have been seen by the probe.
    let expected = u64::from(BATCHES * CALLS);
    if matches!(tool, Tool::Ours | Tool::OursClasses) {
        let text = scrape(port).context("scraping the observer")?;
        for f in &funcs {
            let n = calls(&text, f.name).unwrap_or(0);
            if n < expected {
                bail!(
                    "observer counted {n} {} calls, expected >= {expected}",
                    f.name
                );
            }
        }
    }
    fs::remove_file(&go)?;
    reap(&mut rank, "probecost")?;
    if let Some(mut t) = tool_child {
        reap(&mut t, "probe tool")?;
    }
    if let Some(o) = bt_out {
        let n: u64 = o
            .iter()
            .find_map(|l| l.strip_prefix("@n: ")?.trim().parse().ok())
            .context("bpftrace printed no @n")?;
        if n < expected {
            bail!("bpftrace counted {n} calls, expected >= {expected}");
        }
    }
    let mut v = Vec::new();
    for f in funcs {
        for (key, name) in [
            (format!("{}_cpu=", f.arg), f.arg.to_string()),
            (format!("{}=", f.arg), format!("{}_wall", f.arg)),
        ] {
            let ns = results
                .iter()
                .find_map(|l| l.strip_prefix(&key)?.parse().ok())
                .with_context(|| format!("no {key} in {results:?}"))?;
            v.push((name, ns));
        }
    }
    Ok(v)
}

/// Static classification of a function's probe site from `mpi-observer sites`.
struct Site {
    bytes: String,
    class: String,
    /// Bytes the observer probes past (0: at the first instruction).
    skipped: u8,
}

fn sites(observer: &Path, lib: &str) -> Result<Vec<(String, Site, bool)>> {
    let o = Command::new(observer).args(["sites", lib]).output()?;
    if !o.status.success() {
        bail!(
            "mpi-observer sites {lib}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() < 5 {
                return None;
            }
            let n = w.len();
            // "emulated(+7)": the probe sits past a skipped first instruction.
            let (class, skipped) = match w[n - 2].split_once("(+") {
                Some((c, rest)) => (
                    c.to_string(),
                    rest.trim_end_matches(')').parse().unwrap_or(0),
                ),
                None => (w[n - 2].to_string(), 0),
            };
            Some((
                w[0].to_string(),
                Site {
                    bytes: w[2..n - 2].join(" "),
                    class,
                    skipped,
                },
                w[n - 1] == "default",
            ))
        })
        .collect())
}

/// The MPI library `mpi-observer sites` reads: Debian's, in the
/// instruction set's multiarch directory.
fn library_file(mpi: Mpi) -> String {
    let file = match mpi {
        Mpi::OpenMpi => "libmpi.so.40",
        Mpi::Mpich => "libmpich.so.12",
    };
    format!("/usr/lib/{}/{file}", SET.multiarch)
}

fn probe_section(
    mpi: Mpi,
    p: &Paths,
    report: &mut String,
    table: &mut Vec<Row>,
    disagreements: &mut Vec<String>,
) -> Result<()> {
    let tools = [Tool::None, Tool::Ours, Tool::Bpftrace, Tool::OursClasses];
    let mut samples: Vec<Vec<(String, f64)>> = vec![Vec::new(); tools.len()];
    for rep in 0..REPS {
        for k in 0..tools.len() {
            let i = (k + rep) % tools.len();
            samples[i].extend(probecost_run(mpi, p, tools[i])?);
        }
    }
    // One function's figures under one tool, in repetition order.
    let series = |i: usize, f: &str| -> Vec<f64> {
        samples[i]
            .iter()
            .filter(|(a, _)| *a == f)
            .map(|(_, x)| *x)
            .collect()
    };
    let med = |i: usize, f: &str| median(&series(i, f));
    let none = med(0, "comm_rank");
    let ours = med(1, "comm_rank");
    let bt = med(2, "comm_rank");
    let ratio = (ours - none) / (bt - none);
    let (none_w, ours_w, bt_w) = (
        med(0, "comm_rank_wall"),
        med(1, "comm_rank_wall"),
        med(2, "comm_rank_wall"),
    );
    // Per-repetition ratios, to show the spread.
    let (n, o, b) = (
        series(0, "comm_rank"),
        series(1, "comm_rank"),
        series(2, "comm_rank"),
    );
    let per_rep: Vec<f64> = (0..REPS).map(|r| (o[r] - n[r]) / (b[r] - n[r])).collect();
    let (lo, hi) = (
        per_rep.iter().copied().fold(f64::INFINITY, f64::min),
        per_rep.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    writeln!(
        report,
        "### {}: probe cost on `PMPI_Comm_rank`\n\n\
         | configuration | CPU ns/call | added | wall ns/call | added |\n|---|---:|---:|---:|---:|\n\
         | no probe | {none:.1} | - | {none_w:.1} | - |\n\
         | mpi-observer (`--functions MPI_Comm_rank`) | {ours:.1} | {:.1} | {ours_w:.1} | {:.1} |\n\
         | bpftrace entry+return | {bt:.1} | {:.1} | {bt_w:.1} | {:.1} |\n\n\
         Ours / bpftrace, added CPU time: **{ratio:.2}x** (goal <= 1.1x; per-repetition ratios \
         {lo:.2}-{hi:.2}); in wall time {:.2}x.\n",
        mpi.name(),
        ours - none,
        ours_w - none_w,
        bt - none,
        bt_w - none_w,
        (ours_w - none_w) / (bt_w - none_w),
    )?;
    table.push(Row {
        what: format!("{}: probe cost, ours / bpftrace", mpi.name()),
        value: format!(
            "+{:.0} ns vs +{:.0} ns CPU per call: {ratio:.2}x",
            ours - none,
            bt - none
        ),
        goal: "<= 1.1x (CPU time)".into(),
        met: Some(ratio <= 1.1),
    });

    // Classes.
    let all = sites(&p.observer, &library_file(mpi))?;
    let count = |class: &str, default: Option<bool>| {
        all.iter()
            .filter(|(_, s, d)| s.class == class && default.is_none_or(|x| x == *d))
            .count()
    };
    writeln!(
        report,
        "### {}: single-stepped or emulated\n\n\
         Static classification (`mpi-observer sites {}`), one row per probe site:\n\n\
         | | emulated | single-stepped |\n|---|---:|---:|\n\
         | default functions | {} | {} |\n| all PMPI functions | {} | {} |\n",
        mpi.name(),
        library_file(mpi),
        count("emulated", Some(true)),
        count("single-stepped", Some(true)),
        count("emulated", None),
        count("single-stepped", None),
    )?;
    let stepped: Vec<&str> = all
        .iter()
        .filter(|(_, s, d)| *d && s.class == "single-stepped")
        .map(|(n, _, _)| n.as_str())
        .collect();
    writeln!(
        report,
        "Single-stepped default functions: {}.\n",
        stepped.join(", ")
    )?;
    writeln!(
        report,
        "Measured: our probes' added cost per call on one cheap function of each first-instruction \
         class (no-probe baseline from the same repetitions).\n\n\
         A function counts as measured single-stepped when its added cost is more than twice \
         `MPI_Comm_rank`'s (emulated `push`); on this machine the two differ by an order of magnitude.\n\n\
         | function | first instruction | classifier | no probe ns | probed ns | added ns | measured | agrees |\n\
         |---|---|---|---:|---:|---:|---|---|"
    )?;
    for f in std::iter::once(&COMM_RANK).chain(mpi.class_functions()) {
        let probed = if f.arg == "comm_rank" {
            ours
        } else {
            med(3, f.arg)
        };
        let base = med(0, f.arg);
        let (insn, class) = all
            .iter()
            .find(|(n, _, _)| n == f.name)
            .map(|(_, s, _)| (bench_sites::first_insn(&s.bytes), s.class.clone()))
            .unwrap_or_else(|| ("?".into(), "?".into()));
        let added = probed - base;
        let measured = if f.arg != "comm_rank" && added > 2.0 * (ours - none) {
            "single-stepped"
        } else {
            "emulated"
        };
        let agrees = if measured == class { "yes" } else { "**no**" };
        if measured != class {
            disagreements.push(format!("{} {} (`{insn}`)", mpi.name(), f.name));
        }
        let skipped = all
            .iter()
            .find(|(n, _, _)| n == f.name)
            .map_or(0, |(_, s, _)| s.skipped);
        let class = if skipped > 0 {
            format!("{class} (probe at +{skipped}, past it)")
        } else {
            class
        };
        writeln!(
            report,
            "| {} | `{insn}` | {class} | {base:.1} | {probed:.1} | {added:.1} | {measured} | {agrees} |",
            f.name,
        )?;
    }
    writeln!(report)?;
    Ok(())
}

/// One ping-pong job; `observe` attaches the daemon (default functions) to
/// both ranks before the timed part. Returns one-way µs: median batch at
/// 8 B and 1 MiB, then fastest batch at 8 B and 1 MiB; then rank 0's
/// context switches during the 8-byte part.
fn pingpong_run(mpi: Mpi, p: &Paths, observe: bool) -> Result<[f64; 5]> {
    let dir = p.work.join("pp");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let dir_s = dir.display().to_string();
    let mut job = mpi
        .job(2, None, &p.pingpong)
        .arg(&dir_s)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let out = lines(job.stdout.take().context("stdout")?);
    let pids = rank_pids(&dir, 2, &mut job)?;
    let mut daemon = None;
    if observe {
        daemon = Some(start_daemon(&p.observer, &pids, &[], "attached to pid")?.0);
    }
    thread::sleep(SETTLE);
    fs::write(dir.join("go"), "")?;
    let (l, _) = wait_line(&out, "lat8=", "pingpong")?;
    reap(&mut job, "ping-pong job")?;
    if let Some(mut d) = daemon {
        reap(&mut d, "mpi-observer")?;
    }
    let get = |k: &str| crate::bench_common::field(&l, k);
    Ok([
        get("lat8=")?,
        get("lat1m=")?,
        get("best8=")?,
        get("best1m=")?,
        get("csw8=")?,
    ])
}

fn pingpong_section(mpi: Mpi, p: &Paths, report: &mut String, table: &mut Vec<Row>) -> Result<()> {
    let (mut base, mut obs) = (Vec::new(), Vec::new());
    for rep in 0..REPS {
        for k in 0..2 {
            if (k + rep) % 2 == 0 {
                base.push(pingpong_run(mpi, p, false)?);
            } else {
                obs.push(pingpong_run(mpi, p, true)?);
            }
        }
    }
    let col = |v: &[[f64; 5]], i: usize| v.iter().map(|x| x[i]).collect::<Vec<_>>();
    let min = |v: Vec<f64>| v.into_iter().fold(f64::INFINITY, f64::min);
    let max = |v: Vec<f64>| v.into_iter().fold(f64::NEG_INFINITY, f64::max);
    writeln!(
        report,
        "### {}: ping-pong, one-way latency (2 ranks)\n\n\
         | message | | no observer | observer attached | added | ratio |\n\
         |---|---|---:|---:|---:|---:|",
        mpi.name()
    )?;
    let mut summary = Vec::new();
    for (i, size, prec) in [(0, "8 B", 2), (1, "1 MiB", 0)] {
        let (b, o) = (median(&col(&base, i)), median(&col(&obs, i)));
        let (bb, ob) = (min(col(&base, i + 2)), min(col(&obs, i + 2)));
        writeln!(
            report,
            "| {size} | median of runs | {b:.prec$} µs | {o:.prec$} µs | {:+.prec$} µs | {:.2} |\n\
             | | runs ranged | {:.prec$}-{:.prec$} µs | {:.prec$}-{:.prec$} µs | | |\n\
             | | fastest batch | {bb:.prec$} µs | {ob:.prec$} µs | {:+.prec$} µs | {:.2} |",
            o - b,
            o / b,
            min(col(&base, i)),
            max(col(&base, i)),
            min(col(&obs, i)),
            max(col(&obs, i)),
            ob - bb,
            ob / bb,
        )?;
        summary.push(format!(
            "{size}: {b:.prec$} → {o:.prec$} µs (fastest batch {bb:.prec$} → {ob:.prec$})"
        ));
    }
    writeln!(
        report,
        "\nRank 0's context switches during the 8-byte part (about 30,000 round trips), median of \
         runs: {:.0} without the observer, {:.0} with it.\n",
        median(&col(&base, 4)),
        median(&col(&obs, 4)),
    )?;
    table.push(Row {
        what: format!("{}: ping-pong one-way latency", mpi.name()),
        value: summary.join("; "),
        goal: "-".into(),
        met: None,
    });
    Ok(())
}

/// One attach: exec to /metrics showing the rank, the daemon's own figure,
/// probes, and the daemon's peak RSS.
fn attach_run(mpi: Mpi, p: &Paths) -> Result<(f64, f64, u64, u64)> {
    let go = p.work.join("go");
    let _ = fs::remove_file(&go);
    let mut c = Command::new(&p.probecost);
    mpi.env(&mut c);
    let mut rank = c.arg(&go).args(["0", "0"]).stdout(Stdio::piped()).spawn()?;
    let out = lines(rank.stdout.take().context("stdout")?);
    let (ready, _) = wait_line(&out, "ready pid=", "probecost")?;
    let pid = ready.trim_start_matches("ready pid=").trim().to_string();
    let port = free_port()?;
    let want = format!("pid=\"{pid}\"");
    let t0 = Instant::now();
    let mut d = Command::new(&p.observer)
        .args(["attach", "--pid", &pid])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--retain-exited", "0"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    let e2e = loop {
        if let Some(text) = scrape(port)
            && text
                .lines()
                .any(|l| l.starts_with("mpi_rank_info{") && l.contains(&want))
        {
            break t0.elapsed().as_secs_f64() * 1e3;
        }
        if t0.elapsed() > STEP {
            bail!("the observer never showed pid {pid}");
        }
        thread::sleep(Duration::from_millis(1));
    };
    let err = lines(d.stderr.take().context("stderr")?);
    let (l, _) = wait_line(&err, "attached to pid", "mpi-observer")?;
    // "(P probes, T ms)"
    let inner = l.rsplit('(').next().unwrap_or("").trim_end_matches(')');
    let mut nums = inner
        .split(|c: char| !c.is_ascii_digit() && c != '.')
        .filter(|s| !s.is_empty());
    let probes: u64 = nums.next().context("probes")?.parse()?;
    let own: f64 = nums.next().context("ms")?.parse()?;
    let hwm = fs::read_to_string(format!("/proc/{}/status", d.id()))?
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmHWM:")?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0);
    signal(&d, "-TERM");
    reap(&mut d, "mpi-observer")?;
    fs::write(&go, "")?;
    wait_line(&out, "done", "probecost")?;
    fs::remove_file(&go)?;
    reap(&mut rank, "probecost")?;
    Ok((e2e, own, probes, hwm))
}

fn attach_section(mpi: Mpi, p: &Paths, report: &mut String, table: &mut Vec<Row>) -> Result<()> {
    let runs: Vec<_> = (0..REPS)
        .map(|_| attach_run(mpi, p))
        .collect::<Result<_>>()?;
    let e2e = median(&runs.iter().map(|r| r.0).collect::<Vec<_>>());
    let own = median(&runs.iter().map(|r| r.1).collect::<Vec<_>>());
    let max = runs.iter().map(|r| r.0).fold(0.0, f64::max);
    let probes = runs[0].2;
    let hwm = median(&runs.iter().map(|r| r.3 as f64).collect::<Vec<_>>());
    writeln!(
        report,
        "### {}: attach time, one rank, default functions ({probes} probes)\n\n\
         | | median | max of {REPS} |\n|---|---:|---:|\n\
         | exec of `mpi-observer attach` until /metrics shows the rank | {e2e:.0} ms | {max:.0} ms |\n\
         | the daemon's own attach figure (stderr) | {own:.0} ms | - |\n\n\
         Daemon peak RSS (VmHWM) after attaching: {:.1} MiB.\n",
        mpi.name(),
        hwm / 1024.0
    )?;
    table.push(Row {
        what: format!("{}: attach, one rank, {probes} probes", mpi.name()),
        value: format!("{e2e:.0} ms end to end ({own:.0} ms attach step)"),
        goal: "<= 250 ms".into(),
        met: Some(e2e <= 250.0),
    });
    Ok(())
}

fn scrape_section(report: &mut String, table: &mut Vec<Row>) -> Result<()> {
    let o = cargo()
        .args(["bench", "-p", "mpi-observer", "--bench", "scrape"])
        .stderr(Stdio::inherit())
        .output()?;
    if !o.status.success() {
        bail!("cargo bench -p mpi-observer --bench scrape failed");
    }
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let get = |k: &str| -> Result<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix('=')?.parse().ok())
            .with_context(|| format!("no {k}= in the scrape bench's output:\n{text}"))
    };
    let (ms, cpu, http, hwm, rss) = (
        get("scrape_ms")?,
        get("scrape_cpu_ms")?,
        get("http_scrape_ms")?,
        get("vmhwm_kib")? / 1024.0,
        get("vmrss_kib")? / 1024.0,
    );
    let load = loadavg();
    writeln!(
        report,
        "### Scrape time and memory: {} ranks x {} functions ({} per-CPU map entries, {} CPUs)\n\n\
         Command: `cargo bench -p mpi-observer --bench scrape` (`observer/benches/scrape.rs`; needs root). \
         Wall time depends on what else runs (load average {load} just after); the thread's CPU time \
         is the scrape's own cost.\n\n\
         | | wall | CPU |\n|---|---:|---:|\n\
         | `State::scrape`, median of 31 ({} series, {:.1} MB of text) | {ms:.1} ms | {cpu:.1} ms |\n\
         | of which reading the map (`State::read_stats`: a lookup per entry) | - | {:.1} ms |\n\
         | `State::scrape` with per-rank histograms ({} series) | {:.1} ms | {:.1} ms |\n\
         | real HTTP GET /metrics through the daemon's server, median of 11 | {http:.1} ms | - |\n\n\
         Process peak RSS (VmHWM) {hwm:.1} MiB; RSS at the end {rss:.1} MiB. Filling the map took \
         {} retries of an insert that failed with ENOMEM: elements of a `BPF_F_NO_PREALLOC` map \
         come from a cache the kernel refills asynchronously, so a burst of inserts can find it \
         empty.\n",
        get("ranks")?,
        get("functions")?,
        get("map_entries")?,
        get("cpus")?,
        get("series")?,
        get("exposition_bytes")? / 1e6,
        get("read_stats_cpu_ms")?,
        get("series_per_rank_hist")?,
        get("scrape_per_rank_hist_ms")?,
        get("scrape_per_rank_hist_cpu_ms")?,
        get("insert_enomem_retries")?,
    )?;
    table.push(Row {
        what: "Scrape, 256 ranks x 60 functions".into(),
        value: format!("{cpu:.1} ms CPU; wall {ms:.1} ms, HTTP {http:.1} ms (load {load})"),
        goal: "<= 50 ms (CPU time)".into(),
        met: Some(cpu <= 50.0),
    });
    table.push(Row {
        what: "Daemon RSS at that scale (VmHWM)".into(),
        value: format!("{hwm:.1} MiB"),
        goal: "<= 64 MiB".into(),
        met: Some(hwm <= 64.0),
    });
    Ok(())
}

struct Row {
    what: String,
    value: String,
    goal: String,
    met: Option<bool>,
}

/// The shared description of the machine, and the bpftrace this bench
/// compares against.
fn machine() -> String {
    format!(
        "{}; bpftrace {}",
        bench_common::machine(),
        first_line("bpftrace", &["--version"]).trim_start_matches("bpftrace "),
    )
}

/// `cargo xtask bench observer`.
pub fn run(root: &Path) -> Result<()> {
    bench_sites::check()?;
    run_cmd(cargo().args(["build", "--release", "-p", "mpi-observer"]))?;
    let started = Instant::now();
    let load_before = loadavg();
    let mut report = String::new();
    let mut table = Vec::new();
    let mut disagreements = Vec::new();
    let mpis = [Mpi::OpenMpi, Mpi::Mpich];
    let paths: Vec<Paths> = mpis
        .iter()
        .map(|m| build(root, *m))
        .collect::<Result<_>>()?;
    writeln!(report, "## Probe cost per call\n")?;
    writeln!(
        report,
        "A singleton rank (`xtask/bench/probecost.c`) waits until the probes are in, then calls \
         `PMPI_Comm_rank` in {BATCHES} batches of {CALLS} calls and reports the median ns/call, \
         in the thread's CPU time (user + system: the probe's trap and BPF programs count, time \
         spent descheduled by other load on this shared 2-core VM does not) and in wall time. \
         Configurations: no probe; `mpi-observer attach --pid P --functions MPI_Comm_rank`; \
         `bpftrace -p P` with `uprobe:LIB:PMPI_Comm_rank {{ @s[tid] = nsecs; }} \
         uretprobe:LIB:PMPI_Comm_rank /@s[tid]/ {{ $d = nsecs - @s[tid]; @n = count(); @t = sum($d); \
         @h = hist($d); delete(@s[tid]); }}`. Each run checks that the tool counted every timed call.\n"
    )?;
    for (m, p) in mpis.iter().zip(&paths) {
        probe_section(*m, p, &mut report, &mut table, &mut disagreements)?;
    }
    let libs: Vec<(Mpi, &Paths)> = mpis.iter().copied().zip(&paths).collect();
    insns::section(root, &libs, &mut report, &mut disagreements)?;
    writeln!(
        report,
        "Classifier against measurement: {}.\n",
        if disagreements.is_empty() {
            "every measured function agrees with `mpi-observer sites`".to_string()
        } else {
            format!("**disagreements**: {}", disagreements.join(", "))
        }
    )?;
    writeln!(report, "## Ping-pong latency\n")?;
    writeln!(
        report,
        "`mpirun -np 2 xtask/bench/pingpong.c`: each size runs 15 timed batches (2000 round \
         trips at 8 B, 40 at 1 MiB) after a warm-up; a run reports the median batch's half \
         round-trip time, and its fastest batch. With the observer, `mpi-observer attach --pid R0 \
         --pid R1 --retain-exited 0` (default functions, bytes on) attaches before the timed part. \
         The fastest batch is the one least disturbed by other load: on this shared 2-core VM the \
         two busy-polling ranks compete with whatever else runs, and (our reading) with probes every MPI call \
         enters the kernel, where a waiting task can take the CPU, so the observed runs' medians \
         spread far more than the unobserved ones'.\n"
    )?;
    for (m, p) in mpis.iter().zip(&paths) {
        pingpong_section(*m, p, &mut report, &mut table)?;
    }
    writeln!(report, "## Attach time\n")?;
    writeln!(
        report,
        "`mpi-observer attach --pid P --listen 127.0.0.1:PORT --retain-exited 0` on a waiting \
         singleton rank, default functions; the end-to-end figure runs from spawning the daemon \
         until `GET /metrics` holds the rank's `mpi_rank_info` (polled every millisecond). \
         {REPS} repetitions.\n"
    )?;
    for (m, p) in mpis.iter().zip(&paths) {
        attach_section(*m, p, &mut report, &mut table)?;
    }
    writeln!(report, "## Scrape\n")?;
    scrape_section(&mut report, &mut table)?;

    let mut summary = String::new();
    writeln!(
        summary,
        "| benchmark | result | goal | met |\n|---|---|---|---|"
    )?;
    for r in &table {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "-",
        };
        writeln!(summary, "| {} | {} | {} | {met} |", r.what, r.value, r.goal)?;
    }
    let doc = format!(
        "# Observer benchmarks\n\n\
         Command: `cargo xtask bench observer` (writes this file; runs as root; about {:.0} minutes). \
         Sources: `xtask/src/bench_observer/`, `xtask/src/bench_sites/`, `xtask/bench/probecost.c`, `xtask/bench/pingpong.c`, `xtask/bench/insns.c`, \
         `observer/benches/scrape.rs`.\n\n\
         Machine: {}. Load average before: {load_before}; after: {}.\n\n\
         Every figure is the median of {REPS} runs taken round-robin across configurations in one \
         invocation (the order rotates each repetition); each run itself reports a median over \
         batches. Ratios compare figures from the same invocation.\n\n\
         ## Summary\n\n{summary}\n{report}",
        started.elapsed().as_secs_f64() / 60.0,
        machine(),
        loadavg(),
    );
    print!("{summary}");
    let path = root.join("docs/benchmarks-observer.md");
    fs::write(&path, doc)?;
    println!("\nwrote {}", path.display());
    Ok(())
}
