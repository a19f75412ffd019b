//! observer/src's dependency rule between its folders (docs/architecture.md,
//! "The rule").
//!
//! The folders depend one way: os <- attach <- collect <- export <- daemon.
//! `record` uses only os and attach; `client` uses only the report data and
//! the metric names (`export::report`, `export::names`); only `daemon`
//! (the top, which dispatches every command) uses `record` and `client`.
//! The top level holds lib.rs, main.rs and cli.rs and nothing else; anyone
//! may use what they define, and they may use anything.

use std::{fs, path::Path};

use anyhow::{Context as _, Result};

use super::{module_of, paths::uses, rust_files};

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

/// Every offence in the tree at `src`, one line each.
pub fn check(src: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for f in &rust_files(src)? {
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
        for (line, used) in uses(&text, &module_of(rel)) {
            if !allowed(folder, &used) {
                out.push(format!(
                    "{shown}:{line}: `{folder}` may not use `{}`: {RULE}",
                    used[..used.len().min(2)].join("::")
                ));
            }
        }
    }
    Ok(out)
}

/// Whether code in `folder` may use the crate path `used` (by its first
/// two segments).
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

#[cfg(test)]
mod tests {
    use super::*;

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
