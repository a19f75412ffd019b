//! `cargo xtask bench insns`: instructions per MPI call on the shim's hot
//! path, on x86-64 and on aarch64, as callgrind counts them (issue 36).
//!
//! Time is no measure on aarch64 here: the arm64 guests run under QEMU's
//! TCG, where every instruction is translated. Instructions are: callgrind
//! counts those the program executes, the same under emulation as on a
//! chip. `shim/bench/insns.sh` does the counting, the same script on this
//! machine (x86-64, this tree's release shim) and in an arm64 guest of
//! bookworm's 6.1 kernel (`cargo xtask vm`, the cross-built shim, the
//! programs compiled in the guest by Debian's arm64 mpicc): for Open MPI
//! and MPICH, `MPI_Comm_rank` and an 8-byte `MPI_Sendrecv` to itself, each
//! without the shim, with the shim and an empty list, with one pass-through
//! tool and with `stats`. The report gives instructions per call and what
//! the shim adds to the call without it.
//!
//! What this does not say: cycles. An instruction count ignores cache
//! misses and the cost of reading the CPU's counter (an `rdtsc` is one
//! instruction of ~12 ns here; `mrs cntvct_el0` one of a chip-dependent
//! cost).

use std::{collections::BTreeMap, fmt::Write as _, path::Path, process::Command, time::Duration};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{
    bench_common::{field, loadavg, machine, release_binaries, write_report},
    setup::{AARCH64, target_dir},
    vm::{self, AccelChoice, Options, foreign, kernels},
};

/// The arm64 guest's kernel.
const KERNEL: &str = "6.1";
/// Calls counted per run.
const CALLS: u64 = 20_000;
const MPIS: [&str; 2] = ["openmpi", "mpich"];
const FUNCTIONS: [(&str, &str); 2] = [
    ("rank", "MPI_Comm_rank"),
    ("sendrecv", "MPI_Sendrecv, 8 B to itself"),
];
const MODES: [(&str, &str); 4] = [
    ("bare", "no shim"),
    ("empty", "shim, empty list"),
    ("pass1", "shim, 1 pass-through tool"),
    ("stats", "shim, `stats`"),
];

/// Instructions per call, by (mpi, function, mode).
type Counts = BTreeMap<(String, String, String), f64>;

fn parse(out: &str) -> Result<Counts> {
    let mut c = Counts::new();
    for l in out.lines().filter(|l| l.starts_with("insns mpi=")) {
        let word = |k: &str| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .map(str::to_string)
                .with_context(|| format!("no {k} in `{l}`"))
        };
        let calls = field(l, "calls=")?;
        let ir = field(l, "ir=")?;
        ensure!(calls > 0.0, "no calls in `{l}`");
        c.insert(
            (word("mpi=")?, word("function=")?, word("mode=")?),
            ir / calls,
        );
    }
    ensure!(
        c.len() == MPIS.len() * FUNCTIONS.len() * MODES.len(),
        "expected {} counts, got {}:\n{out}",
        MPIS.len() * FUNCTIONS.len() * MODES.len(),
        c.len()
    );
    Ok(c)
}

fn script(root: &Path) -> String {
    root.join("shim/bench/insns.sh").display().to_string()
}

/// This machine's counts.
fn host(root: &Path) -> Result<Counts> {
    let (_, shim) = release_binaries(root)?;
    let work = target_dir().join("bench/insns-host");
    let o = Command::new("bash")
        .arg(script(root))
        .arg(&shim)
        .arg(&work)
        .args(MPIS)
        .env("INSNS_CALLS", CALLS.to_string())
        .output()
        .context("running shim/bench/insns.sh")?;
    if !o.status.success() {
        bail!(
            "shim/bench/insns.sh failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    parse(&String::from_utf8_lossy(&o.stdout))
}

/// The arm64 guest's counts.
fn arm64() -> Result<Counts> {
    let root = crate::workspace_root();
    foreign::arm64_sysroot()?;
    foreign::cross_build()?;
    let shim = target_dir()
        .join(AARCH64)
        .join("release/libmpi_observer_shim.so");
    let kernel = kernels::find(KERNEL, kernels::Arch::Arm64)?;
    let mut command = vec![
        "bash".to_string(),
        script(&root),
        shim.display().to_string(),
        target_dir().join("bench/insns-arm64").display().to_string(),
    ];
    command.extend(MPIS.iter().map(|m| m.to_string()));
    let o = vm::run(
        &Options {
            kernel,
            accel: AccelChoice::Auto,
            timeout: Duration::from_secs(3600),
            live: true,
            env: vec![("INSNS_CALLS".into(), CALLS.to_string())],
        },
        &command,
    )?;
    let out = String::from_utf8_lossy(&o.stdout);
    if o.status != 0 {
        bail!(
            "shim/bench/insns.sh in the arm64 guest failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    parse(&out)
}

/// `cargo xtask bench insns`.
pub fn run(root: &Path) -> Result<()> {
    let load_before = loadavg();
    let x86 = host(root)?;
    let arm = arm64()?;
    let mut r = String::new();
    let _ = writeln!(
        r,
        "# Instructions per MPI call: x86-64 and aarch64\n\n\
         `cargo xtask bench insns` (xtask/src/bench_insns.rs): callgrind's count of the \
         instructions `shim/bench/insns.c` executes in {CALLS} calls, per call (its loop's \
         own few included, alike in every column), on this machine and in an arm64 guest of \
         bookworm's {KERNEL} kernel under QEMU (TCG: instructions, not time). Debian bookworm's \
         Open MPI 4.1.4 and MPICH 4.0.2 on both. `+` is what the shim adds to the call without it.\n\n\
         Machine: {}\n",
        machine()
    );
    let _ = writeln!(
        r,
        "| MPI | call | configuration | x86-64 | aarch64 | x86-64 added | aarch64 added |\n|---|---|---|---|---|---|---|"
    );
    for mpi in MPIS {
        for (f, fname) in FUNCTIONS {
            let key = |m: &str| (mpi.to_string(), f.to_string(), m.to_string());
            let bare_x = x86[&key("bare")];
            let bare_a = arm[&key("bare")];
            for (m, mname) in MODES {
                let (x, a) = (x86[&key(m)], arm[&key(m)]);
                let added = |v: f64, bare: f64| {
                    if m == "bare" {
                        "–".to_string()
                    } else {
                        format!("{:+.1}", v - bare)
                    }
                };
                let _ = writeln!(
                    r,
                    "| {mpi} | {fname} | {mname} | {x:.1} | {a:.1} | {} | {} |",
                    added(x, bare_x),
                    added(a, bare_a)
                );
            }
        }
    }
    r.push('\n');
    write_report(root, "benchmarks-insns.md", r, &load_before)
}
