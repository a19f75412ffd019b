//! The arm64 package held to the amd64 one, read from the two `.deb`s as
//! dpkg sees them: it says Architecture arm64, and the same Depends; it
//! has every entry the amd64 one has, with the same mode, the Slurm
//! plugin under the aarch64 multiarch directory instead of the x86-64 one,
//! and nothing else; its ELF files are the amd64 package's, each built for
//! AArch64; and the daemon embeds the eBPF programs built for aarch64's
//! registers.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, ensure};

use crate::setup::{run_cmd, target_dir};

/// `e_machine` of x86-64 and of AArch64 (the ELF specification's numbers).
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;
/// `e_machine` of an eBPF object.
const EM_BPF: u16 = 247;

/// What the two packages' Debian multiarch directories are; every other
/// path is the same in both.
const AMD64_LIBDIR: &str = "./usr/lib/x86_64-linux-gnu/";
const ARM64_LIBDIR: &str = "./usr/lib/aarch64-linux-gnu/";

/// The files that must be ELF, by their arm64 path: the daemon, the shim,
/// the QMPI stubs and the SPANK plugin.
const ELF_FILES: [&str; 4] = [
    "./usr/bin/mpi-observer",
    "./usr/lib/mpi-observer/libmpi_observer_shim.so",
    "./usr/lib/mpi-observer/libmpi_observer_qmpi.so",
    "./usr/lib/aarch64-linux-gnu/slurm-wlm/spank_mpi_observer.so",
];

/// A type the aarch64 eBPF programs read their registers through
/// (observer-ebpf/src/arch/aarch64.rs), named in the object's BTF; the
/// x86-64 programs read a `pt_regs`, and their object has no such name.
const AARCH64_REGS: &[u8] = b"user_pt_regs";

/// Fails, saying every difference, unless `arm64` is `amd64` built for
/// arm64.
pub fn same_but_arm64(amd64: &Path, arm64: &Path) -> Result<()> {
    for (deb, arch) in [(amd64, "amd64"), (arm64, "arm64")] {
        let got = field(deb, "Architecture")?;
        ensure!(
            got == arch,
            "{} says Architecture {got}, not {arch}",
            deb.display()
        );
        let name = field(deb, "Package")?;
        ensure!(
            name == "mpi-observer",
            "{} is package {name}",
            deb.display()
        );
    }
    // The arm64 variant states its Depends (observer/Cargo.toml says why).
    let (want, got) = (field(amd64, "Depends")?, field(arm64, "Depends")?);
    ensure!(
        want == got,
        "{} depends on {got:?}, the amd64 package on {want:?}: update the arm64 variant's depends in observer/Cargo.toml",
        arm64.display()
    );
    let want: BTreeSet<Entry> = listing(amd64)?.into_iter().map(Entry::into_arm64).collect();
    let got: BTreeSet<Entry> = listing(arm64)?.into_iter().collect();
    let missing: Vec<String> = want.difference(&got).map(Entry::to_string).collect();
    let extra: Vec<String> = got.difference(&want).map(Entry::to_string).collect();
    ensure!(
        missing.is_empty() && extra.is_empty(),
        "{} is not {} for arm64:\nmissing: {missing:#?}\nextra: {extra:#?}",
        arm64.display(),
        amd64.display()
    );
    let dir = target_dir().join("debian/check");
    let amd64_elves = elves(amd64, &dir.join("amd64"))?;
    let arm64_elves = elves(arm64, &dir.join("arm64"))?;
    let names = |v: &[(String, u16)]| v.iter().map(|(p, _)| p.clone()).collect::<BTreeSet<_>>();
    let mapped: BTreeSet<String> = names(&amd64_elves).iter().map(|p| to_arm64(p)).collect();
    ensure!(
        mapped == names(&arm64_elves),
        "the ELF files differ: amd64 has {mapped:?}, arm64 {:?}",
        names(&arm64_elves)
    );
    for f in ELF_FILES {
        ensure!(
            mapped.contains(f),
            "{f} is not an ELF file in {}",
            arm64.display()
        );
    }
    for (elves, machine, deb) in [
        (&amd64_elves, EM_X86_64, amd64),
        (&arm64_elves, EM_AARCH64, arm64),
    ] {
        for (p, m) in elves {
            ensure!(
                *m == machine,
                "{p} in {} is for machine {m}, not {machine}",
                deb.display()
            );
        }
    }
    // The name tells the two apart only if the amd64 object lacks it.
    for (arch, aarch64) in [("amd64", false), ("arm64", true)] {
        let daemon = dir.join(arch).join(ELF_FILES[0]);
        let bytes = fs::read(&daemon).with_context(|| format!("reading {}", daemon.display()))?;
        let bpf = embedded_bpf(&bytes)
            .with_context(|| format!("{} embeds no eBPF object", daemon.display()))?;
        ensure!(
            contains(bpf, AARCH64_REGS) == aarch64,
            "the eBPF object in {} {} `user_pt_regs`: not the {arch} programs",
            daemon.display(),
            if aarch64 { "does not name" } else { "names" }
        );
    }
    fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    eprintln!(
        "package: {} is {} for arm64: {} entries, {} AArch64 ELF files, the aarch64 eBPF programs",
        arm64.display(),
        amd64.display(),
        got.len(),
        arm64_elves.len()
    );
    Ok(())
}

