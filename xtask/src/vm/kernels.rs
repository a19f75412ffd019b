//! The kernels the VM harness boots: Debian's own packages, pinned to one
//! version each, with the SHA-256 the suite's `Packages` index gives for
//! the `.deb` (checked after every download, so what we boot is what was
//! pinned here and nothing else).
//!
//! Pins go stale: a suite that moves on (a backports upload, a point
//! release) stops serving the old file. The cache keeps what was fetched,
//! so a machine that has it never notices; a fresh machine gets one line
//! saying which pin to update and how to read the new version and hash.

use std::fmt;

use anyhow::{Result, bail};

/// The instruction set of the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    /// 64-bit PC: booted with this machine's own root file system.
    #[value(name = "x86_64")]
    X86_64,
    /// 64-bit Arm: booted under emulation (issue 36).
    #[value(name = "arm64")]
    Arm64,
}

impl Arch {
    /// Debian's name for it (`dpkg --print-architecture`).
    pub fn deb(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// virtme-ng's name for it (`vng --arch`).
    pub fn vng(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Arm64 => "arm64",
        }
    }

    /// Debian's multiarch name for it (`usr/lib/<multiarch>`).
    pub fn multiarch(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-linux-gnu",
            Arch::Arm64 => "aarch64-linux-gnu",
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.vng())
    }
}

/// The Debian archive every pinned suite comes from.
pub const MIRROR: &str = "http://deb.debian.org/debian";

/// One pinned kernel package.
#[derive(Debug, PartialEq, Eq)]
pub struct Kernel {
    /// What `--kernel` calls it.
    pub name: &'static str,
    /// What it runs on.
    pub arch: Arch,
    /// The suite that serves it (component `main` of [`MIRROR`]).
    pub suite: &'static str,
    /// The binary package: `linux-image-<release>`.
    pub package: &'static str,
    /// The package's exact version.
    pub version: &'static str,
    /// SHA-256 of the `.deb`, from the suite's `Packages` index.
    pub sha256: &'static str,
}

impl Kernel {
    /// The kernel release (`uname -r` in the guest; its modules directory).
    pub fn release(&self) -> &'static str {
        self.package
            .strip_prefix("linux-image-")
            .expect("every pinned package is a linux-image-*")
    }

    /// The `.deb`'s file name, as `apt-get download` writes it (a `:` in a
    /// version would be `%3a`; none of ours has an epoch).
    pub fn deb_file(&self) -> String {
        format!("{}_{}_{}.deb", self.package, self.version, self.arch.deb())
    }
}

/// Every kernel the harness knows: the one table of pins.
///
/// To move a pin: point apt at the suite (as `cargo xtask vm` does, see
/// `setup.rs`) and read `apt-cache show linux-image-<flavour>` there: the
/// `Depends` names the versioned package, whose entry has `Version` and
/// `SHA256`.
pub const KERNELS: &[Kernel] = &[
    // Debian 11. Bullseye's last point release (11.11): frozen.
    Kernel {
        name: "5.10",
        arch: Arch::X86_64,
        suite: "bullseye",
        package: "linux-image-5.10.0-32-amd64",
        version: "5.10.223-1",
        sha256: "86a6792f3a03ab15a643f385830cdaa921f15e3e9c8bf63aa55a9243c62fc797",
    },
    // Debian 12, the distribution this project's machines run. Bookworm's
    // last point release: frozen (security updates go to bookworm-security).
    Kernel {
        name: "6.1",
        arch: Arch::X86_64,
        suite: "bookworm",
        package: "linux-image-6.1.0-50-amd64",
        version: "6.1.176-1",
        sha256: "7b5597492a0a65aee61985a492e6bcc3f2cde830072a0e3b3d8c7e1b90279bd3",
    },
    // The control: has uprobe_multi links. Backports move on, so this pin
    // is the one that goes stale first.
    Kernel {
        name: "6.12",
        arch: Arch::X86_64,
        suite: "bookworm-backports",
        package: "linux-image-6.12.95+deb12-amd64",
        version: "6.12.95-1~bpo12+1",
        sha256: "5e524b782be67cb0d6a2e7b51816a2ac519e573ef7324b9a63a4124365653ecc",
    },
    Kernel {
        name: "6.1",
        arch: Arch::Arm64,
        suite: "bookworm",
        package: "linux-image-6.1.0-50-arm64",
        version: "6.1.176-1",
        sha256: "914f75b57a8e165d85fb910c3e2dcc7000a05a9fea3f42f90b26e8dd590d5f06",
    },
    Kernel {
        name: "6.12",
        arch: Arch::Arm64,
        suite: "bookworm-backports",
        package: "linux-image-6.12.95+deb12-arm64",
        version: "6.12.95-1~bpo12+1",
        sha256: "08f6c01d4c68c5136106f51302d1b564f40325be2b6bfada71269929e9b5b336",
    },
    // 16 KiB pages (issue 36, "Pages other than 4 KiB").
    Kernel {
        name: "6.12-16k",
        arch: Arch::Arm64,
        suite: "bookworm-backports",
        package: "linux-image-6.12.95+deb12-arm64-16k",
        version: "6.12.95-1~bpo12+1",
        sha256: "505633c576b7e62e7639dca330cdfdba3fd7d615eb1a9e6cec41581b1b57f7b4",
    },
];

