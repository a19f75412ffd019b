//! What a row of the dispatch table is: a function address that can sit in
//! a `static` ([`Raw`]), and the Fortran symbol families that follow the C
//! procedures ([`FortranRow`]).
//!
//! A leaf, so that the generated tables, the dispatch table and the
//! built-in layers can all name these types without naming each other.

use core::ffi::c_void;

/// A raw function pointer that can sit in a `static`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Raw(pub *const c_void);

// SAFETY: it only ever holds addresses of functions, which are immutable.
unsafe impl Sync for Raw {}
// SAFETY: as above.
unsafe impl Send for Raw {}

impl Raw {
    /// No function.
    pub(crate) const NONE: Raw = Raw(core::ptr::null());

    /// Whether this is [`Raw::NONE`].
    pub(crate) fn is_none(self) -> bool {
        self.0.is_null()
    }
}

/// One Fortran symbol family: the spellings of one binding of one procedure.
pub(crate) struct FortranRow {
    /// The procedure: the row a timed call of this family counts under.
    pub(crate) function: observer_common::FunctionId,
    /// Spellings that enter at the caller's level, the canonical one first.
    pub(crate) mpi: &'static [&'static str],
    /// Profiling spellings, which continue one level below the caller.
    pub(crate) pmpi: &'static [&'static str],
}