/// A control field of `deb` (`dpkg-deb -f`).
fn field(deb: &Path, name: &str) -> Result<String> {
    let o = Command::new("dpkg-deb")
        .arg("-f")
        .arg(deb)
        .arg(name)
        .output()
        .context("running dpkg-deb -f")?;
    ensure!(
        o.status.success(),
        "dpkg-deb -f {} {name} failed",
        deb.display()
    );
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// One entry of `dpkg-deb -c`: its mode string and its path (with
/// ` -> target` for a symbolic link); sizes, owners and dates left out.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    mode: String,
    path: String,
}

impl Entry {
    fn into_arm64(self) -> Entry {
        Entry {
            path: to_arm64(&self.path),
            ..self
        }
    }
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.mode, self.path)
    }
}

/// An amd64 package's path where the arm64 package has it.
fn to_arm64(path: &str) -> String {
    match path.strip_prefix(AMD64_LIBDIR) {
        Some(rest) => format!("{ARM64_LIBDIR}{rest}"),
        None => path.to_string(),
    }
}

fn listing(deb: &Path) -> Result<Vec<Entry>> {
    let o = Command::new("dpkg-deb")
        .arg("-c")
        .arg(deb)
        .output()
        .context("running dpkg-deb -c")?;
    ensure!(o.status.success(), "dpkg-deb -c {} failed", deb.display());
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| parse_entry(l).with_context(|| format!("dpkg-deb -c {}: {l:?}", deb.display())))
        .collect()
}

/// `-rw-r--r-- 0/0  2137 2026-11-27 00:00 ./etc/default/mpi-observer`:
/// five fields, then the path, which may hold spaces.
fn parse_entry(line: &str) -> Option<Entry> {
    let mut rest = line.trim_start();
    let mut fields = Vec::new();
    for _ in 0..5 {
        let end = rest.find(char::is_whitespace)?;
        fields.push(&rest[..end]);
        rest = rest[end..].trim_start();
    }
    (!rest.is_empty()).then(|| Entry {
        mode: fields[0].to_string(),
        path: rest.to_string(),
    })
}

