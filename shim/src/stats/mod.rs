//! The built-in `stats` layer (issue 4), and the extension point for layers
//! written in Rust inside the shim.
//!
//! A built-in layer is a [`Builtin`]: a name and a `resolve` function that
//! returns, for a dispatch-table row, the function the layer runs at its
//! level, or [`Raw::NONE`] to be skipped for that row. Rows are the C
//! procedures by `FunctionId as usize` (`0..FUNCTION_COUNT`), then the
//! Fortran symbol families of `generated::fortran::FORTRAN`.
//!
//! A layer function has the C signature of the procedure it stands for and
//! continues down the stack by calling the shim's own `PMPI_X` (for example
//! `crate::generated::c::PMPI_Send`), exactly as a PMPI tool does; the shim
//! sets the depth before calling it, so nothing else is needed. To add the
//! statistics layer: write its per-function wrappers in this folder (they
//! can be generated like `generated/c.rs`, from the same `FUNCTIONS` table
//! and the byte-accounting parts it carries), then make `resolve` return them
//! and fall back to [`pass_through`] for the rows the layer does not watch.
//!
//! Until then the layer is a pure pass-through: at every C row it runs the
//! shim's own `PMPI_X`, which continues at the next level. That keeps `stats`
//! a real level (it shows in `v` and its cost is that of a pass-through tool)
//! without changing any result.

use crate::{generated::c::PMPI_SELF, table::Raw};

/// A layer implemented inside the shim.
pub(crate) struct Builtin {
    /// The keyword that selects it in the tools list.
    pub(crate) name: &'static str,
    /// The function this layer runs for a row, or [`Raw::NONE`].
    pub(crate) resolve: fn(usize) -> Raw,
}

/// The `stats` keyword's layer.
pub(crate) static LAYER: Builtin = Builtin {
    name: "stats",
    resolve: pass_through,
};

/// Continue at the next level for every C procedure; skip Fortran rows (the
/// Fortran layer turns them into C calls, which this layer then sees).
pub(crate) fn pass_through(row: usize) -> Raw {
    PMPI_SELF.get(row).copied().unwrap_or(Raw::NONE)
}
