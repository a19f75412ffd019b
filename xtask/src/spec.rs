//! The MPI Forum's `apis.json`, read once: every C-callable procedure with
//! what the generators need of it, its C parameters and its Fortran
//! bindings, plus the hand-kept facts of [`crate::semantics`].
//!
//! Both generators ([`crate::codegen`] for `observer-common`, and
//! [`crate::codegen_shim`] for the shim) take the list this module returns;
//! neither reads the file itself.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::semantics;

/// One C-callable MPI procedure as the rest of the project needs it.
pub struct Procedure {
    /// Standard name, `MPI_Send` or `MPI_Send_c`.
    pub name: String,
    /// The name without `MPI_` and without a large-count `_c`.
    pub base: String,
    /// `Family` variant (see [`semantics::family`]).
    pub family: &'static str,
    /// The collective it performs, by its blocking form's name (see
    /// [`semantics::collective`]).
    pub collective: Option<&'static str>,
    /// Parameters of the C binding.
    pub c_params: Vec<Param>,
    /// `Ret` variant.
    pub ret: &'static str,
    /// The standard's kind of the return value (`ERROR_CODE`, `WALL_TIME`, ...).
    pub return_kind: String,
    /// The large-count `_c` form.
    pub large_count: bool,
    /// A large-count `_c` form exists.
    pub has_large_variant: bool,
    /// Its Fortran bindings.
    pub fortran: Fortran,
}

/// One parameter of a C binding.
#[derive(Clone)]
pub struct Param {
    pub kind: String,
    pub direction: String,
    pub root_only: bool,
    pub is_array: bool,
    /// What the C prototype needs to spell it (`codegen_qmpi`'s typedefs).
    pub c: CParam,
}

/// The facts of a parameter that spell it in C, as the standard renders it.
#[derive(Clone)]
pub struct CParam {
    /// Its name in the standard.
    pub name: String,
    /// `const`-qualified.
    pub constant: bool,
    /// The standard's explicit pointer flag (`None`: decided by kind and
    /// direction).
    pub pointer: Option<bool>,
    /// The length expression of an array: `*` for a C string written as an
    /// array.
    pub length: Option<String>,
    /// The second dimension of a two-dimensional array (`ranges[][3]`).
    pub dim2: Option<String>,
    /// The callback type of a `FUNCTION` kind.
    pub func_type: String,
    /// Only in the large-count `_c` form.
    pub large_only: bool,
}

/// What the shim needs to know of a procedure's Fortran bindings.
#[derive(Clone, Copy)]
pub struct Fortran {
    /// Expressible in `mpif.h` and `use mpi`.
    pub f90: bool,
    /// Expressible in `use mpi_f08`.
    pub f08: bool,
    /// A choice buffer: MPICH's `mpi_f08` then calls `mpi_x_f08ts_`.
    pub buffer: bool,
    /// Machine words of the longest binding: arguments (all by reference,
    /// `ierror` included) plus one hidden length per character argument.
    pub words: usize,
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

/// FNV-1a over the input: a stable fingerprint of the spec version we read,
/// recorded in the output so a reader knows which apis.json produced it.
fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `MPI_Send` -> `Send`, `MPI_Send_c` -> `SendC`: the `FunctionId` variant.
pub fn variant(name: &str) -> String {
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

/// The C spelling facts of one `apis.json` parameter.
fn c_param(p: &Value) -> CParam {
    let text = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    };
    let (length, dim2) = match &p["length"] {
        Value::Array(dims) => (dims.first().and_then(text), dims.get(1).and_then(text)),
        other => (text(other), None),
    };
    CParam {
        name: p["name"].as_str().unwrap_or("").to_string(),
        constant: p["constant"].as_bool().unwrap_or(false),
        pointer: p["pointer"].as_bool(),
        length,
        dim2,
        func_type: p["func_type"].as_str().unwrap_or("").to_string(),
        large_only: p["large_only"].as_bool().unwrap_or(false),
    }
}

/// The Fortran facts of one `apis.json` entry.
fn fortran(entry: &Value, params: &[Value]) -> Fortran {
    let flag = |k: &str| entry["attributes"][k].as_bool().unwrap_or(false);
    let words = |lang: &str| {
        params
            .iter()
            .filter(|p| {
                !p["suppress"]
                    .as_str()
                    .unwrap_or("")
                    .split_whitespace()
                    .any(|s| s == lang)
            })
            .map(|p| match p["kind"].as_str().unwrap_or("") {
                "STRING" | "STRING_ARRAY" | "STRING_2DARRAY" => 2,
                _ => 1,
            })
            .sum::<usize>()
    };
    Fortran {
        f90: flag("f90_expressible"),
        f08: flag("f08_expressible"),
        buffer: params.iter().any(|p| p["kind"] == "BUFFER"),
        words: words("f90_parameter").max(words("f08_parameter")),
    }
}

/// Reads `apis.json` once: every C-callable procedure (and its large-count
/// form), in name order, and the file's fingerprint.
pub fn load(root: &Path) -> Result<(Vec<Procedure>, u64)> {
    let path = apis_json_path(root)?;
    let raw = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let json: Value = serde_json::from_slice(&raw).context("parsing apis.json")?;
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
                c: c_param(p),
            })
            .collect();
        let has_large_variant = c_params.iter().any(|p| p.kind.starts_with("POLY"));
        let return_kind = entry["return_kind"].as_str().unwrap_or("");
        let ret = match return_kind {
            "ERROR_CODE" | "ERROR_CLASS" | "KEY_INDEX" => "Int",
            "WALL_TIME" | "TICK_RESOLUTION" => "Double",
            "NOTHING" => "Void",
            // Handles, Fortran integers and addresses: all returned in the
            // integer register, pointer-sized or narrower.
            _ => "Word",
        };
        let family = semantics::family(base);
        let collective = semantics::collective(base);
        let fortran = fortran(entry, params);
        if has_large_variant {
            let name_c = format!("{name}_c");
            out.insert(
                name_c.clone(),
                Procedure {
                    name: name_c,
                    base: base.to_string(),
                    family,
                    collective,
                    c_params: c_params.clone(),
                    ret,
                    return_kind: return_kind.to_string(),
                    large_count: true,
                    has_large_variant: false,
                    fortran,
                },
            );
        }
        out.insert(
            name.to_string(),
            Procedure {
                name: name.to_string(),
                base: base.to_string(),
                family,
                collective,
                c_params,
                ret,
                return_kind: return_kind.to_string(),
                large_count: false,
                has_large_variant,
                fortran,
            },
        );
    }
    Ok((out.into_values().collect(), fingerprint(&raw)))
}
