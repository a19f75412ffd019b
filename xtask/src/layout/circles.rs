//! No import circles between the modules inside a folder, in any crate.
//!
//! The modules of one folder (a crate's src/ or any folder below it; a
//! module's file and its folder, `probes.rs` and `probes/`, are one module)
//! use each other one way. Where two need the same types, those live in the
//! one both use, or in a leaf of their own. A folder's own file (`mod.rs`,
//! `lib.rs`, `main.rs`, or `probes.rs` for `probes/`) is its modules'
//! parent, not one of them: it declares them and may use them, and they
//! may use it.
//!
//! A use is counted where two module paths first part: a file of
//! `export::metrics::job` using `crate::export::metrics::departed::X` is
//! `job -> departed` inside export/metrics; using `crate::export::names`
//! is `metrics -> names` inside export. Every use counts, tests' included:
//! a circle through a test module is a circle in the build.
//!
//! A folder with no file of its own (the shim's `generated/`, declared
//! inline in lib.rs to keep rustfmt off it) is a namespace, not a module:
//! it holds no code that could use anything, so its files count as modules
//! of the folder above (`generated::next` beside `qmpi`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

use anyhow::{Context as _, Result};

use super::{module_of, paths::uses, rust_files};

/// One module's use of a sibling, the first place it is seen: file, line.
type Edges = BTreeMap<(String, String), (String, usize)>;

/// Every circle among the modules of each folder of the crate in
/// `root`/`krate`, one line each, at the first use of the circle's first
/// edge.
pub fn check(root: &Path, krate: &str) -> Result<Vec<String>> {
    let src = root.join(krate).join("src");
    let files = rust_files(&src)?;
    let mut modules = BTreeSet::new();
    let mut with_file = BTreeSet::new();
    let mut read = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src");
        let module = module_of(rel);
        for k in 1..=module.len() {
            modules.insert(module[..k].to_vec());
        }
        with_file.insert(module.clone());
        let text = fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let shown = Path::new(krate).join("src").join(rel).display().to_string();
        read.push((shown, module, text));
    }
    let namespace = |m: &[String]| !m.is_empty() && !with_file.contains(m);
    let mut folders: BTreeMap<Vec<String>, Edges> = BTreeMap::new();
    for (shown, module, text) in &read {
        for (line, used) in uses(text, module) {
            let Some(e) = sibling_edge(module, &used, &namespace) else {
                continue;
            };
            // A name that is no module of the folder is an item of the
            // folder's own file (`crate::one_line`), or another crate's.
            if !modules.contains(e.to_path) {
                continue;
            }
            folders
                .entry(e.folder)
                .or_default()
                .entry((e.from, e.to))
                .or_insert_with(|| (shown.clone(), line));
        }
    }
    let mut out = Vec::new();
    for (folder, edges) in &folders {
        let mut shown = Path::new(krate).join("src");
        shown.extend(folder);
        let shown = shown.display().to_string();
        for circle in circles(edges) {
            out.push(say(&shown, &circle, edges));
        }
    }
    Ok(out)
}

/// One use between two modules of a folder.
struct SiblingEdge<'u> {
    /// The folder's module path.
    folder: Vec<String>,
    /// The using module, inside the folder (`job`, `generated::next`).
    from: String,
    /// The used module, inside the folder.
    to: String,
    /// The used module's path from the crate root.
    to_path: &'u [String],
}

/// Where the file of module `from` using path `used` is an edge between two
/// modules of one folder. None for a use of the module itself, its
/// children, or the folders it is in. `namespace` says which module paths
/// are namespaces, climbed out of and looked through.
fn sibling_edge<'u>(
    from: &[String],
    used: &'u [String],
    namespace: &dyn Fn(&[String]) -> bool,
) -> Option<SiblingEdge<'u>> {
    let p = from.iter().zip(used).take_while(|(a, b)| a == b).count();
    if p >= from.len() || p >= used.len() {
        return None;
    }
    let mut q = p;
    while q > 0 && namespace(&from[..q]) {
        q -= 1;
    }
    let end = |path: &[String]| {
        let mut k = p + 1;
        while k < path.len() && namespace(&path[..k]) {
            k += 1;
        }
        k
    };
    let (a, b) = (end(from), end(used));
    Some(SiblingEdge {
        folder: from[..q].to_vec(),
        from: from[q..a].join("::"),
        to: used[q..b].join("::"),
        to_path: &used[..b],
    })
}

