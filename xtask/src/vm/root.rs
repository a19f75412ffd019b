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
use crate::setup::{run_cmd, run_output};

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
    // otf2-print and the python bindings (which import six without
    // depending on it).
    "otf2-tools",
    "python3-otf2",
    "python3-six",
    // callers.rs' tools walk the stack with libunwind.
    "libunwind-dev",
    // package.rs installs the arm64 package with dpkg, as a site does, and
    // checks its unit with systemd-analyze; dpkg runs diff (Essential,
    // so no package depends on it).
    "systemd",
    "diffutils",
    // `cargo xtask bench insns` counts the shim's instructions with
    // callgrind (xtask/src/bench_insns.rs).
    "valgrind",
];

/// What the root's build does beyond unpacking ([`Dpkg`], [`fix_up`]):
/// a cached root of another layout is built again.
const LAYOUT: u32 = 3;

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
    let want = format!("layout {LAYOUT}: {}", PACKAGES.join(" "));
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
    let mut db = Dpkg::default();
    for deb in &debs {
        let files = run_output(
            Command::new("dpkg-deb")
                .arg("--vextract")
                .arg(deb)
                .arg(&tmp),
        )?;
        let control = run_output(Command::new("dpkg-deb").arg("--field").arg(deb))?;
        db.add(&control, &files, arch)?;
        listed.push_str(&deb.file_name().unwrap_or_default().to_string_lossy());
        listed.push('\n');
    }
    fs::write(tmp.join("PACKAGES.txt"), listed)?;
    db.write(&tmp)?;
    fix_up(&tmp, arch)?;
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

/// dpkg's database of the unpacked packages, as if dpkg had installed
/// them: each one's control fields, "install ok installed", in `status`,
/// and its files in `info/<package>.list`. Then `dpkg --install` in the
/// guest finds every dependency of the arm64 package there, and checks
/// its files against the others', as on a site's node.
#[derive(Default)]
struct Dpkg {
    status: String,
    lists: Vec<(String, String)>,
}

impl Dpkg {
    /// One package: `control` as `dpkg-deb --field` prints it, `files` as
    /// `dpkg-deb --vextract` does (`./usr/bin/x`, directories with a
    /// trailing slash).
    fn add(&mut self, control: &str, files: &str, arch: Arch) -> Result<()> {
        let field = |name: &str| {
            control
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
                .map(str::trim)
        };
        let package = field("Package").context("a package without a Package field")?;
        for l in control.lines().filter(|l| !l.trim().is_empty()) {
            self.status.push_str(l);
            self.status.push('\n');
            if l.starts_with("Package: ") {
                self.status.push_str("Status: install ok installed\n");
            }
        }
        self.status.push('\n');
        // A Multi-Arch: same package's files are named with its
        // architecture, as dpkg names them.
        let name = if field("Multi-Arch") == Some("same") {
            format!("{package}:{}", arch.deb())
        } else {
            package.to_string()
        };
        let list = files
            .lines()
            .filter_map(|f| {
                let f = f.strip_prefix('.')?.trim_end_matches('/');
                Some(if f.is_empty() { "/." } else { f })
            })
            .fold(String::new(), |mut s, f| {
                s.push_str(f);
                s.push('\n');
                s
            });
        self.lists.push((name, list));
        Ok(())
    }

    /// Writes the database under `root`'s `var/lib/dpkg`.
    fn write(&self, root: &Path) -> Result<()> {
        let dir = root.join("var/lib/dpkg");
        for d in ["info", "updates", "triggers", "alternatives", "parts"] {
            fs::create_dir_all(dir.join(d))?;
        }
        for f in ["available", "diversions", "statoverride"] {
            fs::write(dir.join(f), "")?;
        }
        fs::write(dir.join("status"), &self.status)?;
        for (name, list) in &self.lists {
            fs::write(dir.join("info").join(format!("{name}.list")), list)?;
        }
        Ok(())
    }
}

