//! `mpi-observer qmpi-flags`: the flags that build a QMPI tool, or a program
//! with one inside, with any supported `mpicc`:
//! `mpicc $(mpi-observer qmpi-flags) tool.c -shared -fPIC -o libtool.so`.
//!
//! They force-include `mpi_observer_qmpi.h` (the QMPI declarations and
//! procedure ids where the MPI has none, and the marker naming the MPI the
//! tool was built for) and link `libmpi_observer_qmpi.so`, whose inert
//! `QMPI_*` symbols the preloaded shim overrides. Both are found as
//! [`super::launcher::shim_path`] finds the shim: beside the executable (a
//! cargo build, where `cargo xtask build` copies the header into
//! `target/release/include/`), else in the install layout.

use std::path::{Path, PathBuf};

/// The header, as generated into `shim/include/` and installed.
pub const HEADER_FILE: &str = "mpi_observer_qmpi.h";
/// The stub library, as cargo builds it and as it is installed.
pub const STUBS_FILE: &str = "libmpi_observer_qmpi.so";

/// Why the flags cannot be printed.
#[derive(Debug, thiserror::Error)]
pub enum QmpiFlagsError {
    /// The path of the running executable cannot be read.
    #[error("cannot locate the running executable: {source}")]
    CurrentExe {
        /// What `/proc/self/exe` said.
        source: std::io::Error,
    },
    /// A file is neither beside the executable nor in the install layout.
    #[error(
        "{file} not found: looked for {} and {}; run `cargo xtask build`, or reinstall mpi-observer",
        beside.display(),
        installed.display()
    )]
    NotFound {
        /// The file looked for.
        file: &'static str,
        /// Where a cargo build puts it.
        beside: PathBuf,
        /// Where an install puts it.
        installed: PathBuf,
    },
    /// A directory the flags would name cannot be one word of a shell's
    /// `$(...)`.
    #[error(
        "{} holds whitespace or is not UTF-8, so `$(mpi-observer qmpi-flags)` would split it: install mpi-observer under a plain path",
        dir.display()
    )]
    UnusablePath {
        /// The directory.
        dir: PathBuf,
    },
}

/// Where the header and the stub library are.
#[derive(Debug, PartialEq, Eq)]
pub struct Locations {
    /// The directory holding [`HEADER_FILE`].
    pub include: PathBuf,
    /// The directory holding [`STUBS_FILE`].
    pub libdir: PathBuf,
}

/// The first of `beside` and `installed` that is a regular file, resolved.
fn find(
    file: &'static str,
    beside: PathBuf,
    installed: PathBuf,
) -> Result<PathBuf, QmpiFlagsError> {
    let found = [&beside, &installed]
        .into_iter()
        .filter(|p| p.is_file())
        .find_map(|p| p.canonicalize().ok());
    found.ok_or(QmpiFlagsError::NotFound {
        file,
        beside,
        installed,
    })
}

/// Finds both files from the directory of the executable: `include/` and the
/// library beside it, else `../share/mpi-observer/include/` and
/// `../lib/mpi-observer/`.
pub fn locate_from(exe_dir: &Path) -> Result<Locations, QmpiFlagsError> {
    let header = find(
        HEADER_FILE,
        exe_dir.join("include").join(HEADER_FILE),
        exe_dir
            .join("../share/mpi-observer/include")
            .join(HEADER_FILE),
    )?;
    let stubs = find(
        STUBS_FILE,
        exe_dir.join(STUBS_FILE),
        exe_dir.join("../lib/mpi-observer").join(STUBS_FILE),
    )?;
    let dir = |p: &Path| p.parent().unwrap_or(Path::new("/")).to_path_buf();
    Ok(Locations {
        include: dir(&header),
        libdir: dir(&stubs),
    })
}

/// One directory as a word of the flags.
fn word(dir: &Path) -> Result<&str, QmpiFlagsError> {
    dir.to_str()
        .filter(|s| !s.chars().any(char::is_whitespace))
        .ok_or_else(|| QmpiFlagsError::UnusablePath {
            dir: dir.to_path_buf(),
        })
}

