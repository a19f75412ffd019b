//! Preparing a rank: everything attaching a process needs, read from
//! `/proc` and its library's file without the state lock, and the errors
//! of attaching to one process.

use thiserror::Error;

use crate::{
    attach::budget::Budget,
    attach::datatypes,
    attach::identity::{self, Identity},
    attach::probes::ProbeError,
    attach::symbols::{self, SymbolError},
    collect::callsites::RankSites,
    collect::segment::Segment,
    collect::snapshot::SegmentProblem,
    os::procfs::{self, ProcError},
};

/// Errors attaching to one process.
#[derive(Debug, Error)]
pub enum AttachError {
    /// Reading /proc failed.
    #[error(transparent)]
    Proc(#[from] ProcError),
    /// The process maps no MPI library.
    #[error(
        "process {pid} ({comm}) has no MPI library mapped (looked for libmpi.so* and libmpich.so* in /proc/{pid}/maps): \
         give the pid of an MPI rank, not of mpirun, and attach after it started"
    )]
    NoMpiLibrary {
        /// The pid.
        pid: u32,
        /// Its command name.
        comm: String,
    },
    /// A statically linked program: no shared MPI library to probe.
    #[error(
        "process {pid} ({comm}) is a statically linked executable: there is no shared MPI library to probe \
         and no dynamic loader to --inject the shim with; link it against the shared libmpi (mpicc's default)"
    )]
    Static {
        /// The pid.
        pid: u32,
        /// Its command name.
        comm: String,
    },
    /// The library could not be read.
    #[error(transparent)]
    Symbols(#[from] SymbolError),
    /// Probes could not be attached.
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// Its user is at a budget, or the kernel maps are full.
    #[error(
        "pid {pid} (uid {uid}) not observed: over the {} budget; raise it with {} if this user's jobs need more",
        budget.as_str(),
        budget.flag()
    )]
    Refused {
        /// The process.
        pid: u32,
        /// Its real uid.
        uid: u32,
        /// The budget it would exceed.
        budget: Budget,
    },
    /// Found after its shim's stats segment was unlinked (its
    /// `MPI_Finalize` is past) by a daemon that cannot open it: its figures
    /// are lost. Said once, counted in
    /// `mpi_observer_segment_errors_total{reason="gone"}`, and never
    /// registered, so never shown as a rank without calls.
    #[error(
        "pid {pid} ({comm}) was found after its MPI_Finalize, its stats segment already gone: its figures are lost \
         (its exit knock reached no socket of this daemon's: docs/shim.md, \"Exit handover\")"
    )]
    SegmentGone {
        /// The pid.
        pid: u32,
        /// Its command name.
        comm: String,
    },
    /// The process maps its MPI library but not yet the library's code:
    /// the dynamic loader maps the whole file read-only first and the
    /// code over it after, and a rank found at its exec can be caught in
    /// between. Not a failure: `--all`'s next scan offers it again (the
    /// attacher gives up after [`LOADING_TRIES`](crate::daemon::attacher::LOADING_TRIES)).
    #[error(
        "pid {pid} ({comm}) maps its MPI library but not yet the library's code (the dynamic loader is between its steps): \
         attach again once it has started"
    )]
    Loading {
        /// The pid.
        pid: u32,
        /// Its command name.
        comm: String,
    },
    /// The process ended (or was already ending) while it was being
    /// attached: whatever failed (its maps read, a uprobe_multi link made
    /// on /proc/PID/root/...) failed because it was gone, not because of a
    /// fault of ours. Counted in `mpi_observer_attach_exited_total`, not as
    /// an attach failure.
    #[error("rank {pid} exited before its probes were in")]
    Exited {
        /// The pid.
        pid: u32,
    },
}

impl AttachError {
    /// `self`, or [`AttachError::Exited`] if `pid` (started at `ticks`) is
    /// gone or a zombie now, as `/proc/PID/stat` said right after the
    /// failure (`live`). A budget's refusal stays one: it was decided, not
    /// failed. Unknown liveness (the read failed) keeps the error as it is.
    pub fn or_exited(self, pid: u32, live: procfs::Liveness) -> AttachError {
        match self {
            AttachError::Refused { .. } | AttachError::Exited { .. } => self,
            _ if live == procfs::Liveness::Exited => AttachError::Exited { pid },
            _ => self,
        }
    }
}

/// A process read and ready to be registered: everything attaching needs
/// from `/proc` and the library's file, gathered without the state lock
/// (see [`prepare()`]).
pub struct Prepared {
    /// The pid.
    pub pid: u32,
    /// Its start time in ticks.
    pub ticks: u64,
    /// Its real uid.
    pub uid: u32,
    pub(super) map: procfs::MappedLib,
    pub(super) host_path: std::path::PathBuf,
    pub(super) lib: std::sync::Arc<symbols::Library>,
    pub(super) datatypes: datatypes::Datatypes,
    /// Where its datatypes are, to look at them again if they did not
    /// check out yet.
    pub(super) located: std::sync::Arc<datatypes::Located>,
    pub(super) identity: Identity,
    pub(super) comm: String,
    pub(super) segment: Option<Segment>,
    /// A ready, live shim times every call: no probes.
    pub(super) timed: bool,
    /// That shim was injected by an earlier daemon.
    pub(super) adopted: bool,
    pub(super) sites: RankSites,
}

