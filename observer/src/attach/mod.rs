//! Attaching to a rank: what to probe and how. Uses [`crate::os`] only.
//!
//! [`checks`] says whether we may, [`kernel`] what this kernel can do and
//! which attach mechanism it allows, [`symbols`] and [`functions`] find the
//! PMPI entry points in a rank's MPI library, [`datatypes`] reads its
//! datatype sizes, [`identity`] says which rank of which job a process is,
//! [`probes`] attaches the eBPF programs (through [`links`]: uprobe_multi
//! links or classic uprobes) and reads their maps back, [`pins`] keeps
//! them across a planned restart, [`budget`] bounds what one user may cost,
//! [`symbolizer`] names call sites in a child process, and [`inject`] is
//! the mechanism that loads the shim into a running rank.

pub mod budget;
pub mod checks;
pub mod datatypes;
pub mod first_insn;
pub mod functions;
pub mod identity;
pub mod inject;
pub mod kernel;
pub mod links;
pub mod pins;
pub mod probes;
pub mod symbolizer;
pub mod symbols;
