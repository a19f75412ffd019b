//! What the VM harness keeps between runs, outside the checkout (CI clones
//! afresh but runs on the same machine): virtme-ng in a venv, the pinned
//! kernels' `.deb`s and their unpacked trees, and apt's state for the
//! suites they come from. A second run finds everything here and needs no
//! network.
//!
//! The host is left as it was apart from Debian packages: the kernels are
//! fetched with apt pointed at a sources list and state of our own
//! (`-o Dir::Etc::SourceList=…`), never the host's, and unpacked with
//! `dpkg -x` into the cache; their modules stay there too (virtme-ng links
//! the guest's `/lib/modules/<release>` to them).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};

use super::kernels::{Arch, Kernel, MIRROR};
use crate::setup::run_cmd;

/// virtme-ng from PyPI, pinned: its command line and guest init are what
/// `boot.rs` relies on.
pub const VIRTME_NG: &str = "virtme-ng==1.42";

/// Debian packages the harness needs on the host, per guest architecture.
/// busybox-static: virtme-ng builds its initramfs around a static busybox.
pub fn host_packages(arch: Arch) -> &'static [&'static str] {
    match arch {
        Arch::X86_64 => &["qemu-system-x86", "busybox-static", "python3-venv", "kmod"],
        // The guest's root is unpacked, never run here (root.rs): no
        // qemu-user, binfmt_misc or debootstrap.
        Arch::Arm64 => &["qemu-system-arm", "busybox-static", "python3-venv", "kmod"],
    }
}

/// The cache directory: `$MPI_OBSERVER_VM_CACHE`, else
/// `$XDG_CACHE_HOME/mpi-observer/vm`, else `~/.cache/mpi-observer/vm`.
/// Not under /var/cache: virtme-ng's guest init mounts a tmpfs there, which
/// would hide the kernel's modules (and the run directory) from the guest.
pub fn dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("MPI_OBSERVER_VM_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("mpi-observer/vm")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/mpi-observer/vm")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache/mpi-observer/vm"))
}

/// A kernel ready to boot: its image and the modules beside it.
#[derive(Debug)]
pub struct Unpacked {
    /// `boot/vmlinuz-<release>` inside the unpacked tree. virtme-ng finds
    /// the modules from it (`lib/modules/<release>` of the same tree).
    pub vmlinuz: PathBuf,
    /// The guest's `/etc/udev/rules.d` ([`udev_rules`]).
    pub udev_rules: PathBuf,
}

/// Installs what is missing on the host (apt, as `cargo xtask setup` does),
/// virtme-ng, and the kernel `k`, and returns the kernel and `vng`. Parallel
/// runs wait on one lock here rather than download over each other.
pub fn prepare(k: &Kernel) -> Result<(Unpacked, PathBuf)> {
    host(k.arch)?;
    let root = dir();
    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let lock = fs::File::create(root.join(".lock"))?;
    lock.lock()
        .with_context(|| format!("locking {}", root.join(".lock").display()))?;
    let vng = virtme_ng(&root)?;
    let mut kernel = kernel(&root, k)?;
    kernel.udev_rules = udev_rules(&root)?;
    Ok((kernel, vng))
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn host(arch: Arch) -> Result<()> {
    let missing: Vec<&str> = host_packages(arch)
        .iter()
        .copied()
        .filter(|p| !installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("vm: installing {}", missing.join(" "));
    run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
    run_cmd(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q"])
            .args(&missing),
    )
}

/// `vng` from a venv in the cache, made once (a stamp names what is in it).
fn virtme_ng(root: &Path) -> Result<PathBuf> {
    let venv = root.join("venv");
    let vng = venv.join("bin/vng");
    let stamp = venv.join(".mpi-observer-stamp");
    if vng.exists() && fs::read_to_string(&stamp).is_ok_and(|s| s == VIRTME_NG) {
        return Ok(vng);
    }
    eprintln!("vm: installing {VIRTME_NG} into {}", venv.display());
    if venv.exists() {
        fs::remove_dir_all(&venv).with_context(|| format!("removing {}", venv.display()))?;
    }
    run_cmd(
        Command::new("/usr/bin/python3")
            .args(["-m", "venv"])
            .arg(&venv),
    )?;
    run_cmd(
        Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "--only-binary", ":all:", VIRTME_NG])
            // The host's pip configuration may point at wheel directories
            // that CI's fresh machine lacks: PyPI only.
            .env_remove("PIP_FIND_LINKS"),
    )?;
    ensure!(
        vng.exists(),
        "installing {VIRTME_NG} left no {}",
        vng.display()
    );
    fs::write(&stamp, VIRTME_NG)?;
    Ok(vng)
}

/// What a finished kernel tree's stamp holds: the pin it was made from.
fn stamp_text(k: &Kernel) -> String {
    format!("{} {} {}\n", k.package, k.version, k.sha256)
}

