//! Installs what a fresh Debian machine lacks, idempotently: the MPI and
//! tooling packages, rust-src for the BPF build, and bpf-linker 0.10.1.

use std::process::Command;

use anyhow::{Context as _, Result, bail};

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
    "iproute2",
    "procps",
    // systemd-analyze verifies the shipped unit (tests/tests/cluster.rs).
    "systemd",
    "hyperfine",
];

/// bpf-linker 0.10.1 links with rustc's own LLVM; 0.11 and later need a
/// system LLVM that Debian 12 does not have.
const BPF_LINKER_VERSION: &str = "0.10.1";

pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
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
    Ok(())
}
