//! What the benchmarks share: launching MPI jobs on either implementation,
//! the processes they start (their output read with a deadline, the daemon,
//! reaping), medians, and a description of the machine for the reports.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc::{self, Receiver},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, setup::run_cmd};

/// The MPI implementations benchmarked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mpi {
    /// Debian's Open MPI 4.1.
    OpenMpi,
    /// Debian's MPICH 4.0.
    Mpich,
}

impl Mpi {
    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Mpi::OpenMpi => "Open MPI",
            Mpi::Mpich => "MPICH",
        }
    }

    /// Suffix of Debian's `mpicc.X` and `mpirun.X`.
    pub fn suffix(self) -> &'static str {
        match self {
            Mpi::OpenMpi => "openmpi",
            Mpi::Mpich => "mpich",
        }
    }

    /// `np` ranks of `prog`, with the shim and the tools list `list` in
    /// every rank when `shim` is given. Runs as root on a small VM.
    pub fn job(self, np: u32, shim: Option<(&Path, &str)>, prog: &Path) -> Command {
        self.job_env(np, shim, &[], prog)
    }

    /// [`Mpi::job`] with `env` set in every rank too.
    pub fn job_env(
        self,
        np: u32,
        shim: Option<(&Path, &str)>,
        env: &[(&str, &str)],
        prog: &Path,
    ) -> Command {
        let mut c = Command::new(format!("mpirun.{}", self.suffix()));
        for (k, v) in env {
            match self {
                Mpi::OpenMpi => c.args(["-x", &format!("{k}={v}")]),
                Mpi::Mpich => c.args(["-genv", k, v]),
            };
        }
        let preload = shim.map(|(lib, list)| (lib.display().to_string(), list.to_string()));
        self.env(&mut c);
        match self {
            Mpi::OpenMpi => {
                c.args(["--oversubscribe", "-np", &np.to_string()]);
                if let Some((lib, list)) = preload {
                    c.args(["-x", &format!("LD_PRELOAD={lib}")])
                        .args(["-x", &format!("MPI_TOOLS_ENTRY={list}")]);
                }
            }
            Mpi::Mpich => {
                c.args(["-launcher", "fork", "-np", &np.to_string()]);
                if let Some((lib, list)) = preload {
                    c.args(["-genv", "LD_PRELOAD", &lib])
                        .args(["-genv", "MPI_TOOLS_ENTRY", &list]);
                }
            }
        }
        c.arg(prog);
        c
    }

    /// The environment a rank of this implementation needs here, also one
    /// started alone without `mpirun`: Open MPI refuses root unless told,
    /// and its single-copy shared memory needs ptrace rights a VM may lack.
    pub fn env(self, c: &mut Command) {
        if self == Mpi::OpenMpi {
            c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
                .env("OMPI_MCA_btl", "self,vader")
                .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
        }
    }

    /// Compiles `src` to `out` with the implementation's `mpicc -O2`.
    pub fn mpicc(self, extra: &[&str], src: &Path, out: &Path) -> Result<()> {
        run_cmd(
            Command::new(format!("mpicc.{}", self.suffix()))
                .arg("-O2")
                .args(extra)
                .arg("-o")
                .arg(out)
                .arg(src),
        )
    }
}

/// The median of `v` (the upper one for an even count).
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The `q` quantile of `v` (nearest rank: the smallest value with at
/// least `q` of the values at or below it).
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// The lines a child's pipe still holds once the child has exited: up to
/// its end, or a second's quiet (a grandchild may keep the pipe open).
pub fn drain(rx: &std::sync::mpsc::Receiver<String>) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(l) = rx.recv_timeout(std::time::Duration::from_secs(1)) {
        out.push(l);
    }
    out
}

/// The first non-empty line a command prints, or "".
pub fn first_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

/// The 1, 5 and 15 minute load averages.
pub fn loadavg() -> String {
    let l = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// CPU model, cores, OS, kernel, MPI versions and rustc, for a report.
pub fn machine() -> String {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']))
        .unwrap_or("unknown CPU");
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let os = fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("PRETTY_NAME=")
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_default();
    format!(
        "{model}, {cores} cores (VM), {os}, Linux {}; {}; {}; rustc: {}",
        first_line("uname", &["-r"]),
        first_line("mpirun.openmpi", &["--version"]),
        first_line("mpichversion", &[])
            .replace("MPICH Version:", "MPICH")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        first_line("rustc", &["--version"]),
    )
}

/// The number after `key` (e.g. `lat8=`) among the words of `line`.
pub fn field(line: &str, key: &str) -> Result<f64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.parse().ok())
        .with_context(|| format!("no {key} in `{line}`"))
}

/// "lo–hi" of `v`, with `digits` decimals.
pub fn spread(v: &[f64], digits: usize) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{lo:.digits$}–{hi:.digits$}")
}

