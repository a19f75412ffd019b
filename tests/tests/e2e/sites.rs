//! `mpi-observer sites`: each library is decoded by its own instruction set
//! (its ELF header's machine), whatever this machine is. Debian's arm64
//! libraries come from `cargo xtask test` (xtask/src/vm/foreign.rs).

use std::{collections::BTreeMap, path::Path, process::Command};

use e2e::{FOREIGN_ARM64, in_ci, observer_bin, target_dir};

/// One line of the listing: name, file offset, class, and the rest.
struct Site {
    name: String,
    offset: u64,
    class: String,
    line: String,
}

fn sites(lib: &Path) -> Vec<Site> {
    let o = Command::new(observer_bin())
        .arg("sites")
        .arg(lib)
        .output()
        .expect("mpi-observer sites");
    assert!(
        o.status.success(),
        "mpi-observer sites {}: {}",
        lib.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // name, offset, 16 bytes, class, default-or-dash[, why]
            assert!(f.len() >= 20, "{l}");
            Site {
                name: f[0].to_string(),
                offset: u64::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap(),
                class: f[18].to_string(),
                line: l.to_string(),
            }
        })
        .collect()
}

fn classes(s: &[Site]) -> BTreeMap<&str, usize> {
    let mut m = BTreeMap::new();
    for x in s {
        *m.entry(x.class.as_str()).or_default() += 1;
    }
    m
}

fn has_core(s: &[Site], lib: &Path) {
    for f in [
        "MPI_Send",
        "MPI_Recv",
        "MPI_Barrier",
        "MPI_Allreduce",
        "MPI_Init",
    ] {
        assert!(s.iter().any(|x| x.name == f), "{f} in {}", lib.display());
    }
}

/// The directory of Debian's arm64 MPI libraries, if unpacked (a failure
/// under `CI=true` if not; otherwise the test skips, saying why).
fn arm64_libs() -> Option<std::path::PathBuf> {
    let dir = target_dir()
        .join(FOREIGN_ARM64)
        .join("usr/lib/aarch64-linux-gnu");
    if dir.is_dir() {
        return Some(dir);
    }
    assert!(
        !in_ci(),
        "CI=true and {} is missing: `cargo xtask test` unpacks it (xtask/src/vm/foreign.rs)",
        dir.display()
    );
    eprintln!("SKIPPED: needs {}", dir.display());
    None
}

/// Debian's arm64 Open MPI and MPICH, read on x86-64: every site on a
/// 4-byte instruction boundary, never moved by x86's prologue rule, each
/// classed by the arm64 kernel's rules (their prologues, `stp x29, x30`
/// and `sub sp`, are single-stepped; tail calls `b` are emulated).
#[test]
fn arm64_libraries_are_decoded_as_arm64() {
    let Some(dir) = arm64_libs() else { return };
    for name in ["libmpi.so.40", "libmpich.so.12"] {
        let lib = dir.join(name);
        let s = sites(&lib);
        has_core(&s, &lib);
        let c = classes(&s);
        eprintln!("{name} (arm64): {c:?}");
        for x in &s {
            assert_eq!(x.offset % 4, 0, "{}", x.line);
            assert!(
                matches!(x.class.as_str(), "emulated" | "single-stepped"),
                "{}",
                x.line
            );
            // The first word is what is probed: the x86 rule must not
            // have moved the probe.
        }
        assert!(c["single-stepped"] > 300, "{c:?}");
        assert!(c.get("emulated").copied().unwrap_or(0) > 0, "{c:?}");
        let send = s.iter().find(|x| x.name == "MPI_Send").unwrap();
        assert_eq!(send.class, "single-stepped", "{}", send.line);
    }
}

/// The host's own libraries are decoded as x86-64: some sites are moved
/// past a RIP-relative load onto an emulated push (Open MPI's `MPI_Test`),
/// and nothing is refused or unknown.
#[test]
fn x86_64_libraries_keep_their_placement() {
    for lib in [
        "/usr/lib/x86_64-linux-gnu/libmpi.so.40",
        "/usr/lib/x86_64-linux-gnu/libmpich.so.12",
    ] {
        let lib = Path::new(lib);
        if !lib.exists() {
            assert!(
                !in_ci(),
                "CI=true and {} is missing: cargo xtask setup installs it",
                lib.display()
            );
            eprintln!("SKIPPED: needs {}", lib.display());
            return;
        }
        let s = sites(lib);
        has_core(&s, lib);
        let c = classes(&s);
        eprintln!("{} (x86-64): {c:?}", lib.display());
        assert!(
            s.iter().all(|x| x.class == "emulated"
                || x.class == "single-stepped"
                || x.class == "emulated(+7)"),
            "{c:?}"
        );
        assert!(c.get("emulated(+7)").copied().unwrap_or(0) > 0, "{c:?}");
    }
}

