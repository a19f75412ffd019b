//! Program starts: `attach --all` looks at each process that execs as it
//! starts, in any network namespace (the process connector serves only the
//! initial one). The tracepoint only names the process; the daemon reads
//! its maps to see whether it is MPI (observer/src/os/procevents.rs).

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::raw_tracepoint, programs::RawTracePointContext,
};

use crate::{EXEC_DROPS, EXECS, pidns};

/// `sched/sched_process_exec`: the exec'ing thread group's id into
/// [`EXECS`]; a full ring counts the event in [`EXEC_DROPS`] (the daemon's
/// once-a-second scan finds that process instead). A raw tracepoint: it
/// attaches by name, where a classic one needs tracefs mounted to find its
/// id (often not, in containers and on this project's test machine). The
/// current task is the one exec'ing, so its arguments are not needed.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn mpi_exec(_ctx: RawTracePointContext) -> i32 {
    // The thread group is the process's pid, in the daemon's namespace; a
    // task outside it is not sent: its number would name another process.
    let Some(id) = pidns::pid_tgid(bpf_get_current_pid_tgid()) else {
        return 0;
    };
    let tgid = id >> 32;
    if EXECS.output::<u64>(&tgid, 0).is_err()
        && let Some(n) = EXEC_DROPS.get_ptr_mut(0)
    {
        // SAFETY: a per-CPU slot of ours, written by this CPU only.
        unsafe { *n += 1 };
    }
    0
}