/// Unpacks `deb` into `dir` (emptied first) and returns each ELF file in
/// it, by its path in the package (`./usr/...`), with its `e_machine`.
fn elves(deb: &Path, dir: &Path) -> Result<Vec<(String, u16)>> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    run_cmd(Command::new("dpkg-deb").arg("-x").arg(deb).arg(dir))?;
    let mut out = Vec::new();
    let mut todo: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                let head = read_head(&e.path())?;
                if let Some(m) = machine(&head) {
                    let rel = e.path();
                    let rel = rel.strip_prefix(dir).unwrap_or(&rel);
                    out.push((format!("./{}", rel.display()), m));
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The first 64 bytes of a file (an ELF64 header's size), fewer if it is
/// shorter.
fn read_head(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read as _;
    let mut head = Vec::with_capacity(64);
    fs::File::open(path)
        .and_then(|f| f.take(64).read_to_end(&mut head))
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(head)
}

/// `e_machine` of a little-endian 64-bit ELF header, `None` if `head` is
/// not one.
fn machine(head: &[u8]) -> Option<u16> {
    // e_ident: the magic, EI_CLASS 2 (64-bit), EI_DATA 1 (little-endian).
    if head.len() < 20 || !head.starts_with(b"\x7fELF") || head[4] != 2 || head[5] != 1 {
        return None;
    }
    Some(u16::from_le_bytes([head[18], head[19]]))
}

/// The first eBPF object inside `bytes`: from its ELF header to the end
/// of its section header table (where the BPF linker puts it, last).
fn embedded_bpf(bytes: &[u8]) -> Option<&[u8]> {
    let mut from = 0;
    while let Some(i) = find(&bytes[from..], b"\x7fELF").map(|i| i + from) {
        let obj = &bytes[i..];
        if machine(obj) == Some(EM_BPF) && obj.len() >= 64 {
            let u64_at =
                |o: usize| u64::from_le_bytes(obj[o..o + 8].try_into().unwrap_or_default());
            let u16_at = |o: usize| u64::from(u16::from_le_bytes([obj[o], obj[o + 1]]));
            // e_shoff + e_shnum * e_shentsize.
            let end = usize::try_from(u64_at(0x28) + u16_at(0x3c) * u16_at(0x3a)).ok()?;
            return obj.get(..end);
        }
        from = i + 1;
    }
    None
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    find(hay, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_lines_keep_mode_and_path() {
        let e = parse_entry(
            "-rw-r--r-- 0/0            2137 2026-11-27 00:00 ./etc/default/mpi-observer",
        )
        .unwrap();
        assert_eq!(e.mode, "-rw-r--r--");
        assert_eq!(e.path, "./etc/default/mpi-observer");
        let l = parse_entry("lrwxrwxrwx 0/0 0 2026-11-27 00:00 ./a b -> c").unwrap();
        assert_eq!(l.path, "./a b -> c");
        assert_eq!(parse_entry("drwxr-xr-x 0/0 0 2026-11-27"), None);
    }

    #[test]
    fn only_the_multiarch_directory_moves() {
        assert_eq!(
            to_arm64("./usr/lib/x86_64-linux-gnu/slurm-wlm/spank_mpi_observer.so"),
            ELF_FILES[3]
        );
        assert_eq!(to_arm64(ELF_FILES[1]), ELF_FILES[1]);
        assert_eq!(
            to_arm64("./usr/share/x86_64-linux-gnu/x"),
            "./usr/share/x86_64-linux-gnu/x"
        );
    }

    #[test]
    fn machines_are_read_from_little_endian_elf64_headers() {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        h[18..20].copy_from_slice(&EM_AARCH64.to_le_bytes());
        assert_eq!(machine(&h), Some(183));
        h[4] = 1;
        assert_eq!(machine(&h), None, "32-bit");
        assert_eq!(machine(b"#!/bin/sh\n"), None);
    }

    #[test]
    fn the_embedded_object_ends_with_its_section_headers() {
        let mut obj = vec![0u8; 64];
        obj[..4].copy_from_slice(b"\x7fELF");
        obj[4] = 2;
        obj[5] = 1;
        obj[18..20].copy_from_slice(&EM_BPF.to_le_bytes());
        obj.extend_from_slice(b"user_pt_regs");
        // One section header of 64 bytes at offset 76.
        obj[0x28..0x30].copy_from_slice(&76u64.to_le_bytes());
        obj[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        obj[0x3c..0x3e].copy_from_slice(&1u16.to_le_bytes());
        obj.extend_from_slice(&[0; 64]);
        let mut host = b"\x7fELF not this one".to_vec();
        host.extend_from_slice(&obj);
        host.extend_from_slice(b"trailing");
        assert_eq!(embedded_bpf(&host), Some(&obj[..]));
        assert!(contains(embedded_bpf(&host).unwrap(), AARCH64_REGS));
    }
}
