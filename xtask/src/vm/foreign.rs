//! Debian's arm64 packages, fetched on this x86-64 machine: the MPI
//! libraries for the tests that read them as files (`mpi-observer sites`
//! decodes each library by its own instruction set,
//! tests/tests/e2e/sites.rs), and the sysroot the arm64 package is
//! cross-built against (`cargo xtask package --arch arm64`). The `.deb`s
//! are pinned by version and SHA-256 and cached beside the kernels
//! (outside the checkout); they are unpacked into the target directory.
//! Also the cross build for aarch64 against that sysroot ([`cross_build`],
//! [`cross_env`]), which the arm64 package and the arm64 guests use.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};

use super::{
    cache::{self, apt_download, apt_options, sha256},
    kernels::Arch,
};
use crate::{
    RELEASE_PACKAGES,
    setup::{AARCH64, AARCH64_CC, run_cmd, target_dir},
};

/// One pinned binary package.
struct Pin {
    package: &'static str,
    version: &'static str,
    sha256: &'static str,
}

/// bookworm's arm64 Open MPI 4.1.4 and MPICH 4.0.2, the releases the
/// x86-64 tests run.
const ARM64_MPI: [Pin; 2] = [
    Pin {
        package: "libopenmpi3",
        version: "4.1.4-3+b1",
        sha256: "35635bafc712a7d2305ffa68b52faceacdad8f8da99449022ee78b2ac5ec77f6",
    },
    Pin {
        package: "libmpich12",
        version: "4.0.2-3+b1",
        sha256: "0859a44463cfd768942759249a23e2d87fcf0d86fa4419d156abe5ca3dfbe5d1",
    },
];

/// What the arm64 package links and compiles against beyond the cross
/// libc (libc6-dev-arm64-cross): libotf2 for the daemon (otf2-sys links
/// `-lotf2`, which is libotf2-trace-dev's link to the -dev package's link
/// to the library), and `<slurm/spank.h>` for the SPANK plugin. The same
/// releases as this machine's amd64 ones (`cargo xtask setup`).
const ARM64_SYSROOT: [Pin; 4] = [
    Pin {
        package: "libopen-trace-format2-10",
        version: "3.0.2-2",
        sha256: "f840a0c69e13ac67eb94bae52a53ce43f96a3d1191eebe259b2f7af5b81e5c96",
    },
    Pin {
        package: "libopen-trace-format2-dev",
        version: "3.0.2-2",
        sha256: "f1d83c493176615abb02d8dbdafaf00cbe5fb1c65c2a7814720b46a38794558d",
    },
    Pin {
        package: "libotf2-trace-dev",
        version: "3.0.2-2",
        sha256: "14182661eaff902a756b05c3a51c246f6f79a465f4d451417bff649d786a9cea",
    },
    Pin {
        package: "libslurm-dev",
        version: "22.05.8-4+deb12u3",
        sha256: "dc186cc67d1d08f75e4c84cf72bc467d803255d045a8009755b3406656bb76e0",
    },
];

const SUITE: &str = "bookworm";

/// Where the arm64 sysroot is unpacked, under the target directory.
const SYSROOT_DIR: &str = "foreign/arm64-sysroot";

/// Fetches (once) and unpacks the arm64 MPI libraries into
/// `target/foreign/arm64` (`e2e::FOREIGN_ARM64`), and returns that
/// directory.
pub fn arm64_mpi() -> Result<PathBuf> {
    let out = target_dir().join(e2e::FOREIGN_ARM64);
    unpack(&ARM64_MPI, "arm64 MPI libraries", &out)?;
    Ok(out)
}

/// Fetches (once) and unpacks the arm64 sysroot ([`ARM64_SYSROOT`]) into
/// `target/foreign/arm64-sysroot`, and returns that directory: its
/// `usr/lib/aarch64-linux-gnu` and `usr/include` are Debian's arm64 ones.
pub fn arm64_sysroot() -> Result<PathBuf> {
    let out = arm64_sysroot_dir();
    unpack(&ARM64_SYSROOT, "the arm64 sysroot", &out)?;
    Ok(out)
}

/// Where [`arm64_sysroot`] unpacks, whether it has yet or not.
pub fn arm64_sysroot_dir() -> PathBuf {
    target_dir().join(SYSROOT_DIR)
}

/// Each pinned `.deb` of `pins` from the cache (downloaded if it is not
/// there with its pinned hash), unpacked into `out`, emptied first.
fn unpack(pins: &[Pin], what: &str, out: &Path) -> Result<()> {
    let root = cache::dir();
    let debs = root.join("debs");
    fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
    let lock = fs::File::create(root.join(".lock"))?;
    lock.lock()
        .with_context(|| format!("locking {}", root.join(".lock").display()))?;
    if out.exists() {
        fs::remove_dir_all(out)?;
    }
    fs::create_dir_all(out)?;
    let mut updated = false;
    for p in pins {
        let file = format!("{}_{}_arm64.deb", p.package, p.version);
        let deb = debs.join(&file);
        if !(deb.exists() && sha256(&deb)? == p.sha256) {
            let opts = apt_options(&root, SUITE, Arch::Arm64)?;
            if !updated {
                eprintln!("foreign: fetching {what} from {SUITE}");
                run_cmd(Command::new("apt-get").args(&opts).args(["update", "-q"]))?;
                updated = true;
            }
            let pkg = format!("{}:arm64={}", p.package, p.version);
            if !apt_download(&opts, &pkg, &debs)? {
                bail!(
                    "{pkg} is no longer served by {SUITE}: update the pin in xtask/src/vm/foreign.rs"
                );
            }
            let sum = sha256(&deb)?;
            ensure!(
                sum == p.sha256,
                "{} has SHA-256 {sum}, not the pinned {} (xtask/src/vm/foreign.rs)",
                deb.display(),
                p.sha256
            );
        }
        run_cmd(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(out))?;
    }
    Ok(())
}

/// The release packages for aarch64, linked by the cross gcc, with the
/// QMPI header beside them as `cargo xtask build` puts it for this machine.
pub fn cross_build() -> Result<()> {
    let mut c = crate::cargo();
    c.args(["build", "--release", "--locked", "--target", AARCH64]);
    for p in RELEASE_PACKAGES {
        c.args(["-p", p]);
    }
    run_cmd(cross_env(&mut c))?;
    crate::qmpi_header_beside(&crate::setup::target_dir().join(AARCH64).join("release"))
}

/// The environment of every cargo run for [`AARCH64`] that builds the
/// daemon, the same in each (`cargo xtask test`'s clippy too), since a
/// change reruns build scripts and rebuilds the daemon (about 4 minutes
/// here): the cross gcc as linker, as `cargo xtask qemu-shim` gives it,
/// and the arm64 libotf2 for otf2-sys (`OTF2_LIB_DIR`).
pub fn cross_env(c: &mut Command) -> &mut Command {
    c.env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", AARCH64_CC)
        .env(
            "OTF2_LIB_DIR",
            arm64_sysroot_dir().join("usr/lib/aarch64-linux-gnu"),
        )
}
