//! The aarch64 shim, run: its unit tests under `qemu-aarch64-static`; then
//! cross-built and preloaded under
//! `qemu-aarch64-static` into a small aarch64 program that calls a stand-in
//! MPI library (xtask/qemu/: `app.c`, `fake_mpi.c`, and a PMPI tool,
//! `tool.c`). It runs the shim's own machinery on aarch64 code: the startup
//! IFUNC (and the order glibc applies it in), the trampolines, the cold
//! path that builds the stack, the binding of a tool's `PMPI_X` to the
//! level below, and the library gates.
//!
//! What qemu-user cannot show: another page size, Arm's weak memory
//! ordering (TCG on an x86 host is stronger), uprobes, ptrace of another
//! process, `mpirun`. Those need an arm64 guest or hardware.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, ensure};

use crate::setup::{self, AARCH64, AARCH64_CC as CC, run_cmd};

const QEMU: &str = "qemu-aarch64-static";
/// Where Debian's cross libc (libc6-arm64-cross) puts the aarch64 loader
/// and libraries: qemu's `-L`.
const SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// What the program prints with no shim, and with the shim and no tool:
/// every call reaches the library once and succeeds.
const BARE: &str = "app: init=0
app: comm_rank=0 rank=0
app: send=0
app: send=0
app: send=0
app: psend=0
app: finalize=0
library: init=1 comm_rank=1 send=4 finalize=1
";

/// With the tool listed: it sees the three `MPI_Send`s and the
/// application's `PMPI_Send` too (the Fortran level is the top one, so a
/// `PMPI_X` enters at the tool), and the library every call once.
const TOOL: &str = "app: init=0
app: comm_rank=0 rank=0
app: send=0
app: send=0
app: send=0
app: psend=0
app: finalize=0
tool: send=4
library: init=1 comm_rank=1 send=4 finalize=1
";

pub fn run() -> Result<()> {
    let root = crate::workspace_root();
    run_cmd(
        crate::cargo()
            .args(["test", "--release", "--target", AARCH64])
            .args(["-p", "mpi-observer-shim"])
            .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", CC)
            .env(
                "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER",
                format!("{QEMU} -L {SYSROOT}"),
            ),
    )?;
    run_cmd(
        crate::cargo()
            .args(["build", "--release", "--target", AARCH64])
            .args(["-p", "mpi-observer-shim"])
            .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", CC),
    )?;
    let target = setup::target_dir();
    let shim = target.join(AARCH64).join("release/libmpi_observer_shim.so");
    let dir = target.join("qemu-aarch64");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let src = root.join("xtask/qemu");
    let c = |f: &str| src.join(f);
    run_cmd(
        Command::new(CC)
            .args(["-O2", "-shared", "-fPIC", "-Wl,-soname,libmpi.so.40", "-o"])
            .arg(dir.join("libmpi.so.40"))
            .arg(c("fake_mpi.c")),
    )?;
    let link = dir.join("libmpi.so");
    if link.symlink_metadata().is_err() {
        std::os::unix::fs::symlink("libmpi.so.40", &link)?;
    }
    let tool = dir.join("libtool.so");
    run_cmd(
        Command::new(CC)
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(&tool)
            .arg(c("tool.c"))
            .arg(format!("-L{}", dir.display()))
            .arg("-lmpi"),
    )?;
    let app = dir.join("app");
    run_cmd(
        Command::new(CC)
            .args(["-O2", "-o"])
            .arg(&app)
            .arg(c("app.c"))
            .arg(format!("-L{}", dir.display()))
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg("-lmpi"),
    )?;
    expect("no shim", &app, None, None, BARE)?;
    expect("the shim, no tool", &app, Some(&shim), Some(""), BARE)?;
    let list = format!("v,{}", tool.display());
    let err = expect("the shim and a tool", &app, Some(&shim), Some(&list), TOOL)?;
    let layers = format!("[1] {0} ({0}): 1 entry points", tool.display());
    ensure!(
        err.contains(&layers) && err.contains("[2] mpi ("),
        "qemu-aarch64 shim run: the layers line does not name the tool above the library:\n{err}"
    );
    eprintln!("qemu-aarch64: the aarch64 shim ran the program unchanged, and with a tool layered");
    Ok(())
}

/// Runs `app` under qemu (preloading `shim` with `list` as the tools list,
/// if given), requires exit status 0 and exactly `want` on stdout, and
/// returns stderr.
fn expect(
    what: &str,
    app: &Path,
    shim: Option<&PathBuf>,
    list: Option<&str>,
    want: &str,
) -> Result<String> {
    let mut cmd = Command::new(QEMU);
    cmd.args(["-L", SYSROOT]);
    if let Some(s) = shim {
        // -E, not our environment: it would also preload into qemu's
        // children, were there any; qemu itself is static.
        cmd.arg("-E").arg(format!("LD_PRELOAD={}", s.display()));
    }
    cmd.arg(app)
        .env_remove("LD_PRELOAD")
        .env_remove("OMPI_MCA_ompi_tools_entry");
    match list {
        // The list holds commas, which -E would split: the environment.
        Some(l) => cmd.env("MPI_TOOLS_ENTRY", l),
        None => cmd.env_remove("MPI_TOOLS_ENTRY"),
    };
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    ensure!(
        out.status.success() && stdout == want,
        "qemu-aarch64, {what}: {} (want exit 0)\nstdout:\n{stdout}\nwant:\n{want}\nstderr:\n{stderr}",
        out.status
    );
    Ok(stderr)
}
