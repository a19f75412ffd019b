//! Debian's arm64 MPI libraries, unpacked on this x86-64 machine for the
//! tests that read them as files: `mpi-observer sites` decodes each
//! library by its own instruction set (tests/tests/e2e/sites.rs). The
//! `.deb`s are pinned by version and SHA-256 and cached beside the kernels
//! (outside the checkout); they are unpacked into the target directory.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail, ensure};

use super::{
    cache::{self, apt_download, apt_options, sha256},
    kernels::Arch,
};
use crate::setup::{run_cmd, target_dir};

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

const SUITE: &str = "bookworm";

/// Fetches (once) and unpacks the arm64 MPI libraries into
/// `target/foreign/arm64` (`e2e::FOREIGN_ARM64`), and returns that
/// directory.
pub fn arm64_mpi() -> Result<PathBuf> {
    let root = cache::dir();
    let debs = root.join("debs");
    fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
    let lock = fs::File::create(root.join(".lock"))?;
    lock.lock()
        .with_context(|| format!("locking {}", root.join(".lock").display()))?;
    let out = target_dir().join(e2e::FOREIGN_ARM64);
    if out.exists() {
        fs::remove_dir_all(&out)?;
    }
    fs::create_dir_all(&out)?;
    let mut updated = false;
    for p in &ARM64_MPI {
        let file = format!("{}_{}_arm64.deb", p.package, p.version);
        let deb = debs.join(&file);
        if !(deb.exists() && sha256(&deb)? == p.sha256) {
            let opts = apt_options(&root, SUITE, Arch::Arm64)?;
            if !updated {
                eprintln!("foreign: fetching arm64 MPI libraries from {SUITE}");
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
        run_cmd(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&out))?;
    }
    Ok(out)
}
