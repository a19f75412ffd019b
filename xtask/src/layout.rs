//! `cargo xtask layout`: holds observer/src to its dependency rule
//! (docs/architecture.md), one line per offence.
//!
//! The folders depend one way: os <- attach <- collect <- export <- daemon.
//! `record` uses only os and attach; `client` uses only the report data and
//! the metric names (`export::report`, `export::names`); only `daemon`
//! (the top, which dispatches every command) uses `record` and `client`.
//! The top level holds lib.rs, main.rs and cli.rs and nothing else; anyone
//! may use what they define, and they may use anything.
//!
//! It reads every `crate::…` and `super::…` path (in `use` lines and in
//! code, not in comments or strings) rather than compiling anything, so it
//! runs in a moment and before the build.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

/// The folders in dependency order: each may use the ones before it.
const ORDER: [&str; 5] = ["os", "attach", "collect", "export", "daemon"];
/// The folders outside that order, with what each may use.
const SIDE: [(&str, &[&str]); 2] = [
    ("record", &["os", "attach"]),
    ("client", &["export::report", "export::names"]),
];
/// The only files allowed at the top of observer/src.
const TOP_FILES: [&str; 3] = ["lib.rs", "main.rs", "cli.rs"];
/// The rule, as every offence line ends.
pub const RULE: &str = "os <- attach <- collect <- export <- daemon; record uses only os and attach; client uses only export::report and export::names";

/// Checks observer/src under `root`; fails with every offence printed.
pub fn run(root: &Path) -> Result<()> {
    let src = root.join("observer/src");
    let offences = check(&src)?;
    for o in &offences {
        eprintln!("{o}");
    }
    if !offences.is_empty() {
        bail!(
            "observer/src breaks its layout rule {} times (docs/architecture.md)",
            offences.len()
        );
    }
    eprintln!("layout: observer/src follows {RULE}");
    Ok(())
}

