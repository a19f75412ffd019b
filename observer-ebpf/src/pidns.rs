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
/// and drops the namespace branch, so a host daemon's probes run the code
/// they ran before plus the read of this constant (3 instructions at an
/// entry: `bpftool prog show`, xlated 1,568 -> 1,592 bytes for mpi_enter;
/// no helper call).
#[unsafe(no_mangle)]
static PIDNS_DEV: u64 = 0;
/// See [`PIDNS_DEV`].
#[unsafe(no_mangle)]
static PIDNS_INO: u64 = 0;

/// The current thread's pid_tgid as the daemon names it, given
/// `bpf_get_current_pid_tgid` (the caller's: so a host daemon's probes make
/// no second helper call once the verifier drops the other branch), or `None` when its task is not in the daemon's namespace:
/// the helper answers only for tasks whose own namespace it is, so a task
/// on the host or in a namespace nested in the daemon's is not the
/// daemon's to count. Everything keyed by a thread or a process uses this
/// one id (the calls in flight too, which the daemon reads by pid).
#[inline(always)]
pub fn pid_tgid(host: u64) -> Option<u64> {
    // SAFETY: globals of the object, constant once loaded.
    let ino = unsafe { core::ptr::read_volatile(&PIDNS_INO) };
    if ino == 0 {
        return Some(host);
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
    (r == 0).then_some((u64::from(info.tgid) << 32) | u64::from(info.pid))
}
