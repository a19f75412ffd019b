//! The root file system of the arm64 guests (issue 36): Debian bookworm's
//! arm64 packages that the e2e tests use in a guest (a shell and its
//! tools, Open MPI and MPICH with their compiler wrappers, gcc, bpftool),
//! with everything they depend on, unpacked into the cache outside the
//! checkout. An x86-64 guest boots this machine's own root; an arm64 one
//! cannot.
//!
//! Built without running anything foreign: apt, pointed at a state of its
//! own with an empty package database (`Dir::State::status`), resolves
//! and downloads the whole closure, and `dpkg -x` unpacks each `.deb`. No
//! maintainer script runs, so the little they would have done that the
//! tests need is done here ([`fix_up`]): the users and groups of
//! base-passwd, and the `mpicc`-style names the alternatives would give.
//! That takes about a minute and 60 MB of downloads on a fresh machine,
//! where `debootstrap` under qemu-user took 25 minutes.
//!
//! apt checks the archive's signature (the host's Debian keyring), so the
//! packages are Debian's; their versions are bookworm's of the day the
//! tree was built, said in `PACKAGES.txt` inside it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, ensure};

use super::{
    cache,
    kernels::{Arch, Kernel},
};
use crate::setup::run_cmd;

/// The suite the root comes from: the MPI releases the x86-64 tests run
/// (Open MPI 4.1.4, MPICH 4.0.2).
pub const SUITE: &str = "bookworm";

/// What the guests' tests use, by package: apt adds their dependencies.
pub const PACKAGES: &[&str] = &[
    // The guest script (guest.rs) and the tests' tools: bash, mountpoint,
    // ip, mktemp/tee/timeout, /bin/sh, useradd (and the users and login.defs it needs), setpriv/prlimit/unshare, pkill, ldd.
    "bash",
    "dash",
    "coreutils",
    "util-linux",
    "mount",
    "iproute2",
    "passwd",
    "login",
    "base-passwd",
    "procps",
    "findutils",
    "grep",
    "sed",
    "gawk",
    "kmod",
    "libc-bin",
    // virtme-ng builds the guest's initramfs around this root's busybox.
    "busybox-static",
    // The two MPI stacks, with their compiler wrappers: the tests compile
    // their programs in the guest, as on the host.
    "openmpi-bin",
    "libopenmpi-dev",
    "mpich",
    "libmpich-dev",
    "gcc",
    "libc6-dev",
    // The Fortran tests (the shim's and --inject's): mpif90 of both stacks.
    "gfortran",
    // kernels:: and the no-probe-left checks read the kernel's BPF objects.
    "bpftool",
    // The tests check each exposition with promtool.
    "prometheus",
    // What the arm64 package depends on (its Depends line): the daemon
    // links libotf2 for `record`.
    "adduser",
    "libopen-trace-format2-10",
    // record's tests read their archives back with two readers:
    // otf2-print and the python bindings.
    "otf2-tools",
    "python3-otf2",
    // `cargo xtask bench insns` counts the shim's instructions with
    // callgrind (xtask/src/bench_insns.rs).
    "valgrind",
];

/// The unpacked root for kernel `k` (arm64 only: an x86-64 guest boots
/// this machine's root), built unless it is there for this package list,
/// with the modules of `k`'s image `vmlinuz` ([`add_kernel`]).
pub fn prepare(k: &Kernel, vmlinuz: &Path) -> Result<PathBuf> {
    let dir = unpacked(k.arch)?;
    add_kernel(&dir, vmlinuz, k.release())?;
    Ok(dir)
}

/// The root's packages, unpacked (once per package list).
fn unpacked(arch: Arch) -> Result<PathBuf> {
    ensure!(
        arch == Arch::Arm64,
        "a root of its own is built for arm64 guests only"
    );
    let cache = cache::dir();
    let dir = cache.join(format!("root-{}-{SUITE}", arch.deb()));
    let stamp = dir.join(".complete");
    let want = PACKAGES.join(" ");
    if fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(dir);
    }
    fs::create_dir_all(&cache)?;
    let lock = fs::File::create(cache.join(".root.lock"))?;
    lock.lock().context("locking the root's build")?;
    if fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(dir);
    }
    let t = std::time::Instant::now();
    eprintln!(
        "vm: building the {} guests' root from {SUITE}'s packages (about a minute)",
        arch.deb()
    );
    let debs = download(&cache, arch)?;
    let tmp = cache.join(format!("root-{}-{SUITE}.partial", arch.deb()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp)?;
    }
    fs::create_dir_all(&tmp)?;
    let mut listed = String::new();
    for deb in &debs {
        run_cmd(Command::new("dpkg").arg("-x").arg(deb).arg(&tmp))?;
        listed.push_str(&deb.file_name().unwrap_or_default().to_string_lossy());
        listed.push('\n');
    }
    fs::write(tmp.join("PACKAGES.txt"), listed)?;
    fix_up(&tmp)?;
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::rename(&tmp, &dir)?;
    fs::write(&stamp, want)?;
    eprintln!(
        "vm: the {} root: {} packages in {:.0} s",
        arch.deb(),
        debs.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(dir)
}

