//! `cargo xtask package`: the Debian package, built by cargo-deb from
//! `[package.metadata.deb]` in observer/Cargo.toml, with the release
//! binaries `cargo xtask build` made and the Slurm SPANK plugin built here,
//! told where that description installs the shim (the plugin's default
//! `shim=`). With `--arch arm64`, the same package cross-built on this
//! amd64 machine: the binaries for aarch64 against an arm64 sysroot
//! (`vm::foreign::arm64_sysroot`), the plugin with the cross compiler, and
//! cargo-deb's `arm64` variant of the one description (only the plugin's
//! multiarch directory differs). `check` holds the arm64 package to the
//! amd64 one.

mod check;

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail, ensure};

pub use check::same_but_arm64;

use crate::{
    bench_shim_profile::SHIM_FILE,
    setup::{AARCH64, AARCH64_CC, run_cmd, target_dir},
    vm::{foreign, kernels::Arch},
    workspace_root,
};

/// Where the amd64 package is written, under one name whatever the
/// version, so the package tests (tests/tests/e2e/package.rs) find it.
pub fn deb_path() -> PathBuf {
    target_dir().join(e2e::package::DEB)
}

/// Where the package installs the shim: the destination of the asset
/// `target/release/libmpi_observer_shim.so` in observer/Cargo.toml, the one
/// place that says it, read through `cargo metadata`.
pub fn installed_shim() -> Result<String> {
    let mut c = crate::cargo();
    c.args(["metadata", "--format-version", "1", "--no-deps", "--locked"]);
    let meta: serde_json::Value = serde_json::from_str(&crate::setup::run_output(&mut c)?)
        .context("reading cargo metadata's output")?;
    let assets = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "mpi-observer"))
        .and_then(|p| p["metadata"]["deb"]["assets"].as_array())
        .context("observer/Cargo.toml has no [package.metadata.deb] assets")?;
    let dest = assets
        .iter()
        .filter_map(|a| a.as_array())
        .find(|a| {
            a.first()
                .and_then(|s| s.as_str())
                .is_some_and(|s| s.ends_with(&format!("/{SHIM_FILE}")))
        })
        .and_then(|a| a.get(1)?.as_str())
        .with_context(|| format!("observer/Cargo.toml installs no {SHIM_FILE}"))?;
    // A directory (ending in '/') or the file's own path, relative to /.
    let path = if dest.ends_with('/') {
        format!("/{dest}{SHIM_FILE}")
    } else {
        format!("/{dest}")
    };
    // It becomes a C string in the plugin (-DDEFAULT_SHIM).
    ensure!(
        path.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b)),
        "the shim's installed path {path:?} is not a plain path"
    );
    Ok(path.replace("//", "/"))
}

/// Builds the SPANK plugin into `release/slurm/` of the architecture's
/// target directory, then the .deb from what is built (`--no-build`: for
/// amd64, [`crate::build`] ran first; for arm64, [`foreign::cross_build`] runs
/// here). Returns the package's path: [`deb_path`] for amd64,
/// `target/debian/mpi-observer_<version>_arm64.deb` for arm64. `fast`:
/// cargo-deb's `--fast`, the same contents in a larger file, made in a
/// fifth of the time (12 s against 65 s for arm64 here): for a package
/// that is only read and checked, never shipped.
pub fn deb(arch: Arch, fast: bool) -> Result<PathBuf> {
    // Both are built here: the arm64 one cross-built, with amd64's tools.
    let host = Command::new("dpkg")
        .arg("--print-architecture")
        .output()
        .context("running dpkg --print-architecture")?;
    let host = String::from_utf8_lossy(&host.stdout).trim().to_string();
    ensure!(
        host == "amd64",
        "the packages are built on amd64 (the arm64 one cross-built), this machine is {host}"
    );
    let root = workspace_root();
    let (release, mut make) = match arch {
        Arch::X86_64 => (target_dir().join("release"), Command::new("make")),
        Arch::Arm64 => {
            let sysroot = foreign::arm64_sysroot()?;
            foreign::cross_build()?;
            let mut make = Command::new("make");
            make.arg(format!("CC={AARCH64_CC}")).arg(format!(
                "CPPFLAGS=-I{}",
                sysroot.join("usr/include").display()
            ));
            (target_dir().join(AARCH64).join("release"), make)
        }
    };
    let out = release.join("slurm");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    // slurm/Makefile's own rule, run in the output directory; VPATH finds
    // the source. Always made (`-B`): VPATH also finds a plugin someone
    // built in the source directory (`make -C slurm`), which would count
    // as this one and never land here.
    run_cmd(
        make.arg("-s")
            .arg("-B")
            .arg("-C")
            .arg(&out)
            .arg("-f")
            .arg(root.join("slurm/Makefile"))
            .arg(format!("VPATH={}", root.join("slurm").display()))
            .arg(format!("SHIM_PATH={}", installed_shim()?)),
    )?;
    let mut c = crate::cargo();
    c.args(["deb", "--package", "mpi-observer", "--no-build", "--locked"]);
    if fast {
        c.arg("--fast");
    }
    let deb = match arch {
        Arch::X86_64 => {
            let deb = deb_path();
            c.arg("--output").arg(&deb);
            deb
        }
        Arch::Arm64 => {
            // cargo-deb reads `target/release/` assets from the target's
            // directory and says arm64; the variant moves the plugin.
            let dir = target_dir().join("debian");
            c.args(["--target", AARCH64, "--variant", "arm64", "--output"])
                .arg(&dir);
            dir
        }
    };
    let o = c.output().with_context(|| format!("running {c:?}"))?;
    if !o.status.success() {
        bail!(
            "{c:?} failed with {}:\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    eprint!("{}", String::from_utf8_lossy(&o.stderr));
    let deb = match arch {
        Arch::X86_64 => deb,
        // The name cargo-deb gave it, the last line it printed.
        Arch::Arm64 => String::from_utf8_lossy(&o.stdout)
            .lines()
            .rfind(|l| l.ends_with("_arm64.deb"))
            .map(PathBuf::from)
            .with_context(|| format!("{c:?} named no _arm64.deb on its output"))?,
    };
    ensure!(deb.is_file(), "cargo deb wrote no {}", deb.display());
    Ok(deb)
}