/// A function whose first instruction the arm64 kernel refuses (here
/// `ldr x16, .+8`, a literal load, written over MPI_Send's first word in a copy of
/// Debian's arm64 MPICH) is listed as refused, with why: one such site
/// would fail a whole uprobe_multi link, so it is not probed (that it
/// leaves the probed set is the unit test
/// `symbols::tests::arm64_sites_and_a_refused_one`).
#[test]
fn a_refused_arm64_site_is_said_and_not_probed() {
    let Some(dir) = arm64_libs() else { return };
    let lib = dir.join("libmpich.so.12");
    let send = sites(&lib)
        .into_iter()
        .find(|x| x.name == "MPI_Send")
        .unwrap();
    let mut data = std::fs::read(&lib).unwrap();
    let at = usize::try_from(send.offset).unwrap();
    data[at..at + 4].copy_from_slice(&0x5800_0050_u32.to_le_bytes());
    let dir = target_dir().join(format!("sites-refused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let patched = dir.join("libmpich.so.12");
    std::fs::write(&patched, &data).unwrap();
    let s = sites(&patched);
    let line = &s.iter().find(|x| x.name == "MPI_Send").unwrap().line;
    assert!(
        line.contains(" refused ")
            && line.ends_with(
                "(not probed: ldr (literal), no longer simulated for uprobes (CVE-2024-50099))"
            ),
        "{line}"
    );
    // Everything else is as in the original.
    assert_eq!(
        s.iter().filter(|x| x.class == "refused").count(),
        1,
        "{:?}",
        classes(&s)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `sites --measure` on this machine's own Open MPI and MPICH, on the
/// running kernel (the host, and every guest kernel of `cargo xtask test`,
/// x86-64 and arm64): each class of first instruction is probed in a child
/// and the kernel's choice read back (the child's `[uprobes]` area for a
/// step, the failed open for a refusal), then every site of the library is
/// given its class's measured answer.
///
/// Every site must have one (no library prologue outside the classes), and
/// the classes that every kernel treats one way must come out that way:
/// so a measurement that always said "emulated", or a probe that was never
/// hit, fails here. Where a kernel differs from the rules (x86-64's 5.10
/// and 6.1 single-step the multi-byte `nop`), the class's line says so.
#[test]
fn the_running_kernel_is_measured_for_every_site() {
    if !e2e::require(&[e2e::Need::Root]) {
        return;
    }
    let dir = Path::new("/usr/lib").join(e2e::package::multiarch());
    for name in ["libmpi.so.40", "libmpich.so.12"] {
        let lib = dir.join(name);
        if !lib.exists() {
            assert!(!in_ci(), "CI=true and {} is missing", lib.display());
            eprintln!("SKIPPED: needs {}", lib.display());
            return;
        }
        let o = Command::new(observer_bin())
            .args(["sites", "--measure"])
            .arg(&lib)
            .output()
            .expect("mpi-observer sites --measure");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{}: {err}", lib.display());
        eprintln!("{} on {}:\n{err}", lib.display(), release());
        // The classes, as measured: "  <name>  <outcome>[ (...)]".
        let measured: BTreeMap<String, String> = err
            .lines()
            .skip_while(|l| !l.starts_with("measured on this kernel"))
            .skip(1)
            .filter_map(|l| {
                let l = l.trim();
                let outcome = ["single-stepped", "emulated", "refused"]
                    .into_iter()
                    .find(|w| l.contains(&format!(" {w}")))?;
                let name = l[..l.find(&format!(" {outcome}"))?].trim().to_string();
                Some((name, outcome.to_string()))
            })
            .collect();
        let expect: &[(&str, &str)] = match std::env::consts::ARCH {
            // Emulated since before 5.10; stepped everywhere.
            "x86_64" => &[
                ("push r64", "emulated"),
                ("jmp rel32", "emulated"),
                ("endbr64", "single-stepped"),
                ("ALU r64, imm8", "single-stepped"),
            ],
            // Simulated branches; a prologue no kernel simulates; the
            // literal load the CVE-2024-50099 fix stopped simulating.
            "aarch64" => &[
                ("b", "emulated"),
                ("ret", "emulated"),
                ("sub sp, sp, #n", "single-stepped"),
                ("ldr (literal)", "refused"),
            ],
            other => panic!("no expectations for {other}"),
        };
        for (class, outcome) in expect {
            assert_eq!(
                measured.get(*class).map(String::as_str),
                Some(*outcome),
                "{class} on {}: {err}",
                release()
            );
        }
        let out = String::from_utf8_lossy(&o.stdout);
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for l in out.lines() {
            let m = l
                .split_whitespace()
                .find_map(|f| f.strip_prefix("measured:"))
                .unwrap_or_else(|| panic!("no measured column: {l}"));
            assert_ne!(m, "-", "a site outside every class: {l}");
            *counts.entry(m).or_default() += 1;
        }
        eprintln!("{name}: sites by measured class: {counts:?}");
        has_core(&sites(&lib), &lib);
        assert!(counts.values().sum::<usize>() > 300, "{counts:?}");
    }
}

/// The kernel's release, for the messages.
fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Without the right to open a uprobe, `sites --measure` fails in one line
/// that says so, and lists nothing.
#[test]
fn measuring_without_root_says_it_needs_root() {
    if !e2e::require(&[e2e::Need::Root]) {
        return;
    }
    let lib = Path::new("/usr/lib")
        .join(e2e::package::multiarch())
        .join("libmpi.so.40");
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(observer_bin())
        .args(["sites", "--measure"])
        .arg(&lib)
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(o.stdout.is_empty());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("measuring needs root"), "{err}");
}
