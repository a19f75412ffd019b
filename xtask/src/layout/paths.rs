//! Reading the module paths a Rust file names, without compiling it: every
//! `crate::…`, `super::…` and `self::…` path, in `use` lines and in code
//! (macro bodies' `$crate::…` included), resolved from the crate root. A
//! path in a comment or a string is not a use.
//!
//! Reading text rather than compiling keeps `cargo xtask layout` a moment's
//! work that runs before the build. It does not see a macro invoked by name
//! (`entry!`), a bare path to a child module (`child::f`), or what a
//! parent's `pub use` re-exports: none of those names a sibling.

/// The paths `text` names, each with its line, resolved from the crate
/// root: `crate::a::b` is `[a, b]`, each leaf of `crate::{a::b, c::{d, e}}`
/// is one path, `super::` and `self::` start from the file's module path
/// `module` (plus the inline modules, `mod tests { … }`, the path is in).
/// `{self, …}` in a group names the group's path itself; a glob names the
/// path before it.
pub fn uses(text: &str, module: &[impl AsRef<str>]) -> Vec<(usize, Vec<String>)> {
    let code = blank_comments_and_strings(text);
    let lines = Lines::new(&code);
    let b = code.as_bytes();
    let mut out = Vec::new();
    // The inline modules the scan is in, each with the brace depth of its
    // body, and one whose `mod name` has been read but not its `{`.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut pending_mod: Option<String> = None;
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' => {
                depth += 1;
                if let Some(name) = pending_mod.take() {
                    inline.push((name, depth));
                }
                i += 1;
                continue;
            }
            b'}' => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
                continue;
            }
            b';' => pending_mod = None,
            _ => {}
        }
        let word_start = i == 0 || !is_ident(b[i - 1]);
        if !(word_start && is_ident(b[i])) {
            i += 1;
            continue;
        }
        let end = ident_end(b, i);
        let word = &code[i..end];
        let path_follows = b[end..].starts_with(b"::");
        match word {
            "mod" => {
                let name = skip_space(b, end);
                let name_end = ident_end(b, name);
                if name_end > name {
                    pending_mod = Some(code[name..name_end].to_string());
                    i = name_end;
                    continue;
                }
            }
            "crate" | "self" | "super" if path_follows => {
                let mut base: Vec<String> = module
                    .iter()
                    .map(|m| m.as_ref().to_string())
                    .chain(inline.iter().map(|(n, _)| n.clone()))
                    .collect();
                let mut at = end + 2;
                match word {
                    "crate" => base.clear(),
                    "super" => {
                        base.pop();
                        while b[at..].starts_with(b"super::") {
                            base.pop();
                            at += "super::".len();
                        }
                    }
                    _ => {}
                }
                tree(&code, &lines, at, base, &mut out);
                i = at;
                continue;
            }
            _ => {}
        }
        i = end;
    }
    out.sort();
    out.dedup();
    out
}

/// The use tree at byte `at` of `code` under `prefix`: a path, a brace
/// group of trees, or a glob; one entry per leaf.
fn tree(
    code: &str,
    lines: &Lines,
    mut at: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<(usize, Vec<String>)>,
) {
    let b = code.as_bytes();
    let mut line = lines.of(at);
    loop {
        match b.get(at) {
            Some(b'{') => {
                let mut depth = 0;
                let mut item_start = true;
                let mut j = at + 1;
                while j < b.len() {
                    match b[j] {
                        b'{' if depth == 0 && item_start => {
                            item_start = false;
                            tree(code, lines, j, prefix.clone(), out);
                            depth += 1;
                        }
                        b'{' => depth += 1,
                        b'}' if depth == 0 => return,
                        b'}' => depth -= 1,
                        b',' if depth == 0 => item_start = true,
                        c if depth == 0 && item_start && (is_ident(c) || c == b'*') => {
                            item_start = false;
                            tree(code, lines, j, prefix.clone(), out);
                        }
                        _ => {}
                    }
                    j += 1;
                }
                return;
            }
            Some(&c) if is_ident(c) => {
                let end = ident_end(b, at);
                line = lines.of(at);
                let seg = &code[at..end];
                if seg != "self" {
                    prefix.push(seg.to_string());
                }
                if !b[end..].starts_with(b"::") {
                    break;
                }
                at = end + 2;
            }
            _ => break,
        }
    }
    if !prefix.is_empty() {
        out.push((line, prefix));
    }
}

/// Where each line of a text starts, to turn byte offsets into line
/// numbers without counting from the start each time.
struct Lines(Vec<usize>);

impl Lines {
    fn new(code: &str) -> Lines {
        let starts = std::iter::once(0)
            .chain(
                code.bytes()
                    .enumerate()
                    .filter_map(|(i, c)| (c == b'\n').then_some(i + 1)),
            )
            .collect();
        Lines(starts)
    }

    /// The 1-based line holding byte `at`.
    fn of(&self, at: usize) -> usize {
        self.0.partition_point(|&s| s <= at)
    }
}

fn ident_end(b: &[u8], from: usize) -> usize {
    from + b[from..].iter().take_while(|&&c| is_ident(c)).count()
}

fn skip_space(b: &[u8], from: usize) -> usize {
    from + b[from..]
        .iter()
        .take_while(|c| c.is_ascii_whitespace())
        .count()
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
            [
                "2:os::procfs",
                "3:attach::probes::Probes",
                "3:attach::symbols",
                "5:export::metrics::render"
            ]
        );
    }

    #[test]
    fn self_in_a_group_and_globs_name_the_group() {
        let text = "use crate::{loaded::{self, LinkMap}, rows::*};\n";
        assert_eq!(
            names(text, &["bind"]),
            ["1:loaded", "1:loaded::LinkMap", "1:rows"]
        );
    }

    #[test]
    fn comments_and_strings_are_not_uses() {
        let text = "//! See [`crate::export::server`].\n// crate::daemon\nconst S: &str = \"crate::client\";\nconst R: &str = r#\"crate::client\"#;\nconst C: char = '\"';\nuse crate::os::sys;\n";
        assert_eq!(names(text, &["attach", "multi"]), ["6:os::sys"]);
    }

    #[test]
    fn super_and_self_start_from_the_module() {
        let text = "use super::model;\nuse super::super::export::names;\nuse self::inner::X;\n";
        assert_eq!(
            names(text, &["client", "top", "app"]),
            [
                "1:client::top::model",
                "2:client::export::names",
                "3:client::top::app::inner::X"
            ]
        );
    }

    #[test]
    fn inline_modules_add_a_level() {
        // `super::*` in a file's tests is the file; `super::super::b` is a
        // sibling of the file. After the module closes, `super` is the
        // file's parent again.
        let text = "mod tests {\n    use super::*;\n    use super::super::b::f;\n}\nuse super::c;\nmacro_rules! m { () => { $crate::d::e() } }\n";
        assert_eq!(
            names(text, &["f", "a"]),
            ["2:f::a", "3:f::b::f", "5:f::c", "6:d::e"]
        );
    }
}