/// The flags, on one line: the compiler's (`cflags`), the linker's
/// (`libs`), or both when neither is asked for alone.
pub fn flags(loc: &Locations, cflags: bool, libs: bool) -> Result<String, QmpiFlagsError> {
    let both = cflags == libs;
    let mut out = Vec::new();
    if cflags || both {
        out.push(format!("-I{} -include {HEADER_FILE}", word(&loc.include)?));
    }
    if libs || both {
        let lib = word(&loc.libdir)?;
        // Before the sources on the command line, as in `mpicc $(...)
        // tool.c`: a linker that defaults to --as-needed would drop the
        // library before seeing who needs it.
        out.push(format!(
            "-L{lib} -Wl,-rpath,{lib} -Wl,--push-state,--no-as-needed -lmpi_observer_qmpi -Wl,--pop-state"
        ));
    }
    Ok(out.join(" "))
}

/// `mpi-observer qmpi-flags [--cflags] [--libs]`: the line to print.
pub fn run(cflags: bool, libs: bool) -> Result<String, QmpiFlagsError> {
    let exe = std::env::current_exe().map_err(|source| QmpiFlagsError::CurrentExe { source })?;
    let loc = locate_from(exe.parent().unwrap_or(Path::new("/")))?;
    flags(&loc, cflags, libs)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    /// A fresh directory with `files` (relative paths) created empty.
    fn tree(name: &str, files: &[&str]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("qmpi-flags-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for f in files {
            let p = root.join(f);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, "").unwrap();
        }
        fs::create_dir_all(root.join("bin")).unwrap();
        root.canonicalize().unwrap()
    }

    #[test]
    fn finds_a_cargo_build_and_an_install() {
        let cargo = tree(
            "cargo",
            &[
                "bin/include/mpi_observer_qmpi.h",
                "bin/libmpi_observer_qmpi.so",
            ],
        );
        let loc = locate_from(&cargo.join("bin")).unwrap();
        assert_eq!(loc.include, cargo.join("bin/include"));
        assert_eq!(loc.libdir, cargo.join("bin"));
        let line = flags(&loc, false, false).unwrap();
        let (i, l) = (cargo.join("bin/include"), cargo.join("bin"));
        assert_eq!(
            line,
            format!(
                "-I{} -include mpi_observer_qmpi.h -L{} -Wl,-rpath,{} \
                 -Wl,--push-state,--no-as-needed -lmpi_observer_qmpi -Wl,--pop-state",
                i.display(),
                l.display(),
                l.display()
            )
        );
        assert_eq!(
            flags(&loc, true, false).unwrap(),
            format!("-I{} -include mpi_observer_qmpi.h", i.display())
        );
        assert!(flags(&loc, false, true).unwrap().starts_with("-L"));

        let install = tree(
            "install",
            &[
                "share/mpi-observer/include/mpi_observer_qmpi.h",
                "lib/mpi-observer/libmpi_observer_qmpi.so",
            ],
        );
        let loc = locate_from(&install.join("bin")).unwrap();
        assert_eq!(loc.include, install.join("share/mpi-observer/include"));
        assert_eq!(loc.libdir, install.join("lib/mpi-observer"));
        let _ = fs::remove_dir_all(cargo);
        let _ = fs::remove_dir_all(install);
    }

    #[test]
    fn a_missing_file_names_where_it_looked() {
        let root = tree("missing", &["bin/include/mpi_observer_qmpi.h"]);
        let e = locate_from(&root.join("bin")).unwrap_err().to_string();
        assert!(
            e.starts_with("libmpi_observer_qmpi.so not found: looked for "),
            "{e}"
        );
        assert!(
            e.contains(
                &root
                    .join("bin/libmpi_observer_qmpi.so")
                    .display()
                    .to_string()
            )
        );
        assert!(
            e.contains("lib/mpi-observer/libmpi_observer_qmpi.so"),
            "{e}"
        );
        // A directory where the header should be is not the header.
        let dir = tree("dir", &["bin/libmpi_observer_qmpi.so"]);
        fs::create_dir_all(dir.join("bin/include/mpi_observer_qmpi.h")).unwrap();
        let e = locate_from(&dir.join("bin")).unwrap_err().to_string();
        assert!(e.starts_with("mpi_observer_qmpi.h not found"), "{e}");
        let _ = fs::remove_dir_all(root);
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn a_path_with_a_space_is_refused() {
        let loc = Locations {
            include: PathBuf::from("/opt/my tools/include"),
            libdir: PathBuf::from("/opt/lib"),
        };
        let e = flags(&loc, false, false).unwrap_err().to_string();
        assert!(
            e.starts_with("/opt/my tools/include holds whitespace"),
            "{e}"
        );
        assert!(flags(&loc, false, true).is_ok(), "only the libs asked for");
    }
}