fn kernel(root: &Path, k: &Kernel) -> Result<Unpacked> {
    let tree = root.join("kernels").join(k.arch.deb()).join(k.name);
    let vmlinuz = tree.join("boot").join(format!("vmlinuz-{}", k.release()));
    let stamp = tree.join(".mpi-observer-stamp");
    if vmlinuz.exists() && fs::read_to_string(&stamp).is_ok_and(|s| s == stamp_text(k)) {
        return Ok(Unpacked {
            vmlinuz,
            udev_rules: PathBuf::new(),
        });
    }
    let deb = download(root, k)?;
    eprintln!("vm: unpacking {}", deb.display());
    // Beside the tree, named after it whole ("6.12" has a dot of its own).
    let partial = tree.with_file_name(format!("{}.partial", k.name));
    for d in [&partial, &tree] {
        if d.exists() {
            fs::remove_dir_all(d).with_context(|| format!("removing {}", d.display()))?;
        }
    }
    fs::create_dir_all(&partial)?;
    run_cmd(Command::new("dpkg").arg("-x").arg(&deb).arg(&partial))?;
    // Debian's postinst writes modules.dep; dpkg -x runs no script.
    run_cmd(
        Command::new("depmod")
            .arg("-b")
            .arg(&partial)
            .arg(k.release()),
    )?;
    fs::write(partial.join(".mpi-observer-stamp"), stamp_text(k))?;
    fs::rename(&partial, &tree)
        .with_context(|| format!("renaming {} to {}", partial.display(), tree.display()))?;
    ensure!(
        vmlinuz.exists(),
        "{} has no {}",
        deb.display(),
        vmlinuz.display()
    );
    Ok(Unpacked {
        vmlinuz,
        udev_rules: PathBuf::new(),
    })
}

/// The udev rules the guest keeps: the default devices' names and modes
/// (virtme-ng finds its named virtio ports through them; without them its
/// init runs the script on the console, which `boot.rs` reads too). With
/// no rule at all udev still took 67 s to settle under load, against 85 s
/// with this one: not worth the console.
const UDEV_KEPT: &[&str] = &["50-udev-default.rules"];

/// A directory the guest mounts over `/etc/udev/rules.d`: the host's own
/// files there, and an empty file for every other rule file of
/// `/usr/lib/udev/rules.d` (a file in /etc masks the one of the same name).
/// Under TCG, udev's coldplug ran those rules (module loading for emulated
/// devices we do not use, disk and input naming) for 70-300 s of each boot,
/// and once never settled. Made again on each run from the host's files.
fn udev_rules(root: &Path) -> Result<PathBuf> {
    let dir = root.join("udev/rules.d");
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let names = |d: &str| -> Vec<String> {
        fs::read_dir(d)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".rules"))
                    .collect()
            })
            .unwrap_or_default()
    };
    for n in names("/etc/udev/rules.d") {
        fs::copy(Path::new("/etc/udev/rules.d").join(&n), dir.join(&n))?;
    }
    for n in masked(&names("/usr/lib/udev/rules.d")) {
        if !dir.join(&n).exists() {
            fs::write(dir.join(&n), "")?;
        }
    }
    Ok(dir)
}

/// Which of the system's rule files to mask.
fn masked(system: &[String]) -> Vec<String> {
    system
        .iter()
        .filter(|n| !UDEV_KEPT.contains(&n.as_str()))
        .cloned()
        .collect()
}

/// apt's options for our own state under `root/apt/<suite>-<arch>`: its
/// sources list names the one suite, and nothing of the host's apt
/// configuration (sources, lists, archives, preferences) is read or written.
pub fn apt_options(root: &Path, suite: &str, arch: Arch) -> Result<Vec<String>> {
    let state = root.join("apt").join(format!("{suite}-{}", arch.deb()));
    let empty = state.join("empty.d");
    for d in [
        state.join("lists/partial"),
        state.join("cache/archives/partial"),
        empty.clone(),
    ] {
        fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    }
    let list = state.join("sources.list");
    fs::write(&list, sources_line(suite, arch))?;
    let s = |p: &Path| p.display().to_string();
    let mut o = vec![
        format!("Dir::Etc::SourceList={}", s(&list)),
        format!("Dir::Etc::SourceParts={}", s(&empty)),
        format!("Dir::Etc::PreferencesParts={}", s(&empty)),
        "Dir::Etc::Preferences=/dev/null".to_string(),
        format!("Dir::State::Lists={}", s(&state.join("lists"))),
        format!("Dir::Cache={}", s(&state.join("cache"))),
        // Only the Packages index: no translations, no AppStream data.
        "Acquire::Languages=none".to_string(),
        "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".to_string(),
        "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false".to_string(),
        "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false".to_string(),
        // Our directories belong to root; apt's _apt user could not write them.
        "APT::Sandbox::User=root".to_string(),
    ];
    if arch.deb() != host_deb_arch() {
        o.push(format!("APT::Architectures::={}", arch.deb()));
    }
    Ok(o.into_iter().flat_map(|x| ["-o".to_string(), x]).collect())
}

