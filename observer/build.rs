//! Builds the eBPF programs for the BPF target and leaves the object in
//! OUT_DIR for `include_bytes_aligned!`. Nightly is used when installed;
//! otherwise stable with RUSTC_BOOTSTRAP=1, which builds core from rust-src
//! the same way (verified on rustc 1.95). AYA_BUILD_SKIP=1 skips this, for
//! lint-only jobs.
use std::process::Command;

use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let nightly = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    let toolchain = if nightly {
        Toolchain::Nightly
    } else {
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
        Toolchain::Custom("stable")
    };
    let meta = cargo_ebpf_dir().context("locating observer-ebpf")?;
    aya_build::build_ebpf(
        [Package {
            name: "observer-ebpf",
            root_dir: &meta,
            ..Default::default()
        }],
        toolchain,
    )
}

fn cargo_ebpf_dir() -> anyhow::Result<String> {
    let manifest = std::env::var("CARGO_MANIFEST_DIR")?;
    let dir = std::path::Path::new(&manifest)
        .parent()
        .ok_or_else(|| anyhow!("observer has no parent directory"))?
        .join("observer-ebpf");
    dir.to_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", dir.display()))
}
