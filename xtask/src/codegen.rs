//! `cargo xtask codegen`: the one MPI function ID space, generated from the
//! MPI Forum's machine-readable `apis.json`.
//!
//! The output is committed. `cargo xtask codegen --check` regenerates it in
//! memory and fails on any difference, which is how CI catches a stale table.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::semantics;

/// Where the generated files live, relative to the workspace root.
pub const FUNCTIONS_RS: &str = "observer-common/src/generated/functions.rs";

/// One C-callable MPI procedure as the rest of the project needs it.
pub struct Procedure {
    pub name: String,
    pub base: String,
    pub family: &'static str,
    pub c_params: Vec<Param>,
    pub ret: &'static str,
    pub large_count: bool,
    pub has_large_variant: bool,
}

#[derive(Clone)]
pub struct Param {
    pub kind: String,
    pub direction: String,
    pub root_only: bool,
    pub is_array: bool,
}

/// Locates `apis.json`: `MPI_APIS_JSON` if set, else the copy vendored in
/// `xtask/spec/` (its source and licence are in the README beside it).
pub fn apis_json_path(root: &Path) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("MPI_APIS_JSON") {
        return Ok(PathBuf::from(p));
    }
    let p = root.join("xtask/spec/apis.json");
    if !p.exists() {
        bail!(
            "apis.json not found at {}: restore it from git, or set MPI_APIS_JSON to the MPI \
             Forum's apis.json (pip download --no-deps pympistandard==0.2.0 ships it)",
            p.display()
        );
    }
    Ok(p)
}

/// `apis.json`, parsed, and its fingerprint: the one reader of the spec.
pub fn read_spec(root: &Path) -> Result<(Value, u64)> {
    let path = apis_json_path(root)?;
    let raw = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let json = serde_json::from_slice(&raw).context("parsing apis.json")?;
    Ok((json, fingerprint(&raw)))
}

/// FNV-1a over the input: a stable fingerprint of the spec version we read,
/// recorded in the output so a reader knows which apis.json produced it.
fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

pub fn load(root: &Path) -> Result<(Vec<Procedure>, u64)> {
    let (json, fingerprint) = read_spec(root)?;
    let obj = json
        .as_object()
        .context("apis.json: top level is not an object")?;
    let mut out = BTreeMap::new();
    for entry in obj.values() {
        let attrs = &entry["attributes"];
        let flag = |k: &str| attrs[k].as_bool().unwrap_or(false);
        if !flag("c_expressible") || flag("callback") {
            continue;
        }
        let name = entry["name"].as_str().context("procedure without a name")?;
        let base = name
            .strip_prefix("MPI_")
            .context("name without MPI_ prefix")?;
        let params = entry["parameters"]
            .as_array()
            .context("parameters is not a list")?;
        let c_params: Vec<Param> = params
            .iter()
            .filter(|p| {
                !p["suppress"]
                    .as_str()
                    .unwrap_or("")
                    .split_whitespace()
                    .any(|s| s == "c_parameter")
            })
            .map(|p| Param {
                kind: p["kind"].as_str().unwrap_or("").to_string(),
                direction: p["param_direction"].as_str().unwrap_or("").to_string(),
                root_only: p["root_only"].as_bool().unwrap_or(false),
                is_array: !p["length"].is_null(),
            })
            .collect();
        let has_large_variant = c_params.iter().any(|p| p.kind.starts_with("POLY"));
        let ret = match entry["return_kind"].as_str().unwrap_or("") {
            "ERROR_CODE" | "ERROR_CLASS" | "KEY_INDEX" => "Int",
            "WALL_TIME" | "TICK_RESOLUTION" => "Double",
            "NOTHING" => "Void",
            // Handles, Fortran integers and addresses: all returned in the
            // integer register, pointer-sized or narrower.
            _ => "Word",
        };
        let family = semantics::family(base);
        if has_large_variant {
            let name_c = format!("{name}_c");
            out.insert(
                name_c.clone(),
                Procedure {
                    name: name_c,
                    base: base.to_string(),
                    family,
                    c_params: c_params.clone(),
                    ret,
                    large_count: true,
                    has_large_variant: false,
                },
            );
        }
        out.insert(
            name.to_string(),
            Procedure {
                name: name.to_string(),
                base: base.to_string(),
                family,
                c_params,
                ret,
                large_count: false,
                has_large_variant,
            },
        );
    }
    Ok((out.into_values().collect(), fingerprint))
}

fn is_count(kind: &str) -> bool {
    matches!(
        kind,
        "POLYXFER_NUM_ELEM_NNI" | "POLYXFER_NUM_ELEM" | "XFER_NUM_ELEM" | "XFER_NUM_ELEM_NNI"
    )
}