/// Every offence in the tree at `src`, one line each.
pub fn check(src: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut files = Vec::new();
    rust_files(src, &mut files)?;
    files.sort();
    for f in &files {
        let rel = f.strip_prefix(src).expect("under src");
        let parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let shown = Path::new("observer/src").join(rel).display().to_string();
        if parts.len() == 1 {
            if !TOP_FILES.contains(&parts[0].as_str()) {
                out.push(format!(
                    "{shown}:1: `{}` is at the top level, which holds only lib.rs, main.rs and cli.rs: move it into a folder ({RULE})",
                    parts[0]
                ));
            }
            continue;
        }
        let folder = parts[0].as_str();
        if !ORDER.contains(&folder) && !SIDE.iter().any(|(s, _)| *s == folder) {
            out.push(format!(
                "{shown}:1: `{folder}` is not a folder of the rule ({RULE})"
            ));
            continue;
        }
        let text = fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        // The module path of the file: collect/registry.rs is
        // collect::registry, client/top/mod.rs is client::top.
        let mut module: Vec<&str> = parts.iter().map(String::as_str).collect();
        let last = module.pop().expect("a file name");
        if last != "mod.rs" {
            module.push(last.strip_suffix(".rs").unwrap_or(last));
        }
        for (line, used) in uses(&text, &module) {
            if !allowed(folder, &used) {
                out.push(format!(
                    "{shown}:{line}: `{folder}` may not use `{}`: {RULE}",
                    used.join("::")
                ));
            }
        }
    }
    Ok(out)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            rust_files(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

/// Whether code in `folder` may use the crate path `used` (its first two
/// segments).
fn allowed(folder: &str, used: &[String]) -> bool {
    let Some(to) = used.first().map(String::as_str) else {
        return true;
    };
    let is_folder = ORDER.contains(&to) || SIDE.iter().any(|(s, _)| *s == to);
    if to == folder || !is_folder {
        return true;
    }
    if let Some((_, may)) = SIDE.iter().find(|(s, _)| *s == folder) {
        let two = used.iter().take(2).cloned().collect::<Vec<_>>().join("::");
        return may.iter().any(|m| *m == to || *m == two);
    }
    let rank = |f: &str| ORDER.iter().position(|o| *o == f);
    match (rank(folder), rank(to)) {
        // The top dispatches every command, the side folders' included.
        (Some(4), _) => true,
        (Some(a), Some(b)) => b < a,
        _ => false,
    }
}

/// The crate paths `text` names (up to two segments each), with their
/// lines: `crate::a::b`, each item of `crate::{a::b, c}`, and `super::`
/// paths that climb out of the file's folder. `module` is the file's
/// module path.
pub fn uses(text: &str, module: &[&str]) -> Vec<(usize, Vec<String>)> {
    let code = blank_comments_and_strings(text);
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let word_start = i == 0 || !is_ident(b[i - 1]);
        if word_start && b[i..].starts_with(b"crate::") {
            let at = i + "crate::".len();
            paths_at(&code, at, &mut out);
            i = at;
            continue;
        }
        if word_start && b[i..].starts_with(b"super::") {
            let mut at = i;
            let mut climbs = 0;
            while b[at..].starts_with(b"super::") {
                climbs += 1;
                at += "super::".len();
            }
            // Within the folder unless it climbs to the crate root (a
            // file's own `mod tests` only makes that need one climb more).
            if climbs >= module.len() {
                paths_at(&code, at, &mut out);
            }
            i = at;
            continue;
        }
        i += 1;
    }
    out.sort();
    out.dedup();
    out
}

/// The path or brace group starting at byte `at` of `code`, one entry per
/// item of a group.
fn paths_at(code: &str, at: usize, out: &mut Vec<(usize, Vec<String>)>) {
    let b = code.as_bytes();
    if b.get(at) == Some(&b'{') {
        let mut depth = 0;
        let mut item_start = true;
        let mut j = at + 1;
        while j < b.len() {
            match b[j] {
                b'{' => depth += 1,
                b'}' if depth == 0 => break,
                b'}' => depth -= 1,
                b',' if depth == 0 => item_start = true,
                c if item_start && is_ident(c) => {
                    item_start = false;
                    out.push((line_of(code, j), path(code, j)));
                }
                _ => {}
            }
            j += 1;
        }
    } else if b.get(at).copied().is_some_and(is_ident) {
        out.push((line_of(code, at), path(code, at)));
    }
}

/// Up to two `::`-separated identifiers starting at `at`.
fn path(code: &str, at: usize) -> Vec<String> {
    let b = code.as_bytes();
    let mut segs = Vec::new();
    let mut i = at;
    while segs.len() < 2 {
        let s = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        if i == s {
            break;
        }
        segs.push(code[s..i].to_string());
        if !b[i..].starts_with(b"::") {
            break;
        }
        i += 2;
    }
    segs
}

fn line_of(code: &str, at: usize) -> usize {
    code.as_bytes()[..at]
        .iter()
        .filter(|&&c| c == b'\n')
        .count()
        + 1
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// `text` with comments, string and character literals replaced by spaces
/// (newlines kept, so lines still count), so a doc link or a message that
/// names a path is not taken for a use.
fn blank_comments_and_strings(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            let end = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let end = text[i + 2..].find("*/").map_or(b.len(), |n| i + 2 + n + 2);
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !is_ident(b[i - 1]))
        {
            // A raw string: r"…", r#"…"#, …
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            let open = i + 1 + hashes;
            if b.get(open) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let end = text[open + 1..]
                .find(&close)
                .map_or(b.len(), |n| open + 1 + n + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(b.len());
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'\'' {
            // A character literal ('x', '\n', '\''), not a lifetime ('a).
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|n| i + 2 + n + 1)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(e) => {
                    blank(&mut out, i, e);
                    i = e;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).expect("only ASCII was replaced")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str, module: &[&str]) -> Vec<String> {
        uses(text, module)
            .into_iter()
            .map(|(l, p)| format!("{l}:{}", p.join("::")))
            .collect()
    }

    #[test]
    fn groups_paths_and_lines_are_read() {
        let text = "use crate::{\n    os::procfs,\n    attach::{symbols, probes::Probes},\n};\nfn f() { crate::export::metrics::render(); }\n";
        assert_eq!(
            names(text, &["collect", "registry"]),
            ["2:os::procfs", "3:attach", "5:export::metrics"]
        );
    }

    #[test]
    fn comments_and_strings_are_not_uses() {
        let text = "//! See [`crate::export::server`].\n// crate::daemon\nconst S: &str = \"crate::client\";\nconst R: &str = r#\"crate::client\"#;\nconst C: char = '\"';\nuse crate::os::sys;\n";
        assert_eq!(names(text, &["attach", "multi"]), ["6:os::sys"]);
    }

    #[test]
    fn super_counts_only_when_it_leaves_the_folder() {
        let text = "use super::model;\nuse super::super::export::names;\n";
        assert_eq!(names(text, &["client", "top"]), ["2:export::names"]);
    }

    #[test]
    fn the_rule_is_one_way() {
        let p = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
        assert!(allowed("collect", &p("attach::probes")));
        assert!(!allowed("attach", &p("collect::snapshot")));
        assert!(!allowed("collect", &p("export::server")));
        assert!(allowed("daemon", &p("record::command")));
        assert!(!allowed("export", &p("record::command")));
        assert!(allowed("record", &p("os::clock")));
        assert!(!allowed("record", &p("collect::segment")));
        assert!(allowed("client", &p("export::names")));
        assert!(!allowed("client", &p("export::metrics")));
        assert!(allowed("os", &p("cli")));
        assert!(allowed("os", &p("one_line")));
    }

    #[test]
    fn the_tree_follows_the_rule() {
        let src = crate::workspace_root().join("observer/src");
        let offences = check(&src).expect("observer/src readable");
        assert!(offences.is_empty(), "{}", offences.join("\n"));
    }
}