/// The one line of our sources list for `suite`.
fn sources_line(suite: &str, arch: Arch) -> String {
    format!(
        "deb [arch={} signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {MIRROR} {suite} main\n",
        arch.deb(),
    )
}

fn host_deb_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "arm64",
        _ => "amd64",
    }
}

pub fn sha256(path: &Path) -> Result<String> {
    let o = Command::new("sha256sum")
        .arg(path)
        .output()
        .with_context(|| format!("running sha256sum {}", path.display()))?;
    ensure!(o.status.success(), "sha256sum {} failed", path.display());
    let text = String::from_utf8_lossy(&o.stdout);
    Ok(text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// The pinned `.deb` in `root/debs`, downloaded unless it is there with
/// the pinned hash.
fn download(root: &Path, k: &Kernel) -> Result<PathBuf> {
    let debs = root.join("debs");
    let deb = debs.join(k.deb_file());
    if deb.exists() && sha256(&deb)? == k.sha256 {
        return Ok(deb);
    }
    let opts = apt_options(root, k.suite, k.arch)?;
    eprintln!(
        "vm: downloading {}={} from {MIRROR} {}",
        k.package, k.version, k.suite
    );
    run_cmd(Command::new("apt-get").args(&opts).args(["update", "-q"]))?;
    let partial = debs.join("partial");
    if partial.exists() {
        fs::remove_dir_all(&partial)?;
    }
    fs::create_dir_all(&partial)?;
    let pkg = format!("{}:{}={}", k.package, k.arch.deb(), k.version);
    if !apt_download(&opts, &pkg, &partial)? {
        bail!(
            "{pkg} is no longer served by {} (it now has linux-image-{}: {}): update the pin in xtask/src/vm/kernels.rs",
            k.suite,
            flavour(k),
            served(&opts, k)
        );
    }
    let got = partial.join(k.deb_file());
    let sum = sha256(&got)?;
    ensure!(
        sum == k.sha256,
        "{} has SHA-256 {sum}, not the pinned {}: refusing to boot it (xtask/src/vm/kernels.rs)",
        got.display(),
        k.sha256
    );
    fs::rename(&got, &deb)?;
    fs::remove_dir_all(&partial)?;
    Ok(deb)
}

/// `apt-get download PKG` into `dir` with our apt state `opts`; whether
/// the mirror served it.
pub fn apt_download(opts: &[String], pkg: &str, dir: &Path) -> Result<bool> {
    Ok(Command::new("apt-get")
        .args(opts)
        .args(["download", "-q", pkg])
        .current_dir(dir)
        .status()
        .with_context(|| format!("running apt-get download {pkg}"))?
        .success())
}

/// The flavour's meta-package suffix: `amd64`, `arm64-16k`: the release
/// without its version and ABI (`6.12.95+deb12-arm64-16k`).
fn flavour(k: &Kernel) -> &'static str {
    let r = k.release();
    let arch = k.arch.deb();
    r.find(&format!("-{arch}")).map_or(r, |i| &r[i + 1..])
}

/// The versions of the flavour's meta-package the suite serves, for the
/// line that says a pin went stale.
fn served(opts: &[String], k: &Kernel) -> String {
    Command::new("apt-cache")
        .args(opts)
        .args([
            "madison",
            &format!("linux-image-{}:{}", flavour(k), k.arch.deb()),
        ])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split('|').nth(1))
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::kernels::find;

    #[test]
    fn every_system_rule_is_masked_but_the_default_names() {
        let sys: Vec<String> = [
            "50-udev-default.rules",
            "80-drivers.rules",
            "60-block.rules",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(masked(&sys), ["80-drivers.rules", "60-block.rules"]);
    }

    #[test]
    fn flavours_are_the_meta_packages() {
        assert_eq!(flavour(find("6.1", Arch::X86_64).unwrap()), "amd64");
        assert_eq!(flavour(find("6.12", Arch::X86_64).unwrap()), "amd64");
        assert_eq!(flavour(find("6.12-16k", Arch::Arm64).unwrap()), "arm64-16k");
    }

    #[test]
    fn the_sources_line_names_one_suite_signed_by_debian() {
        let l = {
            let k = find("5.10", Arch::X86_64).unwrap();
            sources_line(k.suite, k.arch)
        };
        assert_eq!(
            l,
            "deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
             http://deb.debian.org/debian bullseye main\n"
        );
    }
}
