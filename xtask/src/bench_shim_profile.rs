//! Where a call timed by `stats` spends its nanoseconds, part by part: the
//! profile section of `cargo xtask bench shim`.
//!
//! The 8-byte ping-pong (`shim/bench/pingpong.c`) runs once per MPI under
//! the shim with `stats`, each rank under `perf record -e cpu-clock`: a
//! software timer, because this VM exposes no hardware counters (`perf stat
//! -e cycles` says "not supported"). Each rank starts perf's events off and
//! turns them on for its timed batches only (`--control`, see the C
//! source), so start-up and the wait for the go file are not in the
//! profile. Every sample that falls in the shim is resolved to its chain of
//! inlined functions with `addr2line -i` (the release build keeps line
//! tables) and counted in the first part of [`PARTS`] whose rule matches
//! the chain's function names or the source lines of its frames. A part's
//! cost per call is its samples × the sampling period / the calls both
//! ranks made while sampled.
//!
//! The rules go by names (`hist_slot`, `callsite`, `comms::`, ...), so a
//! renamed function falls into "other shim code", whose heaviest functions
//! the report names: nothing is dropped unseen.

use std::{
    collections::HashMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::bench_common::{Mpi, field};

/// cpu-clock's sampling period in ns (20 kHz). Each sample is a timer
/// interrupt, dear in a VM, that slows the ping-pong and cools the caches:
/// rarer samples disturb less, and a longer run gives each part its
/// hundreds of samples all the same.
const PERIOD_NS: u64 = 50_000;
/// Round trips per timed batch of the profiled run (101 batches): about
/// four million calls per rank.
const ROUND_TRIPS: u32 = 20_000;
/// The shim's file name, as perf names a sample's object.
pub(crate) const SHIM_FILE: &str = "libmpi_observer_shim.so";

/// One frame of a sample's inlined chain: the function and the text of the
/// source line the sample (or the inlined call below) is at.
struct Frame {
    func: String,
    text: String,
}

fn any_fn(chain: &[Frame], words: &[&str]) -> bool {
    chain
        .iter()
        .any(|f| words.iter().any(|w| f.func.contains(w)))
}

fn any_text(chain: &[Frame], words: &[&str]) -> bool {
    chain
        .iter()
        .any(|f| words.iter().any(|w| f.text.contains(w)))
}

/// A part of the per-call path and the rule that puts a sample in it.
type Rule = fn(&[Frame]) -> bool;

/// The parts, in the order their rules are tried: a sample counts in the
/// first that matches (the clock inside `leave` is the clock, a histogram
/// inside the per-peer counters is the peer table's).
const PARTS: [(&str, Rule); 10] = [
    ("clock reads (`rdtsc`, ticks to ns)", |c| {
        any_fn(
            c,
            &[
                "timing::rdtsc",
                "timing::now_ns",
                "timing::start",
                "timing::elapsed",
                "try_calibrate",
                "clock_gettime",
            ],
        )
    }),
    ("trace check (is `record` on?)", |c| {
        any_fn(c, &["::trace::"])
    }),
    ("call-site table", |c| {
        any_fn(c, &["callsite"]) || any_text(c, &["callsite"])
    }),
    ("peer table (world rank, per-peer counters)", |c| {
        any_fn(c, &["stats::comms::", "State::message"])
    }),
    ("histogram slot of the call's time", |c| {
        any_fn(c, &["hist_slot"]) || any_text(c, &["hist"])
    }),
    ("bytes (count × type size)", |c| {
        any_fn(c, &["timing::bytes", "Abi::bytes", "type_size"]) || any_text(c, &["bytes"])
    }),
    ("call counters (calls, ns)", |c| {
        any_text(c, &[".calls", ".time_ns"])
    }),
    (
        "timing wrapper (open and close, call site, next level, GOT poll)",
        |c| {
            any_fn(
                c,
                &[
                    "::timed",
                    "timing::enter",
                    "timing::enabled",
                    "timing::leave",
                    "got::poll",
                ],
            )
        },
    ),
    ("`stats` wrappers (status, requests, arguments)", |c| {
        any_fn(c, &["stats::"])
    }),
    (
        "dispatch (entry trampolines, library gate, level lookup)",
        |c| {
            any_fn(
                c,
                &[
                    "dispatch::",
                    "::gate",
                    "table::",
                    "depth::",
                    "bind::",
                    "got::",
                    "MPI_",
                    "entry",
                ],
            )
        },
    ),
];

/// One MPI's profile.
pub(crate) struct Profile {
    /// Samples per part of [`PARTS`], then "other shim code".
    pub(crate) parts: Vec<u64>,
    /// The heaviest functions among "other shim code".
    pub(crate) other: Vec<(String, u64)>,
    /// Samples in the shim, and in all (the library, the kernel...).
    pub(crate) shim: u64,
    pub(crate) all: u64,
    /// Calls both ranks made while sampled.
    pub(crate) calls: f64,
    /// The profiled run's own one-way latency (perf's timer included).
    pub(crate) lat8: f64,
}

impl Profile {
    /// ns per call of `samples`.
    pub(crate) fn ns(&self, samples: u64) -> f64 {
        samples as f64 * PERIOD_NS as f64 / self.calls
    }
}

/// Fails now, before the benchmark's rounds, if perf cannot sample here.
pub(crate) fn check_perf() -> Result<()> {
    let o = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-o", "/dev/null", "true"])
        .output();
    match o {
        Ok(o) if o.status.success() => {}
        Ok(o) => bail!(
            "perf cannot record cpu-clock samples here ({}); the shim benchmark's profile needs it (run as root, or lower kernel.perf_event_paranoid)",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => bail!(
            "perf not found ({e}); the shim benchmark's profile needs it: apt-get install linux-perf"
        ),
    }
    for tool in ["addr2line", "readelf"] {
        ensure!(
            Command::new(tool).arg("--version").output().is_ok(),
            "{tool} not found; the shim benchmark's profile needs it: apt-get install binutils"
        );
    }
    Ok(())
}

/// Profiles the 8-byte ping-pong `prog` of `mpi` under `shim` with
/// `stats`, in `work/profile`.
pub(crate) fn profile(mpi: Mpi, prog: &Path, shim: &Path, work: &Path) -> Result<Profile> {
    let dir = work.join("profile");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    // The ranks start at once: nothing is injected.
    fs::write(dir.join("go"), "")?;
    let d = dir.display().to_string();
    // perf is the rank's parent (sh execs it), so the rank finds the
    // fifos by its parent's pid. The shim is preloaded into the rank only,
    // not into sh and perf.
    let script = format!(
        "mkfifo {d}/ctl.$$ {d}/ack.$$ && exec perf record -q -g -D -1 \
         --control fifo:{d}/ctl.$$,{d}/ack.$$ -e cpu-clock -c {PERIOD_NS} -o {d}/perf.$$ \
         env LD_PRELOAD=\"$BENCH_SHIM\" \"$0\" \"$@\""
    );
    let shim_s = shim.display().to_string();
    let env = [
        ("BENCH_PERF_CTL", d.as_str()),
        ("BENCH_SHIM", shim_s.as_str()),
        ("MPI_TOOLS_ENTRY", "stats"),
    ];
    let mut c = mpi.job_env(2, None, &env, Path::new("sh"));
    c.arg("-c")
        .arg(&script)
        .arg(prog)
        .arg(&dir)
        .arg(ROUND_TRIPS.to_string());
    let o = c.output().with_context(|| format!("running {c:?}"))?;
    let out = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        bail!(
            "the profiled ping-pong failed: {c:?}\n{out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let lat8 = field(&out, "lat8_ns=")?;
    let round_trips = field(&out, "round_trips=")?;
    let files: Vec<PathBuf> = fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("perf."))
        })
        .collect();
    ensure!(
        files.len() == 2,
        "expected one perf.data per rank in {d}, found {}",
        files.len()
    );
    // Shim samples by file offset, and the count of all samples.
    let mut offsets: HashMap<u64, u64> = HashMap::new();
    let mut all = 0;
    for f in &files {
        let o = Command::new("perf")
            .arg("script")
            .arg("-i")
            .arg(f)
            .args(["-F", "ip,dso", "--max-stack", "1"])
            .output()
            .context("running perf script")?;
        ensure!(
            o.status.success(),
            "perf script -i {} failed: {}",
            f.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        );
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            let l = l.trim();
            if l.is_empty() {
                continue;
            }
            all += 1;
            // With call chains, perf prints an object's samples at their
            // offset in the file: "408b78 (/path/libmpi_observer_shim.so)".
            if l.ends_with(&format!("{SHIM_FILE})"))
                && let Some(ip) = l.split_whitespace().next()
                && let Ok(ip) = u64::from_str_radix(ip, 16)
            {
                *offsets.entry(ip).or_default() += 1;
            }
        }
    }
    let chains = resolve(shim, offsets.keys().copied())?;
    let mut parts = vec![0u64; PARTS.len() + 1];
    let mut other: HashMap<String, u64> = HashMap::new();
    for (off, n) in &offsets {
        let chain = &chains[off];
        match PARTS.iter().position(|(_, rule)| rule(chain)) {
            Some(i) => parts[i] += n,
            None => {
                parts[PARTS.len()] += n;
                // The innermost function of our own, else the innermost.
                let f = chain
                    .iter()
                    .find(|f| f.func.contains("mpi_observer_shim") || f.func.starts_with("PMPI"))
                    .or(chain.first())
                    .map_or("?".to_string(), |f| f.func.clone());
                *other.entry(f).or_default() += n;
            }
        }
    }
    let mut other: Vec<(String, u64)> = other.into_iter().collect();
    other.sort_by_key(|o| std::cmp::Reverse(o.1));
    other.truncate(3);
    Ok(Profile {
        shim: offsets.values().sum(),
        parts,
        other,
        all,
        // Each round trip is a send and a receive in each rank.
        calls: 4.0 * round_trips,
        lat8,
    })
}

