//! What the benchmarks share: launching MPI jobs on either implementation,
//! medians, and a description of the machine for the reports.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

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