/// Ends `report` with the load averages (`load_before` and now), writes it
/// to `docs/NAME` under `root` and prints it.
pub fn write_report(root: &Path, name: &str, mut report: String, load_before: &str) -> Result<()> {
    report.push_str(&format!(
        "Load average (1/5/15 min) before and after the run: {load_before} / {}. The machine \
         is shared: figures taken under load are noisier.\n",
        loadavg()
    ));
    let out = root.join("docs").join(name);
    fs::create_dir_all(out.parent().expect("docs/"))?;
    fs::write(&out, &report)?;
    print!("{report}");
    println!("wrote {}", out.display());
    Ok(())
}

/// Builds the observer and the shim in release mode; returns their paths.
pub fn release_binaries(root: &Path) -> Result<(PathBuf, PathBuf)> {
    run_cmd(cargo().args([
        "build",
        "--release",
        "-p",
        "mpi-observer",
        "-p",
        "mpi-observer-shim",
    ]))?;
    Ok((
        root.join("target/release/mpi-observer"),
        root.join("target/release/libmpi_observer_shim.so"),
    ))
}

/// Runs `run` on every configuration `reps` times, round-robin, so drift on
/// a shared machine hits all alike; the results by configuration.
pub fn round_robin<C: Copy, R>(
    configs: &[C],
    reps: usize,
    mut run: impl FnMut(C) -> Result<R>,
) -> Result<Vec<Vec<R>>> {
    let mut out: Vec<Vec<R>> = configs.iter().map(|_| Vec::new()).collect();
    for _ in 0..reps {
        for (i, &c) in configs.iter().enumerate() {
            out[i].push(run(c)?);
        }
    }
    Ok(out)
}

/// How long any one step may take before the bench gives up.
pub(crate) const STEP: Duration = Duration::from_secs(90);

/// Lines of a child's pipe, read on a thread so waits can time out.
pub(crate) fn lines(r: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        // Keep draining after the receiver is gone: a closed pipe would
        // make the child's next write fail.
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            let _ = tx.send(l);
        }
    });
    rx
}

/// Waits for a line containing `needle`; returns it and the lines before.
pub(crate) fn wait_line(
    rx: &Receiver<String>,
    needle: &str,
    what: &str,
) -> Result<(String, Vec<String>)> {
    let deadline = Instant::now() + STEP;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(needle) => return Ok((l, seen)),
            Ok(l) => seen.push(l),
            Err(e) => bail!(
                "waiting for `{needle}` from {what}: {e}; got:\n{}",
                seen.join("\n")
            ),
        }
    }
}

/// Starts `mpi-observer attach` on `pids` with `extra` options (and a free
/// port, `--retain-exited 0`), and waits for one stderr line holding
/// `needle` per pid; returns the daemon and those lines.
pub(crate) fn start_daemon(
    observer: &std::path::Path,
    pids: &[String],
    extra: &[&str],
    needle: &str,
) -> Result<(std::process::Child, Vec<String>)> {
    let mut d = Command::new(observer);
    d.arg("attach");
    for pid in pids {
        d.args(["--pid", pid]);
    }
    let mut d = d
        .args(extra)
        .args(["--listen", &format!("127.0.0.1:{}", free_port()?)])
        .args(["--retain-exited", "0"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    let err = lines(d.stderr.take().context("stderr")?);
    let mut seen = Vec::new();
    for _ in pids {
        seen.push(wait_line(&err, needle, "mpi-observer")?.0);
    }
    Ok((d, seen))
}

/// A TCP port on the loopback nothing listens on now.
pub(crate) fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Sends `sig` (`-TERM`, `-INT`, ...) to `child` with kill(1); a child
/// already gone is no error.
pub(crate) fn signal(child: &Child, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status();
}

/// Waits up to STEP for `child`, then kills it.
pub(crate) fn reap(child: &mut Child, what: &str) -> Result<()> {
    let deadline = Instant::now() + STEP;
    loop {
        if let Some(st) = child.try_wait()? {
            if !st.success() {
                bail!("{what} exited with {st}");
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} did not exit within {STEP:?}");
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// The pids the `n` ranks of `job` wrote to `dir/pid.RANK`; kills the job
/// if they do not within STEP.
pub(crate) fn rank_pids(dir: &Path, n: u32, job: &mut Child) -> Result<Vec<String>> {
    let deadline = Instant::now() + STEP;
    loop {
        let got: Vec<String> = (0..n)
            .filter_map(|r| fs::read_to_string(dir.join(format!("pid.{r}"))).ok())
            .filter(|s| s.ends_with('\n'))
            .map(|s| s.trim().to_string())
            .collect();
        if got.len() == n as usize {
            return Ok(got);
        }
        if Instant::now() > deadline {
            let _ = job.kill();
            bail!("the ranks did not start");
        }
        thread::sleep(Duration::from_millis(5));
    }
}
