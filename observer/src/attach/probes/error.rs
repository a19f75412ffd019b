//! What can go wrong loading or attaching probes, each cause kept as the
//! error's source.

use thiserror::Error;

use crate::{attach::links::LinkError, os::procfs};

/// Errors loading or attaching probes.
#[derive(Debug, Error)]
pub enum ProbeError {
    /// aya could not create the maps or parse the object.
    #[error(
        "cannot load the eBPF object: {source}; the kernel needs BPF (CONFIG_BPF_SYSCALL) with ring buffers and uprobes (CONFIG_UPROBE_EVENTS), and we need CAP_BPF and CAP_PERFMON"
    )]
    Object {
        /// aya's error.
        source: Box<aya::EbpfError>,
    },
    /// The kernel refused a program.
    #[error("cannot load the eBPF programs for {mechanism}: {source}")]
    Programs {
        /// The attach mechanism they were loaded for.
        mechanism: &'static str,
        /// The loader's error, with the verifier's last line.
        source: LinkError,
    },
    /// The maps' layout could not be hashed (an object aya-obj cannot
    /// parse).
    #[error("cannot read the eBPF object's maps: {source}")]
    Layout {
        /// aya-obj's error.
        source: aya_obj::ParseError,
    },
    /// The exec tracepoint could not be started.
    #[error("cannot start {program} on sched_process_exec: {source}")]
    ExecEvents {
        /// The program.
        program: &'static str,
        /// aya's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Probes could not be attached.
    #[error("cannot attach to pid {pid}: {source}")]
    Attach {
        /// Target pid.
        pid: u32,
        /// The loader's error.
        source: LinkError,
    },
    /// Probes on a library file for every process mapping it could not be
    /// attached.
    #[error("cannot probe {path} for the processes that map it: {source}")]
    AttachFile {
        /// The library, as reached.
        path: String,
        /// The loader's error.
        source: LinkError,
    },
    /// Functions are told by address, and the library's code is not
    /// mapped where its sites are.
    #[error(
        "cannot attach to pid {pid}: its MPI library's code is not mapped as one executable segment holding every probe site, so probes cannot tell its functions by address"
    )]
    NoText {
        /// Target pid.
        pid: u32,
    },
    /// Every slot of the by-address table is taken.
    #[error(
        "cannot attach to pid {pid}: the table of probe sites by address is full ({entries} entries): too many distinct MPI library files at once"
    )]
    SlotsFull {
        /// Target pid.
        pid: u32,
        /// The table's capacity.
        entries: u32,
    },
    /// No attach mechanism can be used on this kernel.
    #[error("{source}")]
    Kernel {
        /// What the feature probes found.
        source: crate::attach::kernel::NoMechanism,
    },
    /// The daemon's pid namespace could not be told, so neither could
    /// which pids the probes should use.
    #[error("cannot tell the daemon's pid namespace: {source}")]
    PidNamespace {
        /// Why.
        source: procfs::NamespaceError,
    },
    /// A process of another pid namespace than the daemon's: the probes
    /// see only tasks of the daemon's own (a nested one's pids are not
    /// the kernel helper's to give), so it would count nothing.
    #[error(
        "cannot attach to pid {pid}: it is in another pid namespace than the daemon's, whose probes count only their own namespace's processes; run a daemon in that namespace, or on the host"
    )]
    ForeignNamespace {
        /// Target pid.
        pid: u32,
    },
    /// A map update failed.
    #[error("cannot update BPF map {map}: {source}")]
    Map {
        /// Map name.
        map: &'static str,
        /// The error.
        source: aya::maps::MapError,
    },
}

impl ProbeError {
    /// Whether loading failed because of what the kernel cannot do (the
    /// object, its programs or their maps refused), where an `--all`
    /// daemon still serves the shim's figures; not a fault of the set-up
    /// (a pid namespace without its own `/proc`), which must stop it.
    pub fn is_kernel_lacking(&self) -> bool {
        matches!(
            self,
            ProbeError::Object { .. }
                | ProbeError::Programs { .. }
                | ProbeError::Layout { .. }
                | ProbeError::ExecEvents { .. }
                | ProbeError::Kernel { .. }
        )
    }
}
