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
/// `mrs x0, tpidr_el0`, written over MPI_Send's first word in a copy of
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
    data[at..at + 4].copy_from_slice(&0xd53b_d040_u32.to_le_bytes());
    let dir = target_dir().join(format!("sites-refused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let patched = dir.join("libmpich.so.12");
    std::fs::write(&patched, &data).unwrap();
    let s = sites(&patched);
    let line = &s.iter().find(|x| x.name == "MPI_Send").unwrap().line;
    assert!(
        line.contains(" refused ")
            && line.ends_with(
                "(not probed: mrs (a system register read, e.g. TLS through tpidr_el0))"
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
