//! `cargo xtask layout`: holds the workspace to its layout rules
//! (docs/architecture.md, "The rule"), one `file:line: …` line per offence.
//!
//! - [`rule`]: observer/src's folders depend one way.
//! - [`circles`]: in every crate, the modules inside a folder (the crate's
//!   top included) do not import each other in circles.
//! - [`length`]: no hand-written code file is over 1,000 lines, outside
//!   tests.
//!
//! All three read text ([`paths`] reads the module paths a file names)
//! rather than compiling anything, so the check runs in a moment and
//! before the build: it is the first step of `cargo xtask test`.

mod circles;
mod length;
mod paths;
mod rule;

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

/// Checks the workspace under `root`; fails with every offence printed.
pub fn run(root: &Path) -> Result<()> {
    let offences = check(root)?;
    for o in &offences {
        eprintln!("{o}");
    }
    if !offences.is_empty() {
        bail!(
            "the workspace breaks its layout rules {} times (docs/architecture.md, \"The rule\")",
            offences.len()
        );
    }
    eprintln!(
        "layout: observer/src follows {}; no crate's modules import each other in circles; no hand-written code file is over {} lines",
        rule::RULE,
        length::MAX_LINES
    );
    Ok(())
}

/// Every offence in the workspace at `root`, one line each: observer/src's
/// rule, then each crate's circles, then the files too long.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let mut out = rule::check(&root.join("observer/src"))?;
    for krate in crates(root)? {
        out.extend(circles::check(root, &krate)?);
    }
    out.extend(length::check(root)?);
    Ok(out)
}

/// The crates of the workspace: the folders at `root` holding a Cargo.toml
/// and a src/, by name.
fn crates(root: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for e in fs::read_dir(root).with_context(|| format!("reading {}", root.display()))? {
        let p = e?.path();
        if p.join("Cargo.toml").is_file() && p.join("src").is_dir() {
            out.push(
                p.file_name()
                    .expect("a name")
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    out.sort();
    Ok(out)
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let p = e?.path();
            if p.is_dir() {
                walk(&p, out)?;
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, &mut out)?;
    out.sort();
    Ok(out)
}

/// The module path of the file at `rel` under a crate's src/:
/// collect/registry.rs is collect::registry, client/top/mod.rs is
/// client::top, lib.rs and main.rs are the crate root (empty).
fn module_of(rel: &Path) -> Vec<String> {
    let mut module: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = module.pop().expect("a file name");
    let root_file = module.is_empty() && (last == "lib.rs" || last == "main.rs");
    if last != "mod.rs" && !root_file {
        module.push(last.strip_suffix(".rs").unwrap_or(&last).to_string());
    }
    module
}

/// A tree of files made for a test, removed when dropped.
#[cfg(test)]
struct Scratch(PathBuf);

#[cfg(test)]
impl Scratch {
    /// A fresh tree named after the test, holding `files` (path, text).
    fn new(name: &str, files: &[(&str, String)]) -> Scratch {
        let dir = std::env::temp_dir().join(format!("xtask-layout-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for (path, text) in files {
            let p = dir.join(path);
            fs::create_dir_all(p.parent().expect("a parent")).expect("scratch folder");
            fs::write(&p, text).expect("scratch file");
        }
        Scratch(dir)
    }
}

#[cfg(test)]
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_paths_follow_the_files() {
        let m = |p: &str| module_of(Path::new(p)).join("::");
        assert_eq!(m("lib.rs"), "");
        assert_eq!(m("main.rs"), "");
        assert_eq!(m("bind.rs"), "bind");
        assert_eq!(m("client/top/mod.rs"), "client::top");
        assert_eq!(m("attach/probes/read.rs"), "attach::probes::read");
        assert_eq!(m("a/lib.rs"), "a::lib");
    }

    #[test]
    fn every_check_reports_through_one_list() {
        let long = "fn f() {}\n".repeat(length::MAX_LINES + 1);
        let t = Scratch::new(
            "all",
            &[
                ("observer/Cargo.toml", String::new()),
                ("observer/src/lib.rs", "mod os;\nmod attach;\n".into()),
                ("observer/src/os/mod.rs", "use crate::attach::x;\n".into()),
                ("observer/src/attach/mod.rs", String::new()),
                ("tool/Cargo.toml", String::new()),
                ("tool/src/main.rs", String::new()),
                ("tool/src/a.rs", "use crate::b::f;\n".into()),
                ("tool/src/b.rs", format!("use super::a::g;\n{long}")),
            ],
        );
        let out = check(&t.0).expect("scratch readable");
        assert_eq!(out.len(), 3, "{out:#?}");
        assert!(
            out[0].starts_with("observer/src/os/mod.rs:1: `os` may not use `attach::x`"),
            "{}",
            out[0]
        );
        assert!(out[1].starts_with("tool/src/a.rs:1: "), "{}", out[1]);
        assert!(out[2].starts_with("tool/src/b.rs:1001: "), "{}", out[2]);
    }
}