/// The strongly connected sets of two modules or more in `edges`, each
/// sorted, in order.
fn circles(edges: &Edges) -> BTreeSet<BTreeSet<String>> {
    let nodes: BTreeSet<&String> = edges.keys().flat_map(|(a, b)| [a, b]).collect();
    let reach = |from: &String| {
        let mut seen: BTreeSet<&String> = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(n) = todo.pop() {
            for ((a, b), _) in edges.range((n.clone(), String::new())..) {
                if a != n {
                    break;
                }
                if seen.insert(b) {
                    todo.push(b);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<&String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut out = BTreeSet::new();
    for n in &nodes {
        let set: BTreeSet<String> = reached[n]
            .iter()
            .filter(|m| reached[*m].contains(n))
            .map(|m| (*m).clone())
            .collect();
        if set.len() >= 2 {
            out.insert(set);
        }
    }
    out
}

/// The offence line of one circle in the folder shown as `folder`: where
/// its first edge is used, the modules, and every edge between them with
/// where it is used.
fn say(folder: &str, circle: &BTreeSet<String>, edges: &Edges) -> String {
    let inside: Vec<_> = edges
        .iter()
        .filter(|((a, b), _)| circle.contains(a) && circle.contains(b))
        .collect();
    let ((_, _), (file, line)) = inside[0];
    let names = circle.iter().cloned().collect::<Vec<_>>().join(", ");
    let uses = inside
        .iter()
        .map(|((a, b), (f, l))| format!("{a} -> {b} ({f}:{l})"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{file}:{line}: the modules {names} of {folder} import each other in a circle: {uses}; move what they share into the one they all use, or into a leaf of its own (docs/architecture.md, \"The rule\")"
    )
}

#[cfg(test)]
mod tests {
    use super::{super::Scratch, *};

    fn tree(name: &str, files: &[(&str, &str)]) -> (Scratch, Vec<String>) {
        let files: Vec<(&str, String)> = files.iter().map(|(p, t)| (*p, t.to_string())).collect();
        let t = Scratch::new(name, &files);
        let out = check(&t.0, "k").expect("scratch readable");
        (t, out)
    }

    #[test]
    fn a_circle_is_one_line_naming_every_use() {
        let (_t, out) = tree(
            "circle",
            &[
                ("k/src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
                ("k/src/a.rs", "use crate::b::B;\n"),
                ("k/src/b.rs", "//! b\n\nfn f() { super::c::g() }\n"),
                ("k/src/c.rs", "use crate::{a::A, lib_item};\n"),
            ],
        );
        assert_eq!(
            out,
            [
                "k/src/a.rs:1: the modules a, b, c of k/src import each other in a circle: a -> b (k/src/a.rs:1), b -> c (k/src/b.rs:3), c -> a (k/src/c.rs:1); move what they share into the one they all use, or into a leaf of its own (docs/architecture.md, \"The rule\")"
            ]
        );
    }

    #[test]
    fn a_circle_is_found_inside_a_folder_and_between_folders() {
        let (_t, out) = tree(
            "folders",
            &[
                ("k/src/main.rs", "mod export;\nmod os;\n"),
                ("k/src/export/mod.rs", "mod metrics;\nuse metrics::job;\n"),
                ("k/src/export/metrics/mod.rs", "use self::job::J;\n"),
                ("k/src/export/metrics/job.rs", "use super::departed::D;\n"),
                (
                    "k/src/export/metrics/departed.rs",
                    "use crate::export::metrics::job::J;\nuse crate::os::x;\n",
                ),
                ("k/src/os.rs", "mod x;\n"),
                (
                    "k/src/os/x.rs",
                    "#[cfg(test)]\nmod tests {\n    use crate::export::E;\n}\n",
                ),
            ],
        );
        assert_eq!(out.len(), 2, "{out:#?}");
        assert!(
            out[0].starts_with(
                "k/src/export/metrics/departed.rs:2: the modules export, os of k/src "
            ),
            "{}",
            out[0]
        );
        assert!(
            out[1].starts_with(
                "k/src/export/metrics/departed.rs:1: the modules departed, job of k/src/export/metrics "
            ),
            "{}",
            out[1]
        );
    }

    #[test]
    fn a_namespace_folder_is_looked_through() {
        // generated/ has no file of its own: next and fortran sit beside
        // qmpi and table, so qmpi <-> generated::next is a circle, and
        // table -> generated::fortran (which uses only rows) is not.
        let (_t, out) = tree(
            "namespace",
            &[
                (
                    "k/src/lib.rs",
                    "mod qmpi;
mod rows;
mod table;
mod generated { mod next; mod fortran; }
",
                ),
                (
                    "k/src/generated/next.rs",
                    "use crate::{qmpi::MAX, table::ROWS};
",
                ),
                (
                    "k/src/generated/fortran.rs",
                    "use crate::rows::Row;
",
                ),
                (
                    "k/src/qmpi.rs",
                    "fn f() { crate::generated::next::QEXIT[0]; }
",
                ),
                (
                    "k/src/table.rs",
                    "use crate::generated::fortran::COUNT;
",
                ),
                ("k/src/rows.rs", ""),
            ],
        );
        assert_eq!(
            out,
            [
                "k/src/generated/next.rs:1: the modules generated::next, qmpi of k/src import each other in a circle: generated::next -> qmpi (k/src/generated/next.rs:1), qmpi -> generated::next (k/src/qmpi.rs:1); move what they share into the one they all use, or into a leaf of its own (docs/architecture.md, \"The rule\")"
            ]
        );
    }

    #[test]
    fn parents_children_and_leaves_are_no_circle() {
        let (_t, out) = tree(
            "leaves",
            &[
                (
                    "k/src/lib.rs",
                    "mod a;\nmod b;\nmod shared;\nuse crate::a::A;\n",
                ),
                (
                    "k/src/a.rs",
                    "mod inner;\nuse crate::{shared::S, Top};\nuse inner::I;\n",
                ),
                (
                    "k/src/a/inner.rs",
                    "use super::A;\nuse super::super::shared::T;\n",
                ),
                (
                    "k/src/b.rs",
                    "use super::{a::A, shared::*};\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
                ),
                ("k/src/shared.rs", "pub struct S;\n"),
            ],
        );
        assert!(out.is_empty(), "{out:#?}");
    }
}