/// Downloads the closure of [`PACKAGES`] into an apt cache of its own,
/// emptied first, and returns the `.deb`s.
fn download(cache: &Path, arch: Arch) -> Result<Vec<PathBuf>> {
    let state = cache.join("root-apt");
    let mut opts = cache::apt_options(&state, SUITE, arch)?;
    // Nothing installed: apt resolves every dependency down to libc.
    let status = state.join("status");
    fs::write(&status, "")?;
    for o in [
        format!("Dir::State::status={}", status.display()),
        format!("APT::Architecture={}", arch.deb()),
        "APT::Install-Recommends=false".to_string(),
    ] {
        opts.extend(["-o".to_string(), o]);
    }
    run_cmd(Command::new("apt-get").args(&opts).args(["update", "-q"]))?;
    run_cmd(Command::new("apt-get").args(&opts).arg("clean"))?;
    run_cmd(
        Command::new("apt-get")
            .args(&opts)
            .args(["install", "--download-only", "-y", "-q"])
            .args(PACKAGES),
    )?;
    let archives = state
        .join("apt")
        .join(format!("{SUITE}-{}", arch.deb()))
        .join("cache/archives");
    let mut debs: Vec<PathBuf> = fs::read_dir(&archives)
        .with_context(|| format!("reading {}", archives.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    debs.sort();
    ensure!(
        debs.len() > PACKAGES.len(),
        "apt downloaded {} packages into {} for {} asked",
        debs.len(),
        archives.display(),
        PACKAGES.len()
    );
    Ok(debs)
}

/// What the maintainer scripts would have done that the tests need.
fn fix_up(root: &Path) -> Result<()> {
    // base-passwd's postinst: the system's users and groups.
    for (master, file) in [("passwd", "passwd"), ("group", "group")] {
        let to = root.join("etc").join(file);
        if !to.exists() {
            fs::copy(
                root.join(format!("usr/share/base-passwd/{master}.master")),
                &to,
            )
            .with_context(|| format!("creating {}", to.display()))?;
        }
    }
    for (file, text) in [
        ("shadow", "root:*:19000:0:99999:7:::\n"),
        ("gshadow", "root:*::\n"),
    ] {
        let to = root.join("etc").join(file);
        if !to.exists() {
            fs::write(&to, text)?;
        }
    }
    // The alternatives' names: `mpicc` and `mpirun` are Open MPI's, as
    // Debian makes them when both are installed.
    let bin = root.join("usr/bin");
    for (name, to) in [
        ("mpicc", "mpicc.openmpi"),
        ("mpirun", "mpirun.openmpi"),
        ("mpiexec", "mpiexec.openmpi"),
        ("cc", "gcc"),
    ] {
        let link = bin.join(name);
        if bin.join(to).exists() && fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(to, &link)?;
        }
    }
    Ok(())
}

/// Puts the modules of the kernel at `vmlinuz` (an unpacked tree's
/// `boot/vmlinuz-<release>`, `cache.rs`) into `root`'s
/// `lib/modules/<release>`, where vng looks for a foreign root's: hard
/// links (both trees are in the cache, on one file system), else copies.
fn add_kernel(root: &Path, vmlinuz: &Path, release: &str) -> Result<()> {
    let to = root.join("lib/modules").join(release);
    if to.join("modules.dep").exists() {
        return Ok(());
    }
    let tree = vmlinuz
        .parent()
        .and_then(Path::parent)
        .with_context(|| format!("no kernel tree above {}", vmlinuz.display()))?;
    let from = tree.join("lib/modules").join(release);
    ensure!(
        from.join("modules.dep").exists(),
        "{} has no modules.dep",
        from.display()
    );
    if to.exists() {
        fs::remove_dir_all(&to)?;
    }
    fs::create_dir_all(to.parent().expect("lib/modules"))?;
    let linked = Command::new("cp")
        .arg("-al")
        .arg(&from)
        .arg(&to)
        .status()
        .is_ok_and(|s| s.success());
    if !linked {
        let _ = fs::remove_dir_all(&to);
        run_cmd(Command::new("cp").arg("-a").arg(&from).arg(&to))?;
    }
    Ok(())
}
