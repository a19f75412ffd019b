//! `cargo xtask package`: the Debian package, built by cargo-deb from
//! `[package.metadata.deb]` in observer/Cargo.toml, with the release
//! binaries `cargo xtask build` made and the Slurm SPANK plugin built here,
//! told where that description installs the shim (the plugin's default
//! `shim=`).

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{
    bench_shim_profile::SHIM_FILE,
    setup::{run_cmd, target_dir},
    workspace_root,
};

/// Where the package is written, under one name whatever the version, so
/// the package tests (tests/tests/e2e/package.rs) find it.
pub fn deb_path() -> PathBuf {
    target_dir().join(e2e::package::DEB)
}

/// Where the package installs the shim: the destination of the asset
/// `target/release/libmpi_observer_shim.so` in observer/Cargo.toml, the one
/// place that says it, read through `cargo metadata`.
pub fn installed_shim() -> Result<String> {
    let mut c = crate::cargo();
    c.args(["metadata", "--format-version", "1", "--no-deps", "--locked"]);
    let o = c.output().with_context(|| format!("running {c:?}"))?;
    ensure!(
        o.status.success(),
        "{c:?} failed with {}:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&o.stdout).context("reading cargo metadata's output")?;
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

/// Builds the SPANK plugin into `target/release/slurm/`, then the .deb from
/// what is built (`--no-build`: [`crate::build`] ran first). Returns the
/// package's path.
pub fn deb() -> Result<PathBuf> {
    // The plugin's destination in observer/Cargo.toml is Debian's amd64
    // Slurm plugin directory.
    let arch = Command::new("dpkg")
        .arg("--print-architecture")
        .output()
        .context("running dpkg --print-architecture")?;
    let arch = String::from_utf8_lossy(&arch.stdout).trim().to_string();
    ensure!(
        arch == "amd64",
        "the package is described for amd64 (Slurm's plugin directory in observer/Cargo.toml), this machine is {arch}"
    );
    let root = workspace_root();
    let out = target_dir().join("release/slurm");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    // slurm/Makefile's own rule, run in the output directory; VPATH finds
    // the source. Always made (`-B`): VPATH also finds a plugin someone
    // built in the source directory (`make -C slurm`), which would count
    // as this one and never land here.
    run_cmd(
        Command::new("make")
            .arg("-s")
            .arg("-B")
            .arg("-C")
            .arg(&out)
            .arg("-f")
            .arg(root.join("slurm/Makefile"))
            .arg(format!("VPATH={}", root.join("slurm").display()))
            .arg(format!("SHIM_PATH={}", installed_shim()?)),
    )?;
    let deb = deb_path();
    let mut c = crate::cargo();
    c.args(["deb", "--package", "mpi-observer", "--no-build", "--locked"])
        .arg("--output")
        .arg(&deb);
    let o = c.output().with_context(|| format!("running {c:?}"))?;
    if !o.status.success() {
        bail!(
            "{c:?} failed with {}:\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    eprint!("{}", String::from_utf8_lossy(&o.stderr));
    ensure!(deb.is_file(), "cargo deb wrote no {}", deb.display());
    Ok(deb)
}