/// Reads what attaching `pid` (started at `ticks`) needs: its MPI library
/// (parsed, a user's file read with bounds), identity, datatypes, segment
/// and maps. Takes no lock and may take a while: the attacher runs it on a
/// thread of its own.
pub fn prepare(pid: u32, ticks: u64) -> Result<Prepared, AttachError> {
    prepare_inner(pid, ticks).map_err(|e| e.or_exited(pid, procfs::liveness(pid, ticks)))
}

fn prepare_inner(pid: u32, ticks: u64) -> Result<Prepared, AttachError> {
    let map = procfs::mpi_library(pid)?.ok_or_else(|| AttachError::no_library(pid))?;
    let uid = procfs::uid(pid)?;
    let identity = identity::identity(pid)?;
    let host_path = map.host_path(pid);
    // Opened as mapped, within the size cap, parsed once per file.
    let lib = symbols::LibraryCache::global().get_mapped(pid, &map)?;
    // After the parse, which refuses another instruction set's library
    // (run by qemu-user, whose code is never mapped executable) for good.
    if !map.loaded() {
        return Err(AttachError::Loading {
            pid,
            comm: procfs::comm(pid),
        });
    }
    let located = std::sync::Arc::new(datatypes::locate(pid, &lib, &map));
    let datatypes = datatypes::check(pid, &located);
    // A rank whose shim already times its calls gets no probes: the
    // segment counts them all (see `rank_calls`), and a live shim an
    // earlier daemon injected is adopted. One detached since counts
    // nothing more: probes.
    // The segment is kept open from here: a rank that exits before the
    // next collection still has its figures read (the mapping outlives
    // the shim's unlink at exit).
    let segment = match Segment::open(pid) {
        // Found after its MPI_Finalize unlinked the segment, and this
        // daemon cannot open it: no figure of its is left to show.
        Err(SegmentProblem::Gone) => {
            return Err(AttachError::SegmentGone {
                pid,
                comm: procfs::comm(pid),
            });
        }
        s => s.ok().flatten(),
    };
    let (timed, adopted) = match segment.as_ref().map(Segment::read) {
        Some(Ok(f)) if f.ready && !f.ejected => (true, f.injected),
        _ => (false, false),
    };
    // The maps as they are now, so call sites can still be named after
    // the process exits.
    let mut sites = RankSites::default();
    sites.prime(pid);
    // Still the same process: a pid reused meanwhile is someone else.
    if procfs::start_ticks(pid)? != ticks {
        return Err(ProcError::NoSuchProcess { pid }.into());
    }
    Ok(Prepared {
        pid,
        ticks,
        uid,
        comm: procfs::comm(pid),
        map,
        host_path,
        lib,
        datatypes,
        located,
        identity,
        segment,
        timed,
        adopted,
        sites,
    })
}

impl AttachError {
    /// Why `pid`, which maps no MPI library, cannot be attached to.
    pub fn no_library(pid: u32) -> AttachError {
        let comm = procfs::comm(pid);
        if procfs::is_static(pid) {
            AttachError::Static { pid, comm }
        } else {
            AttachError::NoMpiLibrary { pid, comm }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attach_error_of_a_rank_gone_or_a_zombie_is_its_exit() {
        use crate::attach::links::LinkError;
        use procfs::{Liveness, ProcError, Stat};
        let link = || {
            AttachError::Probe(crate::attach::probes::ProbeError::Attach {
                pid: 41,
                source: LinkError::MultiLink {
                    program: "mpi_enter",
                    path: "/proc/41/root/usr/lib/libmpi.so.40".into(),
                    source: std::io::Error::from_raw_os_error(libc::ENOENT),
                },
            })
        };
        let stat = |state| {
            Ok(Stat {
                state,
                ppid: 1,
                start_ticks: 7,
            })
        };
        let gone = Err(ProcError::NoSuchProcess { pid: 41 });
        let unreadable = Err(ProcError::Unreadable {
            pid: 41,
            file: "stat",
            source: std::io::Error::from_raw_os_error(libc::EMFILE),
        });
        // Gone, a zombie, dead, or the pid now someone else's: its exit.
        for (s, ticks) in [
            (&gone, 7),
            (&stat('Z'), 7),
            (&stat('X'), 7),
            (&stat('R'), 8),
        ] {
            let e = link().or_exited(41, Liveness::of(s, ticks));
            assert!(matches!(e, AttachError::Exited { pid: 41 }), "{s:?}: {e}");
            assert_eq!(e.to_string(), "rank 41 exited before its probes were in");
        }
        // Running, or /proc unreadable: the failure stays one.
        for s in [&stat('R'), &stat('S'), &stat('D'), &unreadable] {
            let e = link().or_exited(41, Liveness::of(s, 7));
            assert!(e.to_string().contains("uprobe_multi"), "{s:?}: {e}");
        }
        // A budget's refusal is a decision, not a failure, whatever became
        // of the process.
        let refused = AttachError::Refused {
            pid: 41,
            uid: 1000,
            budget: Budget::Processes,
        };
        assert!(matches!(
            refused.or_exited(41, Liveness::Exited),
            AttachError::Refused { .. }
        ));
    }
}