/// The inlined chain (innermost first) at each file offset of `lib`.
fn resolve(lib: &Path, offsets: impl Iterator<Item = u64>) -> Result<HashMap<u64, Vec<Frame>>> {
    // File offset to address: the loadable segment that holds it.
    let o = Command::new("readelf").arg("-lW").arg(lib).output()?;
    let segments: Vec<(u64, u64, u64)> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
            (w.first() == Some(&"LOAD")).then(|| Some((hex(w[1])?, hex(w[2])?, hex(w[4])?)))?
        })
        .collect();
    ensure!(!segments.is_empty(), "no LOAD segment in {}", lib.display());
    let offsets: Vec<u64> = offsets.collect();
    let addr = |off: u64| {
        segments
            .iter()
            .find(|(o, _, size)| (*o..o + size).contains(&off))
            .map_or(off, |(o, v, _)| off - o + v)
    };
    let mut c = Command::new("addr2line");
    c.args(["-a", "-i", "-f", "-C", "-e"]).arg(lib);
    for &off in &offsets {
        c.arg(format!("{:#x}", addr(off)));
    }
    let o = c.output().context("running addr2line")?;
    ensure!(o.status.success(), "addr2line failed on {}", lib.display());
    let text = String::from_utf8_lossy(&o.stdout);
    let mut sources: HashMap<String, Vec<String>> = HashMap::new();
    let mut line_text = |loc: &str| -> String {
        let Some((file, line)) = loc.rsplit_once(':') else {
            return String::new();
        };
        let Ok(line) = line
            .split_whitespace()
            .next()
            .unwrap_or("")
            .parse::<usize>()
        else {
            return String::new();
        };
        let lines = sources.entry(file.to_string()).or_insert_with(|| {
            fs::read_to_string(file)
                .map(|s| s.lines().map(str::to_string).collect())
                .unwrap_or_default()
        });
        line.checked_sub(1)
            .and_then(|i| lines.get(i))
            .map_or(String::new(), |l| l.trim().to_string())
    };
    // "-a" prints each address, then (function, file:line) per frame.
    let mut out = HashMap::new();
    let mut lines = text.lines().peekable();
    for &off in &offsets {
        let head = lines.next().context("addr2line printed fewer addresses")?;
        ensure!(head.starts_with("0x"), "unexpected addr2line line `{head}`");
        let mut chain = Vec::new();
        while let Some(l) = lines.peek() {
            if l.starts_with("0x") {
                break;
            }
            let func = lines.next().unwrap_or_default().to_string();
            let loc = lines.next().unwrap_or_default();
            chain.push(Frame {
                func,
                text: line_text(loc),
            });
        }
        out.insert(off, chain);
    }
    Ok(out)
}