/// The pinned kernel `name` for `arch`, or one line naming the known ones.
pub fn find(name: &str, arch: Arch) -> Result<&'static Kernel> {
    if let Some(k) = KERNELS.iter().find(|k| k.name == name && k.arch == arch) {
        return Ok(k);
    }
    let known: Vec<&str> = KERNELS
        .iter()
        .filter(|k| k.arch == arch)
        .map(|k| k.name)
        .collect();
    bail!(
        "no pinned {arch} kernel named `{name}`: use one of {} (table in xtask/src/vm/kernels.rs)",
        known.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_each_pin_by_name_and_arch() {
        assert_eq!(
            find("6.1", Arch::X86_64).unwrap().package,
            "linux-image-6.1.0-50-amd64"
        );
        assert_eq!(
            find("6.1", Arch::Arm64).unwrap().package,
            "linux-image-6.1.0-50-arm64"
        );
        assert_eq!(find("5.10", Arch::X86_64).unwrap().suite, "bullseye");
    }

    #[test]
    fn an_unknown_name_lists_the_known_ones_for_that_arch() {
        let e = find("4.18", Arch::X86_64).unwrap_err().to_string();
        assert!(e.contains("`4.18`") && e.contains("5.10, 6.1, 6.12"), "{e}");
        // 5.10 is pinned for x86_64 only.
        let e = find("5.10", Arch::Arm64).unwrap_err().to_string();
        assert!(e.contains("6.1, 6.12, 6.12-16k"), "{e}");
    }

    #[test]
    fn the_table_is_well_formed() {
        for (i, k) in KERNELS.iter().enumerate() {
            assert_eq!(k.sha256.len(), 64, "{}", k.package);
            assert!(
                k.sha256
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
                "{}",
                k.package
            );
            assert!(k.release().ends_with(k.arch.deb()) || k.release().ends_with("-16k"));
            assert!(!k.version.contains(':'), "an epoch changes the file name");
            assert!(
                KERNELS[..i]
                    .iter()
                    .all(|o| (o.name, o.arch) != (k.name, k.arch)),
                "{} {} is pinned twice",
                k.name,
                k.arch
            );
        }
    }

    #[test]
    fn file_names_are_what_apt_get_download_writes() {
        let k = find("6.12", Arch::X86_64).unwrap();
        assert_eq!(
            k.deb_file(),
            "linux-image-6.12.95+deb12-amd64_6.12.95-1~bpo12+1_amd64.deb"
        );
        assert_eq!(k.release(), "6.12.95+deb12-amd64");
    }
}
