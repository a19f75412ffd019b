//! The layering shim (issue 3).