/// The report's section for one MPI, with `timed` the ns per call that
/// `stats` adds to the ping-pong over the empty list in the timed rounds.
pub(crate) fn write(report: &mut String, p: &Profile, timed: f64) -> Result<()> {
    writeln!(
        report,
        "One run of the ping-pong under the shim with `stats`, 101 batches of {ROUND_TRIPS} \
         round trips, after the rounds; each rank under `perf record -e cpu-clock -c \
         {PERIOD_NS} -g` (a {:.0} kHz software timer: this VM has no hardware counters), \
         turned on for the timed batches only. Each sample in the shim counts in the first \
         part whose rule matches its inlined call chain (`addr2line -i`; the rules are in \
         `xtask/src/bench_shim_profile.rs`). ns per call = samples × {:.0} µs / calls \
         sampled: the shim's CPU per call in the profiled run, whose timer interrupts (VM \
         exits) slow it and cool its caches. A sample lands on the instruction after a slow \
         one, so part of a clock read's cost can show on the statement after it.\n",
        1e6 / PERIOD_NS as f64,
        PERIOD_NS as f64 / 1000.0,
    )?;
    writeln!(
        report,
        "| part | samples | share of the shim | ns per call |\n|---|---:|---:|---:|"
    )?;
    let names = PARTS
        .iter()
        .map(|(n, _)| *n)
        .chain(std::iter::once("other shim code"));
    for (name, &n) in names.zip(&p.parts) {
        writeln!(
            report,
            "| {name} | {n} | {:.1} % | {:.1} |",
            100.0 * n as f64 / p.shim.max(1) as f64,
            p.ns(n),
        )?;
    }
    writeln!(
        report,
        "| **the shim, in all** | {} | 100 % | **{:.1}** |\n",
        p.shim,
        p.ns(p.shim)
    )?;
    let other = p
        .other
        .iter()
        .map(|(f, n)| format!("`{f}` ({n})"))
        .collect::<Vec<_>>()
        .join(", ");
    writeln!(
        report,
        "{} samples in all (the library's polling, the kernel), {} in the shim; {:.0} calls \
         sampled in the two ranks; the profiled run's one-way latency {:.0} ns.{}\n\n\
         The shim's CPU per call here ({:.1} ns) is more than `stats` adds to the timed \
         ping-pong ({timed:.1} ns a call over the empty list), and not only because of the \
         profiler: a one-way trip's critical path carries the receive's work after its \
         message arrived and the send's work before its message left, while the rest of each \
         call (the send's close, the next receive's open) overlaps the partner's turn.\n",
        p.all,
        p.shim,
        p.calls,
        p.lat8,
        if other.is_empty() {
            String::new()
        } else {
            format!(" Heaviest in \"other shim code\": {other}.")
        },
        p.ns(p.shim),
    )?;
    Ok(())
}
