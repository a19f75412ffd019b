//! Which process a probe hit belongs to, as the daemon names it. The
//! daemon names processes by the pids of its own pid namespace (/proc,
//! uprobe_multi's pid, the shim's segments); `bpf_get_current_pid_tgid`
//! gives the initial namespace's. Those are the same for a daemon on the
//! host, which leaves [`PIDNS_INO`] at 0 and keeps the plain helper; a
//! daemon in a pid namespace of its own sets it, and its programs ask the
//! kernel for the task's ids in that namespace instead.

use aya_ebpf::{bindings::bpf_pidns_info, helpers::generated::bpf_get_ns_current_pid_tgid};

/// The daemon's pid namespace: the device (the kernel's encoding,
/// MKDEV) and inode of its `/proc/self/ns/pid`. Read-only data the loader
/// sets, 0 for the initial namespace: the verifier then sees a constant
/// and drops the namespace branch, so a host daemon's probes run exactly
/// the code they ran before.
#[unsafe(no_mangle)]
static PIDNS_DEV: u64 = 0;
/// See [`PIDNS_DEV`].
#[unsafe(no_mangle)]
static PIDNS_INO: u64 = 0;

/// The current thread's (tgid, pid) in the daemon's pid namespace, given
/// its `bpf_get_current_pid_tgid` (which the caller has anyway, so a host
/// daemon's probes make no second helper call), or `None` when its task is
/// not in that namespace: the helper answers only for tasks whose own
/// namespace it is, so a task on the host or in a namespace nested in the
/// daemon's is not the daemon's to count.
#[inline(always)]
pub fn ids(pid_tgid: u64) -> Option<(u32, u32)> {
    // SAFETY: globals of the object, constant once loaded.
    let ino = unsafe { core::ptr::read_volatile(&PIDNS_INO) };
    if ino == 0 {
        return Some(((pid_tgid >> 32) as u32, pid_tgid as u32));
    }
    // SAFETY: as above.
    let dev = unsafe { core::ptr::read_volatile(&PIDNS_DEV) };
    let mut info = bpf_pidns_info { pid: 0, tgid: 0 };
    // SAFETY: the helper writes exactly `size` bytes to `info`, a local of
    // that size on this program's stack.
    let r = unsafe {
        bpf_get_ns_current_pid_tgid(
            dev,
            ino,
            &raw mut info,
            core::mem::size_of::<bpf_pidns_info>() as u32,
        )
    };
    (r == 0).then_some((info.tgid, info.pid))
}
