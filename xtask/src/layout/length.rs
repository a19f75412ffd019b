//! No hand-written code file over [`MAX_LINES`] lines, outside tests.
//!
//! A file that long holds more than one job: split it along its seams.
//! Tests (anything under a folder named `tests`: the e2e crate, a crate's
//! integration tests) may be longer, and so may generated files, whose
//! first lines say "generated" and "do not edit" (`cargo xtask codegen`'s
//! header). Code is Rust, C and its headers, Python, shell, Fortran, and
//! files without an extension that start with `#!`; documents and data
//! (Markdown, JSON, the MPI spec, dashboards) are not held to it. Build
//! output (`target/`) and hidden folders (`.git`) are not read.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

/// The most lines a hand-written code file may have.
pub const MAX_LINES: usize = 1000;
/// The extensions of code files.
const CODE: [&str; 6] = ["rs", "c", "h", "py", "sh", "f90"];
/// How many first lines may carry the generated-file marker.
const HEAD_LINES: usize = 5;

/// Every hand-written code file under `root` (outside tests) over
/// [`MAX_LINES`], one line each, at its first line too many.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    walk(root, root, &mut files)?;
    files.sort();
    let mut out = Vec::new();
    for rel in &files {
        let ext = rel.extension().map(|e| e.to_string_lossy().into_owned());
        if ext.as_deref().is_some_and(|e| !CODE.contains(&e)) {
            continue;
        }
        let path = root.join(rel);
        let text = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let lines = line_count(&text);
        if lines <= MAX_LINES || (ext.is_none() && !text.starts_with(b"#!")) || is_generated(&text)
        {
            continue;
        }
        out.push(format!(
            "{}:{}: {lines} lines, more than the {MAX_LINES} a hand-written file may have: split it along its seams, one job a file (docs/architecture.md, \"The rule\")",
            rel.display(),
            MAX_LINES + 1
        ));
    }
    Ok(out)
}

/// Every file under `dir`, relative to `root`, but those in `target/`,
/// hidden folders and test folders. Symbolic links are not followed.
fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        let ty = e.file_type()?;
        if ty.is_dir() {
            if name != "target" && name != "tests" && !name.starts_with('.') {
                walk(root, &e.path(), out)?;
            }
        } else if ty.is_file() {
            out.push(
                e.path()
                    .strip_prefix(root)
                    .expect("under root")
                    .to_path_buf(),
            );
        }
    }
    Ok(())
}

/// Lines as `wc -l` counts them, plus an unterminated last one.
fn line_count(text: &[u8]) -> usize {
    let newlines = text.iter().filter(|&&c| c == b'\n').count();
    newlines + usize::from(text.last().is_some_and(|&c| c != b'\n'))
}

/// Whether the first lines of `text` mark it generated: "generated" and
/// "do not edit", in any case.
fn is_generated(text: &[u8]) -> bool {
    let head: Vec<u8> = text
        .split(|&c| c == b'\n')
        .take(HEAD_LINES)
        .flat_map(|l| l.iter().chain(b" "))
        .map(u8::to_ascii_lowercase)
        .collect();
    let has = |s: &[u8]| head.windows(s.len()).any(|w| w == s);
    has(b"generated") && has(b"do not edit")
}

#[cfg(test)]
mod tests {
    use super::{super::Scratch, *};

    fn lines(n: usize) -> String {
        "x\n".repeat(n)
    }

    #[test]
    fn a_long_hand_written_file_is_one_line_each() {
        let t = Scratch::new(
            "length",
            &[
                ("a/src/long.rs", lines(MAX_LINES + 1)),
                ("a/src/just.rs", lines(MAX_LINES)),
                // The last line need not end in a newline to count.
                ("b/x.c", format!("{}x", lines(MAX_LINES))),
                ("b/script", format!("#!/bin/sh\n{}", lines(MAX_LINES))),
                ("b/data", lines(2 * MAX_LINES)),
                ("README.md", lines(2 * MAX_LINES)),
            ],
        );
        let out = check(&t.0).expect("scratch readable");
        assert_eq!(
            out,
            [
                "a/src/long.rs:1001: 1001 lines, more than the 1000 a hand-written file may have: split it along its seams, one job a file (docs/architecture.md, \"The rule\")",
                "b/script:1001: 1001 lines, more than the 1000 a hand-written file may have: split it along its seams, one job a file (docs/architecture.md, \"The rule\")",
                "b/x.c:1001: 1001 lines, more than the 1000 a hand-written file may have: split it along its seams, one job a file (docs/architecture.md, \"The rule\")",
            ]
        );
    }

    #[test]
    fn generated_files_tests_and_build_output_are_exempt() {
        let long = lines(2 * MAX_LINES);
        let t = Scratch::new(
            "exempt",
            &[
                (
                    "s/src/generated/next.rs",
                    format!(
                        "// @generated by `cargo xtask codegen` from the spec\n// (FNV-1a 0x1). Do not edit.\n{long}"
                    ),
                ),
                (
                    "s/include/q.h",
                    format!(
                        "/* Generated by hand? No: GENERATED by codegen. Do Not Edit. */\n{long}"
                    ),
                ),
                ("tests/src/lib.rs", long.clone()),
                ("o/tests/fuzz.rs", long.clone()),
                ("target/release/build/x.rs", long.clone()),
                (".git/x.rs", long.clone()),
                // Saying "generated" without "do not edit" is not the marker.
                (
                    "s/src/codegen.rs",
                    format!("//! Writes the generated files.\n{long}"),
                ),
            ],
        );
        let out = check(&t.0).expect("scratch readable");
        assert_eq!(out.len(), 1, "{out:#?}");
        assert!(
            out[0].starts_with("s/src/codegen.rs:1001: 2001 lines"),
            "{}",
            out[0]
        );
    }
}