/// What the maintainer scripts would have done that the tests need.
fn fix_up(root: &Path, arch: Arch) -> Result<()> {
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
    // libpam-runtime's postinst (pam-auth-update): the common PAM stacks,
    // as it writes them with its one default profile, `unix`. adduser runs
    // chfn, which aborts without them.
    let session = "session\t[default=1]\t\t\tpam_permit.so\n\
                   session\trequisite\t\t\tpam_deny.so\n\
                   session\trequired\t\t\tpam_permit.so\n\
                   session\trequired\tpam_unix.so\n";
    for (file, text) in [
        (
            "common-auth",
            "auth\t[success=1 default=ignore]\tpam_unix.so nullok\n\
             auth\trequisite\t\t\tpam_deny.so\n\
             auth\trequired\t\t\tpam_permit.so\n",
        ),
        (
            "common-account",
            "account\t[success=1 new_authtok_reqd=done default=ignore]\tpam_unix.so\n\
             account\trequisite\t\t\tpam_deny.so\n\
             account\trequired\t\t\tpam_permit.so\n",
        ),
        (
            "common-password",
            "password\t[success=1 default=ignore]\tpam_unix.so obscure yescrypt\n\
             password\trequisite\t\t\tpam_deny.so\n\
             password\trequired\t\t\tpam_permit.so\n",
        ),
        ("common-session", session),
        ("common-session-noninteractive", session),
    ] {
        let to = root.join("etc/pam.d").join(file);
        if !to.exists() {
            fs::write(&to, text).with_context(|| format!("creating {}", to.display()))?;
        }
    }
    // Mount points virtme-ng overlays, which no package makes.
    for d in ["opt", "srv", "home"] {
        fs::create_dir_all(root.join(d))?;
    }
    // The alternatives' names: the `mpi` and `mpirun` groups are Open
    // MPI's, as Debian makes them when both stacks are installed. Its
    // Fortran wrappers link `-lmpi` from the multiarch directory, where
    // only the alternative puts it.
    let multiarch = format!("usr/lib/{}", arch.multiarch());
    let links = [
        ("usr/bin/mpicc", "mpicc.openmpi"),
        ("usr/bin/mpifort", "mpifort.openmpi"),
        ("usr/bin/mpif90", "mpif90.openmpi"),
        ("usr/bin/mpirun", "mpirun.openmpi"),
        ("usr/bin/mpiexec", "mpiexec.openmpi"),
        ("usr/bin/cc", "gcc"),
        (&format!("{multiarch}/libmpi.so"), "openmpi/lib/libmpi.so"),
        (
            &format!("usr/include/{}/mpi", arch.multiarch()),
            &format!("/{multiarch}/openmpi/include"),
        ),
    ];
    for (name, to) in links {
        let link = root.join(name);
        let parent = link.parent().expect("a path under the root");
        let target = if let Some(abs) = to.strip_prefix('/') {
            root.join(abs)
        } else {
            parent.join(to)
        };
        if target.exists() && fs::symlink_metadata(&link).is_err() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_package_is_recorded_as_dpkg_records_an_installed_one() {
        let mut db = Dpkg::default();
        let control = "Package: libfoo1\nVersion: 1.0-1\nArchitecture: arm64\n\
                       Multi-Arch: same\nDescription: foo\n more foo\n";
        let files = "./\n./usr/\n./usr/lib/\n./usr/lib/aarch64-linux-gnu/libfoo.so.1\n";
        db.add(control, files, Arch::Arm64).unwrap();
        db.add(
            "Package: bar\nVersion: 2\nArchitecture: all\n",
            "./\n./usr/bin/bar\n",
            Arch::Arm64,
        )
        .unwrap();
        assert_eq!(
            db.status,
            "Package: libfoo1\nStatus: install ok installed\nVersion: 1.0-1\n\
             Architecture: arm64\nMulti-Arch: same\nDescription: foo\n more foo\n\n\
             Package: bar\nStatus: install ok installed\nVersion: 2\nArchitecture: all\n\n"
        );
        assert_eq!(db.lists[0].0, "libfoo1:arm64");
        assert_eq!(
            db.lists[0].1,
            "/.\n/usr\n/usr/lib\n/usr/lib/aarch64-linux-gnu/libfoo.so.1\n"
        );
        assert_eq!(db.lists[1].0, "bar");
        assert!(db.add("Version: 1\n", "", Arch::Arm64).is_err());
    }
}