/// Derives the byte-accounting parts of a call: each data buffer with the
/// count and datatype arguments that describe it.
fn byte_parts(p: &Procedure) -> Vec<String> {
    if !matches!(p.family, "PointToPoint" | "Collective") || semantics::moves_no_data(&p.base) {
        return Vec::new();
    }
    let mut parts = Vec::new();
    let params = &p.c_params;
    for (i, buf) in params.iter().enumerate() {
        if buf.kind != "BUFFER" {
            continue;
        }
        let Some(c) = (i + 1..params.len()).find(|&j| is_count(&params[j].kind)) else {
            continue;
        };
        let Some(t) = (c + 1..params.len()).find(|&j| params[j].kind == "DATATYPE") else {
            continue;
        };
        let dirs: &[&str] = match (p.family, buf.direction.as_str()) {
            ("PointToPoint", "inout") => &["Send", "Recv"],
            (_, "in") => &["Send"],
            _ => &["Recv"],
        };
        let unknowable = params[c].is_array
            || params[t].is_array
            || (dirs == ["Send"] && semantics::send_side_unknowable(&p.base));
        let kind = if buf.root_only || params[c].root_only || params[t].root_only {
            // Root-only arguments are garbage on other ranks and a probe cannot
            // tell which rank is root: they are never read.
            continue;
        } else if unknowable {
            "Unknowable"
        } else if p.large_count {
            "Count64"
        } else {
            "Int32"
        };
        for dir in dirs {
            parts.push(format!(
                "BytePart {{ buf: {i}, count: {c}, datatype: {t}, direction: Direction::{dir}, kind: CountKind::{kind} }}"
            ));
        }
    }
    parts
}

fn variant_name(name: &str) -> String {
    name.trim_start_matches("MPI_")
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

pub fn render(procs: &[Procedure], digest: u64) -> Result<String> {
    let mut s = String::new();
    writeln!(
        s,
        "// @generated by `cargo xtask codegen` from the MPI Forum's apis.json\n\
         // (pympistandard 0.2.0 data, FNV-1a {digest:#018x}). Do not edit.\n"
    )?;
    writeln!(
        s,
        "use crate::functions::{{BytePart, CountKind, Direction, Family, FunctionInfo, Ret}};\n"
    )?;
    writeln!(
        s,
        "/// Fingerprint of the apis.json these IDs were generated from.\npub const SPEC_FINGERPRINT: u64 = {digest:#018x};\n"
    )?;
    writeln!(
        s,
        "/// Number of MPI procedures in the ID space.\npub const FUNCTION_COUNT: usize = {};\n",
        procs.len()
    )?;
    writeln!(
        s,
        "/// Stable numeric IDs of every C-callable MPI procedure, in name order.\n\
         #[repr(u16)]\n#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]\n\
         #[expect(missing_docs, reason = \"each variant is the standard name of FUNCTIONS[id]\")]\npub enum FunctionId {{"
    )?;
    for (i, p) in procs.iter().enumerate() {
        writeln!(s, "    {} = {i},", variant_name(&p.name))?;
    }
    writeln!(s, "}}\n")?;
    writeln!(
        s,
        "/// Every procedure, indexed by `FunctionId as usize`.\npub static FUNCTIONS: [FunctionInfo; FUNCTION_COUNT] = ["
    )?;
    for p in procs {
        let parts = byte_parts(p);
        if parts.len() > 2 {
            bail!(
                "{} has {} byte parts; the cookie holds two",
                p.name,
                parts.len()
            );
        }
        let mut bytes = parts;
        while bytes.len() < 2 {
            bytes.push("BytePart::NONE".to_string());
        }
        writeln!(
            s,
            "    FunctionInfo {{ name: \"{}\", family: Family::{}, c_params: {}, ret: Ret::{}, large_count: {}, has_large_variant: {}, bytes: [{}] }},",
            p.name,
            p.family,
            p.c_params.len(),
            p.ret,
            p.large_count,
            p.has_large_variant,
            bytes.join(", ")
        )?;
    }
    writeln!(s, "];")?;
    Ok(s)
}

/// Regenerates everything; with `check`, fails if the committed files differ.
pub fn run(root: &Path, check: bool) -> Result<()> {
    let (procs, digest) = load(root)?;
    let outputs = [(FUNCTIONS_RS, render(&procs, digest)?)]
        .into_iter()
        .chain(crate::codegen_shim::outputs(root, &procs, digest)?);
    let mut stale = Vec::new();
    for (rel, text) in outputs {
        let path = root.join(rel);
        let current = fs::read_to_string(&path).unwrap_or_default();
        if current == text {
            continue;
        }
        if check {
            stale.push(rel);
        } else {
            fs::create_dir_all(path.parent().unwrap())?;
            fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {rel}");
        }
    }
    if !stale.is_empty() {
        bail!(
            "generated code is stale: {}; run `cargo xtask codegen` and commit the result",
            stale.join(", ")
        );
    }
    Ok(())
}
