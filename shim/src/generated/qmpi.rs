// Placeholder until `cargo xtask codegen` generates it (issue 25).

/// Procedure ids of our header: `OURS_BASE + FunctionId`.
pub(crate) const OURS_BASE: u32 = 0x514D_0000;

/// Known MPICH releases: (`MPICH_VERSION`, enum value -> FunctionId).
pub(crate) const RELEASES: &[(&str, &[u16])] = &[];
